/*
 * test_whisper_encoder.c - the Whisper encoder written in the language
 * (tests/codegen/whisper_encoder.mstar: conv1d k3 s1 + GELU, conv1d k3 s2 + GELU, the learned
 * position table, pre-LN layers with biases, bidirectional attention, GELU MLP, final LayerNorm),
 * compiled by mstarc and run by ms_engine_encode on the CPU in float32, against
 * ../shared/fixtures:
 *   - hf/whisper_tiny (random weights): encoder_hidden [32, 64] from input_features [80, 64],
 *     max |diff| under 1e-3;
 *   - hf/whisper_base (real OpenAI weights, fp16 in the file): a0.encoder_hidden [1500, 512] from
 *     a0.input_features [80, 3000] within 5e-3 (MS_WHISPER_ALL=1: a1 and a2 too; plain builds
 *     only, sanitizer builds skip it);
 *   - refusals: a wrong input shape, an unknown node, an output buffer too small, a token walk
 *     over the encoder; every KV page returns after each call.
 */
#include "ms_test.h"
#include "ms_test_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "fixture_ref.h"
#include "safetensors.h"

extern const ms_model_desc ms_whisper_encoder_desc;

static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m))
            m = d;
    }
    return m;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static ms_engine *open_engine(const char *fixture, int32_t max_tokens) {
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture(fixture);
    o.max_seqs = 1;
    o.max_tokens = max_tokens;
    ms_engine *e = NULL;
    ms_error err = {0};
    if (ms_engine_init(&e, &ms_whisper_encoder_desc, &o, &err) != MS_OK)
        fail_msg("engine: %s", err.msg);
    return e;
}

/* Encode `feat_name` of the fixture's reference and compare with `hidden_name`. */
static void check_encode(ms_engine *e, ms_st_file *f, const char *feat_name,
                         const char *hidden_name, double tol) {
    size_t nf, nh;
    float *feat = ms_test_ref_tensor(f, feat_name, false, &nf);
    float *want = ms_test_ref_tensor(f, hidden_name, false, &nh);
    const ms_st_tensor *ft = ms_st_file_find_tensor(f, feat_name);
    assert_int_equal(ft->n_dims, 2);
    float *got = ms_malloc(nh * sizeof(float));
    assert_non_null(got);
    const int32_t free0 = ms_engine_kv_pages_free(e);
    int64_t rows = 0, width = 0;
    ms_error err = {0};
    double t0 = now_s();
    if (ms_engine_encode(e, "encoder", feat, ft->shape[0], ft->shape[1], got, (int64_t)nh, &rows,
                         &width, &err) != MS_OK)
        fail_msg("encode %s: %s", feat_name, err.msg);
    double t1 = now_s();
    assert_int_equal((size_t)(rows * width), nh);
    double d = max_diff(got, want, nh);
    printf("    %s: [%lld, %lld] max |diff| %.3g (tolerance %g), %.2f s\n", hidden_name,
           (long long)rows, (long long)width, d, tol, t1 - t0);
    if (!(d <= tol))
        fail_msg("%s: max |diff| %g over %g", hidden_name, d, tol);
    assert_int_equal(ms_engine_kv_pages_free(e), free0);
    ms_free(got);
    ms_free(feat);
    ms_free(want);
}

static void test_encoder_tiny(void **state) {
    (void)state;
    ms_st_file *f = ms_test_ref_open("hf/whisper_tiny");
    ms_engine *e = open_engine("hf/whisper_tiny", 64);
    check_encode(e, f, "input_features", "encoder_hidden", 1e-3);
    /* the same features again: the call leaves nothing behind */
    check_encode(e, f, "input_features", "encoder_hidden", 1e-3);

    /* refusals, each one line naming what */
    size_t nf;
    float *feat = ms_test_ref_tensor(f, "input_features", false, &nf);
    float out[32 * 64];
    int64_t rows, width;
    ms_error err = {0};
    assert_int_equal(ms_engine_encode(e, "encoder", feat, 80, 63, out, 32 * 64, &rows, &width,
                                      &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "takes input [80, 64] (channels, frames), got [80, 63]"));
    assert_int_equal(ms_engine_encode(e, "decoder", feat, 80, 64, out, 32 * 64, &rows, &width,
                                      &err), MS_ERR_NOT_FOUND);
    assert_int_equal(ms_engine_encode(e, "encoder", feat, 80, 64, out, 32 * 64 - 1, &rows,
                                      &width, &err), MS_ERR_CAPACITY);
    static const int32_t ids[] = {3};
    ms_engine_request rq = {.prompt = ids, .n_prompt = 1, .max_new_tokens = 1,
                            .sampling = ms_sampling_greedy()};
    ms_rid rid;
    assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_ERR_INVALID_ARG);
    ms_free(feat);
    ms_engine_free(e);
    ms_st_file_free(f);
}

/* Sanitizer builds run the same code paths on whisper_tiny; the 1500-frame base clip (about
 * 10 s of CPU in a plain build) is checked in the plain run only. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MS_SANITIZED 1
#else
#define MS_SANITIZED 0
#endif

static void test_encoder_base(void **state) {
    (void)state;
    if (MS_SANITIZED) {
        printf("    skipped under a sanitizer: whisper_base runs in the plain build\n");
        skip();
    }
    ms_st_file *f = ms_test_ref_open("hf/whisper_base");
    ms_engine *e = open_engine("hf/whisper_base", 1500);
    const char *all = getenv("MS_WHISPER_ALL");
    int n = all != NULL && strcmp(all, "1") == 0 ? 3 : 1;
    for (int k = 0; k < n; k++) {
        char fn[64], hn[64];
        snprintf(fn, sizeof fn, "a%d.input_features", k);
        snprintf(hn, sizeof hn, "a%d.encoder_hidden", k);
        check_encode(e, f, fn, hn, 5e-3);
    }
    ms_engine_free(e);
    ms_st_file_free(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_encoder_tiny),
        ms_unit_test(test_encoder_base),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
