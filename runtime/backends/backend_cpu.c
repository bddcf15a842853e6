/*
 * backend_cpu.c - the float32 CPU backend of the op interface (backend.h).
 *
 * The reference implementation of every op and the oracle for GPU kernels. Activations are f32;
 * weights f32/bf16/f16 (converted on the fly); the KV arena f32, bf16 or f16. Work is split over
 * a pthreads pool (threadpool.h) only where it pays, and always so that each output element is
 * computed by one task with a fixed reduction order: results are bitwise independent of the
 * number of threads.
 *
 * Backend memory is host memory from ms_malloc (over-allocated and aligned to 64 bytes). Ops never
 * allocate; per-call scratch lives on the stack, bounded by MS_CPU_MAX_HEAD_DIM.
 */
#include "backend.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "threadpool.h"

/* Largest head_dim (and rotary_dim) the CPU ops accept: bounds their stack scratch. */
#define MS_CPU_MAX_HEAD_DIM 1024
/* Query heads of one GQA group processed together by one attention task. */
#define MS_CPU_ATTN_HEAD_CHUNK 8
/* Elementwise work below this many elements runs on the calling thread. */
#define MS_CPU_PAR_MIN_ELEMS 32768
/* Alignment of buffer_alloc memory. */
#define MS_CPU_ALIGN 64

typedef struct cpu_ctx {
    ms_threadpool *pool;
    int32_t n_threads;
} cpu_ctx;

/* ---- operand checks ---- */

static const char *shape_str(const ms_tensor *t, char *buf, size_t n) {
    return ms_tensor_shape_str(t, buf, n);
}

/* Common checks: non-NULL, data set, ndim in [lo, hi], dtype allowed (mask of 1 << dtype),
 * innermost stride 1, 3-D head stride packed. */
static ms_status check_tensor(const char *op, const char *name, const ms_tensor *t, int32_t lo,
                              int32_t hi, unsigned dtypes, ms_error *err) {
    if (t == NULL || t->data == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: tensor %s is missing", op, name);
    if (t->ndim < lo || t->ndim > hi)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: %s has %d dimension(s), expected %d..%d", op,
                       name, t->ndim, lo, hi);
    if (t->dtype < 0 || t->dtype >= MS_DTYPE_COUNT || !(dtypes & (1u << t->dtype)))
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: %s has dtype %s, not supported here", op,
                       name, ms_dtype_str(t->dtype));
    for (int32_t i = 0; i < t->ndim; i++)
        if (t->shape[i] <= 0)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: %s has empty dimension %d", op, name, i);
    if (t->stride[t->ndim - 1] != 1 && t->shape[t->ndim - 1] != 1)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: %s innermost stride %lld, must be 1", op,
                       name, (long long)t->stride[t->ndim - 1]);
    if (t->ndim == 3 && t->stride[1] != t->shape[2] && t->shape[1] != 1)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "%s: %s head stride %lld must equal head_dim %lld (heads packed)", op, name,
                       (long long)t->stride[1], (long long)t->shape[2]);
    return MS_OK;
}

#define F32_ONLY (1u << MS_DTYPE_F32)
#define FLOATS ((1u << MS_DTYPE_F32) | (1u << MS_DTYPE_BF16) | (1u << MS_DTYPE_F16))
#define I32_ONLY (1u << MS_DTYPE_I32)

static bool same_shape(const ms_tensor *a, const ms_tensor *b) {
    if (a->ndim != b->ndim)
        return false;
    for (int32_t i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return false;
    return true;
}

static ms_status check_same_shape(const char *op, const char *na, const ms_tensor *a,
                                  const char *nb, const ms_tensor *b, ms_error *err) {
    if (same_shape(a, b))
        return MS_OK;
    char sa[96], sb[96];
    return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: %s shape %s does not match %s %s", op, nb,
                   shape_str(b, sb, sizeof sb), na, shape_str(a, sa, sizeof sa));
}

/* ---- element access ---- */

/* Number of rows (product of all but the last dimension). */
static int64_t n_rows(const ms_tensor *t) {
    int64_t n = 1;
    for (int32_t i = 0; i < t->ndim - 1; i++)
        n *= t->shape[i];
    return n;
}

/* Element offset of row r (row-major over all but the last dimension). */
static int64_t row_offset(const ms_tensor *t, int64_t r) {
    int64_t off = 0;
    for (int32_t i = t->ndim - 2; i >= 0; i--) {
        off += (r % t->shape[i]) * t->stride[i];
        r /= t->shape[i];
    }
    return off;
}

static float *row_f32(const ms_tensor *t, int64_t r) {
    return (float *)t->data + row_offset(t, r);
}

/* Load element i of a float row of dtype dt (aligned storage). */
static inline float load_elem(const void *row, ms_dtype dt, int64_t i) {
    switch (dt) {
    case MS_DTYPE_F32: return ((const float *)row)[i];
    case MS_DTYPE_BF16: return ms_bf16_to_f32(((const uint16_t *)row)[i]);
    default: return ms_f16_to_f32(((const uint16_t *)row)[i]);
    }
}

static inline void store_elem(void *row, ms_dtype dt, int64_t i, float v) {
    switch (dt) {
    case MS_DTYPE_F32: ((float *)row)[i] = v; break;
    case MS_DTYPE_BF16: ((uint16_t *)row)[i] = ms_f32_to_bf16(v); break;
    default: ((uint16_t *)row)[i] = ms_f32_to_f16(v); break;
    }
}

static const void *row_any(const ms_tensor *t, int64_t r) {
    return (const char *)t->data + (size_t)row_offset(t, r) * ms_dtype_size(t->dtype);
}

/* Fixed-order dot products: 8 lanes, combined pairwise, then the tail. */
static float dot_f32(const float *a, const float *b, int64_t n) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++)
            s[k] += a[i + k] * b[i + k];
    float r = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    for (; i < n; i++)
        r += a[i] * b[i];
    return r;
}

/* Split n items into tasks of at least `min_chunk` items, about 4 per thread. */
static int32_t n_tasks_for(const cpu_ctx *c, int64_t n, int64_t min_chunk) {
    if (n <= 0)
        return 0;
    int64_t t = MS_CEIL_DIV(n, MS_MAX(min_chunk, 1));
    int64_t cap = (int64_t)c->n_threads * 4;
    if (t > cap)
        t = cap;
    return (int32_t)MS_MAX(t, 1);
}

static void task_range(int64_t n, int32_t n_tasks, int32_t task, int64_t *lo, int64_t *hi) {
    *lo = n * task / n_tasks;
    *hi = n * (task + 1) / n_tasks;
}

/* ---- memory ---- */

static ms_status cpu_buffer_alloc(void *ctx, size_t bytes, const char *name, void **out,
                                  ms_error *err) {
    (void)ctx;
    *out = NULL;
    if (bytes == 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "buffer_alloc: %s: zero bytes requested",
                       name ? name : "buffer");
    if (bytes > SIZE_MAX - MS_CPU_ALIGN - sizeof(void *))
        return MS_FAIL(err, MS_ERR_OOM, "buffer_alloc: %s: %zu bytes is too large",
                       name ? name : "buffer", bytes);
    char *raw = ms_malloc(bytes + MS_CPU_ALIGN + sizeof(void *));
    if (raw == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "buffer_alloc: %s: out of host memory (%zu bytes)",
                       name ? name : "buffer", bytes);
    uintptr_t p = ((uintptr_t)raw + sizeof(void *) + MS_CPU_ALIGN - 1) &
                  ~(uintptr_t)(MS_CPU_ALIGN - 1);
    ((void **)p)[-1] = raw;
    *out = (void *)p;
    return MS_OK;
}

static void cpu_buffer_free(void *ctx, void *ptr) {
    (void)ctx;
    if (ptr != NULL)
        ms_free(((void **)ptr)[-1]);
}

static ms_status cpu_buffer_fill(void *ctx, void *dst, int byte, size_t bytes, ms_error *err) {
    (void)ctx;
    if (dst == NULL && bytes > 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "buffer_fill: NULL destination");
    if (bytes > 0)
        memset(dst, byte, bytes);
    return MS_OK;
}

static ms_status cpu_copy(void *ctx, void *dst, const void *src, size_t bytes, ms_error *err) {
    (void)ctx;
    if ((dst == NULL || src == NULL) && bytes > 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "copy: NULL pointer for %zu bytes", bytes);
    if (bytes > 0)
        memmove(dst, src, bytes);
    return MS_OK;
}

/* Load one element of any float dtype from possibly unaligned host memory. */
static float load_unaligned(const char *p, ms_dtype dt) {
    if (dt == MS_DTYPE_F32) {
        float f;
        memcpy(&f, p, sizeof f);
        return f;
    }
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return dt == MS_DTYPE_BF16 ? ms_bf16_to_f32(h) : ms_f16_to_f32(h);
}

static ms_status cpu_tensor_load(void *ctx, const ms_tensor *dst, const ms_tensor *src,
                                 ms_error *err) {
    (void)ctx;
    MS_TRY(check_tensor("tensor_load", "dst", dst, 1, MS_TENSOR_MAX_DIMS, FLOATS, err));
    MS_TRY(check_tensor("tensor_load", "src", src, 1, MS_TENSOR_MAX_DIMS, FLOATS, err));
    MS_TRY(check_same_shape("tensor_load", "dst", dst, "src", src, err));
    int64_t rows = n_rows(dst), cols = dst->shape[dst->ndim - 1];
    size_t ss = ms_dtype_size(src->dtype);
    for (int64_t r = 0; r < rows; r++) {
        const char *s = (const char *)src->data + (size_t)row_offset(src, r) * ss;
        void *d = (char *)dst->data + (size_t)row_offset(dst, r) * ms_dtype_size(dst->dtype);
        if (src->dtype == dst->dtype) {
            memcpy(d, s, (size_t)cols * ss);
            continue;
        }
        for (int64_t i = 0; i < cols; i++)
            store_elem(d, dst->dtype, i, load_unaligned(s + (size_t)i * ss, src->dtype));
    }
    return MS_OK;
}

static ms_status cpu_synchronize(void *ctx, ms_error *err) {
    (void)ctx;
    (void)err;
    return MS_OK;
}

/* ---- attention batches ---- */

static ms_status cpu_attn_batch_init(void *ctx, const ms_attn_limits *lim, ms_attn_batch **out,
                                     ms_error *err) {
    (void)ctx;
    *out = NULL;
    if (lim->max_seqs <= 0 || lim->max_tokens <= 0 || lim->max_pages <= 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "attn_batch_init: limits must be positive (seqs %d, tokens %d, pages %d)",
                       lim->max_seqs, lim->max_tokens, lim->max_pages);
    size_t s = (size_t)lim->max_seqs, t = (size_t)lim->max_tokens, p = (size_t)lim->max_pages;
    size_t n_ints = 2 * (s + 1) + p + 3 * s + 2 * t;
    ms_attn_batch *b = ms_calloc(1, sizeof *b);
    int32_t *mem = ms_calloc(n_ints, sizeof *mem);
    if (b == NULL || mem == NULL) {
        ms_free(b);
        ms_free(mem);
        return MS_FAIL(err, MS_ERR_OOM, "attn_batch_init: out of memory (%zu index entries)",
                       n_ints);
    }
    b->limits = *lim;
    b->impl = mem;
    b->qo_indptr = mem;
    b->kv_indptr = b->qo_indptr + s + 1;
    b->kv_indices = b->kv_indptr + s + 1;
    b->kv_last_page_len = b->kv_indices + p;
    b->kv_start = b->kv_last_page_len + s;
    b->last_token = b->kv_start + s;
    b->token_to_page = b->last_token + s;
    b->token_to_slot = b->token_to_page + t;
    *out = b;
    return MS_OK;
}

static void cpu_attn_batch_free(void *ctx, ms_attn_batch *b) {
    (void)ctx;
    if (b == NULL)
        return;
    ms_free(b->impl);
    ms_free(b);
}

static ms_status cpu_attn_batch_stage(void *ctx, ms_attn_batch *b, const ms_kv_plan *plan,
                                      const ms_paged_kv *kv, ms_error *err) {
    (void)ctx;
    ms_attn_batch shape;
    memset(&shape, 0, sizeof shape);
    MS_TRY(ms_attn_batch_check(&b->limits, plan, kv, &shape, err));
    int32_t n = shape.n_seqs;
    b->page_size = shape.page_size;
    b->n_seqs = n;
    b->n_tokens = shape.n_tokens;
    b->n_pages = shape.n_pages;
    b->max_q_len = shape.max_q_len;
    b->max_kv_len = shape.max_kv_len;
    b->is_decode = shape.is_decode;
    b->qo_indptr[0] = 0;
    b->kv_indptr[0] = 0;
    for (int32_t i = 0; i < n; i++) {
        b->qo_indptr[i + 1] = plan->qo_indptr[i + 1];
        b->kv_indptr[i + 1] = plan->kv_indptr[i + 1];
        b->kv_last_page_len[i] = plan->kv_last_page_len[i];
        b->kv_start[i] = plan->kv_start ? plan->kv_start[i] : 0;
        b->last_token[i] = plan->qo_indptr[i + 1] > plan->qo_indptr[i] ? plan->qo_indptr[i + 1] - 1
                                                                       : -1;
    }
    if (shape.n_pages > 0)
        memcpy(b->kv_indices, plan->kv_indices, (size_t)shape.n_pages * sizeof(int32_t));
    int32_t written = plan->token_to_page != NULL ? shape.n_tokens : 0;
    if (written > 0) {
        memcpy(b->token_to_page, plan->token_to_page, (size_t)written * sizeof(int32_t));
        memcpy(b->token_to_slot, plan->token_to_slot, (size_t)written * sizeof(int32_t));
    }
    for (int32_t t = written; t < b->limits.max_tokens; t++) {
        b->token_to_page[t] = MS_SINK_PAGE;
        b->token_to_slot[t] = 0;
    }
    return MS_OK;
}

/* ---- embedding ---- */

static ms_status cpu_embedding(void *ctx, const ms_tensor *table, const ms_tensor *ids,
                               ms_tensor *out, ms_error *err) {
    (void)ctx;
    MS_TRY(check_tensor("embedding", "table", table, 2, 2, FLOATS, err));
    MS_TRY(check_tensor("embedding", "ids", ids, 1, 1, I32_ONLY, err));
    MS_TRY(check_tensor("embedding", "out", out, 2, 2, F32_ONLY, err));
    if (out->shape[0] != ids->shape[0] || out->shape[1] != table->shape[1])
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "embedding: out [%lld, %lld] must be [ids %lld, d %lld]",
                       (long long)out->shape[0], (long long)out->shape[1],
                       (long long)ids->shape[0], (long long)table->shape[1]);
    const int32_t *id = ids->data;
    int64_t d = table->shape[1];
    for (int64_t t = 0; t < ids->shape[0]; t++) {
        int32_t v = id[t * ids->stride[0]];
        if (v < 0 || v >= table->shape[0])
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "embedding: token %lld has id %d outside the vocabulary [0, %lld)",
                           (long long)t, v, (long long)table->shape[0]);
        const void *src = row_any(table, v);
        float *dst = row_f32(out, t);
        for (int64_t i = 0; i < d; i++)
            dst[i] = load_elem(src, table->dtype, i);
    }
    return MS_OK;
}

/* ---- linear ---- */

typedef struct linear_job {
    const ms_tensor *x, *w, *bias, *y;
    int64_t n, in, out;
    int32_t n_tasks;
} linear_job;

/*
 * Register-blocked GEMM microkernel: 2 tokens x 4 output rows per block with 4-lane accumulators
 * (SSE, the x86-64 baseline: 8 accumulators and the operands fit its 16 registers). Every
 * y[t, o] is reduced the same way whichever block it falls in (lane k sums the products of the
 * elements i = k mod 4 in order, lanes combined as (l0 + l2) + (l1 + l3), then the tail in order);
 * a partial block of rows recomputes the last row in the missing slot (writing the same value
 * again) and an odd last token uses the one-token kernel with the same per-lane order. So
 * results depend neither on the thread count nor on how many tokens share the batch.
 */
typedef float v4f __attribute__((vector_size(16)));
typedef uint16_t v4u16 __attribute__((vector_size(8)));
typedef uint32_t v4u32 __attribute__((vector_size(16)));

static inline __attribute__((always_inline)) v4f load4_w(const void *w, ms_dtype dt, int64_t i) {
    v4f out;
    if (dt == MS_DTYPE_F32) {
        memcpy(&out, (const float *)w + i, sizeof out);
    } else if (dt == MS_DTYPE_BF16) {
        v4u16 h;
        memcpy(&h, (const uint16_t *)w + i, sizeof h);
        v4u32 u = __builtin_convertvector(h, v4u32) << 16;
        memcpy(&out, &u, sizeof out);
    } else {
        for (int k = 0; k < 4; k++)
            out[k] = ms_f16_to_f32(((const uint16_t *)w)[i + k]);
    }
    return out;
}

static inline __attribute__((always_inline)) float hsum4(v4f s) {
    return (s[0] + s[2]) + (s[1] + s[3]);
}

/* r[tb * 4 + ob] = x_tb . w_ob for 2 token rows and 4 weight rows; dt is a constant after
 * inlining. */
static inline __attribute__((always_inline)) void lin_kernel(const float *x0, const float *x1,
                                                             const char *const *w, ms_dtype dt,
                                                             int64_t in, float *r) {
    v4f z = {0, 0, 0, 0};
    v4f a0 = z, a1 = z, a2 = z, a3 = z, b0 = z, b1 = z, b2 = z, b3 = z;
    int64_t in4 = in & ~(int64_t)3;
    for (int64_t i = 0; i < in4; i += 4) {
        v4f xa, xb;
        memcpy(&xa, x0 + i, sizeof xa);
        memcpy(&xb, x1 + i, sizeof xb);
        v4f w0 = load4_w(w[0], dt, i), w1 = load4_w(w[1], dt, i);
        v4f w2 = load4_w(w[2], dt, i), w3 = load4_w(w[3], dt, i);
        a0 += xa * w0;
        a1 += xa * w1;
        a2 += xa * w2;
        a3 += xa * w3;
        b0 += xb * w0;
        b1 += xb * w1;
        b2 += xb * w2;
        b3 += xb * w3;
    }
    r[0] = hsum4(a0), r[1] = hsum4(a1), r[2] = hsum4(a2), r[3] = hsum4(a3);
    r[4] = hsum4(b0), r[5] = hsum4(b1), r[6] = hsum4(b2), r[7] = hsum4(b3);
    for (int64_t i = in4; i < in; i++)
        for (int ob = 0; ob < 4; ob++) {
            float wv = load_elem(w[ob], dt, i);
            r[ob] += x0[i] * wv;
            r[4 + ob] += x1[i] * wv;
        }
}

/* r[ob] = x0 . w_ob for 4 weight rows: lin_kernel's first half, for an odd last token (decode). */
static inline __attribute__((always_inline)) void lin_kernel1(const float *x0,
                                                              const char *const *w, ms_dtype dt,
                                                              int64_t in, float *r) {
    v4f z = {0, 0, 0, 0};
    v4f a0 = z, a1 = z, a2 = z, a3 = z;
    int64_t in4 = in & ~(int64_t)3;
    for (int64_t i = 0; i < in4; i += 4) {
        v4f xa;
        memcpy(&xa, x0 + i, sizeof xa);
        a0 += xa * load4_w(w[0], dt, i);
        a1 += xa * load4_w(w[1], dt, i);
        a2 += xa * load4_w(w[2], dt, i);
        a3 += xa * load4_w(w[3], dt, i);
    }
    r[0] = hsum4(a0), r[1] = hsum4(a1), r[2] = hsum4(a2), r[3] = hsum4(a3);
    for (int64_t i = in4; i < in; i++)
        for (int ob = 0; ob < 4; ob++)
            r[ob] += x0[i] * load_elem(w[ob], dt, i);
}

/* Output rows [o0, o0 + 4) (clamped to the last row) for every token. */
static inline __attribute__((always_inline)) void lin_rows(const linear_job *j, int64_t o0,
                                                           ms_dtype dt) {
    size_t ws = ms_dtype_size(dt);
    int64_t o[4];
    const char *w[4];
    float b[4];
    for (int k = 0; k < 4; k++) {
        o[k] = MS_MIN(o0 + k, j->out - 1);
        w[k] = (const char *)j->w->data + (size_t)(o[k] * j->w->stride[0]) * ws;
        b[k] = j->bias ? load_elem(j->bias->data, j->bias->dtype, o[k] * j->bias->stride[0]) : 0.0f;
    }
    int64_t t = 0;
    for (; t + 2 <= j->n; t += 2) {
        int64_t t1 = t + 1;
        const float *x0 = (const float *)j->x->data + t * j->x->stride[0];
        const float *x1 = (const float *)j->x->data + t1 * j->x->stride[0];
        float r[8];
        lin_kernel(x0, x1, w, dt, j->in, r);
        float *y0 = (float *)j->y->data + t * j->y->stride[0];
        float *y1 = (float *)j->y->data + t1 * j->y->stride[0];
        for (int k = 0; k < 4; k++) {
            y0[o[k]] = r[k] + b[k];
            y1[o[k]] = r[4 + k] + b[k];
        }
    }
    if (t < j->n) {
        float r[4];
        lin_kernel1((const float *)j->x->data + t * j->x->stride[0], w, dt, j->in, r);
        float *y0 = (float *)j->y->data + t * j->y->stride[0];
        for (int k = 0; k < 4; k++)
            y0[o[k]] = r[k] + b[k];
    }
}

static void lin_rows_f32(const linear_job *j, int64_t o0) {
    lin_rows(j, o0, MS_DTYPE_F32);
}

static void lin_rows_bf16(const linear_job *j, int64_t o0) {
    lin_rows(j, o0, MS_DTYPE_BF16);
}

static void lin_rows_f16(const linear_job *j, int64_t o0) {
    lin_rows(j, o0, MS_DTYPE_F16);
}

static void linear_task(void *arg, int32_t task, int32_t thread) {
    (void)thread;
    const linear_job *j = arg;
    /* tasks own whole 4-row groups, so block boundaries never depend on the task count */
    int64_t g_lo, g_hi;
    task_range(MS_CEIL_DIV(j->out, 4), j->n_tasks, task, &g_lo, &g_hi);
    for (int64_t g = g_lo; g < g_hi; g++) {
        if (j->w->dtype == MS_DTYPE_F32)
            lin_rows_f32(j, 4 * g);
        else if (j->w->dtype == MS_DTYPE_BF16)
            lin_rows_bf16(j, 4 * g);
        else
            lin_rows_f16(j, 4 * g);
    }
}

static ms_status cpu_linear(void *ctx, const ms_tensor *x, const ms_tensor *w,
                            const ms_tensor *bias, ms_tensor *y, ms_error *err) {
    cpu_ctx *c = ctx;
    MS_TRY(check_tensor("linear", "x", x, 2, 2, F32_ONLY, err));
    MS_TRY(check_tensor("linear", "w", w, 2, 2, FLOATS, err));
    MS_TRY(check_tensor("linear", "y", y, 2, 2, F32_ONLY, err));
    char sx[96], sw[96], sy[96];
    if (w->shape[1] != x->shape[1] || y->shape[0] != x->shape[0] || y->shape[1] != w->shape[0])
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "linear: shapes x %s, w %s, y %s do not fit y = x w^T",
                       shape_str(x, sx, sizeof sx), shape_str(w, sw, sizeof sw),
                       shape_str(y, sy, sizeof sy));
    if (bias != NULL) {
        MS_TRY(check_tensor("linear", "bias", bias, 1, 1, FLOATS, err));
        if (bias->shape[0] != w->shape[0])
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "linear: bias has %lld entries, w has %lld rows",
                           (long long)bias->shape[0], (long long)w->shape[0]);
    }
    if (y->data == x->data)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "linear: y may not alias x");
    linear_job j = {x, w, bias, y, x->shape[0], x->shape[1], w->shape[0], 0};
    /* at least ~64k multiply-adds per task */
    int64_t per_row = MS_MAX(j.n * j.in, 1);
    j.n_tasks = n_tasks_for(c, MS_CEIL_DIV(j.out, 4), MS_MAX(65536 / (per_row * 4), 1));
    ms_threadpool_run(c->pool, j.n_tasks, linear_task, &j);
    return MS_OK;
}

/* ---- RMSNorm and elementwise ops ---- */

static void rms_norm_row(const float *x, const ms_tensor *w, float eps, float *out, int64_t d) {
    double ss = 0.0;
    for (int64_t i = 0; i < d; i++)
        ss += (double)x[i] * (double)x[i];
    float inv = 1.0f / sqrtf((float)(ss / (double)d) + eps);
    for (int64_t i = 0; i < d; i++)
        out[i] = load_elem(w->data, w->dtype, i * w->stride[0]) * (x[i] * inv);
}

typedef struct rows_job {
    const ms_tensor *a, *b, *w, *out;
    ms_tensor *res;
    float eps;
    int64_t rows, cols;
    int32_t n_tasks;
} rows_job;

static void rms_norm_task(void *arg, int32_t task, int32_t thread) {
    (void)thread;
    const rows_job *j = arg;
    int64_t lo, hi;
    task_range(j->rows, j->n_tasks, task, &lo, &hi);
    for (int64_t r = lo; r < hi; r++)
        rms_norm_row(row_f32(j->a, r), j->w, j->eps, row_f32(j->out, r), j->cols);
}

static int32_t rows_tasks(const cpu_ctx *c, int64_t rows, int64_t cols) {
    return n_tasks_for(c, rows, MS_MAX(MS_CPU_PAR_MIN_ELEMS / MS_MAX(cols, 1), 1));
}

static ms_status cpu_rms_norm(void *ctx, const ms_tensor *x, const ms_tensor *w, float eps,
                              ms_tensor *out, ms_error *err) {
    cpu_ctx *c = ctx;
    MS_TRY(check_tensor("rms_norm", "x", x, 2, 3, F32_ONLY, err));
    MS_TRY(check_tensor("rms_norm", "w", w, 1, 1, FLOATS, err));
    MS_TRY(check_tensor("rms_norm", "out", out, 2, 3, F32_ONLY, err));
    MS_TRY(check_same_shape("rms_norm", "x", x, "out", out, err));
    int64_t d = x->shape[x->ndim - 1];
    if (w->shape[0] != d)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "rms_norm: w has %lld entries, x rows have %lld",
                       (long long)w->shape[0], (long long)d);
    if (!(eps >= 0.0f))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "rms_norm: eps %g must be >= 0", (double)eps);
    rows_job j = {x, NULL, w, out, NULL, eps, n_rows(x), d, 0};
    j.n_tasks = rows_tasks(c, j.rows, j.cols);
    ms_threadpool_run(c->pool, j.n_tasks, rms_norm_task, &j);
    return MS_OK;
}

static void add_task(void *arg, int32_t task, int32_t thread) {
    (void)thread;
    const rows_job *j = arg;
    int64_t lo, hi;
    task_range(j->rows, j->n_tasks, task, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        const float *a = row_f32(j->a, r), *b = row_f32(j->b, r);
        float *o = row_f32(j->out, r);
        for (int64_t i = 0; i < j->cols; i++)
            o[i] = a[i] + b[i];
    }
}

static ms_status cpu_add(void *ctx, const ms_tensor *a, const ms_tensor *b, ms_tensor *out,
                         ms_error *err) {
    cpu_ctx *c = ctx;
    MS_TRY(check_tensor("add", "a", a, 1, 3, F32_ONLY, err));
    MS_TRY(check_tensor("add", "b", b, 1, 3, F32_ONLY, err));
    MS_TRY(check_tensor("add", "out", out, 1, 3, F32_ONLY, err));
    MS_TRY(check_same_shape("add", "a", a, "b", b, err));
    MS_TRY(check_same_shape("add", "a", a, "out", out, err));
    rows_job j = {a, b, NULL, out, NULL, 0.0f, n_rows(a), a->shape[a->ndim - 1], 0};
    j.n_tasks = rows_tasks(c, j.rows, j.cols);
    ms_threadpool_run(c->pool, j.n_tasks, add_task, &j);
    return MS_OK;
}

static void add_rms_norm_task(void *arg, int32_t task, int32_t thread) {
    (void)thread;
    const rows_job *j = arg;
    int64_t lo, hi;
    task_range(j->rows, j->n_tasks, task, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        float *res = row_f32(j->res, r);
        const float *x = row_f32(j->a, r);
        for (int64_t i = 0; i < j->cols; i++)
            res[i] += x[i];
        rms_norm_row(res, j->w, j->eps, row_f32(j->out, r), j->cols);
    }
}

static ms_status cpu_add_rms_norm(void *ctx, ms_tensor *residual, const ms_tensor *x,
                                  const ms_tensor *w, float eps, ms_tensor *out, ms_error *err) {
    cpu_ctx *c = ctx;
    MS_TRY(check_tensor("add_rms_norm", "residual", residual, 2, 2, F32_ONLY, err));
    MS_TRY(check_tensor("add_rms_norm", "x", x, 2, 2, F32_ONLY, err));
    MS_TRY(check_tensor("add_rms_norm", "w", w, 1, 1, FLOATS, err));
    MS_TRY(check_tensor("add_rms_norm", "out", out, 2, 2, F32_ONLY, err));
    MS_TRY(check_same_shape("add_rms_norm", "residual", residual, "x", x, err));
    MS_TRY(check_same_shape("add_rms_norm", "residual", residual, "out", out, err));
    if (w->shape[0] != residual->shape[1])
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "add_rms_norm: w has %lld entries, rows have %lld",
                       (long long)w->shape[0], (long long)residual->shape[1]);
    if (out->data == residual->data)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "add_rms_norm: out may not alias residual");
    rows_job j = {x, NULL, w, out, residual, eps, residual->shape[0], residual->shape[1], 0};
    j.n_tasks = rows_tasks(c, j.rows, j.cols);
    ms_threadpool_run(c->pool, j.n_tasks, add_rms_norm_task, &j);
    return MS_OK;
}

static void silu_mul_task(void *arg, int32_t task, int32_t thread) {
    (void)thread;
    const rows_job *j = arg;
    int64_t lo, hi;
    task_range(j->rows, j->n_tasks, task, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        const float *g = row_f32(j->a, r), *u = row_f32(j->b, r);
        float *o = row_f32(j->out, r);
        for (int64_t i = 0; i < j->cols; i++) {
            float gi = g[i];
            o[i] = gi / (1.0f + expf(-gi)) * u[i];
        }
    }
}

static ms_status cpu_silu_mul(void *ctx, const ms_tensor *gate, const ms_tensor *up,
                              ms_tensor *out, ms_error *err) {
    cpu_ctx *c = ctx;
    MS_TRY(check_tensor("silu_mul", "gate", gate, 2, 2, F32_ONLY, err));
    MS_TRY(check_tensor("silu_mul", "up", up, 2, 2, F32_ONLY, err));
    MS_TRY(check_tensor("silu_mul", "out", out, 2, 2, F32_ONLY, err));
    MS_TRY(check_same_shape("silu_mul", "gate", gate, "up", up, err));
    MS_TRY(check_same_shape("silu_mul", "gate", gate, "out", out, err));
    rows_job j = {gate, up, NULL, out, NULL, 0.0f, gate->shape[0], gate->shape[1], 0};
    j.n_tasks = rows_tasks(c, j.rows, j.cols);
    ms_threadpool_run(c->pool, j.n_tasks, silu_mul_task, &j);
    return MS_OK;
}

/* The fused entries as their compositions over this backend's own ops (not the iface table: a
   wrapper that hooks iface.linear, tensor parallelism's, must wrap these too, and the CPU runs
   that wrapper in CI). The values are those of the default path. */
static ms_status cpu_silu_mul_linear(void *ctx, const ms_tensor *gate, const ms_tensor *up,
                                     ms_tensor *tmp, const ms_tensor *w, const ms_tensor *bias,
                                     ms_tensor *y, ms_error *err) {
    MS_TRY(cpu_silu_mul(ctx, gate, up, tmp, err));
    return cpu_linear(ctx, tmp, w, bias, y, err);
}

static ms_status cpu_rms_norm_linear(void *ctx, ms_tensor *residual, const ms_tensor *x,
                                     const ms_tensor *norm_w, float eps, ms_tensor *h,
                                     const ms_tensor *w, const ms_tensor *bias, ms_tensor *y,
                                     ms_error *err) {
    if (residual != NULL)
        MS_TRY(cpu_add_rms_norm(ctx, residual, x, norm_w, eps, h, err));
    else
        MS_TRY(cpu_rms_norm(ctx, x, norm_w, eps, h, err));
    return cpu_linear(ctx, h, w, bias, y, err);
}

/* ---- encoder ops: LayerNorm, GELU, conv1d ---- */

static void layer_norm_task(void *arg, int32_t task, int32_t thread) {
    (void)thread;
    const rows_job *j = arg;
    int64_t lo, hi;
    task_range(j->rows, j->n_tasks, task, &lo, &hi);
    const ms_tensor *bias = j->b;
    for (int64_t r = lo; r < hi; r++) {
        const float *x = row_f32(j->a, r);
        float *o = row_f32(j->out, r);
        double sum = 0.0;
        for (int64_t i = 0; i < j->cols; i++)
            sum += x[i];
        double mean = sum / (double)j->cols, var = 0.0;
        for (int64_t i = 0; i < j->cols; i++)
            var += ((double)x[i] - mean) * ((double)x[i] - mean);
        float inv = 1.0f / sqrtf((float)(var / (double)j->cols) + j->eps);
        float m = (float)mean;
        for (int64_t i = 0; i < j->cols; i++) {
            float v = (x[i] - m) * inv * load_elem(j->w->data, j->w->dtype, i * j->w->stride[0]);
            if (bias != NULL)
                v += load_elem(bias->data, bias->dtype, i * bias->stride[0]);
            o[i] = v;
        }
    }
}

static ms_status cpu_layer_norm(void *ctx, const ms_tensor *x, const ms_tensor *w,
                                const ms_tensor *b, float eps, ms_tensor *out, ms_error *err) {
    cpu_ctx *c = ctx;
    MS_TRY(check_tensor("layer_norm", "x", x, 2, 2, F32_ONLY, err));
    MS_TRY(check_tensor("layer_norm", "w", w, 1, 1, FLOATS, err));
    MS_TRY(check_tensor("layer_norm", "out", out, 2, 2, F32_ONLY, err));
    MS_TRY(check_same_shape("layer_norm", "x", x, "out", out, err));
    if (w->shape[0] != x->shape[1])
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "layer_norm: w has %lld entries, x rows have %lld",
                       (long long)w->shape[0], (long long)x->shape[1]);
    if (b != NULL) {
        MS_TRY(check_tensor("layer_norm", "b", b, 1, 1, FLOATS, err));
        if (b->shape[0] != x->shape[1])
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "layer_norm: b has %lld entries, x rows have %lld",
                           (long long)b->shape[0], (long long)x->shape[1]);
    }
    if (!(eps >= 0.0f))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "layer_norm: eps %g must be >= 0", (double)eps);
    rows_job j = {x, b, w, out, NULL, eps, x->shape[0], x->shape[1], 0};
    j.n_tasks = rows_tasks(c, j.rows, j.cols);
    ms_threadpool_run(c->pool, j.n_tasks, layer_norm_task, &j);
    return MS_OK;
}

static void gelu_task(void *arg, int32_t task, int32_t thread) {
    (void)thread;
    const rows_job *j = arg;
    int64_t lo, hi;
    task_range(j->rows, j->n_tasks, task, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        const float *x = row_f32(j->a, r);
        float *o = row_f32(j->out, r);
        for (int64_t i = 0; i < j->cols; i++)
            o[i] = 0.5f * x[i] * (1.0f + erff(x[i] * (float)M_SQRT1_2));
    }
}

static ms_status cpu_gelu(void *ctx, const ms_tensor *x, ms_tensor *out, ms_error *err) {
    cpu_ctx *c = ctx;
    MS_TRY(check_tensor("gelu", "x", x, 2, 2, F32_ONLY, err));
    MS_TRY(check_tensor("gelu", "out", out, 2, 2, F32_ONLY, err));
    MS_TRY(check_same_shape("gelu", "x", x, "out", out, err));
    rows_job j = {x, NULL, NULL, out, NULL, 0.0f, x->shape[0], x->shape[1], 0};
    j.n_tasks = rows_tasks(c, j.rows, j.cols);
    ms_threadpool_run(c->pool, j.n_tasks, gelu_task, &j);
    return MS_OK;
}

typedef struct conv_job {
    const ms_tensor *x, *w, *bias, *y;
    int32_t stride, padding;
    int32_t n_tasks;
} conv_job;

static void conv1d_task(void *arg, int32_t task, int32_t thread) {
    (void)thread;
    const conv_job *j = arg;
    int64_t t_in = j->x->shape[0], c_in = j->x->shape[1], k_len = j->w->shape[2];
    int64_t c_out = j->w->shape[0];
    int64_t lo, hi;
    task_range(j->y->shape[0], j->n_tasks, task, &lo, &hi);
    size_t ws = ms_dtype_size(j->w->dtype);
    for (int64_t t = lo; t < hi; t++) {
        float *yr = row_f32(j->y, t);
        for (int64_t o = 0; o < c_out; o++) {
            const char *wo = (const char *)j->w->data + (size_t)(o * j->w->stride[0]) * ws;
            float acc = j->bias ? load_elem(j->bias->data, j->bias->dtype, o * j->bias->stride[0])
                                : 0.0f;
            /* fixed order: input channel, then tap */
            for (int64_t c = 0; c < c_in; c++) {
                const char *wc = wo + (size_t)(c * j->w->stride[1]) * ws;
                for (int64_t k = 0; k < k_len; k++) {
                    int64_t src = t * j->stride + k - j->padding;
                    if (src < 0 || src >= t_in)
                        continue;
                    acc += load_elem(wc, j->w->dtype, k) * row_f32(j->x, src)[c];
                }
            }
            yr[o] = acc;
        }
    }
}

static ms_status cpu_conv1d(void *ctx, const ms_tensor *x, const ms_tensor *w,
                            const ms_tensor *bias, int32_t stride, int32_t padding, ms_tensor *y,
                            ms_error *err) {
    cpu_ctx *c = ctx;
    MS_TRY(check_tensor("conv1d", "x", x, 2, 2, F32_ONLY, err));
    MS_TRY(check_tensor("conv1d", "w", w, 3, 3, FLOATS, err));
    MS_TRY(check_tensor("conv1d", "y", y, 2, 2, F32_ONLY, err));
    if (w->stride[1] != w->shape[2])
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "conv1d: w must be contiguous per output channel");
    if (stride < 1 || padding < 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "conv1d: stride %d must be >= 1, padding %d >= 0",
                       stride, padding);
    int64_t t_out = (x->shape[0] + 2 * padding - w->shape[2]) / stride + 1;
    char sx[96], sw[96], sy[96];
    if (w->shape[1] != x->shape[1] || y->shape[1] != w->shape[0] || y->shape[0] != t_out)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "conv1d: shapes x %s, w %s, y %s do not fit (stride %d, padding %d: "
                       "y must be [%lld, %lld])", shape_str(x, sx, sizeof sx),
                       shape_str(w, sw, sizeof sw), shape_str(y, sy, sizeof sy), stride, padding,
                       (long long)t_out, (long long)w->shape[0]);
    if (bias != NULL) {
        MS_TRY(check_tensor("conv1d", "bias", bias, 1, 1, FLOATS, err));
        if (bias->shape[0] != w->shape[0])
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "conv1d: bias has %lld entries for %lld "
                           "output channels", (long long)bias->shape[0], (long long)w->shape[0]);
    }
    if (y->data == x->data)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "conv1d: y may not alias x");
    conv_job j = {x, w, bias, y, stride, padding, 0};
    int64_t per = MS_MAX(w->shape[0] * w->shape[1] * w->shape[2], 1);
    j.n_tasks = n_tasks_for(c, t_out, MS_MAX(65536 / per, 1));
    ms_threadpool_run(c->pool, j.n_tasks, conv1d_task, &j);
    return MS_OK;
}

/* ---- RoPE and the KV write ---- */

/* Position id of token t in stream s (pos is [n] or [streams, n]). */
static int32_t pos_at(const ms_tensor *pos, int32_t s, int64_t t) {
    const int32_t *p = pos->data;
    return pos->ndim == 1 ? p[t * pos->stride[0]] : p[s * pos->stride[0] + t * pos->stride[1]];
}

static ms_status check_rope(const char *op, const ms_tensor *q, const ms_tensor *k,
                            const ms_tensor *pos, const ms_rope_table *rope, ms_error *err) {
    MS_TRY(check_tensor(op, "q", q, 3, 3, F32_ONLY, err));
    MS_TRY(check_tensor(op, "pos", pos, 1, 2, I32_ONLY, err));
    int64_t n = q->shape[0], d = q->shape[2];
    if (k != NULL) {
        MS_TRY(check_tensor(op, "k", k, 3, 3, F32_ONLY, err));
        if (k->shape[0] != n || k->shape[2] != d)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "%s: k [%lld, %lld, %lld] must have q's tokens %lld and head_dim %lld",
                           op, (long long)k->shape[0], (long long)k->shape[1],
                           (long long)k->shape[2], (long long)n, (long long)d);
    }
    if (rope == NULL || rope->inv_freq == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: rope table missing", op);
    if (rope->n_sections < 0 || rope->n_sections > MS_ROPE_MAX_SECTIONS)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: %d M-RoPE sections, at most %d", op,
                       rope->n_sections, MS_ROPE_MAX_SECTIONS);
    int32_t streams = rope->n_sections > 0 ? rope->n_sections : 1;
    if (rope->n_sections > 0) {
        int32_t sum = 0;
        for (int32_t s = 0; s < rope->n_sections; s++) {
            if (rope->sections[s] < 0)
                return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: M-RoPE section %d is negative", op, s);
            sum += rope->sections[s];
        }
        if (sum != rope->rotary_dim / 2)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "%s: M-RoPE sections sum to %d pairs, rotary_dim %d has %d", op, sum,
                           rope->rotary_dim, rope->rotary_dim / 2);
    }
    bool pos_ok = rope->n_sections > 0
                      ? pos->ndim == 2 && pos->shape[0] == streams && pos->shape[1] == n
                      : pos->ndim == 1 && pos->shape[0] == n;
    if (!pos_ok) {
        char sp[96];
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: pos %s must be [%s%lld] for %lld tokens", op,
                       shape_str(pos, sp, sizeof sp), rope->n_sections > 0 ? "n_sections, " : "",
                       (long long)n, (long long)n);
    }
    if (rope->rotary_dim <= 0 || rope->rotary_dim % 2 != 0 || rope->rotary_dim > d ||
        rope->rotary_dim > MS_CPU_MAX_HEAD_DIM)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "%s: rotary_dim %d must be even and in (0, head_dim %lld]", op,
                       rope->rotary_dim, (long long)d);
    if (rope->style < 0 || rope->style >= MS_ROPE_STYLE_COUNT)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: unknown rope style %d", op, (int)rope->style);
    for (int32_t s = 0; s < streams; s++)
        for (int64_t t = 0; t < n; t++) {
            int32_t p = pos_at(pos, s, t);
            if (p < 0)
                return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: token %lld has negative position %d",
                               op, (long long)t, p);
        }
    return MS_OK;
}

static void rope_heads(float *x, int64_t n_heads, int64_t d, const ms_rope_table *rope,
                       const float *cs, const float *sn) {
    int32_t half = rope->rotary_dim / 2;
    for (int64_t h = 0; h < n_heads; h++) {
        float *v = x + h * d;
        if (rope->style == MS_ROPE_ROTATE_HALF) {
            for (int32_t j = 0; j < half; j++) {
                float a = v[j], b = v[j + half];
                v[j] = a * cs[j] - b * sn[j];
                v[j + half] = b * cs[j] + a * sn[j];
            }
        } else {
            for (int32_t j = 0; j < half; j++) {
                float a = v[2 * j], b = v[2 * j + 1];
                v[2 * j] = a * cs[j] - b * sn[j];
                v[2 * j + 1] = b * cs[j] + a * sn[j];
            }
        }
    }
}

typedef struct rope_job {
    const ms_tensor *q, *k, *pos;
    const ms_rope_table *rope;
    int64_t n;
    int32_t n_tasks;
} rope_job;

static void rope_task(void *arg, int32_t task, int32_t thread) {
    (void)thread;
    const rope_job *j = arg;
    int64_t lo, hi;
    task_range(j->n, j->n_tasks, task, &lo, &hi);
    float cs[MS_CPU_MAX_HEAD_DIM / 2], sn[MS_CPU_MAX_HEAD_DIM / 2];
    int32_t half = j->rope->rotary_dim / 2;
    for (int64_t t = lo; t < hi; t++) {
        /* HF: freqs = inv_freq @ position (f32), emb = cat(freqs, freqs), cos = emb.cos() *
         * attention_scaling; llama2.c: val = pos * freq; fcr = cosf(val), fci = sinf(val) */
        int32_t sec = 0, sec_end = j->rope->n_sections > 0 ? j->rope->sections[0] : half;
        float p = (float)pos_at(j->pos, 0, t);
        for (int32_t i = 0; i < half; i++) {
            while (i >= sec_end && sec + 1 < j->rope->n_sections) {
                sec++;
                sec_end += j->rope->sections[sec];
                p = (float)pos_at(j->pos, sec, t);
            }
            float a = p * j->rope->inv_freq[i];
            cs[i] = cosf(a) * j->rope->attention_scaling;
            sn[i] = sinf(a) * j->rope->attention_scaling;
        }
        rope_heads((float *)j->q->data + t * j->q->stride[0], j->q->shape[1], j->q->shape[2],
                   j->rope, cs, sn);
        if (j->k != NULL)
            rope_heads((float *)j->k->data + t * j->k->stride[0], j->k->shape[1], j->k->shape[2],
                       j->rope, cs, sn);
    }
}

static ms_status cpu_rope(void *ctx, ms_tensor *q, ms_tensor *k, const ms_tensor *pos,
                          const ms_rope_table *rope, ms_error *err) {
    cpu_ctx *c = ctx;
    MS_TRY(check_rope("rope", q, k, pos, rope, err));
    rope_job j = {q, k, pos, rope, q->shape[0], 0};
    int64_t per_tok = q->shape[1] * q->shape[2] + (k ? k->shape[1] * k->shape[2] : 0);
    j.n_tasks = rows_tasks(c, j.n, per_tok * 4);
    ms_threadpool_run(c->pool, j.n_tasks, rope_task, &j);
    return MS_OK;
}

static ms_status check_kv(const char *op, const ms_paged_kv *kv, int32_t layer, ms_error *err) {
    if (kv == NULL || kv->data == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: KV arena missing", op);
    if (kv->dtype != MS_DTYPE_F32 && kv->dtype != MS_DTYPE_BF16 && kv->dtype != MS_DTYPE_F16)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: KV dtype %s not supported", op,
                       ms_dtype_str(kv->dtype));
    if (kv->n_layers <= 0 || kv->n_pages <= 0 || kv->page_size <= 0 || kv->n_kv_heads <= 0 ||
        kv->head_dim <= 0 || kv->head_dim > MS_CPU_MAX_HEAD_DIM)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "%s: bad KV arena (layers %d, pages %d, page_size %d, kv_heads %d, "
                       "head_dim %d)", op, kv->n_layers, kv->n_pages, kv->page_size,
                       kv->n_kv_heads, kv->head_dim);
    if (layer < 0 || layer >= kv->n_layers)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: layer %d outside [0, %d)", op, layer,
                       kv->n_layers);
    return MS_OK;
}

static ms_status check_batch(const char *op, const ms_attn_batch *b, const ms_paged_kv *kv,
                             ms_error *err) {
    if (b == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: attention batch missing", op);
    if (b->page_size != kv->page_size)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "%s: batch staged for page size %d, arena has %d (stage it for this arena)",
                       op, b->page_size, kv->page_size);
    return MS_OK;
}

static ms_status cpu_kv_write(void *ctx, const ms_paged_kv *kv, int32_t layer, const ms_tensor *k,
                              const ms_tensor *v, const ms_attn_batch *b, ms_error *err) {
    (void)ctx;
    MS_TRY(check_kv("kv_write", kv, layer, err));
    MS_TRY(check_batch("kv_write", b, kv, err));
    MS_TRY(check_tensor("kv_write", "k", k, 3, 3, F32_ONLY, err));
    MS_TRY(check_tensor("kv_write", "v", v, 3, 3, F32_ONLY, err));
    MS_TRY(check_same_shape("kv_write", "k", k, "v", v, err));
    if (k->shape[0] != b->n_tokens || k->shape[1] != kv->n_kv_heads ||
        k->shape[2] != kv->head_dim)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "kv_write: k [%lld, %lld, %lld] must be [n_tokens %d, kv_heads %d, "
                       "head_dim %d]", (long long)k->shape[0], (long long)k->shape[1],
                       (long long)k->shape[2], b->n_tokens, kv->n_kv_heads, kv->head_dim);
    int64_t row = (int64_t)kv->n_kv_heads * kv->head_dim;
    size_t es = ms_dtype_size(kv->dtype);
    for (int32_t t = 0; t < b->n_tokens; t++) {
        int32_t page = b->token_to_page[t], slot = b->token_to_slot[t];
        for (int32_t kvi = 0; kvi < 2; kvi++) {
            const float *src = (const float *)(kvi ? v : k)->data + t * (kvi ? v : k)->stride[0];
            char *dst = (char *)kv->data +
                        (size_t)ms_paged_kv_offset(kv, layer, page, kvi, slot, 0) * es;
            if (kv->dtype == MS_DTYPE_F32)
                memcpy(dst, src, (size_t)row * sizeof(float));
            else
                for (int64_t i = 0; i < row; i++)
                    store_elem(dst, kv->dtype, i, src[i]);
        }
    }
    return MS_OK;
}

static ms_status cpu_rope_kv_write(void *ctx, ms_tensor *q, ms_tensor *k, const ms_tensor *v,
                                   const ms_tensor *pos, const ms_rope_table *rope,
                                   const ms_paged_kv *kv, int32_t layer, const ms_attn_batch *b,
                                   ms_error *err) {
    MS_TRY(check_kv("rope_kv_write", kv, layer, err));
    MS_TRY(check_batch("rope_kv_write", b, kv, err));
    if (k == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "rope_kv_write: k missing");
    MS_TRY(cpu_rope(ctx, q, k, pos, rope, err));
    return cpu_kv_write(ctx, kv, layer, k, v, b, err);
}

/* ---- paged attention ---- */

typedef struct attn_job {
    const ms_tensor *q, *out;
    const ms_paged_kv *kv;
    int32_t layer;
    const ms_attn_batch *b;
    const ms_attn_params *p;
    int32_t group;   /* query heads per KV head */
    int64_t n_items; /* n_tokens * n_kv_heads */
    int32_t n_tasks;
} attn_job;

/* The segment i of n holding packed row t: the last i with indptr[i] <= t (binary search over
 * an indptr of n + 1 ascending offsets, FlashInfer's qo_indptr layout). */
static int32_t indptr_find(const int32_t *indptr, int32_t n, int32_t t) {
    int32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        int32_t mid = (lo + hi + 1) / 2;
        if (indptr[mid] <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* View of packed token t (its sequence in qo_indptr). */
static int32_t seq_of_token(const ms_attn_batch *b, int32_t t) {
    return indptr_find(b->qo_indptr, b->n_seqs, t);
}

/* Pointer to the f32 key/value row of (logical index k of view i, head g); converts into tmp
 * when the arena is not f32. */
static const float *kv_row(const attn_job *j, int32_t i, int32_t k, int32_t kvi, int32_t g,
                           float *tmp) {
    const ms_paged_kv *kv = j->kv;
    int32_t ps = kv->page_size;
    int32_t page = j->b->kv_indices[j->b->kv_indptr[i] + k / ps];
    int64_t off = ms_paged_kv_offset(kv, j->layer, page, kvi, k % ps, g);
    if (kv->dtype == MS_DTYPE_F32)
        return (const float *)kv->data + off;
    const char *src = (const char *)kv->data + (size_t)off * ms_dtype_size(kv->dtype);
    for (int32_t d = 0; d < kv->head_dim; d++)
        tmp[d] = load_elem(src, kv->dtype, d);
    return tmp;
}

/* One key of the online softmax (Milakov & Gimelshein 2018, as FlashAttention): for each of nh
 * heads, scores s[h] against the running max m[h] and sum l[h], acc[h][0..d) += e * vr. Shared by
 * the paged and the dense attention so both round the same way. */
static inline void attn_online_update(int32_t nh, int32_t d, const float *s, const float *vr,
                                      float *m, float *l,
                                      float (*acc)[MS_CPU_MAX_HEAD_DIM]) {
    for (int32_t h = 0; h < nh; h++) {
        if (s[h] > m[h]) {
            float corr = expf(m[h] - s[h]); /* 0 when m was -inf */
            l[h] *= corr;
            for (int32_t x = 0; x < d; x++)
                acc[h][x] *= corr;
            m[h] = s[h];
        }
        float e = expf(s[h] - m[h]);
        l[h] += e;
        for (int32_t x = 0; x < d; x++)
            acc[h][x] += e * vr[x];
    }
}

/* Row t of out, heads head0 .. head0 + nh: acc / l (0 for a row that saw no key). */
static inline void attn_write_heads(const ms_tensor *out, int64_t t, int32_t head0, int32_t nh,
                                    int32_t d, const float *l,
                                    float (*acc)[MS_CPU_MAX_HEAD_DIM]) {
    for (int32_t h = 0; h < nh; h++) {
        float *o = (float *)out->data + t * out->stride[0] + (int64_t)(head0 + h) * d;
        float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
        for (int32_t x = 0; x < d; x++)
            o[x] = acc[h][x] * inv;
    }
}

static void attn_task(void *arg, int32_t task, int32_t thread) {
    (void)thread;
    const attn_job *j = arg;
    const ms_attn_batch *b = j->b;
    int32_t hkv = j->kv->n_kv_heads, d = j->kv->head_dim, ps = j->kv->page_size;
    float acc[MS_CPU_ATTN_HEAD_CHUNK][MS_CPU_MAX_HEAD_DIM];
    float m[MS_CPU_ATTN_HEAD_CHUNK], l[MS_CPU_ATTN_HEAD_CHUNK], s[MS_CPU_ATTN_HEAD_CHUNK];
    float ktmp[MS_CPU_MAX_HEAD_DIM], vtmp[MS_CPU_MAX_HEAD_DIM];
    int64_t lo, hi;
    task_range(j->n_items, j->n_tasks, task, &lo, &hi);
    for (int64_t item = lo; item < hi; item++) {
        int32_t t = (int32_t)(item / hkv), g = (int32_t)(item % hkv);
        int32_t i = seq_of_token(b, t);
        int32_t np = b->kv_indptr[i + 1] - b->kv_indptr[i];
        int32_t len = np > 0 ? (np - 1) * ps + b->kv_last_page_len[i] : 0;
        int32_t q_len = b->qo_indptr[i + 1] - b->qo_indptr[i];
        int32_t start = b->kv_start[i];
        int64_t pos = (int64_t)start + len - q_len + (t - b->qo_indptr[i]);
        /* visible logical positions [k_lo, k_hi] */
        int64_t k_lo = start, k_hi = (int64_t)start + len - 1;
        if (j->p->causal && pos < k_hi)
            k_hi = pos;
        if (j->p->window > 0 && pos - j->p->window + 1 > k_lo)
            k_lo = pos - j->p->window + 1;
        for (int32_t h0 = 0; h0 < j->group; h0 += MS_CPU_ATTN_HEAD_CHUNK) {
            int32_t nh = MS_MIN(MS_CPU_ATTN_HEAD_CHUNK, j->group - h0);
            const float *qh[MS_CPU_ATTN_HEAD_CHUNK];
            for (int32_t h = 0; h < nh; h++) {
                qh[h] = (const float *)j->q->data + t * j->q->stride[0] +
                        (int64_t)(g * j->group + h0 + h) * d;
                m[h] = -INFINITY;
                l[h] = 0.0f;
                memset(acc[h], 0, (size_t)d * sizeof(float));
            }
            /* online softmax (one pass; running max and rescaled sums), keys in order */
            for (int64_t pk = k_lo; pk <= k_hi; pk++) {
                int32_t k = (int32_t)(pk - start);
                const float *kr = kv_row(j, i, k, 0, g, ktmp);
                for (int32_t h = 0; h < nh; h++)
                    s[h] = dot_f32(qh[h], kr, d) * j->p->scale;
                const float *vr = kv_row(j, i, k, 1, g, vtmp);
                attn_online_update(nh, d, s, vr, m, l, acc);
            }
            attn_write_heads(j->out, t, g * j->group + h0, nh, d, l, acc);
        }
    }
}

static ms_status cpu_attention(void *ctx, const ms_tensor *q, const ms_paged_kv *kv,
                               int32_t layer, const ms_attn_batch *b, const ms_attn_params *p,
                               ms_tensor *out, ms_error *err) {
    cpu_ctx *c = ctx;
    MS_TRY(check_kv("attention", kv, layer, err));
    MS_TRY(check_batch("attention", b, kv, err));
    MS_TRY(check_tensor("attention", "q", q, 3, 3, F32_ONLY, err));
    MS_TRY(check_tensor("attention", "out", out, 3, 3, F32_ONLY, err));
    MS_TRY(check_same_shape("attention", "q", q, "out", out, err));
    if (p == NULL || !(p->scale > 0.0f) || p->window < 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "attention: params missing or bad (scale > 0, "
                       "window >= 0)");
    if (q->shape[0] != b->n_tokens || q->shape[2] != kv->head_dim ||
        q->shape[1] % kv->n_kv_heads != 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "attention: q [%lld, %lld, %lld] must be [n_tokens %d, a multiple of "
                       "kv_heads %d, head_dim %d]", (long long)q->shape[0], (long long)q->shape[1],
                       (long long)q->shape[2], b->n_tokens, kv->n_kv_heads, kv->head_dim);
    if (out->data == q->data)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "attention: out may not alias q");
    attn_job j = {q, out, kv, layer, b, p, (int32_t)(q->shape[1] / kv->n_kv_heads),
                  (int64_t)b->n_tokens * kv->n_kv_heads, 0};
    int64_t work = MS_MAX((int64_t)b->max_kv_len * j.group * kv->head_dim, 1);
    j.n_tasks = n_tasks_for(c, j.n_items, MS_MAX(65536 / work, 1));
    ms_threadpool_run(c->pool, j.n_tasks, attn_task, &j);
    return MS_OK;
}

/* ---- dense attention (the step's own K/V rows, no pages) ---- */

typedef struct dense_job {
    const ms_tensor *q, *k, *v, *out;
    const ms_dense_batch *db;
    const ms_attn_params *p;
    int32_t group;   /* query heads per KV head */
    int32_t hkv, d;
    int64_t n_items; /* n_tokens * n_kv_heads */
    int32_t n_tasks;
} dense_job;

/* Segment of packed row t (its window in the host offsets). */
static int32_t dense_seg_of(const ms_dense_batch *db, int32_t t) {
    return indptr_find(db->indptr, db->n_seqs, t);
}

/* One (row, KV head) item per iteration: the same online softmax, key order and head chunks as
 * attn_task, over the rows of the item's segment. */
static void dense_task(void *arg, int32_t task, int32_t thread) {
    (void)thread;
    const dense_job *j = arg;
    const int32_t d = j->d, hkv = j->hkv;
    float acc[MS_CPU_ATTN_HEAD_CHUNK][MS_CPU_MAX_HEAD_DIM];
    float m[MS_CPU_ATTN_HEAD_CHUNK], l[MS_CPU_ATTN_HEAD_CHUNK], s[MS_CPU_ATTN_HEAD_CHUNK];
    int64_t lo, hi;
    task_range(j->n_items, j->n_tasks, task, &lo, &hi);
    for (int64_t item = lo; item < hi; item++) {
        int32_t t = (int32_t)(item / hkv), g = (int32_t)(item % hkv);
        int32_t i = dense_seg_of(j->db, t);
        int32_t r0 = j->db->indptr[i], r1 = j->db->indptr[i + 1];
        for (int32_t h0 = 0; h0 < j->group; h0 += MS_CPU_ATTN_HEAD_CHUNK) {
            int32_t nh = MS_MIN(MS_CPU_ATTN_HEAD_CHUNK, j->group - h0);
            const float *qh[MS_CPU_ATTN_HEAD_CHUNK];
            for (int32_t h = 0; h < nh; h++) {
                qh[h] = (const float *)j->q->data + t * j->q->stride[0] +
                        (int64_t)(g * j->group + h0 + h) * d;
                m[h] = -INFINITY;
                l[h] = 0.0f;
                memset(acc[h], 0, (size_t)d * sizeof(float));
            }
            for (int32_t r = r0; r < r1; r++) {
                const float *kr = (const float *)j->k->data + r * j->k->stride[0] +
                                  (int64_t)g * d;
                for (int32_t h = 0; h < nh; h++)
                    s[h] = dot_f32(qh[h], kr, d) * j->p->scale;
                const float *vr = (const float *)j->v->data + r * j->v->stride[0] +
                                  (int64_t)g * d;
                attn_online_update(nh, d, s, vr, m, l, acc);
            }
            attn_write_heads(j->out, t, g * j->group + h0, nh, d, l, acc);
        }
    }
}

static ms_status cpu_attention_dense(void *ctx, const ms_tensor *q, const ms_tensor *k,
                                     const ms_tensor *v, const ms_dense_batch *db,
                                     const ms_attn_params *p, ms_tensor *out, ms_error *err) {
    cpu_ctx *c = ctx;
    static const char *op = "attention_dense";
    if (db == NULL || db->indptr == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: dense batch missing", op);
    MS_TRY(check_tensor(op, "q", q, 3, 3, F32_ONLY, err));
    MS_TRY(check_tensor(op, "k", k, 3, 3, F32_ONLY, err));
    MS_TRY(check_tensor(op, "v", v, 3, 3, F32_ONLY, err));
    MS_TRY(check_tensor(op, "out", out, 3, 3, F32_ONLY, err));
    MS_TRY(check_same_shape(op, "q", q, "out", out, err));
    MS_TRY(check_same_shape(op, "k", k, "v", v, err));
    if (p == NULL || !(p->scale > 0.0f) || p->causal || p->window != 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: params missing or bad (scale > 0, not "
                       "causal, no window: dense attention sees its whole segment)", op);
    if (q->shape[0] != db->n_tokens || k->shape[0] != db->n_tokens ||
        q->shape[2] != k->shape[2] || q->shape[2] > MS_CPU_MAX_HEAD_DIM ||
        q->shape[1] % k->shape[1] != 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "%s: q [%lld, %lld, %lld] and k [%lld, %lld, %lld] must be [n_tokens %d, "
                       "heads (a multiple of k's), head_dim <= %d]", op, (long long)q->shape[0],
                       (long long)q->shape[1], (long long)q->shape[2], (long long)k->shape[0],
                       (long long)k->shape[1], (long long)k->shape[2], (int)db->n_tokens,
                       MS_CPU_MAX_HEAD_DIM);
    if (out->data == q->data || out->data == k->data || out->data == v->data)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: out may not alias q, k or v", op);
    /* the offsets live in backend memory, which is host memory here: check them */
    if (db->n_seqs < 1 || db->indptr[0] != 0 || db->indptr[db->n_seqs] != db->n_tokens)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: dense batch of %d segments does not cover "
                       "its %d rows", op, (int)db->n_seqs, (int)db->n_tokens);
    for (int32_t i = 0; i < db->n_seqs; i++)
        if (db->indptr[i + 1] <= db->indptr[i])
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: segment %d is empty or its offsets "
                           "decrease", op, (int)i);
    dense_job j = {q, k, v, out, db, p, (int32_t)(q->shape[1] / k->shape[1]),
                   (int32_t)k->shape[1], (int32_t)q->shape[2],
                   (int64_t)db->n_tokens * k->shape[1], 0};
    int64_t work = MS_MAX((int64_t)db->max_len * j.group * j.d, 1);
    j.n_tasks = n_tasks_for(c, j.n_items, MS_MAX(65536 / work, 1));
    ms_threadpool_run(c->pool, j.n_tasks, dense_task, &j);
    return MS_OK;
}

/* out[r] = key[r] == 0 ? a[r] : b[r] (backend.h select_rows). */
static ms_status cpu_select_rows(void *ctx, const ms_tensor *key, const ms_tensor *a,
                                 const ms_tensor *b, ms_tensor *out, ms_error *err) {
    (void)ctx;
    MS_TRY(check_tensor("select_rows", "key", key, 1, 1, I32_ONLY, err));
    MS_TRY(check_tensor("select_rows", "a", a, 2, 2, F32_ONLY, err));
    MS_TRY(check_tensor("select_rows", "b", b, 2, 2, F32_ONLY, err));
    MS_TRY(check_tensor("select_rows", "out", out, 2, 2, F32_ONLY, err));
    for (int d = 0; d < 2; d++)
        if (a->shape[d] != out->shape[d] || b->shape[d] != out->shape[d] ||
            key->shape[0] != out->shape[0])
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "select_rows: a [%lld, %lld], b [%lld, %lld] "
                           "and key [%lld] must match out [%lld, %lld]", (long long)a->shape[0],
                           (long long)a->shape[1], (long long)b->shape[0], (long long)b->shape[1],
                           (long long)key->shape[0], (long long)out->shape[0],
                           (long long)out->shape[1]);
    const int32_t *k = key->data;
    for (int64_t i = 0; i < out->shape[0]; i++)
        memmove(row_f32(out, i), row_f32(k[i * key->stride[0]] == 0 ? a : b, i),
                (size_t)out->shape[1] * sizeof(float));
    return MS_OK;
}

/* ---- logits: row gather, argmax, sampling ---- */

static ms_status cpu_gather_rows(void *ctx, const ms_tensor *x, const ms_tensor *rows,
                                 ms_tensor *out, ms_error *err) {
    (void)ctx;
    MS_TRY(check_tensor("gather_rows", "x", x, 2, 2, F32_ONLY, err));
    MS_TRY(check_tensor("gather_rows", "rows", rows, 1, 1, I32_ONLY, err));
    MS_TRY(check_tensor("gather_rows", "out", out, 2, 2, F32_ONLY, err));
    if (out->shape[0] != rows->shape[0] || out->shape[1] != x->shape[1])
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "gather_rows: out [%lld, %lld] must be [rows %lld, d %lld]",
                       (long long)out->shape[0], (long long)out->shape[1],
                       (long long)rows->shape[0], (long long)x->shape[1]);
    const int32_t *r = rows->data;
    for (int64_t i = 0; i < rows->shape[0]; i++) {
        int32_t src = r[i * rows->stride[0]];
        if (src < -1 || src >= x->shape[0])
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "gather_rows: rows[%lld] = %d outside [-1, %lld)", (long long)i, src,
                           (long long)x->shape[0]);
        float *o = row_f32(out, i);
        if (src < 0)
            memset(o, 0, (size_t)x->shape[1] * sizeof(float));
        else
            memmove(o, row_f32(x, src), (size_t)x->shape[1] * sizeof(float));
    }
    return MS_OK;
}

static ms_status cpu_argmax(void *ctx, const ms_tensor *logits, ms_tensor *ids, ms_error *err) {
    (void)ctx;
    MS_TRY(check_tensor("argmax", "logits", logits, 2, 2, F32_ONLY, err));
    MS_TRY(check_tensor("argmax", "ids", ids, 1, 1, I32_ONLY, err));
    if (ids->shape[0] != logits->shape[0])
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "argmax: ids has %lld entries for %lld rows",
                       (long long)ids->shape[0], (long long)logits->shape[0]);
    if (logits->shape[1] > INT32_MAX)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "argmax: vocabulary too large");
    for (int64_t r = 0; r < logits->shape[0]; r++) {
        int32_t id = ms_sampler_argmax(row_f32(logits, r), (int32_t)logits->shape[1]);
        if (id < 0)
            return MS_FAIL(err, MS_ERR_INTERNAL, "argmax: logits row %lld is all NaN",
                           (long long)r);
        ((int32_t *)ids->data)[r * ids->stride[0]] = id;
    }
    return MS_OK;
}

static size_t cpu_sample_workspace_size(void *ctx, int32_t m, int32_t vocab) {
    (void)ctx;
    if (m <= 0 || vocab <= 0)
        return 0;
    return (size_t)m * ms_sampler_scratch_size(vocab);
}

static ms_status cpu_sample(void *ctx, const ms_tensor *logits, const ms_sample_row *rows,
                            void *workspace, size_t workspace_bytes, ms_tensor *ids,
                            ms_error *err) {
    MS_TRY(check_tensor("sample", "logits", logits, 2, 2, F32_ONLY, err));
    MS_TRY(check_tensor("sample", "ids", ids, 1, 1, I32_ONLY, err));
    if (ids->shape[0] != logits->shape[0])
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "sample: ids has %lld entries for %lld rows",
                       (long long)ids->shape[0], (long long)logits->shape[0]);
    if (logits->shape[1] > INT32_MAX || logits->shape[0] > INT32_MAX)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "sample: logits too large");
    int32_t m = (int32_t)logits->shape[0], v = (int32_t)logits->shape[1];
    size_t need = cpu_sample_workspace_size(ctx, m, v);
    if (workspace == NULL || workspace_bytes < need)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "sample: workspace of %zu bytes, %zu needed for %d rows of %d logits",
                       workspace_bytes, need, m, v);
    if (rows == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "sample: row settings missing");
    size_t per = ms_sampler_scratch_size(v);
    for (int32_t r = 0; r < m; r++) {
        int32_t id;
        const float *z = row_f32(logits, r);
        ms_status st = MS_OK;
        bool nan = false;
        for (int32_t i = 0; i < v && !nan; i++)
            nan = isnan(z[i]);
        if (nan)
            id = MS_SAMPLE_ID_NAN; /* this row's request fails alone (backend.h) */
        else
            st = ms_sampler_sample(z, v, &rows[r], (char *)workspace + (size_t)r * per, &id,
                                   err);
        if (st != MS_OK) {
            ms_error_prefix(err, "sample: row %d: ", r);
            return st;
        }
        ((int32_t *)ids->data)[r * ids->stride[0]] = id;
    }
    return MS_OK;
}

/* ---- construction ---- */

static void cpu_free(void *ctx) {
    cpu_ctx *c = ctx;
    if (c == NULL)
        return;
    ms_threadpool_free(c->pool);
    ms_free(c);
}

ms_status ms_backend_cpu_init(ms_backend *out, const ms_backend_cpu_options *opt, ms_error *err) {
    memset(out, 0, sizeof *out);
    int32_t n = opt ? opt->n_threads : 0;
    if (n < 0 || n > MS_THREADPOOL_MAX_THREADS)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "cpu backend: n_threads %d outside [0, %d]", n,
                       MS_THREADPOOL_MAX_THREADS);
    if (n == 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        n = (int32_t)MS_MIN(MS_MAX(online, 1), 64);
    }
    cpu_ctx *c = ms_calloc(1, sizeof *c);
    if (c == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "cpu backend: out of memory");
    c->n_threads = n;
    ms_status st = ms_threadpool_init(&c->pool, n, err);
    if (st != MS_OK) {
        ms_free(c);
        return st;
    }
    ms_backend_i *f = &out->iface;
    f->name = "cpu";
    f->buffer_alloc = cpu_buffer_alloc;
    f->buffer_free = cpu_buffer_free;
    f->buffer_fill = cpu_buffer_fill;
    f->copy_to_backend = cpu_copy;
    f->copy_to_host = cpu_copy;
    f->tensor_load = cpu_tensor_load;
    f->synchronize = cpu_synchronize;
    f->attn_batch_init = cpu_attn_batch_init;
    f->attn_batch_free = cpu_attn_batch_free;
    f->attn_batch_stage = cpu_attn_batch_stage;
    f->embedding = cpu_embedding;
    f->linear = cpu_linear;
    f->rms_norm = cpu_rms_norm;
    f->add_rms_norm = cpu_add_rms_norm;
    f->rope = cpu_rope;
    f->kv_write = cpu_kv_write;
    f->rope_kv_write = cpu_rope_kv_write;
    f->attention = cpu_attention;
    f->attention_dense = cpu_attention_dense;
    f->silu_mul = cpu_silu_mul;
    f->silu_mul_linear = cpu_silu_mul_linear;
    f->rms_norm_linear = cpu_rms_norm_linear;
    f->add = cpu_add;
    f->layer_norm = cpu_layer_norm;
    f->gelu = cpu_gelu;
    f->conv1d = cpu_conv1d;
    f->gather_rows = cpu_gather_rows;
    f->select_rows = cpu_select_rows;
    f->argmax = cpu_argmax;
    f->sample_workspace_size = cpu_sample_workspace_size;
    f->sample = cpu_sample;
    f->free = cpu_free;
    out->ctx = c;
    return MS_OK;
}
