/*
 * attn_plan.c - attention resource, host part: kernel choice per plan label, causal flag, and
 * persistent plan buffers keyed eagerly by (label, kind) or under a lease by (bucket, slot,
 * label). See attn_plan.h.
 */
#include "attn_plan.h"

#include <string.h>

struct ms_attn {
    ms_attn_config cfg;          /* kv_key not kept */
    int kv_index;
    ms_attn_buffers **buffers;   /* [n_buffers], stable addresses */
    size_t n_buffers, cap_buffers;
    ms_attn_plan_set result;     /* last plan */
};

const char *ms_attn_kind_str(ms_attn_kind kind) {
    /* ORDER MS_ATTN_KIND */
    static const char *const names[MS_ATTN_KIND_COUNT] = {"prefill", "decode"};
    if ((int)kind < 0 || kind >= MS_ATTN_KIND_COUNT)
        return "unknown";
    return names[kind];
}

const ms_attn_plan_entry *ms_attn_plan_find(const ms_attn_plan_set *set, ms_label label) {
    for (int32_t p = 0; p < set->n_plans; p++)
        if (set->plans[p].plan_label == label)
            return &set->plans[p];
    return NULL;
}

ms_attn_kind ms_attn_select_kind(const ms_kv_plan *plan, const ms_slot_lease *lease) {
    if (lease != NULL)
        return lease->bs == lease->n_tokens ? MS_ATTN_DECODE : MS_ATTN_PREFILL;
    if (plan->n_views == 0)
        return MS_ATTN_PREFILL;
    for (int32_t v = 0; v < plan->n_views; v++)
        if (plan->views[v].to_compute != 1)
            return MS_ATTN_PREFILL;
    return MS_ATTN_DECODE;
}

/* ---- lifecycle ---- */

ms_status ms_attn_init(ms_attn **out, const ms_attn_config *cfg, int kv_index, ms_error *err) {
    *out = NULL;
    if (cfg->max_rows < 1 || cfg->max_pages < 1)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "attention: max_rows %d, max_pages %d (need >= 1)",
                       cfg->max_rows, cfg->max_pages);
    if (kv_index < 0 || kv_index >= MS_MAX_RESOURCES)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "attention: bad KV resource index %d", kv_index);
    ms_attn *a = ms_calloc(1, sizeof *a);
    if (a == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "attention: out of memory");
    a->cfg = *cfg;
    a->cfg.kv_key = NULL;
    a->kv_index = kv_index;
    *out = a;
    return MS_OK;
}

static void buffers_free(ms_attn_buffers *b) {
    if (b == NULL)
        return;
    ms_free(b->qo_indptr);
    ms_free(b->kv_indptr);
    ms_free(b->kv_indices);
    ms_free(b->kv_last_page_len);
    ms_free(b->kv_start);
    ms_free(b);
}

void ms_attn_free(ms_attn *a) {
    if (a == NULL)
        return;
    for (size_t i = 0; i < a->n_buffers; i++)
        buffers_free(a->buffers[i]);
    ms_free(a->buffers);
    ms_free(a);
}

int32_t ms_attn_n_buffers(const ms_attn *a) { return (int32_t)a->n_buffers; }

/* ---- plan ---- */

static ms_attn_buffers *find_buffers(const ms_attn *a, int32_t bucket, int32_t slot,
                                     ms_label label, ms_attn_kind kind) {
    for (size_t i = 0; i < a->n_buffers; i++) {
        ms_attn_buffers *b = a->buffers[i];
        if (b->bucket == bucket && b->slot == slot && b->plan_label == label && b->kind == kind)
            return b;
    }
    return NULL;
}

static ms_status new_buffers(ms_attn *a, int32_t bucket, int32_t slot, ms_label label,
                             ms_attn_kind kind, ms_attn_buffers **out, ms_error *err) {
    if (ms_grow((void **)&a->buffers, &a->cap_buffers, a->n_buffers + 1, sizeof *a->buffers) !=
        MS_OK)
        return MS_FAIL(err, MS_ERR_OOM, "attention: out of memory for plan buffers");
    size_t rows = (size_t)a->cfg.max_rows;
    ms_attn_buffers *b = ms_calloc(1, sizeof *b);
    if (b != NULL) {
        b->qo_indptr = ms_calloc(rows + 1, sizeof(int32_t));
        b->kv_indptr = ms_calloc(rows + 1, sizeof(int32_t));
        b->kv_indices = ms_calloc((size_t)a->cfg.max_pages, sizeof(int32_t));
        b->kv_last_page_len = ms_calloc(rows, sizeof(int32_t));
        b->kv_start = ms_calloc(rows, sizeof(int32_t));
    }
    if (b == NULL || b->qo_indptr == NULL || b->kv_indptr == NULL || b->kv_indices == NULL ||
        b->kv_last_page_len == NULL || b->kv_start == NULL) {
        buffers_free(b);
        return MS_FAIL(err, MS_ERR_OOM,
                       "attention: out of memory for plan buffers of %d rows, %d pages "
                       "(max_rows, max_pages)",
                       a->cfg.max_rows, a->cfg.max_pages);
    }
    b->kind = kind;
    b->plan_label = label;
    b->bucket = bucket;
    b->slot = slot;
    a->buffers[a->n_buffers++] = b;
    *out = b;
    return MS_OK;
}

static ms_status attn_plan(ms_attn *a, int index, const ms_step *step, ms_step_ctx *ctx,
                           const void **out, ms_error *err) {
    *out = NULL;
    const ms_attn_step *rec = step->records[index].rec;
    const ms_kv_plan_set *set = ctx->plan_results[a->kv_index];
    if (set == NULL)
        return MS_FAIL(err, MS_ERR_STATE,
                       "attention: needs the KV plan of resource %d, but the step did not plan it",
                       a->kv_index);
    if (set->n_plans > MS_MAX_LABELS)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "attention: %d plan labels", set->n_plans);
    const ms_slot_lease *lease = ctx->lease;
    int32_t bucket = lease ? lease->bucket : -1;
    int32_t slot = lease ? lease->slot : -1;
    /* validate, then find or create every buffer, then fill: a failure changes no buffer */
    ms_attn_buffers *bufs[MS_MAX_LABELS];
    for (int32_t p = 0; p < set->n_plans; p++) {
        const ms_kv_plan *kp = &set->plans[p];
        if (kp->n_views > a->cfg.max_rows)
            return MS_FAIL(err, MS_ERR_CAPACITY,
                           "attention: label %d has %d rows, above max_rows %d", kp->plan_label,
                           kp->n_views, a->cfg.max_rows);
        if (kp->kv_indptr[kp->n_views] > a->cfg.max_pages)
            return MS_FAIL(err, MS_ERR_CAPACITY,
                           "attention: label %d reads %d pages, above max_pages %d",
                           kp->plan_label, kp->kv_indptr[kp->n_views], a->cfg.max_pages);
        ms_attn_kind kind = ms_attn_select_kind(kp, lease);
        if (lease != NULL && kind == MS_ATTN_DECODE && !kp->is_decode && kp->n_tokens > 0)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "attention: decode bucket (bs %d) but label %d has spans other than 1",
                           lease->bs, kp->plan_label);
        bufs[p] = find_buffers(a, bucket, slot, kp->plan_label, kind);
        if (bufs[p] == NULL && lease != NULL && !ctx->capture)
            return MS_FAIL(err, MS_ERR_STATE,
                           "attention: replay on bucket %d slot %d label %d, which the capture "
                           "never planned",
                           bucket, slot, kp->plan_label);
    }
    for (int32_t p = 0; p < set->n_plans; p++) {
        const ms_kv_plan *kp = &set->plans[p];
        if (bufs[p] == NULL)
            MS_TRY(new_buffers(a, bucket, slot, kp->plan_label, ms_attn_select_kind(kp, lease),
                               &bufs[p], err));
    }
    ms_attn_plan_set *res = &a->result;
    res->n_plans = set->n_plans;
    for (int32_t p = 0; p < set->n_plans; p++) {
        const ms_kv_plan *kp = &set->plans[p];
        ms_attn_buffers *b = bufs[p];
        int32_t n = kp->n_views;
        memcpy(b->qo_indptr, kp->qo_indptr, (size_t)(n + 1) * sizeof(int32_t));
        memcpy(b->kv_indptr, kp->kv_indptr, (size_t)(n + 1) * sizeof(int32_t));
        memcpy(b->kv_indices, kp->kv_indices, (size_t)kp->kv_indptr[n] * sizeof(int32_t));
        memcpy(b->kv_last_page_len, kp->kv_last_page_len, (size_t)n * sizeof(int32_t));
        if (kp->kv_start != NULL)
            memcpy(b->kv_start, kp->kv_start, (size_t)n * sizeof(int32_t));
        else
            memset(b->kv_start, 0, (size_t)n * sizeof(int32_t));
        b->n_rows = n;
        b->n_tokens = kp->n_tokens;
        b->causal = rec->causal;
        b->n_plans++;
        res->plans[p] = (ms_attn_plan_entry){kp->plan_label, b->kind, rec->causal, b};
    }
    *out = res;
    return MS_OK;
}

/* ---- interface ---- */

static ms_status iface_plan(void *self, int index, const ms_step *step, ms_step_ctx *ctx,
                            const void **out, ms_error *err) {
    return attn_plan(self, index, step, ctx, out, err);
}

static void iface_free(void *self) { ms_attn_free(self); }

const ms_resource_i ms_attn_iface = {
    .kind = MS_RESOURCE_ATTN,
    .plan = iface_plan,
    .free = iface_free,
};

ms_status ms_attn_build(const void *config, const ms_resource_env *env, void **self,
                        const ms_resource_i **iface, ms_error *err) {
    const ms_attn_config *cfg = config;
    if (cfg == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "attention: no config");
    int kv = ms_resource_env_dep(env, cfg->kv_key, MS_RESOURCE_KV, err);
    if (kv < 0)
        return (ms_status)kv;
    ms_attn *a;
    MS_TRY(ms_attn_init(&a, cfg, kv, err));
    *self = a;
    *iface = &ms_attn_iface;
    return MS_OK;
}
