/*
 * positions.h - the positions resource (kind MS_RESOURCE_POS, DESIGN.md §3 "Positions"): a host
 * counter per (request, label), position ids planned in the KV plan's packed order, counters
 * advanced at commit.
 *
 * Schemes:
 *   - MS_POS_SEQUENTIAL: a segment of span n at counter c gets ids c .. c+n-1; advance n.
 *   - MS_POS_BLOCK: every token of a segment gets c (an image block occupies one position);
 *     the counter advances by block_step per non-empty segment.
 *   - MS_POS_EXPLICIT: ids are supplied per step (ms_pos_step.explicit_ids, n_axes = 3 for
 *     M-RoPE t/h/w); a step that supplies none gets sequential ids repeated on every axis (text
 *     tokens); advance n unless a custom advance is declared.
 * A step that supplies explicit ids (any scheme) and declares no custom advance moves each
 * stream's counter to one past the largest id its tokens took on any axis (transformers'
 * Qwen2-VL get_rope_index: the text after a t/h/w image grid continues at max + 1); for ids that
 * count up from the counter that is the span, as the sequential rule gives.
 * Any scheme passes explicit ids through when the step supplies them (n_axes must match).
 *
 * Rules kept (reference §10): the advance is 0 when the step's KV plan does not commit, and a
 * non-zero custom advance on such a step is rejected at plan (H14); forks mirror counters at the
 * points KV copies pages: pre-forks at plan, post-forks after commit, both read from the KV plan
 * set (F5); publish exports the counters, admit_retrieve raises local counters to the published
 * ones and never lowers them (F5); reset rewinds a dummy row's counters to 0 (H13). A step that
 * is abandoned after plan (admit_rollback: a dropped pre-plan, a later failure) gets its pre-fork
 * mirrors undone, as the KV pool undoes its fork copies.
 *
 * Ownership: ms_positions_init returns an object owned by the caller (ms_positions_free). The
 * plan result (ms_pos_plan) is owned by the resource and valid until its next plan or free.
 * Not thread-safe: the node's step driver serialises calls.
 *
 * Usage (through the step runner):
 *     ms_positions_config pc = {.scheme = MS_POS_SEQUENTIAL, .n_axes = 1, .max_tokens = 4096,
 *                               .kv_key = "kv"};
 *     {"pos", MS_RESOURCE_POS, deps_kv, 1, ms_positions_build, &pc, NULL, NULL}
 *     ... after plan: const ms_pos_plan *pp = ctx.plan_results[pos_index];
 */
#ifndef MS_POSITIONS_H
#define MS_POSITIONS_H

#include "resource.h"
#include "step_runner.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ORDER MS_POS_SCHEME */
typedef enum ms_pos_scheme {
    MS_POS_SEQUENTIAL = 0,
    MS_POS_BLOCK,
    MS_POS_EXPLICIT,
    MS_POS_SCHEME_COUNT
} ms_pos_scheme;

/* Static text of a scheme ("sequential", "block", "explicit"). */
const char *ms_pos_scheme_str(ms_pos_scheme scheme);

#define MS_POS_MAX_AXES 3

/* Configuration of a positions resource. */
typedef struct ms_positions_config {
    ms_pos_scheme scheme;
    int32_t block_step;  /* MS_POS_BLOCK: counter advance per non-empty segment, >= 0 */
    int32_t n_axes;      /* ids per token: 1, or 3 (t/h/w) for MS_POS_EXPLICIT */
    int32_t max_tokens;  /* capacity of the id buffer: tokens of one step over all plan labels */
    const char *kv_key;  /* key of the KV resource whose plan set gives the packing (runner) */
} ms_positions_config;

/* Positions resource (opaque). */
typedef struct ms_positions ms_positions;

/*
 * Plan result: ids for every token of the step in the KV plan set's packed order (plan labels
 * in set order, tokens of each plan in its packed order), axis-major.
 */
typedef struct ms_pos_plan {
    int32_t n_axes;                        /* 1 or 3 */
    int32_t n_tokens;                      /* tokens over all plan labels */
    const int32_t *ids;                    /* [n_axes * n_tokens]: ids[a * n_tokens + t] */
    int32_t n_plans;                       /* plan labels of the KV plan set */
    ms_label plan_labels[MS_MAX_LABELS];   /* [n_plans] */
    int32_t offsets[MS_MAX_LABELS + 1];    /* plan p's tokens are [offsets[p], offsets[p+1]) */
} ms_pos_plan;

/* Ids of plan label `label`, axis `axis` (pointer into plan->ids) and their count, or NULL when
 * the plan set has no such label. */
const int32_t *ms_pos_plan_ids(const ms_pos_plan *plan, ms_label label, int32_t axis,
                               int32_t *n);

/* What publish exports for one request (copy). */
typedef struct ms_pos_published {
    int32_t counter[MS_MAX_LABELS]; /* next position per label */
} ms_pos_published;

/*
 * Create a positions resource reading KV plan sets at resource index kv_index.
 * Errors: MS_ERR_INVALID_ARG for a bad scheme, n_axes (1 or 3; 3 only with EXPLICIT),
 * block_step < 0, max_tokens < 1 or a negative kv_index; MS_ERR_OOM.
 */
ms_status ms_positions_init(ms_positions **out, const ms_positions_config *cfg, int kv_index,
                            ms_error *err);

/* Free the resource. NULL is a no-op. */
void ms_positions_free(ms_positions *pos);

/* Step-runner builder: resolves cfg->kv_key among the spec's deps. */
ms_status ms_positions_build(const void *config, const ms_resource_env *env, void **self,
                             const ms_resource_i **iface, ms_error *err);

/* The resource interface (kind MS_RESOURCE_POS). */
extern const ms_resource_i ms_positions_iface;

/*
 * Read-only accessor: the next position of (rid, label) into *out. MS_ERR_NOT_FOUND for an
 * unknown request, MS_ERR_INVALID_ARG for a label out of range.
 */
ms_status ms_positions_position(const ms_positions *pos, ms_rid rid, ms_label label,
                                int32_t *out, ms_error *err);

/* Number of requests with state (tests, metrics). */
size_t ms_positions_count(const ms_positions *pos);

/* Direct entries (also reachable through ms_positions_iface). */
ms_status ms_positions_ingest(ms_positions *pos, ms_rid rid, ms_error *err);
void ms_positions_remove(ms_positions *pos, ms_rid rid);
void ms_positions_reset(ms_positions *pos, ms_rid rid);
/* Copy rid's counters into *out; MS_ERR_NOT_FOUND for an unknown request. */
ms_status ms_positions_publish(const ms_positions *pos, ms_rid rid, ms_pos_published *out,
                               ms_error *err);
/* Raise rid's counters to the published ones (never lowers). MS_ERR_NOT_FOUND if unknown. */
ms_status ms_positions_retrieve(ms_positions *pos, ms_rid rid, const ms_pos_published *pub,
                                ms_error *err);
/* Merge src into dst by maximum per label (several producers, stale echoes). */
void ms_pos_published_merge(ms_pos_published *dst, const ms_pos_published *src);

#ifdef __cplusplus
}
#endif
#endif /* MS_POSITIONS_H */
