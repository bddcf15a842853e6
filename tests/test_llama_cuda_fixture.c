/*
 * test_llama_cuda_fixture.c - the causal-LM forward of fixture_forward.h (the one
 * test_llama_cpu_fixture.c runs) on the CUDA backend, with bf16 weights and KV, against Hugging
 * Face's reference logits and against the CPU backend's greedy ids (GPU_TESTS: `make gpu-test`).
 *
 * Acceptance (issue 5): prefill and decode logits within 2e-2 relative error (||gpu - ref|| /
 * ||ref|| per row, worst row) of the float32 reference, and greedy ids equal to the CPU
 * backend's for at least the first 16 generated tokens (all of them when a fixture has fewer);
 * the CPU backend runs over the same bf16 weights and KV (with float32 weights, llama_gqa prompt
 * 1 parts at step 10 on a near tie that bf16 weight rounding alone flips, device run of
 * 2026-11-29). Decode rows are compared with the reference only while the GPU's ids still equal
 * the reference's (after a divergence the reference logits describe another sequence).
 * Fixtures, page size 16 unless said:
 *   - llama_gqa (GQA 4, head_dim 16, ragged batch of 37/5/64/1 tokens),
 *   - mistral_window (window 8 with released pages),
 *   - llama31_rope and llama31_rope_legacy (llama3 scaling, tied embeddings, both config layouts),
 *   - qwen3 (per-head q/k RMSNorm over the q and k columns of the QKV output; head_dim 48, which
 *     the decode template does not take, so decode steps run the prefill kernel),
 *   - qwen2vl_mrope (q/k/v biases, M-RoPE sections [4, 6, 6] over explicit t/h/w position
 *     streams; prefill only: logits of every position),
 *   - llama_cfg (classifier-free guidance: the mixed log-probs within 2e-2 relative
 *     of the reference per step, the guided ids equal to the CPU backend's),
 *   - llama2c/aidreams260K (llama2.c .bin, interleaved RoPE; the golden file has ids, no logits:
 *     the GPU's generated ids equal the CPU backend's for the first 16+ tokens of each case).
 * Whisper is not run here: its encoder ops (conv1d, GELU, LayerNorm) exist only on the CPU.
 */
#include "ms_test.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backend_cuda.h"
#include "checkpoint.h"
#include "hf_config.h"
#include "ms_test_impl.h"
#include "tokenizer_llama2c.h"

#include "fixture_forward.h"

#define TOL 2e-2f   /* relative, bf16 weights and KV */
#define SAME_IDS 16 /* generated ids that must equal the CPU backend's */

/* Backend `which`: 0 the CPU backend (2 threads), 1 the CUDA backend on device 0. */
static void backend_init(ms_backend *be, int which) {
    ms_error err = {0};
    if (which == 0) {
        CHECK(ms_backend_cpu_init(be, &(ms_backend_cpu_options){2}, &err));
    } else {
        const char *c = getenv("MS_KERNEL_CACHE_TEST");
        ms_backend_cuda_options o = {0, c != NULL && c[0] ? c : "build/kernel-cache-test"};
        CHECK(ms_backend_cuda_init(be, &o, &err));
    }
}

/* Leading entries where a and b agree (at most n). */
static int same_prefix(const int32_t *a, const int32_t *b, int n) {
    int k = 0;
    while (k < n && a[k] == b[k])
        k++;
    return k;
}

/* ---- Hugging Face fixtures with prompts and greedy decode ---- */

/* One fixture: the CPU backend and the CUDA backend, both over bf16 weights and KV, run all
 * prompts as one ragged batch with page size 16; the GPU's logits against the float32 reference,
 * its ids against the CPU backend's on the same rounded parameters. */
static void check_fixture(const char *rel) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", ms_test_fixture(rel));
    prompt_ref pr[MAX_SEQS];
    ref_file rf;
    memset(pr, 0, sizeof pr);
    int np = load_prompts(dir, pr, &rf);
    assert_true(np >= 1);
    int total = 0, most = 0;
    for (int i = 0; i < np; i++)
        total += (int)pr[i].len, most = MS_MAX(most, (int)(pr[i].len + pr[i].n_new));
    const int ps = 16, all[MAX_SEQS] = {0, 1, 2, 3};
    run_result *r = ms_calloc(2, sizeof *r);
    assert_non_null(r);
    for (int which = 0; which < 2; which++) {
        ms_backend be;
        backend_init(&be, which);
        model m;
        /* both backends hold the same bf16 weights and KV, so their greedy ids can only part
           where activation rounding (bf16 GEMM inputs on CUDA) flips a near tie */
        model_load(&m, &be, dir, MS_DTYPE_BF16);
        model_plan(&m, MS_MAX(total, np), np * (most / ps + 2) + 2, ps);
        run_batch(&m, pr, all, np, ps, &r[which]);
        model_free(&m);
        ms_backend_free(&be);
    }
    int n_same = 0;
    for (int i = 0; i < np; i++) {
        int k = same_prefix(r[1].ids[i], r[0].ids[i], (int)pr[i].n_new);
        if (k < MS_MIN(SAME_IDS, (int)pr[i].n_new))
            fail_msg("%s prompt %d: GPU id %d at step %d, CPU backend %d", rel, i, r[1].ids[i][k],
                     k, r[0].ids[i][k]);
        n_same = i == 0 ? k : MS_MIN(n_same, k);
    }
    printf("fixture %-22s %d prompt(s), page size 16: GPU relative error prefill %.2e, decode "
           "%.2e (tol %.0e); GPU ids equal the CPU backend's for the first %d+ steps\n",
           rel, np, (double)r[1].rel_prefill, (double)r[1].rel_decode, (double)TOL, n_same);
    if (!(r[1].rel_prefill < TOL && r[1].rel_decode < TOL))
        fail_msg("%s: relative error prefill %g decode %g (tolerance %g)", rel,
                 (double)r[1].rel_prefill, (double)r[1].rel_decode, (double)TOL);
    ms_free(r);
    free_prompts(pr, np, &rf);
}

static void test_llama_gqa(void **state) {
    (void)state;
    check_fixture("hf/llama_gqa");
}

static void test_mistral_window(void **state) {
    (void)state;
    check_fixture("hf/mistral_window");
}

static void test_llama31_rope(void **state) {
    (void)state;
    check_fixture("hf/llama31_rope");
}

static void test_llama31_rope_legacy(void **state) {
    (void)state;
    check_fixture("hf/llama31_rope_legacy");
}

static void test_qwen3(void **state) {
    (void)state;
    check_fixture("hf/qwen3");
}

/* ---- Qwen2-VL text path: M-RoPE with explicit t/h/w position streams ---- */

static void test_qwen2vl_mrope(void **state) {
    (void)state;
    mrope_result r[2];
    for (int which = 0; which < 2; which++) {
        ms_backend be;
        backend_init(&be, which);
        run_mrope(&be, MS_DTYPE_BF16, &r[which]);
        ms_backend_free(&be);
    }
    printf("fixture hf/qwen2vl_mrope        1 prompt of %lld tokens (M-RoPE sections %d/%d/%d): "
           "GPU relative error %.2e (tol %.0e; CPU backend over the same bf16 weights %.2e)\n",
           (long long)r[1].n_tokens, r[1].sections[0], r[1].sections[1], r[1].sections[2],
           (double)r[1].rel, (double)TOL, (double)r[0].rel);
    if (!(r[1].rel < TOL))
        fail_msg("qwen2vl_mrope: relative error %g (tolerance %g)", (double)r[1].rel, (double)TOL);
}

/* ---- classifier-free guidance: cond and uncond streams of one request in one batch ---- */

static void test_llama_cfg(void **state) {
    (void)state;
    cfg_result r[2];
    for (int which = 0; which < 2; which++) {
        ms_backend be;
        backend_init(&be, which);
        run_cfg(&be, MS_DTYPE_BF16, 16, &r[which]);
        ms_backend_free(&be);
    }
    int n = (int)r[1].n_new, k = same_prefix(r[1].ids, r[0].ids, n);
    if (k < MS_MIN(SAME_IDS, n))
        fail_msg("llama_cfg: GPU guided id %d at step %d, CPU backend %d", r[1].ids[k], k,
                 r[0].ids[k]);
    printf("fixture hf/llama_cfg            %lld guided steps: GPU relative error of the mixed "
           "log-probs %.2e (tol %.0e, %lld steps on the reference's ids); GPU ids equal the CPU "
           "backend's for the first %d steps\n",
           (long long)r[1].n_new, (double)r[1].rel, (double)TOL, (long long)r[1].same, k);
    if (!(r[1].rel < TOL))
        fail_msg("llama_cfg: relative error %g (tolerance %g)", (double)r[1].rel, (double)TOL);
}

/* ---- llama2.c: aidreams260K's golden prompts (ids only) ---- */

static void test_llama2c_aidreams(void **state) {
    (void)state;
    ms_error err = {0};
    char bin[2048], tokp[2048], golden[2048];
    snprintf(bin, sizeof bin, "%s", ms_test_fixture("llama2c/aidreams260K.bin"));
    snprintf(tokp, sizeof tokp, "%s", ms_test_fixture("llama2c/tok512.bin"));
    snprintf(golden, sizeof golden, "%s", ms_test_fixture("llama2c/aidreams260K.golden.json"));
    json_error_t je;
    json_t *g = json_load_file(golden, 0, &je);
    if (g == NULL)
        fail_msg("%s: %s", golden, je.text);
    json_t *cases = json_object_get(g, "cases");
    int n = (int)json_array_size(cases);
    assert_true(n >= 1 && n <= MAX_SEQS);
    int32_t *prompts[MAX_SEQS];
    int lens[MAX_SEQS], steps = 0;
    int32_t (*out)[MAX_SEQS][GOLDEN_MAX] = ms_calloc(2, sizeof *out);
    assert_non_null(out);
    for (int which = 0; which < 2; which++) {
        ms_backend be;
        backend_init(&be, which);
        model m;
        model_load(&m, &be, bin, MS_DTYPE_BF16);
        assert_int_equal(m.rope.style, MS_ROPE_INTERLEAVED);
        if (which == 0) {
            ms_llama2c_tok *tok = NULL;
            CHECK(ms_llama2c_tok_init(&tok, tokp, m.vocab, &err));
            for (int i = 0; i < n; i++) {
                json_t *c = json_array_get(cases, (size_t)i);
                size_t np;
                CHECK(ms_llama2c_tok_encode(tok, json_string_value(json_object_get(c, "prompt")),
                                            true, false, &prompts[i], &np, &err));
                lens[i] = (int)np;
                steps = (int)json_integer_value(json_object_get(c, "steps"));
                assert_true(lens[i] < steps && steps < GOLDEN_MAX);
            }
            ms_llama2c_tok_free(tok);
        }
        model_plan(&m, 256, n * (GOLDEN_MAX / 16 + 2) + 2, 16);
        greedy_batch(&m, prompts, lens, n, steps + 1, 16, out[which]);
        model_free(&m);
        ms_backend_free(&be);
    }
    int n_same = 0, n_golden = 0;
    for (int i = 0; i < n; i++) {
        int gen = steps + 1 - lens[i];
        int k = same_prefix(out[1][i] + lens[i], out[0][i] + lens[i], gen);
        if (k < MS_MIN(SAME_IDS, gen))
            fail_msg("aidreams case %d: GPU id %d at generated token %d, CPU backend %d", i,
                     out[1][i][lens[i] + k], k, out[0][i][lens[i] + k]);
        n_same = i == 0 ? k : MS_MIN(n_same, k);
        json_t *ids = json_object_get(json_array_get(cases, (size_t)i), "token_ids");
        int j = 0;
        while (j < (int)json_array_size(ids) && out[1][i][j] == json_integer_value(json_array_get(ids, (size_t)j)))
            j++;
        n_golden = i == 0 ? j : MS_MIN(n_golden, j);
    }
    printf("llama2c aidreams260K: %d cases, page size 16: GPU ids equal the CPU backend's (bf16) "
           "for the first %d+ generated tokens; run.c's golden (f32) for the first %d positions\n",
           n, n_same, n_golden);
    for (int i = 0; i < n; i++)
        ms_free(prompts[i]);
    ms_free(out);
    json_decref(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_llama_gqa),
        ms_unit_test(test_mistral_window),
        ms_unit_test(test_llama31_rope),
        ms_unit_test(test_llama31_rope_legacy),
        ms_unit_test(test_qwen3),
        ms_unit_test(test_qwen2vl_mrope),
        ms_unit_test(test_llama_cfg),
        ms_unit_test(test_llama2c_aidreams),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
