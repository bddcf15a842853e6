/*
 * test_engine_offload.c - the engine under KV pressure (engine.h ms_engine_step): a deliberately
 * small device arena over the hf/llama_gqa fixture so that requests must be offloaded to the
 * host tier and reloaded, or recompute-preempted when the host tier is full too. Every request's
 * ids must equal those of a run with a large arena (greedy); with offload alone every logit row
 * is bitwise the same (the CPU backend's rows do not depend on the batch, and offload copies the
 * KV bytes). A request that could never fit is refused at add while the others finish; at the
 * end every device and host page is free again.
 */
#include "ms_test.h"
#include "ms_test_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

extern const ms_model_desc ms_llama_desc;

#define N_REQ 6
#define MAX_NEW 20
#define VOCAB 512 /* hf/llama_gqa */

/* One run's results: ids and (optionally) every sampled row's logits per request. */
typedef struct run_out {
    int32_t ids[N_REQ][MAX_NEW];
    int32_t n[N_REQ];
    float *logits[N_REQ]; /* [MAX_NEW * VOCAB] */
    ms_engine_kv_stats kv;
} run_out;

static void run_free(run_out *r) {
    for (int i = 0; i < N_REQ; i++)
        free(r->logits[i]);
}

/* With the prefix cache on (engine.h prefix_cache), prompts share their first 8 ids. */
static bool g_prefix;

/* Prompt i: 6 + 2i ids of a fixed pattern inside the vocabulary (g_prefix: 8 shared ids first,
 * then the pattern). */
static int32_t make_prompt(int i, int32_t *ids) {
    int32_t n = 6 + 2 * i;
    for (int32_t t = 0; t < n; t++)
        ids[t] = (int32_t)((7 + 31 * i + 13 * t) % (VOCAB - 3)) + 3;
    if (g_prefix) {
        for (int32_t t = 0; t < 8; t++)
            ids[t] = 11 + 5 * t;
        n += 2;
        for (int32_t t = 8; t < n; t++)
            ids[t] = (int32_t)((7 + 31 * i + 13 * t) % (VOCAB - 3)) + 3;
    }
    return n;
}

/*
 * Run N_REQ greedy requests (MAX_NEW ids each, ignore_eos; request 1 prefilled in chunks of 4)
 * on an engine with kv_pages / host_kv_pages, all added at once; finished requests are read and
 * removed after each step. Checks that the pages all come back.
 */
static void run_all(int32_t kv_pages, int32_t host_pages, run_out *out) {
    memset(out, 0, sizeof *out);
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture("hf/llama_gqa");
    o.page_size = 4;
    o.max_seqs = N_REQ;
    o.max_tokens = 64;
    o.kv_pages = kv_pages;
    o.host_kv_pages = host_pages;
    o.n_threads = 1;
    o.prefix_cache = g_prefix;
    ms_engine *e = NULL;
    ms_error err = {0};
    if (ms_engine_init(&e, &ms_llama_desc, &o, &err) != MS_OK)
        fail_msg("init: %s", err.msg);
    const int32_t free0 = ms_engine_kv_pages_free(e);
    ms_rid rids[N_REQ];
    bool live[N_REQ];
    for (int i = 0; i < N_REQ; i++) {
        int32_t p[32];
        int32_t np = make_prompt(i, p);
        ms_engine_request rq = {.prompt = p, .n_prompt = np, .max_new_tokens = MAX_NEW,
                                .sampling = ms_sampling_greedy(), .ignore_eos = true,
                                .prefill_chunk = i == 1 ? 4 : 0};
        if (ms_engine_add(e, &rq, &rids[i], &err) != MS_OK)
            fail_msg("add %d: %s", i, err.msg);
        live[i] = true;
        out->logits[i] = calloc((size_t)MAX_NEW * VOCAB, sizeof(float));
        assert_non_null(out->logits[i]);
    }
    int steps = 0;
    int32_t seen[N_REQ] = {0};
    while (ms_engine_n_active(e) > 0) {
        assert_true(steps++ < 2000);
        if (ms_engine_step(e, NULL, &err) != MS_OK)
            fail_msg("step %d: %s", steps, err.msg);
        for (int i = 0; i < N_REQ; i++) {
            if (!live[i])
                continue;
            const int32_t *ids;
            int32_t n;
            ms_finish_reason why;
            assert_int_equal(ms_engine_output(e, rids[i], &ids, &n, &why), MS_OK);
            const float *lg = ms_engine_last_logits(e, rids[i]);
            if (n > seen[i]) { /* a new id: this step sampled it from lg */
                assert_int_equal(n, seen[i] + 1);
                assert_non_null(lg);
                memcpy(out->logits[i] + (size_t)seen[i] * VOCAB, lg, VOCAB * sizeof(float));
                seen[i] = n;
            }
            if (why != MS_FINISH_NONE) {
                assert_int_equal(why, MS_FINISH_LENGTH);
                memcpy(out->ids[i], ids, (size_t)n * sizeof(int32_t));
                out->n[i] = n;
                ms_engine_remove(e, rids[i]);
                live[i] = false;
            }
        }
    }
    ms_engine_get_kv_stats(e, &out->kv);
    assert_int_equal(ms_engine_kv_pages_free(e), free0); /* no page leaked */
    assert_int_equal(out->kv.host_pages_free, out->kv.host_pages);
    assert_int_equal(out->kv.n_offloaded, 0);
    ms_engine_free(e);
}

static void expect_same_ids(const run_out *a, const run_out *b) {
    for (int i = 0; i < N_REQ; i++) {
        assert_int_equal(a->n[i], MAX_NEW);
        assert_int_equal(b->n[i], MAX_NEW);
        for (int t = 0; t < MAX_NEW; t++)
            if (a->ids[i][t] != b->ids[i][t])
                fail_msg("request %d id %d: %d vs %d", i, t, a->ids[i][t], b->ids[i][t]);
    }
}

/* A request needs at most ceil((6 + 10 + 20) / 4) = 9 pages; 6 of them all at once ~45. */
#define BIG_ARENA 0   /* the default: max_seqs full contexts */
#define SMALL_ARENA 13 /* the sink + 12 usable: one or two requests at a time */

/* Offload and reload only (a host tier large enough): ids and logits bitwise equal. */
static void test_offload_reload_bitwise(void **state) {
    (void)state;
    run_out big, small;
    run_all(BIG_ARENA, 0, &big);
    run_all(SMALL_ARENA, 64, &small);
    assert_int_equal(big.kv.offloads + big.kv.preemptions, 0);
    assert_true(small.kv.offloads > 0);
    assert_true(small.kv.reloads == small.kv.offloads);
    assert_true(small.kv.pages_offloaded > 0);
    assert_int_equal(small.kv.pages_reloaded, small.kv.pages_offloaded);
    assert_int_equal(small.kv.preemptions, 0);
    expect_same_ids(&big, &small);
    for (int i = 0; i < N_REQ; i++)
        if (memcmp(big.logits[i], small.logits[i], (size_t)MAX_NEW * VOCAB * sizeof(float)) != 0)
            fail_msg("request %d: logits differ after offload/reload", i);
    printf("offload: %lld offloads (%lld pages), %lld reloads\n", (long long)small.kv.offloads,
           (long long)small.kv.pages_offloaded, (long long)small.kv.reloads);
    run_free(&big);
    run_free(&small);
}

/* A host tier too small for most requests: some are recompute-preempted; ids equal. */
static void test_host_full_preempts(void **state) {
    (void)state;
    run_out big, small;
    run_all(BIG_ARENA, 0, &big);
    run_all(SMALL_ARENA, 5, &small);
    assert_true(small.kv.preemptions > 0);
    expect_same_ids(&big, &small);
    printf("host full: %lld offloads, %lld preemptions\n", (long long)small.kv.offloads,
           (long long)small.kv.preemptions);
    run_free(&big);
    run_free(&small);
}

/* No host tier: recompute-preemption alone; ids equal. */
static void test_no_host_tier_recomputes(void **state) {
    (void)state;
    run_out big, small;
    run_all(BIG_ARENA, 0, &big);
    run_all(SMALL_ARENA, 0, &small);
    assert_int_equal(small.kv.offloads, 0);
    assert_true(small.kv.preemptions > 0);
    assert_int_equal(small.kv.host_pages, 0);
    expect_same_ids(&big, &small);
    run_free(&big);
    run_free(&small);
}

/* With the prefix cache on and prompts sharing 8 ids: the cache's pages, offload and
 * preemption together; ids equal to a large arena's (with the cache too). */
static void test_with_prefix_cache(void **state) {
    (void)state;
    g_prefix = true;
    run_out big, small, none;
    run_all(BIG_ARENA, 0, &big);
    run_all(SMALL_ARENA, 64, &small);
    run_all(SMALL_ARENA, 0, &none);
    g_prefix = false;
    assert_true(small.kv.offloads > 0);
    assert_true(none.kv.preemptions > 0);
    expect_same_ids(&big, &small);
    expect_same_ids(&big, &none);
    run_free(&big);
    run_free(&small);
    run_free(&none);
}

/* A request that can never fit is refused at add naming the limit; the others finish. */
static void test_never_fits_refused(void **state) {
    (void)state;
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture("hf/llama_gqa");
    o.page_size = 4;
    o.max_seqs = 4;
    o.max_tokens = 64;
    o.kv_pages = SMALL_ARENA;
    o.host_kv_pages = 16;
    o.n_threads = 1;
    ms_engine *e = NULL;
    ms_error err = {0};
    assert_int_equal(ms_engine_init(&e, &ms_llama_desc, &o, &err), MS_OK);
    const int32_t free0 = ms_engine_kv_pages_free(e);
    int32_t p[32];
    int32_t np = make_prompt(0, p);
    ms_engine_request ok = {.prompt = p, .n_prompt = np, .max_new_tokens = MAX_NEW,
                            .sampling = ms_sampling_greedy(), .ignore_eos = true};
    ms_rid a, b, c;
    assert_int_equal(ms_engine_add(e, &ok, &a, &err), MS_OK);
    ms_engine_request huge = ok;
    huge.max_new_tokens = 100; /* 106 tokens: 27 pages, the arena has 12 */
    assert_int_equal(ms_engine_add(e, &huge, &c, &err), MS_ERR_CAPACITY);
    assert_non_null(strstr(err.msg, "needs 27 KV pages"));
    assert_non_null(strstr(err.msg, "max context 512"));
    assert_non_null(strstr(err.msg, "holds 12"));
    assert_non_null(strstr(err.msg, "kv_pages"));
    assert_int_equal(ms_engine_add(e, &ok, &b, &err), MS_OK);
    while (ms_engine_n_active(e) > 0)
        assert_int_equal(ms_engine_step(e, NULL, &err), MS_OK);
    const int32_t *ids;
    int32_t n;
    assert_int_equal(ms_engine_output(e, a, &ids, &n, NULL), MS_OK);
    assert_int_equal(n, MAX_NEW);
    assert_int_equal(ms_engine_output(e, b, &ids, &n, NULL), MS_OK);
    assert_int_equal(n, MAX_NEW);
    ms_engine_remove(e, a);
    ms_engine_remove(e, b);
    assert_int_equal(ms_engine_kv_pages_free(e), free0);
    ms_engine_free(e);
}

/* Bad options: one-line errors, nothing left allocated. */
static void test_bad_options(void **state) {
    (void)state;
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture("hf/llama_gqa");
    ms_engine *e = NULL;
    ms_error err = {0};
    o.host_kv_pages = -1;
    assert_int_equal(ms_engine_init(&e, &ms_llama_desc, &o, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "host_kv_pages -1"));
    o.host_kv_pages = 0;
    o.gpu_memory_fraction = 1.5;
    assert_int_equal(ms_engine_init(&e, &ms_llama_desc, &o, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "gpu_memory_fraction 1.5"));
    o.gpu_memory_fraction = 0.5; /* cpu: no device memory to take a fraction of */
    assert_int_equal(ms_engine_init(&e, &ms_llama_desc, &o, &err), MS_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "set kv_pages"));
    assert_null(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_offload_reload_bitwise),
        cmocka_unit_test(test_host_full_preempts),
        cmocka_unit_test(test_no_host_tier_recomputes),
        cmocka_unit_test(test_with_prefix_cache),
        cmocka_unit_test(test_never_fits_refused),
        cmocka_unit_test(test_bad_options),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
