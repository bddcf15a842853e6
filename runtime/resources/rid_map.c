/*
 * rid_map.c - open-addressing hash map rid -> inline value record (see rid_map.h).
 *
 * Load factor is kept at or below 1/2; deletion shifts following entries back so probe chains
 * never contain holes.
 */
#include "rid_map.h"

#include <string.h>

/* ---- helpers ---- */

static size_t rid_hash(ms_rid rid) {
    /* splitmix64 finaliser: dummy ids (1 << 63 | small) and sequential ids spread well */
    uint64_t x = rid;
    x ^= x >> 30;
    x *= UINT64_C(0xbf58476d1ce4e5b9);
    x ^= x >> 27;
    x *= UINT64_C(0x94d049bb133111eb);
    x ^= x >> 31;
    return (size_t)x;
}

static unsigned char *slot_value(const ms_rid_map *m, size_t i) {
    return m->values + i * m->value_size;
}

static size_t find_slot(const ms_rid_map *m, ms_rid rid, bool *found) {
    size_t mask = m->cap - 1;
    size_t i = rid_hash(rid) & mask;
    while (m->used[i]) {
        if (m->keys[i] == rid) {
            *found = true;
            return i;
        }
        i = (i + 1) & mask;
    }
    *found = false;
    return i;
}

static ms_status rehash(ms_rid_map *m, size_t new_cap) {
    ms_rid *keys = ms_calloc(new_cap, sizeof *keys);
    bool *used = ms_calloc(new_cap, sizeof *used);
    unsigned char *values = ms_calloc(new_cap, m->value_size);
    if (keys == NULL || used == NULL || values == NULL) {
        ms_free(keys);
        ms_free(used);
        ms_free(values);
        return MS_ERR_OOM;
    }
    ms_rid_map next = {m->value_size, new_cap, 0, keys, used, values};
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->used[i])
            continue;
        bool found;
        size_t j = find_slot(&next, m->keys[i], &found);
        next.used[j] = true;
        next.keys[j] = m->keys[i];
        memcpy(slot_value(&next, j), slot_value(m, i), m->value_size);
        next.count++;
    }
    ms_free(m->keys);
    ms_free(m->used);
    ms_free(m->values);
    *m = next;
    return MS_OK;
}

/* ---- public ---- */

void ms_rid_map_init(ms_rid_map *m, size_t value_size) {
    MS_ASSERT(value_size > 0);
    memset(m, 0, sizeof *m);
    m->value_size = value_size;
}

void ms_rid_map_free(ms_rid_map *m) {
    if (m == NULL)
        return;
    ms_free(m->keys);
    ms_free(m->used);
    ms_free(m->values);
    size_t vs = m->value_size;
    memset(m, 0, sizeof *m);
    m->value_size = vs;
}

void *ms_rid_map_get(const ms_rid_map *m, ms_rid rid) {
    if (m->cap == 0)
        return NULL;
    bool found;
    size_t i = find_slot(m, rid, &found);
    return found ? slot_value(m, i) : NULL;
}

ms_status ms_rid_map_put(ms_rid_map *m, ms_rid rid, void **value, bool *created) {
    if (m->cap != 0) {
        bool found;
        size_t i = find_slot(m, rid, &found);
        if (found) {
            *value = slot_value(m, i);
            if (created != NULL)
                *created = false;
            return MS_OK;
        }
    }
    if ((m->count + 1) * 2 > m->cap)
        MS_TRY(rehash(m, m->cap == 0 ? 16 : m->cap * 2));
    bool found;
    size_t i = find_slot(m, rid, &found);
    MS_ASSERT(!found);
    m->used[i] = true;
    m->keys[i] = rid;
    memset(slot_value(m, i), 0, m->value_size);
    m->count++;
    *value = slot_value(m, i);
    if (created != NULL)
        *created = true;
    return MS_OK;
}

bool ms_rid_map_remove(ms_rid_map *m, ms_rid rid) {
    if (m->cap == 0)
        return false;
    bool found;
    size_t i = find_slot(m, rid, &found);
    if (!found)
        return false;
    size_t mask = m->cap - 1;
    /* backward-shift deletion: move later chain members into the hole when their home allows */
    size_t hole = i;
    size_t j = (i + 1) & mask;
    while (m->used[j]) {
        size_t home = rid_hash(m->keys[j]) & mask;
        /* j may move to hole iff home is not cyclically in (hole, j] */
        bool stays = (hole <= j) ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!stays) {
            m->keys[hole] = m->keys[j];
            memcpy(slot_value(m, hole), slot_value(m, j), m->value_size);
            hole = j;
        }
        j = (j + 1) & mask;
    }
    m->used[hole] = false;
    m->count--;
    return true;
}

void *ms_rid_map_next(const ms_rid_map *m, size_t *cursor, ms_rid *rid) {
    for (size_t i = *cursor; i < m->cap; i++) {
        if (m->used[i]) {
            *cursor = i + 1;
            if (rid != NULL)
                *rid = m->keys[i];
            return slot_value(m, i);
        }
    }
    *cursor = m->cap;
    return NULL;
}
