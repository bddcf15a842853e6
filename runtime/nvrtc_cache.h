/*
 * nvrtc_cache.h - compile kernel instance sources to cubins with NVRTC, with an on-disk cache.
 * (Named nvrtc_cache.h, not nvrtc.h: -Iruntime would shadow the toolkit's <nvrtc.h>.)
 *
 * The templates of templates/ are embedded in the library at build time (scripts/
 * embed-templates.sh) and handed to NVRTC as in-memory headers, so a deployed binary needs no
 * source tree and no toolkit headers. A cubin is cached under a key of (URI, hash of the instance
 * source and of every embedded template it includes, NVRTC version, arch, options) in $MSTAR_CACHE, or
 * ~/.cache/mstar when unset; writes are atomic (temporary file + rename), so concurrent
 * processes never see a partial cubin. MSTAR_CACHE=off disables the cache.
 *
 * A compile error returns MS_ERR_NVRTC whose message names the URI, the generated source written
 * to <cache>/failed/<uri>.cu, its full log (<uri>.log beside it) and the log's first lines.
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

#include "cuda_kernels.h"
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

/*
 * Compile, or find in the cache, every spec for every arch (the work of `mstarc --arch sm_80,sm_90`
 * and the binary's `kernels --arch` verb; the specs of a model from ms_kernel_specs_for_decoder).
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
