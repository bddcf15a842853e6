# compiler/build.mk - mstarc: semantic pass, diagnostics, dump, code generation (one entry per line).
COMPILER_SRCS += compiler/arena.c
COMPILER_SRCS += compiler/diag.c
COMPILER_SRCS += compiler/print.c
COMPILER_SRCS += compiler/strmap.c
COMPILER_SRCS += compiler/sema.c
COMPILER_SRCS += compiler/compile.c
COMPILER_SRCS += compiler/dump.c
COMPILER_SRCS += compiler/eval.c
MSTARC_MAIN += compiler/main.c
# ---- fuzzing the front end: make fuzz-dsl FUZZ_SECONDS=N (libFuzzer via clang, ASan+UBSan) ----
FUZZ_SECONDS ?= 60
FUZZ_CC ?= clang
FUZZ_DIR := $(BUILD_ROOT)/fuzz
FUZZ_SRCS := tests/fuzz_dsl.c $(DSL_SRCS) $(COMPILER_SRCS) runtime/core/base.c runtime/resources/resource.c
$(FUZZ_DIR)/fuzz_dsl: $(FUZZ_SRCS) $(BUILD)/gen/dsl_parse.c $(BUILD)/gen/dsl_lex.c $(wildcard compiler/*.h dsl/*.h runtime/*/*.h)
	$(call quiet,LD,$@)
	@mkdir -p $(@D)
	$(Q)$(FUZZ_CC) -std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all $(RUNTIME_INC) -Icompiler -Idsl -I$(BUILD)/gen $(PKG_CFLAGS) -o $@ $(FUZZ_SRCS) $(BUILD)/gen/dsl_parse.c $(BUILD)/gen/dsl_lex.c $(PKG_LIBS) -lm
# `make fuzz-dsl` runs it (tests/fuzz.sh, with the other targets' rules in tests/build.mk).
COMPILER_SRCS += compiler/codegen.c
COMPILER_SRCS += compiler/build_cmd.c
COMPILER_SRCS += compiler/lower_check.c
# ---- mstarc build: the compiler, flags, libmstar.a and link flags baked into mstarc (absolute) ----
MSTARC_GEN_CFLAGS = -std=c11 $(OPT) -pthread $(SAN_FLAGS) $(addprefix -I$(abspath runtime)/,$(RUNTIME_DIRS)) -D_GNU_SOURCE $(CUDA_CPPFLAGS) $(PKG_CFLAGS) $(GEN_WARN)
$(BUILD)/obj/compiler/build_cmd.o: CPPFLAGS += -DMS_BUILD_CC='"$(CC)"' -DMS_BUILD_CFLAGS='"$(MSTARC_GEN_CFLAGS)"' -DMS_BUILD_LIBMSTAR='"$(abspath $(BUILD)/libmstar.a)"' -DMS_BUILD_LDLIBS='"$(LDFLAGS) $(LDLIBS)"'
