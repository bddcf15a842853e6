/*
 * test_nvrtc.c - kernel specs, URIs, instance sources, attention planning and NVRTC compilation
 * with the cubin cache. Runs in CI without a GPU (NVRTC needs none).
 *
 * The instance matrix test compiles, for sm_90, every kernel instance the Llama family needs
 * (and for sm_80 one instance of each stem, see plan_jobs): attention decode and prefill for head_dim 16/64/128 x page size 16/128 x GQA 1/4/8 x
 * windowed or not, plus the repository fixtures' own shapes (head_dim 16 and 32, GQA 2), RoPE+KV
 * write for both styles with and without llama3 scaling, the M-RoPE variant (Qwen2-VL) and the
 * per-head RMSNorm (Qwen3 q_norm / k_norm, head_dim 48/64/128), the quantized matmuls (qmatmul:
 * GEMV and dequantization for each ggml type kept quantized on the GPU), and the norm, activation,
 * embedding, elementwise, argmax and sampling kernels, all with float32 activations over bf16
 * weights and KV (the CUDA backend's choice), and with bf16 activations for the shapes of
 * test_gpu_kernels, each as the runtime compiles it (ms_kernel_spec_instance_source). It compiles
 * into a persistent cache (build/kernel-cache-test, or
 * $MS_KERNEL_CACHE_TEST), keyed by the source and template hashes, so only the first run after a
 * template change pays for NVRTC; a cache hit still proves that NVRTC compiled exactly this
 * source for this arch. Two threads share the work (NVRTC programs are independent).
 *
 * Precompiling (mstarc build --arch --config, the binary's `kernels` verb) rests on the text
 * mstarc compiles (the shape defines + the emitted DIR/kernels/<stem>.cu) having the runtime's
 * cache key: test_emitted_instances_share_the_runtime_cache_key checks it for every instance of
 * models/llama.mstar, models/qwen3.mstar and models/qwen2vl.mstar (M-RoPE) at several shapes,
 * without running NVRTC.
 */
#include "ms_test.h"

#include <ftw.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend_cuda.h"
#include "cuda_check.h"
#include "kernel.h"
#include "nvrtc_cache.h"

#include "codegen.h"
#include "mstarc.h"

#include "ms_test_impl.h"

/* ---- helpers ---- */

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void rm_tree(const char *dir) { nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }

static void make_temp_dir(char *buf, size_t cap) {
    const char *t = getenv("TMPDIR");
    snprintf(buf, cap, "%s/ms_nvrtc_XXXXXX", t != NULL ? t : "/tmp");
    assert_non_null(mkdtemp(buf));
}

static bool has_bytes(const void *hay, size_t n, const char *needle) {
    return memmem(hay, n, needle, strlen(needle)) != NULL;
}

/* ---- specs and URIs ---- */

static void test_uri_names_every_parameter(void **state) {
    (void)state;
    char uri[MS_KERNEL_URI_MAX];
    ms_error err = {0};
    ms_kernel_spec s = ms_kernel_spec_attn_decode(MS_KERNEL_DTYPE_BF16, 128, 16, 4, false);
    assert_int_equal(ms_kernel_spec_uri(&s, 90, uri, sizeof uri, &err), MS_OK);
    assert_string_equal(uri, "attn_decode_bf16_hd128_ps16_g4_sm90");
    s = ms_kernel_spec_attn_prefill(MS_KERNEL_DTYPE_F16, 64, 128, 8, true, true);
    assert_int_equal(ms_kernel_spec_uri(&s, 80, uri, sizeof uri, &err), MS_OK);
    assert_string_equal(uri, "attn_prefill_f16_hd64_ps128_g8_causal_win_sm80");
    s = ms_kernel_spec_rope_kv(MS_KERNEL_DTYPE_BF16, 128, 16, MS_KERNEL_ROPE_NEOX,
                               MS_KERNEL_ROPE_SCALING_LLAMA3);
    assert_int_equal(ms_kernel_spec_uri(&s, 90, uri, sizeof uri, &err), MS_OK);
    assert_string_equal(uri, "rope_kv_bf16_hd128_ps16_neox_llama3_sm90");
    s = ms_kernel_spec_rope_kv(MS_KERNEL_DTYPE_BF16, 16, 4, MS_KERNEL_ROPE_INTERLEAVED,
                               MS_KERNEL_ROPE_SCALING_NONE);
    assert_int_equal(ms_kernel_spec_uri(&s, 0, uri, sizeof uri, &err), MS_OK);
    assert_string_equal(uri, "rope_kv_bf16_hd16_ps4_interleaved");
    s = ms_kernel_spec_rmsnorm(MS_KERNEL_DTYPE_BF16, true);
    assert_int_equal(ms_kernel_spec_uri(&s, 90, uri, sizeof uri, &err), MS_OK);
    assert_string_equal(uri, "rmsnorm_bf16_res_sm90");
    s = ms_kernel_spec_simple(MS_KERNEL_OP_SAMPLE, MS_KERNEL_DTYPE_F32);
    assert_int_equal(ms_kernel_spec_uri(&s, 90, uri, sizeof uri, &err), MS_OK);
    assert_string_equal(uri, "sample_f32_sm90");
    /* too small a buffer is an error, not a truncated key */
    char small[8];
    assert_int_equal(ms_kernel_spec_uri(&s, 90, small, sizeof small, &err), MS_ERR_INVALID_ARG);
}

static void test_unsupported_specs_name_the_value(void **state) {
    (void)state;
    ms_error err = {0};
    ms_kernel_spec s = ms_kernel_spec_attn_decode(MS_KERNEL_DTYPE_BF16, 44, 16, 4, false);
    assert_int_equal(ms_kernel_spec_check(&s, &err), MS_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "head_dim 44"));
    s = ms_kernel_spec_attn_decode(MS_KERNEL_DTYPE_BF16, 48, 16, 4, false); /* Qwen3-style */
    assert_int_equal(ms_kernel_spec_check(&s, &err), MS_OK);
    s = ms_kernel_spec_attn_decode(MS_KERNEL_DTYPE_BF16, 264, 16, 4, false);
    assert_int_equal(ms_kernel_spec_check(&s, &err), MS_ERR_UNSUPPORTED);
    s = ms_kernel_spec_attn_prefill(MS_KERNEL_DTYPE_BF16, 48, 16, 4, true, false);
    assert_int_equal(ms_kernel_spec_check(&s, &err), MS_OK); /* prefill takes multiples of 16 */
    s = ms_kernel_spec_attn_prefill(MS_KERNEL_DTYPE_BF16, 40, 16, 4, true, false);
    assert_int_equal(ms_kernel_spec_check(&s, &err), MS_ERR_UNSUPPORTED);
    s = ms_kernel_spec_attn_decode(MS_KERNEL_DTYPE_BF16, 128, 16, 17, false);
    assert_int_equal(ms_kernel_spec_check(&s, &err), MS_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "group 17"));
    s = ms_kernel_spec_attn_decode(MS_KERNEL_DTYPE_BF16, 128, 0, 4, false);
    assert_int_equal(ms_kernel_spec_check(&s, &err), MS_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "page_size 0"));
    s = ms_kernel_spec_attn_decode(MS_KERNEL_DTYPE_F32, 128, 16, 4, false); /* f32 KV */
    assert_int_equal(ms_kernel_spec_check(&s, &err), MS_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "dtype f32"));
    s = ms_kernel_spec_rmsnorm(MS_KERNEL_DTYPE_F32, false); /* f32 weights are fine */
    assert_int_equal(ms_kernel_spec_check(&s, &err), MS_OK);
    s = ms_kernel_spec_simple(MS_KERNEL_OP_ARGMAX, MS_KERNEL_DTYPE_F32);
    s.act_dtype = MS_KERNEL_DTYPE_BF16; /* single-dtype ops */
    assert_int_equal(ms_kernel_spec_check(&s, &err), MS_ERR_INVALID_ARG);
    s = ms_kernel_spec_simple((ms_kernel_op)99, MS_KERNEL_DTYPE_BF16);
    assert_int_equal(ms_kernel_spec_check(&s, &err), MS_ERR_INVALID_ARG);
    char *src = (char *)1;
    s = ms_kernel_spec_attn_decode(MS_KERNEL_DTYPE_BF16, 44, 16, 4, false);
    assert_int_equal(ms_kernel_spec_source(&s, &src, &err), MS_ERR_UNSUPPORTED);
    assert_null(src);
}

static void test_source_is_preamble_and_wrappers_only(void **state) {
    (void)state;
    ms_error err = {0};
    ms_kernel_spec s = ms_kernel_spec_attn_decode(MS_KERNEL_DTYPE_BF16, 128, 16, 4, true);
    char *a = NULL, *b = NULL;
    assert_int_equal(ms_kernel_spec_source(&s, &a, &err), MS_OK);
    assert_int_equal(ms_kernel_spec_source(&s, &b, &err), MS_OK);
    assert_string_equal(a, b); /* deterministic */
    assert_non_null(strstr(a, "Do not edit"));
    assert_non_null(strstr(a, "#include \"attn/decode.cuh\""));
    assert_non_null(strstr(a, "using T = ms::bf16;"));
    assert_non_null(strstr(a, "constexpr int kHeadDim = 128;"));
    assert_non_null(strstr(a, "constexpr int kPageSize = 16;"));
    assert_non_null(strstr(a, "constexpr int kGroup = 4;"));
    assert_non_null(strstr(a, "constexpr bool kWindowed = true;"));
    assert_non_null(strstr(a, "extern \"C\" __global__"));
    assert_non_null(strstr(a, ms_kernel_op_entry(MS_KERNEL_OP_ATTN_DECODE, 0)));
    assert_null(ms_kernel_op_entry(MS_KERNEL_OP_ATTN_DECODE, 1)); /* splits merge in-kernel */
    assert_null(strstr(a, "__syncthreads")); /* no pasted kernel body */
    ms_free(a);
    ms_free(b);
    /* every op has a main entry; the entry list ends */
    for (int op = 0; op < MS_KERNEL_OP_COUNT; op++)
        assert_non_null(ms_kernel_op_entry((ms_kernel_op)op, 0));
    assert_null(ms_kernel_op_entry(MS_KERNEL_OP_ATTN_PREFILL, 1));
    assert_non_null(ms_kernel_op_entry(MS_KERNEL_OP_MISC, 2));
    assert_null(ms_kernel_op_entry(MS_KERNEL_OP_MISC, MS_KERNEL_MAX_ENTRIES));
    /* float32 activations show in the URI and the preamble */
    s.act_dtype = MS_KERNEL_DTYPE_F32;
    char uri[MS_KERNEL_URI_MAX];
    assert_int_equal(ms_kernel_spec_uri(&s, 90, uri, sizeof uri, &err), MS_OK);
    assert_string_equal(uri, "attn_decode_bf16_hd128_ps16_g4_win_af32_sm90");
    assert_int_equal(ms_kernel_spec_source(&s, &a, &err), MS_OK);
    assert_non_null(strstr(a, "using TA = float;"));
    ms_free(a);
    assert_null(ms_kernel_op_entry(MS_KERNEL_OP_COUNT, 0));
}

/* ---- attention planning ---- */

static void test_prefill_tiles_cover_ragged_batch(void **state) {
    (void)state;
    ms_error err = {0};
    /* 37, 5, 64, 1 tokens with group 4: rows 148, 20, 256, 4 -> 3, 1, 4, 1 tiles of 64 rows */
    const int32_t qo[] = {0, 37, 42, 106, 107};
    int32_t req[16], idx[16];
    int n = -1;
    assert_int_equal(ms_kernel_attn_prefill_tiles(qo, 4, 4, req, idx, 16, &n, &err), MS_OK);
    assert_int_equal(n, 9);
    const int32_t want_req[] = {0, 0, 0, 1, 2, 2, 2, 2, 3};
    const int32_t want_idx[] = {0, 1, 2, 0, 0, 1, 2, 3, 0};
    for (int i = 0; i < 9; i++) {
        assert_int_equal(req[i], want_req[i]);
        assert_int_equal(idx[i], want_idx[i]);
    }
    assert_int_equal(ms_kernel_attn_prefill_tiles(qo, 4, 4, NULL, NULL, 100, &n, &err), MS_OK);
    assert_int_equal(n, 9);
    assert_int_equal(ms_kernel_attn_prefill_tiles(qo, 4, 4, req, idx, 8, &n, &err), MS_ERR_CAPACITY);
    const int32_t bad[] = {0, 5, 3};
    assert_int_equal(ms_kernel_attn_prefill_tiles(bad, 2, 1, req, idx, 16, &n, &err),
                     MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "request 1"));
    /* an empty request (span 0) gets no tile */
    const int32_t empty[] = {0, 0, 1};
    assert_int_equal(ms_kernel_attn_prefill_tiles(empty, 2, 8, req, idx, 16, &n, &err), MS_OK);
    assert_int_equal(n, 1);
    assert_int_equal(req[0], 1);
}

static void test_decode_split_fills_device_and_covers_pages(void **state) {
    (void)state;
    int s = 0, pps = 0;
    /* 1 sequence x 8 KV heads x 8k tokens in pages of 16 = 512 pages, 132 SMs x 3 CTAs */
    ms_kernel_attn_decode_split(1, 8, 512, 396, 4, 64, &s, &pps);
    assert_true(s > 1 && s <= 64);
    assert_true(s * pps >= 512 && (s - 1) * pps < 512);
    assert_true(8 * s >= 132);
    assert_true(8 * s <= 396); /* one wave */
    /* the partial buffers cap the split */
    ms_kernel_attn_decode_split(1, 1, 4096, 396, 4, 64, &s, &pps);
    assert_int_equal(s, 64);
    assert_int_equal(pps, 64);
    /* a batch with more (request, KV head) pairs than slots needs no split */
    ms_kernel_attn_decode_split(128, 8, 64, 396, 4, 64, &s, &pps);
    assert_int_equal(s, 1);
    assert_int_equal(pps, 64);
    /* short views are not split below min_pages */
    ms_kernel_attn_decode_split(1, 1, 6, 132, 4, 64, &s, &pps);
    assert_int_equal(s, 1);
    assert_int_equal(pps, 6);
    /* zero pages still yields one split of one page */
    ms_kernel_attn_decode_split(1, 1, 0, 132, 4, 64, &s, &pps);
    assert_int_equal(s, 1);
    assert_true(pps >= 1);
}

static void test_decoder_instances(void **state) {
    (void)state;
    ms_error err = {0};
    ms_kernel_model_shape sh = {128, 32, 8, 16, MS_KERNEL_ROPE_NEOX, false, MS_KERNEL_DTYPE_BF16,
                                MS_KERNEL_DTYPE_BF16};
    ms_kernel_spec sp[16];
    int n = 0;
    assert_int_equal(ms_kernel_specs_for_decoder(&sh, sp, 16, &n, &err), MS_OK);
    assert_int_equal(n, 9);
    char uri[MS_KERNEL_URI_MAX];
    /* one RoPE + KV write instance, in the model's style; NONE for a model without RoPE */
    int n_rope = 0;
    for (int i = 0; i < n; i++)
        if (sp[i].op == MS_KERNEL_OP_ROPE_KV) {
            n_rope++;
            assert_int_equal(sp[i].rope, MS_KERNEL_ROPE_NEOX);
        }
    assert_int_equal(n_rope, 1);
    sh.rope = MS_KERNEL_ROPE_NONE;
    assert_int_equal(ms_kernel_specs_for_decoder(&sh, sp, 16, &n, &err), MS_OK);
    assert_int_equal(n, 9);
    assert_int_equal(sp[2].op, MS_KERNEL_OP_ROPE_KV);
    assert_int_equal(ms_kernel_spec_uri(&sp[2], 0, uri, sizeof uri, &err), MS_OK);
    assert_string_equal(uri, "rope_kv_bf16_hd128_ps16_none_af32");
    sh.rope = MS_KERNEL_ROPE_NEOX;
    assert_int_equal(ms_kernel_spec_uri(&sp[0], 90, uri, sizeof uri, &err), MS_OK);
    assert_string_equal(uri, "attn_decode_bf16_hd128_ps16_g4_af32_sm90");
    assert_int_equal(ms_kernel_spec_uri(&sp[1], 90, uri, sizeof uri, &err), MS_OK);
    assert_string_equal(uri, "attn_prefill_bf16_hd128_ps16_g4_causal_af32_sm90");
    assert_int_equal(ms_kernel_specs_for_decoder(&sh, sp, 5, &n, &err), MS_ERR_CAPACITY);
    sh.n_q_heads = 30; /* not a multiple of 8 */
    assert_int_equal(ms_kernel_specs_for_decoder(&sh, sp, 16, &n, &err), MS_ERR_INVALID_ARG);
    sh.n_q_heads = 32;
    sh.head_dim = 48; /* Qwen3: both attention kernels */
    assert_int_equal(ms_kernel_specs_for_decoder(&sh, sp, 16, &n, &err), MS_OK);
    assert_int_equal(sp[0].op, MS_KERNEL_OP_ATTN_DECODE);
    assert_int_equal(sp[0].head_dim, 48);
    sh.head_dim = 40; /* decode takes multiples of 8, prefill multiples of 16 */
    assert_int_equal(ms_kernel_specs_for_decoder(&sh, sp, 16, &n, &err), MS_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "head_dim 40"));
}

static void test_variant_specs_uris_and_sources(void **state) {
    (void)state;
    ms_error err = {0};
    char uri[MS_KERNEL_URI_MAX];
    /* M-RoPE: a rope_kv variant with its own URI; plain rope_kv sources do not change */
    ms_kernel_spec s = ms_kernel_spec_rope_kv_mrope(MS_KERNEL_DTYPE_BF16, 32, 16,
                                                    MS_KERNEL_ROPE_NEOX);
    s.act_dtype = MS_KERNEL_DTYPE_F32;
    assert_int_equal(ms_kernel_spec_uri(&s, 90, uri, sizeof uri, &err), MS_OK);
    assert_string_equal(uri, "rope_kv_bf16_hd32_ps16_neox_mrope_af32_sm90");
    assert_int_equal(ms_kernel_spec_stem(&s, uri, sizeof uri, &err), MS_OK);
    assert_string_equal(uri, "rope_kv_bf16_neox_mrope_af32");
    char *src = NULL;
    assert_int_equal(ms_kernel_spec_source(&s, &src, &err), MS_OK);
    assert_non_null(strstr(src, "constexpr bool kMrope = true;"));
    assert_non_null(strstr(src, "cfg::kRopeScaling, cfg::kMrope>(p);"));
    ms_free(src);
    s = ms_kernel_spec_rope_kv(MS_KERNEL_DTYPE_BF16, 32, 16, MS_KERNEL_ROPE_NEOX,
                               MS_KERNEL_ROPE_SCALING_NONE);
    assert_int_equal(ms_kernel_spec_source(&s, &src, &err), MS_OK);
    assert_null(strstr(src, "kMrope"));
    ms_free(src);
    s = ms_kernel_spec_rope_kv_mrope(MS_KERNEL_DTYPE_BF16, 32, 16, MS_KERNEL_ROPE_NONE);
    assert_int_equal(ms_kernel_spec_check(&s, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "M-RoPE"));
    s = ms_kernel_spec_attn_prefill(MS_KERNEL_DTYPE_BF16, 64, 16, 4, true, false);
    s.mrope = true;
    assert_int_equal(ms_kernel_spec_check(&s, &err), MS_ERR_INVALID_ARG);
    /* per-head RMSNorm: shaped by head_dim (a macro in mstarc's per-model sources) */
    s = ms_kernel_spec_rmsnorm_heads(MS_KERNEL_DTYPE_BF16, 48);
    s.act_dtype = MS_KERNEL_DTYPE_F32;
    assert_int_equal(ms_kernel_spec_uri(&s, 80, uri, sizeof uri, &err), MS_OK);
    assert_string_equal(uri, "rmsnorm_heads_bf16_hd48_af32_sm80");
    assert_int_equal(ms_kernel_spec_stem(&s, uri, sizeof uri, &err), MS_OK);
    assert_string_equal(uri, "rmsnorm_heads_bf16_af32"); /* head_dim is shape, not structure */
    assert_int_equal(ms_kernel_spec_source(&s, &src, &err), MS_OK);
    assert_non_null(strstr(src, "#include \"norm/rmsnorm.cuh\""));
    assert_non_null(strstr(src, "constexpr int kHeadDim = 48;"));
    assert_non_null(strstr(src, "ms::rmsnorm_heads<cfg::TA, cfg::T, cfg::kHeadDim>(p);"));
    ms_free(src);
    assert_int_equal(ms_kernel_spec_body(&s, true, &src, &err), MS_OK);
    assert_non_null(strstr(src, "constexpr int kHeadDim = MS_HEAD_DIM;"));
    ms_free(src);
    char defines[256];
    assert_int_equal(ms_kernel_spec_shape_defines(&s, defines, sizeof defines, &err), MS_OK);
    assert_string_equal(defines, "#define MS_HEAD_DIM 48\n#line 1\n");
    assert_int_equal(ms_kernel_spec_instance_source(&s, &src, &err), MS_OK);
    assert_true(strncmp(src, "#define MS_HEAD_DIM 48\n#line 1\n", 31) == 0);
    assert_non_null(strstr(src, "#if !defined(MS_HEAD_DIM)\n#error \"rmsnorm_heads_bf16_af32 needs "
                                "MS_HEAD_DIM (defined by the runtime at load)\"\n#endif\n"));
    assert_null(strstr(src, "MS_PAGE_SIZE"));
    assert_non_null(strstr(src, "constexpr int kHeadDim = MS_HEAD_DIM;"));
    ms_free(src);
    assert_int_equal(ms_kernel_op_shape(MS_KERNEL_OP_RMSNORM_HEADS), MS_KERNEL_SHAPE_HEAD_DIM);
    assert_int_equal(ms_kernel_op_shape(MS_KERNEL_OP_ROPE_KV), MS_KERNEL_SHAPE_PAGED);
    assert_int_equal(ms_kernel_op_shape(MS_KERNEL_OP_ATTN_DECODE), MS_KERNEL_SHAPE_GROUPED);
    assert_int_equal(ms_kernel_op_shape(MS_KERNEL_OP_RMSNORM), MS_KERNEL_SHAPE_NONE);
    s = ms_kernel_spec_rmsnorm_heads(MS_KERNEL_DTYPE_F32, 128); /* f32 weights are fine */
    assert_int_equal(ms_kernel_spec_check(&s, &err), MS_OK);
    s = ms_kernel_spec_rmsnorm_heads(MS_KERNEL_DTYPE_BF16, 0);
    assert_int_equal(ms_kernel_spec_check(&s, &err), MS_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "head_dim 0"));
    /* the variants of a decoder: Qwen3 (q/k norm, head_dim 48) and Qwen2-VL (M-RoPE) */
    ms_kernel_model_shape q3 = {48, 4, 2, 16, MS_KERNEL_ROPE_NEOX, false, MS_KERNEL_DTYPE_BF16,
                                MS_KERNEL_DTYPE_BF16};
    ms_kernel_spec sp[16];
    int n = 0;
    assert_int_equal(ms_kernel_specs_for_decoder_variant(&q3, true, false, sp, 16, &n, &err), MS_OK);
    assert_int_equal(n, 10); /* Llama's 9 + the per-head norm */
    bool heads = false, mrope = false;
    for (int i = 0; i < n; i++) {
        assert_int_equal(ms_kernel_spec_uri(&sp[i], 0, uri, sizeof uri, &err), MS_OK);
        heads = heads || strcmp(uri, "rmsnorm_heads_bf16_hd48_af32") == 0;
    }
    assert_true(heads);
    ms_kernel_model_shape vl = {32, 4, 2, 16, MS_KERNEL_ROPE_NEOX, false, MS_KERNEL_DTYPE_BF16,
                                MS_KERNEL_DTYPE_BF16};
    assert_int_equal(ms_kernel_specs_for_decoder_variant(&vl, false, true, sp, 16, &n, &err), MS_OK);
    assert_int_equal(n, 9); /* M-RoPE replaces the RoPE instance */
    for (int i = 0; i < n; i++) {
        assert_int_equal(ms_kernel_spec_uri(&sp[i], 0, uri, sizeof uri, &err), MS_OK);
        mrope = mrope || strcmp(uri, "rope_kv_bf16_hd32_ps16_neox_mrope_af32") == 0;
        assert_null(strstr(uri, "_neox_af32")); /* the plain rope_kv is replaced */
    }
    assert_true(mrope);
}

/* The instances of a model are its emitted stems at the checkpoint's shape
 * (ms_kernel_specs_for_stems): nothing the model does not list (no residual RMSNorm without
 * one, no rmsnorm_heads without q/k norms), the variant the shape takes (unwindowed attention),
 * M-RoPE when the stem says so; counted failures for bad heads and capacity. */
static bool has_uri(const ms_kernel_spec *sp, int n, const char *want) {
    for (int i = 0; i < n; i++) {
        char uri[MS_KERNEL_URI_MAX];
        ms_error err = {0};
        assert_int_equal(ms_kernel_spec_uri(&sp[i], 0, uri, sizeof uri, &err), MS_OK);
        if (strcmp(uri, want) == 0)
            return true;
    }
    return false;
}

static void test_instances_from_emitted_stems(void **state) {
    (void)state;
    ms_error err = {0};
    /* models/qwen3.mstar's list (windowed variants for use_sliding_window) at hf/qwen3 */
    static const char *const q3_stems[] = {
        "embed_bf16_af32", "rmsnorm_bf16_af32", "rmsnorm_bf16_res_af32",
        "rmsnorm_heads_bf16_af32", "rope_kv_bf16_neox_af32", "attn_decode_bf16_win_af32",
        "attn_prefill_bf16_causal_win_af32", "attn_decode_bf16_af32",
        "attn_prefill_bf16_causal_af32", "silu_mul_f32", "misc_bf16_af32", "argmax_f32",
        "sample_f32"};
    ms_kernel_model_shape q3 = {48, 4, 2, 16, MS_KERNEL_ROPE_NEOX, false, MS_KERNEL_DTYPE_BF16,
                                MS_KERNEL_DTYPE_BF16};
    ms_kernel_spec sp[16];
    int n = 0;
    assert_int_equal(ms_kernel_specs_for_stems(&q3, q3_stems, 13, sp, 16, &n, &err), MS_OK);
    assert_int_equal(n, 11);
    assert_true(has_uri(sp, n, "rmsnorm_heads_bf16_hd48_af32"));
    assert_true(has_uri(sp, n, "attn_prefill_bf16_hd48_ps16_g2_causal_af32"));
    assert_false(has_uri(sp, n, "attn_decode_bf16_hd48_ps16_g2_win_af32"));
    q3.windowed = true;
    assert_int_equal(ms_kernel_specs_for_stems(&q3, q3_stems, 13, sp, 16, &n, &err), MS_OK);
    assert_int_equal(n, 11);
    assert_true(has_uri(sp, n, "attn_decode_bf16_hd48_ps16_g2_win_af32"));
    /* tests/codegen/plain.mstar: no RoPE, no residual RMSNorm, no per-head norm */
    static const char *const plain_stems[] = {
        "embed_bf16_af32", "rmsnorm_bf16_af32", "rope_kv_bf16_none_af32", "attn_decode_bf16_af32",
        "attn_prefill_bf16_causal_af32", "silu_mul_f32", "misc_bf16_af32", "argmax_f32",
        "sample_f32"};
    ms_kernel_model_shape pl = {16, 4, 4, 32, MS_KERNEL_ROPE_NONE, false, MS_KERNEL_DTYPE_BF16,
                                MS_KERNEL_DTYPE_BF16};
    assert_int_equal(ms_kernel_specs_for_stems(&pl, plain_stems, 9, sp, 16, &n, &err), MS_OK);
    assert_int_equal(n, 9);
    assert_false(has_uri(sp, n, "rmsnorm_bf16_res_af32"));
    assert_true(has_uri(sp, n, "rope_kv_bf16_hd16_ps32_none_af32"));
    /* an M-RoPE model's stem takes the M-RoPE RoPE + KV write, not the plain one */
    static const char *const vl_stems[] = {"rope_kv_bf16_neox_mrope_af32", "sample_f32"};
    ms_kernel_model_shape vl = {32, 4, 2, 16, MS_KERNEL_ROPE_NEOX, false, MS_KERNEL_DTYPE_BF16,
                                MS_KERNEL_DTYPE_BF16};
    assert_int_equal(ms_kernel_specs_for_stems(&vl, vl_stems, 2, sp, 16, &n, &err), MS_OK);
    assert_int_equal(n, 2);
    assert_true(has_uri(sp, n, "rope_kv_bf16_hd32_ps16_neox_mrope_af32"));
    /* a stem no variant of this shape has: nothing (interleaved RoPE of a rotate-half model) */
    static const char *const other[] = {"rope_kv_bf16_interleaved_af32"};
    assert_int_equal(ms_kernel_specs_for_stems(&vl, other, 1, sp, 16, &n, &err), MS_OK);
    assert_int_equal(n, 0);
    /* errors */
    assert_int_equal(ms_kernel_specs_for_stems(&q3, q3_stems, 13, sp, 5, &n, &err),
                     MS_ERR_CAPACITY);
    q3.n_q_heads = 5;
    assert_int_equal(ms_kernel_specs_for_stems(&q3, q3_stems, 13, sp, 16, &n, &err),
                     MS_ERR_INVALID_ARG);
    assert_int_equal(n, 0);
}

static void test_precompile_a_model_for_two_archs(void **state) {
    (void)state;
    ms_error err = {0};
    ms_kernel_model_shape sh = {16, 8, 2, 16, MS_KERNEL_ROPE_NEOX, false, MS_KERNEL_DTYPE_BF16,
                                MS_KERNEL_DTYPE_BF16}; /* llama_gqa */
    ms_kernel_spec sp[16];
    int n = 0, compiled = -1;
    assert_int_equal(ms_kernel_specs_for_decoder(&sh, sp, 16, &n, &err), MS_OK);
    const int archs[2] = {80, 90};
    const char *c = getenv("MS_KERNEL_CACHE_TEST");
    const char *cache = c != NULL && c[0] != '\0' ? c : "build/kernel-cache-test";
    assert_int_equal(ms_nvrtc_precompile(sp, n, archs, 2, cache, &compiled, &err), MS_OK);
    assert_true(compiled >= 0 && compiled <= 2 * n);
    /* everything is in the cache now */
    assert_int_equal(ms_nvrtc_precompile(sp, n, archs, 2, cache, &compiled, &err), MS_OK);
    assert_int_equal(compiled, 0);
    /* an unsupported spec stops it with the spec's error */
    sp[0].head_dim = 44;
    assert_int_equal(ms_nvrtc_precompile(sp, n, archs, 2, cache, &compiled, &err),
                     MS_ERR_UNSUPPORTED);
}

/* ---- check macros ---- */

static const char *fake_str(int code) { return code == 7 ? "seven" : "other"; }

static ms_status fake_call(ms_error *err, int result) {
    MS_CUDA_TRY_GEN(err, MS_ERR_CUDA, "FAKE", result, 0, fake_str, 3);
    return MS_OK;
}

static ms_status nvrtc_bad_call(ms_error *err) {
    size_t n = 0;
    nvrtcProgram none = NULL;
    MS_NVRTC_TRY(err, nvrtcGetProgramLogSize(none, &n));
    return MS_OK;
}

static void test_check_macros_record_call_location_device(void **state) {
    (void)state;
    ms_error err = {0};
    assert_int_equal(fake_call(&err, 0), MS_OK);
    assert_int_equal(fake_call(&err, 7), MS_ERR_CUDA);
    assert_non_null(strstr(err.msg, "FAKE error 7 (seven) in result"));
    assert_non_null(strstr(err.msg, "[device 3]"));
    assert_non_null(strstr(err.msg, "test_nvrtc.c"));
    assert_string_equal(err.func, "fake_call");
    assert_int_equal(nvrtc_bad_call(&err), MS_ERR_NVRTC);
    assert_non_null(strstr(err.msg, "nvrtcGetProgramLogSize(none, &n)"));
    assert_null(strstr(err.msg, "[device"));
}

static void test_parse_arch(void **state) {
    (void)state;
    ms_error err = {0};
    int a = 0;
    assert_int_equal(ms_nvrtc_parse_arch("sm_90", &a, &err), MS_OK);
    assert_int_equal(a, 90);
    assert_int_equal(ms_nvrtc_parse_arch("80", &a, &err), MS_OK);
    assert_int_equal(a, 80);
    assert_int_equal(ms_nvrtc_parse_arch("compute_86", &a, &err), MS_OK);
    assert_int_equal(a, 86);
    assert_int_equal(ms_nvrtc_parse_arch("sm_9x", &a, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "sm_9x"));
    assert_int_equal(ms_nvrtc_parse_arch("", &a, &err), MS_ERR_INVALID_ARG);
    int v = 0;
    assert_int_equal(ms_nvrtc_version(&v, &err), MS_OK);
    assert_true(v >= 12000);
}

/* ---- NVRTC: cache, errors ---- */

static void test_cache_hits_on_second_compile(void **state) {
    (void)state;
    char dir[512];
    make_temp_dir(dir, sizeof dir);
    ms_error err = {0};
    ms_kernel_spec s = ms_kernel_spec_simple(MS_KERNEL_OP_EMBED, MS_KERNEL_DTYPE_BF16);
    char uri[MS_KERNEL_URI_MAX], *src = NULL;
    assert_int_equal(ms_kernel_spec_uri(&s, 0, uri, sizeof uri, &err), MS_OK);
    assert_int_equal(ms_kernel_spec_source(&s, &src, &err), MS_OK);
    ms_cubin a = {0}, b = {0}, c = {0}, d = {0};
    assert_int_equal(ms_nvrtc_compile(uri, src, 90, dir, &a, &err), MS_OK);
    assert_false(a.from_cache);
    assert_non_null(a.path);
    assert_non_null(strstr(a.path, "embed_bf16_sm90-"));
    assert_int_equal(ms_nvrtc_compile(uri, src, 90, dir, &b, &err), MS_OK);
    assert_true(b.from_cache);
    assert_int_equal(a.size, b.size);
    assert_memory_equal(a.data, b.data, a.size);
    /* another arch is another entry */
    assert_int_equal(ms_nvrtc_compile(uri, src, 80, dir, &c, &err), MS_OK);
    assert_false(c.from_cache);
    assert_string_not_equal(a.path, c.path);
    /* a corrupt entry is rebuilt, not loaded */
    FILE *f = fopen(a.path, "wb");
    assert_non_null(f);
    fputs("garbage", f);
    fclose(f);
    assert_int_equal(ms_nvrtc_compile(uri, src, 90, dir, &d, &err), MS_OK);
    assert_false(d.from_cache);
    assert_int_equal(d.size, a.size);
    ms_nvrtc_cubin_free(&d);
    assert_int_equal(ms_nvrtc_compile(uri, src, 90, dir, &d, &err), MS_OK);
    assert_true(d.from_cache);
    /* MSTAR_CACHE names the default folder; "off" disables caching */
    char got[512];
    setenv("MSTAR_CACHE", dir, 1);
    assert_int_equal(ms_nvrtc_cache_dir(NULL, got, sizeof got, &err), MS_OK);
    assert_string_equal(got, dir);
    setenv("MSTAR_CACHE", "off", 1);
    assert_int_equal(ms_nvrtc_cache_dir(NULL, got, sizeof got, &err), MS_ERR_NOT_FOUND);
    ms_cubin e = {0};
    assert_int_equal(ms_nvrtc_compile(uri, src, 90, NULL, &e, &err), MS_OK);
    assert_false(e.from_cache);
    assert_null(e.path);
    unsetenv("MSTAR_CACHE");
    ms_nvrtc_cubin_free(&a);
    ms_nvrtc_cubin_free(&b);
    ms_nvrtc_cubin_free(&c);
    ms_nvrtc_cubin_free(&d);
    ms_nvrtc_cubin_free(&e);
    ms_free(src);
    rm_tree(dir);
}

static void test_broken_instance_reports_log_and_source(void **state) {
    (void)state;
    char dir[512];
    make_temp_dir(dir, sizeof dir);
    ms_error err = {0};
    /* head_dim 44 is refused by the spec check; instantiate it by hand to reach the template's
     * static_assert, as a hand-edited or future generator bug would */
    const char *src = "// broken on purpose\n#include \"attn/decode.cuh\"\n"
                      "extern \"C\" __global__ void ms_attn_decode(const ms_attn_kernel_params p) {\n"
                      "    ms::attn_decode<ms::bf16, ms::bf16, 44, 16, 4, false>(p);\n}\n";
    ms_cubin cb = {0};
    assert_int_equal(ms_nvrtc_compile("attn_decode_bf16_hd44_ps16_g4", src, 90, dir, &cb, &err),
                     MS_ERR_NVRTC);
    assert_null(cb.data);
    assert_non_null(strstr(err.msg, "attn_decode_bf16_hd44_ps16_g4_sm90"));
    assert_non_null(strstr(err.msg, "multiple of 16 bytes")); /* NVRTC's log */
    /* the generated source is on disk at the path the message names */
    char path[1024];
    snprintf(path, sizeof path, "%s/attn_decode_bf16_hd44_ps16_g4_sm90.failed.cu", dir);
    assert_non_null(strstr(err.msg, path));
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char buf[1024] = {0};
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    assert_int_equal(n, strlen(src));
    assert_string_equal(buf, src);
    snprintf(path, sizeof path, "%s/attn_decode_bf16_hd44_ps16_g4_sm90.failed.log", dir);
    assert_int_equal(access(path, R_OK), 0);
    assert_non_null(strstr(err.msg, path));
    /* the whole log for the caller; with the caller's source path, that path is named and no
     * .failed.cu copy is written */
    char *log = NULL;
    ms_nvrtc_options o = {.cache_dir = dir, .source_path = "out/kernels/x.cu", .log = &log};
    assert_int_equal(ms_nvrtc_compile_ex("broken_named", src, 80, &o, &cb, &err), MS_ERR_NVRTC);
    assert_non_null(log);
    assert_non_null(strstr(log, "multiple of 16 bytes"));
    assert_non_null(strstr(log, "out/kernels/x.cu")); /* NVRTC names the program so */
    ms_free(log);
    assert_non_null(strstr(err.msg, "source: out/kernels/x.cu;"));
    snprintf(path, sizeof path, "%s/broken_named_sm80.failed.cu", dir);
    assert_int_equal(access(path, F_OK), -1);
    /* a syntax error too */
    assert_int_equal(ms_nvrtc_compile("broken_syntax", "extern \"C\" __global__ void k( {}\n", 80,
                                      dir, &cb, &err),
                     MS_ERR_NVRTC);
    assert_non_null(strstr(err.msg, "broken_syntax_sm80"));
    assert_non_null(strstr(err.msg, "error"));
    /* invalid arguments */
    assert_int_equal(ms_nvrtc_compile("a/b", src, 90, dir, &cb, &err), MS_ERR_INVALID_ARG);
    assert_int_equal(ms_nvrtc_compile("x", src, 12, dir, &cb, &err), MS_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "sm_12"));
    rm_tree(dir);
}

/* ---- precompiling: arch lists, cache keys of emitted files, failures, template override ---- */

static void test_arch_list_names_the_flag(void **state) {
    (void)state;
    ms_error err = {0};
    int a[4], n = -1;
    assert_int_equal(ms_kernel_parse_arch_list("--arch", "sm_80,sm_90", a, 4, &n, &err), MS_OK);
    assert_int_equal(n, 2);
    assert_int_equal(a[0], 80);
    assert_int_equal(a[1], 90);
    assert_int_equal(ms_kernel_parse_arch_list("--arch", "90", a, 4, &n, &err), MS_OK);
    assert_int_equal(n, 1);
    assert_int_equal(a[0], 90);
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"sm_7", "'sm_7' not understood"},      {"sm_abc", "'sm_abc' not understood"},
        {"", "empty architecture list"},        {"sm_80,sm_80", "sm_80 listed twice"},
        {"sm_80,", "empty item"},               {",sm_90", "empty item"},
        {"sm_90a", "'sm_90a' not understood"},  {"sm_80,sm_86,sm_89,sm_90,sm_100", "more than 4"},
        {"sm_-80", "not understood"},
    };
    for (size_t i = 0; i < MS_ARRAY_LEN(bad); i++) {
        assert_int_equal(ms_kernel_parse_arch_list("--arch", bad[i].text, a, 4, &n, &err),
                         MS_ERR_INVALID_ARG);
        if (strstr(err.msg, bad[i].want) == NULL || strncmp(err.msg, "--arch: ", 8) != 0)
            fail_msg("'%s': got '%s', want '--arch: ...%s...'", bad[i].text, err.msg,
                     bad[i].want);
    }
    assert_int_equal(ms_nvrtc_check_arch(90, &err), MS_OK);
    assert_int_equal(ms_nvrtc_check_arch(51, &err), MS_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "sm_51"));
}

static void test_key_ignores_comments_only(void **state) {
    (void)state;
    ms_error err = {0};
    const char *a = "#include \"act/silu_mul.cuh\"\nint x = 1;\n#error \"a // b\"\n";
    const char *b = "/* banner\n * more */\n#include \"act/silu_mul.cuh\" // why\n\n"
                    "int x = 1;   /* one */\n#error \"a // b\"\n// end\n";
    const char *c = "#include \"act/silu_mul.cuh\"\nint x = 2;\n#error \"a // b\"\n";
    const char *d = "#include \"act/silu_mul.cuh\"\nint x = 1;\n#error \"a \"\n";
    uint64_t ka = 0, kb = 1, kc = 2, kd = 3, k80 = 4, ko = 5;
    assert_int_equal(ms_nvrtc_cache_key("k", a, 90, &ka, &err), MS_OK);
    assert_int_equal(ms_nvrtc_cache_key("k", b, 90, &kb, &err), MS_OK);
    assert_int_equal(ms_nvrtc_cache_key("k", c, 90, &kc, &err), MS_OK);
    assert_int_equal(ms_nvrtc_cache_key("k", d, 90, &kd, &err), MS_OK);
    assert_int_equal(ms_nvrtc_cache_key("k", a, 80, &k80, &err), MS_OK);
    assert_int_equal(ms_nvrtc_cache_key("other", a, 90, &ko, &err), MS_OK);
    assert_true(ka == kb); /* comments, blank lines, trailing blanks */
    assert_true(ka != kc); /* code */
    assert_true(ka != kd); /* "//" inside a string literal is code */
    assert_true(ka != k80 && ka != ko);
    assert_int_equal(ms_nvrtc_cache_key("a/b", a, 90, &ka, &err), MS_ERR_INVALID_ARG);
}

/* The text mstarc compiles for an instance (shape defines + the emitted file) has the cache key
 * of the text the runtime compiles at load, for every instance models/llama.mstar emits. */
/* Every file mstarc emits for `file` matches a runtime instance of one of the shapes (qk_norm:
 * the per-head norm variant; mrope: the M-RoPE RoPE + KV write), with the same cache key; returns
 * the number of (shape, instance) pairs checked. */
static int check_emitted_keys(const char *file, const ms_kernel_model_shape *shapes,
                              size_t n_shapes, bool qk_norm, bool mrope) {
    ms_error err = {0};
    ms_compile *c = NULL;
    assert_int_equal(ms_compile_file(file, 0, &c, &err), MS_OK);
    ms_gen_file files[32];
    int n_files = 0;
    assert_int_equal(ms_codegen_kernels(ms_compile_model(c), file, files, 32, &n_files, &err),
                     MS_OK);
    assert_true(n_files >= 10);
    bool matched[32] = {false};
    int checked = 0;
    for (size_t k = 0; k < n_shapes; k++) {
        ms_kernel_spec sp[32];
        int n = 0, nq = 0;
        assert_int_equal(ms_kernel_specs_for_decoder_variant(&shapes[k], qk_norm, mrope, sp, 16, &n,
                                                             &err),
                         MS_OK);
        /* and the quantized-weight instances every model with a linear lists (one per type) */
        static const int qt[] = {2, 3, 6, 8, 12, 13, 14};
        assert_int_equal(ms_kernel_specs_for_quant(qt, 7, sp + n, 32 - n, &nq, &err), MS_OK);
        assert_int_equal(nq, 7);
        n += nq;
        for (int i = 0; i < n; i++) {
            char stem[MS_KERNEL_URI_MAX], uri[MS_KERNEL_URI_MAX], name[MS_KERNEL_URI_MAX + 4];
            char defines[256], *rt = NULL;
            assert_int_equal(ms_kernel_spec_stem(&sp[i], stem, sizeof stem, &err), MS_OK);
            assert_int_equal(ms_kernel_spec_uri(&sp[i], 0, uri, sizeof uri, &err), MS_OK);
            assert_int_equal(ms_kernel_spec_shape_defines(&sp[i], defines, sizeof defines, &err),
                             MS_OK);
            assert_int_equal(ms_kernel_spec_instance_source(&sp[i], &rt, &err), MS_OK);
            snprintf(name, sizeof name, "%s.cu", stem);
            int f = -1;
            for (int j = 0; j < n_files; j++)
                if (strcmp(files[j].name, name) == 0)
                    f = j;
            if (f < 0)
                fail_msg("%s: %s emits no %s", uri, file, name);
            matched[f] = true;
            char *mc = ms_asprintf("%s%s", defines, files[f].text.data);
            assert_non_null(mc);
            assert_string_not_equal(mc, rt); /* the comments differ ... */
            uint64_t km = 0, kr = 1;
            assert_int_equal(ms_nvrtc_cache_key(uri, mc, 90, &km, &err), MS_OK);
            assert_int_equal(ms_nvrtc_cache_key(uri, rt, 90, &kr, &err), MS_OK);
            if (km != kr) /* ... the key does not */
                fail_msg("%s: mstarc's text and the runtime's differ:\n%s\n----\n%s", uri, mc, rt);
            checked++;
            ms_free(mc);
            ms_free(rt);
        }
    }
    for (int j = 0; j < n_files; j++)
        if (!matched[j])
            fail_msg("%s: emitted %s matches no runtime instance", file, files[j].name);
    ms_gen_files_free(files, n_files);
    ms_compile_free(c);
    return checked;
}

static void test_emitted_instances_share_the_runtime_cache_key(void **state) {
    (void)state;
    /* llama_gqa, Llama-3-8B, a windowed interleaved MHA model: every emitted file is matched */
    const ms_kernel_model_shape llama[] = {
        {16, 8, 2, 16, MS_KERNEL_ROPE_NEOX, false, MS_KERNEL_DTYPE_BF16, MS_KERNEL_DTYPE_BF16},
        {128, 32, 8, 16, MS_KERNEL_ROPE_NEOX, false, MS_KERNEL_DTYPE_BF16, MS_KERNEL_DTYPE_BF16},
        {64, 8, 8, 32, MS_KERNEL_ROPE_INTERLEAVED, true, MS_KERNEL_DTYPE_BF16,
         MS_KERNEL_DTYPE_BF16},
    };
    /* per shape: the structural instances plus the 7 qmatmul ones (one per ggml type) */
    assert_int_equal(check_emitted_keys("models/llama.mstar", llama, MS_ARRAY_LEN(llama), false,
                                        false),
                     27 + 3 * 7);
    /* the Qwen3 fixture (head_dim 48), Qwen3-8B, and one with its sliding window on: Llama's
       instances and the per-head norm, which mstarc emits as rmsnorm_heads_bf16_af32.cu
       (head_dim a macro) */
    const ms_kernel_model_shape qwen3[] = {
        {48, 4, 2, 16, MS_KERNEL_ROPE_NEOX, false, MS_KERNEL_DTYPE_BF16, MS_KERNEL_DTYPE_BF16},
        {128, 32, 8, 16, MS_KERNEL_ROPE_NEOX, false, MS_KERNEL_DTYPE_BF16, MS_KERNEL_DTYPE_BF16},
        {128, 32, 8, 16, MS_KERNEL_ROPE_NEOX, true, MS_KERNEL_DTYPE_BF16, MS_KERNEL_DTYPE_BF16},
    };
    assert_int_equal(check_emitted_keys("models/qwen3.mstar", qwen3, MS_ARRAY_LEN(qwen3), true,
                                        false),
                     30 + 3 * 7);
    /* the Qwen2-VL fixture (head_dim 32, mrope_section [4, 6, 6]), Qwen2-VL-7B, and one with its
       sliding window on: Llama's instances with the M-RoPE rope_kv instead of the plain one */
    const ms_kernel_model_shape qwen2vl[] = {
        {32, 4, 2, 16, MS_KERNEL_ROPE_NEOX, false, MS_KERNEL_DTYPE_BF16, MS_KERNEL_DTYPE_BF16},
        {128, 28, 4, 16, MS_KERNEL_ROPE_NEOX, false, MS_KERNEL_DTYPE_BF16, MS_KERNEL_DTYPE_BF16},
        {128, 28, 4, 16, MS_KERNEL_ROPE_NEOX, true, MS_KERNEL_DTYPE_BF16, MS_KERNEL_DTYPE_BF16},
    };
    assert_int_equal(check_emitted_keys("models/qwen2vl.mstar", qwen2vl, MS_ARRAY_LEN(qwen2vl),
                                        false, true),
                     27 + 3 * 7);
}

/* Copy the file src to dst, appending extra. */
static void copy_with(const char *src, const char *dst, const char *extra) {
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    assert_non_null(in);
    assert_non_null(out);
    char buf[4096];
    size_t r;
    while ((r = fread(buf, 1, sizeof buf, in)) > 0)
        assert_int_equal(fwrite(buf, 1, r, out), r);
    fputs(extra, out);
    fclose(in);
    assert_int_equal(fclose(out), 0);
}

static void test_templates_dir_overrides_and_failure_names_the_source(void **state) {
    (void)state;
    char dir[512], tdir[600], cache[600], path[800];
    make_temp_dir(dir, sizeof dir);
    snprintf(tdir, sizeof tdir, "%s/templates", dir);
    snprintf(cache, sizeof cache, "%s/cache", dir);
    assert_int_equal(mkdir(tdir, 0755), 0);
    snprintf(path, sizeof path, "%s/act", tdir);
    assert_int_equal(mkdir(path, 0755), 0);
    ms_error err = {0};
    ms_kernel_spec s = ms_kernel_spec_simple(MS_KERNEL_OP_SILU_MUL, MS_KERNEL_DTYPE_F32);
    char uri[MS_KERNEL_URI_MAX], *src = NULL;
    assert_int_equal(ms_kernel_spec_uri(&s, 0, uri, sizeof uri, &err), MS_OK);
    assert_int_equal(ms_kernel_spec_instance_source(&s, &src, &err), MS_OK);
    uint64_t k0 = 0, k1 = 0;
    assert_int_equal(ms_nvrtc_cache_key(uri, src, 80, &k0, &err), MS_OK);
    /* a broken copy of the template the instance includes */
    snprintf(path, sizeof path, "%s/act/silu_mul.cuh", tdir);
    copy_with("templates/act/silu_mul.cuh", path, "\nthis is not C++;\n");
    setenv("MSTAR_TEMPLATES_DIR", tdir, 1);
    assert_int_equal(ms_nvrtc_cache_key(uri, src, 80, &k1, &err), MS_OK);
    assert_true(k0 != k1); /* the override's text is in the key */
    ms_cubin cb = {0};
    char *log = NULL;
    ms_nvrtc_options o = {.cache_dir = cache, .log = &log};
    assert_int_equal(ms_nvrtc_compile_ex(uri, src, 80, &o, &cb, &err), MS_ERR_NVRTC);
    assert_non_null(log);
    assert_non_null(strstr(log, "silu_mul.cuh"));
    ms_free(log);
    snprintf(path, sizeof path, "%s/silu_mul_f32_sm80.failed.cu", cache);
    assert_non_null(strstr(err.msg, path));
    assert_int_equal(access(path, R_OK), 0);
    /* a folder that is not there */
    snprintf(path, sizeof path, "%s/none", dir);
    setenv("MSTAR_TEMPLATES_DIR", path, 1);
    assert_int_equal(ms_nvrtc_cache_key(uri, src, 80, &k1, &err), MS_ERR_IO);
    assert_non_null(strstr(err.msg, "MSTAR_TEMPLATES_DIR"));
    unsetenv("MSTAR_TEMPLATES_DIR");
    /* without the override it compiles, and the probe finds it afterwards */
    bool hit = true;
    char cpath[1024];
    assert_int_equal(ms_nvrtc_cache_probe(uri, src, 80, cache, cpath, sizeof cpath, &hit, &err),
                     MS_OK);
    assert_false(hit);
    assert_int_equal(ms_nvrtc_compile_ex(uri, src, 80, &o, &cb, &err), MS_OK);
    assert_false(cb.from_cache);
    assert_string_equal(cb.path, cpath);
    ms_nvrtc_cubin_free(&cb);
    assert_int_equal(ms_nvrtc_cache_probe(uri, src, 80, cache, cpath, sizeof cpath, &hit, &err),
                     MS_OK);
    assert_true(hit);
    /* no_cache neither reads nor writes */
    ms_nvrtc_options nc = {.cache_dir = cache, .no_cache = true};
    assert_int_equal(ms_nvrtc_compile_ex(uri, src, 80, &nc, &cb, &err), MS_OK);
    assert_false(cb.from_cache);
    assert_null(cb.path);
    ms_nvrtc_cubin_free(&cb);
    ms_free(src);
    rm_tree(dir);
}

/* ---- the CUDA backend on a machine without a usable GPU ---- */

static void test_cuda_backend_init_fails_cleanly_without_gpu(void **state) {
    (void)state;
    ms_error err = {0};
    ms_backend be;
    ms_status st = ms_backend_cuda_init(&be, NULL, &err);
    if (st == MS_OK) { /* a GPU is present (device machine): nothing to check here */
        ms_backend_free(&be);
        return;
    }
    assert_int_equal(st, MS_ERR_CUDA);
    assert_non_null(strstr(err.msg, "cuda backend: CUDA error"));
    assert_null(be.ctx);
    assert_null(be.iface.linear);
}

/* ---- the instance matrix ---- */

#define MAX_SPECS 256

/* One NVRTC compile: specs[spec] for sm_<arch>. */
typedef struct matrix_job {
    int spec, arch;
} matrix_job;

typedef struct matrix {
    ms_kernel_spec specs[MAX_SPECS];
    int n;
    matrix_job jobs[2 * MAX_SPECS]; /* plan_jobs: every spec for sm_90, one per stem for sm_80 */
    int n_jobs, n_sm80;
    int next;            /* next job (index into jobs), under lock */
    int failed;          /* jobs that failed */
    int compiled;        /* jobs compiled by NVRTC now (not from the cache) */
    char first_error[MS_ERROR_MSG_MAX];
    const char *cache;
    pthread_mutex_t lock;
} matrix;

/* Add a spec unless one with the same URI is there (structs have padding: compare URIs). */
static void add_spec(matrix *m, ms_kernel_spec s) {
    char a[MS_KERNEL_URI_MAX], b[MS_KERNEL_URI_MAX];
    assert_int_equal(ms_kernel_spec_uri(&s, 0, a, sizeof a, NULL), MS_OK);
    for (int i = 0; i < m->n; i++) {
        assert_int_equal(ms_kernel_spec_uri(&m->specs[i], 0, b, sizeof b, NULL), MS_OK);
        if (strcmp(a, b) == 0)
            return;
    }
    assert_true(m->n < MAX_SPECS);
    m->specs[m->n++] = s;
}

static ms_kernel_spec f32_act(ms_kernel_spec s) {
    s.act_dtype = MS_KERNEL_DTYPE_F32;
    return s;
}

/*
 * The instances: float32 activations over bf16 weights and KV (what the CUDA backend runs) for
 * the whole Llama matrix, and bf16 activations for the shapes test_gpu_kernels runs.
 */
static void build_llama_matrix(matrix *m) {
    const ms_kernel_dtype bf = MS_KERNEL_DTYPE_BF16;
    const int hds[] = {16, 64, 128}, pss[] = {16, 128}, gs[] = {1, 4, 8};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 2; b++)
            for (int c = 0; c < 3; c++)
                for (int w = 0; w < 2; w++) {
                    add_spec(m, f32_act(ms_kernel_spec_attn_decode(bf, hds[a], pss[b], gs[c], w == 1)));
                    add_spec(m, f32_act(ms_kernel_spec_attn_prefill(bf, hds[a], pss[b], gs[c], true,
                                                                    w == 1)));
                }
    /* the fixtures' shapes: llama_gqa hd16 g4, aidreams hd16 g1, llama_cfg hd16 g2,
     * llama31_rope hd32 g1, mistral_window hd32 g2 windowed; one non-causal prefill */
    const int fx[][3] = {{16, 4, 0}, {16, 1, 0}, {16, 2, 0}, {32, 1, 0}, {32, 2, 1}};
    for (size_t i = 0; i < MS_ARRAY_LEN(fx); i++) {
        add_spec(m, f32_act(ms_kernel_spec_attn_decode(bf, fx[i][0], 16, fx[i][1], fx[i][2] == 1)));
        add_spec(m, f32_act(ms_kernel_spec_attn_prefill(bf, fx[i][0], 16, fx[i][1], true,
                                                        fx[i][2] == 1)));
    }
    add_spec(m, f32_act(ms_kernel_spec_attn_prefill(bf, 64, 16, 1, false, false)));
    const int rhd[] = {16, 32, 64, 128};
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 2; b++)
            for (int st = MS_KERNEL_ROPE_NEOX; st <= MS_KERNEL_ROPE_INTERLEAVED; st++)
                for (int sc = 0; sc < MS_KERNEL_ROPE_SCALING_COUNT; sc++)
                    add_spec(m, f32_act(ms_kernel_spec_rope_kv(bf, rhd[a], pss[b],
                                                               (ms_kernel_rope)st,
                                                               (ms_kernel_rope_scaling)sc)));
    add_spec(m, f32_act(ms_kernel_spec_rope_kv(bf, 128, 16, MS_KERNEL_ROPE_NONE, 0)));
    add_spec(m, f32_act(ms_kernel_spec_rmsnorm(bf, false)));
    add_spec(m, f32_act(ms_kernel_spec_rmsnorm(bf, true)));
    add_spec(m, f32_act(ms_kernel_spec_simple(MS_KERNEL_OP_EMBED, bf)));
    add_spec(m, f32_act(ms_kernel_spec_simple(MS_KERNEL_OP_MISC, bf)));
    add_spec(m, ms_kernel_spec_simple(MS_KERNEL_OP_SILU_MUL, MS_KERNEL_DTYPE_F32));
    add_spec(m, ms_kernel_spec_simple(MS_KERNEL_OP_ARGMAX, MS_KERNEL_DTYPE_F32));
    add_spec(m, ms_kernel_spec_simple(MS_KERNEL_OP_SAMPLE, MS_KERNEL_DTYPE_F32));

    /* exactly what the CUDA backend asks for, for the repository's models and Llama 3.1 8B */
    const ms_kernel_model_shape models[] = {
        {16, 8, 2, 16, MS_KERNEL_ROPE_NEOX, false, bf, bf},        /* llama_gqa */
        {16, 4, 2, 16, MS_KERNEL_ROPE_NEOX, false, bf, bf},        /* llama_cfg */
        {16, 4, 4, 16, MS_KERNEL_ROPE_INTERLEAVED, false, bf, bf}, /* llama2.c aidreams260K */
        {32, 4, 4, 16, MS_KERNEL_ROPE_NEOX, false, bf, bf},        /* llama31_rope */
        {32, 4, 2, 16, MS_KERNEL_ROPE_NEOX, true, bf, bf},         /* mistral_window */
        {128, 32, 8, 16, MS_KERNEL_ROPE_NEOX, false, bf, bf},      /* Llama 3.1 8B */
        {128, 64, 8, 16, MS_KERNEL_ROPE_NEOX, false, bf, bf},      /* Llama 3.1 70B */
    };
    for (size_t i = 0; i < MS_ARRAY_LEN(models); i++) {
        ms_kernel_spec sp[16];
        int n = 0;
        ms_error err = {0};
        assert_int_equal(ms_kernel_specs_for_decoder(&models[i], sp, 16, &n, &err), MS_OK);
        for (int j = 0; j < n; j++)
            add_spec(m, sp[j]);
    }
    /* decoder variants: q/k per-head norm (Qwen3) and M-RoPE (Qwen2-VL) */
    const struct {
        ms_kernel_model_shape sh;
        bool qk_norm, mrope;
    } variants[] = {
        {{48, 4, 2, 16, MS_KERNEL_ROPE_NEOX, false, bf, bf}, true, false},   /* qwen3 fixture */
        {{128, 32, 8, 16, MS_KERNEL_ROPE_NEOX, false, bf, bf}, true, false}, /* Qwen3 8B */
        {{64, 16, 8, 16, MS_KERNEL_ROPE_NEOX, false, bf, bf}, true, false},  /* head_dim 64 */
        {{32, 4, 2, 16, MS_KERNEL_ROPE_NEOX, false, bf, bf}, false, true},   /* qwen2vl fixture */
        {{128, 28, 4, 16, MS_KERNEL_ROPE_NEOX, false, bf, bf}, false, true}, /* Qwen2-VL 7B */
    };
    for (size_t i = 0; i < MS_ARRAY_LEN(variants); i++) {
        ms_kernel_spec sp[16];
        int n = 0;
        ms_error err = {0};
        assert_int_equal(ms_kernel_specs_for_decoder_variant(&variants[i].sh, variants[i].qk_norm,
                                                             variants[i].mrope, sp, 16, &n, &err),
                         MS_OK);
        for (int j = 0; j < n; j++)
            add_spec(m, sp[j]);
    }
    /* the rope-only (no KV write) path and the interleaved M-RoPE, float32 activations */
    for (int st = MS_KERNEL_ROPE_NEOX; st <= MS_KERNEL_ROPE_INTERLEAVED; st++)
        add_spec(m, f32_act(ms_kernel_spec_rope_kv_mrope(bf, 32, 16, (ms_kernel_rope)st)));

    /* bf16 activations: the shapes of test_gpu_kernels */
    const int ghd[] = {64, 128};
    for (int a = 0; a < 2; a++)
        for (int c = 0; c < 3; c++)
            for (int w = 0; w < 2; w++) {
                add_spec(m, ms_kernel_spec_attn_decode(bf, ghd[a], 16, gs[c], w == 1));
                add_spec(m, ms_kernel_spec_attn_prefill(bf, ghd[a], 16, gs[c], true, w == 1));
            }
    for (int w = 0; w < 2; w++) {
        add_spec(m, ms_kernel_spec_attn_decode(bf, 128, 128, 4, w == 1));
        add_spec(m, ms_kernel_spec_attn_prefill(bf, 128, 128, 4, true, w == 1));
    }
    add_spec(m, ms_kernel_spec_attn_decode(bf, 16, 16, 4, false));
    add_spec(m, ms_kernel_spec_attn_prefill(bf, 16, 16, 4, true, false));
    add_spec(m, ms_kernel_spec_attn_prefill(bf, 32, 16, 2, true, true));
    add_spec(m, ms_kernel_spec_attn_prefill(bf, 64, 16, 1, false, false));
    for (int a = 0; a < 2; a++)
        for (int st = MS_KERNEL_ROPE_NEOX; st <= MS_KERNEL_ROPE_INTERLEAVED; st++)
            for (int sc = 0; sc < MS_KERNEL_ROPE_SCALING_COUNT; sc++)
                add_spec(m, ms_kernel_spec_rope_kv(bf, ghd[a], 16, (ms_kernel_rope)st,
                                                   (ms_kernel_rope_scaling)sc));
    add_spec(m, ms_kernel_spec_rope_kv(bf, 128, 128, MS_KERNEL_ROPE_NEOX,
                                       MS_KERNEL_ROPE_SCALING_LLAMA3));
    add_spec(m, ms_kernel_spec_rope_kv(bf, 16, 16, MS_KERNEL_ROPE_INTERLEAVED,
                                       MS_KERNEL_ROPE_SCALING_NONE));
    add_spec(m, ms_kernel_spec_rmsnorm(bf, false));
    add_spec(m, ms_kernel_spec_rmsnorm(bf, true));
    add_spec(m, ms_kernel_spec_simple(MS_KERNEL_OP_SILU_MUL, bf));
    add_spec(m, ms_kernel_spec_simple(MS_KERNEL_OP_EMBED, bf));
    /* test_gpu_kernels: per-head RMSNorm (bf16 and f32 activations), M-RoPE, and prefill at
     * Qwen3's head_dim 48 (also its decode steps) */
    for (int w = 0; w < 2; w++) {
        add_spec(m, ms_kernel_spec_attn_prefill(bf, 48, 16, 2, true, w == 1));
        add_spec(m, ms_kernel_spec_attn_prefill(bf, 48, 16, 4, true, false));
    }
    const int nhd[] = {48, 64, 128};
    for (int a = 0; a < 3; a++) {
        add_spec(m, ms_kernel_spec_rmsnorm_heads(bf, nhd[a]));
        add_spec(m, f32_act(ms_kernel_spec_rmsnorm_heads(bf, nhd[a])));
    }
    for (int a = 0; a < 2; a++)
        for (int st = MS_KERNEL_ROPE_NEOX; st <= MS_KERNEL_ROPE_INTERLEAVED; st++)
            add_spec(m, ms_kernel_spec_rope_kv_mrope(bf, ghd[a], 16, (ms_kernel_rope)st));
    /* quantized weights (GGUF): one qmatmul instance per ggml type the CUDA backend keeps
     * quantized (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K), all nine entries each */
    static const int qt[] = {2, 3, 6, 8, 12, 13, 14};
    for (int i = 0; i < (int)MS_ARRAY_LEN(qt); i++)
        add_spec(m, ms_kernel_spec_qmatmul(qt[i]));
}

/*
 * The jobs: every spec (every shape) for sm_90, the H200's arch; for sm_80, the first spec of
 * each stem (ms_kernel_spec_stem: the URI without head_dim, page size and group). The templates
 * have no arch-dependent code (no __CUDA_ARCH__ version tests; mma.sync and the cvt asm are
 * sm_80+), so a stem's other shapes give sm_80's ptxas the same code with other constants: one
 * per stem proves what the whole sm_80 column did, at a fifth of the compiles (the matrix was most
 * of CI's NVRTC time). Whole models' instance lists still compile for both archs elsewhere in CI:
 * test_codegen_kernels (models/llama.mstar and models/whisper.mstar at one shape each) and
 * tests/kernels_cli.sh (`mstarc build --arch sm_80,sm_90` at llama_gqa's shape).
 */
static void plan_jobs(matrix *m) {
    char stems[MAX_SPECS][MS_KERNEL_URI_MAX];
    int n_stems = 0;
    for (int i = 0; i < m->n; i++) {
        m->jobs[m->n_jobs++] = (matrix_job){i, 90};
        char stem[MS_KERNEL_URI_MAX];
        assert_int_equal(ms_kernel_spec_stem(&m->specs[i], stem, sizeof stem, NULL), MS_OK);
        bool seen = false;
        for (int k = 0; k < n_stems && !seen; k++)
            seen = strcmp(stems[k], stem) == 0;
        if (!seen) {
            snprintf(stems[n_stems++], MS_KERNEL_URI_MAX, "%s", stem);
            m->jobs[m->n_jobs++] = (matrix_job){i, 80};
            m->n_sm80++;
        }
    }
}

/* Compile one (spec, arch) job; true on success with every entry symbol in the cubin. */
static bool compile_job(matrix *m, int job, bool *fresh, char *msg, size_t cap) {
    const ms_kernel_spec *s = &m->specs[m->jobs[job].spec];
    int arch = m->jobs[job].arch;
    ms_error err = {0};
    char uri[MS_KERNEL_URI_MAX], *src = NULL;
    if (ms_kernel_spec_uri(s, 0, uri, sizeof uri, &err) != MS_OK ||
        ms_kernel_spec_instance_source(s, &src, &err) != MS_OK) {
        snprintf(msg, cap, "%s", err.msg);
        return false;
    }
    ms_cubin cb = {0};
    bool ok = ms_nvrtc_compile(uri, src, arch, m->cache, &cb, &err) == MS_OK;
    if (!ok)
        snprintf(msg, cap, "%s", err.msg);
    for (int e = 0; ok && e < MS_KERNEL_MAX_ENTRIES && ms_kernel_op_entry(s->op, e) != NULL; e++) {
        if (!has_bytes(cb.data, cb.size, ms_kernel_op_entry(s->op, e))) {
            snprintf(msg, cap, "%s_sm%d: entry %s missing from the cubin", uri, arch,
                     ms_kernel_op_entry(s->op, e));
            ok = false;
        }
    }
    if (ok && (cb.size < 4 || memcmp(cb.data, "\177ELF", 4) != 0)) {
        snprintf(msg, cap, "%s_sm%d: not an ELF cubin", uri, arch);
        ok = false;
    }
    *fresh = ok && !cb.from_cache;
    ms_nvrtc_cubin_free(&cb);
    ms_free(src);
    return ok;
}

static void *matrix_worker(void *arg) {
    matrix *m = arg;
    for (;;) {
        pthread_mutex_lock(&m->lock);
        int job = m->next < m->n_jobs ? m->next++ : -1;
        pthread_mutex_unlock(&m->lock);
        if (job < 0)
            return NULL;
        char msg[MS_ERROR_MSG_MAX] = "";
        bool fresh = false;
        bool ok = compile_job(m, job, &fresh, msg, sizeof msg);
        pthread_mutex_lock(&m->lock);
        if (!ok && m->failed++ == 0)
            snprintf(m->first_error, sizeof m->first_error, "%s", msg);
        if (fresh)
            m->compiled++;
        pthread_mutex_unlock(&m->lock);
    }
}

static void test_every_llama_instance_compiles_for_sm90_each_stem_for_sm80(void **state) {
    (void)state;
    matrix *m = ms_calloc(1, sizeof *m);
    assert_non_null(m);
    build_llama_matrix(m);
    plan_jobs(m);
    const char *c = getenv("MS_KERNEL_CACHE_TEST");
    m->cache = c != NULL && c[0] != '\0' ? c : "build/kernel-cache-test";
    pthread_mutex_init(&m->lock, NULL);
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, matrix_worker, m), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    pthread_mutex_destroy(&m->lock);
    printf("kernel instances: %d specs for sm_90, %d stems for sm_80, %d compiled now, %d from the "
           "cache (%s), %d failed\n",
           m->n, m->n_sm80, m->compiled, m->n_jobs - m->compiled - m->failed, m->cache, m->failed);
    if (m->failed > 0)
        fail_msg("%d instance(s) failed; first: %s", m->failed, m->first_error);
    assert_true(m->n >= 150);
    assert_int_equal(m->next, m->n_jobs); /* every job ran */
    assert_true(m->n_sm80 >= 30);         /* every op, dtype and variant has a stem */
    ms_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_uri_names_every_parameter),
        ms_unit_test(test_unsupported_specs_name_the_value),
        ms_unit_test(test_source_is_preamble_and_wrappers_only),
        ms_unit_test(test_prefill_tiles_cover_ragged_batch),
        ms_unit_test(test_decode_split_fills_device_and_covers_pages),
        ms_unit_test(test_decoder_instances),
        ms_unit_test(test_variant_specs_uris_and_sources),
        ms_unit_test(test_instances_from_emitted_stems),
        ms_unit_test(test_precompile_a_model_for_two_archs),
        ms_unit_test(test_check_macros_record_call_location_device),
        ms_unit_test(test_parse_arch),
        ms_unit_test(test_cache_hits_on_second_compile),
        ms_unit_test(test_broken_instance_reports_log_and_source),
        ms_unit_test(test_arch_list_names_the_flag),
        ms_unit_test(test_key_ignores_comments_only),
        ms_unit_test(test_emitted_instances_share_the_runtime_cache_key),
        ms_unit_test(test_templates_dir_overrides_and_failure_names_the_source),
        ms_unit_test(test_cuda_backend_init_fails_cleanly_without_gpu),
        ms_unit_test(test_every_llama_instance_compiles_for_sm90_each_stem_for_sm80),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
