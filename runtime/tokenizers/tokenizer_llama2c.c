/*
 * tokenizer_llama2c.c - llama2.c tokenizer.bin: strict loading, run.c-exact encode and decode.
 *
 * Constraints: encode and decode must give run.c's ids and text byte for byte (the golden outputs in
 * ../shared/fixtures/llama2c are checked against them), so the algorithm follows run.c step by step,
 * including its quirks (the BOS token takes part in merges; string lookups stop at NUL, which the
 * loader therefore rejects inside tokens). Unlike run.c, nothing overflows: buffers are sized from
 * the validated max_token_length, and duplicate strings resolve to the lowest id.
 */
#include "tokenizer_llama2c.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* A vocabulary entry in the lookup index. */
typedef struct tok_entry {
    const char *str;  /* NUL-terminated token string */
    int id;
} tok_entry;

struct ms_llama2c_tok {
    char *path;                        /* as given */
    int vocab_size;
    int max_token_length;              /* from the file header */
    char **vocab;                      /* [vocab_size] NUL-terminated strings (into blob) */
    int32_t *lens;                     /* [vocab_size] string lengths */
    float *scores;                     /* [vocab_size] merge scores */
    char *blob;                        /* string storage */
    tok_entry *sorted;                 /* [vocab_size] sorted by (str, id) */
    unsigned char byte_pieces[512];    /* byte i as the string {i, 0} at [2 i] */
};

static int tok_cmp_entry(const void *a, const void *b) {
    const tok_entry *x = a, *y = b;
    int c = strcmp(x->str, y->str);
    if (c != 0)
        return c;
    return (x->id > y->id) - (x->id < y->id);
}

static int tok_cmp_key(const void *key, const void *elem) {
    return strcmp((const char *)key, ((const tok_entry *)elem)->str);
}

/* Id of the token spelled `str`, or -1 (run.c str_lookup; duplicates give the lowest id). */
static int tok_lookup(const ms_llama2c_tok *tok, const char *str) {
    const tok_entry *hit = bsearch(str, tok->sorted, (size_t)tok->vocab_size, sizeof *tok->sorted, tok_cmp_key);
    if (hit == NULL)
        return -1;
    while (hit > tok->sorted && strcmp(hit[-1].str, str) == 0)
        hit--;
    return hit->id;
}

/* ---- loading ---- */

/* Read the whole file into a fresh buffer. */
static ms_status tok_read_file(const char *path, unsigned char **data, size_t *size, ms_error *err) {
    *data = NULL;
    FILE *fp = fopen(path, "rb");
    if (fp == NULL)
        return MS_FAIL(err, MS_ERR_IO, "%s: cannot open tokenizer: %s", path, strerror(errno));
    ms_status st = MS_OK;
    unsigned char *buf = NULL;
    struct stat sb;
    if (fstat(fileno(fp), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        st = MS_FAIL(err, MS_ERR_IO, "%s: cannot read tokenizer: not a regular file", path);
        goto done;
    }
    size_t len = (size_t)sb.st_size;
    buf = ms_malloc(len + 1);
    if (buf == NULL) {
        st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory (%zu bytes)", path, len);
        goto done;
    }
    if (fread(buf, 1, len, fp) != len) {
        st = MS_FAIL(err, MS_ERR_IO, "%s: cannot read tokenizer: %s", path,
                     ferror(fp) ? strerror(errno) : "unexpected end of file");
        ms_free(buf);
        buf = NULL;
        goto done;
    }
    *data = buf;
    *size = (size_t)len;
done:
    fclose(fp);
    return st;
}

/* Walk the token records of `data` (after the 4-byte header); count them (up to `limit`, 0 = all)
 * and check every record. On success *n_tokens is the count and *end the offset after the last. */
static ms_status tok_scan(const char *path, const unsigned char *data, size_t size, int max_len, int limit,
                          int *n_tokens, size_t *end, ms_error *err) {
    size_t pos = 4;
    int n = 0;
    while (limit == 0 ? pos < size : n < limit) {
        if (size - pos < 8) {
            if (limit == 0 && n == 0)
                return MS_FAIL(err, MS_ERR_FORMAT, "%s: truncated inside the first token record (%zu bytes "
                               "after the header, a record needs at least 8)", path, size - pos);
            if (limit == 0)
                return MS_FAIL(err, MS_ERR_FORMAT, "%s: truncated after token %d (%zu stray bytes: a cut token "
                               "record, or extra bytes after the last token)", path, n - 1, size - pos);
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: truncated at token %d of %d (file is %zu bytes)", path, n,
                           limit, size);
        }
        int32_t len;
        memcpy(&len, data + pos + 4, 4);
        if (len < 0 || len > max_len)
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: token %d has length %d, outside 0 .. max_token_length %d", path,
                           n, len, max_len);
        pos += 8;
        if (size - pos < (size_t)len)
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: truncated inside token %d (%d bytes, %zu left)", path, n, len,
                           size - pos);
        if (memchr(data + pos, 0, (size_t)len) != NULL)
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: token %d contains a NUL byte", path, n);
        pos += (size_t)len;
        if (n == INT32_MAX - 1)
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: too many tokens", path);
        n++;
    }
    if (limit != 0 && pos != size)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: %zu bytes after token %d: the file holds more tokens than the "
                       "model's vocab_size %d (wrong tokenizer for this model?)", path, size - pos, limit - 1, limit);
    *n_tokens = n;
    *end = pos;
    return MS_OK;
}

ms_status ms_llama2c_tok_init(ms_llama2c_tok **out, const char *path, int vocab_size, ms_error *err) {
    *out = NULL;
    if (vocab_size < 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: vocab_size %d is negative", path, vocab_size);
    unsigned char *data = NULL;
    size_t size = 0;
    MS_TRY(tok_read_file(path, &data, &size, err));
    ms_status st = MS_OK;
    ms_llama2c_tok *tok = ms_calloc(1, sizeof *tok);
    if (tok == NULL) {
        ms_free(data);
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", path);
    }
    tok->path = ms_strdup(path);
    if (tok->path == NULL) {
        st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", path);
        goto fail;
    }
    if (size < 4) {
        st = MS_FAIL(err, MS_ERR_FORMAT, "%s: file is %zu bytes, too short for a llama2.c tokenizer header", path,
                     size);
        goto fail;
    }
    int32_t max_len;
    memcpy(&max_len, data, 4);
    if (max_len <= 0 || max_len > (1 << 20)) {
        st = MS_FAIL(err, MS_ERR_FORMAT, "%s: max_token_length %d is not sane (not a llama2.c tokenizer?)", path,
                     max_len);
        goto fail;
    }
    tok->max_token_length = max_len;
    int n = 0;
    size_t end = 0;
    st = tok_scan(path, data, size, max_len, vocab_size, &n, &end, err);
    if (st != MS_OK)
        goto fail;
    if (n == 0) {
        st = MS_FAIL(err, MS_ERR_FORMAT, "%s: holds no tokens", path);
        goto fail;
    }
    tok->vocab_size = n;
    size_t un = (size_t)n;
    tok->vocab = ms_calloc(un, sizeof *tok->vocab);
    tok->lens = ms_calloc(un, sizeof *tok->lens);
    tok->scores = ms_calloc(un, sizeof *tok->scores);
    tok->sorted = ms_calloc(un, sizeof *tok->sorted);
    tok->blob = ms_malloc(end + un);  /* strings + NULs fit in the record bytes plus one per token */
    if (!tok->vocab || !tok->lens || !tok->scores || !tok->sorted || !tok->blob) {
        st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory for %d tokens", path, n);
        goto fail;
    }
    size_t pos = 4, bpos = 0;
    for (int i = 0; i < n; i++) {
        memcpy(&tok->scores[i], data + pos, 4);
        memcpy(&tok->lens[i], data + pos + 4, 4);
        pos += 8;
        tok->vocab[i] = tok->blob + bpos;
        memcpy(tok->blob + bpos, data + pos, (size_t)tok->lens[i]);
        tok->blob[bpos + (size_t)tok->lens[i]] = '\0';
        bpos += (size_t)tok->lens[i] + 1;
        pos += (size_t)tok->lens[i];
        tok->sorted[i].str = tok->vocab[i];
        tok->sorted[i].id = i;
    }
    qsort(tok->sorted, un, sizeof *tok->sorted, tok_cmp_entry);
    for (int i = 0; i < 256; i++) {
        tok->byte_pieces[2 * i] = (unsigned char)i;
        tok->byte_pieces[2 * i + 1] = 0;
    }
    ms_free(data);
    *out = tok;
    return MS_OK;
fail:
    ms_free(data);
    ms_llama2c_tok_free(tok);
    return st;
}

void ms_llama2c_tok_free(ms_llama2c_tok *tok) {
    if (tok == NULL)
        return;
    ms_free(tok->vocab);
    ms_free(tok->lens);
    ms_free(tok->scores);
    ms_free(tok->sorted);
    ms_free(tok->blob);
    ms_free(tok->path);
    ms_free(tok);
}

int ms_llama2c_tok_vocab_size(const ms_llama2c_tok *tok) {
    return tok->vocab_size;
}

const char *ms_llama2c_tok_piece(const ms_llama2c_tok *tok, int id) {
    if (id < 0 || id >= tok->vocab_size)
        return NULL;
    return tok->vocab[id];
}

float ms_llama2c_tok_score(const ms_llama2c_tok *tok, int id) {
    if (id < 0 || id >= tok->vocab_size)
        return 0.0f;
    return tok->scores[id];
}

/* ---- encode ---- */

/* A candidate merge of the pair starting at token `left`: valid while that token and its right
 * neighbour still hold the ids it was made from. */
typedef struct tok_pair {
    float score;    /* score of the merged token */
    size_t left;    /* original index of the left token */
    int32_t lid;    /* ids of the pair when pushed */
    int32_t rid;
    int32_t merged; /* id of the concatenation */
} tok_pair;

/* Heap order: higher score first, then the leftmost pair (run.c's strict '>' scan). */
static bool tok_pair_before(const tok_pair *a, const tok_pair *b) {
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void tok_heap_push(tok_pair *h, size_t *n, tok_pair v) {
    size_t i = (*n)++;
    while (i > 0 && tok_pair_before(&v, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = v;
}

static tok_pair tok_heap_pop(tok_pair *h, size_t *n) {
    tok_pair top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && tok_pair_before(&h[c + 1], &h[c]))
            c++;
        if (!tok_pair_before(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0)
        h[i] = last;
    return top;
}

/* Push the merge of tokens[l] and tokens[r] when their concatenation is a token that run.c could
 * pick (score above its -1e10 start; NaN never). */
static void tok_push_pair(const ms_llama2c_tok *tok, char *buf, const int32_t *tokens, size_t l, size_t r,
                          tok_pair *heap, size_t *n_heap) {
    size_t la = (size_t)tok->lens[tokens[l]], lb = (size_t)tok->lens[tokens[r]];
    memcpy(buf, tok->vocab[tokens[l]], la);
    memcpy(buf + la, tok->vocab[tokens[r]], lb);
    buf[la + lb] = '\0';
    int id = tok_lookup(tok, buf);
    if (id != -1 && tok->scores[id] > -1e10f)
        tok_heap_push(heap, n_heap, (tok_pair){tok->scores[id], l, tokens[l], tokens[r], id});
}

/*
 * run.c's merge loop: merge the best-scoring adjacent pair (the leftmost among equals) until no
 * pair merges. run.c rescans every pair after each merge, O(n^2): an 80 KB prompt took minutes
 * before it could be refused as too long. The same merges in the same order, in O(n log n): the
 * tokens form a linked list and the candidate pairs a heap; a merge pushes the two pairs it
 * creates, and pairs whose tokens changed are dropped when popped. Compacts tokens[0 .. *n).
 */
static ms_status tok_merge(const ms_llama2c_tok *tok, char *buf, int32_t *tokens, size_t *n, ms_error *err) {
    if (*n < 2)
        return MS_OK;
    const size_t none = SIZE_MAX, cnt = *n;
    size_t *next = ms_malloc(cnt * sizeof *next), *prev = ms_malloc(cnt * sizeof *prev);
    tok_pair *heap = ms_malloc(3 * cnt * sizeof *heap);
    ms_status st = MS_OK;
    if (next == NULL || prev == NULL || heap == NULL) {
        st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory merging %zu tokens", tok->path, cnt);
        goto done;
    }
    size_t n_heap = 0;
    for (size_t i = 0; i < cnt; i++) {
        next[i] = i + 1 < cnt ? i + 1 : none;
        prev[i] = i > 0 ? i - 1 : none;
    }
    for (size_t i = 0; i + 1 < cnt; i++)
        tok_push_pair(tok, buf, tokens, i, i + 1, heap, &n_heap);
    while (n_heap > 0) {
        tok_pair p = tok_heap_pop(heap, &n_heap);
        size_t l = p.left, r = next[l];
        /* stale: the left token was merged away (prev[l] marks it) or either id changed */
        if (prev[l] == l || r == none || tokens[l] != p.lid || tokens[r] != p.rid)
            continue;
        tokens[l] = p.merged;
        next[l] = next[r];
        if (next[r] != none)
            prev[next[r]] = l;
        prev[r] = r; /* removed */
        if (prev[l] != none)
            tok_push_pair(tok, buf, tokens, prev[l], l, heap, &n_heap);
        if (next[l] != none)
            tok_push_pair(tok, buf, tokens, l, next[l], heap, &n_heap);
    }
    size_t k = 0;
    for (size_t i = 0; i != none; i = next[i])
        tokens[k++] = tokens[i];
    *n = k;
done:
    ms_free(next);
    ms_free(prev);
    ms_free(heap);
    return st;
}

ms_status ms_llama2c_tok_encode(const ms_llama2c_tok *tok, const char *text, bool bos, bool eos, int32_t **ids,
                                size_t *n_out, ms_error *err) {
    *ids = NULL;
    *n_out = 0;
    size_t text_len = strlen(text);
    /* run.c: a buffer of max_token_length * 2 + 1 + 2 for two concatenated tokens (or one code point) */
    size_t buf_cap = 2 * (size_t)tok->max_token_length + 3;
    if (buf_cap < 8)
        buf_cap = 8;
    char *buf = ms_malloc(buf_cap);
    int32_t *tokens = ms_malloc((text_len + 3) * sizeof *tokens);
    ms_status st = MS_OK;
    if (buf == NULL || tokens == NULL) {
        st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory encoding %zu bytes", tok->path, text_len);
        goto fail;
    }
    size_t n = 0;
    if (bos)
        tokens[n++] = MS_LLAMA2C_TOK_BOS;
    if (text[0] != '\0') {
        int dummy = tok_lookup(tok, " ");
        if (dummy < 0) {
            st = MS_FAIL(err, MS_ERR_FORMAT, "%s: tokenizer has no \" \" token for the dummy prefix", tok->path);
            goto fail;
        }
        tokens[n++] = dummy;
    }
    /* UTF-8 code points (at most 4 bytes each), with byte fallback */
    size_t len = 0;
    for (const char *c = text; *c != '\0'; c++) {
        if (((unsigned char)*c & 0xC0) != 0x80)
            len = 0;
        buf[len++] = *c;
        buf[len] = '\0';
        if (((unsigned char)c[1] & 0xC0) == 0x80 && len < 4)
            continue;
        int id = tok_lookup(tok, buf);
        if (id != -1) {
            tokens[n++] = id;
        } else {
            for (size_t i = 0; i < len; i++) {
                int b = (unsigned char)buf[i] + 3;
                if (b >= tok->vocab_size) {
                    st = MS_FAIL(err, MS_ERR_FORMAT, "%s: byte fallback id %d is outside the vocabulary (%d tokens)",
                                 tok->path, b, tok->vocab_size);
                    goto fail;
                }
                tokens[n++] = b;
            }
        }
        len = 0;
    }
    st = tok_merge(tok, buf, tokens, &n, err);
    if (st != MS_OK)
        goto fail;
    if (eos)
        tokens[n++] = MS_LLAMA2C_TOK_EOS;
    ms_free(buf);
    *ids = tokens;
    *n_out = n;
    return MS_OK;
fail:
    ms_free(buf);
    ms_free(tokens);
    return st;
}

/* ---- decode ---- */

const char *ms_llama2c_tok_decode(const ms_llama2c_tok *tok, int prev_token, int token) {
    if (token < 0 || token >= tok->vocab_size)
        return NULL;
    const char *piece = tok->vocab[token];
    /* after BOS, sentencepiece strips the leading whitespace */
    if (prev_token == MS_LLAMA2C_TOK_BOS && piece[0] == ' ')
        piece++;
    /* raw byte tokens look like "<0x01>"; parse exactly as run.c does */
    unsigned char byte_val;
    if (sscanf(piece, "<0x%02hhX>", &byte_val) == 1)
        piece = (const char *)tok->byte_pieces + byte_val * 2;
    return piece;
}

bool ms_llama2c_tok_piece_printable(const char *piece) {
    if (piece == NULL || piece[0] == '\0')
        return false;
    if (piece[1] == '\0') {
        unsigned char b = (unsigned char)piece[0];
        if (!(isprint(b) || isspace(b)))
            return false;
    }
    return true;
}
