/*
 * step_runner.h - the resources of one node and the per-step sweep over them (DESIGN.md §3-§4).
 *
 * A node's resources are built from a spec list (key, kind, dependencies, builder, config). The
 * dependency order is computed once at init: dependencies first, ties broken by key name; an
 * unknown, self or cyclic dependency is rejected with a message naming the keys. Every step then
 * runs admit -> plan -> (forward) -> commit over the resources the step declares (records[i].rec
 * != NULL), in that order:
 *   - admit is all-or-nothing across the step's resources: when resource k fails, every resource
 *     admitted before it in this call is rolled back (admit_rollback, in reverse order) and the
 *     outcome names k (outcome.resource);
 *   - plan clears ctx->plan_results first, then files each resource's result under its index
 *     before the next resource plans: the only channel between resources;
 *   - commit walks the same order (KV first, so positions see KV's plan set).
 * Request sweeps (ingest, remove, reset, publish, admit_retrieve) visit every resource of the
 * node, whether or not a step declares it.
 *
 * Ownership: ms_step_runner_init copies the spec list's shape (keys, deps) and owns the resources
 * it builds (freed by ms_step_runner_free); resources given pre-built in a spec (build == NULL)
 * are borrowed and never freed by the runner (several nodes may share one). Configs are borrowed
 * for the duration of init only.
 *
 * Usage:
 *     static const char *const pos_deps[] = {"kv"};
 *     ms_resource_spec specs[] = {
 *         {"kv", MS_RESOURCE_KV, NULL, 0, my_kv_build, &kv_cfg, NULL, NULL},
 *         {"pos", MS_RESOURCE_POS, pos_deps, 1, ms_positions_build, &pos_cfg, NULL, NULL},
 *     };
 *     ms_step_runner *r;
 *     MS_TRY(ms_step_runner_init(&r, specs, 2, &err));
 *     ms_admit_outcome o = ms_step_runner_admit(r, &step, &ctx);
 *     if (o.code == MS_ADMIT_OK) { MS_TRY(ms_step_runner_plan(r, &step, &ctx, &err)); ... }
 */
#ifndef MS_STEP_RUNNER_H
#define MS_STEP_RUNNER_H

#include "resource.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- specs ---- */

struct ms_resource_spec;

/* What a builder sees of its node: the whole spec list and its own index in it. */
typedef struct ms_resource_env {
    const struct ms_resource_spec *specs; /* [n_specs] the node's spec list */
    int n_specs;
    int self;                             /* index of the spec being built */
} ms_resource_env;

/*
 * Resolve a dependency by key for the resource being built: returns its index, or a negative
 * ms_status after filling err when `key` is not among the builder's declared deps (so the
 * order could not guarantee it runs first) or names a resource of another kind.
 */
int ms_resource_env_dep(const ms_resource_env *env, const char *key, ms_resource_kind kind,
                        ms_error *err);

/* Build one resource from its config; *self and *iface are filled on success. */
typedef ms_status (*ms_resource_build_fn)(const void *config, const ms_resource_env *env,
                                          void **self, const ms_resource_i **iface,
                                          ms_error *err);

/* One resource of a node. Either build (+ config) or instance + iface (borrowed) is given. */
typedef struct ms_resource_spec {
    const char *key;              /* unique name within the node ("kv", "pos", "attn") */
    ms_resource_kind kind;        /* must equal the built interface's kind */
    const char *const *deps;      /* [n_deps] keys this resource reads plan results of */
    int32_t n_deps;
    ms_resource_build_fn build;   /* NULL: use instance/iface */
    const void *config;           /* passed to build */
    void *instance;               /* pre-built resource (borrowed) when build == NULL */
    const ms_resource_i *iface;   /* its interface when build == NULL */
} ms_resource_spec;

/* ---- runner ---- */

/* Opaque: resources, their order and keys. */
typedef struct ms_step_runner ms_step_runner;

/*
 * Build every resource of `specs` (n in 1..MS_MAX_RESOURCES) and compute the dependency order.
 * Errors (MS_ERR_INVALID_ARG unless a builder says otherwise): empty or duplicate key, unknown,
 * self or cyclic dependency (the message names the keys), kind mismatch, a builder failure
 * (prefixed with the key). Nothing is left allocated on failure.
 */
ms_status ms_step_runner_init(ms_step_runner **out, const ms_resource_spec *specs, int n,
                              ms_error *err);

/* Free the runner and the resources it built (borrowed ones are left alone). NULL is a no-op. */
void ms_step_runner_free(ms_step_runner *r);

/* Number of resources. */
int ms_step_runner_count(const ms_step_runner *r);

/* Index of `key`, or -1. */
int ms_step_runner_index(const ms_step_runner *r, const char *key);

/* Key / kind / object of resource i (0 <= i < count). */
const char *ms_step_runner_key(const ms_step_runner *r, int i);
ms_resource_kind ms_step_runner_kind(const ms_step_runner *r, int i);
void *ms_step_runner_resource(const ms_step_runner *r, int i);

/* The dependency order: order[k] is the index of the k-th resource to run. [count] entries. */
const int *ms_step_runner_order(const ms_step_runner *r);

/*
 * Ingest rid into every resource (in order). overrides: [count] per-resource override (may be
 * NULL, or entries NULL). Idempotent. On failure the message names the resource; resources
 * already ingested keep the request (remove it to clean up).
 */
ms_status ms_step_runner_ingest(ms_step_runner *r, ms_rid rid, const void *const *overrides,
                                ms_error *err);

/* Remove rid from every resource (reverse order). */
void ms_step_runner_remove(ms_step_runner *r, ms_rid rid);

/* Reset rid (a dummy/padding row) in every resource; free_pages=false keeps its pages. */
void ms_step_runner_reset(ms_step_runner *r, ms_rid rid, bool free_pages);

/*
 * Admit the step across the resources it declares, all-or-nothing. Returns MS_ADMIT_OK, or
 * MS_ADMIT_PENDING when every resource reserved but one waits on data, or the first failure
 * with outcome.resource set to the failing resource's index (earlier resources rolled back).
 * A record at an index the node lacks, or a malformed segment, gives MS_ADMIT_INVALID with
 * resource = that index (-1 for a malformed step-level segment).
 */
ms_admit_outcome ms_step_runner_admit(ms_step_runner *r, const ms_step *step, ms_step_ctx *ctx);

/*
 * Plan the step: clears ctx->plan_results, then plans each declared resource in order and
 * files its result under its index. Errors carry "step <name>: <key>: " in front of the
 * resource's message; MS_ERR_INVALID_ARG for a record at an index the node lacks. When a
 * resource's plan fails the step is abandoned (ms_step_runner_abandon) and plan_results cleared:
 * nothing it reserved or applied stays.
 */
ms_status ms_step_runner_plan(ms_step_runner *r, const ms_step *step, ms_step_ctx *ctx,
                              ms_error *err);

/*
 * Abandon an admitted (and possibly planned) step that will not run: a dropped pre-plan (after
 * ms_graph_plan_preplan_abandon returned), or a failure after admit. Calls admit_rollback of
 * every resource the step declares, in reverse dependency order, so reservations and plan-time
 * fork effects are undone.
 */
void ms_step_runner_abandon(ms_step_runner *r, const ms_step *step, ms_step_ctx *ctx);

/* Commit the step in the same order (after the forward was launched). Errors as for plan. */
ms_status ms_step_runner_commit(ms_step_runner *r, const ms_step *step, ms_step_ctx *ctx,
                                ms_error *err);

/* Longest resource key (bytes, without the NUL). */
#define MS_RESOURCE_KEY_MAX 47

/* One resource's published state, matched on import by (key, kind). */
typedef struct ms_published_item {
    char key[MS_RESOURCE_KEY_MAX + 1];   /* producing resource's key */
    ms_resource_kind kind;
    void *data;                          /* owned; released through owner's published_free */
    void *owner;                         /* producing resource (must outlive this item) */
    const ms_resource_i *iface;          /* its interface */
} ms_published_item;

/* What publish returns for one request: one item per resource that had something to publish.
 * Runner-independent, so a consumer node with different resource indices can import it. */
typedef struct ms_published {
    int32_t n;                                    /* items used */
    ms_published_item items[MS_MAX_RESOURCES];    /* [n] */
} ms_published;

/* Publish rid from every resource that publishes. *out is zeroed first; on failure nothing is
 * left allocated. */
ms_status ms_step_runner_publish(ms_step_runner *r, ms_rid rid, ms_published *out, ms_error *err);

/* Release every item of pub (n becomes 0). NULL is a no-op. */
void ms_published_free(ms_published *pub);

/* Import published state into every resource of this node whose (key, kind) has an item;
 * short-circuits on the first failure (outcome.resource names it); PENDING if any resource
 * still waits. */
ms_admit_outcome ms_step_runner_admit_retrieve(ms_step_runner *r, ms_rid rid,
                                               const ms_published *pub);

#ifdef __cplusplus
}
#endif
#endif /* MS_STEP_RUNNER_H */
