/*
 * gguf_tokenizer.c - see gguf_tokenizer.h.
 */
#include "gguf_tokenizer.h"

#include <math.h>
#include <string.h>

#include "gguf.h"

/* An optional integer id key: -1 when absent. */
static ms_status get_id(const ms_gguf *g, const char *key, int32_t *out, ms_error *err) {
    int64_t v = -1;
    MS_TRY(ms_gguf_get_int_or(g, key, -1, &v, err));
    if (v < -1 || v > INT32_MAX)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: metadata key '%s' is %lld, not a token id",
                       ms_gguf_path(g), key, (long long)v);
    *out = (int32_t)v;
    return MS_OK;
}

/* An optional string array: *kv NULL when absent. */
static ms_status get_strings(const ms_gguf *g, const char *key, const ms_gguf_kv **kv,
                             ms_error *err) {
    *kv = NULL;
    if (ms_gguf_find_kv(g, key) == NULL)
        return MS_OK;
    return ms_gguf_get_array(g, key, MS_GGUF_STRING, kv, err);
}

ms_status ms_gguf_tokenizer_load(const char *path, ms_tok_hf **out, ms_error *err) {
    *out = NULL;
    ms_gguf *g = NULL;
    MS_TRY(ms_gguf_init(&g, path, err));
    ms_status st = MS_OK;
    const char **tokens = NULL, **merges = NULL;
    size_t *token_lens = NULL, *merge_lens = NULL;
    float *scores = NULL;
    int32_t *types = NULL;
    ms_tok_vocab v = ms_tok_vocab_default();
    v.source = path;
    const ms_gguf_kv *tk = NULL, *mk = NULL, *sk = NULL, *yk = NULL;

    st = ms_gguf_get_string(g, "tokenizer.ggml.model", &v.model, NULL, err);
    if (st == MS_ERR_NOT_FOUND)
        st = MS_FAIL(err, MS_ERR_NOT_FOUND,
                     "%s: the GGUF carries no tokenizer (no tokenizer.ggml.model): give "
                     "--tokenizer, or --tokenizer none to run on token ids",
                     path);
    if (st == MS_OK && ms_gguf_find_kv(g, "tokenizer.ggml.pre") != NULL)
        st = ms_gguf_get_string(g, "tokenizer.ggml.pre", &v.pre, NULL, err);
    if (st == MS_OK)
        st = ms_gguf_get_array(g, "tokenizer.ggml.tokens", MS_GGUF_STRING, &tk, err);
    if (st == MS_OK)
        st = get_strings(g, "tokenizer.ggml.merges", &mk, err);
    if (st == MS_OK && ms_gguf_find_kv(g, "tokenizer.ggml.scores") != NULL)
        st = ms_gguf_get_array(g, "tokenizer.ggml.scores", MS_GGUF_VTYPE_COUNT, &sk, err);
    if (st == MS_OK && ms_gguf_find_kv(g, "tokenizer.ggml.token_type") != NULL)
        st = ms_gguf_get_array(g, "tokenizer.ggml.token_type", MS_GGUF_VTYPE_COUNT, &yk, err);
    if (st == MS_OK && ((sk != NULL && sk->n != tk->n) || (yk != NULL && yk->n != tk->n)))
        st = MS_FAIL(err, MS_ERR_FORMAT,
                     "%s: tokenizer.ggml.%s has %zu entries for %zu tokens", path,
                     sk != NULL && sk->n != tk->n ? "scores" : "token_type",
                     sk != NULL && sk->n != tk->n ? sk->n : yk->n, tk->n);
    if (st == MS_OK) {
        size_t n = tk->n, m = mk != NULL ? mk->n : 0;
        tokens = ms_calloc(n > 0 ? n : 1, sizeof *tokens);
        token_lens = ms_calloc(n > 0 ? n : 1, sizeof *token_lens);
        merges = ms_calloc(m > 0 ? m : 1, sizeof *merges);
        merge_lens = ms_calloc(m > 0 ? m : 1, sizeof *merge_lens);
        scores = sk != NULL ? ms_calloc(n > 0 ? n : 1, sizeof *scores) : NULL;
        types = yk != NULL ? ms_calloc(n > 0 ? n : 1, sizeof *types) : NULL;
        if (tokens == NULL || token_lens == NULL || merges == NULL || merge_lens == NULL ||
            (sk != NULL && scores == NULL) || (yk != NULL && types == NULL))
            st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory for %zu tokens", path, n);
        for (size_t i = 0; st == MS_OK && i < n; i++) {
            const ms_gguf_str *s = ms_gguf_kv_str(tk, i);
            tokens[i] = s->s;
            token_lens[i] = s->len;
            double f;
            int64_t t;
            if (sk != NULL) {
                if (!ms_gguf_kv_float(sk, i, &f) || !isfinite(f))
                    st = MS_FAIL(err, MS_ERR_FORMAT,
                                 "%s: tokenizer.ggml.scores[%zu] is not a finite number", path, i);
                else
                    scores[i] = (float)f;
            }
            if (st == MS_OK && yk != NULL) {
                if (!ms_gguf_kv_int(yk, i, &t) || t < INT32_MIN || t > INT32_MAX)
                    st = MS_FAIL(err, MS_ERR_FORMAT,
                                 "%s: tokenizer.ggml.token_type[%zu] is not an int32", path, i);
                else
                    types[i] = (int32_t)t;
            }
        }
        for (size_t i = 0; st == MS_OK && i < m; i++) {
            const ms_gguf_str *s = ms_gguf_kv_str(mk, i);
            merges[i] = s->s;
            merge_lens[i] = s->len;
        }
        v.tokens = tokens;
        v.token_lens = token_lens;
        v.n_tokens = n;
        v.scores = scores;
        v.token_types = types;
        v.merges = merges;
        v.merge_lens = merge_lens;
        v.n_merges = m;
    }
    if (st == MS_OK)
        st = get_id(g, "tokenizer.ggml.bos_token_id", &v.bos_id, err);
    if (st == MS_OK)
        st = get_id(g, "tokenizer.ggml.eos_token_id", &v.eos_id, err);
    if (st == MS_OK)
        st = get_id(g, "tokenizer.ggml.eot_token_id", &v.eot_id, err);
    if (st == MS_OK)
        st = get_id(g, "tokenizer.ggml.unknown_token_id", &v.unk_id, err);
    if (st == MS_OK)
        st = get_id(g, "tokenizer.ggml.padding_token_id", &v.pad_id, err);
    /* llama.cpp's defaults for an absent add_bos_token (llama_vocab::load): true for SentencePiece
       and for gpt2 with a llama-bpe pre-tokenizer, false for other gpt2 vocabularies */
    if (st == MS_OK)
        v.add_bos = strcmp(v.model, "llama") == 0 ||
                    (v.pre != NULL && (strcmp(v.pre, "llama-bpe") == 0 ||
                                       strcmp(v.pre, "llama3") == 0 || strcmp(v.pre, "llama-v3") == 0));
    if (st == MS_OK)
        st = ms_gguf_get_bool_or(g, "tokenizer.ggml.add_bos_token", v.add_bos, &v.add_bos, err);
    if (st == MS_OK)
        st = ms_gguf_get_bool_or(g, "tokenizer.ggml.add_eos_token", v.add_eos, &v.add_eos, err);
    if (st == MS_OK)
        st = ms_gguf_get_bool_or(g, "tokenizer.ggml.add_space_prefix", v.add_space_prefix,
                                 &v.add_space_prefix, err);
    if (st == MS_OK && ms_gguf_find_kv(g, "tokenizer.chat_template") != NULL)
        st = ms_gguf_get_string(g, "tokenizer.chat_template", &v.chat_template, NULL, err);
    if (st == MS_OK)
        st = ms_tok_hf_from_vocab(out, &v, err);
    ms_free(tokens);
    ms_free(token_lens);
    ms_free(merges);
    ms_free(merge_lens);
    ms_free(scores);
    ms_free(types);
    ms_gguf_free(g); /* the vocabulary copied what it keeps (ms_tok_vocab: borrowed for the call) */
    return st;
}
