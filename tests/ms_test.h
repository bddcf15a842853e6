/*
 * ms_test.h - common includes and helpers for the cmocka tests.
 *
 * Include this instead of <cmocka.h>: cmocka needs <stdarg.h>, <stddef.h>, <stdint.h> and
 * <setjmp.h> first. ms_test_leak_setup/teardown snapshot ms_alloc_get_stats() around a test and
 * fail it if any block allocated through ms_malloc is still live at the end.
 */
#ifndef MS_TEST_H
#define MS_TEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "ms_base.h"

/* Snapshot of live allocations taken by ms_test_leak_setup (one test at a time per binary). */
extern int64_t ms_test_live_blocks_at_setup;

/* cmocka group/test setup: records live blocks. Returns 0. */
int ms_test_leak_setup(void **state);
/* cmocka teardown: fails when live blocks differ from the setup snapshot. Returns 0 or -1. */
int ms_test_leak_teardown(void **state);

/* Test with leak checking: cmocka_unit_test_setup_teardown with the two hooks above. */
#define ms_unit_test(f) cmocka_unit_test_setup_teardown(f, ms_test_leak_setup, ms_test_leak_teardown)

/*
 * Path of the shared fixtures folder (../shared/fixtures from the project root, or $MS_FIXTURES).
 * Returns a static buffer: "<root>/<rel>".
 */
const char *ms_test_fixture(const char *rel);

#endif
