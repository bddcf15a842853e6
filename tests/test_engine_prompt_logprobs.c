/*
 * test_engine_prompt_logprobs.c - prompt logprobs (engine.h ms_engine_request.prompt_logprobs,
 * ms_engine_prompt_logprobs) on the CPU over hf/llama_gqa and models/llama.mstar's descriptor.
 * The reference is computed here by hand: the same prompt prefilled one token a step
 * (prefill_chunk 1) gives the logits of every prompt row (ms_engine_last_logits), and entry i
 * must be log_softmax(row i - 1)[prompt[i]] (in double here) within 1e-6, with the top entries
 * and the rank of the same row. Cases: the whole prompt in steps of prompt_logprobs_rows + 1
 * rows, chunked prefill, batched with another prefilling request, the prefix cache holding the
 * prompt (the positions must be computed, not skipped), a recompute-preempted request; the ids
 * generated equal a request's without prompt logprobs; refusals.
 */
#include "ms_test.h"
#include "ms_test_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

extern const ms_model_desc ms_llama_desc;

#define VOCAB 512 /* hf/llama_gqa */
#define NP 40     /* prompt tokens */
#define TOP 3

static ms_engine *make(int32_t plp_rows, bool cache, int32_t kv_pages) {
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture("hf/llama_gqa");
    o.page_size = 16;
    o.max_seqs = 4;
    o.max_tokens = 128;
    o.kv_pages = kv_pages;
    o.prefix_cache = cache;
    o.prompt_logprobs_rows = plp_rows;
    o.n_threads = 1;
    ms_engine *e = NULL;
    ms_error err = {0};
    if (ms_engine_init(&e, &ms_llama_desc, &o, &err) != MS_OK)
        fail_msg("init: %s", err.msg);
    return e;
}

static void make_prompt(int32_t *p, int32_t n, uint32_t seed) {
    uint32_t s = seed;
    for (int32_t t = 0; t < n; t++) {
        s = s * 1103515245u + 12345u;
        p[t] = 3 + (int32_t)((s >> 8) % (VOCAB - 3));
    }
}

static ms_engine_request req(const int32_t *p, int32_t n, int32_t max_new) {
    ms_engine_request rq = {.prompt = p, .n_prompt = n, .max_new_tokens = max_new,
                            .sampling = ms_sampling_greedy(), .ignore_eos = true};
    return rq;
}

/* The logits of prompt rows 0 .. n - 1, one prefill step per token. [n * VOCAB] (malloc'd). */
static float *reference_rows(const int32_t *p, int32_t n) {
    ms_engine *e = make(0, false, 0);
    ms_error err = {0};
    ms_engine_request rq = req(p, n, 2); /* still running after the prompt's last row */
    rq.prefill_chunk = 1;
    ms_rid rid;
    assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_OK);
    float *rows = calloc((size_t)n * VOCAB, sizeof(float));
    assert_non_null(rows);
    for (int32_t t = 0; t < n; t++) {
        assert_int_equal(ms_engine_step(e, NULL, &err), MS_OK);
        assert_int_equal(ms_engine_stream_length(e, rid, MS_LABEL_MAIN), t + 1);
        const float *z = ms_engine_last_logits(e, rid);
        assert_non_null(z);
        memcpy(rows + (size_t)t * VOCAB, z, VOCAB * sizeof(float));
    }
    ms_engine_free(e);
    return rows;
}

/* Entries 1 .. n - 1 against log_softmax of the reference rows, by hand. */
static void expect_entries(const ms_engine_prompt_logprob *lp, const int32_t *p, int32_t n,
                           const float *rows, int32_t top, const char *what) {
    assert_true(isnan(lp[0].logprob));
    assert_int_equal(lp[0].n_top, 0);
    for (int32_t i = 1; i < n; i++) {
        const float *z = rows + (size_t)(i - 1) * VOCAB;
        double mx = z[0];
        for (int32_t v = 1; v < VOCAB; v++)
            mx = z[v] > mx ? z[v] : mx;
        double sum = 0;
        for (int32_t v = 0; v < VOCAB; v++)
            sum += exp((double)z[v] - mx);
        const double lse = mx + log(sum);
        const double want = (double)z[p[i]] - lse;
        if (fabs((double)lp[i].logprob - want) > 1e-6)
            fail_msg("%s: position %d: logprob %.9g, by hand %.9g", what, i,
                     (double)lp[i].logprob, want);
        int32_t rank = 1;
        for (int32_t v = 0; v < VOCAB; v++)
            rank += z[v] > z[p[i]];
        assert_int_equal(lp[i].rank, rank);
        assert_int_equal(lp[i].n_top, top);
        /* the top ids: the largest logits, id ascending on ties */
        bool used[VOCAB] = {false};
        for (int32_t k = 0; k < top; k++) {
            int32_t best = -1;
            for (int32_t v = 0; v < VOCAB; v++)
                if (!used[v] && (best < 0 || z[v] > z[best]))
                    best = v;
            used[best] = true;
            if (lp[i].top_ids[k] != best)
                fail_msg("%s: position %d top %d: id %d, by hand %d", what, i, k,
                         lp[i].top_ids[k], best);
            if (fabs((double)lp[i].top_logprobs[k] - ((double)z[best] - lse)) > 1e-6)
                fail_msg("%s: position %d top %d: %.9g, by hand %.9g", what, i, k,
                         (double)lp[i].top_logprobs[k], (double)z[best] - lse);
        }
    }
}

/* Run the plp request (and, with `other`, a second prompt prefilling beside it) to the end on e;
 * check its entries and that its ids equal `want_ids` (a run without prompt logprobs). */
static void run_check(ms_engine *e, int32_t chunk, bool other, const int32_t *p,
                      const float *rows, const int32_t *want_ids, const char *what) {
    ms_error err = {0};
    ms_engine_request rq = req(p, NP, 4);
    rq.prefill_chunk = chunk;
    rq.prompt_logprobs = true;
    rq.prompt_top_logprobs = TOP;
    ms_rid rid, rid2 = 0;
    assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_OK);
    int32_t p2[30];
    if (other) {
        make_prompt(p2, 30, 99);
        ms_engine_request r2 = req(p2, 30, 4);
        assert_int_equal(ms_engine_add(e, &r2, &rid2, &err), MS_OK);
    }
    const ms_engine_prompt_logprob *lp;
    int32_t n = 0, steps = 0;
    assert_int_equal(ms_engine_prompt_logprobs(e, rid, &lp, &n), MS_OK);
    assert_int_equal(n, 1); /* nothing computed yet */
    while (ms_engine_n_active(e) > 0) {
        assert_int_equal(ms_engine_step(e, NULL, &err), MS_OK);
        steps++;
    }
    assert_int_equal(ms_engine_prompt_logprobs(e, rid, &lp, &n), MS_OK);
    assert_int_equal(n, NP);
    expect_entries(lp, p, NP, rows, TOP, what);
    const int32_t *ids;
    int32_t n_ids;
    assert_int_equal(ms_engine_output(e, rid, &ids, &n_ids, NULL), MS_OK);
    assert_int_equal(n_ids, 4);
    assert_memory_equal(ids, want_ids, 4 * sizeof(int32_t));
    printf("%s: %d entries in %d steps\n", what, (int)n, steps);
    ms_engine_remove(e, rid);
    if (other)
        ms_engine_remove(e, rid2);
}

static void test_prompt_logprobs(void **state) {
    (void)state;
    int32_t p[NP];
    make_prompt(p, NP, 5);
    float *rows = reference_rows(p, NP);
    /* the ids without prompt logprobs */
    int32_t want[4];
    {
        ms_engine *e = make(0, false, 0);
        ms_error err = {0};
        ms_engine_request rq = req(p, NP, 4);
        ms_rid rid;
        assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_OK);
        while (ms_engine_n_active(e) > 0)
            assert_int_equal(ms_engine_step(e, NULL, &err), MS_OK);
        const int32_t *ids;
        int32_t n;
        assert_int_equal(ms_engine_output(e, rid, &ids, &n, NULL), MS_OK);
        memcpy(want, ids, sizeof want);
        ms_engine_free(e);
    }
    ms_engine *e = make(8, false, 0); /* 9 prompt rows a step */
    const int32_t free0 = ms_engine_kv_pages_free(e);
    run_check(e, 0, false, p, rows, want, "whole prompt, 9 rows a step");
    run_check(e, 5, false, p, rows, want, "prefill_chunk 5");
    run_check(e, 0, true, p, rows, want, "beside another prefill");
    assert_int_equal(ms_engine_kv_pages_free(e), free0);
    ms_engine_free(e);
    e = make(64, false, 0); /* the whole prompt in one step */
    run_check(e, 0, true, p, rows, want, "one step");
    ms_engine_free(e);
    free(rows);
}

/* The prefix cache holds the prompt: a request asking for prompt logprobs still computes every
 * position (the cache hits only for requests that do not ask). */
static void test_prompt_logprobs_prefix_cache(void **state) {
    (void)state;
    int32_t p[NP];
    make_prompt(p, NP, 5);
    float *rows = reference_rows(p, NP);
    ms_engine *e = make(16, true, 0);
    ms_error err = {0};
    ms_engine_request rq = req(p, NP, 4);
    ms_rid warm;
    assert_int_equal(ms_engine_add(e, &rq, &warm, &err), MS_OK); /* caches the prompt's pages */
    while (ms_engine_n_active(e) > 0)
        assert_int_equal(ms_engine_step(e, NULL, &err), MS_OK);
    const int32_t *ids;
    int32_t n_ids;
    assert_int_equal(ms_engine_output(e, warm, &ids, &n_ids, NULL), MS_OK);
    int32_t want[4];
    memcpy(want, ids, sizeof want);
    ms_engine_remove(e, warm);
    ms_prefix_stats before, after;
    ms_engine_prefix_stats(e, &before);
    assert_true(before.entries >= 2); /* the prompt's two full pages are listed */
    run_check(e, 0, false, p, rows, want, "prefix cache holding the prompt");
    ms_engine_prefix_stats(e, &after);
    assert_int_equal(after.hit_tokens, before.hit_tokens); /* nothing adopted */
    /* a request that does not ask still hits */
    ms_rid hit;
    assert_int_equal(ms_engine_add(e, &rq, &hit, &err), MS_OK);
    ms_engine_prefix_stats(e, &after);
    assert_true(after.hit_tokens > before.hit_tokens);
    ms_engine_free(e);
    free(rows);
}

/* Under KV pressure (no host tier) a request asking for prompt logprobs is recompute-preempted
 * and re-prefilled: its entries stay those of its first prefill. */
static void test_prompt_logprobs_preempted(void **state) {
    (void)state;
    int32_t p[NP];
    make_prompt(p, NP, 5);
    float *rows = reference_rows(p, NP);
    ms_engine *e = make(64, false, 1 + 8); /* 8 pages: two requests of 3 pages growing to 4+ */
    ms_error err = {0};
    ms_engine_request rq = req(p, NP, 40);
    rq.prompt_logprobs = true;
    rq.prompt_top_logprobs = TOP;
    ms_rid a, b;
    assert_int_equal(ms_engine_add(e, &rq, &a, &err), MS_OK);
    assert_int_equal(ms_engine_add(e, &rq, &b, &err), MS_OK);
    int steps = 0;
    while (ms_engine_n_active(e) > 0) {
        assert_int_equal(ms_engine_step(e, NULL, &err), MS_OK);
        assert_true(steps++ < 1000);
    }
    ms_engine_kv_stats kv;
    ms_engine_get_kv_stats(e, &kv);
    assert_true(kv.preemptions > 0);
    const ms_engine_prompt_logprob *lp;
    int32_t n;
    for (int k = 0; k < 2; k++) {
        assert_int_equal(ms_engine_prompt_logprobs(e, k == 0 ? a : b, &lp, &n), MS_OK);
        assert_int_equal(n, NP);
        expect_entries(lp, p, NP, rows, TOP, "preempted");
    }
    printf("preempted: %lld preemptions\n", (long long)kv.preemptions);
    ms_engine_free(e);
    free(rows);
}

static void test_prompt_logprobs_refusals(void **state) {
    (void)state;
    int32_t p[NP];
    make_prompt(p, NP, 5);
    ms_error err = {0};
    ms_rid rid, f;
    ms_engine *e = make(0, false, 0);
    ms_engine_request rq = req(p, NP, 2);
    rq.prompt_logprobs = true;
    assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "prompt_logprobs_rows"));
    ms_engine_free(e);
    e = make(4, false, 0);
    rq.prompt_top_logprobs = 21;
    assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "prompt_top_logprobs 21"));
    rq.prompt_top_logprobs = 0;
    assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_OK);
    assert_int_equal(ms_engine_fork(e, rid, &rq, &f, &err), MS_ERR_UNSUPPORTED);
    rq.prompt_logprobs = false;
    assert_int_equal(ms_engine_add(e, &rq, &f, &err), MS_OK);
    const ms_engine_prompt_logprob *lp;
    int32_t n;
    assert_int_equal(ms_engine_prompt_logprobs(e, f, &lp, &n), MS_ERR_STATE);
    assert_null(lp);
    assert_int_equal(ms_engine_prompt_logprobs(e, 12345, &lp, &n), MS_ERR_NOT_FOUND);
    while (ms_engine_n_active(e) > 0)
        assert_int_equal(ms_engine_step(e, NULL, &err), MS_OK);
    assert_int_equal(ms_engine_prompt_logprobs(e, rid, &lp, &n), MS_OK); /* kept after finish */
    assert_int_equal(n, NP);
    assert_int_equal(lp[5].n_top, 0); /* top 0: the token's logprob alone */
    assert_true(lp[5].logprob <= 0.0f);
    /* max_new_tokens 0: the prompt is scored (prefilled), nothing generated */
    ms_rid z;
    rq.prompt_logprobs = true;
    rq.max_new_tokens = 0;
    assert_int_equal(ms_engine_add(e, &rq, &z, &err), MS_OK);
    assert_int_equal(ms_engine_n_active(e), 1);
    while (ms_engine_n_active(e) > 0)
        assert_int_equal(ms_engine_step(e, NULL, &err), MS_OK);
    const int32_t *ids;
    int32_t n_ids;
    ms_finish_reason why;
    assert_int_equal(ms_engine_output(e, z, &ids, &n_ids, &why), MS_OK);
    assert_int_equal(n_ids, 0);
    assert_int_equal(why, MS_FINISH_LENGTH);
    const ms_engine_prompt_logprob *lz;
    assert_int_equal(ms_engine_prompt_logprobs(e, z, &lz, &n), MS_OK);
    assert_int_equal(n, NP);
    assert_true(lz[NP - 1].logprob == lp[NP - 1].logprob); /* the same prompt, bitwise */
    ms_engine_free(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_prompt_logprobs),
        ms_unit_test(test_prompt_logprobs_prefix_cache),
        ms_unit_test(test_prompt_logprobs_preempted),
        ms_unit_test(test_prompt_logprobs_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
