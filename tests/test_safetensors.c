/*
 * test_safetensors.c - safetensors reader and writer, checkpoints (single file and sharded), dtype
 * conversions; against the real checkpoints in ../shared/fixtures/hf (read-only) and files written
 * into a mkdtemp folder.
 */
#include "ms_test.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint.h"
#include "safetensors.h"

#include "ms_test_impl.h"

/* ---- helpers ---- */

static char tmp_dir[256];

static int tmp_setup(void **state) {
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/ms_test_st_XXXXXX");
    if (mkdtemp(tmp_dir) == NULL)
        return -1;
    return ms_test_leak_setup(state);
}

static int tmp_teardown(void **state) {
    DIR *d = opendir(tmp_dir);
    if (d != NULL) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char p[512];
            snprintf(p, sizeof p, "%s/%s", tmp_dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(tmp_dir);
    return ms_test_leak_teardown(state);
}

#define tmp_test(f) cmocka_unit_test_setup_teardown(f, tmp_setup, tmp_teardown)

static const char *tmp_path(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmp_dir, name);
    return buf[k];
}

static const char *const causal_fixtures[] = {"llama_gqa", "llama31_rope", "llama31_rope_legacy", "qwen3",
                                              "mistral_window", "llama_cfg", "qwen2vl_mrope", "whisper_tiny"};

/* ---- dtype conversions ---- */

static void test_bf16_conversions(void **state) {
    (void)state;
    assert_int_equal(ms_f32_to_bf16(1.0f), 0x3f80);
    assert_true(ms_bf16_to_f32(0x3f80) == 1.0f);
    assert_true(ms_bf16_to_f32(0xc040) == -3.0f);
    /* ties round to even */
    float tie_down, tie_up, above;
    uint32_t b1 = 0x3f808000u, b2 = 0x3f818000u, b3 = 0x3f808001u;
    memcpy(&tie_down, &b1, 4);
    memcpy(&tie_up, &b2, 4);
    memcpy(&above, &b3, 4);
    assert_int_equal(ms_f32_to_bf16(tie_down), 0x3f80);
    assert_int_equal(ms_f32_to_bf16(tie_up), 0x3f82);
    assert_int_equal(ms_f32_to_bf16(above), 0x3f81);
    assert_true(isnan(ms_bf16_to_f32(ms_f32_to_bf16(NAN))));
    assert_true(isinf(ms_bf16_to_f32(ms_f32_to_bf16(INFINITY))));
    /* every bf16 value round-trips through float */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = ms_bf16_to_f32((uint16_t)h);
        if (!isnan(f))
            assert_int_equal(ms_f32_to_bf16(f), h);
    }
}

static void test_f16_conversions(void **state) {
    (void)state;
    assert_true(ms_f16_to_f32(0x3c00) == 1.0f);
    assert_true(ms_f16_to_f32(0xc000) == -2.0f);
    assert_true(ms_f16_to_f32(0x7bff) == 65504.0f);
    assert_true(ms_f16_to_f32(0x0001) == 0x1p-24f);
    assert_true(ms_f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
    assert_true(isinf(ms_f16_to_f32(0x7c00)));
    assert_true(isnan(ms_f16_to_f32(0x7e00)));
    assert_int_equal(ms_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(ms_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(ms_f32_to_f16(0.5f * 0x1p-24f), 0x0000);  /* tie to even: 0 */
    assert_int_equal(ms_f32_to_f16(1.5f * 0x1p-24f), 0x0002);  /* tie to even: 2 */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = ms_f16_to_f32((uint16_t)h);
        if (!isnan(f))
            assert_int_equal(ms_f32_to_f16(f), h);
    }
}

static void test_dtype_names(void **state) {
    (void)state;
    ms_st_dtype d;
    assert_int_equal(ms_st_dtype_parse("BF16", &d), MS_OK);
    assert_int_equal(d, MS_ST_DTYPE_BF16);
    assert_int_equal(ms_st_dtype_parse("I64", &d), MS_OK);
    assert_int_equal(d, MS_ST_DTYPE_I64);
    assert_int_equal(ms_st_dtype_size(d), 8);
    assert_int_equal(ms_st_dtype_parse("U8", &d), MS_ERR_UNSUPPORTED);
    assert_int_equal(ms_st_dtype_parse("F64", &d), MS_ERR_UNSUPPORTED);
    assert_int_equal(ms_st_dtype_parse("F8_E4M3", &d), MS_ERR_UNSUPPORTED);
    assert_int_equal(ms_st_dtype_parse("f32", &d), MS_ERR_FORMAT);
    char buf[64];
    ms_st_dtype_mask_str(MS_ST_DTYPES_FLOAT, buf, sizeof buf);
    assert_string_equal(buf, "F32, BF16, F16");
    ms_st_shape_str(2, (const int64_t[]){512, 128}, buf, sizeof buf);
    assert_string_equal(buf, "[512, 128]");
}

/* ---- fixtures ---- */

static void test_fixtures_load_and_validate(void **state) {
    (void)state;
    for (size_t k = 0; k < MS_ARRAY_LEN(causal_fixtures); k++) {
        char rel[128];
        snprintf(rel, sizeof rel, "hf/%s", causal_fixtures[k]);
        ms_error err = {0};
        ms_ckpt *ck = NULL;
        ms_status st = ms_ckpt_init(&ck, ms_test_fixture(rel), &err);
        if (st != MS_OK)
            fail_msg("%s: %s", rel, err.msg);
        assert_int_equal(ms_ckpt_n_files(ck), 1);
        assert_true(ms_ckpt_n_tensors(ck) > 10);
        for (size_t i = 0; i < ms_ckpt_n_tensors(ck); i++) {
            const ms_st_tensor *t = ms_ckpt_tensor_at(ck, i);
            assert_int_equal(t->dtype, MS_ST_DTYPE_F32);
            assert_ptr_equal(ms_ckpt_find_tensor(ck, t->name), t);
            if (i > 0)
                assert_true(strcmp(ms_ckpt_tensor_at(ck, i - 1)->name, t->name) < 0);
        }
        ms_ckpt_free(ck);
    }
}

static void test_llama_gqa_tensors(void **state) {
    (void)state;
    ms_error err = {0};
    ms_ckpt *ck = NULL;
    assert_int_equal(ms_ckpt_init(&ck, ms_test_fixture("hf/llama_gqa"), &err), MS_OK);
    assert_non_null(strstr(ms_ckpt_path(ck), "hf/llama_gqa/model.safetensors"));
    assert_int_equal(ms_ckpt_n_tensors(ck), 30);  /* 3 layers * 9 + embed + norm + lm_head */
    assert_null(ms_ckpt_get_llama2c(ck));
    const int64_t q_shape[2] = {8 * 16, 128}, k_shape[2] = {2 * 16, 128}, down[2] = {128, 344};
    char name[96];
    for (int l = 0; l < 3; l++) {
        snprintf(name, sizeof name, "model.layers.%d.self_attn.q_proj.weight", l);
        assert_int_equal(ms_ckpt_expect_tensor(ck, name, MS_ST_DTYPES_FLOAT, 2, q_shape, NULL, &err), MS_OK);
        snprintf(name, sizeof name, "model.layers.%d.self_attn.k_proj.weight", l);
        assert_int_equal(ms_ckpt_expect_tensor(ck, name, MS_ST_DTYPES_FLOAT, 2, k_shape, NULL, &err), MS_OK);
        snprintf(name, sizeof name, "model.layers.%d.mlp.down_proj.weight", l);
        assert_int_equal(ms_ckpt_expect_tensor(ck, name, MS_ST_DTYPES_FLOAT, 2, down, NULL, &err), MS_OK);
    }
    /* wildcard dims */
    assert_int_equal(ms_ckpt_expect_tensor(ck, "lm_head.weight", MS_ST_DTYPE_BIT(MS_ST_DTYPE_F32), 2,
                                           (const int64_t[]){-1, 128}, NULL, &err),
                     MS_OK);
    assert_true(ms_ckpt_has_tensor(ck, "lm_head.weight"));
    assert_false(ms_ckpt_has_tensor(ck, "lm_head.bias"));

    /* f32 and bf16 loads agree with the zero-copy view */
    const ms_st_tensor *t = ms_ckpt_find_tensor(ck, "model.norm.weight");
    const float *view = ms_st_tensor_f32_data(t);
    assert_non_null(view);
    float *f = NULL;
    uint16_t *b = NULL;
    assert_int_equal(ms_ckpt_load_f32(ck, "model.norm.weight", MS_ST_DTYPES_FLOAT, 1, (const int64_t[]){128},
                                      &f, &err),
                     MS_OK);
    assert_int_equal(ms_ckpt_load_bf16(ck, "model.norm.weight", MS_ST_DTYPES_FLOAT, 1, (const int64_t[]){128},
                                       &b, &err),
                     MS_OK);
    for (int i = 0; i < 128; i++) {
        assert_true(f[i] == view[i]);
        assert_true(fabsf(ms_bf16_to_f32(b[i]) - view[i]) <= fabsf(view[i]) * 0x1p-8f);
    }
    ms_free(f);
    ms_free(b);
    ms_ckpt_free(ck);
}

static void test_tied_embeddings_have_no_lm_head(void **state) {
    (void)state;
    ms_error err = {0};
    ms_ckpt *ck = NULL;
    assert_int_equal(ms_ckpt_init(&ck, ms_test_fixture("hf/qwen3/model.safetensors"), &err), MS_OK);
    assert_false(ms_ckpt_has_tensor(ck, "lm_head.weight"));
    assert_true(ms_ckpt_has_tensor(ck, "model.embed_tokens.weight"));
    assert_true(ms_ckpt_has_tensor(ck, "model.layers.1.self_attn.q_norm.weight"));
    ms_ckpt_free(ck);
}

/* The reference outputs hold I32 ids next to F32 logits: readable through the file reader. */
static void test_reference_outputs_read(void **state) {
    (void)state;
    ms_error err = {0};
    ms_st_file *f = NULL;
    if (ms_st_file_init(&f, ms_test_fixture("hf/llama_gqa/reference.safetensors"), &err) != MS_OK)
        fail_msg("%s", err.msg);
    static const int64_t prompt_len[4] = {37, 5, 64, 1};
    for (int p = 0; p < 4; p++) {
        char name[64];
        snprintf(name, sizeof name, "p%d.input_ids", p);
        const ms_st_tensor *ids = ms_st_file_find_tensor(f, name);
        assert_non_null(ids);
        assert_int_equal(ids->dtype, MS_ST_DTYPE_I32);
        assert_int_equal(ids->n_dims, 1);
        assert_int_equal(ids->shape[0], prompt_len[p]);
        int32_t v[64];
        assert_int_equal(ms_st_tensor_to_i32(ids, v, ids->n_elems, &err), MS_OK);
        for (size_t i = 0; i < ids->n_elems; i++)
            assert_true(v[i] >= 0 && v[i] < 512);
        float x;
        assert_int_equal(ms_st_tensor_to_f32(ids, &x, 1, &err), MS_ERR_INVALID_ARG);
        assert_non_null(strstr(err.msg, "is I32, not a float tensor"));
        snprintf(name, sizeof name, "p%d.prefill_logits", p);
        const ms_st_tensor *lg = ms_st_file_find_tensor(f, name);
        assert_non_null(lg);
        assert_int_equal(lg->dtype, MS_ST_DTYPE_F32);
        assert_int_equal(lg->shape[0], prompt_len[p]);
        assert_int_equal(lg->shape[1], 512);
        assert_int_equal(ms_st_tensor_to_i32(lg, v, 1, &err), MS_ERR_INVALID_ARG);
        snprintf(name, sizeof name, "p%d.greedy_ids", p);
        assert_int_equal(ms_st_file_find_tensor(f, name)->shape[0], 40);
    }
    ms_st_file_free(f);
    /* I64 -> I32 with a range check */
    const char *path = tmp_path("i64.safetensors");
    ms_st_writer *w = NULL;
    assert_int_equal(ms_st_writer_init(&w, path, &err), MS_OK);
    assert_int_equal(ms_st_writer_add_tensor(w, "ok", MS_ST_DTYPE_I64, 1, (const int64_t[]){2}, &err), MS_OK);
    assert_int_equal(ms_st_writer_add_tensor(w, "big", MS_ST_DTYPE_I64, 1, (const int64_t[]){1}, &err), MS_OK);
    const int64_t vals[3] = {-5, 7, (int64_t)1 << 40};
    assert_int_equal(ms_st_writer_write(w, vals, sizeof vals, &err), MS_OK);
    assert_int_equal(ms_st_writer_finish(w, &err), MS_OK);
    ms_st_writer_free(w);
    assert_int_equal(ms_st_file_init(&f, path, &err), MS_OK);
    int32_t out[2];
    assert_int_equal(ms_st_tensor_to_i32(ms_st_file_find_tensor(f, "ok"), out, 2, &err), MS_OK);
    assert_int_equal(out[0], -5);
    assert_int_equal(out[1], 7);
    assert_int_equal(ms_st_tensor_to_i32(ms_st_file_find_tensor(f, "big"), out, 1, &err), MS_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "tensor 'big'[0] = 1099511627776 does not fit in int32"));
    ms_st_file_free(f);
}

/* ---- writer ---- */

static void test_writer_round_trip_all_dtypes(void **state) {
    (void)state;
    ms_error err = {0};
    ms_st_writer *w = NULL;
    const char *p = tmp_path("rt.safetensors");
    assert_int_equal(ms_st_writer_init(&w, p, &err), MS_OK);
    assert_int_equal(ms_st_writer_set_metadata(w, "format", "pt", &err), MS_OK);
    assert_int_equal(ms_st_writer_add_tensor(w, "b.f32", MS_ST_DTYPE_F32, 2, (const int64_t[]){2, 3}, &err), MS_OK);
    assert_int_equal(ms_st_writer_add_tensor(w, "a.bf16", MS_ST_DTYPE_BF16, 1, (const int64_t[]){3}, &err), MS_OK);
    assert_int_equal(ms_st_writer_add_tensor(w, "c.f16", MS_ST_DTYPE_F16, 1, (const int64_t[]){2}, &err), MS_OK);
    assert_int_equal(ms_st_writer_add_tensor(w, "empty", MS_ST_DTYPE_F32, 2, (const int64_t[]){0, 4}, &err), MS_OK);
    assert_int_equal(ms_st_writer_add_tensor(w, "a.bf16", MS_ST_DTYPE_F32, 0, NULL, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "declared twice"));
    const float fv[6] = {1, -2, 3.5f, 0.25f, 1e-3f, -7};
    const uint16_t bv[3] = {0x3f80, 0xc040, 0x0000};
    const uint16_t hv[2] = {0x3c00, 0x7bff};
    /* odd chunking across tensor boundaries */
    unsigned char all[24 + 6 + 4];
    memcpy(all, fv, 24);
    memcpy(all + 24, bv, 6);
    memcpy(all + 30, hv, 4);
    assert_int_equal(ms_st_writer_write(w, all, 7, &err), MS_OK);
    assert_int_equal(ms_st_writer_add_tensor(w, "late", MS_ST_DTYPE_F32, 0, NULL, &err), MS_ERR_INVALID_ARG);
    assert_int_equal(ms_st_writer_write(w, all + 7, 20, &err), MS_OK);
    assert_int_equal(ms_st_writer_write(w, all + 27, 7, &err), MS_OK);
    assert_int_equal(ms_st_writer_write(w, all, 1, &err), MS_ERR_INVALID_ARG);
    assert_int_equal(ms_st_writer_finish(w, &err), MS_OK);
    ms_st_writer_free(w);

    ms_st_file *f = NULL;
    if (ms_st_file_init(&f, p, &err) != MS_OK)
        fail_msg("%s", err.msg);
    assert_int_equal(ms_st_file_n_tensors(f), 4);
    assert_string_equal(ms_st_file_metadata(f, "format"), "pt");
    assert_null(ms_st_file_metadata(f, "nope"));
    const ms_st_tensor *t = ms_st_file_find_tensor(f, "b.f32");
    assert_non_null(t);
    assert_int_equal(t->file_offset % 8, 0);  /* header padded to 8 */
    assert_int_equal(t->n_dims, 2);
    assert_int_equal(t->shape[1], 3);
    float out[6];
    assert_int_equal(ms_st_tensor_to_f32(t, out, 6, &err), MS_OK);
    assert_memory_equal(out, fv, sizeof fv);
    assert_int_equal(ms_st_tensor_to_f32(t, out, 5, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "'b.f32' has 6 elements"));
    t = ms_st_file_find_tensor(f, "a.bf16");
    assert_int_equal(ms_st_tensor_to_f32(t, out, 3, &err), MS_OK);
    assert_true(out[0] == 1.0f && out[1] == -3.0f && out[2] == 0.0f);
    assert_null(ms_st_tensor_f32_data(t));
    t = ms_st_file_find_tensor(f, "c.f16");
    assert_int_equal(ms_st_tensor_to_f32(t, out, 2, &err), MS_OK);
    assert_true(out[0] == 1.0f && out[1] == 65504.0f);
    uint16_t bo[2];
    assert_int_equal(ms_st_tensor_to_bf16(t, bo, 2, &err), MS_OK);
    assert_int_equal(bo[0], 0x3f80);
    t = ms_st_file_find_tensor(f, "empty");
    assert_int_equal(t->n_elems, 0);
    assert_null(ms_st_file_find_tensor(f, "zzz"));
    ms_st_file_free(f);
}

static void test_writer_unfinished_removes_file(void **state) {
    (void)state;
    ms_error err = {0};
    ms_st_writer *w = NULL;
    const char *p = tmp_path("partial.safetensors");
    assert_int_equal(ms_st_writer_init(&w, p, &err), MS_OK);
    assert_int_equal(ms_st_writer_add_tensor(w, "x", MS_ST_DTYPE_F32, 1, (const int64_t[]){4}, &err), MS_OK);
    float v[2] = {1, 2};
    assert_int_equal(ms_st_writer_write(w, v, sizeof v, &err), MS_OK);
    assert_int_equal(ms_st_writer_finish(w, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "8 of 16 declared data bytes"));
    ms_st_writer_free(w);
    assert_int_not_equal(access(p, F_OK), 0);
    assert_int_equal(ms_st_writer_init(&w, "/nonexistent-dir/x.safetensors", &err), MS_ERR_IO);
    assert_non_null(strstr(err.msg, "/nonexistent-dir/x.safetensors: cannot create"));
}

/* A valid file whose header length is not a multiple of 4: every tensor is unaligned. */
static void test_unaligned_data_is_converted(void **state) {
    (void)state;
    const char *p = tmp_path("unaligned.safetensors");
    const char *hdr = "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,12]},"
                      "\"h\":{\"dtype\":\"F16\",\"shape\":[1],\"data_offsets\":[12,14]},"
                      "\"v\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[14,18]}} ";
    uint64_t n = strlen(hdr);
    if (n % 4 == 0)
        n -= 1;  /* drop the trailing space: keep it unaligned */
    FILE *fp = fopen(p, "wb");
    assert_non_null(fp);
    fwrite(&n, 8, 1, fp);
    fwrite(hdr, 1, n, fp);
    const float w[3] = {1.5f, -2.0f, 3.25f};
    const uint16_t h = 0xc000, v[2] = {0x4000, 0xbf80};
    fwrite(w, 4, 3, fp);
    fwrite(&h, 2, 1, fp);
    fwrite(v, 2, 2, fp);
    fclose(fp);
    ms_error err = {0};
    ms_st_file *f = NULL;
    if (ms_st_file_init(&f, p, &err) != MS_OK)
        fail_msg("%s", err.msg);
    const ms_st_tensor *t = ms_st_file_find_tensor(f, "w");
    assert_int_not_equal((uintptr_t)t->data % 4, 0);
    assert_null(ms_st_tensor_f32_data(t));
    float out[3];
    uint16_t bo[3];
    assert_int_equal(ms_st_tensor_to_f32(t, out, 3, &err), MS_OK);
    assert_memory_equal(out, w, sizeof w);
    assert_int_equal(ms_st_tensor_to_bf16(t, bo, 3, &err), MS_OK);
    assert_int_equal(bo[0], 0x3fc0);
    assert_int_equal(ms_st_tensor_to_f32(ms_st_file_find_tensor(f, "h"), out, 1, &err), MS_OK);
    assert_true(out[0] == -2.0f);
    assert_int_equal(ms_st_tensor_to_f32(ms_st_file_find_tensor(f, "v"), out, 2, &err), MS_OK);
    assert_true(out[0] == 2.0f && out[1] == -1.0f);
    ms_st_file_free(f);
}

/* ---- sharding ---- */

/* Copy tensors [from, to) of `src` into a new shard file at `path`. */
static void write_shard(const ms_st_file *src, size_t from, size_t to, const char *path) {
    ms_error err = {0};
    ms_st_writer *w = NULL;
    assert_int_equal(ms_st_writer_init(&w, path, &err), MS_OK);
    for (size_t i = from; i < to; i++) {
        const ms_st_tensor *t = ms_st_file_tensor_at(src, i);
        assert_int_equal(ms_st_writer_add_tensor(w, t->name, t->dtype, t->n_dims, t->shape, &err), MS_OK);
    }
    for (size_t i = from; i < to; i++) {
        const ms_st_tensor *t = ms_st_file_tensor_at(src, i);
        assert_int_equal(ms_st_writer_write(w, t->data, t->n_bytes, &err), MS_OK);
    }
    assert_int_equal(ms_st_writer_finish(w, &err), MS_OK);
    ms_st_writer_free(w);
}

/* Split `fixture`'s model.safetensors in two shards + index inside tmp_dir; returns the source. */
static ms_st_file *split_fixture(const char *fixture) {
    ms_error err = {0};
    ms_st_file *src = NULL;
    assert_int_equal(ms_st_file_init(&src, ms_test_fixture(fixture), &err), MS_OK);
    size_t n = ms_st_file_n_tensors(src), half = n / 2;
    write_shard(src, 0, half, tmp_path("model-00001-of-00002.safetensors"));
    write_shard(src, half, n, tmp_path("model-00002-of-00002.safetensors"));
    FILE *fp = fopen(tmp_path("model.safetensors.index.json"), "w");
    assert_non_null(fp);
    fprintf(fp, "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {");
    for (size_t i = 0; i < n; i++)
        fprintf(fp, "%s\"%s\": \"model-0000%d-of-00002.safetensors\"", i ? ", " : "",
                ms_st_file_tensor_at(src, i)->name, i < half ? 1 : 2);
    fprintf(fp, "}}\n");
    fclose(fp);
    return src;
}

static void test_sharded_checkpoint_loads_the_same_tensors(void **state) {
    (void)state;
    ms_st_file *src = split_fixture("hf/llama_gqa/model.safetensors");
    ms_error err = {0};
    ms_ckpt *ck = NULL;
    if (ms_ckpt_init(&ck, tmp_dir, &err) != MS_OK)
        fail_msg("%s", err.msg);
    assert_int_equal(ms_ckpt_n_files(ck), 2);
    assert_non_null(strstr(ms_ckpt_path(ck), "model.safetensors.index.json"));
    assert_int_equal(ms_ckpt_n_tensors(ck), ms_st_file_n_tensors(src));
    bool saw_second = false;
    for (size_t i = 0; i < ms_st_file_n_tensors(src); i++) {
        const ms_st_tensor *a = ms_st_file_tensor_at(src, i);
        const ms_st_tensor *b = ms_ckpt_find_tensor(ck, a->name);
        assert_non_null(b);
        assert_int_equal(a->dtype, b->dtype);
        assert_int_equal(a->n_dims, b->n_dims);
        assert_memory_equal(a->shape, b->shape, sizeof a->shape);
        assert_int_equal(a->n_bytes, b->n_bytes);
        assert_memory_equal(a->data, b->data, a->n_bytes);
        saw_second |= strstr(b->file_path, "00002-of") != NULL;
    }
    assert_true(saw_second);
    /* opening the index file directly is the same */
    ms_ckpt *ck2 = NULL;
    assert_int_equal(ms_ckpt_init(&ck2, tmp_path("model.safetensors.index.json"), &err), MS_OK);
    assert_int_equal(ms_ckpt_n_tensors(ck2), ms_ckpt_n_tensors(ck));
    ms_ckpt_free(ck2);
    ms_ckpt_free(ck);
    ms_st_file_free(src);
}

/* Every allocation of a sharded open may fail: the error is OOM (or the load succeeds) and nothing
 * leaks. */
static void test_sharded_open_survives_allocation_failures(void **state) {
    (void)state;
    ms_st_file *src = split_fixture("hf/llama_cfg/model.safetensors");
    ms_st_file_free(src);
    int failures = 0;
    for (int64_t k = 1; k < 500; k++) {
        ms_error err = {0};
        ms_ckpt *ck = NULL;
        int64_t live = ms_alloc_get_stats().live_blocks;
        ms_alloc_fail_nth(k);
        ms_status st = ms_ckpt_init(&ck, tmp_dir, &err);
        ms_alloc_fail_nth(0);
        if (st == MS_OK) {
            ms_ckpt_free(ck);
            assert_int_equal(ms_alloc_get_stats().live_blocks, live);
            break;
        }
        assert_int_equal(st, MS_ERR_OOM);
        assert_non_null(strstr(err.msg, "out of memory"));
        assert_int_equal(ms_alloc_get_stats().live_blocks, live);
        failures++;
    }
    assert_true(failures > 5);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_bf16_conversions),
        ms_unit_test(test_f16_conversions),
        ms_unit_test(test_dtype_names),
        ms_unit_test(test_fixtures_load_and_validate),
        ms_unit_test(test_llama_gqa_tensors),
        ms_unit_test(test_tied_embeddings_have_no_lm_head),
        tmp_test(test_reference_outputs_read),
        tmp_test(test_writer_round_trip_all_dtypes),
        tmp_test(test_writer_unfinished_removes_file),
        tmp_test(test_unaligned_data_is_converted),
        tmp_test(test_sharded_checkpoint_loads_the_same_tensors),
        tmp_test(test_sharded_open_survives_allocation_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
