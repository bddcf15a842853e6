/*
 * bench_kernels.c - kernel micro-benchmarks on the GPU: device copy bandwidth (the limit), then
 * the paged decode attention kernel at the Llama-3.1-8B shape (32 query / 8 KV heads, head_dim
 * 128, bf16, pages of 16) for 1 x 8k, 8 x 8k and 32 x 2k contexts, each as a fraction of copy
 * bandwidth (K + V bytes read per launch / time).
 *
 * Method (the device tool's METHOD.md): random data (never zeros); the KV of several "layers" is
 * rotated so the working set is several times the L2 and repeated launches do not time the
 * cache; 3 warm-up rounds, then the median of 15 rounds, each round a back-to-back queue of one
 * launch per layer on one stream between two events. On sm_90 the launcher allows programmatic
 * dependent launch, so each launch's prologue (index loads, L2 prefetch of its first K/V rows)
 * may run during the previous launch's tail, as it runs during the rope/KV-write kernel before
 * it in a model's layer (that kernel is shorter than an attention launch, so the overlap it
 * leaves is smaller). The output is poisoned before and checked for NaN after.
 *
 * Then (or alone: `bench_kernels qgemv`; `bench_kernels attn` runs the attention table only) the
 * quantized GEMV of backend_cuda_quant.h at the Llama-3.1-8B decode shapes (fused qkv 6144 x 4096,
 * o 4096 x 4096, fused gate/up 28672 x 4096, down 4096 x 14336) for Q4_0, Q4_K, Q8_0 and Q6_K at
 * 1 and 8 x rows: random blocks (valid f16 scales) in the kernels' planar rows, as
 * many copies of the weight as make a working set of 256 MB, 3 warm-up rounds and the median of
 * 15, weight bytes read per launch / time as a fraction of copy bandwidth.
 * `bench_kernels gemv` (also in `all`): the CUDA backend's linear over bf16 weights at the same
 * shapes and the lm_head (128,256 x 4096), 1, 2, 4 and 8 x rows, with the 16-bit GEMV of
 * templates/misc/gemv.cuh and without it (MS_CUDA_GEMV=0: ms_convert +
 * cuBLAS), same method.
 * `bench_kernels sample` (also in `all`): the sampler kernel over 1 and 32 rows of 128,256 logits,
 * greedy and sampled (bench_sample).
 * Prints one table per part; exit status 0 when every case ran.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "backend.h"
#include "backend_cuda.h"
#include "backend_cuda_quant.h"
#include "cuda_ops.h"
#include "gguf_quant.h"

#define CK(expr)                                                                              \
    do {                                                                                      \
        cudaError_t ck_ = (expr);                                                             \
        if (ck_ != cudaSuccess) {                                                             \
            fprintf(stderr, "bench: %s failed: %s (line %d)\n", #expr, cudaGetErrorString(ck_), \
                    __LINE__);                                                                \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

static uint64_t rng = 88172645463325252ull;

static uint64_t next(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : (x > y ? 1 : 0);
}

/* Fill device memory with random bf16 values in [-1, 1) from a 16 MiB host pattern. */
static void fill_random(void *d, size_t bytes) {
    static uint16_t *pat;
    const size_t pat_bytes = 16u << 20;
    if (pat == NULL) {
        pat = malloc(pat_bytes);
        for (size_t i = 0; i < pat_bytes / 2; i++) {
            float f = (float)((double)(next() >> 11) * 0x1p-53 * 2.0 - 1.0);
            uint32_t u;
            memcpy(&u, &f, 4);
            pat[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
        }
    }
    for (size_t off = 0; off < bytes; off += pat_bytes) {
        size_t n = bytes - off < pat_bytes ? bytes - off : pat_bytes;
        CK(cudaMemcpy((char *)d + off, pat, n, cudaMemcpyHostToDevice));
    }
}

/* Device-to-device copy bandwidth in bytes/s (read + write counted). */
static double copy_bandwidth(void) {
    const size_t bytes = (size_t)2 << 30;
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    fill_random(a, bytes);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float t[12];
    for (int i = 0; i < 12; i++) {
        CK(cudaEventRecord(e0, 0));
        CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0));
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&t[i], e0, e1));
    }
    qsort(t + 2, 10, sizeof(float), cmp_float);
    CK(cudaFree(a));
    CK(cudaFree(b));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return 2.0 * (double)bytes / (t[2 + 5] * 1e-3);
}

/* One decode attention shape; force_splits > 0 overrides the planned split count (a sweep shows
 * whether the planner's choice is the best one); cap_keys > 0 plans the splits as the engine does
 * for a batch whose page capacity is cap_keys keys a request (backend_cuda.c: the split count from
 * the capacity, at least 4 pages a split), while the views hold ctx keys: the splits past a view's
 * end are launched and exit (a decode step of a request shorter than the model's context). */
static int bench_decode_cap(int arch, int n_sms, double copy_bw, int batch, int ctx, int force_splits,
                            int cap_keys);
static int bench_decode(int arch, int n_sms, double copy_bw, int batch, int ctx, int force_splits) {
    return bench_decode_cap(arch, n_sms, copy_bw, batch, ctx, force_splits, 0);
}
static int bench_decode_cap(int arch, int n_sms, double copy_bw, int batch, int ctx, int force_splits,
                            int cap_keys) {
    const int hq = 32, hkv = 8, hd = 128, ps = 16, G = hq / hkv;
    const int pages_per_req = ctx / ps;
    const int pages = batch * pages_per_req + 1; /* + the sink page */
    const size_t layer_bytes = (size_t)pages * 2 * ps * hkv * hd * 2;
    const size_t kv_bytes = (size_t)batch * ctx * hkv * hd * 2 * 2; /* K + V read per launch */
    int layers = (int)((size_t)(256u << 20) / layer_bytes) + 2;
    if (layers > 32)
        layers = 32;
    ms_error err = {0};
    ms_kernel_spec s = ms_kernel_spec_attn_decode(MS_KERNEL_DTYPE_BF16, hd, ps, G, false);
    ms_cuda_module *m = NULL;
    if (ms_cuda_module_init(&m, &s, arch, NULL, &err) != MS_OK) {
        fprintf(stderr, "bench: %s\n", err.msg);
        return 1;
    }
    char *arena;
    CK(cudaMalloc((void **)&arena, layer_bytes * (size_t)layers));
    fill_random(arena, layer_bytes * (size_t)layers);
    void *q, *o;
    CK(cudaMalloc(&q, (size_t)batch * hq * hd * 2));
    CK(cudaMalloc(&o, (size_t)batch * hq * hd * 2));
    fill_random(q, (size_t)batch * hq * hd * 2);
    int32_t *h_qo = malloc(sizeof(int32_t) * (size_t)(batch + 1));
    int32_t *h_kvp = malloc(sizeof(int32_t) * (size_t)(batch + 1));
    int32_t *h_idx = malloc(sizeof(int32_t) * (size_t)batch * pages_per_req);
    int32_t *h_last = malloc(sizeof(int32_t) * (size_t)batch);
    int32_t *h_start = calloc((size_t)batch, sizeof(int32_t));
    for (int b = 0; b <= batch; b++) {
        h_qo[b] = b;
        h_kvp[b] = b * pages_per_req;
    }
    for (int i = 0; i < batch * pages_per_req; i++)
        h_idx[i] = 1 + i;
    for (int i = batch * pages_per_req - 1; i > 0; i--) { /* scattered pages, as after churn */
        int j = (int)(next() % (uint64_t)(i + 1));
        int t = h_idx[i];
        h_idx[i] = h_idx[j];
        h_idx[j] = t;
    }
    for (int b = 0; b < batch; b++)
        h_last[b] = ps;
    int32_t *d_qo, *d_kvp, *d_idx, *d_last, *d_start;
    CK(cudaMalloc((void **)&d_qo, sizeof(int32_t) * (size_t)(batch + 1)));
    CK(cudaMalloc((void **)&d_kvp, sizeof(int32_t) * (size_t)(batch + 1)));
    CK(cudaMalloc((void **)&d_idx, sizeof(int32_t) * (size_t)batch * pages_per_req));
    CK(cudaMalloc((void **)&d_last, sizeof(int32_t) * (size_t)batch));
    CK(cudaMalloc((void **)&d_start, sizeof(int32_t) * (size_t)batch));
    CK(cudaMemcpy(d_qo, h_qo, sizeof(int32_t) * (size_t)(batch + 1), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_kvp, h_kvp, sizeof(int32_t) * (size_t)(batch + 1), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_idx, h_idx, sizeof(int32_t) * (size_t)batch * pages_per_req,
                  cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_last, h_last, sizeof(int32_t) * (size_t)batch, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d_start, h_start, sizeof(int32_t) * (size_t)batch, cudaMemcpyHostToDevice));
    int n_splits = 1, pps = pages_per_req;
    ms_kernel_attn_decode_split(batch, hkv, cap_keys > 0 ? cap_keys / ps : pages_per_req,
                              n_sms * m->blocks_per_sm, 4, MS_ATTN_DECODE_MAX_SPLITS, &n_splits, &pps);
    if (cap_keys > 0)
        pps = 4; /* as backend_cuda.c: the least pages a split covers; each view sizes its own */
    if (force_splits > 0) {
        pps = (pages_per_req + force_splits - 1) / force_splits;
        n_splits = (pages_per_req + pps - 1) / pps;
    }
    float *part_o, *part_lse;
    int *counters;
    CK(cudaMalloc((void **)&part_o, sizeof(float) * (size_t)batch * n_splits * hq * hd));
    CK(cudaMalloc((void **)&part_lse, sizeof(float) * (size_t)batch * n_splits * hq));
    CK(cudaMalloc((void **)&counters, sizeof(int) * (size_t)batch * hkv));
    CK(cudaMemset(counters, 0, sizeof(int) * (size_t)batch * hkv));
    CK(cudaMemset(o, 0xff, (size_t)batch * hq * hd * 2));

    ms_attn_kernel_params p = {0};
    p.q = q;
    p.o = o;
    p.qo_indptr = d_qo;
    p.kv_indptr = d_kvp;
    p.kv_indices = d_idx;
    p.kv_last_page_len = d_last;
    p.kv_start = d_start;
    p.part_o = part_o;
    p.part_lse = part_lse;
    p.split_counter = counters;
    p.batch = batch;
    p.n_q_heads = hq;
    p.n_kv_heads = hkv;
    p.q_stride = p.o_stride = hq * hd;
    p.n_splits = n_splits;
    p.pages_per_split = pps;
    p.sm_scale = 1.f / sqrtf((float)hd);
    cudaStream_t stream; /* a created stream, as the backend's (not the legacy default one) */
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CK(cudaDeviceSynchronize()); /* the set-up copies and memsets above ran on the default stream */
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    enum { WARM = 3, REPS = 15 };
    float t[WARM + REPS], th[WARM + REPS];
    for (int r = 0; r < WARM + REPS; r++) {
        CK(cudaEventRecord(e0, stream));
        struct timespec h0, h1;
        clock_gettime(CLOCK_MONOTONIC, &h0);
        for (int l = 0; l < layers; l++) {
            p.kv = arena + (size_t)l * layer_bytes;
            if (ms_cuda_attn_decode_launch(m, &p, stream, &err) != MS_OK) {
                fprintf(stderr, "bench: %s\n", err.msg);
                return 1;
            }
        }
        clock_gettime(CLOCK_MONOTONIC, &h1);
        /* host time to enqueue one launch: when it is close to the GPU time per launch, the
         * launches are host-bound and the GPU waits between kernels */
        th[r] = (float)(((double)(h1.tv_sec - h0.tv_sec) * 1e3 +
                         (double)(h1.tv_nsec - h0.tv_nsec) * 1e-6) / layers);
        CK(cudaEventRecord(e1, stream));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&t[r], e0, e1));
        t[r] /= (float)layers;
    }
    qsort(t + WARM, REPS, sizeof(float), cmp_float);
    qsort(th + WARM, REPS, sizeof(float), cmp_float);
    double ms = t[WARM + REPS / 2], host_ms = th[WARM + REPS / 2];
    double bw = (double)kv_bytes / (ms * 1e-3);
    uint16_t *h_o = malloc((size_t)batch * hq * hd * 2);
    CK(cudaMemcpy(h_o, o, (size_t)batch * hq * hd * 2, cudaMemcpyDeviceToHost));
    size_t nan = 0;
    for (size_t i = 0; i < (size_t)batch * hq * hd; i++)
        nan += (h_o[i] & 0x7f80u) == 0x7f80u;
    char cap[32] = "";
    if (cap_keys > 0)
        snprintf(cap, sizeof cap, " (cap %d)", cap_keys);
    printf("| decode attn %3d x %5d | %-34s | %3d%s%s | %d | %6d | %9.1f | %6.1f | %7.0f | %5.1f%% |%s\n",
           batch, ctx, m->uri, n_splits, force_splits > 0 ? " (forced)" : "", cap, m->blocks_per_sm,
           layers, ms * 1e3, host_ms * 1e3, bw * 1e-9, 100.0 * bw / copy_bw,
           nan ? " NaN in output!" : "");
    free(h_o);
    free(h_qo);
    free(h_kvp);
    free(h_idx);
    free(h_last);
    free(h_start);
    CK(cudaFree(arena));
    CK(cudaFree(q));
    CK(cudaFree(o));
    CK(cudaFree(d_qo));
    CK(cudaFree(d_kvp));
    CK(cudaFree(d_idx));
    CK(cudaFree(d_last));
    CK(cudaFree(d_start));
    CK(cudaFree(part_o));
    CK(cudaFree(part_lse));
    CK(cudaFree(counters));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaStreamDestroy(stream));
    ms_cuda_module_free(m);
    return nan ? 1 : 0;
}

/* The method's timing: 3 warm-up rounds, then the median of 15, each round `copies` calls of
 * launch(ctx, i) (i = 0 .. copies - 1, queued on stream) between two events; microseconds per call,
 * or a negative value when a launch failed (its message printed). */
static double time_rounds(cudaStream_t stream, int copies, ms_status (*launch)(void *ctx, int i, ms_error *err),
                          void *ctx) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    float t[18];
    ms_error err = {0};
    for (int r = 0; r < 18; r++) {
        CK(cudaEventRecord(e0, stream));
        for (int i = 0; i < copies; i++)
            if (launch(ctx, i, &err) != MS_OK) {
                fprintf(stderr, "bench: %s\n", err.msg);
                CK(cudaEventDestroy(e0));
                CK(cudaEventDestroy(e1));
                return -1.0;
            }
        CK(cudaEventRecord(e1, stream));
        CK(cudaEventSynchronize(e1));
        CK(cudaEventElapsedTime(&t[r], e0, e1));
        t[r] /= (float)copies;
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    qsort(t + 3, 15, sizeof(float), cmp_float);
    return t[3 + 7] * 1e3;
}

/* One quantized GEMV launch of bench_qgemv: x [n, in] against weight copy i into y. */
typedef struct qgemv_ctx {
    ms_cuda_quant *q;
    const float *x;
    float *y;
    const ms_cuda_qweight *w;
    int n, in, rows;
} qgemv_ctx;

static ms_status qgemv_launch(void *ctx, int i, ms_error *err) {
    const qgemv_ctx *c = ctx;
    return ms_cuda_quant_linear(c->q, c->x, c->n, c->in, &c->w[i], c->y, c->rows, false, err);
}

/* One quantized GEMV shape: y [n, rows] = x [n, in] W^T, W of ggml type `type`. */
static int bench_qgemv(int arch, double copy_bw, uint32_t type, int rows, int in, int n) {
    cudaStream_t stream;
    cublasHandle_t cublas;
    CK(cudaStreamCreate(&stream));
    if (cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS || cublasSetStream(cublas, stream) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "bench: cuBLAS init failed\n");
        return 1;
    }
    ms_error err = {0};
    ms_cuda_quant *q = NULL;
    if (ms_cuda_quant_init(&q, arch, getenv("MSTAR_CACHE"), stream, cublas, &err) != MS_OK ||
        ms_cuda_quant_load_type(q, type, &err) != MS_OK) {
        fprintf(stderr, "bench: %s\n", err.msg);
        return 1;
    }
    const size_t bytes = ms_cuda_qweight_bytes(type, rows, in);
    int copies = (int)((((size_t)256 << 20) + bytes - 1) / bytes);
    if (copies < 2)
        copies = 2;
    ms_cuda_qweight *w = calloc((size_t)copies, sizeof *w);
    if (w == NULL)
        exit(1);
    for (int i = 0; i < copies; i++) {
        if (ms_cuda_qweight_init(&w[i], type, rows, in, &err) != MS_OK) {
            fprintf(stderr, "bench: %s\n", err.msg);
            return 1;
        }
        fill_random(w[i].data, bytes); /* bf16 patterns in [-1, 1): finite f16 scales too */
    }
    float *x, *y;
    CK(cudaMalloc((void **)&x, sizeof(float) * (size_t)n * (size_t)in));
    CK(cudaMalloc((void **)&y, sizeof(float) * (size_t)n * (size_t)rows));
    CK(cudaMemset(x, 0, sizeof(float) * (size_t)n * (size_t)in));
    fill_random(x, sizeof(float) * (size_t)n * (size_t)in / 2); /* half the floats: random bits, finite */
    const bool wide = ms_cuda_qweight_wide_rows(&w[0]);
    qgemv_ctx qc = {q, x, y, w, n, in, rows};
    const double us = time_rounds(stream, copies, qgemv_launch, &qc);
    if (us < 0)
        return 1;
    const double gbs = (double)bytes / (us * 1e-6) * 1e-9;
    printf("| %s | %d x %d | %d | %s | %.1f | %.0f | %.1f%% |\n", ms_ggml_type_name(type), rows, in, n,
           wide ? "16-byte" : "2-byte", us, gbs, 100.0 * gbs * 1e9 / copy_bw);
    for (int i = 0; i < copies; i++)
        ms_cuda_qweight_free(&w[i]);
    free(w);
    CK(cudaFree(x));
    CK(cudaFree(y));
    ms_cuda_quant_free(q);
    cublasDestroy(cublas);
    CK(cudaStreamDestroy(stream));
    return 0;
}

/* One linear of bench_gemv: x [n, in] against weight copy i into y, through the backend. */
typedef struct gemv_ctx {
    ms_backend *be;
    ms_tensor x, y, *w;
} gemv_ctx;

static ms_status gemv_launch(void *ctx, int i, ms_error *err) {
    gemv_ctx *c = ctx;
    return c->be->iface.linear(c->be->ctx, &c->x, &c->w[i], NULL, &c->y, err);
}

/* y [n, rows] = x [n, in] W^T with W bf16, through a CUDA backend made with the GEMV on for
 * every x row count (MS_CUDA_GEMV=8) or off (0: convert + cuBLAS). */
static int bench_gemv(double copy_bw, int rows, int in, int n, bool ours) {
    setenv("MS_CUDA_GEMV", ours ? "8" : "0", 1);
    ms_backend be;
    ms_error err = {0};
    ms_backend_cuda_options opt = {0, getenv("MSTAR_CACHE")};
    if (ms_backend_cuda_init(&be, &opt, &err) != MS_OK) {
        fprintf(stderr, "bench: %s\n", err.msg);
        return 1;
    }
    const size_t bytes = (size_t)rows * (size_t)in * 2;
    int copies = (int)((((size_t)256 << 20) + bytes - 1) / bytes);
    if (copies < 2)
        copies = 2;
    ms_tensor *w = calloc((size_t)copies, sizeof *w);
    void *xd = NULL, *yd = NULL;
    if (w == NULL)
        exit(1);
    for (int i = 0; i < copies; i++) {
        void *d = NULL;
        if (be.iface.buffer_alloc(be.ctx, bytes, "bench weight", &d, &err) != MS_OK) {
            fprintf(stderr, "bench: %s\n", err.msg);
            return 1;
        }
        fill_random(d, bytes);
        w[i] = ms_tensor_2d(d, MS_DTYPE_BF16, rows, in);
    }
    if (be.iface.buffer_alloc(be.ctx, sizeof(float) * (size_t)n * (size_t)in, "bench x", &xd, &err) != MS_OK ||
        be.iface.buffer_alloc(be.ctx, sizeof(float) * (size_t)n * (size_t)rows, "bench y", &yd, &err) != MS_OK) {
        fprintf(stderr, "bench: %s\n", err.msg);
        return 1;
    }
    CK(cudaMemset(xd, 0, sizeof(float) * (size_t)n * (size_t)in));
    fill_random(xd, sizeof(float) * (size_t)n * (size_t)in / 2);
    gemv_ctx gc = {&be, ms_tensor_2d(xd, MS_DTYPE_F32, n, in), ms_tensor_2d(yd, MS_DTYPE_F32, n, rows), w};
    const double us = time_rounds((cudaStream_t)ms_backend_cuda_stream(&be), copies, gemv_launch, &gc);
    int rc = 0;
    if (us < 0)
        rc = 1;
    else {
        const double gbs = (double)bytes / (us * 1e-6) * 1e-9;
        printf("| %s | %d x %d | %d | %.1f | %.0f | %.1f%% |\n", ours ? "ms_gemv" : "convert + cuBLAS", rows, in,
               n, us, gbs, 100.0 * gbs * 1e9 / copy_bw);
    }
    for (int i = 0; i < copies; i++)
        be.iface.buffer_free(be.ctx, w[i].data);
    be.iface.buffer_free(be.ctx, xd);
    be.iface.buffer_free(be.ctx, yd);
    free(w);
    ms_backend_free(&be);
    unsetenv("MS_CUDA_GEMV");
    return rc;
}

/* One sampler launch of bench_sample: copy i of the rows (rows x vocab logits apart). */
typedef struct sample_ctx {
    const ms_cuda_module *m;
    ms_sample_params p; /* copy 0 */
    size_t copy_floats;
    cudaStream_t stream;
} sample_ctx;

static ms_status sample_launch(void *ctx, int i, ms_error *err) {
    const sample_ctx *c = ctx;
    ms_sample_params p = c->p;
    p.logits = (const float *)c->p.logits + (size_t)i * c->copy_floats;
    return ms_cuda_sample_launch(c->m, &p, c->stream, err);
}

/* The sampler kernel (templates/sample/sample.cuh, one CTA per row) over rows x 128,256 float
 * logits (Llama 3's vocabulary), as the engine launches it after the lm_head: greedy (temperature
 * 0: the argmax) and sampled (T 0.8, top-k 40, top-p 0.95). Logits: random values (a sum of two
 * uniforms times 4), so the top-k / top-p searches cut inside a dense set of values. The rows are
 * rotated over 16 copies (8 MB per row of a copy set: L2-resident, as after the lm_head). */
static int bench_sample(int arch, int rows, bool sampled) {
    const int vocab = 128256, copies = 16;
    ms_error err = {0};
    ms_kernel_spec s = ms_kernel_spec_simple(MS_KERNEL_OP_SAMPLE, MS_KERNEL_DTYPE_F32);
    ms_cuda_module *m = NULL;
    if (ms_cuda_module_init(&m, &s, arch, NULL, &err) != MS_OK) {
        fprintf(stderr, "bench: %s\n", err.msg);
        return 1;
    }
    const size_t n = (size_t)copies * rows * vocab;
    float *h = malloc(sizeof(float) * n), *hp = malloc(sizeof(float) * 3 * (size_t)rows);
    int *hk = malloc(sizeof(int) * (size_t)rows);
    if (h == NULL || hp == NULL || hk == NULL)
        exit(1);
    for (size_t i = 0; i < n; i++)
        h[i] = (float)((double)(next() >> 40) * 0x1p-24 + (double)(next() >> 40) * 0x1p-24) * 4.f;
    for (int r = 0; r < rows; r++) {
        hp[r] = sampled ? 0.8f : 0.f;
        hp[rows + r] = sampled ? 0.95f : 1.f;
        hp[2 * rows + r] = (float)((double)(next() >> 40) * 0x1p-24);
        hk[r] = sampled ? 40 : 0;
    }
    float *dl, *dt, *dp, *du;
    int *dk, *ids;
    CK(cudaMalloc((void **)&dl, sizeof(float) * n));
    CK(cudaMalloc((void **)&dt, sizeof(float) * (size_t)rows));
    CK(cudaMalloc((void **)&dp, sizeof(float) * (size_t)rows));
    CK(cudaMalloc((void **)&du, sizeof(float) * (size_t)rows));
    CK(cudaMalloc((void **)&dk, sizeof(int) * (size_t)rows));
    CK(cudaMalloc((void **)&ids, sizeof(int) * (size_t)rows));
    CK(cudaMemcpy(dl, h, sizeof(float) * n, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dt, hp, sizeof(float) * (size_t)rows, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dp, hp + rows, sizeof(float) * (size_t)rows, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(du, hp + 2 * rows, sizeof(float) * (size_t)rows, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(dk, hk, sizeof(int) * (size_t)rows, cudaMemcpyHostToDevice));
    cudaStream_t stream;
    CK(cudaStreamCreate(&stream));
    sample_ctx sx = {m, {dl, dt, dk, dp, du, ids, rows, vocab, vocab, NULL}, (size_t)rows * vocab, stream};
    const double us = time_rounds(stream, copies, sample_launch, &sx);
    if (us < 0)
        return 1;
    int got = -2;
    CK(cudaMemcpy(&got, ids, sizeof got, cudaMemcpyDeviceToHost));
    printf("| %s | %d x %d | %.1f | %d |\n", sampled ? "T 0.8, top-k 40, top-p 0.95" : "greedy", rows, vocab, us,
           got);
    cudaFree(dl);
    cudaFree(dt);
    cudaFree(dp);
    cudaFree(du);
    cudaFree(dk);
    cudaFree(ids);
    free(h);
    free(hp);
    free(hk);
    CK(cudaStreamDestroy(stream));
    ms_cuda_module_free(m);
    return got >= 0 && got < vocab ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "qgemv") == 0 && argc != 2 && argc != 6) {
        fprintf(stderr, "usage: bench_kernels qgemv [TYPE ROWS IN N]\n");
        return 2;
    }
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        fprintf(stderr, "bench_kernels: no CUDA device\n");
        return 1;
    }
    int arch = 0, sms = 0;
    ms_error err = {0};
    if (ms_cuda_device_arch(0, &arch, &sms, &err) != MS_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    double bw = copy_bandwidth();
    printf("device: %s, sm_%d, %d SMs, L2 %d MB; copy bandwidth %.0f GB/s (read + write, 2 GiB, "
           "median of 10)\n\n",
           prop.name, arch, sms, prop.l2CacheSize >> 20, bw * 1e-9);
    const char *part = argc > 1 ? argv[1] : "all";
    if (strcmp(part, "all") != 0 && strcmp(part, "attn") != 0 && strcmp(part, "qgemv") != 0 &&
        strcmp(part, "sample") != 0 && strcmp(part, "gemv") != 0) {
        fprintf(stderr, "usage: bench_kernels [all|attn|qgemv|gemv|sample]\n");
        return 2;
    }
    int rc = 0;
    if (strcmp(part, "all") == 0 || strcmp(part, "sample") == 0) {
        printf("sampler (templates/sample/sample.cuh, one CTA per row, float logits)\n\n"
               "| mode | rows x vocab | us/launch | first id |\n|---|---|---|---|\n");
        for (int sampled = 0; sampled <= 1; sampled++)
            for (int rows = 1; rows <= 32; rows *= 32)
                rc |= bench_sample(arch, rows, sampled != 0);
        printf("\n");
        if (strcmp(part, "sample") == 0)
            return rc;
    }
    if (strcmp(part, "all") == 0 || strcmp(part, "gemv") == 0) {
        printf("bf16 linear at decode sizes (backend_cuda.c cu_linear): weight bytes / time, as a fraction "
               "of copy bandwidth\n\n| path | rows x in | x rows | us/launch | GB/s | of copy |\n"
               "|---|---|---|---|---|---|\n");
        static const int gshapes[][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}, {128256, 4096}};
        for (size_t sh = 0; sh < sizeof gshapes / sizeof gshapes[0]; sh++)
            for (int xr = 1; xr <= 8; xr *= 2)
                for (int ours = 1; ours >= 0; ours--)
                    rc |= bench_gemv(bw, gshapes[sh][0], gshapes[sh][1], xr, ours != 0);
        printf("\n");
        if (strcmp(part, "gemv") == 0)
            return rc;
    }
    if (strcmp(part, "qgemv") == 0 && argc == 6) { /* one case (for ncu): qgemv TYPE ROWS IN N */
        uint32_t t = UINT32_MAX;
        for (uint32_t k = 0; k < 64; k++)
            if (strcasecmp(ms_ggml_type_name(k), argv[2]) == 0)
                t = k;
        if (t == UINT32_MAX) {
            fprintf(stderr, "bench_kernels: unknown ggml type '%s'\n", argv[2]);
            return 2;
        }
        printf("| type | rows x in | x rows | row loads | us/launch | GB/s | of copy |\n"
               "|---|---|---|---|---|---|---|\n");
        return bench_qgemv(arch, bw, t, atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
    }
    if (strcmp(part, "attn") != 0) {
        printf("quantized GEMV (backend_cuda_quant.h): weight bytes / time, as a fraction of copy bandwidth "
               "(read + write traffic of a copy: the DRAM's usable total)\n\n");
        printf("| type | rows x in | x rows | row loads | us/launch | GB/s | of copy |\n"
               "|---|---|---|---|---|---|---|\n");
        static const uint32_t qt[] = {MS_GGML_TYPE_Q4_0, MS_GGML_TYPE_Q4_K, MS_GGML_TYPE_Q8_0, MS_GGML_TYPE_Q6_K};
        static const int shapes[][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
        for (size_t t = 0; t < sizeof qt / sizeof qt[0]; t++)
            for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                for (int xr = 1; xr <= 8; xr += 7)
                    rc |= bench_qgemv(arch, bw, qt[t], shapes[s][0], shapes[s][1], xr);
        printf("\n");
        if (strcmp(part, "qgemv") == 0)
            return rc;
    }
    printf("decode attention: one launch per layer, back to back on one stream%s\n\n",
           arch >= 90 ? "; programmatic dependent launch: each launch's prologue and L2 prefetch "
                        "overlap the previous launch's tail"
                      : "");
    printf("| case | kernel | splits | CTAs/SM | layers | us/launch | host us/launch | GB/s | of copy |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");
    rc |= bench_decode(arch, sms, bw, 1, 8192, 0);
    rc |= bench_decode(arch, sms, bw, 8, 8192, 0);
    rc |= bench_decode(arch, sms, bw, 32, 2048, 0);
    rc |= bench_decode(arch, sms, bw, 128, 640, 0);
    rc |= bench_decode(arch, sms, bw, 1, 32768, 0);
    /* batch 1 against context: the intercept is the per-launch latency floor */
    rc |= bench_decode(arch, sms, bw, 1, 512, 0);
    /* the 8B bench's decode (prompt 512 + 128 new) in a 4096-key capacity, as the engine plans it */
    rc |= bench_decode_cap(arch, sms, bw, 1, 576, 0, 4096);
    rc |= bench_decode_cap(arch, sms, bw, 1, 2048, 0, 4096);
    rc |= bench_decode_cap(arch, sms, bw, 8, 576, 0, 4096);
    rc |= bench_decode(arch, sms, bw, 1, 2048, 0);
    rc |= bench_decode(arch, sms, bw, 1, 16384, 0);
    rc |= bench_decode(arch, sms, bw, 32, 8192, 0);
    /* the planner's split count against others */
    static const int sweep[] = {8, 16, 24, 32, 64};
    for (size_t i = 0; i < sizeof sweep / sizeof sweep[0]; i++)
        rc |= bench_decode(arch, sms, bw, 1, 8192, sweep[i]);
    rc |= bench_decode(arch, sms, bw, 8, 8192, 4);
    rc |= bench_decode(arch, sms, bw, 8, 8192, 12);
    rc |= bench_decode(arch, sms, bw, 32, 2048, 2);
    return rc;
}
