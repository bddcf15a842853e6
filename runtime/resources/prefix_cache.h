/*
 * prefix_cache.h - sealed KV pages shared across requests (automatic prefix caching).
 *
 * A full ("sealed") page of a stream is named by a chained key: the key of page i covers the key
 * of page i - 1 (its parent), the page's token ids and anything else that changes its KV (an
 * explicit position stream, the CFG label's role), so two requests share page i only when their
 * whole prefix up to and including it is identical. The chain is rooted in a fingerprint of
 * everything that changes KV for the same ids: model, weights, KV dtype, page size and position
 * scheme. Keys are XXH3-128 (xxHash, the maintained library vLLM's prefix cache also offers as
 * its "xxhash" hash; 128 bits make an accidental collision in a cache of 10^9 pages about
 * 10^-20), computed with the streaming API over the little-endian bytes described at
 * ms_prefix_page_key.
 *
 * Ownership of pages (page_arena.h owner counts): the cache holds ONE owner on every page it
 * lists; each request using a cached page holds one more (ms_prefix_cache_lookup retains for the
 * caller). A page whose only owner is the cache is "unreferenced": it stays cached and is evicted
 * least-recently-used (ms_prefix_cache_evict) when admit needs pages. The cache never touches a
 * page a request still holds. A page inserted by a request keeps being owned by that request
 * too; the request releases its own owner as usual.
 *
 * What may be inserted (the caller's duty, checked by tests of the pool): only pages whose every
 * token is computed and committed (sealed), of streams whose chain is unbroken from the root
 * (a stream that a sliding window has already released pages of no longer inserts: its early
 * pages went back to the arena and the chain cannot be continued), never a scratch or a
 * cross-attention context page.
 *
 * A lookup never returns the page holding a prompt's last token: of n prompt tokens at most
 * (n - 1) / page_size full pages hit, so a request whose whole prompt is cached still computes
 * its last token and gets logits (vLLM PR #11186, llama.cpp #1884).
 *
 * Thread safety: every function takes the cache's mutex (the arena has its own), so the cache
 * may be shared by several pools of one arena.
 *
 * Ownership of the object: created by ms_prefix_cache_init, released with ms_prefix_cache_free,
 * which drops the cache's owner of every listed page (before the arena is freed). The arena is
 * borrowed and must outlive the cache.
 */
#ifndef MS_PREFIX_CACHE_H
#define MS_PREFIX_CACHE_H

#include "ms_base.h"
#include "page_arena.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A 128-bit page key (XXH3-128: low and high 64 bits). */
typedef struct ms_prefix_key {
    uint64_t lo;
    uint64_t hi;
} ms_prefix_key;

/* What roots a chain: every field that changes the KV computed for the same token ids.
 * Strings are borrowed for the call; NULL counts as "". */
typedef struct ms_prefix_fingerprint {
    const char *model;        /* model file name or descriptor name ("llama") */
    const char *weights;      /* a digest or unique path + size + mtime of the checkpoint */
    const char *kv_dtype;     /* "bf16", "f16", "f32" */
    int32_t page_size;        /* tokens per page, >= 1 */
    const char *positions;    /* position scheme and its parameters ("rope theta=500000 ...") */
} ms_prefix_fingerprint;

/* Counters (all since init). */
typedef struct ms_prefix_stats {
    uint64_t lookups;      /* ms_prefix_cache_lookup calls */
    uint64_t hit_pages;    /* pages returned by lookups */
    uint64_t hit_tokens;   /* hit_pages * page_size */
    uint64_t inserts;      /* pages newly listed */
    uint64_t evictions;    /* pages dropped by ms_prefix_cache_evict */
    int32_t entries;       /* pages listed now */
    int32_t unreferenced;  /* listed pages whose only owner is the cache */
} ms_prefix_stats;

typedef struct ms_prefix_cache ms_prefix_cache;

/* The root key of a chain. Errors: MS_ERR_INVALID_ARG for page_size < 1. */
ms_status ms_prefix_root(const ms_prefix_fingerprint *fp, ms_prefix_key *out, ms_error *err);

/*
 * The key of one full page: XXH3-128 over, in order, parent.lo and parent.hi (8 bytes each,
 * little-endian), the page's page_size token ids (int32 little-endian), then extra[0..extra_len)
 * (explicit positions, the label's role; may be NULL when extra_len is 0).
 */
ms_prefix_key ms_prefix_page_key(ms_prefix_key parent, const int32_t *tokens, int32_t page_size,
                                 const void *extra, size_t extra_len);

/*
 * Make a cache over `arena` listing at most max_entries pages (>= 1; the table is sized for it up
 * front, so nothing allocates afterwards). Errors: MS_ERR_INVALID_ARG, MS_ERR_OOM.
 */
ms_status ms_prefix_cache_init(ms_page_arena *arena, int32_t max_entries, ms_prefix_cache **out,
                               ms_error *err);

/* Drop the cache's owner of every listed page and free the cache (NULL is a no-op). */
void ms_prefix_cache_free(ms_prefix_cache *cache);

/* Extra bytes of one page's key (ms_prefix_page_key's extra). */
typedef struct ms_prefix_extra {
    const void *data; /* bytes that change page i's KV besides its ids (may be NULL) */
    size_t len;
} ms_prefix_extra;

/*
 * Longest cached prefix of a prompt: walks the full pages of tokens[0..n_tokens) from `root`
 * (page i's key computed with page_extra[i] when page_extra is not NULL: then it has at least
 * min(max_pages, (n_tokens - 1) / page_size) entries; else with no extra bytes) and stops at
 * the first page not listed, at max_pages, or at (n_tokens - 1) / page_size pages (the last token
 * is always computed). Every page returned gets one more owner (the caller's: release it like a
 * page of its own) and becomes most recently used. keys_out (may be NULL) receives the keys of
 * the hit pages, so the caller can continue the chain. Returns the number of pages hit (0 when
 * n_tokens <= page_size or nothing is cached).
 */
int32_t ms_prefix_cache_lookup(ms_prefix_cache *cache, ms_prefix_key root, const int32_t *tokens,
                               int32_t n_tokens, const ms_prefix_extra *page_extra,
                               int32_t max_pages, int32_t *pages_out, ms_prefix_key *keys_out);

/*
 * List a sealed page under `key`. The cache takes its own owner of `page` (the caller keeps
 * its). When `key` is already listed (another request sealed the same prefix first), nothing
 * changes and *listed receives the page already listed (the caller may switch to it and release
 * its own copy); otherwise *listed = page. When the table is full the least recently used
 * unreferenced page is evicted first; when every listed page is referenced, the page is not
 * listed (*listed = -1, MS_OK: caching is an optimisation). Errors: MS_ERR_INVALID_ARG for a page
 * that is free, the sink page or out of range (nothing changes).
 */
ms_status ms_prefix_cache_insert(ms_prefix_cache *cache, ms_prefix_key key, int32_t page,
                                 int32_t *listed, ms_error *err);

/*
 * Evict up to `want` unreferenced pages, least recently used first, returning them to the
 * arena's free list. Returns the number evicted (fewer when fewer are unreferenced).
 */
int32_t ms_prefix_cache_evict(ms_prefix_cache *cache, int32_t want);

/* Whether `key` is listed; *page receives its page when it is (page may be NULL). Does not
 * change recency. */
bool ms_prefix_cache_contains(ms_prefix_cache *cache, ms_prefix_key key, int32_t *page);

/* Current counters. */
ms_prefix_stats ms_prefix_cache_stats(ms_prefix_cache *cache);

/* Listed pages in recency order, least recent first, into out[0..max); returns how many are
 * listed (may exceed max). For tests and /metrics. */
int32_t ms_prefix_cache_pages(ms_prefix_cache *cache, int32_t *out, int32_t max);

#ifdef __cplusplus
}
#endif
#endif /* MS_PREFIX_CACHE_H */
