/*
 * test_kv_retention.c - windowed retention (DESIGN.md §3): window(W) keeps at least the last W
 * tokens, whole pages outside it are released at commit, the view's start moves, admit sizes
 * from the physical remainder; reference §9 item 17.
 */
#include "ms_test.h"

#include "kv_test_util.h"
#include "ms_test_impl.h"

#define PS 8

static void init_window(kv_fix *f, int32_t n_pages, int32_t window) {
    kv_fix_opts o = {.window = window};
    kv_fix_init_opts(f, n_pages, PS, 0, &o);
}

/* Window 12, steps of 5 at page size 8: the first page goes at 20 tokens. */
static void test_retention_releases_whole_pages_at_page_granularity(void **state) {
    (void)state;
    kv_fix f;
    init_window(&f, 32, 12);
    kv_ingest(&f, 1);
    int32_t free0 = ms_page_arena_num_free(f.arena);
    int32_t expect_released[] = {0, 0, 0, 8, 8, 16, 16, 24};
    for (int k = 0; k < 8; k++) {
        kv_extend(&f, 1, 0, 5);
        ms_kv_stream_info in = kv_info(&f, 1, 0);
        assert_int_equal(in.stored, 5 * (k + 1));
        assert_int_equal(in.released, expect_released[k]);
        /* at least the last 12 tokens stay */
        assert_true(in.stored - in.released >= 12 || in.released == 0);
        /* and less than a whole page beyond the window */
        assert_true(in.stored - in.released - 12 < PS);
        assert_int_equal(in.n_pages, MS_CEIL_DIV(in.stored - in.released, PS));
        assert_int_equal(ms_page_arena_num_free(f.arena), free0 - in.n_pages);
    }
    kv_check_pages(&f);
    kv_fix_free(&f);
}

/* The view starts at the released position; write addresses and index arrays follow. */
static void test_retention_view_start_and_addresses(void **state) {
    (void)state;
    kv_fix f;
    init_window(&f, 32, 10);
    kv_ingest(&f, 1);
    float tok = 0;
    for (int k = 0; k < 30; k++) {
        kv_tstep t;
        kv_step_init(&t, true);
        int32_t span = k == 0 ? 13 : 1;
        kv_step_seg(&t, 1, 0, span);
        assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_OK);
        const ms_kv_plan *p = &kv_plan(&f, &t)->plans[0];
        const ms_kv_view *v = &p->views[0];
        assert_int_equal(v->start % PS, 0);
        assert_int_equal(p->kv_start[0], v->start);
        assert_int_equal(v->start + v->length, (int32_t)tok + span);
        assert_int_equal(v->n_pages, MS_CEIL_DIV(v->length, PS));
        int32_t last = (v->start + v->length) % PS;
        assert_int_equal(p->kv_last_page_len[0], last == 0 ? PS : last);
        kv_write_plan(f.arena, p, tok);
        tok += (float)span;
        kv_commit(&f, &t);
        /* every retained token reads back at its logical position */
        ms_kv_stream_info in = kv_info(&f, 1, 0);
        int32_t pages[8];
        assert_true(ms_kv_pool_stream_pages(f.pool, 1, 0, pages, 8) <= 8);
        for (int32_t x = in.released; x < in.stored; x++)
            assert_true(kv_token_is(f.arena, pages[(x - in.released) / PS],
                                    (x - in.released) % PS, (float)x));
    }
    assert_true(kv_info(&f, 1, 0).released > 0);
    kv_fix_free(&f);
}

/* Admit sizes the reservation from stored + span - released, not from the logical length. */
static void test_retention_admit_sizes_from_physical_remainder(void **state) {
    (void)state;
    kv_fix f;
    init_window(&f, 5, 8); /* 4 usable pages */
    kv_ingest(&f, 1);
    for (int k = 0; k < 200; k++)
        kv_extend(&f, 1, 0, 3); /* 600 logical tokens through 4 pages */
    ms_kv_stream_info in = kv_info(&f, 1, 0);
    assert_int_equal(in.stored, 600);
    assert_true(in.n_pages <= 3);
    /* a step that does not fit the remainder fails with the right shortfall */
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 5 * PS);
    ms_admit_outcome o = kv_admit(&f, &t);
    assert_int_equal(o.code, MS_ADMIT_PAGES_SHORT);
    int32_t need = MS_CEIL_DIV(in.stored - in.released + 5 * PS, PS) - in.n_pages;
    assert_int_equal(o.pages_short, need - ms_page_arena_num_free(f.arena));
    kv_check_pages(&f);
    kv_fix_free(&f);
}

/* A long prefill reserves for the whole span, then commit drops what the window does not keep. */
static void test_retention_prefill_longer_than_window(void **state) {
    (void)state;
    kv_fix f;
    init_window(&f, 32, 16);
    kv_ingest(&f, 1);
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 100);
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_OK);
    assert_int_equal(kv_info(&f, 1, 0).n_pages, 13);
    kv_plan(&f, &t);
    kv_commit(&f, &t);
    ms_kv_stream_info in = kv_info(&f, 1, 0);
    assert_int_equal(in.released, 80);
    assert_int_equal(in.n_pages, 3);
    assert_int_equal(ms_page_arena_num_free(f.arena), 31 - 3);
    kv_fix_free(&f);
}

/* Streams without a window are untouched; windows per request and per label. */
static void test_retention_only_configured_streams(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 64, PS, 0);
    ms_error err = {0};
    ms_kv_request_config rc = {.set_window = true, .window = 8};
    assert_int_equal(ms_kv_pool_ingest(f.pool, 1, &rc, &err), MS_OK);
    kv_ingest(&f, 2);
    kv_ingest(&f, 3);
    assert_int_equal(ms_kv_pool_set_window(f.pool, 3, 4, 8, &err), MS_OK);
    assert_int_equal(ms_kv_pool_set_window(f.pool, 99, 0, 8, &err), MS_ERR_NOT_FOUND);
    assert_int_equal(ms_kv_pool_set_window(f.pool, 3, 0, -1, &err), MS_ERR_INVALID_ARG);
    for (int k = 0; k < 10; k++) {
        kv_tstep t;
        kv_step_init(&t, true);
        kv_step_seg(&t, 1, 0, 4);
        kv_step_seg(&t, 2, 0, 4);
        kv_step_seg(&t, 3, 0, 4);
        kv_step_seg(&t, 3, 4, 4);
        kv_run(&f, &t);
    }
    assert_true(kv_info(&f, 1, 0).released > 0);
    assert_int_equal(kv_info(&f, 2, 0).released, 0);
    assert_int_equal(kv_info(&f, 2, 0).n_pages, 5);
    assert_int_equal(kv_info(&f, 3, 0).released, 0);
    assert_true(kv_info(&f, 3, 4).released > 0);
    assert_int_equal(kv_info(&f, 3, 4).window, 8);
    kv_check_pages(&f);
    for (ms_rid r = 1; r <= 3; r++)
        ms_kv_pool_remove(f.pool, r);
    assert_int_equal(ms_page_arena_num_free(f.arena), 63);
    assert_int_equal(ms_kv_pool_num_requests(f.pool), 0);
    kv_fix_free(&f);
}

/* A fork copies the source's retained pages and its start. */
static void test_retention_fork_mirrors_start(void **state) {
    (void)state;
    kv_fix f;
    init_window(&f, 32, 8);
    kv_ingest(&f, 1);
    for (int k = 0; k < 6; k++)
        kv_extend(&f, 1, 0, 5);
    ms_kv_stream_info src = kv_info(&f, 1, 0);
    assert_true(src.released > 0);
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 0);
    kv_step_post_fork(&t, 0, 2);
    kv_run(&f, &t);
    ms_kv_stream_info dst = kv_info(&f, 1, 2);
    assert_int_equal(dst.stored, src.stored);
    assert_int_equal(dst.released, src.released);
    assert_int_equal(dst.n_pages, src.n_pages);
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 2, 1);
    const ms_kv_plan *p = &kv_run(&f, &t)->plans[0];
    assert_int_equal(p->views[0].start, src.released);
    kv_check_pages(&f);
    kv_fix_free(&f);
}

/* Retention also applies to a step planned after a non-committing reservation. */
static void test_retention_with_noncommit_reservation(void **state) {
    (void)state;
    kv_fix f;
    init_window(&f, 32, 8);
    kv_ingest(&f, 1);
    kv_extend(&f, 1, 0, 30);
    kv_tstep t;
    kv_step_init(&t, false);
    kv_step_seg(&t, 1, 0, 20); /* reserve ahead without committing */
    kv_run(&f, &t);
    ms_kv_stream_info in = kv_info(&f, 1, 0);
    assert_int_equal(in.stored, 30);
    kv_extend(&f, 1, 0, 1);
    in = kv_info(&f, 1, 0);
    assert_int_equal(in.stored, 31);
    assert_true(in.stored - in.released >= 8);
    /* the high-water tail is still there and never exceeds the reservation */
    assert_true(in.n_pages >= MS_CEIL_DIV(in.stored - in.released, PS));
    kv_check_pages(&f);
    kv_fix_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_retention_releases_whole_pages_at_page_granularity),
        ms_unit_test(test_retention_view_start_and_addresses),
        ms_unit_test(test_retention_admit_sizes_from_physical_remainder),
        ms_unit_test(test_retention_prefill_longer_than_window),
        ms_unit_test(test_retention_only_configured_streams),
        ms_unit_test(test_retention_fork_mirrors_start),
        ms_unit_test(test_retention_with_noncommit_reservation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
