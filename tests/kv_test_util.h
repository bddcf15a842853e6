/*
 * kv_test_util.h - helpers shared by the KV tests (included by each test_kv_*.c; every helper is
 * static): a fixture (host device, page arena, optional host tier, pool, streams), a step
 * builder, a fake transfer back end, a tracing device, and the conservation check.
 */
#ifndef KV_TEST_UTIL_H
#define KV_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "kv_pool.h"
#include "ms_test.h"
#include "page_arena.h"
#include "resource.h"

#define KV_UNUSED __attribute__((unused))

/* ---- fixture ---- */

typedef struct kv_fix {
    ms_device *dev;
    ms_page_arena *arena;       /* device pages */
    ms_page_arena *host;        /* host tier (NULL without) */
    ms_kv_pool *pool;
    ms_device_stream *compute;
    ms_device_stream *copy;
} kv_fix;

/* Options of kv_fix_init beyond the page counts. */
typedef struct kv_fix_opts {
    int32_t window;
    const ms_kv_transfer_i *transfer;
    void *transfer_ctx;
    ms_device *dev;             /* use this device (borrowed) instead of a fresh host device */
    int32_t world_size;
    int32_t max_pages_per_stream; /* 0: the pool default (every usable arena page) */
} kv_fix_opts;

/* Arena of 2 layers, 2 kv heads, head_dim 4, float32, `n_pages` pages of `ps` tokens. */
static KV_UNUSED void kv_fix_init_opts(kv_fix *f, int32_t n_pages, int32_t ps, int32_t host_pages,
                                       const kv_fix_opts *o) {
    memset(f, 0, sizeof *f);
    ms_error err = {0};
    if (o != NULL && o->dev != NULL)
        f->dev = o->dev;
    else
        assert_int_equal(ms_device_host_init(0, &f->dev, &err), MS_OK);
    ms_page_arena_config ac = {.n_layers = 2, .n_pages = n_pages, .page_size = ps,
                               .n_kv_heads = 2, .head_dim = 4, .elem_bytes = 4,
                               .name = "test"};
    assert_int_equal(ms_page_arena_init(&ac, f->dev, &f->arena, &err), MS_OK);
    if (host_pages > 0) {
        ac.n_pages = host_pages;
        assert_int_equal(ms_page_arena_init(&ac, f->dev, &f->host, &err), MS_OK);
    }
    assert_int_equal(ms_device_stream_init(f->dev, &f->compute, &err), MS_OK);
    assert_int_equal(ms_device_stream_init(f->dev, &f->copy, &err), MS_OK);
    ms_kv_pool_config pc = {.arena = f->arena, .host_arena = f->host,
                            .compute_stream = f->compute, .copy_stream = f->copy};
    if (o != NULL) {
        pc.window = o->window;
        pc.transfer = o->transfer;
        pc.transfer_ctx = o->transfer_ctx;
        pc.world_size = o->world_size;
        pc.max_pages_per_stream = o->max_pages_per_stream;
    }
    ms_status st = ms_kv_pool_init(&pc, &f->pool, &err);
    if (st != MS_OK)
        fail_msg("pool init: %s", err.msg);
}

static KV_UNUSED void kv_fix_init(kv_fix *f, int32_t n_pages, int32_t ps, int32_t host_pages) {
    kv_fix_init_opts(f, n_pages, ps, host_pages, NULL);
}

static KV_UNUSED void kv_fix_free_keep_dev(kv_fix *f) {
    ms_kv_pool_free(f->pool);
    ms_device_stream_free(f->dev, f->compute);
    ms_device_stream_free(f->dev, f->copy);
    ms_page_arena_free(f->host);
    ms_page_arena_free(f->arena);
}

static KV_UNUSED void kv_fix_free(kv_fix *f) {
    kv_fix_free_keep_dev(f);
    ms_device_free(f->dev);
}

/*
 * Every page is free or owned exactly as counted: pool references per page equal the arena's
 * owner counts, the sink page is never referenced, the free count is the number of unowned
 * pages. Checks both tiers. Returns the number of device pages referenced.
 */
static KV_UNUSED int32_t kv_check_pages(kv_fix *f) {
    ms_page_arena *arenas[2] = {f->arena, f->host};
    int32_t *counts[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++)
        if (arenas[k] != NULL) {
            counts[k] = calloc((size_t)ms_page_arena_num_pages(arenas[k]), sizeof(int32_t));
            assert_non_null(counts[k]);
        }
    ms_kv_pool_count_pages(f->pool, counts[0], counts[1]);
    int32_t owned_dev = 0;
    for (int k = 0; k < 2; k++) {
        if (arenas[k] == NULL)
            continue;
        int32_t n = ms_page_arena_num_pages(arenas[k]);
        int32_t unowned = 0;
        if (counts[k][MS_SINK_PAGE] != 0)
            fail_msg("sink page referenced %d time(s) (tier %d)", counts[k][0], k);
        assert_int_equal(ms_page_arena_owners(arenas[k], MS_SINK_PAGE), 1);
        for (int32_t p = 1; p < n; p++) {
            int32_t own = ms_page_arena_owners(arenas[k], p);
            if (own != counts[k][p])
                fail_msg("page %d (tier %d): arena owners %d, pool references %d", p, k, own,
                         counts[k][p]);
            if (own == 0)
                unowned++;
            else if (k == 0)
                owned_dev++;
        }
        assert_int_equal(ms_page_arena_num_free(arenas[k]), unowned);
        free(counts[k]);
    }
    return owned_dev;
}

/* ---- step builder ---- */

#define KV_T_MAX_SEGS 256

typedef struct kv_tstep {
    ms_step step;
    ms_kv_step ks;
    ms_segment segs[KV_T_MAX_SEGS];
    ms_fork pre[4];
    ms_fork post[4];
    ms_combined_label comb[2];
    ms_rid rows[KV_T_MAX_SEGS];
    ms_step_ctx ctx;
} kv_tstep;

static KV_UNUSED void kv_step_init(kv_tstep *t, bool commit) {
    memset(t, 0, sizeof *t);
    t->ks.commit = commit;
    t->ks.pre_forks = t->pre;
    t->ks.post_forks = t->post;
    t->ks.combined = t->comb;
    t->step.name = "test";
    t->step.segments = t->segs;
    t->step.records[0].rec = &t->ks;
    t->ctx.request_ids = t->rows;
}

static KV_UNUSED void kv_step_seg(kv_tstep *t, ms_rid rid, ms_label label, int32_t span) {
    assert_true(t->step.n_segments < KV_T_MAX_SEGS);
    ms_segment s = {rid, label, span};
    t->segs[t->step.n_segments++] = s;
}

static KV_UNUSED void kv_step_row(kv_tstep *t, ms_rid rid) {
    t->rows[t->ctx.n_rows++] = rid;
    t->ctx.n_real = t->ctx.n_rows;
}

static KV_UNUSED void kv_step_pre_fork(kv_tstep *t, ms_label from, ms_label to) {
    ms_fork f = {from, to};
    t->pre[t->ks.n_pre_forks++] = f;
}

static KV_UNUSED void kv_step_post_fork(kv_tstep *t, ms_label from, ms_label to) {
    ms_fork f = {from, to};
    t->post[t->ks.n_post_forks++] = f;
}

/* ctx pointer for calls: NULL when no rows were added (forks then use the segments' rids). */
static KV_UNUSED ms_step_ctx *kv_ctx(kv_tstep *t) { return t->ctx.n_rows > 0 ? &t->ctx : NULL; }

static KV_UNUSED ms_admit_outcome kv_admit(kv_fix *f, kv_tstep *t) {
    return ms_kv_pool_admit(f->pool, 0, &t->step, kv_ctx(t));
}

static KV_UNUSED const ms_kv_plan_set *kv_plan(kv_fix *f, kv_tstep *t) {
    const ms_kv_plan_set *set = NULL;
    ms_error err = {0};
    ms_status st = ms_kv_pool_plan(f->pool, 0, &t->step, kv_ctx(t), &set, &err);
    if (st != MS_OK)
        fail_msg("plan: %s", err.msg);
    return set;
}

static KV_UNUSED void kv_commit(kv_fix *f, kv_tstep *t) {
    ms_error err = {0};
    ms_status st = ms_kv_pool_commit(f->pool, 0, &t->step, kv_ctx(t), &err);
    if (st != MS_OK)
        fail_msg("commit: %s", err.msg);
}

/* admit (must succeed) + plan + commit. */
static KV_UNUSED const ms_kv_plan_set *kv_run(kv_fix *f, kv_tstep *t) {
    ms_admit_outcome o = kv_admit(f, t);
    if (o.code != MS_ADMIT_OK)
        fail_msg("admit: %s (short %d, rid %llu, label %d)", ms_admit_code_str(o.code),
                 o.pages_short, (unsigned long long)o.rid, o.label);
    const ms_kv_plan_set *set = kv_plan(f, t);
    kv_commit(f, t);
    return set;
}

/* One-segment step helper: extend (rid, label) by span and commit. */
static KV_UNUSED void kv_extend(kv_fix *f, ms_rid rid, ms_label label, int32_t span) {
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, rid, label, span);
    kv_run(f, &t);
}

static KV_UNUSED ms_kv_stream_info kv_info(kv_fix *f, ms_rid rid, ms_label label) {
    ms_kv_stream_info info;
    ms_status st = ms_kv_pool_stream_info(f->pool, rid, label, &info);
    if (st != MS_OK)
        fail_msg("no stream rid %llu label %d", (unsigned long long)rid, label);
    return info;
}

static KV_UNUSED void kv_ingest(kv_fix *f, ms_rid rid) {
    ms_error err = {0};
    assert_int_equal(ms_kv_pool_ingest(f->pool, rid, NULL, &err), MS_OK);
}

/* Write a recognisable value into every element of token `slot` of `page` (all layers, K and
 * V) and read it back. */
static KV_UNUSED float kv_tag(int32_t layer, int kv, float v) {
    return v * 8.0f + (float)(layer * 2 + kv);
}

static KV_UNUSED void kv_write_token(ms_page_arena *a, int32_t page, int32_t slot, float v) {
    const ms_page_arena_config *c = ms_page_arena_get_config(a);
    for (int32_t l = 0; l < c->n_layers; l++)
        for (int kv = 0; kv < 2; kv++) {
            float *p = ms_page_arena_token_ptr(a, l, page, kv, slot);
            for (int32_t e = 0; e < c->n_kv_heads * c->head_dim; e++)
                p[e] = kv_tag(l, kv, v);
        }
}

static KV_UNUSED bool kv_token_is(ms_page_arena *a, int32_t page, int32_t slot, float v) {
    const ms_page_arena_config *c = ms_page_arena_get_config(a);
    for (int32_t l = 0; l < c->n_layers; l++)
        for (int kv = 0; kv < 2; kv++) {
            const float *p = ms_page_arena_token_ptr(a, l, page, kv, slot);
            for (int32_t e = 0; e < c->n_kv_heads * c->head_dim; e++)
                if (p[e] != kv_tag(l, kv, v))
                    return false;
        }
    return true;
}

/* Write value base + j for the j-th new token of every view of a plan (what a forward does). */
static KV_UNUSED void kv_write_plan(ms_page_arena *a, const ms_kv_plan *p, float base) {
    for (int32_t t = 0; t < p->n_tokens; t++)
        kv_write_token(a, p->token_to_page[t], p->token_to_slot[t], base + (float)t);
}

/* ---- fake transfer back end ---- */

#define KV_FAKE_MAX 64

typedef struct kv_fake_transfer {
    ms_kv_transfer_desc descs[KV_FAKE_MAX];   /* arrays not kept (valid only during start) */
    int32_t local_first_page[KV_FAKE_MAX];    /* local_pages[0] at start */
    ms_kv_transfer_state state[KV_FAKE_MAX];
    int n;
    int n_polls;
    int n_waits;
    int n_released;
    bool fail_start;           /* start() fails */
    bool instant;              /* transfers are DONE at start */
    bool fail_all;             /* transfers end FAILED */
    ms_kv_pool *pool;          /* when set, wait() calls into the pool (checks F4: lock free) */
} kv_fake_transfer;

static KV_UNUSED ms_status kv_fake_start(void *ctx, const ms_kv_transfer_desc *d, uint64_t *h,
                                         ms_error *err) {
    kv_fake_transfer *x = ctx;
    if (x->fail_start)
        return MS_FAIL(err, MS_ERR_IO, "fake transfer refused");
    assert_true(x->n < KV_FAKE_MAX);
    x->descs[x->n] = *d;
    x->local_first_page[x->n] = d->n_local_pages > 0 ? d->local_pages[0] : -1;
    x->state[x->n] = x->instant ? (x->fail_all ? MS_KV_TRANSFER_FAILED : MS_KV_TRANSFER_DONE)
                                : MS_KV_TRANSFER_PENDING;
    *h = (uint64_t)x->n++;
    return MS_OK;
}

static KV_UNUSED ms_kv_transfer_state kv_fake_poll(void *ctx, uint64_t h) {
    kv_fake_transfer *x = ctx;
    x->n_polls++;
    return x->state[h];
}

static KV_UNUSED ms_kv_transfer_state kv_fake_wait(void *ctx, uint64_t h) {
    kv_fake_transfer *x = ctx;
    x->n_waits++;
    if (x->pool != NULL)
        (void)ms_kv_pool_num_requests(x->pool); /* deadlocks if the pool lock were held */
    if (x->state[h] == MS_KV_TRANSFER_PENDING)
        x->state[h] = x->fail_all ? MS_KV_TRANSFER_FAILED : MS_KV_TRANSFER_DONE;
    return x->state[h];
}

static KV_UNUSED void kv_fake_release(void *ctx, uint64_t h) {
    (void)h;
    ((kv_fake_transfer *)ctx)->n_released++;
}

static const ms_kv_transfer_i kv_fake_transfer_i KV_UNUSED = {
    .start = kv_fake_start,
    .poll = kv_fake_poll,
    .wait = kv_fake_wait,
    .release = kv_fake_release,
};

#endif
