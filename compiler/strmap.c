/*
 * strmap.c - string-keyed open-addressing hash table in an arena (see strmap.h).
 */
#include "strmap.h"

#include <string.h>

static size_t hash_str(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a, 64-bit */
    for (; *s != '\0'; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ull;
    }
    return (size_t)(h ^ (h >> 32));
}

void ms_strmap_init(ms_strmap *m, ms_arena *arena) {
    memset(m, 0, sizeof *m);
    m->arena = arena;
}

/* The slot of `key`, or the empty slot where it would go. m->cap > 0. */
static size_t slot_of(const ms_strmap *m, const char *key) {
    size_t mask = m->cap - 1;
    size_t i = hash_str(key) & mask;
    while (m->keys[i] != NULL && strcmp(m->keys[i], key) != 0)
        i = (i + 1) & mask;
    return i;
}

void *ms_strmap_get(const ms_strmap *m, const char *key) {
    if (m->cap == 0)
        return NULL;
    size_t i = slot_of(m, key);
    return m->keys[i] != NULL ? m->vals[i] : NULL;
}

static bool grow(ms_strmap *m) {
    size_t ncap = m->cap < 16 ? 16 : m->cap * 2;
    const char **keys = ms_arena_alloc(m->arena, ncap * sizeof *keys);
    void **vals = ms_arena_alloc(m->arena, ncap * sizeof *vals);
    if (keys == NULL || vals == NULL)
        return false;
    ms_strmap old = *m;
    m->keys = keys;
    m->vals = vals;
    m->cap = ncap;
    for (size_t i = 0; i < old.cap; i++) {
        if (old.keys[i] == NULL)
            continue;
        size_t j = slot_of(m, old.keys[i]);
        m->keys[j] = old.keys[i];
        m->vals[j] = old.vals[i];
    }
    return true;
}

void ms_strmap_put(ms_strmap *m, const char *key, void *val) {
    if ((m->n + 1) * 2 > m->cap && !grow(m))
        return; /* the arena had no jmp_buf: the key is dropped, lookups fall back to absent */
    size_t i = slot_of(m, key);
    if (m->keys[i] == NULL) {
        m->keys[i] = key;
        m->n++;
    }
    m->vals[i] = val;
}
