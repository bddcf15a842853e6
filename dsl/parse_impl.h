/*
 * parse_impl.h - the parse context shared by the scanner (lexer.l), the grammar (grammar.y),
 * the AST builders (ast.c) and the driver (parse.c). Not a public header.
 */
#ifndef MS_PARSE_IMPL_H
#define MS_PARSE_IMPL_H

#include <setjmp.h>

#include "ast.h"

#define MS_PARSE_MAX_NESTING 256
/* Deepest expression tree the parser builds (checks and code generation recurse over it). */
#define MS_PARSE_MAX_EXPR_HEIGHT 256

/* An open bracket, for "expected '}' (to close '{' at line N)" messages. */
typedef struct ms_parse_bracket {
    char open;             /* '(' '[' or '{' */
    ms_loc loc;
} ms_parse_bracket;

/* State of one parse (the bison %parse-param and flex extra data). */
struct ms_parse_ctx {
    ms_arena *arena;       /* every AST node */
    ms_diags *diags;       /* lexical and syntax errors */
    ms_ast_model *model;   /* built incrementally by the actions */
    void *scanner;         /* yyscan_t */
    char *input;           /* [len + 2] the source with two NULs (ms_malloc), scanned in place */
    jmp_buf oom;           /* longjmp target when the arena or the scanner runs out of memory */
    int n_discarded;       /* values dropped by error recovery (%destructor) */
    ms_parse_bracket brackets[MS_PARSE_MAX_NESTING]; /* [depth] open brackets, innermost last */
    int depth;             /* may exceed MS_PARSE_MAX_NESTING: deeper levels are not recorded */
    bool too_deep;         /* nesting limit reported (once) */
    bool expr_too_deep;    /* expression height limit reported (once) */
    bool at_eof;           /* the scanner returned end of file */
    const char *tok_text;  /* text of the last token (arena), for messages */
    ms_loc tok_loc;        /* location of the last token returned to the parser */
    const char *tok_word;  /* its text (arena, at most 40 bytes), NULL at end of file */
    ms_loc prev_loc;       /* the token before it */
    const char *prev_word;
    int line;              /* scanner position: line of the next character (1-based) */
    int col;               /* and its column (1-based, bytes) */
};

/* Start scanning buf[size], which ends in two NUL bytes, in place (lexer.l). */
MS_INTERNAL void ms_dsl_lex_start(char *buf, size_t size, void *scanner);

/* Scanner fatal error (out of memory inside flex): never returns. */
MS_INTERNAL _Noreturn void ms_dsl_lex_fatal(const char *msg, void *scanner);

#endif /* MS_PARSE_IMPL_H */
