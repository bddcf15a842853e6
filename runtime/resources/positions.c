/*
 * positions.c - positions resource: per-(request, label) counters, ids in KV packed order,
 * advance at commit, fork mirroring, publish/retrieve by maximum, dummy-row reset.
 *
 * Plan validates everything it will read before it mutates anything (pre-fork mirroring), so a
 * failed plan leaves the counters unchanged. Plan allocates nothing: the id buffer is sized at
 * init (max_tokens).
 */
#include "positions.h"

#include <string.h>

#include "rid_map.h"

/* Per-request state. */
typedef struct pos_req {
    int32_t counter[MS_MAX_LABELS]; /* next position per label */
} pos_req;

/* Counter overwritten by a pre-fork mirror at plan (undone by admit_rollback). */
typedef struct pos_undo {
    ms_rid rid;
    ms_label label;
    int32_t old;
} pos_undo;

struct ms_positions {
    ms_positions_config cfg;  /* copy; kv_key not kept */
    int kv_index;             /* resource index of the KV plan set */
    ms_rid_map reqs;          /* rid -> pos_req */
    int32_t *ids;             /* [n_axes * max_tokens] plan buffer */
    ms_pos_plan plan;         /* last plan result (ids point into `ids`) */
    const ms_step *undo_step; /* step whose pre-fork mirrors `undo` records, or NULL */
    pos_undo *undo;           /* [n_undo] in application order */
    size_t n_undo, cap_undo;
};

/* ---- helpers ---- */

const char *ms_pos_scheme_str(ms_pos_scheme scheme) {
    /* ORDER MS_POS_SCHEME */
    static const char *const names[MS_POS_SCHEME_COUNT] = {"sequential", "block", "explicit"};
    if ((int)scheme < 0 || scheme >= MS_POS_SCHEME_COUNT)
        return "unknown";
    return names[scheme];
}

const int32_t *ms_pos_plan_ids(const ms_pos_plan *plan, ms_label label, int32_t axis,
                               int32_t *n) {
    *n = 0;
    if (axis < 0 || axis >= plan->n_axes)
        return NULL;
    for (int32_t p = 0; p < plan->n_plans; p++) {
        if (plan->plan_labels[p] != label)
            continue;
        *n = plan->offsets[p + 1] - plan->offsets[p];
        return plan->ids + (size_t)axis * (size_t)plan->n_tokens + (size_t)plan->offsets[p];
    }
    return NULL;
}

void ms_pos_published_merge(ms_pos_published *dst, const ms_pos_published *src) {
    for (int l = 0; l < MS_MAX_LABELS; l++)
        dst->counter[l] = MS_MAX(dst->counter[l], src->counter[l]);
}

/* Rows forks apply to: the step's batch rows (padded under capture), or the rids of its
 * segments when the context carries none (a rid seen twice is mirrored twice: harmless). */
static int32_t fork_row_count(const ms_step_ctx *ctx, int32_t n_segs) {
    return (ctx->request_ids != NULL && ctx->n_rows > 0) ? ctx->n_rows : n_segs;
}

static ms_rid fork_row(const ms_step_ctx *ctx, const ms_segment *segs, int32_t r) {
    return (ctx->request_ids != NULL && ctx->n_rows > 0) ? ctx->request_ids[r] : segs[r].rid;
}

static bool forks_valid(const ms_fork *f, int32_t n) {
    if (n < 0 || (n > 0 && f == NULL))
        return false;
    for (int32_t i = 0; i < n; i++)
        if (f[i].from < 0 || f[i].from >= MS_MAX_LABELS || f[i].to < 0 || f[i].to >= MS_MAX_LABELS)
            return false;
    return true;
}

static const ms_kv_plan_set *kv_set_of(const ms_positions *pos, const ms_step_ctx *ctx,
                                       const char *what, ms_error *err) {
    const ms_kv_plan_set *set = ctx->plan_results[pos->kv_index];
    if (set == NULL)
        MS_FAIL(err, MS_ERR_STATE,
                "positions: %s needs the KV plan of resource %d, but the step did not plan it",
                what, pos->kv_index);
    return set;
}

/* Scheme rule for the advance of a segment of `span` tokens. */
static int32_t rule_advance(const ms_positions *pos, int32_t span) {
    if (pos->cfg.scheme == MS_POS_BLOCK)
        return span > 0 ? pos->cfg.block_step : 0;
    return span;
}

/* ---- lifecycle ---- */

ms_status ms_positions_init(ms_positions **out, const ms_positions_config *cfg, int kv_index,
                            ms_error *err) {
    *out = NULL;
    if ((int)cfg->scheme < 0 || cfg->scheme >= MS_POS_SCHEME_COUNT)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "positions: unknown scheme %d", (int)cfg->scheme);
    if (cfg->n_axes != 1 && !(cfg->n_axes == MS_POS_MAX_AXES && cfg->scheme == MS_POS_EXPLICIT))
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "positions: n_axes %d with scheme %s (1, or 3 for explicit)", cfg->n_axes,
                       ms_pos_scheme_str(cfg->scheme));
    if (cfg->block_step < 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "positions: block_step %d < 0", cfg->block_step);
    if (cfg->max_tokens < 1)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "positions: max_tokens %d < 1", cfg->max_tokens);
    if (kv_index < 0 || kv_index >= MS_MAX_RESOURCES)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "positions: bad KV resource index %d", kv_index);
    ms_positions *pos = ms_calloc(1, sizeof *pos);
    int32_t *ids = ms_calloc((size_t)cfg->n_axes * (size_t)cfg->max_tokens, sizeof *ids);
    if (pos == NULL || ids == NULL) {
        ms_free(pos);
        ms_free(ids);
        return MS_FAIL(err, MS_ERR_OOM, "positions: out of memory for %d tokens (max_tokens)",
                       cfg->max_tokens);
    }
    pos->cfg = *cfg;
    pos->cfg.kv_key = NULL;
    pos->kv_index = kv_index;
    pos->ids = ids;
    pos->plan.n_axes = cfg->n_axes;
    pos->plan.ids = ids;
    ms_rid_map_init(&pos->reqs, sizeof(pos_req));
    *out = pos;
    return MS_OK;
}

void ms_positions_free(ms_positions *pos) {
    if (pos == NULL)
        return;
    ms_rid_map_free(&pos->reqs);
    ms_free(pos->ids);
    ms_free(pos->undo);
    ms_free(pos);
}

size_t ms_positions_count(const ms_positions *pos) { return ms_rid_map_count(&pos->reqs); }

ms_status ms_positions_ingest(ms_positions *pos, ms_rid rid, ms_error *err) {
    void *v;
    if (ms_rid_map_put(&pos->reqs, rid, &v, NULL) != MS_OK)
        return MS_FAIL(err, MS_ERR_OOM, "positions: out of memory ingesting request %llu",
                       (unsigned long long)rid);
    return MS_OK; /* an existing request keeps its counters */
}

void ms_positions_remove(ms_positions *pos, ms_rid rid) { ms_rid_map_remove(&pos->reqs, rid); }

void ms_positions_reset(ms_positions *pos, ms_rid rid) {
    pos_req *st = ms_rid_map_get(&pos->reqs, rid);
    if (st != NULL)
        memset(st->counter, 0, sizeof st->counter);
}

ms_status ms_positions_position(const ms_positions *pos, ms_rid rid, ms_label label,
                                int32_t *out, ms_error *err) {
    if (label < 0 || label >= MS_MAX_LABELS)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "positions: label %d out of range", label);
    const pos_req *st = ms_rid_map_get(&pos->reqs, rid);
    if (st == NULL)
        return MS_FAIL(err, MS_ERR_NOT_FOUND, "positions: request %llu not ingested",
                       (unsigned long long)rid);
    *out = st->counter[label];
    return MS_OK;
}

ms_status ms_positions_publish(const ms_positions *pos, ms_rid rid, ms_pos_published *out,
                               ms_error *err) {
    const pos_req *st = ms_rid_map_get(&pos->reqs, rid);
    if (st == NULL)
        return MS_FAIL(err, MS_ERR_NOT_FOUND, "positions: request %llu not ingested",
                       (unsigned long long)rid);
    memcpy(out->counter, st->counter, sizeof out->counter);
    return MS_OK;
}

ms_status ms_positions_retrieve(ms_positions *pos, ms_rid rid, const ms_pos_published *pub,
                                ms_error *err) {
    pos_req *st = ms_rid_map_get(&pos->reqs, rid);
    if (st == NULL)
        return MS_FAIL(err, MS_ERR_NOT_FOUND, "positions: request %llu not ingested",
                       (unsigned long long)rid);
    for (int l = 0; l < MS_MAX_LABELS; l++)
        st->counter[l] = MS_MAX(st->counter[l], pub->counter[l]);
    return MS_OK;
}

/* ---- step ---- */

static ms_status pos_plan(ms_positions *pos, int index, const ms_step *step, ms_step_ctx *ctx,
                          const void **out, ms_error *err) {
    *out = NULL;
    const ms_pos_step *rec = step->records[index].rec;
    const ms_kv_plan_set *set = kv_set_of(pos, ctx, "plan", err);
    if (set == NULL)
        return MS_ERR_STATE;
    int32_t n_segs;
    const ms_segment *segs = ms_step_segments(step, index, &n_segs);

    /* validate before mutating anything */
    if (rec->advance != NULL) {
        for (int32_t s = 0; s < n_segs; s++) {
            if (rec->advance[s] < 0)
                return MS_FAIL(err, MS_ERR_INVALID_ARG,
                               "positions: negative advance %d for segment %d (request %llu)",
                               rec->advance[s], s, (unsigned long long)segs[s].rid);
            if (!set->commit && rec->advance[s] != 0)
                return MS_FAIL(err, MS_ERR_INVALID_ARG,
                               "positions: advance %d for segment %d (request %llu) but the KV "
                               "step does not commit (declare advance 0)",
                               rec->advance[s], s, (unsigned long long)segs[s].rid);
        }
    }
    if (set->n_plans < 0 || set->n_plans > MS_MAX_LABELS)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "positions: KV plan set has %d plan labels",
                       set->n_plans);
    if (!forks_valid(set->pre_forks, set->n_pre_forks) ||
        !forks_valid(set->post_forks, set->n_post_forks))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "positions: fork label out of range");
    int64_t total = 0;
    for (int32_t p = 0; p < set->n_plans; p++)
        total += set->plans[p].n_tokens;
    if (total > pos->cfg.max_tokens)
        return MS_FAIL(err, MS_ERR_CAPACITY,
                       "positions: step has %lld tokens, above max_tokens %d (raise max_tokens)",
                       (long long)total, pos->cfg.max_tokens);
    bool use_explicit = rec->explicit_ids != NULL;
    if (use_explicit && rec->n_axes != pos->cfg.n_axes)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "positions: explicit ids have %d axes, the resource has %d", rec->n_axes,
                       pos->cfg.n_axes);
    if (!use_explicit) {
        for (int32_t p = 0; p < set->n_plans; p++)
            for (int32_t v = 0; v < set->plans[p].n_views; v++) {
                const ms_kv_view *vw = &set->plans[p].views[v];
                if (vw->label < 0 || vw->label >= MS_MAX_LABELS)
                    return MS_FAIL(err, MS_ERR_INVALID_ARG, "positions: view label %d",
                                   vw->label);
                if (ms_rid_map_get(&pos->reqs, vw->rid) == NULL)
                    return MS_FAIL(err, MS_ERR_NOT_FOUND,
                                   "positions: request %llu not ingested",
                                   (unsigned long long)vw->rid);
            }
    }
    int32_t n_rows = fork_row_count(ctx, n_segs);
    if (set->n_pre_forks > 0)
        for (int32_t r = 0; r < n_rows; r++)
            if (ms_rid_map_get(&pos->reqs, fork_row(ctx, segs, r)) == NULL)
                return MS_FAIL(err, MS_ERR_NOT_FOUND,
                               "positions: pre-fork row request %llu not ingested",
                               (unsigned long long)fork_row(ctx, segs, r));

    /* the undo log of the first plan of this step keeps the pre-step values (a re-plan of the
     * same step mirrors again, idempotently, without recording) */
    bool record = set->n_pre_forks > 0 && pos->undo_step != step;
    if (record) {
        size_t need = (size_t)n_rows * (size_t)set->n_pre_forks;
        if (ms_grow((void **)&pos->undo, &pos->cap_undo, need, sizeof *pos->undo) != MS_OK)
            return MS_FAIL(err, MS_ERR_OOM, "positions: out of memory for the fork undo log");
        pos->undo_step = step;
        pos->n_undo = 0;
    }

    /* pre-forks: mirror counters before reading them (KV copies pages at the same point) */
    for (int32_t f = 0; f < set->n_pre_forks; f++) {
        const ms_fork *fk = &set->pre_forks[f];
        for (int32_t r = 0; r < n_rows; r++) {
            ms_rid rid = fork_row(ctx, segs, r);
            pos_req *st = ms_rid_map_get(&pos->reqs, rid);
            if (record)
                pos->undo[pos->n_undo++] = (pos_undo){rid, fk->to, st->counter[fk->to]};
            st->counter[fk->to] = st->counter[fk->from];
        }
    }

    /* ids in packed order */
    ms_pos_plan *pp = &pos->plan;
    int32_t n_tok = (int32_t)total;
    pp->n_axes = pos->cfg.n_axes;
    pp->n_tokens = n_tok;
    pp->n_plans = set->n_plans;
    pp->offsets[0] = 0;
    for (int32_t p = 0; p < set->n_plans; p++) {
        pp->plan_labels[p] = set->plans[p].plan_label;
        pp->offsets[p + 1] = pp->offsets[p] + set->plans[p].n_tokens;
    }
    if (use_explicit) {
        memcpy(pos->ids, rec->explicit_ids, (size_t)pp->n_axes * (size_t)n_tok * sizeof *pos->ids);
    } else {
        int32_t t = 0;
        for (int32_t p = 0; p < set->n_plans; p++) {
            const ms_kv_plan *kp = &set->plans[p];
            for (int32_t v = 0; v < kp->n_views; v++) {
                const ms_kv_view *vw = &kp->views[v];
                const pos_req *st = ms_rid_map_get(&pos->reqs, vw->rid);
                int32_t c = st->counter[vw->label];
                for (int32_t k = 0; k < vw->to_compute; k++, t++) {
                    int32_t id = pos->cfg.scheme == MS_POS_BLOCK ? c : c + k;
                    for (int32_t a = 0; a < pp->n_axes; a++)
                        pos->ids[(size_t)a * (size_t)n_tok + (size_t)t] = id;
                }
            }
            if (t != pp->offsets[p + 1])
                return MS_FAIL(err, MS_ERR_INVALID_ARG,
                               "positions: KV plan of label %d has %d tokens but its views "
                               "compute %d",
                               kp->plan_label, kp->n_tokens, t - pp->offsets[p]);
        }
    }
    *out = pp;
    return MS_OK;
}

static ms_status pos_commit(ms_positions *pos, int index, const ms_step *step, ms_step_ctx *ctx,
                            ms_error *err) {
    const ms_pos_step *rec = step->records[index].rec;
    const ms_kv_plan_set *set = kv_set_of(pos, ctx, "commit", err);
    if (set == NULL)
        return MS_ERR_STATE;
    if (pos->undo_step == step) { /* the step ran: its pre-fork mirrors stay */
        pos->undo_step = NULL;
        pos->n_undo = 0;
    }
    int32_t n_segs;
    const ms_segment *segs = ms_step_segments(step, index, &n_segs);
    if (set->commit && rec->explicit_ids != NULL && rec->advance == NULL) {
        /* explicit ids: each stream continues after the largest id its tokens took on any axis
         * (transformers' Qwen2-VL get_rope_index: text after an image grid starts at max + 1);
         * for ids that count up from the counter this is the span, as for sequential ids */
        int32_t t = 0;
        for (int32_t p = 0; p < set->n_plans; p++)
            for (int32_t v = 0; v < set->plans[p].n_views; v++) {
                const ms_kv_view *vw = &set->plans[p].views[v];
                int32_t top = -1;
                for (int32_t k = 0; k < vw->to_compute; k++, t++)
                    for (int32_t a = 0; a < rec->n_axes; a++)
                        top = MS_MAX(top, rec->explicit_ids[(size_t)a * (size_t)pos->plan.n_tokens +
                                                            (size_t)t]);
                pos_req *st = ms_rid_map_get(&pos->reqs, vw->rid);
                if (st != NULL && vw->to_compute > 0) /* NULL: removed while in flight */
                    st->counter[vw->label] = top + 1;
            }
    } else if (set->commit) {
        for (int32_t s = 0; s < n_segs; s++) {
            pos_req *st = ms_rid_map_get(&pos->reqs, segs[s].rid);
            if (st == NULL)
                continue; /* removed while the step was in flight */
            int32_t adv = rec->advance != NULL ? rec->advance[s] : rule_advance(pos, segs[s].span);
            st->counter[segs[s].label] += adv;
        }
    }
    /* post-forks: after the advance, so targets include this step */
    int32_t n_rows = fork_row_count(ctx, n_segs);
    for (int32_t f = 0; f < set->n_post_forks; f++) {
        const ms_fork *fk = &set->post_forks[f];
        for (int32_t r = 0; r < n_rows; r++) {
            pos_req *st = ms_rid_map_get(&pos->reqs, fork_row(ctx, segs, r));
            if (st != NULL) /* a row removed while the step was in flight */
                st->counter[fk->to] = st->counter[fk->from];
        }
    }
    return MS_OK;
}

/* Undo the pre-fork mirrors the plan of `step` applied (the step will not run). */
static void pos_rollback(ms_positions *pos, const ms_step *step) {
    if (pos->undo_step != step)
        return;
    for (size_t i = pos->n_undo; i-- > 0;) {
        pos_req *st = ms_rid_map_get(&pos->reqs, pos->undo[i].rid);
        if (st != NULL)
            st->counter[pos->undo[i].label] = pos->undo[i].old;
    }
    pos->undo_step = NULL;
    pos->n_undo = 0;
}

/* ---- interface adapters ---- */

static void iface_admit_rollback(void *self, int index, const ms_step *step, ms_step_ctx *ctx) {
    (void)index;
    (void)ctx;
    pos_rollback(self, step);
}

static ms_status iface_ingest(void *self, ms_rid rid, const void *overrides, ms_error *err) {
    (void)overrides;
    return ms_positions_ingest(self, rid, err);
}

static void iface_remove(void *self, ms_rid rid) { ms_positions_remove(self, rid); }

static void iface_reset(void *self, ms_rid rid, bool free_pages) {
    (void)free_pages;
    ms_positions_reset(self, rid);
}

static ms_status iface_plan(void *self, int index, const ms_step *step, ms_step_ctx *ctx,
                            const void **out, ms_error *err) {
    return pos_plan(self, index, step, ctx, out, err);
}

static ms_status iface_commit(void *self, int index, const ms_step *step, ms_step_ctx *ctx,
                              ms_error *err) {
    return pos_commit(self, index, step, ctx, err);
}

static void iface_free(void *self) { ms_positions_free(self); }

static ms_status iface_publish(void *self, ms_rid rid, void **out, ms_error *err) {
    *out = NULL;
    const ms_positions *pos = self;
    if (ms_rid_map_get(&pos->reqs, rid) == NULL)
        return MS_OK; /* unknown request publishes nothing */
    ms_pos_published *p = ms_malloc(sizeof *p);
    if (p == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "positions: out of memory publishing request %llu",
                       (unsigned long long)rid);
    MS_ASSERT(ms_positions_publish(pos, rid, p, NULL) == MS_OK);
    *out = p;
    return MS_OK;
}

static void iface_published_free(void *self, void *published) {
    (void)self;
    ms_free(published);
}

static ms_admit_outcome iface_admit_retrieve(void *self, ms_rid rid, const void *published) {
    ms_admit_outcome o = ms_admit_ok();
    if (ms_positions_retrieve(self, rid, published, NULL) != MS_OK) {
        o.code = MS_ADMIT_INVALID;
        o.rid = rid;
    }
    return o;
}

const ms_resource_i ms_positions_iface = {
    .kind = MS_RESOURCE_POS,
    .ingest = iface_ingest,
    .remove = iface_remove,
    .reset = iface_reset,
    .admit = NULL,
    .admit_rollback = iface_admit_rollback,
    .plan = iface_plan,
    .commit = iface_commit,
    .free = iface_free,
    .publish = iface_publish,
    .published_free = iface_published_free,
    .admit_retrieve = iface_admit_retrieve,
};

ms_status ms_positions_build(const void *config, const ms_resource_env *env, void **self,
                             const ms_resource_i **iface, ms_error *err) {
    const ms_positions_config *cfg = config;
    if (cfg == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "positions: no config");
    int kv = ms_resource_env_dep(env, cfg->kv_key, MS_RESOURCE_KV, err);
    if (kv < 0)
        return (ms_status)kv;
    ms_positions *pos;
    MS_TRY(ms_positions_init(&pos, cfg, kv, err));
    *self = pos;
    *iface = &ms_positions_iface;
    return MS_OK;
}
