/*
 * device.c - front ends of the device interface and the host device (plain host buffers).
 *
 * Constraints: the host device executes every copy and memset immediately, so stream ordering is
 * trivially satisfied; it still keeps per-stream and per-event counters so tests can see that
 * callers record and wait where the CUDA device would need it. The capacity counter is guarded by
 * a mutex: any thread may allocate.
 */
#include "device.h"

#include <pthread.h>
#include <string.h>

/* ---- front ends ---- */

const char *ms_copy_kind_str(ms_copy_kind kind) {
    /* ORDER MS_COPY */
    static const char *const names[MS_COPY_KIND_COUNT] = {"h2h", "h2d", "d2h", "d2d"};
    if ((int)kind < 0 || kind >= MS_COPY_KIND_COUNT)
        return "unknown";
    return names[kind];
}

ms_status ms_device_wrap_init(const ms_device_i *iface, void *ctx, ms_device **out,
                              ms_error *err) {
    *out = NULL;
    if (iface == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "device: NULL interface");
    ms_device *dev = ms_calloc(1, sizeof *dev);
    if (dev == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "device '%s': out of host memory for the device object",
                       iface->name != NULL ? iface->name : "?");
    dev->iface = iface;
    dev->ctx = ctx;
    *out = dev;
    return MS_OK;
}

void ms_device_free(ms_device *dev) {
    if (dev == NULL)
        return;
    if (dev->iface->destroy != NULL)
        dev->iface->destroy(dev->ctx);
    ms_free(dev);
}

ms_status ms_device_mem_info(ms_device *dev, size_t *free_bytes, size_t *total_bytes,
                             ms_error *err) {
    return dev->iface->mem_info(dev->ctx, free_bytes, total_bytes, err);
}

ms_status ms_device_alloc(ms_device *dev, size_t bytes, const char *name, void **out,
                          ms_error *err) {
    return dev->iface->alloc(dev->ctx, bytes, name, out, err);
}

void ms_device_free_mem(ms_device *dev, void *ptr) {
    if (ptr != NULL)
        dev->iface->free(dev->ctx, ptr);
}

ms_status ms_device_memset(ms_device *dev, void *ptr, int value, size_t bytes,
                           ms_device_stream *stream, ms_error *err) {
    return dev->iface->memset(dev->ctx, ptr, value, bytes, stream, err);
}

ms_status ms_device_copy(ms_device *dev, void *dst, const void *src, size_t bytes,
                         ms_copy_kind kind, ms_device_stream *stream, ms_error *err) {
    return dev->iface->copy(dev->ctx, dst, src, bytes, kind, stream, err);
}

ms_status ms_device_stream_init(ms_device *dev, ms_device_stream **out, ms_error *err) {
    return dev->iface->stream_init(dev->ctx, out, err);
}

void ms_device_stream_free(ms_device *dev, ms_device_stream *stream) {
    if (stream != NULL)
        dev->iface->stream_free(dev->ctx, stream);
}

ms_status ms_device_event_init(ms_device *dev, ms_device_event **out, ms_error *err) {
    return dev->iface->event_init(dev->ctx, out, err);
}

void ms_device_event_free(ms_device *dev, ms_device_event *event) {
    if (event != NULL)
        dev->iface->event_free(dev->ctx, event);
}

ms_status ms_device_event_record(ms_device *dev, ms_device_event *event,
                                 ms_device_stream *stream, ms_error *err) {
    return dev->iface->event_record(dev->ctx, event, stream, err);
}

ms_status ms_device_stream_wait(ms_device *dev, ms_device_stream *stream,
                                ms_device_event *event, ms_error *err) {
    return dev->iface->stream_wait(dev->ctx, stream, event, err);
}

ms_status ms_device_synchronize(ms_device *dev, ms_device_stream *stream, ms_error *err) {
    return dev->iface->synchronize(dev->ctx, stream, err);
}

/* ---- host device ---- */

/* State of the host device. */
typedef struct host_device {
    pthread_mutex_t mu;     /* guards live_bytes */
    size_t capacity;        /* bytes; 0 = unlimited */
    size_t live_bytes;      /* bytes currently allocated through alloc */
} host_device;

/* Hidden header in front of each host-device block: its size, keeping 16-byte alignment. */
typedef union host_block {
    size_t size;
    max_align_t align_;
} host_block;

/* Bookkeeping stream / event of the host device. */
struct ms_device_stream {
    uint64_t n_waits;  /* stream_wait calls on this stream */
};
struct ms_device_event {
    uint64_t n_records; /* event_record calls */
};

static ms_status host_mem_info(void *self, size_t *free_bytes, size_t *total_bytes,
                               ms_error *err) {
    (void)err;
    host_device *h = self;
    pthread_mutex_lock(&h->mu);
    if (h->capacity == 0) {
        *free_bytes = SIZE_MAX / 2;
        *total_bytes = SIZE_MAX / 2;
    } else {
        *free_bytes = h->capacity - h->live_bytes;
        *total_bytes = h->capacity;
    }
    pthread_mutex_unlock(&h->mu);
    return MS_OK;
}

static ms_status host_alloc(void *self, size_t bytes, const char *name, void **out,
                            ms_error *err) {
    host_device *h = self;
    *out = NULL;
    if (bytes > SIZE_MAX - sizeof(host_block))
        return MS_FAIL(err, MS_ERR_OOM, "host device: allocation '%s' of %zu bytes is too large",
                       name, bytes);
    pthread_mutex_lock(&h->mu);
    if (h->capacity != 0 && bytes > h->capacity - h->live_bytes) {
        size_t left = h->capacity - h->live_bytes;
        pthread_mutex_unlock(&h->mu);
        return MS_FAIL(err, MS_ERR_OOM,
                       "host device: allocation '%s' of %zu bytes exceeds the %zu bytes left "
                       "(capacity %zu)", name, bytes, left, h->capacity);
    }
    h->live_bytes += bytes;
    pthread_mutex_unlock(&h->mu);
    host_block *b = ms_malloc(sizeof *b + bytes);
    if (b == NULL) {
        pthread_mutex_lock(&h->mu);
        h->live_bytes -= bytes;
        pthread_mutex_unlock(&h->mu);
        return MS_FAIL(err, MS_ERR_OOM, "host device: out of host memory for '%s' (%zu bytes)",
                       name, bytes);
    }
    b->size = bytes;
    *out = b + 1;
    return MS_OK;
}

static void host_free(void *self, void *ptr) {
    host_device *h = self;
    host_block *b = (host_block *)ptr - 1;
    pthread_mutex_lock(&h->mu);
    MS_ASSERT(h->live_bytes >= b->size);
    h->live_bytes -= b->size;
    pthread_mutex_unlock(&h->mu);
    ms_free(b);
}

static ms_status host_memset(void *self, void *ptr, int value, size_t bytes,
                             ms_device_stream *stream, ms_error *err) {
    (void)self;
    (void)stream;
    (void)err;
    memset(ptr, value, bytes);
    return MS_OK;
}

static ms_status host_copy(void *self, void *dst, const void *src, size_t bytes,
                           ms_copy_kind kind, ms_device_stream *stream, ms_error *err) {
    (void)self;
    (void)stream;
    if ((int)kind < 0 || kind >= MS_COPY_KIND_COUNT)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "host device: bad copy kind %d", (int)kind);
    memmove(dst, src, bytes);
    return MS_OK;
}

static ms_status host_stream_init(void *self, ms_device_stream **out, ms_error *err) {
    (void)self;
    *out = ms_calloc(1, sizeof **out);
    if (*out == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "host device: out of memory for a stream");
    return MS_OK;
}

static void host_stream_free(void *self, ms_device_stream *stream) {
    (void)self;
    ms_free(stream);
}

static ms_status host_event_init(void *self, ms_device_event **out, ms_error *err) {
    (void)self;
    *out = ms_calloc(1, sizeof **out);
    if (*out == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "host device: out of memory for an event");
    return MS_OK;
}

static void host_event_free(void *self, ms_device_event *event) {
    (void)self;
    ms_free(event);
}

static ms_status host_event_record(void *self, ms_device_event *event, ms_device_stream *stream,
                                   ms_error *err) {
    (void)self;
    (void)stream;
    (void)err;
    event->n_records++;
    return MS_OK;
}

static ms_status host_stream_wait(void *self, ms_device_stream *stream, ms_device_event *event,
                                  ms_error *err) {
    (void)self;
    if (event->n_records == 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "host device: stream waits on an event that was never recorded");
    if (stream != NULL)
        stream->n_waits++;
    return MS_OK;
}

static ms_status host_synchronize(void *self, ms_device_stream *stream, ms_error *err) {
    (void)self;
    (void)stream;
    (void)err;
    return MS_OK;
}

static void host_destroy(void *self) {
    host_device *h = self;
    if (h == NULL)
        return;
    pthread_mutex_destroy(&h->mu);
    ms_free(h);
}

static const ms_device_i host_device_iface = {
    .name = "host",
    .mem_info = host_mem_info,
    .alloc = host_alloc,
    .free = host_free,
    .memset = host_memset,
    .copy = host_copy,
    .stream_init = host_stream_init,
    .stream_free = host_stream_free,
    .event_init = host_event_init,
    .event_free = host_event_free,
    .event_record = host_event_record,
    .stream_wait = host_stream_wait,
    .synchronize = host_synchronize,
    .destroy = host_destroy,
};

ms_status ms_device_host_init(size_t capacity_bytes, ms_device **out, ms_error *err) {
    *out = NULL;
    host_device *h = ms_calloc(1, sizeof *h);
    if (h == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "host device: out of memory");
    pthread_mutex_init(&h->mu, NULL);
    h->capacity = capacity_bytes;
    ms_status st = ms_device_wrap_init(&host_device_iface, h, out, err);
    if (st != MS_OK)
        host_destroy(h);
    return st;
}
