/*
 * gguf_quant.h - ggml tensor types: block sizes, dequantization to float32, and the reference
 * quantizers mstar-mkckpt writes GGUF files with.
 *
 * Layouts and arithmetic follow ggml (ggml/src/ggml-common.h block_* structs, ggml/src/ggml-quants.c
 * dequantize_row_* and quantize_row_*_ref): every block is little-endian bytes, scales are IEEE
 * half (or f32 for Q8_K), and dequantization performs exactly ggml's float operations in ggml's
 * order, so results are bit-identical to ggml's scalar path and to the `gguf` Python package's
 * gguf.quants.dequantize (tests/test_gguf.c checks goldens made by tests/gguf/make_goldens.py).
 * The library is built with -std=c11, where GCC does not contract a*b+c into an FMA, which would
 * change rounding.
 *
 * Block geometry (elements per block / bytes per block):
 *   F32 1/4, F16 1/2, BF16 1/2,
 *   Q4_0 32/18  {f16 d; u8 qs[16]}                 y = (q - 8) * d
 *   Q4_1 32/20  {f16 d, m; u8 qs[16]}              y = q * d + m
 *   Q5_0 32/22  {f16 d; u8 qh[4]; u8 qs[16]}        y = (q - 16) * d, q = low nibble | high bit << 4
 *   Q5_1 32/24  {f16 d, m; u8 qh[4]; u8 qs[16]}
 *   Q8_0 32/34  {f16 d; i8 qs[32]}                 y = q * d
 *   Q4_K 256/144 {f16 d, dmin; u8 scales[12]; u8 qs[128]}  8 sub-blocks of 32, 6-bit scale and min
 *   Q5_K 256/176 {f16 d, dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}
 *   Q6_K 256/210 {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}  16 sub-blocks of 16
 * In a nibble-packed block the low nibbles hold the first half of the block's elements and the
 * high nibbles the second half (Q4_K/Q5_K: per 64-element group).
 *
 * Ownership: every function borrows its arguments and allocates nothing.
 */
#ifndef MS_GGUF_QUANT_H
#define MS_GGUF_QUANT_H

#include "ms_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ggml_type values as stored in a GGUF tensor info (ggml.h enum ggml_type; gaps are retired
 * types). Only the ones named here are known; see ms_ggml_type_known. */
typedef enum ms_ggml_type {
    MS_GGML_TYPE_F32 = 0,
    MS_GGML_TYPE_F16 = 1,
    MS_GGML_TYPE_Q4_0 = 2,
    MS_GGML_TYPE_Q4_1 = 3,
    MS_GGML_TYPE_Q5_0 = 6,
    MS_GGML_TYPE_Q5_1 = 7,
    MS_GGML_TYPE_Q8_0 = 8,
    MS_GGML_TYPE_Q8_1 = 9,
    MS_GGML_TYPE_Q2_K = 10,
    MS_GGML_TYPE_Q3_K = 11,
    MS_GGML_TYPE_Q4_K = 12,
    MS_GGML_TYPE_Q5_K = 13,
    MS_GGML_TYPE_Q6_K = 14,
    MS_GGML_TYPE_Q8_K = 15,
    MS_GGML_TYPE_IQ2_XXS = 16,
    MS_GGML_TYPE_IQ2_XS = 17,
    MS_GGML_TYPE_IQ3_XXS = 18,
    MS_GGML_TYPE_IQ1_S = 19,
    MS_GGML_TYPE_IQ4_NL = 20,
    MS_GGML_TYPE_IQ3_S = 21,
    MS_GGML_TYPE_IQ2_S = 22,
    MS_GGML_TYPE_IQ4_XS = 23,
    MS_GGML_TYPE_I8 = 24,
    MS_GGML_TYPE_I16 = 25,
    MS_GGML_TYPE_I32 = 26,
    MS_GGML_TYPE_I64 = 27,
    MS_GGML_TYPE_F64 = 28,
    MS_GGML_TYPE_IQ1_M = 29,
    MS_GGML_TYPE_BF16 = 30,
    MS_GGML_TYPE_TQ1_0 = 34,
    MS_GGML_TYPE_TQ2_0 = 35,
    MS_GGML_TYPE_MXFP4 = 39,
    MS_GGML_TYPE_COUNT = 40  /* one past the largest known value */
} ms_ggml_type;

/* Whether `t` is a ggml type this build knows the geometry of (name, block size, block bytes). */
bool ms_ggml_type_known(uint32_t t);
/* ggml's name ("Q4_K"), or "?" for an unknown value. */
const char *ms_ggml_type_name(uint32_t t);
/* Elements per block (1 for plain types); 0 for an unknown value. */
size_t ms_ggml_type_block(uint32_t t);
/* Bytes per block; 0 for an unknown value. */
size_t ms_ggml_type_block_bytes(uint32_t t);
/* Whether ms_ggml_dequantize handles `t`: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K,
 * Q5_K, Q6_K. */
bool ms_ggml_type_can_dequantize(uint32_t t);

/*
 * Dequantize n elements of type `t` from src (n / block elements' worth of blocks, byte-aligned
 * only: src may be unaligned) into dst[n]. Preconditions (checked; MS_ERR_INVALID_ARG, no message):
 * n is a multiple of the type's block size. A type ms_ggml_type_can_dequantize refuses is
 * MS_ERR_UNSUPPORTED (no message: the caller names the tensor).
 */
ms_status ms_ggml_dequantize(uint32_t t, const void *src, float *dst, size_t n);

/*
 * Reference quantizers (ggml-quants.c quantize_row_q4_0_ref, quantize_row_q8_0_ref,
 * quantize_row_q4_K_ref, which itself uses make_qkx2_quants): x[n] -> dst (n / block blocks,
 * ms_ggml_type_block_bytes each). `t` is Q4_0, Q8_0, Q4_K, F32, F16 or BF16 (plain types are
 * converted with round to nearest even). n must be a multiple of the block size.
 * Errors (no message): MS_ERR_UNSUPPORTED (other types), MS_ERR_INVALID_ARG (n).
 */
ms_status ms_ggml_quantize(uint32_t t, const float *x, void *dst, size_t n);

/*
 * The planar row layout the CUDA kernels read (templates/quant/blocks.cuh, backend_cuda_quant.h):
 * a row of nb blocks becomes [plane 0: nb x P0 bytes][plane 1: nb x (block bytes - P0) bytes],
 * where plane 0 holds each block's quant bytes (bytes [off, off + P0) of ggml's block) and plane 1
 * the rest of it in order (its scales: the block's header or trailer). Same size as the row of
 * blocks; the quants of block k start at 16 k (Q4_0, Q4_1, Q5_0), 32 k (Q8_0) or 208 k (Q6_K), so
 * the kernels read them with 8- and 16-byte loads where ggml's 18-, 22-, 34- and 210-byte blocks
 * allow only 2-byte ones (the ggml-cuda kernels' get_int_b2).
 *   Q4_0: off 2, P0 16 (qs; plane 1: d)         Q4_1: off 4, P0 16 (qs; d, m)
 *   Q5_0: off 6, P0 16 (qs; d, qh)              Q8_0: off 2, P0 32 (qs; d)
 *   Q6_K: off 0, P0 208 (ql, qh, scales; d)     Q4_K, Q5_K (16-byte multiples already) and
 *                                               every other type: unchanged (P0 = the block)
 * ms_ggml_planar_split gives off and P0 (returns false for the unchanged types, setting P0 to the
 * block bytes); ms_ggml_rows_to_planar converts n_rows packed rows of `in` values from src to dst
 * (distinct buffers of n_rows * row bytes; `in` a multiple of the block). Errors (no message):
 * MS_ERR_INVALID_ARG for an unknown type or a bad `in`.
 */
bool ms_ggml_planar_split(uint32_t t, size_t *off, size_t *p0);
ms_status ms_ggml_rows_to_planar(uint32_t t, const void *src, void *dst, size_t n_rows, size_t in);

#ifdef __cplusplus
}
#endif
#endif /* MS_GGUF_QUANT_H */
