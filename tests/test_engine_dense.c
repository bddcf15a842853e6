/*
 * test_engine_dense.c - dense generation (block refinement, diffusion-LM style) through the engine
 * API: the descriptor mstarc generates from tests/codegen/dense.mstar (models/llama.mstar plus the
 * block steps `refine` - kv commit = false, pos advance = 0, attn causal = false - and
 * `commit_block` - committing, bidirectional inside the block), on the CPU in float32 against
 * ../shared/fixtures/hf/llama_dense (over the llama_gqa checkpoint): a prompt of P tokens
 * prefilled and committed; K refine steps over blocks of B ids at positions P..P+B-1, each
 * seeing the same prefix; a committing block step; one ordinary decode step feeding next_id.
 * Every logits tensor within 1e-3 (every block token's, the forward's all-rows output), and the
 * refine steps leave the free-page count and the stream length unchanged. A `branch` step
 * (kv pre_fork = main -> draft) forks the committed stream before main grows: draft holds the
 * prefix, main the prefix and the new tokens; remove frees both.
 */
#include "ms_test.h"
#include "ms_test_impl.h"

#include <math.h>
#include <string.h>

#include "engine.h"
#include "fixture_ref.h"
#include "safetensors.h"

extern const ms_model_desc ms_llama_dense_desc;

#define TOL 1e-3f

static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m))
            m = d;
    }
    return m;
}

static void test_dense_reference(void **state) {
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/reference.safetensors", ms_test_fixture("hf/llama_dense"));
    ms_st_file *f = NULL;
    ms_error err = {0};
    assert_int_equal(ms_st_file_init(&f, path, &err), MS_OK);
    size_t np, n;
    int32_t *prompt = ms_test_ref_tensor(f, "prompt_ids", true, &np);
    float *pre = ms_test_ref_tensor(f, "prefill_logits", false, &n);

    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture("hf/llama_gqa"); /* reference.json: "checkpoint" */
    o.max_seqs = 2;
    o.max_tokens = 64;
    ms_engine *e = NULL;
    if (ms_engine_init(&e, &ms_llama_dense_desc, &o, &err) != MS_OK)
        fail_msg("engine: %s", err.msg);
    const size_t V = (size_t)ms_engine_facts(e)->vocab;
    const int32_t free0 = ms_engine_kv_pages_free(e);
    assert_int_equal(n, np * V);

    /* the committed prefix, through the walk (prefill samples the first id: unused here) */
    ms_engine_request rq = {.prompt = prompt, .n_prompt = (int32_t)np, .max_new_tokens = 8,
                            .sampling = ms_sampling_greedy(), .ignore_eos = true};
    ms_rid rid;
    assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_OK);
    assert_int_equal(ms_engine_step(e, NULL, &err), MS_OK);
    const float *lg = ms_engine_last_logits(e, rid);
    assert_non_null(lg);
    double d = max_diff(lg, pre + (np - 1) * V, V);
    print_message("prefill (last row): %.3g\n", d);
    assert_true(d < TOL);
    assert_int_equal(ms_engine_stream_length(e, rid, 0), (int32_t)np);

    /* refine steps: every block row's logits; nothing committed, no page taken */
    const int32_t free_prefix = ms_engine_kv_pages_free(e);
    for (int k = 0;; k++) {
        char name[64];
        snprintf(name, sizeof name, "refine%d.block_ids", k);
        const ms_st_tensor *t = ms_st_file_find_tensor(f, name);
        if (t == NULL) {
            assert_true(k > 0);
            break;
        }
        size_t nb, nl;
        int32_t *block = ms_test_ref_tensor(f, name, true, &nb);
        snprintf(name, sizeof name, "refine%d.logits", k);
        float *want = ms_test_ref_tensor(f, name, false, &nl);
        assert_int_equal(nl, nb * V);
        const float *got;
        int32_t rows;
        assert_int_equal(ms_engine_run_step(e, rid, "refine", block, (int32_t)nb, &got, &rows,
                                            &err), MS_OK);
        assert_int_equal(rows, (int32_t)nb);
        d = max_diff(got, want, nb * V);
        print_message("refine %d (%zu rows): %.3g\n", k, nb, d);
        assert_true(d < TOL);
        assert_int_equal(ms_engine_stream_length(e, rid, 0), (int32_t)np);
        assert_int_equal(ms_engine_kv_pages_free(e), free_prefix);
        ms_free(block);
        ms_free(want);
    }

    /* the committing block step, then one ordinary decode step over the committed block */
    size_t nb, nl, nn;
    int32_t *block = ms_test_ref_tensor(f, "commit.block_ids", true, &nb);
    float *want = ms_test_ref_tensor(f, "commit.logits", false, &nl);
    const float *got;
    int32_t rows;
    assert_int_equal(ms_engine_run_step(e, rid, "commit_block", block, (int32_t)nb, &got, &rows,
                                        &err), MS_OK);
    assert_int_equal(rows, (int32_t)nb);
    d = max_diff(got, want, nb * V);
    print_message("commit block: %.3g\n", d);
    assert_true(d < TOL);
    assert_int_equal(ms_engine_stream_length(e, rid, 0), (int32_t)(np + nb));
    int32_t *next = ms_test_ref_tensor(f, "decode.next_id", true, &nn);
    float *dec = ms_test_ref_tensor(f, "decode.logits", false, &nl);
    assert_int_equal(ms_engine_run_step(e, rid, "decode", next, 1, &got, &rows, &err), MS_OK);
    assert_int_equal(rows, 1);
    d = max_diff(got, dec, V);
    print_message("decode after the block: %.3g\n", d);
    assert_true(d < TOL);
    assert_int_equal(ms_engine_stream_length(e, rid, 0), (int32_t)(np + nb + 1));

    /* a fork before plan: draft gets main's committed tokens, then main grows */
    const int32_t main_len = ms_engine_stream_length(e, rid, 0);
    assert_int_equal(ms_engine_stream_length(e, rid, 1), -1);
    static const int32_t two[] = {5, 6};
    assert_int_equal(ms_engine_run_step(e, rid, "branch", two, 2, &got, &rows, &err), MS_OK);
    assert_int_equal(ms_engine_stream_length(e, rid, 1), main_len);
    assert_int_equal(ms_engine_stream_length(e, rid, 0), main_len + 2);

    /* refusals */
    assert_int_equal(ms_engine_run_step(e, rid, "nope", next, 1, &got, &rows, &err),
                     MS_ERR_NOT_FOUND);
    assert_int_equal(ms_engine_run_step(e, rid + 100, "refine", next, 1, &got, &rows, &err),
                     MS_ERR_NOT_FOUND);
    static const int32_t bad[] = {100000};
    assert_int_equal(ms_engine_run_step(e, rid, "refine", bad, 1, &got, &rows, &err),
                     MS_ERR_INVALID_ARG);
    ms_engine_remove(e, rid);
    assert_int_equal(ms_engine_kv_pages_free(e), free0);
    ms_engine_free(e);
    ms_free(block);
    ms_free(want);
    ms_free(next);
    ms_free(dec);
    ms_free(prompt);
    ms_free(pre);
    ms_st_file_free(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_dense_reference),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
