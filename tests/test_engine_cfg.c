/*
 * test_engine_cfg.c - batched classifier-free guidance end to end through the engine API and the
 * descriptor mstarc generates from models/llama.mstar (its `guided` walk: prefill_guided then
 * decode_guided over main and cfg_uncond, combined into one attention plan `cfg`), on the CPU in
 * float32 against ../shared/fixtures/hf/llama_cfg (reference.safetensors: cond_ids, uncond_ids,
 * greedy_ids [25], mixed_logprobs [25, vocab] = logsoftmax(uncond) + 3 * (logsoftmax(cond) -
 * logsoftmax(uncond)), the argmax appended to both sequences):
 *   - ids equal, mixed log-probs within 1e-3 at every step;
 *   - the pair is ONE request (one rid, one output), its two streams take two of max_seqs;
 *   - a plain request batched beside it gives the ids it gives alone; free pages return to their
 *     initial count after remove;
 *   - explicit position ids are refused by a walk that declares none;
 *   - a randomized property run over tests/codegen/dense.mstar's descriptor (llama's walks plus
 *     dense generation's block steps): plain requests and guided pairs join and leave at random
 *     (some removed mid-walk) while the scheduler interleaves prefill, decode and guided steps,
 *     and non-committing `refine` blocks of random length run between steps on random decoding
 *     requests (ms_engine_run_step: the stream's length never moves, and a block takes the
 *     pages it needs beyond those held once, keeping them for the next refine); after
 *     every step each stream holds exactly its prompt plus its ids so far (a pair's two streams
 *     the same ids) and the free-page count equals the initial count less every stream's pages;
 *     every request's ids equal those it gives alone. The seed is printed; MS_SEED=<n>
 *     reproduces a run.
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

extern const ms_model_desc ms_llama_desc;
extern const ms_model_desc ms_llama_dense_desc; /* llama + refine / commit_block / branch steps */

#define TOL 1e-3f

static ms_engine *open_cfg(int32_t max_seqs) {
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture("hf/llama_cfg");
    o.max_seqs = max_seqs;
    o.max_tokens = 64;
    ms_engine *e = NULL;
    ms_error err = {0};
    if (ms_engine_init(&e, &ms_llama_desc, &o, &err) != MS_OK)
        fail_msg("engine: %s", err.msg);
    return e;
}

static void test_cfg_reference(void **state) {
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/reference.safetensors", ms_test_fixture("hf/llama_cfg"));
    ms_st_file *f = NULL;
    ms_error err = {0};
    assert_int_equal(ms_st_file_init(&f, path, &err), MS_OK);
    size_t nc, nu, ng, nm;
    int32_t *cond = ms_test_ref_tensor(f, "cond_ids", true, &nc);
    int32_t *uncond = ms_test_ref_tensor(f, "uncond_ids", true, &nu);
    int32_t *greedy = ms_test_ref_tensor(f, "greedy_ids", true, &ng);
    float *mixed = ms_test_ref_tensor(f, "mixed_logprobs", false, &nm);
    ms_engine *e = open_cfg(4);
    const int32_t V = ms_engine_facts(e)->vocab;
    assert_int_equal(nm, ng * (size_t)V);
    const int32_t free0 = ms_engine_kv_pages_free(e);

    ms_engine_request rq = {.prompt = cond, .n_prompt = (int32_t)nc,
                            .max_new_tokens = (int32_t)ng, .sampling = ms_sampling_greedy(),
                            .ignore_eos = true, .negative_prompt = uncond,
                            .n_negative_prompt = (int32_t)nu, .guidance_scale = 3.0f};
    ms_rid rid;
    assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_OK);
    assert_int_equal(ms_engine_n_active(e), 1);
    /* a plain request beside the pair: max_seqs 4 = 2 streams + 1, room for one more pair no */
    static const int32_t plain_ids[] = {1, 17, 33, 250};
    ms_engine_request pq = {.prompt = plain_ids, .n_prompt = 4, .max_new_tokens = 8,
                            .sampling = ms_sampling_greedy(), .ignore_eos = true};
    ms_rid prid;
    assert_int_equal(ms_engine_add(e, &pq, &prid, &err), MS_OK);
    ms_rid extra;
    assert_int_equal(ms_engine_add(e, &rq, &extra, &err), MS_ERR_CAPACITY);

    double worst = 0.0;
    int32_t step = 0;
    while (ms_engine_n_active(e) > 0) {
        ms_engine_step_info info;
        assert_int_equal(ms_engine_step(e, &info, &err), MS_OK);
        const float *lg = ms_engine_last_logits(e, rid);
        if (lg == NULL)
            continue; /* a step of the plain request only */
        assert_true(step < (int32_t)ng);
        for (int32_t v = 0; v < V; v++) {
            double d = fabs((double)lg[v] - (double)mixed[(size_t)step * (size_t)V + (size_t)v]);
            if (d > worst)
                worst = d;
        }
        step++;
    }
    print_message("CFG hf/llama_cfg: %d steps, max |mixed - reference| = %.3g\n", (int)step,
                  worst);
    assert_int_equal(step, (int32_t)ng);
    assert_true(worst < TOL);
    const int32_t *out;
    int32_t n_out;
    ms_finish_reason why;
    assert_int_equal(ms_engine_output(e, rid, &out, &n_out, &why), MS_OK);
    assert_int_equal(n_out, (int32_t)ng);
    assert_int_equal(why, MS_FINISH_LENGTH);
    for (size_t i = 0; i < ng; i++)
        if (out[i] != greedy[i])
            fail_msg("id %zu: got %d, reference %d", i, (int)out[i], (int)greedy[i]);

    /* the plain request's ids equal those it gives alone */
    int32_t batched[8];
    assert_int_equal(ms_engine_output(e, prid, &out, &n_out, NULL), MS_OK);
    assert_int_equal(n_out, 8);
    memcpy(batched, out, sizeof batched);
    ms_engine_remove(e, rid);
    ms_engine_remove(e, prid);
    assert_int_equal(ms_engine_kv_pages_free(e), free0);
    assert_int_equal(ms_engine_add(e, &pq, &prid, &err), MS_OK);
    while (ms_engine_n_active(e) > 0)
        assert_int_equal(ms_engine_step(e, NULL, &err), MS_OK);
    assert_int_equal(ms_engine_output(e, prid, &out, &n_out, NULL), MS_OK);
    assert_memory_equal(out, batched, sizeof batched);
    ms_engine_remove(e, prid);
    assert_int_equal(ms_engine_kv_pages_free(e), free0);

    /* explicit positions: llama's walks declare no `pos explicit` step */
    static const int32_t pos[] = {0, 1, 2, 3};
    pq.position_ids = pos;
    pq.n_position_axes = 1;
    assert_int_equal(ms_engine_add(e, &pq, &prid, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "pos explicit"));

    ms_engine_free(e);
    ms_free(cond);
    ms_free(uncond);
    ms_free(greedy);
    ms_free(mixed);
    ms_st_file_free(f);
}

/* Bad guided requests: empty / out-of-vocabulary negative prompt, non-finite scale. */
static void test_cfg_bad_requests(void **state) {
    (void)state;
    ms_engine *e = open_cfg(2);
    ms_error err = {0};
    static const int32_t p[] = {1, 2, 3}, bad[] = {1, 512};
    ms_engine_request rq = {.prompt = p, .n_prompt = 3, .max_new_tokens = 2,
                            .sampling = ms_sampling_greedy(), .negative_prompt = bad,
                            .n_negative_prompt = 2, .guidance_scale = 2.0f};
    ms_rid rid;
    assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "negative prompt token 512 at index 1"));
    rq.n_negative_prompt = 0;
    assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "empty negative prompt"));
    rq.n_negative_prompt = 1;
    rq.guidance_scale = NAN;
    assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_ERR_INVALID_ARG);
    assert_int_equal(ms_engine_n_active(e), 0);
    ms_engine_free(e);
}

/* ---- randomized property run ---- */

#define P_REQS 48

typedef struct p_req {
    int32_t prompt[24], neg[12];
    int32_t n_prompt, n_neg, max_new;
    ms_rid rid;
    bool live;
    int32_t out[16];
    int32_t n_out;
    bool done;      /* finished normally: its ids are compared with a run alone */
    int32_t reach;  /* furthest token a refine block reached: its pages stay reserved (a
                       non-committing step keeps its reservation for the next refine and the
                       block's commit, kv_pool.h), so the main stream holds pages up to here */
} p_req;

static uint64_t p_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static ms_engine_request p_request(const p_req *q) {
    ms_engine_request rq = {.prompt = q->prompt, .n_prompt = q->n_prompt,
                            .max_new_tokens = q->max_new, .sampling = ms_sampling_greedy(),
                            .ignore_eos = true};
    if (q->n_neg > 0) {
        rq.negative_prompt = q->neg;
        rq.n_negative_prompt = q->n_neg;
        rq.guidance_scale = 2.5f;
    }
    return rq;
}

static int32_t pages_of(int32_t len, int32_t ps) { return (len + ps - 1) / ps; }

static void test_cfg_property(void **state) {
    (void)state;
    uint64_t seed = (uint64_t)time(NULL);
    const char *env = getenv("MS_SEED");
    if (env != NULL)
        seed = strtoull(env, NULL, 10);
    printf("engine walk property: seed %llu (MS_SEED=%llu reproduces)\n",
           (unsigned long long)seed, (unsigned long long)seed);
    uint64_t rs = seed * 2654435761u + 1;
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture("hf/llama_cfg");
    o.max_seqs = 6;
    o.max_tokens = 48;
    o.page_size = 4;
    ms_engine *e = NULL;
    ms_error err = {0};
    if (ms_engine_init(&e, &ms_llama_dense_desc, &o, &err) != MS_OK)
        fail_msg("engine: %s", err.msg);
    const int32_t V = ms_engine_facts(e)->vocab, ps = ms_engine_page_size(e);
    const int32_t free0 = ms_engine_kv_pages_free(e);
    int32_t uncond = -1;
    const ms_md_node *node = &ms_llama_dense_desc.nodes[0];
    for (int32_t l = 0; l < node->n_labels; l++)
        if (strcmp(node->labels[l], "cfg_uncond") == 0)
            uncond = l;
    assert_true(uncond > 0);
    int32_t n_refine = 0;
    p_req *q = ms_calloc(P_REQS, sizeof *q);
    assert_non_null(q);
    int32_t n_made = 0, n_steps = 0;
    while (n_steps < 400 && (n_made < P_REQS || ms_engine_n_active(e) > 0)) {
        /* join: a plain request or a guided pair, when there is room */
        if (n_made < P_REQS && p_next(&rs) % 3 != 0) {
            p_req *r = &q[n_made];
            r->n_prompt = 1 + (int32_t)(p_next(&rs) % 20);
            r->n_neg = p_next(&rs) % 2 ? 1 + (int32_t)(p_next(&rs) % 10) : 0;
            r->max_new = 1 + (int32_t)(p_next(&rs) % 12);
            for (int32_t i = 0; i < r->n_prompt; i++)
                r->prompt[i] = (int32_t)(p_next(&rs) % (uint64_t)V);
            for (int32_t i = 0; i < r->n_neg; i++)
                r->neg[i] = (int32_t)(p_next(&rs) % (uint64_t)V);
            ms_engine_request rq = p_request(r);
            ms_status st = ms_engine_add(e, &rq, &r->rid, &err);
            if (st == MS_OK) {
                r->live = true;
                n_made++;
            } else if (st != MS_ERR_CAPACITY) {
                fail_msg("seed %llu: add: %s", (unsigned long long)seed, err.msg);
            }
        }
        ms_engine_step_info info;
        if (ms_engine_step(e, &info, &err) != MS_OK)
            fail_msg("seed %llu step %d: %s", (unsigned long long)seed, (int)n_steps, err.msg);
        n_steps++;
        /* dense generation between steps: a refine block on a plain request past its prompt
           (recomputed over the committed stream, nothing committed: lengths and pages stay) */
        for (int32_t i = 0; i < n_made; i++) {
            p_req *r = &q[i];
            if (!r->live || r->n_neg > 0 || p_next(&rs) % 4 != 0)
                continue;
            const int32_t *out;
            int32_t n_out;
            ms_finish_reason why;
            assert_int_equal(ms_engine_output(e, r->rid, &out, &n_out, &why), MS_OK);
            if (why != MS_FINISH_NONE || n_out == 0)
                continue;
            int32_t block[8], nb = 1 + (int32_t)(p_next(&rs) % 8);
            for (int32_t k = 0; k < nb; k++)
                block[k] = (int32_t)(p_next(&rs) % (uint64_t)V);
            const int32_t len0 = ms_engine_stream_length(e, r->rid, 0);
            const int32_t free_before = ms_engine_kv_pages_free(e);
            /* the block takes the pages it needs beyond those the stream holds, once */
            const int32_t held = pages_of(MS_MAX(len0, r->reach), ps);
            const int32_t takes = MS_MAX(0, pages_of(len0 + nb, ps) - held);
            const float *lg;
            int32_t rows;
            if (ms_engine_run_step(e, r->rid, "refine", block, nb, &lg, &rows, &err) != MS_OK)
                fail_msg("seed %llu step %d: refine of %d on request %d: %s",
                         (unsigned long long)seed, (int)n_steps, (int)nb, (int)i, err.msg);
            assert_int_equal(rows, nb);
            if (ms_engine_stream_length(e, r->rid, 0) != len0 ||
                ms_engine_kv_pages_free(e) != free_before - takes)
                fail_msg("seed %llu step %d: refine of %d on request %d moved the stream (%d -> "
                         "%d tokens) or the pages (%d -> %d free, want %d)",
                         (unsigned long long)seed, (int)n_steps, (int)nb, (int)i, (int)len0,
                         (int)ms_engine_stream_length(e, r->rid, 0), (int)free_before,
                         (int)ms_engine_kv_pages_free(e), (int)(free_before - takes));
            r->reach = MS_MAX(r->reach, len0 + nb);
            n_refine++;
        }
        /* leave: finished requests, and now and then one in the middle of its walk */
        int32_t used = 0;
        for (int32_t i = 0; i < n_made; i++) {
            p_req *r = &q[i];
            if (!r->live)
                continue;
            const int32_t *out;
            int32_t n_out;
            ms_finish_reason why;
            assert_int_equal(ms_engine_output(e, r->rid, &out, &n_out, &why), MS_OK);
            if (why != MS_FINISH_NONE || p_next(&rs) % 16 == 0) {
                r->done = why == MS_FINISH_LENGTH;
                assert_true(n_out <= 16);
                memcpy(r->out, out, (size_t)n_out * sizeof *out);
                r->n_out = n_out;
                ms_engine_remove(e, r->rid);
                r->live = false;
                continue;
            }
            /* every stream holds its prompt and the ids fed back so far */
            int32_t fed = n_out > 0 ? n_out - 1 : 0;
            int32_t lm = ms_engine_stream_length(e, r->rid, 0);
            if (n_out > 0 && lm != r->n_prompt + fed)
                fail_msg("seed %llu step %d: request %d main holds %d, want %d + %d",
                         (unsigned long long)seed, (int)n_steps, (int)i, (int)lm,
                         (int)r->n_prompt, (int)fed);
            if (lm > 0)
                used += pages_of(MS_MAX(lm, r->reach), ps);
            if (r->n_neg > 0) {
                int32_t lu = ms_engine_stream_length(e, r->rid, uncond);
                if (n_out > 0 && lu != r->n_neg + fed)
                    fail_msg("seed %llu step %d: pair %d cfg_uncond holds %d, want %d + %d",
                             (unsigned long long)seed, (int)n_steps, (int)i, (int)lu,
                             (int)r->n_neg, (int)fed);
                if (lu > 0)
                    used += pages_of(lu, ps);
            }
        }
        if (ms_engine_kv_pages_free(e) != free0 - used)
            fail_msg("seed %llu step %d: %d pages free, want %d - %d", (unsigned long long)seed,
                     (int)n_steps, (int)ms_engine_kv_pages_free(e), (int)free0, (int)used);
    }
    assert_int_equal(ms_engine_n_active(e), 0);
    assert_int_equal(ms_engine_kv_pages_free(e), free0);
    /* ids do not depend on the batch: each finished request alone gives the same */
    int32_t checked = 0;
    for (int32_t i = 0; i < n_made; i++) {
        p_req *r = &q[i];
        if (!r->done)
            continue;
        ms_engine_request rq = p_request(r);
        ms_rid rid;
        assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_OK);
        while (ms_engine_n_active(e) > 0)
            assert_int_equal(ms_engine_step(e, NULL, &err), MS_OK);
        const int32_t *out;
        int32_t n_out;
        assert_int_equal(ms_engine_output(e, rid, &out, &n_out, NULL), MS_OK);
        if (n_out != r->n_out || memcmp(out, r->out, (size_t)n_out * sizeof *out) != 0)
            fail_msg("seed %llu: request %d (%s) gives other ids alone", (unsigned long long)seed,
                     (int)i, r->n_neg > 0 ? "guided" : "plain");
        ms_engine_remove(e, rid);
        checked++;
    }
    printf("engine walk property: %d requests, %d steps, %d refine blocks, %d compared alone\n",
           (int)n_made, (int)n_steps, (int)n_refine, (int)checked);
    assert_true(n_refine > 0);
    assert_int_equal(ms_engine_kv_pages_free(e), free0);
    ms_free(q);
    ms_engine_free(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_cfg_reference),
        ms_unit_test(test_cfg_bad_requests),
        ms_unit_test(test_cfg_property),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
