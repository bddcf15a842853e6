# runtime/build.mk - sources of libmstar.a, one per line (merge=union in .gitattributes).
RUNTIME_SRCS += runtime/base.c
RUNTIME_SRCS += runtime/resource.c
RUNTIME_SRCS += runtime/rid_map.c
RUNTIME_SRCS += runtime/positions.c
RUNTIME_SRCS += runtime/step_runner.c
RUNTIME_SRCS += runtime/graph_plan.c
