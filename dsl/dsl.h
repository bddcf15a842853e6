/*
 * dsl.h - the model language front end: source text -> syntax tree (ast.h).
 *
 * ms_dsl_parse runs the reentrant flex scanner and bison parser over one file. Lexical and
 * syntax errors go to the caller's ms_diags (several per run, recovering at ';' and '}'); when
 * there is any error the partial tree is discarded.
 *
 * Ownership: the tree is allocated in the caller's arena and lives until ms_arena_free; `src`
 * is only read during the call; diagnostics are owned by the ms_diags.
 *
 * Usage:
 *     ms_arena arena; ms_arena_init(&arena);
 *     ms_diags diags; ms_diags_init(&diags, "m.mstar", src, len, 0);
 *     ms_ast_model *m = NULL;
 *     if (ms_dsl_parse(&arena, &diags, src, len, &m) != MS_OK) ms_diags_print(&diags, stderr);
 *     ...; ms_diags_free(&diags); ms_arena_free(&arena);
 */
#ifndef MS_DSL_H
#define MS_DSL_H

#include "ast.h"

/*
 * Parse `len` bytes of `src` (need not be NUL-terminated; NUL bytes are reported as invalid
 * characters). Returns MS_OK and *out = the tree when no error was reported; MS_ERR_PARSE and
 * *out = NULL when diagnostics were added; MS_ERR_OOM (and *out = NULL) when memory ran out.
 * The arena's out-of-memory jmp_buf is saved and restored around the call.
 */
ms_status ms_dsl_parse(ms_arena *arena, ms_diags *diags, const char *src, size_t len,
                       ms_ast_model **out);

#endif /* MS_DSL_H */
