/*
 * page_arena.h - the KV page arena: one device tensor
 *     [n_layers, n_pages, 2, page_size, n_kv_heads, head_dim]   (layout NHD; K at 0, V at 1)
 * plus the page allocator over it: a free list, an owner count per page with double-free
 * detection, and page 0 reserved as the sink page (MS_SINK_PAGE, never handed out).
 *
 * Sizing follows "measure, then allocate": ms_page_arena_measure computes the bytes per page and
 * the page count a memory budget holds without touching memory; ms_page_arena_init allocates.
 * Failures name the knob to raise (kv_num_pages / kv_budget_bytes).
 *
 * Thread safety: acquire, release, retain and the counters take the arena's own mutex, so several
 * pools (and the offload tier) may share one arena. copy_pages only queues copies on a stream.
 *
 * Ownership: ms_page_arena_* functions borrow their arguments; the arena returned by
 * ms_page_arena_init is owned by the caller and released with ms_page_arena_free (after its
 * users). The device passed at init is borrowed and must outlive the arena.
 *
 * Usage:
 *     ms_page_arena_config cfg = {.n_layers = 32, .page_size = 16, .n_kv_heads = 8,
 *                                 .head_dim = 128, .elem_bytes = 2, .budget_bytes = 8u << 30};
 *     ms_page_arena *arena = NULL;
 *     MS_TRY(ms_page_arena_init(&cfg, dev, &arena, err));
 *     int32_t pages[3];
 *     if (ms_page_arena_acquire(arena, 3, pages) == MS_OK) { ...; ms_page_arena_release(...); }
 */
#ifndef MS_PAGE_ARENA_H
#define MS_PAGE_ARENA_H

#include "device.h"
#include "ms_base.h"
#include "resource.h" /* MS_SINK_PAGE */

#ifdef __cplusplus
extern "C" {
#endif

/* Memory layout of the arena tensor. Only NHD is implemented. ORDER MS_KV_LAYOUT */
typedef enum ms_kv_layout {
    MS_KV_LAYOUT_NHD = 0, /* [layers, pages, 2, page_size, kv_heads, head_dim] */
    MS_KV_LAYOUT_COUNT
} ms_kv_layout;

/* Geometry and size of an arena. Either n_pages > 0 (explicit) or budget_bytes > 0 (as many
 * pages as fit, n_pages = 0). */
typedef struct ms_page_arena_config {
    int32_t n_layers;     /* >= 1 */
    int32_t n_pages;      /* total pages including the sink page; 0: derive from budget_bytes */
    int32_t page_size;    /* tokens per page, >= 1 */
    int32_t n_kv_heads;   /* >= 1 (after tensor-parallel sharding) */
    int32_t head_dim;     /* >= 1 */
    int32_t elem_bytes;   /* bytes per element: 2 (bf16/f16) or 4 (f32) */
    ms_kv_layout layout;  /* MS_KV_LAYOUT_NHD */
    size_t budget_bytes;  /* bytes the arena may use when n_pages == 0 */
    const char *name;     /* label in messages and device allocations ("kv"), may be NULL */
} ms_page_arena_config;

/* Strides of the arena tensor in elements (derived once at measure/init). */
typedef struct ms_page_arena_strides {
    size_t layer;   /* n_pages * page */
    size_t page;    /* 2 * kv */
    size_t kv;      /* page_size * token: distance from K to V of one page */
    size_t token;   /* n_kv_heads * head_dim */
    size_t head;    /* head_dim */
} ms_page_arena_strides;

/* Result of measuring a configuration. */
typedef struct ms_page_arena_size {
    int32_t n_pages;         /* pages (including the sink page) */
    size_t page_bytes;       /* bytes of one page of one layer (K and V): 2*ps*H*D*elem */
    size_t bytes;            /* whole tensor: n_layers * n_pages * page_bytes */
    ms_page_arena_strides strides;
} ms_page_arena_size;

typedef struct ms_page_arena ms_page_arena;

/*
 * Measure a configuration without allocating: validates the geometry, derives the strides and,
 * when cfg->n_pages == 0, the page count cfg->budget_bytes holds. Errors: MS_ERR_INVALID_ARG
 * (bad geometry, or a budget that holds fewer than 2 pages, the sink plus one: the message names
 * the bytes one page needs and says to raise kv_budget_bytes or set kv_num_pages), MS_ERR_LIMIT
 * (more than INT32_MAX pages or a size that overflows).
 */
ms_status ms_page_arena_measure(const ms_page_arena_config *cfg, ms_page_arena_size *out,
                                ms_error *err);

/*
 * Allocate an arena on `dev`: the tensor (zero-filled), a one-page-per-layer staging buffer for
 * overlapping copies, and the host bookkeeping. Page 0 is taken as the sink page. Errors: those
 * of ms_page_arena_measure; MS_ERR_OOM naming the allocation and the knob to lower
 * (kv_num_pages / kv_budget_bytes) when the device cannot hold it.
 */
ms_status ms_page_arena_init(const ms_page_arena_config *cfg, ms_device *dev,
                             ms_page_arena **out, ms_error *err);

/* Free the arena and its device memory (NULL is a no-op). Pages still owned are a caller bug
 * only in the sense that they are dropped; no check is made. */
void ms_page_arena_free(ms_page_arena *arena);

/*
 * Take `n` free pages (all or nothing) into out[0..n): each gets owner count 1. Pages come in
 * ascending order from a fresh arena and most-recently-freed first afterwards. Returns MS_OK, or
 * MS_ERR_CAPACITY with nothing taken when fewer than n are free (n <= 0: MS_OK, nothing taken).
 */
ms_status ms_page_arena_acquire(ms_page_arena *arena, int32_t n, int32_t *out);

/*
 * Drop one ownership of each of pages[0..n); a page whose count reaches 0 returns to the free
 * list. Validates every page first (range, not the sink page, enough owners counting repeats
 * within the call) and changes nothing on failure: MS_ERR_INVALID_ARG naming the page
 * ("double free of page 7", "page 0 is the sink page").
 */
ms_status ms_page_arena_release(ms_page_arena *arena, const int32_t *pages, int32_t n,
                                ms_error *err);

/* Add one owner to each of pages[0..n) (shared pages). Validates first like release:
 * MS_ERR_INVALID_ARG for a free page, the sink page or an id out of range. */
ms_status ms_page_arena_retain(ms_page_arena *arena, const int32_t *pages, int32_t n,
                               ms_error *err);

/*
 * Copy whole pages (every layer, K and V): page dst[i] receives what page src[i] held before the
 * call, for every i, as one parallel assignment, so the lists may overlap (chains and cycles are
 * ordered, cycles broken through the staging buffer). dst entries must be distinct. Copies are
 * queued on `stream` through the device (NULL: synchronous). Host bookkeeping uses buffers made
 * at init, so this allocates nothing. Errors: MS_ERR_INVALID_ARG (id out of range, duplicate
 * destination), device errors.
 */
ms_status ms_page_arena_copy_pages(ms_page_arena *arena, const int32_t *src, const int32_t *dst,
                                   int32_t n, ms_device_stream *stream, ms_error *err);

/*
 * Copy whole pages between two arenas of the same geometry (offload / reload): page dst[i] of
 * `to` receives page src[i] of `from`, every layer, as `kind` on `stream`. Errors:
 * MS_ERR_INVALID_ARG (geometry differs, id out of range), device errors.
 */
ms_status ms_page_arena_copy_across(ms_page_arena *from, const int32_t *src, ms_page_arena *to,
                                    const int32_t *dst, int32_t n, ms_copy_kind kind,
                                    ms_device_stream *stream, ms_error *err);

/* Free pages right now. */
int32_t ms_page_arena_num_free(ms_page_arena *arena);
/* Total pages (including the sink page); usable pages = this - 1. */
int32_t ms_page_arena_num_pages(const ms_page_arena *arena);
/* Owner count of one page (the sink page reports 1). -1 for an id out of range. */
int32_t ms_page_arena_owners(ms_page_arena *arena, int32_t page);
/* Tokens per page. */
int32_t ms_page_arena_page_size(const ms_page_arena *arena);
/* The configuration (n_pages resolved) and measured size. */
const ms_page_arena_config *ms_page_arena_get_config(const ms_page_arena *arena);
const ms_page_arena_size *ms_page_arena_get_size(const ms_page_arena *arena);
/* The device holding the tensor. */
ms_device *ms_page_arena_device(const ms_page_arena *arena);
/* Base address of the tensor (device memory). */
void *ms_page_arena_data(const ms_page_arena *arena);
/*
 * Address of token `slot` of page `page` in layer `layer`, K (kv = 0) or V (kv = 1): the start of
 * its [n_kv_heads, head_dim] row. Asserts the indices are in range.
 */
void *ms_page_arena_token_ptr(const ms_page_arena *arena, int32_t layer, int32_t page, int kv,
                              int32_t slot);

#ifdef __cplusplus
}
#endif
#endif /* MS_PAGE_ARENA_H */
