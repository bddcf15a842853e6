/*
 * test_cli.c - the logic under the serving binary's command line (cli.h) that can be checked
 * without running a model: the --prompt-ids list parser (accepted forms, every rejected form with
 * the entry it names, allocation failure), streaming UTF-8 output (split characters held back,
 * invalid bytes as U+FFFD, and token-by-token streaming of random Llama 3.1 ids equal to the
 * tokenizer's one-shot decode), the model probe on the fixtures and on paths that are not models,
 * the bench verb's bf16 peak table and its FLOPs-per-prefill-token formula.
 */
#include "ms_test.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "tokenizer_hf.h"

/* the hand-written Llama descriptor, as test_codegen_llama.c uses it */
extern const ms_model_desc ms_llama_desc;

#include "ms_test_impl.h"

/* ---- --prompt-ids ---- */

static void expect_ids(const char *s, const int32_t *want, size_t n_want) {
    ms_error err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    if (ms_cli_parse_ids(s, &ids, &n, &err) != MS_OK)
        fail_msg("'%s': %s", s, err.msg);
    assert_int_equal(n, n_want);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(ids[i], want[i]);
    ms_free(ids);
}

static void expect_ids_error(const char *s, const char *want_msg) {
    ms_error err = {0};
    int32_t *ids = (int32_t *)&err; /* must be reset to NULL */
    size_t n = 7;
    assert_int_equal(ms_cli_parse_ids(s, &ids, &n, &err), MS_ERR_PARSE);
    assert_null(ids);
    assert_int_equal(n, 0);
    if (strstr(err.msg, want_msg) == NULL)
        fail_msg("'%s': message '%s' lacks '%s'", s, err.msg, want_msg);
    assert_null(strchr(err.msg, '\n'));
}

static void test_parse_ids_accepts(void **state) {
    (void)state;
    expect_ids("1,2,3", (const int32_t[]){1, 2, 3}, 3);
    expect_ids("1,2, 3", (const int32_t[]){1, 2, 3}, 3);
    expect_ids(" 7 ", (const int32_t[]){7}, 1);
    expect_ids("0", (const int32_t[]){0}, 1);
    expect_ids("\t5 ,\t6", (const int32_t[]){5, 6}, 2);
    expect_ids("2147483647,007", (const int32_t[]){INT32_MAX, 7}, 2);
    /* a long list grows its array */
    char buf[4096];
    size_t o = 0;
    int32_t want[500];
    for (int i = 0; i < 500; i++) {
        want[i] = i * 3;
        o += (size_t)snprintf(buf + o, sizeof buf - o, "%s%d", i > 0 ? "," : "", i * 3);
    }
    expect_ids(buf, want, 500);
}

static void test_parse_ids_rejects(void **state) {
    (void)state;
    /* empty entries anywhere are one rule: leading, trailing and doubled commas */
    expect_ids_error("1,2,", "entry 3 is empty");
    expect_ids_error("1,,2", "entry 2 is empty");
    expect_ids_error(",1", "entry 1 is empty");
    expect_ids_error("1, ,2", "entry 2 is empty");
    expect_ids_error(",", "entry 1 is empty");
    expect_ids_error("", "no token ids");
    expect_ids_error("   ", "no token ids");
    expect_ids_error("1,x", "entry 2 'x' is not a token id");
    expect_ids_error("-1", "entry 1 '-1' is not a token id");
    expect_ids_error("+1", "entry 1 '+1' is not a token id");
    expect_ids_error("1.5", "entry 1 '1.5' is not a token id");
    expect_ids_error("3,1 2", "entry 2 '1 2' is not a token id");
    expect_ids_error("4;5", "entry 1 '4;5' is not a token id");
    expect_ids_error("1,2147483648", "entry 2 '2147483648' is above the largest id 2147483647");
    expect_ids_error("99999999999999999999999", "entry 1 '99999999999999999999999' is above");
}

static void test_parse_ids_oom(void **state) {
    (void)state;
    ms_error err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    ms_alloc_fail_nth(1);
    ms_status st = ms_cli_parse_ids("1,2,3", &ids, &n, &err);
    ms_alloc_fail_nth(0);
    assert_int_equal(st, MS_ERR_OOM);
    assert_null(ids);
    assert_non_null(strstr(err.msg, "out of memory"));
}

/* ---- streaming UTF-8 ---- */

/* Push `parts` (NULL-terminated, lengths by strlen) one by one, then flush: the whole output. */
static void stream_parts(const char *const *parts, char *out, size_t *len) {
    ms_cli_utf8 s = {0};
    size_t w = 0;
    for (size_t i = 0; parts[i] != NULL; i++)
        w += ms_cli_utf8_push(&s, parts[i], strlen(parts[i]), out + w);
    w += ms_cli_utf8_flush(&s, out + w);
    out[w] = '\0';
    *len = w;
}

static void expect_stream(const char *const *parts, const char *want) {
    char out[256];
    size_t len;
    stream_parts(parts, out, &len);
    assert_int_equal(len, strlen(want));
    assert_memory_equal(out, want, len);
}

#define FFFD "\xEF\xBF\xBD"

/* issue 15.6 / 15.7: numbers are plain decimal, whole, in range; values print escaped */
static void test_flag_numbers(void **state) {
    (void)state;
    int64_t n = -7;
    assert_true(ms_cli_parse_i64("42", 0, 100, &n) && n == 42);
    assert_false(ms_cli_parse_i64(" 4", 0, 100, &n));
    assert_false(ms_cli_parse_i64("4 ", 0, 100, &n));
    assert_false(ms_cli_parse_i64("\t4", 0, 100, &n));
    assert_int_equal(ms_cli_flag_i64("t", "--n", "2147483648", 0, INT32_MAX, "an int", &n), 1);
    assert_int_equal(ms_cli_flag_i64("t", "--n", "7", 0, INT32_MAX, "an int", &n), 0);
    assert_int_equal(n, 7);
    float f = -1.0f;
    assert_int_equal(ms_cli_flag_f32("t", "--f", "0.5", 0.0, true, 1.0, "x", &f), 0);
    assert_true(f == 0.5f);
    assert_int_equal(ms_cli_flag_f32("t", "--f", "1", 0.0, true, 1.0, "x", &f), 0);
    assert_true(f == 1.0f);
    static const char *const refused[] = {"1.0000000001", "0", "0x10", "0x1p-3", " 0.5", "0.5 ",
                                          "inf", "nan", "-0.1", "", "1e309", ".", "e5", "1e"};
    for (size_t i = 0; i < MS_ARRAY_LEN(refused); i++) {
        f = -1.0f;
        if (ms_cli_flag_f32("t", "--f", refused[i], 0.0, true, 1.0, "x", &f) != 1)
            fail_msg("'%s' was accepted as %g", refused[i], (double)f);
    }
    assert_int_equal(ms_cli_flag_f32("t", "--f", "1e308", 0.0, false, FLT_MAX, "x", &f), 1);
    assert_int_equal(ms_cli_flag_f32("t", "--f", "1e-39", 0.0, false, FLT_MAX, "x", &f), 0);
    assert_true(f > 0.0f && f < 1e-38f);
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    ms_cli_put_escaped(m, "a\nb\tc\x1b[31m\\d\x7f", 100);
    ms_cli_put_escaped(m, "|abcdef", 3);
    fclose(m);
    assert_string_equal(buf, "a\\nb\\tc\\x1b[31m\\\\d\\x7f|ab...");
    free(buf);
}

static void test_utf8_stream(void **state) {
    (void)state;
    expect_stream((const char *const[]){"Hello", ", world", NULL}, "Hello, world");
    /* split characters are held back and come out whole */
    ms_cli_utf8 s = {0};
    char out[MS_CLI_UTF8_OUT_MAX(4)];
    assert_int_equal(ms_cli_utf8_push(&s, "\xF0\x9F", 2, out), 0);
    assert_int_equal(ms_cli_utf8_push(&s, "\xA6", 1, out), 0);
    assert_int_equal(s.n_pend, 3);
    assert_int_equal(ms_cli_utf8_push(&s, "\x99!", 2, out), 5);
    assert_memory_equal(out, "\xF0\x9F\xA6\x99!", 5);
    assert_int_equal(ms_cli_utf8_flush(&s, out), 0);
    expect_stream((const char *const[]){"a\xC3", "\xA9", "b", NULL}, "a\xC3\xA9" "b");
    expect_stream((const char *const[]){"\xE2", "\x80", "\x94", NULL}, "\xE2\x80\x94");
    /* invalid bytes: each maximal subpart is one U+FFFD, as from_utf8_lossy */
    expect_stream((const char *const[]){"\x80", "x", NULL}, FFFD "x");
    expect_stream((const char *const[]){"\xF0\x9F", "A", NULL}, FFFD "A");
    expect_stream((const char *const[]){"\xED\xA0\x80", NULL}, FFFD FFFD FFFD);
    expect_stream((const char *const[]){"\xC0\xAF", NULL}, FFFD FFFD);
    expect_stream((const char *const[]){"\xF4\x90\x80\x80", NULL}, FFFD FFFD FFFD FFFD);
    expect_stream((const char *const[]){"\xE0\x80", NULL}, FFFD FFFD);
    expect_stream((const char *const[]){"\xF5z", NULL}, FFFD "z");
    /* an incomplete character at the end of the stream is one U+FFFD */
    expect_stream((const char *const[]){"ok\xE2\x82", NULL}, "ok" FFFD);
    expect_stream((const char *const[]){"\xF0", "\x9F", "\x98", NULL}, FFFD);
    /* a held-back prefix broken by the next push: one U+FFFD, then the new bytes */
    expect_stream((const char *const[]){"\xE2\x82", "\xC3\xA9", NULL}, FFFD "\xC3\xA9");
}

/* Token-by-token streaming of random Llama 3.1 ids (byte tokens that split characters, special
 * tokens, ids outside the vocabulary) equals the tokenizer's one-shot decode skipping specials. */
static void test_utf8_stream_tokens(void **state) {
    (void)state;
    ms_error err = {0};
    ms_tok_hf *tok = NULL;
    if (ms_tok_hf_init(&tok, ms_test_fixture("tokenizers/llama3_1/tokenizer.json"), &err) != MS_OK)
        fail_msg("%s", err.msg);
    uint64_t rng = 12345;
    char *got = ms_malloc(1 << 16);
    assert_non_null(got);
    for (int round = 0; round < 300; round++) {
        int32_t ids[24];
        size_t n = 1 + (size_t)(round % 24);
        for (size_t i = 0; i < n; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t r = (uint32_t)(rng >> 33);
            switch (r % 5) {
            case 0:
            case 1: ids[i] = (int32_t)(r / 5 % 256); break;        /* single bytes */
            case 2: ids[i] = (int32_t)(r / 5 % 128000); break;     /* ordinary tokens */
            case 3: ids[i] = 128000 + (int32_t)(r / 5 % 256); break; /* special tokens */
            default: ids[i] = (r / 5) % 2 ? 11410 : 200000; break;   /* emoji lead / unknown */
            }
        }
        ms_cli_utf8 s = {0};
        size_t w = 0;
        for (size_t i = 0; i < n; i++) {
            if (ms_tok_hf_is_special(tok, ids[i]))
                continue;
            size_t len;
            const char *b = ms_tok_hf_token_bytes(tok, ids[i], &len);
            if (b != NULL)
                w += ms_cli_utf8_push(&s, b, len, got + w);
        }
        w += ms_cli_utf8_flush(&s, got + w);
        char *want;
        size_t want_len;
        assert_int_equal(ms_tok_hf_decode(tok, ids, n, true, &want, &want_len, &err), MS_OK);
        if (w != want_len || memcmp(got, want, w) != 0)
            fail_msg("round %d: streamed %zu bytes, decode gives %zu", round, w, want_len);
        ms_free(want);
    }
    ms_free(got);
    ms_tok_hf_free(tok);
}

/* ---- model probe ---- */

static void test_model_probe(void **state) {
    (void)state;
    ms_error err = {0};
    ms_md_facts fa;
    int64_t params = -1;
    char *dir = NULL;
    const char *gqa = ms_test_fixture("hf/llama_gqa");
    char gqa_path[4096];
    snprintf(gqa_path, sizeof gqa_path, "%s", gqa);
    if (ms_cli_model_probe(&ms_llama_desc, gqa_path, &fa, &params, &dir, &err) != MS_OK)
        fail_msg("%s", err.msg);
    assert_int_equal(fa.vocab, 512);
    assert_int_equal(fa.n_layers, 3);
    assert_int_equal(fa.max_context, 512);
    /* config.json: hidden 128, 8 heads / 2 KV heads of 16, intermediate 344, 3 layers:
     * q, k, v, o, gate, up, down */
    int64_t h = 128, q = 8 * 16, kv = 2 * 16, ffn = 344;
    assert_int_equal(params, 3 * (h * q + 2 * h * kv + q * h + 3 * h * ffn));
    assert_string_equal(dir, gqa_path);
    ms_free(dir);

    /* a .safetensors file names its folder; a llama2.c file has none */
    char st_path[4200];
    snprintf(st_path, sizeof st_path, "%s/model.safetensors", gqa_path);
    assert_int_equal(ms_cli_model_probe(&ms_llama_desc, st_path, &fa, NULL, &dir, &err), MS_OK);
    assert_string_equal(dir, gqa_path);
    ms_free(dir);
    const char *l2c = ms_test_fixture("llama2c/aidreams260K.bin");
    assert_int_equal(ms_cli_model_probe(&ms_llama_desc, l2c, &fa, NULL, &dir, &err), MS_OK);
    assert_null(dir);
    assert_int_equal(fa.vocab, 512);
    assert_int_equal(fa.max_context, 128);
}

static void expect_probe_error(const char *path, ms_status want, const char *want_msg) {
    ms_error err = {0};
    ms_md_facts fa;
    char *dir = (char *)&err;
    assert_int_equal(ms_cli_model_probe(&ms_llama_desc, path, &fa, NULL, &dir, &err), want);
    assert_null(dir);
    if (strstr(err.msg, want_msg) == NULL || strstr(err.msg, path) != err.msg)
        fail_msg("%s: message '%s' does not start with the path or lacks '%s'", path, err.msg,
                 want_msg);
}

static void test_model_probe_errors(void **state) {
    (void)state;
    char tmp[] = "/tmp/ms_test_cli_XXXXXX";
    assert_non_null(mkdtemp(tmp));
    char missing[128], text[128], cfg[128];
    snprintf(missing, sizeof missing, "%s/nothing", tmp);
    snprintf(text, sizeof text, "%s/notes.txt", tmp);
    snprintf(cfg, sizeof cfg, "%s/config.json", tmp);
    FILE *f = fopen(text, "w");
    assert_non_null(f);
    fputs("hello\n", f);
    fclose(f);
    expect_probe_error("/dev/null", MS_ERR_FORMAT, ": not a model: a character device");
    expect_probe_error(tmp, MS_ERR_NOT_FOUND, ": not a model: the folder has no config.json");
    expect_probe_error(missing, MS_ERR_IO, ": cannot open the model (no such file or folder)");
    expect_probe_error(text, MS_ERR_FORMAT, ": not a model: unknown file type");
    /* a folder with a config.json that lacks a field: the config loader's message */
    f = fopen(cfg, "w");
    assert_non_null(f);
    fputs("{\"hidden_size\": 64}\n", f);
    fclose(f);
    ms_error err = {0};
    ms_md_facts fa;
    char *dir = NULL;
    assert_int_not_equal(ms_cli_model_probe(&ms_llama_desc, tmp, &fa, NULL, &dir, &err), MS_OK);
    assert_null(dir);
    assert_non_null(strstr(err.msg, "config.json: required field"));
    unlink(cfg);
    unlink(text);
    rmdir(tmp);
}

/* ---- bench: peak table and FLOPs ---- */

static void test_bf16_peak(void **state) {
    (void)state;
    assert_true(ms_cli_bf16_peak_tflops("NVIDIA H200", 9, 0) == 989.0);
    assert_true(ms_cli_bf16_peak_tflops("NVIDIA H100 80GB HBM3", 9, 0) == 989.0);
    assert_true(ms_cli_bf16_peak_tflops("NVIDIA H100 SXM5 80GB", 9, 0) == 989.0);
    assert_true(ms_cli_bf16_peak_tflops("NVIDIA A100-SXM4-80GB", 8, 0) == 312.0);
    assert_true(ms_cli_bf16_peak_tflops("NVIDIA A100 80GB PCIe", 8, 0) == 312.0);
    /* unknown names, a name that contradicts its compute capability, no name */
    assert_true(ms_cli_bf16_peak_tflops("NVIDIA GeForce RTX 4090", 8, 9) == 0.0);
    assert_true(ms_cli_bf16_peak_tflops("NVIDIA H100 PCIe", 9, 0) == 0.0);
    assert_true(ms_cli_bf16_peak_tflops("NVIDIA H100 NVL", 9, 0) == 0.0);
    assert_true(ms_cli_bf16_peak_tflops("NVIDIA H200 NVL", 9, 0) == 0.0);
    assert_true(ms_cli_bf16_peak_tflops("NVIDIA H200", 8, 0) == 0.0);
    assert_true(ms_cli_bf16_peak_tflops("", 9, 0) == 0.0);
    assert_true(ms_cli_bf16_peak_tflops(NULL, 9, 0) == 0.0);
}

static void test_prefill_flops(void **state) {
    (void)state;
    /* 2 x 1000 + 4 x 2 layers x width 4 x average of 1, 2, 3 keys (2) */
    assert_true(fabs(ms_cli_prefill_flops_per_token(1000, 0, 2, 4, 3, 0) - 2064.0) < 1e-9);
    /* window 2: the average of min(i, 2) over i = 1..3 is 5/3 */
    assert_true(fabs(ms_cli_prefill_flops_per_token(1000, 0, 2, 4, 3, 2) -
                     (2000.0 + 32.0 * 5.0 / 3.0)) < 1e-9);
    /* the head runs once per sequence: 2 x 300 / 3 per token */
    assert_true(fabs(ms_cli_prefill_flops_per_token(1000, 300, 2, 4, 3, 0) - 2264.0) < 1e-9);
    /* the 8B shape of docs/perf.md at 2048 tokens: 2 x 6.98e9 + 2 x 525e6 / 2048 + 4 x 32 x 4096
     * x 1024.5 */
    int64_t l8b = 32LL * (4096LL * 4096 * 2 + 2LL * 4096 * 1024 + 3LL * 4096 * 14336);
    double f = ms_cli_prefill_flops_per_token(l8b, 128256LL * 4096, 32, 4096, 2048, 0);
    double want = 2.0 * (double)l8b + 2.0 * 128256.0 * 4096.0 / 2048.0 + 4.0 * 32 * 4096 * 1024.5;
    assert_true(fabs(f - want) / want < 1e-12);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_parse_ids_accepts),
        ms_unit_test(test_parse_ids_rejects),
        ms_unit_test(test_parse_ids_oom),
        ms_unit_test(test_flag_numbers),
        ms_unit_test(test_utf8_stream),
        ms_unit_test(test_utf8_stream_tokens),
        ms_unit_test(test_model_probe),
        ms_unit_test(test_model_probe_errors),
        ms_unit_test(test_bf16_peak),
        ms_unit_test(test_prefill_flops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
