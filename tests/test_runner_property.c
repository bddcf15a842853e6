/*
 * test_runner_property.c - randomized property test of the step runner over the real KV pool,
 * positions and attention: random ingest, remove, reset (with and without freeing), steps over
 * random batches and labels with random spans, commit/non-commit, pre- and post-forks, abandoned
 * steps, admits refused for lack of pages and injected host allocation failures. After every
 * operation:
 *   - every sequential position counter equals its stream's stored length (positions and KV
 *     advance, fork, roll back and reset together), 0 for a label KV does not hold;
 *   - every page is free or owned exactly as counted, the sink never handed out;
 *   - removed requests hold nothing.
 * The seed is printed; MS_SEED=<n> reproduces a run.
 */
#include "ms_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attn_plan.h"
#include "kv_pool.h"
#include "kv_test_util.h"
#include "positions.h"
#include "step_runner.h"

#include "ms_test_impl.h"

#define N_OPS 20000
#define MAX_LIVE 8
#define N_LABELS 3

static uint64_t rng_state;

static uint32_t rnd(uint32_t n) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

static const char *const deps_kv[] = {"kv"};

typedef struct world {
    kv_fix kv;
    ms_step_runner *r;
    ms_positions *pos;
    ms_rid live[MAX_LIVE];
    int n_live;
    ms_rid next_rid;
    int n_steps, n_refused, n_abandoned, n_removed, n_oom;
} world;

static void check_world(world *w, uint64_t seed, int op) {
    for (int i = 0; i < w->n_live; i++)
        for (ms_label l = 0; l < N_LABELS; l++) {
            int32_t p = -1;
            assert_int_equal(ms_positions_position(w->pos, w->live[i], l, &p, NULL), MS_OK);
            ms_kv_stream_info info;
            int32_t stored = 0;
            if (ms_kv_pool_stream_info(w->kv.pool, w->live[i], l, &info) == MS_OK)
                stored = info.stored;
            if (p != stored)
                fail_msg("seed %llu op %d: request %llu label %d position %d != stored %d",
                         (unsigned long long)seed, op, (unsigned long long)w->live[i], l, p,
                         stored);
        }
    kv_check_pages(&w->kv);
    assert_int_equal(ms_kv_pool_num_requests(w->kv.pool), w->n_live);
    assert_int_equal(ms_positions_count(w->pos), (size_t)w->n_live);
}

static void random_step(world *w) {
    if (w->n_live == 0)
        return;
    ms_segment segs[MAX_LIVE * N_LABELS];
    ms_rid rows[MAX_LIVE];
    int32_t n = 0, n_rows = 0;
    for (int i = 0; i < w->n_live; i++) {
        if (rnd(2) == 0)
            continue;
        rows[n_rows++] = w->live[i];
        for (ms_label l = 0; l < N_LABELS; l++)
            if (l == 0 || rnd(3) == 0)
                segs[n++] = (ms_segment){w->live[i], l, (int32_t)rnd(6)};
    }
    if (n == 0)
        return;
    ms_kv_step ks = {.commit = rnd(5) != 0};
    ms_fork pre = {0, 1}, post = {0, 2};
    if (rnd(4) == 0) {
        ks.pre_forks = &pre;
        ks.n_pre_forks = 1;
    }
    if (rnd(4) == 0) {
        ks.post_forks = &post;
        ks.n_post_forks = 1;
    }
    ms_pos_step ps = {.n_axes = 1};
    ms_attn_step as = {.causal = true};
    ms_step step = {.name = "random", .segments = segs, .n_segments = n};
    step.records[0].rec = &ks;
    step.records[1].rec = &ps;
    step.records[2].rec = &as;
    ms_step_ctx ctx = {.request_ids = rows, .n_rows = n_rows, .n_real = n_rows};
    bool inject = rnd(20) == 0; /* a host allocation fails somewhere in admit or plan */
    if (inject)
        ms_alloc_fail_nth(1 + rnd(4));
    ms_admit_outcome o = ms_step_runner_admit(w->r, &step, &ctx);
    if (o.code != MS_ADMIT_OK) {
        ms_alloc_fail_nth(0);
        if (o.code == MS_ADMIT_NO_MEMORY && inject) {
            w->n_oom++;
            return;
        }
        if (o.code != MS_ADMIT_PAGES_SHORT)
            fail_msg("admit: %s (resource %d)", ms_admit_code_str(o.code), o.resource);
        w->n_refused++;
        return;
    }
    ms_error err = {0};
    if (inject) {
        ms_status st = ms_step_runner_plan(w->r, &step, &ctx, &err);
        ms_alloc_fail_nth(0);
        if (st != MS_OK) {
            if (st != MS_ERR_OOM)
                fail_msg("plan: %s", err.msg);
            w->n_oom++; /* the runner abandoned the step: nothing may remain */
            return;
        }
        if (ms_step_runner_commit(w->r, &step, &ctx, &err) != MS_OK)
            fail_msg("commit: %s", err.msg);
        w->n_steps++;
        return;
    }
    if (rnd(10) == 0) { /* admitted, never planned: a dropped batch */
        ms_step_runner_abandon(w->r, &step, &ctx);
        w->n_abandoned++;
        return;
    }
    if (ms_step_runner_plan(w->r, &step, &ctx, &err) != MS_OK)
        fail_msg("plan: %s", err.msg);
    if (rnd(10) == 0) { /* planned (forks applied), then dropped */
        ms_step_runner_abandon(w->r, &step, &ctx);
        w->n_abandoned++;
        return;
    }
    if (ms_step_runner_commit(w->r, &step, &ctx, &err) != MS_OK)
        fail_msg("commit: %s", err.msg);
    w->n_steps++;
}

static void test_runner_property_positions_track_kv(void **state) {
    (void)state;
    uint64_t seed = (uint64_t)time(NULL);
    const char *env = getenv("MS_SEED");
    if (env != NULL && env[0] != '\0')
        seed = strtoull(env, NULL, 10);
    printf("runner property: seed %llu (MS_SEED=%llu reproduces)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    rng_state = seed * 2654435761u + 1;
    world w;
    memset(&w, 0, sizeof w);
    w.next_rid = 1;
    kv_fix_init(&w.kv, 48, 4, 0);
    ms_positions_config pc = {MS_POS_SEQUENTIAL, 1, 1, 512, "kv"};
    ms_attn_config ac = {"kv", 64, 512};
    ms_resource_spec specs[] = {
        {"kv", MS_RESOURCE_KV, NULL, 0, NULL, NULL, w.kv.pool, ms_kv_pool_resource_i()},
        {"pos", MS_RESOURCE_POS, deps_kv, 1, ms_positions_build, &pc, NULL, NULL},
        {"attn", MS_RESOURCE_ATTN, deps_kv, 1, ms_attn_build, &ac, NULL, NULL},
    };
    ms_error err = {0};
    assert_int_equal(ms_step_runner_init(&w.r, specs, 3, &err), MS_OK);
    w.pos = ms_step_runner_resource(w.r, 1);
    for (int op = 0; op < N_OPS; op++) {
        uint32_t kind = rnd(20);
        if (kind < 2 && w.n_live < MAX_LIVE) {
            ms_rid rid = w.next_rid++;
            assert_int_equal(ms_step_runner_ingest(w.r, rid, NULL, &err), MS_OK);
            w.live[w.n_live++] = rid;
        } else if (kind < 4 && w.n_live > 0) {
            int i = (int)rnd((uint32_t)w.n_live);
            ms_step_runner_remove(w.r, w.live[i]);
            assert_false(ms_kv_pool_has_request(w.kv.pool, w.live[i]));
            w.live[i] = w.live[--w.n_live];
            w.n_removed++;
        } else if (kind < 5 && w.n_live > 0) {
            ms_step_runner_reset(w.r, w.live[rnd((uint32_t)w.n_live)], rnd(2) == 0);
        } else {
            random_step(&w);
        }
        check_world(&w, seed, op);
    }
    printf("runner property: %d steps, %d refused for pages, %d abandoned, %d removed, "
           "%d failed host allocations\n",
           w.n_steps, w.n_refused, w.n_abandoned, w.n_removed, w.n_oom);
    assert_true(w.n_steps > 1000);
    assert_true(w.n_refused > 0);
    assert_true(w.n_abandoned > 0);
    assert_true(w.n_oom > 0);
    while (w.n_live > 0)
        ms_step_runner_remove(w.r, w.live[--w.n_live]);
    check_world(&w, seed, N_OPS);
    ms_step_runner_free(w.r);
    kv_fix_free(&w.kv);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_runner_property_positions_track_kv),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
