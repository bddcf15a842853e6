/*
 * test_tok_vocab.c - tokenizers built from vocabulary arrays (ms_tok_hf_from_vocab, the form GGUF
 * metadata carries) and the SentencePiece path of tokenizer.json (byte_fallback, Metaspace):
 *   - SmolLM2's GGUF vocabulary (gpt2, pre smollm): ids equal llama.cpp's on every
 *     tokenizer_cases entry of ../shared/fixtures/gguf/smollm2/reference.json, decode round trips,
 *     special tokens, end of turn; its chat template renders every case's messages to prompt_text
 *     byte for byte, whose ids are the reference's pK.input_ids. The vocabulary comes as JSON from
 *     tests/tok/gguf_vocab.py (the `gguf` package); tests/tok_vocab.sh fetches the model and sets
 *     MS_TOK_SMOLLM2_JSON; without it this test says it skips.
 *   - Qwen3's and Llama 3.1's real tokenizer.json as GGUF arrays (pre qwen2 / llama-bpe): the
 *     tokenizers library's ids of ../shared/fixtures/tokenizers/reference.json;
 *   - Mistral 7B's real SentencePiece model (tokenizer.model.v1 of the mistral_common wheel, which
 *     tests/tok_vocab.sh fetches and dumps with tests/tok/spm_vocab.py; MS_TOK_MISTRAL_JSON): ids
 *     and text equal sentencepiece's on 20 strings, and as a Llama-2-style tokenizer.json the
 *     tokenizers library's (MS_TOK_MISTRAL_HF, when that library is installed);
 *   - a SentencePiece BPE model trained with the real `sentencepiece` library
 *     (tests/tok/spm_tiny.json, made by tests/tok/make_spm.py): ids and decoded text equal
 *     sentencepiece's own encode / decode (byte fallback, U+2581, add_dummy_prefix, control tokens);
 *   - the same model as Llama-2-style and Metaspace tokenizer.json files, ids and text equal to the
 *     Hugging Face `tokenizers` library's (tests/tok/llama_style*.json);
 *   - bad arrays (lying counts, unknown merge tokens, invalid UTF-8, NaN scores, ids out of range,
 *     unknown model / pre): one line naming the array and index, no leak.
 */
#include "ms_test.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat_template.h"
#include "safetensors.h"
#include "tokenizer_hf.h"

#include "ms_test_impl.h"

/* ---- vocabulary JSON (gguf_vocab.py's format) -> ms_tok_vocab ---- */

typedef struct vocab_arrays {
    ms_tok_vocab v;
    const char **tokens;
    size_t *lens;
    float *scores;
    int32_t *types;
    const char **merges;
    json_t *root;  /* owns the strings */
} vocab_arrays;

static int32_t json_id(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    return json_is_integer(v) ? (int32_t)json_integer_value(v) : -1;
}

/* Fill `va` from a gguf_vocab.py JSON object (borrowed into va->root). */
static void vocab_from_json(vocab_arrays *va, json_t *root, const char *source) {
    memset(va, 0, sizeof *va);
    va->root = json_incref(root);
    va->v = ms_tok_vocab_default();
    ms_tok_vocab *v = &va->v;
    v->source = source;
    v->model = json_string_value(json_object_get(root, "model"));
    v->pre = json_string_value(json_object_get(root, "pre"));
    const json_t *toks = json_object_get(root, "tokens");
    size_t n = json_array_size(toks);
    va->tokens = calloc(n + 1, sizeof *va->tokens);
    va->lens = calloc(n + 1, sizeof *va->lens);
    va->types = calloc(n + 1, sizeof *va->types);
    va->scores = calloc(n + 1, sizeof *va->scores);
    assert_true(va->tokens && va->lens && va->types && va->scores);
    const json_t *types = json_object_get(root, "token_type");
    const json_t *scores = json_object_get(root, "scores");
    for (size_t i = 0; i < n; i++) {
        va->tokens[i] = json_string_value(json_array_get(toks, i));
        va->lens[i] = json_string_length(json_array_get(toks, i));
        va->types[i] = json_is_array(types) ? (int32_t)json_integer_value(json_array_get(types, i)) : 1;
        va->scores[i] = json_is_array(scores) ? (float)json_number_value(json_array_get(scores, i)) : 0.0f;
    }
    v->tokens = va->tokens;
    v->token_lens = va->lens;
    v->n_tokens = n;
    v->token_types = va->types;
    v->scores = json_is_array(scores) ? va->scores : NULL;
    const json_t *merges = json_object_get(root, "merges");
    size_t nm = json_array_size(merges);
    va->merges = calloc(nm + 1, sizeof *va->merges);
    assert_non_null(va->merges);
    for (size_t i = 0; i < nm; i++)
        va->merges[i] = json_string_value(json_array_get(merges, i));
    v->merges = va->merges;
    v->n_merges = nm;
    v->bos_id = json_id(root, "bos_id");
    v->eos_id = json_id(root, "eos_id");
    v->eot_id = json_id(root, "eot_id");
    v->unk_id = json_id(root, "unk_id");
    v->pad_id = json_id(root, "pad_id");
    v->add_bos = json_is_true(json_object_get(root, "add_bos"));
    v->add_eos = json_is_true(json_object_get(root, "add_eos"));
    const json_t *asp = json_object_get(root, "add_space_prefix");
    v->add_space_prefix = json_is_boolean(asp) ? json_is_true(asp) : true;  /* llama.cpp's default */
    v->chat_template = json_string_value(json_object_get(root, "chat_template"));
}

static void vocab_release(vocab_arrays *va) {
    free(va->tokens);
    free(va->lens);
    free(va->types);
    free(va->scores);
    free(va->merges);
    json_decref(va->root);
}

static json_t *load_json(const char *path) {
    json_error_t jerr;
    json_t *j = json_load_file(path, 0, &jerr);
    if (j == NULL)
        fprintf(stderr, "%s:%d: %s\n", path, jerr.line, jerr.text);
    assert_non_null(j);
    return j;
}

/* ---- helpers ---- */

static void expect_ids(const ms_tok_hf *tok, const char *text, size_t len, bool add_special, const json_t *want) {
    ms_error err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    if (ms_tok_hf_encode(tok, text, len, add_special, &ids, &n, &err) != MS_OK)
        fprintf(stderr, "encode: %s\n", err.msg);
    bool same = n == json_array_size(want);
    for (size_t i = 0; same && i < n; i++)
        same = ids[i] == (int32_t)json_integer_value(json_array_get(want, i));
    if (!same) {
        fprintf(stderr, "encode \"%.*s\": got", (int)len, text);
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n  want");
        for (size_t i = 0; i < json_array_size(want); i++)
            fprintf(stderr, " %lld", (long long)json_integer_value(json_array_get(want, i)));
        fprintf(stderr, "\n");
    }
    ms_free(ids);
    assert_true(same);
}

static void expect_text(const ms_tok_hf *tok, const json_t *ids_json, bool skip, const char *want, size_t want_len) {
    size_t n = json_array_size(ids_json);
    int32_t *ids = calloc(n + 1, sizeof *ids);
    assert_non_null(ids);
    for (size_t i = 0; i < n; i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(ids_json, i));
    ms_error err = {0};
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(ms_tok_hf_decode(tok, ids, n, skip, &text, &len, &err), MS_OK);
    if (len != want_len || memcmp(text, want, len) != 0)
        fprintf(stderr, "decode: got \"%s\", want \"%.*s\"\n", text, (int)want_len, want);
    assert_int_equal(len, want_len);
    assert_memory_equal(text, want, len);
    free(ids);
    ms_free(text);
}

/* ---- SmolLM2 GGUF vocabulary against llama.cpp ---- */

static void test_smollm2_gguf(void **state) {
    (void)state;
    const char *path = getenv("MS_TOK_SMOLLM2_JSON");
    if (path == NULL || path[0] == '\0') {
        fprintf(stderr, "test_smollm2_gguf: skipped: MS_TOK_SMOLLM2_JSON is not set (tests/tok_vocab.sh fetches the "
                        "model and sets it)\n");
        skip();
    }
    json_t *root = load_json(path);
    json_t *ref = load_json(ms_test_fixture("gguf/smollm2/reference.json"));
    vocab_arrays va;
    vocab_from_json(&va, root, "smollm2.gguf");
    ms_tok_hf *tok = NULL;
    ms_error err = {0};
    if (ms_tok_hf_from_vocab(&tok, &va.v, &err) != MS_OK)
        fprintf(stderr, "%s\n", err.msg);
    assert_non_null(tok);
    assert_int_equal(ms_tok_hf_vocab_size(tok), 49152);
    const json_t *cases = json_object_get(ref, "tokenizer_cases");
    assert_int_equal(json_array_size(cases), 16);
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const json_t *c = json_array_get(cases, i);
        const json_t *text = json_object_get(c, "text");
        const json_t *ids = json_object_get(c, "ids");
        /* no BOS: add_bos_token is false, so add_special changes nothing either */
        expect_ids(tok, json_string_value(text), json_string_length(text), false, ids);
        expect_ids(tok, json_string_value(text), json_string_length(text), true, ids);
        expect_text(tok, ids, false, json_string_value(text), json_string_length(text));
    }
    /* Every case: the GGUF's chat template renders the messages to prompt_text byte for byte
     * (transformers' apply_chat_template), whose ids are the reference's pK.input_ids and decode
     * back to it (special tokens included). */
    ms_chat_template *tmpl = NULL;
    assert_int_equal(ms_chat_template_init(&tmpl, ms_tok_hf_chat_template(tok), "smollm2.gguf", &err), MS_OK);
    ms_st_file *st = NULL;
    if (ms_st_file_init(&st, ms_test_fixture("gguf/smollm2/reference.safetensors"), &err) != MS_OK)
        fprintf(stderr, "%s\n", err.msg);
    assert_non_null(st);
    const json_t *chat = json_object_get(ref, "cases");
    assert_int_equal(json_array_size(chat), 5);
    for (size_t i = 0; i < json_array_size(chat); i++) {
        const json_t *cs = json_array_get(chat, i);
        const json_t *pt = json_object_get(cs, "prompt_text");
        assert_true(json_is_string(pt));
        const char *kind = json_string_value(json_object_get(cs, "kind"));
        if (kind != NULL && strcmp(kind, "chat") == 0) {
            char *rendered = NULL;
            assert_int_equal(ms_chat_template_render(tmpl, json_object_get(cs, "messages"), true,
                                                     ms_tok_hf_bos_token(tok), ms_tok_hf_eos_token(tok), &rendered,
                                                     &err),
                             MS_OK);
            assert_string_equal(rendered, json_string_value(pt));
            ms_free(rendered);
        }
        int32_t *ids = NULL;
        size_t n = 0;
        assert_int_equal(ms_tok_hf_encode(tok, json_string_value(pt), json_string_length(pt), false, &ids, &n, &err),
                         MS_OK);
        assert_int_equal((int)n, (int)json_integer_value(json_object_get(cs, "n_prompt")));
        char name[32];
        snprintf(name, sizeof name, "p%zu.input_ids", i);
        const ms_st_tensor *t = ms_st_file_find_tensor(st, name);
        assert_non_null(t);
        int32_t *want = calloc(n + 1, sizeof *want);
        assert_non_null(want);
        assert_int_equal(ms_st_tensor_to_i32(t, want, n, &err), MS_OK);
        assert_memory_equal(ids, want, n * sizeof *ids);
        free(want);
        char *back = NULL;
        size_t blen = 0;
        assert_int_equal(ms_tok_hf_decode(tok, ids, n, false, &back, &blen, &err), MS_OK);
        assert_string_equal(back, json_string_value(pt));
        ms_free(back);
        ms_free(ids);
    }
    ms_st_file_free(st);
    ms_chat_template_free(tmpl);
    assert_int_equal(ms_tok_hf_eos_id(tok), 2);
    assert_string_equal(ms_tok_hf_eos_token(tok), "<|im_end|>");
    assert_true(ms_tok_hf_is_eog(tok, 2));                                       /* <|im_end|> */
    assert_true(ms_tok_hf_is_eog(tok, 0));                                       /* <|endoftext|> */
    assert_false(ms_tok_hf_is_eog(tok, 1));                                      /* <|im_start|> */
    assert_false(ms_tok_hf_is_eog(tok, 19556));                                  /* "Hello" */
    assert_true(ms_tok_hf_is_special(tok, 1));
    assert_non_null(ms_tok_hf_chat_template(tok));
    assert_non_null(strstr(ms_tok_hf_chat_template(tok), "<|im_start|>"));
    /* skip_special drops the control tokens */
    const json_t *c10 = json_array_get(cases, 10);
    expect_text(tok, json_object_get(c10, "ids"), true, "user\nhi", 7);
    ms_tok_hf_free(tok);
    vocab_release(&va);
    json_decref(root);
    json_decref(ref);
}



/* ---- real byte-level tokenizers as GGUF arrays (llama.cpp's converter layout) ---- */

/*
 * Qwen3's and Llama 3.1's tokenizer.json turned into the arrays convert_hf_to_gguf.py writes
 * (tokens by id, "a b" merges, added tokens CONTROL when special else USER_DEFINED), built with
 * pre "qwen2" / "llama-bpe": llama.cpp's regexes must give the tokenizers library's ids of
 * ../shared/fixtures/tokenizers/reference.json (for Qwen3 on the NFC strings only: GGUF tokenizers
 * do not normalize).
 */
static void check_hf_as_gguf(const char *name, const char *pre) {
    char rel[128];
    snprintf(rel, sizeof rel, "tokenizers/%s/tokenizer.json", name);
    json_t *tj = load_json(ms_test_fixture(rel));
    json_t *ref = load_json(ms_test_fixture("tokenizers/reference.json"));
    const json_t *vocab = json_object_get(json_object_get(tj, "model"), "vocab");
    const json_t *added = json_object_get(tj, "added_tokens");
    size_t n = 0;
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)vocab, key, val) n = MS_MAX(n, (size_t)json_integer_value(val) + 1);
    for (size_t i = 0; i < json_array_size(added); i++)
        n = MS_MAX(n, (size_t)json_integer_value(json_object_get(json_array_get(added, i), "id")) + 1);
    const char **toks = calloc(n, sizeof *toks);
    int32_t *types = calloc(n, sizeof *types);
    assert_true(toks && types);
    json_object_foreach((json_t *)vocab, key, val) {
        toks[json_integer_value(val)] = key;
        types[json_integer_value(val)] = MS_TOK_TYPE_NORMAL;
    }
    for (size_t i = 0; i < json_array_size(added); i++) {
        const json_t *a = json_array_get(added, i);
        int64_t id = json_integer_value(json_object_get(a, "id"));
        toks[id] = json_string_value(json_object_get(a, "content"));
        types[id] = json_is_true(json_object_get(a, "special")) ? MS_TOK_TYPE_CONTROL : MS_TOK_TYPE_USER_DEFINED;
    }
    for (size_t i = 0; i < n; i++)
        if (toks[i] == NULL) {
            toks[i] = "";  /* a gap: an empty unused token, as a converter pads */
            types[i] = MS_TOK_TYPE_UNUSED;
        }
    const json_t *mj = json_object_get(json_object_get(tj, "model"), "merges");
    size_t nm = json_array_size(mj);
    char **merges = calloc(nm, sizeof *merges);
    assert_non_null(merges);
    for (size_t i = 0; i < nm; i++) {
        const json_t *m = json_array_get(mj, i);
        if (json_is_string(m)) { /* already "a b" */
            merges[i] = strdup(json_string_value(m));
            assert_non_null(merges[i]);
            continue;
        }
        const char *a = json_string_value(json_array_get(m, 0)), *b = json_string_value(json_array_get(m, 1));
        assert_true(a != NULL && b != NULL);
        merges[i] = malloc(strlen(a) + strlen(b) + 2);
        assert_non_null(merges[i]);
        sprintf(merges[i], "%s %s", a, b);
    }
    ms_tok_vocab v = ms_tok_vocab_default();
    v.source = rel;
    v.model = "gpt2";
    v.pre = pre;
    v.tokens = toks;
    v.n_tokens = n;
    v.token_types = types;
    v.merges = (const char *const *)merges;
    v.n_merges = nm;
    ms_tok_hf *tok = NULL;
    ms_error err = {0};
    if (ms_tok_hf_from_vocab(&tok, &v, &err) != MS_OK)
        fprintf(stderr, "%s\n", err.msg);
    assert_non_null(tok);
    const json_t *cases = json_object_get(ref, name);
    size_t checked = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const json_t *c = json_array_get(cases, i);
        const json_t *text = json_object_get(c, "text");
        char *nfc = NULL;
        size_t nfc_len = 0;
        assert_int_equal(ms_tok_hf_nfc(json_string_value(text), json_string_length(text), &nfc, &nfc_len, &err),
                         MS_OK);
        bool is_nfc = nfc_len == json_string_length(text) && memcmp(nfc, json_string_value(text), nfc_len) == 0;
        ms_free(nfc);
        if (!is_nfc && strcmp(name, "qwen3") == 0)
            continue;
        expect_ids(tok, json_string_value(text), json_string_length(text), false, json_object_get(c, "ids"));
        checked++;
    }
    assert_true(checked >= 10);
    ms_tok_hf_free(tok);
    for (size_t i = 0; i < nm; i++)
        free(merges[i]);
    free(merges);
    free(toks);
    free(types);
    json_decref(ref);
    json_decref(tj);
}

static void test_qwen3_as_gguf(void **state) {
    (void)state;
    check_hf_as_gguf("qwen3", "qwen2");
}

static void test_llama3_as_gguf(void **state) {
    (void)state;
    check_hf_as_gguf("llama3_1", "llama-bpe");
}

/* ---- SentencePiece goldens (tests/tok/, made by make_spm.py from the real libraries) ---- */

static void check_cases(const ms_tok_hf *tok, const json_t *cases) {
    assert_true(json_array_size(cases) > 10);
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const json_t *c = json_array_get(cases, i);
        const json_t *text = json_object_get(c, "text");
        const json_t *dec = json_object_get(c, "decoded");
        expect_ids(tok, json_string_value(text), json_string_length(text), false, json_object_get(c, "ids"));
        expect_text(tok, json_object_get(c, "ids"), false, json_string_value(dec), json_string_length(dec));
    }
}

/* GGUF-style llama vocabulary: ids and text equal sentencepiece's encode / decode. */
static void test_spm_vocab(void **state) {
    (void)state;
    json_t *root = load_json("tests/tok/spm_tiny.json");
    vocab_arrays va;
    vocab_from_json(&va, root, "spm_tiny.json");
    ms_tok_hf *tok = NULL;
    ms_error err = {0};
    if (ms_tok_hf_from_vocab(&tok, &va.v, &err) != MS_OK)
        fprintf(stderr, "%s\n", err.msg);
    assert_non_null(tok);
    check_cases(tok, json_object_get(root, "cases"));
    /* control tokens split out of the text (llama.cpp's parse_special), each text piece after one
     * gets the dummy prefix again; add_special puts BOS / EOS around when asked */
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(ms_tok_hf_encode(tok, "<s>Hello</s>", 12, false, &ids, &n, &err), MS_OK);
    int32_t *ref = NULL;
    size_t nref = 0;
    assert_int_equal(ms_tok_hf_encode(tok, "Hello", 5, false, &ref, &nref, &err), MS_OK);
    assert_int_equal(n, nref + 2);
    assert_int_equal(ids[0], 1);
    assert_memory_equal(ids + 1, ref, nref * sizeof *ref);
    assert_int_equal(ids[n - 1], 2);
    ms_free(ids);
    ms_free(ref);
    assert_true(ms_tok_hf_is_eog(tok, 2));
    assert_true(ms_tok_hf_is_special(tok, 0));  /* <unk> */
    ms_tok_hf_free(tok);
    va.v.add_bos = va.v.add_eos = true;
    assert_int_equal(ms_tok_hf_from_vocab(&tok, &va.v, &err), MS_OK);
    assert_int_equal(ms_tok_hf_encode(tok, "Hello", 5, true, &ids, &n, &err), MS_OK);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[n - 1], 2);
    ms_free(ids);
    ms_tok_hf_free(tok);
    /* without add_space_prefix: no dummy prefix, nothing stripped on decode */
    va.v.add_bos = va.v.add_eos = false;
    va.v.add_space_prefix = false;
    assert_int_equal(ms_tok_hf_from_vocab(&tok, &va.v, &err), MS_OK);
    assert_int_equal(ms_tok_hf_encode(tok, " Hello", 6, false, &ids, &n, &err), MS_OK);
    /* " Hello" without the prefix is sentencepiece's "Hello" (the first case's first word) */
    const json_t *hello = json_object_get(json_array_get(json_object_get(root, "cases"), 0), "ids");
    assert_int_equal(n, 4);  /* U+2581, <0x48> (no "H" piece: byte fallback), "e", "llo" */
    for (size_t i = 0; i < n; i++)
        assert_int_equal(ids[i], (int32_t)json_integer_value(json_array_get(hello, i)));
    assert_int_equal(ms_tok_hf_encode(tok, "Hello", 5, false, &ref, &nref, &err), MS_OK);
    assert_int_equal(nref, 3);  /* no dummy prefix */
    assert_int_equal(ref[0], ids[1]);
    char *text = NULL;
    size_t len = 0;
    assert_int_equal(ms_tok_hf_decode(tok, ids, n, false, &text, &len, &err), MS_OK);
    assert_string_equal(text, " Hello");
    ms_free(text);
    ms_free(ids);
    ms_free(ref);
    ms_tok_hf_free(tok);
    vocab_release(&va);
    json_decref(root);
}


/* A real SentencePiece model (Mistral 7B's tokenizer.model, from the mistral_common wheel that
 * tests/tok_vocab.sh fetches): GGUF-style arrays give sentencepiece's own ids and text. */
static void test_spm_real(void **state) {
    (void)state;
    const char *path = getenv("MS_TOK_MISTRAL_JSON");
    if (path == NULL || path[0] == '\0') {
        fprintf(stderr, "test_spm_real: skipped: MS_TOK_MISTRAL_JSON is not set (tests/tok_vocab.sh fetches the "
                        "model and sets it)\n");
        skip();
    }
    json_t *root = load_json(path);
    vocab_arrays va;
    vocab_from_json(&va, root, "mistral tokenizer.model.v1");
    ms_tok_hf *tok = NULL;
    ms_error err = {0};
    if (ms_tok_hf_from_vocab(&tok, &va.v, &err) != MS_OK)
        fprintf(stderr, "%s\n", err.msg);
    assert_non_null(tok);
    assert_int_equal(ms_tok_hf_vocab_size(tok), 32000);
    check_cases(tok, json_object_get(root, "cases"));
    assert_true(ms_tok_hf_is_eog(tok, 2));  /* </s> */
    ms_tok_hf_free(tok);
    vocab_release(&va);
    json_decref(root);
    /* the same model as a Llama-2-style tokenizer.json: the tokenizers library's ids and text
     * (which differ from sentencepiece's on a few strings: merges by rank, not by score) */
    const char *hf = getenv("MS_TOK_MISTRAL_HF");
    if (hf == NULL || hf[0] == '\0') {
        fprintf(stderr, "test_spm_real: tokenizer.json part skipped: MS_TOK_MISTRAL_HF is not set (needs the "
                        "tokenizers package)\n");
        return;
    }
    assert_int_equal(ms_tok_hf_init(&tok, hf, &err), MS_OK);
    root = load_json(hf);
    check_cases(tok, json_object_get(root, "cases"));
    json_decref(root);
    ms_tok_hf_free(tok);
}

/* Llama-2 / Mistral style tokenizer.json (byte_fallback): ids and text equal the tokenizers library's. */
static void test_spm_tokenizer_json(void **state) {
    (void)state;
    static const char *const files[] = {"tests/tok/llama_legacy.json", "tests/tok/llama_metaspace.json",
                                        "tests/tok/llama_split.json"};
    for (size_t f = 0; f < MS_ARRAY_LEN(files); f++) {
        ms_tok_hf *tok = NULL;
        ms_error err = {0};
        if (ms_tok_hf_init(&tok, files[f], &err) != MS_OK)
            fprintf(stderr, "%s\n", err.msg);
        assert_non_null(tok);
        json_t *root = load_json(files[f]);
        check_cases(tok, json_object_get(root, "cases"));
        json_decref(root);
        ms_tok_hf_free(tok);
    }
}


/* byte_fallback tokenizer.json variants that are refused, each with one line naming the part. */
static void expect_json_fail(json_t *root, const char *needle) {
    char path[] = "/tmp/ms_test_tokvocab_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(json_dump_file(root, path, 0), 0);
    ms_tok_hf *tok = (ms_tok_hf *)1;
    ms_error err = {0};
    ms_status st = ms_tok_hf_init(&tok, path, &err);
    unlink(path);
    if (st == MS_OK || strstr(err.msg, needle) == NULL)
        fprintf(stderr, "want \"%s\", got %d: %s\n", needle, st, err.msg);
    assert_int_not_equal(st, MS_OK);
    assert_null(tok);
    assert_non_null(strstr(err.msg, needle));
    assert_null(strchr(err.msg, '\n'));
}

static void test_spm_tokenizer_json_bad(void **state) {
    (void)state;
    json_t *base = load_json("tests/tok/llama_legacy.json");
    json_t *j = json_deep_copy(base);
    json_object_set_new(j, "normalizer", json_pack("{s:s}", "type", "NFC"));
    expect_json_fail(j, "normalizer \"NFC\" with model.byte_fallback is not supported");
    json_decref(j);
    j = json_deep_copy(base);
    json_object_set_new(j, "normalizer", json_null());
    expect_json_fail(j, "without a Metaspace pre_tokenizer or a Replace");
    json_decref(j);
    j = json_deep_copy(base);
    json_object_set_new(j, "pre_tokenizer", json_pack("{s:s}", "type", "ByteLevel"));
    expect_json_fail(j, "pre_tokenizer \"ByteLevel\" with model.byte_fallback");
    json_decref(j);
    j = json_deep_copy(base);
    json_object_set_new(j, "normalizer", json_null());
    json_object_set_new(j, "pre_tokenizer", json_pack("{s:s, s:s, s:s}", "type", "Metaspace", "replacement", "_",
                                                      "prepend_scheme", "first"));
    expect_json_fail(j, "only replacement U+2581");
    json_decref(j);
    j = json_deep_copy(base);
    json_object_set_new(j, "normalizer", json_null());
    json_object_set_new(j, "pre_tokenizer", json_pack("{s:s, s:s, s:s}", "type", "Metaspace", "replacement",
                                                      "\xE2\x96\x81", "prepend_scheme", "sometimes"));
    expect_json_fail(j, "prepend_scheme is not");
    json_decref(j);
    j = json_deep_copy(base);
    json_object_set_new(j, "decoder", json_pack("{s:s}", "type", "ByteLevel"));
    expect_json_fail(j, "decoder \"ByteLevel\" with model.byte_fallback");
    json_decref(j);
    j = json_deep_copy(base);
    json_array_remove(json_object_get(json_object_get(j, "decoder"), "decoders"), 1);  /* no ByteFallback */
    expect_json_fail(j, "ByteFallback");
    json_decref(j);
    j = json_deep_copy(base);
    json_object_del(json_object_get(json_object_get(j, "model"), "vocab"), "<0x41>");
    expect_json_fail(j, "no byte token <0x41>");
    json_decref(j);
    json_decref(base);
}

/* ---- bad arrays ---- */

/* A small valid byte-level vocabulary: all 256 byte characters, then "ab", "abc". */
typedef struct small_vocab {
    char strs[260][8];
    const char *tokens[260];
    int32_t types[260];
    float scores[260];
    const char *merges[4];
    ms_tok_vocab v;
} small_vocab;

/* GPT-2's bytes_to_unicode of byte b, UTF-8 into out. */
static void byte_char(unsigned b, char *out) {
    unsigned c;
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) {
        c = b;
    } else {
        unsigned k = 0;
        for (unsigned x = 0; x < b; x++)
            if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF)))
                k++;
        c = 256 + k;
    }
    if (c < 0x80) {
        out[0] = (char)c;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (c >> 6));
        out[1] = (char)(0x80 | (c & 0x3F));
        out[2] = 0;
    }
}

static void small_init(small_vocab *s) {
    memset(s, 0, sizeof *s);
    for (unsigned b = 0; b < 256; b++) {
        byte_char(b, s->strs[b]);
        s->types[b] = MS_TOK_TYPE_NORMAL;
    }
    strcpy(s->strs[256], "ab");
    strcpy(s->strs[257], "abc");
    strcpy(s->strs[258], "<|end|>");
    s->types[256] = s->types[257] = MS_TOK_TYPE_NORMAL;
    s->types[258] = MS_TOK_TYPE_CONTROL;
    for (int i = 0; i < 259; i++)
        s->tokens[i] = s->strs[i];
    s->merges[0] = "a b";
    s->merges[1] = "ab c";
    s->v = ms_tok_vocab_default();
    s->v.source = "bad.gguf";
    s->v.model = "gpt2";
    s->v.pre = "gpt2";
    s->v.tokens = s->tokens;
    s->v.n_tokens = 259;
    s->v.token_types = s->types;
    s->v.merges = s->merges;
    s->v.n_merges = 2;
    s->v.eos_id = 258;
}

static void expect_fail(const ms_tok_vocab *v, ms_status code, const char *needle) {
    ms_tok_hf *tok = (ms_tok_hf *)1;
    ms_error err = {0};
    ms_status st = ms_tok_hf_from_vocab(&tok, v, &err);
    if (st != code || strstr(err.msg, needle) == NULL || strchr(err.msg, '\n') != NULL)
        fprintf(stderr, "want %d \"%s\", got %d: %s\n", code, needle, st, err.msg);
    assert_int_equal(st, code);
    assert_null(tok);
    assert_non_null(strstr(err.msg, needle));
    assert_non_null(strstr(err.msg, "bad.gguf"));
    assert_null(strchr(err.msg, '\n'));
}

static void test_small_valid(void **state) {
    (void)state;
    small_vocab s;
    small_init(&s);
    ms_tok_hf *tok = NULL;
    ms_error err = {0};
    assert_int_equal(ms_tok_hf_from_vocab(&tok, &s.v, &err), MS_OK);
    int32_t *ids = NULL;
    size_t n = 0;
    assert_int_equal(ms_tok_hf_encode(tok, "abc ab<|end|>", 13, false, &ids, &n, &err), MS_OK);
    /* "abc", " ab" is byte-level "Ġab": Ġ then "ab" (no merge Ġ+ab), then the control token */
    assert_int_equal(n, 4);
    assert_int_equal(ids[0], 257);
    assert_int_equal(ids[1], ms_tok_hf_token_id(tok, "\xC4\xA0"));  /* byte 0x20 */
    assert_int_equal(ids[1], 32);
    assert_int_equal(ids[2], 256);
    assert_int_equal(ids[3], 258);
    assert_true(ms_tok_hf_is_eog(tok, 258));
    ms_free(ids);
    ms_tok_hf_free(tok);
}

static void test_bad_vocab(void **state) {
    (void)state;
    small_vocab s;
    small_init(&s);
    s.v.model = "bert";
    expect_fail(&s.v, MS_ERR_UNSUPPORTED, "tokenizer.ggml.model \"bert\"");
    small_init(&s);
    s.v.pre = "mystery";
    expect_fail(&s.v, MS_ERR_UNSUPPORTED, "tokenizer.ggml.pre \"mystery\"");
    small_init(&s);
    s.v.n_tokens = 0;
    expect_fail(&s.v, MS_ERR_FORMAT, "tokenizer.ggml.tokens has 0 entries");
    small_init(&s);
    s.v.n_tokens = (size_t)1 << 40;  /* a lying count */
    expect_fail(&s.v, MS_ERR_FORMAT, "tokenizer.ggml.tokens has");
    small_init(&s);
    s.merges[1] = "ab zz";
    expect_fail(&s.v, MS_ERR_FORMAT, "tokenizer.ggml.merges[1] names token \"zz\"");
    small_init(&s);
    s.merges[0] = "abc";
    expect_fail(&s.v, MS_ERR_FORMAT, "tokenizer.ggml.merges[0] \"abc\" is not two tokens");
    small_init(&s);
    s.merges[1] = "c c";  /* "cc" is no token */
    expect_fail(&s.v, MS_ERR_FORMAT, "tokenizer.ggml.merges[1] makes \"cc\"");
    small_init(&s);
    s.v.merges = NULL;
    expect_fail(&s.v, MS_ERR_FORMAT, "tokenizer.ggml.merges: 2 entries but no array");
    small_init(&s);
    strcpy(s.strs[257], "a\xC3(");
    expect_fail(&s.v, MS_ERR_FORMAT, "tokenizer.ggml.tokens[257] is not valid UTF-8");
    small_init(&s);
    size_t lens[259];
    for (int i = 0; i < 259; i++)
        lens[i] = strlen(s.tokens[i]);
    lens[256] = 3;  /* "ab\0" */
    s.v.token_lens = lens;
    expect_fail(&s.v, MS_ERR_FORMAT, "tokenizer.ggml.tokens[256] holds a NUL byte");
    small_init(&s);
    s.types[5] = 9;
    expect_fail(&s.v, MS_ERR_FORMAT, "tokenizer.ggml.token_type[5] = 9");
    small_init(&s);
    s.v.eos_id = 259;
    expect_fail(&s.v, MS_ERR_FORMAT, "tokenizer.ggml.eos_token_id 259 is not a token id");
    small_init(&s);
    s.v.bos_id = -7;
    expect_fail(&s.v, MS_ERR_FORMAT, "tokenizer.ggml.bos_token_id -7");
    small_init(&s);
    s.v.add_bos = true;
    expect_fail(&s.v, MS_ERR_FORMAT, "add_bos_token is set but there is no bos_token_id");
    small_init(&s);
    s.tokens[65] = NULL;
    expect_fail(&s.v, MS_ERR_FORMAT, "tokenizer.ggml.tokens[65] is missing");
    small_init(&s);
    strcpy(s.strs[66], "ab");  /* byte 'B' has no token now (a duplicate took its place) */
    {
        ms_tok_hf *tok = NULL;
        ms_error err = {0};
        assert_int_equal(ms_tok_hf_from_vocab(&tok, &s.v, &err), MS_OK);  /* as real GGUFs lacking bytes */
        int32_t *ids = NULL;
        size_t n = 0;
        assert_int_equal(ms_tok_hf_encode(tok, "aB", 2, false, &ids, &n, &err), MS_ERR_INVALID_ARG);
        assert_non_null(strstr(err.msg, "cannot encode byte 0x42"));
        assert_null(ids);
        assert_int_equal(ms_tok_hf_encode(tok, "abc", 3, false, &ids, &n, &err), MS_OK);
        assert_int_equal(n, 1);
        assert_int_equal(ids[0], 257);  /* "ab" is now id 66 and 256; "abc" still merges */
        ms_free(ids);
        ms_tok_hf_free(tok);
    }
    /* llama: scores required, NaN refused, bytes or unk needed */
    small_init(&s);
    s.v.model = "llama";
    expect_fail(&s.v, MS_ERR_FORMAT, "tokenizer.ggml.scores is missing");
    s.v.scores = s.scores;
    s.scores[3] = NAN;
    expect_fail(&s.v, MS_ERR_FORMAT, "tokenizer.ggml.scores[3] is NaN");
    s.scores[3] = 0;
    expect_fail(&s.v, MS_ERR_FORMAT, "no byte token <0x00> and no unknown token");
    /* allocation failures anywhere: an error, never a crash or leak */
    small_init(&s);
    for (int k = 1; k < 400; k++) {
        ms_alloc_fail_nth(k);
        ms_tok_hf *tok = NULL;
        ms_error err = {0};
        ms_status st = ms_tok_hf_from_vocab(&tok, &s.v, &err);
        ms_alloc_fail_nth(0);
        if (st == MS_OK) {
            ms_tok_hf_free(tok);
            break;
        }
        assert_null(tok);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_smollm2_gguf),
        ms_unit_test(test_small_valid),
        ms_unit_test(test_qwen3_as_gguf),
        ms_unit_test(test_llama3_as_gguf),
        ms_unit_test(test_spm_vocab),
        ms_unit_test(test_spm_real),
        ms_unit_test(test_spm_tokenizer_json),
        ms_unit_test(test_spm_tokenizer_json_bad),
        ms_unit_test(test_bad_vocab),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
