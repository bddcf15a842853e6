/*
 * graph_plan.h - host bookkeeping of the captured (CUDA-graph) path of one node (DESIGN.md §4):
 * capture buckets and tightest-bucket selection, slot leases, static per-(slot, label) plan
 * state with the sink tail, the dummy-row pool and tagged pre-plans.
 *
 * Rules kept (reference §6, §10):
 *   - buckets are (walk, bs, n_tokens); selection picks the captured bucket with bs' >= bs and
 *     n_tokens' >= n_tokens that is smallest in (n_tokens, bs) order;
 *   - ONE rotating slot counter per graph plan (per runner), not per bucket, because slot-keyed
 *     state is shared by every bucket (F2);
 *   - a lease found through a replay alias names the capture walk and its bucket (F3), so
 *     resources key per-slot state on what the capture created;
 *   - the static write addresses of (kv resource, slot, label) are sized to the largest bucket;
 *     every staging copies the step's n addresses and resets [n, capacity) to (MS_SINK_PAGE, 0),
 *     so padding written by a replay lands in the sink, never in a real request's pages (F1);
 *   - a slot whose capture failed is never leased for that bucket; graph handles are kept by slot
 *     number, not in capture order (H9 c);
 *   - dummy rows use ids dummy_base + slot * max_bs + i (>= MS_RID_DUMMY_BASE), are ingested
 *     once into every resource of the runner and reset without freeing pages after each replay;
 *   - one staged pre-plan per graph plan, tagged with (lease, rid list, step hash); it is
 *     promoted only for the identical batch (H8); abandon waits for a pre-plan still being
 *     planned before clearing it (F6).
 * Staging, leases and dummy rows are called from the step driver's thread; the pre-plan calls
 * (begin/finish/take/abandon) and leases are safe across the plan thread and the driver thread.
 *
 * Ownership: ms_graph_plan_init returns an object owned by the caller (ms_graph_plan_free);
 * static states are owned by the graph plan and keep their addresses for its lifetime. Graph
 * handles given to ms_graph_plan_set_captured are borrowed.
 *
 * Usage:
 *     ms_graph_plan *g;  ms_graph_plan_config gc = {.n_slots = 2, .dummy_base = MS_RID_DUMMY_BASE};
 *     MS_TRY(ms_graph_plan_init(&g, &gc, &err));
 *     MS_TRY(ms_graph_plan_add_bucket(g, WALK_DECODE, 8, 8, &b, &err));
 *     ... capture each (bucket, slot) under ms_graph_plan_capture_lease, set_captured ...
 *     ms_slot_lease lease;
 *     if (ms_graph_plan_lease(g, WALK_DECODE, n_real, n_tokens, &lease, &err) == MS_OK) {
 *         ms_graph_plan_step_ids(g, &lease, real, n_real, ids, cap, &n_rows, &err);
 *         ... admit/plan over ids; ms_graph_plan_stage_step(g, runner, &ctx, &err); replay;
 *         commit; ms_graph_plan_release(g, runner, &lease, n_real);
 *     }
 */
#ifndef MS_GRAPH_PLAN_H
#define MS_GRAPH_PLAN_H

#include "positions.h"
#include "resource.h"
#include "step_runner.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A replay slot on a captured bucket (the struct resource.h forward-declares). */
typedef struct ms_slot_lease {
    int32_t slot;      /* [0, n_slots) */
    int32_t bucket;    /* bucket index in the graph plan (a capture-walk bucket) */
    int32_t walk;      /* the bucket's capture walk, never an alias */
    int32_t bs;        /* bucket rows */
    int32_t n_tokens;  /* bucket tokens */
    uint64_t serial;   /* lease number, unique within the graph plan (capture leases: 0) */
} ms_slot_lease;

/* Configuration. */
typedef struct ms_graph_plan_config {
    int32_t n_slots;   /* 1, or 2 when some resource of the node pre-plans (max 4) */
    ms_rid dummy_base; /* first dummy rid of this runner; >= MS_RID_DUMMY_BASE; nodes sharing a
                          resource use disjoint ranges */
} ms_graph_plan_config;

#define MS_GRAPH_MAX_SLOTS 4

/* Opaque graph plan of one node. */
typedef struct ms_graph_plan ms_graph_plan;

/* Create. MS_ERR_INVALID_ARG for n_slots outside 1..4 or a dummy_base below MS_RID_DUMMY_BASE. */
ms_status ms_graph_plan_init(ms_graph_plan **out, const ms_graph_plan_config *cfg, ms_error *err);

/* Free (static states included). NULL is a no-op. */
void ms_graph_plan_free(ms_graph_plan *g);

/* ---- buckets ---- */

/*
 * Declare a capture bucket (walk >= 0, 1 <= bs <= n_tokens). *index receives its index.
 * MS_ERR_INVALID_ARG for bad sizes or a duplicate; MS_ERR_STATE after dummy rows were ingested
 * with a smaller max bs (the pool is sized once).
 */
ms_status ms_graph_plan_add_bucket(ms_graph_plan *g, int32_t walk, int32_t bs, int32_t n_tokens,
                                   int32_t *index, ms_error *err);

/* Make replay walk `alias` find the buckets of `capture_walk`. MS_ERR_INVALID_ARG if alias has
 * buckets of its own or is already an alias. */
ms_status ms_graph_plan_add_alias(ms_graph_plan *g, int32_t alias, int32_t capture_walk,
                                  ms_error *err);

/* Largest bucket rows / tokens over all buckets (0 when none). */
int32_t ms_graph_plan_max_bs(const ms_graph_plan *g);
int32_t ms_graph_plan_max_tokens(const ms_graph_plan *g);

/* Lease used while capturing (bucket, slot): does not advance the slot counter. */
ms_status ms_graph_plan_capture_lease(const ms_graph_plan *g, int32_t bucket, int32_t slot,
                                      ms_slot_lease *out, ms_error *err);

/* Record the capture outcome of (bucket, slot); `graph` (borrowed) is kept when ok. */
ms_status ms_graph_plan_set_captured(ms_graph_plan *g, int32_t bucket, int32_t slot, bool ok,
                                     void *graph, ms_error *err);

/* Graph handle captured for exactly the lease's (bucket, slot), or NULL. */
void *ms_graph_plan_graph(const ms_graph_plan *g, const ms_slot_lease *lease);

/*
 * Tightest captured bucket for (walk or alias, bs, n_tokens): bs' >= bs, n_tokens' >= n_tokens,
 * smallest (n_tokens, bs); only buckets with at least one captured slot. MS_ERR_NOT_FOUND when
 * none fits (run eager).
 */
ms_status ms_graph_plan_select(const ms_graph_plan *g, int32_t walk, int32_t bs, int32_t n_tokens,
                               int32_t *bucket, ms_error *err);

/*
 * Lease the next slot (one counter per graph plan) on the tightest bucket whose capture of that
 * slot succeeded. MS_ERR_NOT_FOUND when none (run eager; the counter does not move).
 */
ms_status ms_graph_plan_lease(ms_graph_plan *g, int32_t walk, int32_t bs, int32_t n_tokens,
                              ms_slot_lease *out, ms_error *err);

/* ---- static plan state (slot, label) ---- */

/* Static write addresses of one (KV resource, slot, label); fixed addresses, capacity =
 * largest bucket tokens at creation. */
typedef struct ms_graph_kv_state {
    int32_t kv_resource;     /* resource index of the KV pool in the runner */
    int32_t slot;
    ms_label label;          /* plan label */
    int32_t capacity;        /* tokens */
    int32_t n_tokens;        /* real tokens of the last staging */
    int32_t *token_to_page;  /* [capacity]; [n_tokens, capacity) == MS_SINK_PAGE */
    int32_t *token_to_slot;  /* [capacity]; [n_tokens, capacity) == 0 */
    uint64_t n_stagings;     /* times staged */
} ms_graph_kv_state;

/* Static position ids of one (positions resource, slot, plan label). */
typedef struct ms_graph_pos_state {
    int32_t pos_resource;
    int32_t slot;
    ms_label label;
    int32_t capacity;        /* tokens */
    int32_t n_axes;
    int32_t n_tokens;
    int32_t *ids;            /* [n_axes * capacity], axis a at ids + a * capacity; tail 0 */
} ms_graph_pos_state;

/*
 * Stage every plan of a KV plan set into the lease's (kv_resource, slot, plan label) states.
 * States are created only while capturing (capture = true); a replay staging a key the capture
 * never created is MS_ERR_STATE (the graph would not read it). MS_ERR_CAPACITY when a plan has
 * more tokens than the lease's bucket.
 */
ms_status ms_graph_plan_stage_kv(ms_graph_plan *g, const ms_slot_lease *lease, int kv_resource,
                                 const ms_kv_plan_set *set, bool capture, ms_error *err);

/* Same for a positions plan (tail reset to 0 so padding rows never see stale ids). */
ms_status ms_graph_plan_stage_positions(ms_graph_plan *g, const ms_slot_lease *lease,
                                        int pos_resource, const ms_pos_plan *plan, bool capture,
                                        ms_error *err);

/* Stage the plan results of every KV and positions resource of the runner found in
 * ctx->plan_results, under ctx->lease (required) and ctx->capture. */
ms_status ms_graph_plan_stage_step(ms_graph_plan *g, const ms_step_runner *runner,
                                   const ms_step_ctx *ctx, ms_error *err);

/* The static state of a key, or NULL. */
const ms_graph_kv_state *ms_graph_plan_kv_state(const ms_graph_plan *g, int kv_resource,
                                                int32_t slot, ms_label label);
const ms_graph_pos_state *ms_graph_plan_pos_state(const ms_graph_plan *g, int pos_resource,
                                                  int32_t slot, ms_label label);

/* ---- dummy rows ---- */

/* Dummy rid i (0 <= i < max_bs) of `slot`. */
ms_rid ms_graph_plan_dummy_rid(const ms_graph_plan *g, int32_t slot, int32_t i);

/* Whether rid belongs to this graph plan's dummy pool. */
bool ms_graph_plan_is_dummy(const ms_graph_plan *g, ms_rid rid);

/* Ingest every dummy row (n_slots * max_bs) into every resource of the runner, once; later calls
 * are no-ops. Needs at least one bucket. */
ms_status ms_graph_plan_ingest_dummies(ms_graph_plan *g, ms_step_runner *runner, ms_error *err);

/* Remove the dummy rows from every resource (teardown). */
void ms_graph_plan_remove_dummies(ms_graph_plan *g, ms_step_runner *runner);

/*
 * Step rows for a lease: the real rids first (input not modified), then the slot's dummy rows
 * n_real .. bs-1. out has room for cap >= lease->bs entries; *n_out = lease->bs.
 * MS_ERR_INVALID_ARG when n_real > bs, a real rid is in the dummy range, or cap is too small.
 */
ms_status ms_graph_plan_step_ids(const ms_graph_plan *g, const ms_slot_lease *lease,
                                 const ms_rid *real, int32_t n_real, ms_rid *out, int32_t cap,
                                 int32_t *n_out, ms_error *err);

/* After a replay: reset the lease's padding rows [n_real, bs) in every resource without freeing
 * their pages (so the next replay allocates nothing for them). */
void ms_graph_plan_release(ms_graph_plan *g, ms_step_runner *runner, const ms_slot_lease *lease,
                           int32_t n_real);

/* ---- tagged pre-plan ---- */

/* Hash of a step declaration: name, segments, which records are present and their segment
 * overrides (record contents are opaque here; steps of one kind differ in segments). */
uint64_t ms_step_hash(const ms_step *step);

/*
 * Start staging a pre-plan for (lease, rids[n], step_hash) on the plan thread. MS_ERR_STATE when
 * one is already staged or being staged (one per graph plan).
 */
ms_status ms_graph_plan_preplan_begin(ms_graph_plan *g, const ms_slot_lease *lease,
                                      const ms_rid *rids, int32_t n, uint64_t step_hash,
                                      ms_error *err);

/* The plan thread finished staging (ok = false: its admit/plan failed; nothing to promote). */
void ms_graph_plan_preplan_finish(ms_graph_plan *g, bool ok);

/*
 * Promote the staged pre-plan for the batch about to run: waits while it is still being
 * planned, then MS_OK if its tag matches (lease serial and slot, rid list, step hash) and clears
 * it; MS_ERR_STATE if it was made for another batch (kept: abandon it); MS_ERR_NOT_FOUND if none
 * (or it failed: cleared).
 */
ms_status ms_graph_plan_preplan_take(ms_graph_plan *g, const ms_slot_lease *lease,
                                     const ms_rid *rids, int32_t n, uint64_t step_hash,
                                     ms_error *err);

/* Drop the staged pre-plan: waits until a pre-plan still being planned finishes, then clears it.
 * Returns whether there was one. The caller then undoes its effects (release padding rows,
 * clear resource pre-plans). */
bool ms_graph_plan_preplan_abandon(ms_graph_plan *g);

/* Whether a pre-plan is staged or being staged. */
bool ms_graph_plan_preplan_pending(ms_graph_plan *g);

#ifdef __cplusplus
}
#endif
#endif /* MS_GRAPH_PLAN_H */
