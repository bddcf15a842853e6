/*
 * collective.c - ms_collective_all_gather and the in-process group (see collective.h).
 *
 * The local group is a generation-counted rendezvous: each call copies its rank's bytes into a
 * shared staging buffer, the last rank to arrive bumps the generation and wakes the others, every
 * rank copies the whole buffer out, and a second count lets the buffer be reused only after all
 * ranks left (so back-to-back calls cannot overwrite bytes a slow rank is still reading).
 */
#include "collective.h"

#include <pthread.h>
#include <string.h>

struct ms_collective_local {
    int32_t world;
    size_t max_bytes;
    unsigned char *buf;   /* [world * max_bytes] */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t arrived;      /* ranks inside the current round */
    int32_t leaving;      /* ranks still to copy out of the finished round */
    uint64_t generation;  /* rounds finished */
    size_t round_bytes;   /* bytes of the current round (all ranks must agree) */
    bool aborted;
    bool mismatch;        /* a rank disagreed on bytes this round */
};

static const ms_collective_i local_iface;

ms_status ms_collective_all_gather(const ms_collective *c, const void *send, size_t bytes,
                                   void *recv, ms_error *err) {
    if (c == NULL || c->iface == NULL || c->iface->all_gather == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "collective: no transport");
    return c->iface->all_gather(c->ctx, c->rank, send, bytes, recv, err);
}

ms_status ms_collective_all_reduce_sum_f32(const ms_collective *c, float *buf, size_t count,
                                           ms_error *err) {
    if (c == NULL || c->iface == NULL || c->iface->all_reduce_sum_f32 == NULL ||
        c->iface->max_bytes == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "collective: no all-reduce in the transport");
    size_t piece = c->iface->max_bytes(c->ctx) / sizeof(float);
    if (piece == 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "collective: a transport of 0 bytes per call");
    for (size_t i = 0; i < count; i += piece) {
        size_t n = count - i < piece ? count - i : piece;
        MS_TRY(c->iface->all_reduce_sum_f32(c->ctx, c->rank, buf + i, n, err));
    }
    return MS_OK;
}

ms_status ms_collective_local_init(int32_t world, size_t max_bytes, ms_collective_local **out,
                                   ms_error *err) {
    *out = NULL;
    if (world < 1 || world > 1024 || max_bytes == 0 || max_bytes > ((size_t)1 << 24))
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "collective: local group of %d ranks x %zu bytes (1..1024 ranks, 1 B..16 MiB)",
                       world, max_bytes);
    ms_collective_local *g = ms_calloc(1, sizeof *g);
    if (g == NULL || (g->buf = ms_malloc((size_t)world * max_bytes)) == NULL) {
        ms_free(g);
        return MS_FAIL(err, MS_ERR_OOM, "collective: out of memory for %d ranks", world);
    }
    g->world = world;
    g->max_bytes = max_bytes;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    *out = g;
    return MS_OK;
}

ms_collective ms_collective_local_rank(ms_collective_local *g, int32_t rank) {
    ms_collective c = {&local_iface, g, rank, g->world};
    return c;
}

void ms_collective_local_abort(ms_collective_local *g) {
    pthread_mutex_lock(&g->mu);
    g->aborted = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

void ms_collective_local_free(ms_collective_local *g) {
    if (g == NULL)
        return;
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    ms_free(g->buf);
    ms_free(g);
}

/* One round: rank's `bytes` into its slot; when every rank arrived, `recv` receives every slot
 * in rank order (sum == false) or, viewed as f32, their sum added in rank order (sum == true). */
static ms_status local_round(ms_collective_local *g, int32_t rank, const void *send, size_t bytes,
                             void *recv, bool sum, ms_error *err) {
    if (rank < 0 || rank >= g->world)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "collective: rank %d of %d", rank, g->world);
    if (bytes > g->max_bytes)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "collective: all_gather of %zu bytes per rank, the group holds %zu", bytes,
                       g->max_bytes);
    pthread_mutex_lock(&g->mu);
    /* wait until the previous round has been copied out by every rank */
    while (g->leaving > 0 && !g->aborted)
        pthread_cond_wait(&g->cv, &g->mu);
    if (g->aborted) {
        pthread_mutex_unlock(&g->mu);
        return MS_FAIL(err, MS_ERR_STATE, "collective: the group was aborted (a rank failed)");
    }
    if (g->arrived == 0) {
        g->round_bytes = bytes;
        g->mismatch = false;
    } else if (bytes != g->round_bytes) {
        g->mismatch = true;
    }
    if (bytes > 0)
        memcpy(g->buf + (size_t)rank * g->max_bytes, send, bytes);
    uint64_t gen = g->generation;
    if (++g->arrived == g->world) {
        g->arrived = 0;
        g->leaving = g->world;
        g->generation++;
        pthread_cond_broadcast(&g->cv);
    } else {
        while (g->generation == gen && !g->aborted)
            pthread_cond_wait(&g->cv, &g->mu);
    }
    if (g->generation == gen) { /* aborted before the round completed */
        pthread_mutex_unlock(&g->mu);
        return MS_FAIL(err, MS_ERR_STATE, "collective: the group was aborted (a rank failed)");
    }
    bool mismatch = g->mismatch;
    size_t rb = g->round_bytes;
    if (!mismatch && sum) {
        float *out = recv;
        size_t n = rb / sizeof(float);
        memcpy(out, g->buf, n * sizeof(float));
        for (int32_t r = 1; r < g->world; r++) {
            const float *in = (const float *)(g->buf + (size_t)r * g->max_bytes);
            for (size_t i = 0; i < n; i++)
                out[i] += in[i];
        }
    } else if (!mismatch) {
        for (int32_t r = 0; r < g->world; r++)
            if (rb > 0)
                memcpy((unsigned char *)recv + (size_t)r * rb, g->buf + (size_t)r * g->max_bytes,
                       rb);
    }
    if (--g->leaving == 0)
        pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    if (mismatch)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "collective: ranks called all_gather with different sizes (%zu here)",
                       bytes);
    return MS_OK;
}

static ms_status local_all_gather(void *ctx, int32_t rank, const void *send, size_t bytes,
                                  void *recv, ms_error *err) {
    return local_round(ctx, rank, send, bytes, recv, false, err);
}

static ms_status local_all_reduce(void *ctx, int32_t rank, float *buf, size_t count,
                                  ms_error *err) {
    return local_round(ctx, rank, buf, count * sizeof(float), buf, true, err);
}

static size_t local_max_bytes(void *ctx) { return ((ms_collective_local *)ctx)->max_bytes; }

static const ms_collective_i local_iface = {local_all_gather, local_all_reduce, local_max_bytes};
