/*
 * graph_plan.c - buckets, leases, static plan state with the sink tail, dummy rows and tagged
 * pre-plans for the captured path (see graph_plan.h for the rules and the hazards they close).
 *
 * Static states are allocated once per key while capturing and never move; staging only copies.
 * The pre-plan record and the slot counter are guarded by one mutex; a condition variable lets
 * take/abandon wait for a pre-plan still being planned.
 */
#include "graph_plan.h"

#include <pthread.h>
#include <string.h>

#define MAX_BUCKETS 64
#define MAX_ALIASES 32

typedef struct bucket {
    int32_t walk;
    int32_t bs;
    int32_t n_tokens;
    bool captured[MS_GRAPH_MAX_SLOTS]; /* capture of that slot succeeded */
    void *graph[MS_GRAPH_MAX_SLOTS];   /* handle by slot number (borrowed) */
} bucket;

typedef enum preplan_state { PREPLAN_NONE = 0, PREPLAN_STAGING, PREPLAN_READY } preplan_state;

struct ms_graph_plan {
    ms_graph_plan_config cfg;
    int32_t n_buckets;
    bucket buckets[MAX_BUCKETS];
    int32_t n_aliases;
    int32_t alias_from[MAX_ALIASES];
    int32_t alias_to[MAX_ALIASES];
    int32_t max_bs;                /* largest bucket rows */
    int32_t max_tokens;            /* largest bucket tokens */
    int32_t dummy_bs;              /* rows per slot in the dummy pool once ingested, else 0 */
    /* static states (pointers are stable) */
    ms_graph_kv_state **kv_states;
    size_t n_kv_states, cap_kv_states;
    ms_graph_pos_state **pos_states;
    size_t n_pos_states, cap_pos_states;
    /* leases and pre-plan (shared with the plan thread) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t next_slot;             /* the one slot counter (F2) */
    uint64_t next_serial;
    preplan_state pp_state;
    ms_slot_lease pp_lease;
    uint64_t pp_hash;
    ms_rid *pp_rids;               /* [pp_n] copy of the batch rows */
    int32_t pp_n;
    size_t pp_cap;
};

/* ---- init / free ---- */

ms_status ms_graph_plan_init(ms_graph_plan **out, const ms_graph_plan_config *cfg, ms_error *err) {
    *out = NULL;
    if (cfg->n_slots < 1 || cfg->n_slots > MS_GRAPH_MAX_SLOTS)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "graph plan: n_slots %d (expected 1..%d)",
                       cfg->n_slots, MS_GRAPH_MAX_SLOTS);
    if (cfg->dummy_base < MS_RID_DUMMY_BASE)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "graph plan: dummy_base %llu is below MS_RID_DUMMY_BASE",
                       (unsigned long long)cfg->dummy_base);
    ms_graph_plan *g = ms_calloc(1, sizeof *g);
    if (g == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "graph plan: out of memory");
    g->cfg = *cfg;
    g->next_serial = 1;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    *out = g;
    return MS_OK;
}

void ms_graph_plan_free(ms_graph_plan *g) {
    if (g == NULL)
        return;
    for (size_t i = 0; i < g->n_kv_states; i++) {
        ms_free(g->kv_states[i]->token_to_page);
        ms_free(g->kv_states[i]->token_to_slot);
        ms_free(g->kv_states[i]);
    }
    for (size_t i = 0; i < g->n_pos_states; i++) {
        ms_free(g->pos_states[i]->ids);
        ms_free(g->pos_states[i]);
    }
    ms_free(g->kv_states);
    ms_free(g->pos_states);
    ms_free(g->pp_rids);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    ms_free(g);
}

/* ---- buckets ---- */

static int32_t resolve_walk(const ms_graph_plan *g, int32_t walk) {
    for (int32_t a = 0; a < g->n_aliases; a++)
        if (g->alias_from[a] == walk)
            return g->alias_to[a];
    return walk;
}

ms_status ms_graph_plan_add_bucket(ms_graph_plan *g, int32_t walk, int32_t bs, int32_t n_tokens,
                                   int32_t *index, ms_error *err) {
    if (walk < 0 || bs < 1 || n_tokens < bs)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "graph plan: bucket walk %d bs %d tokens %d (need walk >= 0, "
                       "1 <= bs <= tokens)",
                       walk, bs, n_tokens);
    if (resolve_walk(g, walk) != walk)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "graph plan: walk %d is a replay alias", walk);
    for (int32_t b = 0; b < g->n_buckets; b++)
        if (g->buckets[b].walk == walk && g->buckets[b].bs == bs &&
            g->buckets[b].n_tokens == n_tokens)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "graph plan: duplicate bucket walk %d bs %d tokens %d", walk, bs,
                           n_tokens);
    if (g->n_buckets == MAX_BUCKETS)
        return MS_FAIL(err, MS_ERR_LIMIT, "graph plan: more than %d buckets", MAX_BUCKETS);
    if (g->dummy_bs != 0 && bs > g->dummy_bs)
        return MS_FAIL(err, MS_ERR_STATE,
                       "graph plan: bucket bs %d exceeds the dummy pool (%d rows) already "
                       "ingested; declare buckets before ingesting dummy rows",
                       bs, g->dummy_bs);
    bucket *bk = &g->buckets[g->n_buckets];
    memset(bk, 0, sizeof *bk);
    bk->walk = walk;
    bk->bs = bs;
    bk->n_tokens = n_tokens;
    g->max_bs = MS_MAX(g->max_bs, bs);
    g->max_tokens = MS_MAX(g->max_tokens, n_tokens);
    *index = g->n_buckets++;
    return MS_OK;
}

ms_status ms_graph_plan_add_alias(ms_graph_plan *g, int32_t alias, int32_t capture_walk,
                                  ms_error *err) {
    for (int32_t b = 0; b < g->n_buckets; b++)
        if (g->buckets[b].walk == alias)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "graph plan: walk %d has its own buckets; it cannot be an alias",
                           alias);
    if (resolve_walk(g, alias) != alias || alias == capture_walk)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "graph plan: walk %d is already an alias",
                       alias);
    if (g->n_aliases == MAX_ALIASES)
        return MS_FAIL(err, MS_ERR_LIMIT, "graph plan: more than %d aliases", MAX_ALIASES);
    g->alias_from[g->n_aliases] = alias;
    g->alias_to[g->n_aliases] = resolve_walk(g, capture_walk);
    g->n_aliases++;
    return MS_OK;
}

int32_t ms_graph_plan_max_bs(const ms_graph_plan *g) { return g->max_bs; }
int32_t ms_graph_plan_max_tokens(const ms_graph_plan *g) { return g->max_tokens; }

static ms_slot_lease lease_of(const ms_graph_plan *g, int32_t b, int32_t slot, uint64_t serial) {
    const bucket *bk = &g->buckets[b];
    ms_slot_lease l = {slot, b, bk->walk, bk->bs, bk->n_tokens, serial};
    return l;
}

static ms_status check_bucket_slot(const ms_graph_plan *g, int32_t b, int32_t slot,
                                   ms_error *err) {
    if (b < 0 || b >= g->n_buckets || slot < 0 || slot >= g->cfg.n_slots)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "graph plan: no bucket %d slot %d", b, slot);
    return MS_OK;
}

ms_status ms_graph_plan_capture_lease(const ms_graph_plan *g, int32_t b, int32_t slot,
                                      ms_slot_lease *out, ms_error *err) {
    MS_TRY(check_bucket_slot(g, b, slot, err));
    *out = lease_of(g, b, slot, 0);
    return MS_OK;
}

ms_status ms_graph_plan_set_captured(ms_graph_plan *g, int32_t b, int32_t slot, bool ok,
                                     void *graph, ms_error *err) {
    MS_TRY(check_bucket_slot(g, b, slot, err));
    g->buckets[b].captured[slot] = ok;
    g->buckets[b].graph[slot] = ok ? graph : NULL;
    return MS_OK;
}

void *ms_graph_plan_graph(const ms_graph_plan *g, const ms_slot_lease *lease) {
    if (lease->bucket < 0 || lease->bucket >= g->n_buckets || lease->slot < 0 ||
        lease->slot >= g->cfg.n_slots)
        return NULL;
    return g->buckets[lease->bucket].graph[lease->slot];
}

/* Tightest bucket for (walk, bs, tokens) with `slot` captured (slot < 0: any slot). */
static int32_t tightest(const ms_graph_plan *g, int32_t walk, int32_t bs, int32_t n_tokens,
                        int32_t slot) {
    int32_t w = resolve_walk(g, walk);
    int32_t best = -1;
    for (int32_t b = 0; b < g->n_buckets; b++) {
        const bucket *bk = &g->buckets[b];
        if (bk->walk != w || bk->bs < bs || bk->n_tokens < n_tokens)
            continue;
        bool ok = false;
        for (int32_t s = 0; s < g->cfg.n_slots; s++)
            ok = ok || (bk->captured[s] && (slot < 0 || s == slot));
        if (!ok)
            continue;
        if (best < 0 || bk->n_tokens < g->buckets[best].n_tokens ||
            (bk->n_tokens == g->buckets[best].n_tokens && bk->bs < g->buckets[best].bs))
            best = b;
    }
    return best;
}

ms_status ms_graph_plan_select(const ms_graph_plan *g, int32_t walk, int32_t bs, int32_t n_tokens,
                               int32_t *out, ms_error *err) {
    int32_t b = tightest(g, walk, bs, n_tokens, -1);
    if (b < 0)
        return MS_FAIL(err, MS_ERR_NOT_FOUND,
                       "graph plan: no captured bucket for walk %d with bs >= %d and tokens >= %d",
                       walk, bs, n_tokens);
    *out = b;
    return MS_OK;
}

ms_status ms_graph_plan_lease(ms_graph_plan *g, int32_t walk, int32_t bs, int32_t n_tokens,
                              ms_slot_lease *out, ms_error *err) {
    pthread_mutex_lock(&g->mu);
    int32_t slot = g->next_slot;
    int32_t b = tightest(g, walk, bs, n_tokens, slot);
    if (b < 0) {
        pthread_mutex_unlock(&g->mu);
        return MS_FAIL(err, MS_ERR_NOT_FOUND,
                       "graph plan: no bucket for walk %d (bs >= %d, tokens >= %d) captured on "
                       "slot %d",
                       walk, bs, n_tokens, slot);
    }
    g->next_slot = (slot + 1) % g->cfg.n_slots;
    *out = lease_of(g, b, slot, g->next_serial++);
    pthread_mutex_unlock(&g->mu);
    return MS_OK;
}

/* ---- static plan state ---- */

static ms_graph_kv_state *find_kv(const ms_graph_plan *g, int res, int32_t slot, ms_label label) {
    for (size_t i = 0; i < g->n_kv_states; i++) {
        ms_graph_kv_state *s = g->kv_states[i];
        if (s->kv_resource == res && s->slot == slot && s->label == label)
            return s;
    }
    return NULL;
}

static ms_graph_pos_state *find_pos(const ms_graph_plan *g, int res, int32_t slot,
                                    ms_label label) {
    for (size_t i = 0; i < g->n_pos_states; i++) {
        ms_graph_pos_state *s = g->pos_states[i];
        if (s->pos_resource == res && s->slot == slot && s->label == label)
            return s;
    }
    return NULL;
}

const ms_graph_kv_state *ms_graph_plan_kv_state(const ms_graph_plan *g, int kv_resource,
                                                int32_t slot, ms_label label) {
    return find_kv(g, kv_resource, slot, label);
}

const ms_graph_pos_state *ms_graph_plan_pos_state(const ms_graph_plan *g, int pos_resource,
                                                  int32_t slot, ms_label label) {
    return find_pos(g, pos_resource, slot, label);
}

static ms_status new_kv_state(ms_graph_plan *g, int res, int32_t slot, ms_label label,
                              ms_graph_kv_state **out, ms_error *err) {
    if (ms_grow((void **)&g->kv_states, &g->cap_kv_states, g->n_kv_states + 1,
                sizeof *g->kv_states) != MS_OK)
        return MS_FAIL(err, MS_ERR_OOM, "graph plan: out of memory for static KV state");
    ms_graph_kv_state *s = ms_calloc(1, sizeof *s);
    int32_t cap = g->max_tokens;
    int32_t *pages = ms_calloc((size_t)cap, sizeof *pages);
    int32_t *slots = ms_calloc((size_t)cap, sizeof *slots);
    if (s == NULL || pages == NULL || slots == NULL) {
        ms_free(s);
        ms_free(pages);
        ms_free(slots);
        return MS_FAIL(err, MS_ERR_OOM,
                       "graph plan: out of memory for static KV state of %d tokens", cap);
    }
    *s = (ms_graph_kv_state){res, slot, label, cap, 0, pages, slots, 0};
    for (int32_t t = 0; t < cap; t++)
        pages[t] = MS_SINK_PAGE;
    g->kv_states[g->n_kv_states++] = s;
    *out = s;
    return MS_OK;
}

ms_status ms_graph_plan_stage_kv(ms_graph_plan *g, const ms_slot_lease *lease, int kv_resource,
                                 const ms_kv_plan_set *set, bool capture, ms_error *err) {
    MS_TRY(check_bucket_slot(g, lease->bucket, lease->slot, err));
    /* validate every plan before touching any state */
    for (int32_t p = 0; p < set->n_plans; p++) {
        const ms_kv_plan *kp = &set->plans[p];
        if (kp->n_tokens > lease->n_tokens)
            return MS_FAIL(err, MS_ERR_CAPACITY,
                           "graph plan: label %d has %d tokens, bucket holds %d", kp->plan_label,
                           kp->n_tokens, lease->n_tokens);
        const ms_graph_kv_state *s = find_kv(g, kv_resource, lease->slot, kp->plan_label);
        if (!capture && s == NULL)
            return MS_FAIL(err, MS_ERR_STATE,
                           "graph plan: replay stages KV resource %d slot %d label %d, which "
                           "the capture never created",
                           kv_resource, lease->slot, kp->plan_label);
        if (s != NULL && kp->n_tokens > s->capacity)
            return MS_FAIL(err, MS_ERR_CAPACITY,
                           "graph plan: static KV state of label %d holds %d tokens, step has %d "
                           "(declare every bucket before capturing)",
                           kp->plan_label, s->capacity, kp->n_tokens);
    }
    for (int32_t p = 0; p < set->n_plans; p++) {
        const ms_kv_plan *kp = &set->plans[p];
        ms_graph_kv_state *s = find_kv(g, kv_resource, lease->slot, kp->plan_label);
        if (s == NULL)
            MS_TRY(new_kv_state(g, kv_resource, lease->slot, kp->plan_label, &s, err));
        int32_t n = kp->n_tokens;
        MS_ASSERT(n <= s->capacity);
        memcpy(s->token_to_page, kp->token_to_page, (size_t)n * sizeof(int32_t));
        memcpy(s->token_to_slot, kp->token_to_slot, (size_t)n * sizeof(int32_t));
        /* F1: every staging neutralises the tail, whatever the previous step left there */
        for (int32_t t = n; t < s->capacity; t++) {
            s->token_to_page[t] = MS_SINK_PAGE;
            s->token_to_slot[t] = 0;
        }
        s->n_tokens = n;
        s->n_stagings++;
    }
    return MS_OK;
}

ms_status ms_graph_plan_stage_positions(ms_graph_plan *g, const ms_slot_lease *lease,
                                        int pos_resource, const ms_pos_plan *plan, bool capture,
                                        ms_error *err) {
    MS_TRY(check_bucket_slot(g, lease->bucket, lease->slot, err));
    for (int32_t p = 0; p < plan->n_plans; p++) {
        int32_t n = plan->offsets[p + 1] - plan->offsets[p];
        if (n > lease->n_tokens)
            return MS_FAIL(err, MS_ERR_CAPACITY,
                           "graph plan: positions of label %d have %d tokens, bucket holds %d",
                           plan->plan_labels[p], n, lease->n_tokens);
        ms_graph_pos_state *s = find_pos(g, pos_resource, lease->slot, plan->plan_labels[p]);
        if (!capture && s == NULL)
            return MS_FAIL(err, MS_ERR_STATE,
                           "graph plan: replay stages positions resource %d slot %d label %d, "
                           "which the capture never created",
                           pos_resource, lease->slot, plan->plan_labels[p]);
        if (s != NULL && n > s->capacity)
            return MS_FAIL(err, MS_ERR_CAPACITY,
                           "graph plan: static positions of label %d hold %d tokens, step has %d",
                           plan->plan_labels[p], s->capacity, n);
        if (s != NULL && s->n_axes != plan->n_axes)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "graph plan: positions axes changed");
    }
    for (int32_t p = 0; p < plan->n_plans; p++) {
        ms_label label = plan->plan_labels[p];
        ms_graph_pos_state *s = find_pos(g, pos_resource, lease->slot, label);
        if (s == NULL) {
            if (ms_grow((void **)&g->pos_states, &g->cap_pos_states, g->n_pos_states + 1,
                        sizeof *g->pos_states) != MS_OK)
                return MS_FAIL(err, MS_ERR_OOM, "graph plan: out of memory");
            s = ms_calloc(1, sizeof *s);
            int32_t *ids = ms_calloc((size_t)plan->n_axes * (size_t)g->max_tokens, sizeof *ids);
            if (s == NULL || ids == NULL) {
                ms_free(s);
                ms_free(ids);
                return MS_FAIL(err, MS_ERR_OOM, "graph plan: out of memory for position ids");
            }
            *s = (ms_graph_pos_state){pos_resource, lease->slot, label, g->max_tokens,
                                      plan->n_axes, 0, ids};
            g->pos_states[g->n_pos_states++] = s;
        }
        int32_t n = plan->offsets[p + 1] - plan->offsets[p];
        for (int32_t a = 0; a < plan->n_axes; a++) {
            int32_t *dst = s->ids + (size_t)a * (size_t)s->capacity;
            const int32_t *src =
                plan->ids + (size_t)a * (size_t)plan->n_tokens + (size_t)plan->offsets[p];
            memcpy(dst, src, (size_t)n * sizeof *dst);
            memset(dst + n, 0, (size_t)(s->capacity - n) * sizeof *dst);
        }
        s->n_tokens = n;
    }
    return MS_OK;
}

ms_status ms_graph_plan_stage_step(ms_graph_plan *g, const ms_step_runner *runner,
                                   const ms_step_ctx *ctx, ms_error *err) {
    if (ctx->lease == NULL)
        return MS_FAIL(err, MS_ERR_STATE, "graph plan: staging needs a slot lease");
    int n = ms_step_runner_count(runner);
    for (int i = 0; i < n; i++) {
        const void *res = ctx->plan_results[i];
        if (res == NULL)
            continue;
        ms_resource_kind kind = ms_step_runner_kind(runner, i);
        if (kind == MS_RESOURCE_KV)
            MS_TRY(ms_graph_plan_stage_kv(g, ctx->lease, i, res, ctx->capture, err));
        else if (kind == MS_RESOURCE_POS)
            MS_TRY(ms_graph_plan_stage_positions(g, ctx->lease, i, res, ctx->capture, err));
    }
    return MS_OK;
}

/* ---- dummy rows ---- */

ms_rid ms_graph_plan_dummy_rid(const ms_graph_plan *g, int32_t slot, int32_t i) {
    MS_ASSERT(slot >= 0 && slot < g->cfg.n_slots && i >= 0 && i < g->max_bs);
    return g->cfg.dummy_base + (ms_rid)slot * (ms_rid)g->max_bs + (ms_rid)i;
}

bool ms_graph_plan_is_dummy(const ms_graph_plan *g, ms_rid rid) {
    return rid >= g->cfg.dummy_base &&
           rid - g->cfg.dummy_base < (ms_rid)g->cfg.n_slots * (ms_rid)g->max_bs;
}

ms_status ms_graph_plan_ingest_dummies(ms_graph_plan *g, ms_step_runner *runner, ms_error *err) {
    if (g->dummy_bs != 0)
        return MS_OK;
    if (g->max_bs == 0)
        return MS_FAIL(err, MS_ERR_STATE, "graph plan: no buckets declared");
    for (int32_t s = 0; s < g->cfg.n_slots; s++)
        for (int32_t i = 0; i < g->max_bs; i++)
            MS_TRY(ms_step_runner_ingest(runner, ms_graph_plan_dummy_rid(g, s, i), NULL, err));
    g->dummy_bs = g->max_bs;
    return MS_OK;
}

void ms_graph_plan_remove_dummies(ms_graph_plan *g, ms_step_runner *runner) {
    if (g->max_bs == 0)
        return;
    for (int32_t s = 0; s < g->cfg.n_slots; s++)
        for (int32_t i = 0; i < g->max_bs; i++)
            ms_step_runner_remove(runner, ms_graph_plan_dummy_rid(g, s, i));
    g->dummy_bs = 0;
}

ms_status ms_graph_plan_step_ids(const ms_graph_plan *g, const ms_slot_lease *lease,
                                 const ms_rid *real, int32_t n_real, ms_rid *out, int32_t cap,
                                 int32_t *n_out, ms_error *err) {
    if (n_real < 0 || n_real > lease->bs)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "graph plan: %d real rows for a bucket of %d",
                       n_real, lease->bs);
    if (cap < lease->bs)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "graph plan: room for %d rows, bucket has %d",
                       cap, lease->bs);
    for (int32_t i = 0; i < n_real; i++) {
        if (real[i] >= MS_RID_DUMMY_BASE)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "graph plan: real request id %llu is in the dummy range",
                           (unsigned long long)real[i]);
        out[i] = real[i];
    }
    for (int32_t i = n_real; i < lease->bs; i++)
        out[i] = ms_graph_plan_dummy_rid(g, lease->slot, i);
    *n_out = lease->bs;
    return MS_OK;
}

void ms_graph_plan_release(ms_graph_plan *g, ms_step_runner *runner, const ms_slot_lease *lease,
                           int32_t n_real) {
    for (int32_t i = MS_MAX(n_real, 0); i < lease->bs; i++)
        ms_step_runner_reset(runner, ms_graph_plan_dummy_rid(g, lease->slot, i), false);
}

/* ---- tagged pre-plan ---- */

static uint64_t fnv(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= UINT64_C(0x100000001b3);
    }
    return h;
}

static uint64_t hash_segments(uint64_t h, const ms_segment *segs, int32_t n) {
    h = fnv(h, &n, sizeof n);
    for (int32_t i = 0; i < n; i++) {
        h = fnv(h, &segs[i].rid, sizeof segs[i].rid);
        h = fnv(h, &segs[i].label, sizeof segs[i].label);
        h = fnv(h, &segs[i].span, sizeof segs[i].span);
    }
    return h;
}

uint64_t ms_step_hash(const ms_step *step) {
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    if (step->name != NULL)
        h = fnv(h, step->name, strlen(step->name));
    h = hash_segments(h, step->segments, step->n_segments);
    for (int i = 0; i < MS_MAX_RESOURCES; i++) {
        unsigned char present = step->records[i].rec != NULL;
        h = fnv(h, &present, 1);
        if (present && step->records[i].segments != NULL)
            h = hash_segments(h, step->records[i].segments, step->records[i].n_segments);
    }
    return h;
}

ms_status ms_graph_plan_preplan_begin(ms_graph_plan *g, const ms_slot_lease *lease,
                                      const ms_rid *rids, int32_t n, uint64_t step_hash,
                                      ms_error *err) {
    if (n < 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "graph plan: %d pre-plan rows", n);
    pthread_mutex_lock(&g->mu);
    if (g->pp_state != PREPLAN_NONE) {
        pthread_mutex_unlock(&g->mu);
        return MS_FAIL(err, MS_ERR_STATE, "graph plan: a pre-plan is already staged");
    }
    if (ms_grow((void **)&g->pp_rids, &g->pp_cap, (size_t)n + 1, sizeof *g->pp_rids) != MS_OK) {
        pthread_mutex_unlock(&g->mu);
        return MS_FAIL(err, MS_ERR_OOM, "graph plan: out of memory for a pre-plan tag");
    }
    if (n > 0)
        memcpy(g->pp_rids, rids, (size_t)n * sizeof *rids);
    g->pp_n = n;
    g->pp_lease = *lease;
    g->pp_hash = step_hash;
    g->pp_state = PREPLAN_STAGING;
    pthread_mutex_unlock(&g->mu);
    return MS_OK;
}

void ms_graph_plan_preplan_finish(ms_graph_plan *g, bool ok) {
    pthread_mutex_lock(&g->mu);
    MS_ASSERT(g->pp_state == PREPLAN_STAGING);
    g->pp_state = ok ? PREPLAN_READY : PREPLAN_NONE;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static bool tag_matches(const ms_graph_plan *g, const ms_slot_lease *lease, const ms_rid *rids,
                        int32_t n, uint64_t step_hash) {
    if (g->pp_lease.serial != lease->serial || g->pp_lease.slot != lease->slot ||
        g->pp_lease.bucket != lease->bucket || g->pp_hash != step_hash || g->pp_n != n)
        return false;
    return n == 0 || memcmp(g->pp_rids, rids, (size_t)n * sizeof *rids) == 0;
}

ms_status ms_graph_plan_preplan_take(ms_graph_plan *g, const ms_slot_lease *lease,
                                     const ms_rid *rids, int32_t n, uint64_t step_hash,
                                     ms_error *err) {
    pthread_mutex_lock(&g->mu);
    while (g->pp_state == PREPLAN_STAGING)
        pthread_cond_wait(&g->cv, &g->mu);
    ms_status st = MS_OK;
    if (g->pp_state == PREPLAN_NONE) {
        st = MS_FAIL(err, MS_ERR_NOT_FOUND, "graph plan: no pre-plan staged");
    } else if (!tag_matches(g, lease, rids, n, step_hash)) {
        st = MS_FAIL(err, MS_ERR_STATE,
                     "graph plan: the staged pre-plan (lease %llu, %d rows) was made for another "
                     "batch (lease %llu, %d rows); abandon it",
                     (unsigned long long)g->pp_lease.serial, g->pp_n,
                     (unsigned long long)lease->serial, n);
    } else {
        g->pp_state = PREPLAN_NONE;
    }
    pthread_mutex_unlock(&g->mu);
    return st;
}

bool ms_graph_plan_preplan_abandon(ms_graph_plan *g) {
    pthread_mutex_lock(&g->mu);
    while (g->pp_state == PREPLAN_STAGING)
        pthread_cond_wait(&g->cv, &g->mu);
    bool had = g->pp_state == PREPLAN_READY;
    g->pp_state = PREPLAN_NONE;
    pthread_mutex_unlock(&g->mu);
    return had;
}

bool ms_graph_plan_preplan_pending(ms_graph_plan *g) {
    pthread_mutex_lock(&g->mu);
    bool p = g->pp_state != PREPLAN_NONE;
    pthread_mutex_unlock(&g->mu);
    return p;
}
