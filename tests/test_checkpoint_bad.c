/*
 * test_checkpoint_bad.c - corrupt and mismatched checkpoints: each must fail with a non-OK status and
 * a one-line message naming the file and the problem, leak nothing, and never crash (run under
 * ASan/UBSan by `make test`). Corrupt files are written into a mkdtemp folder; fixtures are only read.
 */
#include "ms_test.h"

#include <dirent.h>
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
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/ms_test_ckbad_XXXXXX");
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

/* Write a safetensors file from a header text (length prefix computed) and `n_data` data bytes. */
static const char *write_raw(const char *name, const char *header, size_t n_data) {
    const char *p = tmp_path(name);
    FILE *fp = fopen(p, "wb");
    assert_non_null(fp);
    uint64_t n = strlen(header);
    fwrite(&n, 8, 1, fp);
    fwrite(header, 1, n, fp);
    for (size_t i = 0; i < n_data; i++)
        fputc((int)(i & 0xff), fp);
    fclose(fp);
    return p;
}

/* Copy the first `n` bytes of a fixture (or all, n = SIZE_MAX) to a temp file. */
static const char *copy_prefix(const char *fixture, const char *name, size_t n) {
    FILE *in = fopen(ms_test_fixture(fixture), "rb");
    assert_non_null(in);
    const char *p = tmp_path(name);
    FILE *out = fopen(p, "wb");
    assert_non_null(out);
    char buf[65536];
    size_t left = n, got;
    while (left > 0 && (got = fread(buf, 1, MS_MIN(left, sizeof buf), in)) > 0) {
        fwrite(buf, 1, got, out);
        left -= got;
    }
    fclose(in);
    fclose(out);
    return p;
}

/* Open `path` as a checkpoint and expect failure `want` with a one-line message naming `file_part`
 * and containing `what`. */
static void expect_open_fails(const char *path, ms_status want, const char *file_part, const char *what) {
    ms_error err = {0};
    ms_ckpt *ck = NULL;
    ms_status st = ms_ckpt_init(&ck, path, &err);
    if (st == MS_OK) {
        ms_ckpt_free(ck);
        fail_msg("%s opened, expected failure '%s'", path, what);
    }
    assert_null(ck);
    printf("  %-22s %s\n", ms_status_str(st), err.msg);
    if (st != want || strstr(err.msg, file_part) == NULL || strstr(err.msg, what) == NULL ||
        strchr(err.msg, '\n') != NULL)
        fail_msg("status %s, message '%s'; expected %s naming '%s' and saying '%s'", ms_status_str(st), err.msg,
                 ms_status_str(want), file_part, what);
}

#define ENTRY(name, dtype, shape, b, e) \
    "\"" name "\":{\"dtype\":\"" dtype "\",\"shape\":" shape ",\"data_offsets\":[" #b "," #e "]}"

/* ---- truncation ---- */

static void test_truncated_files(void **state) {
    (void)state;
    const char *fx = "hf/llama_gqa/model.safetensors";
    /* cut in the data region: the last tensors run past the end */
    expect_open_fails(copy_prefix(fx, "half.safetensors", 1300000), MS_ERR_FORMAT, "half.safetensors",
                      "run past the data region");
    /* cut inside the header */
    expect_open_fails(copy_prefix(fx, "hdr.safetensors", 1000), MS_ERR_FORMAT, "hdr.safetensors",
                      "exceeds the file");
    /* shorter than the length prefix; empty */
    expect_open_fails(copy_prefix(fx, "five.safetensors", 5), MS_ERR_FORMAT, "five.safetensors", "too short");
    expect_open_fails(copy_prefix(fx, "empty.safetensors", 0), MS_ERR_FORMAT, "empty.safetensors", "0 bytes");
    /* one byte short */
    expect_open_fails(copy_prefix(fx, "short1.safetensors", 2607703), MS_ERR_FORMAT, "short1.safetensors",
                      "'model.norm.weight'");
}

static void test_unreadable_paths(void **state) {
    (void)state;
    expect_open_fails(tmp_path("nope.safetensors"), MS_ERR_NOT_FOUND, "nope.safetensors", "No such file");
    expect_open_fails(tmp_dir, MS_ERR_NOT_FOUND, tmp_dir, "neither model.safetensors nor");
    ms_error err = {0};
    ms_st_file *f = NULL;
    assert_int_equal(ms_st_file_init(&f, tmp_dir, &err), MS_ERR_IO);
    assert_non_null(strstr(err.msg, "not a regular file"));
}

/* ---- header lies ---- */

static void test_header_lying_about_offsets(void **state) {
    (void)state;
    expect_open_fails(write_raw("past.safetensors", "{" ENTRY("w", "F32", "[4]", 0, 16) "}", 8), MS_ERR_FORMAT,
                      "past.safetensors", "tensor 'w': data_offsets [0, 16] run past the data region (8 bytes");
    expect_open_fails(write_raw("rev.safetensors", "{" ENTRY("w", "F32", "[0]", 8, 0) "}", 8), MS_ERR_FORMAT,
                      "rev.safetensors", "begin after end");
    expect_open_fails(write_raw("size.safetensors", "{" ENTRY("w", "F32", "[3, 2]", 0, 16) "}", 16),
                      MS_ERR_FORMAT, "size.safetensors", "span 16 bytes, but F32 [3, 2] needs 24");
    expect_open_fails(write_raw("overlap.safetensors",
                                "{" ENTRY("a", "F32", "[4]", 0, 16) "," ENTRY("b", "F32", "[2]", 8, 16) "}", 16),
                      MS_ERR_FORMAT, "overlap.safetensors", "overlaps tensor 'a'");
    expect_open_fails(write_raw("hole.safetensors",
                                "{" ENTRY("a", "F32", "[2]", 0, 8) "," ENTRY("b", "F32", "[2]", 12, 20) "}", 20),
                      MS_ERR_FORMAT, "hole.safetensors", "hole of 4 bytes before tensor 'b'");
    expect_open_fails(write_raw("tail.safetensors", "{" ENTRY("a", "F32", "[2]", 0, 8) "}", 12), MS_ERR_FORMAT,
                      "tail.safetensors", "4 bytes after the last tensor");
    expect_open_fails(write_raw("neg.safetensors", "{" ENTRY("a", "F32", "[-2]", 0, 8) "}", 8), MS_ERR_FORMAT,
                      "neg.safetensors", "shape[0] is not a non-negative integer");
    expect_open_fails(write_raw("negoff.safetensors", "{" ENTRY("a", "F32", "[2]", -8, 0) "}", 8), MS_ERR_FORMAT,
                      "negoff.safetensors", "data_offsets are not non-negative integers");
    expect_open_fails(write_raw("ovf.safetensors",
                                "{" ENTRY("a", "F32", "[4294967296, 4294967296]", 0, 8) "}", 8),
                      MS_ERR_FORMAT, "ovf.safetensors", "overflows");
    expect_open_fails(write_raw("rank.safetensors", "{" ENTRY("a", "F32", "[1,1,1,1,1,1,1,1,1]", 0, 4) "}", 4),
                      MS_ERR_UNSUPPORTED, "rank.safetensors", "rank 9");
    expect_open_fails(write_raw("nooff.safetensors", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4),
                      MS_ERR_FORMAT, "nooff.safetensors", "no 'data_offsets'");
    expect_open_fails(write_raw("noshape.safetensors", "{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4),
                      MS_ERR_FORMAT, "noshape.safetensors", "no array 'shape'");
    expect_open_fails(write_raw("meta.safetensors", "{\"__metadata__\":{\"format\":1}}", 0), MS_ERR_FORMAT,
                      "meta.safetensors", "__metadata__ entry 'format' is not a string");
}

static void test_header_not_json_or_insane_length(void **state) {
    (void)state;
    expect_open_fails(write_raw("bad.safetensors", "{\"w\": {\"dtype\": \"F32\",", 0), MS_ERR_PARSE,
                      "bad.safetensors", "header is not valid JSON");
    expect_open_fails(write_raw("arr.safetensors", "[1]", 0), MS_ERR_FORMAT, "arr.safetensors",
                      "does not start with '{'");
    expect_open_fails(write_raw("dup.safetensors",
                                "{" ENTRY("a", "F32", "[1]", 0, 4) "," ENTRY("a", "F32", "[1]", 4, 8) "}", 8),
                      MS_ERR_PARSE, "dup.safetensors", "duplicate");
    /* a length prefix of 2^62 */
    const char *p = tmp_path("huge.safetensors");
    FILE *fp = fopen(p, "wb");
    assert_non_null(fp);
    uint64_t n = (uint64_t)1 << 62;
    fwrite(&n, 8, 1, fp);
    fputs("{}", fp);
    fclose(fp);
    expect_open_fails(p, MS_ERR_FORMAT, "huge.safetensors", "header length 4611686018427387904 is not sane");
}

/* ---- dtypes ---- */

static void test_wrong_dtypes(void **state) {
    (void)state;
    /* integer tensors are data, not weights: the reader takes them, a checkpoint refuses them */
    const char *i64 = write_raw("i64.safetensors", "{" ENTRY("ids", "I64", "[2]", 0, 16) "}", 16);
    expect_open_fails(i64, MS_ERR_UNSUPPORTED, "i64.safetensors",
                      "tensor 'ids' has dtype I64, not supported for weights (supported: F32, BF16, F16)");
    ms_st_file *sf = NULL;
    ms_error ferr = {0};
    assert_int_equal(ms_st_file_init(&sf, i64, &ferr), MS_OK);
    ms_st_file_free(sf);
    const char *u8 = write_raw("u8.safetensors", "{" ENTRY("mask", "U8", "[4]", 0, 4) "}", 4);
    expect_open_fails(u8, MS_ERR_UNSUPPORTED, "u8.safetensors",
                      "tensor 'mask' has dtype U8, not supported (supported: F32, BF16, F16; I32, I64 for data)");
    assert_int_equal(ms_st_file_init(&sf, u8, &ferr), MS_ERR_UNSUPPORTED);
    assert_null(sf);
    expect_open_fails(write_raw("f64.safetensors", "{" ENTRY("w", "F64", "[2]", 0, 16) "}", 16), MS_ERR_UNSUPPORTED,
                      "f64.safetensors", "tensor 'w' has dtype F64, not supported");
    expect_open_fails(write_raw("q4.safetensors", "{" ENTRY("w", "Q4_K", "[2]", 0, 16) "}", 16), MS_ERR_FORMAT,
                      "q4.safetensors", "unknown dtype 'Q4_K'");
    /* a valid BF16 tensor where the model only accepts F32 */
    const char *p = write_raw("bf16.safetensors", "{" ENTRY("w", "BF16", "[2, 2]", 0, 8) "}", 8);
    ms_error err = {0};
    ms_ckpt *ck = NULL;
    assert_int_equal(ms_ckpt_init(&ck, p, &err), MS_OK);
    const int64_t shape[2] = {2, 2};
    assert_int_equal(ms_ckpt_expect_tensor(ck, "w", MS_ST_DTYPE_BIT(MS_ST_DTYPE_F32), 2, shape, NULL, &err),
                     MS_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "bf16.safetensors: tensor 'w' has dtype BF16, the model accepts F32"));
    float *f = NULL;
    assert_int_equal(ms_ckpt_load_f32(ck, "w", MS_ST_DTYPE_BIT(MS_ST_DTYPE_F16), 2, shape, &f, &err),
                     MS_ERR_FORMAT);
    assert_null(f);
    assert_int_equal(ms_ckpt_load_f32(ck, "w", MS_ST_DTYPES_FLOAT, 2, shape, &f, &err), MS_OK);
    ms_free(f);
    ms_ckpt_free(ck);
}

/* ---- declared weights vs the checkpoint ---- */

static void test_missing_tensor_and_shape_mismatch(void **state) {
    (void)state;
    ms_error err = {0};
    ms_ckpt *ck = NULL;
    assert_int_equal(ms_ckpt_init(&ck, ms_test_fixture("hf/qwen3"), &err), MS_OK);
    const int64_t lm[2] = {512, 96};
    const ms_st_tensor *t = (const ms_st_tensor *)1;
    assert_int_equal(ms_ckpt_expect_tensor(ck, "lm_head.weight", MS_ST_DTYPES_FLOAT, 2, lm, &t, &err),
                     MS_ERR_NOT_FOUND);
    assert_null(t);
    assert_non_null(strstr(err.msg, "qwen3/model.safetensors: tensor 'lm_head.weight' not found (the model "
                                    "declares it as [512, 96])"));
    const int64_t wrong[2] = {192, 128};
    assert_int_equal(ms_ckpt_expect_tensor(ck, "model.layers.0.self_attn.q_proj.weight", MS_ST_DTYPES_FLOAT, 2,
                                           wrong, NULL, &err),
                     MS_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "qwen3/model.safetensors: tensor 'model.layers.0.self_attn.q_proj.weight' "
                                    "has shape [192, 96], the model declares [192, 128]"));
    const int64_t rank3[3] = {192, 96, 1};
    assert_int_equal(ms_ckpt_expect_tensor(ck, "model.layers.0.self_attn.q_proj.weight", MS_ST_DTYPES_FLOAT, 3,
                                           rank3, NULL, &err),
                     MS_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "has shape [192, 96], the model declares [192, 96, 1]"));
    float *f = (float *)1;
    assert_int_equal(ms_ckpt_load_f32(ck, "model.norm.weight", MS_ST_DTYPES_FLOAT, 1, (const int64_t[]){128}, &f,
                                      &err),
                     MS_ERR_FORMAT);
    assert_null(f);
    ms_ckpt_free(ck);
}

/* ---- sharded index problems ---- */

static void write_text(const char *name, const char *text) {
    FILE *fp = fopen(tmp_path(name), "w");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
}

static void test_bad_shard_indexes(void **state) {
    (void)state;
    write_raw("s1.safetensors", "{" ENTRY("a", "F32", "[2]", 0, 8) "," ENTRY("b", "F32", "[1]", 8, 12) "}", 12);
    write_raw("s2.safetensors", "{" ENTRY("c", "F32", "[1]", 0, 4) "}", 4);
    const char *idx = tmp_path("model.safetensors.index.json");

    write_text("model.safetensors.index.json",
               "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s1.safetensors\", \"c\": \"s2.safetensors\"}}");
    ms_error err = {0};
    ms_ckpt *ck = NULL;
    if (ms_ckpt_init(&ck, tmp_dir, &err) != MS_OK)
        fail_msg("%s", err.msg);
    assert_int_equal(ms_ckpt_n_files(ck), 2);
    assert_int_equal(ms_ckpt_n_tensors(ck), 3);
    ms_ckpt_free(ck);

    write_text("model.safetensors.index.json",
               "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s1.safetensors\", \"c\": \"s3.safetensors\"}}");
    expect_open_fails(tmp_dir, MS_ERR_IO, "s3.safetensors", "cannot open");
    write_text("model.safetensors.index.json",
               "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s2.safetensors\", \"c\": \"s2.safetensors\"}}");
    expect_open_fails(idx, MS_ERR_FORMAT, "model.safetensors.index.json",
                      "tensor 'b' is mapped to s2.safetensors but stored in");
    write_text("model.safetensors.index.json",
               "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s1.safetensors\", \"c\": \"s2.safetensors\","
               " \"d\": \"s2.safetensors\"}}");
    expect_open_fails(idx, MS_ERR_FORMAT, "model.safetensors.index.json",
                      "weight_map lists tensor 'd' but shard s2.safetensors does not hold it");
    write_text("model.safetensors.index.json",
               "{\"weight_map\": {\"a\": \"s1.safetensors\", \"c\": \"s2.safetensors\"}}");
    expect_open_fails(idx, MS_ERR_FORMAT, "model.safetensors.index.json",
                      "holds tensor 'b' that weight_map does not list");
    write_text("model.safetensors.index.json", "{\"weight_map\": {\"a\": \"../s1.safetensors\"}}");
    expect_open_fails(idx, MS_ERR_FORMAT, "model.safetensors.index.json", "outside the checkpoint folder");
    write_text("model.safetensors.index.json", "{\"weight_map\": {\"a\": 3}}");
    expect_open_fails(idx, MS_ERR_FORMAT, "model.safetensors.index.json", "'a' is not a file name");
    write_text("model.safetensors.index.json", "{\"metadata\": {}}");
    expect_open_fails(idx, MS_ERR_FORMAT, "model.safetensors.index.json", "no 'weight_map' object");
    write_text("model.safetensors.index.json", "{\"weight_map\": {\"a\": \"s1.safetensors\",\n");
    expect_open_fails(tmp_dir, MS_ERR_PARSE, "model.safetensors.index.json:2:", "malformed JSON");
    /* the same tensor in two shards */
    write_raw("s3.safetensors", "{" ENTRY("a", "F32", "[1]", 0, 4) "}", 4);
    write_text("model.safetensors.index.json",
               "{\"weight_map\": {\"a\": \"s3.safetensors\", \"b\": \"s1.safetensors\", \"c\": \"s2.safetensors\"}}");
    expect_open_fails(idx, MS_ERR_FORMAT, "model.safetensors.index.json", "tensor 'a' appears in both");
    /* a corrupt shard is reported by its own name */
    write_raw("s2.safetensors", "{" ENTRY("c", "F32", "[1]", 0, 8) "}", 4);
    write_text("model.safetensors.index.json",
               "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": \"s1.safetensors\", \"c\": \"s2.safetensors\"}}");
    expect_open_fails(idx, MS_ERR_FORMAT, "s2.safetensors", "tensor 'c'");
}

/* Seeded random corruption of a small valid file: each open either fails with a one-line message or
 * succeeds and every tensor converts; ASan/UBSan (make test) catch any out-of-bounds read. */
static void test_random_corruption_never_crashes(void **state) {
    (void)state;
    ms_error err = {0};
    const char *good = tmp_path("good.safetensors");
    ms_st_writer *w = NULL;
    assert_int_equal(ms_st_writer_init(&w, good, &err), MS_OK);
    assert_int_equal(ms_st_writer_add_tensor(w, "a", MS_ST_DTYPE_F32, 2, (const int64_t[]){3, 4}, &err), MS_OK);
    assert_int_equal(ms_st_writer_add_tensor(w, "b", MS_ST_DTYPE_BF16, 1, (const int64_t[]){5}, &err), MS_OK);
    assert_int_equal(ms_st_writer_add_tensor(w, "c", MS_ST_DTYPE_F16, 1, (const int64_t[]){3}, &err), MS_OK);
    unsigned char data[48 + 10 + 6];
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (unsigned char)(i * 7);
    assert_int_equal(ms_st_writer_write(w, data, sizeof data, &err), MS_OK);
    assert_int_equal(ms_st_writer_finish(w, &err), MS_OK);
    ms_st_writer_free(w);
    FILE *fp = fopen(good, "rb");
    assert_non_null(fp);
    unsigned char orig[1024];
    size_t n = fread(orig, 1, sizeof orig, fp);
    fclose(fp);
    assert_true(n > 64 && n < sizeof orig);

    uint64_t rng = 12345;
    int opened = 0, failed = 0;
    const char *bad = tmp_path("mut.safetensors");
    for (int iter = 0; iter < 400; iter++) {
        unsigned char buf[1024];
        memcpy(buf, orig, n);
        size_t len = n;
        int edits = 1 + (int)((rng = rng * 6364136223846793005ull + 1442695040888963407ull) >> 62);
        for (int e = 0; e < edits; e++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            size_t pos = (size_t)(rng >> 33) % len;
            unsigned kind = (unsigned)(rng >> 20) % 4;
            if (kind == 0)
                buf[pos] = (unsigned char)(rng >> 8);          /* random byte */
            else if (kind == 1)
                buf[pos] = (unsigned char)"0123456789,[]{}\":-"[(rng >> 8) % 16];  /* JSON-ish byte */
            else if (kind == 2)
                len = pos + 1;                                 /* truncate */
            else if (pos < 8)
                buf[pos] ^= 0x01;                              /* header length off by a bit */
        }
        fp = fopen(bad, "wb");
        assert_non_null(fp);
        fwrite(buf, 1, len, fp);
        fclose(fp);
        ms_ckpt *ck = NULL;
        ms_status st = ms_ckpt_init(&ck, bad, &err);
        if (st != MS_OK) {
            assert_null(ck);
            assert_non_null(strstr(err.msg, "mut.safetensors"));
            assert_null(strchr(err.msg, '\n'));
            failed++;
            continue;
        }
        for (size_t i = 0; i < ms_ckpt_n_tensors(ck); i++) {
            const ms_st_tensor *t = ms_ckpt_tensor_at(ck, i);
            float *f = ms_malloc(t->n_elems * sizeof *f + 1);
            assert_non_null(f);
            assert_int_equal(ms_st_tensor_to_f32(t, f, t->n_elems, &err), MS_OK);
            ms_free(f);
        }
        ms_ckpt_free(ck);
        opened++;
    }
    printf("  corruption: %d rejected, %d still valid\n", failed, opened);
    assert_true(failed > 300);
}

/* Allocation failures while opening a single file: OOM or success, never a leak. */
static void test_single_open_survives_allocation_failures(void **state) {
    (void)state;
    int failures = 0;
    for (int64_t k = 1; k < 200; k++) {
        ms_error err = {0};
        ms_ckpt *ck = NULL;
        int64_t live = ms_alloc_get_stats().live_blocks;
        ms_alloc_fail_nth(k);
        ms_status st = ms_ckpt_init(&ck, ms_test_fixture("hf/llama_gqa"), &err);
        ms_alloc_fail_nth(0);
        if (st == MS_OK) {
            ms_ckpt_free(ck);
            assert_int_equal(ms_alloc_get_stats().live_blocks, live);
            break;
        }
        assert_int_equal(st, MS_ERR_OOM);
        assert_int_equal(ms_alloc_get_stats().live_blocks, live);
        failures++;
    }
    assert_true(failures > 30);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        tmp_test(test_truncated_files),
        tmp_test(test_unreadable_paths),
        tmp_test(test_header_lying_about_offsets),
        tmp_test(test_header_not_json_or_insane_length),
        tmp_test(test_wrong_dtypes),
        ms_unit_test(test_missing_tensor_and_shape_mismatch),
        tmp_test(test_bad_shard_indexes),
        tmp_test(test_random_corruption_never_crashes),
        ms_unit_test(test_single_open_survives_allocation_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
