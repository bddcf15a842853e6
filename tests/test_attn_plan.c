/*
 * test_attn_plan.c - host part of the attention resource (reference §3.1; hazards H7, F2/F3 for
 * plan buffers): decode vs prefill by "every span == 1" (never by token count) or by the bucket
 * under a lease, causal flag from the step, persistent buffers per (label, kind) eager and per
 * (bucket, slot, label) under a lease, created at capture and reused at replay (also through a
 * replay alias), capacity errors. Driven with the KV mock.
 */
#include "ms_test.h"

#include <string.h>

#include "attn_plan.h"
#include "graph_plan.h"
#include "kv_mock.h"
#include "step_runner.h"

#include "ms_test_impl.h"

typedef struct afx {
    ms_step_runner *r;
    mock_kv *kv;
    ms_attn *attn;
    ms_step_ctx ctx;
} afx;

static const char *const deps_kv[] = {"kv"};

static void afx_init(afx *f, int32_t max_rows, int32_t max_pages) {
    memset(f, 0, sizeof *f);
    mock_kv_config kc = {4, 128};
    ms_attn_config ac = {"kv", max_rows, max_pages};
    ms_resource_spec specs[] = {
        {"kv", MS_RESOURCE_KV, NULL, 0, mock_kv_build, &kc, NULL, NULL},
        {"attn", MS_RESOURCE_ATTN, deps_kv, 1, ms_attn_build, &ac, NULL, NULL},
    };
    ms_error err = {0};
    assert_int_equal(ms_step_runner_init(&f->r, specs, 2, &err), MS_OK);
    f->kv = ms_step_runner_resource(f->r, 0);
    f->attn = ms_step_runner_resource(f->r, 1);
    for (ms_rid rid = 1; rid <= 4; rid++)
        assert_int_equal(ms_step_runner_ingest(f->r, rid, NULL, &err), MS_OK);
}

static void afx_free(afx *f) {
    for (ms_rid rid = 1; rid <= 4; rid++)
        ms_step_runner_remove(f->r, rid);
    ms_step_runner_free(f->r);
}

/* Admit + plan; returns the status of plan (err filled). */
static ms_status afx_plan(afx *f, const ms_segment *segs, int32_t n, const ms_kv_step *ks,
                          bool causal, const ms_slot_lease *lease, bool capture, ms_error *err) {
    static ms_attn_step as;
    as.causal = causal;
    ms_step step = {.name = "s", .segments = segs, .n_segments = n};
    step.records[0].rec = ks;
    step.records[1].rec = &as;
    memset(&f->ctx, 0, sizeof f->ctx);
    f->ctx.lease = lease;
    f->ctx.capture = capture;
    assert_int_equal(ms_step_runner_admit(f->r, &step, &f->ctx).code, MS_ADMIT_OK);
    ms_status st = ms_step_runner_plan(f->r, &step, &f->ctx, err);
    if (st == MS_OK)
        assert_int_equal(ms_step_runner_commit(f->r, &step, &f->ctx, err), MS_OK);
    return st;
}

static const ms_kv_step KV_COMMIT = {.commit = true};

static const ms_attn_plan_entry *entry(afx *f, ms_label label) {
    const ms_attn_plan_set *ap = f->ctx.plan_results[1];
    assert_non_null(ap);
    return ms_attn_plan_find(ap, label);
}

/* ---- H7 ---- */

static void test_H7_decode_only_when_every_span_is_one(void **state) {
    (void)state;
    afx f;
    afx_init(&f, 16, 64);
    ms_error err = {0};
    /* spans [2, 0]: total tokens == rows, but not decode */
    ms_segment a[] = {{1, 0, 2}, {2, 0, 0}};
    assert_int_equal(afx_plan(&f, a, 2, &KV_COMMIT, true, NULL, false, &err), MS_OK);
    assert_int_equal(entry(&f, 0)->kind, MS_ATTN_PREFILL);
    /* [1, 0]: one token, two rows: prefill */
    ms_segment b[] = {{1, 0, 1}, {2, 0, 0}};
    assert_int_equal(afx_plan(&f, b, 2, &KV_COMMIT, true, NULL, false, &err), MS_OK);
    assert_int_equal(entry(&f, 0)->kind, MS_ATTN_PREFILL);
    /* [1, 1, 1]: decode */
    ms_segment c[] = {{1, 0, 1}, {2, 0, 1}, {3, 0, 1}};
    assert_int_equal(afx_plan(&f, c, 3, &KV_COMMIT, true, NULL, false, &err), MS_OK);
    assert_int_equal(entry(&f, 0)->kind, MS_ATTN_DECODE);
    assert_int_equal(entry(&f, 0)->buffers->n_tokens, 3);
    /* pure function: empty plan is prefill; a lease overrides by bucket shape */
    ms_kv_plan empty = {0};
    assert_int_equal(ms_attn_select_kind(&empty, NULL), MS_ATTN_PREFILL);
    ms_kv_plan_set *set = &f.kv->set;
    ms_slot_lease packed = {0, 0, 1, 4, 16, 1};
    ms_slot_lease dec = {0, 0, 0, 4, 4, 1};
    assert_int_equal(ms_attn_select_kind(&set->plans[0], &packed), MS_ATTN_PREFILL);
    assert_int_equal(ms_attn_select_kind(&set->plans[0], &dec), MS_ATTN_DECODE);
    assert_string_equal(ms_attn_kind_str(MS_ATTN_DECODE), "decode");
    assert_string_equal(ms_attn_kind_str(MS_ATTN_KIND_COUNT), "unknown");
    afx_free(&f);
}

static void test_causal_flag_from_step_and_arrays_copied(void **state) {
    (void)state;
    afx f;
    afx_init(&f, 16, 64);
    ms_error err = {0};
    ms_segment a[] = {{1, 0, 5}, {2, 0, 3}};
    assert_int_equal(afx_plan(&f, a, 2, &KV_COMMIT, false, NULL, false, &err), MS_OK);
    const ms_attn_plan_entry *e = entry(&f, 0);
    assert_false(e->causal);
    assert_false(e->buffers->causal);
    const ms_kv_plan *kp = ms_kv_plan_find(&f.kv->set, 0);
    assert_int_equal(e->buffers->n_rows, 2);
    assert_memory_equal(e->buffers->qo_indptr, kp->qo_indptr, 3 * sizeof(int32_t));
    assert_memory_equal(e->buffers->kv_indptr, kp->kv_indptr, 3 * sizeof(int32_t));
    assert_memory_equal(e->buffers->kv_indices, kp->kv_indices,
                        (size_t)kp->kv_indptr[2] * sizeof(int32_t));
    assert_memory_equal(e->buffers->kv_last_page_len, kp->kv_last_page_len, 2 * sizeof(int32_t));
    assert_int_equal(e->buffers->kv_last_page_len[0], 1); /* 5 tokens at ps 4 */
    ms_segment b[] = {{1, 0, 2}};
    assert_int_equal(afx_plan(&f, b, 1, &KV_COMMIT, true, NULL, false, &err), MS_OK);
    assert_true(entry(&f, 0)->causal);
    afx_free(&f);
}

static void test_eager_buffers_persist_per_label_and_kind(void **state) {
    (void)state;
    afx f;
    afx_init(&f, 16, 64);
    ms_error err = {0};
    ms_segment pre[] = {{1, 0, 3}, {2, 0, 3}};
    assert_int_equal(afx_plan(&f, pre, 2, &KV_COMMIT, true, NULL, false, &err), MS_OK);
    const ms_attn_buffers *prefill_buf = entry(&f, 0)->buffers;
    ms_segment dec[] = {{1, 0, 1}, {2, 0, 1}};
    assert_int_equal(afx_plan(&f, dec, 2, &KV_COMMIT, true, NULL, false, &err), MS_OK);
    const ms_attn_buffers *decode_buf = entry(&f, 0)->buffers;
    assert_ptr_not_equal(prefill_buf, decode_buf);
    assert_int_equal(ms_attn_n_buffers(f.attn), 2);
    /* steady state: the same buffers, and the attention plan allocates nothing */
    for (int i = 0; i < 5; i++) {
        ms_step step = {.name = "decode", .segments = dec, .n_segments = 2};
        ms_attn_step as = {.causal = true};
        step.records[0].rec = &KV_COMMIT;
        step.records[1].rec = &as;
        ms_step_ctx ctx = {0};
        assert_int_equal(ms_step_runner_admit(f.r, &step, &ctx).code, MS_ADMIT_OK);
        assert_int_equal(ms_step_runner_plan(f.r, &step, &ctx, &err), MS_OK);
        int64_t before = ms_alloc_get_stats().total_allocs;
        const void *out = NULL;
        assert_int_equal(ms_attn_iface.plan(f.attn, 1, &step, &ctx, &out, &err), MS_OK);
        assert_int_equal(ms_alloc_get_stats().total_allocs, before);
        assert_ptr_equal(ms_attn_plan_find(out, 0)->buffers, decode_buf);
        assert_int_equal(ms_step_runner_commit(f.r, &step, &ctx, &err), MS_OK);
    }
    assert_int_equal(ms_attn_n_buffers(f.attn), 2);
    /* another plan label gets its own buffers; a combined label plans once */
    ms_combined_label cl = {{0, 1}, 2, 9};
    ms_kv_step ks = {.commit = true, .combined = &cl, .n_combined = 1};
    ms_segment cfg[] = {{1, 0, 1}, {2, 0, 1}, {1, 1, 1}, {2, 1, 1}};
    assert_int_equal(afx_plan(&f, cfg, 4, &ks, false, NULL, false, &err), MS_OK);
    const ms_attn_plan_set *ap = f.ctx.plan_results[1];
    assert_int_equal(ap->n_plans, 1);
    assert_int_equal(ap->plans[0].plan_label, 9);
    assert_int_equal(ap->plans[0].kind, MS_ATTN_DECODE);
    assert_int_equal(ap->plans[0].buffers->n_rows, 4);
    assert_null(ms_attn_plan_find(ap, 0));
    afx_free(&f);
}

/* ---- leases (F2 / F3) ---- */

static void test_F3_lease_buffers_created_at_capture_reused_at_alias_replay(void **state) {
    (void)state;
    afx f;
    afx_init(&f, 16, 64);
    ms_error err = {0};
    ms_graph_plan *g;
    ms_graph_plan_config gc = {2, MS_RID_DUMMY_BASE};
    assert_int_equal(ms_graph_plan_init(&g, &gc, &err), MS_OK);
    int32_t b;
    assert_int_equal(ms_graph_plan_add_bucket(g, 0, 2, 2, &b, &err), MS_OK);
    assert_int_equal(ms_graph_plan_add_alias(g, 5, 0, &err), MS_OK);
    const ms_attn_buffers *captured[2];
    ms_segment dec[] = {{1, 0, 1}, {2, 0, 1}};
    for (int32_t s = 0; s < 2; s++) {
        ms_slot_lease l;
        assert_int_equal(ms_graph_plan_capture_lease(g, b, s, &l, &err), MS_OK);
        assert_int_equal(afx_plan(&f, dec, 2, &KV_COMMIT, true, &l, true, &err), MS_OK);
        captured[s] = entry(&f, 0)->buffers;
        assert_int_equal(captured[s]->bucket, b);
        assert_int_equal(captured[s]->slot, s);
        assert_int_equal(captured[s]->kind, MS_ATTN_DECODE);
        assert_int_equal(ms_graph_plan_set_captured(g, b, s, true, NULL, &err), MS_OK);
    }
    assert_ptr_not_equal(captured[0], captured[1]); /* slot-keyed */
    int32_t n_after_capture = ms_attn_n_buffers(f.attn);
    for (int i = 0; i < 6; i++) {
        ms_slot_lease l;
        assert_int_equal(ms_graph_plan_lease(g, 5 /* alias */, 2, 2, &l, &err), MS_OK);
        assert_int_equal(afx_plan(&f, dec, 2, &KV_COMMIT, true, &l, false, &err), MS_OK);
        assert_ptr_equal(entry(&f, 0)->buffers, captured[l.slot]);
    }
    assert_int_equal(ms_attn_n_buffers(f.attn), n_after_capture);
    /* a replay on a key the capture never planned (label 1) is refused */
    ms_slot_lease l;
    assert_int_equal(ms_graph_plan_lease(g, 0, 2, 2, &l, &err), MS_OK);
    ms_segment other[] = {{1, 1, 1}, {2, 1, 1}};
    assert_int_equal(afx_plan(&f, other, 2, &KV_COMMIT, true, &l, false, &err), MS_ERR_STATE);
    assert_non_null(strstr(err.msg, "which the capture never planned"));
    /* decode bucket with a multi-token span is inconsistent */
    ms_segment bad[] = {{1, 0, 2}, {2, 0, 0}};
    assert_int_equal(afx_plan(&f, bad, 2, &KV_COMMIT, true, &l, false, &err),
                     MS_ERR_INVALID_ARG);
    ms_graph_plan_free(g);
    afx_free(&f);
}

static void test_capacity_and_missing_kv_errors(void **state) {
    (void)state;
    afx f;
    afx_init(&f, 2, 3);
    ms_error err = {0};
    ms_segment three[] = {{1, 0, 1}, {2, 0, 1}, {3, 0, 1}};
    assert_int_equal(afx_plan(&f, three, 3, &KV_COMMIT, true, NULL, false, &err),
                     MS_ERR_CAPACITY);
    assert_non_null(strstr(err.msg, "above max_rows 2"));
    ms_segment big[] = {{1, 0, 13}};
    assert_int_equal(afx_plan(&f, big, 1, &KV_COMMIT, true, NULL, false, &err), MS_ERR_CAPACITY);
    assert_non_null(strstr(err.msg, "reads 4 pages, above max_pages 3"));
    assert_int_equal(ms_attn_n_buffers(f.attn), 0);
    ms_segment one[] = {{1, 0, 1}};
    ms_attn_step as = {.causal = true};
    ms_step step = {.name = "decode", .segments = one, .n_segments = 1};
    step.records[1].rec = &as;
    ms_step_ctx ctx = {0};
    assert_int_equal(ms_step_runner_plan(f.r, &step, &ctx, &err), MS_ERR_STATE);
    assert_non_null(strstr(err.msg, "step decode: attn: attention: needs the KV plan"));
    afx_free(&f);
    ms_attn *a = NULL;
    ms_attn_config bad = {"kv", 0, 1};
    assert_int_equal(ms_attn_init(&a, &bad, 0, &err), MS_ERR_INVALID_ARG);
    ms_attn_config ok = {"kv", 1, 1};
    assert_int_equal(ms_attn_init(&a, &ok, 99, &err), MS_ERR_INVALID_ARG);
    ms_alloc_fail_nth(1);
    assert_int_equal(ms_attn_init(&a, &ok, 0, &err), MS_ERR_OOM);
    assert_null(a);
    ms_attn_free(NULL);
}

static void test_buffer_allocation_failure_changes_nothing(void **state) {
    (void)state;
    afx f;
    afx_init(&f, 4, 16);
    ms_error err = {0};
    ms_segment one[] = {{1, 0, 2}};
    ms_attn_step as = {.causal = true};
    ms_step step = {.name = "prefill", .segments = one, .n_segments = 1};
    step.records[0].rec = &KV_COMMIT;
    step.records[1].rec = &as;
    ms_step_ctx ctx = {0};
    assert_int_equal(ms_step_runner_admit(f.r, &step, &ctx).code, MS_ADMIT_OK);
    assert_int_equal(ms_step_runner_plan(f.r, &step, &ctx, &err), MS_OK); /* creates buffers */
    ms_attn_free(NULL);
    for (int nth = 1; nth <= 7; nth++) {
        ms_attn *a;
        ms_attn_config ac = {"kv", 4, 16};
        assert_int_equal(ms_attn_init(&a, &ac, 0, &err), MS_OK);
        ms_alloc_fail_nth(nth);
        const void *out = NULL;
        ms_status st = ms_attn_iface.plan(a, 1, &step, &ctx, &out, &err);
        ms_alloc_fail_nth(0);
        if (st == MS_OK) {
            assert_int_equal(ms_attn_n_buffers(a), 1);
        } else {
            assert_int_equal(st, MS_ERR_OOM);
            assert_int_equal(ms_attn_n_buffers(a), 0);
        }
        ms_attn_free(a);
    }
    afx_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_H7_decode_only_when_every_span_is_one),
        ms_unit_test(test_causal_flag_from_step_and_arrays_copied),
        ms_unit_test(test_eager_buffers_persist_per_label_and_kind),
        ms_unit_test(test_F3_lease_buffers_created_at_capture_reused_at_alias_replay),
        ms_unit_test(test_capacity_and_missing_kv_errors),
        ms_unit_test(test_buffer_allocation_failure_changes_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
