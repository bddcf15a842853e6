/*
 * ms_test_impl.h - definitions of the helpers declared in ms_test.h. Include it in exactly one
 * translation unit per test binary (the one with main()); each test binary is one .c file.
 */
#ifndef MS_TEST_IMPL_H
#define MS_TEST_IMPL_H

#include <stdio.h>
#include <stdlib.h>

#include "ms_test.h"

int64_t ms_test_live_blocks_at_setup;

int ms_test_leak_setup(void **state) {
    (void)state;
    ms_alloc_fail_nth(0);
    ms_test_live_blocks_at_setup = ms_alloc_get_stats().live_blocks;
    return 0;
}

int ms_test_leak_teardown(void **state) {
    (void)state;
    ms_alloc_fail_nth(0);
    int64_t live = ms_alloc_get_stats().live_blocks;
    if (live != ms_test_live_blocks_at_setup) {
        fprintf(stderr, "leak check: %lld block(s) still allocated after the test\n",
                (long long)(live - ms_test_live_blocks_at_setup));
        return -1;
    }
    return 0;
}

const char *ms_test_fixture(const char *rel) {
    static char buf[4096];
    const char *root = getenv("MS_FIXTURES");
    if (root == NULL || root[0] == '\0')
        root = "../shared/fixtures";
    snprintf(buf, sizeof buf, "%s/%s", root, rel);
    return buf;
}

#endif
