/*
 * gguf.c - validated mmap reader for GGUF v2/v3 files.
 *
 * Constraints: the file is untrusted. Every read goes through one bounds-checked cursor; every
 * count is compared with the bytes left before anything is allocated for it (an element needs at
 * least 1 byte, a string 8, a kv 12, a tensor info 28), so a lying count fails fast and never
 * asks for huge memory; sizes are computed with overflow checks. Strings are copied into chunks
 * that never move, so the pointers handed out stay valid while parsing continues.
 */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf_quant.h"

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_ELEMS ((uint64_t)1 << 62)

typedef struct str_chunk {
    struct str_chunk *next;
    size_t used, cap;
    char data[];
} str_chunk;

struct ms_gguf {
    char *path;
    void *map;              /* our mmap (NULL for init_from_memory) */
    size_t map_size;
    const uint8_t *bytes;   /* the file: [size] */
    size_t size;
    uint32_t version;
    size_t alignment;
    ms_gguf_kv *kvs;        /* [n_kv] file order */
    size_t n_kv;
    size_t *kv_sorted;      /* [n_kv] indices sorted by key */
    ms_gguf_tensor *tensors;  /* [n_tensors] file order */
    size_t n_tensors;
    size_t *t_sorted;       /* [n_tensors] indices sorted by name */
    str_chunk *chunks;      /* string storage */
};

/* ---- value types ---- */

/* ORDER MS_GGUF_TYPE */
static const char *const vtype_names[MS_GGUF_VTYPE_COUNT] = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
    "bool", "string", "array", "uint64", "int64", "float64",
};
/* ORDER MS_GGUF_TYPE: element bytes; 0 for string and array */
static const uint8_t vtype_size[MS_GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *ms_gguf_vtype_name(uint32_t t) {
    return t < MS_GGUF_VTYPE_COUNT ? vtype_names[t] : "?";
}

static bool vtype_is_int(ms_gguf_vtype t) {
    return t <= MS_GGUF_INT32 || t == MS_GGUF_UINT64 || t == MS_GGUF_INT64;
}

/* ---- cursor ---- */

typedef struct cursor {
    const uint8_t *p;
    size_t size, pos;
    const char *path;
    ms_error *err;
} cursor;

static ms_status cur_need(cursor *c, size_t n, const char *what) {
    if (n > c->size - c->pos)
        return MS_FAIL(c->err, MS_ERR_FORMAT, "%s: truncated: %s needs %zu bytes at offset %zu, the file has %zu",
                       c->path, what, n, c->pos, c->size);
    return MS_OK;
}

static uint64_t le_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint32_t le_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static ms_status cur_u32(cursor *c, uint32_t *out, const char *what) {
    MS_TRY(cur_need(c, 4, what));
    *out = le_u32(c->p + c->pos);
    c->pos += 4;
    return MS_OK;
}

static ms_status cur_u64(cursor *c, uint64_t *out, const char *what) {
    MS_TRY(cur_need(c, 8, what));
    *out = le_u64(c->p + c->pos);
    c->pos += 8;
    return MS_OK;
}

/* Copy n bytes into the string arena; returns a NUL-terminated copy or NULL on OOM. */
static char *arena_str(ms_gguf *g, const uint8_t *src, size_t n) {
    str_chunk *ch = g->chunks;
    if (ch == NULL || ch->cap - ch->used < n + 1) {
        size_t cap = MS_MAX((size_t)1 << 16, n + 1);
        ch = ms_malloc(sizeof *ch + cap);
        if (ch == NULL)
            return NULL;
        ch->next = g->chunks;
        ch->used = 0;
        ch->cap = cap;
        g->chunks = ch;
    }
    char *s = ch->data + ch->used;
    memcpy(s, src, n);
    s[n] = '\0';
    ch->used += n + 1;
    return s;
}

/* Read a GGUF string (u64 length + bytes) into the arena. `what` names it in messages. */
static ms_status cur_str(cursor *c, ms_gguf *g, ms_gguf_str *out, const char *what) {
    uint64_t len;
    MS_TRY(cur_u64(c, &len, what));
    if (len > c->size - c->pos)
        return MS_FAIL(c->err, MS_ERR_FORMAT, "%s: %s: string length %llu at offset %zu runs past the end of the "
                       "file (%zu bytes)", c->path, what, (unsigned long long)len, c->pos - 8, c->size);
    char *s = arena_str(g, c->p + c->pos, (size_t)len);
    if (s == NULL)
        return MS_FAIL(c->err, MS_ERR_OOM, "%s: out of memory for %s", c->path, what);
    out->s = s;
    out->len = (size_t)len;
    c->pos += (size_t)len;
    return MS_OK;
}

/* ---- metadata ---- */

static ms_status parse_value(cursor *c, ms_gguf *g, ms_gguf_kv *kv) {
    uint32_t t;
    MS_TRY(cur_u32(c, &t, "value type"));
    if (t >= MS_GGUF_VTYPE_COUNT)
        return MS_FAIL(c->err, MS_ERR_UNSUPPORTED, "%s: metadata key '%s' has unknown value type %u", c->path,
                       kv->key, t);
    kv->type = (ms_gguf_vtype)t;
    uint64_t n = 1;
    uint32_t et = t;
    if (t == MS_GGUF_ARRAY) {
        MS_TRY(cur_u32(c, &et, "array element type"));
        if (et == MS_GGUF_ARRAY)
            return MS_FAIL(c->err, MS_ERR_UNSUPPORTED, "%s: metadata key '%s' is a nested array (not supported)",
                           c->path, kv->key);
        if (et >= MS_GGUF_VTYPE_COUNT)
            return MS_FAIL(c->err, MS_ERR_UNSUPPORTED, "%s: metadata key '%s' is an array of unknown type %u",
                           c->path, kv->key, et);
        MS_TRY(cur_u64(c, &n, "array length"));
        size_t min_elem = et == MS_GGUF_STRING ? 8 : vtype_size[et];
        if (n > (c->size - c->pos) / min_elem)
            return MS_FAIL(c->err, MS_ERR_FORMAT, "%s: metadata key '%s': array of %llu %s elements cannot fit in "
                           "the %zu bytes left", c->path, kv->key, (unsigned long long)n, vtype_names[et],
                           c->size - c->pos);
    }
    kv->elem_type = (ms_gguf_vtype)et;
    kv->n = (size_t)n;
    if (et == MS_GGUF_STRING) {
        ms_gguf_str *strs = ms_calloc(n ? (size_t)n : 1, sizeof *strs);
        if (strs == NULL)
            return MS_FAIL(c->err, MS_ERR_OOM, "%s: out of memory for metadata key '%s'", c->path, kv->key);
        kv->strs = strs;
        for (size_t i = 0; i < (size_t)n; i++)
            MS_TRY(cur_str(c, g, &strs[i], kv->key));
        return MS_OK;
    }
    size_t bytes = (size_t)n * vtype_size[et];
    MS_TRY(cur_need(c, bytes, kv->key));
    kv->data = c->p + c->pos;
    if (et == MS_GGUF_BOOL) {
        for (size_t i = 0; i < bytes; i++)
            if (c->p[c->pos + i] > 1)
                return MS_FAIL(c->err, MS_ERR_FORMAT, "%s: metadata key '%s': bool value %u is not 0 or 1", c->path,
                               kv->key, c->p[c->pos + i]);
    }
    c->pos += bytes;
    return MS_OK;
}

/* Index arrays sorted by key, name or offset: a stable merge sort with no global comparison
 * context (qsort would need one), so two threads may open files at once. */
static void msort(size_t *idx, size_t *tmp, size_t n, const ms_gguf *g, bool by_offset, bool tensors) {
    if (n < 2)
        return;
    size_t h = n / 2;
    msort(idx, tmp, h, g, by_offset, tensors);
    msort(idx + h, tmp, n - h, g, by_offset, tensors);
    size_t i = 0, j = h, k = 0;
    while (i < h || j < n) {
        bool take_left;
        if (i == h)
            take_left = false;
        else if (j == n)
            take_left = true;
        else if (by_offset)
            take_left = g->tensors[idx[i]].file_offset <= g->tensors[idx[j]].file_offset;
        else if (tensors)
            take_left = strcmp(g->tensors[idx[i]].name, g->tensors[idx[j]].name) <= 0;
        else
            take_left = strcmp(g->kvs[idx[i]].key, g->kvs[idx[j]].key) <= 0;
        tmp[k++] = take_left ? idx[i++] : idx[j++];
    }
    memcpy(idx, tmp, n * sizeof *idx);
}

static ms_status build_sorted(ms_gguf *g, size_t n, bool by_offset, bool tensors, size_t **out, ms_error *err) {
    size_t *idx = ms_malloc((n ? n : 1) * sizeof *idx), *tmp = ms_malloc((n ? n : 1) * sizeof *tmp);
    if (idx == NULL || tmp == NULL) {
        ms_free(idx);
        ms_free(tmp);
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory for the index", g->path);
    }
    for (size_t i = 0; i < n; i++)
        idx[i] = i;
    msort(idx, tmp, n, g, by_offset, tensors);
    ms_free(tmp);
    *out = idx;
    return MS_OK;
}

static ms_status parse_kvs(cursor *c, ms_gguf *g, uint64_t n_kv) {
    if (n_kv > (c->size - c->pos) / 12)
        return MS_FAIL(c->err, MS_ERR_FORMAT, "%s: header claims %llu metadata entries, which cannot fit in the "
                       "%zu bytes left", c->path, (unsigned long long)n_kv, c->size - c->pos);
    g->kvs = ms_calloc(n_kv ? (size_t)n_kv : 1, sizeof *g->kvs);
    if (g->kvs == NULL)
        return MS_FAIL(c->err, MS_ERR_OOM, "%s: out of memory for %llu metadata entries", c->path,
                       (unsigned long long)n_kv);
    for (size_t i = 0; i < (size_t)n_kv; i++) {
        ms_gguf_kv *kv = &g->kvs[i];
        ms_gguf_str key;
        char what[48];
        snprintf(what, sizeof what, "metadata key #%zu", i);
        MS_TRY(cur_str(c, g, &key, what));
        kv->key = key.s;
        g->n_kv = i + 1; /* so free releases kv->strs from here on */
        if (key.len == 0 || strlen(key.s) != key.len)
            return MS_FAIL(c->err, MS_ERR_FORMAT, "%s: %s is empty or holds a NUL byte", c->path, what);
        MS_TRY(parse_value(c, g, kv));
    }
    MS_TRY(build_sorted(g, g->n_kv, false, false, &g->kv_sorted, c->err));
    for (size_t i = 1; i < g->n_kv; i++)
        if (strcmp(g->kvs[g->kv_sorted[i - 1]].key, g->kvs[g->kv_sorted[i]].key) == 0)
            return MS_FAIL(c->err, MS_ERR_FORMAT, "%s: metadata key '%s' appears twice", c->path,
                           g->kvs[g->kv_sorted[i]].key);
    const ms_gguf_kv *al = ms_gguf_find_kv(g, "general.alignment");
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    if (al != NULL) {
        if (al->type != MS_GGUF_UINT32)
            return MS_FAIL(c->err, MS_ERR_FORMAT, "%s: metadata key 'general.alignment' is a %s, expected uint32",
                           c->path, vtype_names[al->type]);
        uint32_t a = le_u32(al->data);
        if (a == 0 || (a & (a - 1)) != 0)
            return MS_FAIL(c->err, MS_ERR_FORMAT, "%s: general.alignment %u is not a power of two", c->path, a);
        g->alignment = a;
    }
    return MS_OK;
}

/* ---- tensors ---- */

static ms_status parse_tensor_info(cursor *c, ms_gguf *g, size_t i) {
    ms_gguf_tensor *t = &g->tensors[i];
    char what[48];
    snprintf(what, sizeof what, "tensor name #%zu", i);
    ms_gguf_str name;
    MS_TRY(cur_str(c, g, &name, what));
    t->name = name.s;
    if (name.len == 0 || strlen(name.s) != name.len)
        return MS_FAIL(c->err, MS_ERR_FORMAT, "%s: %s is empty or holds a NUL byte", c->path, what);
    uint32_t n_dims;
    MS_TRY(cur_u32(c, &n_dims, t->name));
    if (n_dims < 1 || n_dims > MS_GGUF_MAX_DIMS)
        return MS_FAIL(c->err, MS_ERR_UNSUPPORTED, "%s: tensor '%s' has %u dimensions (supported: 1 to %d)",
                       c->path, t->name, n_dims, MS_GGUF_MAX_DIMS);
    t->n_dims = (int)n_dims;
    uint64_t n_elems = 1;
    for (int d = 0; d < MS_GGUF_MAX_DIMS; d++) {
        uint64_t ne = 1;
        if (d < t->n_dims)
            MS_TRY(cur_u64(c, &ne, t->name));
        if (ne == 0 || ne > GGUF_MAX_ELEMS || n_elems > GGUF_MAX_ELEMS / ne)
            return MS_FAIL(c->err, MS_ERR_FORMAT, "%s: tensor '%s': dimension %d is %llu, which is empty or makes "
                           "the tensor absurdly large", c->path, t->name, d, (unsigned long long)ne);
        n_elems *= ne;
        t->ne[d] = (int64_t)ne;
    }
    uint32_t type;
    MS_TRY(cur_u32(c, &type, t->name));
    if (!ms_ggml_type_known(type))
        return MS_FAIL(c->err, MS_ERR_UNSUPPORTED, "%s: tensor '%s' has unknown ggml type %u", c->path, t->name,
                       type);
    t->type = type;
    size_t blk = ms_ggml_type_block(type);
    if ((uint64_t)t->ne[0] % blk != 0)
        return MS_FAIL(c->err, MS_ERR_FORMAT, "%s: tensor '%s': row length %lld is not a multiple of the %s block "
                       "size %zu", c->path, t->name, (long long)t->ne[0], ms_ggml_type_name(type), blk);
    uint64_t bytes = n_elems / blk;
    if (bytes > UINT64_MAX / ms_ggml_type_block_bytes(type) ||
        bytes * ms_ggml_type_block_bytes(type) > (uint64_t)SIZE_MAX)
        return MS_FAIL(c->err, MS_ERR_FORMAT, "%s: tensor '%s' is absurdly large", c->path, t->name);
    bytes *= ms_ggml_type_block_bytes(type);
    t->n_elems = (size_t)n_elems;
    t->n_bytes = (size_t)bytes;
    uint64_t off;
    MS_TRY(cur_u64(c, &off, t->name));
    if (off > (uint64_t)SIZE_MAX)
        return MS_FAIL(c->err, MS_ERR_FORMAT, "%s: tensor '%s': offset %llu is absurd", c->path, t->name,
                       (unsigned long long)off);
    t->file_offset = (size_t)off; /* relative for now; made absolute once the data start is known */
    return MS_OK;
}

static ms_status parse_tensors(cursor *c, ms_gguf *g, uint64_t n_tensors) {
    if (n_tensors > (c->size - c->pos) / 28)
        return MS_FAIL(c->err, MS_ERR_FORMAT, "%s: header claims %llu tensors, which cannot fit in the %zu bytes "
                       "left", c->path, (unsigned long long)n_tensors, c->size - c->pos);
    g->tensors = ms_calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *g->tensors);
    if (g->tensors == NULL)
        return MS_FAIL(c->err, MS_ERR_OOM, "%s: out of memory for %llu tensors", c->path,
                       (unsigned long long)n_tensors);
    for (size_t i = 0; i < (size_t)n_tensors; i++) {
        MS_TRY(parse_tensor_info(c, g, i));
        g->n_tensors = i + 1;
    }
    MS_TRY(build_sorted(g, g->n_tensors, false, true, &g->t_sorted, c->err));
    for (size_t i = 1; i < g->n_tensors; i++)
        if (strcmp(g->tensors[g->t_sorted[i - 1]].name, g->tensors[g->t_sorted[i]].name) == 0)
            return MS_FAIL(c->err, MS_ERR_FORMAT, "%s: tensor '%s' appears twice", c->path,
                           g->tensors[g->t_sorted[i]].name);
    if (g->n_tensors == 0)
        return MS_OK;
    size_t a = g->alignment;
    size_t data_start = c->pos + (a - c->pos % a) % a;
    if (data_start < c->pos || data_start > c->size)
        return MS_FAIL(c->err, MS_ERR_FORMAT, "%s: truncated: the data region (aligned to %zu) would start at %zu, "
                       "past the end of the file (%zu bytes)", c->path, a, data_start, c->size);
    size_t data_size = c->size - data_start;
    for (size_t i = 0; i < g->n_tensors; i++) {
        ms_gguf_tensor *t = &g->tensors[i];
        size_t off = t->file_offset;
        if (off % a != 0)
            return MS_FAIL(c->err, MS_ERR_FORMAT, "%s: tensor '%s': offset %zu is not a multiple of the alignment %zu",
                           c->path, t->name, off, a);
        if (off > data_size || t->n_bytes > data_size - off)
            return MS_FAIL(c->err, MS_ERR_FORMAT, "%s: tensor '%s': data [%zu, %zu) of the data region runs past the "
                           "end of the file (the region holds %zu bytes)", c->path, t->name, off,
                           off + MS_MIN(t->n_bytes, SIZE_MAX - off), data_size);
        t->file_offset = data_start + off;
        t->data = c->p + t->file_offset;
    }
    size_t *by_off = NULL;
    MS_TRY(build_sorted(g, g->n_tensors, true, true, &by_off, c->err));
    ms_status st = MS_OK;
    for (size_t i = 1; i < g->n_tensors && st == MS_OK; i++) {
        const ms_gguf_tensor *p = &g->tensors[by_off[i - 1]], *q = &g->tensors[by_off[i]];
        if (q->file_offset < p->file_offset + p->n_bytes)
            st = MS_FAIL(c->err, MS_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap (bytes %zu.. and %zu..)", c->path,
                         p->name, q->name, p->file_offset, q->file_offset);
    }
    ms_free(by_off);
    return st;
}

/* ---- open ---- */

static ms_status gguf_parse(ms_gguf *g, ms_error *err) {
    cursor c = {.p = g->bytes, .size = g->size, .pos = 0, .path = g->path, .err = err};
    uint32_t magic, version;
    if (g->size < 4 || le_u32(g->bytes) != GGUF_MAGIC)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: not a GGUF file (no 'GGUF' magic)", g->path);
    MS_TRY(cur_u32(&c, &magic, "magic"));
    MS_TRY(cur_u32(&c, &version, "version"));
    if (version != 2 && version != 3)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: GGUF version %u is not supported (supported: 2, 3)", g->path,
                       version);
    g->version = version;
    uint64_t n_tensors, n_kv;
    MS_TRY(cur_u64(&c, &n_tensors, "tensor count"));
    MS_TRY(cur_u64(&c, &n_kv, "metadata count"));
    MS_TRY(parse_kvs(&c, g, n_kv));
    return parse_tensors(&c, g, n_tensors);
}

ms_status ms_gguf_init_from_memory(ms_gguf **out, const char *name, const void *data, size_t size,
                                   ms_error *err) {
    *out = NULL;
    ms_gguf *g = ms_calloc(1, sizeof *g);
    if (g == NULL || (g->path = ms_strdup(name)) == NULL) {
        ms_free(g);
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", name);
    }
    g->bytes = data;
    g->size = size;
    ms_status st = gguf_parse(g, err);
    if (st != MS_OK) {
        ms_gguf_free(g);
        return st;
    }
    *out = g;
    return MS_OK;
}

ms_status ms_gguf_init(ms_gguf **out, const char *path, ms_error *err) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return MS_FAIL(err, errno == ENOENT ? MS_ERR_NOT_FOUND : MS_ERR_IO, "%s: cannot open: %s", path,
                       strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return MS_FAIL(err, MS_ERR_IO, "%s: not a regular file", path);
    }
    size_t size = (size_t)sb.st_size;
    void *map = NULL;
    if (size > 0) {
        map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(fd);
            return MS_FAIL(err, MS_ERR_IO, "%s: cannot mmap: %s", path, strerror(e));
        }
    }
    close(fd);
    static const uint8_t empty[1];
    ms_status st = ms_gguf_init_from_memory(out, path, map ? map : empty, size, err);
    if (st != MS_OK) {
        if (map)
            munmap(map, size);
        return st;
    }
    (*out)->map = map;
    (*out)->map_size = size;
    return MS_OK;
}

void ms_gguf_free(ms_gguf *g) {
    if (g == NULL)
        return;
    for (size_t i = 0; i < g->n_kv; i++)
        ms_free((void *)g->kvs[i].strs);
    ms_free(g->kvs);
    ms_free(g->kv_sorted);
    ms_free(g->tensors);
    ms_free(g->t_sorted);
    while (g->chunks) {
        str_chunk *n = g->chunks->next;
        ms_free(g->chunks);
        g->chunks = n;
    }
    if (g->map)
        munmap(g->map, g->map_size);
    ms_free(g->path);
    ms_free(g);
}

const char *ms_gguf_path(const ms_gguf *g) {
    return g->path;
}

uint32_t ms_gguf_version(const ms_gguf *g) {
    return g->version;
}

size_t ms_gguf_alignment(const ms_gguf *g) {
    return g->alignment;
}

/* ---- metadata access ---- */

size_t ms_gguf_n_kv(const ms_gguf *g) {
    return g->n_kv;
}

const ms_gguf_kv *ms_gguf_kv_at(const ms_gguf *g, size_t i) {
    MS_ASSERT(i < g->n_kv);
    return &g->kvs[i];
}

const ms_gguf_kv *ms_gguf_find_kv(const ms_gguf *g, const char *key) {
    size_t lo = 0, hi = g->kv_sorted ? g->n_kv : 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const ms_gguf_kv *kv = &g->kvs[g->kv_sorted[mid]];
        int c = strcmp(kv->key, key);
        if (c == 0)
            return kv;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const ms_gguf_str *ms_gguf_kv_str(const ms_gguf_kv *kv, size_t i) {
    MS_ASSERT(i < kv->n);
    return kv->strs ? &kv->strs[i] : NULL;
}

bool ms_gguf_kv_int(const ms_gguf_kv *kv, size_t i, int64_t *out) {
    MS_ASSERT(i < kv->n);
    if (!vtype_is_int(kv->elem_type) && kv->elem_type != MS_GGUF_BOOL)
        return false;
    const uint8_t *p = (const uint8_t *)kv->data + i * vtype_size[kv->elem_type];
    switch (kv->elem_type) {
    case MS_GGUF_UINT8: case MS_GGUF_BOOL: *out = p[0]; return true;
    case MS_GGUF_INT8: *out = (int8_t)p[0]; return true;
    case MS_GGUF_UINT16: *out = (uint16_t)(p[0] | (p[1] << 8)); return true;
    case MS_GGUF_INT16: *out = (int16_t)(uint16_t)(p[0] | (p[1] << 8)); return true;
    case MS_GGUF_UINT32: *out = le_u32(p); return true;
    case MS_GGUF_INT32: *out = (int32_t)le_u32(p); return true;
    case MS_GGUF_INT64: *out = (int64_t)le_u64(p); return true;
    case MS_GGUF_UINT64: {
        uint64_t v = le_u64(p);
        if (v > (uint64_t)INT64_MAX)
            return false;
        *out = (int64_t)v;
        return true;
    }
    default:
        return false;
    }
}

bool ms_gguf_kv_float(const ms_gguf_kv *kv, size_t i, double *out) {
    MS_ASSERT(i < kv->n);
    if (kv->elem_type == MS_GGUF_STRING)
        return false;
    const uint8_t *p = (const uint8_t *)kv->data + i * vtype_size[kv->elem_type];
    if (kv->elem_type == MS_GGUF_FLOAT32) {
        uint32_t u = le_u32(p);
        float f;
        memcpy(&f, &u, 4);
        *out = f;
        return true;
    }
    if (kv->elem_type == MS_GGUF_FLOAT64) {
        uint64_t u = le_u64(p);
        memcpy(out, &u, 8);
        return true;
    }
    if (kv->elem_type == MS_GGUF_UINT64) {
        *out = (double)le_u64(p);
        return true;
    }
    int64_t v;
    if (kv->elem_type == MS_GGUF_BOOL || !ms_gguf_kv_int(kv, i, &v))
        return false;
    *out = (double)v;
    return true;
}

static const char *kv_type_str(const ms_gguf_kv *kv, char *buf, size_t cap) {
    if (kv->type == MS_GGUF_ARRAY)
        snprintf(buf, cap, "array of %s", vtype_names[kv->elem_type]);
    else
        snprintf(buf, cap, "%s", vtype_names[kv->type]);
    return buf;
}

static ms_status kv_lookup(const ms_gguf *g, const char *key, const ms_gguf_kv **out, ms_error *err) {
    *out = ms_gguf_find_kv(g, key);
    if (*out == NULL)
        return MS_FAIL(err, MS_ERR_NOT_FOUND, "%s: metadata key '%s' is missing", g->path, key);
    return MS_OK;
}

static ms_status kv_wrong(const ms_gguf *g, const ms_gguf_kv *kv, const char *want, ms_error *err) {
    char buf[48];
    return MS_FAIL(err, MS_ERR_FORMAT, "%s: metadata key '%s' is %s %s, expected %s", g->path, kv->key,
                   kv->type == MS_GGUF_ARRAY ? "an" : "a", kv_type_str(kv, buf, sizeof buf), want);
}

ms_status ms_gguf_get_int(const ms_gguf *g, const char *key, int64_t *out, ms_error *err) {
    const ms_gguf_kv *kv;
    MS_TRY(kv_lookup(g, key, &kv, err));
    if (kv->type == MS_GGUF_ARRAY || !ms_gguf_kv_int(kv, 0, out))
        return kv_wrong(g, kv, "an integer (within int64)", err);
    return MS_OK;
}

ms_status ms_gguf_get_float(const ms_gguf *g, const char *key, double *out, ms_error *err) {
    const ms_gguf_kv *kv;
    MS_TRY(kv_lookup(g, key, &kv, err));
    if (kv->type == MS_GGUF_ARRAY || !ms_gguf_kv_float(kv, 0, out))
        return kv_wrong(g, kv, "a number", err);
    return MS_OK;
}

ms_status ms_gguf_get_bool(const ms_gguf *g, const char *key, bool *out, ms_error *err) {
    const ms_gguf_kv *kv;
    MS_TRY(kv_lookup(g, key, &kv, err));
    if (kv->type != MS_GGUF_BOOL)
        return kv_wrong(g, kv, "a bool", err);
    *out = ((const uint8_t *)kv->data)[0] != 0;
    return MS_OK;
}

ms_status ms_gguf_get_string(const ms_gguf *g, const char *key, const char **out, size_t *len,
                             ms_error *err) {
    const ms_gguf_kv *kv;
    MS_TRY(kv_lookup(g, key, &kv, err));
    if (kv->type != MS_GGUF_STRING)
        return kv_wrong(g, kv, "a string", err);
    *out = kv->strs[0].s;
    if (len)
        *len = kv->strs[0].len;
    return MS_OK;
}

ms_status ms_gguf_get_array(const ms_gguf *g, const char *key, ms_gguf_vtype elem_type,
                            const ms_gguf_kv **out, ms_error *err) {
    const ms_gguf_kv *kv;
    *out = NULL;
    MS_TRY(kv_lookup(g, key, &kv, err));
    if (kv->type != MS_GGUF_ARRAY || (elem_type != MS_GGUF_VTYPE_COUNT && kv->elem_type != elem_type)) {
        char want[48];
        snprintf(want, sizeof want, "an array of %s",
                 elem_type == MS_GGUF_VTYPE_COUNT ? "anything" : ms_gguf_vtype_name(elem_type));
        return kv_wrong(g, kv, want, err);
    }
    *out = kv;
    return MS_OK;
}

ms_status ms_gguf_get_int_or(const ms_gguf *g, const char *key, int64_t def, int64_t *out, ms_error *err) {
    if (ms_gguf_find_kv(g, key) == NULL) {
        *out = def;
        return MS_OK;
    }
    return ms_gguf_get_int(g, key, out, err);
}

ms_status ms_gguf_get_float_or(const ms_gguf *g, const char *key, double def, double *out, ms_error *err) {
    if (ms_gguf_find_kv(g, key) == NULL) {
        *out = def;
        return MS_OK;
    }
    return ms_gguf_get_float(g, key, out, err);
}

ms_status ms_gguf_get_bool_or(const ms_gguf *g, const char *key, bool def, bool *out, ms_error *err) {
    if (ms_gguf_find_kv(g, key) == NULL) {
        *out = def;
        return MS_OK;
    }
    return ms_gguf_get_bool(g, key, out, err);
}

/* ---- tensor access ---- */

size_t ms_gguf_n_tensors(const ms_gguf *g) {
    return g->n_tensors;
}

const ms_gguf_tensor *ms_gguf_tensor_at(const ms_gguf *g, size_t i) {
    MS_ASSERT(i < g->n_tensors);
    return &g->tensors[i];
}

const ms_gguf_tensor *ms_gguf_find_tensor(const ms_gguf *g, const char *name) {
    size_t lo = 0, hi = g->t_sorted ? g->n_tensors : 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const ms_gguf_tensor *t = &g->tensors[g->t_sorted[mid]];
        int c = strcmp(t->name, name);
        if (c == 0)
            return t;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

ms_status ms_gguf_tensor_to_f32(const ms_gguf *g, const ms_gguf_tensor *t, float *dst, size_t n,
                                ms_error *err) {
    if (n != t->n_elems)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: tensor '%s' has %zu elements, the caller asked for %zu",
                       g->path, t->name, t->n_elems, n);
    if (!ms_ggml_type_can_dequantize(t->type))
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: tensor '%s' has ggml type %s, which this build cannot "
                       "dequantize (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)",
                       g->path, t->name, ms_ggml_type_name(t->type));
    ms_status st = ms_ggml_dequantize(t->type, t->data, dst, n);
    if (st != MS_OK)
        return MS_FAIL(err, st, "%s: tensor '%s': cannot dequantize", g->path, t->name);
    return MS_OK;
}

/* ---- writing ---- */

#define GGUF_WRITE_ALIGN 32

typedef struct wr_tensor {
    char *name;
    uint32_t type;
    int n_dims;
    int64_t ne[MS_GGUF_MAX_DIMS];
    uint64_t n_bytes;
    uint64_t offset;  /* relative to the data region */
} wr_tensor;

struct ms_gguf_writer {
    char *path;
    FILE *fp;
    uint8_t *kv;          /* encoded metadata entries */
    size_t kv_len, kv_cap;
    size_t n_kv;
    char **keys;          /* [n_kv] for the duplicate check */
    size_t keys_cap;
    wr_tensor *ts;
    size_t n_ts, ts_cap;
    uint64_t data_total;  /* bytes of the data region, padding included */
    size_t cur;           /* tensor being written */
    uint64_t cur_done;    /* bytes of it written */
    bool header_done, finished, closed;
};

static ms_status wr_bytes(ms_gguf_writer *w, const void *p, size_t n, ms_error *err) {
    if (ms_grow((void **)&w->kv, &w->kv_cap, w->kv_len + n, 1) != MS_OK)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory for metadata", w->path);
    memcpy(w->kv + w->kv_len, p, n);
    w->kv_len += n;
    return MS_OK;
}

static ms_status wr_u32(ms_gguf_writer *w, uint32_t v, ms_error *err) {
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    return wr_bytes(w, b, 4, err);
}

static ms_status wr_u64(ms_gguf_writer *w, uint64_t v, ms_error *err) {
    MS_TRY(wr_u32(w, (uint32_t)v, err));
    return wr_u32(w, (uint32_t)(v >> 32), err);
}

static ms_status wr_string(ms_gguf_writer *w, const char *s, ms_error *err) {
    size_t n = strlen(s);
    MS_TRY(wr_u64(w, n, err));
    return wr_bytes(w, s, n, err);
}

/* Start an entry: refuse after the header, or a duplicate key; write the key and the type. */
static ms_status wr_key(ms_gguf_writer *w, const char *key, ms_gguf_vtype t, ms_error *err) {
    if (w->header_done)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: metadata key '%s' set after the data started", w->path, key);
    if (key[0] == '\0')
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: empty metadata key", w->path);
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->keys[i], key) == 0)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: metadata key '%s' set twice", w->path, key);
    if (ms_grow((void **)&w->keys, &w->keys_cap, w->n_kv + 1, sizeof *w->keys) != MS_OK ||
        (w->keys[w->n_kv] = ms_strdup(key)) == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", w->path);
    w->n_kv++;
    MS_TRY(wr_string(w, key, err));
    return wr_u32(w, (uint32_t)t, err);
}

ms_status ms_gguf_writer_init(ms_gguf_writer **out, const char *path, ms_error *err) {
    *out = NULL;
    ms_gguf_writer *w = ms_calloc(1, sizeof *w);
    if (w == NULL || (w->path = ms_strdup(path)) == NULL) {
        ms_free(w);
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", path);
    }
    w->fp = fopen(path, "wb");
    if (w->fp == NULL) {
        ms_status st = MS_FAIL(err, MS_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
        ms_free(w->path);
        ms_free(w);
        return st;
    }
    *out = w;
    return MS_OK;
}

ms_status ms_gguf_writer_set_u32(ms_gguf_writer *w, const char *key, uint32_t v, ms_error *err) {
    MS_TRY(wr_key(w, key, MS_GGUF_UINT32, err));
    return wr_u32(w, v, err);
}

ms_status ms_gguf_writer_set_f32(ms_gguf_writer *w, const char *key, float v, ms_error *err) {
    uint32_t u;
    memcpy(&u, &v, 4);
    MS_TRY(wr_key(w, key, MS_GGUF_FLOAT32, err));
    return wr_u32(w, u, err);
}

ms_status ms_gguf_writer_set_bool(ms_gguf_writer *w, const char *key, bool v, ms_error *err) {
    uint8_t b = v ? 1 : 0;
    MS_TRY(wr_key(w, key, MS_GGUF_BOOL, err));
    return wr_bytes(w, &b, 1, err);
}

ms_status ms_gguf_writer_set_str(ms_gguf_writer *w, const char *key, const char *v, ms_error *err) {
    MS_TRY(wr_key(w, key, MS_GGUF_STRING, err));
    return wr_string(w, v, err);
}

ms_status ms_gguf_writer_set_str_array(ms_gguf_writer *w, const char *key, const char *const *v, size_t n,
                                       ms_error *err) {
    MS_TRY(wr_key(w, key, MS_GGUF_ARRAY, err));
    MS_TRY(wr_u32(w, MS_GGUF_STRING, err));
    MS_TRY(wr_u64(w, n, err));
    for (size_t i = 0; i < n; i++)
        MS_TRY(wr_string(w, v[i], err));
    return MS_OK;
}

ms_status ms_gguf_writer_add_tensor(ms_gguf_writer *w, const char *name, uint32_t type, int n_dims,
                                    const int64_t *ne, ms_error *err) {
    if (w->header_done)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: tensor '%s' declared after the data started", w->path, name);
    if (name[0] == '\0' || !ms_ggml_type_known(type) || n_dims < 1 || n_dims > MS_GGUF_MAX_DIMS)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: tensor '%s': bad name, ggml type %u or rank %d", w->path, name,
                       type, n_dims);
    for (size_t i = 0; i < w->n_ts; i++)
        if (strcmp(w->ts[i].name, name) == 0)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: tensor '%s' declared twice", w->path, name);
    uint64_t n = 1;
    for (int d = 0; d < n_dims; d++) {
        if (ne[d] < 1 || (uint64_t)ne[d] > GGUF_MAX_ELEMS / n)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: tensor '%s': dimension %d is %lld", w->path, name, d,
                           (long long)ne[d]);
        n *= (uint64_t)ne[d];
    }
    if ((uint64_t)ne[0] % ms_ggml_type_block(type) != 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: tensor '%s': row length %lld is not a multiple of the %s block "
                       "size %zu", w->path, name, (long long)ne[0], ms_ggml_type_name(type), ms_ggml_type_block(type));
    if (ms_grow((void **)&w->ts, &w->ts_cap, w->n_ts + 1, sizeof *w->ts) != MS_OK)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", w->path);
    wr_tensor *t = &w->ts[w->n_ts];
    memset(t, 0, sizeof *t);
    if ((t->name = ms_strdup(name)) == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", w->path);
    w->n_ts++;
    t->type = type;
    t->n_dims = n_dims;
    for (int d = 0; d < n_dims; d++)
        t->ne[d] = ne[d];
    t->n_bytes = n / ms_ggml_type_block(type) * ms_ggml_type_block_bytes(type);
    t->offset = w->data_total;
    w->data_total = (t->offset + t->n_bytes + GGUF_WRITE_ALIGN - 1) / GGUF_WRITE_ALIGN * GGUF_WRITE_ALIGN;
    return MS_OK;
}

static ms_status wr_file(ms_gguf_writer *w, const void *p, size_t n, ms_error *err) {
    if (n > 0 && fwrite(p, 1, n, w->fp) != n)
        return MS_FAIL(err, MS_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
    return MS_OK;
}

static ms_status wr_pad(ms_gguf_writer *w, uint64_t at, ms_error *err) {
    static const uint8_t zeros[GGUF_WRITE_ALIGN];
    return wr_file(w, zeros, (size_t)((GGUF_WRITE_ALIGN - at % GGUF_WRITE_ALIGN) % GGUF_WRITE_ALIGN), err);
}

static ms_status wr_header(ms_gguf_writer *w, ms_error *err) {
    /* the tensor infos go after the metadata in the same buffer */
    for (size_t i = 0; i < w->n_ts; i++) {
        const wr_tensor *t = &w->ts[i];
        MS_TRY(wr_string(w, t->name, err));
        MS_TRY(wr_u32(w, (uint32_t)t->n_dims, err));
        for (int d = 0; d < t->n_dims; d++)
            MS_TRY(wr_u64(w, (uint64_t)t->ne[d], err));
        MS_TRY(wr_u32(w, t->type, err));
        MS_TRY(wr_u64(w, t->offset, err));
    }
    uint8_t head[24] = {'G', 'G', 'U', 'F', 3, 0, 0, 0};
    for (int i = 0; i < 8; i++) {
        head[8 + i] = (uint8_t)((uint64_t)w->n_ts >> (8 * i));
        head[16 + i] = (uint8_t)((uint64_t)w->n_kv >> (8 * i));
    }
    MS_TRY(wr_file(w, head, sizeof head, err));
    MS_TRY(wr_file(w, w->kv, w->kv_len, err));
    MS_TRY(wr_pad(w, sizeof head + w->kv_len, err));
    w->header_done = true;
    return MS_OK;
}

ms_status ms_gguf_writer_write(ms_gguf_writer *w, const void *bytes, size_t n, ms_error *err) {
    if (w->closed)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: write after finish", w->path);
    if (!w->header_done)
        MS_TRY(wr_header(w, err));
    const uint8_t *p = bytes;
    while (n > 0) {
        /* skip finished (or empty) tensors, padding each */
        while (w->cur < w->n_ts && w->cur_done == w->ts[w->cur].n_bytes) {
            MS_TRY(wr_pad(w, w->ts[w->cur].n_bytes, err));
            w->cur++;
            w->cur_done = 0;
        }
        if (w->cur == w->n_ts)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: %zu bytes written past the declared tensors", w->path, n);
        uint64_t left = w->ts[w->cur].n_bytes - w->cur_done;
        size_t k = left < n ? (size_t)left : n;
        MS_TRY(wr_file(w, p, k, err));
        w->cur_done += k;
        p += k;
        n -= k;
    }
    return MS_OK;
}

ms_status ms_gguf_writer_finish(ms_gguf_writer *w, ms_error *err) {
    ms_status st = MS_OK;
    if (w->closed)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: finish called twice", w->path);
    if (!w->header_done)
        st = wr_header(w, err);
    while (st == MS_OK && w->cur < w->n_ts && w->cur_done == w->ts[w->cur].n_bytes) {
        st = wr_pad(w, w->ts[w->cur].n_bytes, err);
        w->cur++;
        w->cur_done = 0;
    }
    if (st == MS_OK && w->cur < w->n_ts)
        st = MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: tensor '%s' got %llu of its %llu bytes", w->path,
                     w->ts[w->cur].name, (unsigned long long)w->cur_done, (unsigned long long)w->ts[w->cur].n_bytes);
    int rc = fclose(w->fp);
    w->closed = true;
    if (st == MS_OK && rc != 0)
        st = MS_FAIL(err, MS_ERR_IO, "%s: close failed: %s", w->path, strerror(errno));
    w->finished = st == MS_OK;
    return st;
}

void ms_gguf_writer_free(ms_gguf_writer *w) {
    if (w == NULL)
        return;
    if (!w->closed)
        fclose(w->fp);
    if (!w->finished)
        unlink(w->path);
    for (size_t i = 0; i < w->n_kv; i++)
        ms_free(w->keys[i]);
    for (size_t i = 0; i < w->n_ts; i++)
        ms_free(w->ts[i].name);
    ms_free(w->keys);
    ms_free(w->ts);
    ms_free(w->kv);
    ms_free(w->path);
    ms_free(w);
}
