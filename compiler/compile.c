/*
 * compile.c - a compilation session: source copy, arena, diagnostics, parse + check.
 * See mstarc.h. Out of memory anywhere in the front end or the checker unwinds here through
 * the arena's jmp_buf and becomes MS_ERR_OOM with everything released.
 */
#include "mstarc.h"

#include <errno.h>
#include <string.h>

#include "dsl.h"

struct ms_compile {
    char *file;          /* name used in diagnostics (ms_malloc) */
    char *src;           /* [len + 1] copy of the source (ms_malloc) */
    size_t len;
    ms_arena arena;      /* syntax tree and checked model */
    ms_diags diags;
    ms_model *model;     /* NULL when there were errors */
};

static ms_status compile_run(ms_compile *c) {
    jmp_buf jb;
    if (setjmp(jb) != 0) {
        ms_arena_set_oom_jmp(&c->arena, NULL);
        return MS_ERR_OOM;
    }
    ms_arena_set_oom_jmp(&c->arena, &jb);
    ms_ast_model *ast = NULL;
    ms_status st = ms_dsl_parse(&c->arena, &c->diags, c->src, c->len, &ast);
    if (st == MS_OK)
        st = ms_sema_check(&c->arena, &c->diags, ast, &c->model);
    ms_arena_set_oom_jmp(&c->arena, NULL);
    if (st == MS_OK && c->diags.oom)
        st = MS_ERR_OOM;
    return st;
}

ms_status ms_compile_source(const char *file, const char *src, size_t len, int max_errors,
                            ms_compile **out, ms_error *err) {
    *out = NULL;
    ms_compile *c = ms_calloc(1, sizeof *c);
    if (c == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", file);
    c->file = ms_strdup(file);
    c->src = ms_malloc(len + 1);
    if (c->file == NULL || c->src == NULL) {
        ms_compile_free(c);
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", file);
    }
    if (len > 0)
        memcpy(c->src, src, len);
    c->src[len] = '\0';
    c->len = len;
    ms_arena_init(&c->arena);
    ms_diags_init(&c->diags, c->file, c->src, c->len, max_errors);
    ms_status st = compile_run(c);
    if (st == MS_ERR_OOM || (st == MS_ERR_PARSE && c->diags.oom)) {
        ms_compile_free(c);
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory while compiling", file);
    }
    if (st != MS_OK && st != MS_ERR_PARSE) {
        ms_compile_free(c);
        return MS_FAIL(err, st, "%s: %s", file, ms_status_str(st));
    }
    if (st != MS_OK)
        c->model = NULL;
    *out = c;
    return st;
}

ms_status ms_compile_file(const char *path, int max_errors, ms_compile **out, ms_error *err) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return MS_FAIL(err, MS_ERR_IO, "cannot open '%s': %s", path, strerror(errno));
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (ms_grow((void **)&buf, &cap, len + 65536, 1) != MS_OK) {
            fclose(f);
            ms_free(buf);
            return MS_FAIL(err, MS_ERR_OOM, "cannot read '%s': out of memory", path);
        }
        size_t n = fread(buf + len, 1, cap - len, f);
        len += n;
        if (n == 0 || len < cap) {
            if (ferror(f)) {
                int e = errno;
                fclose(f);
                ms_free(buf);
                return MS_FAIL(err, MS_ERR_IO, "cannot read '%s': %s", path, strerror(e));
            }
            if (feof(f))
                break;
        }
    }
    fclose(f);
    ms_status st = ms_compile_source(path, buf != NULL ? buf : "", len, max_errors, out, err);
    ms_free(buf);
    return st;
}

const ms_model *ms_compile_model(const ms_compile *c) { return c->model; }

const ms_diags *ms_compile_diags(const ms_compile *c) { return &c->diags; }

void ms_compile_free(ms_compile *c) {
    if (c == NULL)
        return;
    ms_diags_free(&c->diags);
    ms_arena_free(&c->arena);
    ms_free(c->src);
    ms_free(c->file);
    ms_free(c);
}
