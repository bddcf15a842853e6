/*
 * nvrtc_cache.h - compile kernel instance sources to cubins with NVRTC, with an on-disk cache.
 * (Named nvrtc_cache.h, not nvrtc.h: -Iruntime would shadow the toolkit's <nvrtc.h>.)
 *
 * The templates of templates/ are embedded in the library at build time (scripts/
 * embed-templates.sh) and handed to NVRTC as in-memory headers, so a deployed binary needs no
 * source tree and no toolkit headers. A cubin is cached under a key of (URI, hash of the instance
 * source and of every embedded template it includes, NVRTC version, arch, options) in $MSTAR_CACHE, or
 * ~/.cache/mstar when unset; writes are atomic (temporary file + rename), so concurrent
 * processes never see a partial cubin. MSTAR_CACHE=off disables the cache. The source enters the
 * key without its comments and blank lines (they cannot change a cubin), so the commented
 * instance files mstarc writes (DIR/kernels/<stem>.cu after the shape defines) and the runtime's
 * ms_kernel_spec_instance_source share one entry per URI and arch.
 *
 * MSTAR_TEMPLATES_DIR=<dir> (for template development and tests): every embedded template whose
 * file exists under <dir> (same relative name, e.g. <dir>/attn/decode.cuh) is read from there
 * instead, and its text enters the cache key, so an edit recompiles without rebuilding.
 *
 * A compile error returns MS_ERR_NVRTC whose message names the URI, the arch, the path of the
 * source, the full log's path and the log's first lines (on one line); ms_nvrtc_options.log hands
 * the caller the whole log. With ms_nvrtc_options.source_path (mstarc's DIR/kernels/<stem>.cu)
 * the message names that file and nothing is written; otherwise the failing full source (with
 * the shape defines) is written to <cache>/<uri>_sm<arch>.failed.cu and its log to
 * <cache>/<uri>_sm<arch>.failed.log ($TMPDIR/mstar-failed/ when the cache is off). Line
 * numbers in the log count from the "#line 1" after the shape defines, i.e. they are the lines of
 * mstarc's DIR/kernels/<stem>.cu.
 *
 * Ownership: functions borrow their arguments; ms_cubin contents are owned by the struct and
 * released with ms_nvrtc_cubin_free.
 *
 * Usage:
 *     ms_cubin cb = {0};
 *     MS_TRY(ms_nvrtc_compile("attn_decode_bf16_hd128_ps16_g4", src, 90, NULL, &cb, err));
 *     ... cudaLibraryLoadData(&lib, cb.data, ...) ...
 *     ms_nvrtc_cubin_free(&cb);
 */
#ifndef MS_NVRTC_CACHE_H
#define MS_NVRTC_CACHE_H

#include "kernel.h"
#include "ms_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One embedded template header, named as #include spells it ("common/vec.cuh"). */
typedef struct ms_nvrtc_template {
    const char *name;
    const char *text;
} ms_nvrtc_template;

/* The embedded templates (generated file $(BUILD)/gen/ms_templates.c). */
extern const ms_nvrtc_template ms_nvrtc_templates[];
extern const int ms_nvrtc_n_templates;

/* A compiled module. */
typedef struct ms_cubin {
    void *data;      /* [size] ELF cubin bytes (ms_malloc) */
    size_t size;
    bool from_cache; /* true: read from the disk cache, NVRTC not run */
    char *path;      /* cache file (ms_malloc), NULL when the cache is off */
    int arch;        /* sm_XX as XX (80, 90, ...) */
} ms_cubin;

/*
 * Compile `source` (an instance source, see ms_kernel_spec_source) for sm_<arch> and return the
 * cubin, from the cache when a valid entry exists. uri names the instance without the arch
 * ("attn_decode_bf16_hd128_ps16_g4"); cache_dir NULL means $MSTAR_CACHE / ~/.cache/mstar.
 * Errors: MS_ERR_INVALID_ARG (bad arch or uri), MS_ERR_NVRTC (compile error, message as above),
 * MS_ERR_IO (cache folder not writable is NOT an error: the cubin is returned uncached),
 * MS_ERR_OOM.
 */
ms_status ms_nvrtc_compile(const char *uri, const char *source, int arch, const char *cache_dir,
                           ms_cubin *out, ms_error *err);

/* Options of ms_nvrtc_compile_ex (zero-initialise; every field optional). */
typedef struct ms_nvrtc_options {
    const char *cache_dir;   /* NULL: $MSTAR_CACHE / ~/.cache/mstar */
    bool no_cache;           /* neither read nor write the cache (compile check only) */
    const char *source_path; /* where the source text lives (mstarc: DIR/kernels/<stem>.cu):
                                names the NVRTC program and the error; no .failed.cu copy */
    char **log;              /* on MS_ERR_NVRTC from the compiler: NVRTC's whole log
                                (ms_malloc'd, caller frees); NULL otherwise */
} ms_nvrtc_options;

/* ms_nvrtc_compile with options (o NULL: the defaults, as ms_nvrtc_compile). */
ms_status ms_nvrtc_compile_ex(const char *uri, const char *source, int arch,
                              const ms_nvrtc_options *o, ms_cubin *out, ms_error *err);

/*
 * The cache file of (uri, source, arch) into path (cap bytes) and whether it holds a cubin
 * (*hit), without compiling. Errors: MS_ERR_NOT_FOUND when the cache is off, those of the key
 * (bad uri or arch, MSTAR_TEMPLATES_DIR unreadable), MS_ERR_NVRTC (version query).
 */
ms_status ms_nvrtc_cache_probe(const char *uri, const char *source, int arch,
                               const char *cache_dir, char *path, size_t cap, bool *hit,
                               ms_error *err);

/*
 * The 64-bit cache key of (uri, source, arch) as ms_nvrtc_compile computes it: the URI with the
 * arch, the NVRTC version, the options, the source without comments and blank lines, and every
 * template the source includes (MSTAR_TEMPLATES_DIR applied). Errors as ms_nvrtc_cache_probe.
 */
ms_status ms_nvrtc_cache_key(const char *uri, const char *source, int arch, uint64_t *key,
                             ms_error *err);

/* Is sm_<arch> among this NVRTC's real architectures? MS_ERR_UNSUPPORTED names the range. */
ms_status ms_nvrtc_check_arch(int arch, ms_error *err);

/*
 * Compile, or find in the cache, every spec for every arch (the work of `mstarc --arch sm_80,sm_90`
 * and the binary's `kernels --arch` verb; the specs of a model from ms_kernel_specs_for_decoder).
 * Each spec compiles its ms_kernel_spec_instance_source (the text the runtime loads).
 * *n_compiled (may be NULL) counts NVRTC runs, i.e. cache misses. Stops at the first failure:
 * the spec's MS_ERR_UNSUPPORTED, or MS_ERR_NVRTC with the log and the generated source's path.
 */
ms_status ms_nvrtc_precompile(const ms_kernel_spec *specs, int n_specs, const int *archs,
                              int n_archs, const char *cache_dir, int *n_compiled, ms_error *err);

/* Release a cubin's buffers and zero it (NULL or zeroed structs are fine). */
void ms_nvrtc_cubin_free(ms_cubin *c);

/*
 * The cache folder into buf: cache_dir if non-NULL, else $MSTAR_CACHE, else $HOME/.cache/mstar.
 * Returns MS_ERR_NOT_FOUND when the cache is off (MSTAR_CACHE=off) or no folder can be named.
 */
ms_status ms_nvrtc_cache_dir(const char *cache_dir, char *buf, size_t cap, ms_error *err);

/* Parse "sm_90", "sm90", "90" or "compute_90" into 90. MS_ERR_INVALID_ARG names the text. */
ms_status ms_nvrtc_parse_arch(const char *text, int *arch, ms_error *err);

/* NVRTC's version as major * 1000 + minor * 10 (13000 for 13.0), or a failure. */
ms_status ms_nvrtc_version(int *version, ms_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MS_NVRTC_CACHE_H */
