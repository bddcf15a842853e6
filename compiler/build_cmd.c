/*
 * build_cmd.c - `mstarc build FILE -o DIR`: compile a model file, write its generated C
 * (DIR/<model>_gen.c, DIR/<model>_main.c) and link the serving binary DIR/<model> with libmstar.
 *
 * The C compiler, its flags, libmstar.a and the link flags are baked in when mstarc is built
 * (MS_BUILD_* macros set by compiler/build.mk from the GNUmakefile's CC, CPPFLAGS, LDFLAGS and
 * LDLIBS with absolute paths), so a built tree needs no configuration; flags and environment
 * variables override each value. A failing compiler run is reported with its command and exit
 * status. Only main() exits; this returns the status.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "codegen.h"
#include "mstarc.h"

#ifndef MS_BUILD_CC
#define MS_BUILD_CC "cc"
#endif
#ifndef MS_BUILD_CFLAGS
#define MS_BUILD_CFLAGS "-std=c11 -O2"
#endif
#ifndef MS_BUILD_LIBMSTAR
#define MS_BUILD_LIBMSTAR "libmstar.a"
#endif
#ifndef MS_BUILD_LDLIBS
#define MS_BUILD_LDLIBS "-lm"
#endif

static void build_usage(FILE *out) {
    fprintf(out,
            "usage: mstarc build FILE -o DIR [--emit-only] [--cc CC] [--cflags FLAGS]\n"
            "                    [--libmstar PATH] [--ldlibs FLAGS]\n"
            "\n"
            "  writes DIR/<model>_gen.c (the compiled model) and DIR/<model>_main.c, then links\n"
            "  DIR/<model> with libmstar (the serving binary: generate, ...).\n"
            "  --emit-only  write the C sources only (no compiler run)\n"
            "  defaults: MSTARC_CC (%s), MSTARC_CFLAGS, MSTARC_LIBMSTAR (%s), MSTARC_LDLIBS\n",
            MS_BUILD_CC, MS_BUILD_LIBMSTAR);
}

/* Create dir and its parents (mkdir -p). */
static int make_dirs(const char *dir) {
    char buf[4096];
    size_t n = strlen(dir);
    if (n == 0 || n >= sizeof buf)
        return -1;
    memcpy(buf, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char c = buf[i];
            buf[i] = '\0';
            if (mkdir(buf, 0777) != 0 && errno != EEXIST)
                return -1;
            buf[i] = c;
        }
    }
    return 0;
}

/* Write text to path unless it already holds exactly that text (keeps mtimes stable). */
static int write_file(const char *path, const ms_strbuf *text) {
    FILE *f = fopen(path, "rb");
    if (f != NULL) {
        bool same = true;
        size_t i = 0;
        int ch;
        while ((ch = fgetc(f)) != EOF && same)
            same = i < text->len && (char)ch == text->data[i++];
        same = same && ch == EOF && i == text->len;
        fclose(f);
        if (same)
            return 0;
    }
    f = fopen(path, "wb");
    if (f == NULL) {
        fprintf(stderr, "mstarc: error: cannot write '%s': %s\n", path, strerror(errno));
        return -1;
    }
    size_t w = fwrite(text->data, 1, text->len, f);
    if (fclose(f) != 0 || w != text->len) {
        fprintf(stderr, "mstarc: error: cannot write '%s': %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

static const char *pick(const char *flag, const char *env, const char *baked) {
    if (flag != NULL)
        return flag;
    const char *e = getenv(env);
    return e != NULL && e[0] != '\0' ? e : baked;
}

/* Single-quote s for /bin/sh. */
static void sh_quote(ms_strbuf *b, const char *s) {
    ms_strbuf_puts(b, "'");
    for (; *s; s++) {
        if (*s == '\'')
            ms_strbuf_puts(b, "'\\''");
        else
            ms_strbuf_printf(b, "%c", *s);
    }
    ms_strbuf_puts(b, "'");
}

/* DIR/kernels/<instance>.cu. A model whose kernels the templates cannot express gets a warning (the binary
 * still runs on the CPU backend); I/O errors fail. Returns 0 or -1. */
static int write_kernels(const ms_model *m, const char *file, const char *outdir) {
    ms_gen_file files[32];
    int n = 0;
    ms_error err = {0};
    ms_status st = ms_codegen_kernels(m, file, files, (int)MS_ARRAY_LEN(files), &n, &err);
    if (st == MS_ERR_UNSUPPORTED) {
        fprintf(stderr, "mstarc: warning: no CUDA kernel instances: %s\n", err.msg);
        return 0;
    }
    if (st != MS_OK) {
        fprintf(stderr, "mstarc: error: %s\n", err.msg);
        return -1;
    }
    int rc = 0;
    char *dir = ms_asprintf("%s/kernels", outdir);
    if (dir == NULL || make_dirs(dir) != 0) {
        fprintf(stderr, "mstarc: error: cannot create '%s/kernels'\n", outdir);
        rc = -1;
    }
    for (int i = 0; i < n && rc == 0; i++) {
        char *path = ms_asprintf("%s/%s", dir, files[i].name);
        if (path == NULL || write_file(path, &files[i].text) != 0)
            rc = -1;
        ms_free(path);
    }
    ms_free(dir);
    ms_gen_files_free(files, n);
    return rc;
}

int ms_mstarc_build_main(int argc, char **argv) {
    const char *file = NULL, *outdir = NULL;
    const char *cc = NULL, *cflags = NULL, *lib = NULL, *ldlibs = NULL;
    bool emit_only = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **dst = strcmp(a, "-o") == 0          ? &outdir
                           : strcmp(a, "--cc") == 0       ? &cc
                           : strcmp(a, "--cflags") == 0   ? &cflags
                           : strcmp(a, "--libmstar") == 0 ? &lib
                           : strcmp(a, "--ldlibs") == 0   ? &ldlibs
                                                          : NULL;
        if (dst != NULL) {
            if (i + 1 >= argc) {
                fprintf(stderr, "mstarc: error: %s needs a value\n", a);
                return 2;
            }
            *dst = argv[++i];
        } else if (strcmp(a, "--emit-only") == 0) {
            emit_only = true;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            build_usage(stdout);
            return 0;
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "mstarc: error: unknown option '%s' for build\n", a);
            build_usage(stderr);
            return 2;
        } else if (file == NULL) {
            file = a;
        } else {
            fprintf(stderr, "mstarc: error: build takes one model file (got '%s' and '%s')\n",
                    file, a);
            return 2;
        }
    }
    if (file == NULL || outdir == NULL) {
        fprintf(stderr, "mstarc: error: build needs a model file and -o DIR\n");
        build_usage(stderr);
        return 2;
    }

    ms_compile *c = NULL;
    ms_error err = {0};
    ms_status st = ms_compile_file(file, 0, &c, &err);
    if (st != MS_OK) {
        if (c != NULL)
            ms_diags_print(ms_compile_diags(c), stderr);
        else
            fprintf(stderr, "mstarc: error: %s\n", err.msg);
        ms_compile_free(c);
        return 1;
    }
    const ms_model *m = ms_compile_model(c);
    ms_strbuf gen = {0}, main_c = {0};
    st = ms_codegen_model_c(m, file, &gen, &err);
    if (st == MS_OK)
        st = ms_codegen_main_c(m, file, &main_c, &err);
    int rc = 1;
    char *gen_path = NULL, *main_path = NULL, *bin_path = NULL;
    ms_strbuf cmd = {0};
    if (st != MS_OK) {
        fprintf(stderr, "mstarc: error: %s\n", err.msg);
        goto done;
    }
    if (make_dirs(outdir) != 0) {
        fprintf(stderr, "mstarc: error: cannot create '%s': %s\n", outdir, strerror(errno));
        goto done;
    }
    gen_path = ms_asprintf("%s/%s_gen.c", outdir, m->name);
    main_path = ms_asprintf("%s/%s_main.c", outdir, m->name);
    bin_path = ms_asprintf("%s/%s", outdir, m->name);
    if (gen_path == NULL || main_path == NULL || bin_path == NULL) {
        fprintf(stderr, "mstarc: error: out of memory\n");
        goto done;
    }
    if (write_file(gen_path, &gen) != 0 || write_file(main_path, &main_c) != 0)
        goto done;
    if (write_kernels(m, file, outdir) != 0)
        goto done;
    if (emit_only) {
        printf("%s: wrote %s, %s\n", file, gen_path, main_path);
        rc = 0;
        goto done;
    }
    ms_strbuf_printf(&cmd, "%s %s ", pick(cc, "MSTARC_CC", MS_BUILD_CC),
                     pick(cflags, "MSTARC_CFLAGS", MS_BUILD_CFLAGS));
    ms_strbuf_puts(&cmd, "-o ");
    sh_quote(&cmd, bin_path);
    ms_strbuf_puts(&cmd, " ");
    sh_quote(&cmd, gen_path);
    ms_strbuf_puts(&cmd, " ");
    sh_quote(&cmd, main_path);
    ms_strbuf_printf(&cmd, " %s %s", pick(lib, "MSTARC_LIBMSTAR", MS_BUILD_LIBMSTAR),
                     pick(ldlibs, "MSTARC_LDLIBS", MS_BUILD_LDLIBS));
    if (cmd.oom) {
        fprintf(stderr, "mstarc: error: out of memory\n");
        goto done;
    }
    fflush(stdout);
    int ws = system(cmd.data);
    if (ws == -1) {
        fprintf(stderr, "mstarc: error: cannot run the C compiler: %s\n  command: %s\n",
                strerror(errno), cmd.data);
        goto done;
    }
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0) {
        if (WIFEXITED(ws))
            fprintf(stderr, "mstarc: error: the C compiler failed (exit status %d)\n",
                    WEXITSTATUS(ws));
        else
            fprintf(stderr, "mstarc: error: the C compiler was killed (signal %d)\n",
                    WIFSIGNALED(ws) ? WTERMSIG(ws) : 0);
        fprintf(stderr, "  command: %s\n", cmd.data);
        goto done;
    }
    printf("%s: built %s (C in %s)\n", file, bin_path, gen_path);
    rc = 0;
done:
    ms_strbuf_free(&cmd);
    ms_free(gen_path);
    ms_free(main_path);
    ms_free(bin_path);
    ms_strbuf_free(&gen);
    ms_strbuf_free(&main_c);
    ms_compile_free(c);
    return rc;
}
