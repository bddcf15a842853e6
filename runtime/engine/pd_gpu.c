/*
 * pd_gpu.c - [pd] NCCL and CUDA IPC KV transfers (pd_gpu.h). Written and compiled without a
 * GPU: never run yet (tests/test_pd_gpu.c is their test).
 */
#include "pd_gpu.h"

#include <string.h>

#include "cuda_check.h"

/* ---- pending transfers: a handle per start, an event recorded after its copies ---- */

typedef struct gpu_pending {
    uint64_t handle;
    cudaEvent_t ev;
    bool failed;
} gpu_pending;

struct ms_pd_gpu_xfer {
    gpu_pending *p;
    size_t n, cap;
    uint64_t next;
};

static ms_status pending_add(ms_pd_gpu_xfer *x, cudaStream_t s, uint64_t *handle,
                             ms_error *err) {
    if (ms_grow((void **)&x->p, &x->cap, x->n + 1, sizeof *x->p) != MS_OK)
        return MS_FAIL(err, MS_ERR_OOM, "pd transfer: out of memory");
    cudaEvent_t ev = NULL;
    MS_CUDA_TRY(err, cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    cudaError_t ce = cudaEventRecord(ev, s);
    if (ce != cudaSuccess) {
        cudaEventDestroy(ev);
        return MS_FAIL(err, MS_ERR_CUDA, "pd transfer: cudaEventRecord: %s",
                       cudaGetErrorString(ce));
    }
    x->p[x->n++] = (gpu_pending){.handle = ++x->next, .ev = ev};
    *handle = x->next;
    return MS_OK;
}

static gpu_pending *pending_find(ms_pd_gpu_xfer *x, uint64_t h) {
    for (size_t i = 0; i < x->n; i++)
        if (x->p[i].handle == h)
            return &x->p[i];
    return NULL;
}

static ms_kv_transfer_state pending_poll(ms_pd_gpu_xfer *x, uint64_t h, bool block) {
    gpu_pending *p = pending_find(x, h);
    if (p == NULL || p->failed)
        return MS_KV_TRANSFER_FAILED;
    cudaError_t ce = block ? cudaEventSynchronize(p->ev) : cudaEventQuery(p->ev);
    if (ce == cudaErrorNotReady)
        return MS_KV_TRANSFER_PENDING;
    if (ce != cudaSuccess) {
        p->failed = true;
        return MS_KV_TRANSFER_FAILED;
    }
    return MS_KV_TRANSFER_DONE;
}

static void pending_release(ms_pd_gpu_xfer *x, uint64_t h) {
    for (size_t i = 0; i < x->n; i++)
        if (x->p[i].handle == h) {
            cudaEventDestroy(x->p[i].ev);
            x->p[i] = x->p[--x->n];
            return;
        }
}

static void pending_free(ms_pd_gpu_xfer *x) {
    for (size_t i = 0; i < x->n; i++) {
        cudaEventSynchronize(x->p[i].ev);
        cudaEventDestroy(x->p[i].ev);
    }
    ms_free(x->p);
    memset(x, 0, sizeof *x);
}

/* Byte offset of (layer, page) in an arena of n_pages pages (page_arena.h layout). */
static size_t page_off(int32_t layer, int32_t n_pages, int32_t page, size_t page_bytes) {
    return ((size_t)layer * (size_t)n_pages + (size_t)page) * page_bytes;
}

/* Pages [first, last] of a desc, checked against the local list. */
static ms_status desc_range(const ms_kv_transfer_desc *d, int32_t *first, int32_t *last,
                            ms_error *err) {
    *first = (d->token_begin - d->start) / d->page_size;
    *last = d->token_end > d->token_begin ? (d->token_end - 1 - d->start) / d->page_size : -1;
    if (*first < 0 || *last >= d->n_local_pages || *last >= d->n_remote_pages)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "pd transfer: request %llu: pages %d..%d of %d "
                       "local / %d remote", (unsigned long long)d->rid, (int)*first, (int)*last,
                       (int)d->n_local_pages, (int)d->n_remote_pages);
    return MS_OK;
}

/* ---- NCCL ---- */

struct ms_pd_nccl {
    ms_nccl_comm *comm;
    int32_t peer;
    ms_page_arena *arena;
    cudaStream_t stream;
    void *skip;                 /* one page of one layer: pages this pool already holds */
    ms_nccl_p2p_op *ops;
    size_t cap_ops;
    ms_pd_gpu_xfer x;
};

ms_status ms_pd_nccl_init(ms_nccl_comm *comm, int32_t peer, ms_page_arena *arena,
                          ms_pd_nccl **out, ms_error *err) {
    *out = NULL;
    if (comm == NULL || arena == NULL || peer < 0 || peer == ms_nccl_rank(comm))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "pd nccl: peer %d (this rank %d)", (int)peer,
                       comm != NULL ? (int)ms_nccl_rank(comm) : -1);
    ms_pd_nccl *x = ms_calloc(1, sizeof *x);
    if (x == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "pd nccl: out of memory");
    x->comm = comm;
    x->peer = peer;
    x->arena = arena;
    cudaError_t ce = cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking);
    if (ce == cudaSuccess)
        ce = cudaMalloc(&x->skip, ms_page_arena_get_size(arena)->page_bytes);
    if (ce != cudaSuccess) {
        ms_pd_nccl_free(x);
        return MS_FAIL(err, MS_ERR_CUDA, "pd nccl: %s", cudaGetErrorString(ce));
    }
    *out = x;
    return MS_OK;
}

void ms_pd_nccl_free(ms_pd_nccl *x) {
    if (x == NULL)
        return;
    pending_free(&x->x);
    cudaFree(x->skip);
    if (x->stream != NULL)
        cudaStreamDestroy(x->stream);
    ms_free(x->ops);
    ms_free(x);
}

static ms_status nccl_ops_grow(ms_pd_nccl *x, size_t n, ms_error *err) {
    if (ms_grow((void **)&x->ops, &x->cap_ops, n, sizeof *x->ops) != MS_OK)
        return MS_FAIL(err, MS_ERR_OOM, "pd nccl: out of memory");
    return MS_OK;
}

ms_status ms_pd_nccl_send(ms_pd_nccl *x, const ms_kv_published *pub, ms_error *err) {
    const ms_page_arena_config *cfg = ms_page_arena_get_config(x->arena);
    const size_t pb = ms_page_arena_get_size(x->arena)->page_bytes;
    const int32_t n_pages = ms_page_arena_num_pages(x->arena);
    uint8_t *base = ms_page_arena_data(x->arena);
    size_t n = 0;
    for (int32_t i = 0; i < pub->n_streams; i++) {
        const ms_kv_published_stream *s = &pub->streams[i];
        MS_TRY(nccl_ops_grow(x, n + (size_t)s->n_pages * (size_t)cfg->n_layers, err));
        for (int32_t j = 0; j < s->n_pages; j++) {
            if (s->pages[j] <= 0 || s->pages[j] >= n_pages)
                return MS_FAIL(err, MS_ERR_INVALID_ARG, "pd nccl: request %llu: page %d outside "
                               "the arena", (unsigned long long)pub->rid, (int)s->pages[j]);
            for (int32_t l = 0; l < cfg->n_layers; l++)
                x->ops[n++] = (ms_nccl_p2p_op){
                    .send = true, .buf = base + page_off(l, n_pages, s->pages[j], pb),
                    .bytes = pb, .peer = x->peer};
        }
    }
    return ms_nccl_p2p(x->comm, x->ops, (int32_t)n, NULL, err);
}

static ms_status nccl_start(void *ctx, const ms_kv_transfer_desc *d, uint64_t *handle,
                            ms_error *err) {
    ms_pd_nccl *x = ctx;
    int32_t first, last;
    MS_TRY(desc_range(d, &first, &last, err));
    const ms_page_arena_config *cfg = ms_page_arena_get_config(x->arena);
    const size_t pb = ms_page_arena_get_size(x->arena)->page_bytes;
    const int32_t n_pages = ms_page_arena_num_pages(x->arena);
    uint8_t *base = ms_page_arena_data(x->arena);
    if (d->compute_done != NULL)
        MS_CUDA_TRY(err, cudaStreamWaitEvent(x->stream, (cudaEvent_t)(void *)d->compute_done, 0));
    /* the sender sends every page from the stream's first: held ones land in `skip` */
    size_t n = 0;
    MS_TRY(nccl_ops_grow(x, (size_t)(last + 1) * (size_t)cfg->n_layers + 1, err));
    for (int32_t j = 0; j <= last; j++)
        for (int32_t l = 0; l < cfg->n_layers; l++)
            x->ops[n++] = (ms_nccl_p2p_op){
                .send = false,
                .buf = j < first ? x->skip : base + page_off(l, n_pages, d->local_pages[j], pb),
                .bytes = pb, .peer = x->peer};
    MS_TRY(ms_nccl_p2p(x->comm, x->ops, (int32_t)n, x->stream, err));
    return pending_add(&x->x, x->stream, handle, err);
}

static ms_kv_transfer_state nccl_poll(void *ctx, uint64_t h) {
    return pending_poll(&((ms_pd_nccl *)ctx)->x, h, false);
}
static ms_kv_transfer_state nccl_wait(void *ctx, uint64_t h) {
    return pending_poll(&((ms_pd_nccl *)ctx)->x, h, true);
}
static void nccl_release(void *ctx, uint64_t h) { pending_release(&((ms_pd_nccl *)ctx)->x, h); }

static const ms_kv_transfer_i nccl_iface = {nccl_start, nccl_poll, nccl_wait, nccl_release};
const ms_kv_transfer_i *ms_pd_nccl_iface(void) { return &nccl_iface; }

/* ---- CUDA IPC ---- */

struct ms_pd_ipc {
    ms_pd_ipc_handle h;
    void *remote;               /* the peer's arena, opened */
    ms_page_arena *arena;
    cudaStream_t stream;
    ms_pd_gpu_xfer x;
};

ms_status ms_pd_ipc_export(ms_page_arena *arena, ms_pd_ipc_handle *out, ms_error *err) {
    memset(out, 0, sizeof *out);
    cudaIpcMemHandle_t h;
    _Static_assert(sizeof h == sizeof out->handle, "cudaIpcMemHandle_t is 64 bytes");
    MS_CUDA_TRY(err, cudaIpcGetMemHandle(&h, ms_page_arena_data(arena)));
    memcpy(out->handle, &h, sizeof h);
    const ms_page_arena_config *cfg = ms_page_arena_get_config(arena);
    out->n_layers = cfg->n_layers;
    out->n_pages = ms_page_arena_num_pages(arena);
    out->page_size = cfg->page_size;
    out->page_bytes = ms_page_arena_get_size(arena)->page_bytes;
    return MS_OK;
}

ms_status ms_pd_ipc_open(const ms_pd_ipc_handle *h, ms_page_arena *arena, ms_pd_ipc **out,
                         ms_error *err) {
    *out = NULL;
    const ms_page_arena_config *cfg = ms_page_arena_get_config(arena);
    if (h->n_layers != cfg->n_layers || h->page_size != cfg->page_size ||
        h->page_bytes != ms_page_arena_get_size(arena)->page_bytes || h->n_pages < 2)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "pd ipc: the peer's arena (%d layers, pages of "
                       "%d tokens / %llu bytes) differs from this one (%d layers, %d tokens)",
                       (int)h->n_layers, (int)h->page_size, (unsigned long long)h->page_bytes,
                       (int)cfg->n_layers, (int)cfg->page_size);
    ms_pd_ipc *x = ms_calloc(1, sizeof *x);
    if (x == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "pd ipc: out of memory");
    x->h = *h;
    x->arena = arena;
    cudaIpcMemHandle_t mh;
    memcpy(&mh, h->handle, sizeof mh);
    cudaError_t ce = cudaIpcOpenMemHandle(&x->remote, mh, cudaIpcMemLazyEnablePeerAccess);
    if (ce == cudaSuccess)
        ce = cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking);
    if (ce != cudaSuccess) {
        ms_pd_ipc_free(x);
        return MS_FAIL(err, MS_ERR_CUDA, "pd ipc: cudaIpcOpenMemHandle / stream: %s",
                       cudaGetErrorString(ce));
    }
    *out = x;
    return MS_OK;
}

void ms_pd_ipc_free(ms_pd_ipc *x) {
    if (x == NULL)
        return;
    pending_free(&x->x);
    if (x->stream != NULL)
        cudaStreamDestroy(x->stream);
    if (x->remote != NULL)
        cudaIpcCloseMemHandle(x->remote);
    ms_free(x);
}

static ms_status ipc_start(void *ctx, const ms_kv_transfer_desc *d, uint64_t *handle,
                           ms_error *err) {
    ms_pd_ipc *x = ctx;
    int32_t first, last;
    MS_TRY(desc_range(d, &first, &last, err));
    const size_t pb = (size_t)x->h.page_bytes;
    const int32_t n_local = ms_page_arena_num_pages(x->arena);
    uint8_t *base = ms_page_arena_data(x->arena);
    const uint8_t *rbase = x->remote;
    if (d->compute_done != NULL)
        MS_CUDA_TRY(err, cudaStreamWaitEvent(x->stream, (cudaEvent_t)(void *)d->compute_done, 0));
    for (int32_t j = first; j <= last; j++) {
        int32_t lp = d->local_pages[j], rp = d->remote_pages[j];
        if (lp <= 0 || lp >= n_local || rp <= 0 || rp >= x->h.n_pages)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "pd ipc: request %llu: page %d / remote %d "
                           "outside the arenas", (unsigned long long)d->rid, (int)lp, (int)rp);
        for (int32_t l = 0; l < x->h.n_layers; l++)
            MS_CUDA_TRY(err, cudaMemcpyAsync(base + page_off(l, n_local, lp, pb),
                                             rbase + page_off(l, x->h.n_pages, rp, pb), pb,
                                             cudaMemcpyDeviceToDevice, x->stream));
    }
    return pending_add(&x->x, x->stream, handle, err);
}

static ms_kv_transfer_state ipc_poll(void *ctx, uint64_t h) {
    return pending_poll(&((ms_pd_ipc *)ctx)->x, h, false);
}
static ms_kv_transfer_state ipc_wait(void *ctx, uint64_t h) {
    return pending_poll(&((ms_pd_ipc *)ctx)->x, h, true);
}
static void ipc_release(void *ctx, uint64_t h) { pending_release(&((ms_pd_ipc *)ctx)->x, h); }

static const ms_kv_transfer_i ipc_iface = {ipc_start, ipc_poll, ipc_wait, ipc_release};
const ms_kv_transfer_i *ms_pd_ipc_iface(void) { return &ipc_iface; }
