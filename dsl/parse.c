/*
 * parse.c - the parse driver: sets up the reentrant scanner over a byte buffer, runs the bison
 * parser, and turns out-of-memory (a longjmp from the arena or from flex) into MS_ERR_OOM with
 * the scanner released.
 */
#include "dsl.h"

#include <string.h>

#include "parse_impl.h"
#include "dsl_parse.h"
#include "dsl_lex.h"

ms_status ms_dsl_parse(ms_arena *arena, ms_diags *diags, const char *src, size_t len,
                       ms_ast_model **out) {
    *out = NULL;
    /* volatile: read after longjmp */
    ms_parse_ctx *volatile ctx = ms_calloc(1, sizeof *ctx);
    if (ctx == NULL)
        return MS_ERR_OOM;
    ctx->arena = arena;
    ctx->diags = diags;
    ctx->line = 1;
    ctx->col = 1;
    jmp_buf *saved = arena->oom_jmp;
    ms_status st = MS_OK;
    int errors_before = diags->n_errors;

    if (setjmp(ctx->oom) != 0) {
        st = MS_ERR_OOM;
        goto done;
    }
    ms_arena_set_oom_jmp(arena, &ctx->oom);
    yyscan_t scanner = NULL;
    if (ms_dsl_yylex_init_extra(ctx, &scanner) != 0) {
        st = MS_ERR_OOM;
        goto done;
    }
    ctx->scanner = scanner;
    if (len > (size_t)INT32_MAX - 2) {
        ms_diags_error(diags, (ms_loc){0, 0, 0, 0}, "file too large (%zu bytes)", len);
        st = MS_ERR_PARSE;
        goto done;
    }
    /* Our own copy with the two NULs flex needs (not yy_scan_bytes: its copy leaks when the
     * buffer state that follows cannot be allocated). Freed here, after the scanner. */
    ctx->input = ms_malloc(len + 2);
    if (ctx->input == NULL) {
        st = MS_ERR_OOM;
        goto done;
    }
    if (len > 0)
        memcpy(ctx->input, src, len);
    ctx->input[len] = ctx->input[len + 1] = '\0';
    ms_dsl_lex_start(ctx->input, len + 2, scanner);
    /* yyparse returns 2 only when its stack would exceed YYMAXDEPTH (memory comes from the
     * arena, which longjmps instead): that was reported as "nesting too deep". */
    int rc = ms_dsl_yyparse(ctx);
    if (rc != 0 || diags->n_errors > errors_before || diags->stopped || diags->oom)
        st = MS_ERR_PARSE;

done:
    ms_arena_set_oom_jmp(arena, saved);
    if (ctx->scanner != NULL)
        ms_dsl_yylex_destroy(ctx->scanner);
    ms_free(ctx->input);
    if (st == MS_OK) {
        if (ctx->model == NULL) {
            /* cannot happen: a successful parse always finishes the model */
            st = MS_ERR_INTERNAL;
        } else {
            *out = ctx->model;
        }
    }
    if (st == MS_ERR_PARSE && diags->n_errors == errors_before)
        ms_diags_error(diags, (ms_loc){0, 0, 0, 0}, "syntax error");
    ms_free(ctx);
    return st;
}
