# runtime/build.mk - sources of libmstar.a, one per line (merge=union in .gitattributes).
RUNTIME_SRCS += runtime/base.c
RUNTIME_SRCS += runtime/resource.c
RUNTIME_SRCS += runtime/cuda_kernels.c
RUNTIME_CUDA_SRCS += runtime/cuda_check.c
RUNTIME_CUDA_SRCS += runtime/nvrtc_cache.c
RUNTIME_CUDA_SRCS += runtime/cuda_ops.c
