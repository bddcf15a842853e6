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

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_dtype_conversions_round_trip),
        ms_unit_test(test_tensor_views),
        ms_unit_test(test_linear_matches_reference_all_weight_dtypes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
