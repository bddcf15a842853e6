/*
 * test_whisper.c - Whisper end to end through the engine: the descriptor mstarc generates from
 * models/whisper.mstar (encoder node, decoder node with learned positions, causal self-attention,
 * cross-attention over the context stream the encoder's rows are written into once, tied output
 * projection; walk encoder.encode then decoder.prefill then loop decoder.decode), on the CPU in
 * float32, against ../shared/fixtures:
 *   - hf/whisper_tiny (random weights): from input_features and decoder_start_ids, the prefill's
 *     logits (first_logits) and every decode step's (decode_logits) within 1e-3, greedy ids equal;
 *   - hf/whisper_base (real OpenAI weights, fp16 in the file): from aK.input_features and the
 *     prompt <|startoftranscript|><|en|><|transcribe|><|notimestamps|>, the logits of the first 4
 *     steps within 5e-3 and the greedy transcript ids (stopping at <|endoftext|>) equal to the
 *     reference: clip a0 in the plain build; MS_WHISPER_ALL=1 all three clips, batched as one;
 *   - the context is written once: the decode steps read it with zero spans; every KV page
 *     returns after remove; features of the wrong shape are refused naming them;
 *   - ms_engine_transcribe: three whisper_tiny windows in two waves, ids up to the eos id;
 *   - a request joining while another decodes: both the reference ids, decoded as one batch;
 *   - the transcribe verb (cli_transcribe.c) over --features FILE:NAME: its output lines.
 */
#include "ms_test.h"
#include "ms_test_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <unistd.h>

#include "cli_transcribe.h"
#include "engine.h"
#include "fixture_ref.h"
#include "safetensors.h"

extern const ms_model_desc ms_whisper_desc;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MS_SANITIZED 1
#else
#define MS_SANITIZED 0
#endif

static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m))
            m = d;
    }
    return m;
}

static ms_engine *open_engine(const char *fixture, int32_t max_seqs, int32_t max_tokens) {
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture(fixture);
    o.max_seqs = max_seqs;
    o.max_tokens = max_tokens;
    ms_engine *e = NULL;
    ms_error err = {0};
    if (ms_engine_init(&e, &ms_whisper_desc, &o, &err) != MS_OK)
        fail_msg("engine: %s", err.msg);
    return e;
}

static void test_whisper_tiny(void **state) {
    (void)state;
    ms_st_file *f = ms_test_ref_open("hf/whisper_tiny");
    size_t nf, ns, n1, nd, ng;
    float *feat = ms_test_ref_tensor(f, "input_features", false, &nf);
    int32_t *start = ms_test_ref_tensor(f, "decoder_start_ids", true, &ns);
    float *first = ms_test_ref_tensor(f, "first_logits", false, &n1);
    float *dec = ms_test_ref_tensor(f, "decode_logits", false, &nd);
    int32_t *greedy = ms_test_ref_tensor(f, "greedy_ids", true, &ng);
    ms_engine *e = open_engine("hf/whisper_tiny", 3, 128);
    const size_t V = (size_t)ms_engine_facts(e)->vocab;
    assert_int_equal(n1, V);
    const int32_t free0 = ms_engine_kv_pages_free(e);
    ms_engine_request rq = {.prompt = start, .n_prompt = (int32_t)ns,
                            .max_new_tokens = (int32_t)ng, .sampling = ms_sampling_greedy(),
                            .ignore_eos = true, .features = feat, .n_feature_channels = 80,
                            .n_feature_frames = 64};
    ms_rid rid;
    ms_error err = {0};
    if (ms_engine_add(e, &rq, &rid, &err) != MS_OK)
        fail_msg("add: %s", err.msg);
    ms_engine_step_info info;
    /* the encoder: 32 rows, nothing sampled */
    assert_int_equal(ms_engine_step(e, &info, &err), MS_OK);
    assert_int_equal(info.n_tokens, 32);
    assert_null(ms_engine_last_logits(e, rid));
    /* the decoder's prefill: the prompt and the 32 context rows in one step */
    if (ms_engine_step(e, &info, &err) != MS_OK)
        fail_msg("prefill: %s", err.msg);
    assert_int_equal(info.n_tokens, (int)ns + 32);
    double d = max_diff(ms_engine_last_logits(e, rid), first, V);
    printf("    prefill logits max |diff| %.3g\n", d);
    if (!(d <= 1e-3))
        fail_msg("first logits: max |diff| %g", d);
    double worst = 0.0;
    int steps = 0;
    while (ms_engine_n_active(e) > 0) {
        if (ms_engine_step(e, &info, &err) != MS_OK)
            fail_msg("decode: %s", err.msg);
        assert_int_equal(info.n_tokens, 1); /* the context is read, not written (span 0) */
        const float *lg = ms_engine_last_logits(e, rid);
        if ((size_t)steps < nd / V && lg != NULL) {
            double dj = max_diff(lg, dec + (size_t)steps * V, V);
            worst = dj > worst ? dj : worst;
        }
        steps++;
    }
    printf("    %d decode steps, logits max |diff| %.3g\n", steps, worst);
    if (!(worst <= 1e-3))
        fail_msg("decode logits: max |diff| %g", worst);
    const int32_t *ids;
    int32_t n;
    assert_int_equal(ms_engine_output(e, rid, &ids, &n, NULL), MS_OK);
    assert_int_equal(n, (int)ng);
    for (int32_t j = 0; j < n; j++)
        if (ids[j] != greedy[j])
            fail_msg("id %d: %d, reference %d", (int)j, (int)ids[j], (int)greedy[j]);
    ms_engine_remove(e, rid);
    assert_int_equal(ms_engine_kv_pages_free(e), free0);

    /* refusals */
    rq.n_feature_frames = 63;
    assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "takes features [80, 64]"));
    rq.features = NULL;
    assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_ERR_INVALID_ARG);
    ms_engine_free(e);
    ms_free(feat);
    ms_free(start);
    ms_free(first);
    ms_free(dec);
    ms_free(greedy);
    ms_st_file_free(f);
}

/* ms_engine_transcribe: three windows with max_seqs 6 (two requests per wave, so two waves),
 * each the reference's ids up to the model's eos id (whisper_tiny's is 2: greedy there is
 * argmax with no eos handling). */
static void test_whisper_transcribe(void **state) {
    (void)state;
    ms_st_file *f = ms_test_ref_open("hf/whisper_tiny");
    size_t nf, ns, ng;
    float *feat = ms_test_ref_tensor(f, "input_features", false, &nf);
    int32_t *start = ms_test_ref_tensor(f, "decoder_start_ids", true, &ns);
    int32_t *greedy = ms_test_ref_tensor(f, "greedy_ids", true, &ng);
    ms_engine *e = open_engine("hf/whisper_tiny", 6, 128);
    const ms_md_facts *fa = ms_engine_facts(e);
    assert_int_equal(fa->n_eos, 1);
    int32_t want = 0;
    while (want < (int32_t)ng && greedy[want] != fa->eos_ids[0])
        want++;
    want = want < (int32_t)ng ? want + 1 : (int32_t)ng; /* the eos id is kept */
    const int32_t free0 = ms_engine_kv_pages_free(e);
    ms_engine_transcript t[3];
    for (int k = 0; k < 3; k++)
        t[k] = (ms_engine_transcript){.features = feat, .n_channels = 80, .n_frames = 64,
                                      .prompt = start, .n_prompt = (int32_t)ns,
                                      .max_new_tokens = (int32_t)ng};
    ms_error err = {0};
    if (ms_engine_transcribe(e, t, 3, &err) != MS_OK)
        fail_msg("transcribe: %s", err.msg);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(t[k].n_ids, want);
        for (int32_t j = 0; j < want; j++)
            assert_int_equal(t[k].ids[j], greedy[j]);
        assert_int_equal(t[k].finish, want < (int32_t)ng ? MS_FINISH_EOS : MS_FINISH_LENGTH);
        ms_free(t[k].ids);
    }
    assert_int_equal(ms_engine_kv_pages_free(e), free0);
    assert_int_equal(ms_engine_n_active(e), 0);
    /* a bad window fails naming it, holding nothing */
    t[1].n_frames = 3000;
    assert_int_equal(ms_engine_transcribe(e, t, 3, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "transcribe item 1: "));
    for (int k = 0; k < 3; k++)
        assert_null(t[k].ids);
    assert_int_equal(ms_engine_n_active(e), 0);
    assert_int_equal(ms_engine_kv_pages_free(e), free0);
    ms_engine_free(e);
    ms_free(feat);
    ms_free(start);
    ms_free(greedy);
    ms_st_file_free(f);
}

/* Continuous batching across nodes: a second request joins while the first decodes (its
 * encoder and prefill steps interleave with the first's decode steps); both give the reference
 * ids, and their decode steps run as one batch once both decode. */
static void test_whisper_join(void **state) {
    (void)state;
    ms_st_file *f = ms_test_ref_open("hf/whisper_tiny");
    size_t nf, ns, ng;
    float *feat = ms_test_ref_tensor(f, "input_features", false, &nf);
    int32_t *start = ms_test_ref_tensor(f, "decoder_start_ids", true, &ns);
    int32_t *greedy = ms_test_ref_tensor(f, "greedy_ids", true, &ng);
    ms_engine *e = open_engine("hf/whisper_tiny", 6, 128);
    const int32_t free0 = ms_engine_kv_pages_free(e);
    ms_engine_request rq = {.prompt = start, .n_prompt = (int32_t)ns,
                            .max_new_tokens = (int32_t)ng, .sampling = ms_sampling_greedy(),
                            .ignore_eos = true, .features = feat, .n_feature_channels = 80,
                            .n_feature_frames = 64};
    ms_rid a, b;
    ms_error err = {0};
    assert_int_equal(ms_engine_add(e, &rq, &a, &err), MS_OK);
    for (int i = 0; i < 4; i++) /* encode, prefill, two decode steps */
        assert_int_equal(ms_engine_step(e, NULL, &err), MS_OK);
    assert_int_equal(ms_engine_add(e, &rq, &b, &err), MS_OK);
    int batched = 0, guard = 0;
    while (ms_engine_n_active(e) > 0 && guard++ < 200) {
        ms_engine_step_info info;
        if (ms_engine_step(e, &info, &err) != MS_OK)
            fail_msg("step: %s", err.msg);
        batched += info.n_seqs == 2;
    }
    assert_true(batched > 0);
    const ms_rid rids[2] = {a, b};
    for (int k = 0; k < 2; k++) {
        const int32_t *ids;
        int32_t n;
        assert_int_equal(ms_engine_output(e, rids[k], &ids, &n, NULL), MS_OK);
        assert_int_equal(n, (int)ng);
        for (int32_t j = 0; j < n; j++)
            if (ids[j] != greedy[j])
                fail_msg("request %d id %d: %d, reference %d", k, (int)j, (int)ids[j],
                         (int)greedy[j]);
        ms_engine_remove(e, rids[k]);
    }
    assert_int_equal(ms_engine_kv_pages_free(e), free0);
    ms_engine_free(e);
    ms_free(feat);
    ms_free(start);
    ms_free(greedy);
    ms_st_file_free(f);
}

/* The encoder step batches: three requests with different windows (the reference features, a
 * scaled and shifted copy, the frames reversed) standing at the encoder run as ONE engine step
 * of 3 segments (3 x 32 rows), and each then decodes exactly the ids it gives transcribed alone
 * (window 0: the reference's). The random decoder greedily says the same ids for all three;
 * that the windows' encoder rows differ, and equal each alone bitwise, test_whisper_encoder
 * checks. */
static void test_whisper_encode_batched(void **state) {
    (void)state;
    ms_st_file *f = ms_test_ref_open("hf/whisper_tiny");
    size_t nf, ns, ng;
    float *feat = ms_test_ref_tensor(f, "input_features", false, &nf);
    int32_t *start = ms_test_ref_tensor(f, "decoder_start_ids", true, &ns);
    int32_t *greedy = ms_test_ref_tensor(f, "greedy_ids", true, &ng);
    ms_engine *e = open_engine("hf/whisper_tiny", 6, 128);
    float *in[3];
    for (int k = 0; k < 3; k++) {
        in[k] = ms_malloc(nf * sizeof(float));
        assert_non_null(in[k]);
    }
    for (size_t c = 0; c < 80; c++)
        for (size_t t = 0; t < 64; t++) {
            in[0][c * 64 + t] = feat[c * 64 + t];
            in[1][c * 64 + t] = 0.5f * feat[c * 64 + t] + 0.25f;
            in[2][c * 64 + t] = feat[c * 64 + (63 - t)];
        }
    ms_error err = {0};
    ms_engine_transcript alone[3];
    for (int k = 0; k < 3; k++) {
        alone[k] = (ms_engine_transcript){.features = in[k], .n_channels = 80, .n_frames = 64,
                                          .prompt = start, .n_prompt = (int32_t)ns,
                                          .max_new_tokens = (int32_t)ng};
        if (ms_engine_transcribe(e, &alone[k], 1, &err) != MS_OK)
            fail_msg("transcribe window %d alone: %s", k, err.msg);
    }
    ms_rid rid[3];
    for (int k = 0; k < 3; k++) {
        ms_engine_request rq = {.prompt = start, .n_prompt = (int32_t)ns,
                                .max_new_tokens = (int32_t)ng, .sampling = ms_sampling_greedy(),
                                .features = in[k], .n_feature_channels = 80,
                                .n_feature_frames = 64};
        if (ms_engine_add(e, &rq, &rid[k], &err) != MS_OK)
            fail_msg("add window %d: %s", k, err.msg);
    }
    ms_engine_step_info info;
    if (ms_engine_step(e, &info, &err) != MS_OK)
        fail_msg("encode step: %s", err.msg);
    assert_int_equal(info.n_seqs, 3); /* every window in one forward */
    assert_int_equal(info.n_tokens, 3 * 32);
    int guard = 0;
    while (ms_engine_n_active(e) > 0 && guard++ < 200)
        if (ms_engine_step(e, NULL, &err) != MS_OK)
            fail_msg("step: %s", err.msg);
    for (int k = 0; k < 3; k++) {
        const int32_t *ids;
        int32_t n;
        assert_int_equal(ms_engine_output(e, rid[k], &ids, &n, NULL), MS_OK);
        assert_int_equal(n, alone[k].n_ids);
        for (int32_t j = 0; j < n; j++)
            if (ids[j] != alone[k].ids[j])
                fail_msg("window %d id %d: %d batched, %d alone", k, (int)j, (int)ids[j],
                         (int)alone[k].ids[j]);
        ms_engine_remove(e, rid[k]);
    }
    for (int32_t j = 0; j < alone[0].n_ids && j < (int32_t)ng; j++)
        assert_int_equal(alone[0].ids[j], greedy[j]);
    printf("    3 windows encoded in one step (96 rows), each decodes its ids alone (%d, %d, %d)\n",
           (int)alone[0].n_ids, (int)alone[1].n_ids, (int)alone[2].n_ids);
    for (int k = 0; k < 3; k++) {
        ms_free(alone[k].ids);
        ms_free(in[k]);
    }
    ms_engine_free(e);
    ms_free(feat);
    ms_free(start);
    ms_free(greedy);
    ms_st_file_free(f);
}

/* Run the transcribe verb with argv, its stdout into out[cap]; returns its exit status. */
static int run_verb(int argc, char **argv, char *out, size_t cap) {
    char path[] = "/tmp/ms_whisper_cli_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    fflush(stdout);
    int saved = dup(1);
    assert_true(saved >= 0);
    assert_int_equal(dup2(fd, 1), 1);
    int rc = ms_cli_transcribe(argc, argv, &ms_whisper_desc, "whisper");
    fflush(stdout);
    assert_int_equal(dup2(saved, 1), 1);
    close(saved);
    ssize_t n = pread(fd, out, cap - 1, 0);
    out[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(path);
    return rc;
}

/* The transcribe verb over a safetensors tensor (--features FILE:NAME), twice in one batch:
 * whisper_tiny has no tokenizer.json, so each window prints its ids, the reference's up to the
 * eos id. Bad flags and tensors: exit 2 / 1. */
static void test_whisper_cli(void **state) {
    (void)state;
    char feat[1100], model[1024], bad[1100];
    snprintf(model, sizeof model, "%s", ms_test_fixture("hf/whisper_tiny"));
    snprintf(feat, sizeof feat, "%s/reference.safetensors:input_features", model);
    snprintf(bad, sizeof bad, "%s/reference.safetensors:greedy_ids", model);
    ms_st_file *f = ms_test_ref_open("hf/whisper_tiny");
    size_t ng;
    int32_t *greedy = ms_test_ref_tensor(f, "greedy_ids", true, &ng);
    char want[4096] = "";
    size_t w = 0;
    for (size_t j = 0; j < ng; j++) {
        w += (size_t)snprintf(want + w, sizeof want - w, "%s%d", j ? " " : "", (int)greedy[j]);
        if (greedy[j] == 2)
            break; /* the eos id ends the window */
    }
    char out[16384];
    char *argv[] = {"--model", model, "--features", feat, "--features", feat, "--prompt", "3",
                    "--max-new-tokens", "20", "--threads", "2", "--device", "cpu"};
    assert_int_equal(run_verb((int)MS_ARRAY_LEN(argv), argv, out, sizeof out), 0);
    char expect[8300];
    snprintf(expect, sizeof expect, "%s\n%s\n", want, want);
    assert_string_equal(out, expect);
    char *argv2[] = {"--model", model, "--features", bad, "--prompt", "3", "--device", "cpu"};
    assert_int_equal(run_verb((int)MS_ARRAY_LEN(argv2), argv2, out, sizeof out), 1);
    char *argv3[] = {"--model", model};
    assert_int_equal(run_verb((int)MS_ARRAY_LEN(argv3), argv3, out, sizeof out), 2);
    char *argv4[] = {"--model", model, "--features", "nocolon"};
    assert_int_equal(run_verb((int)MS_ARRAY_LEN(argv4), argv4, out, sizeof out), 1);
    ms_free(greedy);
    ms_st_file_free(f);
}

static void test_whisper_base(void **state) {
    (void)state;
    if (MS_SANITIZED) {
        printf("    skipped under a sanitizer: whisper_base runs in the plain build\n");
        skip();
    }
    const char *all = getenv("MS_WHISPER_ALL");
    const int n_clips = all != NULL && strcmp(all, "1") == 0 ? 3 : 1;
    ms_st_file *f = ms_test_ref_open("hf/whisper_base");
    size_t np;
    int32_t *prompt = ms_test_ref_tensor(f, "prompt_ids", true, &np);
    ms_engine *e = open_engine("hf/whisper_base", 3 * n_clips, 1536);
    const size_t V = (size_t)ms_engine_facts(e)->vocab;
    const int32_t free0 = ms_engine_kv_pages_free(e);
    float *feat[3] = {NULL}, *logits[3] = {NULL};
    int32_t *greedy[3] = {NULL};
    size_t ng[3] = {0};
    ms_rid rid[3];
    ms_error err = {0};
    for (int k = 0; k < n_clips; k++) {
        char name[64];
        size_t n;
        snprintf(name, sizeof name, "a%d.input_features", k);
        feat[k] = ms_test_ref_tensor(f, name, false, &n);
        snprintf(name, sizeof name, "a%d.logits", k);
        logits[k] = ms_test_ref_tensor(f, name, false, &n);
        snprintf(name, sizeof name, "a%d.greedy_ids", k);
        greedy[k] = ms_test_ref_tensor(f, name, true, &ng[k]);
        ms_engine_request rq = {.prompt = prompt, .n_prompt = (int32_t)np,
                                .max_new_tokens = 64, .sampling = ms_sampling_greedy(),
                                .features = feat[k], .n_feature_channels = 80,
                                .n_feature_frames = 3000};
        if (ms_engine_add(e, &rq, &rid[k], &err) != MS_OK)
            fail_msg("add %d: %s", k, err.msg);
    }
    /* decode steps of all clips run as one batch once every clip is encoded and prefilled */
    int step[3] = {0};
    double worst[3] = {0.0};
    int guard = 0;
    while (ms_engine_n_active(e) > 0 && guard++ < 400) {
        if (ms_engine_step(e, NULL, &err) != MS_OK)
            fail_msg("step: %s", err.msg);
        for (int k = 0; k < n_clips; k++) {
            const float *lg = ms_engine_last_logits(e, rid[k]);
            if (lg == NULL)
                continue;
            if (step[k] < 4) {
                double d = max_diff(lg, logits[k] + (size_t)step[k] * V, V);
                worst[k] = d > worst[k] ? d : worst[k];
            }
            step[k]++;
        }
    }
    for (int k = 0; k < n_clips; k++) {
        const int32_t *ids;
        int32_t n;
        ms_finish_reason why;
        assert_int_equal(ms_engine_output(e, rid[k], &ids, &n, &why), MS_OK);
        printf("    a%d: %d ids (%s), logits of the first 4 steps max |diff| %.3g\n", k, (int)n,
               ms_finish_reason_str(why), worst[k]);
        if (!(worst[k] <= 5e-3))
            fail_msg("a%d logits: max |diff| %g over 5e-3", k, worst[k]);
        assert_int_equal(n, (int)ng[k]);
        for (int32_t j = 0; j < n; j++)
            if (ids[j] != greedy[k][j])
                fail_msg("a%d id %d: %d, reference %d", k, (int)j, (int)ids[j],
                         (int)greedy[k][j]);
        assert_int_equal(why, MS_FINISH_EOS);
        ms_engine_remove(e, rid[k]);
        ms_free(feat[k]);
        ms_free(logits[k]);
        ms_free(greedy[k]);
    }
    assert_int_equal(ms_engine_kv_pages_free(e), free0);
    ms_engine_free(e);
    ms_free(prompt);
    ms_st_file_free(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_whisper_tiny),
        ms_unit_test(test_whisper_transcribe),
        ms_unit_test(test_whisper_join),
        ms_unit_test(test_whisper_encode_batched),
        ms_unit_test(test_whisper_cli),
        ms_unit_test(test_whisper_base),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
