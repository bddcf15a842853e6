/*
 * llama2c.h - llama2.c `.bin` checkpoints (Karpathy's run.c legacy format), mmap'd and validated.
 *
 * Layout (run.c's memory_map_weights): a header of 7 little-endian int32 {dim, hidden_dim, n_layers,
 * n_heads, n_kv_heads, vocab_size, seq_len}, then float32 arrays in this order:
 *   token_embedding_table [vocab, dim]
 *   rms_att_weight        [n_layers, dim]
 *   wq                    [n_layers, n_heads * head_size, dim]
 *   wk, wv                [n_layers, n_kv_heads * head_size, dim]
 *   wo                    [n_layers, dim, n_heads * head_size]
 *   rms_ffn_weight        [n_layers, dim]
 *   w1 (gate), w3 (up)    [n_layers, hidden_dim, dim]   (stored w1, w2, w3)
 *   w2 (down)             [n_layers, dim, hidden_dim]
 *   rms_final_weight      [dim]
 *   (skipped)             [seq_len, head_size / 2] freq_cis_real, then the same for freq_cis_imag
 *   wcls                  [vocab, dim] only when vocab_size in the header is negative (unshared
 *                         classifier); otherwise the classifier is token_embedding_table.
 * head_size = dim / n_heads. The file size must equal exactly what the header implies.
 * llama2.c rotates interleaved pairs (x[2i], x[2i+1]) in RoPE with theta 10000, RMSNorm eps 1e-5.
 *
 * The same weights are also exposed as safetensors-style tensor descriptors under Hugging Face Llama
 * names (model.embed_tokens.weight, model.layers.{i}.self_attn.q_proj.weight, ..., lm_head.weight
 * only when unshared), so ms_ckpt (checkpoint.h) opens a .bin like any checkpoint, and
 * ms_llama2c_config_json gives the matching config.json text (hf_config.h reads a .bin path
 * through it). The q/k weights are NOT permuted: a model using them must rotate interleaved pairs;
 * the derived config says so with "rope_interleaved": true.
 *
 * Ownership: ms_llama2c_* functions borrow their arguments; ms_llama2c_init's result is owned by the
 * caller (ms_llama2c_free, NULL accepted); weight pointers and tensors live as long as it.
 * Errors: one line "<path>: <problem>".
 */
#ifndef MS_LLAMA2C_H
#define MS_LLAMA2C_H

#include "ms_base.h"
#include "safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Header of a llama2.c checkpoint, validated. */
typedef struct ms_llama2c_config {
    int dim;                 /* model width (hidden_size) */
    int hidden_dim;          /* FFN width (intermediate_size) */
    int n_layers;
    int n_heads;             /* query heads */
    int n_kv_heads;          /* key/value heads (divides n_heads) */
    int vocab_size;          /* absolute value of the header's field */
    int seq_len;             /* maximum positions */
    int head_size;           /* dim / n_heads, even */
    bool shared_classifier;  /* header vocab_size > 0: classifier = token embedding table */
} ms_llama2c_config;

/* Float32 views into the mapping (4-byte aligned). Shapes as in the file comment. */
typedef struct ms_llama2c_weights {
    const float *token_embedding_table;  /* [vocab, dim] */
    const float *rms_att_weight;         /* [n_layers, dim] */
    const float *wq;                     /* [n_layers, n_heads * head_size, dim] */
    const float *wk;                     /* [n_layers, n_kv_heads * head_size, dim] */
    const float *wv;                     /* [n_layers, n_kv_heads * head_size, dim] */
    const float *wo;                     /* [n_layers, dim, n_heads * head_size] */
    const float *rms_ffn_weight;         /* [n_layers, dim] */
    const float *w1;                     /* [n_layers, hidden_dim, dim] gate */
    const float *w2;                     /* [n_layers, dim, hidden_dim] down */
    const float *w3;                     /* [n_layers, hidden_dim, dim] up */
    const float *rms_final_weight;       /* [dim] */
    const float *wcls;                   /* [vocab, dim]; == token_embedding_table when shared */
} ms_llama2c_weights;

typedef struct ms_llama2c ms_llama2c;

/*
 * Read and validate only the 28-byte header of `path` (and that the file size matches it).
 * Errors: MS_ERR_IO (cannot open), MS_ERR_FORMAT (header too short, a non-positive or inconsistent
 * field, file too short / too long for the header), MS_ERR_UNSUPPORTED (the newer "ak42" export
 * formats).
 */
ms_status ms_llama2c_read_config(const char *path, ms_llama2c_config *out, ms_error *err);

/* Map and validate the checkpoint at `path`. Errors as ms_llama2c_read_config, plus MS_ERR_OOM. */
ms_status ms_llama2c_init(ms_llama2c **out, const char *path, ms_error *err);
/* Unmap and free. NULL accepted. */
void ms_llama2c_free(ms_llama2c *m);

/* Path as given (borrowed). */
const char *ms_llama2c_path(const ms_llama2c *m);
/* Header (borrowed). */
const ms_llama2c_config *ms_llama2c_get_config(const ms_llama2c *m);
/* Weight views (borrowed). */
const ms_llama2c_weights *ms_llama2c_get_weights(const ms_llama2c *m);

/* Number of tensors under Hugging Face names (2 + 9 * n_layers, + 1 when unshared). */
size_t ms_llama2c_n_tensors(const ms_llama2c *m);
/* Tensor i, sorted by name (strcmp); F32, file_path = the .bin path. */
const ms_st_tensor *ms_llama2c_tensor_at(const ms_llama2c *m, size_t i);

/*
 * config.json text for this header (ms_malloc'd into *out; release with ms_free): model_type llama,
 * hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
 * head_dim, vocab_size, max_position_embeddings = seq_len, rms_norm_eps 1e-5, rope_theta 10000,
 * rope_interleaved true, tie_word_embeddings = shared classifier, bos_token_id 1, and eos_token_id 1:
 * run.c stops when the model emits BOS (1), which delimits sequences in its training data.
 */
ms_status ms_llama2c_config_json(const ms_llama2c_config *c, const char *path, char **out, ms_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MS_LLAMA2C_H */
