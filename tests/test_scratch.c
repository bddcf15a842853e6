/*
 * test_scratch.c - scratch pool resource (DESIGN.md §3): fixed-shape buffer keyed by batch row,
 * one stable address for the resource's lifetime (what a captured graph records), admit refusing
 * batches larger than the buffer, no per-request state, error paths.
 * The scratch KV (ms_scratch_kv): a code predictor's per-frame cache laid out as the paged arena
 * the CPU backend's kv_write and attention read; over several frames with rows reassigned, each
 * step's attention equals a naive causal softmax over the current frame's keys only (the row is
 * emptied when its frame begins), the buffer never moves, and every hazard (continuing a frame
 * never begun, a frame longer than the positions, a row twice in a step, a row out of range, a
 * negative span, too many rows, bad sizes, out of memory) is refused naming it, changing nothing.
 */
#include "ms_test.h"

#include <math.h>
#include <string.h>

#include "backend.h"
#include "device.h"
#include "scratch.h"
#include "step_runner.h"

#include "ms_test_impl.h"

static const int scratch_rec = 1;

static ms_device *host_device(size_t capacity) {
    ms_device *dev = NULL;
    assert_int_equal(ms_device_host_init(capacity, &dev, NULL), MS_OK);
    return dev;
}

static void test_rows_are_fixed_slices_of_one_buffer(void **state) {
    (void)state;
    ms_scratch *s;
    ms_error err = {0};
    ms_device *dev = host_device(0);
    ms_scratch_config cfg = {dev, 4, 96};
    assert_int_equal(ms_scratch_init(&s, &cfg, &err), MS_OK);
    unsigned char *r0 = ms_scratch_row(s, 0);
    assert_non_null(r0);
    for (int32_t r = 0; r < 4; r++) {
        unsigned char *p = ms_scratch_row(s, r);
        assert_ptr_equal(p, r0 + (size_t)r * 96);
        for (int k = 0; k < 96; k++)
            assert_int_equal(p[k], 0); /* zero-filled */
        memset(p, r + 1, 96);          /* whole row writable (ASan checks the bounds) */
    }
    assert_null(ms_scratch_row(s, 4));
    assert_null(ms_scratch_row(s, -1));
    assert_int_equal(ms_scratch_max_rows(s), 4);
    ms_scratch_free(s);
    ms_scratch_free(NULL);
    ms_device_free(dev);
}

static void test_stable_address_across_steps_through_runner(void **state) {
    (void)state;
    ms_device *dev = host_device(0);
    ms_scratch_config cfg = {dev, 8, 64};
    ms_resource_spec specs[] = {
        {"code_predictor", MS_RESOURCE_SCRATCH, NULL, 0, ms_scratch_build, &cfg, NULL, NULL},
    };
    ms_step_runner *r;
    ms_error err = {0};
    assert_int_equal(ms_step_runner_init(&r, specs, 1, &err), MS_OK);
    ms_scratch *s = ms_step_runner_resource(r, 0);
    void *base = ms_scratch_row(s, 0);
    /* requests come and go: the scratch has no per-request state and never moves */
    for (int step = 0; step < 20; step++) {
        ms_rid rows[8];
        int32_t n = 1 + step % 8;
        ms_segment segs[8];
        for (int32_t i = 0; i < n; i++) {
            rows[i] = (ms_rid)(step * 8 + i);
            segs[i] = (ms_segment){rows[i], 0, 1};
            assert_int_equal(ms_step_runner_ingest(r, rows[i], NULL, &err), MS_OK);
        }
        ms_step st = {.name = "talker_decode", .segments = segs, .n_segments = n};
        st.records[0].rec = &scratch_rec;
        ms_step_ctx ctx = {.request_ids = rows, .n_rows = n, .n_real = n};
        assert_int_equal(ms_step_runner_admit(r, &st, &ctx).code, MS_ADMIT_OK);
        assert_int_equal(ms_step_runner_plan(r, &st, &ctx, &err), MS_OK);
        const ms_scratch_plan *p = ctx.plan_results[0];
        assert_ptr_equal(p->base, base);
        assert_int_equal(p->row_bytes, 64);
        assert_int_equal(p->n_rows, n);
        assert_int_equal(ms_step_runner_commit(r, &st, &ctx, &err), MS_OK);
        for (int32_t i = 0; i < n; i++) {
            ms_step_runner_reset(r, rows[i], false);
            ms_step_runner_remove(r, rows[i]);
        }
    }
    assert_ptr_equal(ms_scratch_row(s, 0), base);
    ms_step_runner_free(r);
    ms_device_free(dev);
}

static void test_admit_refuses_more_rows_than_buffer(void **state) {
    (void)state;
    ms_device *dev = host_device(0);
    ms_scratch_config cfg = {dev, 2, 16};
    ms_resource_spec specs[] = {
        {"scratch", MS_RESOURCE_SCRATCH, NULL, 0, ms_scratch_build, &cfg, NULL, NULL},
    };
    ms_step_runner *r;
    ms_error err = {0};
    assert_int_equal(ms_step_runner_init(&r, specs, 1, &err), MS_OK);
    ms_segment segs[] = {{1, 0, 1}, {2, 0, 1}, {3, 0, 1}};
    ms_step st = {.name = "decode", .segments = segs, .n_segments = 3};
    st.records[0].rec = &scratch_rec;
    ms_step_ctx ctx = {0};
    ms_admit_outcome o = ms_step_runner_admit(r, &st, &ctx);
    assert_int_equal(o.code, MS_ADMIT_INVALID);
    assert_int_equal(o.resource, 0);
    assert_int_equal(ms_step_runner_plan(r, &st, &ctx, &err), MS_ERR_CAPACITY);
    assert_non_null(strstr(err.msg, "3 rows, above max_rows 2"));
    /* padded rows count through the context, not the segments */
    ms_rid rows[] = {1, 2};
    ms_step_ctx c2 = {.request_ids = rows, .n_rows = 2, .n_real = 1};
    assert_int_equal(ms_step_runner_admit(r, &st, &c2).code, MS_ADMIT_OK);
    ms_step_runner_free(r);
    ms_device_free(dev);
}

static void test_init_errors_name_the_size(void **state) {
    (void)state;
    ms_scratch *s = NULL;
    ms_error err = {0};
    ms_device *dev = host_device(0);
    ms_scratch_config bad = {NULL, 4, 16};
    assert_int_equal(ms_scratch_init(&s, &bad, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "no device"));
    bad = (ms_scratch_config){dev, 0, 16};
    assert_int_equal(ms_scratch_init(&s, &bad, &err), MS_ERR_INVALID_ARG);
    bad = (ms_scratch_config){dev, 4, 0};
    assert_int_equal(ms_scratch_init(&s, &bad, &err), MS_ERR_INVALID_ARG);
    bad = (ms_scratch_config){dev, INT32_MAX, SIZE_MAX / 2};
    assert_int_equal(ms_scratch_init(&s, &bad, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "overflow"));
    ms_scratch_config ok = {dev, 4, 16};
    ms_alloc_fail_nth(1);
    assert_int_equal(ms_scratch_init(&s, &ok, &err), MS_ERR_OOM);
    assert_null(s);
    ms_alloc_fail_nth(2);
    assert_int_equal(ms_scratch_init(&s, &ok, &err), MS_ERR_OOM);
    assert_non_null(strstr(err.msg, "4 rows x 16 bytes (scratch max_rows)"));
    assert_null(s);
    /* a device too small for the buffer: the error names the allocation */
    ms_device *small = host_device(100);
    ms_scratch_config big = {small, 4, 64};
    assert_int_equal(ms_scratch_init(&s, &big, &err), MS_ERR_OOM);
    assert_non_null(strstr(err.msg, "scratch max_rows"));
    ms_device_free(small);
    ms_device_free(dev);
    ms_resource_spec specs[] = {
        {"scratch", MS_RESOURCE_SCRATCH, NULL, 0, ms_scratch_build, NULL, NULL, NULL},
    };
    ms_step_runner *r = NULL;
    assert_int_equal(ms_step_runner_init(&r, specs, 1, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "building resource 'scratch': scratch: no config"));
}

/* ---- scratch KV ---- */

enum { SK_ROWS = 3, SK_LAYERS = 2, SK_POS = 4, SK_HKV = 1, SK_HQ = 2, SK_D = 4 };

static uint32_t sk_rng = 12345u;
static float sk_rand(void) {
    sk_rng = sk_rng * 1664525u + 1013904223u;
    return (float)((sk_rng >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static void test_scratch_kv_attention_is_per_frame(void **state) {
    (void)state;
    ms_error err = {0};
    ms_device *dev = host_device(0);
    ms_backend be;
    ms_backend_cpu_options o = {1};
    assert_int_equal(ms_backend_cpu_init(&be, &o, &err), MS_OK);
    ms_scratch_kv_config cfg = {dev, SK_ROWS, SK_LAYERS, SK_POS, SK_HKV, SK_D, sizeof(float)};
    ms_scratch_kv *s;
    assert_int_equal(ms_scratch_kv_init(&s, &cfg, &err), MS_OK);
    ms_paged_kv kv = {ms_scratch_kv_data(s), MS_DTYPE_F32, SK_LAYERS, ms_scratch_kv_pages(s),
                      SK_POS, SK_HKV, SK_D};
    assert_int_equal(ms_paged_kv_bytes(&kv), ms_scratch_kv_bytes(s)); /* the layouts agree */
    void *const base = ms_scratch_kv_data(s);
    ms_attn_limits lim = {SK_ROWS, SK_ROWS * SK_POS, SK_ROWS};
    ms_attn_batch *b;
    assert_int_equal(be.iface.attn_batch_init(be.ctx, &lim, &b, &err), MS_OK);
    /* the frame's keys and values as the reference keeps them, per batch row */
    float hk[SK_ROWS][SK_POS][SK_D], hv[SK_ROWS][SK_POS][SK_D];
    /* frames of G = 4 code positions: spans 2, 1, 1 (the predictor's steps); rows reassigned */
    static const int32_t frame_rows[4][3] = {{2, 0, -1}, {0, 1, 2}, {1, -1, -1}, {2, 1, -1}};
    static const int32_t spans[3] = {2, 1, 1};
    const int32_t layer = 1;
    double worst = 0.0;
    for (int f = 0; f < 4; f++) {
        int32_t n = 0;
        while (n < 3 && frame_rows[f][n] >= 0)
            n++;
        for (int st = 0; st < 3; st++) {
            ms_scratch_kv_row rows[3];
            int32_t T = 0;
            for (int32_t i = 0; i < n; i++) {
                rows[i] = (ms_scratch_kv_row){(ms_rid)(100 + 10 * f + frame_rows[f][i]),
                                              frame_rows[f][i], spans[st], st == 0};
                T += spans[st];
            }
            ms_kv_plan plan;
            assert_int_equal(ms_scratch_kv_plan(s, rows, n, &plan, &err), MS_OK);
            assert_int_equal(plan.n_tokens, T);
            assert_int_equal(plan.is_decode, spans[st] == 1);
            assert_int_equal(be.iface.attn_batch_stage(be.ctx, b, &plan, &kv, &err), MS_OK);
            assert_int_equal(ms_scratch_kv_commit(s, &err), MS_OK);
            float q[6][SK_HQ * SK_D], k[6][SK_D], v[6][SK_D], out[6][SK_HQ * SK_D];
            for (int32_t t = 0; t < T; t++) {
                for (int j = 0; j < SK_HQ * SK_D; j++)
                    q[t][j] = sk_rand();
                for (int j = 0; j < SK_D; j++) {
                    k[t][j] = sk_rand();
                    v[t][j] = sk_rand();
                }
            }
            ms_tensor tq = ms_tensor_3d(q, MS_DTYPE_F32, T, SK_HQ, SK_D);
            ms_tensor tk = ms_tensor_3d(k, MS_DTYPE_F32, T, SK_HKV, SK_D);
            ms_tensor tv = ms_tensor_3d(v, MS_DTYPE_F32, T, SK_HKV, SK_D);
            ms_tensor to = ms_tensor_3d(out, MS_DTYPE_F32, T, SK_HQ, SK_D);
            assert_int_equal(be.iface.kv_write(be.ctx, &kv, layer, &tk, &tv, b, &err), MS_OK);
            ms_attn_params p = {0.5f, 0, true};
            assert_int_equal(be.iface.attention(be.ctx, &tq, &kv, layer, b, &p, &to, &err), MS_OK);
            /* reference: causal softmax over this frame's keys of the row */
            int32_t t = 0;
            for (int32_t i = 0; i < n; i++) {
                const int32_t r = rows[i].row;
                const int32_t held = st == 0 ? 0 : (st == 1 ? 2 : 3);
                assert_int_equal(ms_scratch_kv_length(s, r), held + spans[st]);
                for (int32_t j = 0; j < spans[st]; j++, t++) {
                    memcpy(hk[r][held + j], k[t], sizeof hk[r][0]);
                    memcpy(hv[r][held + j], v[t], sizeof hv[r][0]);
                }
                t -= spans[st];
                for (int32_t j = 0; j < spans[st]; j++, t++) {
                    const int32_t P = held + j; /* the query's position in the frame */
                    for (int h = 0; h < SK_HQ; h++) {
                        double sc[SK_POS], mx = -INFINITY, sum = 0.0;
                        for (int32_t kk = 0; kk <= P; kk++) {
                            double d = 0.0;
                            for (int e = 0; e < SK_D; e++)
                                d += (double)q[t][h * SK_D + e] * hk[r][kk][e];
                            sc[kk] = 0.5 * d;
                            mx = fmax(mx, sc[kk]);
                        }
                        for (int32_t kk = 0; kk <= P; kk++)
                            sum += (sc[kk] = exp(sc[kk] - mx));
                        for (int e = 0; e < SK_D; e++) {
                            double acc = 0.0;
                            for (int32_t kk = 0; kk <= P; kk++)
                                acc += sc[kk] / sum * hv[r][kk][e];
                            double diff = fabs(acc - out[t][h * SK_D + e]);
                            if (!(diff <= worst))
                                worst = isnan(diff) ? INFINITY : diff;
                        }
                    }
                }
            }
            assert_ptr_equal(ms_scratch_kv_data(s), base);
        }
    }
    assert_true(worst < 1e-5);
    /* the rows' pages are theirs for the object's lifetime; page 0 is the sink */
    for (int32_t r = 0; r < SK_ROWS; r++)
        assert_int_equal(ms_scratch_kv_row_page(s, r), r + 1);
    assert_int_equal(ms_scratch_kv_row_page(s, SK_ROWS), -1);
    assert_int_equal(ms_scratch_kv_length(s, -1), -1);
    be.iface.attn_batch_free(be.ctx, b);
    ms_backend_free(&be);
    ms_scratch_kv_free(s);
    ms_scratch_kv_free(NULL);
    ms_device_free(dev);
}

static void test_scratch_kv_hazards_are_refused(void **state) {
    (void)state;
    ms_error err = {0};
    ms_device *dev = host_device(0);
    ms_scratch_kv_config cfg = {dev, 2, 1, 3, 1, 2, sizeof(float)};
    ms_scratch_kv *s;
    assert_int_equal(ms_scratch_kv_init(&s, &cfg, &err), MS_OK);
    ms_kv_plan plan;
    /* a row that never began a frame would read whatever the buffer holds */
    ms_scratch_kv_row cont = {7, 1, 1, false};
    assert_int_equal(ms_scratch_kv_plan(s, &cont, 1, &plan, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "batch row 1 continues a frame it never began"));
    ms_scratch_kv_row first[2] = {{7, 0, 2, true}, {7, 1, 1, true}};
    assert_int_equal(ms_scratch_kv_plan(s, first, 2, &plan, &err), MS_OK);
    assert_int_equal(ms_scratch_kv_length(s, 0), 0); /* applied at commit, not at plan */
    assert_int_equal(ms_scratch_kv_commit(s, &err), MS_OK);
    assert_int_equal(ms_scratch_kv_commit(s, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "commit without a pending plan"));
    /* the batch recomposed mid-frame: row 1 now carries another request */
    ms_scratch_kv_row other = {8, 1, 1, false};
    assert_int_equal(ms_scratch_kv_plan(s, &other, 1, &plan, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "batch row 1 continues request 7's frame for request 8"));
    /* an abandoned plan changes nothing */
    ms_scratch_kv_row more = {7, 1, 1, false};
    assert_int_equal(ms_scratch_kv_plan(s, &more, 1, &plan, &err), MS_OK);
    ms_scratch_kv_abandon(s);
    assert_int_equal(ms_scratch_kv_length(s, 1), 1);
    /* a frame longer than the positions; nothing changes (row 1 keeps its token) */
    ms_scratch_kv_row over[2] = {{7, 1, 1, false}, {7, 0, 2, false}};
    assert_int_equal(ms_scratch_kv_plan(s, over, 2, &plan, &err), MS_ERR_CAPACITY);
    assert_non_null(strstr(err.msg, "batch row 0 would hold 4 tokens in one frame, above the "
                                    "scratch's 3 positions"));
    assert_int_equal(ms_scratch_kv_length(s, 0), 2);
    assert_int_equal(ms_scratch_kv_length(s, 1), 1);
    ms_scratch_kv_row twice[2] = {{7, 1, 1, false}, {7, 1, 1, false}};
    assert_int_equal(ms_scratch_kv_plan(s, twice, 2, &plan, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "batch row 1 is given twice in one step"));
    ms_scratch_kv_row out = {7, 2, 1, true};
    assert_int_equal(ms_scratch_kv_plan(s, &out, 1, &plan, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "view 0 names batch row 2 (rows 0 .. 1)"));
    ms_scratch_kv_row neg = {7, 0, -1, false};
    assert_int_equal(ms_scratch_kv_plan(s, &neg, 1, &plan, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "batch row 0 has span -1"));
    ms_scratch_kv_row three[3] = {{7, 0, 1, true}, {7, 1, 1, true}, {7, 0, 1, true}};
    assert_int_equal(ms_scratch_kv_plan(s, three, 3, &plan, &err), MS_ERR_CAPACITY);
    assert_non_null(strstr(err.msg, "3 rows, above max_rows 2"));
    assert_int_equal(ms_scratch_kv_length(s, 1), 1);
    /* beginning a frame empties the row: its view covers only the new tokens */
    ms_scratch_kv_row again = {9, 0, 1, true};
    assert_int_equal(ms_scratch_kv_plan(s, &again, 1, &plan, &err), MS_OK);
    assert_int_equal(ms_scratch_kv_commit(s, &err), MS_OK);
    assert_int_equal(ms_scratch_kv_length(s, 0), 1);
    assert_int_equal(plan.views[0].rid, 9);
    assert_int_equal(plan.views[0].length, 1);
    assert_int_equal(plan.kv_last_page_len[0], 1);
    assert_int_equal(plan.token_to_slot[0], 0);
    assert_int_equal(plan.kv_indices[0], 1);
    /* an empty step (span 0) plans a view without pages */
    ms_scratch_kv_row none = {7, 1, 0, true};
    assert_int_equal(ms_scratch_kv_plan(s, &none, 1, &plan, &err), MS_OK);
    assert_int_equal(plan.kv_indptr[1], 0);
    assert_int_equal(plan.kv_last_page_len[0], 0);
    ms_scratch_kv_free(s);
    /* bad sizes, overflow, out of memory (host and device) */
    ms_scratch_kv_config bad = {NULL, 2, 1, 3, 1, 2, 4};
    assert_int_equal(ms_scratch_kv_init(&s, &bad, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "no device"));
    assert_null(s);
    bad = (ms_scratch_kv_config){dev, 2, 1, 0, 1, 2, 4};
    assert_int_equal(ms_scratch_kv_init(&s, &bad, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "positions 0"));
    bad = (ms_scratch_kv_config){dev, 1 << 20, 1 << 10, 1 << 12, 64, 128, 4};
    assert_int_equal(ms_scratch_kv_init(&s, &bad, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "overflow"));
    for (int nth = 1; nth <= 3; nth++) {
        ms_alloc_fail_nth(nth);
        assert_int_equal(ms_scratch_kv_init(&s, &cfg, &err), MS_ERR_OOM);
        assert_null(s);
    }
    ms_device *small = host_device(64);
    ms_scratch_kv_config big = {small, 2, 2, 4, 2, 8, 4};
    assert_int_equal(ms_scratch_kv_init(&s, &big, &err), MS_ERR_OOM);
    assert_non_null(strstr(err.msg, "scratch kv: 2 rows x"));
    assert_null(s);
    ms_device_free(small);
    ms_device_free(dev);
}

/* Through the step runner: segment i is batch row i; the record says whether a frame begins. */
static void test_scratch_kv_through_runner(void **state) {
    (void)state;
    ms_error err = {0};
    ms_device *dev = host_device(0);
    ms_scratch_kv_config cfg = {dev, 2, 2, 4, 1, 16, sizeof(float)};
    ms_resource_spec specs[] = {
        {"code_predictor", MS_RESOURCE_SCRATCH, NULL, 0, ms_scratch_kv_build, &cfg, NULL, NULL},
    };
    ms_step_runner *r;
    assert_int_equal(ms_step_runner_init(&r, specs, 1, &err), MS_OK);
    ms_scratch_kv *s = ms_step_runner_resource(r, 0);
    void *base = ms_scratch_kv_data(s);
    static const ms_scratch_kv_step begin = {true}, cont = {false};
    for (int frame = 0; frame < 3; frame++) {
        ms_rid rids[2] = {(ms_rid)(1 + frame), (ms_rid)(50 + frame)};
        for (int i = 0; i < 2; i++)
            assert_int_equal(ms_step_runner_ingest(r, rids[i], NULL, &err), MS_OK);
        for (int st = 0; st < 3; st++) {
            int32_t span = st == 0 ? 2 : 1;
            ms_segment segs[2] = {{rids[0], 0, span}, {rids[1], 0, span}};
            ms_step step = {.name = st == 0 ? "first" : "next", .segments = segs, .n_segments = 2};
            step.records[0].rec = st == 0 ? &begin : &cont;
            ms_step_ctx ctx = {.request_ids = rids, .n_rows = 2, .n_real = 2};
            assert_int_equal(ms_step_runner_admit(r, &step, &ctx).code, MS_ADMIT_OK);
            assert_int_equal(ms_step_runner_plan(r, &step, &ctx, &err), MS_OK);
            const ms_kv_plan *p = ctx.plan_results[0];
            assert_int_equal(p->n_views, 2);
            assert_int_equal(p->views[1].length, st == 0 ? 2 : 2 + st);
            assert_int_equal(p->kv_indices[1], 2); /* row 1's page, whatever the request */
            assert_int_equal(p->token_to_slot[p->qo_indptr[1]], st == 0 ? 0 : 1 + st);
            assert_int_equal(ms_step_runner_commit(r, &step, &ctx, &err), MS_OK);
        }
        /* a fifth token does not fit the frame's 4 positions */
        ms_segment segs[2] = {{rids[0], 0, 1}, {rids[1], 0, 1}};
        ms_step step = {.name = "next", .segments = segs, .n_segments = 2};
        step.records[0].rec = &cont;
        ms_step_ctx ctx = {.request_ids = rids, .n_rows = 2, .n_real = 2};
        assert_int_equal(ms_step_runner_admit(r, &step, &ctx).code, MS_ADMIT_OK);
        assert_int_equal(ms_step_runner_plan(r, &step, &ctx, &err), MS_ERR_CAPACITY);
        assert_non_null(strstr(err.msg, "step 'next': scratch kv: batch row 0 would hold 5 tokens"));
        for (int i = 0; i < 2; i++)
            ms_step_runner_remove(r, rids[i]);
    }
    /* more rows than the buffer, or a span above the positions, cannot be admitted */
    ms_segment three[3] = {{1, 0, 1}, {2, 0, 1}, {3, 0, 1}};
    ms_step big = {.name = "first", .segments = three, .n_segments = 3};
    big.records[0].rec = &begin;
    ms_step_ctx c3 = {0};
    assert_int_equal(ms_step_runner_admit(r, &big, &c3).code, MS_ADMIT_INVALID);
    ms_segment wide[1] = {{1, 0, 5}};
    ms_step w = {.name = "first", .segments = wide, .n_segments = 1};
    w.records[0].rec = &begin;
    ms_step_ctx c1 = {0};
    assert_int_equal(ms_step_runner_admit(r, &w, &c1).code, MS_ADMIT_INVALID);
    assert_ptr_equal(ms_scratch_kv_data(s), base);
    ms_step_runner_free(r);
    ms_resource_spec none[] = {
        {"code_predictor", MS_RESOURCE_SCRATCH, NULL, 0, ms_scratch_kv_build, NULL, NULL, NULL},
    };
    assert_int_equal(ms_step_runner_init(&r, none, 1, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "scratch kv: no config"));
    ms_device_free(dev);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_rows_are_fixed_slices_of_one_buffer),
        ms_unit_test(test_stable_address_across_steps_through_runner),
        ms_unit_test(test_admit_refuses_more_rows_than_buffer),
        ms_unit_test(test_init_errors_name_the_size),
        ms_unit_test(test_scratch_kv_attention_is_per_frame),
        ms_unit_test(test_scratch_kv_hazards_are_refused),
        ms_unit_test(test_scratch_kv_through_runner),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
