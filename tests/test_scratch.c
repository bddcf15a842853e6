/*
 * test_scratch.c - scratch pool resource (DESIGN.md §3): fixed-shape buffer keyed by batch row,
 * one stable address for the resource's lifetime (what a captured graph records), admit refusing
 * batches larger than the buffer, no per-request state, error paths.
 */
#include "ms_test.h"

#include <string.h>

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

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_rows_are_fixed_slices_of_one_buffer),
        ms_unit_test(test_stable_address_across_steps_through_runner),
        ms_unit_test(test_admit_refuses_more_rows_than_buffer),
        ms_unit_test(test_init_errors_name_the_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
