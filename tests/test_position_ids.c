/*
 * test_position_ids.c - the --position-ids file parser (runtime/position_ids.h): [3][S] and [S]
 * files come back axis-major with their counts; every malformed file is refused with one line
 * naming the file and the element; nothing leaks on any path (leak-checked tests, and every
 * allocation failed in turn).
 */
#include "ms_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "position_ids.h"

#include "ms_test_impl.h"

/* Parse `text` as file "ids.json" with the prompt length n; returns the status, message in err. */
static ms_status parse(const char *text, int32_t n, ms_position_ids *out, ms_error *err) {
    memset(err, 0, sizeof *err);
    return ms_position_ids_init_from_string(out, "ids.json", text, n, err);
}

static void test_three_axes_axis_major(void **state) {
    (void)state;
    ms_position_ids p;
    ms_error err;
    assert_int_equal(parse("[[0, 1, 2, 2], [0, 1, 2, 3], [0, 1, 4, 5]]", 4, &p, &err), MS_OK);
    assert_int_equal(p.n_axes, 3);
    assert_int_equal(p.n_tokens, 4);
    const int32_t want[] = {0, 1, 2, 2, 0, 1, 2, 3, 0, 1, 4, 5};
    assert_memory_equal(p.ids, want, sizeof want);
    ms_position_ids_free(&p);
    assert_null(p.ids);
    ms_position_ids_free(&p); /* a freed struct is accepted */
    ms_position_ids_free(NULL);
}

static void test_one_axis_and_any_length(void **state) {
    (void)state;
    ms_position_ids p;
    ms_error err;
    assert_int_equal(parse("[5, 6, 7]", -1, &p, &err), MS_OK); /* n < 0: any length */
    assert_int_equal(p.n_axes, 1);
    assert_int_equal(p.n_tokens, 3);
    assert_int_equal(p.ids[2], 7);
    ms_position_ids_free(&p);
    assert_int_equal(parse("[[3, 4]]", 2, &p, &err), MS_OK); /* [1][S] */
    assert_int_equal(p.n_axes, 1);
    assert_int_equal(p.ids[1], 4);
    ms_position_ids_free(&p);
    assert_int_equal(parse("[2147483647]", 1, &p, &err), MS_OK); /* int32 max */
    assert_int_equal(p.ids[0], 2147483647);
    ms_position_ids_free(&p);
}

/* Every malformed input: its status and exact message, and *out left zeroed. */
static void test_bad_inputs_name_file_and_element(void **state) {
    (void)state;
    static const struct {
        const char *text;
        int32_t n;
        ms_status st;
        const char *msg;
    } cases[] = {
        {"[[0, 1], [0, 1]", 2, MS_ERR_PARSE, "ids.json:1:15: not JSON: ']' expected near end of file"},
        {"{\"ids\": [0]}", 1, MS_ERR_FORMAT,
         "ids.json: top level is an object; position ids are a JSON array [3][S] (t, h, w) or [S]"},
        {"[]", 0, MS_ERR_FORMAT, "ids.json: no position ids (an empty array)"},
        {"[[], [], []]", 0, MS_ERR_FORMAT, "ids.json: no position ids (axis 0 is empty)"},
        {"[[0, 1], [0, 1]]", 2, MS_ERR_FORMAT,
         "ids.json: 2 position axes; ids are [3][S] (t, h, w) or [S]"},
        {"[[0, 1], [0, 1], [0]]", 2, MS_ERR_FORMAT,
         "ids.json: axis 2 has 1 ids, axis 0 has 2 (the array must be rectangular)"},
        {"[[0, 1], 5, [0, 1]]", 2, MS_ERR_FORMAT,
         "ids.json: element [1] is an integer, expected an array of ids like element [0]"},
        {"[0, [1]]", 2, MS_ERR_FORMAT, "ids.json: element [1] is an array, expected an integer"},
        {"[[0, 1], [0, \"1\"], [0, 1]]", 2, MS_ERR_FORMAT,
         "ids.json: element [1][1] is a string, expected an integer"},
        {"[[0, 1], [0, 1], [0, 1.5]]", 2, MS_ERR_FORMAT,
         "ids.json: element [2][1] is a real number, expected an integer"},
        {"[0, null]", 2, MS_ERR_FORMAT, "ids.json: element [1] is null, expected an integer"},
        {"[[0, -1], [0, 1], [0, 1]]", 2, MS_ERR_FORMAT,
         "ids.json: element [0][1] is -1: position ids are >= 0"},
        {"[0, 2147483648]", 2, MS_ERR_FORMAT,
         "ids.json: element [1] is 2147483648, past int32 (2147483647)"},
        {"[[0, 1], [0, 1], [0, 1]]", 3, MS_ERR_FORMAT,
         "ids.json: 2 position ids per axis, the prompt has 3 tokens"},
        {"[7]", 2, MS_ERR_FORMAT, "ids.json: 1 position id per axis, the prompt has 2 tokens"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ms_position_ids p;
        ms_error err;
        ms_status st = parse(cases[i].text, cases[i].n, &p, &err);
        if (st != cases[i].st || strcmp(err.msg, cases[i].msg) != 0)
            fail_msg("case %zu (%s): got %d \"%s\", want %d \"%s\"", i, cases[i].text, (int)st,
                     err.msg, (int)cases[i].st, cases[i].msg);
        assert_null(p.ids);
        assert_int_equal(p.n_axes, 0);
    }
}

/* A temporary file holding `text`; returns its path (static buffer). */
static const char *write_tmp(const char *text) {
    static char path[64];
    snprintf(path, sizeof path, "/tmp/ms_position_ids_XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    size_t n = strlen(text);
    assert_int_equal(write(fd, text, n), (ssize_t)n);
    close(fd);
    return path;
}

static void test_files(void **state) {
    (void)state;
    ms_position_ids p;
    ms_error err = {0};
    const char *path = write_tmp("[[0, 1, 2],\n [0, 1, 1],\n [0, 1, 3]]\n");
    assert_int_equal(ms_position_ids_init(&p, path, 3, &err), MS_OK);
    assert_int_equal(p.n_axes, 3);
    assert_int_equal(p.ids[8], 3);
    ms_position_ids_free(&p);
    unlink(path);

    path = write_tmp("[[0, 1, 2],\n [0, x, 1]]\n");
    assert_int_equal(ms_position_ids_init(&p, path, 3, &err), MS_ERR_PARSE);
    char want[160];
    snprintf(want, sizeof want, "%s:2:6: not JSON: invalid token near 'x'", path);
    assert_string_equal(err.msg, want);
    unlink(path);

    assert_int_equal(ms_position_ids_init(&p, "/nonexistent/ids.json", 3, &err), MS_ERR_NOT_FOUND);
    assert_string_equal(err.msg, "/nonexistent/ids.json: cannot read: No such file or directory");
    assert_int_equal(ms_position_ids_init(&p, "/tmp", 3, &err), MS_ERR_IO);
    assert_string_equal(err.msg, "/tmp: cannot read: not a regular file");
    assert_null(p.ids);
}

/* Each allocation failed in turn: MS_ERR_OOM with nothing kept, or success. */
static void test_out_of_memory(void **state) {
    (void)state;
    for (int64_t nth = 1; nth < 16; nth++) {
        ms_position_ids p;
        ms_error err = {0};
        ms_alloc_fail_nth(nth);
        ms_status st = ms_position_ids_init_from_string(&p, "ids.json", "[[0, 1], [0, 1], [0, 2]]",
                                                        2, &err);
        ms_alloc_fail_nth(0);
        if (st == MS_ERR_OOM) {
            assert_null(p.ids);
            assert_non_null(strstr(err.msg, "out of memory"));
            continue;
        }
        assert_int_equal(st, MS_OK);
        assert_int_equal(p.ids[5], 2);
        ms_position_ids_free(&p);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_three_axes_axis_major),
        ms_unit_test(test_one_axis_and_any_length),
        ms_unit_test(test_bad_inputs_name_file_and_element),
        ms_unit_test(test_files),
        ms_unit_test(test_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
