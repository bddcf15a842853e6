/*
 * fuzz_llama2c.c - libFuzzer target for llama2.c files: the checkpoint .bin (runtime/llama2c.c,
 * through ms_llama2c_init, ms_ckpt_init and the derived config.json of ms_hf_config_init) and the
 * tokenizer .bin (runtime/tokenizer_llama2c.c).
 *
 * Every input is tried as both (a checkpoint header and a tokenizer header both start with a small
 * positive int32, so neither can be told from the other). Checkpoint: every weight view and tensor
 * is read to its last byte (the data is an mmap, which ASan does not guard: a view past the mapping
 * faults), the config derived from the header is loaded and its RoPE and eos ids read. Tokenizer:
 * loaded with vocab_size 0 (all tokens in the file) and with the token count of the file's first
 * int32 taken as a token count; a fixed string and the input itself (as text, NULs made spaces) are encoded
 * with and without BOS/EOS, and every id (and ids out of range) decoded after every other id of
 * the encoding. A failure must be one line and not out of memory, nothing may leak; ASan/UBSan catch
 * the rest. Run it with `make fuzz FUZZ_TARGETS=llama2c`.
 */
#include "fuzz_util.h"

#include "checkpoint.h"
#include "hf_config.h"
#include "llama2c.h"
#include "tokenizer_llama2c.h"

static const char fuzz_fixed_text[] = "Once upon a time, caf\xc3\xa9 \xf0\x9f\x98\x80 <0x0A> 42\n";

static uint8_t fuzz_sum_bytes(const void *p, size_t n) {
    const uint8_t *b = p;
    uint8_t s = 0;
    for (size_t i = 0; i < n; i++)
        s ^= b[i];
    return s;
}

static void fuzz_checkpoint(const char *path) {
    ms_error err = {0};
    ms_llama2c_config lc;
    fuzz_check_error("fuzz_llama2c", ms_llama2c_read_config(path, &lc, &err), &err);
    ms_llama2c *m = NULL;
    ms_status st = ms_llama2c_init(&m, path, &err);
    fuzz_check_error("fuzz_llama2c", st, &err);
    volatile uint8_t sink = 0;
    if (st == MS_OK) {
        const ms_llama2c_config *c = ms_llama2c_get_config(m);
        const ms_llama2c_weights *w = ms_llama2c_get_weights(m);
        size_t dim = (size_t)c->dim, hid = (size_t)c->hidden_dim, L = (size_t)c->n_layers;
        size_t q = (size_t)c->n_heads * (size_t)c->head_size, kv = (size_t)c->n_kv_heads * (size_t)c->head_size;
        size_t vocab = (size_t)c->vocab_size;
        sink ^= fuzz_sum_bytes(w->token_embedding_table, vocab * dim * 4);
        sink ^= fuzz_sum_bytes(w->rms_att_weight, L * dim * 4);
        sink ^= fuzz_sum_bytes(w->wq, L * q * dim * 4);
        sink ^= fuzz_sum_bytes(w->wk, L * kv * dim * 4);
        sink ^= fuzz_sum_bytes(w->wv, L * kv * dim * 4);
        sink ^= fuzz_sum_bytes(w->wo, L * dim * q * 4);
        sink ^= fuzz_sum_bytes(w->rms_ffn_weight, L * dim * 4);
        sink ^= fuzz_sum_bytes(w->w1, L * hid * dim * 4);
        sink ^= fuzz_sum_bytes(w->w2, L * dim * hid * 4);
        sink ^= fuzz_sum_bytes(w->w3, L * hid * dim * 4);
        sink ^= fuzz_sum_bytes(w->rms_final_weight, dim * 4);
        sink ^= fuzz_sum_bytes(w->wcls, vocab * dim * 4);
        for (size_t i = 0; i < ms_llama2c_n_tensors(m); i++) {
            const ms_st_tensor *t = ms_llama2c_tensor_at(m, i);
            sink ^= fuzz_sum_bytes(t->data, t->n_bytes);
        }
        char *json = NULL;
        fuzz_check_error("fuzz_llama2c", ms_llama2c_config_json(c, path, &json, &err), &err);
        ms_free(json);
    }
    ms_llama2c_free(m);
    (void)sink;

    ms_ckpt *ck = NULL;
    st = ms_ckpt_init(&ck, path, &err);
    fuzz_check_error("fuzz_llama2c", st, &err);
    if (st == MS_OK) {
        for (size_t i = 0; i < ms_ckpt_n_tensors(ck); i++) {
            const ms_st_tensor *t = ms_ckpt_tensor_at(ck, i);
            fuzz_check_error("fuzz_llama2c",
                             ms_ckpt_expect_tensor(ck, t->name, MS_ST_DTYPES_FLOAT, t->n_dims, t->shape, NULL, &err),
                             &err);
        }
    }
    ms_ckpt_free(ck);

    ms_hf_config *cfg = NULL;
    st = ms_hf_config_init(&cfg, path, &err);
    fuzz_check_error("fuzz_llama2c", st, &err);
    if (st == MS_OK) {
        ms_rope_params rp;
        fuzz_check_error("fuzz_llama2c", ms_hf_config_get_rope(cfg, &rp, &err), &err);
        int64_t eos[4], v;
        size_t n;
        fuzz_check_error("fuzz_llama2c", ms_hf_config_get_eos_ids(cfg, eos, 4, &n, &err), &err);
        fuzz_check_error("fuzz_llama2c", ms_hf_config_get_int(cfg, "vocab_size", &v, &err), &err);
    }
    ms_hf_config_free(cfg);
}

static void fuzz_tok_text(const ms_llama2c_tok *tok, const char *text) {
    ms_error err = {0};
    for (int mode = 0; mode < 2; mode++) {
        int32_t *ids = NULL;
        size_t n = 0;
        ms_status st = ms_llama2c_tok_encode(tok, text, mode == 0, mode == 1, &ids, &n, &err);
        fuzz_check_error("fuzz_llama2c", st, &err);
        if (st != MS_OK)
            continue;
        int vocab = ms_llama2c_tok_vocab_size(tok);
        for (size_t i = 0; i < n; i++) {
            if (ids[i] < 0 || ids[i] >= vocab) {
                fprintf(stderr, "fuzz_llama2c: encode gave id %d outside [0, %d)\n", ids[i], vocab);
                abort();
            }
            const char *piece = ms_llama2c_tok_decode(tok, i > 0 ? ids[i - 1] : MS_LLAMA2C_TOK_BOS, ids[i]);
            (void)ms_llama2c_tok_piece_printable(piece);
        }
        ms_free(ids);
    }
}

static void fuzz_tokenizer(const char *path, const uint8_t *data, size_t size) {
    ms_error err = {0};
    int vocabs[2] = {0, -1};
    if (size >= 4) {
        int32_t v;
        memcpy(&v, data, 4);
        vocabs[1] = v >= 0 && v <= 4096 ? (int)v : -1;
    }
    for (int k = 0; k < 2; k++) {
        if (vocabs[k] < 0)
            continue;
        ms_llama2c_tok *tok = NULL;
        ms_status st = ms_llama2c_tok_init(&tok, path, vocabs[k], &err);
        fuzz_check_error("fuzz_llama2c", st, &err);
        if (st != MS_OK)
            continue;
        int vocab = ms_llama2c_tok_vocab_size(tok);
        for (int id = -2; id < vocab + 2; id++) {
            const char *piece = ms_llama2c_tok_piece(tok, id);
            if ((piece != NULL) != (id >= 0 && id < vocab)) {
                fprintf(stderr, "fuzz_llama2c: piece of id %d (vocab %d) is %s\n", id, vocab, piece ? "set" : "NULL");
                abort();
            }
            (void)ms_llama2c_tok_score(tok, id);
            (void)ms_llama2c_tok_piece_printable(ms_llama2c_tok_decode(tok, MS_LLAMA2C_TOK_BOS, id));
            (void)ms_llama2c_tok_decode(tok, 7, id);
        }
        fuzz_tok_text(tok, fuzz_fixed_text);
        char *text = fuzz_strndup(data, size);
        for (size_t i = 0; i < size; i++)  /* the whole input as text: NULs would end it */
            text[i] = text[i] == '\0' ? ' ' : text[i];
        fuzz_tok_text(tok, text);
        free(text);
        ms_llama2c_tok_free(tok);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 1 << 20)
        return -1;
    int64_t live = ms_alloc_get_stats().live_blocks;
    fuzz_checkpoint(fuzz_write("model.bin", data, size));
    fuzz_tokenizer(fuzz_write("tokenizer.bin", data, size), data, size);
    fuzz_check_leaks("fuzz_llama2c", live);
    return 0;
}
