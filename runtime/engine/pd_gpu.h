/*
 * pd_gpu.h - [pd] the GPU KV transfers behind ms_kv_transfer_i (kv_pool.h), CUDA builds only
 * (MS_HAVE_CUDA). WRITTEN AND COMPILED, NEVER RUN: no GPU was lent when they were written; their
 * tests are tests/test_pd_gpu.c (GPU_TESTS, scripts/gpu-batch.sh), docs/pd.md.
 *
 * NCCL (engines on different GPUs, nccl_comm.h ms_nccl_p2p): the prefill engine's rank sends
 * every page of every published stream, every layer, page_bytes each, in stream order, page
 * order, layer order (ms_pd_nccl_send); the decode engine's pool receives them through
 * ms_pd_nccl_iface() in the same order, pages it already holds into a one-page staging buffer.
 * The two sides pair one send with one admit_retrieve, request by request, in the same order
 * (the record travels beside, e.g. through serve's /v1/pd/prefill without its payload).
 *
 * CUDA IPC (two processes on one GPU): the prefill process exports its arena
 * (ms_pd_ipc_export: cudaIpcGetMemHandle on the arena tensor plus its geometry); the decode
 * process opens it once (ms_pd_ipc_open: cudaIpcOpenMemHandle; CUDA refuses to open a handle in
 * the process that made it) and its pool pulls pages with cudaMemcpyAsync device to device
 * from the publisher's page ids (desc->remote_pages). The publisher keeps the pages until the
 * decode side's admit finished (it must not remove the request before).
 *
 * Both order their writes after desc->compute_done (cudaStreamWaitEvent), run on a stream of
 * their own and report PENDING until an event recorded after the copies completes.
 *
 * Ownership: the contexts are owned by the caller (ms_pd_nccl_free / ms_pd_ipc_free) and
 * borrow the communicator and the arena, which must outlive them.
 */
#ifndef MS_PD_GPU_H
#define MS_PD_GPU_H

#include "kv_pool.h"
#include "nccl_comm.h"
#include "page_arena.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ms_pd_gpu_xfer ms_pd_gpu_xfer; /* the pending transfers of a context */

/* NCCL transfer context: `comm` joined by both engines, `peer` the other engine's rank. */
typedef struct ms_pd_nccl ms_pd_nccl;

/* Create a context over `arena` (a CUDA arena). Errors: MS_ERR_INVALID_ARG (peer is this rank
 * or out of range), MS_ERR_CUDA, MS_ERR_OOM. */
ms_status ms_pd_nccl_init(ms_nccl_comm *comm, int32_t peer, ms_page_arena *arena,
                          ms_pd_nccl **out, ms_error *err);
void ms_pd_nccl_free(ms_pd_nccl *x);

/* The receiving interface (ctx: an ms_pd_nccl). */
const ms_kv_transfer_i *ms_pd_nccl_iface(void);

/* Send every page of `pub` (published from a pool over x's arena) to the peer, synchronously.
 * Errors: MS_ERR_INVALID_ARG (a page outside the arena), ms_nccl_p2p's. */
ms_status ms_pd_nccl_send(ms_pd_nccl *x, const ms_kv_published *pub, ms_error *err);

/* What a prefill process hands a decode process on the same GPU to read its arena. */
typedef struct ms_pd_ipc_handle {
    char handle[64];        /* cudaIpcMemHandle_t */
    int32_t n_layers;
    int32_t n_pages;        /* of the exporting arena (its layer stride) */
    int32_t page_size;
    uint64_t page_bytes;
} ms_pd_ipc_handle;

/* Export `arena` (CUDA). Errors: MS_ERR_CUDA. */
ms_status ms_pd_ipc_export(ms_page_arena *arena, ms_pd_ipc_handle *out, ms_error *err);

typedef struct ms_pd_ipc ms_pd_ipc;

/* Open a peer's exported arena for copies into `arena` (same page geometry). Errors:
 * MS_ERR_INVALID_ARG (geometry differs), MS_ERR_CUDA (cudaIpcOpenMemHandle, e.g. the same
 * process or another GPU), MS_ERR_OOM. */
ms_status ms_pd_ipc_open(const ms_pd_ipc_handle *h, ms_page_arena *arena, ms_pd_ipc **out,
                         ms_error *err);
void ms_pd_ipc_free(ms_pd_ipc *x);

/* The receiving interface (ctx: an ms_pd_ipc). */
const ms_kv_transfer_i *ms_pd_ipc_iface(void);

#ifdef __cplusplus
}
#endif
#endif /* MS_PD_GPU_H */
