/*
 * nccl_comm.h - NCCL communicators for tensor parallelism: one rank per GPU, the all-reduce of
 * row-parallel layers, and the all-gather behind core/collective.h (so host-side checks such as
 * resources/tp_check.h run over the same transport as the model).
 *
 * libnccl.so.2 is loaded with dlopen on first use, not linked: every binary starts and runs its
 * one-GPU and CPU paths on machines without NCCL, and only --tp > 1 needs it. Missing library or
 * symbols: MS_ERR_UNSUPPORTED naming the library. NVLink multicast (NVLS) is always turned off
 * (NCCL_NVLS_ENABLE=0 is set before the first communicator): on the shared H200 hosts a program
 * using it can take the host's GPUs out of service (the device tool's KINDS.md).
 *
 * Ownership: ms_nccl_comm_init returns a communicator owned by the caller (ms_nccl_comm_free).
 * The collective from ms_nccl_collective borrows it. Thread safety: one communicator per thread
 * (per rank); calls on one communicator are not concurrent.
 */
#ifndef MS_NCCL_COMM_H
#define MS_NCCL_COMM_H

#include "backend.h"
#include "collective.h"
#include "ms_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The group's rendezvous id (ncclUniqueId): made by rank 0, handed to every rank. */
typedef struct ms_nccl_id {
    char bytes[128];
} ms_nccl_id;

typedef struct ms_nccl_comm ms_nccl_comm;

/* Whether NCCL can be loaded here; *version receives ncclGetVersion's code (e.g. 22703). */
bool ms_nccl_available(int *version);

/* A fresh rendezvous id (ncclGetUniqueId). Errors: MS_ERR_UNSUPPORTED (no NCCL), MS_ERR_CUDA. */
ms_status ms_nccl_unique_id(ms_nccl_id *out, ms_error *err);

/*
 * Join the group `id` as rank `rank` of `world` on CUDA device `device` (ncclCommInitRank; every
 * rank must call, each on its own GPU: NCCL refuses two ranks on one GPU). max_gather_bytes sizes
 * the device staging buffers of the host all_gather. Errors: MS_ERR_INVALID_ARG,
 * MS_ERR_UNSUPPORTED, MS_ERR_CUDA (naming the NCCL or CUDA error), MS_ERR_OOM.
 */
ms_status ms_nccl_comm_init(int device, int32_t rank, int32_t world, const ms_nccl_id *id,
                            size_t max_gather_bytes, ms_nccl_comm **out, ms_error *err);

/* Release the communicator (NULL is a no-op). */
void ms_nccl_comm_free(ms_nccl_comm *c);

/*
 * In-place sum over the group of `count` elements of `dtype` (f32, bf16 or f16) at device
 * address buf, queued on `stream` (a cudaStream_t; NULL: the communicator's own stream, then
 * waited for). Row-parallel o_proj / down_proj outputs. Errors: MS_ERR_INVALID_ARG (dtype),
 * MS_ERR_CUDA.
 */
ms_status ms_nccl_all_reduce_sum(ms_nccl_comm *c, void *buf, size_t count, ms_dtype dtype,
                                 void *stream, ms_error *err);

/*
 * All-gather of each rank's [rows, cols] f32 block (device, contiguous) into the columns of out
 * [rows, out_cols] (device, row stride out_stride elements): rank r's block lands at columns
 * [r * cols, min(out_cols, (r + 1) * cols)), so a padded last shard is cut (vocabulary-parallel
 * lm_head: cols = ceil(V / world), out_cols = V). Staged through the communicator's gather
 * buffer (rows * cols * 4 <= max_gather_bytes), queued on `stream` (NULL: the communicator's,
 * waited for). Errors: MS_ERR_INVALID_ARG (shapes, too large), MS_ERR_CUDA.
 */
ms_status ms_nccl_all_gather_rows(ms_nccl_comm *c, const float *send, int64_t rows,
                                  int64_t cols, float *out, int64_t out_stride, int64_t out_cols,
                                  void *stream, ms_error *err);

/* The communicator as a core/collective.h transport (host all_gather and f32 all-reduce staged
 * through device buffers, synchronous). */
ms_collective ms_nccl_collective(ms_nccl_comm *c);

/* [pd] One point-to-point operation: send or receive `bytes` at device address buf to / from
 * rank `peer`. */
typedef struct ms_nccl_p2p_op {
    bool send;     /* true: ncclSend, false: ncclRecv */
    void *buf;     /* device memory */
    size_t bytes;
    int32_t peer;
} ms_nccl_p2p_op;

/*
 * [pd] Run ops[0..n) as one NCCL group (ncclGroupStart / ncclSend / ncclRecv / ncclGroupEnd,
 * bytes as ncclUint8) on `stream` (a cudaStream_t; NULL: the communicator's, then waited for).
 * The peer runs the matching ops in the same order. KV pages from a prefill engine's arena to a
 * decode engine's (docs/pd.md). Errors: MS_ERR_UNSUPPORTED (no NCCL, or one without
 * send/recv), MS_ERR_INVALID_ARG (a peer out of range or this rank), MS_ERR_CUDA.
 */
ms_status ms_nccl_p2p(ms_nccl_comm *c, const ms_nccl_p2p_op *ops, int32_t n, void *stream,
                      ms_error *err);

/* [pd] This communicator's rank. */
int32_t ms_nccl_rank(const ms_nccl_comm *c);

#ifdef __cplusplus
}
#endif
#endif /* MS_NCCL_COMM_H */
