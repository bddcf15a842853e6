/*
 * test_cross_attn.c - cross-attention planning (reference §3.3, §9 item 11; hazard F3 part):
 * context written once (real span at the first step, refused afterwards, rolled back across
 * resources), zero-span reads see the full context, query packing from the query KV plan or own
 * segments, padding rows with empty context planned against the sink page, re-plan skipped when
 * unchanged, lease buffers created at capture. Driven with two KV mocks (self + context).
 */
#include "ms_test.h"

#include <string.h>

#include "cross_attn.h"
#include "graph_plan.h"
#include "kv_mock.h"
#include "step_runner.h"

#include "ms_test_impl.h"

enum { I_CROSS = 0, I_CTX = 1, I_KV = 2 };

typedef struct cfx {
    ms_step_runner *r;
    mock_kv *kv, *ctxkv;
    ms_cross *cross;
    ms_step_ctx ctx;
} cfx;

static const char *const deps_both[] = {"ctx_kv", "kv"};

static void cfx_init(cfx *f, const char *query_key) {
    memset(f, 0, sizeof *f);
    mock_kv_config kc = {4, 128};
    ms_cross_config cc = {"ctx_kv", query_key, MS_LABEL_MAIN, 8, 32};
    ms_resource_spec specs[] = {
        {"cross", MS_RESOURCE_CROSS, deps_both, 2, ms_cross_build, &cc, NULL, NULL},
        {"ctx_kv", MS_RESOURCE_KV, NULL, 0, mock_kv_build, &kc, NULL, NULL},
        {"kv", MS_RESOURCE_KV, NULL, 0, mock_kv_build, &kc, NULL, NULL},
    };
    ms_error err = {0};
    assert_int_equal(ms_step_runner_init(&f->r, specs, 3, &err), MS_OK);
    f->cross = ms_step_runner_resource(f->r, I_CROSS);
    f->ctxkv = ms_step_runner_resource(f->r, I_CTX);
    f->kv = ms_step_runner_resource(f->r, I_KV);
    for (ms_rid rid = 1; rid <= 3; rid++)
        assert_int_equal(ms_step_runner_ingest(f->r, rid, NULL, &err), MS_OK);
}

static void cfx_free(cfx *f) {
    for (ms_rid rid = 1; rid <= 3; rid++)
        ms_step_runner_remove(f->r, rid);
    ms_step_runner_free(f->r);
}

static const ms_kv_step KV_COMMIT = {.commit = true};
static const int cross_rec = 1;

/* One step: self segments q[nq] on "kv", context segments c[nc] on "ctx_kv". Returns the admit
 * outcome; plans and commits when admitted (plan status in *st). */
static ms_admit_outcome cfx_step(cfx *f, const ms_segment *q, int32_t nq, const ms_segment *c,
                                 int32_t nc, const ms_slot_lease *lease, bool capture,
                                 ms_status *st, ms_error *err) {
    ms_step step = {.name = "dec", .segments = q, .n_segments = nq};
    step.records[I_KV].rec = &KV_COMMIT;
    step.records[I_CTX].rec = &KV_COMMIT;
    step.records[I_CTX].segments = c;
    step.records[I_CTX].n_segments = nc;
    step.records[I_CROSS].rec = &cross_rec;
    memset(&f->ctx, 0, sizeof f->ctx);
    f->ctx.lease = lease;
    f->ctx.capture = capture;
    ms_admit_outcome o = ms_step_runner_admit(f->r, &step, &f->ctx);
    *st = MS_OK;
    if (o.code != MS_ADMIT_OK)
        return o;
    *st = ms_step_runner_plan(f->r, &step, &f->ctx, err);
    if (*st == MS_OK)
        *st = ms_step_runner_commit(f->r, &step, &f->ctx, err);
    return o;
}

static const ms_cross_plan_entry *centry(cfx *f, ms_label label) {
    const ms_cross_plan_set *cs = f->ctx.plan_results[I_CROSS];
    assert_non_null(cs);
    for (int32_t p = 0; p < cs->n_plans; p++)
        if (cs->plans[p].plan_label == label)
            return &cs->plans[p];
    return NULL;
}

/* ---- write once ---- */

static void test_context_written_once_then_zero_span_reads(void **state) {
    (void)state;
    cfx f;
    cfx_init(&f, "kv");
    ms_error err = {0};
    ms_status st;
    /* prefill: 3 prompt tokens each; contexts of 10 and 4 tokens written */
    ms_segment q[] = {{1, 0, 3}, {2, 0, 3}};
    ms_segment c[] = {{1, 0, 10}, {2, 0, 4}};
    assert_int_equal(cfx_step(&f, q, 2, c, 2, NULL, false, &st, &err).code, MS_ADMIT_OK);
    assert_int_equal(st, MS_OK);
    const ms_cross_buffers *b = centry(&f, 0)->buffers;
    assert_int_equal(b->n_rows, 2);
    assert_int_equal(b->qo_indptr[1], 3);
    assert_int_equal(b->qo_indptr[2], 6);
    assert_int_equal(b->kv_indptr[1], 3); /* 10 tokens at ps 4: 3 pages */
    assert_int_equal(b->kv_indptr[2], 4);
    assert_int_equal(b->kv_last_page_len[0], 2);
    assert_int_equal(b->kv_last_page_len[1], 4);
    bool written;
    assert_int_equal(ms_cross_context_written(f.cross, 1, &written, &err), MS_OK);
    assert_true(written);
    assert_int_equal(mock_stored(f.ctxkv, 1, 0), 10);
    /* decode: zero-span reads see the full context, nothing more is written */
    ms_segment qd[] = {{1, 0, 1}, {2, 0, 1}};
    ms_segment cd[] = {{1, 0, 0}, {2, 0, 0}};
    int32_t free_ctx = f.ctxkv->n_free;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(cfx_step(&f, qd, 2, cd, 2, NULL, false, &st, &err).code, MS_ADMIT_OK);
        assert_int_equal(st, MS_OK);
        b = centry(&f, 0)->buffers;
        assert_int_equal(b->qo_indptr[2], 2);
        assert_int_equal(b->kv_indptr[2], 4);
        assert_int_equal(b->kv_last_page_len[0], 2);
    }
    assert_int_equal(f.ctxkv->n_free, free_ctx);
    assert_int_equal(mock_stored(f.ctxkv, 1, 0), 10);
    /* a second write of the context is refused at admit; earlier resources roll back */
    int32_t free_self = f.kv->n_free;
    ms_segment c2[] = {{1, 0, 5}, {2, 0, 0}};
    ms_segment q2[] = {{1, 0, 8}, {2, 0, 1}};
    ms_admit_outcome o = cfx_step(&f, q2, 2, c2, 2, NULL, false, &st, &err);
    assert_int_equal(o.code, MS_ADMIT_INVALID);
    assert_int_equal(o.resource, I_CROSS);
    assert_int_equal(o.rid, 1);
    assert_int_equal(f.kv->n_free, free_self);
    assert_int_equal(f.ctxkv->n_free, free_ctx);
    assert_int_equal(f.kv->n_rollback, 1);
    /* a request the cross resource never ingested is refused too */
    ms_segment cu[] = {{77, 0, 0}};
    ms_step step = {.name = "dec", .segments = qd, .n_segments = 1};
    step.records[I_CTX].rec = &KV_COMMIT;
    step.records[I_CTX].segments = cu;
    step.records[I_CTX].n_segments = 1;
    step.records[I_CROSS].rec = &cross_rec;
    ms_step_ctx ctx = {0};
    assert_int_equal(ms_cross_iface.admit(f.cross, I_CROSS, &step, &ctx).code, MS_ADMIT_INVALID);
    assert_int_equal(ms_cross_context_written(f.cross, 77, &written, &err), MS_ERR_NOT_FOUND);
    cfx_free(&f);
}

static void test_non_committing_write_does_not_mark_written(void **state) {
    (void)state;
    cfx f;
    cfx_init(&f, "kv");
    ms_error err = {0};
    ms_kv_step nocommit = {.commit = false};
    ms_segment q[] = {{1, 0, 2}};
    ms_segment c[] = {{1, 0, 6}};
    ms_step step = {.name = "probe", .segments = q, .n_segments = 1};
    step.records[I_KV].rec = &nocommit;
    step.records[I_CTX].rec = &nocommit;
    step.records[I_CTX].segments = c;
    step.records[I_CTX].n_segments = 1;
    step.records[I_CROSS].rec = &cross_rec;
    ms_step_ctx ctx = {0};
    assert_int_equal(ms_step_runner_admit(f.r, &step, &ctx).code, MS_ADMIT_OK);
    assert_int_equal(ms_step_runner_plan(f.r, &step, &ctx, &err), MS_OK);
    assert_int_equal(ms_step_runner_commit(f.r, &step, &ctx, &err), MS_OK);
    bool written = true;
    assert_int_equal(ms_cross_context_written(f.cross, 1, &written, &err), MS_OK);
    assert_false(written);
    /* dummy-row reset clears the mark after a real write */
    ms_status st;
    assert_int_equal(cfx_step(&f, q, 1, c, 1, NULL, false, &st, &err).code, MS_ADMIT_OK);
    assert_int_equal(ms_cross_context_written(f.cross, 1, &written, &err), MS_OK);
    assert_true(written);
    ms_step_runner_reset(f.r, 1, true);
    assert_int_equal(ms_cross_context_written(f.cross, 1, &written, &err), MS_OK);
    assert_false(written);
    cfx_free(&f);
}

/* ---- sink rows (F3 part) ---- */

static void test_F3_padding_rows_with_empty_context_use_sink_page(void **state) {
    (void)state;
    cfx f;
    cfx_init(&f, "kv");
    ms_error err = {0};
    ms_status st;
    ms_segment q[] = {{1, 0, 2}};
    ms_segment c[] = {{1, 0, 5}};
    assert_int_equal(cfx_step(&f, q, 1, c, 1, NULL, false, &st, &err).code, MS_ADMIT_OK);
    /* rows 2 and 3 have no context: 2 has a zero-span (empty) context view, 3 has none */
    ms_segment qd[] = {{1, 0, 1}, {2, 0, 1}, {3, 0, 1}};
    ms_segment cd[] = {{1, 0, 0}, {2, 0, 0}};
    assert_int_equal(cfx_step(&f, qd, 3, cd, 2, NULL, false, &st, &err).code, MS_ADMIT_OK);
    assert_int_equal(st, MS_OK);
    const ms_cross_buffers *b = centry(&f, 0)->buffers;
    assert_int_equal(b->n_rows, 3);
    assert_int_equal(b->kv_indptr[1], 2);
    assert_int_equal(b->kv_indptr[2], 3);
    assert_int_equal(b->kv_indptr[3], 4);
    assert_int_equal(b->kv_indices[2], MS_SINK_PAGE);
    assert_int_equal(b->kv_indices[3], MS_SINK_PAGE);
    assert_int_equal(b->kv_last_page_len[1], 1);
    assert_int_equal(b->kv_last_page_len[2], 1);
    for (int32_t k = 0; k < 2; k++)
        assert_int_not_equal(b->kv_indices[k], MS_SINK_PAGE);
    /* without any context segment the context label is not planned: a clear error */
    ms_step step = {.name = "dec", .segments = qd, .n_segments = 1};
    step.records[I_KV].rec = &KV_COMMIT;
    step.records[I_CTX].rec = &KV_COMMIT;
    step.records[I_CTX].segments = q;
    step.records[I_CTX].n_segments = 0;
    step.records[I_CROSS].rec = &cross_rec;
    ms_step_ctx ctx = {0};
    assert_int_equal(ms_step_runner_admit(f.r, &step, &ctx).code, MS_ADMIT_OK);
    assert_int_equal(ms_step_runner_plan(f.r, &step, &ctx, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "context label 0 was not planned"));
    cfx_free(&f);
}

/* ---- re-plan memo ---- */

static void test_replan_skipped_when_unchanged(void **state) {
    (void)state;
    cfx f;
    cfx_init(&f, "kv");
    ms_error err = {0};
    ms_status st;
    ms_segment q[] = {{1, 0, 2}, {2, 0, 2}};
    ms_segment c[] = {{1, 0, 7}, {2, 0, 3}};
    assert_int_equal(cfx_step(&f, q, 2, c, 2, NULL, false, &st, &err).code, MS_ADMIT_OK);
    assert_true(centry(&f, 0)->replanned);
    const ms_cross_buffers *b = centry(&f, 0)->buffers;
    uint64_t n0 = b->n_replans;
    ms_segment qd[] = {{1, 0, 1}, {2, 0, 1}};
    ms_segment cd[] = {{1, 0, 0}, {2, 0, 0}};
    assert_int_equal(cfx_step(&f, qd, 2, cd, 2, NULL, false, &st, &err).code, MS_ADMIT_OK);
    assert_true(centry(&f, 0)->replanned); /* q lengths changed 2 -> 1 */
    for (int i = 0; i < 4; i++) {
        assert_int_equal(cfx_step(&f, qd, 2, cd, 2, NULL, false, &st, &err).code, MS_ADMIT_OK);
        assert_false(centry(&f, 0)->replanned);
        assert_ptr_equal(centry(&f, 0)->buffers, b);
    }
    assert_int_equal(b->n_replans, n0 + 1);
    /* batch composition changes: re-planned */
    ms_segment q1[] = {{2, 0, 1}};
    ms_segment c1[] = {{2, 0, 0}};
    assert_int_equal(cfx_step(&f, q1, 1, c1, 1, NULL, false, &st, &err).code, MS_ADMIT_OK);
    assert_true(centry(&f, 0)->replanned);
    assert_int_equal(b->n_rows, 1);
    assert_int_equal(b->kv_last_page_len[0], 3);
    cfx_free(&f);
}

/* ---- query packing variants ---- */

static void test_query_from_own_segments_and_shared_kv(void **state) {
    (void)state;
    /* no query KV: rows are the cross resource's own segments, grouped by label */
    cfx f;
    cfx_init(&f, NULL);
    ms_error err = {0};
    ms_status st;
    ms_segment q[] = {{1, 0, 1}};
    ms_segment c[] = {{1, 0, 9}, {2, 0, 2}};
    assert_int_equal(cfx_step(&f, q, 1, c, 2, NULL, false, &st, &err).code, MS_ADMIT_OK);
    ms_step step = {.name = "cross_only", .segments = q, .n_segments = 1};
    ms_segment own[] = {{2, 3, 4}, {1, 3, 2}, {1, 5, 1}};
    ms_segment cd[] = {{1, 0, 0}, {2, 0, 0}};
    step.records[I_CTX].rec = &KV_COMMIT;
    step.records[I_CTX].segments = cd;
    step.records[I_CTX].n_segments = 2;
    step.records[I_CROSS].rec = &cross_rec;
    step.records[I_CROSS].segments = own;
    step.records[I_CROSS].n_segments = 3;
    ms_step_ctx ctx = {0};
    assert_int_equal(ms_step_runner_admit(f.r, &step, &ctx).code, MS_ADMIT_OK);
    assert_int_equal(ms_step_runner_plan(f.r, &step, &ctx, &err), MS_OK);
    const ms_cross_plan_set *cs = ctx.plan_results[I_CROSS];
    assert_int_equal(cs->n_plans, 2);
    assert_int_equal(cs->plans[0].plan_label, 3);
    const ms_cross_buffers *b = cs->plans[0].buffers;
    assert_int_equal(b->n_rows, 2);
    assert_int_equal(b->qo_indptr[1], 4);
    assert_int_equal(b->qo_indptr[2], 6);
    assert_int_equal(b->kv_indptr[1], 1); /* request 2: 2 tokens, one page */
    assert_int_equal(b->kv_indptr[2], 4); /* request 1: 9 tokens, three pages */
    assert_int_equal(cs->plans[1].plan_label, 5);
    assert_int_equal(cs->plans[1].buffers->n_rows, 1);
    cfx_free(&f);

    /* query and context in the same KV resource: the context label is not a query plan */
    mock_kv_config kc = {4, 64};
    static const char *const dep_kv[] = {"kv"};
    ms_cross_config cc = {"kv", "kv", 2, 8, 32};
    ms_resource_spec specs[] = {
        {"kv", MS_RESOURCE_KV, NULL, 0, mock_kv_build, &kc, NULL, NULL},
        {"cross", MS_RESOURCE_CROSS, dep_kv, 1, ms_cross_build, &cc, NULL, NULL},
    };
    ms_step_runner *r;
    assert_int_equal(ms_step_runner_init(&r, specs, 2, &err), MS_OK);
    assert_int_equal(ms_step_runner_ingest(r, 1, NULL, &err), MS_OK);
    ms_segment segs[] = {{1, 0, 3}, {1, 2, 6}};
    ms_step s2 = {.name = "prefill", .segments = segs, .n_segments = 2};
    s2.records[0].rec = &KV_COMMIT;
    s2.records[1].rec = &cross_rec;
    ms_step_ctx c2 = {0};
    assert_int_equal(ms_step_runner_admit(r, &s2, &c2).code, MS_ADMIT_OK);
    assert_int_equal(ms_step_runner_plan(r, &s2, &c2, &err), MS_OK);
    const ms_cross_plan_set *cs2 = c2.plan_results[1];
    assert_int_equal(cs2->n_plans, 1);
    assert_int_equal(cs2->plans[0].plan_label, 0);
    assert_int_equal(cs2->plans[0].buffers->kv_indptr[1], 2);
    assert_int_equal(cs2->plans[0].buffers->kv_last_page_len[0], 2);
    assert_int_equal(ms_step_runner_commit(r, &s2, &c2, &err), MS_OK);
    ms_step_runner_remove(r, 1);
    ms_step_runner_free(r);
}

/* ---- leases ---- */

static void test_lease_buffers_created_at_capture_only(void **state) {
    (void)state;
    cfx f;
    cfx_init(&f, "kv");
    ms_error err = {0};
    ms_status st;
    ms_graph_plan *g;
    ms_graph_plan_config gc = {1, MS_RID_DUMMY_BASE};
    assert_int_equal(ms_graph_plan_init(&g, &gc, &err), MS_OK);
    int32_t b;
    assert_int_equal(ms_graph_plan_add_bucket(g, 0, 2, 2, &b, &err), MS_OK);
    ms_slot_lease cap;
    assert_int_equal(ms_graph_plan_capture_lease(g, b, 0, &cap, &err), MS_OK);
    ms_segment qd[] = {{1, 0, 1}, {2, 0, 1}};
    ms_segment cd[] = {{1, 0, 0}, {2, 0, 0}};
    /* a replay before any capture of that key is refused */
    assert_int_equal(cfx_step(&f, qd, 2, cd, 2, &cap, false, &st, &err).code, MS_ADMIT_OK);
    assert_int_equal(st, MS_ERR_STATE);
    assert_non_null(strstr(err.msg, "capture never planned"));
    assert_int_equal(cfx_step(&f, qd, 2, cd, 2, &cap, true, &st, &err).code, MS_ADMIT_OK);
    assert_int_equal(st, MS_OK);
    const ms_cross_buffers *captured = centry(&f, 0)->buffers;
    assert_int_equal(captured->bucket, b);
    assert_int_equal(captured->kv_indices[0], MS_SINK_PAGE); /* capture rows: empty contexts */
    assert_int_equal(ms_graph_plan_set_captured(g, b, 0, true, NULL, &err), MS_OK);
    ms_slot_lease l;
    assert_int_equal(ms_graph_plan_lease(g, 0, 2, 2, &l, &err), MS_OK);
    assert_int_equal(cfx_step(&f, qd, 2, cd, 2, &l, false, &st, &err).code, MS_ADMIT_OK);
    assert_int_equal(st, MS_OK);
    assert_ptr_equal(centry(&f, 0)->buffers, captured);
    ms_graph_plan_free(g);
    cfx_free(&f);
}

static void test_init_and_capacity_errors(void **state) {
    (void)state;
    ms_cross *c = NULL;
    ms_error err = {0};
    ms_cross_config cc = {"a", NULL, 0, 0, 4};
    assert_int_equal(ms_cross_init(&c, &cc, 0, -1, &err), MS_ERR_INVALID_ARG);
    cc = (ms_cross_config){"a", NULL, MS_MAX_LABELS, 4, 4};
    assert_int_equal(ms_cross_init(&c, &cc, 0, -1, &err), MS_ERR_INVALID_ARG);
    cc = (ms_cross_config){"a", NULL, 0, 4, 4};
    assert_int_equal(ms_cross_init(&c, &cc, 0, -2, &err), MS_ERR_INVALID_ARG);
    for (int nth = 1; nth <= 5; nth++) {
        ms_alloc_fail_nth(nth);
        assert_int_equal(ms_cross_init(&c, &cc, 0, -1, &err), MS_ERR_OOM);
        assert_null(c);
    }
    ms_cross_free(NULL);
    /* more context pages than max_pages */
    cfx f;
    cfx_init(&f, "kv");
    ms_status st;
    ms_segment q[] = {{1, 0, 1}, {2, 0, 1}};
    ms_segment big[] = {{1, 0, 68}, {2, 0, 68}};
    assert_int_equal(cfx_step(&f, q, 2, big, 2, NULL, false, &st, &err).code, MS_ADMIT_OK);
    assert_int_equal(st, MS_ERR_CAPACITY);
    assert_non_null(strstr(err.msg, "max_pages 32"));
    cfx_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_context_written_once_then_zero_span_reads),
        ms_unit_test(test_non_committing_write_does_not_mark_written),
        ms_unit_test(test_F3_padding_rows_with_empty_context_use_sink_page),
        ms_unit_test(test_replan_skipped_when_unchanged),
        ms_unit_test(test_query_from_own_segments_and_shared_kv),
        ms_unit_test(test_lease_buffers_created_at_capture_only),
        ms_unit_test(test_init_and_capacity_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
