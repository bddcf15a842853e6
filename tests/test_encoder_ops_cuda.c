/*
 * test_encoder_ops_cuda.c - the CUDA encoder ops (Whisper) against the CPU backend (the oracle),
 * at Whisper base/tiny shapes, through the op interface only (GPU_TESTS: `make gpu-test`,
 * scripts/gpu-batch.sh).
 *
 * Fresh random inputs every run (seed printed; MS_TEST_SEED repeats); outputs poisoned (0xff
 * bytes: NaN) before each op. Tolerances, relative error ||gpu - cpu|| / ||cpu||:
 *   layer_norm 1e-5 (f32 on both; the CPU sums in double, the GPU in a float tree),
 *   gelu 1e-6 (erff on both, a few ulp apart),
 *   conv1d / linear with f32 weights 1e-5 (cuBLAS f32 GEMM, no TF32), f16 weights 2e-3 (x and the
 *   im2col columns rounded to f16: 2^-11 per product), bf16 weights 1e-2 (2^-8 per product),
 *   gather_rows (the learned position rows) exact,
 *   bidirectional attention over 1500 keys (the encoder's self-attention: causal = false, one
 *   view of 1500 tokens per clip, two clips, 8 heads of 64, page size 16) 2e-2, as prefill in
 *   test_backend_cuda (q and P rounded to 16 bits on the tensor cores); then one query per clip
 *   over the same 1500 keys (the decoder's cross-attention shape: a decode plan with split KV,
 *   no KV write) 1e-2, as decode there.
 * Dense attention (attention_dense: the encoder's attention over its step's own rows, no pages)
 * over three 1500-row windows (8 heads of 64) and ragged GQA segments, f32 on both sides, 1e-4
 * (__expf and a warp-tree dot product against expf and a sequential one);
 * its instances (head_dim 16, 48, 64, 128) compile for sm_80 and sm_90.
 * Every misc kernel instance (bf16, f16: the dtypes misc takes; the entries of
 * templates/misc/encoder.cuh among them) is also compiled with NVRTC for sm_80 and sm_90 and its entries looked up in the cubin.
 *
 * MS_ENCODER_OPS_DEVICE=cpu runs the "GPU" side on a second CPU backend: a dry run of the test's
 * logic (shapes, plans, tolerances) and of the NVRTC compiles on a machine without a GPU.
 */
#include "ms_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend_cuda.h"
#include "kernel.h"
#include "nvrtc_cache.h"

#include "ms_test_impl.h"

static ms_backend g_cpu, g_gpu;
static bool g_dry_run;
static uint64_t g_rng;

static float frand(void) {
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)((double)(z >> 11) * 0x1p-53 * 2.0 - 1.0);
}

#define OK(expr)                                                                                  \
    do {                                                                                          \
        if ((expr) != MS_OK)                                                                      \
            fail_msg("%s: %s", #expr, err.msg);                                                   \
    } while (0)

/* A buffer on both backends with the same contents (host NULL: 0xff bytes, NaN as f32). */
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
        OK(g_cpu.iface.copy_to_backend(g_cpu.ctx, b.c, host, bytes, &err));
        OK(g_gpu.iface.copy_to_backend(g_gpu.ctx, b.g, host, bytes, &err));
    } else {
        OK(g_cpu.iface.buffer_fill(g_cpu.ctx, b.c, 0xff, bytes, &err));
        OK(g_gpu.iface.buffer_fill(g_gpu.ctx, b.g, 0xff, bytes, &err));
    }
    return b;
}

static void both_free(both *b) {
    g_cpu.iface.buffer_free(g_cpu.ctx, b->c);
    g_gpu.iface.buffer_free(g_gpu.ctx, b->g);
}

static float *rand_host(size_t n, float scale, float offset) {
    float *h = malloc(n * sizeof(float));
    assert_non_null(h);
    for (size_t i = 0; i < n; i++)
        h[i] = frand() * scale + offset;
    return h;
}

static ms_backend *be_of(int which) {
    return which ? &g_gpu : &g_cpu;
}

/* A tensor over the CPU (which = 0) or GPU (1) copy of b, with the shape of `like`. */
static ms_tensor on(const both *b, int which, ms_tensor like) {
    like.data = which ? b->g : b->c;
    return like;
}

/* Weights: host f32 values loaded on both backends as dtype dt (tensor_load converts). */
static both load_weights(const float *host, ms_dtype dt, ms_tensor shape) {
    ms_error err = {0};
    both b = both_alloc((size_t)ms_tensor_numel(&shape) * ms_dtype_size(dt), NULL);
    ms_tensor src = shape;
    src.data = (void *)host;
    src.dtype = MS_DTYPE_F32;
    ms_tensor dst = shape;
    dst.dtype = dt;
    for (int which = 0; which < 2; which++) {
        ms_tensor d = on(&b, which, dst);
        OK(be_of(which)->iface.tensor_load(be_of(which)->ctx, &d, &src, &err));
    }
    return b;
}

/* Compare n f32 values of both copies of b: relative error (and max |d|) against tol. */
static void compare(const char *what, const both *b, size_t n, double tol) {
    ms_error err = {0};
    float *hc = malloc(n * sizeof(float)), *hg = malloc(n * sizeof(float));
    assert_true(hc != NULL && hg != NULL);
    OK(g_cpu.iface.copy_to_host(g_cpu.ctx, hc, b->c, n * sizeof(float), &err));
    OK(g_gpu.iface.copy_to_host(g_gpu.ctx, hg, b->g, n * sizeof(float), &err));
    double num = 0, den = 0, mx = 0;
    long bad = 0;
    for (size_t i = 0; i < n; i++) {
        double c = hc[i], g = hg[i];
        if (!isfinite(g) || !isfinite(c)) {
            bad++;
            continue;
        }
        num += (g - c) * (g - c);
        den += c * c;
        mx = fmax(mx, fabs(g - c));
    }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    printf("  %-52s rel %.2e  max|d| %.2e  (tol %.0e)%s\n", what, rel, mx, tol, bad ? " NaN!" : "");
    free(hc);
    free(hg);
    if (bad > 0 || !(rel <= tol))
        fail_msg("%s: %ld non-finite, relative error %.3e > %.0e", what, bad, rel, tol);
}

static const char *dt_name(ms_dtype dt) {
    return ms_dtype_str(dt);
}

/* the encoder's self-attention in the tests below: 1500 frames, 8 heads of 64 (Whisper base) */
enum { ENC_T = 1500, ENC_H = 8, ENC_HD = 64, ENC_PS = 16, ENC_SEQS = 2 };

/* ---- NVRTC: every misc instance compiles, with every entry ---- */

static bool has_bytes(const void *hay, size_t n, const char *needle) {
    size_t k = strlen(needle);
    const char *h = hay;
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(h + i, needle, k) == 0)
            return true;
    return false;
}

static void test_misc_instances_compile(void **state) {
    (void)state;
    const char *c = getenv("MS_KERNEL_CACHE_TEST");
    const char *cache = c != NULL && c[0] ? c : "build/kernel-cache-test";
    const ms_kernel_dtype dts[] = {MS_KERNEL_DTYPE_BF16, MS_KERNEL_DTYPE_F16}; /* misc takes 16-bit dtypes */
    const int archs[] = {80, 90};
    for (size_t d = 0; d < MS_ARRAY_LEN(dts); d++) {
        ms_kernel_spec s = ms_kernel_spec_simple(MS_KERNEL_OP_MISC, dts[d]);
        s.act_dtype = MS_KERNEL_DTYPE_F32;
        ms_error err = {0};
        char uri[MS_KERNEL_URI_MAX], *src = NULL;
        OK(ms_kernel_spec_uri(&s, 0, uri, sizeof uri, &err));
        OK(ms_kernel_spec_instance_source(&s, &src, &err));
        for (size_t a = 0; a < MS_ARRAY_LEN(archs); a++) {
            ms_cubin cb = {0};
            if (ms_nvrtc_compile(uri, src, archs[a], cache, &cb, &err) != MS_OK)
                fail_msg("%s sm_%d: %s", uri, archs[a], err.msg);
            int n_entries = 0;
            for (int e = 0; e < MS_KERNEL_MAX_ENTRIES && ms_kernel_op_entry(s.op, e) != NULL; e++) {
                if (!has_bytes(cb.data, cb.size, ms_kernel_op_entry(s.op, e)))
                    fail_msg("%s sm_%d: entry %s missing from the cubin", uri, archs[a],
                             ms_kernel_op_entry(s.op, e));
                n_entries++;
            }
            assert_int_equal(n_entries, 14); /* ... ms_select_rows (code.first), ms_gemv, ms_silu_mul_to, ms_gemv_norm */
            printf("  %s_sm%d: %d entries (%s)\n", uri, archs[a], n_entries, cb.from_cache ? "cached" : "compiled");
            ms_nvrtc_cubin_free(&cb);
        }
        ms_free(src);
    }
    /* the encoder's attention instances: bidirectional prefill and the plain KV write (no RoPE),
     * head_dim 64 (Whisper tiny and base), page size 16, MHA, f16 and bf16 KV */
    for (size_t d = 0; d < MS_ARRAY_LEN(dts); d++) {
        ms_kernel_spec specs[2] = {
            ms_kernel_spec_attn_prefill(dts[d], ENC_HD, ENC_PS, 1, false, false),
            ms_kernel_spec_rope_kv(dts[d], ENC_HD, ENC_PS, MS_KERNEL_ROPE_NONE, MS_KERNEL_ROPE_SCALING_NONE),
        };
        for (int i = 0; i < 2; i++) {
            specs[i].act_dtype = MS_KERNEL_DTYPE_F32;
            ms_error err = {0};
            char uri[MS_KERNEL_URI_MAX], *src = NULL;
            OK(ms_kernel_spec_uri(&specs[i], 0, uri, sizeof uri, &err));
            OK(ms_kernel_spec_instance_source(&specs[i], &src, &err));
            for (size_t a = 0; a < MS_ARRAY_LEN(archs); a++) {
                ms_cubin cb = {0};
                if (ms_nvrtc_compile(uri, src, archs[a], cache, &cb, &err) != MS_OK)
                    fail_msg("%s sm_%d: %s", uri, archs[a], err.msg);
                assert_true(has_bytes(cb.data, cb.size, ms_kernel_op_entry(specs[i].op, 0)));
                printf("  %s_sm%d (%s)\n", uri, archs[a], cb.from_cache ? "cached" : "compiled");
                ms_nvrtc_cubin_free(&cb);
            }
            ms_free(src);
        }
    }
}

/* the encoder's dense attention (attn/dense.cuh): head_dim 16 (Whisper tiny's fixture), 48 (not
 * a multiple of 32: masked lanes), 64 (Whisper base), 128 */
static void test_dense_instances_compile(void **state) {
    (void)state;
    const char *c = getenv("MS_KERNEL_CACHE_TEST");
    const char *cache = c != NULL && c[0] ? c : "build/kernel-cache-test";
    const int hds[] = {16, 48, 64, 128}, archs[] = {80, 90};
    for (size_t h = 0; h < MS_ARRAY_LEN(hds); h++) {
        ms_kernel_spec s = ms_kernel_spec_attn_dense(hds[h]);
        ms_error err = {0};
        char uri[MS_KERNEL_URI_MAX], *src = NULL;
        OK(ms_kernel_spec_uri(&s, 0, uri, sizeof uri, &err));
        OK(ms_kernel_spec_instance_source(&s, &src, &err));
        for (size_t a = 0; a < MS_ARRAY_LEN(archs); a++) {
            ms_cubin cb = {0};
            if (ms_nvrtc_compile(uri, src, archs[a], cache, &cb, &err) != MS_OK)
                fail_msg("%s sm_%d: %s", uri, archs[a], err.msg);
            assert_true(has_bytes(cb.data, cb.size, ms_kernel_op_entry(s.op, 0)));
            printf("  %s_sm%d (%s)\n", uri, archs[a], cb.from_cache ? "cached" : "compiled");
            ms_nvrtc_cubin_free(&cb);
        }
        ms_free(src);
    }
    /* head_dim outside the template's range is refused by name */
    ms_kernel_spec bad = ms_kernel_spec_attn_dense(512);
    ms_error err = {0};
    assert_int_equal(ms_kernel_spec_check(&bad, &err), MS_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "attn_dense: head_dim 512 unsupported (1 .. 256)"));
}

/* ---- LayerNorm, GELU ---- */

static void run_layer_norm(int rows, int d, ms_dtype wdt, bool with_bias, bool in_place) {
    ms_error err = {0};
    float *hx = rand_host((size_t)rows * d, 3.f, 0.5f);
    float *hw = rand_host((size_t)d, 0.5f, 1.f), *hb = rand_host((size_t)d, 0.2f, 0.f);
    both x = both_alloc((size_t)rows * d * 4, hx);
    both o = in_place ? x : both_alloc((size_t)rows * d * 4, NULL);
    both w = load_weights(hw, wdt, ms_tensor_1d(NULL, wdt, d));
    both b = load_weights(hb, wdt, ms_tensor_1d(NULL, wdt, d));
    for (int which = 0; which < 2; which++) {
        ms_tensor tx = on(&x, which, ms_tensor_2d(NULL, MS_DTYPE_F32, rows, d));
        ms_tensor to = on(&o, which, ms_tensor_2d(NULL, MS_DTYPE_F32, rows, d));
        ms_tensor tw = on(&w, which, ms_tensor_1d(NULL, wdt, d));
        ms_tensor tb = on(&b, which, ms_tensor_1d(NULL, wdt, d));
        OK(be_of(which)->iface.layer_norm(be_of(which)->ctx, &tx, &tw, with_bias ? &tb : NULL, 1e-5f, &to,
                                          &err));
    }
    char what[96];
    snprintf(what, sizeof what, "layer_norm [%d, %d] w %s%s%s", rows, d, dt_name(wdt), with_bias ? " + b" : "",
             in_place ? " in place" : "");
    compare(what, &o, (size_t)rows * d, 1e-5);
    both_free(&x);
    if (!in_place)
        both_free(&o);
    both_free(&w);
    both_free(&b);
    free(hx);
    free(hw);
    free(hb);
}

static void test_layer_norm(void **state) {
    (void)state;
    run_layer_norm(1500, 512, MS_DTYPE_F16, true, false);  /* Whisper base, f16 checkpoint */
    run_layer_norm(1500, 512, MS_DTYPE_F32, true, true);   /* float weights, out aliases x */
    run_layer_norm(1500, 384, MS_DTYPE_BF16, true, false); /* Whisper tiny */
    run_layer_norm(7, 512, MS_DTYPE_F16, false, false);    /* no bias, a few decoder rows */
}

static void test_gelu(void **state) {
    (void)state;
    ms_error err = {0};
    const int rows = 1500, f = 2048; /* Whisper base encoder MLP */
    float *hx = rand_host((size_t)rows * f, 6.f, 0.f);
    both x = both_alloc((size_t)rows * f * 4, hx);
    both o = both_alloc((size_t)rows * f * 4, NULL);
    both x2 = both_alloc((size_t)rows * f * 4, hx);
    for (int which = 0; which < 2; which++) {
        ms_tensor tx = on(&x, which, ms_tensor_2d(NULL, MS_DTYPE_F32, rows, f));
        ms_tensor to = on(&o, which, ms_tensor_2d(NULL, MS_DTYPE_F32, rows, f));
        ms_tensor t2 = on(&x2, which, ms_tensor_2d(NULL, MS_DTYPE_F32, rows, f));
        OK(be_of(which)->iface.gelu(be_of(which)->ctx, &tx, &to, &err));
        OK(be_of(which)->iface.gelu(be_of(which)->ctx, &t2, &t2, &err));
    }
    compare("gelu [1500, 2048]", &o, (size_t)rows * f, 1e-6);
    compare("gelu [1500, 2048] in place", &x2, (size_t)rows * f, 1e-6);
    both_free(&x);
    both_free(&o);
    both_free(&x2);
    free(hx);
}

/* ---- conv1d (im2col + GEMM + bias), linear with bias ---- */

static void run_conv1d(int t_in, int c_in, int c_out, int stride, ms_dtype wdt, bool with_bias, double tol) {
    ms_error err = {0};
    const int k = 3, pad = 1, t_out = (t_in + 2 * pad - k) / stride + 1;
    float *hx = rand_host((size_t)t_in * c_in, 1.f, 0.f);
    float *hw = rand_host((size_t)c_out * c_in * k, 1.f / sqrtf((float)(c_in * k)), 0.f);
    float *hb = rand_host((size_t)c_out, 0.5f, 0.f);
    both x = both_alloc((size_t)t_in * c_in * 4, hx);
    both y = both_alloc((size_t)t_out * c_out * 4, NULL);
    both w = load_weights(hw, wdt, ms_tensor_3d(NULL, wdt, c_out, c_in, k));
    both b = load_weights(hb, wdt, ms_tensor_1d(NULL, wdt, c_out));
    for (int which = 0; which < 2; which++) {
        ms_tensor tx = on(&x, which, ms_tensor_2d(NULL, MS_DTYPE_F32, t_in, c_in));
        ms_tensor ty = on(&y, which, ms_tensor_2d(NULL, MS_DTYPE_F32, t_out, c_out));
        ms_tensor tw = on(&w, which, ms_tensor_3d(NULL, wdt, c_out, c_in, k));
        ms_tensor tb = on(&b, which, ms_tensor_1d(NULL, wdt, c_out));
        OK(be_of(which)->iface.conv1d(be_of(which)->ctx, &tx, &tw, with_bias ? &tb : NULL, stride, pad, &ty,
                                      &err));
    }
    char what[96];
    snprintf(what, sizeof what, "conv1d [%d, %d] -> [%d, %d] k3 s%d w %s%s", t_in, c_in, t_out, c_out, stride,
             dt_name(wdt), with_bias ? " + b" : "");
    compare(what, &y, (size_t)t_out * c_out, tol);
    both_free(&x);
    both_free(&y);
    both_free(&w);
    both_free(&b);
    free(hx);
    free(hw);
    free(hb);
}

static void test_conv1d(void **state) {
    (void)state;
    run_conv1d(3000, 80, 512, 1, MS_DTYPE_F16, true, 2e-3);  /* Whisper base conv1 */
    run_conv1d(3000, 512, 512, 2, MS_DTYPE_F16, true, 2e-3); /* Whisper base conv2 */
    run_conv1d(3000, 80, 384, 1, MS_DTYPE_F32, true, 1e-5);  /* Whisper tiny conv1, f32 */
    run_conv1d(3000, 384, 384, 2, MS_DTYPE_BF16, true, 1e-2); /* Whisper tiny conv2, bf16 */
    run_conv1d(64, 80, 512, 2, MS_DTYPE_F16, false, 2e-3);   /* no bias, short input */
}

static void test_conv1d_errors(void **state) {
    (void)state;
    ms_error err = {0};
    both x = both_alloc(3000 * 80 * 4, NULL), y = both_alloc(1500 * 512 * 4, NULL);
    both w = both_alloc(512 * 80 * 3 * 2, NULL);
    ms_tensor tx = on(&x, 1, ms_tensor_2d(NULL, MS_DTYPE_F32, 3000, 80));
    ms_tensor tw = on(&w, 1, ms_tensor_3d(NULL, MS_DTYPE_F16, 512, 80, 3));
    ms_tensor ty = on(&y, 1, ms_tensor_2d(NULL, MS_DTYPE_F32, 1500, 512)); /* stride 1 needs 3000 rows */
    assert_int_equal(g_gpu.iface.conv1d(g_gpu.ctx, &tx, &tw, NULL, 1, 1, &ty, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "conv1d: shapes"));
    assert_int_equal(g_gpu.iface.conv1d(g_gpu.ctx, &tx, &tw, NULL, 0, 1, &ty, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "stride 0"));
    ms_tensor tb = on(&w, 1, ms_tensor_1d(NULL, MS_DTYPE_F16, 384));
    assert_int_equal(g_gpu.iface.conv1d(g_gpu.ctx, &tx, &tw, &tb, 2, 1, &ty, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "bias has 384 entries"));
    ms_tensor short_w = on(&w, 1, ms_tensor_1d(NULL, MS_DTYPE_F16, 80));
    ms_tensor o80 = on(&x, 1, ms_tensor_2d(NULL, MS_DTYPE_F32, 3000, 80));
    assert_int_equal(g_gpu.iface.layer_norm(g_gpu.ctx, &tx, &short_w, NULL, -1.f, &o80, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "eps"));
    both_free(&x);
    both_free(&y);
    both_free(&w);
}

static void test_linear_bias_and_positions(void **state) {
    (void)state;
    ms_error err = {0};
    const int n = 1500, d = 512;
    /* the encoder's biased projections: x [1500, 512] W^T [512, 512] + b, f16 weights and bias */
    float *hx = rand_host((size_t)n * d, 1.f, 0.f), *hw = rand_host((size_t)d * d, 0.05f, 0.f);
    float *hb = rand_host((size_t)d, 0.5f, 0.f);
    both x = both_alloc((size_t)n * d * 4, hx), y = both_alloc((size_t)n * d * 4, NULL);
    both w = load_weights(hw, MS_DTYPE_F16, ms_tensor_2d(NULL, MS_DTYPE_F16, d, d));
    both b = load_weights(hb, MS_DTYPE_F16, ms_tensor_1d(NULL, MS_DTYPE_F16, d));
    for (int which = 0; which < 2; which++) {
        ms_tensor tx = on(&x, which, ms_tensor_2d(NULL, MS_DTYPE_F32, n, d));
        ms_tensor ty = on(&y, which, ms_tensor_2d(NULL, MS_DTYPE_F32, n, d));
        ms_tensor tw = on(&w, which, ms_tensor_2d(NULL, MS_DTYPE_F16, d, d));
        ms_tensor tb = on(&b, which, ms_tensor_1d(NULL, MS_DTYPE_F16, d));
        OK(be_of(which)->iface.linear(be_of(which)->ctx, &tx, &tw, &tb, &ty, &err));
    }
    compare("linear [1500, 512] x [512, 512]^T + b (f16)", &y, (size_t)n * d, 2e-3);
    /* learned positions: rows 0..1499 of a [1500, 512] f32 table, and -1 rows (zeros) */
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)n);
    assert_non_null(rows);
    for (int i = 0; i < n; i++)
        rows[i] = i % 97 == 5 ? -1 : (i * 7) % n;
    both r = both_alloc(sizeof(int32_t) * (size_t)n, rows);
    both g = both_alloc((size_t)n * d * 4, NULL);
    for (int which = 0; which < 2; which++) {
        ms_tensor tx = on(&x, which, ms_tensor_2d(NULL, MS_DTYPE_F32, n, d));
        ms_tensor tr = on(&r, which, ms_tensor_1d(NULL, MS_DTYPE_I32, n));
        ms_tensor tg = on(&g, which, ms_tensor_2d(NULL, MS_DTYPE_F32, n, d));
        OK(be_of(which)->iface.gather_rows(be_of(which)->ctx, &tx, &tr, &tg, &err));
    }
    compare("gather_rows [1500, 512] (positions, -1 rows)", &g, (size_t)n * d, 0);
    both *all[] = {&x, &y, &w, &b, &r, &g};
    for (size_t i = 0; i < MS_ARRAY_LEN(all); i++)
        both_free(all[i]);
    free(rows);
    free(hx);
    free(hw);
    free(hb);
}

/* ---- bidirectional attention over 1500 keys (the encoder's self-attention) ---- */

static void run_encoder_attention(ms_dtype kv_dt) {
    ms_error err = {0};
    const int pages_per = (ENC_T + ENC_PS - 1) / ENC_PS, n = ENC_SEQS * ENC_T;
    const int n_pages = 1 + ENC_SEQS * pages_per; /* page 0 is the sink */
    int32_t qo[ENC_SEQS + 1], kvp[ENC_SEQS + 1], last[ENC_SEQS], kst[ENC_SEQS] = {0};
    int32_t *idx = malloc(sizeof(int32_t) * (size_t)(ENC_SEQS * pages_per));
    int32_t *t2p = malloc(sizeof(int32_t) * (size_t)n), *t2s = malloc(sizeof(int32_t) * (size_t)n);
    assert_true(idx != NULL && t2p != NULL && t2s != NULL);
    qo[0] = kvp[0] = 0;
    int tok = 0;
    for (int s = 0; s < ENC_SEQS; s++) {
        qo[s + 1] = qo[s] + ENC_T;
        kvp[s + 1] = kvp[s] + pages_per;
        last[s] = ENC_T - (pages_per - 1) * ENC_PS;
        for (int p = 0; p < pages_per; p++) /* the second clip's pages in reverse: not contiguous */
            idx[kvp[s] + p] = s == 0 ? 1 + p : n_pages - 1 - p;
        for (int k = 0; k < ENC_T; k++, tok++) {
            t2p[tok] = idx[kvp[s] + k / ENC_PS];
            t2s[tok] = k % ENC_PS;
        }
    }
    ms_kv_plan plan = {0};
    plan.n_views = ENC_SEQS;
    plan.n_tokens = n;
    plan.qo_indptr = qo;
    plan.kv_indptr = kvp;
    plan.kv_indices = idx;
    plan.kv_last_page_len = last;
    plan.kv_start = kst;
    plan.token_to_page = t2p;
    plan.token_to_slot = t2s;
    ms_paged_kv kv = {NULL, kv_dt, 1, n_pages, ENC_PS, ENC_H, ENC_HD};
    both arena = both_alloc(ms_paged_kv_bytes(&kv), NULL);
    const int W = 3 * ENC_H * ENC_HD;
    float *hqkv = rand_host((size_t)n * W, 1.f, 0.f);
    both qkv = both_alloc((size_t)n * W * 4, hqkv);
    both out = both_alloc((size_t)n * ENC_H * ENC_HD * 4, NULL);
    const ms_attn_limits lim = {ENC_SEQS, n, ENC_SEQS * pages_per};
    /* then the decoder's cross-attention shape over the same keys: one query per clip (a decode
     * plan, split KV over 94 pages), no KV write (token_to_page NULL), bidirectional */
    int32_t dqo[ENC_SEQS + 1];
    for (int s = 0; s <= ENC_SEQS; s++)
        dqo[s] = s;
    ms_kv_plan dplan = plan;
    dplan.n_tokens = ENC_SEQS;
    dplan.qo_indptr = dqo;
    dplan.token_to_page = NULL;
    dplan.token_to_slot = NULL;
    dplan.is_decode = true;
    float *hqd = rand_host((size_t)ENC_SEQS * ENC_H * ENC_HD, 1.f, 0.f);
    both qd = both_alloc((size_t)ENC_SEQS * ENC_H * ENC_HD * 4, hqd);
    both outd = both_alloc((size_t)ENC_SEQS * ENC_H * ENC_HD * 4, NULL);
    for (int which = 0; which < 2; which++) {
        ms_backend *be = be_of(which);
        ms_paged_kv k2 = kv;
        k2.data = which ? arena.g : arena.c;
        ms_attn_batch *batch = NULL;
        OK(be->iface.attn_batch_init(be->ctx, &lim, &batch, &err));
        ms_attn_params ap = {1.f / sqrtf((float)ENC_HD), 0, false};
        if (ms_backend_attn_stage(be, batch, &plan, &k2, ENC_H, &ap, &err) != MS_OK)
            fail_msg("stage (%s): %s", be->iface.name, err.msg);
        ms_tensor a = on(&qkv, which, ms_tensor_2d(NULL, MS_DTYPE_F32, n, W));
        ms_tensor q2 = ms_tensor_slice(&a, 1, 0, ENC_H * ENC_HD);
        ms_tensor kk2 = ms_tensor_slice(&a, 1, ENC_H * ENC_HD, ENC_H * ENC_HD);
        ms_tensor v2 = ms_tensor_slice(&a, 1, 2 * ENC_H * ENC_HD, ENC_H * ENC_HD);
        ms_tensor q = ms_tensor_split_heads(&q2, ENC_H, ENC_HD), k = ms_tensor_split_heads(&kk2, ENC_H, ENC_HD);
        ms_tensor v = ms_tensor_split_heads(&v2, ENC_H, ENC_HD);
        OK(be->iface.kv_write(be->ctx, &k2, 0, &k, &v, batch, &err));
        ms_tensor o = on(&out, which, ms_tensor_3d(NULL, MS_DTYPE_F32, n, ENC_H, ENC_HD));
        if (be->iface.attention(be->ctx, &q, &k2, 0, batch, &ap, &o, &err) != MS_OK)
            fail_msg("attention (%s): %s", be->iface.name, err.msg);
        OK(be->iface.synchronize(be->ctx, &err));
        if (ms_backend_attn_stage(be, batch, &dplan, &k2, ENC_H, &ap, &err) != MS_OK)
            fail_msg("stage decode (%s): %s", be->iface.name, err.msg);
        ms_tensor tqd = on(&qd, which, ms_tensor_3d(NULL, MS_DTYPE_F32, ENC_SEQS, ENC_H, ENC_HD));
        ms_tensor tod = on(&outd, which, ms_tensor_3d(NULL, MS_DTYPE_F32, ENC_SEQS, ENC_H, ENC_HD));
        if (be->iface.attention(be->ctx, &tqd, &k2, 0, batch, &ap, &tod, &err) != MS_OK)
            fail_msg("attention decode (%s): %s", be->iface.name, err.msg);
        OK(be->iface.synchronize(be->ctx, &err));
        be->iface.attn_batch_free(be->ctx, batch);
    }
    char what[96];
    snprintf(what, sizeof what, "attention bidirectional, 2 x 1500 keys, KV %s", dt_name(kv_dt));
    compare(what, &out, (size_t)n * ENC_H * ENC_HD, 2e-2);
    snprintf(what, sizeof what, "attention 1 query x 1500 keys (cross shape), KV %s", dt_name(kv_dt));
    compare(what, &outd, (size_t)ENC_SEQS * ENC_H * ENC_HD, 1e-2);
    both_free(&qd);
    both_free(&outd);
    free(hqd);
    both_free(&arena);
    both_free(&qkv);
    both_free(&out);
    free(hqkv);
    free(idx);
    free(t2p);
    free(t2s);
}

static void test_encoder_attention(void **state) {
    (void)state;
    run_encoder_attention(MS_DTYPE_F16);
    run_encoder_attention(MS_DTYPE_BF16);
}

/* ---- dense attention over the step's own rows (attention_dense: no pages) ---- */

/* n_seg segments of lens[] rows, hq query heads over hkv KV heads of hd: q, k and v are column
 * views of one fused [n, (hq + 2 hkv) hd] buffer, as the encoder's Q/K/V GEMMs give them. */
static void run_dense_attention(const int32_t *lens, int n_seg, int hq, int hkv, int hd,
                                double tol) {
    ms_error err = {0};
    int n = 0;
    for (int i = 0; i < n_seg; i++)
        n += lens[i];
    const int W = (hq + 2 * hkv) * hd;
    float *hqkv = rand_host((size_t)n * W, 1.f, 0.f);
    both qkv = both_alloc((size_t)n * W * 4, hqkv);
    both out = both_alloc((size_t)n * hq * hd * 4, NULL);
    for (int which = 0; which < 2; which++) {
        ms_backend *be = be_of(which);
        ms_dense_batch *db = NULL;
        OK(ms_dense_batch_init(be, n_seg, n, &db, &err));
        OK(ms_dense_batch_stage(be, db, lens, n_seg, &err));
        ms_tensor a = on(&qkv, which, ms_tensor_2d(NULL, MS_DTYPE_F32, n, W));
        ms_tensor q2 = ms_tensor_slice(&a, 1, 0, hq * hd);
        ms_tensor k2 = ms_tensor_slice(&a, 1, hq * hd, hkv * hd);
        ms_tensor v2 = ms_tensor_slice(&a, 1, (hq + hkv) * hd, hkv * hd);
        ms_tensor q = ms_tensor_split_heads(&q2, hq, hd), k = ms_tensor_split_heads(&k2, hkv, hd);
        ms_tensor v = ms_tensor_split_heads(&v2, hkv, hd);
        ms_tensor o = on(&out, which, ms_tensor_3d(NULL, MS_DTYPE_F32, n, hq, hd));
        ms_attn_params ap = {1.f / sqrtf((float)hd), 0, false};
        if (be->iface.attention_dense(be->ctx, &q, &k, &v, db, &ap, &o, &err) != MS_OK)
            fail_msg("attention_dense (%s): %s", be->iface.name, err.msg);
        /* refusals on the device side too: a causal mask, a window */
        ap.causal = true;
        assert_int_equal(be->iface.attention_dense(be->ctx, &q, &k, &v, db, &ap, &o, &err),
                         MS_ERR_INVALID_ARG);
        ap.causal = false;
        ap.window = 8;
        assert_int_equal(be->iface.attention_dense(be->ctx, &q, &k, &v, db, &ap, &o, &err),
                         MS_ERR_INVALID_ARG);
        OK(be->iface.synchronize(be->ctx, &err));
        ms_dense_batch_free(be, db);
    }
    char what[96];
    snprintf(what, sizeof what, "attention_dense %d segments, %d rows, %d/%d heads of %d", n_seg,
             n, hq, hkv, hd);
    compare(what, &out, (size_t)n * hq * hd, tol);
    both_free(&qkv);
    both_free(&out);
    free(hqkv);
}

static void test_dense_attention(void **state) {
    (void)state;
    /* three Whisper base windows in one step (f32 on both sides: only the exp and the summation
       order differ) */
    static const int32_t base[] = {1500, 1500, 1500};
    run_dense_attention(base, 3, ENC_H, ENC_H, ENC_HD, 1e-4);
    /* ragged segments, GQA, other head sizes (a one-row segment sees only itself) */
    static const int32_t ragged[] = {37, 1, 200, 64};
    run_dense_attention(ragged, 4, 8, 2, 32, 1e-4);
    run_dense_attention(ragged, 4, 4, 4, 128, 1e-4);
    run_dense_attention(ragged, 4, 4, 4, 16, 1e-4); /* Whisper tiny's fixture: 4 heads of 16 */
    run_dense_attention(ragged, 4, 6, 3, 48, 1e-4); /* masked lanes */
}

/* ---- setup ---- */

static int64_t g_live_at_setup;

static int group_setup(void **state) {
    (void)state;
    ms_error err = {0};
    g_live_at_setup = ms_alloc_get_stats().live_blocks;
    const char *seed = getenv("MS_TEST_SEED");
    g_rng = seed != NULL ? strtoull(seed, NULL, 10) : (uint64_t)time(NULL);
    const char *dev = getenv("MS_ENCODER_OPS_DEVICE");
    g_dry_run = dev != NULL && strcmp(dev, "cpu") == 0;
    /* the oracle's threads: the device machine has 16 cores; CI (the dry run) has 2 */
    ms_backend_cpu_options co = {g_dry_run ? 2 : 8};
    if (ms_backend_cpu_init(&g_cpu, &co, &err) != MS_OK) {
        fprintf(stderr, "test_encoder_ops_cuda: %s\n", err.msg);
        return -1;
    }
    if (g_dry_run) {
        if (ms_backend_cpu_init(&g_gpu, &co, &err) != MS_OK) {
            fprintf(stderr, "test_encoder_ops_cuda: %s\n", err.msg);
            return -1;
        }
    } else {
        const char *c = getenv("MS_KERNEL_CACHE_TEST");
        ms_backend_cuda_options opt = {0, c != NULL && c[0] ? c : "build/kernel-cache-test"};
        if (ms_backend_cuda_init(&g_gpu, &opt, &err) != MS_OK) {
            fprintf(stderr, "test_encoder_ops_cuda: %s (MS_ENCODER_OPS_DEVICE=cpu: dry run on the CPU)\n",
                    err.msg);
            return -1;
        }
    }
    printf("test_encoder_ops_cuda: %s against cpu, seed %llu (MS_TEST_SEED to repeat)\n",
           g_dry_run ? "cpu (dry run, MS_ENCODER_OPS_DEVICE=cpu)" : "cuda", (unsigned long long)g_rng);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    ms_backend_free(&g_gpu);
    ms_backend_free(&g_cpu);
    int64_t live = ms_alloc_get_stats().live_blocks;
    if (live != g_live_at_setup) {
        fprintf(stderr, "leak check: %lld block(s) still allocated\n", (long long)(live - g_live_at_setup));
        return -1;
    }
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_misc_instances_compile),
        cmocka_unit_test(test_layer_norm),
        cmocka_unit_test(test_gelu),
        cmocka_unit_test(test_conv1d),
        cmocka_unit_test(test_conv1d_errors),
        cmocka_unit_test(test_linear_bias_and_positions),
        cmocka_unit_test(test_encoder_attention),
        cmocka_unit_test(test_dense_instances_compile),
        cmocka_unit_test(test_dense_attention),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
