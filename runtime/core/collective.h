/*
 * collective.h - the collectives a tensor-parallel group needs from its transport, as an
 * interface, plus an in-process group of threads that implements it (one rank per thread).
 *
 * Used by the host-side checks that must agree across ranks (resources/tp_check.h: every rank
 * allocated the same KV pages, reference §7.6 post_warmup_validate) and by tests that simulate
 * several ranks in one process. The NCCL implementation over GPUs lives in
 * backends/nccl_comm.h; a transport only has to provide all_gather over host buffers.
 *
 * Semantics follow MPI_Allgather / ncclAllGather: every rank of the group calls all_gather with
 * the same `bytes`; rank r's `bytes` land at recv + r * bytes on every rank; the call returns
 * when this rank's recv is complete. A rank that never calls blocks the others (as NCCL does);
 * the local group additionally fails every waiting rank with MS_ERR_STATE once any rank called
 * ms_collective_local_abort, so a failed rank cannot hang a test.
 *
 * Ownership: an ms_collective is a value (interface + context) borrowed by its users; whoever
 * made the context frees it (ms_collective_local_free for the local group).
 */
#ifndef MS_COLLECTIVE_H
#define MS_COLLECTIVE_H

#include "ms_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The transport's entries. */
typedef struct ms_collective_i {
    /* send [bytes] host -> recv [world * bytes] host, rank order. Errors: transport errors. */
    ms_status (*all_gather)(void *ctx, int32_t rank, const void *send, size_t bytes, void *recv,
                            ms_error *err);
    /* In-place sum over the group of buf [count] f32 host (MPI_Allreduce / ncclAllReduce with
     * ncclSum): every rank ends with the same bytes (the local group adds in rank order, so the
     * result does not depend on arrival order). count * 4 may exceed the transport's per-call
     * limit: ms_collective_all_reduce_sum_f32 splits it. Errors: transport errors. */
    ms_status (*all_reduce_sum_f32)(void *ctx, int32_t rank, float *buf, size_t count,
                                    ms_error *err);
    /* Largest all_gather / all_reduce payload per rank and call, in bytes. */
    size_t (*max_bytes)(void *ctx);
} ms_collective_i;

/* One rank's handle on its group. */
typedef struct ms_collective {
    const ms_collective_i *iface;
    void *ctx;
    int32_t rank;  /* 0 .. world - 1 */
    int32_t world; /* ranks in the group, >= 1 */
} ms_collective;

/* all_gather through c (see above). */
ms_status ms_collective_all_gather(const ms_collective *c, const void *send, size_t bytes,
                                   void *recv, ms_error *err);

/* all_reduce_sum_f32 through c, in pieces of at most max_bytes (tensor-parallel row-parallel
 * layers: o_proj, down_proj). Every rank must call with the same count. */
ms_status ms_collective_all_reduce_sum_f32(const ms_collective *c, float *buf, size_t count,
                                           ms_error *err);

/* ---- an in-process group: `world` threads, one per rank ---- */

typedef struct ms_collective_local ms_collective_local;

/* Make a group of `world` (1..1024) ranks with room for all_gathers of up to max_bytes per
 * rank. Errors: MS_ERR_INVALID_ARG, MS_ERR_OOM. */
ms_status ms_collective_local_init(int32_t world, size_t max_bytes, ms_collective_local **out,
                                   ms_error *err);
/* Rank `rank`'s handle (valid while the group lives). */
ms_collective ms_collective_local_rank(ms_collective_local *g, int32_t rank);
/* Make every current and later all_gather of the group fail with MS_ERR_STATE (a rank died). */
void ms_collective_local_abort(ms_collective_local *g);
/* Free the group (no rank may be inside a call). NULL is a no-op. */
void ms_collective_local_free(ms_collective_local *g);

#ifdef __cplusplus
}
#endif
#endif /* MS_COLLECTIVE_H */
