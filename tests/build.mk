# tests/build.mk - test programs, one per line: TESTS += tests/test_<module> (built from .c).
# TSAN_TESTS are also run under ThreadSanitizer; TEST_SCRIPTS are shell drivers run with
# MS_BUILD set to the build folder; GPU_TESTS run only under `make gpu-test`.
TESTS += tests/test_base
ifeq ($(HAVE_CUDA),1)
TESTS += tests/test_nvrtc
TESTS += tests/test_device_cuda
# NCCL loaded lazily (no GPU: library and argument checks; MS_NCCL_GPU=1: one rank on device 0)
TESTS += tests/test_nccl
TSAN_TESTS += tests/test_nvrtc
GPU_TESTS += tests/test_gpu_kernels
GPU_TESTS += tests/test_backend_cuda
GPU_TESTS += tests/test_llama_cuda_fixture
# CFG, M-RoPE and dense generation through the engine on the GPU (the generated descriptors)
GPU_TESTS += tests/test_engine_features_cuda
# the encoder ops (Whisper) on the GPU against the CPU backend; MS_ENCODER_OPS_DEVICE=cpu: dry run
GPU_TESTS += tests/test_encoder_ops_cuda
$(BUILD)/tests/test_engine_features_cuda: $(BUILD)/obj/gen/llama/llama_gen.o $(BUILD)/obj/gen/qwen2vl/qwen2vl_gen.o $(BUILD)/obj/gen/dense/llama_dense_gen.o
# CUDA graphs against the padded eager path, bitwise (graph_exec.h); MS_GRAPHS_DRY_RUN=1: on the CPU
GPU_TESTS += tests/test_graphs_cuda
# quantized weights on the GPU (GEMV, prefill, bit-exact dequantization) per ggml type
GPU_TESTS += tests/test_quant_cuda
# SmolLM2 Q4_1 through the engine on cuda with the blocks kept (fetch-model.sh; skips without it)
GPU_TESTS += tests/test_quant_smollm2_cuda
$(BUILD)/tests/test_quant_smollm2_cuda: $(BUILD)/obj/gen/llama/llama_gen.o | $(BUILD)/mstar-mkckpt
$(BUILD)/tests/test_graphs_cuda: $(BUILD)/obj/gen/llama/llama_gen.o
# [pd] CUDA IPC and NCCL KV transfers (engine/pd_gpu.h); skip without a GPU / 2 GPUs
GPU_TESTS += tests/test_pd_gpu
$(BUILD)/tests/test_pd_gpu: $(BUILD)/obj/gen/llama/llama_gen.o
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
TESTS += tests/test_position_ids
TESTS += tests/test_model_desc
TESTS += tests/test_step_runner
TESTS += tests/test_graph_plan
# the captured path's host side (graph_exec.c) over models/llama.mstar on the CPU backend
TESTS += tests/test_graph_exec
$(BUILD)/tests/test_graph_exec: $(BUILD)/obj/gen/llama/llama_gen.o $(BUILD)/obj/gen/qwen2vl/qwen2vl_gen.o
TSAN_TESTS += tests/test_graph_plan
TESTS += tests/test_dsl
TEST_SCRIPTS += tests/mstarc_cli.sh
TEST_SCRIPTS += tests/layers.sh
TEST_SCRIPTS += tests/dsl_scale.sh
TESTS += tests/test_attn_plan
TESTS += tests/test_cross_attn
TESTS += tests/test_scratch
# the talker + code predictor of hf/talker_codepred composed by hand over the scratch KV (CPU)
TESTS += tests/test_talker_cpu
# the talker node of models/talker.mstar (a row of codes per token, ms_engine_run_codes) against
# hf/talker_codepred's talker_logits, teacher-forced; four prompts batched equal each alone
TESTS += tests/test_talker
$(BUILD)/tests/test_talker: $(BUILD)/obj/gen/talker/talker_gen.o
ifeq ($(HAVE_CUDA),1)
# models/talker.mstar's kernel instances at both nodes' shapes compile with NVRTC (no GPU needed)
TESTS += tests/test_talker_kernels
# the talker's codes on the GPU against the bf16 CPU run; MS_TALKER_DEVICE=cpu: dry run
GPU_TESTS += tests/test_talker_cuda
endif
$(BUILD)/tests/test_talker_kernels: $(BUILD)/obj/gen/talker/talker_gen.o
$(BUILD)/tests/test_talker_cuda: $(BUILD)/obj/gen/talker/talker_gen.o
# the talker codes verb: models/talker.mstar's binary prints hf/talker_codepred's reference codes
TEST_SCRIPTS += tests/talker_cli.sh
$(BUILD)/gen/talker/talker_gen.c: models/talker.mstar $(BUILD)/mstarc
	$(call quiet,GEN,$@)
	$(Q)$(BUILD)/mstarc build models/talker.mstar -o $(BUILD)/gen/talker --emit-only >/dev/null
TESTS += tests/test_kv_pool
TESTS += tests/test_page_arena
TESTS += tests/test_prefix_cache
TSAN_TESTS += tests/test_prefix_cache
TESTS += tests/test_kv_prefix
TESTS += tests/test_tp_check
TSAN_TESTS += tests/test_tp_check
# tensor parallelism on the CPU: ranks as threads (engine/tp.h), TP=2/4 ids equal TP=1
TESTS += tests/test_tp_cpu
TSAN_TESTS += tests/test_tp_cpu
# --tp through generate, bench and serve (ids equal --tp 1; refused splits)
TEST_SCRIPTS += tests/tp_cli.sh
# TP=2 over NCCL on two GPUs, ids equal TP=1 (skips with a line under 2 GPUs; MS_TP_DEVICE=cpu:
# a dry run on the CPU)
ifeq ($(HAVE_CUDA),1)
GPU_TESTS += tests/test_tp_cuda
endif
$(BUILD)/tests/test_tp_cuda: $(BUILD)/obj/gen/llama/llama_gen.o
$(BUILD)/tests/test_tp_cpu: $(BUILD)/obj/gen/llama/llama_gen.o $(BUILD)/obj/gen/qwen3/qwen3_gen.o
$(BUILD)/gen/qwen3/qwen3_gen.c: models/qwen3.mstar $(BUILD)/mstarc
	$(call quiet,GEN,$@)
	$(Q)$(BUILD)/mstarc build models/qwen3.mstar -o $(BUILD)/gen/qwen3 --emit-only >/dev/null
TESTS += tests/test_engine_llama
# prefix caching through the engine: outputs bitwise equal with and without the cache
TESTS += tests/test_engine_prefix
$(BUILD)/tests/test_engine_prefix: $(BUILD)/obj/gen/llama/llama_gen.o
# tests that run the engine over the descriptor mstarc generates from models/llama.mstar
$(BUILD)/tests/test_engine_llama: $(BUILD)/obj/gen/llama/llama_gen.o
# n > 1 choices forked from one prompt's KV: bitwise equal to independent requests
TESTS += tests/test_engine_fork
$(BUILD)/tests/test_engine_fork: $(BUILD)/obj/gen/llama/llama_gen.o
# [pd] prefill -> record bytes -> decode equals one engine, bitwise; injected transfer failures
TESTS += tests/test_pd
$(BUILD)/tests/test_pd: $(BUILD)/obj/gen/llama/llama_gen.o
# [pd] serve --role prefill + --role decode over HTTP equal one serve; bad flags
TEST_SCRIPTS += tests/pd_cli.sh
GPU_TESTS += tests/test_engine_fork_cuda
$(BUILD)/tests/test_engine_fork_cuda: $(BUILD)/obj/gen/llama/llama_gen.o
# prompt logprobs: every prompt row's logits, equal to a hand log_softmax of the CPU logits
TESTS += tests/test_engine_prompt_logprobs
$(BUILD)/tests/test_engine_prompt_logprobs: $(BUILD)/obj/gen/llama/llama_gen.o
# KV pressure: offload / reload / recompute-preemption under a small arena
TESTS += tests/test_engine_offload
$(BUILD)/tests/test_engine_offload: $(BUILD)/obj/gen/llama/llama_gen.o
GPU_TESTS += tests/test_engine_offload_cuda
$(BUILD)/tests/test_engine_offload_cuda: $(BUILD)/obj/gen/llama/llama_gen.o
$(BUILD)/tests/test_engine_desc: $(BUILD)/obj/gen/llama/llama_gen.o
$(BUILD)/tests/test_cli: $(BUILD)/obj/gen/llama/llama_gen.o
TESTS += tests/test_engine_cfg
$(BUILD)/tests/test_engine_cfg: $(BUILD)/obj/gen/llama/llama_gen.o $(BUILD)/obj/gen/dense/llama_dense_gen.o
# M-RoPE: models/qwen2vl.mstar against hf/qwen2vl_mrope
TESTS += tests/test_engine_mrope
$(BUILD)/tests/test_engine_mrope: $(BUILD)/obj/gen/qwen2vl/qwen2vl_gen.o
# dense generation: the block steps of tests/codegen/dense.mstar against hf/llama_dense
TESTS += tests/test_engine_dense
$(BUILD)/tests/test_engine_dense: $(BUILD)/obj/gen/dense/llama_dense_gen.o
$(BUILD)/gen/dense/llama_dense_gen.c: tests/codegen/dense.mstar $(BUILD)/mstarc
	$(call quiet,GEN,$@)
	$(Q)$(BUILD)/mstarc build tests/codegen/dense.mstar -o $(BUILD)/gen/dense --emit-only >/dev/null
# several nodes: tests/codegen/two_nodes.mstar (a walk across two nodes) against hf/llama_gqa
TESTS += tests/test_engine_nodes
$(BUILD)/tests/test_engine_nodes: $(BUILD)/obj/gen/two_nodes/two_nodes_gen.o
$(BUILD)/gen/two_nodes/two_nodes_gen.c: tests/codegen/two_nodes.mstar $(BUILD)/mstarc
	$(call quiet,GEN,$@)
	$(Q)$(BUILD)/mstarc build tests/codegen/two_nodes.mstar -o $(BUILD)/gen/two_nodes --emit-only >/dev/null
# the Whisper encoder written in the language (tests/codegen/whisper_encoder.mstar) against
# hf/whisper_tiny and hf/whisper_base (one clip; MS_WHISPER_ALL=1 all three)
TESTS += tests/test_whisper_encoder
$(BUILD)/tests/test_whisper_encoder: $(BUILD)/obj/gen/whisper_encoder/whisper_encoder_gen.o
$(BUILD)/gen/whisper_encoder/whisper_encoder_gen.c: tests/codegen/whisper_encoder.mstar $(BUILD)/mstarc
	$(call quiet,GEN,$@)
	$(Q)$(BUILD)/mstarc build tests/codegen/whisper_encoder.mstar -o $(BUILD)/gen/whisper_encoder --emit-only >/dev/null
# Whisper end to end (models/whisper.mstar: encoder, cross-attention decoder) against
# hf/whisper_tiny and hf/whisper_base (clip a0; MS_WHISPER_ALL=1 all three batched)
TESTS += tests/test_whisper
# the transcribe verb: WAV clips -> runtime/audio -> models/whisper.mstar -> the reference transcripts
TEST_SCRIPTS += tests/transcribe.sh
$(BUILD)/tests/test_whisper: $(BUILD)/obj/gen/whisper/whisper_gen.o
$(BUILD)/gen/whisper/whisper_gen.c: models/whisper.mstar $(BUILD)/mstarc
	$(call quiet,GEN,$@)
	$(Q)$(BUILD)/mstarc build models/whisper.mstar -o $(BUILD)/gen/whisper --emit-only >/dev/null
TEST_SCRIPTS += tests/generate_cli.sh
TEST_SCRIPTS += tests/cli_robust.sh
# the serve verb over HTTP on 127.0.0.1 (curl, jq)
TEST_SCRIPTS += tests/serve.sh
# 32 concurrent streaming clients for 60 s (SOAK_CLIENTS / SOAK_SECONDS), 0 KV pages held at the end
TEST_SCRIPTS += tests/serve_soak.sh
# bench-serve (scripts/bench_serve.py), the serve load generator, against the llama2.c fixture
TEST_SCRIPTS += tests/bench_serve.sh
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
TESTS += tests/test_codegen_qwen2vl
# the generated descriptor before the libraries (nothing else pulls in what its forward calls)
$(BUILD)/tests/test_codegen_qwen2vl: $(BUILD)/obj/tests/test_codegen_qwen2vl.o $(BUILD)/obj/gen/qwen2vl/qwen2vl_gen.o $(BUILD)/libmstarc.a $(BUILD)/libmstar.a
	$(call quiet,LD,$@)
	@mkdir -p $(@D)
	$(Q)$(CC) $(LDFLAGS) -o $@ $^ $(CMOCKA_LIBS) $(LDLIBS)
$(BUILD)/gen/qwen2vl/qwen2vl_gen.c: models/qwen2vl.mstar $(BUILD)/mstarc
	$(call quiet,GEN,$@)
	$(Q)$(BUILD)/mstarc build models/qwen2vl.mstar -o $(BUILD)/gen/qwen2vl --emit-only >/dev/null
ifeq ($(HAVE_CUDA),1)
TESTS += tests/test_codegen_kernels
endif
$(BUILD)/tests/test_codegen_kernels: | $(BUILD)/gen/llama/llama_gen.c
$(BUILD)/tests/test_codegen_kernels: | $(BUILD)/gen/whisper/whisper_gen.c
TESTS += tests/test_codegen
TESTS += tests/test_engine_desc
TESTS += tests/test_tokenizer_hf
TSAN_TESTS += tests/test_tokenizer_hf
# tokenizers from vocabulary arrays (GGUF) and SentencePiece (tests/tok/; tok_vocab.sh adds SmolLM2's GGUF)
TESTS += tests/test_tok_vocab
TEST_SCRIPTS += tests/tok_vocab.sh
# the chat verb and generate --chat (a tokenizer.json with a chat template on a tiny checkpoint)
TEST_SCRIPTS += tests/chat.sh
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
# ---- libFuzzer targets: `make fuzz` builds build/fuzz/fuzz_<t> (tests/fuzz_<t>.c, clang,
# ASan+UBSan) and runs each for FUZZ_SECONDS, FUZZ_JOBS at a time (tests/fuzz.sh; `make test` runs
# them last). `make fuzz-<t>` runs one; FUZZ_TARGETS="a b" a few. fuzz_dsl's rule is in compiler/build.mk.
FUZZ_TARGETS ?= dsl config tokenizer_hf safetensors llama2c chat_template tokenizer_vocab
# the audio front end (runtime/audio): ms_audio_read_memory on a file image, then a 1 s log-mel
FUZZ_TARGETS += audio
FUZZ_AUDIO_OBJS := $(patsubst %.c,$(FUZZ_DIR)/obj/%.o,runtime/core/base.c runtime/audio/audio_read.c runtime/audio/whisper_mel.c)
$(FUZZ_DIR)/fuzz_audio: tests/fuzz_audio.c tests/fuzz_util.h $(FUZZ_AUDIO_OBJS)
	$(call quiet,LD,$@)
	$(Q)$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer -Itests $(WARN) -MMD -MP -o $@ $< $(FUZZ_AUDIO_OBJS) $(PKG_LIBS) -lm -pthread
FUZZ_JOBS ?= 2
FUZZ_RUNTIME_SRCS := runtime/core/base.c runtime/loaders/hf_config.c runtime/loaders/llama2c.c \
                     runtime/backends/backend.c runtime/backends/tensor.c runtime/backends/rope.c \
                     runtime/loaders/safetensors.c runtime/loaders/checkpoint.c \
                     runtime/tokenizers/tokenizer_hf.c runtime/tokenizers/tokenizer_hf_nfc.c \
                     runtime/tokenizers/tokenizer_llama2c.c runtime/tokenizers/chat_template.c
FUZZ_RUNTIME_SRCS += runtime/loaders/gguf.c runtime/loaders/gguf_quant.c runtime/loaders/gguf_model.c runtime/core/threadpool.c
FUZZ_TARGETS += gguf
# fuzz_serve_request: the serve verb's request parser (runtime/cli/serve_request.c)
FUZZ_TARGETS += serve_request
FUZZ_RUNTIME_SRCS += runtime/cli/serve_request.c runtime/resources/sampler.c
# the sampler resource's min_p and penalties (sample_res.h)
TESTS += tests/test_sampler_res
# the serve verb's request parser (runtime/cli/serve_request.c), without HTTP
TESTS += tests/test_serve_request
# the CUDA sampler (min_p) against the CPU one on random rows (MS_SAMPLER_DEVICE=cpu: a dry run)
ifeq ($(HAVE_CUDA),1)
GPU_TESTS += tests/test_sampler_cuda
endif
FUZZ_OBJS := $(patsubst %.c,$(FUZZ_DIR)/obj/%.o,$(FUZZ_RUNTIME_SRCS))
FUZZ_RUNTIME_BINS := $(FUZZ_DIR)/fuzz_config $(FUZZ_DIR)/fuzz_tokenizer_hf $(FUZZ_DIR)/fuzz_safetensors $(FUZZ_DIR)/fuzz_llama2c \
                     $(FUZZ_DIR)/fuzz_chat_template $(FUZZ_DIR)/fuzz_tokenizer_vocab
FUZZ_RUNTIME_BINS += $(FUZZ_DIR)/fuzz_gguf
FUZZ_RUNTIME_BINS += $(FUZZ_DIR)/fuzz_serve_request
FUZZ_FLAGS := -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=address,undefined -fno-sanitize-recover=all $(RUNTIME_INC) $(PKG_CFLAGS)
$(FUZZ_DIR)/obj/%.o: %.c
	$(call quiet,CC,$@)
	@mkdir -p $(@D)
	$(Q)$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@
$(FUZZ_RUNTIME_BINS): $(FUZZ_DIR)/fuzz_%: tests/fuzz_%.c tests/fuzz_util.h $(FUZZ_OBJS)
	$(call quiet,LD,$@)
	$(Q)$(FUZZ_CC) $(FUZZ_FLAGS) -fsanitize=fuzzer -Itests $(WARN) -MMD -MP -o $@ $< $(FUZZ_OBJS) $(PKG_LIBS) -lm -pthread
-include $(FUZZ_OBJS:.o=.d) $(FUZZ_RUNTIME_BINS:=.d)
.PHONY: fuzz
fuzz: $(patsubst %,$(FUZZ_DIR)/fuzz_%,$(FUZZ_TARGETS))
	$(Q)FUZZ_DIR=$(FUZZ_DIR) FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_JOBS=$(FUZZ_JOBS) MS_SUMMARY=$(MS_SUMMARY) bash tests/fuzz.sh $(FUZZ_TARGETS)
fuzz-%:
	$(Q)$(MAKE) --no-print-directory fuzz FUZZ_TARGETS=$*
TESTS += tests/test_chat_template
TESTS += tests/test_gguf
# SmolLM2-135M-Instruct Q4_1 GGUF (scripts/fetch-model.sh; skips without network) through models/llama.mstar on the CPU
TESTS += tests/test_gguf_smollm2
TESTS += tests/test_gguf_tokenizer
$(BUILD)/tests/test_gguf_smollm2: $(BUILD)/obj/gen/llama/llama_gen.o
# test_gguf runs mstar-mkckpt --format gguf
$(BUILD)/tests/test_gguf: | $(BUILD)/mstar-mkckpt
TESTS += tests/test_gguf_fixtures
# templates/quant/blocks.cuh built for the host (C++: the template is) against ms_ggml_dequantize
TESTS += tests/test_quant_blocks
$(BUILD)/tests/test_quant_blocks: LDLIBS += -lstdc++
$(BUILD)/obj/tests/test_quant_blocks.o: tests/test_quant_blocks.cpp templates/quant/blocks.cuh
	$(call quiet,CXX,$<)
	@mkdir -p $(@D)
	$(Q)$(CXX) $(CPPFLAGS) -Itests -Itemplates -std=c++17 -g $(OPT) -ffp-contract=off -pthread $(SAN_FLAGS) -Wall -Wextra -Werror -Wno-unknown-pragmas "-D_Noreturn=[[noreturn]]" -c $< -o $@
# scripts/fetch-model.sh: one path on stdout, pinned sha256, exit 2 without a registry
TEST_SCRIPTS += tests/gguf_fetch.sh
# gguf_model.c converts tensors on a thread pool
TSAN_TESTS += tests/test_gguf
TESTS += tests/test_audio
# its extractors run on four threads at once (the FFTW planner lock)
TSAN_TESTS += tests/test_audio
