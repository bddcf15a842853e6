/*
 * tp.h - tensor parallelism (Megatron-LM's layout, Shoeybi et al. 2019, §3; vLLM's
 * ColumnParallelLinear / RowParallelLinear / VocabParallelEmbedding) for the engine, below the
 * compiler: the generated forward runs unchanged on every rank, over a per-rank config.
 *
 * A group of N ranks is N engines, one per thread (per GPU on cuda: rank r on device r, an NCCL
 * communicator over the N GPUs, nccl_comm.h; on cpu: an in-process group, collective.h). The
 * caller holds only rank 0's engine (ms_engine_init with options.tp = N); ms_engine_add, _step
 * and _remove on it run on every rank at once (ms_tp_group_run), and every read (outputs,
 * logits, stats) is rank 0's.
 *
 * Per rank (ms_tp_rank):
 *   - config: config.json with num_attention_heads, num_key_value_heads and intermediate_size
 *     divided by N (head_dim written out when absent, so it stays hidden / heads of the full
 *     model); N must divide all three (else one line naming the numbers). The model's config
 *     loader and facts then give the local head counts: the KV pool holds kv_heads / N heads and
 *     the attention runs q_heads / N heads, with no change to the generated code.
 *   - weights: each weight's full shape (full config) against its local shape (local config)
 *     says how it is split: equal = replicated (norms, the embedding); dim 0 smaller =
 *     column-parallel (q/k/v and their biases, gate/up: rank r reads rows [r*n, (r+1)*n) of the
 *     checkpoint tensor); dim 1 smaller = row-parallel (o_proj, down_proj: columns
 *     [r*n, (r+1)*n)). The output head (a rank-2 weight that may be tied to the embedding,
 *     [vocab, hidden]) is vocabulary-parallel: rank r keeps rows [r*ceil(V/N), ...) only (a view
 *     of the replicated embedding when tied). Slices are views into the mmap'd checkpoint, so a
 *     rank reads (and stores) only its part: weight bytes per rank ~1/N (plus the replicated
 *     embedding and norms). The checkpoint is opened once for the group (engine_tp.c) and read by
 *     every rank (a GGUF is dequantized once).
 *   - ops: the backend's linear (and its fused silu_mul_linear / rms_norm_linear / linear_add /
 *     silu_mul_linear_add, when it has them) is hooked (ms_tp_rank_attach): a row-parallel
 *     weight's output is all-reduced (sum; its bias added on rank 0 only; a residual linear's
 *     product all-reduced before its add), the vocabulary-parallel head's local
 *     logits [rows, ceil(V/N)] are all-gathered into the full [rows, V] row; an embedding
 *     lookup into a split weight fails (one line) instead of reading a rank's rows. Every other
 *     op is the backend's own. The local group adds in rank order, so every rank holds bitwise the
 *     same hidden states and logits.
 *   - sampling: every rank samples its full (identical) logits row with the same request
 *     options, and then takes rank 0's ids (ms_tp_share_ids, an all-gather of n ids): rank 0
 *     is the sampler of record, so state only rank 0 holds cannot split the group.
 *   - KV: every rank runs the same admissions; after warm-up (init) and after every step the
 *     allocation digest of every rank is all-gathered and compared (resources/tp_check.h), and
 *     the step's row and token counts are compared, failing loudly naming the rank.
 *
 * Not with tensor parallelism (refused with one line): ms_engine_run_step, ms_engine_encode
 * (encoder nodes); CUDA graphs are turned off.
 *
 * Failure: a rank whose call fails aborts the group's transport (the local group's abort), so the
 * other ranks fail instead of waiting; after a failed group call every later one fails ("the
 * group failed earlier"). NCCL has no such abort here: a rank failing alone on cuda can leave the
 * others waiting inside NCCL (its semantics).
 */
#ifndef MS_TP_H
#define MS_TP_H

#include "backend.h"
#include "collective.h"
#include "hf_config.h"
#include "kv_pool.h"
#include "model_desc.h"
#include "ms_base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ms_tp_group ms_tp_group;

/* One rank's place in a group, handed to its engine through ms_engine_options.tp_member (set by
 * the group; library users set options.tp only). Borrowed from the group. */
typedef struct ms_tp_member {
    int32_t rank, world;
    ms_collective coll;   /* host collectives of the group (local group or NCCL) */
    void *nccl;           /* the rank's ms_nccl_comm on cuda, NULL on cpu */
    int32_t device;       /* CUDA ordinal of the rank (== rank) */
} ms_tp_member;

/* ---- per rank: config, weights, the linear hook ---- */

typedef struct ms_tp_rank ms_tp_rank;

/* How a weight is split across ranks. */
typedef enum ms_tp_split {
    MS_TP_REPLICATED = 0,
    MS_TP_COLUMN,  /* dim 0 split: each rank its rows of the output features */
    MS_TP_ROW,     /* dim 1 split: each rank its input features; output all-reduced */
    MS_TP_VOCAB,   /* the output head's vocabulary rows; logits all-gathered */
} ms_tp_split;

/*
 * Make rank m's state for `desc` from its full config.json `hf` (modified in place into the
 * local one) and the full config struct *config with its facts *facts (both replaced by the local
 * ones; *config's old struct is kept as the full config, owned by the state). Checks that
 * m->world divides num_attention_heads, num_key_value_heads and intermediate_size ("tensor
 * parallel: --tp 3 does not divide num_key_value_heads (4)"), that the vocabulary is at least
 * the world, and classifies every weight (ms_tp_split; a shape that fits none: MS_ERR_FORMAT
 * naming the weight). Errors: MS_ERR_INVALID_ARG, MS_ERR_FORMAT, the config loader's, MS_ERR_OOM.
 */
ms_status ms_tp_rank_init(ms_tp_rank **out, const ms_tp_member *m, const ms_model_desc *desc,
                          ms_hf_config *hf, void **config, ms_md_facts *facts, ms_error *err);

/* Release (after ms_tp_rank_detach). NULL is a no-op. */
void ms_tp_rank_free(ms_tp_rank *t);

/* The split of weight entry w (a FUSED entry: its parts'), and the full (checkpoint) shape of w
 * into shape[MS_TENSOR_MAX_DIMS]. */
ms_tp_split ms_tp_weight_split(const ms_tp_rank *t, int32_t w);
void ms_tp_full_shape(const ms_tp_rank *t, int32_t w, int64_t *shape);
/* The local shape of w as stored on this rank: the local config's, with a VOCAB weight's dim 0
 * cut to this rank's vocabulary rows. */
void ms_tp_local_shape(const ms_tp_rank *t, int32_t w, int64_t *shape);
/* This rank's slice of the checkpoint tensor `data` (host, full shape of w, dtype dt) as a view
 * of local shape; rank: as the tensor's. */
ms_tensor ms_tp_source(const ms_tp_rank *t, int32_t w, const void *data, ms_dtype dt);
/* This rank's rows of a tied VOCAB weight (a view of the replicated tensor it is tied to). */
ms_tensor ms_tp_tied_view(const ms_tp_rank *t, int32_t w, const ms_tensor *tied);
/* Remember the loaded instance dst of weight w (ROW and VOCAB ones are looked up by the linear
 * hook by their data address). Errors: MS_ERR_OOM. */
ms_status ms_tp_note_weight(ms_tp_rank *t, int32_t w, const ms_tensor *dst, ms_error *err);

/*
 * Hook be's linear and embedding (the engine's backend; its ctx stays the backend's) for this
 * rank, with scratch for the vocabulary gather and for ms_tp_share_ids of up to max_rows ids.
 * Call after every weight is noted and before any forward. Errors: MS_ERR_OOM, the backend's buffer_alloc,
 * MS_ERR_INVALID_ARG (already attached, max_rows < 1).
 */
ms_status ms_tp_rank_attach(ms_tp_rank *t, ms_backend *be, int32_t max_rows, ms_error *err);

/*
 * Replace ids [n] (host, this rank's sampled ids) by rank 0's (an all-gather; every rank must
 * call with the same n): rank 0 samples for the group, so per-request sampler state that only
 * rank 0 holds (serve's min_p and penalties) or a rounding difference at a top-p boundary
 * cannot make the ranks feed different ids. Errors: MS_ERR_INVALID_ARG (n > max_rows), the
 * transport's.
 */
ms_status ms_tp_share_ids(ms_tp_rank *t, int32_t *ids, int32_t n, ms_error *err);
/* Undo ms_tp_rank_attach (frees its scratch on be); before the backend is freed. */
void ms_tp_rank_detach(ms_tp_rank *t, ms_backend *be);

/* *v = the smallest *v over the ranks (an all-gather; every rank must call): the KV arena sized
 * from each GPU's free memory (gpu_memory_fraction) must be the same on every rank, so the GPU
 * with the least room decides. Errors: the transport's. */
ms_status ms_tp_min_i32(ms_tp_rank *t, int32_t *v, ms_error *err);

/* The rank's member (borrowed). */
const ms_tp_member *ms_tp_rank_member(const ms_tp_rank *t);

/* ---- the group: N engines on N threads ---- */

/* One call on one rank's engine (an opaque ms_engine *). */
typedef ms_status (*ms_tp_fn)(void *engine, int32_t rank, void *arg, ms_error *err);
/* Make an engine for a member (the engine's init with options.tp_member set). */
typedef ms_status (*ms_tp_make_fn)(const ms_tp_member *m, void *arg, void **engine,
                                   ms_error *err);
typedef void (*ms_tp_free_fn)(void *engine);

/*
 * Start a group of `world` ranks (2..64) on device "cpu" or "cuda" (cuda: world visible GPUs,
 * NCCL): ranks 1.. get a thread each that makes its engine with make(m, arg) and then serves
 * ms_tp_group_run; rank 0's engine is made on the calling thread; every make runs at once (their
 * warm-up checks are collectives). *leader receives rank 0's engine and *group the group, both
 * owned by the caller, who frees the group (ms_tp_group_free) before the leader's engine.
 * Errors: MS_ERR_INVALID_ARG,
 * MS_ERR_UNSUPPORTED / MS_ERR_CUDA (cuda: NCCL, too few GPUs), make's error (rank 0's, or the
 * first other rank's prefixed "tensor parallel rank R: "), MS_ERR_OOM; nothing is kept on failure.
 */
ms_status ms_tp_group_start(int32_t world, const char *device, ms_tp_make_fn make,
                            ms_tp_free_fn free_engine, void *arg, void **leader,
                            ms_tp_group **group, ms_error *err);

/* Run leader_fn(leader engine, 0, arg) here and follower_fn(engine r, r, arg) on every other
 * rank's thread at once, and wait for all. Errors: the leader's, else the first failing rank's
 * prefixed "tensor parallel rank R: "; once a call failed, every later one fails. */
ms_status ms_tp_group_run(ms_tp_group *g, void *leader, ms_tp_fn leader_fn, ms_tp_fn follower_fn,
                          void *arg, ms_error *err);

/* Free the other ranks' engines (on their threads) and the group's transport. NULL: no-op. */
void ms_tp_group_free(ms_tp_group *g);

/* Ranks of the group. */
int32_t ms_tp_group_world(const ms_tp_group *g);
/* Rank r's engine (r in 1..world-1; for tests and stats), borrowed. */
void *ms_tp_group_engine(const ms_tp_group *g, int32_t r);

#ifdef __cplusplus
}
#endif
#endif /* MS_TP_H */
