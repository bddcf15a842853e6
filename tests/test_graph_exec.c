/*
 * test_graph_exec.c - the host side of the captured path (runtime/engine/graph_exec.h) on the
 * CPU backend, where MS_GRAPHS_PADDED takes the leases, padding, staging and checks of a replay
 * and runs the forward eagerly:
 *   - bucket choice from a node's capture declarations (batch buckets dropped above max_seqs,
 *     token buckets above max_tokens, multi-segment steps refused), dummy pages (dummy 0 with a
 *     prefill tail's pages);
 *   - over a fake step: warm-ups then captures largest first, a failed capture leaves its bucket
 *     out (the next bucket up is leased), a failed warm-up captures nothing, padding to the
 *     bucket with dummy rows after the real ones, eager above the largest bucket and for rows
 *     that are not one-token decode rows, refusals (dummy ids as real rows, too little room);
 *   - prefill over a fake step: (tokens, rows) buckets warmed up and captured largest first,
 *     the tightest bucket with room for the padding rows (the next token bucket when the rows
 *     need it, a larger row count when a capture failed), the dummy tail row and one-token
 *     padding rows, eager above the largest token bucket, for more rows and explicit
 *     positions, never a pre-plan;
 *   - the padding check: a padding write address on a real row's page is refused, the sink page
 *     and the dummy rows' own pages are not (decode- and prefill-shaped plans);
 *   - prefill on models/llama.mstar (token buckets 32, 64 at max_tokens 100): ragged batches
 *     padded to (32, 4), (64, 2), (32, 1) give bitwise the logits, ids, prompt logprobs and a
 *     prefilled request's KV bytes (ms_engine_pd_publish) of the unpadded eager run; 95 tokens
 *     (above 64) and a prompt-logprobs batch run eager;
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
#include "pd.h"
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
    assert_true(ms_graph_exec_step_capturable(&node, 0)); /* by tokens: prefill */
    assert_true(ms_graph_exec_step_capturable(&node, 1));
    assert_false(ms_graph_exec_step_capturable(&node, 2)); /* two segments per row */
    assert_false(ms_graph_exec_step_capturable(&node, 3));
    /* token buckets are kept up to max_tokens, batch buckets up to max_rows */
    assert_int_equal(ms_graph_exec_buckets(&node, 0, 12, 0, b, MS_MD_MAX_BUCKETS), 0);
    assert_int_equal(ms_graph_exec_buckets(&node, 0, 12, 40, b, MS_MD_MAX_BUCKETS), 1);
    assert_int_equal(b[0], 32);
    assert_int_equal(ms_graph_exec_buckets(&node, 0, 1, 64, b, MS_MD_MAX_BUCKETS), 2);
    assert_int_equal(b[1], 64);
    assert_int_equal(ms_graph_exec_buckets(&node, 1, 12, 0, b, MS_MD_MAX_BUCKETS), 4);
    assert_int_equal(b[0], 1);
    assert_int_equal(b[3], 8); /* 16 > max_seqs 12: it could never be filled */
    assert_int_equal(ms_graph_exec_buckets(&node, 1, 100, 0, b, MS_MD_MAX_BUCKETS), 5);
    /* decode only (max_tokens 0): one page per dummy row of the largest bucket */
    assert_int_equal(ms_graph_exec_dummy_pages(&node, 12, 0, 4, false), 8);
    assert_int_equal(ms_graph_exec_dummy_pages(&node, 1, 0, 4, false), 1);
    assert_int_equal(ms_graph_exec_dummy_pages(&node, 12, 0, 4, true), 16); /* two slots */
    /* with prefill buckets up to 64 tokens: dummy 0 carries the tail, 64 / 4 pages */
    assert_int_equal(ms_graph_exec_dummy_pages(&node, 12, 64, 4, false), 7 + 16);
    assert_int_equal(ms_graph_exec_dummy_pages(&node, 12, 64, 4, true), 2 * (7 + 16));
    assert_int_equal(ms_graph_exec_dummy_pages(&node, 12, 40, 16, false), 7 + 2);
    assert_int_equal(ms_graph_exec_dummy_pages(&node, 1, 64, 4, false), 16);
    steps[1].all_logits = true;
    assert_int_equal(ms_graph_exec_dummy_pages(&node, 12, 0, 4, true), 0);
    /* prefill alone: rows 1, 2, 4, 8 of token bucket 64 */
    assert_int_equal(ms_graph_exec_dummy_pages(&node, 12, 64, 4, false), 7 + 16);
    assert_int_equal(ms_graph_exec_dummy_pages(&node, 3, 64, 4, false), 1 + 16);
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
        /* the prefill step (token buckets) is not on the captured path: max_tokens 0 keeps
           none of its buckets */
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

/* ---- prefill: (tokens, rows) buckets, the token tail, the choice of bucket ---- */

typedef struct fake_prefill {
    int32_t n_warm, n_capture;
    int32_t fail_capture_tok, fail_capture_rows; /* a capture of this bucket fails (0: none) */
    int32_t order[64][2]; /* (tokens, rows) of the prefill runs, in run order */
    int32_t n_order;
} fake_prefill;

static ms_status fake_prefill_step(void *user, const ms_graph_step *gs, ms_md_row *rows,
                                   ms_rid *rids, ms_error *err) {
    fake_prefill *f = user;
    int32_t tok = 0;
    for (int32_t i = 0; i < gs->n_rows; i++) {
        assert_true(rids[i] >= MS_RID_DUMMY_BASE);
        assert_int_equal(rows[i].rid, rids[i]);
        assert_false(rows[i].sample);
        if (gs->step == 0 && i > 0)
            assert_int_equal(rows[i].len[0], 1); /* past the tail row: one token each */
        tok += rows[i].len[0];
    }
    if (gs->step == 0) { /* every row a dummy: the bucket's tokens exactly */
        assert_int_equal(tok, gs->n_pad_tokens);
        if (f->n_order < 64) {
            f->order[f->n_order][0] = tok;
            f->order[f->n_order][1] = gs->n_rows;
            f->n_order++;
        }
    }
    if (!gs->capture) {
        f->n_warm++;
        return MS_OK;
    }
    f->n_capture++;
    assert_int_equal(gs->lease.bs, gs->n_rows);
    if (gs->step == 0 && gs->lease.n_tokens == f->fail_capture_tok &&
        gs->lease.bs == f->fail_capture_rows)
        return MS_FAIL(err, MS_ERR_INTERNAL, "capture failed on purpose");
    return MS_OK;
}

/* Rows of the given token counts (ids 100, 101, ...). */
static void prefill_rows_of(ms_md_row *rows, ms_rid *rids, const int32_t *lens, int32_t n) {
    for (int32_t i = 0; i < 12; i++) {
        memset(&rows[i], 0, sizeof rows[i]);
        rows[i].rid = rids[i] = (ms_rid)(100 + i);
        rows[i].len[0] = i < n ? lens[i] : 1;
        rows[i].sample = true;
    }
}

static void test_prefill_pad(void **state) {
    (void)state;
    static ms_md_node node;
    static ms_md_step steps[2];
    memset(&node, 0, sizeof node);
    node.n_steps = 2;
    node.steps = steps;
    steps[0] = (ms_md_step){.name = "prefill", .n_segments = 1, .capture_by_tokens = true,
                            .buckets = {32, 64, 128}, .n_buckets = 3};
    steps[1] = (ms_md_step){.name = "decode", .n_segments = 1, .buckets = {1, 2}, .n_buckets = 2};
    ms_backend be;
    ms_error err = {0};
    assert_int_equal(ms_backend_cpu_init(&be, NULL, &err), MS_OK);
    ms_sample_res *sr = NULL;
    assert_int_equal(ms_sample_res_init(&sr, 16, &err), MS_OK);
    ms_resource_spec spec = {.key = "sampler", .kind = MS_RESOURCE_SAMPLER, .instance = sr,
                             .iface = ms_sample_res_iface()};
    ms_step_runner *runner = NULL;
    assert_int_equal(ms_step_runner_init(&runner, &spec, 1, &err), MS_OK);
    /* max_tokens 100 drops token bucket 128; max_rows 4 keeps row counts 1, 2, 4 */
    ms_graph_exec_config gc = {.mode = MS_GRAPHS_PADDED, .node = &node, .be = &be,
                               .runner = runner, .max_rows = 4, .max_tokens = 100,
                               .n_pages = 64, .kv_resource = 0};
    ms_graph_exec *gx = NULL;
    assert_int_equal(ms_graph_exec_init(&gx, &gc, &err), MS_OK);
    assert_non_null(gx);
    ms_md_row rows[12];
    ms_rid rids[12];
    fake_prefill f = {.fail_capture_tok = 64, .fail_capture_rows = 2};
    assert_int_equal(ms_graph_exec_capture(gx, fake_prefill_step, &f, rows, rids, 12, &err),
                     MS_OK);
    ms_graph_exec_stats st;
    ms_graph_exec_get_stats(gx, &st);
    assert_int_equal(st.n_buckets, 2 + 6);
    assert_int_equal(st.n_prefill_buckets, 6); /* (32 | 64) x (1 | 2 | 4) */
    assert_int_equal(st.n_captured, 7);
    assert_int_equal(st.n_failed, 1);
    assert_non_null(strstr(st.first_failure, "prefill bucket 64 tokens x 2 rows: capture failed"));
    /* warm-ups, then captures, largest (tokens, rows) first; a dummy tail fills each bucket */
    const int32_t want[12][2] = {{64, 4}, {64, 2}, {64, 1}, {32, 4}, {32, 2}, {32, 1},
                                 {64, 4}, {64, 2}, {64, 1}, {32, 4}, {32, 2}, {32, 1}};
    assert_int_equal(f.n_order, 12);
    assert_memory_equal(f.order, want, sizeof want);

    ms_graph_step gs;
    /* one row of exactly 32 tokens: bucket (32, 1), nothing to pad */
    const int32_t l32[] = {32};
    prefill_rows_of(rows, rids, l32, 1);
    assert_int_equal(ms_graph_exec_pad(gx, 0, rows, rids, 1, 12, &gs, &err), MS_OK);
    assert_true(gs.padded && gs.leased);
    assert_int_equal(gs.n_rows, 1);
    assert_int_equal(gs.lease.n_tokens, 32);
    assert_int_equal(gs.n_pad_tokens, 0);
    ms_graph_exec_done(gx, &gs);
    /* one row of 20: (32, 2), the tail row dummy 0 of the slot with 12 tokens */
    const int32_t l20[] = {20};
    prefill_rows_of(rows, rids, l20, 1);
    assert_int_equal(ms_graph_exec_pad(gx, 0, rows, rids, 1, 12, &gs, &err), MS_OK);
    assert_true(gs.padded);
    assert_int_equal(gs.n_rows, 2);
    assert_int_equal(gs.lease.n_tokens, 32);
    assert_int_equal(gs.n_pad_tokens, 12);
    assert_int_equal(rids[0], (ms_rid)100);
    assert_true(ms_graph_exec_is_dummy(gx, rids[1]));
    assert_int_equal(rows[1].len[0], 12);
    assert_false(rows[1].sample);
    assert_int_equal(rids[2], (ms_rid)102); /* past the bucket: untouched */
    ms_graph_exec_done(gx, &gs);
    /* three ragged rows 10 + 5 + 7 = 22: (32, 4), one padding row carrying the 10-token tail */
    const int32_t l3[] = {10, 5, 7};
    prefill_rows_of(rows, rids, l3, 3);
    assert_int_equal(ms_graph_exec_pad(gx, 0, rows, rids, 3, 12, &gs, &err), MS_OK);
    assert_true(gs.padded);
    assert_int_equal(gs.n_rows, 4);
    assert_int_equal(gs.lease.n_tokens, 32);
    assert_int_equal(rows[3].len[0], 10);
    assert_int_equal(gs.n_pad_tokens, 10);
    ms_graph_exec_done(gx, &gs);
    /* two rows of 31 tokens: (32, 2) needs exactly 32, (32, 4) has room for 1 padding token of
       the 2 padding rows: the next token bucket, (64, 4), tail 32 - 1 = 31 tokens + 1 */
    const int32_t l2[] = {30, 1};
    prefill_rows_of(rows, rids, l2, 2);
    assert_int_equal(ms_graph_exec_pad(gx, 0, rows, rids, 2, 12, &gs, &err), MS_OK);
    assert_true(gs.padded);
    assert_int_equal(gs.n_rows, 4);
    assert_int_equal(gs.lease.n_tokens, 64);
    assert_int_equal(rows[2].len[0], 32);
    assert_int_equal(rows[3].len[0], 1);
    assert_int_equal(gs.n_pad_tokens, 33);
    assert_true(ms_graph_exec_is_dummy(gx, rids[2]) && ms_graph_exec_is_dummy(gx, rids[3]));
    assert_true(rids[2] != rids[3]);
    ms_graph_exec_done(gx, &gs);
    /* one row of 40: (64, 2) failed its capture: (64, 4), two padding rows */
    const int32_t l40[] = {40};
    prefill_rows_of(rows, rids, l40, 1);
    assert_int_equal(ms_graph_exec_pad(gx, 0, rows, rids, 1, 12, &gs, &err), MS_OK);
    assert_true(gs.padded);
    assert_int_equal(gs.lease.bs, 4);
    assert_int_equal(gs.lease.n_tokens, 64);
    assert_int_equal(rows[1].len[0], 22);
    ms_graph_exec_done(gx, &gs);
    ms_graph_exec_get_stats(gx, &st);
    assert_int_equal(st.n_prefill_replays, 5);
    assert_int_equal(st.n_padding_tokens, 0 + 12 + 10 + 33 + 24);
    assert_int_equal(st.n_padding_rows, 0 + 1 + 1 + 2 + 3);
    assert_int_equal(st.last_token_bucket, 64);
    assert_int_equal(st.n_eager, 0);
    /* eager, unpadded: 65 tokens (above the largest kept bucket 64: sglang PR #33900), five
       rows (above the largest row count), a row with explicit positions */
    const int32_t l65[] = {60, 5};
    prefill_rows_of(rows, rids, l65, 2);
    assert_int_equal(ms_graph_exec_pad(gx, 0, rows, rids, 2, 12, &gs, &err), MS_OK);
    assert_false(gs.padded);
    assert_int_equal(gs.n_rows, 2);
    assert_int_equal(gs.n_pad_tokens, 0);
    assert_int_equal(rids[2], (ms_rid)102);
    const int32_t l5[] = {1, 2, 3, 4, 5};
    prefill_rows_of(rows, rids, l5, 5);
    assert_int_equal(ms_graph_exec_pad(gx, 0, rows, rids, 5, 12, &gs, &err), MS_OK);
    assert_false(gs.padded);
    prefill_rows_of(rows, rids, l20, 1);
    int32_t pos[20] = {0};
    rows[0].position_ids = pos;
    assert_int_equal(ms_graph_exec_pad(gx, 0, rows, rids, 1, 12, &gs, &err), MS_OK);
    assert_false(gs.padded);
    /* a real row with a dummy id is refused; too little room for the bucket's rows too */
    prefill_rows_of(rows, rids, l20, 1);
    rows[0].rid = rids[0] = MS_RID_DUMMY_BASE;
    assert_int_equal(ms_graph_exec_pad(gx, 0, rows, rids, 1, 12, &gs, &err),
                     MS_ERR_INVALID_ARG);
    prefill_rows_of(rows, rids, l3, 3);
    assert_int_equal(ms_graph_exec_pad(gx, 0, rows, rids, 3, 3, &gs, &err), MS_ERR_INVALID_ARG);
    ms_graph_exec_get_stats(gx, &st);
    assert_int_equal(st.n_eager, 3);
    /* a prefill step is never pre-planned */
    prefill_rows_of(rows, rids, l20, 1);
    assert_int_equal(ms_graph_exec_pad(gx, 0, rows, rids, 1, 12, &gs, &err), MS_OK);
    assert_true(gs.padded);
    ms_graph_step pgs;
    assert_int_equal(ms_graph_exec_preplan_pad(gx, &gs, rows, 12, &pgs), MS_OK);
    assert_false(pgs.preplan);
    ms_graph_exec_done(gx, &gs);
    ms_graph_exec_free(gx);
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

    /* a prefill batch padded to 12 tokens: real views of 3 and 2 tokens (pages 2 | 5, 6 of
       page size 4; view 1 continues at position 6), the tail view of 6 tokens (pages 9, 10)
       and a one-token padding view (page 11) */
    int32_t pqo[] = {0, 3, 5, 11, 12}, pkv[] = {0, 1, 3, 5, 6}, pidx[] = {2, 5, 6, 9, 10, 11};
    int32_t plast[] = {3, 4, 2, 1}, pstart[] = {0, 0, 0, 0};
    int32_t pt2p[] = {2, 2, 2, 6, 6, 9, 9, 9, 9, 10, 10, 11};
    int32_t pt2s[] = {0, 1, 2, 2, 3, 0, 1, 2, 3, 0, 1, 0};
    ms_kv_plan pf = {.n_views = 4, .n_tokens = 12, .qo_indptr = pqo, .kv_indptr = pkv,
                     .kv_indices = pidx, .kv_last_page_len = plast, .kv_start = pstart,
                     .token_to_page = pt2p, .token_to_slot = pt2s, .is_decode = false};
    assert_int_equal(ms_graph_exec_check_padding(&pf, 2, 16, mark, &err), MS_OK);
    pt2p[8] = 5; /* a tail token writes the page a real view reads */
    assert_int_equal(ms_graph_exec_check_padding(&pf, 2, 16, mark, &err), MS_ERR_STATE);
    assert_non_null(strstr(err.msg, "padding token 8 writes page 5"));
    pt2p[8] = 9;
    pt2p[11] = 6; /* the one-token padding row writes a real row's write page */
    assert_int_equal(ms_graph_exec_check_padding(&pf, 2, 16, mark, &err), MS_ERR_STATE);
    assert_non_null(strstr(err.msg, "padding token 11 writes page 6"));
    pt2p[11] = MS_SINK_PAGE; /* the sink is every padding row's to write */
    assert_int_equal(ms_graph_exec_check_padding(&pf, 2, 16, mark, &err), MS_OK);
    assert_int_equal(mark[0] | mark[1], 0);
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
    /* decode 1, 2, 4 of [1, 2, 4, 8 .. 256] fit max_seqs 4; prefill 32, 64, 128 of
       [32 .. 2048] fit max_tokens 128, each with 1, 2, 4 rows */
    assert_int_equal(st.n_buckets, 3 + 9);
    assert_int_equal(st.n_prefill_buckets, 9);
    assert_int_equal(st.n_slots, 2);     /* the pre-plan's second slot */
    assert_int_equal(st.n_captured, 24); /* two slots each */
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
    for (int32_t s = 1; s < eager.n_steps; s++) { /* step 0 is the prefill: 4 rows, eager */
        want_pad += (uint64_t)(next_pow2(eager.n_seqs[s]) - eager.n_seqs[s]);
        want_steps++;
        saw[next_pow2(eager.n_seqs[s])] = true;
    }
    assert_true(saw[4] && saw[2] && saw[1]); /* the bucket switched mid-run */
    assert_true(want_pad > 0);
    assert_int_equal(st.n_replays - st.n_prefill_replays, want_steps);
    assert_int_equal(st.n_prefill_replays, 0); /* 4 rows, 24 tokens: no row count above 4 */
    assert_int_equal(st.n_padding_rows, want_pad);
    assert_int_equal(st.n_eager, 1);
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
    assert_int_equal(ks->capacity, 128); /* the largest bucket's tokens (prefill's) */
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
            assert_int_equal(st.n_buckets - st.n_prefill_buckets, 4);
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

/* ---- prefill over token buckets on models/llama.mstar ---- */

/* Requests of the prefill run: prompt length, new ids, the step after which each joins (-1:
 * from the start), whether it asks prompt logprobs. */
#define PF_REQ 7
#define PF_STEPS 64
static const int32_t pf_len[PF_REQ] = {5, 17, 9, 40, 32, 95, 8};
static const int32_t pf_new[PF_REQ] = {6, 4, 5, 5, 3, 3, 2};
static const int32_t pf_join[PF_REQ] = {-1, -1, -1, 2, 5, 8, 11};
static const bool pf_plp[PF_REQ] = {false, false, false, false, false, false, true};

typedef struct pf_rec {
    float logits[PF_STEPS][PF_REQ][VOCAB];
    int32_t n_seqs[PF_STEPS], n_tok[PF_STEPS];
    int32_t out[PF_REQ][8];
    uint8_t *kv;      /* request 1's KV pages' bytes (ms_engine_pd_publish after its prefill) */
    size_t kv_bytes;
    int32_t kv_tokens; /* its stream length then */
    float plp[8];     /* request 6's prompt logprobs */
    int32_t n_steps;
    ms_graph_exec_stats st;
} pf_rec;

static void pf_run(ms_graph_mode mode, pf_rec *rec) {
    memset(rec, 0, sizeof *rec);
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture("hf/llama_gqa");
    o.page_size = 4;
    o.max_seqs = 4;
    o.max_tokens = 100; /* keeps token buckets 32 and 64; row counts 1, 2, 4 */
    o.n_threads = 2;
    o.graphs = mode;
    o.prompt_logprobs_rows = 16;
    ms_engine *e = NULL;
    ms_error err = {0};
    if (ms_engine_init(&e, &ms_llama_desc, &o, &err) != MS_OK)
        fail_msg("engine init: %s", err.msg);
    const int32_t free0 = ms_engine_kv_pages_free(e);
    ms_rid rids[PF_REQ] = {0};
    bool published = false;
    for (int32_t s = -1; s < PF_STEPS; s++) {
        for (int32_t r = 0; r < PF_REQ; r++) {
            if (pf_join[r] != s)
                continue;
            int32_t ids[128];
            for (int32_t i = 0; i < pf_len[r]; i++)
                ids[i] = (int32_t)((r * 61 + i * 37 + 3) % VOCAB);
            ms_sampling_params sp = ms_sampling_greedy();
            if (r % 2 == 1)
                sp = (ms_sampling_params){.temperature = 0.9f, .top_k = 0, .top_p = 0.95f,
                                          .seed = (uint64_t)(7 + r)};
            ms_engine_request rq = {.prompt = ids, .n_prompt = pf_len[r],
                                    .max_new_tokens = pf_new[r], .sampling = sp,
                                    .ignore_eos = true, .prompt_logprobs = pf_plp[r]};
            assert_int_equal(ms_engine_add(e, &rq, &rids[r], &err), MS_OK);
        }
        if (s < 0)
            continue;
        bool pending = false;
        for (int32_t r = 0; r < PF_REQ; r++)
            pending = pending || pf_join[r] > s;
        if (ms_engine_n_active(e) == 0 && !pending)
            break;
        ms_engine_step_info info;
        if (ms_engine_step(e, &info, &err) != MS_OK)
            fail_msg("%s step %d: %s", ms_graph_mode_str(mode), (int)s, err.msg);
        rec->n_seqs[s] = info.n_seqs;
        rec->n_tok[s] = info.n_tokens;
        for (int32_t r = 0; r < PF_REQ; r++) {
            const float *lg =
                rids[r] != 0 && !(r == 1 && published) ? ms_engine_last_logits(e, rids[r]) : NULL;
            for (int v = 0; v < VOCAB; v++)
                rec->logits[s][r][v] = lg != NULL ? lg[v] : -1.0f;
        }
        rec->n_steps = s + 1;
        /* request 1 was prefilled in the first step (3 ragged rows padded to (32, 4)): its KV
           pages' bytes, before any decode step writes them again */
        if (!published) {
            const int32_t *o1;
            int32_t n1;
            assert_int_equal(ms_engine_output(e, rids[1], &o1, &n1, NULL), MS_OK);
            assert_int_equal(n1, 1);
            rec->out[1][0] = o1[0];
            rec->kv_tokens = ms_engine_stream_length(e, rids[1], MS_LABEL_MAIN);
            ms_pd_record *pr = NULL;
            if (ms_engine_pd_publish(e, rids[1], &pr, &err) != MS_OK)
                fail_msg("publish: %s", err.msg);
            assert_int_equal(pr->payload->n_streams, 1);
            rec->kv_bytes = (size_t)pr->payload->n_pages[0] * (size_t)pr->payload->n_layers *
                            pr->payload->page_bytes;
            rec->kv = malloc(rec->kv_bytes);
            assert_non_null(rec->kv);
            memcpy(rec->kv, pr->payload->bytes[0], rec->kv_bytes);
            ms_pd_record_free(pr);
            published = true;
        }
    }
    for (int32_t r = 0; r < PF_REQ; r++) {
        if (r == 1)
            continue; /* published */
        const int32_t *ids;
        int32_t n;
        assert_int_equal(ms_engine_output(e, rids[r], &ids, &n, NULL), MS_OK);
        assert_int_equal(n, pf_new[r]);
        memcpy(rec->out[r], ids, (size_t)n * sizeof(int32_t));
        if (pf_plp[r]) {
            const ms_engine_prompt_logprob *lp;
            int32_t nl;
            assert_int_equal(ms_engine_prompt_logprobs(e, rids[r], &lp, &nl), MS_OK);
            assert_int_equal(nl, pf_len[r]);
            for (int32_t i = 1; i < nl; i++)
                rec->plp[i] = lp[i].logprob;
        }
        ms_engine_remove(e, rids[r]);
    }
    assert_int_equal(ms_engine_kv_pages_free(e), free0); /* the dummy rows kept their own */
    ms_engine_graph_stats(e, &rec->st);
    ms_engine_free(e);
}

/* Ragged prefill batches padded to a token bucket (a dummy tail row, one-token padding rows)
 * give bitwise the logits, ids and KV bytes of the unpadded eager run; a batch above the largest
 * token bucket, and one asking prompt logprobs, run eager. */
static void test_prefill_padded_equals_eager(void **state) {
    (void)state;
    static pf_rec rec[2];
    pf_run(MS_GRAPHS_OFF, &rec[0]);
    pf_run(MS_GRAPHS_PADDED, &rec[1]);
    const pf_rec *a = &rec[0], *b = &rec[1];
    assert_int_equal(b->n_steps, a->n_steps);
    assert_memory_equal(b->n_seqs, a->n_seqs, sizeof a->n_seqs);
    assert_memory_equal(b->n_tok, a->n_tok, sizeof a->n_tok); /* real tokens, not padding */
    assert_memory_equal(b->out, a->out, sizeof a->out);
    assert_memory_equal(b->logits, a->logits, sizeof a->logits);
    assert_memory_equal(b->plp, a->plp, sizeof a->plp);
    assert_true(a->kv_tokens == 17 + 0 && a->kv_bytes > 0);
    assert_int_equal(b->kv_tokens, a->kv_tokens);
    assert_int_equal(b->kv_bytes, a->kv_bytes);
    assert_memory_equal(b->kv, a->kv, a->kv_bytes);
    free(rec[0].kv);
    free(rec[1].kv);
    /* the steps: 0 prefill 0-2 (31 tokens, 3 rows: (32, 4)); the prefills of 3 (40 tokens:
       (64, 2)) and 4 (32 tokens: (32, 1), exact) padded; 5 (95 tokens, above 64) and 6
       (prompt logprobs) eager */
    const ms_graph_exec_stats *st = &b->st;
    assert_int_equal(st->mode, MS_GRAPHS_PADDED);
    assert_int_equal(st->n_prefill_buckets, 6);
    assert_int_equal(st->n_buckets, 6 + 3); /* decode 1, 2, 4 */
    assert_int_equal(st->n_failed, 0);
    assert_int_equal(st->n_captured, 2 * st->n_buckets);
    assert_int_equal(st->n_prefill_replays, 3);
    assert_int_equal(st->n_padding_tokens, (32 - 31) + (64 - 40) + 0);
    assert_true(st->n_eager >= 1); /* request 5's 95 tokens; request 6 bypasses the path */
    int32_t n_prefill = 0, big = 0;
    for (int32_t s = 0; s < a->n_steps; s++) {
        n_prefill += a->n_tok[s] > a->n_seqs[s];
        big += a->n_tok[s] == 95;
    }
    assert_true(n_prefill >= 4);
    assert_int_equal(big, 1);
}

/* A stream shorter than max_tokens (max_seq_len 40): token buckets above it are dropped (dummy
 * 0 would carry a tail longer than any request may be), the rest captured, prefill padded. */
static void test_prefill_max_seq_len(void **state) {
    (void)state;
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture("hf/llama_gqa");
    o.page_size = 4;
    o.max_seqs = 4;
    o.max_tokens = 128;
    o.max_seq_len = 40;
    o.n_threads = 2;
    o.graphs = MS_GRAPHS_PADDED;
    ms_engine *e = NULL;
    ms_error err = {0};
    if (ms_engine_init(&e, &ms_llama_desc, &o, &err) != MS_OK)
        fail_msg("engine init: %s", err.msg);
    ms_graph_exec_stats st;
    ms_engine_graph_stats(e, &st);
    assert_int_equal(st.n_failed, 0);
    assert_int_equal(st.n_prefill_buckets, 3); /* 32 tokens x 1, 2, 4 rows */
    assert_int_equal(st.n_captured, 2 * st.n_buckets);
    int32_t ids[20];
    for (int32_t i = 0; i < 20; i++)
        ids[i] = (int32_t)((i * 13 + 5) % VOCAB);
    ms_engine_request rq = {.prompt = ids, .n_prompt = 20, .max_new_tokens = 3,
                            .sampling = ms_sampling_greedy(), .ignore_eos = true};
    ms_rid rid;
    assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_OK);
    while (ms_engine_n_active(e) > 0)
        if (ms_engine_step(e, NULL, &err) != MS_OK)
            fail_msg("step: %s", err.msg);
    ms_engine_graph_stats(e, &st);
    assert_int_equal(st.n_prefill_replays, 1); /* 20 tokens on (32, 2) */
    assert_int_equal(st.last_token_bucket, 32);
    ms_engine_remove(e, rid);
    ms_engine_free(e);
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
        ms_unit_test(test_prefill_pad),
        ms_unit_test(test_padded_equals_eager),
        ms_unit_test(test_static_write_addresses),
        ms_unit_test(test_above_largest_bucket),
        ms_unit_test(test_preplan_refused),
        ms_unit_test(test_prefill_padded_equals_eager),
        ms_unit_test(test_prefill_max_seq_len),
        ms_unit_test(test_bad_mode),
        ms_unit_test(test_cli_flag),
        ms_unit_test(test_mrope_padded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
