/*
 * test_kv_prefix.c - the KV pool over prefix-cached pages: a request seals its full prompt pages
 * into the cache, a later request with the same prefix adopts them (ms_kv_pool_adopt_prefix) and
 * computes only the rest; the shared pages are never written again; a prompt that ends on a page
 * boundary still computes its last page (vllm PR #11186, sglang #22819); owner counts equal pool
 * references plus the cache's own after every step; bad adoptions change nothing.
 */
#include "ms_test.h"

#include "kv_test_util.h"
#include "ms_test_impl.h"
#include "prefix_cache.h"

#define PS 8

/* Owners of every page equal the pool's references plus one for each page the cache lists. */
static void check_owners(kv_fix *f, ms_prefix_cache *c) {
    int32_t n = ms_page_arena_num_pages(f->arena);
    int32_t *refs = calloc((size_t)n, sizeof *refs);
    int32_t *listed = calloc((size_t)n, sizeof *listed);
    assert_non_null(refs);
    assert_non_null(listed);
    ms_kv_pool_count_pages(f->pool, refs, NULL);
    int32_t n_listed = ms_prefix_cache_pages(c, listed, n);
    for (int32_t i = 0; i < n_listed; i++)
        refs[listed[i]]++;
    for (int32_t p = 1; p < n; p++)
        if (ms_page_arena_owners(f->arena, p) != refs[p])
            fail_msg("page %d: arena owners %d, pool + cache references %d", p,
                     ms_page_arena_owners(f->arena, p), refs[p]);
    free(refs);
    free(listed);
}

static ms_prefix_key root(void) {
    ms_error err = {0};
    ms_prefix_fingerprint fp = {.model = "t", .weights = "w", .kv_dtype = "f32", .page_size = PS,
                                .positions = "rope"};
    ms_prefix_key k;
    assert_int_equal(ms_prefix_root(&fp, &k, &err), MS_OK);
    return k;
}

/* Prefill `n` tokens of rid (after what it holds), writing value base + j for its j-th token. */
static void prefill(kv_fix *f, ms_rid rid, int32_t n, float base, ms_kv_plan *out_plan,
                    int32_t *ttp) {
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, rid, MS_LABEL_MAIN, n);
    assert_int_equal(kv_admit(f, &t).code, MS_ADMIT_OK);
    const ms_kv_plan_set *set = kv_plan(f, &t);
    kv_write_plan(f->arena, &set->plans[0], base);
    if (out_plan != NULL)
        *out_plan = set->plans[0];
    if (ttp != NULL)
        for (int32_t i = 0; i < n; i++)
            ttp[i] = set->plans[0].token_to_page[i];
    kv_commit(f, &t);
}

/* Seal the full pages of rid's main stream into the cache (keys from tokens). */
static void seal(kv_fix *f, ms_prefix_cache *c, ms_rid rid, const int32_t *tok) {
    ms_error err = {0};
    ms_kv_stream_info info = kv_info(f, rid, MS_LABEL_MAIN);
    int32_t pages[16];
    int32_t n = ms_kv_pool_stream_pages(f->pool, rid, MS_LABEL_MAIN, pages, 16);
    int32_t full = info.stored / PS;
    assert_true(full <= n);
    ms_prefix_key k = root();
    for (int32_t i = 0; i < full; i++) {
        k = ms_prefix_page_key(k, tok + i * PS, PS, NULL, 0);
        int32_t listed;
        assert_int_equal(ms_prefix_cache_insert(c, k, pages[i], &listed, &err), MS_OK);
    }
}

static void test_adopted_prefix_is_shared_and_never_written(void **state) {
    (void)state;
    ms_error err = {0};
    kv_fix f;
    kv_fix_init(&f, 16, PS, 0);
    ms_prefix_cache *c = NULL;
    assert_int_equal(ms_prefix_cache_init(f.arena, 8, &c, &err), MS_OK);
    int32_t tok[24];
    for (int i = 0; i < 24; i++)
        tok[i] = 1000 + i;

    /* request 1: a 20-token prompt, 2 full pages sealed */
    kv_ingest(&f, 1);
    prefill(&f, 1, 20, 100.f, NULL, NULL);
    seal(&f, c, 1, tok);
    int32_t p1[3];
    assert_int_equal(ms_kv_pool_stream_pages(f.pool, 1, MS_LABEL_MAIN, p1, 3), 3);
    check_owners(&f, c);
    ms_kv_pool_remove(f.pool, 1);
    check_owners(&f, c);
    assert_int_equal(ms_page_arena_owners(f.arena, p1[0]), 1); /* cached only */
    assert_int_equal(ms_page_arena_owners(f.arena, p1[2]), 0); /* the partial page was freed */

    /* request 2: 19 tokens, the same first 16: 2 pages hit, 3 tokens computed */
    int32_t hit[4];
    assert_int_equal(ms_prefix_cache_lookup(c, root(), tok, 19, NULL, 4, hit, NULL), 2);
    assert_int_equal(hit[0], p1[0]);
    assert_int_equal(hit[1], p1[1]);
    kv_ingest(&f, 2);
    assert_int_equal(ms_kv_pool_adopt_prefix(f.pool, 2, MS_LABEL_MAIN, hit, 2, &err), MS_OK);
    assert_int_equal(kv_info(&f, 2, 0).stored, 16);
    check_owners(&f, c);
    ms_kv_plan plan;
    int32_t ttp[8];
    prefill(&f, 2, 3, 500.f, &plan, ttp);
    assert_int_equal(plan.views[0].length, 19);
    assert_int_equal(plan.views[0].to_compute, 3);
    for (int i = 0; i < 3; i++)
        assert_true(ttp[i] != p1[0] && ttp[i] != p1[1]);
    /* the view reads the shared pages first; their contents are request 1's */
    assert_int_equal(plan.kv_indices[plan.kv_indptr[0]], p1[0]);
    assert_int_equal(plan.kv_indices[plan.kv_indptr[0] + 1], p1[1]);
    assert_true(kv_token_is(f.arena, p1[0], 0, 100.f));
    assert_true(kv_token_is(f.arena, p1[1], 7, 115.f));
    assert_int_equal(kv_info(&f, 2, 0).stored, 19);
    check_owners(&f, c);

    /* request 3: exactly 16 tokens (a page boundary): one page hits, the second page is computed
       into a page of its own even though the cache lists an identical one */
    assert_int_equal(ms_prefix_cache_lookup(c, root(), tok, 16, NULL, 4, hit, NULL), 1);
    kv_ingest(&f, 3);
    assert_int_equal(ms_kv_pool_adopt_prefix(f.pool, 3, MS_LABEL_MAIN, hit, 1, &err), MS_OK);
    prefill(&f, 3, 8, 700.f, &plan, ttp);
    assert_int_equal(plan.views[0].to_compute, 8);
    for (int i = 0; i < 8; i++)
        assert_true(ttp[i] != p1[0] && ttp[i] != p1[1]);
    assert_true(kv_token_is(f.arena, p1[1], 0, 108.f)); /* request 2's shared page untouched */
    check_owners(&f, c);
    /* request 3 seals its second page: the cache already lists that key, nothing changes */
    int32_t before = ms_prefix_cache_stats(c).entries;
    seal(&f, c, 3, tok);
    assert_int_equal(ms_prefix_cache_stats(c).entries, before);
    check_owners(&f, c);

    /* decode steps append after the prefix, never into it */
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 2, MS_LABEL_MAIN, 1);
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_OK);
    const ms_kv_plan_set *set = kv_plan(&f, &t);
    assert_true(set->plans[0].token_to_page[0] != p1[0] && set->plans[0].token_to_page[0] != p1[1]);
    kv_commit(&f, &t);

    ms_kv_pool_remove(f.pool, 2);
    ms_kv_pool_remove(f.pool, 3);
    check_owners(&f, c);
    ms_prefix_stats st = ms_prefix_cache_stats(c);
    assert_int_equal(st.unreferenced, st.entries);
    assert_int_equal(ms_prefix_cache_evict(c, 100), st.entries);
    assert_int_equal(ms_page_arena_num_free(f.arena), 15);
    ms_prefix_cache_free(c);
    kv_fix_free(&f);
}

static void test_bad_adoptions_change_nothing(void **state) {
    (void)state;
    ms_error err = {0};
    kv_fix f;
    kv_fix_init(&f, 16, PS, 0);
    kv_ingest(&f, 1);
    int32_t p[2];
    assert_int_equal(ms_page_arena_acquire(f.arena, 2, p), MS_OK);
    /* not ingested */
    assert_int_equal(ms_kv_pool_adopt_prefix(f.pool, 9, MS_LABEL_MAIN, p, 2, &err),
                     MS_ERR_NOT_FOUND);
    /* a free page, the sink page */
    int32_t bad[2] = {p[0], 14};
    assert_int_equal(ms_kv_pool_adopt_prefix(f.pool, 1, MS_LABEL_MAIN, bad, 2, &err),
                     MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "page 14"));
    int32_t sink[1] = {MS_SINK_PAGE};
    assert_int_equal(ms_kv_pool_adopt_prefix(f.pool, 1, MS_LABEL_MAIN, sink, 1, &err),
                     MS_ERR_INVALID_ARG);
    assert_int_equal(ms_kv_pool_adopt_prefix(f.pool, 1, MS_LABEL_MAIN, p, -1, &err),
                     MS_ERR_INVALID_ARG);
    assert_int_equal(kv_info(&f, 1, 0).stored, 0);
    /* a stream that holds tokens */
    prefill(&f, 1, 3, 1.f, NULL, NULL);
    assert_int_equal(ms_kv_pool_adopt_prefix(f.pool, 1, MS_LABEL_MAIN, p, 2, &err), MS_ERR_STATE);
    assert_non_null(strstr(err.msg, "empty stream"));
    assert_int_equal(kv_info(&f, 1, 0).stored, 3);
    /* the pages are still the caller's: adopt them into another label, then release by remove */
    assert_int_equal(ms_kv_pool_adopt_prefix(f.pool, 1, 2, p, 2, &err), MS_OK);
    assert_int_equal(kv_info(&f, 1, 2).stored, 2 * PS);
    kv_check_pages(&f);
    ms_kv_pool_remove(f.pool, 1);
    assert_int_equal(ms_page_arena_num_free(f.arena), 15);
    kv_fix_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_adopted_prefix_is_shared_and_never_written),
        ms_unit_test(test_bad_adoptions_change_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
