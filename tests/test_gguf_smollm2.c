/*
 * test_gguf_smollm2.c - a real quantized chat model end to end on the CPU: SmolLM2-135M-Instruct
 * in Q4_1 GGUF (fetched from PyPI by scripts/fetch-model.sh, the one way tests get it) run by the
 * engine over the descriptor mstarc generates from models/llama.mstar, against
 * ../shared/fixtures/gguf/smollm2 (transformers loading the same GGUF, float32 eager attention):
 * for each of the 5 cases, the logits of the last prompt position and of decode steps 1..7 within
 * 1e-3 max abs of reference.safetensors pK.logits, and all 48 greedy ids equal to pK.greedy_ids
 * (EOS not special). The 5 prompts run as one ragged batch (page size 16).
 * Token ids come from reference.safetensors pK.input_ids, not from a tokenizer.
 * When the model cannot be fetched (no network, no pip), the test says so and is skipped.
 */
#include "ms_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "safetensors.h"

#include "fixture_ref.h"
#include "ms_test_impl.h"

extern const ms_model_desc ms_llama_desc;

#define TOL 1e-3f
#define N_CASES 5
#define N_NEW 48
#define N_LOGITS 8

/* The path scripts/fetch-model.sh prints, or NULL (with the reason printed) when it fails. */
static char *fetch_model(void) {
    FILE *p = popen("scripts/fetch-model.sh smollm2", "r");
    if (p == NULL)
        return NULL;
    char line[4096] = {0};
    char *got = fgets(line, sizeof line, p);
    int rc = pclose(p);
    if (got == NULL || rc != 0)
        return NULL;
    line[strcspn(line, "\n")] = '\0';
    return ms_strdup(line);
}

static void test_smollm2_q4_1_cpu(void **state) {
    (void)state;
    char *model = fetch_model();
    if (model == NULL) {
        printf("test_gguf_smollm2: SKIPPED: scripts/fetch-model.sh smollm2 could not fetch the model "
               "(see its message above)\n");
        skip();
    }
    ms_st_file *ref = ms_test_ref_open("gguf/smollm2");
    int32_t *ids[N_CASES], *greedy[N_CASES];
    float *logits[N_CASES];
    size_t n_ids[N_CASES];
    for (int c = 0; c < N_CASES; c++) {
        char name[64];
        size_t n;
        snprintf(name, sizeof name, "p%d.input_ids", c);
        ids[c] = ms_test_ref_tensor(ref, name, true, &n_ids[c]);
        snprintf(name, sizeof name, "p%d.greedy_ids", c);
        greedy[c] = ms_test_ref_tensor(ref, name, true, &n);
        assert_int_equal(n, N_NEW);
        snprintf(name, sizeof name, "p%d.logits", c);
        logits[c] = ms_test_ref_tensor(ref, name, false, &n);
        assert_int_equal(n % N_LOGITS, 0);
    }
    ms_st_file_free(ref);

    ms_engine_options o = ms_engine_options_default();
    o.model_path = model;
    o.page_size = 16;
    o.max_seqs = N_CASES;
    o.max_tokens = 512;
    o.max_seq_len = 320;
    o.n_threads = 2;
    ms_engine *e = NULL;
    ms_error err = {0};
    if (ms_engine_init(&e, &ms_llama_desc, &o, &err) != MS_OK)
        fail_msg("engine init %s: %s", model, err.msg);
    const int32_t V = ms_engine_facts(e)->vocab;
    assert_int_equal(V, 49152);
    ms_rid rid[N_CASES];
    for (int c = 0; c < N_CASES; c++) {
        ms_engine_request rq = {.prompt = ids[c], .n_prompt = (int32_t)n_ids[c], .max_new_tokens = N_NEW,
                                .sampling = ms_sampling_greedy(), .ignore_eos = true};
        if (ms_engine_add(e, &rq, &rid[c], &err) != MS_OK)
            fail_msg("add case %d: %s", c, err.msg);
    }
    float worst[N_CASES] = {0};
    int checked[N_CASES] = {0};
    while (ms_engine_n_active(e) > 0) {
        if (ms_engine_step(e, NULL, &err) != MS_OK)
            fail_msg("step: %s", err.msg);
        for (int c = 0; c < N_CASES; c++) {
            const int32_t *out;
            int32_t n_out;
            assert_int_equal(ms_engine_output(e, rid[c], &out, &n_out, NULL), MS_OK);
            /* n_out tokens so far: the logits that chose token n_out - 1 are row n_out - 1 */
            if (n_out == 0 || n_out - 1 != checked[c] || checked[c] >= N_LOGITS)
                continue;
            const float *lg = ms_engine_last_logits(e, rid[c]);
            assert_non_null(lg);
            const float *want = logits[c] + (size_t)checked[c] * (size_t)V;
            float d = 0.0f;
            for (int32_t v = 0; v < V; v++) {
                float x = fabsf(lg[v] - want[v]);
                d = isnan(x) ? INFINITY : fmaxf(d, x);
            }
            if (!(d < TOL))
                fail_msg("case %d: logits of %s %d differ by %g (tolerance %g)", c,
                         checked[c] == 0 ? "the last prompt position, step" : "decode step", checked[c],
                         (double)d, (double)TOL);
            worst[c] = fmaxf(worst[c], d);
            checked[c]++;
        }
    }
    for (int c = 0; c < N_CASES; c++) {
        const int32_t *out;
        int32_t n_out;
        assert_int_equal(ms_engine_output(e, rid[c], &out, &n_out, NULL), MS_OK);
        assert_int_equal(n_out, N_NEW);
        assert_int_equal(checked[c], N_LOGITS);
        for (int j = 0; j < N_NEW; j++)
            if (out[j] != greedy[c][j])
                fail_msg("case %d: greedy id %d: got %d, reference %d", c, j, (int)out[j], (int)greedy[c][j]);
        printf("smollm2 Q4_1 case %d: %zu prompt tokens, logits max abs error %.3g over %d rows, %d greedy ids "
               "equal\n", c, n_ids[c], (double)worst[c], N_LOGITS, N_NEW);
        ms_free(ids[c]);
        ms_free(greedy[c]);
        ms_free(logits[c]);
    }
    ms_engine_free(e);
    ms_free(model);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_smollm2_q4_1_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
