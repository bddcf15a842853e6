# templates/build.mk - the kernel templates, embedded into libmstar for NVRTC (CUDA builds only).
# TEMPLATE_FILES lists every header NVRTC may include, one per line.
TEMPLATE_FILES += templates/common/params.h
TEMPLATE_FILES += templates/common/vec.cuh
TEMPLATE_FILES += templates/common/reduce.cuh
TEMPLATE_FILES += templates/common/rope.cuh
TEMPLATE_FILES += templates/common/paged_kv.cuh
TEMPLATE_FILES += templates/common/mma.cuh
TEMPLATE_FILES += templates/common/pdl.cuh
TEMPLATE_FILES += templates/common/smem.cuh
TEMPLATE_FILES += templates/common/q8x.cuh
TEMPLATE_FILES += templates/attn/decode.cuh
TEMPLATE_FILES += templates/attn/prefill.cuh
TEMPLATE_FILES += templates/attn/dense.cuh
TEMPLATE_FILES += templates/rope/rope_kv.cuh
TEMPLATE_FILES += templates/norm/rmsnorm.cuh
TEMPLATE_FILES += templates/act/silu_mul.cuh
TEMPLATE_FILES += templates/embed/embed.cuh
TEMPLATE_FILES += templates/sample/sample.cuh
TEMPLATE_FILES += templates/misc/elementwise.cuh
TEMPLATE_FILES += templates/misc/encoder.cuh
TEMPLATE_FILES += templates/misc/gemv.cuh
TEMPLATE_FILES += templates/quant/qparams.h
TEMPLATE_FILES += templates/quant/blocks.cuh
TEMPLATE_FILES += templates/quant/qmatmul.cuh

ifeq ($(HAVE_CUDA),1)
RUNTIME_CUDA_SRCS += $(BUILD)/gen/ms_templates.c
$(BUILD)/gen/ms_templates.c: $(TEMPLATE_FILES) scripts/embed-templates.sh templates/build.mk
	$(call quiet,GEN,$@)
	@mkdir -p $(@D)
	$(Q)scripts/embed-templates.sh $@ templates $(TEMPLATE_FILES)
endif
