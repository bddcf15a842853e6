/*
 * test_backend_cuda.c - the CUDA backend against the CPU backend (the oracle), op by op, through
 * the op interface only (GPU_TESTS: `make gpu-test`).
 *
 * Both backends get the same host data: weights and the KV arena in bf16 on both (the CPU backend
 * converts on the fly), activations f32. Fresh random inputs every run (seed printed;
 * MS_TEST_SEED repeats), GPU outputs poisoned with NaN before each op. Tolerances (relative
 * error ||gpu - cpu|| / ||cpu||):
 *   linear 1e-2 (the GPU rounds x to bf16 for the tensor cores), rms_norm / add_rms_norm /
 *   silu_mul / rope 1e-4 (f32 on both, different reduction order and sincosf), add, gather,
 *   embedding, argmax exact, attention prefill 2e-2 (q and P rounded to bf16 on the tensor cores),
 *   attention decode 1e-2.
 * The attention steps run a ragged prefill (3 sequences of 5, 17 and 300 tokens, page size 16,
 * GQA 4, head_dim 64, RoPE + KV write fused) and then one decode step over the same pages (split
 * KV on the long sequence), causal and with a sliding window of 8.
 */
#include "ms_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend_cuda.h"
#include "gguf_quant.h"
#include "kernel.h"

#include "ms_test_impl.h"

static ms_backend g_cpu, g_gpu;
static uint64_t g_rng;

static float frand(void) {
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)((double)(z >> 11) * 0x1p-53 * 2.0 - 1.0);
}

/* Run an op that fills the `err` in scope; fail the test with its message. */
#define OK(expr)                                                                                  \
    do {                                                                                          \
        if ((expr) != MS_OK)                                                                      \
            fail_msg("%s: %s", #expr, err.msg);                                                   \
    } while (0)

/* A buffer on both backends with the same contents. */
typedef struct both {
    void *c, *g;
    size_t bytes;
} both;

static both both_alloc(size_t bytes, const void *host) {
    both b = {NULL, NULL, bytes};
    ms_error err = {0};
    if (g_cpu.iface.buffer_alloc(g_cpu.ctx, bytes, "test", &b.c, &err) != MS_OK ||
        g_gpu.iface.buffer_alloc(g_gpu.ctx, bytes, "test", &b.g, &err) != MS_OK)
        fail_msg("alloc: %s", err.msg);
    if (host != NULL) {
        assert_int_equal(g_cpu.iface.copy_to_backend(g_cpu.ctx, b.c, host, bytes, &err), MS_OK);
        assert_int_equal(g_gpu.iface.copy_to_backend(g_gpu.ctx, b.g, host, bytes, &err), MS_OK);
    } else {
        assert_int_equal(g_cpu.iface.buffer_fill(g_cpu.ctx, b.c, 0xff, bytes, &err), MS_OK);
        assert_int_equal(g_gpu.iface.buffer_fill(g_gpu.ctx, b.g, 0xff, bytes, &err), MS_OK);
    }
    return b;
}

static void both_free(both *b) {
    g_cpu.iface.buffer_free(g_cpu.ctx, b->c);
    g_gpu.iface.buffer_free(g_gpu.ctx, b->g);
}

static float *rand_host(size_t n, float scale) {
    float *h = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        h[i] = frand() * scale;
    return h;
}

/* A tensor over the CPU (which = 0) or GPU (1) copy of b: `like` carries its byte offset into
 * the buffer in place of a data pointer (see t2). */
static ms_tensor on(const both *b, int which, ms_tensor like) {
    like.data = (char *)(which ? b->g : b->c) + (uintptr_t)like.data;
    return like;
}

/* Compare the f32 contents of a view (2-D [rows, cols] with row stride rs, at element offset
 * off) on both backends. */
static void compare(const char *what, const both *b, int64_t off, int64_t rows, int64_t cols,
                    int64_t rs, double tol) {
    ms_error err = {0};
    float *hc = malloc(b->bytes), *hg = malloc(b->bytes);
    assert_int_equal(g_cpu.iface.copy_to_host(g_cpu.ctx, hc, b->c, b->bytes, &err), MS_OK);
    if (g_gpu.iface.copy_to_host(g_gpu.ctx, hg, b->g, b->bytes, &err) != MS_OK)
        fail_msg("%s: %s", what, err.msg);
    double num = 0, den = 0, mx = 0;
    long nan = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < cols; i++) {
            double c = hc[off + r * rs + i], g = hg[off + r * rs + i];
            if (isnan(g) || isinf(g)) {
                nan++;
                continue;
            }
            num += (g - c) * (g - c);
            den += c * c;
            mx = fmax(mx, fabs(g - c));
        }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    printf("  %-44s rel %.2e  max|d| %.2e  (tol %.0e)%s\n", what, rel, mx, tol, nan ? " NaN!" : "");
    free(hc);
    free(hg);
    if (nan > 0 || !(rel <= tol))
        fail_msg("%s: %ld NaN, relative error %.3e > %.0e", what, nan, rel, tol);
}

/* Largest |a - b| / (|b| + 1) over n floats. */
static double max_rel(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs((double)a[i] - (double)b[i]) / (fabs((double)b[i]) + 1.0));
    return m;
}

/* A 2-D layout at element offset off (held as a byte offset in data until on() rebases it). */
static ms_tensor t2(int64_t off, ms_dtype dt, int64_t n0, int64_t n1, int64_t s0) {
    ms_tensor t = ms_tensor_2d((void *)(uintptr_t)((size_t)off * ms_dtype_size(dt)), dt, n0, n1);
    t.stride[0] = s0;
    return t;
}

/* A bf16 weight [out, f] and bias [out] from host floats on both backends: the buffers (*w, *b)
 * and their layouts (*wd, *bd, offsets for on()). */
static void load_w_bias(const float *hw, const float *hb, int out, int f, both *w, both *b,
                        ms_tensor *wd, ms_tensor *bd) {
    ms_error err = {0};
    *w = both_alloc((size_t)out * f * 2, NULL);
    *b = both_alloc((size_t)out * 2, NULL);
    ms_tensor wsrc = ms_tensor_2d((void *)hw, MS_DTYPE_F32, out, f);
    ms_tensor bsrc = ms_tensor_1d((void *)hb, MS_DTYPE_F32, out);
    *wd = t2(0, MS_DTYPE_BF16, out, f, f);
    *bd = ms_tensor_1d(NULL, MS_DTYPE_BF16, out);
    for (int which = 0; which < 2; which++) {
        ms_backend *be = which ? &g_gpu : &g_cpu;
        ms_tensor wt = on(w, which, *wd), bt = on(b, which, *bd);
        OK(be->iface.tensor_load(be->ctx, &wt, &wsrc, &err));
        OK(be->iface.tensor_load(be->ctx, &bt, &bsrc, &err));
    }
}

/* ---- linear(silu(gate) * up, w): the fused op ---- */

/* ms_backend_silu_mul_linear on the GPU against its own silu_mul then linear (bitwise: the fused
 * path writes the product straight in bf16, the same bits the f32 product and the linear's
 * convert give, and runs the same GEMM), and against the CPU (1e-2, as linear): gate and up the
 * halves of one gate/up row as the generated forward passes them, y a column slice, with and
 * without a bf16 bias, at 1 and 3 rows (the GEMV's sizes: the unfused path) and 6 and 37. */
static void test_silu_mul_linear(void **state) {
    (void)state;
    ms_error err = {0};
    const int f = 1024, out = 320, ys = 336, nmax = 37;
    float *hgu = rand_host((size_t)nmax * 2 * f, 3.f), *hw = rand_host((size_t)out * f, 0.05f);
    float *hb = rand_host((size_t)out, 1.f);
    both w, b;
    ms_tensor wd, bd;
    load_w_bias(hw, hb, out, f, &w, &b, &wd, &bd);
    const size_t gub = (size_t)nmax * 2 * f * 4, yb = (size_t)nmax * ys * 4;
    float *fused = malloc(yb), *split = malloc(yb);
    const int ns[] = {1, 3, 6, 37};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            const int n = ns[k];
            both gu = both_alloc(gub, hgu), gu2 = both_alloc(gub, hgu);
            both y = both_alloc(yb, NULL), y2 = both_alloc(yb, NULL);
            ms_tensor gt = t2(0, MS_DTYPE_F32, n, f, 2 * f), ut = t2(f, MS_DTYPE_F32, n, f, 2 * f);
            ms_tensor yt = t2(8, MS_DTYPE_F32, n, out, ys);
            for (int which = 0; which < 2; which++) {
                ms_backend *be = which ? &g_gpu : &g_cpu;
                ms_tensor g = on(&gu, which, gt), u = on(&gu, which, ut), yy = on(&y, which, yt);
                ms_tensor ww = on(&w, which, wd), bb = on(&b, which, bd);
                OK(ms_backend_silu_mul_linear(be, &g, &u, &g, &ww, with_bias ? &bb : NULL, &yy,
                                              &err));
            }
            char what[96];
            snprintf(what, sizeof what, "silu_mul_linear, %d rows%s", n, with_bias ? ", bias" : "");
            compare(what, &y, 8, n, out, ys, 1e-2);
            /* the GPU's unfused pair over a fresh copy */
            ms_tensor g = on(&gu2, 1, gt), u = on(&gu2, 1, ut), yy = on(&y2, 1, yt);
            ms_tensor ww = on(&w, 1, wd), bb = on(&b, 1, bd);
            OK(g_gpu.iface.silu_mul(g_gpu.ctx, &g, &u, &g, &err));
            OK(g_gpu.iface.linear(g_gpu.ctx, &g, &ww, with_bias ? &bb : NULL, &yy, &err));
            OK(g_gpu.iface.copy_to_host(g_gpu.ctx, fused, y.g, yb, &err));
            OK(g_gpu.iface.copy_to_host(g_gpu.ctx, split, y2.g, yb, &err));
            if (memcmp(fused, split, yb) != 0)
                fail_msg("%s: the fused op differs from silu_mul + linear on the GPU", what);
            both_free(&gu);
            both_free(&gu2);
            both_free(&y);
            both_free(&y2);
        }
    both_free(&w);
    both_free(&b);
    free(fused);
    free(split);
    free(hgu);
    free(hw);
    free(hb);
}

/* ms_backend_rms_norm_linear on the GPU against its own norm then linear (bitwise: the fused path
 * writes the norm straight in bf16, the bits the f32 norm and the linear's convert give, and runs
 * the same GEMM; the residual after the add bitwise too; at the GEMV's sizes without a residual
 * the norm is folded into the GEMV: within 1e-2), and against the CPU (1e-2): plain and after the
 * residual add, with and without a bf16 bias, at 1 and 3 rows (the GEMV's sizes) and 6 and 37, y
 * a column slice. */
static void test_rms_norm_linear(void **state) {
    (void)state;
    ms_error err = {0};
    const int d = 512, out = 320, ys = 336, nmax = 37;
    float *hx = rand_host((size_t)nmax * d, 2.f), *hr = rand_host((size_t)nmax * d, 2.f);
    float *hn = rand_host(d, 0.5f), *hw = rand_host((size_t)out * d, 0.05f);
    float *hb = rand_host((size_t)out, 1.f);
    for (int i = 0; i < d; i++)
        hn[i] += 1.f;
    both nw = both_alloc((size_t)d * 2, NULL), w = both_alloc((size_t)out * d * 2, NULL);
    both b = both_alloc((size_t)out * 2, NULL);
    ms_tensor nsrc = ms_tensor_1d(hn, MS_DTYPE_F32, d), nd = ms_tensor_1d(NULL, MS_DTYPE_BF16, d);
    ms_tensor wsrc = ms_tensor_2d(hw, MS_DTYPE_F32, out, d), wd = t2(0, MS_DTYPE_BF16, out, d, d);
    ms_tensor bsrc = ms_tensor_1d(hb, MS_DTYPE_F32, out), bd = ms_tensor_1d(NULL, MS_DTYPE_BF16, out);
    for (int which = 0; which < 2; which++) {
        ms_backend *be = which ? &g_gpu : &g_cpu;
        ms_tensor nt = on(&nw, which, nd), wt = on(&w, which, wd), bt = on(&b, which, bd);
        OK(be->iface.tensor_load(be->ctx, &nt, &nsrc, &err));
        OK(be->iface.tensor_load(be->ctx, &wt, &wsrc, &err));
        OK(be->iface.tensor_load(be->ctx, &bt, &bsrc, &err));
    }
    const size_t xb = (size_t)nmax * d * 4, yb = (size_t)nmax * ys * 4;
    float *f1 = malloc(yb), *f2 = malloc(yb), *r1 = malloc(xb), *r2 = malloc(xb);
    const int ns[] = {1, 3, 6, 37};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
        for (int mode = 0; mode < 4; mode++) {
            const int n = ns[k];
            const bool add = mode & 1, with_bias = mode & 2;
            both x = both_alloc(xb, hx), res = both_alloc(xb, hr), res2 = both_alloc(xb, hr);
            both h = both_alloc(xb, NULL), h2 = both_alloc(xb, NULL);
            both y = both_alloc(yb, NULL), y2 = both_alloc(yb, NULL);
            ms_tensor xt = t2(0, MS_DTYPE_F32, n, d, d), yt = t2(8, MS_DTYPE_F32, n, out, ys);
            for (int which = 0; which < 2; which++) {
                ms_backend *be = which ? &g_gpu : &g_cpu;
                ms_tensor xx = on(&x, which, xt), rr = on(&res, which, xt), hh = on(&h, which, xt);
                ms_tensor yy = on(&y, which, yt), nn = on(&nw, which, nd), ww = on(&w, which, wd);
                ms_tensor bb = on(&b, which, bd);
                OK(ms_backend_rms_norm_linear(be, add ? &rr : NULL, &xx, &nn, 1e-5f, &hh, &ww,
                                              with_bias ? &bb : NULL, &yy, &err));
            }
            char what[96];
            snprintf(what, sizeof what, "rms_norm_linear, %d rows%s%s", n, add ? ", residual" : "",
                     with_bias ? ", bias" : "");
            compare(what, &y, 8, n, out, ys, 1e-2);
            /* the GPU's unfused pair */
            ms_tensor xx = on(&x, 1, xt), rr = on(&res2, 1, xt), hh = on(&h2, 1, xt);
            ms_tensor yy = on(&y2, 1, yt), nn = on(&nw, 1, nd), ww = on(&w, 1, wd), bb = on(&b, 1, bd);
            if (add)
                OK(g_gpu.iface.add_rms_norm(g_gpu.ctx, &rr, &xx, &nn, 1e-5f, &hh, &err));
            else
                OK(g_gpu.iface.rms_norm(g_gpu.ctx, &xx, &nn, 1e-5f, &hh, &err));
            OK(g_gpu.iface.linear(g_gpu.ctx, &hh, &ww, with_bias ? &bb : NULL, &yy, &err));
            OK(g_gpu.iface.copy_to_host(g_gpu.ctx, f1, y.g, yb, &err));
            OK(g_gpu.iface.copy_to_host(g_gpu.ctx, f2, y2.g, yb, &err));
            OK(g_gpu.iface.copy_to_host(g_gpu.ctx, r1, res.g, xb, &err));
            OK(g_gpu.iface.copy_to_host(g_gpu.ctx, r2, res2.g, xb, &err));
            /* without a residual at the GEMV's sizes the norm is folded into the GEMV (x w
               rounded to bf16, not x rsqrt(..) w): close, not bitwise */
            const bool folded = !add && n <= 4;
            const double rel = max_rel(f1, f2, (size_t)nmax * ys);
            if (folded ? !(rel <= 1e-2) : memcmp(f1, f2, yb) != 0)
                fail_msg("%s: the fused op differs from the norm + linear on the GPU (max rel %.2e)",
                         what, rel);
            if (folded)
                printf("  %-44s folded norm vs norm + GEMV: max rel %.2e\n", what, rel);
            if (memcmp(r1, r2, xb) != 0)
                fail_msg("%s: the residual differs from add_rms_norm's", what);
            both_free(&x);
            both_free(&res);
            both_free(&res2);
            both_free(&h);
            both_free(&h2);
            both_free(&y);
            both_free(&y2);
        }
    both_free(&nw);
    both_free(&w);
    both_free(&b);
    free(f1);
    free(f2);
    free(r1);
    free(r2);
    free(hx);
    free(hr);
    free(hn);
    free(hw);
    free(hb);
}

/* ---- the Q4_0 / Q8_0 / Q4_K GEMV's x written quantized by the kernel before it ---- */

/* rms_norm_linear (with and without a residual add), silu_mul_linear and silu_mul_linear_add
 * over a Q4_0, Q8_0 or Q4_K weight: at the GEMV's rows (1 .. 8) the norm or the SiLU-and-multiply
 * writes x quantized per 32 values for it (backend_cuda.c norm_qx_linear / silu_mul_linear_to:
 * ms_rmsnorm_q8, ms_silu_mul_q8), where the unfused ops write float x and the linear quantizes
 * it (ms_qquant_x). y (and the residual) must equal the GPU's unfused ops bitwise, at every row
 * count, with and without a bias, y a column slice with old values in it (the _add ops add to
 * them); and y must be near the CPU's ops over the dequantized weight (2e-2: x rounded to 8 bits
 * per 32 values on the GPU). 9 rows: above the GEMV (dequantize + GEMM), the same comparisons. */
static void quant_x_producers_at(int d) {
    ms_error err = {0};
    const int out = 200, ys = 216, nmax = 9;
    const uint32_t types[] = {MS_GGML_TYPE_Q4_0, MS_GGML_TYPE_Q8_0, MS_GGML_TYPE_Q4_K};
    float *hx = rand_host((size_t)nmax * 2 * d, 2.f), *hr = rand_host((size_t)nmax * d, 2.f);
    float *hn = rand_host(d, 0.5f), *hw = rand_host((size_t)out * d, 0.05f), *hb = rand_host((size_t)out, 1.f);
    float *hy = rand_host((size_t)nmax * ys, 4.f);
    for (int i = 0; i < d; i++)
        hn[i] += 1.f;
    const size_t xb = (size_t)nmax * 2 * d * 4, yb = (size_t)nmax * ys * 4, rb = (size_t)nmax * d * 4;
    float *f1 = malloc(yb), *f2 = malloc(yb), *r1 = malloc(rb), *r2 = malloc(rb), *wf = malloc((size_t)out * d * 4);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const uint32_t type = types[ti];
        const ms_dtype qdt = ms_dtype_from_ggml(type);
        const size_t qbytes = (size_t)out * ms_dtype_row_bytes(qdt, d);
        void *blocks = malloc(qbytes);
        assert_non_null(blocks);
        OK(ms_ggml_quantize(type, hw, blocks, (size_t)out * d));
        OK(ms_ggml_dequantize(type, blocks, wf, (size_t)out * d));
        /* the GPU holds the blocks, the CPU their dequantized floats */
        both w = both_alloc((size_t)out * d * 4, NULL), nw = both_alloc((size_t)d * 4, NULL);
        both b = both_alloc((size_t)out * 2, NULL);
        ms_tensor qsrc = ms_tensor_2d(blocks, qdt, out, d), qd = t2(0, qdt, out, d, d);
        ms_tensor fsrc = ms_tensor_2d(wf, MS_DTYPE_F32, out, d), fd = t2(0, MS_DTYPE_F32, out, d, d);
        ms_tensor nsrc = ms_tensor_1d(hn, MS_DTYPE_F32, d), nd = ms_tensor_1d(NULL, MS_DTYPE_F32, d);
        ms_tensor bsrc = ms_tensor_1d(hb, MS_DTYPE_F32, out), bd = ms_tensor_1d(NULL, MS_DTYPE_BF16, out);
        for (int which = 0; which < 2; which++) {
            ms_backend *be = which ? &g_gpu : &g_cpu;
            ms_tensor wt = on(&w, which, which ? qd : fd), nt = on(&nw, which, nd), bt = on(&b, which, bd);
            OK(be->iface.tensor_load(be->ctx, &wt, which ? &qsrc : &fsrc, &err));
            OK(be->iface.tensor_load(be->ctx, &nt, &nsrc, &err));
            OK(be->iface.tensor_load(be->ctx, &bt, &bsrc, &err));
        }
        const int ns[] = {1, 2, 5, 8, 9};
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
            for (int mode = 0; mode < 8; mode++) {
                /* op: 0 rms_norm_linear, 1 the same with a residual, 2 silu_mul_linear, 3 _add */
                const int n = ns[k], op = mode & 3;
                const bool with_bias = mode & 4;
                both x = both_alloc(xb, hx), x2 = both_alloc(xb, hx), res = both_alloc(rb, hr),
                     res2 = both_alloc(rb, hr);
                both h = both_alloc(xb, NULL), h2 = both_alloc(xb, NULL);
                both y = both_alloc(yb, hy), y2 = both_alloc(yb, hy), t = both_alloc(yb, NULL);
                ms_tensor nt_ = t2(0, MS_DTYPE_F32, n, d, d);
                ms_tensor gt = t2(0, MS_DTYPE_F32, n, d, 2 * d), ut = t2(d, MS_DTYPE_F32, n, d, 2 * d);
                ms_tensor yt = t2(8, MS_DTYPE_F32, n, out, ys), ht = t2(0, MS_DTYPE_F32, n, d, d);
                ms_tensor tt = t2(0, MS_DTYPE_F32, n, out, out);
                for (int which = 0; which < 2; which++) {
                    ms_backend *be = which ? &g_gpu : &g_cpu;
                    ms_tensor ww = on(&w, which, which ? qd : fd), nn = on(&nw, which, nd), bb = on(&b, which, bd);
                    ms_tensor xx = on(&x, which, nt_), rr = on(&res, which, nt_), hh = on(&h, which, ht);
                    ms_tensor g = on(&x, which, gt), u = on(&x, which, ut), yy = on(&y, which, yt);
                    ms_tensor tm = on(&t, which, tt);
                    const ms_tensor *bp = with_bias ? &bb : NULL;
                    if (op <= 1)
                        OK(ms_backend_rms_norm_linear(be, op ? &rr : NULL, &xx, &nn, 1e-5f, &hh, &ww, bp, &yy,
                                                      &err));
                    else if (op == 2)
                        OK(ms_backend_silu_mul_linear(be, &g, &u, &hh, &ww, bp, &yy, &err));
                    else
                        OK(ms_backend_silu_mul_linear_add(be, &g, &u, &hh, &ww, bp, &tm, &yy, &err));
                }
                char what[96];
                static const char *names[] = {"rms_norm_linear", "add_rms_norm_linear", "silu_mul_linear",
                                              "silu_mul_linear_add"};
                snprintf(what, sizeof what, "%s %s, %d rows%s", ms_ggml_type_name(type), names[op], n,
                         with_bias ? ", bias" : "");
                compare(what, &y, 8, n, out, ys, 2e-2);
                /* the GPU's unfused ops over fresh copies */
                ms_tensor ww = on(&w, 1, qd), nn = on(&nw, 1, nd), bb = on(&b, 1, bd);
                ms_tensor xx = on(&x2, 1, nt_), rr = on(&res2, 1, nt_), hh = on(&h2, 1, ht);
                ms_tensor g = on(&x2, 1, gt), u = on(&x2, 1, ut), yy = on(&y2, 1, yt), tm = on(&t, 1, tt);
                ms_tensor hp = t2(0, MS_DTYPE_F32, n, d, d);
                hp = on(&h2, 1, hp);
                const ms_tensor *bp = with_bias ? &bb : NULL;
                if (op == 0)
                    OK(g_gpu.iface.rms_norm(g_gpu.ctx, &xx, &nn, 1e-5f, &hh, &err));
                else if (op == 1)
                    OK(g_gpu.iface.add_rms_norm(g_gpu.ctx, &rr, &xx, &nn, 1e-5f, &hh, &err));
                else
                    OK(g_gpu.iface.silu_mul(g_gpu.ctx, &g, &u, &hp, &err));
                if (op <= 2) {
                    OK(g_gpu.iface.linear(g_gpu.ctx, &hp, &ww, bp, &yy, &err));
                } else {
                    /* linear_add: y += h W^T in the GEMV's store, as the fused op adds */
                    OK(ms_backend_linear_add(&g_gpu, &hp, &ww, bp, &tm, &yy, &err));
                }
                OK(g_gpu.iface.copy_to_host(g_gpu.ctx, f1, y.g, yb, &err));
                OK(g_gpu.iface.copy_to_host(g_gpu.ctx, f2, y2.g, yb, &err));
                OK(g_gpu.iface.copy_to_host(g_gpu.ctx, r1, res.g, rb, &err));
                OK(g_gpu.iface.copy_to_host(g_gpu.ctx, r2, res2.g, rb, &err));
                if (memcmp(f1, f2, yb) != 0)
                    fail_msg("%s: the fused op differs from the unfused ops on the GPU (max rel %.2e)", what,
                             max_rel(f1, f2, (size_t)nmax * ys));
                if (memcmp(r1, r2, rb) != 0)
                    fail_msg("%s: the residual differs from the unfused ops'", what);
                /* the fused path ran: at the GEMV's rows the producer wrote the quantized x, not h
                   (tmp for the SiLU ops), which keeps its 0xff poison; above, h holds the floats */
                OK(g_gpu.iface.copy_to_host(g_gpu.ctx, r1, h.g, rb, &err));
                bool poisoned = true;
                for (size_t i = 0; i < (size_t)n * d; i++)
                    poisoned &= ((const uint32_t *)r1)[i] == 0xffffffffu;
                if (poisoned != (n <= 8))
                    fail_msg("%s: h %s, so the quantized-x path was %s", what, poisoned ? "unwritten" : "written",
                             n <= 8 ? "not taken" : "taken above the GEMV's rows");
                for (int r = 0; r < nmax; r++)
                    for (int i = 0; i < ys; i++)
                        if ((r >= n || i < 8 || i >= 8 + out) && f1[(size_t)r * ys + i] != hy[(size_t)r * ys + i])
                            fail_msg("%s: y[%d, %d] outside the output slice changed", what, r, i);
                both_free(&x);
                both_free(&x2);
                both_free(&res);
                both_free(&res2);
                both_free(&h);
                both_free(&h2);
                both_free(&y);
                both_free(&y2);
                both_free(&t);
            }
        both_free(&w);
        both_free(&nw);
        both_free(&b);
        free(blocks);
    }
    free(f1);
    free(f2);
    free(r1);
    free(r2);
    free(wf);
    free(hx);
    free(hr);
    free(hn);
    free(hw);
    free(hb);
    free(hy);
}

static void test_quant_x_producers(void **state) {
    (void)state;
    /* 1024: one 4-value vector a thread of the norm's CTA; 2304: its register path with a partial
       third step; 4352: its long-row path (more than 4 vectors a thread) with a partial last step
       (every width a multiple of Q4_K's 256) */
    const int dims[] = {1024, 2304, 4352};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
        quant_x_producers_at(dims[i]);
}

/* ---- x = x + linear(...): the residual linears ---- */

/* ms_backend_linear_add and ms_backend_silu_mul_linear_add on the GPU (the add in the GEMV's
 * output, cuBLAS's beta = 1) against the CPU's default (linear into tmp, then add: 1e-2 as linear)
 * and against the GPU's own linear into tmp then add: bitwise at the GEMV's sizes (1 and 3 rows,
 * y's old value + the same sum in both) without a bias, within 1e-6 through cuBLAS (6 and 37
 * rows: beta = 1 may round in another place) or with one (added after the sum, not to it); y a
 * column slice with a residual in it, with and without a bf16 bias;
 * the columns of y's rows outside the slice stay as they were. */
static void test_linear_add(void **state) {
    (void)state;
    ms_error err = {0};
    const int f = 1024, out = 320, ys = 336, nmax = 37;
    float *hgu = rand_host((size_t)nmax * 2 * f, 3.f), *hw = rand_host((size_t)out * f, 0.05f);
    float *hb = rand_host((size_t)out, 1.f), *hy = rand_host((size_t)nmax * ys, 4.f);
    both w, b;
    ms_tensor wd, bd;
    load_w_bias(hw, hb, out, f, &w, &b, &wd, &bd);
    const size_t gub = (size_t)nmax * 2 * f * 4, yb = (size_t)nmax * ys * 4;
    float *fused = malloc(yb), *split = malloc(yb);
    const int ns[] = {1, 3, 6, 37};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
        for (int mode = 0; mode < 4; mode++) {
            const int n = ns[k];
            const bool silu = mode & 1, with_bias = mode & 2;
            both gu = both_alloc(gub, hgu), gu2 = both_alloc(gub, hgu);
            both y = both_alloc(yb, hy), y2 = both_alloc(yb, hy);
            both tmp = both_alloc(yb, NULL), tmp2 = both_alloc(yb, NULL);
            ms_tensor gt = t2(0, MS_DTYPE_F32, n, f, 2 * f), ut = t2(f, MS_DTYPE_F32, n, f, 2 * f);
            ms_tensor yt = t2(8, MS_DTYPE_F32, n, out, ys), tt = t2(0, MS_DTYPE_F32, n, out, out);
            for (int which = 0; which < 2; which++) {
                ms_backend *be = which ? &g_gpu : &g_cpu;
                ms_tensor g = on(&gu, which, gt), u = on(&gu, which, ut), yy = on(&y, which, yt);
                ms_tensor ww = on(&w, which, wd), bb = on(&b, which, bd), tm = on(&tmp, which, tt);
                if (silu)
                    OK(ms_backend_silu_mul_linear_add(be, &g, &u, &g, &ww, with_bias ? &bb : NULL,
                                                      &tm, &yy, &err));
                else
                    OK(ms_backend_linear_add(be, &g, &ww, with_bias ? &bb : NULL, &tm, &yy, &err));
            }
            char what[96];
            snprintf(what, sizeof what, "%s, %d rows%s", silu ? "silu_mul_linear_add" : "linear_add",
                     n, with_bias ? ", bias" : "");
            compare(what, &y, 8, n, out, ys, 1e-2);
            /* the GPU's unfused ops over fresh copies */
            ms_tensor g = on(&gu2, 1, gt), u = on(&gu2, 1, ut), yy = on(&y2, 1, yt);
            ms_tensor ww = on(&w, 1, wd), bb = on(&b, 1, bd), tm = on(&tmp2, 1, tt);
            if (silu)
                OK(g_gpu.iface.silu_mul(g_gpu.ctx, &g, &u, &g, &err));
            OK(g_gpu.iface.linear(g_gpu.ctx, &g, &ww, with_bias ? &bb : NULL, &tm, &err));
            OK(g_gpu.iface.add(g_gpu.ctx, &yy, &tm, &yy, &err));
            OK(g_gpu.iface.copy_to_host(g_gpu.ctx, fused, y.g, yb, &err));
            OK(g_gpu.iface.copy_to_host(g_gpu.ctx, split, y2.g, yb, &err));
            /* outside the slice (columns before 8 and from 8 + out): untouched */
            for (int r = 0; r < nmax; r++)
                for (int i = 0; i < ys; i++)
                    if ((r >= n || i < 8 || i >= 8 + out) && fused[(size_t)r * ys + i] != hy[(size_t)r * ys + i])
                        fail_msg("%s: y[%d, %d] outside the output slice changed", what, r, i);
            const double rel = max_rel(fused, split, (size_t)nmax * ys);
            printf("  %-44s GPU fused vs split: max rel %.2e\n", what, rel);
            if (n <= 3 && !with_bias ? memcmp(fused, split, yb) != 0 : !(rel <= 1e-6))
                fail_msg("%s: the fused op differs from linear + add on the GPU (max rel %.2e)",
                         what, rel);
            both_free(&gu);
            both_free(&gu2);
            both_free(&y);
            both_free(&y2);
            both_free(&tmp);
            both_free(&tmp2);
        }
    both_free(&w);
    both_free(&b);
    free(fused);
    free(split);
    free(hgu);
    free(hw);
    free(hb);
    free(hy);
}

/* ---- dense ops ---- */

static void test_dense_ops(void **state) {
    (void)state;
    ms_error err = {0};
    const int n = 6, in = 256, out = 384, f = 128;
    /* linear into a column slice of a wider y */
    float *hx = rand_host((size_t)n * in, 1.f), *hw = rand_host((size_t)out * in, 0.1f);
    both x = both_alloc((size_t)n * in * 4, hx);
    both w = both_alloc((size_t)out * in * 2, NULL);
    ms_tensor wsrc = ms_tensor_2d(hw, MS_DTYPE_F32, out, in);
    ms_tensor wd = t2(0, MS_DTYPE_BF16, out, in, in);
    ms_tensor wc = on(&w, 0, wd), wg = on(&w, 1, wd);
    assert_int_equal(g_cpu.iface.tensor_load(g_cpu.ctx, &wc, &wsrc, &err), MS_OK);
    assert_int_equal(g_gpu.iface.tensor_load(g_gpu.ctx, &wg, &wsrc, &err), MS_OK);
    both y = both_alloc((size_t)n * 512 * 4, NULL);
    ms_tensor xt = t2(0, MS_DTYPE_F32, n, in, in), yt = t2(64, MS_DTYPE_F32, n, out, 512);
    for (int which = 0; which < 2; which++) {
        ms_backend *be = which ? &g_gpu : &g_cpu;
        ms_tensor a = on(&x, which, xt), ww = on(&w, which, wd), yy = on(&y, which, yt);
        if (be->iface.linear(be->ctx, &a, &ww, NULL, &yy, &err) != MS_OK)
            fail_msg("linear (%s): %s", be->iface.name, err.msg);
    }
    compare("linear bf16 W, y column slice", &y, 64, n, out, 512, 1e-2);
    {
        /* batch 1 and 2 (the decode shapes where cuBLAS picks split-K): in = 4104, out = 389,
           x rows padded, y a column slice */
        const int gin = 4104, gout = 389, gxs = gin + 4;
        float *gx = rand_host((size_t)2 * gxs, 1.f), *gw = rand_host((size_t)gout * gin, 0.05f);
        both bx = both_alloc((size_t)2 * gxs * 4, gx);
        both bw = both_alloc((size_t)gout * gin * 2, NULL);
        ms_tensor gsrc = ms_tensor_2d(gw, MS_DTYPE_F32, gout, gin);
        ms_tensor gwd = t2(0, MS_DTYPE_BF16, gout, gin, gin);
        ms_tensor gwc = on(&bw, 0, gwd), gwg = on(&bw, 1, gwd);
        assert_int_equal(g_cpu.iface.tensor_load(g_cpu.ctx, &gwc, &gsrc, &err), MS_OK);
        assert_int_equal(g_gpu.iface.tensor_load(g_gpu.ctx, &gwg, &gsrc, &err), MS_OK);
        both by = both_alloc((size_t)2 * 400 * 4, NULL);
        for (int rows = 1; rows <= 2; rows++) {
            ms_tensor gxt = t2(0, MS_DTYPE_F32, rows, gin, gxs);
            ms_tensor gyt = t2(8, MS_DTYPE_F32, rows, gout, 400);
            for (int which = 0; which < 2; which++) {
                ms_backend *be = which ? &g_gpu : &g_cpu;
                ms_tensor a = on(&bx, which, gxt), ww = on(&bw, which, gwd);
                ms_tensor yy = on(&by, which, gyt);
                if (be->iface.linear(be->ctx, &a, &ww, NULL, &yy, &err) != MS_OK)
                    fail_msg("linear, %d rows (%s): %s", rows, be->iface.name, err.msg);
            }
            compare(rows == 1 ? "linear bf16 W, 1 row" : "linear bf16 W, 2 rows",
                    &by, 8, rows, gout, 400, 1e-2);
        }
        both_free(&bx);
        both_free(&bw);
        both_free(&by);
        free(gx);
        free(gw);
    }
    {
        /* a bf16 bias (a checkpoint's q/k/v biases loaded with the weights: Qwen2-VL) */
        float *hb = rand_host((size_t)out, 1.f);
        both b = both_alloc((size_t)out * 2, NULL);
        ms_tensor bsrc = ms_tensor_1d(hb, MS_DTYPE_F32, out);
        ms_tensor bd = ms_tensor_1d(NULL, MS_DTYPE_BF16, out);
        ms_tensor bc = on(&b, 0, bd), bg = on(&b, 1, bd);
        assert_int_equal(g_cpu.iface.tensor_load(g_cpu.ctx, &bc, &bsrc, &err), MS_OK);
        assert_int_equal(g_gpu.iface.tensor_load(g_gpu.ctx, &bg, &bsrc, &err), MS_OK);
        for (int which = 0; which < 2; which++) {
            ms_backend *be = which ? &g_gpu : &g_cpu;
            ms_tensor a = on(&x, which, xt), ww = on(&w, which, wd), yy = on(&y, which, yt);
            ms_tensor bb = on(&b, which, bd);
            if (be->iface.linear(be->ctx, &a, &ww, &bb, &yy, &err) != MS_OK)
                fail_msg("linear + bf16 bias (%s): %s", be->iface.name, err.msg);
        }
        compare("linear bf16 W + bf16 bias", &y, 64, n, out, 512, 1e-2);
        both_free(&b);
        free(hb);
    }

    /* rms_norm, add_rms_norm */
    float *hn = rand_host(in, 0.5f);
    for (int i = 0; i < in; i++)
        hn[i] += 1.f;
    both nw = both_alloc((size_t)in * 2, NULL);
    ms_tensor nsrc = ms_tensor_1d(hn, MS_DTYPE_F32, in), nd = ms_tensor_1d(NULL, MS_DTYPE_BF16, in);
    ms_tensor nc = on(&nw, 0, nd), ng = on(&nw, 1, nd);
    assert_int_equal(g_cpu.iface.tensor_load(g_cpu.ctx, &nc, &nsrc, &err), MS_OK);
    assert_int_equal(g_gpu.iface.tensor_load(g_gpu.ctx, &ng, &nsrc, &err), MS_OK);
    float *hr = rand_host((size_t)n * in, 2.f);
    both res = both_alloc((size_t)n * in * 4, hr);
    both o = both_alloc((size_t)n * in * 4, NULL);
    ms_tensor rt = t2(0, MS_DTYPE_F32, n, in, in);
    for (int which = 0; which < 2; which++) {
        ms_backend *be = which ? &g_gpu : &g_cpu;
        ms_tensor a = on(&x, which, xt), ww = on(&nw, which, nd), oo = on(&o, which, rt);
        if (be->iface.rms_norm(be->ctx, &a, &ww, 1e-5f, &oo, &err) != MS_OK)
            fail_msg("rms_norm (%s): %s", be->iface.name, err.msg);
    }
    compare("rms_norm", &o, 0, n, in, in, 1e-4);
    for (int which = 0; which < 2; which++) {
        ms_backend *be = which ? &g_gpu : &g_cpu;
        ms_tensor a = on(&x, which, xt), ww = on(&nw, which, nd), oo = on(&o, which, rt);
        ms_tensor rr = on(&res, which, rt);
        if (be->iface.add_rms_norm(be->ctx, &rr, &a, &ww, 1e-5f, &oo, &err) != MS_OK)
            fail_msg("add_rms_norm (%s): %s", be->iface.name, err.msg);
    }
    compare("add_rms_norm out", &o, 0, n, in, in, 1e-4);
    compare("add_rms_norm residual", &res, 0, n, in, in, 1e-6);

    /* silu_mul over the halves of a gate/up row, in place into gate */
    float *hgu = rand_host((size_t)n * 2 * f, 4.f);
    both gu = both_alloc((size_t)n * 2 * f * 4, hgu);
    ms_tensor gt = t2(0, MS_DTYPE_F32, n, f, 2 * f), ut = t2(f, MS_DTYPE_F32, n, f, 2 * f);
    for (int which = 0; which < 2; which++) {
        ms_backend *be = which ? &g_gpu : &g_cpu;
        ms_tensor g = on(&gu, which, gt), u = on(&gu, which, ut), oo = on(&gu, which, gt);
        if (be->iface.silu_mul(be->ctx, &g, &u, &oo, &err) != MS_OK)
            fail_msg("silu_mul (%s): %s", be->iface.name, err.msg);
    }
    compare("silu_mul (halves, in place)", &gu, 0, n, f, 2 * f, 1e-4);

    /* add, gather_rows, argmax */
    both s = both_alloc((size_t)n * in * 4, NULL);
    for (int which = 0; which < 2; which++) {
        ms_backend *be = which ? &g_gpu : &g_cpu;
        ms_tensor a = on(&x, which, xt), b = on(&res, which, rt), oo = on(&s, which, rt);
        OK(be->iface.add(be->ctx, &a, &b, &oo, &err));
    }
    compare("add", &s, 0, n, in, in, 1e-7);
    const int32_t rows[3] = {-1, 3, 0};
    both ri = both_alloc(sizeof rows, rows);
    both gr = both_alloc((size_t)3 * in * 4, NULL);
    for (int which = 0; which < 2; which++) {
        ms_backend *be = which ? &g_gpu : &g_cpu;
        ms_tensor a = on(&s, which, rt), r = on(&ri, which, ms_tensor_1d(NULL, MS_DTYPE_I32, 3));
        ms_tensor oo = on(&gr, which, t2(0, MS_DTYPE_F32, 3, in, in));
        OK(be->iface.gather_rows(be->ctx, &a, &r, &oo, &err));
    }
    compare("gather_rows (with -1)", &gr, 0, 3, in, in, 0);
    both am = both_alloc((size_t)n * 4, NULL);
    int32_t ids[2][6];
    for (int which = 0; which < 2; which++) {
        ms_backend *be = which ? &g_gpu : &g_cpu;
        ms_tensor a = on(&s, which, rt), ii = on(&am, which, ms_tensor_1d(NULL, MS_DTYPE_I32, n));
        OK(be->iface.argmax(be->ctx, &a, &ii, &err));
        OK(be->iface.copy_to_host(be->ctx, ids[which], which ? am.g : am.c, sizeof ids[0], &err));
    }
    assert_memory_equal(ids[0], ids[1], sizeof ids[0]);

    /* embedding from a bf16 table */
    const int vocab = 100, d = 64;
    float *ht = rand_host((size_t)vocab * d, 1.f);
    both tab = both_alloc((size_t)vocab * d * 2, NULL);
    ms_tensor tsrc = ms_tensor_2d(ht, MS_DTYPE_F32, vocab, d), td = t2(0, MS_DTYPE_BF16, vocab, d, d);
    ms_tensor tc = on(&tab, 0, td), tg = on(&tab, 1, td);
    assert_int_equal(g_cpu.iface.tensor_load(g_cpu.ctx, &tc, &tsrc, &err), MS_OK);
    assert_int_equal(g_gpu.iface.tensor_load(g_gpu.ctx, &tg, &tsrc, &err), MS_OK);
    const int32_t eid[4] = {5, 99, 0, 42};
    both ei = both_alloc(sizeof eid, eid);
    both eo = both_alloc((size_t)4 * d * 4, NULL);
    for (int which = 0; which < 2; which++) {
        ms_backend *be = which ? &g_gpu : &g_cpu;
        ms_tensor t = on(&tab, which, td), i = on(&ei, which, ms_tensor_1d(NULL, MS_DTYPE_I32, 4));
        ms_tensor oo = on(&eo, which, t2(0, MS_DTYPE_F32, 4, d, d));
        OK(be->iface.embedding(be->ctx, &t, &i, &oo, &err));
    }
    compare("embedding (bf16 table)", &eo, 0, 4, d, d, 0);

    both *all[] = {&x, &w, &y, &nw, &res, &o, &gu, &s, &ri, &gr, &am, &tab, &ei, &eo};
    for (size_t i = 0; i < MS_ARRAY_LEN(all); i++)
        both_free(all[i]);
    free(hx);
    free(hw);
    free(hn);
    free(hr);
    free(hgu);
    free(ht);
}

/* ---- RoPE + KV write + attention: ragged prefill, then decode ---- */

enum { NS = 3, HQ = 8, HKV = 2, HD = 64, PS = 16 };

typedef struct step_plan {
    int32_t qo[NS + 1], kvp[NS + 1], last[NS], kst[NS];
    int32_t idx[64], t2p[512], t2s[512], pos[512];
    ms_kv_plan plan;
} step_plan;

/* Views of lengths len[] (pages pages[i][...]) whose last q_len[] tokens are new this step. */
static void make_plan(step_plan *s, const int *len, const int *q_len, int32_t pages[NS][32]) {
    memset(s, 0, sizeof *s);
    int tok = 0;
    for (int i = 0; i < NS; i++) {
        int np = (len[i] + PS - 1) / PS;
        s->kvp[i + 1] = s->kvp[i] + np;
        s->qo[i + 1] = s->qo[i] + q_len[i];
        s->last[i] = len[i] - (np - 1) * PS;
        for (int p = 0; p < np; p++)
            s->idx[s->kvp[i] + p] = pages[i][p];
        for (int k = len[i] - q_len[i]; k < len[i]; k++) {
            s->t2p[tok] = pages[i][k / PS];
            s->t2s[tok] = k % PS;
            s->pos[tok] = k;
            tok++;
        }
    }
    s->plan.n_views = NS;
    s->plan.n_tokens = tok;
    s->plan.qo_indptr = s->qo;
    s->plan.kv_indptr = s->kvp;
    s->plan.kv_indices = s->idx;
    s->plan.kv_last_page_len = s->last;
    s->plan.kv_start = s->kst;
    s->plan.token_to_page = s->t2p;
    s->plan.token_to_slot = s->t2s;
}

static void run_step(const char *name, ms_paged_kv kvs[2], ms_attn_batch *batches[2],
                     const step_plan *sp, const both *rope_inv, int window, double tol) {
    ms_error err = {0};
    const int n = sp->plan.n_tokens, W = (HQ + 2 * HKV) * HD;
    float *hqkv = rand_host((size_t)n * W, 1.f);
    both qkv = both_alloc((size_t)n * W * 4, hqkv);
    both pos = both_alloc((size_t)n * 4, sp->pos);
    both out = both_alloc((size_t)n * HQ * HD * 4, NULL);
    ms_tensor all = t2(0, MS_DTYPE_F32, n, W, W);
    for (int which = 0; which < 2; which++) {
        ms_backend *be = which ? &g_gpu : &g_cpu;
        ms_attn_params ap = {1.f / sqrtf((float)HD), window, true};
        if (ms_backend_attn_stage(be, batches[which], &sp->plan, &kvs[which], HQ, &ap, &err) != MS_OK)
            fail_msg("stage (%s): %s", be->iface.name, err.msg);
        ms_tensor a = on(&qkv, which, all);
        ms_tensor q2 = ms_tensor_slice(&a, 1, 0, HQ * HD);
        ms_tensor k2 = ms_tensor_slice(&a, 1, HQ * HD, HKV * HD);
        ms_tensor v2 = ms_tensor_slice(&a, 1, (HQ + HKV) * HD, HKV * HD);
        ms_tensor q = ms_tensor_split_heads(&q2, HQ, HD), k = ms_tensor_split_heads(&k2, HKV, HD);
        ms_tensor v = ms_tensor_split_heads(&v2, HKV, HD);
        ms_tensor p = on(&pos, which, ms_tensor_1d(NULL, MS_DTYPE_I32, n));
        ms_rope_table rt = {MS_ROPE_ROTATE_HALF, HD, which ? rope_inv->g : rope_inv->c, 1.f, 0, {0}};
        if (ms_backend_rope_kv_write(be, &q, &k, &v, &p, &rt, &kvs[which], 1, batches[which], &err) !=
            MS_OK)
            fail_msg("rope_kv_write (%s): %s", be->iface.name, err.msg);
        ms_tensor o = on(&out, which, ms_tensor_3d(NULL, MS_DTYPE_F32, n, HQ, HD));
        if (be->iface.attention(be->ctx, &q, &kvs[which], 1, batches[which], &ap, &o, &err) != MS_OK)
            fail_msg("attention (%s): %s", be->iface.name, err.msg);
    }
    char what[96];
    snprintf(what, sizeof what, "%s: q after RoPE", name);
    compare(what, &qkv, 0, n, HQ * HD, W, 1e-4);
    snprintf(what, sizeof what, "%s: k after RoPE (in place)", name);
    compare(what, &qkv, HQ * HD, n, HKV * HD, W, 1e-4);
    snprintf(what, sizeof what, "%s: attention", name);
    compare(what, &out, 0, n, HQ * HD, HQ * HD, tol);
    both_free(&qkv);
    both_free(&pos);
    both_free(&out);
    free(hqkv);
}

static void test_rope_kv_attention(void **state) {
    (void)state;
    ms_error err = {0};
    ms_paged_kv kvs[2];
    ms_attn_batch *batches[2];
    const ms_attn_limits lim = {8, 512, 64};
    kvs[0] = (ms_paged_kv){NULL, MS_DTYPE_BF16, 2, 40, PS, HKV, HD};
    both arena = both_alloc(ms_paged_kv_bytes(&kvs[0]), NULL);
    kvs[1] = kvs[0];
    kvs[0].data = arena.c;
    kvs[1].data = arena.g;
    for (int which = 0; which < 2; which++) {
        ms_backend *be = which ? &g_gpu : &g_cpu;
        OK(be->iface.attn_batch_init(be->ctx, &lim, &batches[which], &err));
    }
    ms_rope_config rc = {MS_ROPE_ROTATE_HALF, HD, 0, 10000.0, MS_ROPE_SCALING_NONE, 1, 1, 1, 1, 0, {0}};
    float inv[HD / 2];
    assert_int_equal(ms_rope_compute_inv_freq(&rc, inv, &err), MS_OK);
    both rope_inv = both_alloc(sizeof inv, inv);
    /* distinct shuffled pages, skipping the sink */
    int32_t pages[NS][32], perm[39];
    for (int i = 0; i < 39; i++)
        perm[i] = 1 + i;
    for (int i = 38; i > 0; i--) {
        int j = (int)((frand() + 1.f) * 0.5f * (float)(i + 1)) % (i + 1);
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    const int len0[NS] = {5, 17, 300};
    int used = 0;
    for (int i = 0; i < NS; i++)
        for (int p = 0; p < (len0[i] + 1 + PS - 1) / PS; p++)
            pages[i][p] = perm[used++];
    for (int win = 0; win < 2; win++) {
        int window = win ? 8 : 0;
        step_plan pre, dec;
        make_plan(&pre, len0, len0, pages);
        run_step(win ? "prefill, window 8" : "prefill", kvs, batches, &pre, &rope_inv, window, 2e-2);
        const int len1[NS] = {6, 18, 301}, one[NS] = {1, 1, 1};
        make_plan(&dec, len1, one, pages);
        run_step(win ? "decode, window 8" : "decode (split KV)", kvs, batches, &dec, &rope_inv,
                 window, 1e-2);
    }
    for (int which = 0; which < 2; which++) {
        ms_backend *be = which ? &g_gpu : &g_cpu;
        be->iface.attn_batch_free(be->ctx, batches[which]);
    }
    both_free(&rope_inv);
    both_free(&arena);
}

/* attention launches only over a batch planned for it: unplanned or planned for another mask is
 * MS_ERR_STATE, never a silent re-plan inside a layer */
static void test_attention_needs_plan(void **state) {
    (void)state;
    ms_error err = {0};
    const ms_attn_limits lim = {8, 512, 64};
    ms_paged_kv kv = {NULL, MS_DTYPE_BF16, 2, 40, PS, HKV, HD};
    both arena = both_alloc(ms_paged_kv_bytes(&kv), NULL);
    kv.data = arena.g;
    ms_attn_batch *b;
    OK(g_gpu.iface.attn_batch_init(g_gpu.ctx, &lim, &b, &err));
    int32_t pages[NS][32];
    for (int i = 0; i < NS; i++)
        for (int p = 0; p < 32; p++)
            pages[i][p] = 1 + (i * 13 + p) % 39;
    const int len[NS] = {6, 18, 40}, one[NS] = {1, 1, 1};
    step_plan dec;
    make_plan(&dec, len, one, pages);
    both q = both_alloc((size_t)NS * HQ * HD * 4, rand_host((size_t)NS * HQ * HD, 1.f));
    both o = both_alloc((size_t)NS * HQ * HD * 4, NULL);
    ms_tensor tq = ms_tensor_3d(q.g, MS_DTYPE_F32, NS, HQ, HD);
    ms_tensor to = ms_tensor_3d(o.g, MS_DTYPE_F32, NS, HQ, HD);
    ms_attn_params ap = {1.f / sqrtf((float)HD), 0, true};
    OK(g_gpu.iface.attn_batch_stage(g_gpu.ctx, b, &dec.plan, &kv, &err));
    assert_int_equal(g_gpu.iface.attention(g_gpu.ctx, &tq, &kv, 0, b, &ap, &to, &err),
                     MS_ERR_STATE);
    assert_non_null(strstr(err.msg, "not planned"));
    OK(g_gpu.iface.attn_batch_plan(g_gpu.ctx, b, &kv, HQ, &ap, &err));
    OK(g_gpu.iface.attention(g_gpu.ctx, &tq, &kv, 0, b, &ap, &to, &err));
    OK(g_gpu.iface.attention(g_gpu.ctx, &tq, &kv, 1, b, &ap, &to, &err)); /* every layer */
    ms_attn_params windowed = ap;
    windowed.window = 8;
    assert_int_equal(g_gpu.iface.attention(g_gpu.ctx, &tq, &kv, 0, b, &windowed, &to, &err),
                     MS_ERR_STATE);
    /* staging again clears the plan */
    OK(g_gpu.iface.attn_batch_stage(g_gpu.ctx, b, &dec.plan, &kv, &err));
    assert_int_equal(g_gpu.iface.attention(g_gpu.ctx, &tq, &kv, 0, b, &ap, &to, &err),
                     MS_ERR_STATE);
    OK(g_gpu.iface.synchronize(g_gpu.ctx, &err));
    g_gpu.iface.attn_batch_free(g_gpu.ctx, b);
    both_free(&q);
    both_free(&o);
    both_free(&arena);
}

/* after kernels_load the instance table is sealed: an instance outside the loaded list is
 * MS_ERR_STATE naming it, not a compile in the middle of a step */
static void test_sealed_kernel_table(void **state) {
    (void)state;
    ms_error err = {0};
    ms_backend be;
    const char *c = getenv("MS_KERNEL_CACHE_TEST");
    ms_backend_cuda_options opt = {0, c != NULL && c[0] ? c : "build/kernel-cache-test"};
    OK(ms_backend_cuda_init(&be, &opt, &err));
    ms_kernel_spec only = ms_kernel_spec_attn_decode(MS_KERNEL_DTYPE_BF16, HD, PS, HQ / HKV, false);
    only.act_dtype = MS_KERNEL_DTYPE_F32;
    OK(be.iface.kernels_load(be.ctx, &only, 1, &err));
    const ms_attn_limits lim = {8, 512, 64};
    ms_paged_kv kv = {NULL, MS_DTYPE_BF16, 2, 40, PS, HKV, HD};
    both arena = both_alloc(ms_paged_kv_bytes(&kv), NULL);
    kv.data = arena.g;
    ms_attn_batch *b;
    OK(be.iface.attn_batch_init(be.ctx, &lim, &b, &err));
    int32_t pages[NS][32];
    for (int i = 0; i < NS; i++)
        for (int p = 0; p < 32; p++)
            pages[i][p] = 1 + (i * 13 + p) % 39;
    const int len[NS] = {6, 18, 40}, one[NS] = {1, 1, 1};
    step_plan st;
    make_plan(&st, len, one, pages);
    ms_attn_params ap = {1.f / sqrtf((float)HD), 0, true};
    OK(ms_backend_attn_stage(&be, b, &st.plan, &kv, HQ, &ap, &err)); /* decode: loaded */
    make_plan(&st, len, len, pages);
    assert_int_equal(ms_backend_attn_stage(&be, b, &st.plan, &kv, HQ, &ap, &err), MS_ERR_STATE);
    assert_non_null(strstr(err.msg, "not in the model's kernel list"));
    be.iface.attn_batch_free(be.ctx, b);
    both_free(&arena);
    ms_backend_free(&be);
}

static int64_t g_live_at_setup;

static int group_setup(void **state) {
    (void)state;
    ms_error err = {0};
    g_live_at_setup = ms_alloc_get_stats().live_blocks;
    const char *seed = getenv("MS_TEST_SEED");
    g_rng = seed != NULL ? strtoull(seed, NULL, 10) : (uint64_t)time(NULL);
    const char *c = getenv("MS_KERNEL_CACHE_TEST");
    ms_backend_cuda_options opt = {0, c != NULL && c[0] ? c : "build/kernel-cache-test"};
    if (ms_backend_cuda_init(&g_gpu, &opt, &err) != MS_OK) {
        fprintf(stderr, "test_backend_cuda: %s\n", err.msg);
        return -1;
    }
    ms_backend_cpu_options co = {2};
    if (ms_backend_cpu_init(&g_cpu, &co, &err) != MS_OK) {
        fprintf(stderr, "test_backend_cuda: %s\n", err.msg);
        return -1;
    }
    printf("test_backend_cuda: seed %llu (MS_TEST_SEED to repeat)\n", (unsigned long long)g_rng);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    ms_backend_free(&g_gpu);
    ms_backend_free(&g_cpu);
    /* leak check over the group: the backends keep kernel modules across tests by design */
    int64_t live = ms_alloc_get_stats().live_blocks;
    if (live != g_live_at_setup) {
        fprintf(stderr, "leak check: %lld block(s) still allocated\n",
                (long long)(live - g_live_at_setup));
        return -1;
    }
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_dense_ops),
        cmocka_unit_test(test_silu_mul_linear),
        cmocka_unit_test(test_rms_norm_linear),
        cmocka_unit_test(test_linear_add),
        cmocka_unit_test(test_quant_x_producers),
        cmocka_unit_test(test_rope_kv_attention),
        cmocka_unit_test(test_attention_needs_plan),
        cmocka_unit_test(test_sealed_kernel_table),
    };
    /* MS_TEST_FILTER=NAME runs the tests matching NAME only (one test under compute-sanitizer) */
    const char *only = getenv("MS_TEST_FILTER");
    if (only != NULL && only[0] != '\0')
        cmocka_set_test_filter(only);
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
