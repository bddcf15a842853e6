/*
 * page_arena.c - the KV page tensor and its page allocator (page_arena.h).
 *
 * Constraints: the allocator state (free stack, owner counts) is guarded by `mu`; page copies use
 * scratch arrays made at init, guarded by `copy_mu`, so the hot path allocates nothing. Page 0 is
 * the sink page: owner count pinned at 1, never on the free stack.
 */
#include "page_arena.h"

#include <pthread.h>
#include <string.h>

/* A move source that is the staging buffer rather than a page. */
#define STAGE (-1)

struct ms_page_arena {
    ms_page_arena_config cfg;   /* n_pages resolved */
    ms_page_arena_size size;    /* measured size and strides */
    ms_device *dev;             /* borrowed */
    char *data;                 /* [n_layers, n_pages, 2, ps, H, D] device memory */
    char *stage;                /* [n_layers, page_bytes] device staging for copy cycles */
    pthread_mutex_t mu;         /* guards free_stack, n_free, owners */
    int32_t *free_stack;        /* [n_pages] free page ids; top = free_stack[n_free - 1] */
    int32_t n_free;             /* entries on free_stack */
    int32_t *owners;            /* [n_pages] owner count per page; 0 = free */
    pthread_mutex_t copy_mu;    /* guards the copy scratch below */
    int32_t *mv_src;            /* [n_pages] move i reads page mv_src[i] (or STAGE) */
    int32_t *mv_dst;            /* [n_pages] move i writes page mv_dst[i] */
    int32_t *readers;           /* [n_pages] pending moves reading each page */
    int32_t *writer;            /* [n_pages] pending move writing each page, -1 none */
    int32_t *ready;             /* [n_pages] stack of moves ready to run */
    int32_t *check;             /* [n_pages] scratch counts for release / retain validation */
};

/* ---- sizing ---- */

ms_status ms_page_arena_measure(const ms_page_arena_config *cfg, ms_page_arena_size *out,
                                ms_error *err) {
    const char *name = cfg->name != NULL ? cfg->name : "kv";
    memset(out, 0, sizeof *out);
    if (cfg->n_layers < 1 || cfg->page_size < 1 || cfg->n_kv_heads < 1 || cfg->head_dim < 1)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "page arena '%s': layers %d, page_size %d, kv_heads %d, head_dim %d must "
                       "all be >= 1", name, cfg->n_layers, cfg->page_size, cfg->n_kv_heads,
                       cfg->head_dim);
    if (cfg->elem_bytes != 1 && cfg->elem_bytes != 2 && cfg->elem_bytes != 4)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "page arena '%s': elem_bytes %d must be 1, 2 or 4", name, cfg->elem_bytes);
    if (cfg->layout != MS_KV_LAYOUT_NHD)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                       "page arena '%s': layout %d is unsupported (only NHD is)", name,
                       (int)cfg->layout);
    if (cfg->n_pages < 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "page arena '%s': kv_num_pages %d is negative",
                       name, cfg->n_pages);
    /* Every factor is <= INT32_MAX, so check each product against SIZE_MAX. */
    size_t token = (size_t)cfg->n_kv_heads * (size_t)cfg->head_dim;
    size_t kv = token * (size_t)cfg->page_size;
    if (token == 0 || kv / token != (size_t)cfg->page_size || kv > SIZE_MAX / 2 / 4)
        return MS_FAIL(err, MS_ERR_LIMIT, "page arena '%s': page size overflows", name);
    size_t page_elems = 2 * kv;
    size_t page_bytes = page_elems * (size_t)cfg->elem_bytes;
    size_t layer_page_bytes = page_bytes * (size_t)cfg->n_layers; /* one page, every layer */
    if (layer_page_bytes / (size_t)cfg->n_layers != page_bytes)
        return MS_FAIL(err, MS_ERR_LIMIT, "page arena '%s': page size overflows", name);
    int64_t n_pages = cfg->n_pages;
    if (n_pages == 0) {
        if (cfg->budget_bytes == 0)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "page arena '%s': set kv_num_pages or kv_budget_bytes (both are 0)",
                           name);
        uint64_t fit = (uint64_t)(cfg->budget_bytes / layer_page_bytes);
        if (fit > INT32_MAX)
            return MS_FAIL(err, MS_ERR_LIMIT,
                           "page arena '%s': kv_budget_bytes %zu holds more than %d pages; lower "
                           "it or set kv_num_pages", name, cfg->budget_bytes, INT32_MAX);
        n_pages = (int64_t)fit;
    }
    if (n_pages < 2)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "page arena '%s': %lld page(s) fit but at least 2 are needed (the sink "
                       "page and one usable page; one page of %d layers is %zu bytes): raise "
                       "kv_budget_bytes or kv_num_pages", name, (long long)n_pages,
                       cfg->n_layers, layer_page_bytes);
    size_t bytes = layer_page_bytes * (size_t)n_pages;
    if (bytes / (size_t)n_pages != layer_page_bytes)
        return MS_FAIL(err, MS_ERR_LIMIT,
                       "page arena '%s': %lld pages of %zu bytes overflow the address space; "
                       "lower kv_num_pages", name, (long long)n_pages, layer_page_bytes);
    out->n_pages = (int32_t)n_pages;
    out->page_bytes = page_bytes;
    out->bytes = bytes;
    out->strides.head = (size_t)cfg->head_dim;
    out->strides.token = token;
    out->strides.kv = kv;
    out->strides.page = page_elems;
    out->strides.layer = page_elems * (size_t)n_pages;
    return MS_OK;
}

/* ---- lifetime ---- */

ms_status ms_page_arena_init(const ms_page_arena_config *cfg, ms_device *dev,
                             ms_page_arena **out, ms_error *err) {
    *out = NULL;
    ms_page_arena_size size;
    MS_TRY(ms_page_arena_measure(cfg, &size, err));
    const char *name = cfg->name != NULL ? cfg->name : "kv";
    ms_page_arena *a = ms_calloc(1, sizeof *a);
    if (a == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "page arena '%s': out of host memory", name);
    a->cfg = *cfg;
    a->cfg.n_pages = size.n_pages;
    a->cfg.name = NULL; /* not kept: the caller's string may not outlive the arena */
    a->size = size;
    a->dev = dev;
    pthread_mutex_init(&a->mu, NULL);
    pthread_mutex_init(&a->copy_mu, NULL);
    size_t n = (size_t)size.n_pages;
    int32_t **arrays[] = {&a->free_stack, &a->owners, &a->mv_src, &a->mv_dst,
                          &a->readers,    &a->writer, &a->ready,  &a->check};
    for (size_t i = 0; i < MS_ARRAY_LEN(arrays); i++) {
        *arrays[i] = ms_calloc(n, sizeof(int32_t));
        if (*arrays[i] == NULL) {
            ms_page_arena_free(a);
            return MS_FAIL(err, MS_ERR_OOM,
                           "page arena '%s': out of host memory for the bookkeeping of %zu pages",
                           name, n);
        }
    }
    ms_status st = ms_device_alloc(dev, size.bytes, "kv.pages", (void **)&a->data, err);
    if (st != MS_OK) {
        ms_error_prefix(err, "page arena '%s' (%d pages, %zu bytes; lower kv_num_pages or "
                        "kv_budget_bytes): ", name, size.n_pages, size.bytes);
        ms_page_arena_free(a);
        return st;
    }
    st = ms_device_alloc(dev, size.page_bytes * (size_t)cfg->n_layers, "kv.copy_stage",
                         (void **)&a->stage, err);
    if (st == MS_OK)
        st = ms_device_memset(dev, a->data, 0, size.bytes, NULL, err);
    if (st != MS_OK) {
        ms_error_prefix(err, "page arena '%s': ", name);
        ms_page_arena_free(a);
        return st;
    }
    /* Push pages high to low so a fresh arena hands out 1, 2, 3, ... */
    for (int32_t p = size.n_pages - 1; p >= 1; p--)
        a->free_stack[a->n_free++] = p;
    a->owners[MS_SINK_PAGE] = 1;
    for (size_t p = 0; p < n; p++)
        a->writer[p] = -1;
    *out = a;
    return MS_OK;
}

void ms_page_arena_free(ms_page_arena *a) {
    if (a == NULL)
        return;
    if (a->data != NULL)
        ms_device_free_mem(a->dev, a->data);
    if (a->stage != NULL)
        ms_device_free_mem(a->dev, a->stage);
    ms_free(a->free_stack);
    ms_free(a->owners);
    ms_free(a->mv_src);
    ms_free(a->mv_dst);
    ms_free(a->readers);
    ms_free(a->writer);
    ms_free(a->ready);
    ms_free(a->check);
    pthread_mutex_destroy(&a->mu);
    pthread_mutex_destroy(&a->copy_mu);
    ms_free(a);
}

/* ---- allocator ---- */

ms_status ms_page_arena_acquire(ms_page_arena *a, int32_t n, int32_t *out) {
    if (n <= 0)
        return MS_OK;
    pthread_mutex_lock(&a->mu);
    if (n > a->n_free) {
        pthread_mutex_unlock(&a->mu);
        return MS_ERR_CAPACITY;
    }
    for (int32_t i = 0; i < n; i++) {
        int32_t p = a->free_stack[--a->n_free];
        MS_ASSERT(p != MS_SINK_PAGE && a->owners[p] == 0);
        a->owners[p] = 1;
        out[i] = p;
    }
    pthread_mutex_unlock(&a->mu);
    return MS_OK;
}

/* Validate pages[0..n) for release (need_owned) or retain under a->mu; uses a->check. */
static ms_status check_pages(ms_page_arena *a, const int32_t *pages, int32_t n, bool releasing,
                             ms_error *err) {
    ms_status st = MS_OK;
    int32_t i = 0;
    for (; i < n; i++) {
        int32_t p = pages[i];
        if (p < 0 || p >= a->cfg.n_pages) {
            st = MS_FAIL(err, MS_ERR_INVALID_ARG, "page arena: page %d is out of range [0, %d)",
                         p, a->cfg.n_pages);
            break;
        }
        if (p == MS_SINK_PAGE) {
            st = MS_FAIL(err, MS_ERR_INVALID_ARG,
                         "page arena: page 0 is the sink page and is never owned");
            break;
        }
        a->check[p]++;
        if (releasing && a->check[p] > a->owners[p]) {
            st = MS_FAIL(err, MS_ERR_INVALID_ARG,
                         "page arena: double free of page %d (%d owner(s), released %d time(s))",
                         p, a->owners[p], a->check[p]);
            i++;
            break;
        }
        if (!releasing && a->owners[p] == 0) {
            st = MS_FAIL(err, MS_ERR_INVALID_ARG, "page arena: retain of free page %d", p);
            i++;
            break;
        }
    }
    for (int32_t j = 0; j < i; j++)
        if (pages[j] >= 0 && pages[j] < a->cfg.n_pages)
            a->check[pages[j]] = 0;
    return st;
}

ms_status ms_page_arena_release(ms_page_arena *a, const int32_t *pages, int32_t n,
                                ms_error *err) {
    if (n <= 0)
        return MS_OK;
    pthread_mutex_lock(&a->mu);
    ms_status st = check_pages(a, pages, n, true, err);
    if (st == MS_OK) {
        for (int32_t i = 0; i < n; i++) {
            int32_t p = pages[i];
            if (--a->owners[p] == 0)
                a->free_stack[a->n_free++] = p;
        }
    }
    pthread_mutex_unlock(&a->mu);
    return st;
}

ms_status ms_page_arena_retain(ms_page_arena *a, const int32_t *pages, int32_t n, ms_error *err) {
    if (n <= 0)
        return MS_OK;
    pthread_mutex_lock(&a->mu);
    ms_status st = check_pages(a, pages, n, false, err);
    if (st == MS_OK)
        for (int32_t i = 0; i < n; i++)
            a->owners[pages[i]]++;
    pthread_mutex_unlock(&a->mu);
    return st;
}

int32_t ms_page_arena_num_free(ms_page_arena *a) {
    pthread_mutex_lock(&a->mu);
    int32_t n = a->n_free;
    pthread_mutex_unlock(&a->mu);
    return n;
}

int32_t ms_page_arena_owners(ms_page_arena *a, int32_t page) {
    if (page < 0 || page >= a->cfg.n_pages)
        return -1;
    pthread_mutex_lock(&a->mu);
    int32_t n = a->owners[page];
    pthread_mutex_unlock(&a->mu);
    return n;
}

int32_t ms_page_arena_num_pages(const ms_page_arena *a) { return a->cfg.n_pages; }
int32_t ms_page_arena_page_size(const ms_page_arena *a) { return a->cfg.page_size; }
const ms_page_arena_config *ms_page_arena_get_config(const ms_page_arena *a) { return &a->cfg; }
const ms_page_arena_size *ms_page_arena_get_size(const ms_page_arena *a) { return &a->size; }
ms_device *ms_page_arena_device(const ms_page_arena *a) { return a->dev; }
void *ms_page_arena_data(const ms_page_arena *a) { return a->data; }

/* Byte address of page `page` of layer `layer`. */
static char *page_addr(const ms_page_arena *a, int32_t layer, int32_t page) {
    size_t idx = (size_t)layer * (size_t)a->cfg.n_pages + (size_t)page;
    return a->data + idx * a->size.page_bytes;
}

void *ms_page_arena_token_ptr(const ms_page_arena *a, int32_t layer, int32_t page, int kv,
                              int32_t slot) {
    MS_ASSERT(layer >= 0 && layer < a->cfg.n_layers && page >= 0 && page < a->cfg.n_pages);
    MS_ASSERT((kv == 0 || kv == 1) && slot >= 0 && slot < a->cfg.page_size);
    size_t elems = (size_t)kv * a->size.strides.kv + (size_t)slot * a->size.strides.token;
    return page_addr(a, layer, page) + elems * (size_t)a->cfg.elem_bytes;
}

/* ---- copies ---- */

/* Copy one page (every layer) from `src` (a page or STAGE) to `dst` (a page or STAGE). */
static ms_status move_page(ms_page_arena *a, int32_t src, int32_t dst, ms_device_stream *stream,
                           ms_error *err) {
    size_t pb = a->size.page_bytes;
    for (int32_t l = 0; l < a->cfg.n_layers; l++) {
        const char *s = src == STAGE ? a->stage + (size_t)l * pb : page_addr(a, l, src);
        char *d = dst == STAGE ? a->stage + (size_t)l * pb : page_addr(a, l, dst);
        MS_TRY(ms_device_copy(a->dev, d, s, pb, MS_COPY_D2D, stream, err));
    }
    return MS_OK;
}

/*
 * Sequentialise the parallel assignment dst[i] := src[i] (a "parallel move"): run a move only
 * when no pending move still reads its destination; when every pending move waits (a cycle),
 * save one destination to the staging buffer and redirect its readers there. Each page has at
 * most one writer, so every connected group holds at most one cycle and the staging buffer is
 * free again before the next cycle is broken.
 */
static ms_status copy_locked(ms_page_arena *a, const int32_t *src, const int32_t *dst, int32_t n,
                             ms_device_stream *stream, ms_error *err) {
    int32_t np = a->cfg.n_pages;
    int32_t m = 0;
    ms_status st = MS_OK;
    for (int32_t i = 0; i < n; i++) {
        if (src[i] < 0 || src[i] >= np || dst[i] < 0 || dst[i] >= np) {
            st = MS_FAIL(err, MS_ERR_INVALID_ARG,
                         "page arena: copy %d -> %d names a page out of range [0, %d)", src[i],
                         dst[i], np);
            break;
        }
        if (a->writer[dst[i]] != -1) {
            st = MS_FAIL(err, MS_ERR_INVALID_ARG,
                         "page arena: page %d is the destination of two copies", dst[i]);
            break;
        }
        a->writer[dst[i]] = -2; /* seen (also for self copies, which are skipped) */
        if (src[i] == dst[i])
            continue;
        a->mv_src[m] = src[i];
        a->mv_dst[m] = dst[i];
        m++;
    }
    if (st != MS_OK) {
        for (int32_t i = 0; i < n; i++)
            if (dst[i] >= 0 && dst[i] < np)
                a->writer[dst[i]] = -1;
        return st;
    }
    for (int32_t i = 0; i < n; i++)
        a->writer[dst[i]] = -1;
    for (int32_t i = 0; i < m; i++) {
        a->readers[a->mv_src[i]]++;
        a->writer[a->mv_dst[i]] = i;
    }
    int32_t n_ready = 0;
    for (int32_t i = 0; i < m; i++)
        if (a->readers[a->mv_dst[i]] == 0)
            a->ready[n_ready++] = i;
    int32_t done = 0;
    int32_t stage_readers = 0;
    while (done < m && st == MS_OK) {
        if (n_ready == 0) {
            /* Only cycles remain: stage the destination of any pending move. */
            MS_ASSERT(stage_readers == 0);
            int32_t j = -1;
            for (int32_t i = 0; i < m && j < 0; i++)
                if (a->writer[a->mv_dst[i]] == i)
                    j = i;
            MS_ASSERT(j >= 0);
            int32_t d = a->mv_dst[j];
            st = move_page(a, d, STAGE, stream, err);
            if (st != MS_OK)
                break;
            for (int32_t i = 0; i < m; i++) {
                if (a->writer[a->mv_dst[i]] == i && a->mv_src[i] == d) {
                    a->mv_src[i] = STAGE;
                    stage_readers++;
                }
            }
            a->readers[d] = 0;
            a->ready[n_ready++] = j;
            continue;
        }
        int32_t i = a->ready[--n_ready];
        st = move_page(a, a->mv_src[i], a->mv_dst[i], stream, err);
        if (st != MS_OK)
            break;
        done++;
        a->writer[a->mv_dst[i]] = -1;
        int32_t s = a->mv_src[i];
        if (s == STAGE) {
            stage_readers--;
        } else if (--a->readers[s] == 0 && a->writer[s] >= 0) {
            a->ready[n_ready++] = a->writer[s];
        }
    }
    /* Leave the scratch clean (also after a device error). */
    for (int32_t i = 0; i < m; i++) {
        if (a->mv_src[i] != STAGE)
            a->readers[a->mv_src[i]] = 0;
        a->writer[a->mv_dst[i]] = -1;
    }
    return st;
}

ms_status ms_page_arena_copy_pages(ms_page_arena *a, const int32_t *src, const int32_t *dst,
                                   int32_t n, ms_device_stream *stream, ms_error *err) {
    if (n <= 0)
        return MS_OK;
    if (n > a->cfg.n_pages)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "page arena: %d copies exceed the %d pages (destinations must be distinct)",
                       n, a->cfg.n_pages);
    pthread_mutex_lock(&a->copy_mu);
    ms_status st = copy_locked(a, src, dst, n, stream, err);
    pthread_mutex_unlock(&a->copy_mu);
    return st;
}

ms_status ms_page_arena_copy_across(ms_page_arena *from, const int32_t *src, ms_page_arena *to,
                                    const int32_t *dst, int32_t n, ms_copy_kind kind,
                                    ms_device_stream *stream, ms_error *err) {
    if (from->size.page_bytes != to->size.page_bytes || from->cfg.n_layers != to->cfg.n_layers)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "page arena: copy between arenas of different geometry (%d layers x %zu "
                       "bytes vs %d x %zu)", from->cfg.n_layers, from->size.page_bytes,
                       to->cfg.n_layers, to->size.page_bytes);
    for (int32_t i = 0; i < n; i++)
        if (src[i] < 0 || src[i] >= from->cfg.n_pages || dst[i] < 0 || dst[i] >= to->cfg.n_pages)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "page arena: copy %d -> %d names a page out of range", src[i], dst[i]);
    /* The destination's device performs the copy (the CUDA device handles both directions). */
    ms_device *dev = kind == MS_COPY_D2H ? from->dev : to->dev;
    for (int32_t l = 0; l < from->cfg.n_layers; l++)
        for (int32_t i = 0; i < n; i++)
            MS_TRY(ms_device_copy(dev, page_addr(to, l, dst[i]), page_addr(from, l, src[i]),
                                  from->size.page_bytes, kind, stream, err));
    return MS_OK;
}
