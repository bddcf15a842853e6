/*
 * gguf_model.h - a GGUF language model as a Hugging Face checkpoint: its weights dequantized to
 * float32 under Hugging Face tensor names, and a config.json derived from its `<arch>.*` keys.
 *
 * Architectures (general.architecture): llama (Llama 2/3, Mistral, SmolLM2), qwen2, qwen3. Any other
 * is MS_ERR_UNSUPPORTED naming it. Tensor names (llama.cpp's gguf-py tensor_mapping.py, the
 * inverse of what convert_hf_to_gguf.py writes):
 *   token_embd.weight            -> model.embed_tokens.weight
 *   output_norm.weight           -> model.norm.weight
 *   output.weight                -> lm_head.weight   (absent: tied, tie_word_embeddings true)
 *   blk.N.attn_norm.weight       -> model.layers.N.input_layernorm.weight
 *   blk.N.attn_{q,k,v}.{weight,bias} -> model.layers.N.self_attn.{q,k,v}_proj.{weight,bias}
 *   blk.N.attn_output.weight     -> model.layers.N.self_attn.o_proj.weight
 *   blk.N.attn_{q,k}_norm.weight -> model.layers.N.self_attn.{q,k}_norm.weight   (qwen3)
 *   blk.N.ffn_norm.weight        -> model.layers.N.post_attention_layernorm.weight
 *   blk.N.ffn_{gate,up,down}.weight -> model.layers.N.mlp.{gate,up,down}_proj.weight
 *   rope_freqs.weight            -> no weight: config.json's rope_scaling (rope_type llama3), below
 * A tensor outside this list (MoE experts, ...) is MS_ERR_UNSUPPORTED naming it: nothing in the
 * file is silently ignored.
 *
 * Llama 3.x RoPE scaling: convert_hf_to_gguf.py writes no key for it but a tensor
 * rope_freqs.weight [head_dim / 2] of per-pair divisors (llama.cpp: theta_i = pos * base^(-2i/d) /
 * ff[i]). The loader recovers factor, low_freq_factor (fixed at 1: the divisors only depend on the
 * two wavelengths original / low and original / high), high_freq_factor and
 * original_max_position_embeddings from it, snapped to thousandths / an integer, checks that the
 * converter's formula with them reproduces every divisor (relative 1e-5), and derives
 * rope_scaling {rope_type: llama3, ...}: the model then runs the same inverse frequencies as from
 * the Hugging Face config (bit-identical for the published parameters). A tensor no such
 * parameters reproduce is MS_ERR_UNSUPPORTED naming it and the dimension; all ones means default
 * frequencies; a file with both rope_freqs.weight and A.rope.scaling.type is MS_ERR_FORMAT.
 *
 * Shapes: GGUF ne[] is reversed into row-major Hugging Face shapes ([out, in] for a linear).
 * Every tensor is dequantized at load (gguf_quant.h, bit-exact with ggml) into float32 memory the
 * model owns; the CPU backend computes with it directly and the GPU path converts it to bf16.
 *
 * Q/K permutation: for the llama architecture, llama.cpp's converter reorders the rows of q_proj
 * and k_proj (and their biases) inside each head for its interleaved-pair RoPE
 * (convert_hf_to_gguf.py, LlamaModel.permute: reshape(n_head, 2, head_dim / 2, ...).swapaxes(1, 2)).
 * The loader undoes it (GGUF row head*hd + 2*j + h -> HF row head*hd + h*hd/2 + j), so the model
 * runs the usual rotate-half RoPE on Hugging Face rows. qwen2/qwen3 files are not permuted.
 *
 * Config keys (config.json names from GGUF keys, A = the architecture):
 *   hidden_size A.embedding_length, num_hidden_layers A.block_count, num_attention_heads
 *   A.attention.head_count, num_key_value_heads A.attention.head_count_kv (default head_count),
 *   head_dim A.attention.key_length (default hidden / heads; value_length must match),
 *   intermediate_size A.feed_forward_length, vocab_size A.vocab_size (else token_embd's rows),
 *   max_position_embeddings A.context_length, rms_norm_eps A.attention.layer_norm_rms_epsilon,
 *   rope_theta A.rope.freq_base (default 10000), rope_scaling from A.rope.scaling.{type, factor,
 *   original_context_length} (linear, yarn), sliding_window A.attention.sliding_window,
 *   tie_word_embeddings (no output.weight), attention_bias (blk.0.attn_q.bias exists),
 *   bos/eos_token_id from tokenizer.ggml.{bos,eos}_token_id; model_type and architectures
 *   ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"). A.rope.dimension_count other
 *   than head_dim (partial rotary) is MS_ERR_UNSUPPORTED.
 *
 * Ownership: ms_gguf_model_* functions borrow their arguments; ms_gguf_model_init's result is
 * owned by the caller (ms_gguf_model_free, NULL accepted); its tensors (names, data) live as long
 * as it. Errors: one line "<path>: <problem>" naming the key or tensor.
 */
#ifndef MS_GGUF_MODEL_H
#define MS_GGUF_MODEL_H

#include "gguf.h"
#include "ms_base.h"
#include "safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ms_gguf_model ms_gguf_model;

/*
 * Open the GGUF at `path`, check its architecture and tensor names, dequantize every tensor to
 * float32 under its Hugging Face name (Q/K un-permuted for llama). Errors: those of ms_gguf_init,
 * MS_ERR_UNSUPPORTED (architecture, tensor name, ggml type), MS_ERR_FORMAT (a tensor whose shape
 * contradicts the metadata, e.g. q rows not heads * head_dim), MS_ERR_OOM.
 */
ms_status ms_gguf_model_init(ms_gguf_model **out, const char *path, ms_error *err);
/* Free the dequantized weights and the file. NULL accepted. */
void ms_gguf_model_free(ms_gguf_model *m);

/* The parsed file (borrowed): metadata for the tokenizer and chat template. */
const ms_gguf *ms_gguf_model_file(const ms_gguf_model *m);
/* Number of tensors, and tensor i in ascending strcmp order of the Hugging Face names (F32,
 * file_path = the .gguf path, file_offset = the GGUF data's offset). */
size_t ms_gguf_model_n_tensors(const ms_gguf_model *m);
const ms_st_tensor *ms_gguf_model_tensor_at(const ms_gguf_model *m, size_t i);

/*
 * config.json text for the GGUF g (ms_malloc'd into *out; release with ms_free), as listed in the
 * file comment. Errors: MS_ERR_UNSUPPORTED (architecture, partial rotary, rope scaling type),
 * MS_ERR_NOT_FOUND (a required key, named), MS_ERR_FORMAT (a key of the wrong type or an
 * inconsistent value), MS_ERR_OOM.
 */
ms_status ms_gguf_model_config_json(const ms_gguf *g, char **out, ms_error *err);

/* A tensor's ggml storage (ms_gguf_model_raw_info). */
typedef struct ms_gguf_raw_info {
    uint32_t type;           /* ggml type as stored (MS_GGML_TYPE_*) */
    int64_t rows;            /* Hugging Face shape[0] (1 for a 1-D tensor) */
    int64_t cols;            /* values per row (GGUF ne[0]) */
    size_t row_bytes;        /* bytes of one row in the file */
    int64_t permute_groups;  /* llama q/k: heads whose rows the converter permuted; 0 none */
} ms_gguf_raw_info;

/*
 * The file's storage of the tensor with Hugging Face name `name` (as listed by
 * ms_gguf_model_tensor_at): its ggml type, rows and row bytes, for a backend that keeps the
 * blocks quantized (backend_cuda_quant.h). Errors: MS_ERR_NOT_FOUND naming it.
 */
ms_status ms_gguf_model_raw_info(const ms_gguf_model *m, const char *name, ms_gguf_raw_info *out,
                                 ms_error *err);
/*
 * Copy rows [row0, row0 + n_rows) of tensor `name`, in Hugging Face row order (llama q/k rows
 * un-permuted as the float32 tensor is, whole rows of blocks moved), as the file stores them
 * (ggml blocks), into dst[cap]. Dequantizing the result gives exactly the rows of the float32
 * tensor. Errors: MS_ERR_NOT_FOUND, MS_ERR_INVALID_ARG (range, cap) naming the tensor.
 */
ms_status ms_gguf_model_copy_raw_rows(const ms_gguf_model *m, const char *name, int64_t row0,
                                      int64_t n_rows, void *dst, size_t cap, ms_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MS_GGUF_MODEL_H */
