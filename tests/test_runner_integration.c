/*
 * test_runner_integration.c - the real KV pool (kv_pool.h) with positions, attention,
 * cross-attention, scratch and the graph plan, driven through the step runner: prefill then
 * decode, batched CFG under a combined label with forks, a write-once cross-attention context,
 * admit rolled back across resources (H2), non-committing steps (H14), PD hand-over of positions
 * and KV (F5), capture/replay with padding rows and the sink tail (F1) and 1000 padded replays
 * (H13). Every test ends with the page conservation check of the KV tests.
 */
#include "ms_test.h"

#include <string.h>

#include "attn_plan.h"
#include "cross_attn.h"
#include "graph_plan.h"
#include "kv_pool.h"
#include "kv_test_util.h"
#include "positions.h"
#include "scratch.h"
#include "step_runner.h"

#include "ms_test_impl.h"

/* ---- fixture: kv (+ ctx_kv) pools, runner with pos, attn (+ cross, scratch) ---- */

enum { R_KV = 0, R_POS = 1, R_ATTN = 2, R_CTX = 3, R_CROSS = 4, R_SCRATCH = 3 };

typedef struct ifx {
    kv_fix kv;
    kv_fix ctx;          /* context pool (cross tests) on the same device */
    bool with_cross;
    bool with_scratch;
    ms_step_runner *r;
    ms_scratch *scratch_res;
} ifx;

static const char *const deps_kv[] = {"kv"};
static const char *const deps_cross[] = {"ctx_kv", "kv"};

static void ifx_init(ifx *f, int32_t n_pages, int32_t ps, bool with_cross, bool with_scratch) {
    memset(f, 0, sizeof *f);
    kv_fix_init(&f->kv, n_pages, ps, 0);
    f->with_cross = with_cross;
    f->with_scratch = with_scratch;
    ms_positions_config pc = {MS_POS_SEQUENTIAL, 1, 1, 1024, "kv"};
    ms_attn_config ac = {"kv", 64, 1024};
    ms_cross_config cc = {"ctx_kv", "kv", MS_LABEL_MAIN, 64, 1024};
    ms_scratch_config sc = {f->kv.dev, 2, 64};
    ms_resource_spec specs[5] = {
        {"kv", MS_RESOURCE_KV, NULL, 0, NULL, NULL, f->kv.pool, ms_kv_pool_resource_i()},
        {"pos", MS_RESOURCE_POS, deps_kv, 1, ms_positions_build, &pc, NULL, NULL},
        {"attn", MS_RESOURCE_ATTN, deps_kv, 1, ms_attn_build, &ac, NULL, NULL},
    };
    int n = 3;
    if (with_cross) {
        kv_fix_opts o = {.dev = f->kv.dev};
        kv_fix_init_opts(&f->ctx, n_pages, ps, 0, &o);
        specs[n++] = (ms_resource_spec){"ctx_kv", MS_RESOURCE_KV, NULL, 0, NULL, NULL,
                                        f->ctx.pool, ms_kv_pool_resource_i()};
        specs[n++] = (ms_resource_spec){"cross", MS_RESOURCE_CROSS, deps_cross, 2,
                                        ms_cross_build, &cc, NULL, NULL};
    } else if (with_scratch) {
        specs[n++] = (ms_resource_spec){"scratch", MS_RESOURCE_SCRATCH, NULL, 0,
                                        ms_scratch_build, &sc, NULL, NULL};
    }
    ms_error err = {0};
    ms_status st = ms_step_runner_init(&f->r, specs, n, &err);
    if (st != MS_OK)
        fail_msg("runner: %s", err.msg);
    if (with_scratch)
        f->scratch_res = ms_step_runner_resource(f->r, R_SCRATCH);
}

static void ifx_free(ifx *f) {
    ms_step_runner_free(f->r);
    kv_check_pages(&f->kv);
    if (f->with_cross) {
        kv_check_pages(&f->ctx);
        kv_fix_free_keep_dev(&f->ctx);
    }
    kv_fix_free(&f->kv);
}

static void ifx_ingest(ifx *f, ms_rid rid) {
    ms_error err = {0};
    assert_int_equal(ms_step_runner_ingest(f->r, rid, NULL, &err), MS_OK);
}

/* A step under construction: segments of the query KV (+ context KV), records for every
 * resource of the fixture. */
typedef struct istep {
    ms_step step;
    ms_kv_step ks, cks;
    ms_pos_step ps;
    ms_attn_step as;
    ms_segment segs[128];
    ms_segment csegs[128];
    int32_t n_csegs;
    ms_combined_label comb;
    ms_fork post;
    ms_rid rows[128];
    ms_step_ctx ctx;
} istep;

static void istep_init(istep *s, const ifx *f, const char *name, bool commit) {
    memset(s, 0, sizeof *s);
    s->ks.commit = commit;
    s->cks.commit = commit;
    s->ps.n_axes = 1;
    s->as.causal = true;
    s->step.name = name;
    s->step.segments = s->segs;
    s->step.records[R_KV].rec = &s->ks;
    s->step.records[R_POS].rec = &s->ps;
    s->step.records[R_ATTN].rec = &s->as;
    if (f->with_cross) {
        s->step.records[R_CTX].rec = &s->cks;
        s->step.records[R_CTX].segments = s->csegs;
        s->step.records[R_CROSS].rec = &s->as; /* any non-NULL record */
    }
    if (f->with_scratch)
        s->step.records[R_SCRATCH].rec = &s->as;
    s->ctx.request_ids = s->rows;
}

static void istep_seg(istep *s, ms_rid rid, ms_label label, int32_t span) {
    s->segs[s->step.n_segments++] = (ms_segment){rid, label, span};
    bool seen = false;
    for (int32_t i = 0; i < s->ctx.n_rows; i++)
        seen = seen || s->rows[i] == rid;
    if (!seen) {
        s->rows[s->ctx.n_rows++] = rid;
        s->ctx.n_real = s->ctx.n_rows;
    }
}

static void istep_ctx_seg(istep *s, ms_rid rid, int32_t span) {
    s->csegs[s->n_csegs++] = (ms_segment){rid, MS_LABEL_MAIN, span};
    s->step.records[R_CTX].n_segments = s->n_csegs;
}

static ms_admit_outcome istep_admit(ifx *f, istep *s) {
    return ms_step_runner_admit(f->r, &s->step, &s->ctx);
}

/* admit (must succeed), plan, commit. */
static void istep_run(ifx *f, istep *s) {
    ms_admit_outcome o = istep_admit(f, s);
    if (o.code != MS_ADMIT_OK)
        fail_msg("admit %s: %s (resource %d)", s->step.name, ms_admit_code_str(o.code),
                 o.resource);
    ms_error err = {0};
    if (ms_step_runner_plan(f->r, &s->step, &s->ctx, &err) != MS_OK)
        fail_msg("plan: %s", err.msg);
    if (ms_step_runner_commit(f->r, &s->step, &s->ctx, &err) != MS_OK)
        fail_msg("commit: %s", err.msg);
}

static const ms_pos_plan *pos_plan(const istep *s) { return s->ctx.plan_results[R_POS]; }
static const ms_attn_plan_set *attn_plan(const istep *s) { return s->ctx.plan_results[R_ATTN]; }
static const ms_kv_plan_set *kv_set(const istep *s) { return s->ctx.plan_results[R_KV]; }

static int32_t position(ifx *f, ms_rid rid, ms_label label) {
    int32_t p = -1;
    assert_int_equal(ms_positions_position(ms_step_runner_resource(f->r, R_POS), rid, label, &p,
                                           NULL),
                     MS_OK);
    return p;
}

/* ---- prefill then decode ---- */

static void test_integration_prefill_then_decode(void **state) {
    (void)state;
    ifx f;
    ifx_init(&f, 64, 4, false, false);
    int32_t free0 = ms_page_arena_num_free(f.kv.arena);
    ifx_ingest(&f, 1);
    ifx_ingest(&f, 2);
    istep s;
    istep_init(&s, &f, "prefill", true);
    istep_seg(&s, 1, 0, 5);
    istep_seg(&s, 2, 0, 3);
    istep_run(&f, &s);
    const ms_attn_plan_entry *e = ms_attn_plan_find(attn_plan(&s), 0);
    assert_int_equal(e->kind, MS_ATTN_PREFILL);
    assert_true(e->causal);
    assert_int_equal(e->buffers->kv_indptr[1], 2); /* 5 tokens at ps 4 */
    assert_int_equal(e->buffers->kv_last_page_len[0], 1);
    int32_t want[] = {0, 1, 2, 3, 4, 0, 1, 2};
    assert_int_equal(pos_plan(&s)->n_tokens, 8);
    assert_memory_equal(pos_plan(&s)->ids, want, sizeof want);
    for (int step = 0; step < 6; step++) {
        istep_init(&s, &f, "decode", true);
        istep_seg(&s, 1, 0, 1);
        istep_seg(&s, 2, 0, 1);
        istep_run(&f, &s);
        e = ms_attn_plan_find(attn_plan(&s), 0);
        assert_int_equal(e->kind, MS_ATTN_DECODE);
        assert_true(kv_set(&s)->plans[0].is_decode);
        assert_int_equal(pos_plan(&s)->ids[0], 5 + step);
        assert_int_equal(pos_plan(&s)->ids[1], 3 + step);
        /* the decode token lands where its position says: page (pos / ps), slot (pos % ps) */
        const ms_kv_plan *kp = &kv_set(&s)->plans[0];
        assert_int_equal(kp->token_to_slot[0], (5 + step) % 4);
        assert_int_equal(kp->token_to_page[0], kp->views[0].pages[(5 + step) / 4]);
    }
    assert_int_equal(kv_info(&f.kv, 1, 0).stored, 11);
    assert_int_equal(position(&f, 1, 0), 11);
    assert_int_equal(position(&f, 2, 0), 9);
    kv_check_pages(&f.kv);
    ms_step_runner_remove(f.r, 1);
    ms_step_runner_remove(f.r, 2);
    assert_int_equal(ms_page_arena_num_free(f.kv.arena), free0);
    ifx_free(&f);
}

/* ---- CFG: combined label and forks ---- */

static void test_integration_cfg_combined_label_and_forks(void **state) {
    (void)state;
    ifx f;
    ifx_init(&f, 64, 4, false, false);
    ifx_ingest(&f, 1);
    ifx_ingest(&f, 2);
    /* prompt on main, post-fork main -> uncond(1): the branch starts as a copy */
    istep s;
    istep_init(&s, &f, "prefill", true);
    istep_seg(&s, 1, 0, 6);
    istep_seg(&s, 2, 0, 2);
    s.post = (ms_fork){0, 1};
    s.ks.post_forks = &s.post;
    s.ks.n_post_forks = 1;
    istep_run(&f, &s);
    assert_int_equal(kv_info(&f.kv, 1, 1).stored, 6);
    assert_int_equal(position(&f, 1, 1), 6);
    assert_int_equal(position(&f, 2, 1), 2);
    /* batched CFG decode: one attention batch over both labels, label-major */
    for (int step = 0; step < 3; step++) {
        istep_init(&s, &f, "decode_cfg", true);
        s.as.causal = false;
        s.comb = (ms_combined_label){{0, 1}, 2, 9};
        s.ks.combined = &s.comb;
        s.ks.n_combined = 1;
        istep_seg(&s, 1, 0, 1);
        istep_seg(&s, 2, 0, 1);
        istep_seg(&s, 1, 1, 1);
        istep_seg(&s, 2, 1, 1);
        istep_run(&f, &s);
        const ms_attn_plan_set *ap = attn_plan(&s);
        assert_int_equal(ap->n_plans, 1);
        assert_int_equal(ap->plans[0].plan_label, 9);
        assert_int_equal(ap->plans[0].kind, MS_ATTN_DECODE);
        assert_false(ap->plans[0].causal);
        assert_int_equal(ap->plans[0].buffers->n_rows, 4);
        const ms_pos_plan *pp = pos_plan(&s);
        assert_int_equal(pp->plan_labels[0], 9);
        int32_t want[] = {6 + step, 2 + step, 6 + step, 2 + step};
        assert_memory_equal(pp->ids, want, sizeof want);
        /* each (request, label) writes into its own stream's pages */
        const ms_kv_plan *kp = &kv_set(&s)->plans[0];
        assert_int_equal(kp->views[2].label, 1);
        assert_int_not_equal(kp->token_to_page[0], kp->token_to_page[2]);
    }
    assert_int_equal(position(&f, 1, 0), 9);
    assert_int_equal(position(&f, 1, 1), 9);
    assert_int_equal(kv_info(&f.kv, 2, 1).stored, 5);
    ms_step_runner_remove(f.r, 1);
    ms_step_runner_remove(f.r, 2);
    ifx_free(&f);
}

/* ---- H14 ---- */

static void test_integration_H14_noncommitting_steps_move_nothing(void **state) {
    (void)state;
    ifx f;
    ifx_init(&f, 64, 4, false, false);
    ifx_ingest(&f, 1);
    istep s;
    istep_init(&s, &f, "prefill", true);
    istep_seg(&s, 1, 0, 7);
    istep_run(&f, &s);
    int32_t free1 = -1;
    for (int step = 0; step < 4; step++) {
        istep_init(&s, &f, "denoise", false);
        s.as.causal = false;
        istep_seg(&s, 1, 0, 6);
        istep_run(&f, &s);
        int32_t want[] = {7, 8, 9, 10, 11, 12};
        assert_memory_equal(pos_plan(&s)->ids, want, sizeof want);
        assert_int_equal(kv_info(&f.kv, 1, 0).stored, 7);
        assert_int_equal(position(&f, 1, 0), 7);
        if (step == 0)
            free1 = ms_page_arena_num_free(f.kv.arena);
        assert_int_equal(ms_page_arena_num_free(f.kv.arena), free1); /* reservation reused */
    }
    ms_step_runner_remove(f.r, 1);
    ifx_free(&f);
}

/* ---- H2 across resources with the real pool ---- */

static void test_integration_H2_later_resource_failure_rolls_back_kv(void **state) {
    (void)state;
    ifx f;
    ifx_init(&f, 64, 4, false, true); /* scratch holds 2 rows */
    for (ms_rid rid = 1; rid <= 3; rid++)
        ifx_ingest(&f, rid);
    int32_t free0 = ms_page_arena_num_free(f.kv.arena);
    istep s;
    istep_init(&s, &f, "prefill", true);
    istep_seg(&s, 1, 0, 9);
    istep_seg(&s, 2, 0, 4);
    istep_seg(&s, 3, 0, 1);
    ms_admit_outcome o = istep_admit(&f, &s);
    assert_int_equal(o.code, MS_ADMIT_INVALID);
    assert_int_equal(o.resource, R_SCRATCH);
    assert_int_equal(ms_page_arena_num_free(f.kv.arena), free0);
    assert_false(kv_info(&f.kv, 1, 0).step_in_flight);
    kv_check_pages(&f.kv);
    /* the same rows in two steps fit */
    istep_init(&s, &f, "prefill", true);
    istep_seg(&s, 1, 0, 9);
    istep_seg(&s, 2, 0, 4);
    istep_run(&f, &s);
    const ms_scratch_plan *sp = s.ctx.plan_results[R_SCRATCH];
    assert_ptr_equal(sp->base, ms_scratch_row(f.scratch_res, 0));
    assert_int_equal(ms_page_arena_num_free(f.kv.arena), free0 - 3 - 1);
    for (ms_rid rid = 1; rid <= 3; rid++)
        ms_step_runner_remove(f.r, rid);
    ifx_free(&f);
}

/* ---- cross-attention ---- */

static void test_integration_cross_context_written_once(void **state) {
    (void)state;
    ifx f;
    ifx_init(&f, 64, 4, true, false);
    ifx_ingest(&f, 1);
    ifx_ingest(&f, 2);
    /* prefill: prompt on the decoder, encoder output written once into the context stream */
    istep s;
    istep_init(&s, &f, "prefill", true);
    istep_seg(&s, 1, 0, 2);
    istep_seg(&s, 2, 0, 2);
    istep_ctx_seg(&s, 1, 10);
    istep_ctx_seg(&s, 2, 6);
    istep_run(&f, &s);
    assert_int_equal(kv_info(&f.ctx, 1, 0).stored, 10);
    int32_t ctx_pages[8];
    assert_int_equal(ms_kv_pool_stream_pages(f.ctx.pool, 1, 0, ctx_pages, 8), 3);
    int32_t free_ctx = ms_page_arena_num_free(f.ctx.arena);
    for (int step = 0; step < 3; step++) {
        istep_init(&s, &f, "decode", true);
        istep_seg(&s, 1, 0, 1);
        istep_seg(&s, 2, 0, 1);
        istep_ctx_seg(&s, 1, 0);
        istep_ctx_seg(&s, 2, 0);
        istep_run(&f, &s);
        const ms_cross_plan_set *cs = s.ctx.plan_results[R_CROSS];
        const ms_cross_buffers *b = cs->plans[0].buffers;
        assert_int_equal(b->n_rows, 2);
        assert_memory_equal(b->kv_indices, ctx_pages, 3 * sizeof(int32_t));
        assert_int_equal(b->kv_last_page_len[0], 2);
        assert_int_equal(b->kv_last_page_len[1], 2);
        assert_int_equal(cs->plans[0].replanned, step == 0);
    }
    assert_int_equal(ms_page_arena_num_free(f.ctx.arena), free_ctx);
    assert_int_equal(kv_info(&f.ctx, 1, 0).stored, 10);
    /* a second write is refused by the cross resource: both pools roll back */
    int32_t free_kv = ms_page_arena_num_free(f.kv.arena);
    istep_init(&s, &f, "rewrite", true);
    istep_seg(&s, 1, 0, 9);
    istep_ctx_seg(&s, 1, 8);
    ms_admit_outcome o = istep_admit(&f, &s);
    assert_int_equal(o.code, MS_ADMIT_INVALID);
    assert_int_equal(o.resource, R_CROSS);
    assert_int_equal(ms_page_arena_num_free(f.kv.arena), free_kv);
    assert_int_equal(ms_page_arena_num_free(f.ctx.arena), free_ctx);
    assert_int_equal(kv_info(&f.ctx, 1, 0).stored, 10);
    ms_step_runner_remove(f.r, 1);
    ms_step_runner_remove(f.r, 2);
    ifx_free(&f);
}

/* ---- F5: PD hand-over ---- */

static void test_integration_F5_decode_node_continues_from_published_state(void **state) {
    (void)state;
    ifx a, b;
    ifx_init(&a, 64, 4, false, false);
    kv_fake_transfer xfer = {.instant = true};
    memset(&b, 0, sizeof b);
    kv_fix_opts o = {.transfer = &kv_fake_transfer_i, .transfer_ctx = &xfer};
    kv_fix_init_opts(&b.kv, 64, 4, 0, &o);
    ms_positions_config pc = {MS_POS_SEQUENTIAL, 1, 1, 1024, "kv"};
    ms_attn_config ac = {"kv", 64, 1024};
    ms_resource_spec specs[] = {
        {"kv", MS_RESOURCE_KV, NULL, 0, NULL, NULL, b.kv.pool, ms_kv_pool_resource_i()},
        {"pos", MS_RESOURCE_POS, deps_kv, 1, ms_positions_build, &pc, NULL, NULL},
        {"attn", MS_RESOURCE_ATTN, deps_kv, 1, ms_attn_build, &ac, NULL, NULL},
    };
    ms_error err = {0};
    assert_int_equal(ms_step_runner_init(&b.r, specs, 3, &err), MS_OK);
    /* node A prefills 13 tokens */
    ifx_ingest(&a, 1);
    istep s;
    istep_init(&s, &a, "prefill", true);
    istep_seg(&s, 1, 0, 13);
    istep_run(&a, &s);
    /* publish sweep: one item per resource that holds something (KV pages, position counters) */
    ms_published pub;
    assert_int_equal(ms_step_runner_publish(a.r, 1, &pub, &err), MS_OK);
    assert_int_equal(pub.n, 2);
    assert_string_equal(pub.items[0].key, "kv");
    assert_string_equal(pub.items[1].key, "pos");
    /* node B imports both through its own runner (matched by key and kind) */
    ifx_ingest(&b, 1);
    assert_int_equal(ms_step_runner_admit_retrieve(b.r, 1, &pub).code, MS_ADMIT_OK);
    assert_int_equal(kv_info(&b.kv, 1, 0).stored, 13);
    assert_int_equal(xfer.n, 1); /* one transfer started for the main stream */
    istep_init(&s, &b, "decode", true);
    istep_seg(&s, 1, 0, 1);
    istep_run(&b, &s);
    assert_int_equal(pos_plan(&s)->ids[0], 13);
    assert_int_equal(kv_set(&s)->plans[0].views[0].length, 14);
    /* a stale re-publish from A never rewinds B */
    assert_int_equal(ms_step_runner_admit_retrieve(b.r, 1, &pub).code, MS_ADMIT_OK);
    assert_int_equal(position(&b, 1, 0), 14);
    assert_int_equal(xfer.n, 1); /* nothing behind any more: no second transfer */
    ms_published_free(&pub);
    ms_step_runner_remove(a.r, 1);
    ms_step_runner_remove(b.r, 1);
    ifx_free(&a);
    ifx_free(&b);
}

/* ---- captured path ---- */

/* One captured-path step over rows[n] (spans[n], label main) under lease; commit unless
 * capturing. Stages the KV and position plans into the graph plan's static state. */
static void graph_step(ifx *f, ms_graph_plan *g, const ms_slot_lease *lease, const ms_rid *rows,
                       const int32_t *spans, int32_t n, int32_t n_real, bool capture,
                       istep *s) {
    istep_init(s, f, capture ? "capture" : "replay", true);
    for (int32_t i = 0; i < n; i++)
        istep_seg(s, rows[i], 0, spans[i]);
    s->ctx.n_real = n_real;
    s->ctx.lease = lease;
    s->ctx.capture = capture;
    ms_admit_outcome o = istep_admit(f, s);
    if (o.code != MS_ADMIT_OK)
        fail_msg("admit: %s", ms_admit_code_str(o.code));
    ms_error err = {0};
    if (ms_step_runner_plan(f->r, &s->step, &s->ctx, &err) != MS_OK)
        fail_msg("plan: %s", err.msg);
    if (ms_graph_plan_stage_step(g, f->r, &s->ctx, &err) != MS_OK)
        fail_msg("stage: %s", err.msg);
    if (!capture && ms_step_runner_commit(f->r, &s->step, &s->ctx, &err) != MS_OK)
        fail_msg("commit: %s", err.msg);
}

/* Capture every slot of bucket b over dummy rows, tokens spread evenly (remainder on row 0);
 * no commit; dummy rows reset without freeing afterwards. */
static void capture_bucket(ifx *f, ms_graph_plan *g, int32_t b, int32_t n_slots) {
    ms_error err = {0};
    assert_int_equal(ms_graph_plan_ingest_dummies(g, f->r, &err), MS_OK);
    for (int32_t slot = 0; slot < n_slots; slot++) {
        ms_slot_lease l;
        assert_int_equal(ms_graph_plan_capture_lease(g, b, slot, &l, &err), MS_OK);
        ms_rid rows[64];
        int32_t spans[64], n;
        assert_int_equal(ms_graph_plan_step_ids(g, &l, NULL, 0, rows, 64, &n, &err), MS_OK);
        for (int32_t i = 0; i < n; i++)
            spans[i] = l.n_tokens / l.bs;
        spans[0] += l.n_tokens % l.bs;
        istep s;
        graph_step(f, g, &l, rows, spans, n, 0, true, &s);
        /* warm-up/capture runs leave dummy rows exactly as ingested, pages kept */
        ms_graph_plan_release(g, f->r, &l, 0);
        assert_int_equal(ms_graph_plan_set_captured(g, b, slot, true, NULL, &err), MS_OK);
    }
}

/* Snapshot of the whole arena tensor (host device memory). */
static unsigned char *arena_snapshot(ms_page_arena *a) {
    size_t bytes = ms_page_arena_get_size(a)->bytes;
    unsigned char *copy = ms_malloc(bytes);
    assert_non_null(copy);
    memcpy(copy, ms_page_arena_data(a), bytes);
    return copy;
}

/* Whether any byte of page `page` (all layers, K and V) differs from the snapshot. */
static bool page_changed(ms_page_arena *a, const unsigned char *snap, int32_t page) {
    const ms_page_arena_size *sz = ms_page_arena_get_size(a);
    const unsigned char *base = ms_page_arena_data(a);
    for (int32_t l = 0; l < ms_page_arena_get_config(a)->n_layers; l++) {
        const unsigned char *p = ms_page_arena_token_ptr(a, l, page, 0, 0);
        size_t off = (size_t)(p - base);
        if (memcmp(base + off, snap + off, sz->page_bytes) != 0)
            return true;
    }
    return false;
}

static void test_integration_F1_replay_40_tokens_on_64_token_graph(void **state) {
    (void)state;
    ifx f;
    ifx_init(&f, 128, 8, false, false);
    ms_graph_plan *g;
    ms_graph_plan_config gc = {1, MS_RID_DUMMY_BASE};
    ms_error err = {0};
    assert_int_equal(ms_graph_plan_init(&g, &gc, &err), MS_OK);
    int32_t b;
    assert_int_equal(ms_graph_plan_add_bucket(g, 1, 4, 64, &b, &err), MS_OK);
    capture_bucket(&f, g, b, 1);
    for (ms_rid rid = 1; rid <= 8; rid++)
        ifx_ingest(&f, rid);
    /* step A: another full batch fills all 64 addresses with its own pages */
    ms_slot_lease l;
    ms_rid rows[4];
    int32_t n;
    istep s;
    assert_int_equal(ms_graph_plan_lease(g, 1, 4, 64, &l, &err), MS_OK);
    assert_int_equal(ms_graph_plan_step_ids(g, &l, (ms_rid[]){5, 6, 7, 8}, 4, rows, 4, &n, &err),
                     MS_OK);
    graph_step(&f, g, &l, rows, (int32_t[]){16, 16, 16, 16}, 4, 4, false, &s);
    const ms_graph_kv_state *st = ms_graph_plan_kv_state(g, R_KV, 0, MS_LABEL_MAIN);
    for (int32_t t = 0; t < 64; t++)
        assert_int_not_equal(st->token_to_page[t], MS_SINK_PAGE);
    /* step B: a full batch (no padding row) with 40 real tokens replays the 64-token graph */
    assert_int_equal(ms_graph_plan_lease(g, 1, 4, 40, &l, &err), MS_OK);
    assert_int_equal(l.n_tokens, 64);
    assert_int_equal(ms_graph_plan_step_ids(g, &l, (ms_rid[]){1, 2, 3, 4}, 4, rows, 4, &n, &err),
                     MS_OK);
    graph_step(&f, g, &l, rows, (int32_t[]){9, 11, 12, 8}, 4, 4, false, &s);
    const ms_kv_plan *kp = &kv_set(&s)->plans[0];
    /* the captured scatter writes all 64 addresses; do exactly that on the real arena */
    unsigned char *snap = arena_snapshot(f.kv.arena);
    for (int32_t t = 0; t < st->capacity; t++)
        kv_write_token(f.kv.arena, st->token_to_page[t], st->token_to_slot[t], 1000.0f + (float)t);
    bool sink_written = false;
    int32_t n_pages = ms_page_arena_num_pages(f.kv.arena);
    for (int32_t p = 0; p < n_pages; p++) {
        if (!page_changed(f.kv.arena, snap, p))
            continue;
        if (p == MS_SINK_PAGE) {
            sink_written = true;
            continue;
        }
        bool own = false;
        for (int32_t v = 0; v < kp->n_views; v++)
            for (int32_t k = 0; k < kp->views[v].n_pages; k++)
                own = own || kp->views[v].pages[k] == p;
        if (!own)
            fail_msg("padding scattered into page %d, which batch B does not own", p);
    }
    assert_true(sink_written);
    /* and every real token landed at its own address */
    for (int32_t t = 0; t < 40; t++)
        assert_true(kv_token_is(f.kv.arena, kp->token_to_page[t], kp->token_to_slot[t],
                                1000.0f + (float)t));
    ms_free(snap);
    for (ms_rid rid = 1; rid <= 8; rid++)
        ms_step_runner_remove(f.r, rid);
    ms_graph_plan_remove_dummies(g, f.r);
    ms_graph_plan_free(g);
    ifx_free(&f);
}

static void test_integration_H13_1000_padded_replays(void **state) {
    (void)state;
    ifx f;
    ifx_init(&f, 128, 16, false, false);
    ms_graph_plan *g;
    ms_graph_plan_config gc = {2, MS_RID_DUMMY_BASE};
    ms_error err = {0};
    assert_int_equal(ms_graph_plan_init(&g, &gc, &err), MS_OK);
    int32_t b;
    assert_int_equal(ms_graph_plan_add_bucket(g, 0, 4, 4, &b, &err), MS_OK);
    capture_bucket(&f, g, b, 2);
    ifx_ingest(&f, 1);
    int32_t free_start = ms_page_arena_num_free(f.kv.arena);
    for (int step = 0; step < 1000; step++) {
        ms_slot_lease l;
        ms_rid rows[4];
        int32_t n;
        assert_int_equal(ms_graph_plan_lease(g, 0, 1, 1, &l, &err), MS_OK);
        assert_int_equal(ms_graph_plan_step_ids(g, &l, (ms_rid[]){1}, 1, rows, 4, &n, &err),
                         MS_OK);
        istep s;
        graph_step(&f, g, &l, rows, (int32_t[]){1, 1, 1, 1}, 4, 1, false, &s);
        assert_int_equal(ms_attn_plan_find(attn_plan(&s), 0)->kind, MS_ATTN_DECODE);
        const ms_graph_pos_state *ps = ms_graph_plan_pos_state(g, R_POS, l.slot, 0);
        assert_int_equal(ps->ids[0], step);
        for (int32_t i = 1; i < 4; i++)
            assert_int_equal(ps->ids[i], 0); /* padding rows always at position 0 */
        ms_graph_plan_release(g, f.r, &l, 1);
    }
    for (int32_t slot = 0; slot < 2; slot++)
        for (int32_t i = 1; i < 4; i++) {
            ms_rid d = ms_graph_plan_dummy_rid(g, slot, i);
            assert_int_equal(position(&f, d, 0), 0);
            assert_int_equal(kv_info(&f.kv, d, 0).stored, 0);
        }
    assert_int_equal(position(&f, 1, 0), 1000);
    /* padding rows took no page in 1000 replays: only the real stream grew (63 pages) */
    assert_int_equal(free_start - ms_page_arena_num_free(f.kv.arena), 63);
    ms_step_runner_remove(f.r, 1);
    ms_graph_plan_remove_dummies(g, f.r);
    kv_check_pages(&f.kv);
    ms_graph_plan_free(g);
    ifx_free(&f);
}

static void test_integration_F6_dropped_preplan_leaves_nothing_behind(void **state) {
    (void)state;
    ifx f;
    ifx_init(&f, 64, 4, false, false);
    ms_graph_plan *g;
    ms_graph_plan_config gc = {2, MS_RID_DUMMY_BASE};
    ms_error err = {0};
    assert_int_equal(ms_graph_plan_init(&g, &gc, &err), MS_OK);
    int32_t b;
    assert_int_equal(ms_graph_plan_add_bucket(g, 0, 2, 2, &b, &err), MS_OK);
    capture_bucket(&f, g, b, 2);
    ifx_ingest(&f, 1);
    ifx_ingest(&f, 2);
    istep s;
    istep_init(&s, &f, "prefill", true);
    istep_seg(&s, 1, 0, 5);
    istep_seg(&s, 2, 0, 3);
    istep_run(&f, &s);
    int32_t free0 = ms_page_arena_num_free(f.kv.arena);
    /* plan thread: pre-plan decode step N+1 for batch {1} (+ padding) with a pre-fork main -> 1
     * (a CFG branch snapshot) */
    ms_slot_lease l;
    ms_rid rows[2];
    int32_t n;
    assert_int_equal(ms_graph_plan_lease(g, 0, 1, 1, &l, &err), MS_OK);
    assert_int_equal(ms_graph_plan_step_ids(g, &l, (ms_rid[]){1}, 1, rows, 2, &n, &err), MS_OK);
    istep pre;
    istep_init(&pre, &f, "decode_cfg", true);
    istep_seg(&pre, rows[0], 0, 1);
    istep_seg(&pre, rows[1], 0, 1);
    ms_fork fk = {0, 1};
    pre.ks.pre_forks = &fk;
    pre.ks.n_pre_forks = 1;
    pre.ctx.n_real = 1;
    pre.ctx.lease = &l;
    pre.ctx.is_preplan = true;
    uint64_t h = ms_step_hash(&pre.step);
    assert_int_equal(ms_graph_plan_preplan_begin(g, &l, rows, 2, h, &err), MS_OK);
    assert_int_equal(istep_admit(&f, &pre).code, MS_ADMIT_OK);
    assert_int_equal(ms_step_runner_plan(f.r, &pre.step, &pre.ctx, &err), MS_OK);
    assert_int_equal(ms_graph_plan_stage_step(g, f.r, &pre.ctx, &err), MS_OK);
    ms_graph_plan_preplan_finish(g, true);
    assert_int_equal(kv_info(&f.kv, 1, 1).stored, 5); /* fork applied at plan */
    assert_int_equal(position(&f, 1, 1), 5);
    assert_true(ms_page_arena_num_free(f.kv.arena) < free0);
    /* GPU thread: request 1 was dropped from the batch; the pre-plan is refused, then dropped */
    ms_rid other[2];
    assert_int_equal(ms_graph_plan_step_ids(g, &l, (ms_rid[]){2}, 1, other, 2, &n, &err), MS_OK);
    assert_int_equal(ms_graph_plan_preplan_take(g, &l, other, 2, h, &err), MS_ERR_STATE);
    assert_true(ms_graph_plan_preplan_abandon(g));
    ms_step_runner_abandon(f.r, &pre.step, &pre.ctx);
    ms_graph_plan_release(g, f.r, &l, 1);
    /* nothing of it remains: pages back, fork target and its position as before */
    assert_int_equal(ms_page_arena_num_free(f.kv.arena), free0);
    assert_int_equal(position(&f, 1, 1), 0);
    ms_kv_stream_info info;
    if (ms_kv_pool_stream_info(f.kv.pool, 1, 1, &info) == MS_OK)
        assert_int_equal(info.stored, 0);
    assert_int_equal(kv_info(&f.kv, 1, 0).stored, 5);
    assert_int_equal(position(&f, 1, 0), 5);
    assert_false(kv_info(&f.kv, 1, 0).step_in_flight);
    kv_check_pages(&f.kv);
    ms_step_runner_remove(f.r, 1);
    ms_step_runner_remove(f.r, 2);
    ms_graph_plan_remove_dummies(g, f.r);
    ms_graph_plan_free(g);
    ifx_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_integration_prefill_then_decode),
        ms_unit_test(test_integration_cfg_combined_label_and_forks),
        ms_unit_test(test_integration_H14_noncommitting_steps_move_nothing),
        ms_unit_test(test_integration_H2_later_resource_failure_rolls_back_kv),
        ms_unit_test(test_integration_cross_context_written_once),
        ms_unit_test(test_integration_F5_decode_node_continues_from_published_state),
        ms_unit_test(test_integration_F1_replay_40_tokens_on_64_token_graph),
        ms_unit_test(test_integration_H13_1000_padded_replays),
        ms_unit_test(test_integration_F6_dropped_preplan_leaves_nothing_behind),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
