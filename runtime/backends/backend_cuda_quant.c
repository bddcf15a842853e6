/*
 * backend_cuda_quant.c - quantized weights on the GPU (backend_cuda_quant.h).
 *
 * Constraints: every CUDA / cuBLAS call is checked; linear allocates nothing once the workspaces
 * are sized (graph capture); the instances are the qmatmul ones of kernel.h, compiled through
 * cuda_ops.h like every other instance (so they share the NVRTC cubin cache).
 */
#include "backend_cuda_quant.h"

#include <string.h>

#include "../../templates/quant/qparams.h"
#include "cuda_ops.h"
#include "gguf_quant.h"
#include "kernel.h"

#define QTYPE_SLOTS 7
#define QUANT_MAX_RETIRED 64 /* outgrown workspaces kept (each growth at least doubles one) */
#define DEFAULT_TILE_BYTES ((size_t)64 << 20)
/* the tile for a few x rows (decode batches above the GEMV's 8): small enough to stay in L2
 * between the dequantize and the GEMM (16 MB: batch 32 Q4_0 decode of an 8B model on the H200);
 * prefill takes the whole tile (16 MB tiles halved 1x2048 prefill: 20.8k -> 12.2k tok/s) */
#define SMALL_N_TILE_BYTES ((size_t)16 << 20)
#define SMALL_N_ROWS 256
#define DEQUANT_ENTRY 8 /* ms_qdequant_bf16, after ms_qgemv_1..8 (kernel.c) */
#define EMBED_ENTRY 9   /* ms_qembed */
#define ACC_ENTRY 10    /* ms_qgemv_acc_1 .. ms_qgemv_acc_<MS_QGEMV_ACC_COLS> */
#define QUANT_X_ENTRY 12 /* ms_qquant_x */
#define QX_ENTRY 13      /* ms_qgemv_q_1 .. _<MS_QGEMV_I8_MAX_COLS>, then ms_qgemv_qacc_1 .. (kernel.c) */

struct ms_cuda_quant {
    int arch;
    char *cache_dir;
    cudaStream_t stream;
    cublasHandle_t cublas;
    ms_cuda_module *mods[QTYPE_SLOTS]; /* by qtype_slot */
    ms_cuda_module *misc;              /* bf16 misc instance: x -> bf16 */
    bool sealed;
    void *retired[QUANT_MAX_RETIRED];  /* workspaces outgrown after a graph may have captured them */
    int n_retired;
    void *x16;                         /* [max_x_rows, max_in] bf16 copy of x (prefill) */
    size_t x16_bytes;
    void *tile;                        /* dequantized weight rows (prefill) */
    size_t tile_bytes;
    void *qx;                          /* x quantized for the GEMV (MS_QGEMV_PREQ_TYPE): int8 rows,
                                          then the scales (qx_layout) */
    size_t qx_bytes;
};

/* ms_qquant_x's output for n rows of `in` values: int8 rows of *stride bytes (16-byte multiples),
   then float scales, in / 32 a row, from byte *scales_at (16-byte aligned); the bytes in all. */
static size_t qx_layout(int64_t n, int64_t in, int64_t *stride, size_t *scales_at) {
    *stride = (in + 15) / 16 * 16;
    *scales_at = (size_t)n * (size_t)*stride;
    return *scales_at + (size_t)n * (size_t)(in / 32) * sizeof(float);
}

static const uint32_t slot_types[QTYPE_SLOTS] = {
    MS_GGML_TYPE_Q4_0, MS_GGML_TYPE_Q4_1, MS_GGML_TYPE_Q5_0, MS_GGML_TYPE_Q8_0,
    MS_GGML_TYPE_Q4_K, MS_GGML_TYPE_Q5_K, MS_GGML_TYPE_Q6_K,
};

static int qtype_slot(uint32_t type) {
    for (int i = 0; i < QTYPE_SLOTS; i++)
        if (slot_types[i] == type)
            return i;
    return -1;
}

bool ms_cuda_qweight_supported(uint32_t type) {
    return qtype_slot(type) >= 0 && ms_kernel_qmatmul_supported((int)type);
}

size_t ms_cuda_qweight_bytes(uint32_t type, int64_t rows, int64_t in) {
    size_t blk = ms_ggml_type_block(type), bb = ms_ggml_type_block_bytes(type);
    if (blk == 0 || rows < 0 || in <= 0 || (size_t)in % blk != 0)
        return 0;
    return (size_t)rows * ((size_t)in / blk * bb);
}

/* ---- weights ---- */

ms_status ms_cuda_qweight_init(ms_cuda_qweight *w, uint32_t type, int64_t rows, int64_t in, ms_error *err) {
    memset(w, 0, sizeof *w);
    if (!ms_cuda_qweight_supported(type))
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "cuda quant: ggml type %s is not kept quantized (Q4_0, Q4_1, "
                       "Q5_0, Q8_0, Q4_K, Q5_K, Q6_K)", ms_ggml_type_name(type));
    size_t blk = ms_ggml_type_block(type);
    if (rows < 1 || rows > 0x7fffffff || in < 1 || in > 0x7fffffff || (size_t)in % blk != 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "cuda quant: %s weight [%lld, %lld]: rows must be in [1, 2^31) "
                       "and in a positive multiple of %zu", ms_ggml_type_name(type), (long long)rows,
                       (long long)in, blk);
    size_t row_bytes = (size_t)in / blk * ms_ggml_type_block_bytes(type);
    if (row_bytes > 0x7fffffff)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "cuda quant: %s rows of %zu bytes", ms_ggml_type_name(type),
                       row_bytes);
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, (size_t)rows * row_bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return MS_FAIL(err, MS_ERR_CUDA, "cuda quant: cudaMalloc of %zu bytes for a %s weight [%lld, %lld]: %s",
                       (size_t)rows * row_bytes, ms_ggml_type_name(type), (long long)rows, (long long)in,
                       cudaGetErrorString(e));
    }
    *w = (ms_cuda_qweight){p, type, rows, in, row_bytes};
    return MS_OK;
}

ms_status ms_cuda_qweight_upload_rows(ms_cuda_qweight *w, int64_t row0, int64_t n_rows, const void *host,
                                      ms_error *err) {
    if (w == NULL || w->data == NULL || host == NULL || row0 < 0 || n_rows < 0 || row0 + n_rows > w->rows)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "cuda quant: upload of rows [%lld, %lld) into a weight of %lld "
                       "rows", (long long)row0, (long long)(row0 + n_rows), (long long)(w ? w->rows : 0));
    return ms_cuda_qweight_copy_rows((char *)w->data + (size_t)row0 * w->row_bytes, host, w->type, n_rows, w->in,
                                     NULL, err);
}

/* host rows converted per chunk of about this many bytes (a bounded staging buffer, never a copy of
 * a whole 300 MB lm_head) */
#define PLANAR_CHUNK_BYTES ((size_t)8 << 20)

ms_status ms_cuda_qweight_copy_rows(void *dev, const void *host, uint32_t type, int64_t n_rows, int64_t in,
                                    cudaStream_t stream, ms_error *err) {
    const size_t rb = ms_cuda_qweight_bytes(type, 1, in);
    if (dev == NULL || host == NULL || n_rows < 0 || rb == 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "cuda quant: copy of %lld %s rows of %lld values", (long long)n_rows,
                       ms_ggml_type_name(type), (long long)in);
    if (n_rows == 0)
        return MS_OK;
    size_t per = PLANAR_CHUNK_BYTES / rb;
    if (per < 1)
        per = 1;
    if (per > (size_t)n_rows)
        per = (size_t)n_rows;
    uint8_t *buf = ms_malloc(per * rb);
    if (buf == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "cuda quant: out of memory for a %zu-byte staging buffer", per * rb);
    ms_status st = MS_OK;
    for (size_t r = 0; r < (size_t)n_rows && st == MS_OK; r += per) {
        const size_t n = (size_t)n_rows - r < per ? (size_t)n_rows - r : per;
        if (ms_ggml_rows_to_planar(type, (const uint8_t *)host + r * rb, buf, n, (size_t)in) != MS_OK) {
            st = MS_FAIL(err, MS_ERR_INVALID_ARG, "cuda quant: %s rows of %lld values cannot be laid out",
                         ms_ggml_type_name(type), (long long)in);
            break;
        }
        cudaError_t e = cudaMemcpyAsync((uint8_t *)dev + r * rb, buf, n * rb, cudaMemcpyHostToDevice, stream);
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(stream); /* the staging buffer is refilled next */
        if (e != cudaSuccess) {
            (void)cudaGetLastError();
            st = MS_FAIL(err, MS_ERR_CUDA, "cuda quant: copying %zu rows of %s to the device: %s", n,
                         ms_ggml_type_name(type), cudaGetErrorString(e));
        }
    }
    ms_free(buf);
    return st;
}

void ms_cuda_qweight_free(ms_cuda_qweight *w) {
    if (w == NULL)
        return;
    if (w->data != NULL)
        MS_CUDA_CHECK(cudaFree(w->data));
    memset(w, 0, sizeof *w);
}

/* ---- context ---- */

ms_status ms_cuda_quant_init(ms_cuda_quant **out, int arch, const char *cache_dir, cudaStream_t stream,
                             cublasHandle_t cublas, ms_error *err) {
    *out = NULL;
    if (cublas == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "cuda quant: NULL cuBLAS handle");
    ms_cuda_quant *q = ms_calloc(1, sizeof *q);
    if (q == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "cuda quant: out of memory");
    q->arch = arch;
    q->stream = stream;
    q->cublas = cublas;
    if (cache_dir != NULL && (q->cache_dir = ms_strdup(cache_dir)) == NULL) {
        ms_free(q);
        return MS_FAIL(err, MS_ERR_OOM, "cuda quant: out of memory");
    }
    *out = q;
    return MS_OK;
}

void ms_cuda_quant_free(ms_cuda_quant *q) {
    if (q == NULL)
        return;
    for (int i = 0; i < QTYPE_SLOTS; i++)
        ms_cuda_module_free(q->mods[i]);
    ms_cuda_module_free(q->misc);
    if (q->x16 != NULL)
        MS_CUDA_CHECK(cudaFree(q->x16));
    if (q->tile != NULL)
        MS_CUDA_CHECK(cudaFree(q->tile));
    if (q->qx != NULL)
        MS_CUDA_CHECK(cudaFree(q->qx));
    for (int i = 0; i < q->n_retired; i++)
        MS_CUDA_CHECK(cudaFree(q->retired[i]));
    ms_free(q->cache_dir);
    ms_free(q);
}

static ms_status get_module(ms_cuda_quant *q, uint32_t type, ms_cuda_module **m, ms_error *err) {
    int slot = qtype_slot(type);
    if (slot < 0)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "cuda quant: ggml type %s is not kept quantized (Q4_0, Q4_1, "
                       "Q5_0, Q8_0, Q4_K, Q5_K, Q6_K)", ms_ggml_type_name(type));
    if (q->mods[slot] == NULL) {
        if (q->sealed)
            return MS_FAIL(err, MS_ERR_STATE, "cuda quant: the qmatmul instance for %s was not loaded with the "
                           "model's kernels", ms_ggml_type_name(type));
        ms_kernel_spec s = ms_kernel_spec_qmatmul((int)type);
        MS_TRY(ms_cuda_module_init(&q->mods[slot], &s, q->arch, q->cache_dir, err));
    }
    *m = q->mods[slot];
    return MS_OK;
}

static ms_status get_misc(ms_cuda_quant *q, ms_error *err) {
    if (q->misc != NULL)
        return MS_OK;
    if (q->sealed)
        return MS_FAIL(err, MS_ERR_STATE, "cuda quant: the bf16 misc instance was not loaded with the model's "
                       "kernels");
    ms_kernel_spec s = ms_kernel_spec_simple(MS_KERNEL_OP_MISC, MS_KERNEL_DTYPE_BF16);
    s.act_dtype = MS_KERNEL_DTYPE_F32;
    return ms_cuda_module_init(&q->misc, &s, q->arch, q->cache_dir, err);
}

ms_status ms_cuda_quant_load_type(ms_cuda_quant *q, uint32_t type, ms_error *err) {
    ms_cuda_module *m;
    MS_TRY(get_module(q, type, &m, err));
    return get_misc(q, err);
}

void ms_cuda_quant_seal(ms_cuda_quant *q) {
    q->sealed = true;
}

/* Grow a workspace to at least `need` bytes (never during capture). The old buffer is retired,
 * not freed: a CUDA graph captured before this call still holds its address and writes into it at
 * every replay (a bf16 x copy sized for the captured rows), so it lives until ms_cuda_quant_free.
 * Freeing it here was a use-after-free: 8B Q4_0 bench at batch 32 with prompts of 512, whose
 * eager prefill steps grew the workspace after the decode graphs were captured, then replayed a
 * batch-32 graph into the freed copy (compute-sanitizer: invalid writes in ms_convert; CUDA error
 * 700). With `doubling` (the x copy, which grows with each larger step) growth at least doubles
 * where memory allows, so the retired copies add up to about the live one; the tile, whose size
 * sets the prefill's tiling, grows to exactly what is asked (a few times at most). */
static ms_status grow(ms_cuda_quant *q, void **p, size_t *have, size_t need, bool doubling, const char *what,
                      ms_error *err) {
    if (need <= *have)
        return MS_OK;
    enum cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    MS_CUDA_TRY(err, cudaStreamIsCapturing(q->stream, &cs));
    if (cs != cudaStreamCaptureStatusNone)
        return MS_FAIL(err, MS_ERR_STATE, "cuda quant: the %s must grow to %zu bytes during graph capture (size "
                       "it with ms_cuda_quant_reserve or run an eager step first)", what, need);
    if (*p != NULL && q->n_retired == QUANT_MAX_RETIRED)
        return MS_FAIL(err, MS_ERR_CAPACITY, "cuda quant: the %s would grow a %d-th time (to %zu bytes); size it "
                       "once with ms_cuda_quant_reserve", what, QUANT_MAX_RETIRED + 1, need);
    size_t want = need;
    if (doubling && *have > 0 && want < 2 * *have)
        want = 2 * *have;
    void *np = NULL;
    cudaError_t e = cudaMalloc(&np, want);
    if (e != cudaSuccess && want > need) {
        (void)cudaGetLastError();
        want = need;
        e = cudaMalloc(&np, want);
    }
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return MS_FAIL(err, MS_ERR_CUDA, "cuda quant: cudaMalloc of %zu bytes for the %s: %s", need, what,
                       cudaGetErrorString(e));
    }
    if (*p != NULL)
        q->retired[q->n_retired++] = *p;
    *p = np;
    *have = want;
    return MS_OK;
}

ms_status ms_cuda_quant_reserve(ms_cuda_quant *q, int64_t max_x_rows, int64_t max_in, size_t tile_bytes,
                                ms_error *err) {
    if (max_x_rows < 0 || max_in < 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "cuda quant: reserve for %lld rows of %lld", (long long)max_x_rows,
                       (long long)max_in);
    size_t t = tile_bytes != 0 ? tile_bytes : DEFAULT_TILE_BYTES;
    if (t < (size_t)max_in * 2)
        t = (size_t)max_in * 2;
    MS_TRY(grow(q, &q->x16, &q->x16_bytes, (size_t)max_x_rows * (size_t)max_in * 2, true, "bf16 x workspace",
                err));
    int64_t qs;
    size_t qat;
    MS_TRY(grow(q, &q->qx, &q->qx_bytes,
                qx_layout(max_x_rows < MS_CUDA_QGEMV_MAX_ROWS ? max_x_rows : MS_CUDA_QGEMV_MAX_ROWS, max_in, &qs, &qat),
                true, "quantized x workspace", err));
    return grow(q, &q->tile, &q->tile_bytes, t, false, "dequantized weight tile", err);
}

/* ---- ops ---- */

static bool aligned16(const void *p) {
    return ((uintptr_t)p & 15u) == 0;
}

bool ms_cuda_qweight_wide_rows(const ms_cuda_qweight *w) {
    return w != NULL && w->data != NULL && w->row_bytes % 16 == 0 && aligned16(w->data);
}


static ms_status launch(const ms_cuda_module *m, int entry, unsigned grid, unsigned threads, ms_qmatmul_params *p,
                        cudaStream_t stream, ms_error *err) {
    if (grid == 0)
        return MS_OK;
    return ms_cuda_launch_entry(m, entry, grid, 1, 1, threads, p, stream, err);
}

static ms_status check_weight(const ms_cuda_qweight *w, ms_error *err) {
    if (w == NULL || w->data == NULL || !ms_cuda_qweight_supported(w->type) || w->rows < 1 ||
        w->rows > 0x7fffffff || w->in < 1 || w->in > 0x7fffffff ||
        w->row_bytes != ms_cuda_qweight_bytes(w->type, 1, w->in))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "cuda quant: not a quantized weight (type %s, [%lld, %lld])",
                       w != NULL ? ms_ggml_type_name(w->type) : "?", w != NULL ? (long long)w->rows : 0,
                       w != NULL ? (long long)w->in : 0);
    return MS_OK;
}

ms_status ms_cuda_quant_dequant_bf16(ms_cuda_quant *q, const ms_cuda_qweight *w, int64_t row0, int64_t n_rows,
                                     void *out, ms_error *err) {
    MS_TRY(check_weight(w, err));
    if (row0 < 0 || n_rows < 0 || row0 + n_rows > w->rows || out == NULL || !aligned16(out))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "cuda quant: dequantize rows [%lld, %lld) of %lld into %s",
                       (long long)row0, (long long)(row0 + n_rows), (long long)w->rows,
                       out == NULL ? "NULL" : "an unaligned buffer");
    ms_cuda_module *m;
    MS_TRY(get_module(q, w->type, &m, err));
    ms_qmatmul_params p = {0};
    p.w = (const char *)w->data + (size_t)row0 * w->row_bytes;
    p.out_bf16 = out;
    p.rows = (int)n_rows;
    p.in = (int)w->in;
    p.row_bytes = (int)w->row_bytes;
    int64_t units = n_rows * (w->in / 32);
    int64_t blocks = MS_CEIL_DIV(units, MS_QDEQUANT_THREADS);
    return launch(m, DEQUANT_ENTRY, (unsigned)(blocks > 65536 ? 65536 : blocks), MS_QDEQUANT_THREADS, &p,
                  q->stream, err);
}

/* The GEMV launches for n (1 .. MS_CUDA_QGEMV_MAX_ROWS) x rows: a launch of the exact-width entry
   per group of up to MS_QGEMV_MAX_COLS rows, reading the float x (x, x_stride) or, for the
   MS_QGEMV_PREQ_TYPE types, its quantized form qx (required then). */
static ms_status gemv(ms_cuda_quant *q, ms_cuda_module *m, const ms_cuda_qx *qx, const float *x, int64_t n,
                      int64_t x_stride, const ms_cuda_qweight *w, float *y, int64_t y_stride, bool acc,
                      ms_error *err) {
    const bool wide = ms_cuda_qweight_wide_rows(w);
    for (int64_t g = 0; g < n; g += MS_QGEMV_MAX_COLS) {
        const int64_t k = n - g < MS_QGEMV_MAX_COLS ? n - g : MS_QGEMV_MAX_COLS;
        ms_qmatmul_params p = {0};
        p.w = w->data;
        p.x = x != NULL ? x + g * x_stride : NULL;
        p.y = y + g * y_stride;
        p.rows = (int)w->rows;
        p.in = (int)w->in;
        p.row_bytes = (int)w->row_bytes;
        p.n = (int)k;
        p.x_stride = (int)x_stride;
        p.y_stride = (int)y_stride;
        p.wide = wide;
        p.acc = acc;
        if (qx != NULL) {
            p.qx = (char *)qx->q + g * qx->q_stride;
            p.qd = qx->d + g * qx->d_stride;
            p.qx_stride = (int)qx->q_stride;
            p.qd_stride = (int)qx->d_stride;
        }
        /* x rows up to MS_QGEMV_ACC_COLS: the entry of the store (set or add); above, the entry
           reads p.acc; quantized x at up to MS_QGEMV_I8_MAX_COLS rows: the ms_qgemv_q_* entries
           (the plain ones quantize the float x in each CTA there) */
        int entry = acc && k <= MS_QGEMV_ACC_COLS ? ACC_ENTRY + (int)k - 1 : (int)k - 1;
        if (qx != NULL && k <= MS_QGEMV_I8_MAX_COLS)
            entry = QX_ENTRY + (acc ? MS_QGEMV_I8_MAX_COLS : 0) + (int)k - 1;
        MS_TRY(launch(m, entry, (unsigned)MS_CEIL_DIV(w->rows, MS_QGEMV_ROWS_OF(k)), MS_QGEMV_THREADS, &p,
                      q->stream, err));
    }
    return MS_OK;
}

bool ms_cuda_quant_reads_qx(const ms_cuda_qweight *w, int64_t n) {
    return w != NULL && MS_QGEMV_PREQ_TYPE(w->type) && n >= 1 && n <= MS_CUDA_QGEMV_MAX_ROWS;
}

ms_status ms_cuda_quant_qx(ms_cuda_quant *q, int64_t n, int64_t in, ms_cuda_qx *out, ms_error *err) {
    if (q == NULL || out == NULL || n < 1 || n > MS_CUDA_QGEMV_MAX_ROWS || in < 32 || in % 32 != 0 ||
        in > 0x7fffffff)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "cuda quant: quantized x of %lld rows x %lld values (1 .. %d rows, "
                       "a positive multiple of 32 values)", (long long)n, (long long)in, MS_CUDA_QGEMV_MAX_ROWS);
    int64_t stride = 0;
    size_t scales_at = 0;
    MS_TRY(grow(q, &q->qx, &q->qx_bytes, qx_layout(n, in, &stride, &scales_at), true, "quantized x workspace",
                err));
    *out = (ms_cuda_qx){q->qx, (float *)((char *)q->qx + scales_at), stride, in / 32};
    return MS_OK;
}

ms_status ms_cuda_quant_linear_qx(ms_cuda_quant *q, const ms_cuda_qx *x, int64_t n, const ms_cuda_qweight *w,
                                  float *y, int64_t y_stride, bool acc, ms_error *err) {
    MS_TRY(check_weight(w, err));
    if (x == NULL || y == NULL || !ms_cuda_quant_reads_qx(w, n) || y_stride < w->rows || y_stride > 0x7fffffff ||
        !ms_cuda_q8x_fits(x->q, x->q_stride, x->d, x->d_stride, w->in) ||
        x->q_stride > 0x7fffffff || x->d_stride > 0x7fffffff)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "cuda quant: linear of quantized x [%lld, %lld] with %s W [%lld, "
                       "%lld] into y (stride %lld): the GEMV of Q4_0 / Q8_0 / Q4_K at 1 .. %d rows reads x quantized "
                       "(int8 rows 16-byte aligned, %lld scales a row)",
                       (long long)n, (long long)w->in, ms_ggml_type_name(w->type), (long long)w->rows,
                       (long long)w->in, (long long)y_stride, MS_CUDA_QGEMV_MAX_ROWS, (long long)(w->in / 32));
    ms_cuda_module *m;
    MS_TRY(get_module(q, w->type, &m, err));
    return gemv(q, m, x, NULL, n, 0, w, y, y_stride, acc, err);
}

ms_status ms_cuda_quant_linear(ms_cuda_quant *q, const float *x, int64_t n, int64_t x_stride,
                               const ms_cuda_qweight *w, float *y, int64_t y_stride, bool acc,
                               ms_error *err) {
    MS_TRY(check_weight(w, err));
    if (x == NULL || y == NULL || n < 0 || n > 0x7fffffff || x_stride < w->in || y_stride < w->rows ||
        x_stride > 0x7fffffff || y_stride > 0x7fffffff)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "cuda quant: linear of x [%lld, %lld] (stride %lld) with %s W "
                       "[%lld, %lld] into y (stride %lld)", (long long)n, (long long)w->in, (long long)x_stride,
                       ms_ggml_type_name(w->type), (long long)w->rows, (long long)w->in, (long long)y_stride);
    if (n == 0)
        return MS_OK;
    ms_cuda_module *m;
    MS_TRY(get_module(q, w->type, &m, err));
    if (n <= MS_CUDA_QGEMV_MAX_ROWS && aligned16(x) && x_stride % 4 == 0) {
        if (!MS_QGEMV_PREQ_TYPE(w->type) || n <= MS_QGEMV_I8_MAX_COLS)
            return gemv(q, m, NULL, x, n, x_stride, w, y, y_stride, acc, err);
        /* the integer types above MS_QGEMV_I8_MAX_COLS rows read x quantized:
           ms_qquant_x first, once for all groups (the narrower entries quantize it in each CTA) */
        ms_cuda_qx qx;
        MS_TRY(ms_cuda_quant_qx(q, n, w->in, &qx, err));
        ms_qmatmul_params qp = {0};
        qp.x = x;
        qp.n = (int)n;
        qp.in = (int)w->in;
        qp.x_stride = (int)x_stride;
        qp.qx = qx.q;
        qp.qd = qx.d;
        qp.qx_stride = (int)qx.q_stride;
        qp.qd_stride = (int)qx.d_stride;
        const int64_t blocks = MS_CEIL_DIV(n * qx.d_stride * MS_QQUANT_X_LANES, MS_QDEQUANT_THREADS);
        MS_TRY(launch(m, QUANT_X_ENTRY, (unsigned)blocks, MS_QDEQUANT_THREADS, &qp, q->stream, err));
        return gemv(q, m, &qx, x, n, x_stride, w, y, y_stride, acc, err);
    }
    /* prefill: x -> bf16 once, then per row tile: dequantize W rows, GEMM into y's columns */
    MS_TRY(get_misc(q, err));
    size_t tile = q->tile_bytes > (size_t)w->in * 2 ? q->tile_bytes : DEFAULT_TILE_BYTES;
    if (tile < (size_t)w->in * 2)
        tile = (size_t)w->in * 2;
    MS_TRY(grow(q, &q->tile, &q->tile_bytes, tile, false, "dequantized weight tile", err));
    MS_TRY(grow(q, &q->x16, &q->x16_bytes, (size_t)n * (size_t)w->in * 2, true, "bf16 x workspace", err));
    ms_misc_params cp = {x, NULL, q->x16, NULL, (int)n, (int)w->in, (int)x_stride, 0, (int)w->in};
    MS_TRY(ms_cuda_misc_launch(q->misc, 0, &cp, q->stream, err));
    size_t use = q->tile_bytes;
    if (n <= SMALL_N_ROWS && use > SMALL_N_TILE_BYTES)
        use = SMALL_N_TILE_BYTES > (size_t)w->in * 2 ? SMALL_N_TILE_BYTES : (size_t)w->in * 2;
    int64_t tile_rows = (int64_t)(use / ((size_t)w->in * 2));
    const float one = 1.f, zero = acc ? 1.f : 0.f; /* beta: acc adds into y */
    for (int64_t r0 = 0; r0 < w->rows; r0 += tile_rows) {
        int64_t rows = w->rows - r0 < tile_rows ? w->rows - r0 : tile_rows;
        MS_TRY(ms_cuda_quant_dequant_bf16(q, w, r0, rows, q->tile, err));
        /* column-major view: y^T [rows, n] (ld y_stride) = W_tile [rows, in] x16^T */
        MS_CUBLAS_TRY(err, cublasGemmEx(q->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)rows, (int)n, (int)w->in, &one,
                                        q->tile, CUDA_R_16BF, (int)w->in, q->x16, CUDA_R_16BF, (int)w->in, &zero,
                                        y + r0, CUDA_R_32F, (int)y_stride, CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT));
    }
    return MS_OK;
}

ms_status ms_cuda_quant_embed(ms_cuda_quant *q, const ms_cuda_qweight *w, const int32_t *ids, int64_t n, float *out,
                              int64_t out_stride, ms_error *err) {
    MS_TRY(check_weight(w, err));
    if (ids == NULL || out == NULL || n < 0 || n > 0x7fffffff || out_stride < w->in || out_stride % 4 != 0 ||
        out_stride > 0x7fffffff || !aligned16(out))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "cuda quant: embedding of %lld ids from a %s table [%lld, %lld] "
                       "into out (stride %lld; 16-byte aligned rows needed)", (long long)n,
                       ms_ggml_type_name(w->type), (long long)w->rows, (long long)w->in, (long long)out_stride);
    ms_cuda_module *m;
    MS_TRY(get_module(q, w->type, &m, err));
    ms_qmatmul_params p = {0};
    p.w = w->data;
    p.x = ids;
    p.y = out;
    p.rows = (int)w->rows;
    p.in = (int)w->in;
    p.row_bytes = (int)w->row_bytes;
    p.n = (int)n;
    p.y_stride = (int)out_stride;
    return launch(m, EMBED_ENTRY, (unsigned)n, MS_QGEMV_THREADS, &p, q->stream, err);
}
