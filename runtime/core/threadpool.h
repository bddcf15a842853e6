/*
 * threadpool.h - a small fixed pthreads pool for data-parallel CPU ops.
 *
 * The pool runs one job at a time: a job is n_tasks independent calls fn(arg, task, thread),
 * claimed by the workers and the calling thread. Ops get thread-count-independent results by
 * making each task compute a fixed set of outputs with a fixed reduction order: which thread runs
 * a task never changes what it computes.
 *
 * Ownership: ms_threadpool_init returns a pool owned by the caller (ms_threadpool_free, NULL
 * accepted). A pool is used by one calling thread at a time (the backend's stream); jobs do not
 * nest.
 *
 * Usage:
 *     ms_threadpool *pool;
 *     MS_TRY(ms_threadpool_init(&pool, 4, err));
 *     ms_threadpool_run(pool, n_rows, row_task, &args);   // returns when every task finished
 *     ms_threadpool_free(pool);
 */
#ifndef MS_THREADPOOL_H
#define MS_THREADPOOL_H

#include "ms_base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ms_threadpool ms_threadpool;

/* The most threads a pool runs (the caller included): the one limit of every --threads flag and
 * of ms_backend_cpu_options.n_threads. */
#define MS_THREADPOOL_MAX_THREADS 256

/* One task of a job: `task` in [0, n_tasks), `thread` in [0, n_threads) (0 = the caller). */
typedef void (*ms_threadpool_task_fn)(void *arg, int32_t task, int32_t thread);

/* Start a pool of n_threads (>= 1, including the caller: n_threads - 1 workers are started).
 * Returns MS_ERR_INVALID_ARG for n_threads outside [1, MS_THREADPOOL_MAX_THREADS], MS_ERR_OOM / MS_ERR_INTERNAL when
 * memory or a thread cannot be had (message names it). */
ms_status ms_threadpool_init(ms_threadpool **out, int32_t n_threads, ms_error *err);

/* Stop and join the workers, release the pool. NULL is a no-op. */
void ms_threadpool_free(ms_threadpool *pool);

/* Threads of the pool, the caller included. */
int32_t ms_threadpool_n_threads(const ms_threadpool *pool);

/* Run fn for every task in [0, n_tasks) and return when all finished. n_tasks <= 1 (or a pool of
 * one thread) runs inline on the caller. */
void ms_threadpool_run(ms_threadpool *pool, int32_t n_tasks, ms_threadpool_task_fn fn, void *arg);

#ifdef __cplusplus
}
#endif
#endif /* MS_THREADPOOL_H */
