/*
 * print.h - canonical text of expressions and a growable text buffer, shared by the dumper
 * (dump.c) and the messages of the semantic pass (sema.c).
 *
 * Canonical means: one spelling per tree (minimal parentheses from the grammar's precedences,
 * shortest round-tripping float literals, escaped strings), so printing a parsed print gives the
 * same text again.
 */
#ifndef MS_PRINT_H
#define MS_PRINT_H

#include <stdio.h>

#include "ast.h"

/* Growable NUL-terminated text; memory from ms_malloc. A failed growth sets `oom` and drops
 * further text. */
typedef struct ms_strbuf {
    char *data;    /* [len + 1] */
    size_t len;
    size_t cap;
    bool oom;
} ms_strbuf;

/* Append formatted text. */
void ms_strbuf_printf(ms_strbuf *b, const char *fmt, ...) MS_PRINTF(2, 3);
/* Append raw text. */
void ms_strbuf_puts(ms_strbuf *b, const char *s);
/* Release the text; the buffer is empty afterwards. NULL is ok. */
void ms_strbuf_free(ms_strbuf *b);

/* Append the canonical text of `e`. */
void ms_expr_print(ms_strbuf *b, const ms_ast_expr *e);
/* Append a string literal with quotes and escapes. */
void ms_string_print(ms_strbuf *b, const char *s);
/* Canonical text of `e` in the arena ("?" on out of memory without a jmp_buf). */
const char *ms_expr_str(ms_arena *a, const ms_ast_expr *e);

#endif /* MS_PRINT_H */
