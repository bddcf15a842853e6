# dsl/build.mk - the model language front end: lexer, grammar, AST (one entry per line).
DSL_SRCS += dsl/ast.c
DSL_SRCS += dsl/parse.c
DSL_GEN_SRCS += $(BUILD)/gen/dsl_parse.c
DSL_GEN_SRCS += $(BUILD)/gen/dsl_lex.c
$(BUILD)/gen/dsl_parse.c $(BUILD)/gen/dsl_parse.h &: dsl/grammar.y
	$(call quiet,GEN,$@)
	@mkdir -p $(@D)
	$(Q)bison -Wall -Werror --header=$(BUILD)/gen/dsl_parse.h -o $(BUILD)/gen/dsl_parse.c $<
$(BUILD)/gen/dsl_lex.c $(BUILD)/gen/dsl_lex.h &: dsl/lexer.l $(BUILD)/gen/dsl_parse.h
	$(call quiet,GEN,$@)
	@mkdir -p $(@D)
	$(Q)flex --header-file=$(BUILD)/gen/dsl_lex.h -o $(BUILD)/gen/dsl_lex.c $<
$(BUILD)/obj/gen/dsl_lex.o: $(BUILD)/gen/dsl_parse.h
$(BUILD)/obj/gen/dsl_parse.o: $(BUILD)/gen/dsl_lex.h
$(BUILD)/obj/dsl/parse.o: | $(BUILD)/gen/dsl_parse.h $(BUILD)/gen/dsl_lex.h
$(BUILD)/obj/dsl/ast.o: | $(BUILD)/gen/dsl_parse.h
