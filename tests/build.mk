# tests/build.mk - test programs, one per line: TESTS += tests/test_<module> (built from .c).
# TSAN_TESTS are also run under ThreadSanitizer; TEST_SCRIPTS are shell drivers run with
# MS_BUILD set to the build folder; GPU_TESTS run only under `make gpu-test`.
TESTS += tests/test_base
ifeq ($(HAVE_CUDA),1)
TESTS += tests/test_nvrtc
TSAN_TESTS += tests/test_nvrtc
GPU_TESTS += tests/test_gpu_kernels
GPU_TESTS += tests/test_backend_cuda
GPU_TESTS += tests/test_llama_cuda_fixture
PROGRAMS += $(BUILD)/tests/bench_kernels
endif
TESTS += tests/test_backend_cpu
TSAN_TESTS += tests/test_backend_cpu
TESTS += tests/test_sampler
TESTS += tests/test_safetensors
TESTS += tests/test_hf_config
TESTS += tests/test_checkpoint_bad
TESTS += tests/test_llama_cpu_fixture
TESTS += tests/test_llama2c
TEST_SCRIPTS += tests/mkckpt.sh
