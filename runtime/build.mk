# runtime/build.mk - sources of libmstar.a, one per line (merge=union in .gitattributes).
RUNTIME_SRCS += runtime/base.c
RUNTIME_SRCS += runtime/resource.c
RUNTIME_SRCS += runtime/cuda_kernels.c
RUNTIME_CUDA_SRCS += runtime/cuda_check.c
RUNTIME_CUDA_SRCS += runtime/nvrtc_cache.c
RUNTIME_CUDA_SRCS += runtime/cuda_ops.c
RUNTIME_SRCS += runtime/backend.c
RUNTIME_SRCS += runtime/backend_cpu.c
RUNTIME_SRCS += runtime/sampler.c
RUNTIME_SRCS += runtime/threadpool.c
RUNTIME_SRCS += runtime/safetensors.c
RUNTIME_SRCS += runtime/checkpoint.c
RUNTIME_SRCS += runtime/hf_config.c
RUNTIME_SRCS += runtime/llama2c.c
RUNTIME_SRCS += runtime/tokenizer_llama2c.c
RUNTIME_SRCS += runtime/rid_map.c
RUNTIME_SRCS += runtime/positions.c
RUNTIME_SRCS += runtime/step_runner.c
RUNTIME_SRCS += runtime/graph_plan.c
RUNTIME_SRCS += runtime/attn_plan.c
RUNTIME_SRCS += runtime/cross_attn.c
RUNTIME_SRCS += runtime/scratch.c
RUNTIME_SRCS += runtime/device.c
RUNTIME_SRCS += runtime/page_arena.c
RUNTIME_SRCS += runtime/kv_pool.c
PROGRAMS += $(BUILD)/mstar-mkckpt
# mstar-mkckpt uses no CUDA: linked without the CUDA libraries, an ASan build starts in 0.03 s instead of ~1 s.
$(BUILD)/mstar-mkckpt: $(BUILD)/obj/runtime/tools/mkckpt.o $(BUILD)/libmstar.a ; $(if $(filter 1,$(V)),,@printf '  %-6s %s\n' LD $@ &&) $(CC) $(LDFLAGS) -o $@ $^ $(PKG_LIBS) -lm
RUNTIME_CUDA_SRCS += runtime/backend_cuda.c
RUNTIME_SRCS += runtime/model_desc.c
RUNTIME_SRCS += runtime/engine.c
RUNTIME_SRCS += runtime/cli.c
PROGRAMS += $(BUILD)/mstar-mkckpt
# mstar-mkckpt uses no CUDA: linked without the CUDA libraries, an ASan build starts in 0.03 s instead of ~1 s.
$(BUILD)/mstar-mkckpt: $(BUILD)/obj/runtime/tools/mkckpt.o $(BUILD)/libmstar.a ; $(if $(filter 1,$(V)),,@printf '  %-6s %s\n' LD $@ &&) $(CC) $(LDFLAGS) -o $@ $^ $(PKG_LIBS) -lm
RUNTIME_SRCS += runtime/tokenizer_hf.c
RUNTIME_SRCS += runtime/tokenizer_hf_nfc.c
