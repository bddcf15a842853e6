# tests/build.mk - test programs, one per line: TESTS += tests/test_<module> (built from .c).
# TSAN_TESTS are also run under ThreadSanitizer; TEST_SCRIPTS are shell drivers run with
# MS_BUILD set to the build folder; GPU_TESTS run only under `make gpu-test`.
TESTS += tests/test_base
ifeq ($(HAVE_CUDA),1)
TESTS += tests/test_nvrtc
TESTS += tests/test_device_cuda
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
TESTS += tests/test_positions
TESTS += tests/test_step_runner
TESTS += tests/test_graph_plan
TSAN_TESTS += tests/test_graph_plan
TESTS += tests/test_dsl
TEST_SCRIPTS += tests/mstarc_cli.sh
TESTS += tests/test_attn_plan
TESTS += tests/test_cross_attn
TESTS += tests/test_scratch
TESTS += tests/test_kv_pool
TESTS += tests/test_page_arena
TESTS += tests/test_engine_llama
# tests that run the engine over the descriptor mstarc generates from models/llama.mstar
$(BUILD)/tests/test_engine_llama: $(BUILD)/obj/gen/llama/llama_gen.o
$(BUILD)/tests/test_engine_desc: $(BUILD)/obj/gen/llama/llama_gen.o
$(BUILD)/tests/test_cli: $(BUILD)/obj/gen/llama/llama_gen.o
TESTS += tests/test_engine_cfg
$(BUILD)/tests/test_engine_cfg: $(BUILD)/obj/gen/llama/llama_gen.o
# dense generation: the block steps of tests/codegen/dense.mstar against hf/llama_dense
TESTS += tests/test_engine_dense
$(BUILD)/tests/test_engine_dense: $(BUILD)/obj/gen/dense/llama_dense_gen.o
$(BUILD)/gen/dense/llama_dense_gen.c: tests/codegen/dense.mstar $(BUILD)/mstarc
	$(call quiet,GEN,$@)
	$(Q)$(BUILD)/mstarc build tests/codegen/dense.mstar -o $(BUILD)/gen/dense --emit-only >/dev/null
TEST_SCRIPTS += tests/generate_cli.sh
# the serving binary of models/llama.mstar (generate_cli.sh, bench_cli.sh drive it)
PROGRAMS += $(BUILD)/llama/llama
$(BUILD)/llama/llama: models/llama.mstar $(BUILD)/mstarc $(BUILD)/libmstar.a
	$(call quiet,GEN,$@)
	$(Q)$(BUILD)/mstarc build models/llama.mstar -o $(BUILD)/llama >/dev/null
TESTS += tests/test_runner_integration
TESTS += tests/test_kv_retention
TESTS += tests/test_kv_offload
TESTS += tests/test_kv_property
TESTS += tests/test_kv_stress
TSAN_TESTS += tests/test_kv_stress
TEST_SCRIPTS += tests/mkckpt.sh
TESTS += tests/test_runner_property
TESTS += tests/test_dsl_fixtures
TESTS += tests/test_codegen_llama
$(BUILD)/tests/test_codegen_llama: $(BUILD)/obj/gen/llama/llama_gen.o
$(BUILD)/gen/llama/llama_gen.c: models/llama.mstar $(BUILD)/mstarc
	$(call quiet,GEN,$@)
	$(Q)$(BUILD)/mstarc build models/llama.mstar -o $(BUILD)/gen/llama --emit-only >/dev/null
TEST_SCRIPTS += tests/codegen.sh
ifeq ($(HAVE_CUDA),1)
TESTS += tests/test_codegen_kernels
endif
$(BUILD)/tests/test_codegen_kernels: | $(BUILD)/gen/llama/llama_gen.c
TESTS += tests/test_codegen
TESTS += tests/test_engine_desc
TESTS += tests/test_tokenizer_hf
TSAN_TESTS += tests/test_tokenizer_hf
ifeq ($(HAVE_CUDA),1)
# the generated binary on the GPU: cuda against cpu on hf/llama_gqa, the llama2.c golden on cuda
.PHONY: gpu-generate
gpu-generate: $(BUILD)/mstarc
	$(Q)$(BUILD)/mstarc build models/llama.mstar -o $(BUILD)/llama >/dev/null
	$(Q)MS_BUILD=$(BUILD) tests/gpu_generate.sh
gpu-test: gpu-generate
endif
TEST_SCRIPTS += tests/bench_cli.sh
TEST_SCRIPTS += tests/kernels_cli.sh
# tests/kernels_gpu.sh (device machine): what mstarc --arch --config precompiles is all that generate --device cuda loads
gpu-test: gpu-kernels-cache
.PHONY: gpu-kernels-cache
gpu-kernels-cache: $(BUILD)/mstarc $(BUILD)/libmstar.a ; $(if $(HAVE_CUDA),$(Q)MS_BUILD=$(BUILD) bash tests/kernels_gpu.sh,@echo "gpu-kernels-cache: this build has no CUDA")
TESTS += tests/test_cli
