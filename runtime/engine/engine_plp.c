/*
 * engine_plp.c - [prompt logprobs] of the engine (engine.h ms_engine_prompt_logprobs,
 * request.prompt_logprobs): every prompt row's logits for requests asking for them. Moved out of
 * engine.c; the private structs are engine_impl.h's, and engine.c's forward calls eng_plp_rows
 * (staging) and eng_plp_collect (after the logits reach the host).
 *
 * options.prompt_logprobs_rows adds that many logits rows to a step (e->max_out): eng_rows cuts
 * such a request's prompt chunk to the rows left, the step's forward returns the logits of the
 * token rows e->plp_rows_host lists (each segment's last token first, in segment order, as
 * without them, then the other prompt rows of those requests), the sampler reads the first rows
 * only, and eng_plp_collect turns every prompt row p into entry p + 1 (the logprob of prompt
 * token p + 1 given tokens 0 .. p) before penalties or CFG mixing touch the rows.
 */
#include "engine_impl.h"

#include <math.h>
#include <string.h>

/* Visit every prompt row of the step's plp requests: fn(e, r, position, logits row). Rows are
 * in eng_plp_rows's order: a segment's rows but its last after the n_seg segments' own rows. */
static int32_t eng_plp_walk(ms_engine *e, int32_t n_seg, bool collect) {
    const ms_md_step_build *b = &e->build;
    int32_t tok = 0, extra = 0;
    for (int32_t i = 0; i < b->step.n_segments && i < n_seg; i++) {
        const ms_segment *sg = &b->segments[i];
        eng_req *r = e->row_reqs[b->seg_row[i]];
        if (!collect)
            e->plp_rows_host[i] = tok + sg->span - 1; /* the segment's own row */
        if (r != NULL && r->plp != NULL && sg->label == MS_LABEL_MAIN &&
            !ms_walk_in_loop(e->desc, r->walk)) {
            const int32_t c0 = r->consumed[MS_LABEL_MAIN]; /* before this step's span */
            for (int32_t j = 0; j < sg->span; j++) {
                const bool own = j == sg->span - 1;
                const int32_t row = own ? i : n_seg + extra;
                if (!own) {
                    if (!collect)
                        e->plp_rows_host[n_seg + extra] = tok + j;
                    extra++;
                }
                const int32_t at = c0 + j + 1; /* the entry this row gives */
                if (!collect || at < r->plp_next || at >= r->n_orig_prompt)
                    continue;
                const float *z = e->logits_host + (size_t)row * (size_t)e->facts.vocab;
                ms_engine_prompt_logprob *lp = &r->plp[at];
                const int32_t id = r->prompt[MS_LABEL_MAIN][at];
                ms_sample_row greedy;
                memset(&greedy, 0, sizeof greedy);
                greedy.params = ms_sampling_greedy(); /* log_softmax(z): the raw distribution */
                int32_t n_top = 0;
                if (ms_sampler_logprobs(z, e->facts.vocab, &greedy, e->plp_scratch, id,
                                        r->plp_top, &lp->logprob, lp->top_ids, lp->top_logprobs,
                                        &n_top, NULL) != MS_OK) {
                    lp->logprob = NAN; /* NaN logits: the request fails at its sampling */
                    n_top = 0;
                }
                lp->n_top = n_top;
                int32_t rank = 1;
                for (int32_t v = 0; v < e->facts.vocab; v++)
                    rank += z[v] > z[id];
                lp->rank = rank;
                r->plp_next = at + 1;
            }
        }
        tok += sg->span;
    }
    return extra;
}

/* Stage the step's logits rows (see above); returns the rows beyond the n_seg segments' own, 0
 * when no request of the step asks for prompt logprobs (the forward's default rows). */
int32_t eng_plp_rows(ms_engine *e, int32_t n_seg) {
    if (e->plp_rows < 1)
        return 0;
    int32_t extra = eng_plp_walk(e, n_seg, false);
    MS_ASSERT(n_seg + extra <= e->max_out);
    return extra;
}

/* Fill the entries the step's rows give (after their logits reached e->logits_host). */
void eng_plp_collect(ms_engine *e, int32_t n_seg) { (void)eng_plp_walk(e, n_seg, true); }

ms_status ms_engine_prompt_logprobs(const ms_engine *e, ms_rid rid,
                                    const ms_engine_prompt_logprob **lp, int32_t *n) {
    *lp = NULL;
    *n = 0;
    const eng_req *r = eng_find_req(e, rid, NULL);
    if (r == NULL)
        return MS_FAIL(NULL, MS_ERR_NOT_FOUND, "unknown request");
    if (r->plp == NULL)
        return MS_FAIL(NULL, MS_ERR_STATE, "request %llu was added without prompt_logprobs",
                       (unsigned long long)rid);
    *lp = r->plp;
    *n = r->plp_next;
    return MS_OK;
}
