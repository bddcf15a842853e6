/*
 * test_tp_check.c - tensor-parallel KV symmetry simulated in one process: four ranks (threads),
 * each with its own arena and pool, run the same admissions and compare allocation digests
 * through the in-process all-gather (collective.h). Symmetric ranks agree at every step; a rank
 * that admitted one request more, or whose free list was reordered so equal counts hide
 * different page ids (hazard H17), fails every rank naming it. Also the local group's own
 * contract: size mismatch, abort, back-to-back rounds (run under TSan too).
 */
#include "ms_test.h"

#include <pthread.h>

#include "collective.h"
#include "kv_test_util.h"
#include "ms_test_impl.h"
#include "tp_check.h"

#define PS 8
#define WORLD 4

typedef enum fault { FAULT_NONE, FAULT_EXTRA_REQUEST, FAULT_REORDERED_FREE_LIST } fault;

typedef struct rank_arg {
    ms_collective_local *group;
    int32_t rank;
    fault fault;
    int32_t fault_rank;
    int32_t steps;
    ms_status first_fail;  /* status of the first failed check */
    int32_t fail_step;     /* step it failed at, -1 none */
    char msg[MS_ERROR_MSG_MAX];
} rank_arg;

static void *rank_main(void *p) {
    rank_arg *a = p;
    ms_collective c = ms_collective_local_rank(a->group, a->rank);
    kv_fix f;
    kv_fix_init(&f, 64, PS, 0);
    a->fail_step = -1;
    a->first_fail = MS_OK;
    if (a->rank == a->fault_rank && a->fault == FAULT_REORDERED_FREE_LIST) {
        /* take and give back pages in another order: same free count, other ids next */
        int32_t pages[5];
        if (ms_page_arena_acquire(f.arena, 5, pages) == MS_OK)
            for (int i = 4; i >= 0; i -= 2)
                (void)ms_page_arena_release(f.arena, &pages[i], 1, NULL);
        (void)ms_page_arena_release(f.arena, &pages[1], 1, NULL);
        (void)ms_page_arena_release(f.arena, &pages[3], 1, NULL);
    }
    if (a->rank == a->fault_rank && a->fault == FAULT_EXTRA_REQUEST) {
        kv_ingest(&f, 99);
        kv_extend(&f, 99, MS_LABEL_MAIN, 3);
    }
    ms_error err = {0};
    /* warm-up check, then a check after every step of a deterministic schedule */
    ms_status st = ms_tp_check_allocation(&c, f.pool, "after warm-up", &err);
    if (st != MS_OK) {
        a->first_fail = st;
        a->fail_step = 0;
        snprintf(a->msg, sizeof a->msg, "%s", err.msg);
    }
    for (int32_t s = 1; s <= a->steps && a->fail_step < 0; s++) {
        ms_rid rid = 1 + (ms_rid)(s % 5);
        if (!ms_kv_pool_has_request(f.pool, rid))
            kv_ingest(&f, rid);
        kv_extend(&f, rid, MS_LABEL_MAIN, 1 + (s * 7) % 11);
        if (s % 9 == 0)
            ms_kv_pool_remove(f.pool, rid);
        char when[32];
        snprintf(when, sizeof when, "step %d", s);
        st = ms_tp_check_allocation(&c, f.pool, when, &err);
        if (st != MS_OK) {
            a->first_fail = st;
            a->fail_step = s;
            snprintf(a->msg, sizeof a->msg, "%s", err.msg);
        }
    }
    kv_fix_free(&f);
    return NULL;
}

static void run_group(fault fl, int32_t fault_rank, int32_t steps, rank_arg *args) {
    ms_error err = {0};
    ms_collective_local *g = NULL;
    assert_int_equal(ms_collective_local_init(WORLD, 64, &g, &err), MS_OK);
    pthread_t th[WORLD];
    for (int32_t r = 0; r < WORLD; r++) {
        args[r] = (rank_arg){.group = g, .rank = r, .fault = fl, .fault_rank = fault_rank,
                             .steps = steps};
        assert_int_equal(pthread_create(&th[r], NULL, rank_main, &args[r]), 0);
    }
    for (int32_t r = 0; r < WORLD; r++)
        pthread_join(th[r], NULL);
    ms_collective_local_free(g);
}

static void test_symmetric_ranks_agree_every_step(void **state) {
    (void)state;
    rank_arg args[WORLD];
    run_group(FAULT_NONE, -1, 200, args);
    for (int32_t r = 0; r < WORLD; r++) {
        if (args[r].fail_step >= 0)
            fail_msg("rank %d failed at step %d: %s", r, args[r].fail_step, args[r].msg);
    }
}

static void test_extra_request_on_one_rank_is_caught(void **state) {
    (void)state;
    rank_arg args[WORLD];
    run_group(FAULT_EXTRA_REQUEST, 2, 20, args);
    for (int32_t r = 0; r < WORLD; r++) {
        assert_int_equal(args[r].first_fail, MS_ERR_STATE);
        assert_int_equal(args[r].fail_step, 0); /* at the warm-up check, on every rank */
        assert_non_null(strstr(args[r].msg, "after warm-up"));
        assert_non_null(strstr(args[r].msg, "rank 2 has"));
    }
}

static void test_equal_counts_different_pages_are_caught(void **state) {
    (void)state;
    rank_arg args[WORLD];
    run_group(FAULT_REORDERED_FREE_LIST, 1, 20, args);
    for (int32_t r = 0; r < WORLD; r++) {
        assert_int_equal(args[r].first_fail, MS_ERR_STATE);
        /* the warm-up check passes (nothing allocated yet, counts equal): the first admission
           takes other page ids on rank 1 and the digest catches it at step 1 */
        assert_int_equal(args[r].fail_step, 1);
        assert_non_null(strstr(args[r].msg, "page tables of rank 0 and rank 1 differ"));
    }
}

/* ---- the local group itself ---- */

typedef struct ga {
    ms_collective_local *g;
    int32_t rank;
    size_t bytes;
    ms_status st;
    int32_t got[WORLD];
} ga;

static void *gather_once(void *p) {
    ga *a = p;
    ms_collective c = ms_collective_local_rank(a->g, a->rank);
    int32_t mine = 100 + a->rank;
    ms_error err = {0};
    a->st = ms_collective_all_gather(&c, &mine, a->bytes, a->got, &err);
    return NULL;
}

static void test_local_group_contract(void **state) {
    (void)state;
    ms_error err = {0};
    ms_collective_local *g = NULL;
    assert_int_equal(ms_collective_local_init(0, 4, &g, &err), MS_ERR_INVALID_ARG);
    assert_int_equal(ms_collective_local_init(WORLD, 4, &g, &err), MS_OK);
    pthread_t th[WORLD];
    ga a[WORLD];
    /* a round: everyone gets everyone's value in rank order */
    for (int32_t r = 0; r < WORLD; r++) {
        a[r] = (ga){g, r, sizeof(int32_t), MS_OK, {0}};
        pthread_create(&th[r], NULL, gather_once, &a[r]);
    }
    for (int32_t r = 0; r < WORLD; r++)
        pthread_join(th[r], NULL);
    for (int32_t r = 0; r < WORLD; r++) {
        assert_int_equal(a[r].st, MS_OK);
        for (int32_t k = 0; k < WORLD; k++)
            assert_int_equal(a[r].got[k], 100 + k);
    }
    /* disagreeing sizes fail every rank of that round */
    for (int32_t r = 0; r < WORLD; r++) {
        a[r] = (ga){g, r, r == 3 ? 2 : sizeof(int32_t), MS_OK, {0}};
        pthread_create(&th[r], NULL, gather_once, &a[r]);
    }
    for (int32_t r = 0; r < WORLD; r++)
        pthread_join(th[r], NULL);
    for (int32_t r = 0; r < WORLD; r++)
        assert_int_equal(a[r].st, MS_ERR_INVALID_ARG);
    /* over the group's size: refused at once */
    ms_collective c0 = ms_collective_local_rank(g, 0);
    char big[8] = {0}, out[8 * WORLD];
    assert_int_equal(ms_collective_all_gather(&c0, big, 8, out, &err), MS_ERR_INVALID_ARG);
    /* a rank that never comes: abort releases the waiting ones */
    for (int32_t r = 0; r < WORLD - 1; r++) {
        a[r] = (ga){g, r, sizeof(int32_t), MS_OK, {0}};
        pthread_create(&th[r], NULL, gather_once, &a[r]);
    }
    ms_collective_local_abort(g);
    for (int32_t r = 0; r < WORLD - 1; r++) {
        pthread_join(th[r], NULL);
        assert_int_equal(a[r].st, MS_ERR_STATE);
    }
    ms_collective_local_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_symmetric_ranks_agree_every_step),
        ms_unit_test(test_extra_request_on_one_rank_is_caught),
        ms_unit_test(test_equal_counts_different_pages_are_caught),
        ms_unit_test(test_local_group_contract),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
