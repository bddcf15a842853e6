/*
 * test_kv_stress.c - the KV pool under threads (hazard F4; reference §9 item 18): a plan thread
 * admits and plans steps while a GPU thread commits them, resets and removes requests, and a
 * third thread offloads, reloads, publishes and retrieves (transfers waited on outside the
 * lock). Pages are conserved, no page is handed out twice, nothing leaks; built into the
 * ThreadSanitizer suite (TSAN_TESTS). Also: concurrent arena acquire/release.
 */
#include "ms_test.h"

#include <pthread.h>
#include <stdatomic.h>

#include "kv_test_util.h"
#include "ms_test_impl.h"

#define PS 4
#define N_RIDS 12

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define ITERS 3000
#else
#define ITERS 20000
#endif

/* ---- arena under contention ---- */

typedef struct arena_worker {
    ms_page_arena *arena;
    uint64_t seed;
    atomic_int *in_use; /* [n_pages] 1 while some thread holds the page */
    int failures;
} arena_worker;

static void *arena_thread(void *arg) {
    arena_worker *w = arg;
    uint64_t x = w->seed;
    int32_t held[16];
    for (int it = 0; it < ITERS; it++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        int32_t n = 1 + (int32_t)((x >> 33) % 8);
        if (ms_page_arena_acquire(w->arena, n, held) != MS_OK)
            continue;
        for (int32_t i = 0; i < n; i++) {
            /* no page is handed out twice */
            if (atomic_exchange(&w->in_use[held[i]], 1) != 0 || held[i] == MS_SINK_PAGE)
                w->failures++;
        }
        for (int32_t i = 0; i < n; i++)
            atomic_store(&w->in_use[held[i]], 0);
        if (ms_page_arena_release(w->arena, held, n, NULL) != MS_OK)
            w->failures++;
    }
    return NULL;
}

static void test_arena_concurrent_acquire_release_conserves(void **state) {
    (void)state;
    ms_error err = {0};
    ms_device *dev = NULL;
    assert_int_equal(ms_device_host_init(0, &dev, &err), MS_OK);
    ms_page_arena_config c = {.n_layers = 1, .n_pages = 20, .page_size = 4, .n_kv_heads = 1,
                              .head_dim = 4, .elem_bytes = 2};
    ms_page_arena *a = NULL;
    assert_int_equal(ms_page_arena_init(&c, dev, &a, &err), MS_OK);
    atomic_int in_use[20];
    for (int i = 0; i < 20; i++)
        atomic_init(&in_use[i], 0);
    arena_worker w[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (arena_worker){a, (uint64_t)i + 1, in_use, 0};
        assert_int_equal(pthread_create(&th[i], NULL, arena_thread, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(w[i].failures, 0);
    }
    assert_int_equal(ms_page_arena_num_free(a), 19);
    ms_page_arena_free(a);
    ms_device_free(dev);
}

/* ---- pool under three threads ---- */

/* A thread-safe transfer back end: transfers finish on the second poll or on wait. */
typedef struct mt_xfer {
    pthread_mutex_t mu;
    int polls[4096];
    int n;
} mt_xfer;

static ms_status mx_start(void *ctx, const ms_kv_transfer_desc *d, uint64_t *h, ms_error *err) {
    (void)d;
    (void)err;
    mt_xfer *x = ctx;
    pthread_mutex_lock(&x->mu);
    int id = x->n < 4096 ? x->n++ : 4095;
    x->polls[id] = 0;
    pthread_mutex_unlock(&x->mu);
    *h = (uint64_t)id;
    return MS_OK;
}

static ms_kv_transfer_state mx_poll(void *ctx, uint64_t h) {
    mt_xfer *x = ctx;
    pthread_mutex_lock(&x->mu);
    bool done = ++x->polls[h] >= 2;
    pthread_mutex_unlock(&x->mu);
    return done ? MS_KV_TRANSFER_DONE : MS_KV_TRANSFER_PENDING;
}

static ms_kv_transfer_state mx_wait(void *ctx, uint64_t h) {
    mt_xfer *x = ctx;
    pthread_mutex_lock(&x->mu);
    x->polls[h] = 2;
    pthread_mutex_unlock(&x->mu);
    return MS_KV_TRANSFER_DONE;
}

static const ms_kv_transfer_i mx_i = {.start = mx_start, .poll = mx_poll, .wait = mx_wait};

/* Steps handed from the plan thread to the GPU thread. */
#define QCAP 4
typedef struct shared {
    kv_fix f;
    mt_xfer xfer;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    kv_tstep steps[QCAP];
    bool planned[QCAP];
    int head, count;    /* queue of admitted steps */
    bool done;          /* plan thread finished */
    atomic_int bad;     /* invariant violations seen by threads */
    atomic_int codes[MS_ADMIT_CODE_COUNT];
    atomic_int admitted, committed, rolled_back, resets, removes, offloads;
} shared;

static uint64_t next(uint64_t *x) {
    *x ^= *x >> 12;
    *x ^= *x << 25;
    *x ^= *x >> 27;
    return *x * UINT64_C(2685821657736338717);
}

static ms_rid rid_of(uint64_t *x) { return (ms_rid)(1 + next(x) % N_RIDS); }

static void *plan_thread(void *arg) {
    shared *s = arg;
    uint64_t x = 0x1234567;
    for (int it = 0; it < ITERS; it++) {
        pthread_mutex_lock(&s->mu);
        while (s->count == QCAP)
            pthread_cond_wait(&s->cv, &s->mu);
        int slot = (s->head + s->count) % QCAP;
        pthread_mutex_unlock(&s->mu);
        kv_tstep *t = &s->steps[slot]; /* owned by this thread until queued */
        kv_step_init(t, next(&x) % 8 != 0);
        int n = 1 + (int)(next(&x) % 4);
        for (int k = 0; k < n; k++) {
            ms_rid r = rid_of(&x);
            ms_label l = (ms_label)(next(&x) % 3);
            bool dup = false;
            for (int32_t j = 0; j < t->step.n_segments; j++)
                dup = dup || (t->segs[j].rid == r && t->segs[j].label == l);
            if (dup)
                continue;
            if (next(&x) % 2 == 0)
                (void)ms_kv_pool_ingest(s->f.pool, r, NULL, NULL); /* idempotent */
            kv_step_seg(t, r, l, next(&x) % 4 == 0 ? (int32_t)(next(&x) % 13) : 1);
        }
        if (next(&x) % 10 == 0)
            kv_step_post_fork(t, 0, 2);
        ms_admit_outcome o = kv_admit(&s->f, t);
        atomic_fetch_add(&s->codes[o.code], 1);
        if (o.code != MS_ADMIT_OK)
            continue;
        atomic_fetch_add(&s->admitted, 1);
        const ms_kv_plan_set *set = NULL;
        ms_error err = {0};
        bool planned = ms_kv_pool_plan(s->f.pool, 0, &t->step, NULL, &set, &err) == MS_OK;
        if (planned) {
            /* views fit: page counts and addresses are consistent */
            for (int32_t q = 0; q < set->n_plans; q++) {
                const ms_kv_plan *p = &set->plans[q];
                for (int32_t v = 0; v < p->n_views; v++)
                    if (p->views[v].n_pages != MS_CEIL_DIV(p->views[v].length, PS))
                        atomic_fetch_add(&s->bad, 1);
                for (int32_t k = 0; k < p->n_tokens; k++)
                    if (p->token_to_page[k] == MS_SINK_PAGE || p->token_to_slot[k] >= PS)
                        atomic_fetch_add(&s->bad, 1);
            }
        }
        pthread_mutex_lock(&s->mu);
        s->planned[slot] = planned;
        s->count++;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
    pthread_mutex_lock(&s->mu);
    s->done = true;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void *gpu_thread(void *arg) {
    shared *s = arg;
    uint64_t x = 0x9abcdef;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (s->count == 0 && !s->done)
            pthread_cond_wait(&s->cv, &s->mu);
        if (s->count == 0 && s->done) {
            pthread_mutex_unlock(&s->mu);
            break;
        }
        int slot = s->head;
        bool planned = s->planned[slot];
        pthread_mutex_unlock(&s->mu);
        kv_tstep *t = &s->steps[slot];
        ms_error err = {0};
        if (planned) {
            (void)ms_kv_pool_commit(s->f.pool, 0, &t->step, NULL, &err);
            atomic_fetch_add(&s->committed, 1);
        } else {
            ms_kv_pool_admit_rollback(s->f.pool, 0, &t->step, NULL);
            atomic_fetch_add(&s->rolled_back, 1);
        }
        pthread_mutex_lock(&s->mu);
        s->head = (s->head + 1) % QCAP;
        s->count--;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        /* meanwhile the plan thread admits the next steps: reset, remove, re-ingest */
        uint64_t r = next(&x) % 16;
        ms_rid rid = rid_of(&x);
        if (r < 3) {
            ms_kv_pool_reset(s->f.pool, rid, r < 2);
            atomic_fetch_add(&s->resets, 1);
        } else if (r < 5) {
            ms_kv_pool_remove(s->f.pool, rid);
            atomic_fetch_add(&s->removes, 1);
        } else if (r < 8) {
            if (ms_kv_pool_ingest(s->f.pool, rid, NULL, &err) != MS_OK)
                atomic_fetch_add(&s->bad, 1);
        }
    }
    return NULL;
}

static void *tier_thread(void *arg) {
    shared *s = arg;
    uint64_t x = 0x5555aaa;
    for (int it = 0; it < ITERS / 2; it++) {
        ms_rid rid = rid_of(&x);
        ms_error err = {0};
        uint64_t r = next(&x) % 16;
        if (r < 1) {
            if (ms_kv_pool_offload(s->f.pool, rid, NULL, &err) == MS_OK)
                atomic_fetch_add(&s->offloads, 1);
        } else if (r < 8) {
            (void)ms_kv_pool_reload(s->f.pool, rid, &err);
        } else if (r < 10) {
            ms_kv_published *pub = NULL;
            if (ms_kv_pool_publish(s->f.pool, rid, &pub, &err) == MS_OK) {
                (void)ms_kv_pool_admit_retrieve(s->f.pool, rid_of(&x), pub);
                ms_kv_published_free(pub);
            }
        } else {
            ms_rid out[4];
            (void)ms_kv_pool_lru_candidates(s->f.pool, out, 4);
            (void)ms_kv_pool_reclaimable(s->f.pool, rid);
        }
    }
    return NULL;
}

static void test_F4_plan_thread_races_commit_reset_remove(void **state) {
    (void)state;
    shared *s = calloc(1, sizeof *s);
    assert_non_null(s);
    pthread_mutex_init(&s->xfer.mu, NULL);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    kv_fix_opts o = {.transfer = &mx_i, .transfer_ctx = &s->xfer};
    kv_fix_init_opts(&s->f, 128, PS, 48, &o);
    ms_log_set_level(MS_LOG_ERROR);
    for (ms_rid r = 1; r <= N_RIDS; r++)
        kv_ingest(&s->f, r);
    pthread_t a, b, c;
    assert_int_equal(pthread_create(&a, NULL, plan_thread, s), 0);
    assert_int_equal(pthread_create(&b, NULL, gpu_thread, s), 0);
    assert_int_equal(pthread_create(&c, NULL, tier_thread, s), 0);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    pthread_join(c, NULL);
    ms_log_set_level(MS_LOG_INFO);
    assert_int_equal(atomic_load(&s->bad), 0);
    assert_true(atomic_load(&s->admitted) > 0 && atomic_load(&s->committed) > 0);
    assert_true(atomic_load(&s->removes) > 0 && atomic_load(&s->resets) > 0);
    printf("kv stress: %d admitted, %d committed, %d rolled back, %d resets, %d removes, "
           "%d offloads\n", atomic_load(&s->admitted), atomic_load(&s->committed),
           atomic_load(&s->rolled_back), atomic_load(&s->resets), atomic_load(&s->removes),
           atomic_load(&s->offloads));
    for (int k = 0; k < MS_ADMIT_CODE_COUNT; k++)
        printf(" %s %d", ms_admit_code_str((ms_admit_code)k), atomic_load(&s->codes[k]));
    printf("\n");
    /* quiescent: every page is free or owned as counted, and streams are valid */
    kv_check_pages(&s->f);
    for (ms_rid r = 1; r <= N_RIDS; r++) {
        ms_kv_stream_info in;
        if (ms_kv_pool_stream_info(s->f.pool, r, 0, &in) == MS_OK && !in.offloaded)
            assert_true(in.n_pages >= MS_CEIL_DIV(in.stored - in.released, PS));
        ms_kv_pool_remove(s->f.pool, r);
    }
    assert_int_equal(ms_page_arena_num_free(s->f.arena), 127);
    assert_int_equal(ms_page_arena_num_free(s->f.host), 47);
    assert_int_equal(ms_kv_pool_num_requests(s->f.pool), 0);
    kv_fix_free(&s->f);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->xfer.mu);
    free(s);
}

/* rp1's race: a plan-thread admit racing a GPU-thread reset of the same label conserves pages
 * and leaves a valid empty stream; concurrent ingest -> admit -> remove leaves no state. */
typedef struct race {
    kv_fix *f;
    int iters;
} race;

static void *race_admit(void *arg) {
    race *r = arg;
    for (int i = 0; i < r->iters; i++) {
        kv_tstep t;
        kv_step_init(&t, true);
        kv_step_seg(&t, 1, 0, 1 + i % 9);
        if (kv_admit(r->f, &t).code == MS_ADMIT_OK) {
            const ms_kv_plan_set *set = NULL;
            if (ms_kv_pool_plan(r->f->pool, 0, &t.step, NULL, &set, NULL) == MS_OK)
                (void)ms_kv_pool_commit(r->f->pool, 0, &t.step, NULL, NULL);
            else
                ms_kv_pool_admit_rollback(r->f->pool, 0, &t.step, NULL);
        }
        ms_rid tmp = 1000 + (ms_rid)i;
        ms_error err = {0};
        if (ms_kv_pool_ingest(r->f->pool, tmp, NULL, &err) == MS_OK) {
            kv_step_init(&t, true);
            kv_step_seg(&t, tmp, 0, 5);
            (void)kv_admit(r->f, &t);
            ms_kv_pool_remove(r->f->pool, tmp);
        }
    }
    return NULL;
}

static void *race_reset(void *arg) {
    race *r = arg;
    for (int i = 0; i < r->iters; i++)
        ms_kv_pool_reset(r->f->pool, 1, true);
    return NULL;
}

static void test_admit_racing_label_reset_conserves_pages(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 32, PS, 0);
    kv_ingest(&f, 1);
    race r = {&f, ITERS / 4};
    pthread_t a, b;
    ms_log_set_level(MS_LOG_ERROR);
    assert_int_equal(pthread_create(&a, NULL, race_admit, &r), 0);
    assert_int_equal(pthread_create(&b, NULL, race_reset, &r), 0);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    ms_log_set_level(MS_LOG_INFO);
    kv_check_pages(&f);
    ms_kv_stream_info in = kv_info(&f, 1, 0);
    assert_true(in.n_pages >= MS_CEIL_DIV(in.stored, PS));
    ms_kv_pool_reset(f.pool, 1, true);
    assert_int_equal(ms_page_arena_num_free(f.arena), 31);
    assert_int_equal(ms_kv_pool_num_requests(f.pool), 1);
    kv_fix_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_arena_concurrent_acquire_release_conserves),
        ms_unit_test(test_F4_plan_thread_races_commit_reset_remove),
        ms_unit_test(test_admit_racing_label_reset_conserves_pages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
