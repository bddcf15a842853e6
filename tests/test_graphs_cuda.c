/*
 * test_graphs_cuda.c - the captured path on the GPU (issue 10 [G] item 2; `make gpu-test`,
 * scripts/gpu-batch.sh): models/llama.mstar on hf/llama_gqa through the engine, CUDA graphs
 * (MS_GRAPHS_AUTO) against the eager path over the same padded rows (MS_GRAPHS_PADDED), which
 * runs the same kernels with the same launch parameters, so everything is compared bitwise:
 * every step's logits of every request, every sampled id (greedy and seeded rows), and the
 * bytes of the whole KV page arena at the end (a padding row that wrote a real request's pages
 * in one run and not in the other would show there: vllm #43810, sglang PR #32477).
 *   - on, between and above buckets: max_seqs 8, eight requests finishing one after another
 *     (batches 8 .. 1: buckets 8, 4, 2, 1 and the sizes between them, so the bucket switches
 *     mid-run); max_seqs 12, twelve requests (batches 12 .. 9 are above the largest kept bucket
 *     8 and run eager: sglang PR #33900, TensorRT-LLM #10688);
 *   - 1,000 padded replays: ten waves of three requests on bucket 4 (one padding row per step);
 *   - every bucket of [1, 2, 4, 8 .. 256] captured (max_seqs 256) without a failure, the
 *     capture time printed (and under 5 s);
 *   - graph against the unpadded eager path (MS_GRAPHS_OFF, other GEMM shapes: not bitwise):
 *     the first decode step's logits within 5e-2.
 *   - the pre-plan of step N+1 while step N replays (graph_exec.h; two slots per bucket): the
 *     graph run with it against the padded eager run without it (one slot), bitwise, with
 *     requests finishing one after another and one joining mid-run, so pre-plans are both
 *     taken and refused (the identity check) in the same run;
 *   - prefill over token buckets (graph_exec.h "Prefill"; `capture tokens in [32 .. 2048]`):
 *     waves of three ragged prompts padded to (tokens, rows) buckets 32 and 256 (a dummy tail
 *     row and one-token padding rows), a wave of 290 tokens above the largest kept token
 *     bucket 256 (eager), and a 3-token prompt joining mid-run, so prefill replays (on (32, 2))
 *     and decode replays alternate; graph against padded eager bitwise, KV arena included. Every
 *     scenario above also pads its first prefill where the rows leave room (three rows: (32, 4)).
 *     The capture scenario captures every bucket of models/llama.mstar at max_tokens 2048:
 *     9 decode buckets and the token buckets up to the model's context (hf/llama_gqa: 512) x 4
 *     row counts.
 *
 * Without a GPU, or with MS_GRAPHS_DRY_RUN=1, the same scenarios run on the CPU backend with
 * MS_GRAPHS_PADDED standing in for the graphs (the harness and the host path, not the graphs).
 */
#include "ms_test.h"
#include "ms_test_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend_cuda.h"
#include "engine.h"

extern const ms_model_desc ms_llama_desc;

static bool g_dry;           /* CPU stand-in */
static const char *g_device; /* "cuda" or "cpu" */

/* One scenario: waves of requests, each wave run to its end. */
typedef struct scen {
    const char *name;
    int32_t max_seqs;
    int32_t n_req;   /* requests per wave */
    int32_t waves;
    int32_t new_base, new_step; /* request r of a wave generates new_base + r * new_step ids */
    int32_t join_at; /* > 0: wave 0's last request joins after this many steps */
    bool p_no_preplan; /* the padded eager side runs without the pre-plan (one slot) */
    int32_t max_tokens; /* the engine's max_tokens; 0: MAX(64, max_seqs) */
    const int32_t *plen; /* [waves * n_req] prompt lengths (<= 512); NULL: 2 + (r + w) % 9 */
} scen;

/* What one run of a scenario produced. */
typedef struct rec {
    float *logits;   /* [n_logits] every step's last logits of every request in it, in order */
    size_t n_logits, cap_logits;
    int32_t *ids;    /* [n_ids] every request's output, in order */
    size_t n_ids, cap_ids;
    uint8_t *kv;     /* the arena at the end */
    size_t kv_bytes;
    float *first_decode; /* [n_req * vocab] logits of the first decode step of wave 0 */
    ms_graph_exec_stats st;
    int32_t vocab;
    int32_t max_context; /* the model's positions: token buckets stop there too */
} rec;

static void rec_free(rec *r) {
    free(r->logits);
    free(r->ids);
    free(r->kv);
    free(r->first_decode);
    memset(r, 0, sizeof *r);
}

static void push_logits(rec *r, const float *v, int32_t n) {
    if (r->n_logits + (size_t)n > r->cap_logits) {
        r->cap_logits = (r->n_logits + (size_t)n) * 2;
        r->logits = realloc(r->logits, r->cap_logits * sizeof(float));
        assert_non_null(r->logits);
    }
    memcpy(r->logits + r->n_logits, v, (size_t)n * sizeof(float));
    r->n_logits += (size_t)n;
}

static void push_ids(rec *r, const int32_t *v, int32_t n) {
    if (r->n_ids + (size_t)n > r->cap_ids) {
        r->cap_ids = (r->n_ids + (size_t)n) * 2 + 16;
        r->ids = realloc(r->ids, r->cap_ids * sizeof(int32_t));
        assert_non_null(r->ids);
    }
    memcpy(r->ids + r->n_ids, v, (size_t)n * sizeof(int32_t));
    r->n_ids += (size_t)n;
}

static void run_scen_pp(const scen *sc, ms_graph_mode mode, bool no_preplan, rec *out) {
    memset(out, 0, sizeof *out);
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture("hf/llama_gqa");
    o.device = g_device;
    o.max_seqs = sc->max_seqs;
    o.max_tokens = sc->max_tokens > 0 ? sc->max_tokens : MS_MAX(64, sc->max_seqs);
    o.n_threads = 2;
    o.graphs = mode;
    o.no_preplan = no_preplan;
    ms_engine *e = NULL;
    ms_error err = {0};
    if (ms_engine_init(&e, &ms_llama_desc, &o, &err) != MS_OK)
        fail_msg("%s: engine init (%s): %s", sc->name, ms_graph_mode_str(mode), err.msg);
    ms_engine_graph_stats(e, &out->st);
    const int32_t V = ms_engine_facts(e)->vocab;
    out->vocab = V;
    out->max_context = ms_engine_facts(e)->max_context;
    out->first_decode = calloc((size_t)sc->n_req * (size_t)V, sizeof(float));
    assert_non_null(out->first_decode);
    ms_rid *rids = calloc((size_t)sc->n_req, sizeof *rids);
    assert_non_null(rids);
    for (int32_t w = 0; w < sc->waves; w++) {
        for (int32_t r = 0; r < sc->n_req; r++) {
            rids[r] = 0;
            if (w == 0 && sc->join_at > 0 && r == sc->n_req - 1)
                continue; /* joins later */
            int32_t ids[512];
            int32_t n = sc->plen != NULL ? sc->plen[w * sc->n_req + r] : 2 + (r + w) % 9;
            assert_true(n >= 1 && n <= 512);
            for (int32_t i = 0; i < n; i++)
                ids[i] = (int32_t)((w * 131 + r * 97 + i * 31 + 7) % V);
            ms_sampling_params sp = ms_sampling_greedy();
            if (r % 3 == 1)
                sp = (ms_sampling_params){.temperature = 0.8f, .top_k = 40, .top_p = 0.9f,
                                          .seed = (uint64_t)(1000 * w + r)};
            ms_engine_request rq = {.prompt = ids, .n_prompt = n,
                                    .max_new_tokens = sc->new_base + r * sc->new_step,
                                    .sampling = sp, .ignore_eos = true};
            if (ms_engine_add(e, &rq, &rids[r], &err) != MS_OK)
                fail_msg("%s: add: %s", sc->name, err.msg);
        }
        for (int32_t s = 0; ms_engine_n_active(e) > 0; s++) {
            if (w == 0 && sc->join_at > 0 && s == sc->join_at) { /* a request joins mid-run */
                const int32_t r = sc->n_req - 1;
                int32_t ids[3] = {(r * 7 + 1) % V, (r * 13 + 2) % V, 3};
                ms_engine_request rq = {.prompt = ids, .n_prompt = 3,
                                        .max_new_tokens = sc->new_base + r * sc->new_step,
                                        .sampling = ms_sampling_greedy(), .ignore_eos = true};
                if (ms_engine_add(e, &rq, &rids[r], &err) != MS_OK)
                    fail_msg("%s: add: %s", sc->name, err.msg);
            }
            if (ms_engine_step(e, NULL, &err) != MS_OK)
                fail_msg("%s (%s): wave %d step %d: %s", sc->name, ms_graph_mode_str(mode),
                         (int)w, (int)s, err.msg);
            for (int32_t r = 0; r < sc->n_req; r++) {
                const float *lg = rids[r] != 0 ? ms_engine_last_logits(e, rids[r]) : NULL;
                if (lg == NULL)
                    continue;
                push_logits(out, lg, V);
                if (w == 0 && s == 1)
                    memcpy(out->first_decode + (size_t)r * (size_t)V, lg, (size_t)V * sizeof(float));
            }
        }
        for (int32_t r = 0; r < sc->n_req; r++) {
            const int32_t *ids;
            int32_t n;
            assert_int_equal(ms_engine_output(e, rids[r], &ids, &n, NULL), MS_OK);
            assert_int_equal(n, sc->new_base + r * sc->new_step);
            push_ids(out, ids, n);
            ms_engine_remove(e, rids[r]);
        }
    }
    ms_engine_graph_stats(e, &out->st); /* after the run: replays, eager steps */
    out->kv_bytes = ms_engine_kv_bytes(e);
    out->kv = malloc(out->kv_bytes);
    assert_non_null(out->kv);
    if (ms_engine_kv_copy(e, out->kv, out->kv_bytes, &err) != MS_OK)
        fail_msg("%s: kv copy: %s", sc->name, err.msg);
    free(rids);
    ms_engine_free(e);
}

static void run_scen(const scen *sc, ms_graph_mode mode, rec *out) {
    run_scen_pp(sc, mode, false, out);
}

/* Graph (AUTO; the dry run: PADDED) against PADDED eager: everything bitwise. */
static void compare_bitwise(const scen *sc, rec *g, rec *p) {
    const ms_graph_mode gm = g_dry ? MS_GRAPHS_PADDED : MS_GRAPHS_AUTO;
    run_scen(sc, gm, g);
    run_scen_pp(sc, MS_GRAPHS_PADDED, sc->p_no_preplan, p);
    printf("graphs %-10s %s: %d buckets (%d prefill), %d captured, %d failed, capture %.3f s, "
           "%llu padded steps (%llu prefill; %llu padding rows, %llu padding prefill tokens), "
           "%llu eager%s%s\n",
           sc->name, g_device, (int)g->st.n_buckets, (int)g->st.n_prefill_buckets,
           (int)g->st.n_captured, (int)g->st.n_failed, g->st.capture_s,
           (unsigned long long)g->st.n_replays, (unsigned long long)g->st.n_prefill_replays,
           (unsigned long long)g->st.n_padding_rows, (unsigned long long)g->st.n_padding_tokens,
           (unsigned long long)g->st.n_eager, g->st.n_failed > 0 ? ": " : "",
           g->st.first_failure);
    assert_int_equal(g->st.mode, gm);
    assert_int_equal(g->st.n_failed, 0);
    assert_int_equal(g->st.n_slots, 2); /* the pre-plan's second slot */
    assert_int_equal(g->st.n_captured, g->st.n_buckets * g->st.n_slots);
    assert_int_equal(g->n_logits, p->n_logits);
    size_t first = g->n_logits;
    for (size_t i = 0; i < g->n_logits && first == g->n_logits; i++)
        if (memcmp(&g->logits[i], &p->logits[i], sizeof(float)) != 0)
            first = i;
    if (first != g->n_logits) {
        double worst = 0.0; /* how far apart, for the report: bitwise is the contract */
        for (size_t i = 0; i < g->n_logits; i++)
            worst = fmax(worst, fabs((double)g->logits[i] - (double)p->logits[i]));
        fail_msg("%s: graph logits differ from the padded eager run at value %zu (step row %zu,"
                 " id %zu): %.9g vs %.9g; max |d| over the run %.3g", sc->name, first,
                 first / (size_t)g->vocab, first % (size_t)g->vocab, (double)g->logits[first],
                 (double)p->logits[first], worst);
    }
    assert_int_equal(g->n_ids, p->n_ids);
    assert_memory_equal(g->ids, p->ids, g->n_ids * sizeof(int32_t));
    assert_int_equal(g->st.n_replays, p->st.n_replays);
    assert_int_equal(g->st.n_prefill_replays, p->st.n_prefill_replays);
    assert_int_equal(g->st.n_padding_rows, p->st.n_padding_rows);
    assert_int_equal(g->st.n_padding_tokens, p->st.n_padding_tokens);
    if (sc->p_no_preplan) { /* one slot: fewer dummy pages, so other page numbers and arena */
        printf("graphs %-10s %s: bitwise equal: %zu logits, %zu ids (KV arenas differ in size)\n",
               sc->name, g_device, g->n_logits, g->n_ids);
        return;
    }
    assert_int_equal(g->kv_bytes, p->kv_bytes);
    size_t kfirst = g->kv_bytes;
    for (size_t i = 0; i < g->kv_bytes && kfirst == g->kv_bytes; i++)
        if (g->kv[i] != p->kv[i])
            kfirst = i;
    if (kfirst != g->kv_bytes)
        fail_msg("%s: KV arena bytes differ at byte %zu of %zu", sc->name, kfirst, g->kv_bytes);
    printf("graphs %-10s %s: bitwise equal: %zu logits, %zu ids, %zu KV bytes\n", sc->name,
           g_device, g->n_logits, g->n_ids, g->kv_bytes);
}

static void test_on_and_between_buckets(void **state) {
    (void)state;
    scen sc = {"between", 8, 8, 1, 4, 3, 0, false, 0, NULL}; /* batches 8, 7, ..., 1 */
    rec g, p, off;
    compare_bitwise(&sc, &g, &p);
    assert_int_equal(g.st.n_buckets - g.st.n_prefill_buckets, 4); /* 1, 2, 4, 8 */
    assert_int_equal(g.st.n_prefill_buckets, 8); /* 32, 64 tokens x 1, 2, 4, 8 rows */
    assert_int_equal(g.st.n_eager, 1); /* the prefill of 8 rows: no row count above 8 */
    assert_true(g.st.n_padding_rows > 0);
    assert_int_equal(g.st.last_bucket, 1);
    /* against the unpadded eager path: the same inputs at the first decode step */
    run_scen(&sc, MS_GRAPHS_OFF, &off);
    assert_int_equal(off.st.mode, MS_GRAPHS_OFF);
    double worst = 0.0;
    for (size_t i = 0; i < (size_t)sc.n_req * (size_t)g.vocab; i++)
        worst = fmax(worst, fabs((double)g.first_decode[i] - (double)off.first_decode[i]));
    size_t same = 0, n = MS_MIN(g.n_ids, off.n_ids);
    for (size_t i = 0; i < n; i++)
        same += g.ids[i] == off.ids[i];
    printf("graphs %-10s %s: against --no-graphs: first decode max |dlogit| %.3g, %zu of %zu "
           "ids equal\n", sc.name, g_device, worst, same, n);
    assert_true(worst <= 5e-2);
    rec_free(&g);
    rec_free(&p);
    rec_free(&off);
}

static void test_above_largest_bucket(void **state) {
    (void)state;
    scen sc = {"above", 12, 12, 1, 3, 1, 0, false, 0, NULL}; /* batches 12 .. 9 above bucket 8 */
    rec g, p;
    compare_bitwise(&sc, &g, &p);
    assert_int_equal(g.st.n_buckets - g.st.n_prefill_buckets, 4);
    assert_true(g.st.n_eager >= 4);
    assert_true(g.st.n_replays >= 8);
    rec_free(&g);
    rec_free(&p);
}

static void test_1000_padded_replays(void **state) {
    (void)state;
    scen sc = {"1000", 4, 3, 10, 101, 0, 0, false, 0, NULL}; /* 3 rows on bucket 4, 100 decode steps a wave */
    rec g, p;
    compare_bitwise(&sc, &g, &p);
    assert_true(g.st.n_replays >= 1000);
    assert_true(g.st.n_padding_rows >= 1000);
    assert_int_equal(g.st.n_eager, 0);
    assert_int_equal(g.st.n_prefill_replays, 10); /* each wave's prefill: 3 rows on (32, 4) */
    rec_free(&g);
    rec_free(&p);
}

static void test_preplan_refusal(void **state) {
    (void)state;
    /* batches 5, 4, ... with request 5 joining after step 3: pre-plans taken while the rows stay,
       refused when one finished or the joiner's prefill came */
    scen sc = {"preplan", 8, 6, 1, 4, 3, 3, true, 0, NULL};
    rec g, p;
    compare_bitwise(&sc, &g, &p);
    printf("graphs %-10s %s: %llu pre-plans: %llu taken, %llu refused, %llu dropped, %llu "
           "failed%s%s\n", sc.name, g_device, (unsigned long long)g.st.n_preplans,
           (unsigned long long)g.st.n_preplan_taken, (unsigned long long)g.st.n_preplan_refused,
           (unsigned long long)g.st.n_preplan_dropped, (unsigned long long)g.st.n_preplan_failed,
           g.st.n_preplan_failed > 0 ? ": " : "", g.st.first_preplan_failure);
    assert_int_equal(p.st.n_slots, 1);
    assert_int_equal(p.st.n_preplans, 0);
    assert_int_equal(g.st.n_preplan_failed, 0);
    assert_true(g.st.n_preplan_taken > 0);
    assert_true(g.st.n_preplan_refused >= 6); /* five finishing, one joining */
    assert_int_equal(g.st.n_preplan_taken + g.st.n_preplan_refused + g.st.n_preplan_dropped,
                     g.st.n_preplans);
    rec_free(&g);
    rec_free(&p);
}

static void test_capture_every_bucket(void **state) {
    (void)state;
    scen sc = {"all", 256, 20, 1, 3, 1, 0, false, 2048, NULL};
    rec g, p;
    compare_bitwise(&sc, &g, &p);
    assert_int_equal(g.st.n_buckets - g.st.n_prefill_buckets, 9); /* 1, 2, 4, ..., 256 */
    /* 32 .. 2048 up to the model's context (a dummy tail is one stream), x 1, 2, 4, 8 rows */
    int32_t n_tok = 0;
    for (int32_t t = 32; t <= 2048 && t <= g.max_context; t *= 2)
        n_tok++;
    assert_int_equal(g.st.n_prefill_buckets, n_tok * 4);
    printf("graphs capture time: %.3f s for %d graphs ((%d decode + %d prefill buckets) x %d "
           "slots) (%s)\n", g.st.capture_s, (int)g.st.n_captured,
           (int)(g.st.n_buckets - g.st.n_prefill_buckets), (int)g.st.n_prefill_buckets,
           (int)g.st.n_slots, g_device);
    if (!g_dry)
        assert_true(g.st.capture_s < 5.0);
    rec_free(&g);
    rec_free(&p);
}

/* Prefill over token buckets: ragged waves on (32, 4), (256, 4); one above the largest kept
 * token bucket; a joiner's prefill between decode replays. */
static void test_prefill_buckets(void **state) {
    (void)state;
    static const int32_t plen[5 * 3] = {
        20, 5, 6,      /* 25 tokens, 2 rows (the third joins later): (32, 4), a 6-token tail */
        100, 27, 1,    /* 128: (128, 4) has no room for the padding row: (256, 4) */
        150, 90, 50,   /* 290: above the largest kept token bucket 256 (max_tokens 300): eager */
        64, 64, 64,    /* 192: (256, 4) */
        2, 3, 4,       /* 9: (32, 4), a 22-token tail */
    };
    /* wave 0's third request (3 tokens) joins after two steps: its prefill runs on (32, 2)
       between decode replays */
    scen sc = {"prefill", 8, 3, 5, 4, 2, 2, false, 300, plen};
    rec g, p;
    compare_bitwise(&sc, &g, &p);
    assert_int_equal(g.st.n_prefill_buckets, 4 * 4); /* 32, 64, 128, 256 of [32 .. 2048] kept */
    assert_int_equal(g.st.n_prefill_replays, 5); /* waves 0 (two prefills), 1, 3, 4 */
    assert_true(g.st.n_eager >= 1);            /* wave 2 */
    assert_true(g.st.n_padding_tokens > 0);
    assert_int_equal(g.st.last_token_bucket, 32);
    /* against the unpadded eager path (other GEMM row counts: close, not bitwise): the decode
       step after wave 0's padded prefill reads the KV that prefill's graph wrote */
    rec off;
    run_scen(&sc, MS_GRAPHS_OFF, &off);
    assert_int_equal(off.st.mode, MS_GRAPHS_OFF);
    double worst = 0.0;
    for (size_t i = 0; i < (size_t)sc.n_req * (size_t)g.vocab; i++)
        worst = fmax(worst, fabs((double)g.first_decode[i] - (double)off.first_decode[i]));
    size_t same = 0, n = MS_MIN(g.n_ids, off.n_ids);
    for (size_t i = 0; i < n; i++)
        same += g.ids[i] == off.ids[i];
    printf("graphs %-10s %s: against --no-graphs: decode after the padded prefill max |dlogit| "
           "%.3g, %zu of %zu ids equal\n", sc.name, g_device, worst, same, n);
    assert_true(worst <= 5e-2);
    rec_free(&g);
    rec_free(&p);
    rec_free(&off);
}

int main(void) {
    const char *dry = getenv("MS_GRAPHS_DRY_RUN");
    g_dry = (dry != NULL && strcmp(dry, "0") != 0) || !ms_backend_cuda_available();
    g_device = g_dry ? "cpu" : "cuda";
    if (g_dry)
        printf("graphs: dry run on the CPU backend (MS_GRAPHS_PADDED stands in for the graphs)\n");
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_on_and_between_buckets),
        ms_unit_test(test_above_largest_bucket),
        ms_unit_test(test_1000_padded_replays),
        ms_unit_test(test_preplan_refusal),
        ms_unit_test(test_capture_every_bucket),
        ms_unit_test(test_prefill_buckets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
