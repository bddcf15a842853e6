/*
 * tokenizer_hf.h - Hugging Face `tokenizer.json` byte-level BPE: load, encode and decode exactly as
 * the `tokenizers` library (0.23) does for GPT-2-style tokenizers (Qwen2/Qwen3, Llama 3.x, ...).
 *
 * What is supported (anything else fails to load with MS_ERR_UNSUPPORTED naming the component):
 *   - model: BPE (vocab; merges as "a b" strings or ["a", "b"] pairs, rank = position; a later
 *     duplicate merge replaces an earlier one, as the library's map does; ignore_merges), without
 *     dropout, byte_fallback, continuing_subword_prefix or end_of_word_suffix; unk_token is never
 *     used (the vocabulary covers every byte);
 *   - added_tokens with their special / normalized / lstrip / rstrip / single_word flags;
 *   - normalizer: null, NFC, or a Sequence of those;
 *   - pre_tokenizer: ByteLevel, or a Sequence of Split (Regex or String pattern; behaviours Removed,
 *     Isolated, MergedWithPrevious, MergedWithNext, Contiguous; invert) ending in ByteLevel
 *     (add_prefix_space, use_regex). Regexes are compiled with PCRE2 (UTF + UCP), so \p{L} etc.
 *     have their Unicode meaning, as with the library's Oniguruma;
 *   - decoder: ByteLevel; post_processor: null, ByteLevel, TemplateProcessing (single; its special
 *     tokens' ids must be tokens of the vocabulary or added_tokens) or a Sequence of those (used
 *     only when add_special is true).
 *
 * Encoding follows the library step by step: added tokens are split out first (leftmost-longest
 * match; tokens with normalized=false on the raw text, then the rest is normalized and tokens with
 * normalized=true are split out of the normalized text; lstrip/rstrip absorb neighbouring Unicode
 * white space, single_word requires non-word characters around the match); each remaining piece
 * is pre-tokenized, every pre-token mapped through GPT-2's bytes_to_unicode and merged by rank
 * (priority queue over a linked list of symbols: O(n log n) per word; words shorter than 256 bytes
 * are cached). The vocabulary must hold the byte-level character of every byte UTF-8 text can hold
 * (all but 0xC0, 0xC1, 0xF5 .. 0xFF), as real byte-level vocabularies do; one lacking any fails to
 * load with MS_ERR_UNSUPPORTED naming the first missing byte (the library would drop such bytes
 * without unk_token, or emit unk / byte-fallback tokens, which are not supported). Input text must
 * be valid UTF-8 (the library only takes Rust strings): invalid input fails with
 * MS_ERR_INVALID_ARG naming the byte offset.
 *
 * Decoding maps every id to its token (added tokens first), skips special tokens on request and
 * unknown ids always (as the library does), turns byte-level characters back into bytes (a token
 * holding a character outside the byte alphabet contributes its UTF-8 as is) and converts the bytes
 * to UTF-8 like Rust's String::from_utf8_lossy: every maximal invalid subsequence (for instance the
 * first half of an emoji split across tokens, at the end of the ids) becomes one U+FFFD. A streaming
 * caller that wants to hold back incomplete characters uses ms_tok_hf_token_bytes instead.
 *
 * Known differences from the library (checked against tokenizers 0.23.2 on 40,000+ strings: every
 * code point below U+3100 and in U+FE00..U+FFFF in three contexts, plus random mixed text): Unicode
 * properties (\p{L}, \p{N}, \w) come from the system's PCRE2 (10.42: Unicode 14/15), the library's
 * Oniguruma knows Unicode 16, so characters assigned since (e.g. U+1C89) may pre-tokenize
 * differently; \s is rewritten to Unicode White_Space as Oniguruma has it (PCRE2's own \s also
 * matches U+180E), except \S inside a character class, which no supported tokenizer uses; an
 * added token that starts inside white space already absorbed by an rstrip token before it is not
 * matched (the library would emit overlapping pieces); NFC uses Unicode 14 tables.
 * tokenizer_config.json's clean_up_tokenization_spaces is a `transformers` decode option, not the
 * library's, and is not applied (the reference decodings do not apply it either).
 *
 * Thread safety: a loaded tokenizer is read-only except for its word cache, which a mutex guards;
 * encode and decode may run concurrently on one tokenizer.
 *
 * Ownership: ms_tok_hf_* functions borrow their arguments; the tokenizer returned by init is owned
 * by the caller (ms_tok_hf_free, NULL accepted); strings returned by accessors live as long as the
 * tokenizer; arrays returned by encode/decode are fresh ms_malloc blocks owned by the caller.
 * Errors: one line "<path>: <problem>".
 *
 * Usage:
 *     ms_tok_hf *tok = NULL;
 *     MS_TRY(ms_tok_hf_init(&tok, "qwen3/tokenizer.json", err));
 *     int32_t *ids; size_t n;
 *     MS_TRY(ms_tok_hf_encode(tok, text, strlen(text), false, &ids, &n, err));
 *     char *out; size_t len;
 *     MS_TRY(ms_tok_hf_decode(tok, ids, n, true, &out, &len, err));
 *     ms_free(ids); ms_free(out); ms_tok_hf_free(tok);
 */
#ifndef MS_TOKENIZER_HF_H
#define MS_TOKENIZER_HF_H

#include "ms_base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ms_tok_hf ms_tok_hf;

/*
 * Load the tokenizer.json at `path` and, when present, tokenizer_config.json from the same folder
 * (bos/eos tokens and the chat template; a missing file is not an error, a malformed one is).
 * Errors: MS_ERR_NOT_FOUND / MS_ERR_IO (cannot open or read), MS_ERR_PARSE (malformed or truncated
 * JSON, with line and column), MS_ERR_FORMAT (a field of the wrong type, a merge naming a token that
 * is not in the vocabulary, an id out of range, ...), MS_ERR_UNSUPPORTED (a model, normalizer,
 * pre-tokenizer, decoder or post-processor type or option not listed in the file comment, named),
 * MS_ERR_OOM. On failure *out is NULL and nothing is leaked.
 */
ms_status ms_tok_hf_init(ms_tok_hf **out, const char *path, ms_error *err);
/* Free. NULL accepted. */
void ms_tok_hf_free(ms_tok_hf *tok);

/*
 * Encode `len` bytes of UTF-8 `text` (need not be NUL-terminated; NUL bytes are ordinary
 * characters) into a fresh ms_malloc'd array *ids of *n ids (release with ms_free; an empty
 * result gives *ids = NULL, *n = 0). add_special applies the post-processor (e.g. Llama 3's
 * <|begin_of_text|>), as the library's add_special_tokens. Errors: MS_ERR_INVALID_ARG (text is not
 * valid UTF-8, offset named), MS_ERR_INTERNAL (a PCRE2 matching error, e.g. its match limit), MS_ERR_OOM.
 */
ms_status ms_tok_hf_encode(const ms_tok_hf *tok, const char *text, size_t len, bool add_special, int32_t **ids,
                           size_t *n, ms_error *err);

/*
 * Decode `n` ids into fresh ms_malloc'd NUL-terminated UTF-8 *text of *len bytes (release with
 * ms_free). skip_special drops added tokens flagged special. Ids that name no token are skipped.
 * Invalid UTF-8 in the token bytes becomes U+FFFD (see the file comment). Errors: MS_ERR_OOM.
 */
ms_status ms_tok_hf_decode(const ms_tok_hf *tok, const int32_t *ids, size_t n, bool skip_special, char **text,
                           size_t *len, ms_error *err);

/*
 * Id of the token spelled `token` (NUL-terminated): an added token's content first, then the
 * vocabulary's stored (byte-level) spelling, e.g. "<|endoftext|>" or "Ġthe". -1 when none.
 */
int32_t ms_tok_hf_token_id(const ms_tok_hf *tok, const char *token);
/* The stored spelling of `id` (borrowed), NULL when no token has that id. */
const char *ms_tok_hf_token_str(const ms_tok_hf *tok, int32_t id);
/*
 * The raw bytes `id` decodes to (borrowed, *len bytes, not NUL-terminated, possibly a fragment of
 * a UTF-8 sequence), for streaming output. NULL (and *len = 0) when no token has that id.
 */
const char *ms_tok_hf_token_bytes(const ms_tok_hf *tok, int32_t id, size_t *len);
/* Whether `id` is an added token flagged special (false for unknown ids). */
bool ms_tok_hf_is_special(const ms_tok_hf *tok, int32_t id);
/*
 * Drop every cached word (the cache holds at most 10000 words shorter than 256 bytes and is
 * released by ms_tok_hf_free; this returns its memory earlier, e.g. for a leak-checked test).
 * Must not run concurrently with encode on the same tokenizer. NULL accepted.
 */
void ms_tok_hf_clear_cache(ms_tok_hf *tok);
/* Highest token id + 1, over the vocabulary and the added tokens. */
int32_t ms_tok_hf_vocab_size(const ms_tok_hf *tok);

/* tokenizer_config.json's bos_token / eos_token as a string (borrowed), NULL when unset. */
const char *ms_tok_hf_bos_token(const ms_tok_hf *tok);
const char *ms_tok_hf_eos_token(const ms_tok_hf *tok);
/* Their ids, -1 when unset (or when the named token does not exist). */
int32_t ms_tok_hf_bos_id(const ms_tok_hf *tok);
int32_t ms_tok_hf_eos_id(const ms_tok_hf *tok);
/*
 * tokenizer_config.json's chat_template (borrowed Jinja source; for a list of named templates,
 * the one named "default"), NULL when there is none.
 */
const char *ms_tok_hf_chat_template(const ms_tok_hf *tok);

/*
 * Unicode NFC (canonical decomposition, canonical ordering, canonical composition; Unicode 14
 * tables) of `len` bytes of valid UTF-8 `text` into a fresh ms_malloc'd NUL-terminated *out of
 * *out_len bytes. Errors: MS_ERR_INVALID_ARG (invalid UTF-8), MS_ERR_OOM.
 */
ms_status ms_tok_hf_nfc(const char *text, size_t len, char **out, size_t *out_len, ms_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MS_TOKENIZER_HF_H */
