/*
 * test_graph_exec.c - the host side of the captured path (runtime/engine/graph_exec.h) on the
 * CPU backend, where MS_GRAPHS_PADDED takes the leases, padding, staging and checks of a replay
 * and runs the forward eagerly:
 *   - bucket choice from a node's capture declarations (dropped above max_seqs, prefill-by-token
 *     and multi-segment steps refused), dummy pages;
 *   - over a fake step: warm-ups then captures largest first, a failed capture leaves its bucket
 *     out (the next bucket up is leased), a failed warm-up captures nothing, padding to the
 *     bucket with dummy rows after the real ones, eager above the largest bucket and for rows
 *     that are not one-token decode rows, refusals (dummy ids as real rows, too little room);
 *   - the padding check: a padding write address on a real row's page is refused, the sink page
 *     and the dummy rows' own pages are not;
 *   - models/llama.mstar on hf/llama_gqa: padded decode (batches between buckets padded to the
 *     next bucket, requests finishing mid-batch so the bucket switches 4 -> 2 -> 1) gives exactly
 *     the ids and the bitwise logits of the unpadded eager run (the CPU backend computes each
 *     row alone), allocates nothing per step, returns every page;
 *   - the static write addresses of the lease's slot: past the bucket's tokens all sink;
 *   - a batch above the largest kept bucket runs eager (counted) with the same outputs;
 *   - models/qwen2vl.mstar (M-RoPE, three position streams) padded == eager, bitwise;
 *   - `--no-graphs` accepted by generate and bench, a misspelling refused.
 */
#include "ms_test.h"
#include "ms_test_impl.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "engine.h"
#include "graph_exec.h"
#include "sample_res.h"

extern const ms_model_desc ms_llama_desc;
extern const ms_model_desc ms_qwen2vl_desc;

#define VOCAB 512

/* ---- buckets from declarations ---- */

static void test_buckets(void **state) {
    (void)state;
    static ms_md_node node;
    static ms_md_step steps[3];
    memset(&node, 0, sizeof node);
    node.n_steps = 3;
    node.steps = steps;
    steps[0] = (ms_md_step){.name = "prefill", .n_segments = 1, .capture_by_tokens = true,
                                 .buckets = {32, 64}, .n_buckets = 2};
    steps[1] = (ms_md_step){.name = "decode", .n_segments = 1,
                                 .buckets = {1, 2, 4, 8, 16}, .n_buckets = 5};
    steps[2] = (ms_md_step){.name = "guided", .n_segments = 2, .labels = {0, 1},
                                 .buckets = {1, 2}, .n_buckets = 2};
    int32_t b[MS_MD_MAX_BUCKETS];
    assert_false(ms_graph_exec_step_capturable(&node, 0)); /* tokens: not yet */
    assert_true(ms_graph_exec_step_capturable(&node, 1));
    assert_false(ms_graph_exec_step_capturable(&node, 2)); /* two segments per row */
    assert_false(ms_graph_exec_step_capturable(&node, 3));
    assert_int_equal(ms_graph_exec_buckets(&node, 0, 12, b, MS_MD_MAX_BUCKETS), 0);
    assert_int_equal(ms_graph_exec_buckets(&node, 1, 12, b, MS_MD_MAX_BUCKETS), 4);
    assert_int_equal(b[0], 1);
    assert_int_equal(b[3], 8); /* 16 > max_seqs 12: it could never be filled */
    assert_int_equal(ms_graph_exec_buckets(&node, 1, 100, b, MS_MD_MAX_BUCKETS), 5);
    assert_int_equal(ms_graph_exec_dummy_pages(&node, 12, false), 8);
    assert_int_equal(ms_graph_exec_dummy_pages(&node, 1, false), 1);
    assert_int_equal(ms_graph_exec_dummy_pages(&node, 12, true), 16); /* two slots */
    steps[1].all_logits = true;
    assert_int_equal(ms_graph_exec_dummy_pages(&node, 12, true), 0);
    assert_string_equal(ms_graph_mode_str(MS_GRAPHS_PADDED), "padded");
}

/* ---- bucket choice, padding and fallbacks over a fake run (no forward) ---- */

typedef struct fake_run {
    int32_t fail_capture_bs; /* a capture of this bucket fails (0: none) */
    int32_t fail_warmup_bs;  /* a warm-up of this bucket fails (0: none) */
    int32_t n_warm, n_capture;
    int32_t order[16];       /* bucket rows in run order */
} fake_run;

static ms_status fake_step(void *user, const ms_graph_step *gs, ms_md_row *rows, ms_rid *rids,
                           ms_error *err) {
    fake_run *f = user;
    for (int32_t i = 0; i < gs->n_rows; i++) { /* all dummy rows of slot 0, one token each */
        assert_true(rids[i] >= MS_RID_DUMMY_BASE);
        assert_int_equal(rows[i].rid, rids[i]);
        assert_int_equal(rows[i].len[0], 1);
        assert_false(rows[i].sample);
    }
    if (f->n_warm + f->n_capture < 16)
        f->order[f->n_warm + f->n_capture] = gs->n_rows;
    if (!gs->capture) {
        f->n_warm++;
        if (gs->n_rows == f->fail_warmup_bs)
            return MS_FAIL(err, MS_ERR_INTERNAL, "warm-up failed on purpose");
        return MS_OK;
    }
    f->n_capture++;
    assert_true(gs->leased);
    assert_int_equal(gs->lease.bs, gs->n_rows);
    if (gs->n_rows == f->fail_capture_bs)
        return MS_FAIL(err, MS_ERR_INTERNAL, "capture failed on purpose");
    return MS_OK;
}

static void test_pad_and_fallbacks(void **state) {
    (void)state;
    static ms_md_node node;
    static ms_md_step steps[2];
    memset(&node, 0, sizeof node);
    node.n_steps = 2;
    node.steps = steps;
    steps[0] = (ms_md_step){.name = "prefill", .n_segments = 1, .capture_by_tokens = true,
                            .buckets = {32}, .n_buckets = 1};
    steps[1] = (ms_md_step){.name = "decode", .n_segments = 1, .buckets = {1, 2, 4, 8, 16},
                            .n_buckets = 5};
    for (int variant = 0; variant < 2; variant++) {
        ms_backend be;
        ms_error err = {0};
        assert_int_equal(ms_backend_cpu_init(&be, NULL, &err), MS_OK);
        ms_sample_res *sr = NULL;
        assert_int_equal(ms_sample_res_init(&sr, 16, &err), MS_OK);
        ms_resource_spec spec = {.key = "sampler", .kind = MS_RESOURCE_SAMPLER, .instance = sr,
                                 .iface = ms_sample_res_iface()};
        ms_step_runner *runner = NULL;
        assert_int_equal(ms_step_runner_init(&runner, &spec, 1, &err), MS_OK);
        ms_graph_exec_config gc = {.mode = MS_GRAPHS_PADDED, .node = &node, .be = &be,
                                   .runner = runner, .max_rows = 12, .n_pages = 64,
                                   .kv_resource = 0};
        ms_graph_exec *gx = NULL;
        assert_int_equal(ms_graph_exec_init(&gx, &gc, &err), MS_OK);
        assert_non_null(gx);
        ms_md_row rows[12];
        ms_rid rids[12];
        fake_run f = {.fail_capture_bs = variant == 0 ? 4 : 0,
                      .fail_warmup_bs = variant == 1 ? 2 : 0};
        assert_int_equal(ms_graph_exec_capture(gx, fake_step, &f, rows, rids, 12, &err), MS_OK);
        ms_graph_exec_stats st;
        ms_graph_exec_get_stats(gx, &st);
        assert_int_equal(st.n_buckets, 4); /* 16 > max_rows 12 */
        if (variant == 0) {
            /* warm-ups largest first, then captures largest first */
            int32_t want[8] = {8, 4, 2, 1, 8, 4, 2, 1};
            assert_memory_equal(f.order, want, sizeof want);
            assert_int_equal(st.n_captured, 3);
            assert_int_equal(st.n_failed, 1);
            assert_non_null(strstr(st.first_failure, "decode bucket 4: capture failed"));
        } else {
            assert_int_equal(f.n_capture, 0); /* the warm-up failed: nothing captured */
            assert_int_equal(st.n_captured, 0);
            assert_int_equal(st.n_failed, 4);
            assert_non_null(strstr(st.first_failure, "warm-up of decode bucket 2"));
        }
        /* 3 real rows: bucket 4 (its capture failed in variant 0: bucket 8 instead) */
        for (int32_t i = 0; i < 12; i++) {
            memset(&rows[i], 0, sizeof rows[i]);
            rows[i].rid = rids[i] = (ms_rid)(100 + i);
            rows[i].len[0] = 1;
            rows[i].sample = true;
        }
        ms_graph_step gs;
        assert_int_equal(ms_graph_exec_pad(gx, 1, rows, rids, 3, 12, &gs, &err), MS_OK);
        if (variant == 0) {
            assert_true(gs.padded && gs.leased && !gs.capture);
            assert_int_equal(gs.n_real, 3);
            assert_int_equal(gs.n_rows, 8);
            assert_int_equal(gs.lease.bs, 8);
            for (int32_t i = 0; i < 3; i++)
                assert_int_equal(rids[i], (ms_rid)(100 + i)); /* real rows first, unchanged */
            for (int32_t i = 3; i < 8; i++) {
                assert_true(ms_graph_exec_is_dummy(gx, rids[i]));
                assert_int_equal(rows[i].rid, rids[i]);
                assert_int_equal(rows[i].len[0], 1);
                assert_false(rows[i].sample);
            }
            assert_int_equal(rids[8], (ms_rid)108); /* past the bucket: untouched */
            ms_graph_exec_done(gx, &gs);
            /* 2 rows: bucket 2, on it: no padding rows, still the captured path */
            assert_int_equal(ms_graph_exec_pad(gx, 1, rows, rids, 2, 12, &gs, &err), MS_OK);
            assert_true(gs.padded);
            assert_int_equal(gs.n_rows, 2);
            ms_graph_exec_done(gx, &gs);
        } else {
            assert_false(gs.padded); /* nothing captured: eager */
            assert_int_equal(gs.n_rows, 3);
        }
        /* 9 rows: above the largest kept bucket: eager, unpadded, nothing written */
        for (int32_t i = 0; i < 12; i++)
            rows[i].rid = rids[i] = (ms_rid)(100 + i);
        assert_int_equal(ms_graph_exec_pad(gx, 1, rows, rids, 9, 12, &gs, &err), MS_OK);
        assert_false(gs.padded);
        assert_int_equal(gs.n_rows, 9);
        assert_int_equal(rids[9], (ms_rid)109);
        /* a row feeding two tokens (not a decode row): eager */
        rows[0].len[0] = 2;
        assert_int_equal(ms_graph_exec_pad(gx, 1, rows, rids, 1, 12, &gs, &err), MS_OK);
        assert_false(gs.padded);
        rows[0].len[0] = 1;
        /* the prefill step (token buckets) is not on the captured path */
        assert_int_equal(ms_graph_exec_pad(gx, 0, rows, rids, 1, 12, &gs, &err), MS_OK);
        assert_false(gs.padded);
        /* a real row with a dummy id is refused */
        if (variant == 0) {
            rows[0].rid = rids[0] = MS_RID_DUMMY_BASE + 1;
            assert_int_equal(ms_graph_exec_pad(gx, 1, rows, rids, 1, 12, &gs, &err),
                             MS_ERR_INVALID_ARG);
            rows[0].rid = rids[0] = 100;
            /* too little room for the bucket's rows */
            assert_int_equal(ms_graph_exec_pad(gx, 1, rows, rids, 3, 5, &gs, &err),
                             MS_ERR_INVALID_ARG);
        }
        ms_graph_exec_get_stats(gx, &st);
        assert_int_equal(st.n_eager, variant == 0 ? 2 : 3);
        ms_graph_exec_free(gx);
        ms_step_runner_free(runner);
        ms_sample_res_free(sr);
        ms_backend_free(&be);
    }
    /* AUTO on a backend without graph entries: no captured path at all */
    ms_backend be;
    ms_error err = {0};
    assert_int_equal(ms_backend_cpu_init(&be, NULL, &err), MS_OK);
    ms_sample_res *sr = NULL;
    assert_int_equal(ms_sample_res_init(&sr, 16, &err), MS_OK);
    ms_resource_spec spec = {.key = "sampler", .kind = MS_RESOURCE_SAMPLER, .instance = sr,
                             .iface = ms_sample_res_iface()};
    ms_step_runner *runner = NULL;
    assert_int_equal(ms_step_runner_init(&runner, &spec, 1, &err), MS_OK);
    ms_graph_exec_config gc = {.mode = MS_GRAPHS_AUTO, .node = &node, .be = &be,
                               .runner = runner, .max_rows = 12, .n_pages = 64};
    ms_graph_exec *gx = NULL;
    assert_int_equal(ms_graph_exec_init(&gx, &gc, &err), MS_OK);
    assert_null(gx);
    gc.mode = MS_GRAPHS_OFF; /* the engine makes none for OFF: asking is a caller bug */
    assert_int_equal(ms_graph_exec_init(&gx, &gc, &err), MS_ERR_INVALID_ARG);
    assert_null(gx);
    ms_graph_exec_free(NULL);
    ms_step_runner_free(runner);
    ms_sample_res_free(sr);
    ms_backend_free(&be);
}

/* ---- the padding check ---- */

static void test_check_padding(void **state) {
    (void)state;
    /* views 0, 1 real (pages 3, 4 and 5), view 2 padding (page 7); 3 tokens, capacity 5 */
    int32_t qo[] = {0, 1, 2, 3}, kvp[] = {0, 2, 3, 4}, idx[] = {3, 4, 5, 7};
    int32_t last[] = {1, 1, 1}, start[] = {0, 0, 0};
    int32_t t2p[] = {4, 5, 7, MS_SINK_PAGE, MS_SINK_PAGE}, t2s[] = {0, 0, 0, 0, 0};
    ms_kv_plan p = {.n_views = 3, .n_tokens = 3, .qo_indptr = qo, .kv_indptr = kvp,
                    .kv_indices = idx, .kv_last_page_len = last, .kv_start = start,
                    .token_to_page = t2p, .token_to_slot = t2s, .is_decode = true};
    uint8_t mark[2] = {0, 0};
    ms_error err = {0};
    assert_int_equal(ms_graph_exec_check_padding(&p, 2, 16, mark, &err), MS_OK);
    assert_int_equal(mark[0] | mark[1], 0); /* cleared again */
    t2p[2] = 4; /* the padding row writes a real row's page (vllm #43810) */
    assert_int_equal(ms_graph_exec_check_padding(&p, 2, 16, mark, &err), MS_ERR_STATE);
    assert_non_null(strstr(err.msg, "padding token 2 writes page 4"));
    assert_int_equal(mark[0] | mark[1], 0);
    t2p[2] = 7;
    idx[3] = 3; /* a padding view reading a real page: the pool gave it out twice */
    assert_int_equal(ms_graph_exec_check_padding(&p, 2, 16, mark, &err), MS_ERR_STATE);
    assert_non_null(strstr(err.msg, "padding view page 3"));
    idx[3] = 7;
    assert_int_equal(ms_graph_exec_check_padding(&p, 3, 16, mark, &err), MS_OK); /* no padding */
    assert_int_equal(ms_graph_exec_check_padding(&p, 4, 16, mark, &err), MS_ERR_INVALID_ARG);
    idx[0] = 40; /* outside the arena */
    assert_int_equal(ms_graph_exec_check_padding(&p, 2, 16, mark, &err), MS_ERR_STATE);
}

/* ---- the engine over models/llama.mstar ---- */

#define N_REQ 4
#define MAX_NEW_MAX 12
static const int32_t k_new[N_REQ] = {12, 6, 9, 3};

typedef struct run_rec {
    int32_t out[N_REQ][MAX_NEW_MAX];
    int32_t n_out[N_REQ];
    float *logits;      /* [steps][N_REQ][VOCAB], NAN where the request was not in the step */
    int32_t n_steps;
    int32_t n_seqs[64]; /* rows per step */
    int32_t n_tok[64];
} run_rec;

static ms_engine *open_llama_pp(ms_graph_mode mode, int32_t max_seqs, bool preplan) {
    ms_engine_options o = ms_engine_options_default();
    o.no_preplan = !preplan;
    o.model_path = ms_test_fixture("hf/llama_gqa");
    o.page_size = 4;
    o.max_seqs = max_seqs;
    o.max_tokens = 128;
    o.n_threads = 2;
    o.graphs = mode;
    ms_engine *e = NULL;
    ms_error err = {0};
    if (ms_engine_init(&e, &ms_llama_desc, &o, &err) != MS_OK)
        fail_msg("engine init: %s", err.msg);
    return e;
}

static ms_engine *open_llama(ms_graph_mode mode, int32_t max_seqs) {
    return open_llama_pp(mode, max_seqs, true);
}

static void prompt(int32_t r, int32_t *ids, int32_t *n) {
    *n = 3 + 2 * r;
    for (int32_t i = 0; i < *n; i++)
        ids[i] = (int32_t)((r * 97 + i * 31 + 7) % VOCAB);
}

/* Run the N_REQ requests (greedy for even r, seeded sampling for odd r) to the end. */
static void run_all(ms_engine *e, run_rec *rec) {
    memset(rec, 0, sizeof *rec);
    rec->logits = malloc(sizeof(float) * 64 * N_REQ * VOCAB);
    assert_non_null(rec->logits);
    ms_rid rids[N_REQ];
    ms_error err = {0};
    for (int32_t r = 0; r < N_REQ; r++) {
        int32_t ids[16], n;
        prompt(r, ids, &n);
        ms_sampling_params sp = ms_sampling_greedy();
        if (r % 2 == 1)
            sp = (ms_sampling_params){.temperature = 0.9f, .top_k = 0, .top_p = 0.95f,
                                      .seed = (uint64_t)(11 + r)};
        ms_engine_request rq = {.prompt = ids, .n_prompt = n, .max_new_tokens = k_new[r],
                                .sampling = sp, .ignore_eos = true};
        assert_int_equal(ms_engine_add(e, &rq, &rids[r], &err), MS_OK);
    }
    while (ms_engine_n_active(e) > 0) {
        assert_true(rec->n_steps < 64);
        ms_engine_step_info info;
        if (ms_engine_step(e, &info, &err) != MS_OK)
            fail_msg("step %d: %s", (int)rec->n_steps, err.msg);
        rec->n_seqs[rec->n_steps] = info.n_seqs;
        rec->n_tok[rec->n_steps] = info.n_tokens;
        for (int32_t r = 0; r < N_REQ; r++) {
            const float *lg = ms_engine_last_logits(e, rids[r]);
            float *dst = rec->logits + ((size_t)rec->n_steps * N_REQ + (size_t)r) * VOCAB;
            if (lg != NULL)
                memcpy(dst, lg, sizeof(float) * VOCAB);
            else
                for (int v = 0; v < VOCAB; v++)
                    dst[v] = -1.0f;
        }
        rec->n_steps++;
    }
    for (int32_t r = 0; r < N_REQ; r++) {
        const int32_t *out;
        int32_t n;
        assert_int_equal(ms_engine_output(e, rids[r], &out, &n, NULL), MS_OK);
        assert_int_equal(n, k_new[r]);
        memcpy(rec->out[r], out, (size_t)n * sizeof(int32_t));
        rec->n_out[r] = n;
        ms_engine_remove(e, rids[r]);
    }
}

static int32_t next_pow2(int32_t n) {
    int32_t b = 1;
    while (b < n)
        b *= 2;
    return b;
}

static void test_padded_equals_eager(void **state) {
    (void)state;
    run_rec eager, padded;
    ms_engine *e = open_llama(MS_GRAPHS_OFF, N_REQ);
    ms_graph_exec_stats st;
    ms_engine_graph_stats(e, &st);
    assert_int_equal(st.mode, MS_GRAPHS_OFF);
    run_all(e, &eager);
    ms_engine_free(e);

    /* AUTO on the CPU backend (no graph entries) is the eager path: no padding, no pages */
    e = open_llama(MS_GRAPHS_AUTO, N_REQ);
    ms_engine_graph_stats(e, &st);
    assert_int_equal(st.mode, MS_GRAPHS_OFF);
    ms_engine_free(e);

    e = open_llama(MS_GRAPHS_PADDED, N_REQ);
    ms_engine_graph_stats(e, &st);
    assert_int_equal(st.mode, MS_GRAPHS_PADDED);
    assert_int_equal(st.n_buckets, 3);  /* 1, 2, 4 of [1, 2, 4, 8 .. 256] fit max_seqs 4 */
    assert_int_equal(st.n_slots, 2);    /* the pre-plan's second slot */
    assert_int_equal(st.n_captured, 6); /* two slots each */
    assert_int_equal(st.n_failed, 0);
    const int32_t free0 = ms_engine_kv_pages_free(e);
    run_all(e, &padded);
    assert_int_equal(ms_engine_kv_pages_free(e), free0);

    /* the same steps, rows and ids; logits bitwise */
    assert_int_equal(padded.n_steps, eager.n_steps);
    assert_memory_equal(padded.n_seqs, eager.n_seqs, sizeof(int32_t) * (size_t)eager.n_steps);
    assert_memory_equal(padded.n_tok, eager.n_tok, sizeof(int32_t) * (size_t)eager.n_steps);
    for (int32_t r = 0; r < N_REQ; r++)
        assert_memory_equal(padded.out[r], eager.out[r], sizeof(int32_t) * (size_t)k_new[r]);
    assert_memory_equal(padded.logits, eager.logits,
                        sizeof(float) * (size_t)eager.n_steps * N_REQ * VOCAB);

    /* every decode step was padded to the next power of two: 4, 4, 3 -> 4, ..., 1 */
    ms_engine_graph_stats(e, &st);
    uint64_t want_pad = 0, want_steps = 0;
    bool saw[5] = {false};
    for (int32_t s = 1; s < eager.n_steps; s++) { /* step 0 is the prefill (eager) */
        want_pad += (uint64_t)(next_pow2(eager.n_seqs[s]) - eager.n_seqs[s]);
        want_steps++;
        saw[next_pow2(eager.n_seqs[s])] = true;
    }
    assert_true(saw[4] && saw[2] && saw[1]); /* the bucket switched mid-run */
    assert_true(want_pad > 0);
    assert_int_equal(st.n_replays, want_steps);
    assert_int_equal(st.n_padding_rows, want_pad);
    assert_int_equal(st.n_eager, 0);
    assert_int_equal(st.last_bucket, 1);
    /* a pre-plan after every decode step; taken when the next step has the same rows, refused
       when a request finished in between (the row count drops), the last one dropped when
       run_all removed the requests */
    uint64_t want_taken = 0, want_refused = 0;
    for (int32_t s = 2; s < eager.n_steps; s++) {
        want_taken += eager.n_seqs[s] == eager.n_seqs[s - 1];
        want_refused += eager.n_seqs[s] != eager.n_seqs[s - 1];
    }
    assert_true(want_taken > 0 && want_refused > 0);
    assert_int_equal(st.n_preplans, want_steps);
    assert_int_equal(st.n_preplan_taken, want_taken);
    assert_int_equal(st.n_preplan_refused, want_refused);
    assert_int_equal(st.n_preplan_dropped, 1);
    assert_int_equal(st.n_preplan_failed, 0);

    free(eager.logits);
    free(padded.logits);

    /* a second round: the same ids, and no allocation past the prefill (run_all's own buffer
       and the engine's per-request records are counted apart) */
    run_rec again;
    int64_t before = ms_alloc_get_stats().total_allocs;
    run_all(e, &again);
    int64_t per_round = ms_alloc_get_stats().total_allocs - before;
    before = ms_alloc_get_stats().total_allocs;
    run_rec third;
    run_all(e, &third);
    assert_int_equal(ms_alloc_get_stats().total_allocs - before, per_round); /* steady */
    for (int32_t r = 0; r < N_REQ; r++)
        assert_memory_equal(third.out[r], again.out[r], sizeof(int32_t) * (size_t)k_new[r]);
    free(again.logits);
    free(third.logits);
    ms_engine_free(e);
}

static void test_static_write_addresses(void **state) {
    (void)state;
    /* the graph plan's static state of the (KV resource, slot 0, main) after padded steps */
    ms_engine *e = open_llama(MS_GRAPHS_PADDED, N_REQ);
    run_rec rec;
    run_all(e, &rec);
    free(rec.logits);
    const ms_graph_plan *gp = ms_graph_exec_plan(ms_engine_graphs(e));
    assert_non_null(gp);
    const ms_graph_kv_state *ks = NULL;
    for (int i = 0; i < MS_MAX_RESOURCES && ks == NULL; i++)
        ks = ms_graph_plan_kv_state(gp, i, 0, MS_LABEL_MAIN);
    assert_non_null(ks);
    assert_int_equal(ks->capacity, 4);  /* the largest bucket's tokens */
    assert_int_equal(ks->n_tokens, 1);  /* the last step: one real row, bucket 1 */
    assert_true(ks->n_stagings > 0);
    for (int32_t t = ks->n_tokens; t < ks->capacity; t++) {
        assert_int_equal(ks->token_to_page[t], MS_SINK_PAGE);
        assert_int_equal(ks->token_to_slot[t], 0);
    }
    assert_true(ks->token_to_page[0] != MS_SINK_PAGE); /* the real row writes its own page */
    ms_engine_free(e);
    assert_null(ms_engine_graphs(NULL) != NULL ? (void *)1 : NULL);
}

/* Above the largest kept bucket (max_seqs 12 keeps 1, 2, 4, 8): 10 rows run eager. */
static void test_above_largest_bucket(void **state) {
    (void)state;
    enum { N = 10 };
    int32_t out_e[N][8], out_p[N][8];
    for (int pass = 0; pass < 2; pass++) {
        ms_engine *e = open_llama(pass == 0 ? MS_GRAPHS_OFF : MS_GRAPHS_PADDED, 12);
        ms_rid rids[N];
        ms_error err = {0};
        for (int32_t r = 0; r < N; r++) {
            int32_t ids[4] = {1 + r, 2 * r + 3, 5, 7};
            ms_engine_request rq = {.prompt = ids, .n_prompt = 4, .max_new_tokens = 3 + r % 5,
                                    .sampling = ms_sampling_greedy(), .ignore_eos = true};
            assert_int_equal(ms_engine_add(e, &rq, &rids[r], &err), MS_OK);
        }
        while (ms_engine_n_active(e) > 0)
            if (ms_engine_step(e, NULL, &err) != MS_OK)
                fail_msg("step: %s", err.msg);
        for (int32_t r = 0; r < N; r++) {
            const int32_t *o;
            int32_t n;
            assert_int_equal(ms_engine_output(e, rids[r], &o, &n, NULL), MS_OK);
            assert_int_equal(n, 3 + r % 5);
            memcpy(pass == 0 ? out_e[r] : out_p[r], o, (size_t)n * sizeof(int32_t));
            ms_engine_remove(e, rids[r]);
        }
        if (pass == 1) {
            ms_graph_exec_stats st;
            ms_engine_graph_stats(e, &st);
            assert_int_equal(st.n_buckets, 4);
            assert_true(st.n_eager >= 1);   /* 10 rows: no bucket (sglang PR #33900) */
            assert_true(st.n_replays >= 1); /* then 8, 6, 4, 2 rows: padded */
        }
        ms_engine_free(e);
    }
    for (int32_t r = 0; r < N; r++)
        assert_memory_equal(out_p[r], out_e[r], (size_t)(3 + r % 5) * sizeof(int32_t));
}

/* Requests A (10 new), B (3 new) and C, which joins after step `join_at`; per step, each
 * request's logits (-1 when it had none). */
#define PP_STEPS 32
typedef struct pp_rec {
    float logits[PP_STEPS][3][VOCAB];
    int32_t n_seqs[PP_STEPS];
    int32_t out[3][10];
    int32_t n_steps;
} pp_rec;

static void pp_run(ms_engine *e, int32_t join_at, pp_rec *rec) {
    static const int32_t news[3] = {10, 3, 5};
    ms_rid rids[3] = {0, 0, 0};
    ms_error err = {0};
    memset(rec, 0, sizeof *rec);
    for (int32_t r = 0; r < 3; r++) {
        if (r == 2 && join_at >= 0)
            break;
        int32_t ids[8], n;
        prompt(r, ids, &n);
        ms_engine_request rq = {.prompt = ids, .n_prompt = n, .max_new_tokens = news[r],
                                .sampling = ms_sampling_greedy(), .ignore_eos = true};
        assert_int_equal(ms_engine_add(e, &rq, &rids[r], &err), MS_OK);
    }
    while (ms_engine_n_active(e) > 0 || rids[2] == 0) {
        assert_true(rec->n_steps < PP_STEPS);
        if (rids[2] == 0 && rec->n_steps == join_at) { /* C joins between two decode steps */
            int32_t ids[8], n;
            prompt(2, ids, &n);
            ms_engine_request rq = {.prompt = ids, .n_prompt = n, .max_new_tokens = news[2],
                                    .sampling = ms_sampling_greedy(), .ignore_eos = true};
            assert_int_equal(ms_engine_add(e, &rq, &rids[2], &err), MS_OK);
        }
        ms_engine_step_info info;
        if (ms_engine_step(e, &info, &err) != MS_OK)
            fail_msg("step %d: %s", (int)rec->n_steps, err.msg);
        rec->n_seqs[rec->n_steps] = info.n_seqs;
        for (int32_t r = 0; r < 3; r++) {
            const float *lg = rids[r] != 0 ? ms_engine_last_logits(e, rids[r]) : NULL;
            for (int v = 0; v < VOCAB; v++)
                rec->logits[rec->n_steps][r][v] = lg != NULL ? lg[v] : -1.0f;
        }
        rec->n_steps++;
    }
    for (int32_t r = 0; r < 3; r++) {
        const int32_t *o;
        int32_t n;
        assert_int_equal(ms_engine_output(e, rids[r], &o, &n, NULL), MS_OK);
        assert_int_equal(n, news[r]);
        memcpy(rec->out[r], o, (size_t)n * sizeof(int32_t));
        ms_engine_remove(e, rids[r]);
    }
}

/* The pre-plan of step N+1 is refused when a request finishes (B) or joins (C) between steps,
 * taken otherwise, and the run is bitwise the run without pre-plans (one slot) and the eager
 * run. */
static void test_preplan_refused(void **state) {
    (void)state;
    static pp_rec rec[3];
    ms_graph_exec_stats st[3];
    for (int pass = 0; pass < 3; pass++) {
        /* 0 eager, 1 padded without the pre-plan, 2 padded with it */
        ms_engine *e = pass == 0 ? open_llama(MS_GRAPHS_OFF, 4)
                                 : open_llama_pp(MS_GRAPHS_PADDED, 4, pass == 2);
        const int32_t free0 = ms_engine_kv_pages_free(e);
        pp_run(e, 5, &rec[pass]);
        assert_int_equal(ms_engine_kv_pages_free(e), free0); /* nothing of a pre-plan left */
        ms_engine_graph_stats(e, &st[pass]);
        ms_engine_free(e);
    }
    for (int pass = 1; pass < 3; pass++) {
        assert_int_equal(rec[pass].n_steps, rec[0].n_steps);
        assert_memory_equal(rec[pass].n_seqs, rec[0].n_seqs, sizeof rec[0].n_seqs);
        assert_memory_equal(rec[pass].out, rec[0].out, sizeof rec[0].out);
        assert_memory_equal(rec[pass].logits, rec[0].logits, sizeof rec[0].logits);
    }
    /* steps: 0 prefill A B; 1-2 decode A B (B done after 3 ids: 1 prefill + 2 decode);
       3-4 decode A; C joins: 5 prefill C; 6.. decode A C */
    assert_int_equal(rec[0].n_seqs[2], 2);
    assert_int_equal(rec[0].n_seqs[3], 1);
    assert_int_equal(st[1].n_slots, 1);
    assert_int_equal(st[1].n_preplans, 0);
    assert_int_equal(st[2].n_slots, 2);
    assert_true(st[2].n_preplans > 0);
    /* pre-plans after the decode steps 1-4 and 6-10; refused at step 3 (B finished), step 5
       (a prefill: C joined) and step 10 (C finished at step 9); taken at 2, 4, 7, 8, 9; the one
       after step 10 dropped when A was removed (step 6 follows a prefill: none pending) */
    assert_int_equal(rec[0].n_steps, 11);
    assert_int_equal(st[2].n_preplans, 9);
    assert_int_equal(st[2].n_preplan_refused, 3);
    assert_int_equal(st[2].n_preplan_taken, 5);
    assert_int_equal(st[2].n_preplan_dropped, 1);
    assert_int_equal(st[2].n_preplan_taken + st[2].n_preplan_refused + st[2].n_preplan_dropped,
                     st[2].n_preplans);
    assert_int_equal(st[2].n_preplan_failed, 0);
    assert_int_equal(st[2].n_replays, st[1].n_replays); /* the same padded steps */

    /* a pre-plan is dropped, not kept, when something else touches the runner: run_step */
    ms_engine *e = open_llama(MS_GRAPHS_PADDED, 4);
    ms_error err = {0};
    int32_t ids[8], n;
    prompt(0, ids, &n);
    ms_engine_request rq = {.prompt = ids, .n_prompt = n, .max_new_tokens = 6,
                            .sampling = ms_sampling_greedy(), .ignore_eos = true};
    ms_rid rid;
    assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_OK);
    for (int i = 0; i < 3; i++)
        assert_int_equal(ms_engine_step(e, NULL, &err), MS_OK);
    assert_true(ms_graph_exec_preplan_pending(ms_engine_graphs(e)));
    const float *lg;
    int32_t rows;
    int32_t tok = 5;
    assert_int_equal(ms_engine_run_step(e, rid, "decode", &tok, 1, &lg, &rows, &err), MS_OK);
    assert_false(ms_graph_exec_preplan_pending(ms_engine_graphs(e)));
    ms_graph_exec_stats s2;
    ms_engine_graph_stats(e, &s2);
    assert_int_equal(s2.n_preplan_dropped, 1);
    while (ms_engine_n_active(e) > 0)
        assert_int_equal(ms_engine_step(e, NULL, &err), MS_OK);
    ms_engine_remove(e, rid);
    ms_engine_free(e);
}

static void test_bad_mode(void **state) {
    (void)state;
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture("hf/llama_gqa");
    o.graphs = (ms_graph_mode)7;
    ms_engine *e = NULL;
    ms_error err = {0};
    assert_int_equal(ms_engine_init(&e, &ms_llama_desc, &o, &err), MS_ERR_INVALID_ARG);
    assert_null(e);
    assert_non_null(strstr(err.msg, "graphs mode 7"));
}

/* M-RoPE (models/qwen2vl.mstar, three position streams): dummy rows get positions like real
 * decode rows; padded decode gives the eager ids and logits bitwise. */
static void test_mrope_padded(void **state) {
    (void)state;
    enum { N = 3, NEW = 6 };
    int32_t out[2][N][NEW];
    float *lg[2];
    size_t n_lg[2] = {0, 0};
    for (int pass = 0; pass < 2; pass++) {
        ms_engine_options o = ms_engine_options_default();
        o.model_path = ms_test_fixture("hf/qwen2vl_mrope");
        o.max_seqs = 4;
        o.max_tokens = 64;
        o.n_threads = 2;
        o.graphs = pass == 0 ? MS_GRAPHS_OFF : MS_GRAPHS_PADDED;
        ms_engine *e = NULL;
        ms_error err = {0};
        if (ms_engine_init(&e, &ms_qwen2vl_desc, &o, &err) != MS_OK)
            fail_msg("qwen2vl init: %s", err.msg);
        const int32_t V = ms_engine_facts(e)->vocab;
        lg[pass] = malloc(sizeof(float) * (size_t)V * N * (NEW + 1));
        assert_non_null(lg[pass]);
        ms_rid rids[N];
        for (int32_t r = 0; r < N; r++) {
            int32_t ids[5] = {1 + r, 7, 9 + r, 3, 2};
            ms_engine_request rq = {.prompt = ids, .n_prompt = 3 + r, .max_new_tokens = NEW - r,
                                    .sampling = ms_sampling_greedy(), .ignore_eos = true};
            assert_int_equal(ms_engine_add(e, &rq, &rids[r], &err), MS_OK);
        }
        while (ms_engine_n_active(e) > 0) {
            if (ms_engine_step(e, NULL, &err) != MS_OK)
                fail_msg("qwen2vl step: %s", err.msg);
            for (int32_t r = 0; r < N; r++) {
                const float *l = ms_engine_last_logits(e, rids[r]);
                if (l != NULL) {
                    memcpy(lg[pass] + n_lg[pass], l, sizeof(float) * (size_t)V);
                    n_lg[pass] += (size_t)V;
                }
            }
        }
        for (int32_t r = 0; r < N; r++) {
            const int32_t *ids;
            int32_t n;
            assert_int_equal(ms_engine_output(e, rids[r], &ids, &n, NULL), MS_OK);
            assert_int_equal(n, NEW - r);
            memcpy(out[pass][r], ids, (size_t)n * sizeof(int32_t));
            ms_engine_remove(e, rids[r]);
        }
        if (pass == 1) {
            ms_graph_exec_stats st;
            ms_engine_graph_stats(e, &st);
            assert_true(st.n_replays > 0 && st.n_padding_rows > 0);
        }
        ms_engine_free(e);
    }
    for (int32_t r = 0; r < N; r++)
        assert_memory_equal(out[1][r], out[0][r], (size_t)(NEW - r) * sizeof(int32_t));
    assert_int_equal(n_lg[1], n_lg[0]);
    assert_memory_equal(lg[1], lg[0], n_lg[0] * sizeof(float));
    free(lg[0]);
    free(lg[1]);
}

/* Run a CLI verb with stdout sent to /dev/null; returns its exit status. */
static int quiet_cli(int argc, char **argv, bool bench) {
    fflush(stdout);
    int saved = dup(1), null = open("/dev/null", O_WRONLY);
    assert_true(saved >= 0 && null >= 0);
    dup2(null, 1);
    int rc = bench ? ms_cli_bench(argc, argv, &ms_llama_desc, "llama")
                   : ms_cli_main(argc, argv, &ms_llama_desc);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    close(null);
    return rc;
}

/* --no-graphs is a flag of generate and bench (on the CPU both run eager either way). */
static void test_cli_flag(void **state) {
    (void)state;
    char model[512];
    snprintf(model, sizeof model, "%s", ms_test_fixture("hf/llama_gqa"));
    char *gen[] = {"llama", "generate", "--model", model, "--prompt-ids", "1,79,64",
                   "--max-new-tokens", "3", "--output", "ids", "--tokenizer", "none",
                   "--device", "cpu", "--no-graphs"};
    assert_int_equal(quiet_cli((int)MS_ARRAY_LEN(gen), gen, false), 0);
    gen[14] = "--no-graph"; /* a misspelt flag is a usage error, not ignored */
    assert_int_equal(quiet_cli((int)MS_ARRAY_LEN(gen), gen, false), 2);
    char *bench[] = {"--model", model, "--device", "cpu", "--batch", "1,3", "--prompt-len",
                     "4", "--new-tokens", "2", "--prefill", "none", "--runs", "1", "--warmup",
                     "0", "--no-graphs"};
    assert_int_equal(quiet_cli((int)MS_ARRAY_LEN(bench), bench, true), 0);
    assert_int_equal(quiet_cli((int)MS_ARRAY_LEN(bench) - 1, bench, true), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_buckets),
        ms_unit_test(test_check_padding),
        ms_unit_test(test_pad_and_fallbacks),
        ms_unit_test(test_padded_equals_eager),
        ms_unit_test(test_static_write_addresses),
        ms_unit_test(test_above_largest_bucket),
        ms_unit_test(test_preplan_refused),
        ms_unit_test(test_bad_mode),
        ms_unit_test(test_cli_flag),
        ms_unit_test(test_mrope_padded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
