/*
 * talker.c - ms_engine_talker_codes (talker.h): the per-frame loop of a talker + code-predictor
 * model over the engine's two compiled nodes: the talker reads a frame's codes (its forward
 * embeds them), the predictor returns the logits of the frame's next code (its forward ends in
 * the head its frame slot picks). Every code is picked on the engine's backend (c0 by the talker
 * node's sampler resource, ms_engine_run_codes_pick; c_j greedily from the predictor's last
 * rows, ms_engine_run_rows_codes_pick). The predictor's forward builds its own input from the
 * talker's hidden rows and the frame's codes (in_proj(h_t) at a frame's slot 0, a code's
 * embedding elsewhere): this file only stages them, a row per token, and does no model math.
 */
#include "talker.h"

#include <stdio.h>
#include <string.h>

#include "walk.h"

/* Most requests one wave runs (the loop's per-row arrays live on the stack). */
#define TK_MAX_ROWS 256

ms_talker_glue ms_talker_glue_default(void) {
    return (ms_talker_glue){
        .talker = "talker",
        .predictor = "code_predictor",
    };
}

/* The loop's buffers. */
typedef struct tk_state {
    int32_t G, V, H, B;          /* codebooks, vocabulary, the talker's width, batch rows */
    int32_t *codes;              /* [B * max(P, 2) * G] the talker's input codes, then the
                                    predictor's: a row of the frame's codes per token */
    float *rows;                 /* [B * 2 * H] the predictor's input rows: h_t per token */
} tk_state;

static void tk_free(tk_state *s) {
    ms_free(s->codes);
    ms_free(s->rows);
}

/*
 * The walk the requests take (the engine's choice for a prompt on main), checked against the
 * loop this file drives: one talker step (the prefill) before the loop; in the loop G - 1
 * predictor steps (the first begins a frame) then one talker step (the frame's decode).
 * *prefill, *loop[0 .. G-1) and *decode get the step names.
 */
static ms_status tk_walk(ms_engine *e, const ms_talker_glue *gl, const tk_state *s,
                         const char **prefill, const char **loop, const char **decode,
                         ms_error *err) {
    const ms_model_desc *d = ms_engine_desc(e);
    bool main_only[MS_MAX_LABELS] = {true};
    int32_t w = ms_walk_find(d, main_only);
    int32_t tn = -1, pn = -1;
    for (int32_t i = 0; i < d->n_nodes; i++) {
        if (strcmp(d->nodes[i].name, gl->talker) == 0)
            tn = i;
        if (strcmp(d->nodes[i].name, gl->predictor) == 0)
            pn = i;
    }
    if (w < 0 || tn < 0 || pn < 0)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "talker: model %s has no walk over its main "
                       "stream through nodes %s and %s", d->name, gl->talker, gl->predictor);
    const ms_md_walk *wk = &d->walks[w];
    bool ok = wk->loop_begin == 1 && wk->n_items == 1 + s->G && wk->items[0].node == tn &&
              wk->items[wk->n_items - 1].node == tn;
    for (int32_t i = 1; ok && i < wk->n_items - 1; i++)
        ok = wk->items[i].node == pn;
    if (!ok)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "talker: walk '%s' of model %s must be %s.<step> "
                       "then loop (%d %s steps then a %s step) until stop (frames of %d codes)",
                       wk->name, d->name, gl->talker, (int)(s->G - 1), gl->predictor, gl->talker,
                       (int)s->G);
    *prefill = d->nodes[tn].steps[wk->items[0].step].name;
    for (int32_t j = 0; j + 1 < s->G; j++)
        loop[j] = d->nodes[pn].steps[wk->items[1 + j].step].name;
    *decode = d->nodes[tn].steps[wk->items[wk->n_items - 1].step].name;
    return MS_OK;
}

/* One wave: items[0 .. n) on rows 0 .. n-1 (requests rids), along the walk's steps. */
static ms_status tk_wave(ms_engine *e, const ms_talker_glue *gl, tk_state *s, ms_talker_item *it,
                         const ms_rid *rids, int32_t n, ms_error *err) {
    int32_t spans[TK_MAX_ROWS];
    int32_t c[TK_MAX_ROWS][MS_TALKER_MAX_GROUPS];
    const float *out, *hid;
    const int32_t *pick; /* the talker's sampler's c0 of each request */
    const char *prefill = NULL, *loop[MS_TALKER_MAX_GROUPS] = {NULL}, *decode = NULL;
    MS_ASSERT(n <= TK_MAX_ROWS);
    MS_TRY(tk_walk(e, gl, s, &prefill, loop, &decode, err));
    int32_t frames = 0;
    size_t t = 0;
    for (int32_t i = 0; i < n; i++) {
        spans[i] = it[i].n_prompt;
        frames = MS_MAX(frames, it[i].n_frames);
        memcpy(s->codes + t * (size_t)s->G, it[i].prompt_codes,
               (size_t)it[i].n_prompt * (size_t)s->G * sizeof(int32_t));
        t += (size_t)it[i].n_prompt;
    }
    /* the talker embeds its frames itself (models/talker.mstar: forward(codes: [_, G] ids)) */
    MS_TRY(ms_engine_run_codes_pick(e, gl->talker, prefill, rids, spans, n, s->codes, s->G,
                                    &pick, &out, &hid, err));
    for (int32_t f = 0; f < frames; f++) {
        for (int32_t i = 0; i < n; i++) {
            const float *lg = out + (size_t)i * (size_t)s->V;
            if (pick[i] < 0 || pick[i] >= s->V)
                return MS_FAIL(err, MS_ERR_INTERNAL, "talker: row %d, frame %d: the talker's "
                               "logits hold NaN (no code 0 to pick)", (int)i, (int)f);
            c[i][0] = pick[i];
            if (f < it[i].n_frames && it[i].talker_logits != NULL)
                memcpy(it[i].talker_logits + (size_t)f * (size_t)s->V, lg,
                       (size_t)s->V * sizeof(float));
            /* the frame's tokens 2i, 2i + 1 (slots 0, 1): each reads h_t and the frame's
               codes so far (the forward takes in_proj(h_t) at slot 0, embeds[0](c0) at 1) */
            for (int32_t g = 1; g < s->G; g++)
                c[i][g] = 0; /* not picked yet: columns the forward does not read */
            for (int32_t r = 2 * i; r <= 2 * i + 1; r++) {
                memcpy(s->rows + (size_t)r * (size_t)s->H, hid + (size_t)i * (size_t)s->H,
                       (size_t)s->H * sizeof(float));
                memcpy(s->codes + (size_t)r * (size_t)s->G, c[i], (size_t)s->G * sizeof(int32_t));
            }
            spans[i] = 2;
        }
        /* the walk's predictor steps: the first begins the frame, each gives the next code */
        for (int32_t j = 1; j < s->G; j++) {
            /* its forward ends in heads[j - 1] (`for hd in heads at code.slot - 1`): the rows
               it returns are each request's logits of c_j */
            const float *lg;
            MS_TRY(ms_engine_run_rows_codes_pick(e, gl->predictor, loop[j - 1], rids, spans, n,
                                                 s->rows, s->H, s->codes, s->G, &pick, &lg,
                                                 err));
            for (int32_t i = 0; i < n; i++) {
                if (pick[i] < 0 || pick[i] >= s->V)
                    return MS_FAIL(err, MS_ERR_INTERNAL, "talker: row %d, frame %d: the "
                                   "predictor's logits of code %d hold NaN", (int)i, (int)f,
                                   (int)j);
                c[i][j] = pick[i];
                if (f < it[i].n_frames && it[i].predictor_logits != NULL)
                    memcpy(it[i].predictor_logits +
                               ((size_t)f * (size_t)(s->G - 1) + (size_t)(j - 1)) * (size_t)s->V,
                           lg + (size_t)i * (size_t)s->V, (size_t)s->V * sizeof(float));
                spans[i] = 1;
            }
            /* the next step's token i (slot j + 1): h_t, the frame's codes up to c_j (the
               forward embeds c_j); rows 2i of the begin step move to row i */
            for (int32_t i = 0; i < n && j < s->G - 1; i++) {
                memmove(s->rows + (size_t)i * (size_t)s->H,
                        s->rows + (size_t)(j == 1 ? 2 * i : i) * (size_t)s->H,
                        (size_t)s->H * sizeof(float));
                memcpy(s->codes + (size_t)i * (size_t)s->G, c[i], (size_t)s->G * sizeof(int32_t));
            }
        }
        for (int32_t i = 0; i < n; i++)
            if (f < it[i].n_frames)
                memcpy(it[i].codes + (size_t)f * (size_t)s->G, c[i], (size_t)s->G * sizeof(int32_t));
        if (f == frames - 1)
            break; /* until stop: the last frame's codes end the loop */
        for (int32_t i = 0; i < n; i++) {
            memcpy(s->codes + (size_t)i * (size_t)s->G, c[i], (size_t)s->G * sizeof(int32_t));
            spans[i] = 1;
        }
        MS_TRY(ms_engine_run_codes_pick(e, gl->talker, decode, rids, spans, n, s->codes, s->G,
                                        &pick, &out, &hid, err));
    }
    return MS_OK;
}

/* Check the items and the nodes; fill s (the shapes, the buffers). */
static ms_status tk_init(ms_engine *e, const ms_talker_glue *gl, ms_talker_item *items,
                         int32_t n_items, tk_state *s, ms_error *err) {
    const ms_md_facts *tf = ms_engine_node_facts(e, gl->talker);
    const ms_md_facts *pf = ms_engine_node_facts(e, gl->predictor);
    if (tf == NULL || pf == NULL)
        return MS_FAIL(err, MS_ERR_NOT_FOUND, "talker: the model has no node '%s'",
                       tf == NULL ? gl->talker : gl->predictor);
    s->G = pf->max_context;
    s->V = tf->vocab;
    s->H = tf->hidden;
    s->B = MS_MIN(MS_MIN(ms_engine_max_seqs(e), TK_MAX_ROWS), MS_MAX(pf->scratch_rows, 1));
    if (s->G < 2 || s->G > MS_TALKER_MAX_GROUPS || s->V < 1)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "talker: node %s holds frames of %d codes (2 .. "
                       "%d)", gl->predictor, (int)s->G, MS_TALKER_MAX_GROUPS);
    int32_t max_p = 2;
    for (int32_t i = 0; i < n_items; i++) {
        const ms_talker_item *it = &items[i];
        if (it->n_prompt < 1 || it->n_frames < 1 || it->prompt_codes == NULL)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "talker: item %d: %d prompt frames and %d "
                           "frames to generate (each >= 1)", (int)i, (int)it->n_prompt,
                           (int)it->n_frames);
        if ((int64_t)it->n_prompt + it->n_frames - 1 > tf->max_context)
            return MS_FAIL(err, MS_ERR_LIMIT, "talker: item %d: %d prompt frames + %d frames pass "
                           "the talker's context (%d positions)", (int)i, (int)it->n_prompt,
                           (int)it->n_frames, (int)tf->max_context);
        for (int32_t p = 0; p < it->n_prompt; p++)
            for (int32_t g = 0; g < s->G; g++) {
                int32_t v = it->prompt_codes[(size_t)p * (size_t)s->G + (size_t)g];
                if (v < 0 || v >= s->V)
                    return MS_FAIL(err, MS_ERR_INVALID_ARG, "talker: item %d: prompt frame %d, "
                                   "codebook %d: code %d is outside [0, %d)", (int)i, (int)p,
                                   (int)g, (int)v, (int)s->V);
            }
        max_p = MS_MAX(max_p, it->n_prompt);
    }
    const size_t B = (size_t)s->B;
    s->codes = ms_malloc(B * (size_t)max_p * (size_t)s->G * sizeof(int32_t));
    s->rows = ms_malloc(B * 2 * (size_t)s->H * sizeof(float));
    if (s->codes == NULL || s->rows == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "talker: out of memory for the nodes' input rows");
    return MS_OK;
}

ms_status ms_engine_talker_codes(ms_engine *e, const ms_talker_glue *glue, ms_talker_item *items,
                                 int32_t n_items, ms_error *err) {
    for (int32_t i = 0; i < n_items; i++)
        items[i].codes = NULL;
    if (n_items < 1 || items == NULL || glue == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "talker: %d items (at least 1)", (int)n_items);
    if (ms_engine_n_active(e) > 0)
        return MS_FAIL(err, MS_ERR_STATE, "talker: the engine runs %d requests already",
                       (int)ms_engine_n_active(e));
    tk_state s;
    memset(&s, 0, sizeof s);
    ms_status st = tk_init(e, glue, items, n_items, &s, err);
    for (int32_t i = 0; i < n_items && st == MS_OK; i++) {
        items[i].codes = ms_malloc((size_t)items[i].n_frames * (size_t)s.G * sizeof(int32_t));
        if (items[i].codes == NULL)
            st = MS_FAIL(err, MS_ERR_OOM, "talker: out of memory for item %d's codes", (int)i);
    }
    ms_rid rids[TK_MAX_ROWS];
    for (int32_t w = 0; w < n_items && st == MS_OK; w += s.B) {
        const int32_t n = MS_MIN(s.B, n_items - w);
        int32_t added = 0;
        for (int32_t i = 0; i < n && st == MS_OK; i++, added++) {
            /* a request per item: its prompt ids (codebook 0) only checked, never read */
            const ms_talker_item *it = &items[w + i];
            int32_t *ids = ms_malloc((size_t)it->n_prompt * sizeof(int32_t));
            if (ids == NULL) {
                st = MS_FAIL(err, MS_ERR_OOM, "talker: out of memory for item %d", (int)(w + i));
                break;
            }
            for (int32_t p = 0; p < it->n_prompt; p++)
                ids[p] = it->prompt_codes[(size_t)p * (size_t)s.G];
            ms_engine_request rq = {.prompt = ids, .n_prompt = it->n_prompt,
                                    .max_new_tokens = it->n_frames,
                                    .sampling = ms_sampling_greedy()};
            st = ms_engine_add(e, &rq, &rids[i], err);
            ms_free(ids);
            if (st != MS_OK)
                break;
        }
        if (st == MS_OK)
            st = tk_wave(e, glue, &s, &items[w], rids, n, err);
        for (int32_t i = 0; i < added; i++)
            ms_engine_remove(e, rids[i]);
    }
    tk_free(&s);
    if (st != MS_OK)
        for (int32_t i = 0; i < n_items; i++) {
            ms_free(items[i].codes);
            items[i].codes = NULL;
        }
    return st;
}
