/*
 * tp_check.h - tensor-parallel symmetry of the KV allocation.
 *
 * Every rank of a tensor-parallel group runs the same admissions over its own shard of the KV
 * heads, so page ids must be identical on every rank: a kernel on rank 1 reads the page rank 0's
 * scheduler chose. Any per-rank difference (a config that sizes one rank's arena differently,
 * requests admitted on one rank before warm-up, a divergent LRU victim) desynchronises them
 * silently. The Python original checks once after CUDA-graph warm-up (post_warmup_validate,
 * reference §7.6) and only the free count; hazard H17 says once is not enough and a count can
 * match while the page tables differ. This check all-gathers the pool's allocation digest (free
 * counts, and an XXH3-128 digest of every stream's page list: kv_pool.h) and fails loudly on any
 * difference, naming the ranks and what differs. It is cheap (one all-gather of 32 bytes), so the
 * engine runs it after warm-up and every N steps.
 */
#ifndef MS_TP_CHECK_H
#define MS_TP_CHECK_H

#include "collective.h"
#include "kv_pool.h"
#include "ms_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Compare pool's allocation digest across the ranks of c (every rank must call). `when` names
 * the point in messages ("after warm-up", "step 4096"). Returns MS_OK when every rank agrees;
 * MS_ERR_STATE on every rank when any differs, e.g. "tensor parallel: KV allocation differs
 * across ranks after warm-up: rank 0 has 120 free pages, rank 2 has 119" or "... the page tables
 * of rank 0 and rank 1 differ with 120 free pages each (digests 1f3a... and 9b02...)";
 * transport errors as they come.
 */
ms_status ms_tp_check_allocation(const ms_collective *c, ms_kv_pool *pool, const char *when,
                                 ms_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MS_TP_CHECK_H */
