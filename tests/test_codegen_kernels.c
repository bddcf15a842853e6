/*
 * test_codegen_kernels.c - the CUDA kernel instance sources mstarc writes for models/llama.mstar
 * ($MS_BUILD/gen/llama/kernels/<instance>.cu, made by `mstarc build --emit-only` through tests/build.mk):
 *   - the expected set of instances (every variant the model can select from config.json);
 *   - each file name is the runtime's URI (ms_kernel_spec_uri) without the shape parameters, so
 *     the generator's mirrored kernel vocabulary cannot drift from runtime/backends/kernel.c;
 *   - every instance, completed with a checkpoint shape as the runtime does at load (prepended
 *     #defines), compiles with NVRTC for sm_80 and sm_90 (no GPU needed);
 *   - an instance without the shape defines fails with the instance's own #error message;
 *   - models/whisper.mstar's instances (the encoder's dense attention among them) resolve
 *     through ms_kernel_specs_for_stems at Whisper base's shape and compile for sm_80/sm_90.
 * Cubins are cached in $MS_BUILD/codegen-nvrtc-cache, so only changed instances recompile.
 * Built only where the CUDA toolkit is (tests/build.mk).
 */
#include "ms_test.h"
#include "ms_test_impl.h"

#include <dirent.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kernel.h"
#include "nvrtc_cache.h"

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static const char *kernels_dir(void) {
    static char buf[1024];
    const char *b = getenv("MS_BUILD");
    snprintf(buf, sizeof buf, "%s/gen/llama/kernels", b != NULL ? b : "build");
    return buf;
}

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *t = ms_malloc((size_t)n + 1);
    assert_non_null(t);
    assert_int_equal(fread(t, 1, (size_t)n, f), (size_t)n);
    t[n] = '\0';
    fclose(f);
    return t;
}

/* Every structural spec the CUDA backend can request for bf16 storage (float32 activations where
 * the op has a separate activation type), with shape hd 64, ps 16, g 4. */
static int all_specs(ms_kernel_spec *out, int cap) {
    int n = 0;
    for (int w = 0; w < 2; w++) {
        out[n++] = ms_kernel_spec_attn_decode(MS_KERNEL_DTYPE_BF16, 64, 16, 4, w == 1);
        for (int c = 0; c < 2; c++)
            out[n++] = ms_kernel_spec_attn_prefill(MS_KERNEL_DTYPE_BF16, 64, 16, 4, c == 1, w == 1);
    }
    for (int r = 0; r < MS_KERNEL_ROPE_COUNT; r++)
        out[n++] = ms_kernel_spec_rope_kv(MS_KERNEL_DTYPE_BF16, 64, 16, (ms_kernel_rope)r,
                                          MS_KERNEL_ROPE_SCALING_NONE);
    out[n++] = ms_kernel_spec_rmsnorm(MS_KERNEL_DTYPE_BF16, false);
    out[n++] = ms_kernel_spec_rmsnorm(MS_KERNEL_DTYPE_BF16, true);
    out[n++] = ms_kernel_spec_simple(MS_KERNEL_OP_EMBED, MS_KERNEL_DTYPE_BF16);
    out[n++] = ms_kernel_spec_simple(MS_KERNEL_OP_MISC, MS_KERNEL_DTYPE_BF16);
    for (int i = 0; i < n; i++)
        out[i].act_dtype = MS_KERNEL_DTYPE_F32;
    out[n++] = ms_kernel_spec_simple(MS_KERNEL_OP_SILU_MUL, MS_KERNEL_DTYPE_F32);
    out[n++] = ms_kernel_spec_simple(MS_KERNEL_OP_ARGMAX, MS_KERNEL_DTYPE_F32);
    out[n++] = ms_kernel_spec_simple(MS_KERNEL_OP_SAMPLE, MS_KERNEL_DTYPE_F32);
    static const int qt[] = {2, 3, 6, 8, 12, 13, 14}; /* quantized weights: one per ggml type */
    for (int i = 0; i < 7; i++)
        out[n++] = ms_kernel_spec_qmatmul(qt[i]);
    assert_true(n <= cap);
    return n;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void test_llama_kernel_instances(void **state) {
    (void)state;
    static const char *const want[] = {
        "argmax_f32.cu",
        "attn_decode_bf16_af32.cu",
        "attn_decode_bf16_win_af32.cu",
        "attn_prefill_bf16_causal_af32.cu",
        "attn_prefill_bf16_causal_win_af32.cu",
        "embed_bf16_af32.cu",
        "misc_bf16_af32.cu",
        "qmatmul_q4_0_af32.cu",
        "qmatmul_q4_1_af32.cu",
        "qmatmul_q4_k_af32.cu",
        "qmatmul_q5_0_af32.cu",
        "qmatmul_q5_k_af32.cu",
        "qmatmul_q6_k_af32.cu",
        "qmatmul_q8_0_af32.cu",
        "rmsnorm_bf16_af32.cu",
        "rope_kv_bf16_interleaved_af32.cu",
        "rope_kv_bf16_neox_af32.cu",
        "sample_f32.cu",
        "silu_mul_f32.cu",
    };
    DIR *d = opendir(kernels_dir());
    if (d == NULL)
        fail_msg("no generated kernels in %s", kernels_dir());
    const char *names[64];
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        if (strstr(de->d_name, ".cu") != NULL && n < 64)
            names[n++] = ms_strdup(de->d_name);
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_str);
    assert_int_equal(n, (int)MS_ARRAY_LEN(want));
    for (int i = 0; i < n; i++)
        assert_string_equal(names[i], want[i]);

    ms_kernel_spec specs[32];
    int ns = all_specs(specs, 32);
    /* a cache under the build folder: an unchanged instance is compiled once per build folder
       (the key hashes the source and every template, so any change compiles again) */
    char cache[512], failed[600];
    snprintf(cache, sizeof cache, "%s/codegen-nvrtc-cache",
             getenv("MS_BUILD") != NULL ? getenv("MS_BUILD") : "build");
    snprintf(failed, sizeof failed, "%s/failed", cache);
    ms_error err = {0};
    for (int i = 0; i < n; i++) {
        /* the runtime's spec whose URI minus the shape is this file's name */
        const ms_kernel_spec *s = NULL;
        char uri[MS_KERNEL_URI_MAX], stem[MS_KERNEL_URI_MAX];
        snprintf(stem, sizeof stem, "%s", names[i]);
        stem[strlen(stem) - 3] = '\0';
        for (int k = 0; k < ns && s == NULL; k++) {
            assert_int_equal(ms_kernel_spec_stem(&specs[k], uri, sizeof uri, &err), MS_OK);
            if (strcmp(uri, stem) == 0)
                s = &specs[k];
        }
        if (s == NULL)
            fail_msg("%s is not the stem of any runtime kernel spec", names[i]);
        assert_int_equal(ms_kernel_spec_uri(s, 0, uri, sizeof uri, &err), MS_OK);
        char path[1200];
        snprintf(path, sizeof path, "%s/%s", kernels_dir(), names[i]);
        char *text = read_text(path);
        assert_non_null(strstr(text, "generated by mstarc from models/llama.mstar"));
        /* after its banner and shape guard, the file is the runtime's own instance text */
        char *body = NULL;
        assert_int_equal(ms_kernel_spec_body(s, true, &body, &err), MS_OK);
        const char *inc = strstr(text, "#include \"");
        assert_non_null(inc);
        if (strcmp(inc, body) != 0)
            fail_msg("%s: body differs from ms_kernel_spec_body:\n%s\n---\n%s", names[i], inc, body);
        ms_free(body);
        char *src = ms_asprintf("#define MS_HEAD_DIM 64\n#define MS_PAGE_SIZE 16\n"
                                "#define MS_GROUP 4\n%s", text);
        assert_non_null(src);
        for (int a = 0; a < 2; a++) {
            ms_cubin cb = {0};
            ms_status st = ms_nvrtc_compile(uri, src, a == 0 ? 80 : 90, cache, &cb, &err);
            if (st != MS_OK)
                fail_msg("%s (sm_%d): %s", names[i], a == 0 ? 80 : 90, err.msg);
            assert_true(cb.size > 0);
            ms_nvrtc_cubin_free(&cb);
        }
        /* without the shape the instance names what it misses */
        if (strstr(text, "MS_HEAD_DIM") != NULL && strstr(names[i], "attn_decode_bf16_win_af32")) {
            ms_cubin cb = {0};
            assert_int_equal(ms_nvrtc_compile("codegen_no_shape", text, 90, cache, &cb, &err),
                             MS_ERR_NVRTC);
            assert_non_null(strstr(err.msg, "needs MS_HEAD_DIM"));
        }
        ms_free(src);
        ms_free(text);
        ms_free((void *)names[i]);
    }
    nftw(failed, rm_entry, 16, FTW_DEPTH | FTW_PHYS); /* the deliberate #error above */
}

/* models/whisper.mstar ($MS_BUILD/gen/whisper/kernels): every emitted instance (the encoder's
 * dense attention among them) resolves through ms_kernel_specs_for_stems at Whisper base's shape
 * (8 heads of 64, MHA, page size 16, no RoPE), as the runtime loads it, and compiles with NVRTC
 * for sm_80 and sm_90 behind that spec's own shape defines. */
static void test_whisper_kernel_instances(void **state) {
    (void)state;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/gen/whisper/kernels",
             getenv("MS_BUILD") != NULL ? getenv("MS_BUILD") : "build");
    DIR *d = opendir(dir);
    if (d == NULL)
        fail_msg("no generated kernels in %s", dir);
    const char *stems[32];
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        size_t len = strlen(de->d_name);
        if (len > 3 && strcmp(de->d_name + len - 3, ".cu") == 0 && n < 32) {
            char *st = ms_strdup(de->d_name);
            assert_non_null(st);
            st[len - 3] = '\0';
            stems[n++] = st;
        }
    }
    closedir(d);
    qsort(stems, (size_t)n, sizeof *stems, cmp_str);
    bool dense = false;
    for (int i = 0; i < n; i++)
        dense = dense || strcmp(stems[i], "attn_dense_f32") == 0;
    assert_true(dense); /* the encoder's attention over its own rows */
    ms_kernel_model_shape sh = {.head_dim = 64, .n_q_heads = 8, .n_kv_heads = 8, .page_size = 16,
                                .rope = MS_KERNEL_ROPE_NONE, .windowed = false,
                                .weight_dtype = MS_KERNEL_DTYPE_BF16,
                                .kv_dtype = MS_KERNEL_DTYPE_BF16};
    ms_kernel_spec specs[32];
    int ns = 0;
    ms_error err = {0};
    if (ms_kernel_specs_for_stems(&sh, stems, n, specs, 32, &ns, &err) != MS_OK)
        fail_msg("specs for whisper's stems: %s", err.msg);
    assert_int_equal(ns, n); /* every emitted stem is a loadable instance */
    char cache[512], failed[600];
    snprintf(cache, sizeof cache, "%s/codegen-nvrtc-cache",
             getenv("MS_BUILD") != NULL ? getenv("MS_BUILD") : "build");
    snprintf(failed, sizeof failed, "%s/failed", cache);
    for (int i = 0; i < ns; i++) {
        char stem[MS_KERNEL_URI_MAX], uri[MS_KERNEL_URI_MAX], defs[256], path[1200];
        assert_int_equal(ms_kernel_spec_stem(&specs[i], stem, sizeof stem, &err), MS_OK);
        assert_int_equal(ms_kernel_spec_uri(&specs[i], 0, uri, sizeof uri, &err), MS_OK);
        assert_int_equal(ms_kernel_spec_shape_defines(&specs[i], defs, sizeof defs, &err), MS_OK);
        snprintf(path, sizeof path, "%s/%s.cu", dir, stem);
        char *text = read_text(path);
        assert_non_null(strstr(text, "generated by mstarc from models/whisper.mstar"));
        char *src = ms_asprintf("%s%s", defs, text);
        assert_non_null(src);
        for (int a = 0; a < 2; a++) {
            ms_cubin cb = {0};
            if (ms_nvrtc_compile(uri, src, a == 0 ? 80 : 90, cache, &cb, &err) != MS_OK)
                fail_msg("%s (sm_%d): %s", stem, a == 0 ? 80 : 90, err.msg);
            assert_true(cb.size > 0);
            ms_nvrtc_cubin_free(&cb);
        }
        printf("    whisper %s.cu: %s compiles for sm_80 and sm_90\n", stem, uri);
        ms_free(src);
        ms_free(text);
    }
    for (int i = 0; i < n; i++)
        ms_free((void *)stems[i]);
    nftw(failed, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_llama_kernel_instances),
        ms_unit_test(test_whisper_kernel_instances),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
