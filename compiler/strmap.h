/*
 * strmap.h - a string-keyed hash table in a compilation's arena, for the name lookups of the
 * semantic pass (config parameters, weights, groups, resources, steps, forward bindings), so
 * checking a model is linear in its size rather than quadratic (a 100k-parameter config).
 *
 * Open addressing with linear probing, FNV-1a hashing, kept at most half full; growth doubles
 * the table and abandons the old slots in the arena (CONVENTIONS.md item 5: nothing is freed
 * one by one). Keys are borrowed: they must live as long as the map (arena strings do).
 * Values are opaque non-NULL pointers (NULL means absent).
 *
 * Usage:
 *     ms_strmap m;
 *     ms_strmap_init(&m, arena);
 *     ms_strmap_put(&m, p->name, p);
 *     ms_param *q = ms_strmap_get(&m, "hidden_size");   // NULL when absent
 */
#ifndef MS_STRMAP_H
#define MS_STRMAP_H

#include "arena.h"

typedef struct ms_strmap {
    ms_arena *arena;      /* where the slots live */
    const char **keys;    /* [cap] borrowed keys, NULL = empty slot */
    void **vals;          /* [cap] */
    size_t cap;           /* 0 or a power of two */
    size_t n;             /* keys in use, <= cap / 2 */
} ms_strmap;

/* An empty map over `arena` (allocates nothing yet). */
MS_INTERNAL void ms_strmap_init(ms_strmap *m, ms_arena *arena);

/* The value of `key`, or NULL. */
MS_INTERNAL void *ms_strmap_get(const ms_strmap *m, const char *key);

/* Set `key` to `val` (a new key or a replaced value); val NULL removes nothing but makes the key
 * read as absent. Out of memory unwinds like the arena (its jmp_buf). */
MS_INTERNAL void ms_strmap_put(ms_strmap *m, const char *key, void *val);

#endif /* MS_STRMAP_H */
