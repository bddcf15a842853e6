/*
 * sampler.h - host-side sampling parameters and the float32 CPU sampler (greedy, temperature,
 * top-k, top-p, min-p), seeded and reproducible; penalties and log-probabilities over host rows.
 *
 * Ownership: ms_sampler_* functions borrow their arguments; the caller owns logits, scratch and
 * outputs. Nothing here allocates: the scratch a row needs is sized by ms_sampler_scratch_size and
 * planned by the caller (the backend's sample workspace), so sampling does no malloc on the decode
 * hot path.
 *
 * Semantics (one row of logits z[0..V)):
 *   - greedy (temperature < MS_SAMPLER_MIN_TEMPERATURE, 0 included, or top_k == 1): argmax z,
 *     lowest index on ties (llama2.c `sample_argmax` keeps the first maximum; so does
 *     torch.argmax on CPU). A temperature below 1e-5 is greedy as in vLLM (_SAMPLING_EPS): 1 / T
 *     would overflow float for a denormal T and exp(z / T - max z / T) would be NaN; a row whose
 *     max z / T still overflows (huge logits, tiny T) is greedy too.
 *   - otherwise, in Hugging Face `generate` warper order (TemperatureLogitsWarper,
 *     TopKLogitsWarper, TopPLogitsWarper): p_i = exp(z_i / T - max z / T) in float32; top-k
 *     (0 < top_k < V) keeps p_i >= the k-th largest (ties at the boundary kept); top-p (< 1)
 *     then keeps p_i >= tau, tau the largest value whose kept mass reaches top_p times the mass
 *     top-k kept (the smallest nucleus, as HF's TopPLogitsWarper and llama2.c's `sample_topp`;
 *     at least one id); the id is the first one, in vocabulary order, whose running kept mass
 *     exceeds u * (kept mass) for one uniform u in [0, 1). The same semantics as the CUDA
 *     backend's device sampler (templates/common/params.h ms_sample_params), so both pick the
 *     same id for the same uniform up to float rounding at the boundaries.
 *   - the uniform is a pure function of (seed, draw): u = top 24 bits of splitmix64(seed, draw)
 *     / 2^24. `draw` is the number of tokens this request sampled before (the caller's counter),
 *     so a request's ids do not depend on the batch it ran in, nor on thread count or backend.
 *
 * Usage:
 *     ms_sampling_params p = {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = 42};
 *     void *scratch = ms_malloc(ms_sampler_scratch_size(vocab));   // once, at startup
 *     int32_t id;
 *     MS_TRY(ms_sampler_sample_row(logits, vocab, &p, draw++, scratch, &id, err));
 */
#ifndef MS_SAMPLER_H
#define MS_SAMPLER_H

#include "ms_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Per-request sampling settings (validated by ms_sampler_check_params). */
typedef struct ms_sampling_params {
    float temperature; /* >= 0; 0 = greedy */
    int32_t top_k;     /* <= 0: disabled; 1 = greedy */
    float top_p;       /* in (0, 1]; 1 = disabled */
    uint64_t seed;     /* PRNG seed of this request */
} ms_sampling_params;

/* Temperatures below this are greedy (vLLM's _SAMPLING_EPS): their logit scaling 1 / T is
 * useless or overflows float. */
#define MS_SAMPLER_MIN_TEMPERATURE 1e-5f

/* The id a backend's batched sample writes for a row whose logits hold NaN: that row's request
 * fails alone (the engine finishes it with MS_FINISH_ERROR), the batch's other rows sample. */
#define MS_SAMPLE_ID_NAN (-1)

/* Greedy settings: temperature 0, top_k 0, top_p 1, seed 0. */
static inline ms_sampling_params ms_sampling_greedy(void) {
    ms_sampling_params p = {0.0f, 0, 1.0f, 0};
    return p;
}

/* One batch row for a batched sample call: its settings and its draw counter. */
typedef struct ms_sample_row {
    ms_sampling_params params;
    uint64_t draw; /* tokens this request sampled before (selects the uniform) */
    float min_p;   /* [0, 1]; 0 off: keep p_i >= min_p * max p (after top-k / top-p) */
} ms_sample_row;

/*
 * Penalties on a row's logits before temperature, as vLLM's apply_penalties
 * (vllm/model_executor/layers/utils.py) and OpenAI's documented formula
 * (platform.openai.com/docs/advanced-usage, "frequency and presence penalties"):
 *   z_j -= frequency * c_j + presence * (c_j > 0)    c_j = times j was generated so far
 *   z_j  = z_j > 0 ? z_j / repetition : z_j * repetition   for j in the prompt or generated
 * (repetition: the CTRL paper's penalty, as HF's RepetitionPenaltyLogitsProcessor and vLLM).
 */
typedef struct ms_sampler_penalties {
    float presence;   /* [-2, 2]; 0 off */
    float frequency;  /* [-2, 2]; 0 off */
    float repetition; /* (0, 2]; 1 off */
} ms_sampler_penalties;

/* True when p changes nothing (presence 0, frequency 0, repetition 1). */
bool ms_sampler_penalties_off(const ms_sampler_penalties *p);

/*
 * Apply p to logits[0..vocab) in place for the n distinct tokens ids[0..n) of a request's
 * history: out_counts[k] times ids[k] was generated, in_prompt[k] != 0 when it is in the prompt.
 * Ids outside [0, vocab) are skipped. Allocates nothing.
 */
void ms_sampler_apply_penalties(float *logits, int32_t vocab, const ms_sampler_penalties *p,
                                const int32_t *ids, const int32_t *out_counts,
                                const uint8_t *in_prompt, int32_t n);

/* True when the settings reduce to argmax (temperature < MS_SAMPLER_MIN_TEMPERATURE, 0 included,
 * or top_k 1). */
bool ms_sampler_is_greedy(const ms_sampling_params *p);

/*
 * Check settings: temperature finite and >= 0, top_p in (0, 1], top_k >= 0 (or negative, meaning
 * disabled). Returns MS_ERR_INVALID_ARG with a message naming the bad field and value.
 */
ms_status ms_sampler_check_params(const ms_sampling_params *p, ms_error *err);

/* The uniform in [0, 1) used for (seed, draw); exposed for tests and for device samplers that
 * must agree with the CPU one. */
float ms_sampler_uniform(uint64_t seed, uint64_t draw);

/* Bytes of scratch one row of `vocab` logits needs (for non-greedy settings). */
size_t ms_sampler_scratch_size(int32_t vocab);

/* Index of the largest of logits[0..n), lowest index on ties; NaN entries are never chosen
 * (returns -1 only when every entry is NaN or n <= 0). */
int32_t ms_sampler_argmax(const float *logits, int32_t n);

/*
 * Sample one id from logits[0..vocab) (float32, host memory) with `p` and draw index `draw`.
 * `scratch` holds at least ms_sampler_scratch_size(vocab) bytes (may be NULL for greedy
 * settings). Returns MS_ERR_INVALID_ARG for bad settings and MS_ERR_INTERNAL when the row holds
 * NaN (message names it), else MS_OK with *out_id in [0, vocab).
 */
ms_status ms_sampler_sample_row(const float *logits, int32_t vocab, const ms_sampling_params *p,
                                uint64_t draw, void *scratch, int32_t *out_id, ms_error *err);

/* ms_sampler_sample_row with a batch row's settings, min_p included (a min_p outside [0, 1] is
 * MS_ERR_INVALID_ARG). min_p is applied after top-k and top-p, as HF's MinPLogitsWarper comes
 * after TopPLogitsWarper: kept are the ids with p_i >= min_p (p_i = exp(z_i / T - max z / T), so
 * the maximum's p is 1) among those top-k / top-p keep. */
ms_status ms_sampler_sample(const float *logits, int32_t vocab, const ms_sample_row *row,
                            void *scratch, int32_t *out_id, ms_error *err);

/*
 * Log-probabilities of the distribution row's settings sample from (sglang PR #2664: logprobs
 * must be those of the sampled distribution, as vLLM's logprobs_mode "processed_logprobs"):
 * log(p_i / sum of kept p) over the ids temperature, top-k, top-p and min_p keep, computed as
 * ms_sampler_sample computes p. Greedy settings sample from a point mass, which says nothing:
 * they report the model's distribution, log_softmax(z) (temperature 1, nothing truncated), as
 * vLLM's default raw logprobs. *lp_id = id's log-probability (MS_SAMPLER_LOGPROB_FLOOR when id is
 * not kept: vLLM's OpenAI server writes -9999.0 for -inf); top_ids / top_lps [top_n] the top_n
 * most probable kept ids (probability descending, id ascending on ties), *n_top how many were
 * written (fewer when fewer are kept). scratch: ms_sampler_scratch_size(vocab) bytes.
 * Errors: as ms_sampler_sample (bad settings, NaN logits, id outside the vocabulary).
 */
#define MS_SAMPLER_LOGPROB_FLOOR (-9999.0f)
ms_status ms_sampler_logprobs(const float *logits, int32_t vocab, const ms_sample_row *row,
                              void *scratch, int32_t id, int32_t top_n, float *lp_id,
                              int32_t *top_ids, float *top_lps, int32_t *n_top, ms_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MS_SAMPLER_H */
