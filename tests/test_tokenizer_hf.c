/*
 * test_tokenizer_hf.c - Hugging Face tokenizer.json (byte-level BPE) against the real Qwen3 and
 * Llama 3.1 tokenizers of ../shared/fixtures/tokenizers: the library's reference ids and decoded
 * text for 12 strings each, library ids for 12 corner-case strings, special tokens,
 * tokenizer_config.json, invalid UTF-8, partial UTF-8 on decode, NFC, long inputs, random round
 * trips, concurrent encodes; a small synthetic tokenizer (written into a mkdtemp folder) for the
 * added-token flags, merge formats, split behaviours, post-processor and allocation-failure
 * injection; and bad files, each giving a one-line error naming file and problem.
 */
#include "ms_test.h"

#include <dirent.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tokenizer_hf.h"

#include "ms_test_impl.h"

#define QWEN3 "tokenizers/qwen3/tokenizer.json"
#define LLAMA3 "tokenizers/llama3_1/tokenizer.json"
#define REFERENCE "tokenizers/reference.json"

/* ---- shared fixtures: both real tokenizers and the reference, loaded once per binary ---- */

static ms_tok_hf *g_qwen, *g_llama;
static json_t *g_ref;

static int group_setup(void **state) {
    (void)state;
    ms_error err = {0};
    char qwen_path[4096], llama_path[4096];
    snprintf(qwen_path, sizeof qwen_path, "%s", ms_test_fixture(QWEN3));
    snprintf(llama_path, sizeof llama_path, "%s", ms_test_fixture(LLAMA3));
    if (ms_tok_hf_init(&g_qwen, qwen_path, &err) != MS_OK || ms_tok_hf_init(&g_llama, llama_path, &err) != MS_OK) {
        fprintf(stderr, "loading fixtures: %s\n", err.msg);
        return -1;
    }
    json_error_t jerr;
    g_ref = json_load_file(ms_test_fixture(REFERENCE), 0, &jerr);
    if (g_ref == NULL) {
        fprintf(stderr, "%s: %s\n", REFERENCE, jerr.text);
        return -1;
    }
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    ms_tok_hf_free(g_qwen);
    ms_tok_hf_free(g_llama);
    json_decref(g_ref);
    return 0;
}

/* Leak-checked test on the shared tokenizers: their word caches are emptied before the check. */
static int shared_teardown(void **state) {
    ms_tok_hf_clear_cache(g_qwen);
    ms_tok_hf_clear_cache(g_llama);
    return ms_test_leak_teardown(state);
}

#define shared_test(f) cmocka_unit_test_setup_teardown(f, ms_test_leak_setup, shared_teardown)

/* ---- temp folder for written files ---- */

static char tmp_dir[256];

static int tmp_setup(void **state) {
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/ms_test_tokhf_XXXXXX");
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

static const char *write_file(const char *name, const void *data, size_t n) {
    const char *p = tmp_path(name);
    FILE *fp = fopen(p, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(data, 1, n, fp), n);
    fclose(fp);
    return p;
}

static const char *write_text(const char *name, const char *text) { return write_file(name, text, strlen(text)); }

/* ---- helpers ---- */

/* Encode `text` (strlen) and compare with ids[0 .. n). */
static void expect_encode(const ms_tok_hf *tok, const char *text, bool add_special, const int32_t *want, size_t n) {
    ms_error err = {0};
    int32_t *ids = NULL;
    size_t got = 0;
    assert_int_equal(ms_tok_hf_encode(tok, text, strlen(text), add_special, &ids, &got, &err), MS_OK);
    if (got != n)
        fprintf(stderr, "encode \"%s\": %zu ids, want %zu\n", text, got, n);
    assert_int_equal(got, n);
    for (size_t i = 0; i < n; i++) {
        if (ids[i] != want[i])
            fprintf(stderr, "encode \"%s\": ids[%zu] = %d, want %d\n", text, i, ids[i], want[i]);
        assert_int_equal(ids[i], want[i]);
    }
    ms_free(ids);
}

/* Decode ids and compare with `want` (want_len bytes). */
static void expect_decode(const ms_tok_hf *tok, const int32_t *ids, size_t n, bool skip, const char *want,
                          size_t want_len) {
    ms_error err = {0};
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(ms_tok_hf_decode(tok, ids, n, skip, &text, &len, &err), MS_OK);
    assert_non_null(text);
    assert_int_equal(len, want_len);
    assert_memory_equal(text, want, len);
    assert_int_equal(text[len], '\0');
    ms_free(text);
}

/* The error of a failed load must be one line that starts with the path and mentions `what`. */
static void expect_load_error(const char *path, ms_status code, const char *what) {
    ms_tok_hf *tok = (ms_tok_hf *)1;
    ms_error err = {0};
    ms_status st = ms_tok_hf_init(&tok, path, &err);
    if (st != code || strstr(err.msg, what) == NULL)
        fprintf(stderr, "load %s: got %d \"%s\", want %d mentioning \"%s\"\n", path, st, err.msg, code, what);
    assert_int_equal(st, code);
    assert_null(tok);
    assert_int_equal(strncmp(err.msg, path, strlen(path)), 0);
    assert_non_null(strstr(err.msg, what));
    assert_null(strchr(err.msg, '\n'));
}

/* ---- reference encodings ---- */

static void check_reference(const ms_tok_hf *tok, const char *name) {
    const json_t *cases = json_object_get(g_ref, name);
    assert_true(json_is_array(cases));
    assert_int_equal(json_array_size(cases), 12);
    for (int pass = 0; pass < 2; pass++) {  /* the second pass is served by the word cache */
        for (size_t i = 0; i < json_array_size(cases); i++) {
            const json_t *c = json_array_get(cases, i);
            const char *text = json_string_value(json_object_get(c, "text"));
            const char *decoded = json_string_value(json_object_get(c, "decoded"));
            const json_t *jids = json_object_get(c, "ids");
            assert_non_null(text);
            assert_non_null(decoded);
            size_t n = json_array_size(jids);
            int32_t *want = malloc((n + 1) * sizeof *want);
            assert_non_null(want);
            for (size_t k = 0; k < n; k++)
                want[k] = (int32_t)json_integer_value(json_array_get(jids, k));
            expect_encode(tok, text, false, want, n);
            /* The reference decodes with skip_special_tokens=True. */
            expect_decode(tok, want, n, true, decoded, strlen(decoded));
            free(want);
        }
    }
}

static void test_reference_qwen3(void **state) {
    (void)state;
    check_reference(g_qwen, "qwen3");
}

static void test_reference_llama3_1(void **state) {
    (void)state;
    check_reference(g_llama, "llama3_1");
}

/* ---- more library encodings ---- */

/*
 * Strings that probe the corners of the two regexes and of the added-token split (Unicode white
 * space incl. U+180E, which is not White_Space; uppercase contractions; CR LF runs; digit groups;
 * Hangul and combining marks (NFC for Qwen3); adjacent special tokens of the other model; ZWJ
 * emoji; control characters; RTL and Indic scripts), with the ids that the `tokenizers` library
 * 0.23.2 gives (add_special_tokens=False), generated by:
 *     from tokenizers import Tokenizer
 *     for t in texts: print(Tokenizer.from_file(path).encode(t, add_special_tokens=False).ids)
 * Each list ends with -1. Decoding gives the text back (Qwen3: its NFC).
 */
static const struct {
    const char *text;
    size_t len;
    int32_t qwen3[40];
    int32_t llama3_1[40];
} library_cases[] = {
    {"a\xe1\xa0\x8e b\xc2\xa0"
     "c\xc2\x85"
     "d\xe3\x80\x80"
     "e\xe2\x80\xa8"
     "f", 20,
     {64, 123970, 236, 293, 4102, 66, 126, 227, 67, 22441, 68, 378, 101, 69, -1},
     {64, 157, 254, 236, 293, 117155, 116360, 67, 23249, 68, 378, 101, 69, -1}},
    {"HE'LL we'Re 'S", 14,
     {1799, 6, 4086, 582, 49427, 364, 50, -1},
     {1837, 6, 4178, 584, 50527, 364, 50, -1}},
    {"\x0d\x0a\x0d\x0a  \x0a\x09 x", 10,
     {871, 2303, 197, 856, -1},
     {881, 2355, 197, 865, -1}},
    {"1234567 12 1", 12,
     {16, 17, 18, 19, 20, 21, 22, 220, 16, 17, 220, 16, -1},
     {4513, 10961, 22, 220, 717, 220, 16, -1}},
    {"\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8 \xea\xb0\x81 A\xcc\x8a \xe2\x84\xab e\xcc\x81\xcc"
     "\xa3", 27,
     {126317, 126804, 79252, 79252, 220, 124635, 53839, -1},
     {157, 226, 222, 157, 227, 94, 157, 228, 101, 106603, 362, 136, 232, 29753, 104, 384, 54939, 105001, -1}},
    {"<|im_start|><|im_end|><|eot_id|> <|begin_of_text|>", 50,
     {151644, 151645, 27, 91, 68, 354, 842, 91, 29, 82639, 7265, 3575, 4326, 91, 29, -1},
     {27, 91, 318, 5011, 91, 1822, 91, 318, 6345, 91, 29, 128009, 220, 128000, -1}},
    {"x<think>\x0a</think>\x0a\x0ay", 20,
     {87, 151667, 198, 151668, 271, 88, -1},
     {87, 14023, 771, 397, 524, 27963, 1363, 88, -1}},
    {"\xf0\x9f\xa7\x91\xe2\x80\x8d\xf0\x9f\x92\xbb \xef\xb8\x8f\xe2\x83\xa3", 18,
     {148738, 378, 235, 145851, 220, 30543, 158, 225, 96, -1},
     {9468, 100, 239, 102470, 93273, 119, 220, 31643, 158, 225, 96, -1}},
    {"  ", 2,
     {256, -1},
     {256, -1}},
    {"\x00\x1f\x7f\xc2\xad", 5,
     {188, 219, 221, 5760, -1},
     {188, 219, 221, 5879, -1}},
    {"http://example.com/a\x3f"
     "b=c&d=e#f", 30,
     {1254, 1110, 8687, 905, 14186, 30, 65, 19535, 5, 67, 40391, 2, 69, -1},
     {1277, 1129, 8858, 916, 14520, 30, 65, 20105, 5, 67, 41491, 2, 69, -1}},
    {"\xd8\xa7\xd9\x84\xd8\xb3\xd9\x84\xd8\xa7\xd9\x85 \xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8"
     "\xe0\xa5\x8d\xe0\xa4\xa4\xe0\xa5\x87 \xe0\xb8\xaa\xe0\xb8\xa7\xe0\xb8\xb1\xe0\xb8\xaa"
     "\xe0\xb8\x94\xe0\xb8\xb5", 50,
     {31382, 124941, 14925, 101, 87244, 78368, 30484, 97, 34370, 129328, 37213, 23271, 125136, 28319, -1},
     {32482, 107760, 100282, 88344, 79468, 100365, 35470, 100568, 38313, 119657, 29419, -1}},
};

static void expect_library_ids(const ms_tok_hf *tok, const char *text, size_t len, const int32_t *want) {
    size_t n = 0;
    while (want[n] >= 0)
        n++;
    ms_error err = {0};
    int32_t *ids = NULL;
    size_t got = 0;
    assert_int_equal(ms_tok_hf_encode(tok, text, len, false, &ids, &got, &err), MS_OK);
    bool same = got == n && (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0);
    if (!same) {
        fprintf(stderr, "encode \"%.*s\": got", (int)len, text);
        for (size_t i = 0; i < got; i++)
            fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }
    assert_true(same);
    ms_free(ids);
}

static void test_library_corner_cases(void **state) {
    (void)state;
    for (size_t i = 0; i < MS_ARRAY_LEN(library_cases); i++) {
        const char *text = library_cases[i].text;
        size_t len = library_cases[i].len;
        expect_library_ids(g_qwen, text, len, library_cases[i].qwen3);
        expect_library_ids(g_llama, text, len, library_cases[i].llama3_1);
        size_t n = 0;
        while (library_cases[i].llama3_1[n] >= 0)
            n++;
        expect_decode(g_llama, library_cases[i].llama3_1, n, false, text, len);
        char *nfc = NULL;
        size_t nfc_len = 0;
        ms_error err = {0};
        assert_int_equal(ms_tok_hf_nfc(text, len, &nfc, &nfc_len, &err), MS_OK);
        n = 0;
        while (library_cases[i].qwen3[n] >= 0)
            n++;
        expect_decode(g_qwen, library_cases[i].qwen3, n, false, nfc, nfc_len);
        ms_free(nfc);
    }
}

/* ---- special tokens, config, vocabulary ---- */

static void test_special_tokens_qwen3(void **state) {
    (void)state;
    const ms_tok_hf *t = g_qwen;
    assert_int_equal(ms_tok_hf_vocab_size(t), 151669);
    int32_t eot = ms_tok_hf_token_id(t, "<|endoftext|>");
    int32_t im_start = ms_tok_hf_token_id(t, "<|im_start|>");
    int32_t im_end = ms_tok_hf_token_id(t, "<|im_end|>");
    int32_t think = ms_tok_hf_token_id(t, "<think>");
    assert_int_equal(eot, 151643);
    assert_int_equal(im_start, 151644);
    assert_int_equal(im_end, 151645);
    assert_int_equal(think, 151667);
    assert_true(ms_tok_hf_is_special(t, eot));
    assert_false(ms_tok_hf_is_special(t, think));  /* <think> is added but not special */
    assert_false(ms_tok_hf_is_special(t, 9707));
    assert_false(ms_tok_hf_is_special(t, -1));
    assert_int_equal(ms_tok_hf_token_id(t, "Hello"), 9707);
    assert_int_equal(ms_tok_hf_token_id(t, "no such token at all"), -1);
    assert_string_equal(ms_tok_hf_token_str(t, im_end), "<|im_end|>");
    assert_null(ms_tok_hf_token_str(t, 151669));
    assert_null(ms_tok_hf_token_str(t, -3));
    /* tokenizer_config.json: no bos, eos <|im_end|>, a chat template using the im tokens. */
    assert_null(ms_tok_hf_bos_token(t));
    assert_int_equal(ms_tok_hf_bos_id(t), -1);
    assert_string_equal(ms_tok_hf_eos_token(t), "<|im_end|>");
    assert_int_equal(ms_tok_hf_eos_id(t), im_end);
    assert_non_null(ms_tok_hf_chat_template(t));
    assert_non_null(strstr(ms_tok_hf_chat_template(t), "<|im_start|>"));

    /* Special tokens inside text, adjacent to each other and to words; decode keeps them unless
     * asked to skip them; <think> survives skip_special (not special). */
    const char *text = "a<|endoftext|><|im_start|>Hello<think>x</think>";
    int32_t *ids = NULL;
    size_t n = 0;
    ms_error err = {0};
    assert_int_equal(ms_tok_hf_encode(t, text, strlen(text), false, &ids, &n, &err), MS_OK);
    int32_t think_end = ms_tok_hf_token_id(t, "</think>");
    int32_t want[] = {ms_tok_hf_token_id(t, "a"), eot, im_start, 9707, think, ms_tok_hf_token_id(t, "x"),
                      think_end};
    assert_int_equal(n, MS_ARRAY_LEN(want));
    assert_memory_equal(ids, want, sizeof want);
    expect_decode(t, ids, n, false, text, strlen(text));
    expect_decode(t, ids, n, true, "aHello<think>x</think>", 22);
    ms_free(ids);
    /* A partial special token is plain text. */
    const char *partial = "<|im_start";
    assert_int_equal(ms_tok_hf_encode(t, partial, strlen(partial), false, &ids, &n, &err), MS_OK);
    for (size_t i = 0; i < n; i++)
        assert_true(ids[i] < 151643);
    expect_decode(t, ids, n, false, partial, strlen(partial));
    ms_free(ids);
    /* Qwen's post-processor is ByteLevel only: add_special adds nothing. */
    int32_t hello[] = {9707, 11, 1879, 0};
    expect_encode(t, "Hello, world!", true, hello, 4);
}

static void test_special_tokens_llama3_1(void **state) {
    (void)state;
    const ms_tok_hf *t = g_llama;
    assert_int_equal(ms_tok_hf_vocab_size(t), 128256);
    assert_string_equal(ms_tok_hf_bos_token(t), "<|begin_of_text|>");
    assert_int_equal(ms_tok_hf_bos_id(t), 128000);
    assert_string_equal(ms_tok_hf_eos_token(t), "<|eot_id|>");
    assert_int_equal(ms_tok_hf_eos_id(t), 128009);
    assert_non_null(ms_tok_hf_chat_template(t));
    assert_non_null(strstr(ms_tok_hf_chat_template(t), "<|start_header_id|>"));
    assert_int_equal(ms_tok_hf_token_id(t, "<|reserved_special_token_250|>"), 128255);
    /* The TemplateProcessing post-processor prepends <|begin_of_text|> when add_special. */
    int32_t hello[] = {128000, 9906, 11, 1917, 0};
    expect_encode(t, "Hello, world!", true, hello, 5);
    expect_encode(t, "Hello, world!", false, hello + 1, 4);
    int32_t only_bos[] = {128000};
    expect_encode(t, "", true, only_bos, 1);
    /* Chat framing: special tokens split out of the text, words around them. */
    const char *text = "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>";
    int32_t *ids = NULL;
    size_t n = 0;
    ms_error err = {0};
    assert_int_equal(ms_tok_hf_encode(t, text, strlen(text), false, &ids, &n, &err), MS_OK);
    int32_t sh = ms_tok_hf_token_id(t, "<|start_header_id|>"), eh = ms_tok_hf_token_id(t, "<|end_header_id|>");
    int32_t want[] = {sh, ms_tok_hf_token_id(t, "user"), eh, ms_tok_hf_token_id(t, "ĊĊ"), ms_tok_hf_token_id(t, "Hi"),
                      128009};
    assert_int_equal(n, MS_ARRAY_LEN(want));
    assert_memory_equal(ids, want, sizeof want);
    expect_decode(t, ids, n, false, text, strlen(text));
    expect_decode(t, ids, n, true, "user\n\nHi", 8);
    ms_free(ids);
}

/* ---- edges: empty, invalid UTF-8, partial UTF-8 on decode, unknown ids ---- */

static void test_empty_and_invalid_utf8(void **state) {
    (void)state;
    const ms_tok_hf *toks[] = {g_qwen, g_llama};
    for (size_t k = 0; k < 2; k++) {
        const ms_tok_hf *t = toks[k];
        ms_error err = {0};
        int32_t *ids = (int32_t *)1;
        size_t n = 7;
        assert_int_equal(ms_tok_hf_encode(t, "", 0, false, &ids, &n, &err), MS_OK);
        assert_null(ids);
        assert_int_equal(n, 0);
        expect_decode(t, NULL, 0, false, "", 0);
        /* Invalid UTF-8: stray continuation, truncated sequence, surrogate, overlong, > U+10FFFF, 0xFF. */
        static const struct {
            const char *s;
            size_t len;
            const char *offset;
        } bad[] = {
            {"ab\x80", 3, "offset 2"},        {"abc\xc3", 4, "offset 3"},   {"x\xed\xa0\x80y", 5, "offset 1"},
            {"\xc0\xaf", 2, "offset 0"},      {"\xf4\x90\x80\x80", 4, "offset 0"}, {"ok \xff", 4, "offset 3"},
            {"<|im_start|>\xe2\x82", 14, "offset 12"},
        };
        for (size_t i = 0; i < MS_ARRAY_LEN(bad); i++) {
            ids = (int32_t *)1;
            assert_int_equal(ms_tok_hf_encode(t, bad[i].s, bad[i].len, true, &ids, &n, &err), MS_ERR_INVALID_ARG);
            assert_null(ids);
            assert_non_null(strstr(err.msg, "not valid UTF-8"));
            assert_non_null(strstr(err.msg, bad[i].offset));
        }
        /* NUL bytes are ordinary characters when a length is given. */
        assert_int_equal(ms_tok_hf_encode(t, "a\0b", 3, false, &ids, &n, &err), MS_OK);
        expect_decode(t, ids, n, false, "a\0b", 3);
        ms_free(ids);
    }
}

static void test_decode_partial_utf8(void **state) {
    (void)state;
    const ms_tok_hf *t = g_llama;
    /* Llama 3 splits the llama emoji into three byte tokens (reference: 11410, 99, 247). */
    int32_t *ids = NULL;
    size_t n = 0;
    ms_error err = {0};
    const char *llama = "\xf0\x9f\xa6\x99";
    assert_int_equal(ms_tok_hf_encode(t, llama, 4, false, &ids, &n, &err), MS_OK);
    assert_true(n >= 2 && n <= 4);
    /* Streaming: the raw bytes of the tokens concatenate to the character. */
    char cat[16];
    size_t pos = 0, last_len = 0;
    for (size_t i = 0; i < n; i++) {
        const char *b = ms_tok_hf_token_bytes(t, ids[i], &last_len);
        assert_non_null(b);
        assert_true(pos + last_len <= sizeof cat);
        memcpy(cat + pos, b, last_len);
        pos += last_len;
    }
    assert_int_equal(pos, 4);
    assert_memory_equal(cat, llama, 4);
    /* A final decode of an incomplete character gives one U+FFFD per maximal invalid subpart: the
     * tokens but the last make one (a lead byte and its valid continuations) ... */
    expect_decode(t, ids, n - 1, false, "\xef\xbf\xbd", 3);
    /* ... and the last token's bytes, cut off from their lead byte by "Hello", one each. */
    int32_t mixed[8];
    memcpy(mixed, ids, (n - 1) * sizeof *ids);
    mixed[n - 1] = 9906;
    mixed[n] = ids[n - 1];
    char want[64] = "\xef\xbf\xbdHello";
    for (size_t i = 0; i < last_len; i++)
        strcat(want, "\xef\xbf\xbd");
    expect_decode(t, mixed, n + 1, false, want, strlen(want));
    /* Ids that name no token are skipped, as the library does. */
    int32_t unknown[] = {-5, 9906, 128256, 1 << 30};
    expect_decode(t, unknown, 4, false, "Hello", 5);
    size_t len = 9;
    assert_null(ms_tok_hf_token_bytes(t, -1, &len));
    assert_int_equal(len, 0);
    ms_free(ids);
}

/* ---- NFC ---- */

static void expect_nfc(const char *in, const char *want) {
    char *out = NULL;
    size_t len = 0;
    ms_error err = {0};
    assert_int_equal(ms_tok_hf_nfc(in, strlen(in), &out, &len, &err), MS_OK);
    if (len != strlen(want) || memcmp(out, want, len) != 0)
        fprintf(stderr, "NFC(\"%s\") = \"%s\", want \"%s\"\n", in, out, want);
    assert_int_equal(len, strlen(want));
    assert_memory_equal(out, want, len);
    ms_free(out);
}

static void test_nfc(void **state) {
    (void)state;
    expect_nfc("", "");
    expect_nfc("plain ascii", "plain ascii");
    expect_nfc("e\xcc\x81", "\xc3\xa9");                      /* e + acute -> é */
    expect_nfc("\xc3\xa9", "\xc3\xa9");                       /* already composed */
    expect_nfc("\xe2\x84\xab", "\xc3\x85");                   /* U+212B ANGSTROM SIGN -> U+00C5 (singleton) */
    expect_nfc("\xe1\x84\x80\xe1\x85\xa1", "\xea\xb0\x80");   /* Hangul L + V -> U+AC00 */
    expect_nfc("\xea\xb0\x80\xe1\x86\xa8", "\xea\xb0\x81");   /* LV + T -> U+AC01 */
    /* a + dot above (230) + dot below (220): reordered, then a + dot below composes to U+1EA1. */
    expect_nfc("a\xcc\x87\xcc\xa3", "\xe1\xba\xa1\xcc\x87");
    expect_nfc("\xcc\x81" "e", "\xcc\x81" "e");               /* a leading mark composes with nothing */
    expect_nfc("\xe0\xbd\xb3", "\xe0\xbd\xb1\xe0\xbd\xb2");   /* U+0F73: excluded from composition */
    ms_error err = {0};
    char *out = (char *)1;
    size_t len = 0;
    assert_int_equal(ms_tok_hf_nfc("\xcc", 1, &out, &len, &err), MS_ERR_INVALID_ARG);
    assert_null(out);
    /* Qwen3 normalizes with NFC before tokenizing, Llama 3.1 does not. */
    int32_t *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    assert_int_equal(ms_tok_hf_encode(g_qwen, "caf\xc3\xa9", 5, false, &a, &na, &err), MS_OK);
    assert_int_equal(ms_tok_hf_encode(g_qwen, "cafe\xcc\x81", 6, false, &b, &nb, &err), MS_OK);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, na * sizeof *a);
    ms_free(a);
    ms_free(b);
    assert_int_equal(ms_tok_hf_encode(g_llama, "caf\xc3\xa9", 5, false, &a, &na, &err), MS_OK);
    assert_int_equal(ms_tok_hf_encode(g_llama, "cafe\xcc\x81", 6, false, &b, &nb, &err), MS_OK);
    expect_decode(g_llama, b, nb, false, "cafe\xcc\x81", 6);
    assert_false(na == nb && memcmp(a, b, na * sizeof *a) == 0);
    ms_free(a);
    ms_free(b);
}

/* ---- long inputs and random round trips ---- */

static void test_long_inputs(void **state) {
    (void)state;
    /* 100000 'a': one pre-token; merges pair a's leftmost-first, then pairs of pairs, up to the
     * longest run token of 8 a's (as in the 300-a reference), so 12500 copies of that token. */
    size_t n_a = 100000;
    char *text = malloc(n_a + 1);
    assert_non_null(text);
    memset(text, 'a', n_a);
    text[n_a] = '\0';
    const ms_tok_hf *toks[] = {g_qwen, g_llama};
    for (size_t k = 0; k < 2; k++) {
        int32_t a8 = ms_tok_hf_token_id(toks[k], "aaaaaaaa");
        assert_true(a8 >= 0);
        assert_int_equal(ms_tok_hf_token_id(toks[k], "aaaaaaaaaaaaaaaa"), -1);
        int32_t *ids = NULL;
        size_t n = 0;
        ms_error err = {0};
        assert_int_equal(ms_tok_hf_encode(toks[k], text, n_a, false, &ids, &n, &err), MS_OK);
        assert_int_equal(n, n_a / 8);
        for (size_t i = 0; i < n; i++)
            assert_int_equal(ids[i], a8);
        expect_decode(toks[k], ids, n, false, text, n_a);
        ms_free(ids);
    }
    free(text);
    /* A long mixed text (2000 sentences, one call): round trip. */
    const char *sent = "The quick brown fox, 3.14 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e, jumps!\n\t ";
    size_t sl = strlen(sent), reps = 2000;
    char *big = malloc(sl * reps + 1);
    assert_non_null(big);
    for (size_t i = 0; i < reps; i++)
        memcpy(big + i * sl, sent, sl);
    big[sl * reps] = '\0';
    for (size_t k = 0; k < 2; k++) {
        int32_t *ids = NULL;
        size_t n = 0;
        ms_error err = {0};
        assert_int_equal(ms_tok_hf_encode(toks[k], big, sl * reps, false, &ids, &n, &err), MS_OK);
        assert_true(n > reps * 10);
        expect_decode(toks[k], ids, n, false, big, sl * reps);
        ms_free(ids);
    }
    free(big);
}

static size_t put_utf8(char *o, uint32_t c) {
    if (c < 0x80) {
        o[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (char)(0xC0 | (c >> 6));
        o[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | (c >> 12));
        o[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        o[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (c >> 18));
    o[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3F));
    o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* Random text from ASCII, white space, Latin + combining marks, CJK, Hangul jamo, emoji, NUL and
 * special-token fragments: decode(encode(x)) is x for Llama 3.1 and NFC(x) for Qwen3 (Qwen3 normalizes
 * the text between special tokens separately; U+0338, which composes with '>' and '<', is left out
 * so that the whole text's NFC is the same). */
static void test_random_round_trip(void **state) {
    (void)state;
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    static const uint32_t pool[][2] = {
        {0x20, 0x7E}, {0x09, 0x0D}, {0xC0, 0x17F}, {0x300, 0x337}, {0x4E00, 0x4E40}, {0x1100, 0x1175},
        {0x1F600, 0x1F64F}, {0x0, 0x0}, {0x3000, 0x3003}, {0x10000, 0x10010},
    };
    static const char *const frags[] = {"<|im_end|>", "<|eot_id|>", "<|im_", "'s", " 's", "  ", "\r\n", "123456"};
    char *buf = malloc(4096);
    assert_non_null(buf);
    for (int iter = 0; iter < 300; iter++) {
        size_t len = 0;
        int n_chars = (int)(rng % 40);
        for (int c = 0; c < n_chars; c++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t r = (uint32_t)(rng >> 33);
            if (r % 9 == 0) {
                const char *f = frags[(r / 9) % MS_ARRAY_LEN(frags)];
                memcpy(buf + len, f, strlen(f));
                len += strlen(f);
                continue;
            }
            const uint32_t *range = pool[(r / 9) % MS_ARRAY_LEN(pool)];
            len += put_utf8(buf + len, range[0] + (r >> 8) % (range[1] - range[0] + 1));
        }
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        ms_error err = {0};
        int32_t *ids = NULL;
        size_t n = 0;
        assert_int_equal(ms_tok_hf_encode(g_llama, buf, len, false, &ids, &n, &err), MS_OK);
        expect_decode(g_llama, ids, n, false, buf, len);
        ms_free(ids);
        char *nfc = NULL;
        size_t nfc_len = 0;
        assert_int_equal(ms_tok_hf_nfc(buf, len, &nfc, &nfc_len, &err), MS_OK);
        assert_int_equal(ms_tok_hf_encode(g_qwen, buf, len, false, &ids, &n, &err), MS_OK);
        expect_decode(g_qwen, ids, n, false, nfc, nfc_len);
        ms_free(ids);
        ms_free(nfc);
    }
    free(buf);
}

/* ---- concurrency: encodes on one tokenizer share its word cache ---- */

static void *encode_worker(void *arg) {
    (void)arg;
    const json_t *cases = json_object_get(g_ref, "qwen3");
    for (int rep = 0; rep < 5; rep++)
        for (size_t i = 0; i < json_array_size(cases); i++) {
            const json_t *c = json_array_get(cases, i);
            const char *text = json_string_value(json_object_get(c, "text"));
            const json_t *jids = json_object_get(c, "ids");
            int32_t *ids = NULL;
            size_t n = 0;
            ms_error err = {0};
            if (ms_tok_hf_encode(g_qwen, text, strlen(text), false, &ids, &n, &err) != MS_OK)
                return (void *)1;
            bool same = n == json_array_size(jids);
            for (size_t k = 0; same && k < n; k++)
                same = ids[k] == json_integer_value(json_array_get(jids, k));
            ms_free(ids);
            if (!same)
                return (void *)1;
        }
    return NULL;
}

static void test_concurrent_encode(void **state) {
    (void)state;
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, encode_worker, NULL), 0);
    for (int i = 0; i < 4; i++) {
        void *ret = (void *)1;
        assert_int_equal(pthread_join(th[i], &ret), 0);
        assert_null(ret);
    }
}

/* ---- a small synthetic tokenizer ---- */

/* GPT-2's bytes_to_unicode: the byte-level character of byte b, as JSON-escaped text. */
static const char *synth_byte_char(unsigned b) {
    static char buf[4][16];
    static int k;
    k = (k + 1) % 4;
    bool same = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    unsigned c = b;
    if (!same) {
        c = 256;
        for (unsigned x = 0; x < b; x++)
            c += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174);
    }
    if (c == '"' || c == '\\')
        snprintf(buf[k], sizeof buf[k], "\\%c", (char)c);
    else if (c < 128)
        snprintf(buf[k], sizeof buf[k], "%c", (char)c);
    else
        snprintf(buf[k], sizeof buf[k], "\\u%04x", c);
    return buf[k];
}


/* The byte-level characters the synthetic vocabulary does not spell out, as SYNTH_BYTE_ID(b):
 * a ByteLevel BPE must have one for every byte (tok_check_bytes). */
#define SYNTH_BYTE_ID(b) (100 + (b))
static const char *synth_byte_vocab(void) {
    static char buf[8192];
    size_t n = 0;
    for (unsigned b = 0; b < 256; b++) {
        if (strchr("abctok_<>xy", (int)b) != NULL && b != 0)
            continue;
        if (b == ' ' || b == 0xC3 || b == 0xA9)  /* Ġ, Ã, © */
            continue;
        n += (size_t)snprintf(buf + n, sizeof buf - n, ", \"%s\": %u", synth_byte_char(b), SYNTH_BYTE_ID(b));
        assert_true(n < sizeof buf);
    }
    return buf;
}

/*
 * Byte-level vocabulary of a few letters (and every other byte's character at SYNTH_BYTE_ID),
 * merges in both formats ("ab c" and ["a", "b"]), added
 * tokens <x> (special, lstrip), <y> (rstrip), tok (single_word, normalized), a Split + ByteLevel
 * pre-tokenizer and a TemplateProcessing post-processor <x> A <y>. The %s slots let tests break one
 * part: model type, the second merge, normalizer, pre-tokenizer.
 */
static const char *synth_json(char *buf, size_t cap, const char *model_type, const char *merge2,
                              const char *normalizer, const char *pretok) {
    int n = snprintf(buf, cap,
        "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null,\n"
        " \"added_tokens\": [\n"
        "  {\"id\": 20, \"content\": \"<x>\", \"single_word\": false, \"lstrip\": true, \"rstrip\": false,"
        " \"normalized\": false, \"special\": true},\n"
        "  {\"id\": 21, \"content\": \"<y>\", \"single_word\": false, \"lstrip\": false, \"rstrip\": true,"
        " \"normalized\": false, \"special\": false},\n"
        "  {\"id\": 22, \"content\": \"tok\", \"single_word\": true, \"lstrip\": false, \"rstrip\": false,"
        " \"normalized\": true, \"special\": false}],\n"
        " \"normalizer\": %s,\n"
        " \"pre_tokenizer\": %s,\n"
        " \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<x>\","
        " \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, {\"SpecialToken\": {\"id\": \"<y>\","
        " \"type_id\": 0}}], \"pair\": [], \"special_tokens\": {\"<x>\": {\"id\": \"<x>\", \"ids\": [20],"
        " \"tokens\": [\"<x>\"]}, \"<y>\": {\"id\": \"<y>\", \"ids\": [21], \"tokens\": [\"<y>\"]}}},\n"
        " \"decoder\": {\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"trim_offsets\": true,"
        " \"use_regex\": true},\n"
        " \"model\": {\"type\": \"%s\", \"dropout\": null, \"unk_token\": null, \"continuing_subword_prefix\": null,"
        " \"end_of_word_suffix\": null, \"fuse_unk\": false, \"byte_fallback\": false, \"ignore_merges\": false,\n"
        "  \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"\\u0120\": 3, \"ab\": 4, \"abc\": 5, \"\\u0120a\": 6,"
        " \"t\": 7, \"o\": 8, \"k\": 9, \"_\": 10, \"<\": 11, \">\": 12, \"x\": 13, \"y\": 14, \"\\u00c3\": 15,"
        " \"\\u00a9\": 16, \"\\u00c3\\u00a9\": 17%s},\n"
        "  \"merges\": [[\"a\", \"b\"], %s, \"\\u0120 a\", \"\\u00c3 \\u00a9\"]}}\n",
        normalizer, pretok, model_type, synth_byte_vocab(), merge2);
    assert_true(n > 0 && (size_t)n < cap);
    return buf;
}

#define SYNTH_PRETOK                                                                                         \
    "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\":"              \
    " \" ?\\\\p{L}+|\\\\s+|[^\\\\s\\\\p{L}]+\"}, \"behavior\": \"Isolated\", \"invert\": false},"            \
    " {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"trim_offsets\": false, \"use_regex\": false}]}"

static const char *write_synth(const char *name, const char *model_type, const char *merge2, const char *norm,
                               const char *pretok) {
    static char buf[16384];
    return write_text(name, synth_json(buf, sizeof buf, model_type, merge2, norm, pretok));
}

static void test_synthetic_tokenizer(void **state) {
    (void)state;
    write_text("tokenizer_config.json",
               "{\"bos_token\": {\"content\": \"<x>\", \"lstrip\": false}, \"eos_token\": \"<y>\","
               " \"model_max_length\": 1000000000000000019884624838656,"
               " \"chat_template\": [{\"name\": \"default\", \"template\": \"T\"}, {\"name\": \"tool_use\","
               " \"template\": \"U\"}]}");
    const char *path = write_synth("tokenizer.json", "BPE", "\"ab c\"", "{\"type\": \"NFC\"}", SYNTH_PRETOK);
    ms_tok_hf *t = NULL;
    ms_error err = {0};
    assert_int_equal(ms_tok_hf_init(&t, path, &err), MS_OK);
    assert_int_equal(ms_tok_hf_vocab_size(t), SYNTH_BYTE_ID(255) + 1);
    assert_int_equal(ms_tok_hf_bos_id(t), 20);
    assert_int_equal(ms_tok_hf_eos_id(t), 21);
    assert_string_equal(ms_tok_hf_chat_template(t), "T");
    /* Merges of both formats, by rank. */
    expect_encode(t, "abc", false, (int32_t[]){5}, 1);
    expect_encode(t, "cab", false, (int32_t[]){2, 4}, 2);
    expect_encode(t, " a b", false, (int32_t[]){6, 3, 1}, 3);
    /* lstrip: <x> swallows the space on its left; without lstrip (<y>) the space stays. */
    expect_encode(t, "a <x>b", false, (int32_t[]){0, 20, 1}, 3);
    expect_encode(t, "a <y>", false, (int32_t[]){0, 3, 21}, 3);
    /* rstrip: <y> swallows the white space on its right (Unicode: U+3000 too). */
    expect_encode(t, "<y> \t\xe3\x80\x80" "b", false, (int32_t[]){21, 1}, 2);
    /* single_word: "tok" only between non-word characters ('_' is a word character). */
    expect_encode(t, "tok a", false, (int32_t[]){22, 6}, 2);
    expect_encode(t, "a tok", false, (int32_t[]){0, 3, 22}, 3);
    expect_encode(t, "atok", false, (int32_t[]){0, 7, 8, 9}, 4);
    expect_encode(t, "tok_", false, (int32_t[]){7, 8, 9, 10}, 4);
    /* Leftmost-longest among added tokens: "<x" is not a token, so "<x<x>" is "<", "x", <x>. */
    expect_encode(t, "<x<x>", false, (int32_t[]){11, 13, 20}, 3);
    /* NFC before the model: e + acute is é, which is "Ã©" byte-level (merged to 17). */
    expect_encode(t, "\xc3\xa9", false, (int32_t[]){17}, 1);
    expect_encode(t, "e\xcc\x81", false, (int32_t[]){17}, 1);
    /* Post-processor: <x> A <y>. */
    expect_encode(t, "ab", true, (int32_t[]){20, 4, 21}, 3);
    /* A letter without merges is its byte's token, between its neighbours (a, b not merged). */
    expect_encode(t, "azb", false, (int32_t[]){0, SYNTH_BYTE_ID('z'), 1}, 3);
    /* Decode: skip_special drops <x> only. */
    int32_t ids[] = {20, 4, 21, 22, 3, 17};
    expect_decode(t, ids, 6, false, "<x>ab<y>tok \xc3\xa9", 14);
    expect_decode(t, ids, 6, true, "ab<y>tok \xc3\xa9", 11);
    ms_tok_hf_free(t);
}

/* The byte tokens of U+180E (e1 a0 8e) in the synthetic vocabulary. */
#define U180E SYNTH_BYTE_ID(0xE1), SYNTH_BYTE_ID(0xA0), SYNTH_BYTE_ID(0x8E)

static void test_split_behaviors(void **state) {
    (void)state;
    /* Where a Split cuts decides which merges can happen (a b -> ab = 4, ab c -> abc = 5; a = 0,
     * b = 1, c = 2), so the ids show the pieces each behaviour makes. */
    static const struct {
        const char *pattern, *behavior, *invert, *text;
        int32_t want[5];
        size_t n;
    } cases[] = {
        {"b", "Removed", "false", "abc", {0, 2}, 2},               /* a | c */
        {"b", "Isolated", "false", "abc", {0, 1, 2}, 3},           /* a | b | c */
        {"b", "MergedWithPrevious", "false", "abc", {4, 2}, 2},    /* ab | c */
        {"a", "MergedWithNext", "false", "abc", {5}, 1},           /* abc */
        {"b", "MergedWithNext", "false", "abc", {0, 1, 2}, 3},     /* a | bc */
        {"a|b", "Contiguous", "false", "abc", {4, 2}, 2},          /* ab | c */
        {"a|b", "Isolated", "false", "abc", {0, 1, 2}, 3},         /* a | b | c */
        {"c", "Removed", "true", "abc", {2}, 1},                   /* inverted: "ab" removed */
        {"c", "Isolated", "true", "abc", {4, 2}, 2},               /* ab | c */
        {"a", "MergedWithPrevious", "true", "abc", {5}, 1},        /* inverted: "bc" joins "a" */
        /* \s is Unicode White_Space as in Oniguruma: U+3000 is removed (a | b), U+180E is not
         * (PCRE2's own \s would match it), so it stays, as its three byte tokens. */
        {"\\\\s", "Removed", "false", "a\xe3\x80\x80" "b", {0, 1}, 2},
        {"\\\\s", "Removed", "false", "a\xe1\xa0\x8e" "b", {0, U180E, 1}, 5},
        {"\\\\S+", "Removed", "false", "a\xe1\xa0\x8e" "b", {0}, 0},  /* all of it is \S */
        {"[\\\\s]", "Removed", "false", "a b\xe1\xa0\x8e", {0, 1, U180E}, 5},
    };
    for (size_t i = 0; i < MS_ARRAY_LEN(cases); i++) {
        char pretok[512];
        snprintf(pretok, sizeof pretok,
                 "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\":"
                 " \"%s\"}, \"behavior\": \"%s\", \"invert\": %s}, {\"type\": \"ByteLevel\", \"add_prefix_space\":"
                 " false, \"use_regex\": false}]}", cases[i].pattern, cases[i].behavior, cases[i].invert);
        const char *path = write_synth("split.json", "BPE", "\"ab c\"", "null", pretok);
        ms_tok_hf *t = NULL;
        ms_error err = {0};
        if (ms_tok_hf_init(&t, path, &err) != MS_OK)
            fprintf(stderr, "%s\n", err.msg);
        assert_non_null(t);
        expect_encode(t, cases[i].text, false, cases[i].want, cases[i].n);
        ms_tok_hf_free(t);
    }
    /* A String pattern is literal ("." is not a regex here). */
    const char *lit = write_synth("lit.json", "BPE", "\"ab c\"", "null",
                                  "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\":"
                                  " {\"String\": \".\"}, \"behavior\": \"Removed\", \"invert\": false},"
                                  " {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]}");
    ms_tok_hf *lt = NULL;
    ms_error lerr = {0};
    assert_int_equal(ms_tok_hf_init(&lt, lit, &lerr), MS_OK);
    expect_encode(lt, "ab.c", false, (int32_t[]){4, 2}, 2);
    ms_tok_hf_free(lt);
    /* ByteLevel alone with add_prefix_space and GPT-2's regex: " a" per word, "ab" merged. */
    const char *path = write_synth("bl.json", "BPE", "\"ab c\"", "null",
                                   "{\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"use_regex\": true}");
    ms_tok_hf *t = NULL;
    ms_error err = {0};
    assert_int_equal(ms_tok_hf_init(&t, path, &err), MS_OK);
    expect_encode(t, "a ab", false, (int32_t[]){6, 3, 4}, 3);  /* " a" | " ab": Ġa, then Ġ + ab */
    ms_tok_hf_free(t);
}

/* A byte-level BPE whose vocabulary lacks byte characters, with no unk_token and no byte fallback,
 * is refused at load, naming the first missing byte: encoding it used to drop the text and do
 * pointer arithmetic on NULL and memcpy from NULL (UBSan, found by fuzzing). Bytes that valid UTF-8
 * never holds (0xC0, 0xC1, 0xF5 .. 0xFF) need no token, since encode takes valid UTF-8 only. */
static void test_uncovered_bytes_refused(void **state) {
    (void)state;
    const char *bare = write_text("bare.json", "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
                                  "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
                                  "\"use_regex\":false},\"decoder\":{\"type\":\"ByteLevel\"}}");
    ms_tok_hf *t = NULL;
    ms_error err = {0};
    if (ms_tok_hf_init(&t, bare, &err) == MS_OK) {  /* before the fix: encoding this was undefined */
        int32_t *ids = NULL;
        size_t n = 0;
        ms_tok_hf_encode(t, "Hello", 5, false, &ids, &n, &err);
        ms_free(ids);
        ms_tok_hf_free(t);
        fail_msg("%s loaded without the byte-level characters of 255 bytes", bare);
    }
    expect_load_error(bare, MS_ERR_UNSUPPORTED, "model.vocab has no token for byte 0x00 (\"\xc4\x80\") and 241 "
                      "more bytes");
    /* Every byte of UTF-8 text but one: the message names it. */
    char *buf = malloc(16384);
    assert_non_null(buf);
    size_t n = (size_t)snprintf(buf, 16384, "{\"model\":{\"type\":\"BPE\",\"merges\":[],\"vocab\":{");
    for (unsigned b = 0; b < 256; b++) {
        if (b == 'H' || b == 0xC0 || b == 0xC1 || b >= 0xF5)
            continue;
        n += (size_t)snprintf(buf + n, 16384 - n, "%s\"%s\":%u", b ? "," : "", synth_byte_char(b), b);
    }
    snprintf(buf + n, 16384 - n, "}},\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,"
             "\"use_regex\":false},\"decoder\":{\"type\":\"ByteLevel\"}}");
    expect_load_error(write_text("noH.json", buf), MS_ERR_UNSUPPORTED, "no token for byte 0x48 (\"H\")");
    free(buf);
}

/* ---- bad files ---- */

static void test_bad_files(void **state) {
    (void)state;
    /* Missing file. */
    expect_load_error(tmp_path("missing.json"), MS_ERR_NOT_FOUND, "cannot open");
    /* Malformed JSON, and a real tokenizer.json cut short. */
    expect_load_error(write_text("bad.json", "{\"model\": {\"type\": \"BPE\", }"), MS_ERR_PARSE, "malformed JSON");
    FILE *fp = fopen(ms_test_fixture(QWEN3), "rb");
    assert_non_null(fp);
    char *head = malloc(200000);
    assert_non_null(head);
    assert_int_equal(fread(head, 1, 200000, fp), 200000);
    fclose(fp);
    expect_load_error(write_file("truncated.json", head, 200000), MS_ERR_PARSE, "malformed JSON");
    free(head);
    expect_load_error(write_text("array.json", "[1, 2]"), MS_ERR_FORMAT, "not a JSON object");
    /* Wrong model type, merges naming unknown tokens or making tokens not in the vocabulary. */
    expect_load_error(write_synth("wp.json", "WordPiece", "\"ab c\"", "null", SYNTH_PRETOK), MS_ERR_UNSUPPORTED,
                      "model type \"WordPiece\"");
    expect_load_error(write_synth("m1.json", "BPE", "\"ab zz\"", "null", SYNTH_PRETOK), MS_ERR_FORMAT,
                      "model.merges[1] names token \"zz\", which is not in the vocabulary");
    expect_load_error(write_synth("m2.json", "BPE", "[\"b\", \"c\"]", "null", SYNTH_PRETOK), MS_ERR_FORMAT,
                      "model.merges[1] makes \"bc\", which is not in the vocabulary");
    expect_load_error(write_synth("m3.json", "BPE", "\"abc\"", "null", SYNTH_PRETOK), MS_ERR_FORMAT,
                      "model.merges[1] \"abc\" is not two tokens");
    expect_load_error(write_synth("m4.json", "BPE", "42", "null", SYNTH_PRETOK), MS_ERR_FORMAT,
                      "model.merges[1] is neither");
    /* Vocabulary ids and added tokens are checked. */
    expect_load_error(write_text("v.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"x\"},"
                                           " \"merges\": []}}"),
                      MS_ERR_FORMAT, "model.vocab[\"a\"] is not an id");
    expect_load_error(write_text("v2.json", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -4},"
                                            " \"merges\": []}}"),
                      MS_ERR_FORMAT, "model.vocab[\"a\"] is not an id");
    expect_load_error(write_text("at.json", "{\"added_tokens\": [{\"id\": 3}], \"model\": {\"type\": \"BPE\","
                                            " \"vocab\": {\"a\": 0}, \"merges\": []}}"),
                      MS_ERR_FORMAT, "added_tokens[0].content is missing");
    expect_load_error(write_text("nomodel.json", "{\"added_tokens\": []}"), MS_ERR_FORMAT, "\"model\" is missing");
    /* The post-processor's special tokens must be tokens: an id that is neither in the vocabulary
     * nor an added token was emitted by encode, past ms_tok_hf_vocab_size (found by fuzzing). */
    {
        static char buf[16384];
        const char *ok_post = "\"post_processor\": {\"type\": \"TemplateProcessing\"";
        synth_json(buf, sizeof buf, "BPE", "\"ab c\"", "null", SYNTH_PRETOK);
        char *at = strstr(buf, "\"ids\": [20]");
        assert_non_null(at);
        assert_non_null(strstr(buf, ok_post));
        memcpy(at, "\"ids\": [19]", 11);  /* 19: no token (18 and 19 are gaps) */
        expect_load_error(write_text("post.json", buf), MS_ERR_FORMAT,
                          "post_processor TemplateProcessing: special token \"<x>\" has id 19, which is no token");
    }
    /* Components this loader does not implement are named. */
    expect_load_error(write_synth("n.json", "BPE", "\"ab c\"", "{\"type\": \"NFKC\"}", SYNTH_PRETOK),
                      MS_ERR_UNSUPPORTED, "normalizer \"NFKC\"");
    expect_load_error(write_synth("p.json", "BPE", "\"ab c\"", "null", "{\"type\": \"Whitespace\"}"),
                      MS_ERR_UNSUPPORTED, "pre_tokenizer \"Whitespace\"");
    expect_load_error(write_synth("p2.json", "BPE", "\"ab c\"", "null",
                                  "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Isolated\"}"),
                      MS_ERR_UNSUPPORTED, "does not end in ByteLevel");
    expect_load_error(write_synth("r.json", "BPE", "\"ab c\"", "null",
                                  "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\":"
                                  " {\"Regex\": \"(a\"}, \"behavior\": \"Isolated\"}, {\"type\": \"ByteLevel\"}]}"),
                      MS_ERR_FORMAT, "Split regex does not compile");
    expect_load_error(write_synth("b.json", "BPE", "\"ab c\"", "null",
                                  "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\":"
                                  " {\"Regex\": \"a\"}, \"behavior\": \"Sideways\"}, {\"type\": \"ByteLevel\"}]}"),
                      MS_ERR_UNSUPPORTED, "behavior \"Sideways\"");
    /* A malformed tokenizer_config.json next to a good tokenizer.json is reported too. */
    const char *good = write_synth("tokenizer.json", "BPE", "\"ab c\"", "null", SYNTH_PRETOK);
    const char *cfg = write_text("tokenizer_config.json", "{\"eos_token\": ");
    ms_tok_hf *t = NULL;
    ms_error err = {0};
    assert_int_equal(ms_tok_hf_init(&t, good, &err), MS_ERR_PARSE);
    assert_null(t);
    assert_int_equal(strncmp(err.msg, cfg, strlen(cfg)), 0);
    write_text("tokenizer_config.json", "{\"eos_token\": 7}");
    assert_int_equal(ms_tok_hf_init(&t, good, &err), MS_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "eos_token"));
}

/* ---- allocation failures ---- */

static void test_allocation_failures(void **state) {
    (void)state;
    write_text("tokenizer_config.json", "{\"bos_token\": \"<x>\", \"eos_token\": \"<y>\", \"chat_template\": \"T\"}");
    const char *path = write_synth("tokenizer.json", "BPE", "\"ab c\"", "{\"type\": \"NFC\"}", SYNTH_PRETOK);
    /* Load: count the allocations of a clean load, then fail each of them in turn. */
    ms_tok_hf *t = NULL;
    ms_error err = {0};
    int64_t before = ms_alloc_get_stats().total_allocs;
    assert_int_equal(ms_tok_hf_init(&t, path, &err), MS_OK);
    int64_t n_load = ms_alloc_get_stats().total_allocs - before;
    ms_tok_hf_free(t);
    assert_true(n_load >= 20);
    int failures = 0;
    for (int64_t nth = 1; nth <= n_load; nth++) {
        t = NULL;
        ms_alloc_fail_nth(nth);
        ms_status st = ms_tok_hf_init(&t, path, &err);
        ms_alloc_fail_nth(0);
        if (st == MS_OK) {  /* an allocation whose failure is tolerated (PCRE2's JIT falls back) */
            ms_tok_hf_free(t);
            continue;
        }
        if (st != MS_ERR_OOM || strstr(err.msg, "out of memory") == NULL)
            fprintf(stderr, "allocation %lld failed: %d %s\n", (long long)nth, st, err.msg);
        assert_int_equal(st, MS_ERR_OOM);
        assert_null(t);
        assert_non_null(strstr(err.msg, "out of memory"));
        failures++;
    }
    assert_true(failures >= 20);
    /* Encode and decode: the same, on a fresh tokenizer each time (the cache starts empty); each
     * call either gives the right result or fails cleanly with MS_ERR_OOM. */
    const char *text = "<y> abc e\xcc\x81 tok cab";
    static const int32_t want[] = {20, 21, 5, 3, 17, 3, 22, 3, 2, 4, 21};
    const char *want_text = "<x><y>abc \xc3\xa9 tok cab<y>";
    assert_int_equal(ms_tok_hf_init(&t, path, &err), MS_OK);
    before = ms_alloc_get_stats().total_allocs;
    int32_t *ids = NULL;
    size_t n = 0;
    char *out = NULL;
    size_t len = 0;
    assert_int_equal(ms_tok_hf_encode(t, text, strlen(text), true, &ids, &n, &err), MS_OK);
    assert_int_equal(ms_tok_hf_decode(t, ids, n, false, &out, &len, &err), MS_OK);
    int64_t n_code = ms_alloc_get_stats().total_allocs - before;
    assert_int_equal(n, MS_ARRAY_LEN(want));
    assert_memory_equal(ids, want, sizeof want);
    assert_string_equal(out, want_text);
    ms_free(ids);
    ms_free(out);
    ms_tok_hf_free(t);
    for (int64_t nth = 1; nth <= n_code; nth++) {
        assert_int_equal(ms_tok_hf_init(&t, path, &err), MS_OK);
        ids = NULL;
        out = NULL;
        ms_alloc_fail_nth(nth);
        ms_status st = ms_tok_hf_encode(t, text, strlen(text), true, &ids, &n, &err);
        ms_status st2 = st == MS_OK ? ms_tok_hf_decode(t, ids, n, false, &out, &len, &err) : MS_ERR_OOM;
        ms_alloc_fail_nth(0);
        if (st == MS_OK) {
            assert_int_equal(n, MS_ARRAY_LEN(want));
            assert_memory_equal(ids, want, sizeof want);
        } else {
            assert_int_equal(st, MS_ERR_OOM);
            assert_null(ids);
        }
        if (st2 == MS_OK)
            assert_string_equal(out, want_text);
        else
            assert_null(out);
        ms_free(ids);
        ms_free(out);
        ms_tok_hf_free(t);
    }
}

int main(void) {
    const struct CMUnitTest shared[] = {
        shared_test(test_reference_qwen3),
        shared_test(test_reference_llama3_1),
        shared_test(test_library_corner_cases),
        shared_test(test_special_tokens_qwen3),
        shared_test(test_special_tokens_llama3_1),
        shared_test(test_empty_and_invalid_utf8),
        shared_test(test_decode_partial_utf8),
        shared_test(test_nfc),
        shared_test(test_long_inputs),
        shared_test(test_random_round_trip),
        shared_test(test_concurrent_encode),
    };
    const struct CMUnitTest files[] = {
        tmp_test(test_synthetic_tokenizer),
        tmp_test(test_split_behaviors),
        tmp_test(test_bad_files),
        tmp_test(test_uncovered_bytes_refused),
        tmp_test(test_allocation_failures),
    };
    int failed = cmocka_run_group_tests_name("tokenizer_hf_fixtures", shared, group_setup, group_teardown);
    failed += cmocka_run_group_tests_name("tokenizer_hf_files", files, NULL, NULL);
    return failed;
}
