# runtime/build.mk - sources of libmstar.a, one per line (merge=union in .gitattributes).
RUNTIME_SRCS += runtime/base.c
RUNTIME_SRCS += runtime/resource.c
RUNTIME_SRCS += runtime/backend.c
RUNTIME_SRCS += runtime/backend_cpu.c
RUNTIME_SRCS += runtime/sampler.c
RUNTIME_SRCS += runtime/threadpool.c
