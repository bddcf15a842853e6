/*
 * test_base.c - status strings, error records and the allocator hook (counting, fault injection).
 */
#include "ms_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ms_test_impl.h"

static void test_status_strings_cover_every_code(void **state) {
    (void)state;
    for (int c = 0; c > -MS_STATUS_COUNT_; c--) {
        const char *s = ms_status_str((ms_status)c);
        assert_non_null(s);
        assert_string_not_equal(s, "unknown status");
    }
    assert_string_equal(ms_status_str((ms_status)-MS_STATUS_COUNT_), "unknown status");
    assert_string_equal(ms_status_str((ms_status)5), "unknown status");
}

static ms_status failing_function(ms_error *err, const char *path) {
    return MS_FAIL(err, MS_ERR_IO, "cannot open %s", path);
}

static void test_fail_records_message_and_location(void **state) {
    (void)state;
    ms_error err = {0};
    assert_int_equal(failing_function(&err, "x.bin"), MS_ERR_IO);
    assert_int_equal(err.code, MS_ERR_IO);
    assert_string_equal(err.msg, "cannot open x.bin");
    assert_string_equal(err.func, "failing_function");
    assert_non_null(strstr(err.file, "test_base.c"));
    ms_error_prefix(&err, "loading %s: ", "model");
    assert_string_equal(err.msg, "loading model: cannot open x.bin");
    /* NULL error records are allowed. */
    assert_int_equal(failing_function(NULL, "y"), MS_ERR_IO);
}

/* an error message is one line whatever it quotes: control bytes are escaped at the source (a
 * shard named "a\nb" in a weight map printed a two-line error; found by fuzz_safetensors) */
static void test_fail_messages_are_one_line(void **state) {
    (void)state;
    ms_error err = {0};
    assert_int_equal(MS_FAIL(&err, MS_ERR_IO, "%s: cannot open", "dir/a.safet\nsors\x1b\t\\x"),
                     MS_ERR_IO);
    assert_string_equal(err.msg, "dir/a.safet\\nsors\\x1b\\t\\x: cannot open");
    ms_error_prefix(&err, "shard %s: ", "b\r");
    assert_string_equal(err.msg, "shard b\\r: dir/a.safet\\nsors\\x1b\\t\\x: cannot open");
    /* truncation never cuts an escape in half */
    char big[MS_ERROR_MSG_MAX + 8];
    memset(big, '\n', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    MS_FAIL(&err, MS_ERR_IO, "%s", big);
    size_t n = strlen(err.msg);
    assert_true(n < sizeof err.msg);
    assert_int_equal(n % 2, 0);
    assert_null(strchr(err.msg, '\n'));
}

static void test_alloc_counts_blocks_and_bytes(void **state) {
    (void)state;
    ms_alloc_stats before = ms_alloc_get_stats();
    char *a = ms_malloc(100);
    assert_non_null(a);
    ms_alloc_stats mid = ms_alloc_get_stats();
    assert_int_equal(mid.live_blocks, before.live_blocks + 1);
    assert_int_equal(mid.live_bytes, before.live_bytes + 100);
    a = ms_realloc(a, 300);
    assert_non_null(a);
    assert_int_equal(ms_alloc_get_stats().live_bytes, before.live_bytes + 300);
    assert_int_equal(((uintptr_t)a) % 16, 0);
    ms_free(a);
    ms_alloc_stats after = ms_alloc_get_stats();
    assert_int_equal(after.live_blocks, before.live_blocks);
    assert_int_equal(after.live_bytes, before.live_bytes);
    ms_free(NULL);
}

static void test_alloc_fail_nth_injects_one_failure(void **state) {
    (void)state;
    ms_alloc_fail_nth(2);
    void *a = ms_malloc(8);
    void *b = ms_malloc(8);
    void *c = ms_malloc(8);
    assert_non_null(a);
    assert_null(b);
    assert_non_null(c);
    ms_free(a);
    ms_free(c);
    /* realloc failure keeps the old block */
    char *d = ms_strdup("keep");
    ms_alloc_fail_nth(1);
    assert_null(ms_realloc(d, 1000));
    assert_string_equal(d, "keep");
    ms_free(d);
}

static void test_calloc_overflow_and_grow(void **state) {
    (void)state;
    assert_null(ms_calloc(SIZE_MAX / 2, 4));
    int *v = NULL;
    size_t cap = 0;
    for (int i = 0; i < 1000; i++) {
        assert_int_equal(ms_grow((void **)&v, &cap, (size_t)i + 1, sizeof *v), MS_OK);
        v[i] = i;
    }
    assert_true(cap >= 1000);
    assert_int_equal(v[999], 999);
    ms_alloc_fail_nth(1);
    size_t old_cap = cap;
    assert_int_equal(ms_grow((void **)&v, &cap, cap + 1, sizeof *v), MS_ERR_OOM);
    assert_int_equal(cap, old_cap);
    ms_free(v);
    char *s = ms_asprintf("%s-%d", "x", 42);
    assert_string_equal(s, "x-42");
    ms_free(s);
    char *n = ms_strndup("abcdef", 3);
    assert_string_equal(n, "abc");
    ms_free(n);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_status_strings_cover_every_code),
        ms_unit_test(test_fail_records_message_and_location),
        ms_unit_test(test_fail_messages_are_one_line),
        ms_unit_test(test_alloc_counts_blocks_and_bytes),
        ms_unit_test(test_alloc_fail_nth_injects_one_failure),
        ms_unit_test(test_calloc_overflow_and_grow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
