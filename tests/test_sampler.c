/*
 * test_sampler.c - host sampling (sampler.c) and the backend's sample entry: greedy ties,
 * top-k = 1 and tiny top-p reduce to greedy, same seed and draw give the same id, the empirical
 * distribution follows softmax(z / T) restricted by top-k / top-p, bad settings are refused.
 */
#include "ms_test.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "sampler.h"
#include "ms_test_impl.h"

static void fill_logits(float *z, int32_t n, uint64_t seed) {
    for (int32_t i = 0; i < n; i++)
        z[i] = (ms_sampler_uniform(seed, (uint64_t)i) - 0.5f) * 8.0f;
}

static void test_uniform_is_deterministic_and_uniform(void **state) {
    (void)state;
    assert_true(ms_sampler_uniform(7, 3) == ms_sampler_uniform(7, 3));
    assert_true(ms_sampler_uniform(7, 3) != ms_sampler_uniform(8, 3));
    assert_true(ms_sampler_uniform(7, 3) != ms_sampler_uniform(7, 4));
    int bins[10] = {0};
    for (uint64_t d = 0; d < 100000; d++) {
        float u = ms_sampler_uniform(42, d);
        assert_true(u >= 0.0f && u < 1.0f);
        bins[(int)(u * 10.0f)]++;
    }
    for (int b = 0; b < 10; b++)
        assert_true(bins[b] > 9500 && bins[b] < 10500);
}

static void test_greedy_equivalents(void **state) {
    (void)state;
    ms_error err = {0};
    enum { V = 300 };
    float z[V];
    void *scratch = ms_malloc(ms_sampler_scratch_size(V));
    for (uint64_t row = 0; row < 20; row++) {
        fill_logits(z, V, row + 100);
        int32_t want = ms_sampler_argmax(z, V), id;
        ms_sampling_params g = ms_sampling_greedy();
        assert_int_equal(ms_sampler_sample_row(z, V, &g, 0, NULL, &id, &err), MS_OK);
        assert_int_equal(id, want);
        ms_sampling_params k1 = {1.5f, 1, 1.0f, row};
        ms_sampling_params ptiny = {1.5f, 0, 1e-6f, row};
        ms_sampling_params both = {0.7f, 5, 1e-6f, row};
        for (uint64_t d = 0; d < 10; d++) {
            assert_int_equal(ms_sampler_sample_row(z, V, &k1, d, scratch, &id, &err), MS_OK);
            assert_int_equal(id, want);
            assert_int_equal(ms_sampler_sample_row(z, V, &ptiny, d, scratch, &id, &err), MS_OK);
            assert_int_equal(id, want);
            assert_int_equal(ms_sampler_sample_row(z, V, &both, d, scratch, &id, &err), MS_OK);
            assert_int_equal(id, want);
        }
    }
    /* ties: lowest index */
    float tie[4] = {0.5f, 2.0f, 2.0f, 1.0f};
    assert_int_equal(ms_sampler_argmax(tie, 4), 1);
    ms_free(scratch);
}

static void test_same_seed_same_ids(void **state) {
    (void)state;
    ms_error err = {0};
    enum { V = 1000 };
    float z[V];
    fill_logits(z, V, 5);
    void *scratch = ms_malloc(ms_sampler_scratch_size(V));
    ms_sampling_params p = {0.9f, 50, 0.9f, 1234};
    int32_t a[64], b[64];
    for (int d = 0; d < 64; d++)
        assert_int_equal(ms_sampler_sample_row(z, V, &p, (uint64_t)d, scratch, &a[d], &err), MS_OK);
    for (int d = 63; d >= 0; d--) /* order of calls does not matter: ids depend on (seed, draw) */
        assert_int_equal(ms_sampler_sample_row(z, V, &p, (uint64_t)d, scratch, &b[d], &err), MS_OK);
    assert_memory_equal(a, b, sizeof a);
    int distinct = 0;
    for (int d = 1; d < 64; d++)
        distinct += a[d] != a[0];
    assert_true(distinct > 0);
    p.seed = 1235;
    int same = 0;
    for (int d = 0; d < 64; d++) {
        assert_int_equal(ms_sampler_sample_row(z, V, &p, (uint64_t)d, scratch, &b[d], &err), MS_OK);
        same += a[d] == b[d];
    }
    assert_true(same < 64);
    ms_free(scratch);
}

/* The exact kept distribution of (p, min_p) over z[0..V), V <= 16, into want[] (reference:
 * softmax(z / T), top-k, the smallest top-p nucleus, then min_p relative to the maximum). */
static void ref_distribution(const float *z, int32_t V, ms_sampling_params p, float min_p,
                             double *want) {
    double prob[16], sum = 0.0, pmax = 0.0;
    int order[16];
    for (int i = 0; i < V; i++) {
        prob[i] = exp(((double)z[i]) / p.temperature);
        pmax = fmax(pmax, prob[i]);
        order[i] = i;
    }
    for (int i = 0; i < V; i++)
        for (int j = i + 1; j < V; j++)
            if (prob[order[j]] > prob[order[i]]) {
                int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
    int keep = (p.top_k > 0 && p.top_k < V) ? p.top_k : V;
    for (int i = 0; i < keep; i++)
        sum += prob[order[i]];
    double cum = 0.0;
    int keep_p = keep;
    for (int i = 0; i < keep; i++) {
        cum += prob[order[i]];
        if (cum >= p.top_p * sum) {
            keep_p = i + 1;
            break;
        }
    }
    double tot = 0.0;
    for (int i = 0; i < V; i++)
        want[i] = 0.0;
    for (int i = 0; i < keep_p; i++)
        if (prob[order[i]] >= min_p * pmax)
            tot += prob[order[i]];
    for (int i = 0; i < keep_p; i++)
        if (prob[order[i]] >= min_p * pmax)
            want[order[i]] = prob[order[i]] / tot;
}

/* Empirical frequencies of ms_sampler_sample with min_p against the reference. */
static void check_distribution_min_p(const float *z, int32_t V, ms_sampling_params p, float min_p,
                                     int n_draws) {
    ms_error err = {0};
    double want[16];
    ref_distribution(z, V, p, min_p, want);
    int count[16] = {0};
    void *scratch = ms_malloc(ms_sampler_scratch_size(V));
    for (int d = 0; d < n_draws; d++) {
        ms_sample_row row = {p, (uint64_t)d, min_p};
        int32_t id;
        assert_int_equal(ms_sampler_sample(z, V, &row, scratch, &id, &err), MS_OK);
        count[id]++;
    }
    for (int i = 0; i < V; i++) {
        double f = (double)count[i] / n_draws;
        double sd = sqrt(want[i] * (1 - want[i]) / n_draws);
        if (fabs(f - want[i]) > 5 * sd + 1e-3)
            fail_msg("id %d: frequency %.4f, expected %.4f (T %g, k %d, p %g, min_p %g)", i, f,
                     want[i], (double)p.temperature, p.top_k, (double)p.top_p, (double)min_p);
        if (want[i] == 0.0)
            assert_int_equal(count[i], 0);
    }
    ms_free(scratch);
}

static void test_min_p_distribution(void **state) {
    (void)state;
    float z[8] = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, 1.5f, -1.0f, 0.7f};
    check_distribution_min_p(z, 8, (ms_sampling_params){1.0f, 0, 1.0f, 1}, 0.3f, 40000);
    check_distribution_min_p(z, 8, (ms_sampling_params){0.5f, 0, 1.0f, 2}, 0.05f, 40000);
    check_distribution_min_p(z, 8, (ms_sampling_params){1.0f, 5, 0.9f, 3}, 0.2f, 40000);
    check_distribution_min_p(z, 8, (ms_sampling_params){2.0f, 0, 1.0f, 4}, 0.0f, 40000);
    /* min_p 1: only the maximum */
    check_distribution_min_p(z, 8, (ms_sampling_params){1.0f, 0, 1.0f, 5}, 1.0f, 2000);
    /* out of range is refused, naming the field */
    ms_error err = {0};
    char scratch[8 * 16];
    int32_t id;
    ms_sample_row bad = {{1.0f, 0, 1.0f, 0}, 0, 1.5f};
    assert_int_equal(ms_sampler_sample(z, 8, &bad, scratch, &id, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "min_p 1.5"));
    bad.min_p = NAN;
    assert_int_equal(ms_sampler_sample(z, 8, &bad, scratch, &id, &err), MS_ERR_INVALID_ARG);
}

/* Logprobs are those of the distribution sampled from (sglang PR #2664): exp(logprob) of every
 * id equals the reference kept distribution the sampler draws from (test_min_p_distribution
 * checks the draws follow it); ids not kept get the floor; greedy reports log_softmax(z). */
static void test_logprobs_are_the_sampled_distribution(void **state) {
    (void)state;
    ms_error err = {0};
    float z[8] = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, 1.5f, -1.0f, 0.7f};
    void *scratch = ms_malloc(ms_sampler_scratch_size(8));
    const struct {
        ms_sampling_params p;
        float min_p;
    } cases[] = {
        {{1.0f, 0, 1.0f, 1}, 0.0f}, {{0.5f, 0, 1.0f, 1}, 0.0f}, {{1.0f, 3, 1.0f, 1}, 0.0f},
        {{1.0f, 0, 0.6f, 1}, 0.0f}, {{2.0f, 5, 0.8f, 1}, 0.1f}, {{1.3f, 0, 1.0f, 1}, 0.4f},
    };
    for (size_t c = 0; c < MS_ARRAY_LEN(cases); c++) {
        double want[16];
        ref_distribution(z, 8, cases[c].p, cases[c].min_p, want);
        ms_sample_row row = {cases[c].p, 0, cases[c].min_p};
        int32_t top_ids[8], n_top, kept = 0;
        float top_lps[8], lp;
        for (int32_t i = 0; i < 8; i++) {
            kept += want[i] > 0.0;
            assert_int_equal(ms_sampler_logprobs(z, 8, &row, scratch, i, 8, &lp, top_ids, top_lps,
                                                 &n_top, &err),
                             MS_OK);
            if (want[i] > 0.0) {
                if (fabs(exp((double)lp) - want[i]) > 1e-5)
                    fail_msg("case %zu id %d: exp(logprob) %.6f, expected %.6f", c, (int)i,
                             exp((double)lp), want[i]);
            } else {
                assert_true(lp == MS_SAMPLER_LOGPROB_FLOOR);
            }
        }
        /* the top list: every kept id once, probability descending, summing to 1 */
        assert_int_equal(n_top, kept);
        double sum = 0.0;
        for (int32_t k = 0; k < n_top; k++) {
            sum += exp((double)top_lps[k]);
            assert_true(want[top_ids[k]] > 0.0);
            if (k > 0)
                assert_true(top_lps[k] <= top_lps[k - 1]);
        }
        assert_true(fabs(sum - 1.0) < 1e-5);
        /* top_n smaller than the kept set: the best ones */
        assert_int_equal(ms_sampler_logprobs(z, 8, &row, scratch, 3, 2, &lp, top_ids, top_lps,
                                             &n_top, &err),
                         MS_OK);
        assert_int_equal(n_top, MS_MIN(2, kept));
        assert_int_equal(top_ids[0], 3); /* z[3] = 2 is the maximum */
    }
    /* greedy: the model's distribution, log_softmax(z) */
    ms_sample_row g = {ms_sampling_greedy(), 0, 0.0f};
    double lse = 0.0;
    for (int i = 0; i < 8; i++)
        lse += exp((double)z[i]);
    lse = log(lse);
    int32_t top_ids[3], n_top;
    float top_lps[3], lp;
    assert_int_equal(
        ms_sampler_logprobs(z, 8, &g, scratch, 6, 3, &lp, top_ids, top_lps, &n_top, &err), MS_OK);
    assert_true(fabs((double)lp - ((double)z[6] - lse)) < 1e-5);
    assert_int_equal(n_top, 3);
    assert_int_equal(top_ids[0], 3);
    assert_int_equal(top_ids[1], 5);
    assert_int_equal(top_ids[2], 0);
    assert_int_equal(
        ms_sampler_logprobs(z, 8, &g, scratch, 8, 3, &lp, top_ids, top_lps, &n_top, &err),
        MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "id 8 outside"));
    ms_free(scratch);
}

/* vLLM's apply_penalties on a worked example: repetition on prompt or generated ids (divide a
 * positive logit, multiply a negative one), then frequency x count + presence on generated ids. */
static void test_penalties(void **state) {
    (void)state;
    float z[5] = {2.0f, -1.0f, 0.5f, 3.0f, 1.0f};
    const int32_t ids[4] = {0, 1, 3, 99};
    const int32_t counts[4] = {2, 1, 0, 5};
    const uint8_t in_prompt[4] = {0, 0, 1, 1};
    ms_sampler_penalties p = {0.5f, 0.25f, 2.0f};
    assert_false(ms_sampler_penalties_off(&p));
    ms_sampler_apply_penalties(z, 5, &p, ids, counts, in_prompt, 4);
    assert_float_equal(z[0], 2.0f / 2.0f - (0.25f * 2 + 0.5f), 1e-6);
    assert_float_equal(z[1], -1.0f * 2.0f - (0.25f + 0.5f), 1e-6);
    assert_float_equal(z[2], 0.5f, 0.0);  /* not in the history */
    assert_float_equal(z[3], 3.0f / 2.0f, 1e-6); /* prompt only: repetition, no presence */
    assert_float_equal(z[4], 1.0f, 0.0);  /* id 99 is outside the vocabulary: skipped */
    ms_sampler_penalties off = {0.0f, 0.0f, 1.0f};
    assert_true(ms_sampler_penalties_off(&off));
    float w[5] = {2.0f, -1.0f, 0.5f, 3.0f, 1.0f};
    ms_sampler_apply_penalties(w, 5, &off, ids, counts, in_prompt, 4);
    assert_float_equal(w[0], 2.0f, 0.0);
    assert_float_equal(w[1], -1.0f, 0.0);
    assert_float_equal(w[3], 3.0f, 0.0);
}

/* Empirical frequencies against the exact filtered distribution (3-sigma-ish bound). */
static void check_distribution(const float *z, int32_t V, ms_sampling_params p, int n_draws) {
    ms_error err = {0};
    double prob[16], sum = 0.0;
    int order[16];
    for (int i = 0; i < V; i++) {
        prob[i] = exp(((double)z[i]) / p.temperature);
        order[i] = i;
    }
    /* sort ids by probability descending */
    for (int i = 0; i < V; i++)
        for (int j = i + 1; j < V; j++)
            if (prob[order[j]] > prob[order[i]]) {
                int t = order[i];
                order[i] = order[j];
                order[j] = t;
            }
    int keep = (p.top_k > 0 && p.top_k < V) ? p.top_k : V;
    for (int i = 0; i < keep; i++)
        sum += prob[order[i]];
    double cum = 0.0;
    int keep_p = keep;
    for (int i = 0; i < keep; i++) {
        cum += prob[order[i]];
        if (cum >= p.top_p * sum) {
            keep_p = i + 1;
            break;
        }
    }
    double want[16] = {0}, tot = 0.0;
    for (int i = 0; i < keep_p; i++)
        tot += prob[order[i]];
    for (int i = 0; i < keep_p; i++)
        want[order[i]] = prob[order[i]] / tot;
    int count[16] = {0};
    void *scratch = ms_malloc(ms_sampler_scratch_size(V));
    for (int d = 0; d < n_draws; d++) {
        int32_t id;
        assert_int_equal(ms_sampler_sample_row(z, V, &p, (uint64_t)d, scratch, &id, &err), MS_OK);
        count[id]++;
    }
    for (int i = 0; i < V; i++) {
        double f = (double)count[i] / n_draws;
        double sd = sqrt(want[i] * (1 - want[i]) / n_draws);
        if (fabs(f - want[i]) > 5 * sd + 1e-3)
            fail_msg("id %d: frequency %.4f, expected %.4f (T %g, k %d, p %g)", i, f, want[i],
                     (double)p.temperature, p.top_k, (double)p.top_p);
        if (want[i] == 0.0)
            assert_int_equal(count[i], 0);
    }
    ms_free(scratch);
}

static void test_distribution_follows_filters(void **state) {
    (void)state;
    float z[8] = {1.0f, 0.2f, -0.5f, 2.0f, 0.0f, 1.5f, -1.0f, 0.7f};
    check_distribution(z, 8, (ms_sampling_params){1.0f, 0, 1.0f, 1}, 40000);
    check_distribution(z, 8, (ms_sampling_params){0.5f, 0, 1.0f, 2}, 40000);
    check_distribution(z, 8, (ms_sampling_params){1.0f, 3, 1.0f, 3}, 40000);
    check_distribution(z, 8, (ms_sampling_params){1.0f, 0, 0.6f, 4}, 40000);
    check_distribution(z, 8, (ms_sampling_params){2.0f, 5, 0.8f, 5}, 40000);
}

static void test_draw_in_vocabulary_order_with_boundary_ties(void **state) {
    (void)state;
    ms_error err = {0};
    /* top_k = 2 with a tie at the boundary keeps both tied ids (the device sampler's rule) */
    float z[5] = {3.0f, 2.0f, -1.0f, 2.0f, 0.5f};
    char scratch[5 * 16];
    assert_true(sizeof scratch >= ms_sampler_scratch_size(5));
    ms_sampling_params p = {1.0f, 2, 1.0f, 11};
    int seen[5] = {0};
    for (uint64_t d = 0; d < 400; d++) {
        int32_t id;
        assert_int_equal(ms_sampler_sample_row(z, 5, &p, d, scratch, &id, &err), MS_OK);
        seen[id]++;
        /* reference: inverse CDF over kept ids {0, 1, 3} in vocabulary order */
        double pr[5], tot = 0.0;
        for (int i = 0; i < 5; i++) {
            pr[i] = (i == 0 || i == 1 || i == 3) ? exp((double)z[i] - 3.0) : 0.0;
            tot += pr[i];
        }
        double r = ms_sampler_uniform(11, d) * tot, cdf = 0.0;
        int want = 3;
        for (int i = 0; i < 5; i++) {
            cdf += pr[i];
            if (pr[i] > 0.0 && r < cdf) {
                want = i;
                break;
            }
        }
        assert_int_equal(id, want);
    }
    assert_true(seen[0] > 0 && seen[1] > 0 && seen[3] > 0);
    assert_int_equal(seen[2] + seen[4], 0);
}

static void test_bad_settings_and_nan(void **state) {
    (void)state;
    ms_error err = {0};
    float z[3] = {0.0f, 1.0f, 2.0f};
    char scratch[64];
    assert_true(sizeof scratch >= ms_sampler_scratch_size(3));
    int32_t id;
    ms_sampling_params p = {-1.0f, 0, 1.0f, 0};
    assert_int_equal(ms_sampler_sample_row(z, 3, &p, 0, scratch, &id, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "temperature -1"));
    p = (ms_sampling_params){1.0f, 0, 0.0f, 0};
    assert_int_equal(ms_sampler_sample_row(z, 3, &p, 0, scratch, &id, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "top_p 0"));
    p = (ms_sampling_params){1.0f, 0, 1.5f, 0};
    assert_int_equal(ms_sampler_check_params(&p, &err), MS_ERR_INVALID_ARG);
    p = (ms_sampling_params){1.0f, 0, 1.0f, 0};
    z[1] = NAN;
    assert_int_equal(ms_sampler_sample_row(z, 3, &p, 0, scratch, &id, &err), MS_ERR_INTERNAL);
    assert_non_null(strstr(err.msg, "logit 1 of 3 is NaN"));
    z[1] = INFINITY;
    assert_int_equal(ms_sampler_sample_row(z, 3, &p, 0, scratch, &id, &err), MS_OK);
    assert_int_equal(id, 1);
}

/* issue 15.1: a temperature whose scaling 1 / T overflows float (denormal T) used to turn every
 * probability into NaN and pick the last id; below MS_SAMPLER_MIN_TEMPERATURE it is greedy. */
static void test_tiny_temperature_is_greedy(void **state) {
    (void)state;
    ms_error err = {0};
    enum { V = 300 };
    float z[V];
    void *scratch = ms_malloc(ms_sampler_scratch_size(V));
    static const float temps[] = {1e-45f, 1e-40f, 1e-39f, 1e-38f, 1e-20f, 9e-6f};
    for (uint64_t row = 0; row < 8; row++) {
        fill_logits(z, V, row + 500);
        int32_t want = ms_sampler_argmax(z, V), id;
        for (size_t t = 0; t < MS_ARRAY_LEN(temps); t++) {
            ms_sampling_params p = {temps[t], 0, 1.0f, row};
            assert_true(ms_sampler_is_greedy(&p));
            assert_int_equal(ms_sampler_sample_row(z, V, &p, row, scratch, &id, &err), MS_OK);
            assert_int_equal(id, want);
            p.top_k = 40;
            p.top_p = 0.9f;
            assert_int_equal(ms_sampler_sample_row(z, V, &p, row, scratch, &id, &err), MS_OK);
            assert_int_equal(id, want);
        }
        /* huge logits with a small (not tiny) temperature: max z / T overflows, still greedy */
        for (int32_t i = 0; i < V; i++)
            z[i] *= 1e34f;
        want = ms_sampler_argmax(z, V);
        ms_sampling_params p = {1e-4f, 0, 1.0f, row};
        assert_false(ms_sampler_is_greedy(&p));
        assert_int_equal(ms_sampler_sample_row(z, V, &p, row, scratch, &id, &err), MS_OK);
        assert_int_equal(id, want);
    }
    ms_sampling_params p = {1e-5f, 0, 1.0f, 0};
    assert_false(ms_sampler_is_greedy(&p));
    ms_free(scratch);
}

static void test_backend_sample_rows(void **state) {
    (void)state;
    ms_error err = {0};
    ms_backend be;
    assert_int_equal(ms_backend_cpu_init(&be, NULL, &err), MS_OK);
    enum { M = 3, V = 64 };
    float z[M * V];
    for (int r = 0; r < M; r++)
        fill_logits(z + r * V, V, (uint64_t)r + 9);
    ms_sample_row rows[M] = {
        {ms_sampling_greedy(), 0, 0.0f},
        {{0.8f, 10, 0.9f, 77}, 5, 0.0f},
        {{1.0f, 1, 1.0f, 3}, 0, 0.0f},
    };
    size_t ws = be.iface.sample_workspace_size(be.ctx, M, V);
    assert_true(ws >= (size_t)M * V * 8);
    void *work = ms_malloc(ws);
    int32_t ids[M];
    ms_tensor tl = ms_tensor_2d(z, MS_DTYPE_F32, M, V), ti = ms_tensor_1d(ids, MS_DTYPE_I32, M);
    assert_int_equal(be.iface.sample(be.ctx, &tl, rows, work, ws, &ti, &err), MS_OK);
    assert_int_equal(ids[0], ms_sampler_argmax(z, V));
    assert_int_equal(ids[2], ms_sampler_argmax(z + 2 * V, V));
    int32_t one;
    assert_int_equal(ms_sampler_sample_row(z + V, V, &rows[1].params, 5, work, &one, &err), MS_OK);
    assert_int_equal(ids[1], one);
    rows[1].min_p = 0.4f; /* the backend passes min_p to the sampler */
    assert_int_equal(be.iface.sample(be.ctx, &tl, rows, work, ws, &ti, &err), MS_OK);
    assert_int_equal(ms_sampler_sample(z + V, V, &rows[1], work, &one, &err), MS_OK);
    assert_int_equal(ids[1], one);
    rows[1].min_p = 0.0f;
    assert_int_equal(ms_sampler_sample_row(z + V, V, &rows[1].params, 5, work, &one, &err), MS_OK);
    assert_int_equal(be.iface.sample(be.ctx, &tl, rows, work, ws - 1, &ti, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "sample: workspace"));
    /* issue 15.2: a NaN row gets MS_SAMPLE_ID_NAN, the other rows still sample (it used to fail
     * the whole batch with "sample: row 0: sampling: logit 0 of 64 is NaN") */
    for (int k = 0; k < 2; k++) {
        float keep = z[k * V + 5];
        z[k * V + 5] = NAN;
        ids[0] = ids[1] = ids[2] = 12345;
        assert_int_equal(be.iface.sample(be.ctx, &tl, rows, work, ws, &ti, &err), MS_OK);
        assert_int_equal(ids[k], MS_SAMPLE_ID_NAN);
        assert_int_equal(ids[2], ms_sampler_argmax(z + 2 * V, V));
        if (k == 0)
            assert_int_equal(ids[1], one);
        else
            assert_int_equal(ids[0], ms_sampler_argmax(z, V));
        z[k * V + 5] = keep;
    }
    rows[1].params.top_p = 2.0f;
    assert_int_equal(be.iface.sample(be.ctx, &tl, rows, work, ws, &ti, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "sample: row 1: sampling: top_p 2"));
    ms_free(work);
    ms_backend_free(&be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_uniform_is_deterministic_and_uniform),
        ms_unit_test(test_greedy_equivalents),
        ms_unit_test(test_same_seed_same_ids),
        ms_unit_test(test_distribution_follows_filters),
        ms_unit_test(test_draw_in_vocabulary_order_with_boundary_ties),
        ms_unit_test(test_bad_settings_and_nan),
        ms_unit_test(test_tiny_temperature_is_greedy),
        ms_unit_test(test_backend_sample_rows),
        ms_unit_test(test_min_p_distribution),
        ms_unit_test(test_logprobs_are_the_sampled_distribution),
        ms_unit_test(test_penalties),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
