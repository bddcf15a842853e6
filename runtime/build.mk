# runtime/build.mk - sources of libmstar.a, one per line (merge=union in .gitattributes).
RUNTIME_SRCS += runtime/base.c
RUNTIME_SRCS += runtime/resource.c
RUNTIME_SRCS += runtime/device.c
RUNTIME_SRCS += runtime/page_arena.c
RUNTIME_SRCS += runtime/kv_pool.c
