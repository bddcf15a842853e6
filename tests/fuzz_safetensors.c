/*
 * fuzz_safetensors.c - libFuzzer target for safetensors files and the checkpoint loader
 * (runtime/safetensors.c, runtime/checkpoint.c).
 *
 * Input starting with '{': a model.safetensors.index.json, opened with ms_ckpt_init beside two
 * fixed valid shards (a.safetensors: "x" F32 [2, 3], "y" BF16 [4]; b.safetensors: "z" F16 [2]),
 * written once per process. Any other input: the bytes of model.safetensors, opened with
 * ms_st_file_init and ms_ckpt_init. On an opened file or checkpoint every tensor is read back
 * (metadata, look-up by name, conversion to f32 / bf16 / i32, the zero-copy view, the shape string)
 * and checked with ms_ckpt_expect_tensor against its own shape and a wrong one. A failure must be
 * one line and not out of memory, nothing may leak; ASan/UBSan catch the rest (the data lives in an
 * mmap, which ASan does not guard: every byte of it is read, so a view past the mapping faults).
 * Run it with `make fuzz FUZZ_TARGETS=safetensors`.
 */
#include "fuzz_util.h"

#include "checkpoint.h"
#include "safetensors.h"

static void fuzz_write_shard(const char *name, const char *const *names, const ms_st_dtype *dtypes,
                             const int64_t (*shapes)[2], const int *ranks, int n) {
    ms_error err = {0};
    ms_st_writer *w = NULL;
    if (ms_st_writer_init(&w, fuzz_path(name), &err) != MS_OK)
        goto fail;
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (ms_st_writer_add_tensor(w, names[i], dtypes[i], ranks[i], shapes[i], &err) != MS_OK)
            goto fail;
        size_t elems = 1;
        for (int d = 0; d < ranks[i]; d++)
            elems *= (size_t)shapes[i][d];
        total += elems * ms_st_dtype_size(dtypes[i]);
    }
    uint8_t bytes[256];
    for (size_t i = 0; i < sizeof bytes; i++)
        bytes[i] = (uint8_t)(i * 37u + 11u);
    if (total > sizeof bytes || ms_st_writer_write(w, bytes, total, &err) != MS_OK ||
        ms_st_writer_finish(w, &err) != MS_OK)
        goto fail;
    ms_st_writer_free(w);
    return;
fail:
    fprintf(stderr, "fuzz_safetensors: writing the fixed shard %s: %s\n", name, err.msg);
    abort();
}

static void fuzz_write_shards(void) {
    static bool done;
    if (done)
        return;
    done = true;
    static const char *const a_names[] = {"x", "y"};
    static const ms_st_dtype a_dtypes[] = {MS_ST_DTYPE_F32, MS_ST_DTYPE_BF16};
    static const int64_t a_shapes[][2] = {{2, 3}, {4, 0}};
    static const int a_ranks[] = {2, 1};
    fuzz_write_shard("a.safetensors", a_names, a_dtypes, a_shapes, a_ranks, 2);
    static const char *const b_names[] = {"z"};
    static const ms_st_dtype b_dtypes[] = {MS_ST_DTYPE_F16};
    static const int64_t b_shapes[][2] = {{2, 0}};
    static const int b_ranks[] = {1};
    fuzz_write_shard("b.safetensors", b_names, b_dtypes, b_shapes, b_ranks, 1);
}

/* Read every byte and every conversion of one validated tensor. */
static void fuzz_read_tensor(const ms_st_tensor *t) {
    ms_error err = {0};
    const uint8_t *p = t->data;
    volatile uint8_t sink = 0;
    for (size_t i = 0; i < t->n_bytes; i++)
        sink ^= p[i];
    (void)sink;
    if (t->n_elems > ((size_t)1 << 26)) {  /* the data is in the input, so this cannot happen */
        fprintf(stderr, "fuzz_safetensors: tensor '%s' claims %zu elements in a small file\n", t->name, t->n_elems);
        abort();
    }
    size_t n = t->n_elems;
    float *f = malloc((n ? n : 1) * sizeof *f);
    uint16_t *h = malloc((n ? n : 1) * sizeof *h);
    int32_t *i32 = malloc((n ? n : 1) * sizeof *i32);
    if (f == NULL || h == NULL || i32 == NULL)
        abort();
    fuzz_check_error("fuzz_safetensors", ms_st_tensor_to_f32(t, f, n, &err), &err);
    fuzz_check_error("fuzz_safetensors", ms_st_tensor_to_bf16(t, h, n, &err), &err);
    fuzz_check_error("fuzz_safetensors", ms_st_tensor_to_i32(t, i32, n, &err), &err);
    fuzz_check_error("fuzz_safetensors", ms_st_tensor_to_f32(t, f, n + 1, &err), &err);  /* count mismatch */
    const float *view = ms_st_tensor_f32_data(t);
    if (view != NULL && n > 0)
        sink ^= (uint8_t)(view[n - 1] > 0.0f);
    free(f);
    free(h);
    free(i32);
    char shape[256];
    ms_st_shape_str(t->n_dims, t->shape, shape, sizeof shape);
}

static void fuzz_read_ckpt(const ms_ckpt *ck) {
    ms_error err = {0};
    (void)ms_ckpt_path(ck);
    (void)ms_ckpt_n_files(ck);
    for (size_t i = 0; i < ms_ckpt_n_tensors(ck); i++) {
        const ms_st_tensor *t = ms_ckpt_tensor_at(ck, i);
        if (ms_ckpt_find_tensor(ck, t->name) == NULL || !ms_ckpt_has_tensor(ck, t->name)) {
            fprintf(stderr, "fuzz_safetensors: tensor %zu '%s' is not found by name\n", i, t->name);
            abort();
        }
        fuzz_read_tensor(t);
        const ms_st_tensor *got = NULL;
        ms_status st = ms_ckpt_expect_tensor(ck, t->name, MS_ST_DTYPES_FLOAT, t->n_dims, t->shape, &got, &err);
        fuzz_check_error("fuzz_safetensors", st, &err);
        int64_t wrong[MS_ST_MAX_DIMS + 1];
        memcpy(wrong, t->shape, sizeof t->shape);
        wrong[0] = t->n_dims > 0 ? t->shape[0] + 1 : 1;
        fuzz_check_error("fuzz_safetensors",
                         ms_ckpt_expect_tensor(ck, t->name, MS_ST_DTYPES_FLOAT, t->n_dims > 0 ? t->n_dims : 1,
                                               wrong, NULL, &err),
                         &err);
        if (st == MS_OK && t->n_elems <= 4096) {
            float *f = NULL;
            uint16_t *h = NULL;
            fuzz_check_error("fuzz_safetensors",
                             ms_ckpt_load_f32(ck, t->name, MS_ST_DTYPES_FLOAT, t->n_dims, t->shape, &f, &err), &err);
            fuzz_check_error("fuzz_safetensors",
                             ms_ckpt_load_bf16(ck, t->name, MS_ST_DTYPES_FLOAT, t->n_dims, t->shape, &h, &err), &err);
            ms_free(f);
            ms_free(h);
        }
    }
    fuzz_check_error("fuzz_safetensors",
                     ms_ckpt_expect_tensor(ck, "model.norm.weight", MS_ST_DTYPES_FLOAT, 1, (int64_t[]){-1}, NULL, &err),
                     &err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 1 << 20)
        return -1;
    int64_t live = ms_alloc_get_stats().live_blocks;
    ms_error err = {0};
    ms_status st;
    if (size > 0 && data[0] == '{') {
        fuzz_write_shards();
        const char *index = fuzz_write("model.safetensors.index.json", data, size);
        ms_ckpt *ck = NULL;
        st = ms_ckpt_init(&ck, index, &err);
        fuzz_check_error("fuzz_safetensors", st, &err);
        if (st == MS_OK)
            fuzz_read_ckpt(ck);
        ms_ckpt_free(ck);
    } else {
        const char *path = fuzz_write("model.safetensors", data, size);
        ms_st_file *f = NULL;
        st = ms_st_file_init(&f, path, &err);
        fuzz_check_error("fuzz_safetensors", st, &err);
        if (st == MS_OK) {
            (void)ms_st_file_metadata(f, "format");
            for (size_t i = 0; i < ms_st_file_n_tensors(f); i++) {
                const ms_st_tensor *t = ms_st_file_tensor_at(f, i);
                if (ms_st_file_find_tensor(f, t->name) != t) {
                    fprintf(stderr, "fuzz_safetensors: tensor %zu '%s' is not found by name\n", i, t->name);
                    abort();
                }
                fuzz_read_tensor(t);
            }
        }
        ms_st_file_free(f);
        ms_ckpt *ck = NULL;
        st = ms_ckpt_init(&ck, path, &err);
        fuzz_check_error("fuzz_safetensors", st, &err);
        if (st == MS_OK)
            fuzz_read_ckpt(ck);
        ms_ckpt_free(ck);
    }
    fuzz_check_leaks("fuzz_safetensors", live);
    return 0;
}
