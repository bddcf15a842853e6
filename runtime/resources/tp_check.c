/*
 * tp_check.c - see tp_check.h.
 */
#include "tp_check.h"

#include <string.h>

/* What each rank contributes: fixed-width little-endian-agnostic fields (all ranks share one
 * host architecture in a group). */
typedef struct wire {
    uint64_t lo, hi;
    int32_t n_requests, n_free, n_host_free, pad;
} wire;

ms_status ms_tp_check_allocation(const ms_collective *c, ms_kv_pool *pool, const char *when,
                                 ms_error *err) {
    if (c == NULL || c->world < 1 || c->rank < 0 || c->rank >= c->world)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "tensor parallel: no valid collective");
    ms_kv_pool_digest d = ms_kv_pool_allocation_digest(pool);
    wire mine = {d.lo, d.hi, d.n_requests, d.n_free, d.n_host_free, 0};
    wire *all = ms_calloc((size_t)c->world, sizeof *all);
    if (all == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "tensor parallel: out of memory for %d ranks", c->world);
    ms_status st = ms_collective_all_gather(c, &mine, sizeof mine, all, err);
    if (st != MS_OK) {
        ms_free(all);
        return st;
    }
    const char *at = when != NULL ? when : "now";
    for (int32_t r = 1; r < c->world && st == MS_OK; r++) {
        const wire *a = &all[0], *b = &all[r];
        if (a->n_free != b->n_free)
            st = MS_FAIL(err, MS_ERR_STATE,
                         "tensor parallel: KV allocation differs across ranks %s: rank 0 has %d "
                         "free pages, rank %d has %d",
                         at, a->n_free, r, b->n_free);
        else if (a->n_host_free != b->n_host_free)
            st = MS_FAIL(err, MS_ERR_STATE,
                         "tensor parallel: host KV tier differs across ranks %s: rank 0 has %d "
                         "free host pages, rank %d has %d",
                         at, a->n_host_free, r, b->n_host_free);
        else if (a->n_requests != b->n_requests)
            st = MS_FAIL(err, MS_ERR_STATE,
                         "tensor parallel: KV allocation differs across ranks %s: rank 0 holds %d "
                         "requests, rank %d holds %d",
                         at, a->n_requests, r, b->n_requests);
        else if (a->lo != b->lo || a->hi != b->hi)
            st = MS_FAIL(err, MS_ERR_STATE,
                         "tensor parallel: KV allocation differs across ranks %s: the page tables "
                         "of rank 0 and rank %d differ with %d free pages each (digests "
                         "%016llx%016llx and %016llx%016llx)",
                         at, r, a->n_free, (unsigned long long)a->hi, (unsigned long long)a->lo,
                         (unsigned long long)b->hi, (unsigned long long)b->lo);
    }
    ms_free(all);
    return st;
}
