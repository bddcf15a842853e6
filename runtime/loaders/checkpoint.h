/*
 * checkpoint.h - a model's weights as one name -> tensor map over one or more safetensors files.
 *
 * A checkpoint is opened from:
 *   - a folder: model.safetensors.index.json if present (sharded, as every published model over a
 *     few GB ships), else model.safetensors;
 *   - a *.json file: a shard index {"weight_map": {tensor: shard file}} (shards relative to it);
 *   - a *.bin file: a llama2.c checkpoint, its weights under Hugging Face Llama names (llama2c.h);
 *   - a *.gguf file: a GGUF model (llama, qwen2, qwen3), every tensor dequantized to float32 at
 *     open under its Hugging Face name, Q/K un-permuted for llama (gguf_model.h);
 *   - any other file: a single safetensors file.
 * Every shard is fully validated (see safetensors.h) and may hold only float tensors (F32, BF16,
 * F16; an integer tensor is rejected by name); the index must be consistent with its shards:
 * each mapped tensor is in the shard the map names, no tensor appears in two shards, no shard holds
 * a tensor the map does not list, shard names stay inside the index's folder.
 *
 * The model's weight declarations come from the compiler: ms_ckpt_expect_tensor checks one declared
 * weight (name, accepted dtypes, shape) and reports a one-line error naming the file, the tensor and
 * the mismatch. Tied embeddings (no lm_head tensor) are the caller's policy: ms_ckpt_has_tensor is a
 * binary search, cheap enough to ask first.
 *
 * Ownership: ms_ckpt_* functions borrow their arguments; ms_ckpt_init's result is owned by the caller
 * and released with ms_ckpt_free (NULL accepted). Tensor descriptors live as long as the checkpoint.
 *
 * Usage:
 *     ms_ckpt *ck = NULL;
 *     MS_TRY(ms_ckpt_init(&ck, "path/to/model_dir", err));
 *     const int64_t shape[2] = {vocab, hidden};
 *     const ms_st_tensor *emb;
 *     MS_TRY(ms_ckpt_expect_tensor(ck, "model.embed_tokens.weight", MS_ST_DTYPES_FLOAT, 2, shape, &emb, err));
 *     bool tied = !ms_ckpt_has_tensor(ck, "lm_head.weight");
 */
#ifndef MS_CHECKPOINT_H
#define MS_CHECKPOINT_H

#include "ms_base.h"
#include "gguf.h"
#include "llama2c.h"
#include "safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ms_ckpt ms_ckpt;

/*
 * Open and validate the checkpoint at `path` (folder, index .json or .safetensors file).
 * Errors: MS_ERR_NOT_FOUND (folder holds neither model file), MS_ERR_IO, MS_ERR_PARSE (index not
 * JSON), MS_ERR_FORMAT (inconsistent index or shard), MS_ERR_UNSUPPORTED (dtype), MS_ERR_OOM.
 * The message names the file at fault.
 */
ms_status ms_ckpt_init(ms_ckpt **out, const char *path, ms_error *err);
/* Unmap every shard and free. NULL accepted. */
void ms_ckpt_free(ms_ckpt *ck);

/* The file that describes the checkpoint (index .json or the single .safetensors), borrowed. */
const char *ms_ckpt_path(const ms_ckpt *ck);
/* Number of safetensors shard files (1 for a single file, 0 for a llama2.c .bin or a .gguf). */
size_t ms_ckpt_n_files(const ms_ckpt *ck);
/* The llama2.c checkpoint behind ck (borrowed), or NULL when ck is safetensors. */
const ms_llama2c *ms_ckpt_get_llama2c(const ms_ckpt *ck);
/* The GGUF file behind ck (borrowed: metadata for tokenizers), or NULL when ck is not a .gguf. */
const ms_gguf *ms_ckpt_get_gguf(const ms_ckpt *ck);
/* The GGUF model behind ck (borrowed: the quantized blocks of its tensors, gguf_model.h), or
 * NULL when ck is not a .gguf. */
struct ms_gguf_model;
const struct ms_gguf_model *ms_ckpt_get_gguf_model(const ms_ckpt *ck);
/* Number of tensors over all shards. */
size_t ms_ckpt_n_tensors(const ms_ckpt *ck);
/* Tensor i (0 <= i < n), in ascending strcmp order of names over all shards. */
const ms_st_tensor *ms_ckpt_tensor_at(const ms_ckpt *ck, size_t i);
/* Tensor named `name` or NULL. O(log n). tensor->file_path names its shard. */
const ms_st_tensor *ms_ckpt_find_tensor(const ms_ckpt *ck, const char *name);
/* Whether a tensor named `name` exists. O(log n). */
bool ms_ckpt_has_tensor(const ms_ckpt *ck, const char *name);

/*
 * Validate the declared weight `name`: it exists, its dtype is in `dtype_mask` (bits
 * MS_ST_DTYPE_BIT(d)), and its shape equals shape[n_dims] (an entry of -1 matches any size).
 * On success *out (may be NULL) is the tensor. Errors, each one line naming file and tensor:
 * MS_ERR_NOT_FOUND "<ckpt>: tensor 'x' not found (the model declares it as [a, b])",
 * MS_ERR_FORMAT "<shard>: tensor 'x' has dtype F16, the model accepts F32, BF16",
 * MS_ERR_FORMAT "<shard>: tensor 'x' has shape [a, c], the model declares [a, b]".
 */
ms_status ms_ckpt_expect_tensor(const ms_ckpt *ck, const char *name, unsigned dtype_mask, int n_dims,
                                const int64_t *shape, const ms_st_tensor **out, ms_error *err);

/*
 * ms_ckpt_expect_tensor, then convert the tensor to a fresh float32 array *out (ms_malloc'd,
 * product(shape) elements; release with ms_free). Errors as above, plus MS_ERR_OOM.
 */
ms_status ms_ckpt_load_f32(const ms_ckpt *ck, const char *name, unsigned dtype_mask, int n_dims,
                           const int64_t *shape, float **out, ms_error *err);
/* Same, into a fresh bf16 array (for the GPU upload path). */
ms_status ms_ckpt_load_bf16(const ms_ckpt *ck, const char *name, unsigned dtype_mask, int n_dims,
                            const int64_t *shape, uint16_t **out, ms_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MS_CHECKPOINT_H */
