/*
 * lower_check.h - what `mstarc build` cannot lower yet, refused up front with the construct's
 * location, so nothing a model declares is silently dropped by the code generator (issue 9,
 * item 3). The code generator calls it first (codegen.c, prepare); constructs it does lower are
 * not listed here, and a construct leaves this list when its lowering lands.
 */
#ifndef MS_LOWER_CHECK_H
#define MS_LOWER_CHECK_H

#include "model.h"

/*
 * MS_OK when every construct of the checked model `m` is one the build lowers; else
 * MS_ERR_UNSUPPORTED with err->msg "<source>:<line>:<col>: <what> is not lowered by mstarc build
 * yet ..." naming the first such construct (a later node whose rope differs from the first
 * node's, then per node its resources in source order, the retention, each forward's inputs and
 * body): such a later node (the engine keeps one RoPE table per model; a rope over a scratch
 * is checked against that table at load instead), a scratch whose shape is not
 * [positions, kv_heads, head_dim] or that lacks layers or q_heads, a positions
 * `scheme = block`, an attention `soft_cap`, a kv_pool retention other than its attention's
 * window, forward inputs other than one token list (plus one 2-D input of a node without a
 * sampler or with a cross resource) or one [_, width] input alone (inputs_embeds: a row per
 * token of a sampling node), and forward builtins the generator has no lowering for. Borrows
 * its arguments.
 */
MS_INTERNAL ms_status ms_lower_check(const ms_model *m, const char *source, ms_error *err);

#endif /* MS_LOWER_CHECK_H */
