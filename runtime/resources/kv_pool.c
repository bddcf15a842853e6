/*
 * kv_pool.c - the KV pool resource (kv_pool.h): streams per (request, label) over a page arena.
 *
 * Constraints:
 *   - every stream access holds pool->mu; blocking waits (transfer wait, copy-stream synchronize,
 *     waiting for an offload of the same request) release it (hazard F4). A request's `busy`
 *     count pins its record while the mutex is dropped; remove and reset(free) wait for it.
 *   - admit is transactional: it computes every stream's page need first (scratch fields on the
 *     streams, stamped with a per-call mark), grows host arrays, acquires all pages in one arena
 *     call, and only then changes streams. Capacity growth is the only effect of a failed admit.
 *   - no host allocation on the decode path: a stream's page list is sized for
 *     max_pages_per_stream at its first reservation and the plan buffers' kv_indices for the whole
 *     arena, so admit grows only when a step's shape (segments, tokens, forks) exceeds any before.
 *   - plan allocates nothing when the step was admitted: admit sizes the plan buffer set the next
 *     plan writes (never the one holding the latest plan).
 */
#include "kv_pool.h"

#include <pthread.h>
#include <string.h>

/* XXH3 streaming state on the stack (ms_kv_pool_allocation_digest) */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

/* ---- data ---- */

/* One (request, label) stream. */
typedef struct kv_stream {
    bool exists;               /* created (main at ingest, others on first reservation) */
    int32_t *pages;            /* [cap] device pages; [0, n_pages) held; pages[i] holds logical
                                  tokens [released + i * ps, released + (i + 1) * ps) */
    int32_t n_pages;           /* pages held (high-water, >= pages the length needs) */
    size_t cap;                /* capacity of pages: 0 until the first reservation, then
                                  >= pool->max_pages_per_stream (sized once; admit regrows it
                                  only for a stream past that limit) */
    int32_t stored;            /* committed logical tokens (including released ones) */
    int32_t released;          /* tokens dropped from the front by retention, multiple of ps */
    int32_t window;            /* retention window in tokens, 0 = keep all */
    uint32_t generation;       /* epoch, see kv_pool.h */
    bool offloaded;            /* claimed by an offload or living in the host tier */
    bool read_pending;         /* a transfer into this stream is in flight */
    bool read_error;           /* a transfer into this stream failed (latched) */
    uint64_t read_handle;      /* transfer handle while read_pending */
    int32_t *host_pages;       /* [host_cap] host-tier pages while offloaded */
    int32_t n_host_pages;
    size_t host_cap;
    /* in-flight step and its undo record (admit_rollback) */
    const ms_step *inflight;   /* step admitted and not yet committed / rolled back; NULL none */
    int32_t undo_n_pages;      /* n_pages before that step's admit */
    bool undo_created;         /* that admit created the stream */
    bool undo_forked;          /* that step's plan applied a pre-fork onto this stream */
    int32_t undo_stored;       /* stored before the pre-fork */
    int32_t undo_released;     /* released before the pre-fork */
    /* claim snapshot of an offload in progress */
    uint32_t claim_generation;
    int32_t claim_stored;
    int32_t claim_released;
    int32_t claim_n_pages;
    /* admit scratch, valid for one call (mark == the call's mark) */
    uint64_t mark;             /* call that last touched the stream */
    uint64_t seg_mark;         /* call that saw a segment on it (duplicate check) */
    int32_t p_stored;          /* planned stored / released after pre-forks */
    int32_t p_released;
    int32_t p_span;            /* span of this step's segment on it */
    int32_t p_need;            /* pages this step needs it to hold */
    bool p_exists;             /* exists now or is created by this step */
} kv_stream;

/* Per-request state. Records are individually allocated so pointers stay valid while the table
 * grows; `busy` pins one while the mutex is released. */
typedef struct kv_request {
    ms_rid rid;
    kv_stream streams[MS_MAX_LABELS]; /* indexed by label */
    uint64_t last_active;      /* pool tick of the last ingest / admit / commit */
    int32_t busy;              /* offloads, reloads, drains in progress with the mutex dropped */
    bool removing;             /* remove in progress: treated as unknown */
    bool offload_running;      /* an offload or reload of it is between claim and finish */
    bool retrieve_failed;      /* a transfer failed: terminal admit failure (H12) */
    uint32_t retrieve_labels;  /* labels admit_retrieve pulls, 0 = all */
    int32_t window;            /* retention window for streams created later */
    uint64_t row_mark;         /* distinct-rows scratch */
} kv_request;

/* One set of plan output buffers (two alternate). Capacities per array (ms_grow). */
typedef struct kv_plan_buf {
    ms_kv_plan_set set;
    ms_kv_plan *plans;            size_t plans_cap;
    ms_kv_view *views;            size_t views_cap;
    int32_t *qo_indptr;           size_t qo_cap;     /* [n_views + n_plans] */
    int32_t *kv_indptr;           size_t kvp_cap;    /* [n_views + n_plans] */
    int32_t *kv_indices;          size_t ind_cap;    /* [total view pages] */
    int32_t *last_page_len;       size_t lpl_cap;    /* [n_views] */
    int32_t *kv_start;            size_t start_cap;  /* [n_views] */
    int32_t *token_to_page;       size_t ttp_cap;    /* [n_tokens] */
    int32_t *token_to_slot;       size_t tts_cap;    /* [n_tokens] */
} kv_plan_buf;

/* A stream touched by one admit, with its owner. */
typedef struct kv_touch {
    kv_request *req;
    ms_label label;
} kv_touch;

struct ms_kv_pool {
    ms_kv_pool_config cfg;
    int32_t ps;                 /* page size (tokens) */
    pthread_mutex_t mu;         /* guards everything below and every stream */
    pthread_cond_t cv;          /* signalled when a request's busy count drops */
    kv_request **table;         /* [n_slots] open addressing, linear probing; NULL = empty */
    size_t n_slots;             /* power of two */
    size_t n_requests;
    uint64_t tick;              /* activity clock (LRU) */
    uint64_t mark;              /* admit / plan call stamps */
    kv_touch *touched;          size_t touched_cap;
    int32_t *acq;               size_t acq_cap;     /* pages acquired by one admit */
    ms_rid *rows;               size_t rows_cap;    /* distinct rows of a step */
    kv_plan_buf bufs[2];
    uint64_t plan_seq;          /* plans built; selects the buffer set */
    int64_t plan_allocs;        /* growth performed inside plan */
    int32_t max_pages_per_stream; /* cfg.max_pages_per_stream, at most the usable arena pages
                                     (all but the sink); a page list is sized to it at the
                                     stream's first reservation */
    int64_t admit_allocs;       /* host array growths performed inside admit */
    ms_device_event *offload_event; /* recorded on the compute stream before tier copies */
    ms_device_event *reload_event;  /* recorded on the copy stream after reload copies */
    ms_device_event *retrieve_event; /* recorded on the compute stream before transfers start */
};

/* ---- small helpers ---- */

static int32_t pages_for(int32_t tokens, int32_t ps) {
    return tokens <= 0 ? 0 : (int32_t)(((int64_t)tokens + ps - 1) / ps);
}

static size_t rid_hash(ms_rid rid) {
    uint64_t x = rid;
    x ^= x >> 33;
    x *= UINT64_C(0xff51afd7ed558ccd);
    x ^= x >> 33;
    x *= UINT64_C(0xc4ceb9fe1a85ec53);
    x ^= x >> 33;
    return (size_t)x;
}

static kv_request *req_find(const ms_kv_pool *pool, ms_rid rid) {
    if (pool->n_slots == 0)
        return NULL;
    size_t mask = pool->n_slots - 1;
    for (size_t i = rid_hash(rid) & mask;; i = (i + 1) & mask) {
        kv_request *r = pool->table[i];
        if (r == NULL)
            return NULL;
        if (r->rid == rid)
            return r;
    }
}

/* Known, not being removed. */
static kv_request *req_live(const ms_kv_pool *pool, ms_rid rid) {
    kv_request *r = req_find(pool, rid);
    return r != NULL && !r->removing ? r : NULL;
}

static void table_put(kv_request **table, size_t n_slots, kv_request *r) {
    size_t mask = n_slots - 1;
    size_t i = rid_hash(r->rid) & mask;
    while (table[i] != NULL)
        i = (i + 1) & mask;
    table[i] = r;
}

/* Make room for one more request (load factor <= 1/2). */
static ms_status table_reserve(ms_kv_pool *pool) {
    if ((pool->n_requests + 1) * 2 <= pool->n_slots)
        return MS_OK;
    size_t n = pool->n_slots == 0 ? 16 : pool->n_slots * 2;
    kv_request **t = ms_calloc(n, sizeof *t);
    if (t == NULL)
        return MS_ERR_OOM;
    for (size_t i = 0; i < pool->n_slots; i++)
        if (pool->table[i] != NULL)
            table_put(t, n, pool->table[i]);
    ms_free(pool->table);
    pool->table = t;
    pool->n_slots = n;
    return MS_OK;
}

/* Remove `r` from the table (backward-shift deletion keeps probe chains intact). */
static void table_delete(ms_kv_pool *pool, kv_request *r) {
    size_t mask = pool->n_slots - 1;
    size_t i = rid_hash(r->rid) & mask;
    while (pool->table[i] != r)
        i = (i + 1) & mask;
    pool->table[i] = NULL;
    for (size_t j = (i + 1) & mask; pool->table[j] != NULL; j = (j + 1) & mask) {
        kv_request *m = pool->table[j];
        size_t home = rid_hash(m->rid) & mask;
        /* Move m into the hole when the hole lies cyclically in [home, j). */
        bool in_range = i <= j ? (home <= i || home > j) : (home <= i && home > j);
        if (in_range) {
            pool->table[i] = m;
            pool->table[j] = NULL;
            i = j;
        }
    }
    pool->n_requests--;
}

static kv_stream *stream_of(kv_request *r, ms_label label) {
    return label >= 0 && label < MS_MAX_LABELS ? &r->streams[label] : NULL;
}

/* Release pages[0..n) to `arena`; a failure is a pool bug (double free). */
static void release_pages(ms_page_arena *arena, const int32_t *pages, int32_t n) {
    ms_error e = {0};
    ms_status st = ms_page_arena_release(arena, pages, n, &e);
    if (st != MS_OK)
        MS_ABORT("kv pool: %s", e.msg);
}

/* Pages the stream's present tokens need. */
static int32_t stream_need(const kv_stream *s, int32_t ps) {
    return pages_for(s->stored - s->released, ps);
}

static bool stream_in_flight(const kv_stream *s) { return s->inflight != NULL; }

/* Offloaded, or claimed by a running offload/reload. */
static bool request_offloaded(const kv_request *r) {
    if (r->offload_running)
        return true;
    for (int l = 0; l < MS_MAX_LABELS; l++)
        if (r->streams[l].exists && r->streams[l].offloaded)
            return true;
    return false;
}

/* ---- init / free ---- */

static void request_free_pages(ms_kv_pool *pool, kv_request *r) {
    for (int l = 0; l < MS_MAX_LABELS; l++) {
        kv_stream *s = &r->streams[l];
        release_pages(pool->cfg.arena, s->pages, s->n_pages);
        s->n_pages = 0;
        if (s->n_host_pages > 0) {
            MS_ASSERT(pool->cfg.host_arena != NULL);
            release_pages(pool->cfg.host_arena, s->host_pages, s->n_host_pages);
            s->n_host_pages = 0;
        }
    }
}

static void request_destroy(kv_request *r) {
    for (int l = 0; l < MS_MAX_LABELS; l++) {
        ms_free(r->streams[l].pages);
        ms_free(r->streams[l].host_pages);
    }
    ms_free(r);
}

ms_status ms_kv_pool_init(const ms_kv_pool_config *cfg, ms_kv_pool **out, ms_error *err) {
    *out = NULL;
    if (cfg->arena == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "kv pool: config has no page arena");
    if (cfg->window < 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "kv pool: retention window %d is negative",
                       cfg->window);
    if (cfg->world_size < 0 || cfg->rank < 0 ||
        (cfg->world_size > 0 && cfg->rank >= cfg->world_size))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "kv pool: rank %d of world size %d is invalid",
                       cfg->rank, cfg->world_size);
    if (cfg->host_arena != NULL) {
        const ms_page_arena_size *a = ms_page_arena_get_size(cfg->arena);
        const ms_page_arena_size *h = ms_page_arena_get_size(cfg->host_arena);
        if (a->page_bytes != h->page_bytes ||
            ms_page_arena_get_config(cfg->arena)->n_layers !=
                ms_page_arena_get_config(cfg->host_arena)->n_layers ||
            ms_page_arena_page_size(cfg->arena) != ms_page_arena_page_size(cfg->host_arena))
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "kv pool: the host (offload) arena's geometry differs from the device "
                           "arena's");
    }
    ms_kv_pool *pool = ms_calloc(1, sizeof *pool);
    if (pool == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "kv pool: out of host memory");
    pool->cfg = *cfg;
    if (pool->cfg.world_size == 0)
        pool->cfg.world_size = 1;
    pool->ps = ms_page_arena_page_size(cfg->arena);
    pool->max_pages_per_stream = MS_MAX(1, ms_page_arena_num_pages(cfg->arena) - 1);
    if (cfg->max_pages_per_stream > 0 && cfg->max_pages_per_stream < pool->max_pages_per_stream)
        pool->max_pages_per_stream = cfg->max_pages_per_stream;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv, NULL);
    ms_device *dev = ms_page_arena_device(cfg->arena);
    ms_status st = MS_OK;
    if (cfg->host_arena != NULL) {
        st = ms_device_event_init(dev, &pool->offload_event, err);
        if (st == MS_OK)
            st = ms_device_event_init(dev, &pool->reload_event, err);
    }
    if (st == MS_OK && cfg->transfer != NULL)
        st = ms_device_event_init(dev, &pool->retrieve_event, err);
    if (st != MS_OK) {
        ms_error_prefix(err, "kv pool: ");
        ms_kv_pool_free(pool);
        return st;
    }
    *out = pool;
    return MS_OK;
}

/* Wait (mutex released) for every pending transfer of `r`; `r` must be pinned or removing. */
static void drain_reads(ms_kv_pool *pool, kv_request *r) {
    for (;;) {
        kv_stream *s = NULL;
        for (int l = 0; l < MS_MAX_LABELS && s == NULL; l++)
            if (r->streams[l].read_pending)
                s = &r->streams[l];
        if (s == NULL)
            return;
        uint64_t h = s->read_handle;
        const ms_kv_transfer_i *t = pool->cfg.transfer;
        r->busy++;
        pthread_mutex_unlock(&pool->mu);
        ms_kv_transfer_state ts = t->wait(pool->cfg.transfer_ctx, h);
        if (t->release != NULL)
            t->release(pool->cfg.transfer_ctx, h);
        pthread_mutex_lock(&pool->mu);
        r->busy--;
        pthread_cond_broadcast(&pool->cv);
        if (s->read_pending && s->read_handle == h) {
            s->read_pending = false;
            if (ts != MS_KV_TRANSFER_DONE) {
                s->read_error = true;
                r->retrieve_failed = true;
            }
        }
    }
}

/* Remove with the mutex held (may release it while waiting). */
static void remove_locked(ms_kv_pool *pool, ms_rid rid) {
    kv_request *r = req_live(pool, rid);
    if (r == NULL)
        return;
    r->removing = true;
    while (r->busy > 0)
        pthread_cond_wait(&pool->cv, &pool->mu);
    drain_reads(pool, r);
    while (r->busy > 0)
        pthread_cond_wait(&pool->cv, &pool->mu);
    request_free_pages(pool, r);
    table_delete(pool, r);
    request_destroy(r);
}

static void plan_buf_free(kv_plan_buf *b) {
    ms_free(b->plans);
    ms_free(b->views);
    ms_free(b->qo_indptr);
    ms_free(b->kv_indptr);
    ms_free(b->kv_indices);
    ms_free(b->last_page_len);
    ms_free(b->kv_start);
    ms_free(b->token_to_page);
    ms_free(b->token_to_slot);
}

void ms_kv_pool_free(ms_kv_pool *pool) {
    if (pool == NULL)
        return;
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        kv_request *r = NULL;
        for (size_t i = 0; i < pool->n_slots && r == NULL; i++)
            if (pool->table[i] != NULL && !pool->table[i]->removing)
                r = pool->table[i];
        if (r == NULL)
            break;
        remove_locked(pool, r->rid);
    }
    pthread_mutex_unlock(&pool->mu);
    MS_ASSERT(pool->n_requests == 0);
    ms_free(pool->table);
    ms_free(pool->touched);
    ms_free(pool->acq);
    ms_free(pool->rows);
    plan_buf_free(&pool->bufs[0]);
    plan_buf_free(&pool->bufs[1]);
    ms_device *dev = ms_page_arena_device(pool->cfg.arena);
    ms_device_event_free(dev, pool->offload_event);
    ms_device_event_free(dev, pool->reload_event);
    ms_device_event_free(dev, pool->retrieve_event);
    pthread_cond_destroy(&pool->cv);
    pthread_mutex_destroy(&pool->mu);
    ms_free(pool);
}

/* ---- request lifetime ---- */

ms_status ms_kv_pool_ingest(ms_kv_pool *pool, ms_rid rid, const ms_kv_request_config *ov,
                            ms_error *err) {
    if (ov != NULL && ov->set_window && ov->window < 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "kv pool: request %llu: retention window %d is negative",
                       (unsigned long long)rid, ov->window);
    pthread_mutex_lock(&pool->mu);
    kv_request *r = req_find(pool, rid);
    if (r != NULL) {
        bool removing = r->removing;
        pthread_mutex_unlock(&pool->mu);
        if (removing)
            return MS_FAIL(err, MS_ERR_STATE, "kv pool: request %llu is being removed",
                           (unsigned long long)rid);
        return MS_OK; /* idempotent (H10) */
    }
    r = ms_calloc(1, sizeof *r);
    if (r == NULL || table_reserve(pool) != MS_OK) {
        pthread_mutex_unlock(&pool->mu);
        ms_free(r);
        return MS_FAIL(err, MS_ERR_OOM, "kv pool: out of host memory ingesting request %llu",
                       (unsigned long long)rid);
    }
    r->rid = rid;
    r->window = ov != NULL && ov->set_window ? ov->window : pool->cfg.window;
    r->retrieve_labels = ov != NULL ? ov->retrieve_labels : 0;
    for (int l = 0; l < MS_MAX_LABELS; l++)
        r->streams[l].window = r->window;
    r->streams[MS_LABEL_MAIN].exists = true;
    r->last_active = ++pool->tick;
    table_put(pool->table, pool->n_slots, r);
    pool->n_requests++;
    pthread_mutex_unlock(&pool->mu);
    return MS_OK;
}

void ms_kv_pool_remove(ms_kv_pool *pool, ms_rid rid) {
    pthread_mutex_lock(&pool->mu);
    remove_locked(pool, rid);
    pthread_mutex_unlock(&pool->mu);
}

void ms_kv_pool_reset(ms_kv_pool *pool, ms_rid rid, bool free_pages) {
    pthread_mutex_lock(&pool->mu);
    kv_request *r = req_live(pool, rid);
    if (r == NULL) {
        pthread_mutex_unlock(&pool->mu);
        return;
    }
    r->busy++; /* pin across the waits below */
    drain_reads(pool, r);
    if (free_pages)
        while (r->offload_running)
            pthread_cond_wait(&pool->cv, &pool->mu);
    for (int l = 0; l < MS_MAX_LABELS; l++) {
        kv_stream *s = &r->streams[l];
        if (!s->exists)
            continue;
        if (r->offload_running) {
            /* Claimed by a running offload (free_pages is false here): pages stay; the offload
             * sees the generation change and abandons, returning them to the stream. */
        } else {
            if (free_pages) {
                release_pages(pool->cfg.arena, s->pages, s->n_pages);
                s->n_pages = 0;
            }
            if (s->n_host_pages > 0) {
                release_pages(pool->cfg.host_arena, s->host_pages, s->n_host_pages);
                s->n_host_pages = 0;
            }
            s->offloaded = false;
        }
        s->stored = 0;
        s->released = 0;
        s->generation++;
        s->read_error = false;
        s->inflight = NULL;
        s->undo_forked = false;
    }
    r->retrieve_failed = false;
    r->busy--;
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
}

ms_status ms_kv_pool_set_window(ms_kv_pool *pool, ms_rid rid, ms_label label, int32_t window,
                                ms_error *err) {
    if (window < 0 || label < 0 || label >= MS_MAX_LABELS)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "kv pool: window %d / label %d invalid", window,
                       label);
    pthread_mutex_lock(&pool->mu);
    kv_request *r = req_live(pool, rid);
    if (r == NULL) {
        pthread_mutex_unlock(&pool->mu);
        return MS_FAIL(err, MS_ERR_NOT_FOUND, "kv pool: unknown request %llu",
                       (unsigned long long)rid);
    }
    r->streams[label].window = window;
    r->streams[label].exists = true;
    pthread_mutex_unlock(&pool->mu);
    return MS_OK;
}

/* ---- step helpers ---- */

static const ms_kv_step *kv_record(const ms_step *step, int index) {
    if (step == NULL || index < 0 || index >= MS_MAX_RESOURCES)
        return NULL;
    return step->records[index].rec;
}

/* Rows the forks apply to: ctx->request_ids, else the distinct requests of the segments in
 * order (pool->rows, which must hold n_segs entries). Returns the count and sets *rows. */
static int32_t step_rows(ms_kv_pool *pool, const ms_segment *segs, int32_t n_segs,
                         const ms_step_ctx *ctx, const ms_rid **rows) {
    if (ctx != NULL && ctx->request_ids != NULL && ctx->n_rows > 0) {
        *rows = ctx->request_ids;
        return ctx->n_rows;
    }
    uint64_t mark = ++pool->mark;
    int32_t n = 0;
    for (int32_t i = 0; i < n_segs; i++) {
        kv_request *r = req_find(pool, segs[i].rid);
        if (r == NULL || r->row_mark == mark)
            continue;
        r->row_mark = mark;
        pool->rows[n++] = segs[i].rid;
    }
    *rows = pool->rows;
    return n;
}

/* The combined group containing `label`, or NULL. */
static const ms_combined_label *combined_of(const ms_kv_step *ks, ms_label label) {
    for (int32_t g = 0; g < ks->n_combined; g++)
        for (int32_t k = 0; k < ks->combined[g].n_labels; k++)
            if (ks->combined[g].labels[k] == label)
                return &ks->combined[g];
    return NULL;
}

static ms_admit_outcome outcome(ms_admit_code code, int32_t short_by, ms_label label, ms_rid rid) {
    ms_admit_outcome o = {code, short_by, label, rid, -1};
    return o;
}

/* ms_grow that adds 1 to *count (may be NULL) when it reallocated. */
static ms_status grow_counted(void **data, size_t *cap, size_t need, size_t elem,
                              int64_t *count) {
    size_t before = *cap;
    MS_TRY(ms_grow(data, cap, need, elem));
    if (count != NULL && *cap != before)
        (*count)++;
    return MS_OK;
}

/* Make s->pages hold `need` pages; the first growth sizes it for the pool's per-stream maximum
 * so later reservations of the stream never reallocate. *count as in grow_counted. */
static ms_status stream_reserve(const ms_kv_pool *pool, kv_stream *s, int32_t need,
                                int64_t *count) {
    size_t n = (size_t)MS_MAX(need, 1);
    if (s->cap >= n)
        return MS_OK;
    n = MS_MAX(n, (size_t)pool->max_pages_per_stream);
    return grow_counted((void **)&s->pages, &s->cap, n, sizeof(int32_t), count);
}

/* Grow one plan buffer set for the given sizes; *count (may be NULL) gets one per array grown. */
static ms_status plan_buf_reserve(kv_plan_buf *b, size_t n_views, size_t n_indices,
                                  size_t n_tokens, int64_t *count) {
    size_t n_ptr = 2 * n_views + 1;
    MS_TRY(grow_counted((void **)&b->plans, &b->plans_cap, n_views + 1, sizeof *b->plans,
                        count));
    MS_TRY(grow_counted((void **)&b->views, &b->views_cap, n_views + 1, sizeof *b->views,
                        count));
    MS_TRY(grow_counted((void **)&b->qo_indptr, &b->qo_cap, n_ptr, sizeof(int32_t), count));
    MS_TRY(grow_counted((void **)&b->kv_indptr, &b->kvp_cap, n_ptr, sizeof(int32_t), count));
    MS_TRY(grow_counted((void **)&b->kv_indices, &b->ind_cap, n_indices + 1, sizeof(int32_t),
                        count));
    MS_TRY(grow_counted((void **)&b->last_page_len, &b->lpl_cap, n_views + 1, sizeof(int32_t),
                        count));
    MS_TRY(grow_counted((void **)&b->kv_start, &b->start_cap, n_views + 1, sizeof(int32_t),
                        count));
    MS_TRY(grow_counted((void **)&b->token_to_page, &b->ttp_cap, n_tokens + 1, sizeof(int32_t),
                        count));
    MS_TRY(grow_counted((void **)&b->token_to_slot, &b->tts_cap, n_tokens + 1, sizeof(int32_t),
                        count));
    return MS_OK;
}

/* ---- admit ---- */

/* Add (r, label) to this call's touched set, initialising its scratch from the stream. */
static kv_stream *touch(ms_kv_pool *pool, kv_request *r, ms_label label, int32_t *n_touched) {
    kv_stream *s = &r->streams[label];
    if (s->mark != pool->mark) {
        s->mark = pool->mark;
        s->p_stored = s->exists ? s->stored : 0;
        s->p_released = s->exists ? s->released : 0;
        s->p_span = 0;
        s->p_need = 0;
        s->p_exists = s->exists;
        pool->touched[*n_touched].req = r;
        pool->touched[*n_touched].label = label;
        (*n_touched)++;
    }
    return s;
}

/* Check a transfer into `s` before admitting; returns OK, PENDING or TRANSFER_FAILED. */
static ms_admit_code poll_read(ms_kv_pool *pool, kv_request *r, kv_stream *s) {
    if (r->retrieve_failed || s->read_error)
        return MS_ADMIT_TRANSFER_FAILED;
    if (!s->read_pending)
        return MS_ADMIT_OK;
    ms_kv_transfer_state ts = pool->cfg.transfer->poll(pool->cfg.transfer_ctx, s->read_handle);
    if (ts == MS_KV_TRANSFER_PENDING)
        return MS_ADMIT_PENDING;
    if (pool->cfg.transfer->release != NULL)
        pool->cfg.transfer->release(pool->cfg.transfer_ctx, s->read_handle);
    s->read_pending = false;
    if (ts != MS_KV_TRANSFER_DONE) {
        s->read_error = true;
        r->retrieve_failed = true;
        return MS_ADMIT_TRANSFER_FAILED;
    }
    return MS_ADMIT_OK;
}

/* Validate the step's shape (labels, spans, forks, combined groups). */
static ms_admit_outcome validate_step(const ms_kv_step *ks, const ms_segment *segs, int32_t n) {
    for (int32_t i = 0; i < n; i++) {
        if (segs[i].label < 0 || segs[i].label >= MS_MAX_LABELS || segs[i].span < 0)
            return outcome(MS_ADMIT_INVALID, 0, segs[i].label, segs[i].rid);
    }
    const ms_fork *forks[2] = {ks->pre_forks, ks->post_forks};
    int32_t n_forks[2] = {ks->n_pre_forks, ks->n_post_forks};
    for (int k = 0; k < 2; k++) {
        if (n_forks[k] < 0 || (n_forks[k] > 0 && forks[k] == NULL))
            return outcome(MS_ADMIT_INVALID, 0, 0, 0);
        for (int32_t f = 0; f < n_forks[k]; f++) {
            ms_fork fk = forks[k][f];
            if (fk.from < 0 || fk.from >= MS_MAX_LABELS || fk.to < 0 || fk.to >= MS_MAX_LABELS ||
                fk.from == fk.to)
                return outcome(MS_ADMIT_INVALID, 0, fk.to, 0);
        }
    }
    if (ks->n_combined < 0 || (ks->n_combined > 0 && ks->combined == NULL))
        return outcome(MS_ADMIT_INVALID, 0, 0, 0);
    for (int32_t g = 0; g < ks->n_combined; g++) {
        const ms_combined_label *c = &ks->combined[g];
        if (c->n_labels < 1 || c->n_labels > MS_MAX_COMBINED_LABELS || c->plan_label < 0)
            return outcome(MS_ADMIT_INVALID, 0, c->plan_label, 0);
        for (int32_t k = 0; k < c->n_labels; k++) {
            ms_label l = c->labels[k];
            if (l < 0 || l >= MS_MAX_LABELS || combined_of(ks, l) != c)
                return outcome(MS_ADMIT_INVALID, 0, l, 0); /* bad or in two groups */
            for (int32_t j = 0; j < k; j++)
                if (c->labels[j] == l)
                    return outcome(MS_ADMIT_INVALID, 0, l, 0);
            bool seen = false;
            for (int32_t i = 0; i < n && !seen; i++)
                seen = segs[i].label == l;
            if (!seen)
                return outcome(MS_ADMIT_INVALID, 0, l, 0); /* source label without segments */
        }
    }
    for (int32_t g = 0; g < ks->n_combined; g++)
        for (int32_t h = 0; h < g; h++)
            if (ks->combined[g].plan_label == ks->combined[h].plan_label)
                return outcome(MS_ADMIT_INVALID, 0, ks->combined[g].plan_label, 0);
    /* A plain segment must not be filed under a combined group's plan label. */
    for (int32_t i = 0; i < n; i++)
        if (combined_of(ks, segs[i].label) == NULL)
            for (int32_t g = 0; g < ks->n_combined; g++)
                if (ks->combined[g].plan_label == segs[i].label)
                    return outcome(MS_ADMIT_INVALID, 0, segs[i].label, segs[i].rid);
    return ms_admit_ok();
}

/* Apply one fork's planned effect to the scratch (admit). Returns false when the request is
 * offloaded. */
static void plan_fork(ms_kv_pool *pool, kv_request *r, ms_fork fk, bool post, bool commit,
                      int32_t *n_touched) {
    kv_stream *src = touch(pool, r, fk.from, n_touched);
    if (!src->p_exists)
        return; /* absent source: the fork is a no-op */
    int32_t src_stored = src->p_stored + (post && commit ? src->p_span : 0);
    int32_t need = pages_for(src_stored - src->p_released, pool->ps);
    kv_stream *dst = touch(pool, r, fk.to, n_touched);
    dst->p_need = MS_MAX(dst->p_need, need);
    dst->p_exists = true;
    if (!post) {
        dst->p_stored = src->p_stored;
        dst->p_released = src->p_released;
    }
}

static ms_admit_outcome admit_locked(ms_kv_pool *pool, const ms_kv_step *ks, const ms_step *step,
                                     const ms_segment *segs, int32_t n_segs, ms_step_ctx *ctx) {
    ms_admit_outcome o = validate_step(ks, segs, n_segs);
    if (ms_admit_failed(o))
        return o;
    int32_t n_rows_max = ctx != NULL && ctx->n_rows > 0 ? ctx->n_rows : 0;
    size_t n_forks = (size_t)ks->n_pre_forks + (size_t)ks->n_post_forks;
    size_t max_touch = (size_t)n_segs + 2 * n_forks * (size_t)MS_MAX(n_rows_max, n_segs);
    if (grow_counted((void **)&pool->touched, &pool->touched_cap, max_touch + 1,
                     sizeof *pool->touched, &pool->admit_allocs) != MS_OK ||
        grow_counted((void **)&pool->rows, &pool->rows_cap, (size_t)n_segs + 1,
                     sizeof *pool->rows, &pool->admit_allocs) != MS_OK)
        return outcome(MS_ADMIT_NO_MEMORY, 0, 0, 0);
    /* Requests: known, not offloaded, no failed or pending transfer. */
    for (int32_t i = 0; i < n_segs; i++) {
        kv_request *r = req_live(pool, segs[i].rid);
        if (r == NULL)
            return outcome(MS_ADMIT_INVALID, 0, segs[i].label, segs[i].rid);
        kv_stream *s = &r->streams[segs[i].label];
        if (request_offloaded(r)) /* also a label the offloaded request has not created yet */
            return outcome(MS_ADMIT_OFFLOADED, 0, segs[i].label, segs[i].rid);
        ms_admit_code c = poll_read(pool, r, s);
        if (c != MS_ADMIT_OK)
            return outcome(c, 0, segs[i].label, segs[i].rid);
    }
    const ms_rid *rows = NULL;
    int32_t n_rows = n_forks > 0 ? step_rows(pool, segs, n_segs, ctx, &rows) : 0;
    for (int32_t i = 0; i < n_rows; i++) {
        kv_request *r = req_live(pool, rows[i]);
        if (r == NULL)
            return outcome(MS_ADMIT_INVALID, 0, 0, rows[i]);
        if (request_offloaded(r))
            return outcome(MS_ADMIT_OFFLOADED, 0, 0, rows[i]); /* H5c */
        for (int l = 0; l < MS_MAX_LABELS; l++) {
            kv_stream *s = &r->streams[l];
            ms_admit_code c = poll_read(pool, r, s);
            if (c != MS_ADMIT_OK)
                return outcome(c, 0, (ms_label)l, rows[i]);
        }
    }
    /* Plan every stream's need in the step's order: pre-forks, segments, post-forks. */
    pool->mark++;
    int32_t n_touched = 0;
    for (int32_t i = 0; i < n_rows; i++)
        for (int32_t f = 0; f < ks->n_pre_forks; f++)
            plan_fork(pool, req_live(pool, rows[i]), ks->pre_forks[f], false, ks->commit,
                      &n_touched);
    int64_t n_tokens = 0;
    int64_t n_indices = 0;
    for (int32_t i = 0; i < n_segs; i++) {
        kv_request *r = req_live(pool, segs[i].rid);
        kv_stream *s = touch(pool, r, segs[i].label, &n_touched);
        if (s->seg_mark == pool->mark)
            return outcome(MS_ADMIT_INVALID, 0, segs[i].label, segs[i].rid); /* duplicate */
        s->seg_mark = pool->mark;
        s->p_span = segs[i].span;
        n_tokens += segs[i].span;
        if (segs[i].span > 0) {
            int32_t total = s->p_stored + segs[i].span - s->p_released;
            if (total < 0 || s->p_stored > INT32_MAX - segs[i].span)
                return outcome(MS_ADMIT_INVALID, 0, segs[i].label, segs[i].rid);
            s->p_need = MS_MAX(s->p_need, pages_for(total, pool->ps));
            s->p_exists = true;
        }
    }
    for (int32_t i = 0; i < n_rows; i++)
        for (int32_t f = 0; f < ks->n_post_forks; f++)
            plan_fork(pool, req_live(pool, rows[i]), ks->post_forks[f], true, ks->commit,
                      &n_touched);
    /* Total new pages. */
    int64_t total = 0;
    for (int32_t t = 0; t < n_touched; t++) {
        kv_stream *s = &pool->touched[t].req->streams[pool->touched[t].label];
        if (s->p_need > s->n_pages)
            total += s->p_need - s->n_pages;
        n_indices += MS_MAX(s->p_need, s->n_pages);
    }
    int32_t n_free = ms_page_arena_num_free(pool->cfg.arena);
    if (total > n_free) {
        int64_t cum = 0;
        kv_touch who = pool->touched[0];
        for (int32_t t = 0; t < n_touched; t++) {
            kv_stream *s = &pool->touched[t].req->streams[pool->touched[t].label];
            cum += MS_MAX(0, s->p_need - s->n_pages);
            if (cum > n_free) {
                who = pool->touched[t];
                break;
            }
        }
        return outcome(MS_ADMIT_PAGES_SHORT, (int32_t)MS_MIN(total - n_free, INT32_MAX),
                       who.label, who.req->rid);
    }
    /* Host arrays first (growth is harmless if a later part fails). */
    bool oom = grow_counted((void **)&pool->acq, &pool->acq_cap, (size_t)total + 1,
                            sizeof(int32_t), &pool->admit_allocs) != MS_OK;
    for (int32_t t = 0; t < n_touched && !oom; t++) {
        kv_stream *s = &pool->touched[t].req->streams[pool->touched[t].label];
        oom = stream_reserve(pool, s, s->p_need, &pool->admit_allocs) != MS_OK;
    }
    /* Only the set the next plan writes: the other holds the latest plan, still in use (before
     * the first plan neither holds one: size both, so the alternation needs no second warm-up
     * admit). The indices are sized for the whole arena (every view page is a distinct held
     * page), so a growing decode never regrows them. */
    for (uint64_t k = 0; k < (pool->plan_seq == 0 ? 2u : 1u) && !oom; k++)
        oom = plan_buf_reserve(&pool->bufs[(pool->plan_seq + k) & 1], (size_t)n_segs,
                               (size_t)MS_MAX(n_indices, pool->max_pages_per_stream),
                               (size_t)n_tokens, &pool->admit_allocs) != MS_OK;
    if (oom)
        return outcome(MS_ADMIT_NO_MEMORY, 0, segs != NULL && n_segs > 0 ? segs[0].label : 0,
                       n_segs > 0 ? segs[0].rid : 0);
    if (ms_page_arena_acquire(pool->cfg.arena, (int32_t)total, pool->acq) != MS_OK) {
        /* Another user of the arena took pages since the count above. */
        int32_t now = ms_page_arena_num_free(pool->cfg.arena);
        kv_touch who = pool->touched[0];
        return outcome(MS_ADMIT_PAGES_SHORT, (int32_t)MS_MAX(1, total - now), who.label,
                       who.req->rid);
    }
    /* Commit the reservation. */
    int32_t used = 0;
    uint64_t tick = ++pool->tick;
    for (int32_t t = 0; t < n_touched; t++) {
        kv_request *r = pool->touched[t].req;
        kv_stream *s = &r->streams[pool->touched[t].label];
        r->last_active = tick;
        if (!s->p_exists)
            continue;
        if (s->inflight != step) {
            s->inflight = step;
            s->undo_n_pages = s->n_pages;
            s->undo_created = !s->exists;
            s->undo_forked = false;
        }
        s->exists = true;
        int32_t add = s->p_need - s->n_pages;
        if (add > 0) {
            memcpy(s->pages + s->n_pages, pool->acq + used, (size_t)add * sizeof(int32_t));
            s->n_pages += add;
            used += add;
            s->generation++;
        }
    }
    MS_ASSERT(used == total);
    return ms_admit_ok();
}

ms_admit_outcome ms_kv_pool_admit(ms_kv_pool *pool, int index, const ms_step *step,
                                  ms_step_ctx *ctx) {
    const ms_kv_step *ks = kv_record(step, index);
    if (ks == NULL)
        return ms_admit_ok();
    int32_t n_segs = 0;
    const ms_segment *segs = ms_step_segments(step, index, &n_segs);
    if (n_segs < 0 || (n_segs > 0 && segs == NULL))
        return outcome(MS_ADMIT_INVALID, 0, 0, 0);
    pthread_mutex_lock(&pool->mu);
    ms_admit_outcome o = admit_locked(pool, ks, step, segs, n_segs, ctx);
    pthread_mutex_unlock(&pool->mu);
    return o;
}

/* Undo or finish the in-flight state of every stream of the step's requests. */
static void rollback_request(ms_kv_pool *pool, kv_request *r, const ms_step *step) {
    for (int l = 0; l < MS_MAX_LABELS; l++) {
        kv_stream *s = &r->streams[l];
        if (s->inflight != step)
            continue;
        if (s->undo_forked) {
            s->stored = s->undo_stored;
            s->released = s->undo_released;
            s->generation++;
        }
        if (s->n_pages > s->undo_n_pages) {
            release_pages(pool->cfg.arena, s->pages + s->undo_n_pages,
                          s->n_pages - s->undo_n_pages);
            s->n_pages = s->undo_n_pages;
            s->generation++;
        }
        if (s->undo_created && s->n_pages == 0 && s->stored == 0 && l != MS_LABEL_MAIN)
            s->exists = false;
        s->inflight = NULL;
        s->undo_forked = false;
    }
}

void ms_kv_pool_admit_rollback(ms_kv_pool *pool, int index, const ms_step *step,
                               ms_step_ctx *ctx) {
    const ms_kv_step *ks = kv_record(step, index);
    if (ks == NULL)
        return;
    int32_t n_segs = 0;
    const ms_segment *segs = ms_step_segments(step, index, &n_segs);
    pthread_mutex_lock(&pool->mu);
    for (int32_t i = 0; i < n_segs; i++) {
        kv_request *r = req_live(pool, segs[i].rid);
        if (r != NULL)
            rollback_request(pool, r, step);
    }
    if (ctx != NULL && ctx->request_ids != NULL)
        for (int32_t i = 0; i < ctx->n_rows; i++) {
            kv_request *r = req_live(pool, ctx->request_ids[i]);
            if (r != NULL)
                rollback_request(pool, r, step);
        }
    pthread_mutex_unlock(&pool->mu);
}

/* ---- plan ---- */

/* Copy the source stream's present pages onto the target and mirror its lengths. */
static ms_status apply_fork(ms_kv_pool *pool, kv_request *r, ms_fork fk, const ms_step *step,
                            bool record_undo, ms_error *err) {
    kv_stream *src = &r->streams[fk.from];
    kv_stream *dst = &r->streams[fk.to];
    if (!src->exists)
        return MS_OK;
    if (src->offloaded || dst->offloaded)
        return MS_FAIL(err, MS_ERR_STATE, "kv pool: fork %d -> %d of request %llu: offloaded",
                       fk.from, fk.to, (unsigned long long)r->rid);
    int32_t n = stream_need(src, pool->ps);
    if (dst->n_pages < n)
        return MS_FAIL(err, MS_ERR_STATE,
                       "kv pool: fork %d -> %d of request %llu needs %d pages on the target, "
                       "it holds %d: admit the step first", fk.from, fk.to,
                       (unsigned long long)r->rid, n, dst->n_pages);
    if (record_undo && dst->inflight == step && !dst->undo_forked) {
        dst->undo_forked = true;
        dst->undo_stored = dst->stored;
        dst->undo_released = dst->released;
    }
    MS_TRY(ms_page_arena_copy_pages(pool->cfg.arena, src->pages, dst->pages, n,
                                    pool->cfg.compute_stream, err));
    dst->exists = true;
    dst->stored = src->stored;
    dst->released = src->released;
    dst->generation++;
    return MS_OK;
}

/* Append one view (and its index entries) for stream (rid, label) to plan `p`. */
static ms_status add_view(ms_kv_pool *pool, kv_plan_buf *b, ms_kv_plan *p, int32_t *n_views,
                          int32_t *n_ind, int32_t *n_tok, const ms_segment *seg, ms_error *err) {
    kv_request *r = req_live(pool, seg->rid);
    if (r == NULL)
        return MS_FAIL(err, MS_ERR_NOT_FOUND, "kv pool: plan: unknown request %llu",
                       (unsigned long long)seg->rid);
    kv_stream *s = stream_of(r, seg->label);
    if (s == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "kv pool: plan: label %d out of range",
                       seg->label);
    int32_t v = *n_views;
    ms_kv_view view = {.rid = seg->rid, .label = seg->label, .to_compute = seg->span};
    if (!s->exists) {
        if (seg->span > 0)
            return MS_FAIL(err, MS_ERR_STATE,
                           "kv pool: plan: stream %d of request %llu was never admitted",
                           seg->label, (unsigned long long)seg->rid);
        /* zero-span read of an absent label: an empty view (H6) */
    } else {
        if (s->offloaded || s->read_pending)
            return MS_FAIL(err, MS_ERR_STATE,
                           "kv pool: plan: stream %d of request %llu is %s", seg->label,
                           (unsigned long long)seg->rid,
                           s->offloaded ? "offloaded" : "still receiving a transfer");
        int32_t length = s->stored + seg->span - s->released;
        int32_t np = pages_for(length, pool->ps);
        if (np > s->n_pages)
            return MS_FAIL(err, MS_ERR_STATE,
                           "kv pool: plan: stream %d of request %llu needs %d pages for %d "
                           "tokens but holds %d: admit the step first", seg->label,
                           (unsigned long long)seg->rid, np, length, s->n_pages);
        view.start = s->released;
        view.length = length;
        view.n_pages = np;
        view.generation = s->generation;
    }
    int32_t *ind = b->kv_indices + *n_ind;
    if (view.n_pages > 0)
        memcpy(ind, s->pages, (size_t)view.n_pages * sizeof(int32_t));
    view.pages = ind;
    /* write addresses of the new tokens: present offset (stored - released) + j */
    int32_t base = view.length - view.to_compute;
    int32_t *ttp = b->token_to_page + *n_tok;
    int32_t *tts = b->token_to_slot + *n_tok;
    for (int32_t j = 0; j < view.to_compute; j++) {
        int32_t off = base + j;
        ttp[j] = ind[off / pool->ps];
        tts[j] = off % pool->ps;
    }
    b->views[v] = view;
    b->last_page_len[v] =
        view.n_pages == 0 ? 0 : ((view.length % pool->ps) == 0 ? pool->ps : view.length % pool->ps);
    b->kv_start[v] = view.start;
    (void)p;
    *n_views = v + 1;
    *n_ind += view.n_pages;
    *n_tok += view.to_compute;
    return MS_OK;
}

/* Sizes a plan of the step needs (upper bounds, under the lock). */
static void plan_sizes(ms_kv_pool *pool, const ms_segment *segs, int32_t n, size_t *n_ind,
                       size_t *n_tok) {
    *n_ind = 0;
    *n_tok = 0;
    for (int32_t i = 0; i < n; i++) {
        *n_tok += segs[i].span > 0 ? (size_t)segs[i].span : 0;
        kv_request *r = req_live(pool, segs[i].rid);
        kv_stream *s = r != NULL ? stream_of(r, segs[i].label) : NULL;
        if (s != NULL)
            *n_ind += (size_t)s->n_pages;
    }
}

static ms_status plan_locked(ms_kv_pool *pool, const ms_kv_step *ks, const ms_step *step,
                             const ms_segment *segs, int32_t n_segs, ms_step_ctx *ctx,
                             const ms_kv_plan_set **out, ms_error *err) {
    /* Buffers: admit sized them; grow here only for a plan without an admit. */
    if (ms_grow((void **)&pool->rows, &pool->rows_cap, (size_t)n_segs + 1,
                sizeof *pool->rows) != MS_OK)
        return MS_FAIL(err, MS_ERR_OOM, "kv pool: plan: out of host memory");
    /* Pre-forks first: views must see the copied state. */
    if (ks->n_pre_forks > 0) {
        const ms_rid *rows = NULL;
        int32_t n_rows = step_rows(pool, segs, n_segs, ctx, &rows);
        for (int32_t i = 0; i < n_rows; i++) {
            kv_request *r = req_live(pool, rows[i]);
            if (r == NULL)
                continue;
            for (int32_t f = 0; f < ks->n_pre_forks; f++)
                MS_TRY(apply_fork(pool, r, ks->pre_forks[f], step, true, err));
        }
    }
    kv_plan_buf *b = &pool->bufs[pool->plan_seq & 1];
    size_t n_ind = 0, n_tok = 0;
    plan_sizes(pool, segs, n_segs, &n_ind, &n_tok);
    if (b->views_cap < (size_t)n_segs + 1 || b->ind_cap < n_ind + 1 || b->ttp_cap < n_tok + 1 ||
        b->qo_cap < 2 * (size_t)n_segs + 1) {

        pool->plan_allocs++;
        if (plan_buf_reserve(b, (size_t)n_segs, n_ind, n_tok, NULL) != MS_OK)
            return MS_FAIL(err, MS_ERR_OOM, "kv pool: plan: out of host memory");
    }
    pool->plan_seq++;
    /* Plan labels in order of first appearance. */
    int32_t n_plans = 0;
    for (int32_t i = 0; i < n_segs; i++) {
        const ms_combined_label *c = combined_of(ks, segs[i].label);
        ms_label pl = c != NULL ? c->plan_label : segs[i].label;
        bool found = false;
        for (int32_t p = 0; p < n_plans && !found; p++)
            found = b->plans[p].plan_label == pl;
        if (!found) {
            memset(&b->plans[n_plans], 0, sizeof b->plans[n_plans]);
            b->plans[n_plans++].plan_label = pl;
        }
    }
    int32_t n_views = 0, n_ind_used = 0, n_tok_used = 0, n_ptr = 0;
    for (int32_t p = 0; p < n_plans; p++) {
        ms_kv_plan *plan = &b->plans[p];
        const ms_combined_label *c = NULL;
        for (int32_t g = 0; g < ks->n_combined && c == NULL; g++)
            if (ks->combined[g].plan_label == plan->plan_label)
                c = &ks->combined[g];
        int32_t v0 = n_views, i0 = n_ind_used, t0 = n_tok_used;
        int32_t n_src = c != NULL ? c->n_labels : 1;
        for (int32_t k = 0; k < n_src; k++) {
            ms_label l = c != NULL ? c->labels[k] : plan->plan_label;
            for (int32_t i = 0; i < n_segs; i++) {
                if (segs[i].label != l || (c == NULL && combined_of(ks, l) != NULL))
                    continue;
                MS_TRY(add_view(pool, b, plan, &n_views, &n_ind_used, &n_tok_used, &segs[i],
                                err));
            }
        }
        int32_t nv = n_views - v0;
        int32_t *qo = b->qo_indptr + n_ptr;
        int32_t *kvp = b->kv_indptr + n_ptr;
        qo[0] = 0;
        kvp[0] = 0;
        bool decode = nv > 0;
        for (int32_t v = 0; v < nv; v++) {
            qo[v + 1] = qo[v] + b->views[v0 + v].to_compute;
            kvp[v + 1] = kvp[v] + b->views[v0 + v].n_pages;
            decode = decode && b->views[v0 + v].to_compute == 1;
        }
        n_ptr += nv + 1;
        plan->n_views = nv;
        plan->views = b->views + v0;
        plan->n_tokens = qo[nv];
        plan->qo_indptr = qo;
        plan->kv_indptr = kvp;
        plan->kv_indices = b->kv_indices + i0;
        plan->kv_last_page_len = b->last_page_len + v0;
        plan->kv_start = b->kv_start + v0;
        plan->token_to_page = b->token_to_page + t0;
        plan->token_to_slot = b->token_to_slot + t0;
        plan->is_decode = decode;
        if (decode) {
            /* Decode fast path: the one new token is the last of the last page. */
            for (int32_t v = 0; v < nv; v++) {
                const ms_kv_view *w = &b->views[v0 + v];
                b->token_to_page[t0 + v] = w->pages[w->n_pages - 1];
                b->token_to_slot[t0 + v] = b->last_page_len[v0 + v] - 1;
            }
        }
    }
    b->set.page_size = pool->ps;
    b->set.n_plans = n_plans;
    b->set.plans = b->plans;
    b->set.pre_forks = ks->pre_forks;
    b->set.n_pre_forks = ks->n_pre_forks;
    b->set.post_forks = ks->post_forks;
    b->set.n_post_forks = ks->n_post_forks;
    b->set.commit = ks->commit;
    *out = &b->set;
    return MS_OK;
}

ms_status ms_kv_pool_plan(ms_kv_pool *pool, int index, const ms_step *step, ms_step_ctx *ctx,
                          const ms_kv_plan_set **out, ms_error *err) {
    *out = NULL;
    const ms_kv_step *ks = kv_record(step, index);
    if (ks == NULL)
        return MS_OK;
    int32_t n_segs = 0;
    const ms_segment *segs = ms_step_segments(step, index, &n_segs);
    if (n_segs < 0 || (n_segs > 0 && segs == NULL))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "kv pool: plan: bad segment list");
    for (int32_t i = 0; i < n_segs; i++)
        if (segs[i].label < 0 || segs[i].label >= MS_MAX_LABELS || segs[i].span < 0)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "kv pool: plan: segment %d (request %llu, label %d, span %d) is "
                           "invalid", i, (unsigned long long)segs[i].rid, segs[i].label,
                           segs[i].span);
    pthread_mutex_lock(&pool->mu);
    ms_status st = plan_locked(pool, ks, step, segs, n_segs, ctx, out, err);
    pthread_mutex_unlock(&pool->mu);
    if (st != MS_OK)
        *out = NULL;
    return st;
}

/* ---- commit ---- */

/* Release whole pages entirely outside the window from the front of the stream. */
static void apply_retention(ms_kv_pool *pool, kv_stream *s) {
    if (s->window <= 0 || !s->exists || s->offloaded)
        return;
    int32_t k = 0;
    while (s->stored - s->released - k * pool->ps - s->window >= pool->ps && k < s->n_pages)
        k++;
    if (k == 0)
        return;
    release_pages(pool->cfg.arena, s->pages, k);
    memmove(s->pages, s->pages + k, (size_t)(s->n_pages - k) * sizeof(int32_t));
    s->n_pages -= k;
    s->released += k * pool->ps;
    s->generation++;
    if (s->inflight != NULL && s->undo_n_pages > 0)
        s->undo_n_pages = MS_MAX(0, s->undo_n_pages - k);
}

static ms_status commit_locked(ms_kv_pool *pool, const ms_kv_step *ks, const ms_step *step,
                               const ms_segment *segs, int32_t n_segs, ms_step_ctx *ctx,
                               ms_error *err) {
    ms_status st = MS_OK;
    uint64_t tick = ++pool->tick;
    for (int32_t i = 0; i < n_segs; i++) {
        kv_request *r = req_live(pool, segs[i].rid);
        kv_stream *s = r != NULL ? stream_of(r, segs[i].label) : NULL;
        if (s == NULL)
            continue;
        r->last_active = tick;
        if (!ks->commit || segs[i].span == 0 || !s->exists)
            continue;
        if (s->offloaded || r->offload_running) {
            ms_log(MS_LOG_WARN, "kv pool: commit: request %llu label %d is offloaded; %d "
                   "token(s) dropped", (unsigned long long)r->rid, segs[i].label, segs[i].span);
            continue;
        }
        if (pages_for(s->stored + segs[i].span - s->released, pool->ps) > s->n_pages) {
            ms_log(MS_LOG_WARN, "kv pool: commit: request %llu label %d lost its reservation "
                   "(reset meanwhile); %d token(s) dropped", (unsigned long long)r->rid,
                   segs[i].label, segs[i].span);
            continue;
        }
        s->stored += segs[i].span;
    }
    const ms_rid *rows = NULL;
    int32_t n_rows = 0;
    if (ks->n_post_forks > 0 || ks->n_pre_forks > 0) {
        if (ms_grow((void **)&pool->rows, &pool->rows_cap, (size_t)n_segs + 1,
                    sizeof *pool->rows) != MS_OK)
            return MS_FAIL(err, MS_ERR_OOM, "kv pool: commit: out of host memory");
        n_rows = step_rows(pool, segs, n_segs, ctx, &rows);
    }
    for (int32_t i = 0; i < n_rows; i++) {
        kv_request *r = req_live(pool, rows[i]);
        if (r == NULL)
            continue;
        if (request_offloaded(r)) {
            if (ks->n_post_forks > 0)
                ms_log(MS_LOG_WARN, "kv pool: commit: request %llu is offloaded; post-forks "
                       "dropped", (unsigned long long)r->rid);
            continue;
        }
        for (int32_t f = 0; f < ks->n_post_forks; f++) {
            ms_error e2 = {0};
            ms_status fs = apply_fork(pool, r, ks->post_forks[f], step, false, &e2);
            if (fs != MS_OK && st == MS_OK) {
                st = fs;
                if (err != NULL)
                    *err = e2;
            }
        }
    }
    /* Retention, then finish the in-flight state of everything the step touched. */
    for (int32_t i = 0; i < n_segs; i++) {
        kv_request *r = req_live(pool, segs[i].rid);
        kv_stream *s = r != NULL ? stream_of(r, segs[i].label) : NULL;
        if (s != NULL)
            apply_retention(pool, s);
    }
    for (int32_t i = 0; i < n_rows; i++) {
        kv_request *r = req_live(pool, rows[i]);
        if (r == NULL)
            continue;
        for (int32_t f = 0; f < ks->n_post_forks; f++)
            apply_retention(pool, &r->streams[ks->post_forks[f].to]);
    }
    for (int32_t i = 0; i < n_segs; i++) {
        kv_request *r = req_live(pool, segs[i].rid);
        if (r != NULL)
            for (int l = 0; l < MS_MAX_LABELS; l++)
                if (r->streams[l].inflight == step || l == segs[i].label) {
                    r->streams[l].inflight = NULL;
                    r->streams[l].undo_forked = false;
                }
    }
    for (int32_t i = 0; i < n_rows; i++) {
        kv_request *r = req_live(pool, rows[i]);
        if (r == NULL)
            continue;
        for (int l = 0; l < MS_MAX_LABELS; l++) {
            bool forked = false;
            for (int32_t f = 0; f < ks->n_pre_forks; f++)
                forked = forked || ks->pre_forks[f].from == l || ks->pre_forks[f].to == l;
            for (int32_t f = 0; f < ks->n_post_forks; f++)
                forked = forked || ks->post_forks[f].from == l || ks->post_forks[f].to == l;
            if (r->streams[l].inflight == step || forked) {
                r->streams[l].inflight = NULL;
                r->streams[l].undo_forked = false;
            }
        }
    }
    return st;
}

ms_status ms_kv_pool_commit(ms_kv_pool *pool, int index, const ms_step *step, ms_step_ctx *ctx,
                            ms_error *err) {
    const ms_kv_step *ks = kv_record(step, index);
    if (ks == NULL)
        return MS_OK;
    int32_t n_segs = 0;
    const ms_segment *segs = ms_step_segments(step, index, &n_segs);
    if (n_segs < 0 || (n_segs > 0 && segs == NULL))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "kv pool: commit: bad segment list");
    for (int32_t i = 0; i < n_segs; i++)
        if (segs[i].label < 0 || segs[i].label >= MS_MAX_LABELS || segs[i].span < 0)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "kv pool: commit: segment %d (request %llu, label %d, span %d) is "
                           "invalid", i, (unsigned long long)segs[i].rid, segs[i].label,
                           segs[i].span);
    pthread_mutex_lock(&pool->mu);
    ms_status st = commit_locked(pool, ks, step, segs, n_segs, ctx, err);
    pthread_mutex_unlock(&pool->mu);
    return st;
}

/* ---- publish / retrieve ---- */

void ms_kv_published_free(ms_kv_published *pub) {
    if (pub == NULL)
        return;
    for (int32_t i = 0; i < pub->n_streams; i++)
        ms_free(pub->streams[i].pages);
    ms_free(pub);
}

ms_status ms_kv_pool_publish(ms_kv_pool *pool, ms_rid rid, ms_kv_published **out,
                             ms_error *err) {
    *out = NULL;
    ms_kv_published *pub = ms_calloc(1, sizeof *pub);
    if (pub == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "kv pool: publish: out of host memory");
    pthread_mutex_lock(&pool->mu);
    ms_status st = MS_OK;
    kv_request *r = req_live(pool, rid);
    if (r == NULL) {
        st = MS_FAIL(err, MS_ERR_NOT_FOUND, "kv pool: publish: unknown request %llu",
                     (unsigned long long)rid);
        goto done;
    }
    pub->rid = rid;
    pub->world_size = pool->cfg.world_size;
    pub->rank = pool->cfg.rank;
    pub->page_size = pool->ps;
    pub->source = pool->cfg.source;
    for (int l = 0; l < MS_MAX_LABELS; l++) {
        kv_stream *s = &r->streams[l];
        if (!s->exists)
            continue;
        if (s->offloaded || r->offload_running) {
            st = MS_FAIL(err, MS_ERR_STATE, "kv pool: publish: request %llu is offloaded",
                         (unsigned long long)rid);
            goto done;
        }
        ms_kv_published_stream *ps = &pub->streams[pub->n_streams];
        ps->label = (ms_label)l;
        ps->length = s->stored;
        ps->start = s->released;
        ps->n_pages = stream_need(s, pool->ps);
        ps->pages = ms_malloc((size_t)MS_MAX(ps->n_pages, 1) * sizeof(int32_t));
        if (ps->pages == NULL) {
            st = MS_FAIL(err, MS_ERR_OOM, "kv pool: publish: out of host memory");
            goto done;
        }
        pub->n_streams++;
        if (ps->n_pages > 0)
            memcpy(ps->pages, s->pages, (size_t)ps->n_pages * sizeof(int32_t));
    }
done:
    pthread_mutex_unlock(&pool->mu);
    if (st != MS_OK) {
        ms_kv_published_free(pub);
        return st;
    }
    *out = pub;
    return MS_OK;
}

/* Latch a terminal transfer failure for the request. */
static ms_admit_outcome retrieve_fail(kv_request *r, ms_label label) {
    r->retrieve_failed = true;
    return outcome(MS_ADMIT_TRANSFER_FAILED, 0, label, r->rid);
}

static ms_admit_outcome retrieve_locked(ms_kv_pool *pool, kv_request *r,
                                        const ms_kv_published *pub) {
    if (r->retrieve_failed)
        return outcome(MS_ADMIT_TRANSFER_FAILED, 0, 0, r->rid);
    if (request_offloaded(r))
        return outcome(MS_ADMIT_OFFLOADED, 0, 0, r->rid);
    if (pool->cfg.transfer == NULL || pub->world_size != pool->cfg.world_size ||
        pub->page_size != pool->ps || pub->n_streams < 0 || pub->n_streams > MS_MAX_LABELS)
        return retrieve_fail(r, 0);
    bool pending = false;
    bool any = false; /* some stream starts a transfer */
    pool->mark++;
    int64_t total = 0;
    for (int32_t i = 0; i < pub->n_streams; i++) {
        const ms_kv_published_stream *ps = &pub->streams[i];
        if (ps->label < 0 || ps->label >= MS_MAX_LABELS || ps->length < ps->start ||
            ps->start < 0 || ps->start % pool->ps != 0 ||
            ps->n_pages < pages_for(ps->length - ps->start, pool->ps))
            return retrieve_fail(r, ps->label);
        if (r->retrieve_labels != 0 && !(r->retrieve_labels & (UINT32_C(1) << ps->label)))
            continue;
        kv_stream *s = &r->streams[ps->label];
        if (s->offloaded)
            return outcome(MS_ADMIT_OFFLOADED, 0, ps->label, r->rid);
        if (stream_in_flight(s))
            return outcome(MS_ADMIT_PENDING, 0, ps->label, r->rid); /* retry after commit */
        ms_admit_code c = poll_read(pool, r, s);
        if (c == MS_ADMIT_TRANSFER_FAILED)
            return outcome(c, 0, ps->label, r->rid);
        if (c == MS_ADMIT_PENDING) {
            pending = true;
            continue;
        }
        int32_t have = s->exists ? s->stored : 0;
        if (ps->length <= have)
            continue; /* already resident (a stale publish never rewinds) */
        if (have > 0 && s->released != ps->start)
            return retrieve_fail(r, ps->label); /* retention disagrees */
        s->mark = pool->mark;
        any = true;
        s->p_need = pages_for(ps->length - ps->start, pool->ps);
        total += MS_MAX(0, s->p_need - s->n_pages);
        if (stream_reserve(pool, s, s->p_need, NULL) != MS_OK)
            return outcome(MS_ADMIT_NO_MEMORY, 0, ps->label, r->rid);
    }
    if (ms_grow((void **)&pool->acq, &pool->acq_cap, (size_t)total + 1, sizeof(int32_t)) != MS_OK)
        return outcome(MS_ADMIT_NO_MEMORY, 0, 0, r->rid);
    if (total > 0 && ms_page_arena_acquire(pool->cfg.arena, (int32_t)total, pool->acq) != MS_OK) {
        int32_t n_free = ms_page_arena_num_free(pool->cfg.arena);
        return outcome(MS_ADMIT_PAGES_SHORT, (int32_t)MS_MAX(1, total - n_free), 0, r->rid);
    }
    /* Transfers write pages a running forward may still read (released by its commit). */
    ms_device_event *done = NULL;
    if (any && pool->retrieve_event != NULL) {
        ms_error e = {0};
        if (ms_device_event_record(ms_page_arena_device(pool->cfg.arena), pool->retrieve_event,
                                   pool->cfg.compute_stream, &e) == MS_OK)
            done = pool->retrieve_event;
        else
            r->retrieve_failed = true; /* cannot order the writes: fail the request's transfers */
    }
    int32_t used = 0;
    for (int32_t i = 0; i < pub->n_streams; i++) {
        const ms_kv_published_stream *ps = &pub->streams[i];
        kv_stream *s = &r->streams[ps->label];
        if (s->mark != pool->mark)
            continue;
        s->mark = 0;
        int32_t add = s->p_need - s->n_pages;
        if (add > 0) {
            memcpy(s->pages + s->n_pages, pool->acq + used, (size_t)add * sizeof(int32_t));
            s->n_pages += add;
            used += add;
        }
        int32_t have = s->exists ? s->stored : 0;
        if (have == 0)
            s->released = ps->start;
        s->exists = true;
        s->generation++;
        ms_kv_transfer_desc d = {
            .rid = r->rid,
            .label = ps->label,
            .page_size = pool->ps,
            .start = ps->start,
            .token_begin = MS_MAX(have, ps->start),
            .token_end = ps->length,
            .local_pages = s->pages,
            .n_local_pages = s->p_need,
            .remote_pages = ps->pages,
            .n_remote_pages = ps->n_pages,
            .source = pub->source,
            .compute_done = done,
        };
        s->stored = ps->length;
        if (r->retrieve_failed) {
            s->read_error = true;
            continue;
        }
        uint64_t h = 0;
        ms_error e = {0};
        if (pool->cfg.transfer->start(pool->cfg.transfer_ctx, &d, &h, &e) != MS_OK) {
            ms_log(MS_LOG_WARN, "kv pool: transfer for request %llu label %d failed to start: %s",
                   (unsigned long long)r->rid, ps->label, e.msg);
            s->read_error = true;
            r->retrieve_failed = true;
            continue;
        }
        s->read_pending = true;
        s->read_handle = h;
        if (poll_read(pool, r, s) == MS_ADMIT_PENDING)
            pending = true;
    }
    MS_ASSERT(used == total);
    if (r->retrieve_failed)
        return outcome(MS_ADMIT_TRANSFER_FAILED, 0, 0, r->rid);
    r->last_active = ++pool->tick;
    return pending ? outcome(MS_ADMIT_PENDING, 0, 0, r->rid) : ms_admit_ok();
}

ms_admit_outcome ms_kv_pool_admit_retrieve(ms_kv_pool *pool, ms_rid rid,
                                           const ms_kv_published *pub) {
    if (pub == NULL)
        return outcome(MS_ADMIT_INVALID, 0, 0, rid);
    pthread_mutex_lock(&pool->mu);
    kv_request *r = req_live(pool, rid);
    ms_admit_outcome o = r == NULL ? outcome(MS_ADMIT_INVALID, 0, 0, rid)
                                   : retrieve_locked(pool, r, pub);
    pthread_mutex_unlock(&pool->mu);
    return o;
}

/* ---- offload / reload ---- */

ms_status ms_kv_pool_offload(ms_kv_pool *pool, ms_rid rid, int32_t *pages_freed, ms_error *err) {
    if (pages_freed != NULL)
        *pages_freed = 0;
    if (pool->cfg.host_arena == NULL)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "kv pool: offload: no host tier configured");
    ms_device *dev = ms_page_arena_device(pool->cfg.arena);
    pthread_mutex_lock(&pool->mu);
    ms_status st = MS_OK;
    kv_request *r = req_live(pool, rid);
    if (r == NULL) {
        pthread_mutex_unlock(&pool->mu);
        return MS_FAIL(err, MS_ERR_NOT_FOUND, "kv pool: offload: unknown request %llu",
                       (unsigned long long)rid);
    }
    if (r->offload_running) {
        pthread_mutex_unlock(&pool->mu);
        return MS_FAIL(err, MS_ERR_STATE, "kv pool: offload: request %llu is already moving",
                       (unsigned long long)rid);
    }
    int32_t need = 0;
    bool already = false;
    for (int l = 0; l < MS_MAX_LABELS; l++) {
        kv_stream *s = &r->streams[l];
        if (!s->exists)
            continue;
        already = already || s->offloaded;
        if (stream_in_flight(s) || s->read_pending) {
            /* read the stream before unlocking: another thread may change it right after */
            const char *why = s->read_pending ? "a transfer pending" : "a step in flight";
            pthread_mutex_unlock(&pool->mu);
            return MS_FAIL(err, MS_ERR_STATE, "kv pool: offload: request %llu label %d has %s",
                           (unsigned long long)rid, l, why);
        }
        need += stream_need(s, pool->ps);
    }
    if (already) {
        pthread_mutex_unlock(&pool->mu);
        return MS_OK;
    }
    /* Host pages and arrays, all or nothing. */
    int32_t *host = NULL;
    if (need > 0) {
        host = ms_malloc((size_t)need * sizeof(int32_t));
        if (host == NULL) {
            pthread_mutex_unlock(&pool->mu);
            return MS_FAIL(err, MS_ERR_OOM, "kv pool: offload: out of host memory");
        }
        for (int l = 0; l < MS_MAX_LABELS; l++) {
            kv_stream *s = &r->streams[l];
            if (s->exists && ms_grow((void **)&s->host_pages, &s->host_cap,
                                     (size_t)MS_MAX(1, stream_need(s, pool->ps)),
                                     sizeof(int32_t)) != MS_OK) {
                pthread_mutex_unlock(&pool->mu);
                ms_free(host);
                return MS_FAIL(err, MS_ERR_OOM, "kv pool: offload: out of host memory");
            }
        }
        if (ms_page_arena_acquire(pool->cfg.host_arena, need, host) != MS_OK) {
            int32_t n_free = ms_page_arena_num_free(pool->cfg.host_arena);
            pthread_mutex_unlock(&pool->mu);
            ms_free(host);
            return MS_FAIL(err, MS_ERR_CAPACITY,
                           "kv pool: offload: request %llu needs %d host pages, %d free (raise "
                           "kv_host_pages)", (unsigned long long)rid, need, n_free);
        }
    }
    /* Claim: admit now refuses the request (OFFLOADED). */
    r->offload_running = true;
    r->busy++;
    int32_t used = 0;
    for (int l = 0; l < MS_MAX_LABELS; l++) {
        kv_stream *s = &r->streams[l];
        if (!s->exists)
            continue;
        s->offloaded = true;
        s->claim_generation = s->generation;
        s->claim_stored = s->stored;
        s->claim_released = s->released;
        s->claim_n_pages = s->n_pages;
        int32_t n = stream_need(s, pool->ps);
        if (n > 0)
            memcpy(s->host_pages, host + used, (size_t)n * sizeof(int32_t));
        s->n_host_pages = n;
        used += n;
    }
    /* H4: copies read pages the compute stream may still be writing. */
    if (need > 0) {
        st = ms_device_event_record(dev, pool->offload_event, pool->cfg.compute_stream, err);
        if (st == MS_OK && pool->cfg.copy_stream != NULL)
            st = ms_device_stream_wait(dev, pool->cfg.copy_stream, pool->offload_event, err);
        for (int l = 0; l < MS_MAX_LABELS && st == MS_OK; l++) {
            kv_stream *s = &r->streams[l];
            if (s->exists && s->n_host_pages > 0)
                st = ms_page_arena_copy_across(pool->cfg.arena, s->pages, pool->cfg.host_arena,
                                               s->host_pages, s->n_host_pages, MS_COPY_D2H,
                                               pool->cfg.copy_stream, err);
        }
    }
    pthread_mutex_unlock(&pool->mu);
    ms_free(host);
    if (st == MS_OK && need > 0)
        st = ms_device_synchronize(dev, pool->cfg.copy_stream, err);
    pthread_mutex_lock(&pool->mu);
    bool changed = st != MS_OK;
    for (int l = 0; l < MS_MAX_LABELS && !changed; l++) {
        kv_stream *s = &r->streams[l];
        if (s->exists && s->offloaded &&
            (s->generation != s->claim_generation || s->stored != s->claim_stored ||
             s->released != s->claim_released || s->n_pages != s->claim_n_pages))
            changed = true;
    }
    int32_t freed = 0;
    for (int l = 0; l < MS_MAX_LABELS; l++) {
        kv_stream *s = &r->streams[l];
        if (!s->exists || !s->offloaded)
            continue;
        if (changed) {
            /* Abandon: the device pages stay, the host copies go. */
            release_pages(pool->cfg.host_arena, s->host_pages, s->n_host_pages);
            s->n_host_pages = 0;
            s->offloaded = false;
        } else {
            release_pages(pool->cfg.arena, s->pages, s->n_pages);
            freed += s->n_pages;
            s->n_pages = 0;
        }
    }
    r->offload_running = false;
    r->busy--;
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    if (st != MS_OK) {
        ms_error_prefix(err, "kv pool: offload of request %llu abandoned: ",
                        (unsigned long long)rid);
        return st;
    }
    if (changed)
        return MS_FAIL(err, MS_ERR_STATE,
                       "kv pool: offload of request %llu abandoned: a stream changed during the "
                       "copy", (unsigned long long)rid);
    if (pages_freed != NULL)
        *pages_freed = freed;
    return MS_OK;
}

ms_status ms_kv_pool_reload(ms_kv_pool *pool, ms_rid rid, ms_error *err) {
    ms_device *dev = ms_page_arena_device(pool->cfg.arena);
    pthread_mutex_lock(&pool->mu);
    kv_request *r = req_live(pool, rid);
    if (r == NULL) {
        pthread_mutex_unlock(&pool->mu);
        return MS_FAIL(err, MS_ERR_NOT_FOUND, "kv pool: reload: unknown request %llu",
                       (unsigned long long)rid);
    }
    if (r->offload_running) {
        pthread_mutex_unlock(&pool->mu);
        return MS_FAIL(err, MS_ERR_STATE, "kv pool: reload: request %llu is already moving",
                       (unsigned long long)rid);
    }
    int32_t need = 0;
    bool any = false;
    for (int l = 0; l < MS_MAX_LABELS; l++) {
        kv_stream *s = &r->streams[l];
        if (s->exists && s->offloaded) {
            any = true;
            need += s->n_host_pages;
            if (stream_reserve(pool, s, s->n_host_pages, NULL) != MS_OK) {
                pthread_mutex_unlock(&pool->mu);
                return MS_FAIL(err, MS_ERR_OOM, "kv pool: reload: out of host memory");
            }
        }
    }
    if (!any) {
        pthread_mutex_unlock(&pool->mu);
        return MS_OK;
    }
    if (ms_grow((void **)&pool->acq, &pool->acq_cap, (size_t)need + 1, sizeof(int32_t)) != MS_OK) {
        pthread_mutex_unlock(&pool->mu);
        return MS_FAIL(err, MS_ERR_OOM, "kv pool: reload: out of host memory");
    }
    if (ms_page_arena_acquire(pool->cfg.arena, need, pool->acq) != MS_OK) {
        int32_t n_free = ms_page_arena_num_free(pool->cfg.arena);
        pthread_mutex_unlock(&pool->mu);
        return MS_FAIL(err, MS_ERR_CAPACITY,
                       "kv pool: reload: request %llu needs %d device pages, %d free",
                       (unsigned long long)rid, need, n_free);
    }
    /* Install the pages now (the streams stay offloaded until the copies are done). The pages
     * may have been released by a commit whose forward still runs: the copy stream waits for
     * the compute stream before writing them. */
    int32_t used = 0;
    ms_status st = MS_OK;
    if (need > 0 && pool->cfg.copy_stream != NULL) {
        st = ms_device_event_record(dev, pool->offload_event, pool->cfg.compute_stream, err);
        if (st == MS_OK)
            st = ms_device_stream_wait(dev, pool->cfg.copy_stream, pool->offload_event, err);
    }
    for (int l = 0; l < MS_MAX_LABELS; l++) {
        kv_stream *s = &r->streams[l];
        if (!s->exists || !s->offloaded)
            continue;
        MS_ASSERT(s->n_pages == 0);
        memcpy(s->pages, pool->acq + used, (size_t)s->n_host_pages * sizeof(int32_t));
        s->n_pages = s->n_host_pages;
        used += s->n_host_pages;
        if (st == MS_OK)
            st = ms_page_arena_copy_across(pool->cfg.host_arena, s->host_pages, pool->cfg.arena,
                                           s->pages, s->n_pages, MS_COPY_H2D,
                                           pool->cfg.copy_stream, err);
    }
    /* Compute must not read the pages before the copies land. */
    if (st == MS_OK && need > 0 && pool->cfg.copy_stream != NULL) {
        st = ms_device_event_record(dev, pool->reload_event, pool->cfg.copy_stream, err);
        if (st == MS_OK && pool->cfg.compute_stream != NULL)
            st = ms_device_stream_wait(dev, pool->cfg.compute_stream, pool->reload_event, err);
    }
    r->offload_running = true;
    r->busy++;
    pthread_mutex_unlock(&pool->mu);
    if (st == MS_OK)
        st = ms_device_synchronize(dev, pool->cfg.copy_stream, err);
    pthread_mutex_lock(&pool->mu);
    for (int l = 0; l < MS_MAX_LABELS; l++) {
        kv_stream *s = &r->streams[l];
        if (!s->exists || !s->offloaded)
            continue;
        if (st != MS_OK) {
            /* Undo: the request stays offloaded. */
            release_pages(pool->cfg.arena, s->pages, s->n_pages);
            s->n_pages = 0;
            continue;
        }
        release_pages(pool->cfg.host_arena, s->host_pages, s->n_host_pages);
        s->n_host_pages = 0;
        s->offloaded = false;
        s->generation++;
    }
    r->offload_running = false;
    r->busy--;
    r->last_active = ++pool->tick;
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    if (st != MS_OK)
        ms_error_prefix(err, "kv pool: reload of request %llu: ", (unsigned long long)rid);
    return st;
}

bool ms_kv_pool_is_offloaded(ms_kv_pool *pool, ms_rid rid) {
    pthread_mutex_lock(&pool->mu);
    kv_request *r = req_live(pool, rid);
    bool off = false;
    if (r != NULL) {
        off = r->offload_running;
        for (int l = 0; l < MS_MAX_LABELS && !off; l++)
            off = r->streams[l].exists && r->streams[l].offloaded;
    }
    pthread_mutex_unlock(&pool->mu);
    return off;
}

/* Device pages held by a request (0 when offloaded). Mutex held. */
static int32_t request_device_pages(const kv_request *r) {
    int32_t n = 0;
    for (int l = 0; l < MS_MAX_LABELS; l++) {
        if (r->streams[l].offloaded)
            return 0;
        n += r->streams[l].n_pages;
    }
    return n;
}

int32_t ms_kv_pool_reclaimable(ms_kv_pool *pool, ms_rid rid) {
    pthread_mutex_lock(&pool->mu);
    kv_request *r = req_live(pool, rid);
    int32_t n = r != NULL && !r->offload_running ? request_device_pages(r) : 0;
    pthread_mutex_unlock(&pool->mu);
    return n;
}

/* Whether `r` can be offloaded now. Mutex held. */
static bool offload_candidate(const kv_request *r) {
    if (r->removing || r->offload_running || request_device_pages(r) == 0)
        return false;
    for (int l = 0; l < MS_MAX_LABELS; l++)
        if (stream_in_flight(&r->streams[l]) || r->streams[l].read_pending)
            return false;
    return true;
}

int32_t ms_kv_pool_lru_candidates(ms_kv_pool *pool, ms_rid *out, int32_t max) {
    if (max <= 0)
        return 0;
    pthread_mutex_lock(&pool->mu);
    /* Insertion into a sorted prefix of `out`; ticks are unique per request update. */
    int32_t n = 0;
    uint64_t ticks[64];
    int32_t cap = MS_MIN(max, (int32_t)MS_ARRAY_LEN(ticks));
    for (size_t i = 0; i < pool->n_slots; i++) {
        kv_request *r = pool->table[i];
        if (r == NULL || !offload_candidate(r))
            continue;
        if (n == cap && r->last_active >= ticks[n - 1])
            continue;
        int32_t k = n < cap ? n++ : n - 1;
        while (k > 0 && (ticks[k - 1] > r->last_active ||
                         (ticks[k - 1] == r->last_active && out[k - 1] > r->rid))) {
            ticks[k] = ticks[k - 1];
            out[k] = out[k - 1];
            k--;
        }
        ticks[k] = r->last_active;
        out[k] = r->rid;
    }
    pthread_mutex_unlock(&pool->mu);
    return n;
}

uint64_t ms_kv_pool_last_active(ms_kv_pool *pool, ms_rid rid) {
    pthread_mutex_lock(&pool->mu);
    kv_request *r = req_live(pool, rid);
    uint64_t t = r != NULL ? r->last_active : 0;
    pthread_mutex_unlock(&pool->mu);
    return t;
}

/* ---- prefix caching ---- */

ms_status ms_kv_pool_adopt_prefix(ms_kv_pool *pool, ms_rid rid, ms_label label,
                                  const int32_t *pages, int32_t n, ms_error *err) {
    if (n < 0 || (n > 0 && pages == NULL))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "kv pool: request %llu: adopt of %d pages",
                       (unsigned long long)rid, n);
    pthread_mutex_lock(&pool->mu);
    kv_request *r = req_live(pool, rid);
    kv_stream *s = r != NULL ? stream_of(r, label) : NULL;
    ms_status st = MS_OK;
    if (r == NULL) {
        st = MS_FAIL(err, MS_ERR_NOT_FOUND, "kv pool: request %llu is not ingested",
                     (unsigned long long)rid);
    } else if (s == NULL) {
        st = MS_FAIL(err, MS_ERR_INVALID_ARG, "kv pool: request %llu: label %d out of range",
                     (unsigned long long)rid, (int)label);
    } else if ((s->exists && (s->stored > 0 || s->n_pages > 0)) || s->offloaded ||
               s->read_pending || stream_in_flight(s) || request_offloaded(r)) {
        st = MS_FAIL(err, MS_ERR_STATE,
                     "kv pool: request %llu label %d: a prefix can only be adopted by an empty "
                     "stream (it holds %d tokens in %d pages)",
                     (unsigned long long)rid, (int)label, s->stored, s->n_pages);
    } else if (n > 0) {
        for (int32_t i = 0; i < n && st == MS_OK; i++)
            if (pages[i] == MS_SINK_PAGE || ms_page_arena_owners(pool->cfg.arena, pages[i]) < 1)
                st = MS_FAIL(err, MS_ERR_INVALID_ARG,
                             "kv pool: request %llu: adopted page %d is free, the sink page or "
                             "out of range",
                             (unsigned long long)rid, pages[i]);
        if (st == MS_OK && stream_reserve(pool, s, n, NULL) != MS_OK)
            st = MS_FAIL(err, MS_ERR_OOM, "kv pool: out of host memory adopting %d pages", n);
        if (st == MS_OK) {
            memcpy(s->pages, pages, (size_t)n * sizeof(int32_t));
            s->n_pages = n;
            s->stored = n * pool->ps;
            s->released = 0;
            s->exists = true;
            s->generation++;
            r->last_active = ++pool->tick;
        }
    }
    pthread_mutex_unlock(&pool->mu);
    return st;
}

/* ---- fork across requests (n > 1 choices over one prompt) ---- */

ms_status ms_kv_pool_fork_stream(ms_kv_pool *pool, ms_rid src_rid, ms_rid dst_rid,
                                 ms_label label, int32_t n_tokens, ms_kv_fork_info *info,
                                 ms_error *err) {
    if (info != NULL)
        memset(info, 0, sizeof *info);
    if (n_tokens < 1 || src_rid == dst_rid)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "kv pool: fork of %d tokens from request %llu into request %llu",
                       n_tokens, (unsigned long long)src_rid, (unsigned long long)dst_rid);
    pthread_mutex_lock(&pool->mu);
    kv_request *src = req_live(pool, src_rid), *dst = req_live(pool, dst_rid);
    kv_stream *ss = src != NULL ? stream_of(src, label) : NULL;
    kv_stream *ds = dst != NULL ? stream_of(dst, label) : NULL;
    ms_status st = MS_OK;
    const int32_t ps = pool->ps, full = n_tokens / ps, part = n_tokens % ps != 0;
    int32_t copy = -1;
    if (src == NULL || dst == NULL) {
        st = MS_FAIL(err, MS_ERR_NOT_FOUND, "kv pool: fork: request %llu is not ingested",
                     (unsigned long long)(src == NULL ? src_rid : dst_rid));
    } else if (ss == NULL || ds == NULL) {
        st = MS_FAIL(err, MS_ERR_INVALID_ARG, "kv pool: fork: label %d out of range",
                     (int)label);
    } else if (!ss->exists || ss->stored < n_tokens || ss->released > 0 || ss->offloaded ||
               ss->read_pending || stream_in_flight(ss) || request_offloaded(src)) {
        st = MS_FAIL(err, MS_ERR_STATE,
                     "kv pool: fork: stream %d of request %llu cannot give %d tokens (it holds "
                     "%d, %d released%s)", (int)label, (unsigned long long)src_rid, n_tokens,
                     ss->exists ? ss->stored : 0, ss->released,
                     ss->offloaded || request_offloaded(src) ? ", offloaded"
                     : stream_in_flight(ss) || ss->read_pending ? ", a step or transfer in flight"
                                                                : "");
    } else if ((ds->exists && (ds->stored > 0 || ds->n_pages > 0)) || ds->offloaded ||
               ds->read_pending || stream_in_flight(ds) || request_offloaded(dst)) {
        st = MS_FAIL(err, MS_ERR_STATE,
                     "kv pool: fork: stream %d of request %llu is not empty (it holds %d tokens "
                     "in %d pages)", (int)label, (unsigned long long)dst_rid, ds->stored,
                     ds->n_pages);
    } else if (stream_reserve(pool, ds, full + part, NULL) != MS_OK) {
        st = MS_FAIL(err, MS_ERR_OOM, "kv pool: out of host memory forking %d pages",
                     full + part);
    } else if (part && ms_page_arena_acquire(pool->cfg.arena, 1, &copy) != MS_OK) {
        st = MS_FAIL(err, MS_ERR_CAPACITY,
                     "kv pool: fork into request %llu: no free page for the copy of the partial "
                     "page (raise kv_pages)", (unsigned long long)dst_rid);
    } else if ((st = ms_page_arena_retain(pool->cfg.arena, ss->pages, full, err)) != MS_OK) {
        if (copy >= 0)
            (void)ms_page_arena_release(pool->cfg.arena, &copy, 1, NULL);
    } else {
        /* the partial page is the only one either side writes into after the fork: the target
           gets its own copy, queued on the compute stream after the forward that wrote it */
        if (copy >= 0) {
            st = ms_page_arena_copy_pages(pool->cfg.arena, &ss->pages[full], &copy, 1,
                                          pool->cfg.compute_stream, err);
            if (st != MS_OK) {
                (void)ms_page_arena_release(pool->cfg.arena, ss->pages, full, NULL);
                (void)ms_page_arena_release(pool->cfg.arena, &copy, 1, NULL);
            }
        }
        if (st == MS_OK) {
            memcpy(ds->pages, ss->pages, (size_t)full * sizeof(int32_t));
            if (copy >= 0)
                ds->pages[full] = copy;
            ds->n_pages = full + part;
            ds->stored = n_tokens;
            ds->released = 0;
            ds->exists = true;
            ds->generation++;
            dst->last_active = ++pool->tick;
            if (info != NULL) {
                info->pages_shared = full;
                info->pages_copied = part;
            }
        }
    }
    pthread_mutex_unlock(&pool->mu);
    return st;
}

/* ---- inspection ---- */

ms_status ms_kv_pool_stream_info(ms_kv_pool *pool, ms_rid rid, ms_label label,
                                 ms_kv_stream_info *out) {
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&pool->mu);
    kv_request *r = req_live(pool, rid);
    kv_stream *s = r != NULL ? stream_of(r, label) : NULL;
    ms_status st = MS_ERR_NOT_FOUND;
    if (s != NULL && s->exists) {
        out->stored = s->stored;
        out->released = s->released;
        out->n_pages = s->n_pages;
        out->n_host_pages = s->n_host_pages;
        out->window = s->window;
        out->generation = s->generation;
        out->offloaded = s->offloaded;
        out->read_pending = s->read_pending;
        out->read_error = s->read_error;
        out->step_in_flight = stream_in_flight(s);
        st = MS_OK;
    }
    pthread_mutex_unlock(&pool->mu);
    return st;
}

int32_t ms_kv_pool_stream_pages(ms_kv_pool *pool, ms_rid rid, ms_label label, int32_t *out,
                                int32_t max) {
    pthread_mutex_lock(&pool->mu);
    kv_request *r = req_live(pool, rid);
    kv_stream *s = r != NULL ? stream_of(r, label) : NULL;
    int32_t n = -1;
    if (s != NULL && s->exists) {
        n = s->n_pages;
        if (out != NULL && max > 0 && n > 0)
            memcpy(out, s->pages, (size_t)MS_MIN(n, max) * sizeof(int32_t));
    }
    pthread_mutex_unlock(&pool->mu);
    return n;
}

bool ms_kv_pool_has_request(ms_kv_pool *pool, ms_rid rid) {
    pthread_mutex_lock(&pool->mu);
    bool has = req_live(pool, rid) != NULL;
    pthread_mutex_unlock(&pool->mu);
    return has;
}

int32_t ms_kv_pool_num_requests(ms_kv_pool *pool) {
    pthread_mutex_lock(&pool->mu);
    int32_t n = (int32_t)pool->n_requests;
    pthread_mutex_unlock(&pool->mu);
    return n;
}

ms_page_arena *ms_kv_pool_arena(const ms_kv_pool *pool) { return pool->cfg.arena; }

void ms_kv_pool_count_pages(ms_kv_pool *pool, int32_t *dev_counts, int32_t *host_counts) {
    pthread_mutex_lock(&pool->mu);
    for (size_t i = 0; i < pool->n_slots; i++) {
        kv_request *r = pool->table[i];
        if (r == NULL)
            continue;
        for (int l = 0; l < MS_MAX_LABELS; l++) {
            kv_stream *s = &r->streams[l];
            for (int32_t k = 0; k < s->n_pages; k++)
                dev_counts[s->pages[k]]++;
            if (host_counts != NULL)
                for (int32_t k = 0; k < s->n_host_pages; k++)
                    host_counts[s->host_pages[k]]++;
        }
    }
    pthread_mutex_unlock(&pool->mu);
}

ms_kv_pool_digest ms_kv_pool_allocation_digest(ms_kv_pool *pool) {
    ms_kv_pool_digest d = {0};
    pthread_mutex_lock(&pool->mu);
    for (size_t i = 0; i < pool->n_slots; i++) {
        kv_request *r = pool->table[i];
        if (r == NULL || r->removing)
            continue;
        XXH3_state_t st;
        XXH3_INITSTATE(&st);
        XXH3_128bits_reset(&st);
        uint64_t rid = (uint64_t)r->rid;
        XXH3_128bits_update(&st, &rid, sizeof rid);
        for (int l = 0; l < MS_MAX_LABELS; l++) {
            const kv_stream *s = &r->streams[l];
            if (!s->exists)
                continue;
            int32_t head[6] = {l, s->stored, s->released, s->n_pages, s->n_host_pages,
                               s->offloaded ? 1 : 0};
            XXH3_128bits_update(&st, head, sizeof head);
            if (s->n_pages > 0)
                XXH3_128bits_update(&st, s->pages, (size_t)s->n_pages * sizeof(int32_t));
            if (s->n_host_pages > 0)
                XXH3_128bits_update(&st, s->host_pages,
                                    (size_t)s->n_host_pages * sizeof(int32_t));
        }
        XXH128_hash_t h = XXH3_128bits_digest(&st);
        /* order-independent: the table's slot order depends on its growth history */
        d.lo += h.low64;
        d.hi += h.high64;
        d.n_requests++;
    }
    pthread_mutex_unlock(&pool->mu);
    d.n_free = ms_page_arena_num_free(pool->cfg.arena);
    d.n_host_free = pool->cfg.host_arena != NULL ? ms_page_arena_num_free(pool->cfg.host_arena) : 0;
    return d;
}

int64_t ms_kv_pool_admit_allocs(ms_kv_pool *pool) {
    pthread_mutex_lock(&pool->mu);
    int64_t n = pool->admit_allocs;
    pthread_mutex_unlock(&pool->mu);
    return n;
}

int64_t ms_kv_pool_plan_allocs(ms_kv_pool *pool) {
    pthread_mutex_lock(&pool->mu);
    int64_t n = pool->plan_allocs;
    pthread_mutex_unlock(&pool->mu);
    return n;
}

/* ---- resource interface ---- */

static ms_status res_ingest(void *self, ms_rid rid, const void *overrides, ms_error *err) {
    return ms_kv_pool_ingest(self, rid, overrides, err);
}
static void res_remove(void *self, ms_rid rid) { ms_kv_pool_remove(self, rid); }
static void res_reset(void *self, ms_rid rid, bool free_pages) {
    ms_kv_pool_reset(self, rid, free_pages);
}
static ms_admit_outcome res_admit(void *self, int index, const ms_step *step, ms_step_ctx *ctx) {
    ms_admit_outcome o = ms_kv_pool_admit(self, index, step, ctx);
    if (o.code != MS_ADMIT_OK)
        o.resource = index;
    return o;
}
static void res_admit_rollback(void *self, int index, const ms_step *step, ms_step_ctx *ctx) {
    ms_kv_pool_admit_rollback(self, index, step, ctx);
}
static ms_status res_plan(void *self, int index, const ms_step *step, ms_step_ctx *ctx,
                          const void **out, ms_error *err) {
    const ms_kv_plan_set *set = NULL;
    ms_status st = ms_kv_pool_plan(self, index, step, ctx, &set, err);
    *out = set;
    return st;
}
static ms_status res_commit(void *self, int index, const ms_step *step, ms_step_ctx *ctx,
                            ms_error *err) {
    return ms_kv_pool_commit(self, index, step, ctx, err);
}
static void res_free(void *self) { ms_kv_pool_free(self); }
/* Unknown request: nothing to publish (*out = NULL, MS_OK), as the runner's sweep expects. */
static ms_status res_publish(void *self, ms_rid rid, void **out, ms_error *err) {
    ms_kv_published *pub = NULL;
    ms_error e = {0};
    ms_status st = ms_kv_pool_publish(self, rid, &pub, &e);
    *out = pub;
    if (st == MS_ERR_NOT_FOUND)
        return MS_OK;
    if (st != MS_OK && err != NULL)
        *err = e;
    return st;
}
static void res_published_free(void *self, void *published) {
    (void)self;
    ms_kv_published_free(published);
}
static ms_admit_outcome res_admit_retrieve(void *self, ms_rid rid, const void *published) {
    if (published == NULL)
        return ms_admit_ok(); /* the producer held nothing for rid */
    return ms_kv_pool_admit_retrieve(self, rid, published);
}

static const ms_resource_i kv_pool_resource = {
    .kind = MS_RESOURCE_KV,
    .ingest = res_ingest,
    .remove = res_remove,
    .reset = res_reset,
    .admit = res_admit,
    .admit_rollback = res_admit_rollback,
    .plan = res_plan,
    .commit = res_commit,
    .free = res_free,
    .publish = res_publish,
    .published_free = res_published_free,
    .admit_retrieve = res_admit_retrieve,
};

const ms_resource_i *ms_kv_pool_resource_i(void) { return &kv_pool_resource; }
