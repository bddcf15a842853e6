/*
 * prefix_cache.c - see prefix_cache.h.
 *
 * Layout: a fixed array of entries (key, page, LRU links) with a free-entry stack, an
 * open-addressing index of 2^k >= 2 * max_entries slots (linear probing, backward-shift deletion:
 * no tombstones, so probe lengths stay short under churn), and a doubly linked recency list
 * (head = least recently used). Everything is allocated at init.
 */
#include "prefix_cache.h"

#include <pthread.h>
#include <string.h>
/* XXH3_state_t on the stack (no allocation per key): the static-linking-only declarations */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

typedef struct entry {
    ms_prefix_key key;
    int32_t page;
    int32_t prev, next; /* recency list, -1 ends */
} entry;

struct ms_prefix_cache {
    ms_page_arena *arena; /* borrowed */
    int32_t page_size;
    int32_t max_entries;
    entry *entries;     /* [max_entries] */
    int32_t *free_ids;  /* [max_entries] stack of unused entry ids */
    int32_t n_free;
    int32_t *index;     /* [index_cap] entry id or -1 */
    uint32_t index_mask;
    int32_t lru_head, lru_tail;
    int32_t n_entries;
    ms_prefix_stats stats;
    pthread_mutex_t mu;
};

/* ---- keys ---- */

static void put_u64(unsigned char *b, uint64_t v) {
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(v >> (8 * i));
}

static void hash_str(XXH3_state_t *st, const char *s) {
    /* length-prefixed so ("ab", "c") and ("a", "bc") differ */
    size_t n = s != NULL ? strlen(s) : 0;
    unsigned char len[8];
    put_u64(len, (uint64_t)n);
    XXH3_128bits_update(st, len, sizeof len);
    if (n > 0)
        XXH3_128bits_update(st, s, n);
}

static ms_prefix_key from_xxh(XXH128_hash_t h) {
    ms_prefix_key k = {h.low64, h.high64};
    return k;
}

ms_status ms_prefix_root(const ms_prefix_fingerprint *fp, ms_prefix_key *out, ms_error *err) {
    if (fp == NULL || fp->page_size < 1)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "prefix cache: page_size %d must be >= 1",
                       fp != NULL ? fp->page_size : 0);
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_128bits_reset(&st);
    hash_str(&st, "mstar-c prefix v1");
    hash_str(&st, fp->model);
    hash_str(&st, fp->weights);
    hash_str(&st, fp->kv_dtype);
    unsigned char ps[8];
    put_u64(ps, (uint64_t)(uint32_t)fp->page_size);
    XXH3_128bits_update(&st, ps, sizeof ps);
    hash_str(&st, fp->positions);
    *out = from_xxh(XXH3_128bits_digest(&st));
    return MS_OK;
}

ms_prefix_key ms_prefix_page_key(ms_prefix_key parent, const int32_t *tokens, int32_t page_size,
                                 const void *extra, size_t extra_len) {
    XXH3_state_t st;
    XXH3_INITSTATE(&st);
    XXH3_128bits_reset(&st);
    unsigned char b[16];
    put_u64(b, parent.lo);
    put_u64(b + 8, parent.hi);
    XXH3_128bits_update(&st, b, sizeof b);
    for (int32_t i = 0; i < page_size; i++) {
        uint32_t v = (uint32_t)tokens[i];
        unsigned char t[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                              (unsigned char)(v >> 24)};
        XXH3_128bits_update(&st, t, sizeof t);
    }
    if (extra != NULL && extra_len > 0)
        XXH3_128bits_update(&st, extra, extra_len);
    return from_xxh(XXH3_128bits_digest(&st));
}

/* ---- index ---- */

static uint32_t slot_of(const ms_prefix_cache *c, ms_prefix_key k) {
    return (uint32_t)(k.lo ^ (k.hi * 0x9E3779B97F4A7C15ull)) & c->index_mask;
}

static bool key_eq(ms_prefix_key a, ms_prefix_key b) { return a.lo == b.lo && a.hi == b.hi; }

/* Entry id listed under k, or -1; *slot_out receives its index slot (or the empty slot ending
 * the probe). */
static int32_t find(const ms_prefix_cache *c, ms_prefix_key k, uint32_t *slot_out) {
    uint32_t s = slot_of(c, k);
    for (;;) {
        int32_t id = c->index[s];
        if (id < 0 || key_eq(c->entries[id].key, k)) {
            if (slot_out != NULL)
                *slot_out = s;
            return id;
        }
        s = (s + 1) & c->index_mask;
    }
}

/* Remove the index slot s (occupied) with backward-shift deletion. */
static void index_remove(ms_prefix_cache *c, uint32_t s) {
    uint32_t hole = s;
    uint32_t j = s;
    for (;;) {
        j = (j + 1) & c->index_mask;
        int32_t id = c->index[j];
        if (id < 0)
            break;
        uint32_t home = slot_of(c, c->entries[id].key);
        /* move j into the hole unless its home lies cyclically in (hole, j] */
        bool stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!stays) {
            c->index[hole] = id;
            hole = j;
        }
    }
    c->index[hole] = -1;
}

/* ---- recency list ---- */

static void lru_unlink(ms_prefix_cache *c, int32_t id) {
    entry *e = &c->entries[id];
    if (e->prev >= 0)
        c->entries[e->prev].next = e->next;
    else
        c->lru_head = e->next;
    if (e->next >= 0)
        c->entries[e->next].prev = e->prev;
    else
        c->lru_tail = e->prev;
    e->prev = e->next = -1;
}

static void lru_push_tail(ms_prefix_cache *c, int32_t id) {
    entry *e = &c->entries[id];
    e->prev = c->lru_tail;
    e->next = -1;
    if (c->lru_tail >= 0)
        c->entries[c->lru_tail].next = id;
    else
        c->lru_head = id;
    c->lru_tail = id;
}

/* ---- life cycle ---- */

ms_status ms_prefix_cache_init(ms_page_arena *arena, int32_t max_entries, ms_prefix_cache **out,
                               ms_error *err) {
    *out = NULL;
    if (arena == NULL || max_entries < 1 || max_entries > (1 << 28))
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "prefix cache: max_entries %d must be in [1, 2^28] (and an arena given)",
                       max_entries);
    uint32_t cap = 16;
    while (cap < 2u * (uint32_t)max_entries)
        cap <<= 1;
    ms_prefix_cache *c = ms_calloc(1, sizeof *c);
    if (c == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "prefix cache: out of memory");
    c->entries = ms_calloc((size_t)max_entries, sizeof *c->entries);
    c->free_ids = ms_calloc((size_t)max_entries, sizeof *c->free_ids);
    c->index = ms_malloc((size_t)cap * sizeof *c->index);
    if (c->entries == NULL || c->free_ids == NULL || c->index == NULL) {
        ms_free(c->entries);
        ms_free(c->free_ids);
        ms_free(c->index);
        ms_free(c);
        return MS_FAIL(err, MS_ERR_OOM, "prefix cache: out of memory for %d entries",
                       max_entries);
    }
    for (uint32_t i = 0; i < cap; i++)
        c->index[i] = -1;
    for (int32_t i = 0; i < max_entries; i++)
        c->free_ids[i] = max_entries - 1 - i;
    c->n_free = max_entries;
    c->index_mask = cap - 1;
    c->arena = arena;
    c->page_size = ms_page_arena_page_size(arena);
    c->max_entries = max_entries;
    c->lru_head = c->lru_tail = -1;
    pthread_mutex_init(&c->mu, NULL);
    *out = c;
    return MS_OK;
}

void ms_prefix_cache_free(ms_prefix_cache *c) {
    if (c == NULL)
        return;
    for (int32_t id = c->lru_head; id >= 0; id = c->entries[id].next) {
        int32_t page = c->entries[id].page;
        (void)ms_page_arena_release(c->arena, &page, 1, NULL);
    }
    pthread_mutex_destroy(&c->mu);
    ms_free(c->entries);
    ms_free(c->free_ids);
    ms_free(c->index);
    ms_free(c);
}

/* Drop entry id (listed) and the cache's owner of its page. Caller holds mu. */
static void drop(ms_prefix_cache *c, int32_t id) {
    uint32_t s;
    int32_t found = find(c, c->entries[id].key, &s);
    if (found == id)
        index_remove(c, s);
    lru_unlink(c, id);
    int32_t page = c->entries[id].page;
    (void)ms_page_arena_release(c->arena, &page, 1, NULL);
    c->free_ids[c->n_free++] = id;
    c->n_entries--;
}

/* Evict up to want unreferenced pages, oldest first. Caller holds mu. */
static int32_t evict_locked(ms_prefix_cache *c, int32_t want) {
    int32_t n = 0;
    for (int32_t id = c->lru_head; id >= 0 && n < want;) {
        int32_t next = c->entries[id].next;
        if (ms_page_arena_owners(c->arena, c->entries[id].page) == 1) {
            drop(c, id);
            n++;
        }
        id = next;
    }
    c->stats.evictions += (uint64_t)n;
    return n;
}

/* ---- operations ---- */

int32_t ms_prefix_cache_lookup(ms_prefix_cache *c, ms_prefix_key root, const int32_t *tokens,
                               int32_t n_tokens, const ms_prefix_extra *page_extra,
                               int32_t max_pages, int32_t *pages_out, ms_prefix_key *keys_out) {
    if (c == NULL || tokens == NULL || n_tokens <= 1 || max_pages <= 0)
        return 0;
    int32_t limit = (n_tokens - 1) / c->page_size; /* the last token is always computed */
    if (limit > max_pages)
        limit = max_pages;
    pthread_mutex_lock(&c->mu);
    c->stats.lookups++;
    ms_prefix_key key = root;
    int32_t hit = 0;
    for (; hit < limit; hit++) {
        const void *x = page_extra != NULL ? page_extra[hit].data : NULL;
        size_t xl = page_extra != NULL ? page_extra[hit].len : 0;
        key = ms_prefix_page_key(key, tokens + (size_t)hit * (size_t)c->page_size, c->page_size,
                                 x, xl);
        int32_t id = find(c, key, NULL);
        if (id < 0)
            break;
        int32_t page = c->entries[id].page;
        if (ms_page_arena_retain(c->arena, &page, 1, NULL) != MS_OK)
            break; /* cannot happen: the cache owns it */
        lru_unlink(c, id);
        lru_push_tail(c, id);
        pages_out[hit] = page;
        if (keys_out != NULL)
            keys_out[hit] = key;
    }
    c->stats.hit_pages += (uint64_t)hit;
    c->stats.hit_tokens += (uint64_t)hit * (uint64_t)c->page_size;
    pthread_mutex_unlock(&c->mu);
    return hit;
}

ms_status ms_prefix_cache_insert(ms_prefix_cache *c, ms_prefix_key key, int32_t page,
                                 int32_t *listed, ms_error *err) {
    *listed = -1;
    pthread_mutex_lock(&c->mu);
    int32_t id = find(c, key, NULL);
    if (id >= 0) {
        *listed = c->entries[id].page;
        lru_unlink(c, id);
        lru_push_tail(c, id);
        pthread_mutex_unlock(&c->mu);
        return MS_OK;
    }
    if (ms_page_arena_owners(c->arena, page) < 1 || page == MS_SINK_PAGE) {
        pthread_mutex_unlock(&c->mu);
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "prefix cache: page %d is free, the sink page or out of range", page);
    }
    if (c->n_free == 0 && evict_locked(c, 1) == 0) {
        pthread_mutex_unlock(&c->mu);
        return MS_OK; /* full of referenced pages: not listed */
    }
    ms_status st = ms_page_arena_retain(c->arena, &page, 1, err);
    if (st != MS_OK) {
        pthread_mutex_unlock(&c->mu);
        return st;
    }
    id = c->free_ids[--c->n_free];
    c->entries[id].key = key;
    c->entries[id].page = page;
    uint32_t s;
    (void)find(c, key, &s);
    c->index[s] = id;
    lru_push_tail(c, id);
    c->n_entries++;
    c->stats.inserts++;
    *listed = page;
    pthread_mutex_unlock(&c->mu);
    return MS_OK;
}

int32_t ms_prefix_cache_evict(ms_prefix_cache *c, int32_t want) {
    if (c == NULL || want <= 0)
        return 0;
    pthread_mutex_lock(&c->mu);
    int32_t n = evict_locked(c, want);
    pthread_mutex_unlock(&c->mu);
    return n;
}

bool ms_prefix_cache_contains(ms_prefix_cache *c, ms_prefix_key key, int32_t *page) {
    pthread_mutex_lock(&c->mu);
    int32_t id = find(c, key, NULL);
    if (id >= 0 && page != NULL)
        *page = c->entries[id].page;
    pthread_mutex_unlock(&c->mu);
    return id >= 0;
}

ms_prefix_stats ms_prefix_cache_stats(ms_prefix_cache *c) {
    pthread_mutex_lock(&c->mu);
    ms_prefix_stats s = c->stats;
    s.entries = c->n_entries;
    s.unreferenced = 0;
    for (int32_t id = c->lru_head; id >= 0; id = c->entries[id].next)
        if (ms_page_arena_owners(c->arena, c->entries[id].page) == 1)
            s.unreferenced++;
    pthread_mutex_unlock(&c->mu);
    return s;
}

int32_t ms_prefix_cache_pages(ms_prefix_cache *c, int32_t *out, int32_t max) {
    pthread_mutex_lock(&c->mu);
    int32_t n = 0;
    for (int32_t id = c->lru_head; id >= 0; id = c->entries[id].next, n++)
        if (n < max)
            out[n] = c->entries[id].page;
    pthread_mutex_unlock(&c->mu);
    return n;
}
