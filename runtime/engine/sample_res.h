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
 * of rows i (cond) and j (uncond) under rid's guidance scale. *n_mixed = rows changed (the engine
 * copies them back to the backend). `index` is the sampler's resource index.
 */
void ms_sample_res_mix(const ms_sample_res *s, int index, const ms_step *step, float *logits,
                       int32_t vocab, int32_t *n_mixed);

#ifdef __cplusplus
}
#endif
#endif /* MS_SAMPLE_RES_H */
