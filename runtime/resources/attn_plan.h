/*
 * attn_plan.h - host part of the attention resource (kind MS_RESOURCE_ATTN): for every plan
 * label of the KV plan set, choose the decode or prefill kernel, take the causal flag from the
 * step, and copy the paged index arrays into persistent plan buffers that a kernel (or a
 * captured graph) reads at fixed addresses.
 *
 * Kernel choice (reference §3.1, hazard H7): eager steps use decode iff EVERY view computes
 * exactly one token (never "tokens == rows": spans [2, 0] are prefill); under a slot lease the
 * choice is the bucket's (bs == n_tokens), since the captured graph baked it in.
 * Plan buffers: eager, one per (plan label, kind), reused across steps; under a lease, one per
 * (bucket, slot, plan label), created while capturing and only looked up at replay (a replay
 * whose key the capture never created is an error, never a fresh buffer the graph would not
 * read: F3). Buffers are created the first time a key is seen (warm-up or capture); steady-state
 * plans allocate nothing.
 *
 * Ownership: ms_attn_init returns an object owned by the caller (ms_attn_free). Plan results and
 * buffers are owned by the resource; buffers keep their addresses for its lifetime.
 *
 * Usage (through the step runner):
 *     ms_attn_config ac = {.kv_key = "kv", .max_rows = 256, .max_pages = 4096};
 *     {"attn", MS_RESOURCE_ATTN, deps_kv, 1, ms_attn_build, &ac, NULL, NULL}
 *     step.records[attn].rec = &(ms_attn_step){.causal = true};
 *     ... const ms_attn_plan_set *ap = ctx.plan_results[attn];
 */
#ifndef MS_ATTN_PLAN_H
#define MS_ATTN_PLAN_H

#include "graph_plan.h"
#include "resource.h"
#include "step_runner.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ORDER MS_ATTN_KIND */
typedef enum ms_attn_kind {
    MS_ATTN_PREFILL = 0, /* ragged prefill kernel (any spans) */
    MS_ATTN_DECODE,      /* one query token per row */
    MS_ATTN_KIND_COUNT
} ms_attn_kind;

/* Static text ("prefill", "decode"). */
const char *ms_attn_kind_str(ms_attn_kind kind);

/* Configuration. */
typedef struct ms_attn_config {
    const char *kv_key;  /* KV resource whose plan set is attended over (runner builder) */
    int32_t max_rows;    /* rows (views) per plan label a buffer holds */
    int32_t max_pages;   /* kv_indices entries per plan label a buffer holds */
} ms_attn_config;

/* Persistent plan buffers of one wrapper key (host copies of what the kernel plan reads). */
typedef struct ms_attn_buffers {
    ms_attn_kind kind;
    ms_label plan_label;
    int32_t bucket;            /* -1 for eager buffers */
    int32_t slot;              /* -1 for eager buffers */
    bool causal;               /* of the last plan */
    int32_t n_rows;            /* rows of the last plan */
    int32_t n_tokens;          /* query tokens of the last plan */
    int32_t *qo_indptr;        /* [max_rows + 1] */
    int32_t *kv_indptr;        /* [max_rows + 1] */
    int32_t *kv_indices;       /* [max_pages] */
    int32_t *kv_last_page_len; /* [max_rows] */
    int32_t *kv_start;         /* [max_rows] first present token (windowed retention) */
    uint64_t n_plans;          /* times planned into */
} ms_attn_buffers;

/* One plan label's attention plan. */
typedef struct ms_attn_plan_entry {
    ms_label plan_label;
    ms_attn_kind kind;
    bool causal;
    const ms_attn_buffers *buffers;
} ms_attn_plan_entry;

/* Plan result: one entry per plan label of the KV plan set, in its order. */
typedef struct ms_attn_plan_set {
    int32_t n_plans;
    ms_attn_plan_entry plans[MS_MAX_LABELS];
} ms_attn_plan_set;

/* Entry of `label`, or NULL. */
const ms_attn_plan_entry *ms_attn_plan_find(const ms_attn_plan_set *set, ms_label label);

/* Kernel choice for one plan: the lease's bucket shape when given, else every span == 1. */
ms_attn_kind ms_attn_select_kind(const ms_kv_plan *plan, const ms_slot_lease *lease);

/* Opaque resource. */
typedef struct ms_attn ms_attn;

/* Create over the KV plan sets at resource index kv_index. MS_ERR_INVALID_ARG for max_rows or
 * max_pages < 1 or a bad index; MS_ERR_OOM. */
ms_status ms_attn_init(ms_attn **out, const ms_attn_config *cfg, int kv_index, ms_error *err);

/* Free. NULL is a no-op. */
void ms_attn_free(ms_attn *attn);

/* Number of plan buffers created so far (tests: steady state creates none). */
int32_t ms_attn_n_buffers(const ms_attn *attn);

/* Step-runner builder: resolves cfg->kv_key among the spec's deps. */
ms_status ms_attn_build(const void *config, const ms_resource_env *env, void **self,
                        const ms_resource_i **iface, ms_error *err);

/* The resource interface (kind MS_RESOURCE_ATTN). */
extern const ms_resource_i ms_attn_iface;

#ifdef __cplusplus
}
#endif
#endif /* MS_ATTN_PLAN_H */
