/*
 * fuzz_tokenizer_vocab.c - libFuzzer target for tokenizers built from vocabulary arrays
 * (ms_tok_hf_from_vocab, runtime/tokenizers/tokenizer_hf.c), the form GGUF metadata carries.
 *
 * Input: 4 header bytes, then NUL-separated parts.
 *   byte 0: bit 0 model llama (else gpt2), bit 1 add_bos, bit 2 add_eos, bit 3 add_space_prefix,
 *           bits 4..6 the pre-tokenizer (default, gpt2, smollm, llama-bpe, qwen2, llama3, NULL,
 *           an unknown name), bit 7 no token types (all NORMAL);
 *   bytes 1..3: bos, eos and unknown ids (255: none; an id past the vocabulary must be refused);
 *   part 0: the tokens, '\n'-separated (any bytes: invalid UTF-8 must be refused, named);
 *   part 1: the merges, '\n'-separated ("a b");
 *   part 2: one byte per token: its type (byte % 8: 7 is out of range) and its score
 *           ((int8_t)byte / 4; 0x7F is NaN, which must be refused for llama);
 *   part 3: text to encode.
 * On a built tokenizer: encode the text and a fixed string (plain and with specials), every id in
 * range, decode both ways, the accessors and is_eog on every id. A failure must be one line (never
 * out of memory), nothing may leak; ASan/UBSan catch the rest.
 */
#include "fuzz_util.h"

#include <math.h>

#include "tokenizer_hf.h"

static const char fuzz_fixed_text[] = "Hello, world! <s> caf\xc3\xa9 \xe2\x96\x81x  \t\n42 \xf0\x9f\x98\x80 ab";

/* Split part into at most max '\n'-separated pieces (pointers into part). */
static size_t fuzz_lines(const uint8_t *part, size_t len, const char **s, size_t *lens, size_t max) {
    size_t n = 0, start = 0;
    for (size_t i = 0; i <= len && n < max; i++)
        if (i == len || part[i] == '\n') {
            s[n] = (const char *)part + start;
            lens[n] = i - start;
            n++;
            start = i + 1;
        }
    return n;
}

static void fuzz_use(const ms_tok_hf *tok, const char *text, size_t len, bool add_special) {
    ms_error err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    ms_status st = ms_tok_hf_encode(tok, text, len, add_special, &ids, &n, &err);
    fuzz_check_error("fuzz_tokenizer_vocab", st, &err);
    if (st != MS_OK)
        return;
    int32_t vocab = ms_tok_hf_vocab_size(tok);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= vocab) {
            fprintf(stderr, "fuzz_tokenizer_vocab: id %d at %zu outside [0, %d)\n", ids[i], i, vocab);
            abort();
        }
    for (int skip = 0; skip < 2; skip++) {
        char *out = NULL;
        size_t out_len = 0;
        st = ms_tok_hf_decode(tok, ids, n, skip != 0, &out, &out_len, &err);
        fuzz_check_error("fuzz_tokenizer_vocab", st, &err);
        if (st == MS_OK && out[out_len] != '\0')
            abort();
        ms_free(out);
    }
    ms_free(ids);
}

#define FUZZ_MAX_TOKENS 4096

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 4 || size > 262144)
        return -1;
    int64_t live = ms_alloc_get_stats().live_blocks;
    static const char *const pres[] = {"default", "gpt2", "smollm", "llama-bpe", "qwen2", "llama3", NULL, "bogus"};
    uint8_t flags = data[0];
    ms_tok_vocab v = ms_tok_vocab_default();
    v.source = "fuzz.gguf";
    v.model = (flags & 1) ? "llama" : "gpt2";
    v.add_bos = (flags & 2) != 0;
    v.add_eos = (flags & 4) != 0;
    v.add_space_prefix = (flags & 8) != 0;
    v.pre = pres[(flags >> 4) & 7];
    v.bos_id = data[1] == 255 ? -1 : data[1];
    v.eos_id = data[2] == 255 ? -1 : data[2];
    v.unk_id = data[3] == 255 ? -1 : data[3];
    data += 4;
    size -= 4;
    static const char *toks[FUZZ_MAX_TOKENS], *merges[FUZZ_MAX_TOKENS];
    static size_t tok_lens[FUZZ_MAX_TOKENS], merge_lens[FUZZ_MAX_TOKENS];
    static int32_t types[FUZZ_MAX_TOKENS];
    static float scores[FUZZ_MAX_TOKENS];
    const uint8_t *part = NULL, *text = NULL;
    size_t len = 0, text_len = 0;
    fuzz_part(data, size, 0, &part, &len);
    v.n_tokens = fuzz_lines(part, len, toks, tok_lens, FUZZ_MAX_TOKENS);
    v.tokens = toks;
    v.token_lens = tok_lens;
    if (fuzz_part(data, size, 1, &part, &len) && len > 0) {
        v.n_merges = fuzz_lines(part, len, merges, merge_lens, FUZZ_MAX_TOKENS);
        v.merges = merges;
        v.merge_lens = merge_lens;
    }
    const uint8_t *tb = NULL;
    size_t tb_len = 0;
    fuzz_part(data, size, 2, &tb, &tb_len);
    for (size_t i = 0; i < v.n_tokens; i++) {
        uint8_t b = i < tb_len ? tb[i] : 1;
        types[i] = b % 8;
        scores[i] = b == 0x7F ? NAN : (float)(int8_t)b / 4.0f;
    }
    if (!(flags & 128))
        v.token_types = types;
    v.scores = scores;
    bool have_text = fuzz_part(data, size, 3, &text, &text_len);

    ms_tok_hf *tok = NULL;
    ms_error err = {0};
    ms_status st = ms_tok_hf_from_vocab(&tok, &v, &err);
    fuzz_check_error("fuzz_tokenizer_vocab", st, &err);
    if (st == MS_OK) {
        fuzz_use(tok, fuzz_fixed_text, sizeof fuzz_fixed_text - 1, false);
        fuzz_use(tok, fuzz_fixed_text, sizeof fuzz_fixed_text - 1, true);
        if (have_text) {
            fuzz_use(tok, (const char *)text, text_len, false);
            fuzz_use(tok, (const char *)text, text_len, true);
        }
        for (int32_t id = -1; id <= ms_tok_hf_vocab_size(tok); id++) {
            size_t blen = 0;
            (void)ms_tok_hf_token_bytes(tok, id, &blen);
            (void)ms_tok_hf_token_str(tok, id);
            (void)ms_tok_hf_is_special(tok, id);
            (void)ms_tok_hf_is_eog(tok, id);
        }
        (void)ms_tok_hf_bos_token(tok);
        (void)ms_tok_hf_eos_token(tok);
        ms_tok_hf_clear_cache(tok);
    }
    ms_tok_hf_free(tok);
    fuzz_check_leaks("fuzz_tokenizer_vocab", live);
    return 0;
}
