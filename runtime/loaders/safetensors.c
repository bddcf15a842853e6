/*
 * safetensors.c - validated mmap reader and streaming writer for safetensors files.
 *
 * Constraints: nothing from the file is trusted until checked (every size product and offset sum
 * is overflow-checked); tensor data is never dereferenced through a typed pointer unless aligned
 * (conversions copy bytes with memcpy); the host is little-endian like the format. The writer holds
 * only the tensor declarations and a stdio buffer, so multi-GB checkpoints stream to disk.
 */
#include "safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

/* The safetensors library refuses headers above 100 MB; so do we. */
#define MS_ST_HEADER_MAX ((uint64_t)100 * 1000 * 1000)

/* ---- dtypes ---- */

/* ORDER MS_ST_DTYPE */
static const char *const st_dtype_names[MS_ST_DTYPE_COUNT] = {"F32", "BF16", "F16", "I32", "I64"};
static const size_t st_dtype_sizes[MS_ST_DTYPE_COUNT] = {4, 2, 2, 4, 8};

/* Dtypes the safetensors format defines that we do not load (rejected by name). */
static const char *const st_unsupported_dtypes[] = {
    "BOOL", "U8", "I8", "I16", "U16", "U32", "U64", "F64", "C64",
    "F8_E5M2", "F8_E4M3", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4",
};

const char *ms_st_dtype_name(ms_st_dtype d) {
    if ((unsigned)d >= MS_ST_DTYPE_COUNT)
        return "?";
    return st_dtype_names[d];
}

size_t ms_st_dtype_size(ms_st_dtype d) {
    if ((unsigned)d >= MS_ST_DTYPE_COUNT)
        return 0;
    return st_dtype_sizes[d];
}

ms_status ms_st_dtype_parse(const char *name, ms_st_dtype *out) {
    for (int d = 0; d < MS_ST_DTYPE_COUNT; d++) {
        if (strcmp(name, st_dtype_names[d]) == 0) {
            *out = (ms_st_dtype)d;
            return MS_OK;
        }
    }
    for (size_t i = 0; i < MS_ARRAY_LEN(st_unsupported_dtypes); i++) {
        if (strcmp(name, st_unsupported_dtypes[i]) == 0)
            return MS_ERR_UNSUPPORTED;
    }
    return MS_ERR_FORMAT;
}

void ms_st_dtype_mask_str(unsigned mask, char *buf, size_t cap) {
    size_t len = 0;
    if (cap == 0)
        return;
    buf[0] = '\0';
    for (int d = 0; d < MS_ST_DTYPE_COUNT; d++) {
        if (!(mask & MS_ST_DTYPE_BIT(d)))
            continue;
        int n = snprintf(buf + len, cap - len, "%s%s", len ? ", " : "", st_dtype_names[d]);
        if (n < 0 || (size_t)n >= cap - len)
            return;
        len += (size_t)n;
    }
}

/* ---- scalar conversions ---- */

float ms_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

uint16_t ms_f32_to_bf16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u)  /* NaN: keep sign, force a quiet mantissa bit */
        return (uint16_t)((bits >> 16) | 0x0040u);
    uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)((bits + rounding) >> 16);
}

float ms_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);  /* inf / NaN */
    } else if (exp != 0) {
        bits = sign | ((exp + 112u) << 23) | (mant << 13);  /* normal: rebias 15 -> 127 */
    } else if (mant == 0) {
        bits = sign;  /* signed zero */
    } else {
        /* subnormal: value = mant * 2^-24, exact in float */
        float v = (float)mant * 0x1p-24f;
        memcpy(&bits, &v, sizeof bits);
        bits |= sign;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

uint16_t ms_f32_to_f16(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    uint16_t sign = (uint16_t)((bits >> 16) & 0x8000u);
    uint32_t abs = bits & 0x7fffffffu;
    if (abs > 0x7f800000u)
        return (uint16_t)(sign | 0x7e00u);  /* NaN */
    if (abs >= 0x477ff000u)                 /* >= 65520 rounds to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (abs < 0x38800000u) {
        /* result is subnormal or zero: round abs * 2^24 to nearest even integer */
        float a;
        memcpy(&a, &abs, sizeof a);
        float scaled = a * 0x1p24f;  /* exact: power-of-two scaling of a small float */
        uint32_t q = (uint32_t)scaled;
        float rem = scaled - (float)q;
        if (rem > 0.5f || (rem == 0.5f && (q & 1u)))
            q++;
        return (uint16_t)(sign | q);
    }
    uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1u);
    return (uint16_t)(sign | (uint16_t)((rounded - 0x38000000u) >> 13));
}

/* ---- reading ---- */

struct ms_st_file {
    char *path;               /* as given to init */
    void *map;                /* whole-file read-only mapping */
    size_t map_size;          /* file size in bytes */
    size_t data_start;        /* 8 + header length: byte offset of the data region */
    ms_st_tensor *tensors;    /* [n_tensors], sorted by name */
    size_t n_tensors;
    char **meta;              /* [2 * n_meta] key, value pairs of __metadata__ */
    size_t n_meta;
};

static int st_tensor_cmp_name(const void *a, const void *b) {
    return strcmp(((const ms_st_tensor *)a)->name, ((const ms_st_tensor *)b)->name);
}

/* Tensors sorted by data offset, for the overlap / hole check. */
static int st_tensor_cmp_offset(const void *a, const void *b) {
    const ms_st_tensor *x = *(const ms_st_tensor *const *)a;
    const ms_st_tensor *y = *(const ms_st_tensor *const *)b;
    if (x->file_offset != y->file_offset)
        return x->file_offset < y->file_offset ? -1 : 1;
    return x->n_bytes < y->n_bytes ? -1 : (x->n_bytes > y->n_bytes);
}

void ms_st_shape_str(int n_dims, const int64_t *shape, char *buf, size_t cap) {
    size_t len = 0;
    if (cap == 0)
        return;
    int n = snprintf(buf, cap, "[");
    len = n > 0 ? (size_t)n : 0;
    for (int i = 0; i < n_dims && len < cap; i++) {
        n = snprintf(buf + len, cap - len, "%s%lld", i ? ", " : "", (long long)shape[i]);
        if (n < 0)
            return;
        len += (size_t)n;
    }
    if (len < cap)
        snprintf(buf + len, cap - len, "]");
}

/* Read a JSON integer >= 0 (jansson gives json_int_t = long long). */
static bool st_json_uint(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

/* Validate one header entry and fill *t (name already set). `data_size` is the data region size. */
static ms_status st_parse_entry(ms_st_file *f, const char *name, json_t *entry, size_t data_size,
                                ms_st_tensor *t, ms_error *err) {
    const char *p = f->path;
    if (!json_is_object(entry))
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: header entry '%s' is not an object", p, name);
    json_t *jd = json_object_get(entry, "dtype");
    json_t *js = json_object_get(entry, "shape");
    json_t *jo = json_object_get(entry, "data_offsets");
    if (!json_is_string(jd))
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: tensor '%s' has no string 'dtype'", p, name);
    if (!json_is_array(js))
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: tensor '%s' has no array 'shape'", p, name);
    if (!json_is_array(jo) || json_array_size(jo) != 2)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: tensor '%s' has no 'data_offsets' [begin, end]", p,
                       name);
    const char *dname = json_string_value(jd);
    ms_status st = ms_st_dtype_parse(dname, &t->dtype);
    if (st == MS_ERR_UNSUPPORTED)
        return MS_FAIL(err, st, "%s: tensor '%s' has dtype %s, not supported (supported: F32, BF16, F16; "
                       "I32, I64 for data)", p, name, dname);
    if (st != MS_OK)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: tensor '%s' has unknown dtype '%s'", p, name, dname);

    size_t rank = json_array_size(js);
    if (rank > MS_ST_MAX_DIMS)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: tensor '%s' has rank %zu (at most %d supported)",
                       p, name, rank, MS_ST_MAX_DIMS);
    t->n_dims = (int)rank;
    uint64_t n_elems = 1;
    for (size_t i = 0; i < rank; i++) {
        uint64_t d;
        if (!st_json_uint(json_array_get(js, i), &d))
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: tensor '%s': shape[%zu] is not a non-negative integer",
                           p, name, i);
        t->shape[i] = (int64_t)d;
        if (__builtin_mul_overflow(n_elems, d, &n_elems))
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: tensor '%s': shape product overflows", p, name);
    }
    uint64_t begin, end, n_bytes;
    if (!st_json_uint(json_array_get(jo, 0), &begin) || !st_json_uint(json_array_get(jo, 1), &end))
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: tensor '%s': data_offsets are not non-negative integers",
                       p, name);
    if (__builtin_mul_overflow(n_elems, (uint64_t)ms_st_dtype_size(t->dtype), &n_bytes))
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: tensor '%s': byte size overflows", p, name);
    if (begin > end)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu] begin after end",
                       p, name, (unsigned long long)begin, (unsigned long long)end);
    if (end > data_size)
        return MS_FAIL(err, MS_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets [%llu, %llu] run past the data region (%zu bytes; "
                       "file truncated or header lying)",
                       p, name, (unsigned long long)begin, (unsigned long long)end, data_size);
    if (end - begin != n_bytes) {
        char sh[128];
        ms_st_shape_str(t->n_dims, t->shape, sh, sizeof sh);
        return MS_FAIL(err, MS_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets [%llu, %llu] span %llu bytes, but %s %s needs %llu",
                       p, name, (unsigned long long)begin, (unsigned long long)end,
                       (unsigned long long)(end - begin), dname, sh, (unsigned long long)n_bytes);
    }
    t->n_elems = (size_t)n_elems;
    t->n_bytes = (size_t)n_bytes;
    t->file_offset = f->data_start + (size_t)begin;
    t->data = (const char *)f->map + t->file_offset;
    t->file_path = f->path;
    return MS_OK;
}

static ms_status st_parse_metadata(ms_st_file *f, json_t *meta, ms_error *err) {
    if (!json_is_object(meta))
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: __metadata__ is not an object", f->path);
    size_t n = json_object_size(meta);
    f->meta = ms_calloc(n * 2 + 1, sizeof *f->meta);
    if (f->meta == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory for metadata", f->path);
    const char *key;
    json_t *v;
    json_object_foreach(meta, key, v) {
        if (!json_is_string(v))
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: __metadata__ entry '%s' is not a string", f->path, key);
        char *k = ms_strdup(key);
        char *s = ms_strdup(json_string_value(v));
        f->meta[2 * f->n_meta] = k;
        f->meta[2 * f->n_meta + 1] = s;
        f->n_meta++;
        if (k == NULL || s == NULL)
            return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory for metadata", f->path);
    }
    return MS_OK;
}

/* Parse and validate the JSON header; fills f->tensors. */
static ms_status st_parse_header(ms_st_file *f, const char *text, size_t len, ms_error *err) {
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return MS_FAIL(err, MS_ERR_PARSE, "%s: header is not valid JSON (at byte %d of the header: %s)",
                       f->path, jerr.position, jerr.text);
    ms_status st = MS_OK;
    ms_st_tensor **by_offset = NULL;
    if (!json_is_object(root)) {
        st = MS_FAIL(err, MS_ERR_FORMAT, "%s: header is not a JSON object", f->path);
        goto done;
    }
    size_t n = json_object_size(root);
    f->tensors = ms_calloc(n ? n : 1, sizeof *f->tensors);
    if (f->tensors == NULL) {
        st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory for %zu tensor descriptors", f->path, n);
        goto done;
    }
    size_t data_size = f->map_size - f->data_start;
    const char *key;
    json_t *entry;
    json_object_foreach(root, key, entry) {
        if (strcmp(key, "__metadata__") == 0) {
            st = st_parse_metadata(f, entry, err);
            if (st != MS_OK)
                goto done;
            continue;
        }
        if (key[0] == '\0') {
            st = MS_FAIL(err, MS_ERR_FORMAT, "%s: header has a tensor with an empty name", f->path);
            goto done;
        }
        ms_st_tensor *t = &f->tensors[f->n_tensors];
        t->name = ms_strdup(key);
        if (t->name == NULL) {
            st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory for tensor names", f->path);
            goto done;
        }
        f->n_tensors++;
        st = st_parse_entry(f, key, entry, data_size, t, err);
        if (st != MS_OK)
            goto done;
    }
    qsort(f->tensors, f->n_tensors, sizeof *f->tensors, st_tensor_cmp_name);

    /* The data region must be covered exactly: sorted by offset, each tensor starts where the
     * previous one ended (zero-size tensors may share an offset) and the last ends at the file end. */
    by_offset = ms_calloc(f->n_tensors ? f->n_tensors : 1, sizeof *by_offset);
    if (by_offset == NULL) {
        st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", f->path);
        goto done;
    }
    for (size_t i = 0; i < f->n_tensors; i++)
        by_offset[i] = &f->tensors[i];
    qsort(by_offset, f->n_tensors, sizeof *by_offset, st_tensor_cmp_offset);
    size_t pos = f->data_start;
    for (size_t i = 0; i < f->n_tensors; i++) {
        const ms_st_tensor *t = by_offset[i];
        if (t->file_offset < pos) {
            st = MS_FAIL(err, MS_ERR_FORMAT, "%s: tensor '%s' (data_offsets [%zu, %zu]) overlaps tensor '%s'",
                         f->path, t->name, t->file_offset - f->data_start,
                         t->file_offset - f->data_start + t->n_bytes, by_offset[i - 1]->name);
            goto done;
        }
        if (t->file_offset > pos) {
            st = MS_FAIL(err, MS_ERR_FORMAT, "%s: data region has a hole of %zu bytes before tensor '%s'",
                         f->path, t->file_offset - pos, t->name);
            goto done;
        }
        pos = t->file_offset + t->n_bytes;
    }
    if (pos != f->map_size) {
        st = MS_FAIL(err, MS_ERR_FORMAT, "%s: %zu bytes after the last tensor are not described by the header",
                     f->path, f->map_size - pos);
        goto done;
    }
done:
    ms_free(by_offset);
    json_decref(root);
    return st;
}

ms_status ms_st_file_init(ms_st_file **out, const char *path, ms_error *err) {
    *out = NULL;
    ms_st_file *f = ms_calloc(1, sizeof *f);
    if (f == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", path);
    ms_status st = MS_OK;
    int fd = -1;
    f->path = ms_strdup(path);
    if (f->path == NULL) {
        st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", path);
        goto fail;
    }
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        st = MS_FAIL(err, MS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        goto fail;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = MS_FAIL(err, MS_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(sb.st_mode)) {
        st = MS_FAIL(err, MS_ERR_IO, "%s: not a regular file", path);
        goto fail;
    }
    if (sb.st_size < 8) {
        st = MS_FAIL(err, MS_ERR_FORMAT, "%s: file is %lld bytes, too short for a safetensors header",
                     path, (long long)sb.st_size);
        goto fail;
    }
    f->map_size = (size_t)sb.st_size;
    f->map = mmap(NULL, f->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (f->map == MAP_FAILED) {
        f->map = NULL;
        st = MS_FAIL(err, MS_ERR_IO, "%s: cannot mmap: %s", path, strerror(errno));
        goto fail;
    }
    close(fd);
    fd = -1;

    uint64_t header_len;
    memcpy(&header_len, f->map, sizeof header_len);
    if (header_len < 2 || header_len > MS_ST_HEADER_MAX) {
        st = MS_FAIL(err, MS_ERR_FORMAT, "%s: header length %llu is not sane (2 .. %llu bytes)", path,
                     (unsigned long long)header_len, (unsigned long long)MS_ST_HEADER_MAX);
        goto fail;
    }
    if (header_len > f->map_size - 8) {
        st = MS_FAIL(err, MS_ERR_FORMAT, "%s: header length %llu exceeds the file (%zu bytes): truncated",
                     path, (unsigned long long)header_len, f->map_size);
        goto fail;
    }
    f->data_start = 8 + (size_t)header_len;
    const char *text = (const char *)f->map + 8;
    if (text[0] != '{') {
        st = MS_FAIL(err, MS_ERR_FORMAT, "%s: header does not start with '{'", path);
        goto fail;
    }
    st = st_parse_header(f, text, (size_t)header_len, err);
    if (st != MS_OK)
        goto fail;
    *out = f;
    return MS_OK;
fail:
    if (fd >= 0)
        close(fd);
    ms_st_file_free(f);
    return st;
}

void ms_st_file_free(ms_st_file *f) {
    if (f == NULL)
        return;
    if (f->map != NULL)
        munmap(f->map, f->map_size);
    for (size_t i = 0; i < f->n_tensors; i++)
        ms_free((void *)f->tensors[i].name);
    ms_free(f->tensors);
    for (size_t i = 0; i < 2 * f->n_meta; i++)
        ms_free(f->meta[i]);
    ms_free(f->meta);
    ms_free(f->path);
    ms_free(f);
}

const char *ms_st_file_path(const ms_st_file *f) {
    return f->path;
}

size_t ms_st_file_n_tensors(const ms_st_file *f) {
    return f->n_tensors;
}

const ms_st_tensor *ms_st_file_tensor_at(const ms_st_file *f, size_t i) {
    MS_ASSERT(i < f->n_tensors);
    return &f->tensors[i];
}

const ms_st_tensor *ms_st_file_find_tensor(const ms_st_file *f, const char *name) {
    ms_st_tensor key = {.name = name};
    return bsearch(&key, f->tensors, f->n_tensors, sizeof *f->tensors, st_tensor_cmp_name);
}

const char *ms_st_file_metadata(const ms_st_file *f, const char *key) {
    for (size_t i = 0; i < f->n_meta; i++) {
        if (f->meta[2 * i] != NULL && strcmp(f->meta[2 * i], key) == 0)
            return f->meta[2 * i + 1];
    }
    return NULL;
}

/* ---- conversions ---- */

static ms_status st_check_count(const ms_st_tensor *t, size_t n, bool want_float, ms_error *err) {
    bool is_float = MS_ST_DTYPES_FLOAT & MS_ST_DTYPE_BIT(t->dtype);
    if (is_float != want_float)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: tensor '%s' is %s, not %s", t->file_path, t->name,
                       ms_st_dtype_name(t->dtype), want_float ? "a float tensor" : "an integer tensor");
    if (n != t->n_elems)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: tensor '%s' has %zu elements, destination holds %zu",
                       t->file_path, t->name, t->n_elems, n);
    return MS_OK;
}

ms_status ms_st_tensor_to_f32(const ms_st_tensor *t, float *dst, size_t n, ms_error *err) {
    MS_TRY(st_check_count(t, n, true, err));
    const unsigned char *src = t->data;
    switch (t->dtype) {
    case MS_ST_DTYPE_F32:
        memcpy(dst, src, n * sizeof *dst);
        break;
    case MS_ST_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, sizeof h);
            dst[i] = ms_bf16_to_f32(h);
        }
        break;
    case MS_ST_DTYPE_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, sizeof h);
            dst[i] = ms_f16_to_f32(h);
        }
        break;
    default:
        MS_ABORT("tensor '%s' has invalid dtype %d", t->name, (int)t->dtype);
    }
    return MS_OK;
}

ms_status ms_st_tensor_to_bf16(const ms_st_tensor *t, uint16_t *dst, size_t n, ms_error *err) {
    MS_TRY(st_check_count(t, n, true, err));
    const unsigned char *src = t->data;
    switch (t->dtype) {
    case MS_ST_DTYPE_F32:
        for (size_t i = 0; i < n; i++) {
            float f;
            memcpy(&f, src + 4 * i, sizeof f);
            dst[i] = ms_f32_to_bf16(f);
        }
        break;
    case MS_ST_DTYPE_BF16:
        memcpy(dst, src, n * sizeof *dst);
        break;
    case MS_ST_DTYPE_F16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, sizeof h);
            dst[i] = ms_f32_to_bf16(ms_f16_to_f32(h));
        }
        break;
    default:
        MS_ABORT("tensor '%s' has invalid dtype %d", t->name, (int)t->dtype);
    }
    return MS_OK;
}

ms_status ms_st_tensor_to_i32(const ms_st_tensor *t, int32_t *dst, size_t n, ms_error *err) {
    MS_TRY(st_check_count(t, n, false, err));
    const unsigned char *src = t->data;
    if (t->dtype == MS_ST_DTYPE_I32) {
        memcpy(dst, src, n * sizeof *dst);
        return MS_OK;
    }
    MS_ASSERT(t->dtype == MS_ST_DTYPE_I64);
    for (size_t i = 0; i < n; i++) {
        int64_t v;
        memcpy(&v, src + 8 * i, sizeof v);
        if (v < INT32_MIN || v > INT32_MAX)
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: tensor '%s'[%zu] = %lld does not fit in int32", t->file_path,
                           t->name, i, (long long)v);
        dst[i] = (int32_t)v;
    }
    return MS_OK;
}

const float *ms_st_tensor_f32_data(const ms_st_tensor *t) {
    if (t->dtype != MS_ST_DTYPE_F32 || ((uintptr_t)t->data % _Alignof(float)) != 0)
        return NULL;
    return (const float *)t->data;
}

/* ---- writing ---- */

typedef struct st_decl {
    char *name;                     /* tensor name */
    ms_st_dtype dtype;
    int n_dims;
    int64_t shape[MS_ST_MAX_DIMS];  /* [n_dims] */
    uint64_t n_bytes;               /* data bytes */
} st_decl;

struct ms_st_writer {
    char *path;         /* output file */
    FILE *fp;           /* open output stream */
    char *buf;          /* stdio buffer (ms_malloc'd so it is counted) */
    st_decl *decls;     /* [n_decls] in data order */
    size_t n_decls;
    size_t cap_decls;
    json_t *meta;       /* __metadata__ object */
    uint64_t total;     /* sum of declared n_bytes */
    uint64_t written;   /* data bytes written so far */
    bool header_done;   /* header written (no more declarations) */
    bool finished;      /* finish succeeded: keep the file */
    bool closed;        /* finish ran (fp closed) */
};

#define MS_ST_WRITE_BUF (1u << 20)

ms_status ms_st_writer_init(ms_st_writer **out, const char *path, ms_error *err) {
    *out = NULL;
    ms_st_writer *w = ms_calloc(1, sizeof *w);
    if (w == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", path);
    ms_status st;
    w->path = ms_strdup(path);
    w->buf = ms_malloc(MS_ST_WRITE_BUF);
    w->meta = json_object();
    if (w->path == NULL || w->buf == NULL || w->meta == NULL) {
        st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", path);
        goto fail;
    }
    w->fp = fopen(path, "wb");
    if (w->fp == NULL) {
        st = MS_FAIL(err, MS_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
        w->closed = true;
        goto fail;
    }
    setvbuf(w->fp, w->buf, _IOFBF, MS_ST_WRITE_BUF);
    *out = w;
    return MS_OK;
fail:
    w->closed = true;
    w->finished = true;  /* nothing created to remove */
    ms_st_writer_free(w);
    return st;
}

ms_status ms_st_writer_set_metadata(ms_st_writer *w, const char *key, const char *value, ms_error *err) {
    if (w->header_done || w->closed)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: metadata set after data was written", w->path);
    if (json_object_set_new(w->meta, key, json_string(value)) != 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: metadata '%s' is not valid UTF-8", w->path, key);
    return MS_OK;
}

ms_status ms_st_writer_add_tensor(ms_st_writer *w, const char *name, ms_st_dtype dtype, int n_dims,
                                  const int64_t *shape, ms_error *err) {
    if (w->header_done || w->closed)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: tensor '%s' declared after data was written",
                       w->path, name);
    if (name[0] == '\0' || strcmp(name, "__metadata__") == 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: invalid tensor name '%s'", w->path, name);
    if ((unsigned)dtype >= MS_ST_DTYPE_COUNT)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: tensor '%s': invalid dtype %d", w->path, name, (int)dtype);
    if (n_dims < 0 || n_dims > MS_ST_MAX_DIMS)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: tensor '%s': rank %d out of range", w->path, name, n_dims);
    for (size_t i = 0; i < w->n_decls; i++) {
        if (strcmp(w->decls[i].name, name) == 0)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: tensor '%s' declared twice", w->path, name);
    }
    uint64_t n_bytes = ms_st_dtype_size(dtype);
    for (int i = 0; i < n_dims; i++) {
        if (shape[i] < 0 || __builtin_mul_overflow(n_bytes, (uint64_t)shape[i], &n_bytes))
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: tensor '%s': bad shape", w->path, name);
    }
    if (ms_grow((void **)&w->decls, &w->cap_decls, w->n_decls + 1, sizeof *w->decls) != MS_OK)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", w->path);
    st_decl *d = &w->decls[w->n_decls];
    memset(d, 0, sizeof *d);
    d->name = ms_strdup(name);
    if (d->name == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", w->path);
    d->dtype = dtype;
    d->n_dims = n_dims;
    for (int i = 0; i < n_dims; i++)
        d->shape[i] = shape[i];
    d->n_bytes = n_bytes;
    w->n_decls++;
    w->total += n_bytes;
    return MS_OK;
}

/* Build the header JSON and write length + header (padded with spaces to a multiple of 8, as the
 * reference writer does, so the data region is 8-byte aligned). */
static ms_status st_write_header(ms_st_writer *w, ms_error *err) {
    json_t *root = json_object();
    char *text = NULL;
    ms_status st = MS_OK;
    if (root == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", w->path);
    if (json_object_size(w->meta) > 0 && json_object_set(root, "__metadata__", w->meta) != 0) {
        st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", w->path);
        goto done;
    }
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_decls; i++) {
        const st_decl *d = &w->decls[i];
        json_t *e = json_object();
        json_t *shape = json_array();
        json_t *offs = json_array();
        bool ok = e && shape && offs;
        for (int k = 0; ok && k < d->n_dims; k++)
            ok = json_array_append_new(shape, json_integer(d->shape[k])) == 0;
        ok = ok && json_array_append_new(offs, json_integer((json_int_t)off)) == 0 &&
             json_array_append_new(offs, json_integer((json_int_t)(off + d->n_bytes))) == 0 &&
             json_object_set_new(e, "dtype", json_string(ms_st_dtype_name(d->dtype))) == 0;
        if (ok) {
            ok = json_object_set_new(e, "shape", shape) == 0;
            shape = NULL;
        }
        if (ok) {
            ok = json_object_set_new(e, "data_offsets", offs) == 0;
            offs = NULL;
        }
        if (ok) {
            ok = json_object_set_new(root, d->name, e) == 0;
            e = NULL;
        }
        json_decref(e);
        json_decref(shape);
        json_decref(offs);
        if (!ok) {
            st = MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: cannot encode header entry for tensor '%s'",
                         w->path, d->name);
            goto done;
        }
        off += d->n_bytes;
    }
    text = json_dumps(root, JSON_COMPACT | JSON_SORT_KEYS);
    if (text == NULL) {
        st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory encoding the header", w->path);
        goto done;
    }
    size_t len = strlen(text);
    uint64_t padded = (len + 7) / 8 * 8;
    if (fwrite(&padded, sizeof padded, 1, w->fp) != 1 || fwrite(text, 1, len, w->fp) != len) {
        st = MS_FAIL(err, MS_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
        goto done;
    }
    for (size_t i = len; i < padded; i++) {
        if (fputc(' ', w->fp) == EOF) {
            st = MS_FAIL(err, MS_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
            goto done;
        }
    }
    w->header_done = true;
done:
    free(text);  /* json_dumps allocates with jansson's allocator (malloc) */
    json_decref(root);
    return st;
}

ms_status ms_st_writer_write(ms_st_writer *w, const void *bytes, size_t n, ms_error *err) {
    if (w->closed)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: write after finish", w->path);
    if (!w->header_done)
        MS_TRY(st_write_header(w, err));
    if (n > w->total - w->written)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: %zu bytes written past the declared %llu data bytes",
                       w->path, n, (unsigned long long)w->total);
    if (n > 0 && fwrite(bytes, 1, n, w->fp) != n)
        return MS_FAIL(err, MS_ERR_IO, "%s: write failed: %s", w->path, strerror(errno));
    w->written += n;
    return MS_OK;
}

ms_status ms_st_writer_finish(ms_st_writer *w, ms_error *err) {
    if (w->closed)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: finish called twice", w->path);
    if (!w->header_done) {
        ms_status st = st_write_header(w, err);
        if (st != MS_OK)
            return st;
    }
    if (w->written != w->total)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: %llu of %llu declared data bytes written",
                       w->path, (unsigned long long)w->written, (unsigned long long)w->total);
    w->closed = true;
    int rc = fclose(w->fp);
    w->fp = NULL;
    if (rc != 0)
        return MS_FAIL(err, MS_ERR_IO, "%s: close failed: %s", w->path, strerror(errno));
    w->finished = true;
    return MS_OK;
}

void ms_st_writer_free(ms_st_writer *w) {
    if (w == NULL)
        return;
    if (w->fp != NULL)
        fclose(w->fp);
    if (!w->finished && w->path != NULL)
        unlink(w->path);
    for (size_t i = 0; i < w->n_decls; i++)
        ms_free(w->decls[i].name);
    ms_free(w->decls);
    json_decref(w->meta);
    ms_free(w->buf);
    ms_free(w->path);
    ms_free(w);
}
