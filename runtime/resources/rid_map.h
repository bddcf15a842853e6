/*
 * rid_map.h - a small hash map from request id to a fixed-size value record, for resources that
 * keep per-request state on the host (positions, cross-attention).
 *
 * Open addressing with linear probing and backward-shift deletion (no tombstones), so a long
 * stream of ingest/remove never degrades lookups. Values are stored inline, zero-filled on
 * creation. Pointers returned by get/put stay valid until the next put or remove (a put may
 * rehash). Not thread-safe: the owning resource serialises access.
 *
 * Ownership: the map owns its storage; ms_rid_map_free releases it (accepts a zeroed map).
 *
 * Usage:
 *     ms_rid_map m;
 *     ms_rid_map_init(&m, sizeof(my_state));
 *     my_state *st; bool created;
 *     MS_TRY(ms_rid_map_put(&m, rid, (void **)&st, &created));
 *     ms_rid_map_free(&m);
 */
#ifndef MS_RID_MAP_H
#define MS_RID_MAP_H

#include "resource.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Map state; treat fields as private (embedded by value in resources). */
typedef struct ms_rid_map {
    size_t value_size; /* bytes of one value record */
    size_t cap;        /* buckets, 0 or a power of two */
    size_t count;      /* live entries */
    ms_rid *keys;      /* [cap] */
    bool *used;        /* [cap] bucket occupied */
    unsigned char *values; /* [cap * value_size] */
} ms_rid_map;

/* Set up an empty map of `value_size`-byte records (> 0). Allocates nothing. */
void ms_rid_map_init(ms_rid_map *m, size_t value_size);

/* Release the map's storage; the map becomes empty (init state). */
void ms_rid_map_free(ms_rid_map *m);

/* Value of rid, or NULL when absent. */
void *ms_rid_map_get(const ms_rid_map *m, ms_rid rid);

/*
 * Find or create rid's value. *value receives its address; *created (may be NULL) says whether it
 * was created (zero-filled). Returns MS_ERR_OOM (map unchanged) when growing fails.
 */
ms_status ms_rid_map_put(ms_rid_map *m, ms_rid rid, void **value, bool *created);

/* Remove rid; returns whether it was present. Never allocates. */
bool ms_rid_map_remove(ms_rid_map *m, ms_rid rid);

/* Number of entries. */
static inline size_t ms_rid_map_count(const ms_rid_map *m) { return m->count; }

/*
 * Iterate: start with *cursor = 0; returns the next value (and its rid in *rid) or NULL at the
 * end. The map must not be modified during iteration.
 */
void *ms_rid_map_next(const ms_rid_map *m, size_t *cursor, ms_rid *rid);

#ifdef __cplusplus
}
#endif
#endif /* MS_RID_MAP_H */
