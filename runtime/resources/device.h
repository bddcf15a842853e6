/*
 * device.h - the small device memory interface the runtime's pools sit on: allocate, free,
 * memset, synchronous and stream-ordered copies, events, synchronisation.
 *
 * One vtable (ms_device_i) with two implementations: the host device below (plain host buffers,
 * every operation executes immediately; used by the tests and the CPU backend) and a CUDA device
 * (cudaMalloc / cudaMemcpyAsync / cudaEvent*, added by the CUDA backend). Streams and events are
 * opaque handles owned by the device that made them, so a cudaStream_t / cudaEvent_t fits them
 * unchanged.
 *
 * Ordering rule (hazard H4 of the reference): a copy on stream B that reads memory written by
 * work queued on stream A must be preceded by `event_record(ev, A)` and `stream_wait(B, ev)`.
 * The KV pool's offload does exactly this before its device-to-host copies, and makes the compute
 * stream wait for the copy stream before released pages can be reused.
 *
 * The offload tier is a page arena on a second device whose alloc returns pinned host memory
 * (cudaMallocHost on the CUDA side, plain memory on the host device). Copies between the two
 * tiers are issued on the GPU-side arena's device (cudaMemcpyAsync with unified addressing), on
 * that device's streams.
 *
 * Ownership: ms_device_* functions borrow their arguments; a device returned by
 * ms_device_host_init is owned by the caller and released with ms_device_free, after every
 * buffer, stream and event made from it has been freed.
 *
 * Usage:
 *     ms_device *dev = NULL;
 *     MS_TRY(ms_device_host_init(0, &dev, err));
 *     void *p = NULL;
 *     MS_TRY(ms_device_alloc(dev, 4096, "kv.pages", &p, err));
 *     ...
 *     ms_device_free_mem(dev, p);
 *     ms_device_free(dev);
 */
#ifndef MS_DEVICE_H
#define MS_DEVICE_H

#include "ms_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Opaque stream and event handles (cudaStream_t / cudaEvent_t on the CUDA device). */
typedef struct ms_device_stream ms_device_stream;
typedef struct ms_device_event ms_device_event;

/* Direction of a copy (cudaMemcpyKind order; the host device treats all alike).
 * ORDER MS_COPY */
typedef enum ms_copy_kind {
    MS_COPY_H2H = 0,
    MS_COPY_H2D,
    MS_COPY_D2H,
    MS_COPY_D2D,
    MS_COPY_KIND_COUNT
} ms_copy_kind;

/* Static text of a copy kind ("h2d", ...). */
const char *ms_copy_kind_str(ms_copy_kind kind);

/*
 * Device interface. `self` is ms_device.ctx. Every fallible entry fills `err` (may be NULL) and
 * returns an ms_status; `name` arguments label allocations in messages ("kv.pages").
 */
typedef struct ms_device_i {
    const char *name;  /* "host", "cuda:0", ... */
    /* Bytes still allocatable and the total (cudaMemGetInfo); used to size pools. */
    ms_status (*mem_info)(void *self, size_t *free_bytes, size_t *total_bytes, ms_error *err);
    /* Allocate `bytes` of device memory (not initialised). */
    ms_status (*alloc)(void *self, size_t bytes, const char *name, void **out, ms_error *err);
    /* Free memory from alloc (NULL is a no-op). Waits for nothing: callers synchronise first. */
    void (*free)(void *self, void *ptr);
    /* Set `bytes` bytes at `ptr` to `value`, ordered on `stream` (NULL: synchronous). */
    ms_status (*memset)(void *self, void *ptr, int value, size_t bytes, ms_device_stream *stream,
                        ms_error *err);
    /* Copy `bytes` from src to dst, ordered on `stream` (NULL: synchronous, cudaMemcpy). With a
     * stream the copy may still run when this returns; src and dst must not overlap. */
    ms_status (*copy)(void *self, void *dst, const void *src, size_t bytes, ms_copy_kind kind,
                      ms_device_stream *stream, ms_error *err);
    /* Create / destroy a stream. */
    ms_status (*stream_init)(void *self, ms_device_stream **out, ms_error *err);
    void (*stream_free)(void *self, ms_device_stream *stream);
    /* Create / destroy an event. */
    ms_status (*event_init)(void *self, ms_device_event **out, ms_error *err);
    void (*event_free)(void *self, ms_device_event *event);
    /* Record `event` after the work queued so far on `stream` (cudaEventRecord). */
    ms_status (*event_record)(void *self, ms_device_event *event, ms_device_stream *stream,
                              ms_error *err);
    /* Make later work on `stream` wait for `event` (cudaStreamWaitEvent); never blocks the host. */
    ms_status (*stream_wait)(void *self, ms_device_stream *stream, ms_device_event *event,
                             ms_error *err);
    /* Block the calling thread until `stream` (NULL: the whole device) has finished. */
    ms_status (*synchronize)(void *self, ms_device_stream *stream, ms_error *err);
    /* Release the device object itself (optional: nothing to release). */
    void (*destroy)(void *self);
} ms_device_i;

/* A device: its interface and the implementation's state. */
typedef struct ms_device {
    const ms_device_i *iface;
    void *ctx;
} ms_device;

/* ---- host device ---- */

/*
 * Create the host device: memory from ms_malloc (16-byte aligned), copies and memsets execute
 * immediately on the calling thread, streams and events are bookkeeping objects (an event counts
 * its records, a stream counts its waits). `capacity_bytes` > 0 caps the bytes live at once
 * (like a GPU's memory; alloc beyond it fails with MS_ERR_OOM naming the allocation); 0 means
 * unlimited (mem_info then reports SIZE_MAX / 2 free). Errors: MS_ERR_OOM.
 */
ms_status ms_device_host_init(size_t capacity_bytes, ms_device **out, ms_error *err);

/*
 * Wrap an implementation: a device object with `iface` and `ctx` (owned by the caller unless
 * iface->destroy releases it when ms_device_free runs). Used by tests to trace or fault-inject
 * around the host device, and by the CUDA backend. Errors: MS_ERR_OOM.
 */
ms_status ms_device_wrap_init(const ms_device_i *iface, void *ctx, ms_device **out, ms_error *err);

/* Destroy a device (NULL is a no-op); calls iface->destroy(ctx) when set. */
void ms_device_free(ms_device *dev);

/* ---- front ends (each forwards to the vtable; documented there) ---- */

ms_status ms_device_mem_info(ms_device *dev, size_t *free_bytes, size_t *total_bytes,
                             ms_error *err);
ms_status ms_device_alloc(ms_device *dev, size_t bytes, const char *name, void **out,
                          ms_error *err);
void ms_device_free_mem(ms_device *dev, void *ptr);
ms_status ms_device_memset(ms_device *dev, void *ptr, int value, size_t bytes,
                           ms_device_stream *stream, ms_error *err);
ms_status ms_device_copy(ms_device *dev, void *dst, const void *src, size_t bytes,
                         ms_copy_kind kind, ms_device_stream *stream, ms_error *err);
ms_status ms_device_stream_init(ms_device *dev, ms_device_stream **out, ms_error *err);
void ms_device_stream_free(ms_device *dev, ms_device_stream *stream);
ms_status ms_device_event_init(ms_device *dev, ms_device_event **out, ms_error *err);
void ms_device_event_free(ms_device *dev, ms_device_event *event);
ms_status ms_device_event_record(ms_device *dev, ms_device_event *event,
                                 ms_device_stream *stream, ms_error *err);
ms_status ms_device_stream_wait(ms_device *dev, ms_device_stream *stream,
                                ms_device_event *event, ms_error *err);
ms_status ms_device_synchronize(ms_device *dev, ms_device_stream *stream, ms_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MS_DEVICE_H */
