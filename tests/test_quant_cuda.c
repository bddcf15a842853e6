/*
 * test_quant_cuda.c - quantized weights on the GPU (backend_cuda_quant.h) against the CPU
 * reference (GPU_TESTS: `make gpu-test`; needs a GPU).
 *
 * For each type kept quantized (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K): fresh random weights
 * [301, 1024] (Q4_0 / Q8_0 / Q4_K through ggml's reference quantizers, the others as random blocks
 * with small random f16 scales; seed printed, MS_TEST_SEED repeats), dequantized on the CPU by
 * ms_ggml_dequantize (bit-exact with ggml). Checks:
 *   - ms_cuda_quant_dequant_bf16 of every row: the bf16 bits of the CPU's float32 values, exactly;
 *   - linear for x rows 1..8 (the exact-width GEMV entries; 5 with padded x and y strides) and
 *     9, 13 (padded), 32 (GEMV launches per 8 rows, up to MS_CUDA_QGEMV_MAX_ROWS):
 *     |y - ref| <= (in + 2) eps32 sum_i |x_i w_i| (the worst-case bound of fp32 accumulation in any
 *     order, ref in double; the types with a min, Q4_1/Q4_K/Q5_K, sum d sum(q x) and m sum(x)
 *     apart as ggml's dot products do, bounded by |d q| + |m| rather than |w|: random weights stay
 *     orders of magnitude inside the bound, about 2e-8 against 1.2e-4);
 *   - linear for 33 and 64 rows (bf16 dequantization + cuBLAS): x and W rounded to bf16 add
 *     2^-7 sum |x_i w_i|;
 *   - the 32-value types again at in = 1120 (the GEMV's 512-value chunks: the last one partial;
 *     rows only 2-byte aligned: the GEMV's 16-bit loads);
 *   - every type at in = 4096, 14336 and 5120 (the 8B model's widths; rows 16-byte aligned but
 *     Q6_K's at 5120, and Q6_K's at 1024);
 *   - Q4_0, Q8_0 and Q4_K's GEMV entries for up to MS_QGEMV_I8_MAX_COLS x rows run on int8 x
 *     (quantized per 32 values like ggml-cuda's q8_1, in the kernel), and so do their entries
 *     above (x quantized once per launch by ms_qquant_x, MS_QGEMV_PREQ_TYPE): their reference takes
 *     the same quantized x, within the same fp32 bound, and y must be 20 times closer to it in sum
 *     than the quantized reference is to the unquantized one;
 *   - a NaN in one x row makes that row's y NaN and leaves the others' bits alone, at every width
 *     of the integer GEMVs (test_integer_gemv_nan);
 *   - a graph replay after the workspace grew (test_graph_survives_workspace_growth);
 *   - bad arguments: an unsupported type names itself, a width that is not a multiple of the block.
 * Weights go up in ggml's layout and are kept planar (ms_cuda_qweight_upload_rows), so every check
 * covers the conversion too.
 */
#include "ms_test.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../templates/quant/qparams.h"
#include "backend_cuda_quant.h"
#include "cuda_ops.h"
#include "gguf_quant.h"
#include "safetensors.h"

#include "ms_test_impl.h"

#define ROWS 301
/* input features: 1024, then 1120 for the 32-value types (a last 256-value GEMV chunk of 96) */
static int g_in = 1024;
#define IN g_in

static uint64_t g_rng;
static cudaStream_t g_stream;
static cublasHandle_t g_cublas;
static int g_arch;

static uint64_t next_u64(void) {
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float frand(void) {
    return (float)((double)(next_u64() >> 11) * 0x1p-53 * 2.0 - 1.0);
}

#define OK(expr)                                                                                  \
    do {                                                                                          \
        if ((expr) != MS_OK)                                                                      \
            fail_msg("%s: %s", #expr, err.msg);                                                   \
    } while (0)
#define CU(expr) assert_int_equal((int)(expr), (int)cudaSuccess)

static int setup(void **state) {
    (void)state;
    const char *s = getenv("MS_TEST_SEED");
    g_rng = s != NULL ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("seed %llu (MS_TEST_SEED repeats)\n", (unsigned long long)g_rng);
    ms_error err = {0};
    int sms;
    if (ms_cuda_device_arch(0, &g_arch, &sms, &err) != MS_OK) {
        printf("no GPU: %s\n", err.msg);
        return -1;
    }
    if (cudaSetDevice(0) != cudaSuccess || cudaStreamCreate(&g_stream) != cudaSuccess ||
        cublasCreate(&g_cublas) != CUBLAS_STATUS_SUCCESS || cublasSetStream(g_cublas, g_stream) != CUBLAS_STATUS_SUCCESS)
        return -1;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    cublasDestroy(g_cublas);
    cudaStreamDestroy(g_stream);
    return 0;
}

static void put_f16(uint8_t *p, float v) {
    uint16_t h = ms_f32_to_f16(v);
    p[0] = (uint8_t)(h & 0xff);
    p[1] = (uint8_t)(h >> 8);
}

/* Random host blocks of `type` for W [ROWS, IN]. */
static uint8_t *random_blocks(uint32_t type, size_t bytes) {
    uint8_t *b = malloc(bytes);
    assert_non_null(b);
    if (type == MS_GGML_TYPE_Q4_0 || type == MS_GGML_TYPE_Q8_0 || type == MS_GGML_TYPE_Q4_K) {
        float *f = malloc(sizeof(float) * ROWS * IN);
        assert_non_null(f);
        for (size_t i = 0; i < (size_t)ROWS * IN; i++)
            f[i] = frand() * 0.05f;
        assert_int_equal(ms_ggml_quantize(type, f, b, (size_t)ROWS * IN), MS_OK);
        free(f);
        return b;
    }
    for (size_t i = 0; i < bytes; i++)
        b[i] = (uint8_t)next_u64();
    size_t bb = ms_ggml_type_block_bytes(type);
    for (size_t o = 0; o < bytes; o += bb) {
        float d = 0.001f + 0.01f * fabsf(frand()), m = 0.01f * frand();
        switch (type) {
        case MS_GGML_TYPE_Q4_1:
            put_f16(b + o, d);
            put_f16(b + o + 2, m);
            break;
        case MS_GGML_TYPE_Q5_0:
            put_f16(b + o, d);
            break;
        case MS_GGML_TYPE_Q5_K:
            put_f16(b + o, d);
            put_f16(b + o + 2, fabsf(m));
            break;
        case MS_GGML_TYPE_Q6_K:
            put_f16(b + o + 208, d * 0.1f);
            break;
        default:
            fail_msg("no random blocks for %s", ms_ggml_type_name(type));
        }
    }
    return b;
}

/* y (device, [n, ROWS] at y_stride) against the double reference of x [n, IN] (x_stride) W^T. */
static void check_linear(ms_cuda_quant *q, const ms_cuda_qweight *w, const float *wf, int n, int x_stride,
                         int y_stride, bool prefill) {
    ms_error err = {0};
    float *x = malloc(sizeof(float) * (size_t)n * (size_t)x_stride), *y = malloc(sizeof(float) * (size_t)n * (size_t)y_stride);
    assert_true(x != NULL && y != NULL);
    for (size_t i = 0; i < (size_t)n * (size_t)x_stride; i++)
        x[i] = frand();
    float *dx, *dy;
    CU(cudaMalloc((void **)&dx, sizeof(float) * (size_t)n * (size_t)x_stride));
    CU(cudaMalloc((void **)&dy, sizeof(float) * (size_t)n * (size_t)y_stride));
    CU(cudaMemcpy(dx, x, sizeof(float) * (size_t)n * (size_t)x_stride, cudaMemcpyHostToDevice));
    CU(cudaMemset(dy, 0xff, sizeof(float) * (size_t)n * (size_t)y_stride)); /* NaN poison */
    OK(ms_cuda_quant_linear(q, dx, n, x_stride, w, dy, y_stride, false, &err));
    CU(cudaStreamSynchronize(g_stream));
    CU(cudaMemcpy(y, dy, sizeof(float) * (size_t)n * (size_t)y_stride, cudaMemcpyDeviceToHost));
    /* the integer GEMV (Q4_0, Q8_0, Q4_K in launches of up to MS_QGEMV_I8_MAX_COLS x rows)
     * multiplies the weights by x quantized per 32 values as it does it (dx = amax / 127,
     * q = rint(x 127 / amax), 0 below MS_QGEMV_I8_MIN_AMAX, in float32): the reference takes the
     * same x^ = dx q and the bound stays fp32's; and since that bound is wider than x's
     * quantization error itself, y must also sit far closer to the quantized reference than the
     * unquantized one (a kernel that skipped or misplaced the quantization would not) */
    const bool i8_type = !prefill && (w->type == MS_GGML_TYPE_Q4_0 || w->type == MS_GGML_TYPE_Q8_0 ||
                                      w->type == MS_GGML_TYPE_Q4_K);
    bool any_i8 = false;
    float *xr = malloc(sizeof(float) * (size_t)n * (size_t)IN);
    bool *row_i8 = calloc((size_t)n, sizeof *row_i8);
    assert_true(xr != NULL && row_i8 != NULL);
    for (int t = 0; t < n; t++) {
        /* row t's launch: the entry of its group of up to MS_QGEMV_MAX_COLS rows */
        const int width = n - t / MS_QGEMV_MAX_COLS * MS_QGEMV_MAX_COLS;
        const bool i8 = i8_type && (MS_QGEMV_PREQ_TYPE(w->type) ||
                                    (width < MS_QGEMV_MAX_COLS ? width : MS_QGEMV_MAX_COLS) <= MS_QGEMV_I8_MAX_COLS);
        any_i8 |= i8;
        row_i8[t] = i8;
        for (int b0 = 0; b0 < IN; b0 += 32) {
            const float *xb = x + (size_t)t * x_stride + b0;
            float am = 0.f;
            for (int i = 0; i < 32; i++)
                am = fmaxf(am, fabsf(xb[i]));
            const float qd = am / 127.0f, qid = am >= MS_QGEMV_I8_MIN_AMAX ? 127.0f / am : 0.f;
            for (int i = 0; i < 32; i++)
                xr[(size_t)t * IN + b0 + i] = i8 ? qd * (float)rint((double)xb[i] * (double)qid) : xb[i];
        }
    }
    double worst = 0, err_q = 0, gap_q = 0;
    for (int t = 0; t < n; t++)
        for (int r = 0; r < ROWS; r++) {
            double ref = 0, mag = 0, ref_x = 0;
            for (int i = 0; i < IN; i++) {
                double p = (double)xr[(size_t)t * IN + i] * (double)wf[(size_t)r * IN + i];
                ref += p;
                mag += fabs(p);
                ref_x += (double)x[(size_t)t * x_stride + i] * (double)wf[(size_t)r * IN + i];
            }
            double tol = ((IN + 2) * (double)FLT_EPSILON + (prefill ? 0x1p-7 : 0.0)) * mag + 1e-30;
            double got = y[(size_t)t * y_stride + r], e = fabs(got - ref);
            if (!(e <= tol))
                fail_msg("%s linear n=%d%s: y[%d, %d] = %.9g, reference %.9g (tolerance %.3g)",
                         ms_ggml_type_name(w->type), n, prefill ? " (prefill)" : "", t, r, got, ref, tol);
            worst = fmax(worst, e / (mag > 0 ? mag : 1));
            if (row_i8[t]) {
                err_q += e;
                gap_q += fabs(ref - ref_x);
            }
        }
    if (any_i8 && !(err_q <= 0.05 * gap_q))
        fail_msg("%s linear n=%d: the integer GEMV is %.3g from the quantized-x reference in sum, against %.3g "
                 "between that and the unquantized one", ms_ggml_type_name(w->type), n, err_q, gap_q);
    printf("  %s n=%-2d %-8s max |err| / sum|x w| = %.3g%s\n", ms_ggml_type_name(w->type), n,
           prefill ? "prefill" : (any_i8 ? "gemv-i8" : "gemv"), worst, "");
    if (any_i8)
        printf("    integer rows: sum |y - quantized-x ref| / sum |quantized - unquantized ref| = %.3g\n",
               gap_q > 0 ? err_q / gap_q : 0.0);
    /* acc (linear_add): the same linear again, added to y's values: y + y, bitwise from a GEMV
       (y's old value + the same sum), within an ulp through cuBLAS's beta = 1 */
    OK(ms_cuda_quant_linear(q, dx, n, x_stride, w, dy, y_stride, true, &err));
    CU(cudaStreamSynchronize(g_stream));
    float *y2 = malloc(sizeof(float) * (size_t)n * (size_t)y_stride);
    assert_non_null(y2);
    CU(cudaMemcpy(y2, dy, sizeof(float) * (size_t)n * (size_t)y_stride, cudaMemcpyDeviceToHost));
    for (int t = 0; t < n; t++)
        for (int r = 0; r < ROWS; r++) {
            const float a = y[(size_t)t * y_stride + r], b = y2[(size_t)t * y_stride + r];
            if (prefill ? !(fabsf(b - 2.f * a) <= 2.5e-7f * fabsf(2.f * a) + 1e-30f) : b != a + a)
                fail_msg("%s linear n=%d%s, acc: y[%d, %d] = %.9g, want %.9g (y + y)",
                         ms_ggml_type_name(w->type), n, prefill ? " (prefill)" : "", t, r, b, a + a);
        }
    free(y2);
    free(xr);
    free(row_i8);
    cudaFree(dx);
    cudaFree(dy);
    free(x);
    free(y);
}

static void check_type(ms_cuda_quant *q, uint32_t type) {
    ms_error err = {0};
    size_t bytes = ms_cuda_qweight_bytes(type, ROWS, IN);
    assert_true(bytes > 0);
    uint8_t *blocks = random_blocks(type, bytes);
    float *wf = malloc(sizeof(float) * ROWS * IN);
    assert_non_null(wf);
    assert_int_equal(ms_ggml_dequantize(type, blocks, wf, (size_t)ROWS * IN), MS_OK);
    ms_cuda_qweight w;
    OK(ms_cuda_qweight_init(&w, type, ROWS, IN, &err));
    OK(ms_cuda_quant_load_type(q, type, &err));
    /* two uploads of row ranges (as fused parts load) */
    OK(ms_cuda_qweight_upload_rows(&w, 0, 100, blocks, &err));
    OK(ms_cuda_qweight_upload_rows(&w, 100, ROWS - 100, blocks + 100 * w.row_bytes, &err));
    /* dequantization: bit-exact bf16 of the CPU values */
    uint16_t *d16;
    uint16_t *h16 = malloc(sizeof(uint16_t) * ROWS * IN);
    assert_non_null(h16);
    CU(cudaMalloc((void **)&d16, sizeof(uint16_t) * ROWS * IN));
    OK(ms_cuda_quant_dequant_bf16(q, &w, 0, ROWS, d16, &err));
    CU(cudaStreamSynchronize(g_stream));
    CU(cudaMemcpy(h16, d16, sizeof(uint16_t) * ROWS * IN, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < (size_t)ROWS * IN; i++)
        if (h16[i] != ms_f32_to_bf16(wf[i]))
            fail_msg("%s dequant: element %zu (row %zu) is bf16 0x%04x, CPU %.9g -> 0x%04x", ms_ggml_type_name(type),
                     i, i / IN, h16[i], (double)wf[i], ms_f32_to_bf16(wf[i]));
    printf("%s: [%d, %d], %zu bytes on the device; dequantization bit-exact; GEMV loads from %s aligned rows\n",
           ms_ggml_type_name(type), ROWS, IN, bytes, ms_cuda_qweight_wide_rows(&w) ? "16-byte" : "2-byte");
    for (int n = 1; n <= 8; n++)
        check_linear(q, &w, wf, n, IN, ROWS, false);
    check_linear(q, &w, wf, 5, IN + 4, ROWS + 3, false); /* padded strides */
    /* GEMV launches per group of 8 rows up to MS_CUDA_QGEMV_MAX_ROWS, then dequantize + GEMM */
    check_linear(q, &w, wf, 9, IN, ROWS, 9 > MS_CUDA_QGEMV_MAX_ROWS);
    check_linear(q, &w, wf, 13, IN + 4, ROWS + 3, 13 > MS_CUDA_QGEMV_MAX_ROWS);
    check_linear(q, &w, wf, 32, IN, ROWS, 32 > MS_CUDA_QGEMV_MAX_ROWS);
    check_linear(q, &w, wf, 33, IN, ROWS, 33 > MS_CUDA_QGEMV_MAX_ROWS);
    check_linear(q, &w, wf, 64, IN + 8, ROWS + 1, 64 > MS_CUDA_QGEMV_MAX_ROWS);
    cudaFree(d16);
    free(h16);
    free(wf);
    free(blocks);
    ms_cuda_qweight_free(&w);
}

static void test_quant_types(void **state) {
    (void)state;
    ms_error err = {0};
    ms_cuda_quant *q = NULL;
    OK(ms_cuda_quant_init(&q, g_arch, NULL, g_stream, g_cublas, &err));
    OK(ms_cuda_quant_reserve(q, 64, IN + 8, 0, &err));
    static const uint32_t types[] = {MS_GGML_TYPE_Q4_0, MS_GGML_TYPE_Q4_1, MS_GGML_TYPE_Q5_0, MS_GGML_TYPE_Q8_0,
                                     MS_GGML_TYPE_Q4_K, MS_GGML_TYPE_Q5_K, MS_GGML_TYPE_Q6_K};
    for (size_t i = 0; i < MS_ARRAY_LEN(types); i++)
        check_type(q, types[i]);
    /* a width that is not a multiple of 256: the GEMV's last chunk is partial */
    g_in = 1120;
    OK(ms_cuda_quant_reserve(q, 64, IN + 8, 0, &err));
    for (size_t i = 0; i < 4; i++)
        check_type(q, types[i]);
    /* the 8B model's widths: 4096 (every type's rows 16-byte aligned: the GEMV's wide loads) and
     * 14336 (Q6_K's rows of 56 blocks too); 5120 (Q6_K's 20 blocks are not: its 16-bit loads) */
    static const int wide[] = {4096, 14336, 5120};
    for (size_t k = 0; k < MS_ARRAY_LEN(wide); k++) {
        g_in = wide[k];
        OK(ms_cuda_quant_reserve(q, 64, IN + 8, 0, &err));
        for (size_t i = 0; i < MS_ARRAY_LEN(types); i++)
            check_type(q, types[i]);
    }
    g_in = 1024;
    /* a small tile forces several dequantize + GEMM rounds in the prefill path */
    ms_cuda_quant_free(q);
    q = NULL;
    OK(ms_cuda_quant_init(&q, g_arch, NULL, g_stream, g_cublas, &err));
    OK(ms_cuda_quant_reserve(q, 64, IN + 8, (size_t)IN * 2 * 37, &err));
    check_type(q, MS_GGML_TYPE_Q4_K);
    /* sealed: a type not loaded fails instead of compiling mid-step */
    ms_cuda_quant_seal(q);
    ms_cuda_qweight w;
    OK(ms_cuda_qweight_init(&w, MS_GGML_TYPE_Q8_0, 4, 64, &err));
    float *dx, *dy;
    CU(cudaMalloc((void **)&dx, sizeof(float) * 64));
    CU(cudaMalloc((void **)&dy, sizeof(float) * 4));
    ms_cuda_quant_free(q);
    q = NULL;
    OK(ms_cuda_quant_init(&q, g_arch, NULL, g_stream, g_cublas, &err));
    ms_cuda_quant_seal(q);
    assert_int_equal(ms_cuda_quant_linear(q, dx, 1, 64, &w, dy, 4, false, &err), MS_ERR_STATE);
    assert_non_null(strstr(err.msg, "Q8_0"));
    cudaFree(dx);
    cudaFree(dy);
    ms_cuda_qweight_free(&w);
    ms_cuda_quant_free(q);
}

static void test_bad_weights(void **state) {
    (void)state;
    ms_error err = {0};
    ms_cuda_qweight w;
    assert_int_equal(ms_cuda_qweight_init(&w, MS_GGML_TYPE_Q5_1, 4, 64, &err), MS_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "ggml type Q5_1 is not kept quantized"));
    assert_int_equal(ms_cuda_qweight_init(&w, MS_GGML_TYPE_Q4_K, 4, 64, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "positive multiple of 256"));
    assert_null(w.data);
    ms_cuda_qweight_free(&w);
    OK(ms_cuda_qweight_init(&w, MS_GGML_TYPE_Q4_0, 4, 64, &err));
    uint8_t host[4 * 36] = {0};
    assert_int_equal(ms_cuda_qweight_upload_rows(&w, 3, 2, host, &err), MS_ERR_INVALID_ARG);
    /* the GEMV on x quantized by its producer: Q4_0 / Q8_0 / Q4_K at 1 .. 8 rows only, and the
       workspace's own rules */
    ms_cuda_quant *q = NULL;
    OK(ms_cuda_quant_init(&q, g_arch, NULL, g_stream, g_cublas, &err));
    assert_true(ms_cuda_quant_reads_qx(&w, 1) && ms_cuda_quant_reads_qx(&w, 8));
    assert_false(ms_cuda_quant_reads_qx(&w, 0) || ms_cuda_quant_reads_qx(&w, 9));
    ms_cuda_qx qx;
    assert_int_equal(ms_cuda_quant_qx(q, 9, 64, &qx, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "quantized x of 9 rows"));
    assert_int_equal(ms_cuda_quant_qx(q, 1, 48, &qx, &err), MS_ERR_INVALID_ARG);
    OK(ms_cuda_quant_qx(q, 2, 64, &qx, &err));
    assert_true(qx.q_stride % 16 == 0 && qx.q_stride >= 64 && qx.d_stride == 2);
    float *dy;
    CU(cudaMalloc((void **)&dy, sizeof(float) * 16 * 4));
    assert_int_equal(ms_cuda_quant_linear_qx(q, &qx, 9, &w, dy, 4, false, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "reads x quantized"));
    ms_cuda_qweight wk;
    OK(ms_cuda_qweight_init(&wk, MS_GGML_TYPE_Q6_K, 4, 256, &err));
    assert_false(ms_cuda_quant_reads_qx(&wk, 1));
    assert_int_equal(ms_cuda_quant_linear_qx(q, &qx, 1, &wk, dy, 4, false, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "Q6_K"));
    ms_cuda_qweight_free(&wk);
    cudaFree(dy);
    ms_cuda_quant_free(q);
    ms_cuda_qweight_free(&w);
}

/* x row 1 of n gets a NaN (at value 37, so one 32-value block of it): y's row 1 must be all NaN
   (the fp32 dot's answer too) and rows 0, 2, .. bitwise those of the same launch without it. And
   for the MS_QGEMV_PREQ_TYPE types every row of an n-row launch is bitwise the one-row launch's on
   that x row: x quantized once per call (n >= 3) or in the CTAs (n <= 2) gives the same int8
   values and the same sums in the same order. */
static void test_integer_gemv_nan(void **state) {
    (void)state;
    ms_error err = {0};
    ms_cuda_quant *q = NULL;
    OK(ms_cuda_quant_init(&q, g_arch, NULL, g_stream, g_cublas, &err));
    enum { R = 64, K = 1024 };
    static const uint32_t types[] = {MS_GGML_TYPE_Q4_0, MS_GGML_TYPE_Q8_0, MS_GGML_TYPE_Q4_K};
    float *f = malloc(sizeof(float) * R * K), *x = malloc(sizeof(float) * 8 * K);
    float *y0 = malloc(sizeof(float) * 8 * R), *y1 = malloc(sizeof(float) * 8 * R);
    assert_true(f != NULL && x != NULL && y0 != NULL && y1 != NULL);
    for (int i = 0; i < R * K; i++)
        f[i] = frand() * (1.f / 64.f);
    float *dx, *dy;
    CU(cudaMalloc((void **)&dx, sizeof(float) * 8 * K));
    CU(cudaMalloc((void **)&dy, sizeof(float) * 8 * R));
    for (size_t t = 0; t < MS_ARRAY_LEN(types); t++) {
        size_t bytes = ms_cuda_qweight_bytes(types[t], R, K);
        uint8_t *blocks = malloc(bytes);
        assert_non_null(blocks);
        assert_int_equal(ms_ggml_quantize(types[t], f, blocks, (size_t)R * K), MS_OK);
        ms_cuda_qweight w;
        OK(ms_cuda_qweight_init(&w, types[t], R, K, &err));
        OK(ms_cuda_quant_load_type(q, types[t], &err));
        OK(ms_cuda_qweight_upload_rows(&w, 0, R, blocks, &err));
        for (int n = 2; n <= 8; n++) {
            for (int i = 0; i < n * K; i++)
                x[i] = frand();
            for (int pass = 0; pass < 2; pass++) {
                if (pass == 1)
                    x[K + 37] = NAN;
                CU(cudaMemcpy(dx, x, sizeof(float) * (size_t)n * K, cudaMemcpyHostToDevice));
                OK(ms_cuda_quant_linear(q, dx, n, K, &w, dy, R, false, &err));
                CU(cudaStreamSynchronize(g_stream));
                CU(cudaMemcpy(pass ? y1 : y0, dy, sizeof(float) * (size_t)n * R, cudaMemcpyDeviceToHost));
            }
            if (MS_QGEMV_PREQ_TYPE(types[t]))
                for (int r = 0; r < n; r++) {
                    if (r == 1)
                        continue; /* dx row 1 holds the NaN now */
                    float one[R];
                    OK(ms_cuda_quant_linear(q, dx + (size_t)r * K, 1, K, &w, dy, R, false, &err));
                    CU(cudaStreamSynchronize(g_stream));
                    CU(cudaMemcpy(one, dy, sizeof one, cudaMemcpyDeviceToHost));
                    for (int c = 0; c < R; c++)
                        if (memcmp(&one[c], &y0[r * R + c], sizeof(float)) != 0)
                            fail_msg("%s: y[%d, %d] of a %d-row launch is %.9g, of the one-row launch %.9g",
                                     ms_ggml_type_name(types[t]), r, c, n, (double)y0[r * R + c], (double)one[c]);
                }
            for (int r = 0; r < n; r++)
                for (int c = 0; c < R; c++) {
                    const float a = y0[r * R + c], b = y1[r * R + c];
                    if (r == 1 ? !isnan(b) : memcmp(&a, &b, sizeof a) != 0 || !isfinite(a))
                        fail_msg("%s n=%d: y[%d, %d] = %g with the NaN in x row 1, %g without",
                                 ms_ggml_type_name(types[t]), n, r, c, (double)b, (double)a);
                }
        }
        printf("  %s: a NaN in x row 1 gives NaN in y row 1 only, n = 2..8%s\n", ms_ggml_type_name(types[t]),
               MS_QGEMV_PREQ_TYPE(types[t]) ? "; every row bitwise the one-row launch's" : "");
        ms_cuda_qweight_free(&w);
        free(blocks);
    }
    cudaFree(dx);
    cudaFree(dy);
    free(f);
    free(x);
    free(y0);
    free(y1);
    ms_cuda_quant_free(q);
}

/* A graph captured over the prefill path (x -> bf16 workspace, dequantize, GEMM), then an eager
 * call with more rows that outgrows the workspace: the replay must still write the buffer it was
 * captured with, alive (a fresh allocation the size of the old workspace, made after the growth
 * and poisoned, stays untouched: with the old buffer freed, the allocator handed that range out
 * again and the replay wrote into it, CUDA error 700 in the 8B batch-32 bench), and give the same y. */
static void test_graph_survives_workspace_growth(void **state) {
    (void)state;
    ms_error err = {0};
    const int in = 1024, rows = 301, n0 = 33, n1 = 200;
    ms_cuda_quant *q = NULL;
    OK(ms_cuda_quant_init(&q, g_arch, NULL, g_stream, g_cublas, &err));
    const size_t bytes = ms_cuda_qweight_bytes(MS_GGML_TYPE_Q4_0, rows, in);
    g_in = in;
    uint8_t *blocks = random_blocks(MS_GGML_TYPE_Q4_0, bytes);
    ms_cuda_qweight w;
    OK(ms_cuda_qweight_init(&w, MS_GGML_TYPE_Q4_0, rows, in, &err));
    OK(ms_cuda_quant_load_type(q, MS_GGML_TYPE_Q4_0, &err));
    OK(ms_cuda_qweight_upload_rows(&w, 0, rows, blocks, &err));
    float *x = malloc(sizeof(float) * (size_t)n1 * in), *y0 = malloc(sizeof(float) * (size_t)n0 * rows),
          *y1 = malloc(sizeof(float) * (size_t)n0 * rows);
    assert_true(x != NULL && y0 != NULL && y1 != NULL);
    for (size_t i = 0; i < (size_t)n1 * in; i++)
        x[i] = frand();
    float *dx, *dy;
    CU(cudaMalloc((void **)&dx, sizeof(float) * (size_t)n1 * in));
    CU(cudaMalloc((void **)&dy, sizeof(float) * (size_t)n1 * rows));
    CU(cudaMemcpy(dx, x, sizeof(float) * (size_t)n1 * in, cudaMemcpyHostToDevice));
    OK(ms_cuda_quant_linear(q, dx, n0, in, &w, dy, rows, false, &err)); /* sizes the workspaces for n0 */
    CU(cudaStreamSynchronize(g_stream));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CU(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal));
    OK(ms_cuda_quant_linear(q, dx, n0, in, &w, dy, rows, false, &err));
    CU(cudaStreamEndCapture(g_stream, &graph));
    CU(cudaGraphInstantiate(&exec, graph, 0));
    CU(cudaGraphLaunch(exec, g_stream));
    CU(cudaStreamSynchronize(g_stream));
    CU(cudaMemcpy(y0, dy, sizeof(float) * (size_t)n0 * rows, cudaMemcpyDeviceToHost));
    /* more rows: the bf16 x workspace grows past n0 x in */
    OK(ms_cuda_quant_linear(q, dx, n1, in, &w, dy, rows, false, &err));
    CU(cudaStreamSynchronize(g_stream));
    const size_t ws = (size_t)n0 * in * 2;
    uint8_t *poison, *host = malloc(ws);
    assert_non_null(host);
    CU(cudaMalloc((void **)&poison, ws));
    CU(cudaMemset(poison, 0x5a, ws));
    CU(cudaMemset(dy, 0xff, sizeof(float) * (size_t)n1 * rows));
    CU(cudaGraphLaunch(exec, g_stream));
    CU(cudaStreamSynchronize(g_stream));
    CU(cudaMemcpy(y1, dy, sizeof(float) * (size_t)n0 * rows, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(host, poison, ws, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < ws; i++)
        if (host[i] != 0x5a)
            fail_msg("the replay wrote into memory allocated after the workspace grew (byte %zu)", i);
    assert_memory_equal(y0, y1, sizeof(float) * (size_t)n0 * rows);
    printf("graph replay after the workspace grew: same y, nothing written outside its buffers\n");
    CU(cudaGraphExecDestroy(exec));
    CU(cudaGraphDestroy(graph));
    cudaFree(poison);
    cudaFree(dx);
    cudaFree(dy);
    free(host);
    free(x);
    free(y0);
    free(y1);
    free(blocks);
    ms_cuda_qweight_free(&w);
    ms_cuda_quant_free(q);
    g_in = 1024;
}

/* Programmatic dependent launch (templates/common/pdl.cuh: on sm_90 with MS_CUDA_PDL=all, which
 * gpu-batch.sh runs this test under too, a GEMV may start while the kernel before it finishes): a chain of four
 * GEMVs where each reads the one before's output and the third overwrites the buffer the second
 * reads, queued back to back on a non-blocking stream, 20 times, against the same launches with
 * the stream drained after each (where nothing can overlap): bitwise equal. A GEMV that read x,
 * or wrote y, before its wait would read a poisoned or half-written vector, or clobber its
 * predecessor's input. */
static void test_pdl_chain_matches_serial_launches(void **state) {
    (void)state;
    ms_error err = {0};
    const int in = 4096, n = 1;
    cudaStream_t st;
    CU(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    ms_cuda_quant *q = NULL;
    OK(ms_cuda_quant_init(&q, g_arch, NULL, st, g_cublas, &err));
    const size_t bytes = ms_cuda_qweight_bytes(MS_GGML_TYPE_Q4_0, in, in);
    float *f = malloc(sizeof(float) * (size_t)in * in);
    uint8_t *blocks = malloc(bytes);
    assert_true(f != NULL && blocks != NULL);
    for (size_t i = 0; i < (size_t)in * in; i++)
        f[i] = frand() * (1.f / 64.f);
    assert_int_equal(ms_ggml_quantize(MS_GGML_TYPE_Q4_0, f, blocks, (size_t)in * in), MS_OK);
    ms_cuda_qweight w;
    OK(ms_cuda_qweight_init(&w, MS_GGML_TYPE_Q4_0, in, in, &err));
    OK(ms_cuda_quant_load_type(q, MS_GGML_TYPE_Q4_0, &err));
    OK(ms_cuda_qweight_upload_rows(&w, 0, in, blocks, &err));
    float *x = malloc(sizeof(float) * in), *want = malloc(sizeof(float) * 3 * in), *got = malloc(sizeof(float) * 3 * in);
    assert_true(x != NULL && want != NULL && got != NULL);
    for (int i = 0; i < in; i++)
        x[i] = frand();
    float *dx, *d; /* d: three vectors a, b, c of `in` floats */
    CU(cudaMalloc((void **)&dx, sizeof(float) * in));
    CU(cudaMalloc((void **)&d, sizeof(float) * 3 * in));
    CU(cudaMemcpy(dx, x, sizeof(float) * in, cudaMemcpyHostToDevice));
    float *a = d, *b = d + in, *c = d + 2 * in;
    /* a = W x; b = W a; a = W b (overwrites what the second read); c = W a */
    const float *src[4] = {dx, a, b, a};
    float *dst[4] = {a, b, a, c};
    for (int rep = 0; rep <= 20; rep++) {
        const bool serial = rep == 0;
        CU(cudaMemsetAsync(d, 0xff, sizeof(float) * 3 * in, st)); /* NaN */
        for (int k = 0; k < 4; k++) {
            OK(ms_cuda_quant_linear(q, src[k], n, in, &w, dst[k], in, false, &err));
            if (serial)
                CU(cudaStreamSynchronize(st));
        }
        CU(cudaStreamSynchronize(st));
        CU(cudaMemcpy(serial ? want : got, d, sizeof(float) * 3 * in, cudaMemcpyDeviceToHost));
        if (serial) {
            for (int i = 0; i < 3 * in; i++)
                if (!isfinite(want[i]))
                    fail_msg("serial chain: element %d of %d is %g", i, 3 * in, (double)want[i]);
        } else if (memcmp(want, got, sizeof(float) * 3 * in) != 0) {
            int i = 0;
            while (i < 3 * in && memcmp(&want[i], &got[i], sizeof(float)) == 0)
                i++;
            fail_msg("queued chain %d differs from the serial one at element %d: %g, serial %g", rep, i,
                     (double)got[i], (double)want[i]);
        }
    }
    printf("4 dependent GEMVs queued back to back (programmatic launch %s): 20 chains bitwise equal to serial launches\n",
           g_arch >= 90 && getenv("MS_CUDA_PDL") != NULL && strcmp(getenv("MS_CUDA_PDL"), "all") == 0 ? "on"
                                                                                                : "off");
    cudaFree(dx);
    cudaFree(d);
    free(x);
    free(want);
    free(got);
    free(f);
    free(blocks);
    ms_cuda_qweight_free(&w);
    ms_cuda_quant_free(q);
    CU(cudaStreamDestroy(st));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_quant_types),
        ms_unit_test(test_integer_gemv_nan),
        ms_unit_test(test_graph_survives_workspace_growth),
        ms_unit_test(test_pdl_chain_matches_serial_launches),
        ms_unit_test(test_bad_weights),
    };
    /* MS_TEST_FILTER=NAME runs the tests matching NAME only (gpu-batch.sh: one test under
     * compute-sanitizer) */
    const char *only = getenv("MS_TEST_FILTER");
    if (only != NULL && only[0] != '\0')
        cmocka_set_test_filter(only);
    return cmocka_run_group_tests(tests, setup, teardown);
}
