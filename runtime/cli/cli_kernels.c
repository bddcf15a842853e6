/*
 * cli_kernels.c - the `kernels` verb of a serving binary (cli.h): precompile into the cubin cache
 * every kernel instance `generate --device cuda` loads for a checkpoint, or list them with their
 * cache status.
 *
 * The instances are those of ms_kernel_specs_for_stems: of the stems the descriptor lists (the
 * kernel instances mstarc emitted for the model: which norms, which RoPE + KV write), the variants
 * the checkpoint's shape takes as the engine sees it on the CUDA backend: head_dim, query and KV
 * heads, RoPE style (none without RoPE) and sliding window from config.json through the model's
 * own config loader, the page size of --page-size or the model's default, bf16 weights and KV. A
 * descriptor listing no instances is refused. Each is compiled from
 * ms_kernel_spec_instance_source, the text the backend compiles at load, so the entries written
 * here are the ones a later run finds (and the ones `mstarc build --arch --config` writes).
 *
 * Constraints: every bad flag gets one line on stderr naming the flag (exit 2 usage, 1 bad value);
 * an NVRTC failure prints the error (URI, source path, log path) and the whole log; nothing
 * leaks on any path. CUDA builds only do work; without CUDA the verb says so.
 */
#include "cli.h"
#include "model_probe.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "kernel.h"
#include "hf_config.h"

#if defined(MS_HAVE_CUDA)
#include "cuda_ops.h"
#include "nvrtc_cache.h"
#endif

#define KERNELS_MAX_ARCHS 16
#define KERNELS_MAX_SPECS MS_MD_MAX_KERNEL_SPECS

/* ---- options ---- */

typedef struct kernels_opts {
    const char *model;
    const char *arch;   /* NULL: the present GPU's */
    const char *dtype;  /* auto | bf16 | f32 */
    int32_t page_size;  /* 0 = the model's */
    bool list;
} kernels_opts;

static void kernels_usage(FILE *to, const char *prog) {
    fprintf(to,
            "usage: %s kernels --model PATH [--arch sm_80,sm_90] [--dtype auto|bf16|f32]\n"
            "           [--page-size N] [--list]\n"
            "\n"
            "  Compiles into the kernel cache ($MSTAR_CACHE, default ~/.cache/mstar) every CUDA\n"
            "  kernel instance `%s generate --device cuda --model PATH` loads, for each\n"
            "  architecture (default: the GPU's), and prints one line per instance and\n"
            "  architecture: URI, arch, hit (already cached) or compiled, milliseconds.\n"
            "  --list        only list the instances and whether each is cached\n"
            "  --page-size   the KV page size generate will use (default: the model's)\n"
            "  --dtype       storage of weights and KV; the CUDA backend runs bf16 (auto = bf16)\n",
            prog, prog);
}

static int kfail(const char *prog, int rc, const char *fmt, ...) MS_PRINTF(3, 4);
static int kfail(const char *prog, int rc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: kernels: ", prog);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return rc;
}

/* Returns 0, or the exit status after printing the problem; *help set for --help. */
static int parse_kernels(int argc, char **argv, const char *prog, kernels_opts *o, bool *help) {
    memset(o, 0, sizeof *o);
    o->dtype = "auto";
    *help = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            *help = true;
            return 0;
        }
        if (strcmp(a, "--list") == 0) {
            o->list = true;
            continue;
        }
        const char **dst = strcmp(a, "--model") == 0   ? &o->model
                           : strcmp(a, "--arch") == 0  ? &o->arch
                           : strcmp(a, "--dtype") == 0 ? &o->dtype
                                                       : NULL;
        bool is_ps = strcmp(a, "--page-size") == 0;
        if (dst == NULL && !is_ps) {
            kernels_usage(stderr, prog);
            return kfail(prog, 2, "unknown flag '%s'", a);
        }
        if (i + 1 >= argc)
            return kfail(prog, 2, "%s needs a value", a);
        const char *v = argv[++i];
        if (dst != NULL) {
            *dst = v;
            continue;
        }
        int64_t ps = 0;
        if (!ms_cli_parse_i64(v, 1, 65536, &ps))
            return kfail(prog, 1, "--page-size '%s' is not a number from 1 to 65536", v);
        o->page_size = (int32_t)ps;
    }
    if (o->model == NULL) {
        kernels_usage(stderr, prog);
        return kfail(prog, 2, "--model PATH is required");
    }
    if (strcmp(o->dtype, "f32") == 0)
        return kfail(prog, 1,
                     "--dtype f32: the CUDA backend keeps weights and KV in bf16, so generate "
                     "--device cuda loads bf16 instances (use --dtype bf16 or auto)");
    if (strcmp(o->dtype, "auto") != 0 && strcmp(o->dtype, "bf16") != 0)
        return kfail(prog, 1, "--dtype '%s' not understood (expected auto, bf16 or f32)",
                     o->dtype);
    return 0;
}

#if defined(MS_HAVE_CUDA)

/* ---- the instances of a checkpoint ---- */

/* The specs generate --device cuda loads for the checkpoint (see the top of the file). */
static ms_status checkpoint_specs(const ms_model_desc *desc, const kernels_opts *o,
                                  ms_kernel_spec *specs, int cap, int *n, int32_t *page_size,
                                  ms_error *err) {
    *n = 0;
    if (desc->n_kernels == 0)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                       "model %s lists no CUDA kernel instances (mstarc emitted none for it, or "
                       "its descriptor is not generated)", desc->name);
    ms_model_probe p;
    MS_TRY(ms_model_probe_init(&p, desc, o->model, err));
    ms_md_facts f = p.facts;
    ms_model_probe_free(&p);
    ms_status st;
    *page_size = o->page_size > 0 ? o->page_size : f.page_size;
    st = ms_md_kernel_specs(desc, &f, *page_size, specs, cap, n, err);
    if (st != MS_OK)
        ms_error_prefix(err, "%s: ", o->model);
    return st;
}

/* ---- precompile / list ---- */

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The present GPU's architecture, or the exit status after printing why there is none. */
static int gpu_arch(const char *prog, int *arch) {
    int count = 0;
    cudaError_t ce = cudaGetDeviceCount(&count);
    if (ce != cudaSuccess || count < 1)
        return kfail(prog, 1, "no GPU to take the architecture from (%s); pass --arch, e.g. "
                              "--arch sm_80,sm_90",
                     ce != cudaSuccess ? cudaGetErrorString(ce) : "no CUDA device");
    ms_error err = {0};
    if (ms_cuda_device_arch(0, arch, NULL, &err) != MS_OK)
        return kfail(prog, 1, "%s; pass --arch", err.msg);
    return 0;
}

/* One instance on one arch: compile or probe, print its row. Returns 0 or the exit status. */
static int one_instance(const char *prog, const ms_kernel_spec *s, int arch, bool list,
                        int *n_hit, int *n_new) {
    ms_error err = {0};
    char uri[MS_KERNEL_URI_MAX];
    char *src = NULL;
    if (ms_kernel_spec_uri(s, 0, uri, sizeof uri, &err) != MS_OK ||
        ms_kernel_spec_instance_source(s, &src, &err) != MS_OK)
        return kfail(prog, 1, "%s", err.msg);
    int rc = 0;
    if (list) {
        char path[4096];
        bool hit = false;
        if (ms_nvrtc_cache_probe(uri, src, arch, NULL, path, sizeof path, &hit, &err) != MS_OK) {
            rc = kfail(prog, 1, "%s", err.msg);
        } else {
            printf("%-44s sm_%-4d %s\n", uri, arch, hit ? "cached" : "missing");
            *(hit ? n_hit : n_new) += 1;
        }
    } else {
        char *log = NULL;
        ms_nvrtc_options opt = {.log = &log};
        ms_cubin cb = {0};
        double t0 = now_ms();
        ms_status st = ms_nvrtc_compile_ex(uri, src, arch, &opt, &cb, &err);
        double ms = now_ms() - t0;
        if (st != MS_OK) {
            rc = kfail(prog, 1, "%s", err.msg);
            if (log != NULL)
                fprintf(stderr, "---- NVRTC log of %s_sm%d ----\n%s%s", uri, arch, log,
                        log[0] != '\0' && log[strlen(log) - 1] == '\n' ? "" : "\n");
        } else {
            printf("%-44s sm_%-4d %-9s %9.1f\n", uri, arch, cb.from_cache ? "hit" : "compiled",
                   ms);
            *(cb.from_cache ? n_hit : n_new) += 1;
        }
        ms_free(log);
        ms_nvrtc_cubin_free(&cb);
    }
    ms_free(src);
    fflush(stdout);
    return rc;
}

static int run_kernels(const ms_model_desc *desc, const kernels_opts *o, const char *prog) {
    ms_error err = {0};
    int archs[KERNELS_MAX_ARCHS], n_archs = 0;
    if (o->arch != NULL) {
        if (ms_kernel_parse_arch_list("--arch", o->arch, archs, KERNELS_MAX_ARCHS, &n_archs,
                                      &err) != MS_OK)
            return kfail(prog, 1, "%s", err.msg);
        for (int a = 0; a < n_archs; a++)
            if (ms_nvrtc_check_arch(archs[a], &err) != MS_OK)
                return kfail(prog, 1, "--arch: %s", err.msg);
    } else {
        int rc = gpu_arch(prog, &archs[0]);
        if (rc != 0)
            return rc;
        n_archs = 1;
    }
    char cache[4096];
    if (ms_nvrtc_cache_dir(NULL, cache, sizeof cache, &err) != MS_OK)
        return kfail(prog, 1, "%s: nothing to precompile into (set MSTAR_CACHE to a folder)",
                     err.msg);
    ms_kernel_spec specs[KERNELS_MAX_SPECS];
    int n_specs = 0;
    int32_t ps = 0;
    if (checkpoint_specs(desc, o, specs, KERNELS_MAX_SPECS, &n_specs, &ps, &err) != MS_OK)
        return kfail(prog, 1, "%s", err.msg);
    printf("%s: %d kernel instance%s x %d arch%s for %s (page size %d), cache %s\n",
           desc->name, n_specs, n_specs == 1 ? "" : "s", n_archs, n_archs == 1 ? "" : "s",
           o->model, (int)ps, cache);
    if (o->list)
        printf("%-44s %-7s %s\n", "uri", "arch", "cache");
    else
        printf("%-44s %-7s %-9s %9s\n", "uri", "arch", "status", "ms");
    int n_hit = 0, n_new = 0;
    double t0 = now_ms();
    for (int i = 0; i < n_specs; i++)
        for (int a = 0; a < n_archs; a++) {
            int rc = one_instance(prog, &specs[i], archs[a], o->list, &n_hit, &n_new);
            if (rc != 0)
                return rc;
        }
    if (o->list)
        printf("%d cached, %d missing\n", n_hit, n_new);
    else
        printf("%d hit%s, %d compiled in %.1f s\n", n_hit, n_hit == 1 ? "" : "s", n_new,
               (now_ms() - t0) / 1e3);
    return ms_cli_stdout_check(prog);
}

#endif /* MS_HAVE_CUDA */

int ms_cli_kernels(int argc, char **argv, const ms_model_desc *desc, const char *prog) {
    kernels_opts o;
    bool help = false;
    int rc = parse_kernels(argc, argv, prog, &o, &help);
    if (help) {
        kernels_usage(stdout, prog);
        return ms_cli_stdout_check(prog);
    }
    if (rc != 0)
        return rc;
#if defined(MS_HAVE_CUDA)
    return run_kernels(desc, &o, prog);
#else
    (void)desc;
    return kfail(prog, 1, "this binary was built without CUDA: there is no NVRTC to compile "
                          "kernels with");
#endif
}
