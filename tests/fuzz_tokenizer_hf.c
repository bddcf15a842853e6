/*
 * fuzz_tokenizer_hf.c - libFuzzer target for Hugging Face tokenizer.json (runtime/tokenizer_hf.c).
 *
 * Input: tokenizer.json bytes, then optionally a NUL and text to encode, then optionally a NUL and
 * tokenizer_config.json bytes (written beside it, since the loader reads it from there). On a loaded
 * tokenizer: encode a fixed string and the fuzz-provided text (with and without special tokens),
 * each twice: the second encode is served by the word cache and must give the same ids; decode the
 * ids (skipping specials and not), the streaming per-token bytes, and ids made from the text's
 * bytes, in and out of range; the accessors. A failure must be one line and not out of memory,
 * nothing may leak; ASan/UBSan catch the rest. Run it with `make fuzz FUZZ_TARGETS=tokenizer_hf`.
 */
#include "fuzz_util.h"

#include "tokenizer_hf.h"

static const char fuzz_fixed_text[] = "Hello, world! <|im_start|> caf\xc3\xa9 e\xcc\x81  \t\n42 \xf0\x9f\x98\x80 ab";

/* Encode text twice (cold, then cached), compare, and decode the result both ways. */
static void fuzz_encode_decode(const ms_tok_hf *tok, const char *text, size_t len, bool add_special) {
    ms_error err = {0};
    int32_t *ids = NULL, *again = NULL;
    size_t n = 0, n2 = 0;
    ms_status st = ms_tok_hf_encode(tok, text, len, add_special, &ids, &n, &err);
    fuzz_check_error("fuzz_tokenizer_hf", st, &err);
    if (st != MS_OK)
        return;
    st = ms_tok_hf_encode(tok, text, len, add_special, &again, &n2, &err);
    if (st != MS_OK || n2 != n || (n > 0 && memcmp(ids, again, n * sizeof *ids) != 0)) {
        fprintf(stderr, "fuzz_tokenizer_hf: a second (cached) encode differs: status %d, %zu vs %zu ids\n",
                (int)st, n2, n);
        abort();
    }
    ms_free(again);
    int32_t vocab = ms_tok_hf_vocab_size(tok);
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= vocab) {
            fprintf(stderr, "fuzz_tokenizer_hf: id %d at %zu outside the vocabulary [0, %d)\n", ids[i], i, vocab);
            abort();
        }
    }
    for (int skip = 0; skip < 2; skip++) {
        char *out = NULL;
        size_t out_len = 0;
        st = ms_tok_hf_decode(tok, ids, n, skip != 0, &out, &out_len, &err);
        fuzz_check_error("fuzz_tokenizer_hf", st, &err);
        if (st == MS_OK && out[out_len] != '\0') {
            fprintf(stderr, "fuzz_tokenizer_hf: decode returned an unterminated string\n");
            abort();
        }
        ms_free(out);
    }
    for (size_t i = 0; i < n; i++) {
        size_t blen = 0;
        (void)ms_tok_hf_token_bytes(tok, ids[i], &blen);
        (void)ms_tok_hf_token_str(tok, ids[i]);
        (void)ms_tok_hf_is_special(tok, ids[i]);
    }
    ms_free(ids);
}

/* Ids from the text's bytes (4 per id, any value): decode must skip unknown ones. */
static void fuzz_decode_raw(const ms_tok_hf *tok, const uint8_t *bytes, size_t len) {
    size_t n = len / 4;
    if (n == 0)
        return;
    int32_t *ids = malloc(n * sizeof *ids);
    if (ids == NULL)
        abort();
    memcpy(ids, bytes, n * sizeof *ids);
    for (size_t i = 0; i < n; i++)
        if (i % 2 == 1)
            ids[i] = (int32_t)((uint32_t)ids[i] % (uint32_t)(ms_tok_hf_vocab_size(tok) + 2));  /* mostly valid */
    ms_error err = {0};
    char *out = NULL;
    size_t out_len = 0;
    fuzz_check_error("fuzz_tokenizer_hf", ms_tok_hf_decode(tok, ids, n, false, &out, &out_len, &err), &err);
    ms_free(out);
    for (size_t i = 0; i < n; i++) {
        size_t blen = 0;
        (void)ms_tok_hf_token_bytes(tok, ids[i], &blen);
        (void)ms_tok_hf_token_str(tok, ids[i]);
    }
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 262144)
        return -1;
    int64_t live = ms_alloc_get_stats().live_blocks;
    const uint8_t *json, *text = NULL, *cfg;
    size_t json_len, text_len = 0, cfg_len;
    fuzz_part(data, size, 0, &json, &json_len);
    bool have_text = fuzz_part(data, size, 1, &text, &text_len);
    const char *path = fuzz_write("tokenizer.json", json, json_len);
    if (fuzz_part(data, size, 2, &cfg, &cfg_len))
        fuzz_write("tokenizer_config.json", cfg, cfg_len);
    else
        fuzz_unlink("tokenizer_config.json");

    ms_tok_hf *tok = NULL;
    ms_error err = {0};
    ms_status st = ms_tok_hf_init(&tok, path, &err);
    fuzz_check_error("fuzz_tokenizer_hf", st, &err);
    if (st == MS_OK) {
        (void)ms_tok_hf_bos_token(tok);
        (void)ms_tok_hf_eos_token(tok);
        (void)ms_tok_hf_bos_id(tok);
        (void)ms_tok_hf_eos_id(tok);
        (void)ms_tok_hf_chat_template(tok);
        (void)ms_tok_hf_token_id(tok, "<|im_start|>");
        fuzz_encode_decode(tok, fuzz_fixed_text, sizeof fuzz_fixed_text - 1, false);
        fuzz_encode_decode(tok, fuzz_fixed_text, sizeof fuzz_fixed_text - 1, true);
        if (have_text) {
            fuzz_encode_decode(tok, (const char *)text, text_len, false);
            fuzz_encode_decode(tok, (const char *)text, text_len, true);
            fuzz_decode_raw(tok, text, text_len);
        }
        ms_tok_hf_clear_cache(tok);
    }
    ms_tok_hf_free(tok);
    /* The text alone through NFC (the normalizer's own entry point). */
    if (have_text) {
        char *nfc = NULL;
        size_t nfc_len = 0;
        st = ms_tok_hf_nfc((const char *)text, text_len, &nfc, &nfc_len, &err);
        fuzz_check_error("fuzz_tokenizer_hf", st, &err);
        ms_free(nfc);
    }
    fuzz_check_leaks("fuzz_tokenizer_hf", live);
    return 0;
}
