/*
 * device_cuda.h - the CUDA implementation of the device interface (device.h): cudaMalloc /
 * cudaFree, cudaMemsetAsync / cudaMemcpyAsync on streams, events, cudaMemGetInfo. CUDA builds
 * only (MS_HAVE_CUDA).
 *
 * A NULL stream means "synchronous": the device is synchronised before and after the operation,
 * so it is ordered after everything queued on any stream (the CUDA backend's non-blocking stream
 * included) and complete when the call returns. Streams are non-blocking cudaStream_t, events
 * are cudaEvent_t with timing disabled. Every CUDA call is checked (cuda_check.h).
 *
 * Ownership: as device.h; the device returned by ms_device_cuda_init is released with
 * ms_device_free.
 */
#ifndef MS_DEVICE_CUDA_H
#define MS_DEVICE_CUDA_H

#include "device.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Create the CUDA device for ordinal `ordinal` (cudaSetDevice) into *out (named "cuda:N").
 * Errors: MS_ERR_CUDA when no such device is usable (one line naming the device and the
 * runtime's reason, e.g. "cuda:0: no CUDA-capable device is detected"), MS_ERR_OOM. *out is NULL
 * on failure.
 */
ms_status ms_device_cuda_init(int32_t ordinal, ms_device **out, ms_error *err);

/*
 * Create the pinned host memory of CUDA device `ordinal` into *out (named "cuda:N.pinned"): alloc
 * is cudaHostAlloc(cudaHostAllocPortable), free cudaFreeHost, memset a host memset after the
 * stream's (NULL: the device's) queued work, mem_info reports no limit; copies, streams and
 * events are the CUDA device's (unified addressing: cudaMemcpyAsync reaches pinned memory, so
 * device <-> pinned copies are true DMA and may overlap compute). The KV pool's offload tier
 * (the engine's host arena, --host-kv-pages) lives here. Errors: ms_device_cuda_init's;
 * MS_ERR_OOM from alloc when the host refuses to pin.
 */
ms_status ms_device_cuda_host_init(int32_t ordinal, ms_device **out, ms_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MS_DEVICE_CUDA_H */
