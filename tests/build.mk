# tests/build.mk - test programs, one per line: TESTS += tests/test_<module> (built from .c).
# TSAN_TESTS are also run under ThreadSanitizer; TEST_SCRIPTS are shell drivers run with
# MS_BUILD set to the build folder; GPU_TESTS run only under `make gpu-test`.
TESTS += tests/test_base
TESTS += tests/test_dsl
TEST_SCRIPTS += tests/mstarc_cli.sh
TESTS += tests/test_dsl_fixtures
