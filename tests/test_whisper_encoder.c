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
 *     over the encoder; the node owns no KV pages (a dense attention);
 *   - three different windows in one step (ms_engine_encode_batch) equal each encoded alone,
 *     bitwise; the CPU attention_dense op against a softmax in double, and its refusals.
 */
#include "ms_test.h"
#include "ms_test_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
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
    assert_int_equal(ms_engine_kv_pages_free(e), 0); /* a dense node owns no KV pages */
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

/* Three different windows (the reference features, a scaled and shifted copy, the frames in
 * reverse) encoded in ONE step equal each encoded alone, bitwise: the dense attention keeps each
 * window's rows to themselves and every CPU op computes a row the same way whatever the batch. */
static void test_encoder_batched(void **state) {
    (void)state;
    ms_st_file *f = ms_test_ref_open("hf/whisper_tiny");
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture("hf/whisper_tiny");
    o.max_seqs = 3;
    o.max_tokens = 64;     /* two windows' rows: the encoder's buffers are sized apart */
    o.encode_windows = 4;  /* more windows than max_seqs: refused */
    ms_engine *e = NULL;
    ms_error err = {0};
    assert_int_equal(ms_engine_init(&e, &ms_whisper_encoder_desc, &o, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "encode_windows 4: node encoder batches 1 to max_seqs (3)"));
    o.encode_windows = 3;
    if (ms_engine_init(&e, &ms_whisper_encoder_desc, &o, &err) != MS_OK)
        fail_msg("engine: %s", err.msg);
    size_t nf, nh;
    float *feat = ms_test_ref_tensor(f, "input_features", false, &nf);
    float *want = ms_test_ref_tensor(f, "encoder_hidden", false, &nh);
    assert_int_equal(nf, 80 * 64);
    assert_int_equal(nh, 32 * 64);
    float *in[3], *alone[3], *batched[3];
    for (int k = 0; k < 3; k++) {
        in[k] = ms_malloc(nf * sizeof(float));
        alone[k] = ms_malloc(nh * sizeof(float));
        batched[k] = ms_malloc(nh * sizeof(float));
        assert_true(in[k] != NULL && alone[k] != NULL && batched[k] != NULL);
    }
    for (size_t c = 0; c < 80; c++)
        for (size_t t = 0; t < 64; t++) {
            in[0][c * 64 + t] = feat[c * 64 + t];
            in[1][c * 64 + t] = 0.5f * feat[c * 64 + t] + 0.25f;
            in[2][c * 64 + t] = feat[c * 64 + (63 - t)];
        }
    for (int k = 0; k < 3; k++) {
        int64_t rows = 0, width = 0;
        if (ms_engine_encode(e, "encoder", in[k], 80, 64, alone[k], (int64_t)nh, &rows, &width,
                             &err) != MS_OK)
            fail_msg("encode window %d alone: %s", k, err.msg);
        assert_int_equal(rows * width, (int64_t)nh);
    }
    ms_engine_encode_item items[3];
    for (int k = 0; k < 3; k++)
        items[k] = (ms_engine_encode_item){.input = in[k], .n_channels = 80, .n_frames = 64,
                                           .out = batched[k], .cap = (int64_t)nh};
    if (ms_engine_encode_batch(e, "encoder", items, 3, &err) != MS_OK)
        fail_msg("encode 3 windows: %s", err.msg);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(items[k].n_rows, 32);
        assert_int_equal(items[k].width, 64);
        if (memcmp(alone[k], batched[k], nh * sizeof(float)) != 0)
            fail_msg("window %d: batched rows differ from the window encoded alone (max |diff| "
                     "%g)", k, max_diff(alone[k], batched[k], nh));
    }
    /* the windows differ, so equal rows say each saw only its own frames */
    assert_true(max_diff(batched[0], batched[1], nh) > 1e-3);
    assert_true(max_diff(batched[0], batched[2], nh) > 1e-3);
    double d = max_diff(batched[0], want, nh);
    printf("    3 windows in one step: bitwise equal to each alone; window 0 max |diff| %.3g "
           "against encoder_hidden\n", d);
    assert_true(d <= 1e-3);

    /* refusals: more windows than the workspace holds, a bad window, a short output */
    ms_engine_encode_item four[4] = {items[0], items[1], items[2], items[0]};
    assert_int_equal(ms_engine_encode_batch(e, "encoder", four, 4, &err), MS_ERR_CAPACITY);
    assert_non_null(strstr(err.msg, "4 windows in one step; node encoder batches 1 to 3"));
    items[1].n_frames = 63;
    assert_int_equal(ms_engine_encode_batch(e, "encoder", items, 3, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "window 1: node encoder takes input [80, 64]"));
    assert_int_equal(items[0].n_rows, 0);
    items[1].n_frames = 64;
    items[2].cap = (int64_t)nh - 1;
    assert_int_equal(ms_engine_encode_batch(e, "encoder", items, 3, &err), MS_ERR_CAPACITY);
    assert_non_null(strstr(err.msg, "window 2: node encoder returns [32, 64]"));
    assert_int_equal(ms_engine_encode_batch(e, "encoder", items, 0, &err), MS_ERR_CAPACITY);
    for (int k = 0; k < 3; k++) {
        ms_free(in[k]);
        ms_free(alone[k]);
        ms_free(batched[k]);
    }
    ms_free(feat);
    ms_free(want);
    ms_engine_free(e);
    ms_st_file_free(f);
}

/* The CPU attention_dense op against a plain softmax in double over each segment's own rows
 * (3 segments of 5, 1 and 9 rows, 4 query heads over 2 KV heads), and its refusals. */
static void test_attention_dense_cpu(void **state) {
    (void)state;
    ms_backend be;
    ms_error err = {0};
    assert_int_equal(ms_backend_cpu_init(&be, NULL, &err), MS_OK);
    enum { N = 15, HQ = 4, HKV = 2, D = 8 };
    static const int32_t lens[] = {5, 1, 9};
    float *q = ms_malloc(N * HQ * D * sizeof(float)), *kv = ms_malloc(N * 2 * HKV * D * sizeof(float));
    float *out = ms_malloc(N * HQ * D * sizeof(float));
    assert_true(q != NULL && kv != NULL && out != NULL);
    uint32_t x = 12345;
    for (int i = 0; i < N * HQ * D; i++) {
        x = x * 1664525u + 1013904223u;
        q[i] = (float)((x >> 8) & 0xffff) / 65536.0f * 2.0f - 1.0f;
    }
    for (int i = 0; i < N * 2 * HKV * D; i++) {
        x = x * 1664525u + 1013904223u;
        kv[i] = (float)((x >> 8) & 0xffff) / 65536.0f * 2.0f - 1.0f;
    }
    /* k and v as column halves of one [N, 2 * HKV * D] buffer (a fused K/V GEMM's output) */
    ms_tensor kvt = ms_tensor_2d(kv, MS_DTYPE_F32, N, 2 * HKV * D);
    ms_tensor k2 = ms_tensor_slice(&kvt, 1, 0, HKV * D), v2 = ms_tensor_slice(&kvt, 1, HKV * D, HKV * D);
    ms_tensor qt = ms_tensor_3d(q, MS_DTYPE_F32, N, HQ, D), ot = ms_tensor_3d(out, MS_DTYPE_F32, N, HQ, D);
    ms_tensor kt = ms_tensor_split_heads(&k2, HKV, D), vt = ms_tensor_split_heads(&v2, HKV, D);
    ms_dense_batch *db = NULL;
    assert_int_equal(ms_dense_batch_init(&be, 3, N, &db, &err), MS_OK);
    assert_int_equal(ms_dense_batch_stage(&be, db, lens, 3, &err), MS_OK);
    assert_int_equal(db->n_tokens, N);
    assert_int_equal(db->max_len, 9);
    ms_attn_params p = {.scale = 0.35f, .window = 0, .causal = false};
    assert_int_equal(be.iface.attention_dense(be.ctx, &qt, &kt, &vt, db, &p, &ot, &err), MS_OK);
    double worst = 0.0;
    for (int s = 0, r0 = 0; s < 3; r0 += lens[s], s++)
        for (int t = r0; t < r0 + lens[s]; t++)
            for (int h = 0; h < HQ; h++) {
                const int g = h / (HQ / HKV);
                double sc[9], m = -1e300, l = 0.0;
                for (int r = 0; r < lens[s]; r++) {
                    double dot = 0.0;
                    for (int i = 0; i < D; i++)
                        dot += (double)q[(t * HQ + h) * D + i] * kv[(r0 + r) * 2 * HKV * D + g * D + i];
                    sc[r] = dot * 0.35;
                    m = sc[r] > m ? sc[r] : m;
                }
                for (int r = 0; r < lens[s]; r++)
                    l += exp(sc[r] - m);
                for (int i = 0; i < D; i++) {
                    double o = 0.0;
                    for (int r = 0; r < lens[s]; r++)
                        o += exp(sc[r] - m) / l * kv[(r0 + r) * 2 * HKV * D + HKV * D + g * D + i];
                    double dd = fabs(o - (double)out[(t * HQ + h) * D + i]);
                    worst = dd > worst ? dd : worst;
                }
            }
    printf("    attention_dense (CPU) against the double reference: max |diff| %.3g\n", worst);
    assert_true(worst < 1e-5);
    /* refusals: causal, a window, q rows other than the batch's, out aliasing q */
    p.causal = true;
    assert_int_equal(be.iface.attention_dense(be.ctx, &qt, &kt, &vt, db, &p, &ot, &err),
                     MS_ERR_INVALID_ARG);
    p.causal = false;
    p.window = 4;
    assert_int_equal(be.iface.attention_dense(be.ctx, &qt, &kt, &vt, db, &p, &ot, &err),
                     MS_ERR_INVALID_ARG);
    p.window = 0;
    ms_tensor q14 = ms_tensor_slice(&qt, 0, 0, 14), o14 = ms_tensor_slice(&ot, 0, 0, 14);
    assert_int_equal(be.iface.attention_dense(be.ctx, &q14, &kt, &vt, db, &p, &o14, &err),
                     MS_ERR_INVALID_ARG);
    assert_int_equal(be.iface.attention_dense(be.ctx, &qt, &kt, &vt, db, &p, &qt, &err),
                     MS_ERR_INVALID_ARG);
    /* staging refusals: too many segments, too many rows, an empty segment */
    static const int32_t four[] = {1, 1, 1, 1}, big[] = {8, 8}, empty[] = {3, 0};
    assert_int_equal(ms_dense_batch_stage(&be, db, four, 4, &err), MS_ERR_CAPACITY);
    assert_int_equal(ms_dense_batch_stage(&be, db, big, 2, &err), MS_ERR_CAPACITY);
    assert_int_equal(ms_dense_batch_stage(&be, db, empty, 2, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "segment 1 has 0 rows"));
    ms_dense_batch_free(&be, db);
    ms_free(q);
    ms_free(kv);
    ms_free(out);
    ms_backend_free(&be);
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
        ms_unit_test(test_encoder_batched),
        ms_unit_test(test_attention_dense_cpu),
        ms_unit_test(test_encoder_base),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
