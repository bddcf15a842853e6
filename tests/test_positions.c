/*
 * test_positions.c - positions resource (reference §9 item 19; hazards F5, H13 counters, H14):
 * ids in KV packed order, schemes (sequential, block, explicit M-RoPE), custom advance, advance 0
 * when the KV step does not commit, forks mirrored from the KV plan set, publish/retrieve by
 * maximum, reset, accessor and error paths. Driven through the step runner over the KV mock.
 */
#include "ms_test.h"

#include <string.h>

#include "kv_mock.h"
#include "positions.h"
#include "step_runner.h"

#include "ms_test_impl.h"

/* ---- fixture ---- */

typedef struct fx {
    ms_step_runner *r;
    mock_kv *kv;
    ms_positions *pos;
    int ikv, ipos;
    ms_step_ctx ctx;
} fx;

static const char *const deps_kv[] = {"kv"};

static void fx_init(fx *f, ms_positions_config pc) {
    memset(f, 0, sizeof *f);
    mock_kv_config kc = {8, 64};
    pc.kv_key = "kv";
    ms_resource_spec specs[] = {
        {"pos", MS_RESOURCE_POS, deps_kv, 1, ms_positions_build, &pc, NULL, NULL},
        {"kv", MS_RESOURCE_KV, NULL, 0, mock_kv_build, &kc, NULL, NULL},
    };
    ms_error err = {0};
    assert_int_equal(ms_step_runner_init(&f->r, specs, 2, &err), MS_OK);
    f->ikv = ms_step_runner_index(f->r, "kv");
    f->ipos = ms_step_runner_index(f->r, "pos");
    f->kv = ms_step_runner_resource(f->r, f->ikv);
    f->pos = ms_step_runner_resource(f->r, f->ipos);
}

static void fx_free(fx *f) { ms_step_runner_free(f->r); }

static void fx_ingest(fx *f, ms_rid rid) {
    ms_error err = {0};
    assert_int_equal(ms_step_runner_ingest(f->r, rid, NULL, &err), MS_OK);
}

/* Admit + plan (+ commit when `commit_too`) one step; returns the positions plan. */
static const ms_pos_plan *fx_step(fx *f, const ms_segment *segs, int32_t n, const ms_kv_step *ks,
                                  const ms_pos_step *ps, bool commit_too) {
    ms_step step = {.name = "t", .segments = segs, .n_segments = n};
    step.records[f->ikv].rec = ks;
    step.records[f->ipos].rec = ps;
    memset(&f->ctx, 0, sizeof f->ctx);
    ms_admit_outcome o = ms_step_runner_admit(f->r, &step, &f->ctx);
    assert_int_equal(o.code, MS_ADMIT_OK);
    ms_error err = {0};
    ms_status st = ms_step_runner_plan(f->r, &step, &f->ctx, &err);
    if (st != MS_OK)
        fprintf(stderr, "plan: %s\n", err.msg);
    assert_int_equal(st, MS_OK);
    const ms_pos_plan *pp = f->ctx.plan_results[f->ipos];
    if (commit_too)
        assert_int_equal(ms_step_runner_commit(f->r, &step, &f->ctx, &err), MS_OK);
    return pp;
}

static int32_t fx_pos(fx *f, ms_rid rid, ms_label label) {
    int32_t p = -1;
    assert_int_equal(ms_positions_position(f->pos, rid, label, &p, NULL), MS_OK);
    return p;
}

static void assert_ids(const ms_pos_plan *pp, const int32_t *want, int32_t n) {
    assert_int_equal(pp->n_tokens, n);
    for (int32_t i = 0; i < n; i++)
        assert_int_equal(pp->ids[i], want[i]);
}

static const ms_kv_step KV_COMMIT = {.commit = true};
static const ms_kv_step KV_NOCOMMIT = {.commit = false};
static const ms_pos_step POS_DEFAULT = {.n_axes = 1};

static ms_positions_config seq_cfg(void) {
    return (ms_positions_config){MS_POS_SEQUENTIAL, 1, 1, 256, NULL};
}

/* ---- §9 item 19 ---- */

static void test_ids_follow_segment_order_and_counters(void **state) {
    (void)state;
    fx f;
    fx_init(&f, seq_cfg());
    fx_ingest(&f, 1);
    fx_ingest(&f, 2);
    ms_segment pre[] = {{1, 0, 5}};
    fx_step(&f, pre, 1, &KV_COMMIT, &POS_DEFAULT, true);
    assert_int_equal(fx_pos(&f, 1, 0), 5);
    ms_segment segs[] = {{1, 0, 3}, {2, 0, 2}};
    const ms_pos_plan *pp = fx_step(&f, segs, 2, &KV_COMMIT, &POS_DEFAULT, true);
    assert_ids(pp, (int32_t[]){5, 6, 7, 0, 1}, 5);
    assert_int_equal(fx_pos(&f, 1, 0), 8);
    assert_int_equal(fx_pos(&f, 2, 0), 2);
    fx_free(&f);
}

static void test_zero_span_contributes_no_ids_and_no_advance(void **state) {
    (void)state;
    fx f;
    fx_init(&f, seq_cfg());
    fx_ingest(&f, 1);
    fx_ingest(&f, 2);
    ms_segment a[] = {{1, 0, 4}, {2, 0, 2}};
    fx_step(&f, a, 2, &KV_COMMIT, &POS_DEFAULT, true);
    ms_segment b[] = {{1, 0, 0}, {2, 0, 1}};
    const ms_pos_plan *pp = fx_step(&f, b, 2, &KV_COMMIT, &POS_DEFAULT, true);
    assert_ids(pp, (int32_t[]){2}, 1);
    assert_int_equal(fx_pos(&f, 1, 0), 4);
    assert_int_equal(fx_pos(&f, 2, 0), 3);
    fx_free(&f);
}

static void test_custom_advance_per_segment(void **state) {
    (void)state;
    fx f;
    fx_init(&f, seq_cfg());
    fx_ingest(&f, 1);
    fx_ingest(&f, 2);
    ms_segment segs[] = {{1, 0, 4}, {2, 0, 4}};
    int32_t adv[] = {10, 1};
    ms_pos_step ps = {.advance = adv, .n_axes = 1};
    const ms_pos_plan *pp = fx_step(&f, segs, 2, &KV_COMMIT, &ps, true);
    /* ids still from the scheme; only the counter moves by the override */
    assert_ids(pp, (int32_t[]){0, 1, 2, 3, 0, 1, 2, 3}, 8);
    assert_int_equal(fx_pos(&f, 1, 0), 10);
    assert_int_equal(fx_pos(&f, 2, 0), 1);
    ms_segment next[] = {{1, 0, 1}, {2, 0, 1}};
    pp = fx_step(&f, next, 2, &KV_COMMIT, &POS_DEFAULT, true);
    assert_ids(pp, (int32_t[]){10, 1}, 2);
    fx_free(&f);
}

static void test_batched_cfg_advances_every_label(void **state) {
    (void)state;
    fx f;
    fx_init(&f, seq_cfg());
    fx_ingest(&f, 1);
    fx_ingest(&f, 2);
    ms_segment pre[] = {{1, 0, 3}, {1, 1, 2}, {2, 0, 1}, {2, 1, 4}};
    fx_step(&f, pre, 4, &KV_COMMIT, &POS_DEFAULT, true);
    /* decode: combined plan label 7 over labels 0 and 1, label-major */
    ms_combined_label cl = {{0, 1}, 2, 7};
    ms_kv_step ks = {.commit = true, .combined = &cl, .n_combined = 1};
    ms_segment segs[] = {{1, 0, 1}, {2, 0, 1}, {1, 1, 1}, {2, 1, 1}};
    const ms_pos_plan *pp = fx_step(&f, segs, 4, &ks, &POS_DEFAULT, true);
    assert_int_equal(pp->n_plans, 1);
    assert_int_equal(pp->plan_labels[0], 7);
    assert_ids(pp, (int32_t[]){3, 1, 2, 4}, 4);
    int32_t n;
    const int32_t *ids = ms_pos_plan_ids(pp, 7, 0, &n);
    assert_non_null(ids);
    assert_int_equal(n, 4);
    assert_null(ms_pos_plan_ids(pp, 0, 0, &n));
    assert_int_equal(fx_pos(&f, 1, 0), 4);
    assert_int_equal(fx_pos(&f, 1, 1), 3);
    assert_int_equal(fx_pos(&f, 2, 0), 2);
    assert_int_equal(fx_pos(&f, 2, 1), 5);
    fx_free(&f);
}

static void test_separate_plan_labels_pack_in_set_order(void **state) {
    (void)state;
    fx f;
    fx_init(&f, seq_cfg());
    fx_ingest(&f, 1);
    fx_ingest(&f, 2);
    ms_segment segs[] = {{1, 2, 2}, {2, 0, 1}, {1, 0, 3}};
    const ms_pos_plan *pp = fx_step(&f, segs, 3, &KV_COMMIT, &POS_DEFAULT, true);
    assert_int_equal(pp->n_plans, 2);
    assert_int_equal(pp->plan_labels[0], 2);
    assert_int_equal(pp->plan_labels[1], 0);
    assert_ids(pp, (int32_t[]){0, 1, 0, 0, 1, 2}, 6);
    int32_t n;
    const int32_t *ids = ms_pos_plan_ids(pp, 0, 0, &n);
    assert_int_equal(n, 4);
    assert_int_equal(ids[3], 2);
    fx_free(&f);
}

static void test_explicit_ids_pass_through(void **state) {
    (void)state;
    fx f;
    fx_init(&f, seq_cfg());
    fx_ingest(&f, 1);
    ms_segment segs[] = {{1, 0, 3}};
    int32_t ids[] = {7, 7, 9};
    int32_t adv[] = {3};
    ms_pos_step ps = {.advance = adv, .explicit_ids = ids, .n_axes = 1};
    const ms_pos_plan *pp = fx_step(&f, segs, 1, &KV_COMMIT, &ps, true);
    assert_ids(pp, ids, 3);
    assert_int_equal(fx_pos(&f, 1, 0), 3);
    fx_free(&f);
}

/* explicit ids without a custom advance: the stream continues one past its largest id on any
 * axis (Qwen2-VL: text after a t/h/w grid starts at max + 1), per stream of the step; text ids
 * counting up give the span; a non-committing step moves nothing */
static void test_explicit_ids_advance_to_max_plus_one(void **state) {
    (void)state;
    fx f;
    ms_positions_config pc = {MS_POS_EXPLICIT, 1, 3, 256, NULL};
    fx_init(&f, pc);
    fx_ingest(&f, 1);
    fx_ingest(&f, 2);
    /* request 1: 2 text tokens and a 1x2x2 grid at 2 (max 3: h/w reach 3); request 2: 3 text */
    ms_segment segs[] = {{1, 0, 6}, {2, 0, 3}};
    int32_t ids[] = {0, 1, 2, 2, 2, 2, 0, 1, 2, /* t */
                     0, 1, 2, 2, 3, 3, 0, 1, 2, /* h */
                     0, 1, 2, 3, 2, 3, 0, 1, 2 /* w */};
    ms_pos_step ps = {.explicit_ids = ids, .n_axes = 3};
    fx_step(&f, segs, 2, &KV_COMMIT, &ps, true);
    assert_int_equal(fx_pos(&f, 1, 0), 4); /* max 3 + 1, not the 6 tokens */
    assert_int_equal(fx_pos(&f, 2, 0), 3); /* text: the span */
    /* the next text token of request 1 gets 4 on every axis */
    ms_segment one[] = {{1, 0, 1}};
    ms_pos_step text = {.n_axes = 3};
    const ms_pos_plan *pp = fx_step(&f, one, 1, &KV_COMMIT, &text, true);
    assert_ids(pp, (int32_t[]){4, 4, 4}, 1);
    assert_int_equal(fx_pos(&f, 1, 0), 5);
    /* explicit ids on a step that does not commit leave the counter */
    static const ms_kv_step no_commit = {.commit = false};
    int32_t far[] = {40, 40, 40};
    ms_pos_step ex = {.explicit_ids = far, .n_axes = 3};
    fx_step(&f, one, 1, &no_commit, &ex, true);
    assert_int_equal(fx_pos(&f, 1, 0), 5);
    fx_free(&f);
}

static void test_block_scheme_shares_position_and_steps_per_segment(void **state) {
    (void)state;
    fx f;
    ms_positions_config pc = {MS_POS_BLOCK, 2, 1, 256, NULL};
    fx_init(&f, pc);
    fx_ingest(&f, 1);
    fx_ingest(&f, 2);
    ms_segment a[] = {{1, 0, 4}, {2, 0, 0}};
    const ms_pos_plan *pp = fx_step(&f, a, 2, &KV_COMMIT, &POS_DEFAULT, true);
    assert_ids(pp, (int32_t[]){0, 0, 0, 0}, 4);
    assert_int_equal(fx_pos(&f, 1, 0), 2); /* one step of 2 for the non-empty segment */
    assert_int_equal(fx_pos(&f, 2, 0), 0); /* empty segment: no advance */
    ms_segment b[] = {{1, 0, 3}};
    pp = fx_step(&f, b, 1, &KV_COMMIT, &POS_DEFAULT, true);
    assert_ids(pp, (int32_t[]){2, 2, 2}, 3);
    /* positions differ from token counts across commits: 7 tokens, position 4 */
    assert_int_equal(fx_pos(&f, 1, 0), 4);
    assert_int_equal(mock_stored(f.kv, 1, 0), 7);
    fx_free(&f);
}

static void test_explicit_mrope_three_axes_with_custom_advance(void **state) {
    (void)state;
    fx f;
    ms_positions_config pc = {MS_POS_EXPLICIT, 1, 3, 256, NULL};
    fx_init(&f, pc);
    fx_ingest(&f, 1);
    /* text prefix without explicit ids: sequential ids repeated on the three axes */
    ms_segment t[] = {{1, 0, 2}};
    ms_pos_step text = {.n_axes = 3};
    const ms_pos_plan *pp = fx_step(&f, t, 1, &KV_COMMIT, &text, true);
    assert_int_equal(pp->n_axes, 3);
    assert_ids(pp, (int32_t[]){0, 1, 0, 1, 0, 1}, 2);
    /* vision grid 1x2x2: 4 tokens, t/h/w ids supplied, advance = grid extent 2 */
    ms_segment v[] = {{1, 0, 4}};
    int32_t ids[] = {2, 2, 2, 2, /* t */ 2, 2, 3, 3, /* h */ 2, 3, 2, 3 /* w */};
    int32_t adv[] = {2};
    ms_pos_step vis = {.advance = adv, .explicit_ids = ids, .n_axes = 3};
    pp = fx_step(&f, v, 1, &KV_COMMIT, &vis, true);
    assert_int_equal(pp->n_tokens, 4);
    for (int i = 0; i < 12; i++)
        assert_int_equal(pp->ids[i], ids[i]);
    int32_t n;
    const int32_t *w = ms_pos_plan_ids(pp, 0, 2, &n);
    assert_int_equal(n, 4);
    assert_int_equal(w[1], 3);
    assert_int_equal(fx_pos(&f, 1, 0), 4);
    /* wrong axis count is rejected with a message */
    int32_t one[] = {0, 1, 2, 3};
    ms_pos_step bad = {.explicit_ids = one, .n_axes = 1};
    ms_step step = {.name = "vision", .segments = v, .n_segments = 1};
    step.records[f.ikv].rec = &KV_COMMIT;
    step.records[f.ipos].rec = &bad;
    ms_step_ctx ctx = {0};
    assert_int_equal(ms_step_runner_admit(f.r, &step, &ctx).code, MS_ADMIT_OK);
    ms_error err = {0};
    assert_int_equal(ms_step_runner_plan(f.r, &step, &ctx, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "step vision: pos: positions: explicit ids have 1 axes"));
    fx_free(&f);
}

/* ---- H14 ---- */

static void test_H14_advance_zero_when_kv_does_not_commit(void **state) {
    (void)state;
    fx f;
    fx_init(&f, seq_cfg());
    fx_ingest(&f, 1);
    ms_segment pre[] = {{1, 0, 6}};
    fx_step(&f, pre, 1, &KV_COMMIT, &POS_DEFAULT, true);
    /* denoise-like step: real span, KV does not commit -> counter unchanged, ids still planned */
    ms_segment d[] = {{1, 0, 4}};
    for (int rep = 0; rep < 3; rep++) {
        const ms_pos_plan *pp = fx_step(&f, d, 1, &KV_NOCOMMIT, &POS_DEFAULT, true);
        assert_ids(pp, (int32_t[]){6, 7, 8, 9}, 4);
        assert_int_equal(fx_pos(&f, 1, 0), 6);
        assert_int_equal(mock_stored(f.kv, 1, 0), 6);
    }
    /* explicit zero advance is fine; a non-zero one is rejected at plan and changes nothing */
    int32_t zero[] = {0};
    ms_pos_step z = {.advance = zero, .n_axes = 1};
    fx_step(&f, d, 1, &KV_NOCOMMIT, &z, true);
    assert_int_equal(fx_pos(&f, 1, 0), 6);
    int32_t four[] = {4};
    ms_pos_step bad = {.advance = four, .n_axes = 1};
    ms_step step = {.name = "denoise", .segments = d, .n_segments = 1};
    step.records[f.ikv].rec = &KV_NOCOMMIT;
    step.records[f.ipos].rec = &bad;
    ms_step_ctx ctx = {0};
    assert_int_equal(ms_step_runner_admit(f.r, &step, &ctx).code, MS_ADMIT_OK);
    ms_error err = {0};
    assert_int_equal(ms_step_runner_plan(f.r, &step, &ctx, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "does not commit"));
    assert_int_equal(fx_pos(&f, 1, 0), 6);
    fx_free(&f);
}

/* ---- forks (F5) ---- */

static void test_F5_pre_fork_mirrors_counter_at_plan(void **state) {
    (void)state;
    fx f;
    fx_init(&f, seq_cfg());
    fx_ingest(&f, 1);
    ms_segment pre[] = {{1, 0, 9}};
    fx_step(&f, pre, 1, &KV_COMMIT, &POS_DEFAULT, true);
    ms_fork fk = {0, 3};
    ms_kv_step ks = {.commit = true, .pre_forks = &fk, .n_pre_forks = 1};
    ms_segment segs[] = {{1, 3, 2}};
    ms_rid rows[] = {1};
    ms_step step = {.name = "cfg_prefill", .segments = segs, .n_segments = 1};
    step.records[f.ikv].rec = &ks;
    step.records[f.ipos].rec = &POS_DEFAULT;
    ms_step_ctx ctx = {.request_ids = rows, .n_rows = 1, .n_real = 1};
    assert_int_equal(ms_step_runner_admit(f.r, &step, &ctx).code, MS_ADMIT_OK);
    assert_int_equal(fx_pos(&f, 1, 3), 0); /* not mirrored at admit */
    ms_error err = {0};
    assert_int_equal(ms_step_runner_plan(f.r, &step, &ctx, &err), MS_OK);
    const ms_pos_plan *pp = ctx.plan_results[f.ipos];
    assert_ids(pp, (int32_t[]){9, 10}, 2); /* the fork target continues from the source */
    assert_int_equal(ms_step_runner_commit(f.r, &step, &ctx, &err), MS_OK);
    assert_int_equal(fx_pos(&f, 1, 3), 11);
    assert_int_equal(fx_pos(&f, 1, 0), 9);
    fx_free(&f);
}

static void test_F6_abandoned_step_undoes_pre_fork_mirror(void **state) {
    (void)state;
    fx f;
    fx_init(&f, seq_cfg());
    fx_ingest(&f, 1);
    fx_ingest(&f, 2);
    ms_segment pre[] = {{1, 0, 9}, {2, 0, 4}, {2, 3, 1}};
    fx_step(&f, pre, 3, &KV_COMMIT, &POS_DEFAULT, true);
    ms_fork fk = {0, 3};
    ms_kv_step ks = {.commit = true, .pre_forks = &fk, .n_pre_forks = 1};
    ms_segment segs[] = {{1, 3, 2}, {2, 3, 1}};
    ms_rid rows[] = {1, 2};
    ms_step step = {.name = "preplanned", .segments = segs, .n_segments = 2};
    step.records[f.ikv].rec = &ks;
    step.records[f.ipos].rec = &POS_DEFAULT;
    ms_step_ctx ctx = {.request_ids = rows, .n_rows = 2, .n_real = 2, .is_preplan = true};
    ms_error err = {0};
    assert_int_equal(ms_step_runner_admit(f.r, &step, &ctx).code, MS_ADMIT_OK);
    assert_int_equal(ms_step_runner_plan(f.r, &step, &ctx, &err), MS_OK);
    assert_int_equal(fx_pos(&f, 1, 3), 9); /* mirrored at plan */
    assert_int_equal(fx_pos(&f, 2, 3), 4);
    /* a re-plan of the same step mirrors again without losing the pre-step values */
    assert_int_equal(ms_step_runner_plan(f.r, &step, &ctx, &err), MS_OK);
    /* the pre-plan is dropped: the mirrors are undone, as KV undoes its fork copies */
    ms_step_runner_abandon(f.r, &step, &ctx);
    assert_int_equal(fx_pos(&f, 1, 3), 0);
    assert_int_equal(fx_pos(&f, 2, 3), 1);
    /* rollback of another step, or a second time, changes nothing */
    ms_step_runner_abandon(f.r, &step, &ctx);
    assert_int_equal(fx_pos(&f, 2, 3), 1);
    /* run it for real: the mirror stays after commit, a late rollback cannot undo it */
    assert_int_equal(ms_step_runner_admit(f.r, &step, &ctx).code, MS_ADMIT_OK);
    assert_int_equal(ms_step_runner_plan(f.r, &step, &ctx, &err), MS_OK);
    assert_int_equal(ms_step_runner_commit(f.r, &step, &ctx, &err), MS_OK);
    ms_positions_iface.admit_rollback(f.pos, f.ipos, &step, &ctx);
    assert_int_equal(fx_pos(&f, 1, 3), 11);
    assert_int_equal(fx_pos(&f, 2, 3), 5);
    fx_free(&f);
}

static void test_F5_post_fork_mirrors_counter_after_commit(void **state) {
    (void)state;
    fx f;
    fx_init(&f, seq_cfg());
    fx_ingest(&f, 1);
    fx_ingest(&f, 2);
    ms_fork fk = {0, 1};
    ms_kv_step ks = {.commit = true, .post_forks = &fk, .n_post_forks = 1};
    ms_segment segs[] = {{1, 0, 5}, {2, 0, 3}};
    ms_rid rows[] = {1, 2};
    ms_step step = {.name = "prefill_vit", .segments = segs, .n_segments = 2};
    step.records[f.ikv].rec = &ks;
    step.records[f.ipos].rec = &POS_DEFAULT;
    ms_step_ctx ctx = {.request_ids = rows, .n_rows = 2, .n_real = 2};
    assert_int_equal(ms_step_runner_admit(f.r, &step, &ctx).code, MS_ADMIT_OK);
    ms_error err = {0};
    assert_int_equal(ms_step_runner_plan(f.r, &step, &ctx, &err), MS_OK);
    assert_int_equal(fx_pos(&f, 1, 1), 0); /* not at plan */
    assert_int_equal(ms_step_runner_commit(f.r, &step, &ctx, &err), MS_OK);
    /* the target sees the committed length: 5 and 3, same as KV */
    assert_int_equal(fx_pos(&f, 1, 1), 5);
    assert_int_equal(fx_pos(&f, 2, 1), 3);
    assert_int_equal(mock_stored(f.kv, 1, 1), 5);
    fx_free(&f);
}

static void test_F5_publish_retrieve_by_maximum(void **state) {
    (void)state;
    fx a, b;
    fx_init(&a, seq_cfg());
    fx_init(&b, seq_cfg());
    fx_ingest(&a, 1);
    fx_ingest(&b, 1);
    ms_segment pre[] = {{1, 0, 12}, {1, 2, 3}};
    fx_step(&a, pre, 2, &KV_COMMIT, &POS_DEFAULT, true);
    ms_published pub;
    ms_error err = {0};
    assert_int_equal(ms_step_runner_publish(a.r, 1, &pub, &err), MS_OK);
    assert_int_equal(pub.n, 1); /* the mock KV publishes nothing */
    assert_string_equal(pub.items[0].key, "pos");
    /* published data is a copy: later changes on A don't alter it */
    ms_segment more[] = {{1, 0, 1}};
    fx_step(&a, more, 1, &KV_COMMIT, &POS_DEFAULT, true);
    assert_int_equal(((ms_pos_published *)pub.items[0].data)->counter[0], 12);
    /* B imports: its next plan starts where A's was */
    assert_int_equal(ms_step_runner_admit_retrieve(b.r, 1, &pub).code, MS_ADMIT_OK);
    assert_int_equal(fx_pos(&b, 1, 0), 12);
    assert_int_equal(fx_pos(&b, 1, 2), 3);
    ms_segment dec[] = {{1, 0, 1}};
    const ms_pos_plan *pp = fx_step(&b, dec, 1, &KV_COMMIT, &POS_DEFAULT, true);
    assert_ids(pp, (int32_t[]){12}, 1);
    /* a stale publish (12) arriving after B moved to 13 never rewinds */
    assert_int_equal(ms_step_runner_admit_retrieve(b.r, 1, &pub).code, MS_ADMIT_OK);
    assert_int_equal(fx_pos(&b, 1, 0), 13);
    /* merge keeps the max per label */
    ms_pos_published x = {{0}}, y = {{0}};
    x.counter[0] = 5;
    x.counter[1] = 9;
    y.counter[0] = 7;
    ms_pos_published_merge(&x, &y);
    assert_int_equal(x.counter[0], 7);
    assert_int_equal(x.counter[1], 9);
    /* unknown request: publishes nothing; retrieve into unknown request is invalid */
    ms_published none;
    assert_int_equal(ms_step_runner_publish(a.r, 99, &none, &err), MS_OK);
    assert_int_equal(none.n, 0);
    ms_admit_outcome o = ms_step_runner_admit_retrieve(b.r, 99, &pub);
    assert_int_equal(o.code, MS_ADMIT_INVALID);
    assert_int_equal(o.resource, b.ipos);
    ms_published_free(&pub);
    fx_free(&a);
    fx_free(&b);
}

/* ---- lifecycle, accessor, errors ---- */

static void test_ingest_idempotent_reset_and_remove(void **state) {
    (void)state;
    fx f;
    fx_init(&f, seq_cfg());
    fx_ingest(&f, 1);
    ms_segment s[] = {{1, 0, 10}};
    fx_step(&f, s, 1, &KV_COMMIT, &POS_DEFAULT, true);
    fx_ingest(&f, 1);
    assert_int_equal(fx_pos(&f, 1, 0), 10);
    ms_step_runner_reset(f.r, 1, false);
    assert_int_equal(fx_pos(&f, 1, 0), 0);
    assert_int_equal(ms_positions_count(f.pos), 1);
    ms_step_runner_remove(f.r, 1);
    assert_int_equal(ms_positions_count(f.pos), 0);
    int32_t p;
    ms_error err = {0};
    assert_int_equal(ms_positions_position(f.pos, 1, 0, &p, &err), MS_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "request 1 not ingested"));
    assert_int_equal(ms_positions_position(f.pos, 1, MS_MAX_LABELS, &p, &err),
                     MS_ERR_INVALID_ARG);
    ms_step_runner_remove(f.r, 1); /* unknown: no-op */
    ms_step_runner_reset(f.r, 1, true);
    fx_free(&f);
}

static void test_plan_errors_leave_counters_unchanged(void **state) {
    (void)state;
    fx f;
    ms_positions_config pc = {MS_POS_SEQUENTIAL, 1, 1, 4, NULL};
    fx_init(&f, pc);
    fx_ingest(&f, 1);
    ms_segment big[] = {{1, 0, 5}};
    ms_step step = {.name = "prefill", .segments = big, .n_segments = 1};
    step.records[f.ikv].rec = &KV_COMMIT;
    step.records[f.ipos].rec = &POS_DEFAULT;
    ms_step_ctx ctx = {0};
    assert_int_equal(ms_step_runner_admit(f.r, &step, &ctx).code, MS_ADMIT_OK);
    ms_error err = {0};
    assert_int_equal(ms_step_runner_plan(f.r, &step, &ctx, &err), MS_ERR_CAPACITY);
    assert_non_null(strstr(err.msg, "max_tokens 4"));
    /* a plan without the KV plan set (KV not declared) is refused */
    ms_segment one[] = {{1, 0, 1}};
    ms_step nokv = {.name = "decode", .segments = one, .n_segments = 1};
    nokv.records[f.ipos].rec = &POS_DEFAULT;
    assert_int_equal(ms_step_runner_plan(f.r, &nokv, &ctx, &err), MS_ERR_STATE);
    assert_non_null(strstr(err.msg, "did not plan it"));
    /* negative custom advance */
    int32_t neg[] = {-1};
    ms_pos_step bad = {.advance = neg, .n_axes = 1};
    ms_step s2 = {.name = "decode", .segments = one, .n_segments = 1};
    s2.records[f.ikv].rec = &KV_COMMIT;
    s2.records[f.ipos].rec = &bad;
    assert_int_equal(ms_step_runner_plan(f.r, &s2, &ctx, &err), MS_ERR_INVALID_ARG);
    assert_int_equal(fx_pos(&f, 1, 0), 0);
    fx_free(&f);
}

static void test_init_rejects_bad_config_and_survives_oom(void **state) {
    (void)state;
    ms_positions *pos = NULL;
    ms_error err = {0};
    ms_positions_config c = {MS_POS_SEQUENTIAL, 1, 3, 16, NULL};
    assert_int_equal(ms_positions_init(&pos, &c, 0, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "n_axes 3 with scheme sequential"));
    c = (ms_positions_config){MS_POS_BLOCK, -1, 1, 16, NULL};
    assert_int_equal(ms_positions_init(&pos, &c, 0, &err), MS_ERR_INVALID_ARG);
    c = (ms_positions_config){MS_POS_SEQUENTIAL, 1, 1, 0, NULL};
    assert_int_equal(ms_positions_init(&pos, &c, 0, &err), MS_ERR_INVALID_ARG);
    c = (ms_positions_config){MS_POS_SEQUENTIAL, 1, 1, 16, NULL};
    assert_int_equal(ms_positions_init(&pos, &c, -1, &err), MS_ERR_INVALID_ARG);
    for (int nth = 1; nth <= 2; nth++) {
        ms_alloc_fail_nth(nth);
        assert_int_equal(ms_positions_init(&pos, &c, 0, &err), MS_ERR_OOM);
        assert_null(pos);
    }
    assert_int_equal(ms_positions_init(&pos, &c, 0, &err), MS_OK);
    ms_alloc_fail_nth(1);
    assert_int_equal(ms_positions_ingest(pos, 5, &err), MS_ERR_OOM);
    assert_int_equal(ms_positions_count(pos), 0);
    assert_int_equal(ms_positions_ingest(pos, 5, &err), MS_OK);
    ms_positions_free(pos);
    ms_positions_free(NULL);
    /* builder: kv_key must be a declared dependency */
    mock_kv_config kc = {8, 8};
    ms_positions_config pc = seq_cfg();
    pc.kv_key = "kv";
    ms_resource_spec specs[] = {
        {"kv", MS_RESOURCE_KV, NULL, 0, mock_kv_build, &kc, NULL, NULL},
        {"pos", MS_RESOURCE_POS, NULL, 0, ms_positions_build, &pc, NULL, NULL},
    };
    ms_step_runner *r = NULL;
    assert_int_equal(ms_step_runner_init(&r, specs, 2, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "building resource 'pos': resource 'pos': reads 'kv' but "
                                    "does not list it in its deps"));
    assert_null(r);
}

static void test_many_requests_map_growth_and_removal(void **state) {
    (void)state;
    ms_positions *pos;
    ms_positions_config c = seq_cfg();
    assert_int_equal(ms_positions_init(&pos, &c, 0, NULL), MS_OK);
    for (ms_rid r = 0; r < 2000; r++)
        assert_int_equal(ms_positions_ingest(pos, r * 7919u, NULL), MS_OK);
    ms_pos_published pub = {{0}};
    for (ms_rid r = 0; r < 2000; r++) {
        pub.counter[1] = (int32_t)r;
        assert_int_equal(ms_positions_retrieve(pos, r * 7919u, &pub, NULL), MS_OK);
    }
    for (ms_rid r = 0; r < 2000; r += 2)
        ms_positions_remove(pos, r * 7919u);
    assert_int_equal(ms_positions_count(pos), 1000);
    for (ms_rid r = 0; r < 2000; r++) {
        int32_t p = -1;
        ms_status st = ms_positions_position(pos, r * 7919u, 1, &p, NULL);
        if (r % 2 == 0) {
            assert_int_equal(st, MS_ERR_NOT_FOUND);
        } else {
            assert_int_equal(st, MS_OK);
            assert_int_equal(p, (int32_t)r);
        }
    }
    ms_positions_free(pos);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_ids_follow_segment_order_and_counters),
        ms_unit_test(test_zero_span_contributes_no_ids_and_no_advance),
        ms_unit_test(test_custom_advance_per_segment),
        ms_unit_test(test_batched_cfg_advances_every_label),
        ms_unit_test(test_separate_plan_labels_pack_in_set_order),
        ms_unit_test(test_explicit_ids_pass_through),
        ms_unit_test(test_explicit_ids_advance_to_max_plus_one),
        ms_unit_test(test_block_scheme_shares_position_and_steps_per_segment),
        ms_unit_test(test_explicit_mrope_three_axes_with_custom_advance),
        ms_unit_test(test_H14_advance_zero_when_kv_does_not_commit),
        ms_unit_test(test_F5_pre_fork_mirrors_counter_at_plan),
        ms_unit_test(test_F6_abandoned_step_undoes_pre_fork_mirror),
        ms_unit_test(test_F5_post_fork_mirrors_counter_after_commit),
        ms_unit_test(test_F5_publish_retrieve_by_maximum),
        ms_unit_test(test_ingest_idempotent_reset_and_remove),
        ms_unit_test(test_plan_errors_leave_counters_unchanged),
        ms_unit_test(test_init_rejects_bad_config_and_survives_oom),
        ms_unit_test(test_many_requests_map_growth_and_removal),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
