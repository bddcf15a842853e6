/*
 * test_engine_prefix.c - prefix caching through the engine (ms_engine_options.prefix_cache) on the
 * CPU over hf/llama_gqa and models/llama.mstar's descriptor: every request's logits at every step
 * are bitwise those of the same requests run with the cache off, while the cache really hits
 * (its counters say how much). Cases, each a known bug elsewhere:
 *   - a shared 40-token system prefix, then requests arriving one after another;
 *   - one batch mixing a hit and a cold request (vllm #7003);
 *   - a prompt ending exactly on a page boundary (sglang #22819, flashinfer PR #3106) and a prompt
 *     cached whole, whose last token must still be computed (vllm PR #11186, llama.cpp #1884);
 *   - a second turn whose prompt holds the first turn's output (generated ids are cached too);
 *   - eviction under pressure with a small arena, and every page free at the end;
 *   - chunked prefill (8 ids a step) after an adopted prefix;
 *   - a sliding-window model (hf/mistral_window) whose window releases adopted pages;
 *   - guided (CFG) pairs on hf/llama_cfg: both streams cached, the unconditional one keyed apart.
 */
#include "ms_test.h"
#include "ms_test_impl.h"

#include <stdlib.h>
#include <string.h>

#include "engine.h"

extern const ms_model_desc ms_llama_desc;

#define PS 16
#define VOCAB 512
#define MAXN 12

typedef struct run_out {
    int32_t ids[MAXN][32];
    int32_t n_ids[MAXN];
    float *logits[MAXN]; /* [n_ids][VOCAB]: the logits each id was chosen from */
} run_out;

static const char *g_fixture = "hf/llama_gqa"; /* the checkpoint of the next make() */
static int32_t g_chunk;                         /* prefill_chunk of the requests run() adds */
static int32_t *const *g_neg;                   /* negative prompts (guided requests), or NULL */
static const int32_t *g_n_neg;

static ms_engine *make(bool cache, int32_t kv_pages, int32_t max_seqs) {
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture(g_fixture);
    o.page_size = PS;
    o.max_seqs = max_seqs;
    o.kv_pages = kv_pages;
    o.prefix_cache = cache;
    ms_engine *e = NULL;
    ms_error err = {0};
    if (ms_engine_init(&e, &ms_llama_desc, &o, &err) != MS_OK)
        fail_msg("engine init: %s", err.msg);
    return e;
}

/* Run `waves` of requests: wave w's prompts are added together, the wave runs to the end, then
 * the next wave comes. Records every id and the logits it came from. */
static void run(ms_engine *e, int32_t *const *prompts, const int32_t *n_prompt,
                const int32_t *wave, int32_t n, int32_t new_tokens, run_out *out) {
    memset(out, 0, sizeof *out);
    ms_error err = {0};
    int32_t w = 0;
    for (int32_t done = 0; done < n; w++) {
        ms_rid rids[MAXN];
        int32_t idx[MAXN], m = 0;
        for (int32_t i = 0; i < n; i++) {
            if (wave[i] != w)
                continue;
            ms_engine_request rq = {.prompt = prompts[i], .n_prompt = n_prompt[i],
                                    .max_new_tokens = new_tokens, .ignore_eos = true,
                                    .prefill_chunk = g_chunk};
            if (g_neg != NULL) {
                rq.negative_prompt = g_neg[i];
                rq.n_negative_prompt = g_n_neg[i];
                rq.guidance_scale = 3.0f;
            }
            rq.sampling.temperature = 0.f;
            rq.sampling.top_p = 1.f;
            if (ms_engine_add(e, &rq, &rids[m], &err) != MS_OK)
                fail_msg("add %d: %s", i, err.msg);
            idx[m++] = i;
            out->logits[i] = calloc((size_t)new_tokens * VOCAB, sizeof(float));
            assert_non_null(out->logits[i]);
        }
        while (ms_engine_n_active(e) > 0) {
            if (ms_engine_step(e, NULL, &err) != MS_OK)
                fail_msg("step: %s", err.msg);
            for (int32_t k = 0; k < m; k++) {
                const int32_t *ids;
                int32_t got;
                assert_int_equal(ms_engine_output(e, rids[k], &ids, &got, NULL), MS_OK);
                const float *lg = ms_engine_last_logits(e, rids[k]);
                int32_t i = idx[k];
                if (got > out->n_ids[i] && lg != NULL) {
                    memcpy(out->logits[i] + (size_t)(got - 1) * VOCAB, lg, VOCAB * sizeof(float));
                    memcpy(out->ids[i], ids, (size_t)got * sizeof(int32_t));
                    out->n_ids[i] = got;
                }
            }
        }
        for (int32_t k = 0; k < m; k++)
            ms_engine_remove(e, rids[k]);
        done += m;
    }
}

static void free_out(run_out *o) {
    for (int i = 0; i < MAXN; i++)
        free(o->logits[i]);
}

static void expect_same(const run_out *a, const run_out *b, int32_t n, const char *what) {
    for (int32_t i = 0; i < n; i++) {
        if (a->n_ids[i] != b->n_ids[i])
            fail_msg("%s: request %d: %d ids with the cache, %d without", what, i, a->n_ids[i],
                     b->n_ids[i]);
        for (int32_t t = 0; t < a->n_ids[i]; t++)
            if (a->ids[i][t] != b->ids[i][t])
                fail_msg("%s: request %d id %d: %d with the cache, %d without", what, i, t,
                         a->ids[i][t], b->ids[i][t]);
        if (memcmp(a->logits[i], b->logits[i], (size_t)a->n_ids[i] * VOCAB * sizeof(float)) != 0)
            fail_msg("%s: request %d: logits differ (not bitwise)", what, i);
    }
}

/* Prompt i: the shared prefix (`shared` ids, seeded), then `own` ids of its own. */
static int32_t *prompt(int32_t shared, int32_t own, uint32_t seed) {
    int32_t *p = malloc((size_t)(shared + own) * sizeof *p);
    assert_non_null(p);
    uint32_t s = 12345;
    for (int32_t t = 0; t < shared; t++) {
        s = s * 1103515245u + 12345u;
        p[t] = 1 + (int32_t)((s >> 8) % (VOCAB - 1));
    }
    s = seed;
    for (int32_t t = shared; t < shared + own; t++) {
        s = s * 1664525u + 1013904223u;
        p[t] = 1 + (int32_t)((s >> 8) % (VOCAB - 1));
    }
    return p;
}

static void compare(int32_t *const *prompts, const int32_t *n_prompt, const int32_t *wave,
                    int32_t n, int32_t new_tokens, int32_t kv_pages, int32_t max_seqs,
                    const char *what, ms_prefix_stats *st) {
    run_out with, without;
    ms_engine *e = make(true, kv_pages, max_seqs);
    int32_t free0 = ms_engine_kv_pages_free(e);
    run(e, prompts, n_prompt, wave, n, new_tokens, &with);
    ms_engine_prefix_stats(e, st);
    assert_int_equal(ms_engine_kv_pages_free(e), free0); /* cached pages count as free */
    ms_engine_free(e);
    e = make(false, kv_pages, max_seqs);
    run(e, prompts, n_prompt, wave, n, new_tokens, &without);
    ms_prefix_stats none;
    ms_engine_prefix_stats(e, &none);
    assert_int_equal(none.lookups, 0);
    ms_engine_free(e);
    expect_same(&with, &without, n, what);
    print_message("%s: %llu lookups, %llu hit tokens, %llu pages listed, %llu evicted\n", what,
                  (unsigned long long)st->lookups, (unsigned long long)st->hit_tokens,
                  (unsigned long long)st->inserts, (unsigned long long)st->evictions);
    free_out(&with);
    free_out(&without);
}

static void test_shared_system_prefix(void **state) {
    (void)state;
    int32_t *p[4];
    int32_t n[4], wave[4] = {0, 1, 2, 2};
    for (int i = 0; i < 4; i++) {
        n[i] = 40 + 5 + 3 * i;
        p[i] = prompt(40, n[i] - 40, 100u + (uint32_t)i);
    }
    ms_prefix_stats st;
    /* waves 1 and 2 hit the two full pages of the shared 40; wave 2 mixes two hits in a batch */
    compare(p, n, wave, 4, 8, 0, 4, "shared system prefix", &st);
    assert_true(st.hit_tokens >= 3 * 2 * PS);
    for (int i = 0; i < 4; i++)
        free(p[i]);
}

static void test_mixed_hit_and_cold_batch(void **state) {
    (void)state;
    int32_t *p[3];
    int32_t n[3] = {50, 37, 33}, wave[3] = {0, 1, 1};
    p[0] = prompt(34, 16, 7u);
    p[1] = prompt(34, 3, 8u); /* shares 2 full pages with p[0] */
    p[2] = prompt(0, 33, 9u); /* cold, in the same batch */
    ms_prefix_stats st;
    compare(p, n, wave, 3, 8, 0, 4, "hit and cold in one batch", &st);
    assert_int_equal(st.hit_tokens, 2 * PS);
    for (int i = 0; i < 3; i++)
        free(p[i]);
}

static void test_page_boundary_and_whole_prompt(void **state) {
    (void)state;
    int32_t *p[3];
    int32_t n[3] = {32, 32, 33}, wave[3] = {0, 1, 2};
    p[0] = prompt(32, 0, 1u);
    p[1] = prompt(32, 0, 1u); /* the same 32 ids: cached whole, its last page still computed */
    p[2] = prompt(32, 1, 2u); /* 33 ids: both full pages hit, one token computed */
    ms_prefix_stats st;
    compare(p, n, wave, 3, 6, 0, 2, "page boundary and a whole cached prompt", &st);
    assert_int_equal(st.hit_tokens, PS + 2 * PS); /* p1: 1 page ((32 - 1) / 16), p2: 2 pages */
    for (int i = 0; i < 3; i++)
        free(p[i]);
}

static void test_second_turn_hits_the_first_turns_output(void **state) {
    (void)state;
    /* turn 1: 30 ids, 20 generated (ignore_eos); turn 2: those 30 + the 20 + 6 more */
    int32_t *p1 = prompt(0, 30, 5u);
    run_out first;
    ms_engine *e = make(false, 0, 2);
    int32_t n1 = 30, w0 = 0;
    run(e, &p1, &n1, &w0, 1, 20, &first);
    ms_engine_free(e);
    int32_t *p2 = malloc(56 * sizeof *p2);
    assert_non_null(p2);
    memcpy(p2, p1, 30 * sizeof *p2);
    memcpy(p2 + 30, first.ids[0], 20 * sizeof *p2);
    for (int t = 50; t < 56; t++)
        p2[t] = 7 + t;
    int32_t *p[2] = {p1, p2};
    int32_t n[2] = {30, 56}, wave[2] = {0, 1};
    ms_prefix_stats st;
    compare(p, n, wave, 2, 20, 0, 2, "second turn", &st);
    /* turn 1 stored 30 + 19 ids (the last id is never fed): 3 full pages, all hit by turn 2 */
    assert_int_equal(st.hit_tokens, 3 * PS);
    free_out(&first);
    free(p1);
    free(p2);
}

static void test_eviction_under_pressure(void **state) {
    (void)state;
    /* 12 pages (11 usable), 2 sequences at a time of up to 4 pages each: the cache fills and
       must evict for later waves, while outputs stay equal */
    int32_t *p[8];
    int32_t n[8], wave[8];
    for (int i = 0; i < 8; i++) {
        n[i] = 40;
        p[i] = prompt(i % 2 == 0 ? 33 : 0, i % 2 == 0 ? 7 : 40, 50u + (uint32_t)i);
        wave[i] = i / 2;
    }
    ms_prefix_stats st;
    compare(p, n, wave, 8, 8, 12, 2, "eviction under pressure", &st);
    assert_true(st.evictions > 0);
    assert_true(st.hit_tokens > 0);
    for (int i = 0; i < 8; i++)
        free(p[i]);
}

static void test_chunked_prefill(void **state) {
    (void)state;
    /* prompts fed 8 ids a step: the cached pages are adopted whole, the rest comes in chunks,
       and the chunks' pages are listed as they fill */
    int32_t *p[3];
    int32_t n[3] = {45, 47, 60}, wave[3] = {0, 1, 2};
    for (int i = 0; i < 3; i++)
        p[i] = prompt(40, n[i] - 40, 300u + (uint32_t)i);
    g_chunk = 8;
    ms_prefix_stats st;
    compare(p, n, wave, 3, 6, 0, 2, "chunked prefill", &st);
    g_chunk = 0;
    assert_int_equal(st.hit_tokens, 2 * 2 * PS);
    for (int i = 0; i < 3; i++)
        free(p[i]);
}

static void test_sliding_window(void **state) {
    (void)state;
    /* hf/mistral_window (window 8): a stream the window has cut lists nothing more, and a
       request that adopts pages the window then releases drops only its own owners; outputs
       stay equal */
    int32_t *p[3];
    int32_t n[3] = {20, 20, 40}, wave[3] = {0, 1, 2};
    for (int i = 0; i < 3; i++)
        p[i] = prompt(17, n[i] - 17, 400u + (uint32_t)i);
    g_fixture = "hf/mistral_window";
    ms_prefix_stats st;
    compare(p, n, wave, 3, 12, 0, 2, "sliding window", &st);
    g_fixture = "hf/llama_gqa";
    for (int i = 0; i < 3; i++)
        free(p[i]);
}

static void test_guided_pairs(void **state) {
    (void)state;
    /* hf/llama_cfg's guided walk: both streams of a pair adopt their cached prefixes (the
       unconditional one under its label's key) and the mixed logits stay bitwise equal */
    int32_t *p[3], *neg[3];
    int32_t n[3] = {40, 42, 44}, nn[3] = {36, 36, 38}, wave[3] = {0, 1, 2};
    for (int i = 0; i < 3; i++) {
        p[i] = prompt(34, n[i] - 34, 500u + (uint32_t)i);
        neg[i] = prompt(0, nn[i], 600u); /* the same negative prompt (its first 36 ids) */
    }
    g_fixture = "hf/llama_cfg";
    g_neg = neg;
    g_n_neg = nn;
    ms_prefix_stats st;
    compare(p, n, wave, 3, 8, 0, 4, "guided pairs", &st);
    g_neg = NULL;
    g_n_neg = NULL;
    g_fixture = "hf/llama_gqa";
    /* waves 1 and 2: 2 main pages each, and 2 unconditional pages each */
    assert_int_equal(st.hit_tokens, 2 * (2 + 2) * PS);
    for (int i = 0; i < 3; i++) {
        free(p[i]);
        free(neg[i]);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_shared_system_prefix),
        ms_unit_test(test_mixed_hit_and_cold_batch),
        ms_unit_test(test_page_boundary_and_whole_prompt),
        ms_unit_test(test_second_turn_hits_the_first_turns_output),
        ms_unit_test(test_eviction_under_pressure),
        ms_unit_test(test_chunked_prefill),
        ms_unit_test(test_sliding_window),
        ms_unit_test(test_guided_pairs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
