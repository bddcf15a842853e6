/*
 * mstarc.h - one compilation of one model file: read, parse (dsl/), check (sema.c), and the
 * canonical dump. This is the library behind the `mstarc` command (main.c) and the tests.
 *
 * Ownership: ms_compile_* returns a session owned by the caller (ms_compile_free). The session
 * owns the source text, the arena holding the syntax tree and the checked model, and the
 * diagnostics; pointers obtained from it stay valid until ms_compile_free.
 *
 * Usage:
 *     ms_compile *c = NULL;
 *     ms_error err = {0};
 *     ms_status st = ms_compile_file("models/llama.mstar", 0, &c, &err);
 *     if (st == MS_ERR_IO || st == MS_ERR_OOM) { fprintf(stderr, "%s\n", err.msg); ... }
 *     else if (st != MS_OK) ms_diags_print(ms_compile_diags(c), stderr);
 *     else walk(ms_compile_model(c));
 *     ms_compile_free(c);
 */
#ifndef MS_MSTARC_H
#define MS_MSTARC_H

#include <stdio.h>

#include "model.h"
#include "print.h"

typedef struct ms_compile ms_compile;

/*
 * Parse and check `len` bytes of `src` (copied), reporting under the name `file`. max_errors
 * <= 0 means MS_DIAG_MAX_ERRORS_DEFAULT. Returns:
 *   MS_OK         *out holds the checked model;
 *   MS_ERR_PARSE  *out holds the diagnostics (lexical, syntax or semantic), no model;
 *   MS_ERR_OOM    out of memory: *out is NULL and `err` says so.
 */
ms_status ms_compile_source(const char *file, const char *src, size_t len, int max_errors,
                            ms_compile **out, ms_error *err);

/* Read `path` and compile it as ms_compile_source. A file that cannot be read gives MS_ERR_IO,
 * *out = NULL and "cannot open '<path>': <reason>" in err. */
ms_status ms_compile_file(const char *path, int max_errors, ms_compile **out, ms_error *err);

/* The checked model, or NULL when the compilation had errors. */
const ms_model *ms_compile_model(const ms_compile *c);

/* The diagnostics of the compilation (empty when it succeeded). */
const ms_diags *ms_compile_diags(const ms_compile *c);

/* Release the session and everything in it. NULL is ok. */
void ms_compile_free(ms_compile *c);

/*
 * Canonical, deterministic text of a checked model: valid source in one fixed layout (one config
 * block, one weights block, nodes and walks in declaration order, canonical expressions) with
 * `#` comments that show what the checker resolved (resource order and kinds, step records with
 * their defaults, capture buckets). Parsing the dump and dumping again gives the same bytes.
 * Appends to `out`; MS_ERR_OOM when the buffer could not grow.
 */
ms_status ms_model_dump(const ms_model *m, ms_strbuf *out);

#endif /* MS_MSTARC_H */
