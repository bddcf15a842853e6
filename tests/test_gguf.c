/*
 * test_gguf.c - the GGUF reader (gguf.h), ggml dequantization and quantization (gguf_quant.h) and
 * GGUF models as checkpoints (gguf_model.h, checkpoint.h, hf_config.h):
 *   - goldens: tests/gguf/dequant_goldens.gguf (written by tests/gguf/make_goldens.py with gguf-py's
 *     GGUFWriter) holds random valid blocks of F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K,
 *     Q5_K, Q6_K and gguf.quants.dequantize's float32 output: ours must be bit-identical;
 *   - metadata: every value type through the typed getters, string arrays, v2 and v3, alignment;
 *   - bad files: every truncation of a valid file, lying counts, string lengths and offsets,
 *     misalignment, overlap, unknown value and ggml types, nested arrays, absurd dimensions, a
 *     wrong version, architecture or tensor name: each a non-OK status and one line naming the
 *     file and the key or tensor, no leak (leak-checked, and run under ASan/UBSan);
 *   - models: a tiny llama GGUF written here opens as a checkpoint with Hugging Face names, the
 *     Q/K rows un-permuted (checked against LlamaModel.permute applied in the test), the config
 *     derived from llama.* keys; qwen2 is not permuted;
 *   - quantizers: q4_0 and q8_0 blocks byte-identical to gguf.quants.quantize (goldens); q4_0, q8_0,
 *     q4_k round trips within their step size, re-quantizing dequantized values stable;
 *   - mstar-mkckpt --format gguf (q8_0, q4_0, q4_k): the file loads back to exactly
 *     dequantize(quantize(x)) of the f32 safetensors checkpoint of the same seed and shape.
 */
#include "ms_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend.h"
#include "checkpoint.h"
#include "gguf.h"
#include "gguf_model.h"
#include "gguf_quant.h"
#include "hf_config.h"

#include "ms_test_impl.h"

#define GOLDENS "tests/gguf/dequant_goldens.gguf"

/* ---- a GGUF builder (little-endian bytes in a growing buffer) ---- */

typedef struct gb {
    uint8_t *p;
    size_t n, cap;
} gb;

static void gb_put(gb *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        assert_non_null(b->p);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void gb_u8(gb *b, uint8_t v) { gb_put(b, &v, 1); }
static void gb_u32(gb *b, uint32_t v) {
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    gb_put(b, x, 4);
}
static void gb_u64(gb *b, uint64_t v) {
    gb_u32(b, (uint32_t)v);
    gb_u32(b, (uint32_t)(v >> 32));
}
static void gb_f32(gb *b, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    gb_u32(b, u);
}
static void gb_str(gb *b, const char *s) {
    gb_u64(b, strlen(s));
    gb_put(b, s, strlen(s));
}
static void gb_header(gb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    gb_put(b, "GGUF", 4);
    gb_u32(b, version);
    gb_u64(b, n_tensors);
    gb_u64(b, n_kv);
}
static void gb_kv_u32(gb *b, const char *k, uint32_t v) { gb_str(b, k); gb_u32(b, MS_GGUF_UINT32); gb_u32(b, v); }
static void gb_kv_f32(gb *b, const char *k, float v) { gb_str(b, k); gb_u32(b, MS_GGUF_FLOAT32); gb_f32(b, v); }
static void gb_kv_str(gb *b, const char *k, const char *v) { gb_str(b, k); gb_u32(b, MS_GGUF_STRING); gb_str(b, v); }
static void gb_tinfo(gb *b, const char *name, int n_dims, const int64_t *ne, uint32_t type, uint64_t off) {
    gb_str(b, name);
    gb_u32(b, (uint32_t)n_dims);
    for (int i = 0; i < n_dims; i++)
        gb_u64(b, (uint64_t)ne[i]);
    gb_u32(b, type);
    gb_u64(b, off);
}
static void gb_pad(gb *b, size_t a) {
    while (b->n % a)
        gb_u8(b, 0);
}

/* Parse b from memory; returns the status, err filled. */
static ms_status parse(const gb *b, ms_gguf **g, ms_error *err) {
    memset(err, 0, sizeof *err);
    return ms_gguf_init_from_memory(g, "mem.gguf", b->p, b->n, err);
}

/* The parse must fail with `code` and a one-line message containing every `want` fragment. */
static void expect_bad(const gb *b, ms_status code, const char *want) {
    ms_gguf *g = NULL;
    ms_error err;
    ms_status st = parse(b, &g, &err);
    if (st == MS_OK) {
        ms_gguf_free(g);
        fail_msg("expected failure '%s', parse succeeded", want);
    }
    assert_null(g);
    if (st != code || strstr(err.msg, want) == NULL || strchr(err.msg, '\n') != NULL ||
        strncmp(err.msg, "mem.gguf: ", 10) != 0)
        fail_msg("expected %s containing '%s', got %s: %s", ms_status_str(code), want, ms_status_str(st), err.msg);
}

/* A small valid file: kvs of every type, a string array, two F32 tensors. */
static void make_valid(gb *b, uint32_t version) {
    memset(b, 0, sizeof *b);
    gb_header(b, version, 2, 9);
    gb_kv_str(b, "general.architecture", "test");
    gb_kv_u32(b, "test.u32", 4000000000u);
    gb_kv_f32(b, "test.f32", 0.25f);
    gb_str(b, "test.i8"); gb_u32(b, MS_GGUF_INT8); gb_u8(b, 0xfe);
    gb_str(b, "test.bool"); gb_u32(b, MS_GGUF_BOOL); gb_u8(b, 1);
    gb_str(b, "test.u64"); gb_u32(b, MS_GGUF_UINT64); gb_u64(b, 0xffffffffffffffffull);
    gb_str(b, "test.f64"); gb_u32(b, MS_GGUF_FLOAT64);
    double dv = -1.5;
    uint64_t du;
    memcpy(&du, &dv, 8);
    gb_u64(b, du);
    gb_str(b, "test.tokens"); gb_u32(b, MS_GGUF_ARRAY); gb_u32(b, MS_GGUF_STRING); gb_u64(b, 3);
    gb_str(b, "a"); gb_str(b, ""); gb_str(b, "\xc4\xa0the");
    gb_str(b, "test.scores"); gb_u32(b, MS_GGUF_ARRAY); gb_u32(b, MS_GGUF_INT32); gb_u64(b, 2);
    gb_u32(b, (uint32_t)-7); gb_u32(b, 9);
    int64_t ne_a[2] = {4, 2}, ne_b[1] = {3};
    gb_tinfo(b, "a", 2, ne_a, MS_GGML_TYPE_F32, 0);
    gb_tinfo(b, "b", 1, ne_b, MS_GGML_TYPE_F32, 32);
    gb_pad(b, 32);
    for (int i = 0; i < 8; i++)
        gb_f32(b, (float)i);
    gb_pad(b, 32);
    for (int i = 0; i < 3; i++)
        gb_f32(b, (float)(10 + i));
}

/* ---- goldens ---- */

static void test_dequant_goldens(void **state) {
    (void)state;
    ms_error err = {0};
    ms_gguf *g = NULL;
    if (ms_gguf_init(&g, GOLDENS, &err) != MS_OK)
        fail_msg("%s", err.msg);
    const char *src;
    assert_int_equal(ms_gguf_get_string(g, "goldens.source", &src, NULL, &err), MS_OK);
    assert_non_null(strstr(src, "gguf.quants.dequantize"));
    static const char *const types[] = {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0",
                                        "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"};
    for (size_t k = 0; k < MS_ARRAY_LEN(types); k++) {
        char qn[32], fn[32];
        snprintf(qn, sizeof qn, "q.%s", types[k]);
        snprintf(fn, sizeof fn, "f.%s", types[k]);
        const ms_gguf_tensor *q = ms_gguf_find_tensor(g, qn), *f = ms_gguf_find_tensor(g, fn);
        assert_non_null(q);
        assert_non_null(f);
        assert_string_equal(ms_ggml_type_name(q->type), types[k]);
        assert_int_equal(f->type, MS_GGML_TYPE_F32);
        assert_int_equal(q->n_elems, f->n_elems);
        assert_int_equal(q->n_elems, 512);
        float *got = ms_malloc(q->n_elems * sizeof *got);
        assert_int_equal(ms_gguf_tensor_to_f32(g, q, got, q->n_elems, &err), MS_OK);
        size_t bad = 0, first = 0;
        for (size_t i = 0; i < q->n_elems; i++) {
            float want;
            memcpy(&want, (const uint8_t *)f->data + 4 * i, 4);
            if (memcmp(&want, &got[i], 4) != 0 && bad++ == 0)
                first = i;
        }
        if (bad) {
            float want;
            memcpy(&want, (const uint8_t *)f->data + 4 * first, 4);
            ms_free(got);
            ms_gguf_free(g);
            fail_msg("%s: %zu of 512 values differ from gguf.quants.dequantize; first at %zu: %.9g vs %.9g",
                     types[k], bad, first, (double)got[first], (double)want);
        }
        ms_free(got);
    }
    ms_gguf_free(g);
}

/* Our reference quantizers reproduce gguf-py's (= ggml's quantize_row_*_ref) blocks byte for byte. */
static void test_quant_goldens(void **state) {
    (void)state;
    ms_error err = {0};
    ms_gguf *g = NULL;
    if (ms_gguf_init(&g, GOLDENS, &err) != MS_OK)
        fail_msg("%s", err.msg);
    static const char *const types[] = {"Q4_0", "Q8_0"};
    for (size_t k = 0; k < MS_ARRAY_LEN(types); k++) {
        char xn[32], zn[32];
        snprintf(xn, sizeof xn, "x.%s", types[k]);
        snprintf(zn, sizeof zn, "z.%s", types[k]);
        const ms_gguf_tensor *x = ms_gguf_find_tensor(g, xn), *z = ms_gguf_find_tensor(g, zn);
        assert_non_null(x);
        assert_non_null(z);
        float *xf = ms_malloc(x->n_elems * sizeof *xf);
        uint8_t *q = ms_malloc(z->n_bytes);
        assert_int_equal(ms_gguf_tensor_to_f32(g, x, xf, x->n_elems, &err), MS_OK);
        assert_int_equal(ms_ggml_quantize(z->type, xf, q, x->n_elems), MS_OK);
        size_t first = z->n_bytes;
        for (size_t i = 0; i < z->n_bytes && first == z->n_bytes; i++)
            if (q[i] != ((const uint8_t *)z->data)[i])
                first = i;
        ms_free(xf);
        ms_free(q);
        if (first != z->n_bytes) {
            ms_gguf_free(g);
            fail_msg("%s: quantized blocks differ from gguf.quants.quantize from byte %zu", types[k], first);
        }
    }
    ms_gguf_free(g);
}

/* ---- metadata ---- */

static void check_valid(uint32_t version) {
    gb b;
    make_valid(&b, version);
    ms_gguf *g = NULL;
    ms_error err;
    if (parse(&b, &g, &err) != MS_OK)
        fail_msg("%s", err.msg);
    assert_int_equal(ms_gguf_version(g), version);
    assert_int_equal(ms_gguf_alignment(g), 32);
    assert_int_equal(ms_gguf_n_kv(g), 9);
    assert_string_equal(ms_gguf_kv_at(g, 1)->key, "test.u32");
    int64_t i;
    double d;
    bool bo;
    const char *s;
    size_t len;
    assert_int_equal(ms_gguf_get_int(g, "test.u32", &i, &err), MS_OK);
    assert_int_equal(i, 4000000000ll);
    assert_int_equal(ms_gguf_get_int(g, "test.i8", &i, &err), MS_OK);
    assert_int_equal(i, -2);
    assert_int_equal(ms_gguf_get_float(g, "test.f32", &d, &err), MS_OK);
    assert_true(d == 0.25);
    assert_int_equal(ms_gguf_get_float(g, "test.f64", &d, &err), MS_OK);
    assert_true(d == -1.5);
    assert_int_equal(ms_gguf_get_float(g, "test.u32", &d, &err), MS_OK);
    assert_true(d == 4e9);
    assert_int_equal(ms_gguf_get_bool(g, "test.bool", &bo, &err), MS_OK);
    assert_true(bo);
    assert_int_equal(ms_gguf_get_string(g, "general.architecture", &s, &len, &err), MS_OK);
    assert_string_equal(s, "test");
    assert_int_equal(len, 4);
    /* a uint64 above INT64_MAX is not an int64 */
    assert_int_equal(ms_gguf_get_int(g, "test.u64", &i, &err), MS_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "'test.u64' is a uint64"));
    assert_int_equal(ms_gguf_get_string(g, "test.u32", &s, NULL, &err), MS_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "mem.gguf: metadata key 'test.u32' is a uint32, expected a string"));
    assert_int_equal(ms_gguf_get_int(g, "test.missing", &i, &err), MS_ERR_NOT_FOUND);
    assert_string_equal(err.msg, "mem.gguf: metadata key 'test.missing' is missing");
    assert_int_equal(ms_gguf_get_int_or(g, "test.missing", 42, &i, &err), MS_OK);
    assert_int_equal(i, 42);
    assert_int_equal(ms_gguf_get_int_or(g, "general.architecture", 42, &i, &err), MS_ERR_FORMAT);
    /* string array iteration */
    const ms_gguf_kv *toks;
    assert_int_equal(ms_gguf_get_array(g, "test.tokens", MS_GGUF_STRING, &toks, &err), MS_OK);
    assert_int_equal(toks->n, 3);
    assert_string_equal(ms_gguf_kv_str(toks, 0)->s, "a");
    assert_int_equal(ms_gguf_kv_str(toks, 1)->len, 0);
    assert_string_equal(ms_gguf_kv_str(toks, 2)->s, "\xc4\xa0the");
    assert_int_equal(ms_gguf_kv_str(toks, 2)->len, 5);
    assert_false(ms_gguf_kv_float(toks, 0, &d));
    assert_false(ms_gguf_kv_int(toks, 0, &i));
    assert_int_equal(ms_gguf_get_array(g, "test.tokens", MS_GGUF_INT32, &toks, &err), MS_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "is an array of string, expected an array of int32"));
    const ms_gguf_kv *sc;
    assert_int_equal(ms_gguf_get_array(g, "test.scores", MS_GGUF_VTYPE_COUNT, &sc, &err), MS_OK);
    assert_true(ms_gguf_kv_int(sc, 0, &i) && i == -7);
    assert_true(ms_gguf_kv_float(sc, 1, &d) && d == 9.0);
    assert_null(ms_gguf_kv_str(sc, 0));
    /* tensors */
    assert_int_equal(ms_gguf_n_tensors(g), 2);
    const ms_gguf_tensor *a = ms_gguf_find_tensor(g, "a"), *t = ms_gguf_find_tensor(g, "b");
    assert_non_null(a);
    assert_non_null(t);
    assert_null(ms_gguf_find_tensor(g, "c"));
    assert_int_equal(a->ne[0], 4);
    assert_int_equal(a->ne[1], 2);
    assert_int_equal(a->ne[2], 1);
    assert_int_equal(a->n_bytes, 32);
    assert_int_equal(t->file_offset % 32, 0);
    float out[8];
    assert_int_equal(ms_gguf_tensor_to_f32(g, t, out, 3, &err), MS_OK);
    assert_true(out[0] == 10.0f && out[2] == 12.0f);
    assert_int_equal(ms_gguf_tensor_to_f32(g, a, out, 8, &err), MS_OK);
    assert_true(out[7] == 7.0f);
    assert_int_equal(ms_gguf_tensor_to_f32(g, a, out, 3, &err), MS_ERR_INVALID_ARG);
    ms_gguf_free(g);
    free(b.p);
}

static void test_metadata_v3(void **state) {
    (void)state;
    check_valid(3);
}

static void test_metadata_v2(void **state) {
    (void)state;
    check_valid(2);
}

static void test_alignment_key(void **state) {
    (void)state;
    gb b = {0};
    gb_header(&b, 3, 1, 1);
    gb_kv_u32(&b, "general.alignment", 64);
    int64_t ne[1] = {32};
    gb_tinfo(&b, "x", 1, ne, MS_GGML_TYPE_Q8_0, 0);
    gb_pad(&b, 64);
    size_t data_at = b.n;
    gb_u8(&b, 0x00);
    gb_u8(&b, 0x3c); /* d = 1.0 */
    for (int i = 0; i < 32; i++)
        gb_u8(&b, (uint8_t)(int8_t)(i - 16));
    ms_gguf *g = NULL;
    ms_error err;
    if (parse(&b, &g, &err) != MS_OK)
        fail_msg("%s", err.msg);
    assert_int_equal(ms_gguf_alignment(g), 64);
    assert_int_equal(ms_gguf_find_tensor(g, "x")->file_offset, data_at);
    float y[32];
    assert_int_equal(ms_gguf_tensor_to_f32(g, ms_gguf_find_tensor(g, "x"), y, 32, &err), MS_OK);
    assert_true(y[0] == -16.0f && y[31] == 15.0f);
    ms_gguf_free(g);
    /* a non-power-of-two alignment */
    b.n = 0;
    gb_header(&b, 3, 0, 1);
    gb_kv_u32(&b, "general.alignment", 48);
    expect_bad(&b, MS_ERR_FORMAT, "general.alignment 48 is not a power of two");
    b.n = 0;
    gb_header(&b, 3, 0, 1);
    gb_kv_str(&b, "general.alignment", "32");
    expect_bad(&b, MS_ERR_FORMAT, "'general.alignment' is a string, expected uint32");
    free(b.p);
}

/* ---- bad files ---- */

static void test_truncations(void **state) {
    (void)state;
    gb b;
    make_valid(&b, 3);
    size_t full = b.n;
    for (size_t n = 0; n < full; n++) {
        gb t = {b.p, n, n};
        ms_gguf *g = NULL;
        ms_error err;
        ms_status st = parse(&t, &g, &err);
        if (st == MS_OK) {
            ms_gguf_free(g);
            fail_msg("truncated to %zu of %zu bytes: parse succeeded", n, full);
        }
        if (strchr(err.msg, '\n') != NULL || strncmp(err.msg, "mem.gguf: ", 10) != 0)
            fail_msg("truncated to %zu: message '%s'", n, err.msg);
    }
    free(b.p);
}

static void test_lying_counts(void **state) {
    (void)state;
    gb b = {0};
    gb_header(&b, 3, 0, 1000000000000ull);
    expect_bad(&b, MS_ERR_FORMAT, "header claims 1000000000000 metadata entries");
    b.n = 0;
    gb_header(&b, 3, 1ull << 40, 0);
    expect_bad(&b, MS_ERR_FORMAT, "header claims 1099511627776 tensors");
    b.n = 0;
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "k"); gb_u32(&b, MS_GGUF_ARRAY); gb_u32(&b, MS_GGUF_UINT64); gb_u64(&b, 1ull << 61);
    expect_bad(&b, MS_ERR_FORMAT, "metadata key 'k': array of 2305843009213693952 uint64 elements cannot fit");
    b.n = 0;
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "k"); gb_u32(&b, MS_GGUF_ARRAY); gb_u32(&b, MS_GGUF_STRING); gb_u64(&b, 3);
    gb_str(&b, "x");
    expect_bad(&b, MS_ERR_FORMAT, "metadata key 'k': array of 3 string elements cannot fit in the 9 bytes left");
    b.n = 0;
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "k"); gb_u32(&b, MS_GGUF_ARRAY); gb_u32(&b, MS_GGUF_STRING); gb_u64(&b, 2);
    gb_str(&b, "x");
    gb_u64(&b, 5);
    expect_bad(&b, MS_ERR_FORMAT, "k: string length 5 at offset 58 runs past the end of the file (66 bytes)");
    b.n = 0;
    gb_header(&b, 3, 0, 1);
    gb_u64(&b, 0xffffffffffffff00ull);
    gb_put(&b, "key-and-some-more-bytes", 23);
    expect_bad(&b, MS_ERR_FORMAT, "metadata key #0: string length 18446744073709551360 at offset 24 runs past");
    b.n = 0;
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "k"); gb_u32(&b, MS_GGUF_STRING); gb_u64(&b, 100); gb_put(&b, "short", 5);
    expect_bad(&b, MS_ERR_FORMAT, "k: string length 100");
    free(b.p);
}

static void test_bad_types_and_keys(void **state) {
    (void)state;
    gb b = {0};
    gb_put(&b, "GGUL", 4);
    gb_u32(&b, 3);
    expect_bad(&b, MS_ERR_FORMAT, "not a GGUF file");
    b.n = 0;
    gb_header(&b, 1, 0, 0);
    expect_bad(&b, MS_ERR_UNSUPPORTED, "GGUF version 1 is not supported (supported: 2, 3)");
    b.n = 0;
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "k"); gb_u32(&b, 13); gb_u32(&b, 0);
    expect_bad(&b, MS_ERR_UNSUPPORTED, "metadata key 'k' has unknown value type 13");
    b.n = 0;
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "k"); gb_u32(&b, MS_GGUF_ARRAY); gb_u32(&b, MS_GGUF_ARRAY); gb_u64(&b, 0);
    expect_bad(&b, MS_ERR_UNSUPPORTED, "metadata key 'k' is a nested array");
    b.n = 0;
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "k"); gb_u32(&b, MS_GGUF_ARRAY); gb_u32(&b, 99); gb_u64(&b, 0);
    expect_bad(&b, MS_ERR_UNSUPPORTED, "metadata key 'k' is an array of unknown type 99");
    b.n = 0;
    gb_header(&b, 3, 0, 1);
    gb_str(&b, "k"); gb_u32(&b, MS_GGUF_BOOL); gb_u8(&b, 7);
    expect_bad(&b, MS_ERR_FORMAT, "bool value 7 is not 0 or 1");
    b.n = 0;
    gb_header(&b, 3, 0, 2);
    gb_kv_u32(&b, "dup", 1);
    gb_kv_u32(&b, "dup", 2);
    expect_bad(&b, MS_ERR_FORMAT, "metadata key 'dup' appears twice");
    b.n = 0;
    gb_header(&b, 3, 0, 1);
    gb_kv_u32(&b, "", 1);
    expect_bad(&b, MS_ERR_FORMAT, "metadata key #0 is empty");
    free(b.p);
}

/* A one-tensor file: tensor info from the arguments, `data` bytes after the aligned header. */
static void one_tensor(gb *b, const char *name, int n_dims, const int64_t *ne, uint32_t type, uint64_t off,
                       size_t data) {
    b->n = 0;
    gb_header(b, 3, 1, 0);
    gb_tinfo(b, name, n_dims, ne, type, off);
    gb_pad(b, 32);
    for (size_t i = 0; i < data; i++)
        gb_u8(b, 0);
}

static void test_bad_tensors(void **state) {
    (void)state;
    gb b = {0};
    int64_t ne[5] = {32, 2, 1, 1, 1};
    one_tensor(&b, "t", 2, ne, 100, 0, 256);
    expect_bad(&b, MS_ERR_UNSUPPORTED, "tensor 't' has unknown ggml type 100");
    one_tensor(&b, "t", 2, ne, 4, 0, 256); /* a retired ggml type value */
    expect_bad(&b, MS_ERR_UNSUPPORTED, "tensor 't' has unknown ggml type 4");
    one_tensor(&b, "t", 5, ne, MS_GGML_TYPE_F32, 0, 256);
    expect_bad(&b, MS_ERR_UNSUPPORTED, "tensor 't' has 5 dimensions");
    one_tensor(&b, "t", 0, ne, MS_GGML_TYPE_F32, 0, 256);
    expect_bad(&b, MS_ERR_UNSUPPORTED, "tensor 't' has 0 dimensions");
    int64_t zero[2] = {32, 0};
    one_tensor(&b, "t", 2, zero, MS_GGML_TYPE_F32, 0, 256);
    expect_bad(&b, MS_ERR_FORMAT, "tensor 't': dimension 1 is 0");
    int64_t huge[4] = {1ll << 31, 1ll << 31, 1ll << 31, 1};
    one_tensor(&b, "t", 4, huge, MS_GGML_TYPE_F32, 0, 256);
    expect_bad(&b, MS_ERR_FORMAT, "tensor 't': dimension 2 is 2147483648, which is empty or makes the tensor absurdly large");
    int64_t big[2] = {1ll << 30, 1ll << 20};
    one_tensor(&b, "t", 2, big, MS_GGML_TYPE_F32, 0, 256);
    expect_bad(&b, MS_ERR_FORMAT, "runs past the end of the file");
    int64_t odd[1] = {48};
    one_tensor(&b, "t", 1, odd, MS_GGML_TYPE_Q4_K, 0, 256);
    expect_bad(&b, MS_ERR_FORMAT, "tensor 't': row length 48 is not a multiple of the Q4_K block size 256");
    one_tensor(&b, "t", 1, ne, MS_GGML_TYPE_F32, 8, 256);
    expect_bad(&b, MS_ERR_FORMAT, "tensor 't': offset 8 is not a multiple of the alignment 32");
    one_tensor(&b, "t", 1, ne, MS_GGML_TYPE_F32, 1ull << 62, 256);
    expect_bad(&b, MS_ERR_FORMAT, "tensor 't': data [4611686018427387904, ");
    one_tensor(&b, "t", 1, ne, MS_GGML_TYPE_F32, 0, 100);
    expect_bad(&b, MS_ERR_FORMAT, "tensor 't': data [0, 128) of the data region runs past the end of the file (the region holds 100 bytes)");
    /* no padding at all after the infos */
    b.n = 0;
    gb_header(&b, 3, 1, 0);
    gb_tinfo(&b, "t", 1, ne, MS_GGML_TYPE_F32, 0);
    expect_bad(&b, MS_ERR_FORMAT, "the data region (aligned to 32) would start at");
    /* two tensors: duplicate names, overlap */
    b.n = 0;
    gb_header(&b, 3, 2, 0);
    gb_tinfo(&b, "t", 1, ne, MS_GGML_TYPE_F32, 0);
    gb_tinfo(&b, "t", 1, ne, MS_GGML_TYPE_F32, 128);
    gb_pad(&b, 32);
    for (int i = 0; i < 256; i++)
        gb_u8(&b, 0);
    expect_bad(&b, MS_ERR_FORMAT, "tensor 't' appears twice");
    b.n = 0;
    gb_header(&b, 3, 2, 0);
    gb_tinfo(&b, "t", 1, ne, MS_GGML_TYPE_F32, 0);
    gb_tinfo(&b, "u", 1, ne, MS_GGML_TYPE_F32, 96);
    gb_pad(&b, 32);
    for (int i = 0; i < 256; i++)
        gb_u8(&b, 0);
    expect_bad(&b, MS_ERR_FORMAT, "tensors 't' and 'u' overlap");
    /* a known type without a dequantizer */
    one_tensor(&b, "t", 1, ne, MS_GGML_TYPE_IQ4_NL, 0, 256);
    ms_gguf *g = NULL;
    ms_error err;
    assert_int_equal(parse(&b, &g, &err), MS_OK);
    float y[32];
    assert_int_equal(ms_gguf_tensor_to_f32(g, ms_gguf_find_tensor(g, "t"), y, 32, &err), MS_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "mem.gguf: tensor 't' has ggml type IQ4_NL, which this build cannot dequantize"));
    ms_gguf_free(g);
    free(b.p);
}

/* ---- models ---- */

#define HID 8
#define HEADS 2
#define KVH 1
#define HD 4
#define FF 16
#define VOCAB 32

/* Value of element (r, c) of tensor `seed` in Hugging Face layout. */
static float hf_val(int seed, int r, int c) {
    return (float)(seed * 1000 + r * 37 + c) * 0.001f;
}

/* The row of GGUF (permuted) layout for Hugging Face row r, as LlamaModel.permute does:
 * reshape(n_head, 2, hd/2, cols).swapaxes(1, 2): HF (head, s, j) -> GGUF (head, j, s). */
static int permuted_row(int r, int hd) {
    int head = r / hd, w = r % hd, s = w / (hd / 2), j = w % (hd / 2);
    return head * hd + 2 * j + s;
}

typedef struct mk_tensor {
    const char *name;
    int rows, cols;      /* HF shape [rows, cols] (cols 0: 1-D of rows) */
    int seed;
    int permute_heads;   /* >0: write rows permuted with this many heads */
} mk_tensor;

/* Write a tiny GGUF of architecture `arch` to path; with_output: an untied output.weight. */
static void write_tiny(const char *path, const char *arch, bool with_output, const char *extra_tensor) {
    mk_tensor ts[16];
    int n = 0;
    bool perm = strcmp(arch, "llama") == 0;
    ts[n++] = (mk_tensor){"token_embd.weight", VOCAB, HID, 1, 0};
    ts[n++] = (mk_tensor){"output_norm.weight", HID, 0, 2, 0};
    if (with_output)
        ts[n++] = (mk_tensor){"output.weight", VOCAB, HID, 3, 0};
    ts[n++] = (mk_tensor){"blk.0.attn_norm.weight", HID, 0, 4, 0};
    ts[n++] = (mk_tensor){"blk.0.attn_q.weight", HEADS * HD, HID, 5, perm ? HEADS : 0};
    ts[n++] = (mk_tensor){"blk.0.attn_k.weight", KVH * HD, HID, 6, perm ? KVH : 0};
    ts[n++] = (mk_tensor){"blk.0.attn_v.weight", KVH * HD, HID, 7, 0};
    ts[n++] = (mk_tensor){"blk.0.attn_output.weight", HID, HEADS * HD, 8, 0};
    ts[n++] = (mk_tensor){"blk.0.ffn_norm.weight", HID, 0, 9, 0};
    ts[n++] = (mk_tensor){"blk.0.ffn_gate.weight", FF, HID, 10, 0};
    ts[n++] = (mk_tensor){"blk.0.ffn_up.weight", FF, HID, 11, 0};
    ts[n++] = (mk_tensor){"blk.0.ffn_down.weight", HID, FF, 12, 0};
    if (extra_tensor)
        ts[n++] = (mk_tensor){extra_tensor, HID, 0, 13, 0};
    gb b = {0};
    gb_header(&b, 3, (uint64_t)n, 10);
    gb_kv_str(&b, "general.architecture", arch);
    char k[64];
#define AK(s) (snprintf(k, sizeof k, "%s.%s", arch, s), k)
    gb_kv_u32(&b, AK("embedding_length"), HID);
    gb_kv_u32(&b, AK("block_count"), 1);
    gb_kv_u32(&b, AK("attention.head_count"), HEADS);
    gb_kv_u32(&b, AK("attention.head_count_kv"), KVH);
    gb_kv_u32(&b, AK("feed_forward_length"), FF);
    gb_kv_u32(&b, AK("context_length"), 64);
    gb_kv_f32(&b, AK("attention.layer_norm_rms_epsilon"), 1e-5f);
    gb_kv_f32(&b, AK("rope.freq_base"), 100000.0f);
    gb_kv_u32(&b, "tokenizer.ggml.eos_token_id", 2);
#undef AK
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        int64_t ne[2] = {ts[i].cols ? ts[i].cols : ts[i].rows, ts[i].rows};
        gb_tinfo(&b, ts[i].name, ts[i].cols ? 2 : 1, ne, MS_GGML_TYPE_F32, off);
        off += (uint64_t)(ts[i].rows * (ts[i].cols ? ts[i].cols : 1)) * 4;
        off = (off + 31) / 32 * 32;
    }
    gb_pad(&b, 32);
    size_t base = b.n;
    for (int i = 0; i < n; i++) {
        int cols = ts[i].cols ? ts[i].cols : 1;
        float *rows = calloc((size_t)(ts[i].rows * cols), sizeof *rows);
        assert_non_null(rows);
        for (int r = 0; r < ts[i].rows; r++) {
            int dst = ts[i].permute_heads ? permuted_row(r, ts[i].rows / ts[i].permute_heads) : r;
            for (int c = 0; c < cols; c++)
                rows[dst * cols + c] = hf_val(ts[i].seed, r, c);
        }
        gb_put(&b, rows, (size_t)(ts[i].rows * cols) * 4);
        free(rows);
        while ((b.n - base) % 32)
            gb_u8(&b, 0);
    }
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b.p, 1, b.n, f), b.n);
    fclose(f);
    free(b.p);
}

static void check_tensor_values(const ms_ckpt *ck, const char *name, int rows, int cols, int seed) {
    ms_error err = {0};
    int64_t shape[2] = {rows, cols};
    float *w = NULL;
    if (ms_ckpt_load_f32(ck, name, MS_ST_DTYPES_FLOAT, cols ? 2 : 1, shape, &w, &err) != MS_OK)
        fail_msg("%s", err.msg);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < (cols ? cols : 1); c++)
            if (w[r * (cols ? cols : 1) + c] != hf_val(seed, r, c)) {
                ms_free(w);
                fail_msg("%s[%d, %d] differs", name, r, c);
            }
    ms_free(w);
}

static void test_model_llama(void **state) {
    (void)state;
    char path[] = "/tmp/ms_test_gguf_XXXXXX.gguf";
    int fd = mkstemps(path, 5);
    assert_true(fd >= 0);
    close(fd);
    write_tiny(path, "llama", false, NULL);
    ms_error err = {0};
    ms_ckpt *ck = NULL;
    if (ms_ckpt_init(&ck, path, &err) != MS_OK)
        fail_msg("%s", err.msg);
    assert_non_null(ms_ckpt_get_gguf(ck));
    assert_int_equal(ms_ckpt_n_tensors(ck), 11);
    assert_false(ms_ckpt_has_tensor(ck, "lm_head.weight"));
    check_tensor_values(ck, "model.embed_tokens.weight", VOCAB, HID, 1);
    check_tensor_values(ck, "model.norm.weight", HID, 0, 2);
    check_tensor_values(ck, "model.layers.0.self_attn.q_proj.weight", HEADS * HD, HID, 5);
    check_tensor_values(ck, "model.layers.0.self_attn.k_proj.weight", KVH * HD, HID, 6);
    check_tensor_values(ck, "model.layers.0.self_attn.v_proj.weight", KVH * HD, HID, 7);
    check_tensor_values(ck, "model.layers.0.mlp.down_proj.weight", HID, FF, 12);
    check_tensor_values(ck, "model.layers.0.post_attention_layernorm.weight", HID, 0, 9);
    int64_t shape[2] = {FF, HID + 1};
    assert_int_equal(ms_ckpt_expect_tensor(ck, "model.layers.0.mlp.up_proj.weight", MS_ST_DTYPES_FLOAT, 2, shape,
                                           NULL, &err), MS_ERR_FORMAT);
    assert_non_null(strstr(err.msg, ".gguf: tensor 'model.layers.0.mlp.up_proj.weight' has shape [16, 8]"));
    ms_ckpt_free(ck);

    ms_hf_config *cfg = NULL;
    if (ms_hf_config_init(&cfg, path, &err) != MS_OK)
        fail_msg("%s", err.msg);
    int64_t v;
    const char *s;
    bool tied;
    double theta;
    assert_int_equal(ms_hf_config_get_int(cfg, "hidden_size", &v, &err), MS_OK);
    assert_int_equal(v, HID);
    assert_int_equal(ms_hf_config_get_int(cfg, "num_key_value_heads", &v, &err), MS_OK);
    assert_int_equal(v, KVH);
    assert_int_equal(ms_hf_config_get_int(cfg, "head_dim", &v, &err), MS_OK);
    assert_int_equal(v, HD);
    assert_int_equal(ms_hf_config_get_int(cfg, "vocab_size", &v, &err), MS_OK);
    assert_int_equal(v, VOCAB);
    assert_int_equal(ms_hf_config_get_int(cfg, "max_position_embeddings", &v, &err), MS_OK);
    assert_int_equal(v, 64);
    assert_int_equal(ms_hf_config_get_string(cfg, "architectures.0", &s, &err), MS_OK);
    assert_string_equal(s, "LlamaForCausalLM");
    assert_int_equal(ms_hf_config_get_bool(cfg, "tie_word_embeddings", &tied, &err), MS_OK);
    assert_true(tied);
    assert_int_equal(ms_hf_config_get_float(cfg, "rope_theta", &theta, &err), MS_OK);
    assert_true(theta == 100000.0);
    int64_t eos[4];
    size_t n_eos;
    assert_int_equal(ms_hf_config_get_eos_ids(cfg, eos, 4, &n_eos, &err), MS_OK);
    assert_int_equal(n_eos, 1);
    assert_int_equal(eos[0], 2);
    ms_hf_config_free(cfg);
    unlink(path);
}

static void test_model_qwen2_untied(void **state) {
    (void)state;
    char path[] = "/tmp/ms_test_gguf_XXXXXX.gguf";
    int fd = mkstemps(path, 5);
    assert_true(fd >= 0);
    close(fd);
    write_tiny(path, "qwen2", true, NULL);
    ms_error err = {0};
    ms_ckpt *ck = NULL;
    if (ms_ckpt_init(&ck, path, &err) != MS_OK)
        fail_msg("%s", err.msg);
    /* qwen2 is stored unpermuted: the values come back as written */
    check_tensor_values(ck, "model.layers.0.self_attn.q_proj.weight", HEADS * HD, HID, 5);
    check_tensor_values(ck, "lm_head.weight", VOCAB, HID, 3);
    ms_ckpt_free(ck);
    ms_hf_config *cfg = NULL;
    assert_int_equal(ms_hf_config_init(&cfg, path, &err), MS_OK);
    const char *s;
    bool b;
    assert_int_equal(ms_hf_config_get_string(cfg, "architectures.0", &s, &err), MS_OK);
    assert_string_equal(s, "Qwen2ForCausalLM");
    assert_int_equal(ms_hf_config_get_bool(cfg, "tie_word_embeddings", &b, &err), MS_OK);
    assert_false(b);
    assert_int_equal(ms_hf_config_get_bool(cfg, "use_sliding_window", &b, &err), MS_OK);
    assert_false(b);
    ms_hf_config_free(cfg);
    unlink(path);
}

static void expect_model_bad(const char *arch, const char *extra, ms_status code, const char *want) {
    char path[] = "/tmp/ms_test_gguf_XXXXXX.gguf";
    int fd = mkstemps(path, 5);
    assert_true(fd >= 0);
    close(fd);
    write_tiny(path, arch, false, extra);
    ms_error err = {0};
    ms_ckpt *ck = NULL;
    ms_status st = ms_ckpt_init(&ck, path, &err);
    ms_ckpt_free(ck);
    ms_hf_config *cfg = NULL;
    ms_error err2 = {0};
    ms_status st2 = extra ? MS_OK : ms_hf_config_init(&cfg, path, &err2);
    ms_hf_config_free(cfg);
    unlink(path);
    if (st != code || strstr(err.msg, want) == NULL || strchr(err.msg, '\n') != NULL ||
        strstr(err.msg, path) != err.msg)
        fail_msg("checkpoint: expected %s '%s', got %s: %s", ms_status_str(code), want, ms_status_str(st), err.msg);
    if (!extra && (st2 != code || strstr(err2.msg, want) == NULL))
        fail_msg("config: expected %s '%s', got %s: %s", ms_status_str(code), want, ms_status_str(st2), err2.msg);
}

static void test_model_bad(void **state) {
    (void)state;
    expect_model_bad("gpt2", NULL, MS_ERR_UNSUPPORTED,
                     "general.architecture 'gpt2' is not supported (supported: llama, qwen2, qwen3)");
    expect_model_bad("llama", "rope_freqs.weight", MS_ERR_FORMAT,
                     "tensor 'rope_freqs.weight' has 1 dims, ne[0] 8; expected one factor per rotary pair (2)");
    expect_model_bad("llama", "blk.7.attn_norm.weight", MS_ERR_FORMAT,
                     "tensor 'blk.7.attn_norm.weight' names layer 7, but the model has 1 layers");
    expect_model_bad("llama", "blk.0.ffn_gate_exps.weight", MS_ERR_UNSUPPORTED,
                     "tensor 'blk.0.ffn_gate_exps.weight' has no Hugging Face counterpart");
    ms_error err = {0};
    ms_ckpt *ck = NULL;
    assert_int_equal(ms_ckpt_init(&ck, "/nonexistent/m.gguf", &err), MS_ERR_NOT_FOUND);
    assert_null(ck);
}

/* ---- Llama 3 rope scaling as rope_freqs.weight ---- */

#define CHECK(expr)                                                                                      \
    do {                                                                                                 \
        if ((expr) != MS_OK)                                                                             \
            fail_msg("%s: %s", #expr, e.msg);                                                            \
    } while (0)

/* convert_hf_to_gguf.py's rope_freqs.weight for rope_type llama3 (float32 arithmetic). */
static void llama3_factors(double theta, int dim, double factor, double low, double high, double orig, float *out) {
    float low_wl = (float)(orig / low), high_wl = (float)(orig / high);
    for (int i = 0; i < dim / 2; i++) {
        float freq = 1.0f / powf((float)theta, (float)(2 * i) / (float)dim);
        float wavelen = (float)(2.0 * M_PI) / freq;
        float smooth = ((float)orig / wavelen - (float)low) / (float)(high - low);
        out[i] = wavelen < high_wl ? 1.0f : wavelen > low_wl ? (float)factor
                                                             : 1.0f / ((1.0f - smooth) / (float)factor + smooth);
    }
}

/* A metadata-only llama GGUF (head_dim 128, theta 5e5, the 8B's shape keys) with rope_freqs.weight
 * = ff[64]; returns the status of ms_hf_config_init on it and its rope parameters. */
static ms_status rope_freqs_config(const float *ff, ms_rope_params *rp, ms_error *err) {
    char path[] = "/tmp/ms_test_gguf_rf_XXXXXX.gguf";
    int fd = mkstemps(path, 5);
    assert_true(fd >= 0);
    close(fd);
    ms_gguf_writer *w = NULL;
    ms_error e = {0};
    CHECK(ms_gguf_writer_init(&w, path, &e));
    CHECK(ms_gguf_writer_set_str(w, "general.architecture", "llama", &e));
    CHECK(ms_gguf_writer_set_u32(w, "llama.embedding_length", 4096, &e));
    CHECK(ms_gguf_writer_set_u32(w, "llama.block_count", 32, &e));
    CHECK(ms_gguf_writer_set_u32(w, "llama.attention.head_count", 32, &e));
    CHECK(ms_gguf_writer_set_u32(w, "llama.attention.head_count_kv", 8, &e));
    CHECK(ms_gguf_writer_set_u32(w, "llama.feed_forward_length", 14336, &e));
    CHECK(ms_gguf_writer_set_u32(w, "llama.vocab_size", 128256, &e));
    CHECK(ms_gguf_writer_set_u32(w, "llama.context_length", 131072, &e));
    CHECK(ms_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f, &e));
    CHECK(ms_gguf_writer_set_f32(w, "llama.rope.freq_base", 500000.0f, &e));
    int64_t ne = 64;
    CHECK(ms_gguf_writer_add_tensor(w, "rope_freqs.weight", MS_GGML_TYPE_F32, 1, &ne, &e));
    CHECK(ms_gguf_writer_write(w, ff, 64 * sizeof *ff, &e));
    CHECK(ms_gguf_writer_finish(w, &e));
    ms_gguf_writer_free(w);
    ms_hf_config *cfg = NULL;
    ms_status st = ms_hf_config_init(&cfg, path, err);
    if (st == MS_OK)
        st = ms_hf_config_get_rope(cfg, rp, err);
    ms_hf_config_free(cfg);
    unlink(path);
    return st;
}

static void test_rope_freqs(void **state) {
    (void)state;
    /* Llama 3.1 8B (factor 8) and Llama 3.2 1B (factor 32): low 1, high 4, original 8192 */
    static const double factors[] = {8.0, 32.0};
    for (size_t k = 0; k < MS_ARRAY_LEN(factors); k++) {
        float ff[64];
        llama3_factors(500000.0, 128, factors[k], 1.0, 4.0, 8192.0, ff);
        ms_rope_params rp;
        ms_error err = {0};
        if (rope_freqs_config(ff, &rp, &err) != MS_OK)
            fail_msg("%s", err.msg);
        assert_int_equal(rp.type, MS_ROPE_TYPE_LLAMA3);
        assert_true(rp.factor == factors[k] && rp.low_freq_factor == 1.0 && rp.high_freq_factor == 4.0);
        assert_int_equal(rp.original_max_position_embeddings, 8192);
        /* one smoothed factor off by 1%: no Llama 3 parameters reproduce it */
        for (int i = 0; i < 64; i++)
            if (ff[i] != 1.0f && ff[i] != (float)factors[k]) {
                ff[i] *= 1.01f;
                break;
            }
        ms_status st = rope_freqs_config(ff, &rp, &err);
        if (st != MS_ERR_UNSUPPORTED || strstr(err.msg, "tensor 'rope_freqs.weight' is not a Llama 3 rope scaling") == NULL)
            fail_msg("expected the bent factor refused, got %s: %s", ms_status_str(st), err.msg);
    }
    /* all ones: default frequencies; a factor below 1: refused naming the dimension */
    float ones[64];
    for (int i = 0; i < 64; i++)
        ones[i] = 1.0f;
    ms_rope_params rp;
    ms_error e = {0};
    CHECK(rope_freqs_config(ones, &rp, &e));
    assert_int_equal(rp.type, MS_ROPE_TYPE_DEFAULT);
    ones[3] = 0.5f;
    assert_int_equal(rope_freqs_config(ones, &rp, &e), MS_ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "tensor 'rope_freqs.weight'[3] = 0.5: not a Llama 3 frequency factor"));
}

/* ---- ggml block dtypes of the op interface (backend.h) ---- */

static void test_quant_dtypes(void **state) {
    (void)state;
    static const uint32_t g[] = {MS_GGML_TYPE_Q4_0, MS_GGML_TYPE_Q4_1, MS_GGML_TYPE_Q5_0, MS_GGML_TYPE_Q8_0,
                                 MS_GGML_TYPE_Q4_K, MS_GGML_TYPE_Q5_K, MS_GGML_TYPE_Q6_K};
    static const char *const names[] = {"q4_0", "q4_1", "q5_0", "q8_0", "q4_k", "q5_k", "q6_k"};
    for (int i = 0; i < 7; i++) {
        ms_dtype dt = ms_dtype_from_ggml(g[i]);
        assert_int_equal(dt, MS_DTYPE_Q4_0 + i);
        assert_true(ms_dtype_is_quant(dt));
        assert_int_equal(ms_dtype_ggml_type(dt), (int)g[i]);
        assert_string_equal(ms_dtype_str(dt), names[i]);
        assert_int_equal(ms_dtype_size(dt), 0);
        size_t blk = ms_ggml_type_block(g[i]);
        assert_int_equal(ms_dtype_row_bytes(dt, (int64_t)blk * 3), 3 * ms_ggml_type_block_bytes(g[i]));
        assert_int_equal(ms_dtype_row_bytes(dt, (int64_t)blk + 1), 0);
    }
    /* types that stay dequantized, and the plain dtypes */
    assert_int_equal(ms_dtype_from_ggml(MS_GGML_TYPE_Q5_1), MS_DTYPE_COUNT);
    assert_int_equal(ms_dtype_from_ggml(MS_GGML_TYPE_F16), MS_DTYPE_COUNT);
    assert_false(ms_dtype_is_quant(MS_DTYPE_BF16));
    assert_int_equal(ms_dtype_ggml_type(MS_DTYPE_F32), -1);
    assert_int_equal(ms_dtype_row_bytes(MS_DTYPE_BF16, 10), 20);
    /* the CPU backend takes no block weights: linear names the operand and its dtype */
    ms_backend be;
    ms_error err = {0};
    assert_int_equal(ms_backend_cpu_init(&be, NULL, &err), MS_OK);
    assert_null(be.iface.weight_dtype_ok);
    float xb[64] = {0}, yb[4] = {0};
    uint8_t wb[4 * 36] = {0};
    ms_tensor x = ms_tensor_2d(xb, MS_DTYPE_F32, 1, 64), w = ms_tensor_2d(wb, MS_DTYPE_Q4_0, 4, 64),
              y = ms_tensor_2d(yb, MS_DTYPE_F32, 1, 4);
    assert_int_not_equal(be.iface.linear(be.ctx, &x, &w, NULL, &y, &err), MS_OK);
    assert_non_null(strstr(err.msg, "q4_0"));
    ms_backend_free(&be);
}

/* ---- quantizers ---- */

static void test_quant_roundtrip(void **state) {
    (void)state;
    enum { N = 1024 };
    static const uint32_t types[] = {MS_GGML_TYPE_Q4_0, MS_GGML_TYPE_Q8_0, MS_GGML_TYPE_Q4_K, MS_GGML_TYPE_F16,
                                     MS_GGML_TYPE_BF16, MS_GGML_TYPE_F32};
    static const float tol[] = {0.2f, 0.01f, 0.2f, 1e-3f, 1e-2f, 0.0f}; /* max |err| / max |x| */
    float *x = ms_malloc(N * sizeof *x), *y = ms_malloc(N * sizeof *y), *z = ms_malloc(N * sizeof *z);
    uint8_t *q = ms_malloc(N * 4), *q2 = ms_malloc(N * 4);
    uint64_t s = 12345;
    for (int i = 0; i < N; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = ((float)(s >> 40) / (float)(1 << 24) - 0.5f) * (i < 512 ? 1.0f : 0.01f);
    }
    x[7] = 0.0f;
    for (size_t k = 0; k < MS_ARRAY_LEN(types); k++) {
        uint32_t t = types[k];
        assert_int_equal(ms_ggml_quantize(t, x, q, N), MS_OK);
        assert_int_equal(ms_ggml_dequantize(t, q, y, N), MS_OK);
        for (int half = 0; half < 2; half++) {
            float amax = 0.0f, emax = 0.0f;
            for (int i = half * 512; i < (half + 1) * 512; i++) {
                amax = fmaxf(amax, fabsf(x[i]));
                emax = fmaxf(emax, fabsf(x[i] - y[i]));
            }
            if (emax > tol[k] * amax)
                fail_msg("%s: max error %g over max |x| %g", ms_ggml_type_name(t), (double)emax, (double)amax);
        }
        /* quantize(dequantize(q)) dequantizes to the same values (q8_0/q4_0/f16: the same bytes) */
        assert_int_equal(ms_ggml_quantize(t, y, q2, N), MS_OK);
        assert_int_equal(ms_ggml_dequantize(t, q2, z, N), MS_OK);
        size_t bytes = N / ms_ggml_type_block(t) * ms_ggml_type_block_bytes(t);
        if (t != MS_GGML_TYPE_Q4_K)
            assert_memory_equal(q, q2, bytes);
        for (int i = 0; i < N && t != MS_GGML_TYPE_Q4_K; i++)
            assert_true(y[i] == z[i]);
    }
    /* an all-zero Q4_K block quantizes to zeros */
    memset(x, 0, N * sizeof *x);
    assert_int_equal(ms_ggml_quantize(MS_GGML_TYPE_Q4_K, x, q, 256), MS_OK);
    assert_int_equal(ms_ggml_dequantize(MS_GGML_TYPE_Q4_K, q, y, 256), MS_OK);
    for (int i = 0; i < 256; i++)
        assert_true(y[i] == 0.0f);
    assert_int_equal(ms_ggml_quantize(MS_GGML_TYPE_Q4_K, x, q, 100), MS_ERR_INVALID_ARG);
    assert_int_equal(ms_ggml_quantize(MS_GGML_TYPE_Q6_K, x, q, 256), MS_ERR_UNSUPPORTED);
    assert_int_equal(ms_ggml_dequantize(MS_GGML_TYPE_Q8_0, q, y, 33), MS_ERR_INVALID_ARG);
    ms_free(x);
    ms_free(y);
    ms_free(z);
    ms_free(q);
    ms_free(q2);
}

/* ---- mstar-mkckpt --format gguf ---- */

/* mstar-mkckpt of $MS_BUILD (default build) with `args`; fails the test unless it exits 0. */
static void run_mkckpt(const char *args) {
    const char *b = getenv("MS_BUILD");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s/mstar-mkckpt %s >/dev/null", b != NULL && *b ? b : "build", args);
    int rc = system(cmd);
    if (rc != 0)
        fail_msg("'%s' exited with %d", cmd, rc);
}

/* The GGUF written by mkckpt (quant `q`) holds, after load, exactly dequantize(quantize(x)) of the
 * f32 safetensors checkpoint x written with the same seed and shape (norms: x itself). */
static void check_mkckpt_quant(const char *dir, const char *quant, uint32_t type) {
    const char *shape = "--hidden 256 --intermediate 512 --heads 4 --kv-heads 2 --head-dim 64 --vocab 512 "
                        "--layers 2 --seed 7";
    char args[1024], gpath[600];
    snprintf(gpath, sizeof gpath, "%s/%s.gguf", dir, quant);
    snprintf(args, sizeof args, "%s --format gguf --quant %s --out %s", shape, quant, gpath);
    run_mkckpt(args);
    snprintf(args, sizeof args, "%s --dtype f32 --out %s/st", shape, dir);
    run_mkckpt(args);
    ms_error err = {0};
    ms_ckpt *gk = NULL, *sk = NULL;
    char spath[600];
    snprintf(spath, sizeof spath, "%s/st", dir);
    if (ms_ckpt_init(&gk, gpath, &err) != MS_OK || ms_ckpt_init(&sk, spath, &err) != MS_OK)
        fail_msg("%s", err.msg);
    assert_int_equal(ms_ckpt_n_tensors(gk), ms_ckpt_n_tensors(sk));
    for (size_t i = 0; i < ms_ckpt_n_tensors(sk); i++) {
        const ms_st_tensor *x = ms_ckpt_tensor_at(sk, i);
        float *got = NULL, *xv = NULL, *want = ms_malloc(x->n_elems * sizeof *want);
        uint8_t *q = ms_malloc(x->n_elems * 4);
        if (ms_ckpt_load_f32(gk, x->name, MS_ST_DTYPES_FLOAT, x->n_dims, x->shape, &got, &err) != MS_OK ||
            ms_ckpt_load_f32(sk, x->name, MS_ST_DTYPES_FLOAT, x->n_dims, x->shape, &xv, &err) != MS_OK)
            fail_msg("%s", err.msg);
        uint32_t t = x->n_dims == 2 ? type : MS_GGML_TYPE_F32;
        assert_int_equal(ms_ggml_quantize(t, xv, q, x->n_elems), MS_OK);
        assert_int_equal(ms_ggml_dequantize(t, q, want, x->n_elems), MS_OK);
        if (memcmp(got, want, x->n_elems * sizeof *want) != 0)
            fail_msg("%s: %s differs from dequantize(quantize(x)) of the safetensors checkpoint", quant, x->name);
        /* the blocks as stored, rows in Hugging Face order (q/k un-permuted): exactly the blocks
           of quantize(x), and rows [1, 3) alone are their slice */
        const ms_gguf_model *gm = ms_ckpt_get_gguf_model(gk);
        ms_gguf_raw_info ri;
        if (gm == NULL || ms_gguf_model_raw_info(gm, x->name, &ri, &err) != MS_OK)
            fail_msg("%s: raw info of %s: %s", quant, x->name, err.msg);
        assert_int_equal(ri.type, t);
        assert_int_equal(ri.rows, x->n_dims == 2 ? x->shape[0] : 1);
        size_t raw_bytes = (size_t)ri.rows * ri.row_bytes;
        uint8_t *raw = ms_malloc(raw_bytes);
        assert_non_null(raw);
        if (ms_gguf_model_copy_raw_rows(gm, x->name, 0, ri.rows, raw, raw_bytes, &err) != MS_OK)
            fail_msg("%s", err.msg);
        if (memcmp(raw, q, raw_bytes) != 0)
            fail_msg("%s: raw rows of %s (permute groups %lld) differ from quantize(x)", quant, x->name,
                     (long long)ri.permute_groups);
        if (ri.rows >= 3) {
            if (ms_gguf_model_copy_raw_rows(gm, x->name, 1, 2, raw, raw_bytes, &err) != MS_OK)
                fail_msg("%s", err.msg);
            assert_memory_equal(raw, q + ri.row_bytes, 2 * ri.row_bytes);
        }
        assert_int_equal(ms_gguf_model_copy_raw_rows(gm, x->name, ri.rows - 1, 2, raw, raw_bytes, &err),
                         MS_ERR_INVALID_ARG);
        assert_non_null(strstr(err.msg, x->name));
        ms_free(raw);
        ms_free(got);
        ms_free(xv);
        ms_free(want);
        ms_free(q);
    }
    ms_ckpt_free(gk);
    ms_ckpt_free(sk);
}

static void test_mkckpt_gguf(void **state) {
    (void)state;
    char dir[] = "/tmp/ms_test_gguf_mk_XXXXXX";
    assert_non_null(mkdtemp(dir));
    check_mkckpt_quant(dir, "q8_0", MS_GGML_TYPE_Q8_0);
    check_mkckpt_quant(dir, "q4_0", MS_GGML_TYPE_Q4_0);
    check_mkckpt_quant(dir, "q4_k", MS_GGML_TYPE_Q4_K);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

/* mstar-mkckpt `args` must exit 1 with one stderr line containing `want`. */
static void expect_mkckpt_fails(const char *args, const char *want) {
    const char *b = getenv("MS_BUILD");
    char cmd[2048], line[1024], all[4096] = "";
    snprintf(cmd, sizeof cmd, "%s/mstar-mkckpt %s 2>&1 >/dev/null", b != NULL && *b ? b : "build", args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    int lines = 0;
    while (fgets(line, sizeof line, p) != NULL) {
        lines++;
        strncat(all, line, sizeof all - strlen(all) - 1);
    }
    int rc = pclose(p);
    if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 1 || lines != 1 || strstr(all, want) == NULL)
        fail_msg("'%s': status %d, %d line(s) '%s', expected exit 1 and one line with '%s'", cmd, rc, lines, all,
                 want);
}

static void test_mkckpt_gguf_bad(void **state) {
    (void)state;
    expect_mkckpt_fails("--quant q4_0 --out /tmp/x", "--quant needs --format gguf");
    expect_mkckpt_fails("--format gguf --quant q5_1 --out /tmp/x.gguf", "--quant 'q5_1' is not q4_0, q4_k, q8_0");
    expect_mkckpt_fails("--format gguf --dtype bf16 --out /tmp/x.gguf", "--format gguf takes --quant, not --dtype");
    expect_mkckpt_fails("--format gguf --shards 2 --out /tmp/x.gguf", "--format gguf writes one file");
    expect_mkckpt_fails("--format ggml", "--format 'ggml' is not safetensors or gguf");
    expect_mkckpt_fails("--preset tiny --format gguf --out /nonexistent/dir/x.gguf",
                        "/nonexistent/dir/x.gguf: cannot create");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_dequant_goldens),
        ms_unit_test(test_quant_goldens),
        ms_unit_test(test_metadata_v3),
        ms_unit_test(test_metadata_v2),
        ms_unit_test(test_alignment_key),
        ms_unit_test(test_truncations),
        ms_unit_test(test_lying_counts),
        ms_unit_test(test_bad_types_and_keys),
        ms_unit_test(test_bad_tensors),
        ms_unit_test(test_model_llama),
        ms_unit_test(test_model_qwen2_untied),
        ms_unit_test(test_model_bad),
        ms_unit_test(test_rope_freqs),
        ms_unit_test(test_quant_dtypes),
        ms_unit_test(test_quant_roundtrip),
        ms_unit_test(test_mkckpt_gguf),
        ms_unit_test(test_mkckpt_gguf_bad),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
