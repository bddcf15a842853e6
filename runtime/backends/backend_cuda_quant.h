/*
 * backend_cuda_quant.h - quantized weights on the GPU: matrices kept in ggml's block layout in
 * device memory (GGUF Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K; any other type, e.g. Q5_1 or F16,
 * stays a dequantized bf16 weight of the plain CUDA path), and y = x W^T over them. CUDA builds
 * only (MS_HAVE_CUDA).
 *
 * Layout: ggml's blocks (ggml-common.h; the bytes of the GGUF tensor) with each row in the planar
 * layout (gguf_quant.h ms_ggml_rows_to_planar: the row's quant bytes, then its scales; the same
 * row_bytes, row r of `in` values at r * row_bytes, row_bytes = in / QK * block bytes). Rows stay
 * independent, so a row range of the file (one fused part, an un-permuted q/k head row) is still
 * one copy, converted on the way (ms_cuda_qweight_copy_rows). Why planar: ggml's 18-, 22-, 34- and
 * 210-byte blocks are only 2-byte aligned, so the GEMV read Q4_0 with five 16-bit loads per lane
 * and row; in planar rows whose start is 16-byte aligned (ms_cuda_qweight_wide_rows) it reads the
 * quants with one 8-byte (Q4_0, Q4_1, Q5_0, Q6_K) or 16-byte (Q8_0) load.
 *
 * Compute (templates/quant/qmatmul.cuh, one NVRTC instance per type, URI qmatmul_<type>_af32_sm90):
 *   - n <= MS_CUDA_QGEMV_MAX_ROWS rows of x (decode batches): the GEMV (ms_qgemv_<k>), one launch
 *     per group of up to 8 rows (MS_QGEMV_MAX_COLS), each reading W once from device memory (fp32
 *     accumulation): ceil(n / 8) reads of the quantized bytes cost less than the dequantized
 *     path's bf16 write and read up to the threshold. Q4_0, Q8_0 and Q4_K at 1-2 x rows take the
 *     integer dot (x quantized per 32 values to int8 as ggml-cuda's q8_1, templates/common/q8x.cuh,
 *     in each CTA, dp4a; y within fp32 rounding of the dot with that quantized x), and so do they
 *     at 3-8 rows, with x quantized once per call by ms_qquant_x into a workspace (the same int8
 *     values and sums as in the CTAs; MS_QGEMV_PREQ_TYPE; H200, 8B Q4_0 decode at batch 8: 757 ->
 *     1,484 tok/s); the rest take the fp32 dot of the dequantized values. For Q4_0, Q8_0 and Q4_K
 *     the kernel that computes x may write it quantized instead, at any of the
 *     GEMV's widths (ms_cuda_quant_qx, ms_cuda_quant_linear_qx: backend_cuda.c's RMSNorm and
 *     SiLU-and-multiply before qkv, gate/up and down), so neither the CTAs nor a launch of its
 *     own quantize it;
 *   - more rows (prefill, large decode batches): W is dequantized tile by tile (rows [r, r +
 *     tile)) into a reusable bf16 workspace (bit-exact bf16 of ggml's dequantization; 64 MB by
 *     default, of which up to 256 x rows use 16 MB, so the GEMM reads it back from L2), x is
 *     rounded to bf16, and cuBLAS runs the tensor-core GEMM of the bf16 path (fp32 accumulation)
 *     per tile.
 * Workspaces (the prefill's bf16 x and weight tile, the GEMV's quantized x) are sized once
 * (ms_cuda_quant_reserve, or on first use outside graph capture: the engine's warm-up of every
 * bucket before it captures any); a linear whose workspaces are large enough allocates nothing,
 * so a step over quantized weights can be captured after an eager step of its shape. A workspace
 * that must grow later (an eager step with more rows than any before) is reallocated and the old
 * one kept until ms_cuda_quant_free, since captured graphs still write to it.
 *
 * Device bytes: a weight takes rows * row_bytes (ms_cuda_qweight_bytes), e.g. Q4_0 is 4.5 bits per
 * value (18 bytes per 32), Q8_0 8.5, Q4_K 4.5, Q5_K 5.5, Q6_K 6.5625.
 *
 * Ownership: ms_cuda_quant_init's result is the caller's (ms_cuda_quant_free, NULL accepted); a
 * qweight made by ms_cuda_qweight_init owns its device memory (ms_cuda_qweight_free). The stream
 * and cuBLAS handle given at init are borrowed and must outlive the context.
 */
#ifndef MS_BACKEND_CUDA_QUANT_H
#define MS_BACKEND_CUDA_QUANT_H

#include "cuda_check.h"
#include "ms_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* x rows up to which linear runs the quantized GEMV (a launch per 8 rows, each reading W once);
 * above it, dequantize + cuBLAS (a bf16 write and read of 3.5x the Q4_0 bytes, then the GEMM).
 * (Batch-32 Q4_0 decode of an 8B model on the H200 through dequantize + cuBLAS: 1,162 tok/s.) */
#ifndef MS_CUDA_QGEMV_MAX_ROWS
#define MS_CUDA_QGEMV_MAX_ROWS 8
#endif

/* A weight matrix W [rows, in] of ggml type `type` in device memory. */
typedef struct ms_cuda_qweight {
    void *data;        /* device, rows * row_bytes, 256-byte aligned (cudaMalloc) */
    uint32_t type;     /* MS_GGML_TYPE_* (gguf_quant.h); ms_cuda_qweight_supported */
    int64_t rows;      /* output features */
    int64_t in;        /* input features (a multiple of the type's block) */
    size_t row_bytes;  /* in / block * block bytes */
} ms_cuda_qweight;

typedef struct ms_cuda_quant ms_cuda_quant;

/* True for the types kept quantized on the GPU: Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K. */
bool ms_cuda_qweight_supported(uint32_t type);
/* Device bytes of a [rows, in] weight of `type` (0 when in is not a multiple of its block). */
size_t ms_cuda_qweight_bytes(uint32_t type, int64_t rows, int64_t in);

/*
 * Allocate W [rows, in] of `type` in device memory (contents undefined). Errors: MS_ERR_UNSUPPORTED
 * (type, naming it), MS_ERR_INVALID_ARG (rows < 1, in not a positive multiple of the block or above
 * int32), MS_ERR_CUDA (cudaMalloc, naming the bytes). *w is zeroed on failure.
 */
ms_status ms_cuda_qweight_init(ms_cuda_qweight *w, uint32_t type, int64_t rows, int64_t in, ms_error *err);
/* Copy host blocks (ggml layout, n_rows rows of w->row_bytes) into rows [row0, row0 + n_rows)
 * of w in the planar layout (ms_cuda_qweight_copy_rows), synchronously (load time). Errors:
 * MS_ERR_INVALID_ARG (range), MS_ERR_OOM, MS_ERR_CUDA. */
ms_status ms_cuda_qweight_upload_rows(ms_cuda_qweight *w, int64_t row0, int64_t n_rows, const void *host,
                                      ms_error *err);

/* Copy n_rows packed host rows of ggml blocks (type, `in` values each) to device memory at dev,
 * converting them to the planar layout on the way (through a staging buffer of about 8 MB; on
 * success the copy is complete on return, on `stream`, NULL for the default one; after a failure
 * the rows before it may have been written). Errors: MS_ERR_INVALID_ARG
 * (NULL pointers, n_rows < 0, an `in` the type cannot have), MS_ERR_OOM, MS_ERR_CUDA. */
ms_status ms_cuda_qweight_copy_rows(void *dev, const void *host, uint32_t type, int64_t n_rows, int64_t in,
                                    cudaStream_t stream, ms_error *err);
/* Free w's device memory and zero it; a zeroed w is accepted. */
void ms_cuda_qweight_free(ms_cuda_qweight *w);

/*
 * The quantized-matmul context of one device: the qmatmul instances (compiled for sm_<arch> into
 * cache_dir as nvrtc_cache.h does; NULL = the default cache), the misc instance that rounds x to
 * bf16, and the prefill workspaces. stream / cublas: the backend's (cuBLAS bound to that stream
 * with its fixed workspace). Errors: MS_ERR_OOM, MS_ERR_INVALID_ARG (NULL handles).
 */
ms_status ms_cuda_quant_init(ms_cuda_quant **out, int arch, const char *cache_dir, cudaStream_t stream,
                             cublasHandle_t cublas, ms_error *err);
void ms_cuda_quant_free(ms_cuda_quant *q);

/* Compile / load the instance of `type` now (at model load, so no NVRTC runs inside a step).
 * Errors: MS_ERR_UNSUPPORTED (type), NVRTC / driver errors naming the URI. */
ms_status ms_cuda_quant_load_type(ms_cuda_quant *q, uint32_t type, ms_error *err);

/*
 * Size the workspaces for up to max_x_rows x rows of up to max_in features: the bf16 copy of x
 * (max_x_rows * max_in * 2 bytes), the dequantized weight tile of tile_bytes (at least one row of
 * max_in bf16; 0 = 64 MiB) and the GEMV's quantized x (up to MS_CUDA_QGEMV_MAX_ROWS rows of max_in
 * int8 values and max_in / 32 scales). Errors: MS_ERR_CUDA naming the workspace and bytes.
 */
ms_status ms_cuda_quant_reserve(ms_cuda_quant *q, int64_t max_x_rows, int64_t max_in, size_t tile_bytes,
                                ms_error *err);

/*
 * y[t, o] = sum_i x[t, i] * W[o, i] for t < n (acc: y[t, o] += the sum, linear_add's residual
 * add), queued on the context's stream. x [n, w->in] f32 in device memory with row stride x_stride
 * (elements); y [n, w->rows] f32, row stride y_stride, not overlapping x.
 * n <= MS_CUDA_QGEMV_MAX_ROWS with 16-byte aligned x rows: GEMV; otherwise dequantize + GEMM
 * (workspaces grow here when ms_cuda_quant_reserve did not size them, which fails with
 * MS_ERR_STATE during graph capture). Errors: MS_ERR_INVALID_ARG (shapes, strides, NULL),
 * MS_ERR_STATE (the type's instance not loaded while the table is sealed: see
 * ms_cuda_quant_seal), MS_ERR_CUDA / MS_ERR_CUBLAS.
 */
ms_status ms_cuda_quant_linear(ms_cuda_quant *q, const float *x, int64_t n, int64_t x_stride,
                               const ms_cuda_qweight *w, float *y, int64_t y_stride, bool acc,
                               ms_error *err);

/* x quantized per 32 values for the integer GEMV (templates/common/q8x.cuh): n rows of `in` int8
 * values at q + t * q_stride bytes, their scales at d + t * d_stride floats. Device memory. */
typedef struct ms_cuda_qx {
    void *q;
    float *d;
    int64_t q_stride; /* bytes, a multiple of 16 */
    int64_t d_stride; /* floats: in / 32 */
} ms_cuda_qx;

/* Whether ms_cuda_quant_linear's GEMV for n x rows of w takes x quantized beforehand: Q4_0 and
 * Q8_0 and Q4_K (MS_QGEMV_PREQ_TYPE) at 1 .. MS_CUDA_QGEMV_MAX_ROWS rows. Then a kernel that computes x can
 * write it in that form (ms_cuda_quant_qx, then ms_cuda_quant_linear_qx) instead of the float x
 * that ms_cuda_quant_linear quantizes in a launch of its own (ms_qquant_x). */
bool ms_cuda_quant_reads_qx(const ms_cuda_qweight *w, int64_t n);

/* The context's quantized-x workspace for n (1 .. MS_CUDA_QGEMV_MAX_ROWS) rows of `in` values (a
 * positive multiple of 32) in *out, grown if needed (outside graph capture: as the other
 * workspaces, ms_cuda_quant_reserve). Valid until the next call on q that quantizes x (each
 * ms_cuda_quant_linear of a Q4_0 / Q8_0 / Q4_K weight above 2 rows, and this one): write it, then run
 * ms_cuda_quant_linear_qx, both on the context's stream. Errors: MS_ERR_INVALID_ARG (n, in),
 * MS_ERR_STATE / MS_ERR_CUDA from the growth. */
ms_status ms_cuda_quant_qx(ms_cuda_quant *q, int64_t n, int64_t in, ms_cuda_qx *out, ms_error *err);

/* ms_cuda_quant_linear's GEMV on x already quantized (x: n rows of w->in values, e.g. from
 * ms_cuda_quant_qx written by the kernel that computed x): the same launches and the same bits as
 * ms_cuda_quant_linear on the float x those bytes quantize. Requires ms_cuda_quant_reads_qx(w, n).
 * Errors: MS_ERR_INVALID_ARG (shapes, strides, a weight that does not read x quantized, NULL),
 * MS_ERR_STATE (instance not loaded while sealed), MS_ERR_CUDA. */
ms_status ms_cuda_quant_linear_qx(ms_cuda_quant *q, const ms_cuda_qx *x, int64_t n, const ms_cuda_qweight *w,
                                  float *y, int64_t y_stride, bool acc, ms_error *err);

/* Dequantize rows [row0, row0 + n_rows) of w into out [n_rows, w->in] bf16 (device, packed rows,
 * 16-byte aligned), bit-exact with bf16(ms_ggml_dequantize). Queued on the stream. */
ms_status ms_cuda_quant_dequant_bf16(ms_cuda_quant *q, const ms_cuda_qweight *w, int64_t row0, int64_t n_rows,
                                     void *out, ms_error *err);

/* Embedding gather from a quantized table (an embedding tied to a quantized lm_head, or a Q8_0
 * token_embd): out[t, :] = float(W[ids[t], :]) for t < n; ids device int32 (outside [0, rows):
 * zeros), out device f32 rows of out_stride (a multiple of 4, 16-byte aligned). Queued. */
ms_status ms_cuda_quant_embed(ms_cuda_quant *q, const ms_cuda_qweight *w, const int32_t *ids, int64_t n, float *out,
                              int64_t out_stride, ms_error *err);

/* Whether w's rows all start 16-byte aligned (a 16-byte aligned base and row_bytes a multiple of
 * 16: e.g. Q4_0 / Q8_0 with `in` a multiple of 256, Q6_K of 2048, Q4_K / Q5_K always), so that the
 * GEMV reads them with wide loads (qparams.h `wide`); otherwise with 16-bit ones. The same results
 * either way; the tests use it to know which loads they checked. */
bool ms_cuda_qweight_wide_rows(const ms_cuda_qweight *w);

/* After the model's types are loaded: any other type fails with MS_ERR_STATE instead of compiling
 * in the middle of a step (the backend's kernels_load rule). */
void ms_cuda_quant_seal(ms_cuda_quant *q);

#ifdef __cplusplus
}
#endif
#endif /* MS_BACKEND_CUDA_QUANT_H */
