/*
 * build_cmd.c - `mstarc build FILE -o DIR`: compile a model file, write its generated C
 * (DIR/<model>_gen.c, DIR/<model>_main.c) and link the serving binary DIR/<model> with libmstar.
 *
 * The C compiler, its flags, libmstar.a and the link flags are baked in when mstarc is built
 * (MS_BUILD_* macros set by compiler/build.mk from the GNUmakefile's CC, CPPFLAGS, LDFLAGS and
 * LDLIBS with absolute paths), so a built tree needs no configuration; flags and environment
 * variables override each value. A failing compiler run is reported with its command and exit
 * status. Only main() exits; this returns the status.
 *
 * --arch sm_80,sm_90 (CUDA builds: NVRTC) compiles the kernel instance files just written, read
 * back from DIR/kernels/<stem>.cu with the shape defines in front exactly as the runtime puts them
 * (ms_kernel_spec_shape_defines), once per architecture:
 *   --config CKPT   the shape of that checkpoint (its config.json evaluated through the model's
 *                   config and resource arguments); the instances that checkpoint runs go into
 *                   the cubin cache under the runtime's key (nvrtc_cache.h), so the serving
 *                   binary finds them at load; files the checkpoint does not use are skipped.
 *   without it      a compile check at a representative shape set (KSHAPES below: head_dim 64
 *                   and 128, query heads per KV head 1, 4 and 8, the model's page size), nothing
 *                   cached.
 * A failing instance prints NVRTC's error (URI, the emitted file's path) and its whole log; the
 * log's line numbers are the emitted file's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <jansson.h>
#include <time.h>

#include "codegen.h"
#include "kernel.h"
#include "eval.h"
#include "mstarc.h"

#if defined(MS_HAVE_CUDA)
#include "nvrtc_cache.h"
#endif

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
            "                    [--arch sm_80,sm_90 [--config CKPT_DIR|config.json]]\n"
            "\n"
            "  writes DIR/<model>_gen.c (the compiled model), DIR/<model>_main.c and the CUDA\n"
            "  kernel instances DIR/kernels/*.cu, then links DIR/<model> with libmstar (the\n"
            "  serving binary: generate, bench, kernels).\n"
            "  --emit-only  write the sources only (no C compiler run)\n"
            "  --arch       compile DIR/kernels/*.cu with NVRTC for each architecture: at the\n"
            "               shape of --config's checkpoint into the kernel cache ($MSTAR_CACHE,\n"
            "               ~/.cache/mstar), or without --config as a check at head_dim 64/128,\n"
            "               groups 1/4/8 and the model's page size (nothing cached)\n"
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

#define MAX_KERNEL_FILES 32

/* DIR/kernels/<instance>.cu; their names go to names[0..*n_names) (ms_malloc'd, caller frees).
 * A model whose kernels the templates cannot express gets a warning (the binary still runs on the
 * CPU backend); I/O errors fail. Returns 0 or -1. */
static int write_kernels(const ms_model *m, const char *file, const char *outdir, char **names,
                         int *n_names) {
    ms_gen_file files[MAX_KERNEL_FILES];
    int n = 0;
    ms_error err = {0};
    *n_names = 0;
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
        names[i] = rc == 0 ? ms_strdup(files[i].name) : NULL;
        if (rc == 0 && names[i] == NULL) {
            fprintf(stderr, "mstarc: error: out of memory\n");
            rc = -1;
        }
        if (rc == 0)
            *n_names = i + 1;
    }
    ms_free(dir);
    ms_gen_files_free(files, n);
    return rc;
}

/* ---- --arch: NVRTC over the emitted kernel files ---- */

/* The value of a resource argument for one checkpoint: conditions resolved (enum words and
 * none are leaves the evaluator does not take). NULL when the argument is not given. */
static ms_status arg_leaf(const ms_resource *r, const char *key, const ms_value *values,
                          const ms_ast_expr **out, ms_error *err) {
    const ms_ast_expr *e = r != NULL ? ms_resource_arg(r, key) : NULL;
    while (e != NULL && e->kind == MS_EXPR_COND) {
        ms_value c;
        MS_TRY(ms_expr_eval(e->cond, values, &c, err));
        e = c.b ? e->lhs : e->rhs;
    }
    *out = e;
    return MS_OK;
}

/* An int resource argument (dflt when not given). */
static ms_status arg_int(const ms_resource *r, const char *key, const ms_value *values, int dflt,
                         int *out, ms_error *err) {
    const ms_ast_expr *e = NULL;
    MS_TRY(arg_leaf(r, key, values, &e, err));
    if (e == NULL) {
        *out = dflt;
        return MS_OK;
    }
    ms_value v;
    MS_TRY(ms_expr_eval(e, values, &v, err));
    if (v.type != MS_TYPE_INT || v.i < 1 || v.i > 1 << 20)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s.%s: %lld is not a positive size", r->name, key,
                       (long long)v.i);
    *out = (int)v.i;
    return MS_OK;
}

/* [scratch] Element i of a scratch's shape = [positions, kv_heads, head_dim] under a config. */
static ms_status scratch_dim(const ms_resource *r, int i, const ms_value *values, int *out,
                             ms_error *err) {
    const ms_ast_expr *e = ms_resource_arg(r, "shape");
    if (e == NULL || e->kind != MS_EXPR_LIST || e->args.n != 3)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "scratch %s: shape is not a list of three",
                       r->name);
    ms_value v;
    MS_TRY(ms_expr_eval(((const ms_ast_arg *)e->args.items[i])->value, values, &v, err));
    if (v.type != MS_TYPE_INT || v.i < 1 || v.i > 1 << 20)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s.shape[%d]: %lld is not a positive size", r->name,
                       i, (long long)v.i);
    *out = (int)v.i;
    return MS_OK;
}

/* The checkpoint's kernel shape: config.json evaluated through the resources of `node` (NULL:
 * the first node's KV layout, which later kv_pool nodes share; a node on a scratch: its own,
 * the frame's slots as the page size). */
static ms_status checkpoint_shape(const ms_model *m, const ms_node *node, const char *config,
                                  ms_kernel_model_shape *sh, ms_error *err) {
    memset(sh, 0, sizeof *sh);
    struct stat st;
    char *path = stat(config, &st) == 0 && S_ISDIR(st.st_mode)
                     ? ms_asprintf("%s/config.json", config)
                     : ms_strdup(config);
    if (path == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "out of memory");
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    if (root == NULL) {
        /* jansson's line is -1 when the file could not be read at all */
        ms_status s2 = je.line > 0
                           ? MS_FAIL(err, MS_ERR_PARSE, "--config %s: %s (line %d)", path,
                                     je.text, je.line)
                           : MS_FAIL(err, MS_ERR_IO, "--config %s: %s", path, je.text);
        ms_free(path);
        return s2;
    }
    ms_value *values = ms_calloc((size_t)(m->n_params > 0 ? m->n_params : 1), sizeof *values);
    ms_status s2 = values == NULL ? MS_FAIL(err, MS_ERR_OOM, "out of memory") : MS_OK;
    const ms_resource *kv = NULL, *attn = NULL, *pos = NULL, *scratch = NULL;
    /* node 0's resources: later nodes declare the same KV layout (ms_lower_check) */
    const ms_node *nd = node != NULL ? node : m->nodes[0];
    for (int i = 0; s2 == MS_OK && i < nd->n_resources; i++) {
        const ms_resource *r = nd->resources[i];
        if (r->kind == MS_RESOURCE_KV)
            kv = r;
        else if (r->kind == MS_RESOURCE_ATTN)
            attn = r;
        else if (r->kind == MS_RESOURCE_POS)
            pos = r;
        else if (r->kind == MS_RESOURCE_SCRATCH)
            scratch = r;
    }
    if (s2 == MS_OK && scratch == NULL && (kv == NULL || attn == NULL))
        s2 = MS_FAIL(err, MS_ERR_UNSUPPORTED, "model %s has no kv_pool / attention", m->name);
    if (s2 == MS_OK)
        s2 = ms_config_eval(m, root, values, err);
    const ms_ast_expr *win = NULL, *style = NULL, *dt = NULL;
    if (scratch != NULL) { /* [scratch] */
        if (s2 == MS_OK)
            s2 = scratch_dim(scratch, 0, values, &sh->page_size, err);
        if (s2 == MS_OK)
            s2 = scratch_dim(scratch, 1, values, &sh->n_kv_heads, err);
        if (s2 == MS_OK)
            s2 = scratch_dim(scratch, 2, values, &sh->head_dim, err);
        if (s2 == MS_OK)
            s2 = arg_int(scratch, "q_heads", values, 0, &sh->n_q_heads, err);
        if (s2 == MS_OK)
            s2 = arg_leaf(scratch, "dtype", values, &dt, err);
    } else {
        if (s2 == MS_OK)
            s2 = arg_int(kv, "head_dim", values, 0, &sh->head_dim, err);
        if (s2 == MS_OK)
            s2 = arg_int(kv, "kv_heads", values, 0, &sh->n_kv_heads, err);
        if (s2 == MS_OK)
            s2 = arg_int(kv, "page_size", values, 16, &sh->page_size, err);
        if (s2 == MS_OK)
            s2 = arg_int(attn, "q_heads", values, 0, &sh->n_q_heads, err);
        if (s2 == MS_OK)
            s2 = arg_leaf(attn, "window", values, &win, err);
        if (s2 == MS_OK)
            s2 = arg_leaf(kv, "dtype", values, &dt, err);
    }
    bool rope = pos != NULL && strcmp(pos->spec->ctor, "rope") == 0;
    if (s2 == MS_OK && rope)
        s2 = arg_leaf(pos, "style", values, &style, err);
    if (s2 == MS_OK) {
        sh->windowed = win != NULL && win->kind != MS_EXPR_NONE;
        sh->rope = !rope ? MS_KERNEL_ROPE_NONE
                   : style != NULL && style->kind == MS_EXPR_NAME &&
                           strcmp(style->text, "interleaved") == 0
                       ? MS_KERNEL_ROPE_INTERLEAVED
                       : MS_KERNEL_ROPE_NEOX;
        sh->kv_dtype = dt != NULL && dt->kind == MS_EXPR_NAME && strcmp(dt->text, "f16") == 0
                           ? MS_KERNEL_DTYPE_F16
                           : MS_KERNEL_DTYPE_BF16;
        sh->weight_dtype = sh->kv_dtype;
    }
    if (s2 != MS_OK && err->msg[0] != '\0' && strncmp(err->msg, "--config", 8) != 0)
        ms_error_prefix(err, "--config %s: ", path);
    ms_free(values);
    json_decref(root);
    ms_free(path);
    return s2;
}

/*
 * The page size of a compile check without --config: the model's kv_pool page_size when it is a
 * literal (page_size = 16), 16 when absent (its default), 16 standing in when it is an expression
 * of the config (*stand_in set: the check says so). A literal outside 1 .. MS_KERNEL_MAX_PAGE_SIZE
 * cannot be compiled for: -1 after printing so (checking at 16 would claim what is not true).
 */
static int model_page_size(const ms_model *m, int *ps, bool *stand_in) {
    *ps = 16;
    *stand_in = false;
    for (int n = 0; n < m->n_nodes; n++)
        for (int i = 0; i < m->nodes[n]->n_resources; i++) {
            const ms_resource *r = m->nodes[n]->resources[i];
            if (r->kind != MS_RESOURCE_KV)
                continue;
            const ms_ast_expr *e = ms_resource_arg(r, "page_size");
            if (e == NULL || e->kind == MS_EXPR_NONE)
                continue;
            if (e->kind != MS_EXPR_INT) {
                *stand_in = true;
                continue;
            }
            if (e->ival < 1 || e->ival > MS_KERNEL_MAX_PAGE_SIZE) {
                fprintf(stderr,
                        "mstarc: error: --arch: kv_pool %s has page_size %lld, outside the page "
                        "sizes the CUDA kernels take (1 .. %d): no kernel can be compiled for it\n",
                        r->name, (long long)e->ival, MS_KERNEL_MAX_PAGE_SIZE);
                return -1;
            }
            *ps = (int)e->ival;
        }
    return 0;
}

#if defined(MS_HAVE_CUDA)

/* The representative shapes of a compile check without --config: head_dim x group pairs that
 * cover the template branches the shipped models take (64 and 128; MHA, Llama-3-8B's 4 and
 * Llama-3-70B's 8 query heads per KV head); the page size is the model's. */
static const struct {
    int head_dim, group;
} KSHAPES[] = {{64, 1}, {128, 4}, {128, 8}};

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Read DIR/kernels/<name> back; NULL (message printed) when it cannot be read. */
static char *read_back(const char *path) {
    FILE *f = fopen(path, "rb");
    char *text = NULL;
    size_t len = 0, cap = 0;
    if (f != NULL) {
        char buf[4096];
        size_t r;
        while ((r = fread(buf, 1, sizeof buf, f)) > 0) {
            if (ms_grow((void **)&text, &cap, len + r + 1, 1) != MS_OK) {
                ms_free(text);
                text = NULL;
                break;
            }
            memcpy(text + len, buf, r);
            len += r;
        }
        bool bad = ferror(f) != 0;
        fclose(f);
        if (bad) {
            ms_free(text);
            text = NULL;
        } else if (text == NULL) {
            text = ms_strdup("");
        } else {
            text[len] = '\0';
        }
    }
    if (text == NULL)
        fprintf(stderr, "mstarc: error: cannot read back '%s': %s\n", path,
                f == NULL ? strerror(errno) : "read failed");
    return text;
}

/* Compile one emitted file (defines + text) for arch; print its line. Returns 0 or -1. */
static int compile_one(const char *uri, const char *path, const char *defines, const char *text,
                       int arch, bool cache, const char *what) {
    char *src = ms_asprintf("%s%s", defines, text);
    if (src == NULL) {
        fprintf(stderr, "mstarc: error: out of memory\n");
        return -1;
    }
    char *log = NULL;
    ms_nvrtc_options o = {.no_cache = !cache, .source_path = path, .log = &log};
    ms_cubin cb = {0};
    ms_error err = {0};
    double t0 = now_ms();
    ms_status st = ms_nvrtc_compile_ex(uri, src, arch, &o, &cb, &err);
    double ms = now_ms() - t0;
    int rc = 0;
    if (st != MS_OK) {
        fprintf(stderr, "mstarc: error: %s\n", err.msg);
        if (log != NULL)
            fprintf(stderr, "---- NVRTC log of %s (sm_%d, %s) ----\n%s%s", path, arch, what, log,
                    log[0] != '\0' && log[strlen(log) - 1] == '\n' ? "" : "\n");
        rc = -1;
    } else {
        printf("  %-44s sm_%-4d %-9s %8.1f ms  %s\n", uri, arch,
               cb.from_cache ? "cached" : cache ? "compiled" : "ok", ms, what);
    }
    fflush(stdout);
    ms_free(log);
    ms_nvrtc_cubin_free(&cb);
    ms_free(src);
    return rc;
}

/* --arch with --config: the checkpoint's instances into the cache. */
static int precompile_config(const ms_model *m, const char *kdir, char **names, int n_names,
                             const char *config, const int *archs, int n_archs) {
    ms_error err = {0};
    ms_kernel_model_shape sh;
    ms_kernel_spec specs[32];
    int n_specs = 0;
    /* the emitted stems (names without ".cu") pick the instances of the checkpoint's shape,
       as the serving binary's `kernels` verb does with the same list (ms_model_desc.kernels) */
    char stem_buf[MAX_KERNEL_FILES][MS_KERNEL_URI_MAX];
    const char *stems[MAX_KERNEL_FILES];
    int n_stems = 0;
    for (int j = 0; j < n_names && j < MAX_KERNEL_FILES; j++) {
        size_t len = strlen(names[j]);
        if (len >= 3 && len - 3 < MS_KERNEL_URI_MAX && strcmp(names[j] + len - 3, ".cu") == 0) {
            memcpy(stem_buf[n_stems], names[j], len - 3);
            stem_buf[n_stems][len - 3] = '\0';
            stems[n_stems] = stem_buf[n_stems];
            n_stems++;
        }
    }
    if (checkpoint_shape(m, NULL, config, &sh, &err) != MS_OK ||
        ms_kernel_specs_for_stems(&sh, stems, n_stems, specs, (int)MS_ARRAY_LEN(specs), &n_specs,
                                  &err) != MS_OK) {
        fprintf(stderr, "mstarc: error: %s\n", err.msg);
        return -1;
    }
    /* [scratch] a node on a scratch KV loads its own instances (its heads, the frame's slots as
       the page size: the engine's eng_kernels_init): the ones the first node's list lacks */
    for (int ni = 1; ni < m->n_nodes; ni++) {
        bool on_scratch = false;
        for (int r = 0; r < m->nodes[ni]->n_resources; r++)
            on_scratch = on_scratch || m->nodes[ni]->resources[r]->kind == MS_RESOURCE_SCRATCH;
        if (!on_scratch)
            continue;
        ms_kernel_model_shape sh2;
        ms_kernel_spec more[32];
        int n_more = 0;
        if (checkpoint_shape(m, m->nodes[ni], config, &sh2, &err) != MS_OK ||
            ms_kernel_specs_for_stems(&sh2, stems, n_stems, more, (int)MS_ARRAY_LEN(more), &n_more,
                                      &err) != MS_OK) {
            fprintf(stderr, "mstarc: error: node %s: %s\n", m->nodes[ni]->name, err.msg);
            return -1;
        }
        printf("kernels: node %s at head_dim=%d, page_size=%d, group=%d\n", m->nodes[ni]->name,
               sh2.head_dim, sh2.page_size, sh2.n_kv_heads > 0 ? sh2.n_q_heads / sh2.n_kv_heads : 0);
        for (int k = 0; k < n_more; k++) {
            char a[MS_KERNEL_URI_MAX], b[MS_KERNEL_URI_MAX];
            bool seen = false;
            if (ms_kernel_spec_uri(&more[k], 0, a, sizeof a, &err) != MS_OK) {
                fprintf(stderr, "mstarc: error: %s\n", err.msg);
                return -1;
            }
            for (int j = 0; j < n_specs && !seen; j++)
                seen = ms_kernel_spec_uri(&specs[j], 0, b, sizeof b, &err) == MS_OK &&
                       strcmp(a, b) == 0;
            if (seen)
                continue;
            if (n_specs == (int)MS_ARRAY_LEN(specs)) {
                fprintf(stderr, "mstarc: error: more than %d kernel instances\n",
                        (int)MS_ARRAY_LEN(specs));
                return -1;
            }
            specs[n_specs++] = more[k];
        }
    }
    char cache[4096];
    if (ms_nvrtc_cache_dir(NULL, cache, sizeof cache, &err) != MS_OK) {
        fprintf(stderr, "mstarc: error: --config: %s (set MSTAR_CACHE to a folder)\n", err.msg);
        return -1;
    }
    printf("kernels: %s at head_dim=%d, page_size=%d, group=%d (%s) into %s\n", m->name,
           sh.head_dim, sh.page_size, sh.n_kv_heads > 0 ? sh.n_q_heads / sh.n_kv_heads : 0,
           config, cache);
    bool used[MAX_KERNEL_FILES] = {false};
    int compiled = 0;
    for (int i = 0; i < n_specs; i++) {
        char stem[MS_KERNEL_URI_MAX], uri[MS_KERNEL_URI_MAX], file[MS_KERNEL_URI_MAX + 8];
        char defines[256];
        if (ms_kernel_spec_stem(&specs[i], stem, sizeof stem, &err) != MS_OK ||
            ms_kernel_spec_uri(&specs[i], 0, uri, sizeof uri, &err) != MS_OK ||
            ms_kernel_spec_shape_defines(&specs[i], defines, sizeof defines, &err) != MS_OK) {
            fprintf(stderr, "mstarc: error: %s\n", err.msg);
            return -1;
        }
        snprintf(file, sizeof file, "%s.cu", stem);
        int k = -1;
        for (int j = 0; j < n_names; j++)
            if (strcmp(names[j], file) == 0)
                k = j;
        MS_ASSERT(k >= 0); /* ms_kernel_specs_for_stems keeps listed stems only */
        used[k] = true;
        char *path = ms_asprintf("%s/%s", kdir, file);
        char *text = path != NULL ? read_back(path) : NULL;
        int rc = text == NULL ? -1 : 0;
        for (int a = 0; a < n_archs && rc == 0; a++, compiled++)
            rc = compile_one(uri, path, defines, text, archs[a], true, file);
        ms_free(text);
        ms_free(path);
        if (rc != 0)
            return -1;
    }
    for (int j = 0; j < n_names; j++)
        if (!used[j])
            printf("  %-44s skipped: not used with this checkpoint\n", names[j]);
    printf("kernels: %d instance%s x %d arch%s in the cache for %s\n", compiled / n_archs,
           compiled / n_archs == 1 ? "" : "s", n_archs, n_archs == 1 ? "" : "s", config);
    return 0;
}

/* --arch without --config: every emitted file at the KSHAPES, nothing cached. */
static int check_representative(const ms_model *m, const char *kdir, char **names, int n_names,
                                const int *archs, int n_archs) {
    int ps;
    bool stand_in;
    if (model_page_size(m, &ps, &stand_in) != 0)
        return -1;
    int checks = 0;
    for (int j = 0; j < n_names; j++) {
        char *path = ms_asprintf("%s/%s", kdir, names[j]);
        char *text = path != NULL ? read_back(path) : NULL;
        if (text == NULL) {
            ms_free(path);
            return -1;
        }
        bool grouped = strstr(text, "MS_GROUP") != NULL;
        bool paged = grouped || strstr(text, "MS_PAGE_SIZE") != NULL;
        bool shaped = paged || strstr(text, "MS_HEAD_DIM") != NULL;
        int n_shapes = grouped ? (int)MS_ARRAY_LEN(KSHAPES) : shaped ? 2 : 1;
        int rc = 0;
        for (int s = 0; s < n_shapes && rc == 0; s++) {
            int hd = grouped ? KSHAPES[s].head_dim : s == 0 ? 64 : 128;
            int g = grouped ? KSHAPES[s].group : 1;
            char defines[256] = "", uri[MS_KERNEL_URI_MAX];
            size_t stem_len = strlen(names[j]) - 3; /* without .cu */
            if (grouped)
                snprintf(defines, sizeof defines,
                         "#define MS_HEAD_DIM %d\n#define MS_PAGE_SIZE %d\n#define MS_GROUP %d\n"
                         "#line 1\n", hd, ps, g);
            else if (paged)
                snprintf(defines, sizeof defines,
                         "#define MS_HEAD_DIM %d\n#define MS_PAGE_SIZE %d\n#line 1\n", hd, ps);
            else if (shaped)
                snprintf(defines, sizeof defines, "#define MS_HEAD_DIM %d\n#line 1\n", hd);
            if (grouped)
                snprintf(uri, sizeof uri, "%.*s_hd%d_ps%d_g%d", (int)stem_len, names[j], hd, ps, g);
            else if (paged)
                snprintf(uri, sizeof uri, "%.*s_hd%d_ps%d", (int)stem_len, names[j], hd, ps);
            else if (shaped)
                snprintf(uri, sizeof uri, "%.*s_hd%d", (int)stem_len, names[j], hd);
            else
                snprintf(uri, sizeof uri, "%.*s", (int)stem_len, names[j]);
            for (int a = 0; a < n_archs && rc == 0; a++, checks++)
                rc = compile_one(uri, path, defines, text, archs[a], false, names[j]);
        }
        ms_free(text);
        ms_free(path);
        if (rc != 0)
            return -1;
    }
    printf("kernels: %d compile check%s of %d instance file%s: compile-checked at head_dim=64,128, "
           "group=1,4,8 (pairs 64/1, 128/4, 128/8), page_size=%d%s; no cache entries: pass "
           "--config for the checkpoint's shape\n",
           checks, checks == 1 ? "" : "s", n_names, n_names == 1 ? "" : "s", ps,
           stand_in ? " (the model's page_size comes from the config: 16 stands in)" : "");
    return 0;
}

#endif /* MS_HAVE_CUDA */

/* --arch: compile the emitted kernel files for every arch. Returns 0 or -1 (message printed). */
static int precompile_kernels(const ms_model *m, const char *outdir, char **names, int n_names,
                              const char *config, const int *archs, int n_archs) {
#if defined(MS_HAVE_CUDA)
    if (n_names == 0) {
        fprintf(stderr, "mstarc: warning: --arch: model %s has no kernel instances to compile\n",
                m->name);
        return 0;
    }
    ms_error err = {0};
    for (int a = 0; a < n_archs; a++)
        if (ms_nvrtc_check_arch(archs[a], &err) != MS_OK) {
            fprintf(stderr, "mstarc: error: --arch: %s\n", err.msg);
            return -1;
        }
    char *kdir = ms_asprintf("%s/kernels", outdir);
    if (kdir == NULL) {
        fprintf(stderr, "mstarc: error: out of memory\n");
        return -1;
    }
    int rc = config != NULL ? precompile_config(m, kdir, names, n_names, config, archs, n_archs)
                            : check_representative(m, kdir, names, n_names, archs, n_archs);
    ms_free(kdir);
    return rc;
#else
    (void)m, (void)outdir, (void)names, (void)n_names, (void)config, (void)archs, (void)n_archs;
    (void)checkpoint_shape, (void)model_page_size;
    fprintf(stderr, "mstarc: error: --arch: this mstarc was built without CUDA, so there is no "
                    "NVRTC to compile kernels with (build mstar-c with the CUDA toolkit)\n");
    return -1;
#endif
}

/* Flush stdout and check it for a write error: 0, or 1 with a message (as main.c's). */
static int stdout_check(void) {
    int before = errno; /* a failed implicit flush (a full buffer) left its reason here */
    errno = 0;
    int e = fflush(stdout) != 0 ? errno : 0;
    if (e == 0 && !ferror(stdout))
        return 0;
    if (e == 0)
        e = before;
    fprintf(stderr, "mstarc: error: cannot write the output to stdout: %s\n",
            e != 0 ? strerror(e) : "a write failed");
    return 1;
}

int ms_mstarc_build_main(int argc, char **argv) {
    const char *file = NULL, *outdir = NULL;
    const char *cc = NULL, *cflags = NULL, *lib = NULL, *ldlibs = NULL;
    const char *arch = NULL, *config = NULL;
    bool emit_only = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char **dst = strcmp(a, "-o") == 0          ? &outdir
                           : strcmp(a, "--cc") == 0       ? &cc
                           : strcmp(a, "--cflags") == 0   ? &cflags
                           : strcmp(a, "--libmstar") == 0 ? &lib
                           : strcmp(a, "--ldlibs") == 0   ? &ldlibs
                           : strcmp(a, "--arch") == 0     ? &arch
                           : strcmp(a, "--config") == 0   ? &config
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
            return stdout_check();
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
    int archs[16], n_archs = 0;
    if (arch != NULL) {
        ms_error aerr = {0};
        if (ms_kernel_parse_arch_list("--arch", arch, archs, (int)MS_ARRAY_LEN(archs), &n_archs,
                                      &aerr) != MS_OK) {
            fprintf(stderr, "mstarc: error: %s\n", aerr.msg);
            return 2;
        }
    }
    if (config != NULL && arch == NULL) {
        fprintf(stderr, "mstarc: error: --config needs --arch (it gives the shape the kernels are "
                        "precompiled at)\n");
        return 2;
    }
    if (*outdir == '\0') {
        fprintf(stderr, "mstarc: error: -o: the output folder is empty (give a folder path)\n");
        return 2;
    }
    if (config != NULL) {
        /* before any work: a missing or unreadable checkpoint is the user's to fix first */
        struct stat cst;
        if (*config == '\0' || stat(config, &cst) != 0) {
            fprintf(stderr, "mstarc: error: --config %s: %s\n", config,
                    *config == '\0' ? "the path is empty"
                    : errno == ENOENT ? "no such file or folder (give a checkpoint folder or its "
                                        "config.json)"
                                      : strerror(errno));
            return 1;
        }
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
    char *knames[MAX_KERNEL_FILES];
    int n_knames = 0;
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
    if (write_kernels(m, file, outdir, knames, &n_knames) != 0)
        goto done;
    if (arch != NULL &&
        precompile_kernels(m, outdir, knames, n_knames, config, archs, n_archs) != 0)
        goto done;
    if (emit_only) {
        printf("%s: wrote %s, %s\n", file, gen_path, main_path);
        rc = stdout_check();
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
    rc = stdout_check();
done:
    for (int i = 0; i < n_knames; i++)
        ms_free(knames[i]);
    ms_strbuf_free(&cmd);
    ms_free(gen_path);
    ms_free(main_path);
    ms_free(bin_path);
    ms_strbuf_free(&gen);
    ms_strbuf_free(&main_c);
    ms_compile_free(c);
    return rc;
}
