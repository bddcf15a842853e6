/*
 * talker.h - greedy audio-code generation on a talker + code-predictor model
 * (models/talker.mstar: the structure of Qwen3-TTS / Qwen3-Omni's talker; reference.json of
 * ../shared/fixtures/hf/talker_codepred spells the loop out), as ms_engine_transcribe is
 * Whisper's: the engine entry point that drives the model's two compiled nodes frame by frame.
 *
 * Audio codes come in frames of G codebooks. Per frame t, for every request of the batch at
 * once: the talker node runs one position over the frame's codes (ms_engine_run_codes; its
 * forward embeds them: e_t = embed_tokens(c0) + sum_{j >= 1} codebook_embeds[j-1](c_j)) and
 * gives its logits and final-normed hidden state h_t; c0 = argmax(logits), picked by the talker
 * node's sampler resource on the engine's backend (ms_engine_run_codes_pick; the requests are
 * greedy); the code predictor node begins a frame on its scratch KV over [in_proj(h_t),
 * embeds[0](c0)] (positions 0, 1) and returns heads[0](its last row), c1 = its argmax, picked on
 * the backend; for j = 2 .. G-1 it reads embeds[j-1](c_{j-1}) at position j and returns
 * heads[j-1](last row), c_j = argmax. The predictor's forward computes its input itself from
 * what ms_engine_run_rows_codes_pick stages a row per token, h_t and the frame's codes so far
 * (models/talker.mstar: `code.first(linear(h, cp_in_proj), embedding(...))`, the table and the
 * head picked by the step's frame slot); the frame's codes are the talker's next input. The
 * prompt's P frames are prefilled at once; the first generated frame comes from the last prompt
 * position. Every op runs on the engine's device; this file only moves rows and codes.
 *
 * Ownership: functions borrow their arguments; ms_engine_talker_codes fills caller-owned
 * outputs (codes ms_malloc'd per item, freed by the caller with ms_free).
 */
#ifndef MS_TALKER_H
#define MS_TALKER_H

#include "engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Most codebooks per frame. */
#define MS_TALKER_MAX_GROUPS 16

/*
 * The two nodes the loop drives, by name. G is the predictor node's frame (its scratch's
 * positions); the talker's forward reads `[_, G] ids`, the predictor's a row of the talker's
 * width H and a row of G codes per token (models/talker.mstar).
 */
typedef struct ms_talker_glue {
    const char *talker;        /* the talker node ("talker") */
    const char *predictor;     /* the code predictor node ("code_predictor") */
} ms_talker_glue;

/* models/talker.mstar's nodes. */
ms_talker_glue ms_talker_glue_default(void);

/* One request of ms_engine_talker_codes. */
typedef struct ms_talker_item {
    const int32_t *prompt_codes;  /* [n_prompt][G] codes, each in [0, V) */
    int32_t n_prompt;             /* prompt frames, >= 1 */
    int32_t n_frames;             /* frames to generate, >= 1 */
    int32_t *codes;               /* out: [n_frames][G], ms_malloc'd (the caller ms_frees) */
    float *talker_logits;         /* optional out [n_frames][V] (the caller's buffer), or NULL */
    float *predictor_logits;      /* optional out [n_frames][G - 1][V], or NULL */
} ms_talker_item;

/*
 * The order of the steps is the model's walk over its main stream (models/talker.mstar's
 * `speak`): a talker step prefills the prompt's frames, then the loop runs G - 1 predictor steps
 * (the first begins a frame) and a talker step (the frame's decode); another walk is refused
 * (MS_ERR_UNSUPPORTED naming it).
 *
 * Generate items[i].n_frames frames greedily for every item, as many items per batch as the
 * engine's max_seqs and the predictor's scratch rows take (each its own request, one batch row; a wave's frames run until its
 * longest item is done). The engine must hold no running requests (MS_ERR_STATE) and run
 * without the prefix cache. Errors, one line each: MS_ERR_INVALID_ARG (a code outside [0, V)
 * naming item, frame and codebook; n_prompt or n_frames < 1), MS_ERR_NOT_FOUND (no such node),
 * MS_ERR_LIMIT (prompt + frames past the talker's context), ms_engine_add's,
 * ms_engine_run_codes_pick's and ms_engine_run_rows_codes_pick's. On error no item holds codes
 * and every request is removed.
 */
ms_status ms_engine_talker_codes(ms_engine *e, const ms_talker_glue *glue, ms_talker_item *items,
                                 int32_t n_items, ms_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MS_TALKER_H */
