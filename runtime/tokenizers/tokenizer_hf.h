/*
 * tokenizer_hf.h - Hugging Face `tokenizer.json` byte-level BPE: load, encode and decode exactly as
 * the `tokenizers` library (0.23) does for GPT-2-style tokenizers (Qwen2/Qwen3, Llama 3.x, ...),
 * SentencePiece-style byte_fallback BPE files (Llama 2, Mistral), and the same tokenizer built from
 * vocabulary arrays as GGUF metadata carries them (ms_tok_hf_from_vocab: llama.cpp's gpt2 and
 * llama / SentencePiece tokenizers).
 *
 * What is supported (anything else fails to load with MS_ERR_UNSUPPORTED naming the component):
 *   - model: BPE (vocab; merges as "a b" strings or ["a", "b"] pairs, rank = position; a later
 *     duplicate merge replaces an earlier one, as the library's map does; ignore_merges), without
 *     dropout, continuing_subword_prefix or end_of_word_suffix; unk_token is never used (the
 *     vocabulary covers every byte);
 *   - byte_fallback BPE, the SentencePiece-style files of Llama 2 / Mistral: symbols are UTF-8
 *     characters, a character without a token becomes its bytes' <0xNN> tokens (all 256 must
 *     exist), spaces become U+2581 through either the legacy normalizer Sequence [Prepend(U+2581),
 *     Replace(" ", U+2581)] (prefix on every piece between added tokens) or a Metaspace
 *     pre_tokenizer (prepend_scheme first / always / never, legacy add_prefix_space, split; the
 *     prefix only where the piece does not start with a space already, as the library does), and
 *     the decoder is a Sequence of Replace(U+2581, " "), ByteFallback, Fuse, Strip(" ", 1, 0) or
 *     Metaspace (+ ByteFallback); a leading space is dropped on decode when Strip / Metaspace says
 *     so. Invalid UTF-8 from byte tokens becomes one U+FFFD per maximal invalid sequence (the
 *     library's ByteFallback writes one per byte token);
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
 * Token types of a vocabulary array: GGUF's tokenizer.ggml.token_type values, which are
 * llama.cpp's llama_token_type (llama.h) and SentencePiece's ModelProto.SentencePiece.Type + 1.
 */
typedef enum ms_tok_type {
    MS_TOK_TYPE_UNDEFINED = 0,     /* treated as NORMAL */
    MS_TOK_TYPE_NORMAL = 1,
    MS_TOK_TYPE_UNKNOWN = 2,       /* <unk>: matched in text and skipped by decode(skip_special), like CONTROL */
    MS_TOK_TYPE_CONTROL = 3,       /* special added token: split out of text, skipped by decode(skip_special) */
    MS_TOK_TYPE_USER_DEFINED = 4,  /* non-special added token: split out of text, always decoded */
    MS_TOK_TYPE_UNUSED = 5,
    MS_TOK_TYPE_BYTE = 6           /* SentencePiece byte fallback token <0xNN> */
} ms_tok_type;

/*
 * A tokenizer given as vocabulary arrays, the form GGUF metadata carries (keys tokenizer.ggml.*;
 * the names below follow them). Everything is borrowed for the duration of ms_tok_hf_from_vocab
 * only (the tokenizer copies what it keeps).
 *
 * model "gpt2": byte-level BPE. `tokens` are byte-level spellings (GPT-2's bytes_to_unicode, as in
 *   tokenizer.json), `merges` "a b" strings (rank = index; split at the first space after the
 *   first byte, as llama.cpp does), `pre` selects the pre-tokenizer regexes of llama.cpp's
 *   llm_tokenizer_bpe (src/llama-vocab.cpp): "default" (also NULL), "gpt2", "smollm", "llama-bpe"
 *   (Llama 3; also sets ignore_merges, as llama.cpp does), "qwen2"; each regex splits the pieces of
 *   the previous one, keeping matches and the text between them (llama.cpp's unicode_regex_split).
 *   `scores` are not used (NULL accepted).
 * model "llama": SentencePiece BPE as llama.cpp's llm_tokenizer_spm: spaces become U+2581, U+2581
 *   is prepended to the text and to the text after every special token when add_space_prefix
 *   (add_dummy_prefix), the symbols (UTF-8 characters) are merged pairwise by the highest `scores`
 *   of the merged token (ties: leftmost), and a character without a token becomes its bytes'
 *   <0xNN> tokens (BYTE type), or unk_id when a byte has none. `scores` is required, `merges` is not
 *   used (llama.cpp ignores it for this model too). Decoding turns U+2581 into spaces, byte tokens
 *   into their bytes and drops one leading space when add_space_prefix.
 *
 * Tokens of type CONTROL, UNKNOWN and USER_DEFINED are added tokens (split out of the text before
 * anything else, as llama.cpp's tokenizer_st_partition with parse_special; here leftmost-longest,
 * where llama.cpp takes the longest token first over the whole text: the two differ only for
 * overlapping special tokens). add_bos / add_eos put bos_id / eos_id around
 * ms_tok_hf_encode(add_special = true).
 *
 * The caller applies llama.cpp's defaults (llama_vocab::load) for keys a file lacks: add_bos_token
 * true for llama and for gpt2 with pre llama-bpe, false for other gpt2; add_eos_token false;
 * add_space_prefix true (llama). A gpt2 vocabulary may lack some bytes (SmolLM2's lacks 8 control
 * bytes): text holding one fails to encode naming the byte, where llama.cpp would drop it.
 * Not applied: the per-model lstrip / rstrip attributes llama.cpp gives a few special tokens
 * (e.g. Phi-3's <|end|>), and its clean_spaces decode option.
 */
typedef struct ms_tok_vocab {
    const char *source;            /* names the origin in errors, e.g. the GGUF path; NULL: "vocab" */
    const char *model;             /* tokenizer.ggml.model: "gpt2" or "llama" */
    const char *pre;               /* tokenizer.ggml.pre (gpt2 only), NULL = "default" */
    const char *const *tokens;     /* [n_tokens] tokenizer.ggml.tokens; id = index */
    const size_t *token_lens;      /* [n_tokens] byte lengths, or NULL for NUL-terminated tokens */
    size_t n_tokens;               /* 1 .. 16777216 */
    const float *scores;           /* [n_tokens] tokenizer.ggml.scores (llama: required) or NULL */
    const int32_t *token_types;    /* [n_tokens] tokenizer.ggml.token_type (ms_tok_type) or NULL = all NORMAL */
    const char *const *merges;     /* [n_merges] tokenizer.ggml.merges, "a b" (gpt2) */
    const size_t *merge_lens;      /* [n_merges] byte lengths, or NULL for NUL-terminated merges */
    size_t n_merges;
    int32_t bos_id;                /* tokenizer.ggml.bos_token_id, -1 when absent */
    int32_t eos_id;                /* tokenizer.ggml.eos_token_id, -1 when absent */
    int32_t eot_id;                /* tokenizer.ggml.eot_token_id, -1 when absent (also ends a chat turn) */
    int32_t unk_id;                /* tokenizer.ggml.unknown_token_id, -1 when absent (llama: stands for a
                                      byte without a <0xNN> token; gpt2: checked, not used) */
    int32_t pad_id;                /* tokenizer.ggml.padding_token_id, -1 when absent (checked, not used) */
    bool add_bos;                  /* tokenizer.ggml.add_bos_token */
    bool add_eos;                  /* tokenizer.ggml.add_eos_token */
    bool add_space_prefix;         /* tokenizer.ggml.add_space_prefix (llama only; llama.cpp's default: true) */
    const char *chat_template;     /* tokenizer.chat_template, NULL when absent */
} ms_tok_vocab;

/*
 * ms_tok_vocab with every id -1, add_space_prefix true and the rest zero: fill in what the source
 * has.
 */
ms_tok_vocab ms_tok_vocab_default(void);

/*
 * Build a tokenizer from vocabulary arrays (see ms_tok_vocab); the result is the same type as
 * ms_tok_hf_init's, so encode, decode, the accessors and chat templates work unchanged.
 * Errors (one line naming v->source and the array and index): MS_ERR_UNSUPPORTED (a model or pre
 * type not listed above), MS_ERR_FORMAT (a count out of range, a token that is not valid UTF-8 or
 * holds a NUL byte, a token type out of range, a NaN score, a merge that is not "a b" or names a
 * token that is not in the vocabulary, an id out of range, a byte-level vocabulary lacking a byte,
 * a llama vocabulary with neither byte tokens nor unk_id, ...), MS_ERR_OOM. On failure *out is
 * NULL and nothing is leaked.
 */
ms_status ms_tok_hf_from_vocab(ms_tok_hf **out, const ms_tok_vocab *v, ms_error *err);

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
/*
 * Whether `id` ends a generation turn: the eos id, the eot id (a vocabulary's eot_id) or a special
 * token spelled like the end-of-turn tokens llama.cpp recognises (llama-vocab.cpp's special_eog_ids:
 * <|eot_id|>, <|im_end|>, <|end|>, <end_of_turn>, <|endoftext|>, <|eom_id|>, <EOT>,
 * <|end_of_text|>). False for unknown ids.
 */
bool ms_tok_hf_is_eog(const ms_tok_hf *tok, int32_t id);
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
