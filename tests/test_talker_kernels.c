/*
 * test_talker_kernels.c - the CUDA kernel instances mstarc writes for models/talker.mstar
 * ($MS_BUILD/gen/talker/kernels/<stem>.cu, `mstarc build --emit-only` through tests/build.mk)
 * are the complete list its two nodes load on a GPU: the engine (CPU here) over
 * ../shared/fixtures/hf/talker_codepred gives each node's shape (the talker: head_dim 16, 4 query
 * heads over 2 KV heads, pages of 16; the code predictor on its scratch: 2 over 1, pages of one
 * frame, 4 slots), ms_md_kernel_specs lists each node's instances (what eng_kernels_init loads),
 * and every one has its generated file and compiles with NVRTC for sm_90 once completed with its
 * shape defines as the runtime does at load; the embedding instance of the talker's frame
 * embedding (its forward's embedding(table, codes, column = c)) is among them, and the misc
 * instance holds ms_select_rows (the predictor's `code.first`: in_proj(h) at a frame's slot 0, a
 * code's embedding elsewhere) as an entry NVRTC compiles. No GPU needed; cubins cached in
 * $MS_BUILD/codegen-nvrtc-cache. Built only where the CUDA toolkit is (tests/build.mk).
 */
#include "ms_test.h"
#include "ms_test_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "kernel.h"
#include "nvrtc_cache.h"

extern const ms_model_desc ms_talker_desc;

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        fail_msg("cannot open %s (mstarc wrote no such instance)", path);
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

static void test_talker_kernel_instances(void **state) {
    (void)state;
    ms_error err = {0};
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture("hf/talker_codepred");
    o.max_seqs = 2;
    o.max_tokens = 16;
    o.max_seq_len = 32;
    o.n_threads = 1;
    ms_engine *e = NULL;
    if (ms_engine_init(&e, &ms_talker_desc, &o, &err) != MS_OK)
        fail_msg("%s", err.msg);
    const char *build = getenv("MS_BUILD") != NULL ? getenv("MS_BUILD") : "build";
    char cache[512];
    snprintf(cache, sizeof cache, "%s/codegen-nvrtc-cache", build);
    static const char *const nodes[] = {"talker", "code_predictor"};
    static const int page_size[] = {16, 4}; /* the talker's kv_pool, the predictor's frame */
    static const int group[] = {2, 2};      /* query heads per KV head: 4 / 2, 2 / 1 */
    char done[64][MS_KERNEL_URI_MAX];
    int n_done = 0, n_paged = 0, n_embed = 0, n_select = 0;
    for (int k = 0; k < 2; k++) {
        const ms_md_facts *f = ms_engine_node_facts(e, nodes[k]);
        assert_non_null(f);
        assert_int_equal(f->head_dim, 16);
        ms_kernel_spec specs[MS_MD_MAX_KERNEL_SPECS];
        int n = 0;
        if (ms_md_kernel_specs(&ms_talker_desc, f, page_size[k], specs, MS_MD_MAX_KERNEL_SPECS,
                               &n, &err) != MS_OK)
            fail_msg("%s", err.msg);
        assert_int_equal(n, (int)ms_talker_desc.n_kernels);
        for (int i = 0; i < n; i++) {
            char uri[MS_KERNEL_URI_MAX], stem[MS_KERNEL_URI_MAX], defs[256], path[1200];
            assert_int_equal(ms_kernel_spec_uri(&specs[i], 90, uri, sizeof uri, &err), MS_OK);
            bool seen = false;
            for (int j = 0; j < n_done && !seen; j++)
                seen = strcmp(done[j], uri) == 0;
            if (seen)
                continue;
            assert_true(n_done < 64);
            snprintf(done[n_done++], MS_KERNEL_URI_MAX, "%s", uri);
            if (specs[i].page_size > 0) {
                assert_int_equal(specs[i].page_size, page_size[k]);
                n_paged++;
            }
            if (specs[i].group > 0)
                assert_int_equal(specs[i].group, group[k]);
            n_embed += specs[i].op == MS_KERNEL_OP_EMBED; /* the talker's frame embedding */
            assert_int_equal(ms_kernel_spec_stem(&specs[i], stem, sizeof stem, &err), MS_OK);
            snprintf(path, sizeof path, "%s/gen/talker/kernels/%s.cu", build, stem);
            char *text = read_text(path);
            assert_int_equal(ms_kernel_spec_shape_defines(&specs[i], defs, sizeof defs, &err),
                             MS_OK);
            /* [scratch] the predictor's code.first is the misc module's select_rows entry */
            if (specs[i].op == MS_KERNEL_OP_MISC)
                n_select += strstr(text, "ms_select_rows(const ms_misc_params p)") != NULL;
            char *src = ms_asprintf("%s%s", defs, text);
            assert_non_null(src);
            ms_cubin cb = {0};
            if (ms_nvrtc_compile(uri, src, 90, cache, &cb, &err) != MS_OK)
                fail_msg("%s (node %s): %s", uri, nodes[k], err.msg);
            assert_true(cb.size > 0);
            printf("%s: %s compiled\n", nodes[k], uri);
            ms_nvrtc_cubin_free(&cb);
            ms_free(src);
            ms_free(text);
        }
    }
    /* the predictor's attention and RoPE instances are its own (pages of one frame) */
    assert_true(n_paged >= 6);
    /* [codes] the talker embeds its frames' codes on the device: the gather and the add
       (misc) instances are listed */
    assert_int_equal(n_embed, 1);
    assert_int_equal(n_select, 1);
    bool entry = false;
    for (int i = 0; ms_kernel_op_entry(MS_KERNEL_OP_MISC, i) != NULL; i++)
        entry = entry || strcmp(ms_kernel_op_entry(MS_KERNEL_OP_MISC, i), "ms_select_rows") == 0;
    assert_true(entry);
    ms_engine_free(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_talker_kernel_instances),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
