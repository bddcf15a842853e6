/*
 * cuda_ops.h - loaded kernel instances (cubin from nvrtc_cache.h, loaded through cudart's
 * cudaLibrary* calls) and one host launcher per op that checks preconditions, computes the grid
 * and launches on a stream (CONVENTIONS.md item 12). CUDA builds only.
 *
 * Ownership: ms_cuda_module_init returns a module owned by the caller (ms_cuda_module_free);
 * launchers borrow everything; device pointers inside the params stay the caller's.
 *
 * Usage:
 *     ms_kernel_spec s = ms_kernel_spec_attn_decode(MS_KERNEL_DTYPE_BF16, 128, 16, 4, false);
 *     ms_cuda_module *m;
 *     MS_TRY(ms_cuda_module_init(&m, &s, arch, NULL, err));
 *     MS_TRY(ms_cuda_attn_decode_launch(m, &params, stream, err));
 *     ms_cuda_module_free(m);
 */
#ifndef MS_CUDA_OPS_H
#define MS_CUDA_OPS_H

#include "cuda_check.h"
#include "kernel.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A compiled and loaded kernel instance. */
typedef struct ms_cuda_module {
    ms_kernel_spec spec;
    char uri[MS_KERNEL_URI_MAX]; /* with the arch suffix */
    cudaLibrary_t lib;
    cudaKernel_t fn[MS_KERNEL_MAX_ENTRIES]; /* entries of ms_kernel_op_entry(spec.op, i) */
    bool from_cache;             /* the cubin came from the disk cache */
    int arch;                    /* sm_XX it was compiled for, as XX (80, 90, ...) */
    int blocks_per_sm;           /* attn_decode: resident CTAs per multiprocessor (occupancy of
                                    entry 0 at MS_ATTN_DECODE_THREADS); 0 for other ops */
} ms_cuda_module;

/*
 * Compile (or fetch from the cache) the instance for sm_<arch> and load it on the current device.
 * cache_dir as in ms_nvrtc_compile. Errors: those of ms_kernel_spec_check and ms_nvrtc_compile,
 * MS_ERR_CUDA when loading fails (message names the URI).
 */
ms_status ms_cuda_module_init(ms_cuda_module **out, const ms_kernel_spec *spec, int arch,
                              const char *cache_dir, ms_error *err);
void ms_cuda_module_free(ms_cuda_module *m);

/* Compute capability (as 90 for sm_90) and multiprocessor count of a device. */
ms_status ms_cuda_device_arch(int device, int *arch, int *n_sms, ms_error *err);

/*
 * Launch entry `entry` of m on grid (gx, gy, gz) of `threads` threads with one by-value parameter
 * struct (params: copied at the call). A zero grid dimension launches nothing. When
 * ms_cuda_pdl(m, entry), the launch carries cudaLaunchAttributeProgrammaticStreamSerialization: the grid
 * may start before the previous kernel of the stream completes, which every instance allows for
 * by its griddepcontrol.wait before it touches what another kernel writes (templates/common/pdl.cuh).
 * Errors: MS_ERR_CUDA from the launch.
 */
ms_status ms_cuda_launch_entry(const ms_cuda_module *m, int entry, unsigned gx, unsigned gy, unsigned gz,
                               unsigned threads, void *params, cudaStream_t stream, ms_error *err);

/* Whether launches of entry `entry` of m use programmatic dependent launch: on sm_90 or later,
 * the decode attention's (its prologue and L2 prefetch overlap the kernel before: +1 point of
 * bandwidth in bench_kernels) and the 16-bit GEMV's (misc/gemv.cuh: its first weight loads
 * overlap the kernel before), every kernel's with MS_CUDA_PDL=all, the attention's alone with
 * MS_CUDA_PDL=attn, none with MS_CUDA_PDL=0 (read once).
 * Every instance is safe either way (templates/common/pdl.cuh); for all kernels it was measured
 * and left off by default: an 8B Q4_0 decode at batch 1 ran 437 tok/s with it and 444 without
 * (docs/perf.md, 2026-12-02). */
bool ms_cuda_pdl(const ms_cuda_module *m, int entry);

/* ---- launchers: each checks the module's op and the params, then launches ---- */

/* Decode attention: one launch, grid (n_splits, n_kv_heads, batch); with n_splits > 1 the last
 * CTA of each (request, KV head) merges the splits (templates/attn/decode.cuh), so part_o,
 * part_lse and split_counter (zeroed, [batch * n_kv_heads]) are required then. On sm_90
 * (ms_cuda_pdl) its CTAs may start while earlier kernels of the stream finish;
 * this one reads its index arrays (qo_indptr, kv_indptr, kv_indices, kv_last_page_len, kv_start)
 * before its wait (decode.cuh), so no kernel may write them: they must come from copies (or
 * kernels) that completed before the first kernel of the chain it is launched behind started. */
ms_status ms_cuda_attn_decode_launch(const ms_cuda_module *m, const ms_attn_kernel_params *p,
                                     cudaStream_t stream, ms_error *err);
/* Prefill attention over n_tiles tiles (ms_kernel_attn_prefill_tiles): grid (n_tiles, n_kv_heads). */
ms_status ms_cuda_attn_prefill_launch(const ms_cuda_module *m, const ms_attn_kernel_params *p,
                                      int n_tiles, cudaStream_t stream, ms_error *err);
/* RoPE + KV write: grid (n_tokens). M-RoPE instances also check the sections (1 .. 4, none
 * negative, summing to rotary_dim / 2) and the position streams. */
ms_status ms_cuda_rope_kv_launch(const ms_cuda_module *m, const ms_rope_kv_params *p,
                                 cudaStream_t stream, ms_error *err);
ms_status ms_cuda_rmsnorm_launch(const ms_cuda_module *m, const ms_rmsnorm_params *p,
                                 cudaStream_t stream, ms_error *err);
/* The same norm with out in a 16-bit type (entries ms_rmsnorm_bf16 / ms_rmsnorm_f16 of the rmsnorm
 * instance; out_dtype MS_KERNEL_DTYPE_BF16 or _F16): the input of a GEMM written directly
 * (backend_cuda.c cu_rms_norm_linear). The rows' rules are those of ms_cuda_rmsnorm_launch;
 * MS_ERR_INVALID_ARG for another out_dtype. */
ms_status ms_cuda_rmsnorm_to_launch(const ms_cuda_module *m, const ms_rmsnorm_params *p,
                                    ms_kernel_dtype out_dtype, cudaStream_t stream,
                                    ms_error *err);
/* Per-head RMSNorm: p->n_rows tokens x p->n_heads heads of p->dim == the instance's head_dim
 * elements; grid ceil(tokens * heads / (MS_RMSNORM_THREADS / 32)), one warp per head. */
ms_status ms_cuda_rmsnorm_heads_launch(const ms_cuda_module *m, const ms_rmsnorm_params *p,
                                       cudaStream_t stream, ms_error *err);
/* Whether q [n rows of n_values int8, q_stride bytes apart] and d [scales, d_stride floats a row]
 * can hold x quantized for the integer GEMV (templates/common/q8x.cuh): n_values a multiple of 32,
 * q 16-byte aligned with a stride of whole 16-byte units, d 4-byte aligned. */
bool ms_cuda_q8x_fits(const void *q, int64_t q_stride, const float *d, int64_t d_stride, int64_t n_values);
/* The norm of ms_cuda_rmsnorm_launch with out quantized per 32 values for the integer GEMV of
 * Q4_0 / Q8_0 / Q4_K weights (entry ms_rmsnorm_q8; templates/common/q8x.cuh: p->out int8 rows of
 * p->out_stride bytes, p->out_scale floats with p->scale_stride a row): the bytes ms_qquant_x
 * gives for the float norm. p->dim a multiple of 32; MS_ERR_INVALID_ARG, naming the module, unless
 * ms_cuda_q8x_fits and x's rules of ms_cuda_rmsnorm_launch hold. */
ms_status ms_cuda_rmsnorm_q8_launch(const ms_cuda_module *m, const ms_rmsnorm_params *p,
                                    cudaStream_t stream, ms_error *err);
/* Dense attention over the step's own K/V rows (templates/attn/dense.cuh): grid
 * (ceil(n_tokens / (MS_ATTN_DENSE_THREADS / 32)), n_q_heads), one warp per (row, head); f32 rows
 * of the instance's head_dim, indptr in device memory (not read on the host). */
ms_status ms_cuda_attn_dense_launch(const ms_cuda_module *m, const ms_attn_dense_params *p,
                                    cudaStream_t stream, ms_error *err);
ms_status ms_cuda_silu_mul_launch(const ms_cuda_module *m, const ms_silu_mul_params *p,
                                  cudaStream_t stream, ms_error *err);
/* silu(gate) * up quantized per 32 values for the integer GEMV of the down projection (entry
 * ms_silu_mul_q8; templates/common/q8x.cuh, p->out int8 rows of p->out_stride bytes, p->out_scale
 * with p->scale_stride a row): the bytes ms_silu_mul then ms_qquant_x give. p->inter a multiple of
 * 32, gate / up rows 16-byte aligned; MS_ERR_INVALID_ARG, naming the module, otherwise. */
ms_status ms_cuda_silu_mul_q8_launch(const ms_cuda_module *m, const ms_silu_mul_params *p,
                                     cudaStream_t stream, ms_error *err);
ms_status ms_cuda_embed_launch(const ms_cuda_module *m, const ms_embed_params *p,
                               cudaStream_t stream, ms_error *err);
ms_status ms_cuda_argmax_launch(const ms_cuda_module *m, const ms_argmax_params *p,
                                cudaStream_t stream, ms_error *err);
ms_status ms_cuda_sample_launch(const ms_cuda_module *m, const ms_sample_params *p,
                                cudaStream_t stream, ms_error *err);
/* Misc helpers (one module): which = 0 convert, 1 add, 2 gather_rows. */
ms_status ms_cuda_misc_launch(const ms_cuda_module *m, int which, const ms_misc_params *p,
                              cudaStream_t stream, ms_error *err);

/* ---- encoder helpers of the misc module (templates/misc/encoder.cuh) ---- */

/* Entries of the misc module, ORDER as ms_kernel_op_entry(MS_KERNEL_OP_MISC, i) in kernel.c. */
typedef enum ms_cuda_misc_entry {
    MS_CUDA_MISC_CONVERT = 0,
    MS_CUDA_MISC_ADD,
    MS_CUDA_MISC_GATHER_ROWS,
    MS_CUDA_MISC_LAYER_NORM,     /* weights in the instance's dtype */
    MS_CUDA_MISC_LAYER_NORM_F32, /* float weights */
    MS_CUDA_MISC_GELU,
    MS_CUDA_MISC_IM2COL,         /* columns in the instance's dtype (16-bit GEMM input) */
    MS_CUDA_MISC_IM2COL_F32,     /* float columns */
    MS_CUDA_MISC_BIAS_ADD,       /* bias in the instance's dtype */
    MS_CUDA_MISC_BIAS_ADD_F32,   /* float bias */
    MS_CUDA_MISC_SELECT_ROWS,    /* out[r] = rows[r] == 0 ? a[r] : b[r] */
    MS_CUDA_MISC_GEMV,           /* the decode GEMV over the instance's 16-bit weights */
    MS_CUDA_MISC_SILU_MUL_TO,    /* silu(gate) * up of float rows into the instance's dtype */
    MS_CUDA_MISC_GEMV_NORM,      /* the GEMV with the RMSNorm folded in (p.norm_w) */
    MS_CUDA_MISC_ENTRY_COUNT
} ms_cuda_misc_entry;

/* The decode GEMV of templates/misc/gemv.cuh: y [n, rows] (float) = T(x [n, in], float) W^T
 * (p->acc: added to y; p->norm_w: x RMS-normalized on the way, gemv.cuh),
 * W [rows, in] in the module's dtype (bf16 or f16). Grid: ceil(rows / MS_GEMV_ROWS) CTAs.
 * MS_ERR_INVALID_ARG, naming the module, unless ms_cuda_gemv_fits(p). */
ms_status ms_cuda_gemv_launch(const ms_cuda_module *m, const ms_gemv_params *p,
                              cudaStream_t stream, ms_error *err);
/* Whether the GEMV takes p (cu_linear falls back to convert + cuBLAS otherwise): n in
 * 1..MS_GEMV_MAX_COLS; rows, in >= 1; in and w_stride multiples of 8, x_stride of 4 elements;
 * w_stride, x_stride >= in; y_stride >= rows when n > 1; w, x, y present, w and x 16-byte
 * aligned; norm_w (the folded RMSNorm, in the module's dtype) NULL or 16-byte aligned. */
bool ms_cuda_gemv_fits(const ms_gemv_params *p);

/* Whether ms_cuda_silu_mul_to_launch takes p: inter >= 8 and inter and the three strides multiples
 * of 8 elements, strides >= inter, gate / up / out present and 16-byte aligned, rows >= 0. */
bool ms_cuda_silu_mul_to_fits(const ms_silu_mul_params *p);
/* out [n_rows, inter] (the module's dtype, bf16 or f16) = silu(gate) * up, gate / up float rows
 * (templates/act/silu_mul.cuh silu_mul_to: the down projection's GEMM input written directly,
 * bitwise what silu_mul over float and then convert give). out must not overlap gate or up.
 * MS_ERR_INVALID_ARG, naming the module, unless ms_cuda_silu_mul_to_fits(p). */
ms_status ms_cuda_silu_mul_to_launch(const ms_cuda_module *m, const ms_silu_mul_params *p,
                                     cudaStream_t stream, ms_error *err);

/* LayerNorm: grid (n_rows), one CTA per row. f32_weights picks the float-weight entry. Checks
 * dim >= 1, strides >= dim, eps >= 0, x / weight / out present. */
ms_status ms_cuda_layer_norm_launch(const ms_cuda_module *m, bool f32_weights,
                                    const ms_layer_norm_params *p, cudaStream_t stream,
                                    ms_error *err);
/* Exact GELU of p->a into p->out (n_rows x n_cols, strides a_stride / out_stride). */
ms_status ms_cuda_gelu_launch(const ms_cuda_module *m, const ms_misc_params *p,
                              cudaStream_t stream, ms_error *err);
/* conv1d columns [t_out, c_in * k]; f32_cols picks float columns. Checks t_out against
 * (t_in + 2 padding - k) / stride + 1 and that the column count fits in int. */
ms_status ms_cuda_im2col_launch(const ms_cuda_module *m, bool f32_cols, const ms_im2col_params *p,
                                cudaStream_t stream, ms_error *err);
/* out[r, c] = a[r, c] + b[c] (b: [n_cols] bias; b_stride unused); f32_bias picks a float bias. */
ms_status ms_cuda_bias_add_launch(const ms_cuda_module *m, bool f32_bias, const ms_misc_params *p,
                                  cudaStream_t stream, ms_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MS_CUDA_OPS_H */
