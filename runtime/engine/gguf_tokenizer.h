/*
 * gguf_tokenizer.h - the tokenizer a GGUF file carries in its metadata (tokenizer.ggml.*, the
 * keys llama.cpp's converter writes: gguf-py/gguf/constants.py Keys.Tokenizer), built with
 * ms_tok_hf_from_vocab. It lives in engine/ because it joins two layers that may not see each
 * other: loaders/gguf.h (the file) and tokenizers/tokenizer_hf.h (the tokenizer).
 */
#ifndef MS_GGUF_TOKENIZER_H
#define MS_GGUF_TOKENIZER_H

#include "ms_base.h"
#include "tokenizer_hf.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Read the tokenizer of the GGUF at `path`: tokenizer.ggml.model (required: "gpt2" or "llama"),
 * .pre, .tokens (required), .scores, .token_type, .merges, .bos/.eos/.eot/.unknown/.padding
 * _token_id, .add_bos_token, .add_eos_token, .add_space_prefix and tokenizer.chat_template.
 * Absent optional keys take llama.cpp's defaults (tokenizer_hf.h: add_bos_token true for llama and
 * for gpt2 with pre llama-bpe, add_eos_token false, add_space_prefix true). The result is owned by
 * the caller (ms_tok_hf_free). Errors: the GGUF's own (MS_ERR_IO, MS_ERR_FORMAT, ...), a key of
 * the wrong type or an array of the wrong length (MS_ERR_FORMAT naming file and key),
 * ms_tok_hf_from_vocab's, MS_ERR_OOM.
 */
ms_status ms_gguf_tokenizer_load(const char *path, ms_tok_hf **out, ms_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MS_GGUF_TOKENIZER_H */
