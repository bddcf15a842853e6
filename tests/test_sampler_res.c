/*
 * test_sampler_res.c - the sampler resource's per-request extras (sample_res.h): min_p reaches
 * the planned rows; penalties over the observed history (prompt ids for repetition, generated ids
 * counted for frequency and presence) are applied by ms_sample_res_mix to that request's row only,
 * equal to ms_sampler_apply_penalties on the same history; bad values and unknown requests are
 * refused naming them; ms_sample_res_needs_host is true exactly when mix has a row to change; a
 * removed request's history is freed (the leak check of every test).
 */
#include "ms_test.h"

#include <math.h>
#include <string.h>

#include "sample_res.h"
#include "ms_test_impl.h"

enum { V = 16 };

static void test_extras_plan_and_mix(void **state) {
    (void)state;
    ms_error err = {0};
    ms_sample_res *s = NULL;
    assert_int_equal(ms_sample_res_init(&s, 4, &err), MS_OK);
    const ms_resource_i *f = ms_sample_res_iface();
    ms_sample_settings a = {{0.8f, 0, 1.0f, 1}, 1.0f}, b = {{0.8f, 0, 1.0f, 2}, 1.0f};
    assert_int_equal(f->ingest(s, 10, &a, &err), MS_OK);
    assert_int_equal(f->ingest(s, 11, &b, &err), MS_OK);
    ms_sample_extra xa = {0.25f, {0.5f, 0.3f, 1.5f}};
    assert_int_equal(ms_sample_res_set_extra(s, 10, &xa, &err), MS_OK);
    const int32_t prompt[3] = {1, 2, 2};
    const int32_t out[4] = {5, 5, 2, 7};
    assert_int_equal(ms_sample_res_observe(s, 10, prompt, 3, true, &err), MS_OK);
    assert_int_equal(ms_sample_res_observe(s, 10, out, 4, false, &err), MS_OK);
    /* request 11 has no penalties: observing is a no-op */
    assert_int_equal(ms_sample_res_observe(s, 11, out, 4, false, &err), MS_OK);

    ms_segment segs[2] = {{10, 0, 1}, {11, 0, 1}};
    bool sample[2] = {true, true};
    ms_sample_step rec = {sample, NULL};
    ms_step step = {.name = "decode", .segments = segs, .n_segments = 2};
    step.records[0].rec = &rec;
    ms_step_ctx ctx = {0};
    const void *planned = NULL;
    assert_int_equal(f->plan(s, 0, &step, &ctx, &planned, &err), MS_OK);
    const ms_sample_row *rows = planned;
    assert_float_equal(rows[0].min_p, 0.25f, 0.0);
    assert_float_equal(rows[1].min_p, 0.0f, 0.0);

    float z[2 * V], want[V];
    for (int i = 0; i < 2 * V; i++)
        z[i] = (float)((i * 7) % 11) - 4.0f;
    memcpy(want, z, sizeof want);
    /* the reference: the same history by hand (ids 1, 2 in the prompt; 5 x2, 2 x1, 7 x1 out) */
    const int32_t ids[4] = {1, 2, 5, 7};
    const int32_t counts[4] = {0, 1, 2, 1};
    const uint8_t inp[4] = {1, 1, 0, 0};
    ms_sampler_apply_penalties(want, V, &xa.penalties, ids, counts, inp, 4);
    float other[V];
    memcpy(other, z + V, sizeof other);
    int32_t n_mixed = -1;
    ms_sample_res_mix(s, 0, &step, z, V, &n_mixed);
    assert_int_equal(n_mixed, 1);
    for (int i = 0; i < V; i++)
        assert_float_equal(z[i], want[i], 1e-6);
    assert_memory_equal(z + V, other, sizeof other); /* the other request is untouched */

    /* the logits come to the host exactly when mix has work: a penalized row, or a CFG pair */
    assert_true(ms_sample_res_needs_host(s, 0, &step));
    ms_segment only11[1] = {{11, 0, 1}};
    ms_step step11 = {.name = "decode", .segments = only11, .n_segments = 1};
    step11.records[0].rec = &rec;
    assert_false(ms_sample_res_needs_host(s, 0, &step11));
    ms_segment pair[2] = {{11, 0, 1}, {11, 0, 1}};
    int32_t guide[2] = {1, -1}, self[2] = {0, 5}; /* self and out-of-range partners: no mixing */
    ms_sample_step cfg = {sample, guide}, none = {sample, self};
    ms_step step_pair = {.name = "decode", .segments = pair, .n_segments = 2};
    step_pair.records[0].rec = &cfg;
    assert_true(ms_sample_res_needs_host(s, 0, &step_pair));
    step_pair.records[0].rec = &none;
    assert_false(ms_sample_res_needs_host(s, 0, &step_pair));
    float zz[2 * V];
    memcpy(zz, z, sizeof zz);
    ms_sample_res_mix(s, 0, &step_pair, zz, V, &n_mixed);
    assert_int_equal(n_mixed, 0);

    /* refusals */
    ms_sample_extra bad = {1.5f, {0.0f, 0.0f, 1.0f}};
    assert_int_equal(ms_sample_res_set_extra(s, 11, &bad, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "min_p 1.5"));
    bad = (ms_sample_extra){0.0f, {0.0f, 0.0f, 0.0f}};
    assert_int_equal(ms_sample_res_set_extra(s, 11, &bad, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "repetition penalty 0"));
    bad = (ms_sample_extra){0.0f, {NAN, 0.0f, 1.0f}};
    assert_int_equal(ms_sample_res_set_extra(s, 11, &bad, &err), MS_ERR_INVALID_ARG);
    assert_int_equal(ms_sample_res_set_extra(s, 99, &xa, &err), MS_ERR_NOT_FOUND);
    assert_int_equal(ms_sample_res_observe(s, 99, out, 1, false, &err), MS_ERR_NOT_FOUND);

    /* a long history grows the table; removal frees it */
    int32_t many[3000];
    for (int i = 0; i < 3000; i++)
        many[i] = i % 1000;
    assert_int_equal(ms_sample_res_observe(s, 10, many, 3000, false, &err), MS_OK);
    f->remove(s, 10);
    assert_int_equal(ms_sample_res_set_extra(s, 10, &xa, &err), MS_ERR_NOT_FOUND);
    /* a request still holding a history when the resource is freed: freed with it */
    assert_int_equal(ms_sample_res_set_extra(s, 11, &xa, &err), MS_OK);
    assert_int_equal(ms_sample_res_observe(s, 11, many, 100, false, &err), MS_OK);
    ms_sample_res_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_extras_plan_and_mix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
