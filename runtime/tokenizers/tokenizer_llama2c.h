/*
 * tokenizer_llama2c.h - llama2.c `tokenizer.bin`: load, encode and decode exactly like run.c.
 *
 * File format: int32 max_token_length, then per token: float32 score, int32 len, len bytes (no NUL).
 * Ids 0, 1, 2 are <unk>, BOS, EOS; ids 3 .. 258 are the byte tokens "<0x00>" .. "<0xFF>".
 *
 * Encoding (run.c encode()): optional BOS (1); a dummy-prefix " " token when the text is not empty;
 * the text split into UTF-8 code points (at most 4 bytes each), each looked up as a token, falling
 * back to its raw bytes as ids byte + 3; then merge repeatedly the adjacent pair whose concatenation
 * is a token with the highest score (the leftmost on ties, and only scores above -1e10); optional
 * EOS (2).
 * Decoding (run.c decode()): the token's string; after BOS a leading space is dropped; "<0xXX>"
 * becomes the raw byte. run.c prints a piece only when it is not a lone non-printable byte
 * (safe_printf): ms_llama2c_tok_piece_printable says the same.
 *
 * Ownership: ms_llama2c_tok_* functions borrow their arguments; the tokenizer returned by init is
 * owned by the caller (ms_llama2c_tok_free, NULL accepted); pieces returned by decode live as long
 * as the tokenizer. Errors: one line "<path>: <problem>".
 *
 * Usage:
 *     ms_llama2c_tok *tok = NULL;
 *     MS_TRY(ms_llama2c_tok_init(&tok, "tok512.bin", 512, err));
 *     int32_t *ids; size_t n;
 *     MS_TRY(ms_llama2c_tok_encode(tok, "Once upon a time", true, false, &ids, &n, err));
 *     for (size_t i = 1; i < n; i++) fputs(ms_llama2c_tok_decode(tok, ids[i - 1], ids[i]), stdout);
 *     ms_free(ids);
 */
#ifndef MS_TOKENIZER_LLAMA2C_H
#define MS_TOKENIZER_LLAMA2C_H

#include "ms_base.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MS_LLAMA2C_TOK_BOS 1
#define MS_LLAMA2C_TOK_EOS 2

typedef struct ms_llama2c_tok ms_llama2c_tok;

/*
 * Load `path` with `vocab_size` tokens (the model's vocab size, as run.c does; 0 = as many as the
 * file holds). Errors: MS_ERR_IO (cannot open/read), MS_ERR_FORMAT (truncated at a named token,
 * a token longer than max_token_length or holding a NUL byte, extra bytes after vocab_size tokens,
 * insane max_token_length, no tokens), MS_ERR_INVALID_ARG (negative vocab_size), MS_ERR_OOM.
 */
ms_status ms_llama2c_tok_init(ms_llama2c_tok **out, const char *path, int vocab_size, ms_error *err);
/* Free. NULL accepted. */
void ms_llama2c_tok_free(ms_llama2c_tok *tok);

/* Number of tokens. */
int ms_llama2c_tok_vocab_size(const ms_llama2c_tok *tok);
/* The stored string of token id (NUL-terminated, borrowed), or NULL when id is out of range. */
const char *ms_llama2c_tok_piece(const ms_llama2c_tok *tok, int id);
/* The merge score of token id (0 when out of range). */
float ms_llama2c_tok_score(const ms_llama2c_tok *tok, int id);

/*
 * Encode NUL-terminated UTF-8 `text` into a fresh ms_malloc'd array *ids of *n ids (release with
 * ms_free). Errors: MS_ERR_FORMAT when a byte-fallback id (byte + 3) is outside the vocabulary or
 * the vocabulary has no " " token for the dummy prefix, MS_ERR_OOM.
 */
ms_status ms_llama2c_tok_encode(const ms_llama2c_tok *tok, const char *text, bool bos, bool eos, int32_t **ids,
                                size_t *n, ms_error *err);

/*
 * The text of `token` following `prev_token` (borrowed, NUL-terminated; a raw byte token gives a
 * one-byte string, which may be a fragment of a UTF-8 sequence). NULL when token is out of range.
 */
const char *ms_llama2c_tok_decode(const ms_llama2c_tok *tok, int prev_token, int token);

/* run.c's safe_printf filter: false for NULL, "" and a single byte that is neither printable nor
 * white space (C locale); true otherwise. */
bool ms_llama2c_tok_piece_printable(const char *piece);

#ifdef __cplusplus
}
#endif
#endif /* MS_TOKENIZER_LLAMA2C_H */
