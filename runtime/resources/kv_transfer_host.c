/*
 * kv_transfer_host.c - [pd] host KV transfer: page contents exported with a published record and
 * copied into the receiving arena (see kv_transfer_host.h).
 */
#include "kv_transfer_host.h"

#include <string.h>

void ms_kv_payload_free(ms_kv_payload *p) {
    if (p == NULL)
        return;
    for (int32_t i = 0; i < p->n_streams; i++)
        ms_free(p->bytes[i]);
    ms_free(p);
}

ms_status ms_kv_payload_export(ms_page_arena *arena, const ms_kv_published *pub,
                               ms_kv_payload **out, ms_error *err) {
    *out = NULL;
    const ms_page_arena_config *cfg = ms_page_arena_get_config(arena);
    const ms_page_arena_size *sz = ms_page_arena_get_size(arena);
    ms_device *dev = ms_page_arena_device(arena);
    const int32_t n_pages = ms_page_arena_num_pages(arena);
    if (pub->n_streams < 0 || pub->n_streams > MS_MAX_LABELS)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "kv payload: request %llu has %d streams",
                       (unsigned long long)pub->rid, (int)pub->n_streams);
    ms_kv_payload *p = ms_calloc(1, sizeof *p);
    if (p == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "kv payload: out of host memory");
    p->n_layers = cfg->n_layers;
    p->page_size = cfg->page_size;
    p->page_bytes = sz->page_bytes;
    ms_status st = MS_OK;
    for (int32_t i = 0; i < pub->n_streams && st == MS_OK; i++) {
        const ms_kv_published_stream *ps = &pub->streams[i];
        size_t n = (size_t)MS_MAX(ps->n_pages, 0) * (size_t)p->n_layers * p->page_bytes;
        p->bytes[i] = ms_malloc(MS_MAX(n, (size_t)1));
        if (p->bytes[i] == NULL) {
            st = MS_FAIL(err, MS_ERR_OOM, "kv payload: out of host memory (%zu bytes)", n);
            break;
        }
        p->label[i] = ps->label;
        p->n_pages[i] = ps->n_pages;
        p->n_streams = i + 1;
        for (int32_t j = 0; j < ps->n_pages && st == MS_OK; j++) {
            int32_t pg = ps->pages[j];
            if (pg <= 0 || pg >= n_pages) {
                st = MS_FAIL(err, MS_ERR_INVALID_ARG,
                             "kv payload: request %llu label %d page %d outside the arena (1..%d)",
                             (unsigned long long)pub->rid, (int)ps->label, (int)pg,
                             (int)n_pages - 1);
                break;
            }
            for (int32_t l = 0; l < p->n_layers && st == MS_OK; l++)
                st = ms_device_copy(dev,
                                    p->bytes[i] + ((size_t)j * (size_t)p->n_layers + (size_t)l) *
                                                      p->page_bytes,
                                    ms_page_arena_token_ptr(arena, l, pg, 0, 0), p->page_bytes,
                                    MS_COPY_D2H, NULL, err);
        }
    }
    if (st != MS_OK) {
        ms_kv_payload_free(p);
        return st;
    }
    *out = p;
    return MS_OK;
}

static ms_status host_start(void *ctx, const ms_kv_transfer_desc *d, uint64_t *handle,
                            ms_error *err) {
    ms_kv_host_transfer *t = ctx;
    const ms_kv_payload *p = d->source;
    const unsigned long long rid = (unsigned long long)d->rid;
    if (t == NULL || t->arena == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "host transfer: request %llu: no arena", rid);
    if (p == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "host transfer: request %llu: no payload", rid);
    const ms_page_arena_config *cfg = ms_page_arena_get_config(t->arena);
    const ms_page_arena_size *sz = ms_page_arena_get_size(t->arena);
    if (p->n_layers != cfg->n_layers || p->page_size != cfg->page_size ||
        p->page_bytes != sz->page_bytes || d->page_size != cfg->page_size)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "host transfer: request %llu: payload of %d layers, pages of %d tokens / "
                       "%zu bytes; this arena has %d layers, %d tokens / %zu bytes",
                       rid, (int)p->n_layers, (int)p->page_size, p->page_bytes,
                       (int)cfg->n_layers, (int)cfg->page_size, sz->page_bytes);
    int32_t si = -1;
    for (int32_t i = 0; i < p->n_streams; i++)
        if (p->label[i] == d->label)
            si = i;
    if (si < 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "host transfer: request %llu: no label %d in the "
                       "payload", rid, (int)d->label);
    const int32_t ps = d->page_size;
    if (d->token_end <= d->token_begin) {
        *handle = ++t->next_handle;
        return MS_OK;
    }
    const int32_t first = (d->token_begin - d->start) / ps;
    const int32_t last = (d->token_end - 1 - d->start) / ps; /* inclusive */
    if (first < 0 || last >= p->n_pages[si] || last >= d->n_local_pages)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "host transfer: request %llu label %d: pages %d..%d asked, the payload "
                       "holds %d and the pool gave %d", rid, (int)d->label, (int)first,
                       (int)last, (int)p->n_pages[si], (int)d->n_local_pages);
    ms_device *dev = ms_page_arena_device(t->arena);
    const int32_t n_pages = ms_page_arena_num_pages(t->arena);
    for (int32_t j = first; j <= last; j++) {
        int32_t pg = d->local_pages[j];
        if (pg <= 0 || pg >= n_pages)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "host transfer: request %llu: local page %d "
                           "outside the arena", rid, (int)pg);
        for (int32_t l = 0; l < p->n_layers; l++) {
            const uint8_t *src =
                p->bytes[si] + ((size_t)j * (size_t)p->n_layers + (size_t)l) * p->page_bytes;
            /* synchronous copies (NULL stream): the engine admits a transfer between steps,
               after its last step's outputs reached the host, so no forward reads these pages */
            MS_TRY(ms_device_copy(dev, ms_page_arena_token_ptr(t->arena, l, pg, 0, 0), src,
                                  p->page_bytes, MS_COPY_H2D, NULL, err));
            t->bytes += p->page_bytes;
        }
    }
    t->n_transfers++;
    *handle = ++t->next_handle;
    return MS_OK;
}

static ms_kv_transfer_state host_poll(void *ctx, uint64_t handle) {
    (void)ctx;
    (void)handle;
    return MS_KV_TRANSFER_DONE; /* start copied synchronously */
}

static void host_release(void *ctx, uint64_t handle) {
    (void)ctx;
    (void)handle;
}

static const ms_kv_transfer_i host_iface = {
    .start = host_start,
    .poll = host_poll,
    .wait = host_poll,
    .release = host_release,
};

const ms_kv_transfer_i *ms_kv_host_transfer_iface(void) { return &host_iface; }
