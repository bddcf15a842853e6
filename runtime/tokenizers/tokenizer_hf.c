/*
 * tokenizer_hf.c - Hugging Face tokenizer.json byte-level BPE: strict loading, library-exact
 * encode and decode.
 *
 * Constraints: the ids and text must equal what the `tokenizers` library (0.23) gives (the
 * reference encodings in ../shared/fixtures/tokenizers are checked against them), so each stage
 * follows the library's code: AddedVocabulary::find_matches for added tokens, the Split
 * pre-tokenizer's find_matches + SplitDelimiterBehavior, ByteLevel, and BPE's Word::merge_all
 * (a min-heap on (rank, position); a stale entry is skipped only when the pair no longer yields the
 * same new id, exactly as the library checks). Every host allocation, PCRE2's included, goes
 * through ms_malloc (jansson's tree, freed before init returns, does not). Bad files fail with one
 * line naming the file and the problem; nothing in a file can make encode or decode read out of
 * bounds.
 */
#include "tokenizer_hf.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <errno.h>
#include <jansson.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Ids above this are rejected at load (no real vocabulary comes close; keeps tables bounded). */
#define TOK_MAX_ID (1 << 24)
/* Words (pre-tokens) shorter than this many bytes are cached, as the library does (MAX_LENGTH). */
#define TOK_CACHE_MAX_WORD 256
/* Cache slots (power of two) and the entry count after which nothing more is cached (the
 * library's default capacity is 10000 words). */
#define TOK_CACHE_SLOTS 16384
#define TOK_CACHE_MAX_ENTRIES 10000

/* GPT-2's pre-tokenizer regex, used by ByteLevel when use_regex is true. */
static const char tok_gpt2_regex[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* ---- types ---- */

/* One vocabulary entry of the string -> id map (open addressing; s == NULL marks a free slot). */
typedef struct tok_str_slot {
    const char *s;  /* byte-level spelling (into str_blob) */
    uint32_t len;   /* its bytes */
    int32_t id;
} tok_str_slot;

/* One merge: pair (a, b) -> (rank, new id). key == UINT64_MAX marks a free slot. */
typedef struct tok_merge_slot {
    uint64_t key;    /* (uint64_t)a << 32 | b */
    int32_t rank;    /* position in the merges list (lower merges first) */
    int32_t new_id;  /* id of the concatenation */
} tok_merge_slot;

/* An added token from "added_tokens". */
typedef struct tok_added {
    char *content;     /* as in the file (ms_malloc'd, NUL-terminated) */
    char *pattern;     /* what is matched: content, or NFC(content) for normalized tokens under NFC */
    size_t pattern_len;
    int32_t id;
    bool special;      /* skipped by decode(skip_special) */
    bool normalized;   /* matched in the normalized text (else in the raw text) */
    bool lstrip;       /* absorbs white space on its left */
    bool rstrip;       /* absorbs white space on its right */
    bool single_word;  /* matches only between non-word characters */
} tok_added;

/* Added tokens matched in one pass: indices into added[], sorted by (first byte, length desc,
 * file order), with first[b] .. first[b + 1] the range starting with byte b. */
typedef struct tok_match_set {
    int32_t *order;        /* [n] */
    size_t n;
    uint32_t first[257];   /* CSR offsets into order by first pattern byte */
} tok_match_set;

typedef enum tok_split_behavior {
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_ISOLATED,
    TOK_SPLIT_MERGED_WITH_PREVIOUS,
    TOK_SPLIT_MERGED_WITH_NEXT,
    TOK_SPLIT_CONTIGUOUS
} tok_split_behavior;

/* When a SentencePiece-style model prepends U+2581 to a piece of text (between added tokens). */
typedef enum tok_prefix {
    TOK_PREFIX_NEVER,
    TOK_PREFIX_FIRST,   /* the piece at the start of the text only (Metaspace prepend_scheme "first") */
    TOK_PREFIX_ALWAYS   /* every piece (add_dummy_prefix; Prepend normalizer; prepend_scheme "always") */
} tok_prefix;

/* One pre-tokenizer step: a Split, or the final ByteLevel. */
typedef struct tok_pretok {
    bool byte_level;              /* ByteLevel (else Split) */
    pcre2_code *re;               /* Split pattern, or GPT-2's regex for ByteLevel use_regex (else NULL) */
    tok_split_behavior behavior;  /* Split only */
    bool invert;                  /* Split only */
    bool add_prefix_space;        /* ByteLevel only */
} tok_pretok;

/* A cached word: its bytes and ids, in one block. */
typedef struct tok_cache_entry {
    uint64_t hash;
    uint32_t len;       /* word bytes */
    uint32_t n_ids;
    int32_t *ids;       /* [n_ids], inside this block */
    char *word;         /* [len], inside this block */
} tok_cache_entry;

struct ms_tok_hf {
    char *path;                    /* tokenizer.json as given */
    int32_t n_ids;                 /* highest id + 1 */
    const char **id_str;           /* [n_ids] spelling of each id (added token first), NULL for gaps */
    uint32_t *dec_off;             /* [n_ids] decoded bytes of each id: dec_blob[dec_off .. + dec_len] */
    uint32_t *dec_len;             /* [n_ids] */
    char *dec_blob;
    uint8_t *special;              /* [n_ids] 1 for special added tokens */
    char *str_blob;                /* vocabulary spellings, NUL-terminated, back to back */
    tok_str_slot *vocab;           /* [vocab_cap] string -> id */
    size_t vocab_cap;              /* power of two */
    tok_merge_slot *merges;        /* [merge_cap] pair -> (rank, new id) */
    size_t merge_cap;              /* power of two */
    int32_t byte_id[256];          /* id of the byte-level character of each byte, -1 when none */
    char byte_utf8[256][2];        /* that character in UTF-8 ... */
    uint8_t byte_utf8_len[256];    /* ... of 1 or 2 bytes */
    bool ignore_merges;            /* a pre-token that is itself in the vocabulary is one token */
    tok_added *added;              /* [n_added] */
    size_t n_added;
    tok_match_set raw_set;         /* added tokens with normalized = false */
    tok_match_set norm_set;        /* added tokens with normalized = true */
    bool nfc;                      /* normalizer: NFC (else none) */
    tok_pretok *pretok;            /* [n_pretok], ByteLevel last */
    size_t n_pretok;
    pcre2_code *word_re;           /* "\w" for single_word checks */
    pcre2_general_context *gctx;   /* PCRE2 allocations through ms_malloc */
    int32_t *tmpl_pre;             /* [n_tmpl_pre] ids before the sequence when add_special */
    size_t n_tmpl_pre;
    int32_t *tmpl_post;            /* [n_tmpl_post] ids after it */
    size_t n_tmpl_post;
    char *bos_token;               /* tokenizer_config.json, NULL when unset */
    char *eos_token;
    char *chat_template;
    int32_t bos_id;                /* -1 when unset */
    int32_t eos_id;
    pthread_mutex_t cache_mu;      /* guards cache and n_cache */
    bool cache_mu_ok;              /* cache_mu initialized */
    tok_cache_entry **cache;       /* [TOK_CACHE_SLOTS] */
    size_t n_cache;
    /* SentencePiece-style models (GGUF "llama", tokenizer.json BPE with byte_fallback): */
    bool spm;                      /* symbols are UTF-8 characters; ' ' is U+2581; byte fallback */
    tok_prefix prefix;             /* when U+2581 is prepended to a piece of text */
    bool prefix_if_missing;        /* ... only when the piece does not start with it already (Metaspace) */
    bool metaspace_split;          /* Metaspace split: a new word starts at every U+2581 */
    bool strip_space;              /* decode drops one leading space */
    int32_t byte_tok[256];         /* id of <0xNN>, -1 when none */
    int32_t unk_id;                /* -1 when none */
    int32_t eot_id;                /* -1 when none */
    bool bytes_may_miss;           /* vocabulary arrays: a byte without a token fails encode, not load */
};

/* ---- small helpers ---- */

static uint64_t tok_hash(const char *s, size_t len) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ull;
    }
    return h;
}

static uint64_t tok_mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

static size_t tok_pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

/* Length of the UTF-8 sequence led by byte c (valid text assumed; 1 for stray bytes). */
static size_t tok_utf8_len(unsigned char c) {
    return c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

/* Decode the code point at s[i] of valid UTF-8 (len bytes in all). */
static uint32_t tok_utf8_at(const char *str, size_t i) {
    const unsigned char *s = (const unsigned char *)str + i;
    if (s[0] < 0x80)
        return s[0];
    if (s[0] < 0xE0)
        return ((s[0] & 0x1Fu) << 6) | (s[1] & 0x3Fu);
    if (s[0] < 0xF0)
        return ((s[0] & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
    return ((s[0] & 0x07u) << 18) | ((s[1] & 0x3Fu) << 12) | ((s[2] & 0x3Fu) << 6) | (s[3] & 0x3Fu);
}

/* Start of the code point ending just before s[i] (i > 0). */
static size_t tok_utf8_prev(const char *s, size_t i) {
    do {
        i--;
    } while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80);
    return i;
}

static size_t tok_utf8_put(char *out, uint32_t c) {
    unsigned char *o = (unsigned char *)out;
    if (c < 0x80) {
        o[0] = (unsigned char)c;
        return 1;
    }
    if (c < 0x800) {
        o[0] = (unsigned char)(0xC0 | (c >> 6));
        o[1] = (unsigned char)(0x80 | (c & 0x3F));
        return 2;
    }
    o[0] = (unsigned char)(0xE0 | (c >> 12));
    o[1] = (unsigned char)(0x80 | ((c >> 6) & 0x3F));
    o[2] = (unsigned char)(0x80 | (c & 0x3F));
    return 3;
}

/*
 * Length of the valid UTF-8 sequence at s[i] (1 .. 4), or 0 when invalid; *bad is then the length
 * of the maximal subpart (the bytes one U+FFFD replaces, as Rust's from_utf8_lossy counts them).
 */
static size_t tok_utf8_check(const unsigned char *s, size_t len, size_t i, size_t *bad) {
    unsigned c = s[i];
    if (c < 0x80)
        return 1;
    size_t n;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 2;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 3;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else {
        *bad = 1;
        return 0;
    }
    size_t k = 1;
    for (; k <= n; k++) {
        if (i + k >= len)
            break;
        unsigned b = s[i + k];
        if (k == 1 ? (b < lo || b > hi) : (b & 0xC0) != 0x80)
            break;
    }
    if (k > n)
        return n + 1;
    *bad = k;
    return 0;
}

/* Rust char::is_whitespace (Unicode White_Space). */
static bool tok_is_space(uint32_t c) {
    return (c >= 0x9 && c <= 0xD) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

/* GPT-2 bytes_to_unicode: the printable bytes map to themselves, the other 68 to U+0100 onwards. */
static uint32_t tok_byte_char(unsigned b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
        return b;
    uint32_t n = 0;
    for (unsigned x = 0; x < b; x++)
        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255)))
            n++;
    return 256 + n;
}


/* ---- PCRE2 through ms_malloc ---- */

static void *tok_pcre2_malloc(PCRE2_SIZE size, void *user) {
    (void)user;
    return ms_malloc(size);
}

static void tok_pcre2_free(void *ptr, void *user) {
    (void)user;
    ms_free(ptr);
}

/* Unicode White_Space, the meaning of \s in the library's Oniguruma, as class members. */
static const char tok_ws_class[] =
    "\\x{09}-\\x{0D}\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

/*
 * Rewrite \s and \S of an Oniguruma pattern into explicit White_Space classes: with UCP, PCRE2's \s
 * also matches U+180E (it includes \h), which Oniguruma's does not. \S inside a class is left
 * alone (no real tokenizer uses it). Returns a fresh NUL-terminated pattern or NULL (out of memory).
 */
static char *tok_rewrite_spaces(const char *pat, size_t len, size_t *out_len) {
    size_t ws = strlen(tok_ws_class);
    size_t n_esc = 0;
    for (size_t i = 0; i + 1 < len; i++)
        n_esc += pat[i] == '\\';
    char *out = ms_malloc(len + n_esc * (ws + 3) + 1);
    if (out == NULL)
        return NULL;
    size_t o = 0;
    bool in_class = false;
    for (size_t i = 0; i < len; i++) {
        char c = pat[i];
        if (c == '\\' && i + 1 < len) {
            char x = pat[i + 1];
            if (x == 's' || (x == 'S' && !in_class)) {
                if (!in_class)
                    out[o++] = '[';
                if (x == 'S')
                    out[o++] = '^';
                memcpy(out + o, tok_ws_class, ws);
                o += ws;
                if (!in_class)
                    out[o++] = ']';
            } else {
                out[o++] = c;
                out[o++] = x;
            }
            i++;
            continue;
        }
        out[o++] = c;
        if (!in_class && c == '[') {
            in_class = true;
            if (i + 1 < len && pat[i + 1] == '^')
                out[o++] = pat[++i];
            if (i + 1 < len && pat[i + 1] == ']')  /* a leading ']' is a member */
                out[o++] = pat[++i];
        } else if (in_class && c == '[' && i + 1 < len && pat[i + 1] == ':') {
            const char *end = strstr(pat + i, ":]");  /* POSIX class [:name:] */
            if (end != NULL && (size_t)(end - pat) + 2 <= len) {
                size_t k = (size_t)(end - pat) + 2 - (i + 1);
                memcpy(out + o, pat + i + 1, k);
                o += k;
                i += k;
            }
        } else if (in_class && c == ']') {
            in_class = false;
        }
    }
    out[o] = '\0';
    *out_len = o;
    return out;
}

/* Compile `pattern` (UTF + UCP, \s as White_Space; literal when `literal`). `what` names it in
 * errors. */
static ms_status tok_compile(ms_tok_hf *tok, const char *pattern, size_t len, bool literal, const char *what,
                             pcre2_code **out, ms_error *err) {
    *out = NULL;
    pcre2_compile_context *cctx = pcre2_compile_context_create(tok->gctx);
    if (cctx == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory compiling the %s regex", tok->path, what);
    int ecode = 0;
    PCRE2_SIZE eoff = 0;
    uint32_t flags = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);  /* LITERAL refuses UCP */
    char *rewritten = NULL;
    if (!literal) {
        if (len == PCRE2_ZERO_TERMINATED)
            len = strlen(pattern);
        rewritten = tok_rewrite_spaces(pattern, len, &len);
        if (rewritten == NULL) {
            pcre2_compile_context_free(cctx);
            return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory compiling the %s regex", tok->path, what);
        }
    }
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(literal ? pattern : rewritten), len, flags, &ecode, &eoff, cctx);
    pcre2_compile_context_free(cctx);
    ms_free(rewritten);
    if (re == NULL) {
        PCRE2_UCHAR msg[256];
        if (pcre2_get_error_message(ecode, msg, sizeof msg) < 0)
            snprintf((char *)msg, sizeof msg, "error %d", ecode);
        /* PCRE2 reports running out of memory during compilation as error 121 ("failed to get
         * memory"). */
        if (ecode == 121)
            return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory compiling the %s regex", tok->path, what);
        /* (the offset is into the pattern with \s expanded, so it is only a hint) */
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: %s regex does not compile with PCRE2 (near offset %zu): %s",
                       tok->path, what, (size_t)eoff, (const char *)msg);
    }
    /* JIT speeds matching up; without it (no JIT support, or no memory) matching still works. */
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);
    *out = re;
    return MS_OK;
}

/* ---- vocabulary and merge maps ---- */

static int32_t tok_vocab_get(const ms_tok_hf *tok, const char *s, size_t len) {
    size_t mask = tok->vocab_cap - 1;
    for (size_t i = tok_hash(s, len) & mask;; i = (i + 1) & mask) {
        const tok_str_slot *e = &tok->vocab[i];
        if (e->s == NULL)
            return -1;
        if (e->len == len && memcmp(e->s, s, len) == 0)
            return e->id;
    }
}

static void tok_vocab_put(ms_tok_hf *tok, const char *s, size_t len, int32_t id) {
    size_t mask = tok->vocab_cap - 1;
    for (size_t i = tok_hash(s, len) & mask;; i = (i + 1) & mask) {
        tok_str_slot *e = &tok->vocab[i];
        if (e->s == NULL) {
            e->s = s;
            e->len = (uint32_t)len;
            e->id = id;
            return;
        }
        MS_ASSERT(!(e->len == len && memcmp(e->s, s, len) == 0));  /* jansson rejected duplicate keys */
    }
}

static const tok_merge_slot *tok_merge_get(const ms_tok_hf *tok, int32_t a, int32_t b) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t mask = tok->merge_cap - 1;
    for (size_t i = tok_mix(key) & mask;; i = (i + 1) & mask) {
        const tok_merge_slot *e = &tok->merges[i];
        if (e->key == key)
            return e;
        if (e->key == UINT64_MAX)
            return NULL;
    }
}

/* Insert or replace (a later duplicate merge wins, like the library's HashMap::from_iter). */
static void tok_merge_put(ms_tok_hf *tok, int32_t a, int32_t b, int32_t rank, int32_t new_id) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t mask = tok->merge_cap - 1;
    for (size_t i = tok_mix(key) & mask;; i = (i + 1) & mask) {
        tok_merge_slot *e = &tok->merges[i];
        if (e->key == key || e->key == UINT64_MAX) {
            e->key = key;
            e->rank = rank;
            e->new_id = new_id;
            return;
        }
    }
}

/* ---- loading: JSON helpers ---- */

/* Read the whole file into a fresh NUL-terminated buffer. */
static ms_status tok_read_file(const char *path, char **data, size_t *size, ms_error *err) {
    *data = NULL;
    *size = 0;
    FILE *fp = fopen(path, "rb");
    if (fp == NULL)
        return MS_FAIL(err, errno == ENOENT ? MS_ERR_NOT_FOUND : MS_ERR_IO, "%s: cannot open: %s", path,
                       strerror(errno));
    ms_status st = MS_OK;
    struct stat sb;
    if (fstat(fileno(fp), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = MS_FAIL(err, MS_ERR_IO, "%s: cannot read: not a regular file", path);
        goto done;
    }
    size_t len = (size_t)sb.st_size;
    char *buf = ms_malloc(len + 1);
    if (buf == NULL) {
        st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory (%zu bytes)", path, len + 1);
        goto done;
    }
    if (fread(buf, 1, len, fp) != len) {
        st = MS_FAIL(err, MS_ERR_IO, "%s: cannot read: %s", path, ferror(fp) ? strerror(errno) : "file shrank");
        ms_free(buf);
        goto done;
    }
    buf[len] = '\0';
    *data = buf;
    *size = len;
done:
    fclose(fp);
    return st;
}

/* Parse `path` as a JSON object. */
static ms_status tok_load_json(const char *path, size_t flags, json_t **out, ms_error *err) {
    *out = NULL;
    char *text = NULL;
    size_t len = 0;
    MS_TRY(tok_read_file(path, &text, &len, err));
    json_error_t jerr;
    json_t *root = json_loadb(text, len, flags, &jerr);
    ms_free(text);
    if (root == NULL)
        return MS_FAIL(err, MS_ERR_PARSE, "%s:%d:%d: malformed JSON: %s", path, jerr.line, jerr.column, jerr.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: top level is not a JSON object", path);
    }
    *out = root;
    return MS_OK;
}

/* Optional boolean field: absent or null gives `def`. */
static ms_status tok_get_bool(const ms_tok_hf *tok, const json_t *obj, const char *key, const char *where, bool def,
                              bool *out, ms_error *err) {
    const json_t *v = json_object_get(obj, key);
    if (v == NULL || json_is_null(v)) {
        *out = def;
        return MS_OK;
    }
    if (!json_is_boolean(v))
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: %s.%s is not a boolean", tok->path, where, key);
    *out = json_is_true(v);
    return MS_OK;
}

/* Type name of a component object ("type" field), or NULL. */
static const char *tok_type_of(const json_t *obj) {
    return json_is_object(obj) ? json_string_value(json_object_get(obj, "type")) : NULL;
}

/* An id field: integer in 0 .. TOK_MAX_ID. */
static ms_status tok_get_id(const ms_tok_hf *tok, const json_t *v, const char *what, int32_t *out, ms_error *err) {
    if (!json_is_integer(v))
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: %s: id is not an integer", tok->path, what);
    json_int_t id = json_integer_value(v);
    if (id < 0 || id >= TOK_MAX_ID)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: %s: id %lld is outside 0 .. %d", tok->path, what, (long long)id,
                       TOK_MAX_ID - 1);
    *out = (int32_t)id;
    return MS_OK;
}

/* ---- loading: model ---- */

/* model: BPE vocab + merges. Sets n_ids to the vocabulary's max id + 1. */
static ms_status tok_load_model(ms_tok_hf *tok, const json_t *model, ms_error *err) {
    if (!json_is_object(model))
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: \"model\" is missing or not an object", tok->path);
    const char *type = tok_type_of(model);
    if (type != NULL && strcmp(type, "BPE") != 0)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: model type \"%s\" is not supported (only BPE)", tok->path,
                       type);
    const json_t *dropout = json_object_get(model, "dropout");
    if (dropout != NULL && !json_is_null(dropout) && !(json_is_number(dropout) && json_number_value(dropout) == 0))
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: model.dropout is not supported", tok->path);
    bool byte_fallback = false;
    MS_TRY(tok_get_bool(tok, model, "byte_fallback", "model", false, &byte_fallback, err));
    /* byte_fallback: the SentencePiece-style BPE of Llama 2 / Mistral tokenizer.json files (symbols are
     * characters, a character without a token becomes <0xNN> tokens). Load requires all 256 byte
     * tokens, so model.unk_token is never needed (the library would only use it for a missing one). */
    tok->spm = byte_fallback;
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < MS_ARRAY_LEN(affixes); i++) {
        const json_t *v = json_object_get(model, affixes[i]);
        if (v != NULL && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0))
            return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: model.%s is not supported", tok->path, affixes[i]);
    }
    MS_TRY(tok_get_bool(tok, model, "ignore_merges", "model", false, &tok->ignore_merges, err));

    const json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab))
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: model.vocab is missing or not an object", tok->path);
    size_t n_vocab = json_object_size(vocab);
    size_t blob = 0;
    int32_t max_id = -1;
    const char *key;  /* (json_object_foreach names) */
    const json_t *val;
    json_object_foreach((json_t *)vocab, key, val) {
        json_int_t id = json_is_integer(val) ? json_integer_value(val) : -1;
        if (id < 0 || id >= TOK_MAX_ID)
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: model.vocab[\"%.60s\"] is not an id in 0 .. %d", tok->path, key,
                           TOK_MAX_ID - 1);
        max_id = MS_MAX(max_id, (int32_t)id);
        blob += strlen(key) + 1;
    }
    tok->n_ids = max_id + 1;
    tok->str_blob = ms_malloc(blob + 1);
    tok->vocab_cap = tok_pow2_at_least(2 * n_vocab + 1);
    tok->vocab = ms_calloc(tok->vocab_cap, sizeof *tok->vocab);
    if (tok->str_blob == NULL || tok->vocab == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory for %zu vocabulary entries", tok->path, n_vocab);
    size_t pos = 0;
    json_object_foreach((json_t *)vocab, key, val) {
        size_t len = strlen(key);
        char *s = tok->str_blob + pos;
        memcpy(s, key, len + 1);
        pos += len + 1;
        tok_vocab_put(tok, s, len, (int32_t)json_integer_value(val));
    }

    const json_t *merges = json_object_get(model, "merges");
    if (merges == NULL || json_is_null(merges))
        merges = NULL;
    else if (!json_is_array(merges))
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: model.merges is not an array", tok->path);
    size_t n_merges = merges != NULL ? json_array_size(merges) : 0;
    if (n_merges > INT32_MAX)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: model.merges has too many entries", tok->path);
    tok->merge_cap = tok_pow2_at_least(2 * n_merges + 1);
    tok->merges = ms_malloc(tok->merge_cap * sizeof *tok->merges);
    if (tok->merges == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory for %zu merges", tok->path, n_merges);
    memset(tok->merges, 0xFF, tok->merge_cap * sizeof *tok->merges);
    char *cat = NULL;
    size_t cat_cap = 0;
    ms_status st = MS_OK;
    for (size_t r = 0; r < n_merges; r++) {
        const json_t *m = json_array_get(merges, r);
        const char *a, *b;
        size_t a_len, b_len;
        if (json_is_string(m)) {
            /* Legacy "a b": split at the first space (tokens never hold a plain space). */
            a = json_string_value(m);
            const char *sp = strchr(a, ' ');
            if (sp == NULL) {
                st = MS_FAIL(err, MS_ERR_FORMAT, "%s: model.merges[%zu] \"%.60s\" is not two tokens separated by "
                             "a space", tok->path, r, a);
                goto done;
            }
            a_len = (size_t)(sp - a);
            b = sp + 1;
            b_len = strlen(b);
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            a_len = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            b_len = json_string_length(json_array_get(m, 1));
        } else {
            st = MS_FAIL(err, MS_ERR_FORMAT, "%s: model.merges[%zu] is neither \"a b\" nor [\"a\", \"b\"]",
                         tok->path, r);
            goto done;
        }
        int32_t ia = tok_vocab_get(tok, a, a_len);
        int32_t ib = tok_vocab_get(tok, b, b_len);
        if (ia < 0 || ib < 0) {
            const char *miss = ia < 0 ? a : b;
            int miss_len = (int)MS_MIN(ia < 0 ? a_len : b_len, 60);
            st = MS_FAIL(err, MS_ERR_FORMAT, "%s: model.merges[%zu] names token \"%.*s\", which is not in the "
                         "vocabulary", tok->path, r, miss_len, miss);
            goto done;
        }
        if (ms_grow((void **)&cat, &cat_cap, a_len + b_len + 1, 1) != MS_OK) {
            st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", tok->path);
            goto done;
        }
        memcpy(cat, a, a_len);
        memcpy(cat + a_len, b, b_len);
        int32_t inew = tok_vocab_get(tok, cat, a_len + b_len);
        if (inew < 0) {
            int l = (int)MS_MIN(a_len + b_len, 60);
            st = MS_FAIL(err, MS_ERR_FORMAT, "%s: model.merges[%zu] makes \"%.*s\", which is not in the "
                         "vocabulary", tok->path, r, l, cat);
            goto done;
        }
        tok_merge_put(tok, ia, ib, (int32_t)r, inew);
    }
done:
    ms_free(cat);
    return st;
}

/* ---- loading: added tokens ---- */

static ms_status tok_load_added(ms_tok_hf *tok, const json_t *arr, ms_error *err) {
    if (arr == NULL || json_is_null(arr))
        return MS_OK;
    if (!json_is_array(arr))
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: \"added_tokens\" is not an array", tok->path);
    size_t n = json_array_size(arr);
    if (n == 0)
        return MS_OK;
    tok->added = ms_calloc(n, sizeof *tok->added);
    if (tok->added == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory for %zu added tokens", tok->path, n);
    for (size_t i = 0; i < n; i++) {
        const json_t *o = json_array_get(arr, i);
        char where[48];
        snprintf(where, sizeof where, "added_tokens[%zu]", i);
        if (!json_is_object(o))
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: %s is not an object", tok->path, where);
        tok_added *t = &tok->added[i];
        const json_t *content = json_object_get(o, "content");
        if (!json_is_string(content) || json_string_length(content) == 0)
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: %s.content is missing or empty", tok->path, where);
        MS_TRY(tok_get_id(tok, json_object_get(o, "id"), where, &t->id, err));
        MS_TRY(tok_get_bool(tok, o, "special", where, false, &t->special, err));
        MS_TRY(tok_get_bool(tok, o, "normalized", where, !t->special, &t->normalized, err));
        MS_TRY(tok_get_bool(tok, o, "lstrip", where, false, &t->lstrip, err));
        MS_TRY(tok_get_bool(tok, o, "rstrip", where, false, &t->rstrip, err));
        MS_TRY(tok_get_bool(tok, o, "single_word", where, false, &t->single_word, err));
        t->content = ms_strndup(json_string_value(content), json_string_length(content));
        tok->n_added = i + 1;  /* from here on, free() releases this entry */
        if (t->content == NULL)
            return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", tok->path);
        tok->n_ids = MS_MAX(tok->n_ids, t->id + 1);
    }
    return MS_OK;
}

/* Patterns of the added tokens: normalized tokens are matched in normalized text, so their
 * pattern is normalized too (the library normalizes their content when it builds its trie). */
static ms_status tok_added_patterns(ms_tok_hf *tok, ms_error *err) {
    for (size_t i = 0; i < tok->n_added; i++) {
        tok_added *t = &tok->added[i];
        size_t len = strlen(t->content);
        if (t->normalized && tok->nfc) {
            ms_status st = ms_tok_hf_nfc(t->content, len, &t->pattern, &t->pattern_len, err);
            if (st != MS_OK) {
                ms_error_prefix(err, "%s: added_tokens[%zu]: ", tok->path, i);
                return st;
            }
        } else {
            t->pattern = ms_strndup(t->content, len);
            t->pattern_len = len;
            if (t->pattern == NULL)
                return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", tok->path);
        }
    }
    return MS_OK;
}

static const ms_tok_hf *tok_sort_ctx;  /* qsort has no context argument; set under tok_sort_mu */
static pthread_mutex_t tok_sort_mu = PTHREAD_MUTEX_INITIALIZER;

static int tok_cmp_added(const void *x, const void *y) {
    int32_t i = *(const int32_t *)x, j = *(const int32_t *)y;
    const tok_added *a = &tok_sort_ctx->added[i], *b = &tok_sort_ctx->added[j];
    unsigned char fa = (unsigned char)a->pattern[0], fb = (unsigned char)b->pattern[0];
    if (fa != fb)
        return (fa > fb) - (fa < fb);
    if (a->pattern_len != b->pattern_len)
        return a->pattern_len < b->pattern_len ? 1 : -1;
    return (i > j) - (i < j);
}

/* Build the match set of added tokens whose normalized flag equals `normalized`. */
static ms_status tok_build_set(ms_tok_hf *tok, bool normalized, tok_match_set *set, ms_error *err) {
    size_t n = 0;
    for (size_t i = 0; i < tok->n_added; i++)
        n += tok->added[i].normalized == normalized && tok->added[i].pattern_len > 0;
    memset(set->first, 0, sizeof set->first);
    set->n = 0;
    if (n == 0)
        return MS_OK;
    set->order = ms_malloc(n * sizeof *set->order);
    if (set->order == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", tok->path);
    for (size_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].normalized == normalized && tok->added[i].pattern_len > 0)
            set->order[set->n++] = (int32_t)i;
    pthread_mutex_lock(&tok_sort_mu);
    tok_sort_ctx = tok;
    qsort(set->order, n, sizeof *set->order, tok_cmp_added);
    pthread_mutex_unlock(&tok_sort_mu);
    for (size_t k = 0; k < n; k++)
        set->first[(unsigned char)tok->added[set->order[k]].pattern[0] + 1]++;
    for (int b = 0; b < 256; b++)
        set->first[b + 1] += set->first[b];
    return MS_OK;
}

/* ---- loading: normalizer, pre-tokenizer, decoder, post-processor ---- */

static ms_status tok_load_normalizer(ms_tok_hf *tok, const json_t *norm, ms_error *err) {
    if (norm == NULL || json_is_null(norm))
        return MS_OK;
    const char *type = tok_type_of(norm);
    if (type == NULL)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: normalizer has no \"type\"", tok->path);
    if (strcmp(type, "NFC") == 0) {
        tok->nfc = true;
        return MS_OK;
    }
    if (strcmp(type, "Sequence") == 0) {
        const json_t *list = json_object_get(norm, "normalizers");
        if (!json_is_array(list))
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: normalizer Sequence has no \"normalizers\" array", tok->path);
        for (size_t i = 0; i < json_array_size(list); i++)
            MS_TRY(tok_load_normalizer(tok, json_array_get(list, i), err));
        return MS_OK;
    }
    return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: normalizer \"%s\" is not supported (only NFC)", tok->path, type);
}

/* Append one pre-tokenizer step (Split or ByteLevel; Sequence recurses). */
static ms_status tok_load_pretok_one(ms_tok_hf *tok, const json_t *pt, size_t *cap, ms_error *err) {
    const char *type = tok_type_of(pt);
    if (type == NULL)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: pre_tokenizer has no \"type\"", tok->path);
    if (strcmp(type, "Sequence") == 0) {
        const json_t *list = json_object_get(pt, "pretokenizers");
        if (!json_is_array(list))
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: pre_tokenizer Sequence has no \"pretokenizers\" array",
                           tok->path);
        for (size_t i = 0; i < json_array_size(list); i++)
            MS_TRY(tok_load_pretok_one(tok, json_array_get(list, i), cap, err));
        return MS_OK;
    }
    bool split = strcmp(type, "Split") == 0;
    if (!split && strcmp(type, "ByteLevel") != 0)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: pre_tokenizer \"%s\" is not supported (only Split and "
                       "ByteLevel, in a Sequence)", tok->path, type);
    if (tok->n_pretok > 0 && tok->pretok[tok->n_pretok - 1].byte_level)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: pre_tokenizer \"%s\" after ByteLevel is not supported",
                       tok->path, type);
    if (ms_grow((void **)&tok->pretok, cap, tok->n_pretok + 1, sizeof *tok->pretok) != MS_OK)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", tok->path);
    tok_pretok *p = &tok->pretok[tok->n_pretok++];
    memset(p, 0, sizeof *p);
    if (!split) {
        p->byte_level = true;
        bool use_regex = true;
        MS_TRY(tok_get_bool(tok, pt, "add_prefix_space", "pre_tokenizer ByteLevel", true, &p->add_prefix_space,
                            err));
        MS_TRY(tok_get_bool(tok, pt, "use_regex", "pre_tokenizer ByteLevel", true, &use_regex, err));
        if (use_regex)
            MS_TRY(tok_compile(tok, tok_gpt2_regex, PCRE2_ZERO_TERMINATED, false, "ByteLevel", &p->re, err));
        return MS_OK;
    }
    const json_t *pattern = json_object_get(pt, "pattern");
    const json_t *rx = json_object_get(pattern, "Regex");
    const json_t *lit = json_object_get(pattern, "String");
    if (!json_is_string(rx) && !json_is_string(lit))
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: pre_tokenizer Split has no pattern {\"Regex\": ...} or "
                       "{\"String\": ...}", tok->path);
    const char *beh = json_string_value(json_object_get(pt, "behavior"));
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    size_t b = 0;
    while (b < MS_ARRAY_LEN(names) && (beh == NULL || strcmp(beh, names[b]) != 0))
        b++;
    if (b == MS_ARRAY_LEN(names))
        return MS_FAIL(err, beh == NULL ? MS_ERR_FORMAT : MS_ERR_UNSUPPORTED,
                       "%s: pre_tokenizer Split behavior \"%s\" is not supported", tok->path,
                       beh != NULL ? beh : "(missing)");
    p->behavior = (tok_split_behavior)b;
    MS_TRY(tok_get_bool(tok, pt, "invert", "pre_tokenizer Split", false, &p->invert, err));
    const json_t *src = json_is_string(rx) ? rx : lit;
    return tok_compile(tok, json_string_value(src), json_string_length(src), !json_is_string(rx), "Split", &p->re,
                       err);
}

static ms_status tok_load_pretok(ms_tok_hf *tok, const json_t *pt, ms_error *err) {
    if (pt == NULL || json_is_null(pt))
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: a tokenizer without pre_tokenizer is not supported (byte-level "
                       "BPE needs ByteLevel)", tok->path);
    size_t cap = 0;
    MS_TRY(tok_load_pretok_one(tok, pt, &cap, err));
    if (tok->n_pretok == 0 || !tok->pretok[tok->n_pretok - 1].byte_level)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: pre_tokenizer does not end in ByteLevel (only byte-level BPE "
                       "is supported)", tok->path);
    return MS_OK;
}

static ms_status tok_load_decoder(ms_tok_hf *tok, const json_t *dec, ms_error *err) {
    const char *type = tok_type_of(dec);
    if (type == NULL || strcmp(type, "ByteLevel") != 0)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: decoder \"%s\" is not supported (only ByteLevel)", tok->path,
                       type != NULL ? type : "(none)");
    return MS_OK;
}

/* Whether `id` names a token: an added token or a vocabulary entry (a scan; load time only). */
static bool tok_id_exists(const ms_tok_hf *tok, int32_t id) {
    for (size_t i = 0; i < tok->n_added; i++)
        if (tok->added[i].id == id)
            return true;
    for (size_t i = 0; i < tok->vocab_cap; i++)
        if (tok->vocab[i].s != NULL && tok->vocab[i].id == id)
            return true;
    return false;
}

/* Ids of a TemplateProcessing SpecialToken item (looked up in its special_tokens map). Each must
 * be a token: the library would emit any id, past the vocabulary the model is checked against. */
static ms_status tok_tmpl_special(ms_tok_hf *tok, const json_t *proc, const json_t *item, int32_t **ids, size_t *n,
                                  size_t *cap, ms_error *err) {
    const char *name = json_string_value(json_object_get(item, "id"));
    const json_t *sp = json_object_get(json_object_get(proc, "special_tokens"), name != NULL ? name : "");
    const json_t *list = json_object_get(sp, "ids");
    if (name == NULL || !json_is_array(list))
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: post_processor TemplateProcessing: special token \"%s\" has no ids "
                       "in special_tokens", tok->path, name != NULL ? name : "(missing)");
    for (size_t i = 0; i < json_array_size(list); i++) {
        int32_t id;
        MS_TRY(tok_get_id(tok, json_array_get(list, i), "post_processor special token", &id, err));
        if (!tok_id_exists(tok, id))
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: post_processor TemplateProcessing: special token \"%.60s\" has id "
                           "%d, which is no token (neither in model.vocab nor in added_tokens)", tok->path, name, id);
        if (ms_grow((void **)ids, cap, *n + 1, sizeof **ids) != MS_OK)
            return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", tok->path);
        (*ids)[(*n)++] = id;
    }
    return MS_OK;
}

static ms_status tok_load_post(ms_tok_hf *tok, const json_t *post, ms_error *err) {
    if (post == NULL || json_is_null(post))
        return MS_OK;
    const char *type = tok_type_of(post);
    if (type == NULL)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: post_processor has no \"type\"", tok->path);
    if (strcmp(type, "ByteLevel") == 0)
        return MS_OK;  /* only adjusts offsets */
    if (strcmp(type, "Sequence") == 0) {
        const json_t *list = json_object_get(post, "processors");
        if (!json_is_array(list))
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: post_processor Sequence has no \"processors\" array", tok->path);
        for (size_t i = 0; i < json_array_size(list); i++)
            MS_TRY(tok_load_post(tok, json_array_get(list, i), err));
        return MS_OK;
    }
    if (strcmp(type, "TemplateProcessing") != 0)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: post_processor \"%s\" is not supported (only ByteLevel and "
                       "TemplateProcessing)", tok->path, type);
    if (tok->tmpl_pre != NULL || tok->tmpl_post != NULL)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: more than one TemplateProcessing post_processor", tok->path);
    const json_t *single = json_object_get(post, "single");
    if (!json_is_array(single))
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: post_processor TemplateProcessing has no \"single\" array",
                       tok->path);
    bool seen_a = false;
    size_t cap_pre = 0, cap_post = 0;
    for (size_t i = 0; i < json_array_size(single); i++) {
        const json_t *item = json_array_get(single, i);
        const json_t *sp = json_object_get(item, "SpecialToken");
        const json_t *seq = json_object_get(item, "Sequence");
        if (json_is_object(sp)) {
            if (seen_a)
                MS_TRY(tok_tmpl_special(tok, post, sp, &tok->tmpl_post, &tok->n_tmpl_post, &cap_post, err));
            else
                MS_TRY(tok_tmpl_special(tok, post, sp, &tok->tmpl_pre, &tok->n_tmpl_pre, &cap_pre, err));
        } else if (json_is_object(seq)) {
            const char *id = json_string_value(json_object_get(seq, "id"));
            if (id == NULL || strcmp(id, "A") != 0 || seen_a)
                return MS_FAIL(err, MS_ERR_FORMAT, "%s: post_processor TemplateProcessing single: sequence \"%s\" "
                               "(expected one \"A\")", tok->path, id != NULL ? id : "(missing)");
            seen_a = true;
        } else {
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: post_processor TemplateProcessing single[%zu] is neither "
                           "SpecialToken nor Sequence", tok->path, i);
        }
    }
    if (!seen_a)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: post_processor TemplateProcessing single has no sequence \"A\"",
                       tok->path);
    return MS_OK;
}

/* ---- loading: derived tables ---- */

/*
 * Every byte that valid UTF-8 text can hold (all but 0xC0, 0xC1, 0xF5 .. 0xFF; encode refuses
 * invalid UTF-8) must have its byte-level character in the vocabulary. Without one, the library
 * drops that byte (no unk_token) or emits unk / <0xXX> tokens, neither of which this loader
 * implements, and silently losing prompt text is worse than refusing the file. Real byte-level
 * vocabularies hold all 256 (the trainer seeds them with the whole alphabet).
 */
static ms_status tok_check_bytes(const ms_tok_hf *tok, ms_error *err) {
    int first = -1, n_missing = 0;
    for (unsigned b = 0; b < 256; b++) {
        bool in_utf8 = b != 0xC0 && b != 0xC1 && b < 0xF5;
        if (in_utf8 && tok->byte_id[b] < 0) {
            if (first < 0)
                first = (int)b;
            n_missing++;
        }
    }
    if (first < 0)
        return MS_OK;
    char more[48] = "";
    if (n_missing > 1)
        snprintf(more, sizeof more, " and %d more bytes", n_missing - 1);
    return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: model.vocab has no token for byte 0x%02X (\"%.*s\")%s; a "
                   "ByteLevel BPE needs one for every byte of UTF-8 text (unk_token and byte_fallback are not "
                   "supported), or text holding it could not be encoded", tok->path, (unsigned)first,
                   (int)tok->byte_utf8_len[first], tok->byte_utf8[first], more);
}

/*
 * A SentencePiece-style model must be able to encode every character: each byte needs its <0xNN>
 * token, or there must be an unk token to stand for it (llama.cpp / the library would otherwise
 * fail or drop text).
 */
static ms_status tok_check_byte_tokens(const ms_tok_hf *tok, ms_error *err) {
    if (tok->unk_id >= 0)
        return MS_OK;
    for (unsigned b = 0; b < 256; b++)
        if (tok->byte_tok[b] < 0)
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: the vocabulary has no byte token <0x%02X> and no unknown token, "
                           "so text holding a character without a token could not be encoded", tok->path, b);
    return MS_OK;
}

/* Decoded bytes of SentencePiece-style token `id` (spelling s, len bytes) into out (at most len
 * bytes): a byte token is its byte (the ByteFallback decoder), U+2581 is a space (Replace /
 * Metaspace decoders, llama.cpp's llama_unescape_whitespace). Returns the length. */
static size_t tok_spm_decode_token(const ms_tok_hf *tok, int32_t id, const char *s, size_t len, char *out) {
    if (len == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>') {
        for (unsigned b = 0; b < 256; b++)
            if (tok->byte_tok[b] == id) {
                out[0] = (char)b;
                return 1;
            }
    }
    size_t o = 0;
    for (size_t k = 0; k < len;) {
        if (k + 3 <= len && memcmp(s + k, "\xE2\x96\x81", 3) == 0) {
            out[o++] = ' ';
            k += 3;
        } else {
            out[o++] = s[k++];
        }
    }
    return o;
}

/* id -> spelling, special flags, decoded bytes, byte -> id. */
static ms_status tok_build_tables(ms_tok_hf *tok, ms_error *err) {
    size_t n = (size_t)tok->n_ids;
    tok->id_str = ms_calloc(n ? n : 1, sizeof *tok->id_str);
    tok->dec_off = ms_calloc(n ? n : 1, sizeof *tok->dec_off);
    tok->dec_len = ms_calloc(n ? n : 1, sizeof *tok->dec_len);
    tok->special = ms_calloc(n ? n : 1, 1);
    if (!tok->id_str || !tok->dec_off || !tok->dec_len || !tok->special)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory for %zu ids", tok->path, n);
    for (size_t i = 0; i < tok->vocab_cap; i++) {
        const tok_str_slot *e = &tok->vocab[i];
        if (e->s != NULL && (tok->id_str[e->id] == NULL || strcmp(e->s, tok->id_str[e->id]) < 0))
            tok->id_str[e->id] = e->s;  /* two spellings of one id: the smaller, for determinism */
    }
    for (size_t i = 0; i < tok->n_added; i++) {
        tok->id_str[tok->added[i].id] = tok->added[i].content;
        tok->special[tok->added[i].id] = tok->added[i].special;
    }
    int16_t char_byte[0x144];  /* inverse map: code point -> byte, -1 (all byte characters are < U+0144) */
    memset(char_byte, 0xFF, sizeof char_byte);
    for (unsigned b = 0; b < 256; b++) {
        uint32_t c = tok_byte_char(b);
        MS_ASSERT(c < 0x144);
        char_byte[c] = (int16_t)b;
        char u[4];
        size_t len = tok_utf8_put(u, c);
        memcpy(tok->byte_utf8[b], u, len);
        tok->byte_utf8_len[b] = (uint8_t)len;
        tok->byte_id[b] = tok_vocab_get(tok, u, len);
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        tok->byte_tok[b] = tok->spm ? tok_vocab_get(tok, hex, 6) : -1;
    }
    if (tok->spm)
        MS_TRY(tok_check_byte_tokens(tok, err));
    else if (!tok->bytes_may_miss)
        MS_TRY(tok_check_bytes(tok, err));
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        total += tok->id_str[i] != NULL ? strlen(tok->id_str[i]) : 0;
    if (total > UINT32_MAX)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: token strings too large", tok->path);
    tok->dec_blob = ms_malloc(total + 1);
    if (tok->dec_blob == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", tok->path);
    size_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        const char *s = tok->id_str[i];
        if (s == NULL)
            continue;
        size_t len = strlen(s);
        tok->dec_off[i] = (uint32_t)pos;
        if (tok->spm) {
            pos += tok_spm_decode_token(tok, (int32_t)i, s, len, tok->dec_blob + pos);
            tok->dec_len[i] = (uint32_t)(pos - tok->dec_off[i]);
            continue;
        }
        /* ByteLevel decoder: each character back to its byte; a token holding a character outside
         * the byte alphabet is kept as its UTF-8 (the library's decode_chain). */
        size_t o = pos;
        bool mapped = true;
        for (size_t k = 0; k < len;) {  /* jansson gave valid UTF-8 */
            uint32_t c = tok_utf8_at(s, k);
            if (c >= 0x144 || char_byte[c] < 0) {
                mapped = false;
                break;
            }
            tok->dec_blob[o++] = (char)char_byte[c];
            k += tok_utf8_len((unsigned char)s[k]);
        }
        if (!mapped) {
            memcpy(tok->dec_blob + pos, s, len);
            o = pos + len;
        }
        tok->dec_len[i] = (uint32_t)(o - pos);
        pos = o;
    }
    return MS_OK;
}

/* ---- loading: tokenizer_config.json ---- */

/* bos_token / eos_token: a string, {"content": string, ...}, or null. */
static ms_status tok_config_token(const char *cfg_path, const json_t *cfg, const char *key, char **out,
                                  ms_error *err) {
    const json_t *v = json_object_get(cfg, key);
    if (json_is_object(v))
        v = json_object_get(v, "content");
    if (v == NULL || json_is_null(v))
        return MS_OK;
    if (!json_is_string(v))
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: %s is neither a string nor {\"content\": string}", cfg_path, key);
    *out = ms_strdup(json_string_value(v));
    if (*out == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", cfg_path);
    return MS_OK;
}

static ms_status tok_load_config(ms_tok_hf *tok, ms_error *err) {
    const char *slash = strrchr(tok->path, '/');
    int dir_len = slash != NULL ? (int)(slash - tok->path) : 1;
    char *cfg_path = ms_asprintf("%.*s/tokenizer_config.json", dir_len, slash != NULL ? tok->path : ".");
    if (cfg_path == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", tok->path);
    json_t *cfg = NULL;
    ms_status st = MS_OK;
    FILE *probe = fopen(cfg_path, "rb");
    if (probe == NULL && errno == ENOENT)
        goto done;  /* no config: no bos/eos/template */
    if (probe != NULL)
        fclose(probe);
    /* model_max_length is often 1e30 written as an integer, too big for jansson's integers. */
    st = tok_load_json(cfg_path, JSON_DECODE_INT_AS_REAL, &cfg, err);
    if (st != MS_OK)
        goto done;
    st = tok_config_token(cfg_path, cfg, "bos_token", &tok->bos_token, err);
    if (st == MS_OK)
        st = tok_config_token(cfg_path, cfg, "eos_token", &tok->eos_token, err);
    if (st != MS_OK)
        goto done;
    const json_t *tmpl = json_object_get(cfg, "chat_template");
    if (json_is_array(tmpl)) {
        const json_t *pick = NULL;
        for (size_t i = 0; i < json_array_size(tmpl); i++) {
            const json_t *e = json_array_get(tmpl, i);
            const char *name = json_string_value(json_object_get(e, "name"));
            if (name != NULL && strcmp(name, "default") == 0)
                pick = json_object_get(e, "template");
        }
        tmpl = pick;
    }
    if (tmpl != NULL && !json_is_null(tmpl)) {
        if (!json_is_string(tmpl)) {
            st = MS_FAIL(err, MS_ERR_FORMAT, "%s: chat_template is not a string", cfg_path);
            goto done;
        }
        tok->chat_template = ms_strdup(json_string_value(tmpl));
        if (tok->chat_template == NULL) {
            st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", cfg_path);
            goto done;
        }
    }
    tok->bos_id = tok->bos_token != NULL ? ms_tok_hf_token_id(tok, tok->bos_token) : -1;
    tok->eos_id = tok->eos_token != NULL ? ms_tok_hf_token_id(tok, tok->eos_token) : -1;
done:
    json_decref(cfg);
    ms_free(cfg_path);
    return st;
}

/* ---- loading: SentencePiece-style tokenizer.json (byte_fallback) ---- */

static const char tok_meta[] = "\xE2\x96\x81";  /* U+2581, SentencePiece's space */

/* A string field equal to `want`. */
static bool tok_str_is(const json_t *obj, const char *key, const char *want) {
    const char *v = json_string_value(json_object_get(obj, key));
    return v != NULL && strcmp(v, want) == 0;
}

/* Replace of the string `from` by `to` ({"type": "Replace", "pattern": {"String": from}, "content": to}). */
static bool tok_is_replace(const json_t *r, const char *from, const char *to) {
    return tok_str_is(r, "type", "Replace") && tok_str_is(json_object_get(r, "pattern"), "String", from) &&
           tok_str_is(r, "content", to);
}

/* Metaspace pre-tokenizer or decoder: replacement U+2581, prepend_scheme (or legacy add_prefix_space),
 * split. */
static ms_status tok_load_metaspace(ms_tok_hf *tok, const json_t *m, const char *what, tok_prefix *prefix,
                                    bool *split, ms_error *err) {
    if (!tok_str_is(m, "replacement", tok_meta))
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: %s Metaspace: only replacement U+2581 is supported", tok->path,
                       what);
    const json_t *scheme = json_object_get(m, "prepend_scheme");
    if (scheme != NULL && !json_is_null(scheme)) {
        const char *sc = json_string_value(scheme);
        if (sc != NULL && strcmp(sc, "first") == 0)
            *prefix = TOK_PREFIX_FIRST;
        else if (sc != NULL && strcmp(sc, "always") == 0)
            *prefix = TOK_PREFIX_ALWAYS;
        else if (sc != NULL && strcmp(sc, "never") == 0)
            *prefix = TOK_PREFIX_NEVER;
        else
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: %s Metaspace: prepend_scheme is not \"first\", \"always\" or "
                           "\"never\"", tok->path, what);
    } else {
        bool add = true;
        MS_TRY(tok_get_bool(tok, m, "add_prefix_space", what, true, &add, err));
        *prefix = add ? TOK_PREFIX_ALWAYS : TOK_PREFIX_NEVER;
    }
    return tok_get_bool(tok, m, "split", what, true, split, err);
}

/*
 * The parts of a byte_fallback tokenizer.json as Llama 2 / Mistral files have them:
 *   normalizer null or a Sequence of Prepend(U+2581) and Replace(" " -> U+2581) (legacy files);
 *   pre_tokenizer null or Metaspace (newer files; prepend_scheme, split);
 *   decoder a Sequence of Replace(U+2581 -> " "), ByteFallback, Fuse, Strip(" ", start 0 or 1, stop 0),
 *   or Metaspace (optionally in such a Sequence).
 * Spaces must become U+2581 somewhere (Replace or Metaspace); anything else is refused, named.
 */
static ms_status tok_load_spm_parts(ms_tok_hf *tok, const json_t *root, ms_error *err) {
    bool replaced = false;
    const json_t *norm = json_object_get(root, "normalizer");
    if (norm != NULL && !json_is_null(norm)) {
        const json_t *list = json_object_get(norm, "normalizers");
        size_t n = tok_str_is(norm, "type", "Sequence") ? json_array_size(list) : 1;
        for (size_t i = 0; i < n; i++) {
            const json_t *nm = tok_str_is(norm, "type", "Sequence") ? json_array_get(list, i) : norm;
            if (tok_str_is(nm, "type", "Prepend") && tok_str_is(nm, "prepend", tok_meta) && !replaced) {
                tok->prefix = TOK_PREFIX_ALWAYS;
            } else if (tok_is_replace(nm, " ", tok_meta)) {
                replaced = true;
            } else {
                const char *type = tok_type_of(nm);
                return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: normalizer \"%s\" with model.byte_fallback is not "
                               "supported (only Prepend(U+2581) then Replace(\" \" -> U+2581))", tok->path,
                               type != NULL ? type : "(no type)");
            }
        }
    }
    const json_t *pt = json_object_get(root, "pre_tokenizer");
    if (pt != NULL && !json_is_null(pt)) {
        if (!tok_str_is(pt, "type", "Metaspace") || replaced) {
            const char *type = tok_type_of(pt);
            return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: pre_tokenizer \"%s\" with model.byte_fallback is not "
                           "supported (only Metaspace, without a Replace normalizer)", tok->path,
                           type != NULL ? type : "(no type)");
        }
        MS_TRY(tok_load_metaspace(tok, pt, "pre_tokenizer", &tok->prefix, &tok->metaspace_split, err));
        tok->prefix_if_missing = true;
        replaced = true;
    }
    if (!replaced)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: model.byte_fallback without a Metaspace pre_tokenizer or a "
                       "Replace(\" \" -> U+2581) normalizer is not supported", tok->path);
    const json_t *dec = json_object_get(root, "decoder");
    const json_t *dlist = json_object_get(dec, "decoders");
    bool seq = tok_str_is(dec, "type", "Sequence");
    if (dec == NULL || json_is_null(dec) || (seq && !json_is_array(dlist)))
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: model.byte_fallback needs a decoder (Metaspace or a Sequence "
                       "with ByteFallback)", tok->path);
    bool unescaped = false, byte_fb = false;
    size_t n = seq ? json_array_size(dlist) : 1;
    for (size_t i = 0; i < n; i++) {
        const json_t *d = seq ? json_array_get(dlist, i) : dec;
        const char *type = tok_type_of(d);
        if (tok_is_replace(d, tok_meta, " ") && !unescaped) {
            unescaped = true;
        } else if (type != NULL && strcmp(type, "ByteFallback") == 0 && !byte_fb) {
            byte_fb = true;
        } else if (type != NULL && strcmp(type, "Fuse") == 0) {
            continue;
        } else if (type != NULL && strcmp(type, "Strip") == 0 && tok_str_is(d, "content", " ") &&
                   json_is_integer(json_object_get(d, "start")) &&
                   json_integer_value(json_object_get(d, "start")) <= 1 &&
                   json_integer_value(json_object_get(d, "start")) >= 0 &&
                   json_integer_value(json_object_get(d, "stop")) == 0 && i + 1 == n) {
            tok->strip_space = json_integer_value(json_object_get(d, "start")) == 1;
        } else if (type != NULL && strcmp(type, "Metaspace") == 0 && !unescaped) {
            tok_prefix dp = TOK_PREFIX_NEVER;
            bool dsplit = false;
            MS_TRY(tok_load_metaspace(tok, d, "decoder", &dp, &dsplit, err));
            tok->strip_space = dp != TOK_PREFIX_NEVER;
            unescaped = true;
        } else {
            return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: decoder \"%s\" with model.byte_fallback is not supported "
                           "(only Replace(U+2581 -> \" \"), ByteFallback, Fuse, Strip(\" \", start <= 1, stop 0) "
                           "last, Metaspace)", tok->path, type != NULL ? type : "(no type)");
        }
    }
    if (!unescaped || !byte_fb)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: a byte_fallback decoder must turn U+2581 into spaces and bytes "
                       "tokens into bytes (Replace or Metaspace, and ByteFallback)", tok->path);
    return MS_OK;
}

/* ---- init / free ---- */

static ms_status tok_load(ms_tok_hf *tok, const json_t *root, ms_error *err) {
    MS_TRY(tok_load_model(tok, json_object_get(root, "model"), err));
    MS_TRY(tok_load_added(tok, json_object_get(root, "added_tokens"), err));
    if (tok->spm) {
        MS_TRY(tok_load_spm_parts(tok, root, err));
    } else {
        MS_TRY(tok_load_normalizer(tok, json_object_get(root, "normalizer"), err));
        MS_TRY(tok_load_pretok(tok, json_object_get(root, "pre_tokenizer"), err));
        MS_TRY(tok_load_decoder(tok, json_object_get(root, "decoder"), err));
    }
    MS_TRY(tok_load_post(tok, json_object_get(root, "post_processor"), err));
    MS_TRY(tok_added_patterns(tok, err));
    MS_TRY(tok_build_set(tok, false, &tok->raw_set, err));
    MS_TRY(tok_build_set(tok, true, &tok->norm_set, err));
    MS_TRY(tok_build_tables(tok, err));
    return MS_OK;
}

ms_status ms_tok_hf_init(ms_tok_hf **out, const char *path, ms_error *err) {
    *out = NULL;
    ms_tok_hf *tok = ms_calloc(1, sizeof *tok);
    if (tok == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", path);
    tok->bos_id = tok->eos_id = tok->unk_id = tok->eot_id = -1;
    json_t *root = NULL;
    ms_status st = MS_OK;
    tok->path = ms_strdup(path);
    tok->gctx = pcre2_general_context_create(tok_pcre2_malloc, tok_pcre2_free, NULL);
    tok->cache = ms_calloc(TOK_CACHE_SLOTS, sizeof *tok->cache);
    if (tok->path == NULL || tok->gctx == NULL || tok->cache == NULL) {
        st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", path);
        goto fail;
    }
    if (pthread_mutex_init(&tok->cache_mu, NULL) != 0) {
        st = MS_FAIL(err, MS_ERR_INTERNAL, "%s: cannot create the cache mutex", path);
        goto fail;
    }
    tok->cache_mu_ok = true;
    st = tok_load_json(path, JSON_REJECT_DUPLICATES, &root, err);
    if (st != MS_OK)
        goto fail;
    st = tok_load(tok, root, err);
    json_decref(root);
    root = NULL;
    if (st != MS_OK)
        goto fail;
    st = tok_compile(tok, "\\w", PCRE2_ZERO_TERMINATED, false, "word", &tok->word_re, err);
    if (st == MS_OK)
        st = tok_load_config(tok, err);
    if (st != MS_OK)
        goto fail;
    *out = tok;
    return MS_OK;
fail:
    json_decref(root);
    ms_tok_hf_free(tok);
    return st;
}

void ms_tok_hf_free(ms_tok_hf *tok) {
    if (tok == NULL)
        return;
    if (tok->cache != NULL)
        for (size_t i = 0; i < TOK_CACHE_SLOTS; i++)
            ms_free(tok->cache[i]);
    ms_free(tok->cache);
    if (tok->cache_mu_ok)
        pthread_mutex_destroy(&tok->cache_mu);
    for (size_t i = 0; i < tok->n_pretok; i++)
        pcre2_code_free(tok->pretok[i].re);
    ms_free(tok->pretok);
    pcre2_code_free(tok->word_re);
    pcre2_general_context_free(tok->gctx);
    for (size_t i = 0; i < tok->n_added; i++) {
        ms_free(tok->added[i].content);
        ms_free(tok->added[i].pattern);
    }
    ms_free(tok->added);
    ms_free(tok->raw_set.order);
    ms_free(tok->norm_set.order);
    ms_free(tok->tmpl_pre);
    ms_free(tok->tmpl_post);
    ms_free(tok->bos_token);
    ms_free(tok->eos_token);
    ms_free(tok->chat_template);
    ms_free(tok->id_str);
    ms_free(tok->dec_off);
    ms_free(tok->dec_len);
    ms_free(tok->dec_blob);
    ms_free(tok->special);
    ms_free(tok->str_blob);
    ms_free(tok->vocab);
    ms_free(tok->merges);
    ms_free(tok->path);
    ms_free(tok);
}

/* ---- encode: output and BPE ---- */

/* Growable id list of one encode call. */
typedef struct tok_out {
    int32_t *ids;
    size_t n, cap;
    const char *text0;  /* start of the text being encoded (Metaspace prepend_scheme "first") */
} tok_out;

static ms_status tok_push(const ms_tok_hf *tok, tok_out *o, int32_t id, ms_error *err) {
    if (ms_grow((void **)&o->ids, &o->cap, o->n + 1, sizeof *o->ids) != MS_OK)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory encoding (%zu ids)", tok->path, o->n + 1);
    o->ids[o->n++] = id;
    return MS_OK;
}

/* Heap entry of Word::merge_all: min-heap on (rank, pos). */
typedef struct tok_heap_item {
    int32_t rank;
    int32_t new_id;
    size_t pos;
} tok_heap_item;

static bool tok_heap_less(const tok_heap_item *a, const tok_heap_item *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void tok_heap_push(tok_heap_item *h, size_t *n, tok_heap_item it) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!tok_heap_less(&it, &h[p]))
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = it;
}

static tok_heap_item tok_heap_pop(tok_heap_item *h, size_t *n) {
    tok_heap_item top = h[0];
    tok_heap_item last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && tok_heap_less(&h[c + 1], &h[c]))
            c++;
        if (!tok_heap_less(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0)
        h[i] = last;
    return top;
}

/* Merge the symbols of `word` (len raw bytes) and append their ids (Word::merge_all). */
static ms_status tok_bpe_merge(const ms_tok_hf *tok, const char *word, size_t len, tok_out *o, ms_error *err) {
    /* Symbols: id, prev, next (linked list over positions), alive. */
    int32_t *sid = ms_malloc(len * sizeof *sid);
    int64_t *prev = ms_malloc(len * sizeof *prev);
    int64_t *next = ms_malloc(len * sizeof *next);
    bool *alive = ms_malloc(len * sizeof *alive);
    tok_heap_item *heap = ms_malloc(3 * len * sizeof *heap);  /* n initial + 2 per merge */
    ms_status st = MS_OK;
    if (!sid || !prev || !next || !alive || !heap) {
        st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory merging a %zu-byte word", tok->path, len);
        goto done;
    }
    /* Initial symbols: one per byte (its byte-level character). Load refuses a vocabulary without
     * the byte-level character of a byte UTF-8 text can hold (tok_check_bytes), so the skip below
     * is only a guard. */
    size_t n = 0;
#define TOK_SYMBOL(id_)                  \
    do {                                 \
        sid[n] = (id_);                  \
        prev[n] = (int64_t)n - 1;        \
        next[n] = (int64_t)n + 1;        \
        alive[n] = true;                 \
        n++;                             \
    } while (0)
    if (!tok->spm) {
        for (size_t i = 0; i < len; i++) {
            int32_t id = tok->byte_id[(unsigned char)word[i]];
            if (id < 0) {
                /* Only vocabulary arrays get here (tokenizer.json loading refuses a vocabulary
                 * lacking a byte): llama.cpp would drop the byte; losing text silently is worse. */
                st = MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: cannot encode byte 0x%02X: the vocabulary has no token "
                             "for it", tok->path, (unsigned char)word[i]);
                goto done;
            }
            TOK_SYMBOL(id);
        }
    } else {
        /* One symbol per UTF-8 character (encode checked the text); a character without a token
         * becomes its bytes' <0xNN> tokens (BPE::merge_word with byte_fallback; llama.cpp's
         * resegment), a byte without one unk_id (load refuses a model that has neither). */
        for (size_t i = 0; i < len;) {
            size_t cl = MS_MIN(tok_utf8_len((unsigned char)word[i]), len - i);
            int32_t id = tok_vocab_get(tok, word + i, cl);
            if (id >= 0) {
                TOK_SYMBOL(id);
            } else {
                for (size_t k = 0; k < cl; k++) {
                    int32_t bid = tok->byte_tok[(unsigned char)word[i + k]];
                    if (bid < 0)
                        bid = tok->unk_id;
                    if (bid >= 0)
                        TOK_SYMBOL(bid);
                }
            }
            i += cl;
        }
    }
#undef TOK_SYMBOL
    if (n == 0)
        goto done;
    next[n - 1] = -1;
    size_t hn = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        const tok_merge_slot *m = tok_merge_get(tok, sid[i], sid[i + 1]);
        if (m != NULL)
            tok_heap_push(heap, &hn, (tok_heap_item){m->rank, m->new_id, i});
    }
    while (hn > 0) {
        tok_heap_item top = tok_heap_pop(heap, &hn);
        size_t p = top.pos;
        if (!alive[p] || next[p] < 0)
            continue;
        size_t q = (size_t)next[p];
        const tok_merge_slot *m = tok_merge_get(tok, sid[p], sid[q]);
        if (m == NULL || m->new_id != top.new_id)
            continue;  /* expired entry */
        sid[p] = top.new_id;
        alive[q] = false;
        next[p] = next[q];
        if (next[q] >= 0)
            prev[next[q]] = (int64_t)p;
        if (prev[p] >= 0) {
            const tok_merge_slot *mp = tok_merge_get(tok, sid[prev[p]], sid[p]);
            if (mp != NULL)
                tok_heap_push(heap, &hn, (tok_heap_item){mp->rank, mp->new_id, (size_t)prev[p]});
        }
        if (next[p] >= 0) {
            const tok_merge_slot *mn = tok_merge_get(tok, sid[p], sid[next[p]]);
            if (mn != NULL)
                tok_heap_push(heap, &hn, (tok_heap_item){mn->rank, mn->new_id, p});
        }
    }
    for (int64_t i = 0; i >= 0; i = next[i]) {
        st = tok_push(tok, o, sid[i], err);
        if (st != MS_OK)
            goto done;
    }
done:
    ms_free(sid);
    ms_free(prev);
    ms_free(next);
    ms_free(alive);
    ms_free(heap);
    return st;
}

/* Cache look-up: append the cached ids of `word` and return true on a hit. */
static bool tok_cache_get(ms_tok_hf *tok, const char *word, size_t len, uint64_t h, tok_out *o, ms_error *err,
                          ms_status *st) {
    bool hit = false;
    *st = MS_OK;
    pthread_mutex_lock(&tok->cache_mu);
    for (size_t i = h & (TOK_CACHE_SLOTS - 1);; i = (i + 1) & (TOK_CACHE_SLOTS - 1)) {
        const tok_cache_entry *e = tok->cache[i];
        if (e == NULL)
            break;
        if (e->hash == h && e->len == len && memcmp(e->word, word, len) == 0) {
            hit = true;
            for (uint32_t k = 0; k < e->n_ids && *st == MS_OK; k++)
                *st = tok_push(tok, o, e->ids[k], err);
            break;
        }
    }
    pthread_mutex_unlock(&tok->cache_mu);
    return hit;
}

/* Cache insert (best effort: a full cache or no memory just skips it). */
static void tok_cache_put(ms_tok_hf *tok, const char *word, size_t len, uint64_t h, const int32_t *ids,
                          size_t n_ids) {
    pthread_mutex_lock(&tok->cache_mu);
    if (tok->n_cache >= TOK_CACHE_MAX_ENTRIES)
        goto done;
    size_t i = h & (TOK_CACHE_SLOTS - 1);
    for (; tok->cache[i] != NULL; i = (i + 1) & (TOK_CACHE_SLOTS - 1)) {
        const tok_cache_entry *e = tok->cache[i];
        if (e->hash == h && e->len == len && memcmp(e->word, word, len) == 0)
            goto done;  /* another thread got there first */
    }
    tok_cache_entry *e = ms_malloc(sizeof *e + n_ids * sizeof *ids + len);
    if (e == NULL)
        goto done;
    e->hash = h;
    e->len = (uint32_t)len;
    e->n_ids = (uint32_t)n_ids;
    e->ids = (int32_t *)(e + 1);
    e->word = (char *)(e->ids + n_ids);
    memcpy(e->ids, ids, n_ids * sizeof *ids);
    memcpy(e->word, word, len);
    tok->cache[i] = e;
    tok->n_cache++;
done:
    pthread_mutex_unlock(&tok->cache_mu);
}

/* One pre-token (raw bytes) -> ids (BPE::tokenize_with_cache). */
static ms_status tok_bpe_word(const ms_tok_hf *ctok, const char *word, size_t len, tok_out *o, ms_error *err) {
    ms_tok_hf *tok = (ms_tok_hf *)ctok;  /* only the mutex-guarded cache is written */
    if (len == 0)
        return MS_OK;
    if (tok->ignore_merges && tok->spm) {
        int32_t id = tok_vocab_get(tok, word, len);
        if (id >= 0)
            return tok_push(tok, o, id, err);
    } else if (tok->ignore_merges) {
        char small[512];
        char *bl = 2 * len <= sizeof small ? small : ms_malloc(2 * len);
        if (bl == NULL)
            return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory encoding", tok->path);
        size_t bn = 0;
        for (size_t i = 0; i < len; i++) {
            unsigned char b = (unsigned char)word[i];
            memcpy(bl + bn, tok->byte_utf8[b], tok->byte_utf8_len[b]);
            bn += tok->byte_utf8_len[b];
        }
        int32_t id = tok_vocab_get(tok, bl, bn);
        if (bl != small)
            ms_free(bl);
        if (id >= 0)
            return tok_push(tok, o, id, err);
    }
    uint64_t h = tok_hash(word, len);
    bool cacheable = len < TOK_CACHE_MAX_WORD;
    ms_status st = MS_OK;
    if (cacheable && tok_cache_get(tok, word, len, h, o, err, &st))
        return st;
    size_t first = o->n;
    MS_TRY(tok_bpe_merge(tok, word, len, o, err));
    /* o->ids is still NULL when nothing was pushed (a word of bytes without tokens, which load
     * refuses); such a word is not cached. */
    if (cacheable && o->n > first)
        tok_cache_put(tok, word, len, h, o->ids + first, o->n - first);
    return MS_OK;
}

/* ---- encode: pre-tokenizer ---- */

/* A span of a piece: [s, e) and whether it is a pattern match. */
typedef struct tok_span {
    size_t s, e;
    bool match;
} tok_span;

typedef struct tok_spans {
    tok_span *v;
    size_t n, cap;
} tok_spans;

static ms_status tok_span_push(const ms_tok_hf *tok, tok_spans *sp, size_t s, size_t e, bool match, ms_error *err) {
    if (ms_grow((void **)&sp->v, &sp->cap, sp->n + 1, sizeof *sp->v) != MS_OK)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory pre-tokenizing", tok->path);
    sp->v[sp->n++] = (tok_span){s, e, match};
    return MS_OK;
}

/* Pattern::find_matches for a regex: gaps and matches covering s[0 .. len), with the onig crate's
 * find_iter rule for empty matches. */
static ms_status tok_find_matches(const ms_tok_hf *tok, const pcre2_code *re, const char *s, size_t len,
                                  tok_spans *out, ms_error *err) {
    out->n = 0;
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, tok->gctx);
    if (md == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory matching", tok->path);
    ms_status st = MS_OK;
    size_t prev = 0, last_end = 0;
    bool have_last = false;
    size_t last_match_end = 0;
    while (last_end <= len) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, len, last_end, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            if (pcre2_get_error_message(rc, msg, sizeof msg) < 0)
                snprintf((char *)msg, sizeof msg, "error %d", rc);
            st = MS_FAIL(err, rc == PCRE2_ERROR_NOMEMORY ? MS_ERR_OOM : MS_ERR_INTERNAL,
                         "%s: pre-tokenizer regex failed at byte %zu: %s", tok->path, last_end, (const char *)msg);
            goto done;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (ms == me && have_last && last_match_end == me) {
            last_end += last_end < len ? tok_utf8_len((unsigned char)s[last_end]) : 1;
            continue;
        }
        last_end = me;
        have_last = true;
        last_match_end = me;
        if (prev != ms && (st = tok_span_push(tok, out, prev, ms, false, err)) != MS_OK)
            goto done;
        if ((st = tok_span_push(tok, out, ms, me, true, err)) != MS_OK)
            goto done;
        prev = me;
    }
    if (prev != len)
        st = tok_span_push(tok, out, prev, len, false, err);
done:
    pcre2_match_data_free(md);
    return st;
}

static ms_status tok_pretok_run(const ms_tok_hf *tok, size_t step, const char *s, size_t len, tok_out *o,
                                ms_error *err);

/* Apply Split step `step` to s[0 .. len): SplitDelimiterBehavior, then the next step per piece. */
static ms_status tok_pretok_split(const ms_tok_hf *tok, size_t step, const char *s, size_t len, tok_out *o,
                                  ms_error *err) {
    const tok_pretok *p = &tok->pretok[step];
    tok_spans sp = {0};
    ms_status st = tok_find_matches(tok, p->re, s, len, &sp, err);
    if (st != MS_OK)
        goto done;
    /* Fold into (span, remove) following the library; `match` becomes "remove". */
    size_t w = 0;
    bool prev_match = false;
    if (p->behavior == TOK_SPLIT_MERGED_WITH_NEXT) {
        /* Folded from the right; spans are kept in place and compacted towards the end. */
        size_t r = sp.n;
        for (size_t k = sp.n; k-- > 0;) {
            bool m = sp.v[k].match != p->invert;
            if (m && !prev_match && r < sp.n)
                sp.v[r].s = sp.v[k].s;
            else
                sp.v[--r] = (tok_span){sp.v[k].s, sp.v[k].e, false};
            prev_match = m;
        }
        memmove(sp.v, sp.v + r, (sp.n - r) * sizeof *sp.v);
        w = sp.n - r;
    } else {
        for (size_t k = 0; k < sp.n; k++) {
            bool m = sp.v[k].match != p->invert;
            tok_span cur = sp.v[k];
            switch (p->behavior) {
            case TOK_SPLIT_REMOVED:
                sp.v[w++] = (tok_span){cur.s, cur.e, m};
                break;
            case TOK_SPLIT_ISOLATED:
                sp.v[w++] = (tok_span){cur.s, cur.e, false};
                break;
            case TOK_SPLIT_CONTIGUOUS:
                if (m == prev_match && w > 0)
                    sp.v[w - 1].e = cur.e;
                else
                    sp.v[w++] = (tok_span){cur.s, cur.e, false};
                break;
            case TOK_SPLIT_MERGED_WITH_PREVIOUS:
                if (m && !prev_match && w > 0)
                    sp.v[w - 1].e = cur.e;
                else
                    sp.v[w++] = (tok_span){cur.s, cur.e, false};
                break;
            case TOK_SPLIT_MERGED_WITH_NEXT:
                MS_ABORT("unreachable");
            }
            prev_match = m;
        }
    }
    for (size_t k = 0; k < w && st == MS_OK; k++)
        if (!sp.v[k].match && sp.v[k].e > sp.v[k].s)
            st = tok_pretok_run(tok, step + 1, s + sp.v[k].s, sp.v[k].e - sp.v[k].s, o, err);
done:
    ms_free(sp.v);
    return st;
}

/* ByteLevel: optional prefix space, optional GPT-2 regex split, then BPE per piece. */
static ms_status tok_pretok_byte_level(const ms_tok_hf *tok, const tok_pretok *p, const char *s, size_t len,
                                       tok_out *o, ms_error *err) {
    char *buf = NULL;
    if (p->add_prefix_space && s[0] != ' ') {
        buf = ms_malloc(len + 1);
        if (buf == NULL)
            return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory pre-tokenizing", tok->path);
        buf[0] = ' ';
        memcpy(buf + 1, s, len);
        s = buf;
        len++;
    }
    ms_status st = MS_OK;
    if (p->re == NULL) {
        st = tok_bpe_word(tok, s, len, o, err);
    } else {
        tok_spans sp = {0};
        st = tok_find_matches(tok, p->re, s, len, &sp, err);
        for (size_t k = 0; k < sp.n && st == MS_OK; k++)
            st = tok_bpe_word(tok, s + sp.v[k].s, sp.v[k].e - sp.v[k].s, o, err);
        ms_free(sp.v);
    }
    ms_free(buf);
    return st;
}

/* Run pre-tokenizer steps step.. on a non-empty piece, then BPE. */
static ms_status tok_pretok_run(const ms_tok_hf *tok, size_t step, const char *s, size_t len, tok_out *o,
                                ms_error *err) {
    MS_ASSERT(step < tok->n_pretok);
    const tok_pretok *p = &tok->pretok[step];
    if (p->byte_level)
        return tok_pretok_byte_level(tok, p, s, len, o, err);
    return tok_pretok_split(tok, step, s, len, o, err);
}

/* ---- encode: added tokens ---- */

/* Whether the code point starting at s[i] is a word character (\w, Unicode). */
static bool tok_is_word_at(const ms_tok_hf *tok, const char *s, size_t i, pcre2_match_data *md) {
    size_t cl = tok_utf8_len((unsigned char)s[i]);
    return pcre2_match(tok->word_re, (PCRE2_SPTR)(s + i), cl, 0, PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK, md, NULL) >= 0;
}

/* Longest added token of `set` matching s at i, or -1. */
static int32_t tok_match_at(const ms_tok_hf *tok, const tok_match_set *set, const char *s, size_t len, size_t i) {
    unsigned char b = (unsigned char)s[i];
    for (uint32_t k = set->first[b]; k < set->first[b + 1]; k++) {
        const tok_added *t = &tok->added[set->order[k]];
        if (t->pattern_len <= len - i && memcmp(t->pattern, s + i, t->pattern_len) == 0)
            return set->order[k];
    }
    return -1;
}

/* Callback for the pieces between added tokens. */
typedef ms_status (*tok_piece_fn)(const ms_tok_hf *tok, const char *s, size_t len, tok_out *o, ms_error *err);

/*
 * AddedVocabulary::find_matches + split: emit added tokens of `set` found in s[0 .. len) and pass
 * the text between them to `piece`. Matches are leftmost-longest and do not overlap (scanning
 * resumes at a match's end even when single_word discards it, as aho-corasick's iterator does).
 */
static ms_status tok_split_added(const ms_tok_hf *tok, const tok_match_set *set, const char *s, size_t len,
                                 tok_piece_fn piece, tok_out *o, ms_error *err) {
    if (len == 0)
        return MS_OK;
    if (set->n == 0)
        return piece(tok, s, len, o, err);
    pcre2_match_data *md = NULL;
    ms_status st = MS_OK;
    size_t start_offset = 0;
    for (size_t pos = 0; pos < len;) {
        int32_t k = -1;
        size_t ms = pos;
        for (; ms < len; ms++)
            if ((k = tok_match_at(tok, set, s, len, ms)) >= 0)
                break;
        if (k < 0)
            break;
        const tok_added *t = &tok->added[k];
        size_t me = ms + t->pattern_len;
        pos = me;
        if (ms < start_offset)
            continue;  /* inside white space that an rstrip token absorbed */
        if (t->single_word) {
            if (md == NULL && (md = pcre2_match_data_create_from_pattern(tok->word_re, tok->gctx)) == NULL) {
                st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory matching", tok->path);
                goto done;
            }
            bool start_ok = ms == 0 || !tok_is_word_at(tok, s, tok_utf8_prev(s, ms), md);
            bool stop_ok = me == len || !tok_is_word_at(tok, s, me, md);
            if (!start_ok || !stop_ok)
                continue;
        }
        size_t start = ms, stop = me;
        if (t->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t pv = tok_utf8_prev(s, ns);
                if (!tok_is_space(tok_utf8_at(s, pv)))
                    break;
                ns = pv;
            }
            start = MS_MAX(ns, start_offset);
        }
        if (t->rstrip)
            while (stop < len && tok_is_space(tok_utf8_at(s, stop)))
                stop += tok_utf8_len((unsigned char)s[stop]);
        if (start_offset < start && (st = piece(tok, s + start_offset, start - start_offset, o, err)) != MS_OK)
            goto done;
        if ((st = tok_push(tok, o, t->id, err)) != MS_OK)
            goto done;
        start_offset = stop;
    }
    if (start_offset < len)
        st = piece(tok, s + start_offset, len - start_offset, o, err);
done:
    pcre2_match_data_free(md);
    return st;
}

/*
 * SentencePiece-style text piece: optional U+2581 prefix, every ' ' replaced by U+2581 (llama.cpp's
 * llama_escape_whitespace; the Prepend + Replace normalizers; Metaspace), then one word (or, with
 * Metaspace split, one word per U+2581-led run) merged.
 */
static ms_status tok_spm_piece(const ms_tok_hf *tok, const char *s, size_t len, tok_out *o, ms_error *err) {
    static const char meta[] = "\xE2\x96\x81";
    bool prefix = tok->prefix == TOK_PREFIX_ALWAYS || (tok->prefix == TOK_PREFIX_FIRST && s == o->text0);
    if (prefix && tok->prefix_if_missing && (s[0] == ' ' || (len >= 3 && memcmp(s, meta, 3) == 0)))
        prefix = false;
    size_t n_sp = 0;
    for (size_t i = 0; i < len; i++)
        n_sp += s[i] == ' ';
    size_t cap = len + 2 * n_sp + (prefix ? 3 : 0);
    char *buf = ms_malloc(cap + 1);
    if (buf == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory encoding", tok->path);
    size_t n = 0;
    if (prefix) {
        memcpy(buf, meta, 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (s[i] == ' ') {
            memcpy(buf + n, meta, 3);
            n += 3;
        } else {
            buf[n++] = s[i];
        }
    }
    ms_status st = MS_OK;
    if (!tok->metaspace_split) {
        st = tok_bpe_word(tok, buf, n, o, err);
    } else {
        size_t w = 0;  /* SplitDelimiterBehavior::MergedWithNext on U+2581 */
        for (size_t i = 3; i + 3 <= n && st == MS_OK; i++)
            if (memcmp(buf + i, meta, 3) == 0) {
                st = tok_bpe_word(tok, buf + w, i - w, o, err);
                w = i;
                i += 2;
            }
        if (st == MS_OK)
            st = tok_bpe_word(tok, buf + w, n - w, o, err);
    }
    ms_free(buf);
    return st;
}

/* Text between normalized added tokens: pre-tokenize + BPE. */
static ms_status tok_piece_pretok(const ms_tok_hf *tok, const char *s, size_t len, tok_out *o, ms_error *err) {
    if (tok->spm)
        return tok_spm_piece(tok, s, len, o, err);
    return tok_pretok_run(tok, 0, s, len, o, err);
}

/* Text between raw added tokens: normalize, split out normalized added tokens, pre-tokenize. */
static ms_status tok_piece_normalize(const ms_tok_hf *tok, const char *s, size_t len, tok_out *o, ms_error *err) {
    if (!tok->nfc)
        return tok_split_added(tok, &tok->norm_set, s, len, tok_piece_pretok, o, err);
    char *norm = NULL;
    size_t norm_len = 0;
    ms_status st = ms_tok_hf_nfc(s, len, &norm, &norm_len, err);
    if (st != MS_OK)
        return st;
    st = tok_split_added(tok, &tok->norm_set, norm, norm_len, tok_piece_pretok, o, err);
    ms_free(norm);
    return st;
}

ms_status ms_tok_hf_encode(const ms_tok_hf *tok, const char *text, size_t len, bool add_special, int32_t **ids,
                           size_t *n, ms_error *err) {
    *ids = NULL;
    *n = 0;
    MS_ASSERT(text != NULL || len == 0);
    for (size_t i = 0; i < len;) {
        size_t bad = 0;
        size_t cl = tok_utf8_check((const unsigned char *)text, len, i, &bad);
        if (cl == 0)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: cannot encode: text is not valid UTF-8 at byte offset %zu",
                           tok->path, i);
        i += cl;
    }
    tok_out o = {0};
    o.text0 = text;
    ms_status st = MS_OK;
    if (add_special)
        for (size_t i = 0; i < tok->n_tmpl_pre && st == MS_OK; i++)
            st = tok_push(tok, &o, tok->tmpl_pre[i], err);
    if (st == MS_OK)
        st = tok_split_added(tok, &tok->raw_set, text, len, tok_piece_normalize, &o, err);
    if (add_special)
        for (size_t i = 0; i < tok->n_tmpl_post && st == MS_OK; i++)
            st = tok_push(tok, &o, tok->tmpl_post[i], err);
    if (st != MS_OK) {
        ms_free(o.ids);
        return st;
    }
    *ids = o.ids;
    *n = o.n;
    return MS_OK;
}

/* ---- decode ---- */

/* from_utf8_lossy of raw[0 .. n) into out (when not NULL); returns the output length and counts
 * the replacements in *n_bad. */
static size_t tok_lossy(const char *raw, size_t n, char *out, size_t *n_bad) {
    const unsigned char *s = (const unsigned char *)raw;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t bad = 0;
        size_t cl = tok_utf8_check(s, n, i, &bad);
        if (cl > 0) {
            if (out != NULL)
                memcpy(out + o, raw + i, cl);
            o += cl;
            i += cl;
        } else {
            if (out != NULL)
                memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i += bad;
            (*n_bad)++;
        }
    }
    return o;
}

ms_status ms_tok_hf_decode(const ms_tok_hf *tok, const int32_t *ids, size_t n, bool skip_special, char **text,
                           size_t *len, ms_error *err) {
    *text = NULL;
    *len = 0;
    MS_ASSERT(ids != NULL || n == 0);
    size_t raw_len = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < tok->n_ids && tok->id_str[ids[i]] != NULL &&
            !(skip_special && tok->special[ids[i]]))
            raw_len += tok->dec_len[ids[i]];
    char *raw = ms_malloc(raw_len + 1);
    if (raw == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory decoding %zu ids", tok->path, n);
    size_t p = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < tok->n_ids && tok->id_str[ids[i]] != NULL &&
            !(skip_special && tok->special[ids[i]])) {
            memcpy(raw + p, tok->dec_blob + tok->dec_off[ids[i]], tok->dec_len[ids[i]]);
            p += tok->dec_len[ids[i]];
        }
    if (tok->strip_space && raw_len > 0 && raw[0] == ' ') {
        /* the Strip decoder after Fuse (Llama 2), Metaspace's first-token strip, llama.cpp's
         * remove_space: the space of the dummy prefix */
        memmove(raw, raw + 1, raw_len - 1);
        raw_len--;
    }
    size_t n_bad = 0;
    size_t out_len = tok_lossy(raw, raw_len, NULL, &n_bad);
    char *out = raw;
    if (n_bad > 0) {
        out = ms_malloc(out_len + 1);
        if (out == NULL) {
            ms_free(raw);
            return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory decoding %zu ids", tok->path, n);
        }
        tok_lossy(raw, raw_len, out, &n_bad);
        ms_free(raw);
    }
    out[out_len] = '\0';
    *text = out;
    *len = out_len;
    return MS_OK;
}

/* ---- accessors ---- */

int32_t ms_tok_hf_token_id(const ms_tok_hf *tok, const char *token) {
    for (size_t i = 0; i < tok->n_added; i++)
        if (strcmp(tok->added[i].content, token) == 0)
            return tok->added[i].id;
    return tok_vocab_get(tok, token, strlen(token));
}

const char *ms_tok_hf_token_str(const ms_tok_hf *tok, int32_t id) {
    return id >= 0 && id < tok->n_ids ? tok->id_str[id] : NULL;
}

const char *ms_tok_hf_token_bytes(const ms_tok_hf *tok, int32_t id, size_t *len) {
    *len = 0;
    if (id < 0 || id >= tok->n_ids || tok->id_str[id] == NULL)
        return NULL;
    *len = tok->dec_len[id];
    return tok->dec_blob + tok->dec_off[id];
}

bool ms_tok_hf_is_special(const ms_tok_hf *tok, int32_t id) {
    return id >= 0 && id < tok->n_ids && tok->special[id];
}

void ms_tok_hf_clear_cache(ms_tok_hf *tok) {
    if (tok == NULL)
        return;
    pthread_mutex_lock(&tok->cache_mu);
    for (size_t i = 0; i < TOK_CACHE_SLOTS; i++) {
        ms_free(tok->cache[i]);
        tok->cache[i] = NULL;
    }
    tok->n_cache = 0;
    pthread_mutex_unlock(&tok->cache_mu);
}

int32_t ms_tok_hf_vocab_size(const ms_tok_hf *tok) { return tok->n_ids; }
const char *ms_tok_hf_bos_token(const ms_tok_hf *tok) { return tok->bos_token; }
const char *ms_tok_hf_eos_token(const ms_tok_hf *tok) { return tok->eos_token; }
int32_t ms_tok_hf_bos_id(const ms_tok_hf *tok) { return tok->bos_id; }
int32_t ms_tok_hf_eos_id(const ms_tok_hf *tok) { return tok->eos_id; }
const char *ms_tok_hf_chat_template(const ms_tok_hf *tok) { return tok->chat_template; }

/* ---- end of generation ---- */

/* End-of-turn spellings llama.cpp treats as end of generation (llama-vocab.cpp, special_eog_ids). */
static const char *const tok_eog_names[] = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
                                            "<|endoftext|>", "<|eom_id|>", "<EOT>", "<|end_of_text|>"};

bool ms_tok_hf_is_eog(const ms_tok_hf *tok, int32_t id) {
    if (id < 0 || id >= tok->n_ids)
        return false;
    if (id == tok->eos_id || id == tok->eot_id)
        return true;
    if (!tok->special[id] || tok->id_str[id] == NULL)
        return false;
    for (size_t i = 0; i < MS_ARRAY_LEN(tok_eog_names); i++)
        if (strcmp(tok->id_str[id], tok_eog_names[i]) == 0)
            return true;
    return false;
}

/* ---- vocabulary arrays (GGUF tokenizer.ggml.*) ---- */

/* GPT-2's regex without the final \s+ alternative, as llama.cpp writes it (the text it leaves is
 * kept as a piece anyway). */
#define TOK_RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define TOK_RE_LLAMA3                                                                                              \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "           \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define TOK_RE_QWEN2                                                                                               \
    "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "               \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* tokenizer.ggml.pre -> the regexes of llama.cpp's llm_tokenizer_bpe constructor (src/llama-vocab.cpp,
 * github.com/ggml-org/llama.cpp), applied in order, and whether llama.cpp sets ignore_merges. */
typedef struct tok_pre_def {
    const char *name;
    bool ignore_merges;
    const char *regex[4];  /* NULL-terminated when shorter */
} tok_pre_def;

static const tok_pre_def tok_pre_defs[] = {
    {"default", false, {"[\\p{P}\\$\\+<=>\\^~\\|]+", TOK_RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]"}},
    {"gpt2", false, {TOK_RE_GPT2, NULL, NULL, NULL}},
    {"smollm", false, {"\\p{N}", TOK_RE_GPT2, NULL, NULL}},
    {"llama-bpe", true, {TOK_RE_LLAMA3, NULL, NULL, NULL}},
    {"llama3", true, {TOK_RE_LLAMA3, NULL, NULL, NULL}},
    {"llama-v3", true, {TOK_RE_LLAMA3, NULL, NULL, NULL}},
    {"qwen2", false, {TOK_RE_QWEN2, NULL, NULL, NULL}},
};

ms_tok_vocab ms_tok_vocab_default(void) {
    ms_tok_vocab v;
    memset(&v, 0, sizeof v);
    v.bos_id = v.eos_id = v.eot_id = v.unk_id = v.pad_id = -1;
    v.add_space_prefix = true;
    return v;
}

/* Insert, a later duplicate spelling replacing the earlier (llama.cpp's token_to_id[text] = id). */
static void tok_vocab_put_last(ms_tok_hf *tok, const char *s, size_t len, int32_t id) {
    size_t mask = tok->vocab_cap - 1;
    for (size_t i = tok_hash(s, len) & mask;; i = (i + 1) & mask) {
        tok_str_slot *e = &tok->vocab[i];
        if (e->s == NULL || (e->len == len && memcmp(e->s, s, len) == 0)) {
            e->s = s;
            e->len = (uint32_t)len;
            e->id = id;
            return;
        }
    }
}

static ms_status tok_check_vocab_id(const ms_tok_hf *tok, int32_t id, size_t n, const char *what, ms_error *err) {
    if (id < -1 || (id >= 0 && (size_t)id >= n))
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: tokenizer.ggml.%s %d is not a token id (0 .. %zu)", tok->path, what,
                       (int)id, n - 1);
    return MS_OK;
}

static int tok_cmp_float_desc(const void *x, const void *y) {
    float a = *(const float *)x, b = *(const float *)y;
    return (a < b) - (a > b);
}

/*
 * SentencePiece merges from scores: every split of a token into two tokens is a merge whose
 * priority is the token's score, higher first (llama.cpp's llm_tokenizer_spm bigram queue; ties go
 * to the leftmost pair, which the (rank, position) heap gives when equal scores share a rank).
 */
static ms_status tok_spm_merges(ms_tok_hf *tok, const ms_tok_vocab *v, const size_t *lens, ms_error *err) {
    size_t n = v->n_tokens, n_pairs = 0;
    for (size_t i = 0; i < n; i++)
        n_pairs += lens[i];
    float *uniq = ms_malloc(n * sizeof *uniq);
    tok->merge_cap = tok_pow2_at_least(2 * n_pairs + 1);
    tok->merges = ms_malloc(tok->merge_cap * sizeof *tok->merges);
    if (uniq == NULL || tok->merges == NULL) {
        ms_free(uniq);
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory for the merges of %zu tokens", tok->path, n);
    }
    memset(tok->merges, 0xFF, tok->merge_cap * sizeof *tok->merges);
    memcpy(uniq, v->scores, n * sizeof *uniq);
    qsort(uniq, n, sizeof *uniq, tok_cmp_float_desc);
    size_t n_uniq = 0;
    for (size_t i = 0; i < n; i++)
        if (n_uniq == 0 || uniq[n_uniq - 1] != uniq[i])
            uniq[n_uniq++] = uniq[i];
    for (size_t i = 0; i < n; i++) {
        const char *s = v->tokens[i];
        size_t len = lens[i];
        int32_t id = len > 0 ? tok_vocab_get(tok, s, len) : -1;
        if (id < 0 || (size_t)id != i)
            continue;  /* empty, or a duplicate spelling that a later id took */
        float sc = v->scores[i];
        size_t lo = 0, hi = n_uniq;  /* rank = position of sc in uniq (descending) */
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (uniq[mid] > sc)
                lo = mid + 1;
            else
                hi = mid;
        }
        for (size_t k = tok_utf8_len((unsigned char)s[0]); k < len; k += tok_utf8_len((unsigned char)s[k])) {
            int32_t a = tok_vocab_get(tok, s, k);
            int32_t b = a >= 0 ? tok_vocab_get(tok, s + k, len - k) : -1;
            if (b >= 0)
                tok_merge_put(tok, a, b, (int32_t)lo, id);
        }
    }
    ms_free(uniq);
    return MS_OK;
}

/* gpt2 merges: "a b", rank = index. */
static ms_status tok_gpt2_merges(ms_tok_hf *tok, const ms_tok_vocab *v, ms_error *err) {
    if (v->n_merges > INT32_MAX)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: tokenizer.ggml.merges has %zu entries (at most %d)", tok->path,
                       v->n_merges, INT32_MAX);
    if (v->n_merges > 0 && v->merges == NULL)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: tokenizer.ggml.merges: %zu entries but no array", tok->path,
                       v->n_merges);
    tok->merge_cap = tok_pow2_at_least(2 * v->n_merges + 1);
    tok->merges = ms_malloc(tok->merge_cap * sizeof *tok->merges);
    if (tok->merges == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory for %zu merges", tok->path, v->n_merges);
    memset(tok->merges, 0xFF, tok->merge_cap * sizeof *tok->merges);
    char *cat = NULL;
    size_t cat_cap = 0;
    ms_status st = MS_OK;
    for (size_t r = 0; r < v->n_merges && st == MS_OK; r++) {
        const char *m = v->merges[r];
        if (m == NULL) {
            st = MS_FAIL(err, MS_ERR_FORMAT, "%s: tokenizer.ggml.merges[%zu] is missing", tok->path, r);
            break;
        }
        size_t len = v->merge_lens != NULL ? v->merge_lens[r] : strlen(m);
        const char *sp = len > 1 ? memchr(m + 1, ' ', len - 1) : NULL;  /* llama.cpp: find(' ', 1) */
        if (sp == NULL || memchr(m, '\0', len) != NULL) {
            st = MS_FAIL(err, MS_ERR_FORMAT, "%s: tokenizer.ggml.merges[%zu] \"%.*s\" is not two tokens separated "
                         "by a space", tok->path, r, (int)MS_MIN(len, 60), m);
            break;
        }
        size_t a_len = (size_t)(sp - m), b_len = len - a_len - 1;
        int32_t ia = tok_vocab_get(tok, m, a_len);
        int32_t ib = tok_vocab_get(tok, sp + 1, b_len);
        if (ia < 0 || ib < 0) {
            st = MS_FAIL(err, MS_ERR_FORMAT, "%s: tokenizer.ggml.merges[%zu] names token \"%.*s\", which is not in "
                         "tokenizer.ggml.tokens", tok->path, r, (int)MS_MIN(ia < 0 ? a_len : b_len, 60),
                         ia < 0 ? m : sp + 1);
            break;
        }
        if (ms_grow((void **)&cat, &cat_cap, len, 1) != MS_OK) {
            st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", tok->path);
            break;
        }
        memcpy(cat, m, a_len);
        memcpy(cat + a_len, sp + 1, b_len);
        int32_t inew = tok_vocab_get(tok, cat, a_len + b_len);
        if (inew < 0) {
            st = MS_FAIL(err, MS_ERR_FORMAT, "%s: tokenizer.ggml.merges[%zu] makes \"%.*s\", which is not in "
                         "tokenizer.ggml.tokens", tok->path, r, (int)MS_MIN(a_len + b_len, 60), cat);
            break;
        }
        tok_merge_put(tok, ia, ib, (int32_t)r, inew);
    }
    ms_free(cat);
    return st;
}

/* gpt2 pre-tokenizer: llama.cpp's regexes as Isolated splits, then ByteLevel without prefix or regex. */
static ms_status tok_gpt2_pretok(ms_tok_hf *tok, const char *pre, ms_error *err) {
    const tok_pre_def *d = NULL;
    for (size_t i = 0; i < MS_ARRAY_LEN(tok_pre_defs); i++)
        if (strcmp(pre, tok_pre_defs[i].name) == 0)
            d = &tok_pre_defs[i];
    if (d == NULL)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: tokenizer.ggml.pre \"%.60s\" is not supported (only default, "
                       "gpt2, smollm, llama-bpe, qwen2)", tok->path, pre);
    size_t n_re = 0;
    while (n_re < MS_ARRAY_LEN(d->regex) && d->regex[n_re] != NULL)
        n_re++;
    tok->pretok = ms_calloc(n_re + 1, sizeof *tok->pretok);
    if (tok->pretok == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", tok->path);
    for (size_t i = 0; i < n_re; i++) {
        tok_pretok *p = &tok->pretok[tok->n_pretok++];
        p->behavior = TOK_SPLIT_ISOLATED;
        MS_TRY(tok_compile(tok, d->regex[i], PCRE2_ZERO_TERMINATED, false, "tokenizer.ggml.pre", &p->re, err));
    }
    tok->pretok[tok->n_pretok++].byte_level = true;
    tok->ignore_merges = d->ignore_merges;
    return MS_OK;
}

static ms_status tok_from_vocab(ms_tok_hf *tok, const ms_tok_vocab *v, size_t **lens_out, ms_error *err) {
    bool gpt2 = v->model != NULL && strcmp(v->model, "gpt2") == 0;
    bool llama = v->model != NULL && strcmp(v->model, "llama") == 0;
    if (!gpt2 && !llama)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: tokenizer.ggml.model \"%.60s\" is not supported (only gpt2 and "
                       "llama)", tok->path, v->model != NULL ? v->model : "(missing)");
    size_t n = v->n_tokens;
    if (n == 0 || n > TOK_MAX_ID || v->tokens == NULL)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: tokenizer.ggml.tokens has %zu entries (expected 1 .. %d)", tok->path,
                       n, TOK_MAX_ID);
    if (llama && v->scores == NULL)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: tokenizer.ggml.scores is missing (model llama merges by score)",
                       tok->path);
    MS_TRY(tok_check_vocab_id(tok, v->bos_id, n, "bos_token_id", err));
    MS_TRY(tok_check_vocab_id(tok, v->eos_id, n, "eos_token_id", err));
    MS_TRY(tok_check_vocab_id(tok, v->eot_id, n, "eot_token_id", err));
    MS_TRY(tok_check_vocab_id(tok, v->unk_id, n, "unknown_token_id", err));
    MS_TRY(tok_check_vocab_id(tok, v->pad_id, n, "padding_token_id", err));
    if ((v->add_bos && v->bos_id < 0) || (v->add_eos && v->eos_id < 0)) {
        const char *which = v->add_bos && v->bos_id < 0 ? "bos" : "eos";
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: tokenizer.ggml.add_%s_token is set but there is no %s_token_id",
                       tok->path, which, which);
    }
    size_t *lens = ms_malloc(n * sizeof *lens);
    *lens_out = lens;
    if (lens == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory for %zu tokens", tok->path, n);
    size_t blob = 0, n_added = 0;
    for (size_t i = 0; i < n; i++) {
        const char *t = v->tokens[i];
        if (t == NULL)
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: tokenizer.ggml.tokens[%zu] is missing", tok->path, i);
        size_t len = v->token_lens != NULL ? v->token_lens[i] : strlen(t);
        if (len > (1u << 20))
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: tokenizer.ggml.tokens[%zu] is %zu bytes long (at most 1 MiB)",
                           tok->path, i, len);
        if (memchr(t, '\0', len) != NULL)
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: tokenizer.ggml.tokens[%zu] holds a NUL byte", tok->path, i);
        for (size_t k = 0; k < len;) {
            size_t bad = 0, cl = tok_utf8_check((const unsigned char *)t, len, k, &bad);
            if (cl == 0)
                return MS_FAIL(err, MS_ERR_FORMAT, "%s: tokenizer.ggml.tokens[%zu] is not valid UTF-8 (byte %zu)",
                               tok->path, i, k);
            k += cl;
        }
        int32_t type = v->token_types != NULL ? v->token_types[i] : MS_TOK_TYPE_NORMAL;
        if (type < MS_TOK_TYPE_UNDEFINED || type > MS_TOK_TYPE_BYTE)
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: tokenizer.ggml.token_type[%zu] = %d is not a token type (0 .. 6)",
                           tok->path, i, (int)type);
        if (llama && v->scores[i] != v->scores[i])
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: tokenizer.ggml.scores[%zu] is NaN", tok->path, i);
        n_added += len > 0 && (type == MS_TOK_TYPE_CONTROL || type == MS_TOK_TYPE_UNKNOWN ||
                               type == MS_TOK_TYPE_USER_DEFINED);
        lens[i] = len;
        blob += len + 1;
    }
    tok->n_ids = (int32_t)n;
    tok->spm = llama;
    tok->str_blob = ms_malloc(blob + 1);
    tok->vocab_cap = tok_pow2_at_least(2 * n + 1);
    tok->vocab = ms_calloc(tok->vocab_cap, sizeof *tok->vocab);
    tok->added = n_added > 0 ? ms_calloc(n_added, sizeof *tok->added) : NULL;
    if (tok->str_blob == NULL || tok->vocab == NULL || (n_added > 0 && tok->added == NULL))
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory for %zu tokens", tok->path, n);
    size_t pos = 0;
    for (size_t i = 0; i < n; i++) {
        char *s = tok->str_blob + pos;
        memcpy(s, v->tokens[i], lens[i]);
        s[lens[i]] = '\0';
        pos += lens[i] + 1;
        if (lens[i] > 0)
            tok_vocab_put_last(tok, s, lens[i], (int32_t)i);
        int32_t type = v->token_types != NULL ? v->token_types[i] : MS_TOK_TYPE_NORMAL;
        if (lens[i] > 0 && (type == MS_TOK_TYPE_CONTROL || type == MS_TOK_TYPE_UNKNOWN ||
                            type == MS_TOK_TYPE_USER_DEFINED)) {
            tok_added *t = &tok->added[tok->n_added];
            t->content = ms_strndup(s, lens[i]);
            if (t->content == NULL)
                return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", tok->path);
            tok->n_added++;
            t->id = (int32_t)i;
            t->special = type != MS_TOK_TYPE_USER_DEFINED;
        }
    }
    if (llama) {
        MS_TRY(tok_spm_merges(tok, v, lens, err));
        tok->prefix = v->add_space_prefix ? TOK_PREFIX_ALWAYS : TOK_PREFIX_NEVER;
        tok->strip_space = v->add_space_prefix;
        tok->unk_id = v->unk_id;
    } else {
        MS_TRY(tok_gpt2_merges(tok, v, err));
        tok->bytes_may_miss = true;  /* real GGUFs lack some control bytes (SmolLM2: 0x04 and 7 more) */
        MS_TRY(tok_gpt2_pretok(tok, v->pre != NULL ? v->pre : "default", err));
    }
    if (v->add_bos) {
        if ((tok->tmpl_pre = ms_malloc(sizeof *tok->tmpl_pre)) == NULL)
            return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", tok->path);
        tok->tmpl_pre[tok->n_tmpl_pre++] = v->bos_id;
    }
    if (v->add_eos) {
        if ((tok->tmpl_post = ms_malloc(sizeof *tok->tmpl_post)) == NULL)
            return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", tok->path);
        tok->tmpl_post[tok->n_tmpl_post++] = v->eos_id;
    }
    tok->bos_id = v->bos_id;
    tok->eos_id = v->eos_id;
    tok->eot_id = v->eot_id;
    if ((v->bos_id >= 0 && (tok->bos_token = ms_strndup(v->tokens[v->bos_id], lens[v->bos_id])) == NULL) ||
        (v->eos_id >= 0 && (tok->eos_token = ms_strndup(v->tokens[v->eos_id], lens[v->eos_id])) == NULL) ||
        (v->chat_template != NULL && (tok->chat_template = ms_strdup(v->chat_template)) == NULL))
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", tok->path);
    MS_TRY(tok_added_patterns(tok, err));
    MS_TRY(tok_build_set(tok, false, &tok->raw_set, err));
    MS_TRY(tok_build_set(tok, true, &tok->norm_set, err));
    MS_TRY(tok_build_tables(tok, err));
    return tok_compile(tok, "\\w", PCRE2_ZERO_TERMINATED, false, "word", &tok->word_re, err);
}

ms_status ms_tok_hf_from_vocab(ms_tok_hf **out, const ms_tok_vocab *v, ms_error *err) {
    *out = NULL;
    const char *src = v->source != NULL ? v->source : "vocab";
    ms_tok_hf *tok = ms_calloc(1, sizeof *tok);
    if (tok == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", src);
    tok->bos_id = tok->eos_id = tok->unk_id = tok->eot_id = -1;
    tok->path = ms_strdup(src);
    tok->gctx = pcre2_general_context_create(tok_pcre2_malloc, tok_pcre2_free, NULL);
    tok->cache = ms_calloc(TOK_CACHE_SLOTS, sizeof *tok->cache);
    ms_status st = MS_OK;
    size_t *lens = NULL;
    if (tok->path == NULL || tok->gctx == NULL || tok->cache == NULL) {
        st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", src);
    } else if (pthread_mutex_init(&tok->cache_mu, NULL) != 0) {
        st = MS_FAIL(err, MS_ERR_INTERNAL, "%s: cannot create the cache mutex", src);
    } else {
        tok->cache_mu_ok = true;
        st = tok_from_vocab(tok, v, &lens, err);
    }
    ms_free(lens);
    if (st != MS_OK) {
        ms_tok_hf_free(tok);
        return st;
    }
    *out = tok;
    return MS_OK;
}
