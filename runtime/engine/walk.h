/*
 * walk.h - the walk executor's bookkeeping and the scheduler's step choice (engine.h).
 *
 * Every request stands at a position of its walk (ms_md_walk, model_desc.h): the index of the
 * (node, step) item it runs next. Steps before the walk's loop consume the request's prompts; the loop's steps
 * repeat until the request stops. Each engine step the scheduler picks ONE step of the node and
 * the engine batches every request standing there (ms_walk_pick): loop steps (decode) first, but
 * a waiting prefix step (prefill) runs at least every other engine step, so requests joining at
 * a step boundary are never starved by a running decode batch. Within a step the engine takes
 * rows in arrival order within the row and token budgets (chunked prefill: a one-stream prompt
 * that does not fit continues in the next step).
 *
 * Ownership: plain values; functions borrow their arguments.
 */
#ifndef MS_WALK_H
#define MS_WALK_H

#include "model_desc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where a request stands in its walk. */
typedef struct ms_walk_pos {
    int32_t walk;   /* index into ms_model_desc.walks */
    int32_t at;     /* index into the walk's items; == n_items: the walk is over */
} ms_walk_pos;

/* The (node, step) item the request runs next, or {-1, -1} when its walk is over. */
ms_md_walk_item ms_walk_item(const ms_model_desc *d, ms_walk_pos p);

/* Step index (into the steps of the item's node) the request runs next, or -1 when its walk is
 * over: ms_walk_item(d, p).step. */
int32_t ms_walk_step(const ms_model_desc *d, ms_walk_pos p);

/* True when p stands inside the walk's loop (its steps consume the last sampled id). */
bool ms_walk_in_loop(const ms_model_desc *d, ms_walk_pos p);

/* Move past the item just run: the next item, the loop's first item after its last, or the end. */
void ms_walk_advance(const ms_model_desc *d, ms_walk_pos *p);

/*
 * The walk a request takes: the first (declaration order) whose first item's segments cover
 * exactly the labels in has_prompt[0 .. n_labels of that item's node) (the streams the request
 * brings prompts for), or -1.
 */
int32_t ms_walk_find(const ms_model_desc *d, const bool *has_prompt);

/* Distinct (node, label) streams the items of walk w extend or read (the streams a request on it
 * holds); a node on a scratch KV holds none (its rows are the step's). */
int32_t ms_walk_n_streams(const ms_model_desc *d, int32_t w);

/* Scheduler state across engine steps. */
typedef struct ms_sched {
    bool last_was_loop;   /* the previous engine step ran a loop step */
} ms_sched;

/*
 * Pick the step to run: waiting[k] = requests standing at step k (k < n_steps), in_loop[k] =
 * step k is a loop step of those requests' walks. Loop steps first (most waiting rows, then the
 * lowest index), except that after a loop step a waiting prefix step (the lowest index) goes
 * next. -1 when nothing waits.
 */
int32_t ms_walk_pick(ms_sched *s, const int32_t *waiting, const bool *in_loop, int32_t n_steps);

#ifdef __cplusplus
}
#endif
#endif /* MS_WALK_H */
