/*
 * cross_attn.c - cross-attention planning: write-once context, query packing, sink-page rows for
 * empty contexts, plan buffers per key with change detection (see cross_attn.h).
 *
 * Plan builds the arrays into a scratch set sized at init, then compares them with the key's
 * buffers; only a difference is copied (and counted as a re-plan). Plan allocates nothing except
 * the first time a key is seen.
 */
#include "cross_attn.h"

#include <string.h>

#include "rid_map.h"

typedef struct cross_req {
    bool written; /* context stream written by a committed step */
} cross_req;

struct ms_cross {
    ms_cross_config cfg;
    int context_kv;
    int query_kv;                  /* -1: own segments */
    ms_rid_map reqs;               /* rid -> cross_req */
    ms_cross_buffers **buffers;    /* stable addresses */
    size_t n_buffers, cap_buffers;
    /* scratch for one plan label */
    int32_t *qo, *kvp, *ind, *last; /* [max_rows+1], [max_rows+1], [max_pages], [max_rows] */
    ms_cross_plan_set result;
};

/* ---- lifecycle ---- */

ms_status ms_cross_init(ms_cross **out, const ms_cross_config *cfg, int context_kv, int query_kv,
                        ms_error *err) {
    *out = NULL;
    if (cfg->max_rows < 1 || cfg->max_pages < 1)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "cross: max_rows %d, max_pages %d (need >= 1)",
                       cfg->max_rows, cfg->max_pages);
    if (cfg->context_label < 0 || cfg->context_label >= MS_MAX_LABELS)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "cross: context label %d out of range",
                       cfg->context_label);
    if (context_kv < 0 || context_kv >= MS_MAX_RESOURCES || query_kv < -1 ||
        query_kv >= MS_MAX_RESOURCES)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "cross: bad KV resource indices %d, %d",
                       context_kv, query_kv);
    ms_cross *c = ms_calloc(1, sizeof *c);
    size_t rows = (size_t)cfg->max_rows;
    if (c != NULL) {
        c->qo = ms_calloc(rows + 1, sizeof(int32_t));
        c->kvp = ms_calloc(rows + 1, sizeof(int32_t));
        c->ind = ms_calloc((size_t)cfg->max_pages, sizeof(int32_t));
        c->last = ms_calloc(rows, sizeof(int32_t));
    }
    if (c == NULL || c->qo == NULL || c->kvp == NULL || c->ind == NULL || c->last == NULL) {
        if (c != NULL) {
            ms_free(c->qo);
            ms_free(c->kvp);
            ms_free(c->ind);
            ms_free(c->last);
        }
        ms_free(c);
        return MS_FAIL(err, MS_ERR_OOM, "cross: out of memory for %d rows, %d pages",
                       cfg->max_rows, cfg->max_pages);
    }
    c->cfg = *cfg;
    c->cfg.context_kv_key = NULL;
    c->cfg.query_kv_key = NULL;
    c->context_kv = context_kv;
    c->query_kv = query_kv;
    ms_rid_map_init(&c->reqs, sizeof(cross_req));
    *out = c;
    return MS_OK;
}

static void buffers_free(ms_cross_buffers *b) {
    if (b == NULL)
        return;
    ms_free(b->qo_indptr);
    ms_free(b->kv_indptr);
    ms_free(b->kv_indices);
    ms_free(b->kv_last_page_len);
    ms_free(b);
}

void ms_cross_free(ms_cross *c) {
    if (c == NULL)
        return;
    for (size_t i = 0; i < c->n_buffers; i++)
        buffers_free(c->buffers[i]);
    ms_free(c->buffers);
    ms_rid_map_free(&c->reqs);
    ms_free(c->qo);
    ms_free(c->kvp);
    ms_free(c->ind);
    ms_free(c->last);
    ms_free(c);
}

ms_status ms_cross_context_written(const ms_cross *c, ms_rid rid, bool *out, ms_error *err) {
    const cross_req *r = ms_rid_map_get(&c->reqs, rid);
    if (r == NULL)
        return MS_FAIL(err, MS_ERR_NOT_FOUND, "cross: request %llu not ingested",
                       (unsigned long long)rid);
    *out = r->written;
    return MS_OK;
}

/* ---- admit / commit: write once ---- */

static ms_admit_outcome cross_admit(ms_cross *c, const ms_step *step) {
    int32_t n;
    const ms_segment *segs = ms_step_segments(step, c->context_kv, &n);
    ms_admit_outcome o = ms_admit_ok();
    for (int32_t i = 0; i < n; i++) {
        if (segs[i].label != c->cfg.context_label)
            continue;
        const cross_req *r = ms_rid_map_get(&c->reqs, segs[i].rid);
        if (r == NULL || (segs[i].span > 0 && r->written)) {
            o.code = MS_ADMIT_INVALID; /* unknown request, or a second write of the context */
            o.rid = segs[i].rid;
            o.label = segs[i].label;
            return o;
        }
    }
    return o;
}

static ms_status cross_commit(ms_cross *c, const ms_step *step, const ms_step_ctx *ctx,
                              ms_error *err) {
    const ms_kv_plan_set *set = ctx->plan_results[c->context_kv];
    if (set == NULL)
        return MS_FAIL(err, MS_ERR_STATE,
                       "cross: commit needs the context KV plan of resource %d", c->context_kv);
    if (!set->commit)
        return MS_OK;
    int32_t n;
    const ms_segment *segs = ms_step_segments(step, c->context_kv, &n);
    for (int32_t i = 0; i < n; i++) {
        if (segs[i].label != c->cfg.context_label || segs[i].span == 0)
            continue;
        cross_req *r = ms_rid_map_get(&c->reqs, segs[i].rid);
        if (r != NULL)
            r->written = true;
    }
    return MS_OK;
}

/* ---- plan ---- */

static ms_cross_buffers *find_buffers(const ms_cross *c, int32_t bucket, int32_t slot,
                                      ms_label label) {
    for (size_t i = 0; i < c->n_buffers; i++) {
        ms_cross_buffers *b = c->buffers[i];
        if (b->bucket == bucket && b->slot == slot && b->plan_label == label)
            return b;
    }
    return NULL;
}

static ms_status new_buffers(ms_cross *c, int32_t bucket, int32_t slot, ms_label label,
                             ms_cross_buffers **out, ms_error *err) {
    if (ms_grow((void **)&c->buffers, &c->cap_buffers, c->n_buffers + 1, sizeof *c->buffers) !=
        MS_OK)
        return MS_FAIL(err, MS_ERR_OOM, "cross: out of memory for plan buffers");
    size_t rows = (size_t)c->cfg.max_rows;
    ms_cross_buffers *b = ms_calloc(1, sizeof *b);
    if (b != NULL) {
        b->qo_indptr = ms_calloc(rows + 1, sizeof(int32_t));
        b->kv_indptr = ms_calloc(rows + 1, sizeof(int32_t));
        b->kv_indices = ms_calloc((size_t)c->cfg.max_pages, sizeof(int32_t));
        b->kv_last_page_len = ms_calloc(rows, sizeof(int32_t));
    }
    if (b == NULL || b->qo_indptr == NULL || b->kv_indptr == NULL || b->kv_indices == NULL ||
        b->kv_last_page_len == NULL) {
        buffers_free(b);
        return MS_FAIL(err, MS_ERR_OOM, "cross: out of memory for plan buffers");
    }
    b->plan_label = label;
    b->bucket = bucket;
    b->slot = slot;
    b->n_rows = -1; /* never planned: the first plan always counts as a change */
    c->buffers[c->n_buffers++] = b;
    *out = b;
    return MS_OK;
}

/* Context view of rid in the context plan, or NULL. `hint` is tried first (same batch order). */
static const ms_kv_view *context_view(const ms_kv_plan *ctxp, ms_rid rid, int32_t hint) {
    if (ctxp == NULL)
        return NULL;
    if (hint >= 0 && hint < ctxp->n_views && ctxp->views[hint].rid == rid)
        return &ctxp->views[hint];
    for (int32_t v = 0; v < ctxp->n_views; v++)
        if (ctxp->views[v].rid == rid)
            return &ctxp->views[v];
    return NULL;
}

/* Query rows of one plan label: rid and query tokens of row r. */
typedef struct query_rows {
    ms_label plan_label;
    int32_t n;
    const ms_kv_view *views;  /* from a query KV plan, or NULL */
    const ms_segment *segs;   /* own segments (label filter below), or NULL */
    int32_t n_segs;
} query_rows;

static ms_status build_arrays(ms_cross *c, const query_rows *q, const ms_kv_plan *ctxp,
                              int32_t page_size, int32_t *n_rows, ms_error *err) {
    int32_t row = 0;
    c->qo[0] = 0;
    c->kvp[0] = 0;
    int32_t count = q->views != NULL ? q->n : q->n_segs;
    for (int32_t i = 0; i < count; i++) {
        ms_rid rid;
        int32_t qlen;
        if (q->views != NULL) {
            rid = q->views[i].rid;
            qlen = q->views[i].to_compute;
        } else {
            if (q->segs[i].label != q->plan_label)
                continue;
            rid = q->segs[i].rid;
            qlen = q->segs[i].span;
        }
        if (row >= c->cfg.max_rows)
            return MS_FAIL(err, MS_ERR_CAPACITY, "cross: label %d has more than max_rows %d rows",
                           q->plan_label, c->cfg.max_rows);
        const ms_kv_view *cv = context_view(ctxp, rid, i);
        /* views are already sliced to the pages their length needs (resource.h) */
        int32_t length = cv != NULL ? cv->length : 0;
        int32_t end = cv != NULL ? cv->start + cv->length : 0;
        int32_t np = length > 0 ? cv->n_pages : 1;
        if (length > 0 && (np < 1 || (int64_t)np * page_size < length))
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "cross: context of request %llu has %d tokens but %d pages",
                           (unsigned long long)rid, length, np);
        if (c->kvp[row] + np > c->cfg.max_pages)
            return MS_FAIL(err, MS_ERR_CAPACITY,
                           "cross: label %d reads more than max_pages %d context pages",
                           q->plan_label, c->cfg.max_pages);
        if (length > 0) {
            memcpy(c->ind + c->kvp[row], cv->pages, (size_t)np * sizeof(int32_t));
            c->last[row] = end % page_size == 0 ? page_size : end % page_size;
        } else {
            c->ind[c->kvp[row]] = MS_SINK_PAGE; /* padding row / empty context */
            c->last[row] = 1;
        }
        c->qo[row + 1] = c->qo[row] + qlen;
        c->kvp[row + 1] = c->kvp[row] + np;
        row++;
    }
    *n_rows = row;
    return MS_OK;
}

static bool arrays_equal(const ms_cross *c, const ms_cross_buffers *b, int32_t n) {
    if (b->n_rows != n)
        return false;
    return memcmp(b->qo_indptr, c->qo, (size_t)(n + 1) * sizeof(int32_t)) == 0 &&
           memcmp(b->kv_indptr, c->kvp, (size_t)(n + 1) * sizeof(int32_t)) == 0 &&
           memcmp(b->kv_indices, c->ind, (size_t)c->kvp[n] * sizeof(int32_t)) == 0 &&
           memcmp(b->kv_last_page_len, c->last, (size_t)n * sizeof(int32_t)) == 0;
}

static ms_status cross_plan(ms_cross *c, int index, const ms_step *step, ms_step_ctx *ctx,
                            const void **out, ms_error *err) {
    *out = NULL;
    const ms_kv_plan_set *cset = ctx->plan_results[c->context_kv];
    if (cset == NULL)
        return MS_FAIL(err, MS_ERR_STATE,
                       "cross: needs the context KV plan of resource %d, but the step did not "
                       "plan it",
                       c->context_kv);
    const ms_kv_plan *ctxp = ms_kv_plan_find(cset, c->cfg.context_label);
    if (ctxp == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "cross: the context label %d was not planned (declare a zero-span segment "
                       "on it for every row)",
                       c->cfg.context_label);
    query_rows qs[MS_MAX_LABELS];
    int32_t n_q = 0;
    if (c->query_kv >= 0) {
        const ms_kv_plan_set *qset = ctx->plan_results[c->query_kv];
        if (qset == NULL)
            return MS_FAIL(err, MS_ERR_STATE,
                           "cross: needs the query KV plan of resource %d, but the step did not "
                           "plan it",
                           c->query_kv);
        for (int32_t p = 0; p < qset->n_plans && n_q < MS_MAX_LABELS; p++) {
            const ms_kv_plan *qp = &qset->plans[p];
            if (c->query_kv == c->context_kv && qp->plan_label == c->cfg.context_label)
                continue;
            qs[n_q++] = (query_rows){qp->plan_label, qp->n_views, qp->views, NULL, 0};
        }
    } else {
        int32_t n;
        const ms_segment *segs = ms_step_segments(step, index, &n);
        for (int32_t i = 0; i < n; i++) {
            bool seen = false;
            for (int32_t k = 0; k < n_q; k++)
                seen = seen || qs[k].plan_label == segs[i].label;
            if (!seen && n_q < MS_MAX_LABELS)
                qs[n_q++] = (query_rows){segs[i].label, 0, NULL, segs, n};
        }
    }
    const ms_slot_lease *lease = ctx->lease;
    int32_t bucket = lease ? lease->bucket : -1;
    int32_t slot = lease ? lease->slot : -1;
    for (int32_t k = 0; k < n_q; k++)
        if (lease != NULL && !ctx->capture &&
            find_buffers(c, bucket, slot, qs[k].plan_label) == NULL)
            return MS_FAIL(err, MS_ERR_STATE,
                           "cross: replay on bucket %d slot %d label %d, which the capture never "
                           "planned",
                           bucket, slot, qs[k].plan_label);
    ms_cross_plan_set *res = &c->result;
    res->n_plans = 0;
    for (int32_t k = 0; k < n_q; k++) {
        int32_t n_rows = 0;
        MS_TRY(build_arrays(c, &qs[k], ctxp, cset->page_size, &n_rows, err));
        ms_cross_buffers *b = find_buffers(c, bucket, slot, qs[k].plan_label);
        if (b == NULL)
            MS_TRY(new_buffers(c, bucket, slot, qs[k].plan_label, &b, err));
        bool changed = !arrays_equal(c, b, n_rows);
        if (changed) {
            memcpy(b->qo_indptr, c->qo, (size_t)(n_rows + 1) * sizeof(int32_t));
            memcpy(b->kv_indptr, c->kvp, (size_t)(n_rows + 1) * sizeof(int32_t));
            memcpy(b->kv_indices, c->ind, (size_t)c->kvp[n_rows] * sizeof(int32_t));
            memcpy(b->kv_last_page_len, c->last, (size_t)n_rows * sizeof(int32_t));
            b->n_rows = n_rows;
            b->n_replans++;
        }
        res->plans[res->n_plans++] = (ms_cross_plan_entry){qs[k].plan_label, changed, b};
    }
    *out = res;
    return MS_OK;
}

/* ---- interface ---- */

static ms_status iface_ingest(void *self, ms_rid rid, const void *ov, ms_error *err) {
    (void)ov;
    ms_cross *c = self;
    void *v;
    if (ms_rid_map_put(&c->reqs, rid, &v, NULL) != MS_OK)
        return MS_FAIL(err, MS_ERR_OOM, "cross: out of memory ingesting request %llu",
                       (unsigned long long)rid);
    return MS_OK;
}

static void iface_remove(void *self, ms_rid rid) {
    ms_cross *c = self;
    ms_rid_map_remove(&c->reqs, rid);
}

static void iface_reset(void *self, ms_rid rid, bool free_pages) {
    (void)free_pages;
    ms_cross *c = self;
    cross_req *r = ms_rid_map_get(&c->reqs, rid);
    if (r != NULL)
        r->written = false;
}

static ms_admit_outcome iface_admit(void *self, int index, const ms_step *step,
                                    ms_step_ctx *ctx) {
    (void)index;
    (void)ctx;
    return cross_admit(self, step);
}

static ms_status iface_plan(void *self, int index, const ms_step *step, ms_step_ctx *ctx,
                            const void **out, ms_error *err) {
    return cross_plan(self, index, step, ctx, out, err);
}

static ms_status iface_commit(void *self, int index, const ms_step *step, ms_step_ctx *ctx,
                              ms_error *err) {
    (void)index;
    return cross_commit(self, step, ctx, err);
}

static void iface_free(void *self) { ms_cross_free(self); }

const ms_resource_i ms_cross_iface = {
    .kind = MS_RESOURCE_CROSS,
    .ingest = iface_ingest,
    .remove = iface_remove,
    .reset = iface_reset,
    .admit = iface_admit,
    .plan = iface_plan,
    .commit = iface_commit,
    .free = iface_free,
};

ms_status ms_cross_build(const void *config, const ms_resource_env *env, void **self,
                         const ms_resource_i **iface, ms_error *err) {
    const ms_cross_config *cfg = config;
    if (cfg == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "cross: no config");
    int ckv = ms_resource_env_dep(env, cfg->context_kv_key, MS_RESOURCE_KV, err);
    if (ckv < 0)
        return (ms_status)ckv;
    int qkv = -1;
    if (cfg->query_kv_key != NULL) {
        qkv = ms_resource_env_dep(env, cfg->query_kv_key, MS_RESOURCE_KV, err);
        if (qkv < 0)
            return (ms_status)qkv;
    }
    ms_cross *c;
    MS_TRY(ms_cross_init(&c, cfg, ckv, qkv, err));
    *self = c;
    *iface = &ms_cross_iface;
    return MS_OK;
}
