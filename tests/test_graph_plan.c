/*
 * test_graph_plan.c - host bookkeeping of the captured path (reference §6, §9 item 25; hazards
 * F1, F2, F3, F6, H8, H9 a/c, H13): tightest-bucket selection, one slot counter per runner,
 * leases naming the capture walk, the sink tail of static write addresses, dummy rows, tagged
 * pre-plans (threaded), slot capture failures. Driven with the KV mock and positions.
 */
#include "ms_test.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "graph_plan.h"
#include "kv_mock.h"
#include "positions.h"
#include "step_runner.h"

#include "ms_test_impl.h"

/* ---- fixture: runner (mock KV + positions) + graph plan ---- */

enum { WALK_DECODE = 0, WALK_PREFILL = 1, WALK_PREFILL_AUDIO = 2 };

typedef struct gfx {
    ms_step_runner *r;
    ms_graph_plan *g;
    mock_kv *kv;
    ms_positions *pos;
} gfx;

static const char *const deps_kv[] = {"kv"};

static void gfx_init_shared(gfx *f, int32_t n_slots, ms_rid dummy_base, mock_kv *shared) {
    memset(f, 0, sizeof *f);
    static mock_kv_config kc = {8, 300};
    static ms_positions_config pc = {MS_POS_SEQUENTIAL, 1, 1, 512, "kv"};
    ms_resource_spec specs[] = {
        {"kv", MS_RESOURCE_KV, NULL, 0, shared ? NULL : mock_kv_build, &kc, shared,
         shared ? &mock_kv_iface : NULL},
        {"pos", MS_RESOURCE_POS, deps_kv, 1, ms_positions_build, &pc, NULL, NULL},
    };
    ms_error err = {0};
    assert_int_equal(ms_step_runner_init(&f->r, specs, 2, &err), MS_OK);
    f->kv = ms_step_runner_resource(f->r, 0);
    f->pos = ms_step_runner_resource(f->r, 1);
    ms_graph_plan_config gc = {n_slots, dummy_base};
    assert_int_equal(ms_graph_plan_init(&f->g, &gc, &err), MS_OK);
}

static void gfx_init(gfx *f, int32_t n_slots) {
    gfx_init_shared(f, n_slots, MS_RID_DUMMY_BASE, NULL);
}

static void gfx_free(gfx *f) {
    ms_graph_plan_remove_dummies(f->g, f->r);
    ms_graph_plan_free(f->g);
    ms_step_runner_free(f->r);
}

static const ms_kv_step KV_COMMIT = {.commit = true};
static const ms_pos_step POS_DEFAULT = {.n_axes = 1};

/* One step over rows[n] with spans[n] (label main) under `lease`; commit unless capturing. */
static void gfx_run(gfx *f, const ms_slot_lease *lease, const ms_rid *rows, const int32_t *spans,
                    int32_t n, int32_t n_real, bool capture) {
    ms_segment segs[64];
    for (int32_t i = 0; i < n; i++)
        segs[i] = (ms_segment){rows[i], MS_LABEL_MAIN, spans[i]};
    ms_step step = {.name = "step", .segments = segs, .n_segments = n};
    step.records[0].rec = &KV_COMMIT;
    step.records[1].rec = &POS_DEFAULT;
    ms_step_ctx ctx = {.request_ids = rows, .n_rows = n, .n_real = n_real, .lease = lease,
                       .capture = capture};
    assert_int_equal(ms_step_runner_admit(f->r, &step, &ctx).code, MS_ADMIT_OK);
    ms_error err = {0};
    assert_int_equal(ms_step_runner_plan(f->r, &step, &ctx, &err), MS_OK);
    ms_status st = ms_graph_plan_stage_step(f->g, f->r, &ctx, &err);
    if (st != MS_OK)
        fprintf(stderr, "stage: %s\n", err.msg);
    assert_int_equal(st, MS_OK);
    if (!capture)
        assert_int_equal(ms_step_runner_commit(f->r, &step, &ctx, &err), MS_OK);
}

static int graph_handles[128];

/* Capture every (bucket, slot) over dummy rows; tokens spread over rows, remainder on row 0. */
static void gfx_capture_all(gfx *f, bool (*fails)(int32_t bucket, int32_t slot)) {
    ms_error err = {0};
    assert_int_equal(ms_graph_plan_ingest_dummies(f->g, f->r, &err), MS_OK);
    int32_t nb = 0;
    ms_slot_lease probe;
    while (ms_graph_plan_capture_lease(f->g, nb, 0, &probe, NULL) == MS_OK)
        nb++;
    for (int32_t b = 0; b < nb; b++)
        for (int32_t s = 0; s < 2; s++) {
            ms_slot_lease lease;
            if (ms_graph_plan_capture_lease(f->g, b, s, &lease, NULL) != MS_OK)
                continue;
            if (fails != NULL && fails(b, s)) {
                assert_int_equal(ms_graph_plan_set_captured(f->g, b, s, false, NULL, &err), MS_OK);
                continue;
            }
            ms_rid rows[64];
            int32_t spans[64], n;
            assert_int_equal(ms_graph_plan_step_ids(f->g, &lease, NULL, 0, rows, 64, &n, &err),
                             MS_OK);
            for (int32_t i = 0; i < n; i++)
                spans[i] = lease.n_tokens / lease.bs;
            spans[0] += lease.n_tokens % lease.bs;
            gfx_run(f, &lease, rows, spans, n, 0, true);
            ms_graph_plan_release(f->g, f->r, &lease, 0);
            assert_int_equal(
                ms_graph_plan_set_captured(f->g, b, s, true, &graph_handles[b * 2 + s], &err),
                MS_OK);
        }
}

static void ingest_real(gfx *f, ms_rid rid) {
    ms_error err = {0};
    assert_int_equal(ms_step_runner_ingest(f->r, rid, NULL, &err), MS_OK);
}

/* ---- buckets and selection ---- */

static void test_select_tightest_bucket_by_tokens_then_bs(void **state) {
    (void)state;
    gfx f;
    gfx_init(&f, 1);
    ms_error err = {0};
    int32_t idx[8];
    int32_t shapes[][3] = {{WALK_PREFILL, 4, 32}, {WALK_PREFILL, 4, 64}, {WALK_PREFILL, 8, 64},
                           {WALK_PREFILL, 2, 128}, {WALK_DECODE, 1, 1},  {WALK_DECODE, 4, 4}};
    for (int i = 0; i < 6; i++)
        assert_int_equal(ms_graph_plan_add_bucket(f.g, shapes[i][0], shapes[i][1], shapes[i][2],
                                                  &idx[i], &err),
                         MS_OK);
    /* nothing captured yet: nothing selectable */
    int32_t b;
    assert_int_equal(ms_graph_plan_select(f.g, WALK_PREFILL, 1, 1, &b, &err), MS_ERR_NOT_FOUND);
    for (int i = 0; i < 6; i++)
        assert_int_equal(ms_graph_plan_set_captured(f.g, idx[i], 0, true, NULL, &err), MS_OK);
    assert_int_equal(ms_graph_plan_select(f.g, WALK_PREFILL, 3, 40, &b, &err), MS_OK);
    assert_int_equal(b, idx[1]); /* (64, 4) before (64, 8) */
    assert_int_equal(ms_graph_plan_select(f.g, WALK_PREFILL, 5, 40, &b, &err), MS_OK);
    assert_int_equal(b, idx[2]);
    assert_int_equal(ms_graph_plan_select(f.g, WALK_PREFILL, 1, 20, &b, &err), MS_OK);
    assert_int_equal(b, idx[0]);
    assert_int_equal(ms_graph_plan_select(f.g, WALK_PREFILL, 1, 100, &b, &err), MS_OK);
    assert_int_equal(b, idx[3]); /* tokens first, even with fewer rows */
    assert_int_equal(ms_graph_plan_select(f.g, WALK_DECODE, 3, 3, &b, &err), MS_OK);
    assert_int_equal(b, idx[5]);
    assert_int_equal(ms_graph_plan_select(f.g, WALK_PREFILL, 9, 10, &b, &err), MS_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "bs >= 9 and tokens >= 10"));
    assert_int_equal(ms_graph_plan_max_bs(f.g), 8);
    assert_int_equal(ms_graph_plan_max_tokens(f.g), 128);
    /* an uncaptured bucket is skipped */
    assert_int_equal(ms_graph_plan_set_captured(f.g, idx[1], 0, false, NULL, &err), MS_OK);
    assert_int_equal(ms_graph_plan_select(f.g, WALK_PREFILL, 3, 40, &b, &err), MS_OK);
    assert_int_equal(b, idx[2]);
    /* bad declarations */
    int32_t x;
    assert_int_equal(ms_graph_plan_add_bucket(f.g, WALK_PREFILL, 4, 32, &x, &err),
                     MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "duplicate bucket"));
    assert_int_equal(ms_graph_plan_add_bucket(f.g, WALK_PREFILL, 4, 2, &x, &err),
                     MS_ERR_INVALID_ARG);
    assert_int_equal(ms_graph_plan_add_bucket(f.g, -1, 1, 1, &x, &err), MS_ERR_INVALID_ARG);
    assert_int_equal(ms_graph_plan_set_captured(f.g, 99, 0, true, NULL, &err),
                     MS_ERR_INVALID_ARG);
    gfx_free(&f);
}

static void test_init_rejects_bad_config(void **state) {
    (void)state;
    ms_graph_plan *g = NULL;
    ms_error err = {0};
    ms_graph_plan_config c = {0, MS_RID_DUMMY_BASE};
    assert_int_equal(ms_graph_plan_init(&g, &c, &err), MS_ERR_INVALID_ARG);
    c = (ms_graph_plan_config){2, 5};
    assert_int_equal(ms_graph_plan_init(&g, &c, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "below MS_RID_DUMMY_BASE"));
    c = (ms_graph_plan_config){2, MS_RID_DUMMY_BASE};
    ms_alloc_fail_nth(1);
    assert_int_equal(ms_graph_plan_init(&g, &c, &err), MS_ERR_OOM);
    assert_null(g);
    ms_graph_plan_free(NULL);
}

/* ---- F2 ---- */

static void test_F2_one_slot_counter_across_buckets(void **state) {
    (void)state;
    gfx f;
    gfx_init(&f, 2);
    ms_error err = {0};
    int32_t a, b;
    assert_int_equal(ms_graph_plan_add_bucket(f.g, WALK_DECODE, 2, 2, &a, &err), MS_OK);
    assert_int_equal(ms_graph_plan_add_bucket(f.g, WALK_DECODE, 8, 8, &b, &err), MS_OK);
    for (int s = 0; s < 2; s++) {
        assert_int_equal(ms_graph_plan_set_captured(f.g, a, s, true, NULL, &err), MS_OK);
        assert_int_equal(ms_graph_plan_set_captured(f.g, b, s, true, NULL, &err), MS_OK);
    }
    /* batches alternate between the two buckets; a per-bucket counter would hand slot 0 to both
     * the first and the second lease (each bucket's first lease) */
    ms_slot_lease prev = {-1, -1, -1, 0, 0, 0};
    for (int i = 0; i < 20; i++) {
        int32_t bs = (i % 2 == 0) ? 2 : 6;
        ms_slot_lease l;
        assert_int_equal(ms_graph_plan_lease(f.g, WALK_DECODE, bs, bs, &l, &err), MS_OK);
        assert_int_equal(l.bucket, i % 2 == 0 ? a : b);
        assert_int_not_equal(l.slot, prev.slot);
        assert_true(l.serial > prev.serial);
        prev = l;
    }
    gfx_free(&f);
}

/* ---- F3 ---- */

static void test_F3_alias_lease_names_capture_walk_and_reuses_capture_state(void **state) {
    (void)state;
    gfx f;
    gfx_init(&f, 1);
    ms_error err = {0};
    int32_t b;
    assert_int_equal(ms_graph_plan_add_bucket(f.g, WALK_PREFILL, 2, 32, &b, &err), MS_OK);
    assert_int_equal(ms_graph_plan_add_alias(f.g, WALK_PREFILL_AUDIO, WALK_PREFILL, &err), MS_OK);
    gfx_capture_all(&f, NULL);
    const ms_graph_kv_state *captured = ms_graph_plan_kv_state(f.g, 0, 0, MS_LABEL_MAIN);
    const ms_graph_pos_state *captured_pos = ms_graph_plan_pos_state(f.g, 1, 0, MS_LABEL_MAIN);
    assert_non_null(captured);
    assert_non_null(captured_pos);
    const int32_t *addr = captured->token_to_page;
    uint64_t n0 = captured->n_stagings;
    /* replay found through the alias */
    ms_slot_lease l;
    assert_int_equal(ms_graph_plan_lease(f.g, WALK_PREFILL_AUDIO, 2, 20, &l, &err), MS_OK);
    assert_int_equal(l.walk, WALK_PREFILL);
    assert_int_equal(l.bucket, b);
    assert_ptr_equal(ms_graph_plan_graph(f.g, &l), &graph_handles[b * 2]);
    ingest_real(&f, 1);
    ingest_real(&f, 2);
    ms_rid real[] = {1, 2}, rows[2];
    int32_t n;
    assert_int_equal(ms_graph_plan_step_ids(f.g, &l, real, 2, rows, 2, &n, &err), MS_OK);
    gfx_run(&f, &l, rows, (int32_t[]){12, 8}, 2, 2, false);
    /* the replay staged into the very state (and buffer) the capture created */
    assert_ptr_equal(ms_graph_plan_kv_state(f.g, 0, 0, MS_LABEL_MAIN), captured);
    assert_ptr_equal(captured->token_to_page, addr);
    assert_int_equal(captured->n_stagings, n0 + 1);
    assert_ptr_equal(ms_graph_plan_pos_state(f.g, 1, 0, MS_LABEL_MAIN), captured_pos);
    /* a replay staging a label the capture never created is refused, not silently built */
    ms_kv_plan kp = *ms_kv_plan_find(&f.kv->set, MS_LABEL_MAIN);
    kp.plan_label = 3;
    ms_kv_plan_set other = {8, 1, &kp, NULL, 0, NULL, 0, true};
    assert_int_equal(ms_graph_plan_stage_kv(f.g, &l, 0, &other, false, &err), MS_ERR_STATE);
    assert_non_null(strstr(err.msg, "never created"));
    assert_null(ms_graph_plan_kv_state(f.g, 0, 0, 3));
    /* alias rules */
    assert_int_equal(ms_graph_plan_add_alias(f.g, WALK_PREFILL, WALK_DECODE, &err),
                     MS_ERR_INVALID_ARG);
    assert_int_equal(ms_graph_plan_add_alias(f.g, WALK_PREFILL_AUDIO, WALK_DECODE, &err),
                     MS_ERR_INVALID_ARG);
    int32_t x;
    assert_int_equal(ms_graph_plan_add_bucket(f.g, WALK_PREFILL_AUDIO, 1, 1, &x, &err),
                     MS_ERR_INVALID_ARG);
    ms_step_runner_remove(f.r, 1);
    ms_step_runner_remove(f.r, 2);
    gfx_free(&f);
}

/* ---- F1 ---- */

static bool page_in_views(const ms_kv_plan *kp, int32_t page) {
    for (int32_t v = 0; v < kp->n_views; v++)
        for (int32_t k = 0; k < kp->views[v].n_pages; k++)
            if (kp->views[v].pages[k] == page)
                return true;
    return false;
}

static void test_F1_padding_tail_addresses_only_sink(void **state) {
    (void)state;
    gfx f;
    gfx_init(&f, 1);
    ms_error err = {0};
    int32_t b;
    assert_int_equal(ms_graph_plan_add_bucket(f.g, WALK_PREFILL, 4, 64, &b, &err), MS_OK);
    gfx_capture_all(&f, NULL);
    /* step A: a full 64-token batch of four other requests fills every address */
    for (ms_rid rid = 1; rid <= 8; rid++)
        ingest_real(&f, rid);
    ms_slot_lease l;
    ms_rid rows[4];
    int32_t n;
    ms_rid batch_a[] = {5, 6, 7, 8};
    assert_int_equal(ms_graph_plan_lease(f.g, WALK_PREFILL, 4, 64, &l, &err), MS_OK);
    assert_int_equal(ms_graph_plan_step_ids(f.g, &l, batch_a, 4, rows, 4, &n, &err), MS_OK);
    gfx_run(&f, &l, rows, (int32_t[]){16, 16, 16, 16}, 4, 4, false);
    const ms_graph_kv_state *s = ms_graph_plan_kv_state(f.g, 0, 0, MS_LABEL_MAIN);
    assert_int_equal(s->n_tokens, 64);
    for (int32_t t = 0; t < 64; t++)
        assert_int_not_equal(s->token_to_page[t], MS_SINK_PAGE);
    /* step B: full batch (no padding row), 40 real tokens on the 64-token graph */
    ms_rid batch_b[] = {1, 2, 3, 4};
    assert_int_equal(ms_graph_plan_lease(f.g, WALK_PREFILL, 4, 40, &l, &err), MS_OK);
    assert_int_equal(l.n_tokens, 64);
    assert_int_equal(ms_graph_plan_step_ids(f.g, &l, batch_b, 4, rows, 4, &n, &err), MS_OK);
    gfx_run(&f, &l, rows, (int32_t[]){10, 10, 12, 8}, 4, 4, false);
    const ms_kv_plan *kp = ms_kv_plan_find(&f.kv->set, MS_LABEL_MAIN);
    assert_int_equal(s->n_tokens, 40);
    /* the graph scatters all 64 captured addresses: each lands in the batch's own pages or the
     * sink, never in step A's pages */
    bool sink_addressed = false;
    for (int32_t t = 0; t < s->capacity; t++) {
        int32_t p = s->token_to_page[t];
        if (p == MS_SINK_PAGE) {
            sink_addressed = true;
            assert_true(t >= 40);
            assert_int_equal(s->token_to_slot[t], 0);
        } else {
            assert_true(t < 40);
            assert_true(page_in_views(kp, p));
        }
    }
    assert_true(sink_addressed);
    for (ms_rid rid = 1; rid <= 8; rid++)
        ms_step_runner_remove(f.r, rid);
    gfx_free(&f);
}

/* ---- H9 c ---- */

static bool fail_small_slot0(int32_t bucket, int32_t slot) { return bucket == 0 && slot == 0; }

static void test_H9c_failed_slot_capture_is_never_leased(void **state) {
    (void)state;
    gfx f;
    gfx_init(&f, 2);
    ms_error err = {0};
    int32_t small, big;
    assert_int_equal(ms_graph_plan_add_bucket(f.g, WALK_DECODE, 2, 2, &small, &err), MS_OK);
    assert_int_equal(ms_graph_plan_add_bucket(f.g, WALK_DECODE, 4, 4, &big, &err), MS_OK);
    gfx_capture_all(&f, fail_small_slot0);
    assert_null(ms_graph_plan_kv_state(f.g, 0, 0, 1)); /* sanity: label 1 never used */
    /* counter at slot 0: the small bucket has no slot-0 graph -> the next bucket's slot 0 */
    ms_slot_lease l;
    assert_int_equal(ms_graph_plan_lease(f.g, WALK_DECODE, 2, 2, &l, &err), MS_OK);
    assert_int_equal(l.slot, 0);
    assert_int_equal(l.bucket, big);
    assert_ptr_equal(ms_graph_plan_graph(f.g, &l), &graph_handles[big * 2 + 0]);
    /* slot 1: the small bucket's own slot-1 graph, found by slot number, not capture order */
    assert_int_equal(ms_graph_plan_lease(f.g, WALK_DECODE, 2, 2, &l, &err), MS_OK);
    assert_int_equal(l.slot, 1);
    assert_int_equal(l.bucket, small);
    assert_ptr_equal(ms_graph_plan_graph(f.g, &l), &graph_handles[small * 2 + 1]);
    ms_slot_lease dead = {0, small, WALK_DECODE, 2, 2, 0};
    assert_null(ms_graph_plan_graph(f.g, &dead));
    /* when no bucket has the slot, the lease is refused (eager) and the counter stays */
    assert_int_equal(ms_graph_plan_set_captured(f.g, big, 0, false, NULL, &err), MS_OK);
    assert_int_equal(ms_graph_plan_lease(f.g, WALK_DECODE, 2, 2, &l, &err), MS_ERR_NOT_FOUND);
    assert_int_equal(ms_graph_plan_lease(f.g, WALK_DECODE, 2, 2, &l, &err), MS_ERR_NOT_FOUND);
    assert_int_equal(ms_graph_plan_set_captured(f.g, big, 0, true, &graph_handles[2], &err),
                     MS_OK);
    assert_int_equal(ms_graph_plan_lease(f.g, WALK_DECODE, 2, 2, &l, &err), MS_OK);
    assert_int_equal(l.slot, 0);
    gfx_free(&f);
}

/* ---- §9 item 25: step ids, dummy rows ---- */

static void test_step_ids_are_real_ids_then_capture_tail(void **state) {
    (void)state;
    gfx f;
    gfx_init(&f, 2);
    ms_error err = {0};
    int32_t b;
    assert_int_equal(ms_graph_plan_add_bucket(f.g, WALK_DECODE, 4, 4, &b, &err), MS_OK);
    ms_slot_lease l;
    assert_int_equal(ms_graph_plan_capture_lease(f.g, b, 1, &l, &err), MS_OK);
    ms_rid real[] = {11, 12};
    ms_rid out[8];
    int32_t n;
    assert_int_equal(ms_graph_plan_step_ids(f.g, &l, real, 2, out, 8, &n, &err), MS_OK);
    assert_int_equal(n, 4);
    assert_int_equal(out[0], 11);
    assert_int_equal(out[1], 12);
    assert_int_equal(out[2], ms_graph_plan_dummy_rid(f.g, 1, 2));
    assert_int_equal(out[3], MS_RID_DUMMY_BASE + 4 + 3);
    assert_true(ms_graph_plan_is_dummy(f.g, out[3]));
    assert_false(ms_graph_plan_is_dummy(f.g, 11));
    assert_int_equal(real[0], 11); /* input not mutated */
    ms_rid full[] = {1, 2, 3, 4};
    assert_int_equal(ms_graph_plan_step_ids(f.g, &l, full, 4, out, 8, &n, &err), MS_OK);
    for (int i = 0; i < 4; i++)
        assert_int_equal(out[i], full[i]); /* no tail when full */
    ms_rid five[] = {1, 2, 3, 4, 5};
    assert_int_equal(ms_graph_plan_step_ids(f.g, &l, five, 5, out, 8, &n, &err),
                     MS_ERR_INVALID_ARG);
    ms_rid dummy[] = {MS_RID_DUMMY_BASE + 1};
    assert_int_equal(ms_graph_plan_step_ids(f.g, &l, dummy, 1, out, 8, &n, &err),
                     MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "dummy range"));
    assert_int_equal(ms_graph_plan_step_ids(f.g, &l, real, 2, out, 3, &n, &err),
                     MS_ERR_INVALID_ARG);
    gfx_free(&f);
}

static void test_release_resets_only_dummy_rows_and_keeps_their_pages(void **state) {
    (void)state;
    gfx f;
    gfx_init(&f, 1);
    ms_error err = {0};
    int32_t b;
    assert_int_equal(ms_graph_plan_add_bucket(f.g, WALK_DECODE, 4, 4, &b, &err), MS_OK);
    gfx_capture_all(&f, NULL);
    ingest_real(&f, 1);
    ms_slot_lease l;
    ms_rid rows[4];
    int32_t n;
    int32_t free_before = f.kv->n_free;
    for (int step = 0; step < 3; step++) {
        assert_int_equal(ms_graph_plan_lease(f.g, WALK_DECODE, 1, 1, &l, &err), MS_OK);
        assert_int_equal(ms_graph_plan_step_ids(f.g, &l, (ms_rid[]){1}, 1, rows, 4, &n, &err),
                         MS_OK);
        gfx_run(&f, &l, rows, (int32_t[]){1, 1, 1, 1}, 4, 1, false);
        ms_graph_plan_release(f.g, f.r, &l, 1);
        /* the real row advanced; padding rows are back to length 0 and position 0 */
        assert_int_equal(mock_stored(f.kv, 1, 0), step + 1);
        for (int32_t i = 1; i < 4; i++) {
            ms_rid d = ms_graph_plan_dummy_rid(f.g, 0, i);
            assert_int_equal(mock_stored(f.kv, d, 0), 0);
            int32_t p;
            assert_int_equal(ms_positions_position(f.pos, d, 0, &p, NULL), MS_OK);
            assert_int_equal(p, 0);
        }
    }
    /* only the real request's page was taken: dummy rows reuse the pages they kept */
    assert_int_equal(f.kv->n_free, free_before - 1);
    /* abandoning a pre-plan and releasing its padding rows frees only dummy state */
    assert_int_equal(ms_graph_plan_lease(f.g, WALK_DECODE, 1, 1, &l, &err), MS_OK);
    assert_int_equal(ms_graph_plan_step_ids(f.g, &l, (ms_rid[]){1}, 1, rows, 4, &n, &err), MS_OK);
    assert_int_equal(ms_graph_plan_preplan_begin(f.g, &l, rows, n, 1, &err), MS_OK);
    gfx_run(&f, &l, rows, (int32_t[]){1, 1, 1, 1}, 4, 1, true); /* pre-plan: admit+plan only */
    ms_graph_plan_preplan_finish(f.g, true);
    assert_true(ms_graph_plan_preplan_abandon(f.g));
    ms_graph_plan_release(f.g, f.r, &l, 1);
    assert_int_equal(mock_stored(f.kv, 1, 0), 3);
    assert_int_equal(f.kv->n_free, free_before - 1);
    ms_step_runner_remove(f.r, 1);
    gfx_free(&f);
}

/* ---- H13 ---- */

static void test_H13_1000_padded_replays_keep_dummy_positions_bounded(void **state) {
    (void)state;
    gfx f;
    gfx_init(&f, 2);
    ms_error err = {0};
    int32_t b;
    assert_int_equal(ms_graph_plan_add_bucket(f.g, WALK_DECODE, 4, 4, &b, &err), MS_OK);
    gfx_capture_all(&f, NULL);
    ingest_real(&f, 1);
    ingest_real(&f, 2);
    int32_t free_after_first = -1;
    for (int step = 0; step < 1000; step++) {
        ms_slot_lease l;
        ms_rid rows[4];
        int32_t n;
        /* one or two real rows, the rest padding */
        int32_t n_real = 1 + step % 2;
        assert_int_equal(ms_graph_plan_lease(f.g, WALK_DECODE, n_real, n_real, &l, &err), MS_OK);
        assert_int_equal(
            ms_graph_plan_step_ids(f.g, &l, (ms_rid[]){1, 2}, n_real, rows, 4, &n, &err), MS_OK);
        gfx_run(&f, &l, rows, (int32_t[]){1, 1, 1, 1}, 4, n_real, false);
        const ms_graph_pos_state *ps = ms_graph_plan_pos_state(f.g, 1, l.slot, MS_LABEL_MAIN);
        for (int32_t i = n_real; i < 4; i++)
            assert_true(ps->ids[i] >= 0 && ps->ids[i] <= 1); /* staged padding ids stay tiny */
        ms_graph_plan_release(f.g, f.r, &l, n_real);
        for (int32_t s = 0; s < 2; s++)
            for (int32_t i = 1; i < 4; i++) {
                int32_t p;
                ms_rid d = ms_graph_plan_dummy_rid(f.g, s, i);
                assert_int_equal(ms_positions_position(f.pos, d, 0, &p, NULL), MS_OK);
                assert_int_equal(p, 0);
            }
        if (step == 1)
            free_after_first = f.kv->n_free;
    }
    int32_t p1, p2;
    assert_int_equal(ms_positions_position(f.pos, 1, 0, &p1, NULL), MS_OK);
    assert_int_equal(ms_positions_position(f.pos, 2, 0, &p2, NULL), MS_OK);
    assert_int_equal(p1, 1000);
    assert_int_equal(p2, 500);
    /* padding rows never took more pages: only the real streams grew */
    assert_int_equal(free_after_first - f.kv->n_free,
                     (int32_t)MS_CEIL_DIV(1000, 8) + (int32_t)MS_CEIL_DIV(500, 8) - 2);
    ms_step_runner_remove(f.r, 1);
    ms_step_runner_remove(f.r, 2);
    gfx_free(&f);
}

/* ---- H9 a ---- */

static void test_H9a_two_nodes_sharing_kv_use_disjoint_dummy_rows(void **state) {
    (void)state;
    mock_kv *shared = mock_kv_new(8, 160);
    gfx a, c;
    gfx_init_shared(&a, 2, MS_RID_DUMMY_BASE, shared);
    gfx_init_shared(&c, 2, MS_RID_DUMMY_BASE + 1000, shared);
    ms_error err = {0};
    int32_t b;
    assert_int_equal(ms_graph_plan_add_bucket(a.g, WALK_DECODE, 4, 4, &b, &err), MS_OK);
    assert_int_equal(ms_graph_plan_add_bucket(c.g, WALK_DECODE, 4, 4, &b, &err), MS_OK);
    gfx_capture_all(&a, NULL);
    gfx_capture_all(&c, NULL);
    for (int32_t s = 0; s < 2; s++)
        for (int32_t i = 0; i < 4; i++) {
            assert_false(ms_graph_plan_is_dummy(c.g, ms_graph_plan_dummy_rid(a.g, s, i)));
            assert_false(ms_graph_plan_is_dummy(a.g, ms_graph_plan_dummy_rid(c.g, s, i)));
        }
    ingest_real(&a, 1);
    ingest_real(&c, 1); /* second node ingests the same request into the shared pool */
    /* back-to-back replays on the two nodes, same slot number */
    for (int step = 0; step < 4; step++) {
        gfx *f = step % 2 == 0 ? &a : &c;
        ms_slot_lease l;
        ms_rid rows[4];
        int32_t n;
        assert_int_equal(ms_graph_plan_lease(f->g, WALK_DECODE, 1, 1, &l, &err), MS_OK);
        assert_int_equal(ms_graph_plan_step_ids(f->g, &l, (ms_rid[]){1}, 1, rows, 4, &n, &err),
                         MS_OK);
        gfx_run(f, &l, rows, (int32_t[]){1, 1, 1, 1}, 4, 1, false);
        /* padding pages of this replay belong to this node's dummy rows only */
        const ms_graph_kv_state *s = ms_graph_plan_kv_state(f->g, 0, l.slot, MS_LABEL_MAIN);
        for (int32_t t = 1; t < 4; t++) {
            mock_stream *ds = mock_stream_of(shared, rows[t], 0);
            assert_non_null(ds);
            assert_int_equal(s->token_to_page[t], ds->pages[0]);
        }
        ms_graph_plan_release(f->g, f->r, &l, 1);
    }
    assert_int_equal(mock_stored(shared, 1, 0), 4);
    gfx_free(&a);
    gfx_free(&c);
    mock_remove(shared, 1);
    assert_int_equal(shared->n_free, 159);
    mock_kv_free(shared);
}

/* ---- H8 / F6: tagged pre-plans ---- */

static void test_H8_staged_preplan_refused_for_another_batch(void **state) {
    (void)state;
    gfx f;
    gfx_init(&f, 2);
    ms_error err = {0};
    int32_t b;
    assert_int_equal(ms_graph_plan_add_bucket(f.g, WALK_DECODE, 4, 4, &b, &err), MS_OK);
    for (int s = 0; s < 2; s++)
        assert_int_equal(ms_graph_plan_set_captured(f.g, b, s, true, NULL, &err), MS_OK);
    ms_slot_lease lx, ly;
    assert_int_equal(ms_graph_plan_lease(f.g, WALK_DECODE, 2, 2, &lx, &err), MS_OK);
    assert_int_equal(ms_graph_plan_lease(f.g, WALK_DECODE, 2, 2, &ly, &err), MS_OK);
    ms_segment sx[] = {{1, 0, 1}, {2, 0, 1}};
    ms_segment sy[] = {{1, 0, 1}, {3, 0, 1}};
    ms_step x = {.name = "decode", .segments = sx, .n_segments = 2};
    ms_step y = {.name = "decode", .segments = sy, .n_segments = 2};
    uint64_t hx = ms_step_hash(&x), hy = ms_step_hash(&y);
    assert_true(hx != hy);
    ms_rid rx[] = {1, 2}, ry[] = {1, 3};
    assert_int_equal(ms_graph_plan_preplan_begin(f.g, &lx, rx, 2, hx, &err), MS_OK);
    /* only one pre-plan per runner */
    assert_int_equal(ms_graph_plan_preplan_begin(f.g, &ly, ry, 2, hy, &err), MS_ERR_STATE);
    ms_graph_plan_preplan_finish(f.g, true);
    /* batch Y (other rids), or X's rids on another lease, or another step: refused */
    assert_int_equal(ms_graph_plan_preplan_take(f.g, &lx, ry, 2, hy, &err), MS_ERR_STATE);
    assert_non_null(strstr(err.msg, "made for another batch"));
    assert_int_equal(ms_graph_plan_preplan_take(f.g, &ly, rx, 2, hx, &err), MS_ERR_STATE);
    assert_int_equal(ms_graph_plan_preplan_take(f.g, &lx, rx, 2, hx ^ 1, &err), MS_ERR_STATE);
    assert_int_equal(ms_graph_plan_preplan_take(f.g, &lx, rx, 1, hx, &err), MS_ERR_STATE);
    assert_true(ms_graph_plan_preplan_pending(f.g)); /* still staged, not promoted */
    assert_int_equal(ms_graph_plan_preplan_take(f.g, &lx, rx, 2, hx, &err), MS_OK);
    assert_false(ms_graph_plan_preplan_pending(f.g));
    assert_int_equal(ms_graph_plan_preplan_take(f.g, &lx, rx, 2, hx, &err), MS_ERR_NOT_FOUND);
    /* a failed pre-plan is never promoted */
    assert_int_equal(ms_graph_plan_preplan_begin(f.g, &ly, ry, 2, hy, &err), MS_OK);
    ms_graph_plan_preplan_finish(f.g, false);
    assert_int_equal(ms_graph_plan_preplan_take(f.g, &ly, ry, 2, hy, &err), MS_ERR_NOT_FOUND);
    assert_false(ms_graph_plan_preplan_abandon(f.g));
    /* step hash covers name, segments and declared records */
    ms_step x2 = x;
    x2.name = "prefill";
    assert_true(ms_step_hash(&x2) != hx);
    x2 = x;
    x2.records[2].rec = &x;
    assert_true(ms_step_hash(&x2) != hx);
    x2 = x;
    assert_true(ms_step_hash(&x2) == hx);
    gfx_free(&f);
}

typedef struct slow_plan {
    ms_graph_plan *g;
    atomic_int planned; /* set by the plan thread just before finishing */
    int sleep_ms;
} slow_plan;

static void *slow_plan_thread(void *arg) {
    slow_plan *sp = arg;
    struct timespec ts = {0, (long)sp->sleep_ms * 1000000L};
    nanosleep(&ts, NULL);
    atomic_store(&sp->planned, 1);
    ms_graph_plan_preplan_finish(sp->g, true);
    return NULL;
}

static void test_F6_abandon_waits_for_running_preplan(void **state) {
    (void)state;
    gfx f;
    gfx_init(&f, 2);
    ms_error err = {0};
    int32_t b;
    assert_int_equal(ms_graph_plan_add_bucket(f.g, WALK_DECODE, 2, 2, &b, &err), MS_OK);
    for (int s = 0; s < 2; s++)
        assert_int_equal(ms_graph_plan_set_captured(f.g, b, s, true, NULL, &err), MS_OK);
    ms_slot_lease l;
    assert_int_equal(ms_graph_plan_lease(f.g, WALK_DECODE, 2, 2, &l, &err), MS_OK);
    ms_rid rids[] = {1, 2};
    /* dispatch a slow pre-plan, then drop its batch while it is still planning */
    slow_plan sp = {f.g, 0, 30};
    assert_int_equal(ms_graph_plan_preplan_begin(f.g, &l, rids, 2, 7, &err), MS_OK);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, slow_plan_thread, &sp), 0);
    assert_true(ms_graph_plan_preplan_abandon(f.g));
    assert_int_equal(atomic_load(&sp.planned), 1); /* reset happened after completion */
    /* the next step does not promote it */
    assert_int_equal(ms_graph_plan_preplan_take(f.g, &l, rids, 2, 7, &err), MS_ERR_NOT_FOUND);
    pthread_join(th, NULL);
    /* take waits for a running pre-plan too, then promotes it for the same batch */
    slow_plan sp2 = {f.g, 0, 20};
    assert_int_equal(ms_graph_plan_preplan_begin(f.g, &l, rids, 2, 7, &err), MS_OK);
    assert_int_equal(pthread_create(&th, NULL, slow_plan_thread, &sp2), 0);
    assert_int_equal(ms_graph_plan_preplan_take(f.g, &l, rids, 2, 7, &err), MS_OK);
    assert_int_equal(atomic_load(&sp2.planned), 1);
    pthread_join(th, NULL);
    gfx_free(&f);
}

/* Plan thread of the stress test: stages pre-plans one after another. */
typedef struct stress {
    ms_graph_plan *g;
    pthread_mutex_t mu;           /* guards tag */
    ms_slot_lease tag_lease;      /* batch identity of the last begun pre-plan */
    ms_rid tag_rid;
    atomic_int begun, failed, done;
} stress;

static void *stress_plan_thread(void *arg) {
    stress *x = arg;
    for (int i = 0; i < 2000; i++) {
        ms_slot_lease l;
        if (ms_graph_plan_lease(x->g, WALK_DECODE, 1, 1, &l, NULL) != MS_OK)
            continue;
        ms_rid rid = (ms_rid)i;
        pthread_mutex_lock(&x->mu);
        ms_status st = ms_graph_plan_preplan_begin(x->g, &l, &rid, 1, (uint64_t)i, NULL);
        if (st == MS_OK) {
            x->tag_lease = l;
            x->tag_rid = rid;
        }
        pthread_mutex_unlock(&x->mu);
        if (st != MS_OK)
            continue; /* the previous one is still staged: one per runner */
        atomic_fetch_add(&x->begun, 1);
        bool ok = i % 5 != 0;
        if (!ok)
            atomic_fetch_add(&x->failed, 1);
        ms_graph_plan_preplan_finish(x->g, ok);
    }
    atomic_store(&x->done, 1);
    return NULL;
}

static void test_F6_H8_preplan_stress_across_threads(void **state) {
    (void)state;
    ms_graph_plan *g;
    ms_graph_plan_config gc = {2, MS_RID_DUMMY_BASE};
    ms_error err = {0};
    assert_int_equal(ms_graph_plan_init(&g, &gc, &err), MS_OK);
    int32_t b;
    assert_int_equal(ms_graph_plan_add_bucket(g, WALK_DECODE, 1, 1, &b, &err), MS_OK);
    for (int s = 0; s < 2; s++)
        assert_int_equal(ms_graph_plan_set_captured(g, b, s, true, NULL, &err), MS_OK);
    stress x = {.g = g};
    pthread_mutex_init(&x.mu, NULL);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, stress_plan_thread, &x), 0);
    int promoted = 0, abandoned = 0, refused = 0, k = 0;
    /* driver thread: promote the matching batch, refuse a mismatching one, or drop it */
    while (!atomic_load(&x.done) || ms_graph_plan_preplan_pending(g)) {
        pthread_mutex_lock(&x.mu);
        ms_slot_lease l = x.tag_lease;
        ms_rid rid = x.tag_rid;
        pthread_mutex_unlock(&x.mu);
        k++;
        if (k % 7 == 0) {
            abandoned += ms_graph_plan_preplan_abandon(g);
            continue;
        }
        ms_rid asked = k % 3 == 0 ? rid + 100000 : rid;
        ms_status st = ms_graph_plan_preplan_take(g, &l, &asked, 1, (uint64_t)rid, NULL);
        if (st == MS_OK) {
            assert_int_equal(asked, rid); /* never promoted for another batch */
            promoted++;
        } else if (st == MS_ERR_STATE) {
            refused++;
            abandoned += ms_graph_plan_preplan_abandon(g);
        }
    }
    pthread_join(th, NULL);
    abandoned += ms_graph_plan_preplan_abandon(g);
    /* every staged pre-plan was promoted once, dropped once, or failed: none lost, none twice */
    assert_int_equal(promoted + abandoned + atomic_load(&x.failed), atomic_load(&x.begun));
    assert_true(atomic_load(&x.begun) > 0);
    (void)refused;
    pthread_mutex_destroy(&x.mu);
    ms_graph_plan_free(g);
}

static void test_H9b_piecewise_region_has_its_own_slot_state(void **state) {
    (void)state;
    /* a node with a whole-forward decode graph and a piecewise region (always slot 0): each
     * gets its own graph plan (and dummy range), so their slot-0 states never alias */
    gfx f;
    gfx_init(&f, 2);
    ms_graph_plan *pw;
    ms_graph_plan_config pc = {1, MS_RID_DUMMY_BASE + 4096};
    ms_error err = {0};
    assert_int_equal(ms_graph_plan_init(&pw, &pc, &err), MS_OK);
    int32_t b, pb;
    assert_int_equal(ms_graph_plan_add_bucket(f.g, WALK_DECODE, 2, 2, &b, &err), MS_OK);
    assert_int_equal(ms_graph_plan_add_bucket(pw, 7, 2, 8, &pb, &err), MS_OK);
    gfx_capture_all(&f, NULL);
    gfx piece = f;
    piece.g = pw;
    gfx_capture_all(&piece, NULL);
    const ms_graph_kv_state *whole = ms_graph_plan_kv_state(f.g, 0, 0, MS_LABEL_MAIN);
    const ms_graph_kv_state *region = ms_graph_plan_kv_state(pw, 0, 0, MS_LABEL_MAIN);
    assert_non_null(whole);
    assert_non_null(region);
    assert_ptr_not_equal(whole, region);
    assert_ptr_not_equal(whole->token_to_page, region->token_to_page);
    int32_t region_pages[8];
    memcpy(region_pages, region->token_to_page, sizeof region_pages);
    /* back-to-back replays of the whole forward never touch the region's slot-0 state */
    ingest_real(&f, 1);
    for (int i = 0; i < 4; i++) {
        ms_slot_lease l;
        ms_rid rows[2];
        int32_t n;
        assert_int_equal(ms_graph_plan_lease(f.g, WALK_DECODE, 1, 1, &l, &err), MS_OK);
        assert_int_equal(ms_graph_plan_step_ids(f.g, &l, (ms_rid[]){1}, 1, rows, 2, &n, &err),
                         MS_OK);
        gfx_run(&f, &l, rows, (int32_t[]){1, 1}, 2, 1, false);
        ms_graph_plan_release(f.g, f.r, &l, 1);
    }
    assert_memory_equal(region->token_to_page, region_pages, sizeof region_pages);
    assert_false(ms_graph_plan_is_dummy(pw, ms_graph_plan_dummy_rid(f.g, 0, 0)));
    ms_step_runner_remove(f.r, 1);
    ms_graph_plan_remove_dummies(pw, f.r);
    ms_graph_plan_free(pw);
    gfx_free(&f);
}

/* ---- staging details ---- */

static void test_stage_errors_and_positions_tail(void **state) {
    (void)state;
    gfx f;
    gfx_init(&f, 1);
    ms_error err = {0};
    int32_t b;
    assert_int_equal(ms_graph_plan_add_bucket(f.g, WALK_PREFILL, 2, 16, &b, &err), MS_OK);
    assert_int_equal(ms_graph_plan_ingest_dummies(f.g, f.r, &err), MS_OK);
    assert_int_equal(ms_graph_plan_ingest_dummies(f.g, f.r, &err), MS_OK); /* once */
    int32_t x;
    assert_int_equal(ms_graph_plan_add_bucket(f.g, WALK_PREFILL, 4, 16, &x, &err), MS_ERR_STATE);
    ms_slot_lease l;
    assert_int_equal(ms_graph_plan_capture_lease(f.g, b, 0, &l, &err), MS_OK);
    assert_int_equal(ms_graph_plan_capture_lease(f.g, b, 1, &l, &err), MS_ERR_INVALID_ARG);
    assert_int_equal(ms_graph_plan_capture_lease(f.g, b, 0, &l, &err), MS_OK);
    ms_rid rows[2];
    int32_t n;
    assert_int_equal(ms_graph_plan_step_ids(f.g, &l, NULL, 0, rows, 2, &n, &err), MS_OK);
    gfx_run(&f, &l, rows, (int32_t[]){10, 6}, 2, 0, true);
    ms_graph_plan_release(f.g, f.r, &l, 0);
    const ms_graph_pos_state *ps = ms_graph_plan_pos_state(f.g, 1, 0, MS_LABEL_MAIN);
    assert_int_equal(ps->n_tokens, 16);
    assert_int_equal(ps->ids[15], 5);
    /* a smaller replay: the tail goes back to 0 */
    ingest_real(&f, 1);
    gfx_run(&f, &l, (ms_rid[]){1, rows[1]}, (int32_t[]){3, 0}, 2, 1, false);
    assert_int_equal(ps->n_tokens, 3);
    assert_int_equal(ps->ids[2], 2);
    for (int32_t t = 3; t < 16; t++)
        assert_int_equal(ps->ids[t], 0);
    /* more tokens than the bucket, or staging without a lease */
    ms_kv_plan kp = *ms_kv_plan_find(&f.kv->set, MS_LABEL_MAIN);
    kp.n_tokens = 17;
    ms_kv_plan_set big = {8, 1, &kp, NULL, 0, NULL, 0, true};
    assert_int_equal(ms_graph_plan_stage_kv(f.g, &l, 0, &big, false, &err), MS_ERR_CAPACITY);
    ms_step_ctx ctx = {0};
    assert_int_equal(ms_graph_plan_stage_step(f.g, f.r, &ctx, &err), MS_ERR_STATE);
    ms_step_runner_remove(f.r, 1);
    gfx_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_select_tightest_bucket_by_tokens_then_bs),
        ms_unit_test(test_init_rejects_bad_config),
        ms_unit_test(test_F2_one_slot_counter_across_buckets),
        ms_unit_test(test_F3_alias_lease_names_capture_walk_and_reuses_capture_state),
        ms_unit_test(test_F1_padding_tail_addresses_only_sink),
        ms_unit_test(test_H9c_failed_slot_capture_is_never_leased),
        ms_unit_test(test_step_ids_are_real_ids_then_capture_tail),
        ms_unit_test(test_release_resets_only_dummy_rows_and_keeps_their_pages),
        ms_unit_test(test_H13_1000_padded_replays_keep_dummy_positions_bounded),
        ms_unit_test(test_H9a_two_nodes_sharing_kv_use_disjoint_dummy_rows),
        ms_unit_test(test_H8_staged_preplan_refused_for_another_batch),
        ms_unit_test(test_F6_abandon_waits_for_running_preplan),
        ms_unit_test(test_F6_H8_preplan_stress_across_threads),
        ms_unit_test(test_H9b_piecewise_region_has_its_own_slot_state),
        ms_unit_test(test_stage_errors_and_positions_tail),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
