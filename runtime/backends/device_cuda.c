/*
 * device_cuda.c - the CUDA device (device_cuda.h): device memory, streams and events through the
 * CUDA runtime.
 *
 * Constraints: every call selects the device's ordinal first (the calling thread may have another
 * current device); a NULL stream synchronises the whole device before and after the operation
 * (device.h's "synchronous"), because the CUDA backend queues its work on a non-blocking stream
 * that the legacy default stream does not wait for.
 */
#include "device_cuda.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cuda_check.h"

/* ---- state ---- */

/* One CUDA device. */
typedef struct cuda_dev {
    int ordinal;    /* CUDA device ordinal */
    char name[32];  /* "cuda:N" */
    ms_device_i iface;
} cuda_dev;

static ms_status dev_select(cuda_dev *d, ms_error *err) {
    MS_CUDA_TRY(err, cudaSetDevice(d->ordinal));
    return MS_OK;
}

static enum cudaMemcpyKind copy_kind(ms_copy_kind k) {
    /* ORDER MS_COPY */
    switch (k) {
    case MS_COPY_H2H: return cudaMemcpyHostToHost;
    case MS_COPY_H2D: return cudaMemcpyHostToDevice;
    case MS_COPY_D2H: return cudaMemcpyDeviceToHost;
    case MS_COPY_D2D: return cudaMemcpyDeviceToDevice;
    default: return cudaMemcpyDefault;
    }
}

/* ---- memory ---- */

static ms_status cd_mem_info(void *self, size_t *free_bytes, size_t *total_bytes,
                             ms_error *err) {
    MS_TRY(dev_select(self, err));
    MS_CUDA_TRY(err, cudaMemGetInfo(free_bytes, total_bytes));
    return MS_OK;
}

static ms_status cd_alloc(void *self, size_t bytes, const char *name, void **out,
                          ms_error *err) {
    cuda_dev *d = self;
    *out = NULL;
    MS_TRY(dev_select(d, err));
    cudaError_t e = cudaMalloc(out, bytes == 0 ? 1 : bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky-free error so later calls work */
        size_t fr = 0, tot = 0;
        (void)cudaMemGetInfo(&fr, &tot);
        *out = NULL;
        return MS_FAIL(err, MS_ERR_OOM, "%s: %s: %.3f GB requested, %.3f of %.3f GB free (%s)",
                       d->name, name != NULL ? name : "buffer", (double)bytes / 1e9,
                       (double)fr / 1e9, (double)tot / 1e9, cudaGetErrorString(e));
    }
    return MS_OK;
}

static void cd_free(void *self, void *ptr) {
    cuda_dev *d = self;
    if (ptr == NULL)
        return;
    MS_CUDA_CHECK(cudaSetDevice(d->ordinal));
    MS_CUDA_CHECK(cudaFree(ptr));
}

static ms_status cd_memset(void *self, void *ptr, int value, size_t bytes,
                           ms_device_stream *stream, ms_error *err) {
    MS_TRY(dev_select(self, err));
    if (stream == NULL) {
        MS_CUDA_TRY(err, cudaDeviceSynchronize());
        MS_CUDA_TRY(err, cudaMemsetAsync(ptr, value, bytes, (cudaStream_t)0));
        MS_CUDA_TRY(err, cudaDeviceSynchronize());
        return MS_OK;
    }
    MS_CUDA_TRY(err, cudaMemsetAsync(ptr, value, bytes, (cudaStream_t)(void *)stream));
    return MS_OK;
}

static ms_status cd_copy(void *self, void *dst, const void *src, size_t bytes, ms_copy_kind kind,
                         ms_device_stream *stream, ms_error *err) {
    MS_TRY(dev_select(self, err));
    if (stream == NULL) {
        MS_CUDA_TRY(err, cudaDeviceSynchronize());
        MS_CUDA_TRY(err, cudaMemcpyAsync(dst, src, bytes, copy_kind(kind), (cudaStream_t)0));
        MS_CUDA_TRY(err, cudaDeviceSynchronize());
        return MS_OK;
    }
    MS_CUDA_TRY(err, cudaMemcpyAsync(dst, src, bytes, copy_kind(kind),
                                     (cudaStream_t)(void *)stream));
    return MS_OK;
}

/* ---- streams and events ---- */

static ms_status cd_stream_init(void *self, ms_device_stream **out, ms_error *err) {
    *out = NULL;
    MS_TRY(dev_select(self, err));
    cudaStream_t s = NULL;
    MS_CUDA_TRY(err, cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *out = (ms_device_stream *)(void *)s;
    return MS_OK;
}

static void cd_stream_free(void *self, ms_device_stream *stream) {
    cuda_dev *d = self;
    if (stream == NULL)
        return;
    MS_CUDA_CHECK(cudaSetDevice(d->ordinal));
    MS_CUDA_CHECK(cudaStreamDestroy((cudaStream_t)(void *)stream));
}

static ms_status cd_event_init(void *self, ms_device_event **out, ms_error *err) {
    *out = NULL;
    MS_TRY(dev_select(self, err));
    cudaEvent_t ev = NULL;
    MS_CUDA_TRY(err, cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    *out = (ms_device_event *)(void *)ev;
    return MS_OK;
}

static void cd_event_free(void *self, ms_device_event *event) {
    cuda_dev *d = self;
    if (event == NULL)
        return;
    MS_CUDA_CHECK(cudaSetDevice(d->ordinal));
    MS_CUDA_CHECK(cudaEventDestroy((cudaEvent_t)(void *)event));
}

static ms_status cd_event_record(void *self, ms_device_event *event, ms_device_stream *stream,
                                 ms_error *err) {
    MS_TRY(dev_select(self, err));
    MS_CUDA_TRY(err, cudaEventRecord((cudaEvent_t)(void *)event, (cudaStream_t)(void *)stream));
    return MS_OK;
}

static ms_status cd_stream_wait(void *self, ms_device_stream *stream, ms_device_event *event,
                                ms_error *err) {
    MS_TRY(dev_select(self, err));
    MS_CUDA_TRY(err, cudaStreamWaitEvent((cudaStream_t)(void *)stream,
                                         (cudaEvent_t)(void *)event, 0));
    return MS_OK;
}

static ms_status cd_synchronize(void *self, ms_device_stream *stream, ms_error *err) {
    MS_TRY(dev_select(self, err));
    if (stream == NULL)
        MS_CUDA_TRY(err, cudaDeviceSynchronize());
    else
        MS_CUDA_TRY(err, cudaStreamSynchronize((cudaStream_t)(void *)stream));
    return MS_OK;
}

static void cd_destroy(void *self) { ms_free(self); }

/* ---- init ---- */

ms_status ms_device_cuda_init(int32_t ordinal, ms_device **out, ms_error *err) {
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return MS_FAIL(err, MS_ERR_CUDA, "cuda:%d: no usable CUDA device (%s)", (int)ordinal,
                       cudaGetErrorString(e));
    }
    if (ordinal < 0 || ordinal >= n)
        return MS_FAIL(err, MS_ERR_CUDA, "cuda:%d: no such CUDA device (%d present)",
                       (int)ordinal, n);
    cuda_dev *d = ms_calloc(1, sizeof *d);
    if (d == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "cuda:%d: out of host memory for the device object",
                       (int)ordinal);
    d->ordinal = ordinal;
    snprintf(d->name, sizeof d->name, "cuda:%d", (int)ordinal);
    ms_status st = dev_select(d, err);
    if (st != MS_OK) {
        ms_error_prefix(err, "cuda device: ");
        ms_free(d);
        return st;
    }
    d->iface = (ms_device_i){
        .name = d->name,
        .mem_info = cd_mem_info,
        .alloc = cd_alloc,
        .free = cd_free,
        .memset = cd_memset,
        .copy = cd_copy,
        .stream_init = cd_stream_init,
        .stream_free = cd_stream_free,
        .event_init = cd_event_init,
        .event_free = cd_event_free,
        .event_record = cd_event_record,
        .stream_wait = cd_stream_wait,
        .synchronize = cd_synchronize,
        .destroy = cd_destroy,
    };
    st = ms_device_wrap_init(&d->iface, d, out, err);
    if (st != MS_OK)
        ms_free(d);
    return st;
}

/* ---- pinned host memory (the KV offload tier) ---- */

/* cudaHostAlloc (portable: every context may copy from it), named after the device it serves. */
static ms_status cd_host_alloc(void *self, size_t bytes, const char *name, void **out,
                               ms_error *err) {
    cuda_dev *d = self;
    *out = NULL;
    MS_TRY(dev_select(d, err));
    cudaError_t e = cudaHostAlloc(out, bytes == 0 ? 1 : bytes, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *out = NULL;
        return MS_FAIL(err, MS_ERR_OOM, "%s: %s: %.3f GB of pinned host memory refused (%s)",
                       d->name, name != NULL ? name : "buffer", (double)bytes / 1e9,
                       cudaGetErrorString(e));
    }
    return MS_OK;
}

static void cd_host_free(void *self, void *ptr) {
    (void)self;
    if (ptr != NULL)
        (void)cudaFreeHost(ptr);
}

/* Host memory: a plain memset after the queued work that may still read it (NULL stream: all). */
static ms_status cd_host_memset(void *self, void *ptr, int value, size_t bytes,
                                ms_device_stream *stream, ms_error *err) {
    MS_TRY(dev_select(self, err));
    if (stream == NULL)
        MS_CUDA_TRY(err, cudaDeviceSynchronize());
    else
        MS_CUDA_TRY(err, cudaStreamSynchronize((cudaStream_t)(void *)stream));
    memset(ptr, value, bytes);
    return MS_OK;
}

/* No device-side capacity: the host tier is sized by its caller (--host-kv-pages). */
static ms_status cd_host_mem_info(void *self, size_t *free_bytes, size_t *total_bytes,
                                  ms_error *err) {
    (void)self;
    (void)err;
    *free_bytes = SIZE_MAX;
    *total_bytes = SIZE_MAX;
    return MS_OK;
}

ms_status ms_device_cuda_host_init(int32_t ordinal, ms_device **out, ms_error *err) {
    MS_TRY(ms_device_cuda_init(ordinal, out, err));
    cuda_dev *d = (*out)->ctx;
    snprintf(d->name, sizeof d->name, "cuda:%d.pinned", (int)ordinal);
    d->iface.name = d->name;
    d->iface.alloc = cd_host_alloc;
    d->iface.free = cd_host_free;
    d->iface.memset = cd_host_memset;
    d->iface.mem_info = cd_host_mem_info;
    return MS_OK;
}
