/*
 * cross_attn.h - cross-attention planning (kind MS_RESOURCE_CROSS, reference §3.3): queries of
 * the decoder attend over a per-request context stream (an ordinary KV stream, usually in its own
 * KV resource) that is written once and read with zero spans afterwards.
 *
 * Rules kept:
 *   - write once: a step may declare a real span on the context label only while the request's
 *     context is unwritten; a second write is refused at admit (MS_ADMIT_INVALID); the context
 *     counts as written once a committing step wrote it; reset (dummy rows) clears the mark;
 *   - query packing comes from the query KV resource's plan (its views' rids and spans, every
 *     plan label except the context label when both are the same resource) or, without a query
 *     KV resource, from this resource's own segments (one row per segment, grouped by label);
 *   - each row reads its request's context view (already sliced to the pages its length needs)
 *     with last_page_len = (start + length) % page_size (0 -> page_size); a row with no or an
 *     empty context (a capture padding row) is planned against the sink page: one page
 *     MS_SINK_PAGE, last_page_len 1 (F3);
 *   - plan buffers per key (plan label eager, (bucket, slot, plan label) under a lease; created
 *     while capturing, refused at replay if missing); the kernel plan is redone only when the
 *     arrays changed (fingerprint = exact compare with the buffers): `replanned` says which.
 *
 * Ownership: ms_cross_init returns an object owned by the caller (ms_cross_free); results and
 * buffers are owned by the resource (buffers keep their addresses).
 *
 * Usage:
 *     ms_cross_config cc = {.context_kv_key = "ctx_kv", .query_kv_key = "kv",
 *                           .context_label = 0, .max_rows = 64, .max_pages = 1024};
 *     {"cross", MS_RESOURCE_CROSS, deps_both, 2, ms_cross_build, &cc, NULL, NULL}
 */
#ifndef MS_CROSS_ATTN_H
#define MS_CROSS_ATTN_H

#include "graph_plan.h"
#include "resource.h"
#include "step_runner.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Configuration. */
typedef struct ms_cross_config {
    const char *context_kv_key; /* KV resource holding the context stream (runner builder) */
    const char *query_kv_key;   /* KV resource giving the query packing, or NULL: own segments */
    ms_label context_label;     /* label of the context stream in context_kv */
    int32_t max_rows;           /* query rows per plan label */
    int32_t max_pages;          /* context pages per plan label */
} ms_cross_config;

/* Persistent plan buffers of one key. */
typedef struct ms_cross_buffers {
    ms_label plan_label;       /* query plan label */
    int32_t bucket;            /* -1 eager */
    int32_t slot;              /* -1 eager */
    int32_t n_rows;
    int32_t *qo_indptr;        /* [max_rows + 1] query rows */
    int32_t *kv_indptr;        /* [max_rows + 1] */
    int32_t *kv_indices;       /* [max_pages] context pages (sink for empty contexts) */
    int32_t *kv_last_page_len; /* [max_rows] */
    uint64_t n_replans;        /* times the arrays changed (kernel plan redone) */
} ms_cross_buffers;

/* One query plan label's cross plan. */
typedef struct ms_cross_plan_entry {
    ms_label plan_label;
    bool replanned;                 /* arrays changed since the last plan of this key */
    const ms_cross_buffers *buffers;
} ms_cross_plan_entry;

/* Plan result. */
typedef struct ms_cross_plan_set {
    int32_t n_plans;
    ms_cross_plan_entry plans[MS_MAX_LABELS];
} ms_cross_plan_set;

/* Opaque resource. */
typedef struct ms_cross ms_cross;

/*
 * Create. context_kv: resource index of the context KV; query_kv: index of the query KV or -1.
 * MS_ERR_INVALID_ARG for bad sizes, label or indices; MS_ERR_OOM.
 */
ms_status ms_cross_init(ms_cross **out, const ms_cross_config *cfg, int context_kv, int query_kv,
                        ms_error *err);

/* Free. NULL is a no-op. */
void ms_cross_free(ms_cross *cross);

/* Whether rid's context was written (MS_ERR_NOT_FOUND for an unknown request). */
ms_status ms_cross_context_written(const ms_cross *cross, ms_rid rid, bool *out, ms_error *err);

/* Step-runner builder: resolves both keys among the spec's deps. */
ms_status ms_cross_build(const void *config, const ms_resource_env *env, void **self,
                         const ms_resource_i **iface, ms_error *err);

/* The resource interface (kind MS_RESOURCE_CROSS). */
extern const ms_resource_i ms_cross_iface;

#ifdef __cplusplus
}
#endif
#endif /* MS_CROSS_ATTN_H */
