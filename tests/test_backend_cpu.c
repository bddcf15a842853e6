/*
 * test_backend_cpu.c - the CPU backend (backend_cpu.c) and the backend-independent helpers
 * (backend.c): every op against a plain naive reference on fresh random inputs, known answers,
 * thread-count independence, and clear errors for bad operands.
 */
#include "ms_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "hf_config.h"
#include "ms_test_impl.h"

/* ---- helpers ---- */

static uint64_t rng_state = 0x1234567u;

static float frand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

static float *rand_buf(size_t n) {
    float *p = ms_malloc(n * sizeof *p);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++)
        p[i] = frand();
    return p;
}

static float max_abs_diff(const float *a, const float *b, size_t n) {
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m))
            m = isnan(d) ? INFINITY : d;
    }
    return m;
}

static ms_backend make_cpu(int32_t threads) {
    ms_backend be;
    ms_error err = {0};
    ms_backend_cpu_options o = {threads};
    assert_int_equal(ms_backend_cpu_init(&be, &o, &err), MS_OK);
    return be;
}

/* ---- dtypes and tensors ---- */

static void test_dtype_conversions_round_trip(void **state) {
    (void)state;
    assert_string_equal(ms_dtype_str(MS_DTYPE_BF16), "bf16");
    assert_int_equal(ms_dtype_size(MS_DTYPE_F16), 2);
    assert_int_equal(ms_dtype_size(MS_DTYPE_COUNT), 0);
    /* exactly representable values survive both conversions */
    float exact[] = {0.0f, 1.0f, -2.0f, 0.5f, 65280.0f, -0.15625f, 3.0f};
    for (size_t i = 0; i < MS_ARRAY_LEN(exact); i++) {
        assert_true(ms_f16_to_f32(ms_f32_to_f16(exact[i])) == exact[i]);
        assert_true(ms_bf16_to_f32(ms_f32_to_bf16(exact[i])) == exact[i]);
    }
    assert_true(ms_f16_to_f32(ms_f32_to_f16(65504.0f)) == 65504.0f); /* f16 max */
    /* known encodings */
    assert_int_equal(ms_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(ms_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(ms_f32_to_f16(1e6f), 0x7c00);             /* overflow -> inf */
    assert_true(ms_f16_to_f32(0x0001) == 0x1p-24f);            /* smallest subnormal */
    assert_int_equal(ms_f32_to_f16(0x1p-24f), 0x0001);
    assert_true(isnan(ms_bf16_to_f32(ms_f32_to_bf16(NAN))));
    /* round to nearest even: 1 + 2^-8 is halfway between bf16 1 and 1 + 2^-7 */
    assert_int_equal(ms_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
    assert_int_equal(ms_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
    /* relative error bounds on random values */
    for (int i = 0; i < 1000; i++) {
        float v = frand() * 100.0f;
        assert_true(fabsf(ms_bf16_to_f32(ms_f32_to_bf16(v)) - v) <= fabsf(v) * 0x1p-8f);
        assert_true(fabsf(ms_f16_to_f32(ms_f32_to_f16(v)) - v) <= fabsf(v) * 0x1p-11f + 0x1p-24f);
    }
}

static void test_tensor_views(void **state) {
    (void)state;
    float buf[4 * 12];
    ms_tensor t = ms_tensor_2d(buf, MS_DTYPE_F32, 4, 12);
    assert_true(ms_tensor_is_contiguous(&t));
    assert_int_equal(ms_tensor_numel(&t), 48);
    ms_tensor k = ms_tensor_slice(&t, 1, 4, 4);
    assert_ptr_equal(k.data, buf + 4);
    assert_int_equal(k.stride[0], 12);
    assert_false(ms_tensor_is_contiguous(&k));
    ms_tensor kh = ms_tensor_split_heads(&k, 2, 2);
    assert_int_equal(kh.ndim, 3);
    assert_int_equal(kh.stride[0], 12);
    assert_int_equal(kh.stride[1], 2);
    char s[64];
    assert_string_equal(ms_tensor_shape_str(&kh, s, sizeof s), "[4, 2, 2]");
}

/* ---- linear ---- */

static void ref_linear(const float *x, const float *w, const float *b, float *y, int n, int in,
                       int out) {
    for (int t = 0; t < n; t++)
        for (int o = 0; o < out; o++) {
            double s = b ? b[o] : 0.0;
            for (int i = 0; i < in; i++)
                s += (double)x[t * in + i] * w[o * in + i];
            y[t * out + o] = (float)s;
        }
}

static void test_linear_matches_reference_all_weight_dtypes(void **state) {
    (void)state;
    ms_backend be = make_cpu(3);
    ms_error err = {0};
    int n = 7, in = 37, out = 45;
    float *x = rand_buf((size_t)(n * in)), *w = rand_buf((size_t)(out * in));
    float *b = rand_buf((size_t)out), *y = rand_buf((size_t)(n * (out + 3)));
    float *ref = ms_malloc(sizeof(float) * (size_t)(n * out));
    uint16_t *w16 = ms_malloc(sizeof(uint16_t) * (size_t)(out * in));
    float *wq = ms_malloc(sizeof(float) * (size_t)(out * in));
    for (ms_dtype dt = MS_DTYPE_F32; dt <= MS_DTYPE_F16; dt++) {
        /* reference on the weights as the backend sees them */
        for (int i = 0; i < out * in; i++) {
            if (dt == MS_DTYPE_BF16)
                w16[i] = ms_f32_to_bf16(w[i]), wq[i] = ms_bf16_to_f32(w16[i]);
            else if (dt == MS_DTYPE_F16)
                w16[i] = ms_f32_to_f16(w[i]), wq[i] = ms_f16_to_f32(w16[i]);
            else
                wq[i] = w[i];
        }
        ref_linear(x, wq, b, ref, n, in, out);
        ms_tensor tx = ms_tensor_2d(x, MS_DTYPE_F32, n, in);
        ms_tensor tw = ms_tensor_2d(dt == MS_DTYPE_F32 ? (void *)w : (void *)w16, dt, out, in);
        ms_tensor tb = ms_tensor_1d(b, MS_DTYPE_F32, out);
        /* y is a column slice of a wider buffer (as Q of a fused QKV output) */
        ms_tensor wide = ms_tensor_2d(y, MS_DTYPE_F32, n, out + 3);
        ms_tensor ty = ms_tensor_slice(&wide, 1, 2, out);
        assert_int_equal(be.iface.linear(be.ctx, &tx, &tw, &tb, &ty, &err), MS_OK);
        float md = 0.0f;
        for (int t = 0; t < n; t++)
            md = fmaxf(md, max_abs_diff(y + t * (out + 3) + 2, ref + t * out, (size_t)out));
        assert_true(md < 1e-5f);
    }
    /* shape mismatch: clear error */
    ms_tensor tx = ms_tensor_2d(x, MS_DTYPE_F32, n, in - 1);
    ms_tensor tw = ms_tensor_2d(w, MS_DTYPE_F32, out, in);
    ms_tensor ty = ms_tensor_2d(y, MS_DTYPE_F32, n, out);
    assert_int_equal(be.iface.linear(be.ctx, &tx, &tw, NULL, &ty, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "linear: shapes x [7, 36], w [45, 37]"));
    ms_free(x), ms_free(w), ms_free(b), ms_free(y), ms_free(ref), ms_free(w16), ms_free(wq);
    ms_backend_free(&be);
}

/* ---- norms and elementwise ops ---- */

static void ref_rms_norm(const float *x, const float *w, float eps, float *out, int rows, int d) {
    for (int r = 0; r < rows; r++) {
        double ss = 0.0;
        for (int i = 0; i < d; i++)
            ss += (double)x[r * d + i] * x[r * d + i];
        double inv = 1.0 / sqrt(ss / d + eps);
        for (int i = 0; i < d; i++)
            out[r * d + i] = (float)(x[r * d + i] * inv * w[i]);
    }
}

static void test_rms_norm_rows_heads_and_fused_add(void **state) {
    (void)state;
    ms_backend be = make_cpu(2);
    ms_error err = {0};
    int n = 9, h = 4, d = 48;
    float *x = rand_buf((size_t)(n * h * d)), *w = rand_buf((size_t)(h * d));
    float *out = rand_buf((size_t)(n * h * d)), *ref = rand_buf((size_t)(n * h * d));
    /* rows of hidden size h*d */
    ms_tensor tx = ms_tensor_2d(x, MS_DTYPE_F32, n, h * d);
    ms_tensor tw = ms_tensor_1d(w, MS_DTYPE_F32, h * d);
    ms_tensor to = ms_tensor_2d(out, MS_DTYPE_F32, n, h * d);
    assert_int_equal(be.iface.rms_norm(be.ctx, &tx, &tw, 1e-5f, &to, &err), MS_OK);
    ref_rms_norm(x, w, 1e-5f, ref, n, h * d);
    assert_true(max_abs_diff(out, ref, (size_t)(n * h * d)) < 1e-5f);
    /* per-head norm (Qwen3 q_norm), bf16 weight of [head_dim] */
    uint16_t wb[64];
    float wq[64];
    for (int i = 0; i < d; i++)
        wb[i] = ms_f32_to_bf16(w[i]), wq[i] = ms_bf16_to_f32(wb[i]);
    ms_tensor tx3 = ms_tensor_3d(x, MS_DTYPE_F32, n, h, d);
    ms_tensor to3 = ms_tensor_3d(out, MS_DTYPE_F32, n, h, d);
    ms_tensor twb = ms_tensor_1d(wb, MS_DTYPE_BF16, d);
    assert_int_equal(be.iface.rms_norm(be.ctx, &tx3, &twb, 1e-6f, &to3, &err), MS_OK);
    ref_rms_norm(x, wq, 1e-6f, ref, n * h, d);
    assert_true(max_abs_diff(out, ref, (size_t)(n * h * d)) < 1e-5f);
    /* in place */
    memcpy(out, x, sizeof(float) * (size_t)(n * h * d));
    assert_int_equal(be.iface.rms_norm(be.ctx, &to3, &twb, 1e-6f, &to3, &err), MS_OK);
    assert_true(max_abs_diff(out, ref, (size_t)(n * h * d)) < 1e-5f);
    /* fused add + norm equals add then norm */
    float *res1 = rand_buf((size_t)(n * h * d)), *res2 = ms_malloc(sizeof(float) * (size_t)(n * h * d));
    memcpy(res2, res1, sizeof(float) * (size_t)(n * h * d));
    ms_tensor tr1 = ms_tensor_2d(res1, MS_DTYPE_F32, n, h * d);
    ms_tensor tr2 = ms_tensor_2d(res2, MS_DTYPE_F32, n, h * d);
    ms_tensor tref = ms_tensor_2d(ref, MS_DTYPE_F32, n, h * d);
    assert_int_equal(be.iface.add_rms_norm(be.ctx, &tr1, &tx, &tw, 1e-5f, &to, &err), MS_OK);
    ms_backend plain = be;
    plain.iface.add_rms_norm = NULL; /* wrapper falls back to add + rms_norm */
    assert_int_equal(ms_backend_add_rms_norm(&plain, &tr2, &tx, &tw, 1e-5f, &tref, &err), MS_OK);
    assert_true(max_abs_diff(res1, res2, (size_t)(n * h * d)) == 0.0f);
    assert_true(max_abs_diff(out, ref, (size_t)(n * h * d)) == 0.0f);
    /* wrong weight length */
    ms_tensor tw_bad = ms_tensor_1d(w, MS_DTYPE_F32, h * d - 1);
    assert_int_equal(be.iface.rms_norm(be.ctx, &tx, &tw_bad, 1e-5f, &to, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "rms_norm: w has 191 entries"));
    ms_free(x), ms_free(w), ms_free(out), ms_free(ref), ms_free(res1), ms_free(res2);
    ms_backend_free(&be);
}

static void test_silu_mul_add_embedding_gather(void **state) {
    (void)state;
    ms_backend be = make_cpu(2);
    ms_error err = {0};
    int n = 5, f = 33;
    /* gate and up as halves of one [n, 2f] output */
    float *gu = rand_buf((size_t)(n * 2 * f)), *out = rand_buf((size_t)(n * f));
    ms_tensor tgu = ms_tensor_2d(gu, MS_DTYPE_F32, n, 2 * f);
    ms_tensor tg = ms_tensor_slice(&tgu, 1, 0, f), tu = ms_tensor_slice(&tgu, 1, f, f);
    ms_tensor to = ms_tensor_2d(out, MS_DTYPE_F32, n, f);
    assert_int_equal(be.iface.silu_mul(be.ctx, &tg, &tu, &to, &err), MS_OK);
    for (int t = 0; t < n; t++)
        for (int i = 0; i < f; i++) {
            double g = gu[t * 2 * f + i], u = gu[t * 2 * f + f + i];
            assert_true(fabs(out[t * f + i] - g / (1.0 + exp(-g)) * u) < 1e-6);
        }
    /* add, in place */
    float *a = rand_buf((size_t)(n * f)), *a0 = ms_malloc(sizeof(float) * (size_t)(n * f));
    memcpy(a0, a, sizeof(float) * (size_t)(n * f));
    ms_tensor ta = ms_tensor_2d(a, MS_DTYPE_F32, n, f);
    assert_int_equal(be.iface.add(be.ctx, &ta, &to, &ta, &err), MS_OK);
    for (int i = 0; i < n * f; i++)
        assert_true(a[i] == a0[i] + out[i]);
    /* embedding from a bf16 table */
    int V = 11, d = 6;
    uint16_t table[11 * 6];
    for (int i = 0; i < V * d; i++)
        table[i] = ms_f32_to_bf16(frand());
    int32_t ids[4] = {3, 0, 10, 3};
    float emb[4 * 6];
    ms_tensor tt = ms_tensor_2d(table, MS_DTYPE_BF16, V, d);
    ms_tensor ti = ms_tensor_1d(ids, MS_DTYPE_I32, 4);
    ms_tensor te = ms_tensor_2d(emb, MS_DTYPE_F32, 4, d);
    assert_int_equal(be.iface.embedding(be.ctx, &tt, &ti, &te, &err), MS_OK);
    for (int t = 0; t < 4; t++)
        for (int i = 0; i < d; i++)
            assert_true(emb[t * d + i] == ms_bf16_to_f32(table[ids[t] * d + i]));
    ids[2] = 11;
    assert_int_equal(be.iface.embedding(be.ctx, &tt, &ti, &te, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "token 2 has id 11 outside the vocabulary [0, 11)"));
    /* gather rows: last token per sequence, -1 gives zeros */
    int32_t rows[3] = {4, -1, 0};
    float g[3 * 6];
    ms_tensor tx = ms_tensor_2d(emb, MS_DTYPE_F32, 4, d);
    ms_tensor tr = ms_tensor_1d(rows, MS_DTYPE_I32, 3);
    ms_tensor tgo = ms_tensor_2d(g, MS_DTYPE_F32, 3, d);
    assert_int_equal(be.iface.gather_rows(be.ctx, &tx, &tr, &tgo, &err), MS_ERR_INVALID_ARG);
    rows[0] = 3;
    assert_int_equal(be.iface.gather_rows(be.ctx, &tx, &tr, &tgo, &err), MS_OK);
    for (int i = 0; i < d; i++) {
        assert_true(g[i] == emb[3 * d + i]);
        assert_true(g[d + i] == 0.0f);
        assert_true(g[2 * d + i] == emb[i]);
    }
    ms_free(gu), ms_free(out), ms_free(a), ms_free(a0);
    ms_backend_free(&be);
}

static void test_argmax_lowest_index_on_ties(void **state) {
    (void)state;
    ms_backend be = make_cpu(1);
    ms_error err = {0};
    float l[2 * 5] = {1, 3, 3, -1, 2, NAN, -INFINITY, 0.5f, 0.5f, NAN};
    int32_t ids[2];
    ms_tensor tl = ms_tensor_2d(l, MS_DTYPE_F32, 2, 5), ti = ms_tensor_1d(ids, MS_DTYPE_I32, 2);
    assert_int_equal(be.iface.argmax(be.ctx, &tl, &ti, &err), MS_OK);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 2);
    ms_backend_free(&be);
}

static void test_tensor_load_converts_and_reads_unaligned(void **state) {
    (void)state;
    ms_backend be = make_cpu(1);
    ms_error err = {0};
    /* src: 3x4 f32 at an odd address (a checkpoint tensor need not be aligned) */
    char raw[3 * 4 * 4 + 1];
    float vals[12];
    for (int i = 0; i < 12; i++)
        vals[i] = frand();
    memcpy(raw + 1, vals, sizeof vals);
    ms_tensor src = ms_tensor_2d(raw + 1, MS_DTYPE_F32, 3, 4);
    /* dst: rows 2..5 of a [6, 4] bf16 buffer (a slice of a concatenated weight) */
    void *dbuf;
    assert_int_equal(be.iface.buffer_alloc(be.ctx, 6 * 4 * 2, "test.w", &dbuf, &err), MS_OK);
    assert_int_equal(((uintptr_t)dbuf) % 64, 0);
    assert_int_equal(be.iface.buffer_fill(be.ctx, dbuf, 0, 6 * 4 * 2, &err), MS_OK);
    ms_tensor whole = ms_tensor_2d(dbuf, MS_DTYPE_BF16, 6, 4);
    ms_tensor dst = ms_tensor_slice(&whole, 0, 2, 3);
    assert_int_equal(be.iface.tensor_load(be.ctx, &dst, &src, &err), MS_OK);
    uint16_t host[24];
    assert_int_equal(be.iface.copy_to_host(be.ctx, host, dbuf, sizeof host, &err), MS_OK);
    for (int i = 0; i < 8; i++)
        assert_int_equal(host[i], 0);
    for (int i = 0; i < 12; i++)
        assert_int_equal(host[8 + i], ms_f32_to_bf16(vals[i]));
    ms_tensor bad = ms_tensor_slice(&whole, 0, 0, 2);
    assert_int_equal(be.iface.tensor_load(be.ctx, &bad, &src, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "tensor_load: src shape [3, 4] does not match dst [2, 4]"));
    be.iface.buffer_free(be.ctx, dbuf);
    ms_backend_free(&be);
}

static void test_encoder_ops_layer_norm_gelu_conv1d(void **state) {
    (void)state;
    ms_backend be = make_cpu(2);
    ms_error err = {0};
    /* layer_norm against a double reference, with and without bias */
    int n = 6, d = 40;
    float *x = rand_buf((size_t)(n * d)), *w = rand_buf((size_t)d), *b = rand_buf((size_t)d);
    float *out = rand_buf((size_t)(n * d));
    ms_tensor tx = ms_tensor_2d(x, MS_DTYPE_F32, n, d), to = ms_tensor_2d(out, MS_DTYPE_F32, n, d);
    ms_tensor tw = ms_tensor_1d(w, MS_DTYPE_F32, d), tb = ms_tensor_1d(b, MS_DTYPE_F32, d);
    for (int with_b = 0; with_b < 2; with_b++) {
        assert_int_equal(be.iface.layer_norm(be.ctx, &tx, &tw, with_b ? &tb : NULL, 1e-5f, &to, &err),
                         MS_OK);
        for (int r = 0; r < n; r++) {
            double mean = 0.0, var = 0.0;
            for (int i = 0; i < d; i++)
                mean += x[r * d + i];
            mean /= d;
            for (int i = 0; i < d; i++)
                var += (x[r * d + i] - mean) * (x[r * d + i] - mean);
            var /= d;
            for (int i = 0; i < d; i++) {
                double want = (x[r * d + i] - mean) / sqrt(var + 1e-5) * w[i] + (with_b ? b[i] : 0.0);
                assert_true(fabs(out[r * d + i] - want) < 1e-5);
            }
        }
    }
    /* gelu (exact erf form); known values */
    float g[4] = {0.0f, 1.0f, -1.0f, 3.0f}, go[4];
    ms_tensor tg = ms_tensor_2d(g, MS_DTYPE_F32, 1, 4), tgo = ms_tensor_2d(go, MS_DTYPE_F32, 1, 4);
    assert_int_equal(be.iface.gelu(be.ctx, &tg, &tgo, &err), MS_OK);
    assert_true(go[0] == 0.0f);
    assert_true(fabsf(go[1] - 0.8413447f) < 1e-6f);
    assert_true(fabsf(go[2] + 0.1586553f) < 1e-6f);
    assert_true(fabsf(go[3] - 2.9959502f) < 1e-6f);
    /* conv1d: stride 1 and 2, padding 1, against a direct reference */
    int t_in = 9, c_in = 5, c_out = 7, k = 3;
    float *cx = rand_buf((size_t)(t_in * c_in)), *cw = rand_buf((size_t)(c_out * c_in * k));
    float *cb = rand_buf((size_t)c_out), cy[9 * 7];
    for (int stride = 1; stride <= 2; stride++) {
        int t_out = (t_in + 2 - k) / stride + 1;
        ms_tensor ctx_ = ms_tensor_2d(cx, MS_DTYPE_F32, t_in, c_in);
        ms_tensor ctw = ms_tensor_3d(cw, MS_DTYPE_F32, c_out, c_in, k);
        ms_tensor ctb = ms_tensor_1d(cb, MS_DTYPE_F32, c_out);
        ms_tensor cty = ms_tensor_2d(cy, MS_DTYPE_F32, t_out, c_out);
        assert_int_equal(be.iface.conv1d(be.ctx, &ctx_, &ctw, &ctb, stride, 1, &cty, &err), MS_OK);
        for (int t = 0; t < t_out; t++)
            for (int o = 0; o < c_out; o++) {
                double acc = cb[o];
                for (int c = 0; c < c_in; c++)
                    for (int kk = 0; kk < k; kk++) {
                        int src = t * stride + kk - 1;
                        if (src >= 0 && src < t_in)
                            acc += (double)cw[(o * c_in + c) * k + kk] * cx[src * c_in + c];
                    }
                assert_true(fabs(cy[t * c_out + o] - acc) < 1e-5);
            }
        ms_tensor bad = ms_tensor_2d(cy, MS_DTYPE_F32, t_out + 1, c_out);
        assert_int_equal(be.iface.conv1d(be.ctx, &ctx_, &ctw, &ctb, stride, 1, &bad, &err),
                         MS_ERR_INVALID_ARG);
        assert_non_null(strstr(err.msg, "conv1d: shapes x [9, 5], w [7, 5, 3]"));
    }
    ms_free(x), ms_free(w), ms_free(b), ms_free(out), ms_free(cx), ms_free(cw), ms_free(cb);
    ms_backend_free(&be);
}

/* ---- RoPE ---- */

static void test_rope_inv_freq_default_and_llama3(void **state) {
    (void)state;
    ms_error err = {0};
    float f[64], g[64];
    ms_rope_config c = {MS_ROPE_ROTATE_HALF, 128, 0, 500000.0, MS_ROPE_SCALING_NONE, 0, 0, 0, 0, 0, {0}};
    assert_int_equal(ms_rope_compute_inv_freq(&c, f, &err), MS_OK);
    assert_true(f[0] == 1.0f);
    for (int j = 0; j < 64; j++)
        assert_true(fabs(f[j] - pow(500000.0, -2.0 * j / 128)) <= 1e-6 * pow(500000.0, -2.0 * j / 128));
    /* llama3 (Llama 3.1 8B values): factor 8, low 1, high 4, original 8192 */
    c.scaling = MS_ROPE_SCALING_LLAMA3;
    c.factor = 8.0, c.low_freq_factor = 1.0, c.high_freq_factor = 4.0;
    c.original_max_position = 8192.0;
    assert_int_equal(ms_rope_compute_inv_freq(&c, g, &err), MS_OK);
    int n_high = 0, n_low = 0, n_mid = 0;
    for (int j = 0; j < 64; j++) {
        double wavelen = 2.0 * M_PI / f[j];
        if (wavelen < 8192.0 / 4.0) {
            assert_true(g[j] == f[j]), n_high++;
        } else if (wavelen > 8192.0) {
            assert_true(fabsf(g[j] - f[j] / 8.0f) <= 1e-7f * f[j]), n_low++;
        } else {
            double s = (8192.0 / wavelen - 1.0) / 3.0;
            double want = (1 - s) * f[j] / 8.0 + s * f[j];
            assert_true(fabs(g[j] - want) <= 1e-5 * want), n_mid++;
        }
    }
    assert_true(n_high > 0 && n_low > 0 && n_mid > 0);
    c.rotary_dim = 7;
    assert_int_equal(ms_rope_compute_inv_freq(&c, g, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "rotary_dim 7"));
    c.rotary_dim = 0;
    c.high_freq_factor = 0.5;
    assert_int_equal(ms_rope_compute_inv_freq(&c, g, &err), MS_ERR_INVALID_ARG);
}

static void test_rope_config_from_hf_params(void **state) {
    (void)state;
    ms_error err = {0};
    ms_rope_params p;
    memset(&p, 0, sizeof p);
    p.type = MS_ROPE_TYPE_LLAMA3;
    p.theta = 500000.0, p.factor = 8.0, p.low_freq_factor = 1.0, p.high_freq_factor = 4.0;
    p.original_max_position_embeddings = 8192;
    p.partial_rotary_factor = 1.0;
    ms_rope_config c;
    assert_int_equal(ms_rope_config_from_hf(&p, MS_ROPE_ROTATE_HALF, 128, &c, &err), MS_OK);
    assert_int_equal(c.scaling, MS_ROPE_SCALING_LLAMA3);
    assert_int_equal(c.rotary_dim, 128);
    assert_true(c.theta == 500000.0 && c.factor == 8.0 && c.original_max_position == 8192.0);
    p.type = MS_ROPE_TYPE_DEFAULT;
    p.partial_rotary_factor = 0.25;
    assert_int_equal(ms_rope_config_from_hf(&p, MS_ROPE_INTERLEAVED, 64, &c, &err), MS_OK);
    assert_int_equal(c.rotary_dim, 16);
    assert_int_equal(c.style, MS_ROPE_INTERLEAVED);
    assert_int_equal(c.scaling, MS_ROPE_SCALING_NONE);
    p.type = MS_ROPE_TYPE_YARN;
    assert_int_equal(ms_rope_config_from_hf(&p, MS_ROPE_ROTATE_HALF, 64, &c, &err), MS_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "rope_type 'yarn' is not supported"));
    p.type = MS_ROPE_TYPE_DEFAULT;
    p.partial_rotary_factor = 0.0;
    assert_int_equal(ms_rope_config_from_hf(&p, MS_ROPE_ROTATE_HALF, 64, &c, &err), MS_ERR_INVALID_ARG);
}

/* Reference rotation in double: HF rotate_half or llama2.c interleaved pairs. */
static void ref_rope(float *x, int heads, int d, int rot, ms_rope_style style, const float *inv,
                     int pos) {
    for (int h = 0; h < heads; h++) {
        float *v = x + h * d;
        for (int j = 0; j < rot / 2; j++) {
            double a = (double)((float)pos * inv[j]);
            double c = cos(a), s = sin(a);
            int i0 = style == MS_ROPE_ROTATE_HALF ? j : 2 * j;
            int i1 = style == MS_ROPE_ROTATE_HALF ? j + rot / 2 : 2 * j + 1;
            double x0 = v[i0], x1 = v[i1];
            v[i0] = (float)(x0 * c - x1 * s);
            v[i1] = (float)(x1 * c + x0 * s);
        }
    }
}

static void test_rope_styles_partial_and_position_zero(void **state) {
    (void)state;
    ms_backend be = make_cpu(2);
    ms_error err = {0};
    int n = 6, hq = 4, hkv = 2, d = 32;
    int32_t pos[6] = {0, 1, 7, 100, 513, 4095};
    float inv[16];
    for (int style = 0; style < MS_ROPE_STYLE_COUNT; style++) {
        for (int rot = d; rot >= d / 2; rot -= d / 2) {
            ms_rope_config c = {(ms_rope_style)style, d, rot, 10000.0, MS_ROPE_SCALING_NONE, 0, 0, 0, 0, 0, {0}};
            assert_int_equal(ms_rope_compute_inv_freq(&c, inv, &err), MS_OK);
            /* q and k as views of one fused QKV buffer [n, (hq + 2 hkv) d] */
            int row = (hq + 2 * hkv) * d;
            float *qkv = rand_buf((size_t)(n * row));
            float *ref = ms_malloc(sizeof(float) * (size_t)(n * row));
            memcpy(ref, qkv, sizeof(float) * (size_t)(n * row));
            ms_tensor all = ms_tensor_2d(qkv, MS_DTYPE_F32, n, row);
            ms_tensor q2 = ms_tensor_slice(&all, 1, 0, hq * d);
            ms_tensor k2 = ms_tensor_slice(&all, 1, hq * d, hkv * d);
            ms_tensor q = ms_tensor_split_heads(&q2, hq, d), k = ms_tensor_split_heads(&k2, hkv, d);
            ms_tensor tp = ms_tensor_1d(pos, MS_DTYPE_I32, n);
            ms_rope_table rt = {.style = (ms_rope_style)style, .rotary_dim = rot, .inv_freq = inv,
                                .attention_scaling = 1.0f};
            assert_int_equal(be.iface.rope(be.ctx, &q, &k, &tp, &rt, &err), MS_OK);
            for (int t = 0; t < n; t++)
                ref_rope(ref + t * row, hq + hkv, d, rot, (ms_rope_style)style, inv, pos[t]);
            assert_true(max_abs_diff(qkv, ref, (size_t)(n * row)) < 2e-5f);
            /* position 0 is the identity; V and unrotated dims untouched */
            for (int i = 0; i < row; i++)
                if (i >= (hq + hkv) * d)
                    assert_true(qkv[i] == ref[i]);
            memcpy(ref, qkv, sizeof(float) * (size_t)row);
            ms_free(qkv), ms_free(ref);
        }
    }
    /* exact identity at position 0 */
    float x[2 * 32], x0[2 * 32];
    for (int i = 0; i < 64; i++)
        x[i] = x0[i] = frand();
    int32_t p0 = 0;
    ms_tensor tq = ms_tensor_3d(x, MS_DTYPE_F32, 1, 2, 32), tp0 = ms_tensor_1d(&p0, MS_DTYPE_I32, 1);
    ms_rope_table rt = {.style = MS_ROPE_ROTATE_HALF, .rotary_dim = 32, .inv_freq = inv,
                        .attention_scaling = 1.0f};
    ms_rope_config c = {MS_ROPE_ROTATE_HALF, 32, 0, 10000.0, MS_ROPE_SCALING_NONE, 0, 0, 0, 0, 0, {0}};
    assert_int_equal(ms_rope_compute_inv_freq(&c, inv, &err), MS_OK);
    assert_int_equal(be.iface.rope(be.ctx, &tq, NULL, &tp0, &rt, &err), MS_OK);
    assert_memory_equal(x, x0, sizeof x);
    /* rotate-half and interleaved agree after permuting dims: pair j <-> (2j, 2j+1) */
    float a[32], b[32];
    for (int i = 0; i < 32; i++)
        a[i] = frand();
    for (int j = 0; j < 16; j++)
        b[2 * j] = a[j], b[2 * j + 1] = a[j + 16];
    int32_t p5 = 5;
    ms_tensor ta = ms_tensor_3d(a, MS_DTYPE_F32, 1, 1, 32), tb = ms_tensor_3d(b, MS_DTYPE_F32, 1, 1, 32);
    ms_tensor tp5 = ms_tensor_1d(&p5, MS_DTYPE_I32, 1);
    assert_int_equal(be.iface.rope(be.ctx, &ta, NULL, &tp5, &rt, &err), MS_OK);
    rt.style = MS_ROPE_INTERLEAVED;
    assert_int_equal(be.iface.rope(be.ctx, &tb, NULL, &tp5, &rt, &err), MS_OK);
    for (int j = 0; j < 16; j++) {
        assert_true(a[j] == b[2 * j]);
        assert_true(a[j + 16] == b[2 * j + 1]);
    }
    p5 = -1;
    assert_int_equal(be.iface.rope(be.ctx, &ta, NULL, &tp5, &rt, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "negative position -1"));
    ms_backend_free(&be);
}

static void test_mrope_sections(void **state) {
    (void)state;
    ms_backend be = make_cpu(2);
    ms_error err = {0};
    int n = 5, h = 3, d = 32;
    float inv[16];
    ms_rope_config c = {MS_ROPE_ROTATE_HALF, d, 0, 10000.0, MS_ROPE_SCALING_NONE, 0, 0, 0, 0, 0, {0}};
    assert_int_equal(ms_rope_compute_inv_freq(&c, inv, &err), MS_OK);
    /* Qwen2-VL: mrope_section [4, 6, 6] over 16 pairs; streams t, h, w (stream-major) */
    int32_t pos[3 * 5] = {0, 1, 2, 2, 9, /* t */ 0, 1, 2, 3, 9, /* h */ 0, 1, 3, 5, 9 /* w */};
    ms_rope_table mt = {.style = MS_ROPE_ROTATE_HALF, .rotary_dim = d, .inv_freq = inv,
                        .attention_scaling = 1.0f, .n_sections = 3, .sections = {4, 6, 6}};
    float *q = rand_buf((size_t)(n * h * d)), *ref = ms_malloc(sizeof(float) * (size_t)(n * h * d));
    memcpy(ref, q, sizeof(float) * (size_t)(n * h * d));
    ms_tensor tq = ms_tensor_3d(q, MS_DTYPE_F32, n, h, d), tp = ms_tensor_2d(pos, MS_DTYPE_I32, 3, n);
    assert_int_equal(be.iface.rope(be.ctx, &tq, NULL, &tp, &mt, &err), MS_OK);
    /* reference: pair j rotates by pos[stream(j)] * inv[j] */
    for (int t = 0; t < n; t++)
        for (int hh = 0; hh < h; hh++) {
            float *v = ref + (t * h + hh) * d;
            for (int j = 0; j < 16; j++) {
                int st = j < 4 ? 0 : j < 10 ? 1 : 2;
                double a = (double)((float)pos[st * n + t] * inv[j]), cs = cos(a), sn = sin(a);
                double x0 = v[j], x1 = v[j + 16];
                v[j] = (float)(x0 * cs - x1 * sn);
                v[j + 16] = (float)(x1 * cs + x0 * sn);
            }
        }
    assert_true(max_abs_diff(q, ref, (size_t)(n * h * d)) < 2e-5f);
    /* equal streams reduce to plain RoPE, bitwise */
    int32_t same[3 * 5], one[5] = {3, 1, 4, 1, 5};
    for (int s = 0; s < 3; s++)
        memcpy(same + s * n, one, sizeof one);
    float *a = rand_buf((size_t)(n * h * d)), *b = ms_malloc(sizeof(float) * (size_t)(n * h * d));
    memcpy(b, a, sizeof(float) * (size_t)(n * h * d));
    ms_tensor ta = ms_tensor_3d(a, MS_DTYPE_F32, n, h, d), tb = ms_tensor_3d(b, MS_DTYPE_F32, n, h, d);
    ms_tensor ts = ms_tensor_2d(same, MS_DTYPE_I32, 3, n), t1 = ms_tensor_1d(one, MS_DTYPE_I32, n);
    assert_int_equal(be.iface.rope(be.ctx, &ta, NULL, &ts, &mt, &err), MS_OK);
    ms_rope_table plain = mt;
    plain.n_sections = 0;
    assert_int_equal(be.iface.rope(be.ctx, &tb, NULL, &t1, &plain, &err), MS_OK);
    assert_memory_equal(a, b, sizeof(float) * (size_t)(n * h * d));
    /* bad tables and position shapes */
    assert_int_equal(be.iface.rope(be.ctx, &ta, NULL, &t1, &mt, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "rope: pos [5] must be [n_sections, 5]"));
    mt.sections[2] = 5;
    assert_int_equal(be.iface.rope(be.ctx, &ta, NULL, &tp, &mt, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "sections sum to 15 pairs"));
    ms_free(q), ms_free(ref), ms_free(a), ms_free(b);
    ms_backend_free(&be);
}

/* ---- paged KV write + attention ---- */

/* One random ragged scenario: per sequence, present tokens [start, start + len), the last q_len
 * of them new this step; K/V kept contiguously for the reference. */
typedef struct scen {
    int n_seqs, hq, hkv, d, ps, n_layers, layer;
    int len[8], q_len[8], start[8];
    float *kc[8], *vc[8];   /* [len, hkv, d] per sequence */
    ms_paged_kv kv;
    int32_t qo[9], kvp[9], last[8], kst[8];
    int32_t idx[512], t2p[512], t2s[512];
    ms_kv_view views[8];
    ms_kv_plan plan;
    int n_tokens;
} scen;

static void scen_build(scen *s, ms_backend *be, ms_dtype kv_dtype) {
    ms_error err = {0};
    int n_pages_total = 1;
    for (int i = 0; i < s->n_seqs; i++)
        n_pages_total += (s->len[i] + s->ps - 1) / s->ps + 1;
    s->kv = (ms_paged_kv){NULL, kv_dtype, s->n_layers, n_pages_total + 3, s->ps, s->hkv, s->d};
    assert_int_equal(be->iface.buffer_alloc(be->ctx, ms_paged_kv_bytes(&s->kv), "kv", &s->kv.data, &err),
                     MS_OK);
    /* poison: NaN everywhere, so a read outside the view shows */
    float *pf = s->kv.data;
    if (kv_dtype == MS_DTYPE_F32)
        for (size_t i = 0; i < ms_paged_kv_bytes(&s->kv) / 4; i++)
            pf[i] = NAN;
    else
        memset(s->kv.data, 0xff, ms_paged_kv_bytes(&s->kv));
    /* shuffled page ids, skipping the sink page */
    int n_avail = s->kv.n_pages - 1;
    int32_t perm[600];
    for (int i = 0; i < n_avail; i++)
        perm[i] = i + 1;
    for (int i = n_avail - 1; i > 0; i--) {
        int j = (int)((frand() + 1.0f) * 0.5f * (float)(i + 1)) % (i + 1);
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int used = 0, tok = 0;
    s->qo[0] = s->kvp[0] = 0;
    for (int i = 0; i < s->n_seqs; i++) {
        int np = (s->len[i] + s->ps - 1) / s->ps;
        for (int p = 0; p < np; p++)
            s->idx[s->kvp[i] + p] = perm[used++];
        s->kvp[i + 1] = s->kvp[i] + np;
        s->qo[i + 1] = s->qo[i] + s->q_len[i];
        s->last[i] = np ? s->len[i] - (np - 1) * s->ps : 0;
        s->kst[i] = s->start[i];
        size_t sz = (size_t)(s->len[i] > 0 ? s->len[i] : 1) * (size_t)(s->hkv * s->d);
        s->kc[i] = rand_buf(sz);
        s->vc[i] = rand_buf(sz);
        /* the stored (old) tokens go straight into their pages, converted to the arena dtype */
        for (int k = 0; k < s->len[i]; k++) {
            int page = s->idx[s->kvp[i] + k / s->ps], slot = k % s->ps;
            bool is_new = k >= s->len[i] - s->q_len[i];
            if (is_new) {
                s->t2p[tok] = page;
                s->t2s[tok] = slot;
                tok++;
            }
            for (int kvi = 0; kvi < 2; kvi++) {
                float *src = (kvi ? s->vc[i] : s->kc[i]) + (size_t)k * (size_t)(s->hkv * s->d);
                if (kv_dtype == MS_DTYPE_BF16)
                    for (int e = 0; e < s->hkv * s->d; e++)
                        src[e] = ms_bf16_to_f32(ms_f32_to_bf16(src[e]));
                if (is_new)
                    continue;
                int64_t off = ms_paged_kv_offset(&s->kv, s->layer, page, kvi, slot, 0);
                for (int e = 0; e < s->hkv * s->d; e++) {
                    if (kv_dtype == MS_DTYPE_F32)
                        pf[off + e] = src[e];
                    else
                        ((uint16_t *)s->kv.data)[off + e] = ms_f32_to_bf16(src[e]);
                }
            }
        }
        s->views[i] = (ms_kv_view){(ms_rid)i, 0, s->idx + s->kvp[i], np, s->start[i], s->len[i],
                                   s->q_len[i], 0};
    }
    s->n_tokens = tok;
    s->plan = (ms_kv_plan){0, s->n_seqs, s->views, tok, s->qo, s->kvp, s->idx, s->last, s->kst,
                           s->t2p, s->t2s, false};
}

static void scen_free(scen *s, ms_backend *be) {
    for (int i = 0; i < s->n_seqs; i++)
        ms_free(s->kc[i]), ms_free(s->vc[i]);
    be->iface.buffer_free(be->ctx, s->kv.data);
}

/* Naive attention for query token t of sequence i (double softmax over the visible keys). */
static void ref_attention(const scen *s, const float *q, float *out, float scale, int window,
                          bool causal) {
    int t = 0;
    for (int i = 0; i < s->n_seqs; i++) {
        for (int j = 0; j < s->q_len[i]; j++, t++) {
            int P = s->start[i] + s->len[i] - s->q_len[i] + j;
            for (int h = 0; h < s->hq; h++) {
                int g = h / (s->hq / s->hkv);
                const float *qh = q + ((size_t)t * (size_t)s->hq + (size_t)h) * (size_t)s->d;
                double sc[600], mx = -INFINITY, sum = 0.0;
                for (int k = 0; k < s->len[i]; k++) {
                    int pk = s->start[i] + k;
                    bool vis = (!causal || pk <= P) && (window == 0 || pk > P - window);
                    sc[k] = -INFINITY;
                    if (!vis)
                        continue;
                    double dd = 0.0;
                    const float *kr = s->kc[i] + ((size_t)k * (size_t)s->hkv + (size_t)g) * (size_t)s->d;
                    for (int e = 0; e < s->d; e++)
                        dd += (double)qh[e] * kr[e];
                    sc[k] = dd * scale;
                    if (sc[k] > mx)
                        mx = sc[k];
                }
                float *o = out + ((size_t)t * (size_t)s->hq + (size_t)h) * (size_t)s->d;
                for (int e = 0; e < s->d; e++)
                    o[e] = 0.0f;
                if (mx == -INFINITY)
                    continue;
                for (int k = 0; k < s->len[i]; k++)
                    sum += sc[k] == -INFINITY ? 0.0 : exp(sc[k] - mx);
                for (int e = 0; e < s->d; e++) {
                    double acc = 0.0;
                    for (int k = 0; k < s->len[i]; k++)
                        if (sc[k] != -INFINITY)
                            acc += exp(sc[k] - mx) / sum *
                                   s->vc[i][((size_t)k * (size_t)s->hkv + (size_t)g) * (size_t)s->d + (size_t)e];
                    o[e] = (float)acc;
                }
            }
        }
    }
}

/* kv_write the new tokens, run attention, compare with the reference. Returns max abs error. */
static float scen_run(scen *s, ms_backend *be, int window, bool causal, float *out_keep) {
    ms_error err = {0};
    ms_attn_limits lim = {8, 512, 512};
    ms_attn_batch *b;
    assert_int_equal(be->iface.attn_batch_init(be->ctx, &lim, &b, &err), MS_OK);
    assert_int_equal(be->iface.attn_batch_stage(be->ctx, b, &s->plan, &s->kv, &err), MS_OK);
    assert_int_equal(b->n_tokens, s->n_tokens);
    assert_int_equal(b->token_to_page[s->n_tokens], MS_SINK_PAGE);
    int n = s->n_tokens;
    size_t nk = (size_t)n * (size_t)(s->hkv * s->d), nq = (size_t)n * (size_t)(s->hq * s->d);
    float *k = ms_malloc(sizeof(float) * (nk ? nk : 1)), *v = ms_malloc(sizeof(float) * (nk ? nk : 1));
    int t = 0;
    for (int i = 0; i < s->n_seqs; i++)
        for (int j = 0; j < s->q_len[i]; j++, t++) {
            size_t src = (size_t)(s->len[i] - s->q_len[i] + j) * (size_t)(s->hkv * s->d);
            memcpy(k + (size_t)t * (size_t)(s->hkv * s->d), s->kc[i] + src, sizeof(float) * (size_t)(s->hkv * s->d));
            memcpy(v + (size_t)t * (size_t)(s->hkv * s->d), s->vc[i] + src, sizeof(float) * (size_t)(s->hkv * s->d));
        }
    ms_tensor tk = ms_tensor_3d(k, MS_DTYPE_F32, n, s->hkv, s->d);
    ms_tensor tv = ms_tensor_3d(v, MS_DTYPE_F32, n, s->hkv, s->d);
    assert_int_equal(be->iface.kv_write(be->ctx, &s->kv, s->layer, &tk, &tv, b, &err), MS_OK);
    float *q = rand_buf(nq), *out = rand_buf(nq), *ref = rand_buf(nq);
    ms_tensor tq = ms_tensor_3d(q, MS_DTYPE_F32, n, s->hq, s->d);
    ms_tensor to = ms_tensor_3d(out, MS_DTYPE_F32, n, s->hq, s->d);
    float scale = 1.0f / sqrtf((float)s->d);
    ms_attn_params p = {scale, window, causal};
    assert_int_equal(be->iface.attention(be->ctx, &tq, &s->kv, s->layer, b, &p, &to, &err), MS_OK);
    ref_attention(s, q, ref, scale, window, causal);
    float md = max_abs_diff(out, ref, nq);
    if (out_keep)
        memcpy(out_keep, out, sizeof(float) * nq);
    ms_free(k), ms_free(v), ms_free(q), ms_free(out), ms_free(ref);
    be->iface.attn_batch_free(be->ctx, b);
    return md;
}

static void test_paged_attention_matches_reference(void **state) {
    (void)state;
    ms_backend be = make_cpu(3);
    int gqa[3] = {1, 4, 8}, dims[3] = {16, 64, 128}, pss[3] = {1, 4, 16};
    int windows[3] = {0, 8, 3};
    int n_cases = 0;
    for (int gi = 0; gi < 3; gi++)
        for (int di = 0; di < 3; di++) {
            int ci = gi * 3 + di;
            scen s;
            memset(&s, 0, sizeof s);
            s.hkv = 2, s.hq = 2 * gqa[gi], s.d = dims[di], s.ps = pss[(gi + di) % 3];
            s.n_layers = 2, s.layer = ci % 2;
            /* ragged prefill (with a continuation chunk and a retained window) */
            s.n_seqs = 4;
            int lens[4] = {37, 5, 64, 1}, qs[4] = {37, 5, 20, 1};
            for (int i = 0; i < 4; i++)
                s.len[i] = lens[i], s.q_len[i] = qs[i];
            /* sequence 2 lost its first pages to retention */
            s.start[2] = s.ps * (3 / s.ps + 1);
            scen_build(&s, &be, MS_DTYPE_F32);
            for (int c = 0; c < 2; c++) {
                int window = c ? windows[ci % 3] : 0;
                float md = scen_run(&s, &be, window, true, NULL);
                if (md > 1e-5f)
                    fail_msg("prefill gqa %d d %d ps %d window %d: max abs diff %g", gqa[gi],
                             dims[di], s.ps, window, (double)md);
                n_cases++;
            }
            scen_free(&s, &be);
            /* decode: one token per sequence, one sequence with kv_start > 0 */
            memset(&s, 0, sizeof s);
            s.hkv = 2, s.hq = 2 * gqa[gi], s.d = dims[di], s.ps = pss[(gi + di + 1) % 3];
            s.n_layers = 1, s.n_seqs = 3;
            int dl[3] = {1, 17, 33};
            for (int i = 0; i < 3; i++)
                s.len[i] = dl[i], s.q_len[i] = 1;
            s.start[2] = s.ps * 2;
            scen_build(&s, &be, MS_DTYPE_F32);
            float md = scen_run(&s, &be, windows[ci % 3], true, NULL);
            if (md > 1e-5f)
                fail_msg("decode gqa %d d %d: max abs diff %g", gqa[gi], dims[di], (double)md);
            scen_free(&s, &be);
            n_cases++;
        }
    assert_int_equal(n_cases, 27);
    ms_backend_free(&be);
}

static void test_attention_non_causal_bf16_kv_and_equal_scores(void **state) {
    (void)state;
    ms_backend be = make_cpu(2);
    scen s;
    memset(&s, 0, sizeof s);
    s.hkv = 2, s.hq = 8, s.d = 64, s.ps = 16, s.n_layers = 1, s.n_seqs = 2;
    s.len[0] = 20, s.q_len[0] = 4, s.len[1] = 3, s.q_len[1] = 3;
    scen_build(&s, &be, MS_DTYPE_BF16);
    assert_true(scen_run(&s, &be, 0, false, NULL) < 1e-5f);
    assert_true(scen_run(&s, &be, 0, true, NULL) < 1e-5f);
    scen_free(&s, &be);
    /* known answer: q = 0 gives equal scores, so the output is the mean of the visible V rows */
    ms_error err = {0};
    memset(&s, 0, sizeof s);
    s.hkv = 1, s.hq = 1, s.d = 16, s.ps = 4, s.n_layers = 1, s.n_seqs = 1;
    s.len[0] = 10, s.q_len[0] = 10;
    scen_build(&s, &be, MS_DTYPE_F32);
    ms_attn_limits lim = {8, 512, 512};
    ms_attn_batch *b;
    assert_int_equal(be.iface.attn_batch_init(be.ctx, &lim, &b, &err), MS_OK);
    assert_int_equal(be.iface.attn_batch_stage(be.ctx, b, &s.plan, &s.kv, &err), MS_OK);
    ms_tensor tk = ms_tensor_3d(s.kc[0], MS_DTYPE_F32, 10, 1, 16);
    ms_tensor tv = ms_tensor_3d(s.vc[0], MS_DTYPE_F32, 10, 1, 16);
    assert_int_equal(be.iface.kv_write(be.ctx, &s.kv, 0, &tk, &tv, b, &err), MS_OK);
    float q[10 * 16] = {0}, out[10 * 16];
    ms_tensor tq = ms_tensor_3d(q, MS_DTYPE_F32, 10, 1, 16), to = ms_tensor_3d(out, MS_DTYPE_F32, 10, 1, 16);
    ms_attn_params p = {0.25f, 3, true};
    assert_int_equal(be.iface.attention(be.ctx, &tq, &s.kv, 0, b, &p, &to, &err), MS_OK);
    for (int t = 0; t < 10; t++)
        for (int e = 0; e < 16; e++) {
            double m = 0.0;
            int lo = t - 2 < 0 ? 0 : t - 2;
            for (int k = lo; k <= t; k++)
                m += s.vc[0][k * 16 + e];
            assert_true(fabs(out[t * 16 + e] - m / (t - lo + 1)) < 1e-6);
        }
    be.iface.attn_batch_free(be.ctx, b);
    scen_free(&s, &be);
    ms_backend_free(&be);
}

static void test_cross_attention_read_only_plan(void **state) {
    (void)state;
    ms_backend be = make_cpu(2);
    ms_error err = {0};
    /* write two context streams (10 and 3 tokens) with an ordinary plan */
    scen s;
    memset(&s, 0, sizeof s);
    s.hkv = 2, s.hq = 4, s.d = 16, s.ps = 4, s.n_layers = 1, s.n_seqs = 2;
    s.len[0] = 10, s.q_len[0] = 10, s.len[1] = 3, s.q_len[1] = 3;
    scen_build(&s, &be, MS_DTYPE_F32);
    ms_attn_limits lim = {4, 64, 64};
    ms_attn_batch *wb, *qb;
    assert_int_equal(be.iface.attn_batch_init(be.ctx, &lim, &wb, &err), MS_OK);
    assert_int_equal(be.iface.attn_batch_init(be.ctx, &lim, &qb, &err), MS_OK);
    assert_int_equal(be.iface.attn_batch_stage(be.ctx, wb, &s.plan, &s.kv, &err), MS_OK);
    float k[13 * 32], v[13 * 32];
    memcpy(k, s.kc[0], sizeof(float) * 10 * 32), memcpy(k + 10 * 32, s.kc[1], sizeof(float) * 3 * 32);
    memcpy(v, s.vc[0], sizeof(float) * 10 * 32), memcpy(v + 10 * 32, s.vc[1], sizeof(float) * 3 * 32);
    ms_tensor tk = ms_tensor_3d(k, MS_DTYPE_F32, 13, 2, 16), tv = ms_tensor_3d(v, MS_DTYPE_F32, 13, 2, 16);
    assert_int_equal(be.iface.kv_write(be.ctx, &s.kv, 0, &tk, &tv, wb, &err), MS_OK);
    /* read-only plan: 2 query rows over context 0, 7 rows (more than its 3 tokens) over context 1 */
    int32_t qo[3] = {0, 2, 9};
    ms_kv_plan cp = {0, 2, NULL, 9, qo, s.kvp, s.idx, s.last, NULL, NULL, NULL, false};
    assert_int_equal(be.iface.attn_batch_stage(be.ctx, qb, &cp, &s.kv, &err), MS_OK);
    assert_int_equal(qb->token_to_page[0], MS_SINK_PAGE);
    assert_int_equal(qb->last_token[1], 8);
    float *q = rand_buf(9 * 64), out[9 * 64];
    ms_tensor tq = ms_tensor_3d(q, MS_DTYPE_F32, 9, 4, 16), to = ms_tensor_3d(out, MS_DTYPE_F32, 9, 4, 16);
    ms_attn_params p = {0.25f, 0, false};
    assert_int_equal(be.iface.attention(be.ctx, &tq, &s.kv, 0, qb, &p, &to, &err), MS_OK);
    for (int t = 0; t < 9; t++) {
        int i = t < 2 ? 0 : 1;
        for (int h = 0; h < 4; h++) {
            int g = h / 2;
            double sc[10], mx = -INFINITY, sum = 0.0;
            for (int kk = 0; kk < s.len[i]; kk++) {
                double dd = 0.0;
                for (int e = 0; e < 16; e++)
                    dd += (double)q[(t * 4 + h) * 16 + e] * s.kc[i][(kk * 2 + g) * 16 + e];
                sc[kk] = dd * 0.25;
                mx = fmax(mx, sc[kk]);
            }
            for (int kk = 0; kk < s.len[i]; kk++)
                sum += exp(sc[kk] - mx);
            for (int e = 0; e < 16; e++) {
                double acc = 0.0;
                for (int kk = 0; kk < s.len[i]; kk++)
                    acc += exp(sc[kk] - mx) / sum * s.vc[i][(kk * 2 + g) * 16 + e];
                assert_true(fabs(out[(t * 4 + h) * 16 + e] - acc) < 1e-5);
            }
        }
    }
    /* monotonic indptr is checked before any page is read */
    int32_t bad_kvp[3] = {0, 100, 4};
    cp.kv_indptr = bad_kvp;
    assert_int_equal(be.iface.attn_batch_stage(be.ctx, qb, &cp, &s.kv, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "view 1: indptr decreases"));
    ms_free(q);
    be.iface.attn_batch_free(be.ctx, wb);
    be.iface.attn_batch_free(be.ctx, qb);
    scen_free(&s, &be);
    ms_backend_free(&be);
}

static void test_attention_and_linear_independent_of_threads(void **state) {
    (void)state;
    size_t nq = 0;
    float *outs[2] = {NULL, NULL};
    float *lin[2] = {NULL, NULL};
    int threads[2] = {1, 4};
    for (int r = 0; r < 2; r++) {
        ms_backend be = make_cpu(threads[r]);
        rng_state = 99;
        scen s;
        memset(&s, 0, sizeof s);
        s.hkv = 2, s.hq = 8, s.d = 64, s.ps = 4, s.n_layers = 1, s.n_seqs = 3;
        s.len[0] = 40, s.q_len[0] = 40, s.len[1] = 9, s.q_len[1] = 1, s.len[2] = 30, s.q_len[2] = 7;
        scen_build(&s, &be, MS_DTYPE_F32);
        nq = (size_t)s.n_tokens * 8 * 64;
        outs[r] = ms_malloc(nq * sizeof(float));
        assert_true(scen_run(&s, &be, 5, true, outs[r]) < 1e-5f);
        scen_free(&s, &be);
        int n = 13, in = 200, out = 300;
        float *x = rand_buf((size_t)(n * in)), *w = rand_buf((size_t)(out * in));
        lin[r] = ms_malloc(sizeof(float) * (size_t)(n * out));
        ms_tensor tx = ms_tensor_2d(x, MS_DTYPE_F32, n, in), tw = ms_tensor_2d(w, MS_DTYPE_F32, out, in);
        ms_tensor ty = ms_tensor_2d(lin[r], MS_DTYPE_F32, n, out);
        ms_error err = {0};
        assert_int_equal(be.iface.linear(be.ctx, &tx, &tw, NULL, &ty, &err), MS_OK);
        ms_free(x), ms_free(w);
        ms_backend_free(&be);
    }
    assert_memory_equal(outs[0], outs[1], nq * sizeof(float));
    assert_memory_equal(lin[0], lin[1], 13 * 300 * sizeof(float));
    ms_free(outs[0]), ms_free(outs[1]), ms_free(lin[0]), ms_free(lin[1]);
}

static void test_attn_batch_stage_rejects_bad_plans(void **state) {
    (void)state;
    ms_backend be = make_cpu(1);
    ms_error err = {0};
    scen s;
    memset(&s, 0, sizeof s);
    s.hkv = 1, s.hq = 2, s.d = 16, s.ps = 4, s.n_layers = 1, s.n_seqs = 2;
    s.len[0] = 9, s.q_len[0] = 2, s.len[1] = 4, s.q_len[1] = 4;
    scen_build(&s, &be, MS_DTYPE_F32);
    ms_attn_limits lim = {2, 6, 4};
    ms_attn_batch *b;
    assert_int_equal(be.iface.attn_batch_init(be.ctx, &lim, &b, &err), MS_OK);
    assert_int_equal(be.iface.attn_batch_stage(be.ctx, b, &s.plan, &s.kv, &err), MS_OK);
    assert_int_equal(b->max_kv_len, 9);
    assert_int_equal(b->max_q_len, 4);
    assert_false(b->is_decode);
    assert_int_equal(b->last_token[0], 1);
    assert_int_equal(b->last_token[1], 5);
    int32_t saved = s.idx[1];
    s.idx[1] = s.kv.n_pages;
    assert_int_equal(be.iface.attn_batch_stage(be.ctx, b, &s.plan, &s.kv, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "view 0: page id"));
    s.idx[1] = saved;
    s.last[1] = 5;
    assert_int_equal(be.iface.attn_batch_stage(be.ctx, b, &s.plan, &s.kv, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "view 1: kv_last_page_len 5"));
    s.last[1] = 4;
    s.t2s[0] = 4;
    assert_int_equal(be.iface.attn_batch_stage(be.ctx, b, &s.plan, &s.kv, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "token 0: write slot 4"));
    s.t2s[0] = 0;
    ms_attn_limits small = {2, 5, 4};
    ms_attn_batch *b2;
    assert_int_equal(be.iface.attn_batch_init(be.ctx, &small, &b2, &err), MS_OK);
    assert_int_equal(be.iface.attn_batch_stage(be.ctx, b2, &s.plan, &s.kv, &err), MS_ERR_CAPACITY);
    assert_non_null(strstr(err.msg, "max_tokens = 5"));
    be.iface.attn_batch_free(be.ctx, b2);
    be.iface.attn_batch_free(be.ctx, b);
    assert_int_equal(be.iface.attn_batch_init(be.ctx, &(ms_attn_limits){0, 1, 1}, &b, &err),
                     MS_ERR_INVALID_ARG);
    scen_free(&s, &be);
    ms_backend_free(&be);
}

static void test_cpu_init_failures_leak_nothing(void **state) {
    (void)state;
    ms_error err = {0};
    ms_backend be;
    for (int64_t k = 1; k <= 8; k++) {
        ms_alloc_fail_nth(k);
        ms_status st = ms_backend_cpu_init(&be, &(ms_backend_cpu_options){3}, &err);
        ms_alloc_fail_nth(0);
        if (st == MS_OK) {
            ms_backend_free(&be);
            continue;
        }
        assert_int_equal(st, MS_ERR_OOM);
        assert_null(be.ctx);
    }
    assert_int_equal(ms_backend_cpu_init(&be, &(ms_backend_cpu_options){-1}, &err), MS_ERR_INVALID_ARG);
    /* allocation failures inside the backend name what failed and leak nothing */
    assert_int_equal(ms_backend_cpu_init(&be, &(ms_backend_cpu_options){2}, &err), MS_OK);
    void *p = NULL;
    ms_alloc_fail_nth(1);
    assert_int_equal(be.iface.buffer_alloc(be.ctx, 4096, "kv.arena", &p, &err), MS_ERR_OOM);
    assert_null(p);
    assert_non_null(strstr(err.msg, "buffer_alloc: kv.arena: out of host memory (4096 bytes)"));
    assert_int_equal(be.iface.buffer_alloc(be.ctx, 0, "w", &p, &err), MS_ERR_INVALID_ARG);
    ms_attn_batch *b = NULL;
    for (int64_t k = 1; k <= 2; k++) {
        ms_alloc_fail_nth(k);
        assert_int_equal(be.iface.attn_batch_init(be.ctx, &(ms_attn_limits){4, 64, 64}, &b, &err),
                         MS_ERR_OOM);
        assert_null(b);
    }
    ms_alloc_fail_nth(0);
    ms_backend_free(&be);
    ms_backend_free(&be); /* a freed (zeroed) backend is a no-op */
}

static void test_linear_is_batch_invariant(void **state) {
    (void)state;
    /* a token's output is bitwise the same alone, in an even batch, or as the odd last token,
     * for every weight dtype and for row counts that leave partial row blocks */
    ms_backend be = make_cpu(2);
    ms_error err = {0};
    int n = 7, in = 45, out = 23;
    float *x = rand_buf((size_t)(n * in)), *w = rand_buf((size_t)(out * in));
    float *b = rand_buf((size_t)out);
    uint16_t *w16 = ms_malloc(sizeof(uint16_t) * (size_t)(out * in));
    float *all = ms_malloc(sizeof(float) * (size_t)(n * out)), one[23];
    for (ms_dtype dt = MS_DTYPE_F32; dt <= MS_DTYPE_F16; dt++) {
        for (int i = 0; i < out * in; i++)
            w16[i] = dt == MS_DTYPE_BF16 ? ms_f32_to_bf16(w[i]) : ms_f32_to_f16(w[i]);
        ms_tensor tw = ms_tensor_2d(dt == MS_DTYPE_F32 ? (void *)w : (void *)w16, dt, out, in);
        ms_tensor tb = ms_tensor_1d(b, MS_DTYPE_F32, out);
        ms_tensor tx = ms_tensor_2d(x, MS_DTYPE_F32, n, in), ty = ms_tensor_2d(all, MS_DTYPE_F32, n, out);
        assert_int_equal(be.iface.linear(be.ctx, &tx, &tw, &tb, &ty, &err), MS_OK);
        for (int t = 0; t < n; t++) {
            ms_tensor x1 = ms_tensor_2d(x + t * in, MS_DTYPE_F32, 1, in);
            ms_tensor y1 = ms_tensor_2d(one, MS_DTYPE_F32, 1, out);
            assert_int_equal(be.iface.linear(be.ctx, &x1, &tw, &tb, &y1, &err), MS_OK);
            assert_memory_equal(one, all + t * out, sizeof one);
        }
    }
    ms_free(x), ms_free(w), ms_free(b), ms_free(w16), ms_free(all);
    ms_backend_free(&be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_dtype_conversions_round_trip),
        ms_unit_test(test_tensor_views),
        ms_unit_test(test_linear_matches_reference_all_weight_dtypes),
        ms_unit_test(test_linear_is_batch_invariant),
        ms_unit_test(test_rms_norm_rows_heads_and_fused_add),
        ms_unit_test(test_silu_mul_add_embedding_gather),
        ms_unit_test(test_argmax_lowest_index_on_ties),
        ms_unit_test(test_encoder_ops_layer_norm_gelu_conv1d),
        ms_unit_test(test_tensor_load_converts_and_reads_unaligned),
        ms_unit_test(test_rope_inv_freq_default_and_llama3),
        ms_unit_test(test_rope_config_from_hf_params),
        ms_unit_test(test_rope_styles_partial_and_position_zero),
        ms_unit_test(test_mrope_sections),
        ms_unit_test(test_paged_attention_matches_reference),
        ms_unit_test(test_attention_non_causal_bf16_kv_and_equal_scores),
        ms_unit_test(test_cross_attention_read_only_plan),
        ms_unit_test(test_attention_and_linear_independent_of_threads),
        ms_unit_test(test_attn_batch_stage_rejects_bad_plans),
        ms_unit_test(test_cpu_init_failures_leak_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
