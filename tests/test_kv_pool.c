/*
 * test_kv_pool.c - the KV pool's step lifecycle: admit (whole pages, transactional, idempotent,
 * rollback), plan (views, FlashInfer arrays, write addresses, decode fast path, combined labels,
 * forks), commit, generation rules, dummy-row reset, the resource vtable; reference §9 items 1-13
 * and 24 and hazards H1, H2, H5, H6, H7 (KV side), H10, H15.
 */
#include "ms_test.h"

#include "kv_test_util.h"
#include "ms_test_impl.h"

/* Page size 8 everywhere below unless said otherwise. */
#define PS 8

/* ---- admit ---- */

static void test_admit_reserves_whole_pages(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 16, PS, 0);
    kv_ingest(&f, 1);
    int32_t free0 = ms_page_arena_num_free(f.arena);
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, MS_LABEL_MAIN, 20);
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_OK);
    assert_int_equal(kv_info(&f, 1, 0).n_pages, 3);
    assert_int_equal(ms_page_arena_num_free(f.arena), free0 - 3);
    assert_true(kv_info(&f, 1, 0).step_in_flight);
    kv_check_pages(&f);
    kv_fix_free(&f);
}

static void test_admit_grows_from_resident_length(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 16, PS, 0);
    kv_ingest(&f, 1);
    kv_extend(&f, 1, 0, 8);
    assert_int_equal(kv_info(&f, 1, 0).n_pages, 1);
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 5);
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_OK);
    assert_int_equal(kv_info(&f, 1, 0).n_pages, 2);
    const ms_kv_plan_set *set = kv_plan(&f, &t);
    const ms_kv_view *v = &set->plans[0].views[0];
    assert_int_equal(v->length, 13);     /* resident 8 + span 5 */
    assert_int_equal(v->to_compute, 5);
    assert_int_equal(v->length - v->to_compute, 8);
    kv_commit(&f, &t);
    assert_int_equal(kv_info(&f, 1, 0).stored, 13);
    kv_fix_free(&f);
}

static void test_admit_within_last_page_reserves_nothing(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 16, PS, 0);
    kv_ingest(&f, 1);
    kv_extend(&f, 1, 0, 5);
    int32_t free0 = ms_page_arena_num_free(f.arena);
    uint32_t gen0 = kv_info(&f, 1, 0).generation;
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 3); /* 5 + 3 = 8 fits the one page */
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_OK);
    assert_int_equal(ms_page_arena_num_free(f.arena), free0);
    assert_int_equal(kv_info(&f, 1, 0).generation, gen0);
    kv_plan(&f, &t);
    kv_commit(&f, &t);
    kv_fix_free(&f);
}

static void test_zero_span_admit_reserves_nothing(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 16, PS, 0);
    kv_ingest(&f, 1);
    int32_t free0 = ms_page_arena_num_free(f.arena);
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 0);
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_OK);
    assert_int_equal(ms_page_arena_num_free(f.arena), free0);
    kv_plan(&f, &t);
    kv_commit(&f, &t);
    assert_int_equal(kv_info(&f, 1, 0).stored, 0);
    kv_fix_free(&f);
}

static void test_failed_admit_carries_diagnostics(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 5, PS, 0); /* 4 usable pages */
    kv_ingest(&f, 7);
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 7, 3, 6 * PS); /* needs 6 pages */
    ms_admit_outcome o = kv_admit(&f, &t);
    assert_int_equal(o.code, MS_ADMIT_PAGES_SHORT);
    assert_int_equal(o.pages_short, 2);
    assert_int_equal(o.rid, 7);
    assert_int_equal(o.label, 3);
    assert_true(ms_admit_failed(o));
    assert_int_equal(ms_page_arena_num_free(f.arena), 4);
    ms_kv_stream_info info;
    /* label 3 was not created by the failed admit */
    assert_int_equal(ms_kv_pool_stream_info(f.pool, 7, 3, &info), MS_ERR_NOT_FOUND);
    kv_check_pages(&f);
    kv_fix_free(&f);
}

/* H2: a batch of three where the third does not fit reserves nothing at all. */
static void test_H2_admit_all_or_nothing_across_segments(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 7, PS, 0); /* 6 usable */
    for (ms_rid r = 1; r <= 3; r++)
        kv_ingest(&f, r);
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 2 * PS);
    kv_step_seg(&t, 2, 0, 2 * PS);
    kv_step_seg(&t, 3, 0, 3 * PS); /* 7 pages in total */
    ms_admit_outcome o = kv_admit(&f, &t);
    assert_int_equal(o.code, MS_ADMIT_PAGES_SHORT);
    assert_int_equal(o.pages_short, 1);
    assert_int_equal(o.rid, 3);
    assert_int_equal(ms_page_arena_num_free(f.arena), 6);
    for (ms_rid r = 1; r <= 3; r++) {
        assert_int_equal(kv_info(&f, r, 0).n_pages, 0);
        assert_false(kv_info(&f, r, 0).step_in_flight);
    }
    /* With a fork target too: nothing reserved on the target either. */
    kv_step_post_fork(&t, 0, 1);
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_PAGES_SHORT);
    assert_int_equal(ms_page_arena_num_free(f.arena), 6);
    kv_check_pages(&f);
    /* Shrink the step so it fits: the retry reserves exactly what it needs. */
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 2 * PS);
    kv_step_seg(&t, 2, 0, 2 * PS);
    kv_step_seg(&t, 3, 0, 2 * PS);
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_OK);
    assert_int_equal(ms_page_arena_num_free(f.arena), 0);
    /* Retrying the same admit allocates nothing new (idempotent). */
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_OK);
    assert_int_equal(ms_page_arena_num_free(f.arena), 0);
    kv_check_pages(&f);
    for (ms_rid r = 1; r <= 3; r++)
        ms_kv_pool_remove(f.pool, r);
    assert_int_equal(ms_page_arena_num_free(f.arena), 6);
    assert_int_equal(ms_kv_pool_num_requests(f.pool), 0);
    kv_fix_free(&f);
}

/* H2 across resources: the runner rolls KV back when a later resource fails. */
static void test_H2_admit_rollback_undoes_only_this_step(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 16, PS, 0);
    kv_ingest(&f, 1);
    kv_ingest(&f, 2);
    kv_extend(&f, 1, 0, 6);
    int32_t pages_before = kv_info(&f, 1, 0).n_pages;
    int32_t free0 = ms_page_arena_num_free(f.arena);
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 10);  /* grows by 1 page */
    kv_step_seg(&t, 2, 4, 9);   /* creates label 4 with 2 pages */
    kv_step_post_fork(&t, 0, 5);
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_OK);
    assert_true(ms_page_arena_num_free(f.arena) < free0);
    /* a second (idempotent) admit of the same step before the rollback */
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_OK);
    ms_kv_pool_admit_rollback(f.pool, 0, &t.step, kv_ctx(&t));
    assert_int_equal(ms_page_arena_num_free(f.arena), free0);
    assert_int_equal(kv_info(&f, 1, 0).n_pages, pages_before);
    assert_int_equal(kv_info(&f, 1, 0).stored, 6);
    assert_false(kv_info(&f, 1, 0).step_in_flight);
    ms_kv_stream_info info;
    assert_int_equal(ms_kv_pool_stream_info(f.pool, 2, 4, &info), MS_ERR_NOT_FOUND);
    assert_int_equal(ms_kv_pool_stream_info(f.pool, 1, 5, &info), MS_ERR_NOT_FOUND);
    /* rollback of a step nobody admitted: no-op */
    kv_tstep other;
    kv_step_init(&other, true);
    kv_step_seg(&other, 1, 0, 1);
    ms_kv_pool_admit_rollback(f.pool, 0, &other.step, NULL);
    assert_int_equal(kv_info(&f, 1, 0).stored, 6);
    kv_check_pages(&f);
    kv_fix_free(&f);
}

static void test_admit_invalid_inputs(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 16, PS, 0);
    kv_ingest(&f, 1);
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 99, 0, 1); /* unknown request */
    ms_admit_outcome o = kv_admit(&f, &t);
    assert_int_equal(o.code, MS_ADMIT_INVALID);
    assert_int_equal(o.rid, 99);
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, MS_MAX_LABELS, 1);
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_INVALID);
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, -1);
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_INVALID);
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 1);
    kv_step_seg(&t, 1, 0, 1); /* duplicate (request, label) */
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_INVALID);
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 1);
    kv_step_post_fork(&t, 0, 0); /* fork onto itself */
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_INVALID);
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 1);
    t.comb[0] = (ms_combined_label){{0, 1}, 2, 9}; /* label 1 has no segment */
    t.ks.n_combined = 1;
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_INVALID);
    assert_int_equal(ms_page_arena_num_free(f.arena), 15);
    /* A step that does not use the pool is admitted, planned and committed as a no-op. */
    kv_step_init(&t, true);
    t.step.records[0].rec = NULL;
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_OK);
    const ms_kv_plan_set *set = (const ms_kv_plan_set *)1;
    ms_error err = {0};
    assert_int_equal(ms_kv_pool_plan(f.pool, 0, &t.step, NULL, &set, &err), MS_OK);
    assert_null(set);
    kv_fix_free(&f);
}

/* Injected host allocation failures: each failing admit changes nothing. */
static void test_admit_host_oom_changes_nothing(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 64, PS, 0);
    for (ms_rid r = 1; r <= 4; r++)
        kv_ingest(&f, r);
    int failures = 0;
    for (int64_t nth = 1; nth < 60; nth++) {
        kv_tstep t;
        kv_step_init(&t, true);
        for (ms_rid r = 1; r <= 4; r++)
            kv_step_seg(&t, r, (ms_label)(r % 3), (int32_t)(nth % 40) + 1);
        kv_step_post_fork(&t, 0, 6);
        int32_t free0 = ms_page_arena_num_free(f.arena);
        ms_alloc_fail_nth(nth);
        ms_admit_outcome o = kv_admit(&f, &t);
        ms_alloc_fail_nth(0);
        if (o.code == MS_ADMIT_NO_MEMORY) {
            failures++;
            assert_int_equal(ms_page_arena_num_free(f.arena), free0);
        } else {
            assert_int_equal(o.code, MS_ADMIT_OK);
            kv_plan(&f, &t);
            kv_commit(&f, &t);
        }
        kv_check_pages(&f);
        for (ms_rid r = 1; r <= 4; r++)
            ms_kv_pool_reset(f.pool, r, true);
    }
    assert_true(failures > 0);
    kv_fix_free(&f);
}

/* ---- views and plans ---- */

static void test_view_extent_then_zero_span_sees_committed(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 16, PS, 0);
    kv_ingest(&f, 1);
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 11);
    const ms_kv_plan_set *set = kv_run(&f, &t);
    assert_int_equal(set->plans[0].views[0].length, 11);
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 0);
    set = kv_run(&f, &t);
    const ms_kv_view *v = &set->plans[0].views[0];
    assert_int_equal(v->length, 11);
    assert_int_equal(v->to_compute, 0);
    assert_int_equal(v->n_pages, 2);
    assert_int_equal(set->plans[0].n_tokens, 0);
    kv_fix_free(&f);
}

/* Views are snapshots: later changes to the stream do not change them. */
static void test_view_pages_are_snapshots(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 16, PS, 0);
    kv_ingest(&f, 1);
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 12);
    const ms_kv_plan_set *set = kv_run(&f, &t);
    const ms_kv_view *v = &set->plans[0].views[0];
    int32_t copy[2] = {v->pages[0], v->pages[1]};
    ms_kv_pool_reset(f.pool, 1, true);
    kv_extend(&f, 1, 0, 3); /* the next plan uses the other buffer set */
    assert_int_equal(v->n_pages, 2);
    assert_int_equal(v->length, 12);
    assert_int_equal(v->pages[0], copy[0]);
    assert_int_equal(v->pages[1], copy[1]);
    kv_fix_free(&f);
}

/* Two buffer sets alternate: step N's plan survives the admit and plan of step N+1, even when
 * N+1 is much larger (buffers grow), so a pre-plan never pulls memory from under a launch. */
static void test_previous_plan_survives_next_admit_and_plan(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 128, PS, 0);
    for (ms_rid r = 1; r <= 40; r++)
        kv_ingest(&f, r);
    kv_tstep a, b;
    kv_step_init(&a, true);
    kv_step_seg(&a, 1, 0, 3);
    assert_int_equal(kv_admit(&f, &a).code, MS_ADMIT_OK);
    const ms_kv_plan_set *pa = kv_plan(&f, &a);
    const ms_kv_plan *p = &pa->plans[0];
    int32_t page = p->views[0].pages[0];
    kv_step_init(&b, true);
    for (ms_rid r = 2; r <= 40; r++)
        kv_step_seg(&b, r, 0, 17);
    assert_int_equal(kv_admit(&f, &b).code, MS_ADMIT_OK);
    const ms_kv_plan_set *pb = kv_plan(&f, &b);
    assert_int_equal(pb->plans[0].n_views, 39);
    /* step N's plan is intact */
    assert_int_equal(pa->n_plans, 1);
    assert_int_equal(p->n_views, 1);
    assert_int_equal(p->views[0].length, 3);
    assert_int_equal(p->views[0].pages[0], page);
    assert_int_equal(p->token_to_page[2], page);
    assert_int_equal(p->token_to_slot[2], 2);
    kv_commit(&f, &a);
    kv_commit(&f, &b);
    kv_fix_free(&f);
}

static void test_flashinfer_index_arrays(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 32, PS, 0);
    for (ms_rid r = 1; r <= 3; r++)
        kv_ingest(&f, r);
    kv_extend(&f, 2, 0, 8);
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 5);   /* 5 tokens, 1 page, last 5 */
    kv_step_seg(&t, 2, 0, 8);   /* 16 tokens, 2 pages, last 8 (0 -> ps) */
    kv_step_seg(&t, 3, 0, 17);  /* 17 tokens, 3 pages, last 1 */
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_OK);
    const ms_kv_plan_set *set = kv_plan(&f, &t);
    assert_int_equal(set->n_plans, 1);
    assert_int_equal(set->page_size, PS);
    assert_true(set->commit);
    const ms_kv_plan *p = &set->plans[0];
    assert_int_equal(p->plan_label, 0);
    assert_int_equal(p->n_views, 3);
    int32_t qo[] = {0, 5, 13, 30};
    int32_t kvp[] = {0, 1, 3, 6};
    int32_t last[] = {5, 8, 1};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(p->qo_indptr[i], qo[i]);
        assert_int_equal(p->kv_indptr[i], kvp[i]);
    }
    for (int i = 0; i < 3; i++) {
        assert_int_equal(p->kv_last_page_len[i], last[i]);
        assert_int_equal(p->kv_start[i], 0);
        for (int32_t k = 0; k < p->views[i].n_pages; k++)
            assert_int_equal(p->kv_indices[p->kv_indptr[i] + k], p->views[i].pages[k]);
    }
    assert_int_equal(p->n_tokens, 30);
    assert_false(p->is_decode);
    /* write addresses: request 2's first new token is slot 0 of its second page */
    assert_int_equal(p->token_to_page[5], p->views[1].pages[1]);
    assert_int_equal(p->token_to_slot[5], 0);
    assert_int_equal(p->token_to_page[13 + 16], p->views[2].pages[2]);
    assert_int_equal(p->token_to_slot[13 + 16], 0);
    for (int32_t i = 0; i < p->n_tokens; i++) {
        assert_int_not_equal(p->token_to_page[i], MS_SINK_PAGE);
        assert_true(p->token_to_slot[i] >= 0 && p->token_to_slot[i] < PS);
    }
    kv_commit(&f, &t);
    kv_fix_free(&f);
}

/* Decode fast path: every span 1; the addresses match the packed rule. Mixed [2, 0] spans have
 * as many tokens as segments but are not decode (H7, KV side). */
static void test_decode_fast_path_and_H7_mixed_spans(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 32, PS, 0);
    kv_ingest(&f, 1);
    kv_ingest(&f, 2);
    kv_extend(&f, 1, 0, 7);
    kv_extend(&f, 2, 0, 8);
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 1);
    kv_step_seg(&t, 2, 0, 1);
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_OK);
    const ms_kv_plan *p = &kv_plan(&f, &t)->plans[0];
    assert_true(p->is_decode);
    assert_int_equal(p->token_to_page[0], p->views[0].pages[0]);
    assert_int_equal(p->token_to_slot[0], 7);
    assert_int_equal(p->token_to_page[1], p->views[1].pages[1]);
    assert_int_equal(p->token_to_slot[1], 0);
    assert_int_equal(p->kv_last_page_len[0], 8);
    assert_int_equal(p->kv_last_page_len[1], 1);
    kv_commit(&f, &t);
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 2);
    kv_step_seg(&t, 2, 0, 0);
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_OK);
    p = &kv_plan(&f, &t)->plans[0];
    assert_int_equal(p->n_tokens, p->n_views);
    assert_false(p->is_decode);
    kv_commit(&f, &t);
    kv_fix_free(&f);
}

/* The forward writes through the plan's addresses; tokens land in order in the stream. */
static void test_write_addresses_fill_stream_in_order(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 32, PS, 0);
    kv_ingest(&f, 1);
    float next = 0;
    int32_t spans[] = {5, 1, 1, 9, 0, 1, 16, 3};
    for (size_t k = 0; k < MS_ARRAY_LEN(spans); k++) {
        kv_tstep t;
        kv_step_init(&t, true);
        kv_step_seg(&t, 1, 0, spans[k]);
        assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_OK);
        kv_write_plan(f.arena, &kv_plan(&f, &t)->plans[0], next);
        next += (float)spans[k];
        kv_commit(&f, &t);
    }
    int32_t pages[8];
    int32_t n = ms_kv_pool_stream_pages(f.pool, 1, 0, pages, 8);
    assert_int_equal(n, 5); /* 36 tokens */
    for (int32_t tok = 0; tok < (int32_t)next; tok++)
        assert_true(kv_token_is(f.arena, pages[tok / PS], tok % PS, (float)tok));
    kv_fix_free(&f);
}

static void test_streams_advance_independently_per_label(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 32, PS, 0);
    kv_ingest(&f, 1);
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 4);
    kv_step_seg(&t, 1, 1, 9);
    const ms_kv_plan_set *set = kv_run(&f, &t);
    assert_int_equal(set->n_plans, 2);
    assert_int_equal(set->plans[0].plan_label, 0);
    assert_int_equal(set->plans[1].plan_label, 1);
    kv_extend(&f, 1, 1, 2);
    assert_int_equal(kv_info(&f, 1, 0).stored, 4);
    assert_int_equal(kv_info(&f, 1, 1).stored, 11);
    kv_fix_free(&f);
}

/* Cross-attention context: written once, then zero-span reads see all of it. */
static void test_write_once_context_then_zero_span_reads(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 32, PS, 0);
    kv_ingest(&f, 1);
    const ms_label ctx_label = 2;
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 3);
    kv_step_seg(&t, 1, ctx_label, 30);
    kv_run(&f, &t);
    int32_t free_after = ms_page_arena_num_free(f.arena);
    for (int step = 0; step < 5; step++) {
        kv_step_init(&t, true);
        kv_step_seg(&t, 1, 0, 1);
        kv_step_seg(&t, 1, ctx_label, 0);
        const ms_kv_plan_set *set = kv_run(&f, &t);
        const ms_kv_plan *cp = ms_kv_plan_find(set, ctx_label);
        assert_non_null(cp);
        assert_int_equal(cp->views[0].length, 30);
        assert_int_equal(cp->views[0].to_compute, 0);
        assert_int_equal(cp->n_tokens, 0);
    }
    assert_int_equal(kv_info(&f, 1, ctx_label).stored, 30);
    assert_true(ms_page_arena_num_free(f.arena) <= free_after);
    assert_true(free_after - ms_page_arena_num_free(f.arena) <= 1); /* only main grew */
    kv_fix_free(&f);
}

/* Batched CFG: a combined label plans label-major over its source labels. */
static void test_combined_label_is_label_major(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 32, PS, 0);
    kv_ingest(&f, 1);
    kv_ingest(&f, 2);
    kv_tstep t;
    kv_step_init(&t, true);
    /* segments given interleaved; the plan must be label-major */
    kv_step_seg(&t, 1, 0, 3);
    kv_step_seg(&t, 1, 1, 4);
    kv_step_seg(&t, 2, 0, 5);
    kv_step_seg(&t, 2, 1, 6);
    t.comb[0] = (ms_combined_label){{0, 1}, 2, 9};
    t.ks.n_combined = 1;
    const ms_kv_plan_set *set = kv_run(&f, &t);
    assert_int_equal(set->n_plans, 1);
    const ms_kv_plan *p = ms_kv_plan_find(set, 9);
    assert_non_null(p);
    assert_int_equal(p->n_views, 4);
    ms_rid rids[] = {1, 2, 1, 2};
    ms_label labels[] = {0, 0, 1, 1};
    int32_t spans[] = {3, 5, 4, 6};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(p->views[i].rid, rids[i]);
        assert_int_equal(p->views[i].label, labels[i]);
        assert_int_equal(p->views[i].to_compute, spans[i]);
    }
    assert_int_equal(p->qo_indptr[4], 18);
    /* each (request, label) stream got its own pages */
    assert_int_not_equal(p->views[0].pages[0], p->views[2].pages[0]);
    /* combined plan with one label still batches under the plan label */
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 1);
    kv_step_seg(&t, 2, 0, 1);
    t.comb[0] = (ms_combined_label){{0}, 1, 9};
    t.ks.n_combined = 1;
    set = kv_run(&f, &t);
    assert_int_equal(set->n_plans, 1);
    assert_int_equal(set->plans[0].plan_label, 9);
    assert_int_equal(set->plans[0].n_views, 2);
    assert_true(set->plans[0].is_decode);
    kv_fix_free(&f);
}

/* The plan's buffers are sized at admit: plan performs no host allocation. */
static void test_plan_allocates_nothing_after_admit(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 80, PS, 0);
    for (ms_rid r = 1; r <= 8; r++)
        kv_ingest(&f, r);
    for (int step = 0; step < 20; step++) {
        kv_tstep t;
        kv_step_init(&t, true);
        for (ms_rid r = 1; r <= 8; r++)
            kv_step_seg(&t, r, 0, step == 0 ? 9 : 1);
        if (step % 5 == 4)
            kv_step_pre_fork(&t, 0, 1);
        ms_admit_outcome ao = kv_admit(&f, &t);
        if (ao.code != MS_ADMIT_OK)
            fail_msg("step %d: %s short %d rid %llu label %d", step,
                     ms_admit_code_str(ao.code), ao.pages_short, (unsigned long long)ao.rid,
                     ao.label);
        int64_t before = ms_alloc_get_stats().total_allocs;
        kv_plan(&f, &t);
        assert_int_equal(ms_alloc_get_stats().total_allocs, before);
        kv_commit(&f, &t);
    }
    assert_int_equal(ms_kv_pool_plan_allocs(f.pool), 0);
    kv_fix_free(&f);
}

/* No host allocation on the decode path: two requests prefill 17 tokens, then decode 4096
 * tokens one per step (513 pages each, far past the old doubling points 8, 16, ... 512). Only
 * the first admit sizes the page lists (for the per-stream maximum) and the plan buffers; every
 * later admit allocates nothing, by the pool's counter and by the allocator's own count. */
static void test_decode_admit_allocates_nothing_after_first(void **state) {
    (void)state;
    enum { PROMPT = 17, DECODE = 4096, N_PAGES = 2 * ((PROMPT + DECODE + PS - 1) / PS) + 1 };
    kv_fix f;
    kv_fix_init(&f, N_PAGES, PS, 0);
    kv_ingest(&f, 1);
    kv_ingest(&f, 2);
    int64_t first = -1, host_allocs = 0;
    for (int step = 0; step <= DECODE; step++) {
        kv_tstep t;
        kv_step_init(&t, true);
        kv_step_seg(&t, 1, 0, step == 0 ? PROMPT : 1);
        kv_step_seg(&t, 2, 0, step == 0 ? PROMPT : 1);
        int64_t before = ms_alloc_get_stats().total_allocs;
        ms_admit_outcome ao = kv_admit(&f, &t);
        if (ao.code != MS_ADMIT_OK)
            fail_msg("step %d: %s short %d", step, ms_admit_code_str(ao.code), ao.pages_short);
        if (step == 0)
            first = ms_kv_pool_admit_allocs(f.pool);
        else
            host_allocs += ms_alloc_get_stats().total_allocs - before;
        kv_plan(&f, &t);
        kv_commit(&f, &t);
    }
    assert_true(first > 0); /* the first admit did size the arrays (the counter counts) */
    assert_int_equal(ms_kv_pool_admit_allocs(f.pool), first);
    assert_int_equal(host_allocs, 0);
    assert_int_equal(ms_kv_pool_plan_allocs(f.pool), 0);
    assert_int_equal(kv_info(&f, 1, 0).stored, PROMPT + DECODE);
    assert_int_equal(kv_info(&f, 2, 0).n_pages, (PROMPT + DECODE + PS - 1) / PS);
    assert_int_equal(ms_page_arena_num_free(f.arena), 0);
    kv_check_pages(&f);
    kv_fix_free(&f);
}

/* A per-stream limit below the arena (the engine passes the context in pages): decode within it
 * allocates nothing after the first admit; a stream past it still gets its pages (the list grows)
 * and its contents survive the growth. */
static void test_stream_past_its_page_limit_still_admits(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_opts o = {.max_pages_per_stream = 2};
    kv_fix_init_opts(&f, 64, PS, 0, &o);
    kv_ingest(&f, 1);
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 2 * PS); /* exactly the limit */
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_OK);
    kv_plan(&f, &t);
    kv_commit(&f, &t);
    int64_t first = ms_kv_pool_admit_allocs(f.pool);
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 38 * PS); /* far past it: 40 pages */
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_OK);
    assert_true(ms_kv_pool_admit_allocs(f.pool) > first); /* the list grew */
    kv_plan(&f, &t);
    kv_commit(&f, &t);
    assert_int_equal(kv_info(&f, 1, 0).stored, 40 * PS);
    assert_int_equal(kv_info(&f, 1, 0).n_pages, 40);
    kv_check_pages(&f);
    kv_fix_free(&f);
}

/* H1: the page list is a high-water mark; views and addresses use only what the length needs. */
static void test_H1_plan_slices_high_water_pages(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 16, PS, 0);
    kv_ingest(&f, 1);
    kv_tstep t;
    kv_step_init(&t, false);
    kv_step_seg(&t, 1, 0, 20);
    kv_run(&f, &t);
    assert_int_equal(kv_info(&f, 1, 0).n_pages, 3);
    assert_int_equal(kv_info(&f, 1, 0).stored, 0);
    int32_t pages[3];
    ms_kv_pool_stream_pages(f.pool, 1, 0, pages, 3);
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 1);
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_OK);
    const ms_kv_plan *p = &kv_plan(&f, &t)->plans[0];
    assert_int_equal(p->kv_indptr[1], 1);
    assert_int_equal(p->views[0].n_pages, 1);
    assert_int_equal(p->kv_last_page_len[0], 1);
    assert_int_equal(p->token_to_page[0], pages[0]);
    assert_int_equal(p->token_to_slot[0], 0);
    kv_commit(&f, &t);
    assert_int_equal(kv_info(&f, 1, 0).stored, 1);
    kv_fix_free(&f);
}

/* A non-committing step keeps its reservation: the next identical step allocates nothing. */
static void test_noncommit_step_reuses_reservation(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 16, PS, 0);
    kv_ingest(&f, 1);
    kv_extend(&f, 1, 0, 10);
    int32_t free0 = -1;
    for (int step = 0; step < 4; step++) {
        kv_tstep t;
        kv_step_init(&t, false);
        kv_step_seg(&t, 1, 0, 12);
        const ms_kv_plan_set *set = kv_run(&f, &t);
        assert_false(set->commit);
        assert_int_equal(set->plans[0].views[0].length, 22);
        assert_int_equal(set->plans[0].token_to_slot[0], 2);
        if (step == 0)
            free0 = ms_page_arena_num_free(f.arena);
        assert_int_equal(ms_page_arena_num_free(f.arena), free0);
        assert_int_equal(kv_info(&f, 1, 0).stored, 10);
    }
    kv_fix_free(&f);
}

/* H6: a zero-span read of a label never written gives an empty view. */
static void test_H6_zero_span_absent_label_empty_view(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 16, PS, 0);
    kv_ingest(&f, 1);
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 2);
    kv_step_seg(&t, 1, 6, 0);
    const ms_kv_plan_set *set = kv_run(&f, &t);
    const ms_kv_plan *p = ms_kv_plan_find(set, 6);
    assert_non_null(p);
    assert_int_equal(p->n_views, 1);
    assert_int_equal(p->views[0].length, 0);
    assert_int_equal(p->views[0].n_pages, 0);
    assert_int_equal(p->kv_indptr[1], 0);
    assert_int_equal(p->kv_last_page_len[0], 0);
    ms_kv_stream_info info;
    assert_int_equal(ms_kv_pool_stream_info(f.pool, 1, 6, &info), MS_ERR_NOT_FOUND);
    /* a real span on an absent label without admit is refused by plan */
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 7, 3);
    const ms_kv_plan_set *none = NULL;
    ms_error err = {0};
    assert_int_equal(ms_kv_pool_plan(f.pool, 0, &t.step, NULL, &none, &err), MS_ERR_STATE);
    assert_non_null(strstr(err.msg, "never admitted"));
    kv_fix_free(&f);
}

/* H15: a dummy row reset without freeing has length 0: its view lists no page at all. */
static void test_H15_zero_length_view_lists_no_pages(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 16, PS, 0);
    ms_rid dummy = MS_RID_DUMMY_BASE + 1;
    kv_ingest(&f, dummy);
    kv_extend(&f, dummy, 0, 20);
    ms_kv_pool_reset(f.pool, dummy, false);
    assert_int_equal(kv_info(&f, dummy, 0).n_pages, 3);
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, dummy, 0, 0);
    const ms_kv_plan *p = &kv_run(&f, &t)->plans[0];
    assert_int_equal(p->views[0].n_pages, 0);
    assert_int_equal(p->kv_indptr[1], 0);
    assert_int_equal(p->kv_last_page_len[0], 0);
    kv_fix_free(&f);
}

/* Dummy rows reset without freeing reuse their pages on the next replay. */
static void test_reset_keep_pages_reuses_them(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 16, PS, 0);
    ms_rid dummy = MS_RID_DUMMY_BASE;
    kv_ingest(&f, dummy);
    kv_extend(&f, dummy, 0, 12);
    int32_t free0 = ms_page_arena_num_free(f.arena);
    for (int i = 0; i < 10; i++) {
        ms_kv_pool_reset(f.pool, dummy, false);
        kv_extend(&f, dummy, 0, 12);
        assert_int_equal(ms_page_arena_num_free(f.arena), free0);
    }
    ms_kv_pool_reset(f.pool, dummy, true);
    assert_int_equal(ms_page_arena_num_free(f.arena), 15);
    assert_int_equal(kv_info(&f, dummy, 0).stored, 0);
    kv_fix_free(&f);
}

/* ---- forks ---- */

static void test_pre_fork_copies_pages_and_length(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 32, PS, 0);
    kv_ingest(&f, 1);
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 11);
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_OK);
    kv_write_plan(f.arena, &kv_plan(&f, &t)->plans[0], 100);
    kv_commit(&f, &t);
    /* cfg prefill: pre-fork main -> 1, then both extend */
    kv_step_init(&t, true);
    kv_step_pre_fork(&t, 0, 1);
    kv_step_seg(&t, 1, 0, 2);
    kv_step_seg(&t, 1, 1, 2);
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_OK);
    const ms_kv_plan_set *set = kv_plan(&f, &t);
    assert_int_equal(set->n_pre_forks, 1);
    const ms_kv_plan *p1 = ms_kv_plan_find(set, 1);
    assert_int_equal(p1->views[0].length, 13);
    assert_int_equal(p1->views[0].to_compute, 2);
    /* the copy: every token of main is in label 1's pages, which are distinct */
    const ms_kv_plan *p0 = ms_kv_plan_find(set, 0);
    for (int32_t tok = 0; tok < 11; tok++) {
        assert_int_not_equal(p1->views[0].pages[tok / PS], p0->views[0].pages[tok / PS]);
        assert_true(kv_token_is(f.arena, p1->views[0].pages[tok / PS], tok % PS,
                                100 + (float)tok));
    }
    kv_commit(&f, &t);
    assert_int_equal(kv_info(&f, 1, 1).stored, 13);
    assert_int_equal(kv_info(&f, 1, 0).stored, 13);
    kv_check_pages(&f);
    kv_fix_free(&f);
}

static void test_post_fork_sees_committed_length(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 32, PS, 0);
    kv_ingest(&f, 1);
    kv_extend(&f, 1, 0, 6);
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 5);
    kv_step_post_fork(&t, 0, 3);
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_OK);
    assert_int_equal(kv_info(&f, 1, 3).n_pages, 2); /* sized for 11 tokens */
    kv_write_plan(f.arena, &kv_plan(&f, &t)->plans[0], 6);
    kv_commit(&f, &t);
    assert_int_equal(kv_info(&f, 1, 3).stored, 11);
    int32_t pages[2];
    ms_kv_pool_stream_pages(f.pool, 1, 3, pages, 2);
    for (int32_t tok = 6; tok < 11; tok++)
        assert_true(kv_token_is(f.arena, pages[tok / PS], tok % PS, (float)tok));
    /* a fork can fail like an admit: no room for the target */
    kv_fix g;
    kv_fix_init(&g, 4, PS, 0); /* 3 usable */
    kv_ingest(&g, 1);
    kv_extend(&g, 1, 0, 2 * PS);
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 1);
    kv_step_post_fork(&t, 0, 1);
    ms_admit_outcome o = kv_admit(&g, &t);
    assert_int_equal(o.code, MS_ADMIT_PAGES_SHORT);
    assert_int_equal(o.label, 1);
    assert_int_equal(o.pages_short, 3);
    assert_int_equal(ms_page_arena_num_free(g.arena), 1);
    kv_fix_free(&g);
    kv_fix_free(&f);
}

/* H5a: post-fork whose source label is created by the same step. */
static void test_H5a_post_fork_source_created_same_step(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 32, PS, 0);
    kv_ingest(&f, 1);
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 4, 10); /* label 4 does not exist yet */
    kv_step_post_fork(&t, 4, 5);
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_OK);
    assert_int_equal(kv_info(&f, 1, 5).n_pages, 2); /* target reserved for the source's 10 */
    kv_write_plan(f.arena, &kv_plan(&f, &t)->plans[0], 50);
    kv_commit(&f, &t);
    ms_kv_stream_info tgt = kv_info(&f, 1, 5);
    assert_int_equal(tgt.stored, 10);
    assert_int_equal(tgt.n_pages, 2);
    int32_t pages[2];
    ms_kv_pool_stream_pages(f.pool, 1, 5, pages, 2);
    for (int32_t tok = 0; tok < 10; tok++)
        assert_true(kv_token_is(f.arena, pages[tok / PS], tok % PS, 50 + (float)tok));
    kv_check_pages(&f);
    kv_fix_free(&f);
}

/* H5b: the target holds more pages than the source: the copy is sized by the source. */
static void test_H5b_fork_target_with_more_pages(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 32, PS, 0);
    kv_ingest(&f, 1);
    kv_extend(&f, 1, 2, 40); /* target: 5 pages */
    kv_extend(&f, 1, 0, 9);  /* source: 2 pages */
    int32_t free0 = ms_page_arena_num_free(f.arena);
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 1);
    kv_step_post_fork(&t, 0, 2);
    kv_run(&f, &t);
    assert_int_equal(ms_page_arena_num_free(f.arena), free0);
    ms_kv_stream_info tgt = kv_info(&f, 1, 2);
    assert_int_equal(tgt.stored, 10);
    assert_int_equal(tgt.n_pages, 5); /* keeps its high-water pages */
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 2, 0);
    const ms_kv_plan *p = &kv_run(&f, &t)->plans[0];
    assert_int_equal(p->views[0].n_pages, 2);
    assert_int_equal(p->kv_last_page_len[0], 2);
    kv_check_pages(&f);
    kv_fix_free(&f);
}

/* H5d: a pre-fork applied by a pre-plan is queued on the compute stream (ordered after the
 * running step) and an abandoned pre-plan restores the target's lengths. */
static void test_H5d_preplan_fork_rollback_restores_target(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 32, PS, 0);
    kv_ingest(&f, 1);
    kv_extend(&f, 1, 0, 12);
    kv_extend(&f, 1, 1, 3);
    uint32_t gen1 = kv_info(&f, 1, 1).generation;
    int32_t free0 = ms_page_arena_num_free(f.arena);
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_row(&t, 1);
    t.ctx.is_preplan = true;
    kv_step_pre_fork(&t, 0, 1);
    kv_step_seg(&t, 1, 1, 1);
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_OK);
    const ms_kv_plan_set *set = kv_plan(&f, &t);
    assert_int_equal(set->plans[0].views[0].length, 13);
    assert_int_equal(kv_info(&f, 1, 1).stored, 12);
    /* the batch is dropped: the runner rolls the pre-plan back */
    ms_kv_pool_admit_rollback(f.pool, 0, &t.step, &t.ctx);
    ms_kv_stream_info tgt = kv_info(&f, 1, 1);
    assert_int_equal(tgt.stored, 3);
    assert_false(tgt.step_in_flight);
    assert_true(tgt.generation != gen1); /* bytes changed: readers must re-read */
    assert_int_equal(ms_page_arena_num_free(f.arena), free0);
    kv_check_pages(&f);
    kv_fix_free(&f);
}

/* ---- lifetime and generation ---- */

/* H10: ingesting again keeps the stored length. */
static void test_H10_reingest_keeps_length(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 16, PS, 0);
    kv_ingest(&f, 1);
    kv_extend(&f, 1, 0, 10);
    kv_ingest(&f, 1);
    assert_int_equal(kv_info(&f, 1, 0).stored, 10);
    assert_int_equal(kv_info(&f, 1, 0).n_pages, 2);
    assert_int_equal(ms_kv_pool_num_requests(f.pool), 1);
    kv_fix_free(&f);
}

static void test_generation_rules(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 32, PS, 0);
    kv_ingest(&f, 1);
    uint32_t g = kv_info(&f, 1, 0).generation;
    kv_extend(&f, 1, 0, 3); /* takes a page */
    assert_int_equal(kv_info(&f, 1, 0).generation, g + 1);
    g = kv_info(&f, 1, 0).generation;
    kv_extend(&f, 1, 0, 4); /* appends inside the held page */
    assert_int_equal(kv_info(&f, 1, 0).generation, g);
    /* a fork bumps the target even when its pages and length are unchanged */
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 0);
    kv_step_post_fork(&t, 0, 1);
    kv_run(&f, &t);
    uint32_t g1 = kv_info(&f, 1, 1).generation;
    kv_run(&f, &t);
    assert_int_equal(kv_info(&f, 1, 1).generation, g1 + 1);
    assert_int_equal(kv_info(&f, 1, 1).stored, 7);
    /* a reset bumps it */
    g = kv_info(&f, 1, 0).generation;
    ms_kv_pool_reset(f.pool, 1, false);
    assert_int_equal(kv_info(&f, 1, 0).generation, g + 1);
    kv_fix_free(&f);
}

static void test_remove_frees_everything_and_unknown_is_noop(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 32, PS, 0);
    kv_ingest(&f, 1);
    kv_ingest(&f, 2);
    kv_extend(&f, 1, 0, 17);
    kv_extend(&f, 1, 3, 9);
    kv_extend(&f, 2, 0, 4);
    ms_kv_pool_remove(f.pool, 1);
    ms_kv_pool_remove(f.pool, 1);
    ms_kv_pool_remove(f.pool, 12345);
    assert_false(ms_kv_pool_has_request(f.pool, 1));
    assert_int_equal(kv_check_pages(&f), 1);
    ms_kv_pool_remove(f.pool, 2);
    assert_int_equal(ms_page_arena_num_free(f.arena), 31);
    kv_fix_free(&f);
}

/* The pool through its resource vtable, as the step runner drives it. */
static void test_resource_vtable_drives_a_step(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 16, PS, 0);
    const ms_resource_i *ri = ms_kv_pool_resource_i();
    assert_int_equal(ri->kind, MS_RESOURCE_KV);
    ms_error err = {0};
    ms_kv_request_config rc = {.set_window = true, .window = 0};
    assert_int_equal(ri->ingest(f.pool, 5, &rc, &err), MS_OK);
    kv_tstep t;
    kv_step_init(&t, true);
    /* the KV record at index 2, with its own segment list */
    t.step.records[0].rec = NULL;
    t.step.records[2].rec = &t.ks;
    ms_segment own[] = {{5, 0, 9}};
    t.step.records[2].segments = own;
    t.step.records[2].n_segments = 1;
    ms_step_ctx ctx = {0};
    assert_int_equal(ri->admit(f.pool, 2, &t.step, &ctx).code, MS_ADMIT_OK);
    const void *out = NULL;
    assert_int_equal(ri->plan(f.pool, 2, &t.step, &ctx, &out, &err), MS_OK);
    const ms_kv_plan_set *set = out;
    assert_int_equal(set->plans[0].views[0].to_compute, 9);
    assert_int_equal(ri->commit(f.pool, 2, &t.step, &ctx, &err), MS_OK);
    assert_int_equal(kv_info(&f, 5, 0).stored, 9);
    /* a failing admit names the resource index */
    ms_segment big[] = {{5, 0, 1000}};
    t.step.records[2].segments = big;
    ms_admit_outcome o = ri->admit(f.pool, 2, &t.step, &ctx);
    assert_int_equal(o.code, MS_ADMIT_PAGES_SHORT);
    assert_int_equal(o.resource, 2);
    ri->reset(f.pool, 5, true);
    assert_int_equal(kv_info(&f, 5, 0).stored, 0);
    ri->remove(f.pool, 5);
    assert_false(ms_kv_pool_has_request(f.pool, 5));
    kv_fix_free_keep_dev(&f);
    /* free through the vtable: a fresh pool */
    ms_page_arena_config ac = {.n_layers = 1, .n_pages = 4, .page_size = 4, .n_kv_heads = 1,
                               .head_dim = 1, .elem_bytes = 2};
    ms_page_arena *arena = NULL;
    assert_int_equal(ms_page_arena_init(&ac, f.dev, &arena, &err), MS_OK);
    ms_kv_pool_config pc = {.arena = arena};
    ms_kv_pool *pool = NULL;
    assert_int_equal(ms_kv_pool_init(&pc, &pool, &err), MS_OK);
    assert_int_equal(ri->ingest(pool, 1, NULL, &err), MS_OK);
    ri->free(pool);
    ms_page_arena_free(arena);
    ms_device_free(f.dev);
}

static void test_pool_init_rejects_bad_config(void **state) {
    (void)state;
    ms_error err = {0};
    ms_kv_pool *pool = NULL;
    ms_kv_pool_config pc = {0};
    assert_int_equal(ms_kv_pool_init(&pc, &pool, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "arena"));
    kv_fix f;
    kv_fix_init(&f, 8, PS, 0);
    pc.arena = f.arena;
    pc.window = -1;
    assert_int_equal(ms_kv_pool_init(&pc, &pool, &err), MS_ERR_INVALID_ARG);
    pc.window = 0;
    ms_page_arena_config ac = {.n_layers = 1, .n_pages = 4, .page_size = 4, .n_kv_heads = 1,
                               .head_dim = 1, .elem_bytes = 2};
    ms_page_arena *other = NULL;
    assert_int_equal(ms_page_arena_init(&ac, f.dev, &other, &err), MS_OK);
    pc.host_arena = other;
    assert_int_equal(ms_kv_pool_init(&pc, &pool, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "geometry"));
    assert_null(pool);
    ms_page_arena_free(other);
    ms_kv_request_config bad = {.set_window = true, .window = -3};
    assert_int_equal(ms_kv_pool_ingest(f.pool, 1, &bad, &err), MS_ERR_INVALID_ARG);
    kv_fix_free(&f);
}

/* H17 support: page ids depend only on the sequence of operations, so tensor-parallel ranks
 * that replay the same admissions hold identical page tables. */
static void test_H17_allocation_is_deterministic_across_pools(void **state) {
    (void)state;
    kv_fix a, b;
    kv_fix_init(&a, 40, PS, 16);
    kv_fix_init(&b, 40, PS, 16);
    kv_fix *both[2] = {&a, &b};
    uint64_t x = 99;
    for (int it = 0; it < 3000; it++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        ms_rid rid = 1 + (x >> 40) % 6;
        int op = (int)((x >> 20) % 10);
        int32_t span = 1 + (int32_t)((x >> 50) % 20);
        ms_admit_code codes[2];
        for (int k = 0; k < 2; k++) {
            kv_fix *f = both[k];
            ms_error err = {0};
            codes[k] = MS_ADMIT_OK;
            if (op == 0) {
                ms_kv_pool_remove(f->pool, rid);
            } else if (op == 1) {
                ms_kv_pool_reset(f->pool, rid, (x & 1) != 0);
            } else if (op == 2) {
                (void)ms_kv_pool_offload(f->pool, rid, NULL, &err);
            } else if (op == 3) {
                (void)ms_kv_pool_reload(f->pool, rid, &err);
            } else {
                assert_int_equal(ms_kv_pool_ingest(f->pool, rid, NULL, &err), MS_OK);
                kv_tstep t;
                kv_step_init(&t, op != 4);
                kv_step_seg(&t, rid, (ms_label)(op % 3), span);
                codes[k] = kv_admit(f, &t).code;
                if (codes[k] == MS_ADMIT_OK) {
                    kv_plan(f, &t);
                    kv_commit(f, &t);
                }
            }
        }
        assert_int_equal(codes[0], codes[1]);
        assert_int_equal(ms_page_arena_num_free(a.arena), ms_page_arena_num_free(b.arena));
        for (ms_label l = 0; l < 3; l++) {
            int32_t pa[64], pb[64];
            int32_t na = ms_kv_pool_stream_pages(a.pool, rid, l, pa, 64);
            int32_t nb = ms_kv_pool_stream_pages(b.pool, rid, l, pb, 64);
            assert_int_equal(na, nb);
            for (int32_t i = 0; i < na && i < 64; i++)
                assert_int_equal(pa[i], pb[i]);
        }
    }
    kv_fix_free(&a);
    kv_fix_free(&b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_admit_reserves_whole_pages),
        ms_unit_test(test_admit_grows_from_resident_length),
        ms_unit_test(test_admit_within_last_page_reserves_nothing),
        ms_unit_test(test_zero_span_admit_reserves_nothing),
        ms_unit_test(test_failed_admit_carries_diagnostics),
        ms_unit_test(test_H2_admit_all_or_nothing_across_segments),
        ms_unit_test(test_H2_admit_rollback_undoes_only_this_step),
        ms_unit_test(test_admit_invalid_inputs),
        ms_unit_test(test_admit_host_oom_changes_nothing),
        ms_unit_test(test_view_extent_then_zero_span_sees_committed),
        ms_unit_test(test_view_pages_are_snapshots),
        ms_unit_test(test_previous_plan_survives_next_admit_and_plan),
        ms_unit_test(test_flashinfer_index_arrays),
        ms_unit_test(test_decode_fast_path_and_H7_mixed_spans),
        ms_unit_test(test_write_addresses_fill_stream_in_order),
        ms_unit_test(test_streams_advance_independently_per_label),
        ms_unit_test(test_write_once_context_then_zero_span_reads),
        ms_unit_test(test_combined_label_is_label_major),
        ms_unit_test(test_plan_allocates_nothing_after_admit),
        ms_unit_test(test_decode_admit_allocates_nothing_after_first),
        ms_unit_test(test_stream_past_its_page_limit_still_admits),
        ms_unit_test(test_H1_plan_slices_high_water_pages),
        ms_unit_test(test_noncommit_step_reuses_reservation),
        ms_unit_test(test_H6_zero_span_absent_label_empty_view),
        ms_unit_test(test_H15_zero_length_view_lists_no_pages),
        ms_unit_test(test_reset_keep_pages_reuses_them),
        ms_unit_test(test_pre_fork_copies_pages_and_length),
        ms_unit_test(test_post_fork_sees_committed_length),
        ms_unit_test(test_H5a_post_fork_source_created_same_step),
        ms_unit_test(test_H5b_fork_target_with_more_pages),
        ms_unit_test(test_H5d_preplan_fork_rollback_restores_target),
        ms_unit_test(test_H10_reingest_keeps_length),
        ms_unit_test(test_generation_rules),
        ms_unit_test(test_remove_frees_everything_and_unknown_is_noop),
        ms_unit_test(test_resource_vtable_drives_a_step),
        ms_unit_test(test_pool_init_rejects_bad_config),
        ms_unit_test(test_H17_allocation_is_deterministic_across_pools),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
