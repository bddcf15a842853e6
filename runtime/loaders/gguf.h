/*
 * gguf.h - read (mmap) GGUF files, versions 2 and 3: metadata and tensors, fully validated.
 *
 * Format (ggml docs/gguf.md; gguf-py gguf_reader.py): little-endian throughout.
 *   u32 magic "GGUF", u32 version (2 or 3), u64 n_tensors, u64 n_kv,
 *   n_kv times  { string key, u32 value_type, value },
 *   n_tensors times { string name, u32 n_dims (1..4), u64 ne[n_dims], u32 ggml_type, u64 offset },
 *   padding to general.alignment (u32, a power of two; default 32), then the data region.
 *   string = u64 length + bytes (no NUL); array = u32 element type, u64 count, elements.
 * ne[0] is the fastest-varying dimension (ggml order), so a Hugging Face [rows, cols] weight has
 * ne = {cols, rows}. Tensor offsets are relative to the data region and aligned.
 *
 * Validation before anything is handed out: magic, version, counts against the bytes left (a count
 * that cannot fit is refused before any allocation), every string length inside the file, value
 * types known (nested arrays refused), keys unique, general.alignment a u32 power of two, tensor
 * names unique and non-empty, 1..4 dims each >= 1, product overflow-safe and <= 2^62, ggml type
 * known (gguf_quant.h) with ne[0] a multiple of its block size, offset aligned, data inside the file,
 * tensors not overlapping. Every error is one line naming the file and the key or tensor (and the
 * byte offset for framing errors), e.g. "m.gguf: tensor 'blk.0.attn_q.weight': data [4096, 8192)
 * runs past the end of the file (6000 bytes)".
 *
 * Metadata: every string (keys, string values, string-array elements) is copied once into a
 * NUL-terminated arena, so strings handed out are C strings that also carry their byte length (a
 * GGUF string may contain NUL bytes; use the length). Numeric arrays stay in the mapping and are
 * read element-wise with ms_gguf_kv_int / ms_gguf_kv_float (any integer / float element type).
 *
 * Writing: ms_gguf_writer streams a v3 file (metadata, tensor infos, aligned data) without holding
 * the data in memory (mstar-mkckpt writes 8B-shaped quantized checkpoints with it).
 *
 * Ownership: ms_gguf_* functions borrow their arguments; ms_gguf_init's result is owned by the
 * caller (ms_gguf_free, NULL accepted); every kv, string and tensor descriptor handed out, and the
 * tensor data pointers into the mapping, live as long as it.
 *
 * Usage (a tokenizer reading its vocabulary):
 *     ms_gguf *g = NULL;
 *     MS_TRY(ms_gguf_init(&g, "model.gguf", err));
 *     const ms_gguf_kv *toks;
 *     MS_TRY(ms_gguf_get_array(g, "tokenizer.ggml.tokens", MS_GGUF_STRING, &toks, err));
 *     for (size_t i = 0; i < toks->n; i++) {
 *         const ms_gguf_str *s = ms_gguf_kv_str(toks, i);   // s->s (NUL-terminated), s->len
 *         ...
 *     }
 *     const char *pre;
 *     MS_TRY(ms_gguf_get_string(g, "tokenizer.ggml.pre", &pre, err));
 *     ms_gguf_free(g);
 */
#ifndef MS_GGUF_H
#define MS_GGUF_H

#include "ms_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* GGUF metadata value types (gguf.md gguf_metadata_value_type). ORDER MS_GGUF_TYPE: tables in
 * gguf.c. */
typedef enum ms_gguf_vtype {
    MS_GGUF_UINT8 = 0,
    MS_GGUF_INT8 = 1,
    MS_GGUF_UINT16 = 2,
    MS_GGUF_INT16 = 3,
    MS_GGUF_UINT32 = 4,
    MS_GGUF_INT32 = 5,
    MS_GGUF_FLOAT32 = 6,
    MS_GGUF_BOOL = 7,
    MS_GGUF_STRING = 8,
    MS_GGUF_ARRAY = 9,
    MS_GGUF_UINT64 = 10,
    MS_GGUF_INT64 = 11,
    MS_GGUF_FLOAT64 = 12,
    MS_GGUF_VTYPE_COUNT
} ms_gguf_vtype;

/* Name of a value type for messages ("uint32", "string", "array", ...); "?" out of range. */
const char *ms_gguf_vtype_name(uint32_t t);

/* A string: NUL-terminated copy (s[len] == 0) and its byte length (NULs inside possible). */
typedef struct ms_gguf_str {
    const char *s;
    size_t len;
} ms_gguf_str;

/* One metadata entry. A scalar is an array of one element of its own type (n == 1, type ==
 * elem_type) so the element accessors below serve both. */
typedef struct ms_gguf_kv {
    const char *key;          /* NUL-terminated */
    ms_gguf_vtype type;       /* MS_GGUF_ARRAY or the scalar type */
    ms_gguf_vtype elem_type;  /* element type (== type for a scalar); never MS_GGUF_ARRAY */
    size_t n;                 /* element count (1 for a scalar; may be 0 for an array) */
    const void *data;         /* numeric elements: n * size little-endian bytes in the mapping
                                 (maybe unaligned); NULL for strings */
    const ms_gguf_str *strs;  /* [n] strings when elem_type == MS_GGUF_STRING, else NULL */
} ms_gguf_kv;

/* Maximum rank of a GGUF tensor (GGML_MAX_DIMS). */
#define MS_GGUF_MAX_DIMS 4

/* One tensor, validated. */
typedef struct ms_gguf_tensor {
    const char *name;               /* NUL-terminated */
    uint32_t type;                  /* ms_ggml_type (gguf_quant.h), known */
    int n_dims;                     /* 1 .. MS_GGUF_MAX_DIMS */
    int64_t ne[MS_GGUF_MAX_DIMS];   /* ggml order: ne[0] fastest; entries past n_dims are 1 */
    size_t n_elems;                 /* product(ne) */
    size_t n_bytes;                 /* n_elems / block * block_bytes */
    size_t file_offset;             /* absolute byte offset of the data in the file */
    const void *data;               /* n_bytes in the mapping (aligned to the file's alignment) */
} ms_gguf_tensor;

typedef struct ms_gguf ms_gguf;

/*
 * Map and validate the GGUF file at `path`. Errors: MS_ERR_IO (cannot open/stat/map),
 * MS_ERR_FORMAT (not GGUF, truncated, a lying count/length/offset, overlap, duplicate),
 * MS_ERR_UNSUPPORTED (version other than 2/3, unknown value or ggml type, nested array, rank > 4),
 * MS_ERR_OOM. One line naming the file and the key, tensor or byte offset.
 */
ms_status ms_gguf_init(ms_gguf **out, const char *path, ms_error *err);
/* Same over a caller-owned buffer (the fuzz target and tests; `name` is used in messages). The
 * buffer must outlive the result. */
ms_status ms_gguf_init_from_memory(ms_gguf **out, const char *name, const void *data, size_t size,
                                   ms_error *err);
/* Unmap and free. NULL accepted. */
void ms_gguf_free(ms_gguf *g);

/* Path (or name) as given, borrowed. */
const char *ms_gguf_path(const ms_gguf *g);
/* File format version (2 or 3). */
uint32_t ms_gguf_version(const ms_gguf *g);
/* Alignment of the data region and of every tensor offset, in bytes. */
size_t ms_gguf_alignment(const ms_gguf *g);

/* ---- metadata ---- */

/* Number of entries, and entry i (0 <= i < n) in file order. */
size_t ms_gguf_n_kv(const ms_gguf *g);
const ms_gguf_kv *ms_gguf_kv_at(const ms_gguf *g, size_t i);
/* Entry named `key`, or NULL. O(log n). */
const ms_gguf_kv *ms_gguf_find_kv(const ms_gguf *g, const char *key);

/*
 * Typed getters. Missing key: MS_ERR_NOT_FOUND "<file>: metadata key 'k' is missing"; wrong type:
 * MS_ERR_FORMAT "<file>: metadata key 'k' is a string, expected an integer". Conversions:
 *   get_int    any integer scalar type (uint64 above INT64_MAX is MS_ERR_FORMAT), or bool (0/1);
 *   get_float  float32 / float64, or any integer type;
 *   get_bool   bool only;
 *   get_string string only (borrowed, NUL-terminated; *len may be NULL);
 *   get_array  an array whose elements are of `elem_type` (MS_GGUF_VTYPE_COUNT: any).
 */
ms_status ms_gguf_get_int(const ms_gguf *g, const char *key, int64_t *out, ms_error *err);
ms_status ms_gguf_get_float(const ms_gguf *g, const char *key, double *out, ms_error *err);
ms_status ms_gguf_get_bool(const ms_gguf *g, const char *key, bool *out, ms_error *err);
ms_status ms_gguf_get_string(const ms_gguf *g, const char *key, const char **out, size_t *len,
                             ms_error *err);
ms_status ms_gguf_get_array(const ms_gguf *g, const char *key, ms_gguf_vtype elem_type,
                            const ms_gguf_kv **out, ms_error *err);
/* The same, returning `def` when the key is missing (a wrong type is still an error). */
ms_status ms_gguf_get_int_or(const ms_gguf *g, const char *key, int64_t def, int64_t *out, ms_error *err);
ms_status ms_gguf_get_float_or(const ms_gguf *g, const char *key, double def, double *out, ms_error *err);
ms_status ms_gguf_get_bool_or(const ms_gguf *g, const char *key, bool def, bool *out, ms_error *err);

/* Element i of kv (i < kv->n): a string (NULL unless elem_type is MS_GGUF_STRING). */
const ms_gguf_str *ms_gguf_kv_str(const ms_gguf_kv *kv, size_t i);
/* Element i as an integer: false (out untouched) unless elem_type is an integer type or bool, or
 * a uint64 above INT64_MAX. */
bool ms_gguf_kv_int(const ms_gguf_kv *kv, size_t i, int64_t *out);
/* Element i as a double: false unless elem_type is a float or integer type. */
bool ms_gguf_kv_float(const ms_gguf_kv *kv, size_t i, double *out);

/* ---- tensors ---- */

/* Number of tensors, and tensor i in file order. */
size_t ms_gguf_n_tensors(const ms_gguf *g);
const ms_gguf_tensor *ms_gguf_tensor_at(const ms_gguf *g, size_t i);
/* Tensor named `name`, or NULL. O(log n). */
const ms_gguf_tensor *ms_gguf_find_tensor(const ms_gguf *g, const char *name);

/*
 * Dequantize tensor t (any type ms_ggml_type_can_dequantize accepts) into dst[n] float32,
 * n == t->n_elems, in ggml element order (ne[0] fastest). Errors: MS_ERR_UNSUPPORTED naming the
 * tensor and its type, MS_ERR_INVALID_ARG (n).
 */
ms_status ms_gguf_tensor_to_f32(const ms_gguf *g, const ms_gguf_tensor *t, float *dst, size_t n,
                                ms_error *err);

/* ---- writing ---- */

typedef struct ms_gguf_writer ms_gguf_writer;

/*
 * Start writing a GGUF v3 file at `path` (created or truncated), alignment 32. Usage: set metadata
 * (ms_gguf_writer_set_*) and declare every tensor (ms_gguf_writer_add_tensor), then stream the
 * tensors' data in declaration order with ms_gguf_writer_write (any chunk sizes; the header is
 * written on the first call and the padding between tensors is inserted automatically), then
 * ms_gguf_writer_finish. Freeing an unfinished writer removes the partial file.
 * Errors: MS_ERR_IO (cannot create), MS_ERR_OOM.
 */
ms_status ms_gguf_writer_init(ms_gguf_writer **out, const char *path, ms_error *err);
/* Metadata entries (before the first write; a key set twice is MS_ERR_INVALID_ARG). */
ms_status ms_gguf_writer_set_u32(ms_gguf_writer *w, const char *key, uint32_t v, ms_error *err);
ms_status ms_gguf_writer_set_f32(ms_gguf_writer *w, const char *key, float v, ms_error *err);
ms_status ms_gguf_writer_set_bool(ms_gguf_writer *w, const char *key, bool v, ms_error *err);
ms_status ms_gguf_writer_set_str(ms_gguf_writer *w, const char *key, const char *v, ms_error *err);
/* An array of n strings. */
ms_status ms_gguf_writer_set_str_array(ms_gguf_writer *w, const char *key, const char *const *v, size_t n,
                                       ms_error *err);
/*
 * Declare the next tensor: unique non-empty name, a known ggml type (gguf_quant.h), 1..4 dims in
 * ggml order (ne[0] fastest, a multiple of the type's block size). Errors: MS_ERR_INVALID_ARG
 * (any of these, or after the first write), MS_ERR_OOM.
 */
ms_status ms_gguf_writer_add_tensor(ms_gguf_writer *w, const char *name, uint32_t type, int n_dims,
                                    const int64_t *ne, ms_error *err);
/* Append n bytes of tensor data. Writing past the declared total is MS_ERR_INVALID_ARG; a failed
 * write MS_ERR_IO. */
ms_status ms_gguf_writer_write(ms_gguf_writer *w, const void *bytes, size_t n, ms_error *err);
/* Check every declared byte was written, flush and close. Errors: MS_ERR_INVALID_ARG (short),
 * MS_ERR_IO. After finish (success or not) only ms_gguf_writer_free is allowed. */
ms_status ms_gguf_writer_finish(ms_gguf_writer *w, ms_error *err);
/* Free; removes the file unless finish succeeded. NULL accepted. */
void ms_gguf_writer_free(ms_gguf_writer *w);

#ifdef __cplusplus
}
#endif
#endif /* MS_GGUF_H */
