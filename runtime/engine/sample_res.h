/*
 * sample_res.h - the sampler resource (kind MS_RESOURCE_SAMPLER): per-request sampling settings
 * and draw counter, the step's sample rows, and batched classifier-free guidance (CFG) mixing.
 *
 * A request's settings come in at ingest (an ms_sample_settings override; the engine fills its
 * unset fields from the model's declared sampler(temperature, top_k, top_p) defaults before).
 * Each step's sampler record (ms_sample_step, model_desc.h) says which segments' logits give a
 * row's id and, for a CFG pair, which segment is its unconditional side. plan lists one
 * ms_sample_row per segment (the backend samples every logits row; rows that do not sample ignore
 * their id); commit advances the draw counter of every row that sampled, so a request's ids never
 * depend on its batch.
 *
 * CFG mixing (ms_sample_res_mix) runs on host logits, on every backend: the engine already copies
 * the step's logits to the host, mixes the guided rows in place there
 * (mixed = logsoftmax(uncond) + s * (logsoftmax(cond) - logsoftmax(uncond)), s the request's
 * guidance scale), and copies those rows back before the backend's sample call. On CUDA this is
 * host-side mixing over the copied logits (two [vocab] rows per pair per step).
 *
 * Ownership: ms_sample_res_* borrow their arguments; the resource returned by ms_sample_res_init
 * is owned by the caller (ms_sample_res_free, or the step runner when given as a builder).
 */
#ifndef MS_SAMPLE_RES_H
#define MS_SAMPLE_RES_H

#include "model_desc.h"
#include "resource.h"
#include "sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A request's sampler state given at ingest. */
typedef struct ms_sample_settings {
    ms_sampling_params params;
    float guidance_scale;     /* CFG scale of the request's guided steps (1 = the cond logits) */
} ms_sample_settings;

typedef struct ms_sample_res ms_sample_res;

/* A resource for steps of up to max_segments segments. Errors: MS_ERR_OOM. */
ms_status ms_sample_res_init(ms_sample_res **out, int32_t max_segments, ms_error *err);
void ms_sample_res_free(ms_sample_res *s);

/* Its resource interface (kind MS_RESOURCE_SAMPLER). */
const ms_resource_i *ms_sample_res_iface(void);

/*
 * Mix the guided rows of the planned step in place: logits [n_segments, vocab] host f32 in
 * segment order; for each segment i with rec->guide[i] = j >= 0, row i becomes the mixed log-probs
 * of rows i (cond) and j (uncond) under rid's guidance scale. Then every row whose request has
 * penalties (ms_sample_res_set_extra) gets them over its history (sampler.h
 * ms_sampler_apply_penalties). *n_mixed = rows changed (the engine copies them back to the
 * backend). `index` is the sampler's resource index.
 */
void ms_sample_res_mix(const ms_sample_res *s, int index, const ms_step *step, float *logits,
                       int32_t vocab, int32_t *n_mixed);

/*
 * Whether ms_sample_res_mix would change any row of this step (a guided row with its partner in
 * the step, or a request with penalties and a history): the engine copies a step's logits to the
 * host only then (or when a caller reads them), since at batch 64 over a 128k vocabulary that copy
 * is 33 MB a step. Same arguments as ms_sample_res_mix.
 */
bool ms_sample_res_needs_host(const ms_sample_res *s, int index, const ms_step *step);

/* A request's sampling settings beyond ms_sampling_params (the server's min_p and penalties). */
typedef struct ms_sample_extra {
    float min_p;                    /* [0, 1]; 0 off (sampler.h ms_sample_row) */
    ms_sampler_penalties penalties; /* presence / frequency in [-2, 2], repetition in (0, 2] */
} ms_sample_extra;

/*
 * Set rid's extra settings (after its ingest, between steps). Penalties other than off make the
 * request keep a token history (ms_sample_res_observe) that ms_sample_res_mix applies to its
 * logits row before the backend samples (vLLM applies penalties before temperature too).
 * Errors: MS_ERR_NOT_FOUND (unknown rid), MS_ERR_INVALID_ARG (a value out of range, named).
 */
ms_status ms_sample_res_set_extra(ms_sample_res *s, ms_rid rid, const ms_sample_extra *x,
                                  ms_error *err);

/*
 * Add ids[0..n) to rid's token history: prompt ids (prompt: true; repetition penalty only) or
 * generated ids (each counts once more for the frequency penalty). Call it with the prompt once,
 * then with every new output id between steps (the engine does not see its own outputs here:
 * the caller, the server's scheduler, owns the loop). A no-op for a request without penalties.
 * Allocates (the history grows); errors: MS_ERR_NOT_FOUND, MS_ERR_OOM.
 */
ms_status ms_sample_res_observe(ms_sample_res *s, ms_rid rid, const int32_t *ids, int32_t n,
                                bool prompt, ms_error *err);

/* [pd] rid's sampling parameters and draw counter (the sampler's whole state: a draw is a pure
 * function of (seed, draw)), and whether it has settings a pd record does not carry (min_p,
 * penalties, a guidance scale). Errors: MS_ERR_NOT_FOUND (unknown rid). */
ms_status ms_sample_res_pd_state(const ms_sample_res *s, ms_rid rid, ms_sampling_params *params,
                                 uint64_t *draw, bool *has_extra, ms_error *err);

/* [pd] Set rid's draw counter (a decode engine continuing a published request). Errors:
 * MS_ERR_NOT_FOUND (unknown rid). */
ms_status ms_sample_res_pd_set_draw(ms_sample_res *s, ms_rid rid, uint64_t draw, ms_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MS_SAMPLE_RES_H */
