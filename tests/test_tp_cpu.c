/*
 * test_tp_cpu.c - tensor parallelism on the CPU backend (engine/tp.h): N ranks as threads over
 * the in-process collective group, each holding q_heads / N and kv_heads / N heads, its slice
 * of gate/up and down, and ceil(V / N) rows of the output head.
 *
 *   - hf/llama_gqa (8 q / 2 kv heads, untied head): two prompts batched, 32 greedy ids each with
 *     TP=2 equal TP=1 and the Hugging Face reference (reference.safetensors pK.greedy_ids), every
 *     step's logits within 2e-2 relative of TP=1 (the error is printed: f32 on the CPU gives
 *     ~1e-6) and of the reference; per-rank weight bytes about half of TP=1's.
 *   - hf/llama31_rope (4 q / 4 kv heads, tied head: vocabulary rows are views of the replicated
 *     embedding): TP=4 as above; --tp 3 refused with one line naming the numbers.
 *   - hf/qwen3 (4 q / 2 kv heads, q_norm / k_norm, tied head): TP=2 as above.
 *   - an allocation mismatch on one rank (hf/llama31_rope, rank 2 (then rank 0) of 4 given a
 *     larger KV arena, through the group API) is caught by the warm-up check, naming the rank;
 *     nothing leaks (ASan) and no rank hangs.
 *   - KV pressure (a 20-page arena): offload / reload through a host tier, and
 *     recompute-preemption without one, alike on every rank; ids equal TP=1 under it.
 *   - the group alone (fake ranks): a rank failing while the others sit in an all-gather gives
 *     the failing rank's error (named) on rank 0, nobody hangs, later calls fail at once.
 */
#include "ms_test.h"
#include "ms_test_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "fixture_ref.h"
#include "safetensors.h"
#include "tp.h"

extern const ms_model_desc ms_llama_desc;
extern const ms_model_desc ms_qwen3_desc;

#define N_NEW 32
#define N_PROMPTS 2
#define REL_TOL 2e-2

typedef struct run_out {
    int32_t ids[N_PROMPTS][N_NEW];
    float *logits[N_PROMPTS]; /* [N_NEW * V] the row each id was sampled from */
    int32_t vocab;
    size_t weight_bytes[8];   /* per rank */
    ms_engine_kv_stats kv;    /* rank 0's at the end */
} run_out;

static void run_free(run_out *r) {
    for (int i = 0; i < N_PROMPTS; i++)
        free(r->logits[i]);
}

static ms_st_file *open_ref(const char *fixture) {
    char path[1024];
    snprintf(path, sizeof path, "%s/reference.safetensors", ms_test_fixture(fixture));
    ms_st_file *f = NULL;
    ms_error err = {0};
    if (ms_st_file_init(&f, path, &err) != MS_OK)
        fail_msg("%s", err.msg);
    return f;
}

/* KV pressure for run_model (test_pressure_tp2): a small arena, a host tier. */
static int32_t g_kv_pages, g_host_pages, g_page_size;

static ms_engine_options options(const char *fixture, int32_t tp) {
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture(fixture);
    o.max_seqs = 2;
    o.max_tokens = 128;
    o.n_threads = 1;
    o.tp = tp;
    o.kv_pages = g_kv_pages;
    o.host_kv_pages = g_host_pages;
    o.page_size = g_page_size;
    return o;
}

/* Sampling of run_model's requests (greedy unless a test sets it). */
static ms_sampling_params g_sampling;
static bool g_sampled;

/* Prompts p0 and p1 of the fixture added together; N_NEW ids each (greedy, or g_sampling with
 * seed 11 + prompt). */
static void run_model(const ms_model_desc *d, const char *fixture, int32_t tp, run_out *out) {
    memset(out, 0, sizeof *out);
    ms_st_file *ref = open_ref(fixture);
    ms_engine_options o = options(fixture, tp);
    ms_engine *e = NULL;
    ms_error err = {0};
    if (ms_engine_init(&e, d, &o, &err) != MS_OK)
        fail_msg("init (tp %d): %s", tp, err.msg);
    assert_int_equal(ms_engine_tp_world(e), tp > 1 ? tp : 1);
    const int32_t V = ms_engine_facts(e)->vocab;
    out->vocab = V;
    for (int32_t r = 0; r < (tp > 1 ? tp : 1); r++) {
        const ms_engine *er = ms_engine_tp_rank(e, r);
        assert_non_null(er);
        out->weight_bytes[r] = ms_engine_weight_bytes(er);
    }
    assert_null(ms_engine_tp_rank(e, tp > 1 ? tp : 1));
    const int32_t free0 = ms_engine_kv_pages_free(e);
    ms_rid rids[N_PROMPTS];
    int32_t seen[N_PROMPTS] = {0};
    int32_t *prompts[N_PROMPTS];
    for (int i = 0; i < N_PROMPTS; i++) {
        char name[64];
        size_t np;
        snprintf(name, sizeof name, "p%d.input_ids", i);
        prompts[i] = ms_test_ref_tensor(ref, name, true, &np);
        out->logits[i] = calloc((size_t)N_NEW * (size_t)V, sizeof(float));
        assert_non_null(out->logits[i]);
        ms_engine_request rq = {.prompt = prompts[i], .n_prompt = (int32_t)np,
                                .max_new_tokens = N_NEW, .sampling = ms_sampling_greedy(),
                                .ignore_eos = true};
        if (g_sampled) {
            rq.sampling = g_sampling;
            rq.sampling.seed = 11 + (uint64_t)i;
        }
        if (ms_engine_add(e, &rq, &rids[i], &err) != MS_OK)
            fail_msg("add: %s", err.msg);
    }
    while (ms_engine_n_active(e) > 0) {
        if (ms_engine_step(e, NULL, &err) != MS_OK)
            fail_msg("step (tp %d): %s", tp, err.msg);
        for (int i = 0; i < N_PROMPTS; i++) {
            const int32_t *ids;
            int32_t n;
            ms_finish_reason why;
            assert_int_equal(ms_engine_output(e, rids[i], &ids, &n, &why), MS_OK);
            if (n > seen[i]) {
                assert_int_equal(n, seen[i] + 1);
                const float *z = ms_engine_last_logits(e, rids[i]);
                assert_non_null(z);
                memcpy(out->logits[i] + (size_t)seen[i] * (size_t)V, z, (size_t)V * sizeof(float));
                out->ids[i][seen[i]] = ids[n - 1];
                seen[i] = n;
            }
        }
    }
    for (int i = 0; i < N_PROMPTS; i++) {
        assert_int_equal(seen[i], N_NEW);
        ms_engine_remove(e, rids[i]);
        ms_free(prompts[i]);
    }
    assert_int_equal(ms_engine_kv_pages_free(e), free0);
    ms_engine_get_kv_stats(e, &out->kv);
    ms_engine_free(e);
    ms_st_file_free(ref);
}

/* max |a - b| over max |b| (the row scale of the logits). */
static double rel_err(const float *a, const float *b, size_t n) {
    double m = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m))
            m = d;
        if (fabs((double)b[i]) > s)
            s = fabs((double)b[i]);
    }
    return s > 0 ? m / s : m;
}

/* TP=tp against TP=1 and against the reference of the fixture. */
static void check_tp(const ms_model_desc *d, const char *fixture, int32_t tp) {
    run_out one, par;
    run_model(d, fixture, 1, &one);
    run_model(d, fixture, tp, &par);
    const size_t V = (size_t)one.vocab;
    ms_st_file *ref = open_ref(fixture);
    double worst = 0, worst_ref = 0;
    for (int i = 0; i < N_PROMPTS; i++) {
        char name[64];
        size_t n, nd, np;
        snprintf(name, sizeof name, "p%d.greedy_ids", i);
        int32_t *want = ms_test_ref_tensor(ref, name, true, &n); /* llama31_rope: 30 */
        assert_true(n >= 16);
        snprintf(name, sizeof name, "p%d.prefill_logits", i);
        float *pre = ms_test_ref_tensor(ref, name, false, &np);
        snprintf(name, sizeof name, "p%d.decode_logits", i);
        float *dec = ms_test_ref_tensor(ref, name, false, &nd);
        for (int j = 0; j < N_NEW; j++) {
            const bool has_ref = (size_t)j < n;
            if (par.ids[i][j] != one.ids[i][j] || (has_ref && par.ids[i][j] != want[j]))
                fail_msg("%s prompt %d id %d: tp %d gives %d, tp 1 %d, reference %d", fixture, i,
                         j, tp, par.ids[i][j], one.ids[i][j], has_ref ? want[j] : -1);
            const float *row = par.logits[i] + (size_t)j * V;
            double e1 = rel_err(row, one.logits[i] + (size_t)j * V, V);
            worst = e1 > worst ? e1 : worst;
            if (!has_ref)
                continue;
            /* the reference: id 0 from the last prefill row, id j from decode step j */
            const float *rr = j == 0 ? pre + np - V : dec + (size_t)(j - 1) * V;
            double er = rel_err(row, rr, V);
            worst_ref = er > worst_ref ? er : worst_ref;
        }
        ms_free(want);
        ms_free(pre);
        ms_free(dec);
    }
    print_message("%s tp %d: %d ids x %d prompts equal tp 1 (and the reference's); logits max rel "
                  "error %.3g against tp 1, %.3g against the reference; weight bytes per rank "
                  "%zu (tp 1: %zu)\n",
                  fixture, tp, N_NEW, N_PROMPTS, worst, worst_ref, par.weight_bytes[0],
                  one.weight_bytes[0]);
    assert_true(worst < REL_TOL);
    assert_true(worst_ref < REL_TOL);
    /* every rank holds its part: about 1/tp of the split weights plus the replicated ones */
    for (int32_t r = 0; r < tp; r++) {
        assert_true(par.weight_bytes[r] > 0);
        assert_true((double)par.weight_bytes[r] < 0.75 * (double)one.weight_bytes[0]);
    }
    ms_st_file_free(ref);
    run_free(&one);
    run_free(&par);
}

static void test_llama_gqa_tp2(void **state) {
    (void)state;
    check_tp(&ms_llama_desc, "hf/llama_gqa", 2);
}

static void test_llama31_tp4(void **state) {
    (void)state;
    check_tp(&ms_llama_desc, "hf/llama31_rope", 4);
}

static void test_qwen3_tp2(void **state) {
    (void)state;
    check_tp(&ms_qwen3_desc, "hf/qwen3", 2);
}

/* Temperature 0.9, top-p 0.95, a seed per request: TP=2 samples the ids TP=1 samples (rank 0
 * samples for the group; the logits agree to ~1e-7, far from any draw's boundary here). */
static void test_sampled_tp2(void **state) {
    (void)state;
    g_sampled = true;
    g_sampling = (ms_sampling_params){.temperature = 0.9f, .top_k = 0, .top_p = 0.95f};
    run_out one, par;
    run_model(&ms_llama_desc, "hf/llama_gqa", 1, &one);
    run_model(&ms_llama_desc, "hf/llama_gqa", 2, &par);
    g_sampled = false;
    int32_t differ_from_greedy = 0;
    run_out greedy;
    run_model(&ms_llama_desc, "hf/llama_gqa", 1, &greedy);
    for (int i = 0; i < N_PROMPTS; i++)
        for (int j = 0; j < N_NEW; j++) {
            if (par.ids[i][j] != one.ids[i][j])
                fail_msg("sampled prompt %d id %d: tp 2 gives %d, tp 1 %d", i, j, par.ids[i][j],
                         one.ids[i][j]);
            differ_from_greedy += par.ids[i][j] != greedy.ids[i][j];
        }
    print_message("sampled tp 2 = tp 1 (%d of %d ids differ from greedy)\n", differ_from_greedy,
                  N_PROMPTS * N_NEW);
    assert_true(differ_from_greedy > 0); /* the sampling was really on */
    run_free(&one);
    run_free(&par);
    run_free(&greedy);
}

/* An arena too small for both requests (page size 4, 20 pages; they need 18 + 10): offload to
 * a host tier and reload, or recompute-preemption without one, decided alike on every rank (the
 * KV check runs after every step); ids equal TP=1 under the same pressure. */
static void test_pressure_tp2(void **state) {
    (void)state;
    g_page_size = 4;
    g_kv_pages = 20;
    for (int k = 0; k < 2; k++) {
        g_host_pages = k == 0 ? 16 : 0;
        run_out one, par;
        run_model(&ms_llama_desc, "hf/llama_gqa", 1, &one);
        run_model(&ms_llama_desc, "hf/llama_gqa", 2, &par);
        for (int i = 0; i < N_PROMPTS; i++)
            for (int j = 0; j < N_NEW; j++)
                if (par.ids[i][j] != one.ids[i][j])
                    fail_msg("pressure (host %d) prompt %d id %d: tp 2 gives %d, tp 1 %d",
                             g_host_pages, i, j, par.ids[i][j], one.ids[i][j]);
        print_message("pressure, host tier %d pages: tp 2 = tp 1; rank 0 offloads %lld, reloads "
                      "%lld, preemptions %lld\n",
                      g_host_pages, (long long)par.kv.offloads, (long long)par.kv.reloads,
                      (long long)par.kv.preemptions);
        assert_true(par.kv.offloads + par.kv.preemptions > 0); /* the pressure was real */
        assert_int_equal(par.kv.offloads, one.kv.offloads);
        assert_int_equal(par.kv.preemptions, one.kv.preemptions);
        run_free(&one);
        run_free(&par);
    }
    g_page_size = g_kv_pages = g_host_pages = 0;
}

static void expect_refused(const char *fixture, int32_t tp, const char *want1,
                           const char *want2) {
    ms_engine_options o = options(fixture, tp);
    ms_engine *e = NULL;
    ms_error err = {0};
    assert_int_not_equal(ms_engine_init(&e, &ms_llama_desc, &o, &err), MS_OK);
    assert_null(e);
    print_message("tp %d on %s: %s\n", tp, fixture, err.msg);
    assert_non_null(strstr(err.msg, want1));
    assert_non_null(strstr(err.msg, want2));
    assert_null(strchr(err.msg, '\n'));
}

static void test_refused(void **state) {
    (void)state;
    /* 4 q / 4 kv heads over 3 ranks; 8 q / 2 kv heads over 4 ranks */
    expect_refused("hf/llama31_rope", 3, "--tp 3",
                   "num_attention_heads (4), num_key_value_heads (4)");
    expect_refused("hf/llama_gqa", 4, "--tp 4", "num_key_value_heads (2)");
    expect_refused("hf/llama_gqa", 65, "tp 65", "0..64");
    expect_refused("hf/llama_gqa", -1, "tp -1", "0..64");
}

/* ---- an allocation mismatch on one rank ---- */

typedef struct mismatch_arg {
    int32_t odd_rank;
    char model[1024]; /* resolved on the test's thread (ms_test_fixture's buffer is shared) */
} mismatch_arg;

static ms_status make_rank(const ms_tp_member *m, void *arg, void **engine, ms_error *err) {
    const mismatch_arg *a = arg;
    ms_engine_options o = ms_engine_options_default();
    o.model_path = a->model; /* hf/llama31_rope: 4 kv heads */
    o.max_seqs = 2;
    o.max_tokens = 128;
    o.n_threads = 1;
    o.kv_pages = m->rank == a->odd_rank ? 33 : 32; /* the deliberate difference */
    o.tp_member = m;
    ms_engine *e = NULL;
    ms_status st = ms_engine_init(&e, &ms_llama_desc, &o, err);
    *engine = e;
    return st;
}

static void free_rank(void *engine) { ms_engine_free(engine); }

static void test_mismatch_caught(void **state) {
    (void)state;
    for (int32_t odd = 0; odd < 4; odd += 2) {
        mismatch_arg a = {.odd_rank = odd};
        snprintf(a.model, sizeof a.model, "%s", ms_test_fixture("hf/llama31_rope"));
        void *leader = NULL;
        ms_tp_group *g = NULL;
        ms_error err = {0};
        ms_status st = ms_tp_group_start(4, "cpu", make_rank, free_rank, &a, &leader, &g, &err);
        print_message("rank %d's arena larger: %s\n", odd, err.msg);
        assert_int_equal(st, MS_ERR_STATE);
        assert_null(leader);
        assert_null(g);
        assert_non_null(strstr(err.msg, "after warm-up"));
        char want[64];
        /* rank 0 against the odd one (rank 0 itself odd: every other rank differs, rank 1 first) */
        snprintf(want, sizeof want, "rank %d has", odd == 0 ? 1 : odd);
        assert_non_null(strstr(err.msg, want));
    }
    /* the same ranks alike start, and the group's engines are per rank */
    mismatch_arg none = {.odd_rank = -1};
    snprintf(none.model, sizeof none.model, "%s", ms_test_fixture("hf/llama31_rope"));
    void *leader = NULL;
    ms_tp_group *g = NULL;
    ms_error err = {0};
    if (ms_tp_group_start(4, "cpu", make_rank, free_rank, &none, &leader, &g, &err) != MS_OK)
        fail_msg("%s", err.msg);
    assert_int_equal(ms_tp_group_world(g), 4);
    for (int32_t r = 1; r < 4; r++)
        assert_non_null(ms_tp_group_engine(g, r));
    assert_null(ms_tp_group_engine(g, 0));
    ms_tp_group_free(g);
    ms_engine_free(leader);
    /* bad arguments */
    assert_int_equal(ms_tp_group_start(1, "cpu", make_rank, free_rank, &none, &leader, &g, &err),
                     MS_ERR_INVALID_ARG);
    assert_int_equal(ms_tp_group_start(2, "tpu", make_rank, free_rank, &none, &leader, &g, &err),
                     MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "tpu"));
}

/* ---- the group itself: a rank failing mid-call ---- */

typedef struct fake_rank {
    const ms_tp_member *m;
} fake_rank;

static ms_status fake_make(const ms_tp_member *m, void *arg, void **engine, ms_error *err) {
    (void)arg;
    fake_rank *f = ms_calloc(1, sizeof *f);
    if (f == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "fake rank");
    f->m = m;
    *engine = f;
    return MS_OK;
}

static void fake_free(void *engine) { ms_free(engine); }

/* Every rank all-gathers its rank number, except *arg, which fails first. */
static ms_status gather_or_fail(void *engine, int32_t rank, void *arg, ms_error *err) {
    const fake_rank *f = engine;
    if (rank == *(const int32_t *)arg)
        return MS_FAIL(err, MS_ERR_IO, "rank %d lost its disk", (int)rank);
    int32_t mine = rank * 10, all[4] = {0};
    MS_TRY(ms_collective_all_gather(&f->m->coll, &mine, sizeof mine, all, err));
    for (int32_t r = 0; r < 4; r++)
        if (all[r] != r * 10)
            return MS_FAIL(err, MS_ERR_STATE, "rank %d saw %d from rank %d", (int)rank,
                           (int)all[r], (int)r);
    return MS_OK;
}

static void test_group_failure(void **state) {
    (void)state;
    for (int32_t bad = 0; bad < 4; bad += 2) {
        void *leader = NULL;
        ms_tp_group *g = NULL;
        ms_error err = {0};
        assert_int_equal(ms_tp_group_start(4, "cpu", fake_make, fake_free, NULL, &leader, &g,
                                           &err), MS_OK);
        int32_t none = -1;
        assert_int_equal(ms_tp_group_run(g, leader, gather_or_fail, gather_or_fail, &none, &err),
                         MS_OK);
        /* the failing rank's error, not the aborted collectives of the others; nobody hangs */
        assert_int_equal(ms_tp_group_run(g, leader, gather_or_fail, gather_or_fail, &bad, &err),
                         MS_ERR_IO);
        print_message("rank %d failing: %s\n", bad, err.msg);
        char want[64];
        snprintf(want, sizeof want, "rank %d lost its disk", bad);
        assert_non_null(strstr(err.msg, want));
        if (bad > 0)
            assert_non_null(strstr(err.msg, "tensor parallel rank 2: "));
        /* later calls fail at once */
        assert_int_equal(ms_tp_group_run(g, leader, gather_or_fail, gather_or_fail, &none, &err),
                         MS_ERR_STATE);
        assert_non_null(strstr(err.msg, "failed earlier"));
        ms_tp_group_free(g);
        fake_free(leader);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_llama_gqa_tp2),
        ms_unit_test(test_llama31_tp4),
        ms_unit_test(test_qwen3_tp2),
        ms_unit_test(test_sampled_tp2),
        ms_unit_test(test_pressure_tp2),
        ms_unit_test(test_refused),
        ms_unit_test(test_mismatch_caught),
        ms_unit_test(test_group_failure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
