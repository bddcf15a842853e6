/*
 * sampler.c - host-side sampling (sampler.h): argmax, temperature, top-k (heap selection of the
 * threshold), top-p (threshold from the sorted candidates), a draw in vocabulary order, and a
 * counter-based PRNG (splitmix64 of seed and draw index), so a request's draws never depend on
 * its batch or thread count.
 */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* One candidate: its (unnormalised) probability and id. */
typedef struct cand {
    float p;
    int32_t id;
} cand;

/* ---- PRNG ---- */

static uint64_t splitmix64(uint64_t x) {
    x += UINT64_C(0x9E3779B97F4A7C15);
    x = (x ^ (x >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    x = (x ^ (x >> 27)) * UINT64_C(0x94D049BB133111EB);
    return x ^ (x >> 31);
}

float ms_sampler_uniform(uint64_t seed, uint64_t draw) {
    uint64_t z = splitmix64(seed ^ splitmix64(draw));
    return (float)(z >> 40) * 0x1p-24f;
}

/* ---- parameters ---- */

bool ms_sampler_is_greedy(const ms_sampling_params *p) {
    return p->temperature < MS_SAMPLER_MIN_TEMPERATURE || p->top_k == 1;
}

ms_status ms_sampler_check_params(const ms_sampling_params *p, ms_error *err) {
    if (p == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "sampling: parameters missing");
    if (!isfinite(p->temperature) || p->temperature < 0.0f)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "sampling: temperature %g must be finite and >= 0",
                       (double)p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "sampling: top_p %g must be in (0, 1]",
                       (double)p->top_p);
    return MS_OK;
}

size_t ms_sampler_scratch_size(int32_t vocab) {
    return vocab > 0 ? (size_t)vocab * (sizeof(float) + sizeof(cand)) : 0;
}

int32_t ms_sampler_argmax(const float *logits, int32_t n) {
    int32_t best = -1;
    for (int32_t i = 0; i < n; i++) {
        if (isnan(logits[i]))
            continue;
        if (best < 0 || logits[i] > logits[best])
            best = i;
    }
    return best;
}

/* ---- candidate ordering: probability descending, then id ascending ---- */

static bool cand_before(const cand *a, const cand *b) {
    return a->p > b->p || (a->p == b->p && a->id < b->id);
}

static int cand_cmp(const void *x, const void *y) {
    const cand *a = x, *b = y;
    if (cand_before(a, b))
        return -1;
    if (cand_before(b, a))
        return 1;
    return 0;
}

/* Min-heap (by cand_before: the root is the candidate that sorts last) of h[0..n). */
static void heap_sift_down(cand *h, int32_t n, int32_t i) {
    for (;;) {
        int32_t l = 2 * i + 1, r = l + 1, w = i;
        if (l < n && cand_before(&h[w], &h[l]))
            w = l;
        if (r < n && cand_before(&h[w], &h[r]))
            w = r;
        if (w == i)
            return;
        cand t = h[i];
        h[i] = h[w];
        h[w] = t;
        i = w;
    }
}

/* Move the k best of c[0..n) to c[0..k), sorted. */
static void select_top_k(cand *c, int32_t n, int32_t k) {
    for (int32_t i = k / 2 - 1; i >= 0; i--)
        heap_sift_down(c, k, i);
    for (int32_t i = k; i < n; i++) {
        if (cand_before(&c[i], &c[0])) {
            c[0] = c[i];
            heap_sift_down(c, k, 0);
        }
    }
    qsort(c, (size_t)k, sizeof *c, cand_cmp);
}

/* ---- sampling ---- */

/* Why a row cannot be sampled from (settings, emptiness, NaN); MS_OK when it can. */
static ms_status row_check(const float *logits, int32_t vocab, const ms_sample_row *row,
                           ms_error *err) {
    MS_TRY(ms_sampler_check_params(&row->params, err));
    if (!(row->min_p >= 0.0f && row->min_p <= 1.0f))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "sampling: min_p %g must be in [0, 1]",
                       (double)row->min_p);
    if (vocab <= 0 || logits == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "sampling: empty logits (vocab %d)", vocab);
    for (int32_t i = 0; i < vocab; i++)
        if (isnan(logits[i]))
            return MS_FAIL(err, MS_ERR_INTERNAL, "sampling: logit %d of %d is NaN", i, vocab);
    return MS_OK;
}

/*
 * The kept distribution of a non-greedy row: prob[i] = exp(z_i / T - max z / T) (HF: scores / T,
 * then softmax), kept where prob[i] >= *thr (top-k, then top-p, then min_p). Returns false when
 * one id takes all the mass (an infinite logit, or max z / T overflows float): *best is it.
 * c: vocab candidates of scratch.
 */
static bool kept_probs(const float *logits, int32_t vocab, const ms_sample_row *row, float *prob,
                       cand *c, int32_t best, float *thr_out) {
    const ms_sampling_params *p = &row->params;
    if (isinf(logits[best]) && logits[best] > 0)
        return false; /* an infinite logit takes all the mass */
    float inv_t = 1.0f / p->temperature;
    float zmax = logits[best] * inv_t;
    if (!isfinite(zmax))
        return false; /* max z / T overflows float: the max takes all the mass */
    for (int32_t i = 0; i < vocab; i++)
        prob[i] = expf(logits[i] * inv_t - zmax);

    /* top-k: keep p_i >= the k-th largest (ties at the boundary kept) */
    float thr = 0.0f;
    if (p->top_k > 0 && p->top_k < vocab) {
        for (int32_t i = 0; i < vocab; i++)
            c[i] = (cand){prob[i], i};
        select_top_k(c, vocab, p->top_k);
        thr = c[p->top_k - 1].p;
    }
    double mass = 0.0; /* mass kept by top-k: the top-p threshold refers to it */
    for (int32_t i = 0; i < vocab; i++)
        if (prob[i] >= thr)
            mass += prob[i];

    /* top-p: the largest tau such that the mass of p_i >= tau reaches top_p * mass. Only
     * candidates above (1 - top_p) / (n - 1) of the mass can be needed (llama2.c sample_topp). */
    if (p->top_p < 1.0f) {
        float cutoff = vocab > 1 ? (float)((1.0 - p->top_p) / (vocab - 1) * mass) : 0.0f;
        int32_t n = 0;
        for (int32_t i = 0; i < vocab; i++)
            if (prob[i] >= thr && prob[i] >= cutoff)
                c[n++] = (cand){prob[i], i};
        qsort(c, (size_t)n, sizeof *c, cand_cmp);
        double cum = 0.0, want = (double)p->top_p * mass;
        float tau = n > 0 ? c[n - 1].p : thr;
        for (int32_t i = 0; i < n; i++) {
            cum += c[i].p;
            if (cum >= want) {
                tau = c[i].p;
                break;
            }
        }
        thr = fmaxf(thr, tau);
    }
    /* min_p: relative to the maximum, whose p is exp(0) = 1 (HF MinPLogitsWarper: after top-p) */
    thr = fmaxf(thr, row->min_p);
    *thr_out = thr;
    return true;
}

ms_status ms_sampler_sample(const float *logits, int32_t vocab, const ms_sample_row *row,
                            void *scratch, int32_t *out_id, ms_error *err) {
    MS_TRY(row_check(logits, vocab, row, err));
    const ms_sampling_params *p = &row->params;
    int32_t best = ms_sampler_argmax(logits, vocab);
    if (ms_sampler_is_greedy(p)) {
        *out_id = best;
        return MS_OK;
    }
    if (scratch == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "sampling: scratch missing for non-greedy settings");
    float *prob = scratch;
    cand *c = (cand *)(prob + vocab);
    float thr;
    if (!kept_probs(logits, vocab, row, prob, c, best, &thr)) {
        *out_id = best;
        return MS_OK;
    }

    /* one uniform, inverse CDF over the kept ids in vocabulary order (a device sampler draws the
     * same way without sorting) */
    double total = 0.0;
    for (int32_t i = 0; i < vocab; i++)
        if (prob[i] >= thr)
            total += prob[i];
    double r = (double)ms_sampler_uniform(p->seed, row->draw) * total, cdf = 0.0;
    int32_t last = best;
    for (int32_t i = 0; i < vocab; i++) {
        if (!(prob[i] >= thr))
            continue;
        cdf += prob[i];
        last = i;
        if (r < cdf) {
            *out_id = i;
            return MS_OK;
        }
    }
    *out_id = last; /* rounding */
    return MS_OK;
}

ms_status ms_sampler_sample_row(const float *logits, int32_t vocab, const ms_sampling_params *p,
                                uint64_t draw, void *scratch, int32_t *out_id, ms_error *err) {
    if (p == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "sampling: parameters missing");
    ms_sample_row row = {.params = *p, .draw = draw, .min_p = 0.0f};
    return ms_sampler_sample(logits, vocab, &row, scratch, out_id, err);
}

ms_status ms_sampler_logprobs(const float *logits, int32_t vocab, const ms_sample_row *row,
                              void *scratch, int32_t id, int32_t top_n, float *lp_id,
                              int32_t *top_ids, float *top_lps, int32_t *n_top, ms_error *err) {
    *n_top = 0;
    MS_TRY(row_check(logits, vocab, row, err));
    if (id < 0 || id >= vocab)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "logprobs: id %d outside the vocabulary [0, %d)",
                       (int)id, (int)vocab);
    if (scratch == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "logprobs: scratch missing");
    float *prob = scratch;
    cand *c = (cand *)(prob + vocab);
    int32_t best = ms_sampler_argmax(logits, vocab);
    float thr = 0.0f;
    bool spread = true;
    if (ms_sampler_is_greedy(&row->params)) {
        /* the model's distribution: softmax(z), nothing truncated */
        if (isinf(logits[best]) && logits[best] > 0) {
            spread = false;
        } else {
            for (int32_t i = 0; i < vocab; i++)
                prob[i] = expf(logits[i] - logits[best]);
        }
    } else {
        spread = kept_probs(logits, vocab, row, prob, c, best, &thr);
    }
    if (!spread) { /* one id holds all the mass */
        for (int32_t i = 0; i < vocab; i++)
            prob[i] = i == best ? 1.0f : 0.0f;
        thr = 1.0f;
    }
    double total = 0.0;
    int32_t n = 0;
    for (int32_t i = 0; i < vocab; i++)
        if (prob[i] >= thr && prob[i] > 0.0f) {
            total += prob[i];
            c[n++] = (cand){prob[i], i};
        }
    double log_total = log(total);
    *lp_id = prob[id] >= thr && prob[id] > 0.0f ? (float)(log((double)prob[id]) - log_total)
                                                : MS_SAMPLER_LOGPROB_FLOOR;
    int32_t k = MS_MIN(MS_MAX(top_n, 0), n);
    if (k > 0) {
        select_top_k(c, n, k);
        for (int32_t i = 0; i < k; i++) {
            top_ids[i] = c[i].id;
            top_lps[i] = (float)(log((double)c[i].p) - log_total);
        }
    }
    *n_top = k;
    return MS_OK;
}

/* ---- penalties ---- */

bool ms_sampler_penalties_off(const ms_sampler_penalties *p) {
    return p->presence == 0.0f && p->frequency == 0.0f && p->repetition == 1.0f;
}

void ms_sampler_apply_penalties(float *logits, int32_t vocab, const ms_sampler_penalties *p,
                                const int32_t *ids, const int32_t *out_counts,
                                const uint8_t *in_prompt, int32_t n) {
    for (int32_t k = 0; k < n; k++) {
        int32_t j = ids[k];
        if (j < 0 || j >= vocab)
            continue;
        float z = logits[j];
        if (p->repetition != 1.0f && (in_prompt[k] || out_counts[k] > 0))
            z = z > 0.0f ? z / p->repetition : z * p->repetition;
        if (out_counts[k] > 0)
            z -= p->frequency * (float)out_counts[k] + p->presence;
        logits[j] = z;
    }
}
