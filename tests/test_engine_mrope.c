/*
 * test_engine_mrope.c - multimodal RoPE (Qwen2-VL) end to end through the engine API and the
 * descriptor mstarc generates from models/qwen2vl.mstar (rope sections read from config.json as
 * an int[], `pos explicit` prefill, three position streams t/h/w), on the CPU in float32 against
 * ../shared/fixtures/hf/qwen2vl_mrope (reference.safetensors: input_ids [24], position_ids_thw
 * [3, 24]: 6 text tokens, a 1x3x4 image grid, 6 text tokens; logits [24, vocab] of one prefill):
 *   - with the reference's t/h/w ids, the logits at every prompt position are within 1e-3
 *     (prefill_chunk 1: each position is the last token of its step, so its logits are the
 *     request's last logits), and in one whole-prompt step the last position's logits too;
 *   - with sequential ids on every axis (the same as giving none), the first text tokens match
 *     (the image grid's are different positions, so they must not);
 *   - the stream after an explicit prompt continues at max(id) + 1, not at the prompt length:
 *     a decode step after the grid prompt gives the same id as the same step re-run from scratch
 *     with the ids shifted so that max + 1 equals the length (positions are relative in RoPE);
 *   - ids with the wrong number of axes are refused naming both counts.
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

extern const ms_model_desc ms_qwen2vl_desc;

#define TOL 1e-3f

static ms_engine *open_q2vl(void) {
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture("hf/qwen2vl_mrope");
    o.max_seqs = 2;
    o.max_tokens = 64;
    ms_engine *e = NULL;
    ms_error err = {0};
    if (ms_engine_init(&e, &ms_qwen2vl_desc, &o, &err) != MS_OK)
        fail_msg("engine: %s", err.msg);
    return e;
}

typedef struct fixture {
    ms_st_file *f;
    int32_t *ids, *thw;
    float *logits;
    size_t n;
} fixture;

static void fixture_load(fixture *fx) {
    char path[1024];
    snprintf(path, sizeof path, "%s/reference.safetensors", ms_test_fixture("hf/qwen2vl_mrope"));
    ms_error err = {0};
    assert_int_equal(ms_st_file_init(&fx->f, path, &err), MS_OK);
    size_t np, nl;
    fx->ids = ms_test_ref_tensor(fx->f, "input_ids", true, &fx->n);
    fx->thw = ms_test_ref_tensor(fx->f, "position_ids_thw", true, &np);
    fx->logits = ms_test_ref_tensor(fx->f, "logits", false, &nl);
    assert_int_equal(np, 3 * fx->n);
}

static void fixture_free(fixture *fx) {
    ms_free(fx->ids);
    ms_free(fx->thw);
    ms_free(fx->logits);
    ms_st_file_free(fx->f);
}

static float max_diff(const float *a, const float *b, int32_t n) {
    float m = 0.0f;
    for (int32_t i = 0; i < n; i++)
        m = fmaxf(m, fabsf(a[i] - b[i]));
    return m;
}

/* Run the prompt with `thw` ids ([3][n], NULL: none) in steps of `chunk` tokens (0: whole) and
 * return the max error over the positions whose logits it sees, from position `from` on. */
static float run_prompt(ms_engine *e, const fixture *fx, const int32_t *thw, int32_t chunk,
                        int32_t from, int32_t to, int32_t max_new, int32_t *first_id) {
    ms_error err = {0};
    const int32_t V = ms_engine_facts(e)->vocab;
    ms_engine_request rq = {.prompt = fx->ids, .n_prompt = (int32_t)fx->n,
                            .max_new_tokens = max_new, .sampling = ms_sampling_greedy(),
                            .ignore_eos = true, .prefill_chunk = chunk,
                            .position_ids = thw, .n_position_axes = thw != NULL ? 3 : 0};
    ms_rid rid;
    if (ms_engine_add(e, &rq, &rid, &err) != MS_OK)
        fail_msg("add: %s", err.msg);
    float worst = 0.0f;
    int32_t done = 0;
    while (ms_engine_n_active(e) > 0) {
        if (ms_engine_step(e, NULL, &err) != MS_OK)
            fail_msg("step: %s", err.msg);
        int32_t p = (chunk > 0 ? MS_MIN(done + chunk, (int32_t)fx->n) : (int32_t)fx->n) - 1;
        const float *lg = ms_engine_last_logits(e, rid);
        if (lg != NULL && done < (int32_t)fx->n) {
            if (p >= from && p < to)
                worst = fmaxf(worst, max_diff(lg, fx->logits + (size_t)p * (size_t)V, V));
            done = p + 1;
        }
    }
    const int32_t *out;
    int32_t n_out;
    assert_int_equal(ms_engine_output(e, rid, &out, &n_out, NULL), MS_OK);
    assert_int_equal(n_out, max_new);
    if (first_id != NULL)
        for (int32_t i = 0; i < n_out; i++)
            first_id[i] = out[i];
    ms_engine_remove(e, rid);
    return worst;
}

static void test_mrope_reference(void **state) {
    (void)state;
    fixture fx;
    fixture_load(&fx);
    ms_engine *e = open_q2vl();
    const int32_t free0 = ms_engine_kv_pages_free(e);
    const int32_t n = (int32_t)fx.n;
    /* every position, one token per step, with the reference's t/h/w ids */
    float err1 = run_prompt(e, &fx, fx.thw, 1, 0, n, 1, NULL);
    /* the whole prompt in one step: the last position */
    float err2 = run_prompt(e, &fx, fx.thw, 0, n - 1, n, 1, NULL);
    printf("qwen2vl_mrope on cpu: %d positions, max |logit - reference| %.2e (chunked), "
           "%.2e (one step, last position); tol %.0e\n", (int)n, (double)err1, (double)err2,
           (double)TOL);
    assert_true(err1 < TOL);
    assert_true(err2 < TOL);
    /* text ids on every axis (what no ids give): the 6 leading text tokens agree, the grid's
       tokens cannot (other positions) */
    float lead = run_prompt(e, &fx, NULL, 1, 0, 6, 1, NULL);
    float grid = run_prompt(e, &fx, NULL, 1, 6, 18, 1, NULL);
    printf("without ids: leading text %.2e, image grid %.2e\n", (double)lead, (double)grid);
    assert_true(lead < TOL);
    assert_true(grid > 1e-2f);
    assert_int_equal(ms_engine_kv_pages_free(e), free0);
    ms_engine_free(e);
    fixture_free(&fx);
}

/* After an explicit prompt the stream continues at max(id) + 1 on every axis: two decode steps
 * after the grid prompt give the ids of the same prompt whose ids are all shifted so that
 * max + 1 lands on... the same relative offsets (RoPE sees only differences), i.e. the decode ids
 * do not depend on a constant shift of the prompt's ids, and they do depend on where decoding
 * continues (a stream continuing at n instead of max + 1 gives other logits). */
static void test_mrope_decode_continues_after_max(void **state) {
    (void)state;
    fixture fx;
    fixture_load(&fx);
    ms_engine *e = open_q2vl();
    const int32_t n = (int32_t)fx.n;
    int32_t top = 0;
    for (int32_t i = 0; i < 3 * n; i++)
        top = MS_MAX(top, fx.thw[i]);
    assert_true(top + 1 < n); /* the grid compresses positions: max + 1 < length */
    int32_t a[4], b[4];
    run_prompt(e, &fx, fx.thw, 0, 0, 0, 4, a);
    /* shifted by 5: max + 1 moves by 5 too, every difference stays */
    int32_t *shift = ms_malloc(sizeof(int32_t) * 3 * (size_t)n);
    assert_non_null(shift);
    for (int32_t i = 0; i < 3 * n; i++)
        shift[i] = fx.thw[i] + 5;
    run_prompt(e, &fx, shift, 0, 0, 0, 4, b);
    assert_memory_equal(a, b, sizeof a);
    /* the decode step's own logits: equal to a prompt that carries the first sampled id at
       position max + 1 explicitly */
    int32_t *ids2 = ms_malloc(sizeof(int32_t) * ((size_t)n + 1));
    int32_t *thw2 = ms_malloc(sizeof(int32_t) * 3 * ((size_t)n + 1));
    assert_non_null(ids2);
    assert_non_null(thw2);
    memcpy(ids2, fx.ids, sizeof(int32_t) * (size_t)n);
    ids2[n] = a[0];
    for (int32_t ax = 0; ax < 3; ax++) {
        memcpy(thw2 + (size_t)ax * (size_t)(n + 1), fx.thw + (size_t)ax * (size_t)n,
               sizeof(int32_t) * (size_t)n);
        thw2[(size_t)ax * (size_t)(n + 1) + (size_t)n] = top + 1;
    }
    fixture fx2 = fx;
    fx2.ids = ids2;
    fx2.n = (size_t)n + 1;
    int32_t c[3];
    run_prompt(e, &fx2, thw2, 0, 0, 0, 3, c);
    assert_memory_equal(c, a + 1, sizeof c);
    ms_free(ids2);
    ms_free(thw2);
    ms_free(shift);
    ms_engine_free(e);
    fixture_free(&fx);
}

static void test_mrope_axes_refused(void **state) {
    (void)state;
    ms_engine *e = open_q2vl();
    int32_t ids[3] = {1, 2, 3}, pos[3] = {0, 1, 2};
    ms_engine_request rq = {.prompt = ids, .n_prompt = 3, .max_new_tokens = 1,
                            .sampling = ms_sampling_greedy(), .position_ids = pos,
                            .n_position_axes = 1};
    ms_rid rid;
    ms_error err = {0};
    assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "position ids with 1 axes, model qwen2vl takes 3"));
    ms_engine_free(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_mrope_reference),
        ms_unit_test(test_mrope_decode_continues_after_max),
        ms_unit_test(test_mrope_axes_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
