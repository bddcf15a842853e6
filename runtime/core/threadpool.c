/*
 * threadpool.c - fixed pthreads pool (threadpool.h). Workers sleep on a condition variable
 * between jobs; tasks are claimed with an atomic counter; the caller works too and then waits
 * until every worker has left the job.
 */
#include "threadpool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

struct ms_threadpool {
    int32_t n_threads;          /* including the caller */
    pthread_t *threads;         /* [n_threads - 1] workers */
    int32_t n_started;          /* workers actually started */
    pthread_mutex_t mu;
    pthread_cond_t cv_work;     /* a new job or stop */
    pthread_cond_t cv_done;     /* the last worker left the job */
    uint64_t generation;        /* job counter (under mu) */
    bool stop;                  /* under mu */
    ms_threadpool_task_fn fn;   /* current job (under mu) */
    void *arg;
    int32_t n_tasks;
    atomic_int next_task;       /* next unclaimed task of the current job */
    int32_t active;             /* workers still in the current job (under mu) */
};

typedef struct worker_arg {
    ms_threadpool *pool;
    int32_t index;
} worker_arg;

static void run_tasks(ms_threadpool *pool, ms_threadpool_task_fn fn, void *arg, int32_t n_tasks,
                      int32_t thread) {
    for (;;) {
        int t = atomic_fetch_add_explicit(&pool->next_task, 1, memory_order_relaxed);
        if (t >= n_tasks)
            break;
        fn(arg, (int32_t)t, thread);
    }
}

static void *worker_main(void *p) {
    ms_threadpool *pool = ((worker_arg *)p)->pool;
    int32_t index = ((worker_arg *)p)->index;
    ms_free(p);
    uint64_t seen = 0;
    pthread_mutex_lock(&pool->mu);
    for (;;) {
        while (!pool->stop && pool->generation == seen)
            pthread_cond_wait(&pool->cv_work, &pool->mu);
        if (pool->stop)
            break;
        seen = pool->generation;
        ms_threadpool_task_fn fn = pool->fn;
        void *arg = pool->arg;
        int32_t n_tasks = pool->n_tasks;
        pthread_mutex_unlock(&pool->mu);
        run_tasks(pool, fn, arg, n_tasks, index);
        pthread_mutex_lock(&pool->mu);
        if (--pool->active == 0)
            pthread_cond_signal(&pool->cv_done);
    }
    pthread_mutex_unlock(&pool->mu);
    return NULL;
}

ms_status ms_threadpool_init(ms_threadpool **out, int32_t n_threads, ms_error *err) {
    *out = NULL;
    if (n_threads < 1 || n_threads > MS_THREADPOOL_MAX_THREADS)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "threadpool: n_threads %d outside [1, %d]",
                       n_threads, MS_THREADPOOL_MAX_THREADS);
    ms_threadpool *pool = ms_calloc(1, sizeof *pool);
    if (pool == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "threadpool: out of memory");
    pool->n_threads = n_threads;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv_work, NULL);
    pthread_cond_init(&pool->cv_done, NULL);
    atomic_init(&pool->next_task, 0);
    if (n_threads > 1) {
        pool->threads = ms_calloc((size_t)(n_threads - 1), sizeof *pool->threads);
        if (pool->threads == NULL) {
            ms_threadpool_free(pool);
            return MS_FAIL(err, MS_ERR_OOM, "threadpool: out of memory");
        }
    }
    for (int32_t i = 1; i < n_threads; i++) {
        worker_arg *wa = ms_malloc(sizeof *wa);
        if (wa == NULL) {
            ms_threadpool_free(pool);
            return MS_FAIL(err, MS_ERR_OOM, "threadpool: out of memory");
        }
        wa->pool = pool;
        wa->index = i;
        int rc = pthread_create(&pool->threads[i - 1], NULL, worker_main, wa);
        if (rc != 0) {
            ms_free(wa);
            ms_threadpool_free(pool);
            return MS_FAIL(err, MS_ERR_INTERNAL, "threadpool: cannot start thread %d of %d: %s",
                           i, n_threads, strerror(rc));
        }
        pool->n_started++;
    }
    *out = pool;
    return MS_OK;
}

void ms_threadpool_free(ms_threadpool *pool) {
    if (pool == NULL)
        return;
    pthread_mutex_lock(&pool->mu);
    pool->stop = true;
    pthread_cond_broadcast(&pool->cv_work);
    pthread_mutex_unlock(&pool->mu);
    for (int32_t i = 0; i < pool->n_started; i++)
        pthread_join(pool->threads[i], NULL);
    pthread_cond_destroy(&pool->cv_done);
    pthread_cond_destroy(&pool->cv_work);
    pthread_mutex_destroy(&pool->mu);
    ms_free(pool->threads);
    ms_free(pool);
}

int32_t ms_threadpool_n_threads(const ms_threadpool *pool) {
    return pool->n_threads;
}

void ms_threadpool_run(ms_threadpool *pool, int32_t n_tasks, ms_threadpool_task_fn fn, void *arg) {
    if (n_tasks <= 0)
        return;
    if (n_tasks == 1 || pool->n_started == 0) {
        for (int32_t t = 0; t < n_tasks; t++)
            fn(arg, t, 0);
        return;
    }
    pthread_mutex_lock(&pool->mu);
    pool->fn = fn;
    pool->arg = arg;
    pool->n_tasks = n_tasks;
    atomic_store_explicit(&pool->next_task, 0, memory_order_relaxed);
    pool->active = pool->n_started;
    pool->generation++;
    pthread_cond_broadcast(&pool->cv_work);
    pthread_mutex_unlock(&pool->mu);
    run_tasks(pool, fn, arg, n_tasks, 0);
    pthread_mutex_lock(&pool->mu);
    while (pool->active > 0)
        pthread_cond_wait(&pool->cv_done, &pool->mu);
    pthread_mutex_unlock(&pool->mu);
}
