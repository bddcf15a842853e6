# tests/build.mk - test programs, one per line: TESTS += tests/test_<module> (built from .c).
# TSAN_TESTS are also run under ThreadSanitizer; TEST_SCRIPTS are shell drivers run with
# MS_BUILD set to the build folder; GPU_TESTS run only under `make gpu-test`.
TESTS += tests/test_base
TESTS += tests/test_positions
TESTS += tests/test_step_runner
TESTS += tests/test_graph_plan
TSAN_TESTS += tests/test_graph_plan
TESTS += tests/test_attn_plan
TESTS += tests/test_cross_attn
TESTS += tests/test_scratch
TESTS += tests/test_kv_pool
TESTS += tests/test_page_arena
TESTS += tests/test_runner_integration
TESTS += tests/test_kv_retention
TESTS += tests/test_kv_offload
TESTS += tests/test_kv_property
TESTS += tests/test_kv_stress
TSAN_TESTS += tests/test_kv_stress
TESTS += tests/test_runner_property
