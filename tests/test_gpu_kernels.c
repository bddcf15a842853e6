/*
 * test_gpu_kernels.c - every kernel template against a plain C reference on fresh random inputs
 * (GPU_TESTS: run by `make gpu-test` on a machine with a GPU).
 *
 * Each run draws a new seed (printed; MS_TEST_SEED=N repeats it). Every output buffer and the
 * whole KV page arena are poisoned with 0xFF bytes (NaN in bf16 and f32) before each launch, so an
 * element the kernel forgets to write, or a page slot it reads without owning, shows up as NaN;
 * any NaN fails. References run in double on the bf16-rounded inputs (the sampler's draw mirrors
 * the kernel's float summation order, see ref_sample). Relative error is ||out - ref|| / ||ref||
 * over all elements; the tolerances per op, and why:
 *   attn decode     1e-2  scores, softmax and accumulation in f32; output rounded to bf16 (2^-9)
 *   attn prefill    2e-2  P is rounded to bf16 for the PV tensor-core product, output to bf16
 *   rope_kv         1e-2  f32 angle (as Hugging Face), output rounded to bf16; v copied bit-exact
 *   rmsnorm         1e-2  f32 sum of squares, output rounded to bf16; residual bit-exact
 *   rmsnorm_heads   1e-2  (bf16 activations) / 1e-5 (f32 activations, as the CUDA backend runs
 *                         it: f32 sums and rsqrtf); columns it does not own stay bit-exact
 *   rope_kv M-RoPE  1e-2  as rope_kv, each pair's position from its section's stream
 *   prefill as decode 2e-2  as attn prefill (head_dim 48, one query row per view)
 *   silu_mul        1e-2  f32, output rounded to bf16
 *   gemv            each output within 2^-14 of sum |x w| (float accumulation of T-rounded x
 *                   and T weights, bf16 and f16), bitwise equal over two launches
 *   embed, argmax: exact; sample: exact kept set, the draw equal to a reference that sums in the
 *   kernel's float order (or within 1e-5 of the mass of a boundary: exp2f may differ by an ulp).
 * Shapes cover page boundaries (lengths 1, ps, ps+1, many pages), GQA 1/4/8, head_dim 64/128
 * (and the fixtures' 16), page sizes 16/128, ragged prefill batches, windows with released
 * pages (kv_start > 0), split-KV decode with the merge.
 */
#include "ms_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_ops.h"

#include "ms_test_impl.h"

/* ---- globals: device, arch, RNG ---- */

static int g_arch;
static int g_sms;
static const char *g_cache;
static uint64_t g_rng;

static uint64_t rng_next(void) {
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static float frand(void) { return (float)((double)(rng_next() >> 11) * 0x1p-53 * 2.0 - 1.0); }
static int irand(int n) { return (int)(rng_next() % (uint64_t)n); }

static uint16_t f2bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return 0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static float bf2f(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round a float through bf16. */
static float rbf(float f) { return bf2f(f2bf(f)); }

/* ---- device buffers (freed at the end of each test) ---- */

#define CK(expr)                                                                                  \
    do {                                                                                          \
        cudaError_t ck_ = (expr);                                                                 \
        if (ck_ != cudaSuccess)                                                                   \
            fail_msg("%s failed: %s", #expr, cudaGetErrorString(ck_));                            \
    } while (0)

typedef struct dev_list {
    void *p[64];
    int n;
} dev_list;

/* cudaMalloc + poison with 0xFF (NaN for bf16 and f32, -1 for int32). */
static void *dalloc(dev_list *l, size_t bytes) {
    assert_true(l->n < 64);
    void *p = NULL;
    CK(cudaMalloc(&p, bytes > 0 ? bytes : 16));
    CK(cudaMemset(p, 0xff, bytes > 0 ? bytes : 16));
    l->p[l->n++] = p;
    return p;
}

static void *dup_h2d(dev_list *l, const void *h, size_t bytes) {
    void *p = dalloc(l, bytes);
    if (bytes > 0)
        CK(cudaMemcpy(p, h, bytes, cudaMemcpyHostToDevice));
    return p;
}

static void d2h(void *h, const void *d, size_t bytes) {
    CK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}


static void dfree_all(dev_list *l) {
    for (int i = 0; i < l->n; i++)
        CK(cudaFree(l->p[i]));
    l->n = 0;
}

static ms_cuda_module *load(ms_kernel_spec s) {
    ms_error err = {0};
    ms_cuda_module *m = NULL;
    ms_status st = ms_cuda_module_init(&m, &s, g_arch, g_cache, &err);
    if (st != MS_OK)
        fail_msg("loading kernel: %s", err.msg);
    return m;
}

static void sync_ok(const char *what) {
    cudaError_t e = cudaDeviceSynchronize();
    if (e != cudaSuccess)
        fail_msg("%s: kernel failed: %s", what, cudaGetErrorString(e));
}

/* ---- comparison ---- */

/* Compare n bf16 outputs with a double reference; fails on NaN or rel error > tol. */
static void check_close(const char *what, const uint16_t *got, const double *ref, size_t n,
                        double tol) {
    double num = 0, den = 0, max_abs = 0;
    size_t nan = 0, worst = 0;
    for (size_t i = 0; i < n; i++) {
        double g = bf2f(got[i]);
        if (isnan(g) || isinf(g)) {
            if (nan++ < 3)
                fprintf(stderr, "  %s: element %zu is %g (ref %g)\n", what, i, g, ref[i]);
            continue;
        }
        double d = fabs(g - ref[i]);
        num += d * d;
        den += ref[i] * ref[i];
        if (d > max_abs) {
            max_abs = d;
            worst = i;
        }
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    printf("  %-58s rel %.2e  max|d| %.2e  (tol %.0e)%s\n", what, rel, max_abs, tol,
           nan ? "  NaN!" : "");
    if (nan > 0 || !(rel <= tol)) {
        fprintf(stderr, "  %s: worst element %zu got %g ref %g\n", what, worst, bf2f(got[worst]),
                ref[worst]);
        fail_msg("%s: %zu NaN/inf, relative error %.3e (tolerance %.0e)", what, nan, rel, tol);
    }
}

/* ---- paged KV fixture ---- */

typedef struct req {
    int n_q;    /* query rows this step */
    int length; /* keys present after the step's writes */
    int start;  /* logical position of key 0 */
} req;

typedef struct paged {
    int hd, ps, hkv, batch;
    int n_pages;          /* arena pages (page 0 = sink, unused) */
    uint16_t *arena;      /* [n_pages, 2, ps, hkv, hd] */
    int32_t qo[65], kvp[65], last[64], start[64];
    int32_t *indices;     /* [kvp[batch]] */
} paged;

static size_t arena_elems(const paged *pk) { return (size_t)pk->n_pages * 2 * pk->ps * pk->hkv * pk->hd; }

static size_t kv_off(const paged *pk, int page, int slot, int kv, int h) {
    return ((((size_t)page * 2 + (size_t)kv) * pk->ps + (size_t)slot) * pk->hkv + (size_t)h) *
           pk->hd;
}

/* Build views over randomly permuted pages; fill present keys, leave every other slot NaN. */
static void paged_init(paged *pk, int hd, int ps, int hkv, const req *rq, int batch) {
    memset(pk, 0, sizeof *pk);
    pk->hd = hd;
    pk->ps = ps;
    pk->hkv = hkv;
    pk->batch = batch;
    int total = 0;
    pk->qo[0] = pk->kvp[0] = 0;
    for (int b = 0; b < batch; b++) {
        int np = (rq[b].length + ps - 1) / ps;
        pk->qo[b + 1] = pk->qo[b] + rq[b].n_q;
        pk->kvp[b + 1] = pk->kvp[b] + np;
        pk->last[b] = np == 0 ? 0 : rq[b].length - (np - 1) * ps;
        pk->start[b] = rq[b].start;
        total += np;
    }
    pk->n_pages = total + 1 + 3; /* sink + a few never-used pages */
    int *perm = malloc(sizeof(int) * (size_t)pk->n_pages);
    for (int i = 0; i < pk->n_pages; i++)
        perm[i] = i;
    for (int i = pk->n_pages - 1; i > 1; i--) { /* shuffle pages 1.. */
        int j = 1 + irand(i);
        int t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    pk->indices = malloc(sizeof(int32_t) * (size_t)(total > 0 ? total : 1));
    for (int i = 0; i < total; i++)
        pk->indices[i] = perm[1 + i];
    free(perm);
    pk->arena = malloc(arena_elems(pk) * sizeof(uint16_t));
    memset(pk->arena, 0xff, arena_elems(pk) * sizeof(uint16_t));
    for (int b = 0; b < batch; b++)
        for (int j = 0; j < rq[b].length; j++) {
            int page = pk->indices[pk->kvp[b] + j / ps];
            for (int kv = 0; kv < 2; kv++)
                for (int h = 0; h < hkv; h++)
                    for (int d = 0; d < hd; d++)
                        pk->arena[kv_off(pk, page, j % ps, kv, h) + (size_t)d] = f2bf(frand());
        }
}

static void paged_free(paged *pk) {
    free(pk->arena);
    free(pk->indices);
}

/* Reference attention in double for every query row of every request. */
static void ref_attention(const paged *pk, const req *rq, const uint16_t *q, int q_stride, int G,
                          bool causal, int window, double *out /* [n_tokens, hq, hd] */) {
    const int hd = pk->hd, hq = pk->hkv * G;
    const double scale = 1.0 / sqrt((double)hd);
    double *w = malloc(sizeof(double) * 4096 * 8);
    for (int b = 0; b < pk->batch; b++) {
        const int L = rq[b].length, n_q = rq[b].n_q;
        assert_true(L <= 4096 * 8);
        for (int i = 0; i < n_q; i++) {
            const int t = pk->qo[b] + i;
            const int qpos = rq[b].start + L - n_q + i;
            for (int qh = 0; qh < hq; qh++) {
                const int h = qh / G;
                double mx = -INFINITY;
                for (int j = 0; j < L; j++) {
                    int kpos = rq[b].start + j;
                    bool ok = (!causal || kpos <= qpos) && (window <= 0 || kpos > qpos - window);
                    w[j] = -INFINITY;
                    if (!ok)
                        continue;
                    int page = pk->indices[pk->kvp[b] + j / pk->ps];
                    const uint16_t *k = &pk->arena[kv_off(pk, page, j % pk->ps, 0, h)];
                    double s = 0;
                    for (int d = 0; d < hd; d++)
                        s += (double)bf2f(q[(size_t)t * q_stride + (size_t)qh * hd + d]) * bf2f(k[d]);
                    w[j] = s * scale;
                    if (w[j] > mx)
                        mx = w[j];
                }
                double sum = 0;
                for (int j = 0; j < L; j++) {
                    w[j] = w[j] == -INFINITY ? 0.0 : exp(w[j] - mx);
                    sum += w[j];
                }
                double *o = &out[((size_t)t * hq + qh) * hd];
                for (int d = 0; d < hd; d++)
                    o[d] = 0;
                for (int j = 0; j < L; j++) {
                    if (w[j] == 0.0)
                        continue;
                    int page = pk->indices[pk->kvp[b] + j / pk->ps];
                    const uint16_t *v = &pk->arena[kv_off(pk, page, j % pk->ps, 1, h)];
                    for (int d = 0; d < hd; d++)
                        o[d] += w[j] / sum * bf2f(v[d]);
                }
            }
        }
    }
    free(w);
}

/* Device copies of the paged fixture and index arrays. */
typedef struct paged_dev {
    void *arena;
    int32_t *qo, *kvp, *indices, *last, *start;
} paged_dev;

static paged_dev paged_upload(dev_list *l, const paged *pk) {
    paged_dev d;
    d.arena = dup_h2d(l, pk->arena, arena_elems(pk) * 2);
    d.qo = dup_h2d(l, pk->qo, sizeof(int32_t) * (size_t)(pk->batch + 1));
    d.kvp = dup_h2d(l, pk->kvp, sizeof(int32_t) * (size_t)(pk->batch + 1));
    d.indices = dup_h2d(l, pk->indices, sizeof(int32_t) * (size_t)(pk->kvp[pk->batch] > 0 ? pk->kvp[pk->batch] : 1));
    d.last = dup_h2d(l, pk->last, sizeof(int32_t) * (size_t)pk->batch);
    d.start = dup_h2d(l, pk->start, sizeof(int32_t) * (size_t)pk->batch);
    return d;
}

/* ---- attention decode ---- */

static void run_decode_case(int hd, int ps, int G, int window, int split_pages) {
    const int hkv = 2, hq = hkv * G;
    /* page boundaries: 1, ps, ps+1 keys, several pages, a long view; windowed views released
     * their first 4 pages (start > 0) */
    req rq[5] = {{1, 1, 0}, {1, ps, 0}, {1, ps + 1, 0}, {1, 5 * ps - 3, 0}, {1, 1000, 0}};
    if (window > 0) {
        rq[3].start = 4 * ps;
        rq[4].start = 4 * ps;
    }
    paged pk;
    paged_init(&pk, hd, ps, hkv, rq, 5);
    const int n_tok = pk.qo[5], q_stride = (hq + 2 * hkv) * hd; /* q inside a fused QKV row */
    uint16_t *q = malloc(sizeof(uint16_t) * (size_t)n_tok * q_stride);
    for (size_t i = 0; i < (size_t)n_tok * q_stride; i++)
        q[i] = f2bf(frand());
    double *ref = malloc(sizeof(double) * (size_t)n_tok * hq * hd);
    ref_attention(&pk, rq, q, q_stride, G, true, window, ref);

    dev_list l = {0};
    paged_dev d = paged_upload(&l, &pk);
    void *dq = dup_h2d(&l, q, sizeof(uint16_t) * (size_t)n_tok * q_stride);
    void *dout = dalloc(&l, sizeof(uint16_t) * (size_t)n_tok * hq * hd);
    int max_pages = 0;
    for (int b = 0; b < 5; b++)
        max_pages = MS_MAX(max_pages, pk.kvp[b + 1] - pk.kvp[b]);
    int n_splits = split_pages > 0 ? MS_CEIL_DIV(max_pages, split_pages) : 1;
    float *part_o = dalloc(&l, sizeof(float) * 5 * (size_t)n_splits * hq * hd);
    float *part_lse = dalloc(&l, sizeof(float) * 5 * (size_t)n_splits * hq);
    int32_t *counters = dalloc(&l, sizeof(int32_t) * 5 * (size_t)hkv);
    if (cudaMemset(counters, 0, sizeof(int32_t) * 5 * (size_t)hkv) != cudaSuccess)
        fail_msg("cudaMemset of the split counters failed");

    ms_cuda_module *m = load(ms_kernel_spec_attn_decode(MS_KERNEL_DTYPE_BF16, hd, ps, G, window > 0));
    ms_attn_kernel_params p = {0};
    p.q = dq;
    p.o = dout;
    p.kv = d.arena;
    p.qo_indptr = d.qo;
    p.kv_indptr = d.kvp;
    p.kv_indices = d.indices;
    p.kv_last_page_len = d.last;
    p.kv_start = d.start;
    p.part_o = part_o;
    p.part_lse = part_lse;
    p.split_counter = counters;
    p.batch = 5;
    p.n_q_heads = hq;
    p.n_kv_heads = hkv;
    p.q_stride = q_stride;
    p.o_stride = hq * hd;
    p.n_splits = n_splits;
    p.pages_per_split = split_pages > 0 ? split_pages : MS_MAX(max_pages, 1);
    p.window = window;
    p.sm_scale = (float)(1.0 / sqrt((double)hd));
    ms_error err = {0};
    if (ms_cuda_attn_decode_launch(m, &p, 0, &err) != MS_OK)
        fail_msg("decode launch: %s", err.msg);
    sync_ok("attn_decode");
    uint16_t *got = malloc(sizeof(uint16_t) * (size_t)n_tok * hq * hd);
    d2h(got, dout, sizeof(uint16_t) * (size_t)n_tok * hq * hd);
    char what[160];
    snprintf(what, sizeof what, "%s win%d splits %d", m->uri, window, n_splits);
    check_close(what, got, ref, (size_t)n_tok * hq * hd, 1e-2);
    /* the last CTA of every (request, KV head) reset its counter: a second launch on the same
     * counters (output poisoned again) gives the same result */
    int32_t hc[5 * 8];
    d2h(hc, counters, sizeof(int32_t) * 5 * (size_t)hkv);
    for (int i = 0; i < 5 * hkv; i++)
        if (hc[i] != 0)
            fail_msg("%s: split counter %d is %d after the launch", what, i, hc[i]);
    if (cudaMemset(dout, 0xff, sizeof(uint16_t) * (size_t)n_tok * hq * hd) != cudaSuccess)
        fail_msg("cudaMemset of the output failed");
    if (ms_cuda_attn_decode_launch(m, &p, 0, &err) != MS_OK)
        fail_msg("decode launch: %s", err.msg);
    sync_ok("attn_decode (second launch)");
    uint16_t *again = malloc(sizeof(uint16_t) * (size_t)n_tok * hq * hd);
    d2h(again, dout, sizeof(uint16_t) * (size_t)n_tok * hq * hd);
    if (memcmp(again, got, sizeof(uint16_t) * (size_t)n_tok * hq * hd) != 0)
        fail_msg("%s: a second launch on the same split counters differs", what);
    free(again);

    ms_cuda_module_free(m);
    dfree_all(&l);
    free(got);
    free(ref);
    free(q);
    paged_free(&pk);
}

static void test_attn_decode(void **state) {
    (void)state;
    const int hds[] = {64, 128}, gs[] = {1, 4, 8};
    for (int a = 0; a < 2; a++)
        for (int c = 0; c < 3; c++)
            for (int w = 0; w < 2; w++) {
                int window = w ? 37 : 0;
                run_decode_case(hds[a], 16, gs[c], window, 0); /* one split */
                run_decode_case(hds[a], 16, gs[c], window, 3); /* split-KV + merge */
            }
    run_decode_case(128, 128, 4, 0, 0);
    run_decode_case(128, 128, 4, 300, 2);
    run_decode_case(16, 16, 4, 0, 2); /* llama_gqa fixture shape */
    run_decode_case(48, 16, 2, 0, 0); /* qwen3 fixture: 6 lanes per key, padded to 8 */
    run_decode_case(48, 16, 2, 0, 3);
    run_decode_case(96, 16, 1, 8, 5); /* 12 lanes per key, padded to 16 */
    run_decode_case(256, 16, 4, 0, 4); /* one key per warp load */
    run_decode_case(128, 16, 16, 0, 3);
    /* the tensor-core loop's two addressing paths: pages of 8 (a 16-key step spans two pages,
       one page id per key) and of 32 (two steps a page, one page id a step) */
    run_decode_case(128, 8, 4, 0, 3);
    run_decode_case(128, 8, 4, 37, 0);
    run_decode_case(64, 32, 4, 37, 3);
    run_decode_case(64, 32, 2, 0, 0);
}

/*
 * A decode launch queued right behind the kernel that writes its q, sharing that kernel's split
 * partials and counters: the second launch's q is the first launch's output (poisoned with NaN
 * before), so it is right only if the second waits for the first before loading q and before
 * writing partials (on sm_90 the launcher lets it start during the first one's tail,
 * decode.cuh). Twenty pairs on one created stream, the long view making the first launch the
 * longer one.
 */
static void test_attn_decode_waits_for_the_kernel_before(void **state) {
    (void)state;
    const int hd = 128, ps = 16, G = 4, hkv = 2, hq = hkv * G, split_pages = 3;
    req rq[3] = {{1, 2000, 0}, {1, 37, 0}, {1, 1, 0}};
    paged pk;
    paged_init(&pk, hd, ps, hkv, rq, 3);
    const int n_tok = pk.qo[3];
    const size_t n_out = (size_t)n_tok * hq * hd;
    uint16_t *q = malloc(sizeof(uint16_t) * n_out);
    for (size_t i = 0; i < n_out; i++)
        q[i] = f2bf(frand());
    double *ref1 = malloc(sizeof(double) * n_out), *ref2 = malloc(sizeof(double) * n_out);
    ref_attention(&pk, rq, q, hq * hd, G, true, 0, ref1);

    dev_list l = {0};
    paged_dev d = paged_upload(&l, &pk);
    void *dq = dup_h2d(&l, q, sizeof(uint16_t) * n_out);
    void *o1 = dalloc(&l, sizeof(uint16_t) * n_out), *o2 = dalloc(&l, sizeof(uint16_t) * n_out);
    int max_pages = 0;
    for (int b = 0; b < 3; b++)
        max_pages = MS_MAX(max_pages, pk.kvp[b + 1] - pk.kvp[b]);
    const int n_splits = MS_CEIL_DIV(max_pages, split_pages);
    float *part_o = dalloc(&l, sizeof(float) * 3 * (size_t)n_splits * hq * hd);
    float *part_lse = dalloc(&l, sizeof(float) * 3 * (size_t)n_splits * hq);
    int32_t *counters = dalloc(&l, sizeof(int32_t) * 3 * (size_t)hkv);
    CK(cudaMemset(counters, 0, sizeof(int32_t) * 3 * (size_t)hkv));
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

    ms_cuda_module *m = load(ms_kernel_spec_attn_decode(MS_KERNEL_DTYPE_BF16, hd, ps, G, false));
    ms_attn_kernel_params p = {0};
    p.kv = d.arena;
    p.qo_indptr = d.qo;
    p.kv_indptr = d.kvp;
    p.kv_indices = d.indices;
    p.kv_last_page_len = d.last;
    p.kv_start = d.start;
    p.part_o = part_o;
    p.part_lse = part_lse;
    p.split_counter = counters;
    p.batch = 3;
    p.n_q_heads = hq;
    p.n_kv_heads = hkv;
    p.q_stride = p.o_stride = hq * hd;
    p.n_splits = n_splits;
    p.pages_per_split = split_pages;
    p.sm_scale = (float)(1.0 / sqrt((double)hd));
    ms_error err = {0};
    uint16_t *got1 = malloc(sizeof(uint16_t) * n_out), *got2 = malloc(sizeof(uint16_t) * n_out);
    for (int rep = 0; rep < 20; rep++) {
        CK(cudaMemset(o1, 0xff, sizeof(uint16_t) * n_out)); /* NaN */
        CK(cudaMemset(o2, 0xff, sizeof(uint16_t) * n_out));
        CK(cudaDeviceSynchronize());
        p.q = dq;
        p.o = o1;
        if (ms_cuda_attn_decode_launch(m, &p, stream, &err) != MS_OK)
            fail_msg("decode launch: %s", err.msg);
        p.q = o1; /* the previous kernel's output */
        p.o = o2;
        if (ms_cuda_attn_decode_launch(m, &p, stream, &err) != MS_OK)
            fail_msg("decode launch: %s", err.msg);
        sync_ok("attn_decode behind its producer");
        d2h(got1, o1, sizeof(uint16_t) * n_out);
        d2h(got2, o2, sizeof(uint16_t) * n_out);
        if (rep == 0) {
            check_close("decode 1 of the pair", got1, ref1, n_out, 1e-2);
            ref_attention(&pk, rq, got1, hq * hd, G, true, 0, ref2);
        }
        char what[96];
        snprintf(what, sizeof what, "decode 2 of pair %d (q = output 1)", rep);
        check_close(what, got2, ref2, n_out, 1e-2);
    }
    int32_t hc[3 * 2];
    d2h(hc, counters, sizeof hc);
    for (int i = 0; i < 3 * hkv; i++)
        if (hc[i] != 0)
            fail_msg("split counter %d is %d after the pairs", i, hc[i]);
    CK(cudaStreamDestroy(stream));
    ms_cuda_module_free(m);
    dfree_all(&l);
    free(got1);
    free(got2);
    free(ref1);
    free(ref2);
    free(q);
    paged_free(&pk);
}

/* ---- attention prefill ---- */

/* The prefill kernel over the views rq[0..n_req) (at most 64). */
static void run_prefill_rq(int hd, int ps, int G, bool causal, int window, const req *rq,
                           int n_req) {
    const int hkv = 2, hq = hkv * G;
    paged pk;
    paged_init(&pk, hd, ps, hkv, rq, n_req);
    const int n_tok = pk.qo[n_req], q_stride = hq * hd;
    uint16_t *q = malloc(sizeof(uint16_t) * (size_t)n_tok * q_stride);
    for (size_t i = 0; i < (size_t)n_tok * q_stride; i++)
        q[i] = f2bf(frand());
    double *ref = malloc(sizeof(double) * (size_t)n_tok * hq * hd);
    ref_attention(&pk, rq, q, q_stride, G, causal, window, ref);

    int32_t tile_req[256], tile_idx[256];
    int n_tiles = 0;
    ms_error err = {0};
    assert_int_equal(ms_kernel_attn_prefill_tiles(pk.qo, n_req, G, tile_req, tile_idx, 256,
                                                &n_tiles, &err), MS_OK);
    dev_list l = {0};
    paged_dev d = paged_upload(&l, &pk);
    void *dq = dup_h2d(&l, q, sizeof(uint16_t) * (size_t)n_tok * q_stride);
    void *dout = dalloc(&l, sizeof(uint16_t) * (size_t)n_tok * hq * hd);
    int32_t *dtr = dup_h2d(&l, tile_req, sizeof(int32_t) * (size_t)n_tiles);
    int32_t *dti = dup_h2d(&l, tile_idx, sizeof(int32_t) * (size_t)n_tiles);

    ms_cuda_module *m =
        load(ms_kernel_spec_attn_prefill(MS_KERNEL_DTYPE_BF16, hd, ps, G, causal, window > 0));
    ms_attn_kernel_params p = {0};
    p.q = dq;
    p.o = dout;
    p.kv = d.arena;
    p.qo_indptr = d.qo;
    p.kv_indptr = d.kvp;
    p.kv_indices = d.indices;
    p.kv_last_page_len = d.last;
    p.kv_start = d.start;
    p.tile_req = dtr;
    p.tile_idx = dti;
    p.batch = n_req;
    p.n_q_heads = hq;
    p.n_kv_heads = hkv;
    p.q_stride = q_stride;
    p.o_stride = hq * hd;
    p.n_splits = 1;
    p.pages_per_split = 1;
    p.window = window;
    p.sm_scale = (float)(1.0 / sqrt((double)hd));
    if (ms_cuda_attn_prefill_launch(m, &p, n_tiles, 0, &err) != MS_OK)
        fail_msg("prefill launch: %s", err.msg);
    sync_ok("attn_prefill");
    uint16_t *got = malloc(sizeof(uint16_t) * (size_t)n_tok * hq * hd);
    d2h(got, dout, sizeof(uint16_t) * (size_t)n_tok * hq * hd);
    char what[160];
    snprintf(what, sizeof what, "%s win%d tiles %d", m->uri, window, n_tiles);
    check_close(what, got, ref, (size_t)n_tok * hq * hd, 2e-2);

    ms_cuda_module_free(m);
    dfree_all(&l);
    free(got);
    free(ref);
    free(q);
    paged_free(&pk);
}

static void run_prefill_case(int hd, int ps, int G, bool causal, int window) {
    /* ragged: fresh prompts, continuations over stored keys, a 1-token row, a long prompt;
     * windowed: one view with released pages (start > 0) */
    req rq[5] = {{37, 37, 0}, {5, 25, 0}, {64, 64, 0}, {1, 41, 0}, {130, 133, 0}};
    if (window > 0)
        rq[1] = (req){20, 50 + window, 128}; /* keys [128, 178+W): queries see >= 128 */
    run_prefill_rq(hd, ps, G, causal, window, rq, 5);
}

static void test_attn_prefill(void **state) {
    (void)state;
    const int hds[] = {64, 128}, gs[] = {1, 4, 8};
    for (int a = 0; a < 2; a++)
        for (int c = 0; c < 3; c++) {
            run_prefill_case(hds[a], 16, gs[c], true, 0);
            run_prefill_case(hds[a], 16, gs[c], true, 8);
        }
    run_prefill_case(128, 128, 4, true, 0);
    run_prefill_case(128, 128, 4, true, 100);
    run_prefill_case(64, 16, 1, false, 0); /* non-causal (cross-attention style) */
    run_prefill_case(16, 16, 4, true, 0);  /* llama_gqa fixture shape */
    run_prefill_case(32, 16, 2, true, 8);  /* mistral_window fixture shape */
}

/* The prefill kernel at Qwen3's head_dim 48 (4 lanes per 16-dim k-step, no 32-dim pairs):
 * ragged prefill, then one-query-row batches as chunked prefill sends them: lengths across page
 * boundaries (1, 16, 17, 33, 130), a view with released pages (start > 0) under a window. */
static void test_attn_prefill_as_decode(void **state) {
    (void)state;
    run_prefill_case(48, 16, 2, true, 0); /* qwen3 fixture shape */
    const req dec[6] = {{1, 1, 0}, {1, 16, 0}, {1, 17, 0}, {1, 33, 0}, {1, 130, 0}, {1, 77, 0}};
    run_prefill_rq(48, 16, 2, true, 0, dec, 6);
    run_prefill_rq(48, 16, 4, true, 0, dec, 6);
    const req win[3] = {{1, 40, 32}, {1, 9, 0}, {1, 100, 0}};
    run_prefill_rq(48, 16, 2, true, 8, win, 3);
}

/* ---- RoPE + KV write ---- */

static float ref_inv_freq(int i, int hd, float theta, bool llama3, float factor, float lo,
                          float hi, float orig) {
    float inv = 1.0f / powf(theta, (float)(2 * i) / (float)hd);
    if (llama3) {
        float low_wavelen = orig / lo, high_wavelen = orig / hi;
        float wavelen = 6.283185307179586f / inv;
        if (wavelen > low_wavelen) {
            inv = inv / factor;
        } else if (!(wavelen < high_wavelen)) {
            float smooth = (orig / wavelen - lo) / (hi - lo);
            inv = (1.0f - smooth) * inv / factor + smooth * inv;
        }
    }
    return inv;
}

/* Position stream of rotary pair i under M-RoPE sections (the CPU backend's walk). */
static int ref_mrope_stream(int i, const int *sections, int n_sections) {
    int sec = 0, end = sections[0];
    while (i >= end && sec + 1 < n_sections) {
        sec++;
        end += sections[sec];
    }
    return sec;
}

/* RoPE + KV write of 7 tokens (8 q heads, 2 KV heads) over a 5-page arena. n_sections == 0:
 * frequencies computed in the kernel from theta (llama3 scaling or not), one position per token;
 * n_sections > 0: the M-RoPE instance with a frequency table, positions [n_sections, 7] with a
 * padded stream stride (the pad holds huge positions: reading it shows). */
/* rot: rotary_dim (0: all of head_dim); the dims past it pass unrotated */
static void run_rope_case_ex(int hd, int ps, ms_kernel_rope style, bool llama3, const int *sections,
                             int n_sections, int rot) {
    const int rd = rot > 0 ? rot : hd;
    const int hq = 8, hkv = 2, n_tok = 7, stride = (hq + 2 * hkv) * hd;
    const int pos_stride = n_tok + 3;
    const req rq[1] = {{0, 5 * ps, 0}}; /* an arena of 5 pages; contents replaced below */
    paged pk;
    paged_init(&pk, hd, ps, hkv, rq, 1);
    memset(pk.arena, 0xff, arena_elems(&pk) * 2);
    uint16_t *qkv = malloc(sizeof(uint16_t) * (size_t)n_tok * stride);
    for (size_t i = 0; i < (size_t)n_tok * stride; i++)
        qkv[i] = f2bf(frand());
    int32_t pos[7], page[7], slot[7], pos3[MS_ROPE_KV_MAX_SECTIONS * 10];
    for (int t = 0; t < n_tok; t++) {
        pos[t] = t == 0 ? 0 : irand(t < 3 ? 64 : 20000);
        page[t] = pk.indices[t % 5];
        slot[t] = (t * 7 + 3) % ps; /* distinct (page, slot) for the 7 tokens */
    }
    for (int i = 0; i < MS_ROPE_KV_MAX_SECTIONS * pos_stride; i++) /* streams differ per token */
        pos3[i] = i % pos_stride >= n_tok ? 1000000 + irand(1000) : (i % pos_stride == 0 ? 0 : irand(5000));
    const float theta = n_sections > 0 ? 10000.f : 500000.f, factor = 8.f, lo = 1.f, hi = 4.f,
                orig = 8192.f;
    float inv_tab[512] = {0};
    for (int i = 0; i < rd / 2; i++)
        inv_tab[i] = ref_inv_freq(i, rd, theta, llama3, factor, lo, hi, orig);

    dev_list l = {0};
    uint16_t *dqkv = dup_h2d(&l, qkv, sizeof(uint16_t) * (size_t)n_tok * stride);
    void *darena = dup_h2d(&l, pk.arena, arena_elems(&pk) * 2);
    int32_t *dpos = n_sections > 0 ? dup_h2d(&l, pos3, sizeof(int32_t) * (size_t)(n_sections * pos_stride))
                                   : dup_h2d(&l, pos, sizeof pos);
    int32_t *dpage = dup_h2d(&l, page, sizeof page);
    int32_t *dslot = dup_h2d(&l, slot, sizeof slot);
    float *dinv = dup_h2d(&l, inv_tab, sizeof(float) * (size_t)(hd / 2));
    ms_cuda_module *m = load(
        n_sections > 0 ? ms_kernel_spec_rope_kv_mrope(MS_KERNEL_DTYPE_BF16, hd, ps, style)
                       : ms_kernel_spec_rope_kv(MS_KERNEL_DTYPE_BF16, hd, ps, style,
                                                llama3 ? MS_KERNEL_ROPE_SCALING_LLAMA3
                                                       : MS_KERNEL_ROPE_SCALING_NONE));
    ms_rope_kv_params p = {0};
    p.q = dqkv;
    p.k = dqkv + (size_t)hq * hd;
    p.v = dqkv + (size_t)(hq + hkv) * hd;
    p.kv = darena;
    p.pos = dpos;
    p.token_to_page = dpage;
    p.token_to_slot = dslot;
    p.n_tokens = n_tok;
    p.n_q_heads = hq;
    p.n_kv_heads = hkv;
    p.q_stride = p.k_stride = p.v_stride = stride;
    p.theta = theta;
    p.factor = factor;
    p.low_freq_factor = lo;
    p.high_freq_factor = hi;
    p.original_max_pos = orig;
    p.rotary_dim = rot;
    if (n_sections > 0) {
        p.inv_freq = dinv;
        p.n_sections = n_sections;
        for (int i = 0; i < n_sections; i++)
            p.sections[i] = sections[i];
        p.pos_stride = pos_stride;
    }
    ms_error err = {0};
    if (ms_cuda_rope_kv_launch(m, &p, 0, &err) != MS_OK)
        fail_msg("rope launch: %s", err.msg);
    sync_ok("rope_kv");

    /* reference: rotate q and k; v copied */
    size_t nq = (size_t)n_tok * hq * hd, nk = (size_t)n_tok * hkv * hd;
    double *rq_ = malloc(sizeof(double) * nq), *rk = malloc(sizeof(double) * nk);
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < hq + hkv; h++) {
            const uint16_t *x = &qkv[(size_t)t * stride + (size_t)h * hd];
            double *o = h < hq ? &rq_[((size_t)t * hq + h) * hd] : &rk[((size_t)t * hkv + h - hq) * hd];
            for (int d = rd; d < hd; d++)
                o[d] = bf2f(x[d]);
            for (int i = 0; i < rd / 2; i++) {
                int a = style == MS_KERNEL_ROPE_INTERLEAVED ? 2 * i : i;
                int b = style == MS_KERNEL_ROPE_INTERLEAVED ? 2 * i + 1 : i + rd / 2;
                float tp = n_sections > 0
                               ? (float)pos3[ref_mrope_stream(i, sections, n_sections) * pos_stride + t]
                               : (float)pos[t];
                float ang = tp * inv_tab[i];
                double c = cos((double)ang), s = sin((double)ang);
                double xa = bf2f(x[a]), xb = bf2f(x[b]);
                o[a] = xa * c - xb * s;
                o[b] = xb * c + xa * s;
            }
        }
    uint16_t *got_q = malloc(sizeof(uint16_t) * nq), *got_k = malloc(sizeof(uint16_t) * nk);
    uint16_t *all = malloc(sizeof(uint16_t) * (size_t)n_tok * stride);
    uint16_t *arena = malloc(arena_elems(&pk) * 2);
    d2h(all, dqkv, sizeof(uint16_t) * (size_t)n_tok * stride);
    d2h(arena, darena, arena_elems(&pk) * 2);
    char *written = calloc(arena_elems(&pk), 1);
    for (int t = 0; t < n_tok; t++) {
        memcpy(&got_q[(size_t)t * hq * hd], &all[(size_t)t * stride], sizeof(uint16_t) * (size_t)hq * hd);
        /* k is rotated in place exactly as written to the pages; v is untouched */
        assert_memory_equal(&all[(size_t)t * stride + (size_t)(hq + hkv) * hd],
                            &qkv[(size_t)t * stride + (size_t)(hq + hkv) * hd],
                            sizeof(uint16_t) * (size_t)hkv * hd);
        for (int h = 0; h < hkv; h++) {
            size_t ko = kv_off(&pk, page[t], slot[t], 0, h), vo = kv_off(&pk, page[t], slot[t], 1, h);
            memcpy(&got_k[((size_t)t * hkv + h) * hd], &arena[ko], sizeof(uint16_t) * (size_t)hd);
            assert_memory_equal(&arena[ko], &all[(size_t)t * stride + (size_t)(hq + h) * hd],
                                sizeof(uint16_t) * (size_t)hd);
            /* v is a bit-exact copy */
            assert_memory_equal(&arena[vo], &qkv[(size_t)t * stride + (size_t)(hq + hkv + h) * hd],
                                sizeof(uint16_t) * (size_t)hd);
            memset(&written[ko], 1, (size_t)hd);
            memset(&written[vo], 1, (size_t)hd);
        }
    }
    /* nothing else in the arena was touched */
    for (size_t i = 0; i < arena_elems(&pk); i++)
        if (!written[i] && arena[i] != 0xffff)
            fail_msg("rope_kv wrote arena element %zu it does not own", i);
    char what[160], sec[48] = "";
    if (n_sections > 0)
        snprintf(sec, sizeof sec, " [%d/%d/%d]", sections[0], sections[1],
                 n_sections > 2 ? sections[2] : 0);
    snprintf(what, sizeof what, "%s%s q", m->uri, sec);
    check_close(what, got_q, rq_, nq, 1e-2);
    snprintf(what, sizeof what, "%s%s k (in pages)", m->uri, sec);
    check_close(what, got_k, rk, nk, 1e-2);

    ms_cuda_module_free(m);
    dfree_all(&l);
    free(written);
    free(arena);
    free(all);
    free(got_q);
    free(got_k);
    free(rq_);
    free(rk);
    free(qkv);
    paged_free(&pk);
}

static void run_rope_case(int hd, int ps, ms_kernel_rope style, bool llama3) {
    run_rope_case_ex(hd, ps, style, llama3, NULL, 0, 0);
}

static void test_rope_kv(void **state) {
    (void)state;
    const int hds[] = {64, 128};
    for (int a = 0; a < 2; a++)
        for (int st = MS_KERNEL_ROPE_NEOX; st <= MS_KERNEL_ROPE_INTERLEAVED; st++)
            for (int sc = 0; sc < 2; sc++)
                run_rope_case(hds[a], 16, (ms_kernel_rope)st, sc == 1);
    run_rope_case(128, 128, MS_KERNEL_ROPE_NEOX, true);
    run_rope_case(16, 16, MS_KERNEL_ROPE_INTERLEAVED, false); /* llama2.c fixture shape */
    /* partial rotary dims: the 4-pair vector path with passthrough groups (rot a multiple of 8),
       and the element path (rot 20: 4-pair groups would straddle the rotary edge) */
    run_rope_case_ex(128, 16, MS_KERNEL_ROPE_NEOX, false, NULL, 0, 64);
    run_rope_case_ex(64, 16, MS_KERNEL_ROPE_NEOX, true, NULL, 0, 20);
    run_rope_case_ex(64, 16, MS_KERNEL_ROPE_INTERLEAVED, false, NULL, 0, 32);
}

/* M-RoPE (Qwen2-VL): each rotary pair's position from the stream of its section; sections as
 * Qwen2-VL's [16, 24, 24] at head_dim 128 and scaled down at 64, an empty middle section, and a
 * first section covering everything but one pair. */
static void test_rope_kv_mrope(void **state) {
    (void)state;
    const int s64[3] = {8, 12, 12}, s128[3] = {16, 24, 24}, empty[3] = {16, 0, 16};
    const int lopsided[3] = {31, 1, 0};
    for (int st = MS_KERNEL_ROPE_NEOX; st <= MS_KERNEL_ROPE_INTERLEAVED; st++) {
        run_rope_case_ex(64, 16, (ms_kernel_rope)st, false, s64, 3, 0);
        run_rope_case_ex(128, 16, (ms_kernel_rope)st, false, s128, 3, 0);
    }
    run_rope_case_ex(64, 16, MS_KERNEL_ROPE_NEOX, false, empty, 3, 0);
    run_rope_case_ex(64, 16, MS_KERNEL_ROPE_NEOX, false, lopsided, 3, 0);
    /* the launcher checks the sections against rotary_dim */
    ms_cuda_module *m = load(ms_kernel_spec_rope_kv_mrope(MS_KERNEL_DTYPE_BF16, 64, 16,
                                                          MS_KERNEL_ROPE_NEOX));
    ms_rope_kv_params p = {0};
    ms_error err = {0};
    int dummy = 0;
    p.pos = &dummy; /* never launched */
    p.n_tokens = 1;
    p.q_stride = p.k_stride = 64;
    p.n_q_heads = 1;
    p.inv_freq = (const float *)&dummy;
    p.n_sections = 3;
    p.sections[0] = 8, p.sections[1] = 12, p.sections[2] = 11; /* 31 pairs, 32 needed */
    p.pos_stride = 1;
    assert_int_equal(ms_cuda_rope_kv_launch(m, &p, 0, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "sum to 31 pairs"));
    p.sections[2] = 12;
    p.n_sections = 5;
    assert_int_equal(ms_cuda_rope_kv_launch(m, &p, 0, &err), MS_ERR_INVALID_ARG);
    p.n_sections = 3;
    p.pos_stride = 0; /* below n_tokens */
    assert_int_equal(ms_cuda_rope_kv_launch(m, &p, 0, &err), MS_ERR_INVALID_ARG);
    ms_cuda_module_free(m);
}

/* ---- RMSNorm, SiLU-mul, embedding ---- */

static void run_rmsnorm_case(bool add_residual) {
    const int rows = 5, dim = 2048;
    const size_t n = (size_t)rows * dim;
    uint16_t *x = malloc(n * 2), *res = malloc(n * 2), *w = malloc((size_t)dim * 2);
    for (size_t i = 0; i < n; i++) {
        x[i] = f2bf(frand() * 3.f);
        res[i] = f2bf(frand());
    }
    for (int i = 0; i < dim; i++)
        w[i] = f2bf(1.f + 0.5f * frand());
    double *ref = malloc(n * sizeof(double));
    uint16_t *ref_res = malloc(n * 2);
    for (int r = 0; r < rows; r++) {
        double ss = 0;
        for (int i = 0; i < dim; i++) {
            size_t k = (size_t)r * dim + i;
            float h = add_residual ? rbf(bf2f(x[k]) + bf2f(res[k])) : bf2f(x[k]);
            ref_res[k] = f2bf(h);
            ss += (double)h * h;
        }
        double inv = 1.0 / sqrt(ss / dim + 1e-5);
        for (int i = 0; i < dim; i++) {
            size_t k = (size_t)r * dim + i;
            ref[k] = (double)bf2f(ref_res[k]) * inv * bf2f(w[i]);
        }
    }
    dev_list l = {0};
    void *dx = dup_h2d(&l, x, n * 2), *dres = dup_h2d(&l, res, n * 2), *dw = dup_h2d(&l, w, (size_t)dim * 2);
    void *dout = dalloc(&l, n * 2);
    ms_cuda_module *m = load(ms_kernel_spec_rmsnorm(MS_KERNEL_DTYPE_BF16, add_residual));
    ms_rmsnorm_params p = {dx, dres, dw, dout, rows, dim, dim, dim, 1e-5f, 0, NULL, 0};
    ms_error err = {0};
    if (ms_cuda_rmsnorm_launch(m, &p, 0, &err) != MS_OK)
        fail_msg("rmsnorm launch: %s", err.msg);
    sync_ok("rmsnorm");
    uint16_t *got = malloc(n * 2), *got_res = malloc(n * 2);
    d2h(got, dout, n * 2);
    d2h(got_res, dres, n * 2);
    check_close(m->uri, got, ref, n, 1e-2);
    if (add_residual)
        assert_memory_equal(got_res, ref_res, n * 2); /* residual = bf16(x + residual), exactly */
    else
        assert_memory_equal(got_res, res, n * 2); /* untouched */
    ms_cuda_module_free(m);
    dfree_all(&l);
    free(got);
    free(got_res);
    free(ref);
    free(ref_res);
    free(x);
    free(res);
    free(w);
}

static void test_rmsnorm(void **state) {
    (void)state;
    run_rmsnorm_case(false);
    run_rmsnorm_case(true);
}

/* Compare n f32 outputs with a double reference; fails on NaN or rel error > tol. */
static void check_close_f32(const char *what, const float *got, const double *ref, size_t n,
                            double tol) {
    double num = 0, den = 0, max_abs = 0;
    size_t nan = 0;
    for (size_t i = 0; i < n; i++) {
        double g = got[i];
        if (isnan(g) || isinf(g)) {
            if (nan++ < 3)
                fprintf(stderr, "  %s: element %zu is %g (ref %g)\n", what, i, g, ref[i]);
            continue;
        }
        double d = fabs(g - ref[i]);
        num += d * d;
        den += ref[i] * ref[i];
        max_abs = fmax(max_abs, d);
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    printf("  %-58s rel %.2e  max|d| %.2e  (tol %.0e)%s\n", what, rel, max_abs, tol,
           nan ? "  NaN!" : "");
    if (nan > 0 || !(rel <= tol))
        fail_msg("%s: %zu NaN/inf, relative error %.3e (tolerance %.0e)", what, nan, rel, tol);
}

/* Per-head RMSNorm over 7 tokens of a fused QKV-like row [q: 8 heads | k: 2 heads | v: 2 heads]
 * of head_dim hd: in place on the q columns (k and v must stay bit-exact), then from the k
 * columns into a separate buffer with a padded token stride (the pad must keep its poison).
 * act_f32: float32 activations (what the CUDA backend runs), else bf16. Weights bf16. One head is
 * all zeros (the result is zeros: eps keeps the scale finite). */
static void run_rmsnorm_heads_case(int hd, bool act_f32) {
    const int n_tok = 7, hq = 8, hkv = 2, stride = (hq + 2 * hkv) * hd, ostride = hkv * hd + 8;
    const size_t es = act_f32 ? 4 : 2, n = (size_t)n_tok * (size_t)stride;
    const size_t n_out = (size_t)n_tok * (size_t)ostride;
    const float eps = 1e-6f;
    float *xf = malloc(n * sizeof(float)); /* the input values as the kernel sees them */
    void *xh = malloc(n * es);
    uint16_t *w = malloc((size_t)hd * 2);
    for (size_t i = 0; i < n; i++) {
        float v = frand() * (i % 3 == 0 ? 4.f : 0.5f);
        if (i < (size_t)hd)
            v = 0.f; /* token 0, q head 0 */
        xf[i] = act_f32 ? v : rbf(v);
        if (act_f32)
            ((float *)xh)[i] = xf[i];
        else
            ((uint16_t *)xh)[i] = f2bf(xf[i]);
    }
    for (int i = 0; i < hd; i++)
        w[i] = f2bf(1.f + 0.5f * frand());
    /* reference of every (token, head) of q and k in double */
    double *ref_q = malloc(sizeof(double) * (size_t)n_tok * hq * hd);
    double *ref_k = malloc(sizeof(double) * (size_t)n_tok * hkv * hd);
    for (int t = 0; t < n_tok; t++)
        for (int h = 0; h < hq + hkv; h++) {
            const float *x = xf + (size_t)t * stride + (size_t)h * hd;
            double ss = 0;
            for (int i = 0; i < hd; i++)
                ss += (double)x[i] * x[i];
            double inv = 1.0 / sqrt(ss / hd + eps);
            double *o = h < hq ? &ref_q[((size_t)t * hq + h) * hd]
                               : &ref_k[((size_t)t * hkv + h - hq) * hd];
            for (int i = 0; i < hd; i++)
                o[i] = (double)x[i] * inv * bf2f(w[i]);
        }
    dev_list l = {0};
    void *dx = dup_h2d(&l, xh, n * es), *dw = dup_h2d(&l, w, (size_t)hd * 2);
    void *dout = dalloc(&l, n_out * es); /* poisoned */
    ms_kernel_spec spec = ms_kernel_spec_rmsnorm_heads(MS_KERNEL_DTYPE_BF16, hd);
    if (act_f32)
        spec.act_dtype = MS_KERNEL_DTYPE_F32;
    ms_cuda_module *m = load(spec);
    ms_error err = {0};
    /* q: in place on the QKV row */
    ms_rmsnorm_params p = {0};
    p.x = dx;
    p.out = dx;
    p.weight = dw;
    p.n_rows = n_tok;
    p.n_heads = hq;
    p.dim = hd;
    p.x_stride = p.out_stride = stride;
    p.eps = eps;
    if (ms_cuda_rmsnorm_heads_launch(m, &p, 0, &err) != MS_OK)
        fail_msg("rmsnorm_heads launch: %s", err.msg);
    /* k: out of place into the padded buffer */
    p.x = (char *)dx + (size_t)hq * hd * es;
    p.out = dout;
    p.n_heads = hkv;
    p.out_stride = ostride;
    if (ms_cuda_rmsnorm_heads_launch(m, &p, 0, &err) != MS_OK)
        fail_msg("rmsnorm_heads launch: %s", err.msg);
    sync_ok("rmsnorm_heads");
    void *all = malloc(n * es), *out = malloc(n_out * es);
    d2h(all, dx, n * es);
    d2h(out, dout, n_out * es);
    size_t nq = (size_t)n_tok * hq * hd, nk = (size_t)n_tok * hkv * hd;
    void *got_q = malloc(nq * es), *got_k = malloc(nk * es);
    for (int t = 0; t < n_tok; t++) {
        memcpy((char *)got_q + (size_t)t * hq * hd * es, (char *)all + (size_t)t * stride * es,
               (size_t)hq * hd * es);
        memcpy((char *)got_k + (size_t)t * hkv * hd * es, (char *)out + (size_t)t * ostride * es,
               (size_t)hkv * hd * es);
        /* k and v columns of the QKV row are untouched */
        size_t kv0 = ((size_t)t * stride + (size_t)hq * hd) * es;
        assert_memory_equal((char *)all + kv0, (char *)xh + kv0, (size_t)2 * hkv * hd * es);
        /* the pad of the out-of-place rows keeps its poison */
        for (size_t b = (size_t)hkv * hd * es; b < (size_t)ostride * es; b++)
            assert_int_equal(((unsigned char *)out)[(size_t)t * ostride * es + b], 0xff);
    }
    char what[160];
    snprintf(what, sizeof what, "%s q (in place)", m->uri);
    if (act_f32)
        check_close_f32(what, got_q, ref_q, nq, 1e-5);
    else
        check_close(what, got_q, ref_q, nq, 1e-2);
    snprintf(what, sizeof what, "%s k (padded rows)", m->uri);
    if (act_f32)
        check_close_f32(what, got_k, ref_k, nk, 1e-5);
    else
        check_close(what, got_k, ref_k, nk, 1e-2);
    ms_cuda_module_free(m);
    dfree_all(&l);
    free(got_q);
    free(got_k);
    free(all);
    free(out);
    free(ref_q);
    free(ref_k);
    free(xf);
    free(xh);
    free(w);
}

static void test_rmsnorm_heads(void **state) {
    (void)state;
    const int hds[] = {48, 64, 128};
    for (int a = 0; a < 3; a++) {
        run_rmsnorm_heads_case(hds[a], false);
        run_rmsnorm_heads_case(hds[a], true);
    }
    /* the launcher checks dim against the instance's head_dim */
    ms_cuda_module *m = load(ms_kernel_spec_rmsnorm_heads(MS_KERNEL_DTYPE_BF16, 48));
    ms_rmsnorm_params p = {0};
    ms_error err = {0};
    int dummy = 0;
    p.x = &dummy; /* never launched */
    p.out = &dummy;
    p.weight = &dummy;
    p.n_rows = 1;
    p.n_heads = 2;
    p.dim = 64;
    p.x_stride = p.out_stride = 128;
    assert_int_equal(ms_cuda_rmsnorm_heads_launch(m, &p, 0, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "head_dim 48"));
    p.dim = 48;
    p.x_stride = 95; /* below 2 heads x 48 */
    assert_int_equal(ms_cuda_rmsnorm_heads_launch(m, &p, 0, &err), MS_ERR_INVALID_ARG);
    ms_cuda_module_free(m);
}

static void test_silu_mul(void **state) {
    (void)state;
    const int rows = 3, inter = 1536;
    size_t n_in = (size_t)rows * 2 * inter, n_out = (size_t)rows * inter;
    uint16_t *gu = malloc(n_in * 2);
    for (size_t i = 0; i < n_in; i++)
        gu[i] = f2bf(frand() * 6.f);
    double *ref = malloc(n_out * sizeof(double));
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < inter; i++) {
            double g = bf2f(gu[(size_t)r * 2 * inter + i]), u = bf2f(gu[(size_t)r * 2 * inter + inter + i]);
            ref[(size_t)r * inter + i] = g / (1.0 + exp(-g)) * u;
        }
    dev_list l = {0};
    void *dgu = dup_h2d(&l, gu, n_in * 2), *dout = dalloc(&l, n_out * 2);
    ms_cuda_module *m = load(ms_kernel_spec_simple(MS_KERNEL_OP_SILU_MUL, MS_KERNEL_DTYPE_BF16));
    ms_silu_mul_params p = {dgu, (uint16_t *)dgu + inter, dout, rows, inter, 2 * inter, 2 * inter,
                            inter, NULL, 0};
    ms_error err = {0};
    if (ms_cuda_silu_mul_launch(m, &p, 0, &err) != MS_OK)
        fail_msg("silu launch: %s", err.msg);
    sync_ok("silu_mul");
    uint16_t *got = malloc(n_out * 2);
    d2h(got, dout, n_out * 2);
    check_close(m->uri, got, ref, n_out, 1e-2);
    ms_cuda_module_free(m);
    dfree_all(&l);
    free(got);
    free(ref);
    free(gu);
}

static void test_embed(void **state) {
    (void)state;
    const int vocab = 1000, dim = 256, n = 6;
    const int32_t ids[6] = {5, 999, 0, 1000, -1, 17};
    uint16_t *table = malloc((size_t)vocab * dim * 2);
    for (size_t i = 0; i < (size_t)vocab * dim; i++)
        table[i] = f2bf(frand());
    dev_list l = {0};
    void *dtab = dup_h2d(&l, table, (size_t)vocab * dim * 2), *dout = dalloc(&l, (size_t)n * dim * 2);
    int32_t *dids = dup_h2d(&l, ids, sizeof ids);
    int32_t zero = 0;
    int32_t *dbad = dup_h2d(&l, &zero, sizeof zero);
    ms_cuda_module *m = load(ms_kernel_spec_simple(MS_KERNEL_OP_EMBED, MS_KERNEL_DTYPE_BF16));
    ms_embed_params p = {dids, dtab, dout, dbad, n, vocab, dim};
    ms_error err = {0};
    if (ms_cuda_embed_launch(m, &p, 0, &err) != MS_OK)
        fail_msg("embed launch: %s", err.msg);
    sync_ok("embed");
    uint16_t *got = malloc((size_t)n * dim * 2);
    int32_t bad = 0;
    d2h(got, dout, (size_t)n * dim * 2);
    d2h(&bad, dbad, sizeof bad);
    for (int t = 0; t < n; t++) {
        if (ids[t] >= 0 && ids[t] < vocab) {
            assert_memory_equal(&got[(size_t)t * dim], &table[(size_t)ids[t] * dim], (size_t)dim * 2);
        } else {
            for (int i = 0; i < dim; i++)
                assert_int_equal(got[(size_t)t * dim + i], 0);
        }
    }
    assert_int_equal(bad, 1);
    printf("  %-58s exact, out-of-range ids flagged\n", m->uri);
    ms_cuda_module_free(m);
    dfree_all(&l);
    free(got);
    free(table);
}

/* ---- argmax and sampling ---- */

static int ref_argmax(const float *row, int vocab) {
    int best = 0;
    for (int i = 1; i < vocab; i++)
        if (row[i] > row[best])
            best = i;
    return best;
}

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? 1 : (x > y ? -1 : 0);
}

/*
 * The semantics of ms_sample_params. Thresholds in double; the final draw sums in float in the
 * kernel's order (MS_SAMPLE_THREADS contiguous chunks, serial exclusive scan) so that rounding
 * of the running mass cannot move the boundary between the two implementations.
 */
static int ref_sample(const float *row, int vocab, float temp, int k, float top_p, float min_p, float u,
                      float *tau_out) {
    *tau_out = -INFINITY;
    if (!(temp > 0.f))
        return ref_argmax(row, vocab);
    float mx = row[ref_argmax(row, vocab)];
    if (isinf(mx) && mx > 0.f)
        return ref_argmax(row, vocab); /* +inf takes all the mass (the CPU sampler's rule) */
    float *sorted = malloc(sizeof(float) * (size_t)vocab);
    memcpy(sorted, row, sizeof(float) * (size_t)vocab);
    qsort(sorted, (size_t)vocab, sizeof(float), cmp_desc);
    float tau = sorted[vocab - 1];
    if (k > 0 && k < vocab)
        tau = sorted[k - 1];
    const float sc = 1.4426950408889634f / temp;
    if (top_p < 1.f) {
        double z = 0;
        for (int i = 0; i < vocab && sorted[i] >= tau; i++)
            z += exp2((double)((sorted[i] - mx) * sc));
        double target = (double)top_p * z, cum = 0;
        for (int i = 0; i < vocab && sorted[i] >= tau; i++) {
            cum += exp2((double)((sorted[i] - mx) * sc));
            if (cum >= target) {
                tau = sorted[i];
                break;
            }
        }
    }
    free(sorted);
    *tau_out = tau;
    const int nt = MS_SAMPLE_THREADS, chunk = (vocab + nt - 1) / nt;
    float sums[MS_SAMPLE_THREADS], total = 0.f;
    for (int t = 0; t < nt; t++) {
        float s = 0.f;
        for (int i = t * chunk; i < MS_MIN(vocab, (t + 1) * chunk); i++)
            if (row[i] >= tau && exp2f((row[i] - mx) * sc) >= min_p)
                s += exp2f((row[i] - mx) * sc);
        sums[t] = s;
    }
    float before[MS_SAMPLE_THREADS];
    for (int t = 0; t < nt; t++) {
        before[t] = total;
        total += sums[t];
    }
    float target = u * total;
    int last = -1;
    for (int t = 0; t < nt; t++) {
        int c0 = t * chunk, c1 = MS_MIN(vocab, c0 + chunk);
        if (sums[t] > 0.f && target >= before[t] && target < before[t] + sums[t]) {
            float run = before[t];
            int lk = -1;
            for (int i = c0; i < c1; i++)
                if (row[i] >= tau && exp2f((row[i] - mx) * sc) >= min_p) {
                    if (exp2f((row[i] - mx) * sc) > 0.f) /* a zero-mass token is never drawn */
                        lk = i;
                    run += exp2f((row[i] - mx) * sc);
                    if (target < run)
                        return i;
                }
            return lk;
        }
        for (int i = c0; i < c1; i++)
            if (row[i] >= tau && exp2f((row[i] - mx) * sc) >= min_p && exp2f((row[i] - mx) * sc) > 0.f)
                last = i;
    }
    return last >= 0 ? last : 0;
}

/* Does `got` (kept: row[got] >= tau) own the target u * total in the vocabulary-order cumulative
 * mass, in double, within 1e-5 of the total? Device exp2f and the host's may differ by an ulp, so
 * a target that close to a boundary may go either way. */
static bool sample_close(const float *row, int vocab, float temp, float tau, float min_p, float u, int got) {
    float mx = row[ref_argmax(row, vocab)];
    const float sc = 1.4426950408889634f / temp;
    if (got < 0 || got >= vocab || !(row[got] >= tau) || !(exp2f((row[got] - mx) * sc) >= min_p))
        return false;
    double total = 0, before = 0;
    for (int i = 0; i < vocab; i++)
        if (row[i] >= tau && exp2f((row[i] - mx) * sc) >= min_p) {
            if (i == got)
                before = total;
            total += exp2((double)((row[i] - mx) * sc));
        }
    double target = (double)u * total, mine = exp2((double)((row[got] - mx) * sc));
    return target >= before - 1e-5 * total && target < before + mine + 1e-5 * total;
}

static void test_argmax(void **state) {
    (void)state;
    const int rows = 4, vocab = 50257;
    float *lg = malloc(sizeof(float) * (size_t)rows * vocab);
    for (size_t i = 0; i < (size_t)rows * vocab; i++)
        lg[i] = frand() * 10.f;
    lg[(size_t)1 * vocab + 777] = 50.f; /* tie: the first index wins */
    lg[(size_t)1 * vocab + 40000] = 50.f;
    lg[(size_t)2 * vocab + vocab - 1] = 60.f; /* the last index */
    for (int i = 0; i < vocab; i++)
        lg[(size_t)3 * vocab + i] = 1.f; /* all equal -> 0 */
    dev_list l = {0};
    void *dl = dup_h2d(&l, lg, sizeof(float) * (size_t)rows * vocab);
    int32_t *dids = dalloc(&l, sizeof(int32_t) * (size_t)rows);
    ms_cuda_module *m = load(ms_kernel_spec_simple(MS_KERNEL_OP_ARGMAX, MS_KERNEL_DTYPE_F32));
    ms_argmax_params p = {dl, dids, rows, vocab, vocab};
    ms_error err = {0};
    if (ms_cuda_argmax_launch(m, &p, 0, &err) != MS_OK)
        fail_msg("argmax launch: %s", err.msg);
    sync_ok("argmax");
    int32_t got[4];
    d2h(got, dids, sizeof got);
    for (int r = 0; r < rows; r++)
        assert_int_equal(got[r], ref_argmax(&lg[(size_t)r * vocab], vocab));
    assert_int_equal(got[1], 777);
    assert_int_equal(got[2], vocab - 1);
    assert_int_equal(got[3], 0);
    printf("  %-58s exact (ties -> first index)\n", m->uri);
    ms_cuda_module_free(m);
    dfree_all(&l);
    free(lg);
}

static void test_sample(void **state) {
    (void)state;
    /* rows 0-7 on flat logits; 8-13 at low temperatures, where the kept set is small: the kernel's
     * shared-memory candidate path (top-p alone, top-k at its bound of MS_SAMPLE_THREADS, min_p
     * alone and with both); 3, 5, 7 and 12 overflow or have no bound: the whole-row search. Row 14:
     * -1 everywhere but +0 and -0 (k = 2 keeps both: the searches order keys, -0 < +0); row 15: a
     * +inf logit, which takes all the mass */
    enum { ROWS = 16 };
    const int vocab = 32000;
    const float temp[ROWS] = {0.f, 1.f, 0.8f, 1.f, 1.2f, 0.6f, 1.f, 0.9f, 0.1f, 0.5f, 0.1f, 0.2f, 0.7f, 0.05f, 1.f, 0.8f};
    const int topk[ROWS] = {0, 1, 40, 0, 100, 0, 5, 2000, 0, 512, 0, 3, 0, 50, 2, 40};
    const float topp[ROWS] = {1.f, 1.f, 1.f, 0.9f, 0.5f, 1.f, 0.3f, 0.95f, 0.9f, 1.f, 1.f, 0.95f, 1.f, 0.999f, 1.f, 1.f};
    const float minp[ROWS] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.05f, 0.1f, 0.f, 0.01f, 0.f, 0.f};
    float unif[ROWS];
    for (int r = 0; r < ROWS; r++)
        unif[r] = (float)((double)(rng_next() >> 40) * 0x1p-24);
    float *lg = malloc(sizeof(float) * (size_t)ROWS * vocab);
    for (size_t i = 0; i < (size_t)ROWS * vocab; i++)
        lg[i] = frand() * 4.f + frand() * 4.f;
    for (int i = 0; i < vocab; i++)
        lg[(size_t)14 * vocab + i] = -1.f;
    lg[(size_t)14 * vocab + 0] = 0.f;
    lg[(size_t)14 * vocab + 4] = -0.f;
    lg[(size_t)15 * vocab + 987] = INFINITY;
    dev_list l = {0};
    void *dl = dup_h2d(&l, lg, sizeof(float) * (size_t)ROWS * vocab);
    float *dt = dup_h2d(&l, temp, sizeof temp), *dp = dup_h2d(&l, topp, sizeof topp);
    float *du = dup_h2d(&l, unif, sizeof unif);
    int32_t *dk = dup_h2d(&l, topk, sizeof topk);
    float *dm = dup_h2d(&l, minp, sizeof minp);
    int32_t *dids = dalloc(&l, sizeof(int32_t) * ROWS);
    ms_cuda_module *m = load(ms_kernel_spec_simple(MS_KERNEL_OP_SAMPLE, MS_KERNEL_DTYPE_F32));
    ms_sample_params p = {dl, dt, dk, dp, du, dids, ROWS, vocab, vocab, dm};
    ms_error err = {0};
    if (ms_cuda_sample_launch(m, &p, 0, &err) != MS_OK)
        fail_msg("sample launch: %s", err.msg);
    sync_ok("sample");
    int32_t got[ROWS];
    d2h(got, dids, sizeof got);
    for (int r = 0; r < ROWS; r++) {
        float tau;
        int want = ref_sample(&lg[(size_t)r * vocab], vocab, temp[r], topk[r], topp[r], minp[r], unif[r],
                              &tau);
        if (got[r] != want && !(temp[r] > 0.f &&
                                sample_close(&lg[(size_t)r * vocab], vocab, temp[r], tau, minp[r], unif[r],
                                             got[r])))
            fail_msg("sample row %d (T %g, k %d, p %g, min_p %g, u %g): got %d, reference %d", r,
                     (double)temp[r], topk[r], (double)topp[r], (double)minp[r], (double)unif[r], got[r], want);
    }
    if (got[14] != 0 && got[14] != 4)
        fail_msg("sample row 14 (+0 and -0, k 2): got %d, not one of the zeros", got[14]);
    assert_int_equal(got[15], 987);
    printf("  %-58s %d rows match (greedy, top-k, top-p, min_p, both; signed zeros, +inf)\n", m->uri, ROWS);
    ms_cuda_module_free(m);
    dfree_all(&l);
    free(lg);
}

/* ---- launcher preconditions (no launch happens) ---- */

/* ---- the 16-bit weight GEMV (misc/gemv.cuh) ---- */

/* IEEE half bits of a float exactly representable as a normal half (or zero). */
static uint16_t f2h_exact(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) == 0)
        return (uint16_t)(u >> 16);
    const uint32_t sign = (u >> 16) & 0x8000u, e = ((u >> 23) & 0xffu) - 127u + 15u;
    return (uint16_t)(sign | (e << 10) | ((u >> 13) & 0x3ffu));
}

/* One GEMV case: y [n, rows] (row stride ys) = T(x [n, in] (stride xs)) W [rows, in] (stride ws)^T
 * against a double reference on the same T-rounded inputs. Each output must be within 2^-14 of
 * sum |x w| (float accumulation over at most a few thousand terms: a wrong k pairing or a lost
 * block is off by O(|x w|)); the columns past rows and the rows past n stay poisoned; a second
 * launch gives the same bits. */
static void gemv_case(ms_cuda_module *m, bool f16, int rows, int in, int n, int ws, int xs, int ys) {
    const size_t nw = (size_t)rows * (size_t)ws, nx = (size_t)n * (size_t)xs, ny = (size_t)8 * (size_t)ys;
    uint16_t *hw = malloc(nw * 2);
    float *wv = malloc(nw * sizeof(float)), *hx = malloc(nx * sizeof(float));
    for (size_t i = 0; i < nw; i++) {
        /* f16: k / 1024 (exact); bf16: any float rounded */
        const float v = f16 ? (float)(irand(2049) - 1024) / 1024.f : rbf(frand());
        wv[i] = v;
        hw[i] = f16 ? f2h_exact(v) : f2bf(v);
    }
    for (size_t i = 0; i < nx; i++) /* f16: k / 256 (exact, so T(x) = x); bf16: the kernel rounds */
        hx[i] = f16 ? (float)(irand(1025) - 512) / 256.f : frand() * 3.f;
    double *ref = malloc((size_t)n * (size_t)rows * sizeof(double)), *mag = malloc((size_t)n * (size_t)rows * sizeof(double));
    for (int c = 0; c < n; c++)
        for (int r = 0; r < rows; r++) {
            double acc = 0, a = 0;
            for (int i = 0; i < in; i++) {
                const double xv = f16 ? hx[(size_t)c * xs + i] : rbf(hx[(size_t)c * xs + i]);
                const double t = xv * wv[(size_t)r * ws + i];
                acc += t;
                a += fabs(t);
            }
            ref[(size_t)c * rows + r] = acc;
            mag[(size_t)c * rows + r] = a;
        }
    dev_list l = {0};
    void *dw = dup_h2d(&l, hw, nw * 2), *dx = dup_h2d(&l, hx, nx * sizeof(float));
    float *dy = dalloc(&l, ny * sizeof(float));
    ms_gemv_params p = {dw, dx, dy, rows, in, n, ws, xs, ys, 0, NULL, 0.f};
    ms_error err = {0};
    float *got = malloc(ny * sizeof(float)), *again = malloc(ny * sizeof(float));
    for (int run = 0; run < 2; run++) {
        if (ms_cuda_gemv_launch(m, &p, 0, &err) != MS_OK)
            fail_msg("gemv launch: %s", err.msg);
        sync_ok("gemv");
        d2h(run == 0 ? got : again, dy, ny * sizeof(float));
    }
    double worst = 0;
    for (int c = 0; c < 8; c++)
        for (int r = 0; r < ys; r++) {
            const float g = got[(size_t)c * ys + r];
            if (c >= n || r >= rows) {
                if (!isnan(g))
                    fail_msg("gemv %d x %d, n %d: y[%d][%d] = %g written outside the output", rows, in,
                             n, c, r, g);
                continue;
            }
            const double d = fabs(g - ref[(size_t)c * rows + r]), lim = mag[(size_t)c * rows + r] * 0x1p-14 + 1e-30;
            if (!(d <= lim))
                fail_msg("gemv %s %d x %d, n %d: y[%d][%d] = %.9g, reference %.9g (|x w| sum %g)",
                         f16 ? "f16" : "bf16", rows, in, n, c, r, g, ref[(size_t)c * rows + r],
                         mag[(size_t)c * rows + r]);
            if (d / lim > worst)
                worst = d / lim;
        }
    if (memcmp(got, again, ny * sizeof(float)) != 0)
        fail_msg("gemv %d x %d, n %d: two launches differ", rows, in, n);
    printf("  gemv %-4s %5d x %-5d n %d  strides w %d x %d y %d: worst error %.3f of the bound\n",
           f16 ? "f16" : "bf16", rows, in, n, ws, xs, ys, worst);
    dfree_all(&l);
    free(hw);
    free(wv);
    free(hx);
    free(ref);
    free(mag);
    free(got);
    free(again);
}

static void test_gemv(void **state) {
    (void)state;
    for (int f = 0; f < 2; f++) {
        ms_kernel_spec s = ms_kernel_spec_simple(MS_KERNEL_OP_MISC, f ? MS_KERNEL_DTYPE_F16 : MS_KERNEL_DTYPE_BF16);
        s.act_dtype = MS_KERNEL_DTYPE_F32;
        ms_cuda_module *m = load(s);
        /* rows: one tile, a ragged last tile, many; in: one 8-value step, a block tail, many
           blocks per warp; n 1..8; padded strides */
        static const int cases[][6] = {
            {389, 4104, 1, 4104, 4108, 400}, {389, 4104, 2, 4112, 4104, 389}, {16, 64, 8, 64, 64, 16},
            {17, 8, 3, 8, 12, 20},           {40, 128, 6, 128, 128, 44},           {1000, 576, 5, 584, 576, 1003},  {64, 1000, 7, 1000, 1000, 64},
            {4096, 4096, 8, 4096, 4096, 4096}, {6144, 4096, 1, 4096, 4096, 6144}, {4096, 14336, 4, 14336, 14336, 4096},
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
            gemv_case(m, f != 0, cases[i][0], cases[i][1], cases[i][2], cases[i][3], cases[i][4], cases[i][5]);
        ms_cuda_module_free(m);
    }
}

/* ms_convert (misc/elementwise.cuh), f32 -> bf16 / f16 as every 16-bit linear's input: bitwise
 * equal to the host's round-to-nearest-even, on the 8-element path (columns and strides multiples
 * of 8) and the element path (odd columns, odd strides, an offset pointer), with more rows than a
 * grid's y dimension holds; the padding between rows stays poisoned (dalloc fills 0xff). */
static void convert_case(ms_cuda_module *m, bool f16, int rows, int cols, int xs, int ys, int off) {
    const size_t nx = (size_t)rows * (size_t)xs, ny = (size_t)rows * (size_t)ys + (size_t)off;
    float *hx = malloc(nx * sizeof(float));
    for (size_t i = 0; i < nx; i++) /* f16: k / 1024, exact (the placement is what is tested) */
        hx[i] = f16 ? (float)(irand(4097) - 2048) / 1024.f : frand() * 1e3f;
    dev_list l = {0};
    void *dx = dup_h2d(&l, hx, nx * sizeof(float));
    uint16_t *dy = dalloc(&l, ny * 2);
    ms_misc_params p = {dx, NULL, dy + off, NULL, rows, cols, xs, 0, ys};
    ms_error err = {0};
    if (ms_cuda_misc_launch(m, 0, &p, 0, &err) != MS_OK)
        fail_msg("convert launch: %s", err.msg);
    sync_ok("convert");
    uint16_t *got = malloc(ny * 2);
    d2h(got, dy, ny * 2);
    for (int i = 0; i < off; i++)
        if (got[i] != 0xffffu)
            fail_msg("convert: element %d before the output written", i);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < ys; c++) {
            const uint16_t g = got[off + (size_t)r * ys + c];
            const float v = hx[(size_t)r * xs + c < nx ? (size_t)r * xs + c : 0];
            const uint16_t want = c >= cols ? 0xffffu : f16 ? f2h_exact(v) : f2bf(v);
            if (g != want)
                fail_msg("convert %s %d x %d (strides %d / %d, offset %d): [%d][%d] = 0x%04x, want "
                         "0x%04x",
                         f16 ? "f16" : "bf16", rows, cols, xs, ys, off, r, c, g, want);
        }
    dfree_all(&l);
    free(hx);
    free(got);
}

static void test_convert(void **state) {
    (void)state;
    for (int f = 0; f < 2; f++) {
        ms_kernel_spec s = ms_kernel_spec_simple(MS_KERNEL_OP_MISC, f ? MS_KERNEL_DTYPE_F16 : MS_KERNEL_DTYPE_BF16);
        s.act_dtype = MS_KERNEL_DTYPE_F32;
        ms_cuda_module *m = load(s);
        convert_case(m, f != 0, 37, 4096, 4096, 4096, 0);    /* vectors, 2 column blocks */
        convert_case(m, f != 0, 5, 14336, 28672, 14344, 8);  /* a slice of gate/up, padded out */
        convert_case(m, f != 0, 9, 37, 41, 39, 0);           /* elements */
        convert_case(m, f != 0, 3, 64, 64, 64, 3);           /* vectors refused: offset output */
        convert_case(m, f != 0, 70001, 8, 8, 10, 0);         /* rows past the grid's y */
        ms_cuda_module_free(m);
    }
}

static void test_gemv_rejects_bad_params(void **state) {
    (void)state;
    ms_kernel_spec s = ms_kernel_spec_simple(MS_KERNEL_OP_MISC, MS_KERNEL_DTYPE_BF16);
    s.act_dtype = MS_KERNEL_DTYPE_F32;
    ms_cuda_module *m = load(s);
    dev_list l = {0};
    void *w = dalloc(&l, 64 * 64 * 2), *x = dalloc(&l, 9 * 64 * 4), *y = dalloc(&l, 9 * 64 * 4);
    const ms_gemv_params good = {w, x, y, 64, 64, 1, 64, 64, 64, 0, NULL, 0.f};
    ms_gemv_params bad[7];
    for (int i = 0; i < 7; i++)
        bad[i] = good;
    bad[0].n = 0;
    bad[1].n = 9;
    bad[2].in = 60;                          /* not a multiple of 8 */
    bad[3].x_stride = 66;                    /* not a multiple of 4 */
    bad[4].w = (char *)w + 2;                /* misaligned */
    bad[5].w_stride = 56;                    /* below in */
    bad[6].y = NULL;
    ms_error err = {0};
    for (int i = 0; i < 7; i++) {
        assert_int_equal(ms_cuda_gemv_launch(m, &bad[i], 0, &err), MS_ERR_INVALID_ARG);
        assert_non_null(strstr(err.msg, "misc_bf16"));
    }
    assert_int_equal(ms_cuda_gemv_launch(m, &good, 0, &err), MS_OK);
    sync_ok("gemv");
    ms_cuda_module_free(m);
    dfree_all(&l);
}

static void test_launchers_reject_bad_params(void **state) {
    (void)state;
    ms_cuda_module *m = load(ms_kernel_spec_attn_decode(MS_KERNEL_DTYPE_BF16, 64, 16, 4, false));
    ms_attn_kernel_params p = {0};
    ms_error err = {0};
    p.batch = 1;
    p.n_kv_heads = 2;
    p.n_q_heads = 6; /* not 2 x 4 */
    assert_int_equal(ms_cuda_attn_decode_launch(m, &p, 0, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "group 4"));
    ms_rmsnorm_params rp = {0};
    assert_int_equal(ms_cuda_rmsnorm_launch(m, &rp, 0, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "attn_decode_bf16_hd64_ps16_g4"));
    ms_cuda_module_free(m);
}

static int group_setup(void **state) {
    (void)state;
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
        fprintf(stderr, "test_gpu_kernels: no CUDA device\n");
        return -1;
    }
    ms_error err = {0};
    if (ms_cuda_device_arch(0, &g_arch, &g_sms, &err) != MS_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    const char *seed = getenv("MS_TEST_SEED");
    g_rng = seed != NULL ? strtoull(seed, NULL, 10) : (uint64_t)time(NULL);
    const char *c = getenv("MS_KERNEL_CACHE_TEST");
    g_cache = c != NULL && c[0] != '\0' ? c : "build/kernel-cache-test";
    printf("test_gpu_kernels: sm_%d, %d SMs, seed %llu (MS_TEST_SEED to repeat), cache %s\n",
           g_arch, g_sms, (unsigned long long)g_rng, g_cache);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_launchers_reject_bad_params),
        ms_unit_test(test_embed),
        ms_unit_test(test_rmsnorm),
        ms_unit_test(test_rmsnorm_heads),
        ms_unit_test(test_silu_mul),
        ms_unit_test(test_gemv),
        ms_unit_test(test_convert),
        ms_unit_test(test_gemv_rejects_bad_params),
        ms_unit_test(test_argmax),
        ms_unit_test(test_sample),
        ms_unit_test(test_rope_kv),
        ms_unit_test(test_rope_kv_mrope),
        ms_unit_test(test_attn_decode),
        ms_unit_test(test_attn_decode_waits_for_the_kernel_before),
        ms_unit_test(test_attn_prefill),
        ms_unit_test(test_attn_prefill_as_decode),
    };
    return cmocka_run_group_tests(tests, group_setup, NULL);
}
