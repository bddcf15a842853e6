/*
 * test_kv_property.c - randomized property test of the KV pool: at least 100,000 operations
 * (ingest, admit, plan, commit, rollback, forks, combined labels, retention, offload, reload,
 * publish + retrieve, reset, remove) over many requests, with injected host allocation failures
 * (ms_alloc_fail_nth) and page exhaustion. After every operation: every page is free or owned
 * exactly as counted, the free count is conserved, the sink page is never handed out, removed
 * requests own nothing; every plan's views fit their pages and no two new tokens share a write
 * address; a failed admit changes nothing.
 *
 * The seed is printed; MS_SEED=<n> reproduces a run, MS_OPS=<n> changes the operation count.
 */
#include "ms_test.h"

#include <time.h>

#include "kv_test_util.h"
#include "ms_test_impl.h"

#define N_RIDS 24
#define N_LABELS 4

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define DEFAULT_OPS 60000 /* sanitizer builds: keep the binary within ~20 s on a loaded box */
#else
#define DEFAULT_OPS 100000
#endif

/* ---- random numbers ---- */

static uint64_t g_rng;
static int32_t g_ps = 4; /* page size of this run: 1, 2, 4, 8 or 16 from the seed */

static uint64_t rnd(void) {
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * UINT64_C(2685821657736338717);
}

/* Uniform in [0, n). */
static int32_t rn(int32_t n) { return (int32_t)(rnd() % (uint64_t)n); }

/* True with probability p percent. */
static bool pct(int32_t p) { return rn(100) < p; }

/* ---- a transfer back end whose transfers finish at random ---- */

typedef struct rand_xfer {
    uint8_t *state;   /* [cap] ms_kv_transfer_state per handle */
    size_t n, cap;
    bool fail_next_start;
} rand_xfer;

static ms_status rx_start(void *ctx, const ms_kv_transfer_desc *d, uint64_t *h, ms_error *err) {
    rand_xfer *x = ctx;
    /* the descriptor is consistent with the stream it fills */
    assert_true(d->token_begin < d->token_end);
    assert_true(d->n_local_pages >= MS_CEIL_DIV(d->token_end - d->start, d->page_size));
    for (int32_t i = 0; i < d->n_local_pages; i++)
        assert_int_not_equal(d->local_pages[i], MS_SINK_PAGE);
    if (x->fail_next_start) {
        x->fail_next_start = false;
        return MS_FAIL(err, MS_ERR_IO, "injected start failure");
    }
    if (x->n == x->cap) {
        x->cap = x->cap == 0 ? 1024 : x->cap * 2;
        x->state = realloc(x->state, x->cap);
        assert_non_null(x->state);
    }
    x->state[x->n] = MS_KV_TRANSFER_PENDING;
    *h = x->n++;
    return MS_OK;
}

static ms_kv_transfer_state rx_poll(void *ctx, uint64_t h) {
    rand_xfer *x = ctx;
    if (x->state[h] == MS_KV_TRANSFER_PENDING) {
        int32_t r = rn(100);
        if (r < 40)
            x->state[h] = MS_KV_TRANSFER_DONE;
        else if (r < 43)
            x->state[h] = MS_KV_TRANSFER_FAILED;
    }
    return x->state[h];
}

static ms_kv_transfer_state rx_wait(void *ctx, uint64_t h) {
    rand_xfer *x = ctx;
    if (x->state[h] == MS_KV_TRANSFER_PENDING)
        x->state[h] = pct(95) ? MS_KV_TRANSFER_DONE : MS_KV_TRANSFER_FAILED;
    return x->state[h];
}

static const ms_kv_transfer_i rx_i = {.start = rx_start, .poll = rx_poll, .wait = rx_wait};

/* ---- the model ---- */

typedef struct prop {
    kv_fix f;
    rand_xfer xfer;
    ms_rid rids[N_RIDS];
    bool ingested[N_RIDS];
    kv_tstep held;         /* an admitted step kept across operations */
    bool holding;
    int64_t counts[16];    /* operations by kind (for the summary line) */
    int64_t by_code[MS_ADMIT_CODE_COUNT];
    int64_t admits_ok, admits_short, admits_other, plans, offloads, reloads, retrieves;
} prop;

static ms_rid pick_rid(prop *p) { return p->rids[rn(N_RIDS)]; }

/* Snapshot of every stream of every rid (for "a failed admit changes nothing"). */
typedef struct snap {
    bool exists[N_RIDS][N_LABELS];
    ms_kv_stream_info info[N_RIDS][N_LABELS];
} snap;

static void take_snap(prop *p, snap *s) {
    for (int i = 0; i < N_RIDS; i++)
        for (ms_label l = 0; l < N_LABELS; l++)
            s->exists[i][l] =
                ms_kv_pool_stream_info(p->f.pool, p->rids[i], l, &s->info[i][l]) == MS_OK;
}

static void same_snap(const snap *a, const snap *b) {
    for (int i = 0; i < N_RIDS; i++)
        for (int l = 0; l < N_LABELS; l++) {
            assert_int_equal(a->exists[i][l], b->exists[i][l]);
            if (!a->exists[i][l])
                continue;
            const ms_kv_stream_info *x = &a->info[i][l], *y = &b->info[i][l];
            assert_int_equal(x->stored, y->stored);
            assert_int_equal(x->released, y->released);
            assert_int_equal(x->n_pages, y->n_pages);
            assert_int_equal(x->generation, y->generation);
            assert_int_equal(x->step_in_flight, y->step_in_flight);
            assert_int_equal(x->offloaded, y->offloaded);
        }
}

/* Random step over ingested requests: distinct (rid, label) segments, forks, combined labels. */
static bool build_step(prop *p, kv_tstep *t) {
    kv_step_init(t, pct(85));
    int32_t n = 1 + rn(6);
    bool used[N_RIDS][N_LABELS] = {{false}};
    for (int32_t k = 0; k < n; k++) {
        int i = rn(N_RIDS);
        if (!p->ingested[i] && !pct(3))
            continue; /* mostly known requests; sometimes an unknown one (INVALID) */
        ms_label l = pct(60) ? 0 : (ms_label)rn(N_LABELS);
        if (used[i][l])
            continue;
        used[i][l] = true;
        int32_t r = rn(100);
        int32_t span = r < 55 ? 1 : r < 65 ? 0 : r < 90 ? 1 + rn(12) : 1 + rn(48);
        kv_step_seg(t, p->rids[i], l, span);
    }
    if (t->step.n_segments == 0)
        return false;
    if (pct(10)) {
        ms_label a = (ms_label)rn(N_LABELS), b = (ms_label)rn(N_LABELS);
        if (a != b)
            kv_step_pre_fork(t, a, b);
    }
    if (pct(10)) {
        ms_label a = (ms_label)rn(N_LABELS), b = (ms_label)rn(N_LABELS);
        if (a != b)
            kv_step_post_fork(t, a, b);
    }
    if (pct(10)) {
        /* combine labels 0 and 1 when both have segments */
        bool has0 = false, has1 = false;
        for (int32_t k = 0; k < t->step.n_segments; k++) {
            has0 = has0 || t->segs[k].label == 0;
            has1 = has1 || t->segs[k].label == 1;
        }
        if (has0 && has1) {
            t->comb[0] = (ms_combined_label){{0, 1}, 2, 9};
            t->ks.n_combined = 1;
        }
    }
    if (pct(20)) /* forks over explicit rows, as under capture */
        for (int32_t k = 0; k < t->step.n_segments; k++) {
            bool dup = false;
            for (int32_t j = 0; j < t->ctx.n_rows; j++)
                dup = dup || t->rows[j] == t->segs[k].rid;
            if (!dup)
                kv_step_row(t, t->segs[k].rid);
        }
    return true;
}

/* Check a plan against the pool: views fit their pages, addresses are distinct and inside. */
static void check_plan(prop *p, const kv_tstep *t, const ms_kv_plan_set *set) {
    assert_int_equal(set->page_size, g_ps);
    int32_t n_views = 0;
    static int32_t seen_page[4096], seen_slot[4096];
    int32_t n_seen = 0;
    for (int32_t q = 0; q < set->n_plans; q++) {
        const ms_kv_plan *pl = &set->plans[q];
        n_views += pl->n_views;
        assert_int_equal(pl->qo_indptr[0], 0);
        assert_int_equal(pl->kv_indptr[0], 0);
        bool decode = pl->n_views > 0;
        for (int32_t v = 0; v < pl->n_views; v++) {
            const ms_kv_view *w = &pl->views[v];
            assert_int_equal(w->n_pages, MS_CEIL_DIV(w->length, g_ps));
            assert_int_equal(w->start % g_ps, 0);
            assert_int_equal(pl->qo_indptr[v + 1] - pl->qo_indptr[v], w->to_compute);
            assert_int_equal(pl->kv_indptr[v + 1] - pl->kv_indptr[v], w->n_pages);
            int32_t last = w->length % g_ps;
            assert_int_equal(pl->kv_last_page_len[v],
                             w->n_pages == 0 ? 0 : (last == 0 ? g_ps : last));
            assert_int_equal(pl->kv_start[v], w->start);
            decode = decode && w->to_compute == 1;
            /* the view is a prefix of the stream's page list */
            int32_t pages[256];
            int32_t np = ms_kv_pool_stream_pages(p->f.pool, w->rid, w->label, pages, 256);
            if (w->n_pages > 0 && np < w->n_pages)
                fail_msg("view rid %llu label %d: %d pages, stream holds %d (len %d start %d "
                         "to_compute %d)", (unsigned long long)w->rid, w->label, w->n_pages, np,
                         w->length, w->start, w->to_compute);
            for (int32_t k = 0; k < w->n_pages; k++) {
                assert_int_equal(w->pages[k], pages[k]);
                assert_int_equal(pl->kv_indices[pl->kv_indptr[v] + k], pages[k]);
                assert_int_not_equal(pages[k], MS_SINK_PAGE);
            }
            for (int32_t j = 0; j < w->to_compute; j++) {
                int32_t tok = pl->qo_indptr[v] + j;
                int32_t off = w->length - w->to_compute + j;
                assert_int_equal(pl->token_to_page[tok], w->pages[off / g_ps]);
                assert_int_equal(pl->token_to_slot[tok], off % g_ps);
                assert_true(n_seen < 4096);
                for (int32_t s = 0; s < n_seen; s++)
                    assert_false(seen_page[s] == pl->token_to_page[tok] &&
                                 seen_slot[s] == pl->token_to_slot[tok]);
                seen_page[n_seen] = pl->token_to_page[tok];
                seen_slot[n_seen++] = pl->token_to_slot[tok];
            }
        }
        assert_int_equal(pl->is_decode, decode);
        assert_int_equal(pl->n_tokens, pl->qo_indptr[pl->n_views]);
    }
    assert_int_equal(n_views, t->step.n_segments);
}

/* Resolve the held step: plan (checked) then commit, or roll back. */
static void finish_step(prop *p, kv_tstep *t) {
    const ms_kv_plan_set *set = NULL;
    ms_error err = {0};
    ms_status st = ms_kv_pool_plan(p->f.pool, 0, &t->step, kv_ctx(t), &set, &err);
    if (st == MS_OK) {
        p->plans++;
        check_plan(p, t, set);
    }
    if (st == MS_OK && pct(92)) {
        (void)ms_kv_pool_commit(p->f.pool, 0, &t->step, kv_ctx(t), &err);
    } else {
        ms_kv_pool_admit_rollback(p->f.pool, 0, &t->step, kv_ctx(t));
    }
}

static void op_step(prop *p) {
    kv_tstep *t = &p->held;
    if (p->holding) {
        p->holding = false;
        finish_step(p, t);
        return;
    }
    if (!build_step(p, t))
        return;
    static snap before, after;
    take_snap(p, &before);
    int32_t free0 = ms_page_arena_num_free(p->f.arena);
    ms_admit_outcome o = kv_admit(&p->f, t);
    if (o.code != MS_ADMIT_OK) {
        if (o.code == MS_ADMIT_PAGES_SHORT) {
            p->admits_short++;
            assert_true(o.pages_short > 0);
        } else {
            p->admits_other++;
            p->by_code[o.code]++;
        }
        assert_int_equal(ms_page_arena_num_free(p->f.arena), free0);
        take_snap(p, &after);
        /* a failed admit changes nothing (a finished transfer may have been collected) */
        if (o.code != MS_ADMIT_PENDING && o.code != MS_ADMIT_TRANSFER_FAILED)
            same_snap(&before, &after);
        return;
    }
    p->admits_ok++;
    if (pct(30)) {
        p->holding = true; /* keep it in flight across a few operations */
        return;
    }
    finish_step(p, t);
}

static void op_offload(prop *p) {
    ms_rid rid;
    ms_rid cand[4];
    if (pct(50) && ms_kv_pool_lru_candidates(p->f.pool, cand, 4) > 0)
        rid = cand[0];
    else
        rid = pick_rid(p);
    ms_error err = {0};
    int32_t freed = 0;
    int32_t free0 = ms_page_arena_num_free(p->f.arena);
    ms_status st = ms_kv_pool_offload(p->f.pool, rid, &freed, &err);
    if (st == MS_OK) {
        p->offloads++;
        assert_int_equal(ms_page_arena_num_free(p->f.arena), free0 + freed);
        assert_int_equal(ms_kv_pool_reclaimable(p->f.pool, rid), 0);
    } else {
        assert_int_equal(ms_page_arena_num_free(p->f.arena), free0);
    }
}

static void op_reload(prop *p) {
    /* mostly an offloaded request, as a scheduler would pick */
    ms_rid off[N_RIDS];
    int n_off = 0;
    for (int i = 0; i < N_RIDS; i++)
        if (ms_kv_pool_is_offloaded(p->f.pool, p->rids[i]))
            off[n_off++] = p->rids[i];
    ms_rid rid = n_off > 0 && pct(90) ? off[rn(n_off)] : pick_rid(p);
    bool was = ms_kv_pool_is_offloaded(p->f.pool, rid);
    ms_error err = {0};
    ms_status st = ms_kv_pool_reload(p->f.pool, rid, &err);
    if (st == MS_OK) {
        if (was)
            p->reloads++;
        assert_false(ms_kv_pool_is_offloaded(p->f.pool, rid));
    } else if (was) {
        assert_true(ms_kv_pool_is_offloaded(p->f.pool, rid));
    }
}

static void op_retrieve(prop *p) {
    ms_rid from = pick_rid(p), to = pick_rid(p);
    ms_kv_published *pub = NULL;
    ms_error err = {0};
    if (ms_kv_pool_publish(p->f.pool, from, &pub, &err) != MS_OK)
        return;
    p->xfer.fail_next_start = pct(3);
    int32_t free0 = ms_page_arena_num_free(p->f.arena);
    ms_admit_outcome o = ms_kv_pool_admit_retrieve(p->f.pool, to, pub);
    p->xfer.fail_next_start = false;
    if (o.code == MS_ADMIT_OK || o.code == MS_ADMIT_PENDING)
        p->retrieves++;
    if (o.code == MS_ADMIT_PAGES_SHORT)
        assert_int_equal(ms_page_arena_num_free(p->f.arena), free0);
    ms_kv_published_free(pub);
}

static void run_property(uint64_t seed, int64_t ops) {
    prop *p = calloc(1, sizeof *p);
    assert_non_null(p);
    g_rng = seed * 2 + 1;
    static const int32_t sizes[] = {4, 1, 2, 8, 16};
    g_ps = sizes[seed % MS_ARRAY_LEN(sizes)];
    printf("kv property: page size %d, %lld operations\n", g_ps, (long long)ops);
    kv_fix_opts o = {.transfer = &rx_i, .transfer_ctx = &p->xfer};
    /* the arena holds about 192 tokens, so exhaustion is frequent at every page size */
    kv_fix_init_opts(&p->f, MS_MAX(12, 192 / g_ps), g_ps, MS_MAX(10, 160 / g_ps), &o);
    for (int i = 0; i < N_RIDS; i++)
        p->rids[i] = i < N_RIDS - 4 ? (ms_rid)(100 + i) : MS_RID_DUMMY_BASE + (ms_rid)i;
    ms_log_set_level(MS_LOG_ERROR);
    for (int64_t k = 0; k < ops; k++) {
        int32_t r = rn(100);
        bool inject = pct(4);
        if (inject)
            ms_alloc_fail_nth(1 + rn(4));
        ms_error err = {0};
        int i = rn(N_RIDS);
        if (r < 8) {
            p->counts[0]++;
            ms_kv_request_config rc = {.set_window = pct(30), .window = rn(3) * g_ps + rn(g_ps)};
            if (ms_kv_pool_ingest(p->f.pool, p->rids[i], &rc, &err) == MS_OK)
                p->ingested[i] = true;
        } else if (r < 12) {
            p->counts[1]++;
            ms_kv_pool_remove(p->f.pool, p->rids[i]);
            p->ingested[i] = false;
            assert_false(ms_kv_pool_has_request(p->f.pool, p->rids[i]));
            assert_int_equal(ms_kv_pool_reclaimable(p->f.pool, p->rids[i]), 0);
        } else if (r < 16) {
            p->counts[2]++;
            ms_kv_pool_reset(p->f.pool, p->rids[i], pct(50));
        } else if (r < 18) {
            p->counts[3]++;
            op_offload(p);
        } else if (r < 24) {
            p->counts[4]++;
            op_reload(p);
        } else if (r < 28) {
            p->counts[5]++;
            op_retrieve(p);
        } else if (r < 29) {
            p->counts[6]++;
            (void)ms_kv_pool_set_window(p->f.pool, p->rids[i], (ms_label)rn(N_LABELS),
                                        rn(4) * g_ps, &err);
        } else {
            p->counts[7]++;
            op_step(p);
        }
        ms_alloc_fail_nth(0);
        /* the pool's page counts match the arenas; removed requests own nothing */
        kv_check_pages(&p->f);
        if (p->f.host != NULL)
            assert_true(ms_page_arena_num_free(p->f.host) <
                        ms_page_arena_num_pages(p->f.host));
    }
    if (p->holding)
        finish_step(p, &p->held);
    printf("kv property: %lld ops: %lld admits ok, %lld pages short, %lld other, %lld plans, "
           "%lld offloads, %lld reloads, %lld retrieves\n", (long long)ops,
           (long long)p->admits_ok, (long long)p->admits_short, (long long)p->admits_other,
           (long long)p->plans, (long long)p->offloads, (long long)p->reloads,
           (long long)p->retrieves);
    printf("kv property: failed admits by code:");
    for (int c = 0; c < MS_ADMIT_CODE_COUNT; c++)
        if (p->by_code[c] > 0)
            printf(" %s %lld", ms_admit_code_str((ms_admit_code)c), (long long)p->by_code[c]);
    printf("\n");
    /* every behaviour was exercised */
    assert_true(p->admits_ok > ops / 10 && p->admits_short > 0 && p->plans > 0);
    assert_true(p->offloads > 0 && p->reloads > 0 && p->retrieves > 0);
    /* every plan followed an admit: none had to allocate */
    assert_int_equal(ms_kv_pool_plan_allocs(p->f.pool), 0);
    for (int i = 0; i < N_RIDS; i++)
        ms_kv_pool_remove(p->f.pool, p->rids[i]);
    assert_int_equal(ms_page_arena_num_free(p->f.arena), ms_page_arena_num_pages(p->f.arena) - 1);
    assert_int_equal(ms_page_arena_num_free(p->f.host), ms_page_arena_num_pages(p->f.host) - 1);
    assert_int_equal(ms_kv_pool_num_requests(p->f.pool), 0);
    ms_log_set_level(MS_LOG_INFO);
    kv_fix_free(&p->f);
    free(p->xfer.state);
    free(p);
}

static void test_kv_property_random_operations(void **state) {
    (void)state;
    const char *env = getenv("MS_SEED");
    uint64_t seed = env != NULL && env[0] != '\0' ? strtoull(env, NULL, 10)
                                                  : (uint64_t)time(NULL);
    const char *ops_env = getenv("MS_OPS");
    int64_t ops = ops_env != NULL && ops_env[0] != '\0' ? strtoll(ops_env, NULL, 10) : DEFAULT_OPS;
    printf("kv property: seed %llu (reproduce with MS_SEED=%llu)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    fflush(stdout);
    run_property(seed, ops);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_kv_property_random_operations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
