/*
 * resource.h - the vocabulary shared by every resource and the step runner (DESIGN.md §2-§4):
 * requests, labels, segments, step declarations, admit outcomes, the KV plan that attention,
 * positions and cross-attention consume, and the resource interface (vtable).
 *
 * Ownership: a step declaration (ms_step and everything it points to) is owned by the caller and
 * must stay valid from admit through commit of that step. Plan results (ms_kv_plan_set, ...) are
 * owned by the resource that produced them and stay valid until that resource's next plan() or
 * free(); consumers copy what they keep. Views are snapshots: later changes to a stream never
 * change a view already handed out.
 *
 * Lifecycle per step (the runner calls resources in dependency order, KV first):
 *     declare -> admit (reserve only, all-or-nothing for the whole step) -> plan (build views,
 *     index arrays, write addresses, position ids; allocates nothing) -> forward -> commit
 *     (advance lengths and positions, post-forks, retention).
 */
#ifndef MS_RESOURCE_H
#define MS_RESOURCE_H

#include "ms_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- requests and labels ---- */

/* Request id. Real requests use ids below MS_RID_DUMMY_BASE; dummy (padding) rows of captured
 * graphs use ids at or above it. */
typedef uint64_t ms_rid;
#define MS_RID_DUMMY_BASE (UINT64_C(1) << 63)

/* Stream label within a node: small index into the node's label table (generated code declares
 * the names, e.g. 0 "main", 1 "cfg_uncond", 2 "context"). */
typedef int32_t ms_label;
#define MS_LABEL_MAIN 0
#define MS_MAX_LABELS 16

/* Upper bound of resources per node (resource index is the position in the node's spec list). */
#define MS_MAX_RESOURCES 16

/* Page 0 of every page arena: never handed to a request; padding writes and empty
 * cross-attention contexts are addressed to it. */
#define MS_SINK_PAGE 0

/* ---- step declarations ---- */

/* One step's addition to one (request, label) stream. span == 0 reads the stream without
 * extending it. The ordered segment list of a step is the layout authority for every per-token
 * array (q, k, v, positions, outputs): tokens are packed segment by segment (per plan label). */
typedef struct ms_segment {
    ms_rid rid;     /* request */
    ms_label label; /* stream label */
    int32_t span;   /* tokens added this step, >= 0 */
} ms_segment;

/* Copy a stream's pages, length and position counter from one label to another of the same
 * request: pre-forks before anything writes this step (at plan), post-forks after commit. */
typedef struct ms_fork {
    ms_label from;
    ms_label to;
} ms_fork;

/* Several labels planned as one attention batch (batched CFG): their segments are concatenated
 * label-major (every request's labels[0] segment in batch order, then labels[1], ...). */
#define MS_MAX_COMBINED_LABELS 4
typedef struct ms_combined_label {
    ms_label labels[MS_MAX_COMBINED_LABELS]; /* source labels, in plan order */
    int32_t n_labels;                        /* 1..MS_MAX_COMBINED_LABELS */
    ms_label plan_label;                     /* label the combined plan is filed under */
} ms_combined_label;

/* KV resource record of a step. */
typedef struct ms_kv_step {
    bool commit;                        /* false: lengths do not advance; reservation kept for reuse */
    const ms_combined_label *combined;  /* [n_combined] combined plan labels, or NULL */
    int32_t n_combined;
    const ms_fork *pre_forks;           /* [n_pre_forks] applied at plan, for every batch row */
    int32_t n_pre_forks;
    const ms_fork *post_forks;          /* [n_post_forks] applied after commit */
    int32_t n_post_forks;
} ms_kv_step;

/* Attention resource record of a step. */
typedef struct ms_attn_step {
    bool causal; /* causal mask within the step's new tokens */
} ms_attn_step;

/* Positions resource record of a step. */
typedef struct ms_pos_step {
    const int32_t *advance;      /* [n_segments] custom counter advance per segment, or NULL for
                                    the scheme's rule (forced to 0 when the KV step does not commit) */
    const int32_t *explicit_ids; /* [n_axes * n_tokens] ids in packed order (axis-major), or NULL */
    int32_t n_axes;              /* 1, or 3 for t/h/w M-RoPE ids */
} ms_pos_step;

/* One resource's part of a step: its record (type given by the resource kind) and, optionally,
 * its own segment list (NULL: the step's segments). */
typedef struct ms_step_record {
    const void *rec;             /* ms_kv_step *, ms_attn_step *, ms_pos_step *, ...; NULL = unused */
    const ms_segment *segments;  /* [n_segments] override, or NULL */
    int32_t n_segments;
} ms_step_record;

/* A step declaration: segments plus one record per resource index of the node. */
typedef struct ms_step {
    const char *name;                        /* step name for messages ("prefill", "decode") */
    const ms_segment *segments;              /* [n_segments] packed order */
    int32_t n_segments;
    ms_step_record records[MS_MAX_RESOURCES];/* indexed by resource index; rec NULL = not used */
} ms_step;

/* Segments a resource sees for this step (its override, else the step's). */
static inline const ms_segment *ms_step_segments(const ms_step *s, int res, int32_t *n) {
    if (s->records[res].segments != NULL) {
        *n = s->records[res].n_segments;
        return s->records[res].segments;
    }
    *n = s->n_segments;
    return s->segments;
}

/* ---- admit outcomes ---- */

/* ORDER MS_ADMIT */
typedef enum ms_admit_code {
    MS_ADMIT_OK = 0,           /* reserved; ready to plan */
    MS_ADMIT_PENDING,          /* reserved, but data is still arriving (KV transfer); retry later */
    MS_ADMIT_PAGES_SHORT,      /* not enough free pages: pages_short says how many more are needed */
    MS_ADMIT_OFFLOADED,        /* the request is offloaded (or being offloaded): reload first */
    MS_ADMIT_TRANSFER_FAILED,  /* a KV transfer for this request failed: terminal for the request */
    MS_ADMIT_INVALID,          /* the step cannot be admitted at all (unknown request, bad label) */
    MS_ADMIT_NO_MEMORY,        /* a host allocation failed; nothing changed; retry later may succeed */
    MS_ADMIT_CODE_COUNT
} ms_admit_code;

/* Result of admit / admit_retrieve: a value, not an exception. On failure nothing changed. */
typedef struct ms_admit_outcome {
    ms_admit_code code;
    int32_t pages_short; /* MS_ADMIT_PAGES_SHORT: pages needed beyond the free count */
    ms_label label;      /* the stream that failed (when applicable) */
    ms_rid rid;          /* its request */
    int32_t resource;    /* index of the failing resource (set by the runner), -1 if none */
} ms_admit_outcome;

static inline ms_admit_outcome ms_admit_ok(void) {
    ms_admit_outcome o = {MS_ADMIT_OK, 0, 0, 0, -1};
    return o;
}
static inline bool ms_admit_failed(ms_admit_outcome o) {
    return o.code != MS_ADMIT_OK && o.code != MS_ADMIT_PENDING;
}
/* Static text of an admit code. */
const char *ms_admit_code_str(ms_admit_code code);

/* ---- the KV plan (produced by the KV resource, read by attention, positions, cross) ---- */

/*
 * One stream as this step sees it. The present tokens are logical positions
 * [start, start + length); start > 0 only under windowed retention and is a multiple of the page
 * size. pages[] is a snapshot sliced to ceil(length / page_size) pages (never the stream's
 * high-water page list). start + length = stored + span.
 */
typedef struct ms_kv_view {
    ms_rid rid;
    ms_label label;          /* the stream's own label (not the plan label) */
    const int32_t *pages;    /* [n_pages] page ids, snapshot */
    int32_t n_pages;
    int32_t start;           /* tokens released from the front by retention */
    int32_t length;          /* tokens present after this step's writes: stored + span - start */
    int32_t to_compute;      /* span: new tokens this step (query rows) */
    uint32_t generation;     /* stream epoch (bumped when pages are taken, reset, fork target) */
} ms_kv_view;

/*
 * The plan of one plan label: views in packed order and the FlashInfer paged index arrays
 * (int32, host memory):
 *   qo_indptr[i+1] = qo_indptr[i] + views[i].to_compute
 *   kv_indptr[i+1] = kv_indptr[i] + views[i].n_pages;  kv_indices = concatenated page lists
 *   kv_last_page_len[i] = length % page_size, 0 mapped to page_size (0 when n_pages == 0)
 *   kv_start[i] = views[i].start (logical position of the first present token)
 * plus per-token write addresses for the new tokens: token t of the packed batch is written to
 * slot token_to_slot[t] of page token_to_page[t].
 */
typedef struct ms_kv_plan {
    ms_label plan_label;
    int32_t n_views;
    const ms_kv_view *views;          /* [n_views] */
    int32_t n_tokens;                 /* qo_indptr[n_views] */
    const int32_t *qo_indptr;         /* [n_views + 1] */
    const int32_t *kv_indptr;         /* [n_views + 1] */
    const int32_t *kv_indices;        /* [kv_indptr[n_views]] */
    const int32_t *kv_last_page_len;  /* [n_views] */
    const int32_t *kv_start;          /* [n_views] */
    const int32_t *token_to_page;     /* [n_tokens] */
    const int32_t *token_to_slot;     /* [n_tokens] in [0, page_size) */
    bool is_decode;                   /* every view has to_compute == 1 (decode fast path) */
} ms_kv_plan;

/* The KV resource's plan result for a step: one plan per plan label, plus the step's forks so
 * the positions resource mirrors them at the same points. */
typedef struct ms_kv_plan_set {
    int32_t page_size;
    int32_t n_plans;
    const ms_kv_plan *plans;      /* [n_plans] in order of first appearance in the segments */
    const ms_fork *pre_forks;     /* the step's forks (borrowed from the declaration) */
    int32_t n_pre_forks;
    const ms_fork *post_forks;
    int32_t n_post_forks;
    bool commit;                  /* the KV step commits */
} ms_kv_plan_set;

/* The plan of `label` in a plan set, or NULL. */
const ms_kv_plan *ms_kv_plan_find(const ms_kv_plan_set *set, ms_label label);

/* ---- step context and the resource interface ---- */

struct ms_slot_lease;

/* Mutable, runner-owned context of one step. */
typedef struct ms_step_ctx {
    const ms_rid *request_ids;   /* [n_rows] batch rows; under capture padded with dummy rows */
    int32_t n_rows;
    int32_t n_real;              /* rows [n_real, n_rows) are padding */
    const struct ms_slot_lease *lease; /* captured path: slot and bucket; NULL when eager */
    bool capture;                /* this step is being captured */
    bool is_preplan;             /* admit/plan for step N+1 while step N runs */
    const void *plan_results[MS_MAX_RESOURCES]; /* filled by plan in dependency order */
} ms_step_ctx;

/* Kinds of resources (DESIGN.md §2). ORDER MS_RESOURCE_KIND */
typedef enum ms_resource_kind {
    MS_RESOURCE_KV = 0,
    MS_RESOURCE_POS,
    MS_RESOURCE_ATTN,
    MS_RESOURCE_CROSS,
    MS_RESOURCE_SCRATCH,
    MS_RESOURCE_SAMPLER,
    MS_RESOURCE_KIND_COUNT
} ms_resource_kind;
const char *ms_resource_kind_str(ms_resource_kind kind);

/*
 * Resource interface. Every entry takes the resource's own object as `self`; `index` is the
 * resource's index in its node (its key in ms_step.records and ms_step_ctx.plan_results).
 * Entries marked optional may be NULL (default in the trailing comment).
 */
typedef struct ms_resource_i {
    ms_resource_kind kind;
    /* Create per-request state; idempotent (a second ingest keeps existing state). */
    ms_status (*ingest)(void *self, ms_rid rid, const void *overrides, ms_error *err); /* optional: no-op */
    /* Free everything the request holds. Unknown rid is a no-op. */
    void (*remove)(void *self, ms_rid rid);                       /* optional: no-op */
    /* Clear a dummy/padding row; free_pages=false keeps its pages for reuse. */
    void (*reset)(void *self, ms_rid rid, bool free_pages);       /* optional: no-op */
    /* Reserve capacity for the step; all-or-nothing; idempotent on retry. */
    ms_admit_outcome (*admit)(void *self, int index, const ms_step *step, ms_step_ctx *ctx); /* optional: ok */
    /* Undo what the last successful admit of this step reserved (a later resource failed), and
     * what its plan applied (pre-forks) when the step is abandoned after plan (runner abandon). */
    void (*admit_rollback)(void *self, int index, const ms_step *step, ms_step_ctx *ctx); /* optional: no-op */
    /* Build this step's plan; *out is owned by the resource (see top of file). */
    ms_status (*plan)(void *self, int index, const ms_step *step, ms_step_ctx *ctx,
                      const void **out, ms_error *err);           /* optional: *out = NULL */
    /* Advance host state after the forward was launched. */
    ms_status (*commit)(void *self, int index, const ms_step *step, ms_step_ctx *ctx,
                        ms_error *err);                           /* optional: no-op */
    /* Release the resource object. */
    void (*free)(void *self);
    /* Export rid's state as a caller-owned copy in *out (released with published_free); *out =
     * NULL when the resource holds nothing for rid. Never aliases live state. */
    ms_status (*publish)(void *self, ms_rid rid, void **out, ms_error *err); /* optional: *out = NULL */
    void (*published_free)(void *self, void *published);          /* required with publish */
    /* Import state another node/engine published for rid (positions: raised by maximum). */
    ms_admit_outcome (*admit_retrieve)(void *self, ms_rid rid, const void *published); /* optional: ok */
} ms_resource_i;

#ifdef __cplusplus
}
#endif
#endif /* MS_RESOURCE_H */
