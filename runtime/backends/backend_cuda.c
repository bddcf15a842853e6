/*
 * backend_cuda.c - the CUDA implementation of the op interface (backend.h, backend_cuda.h).
 *
 * Constraints: every CUDA and cuBLAS call is checked (MS_CUDA_TRY / MS_CUBLAS_TRY); ops are
 * queued on one stream and never synchronize except copy_to_host / synchronize; host checks of
 * shapes and dtypes mirror the CPU backend's messages ("linear: ..."); kernel instances are
 * compiled on first use and kept in a small table keyed by URI.
 */
#include "backend_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cuda_quant.h"
#include "cuda_ops.h"

/* ---- context ---- */

#define MAX_MODULES 96
#define MAX_SPLITS MS_ATTN_DECODE_MAX_SPLITS
#define CUBLAS_WORKSPACE_BYTES ((size_t)32 << 20)
#define MAX_RETIRED 64

typedef struct cuda_ctx {
    int device;
    int arch;          /* 90 for sm_90 */
    int n_sms;
    cudaStream_t stream;
    cublasHandle_t cublas;
    void *cublas_ws;   /* cuBLAS workspace (cublasSetWorkspace): GEMMs under graph capture
                          allocate nothing */
    char *cache_dir;   /* NULL: default */
    ms_cuda_module *mods[MAX_MODULES];
    int n_mods;
    void *scratch;     /* bf16 copies of GEMM inputs; grows on first use */
    size_t scratch_bytes;
    float *ones;       /* [ones_n] 1.0f for bias rank-1 updates */
    int64_t ones_n;
    uint16_t *ones16;  /* [ones16_n] 1.0 in ones16_dt (bf16 / f16 biases, a k = 1 GEMM) */
    int64_t ones16_n;
    ms_dtype ones16_dt;
    bool capturing;
    int n_graphs;      /* executable graphs alive (graph_capture_end .. graph_free) */
    void *retired[MAX_RETIRED]; /* buffers ensure_device grew past while graphs were alive: a */
    int n_retired;              /* recorded graph may read them; freed with the last graph */
    bool sealed;       /* kernels_load ran: the instance table is the model's, complete */
    ms_cuda_quant *quant; /* weights kept in ggml blocks (backend_cuda_quant.h); made on first use */
    int gemv_max_n;    /* 16-bit weights at up to this many x rows take ms_gemv (templates/misc/
                          gemv.cuh), the others convert + cuBLAS; MS_CUDA_GEMV=N at init (0: off) */
    int fold_norm;     /* rms_norm_linear at the GEMVs' sizes runs the norm inside the GEMV (1, the
                          default) or as its own launch first (0); MS_CUDA_NORM_FOLD at init */
    int qx_fuse;       /* the RMSNorm / SiLU-and-multiply before a Q4_0 / Q8_0 / Q4_K GEMV write x
                          quantized for it (1, the default: norm_qx_linear, silu_mul_linear_to) or
                          float x that the linear quantizes in a launch of its own (0);
                          MS_CUDA_QX_FUSE at init */
} cuda_ctx;

/* Per-batch device state beyond the shared index arrays. */
typedef struct cuda_batch {
    int32_t *dev;        /* device block behind the batch's index arrays */
    int32_t *host;       /* host mirror of the same block (layout identical) */
    size_t n_ints;
    int32_t *tile_dev;   /* [2 * max_tiles] prefill tile lists (req, idx) */
    int32_t *tile_host;
    int32_t max_tiles;
    float *part;         /* split-KV partials: [n_seqs, n_splits, hq * (hd + 1)] floats; grows */
    size_t part_floats;
    int32_t *split_counter; /* [counter_ints] split arrival counters, all 0 between launches */
    size_t counter_ints;
    int32_t max_pages;   /* longest view of the staged batch, in pages (sets the decode split) */
    /* the attention plan of the staged batch (attn_batch_plan; cleared by every stage) */
    bool planned;
    int32_t plan_hq;     /* query heads, mask and window it was planned for */
    bool plan_causal;
    int32_t plan_window;
    ms_cuda_module *plan_mod; /* the decode or prefill instance */
    int plan_splits;     /* decode: split-KV count and pages per split; prefill: 1, 1 */
    int plan_pages_per_split;
    int plan_tiles;      /* prefill: tiles in tile_dev */
} cuda_batch;

static ms_status get_module(cuda_ctx *c, const ms_kernel_spec *s, ms_cuda_module **out,
                            ms_error *err) {
    char uri[MS_KERNEL_URI_MAX];
    MS_TRY(ms_kernel_spec_uri(s, c->arch, uri, sizeof uri, err));
    for (int i = 0; i < c->n_mods; i++)
        if (strcmp(c->mods[i]->uri, uri) == 0) {
            *out = c->mods[i];
            return MS_OK;
        }
    if (c->sealed)
        return MS_FAIL(err, MS_ERR_STATE,
                       "cuda backend: kernel instance %s is not in the model's kernel list (the "
                       "instances loaded at init); the generated list misses it",
                       uri);
    if (c->n_mods == MAX_MODULES)
        return MS_FAIL(err, MS_ERR_CAPACITY, "cuda backend: more than %d kernel instances",
                       MAX_MODULES);
    if (c->capturing)
        return MS_FAIL(err, MS_ERR_STATE,
                       "cuda backend: kernel %s first used during graph capture (run an eager "
                       "warm-up step first)",
                       uri);
    MS_TRY(ms_cuda_module_init(&c->mods[c->n_mods], s, c->arch, c->cache_dir, err));
    *out = c->mods[c->n_mods++];
    return MS_OK;
}

static ms_kernel_dtype kdtype(ms_dtype dt) {
    return dt == MS_DTYPE_F32 ? MS_KERNEL_DTYPE_F32
                              : (dt == MS_DTYPE_F16 ? MS_KERNEL_DTYPE_F16 : MS_KERNEL_DTYPE_BF16);
}

/* Device memory that grows (only outside capture); contents are not kept. */
static ms_status ensure_device(cuda_ctx *c, void **p, size_t *have, size_t need, const char *what,
                               ms_error *err) {
    if (need <= *have)
        return MS_OK;
    if (c->capturing)
        return MS_FAIL(err, MS_ERR_STATE,
                       "cuda backend: %s must grow to %zu bytes during graph capture (run an "
                       "eager warm-up step first)",
                       what, need);
    MS_CUDA_TRY(err, cudaStreamSynchronize(c->stream));
    if (*p != NULL && c->n_graphs > 0) {
        /* a graph recorded earlier reads the old buffer at its fixed address: keep it alive
           until the last graph is freed, and grow to a power of two so that it happens rarely */
        if (c->n_retired == MAX_RETIRED)
            return MS_FAIL(err, MS_ERR_CAPACITY,
                           "cuda backend: %s must grow to %zu bytes, but %d buffers were already "
                           "grown past while graphs are alive",
                           what, need, MAX_RETIRED);
        size_t grown = 1;
        while (grown < need && grown < ((size_t)1 << 62))
            grown <<= 1;
        need = grown;
        c->retired[c->n_retired++] = *p;
        *p = NULL;
    }
    if (*p != NULL)
        MS_CUDA_TRY(err, cudaFree(*p));
    *p = NULL;
    *have = 0;
    MS_CUDA_TRY(err, cudaMalloc(p, need));
    *have = need;
    return MS_OK;
}

/* ---- tensor checks (same wording as the CPU backend) ---- */

#define DT_F32 (1u << MS_DTYPE_F32)
#define DT_I32 (1u << MS_DTYPE_I32)
#define DT_BF16 (1u << MS_DTYPE_BF16)
#define DT_FLOATS ((1u << MS_DTYPE_F32) | (1u << MS_DTYPE_BF16) | (1u << MS_DTYPE_F16))
#define DT_QUANT                                                                                   \
    ((1u << MS_DTYPE_Q4_0) | (1u << MS_DTYPE_Q4_1) | (1u << MS_DTYPE_Q5_0) | (1u << MS_DTYPE_Q8_0) | \
     (1u << MS_DTYPE_Q4_K) | (1u << MS_DTYPE_Q5_K) | (1u << MS_DTYPE_Q6_K))

static ms_status check_t(const char *op, const char *name, const ms_tensor *t, int lo, int hi,
                         unsigned dtypes, ms_error *err) {
    if (t == NULL || t->data == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: %s missing", op, name);
    if (t->ndim < lo || t->ndim > hi)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: %s has %d dims (expected %d..%d)", op, name,
                       t->ndim, lo, hi);
    if ((unsigned)t->dtype >= MS_DTYPE_COUNT || !(dtypes & (1u << t->dtype)))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: %s has dtype %s", op, name,
                       ms_dtype_str(t->dtype));
    if (t->stride[t->ndim - 1] != 1)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: %s innermost stride %lld (must be 1)", op,
                       name, (long long)t->stride[t->ndim - 1]);
    return MS_OK;
}

static bool fits_int(int64_t v) { return v >= 0 && v <= 0x7fffffff; }

/* Rows of a 2-D view, or of a 3-D [n, h, d] view with packed heads (stride[1] == d), as one
 * uniformly strided 2-D matrix [rows, cols] with row stride *rs. False when not uniform. */
static bool as_rows(const ms_tensor *t, int64_t *rows, int64_t *cols, int64_t *rs) {
    if (t->ndim == 2) {
        *rows = t->shape[0];
        *cols = t->shape[1];
        *rs = t->stride[0];
        return true;
    }
    if (t->ndim == 3 && t->stride[1] == t->shape[2]) {
        /* [n, h, d] with token stride h*d is [n*h, d]; otherwise [n, h*d] rows */
        if (t->stride[0] == t->shape[1] * t->shape[2] || t->shape[0] == 1) {
            *rows = t->shape[0] * t->shape[1];
            *cols = t->shape[2];
            *rs = t->shape[2];
            return true;
        }
    }
    return false;
}

/* ---- memory ---- */

static ms_status cu_buffer_alloc(void *ctx, size_t bytes, const char *name, void **out,
                                 ms_error *err) {
    (void)ctx;
    *out = NULL;
    if (bytes == 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "buffer_alloc: %s: zero bytes", name ? name : "?");
    cudaError_t e = cudaMalloc(out, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        size_t fr = 0, tot = 0;
        (void)cudaMemGetInfo(&fr, &tot);
        *out = NULL;
        return MS_FAIL(err, MS_ERR_OOM, "%s: %.2f GB requested, %.2f of %.2f GB free on the GPU (%s)",
                       name ? name : "buffer", (double)bytes / 1e9, (double)fr / 1e9,
                       (double)tot / 1e9, cudaGetErrorString(e));
    }
    return MS_OK;
}

static void cu_buffer_free(void *ctx, void *ptr) {
    (void)ctx;
    if (ptr != NULL)
        MS_CUDA_CHECK(cudaFree(ptr)); /* cudaFree waits for work using it */
}

static ms_status cu_buffer_fill(void *ctx, void *dst, int byte, size_t bytes, ms_error *err) {
    cuda_ctx *c = ctx;
    MS_CUDA_TRY(err, cudaMemsetAsync(dst, byte, bytes, c->stream));
    return MS_OK;
}

static ms_status cu_copy_to_backend(void *ctx, void *dst, const void *src, size_t bytes,
                                    ms_error *err) {
    cuda_ctx *c = ctx;
    /* pageable source: the copy is staged before the call returns, so src may be reused */
    MS_CUDA_TRY(err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream));
    return MS_OK;
}

static ms_status cu_copy_to_host(void *ctx, void *dst, const void *src, size_t bytes,
                                 ms_error *err) {
    cuda_ctx *c = ctx;
    MS_CUDA_TRY(err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream));
    MS_CUDA_TRY(err, cudaStreamSynchronize(c->stream));
    return MS_OK;
}

static float load_elem(const char *p, ms_dtype dt) {
    uint16_t h;
    float f;
    switch (dt) {
    case MS_DTYPE_BF16:
        memcpy(&h, p, 2);
        return ms_bf16_to_f32(h);
    case MS_DTYPE_F16:
        memcpy(&h, p, 2);
        return ms_f16_to_f32(h);
    default:
        memcpy(&f, p, 4);
        return f;
    }
}

static void store_elem(char *p, ms_dtype dt, float v) {
    uint16_t h;
    switch (dt) {
    case MS_DTYPE_BF16:
        h = ms_f32_to_bf16(v);
        memcpy(p, &h, 2);
        break;
    case MS_DTYPE_F16:
        h = ms_f32_to_f16(v);
        memcpy(p, &h, 2);
        break;
    default:
        memcpy(p, &v, 4);
        break;
    }
}

/* Convert on the host into a packed buffer, then one 2-D copy per leading index. */
/* ---- weights in ggml blocks (backend_cuda_quant.h) ---- */

static ms_status quant_ctx(cuda_ctx *c, ms_error *err) {
    if (c->quant == NULL)
        MS_TRY(ms_cuda_quant_init(&c->quant, c->arch, c->cache_dir, c->stream, c->cublas, err));
    return MS_OK;
}

/* A block-type weight tensor [rows, cols] with packed rows as a qweight view. */
static ms_status qview(const char *op, const ms_tensor *w, ms_cuda_qweight *q, ms_error *err) {
    MS_TRY(check_t(op, "w", w, 2, 2, DT_QUANT, err));
    size_t rb = ms_dtype_row_bytes(w->dtype, w->shape[1]);
    if (rb == 0 || w->stride[0] != w->shape[1])
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: %s weight [%lld, %lld] needs packed rows of whole blocks",
                       op, ms_dtype_str(w->dtype), (long long)w->shape[0], (long long)w->shape[1]);
    *q = (ms_cuda_qweight){w->data, (uint32_t)ms_dtype_ggml_type(w->dtype), w->shape[0], w->shape[1], rb};
    return MS_OK;
}

static bool cu_weight_dtype_ok(void *ctx, ms_dtype dt) {
    (void)ctx;
    if (dt == MS_DTYPE_F32 || dt == MS_DTYPE_BF16 || dt == MS_DTYPE_F16)
        return true;
    const char *env = getenv("MS_CUDA_QUANT");
    return ms_dtype_is_quant(dt) && !(env != NULL && strcmp(env, "0") == 0);
}

/* tensor_load of a block-type weight: the host blocks (same dtype) in the kernels' planar row
 * layout, and the type's qmatmul instance compiled now, at load. */
static ms_status quant_tensor_load(cuda_ctx *c, const ms_tensor *dst, const ms_tensor *src, ms_error *err) {
    ms_cuda_qweight q;
    MS_TRY(qview("tensor_load", dst, &q, err));
    if (src == NULL || src->data == NULL || src->dtype != dst->dtype || src->ndim != 2 ||
        src->shape[0] != dst->shape[0] || src->shape[1] != dst->shape[1] || src->stride[0] != src->shape[1])
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "tensor_load: a %s dst [%lld, %lld] takes packed host blocks of "
                       "the same type and shape (src %s)", ms_dtype_str(dst->dtype), (long long)dst->shape[0],
                       (long long)dst->shape[1], src != NULL ? ms_dtype_str(src->dtype) : "NULL");
    MS_TRY(quant_ctx(c, err));
    MS_TRY(ms_cuda_quant_load_type(c->quant, q.type, err));
    /* the planar row layout of the kernels (backend_cuda_quant.h), converted on the way */
    return ms_cuda_qweight_copy_rows(dst->data, src->data, q.type, q.rows, q.in, c->stream, err);
}

static ms_status cu_tensor_load(void *ctx, const ms_tensor *dst, const ms_tensor *src,
                                ms_error *err) {
    cuda_ctx *c = ctx;
    if (dst != NULL && ms_dtype_is_quant(dst->dtype))
        return quant_tensor_load(c, dst, src, err);
    MS_TRY(check_t("tensor_load", "dst", dst, 1, MS_TENSOR_MAX_DIMS, DT_FLOATS, err));
    MS_TRY(check_t("tensor_load", "src", src, 1, MS_TENSOR_MAX_DIMS, DT_FLOATS, err));
    if (dst->ndim != src->ndim)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "tensor_load: dst has %d dims, src %d", dst->ndim,
                       src->ndim);
    for (int i = 0; i < dst->ndim; i++)
        if (dst->shape[i] != src->shape[i]) {
            char a[64], b[64];
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "tensor_load: dst %s does not match src %s",
                           ms_tensor_shape_str(dst, a, sizeof a), ms_tensor_shape_str(src, b, sizeof b));
        }
    const int nd = dst->ndim;
    const int64_t cols = dst->shape[nd - 1];
    const int64_t rows = nd >= 2 ? dst->shape[nd - 2] : 1;
    int64_t outer = 1;
    for (int i = 0; i < nd - 2; i++)
        outer *= dst->shape[i];
    const size_t ss = ms_dtype_size(src->dtype), ds = ms_dtype_size(dst->dtype);
    char *buf = ms_malloc((size_t)(rows * cols) * ds);
    if (buf == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "tensor_load: no host memory for %lld x %lld staging",
                       (long long)rows, (long long)cols);
    ms_status st = MS_OK;
    for (int64_t o = 0; o < outer && st == MS_OK; o++) {
        int64_t so = 0, dof = 0, rem = o;
        for (int i = nd - 3; i >= 0; i--) {
            int64_t idx = rem % dst->shape[i];
            rem /= dst->shape[i];
            so += idx * src->stride[i];
            dof += idx * dst->stride[i];
        }
        for (int64_t r = 0; r < rows; r++) {
            const char *s = (const char *)src->data +
                            (size_t)(so + (nd >= 2 ? r * src->stride[nd - 2] : 0)) * ss;
            char *d = buf + (size_t)(r * cols) * ds;
            if (src->dtype == dst->dtype)
                memcpy(d, s, (size_t)cols * ss);
            else
                for (int64_t i = 0; i < cols; i++)
                    store_elem(d + (size_t)i * ds, dst->dtype, load_elem(s + (size_t)i * ss, src->dtype));
        }
        char *dbase = (char *)dst->data + (size_t)dof * ds;
        size_t dpitch = (size_t)(nd >= 2 ? dst->stride[nd - 2] : cols) * ds;
        cudaError_t e = cudaMemcpy2DAsync(dbase, dpitch, buf, (size_t)cols * ds, (size_t)cols * ds,
                                          (size_t)rows, cudaMemcpyHostToDevice, c->stream);
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(c->stream); /* buf is reused for the next slab */
        if (e != cudaSuccess)
            st = ms_cuda_record_failure(err, MS_ERR_CUDA, "CUDA", (int)e, cudaGetErrorString(e),
                                        "cudaMemcpy2DAsync(dst, ...)", c->device, __FILE__,
                                        __LINE__, __func__);
    }
    ms_free(buf);
    return st;
}

static ms_status cu_synchronize(void *ctx, ms_error *err) {
    cuda_ctx *c = ctx;
    MS_CUDA_TRY(err, cudaStreamSynchronize(c->stream));
    MS_CUDA_TRY(err, cudaGetLastError());
    return MS_OK;
}

/* ---- attention batches ---- */

/* Layout of the int block (device and host mirror), as the CPU backend's. */
static void batch_point(ms_attn_batch *b, int32_t *mem) {
    size_t s = (size_t)b->limits.max_seqs, t = (size_t)b->limits.max_tokens;
    size_t p = (size_t)b->limits.max_pages;
    b->qo_indptr = mem;
    b->kv_indptr = b->qo_indptr + s + 1;
    b->kv_indices = b->kv_indptr + s + 1;
    b->kv_last_page_len = b->kv_indices + p;
    b->kv_start = b->kv_last_page_len + s;
    b->last_token = b->kv_start + s;
    b->token_to_page = b->last_token + s;
    b->token_to_slot = b->token_to_page + t;
}

static void cu_attn_batch_free(void *ctx, ms_attn_batch *b) {
    (void)ctx;
    if (b == NULL)
        return;
    cuda_batch *cb = b->impl;
    if (cb != NULL) {
        if (cb->dev != NULL)
            MS_CUDA_CHECK(cudaFree(cb->dev));
        if (cb->tile_dev != NULL)
            MS_CUDA_CHECK(cudaFree(cb->tile_dev));
        if (cb->part != NULL)
            MS_CUDA_CHECK(cudaFree(cb->part));
        if (cb->split_counter != NULL)
            MS_CUDA_CHECK(cudaFree(cb->split_counter));
        ms_free(cb->host);
        ms_free(cb->tile_host);
        ms_free(cb);
    }
    ms_free(b);
}

static ms_status cu_attn_batch_init(void *ctx, const ms_attn_limits *lim, ms_attn_batch **out,
                                    ms_error *err) {
    cuda_ctx *c = ctx;
    *out = NULL;
    if (lim->max_seqs <= 0 || lim->max_tokens <= 0 || lim->max_pages <= 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "attn_batch_init: limits must be positive (seqs %d, tokens %d, pages %d)",
                       lim->max_seqs, lim->max_tokens, lim->max_pages);
    size_t s = (size_t)lim->max_seqs, t = (size_t)lim->max_tokens, p = (size_t)lim->max_pages;
    ms_attn_batch *b = ms_calloc(1, sizeof *b);
    cuda_batch *cb = ms_calloc(1, sizeof *cb);
    if (b == NULL || cb == NULL) {
        ms_free(b);
        ms_free(cb);
        return MS_FAIL(err, MS_ERR_OOM, "attn_batch_init: out of memory");
    }
    b->limits = *lim;
    b->impl = cb;
    cb->n_ints = 2 * (s + 1) + p + 3 * s + 2 * t;
    /* tiles: sum over views of ceil(q_len * G / 64) <= max_tokens * 16 / 64 + max_seqs */
    cb->max_tiles = (int32_t)(t * 16 / MS_ATTN_PREFILL_ROWS + s + 1);
    cb->host = ms_calloc(cb->n_ints, sizeof(int32_t));
    cb->tile_host = ms_calloc(2 * (size_t)cb->max_tiles, sizeof(int32_t));
    ms_status st = MS_OK;
    if (cb->host == NULL || cb->tile_host == NULL)
        st = MS_FAIL(err, MS_ERR_OOM, "attn_batch_init: out of memory");
    cudaError_t e = cudaSuccess;
    if (st == MS_OK)
        e = cudaMalloc((void **)&cb->dev, cb->n_ints * sizeof(int32_t));
    if (st == MS_OK && e == cudaSuccess)
        e = cudaMalloc((void **)&cb->tile_dev, 2 * (size_t)cb->max_tiles * sizeof(int32_t));
    if (st == MS_OK && e == cudaSuccess)
        /* on the backend's stream: ordered before the first stage's copy */
        e = cudaMemsetAsync(cb->dev, 0, cb->n_ints * sizeof(int32_t), c->stream);
    if (st == MS_OK && e != cudaSuccess)
        st = MS_FAIL(err, MS_ERR_OOM, "attn_batch_init: %zu index entries on the GPU: %s",
                     cb->n_ints, cudaGetErrorString(e));
    if (st != MS_OK) {
        cu_attn_batch_free(ctx, b);
        return st;
    }
    batch_point(b, cb->dev);
    *out = b;
    return MS_OK;
}

static ms_status cu_attn_batch_stage(void *ctx, ms_attn_batch *b, const ms_kv_plan *plan,
                                     const ms_paged_kv *kv, ms_error *err) {
    cuda_ctx *c = ctx;
    cuda_batch *cb = b->impl;
    ms_attn_batch shape;
    memset(&shape, 0, sizeof shape);
    MS_TRY(ms_attn_batch_check(&b->limits, plan, kv, &shape, err));
    /* fill the host mirror through a batch view pointing at it */
    ms_attn_batch h = *b;
    batch_point(&h, cb->host);
    int32_t n = shape.n_seqs;
    h.qo_indptr[0] = 0;
    h.kv_indptr[0] = 0;
    for (int32_t i = 0; i < n; i++) {
        h.qo_indptr[i + 1] = plan->qo_indptr[i + 1];
        h.kv_indptr[i + 1] = plan->kv_indptr[i + 1];
        h.kv_last_page_len[i] = plan->kv_last_page_len[i];
        h.kv_start[i] = plan->kv_start != NULL ? plan->kv_start[i] : 0;
        h.last_token[i] = plan->qo_indptr[i + 1] > plan->qo_indptr[i] ? plan->qo_indptr[i + 1] - 1 : -1;
    }
    if (shape.n_pages > 0)
        memcpy(h.kv_indices, plan->kv_indices, (size_t)shape.n_pages * sizeof(int32_t));
    /* a read-only plan (cross-attention) has no write addresses: every row goes to the sink */
    int32_t written = plan->token_to_page != NULL ? shape.n_tokens : 0;
    if (written > 0) {
        memcpy(h.token_to_page, plan->token_to_page, (size_t)written * sizeof(int32_t));
        memcpy(h.token_to_slot, plan->token_to_slot, (size_t)written * sizeof(int32_t));
    }
    for (int32_t t = written; t < b->limits.max_tokens; t++) {
        h.token_to_page[t] = MS_SINK_PAGE;
        h.token_to_slot[t] = 0;
    }
    MS_CUDA_TRY(err, cudaMemcpyAsync(cb->dev, cb->host, cb->n_ints * sizeof(int32_t),
                                     cudaMemcpyHostToDevice, c->stream));
    b->page_size = shape.page_size;
    b->n_seqs = n;
    b->n_tokens = shape.n_tokens;
    b->n_pages = shape.n_pages;
    b->max_q_len = shape.max_q_len;
    b->max_kv_len = shape.max_kv_len;
    b->is_decode = shape.is_decode;
    int max_pages = 0;
    for (int32_t i = 0; i < n; i++)
        max_pages = MS_MAX(max_pages, plan->kv_indptr[i + 1] - plan->kv_indptr[i]);
    cb->max_pages = max_pages;
    cb->planned = false; /* a new batch needs its own attention plan */
    return MS_OK;
}

/*
 * Attention plan of the staged batch (backend.h attn_batch_plan): the instance, the decode split
 * count (one wave of resident CTAs over the batch's (request, KV head) pairs) with its partial
 * buffers, or the prefill tile list uploaded to tile_dev. Runs once per step; every layer's
 * attention then only launches.
 */
static ms_status cu_attn_batch_plan(void *ctx, ms_attn_batch *batch, const ms_paged_kv *kv,
                                    int32_t n_q_heads, const ms_attn_params *ap, ms_error *err) {
    cuda_ctx *c = ctx;
    cuda_batch *cb = batch->impl;
    cb->planned = false;
    if (kv->dtype != MS_DTYPE_BF16 && kv->dtype != MS_DTYPE_F16)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "attention: KV arena dtype %s (bf16 or f16)",
                       ms_dtype_str(kv->dtype));
    if (n_q_heads < 1 || kv->n_kv_heads < 1 || n_q_heads % kv->n_kv_heads != 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "attention plan: %d query heads is not a multiple of %d KV heads",
                       (int)n_q_heads, kv->n_kv_heads);
    const int G = n_q_heads / kv->n_kv_heads;
    const int hd = kv->head_dim;
    const bool windowed = ap->window > 0;
    ms_cuda_module *m;
    int n_splits = 1, pages_per_split = 1, n_tiles = 0;
    if (batch->is_decode) { /* decode takes every head_dim prefill takes (multiples of 8) */
        ms_kernel_spec sp = ms_kernel_spec_attn_decode(kdtype(kv->dtype), hd, kv->page_size, G,
                                                       windowed);
        sp.act_dtype = MS_KERNEL_DTYPE_F32;
        MS_TRY(get_module(c, &sp, &m, err));
        /* split the keys so that one wave of resident CTAs covers the batch. The split count
           depends on the batch's rows alone (the view length given is the batch's page
           capacity, not the longest view), and each view sizes its own splits in the kernel
           (decode.cuh): a captured graph replays with the count of its capture for any
           lengths, and graph and eager launches of the same rows split alike (bitwise equal).
           pages_per_split is the least pages a split covers. */
        ms_kernel_attn_decode_split(batch->n_seqs, kv->n_kv_heads, batch->limits.max_pages,
                                  c->n_sms * MS_MAX(m->blocks_per_sm, 1), 4, MAX_SPLITS,
                                  &n_splits, &pages_per_split);
        pages_per_split = 4;
        if (n_splits > 1) {
            size_t rows = (size_t)batch->n_seqs * (size_t)n_splits * (size_t)n_q_heads;
            size_t have = cb->part_floats * sizeof(float);
            MS_TRY(ensure_device(c, (void **)&cb->part, &have,
                                 rows * (size_t)(hd + 1) * sizeof(float),
                                 "attention split-KV partials", err));
            cb->part_floats = have / sizeof(float);
            size_t counters = (size_t)batch->limits.max_seqs * (size_t)kv->n_kv_heads;
            if (cb->counter_ints < counters) {
                size_t cbytes = cb->counter_ints * sizeof(int32_t);
                MS_TRY(ensure_device(c, (void **)&cb->split_counter, &cbytes,
                                     counters * sizeof(int32_t), "attention split counters", err));
                MS_CUDA_TRY(err, cudaMemsetAsync(cb->split_counter, 0, cbytes, c->stream));
                cb->counter_ints = cbytes / sizeof(int32_t);
            }
        }
    } else {
        ms_kernel_spec sp = ms_kernel_spec_attn_prefill(kdtype(kv->dtype), hd, kv->page_size, G,
                                                        ap->causal, windowed);
        sp.act_dtype = MS_KERNEL_DTYPE_F32;
        MS_TRY(get_module(c, &sp, &m, err));
        /* tile lists from the host mirror of qo_indptr */
        ms_attn_batch h = *batch;
        batch_point(&h, cb->host);
        MS_TRY(ms_kernel_attn_prefill_tiles(h.qo_indptr, batch->n_seqs, G, cb->tile_host,
                                          cb->tile_host + cb->max_tiles, cb->max_tiles, &n_tiles,
                                          err));
        /* the grid depends on (n_tokens, n_seqs) alone, not on how the tokens split over the
           views: the most tiles any split needs, sum ceil(q_i G / R) <= (T G + (R - 1) n) / R
           for R rows a tile. A graph captured for a token bucket then replays any ragged batch
           of its shape, and eager launches the same grid (graph_exec.h "Prefill"). The tiles
           past the list start past every view's rows (row_base >= n_tokens * G): they return
           before reading or writing anything (prefill.cuh). */
        const int64_t bound =
            ((int64_t)batch->n_tokens * G + (int64_t)(MS_ATTN_PREFILL_ROWS - 1) * batch->n_seqs) /
            MS_ATTN_PREFILL_ROWS;
        const int32_t past = (int32_t)(((int64_t)batch->n_tokens * G + MS_ATTN_PREFILL_ROWS - 1) /
                                       MS_ATTN_PREFILL_ROWS);
        const int n_grid = (int)MS_MIN(bound, (int64_t)cb->max_tiles);
        for (int t = n_tiles; t < n_grid; t++) {
            cb->tile_host[t] = 0;
            cb->tile_host[cb->max_tiles + t] = past;
        }
        n_tiles = MS_MAX(n_tiles, n_grid);
        MS_CUDA_TRY(err, cudaMemcpyAsync(cb->tile_dev, cb->tile_host,
                                         2 * (size_t)cb->max_tiles * sizeof(int32_t),
                                         cudaMemcpyHostToDevice, c->stream));
    }
    cb->plan_mod = m;
    cb->plan_splits = n_splits;
    cb->plan_pages_per_split = pages_per_split;
    cb->plan_tiles = n_tiles;
    cb->plan_hq = n_q_heads;
    cb->plan_causal = ap->causal;
    cb->plan_window = ap->window;
    cb->planned = true;
    return MS_OK;
}

/* Load the model's kernel instances (backend.h kernels_load) and seal the table. */
static ms_status cu_kernels_load(void *ctx, const ms_kernel_spec *specs, int n, ms_error *err) {
    cuda_ctx *c = ctx;
    for (int i = 0; i < n; i++) {
        if (specs[i].op == MS_KERNEL_OP_QMATMUL)
            continue; /* quantized weights: compiled by tensor_load for the types the checkpoint
                         stores (backend_cuda_quant.h), not for every type the model lists */
        ms_cuda_module *m;
        MS_TRY(get_module(c, &specs[i], &m, err));
    }
    c->sealed = true;
    return MS_OK;
}

/* ---- ops ---- */

static ms_status cu_embedding(void *ctx, const ms_tensor *table, const ms_tensor *ids,
                              ms_tensor *out, ms_error *err) {
    cuda_ctx *c = ctx;
    if (table != NULL && ms_dtype_is_quant(table->dtype)) {
        ms_cuda_qweight q;
        MS_TRY(qview("embedding", table, &q, err));
        MS_TRY(check_t("embedding", "ids", ids, 1, 1, DT_I32, err));
        MS_TRY(check_t("embedding", "out", out, 2, 2, DT_F32, err));
        if (out->shape[0] != ids->shape[0] || out->shape[1] != table->shape[1])
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "embedding: out [%lld, %lld] must be [ids %lld, d %lld]",
                           (long long)out->shape[0], (long long)out->shape[1], (long long)ids->shape[0],
                           (long long)table->shape[1]);
        MS_TRY(quant_ctx(c, err));
        return ms_cuda_quant_embed(c->quant, &q, ids->data, ids->shape[0], out->data, out->stride[0], err);
    }
    MS_TRY(check_t("embedding", "table", table, 2, 2, DT_FLOATS, err));
    MS_TRY(check_t("embedding", "ids", ids, 1, 1, DT_I32, err));
    MS_TRY(check_t("embedding", "out", out, 2, 2, DT_F32, err));
    if (out->shape[0] != ids->shape[0] || out->shape[1] != table->shape[1])
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "embedding: out [%lld, %lld] must be [ids %lld, d %lld]",
                       (long long)out->shape[0], (long long)out->shape[1],
                       (long long)ids->shape[0], (long long)table->shape[1]);
    if (table->stride[0] != table->shape[1] || out->stride[0] != out->shape[1] ||
        !fits_int(table->shape[0]) || !fits_int(ids->shape[0]) || !fits_int(table->shape[1]))
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "embedding: table and out must be packed rows");
    ms_kernel_spec s = ms_kernel_spec_simple(MS_KERNEL_OP_EMBED, kdtype(table->dtype));
    s.act_dtype = MS_KERNEL_DTYPE_F32;
    ms_cuda_module *m;
    MS_TRY(get_module(c, &s, &m, err));
    ms_embed_params p = {ids->data, table->data, out->data, NULL, (int)ids->shape[0],
                         (int)table->shape[0], (int)table->shape[1]};
    return ms_cuda_embed_launch(m, &p, c->stream, err);
}

static ms_status misc_module(cuda_ctx *c, ms_cuda_module **m, ms_error *err) {
    ms_kernel_spec s = ms_kernel_spec_simple(MS_KERNEL_OP_MISC, MS_KERNEL_DTYPE_BF16);
    s.act_dtype = MS_KERNEL_DTYPE_F32;
    return get_module(c, &s, m, err);
}

static ms_status linear_bias(cuda_ctx *c, const ms_tensor *bias, int64_t n, int64_t outd,
                             ms_tensor *y, ms_error *err);

/* The 16-bit GEMV's view of linear(x, w) -> y (dimensions already known to fit int). */
static ms_gemv_params gemv_view(const ms_tensor *x, const ms_tensor *w, const ms_tensor *y) {
    return (ms_gemv_params){w->data, x->data, y->data, (int)w->shape[0], (int)x->shape[1],
                            (int)x->shape[0], (int)w->stride[0], (int)x->stride[0],
                            (int)y->stride[0], 0, NULL, 0.f};
}

/* Whether a 16-bit linear takes the GEMV (decode sizes) rather than convert + cuBLAS: cu_linear's
   choice, which the fused entries (cu_silu_mul_linear, cu_rms_norm_linear) follow too. */
static bool takes_gemv(const cuda_ctx *c, const ms_gemv_params *gp) {
    return gp->n <= c->gemv_max_n && ms_cuda_gemv_fits(gp);
}

/* y [n, outd] f32 = x16 W^T through cuBLAS, x16 [n, in] packed rows in w's 16-bit type (device
   memory, e.g. c->scratch), f32 accumulation: the 16-bit linear above the GEMV's sizes; acc: y +=
   (cuBLAS's beta = 1). */
static ms_status gemm16(cuda_ctx *c, const void *x16, int64_t n, int64_t in, const ms_tensor *w,
                        ms_tensor *y, bool acc, ms_error *err) {
    const float one = 1.f, zero = acc ? 1.f : 0.f; /* beta: acc adds into y (linear_add) */
    const cudaDataType_t wt = w->dtype == MS_DTYPE_F16 ? CUDA_R_16F : CUDA_R_16BF;
    MS_CUBLAS_TRY(err, cublasGemmEx(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->shape[0], (int)n,
                                    (int)in, &one, w->data, wt, (int)w->stride[0], x16, wt,
                                    (int)in, &zero, y->data, CUDA_R_32F, (int)y->stride[0],
                                    CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return MS_OK;
}

/* linear(x, w, bias) into y, or added to y's values when acc (linear_add: the GEMVs' p.acc,
   cuBLAS's beta = 1; the bias after the sum in both cases). */
static ms_status linear_to(cuda_ctx *c, const ms_tensor *x, const ms_tensor *w,
                           const ms_tensor *bias, ms_tensor *y, bool acc, ms_error *err) {
    MS_TRY(check_t("linear", "x", x, 2, 2, DT_F32, err));
    MS_TRY(check_t("linear", "w", w, 2, 2, DT_FLOATS | DT_QUANT, err));
    MS_TRY(check_t("linear", "y", y, 2, 2, DT_F32, err));
    const int64_t n = x->shape[0], in = x->shape[1], outd = w->shape[0];
    if (w->shape[1] != in || y->shape[0] != n || y->shape[1] != outd)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "linear: w shape [%lld, %lld] does not match x [%lld, %lld] and y [%lld, "
                       "%lld]",
                       (long long)w->shape[0], (long long)w->shape[1], (long long)n,
                       (long long)in, (long long)y->shape[0], (long long)y->shape[1]);
    if (!fits_int(n) || !fits_int(in) || !fits_int(outd) || !fits_int(w->stride[0]) ||
        !fits_int(x->stride[0]) || !fits_int(y->stride[0]))
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "linear: dimensions beyond int32");
    if (n == 0 || outd == 0)
        return MS_OK;
    /* the handle is bound to c->stream once (cuda_setup): cublasSetStream here would reset the
       workspace set there to cuBLAS's own pool (cuBLAS docs, cublasSetStream) */
    const float one = 1.f, zero = acc ? 1.f : 0.f;
    ms_gemv_params gp = gemv_view(x, w, y);
    gp.acc = acc;
    if (ms_dtype_is_quant(w->dtype)) {
        /* ggml blocks: GEMV for decode-sized n, dequantize + GEMM for prefill */
        ms_cuda_qweight q;
        MS_TRY(qview("linear", w, &q, err));
        MS_TRY(quant_ctx(c, err));
        MS_TRY(ms_cuda_quant_linear(c->quant, x->data, n, x->stride[0], &q, y->data, y->stride[0],
                                    acc, err));
    } else if (w->dtype == MS_DTYPE_F32) {
        MS_CUBLAS_TRY(err, cublasGemmEx(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)outd, (int)n,
                                        (int)in, &one, w->data, CUDA_R_32F, (int)w->stride[0],
                                        x->data, CUDA_R_32F, (int)x->stride[0], &zero, y->data,
                                        CUDA_R_32F, (int)y->stride[0], CUBLAS_COMPUTE_32F,
                                        CUBLAS_GEMM_DEFAULT));
    } else if (takes_gemv(c, &gp)) {
        /* decode sizes: one launch reading f32 x and the 16-bit rows (templates/misc/gemv.cuh),
           x rounded to the weight type as below, summed in another order than cuBLAS's */
        ms_kernel_spec s = ms_kernel_spec_simple(MS_KERNEL_OP_MISC, kdtype(w->dtype));
        s.act_dtype = MS_KERNEL_DTYPE_F32;
        ms_cuda_module *m;
        MS_TRY(get_module(c, &s, &m, err));
        MS_TRY(ms_cuda_gemv_launch(m, &gp, c->stream, err));
    } else {
        /* round x to the weight type, then bf16/f16 x bf16/f16 -> f32 */
        MS_TRY(ensure_device(c, &c->scratch, &c->scratch_bytes, (size_t)(n * in) * 2,
                             "linear input scratch", err));
        ms_kernel_spec s = ms_kernel_spec_simple(MS_KERNEL_OP_MISC, kdtype(w->dtype));
        s.act_dtype = MS_KERNEL_DTYPE_F32;
        ms_cuda_module *m;
        MS_TRY(get_module(c, &s, &m, err));
        ms_misc_params cp = {x->data, NULL, c->scratch, NULL, (int)n, (int)in,
                             (int)x->stride[0], 0, (int)in};
        MS_TRY(ms_cuda_misc_launch(m, 0, &cp, c->stream, err));
        MS_TRY(gemm16(c, c->scratch, n, in, w, y, acc, err));
    }
    return linear_bias(c, bias, n, outd, y, err);
}

static ms_status cu_linear(void *ctx, const ms_tensor *x, const ms_tensor *w,
                           const ms_tensor *bias, ms_tensor *y, ms_error *err) {
    return linear_to(ctx, x, w, bias, y, false, err);
}

/* Whether the bytes two 2-D tensors span (first row to the end of the last) overlap. */
static bool spans_overlap(const ms_tensor *a, const ms_tensor *b) {
    if (a == NULL || b == NULL || a->data == NULL || b->data == NULL || a->ndim != 2 ||
        b->ndim != 2 || a->shape[0] < 1 || a->shape[1] < 1 || b->shape[0] < 1 || b->shape[1] < 1)
        return false;
    const uintptr_t a0 = (uintptr_t)a->data, b0 = (uintptr_t)b->data;
    const uintptr_t a1 = a0 + (uintptr_t)(((a->shape[0] - 1) * a->stride[0] + a->shape[1]) *
                                          (int64_t)ms_dtype_size(a->dtype));
    const uintptr_t b1 = b0 + (uintptr_t)(((b->shape[0] - 1) * b->stride[0] + b->shape[1]) *
                                          (int64_t)ms_dtype_size(b->dtype));
    return a0 < b1 && b0 < a1;
}

/* backend.h linear_add: y += x W^T (+ bias) in the GEMV's / GEMM's output; tmp unwritten. */
static ms_status cu_linear_add(void *ctx, const ms_tensor *x, const ms_tensor *w,
                               const ms_tensor *bias, ms_tensor *tmp, ms_tensor *y,
                               ms_error *err) {
    (void)tmp;
    if (spans_overlap(x, y))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "linear_add: y overlaps x");
    return linear_to(ctx, x, w, bias, y, true, err);
}

/* y [n, outd] f32 += bias (f32, bf16 or f16) broadcast over the rows: the tail of every linear. */
static ms_status linear_bias(cuda_ctx *c, const ms_tensor *bias, int64_t n, int64_t outd,
                             ms_tensor *y, ms_error *err) {
    const float one = 1.f;
    if (bias != NULL && bias->dtype != MS_DTYPE_F32) {
        /* a bf16 / f16 bias (a checkpoint's q/k/v biases stored with the weights): y += bias *
           ones^T as a k = 1 GEMM over 16-bit ones, accumulated in f32 */
        MS_TRY(check_t("linear", "bias", bias, 1, 1, DT_FLOATS, err));
        if (bias->shape[0] != outd)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "linear: bias has %lld entries for %lld outputs",
                           (long long)bias->shape[0], (long long)outd);
        if (n > c->ones16_n || c->ones16_dt != bias->dtype) {
            size_t have = (size_t)c->ones16_n * sizeof(uint16_t);
            MS_TRY(ensure_device(c, (void **)&c->ones16, &have, (size_t)n * sizeof(uint16_t),
                                 "linear bias ones", err));
            uint16_t *h = ms_malloc((size_t)n * sizeof(uint16_t));
            if (h == NULL)
                return MS_FAIL(err, MS_ERR_OOM, "linear: out of memory");
            const uint16_t one16 = bias->dtype == MS_DTYPE_F16 ? 0x3C00u : 0x3F80u;
            for (int64_t i = 0; i < n; i++)
                h[i] = one16;
            cudaError_t e = cudaMemcpy(c->ones16, h, (size_t)n * sizeof(uint16_t),
                                       cudaMemcpyHostToDevice);
            ms_free(h);
            if (e != cudaSuccess)
                return MS_FAIL(err, MS_ERR_CUDA, "linear: bias ones: %s", cudaGetErrorString(e));
            c->ones16_n = n;
            c->ones16_dt = bias->dtype;
        }
        cudaDataType_t bt = bias->dtype == MS_DTYPE_F16 ? CUDA_R_16F : CUDA_R_16BF;
        MS_CUBLAS_TRY(err, cublasGemmEx(c->cublas, CUBLAS_OP_N, CUBLAS_OP_N, (int)outd, (int)n, 1,
                                        &one, bias->data, bt, (int)outd, c->ones16, bt, 1, &one,
                                        y->data, CUDA_R_32F, (int)y->stride[0],
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else if (bias != NULL) {
        MS_TRY(check_t("linear", "bias", bias, 1, 1, DT_F32, err));
        if (bias->shape[0] != outd)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "linear: bias has %lld entries for %lld outputs",
                           (long long)bias->shape[0], (long long)outd);
        if (n > c->ones_n) {
            size_t have = (size_t)c->ones_n * sizeof(float);
            MS_TRY(ensure_device(c, (void **)&c->ones, &have, (size_t)n * sizeof(float),
                                 "linear bias ones", err));
            float *h = ms_malloc((size_t)n * sizeof(float));
            if (h == NULL)
                return MS_FAIL(err, MS_ERR_OOM, "linear: out of memory");
            for (int64_t i = 0; i < n; i++)
                h[i] = 1.f;
            cudaError_t e = cudaMemcpy(c->ones, h, (size_t)n * sizeof(float), cudaMemcpyHostToDevice);
            ms_free(h);
            if (e != cudaSuccess)
                return MS_FAIL(err, MS_ERR_CUDA, "linear: bias ones: %s", cudaGetErrorString(e));
            c->ones_n = n;
        }
        /* y (col-major out x n, ld = y stride) += bias * ones^T */
        MS_CUBLAS_TRY(err, cublasSger(c->cublas, (int)outd, (int)n, &one, bias->data, 1, c->ones,
                                      1, y->data, (int)y->stride[0]));
    }
    return MS_OK;
}

static ms_status norm_launch(cuda_ctx *c, const char *op, const ms_tensor *x, ms_tensor *residual,
                             const ms_tensor *w, float eps, ms_tensor *out, ms_error *err) {
    int64_t rows, cols, xs, orows, ocols, os;
    if (!as_rows(x, &rows, &cols, &xs) || !as_rows(out, &orows, &ocols, &os))
        return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                       "%s: rows of x and out must be uniformly strided (per-head norm over "
                       "unpacked heads is not supported on CUDA yet)",
                       op);
    if (orows != rows || ocols != cols || w->shape[0] != cols)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: x [%lld, %lld], w [%lld], out [%lld, %lld]",
                       op, (long long)rows, (long long)cols, (long long)w->shape[0],
                       (long long)orows, (long long)ocols);
    if (!fits_int(rows) || !fits_int(cols) || !fits_int(xs) || !fits_int(os))
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: dimensions beyond int32", op);
    ms_kernel_spec s = ms_kernel_spec_rmsnorm(kdtype(w->dtype), residual != NULL);
    s.act_dtype = MS_KERNEL_DTYPE_F32;
    ms_cuda_module *m;
    MS_TRY(get_module(c, &s, &m, err));
    ms_rmsnorm_params p = {x->data, residual ? residual->data : NULL, w->data, out->data,
                           (int)rows, (int)cols, (int)xs, (int)os, eps, 0, NULL, 0};
    return ms_cuda_rmsnorm_launch(m, &p, c->stream, err);
}

/* Per-head RMSNorm (Qwen3 q_norm / k_norm): x, out [n, h, d] with packed heads (head stride d)
 * and any token stride, e.g. the q or k columns of a fused QKV output; w [d]. */
static ms_status norm_heads_launch(cuda_ctx *c, const ms_tensor *x, const ms_tensor *w, float eps,
                                   ms_tensor *out, ms_error *err) {
    const int64_t n = x->shape[0], h = x->shape[1], d = x->shape[2];
    if (out->shape[0] != n || out->shape[1] != h || out->shape[2] != d || w->shape[0] != d)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "rms_norm: x [%lld, %lld, %lld], w [%lld], out [%lld, %lld, %lld]",
                       (long long)n, (long long)h, (long long)d, (long long)w->shape[0],
                       (long long)out->shape[0], (long long)out->shape[1],
                       (long long)out->shape[2]);
    if ((h > 1 && (x->stride[1] != d || out->stride[1] != d)) || w->stride[0] != 1)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                       "rms_norm: per-head norm needs packed heads (head stride %lld / %lld, "
                       "head_dim %lld)",
                       (long long)x->stride[1], (long long)out->stride[1], (long long)d);
    const int64_t xs = n > 1 ? x->stride[0] : h * d, os = n > 1 ? out->stride[0] : h * d;
    if (!fits_int(n) || !fits_int(h * d) || !fits_int(xs) || !fits_int(os))
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "rms_norm: dimensions beyond int32");
    if (n == 0)
        return MS_OK;
    ms_kernel_spec s = ms_kernel_spec_rmsnorm_heads(kdtype(w->dtype), (int)d);
    s.act_dtype = MS_KERNEL_DTYPE_F32;
    ms_cuda_module *m;
    MS_TRY(get_module(c, &s, &m, err));
    ms_rmsnorm_params p;
    memset(&p, 0, sizeof p);
    p.x = x->data;
    p.weight = w->data;
    p.out = out->data;
    p.n_rows = (int)n;
    p.n_heads = (int)h;
    p.dim = (int)d;
    p.x_stride = (int)xs;
    p.out_stride = (int)os;
    p.eps = eps;
    return ms_cuda_rmsnorm_heads_launch(m, &p, c->stream, err);
}

static ms_status cu_rms_norm(void *ctx, const ms_tensor *x, const ms_tensor *w, float eps,
                             ms_tensor *out, ms_error *err) {
    MS_TRY(check_t("rms_norm", "x", x, 2, 3, DT_F32, err));
    MS_TRY(check_t("rms_norm", "w", w, 1, 1, DT_FLOATS, err));
    MS_TRY(check_t("rms_norm", "out", out, 2, 3, DT_F32, err));
    if (!(eps >= 0.0f))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "rms_norm: eps %g must be >= 0", (double)eps);
    if (x->ndim == 3 || out->ndim == 3) {
        if (x->ndim != 3 || out->ndim != 3)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "rms_norm: x has %d dims, out %d", x->ndim,
                           out->ndim);
        return norm_heads_launch(ctx, x, w, eps, out, err);
    }
    return norm_launch(ctx, "rms_norm", x, NULL, w, eps, out, err);
}

static ms_status cu_add_rms_norm(void *ctx, ms_tensor *residual, const ms_tensor *x,
                                 const ms_tensor *w, float eps, ms_tensor *out, ms_error *err) {
    MS_TRY(check_t("add_rms_norm", "residual", residual, 2, 2, DT_F32, err));
    MS_TRY(check_t("add_rms_norm", "x", x, 2, 2, DT_F32, err));
    MS_TRY(check_t("add_rms_norm", "w", w, 1, 1, DT_FLOATS, err));
    MS_TRY(check_t("add_rms_norm", "out", out, 2, 2, DT_F32, err));
    if (residual->stride[0] != residual->shape[1] || residual->shape[0] != x->shape[0] ||
        residual->shape[1] != x->shape[1])
        return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                       "add_rms_norm: residual must be packed rows shaped like x");
    return norm_launch(ctx, "add_rms_norm", x, residual, w, eps, out, err);
}

/* rms_norm_linear with the norm folded into the GEMV (misc/gemv.cuh ms_gemv_norm: x times the
   norm weights where it is rounded for the mma, the rsqrt of each x row's mean square at the
   store): no residual, the GEMV's sizes (cu_linear's takes_gemv), bf16 weights and norm weights
   (16-byte aligned). Not f16: x w is rounded before the rsqrt, and a residual stream's outliers
   times the norm weight can pass f16's 65504 where x rsqrt(..) w would not. Not the quantized
   GEMVs: the same fold ran them slower (docs/perf.md); for Q4_0 / Q8_0 / Q4_K the norm writes the
   GEMV's quantized x instead (norm_qx_linear). *done false: not taken (nothing queued). */
static ms_status norm_gemv(cuda_ctx *c, const ms_tensor *x, const ms_tensor *norm_w, float eps,
                           const ms_tensor *w, const ms_tensor *bias, ms_tensor *y, bool *done,
                           ms_error *err) {
    *done = false;
    ms_error quiet = {0};
    if (!c->fold_norm || check_t("rms_norm_linear", "x", x, 2, 2, DT_F32, &quiet) != MS_OK ||
        check_t("rms_norm_linear", "y", y, 2, 2, DT_F32, &quiet) != MS_OK ||
        check_t("rms_norm_linear", "w", w, 2, 2, DT_BF16, &quiet) != MS_OK ||
        check_t("rms_norm_linear", "norm_w", norm_w, 1, 1, DT_BF16, &quiet) != MS_OK ||
        !(eps >= 0.0f))
        return MS_OK;
    const int64_t n = x->shape[0], d = x->shape[1], outd = w->shape[0];
    if (n < 1 || norm_w->shape[0] != d || norm_w->stride[0] != 1 || w->shape[1] != d ||
        y->shape[0] != n || y->shape[1] != outd || !fits_int(n) || !fits_int(d) ||
        !fits_int(outd) || !fits_int(x->stride[0]) || !fits_int(w->stride[0]) ||
        !fits_int(y->stride[0]))
        return MS_OK;
    ms_gemv_params gp = gemv_view(x, w, y);
    gp.norm_w = norm_w->data; /* its alignment checked by ms_cuda_gemv_fits (takes_gemv) */
    gp.eps = eps;
    if (!takes_gemv(c, &gp))
        return MS_OK;
    ms_kernel_spec s = ms_kernel_spec_simple(MS_KERNEL_OP_MISC, kdtype(w->dtype));
    s.act_dtype = MS_KERNEL_DTYPE_F32;
    ms_cuda_module *m;
    MS_TRY(get_module(c, &s, &m, err));
    MS_TRY(ms_cuda_gemv_launch(m, &gp, c->stream, err));
    *done = true;
    return linear_bias(c, bias, n, outd, y, err);
}

/* RMSNorm (after the residual add when residual != NULL), then linear(h, w): without a residual
   at the GEMV's sizes and bf16 weights the norm runs inside the GEMV (norm_gemv); where the linear
   would convert h for cuBLAS (16-bit w, more rows than the GEMV takes) the norm is written once,
   in w's type, into the linear's scratch (ms_rmsnorm_bf16 / _f16: the same float rounded once,
   as the convert would) and the GEMM reads it; h is left unwritten. Everything else (f32 or
   quantized w, the GEMV's sizes, per-head norms, bad arguments: their errors) runs the norm into
   h and then linear. */
static bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* The quantized GEMV's input from the kernel that computes it: where linear(h, w) over a Q4_0 /
   Q8_0 / Q4_K weight runs the GEMV at h's rows (ms_cuda_quant_reads_qx), that GEMV reads h quantized per
   32 values (templates/common/q8x.cuh), which ms_cuda_quant_linear makes from the float h in a
   launch of its own (ms_qquant_x). qx_target says whether w and y [n, w rows] take that path for
   n rows of `in` values and, if so, gives the weight's view and the workspace to write (*take
   false: not taken, nothing queued). The producer then writes the bytes ms_qquant_x would give
   for its float result and qx_linear runs the GEMV: y, its bias, the bits of the unfused path. */
static ms_status qx_target(cuda_ctx *c, int64_t n, int64_t in, const ms_tensor *w, const ms_tensor *y,
                           ms_cuda_qweight *qw, ms_cuda_qx *qx, bool *take, ms_error *err) {
    *take = false;
    ms_error quiet = {0};
    if (!c->qx_fuse || !ms_dtype_is_quant(w->dtype) || check_t("linear", "y", y, 2, 2, DT_F32, &quiet) != MS_OK ||
        qview("linear", w, qw, &quiet) != MS_OK || !ms_cuda_quant_reads_qx(qw, n) || in % 32 != 0 ||
        w->shape[1] != in || y->shape[0] != n || y->shape[1] != w->shape[0] || !fits_int(in) ||
        !fits_int(w->shape[0]) || !fits_int(y->stride[0]))
        return MS_OK;
    MS_TRY(quant_ctx(c, err));
    MS_TRY(ms_cuda_quant_qx(c->quant, n, in, qx, err));
    *take = true;
    return MS_OK;
}

static ms_status qx_linear(cuda_ctx *c, const ms_cuda_qx *qx, int64_t n, const ms_cuda_qweight *qw,
                           const ms_tensor *w, const ms_tensor *bias, ms_tensor *y, bool acc, ms_error *err) {
    MS_TRY(ms_cuda_quant_linear_qx(c->quant, qx, n, qw, y->data, y->stride[0], acc, err));
    return linear_bias(c, bias, n, w->shape[0], y, err);
}

/* rms_norm_linear over a Q4_0 / Q8_0 / Q4_K weight at the GEMV's rows: the norm (with its
   residual add) writes x quantized for the GEMV (ms_rmsnorm_q8), h is left unwritten (backend.h
   allows it; h is not checked here either). *done false: not taken. */
static ms_status norm_qx_linear(cuda_ctx *c, ms_tensor *residual, const ms_tensor *x, const ms_tensor *norm_w,
                                float eps, const ms_tensor *w, const ms_tensor *bias, ms_tensor *y, bool *done,
                                ms_error *err) {
    *done = false;
    ms_error quiet = {0};
    if (check_t("rms_norm_linear", "x", x, 2, 2, DT_F32, &quiet) != MS_OK ||
        check_t("rms_norm_linear", "norm_w", norm_w, 1, 1, DT_FLOATS, &quiet) != MS_OK || !(eps >= 0.0f) ||
        (residual != NULL && check_t("rms_norm_linear", "residual", residual, 2, 2, DT_F32, &quiet) != MS_OK))
        return MS_OK;
    const int64_t n = x->shape[0], d = x->shape[1];
    if (norm_w->shape[0] != d || !fits_int(n) || !fits_int(x->stride[0]) || x->stride[0] % 4 != 0 ||
        !aligned16(x->data) || !aligned16(norm_w->data) ||
        (residual != NULL && (residual->shape[0] != n || residual->shape[1] != d || residual->stride[0] != d ||
                              !aligned16(residual->data))))
        return MS_OK;
    ms_cuda_qweight qw;
    ms_cuda_qx qx;
    bool take;
    MS_TRY(qx_target(c, n, d, w, y, &qw, &qx, &take, err));
    if (!take)
        return MS_OK;
    ms_kernel_spec s = ms_kernel_spec_rmsnorm(kdtype(norm_w->dtype), residual != NULL);
    s.act_dtype = MS_KERNEL_DTYPE_F32;
    ms_cuda_module *m;
    MS_TRY(get_module(c, &s, &m, err));
    ms_rmsnorm_params p = {x->data, residual ? residual->data : NULL, norm_w->data, qx.q, (int)n, (int)d,
                           (int)x->stride[0], (int)qx.q_stride, eps, 0, qx.d, (int)qx.d_stride};
    MS_TRY(ms_cuda_rmsnorm_q8_launch(m, &p, c->stream, err));
    *done = true;
    return qx_linear(c, &qx, n, &qw, w, bias, y, false, err);
}

static ms_status cu_rms_norm_linear(void *ctx, ms_tensor *residual, const ms_tensor *x,
                                    const ms_tensor *norm_w, float eps, ms_tensor *h,
                                    const ms_tensor *w, const ms_tensor *bias, ms_tensor *y,
                                    ms_error *err) {
    cuda_ctx *c = ctx;
    ms_error quiet = {0};
    if (residual == NULL) {
        bool done;
        MS_TRY(norm_gemv(c, x, norm_w, eps, w, bias, y, &done, err));
        if (done)
            return MS_OK;
    }
    {
        bool done;
        MS_TRY(norm_qx_linear(c, residual, x, norm_w, eps, w, bias, y, &done, err));
        if (done)
            return MS_OK;
    }
    bool fused = check_t("rms_norm_linear", "x", x, 2, 2, DT_F32, &quiet) == MS_OK &&
                 check_t("rms_norm_linear", "norm_w", norm_w, 1, 1, DT_FLOATS, &quiet) == MS_OK &&
                 check_t("rms_norm_linear", "h", h, 2, 2, DT_F32, &quiet) == MS_OK &&
                 check_t("rms_norm_linear", "w", w, 2, 2, DT_FLOATS, &quiet) == MS_OK &&
                 check_t("rms_norm_linear", "y", y, 2, 2, DT_F32, &quiet) == MS_OK &&
                 (residual == NULL ||
                  check_t("rms_norm_linear", "residual", residual, 2, 2, DT_F32, &quiet) == MS_OK) &&
                 w->dtype != MS_DTYPE_F32 && eps >= 0.0f;
    if (fused) {
        const int64_t n = x->shape[0], d = x->shape[1], outd = w->shape[0];
        fused = n > 0 && norm_w->shape[0] == d && w->shape[1] == d && y->shape[0] == n &&
                y->shape[1] == outd && h->shape[0] == n && h->shape[1] == d &&
                (residual == NULL || (residual->shape[0] == n && residual->shape[1] == d &&
                                      residual->stride[0] == d)) &&
                fits_int(n) && fits_int(d) && fits_int(outd) && fits_int(x->stride[0]) &&
                fits_int(w->stride[0]) && fits_int(y->stride[0]) && fits_int(n * d);
        const ms_gemv_params gp = gemv_view(h, w, y);
        if (fused && takes_gemv(c, &gp))
            fused = false; /* the GEMV reads the float norm itself */
    }
    if (fused) {
        const int64_t n = x->shape[0], d = x->shape[1];
        MS_TRY(ensure_device(c, &c->scratch, &c->scratch_bytes, (size_t)(n * d) * 2,
                             "linear input scratch", err));
        ms_kernel_spec s = ms_kernel_spec_rmsnorm(kdtype(norm_w->dtype), residual != NULL);
        s.act_dtype = MS_KERNEL_DTYPE_F32;
        ms_cuda_module *m;
        MS_TRY(get_module(c, &s, &m, err));
        ms_rmsnorm_params p = {x->data, residual ? residual->data : NULL, norm_w->data,
                               c->scratch, (int)n, (int)d, (int)x->stride[0], (int)d, eps, 0, NULL, 0};
        MS_TRY(ms_cuda_rmsnorm_to_launch(m, &p, kdtype(w->dtype), c->stream, err));
        MS_TRY(gemm16(c, c->scratch, n, d, w, y, false, err));
        return linear_bias(c, bias, n, w->shape[0], y, err);
    }
    if (residual != NULL)
        MS_TRY(cu_add_rms_norm(ctx, residual, x, norm_w, eps, h, err));
    else
        MS_TRY(cu_rms_norm(ctx, x, norm_w, eps, h, err));
    return cu_linear(ctx, h, w, bias, y, err);
}

/* RoPE and/or KV write through the rope_kv template. kv NULL: rope in place only. */
static ms_status rope_kv_common(cuda_ctx *c, const char *op, ms_tensor *q, ms_tensor *k,
                                const ms_tensor *v, const ms_tensor *pos,
                                const ms_rope_table *rope, const ms_paged_kv *kv, int32_t layer,
                                const ms_attn_batch *batch, ms_error *err) {
    int hd = 0;
    int64_t n = 0;
    if (q != NULL) {
        MS_TRY(check_t(op, "q", q, 3, 3, DT_F32, err));
        hd = (int)q->shape[2];
        n = q->shape[0];
    }
    if (k != NULL) {
        MS_TRY(check_t(op, "k", k, 3, 3, DT_F32, err));
        hd = (int)k->shape[2];
        n = k->shape[0];
    }
    if (kv != NULL) {
        MS_TRY(check_t(op, "v", v, 3, 3, DT_F32, err));
        if (k == NULL || kv->head_dim != hd || k->shape[1] != kv->n_kv_heads ||
            v->shape[0] != n || v->shape[1] != kv->n_kv_heads || v->shape[2] != hd ||
            n != batch->n_tokens)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "%s: k/v must be [n_tokens %d, kv heads %d, head_dim %d]", op,
                           batch->n_tokens, kv->n_kv_heads, kv->head_dim);
        if (kv->dtype != MS_DTYPE_BF16 && kv->dtype != MS_DTYPE_F16)
            return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: KV arena dtype %s (bf16 or f16)", op,
                           ms_dtype_str(kv->dtype));
        if (layer < 0 || layer >= kv->n_layers)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: layer %d of %d", op, layer, kv->n_layers);
    }
    if ((q != NULL && q->stride[1] != hd) || (k != NULL && k->stride[1] != hd) ||
        (v != NULL && kv != NULL && v->stride[1] != hd) || (q != NULL && q->shape[0] != n))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: heads must be packed (head stride = head_dim)",
                       op);
    const bool mrope = rope != NULL && rope->n_sections > 0;
    if (rope != NULL) {
        if (rope->inv_freq == NULL)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: rope table missing", op);
        if (rope->n_sections < 0 || rope->n_sections > MS_ROPE_MAX_SECTIONS)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: %d M-RoPE sections, at most %d", op,
                           rope->n_sections, MS_ROPE_MAX_SECTIONS);
        if (rope->rotary_dim <= 0 || rope->rotary_dim % 2 != 0 || rope->rotary_dim > hd)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "%s: rotary_dim %d must be even and in (0, head_dim %d]", op,
                           rope->rotary_dim, hd);
        if (mrope) {
            int32_t sum = 0;
            for (int32_t i = 0; i < rope->n_sections; i++) {
                if (rope->sections[i] < 0)
                    return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: M-RoPE section %d is negative",
                                   op, i);
                sum += rope->sections[i];
            }
            if (sum != rope->rotary_dim / 2)
                return MS_FAIL(err, MS_ERR_INVALID_ARG,
                               "%s: M-RoPE sections sum to %d pairs, rotary_dim %d has %d", op,
                               sum, rope->rotary_dim, rope->rotary_dim / 2);
        }
        MS_TRY(check_t(op, "pos", pos, 1, 2, DT_I32, err));
        bool pos_ok = mrope ? pos->ndim == 2 && pos->shape[0] == rope->n_sections &&
                                  pos->shape[1] == n && fits_int(pos->stride[0])
                            : pos->ndim == 1 && pos->shape[0] == n;
        if (!pos_ok) {
            char sp[64];
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: pos %s must be [%s%lld] for %lld tokens",
                           op, ms_tensor_shape_str(pos, sp, sizeof sp),
                           mrope ? "n_sections, " : "", (long long)n, (long long)n);
        }
    }
    if (n == 0)
        return MS_OK;
    ms_kernel_rope style = MS_KERNEL_ROPE_NONE;
    if (rope != NULL)
        style = rope->style == MS_ROPE_INTERLEAVED ? MS_KERNEL_ROPE_INTERLEAVED : MS_KERNEL_ROPE_NEOX;
    ms_kernel_dtype kvt = kv != NULL ? kdtype(kv->dtype) : MS_KERNEL_DTYPE_BF16;
    const int ps = kv != NULL ? kv->page_size : 16;
    ms_kernel_spec s = mrope ? ms_kernel_spec_rope_kv_mrope(kvt, hd, ps, style)
                             : ms_kernel_spec_rope_kv(kvt, hd, ps, style,
                                                      MS_KERNEL_ROPE_SCALING_NONE);
    s.act_dtype = MS_KERNEL_DTYPE_F32;
    ms_cuda_module *m;
    MS_TRY(get_module(c, &s, &m, err));
    ms_rope_kv_params p;
    memset(&p, 0, sizeof p);
    p.q = q != NULL ? q->data : NULL;
    p.k = k != NULL ? k->data : NULL;
    p.v = v != NULL && kv != NULL ? v->data : NULL;
    if (kv != NULL) {
        size_t layer_elems = (size_t)kv->n_pages * 2 * (size_t)kv->page_size *
                             (size_t)kv->n_kv_heads * (size_t)kv->head_dim;
        p.kv = (char *)kv->data + (size_t)layer * layer_elems * ms_dtype_size(kv->dtype);
        p.token_to_page = batch->token_to_page;
        p.token_to_slot = batch->token_to_slot;
        p.v_stride = (int)v->stride[0];
    }
    p.pos = rope != NULL ? pos->data : NULL;
    p.n_tokens = (int)n;
    p.n_q_heads = q != NULL ? (int)q->shape[1] : 0;
    p.n_kv_heads = k != NULL ? (int)k->shape[1] : 0;
    p.q_stride = q != NULL ? (int)q->stride[0] : 0;
    p.k_stride = k != NULL ? (int)k->stride[0] : 0;
    if (rope != NULL) {
        p.inv_freq = rope->inv_freq;
        p.rotary_dim = rope->rotary_dim;
        p.attn_scaling = rope->attention_scaling;
    }
    if (mrope) {
        _Static_assert(MS_ROPE_MAX_SECTIONS == MS_ROPE_KV_MAX_SECTIONS,
                       "host and kernel M-RoPE section limits differ");
        p.n_sections = rope->n_sections;
        for (int32_t i = 0; i < rope->n_sections; i++)
            p.sections[i] = rope->sections[i];
        p.pos_stride = (int)pos->stride[0];
    }
    return ms_cuda_rope_kv_launch(m, &p, c->stream, err);
}

static ms_status cu_rope(void *ctx, ms_tensor *q, ms_tensor *k, const ms_tensor *pos,
                         const ms_rope_table *rope, ms_error *err) {
    if (rope == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "rope: table missing");
    return rope_kv_common(ctx, "rope", q, k, NULL, pos, rope, NULL, 0, NULL, err);
}

static ms_status cu_kv_write(void *ctx, const ms_paged_kv *kv, int32_t layer, const ms_tensor *k,
                             const ms_tensor *v, const ms_attn_batch *batch, ms_error *err) {
    return rope_kv_common(ctx, "kv_write", NULL, (ms_tensor *)k, v, NULL, NULL, kv, layer, batch,
                          err);
}

static ms_status cu_rope_kv_write(void *ctx, ms_tensor *q, ms_tensor *k, const ms_tensor *v,
                                  const ms_tensor *pos, const ms_rope_table *rope,
                                  const ms_paged_kv *kv, int32_t layer,
                                  const ms_attn_batch *batch, ms_error *err) {
    if (rope == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "rope_kv_write: table missing");
    return rope_kv_common(ctx, "rope_kv_write", q, k, v, pos, rope, kv, layer, batch, err);
}

/* Dense attention (backend.h attention_dense): the attn_dense instance for q's head_dim over
 * float32 rows; the segment offsets are the dense batch's device buffer (staged by
 * ms_dense_batch_stage; their values are checked there, on the host). */
static ms_status cu_attention_dense(void *ctx, const ms_tensor *q, const ms_tensor *k,
                                    const ms_tensor *v, const ms_dense_batch *db,
                                    const ms_attn_params *ap, ms_tensor *out, ms_error *err) {
    cuda_ctx *c = ctx;
    static const char *op = "attention_dense";
    MS_TRY(check_t(op, "q", q, 3, 3, DT_F32, err));
    MS_TRY(check_t(op, "k", k, 3, 3, DT_F32, err));
    MS_TRY(check_t(op, "v", v, 3, 3, DT_F32, err));
    MS_TRY(check_t(op, "out", out, 3, 3, DT_F32, err));
    if (db == NULL || db->indptr == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: dense batch missing", op);
    if (ap == NULL || !(ap->scale > 0.0f) || ap->causal || ap->window != 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: params missing or bad (scale > 0, not "
                       "causal, no window: dense attention sees its whole segment)", op);
    const int64_t n = q->shape[0], hq = q->shape[1], hd = q->shape[2], hkv = k->shape[1];
    if (n != db->n_tokens || k->shape[0] != n || v->shape[0] != n || out->shape[0] != n ||
        out->shape[1] != hq || out->shape[2] != hd || v->shape[1] != hkv || k->shape[2] != hd ||
        v->shape[2] != hd || hq % hkv != 0 || (hq > 1 && q->stride[1] != hd) ||
        (hq > 1 && out->stride[1] != hd) || (hkv > 1 && (k->stride[1] != hd || v->stride[1] != hd)))
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "%s: q/out [n_tokens %d, hq, d] and k/v [n_tokens, hkv, d] with hq a "
                       "multiple of hkv and packed heads (got q [%lld, %lld, %lld], k [%lld, "
                       "%lld, %lld])", op, (int)db->n_tokens, (long long)n, (long long)hq,
                       (long long)hd, (long long)k->shape[0], (long long)hkv,
                       (long long)k->shape[2]);
    if (out->data == q->data || out->data == k->data || out->data == v->data)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: out may not alias q, k or v", op);
    const int64_t qs = n > 1 ? q->stride[0] : hq * hd, os = n > 1 ? out->stride[0] : hq * hd;
    const int64_t ks = n > 1 ? k->stride[0] : hkv * hd, vs = n > 1 ? v->stride[0] : hkv * hd;
    if (!fits_int(n) || !fits_int(qs) || !fits_int(os) || !fits_int(ks) || !fits_int(vs))
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: dimensions beyond int32", op);
    ms_kernel_spec s = ms_kernel_spec_attn_dense((int)hd);
    ms_cuda_module *m;
    MS_TRY(get_module(c, &s, &m, err));
    ms_attn_dense_params p;
    memset(&p, 0, sizeof p);
    p.q = q->data;
    p.k = k->data;
    p.v = v->data;
    p.o = out->data;
    p.indptr = db->indptr;
    p.n_seqs = db->n_seqs;
    p.n_tokens = (int)n;
    p.n_q_heads = (int)hq;
    p.n_kv_heads = (int)hkv;
    p.q_stride = (int)qs;
    p.k_stride = (int)ks;
    p.v_stride = (int)vs;
    p.o_stride = (int)os;
    p.scale = ap->scale;
    return ms_cuda_attn_dense_launch(m, &p, c->stream, err);
}

static ms_status cu_attention(void *ctx, const ms_tensor *q, const ms_paged_kv *kv, int32_t layer,
                              const ms_attn_batch *batch, const ms_attn_params *ap,
                              ms_tensor *out, ms_error *err) {
    cuda_ctx *c = ctx;
    MS_TRY(check_t("attention", "q", q, 3, 3, DT_F32, err));
    MS_TRY(check_t("attention", "out", out, 3, 3, DT_F32, err));
    const int64_t n = q->shape[0], hq = q->shape[1], hd = q->shape[2];
    if (hd != kv->head_dim || n != batch->n_tokens || out->shape[0] != n || out->shape[1] != hq ||
        out->shape[2] != hd || hq % kv->n_kv_heads != 0 || q->stride[1] != hd ||
        out->stride[1] != hd)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "attention: q and out must be [n_tokens %d, hq, head_dim %d] with hq a "
                       "multiple of %d KV heads and packed heads",
                       batch->n_tokens, kv->head_dim, kv->n_kv_heads);
    if (layer < 0 || layer >= kv->n_layers)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "attention: layer %d of %d", layer, kv->n_layers);
    if (kv->dtype != MS_DTYPE_BF16 && kv->dtype != MS_DTYPE_F16)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "attention: KV arena dtype %s (bf16 or f16)",
                       ms_dtype_str(kv->dtype));
    if (n == 0)
        return MS_OK;
    const cuda_batch *cb = batch->impl;
    if (!cb->planned || cb->plan_hq != (int32_t)hq || cb->plan_causal != ap->causal ||
        cb->plan_window != ap->window)
        return MS_FAIL(err, MS_ERR_STATE,
                       "attention: the staged batch was not planned for %d query heads, %s mask, "
                       "window %d (call attn_batch_plan once per step after attn_batch_stage)",
                       (int)hq, ap->causal ? "causal" : "bidirectional", (int)ap->window);
    ms_attn_kernel_params p;
    memset(&p, 0, sizeof p);
    size_t layer_elems = (size_t)kv->n_pages * 2 * (size_t)kv->page_size * (size_t)kv->n_kv_heads *
                         (size_t)kv->head_dim;
    p.q = q->data;
    p.o = out->data;
    p.kv = (char *)kv->data + (size_t)layer * layer_elems * ms_dtype_size(kv->dtype);
    p.qo_indptr = batch->qo_indptr;
    p.kv_indptr = batch->kv_indptr;
    p.kv_indices = batch->kv_indices;
    p.kv_last_page_len = batch->kv_last_page_len;
    p.kv_start = batch->kv_start;
    p.batch = batch->n_seqs;
    p.n_q_heads = (int)hq;
    p.n_kv_heads = kv->n_kv_heads;
    p.q_stride = (int)q->stride[0];
    p.o_stride = (int)out->stride[0];
    p.window = ap->window;
    p.sm_scale = ap->scale;
    p.n_splits = cb->plan_splits;
    p.pages_per_split = cb->plan_pages_per_split;
    if (batch->is_decode) {
        if (p.n_splits > 1) {
            size_t rows = (size_t)batch->n_seqs * (size_t)p.n_splits * (size_t)hq;
            p.part_o = cb->part;
            p.part_lse = cb->part + rows * (size_t)hd;
            p.split_counter = cb->split_counter;
        }
        return ms_cuda_attn_decode_launch(cb->plan_mod, &p, c->stream, err);
    }
    p.tile_req = cb->tile_dev;
    p.tile_idx = cb->tile_dev + cb->max_tiles;
    return ms_cuda_attn_prefill_launch(cb->plan_mod, &p, cb->plan_tiles, c->stream, err);
}

static ms_status cu_silu_mul(void *ctx, const ms_tensor *gate, const ms_tensor *up,
                             ms_tensor *out, ms_error *err) {
    cuda_ctx *c = ctx;
    MS_TRY(check_t("silu_mul", "gate", gate, 2, 2, DT_F32, err));
    MS_TRY(check_t("silu_mul", "up", up, 2, 2, DT_F32, err));
    MS_TRY(check_t("silu_mul", "out", out, 2, 2, DT_F32, err));
    if (up->shape[0] != gate->shape[0] || up->shape[1] != gate->shape[1] ||
        out->shape[0] != gate->shape[0] || out->shape[1] != gate->shape[1])
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "silu_mul: gate, up and out shapes differ");
    if (!fits_int(gate->shape[0]) || !fits_int(gate->shape[1]))
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "silu_mul: dimensions beyond int32");
    ms_kernel_spec s = ms_kernel_spec_simple(MS_KERNEL_OP_SILU_MUL, MS_KERNEL_DTYPE_F32);
    ms_cuda_module *m;
    MS_TRY(get_module(c, &s, &m, err));
    ms_silu_mul_params p = {gate->data, up->data, out->data, (int)gate->shape[0],
                            (int)gate->shape[1], (int)gate->stride[0], (int)up->stride[0],
                            (int)out->stride[0], NULL, 0};
    return ms_cuda_silu_mul_launch(m, &p, c->stream, err);
}

/* linear(silu(gate) * up, w): where the linear would convert its input for cuBLAS (16-bit w, more
   rows than the GEMV takes) the product is written once, in w's type, into the linear's scratch
   (misc module's silu_mul_to: the same bits as silu_mul then convert) and the GEMM reads it; tmp
   is left unwritten. Everything else (f32 or quantized w, the GEMV's sizes, shapes the vector
   kernel refuses, bad arguments: their errors) is silu_mul into tmp and then linear. */
static ms_status silu_mul_linear_to(cuda_ctx *c, const ms_tensor *gate, const ms_tensor *up,
                                    ms_tensor *tmp, const ms_tensor *w, const ms_tensor *bias,
                                    ms_tensor *y, bool acc, ms_error *err) {
    void *ctx = c;
    ms_error quiet = {0};
    if (check_t("silu_mul_linear", "gate", gate, 2, 2, DT_F32, &quiet) == MS_OK &&
        check_t("silu_mul_linear", "up", up, 2, 2, DT_F32, &quiet) == MS_OK) {
        /* a Q4_0 / Q8_0 / Q4_K GEMV: the product written quantized for it (ms_silu_mul_q8), tmp unwritten */
        const int64_t n = gate->shape[0], f = gate->shape[1];
        ms_cuda_qweight qw;
        ms_cuda_qx qx;
        bool take = false;
        if (up->shape[0] == n && up->shape[1] == f && fits_int(n) && fits_int(gate->stride[0]) &&
            fits_int(up->stride[0]) && gate->stride[0] % 4 == 0 && up->stride[0] % 4 == 0 &&
            aligned16(gate->data) && aligned16(up->data))
            MS_TRY(qx_target(c, n, f, w, y, &qw, &qx, &take, err));
        if (take) {
            ms_kernel_spec s = ms_kernel_spec_simple(MS_KERNEL_OP_SILU_MUL, MS_KERNEL_DTYPE_F32);
            ms_cuda_module *m;
            MS_TRY(get_module(c, &s, &m, err));
            ms_silu_mul_params sp = {gate->data, up->data, qx.q, (int)n, (int)f, (int)gate->stride[0],
                                     (int)up->stride[0], (int)qx.q_stride, qx.d, (int)qx.d_stride};
            MS_TRY(ms_cuda_silu_mul_q8_launch(m, &sp, c->stream, err));
            return qx_linear(c, &qx, n, &qw, w, bias, y, acc, err);
        }
    }
    bool fused = check_t("silu_mul_linear", "gate", gate, 2, 2, DT_F32, &quiet) == MS_OK &&
                 check_t("silu_mul_linear", "up", up, 2, 2, DT_F32, &quiet) == MS_OK &&
                 check_t("silu_mul_linear", "w", w, 2, 2, DT_FLOATS, &quiet) == MS_OK &&
                 check_t("silu_mul_linear", "y", y, 2, 2, DT_F32, &quiet) == MS_OK &&
                 check_t("silu_mul_linear", "tmp", tmp, 2, 2, DT_F32, &quiet) == MS_OK &&
                 w->dtype != MS_DTYPE_F32;
    if (fused) {
        const int64_t n = gate->shape[0], f = gate->shape[1], outd = w->shape[0];
        fused = n > 0 && up->shape[0] == n && up->shape[1] == f && w->shape[1] == f &&
                tmp->shape[0] == n && tmp->shape[1] == f && fits_int(tmp->stride[0]) &&
                y->shape[0] == n && y->shape[1] == outd && fits_int(n) && fits_int(f) &&
                fits_int(outd) && fits_int(gate->stride[0]) && fits_int(up->stride[0]) &&
                fits_int(w->stride[0]) && fits_int(y->stride[0]) && fits_int(n * f);
        /* as cu_linear would decide for linear(tmp, w) (the unfused path's input) */
        const ms_gemv_params gp = gemv_view(tmp, w, y);
        if (fused && takes_gemv(c, &gp))
            fused = false; /* the GEMV reads the float product itself */
    }
    if (fused) {
        const int64_t n = gate->shape[0], f = gate->shape[1];
        ms_silu_mul_params sp = {gate->data, up->data, NULL, (int)n, (int)f,
                                 (int)gate->stride[0], (int)up->stride[0], (int)f, NULL, 0};
        MS_TRY(ensure_device(c, &c->scratch, &c->scratch_bytes, (size_t)(n * f) * 2,
                             "linear input scratch", err));
        sp.out = c->scratch;
        if (ms_cuda_silu_mul_to_fits(&sp)) {
            ms_kernel_spec s = ms_kernel_spec_simple(MS_KERNEL_OP_MISC, kdtype(w->dtype));
            s.act_dtype = MS_KERNEL_DTYPE_F32;
            ms_cuda_module *m;
            MS_TRY(get_module(c, &s, &m, err));
            MS_TRY(ms_cuda_silu_mul_to_launch(m, &sp, c->stream, err));
            MS_TRY(gemm16(c, c->scratch, n, f, w, y, acc, err));
            return linear_bias(c, bias, n, w->shape[0], y, err);
        }
    }
    MS_TRY(cu_silu_mul(ctx, gate, up, tmp, err));
    return linear_to(c, tmp, w, bias, y, acc, err);
}

static ms_status cu_silu_mul_linear(void *ctx, const ms_tensor *gate, const ms_tensor *up,
                                    ms_tensor *tmp, const ms_tensor *w, const ms_tensor *bias,
                                    ms_tensor *y, ms_error *err) {
    return silu_mul_linear_to(ctx, gate, up, tmp, w, bias, y, false, err);
}

/* backend.h silu_mul_linear_add: y += linear(silu(gate) * up, w, bias), the add in the GEMV's /
   GEMM's output; tmp unwritten (prod as silu_mul_linear's tmp). */
static ms_status cu_silu_mul_linear_add(void *ctx, const ms_tensor *gate, const ms_tensor *up,
                                        ms_tensor *prod, const ms_tensor *w, const ms_tensor *bias,
                                        ms_tensor *tmp, ms_tensor *y, ms_error *err) {
    (void)tmp;
    /* gate and up may be y (x = x + linear(silu(x) * h, w)): the product is complete, in prod or
       the GEMM's scratch, before the linear writes y; the linear's own input may not */
    if (spans_overlap(prod, y))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "silu_mul_linear_add: y overlaps the product");
    return silu_mul_linear_to(ctx, gate, up, prod, w, bias, y, true, err);
}

static ms_status cu_add(void *ctx, const ms_tensor *a, const ms_tensor *b, ms_tensor *out,
                        ms_error *err) {
    cuda_ctx *c = ctx;
    MS_TRY(check_t("add", "a", a, 2, 2, DT_F32, err));
    MS_TRY(check_t("add", "b", b, 2, 2, DT_F32, err));
    MS_TRY(check_t("add", "out", out, 2, 2, DT_F32, err));
    if (a->shape[0] != b->shape[0] || a->shape[1] != b->shape[1] ||
        out->shape[0] != a->shape[0] || out->shape[1] != a->shape[1])
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "add: a, b and out shapes differ");
    ms_cuda_module *m;
    MS_TRY(misc_module(c, &m, err));
    ms_misc_params p = {a->data, b->data, out->data, NULL, (int)a->shape[0], (int)a->shape[1],
                        (int)a->stride[0], (int)b->stride[0], (int)out->stride[0]};
    return ms_cuda_misc_launch(m, 1, &p, c->stream, err);
}

static ms_status cu_gather_rows(void *ctx, const ms_tensor *x, const ms_tensor *rows,
                                ms_tensor *out, ms_error *err) {
    cuda_ctx *c = ctx;
    MS_TRY(check_t("gather_rows", "x", x, 2, 2, DT_F32, err));
    MS_TRY(check_t("gather_rows", "rows", rows, 1, 1, DT_I32, err));
    MS_TRY(check_t("gather_rows", "out", out, 2, 2, DT_F32, err));
    if (out->shape[0] != rows->shape[0] || out->shape[1] != x->shape[1])
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "gather_rows: out must be [rows, %lld]",
                       (long long)x->shape[1]);
    ms_cuda_module *m;
    MS_TRY(misc_module(c, &m, err));
    ms_misc_params p = {x->data, NULL, out->data, rows->data, (int)out->shape[0],
                        (int)out->shape[1], (int)x->stride[0], 0, (int)out->stride[0]};
    return ms_cuda_misc_launch(m, 2, &p, c->stream, err);
}

static ms_status cu_select_rows(void *ctx, const ms_tensor *key, const ms_tensor *a,
                                const ms_tensor *b, ms_tensor *out, ms_error *err) {
    cuda_ctx *c = ctx;
    MS_TRY(check_t("select_rows", "key", key, 1, 1, DT_I32, err));
    MS_TRY(check_t("select_rows", "a", a, 2, 2, DT_F32, err));
    MS_TRY(check_t("select_rows", "b", b, 2, 2, DT_F32, err));
    MS_TRY(check_t("select_rows", "out", out, 2, 2, DT_F32, err));
    if (a->shape[0] != out->shape[0] || a->shape[1] != out->shape[1] ||
        b->shape[0] != out->shape[0] || b->shape[1] != out->shape[1] ||
        key->shape[0] != out->shape[0] || key->stride[0] != 1)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "select_rows: a, b, key (contiguous) and out "
                       "shapes differ");
    ms_cuda_module *m;
    MS_TRY(misc_module(c, &m, err));
    ms_misc_params p = {a->data, b->data, out->data, key->data, (int)out->shape[0],
                        (int)out->shape[1], (int)a->stride[0], (int)b->stride[0],
                        (int)out->stride[0]};
    return ms_cuda_misc_launch(m, MS_CUDA_MISC_SELECT_ROWS, &p, c->stream, err);
}

/* ---- encoder ops (Whisper): LayerNorm, GELU, conv1d; kernels of the misc module ---- */

/*
 * The misc instance the encoder ops launch for weights of dtype wdt: 16-bit weights need the
 * instance of their dtype (its T entries); float weights (the _f32 entries) and weight-free ops
 * take any misc instance already loaded (every model's kernel list has one, of its dtype), else
 * the bf16 one, as the residual add does.
 */
static ms_status encoder_module(cuda_ctx *c, ms_dtype wdt, ms_cuda_module **m, ms_error *err) {
    if (wdt == MS_DTYPE_BF16 || wdt == MS_DTYPE_F16) {
        ms_kernel_spec s = ms_kernel_spec_simple(MS_KERNEL_OP_MISC, kdtype(wdt));
        s.act_dtype = MS_KERNEL_DTYPE_F32;
        return get_module(c, &s, m, err);
    }
    for (int i = 0; i < c->n_mods; i++)
        if (c->mods[i]->spec.op == MS_KERNEL_OP_MISC &&
            c->mods[i]->spec.act_dtype == MS_KERNEL_DTYPE_F32) {
            *m = c->mods[i];
            return MS_OK;
        }
    return misc_module(c, m, err);
}

static ms_status cu_layer_norm(void *ctx, const ms_tensor *x, const ms_tensor *w,
                               const ms_tensor *b, float eps, ms_tensor *out, ms_error *err) {
    cuda_ctx *c = ctx;
    MS_TRY(check_t("layer_norm", "x", x, 2, 2, DT_F32, err));
    MS_TRY(check_t("layer_norm", "w", w, 1, 1, DT_FLOATS, err));
    MS_TRY(check_t("layer_norm", "out", out, 2, 2, DT_F32, err));
    if (out->shape[0] != x->shape[0] || out->shape[1] != x->shape[1])
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "layer_norm: x and out shapes differ");
    if (w->shape[0] != x->shape[1])
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "layer_norm: w has %lld entries, x rows have %lld",
                       (long long)w->shape[0], (long long)x->shape[1]);
    if (b != NULL) {
        MS_TRY(check_t("layer_norm", "b", b, 1, 1, DT_FLOATS, err));
        if (b->shape[0] != x->shape[1])
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "layer_norm: b has %lld entries, x rows have %lld",
                           (long long)b->shape[0], (long long)x->shape[1]);
        if (b->dtype != w->dtype)
            return MS_FAIL(err, MS_ERR_UNSUPPORTED, "layer_norm: b is %s but w is %s (one type)",
                           ms_dtype_str(b->dtype), ms_dtype_str(w->dtype));
    }
    if (!(eps >= 0.0f))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "layer_norm: eps %g must be >= 0", (double)eps);
    if (!fits_int(x->shape[0]) || !fits_int(x->shape[1]) || !fits_int(x->stride[0]) ||
        !fits_int(out->stride[0]))
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "layer_norm: dimensions beyond int32");
    if (x->shape[0] == 0 || x->shape[1] == 0)
        return MS_OK;
    ms_cuda_module *m;
    MS_TRY(encoder_module(c, w->dtype, &m, err));
    ms_layer_norm_params p = {x->data, w->data, b != NULL ? b->data : NULL, out->data,
                              (int)x->shape[0], (int)x->shape[1], (int)x->stride[0],
                              (int)out->stride[0], eps};
    return ms_cuda_layer_norm_launch(m, w->dtype == MS_DTYPE_F32, &p, c->stream, err);
}

static ms_status cu_gelu(void *ctx, const ms_tensor *x, ms_tensor *out, ms_error *err) {
    cuda_ctx *c = ctx;
    MS_TRY(check_t("gelu", "x", x, 2, 2, DT_F32, err));
    MS_TRY(check_t("gelu", "out", out, 2, 2, DT_F32, err));
    if (out->shape[0] != x->shape[0] || out->shape[1] != x->shape[1])
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "gelu: x and out shapes differ");
    if (!fits_int(x->shape[0]) || !fits_int(x->shape[1]) || !fits_int(x->stride[0]) ||
        !fits_int(out->stride[0]))
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "gelu: dimensions beyond int32");
    ms_cuda_module *m;
    MS_TRY(encoder_module(c, MS_DTYPE_F32, &m, err));
    ms_misc_params p = {x->data, NULL, out->data, NULL, (int)x->shape[0], (int)x->shape[1],
                        (int)x->stride[0], 0, (int)out->stride[0]};
    return ms_cuda_gelu_launch(m, &p, c->stream, err);
}

/*
 * conv1d as im2col + one GEMM (like linear): the columns col [T_out, C_in * K] (index c * K + k,
 * the layout of w [C_out, C_in, K] viewed as W [C_out, C_in * K]) go to the scratch buffer,
 * rounded to the weight type for 16-bit weights (as linear rounds x); y = col W^T in f32
 * (cuBLAS), then the bias. Whisper base: [3000, 80] -> [3000, 512] (k 3) and [3000, 512] ->
 * [1500, 512] (k 3, stride 2): columns of 1.2 and 4.6 MB in f16.
 */
static ms_status cu_conv1d(void *ctx, const ms_tensor *x, const ms_tensor *w,
                           const ms_tensor *bias, int32_t stride, int32_t padding, ms_tensor *y,
                           ms_error *err) {
    cuda_ctx *c = ctx;
    MS_TRY(check_t("conv1d", "x", x, 2, 2, DT_F32, err));
    MS_TRY(check_t("conv1d", "w", w, 3, 3, DT_FLOATS, err));
    MS_TRY(check_t("conv1d", "y", y, 2, 2, DT_F32, err));
    if (w->stride[1] != w->shape[2])
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "conv1d: w must be contiguous per output channel");
    if (stride < 1 || padding < 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "conv1d: stride %d must be >= 1, padding %d >= 0",
                       stride, padding);
    const int64_t t_in = x->shape[0], c_in = x->shape[1], k = w->shape[2], c_out = w->shape[0];
    const int64_t t_out = (t_in + 2 * (int64_t)padding - k) / stride + 1;
    if (w->shape[1] != c_in || y->shape[1] != c_out || y->shape[0] != t_out ||
        t_in + 2 * (int64_t)padding < k)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "conv1d: shapes x [%lld, %lld], w [%lld, %lld, %lld], y [%lld, %lld] do "
                       "not fit (stride %d, padding %d: y must be [%lld, %lld])",
                       (long long)t_in, (long long)c_in, (long long)c_out,
                       (long long)w->shape[1], (long long)k, (long long)y->shape[0],
                       (long long)y->shape[1], stride, padding, (long long)t_out,
                       (long long)c_out);
    if (bias != NULL) {
        MS_TRY(check_t("conv1d", "bias", bias, 1, 1, DT_FLOATS, err));
        if (bias->shape[0] != c_out)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "conv1d: bias has %lld entries for %lld output channels",
                           (long long)bias->shape[0], (long long)c_out);
    }
    if (y->data == x->data)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "conv1d: y may not alias x");
    const int64_t width = c_in * k;
    if (!fits_int(t_in) || !fits_int(width) || !fits_int(c_out) || !fits_int(t_out) ||
        !fits_int(x->stride[0]) || !fits_int(w->stride[0]) || !fits_int(y->stride[0]) ||
        !fits_int(padding + t_in))
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "conv1d: dimensions beyond int32");
    if (t_out == 0 || c_out == 0)
        return MS_OK;
    const bool f32w = w->dtype == MS_DTYPE_F32;
    const size_t esz = f32w ? sizeof(float) : 2;
    MS_TRY(ensure_device(c, &c->scratch, &c->scratch_bytes, (size_t)(t_out * width) * esz,
                         "conv1d column scratch", err));
    ms_cuda_module *m;
    MS_TRY(encoder_module(c, w->dtype, &m, err));
    ms_im2col_params ip = {x->data, c->scratch, (int)t_in, (int)c_in, (int)k, stride,
                           padding, (int)t_out, (int)x->stride[0]};
    MS_TRY(ms_cuda_im2col_launch(m, f32w, &ip, c->stream, err));
    MS_CUBLAS_TRY(err, cublasSetStream(c->cublas, c->stream));
    const float one = 1.f, zero = 0.f;
    const cudaDataType_t wt = f32w ? CUDA_R_32F : w->dtype == MS_DTYPE_F16 ? CUDA_R_16F : CUDA_R_16BF;
    MS_CUBLAS_TRY(err, cublasGemmEx(c->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)c_out, (int)t_out,
                                    (int)width, &one, w->data, wt, (int)w->stride[0], c->scratch,
                                    wt, (int)width, &zero, y->data, CUDA_R_32F,
                                    (int)y->stride[0], CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (bias == NULL)
        return MS_OK;
    ms_cuda_module *bm;
    MS_TRY(encoder_module(c, bias->dtype, &bm, err));
    ms_misc_params bp = {y->data, bias->data, y->data, NULL, (int)t_out, (int)c_out,
                         (int)y->stride[0], 0, (int)y->stride[0]};
    return ms_cuda_bias_add_launch(bm, bias->dtype == MS_DTYPE_F32, &bp, c->stream, err);
}

static ms_status cu_argmax(void *ctx, const ms_tensor *logits, ms_tensor *ids, ms_error *err) {
    cuda_ctx *c = ctx;
    MS_TRY(check_t("argmax", "logits", logits, 2, 2, DT_F32, err));
    MS_TRY(check_t("argmax", "ids", ids, 1, 1, DT_I32, err));
    if (ids->shape[0] != logits->shape[0])
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "argmax: ids has %lld entries for %lld rows",
                       (long long)ids->shape[0], (long long)logits->shape[0]);
    ms_kernel_spec s = ms_kernel_spec_simple(MS_KERNEL_OP_ARGMAX, MS_KERNEL_DTYPE_F32);
    ms_cuda_module *m;
    MS_TRY(get_module(c, &s, &m, err));
    ms_argmax_params p = {logits->data, ids->data, (int)logits->shape[0], (int)logits->shape[1],
                          (int)logits->stride[0]};
    return ms_cuda_argmax_launch(m, &p, c->stream, err);
}

/* Workspace: per row temperature, top_p, uniform, top_k, min_p (5 x 4 bytes). */
static size_t cu_sample_workspace_size(void *ctx, int32_t m, int32_t vocab) {
    (void)ctx;
    (void)vocab;
    return m > 0 ? (size_t)m * 20 : 0;
}

static ms_status cu_sample(void *ctx, const ms_tensor *logits, const ms_sample_row *rows,
                           void *workspace, size_t workspace_bytes, ms_tensor *ids,
                           ms_error *err) {
    cuda_ctx *c = ctx;
    MS_TRY(check_t("sample", "logits", logits, 2, 2, DT_F32, err));
    MS_TRY(check_t("sample", "ids", ids, 1, 1, DT_I32, err));
    int64_t mrows = logits->shape[0];
    if (ids->shape[0] != mrows || !fits_int(mrows) || !fits_int(logits->shape[1]))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "sample: ids has %lld entries for %lld rows",
                       (long long)ids->shape[0], (long long)mrows);
    size_t need = cu_sample_workspace_size(ctx, (int32_t)mrows, (int32_t)logits->shape[1]);
    if (workspace == NULL || workspace_bytes < need || rows == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "sample: workspace of %zu bytes, %zu needed for %lld rows (or rows missing)",
                       workspace_bytes, need, (long long)mrows);
    if (mrows == 0)
        return MS_OK;
    float *h = ms_malloc(need);
    if (h == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "sample: out of memory");
    float *temp = h, *top_p = h + mrows, *unif = h + 2 * mrows;
    int32_t *top_k = (int32_t *)(h + 3 * mrows);
    float *min_p = h + 4 * mrows;
    for (int64_t r = 0; r < mrows; r++) {
        ms_status st = ms_sampler_check_params(&rows[r].params, err);
        if (st == MS_OK && !(rows[r].min_p >= 0.0f && rows[r].min_p <= 1.0f))
            st = MS_FAIL(err, MS_ERR_INVALID_ARG, "sampling: min_p %g must be in [0, 1]",
                         (double)rows[r].min_p);
        if (st != MS_OK) {
            ms_free(h);
            ms_error_prefix(err, "sample: row %lld: ", (long long)r);
            return st;
        }
        bool greedy = ms_sampler_is_greedy(&rows[r].params);
        temp[r] = greedy ? 0.f : rows[r].params.temperature;
        top_k[r] = rows[r].params.top_k;
        top_p[r] = rows[r].params.top_p;
        unif[r] = ms_sampler_uniform(rows[r].params.seed, rows[r].draw);
        min_p[r] = rows[r].min_p;
    }
    cudaError_t e = cudaMemcpyAsync(workspace, h, need, cudaMemcpyHostToDevice, c->stream);
    ms_free(h);
    if (e != cudaSuccess)
        return MS_FAIL(err, MS_ERR_CUDA, "sample: staging settings: %s", cudaGetErrorString(e));
    ms_kernel_spec s = ms_kernel_spec_simple(MS_KERNEL_OP_SAMPLE, MS_KERNEL_DTYPE_F32);
    ms_cuda_module *m;
    MS_TRY(get_module(c, &s, &m, err));
    float *w = workspace;
    ms_sample_params p = {logits->data, w, (const int *)(w + 3 * mrows), w + mrows, w + 2 * mrows,
                          ids->data, (int)mrows, (int)logits->shape[1], (int)logits->stride[0],
                          w + 4 * mrows};
    return ms_cuda_sample_launch(m, &p, c->stream, err);
}

/* ---- graphs ---- */

static ms_status cu_graph_capture_begin(void *ctx, ms_error *err) {
    cuda_ctx *c = ctx;
    if (c->capturing)
        return MS_FAIL(err, MS_ERR_STATE, "graph_capture_begin: a capture is already running");
    MS_CUDA_TRY(err, cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal));
    c->capturing = true;
    return MS_OK;
}

static ms_status cu_graph_capture_end(void *ctx, void **graph, ms_error *err) {
    cuda_ctx *c = ctx;
    *graph = NULL;
    cudaGraph_t g = NULL;
    c->capturing = false;
    MS_CUDA_TRY(err, cudaStreamEndCapture(c->stream, &g));
    cudaGraphExec_t ex = NULL;
    cudaError_t e = cudaGraphInstantiate(&ex, g, 0);
    cudaGraphDestroy(g);
    if (e != cudaSuccess)
        return MS_FAIL(err, MS_ERR_CUDA, "graph_capture_end: instantiate: %s",
                       cudaGetErrorString(e));
    *graph = ex;
    c->n_graphs++;
    return MS_OK;
}

static ms_status cu_graph_launch(void *ctx, void *graph, ms_error *err) {
    cuda_ctx *c = ctx;
    MS_CUDA_TRY(err, cudaGraphLaunch((cudaGraphExec_t)graph, c->stream));
    return MS_OK;
}

/* Free every retired buffer (no graph reads them any more). */
static void free_retired(cuda_ctx *c) {
    if (c->n_retired > 0 && c->stream != NULL)
        (void)cudaStreamSynchronize(c->stream); /* a launch of the last graph may still run */
    for (int i = 0; i < c->n_retired; i++)
        (void)cudaFree(c->retired[i]);
    c->n_retired = 0;
}

static void cu_graph_free(void *ctx, void *graph) {
    cuda_ctx *c = ctx;
    if (graph == NULL)
        return;
    MS_CUDA_CHECK(cudaGraphExecDestroy((cudaGraphExec_t)graph));
    if (c->n_graphs > 0 && --c->n_graphs == 0)
        free_retired(c);
}

/* ---- construction ---- */

static void cu_free(void *ctx) {
    cuda_ctx *c = ctx;
    if (c == NULL)
        return;
    if (c->stream != NULL)
        (void)cudaStreamSynchronize(c->stream);
    free_retired(c);
    ms_cuda_quant_free(c->quant);
    for (int i = 0; i < c->n_mods; i++)
        ms_cuda_module_free(c->mods[i]);
    if (c->scratch != NULL)
        (void)cudaFree(c->scratch);
    if (c->ones != NULL)
        (void)cudaFree(c->ones);
    if (c->ones16 != NULL)
        (void)cudaFree(c->ones16);
    if (c->cublas != NULL)
        (void)cublasDestroy(c->cublas);
    if (c->cublas_ws != NULL)
        (void)cudaFree(c->cublas_ws);
    if (c->stream != NULL)
        (void)cudaStreamDestroy(c->stream);
    ms_free(c->cache_dir);
    ms_free(c);
}

/* x rows up to which 16-bit weights take ms_gemv rather than convert + cuBLAS (H200, 8B decode,
 * docs/perf.md "The 16-bit decode GEMV": batch 1, 2, 4 gain 6-9%; at 8 the step lost 7% although
 * the kernels alone were even) */
#define GEMV_MAX_N 4

/* *out = the integer in environment variable `name` (dflt when unset or empty); a value that is
 * not an integer in [lo, hi] is MS_ERR_INVALID_ARG naming the variable, never ignored. */
static ms_status env_int(const char *name, int lo, int hi, int dflt, int *out, ms_error *err) {
    const char *v = getenv(name);
    *out = dflt;
    if (v == NULL || v[0] == '\0')
        return MS_OK;
    char *end;
    long n = strtol(v, &end, 10);
    if (*end != '\0' || n < lo || n > hi)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "cuda backend: %s='%s' is not an integer in %d..%d",
                       name, v, lo, hi);
    *out = (int)n;
    return MS_OK;
}

static ms_status cuda_setup(cuda_ctx *c, const ms_backend_cuda_options *opt, ms_error *err) {
    c->device = opt != NULL ? opt->device : 0;
    MS_CUDA_TRY(err, cudaSetDevice(c->device));
    MS_TRY(ms_cuda_device_arch(c->device, &c->arch, &c->n_sms, err));
    MS_CUDA_TRY(err, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    MS_CUBLAS_TRY(err, cublasCreate(&c->cublas));
    MS_CUBLAS_TRY(err, cublasSetStream(c->cublas, c->stream));
    /* a fixed workspace of the size NVIDIA recommends for Hopper (cuBLAS docs, "cuBLAS
       workspace": 32 MiB), set after the stream: GEMMs under graph capture allocate nothing */
    MS_CUDA_TRY(err, cudaMalloc(&c->cublas_ws, CUBLAS_WORKSPACE_BYTES));
    MS_CUBLAS_TRY(err, cublasSetWorkspace(c->cublas, c->cublas_ws, CUBLAS_WORKSPACE_BYTES));
    MS_TRY(env_int("MS_CUDA_GEMV", 0, MS_GEMV_MAX_COLS, GEMV_MAX_N, &c->gemv_max_n, err));
    MS_TRY(env_int("MS_CUDA_NORM_FOLD", 0, 1, 1, &c->fold_norm, err));
    MS_TRY(env_int("MS_CUDA_QX_FUSE", 0, 1, 1, &c->qx_fuse, err));
    if (opt != NULL && opt->cache_dir != NULL) {
        c->cache_dir = ms_strdup(opt->cache_dir);
        if (c->cache_dir == NULL)
            return MS_FAIL(err, MS_ERR_OOM, "cuda backend: out of memory");
    }
    return MS_OK;
}

void *ms_backend_cuda_stream(const ms_backend *be) {
    return be != NULL && be->ctx != NULL ? (void *)((cuda_ctx *)be->ctx)->stream : NULL;
}

int32_t ms_backend_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

bool ms_backend_cuda_available(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return n > 0;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Timed copies for ms_backend_cuda_copy_bandwidth; t[reps] gets milliseconds per copy. */
static ms_status copy_bw_run(cuda_ctx *c, void *dst, void *src, size_t bytes, int32_t reps,
                             cudaEvent_t e0, cudaEvent_t e1, float *t, ms_error *err) {
    MS_CUDA_TRY(err, cudaMemsetAsync(src, 1, bytes, c->stream));
    MS_CUDA_TRY(err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream));
    for (int32_t i = 0; i < reps; i++) {
        MS_CUDA_TRY(err, cudaEventRecord(e0, c->stream));
        MS_CUDA_TRY(err, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->stream));
        MS_CUDA_TRY(err, cudaEventRecord(e1, c->stream));
        MS_CUDA_TRY(err, cudaEventSynchronize(e1));
        MS_CUDA_TRY(err, cudaEventElapsedTime(&t[i], e0, e1));
    }
    return MS_OK;
}

ms_status ms_backend_cuda_copy_bandwidth(const ms_backend *be, size_t bytes, int32_t reps,
                                         double *gbps, ms_error *err) {
    MS_ASSERT(be != NULL && be->ctx != NULL && gbps != NULL);
    if (bytes < ((size_t)1 << 20) || reps < 1)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "copy bandwidth: %zu bytes x %d copies (need >= 1 MiB, >= 1 copy)", bytes,
                       (int)reps);
    cuda_ctx *c = be->ctx;
    float *t = ms_calloc((size_t)reps, sizeof *t);
    if (t == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "copy bandwidth: out of memory");
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    ms_status st = MS_OK;
    cudaError_t ce = cudaMalloc(&a, bytes);
    if (ce == cudaSuccess)
        ce = cudaMalloc(&b, bytes);
    if (ce == cudaSuccess)
        ce = cudaEventCreate(&e0);
    if (ce == cudaSuccess)
        ce = cudaEventCreate(&e1);
    if (ce != cudaSuccess)
        st = ms_cuda_record_failure(err, MS_ERR_CUDA, "CUDA", (int)ce, cudaGetErrorString(ce),
                                    "copy bandwidth buffers", c->device, __FILE__, __LINE__,
                                    __func__);
    if (st == MS_OK)
        st = copy_bw_run(c, b, a, bytes, reps, e0, e1, t, err);
    if (st == MS_OK) {
        qsort(t, (size_t)reps, sizeof *t, cmp_float);
        double ms = (double)t[reps / 2];
        *gbps = ms > 0.0 ? 2.0 * (double)bytes / (ms * 1e-3) / 1e9 : 0.0;
    }
    if (e1 != NULL)
        (void)cudaEventDestroy(e1);
    if (e0 != NULL)
        (void)cudaEventDestroy(e0);
    (void)cudaFree(b);
    (void)cudaFree(a);
    ms_free(t);
    return st;
}

ms_status ms_backend_cuda_init(ms_backend *out, const ms_backend_cuda_options *opt, ms_error *err) {
    memset(out, 0, sizeof *out);
    cuda_ctx *c = ms_calloc(1, sizeof *c);
    if (c == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "cuda backend: out of memory");
    ms_status st = cuda_setup(c, opt, err);
    if (st != MS_OK) {
        ms_error_prefix(err, "cuda backend: ");
        cu_free(c);
        return st;
    }
    ms_backend_i *f = &out->iface;
    f->name = "cuda";
    f->buffer_alloc = cu_buffer_alloc;
    f->buffer_free = cu_buffer_free;
    f->buffer_fill = cu_buffer_fill;
    f->copy_to_backend = cu_copy_to_backend;
    f->copy_to_host = cu_copy_to_host;
    f->tensor_load = cu_tensor_load;
    f->synchronize = cu_synchronize;
    f->attn_batch_init = cu_attn_batch_init;
    f->attn_batch_free = cu_attn_batch_free;
    f->attn_batch_stage = cu_attn_batch_stage;
    f->attn_batch_plan = cu_attn_batch_plan;
    f->kernels_load = cu_kernels_load;
    f->weight_dtype_ok = cu_weight_dtype_ok;
    f->embedding = cu_embedding;
    f->linear = cu_linear;
    f->rms_norm = cu_rms_norm;
    f->add_rms_norm = cu_add_rms_norm;
    f->rope = cu_rope;
    f->kv_write = cu_kv_write;
    f->rope_kv_write = cu_rope_kv_write;
    f->attention = cu_attention;
    f->attention_dense = cu_attention_dense;
    f->silu_mul = cu_silu_mul;
    f->silu_mul_linear = cu_silu_mul_linear;
    f->linear_add = cu_linear_add;
    f->silu_mul_linear_add = cu_silu_mul_linear_add;
    f->rms_norm_linear = cu_rms_norm_linear;
    f->add = cu_add;
    f->gather_rows = cu_gather_rows;
    f->select_rows = cu_select_rows;
    f->layer_norm = cu_layer_norm;
    f->gelu = cu_gelu;
    f->conv1d = cu_conv1d;
    f->argmax = cu_argmax;
    f->sample_workspace_size = cu_sample_workspace_size;
    f->sample = cu_sample;
    f->graph_capture_begin = cu_graph_capture_begin;
    f->graph_capture_end = cu_graph_capture_end;
    f->graph_launch = cu_graph_launch;
    f->graph_free = cu_graph_free;
    f->free = cu_free;
    out->ctx = c;
    return MS_OK;
}
