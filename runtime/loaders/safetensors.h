/*
 * safetensors.h - read (mmap) and write (streamed) safetensors files.
 *
 * Format (https://github.com/huggingface/safetensors): 8 bytes little-endian u64 N, then N bytes of
 * UTF-8 JSON header {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 * "__metadata__": {str: str}}, then the data region; offsets are relative to the data region.
 *
 * The reader validates everything before handing out a tensor: header length sane and inside the
 * file, JSON well formed with no duplicate names, dtype one of F32/BF16/F16/I32/I64 (every other
 * safetensors dtype is rejected by name; checkpoints accept only the float ones), shape entries
 * non-negative, begin <= end <= data size,
 * end - begin == product(shape) * dtype size, no two tensors overlapping and no holes (the spec
 * requires the data region to be fully indexed). Data of a valid file need not be aligned (the
 * data region starts at 8 + N for any N): read it through ms_st_tensor_to_f32/_to_bf16, which copy
 * without unaligned loads, or ms_st_tensor_f32_data, which returns a pointer only when aligned.
 *
 * Ownership: ms_st_* functions borrow their arguments; objects returned by *_init are owned by the
 * caller and released with the matching *_free (NULL accepted). Tensor descriptors returned by a
 * file (and their name and data pointers) live as long as the file.
 * Errors: one line "<path>: <problem>" in the caller's ms_error.
 *
 * Usage:
 *     ms_st_file *f = NULL;
 *     MS_TRY(ms_st_file_init(&f, "model.safetensors", err));
 *     const ms_st_tensor *t = ms_st_file_find_tensor(f, "model.norm.weight");
 *     float *w = ms_malloc(t->n_elems * sizeof *w);
 *     ms_st_tensor_to_f32(t, w, t->n_elems, err);
 *     ms_st_file_free(f);
 */
#ifndef MS_SAFETENSORS_H
#define MS_SAFETENSORS_H

#include "ms_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- dtypes ---- */

/*
 * Element types the reader accepts. Weights are F32/BF16/F16 (checkpoint.h rejects any other dtype
 * in a checkpoint); I32/I64 are for data files such as the fixtures' reference.safetensors (token
 * ids). ORDER MS_ST_DTYPE: keep the tables in safetensors.c in sync.
 */
typedef enum ms_st_dtype {
    MS_ST_DTYPE_F32 = 0,   /* IEEE binary32 */
    MS_ST_DTYPE_BF16 = 1,  /* bfloat16: the upper 16 bits of a binary32 */
    MS_ST_DTYPE_F16 = 2,   /* IEEE binary16 */
    MS_ST_DTYPE_I32 = 3,   /* int32 (data files only) */
    MS_ST_DTYPE_I64 = 4,   /* int64 (data files only) */
    MS_ST_DTYPE_COUNT
} ms_st_dtype;

/* Bit set of dtypes (bit d = 1u << d), used by ms_ckpt_expect_tensor. */
#define MS_ST_DTYPE_BIT(d) (1u << (unsigned)(d))
#define MS_ST_DTYPES_FLOAT \
    (MS_ST_DTYPE_BIT(MS_ST_DTYPE_F32) | MS_ST_DTYPE_BIT(MS_ST_DTYPE_BF16) | MS_ST_DTYPE_BIT(MS_ST_DTYPE_F16))

/* The safetensors name of a dtype ("F32", "BF16", "F16", "I32", "I64"); "?" for values out of range. */
const char *ms_st_dtype_name(ms_st_dtype d);
/* Bytes per element (8, 4 or 2); 0 for values out of range. */
size_t ms_st_dtype_size(ms_st_dtype d);
/* Parse a safetensors dtype name; MS_ERR_UNSUPPORTED for a known but unsupported name (I64, F64,
 * ...), MS_ERR_FORMAT for an unknown one. Does not fill an ms_error. */
ms_status ms_st_dtype_parse(const char *name, ms_st_dtype *out);

/* Write "F32, BF16" (the names of the dtypes set in `mask`) into buf (always NUL-terminated). */
void ms_st_dtype_mask_str(unsigned mask, char *buf, size_t cap);

/* ---- scalar conversions (exposed for kernels' reference paths and tests) ---- */

/* bf16 bits -> float (exact). */
float ms_bf16_to_f32(uint16_t h);
/* float -> bf16 bits, round to nearest even; NaN stays a (quiet) NaN of the same sign. */
uint16_t ms_f32_to_bf16(float f);
/* IEEE half bits -> float (exact, subnormals, inf and NaN included). */
float ms_f16_to_f32(uint16_t h);
/* float -> IEEE half bits, round to nearest even, overflow to inf. */
uint16_t ms_f32_to_f16(float f);

/* ---- reading ---- */

/* Maximum rank of a tensor the loaders accept. */
#define MS_ST_MAX_DIMS 8

/* One tensor of a safetensors file, validated. Borrowed from its file. */
typedef struct ms_st_tensor {
    const char *name;               /* NUL-terminated tensor name */
    ms_st_dtype dtype;              /* element type */
    int n_dims;                     /* rank, 0 .. MS_ST_MAX_DIMS (0 = scalar, 1 element) */
    int64_t shape[MS_ST_MAX_DIMS];  /* [n_dims] sizes, row-major (last index fastest) */
    size_t n_elems;                 /* product(shape) */
    size_t n_bytes;                 /* n_elems * ms_st_dtype_size(dtype) */
    size_t file_offset;             /* absolute byte offset of the data in the file */
    const void *data;               /* n_bytes little-endian bytes in the mapping; maybe unaligned */
    const char *file_path;          /* path of the file holding it (for messages) */
} ms_st_tensor;

typedef struct ms_st_file ms_st_file;

/*
 * Map and validate the safetensors file at `path`. On success *out owns the mapping and every
 * tensor descriptor. Errors: MS_ERR_IO (cannot open/stat/map), MS_ERR_FORMAT (any validation
 * failure above, file too short, header length insane), MS_ERR_PARSE (header is not JSON),
 * MS_ERR_UNSUPPORTED (dtype outside F32/BF16/F16/I32/I64, rank > MS_ST_MAX_DIMS), MS_ERR_OOM.
 */
ms_status ms_st_file_init(ms_st_file **out, const char *path, ms_error *err);
/* Unmap and free. NULL accepted. */
void ms_st_file_free(ms_st_file *f);

/* Path the file was opened with (borrowed). */
const char *ms_st_file_path(const ms_st_file *f);
/* Number of tensors. */
size_t ms_st_file_n_tensors(const ms_st_file *f);
/* Tensor i (0 <= i < n), in ascending strcmp order of names. */
const ms_st_tensor *ms_st_file_tensor_at(const ms_st_file *f, size_t i);
/* Tensor named `name`, or NULL. O(log n). */
const ms_st_tensor *ms_st_file_find_tensor(const ms_st_file *f, const char *name);
/* Value of __metadata__[key] (borrowed string), or NULL when absent. */
const char *ms_st_file_metadata(const ms_st_file *f, const char *key);

/*
 * Convert a float tensor (F32/BF16/F16) to float32 into dst[n] (n must equal t->n_elems; a count
 * mismatch or an integer tensor is MS_ERR_INVALID_ARG naming the tensor). Works for unaligned data
 * (byte copies, no unaligned loads).
 */
ms_status ms_st_tensor_to_f32(const ms_st_tensor *t, float *dst, size_t n, ms_error *err);
/* Same, into bf16 bits (F32 rounds to nearest even; F16 goes through float exactly). */
ms_status ms_st_tensor_to_bf16(const ms_st_tensor *t, uint16_t *dst, size_t n, ms_error *err);
/* Convert an integer tensor (I32, or I64 with every value in int32 range: MS_ERR_FORMAT otherwise)
 * into dst[n]; a float tensor or a count mismatch is MS_ERR_INVALID_ARG. */
ms_status ms_st_tensor_to_i32(const ms_st_tensor *t, int32_t *dst, size_t n, ms_error *err);
/* Zero-copy view: the data as floats when the tensor is F32 and 4-byte aligned, else NULL. */
const float *ms_st_tensor_f32_data(const ms_st_tensor *t);

/* Write "[512, 128]" into buf (always NUL-terminated). */
void ms_st_shape_str(int n_dims, const int64_t *shape, char *buf, size_t cap);

/* ---- writing ---- */

typedef struct ms_st_writer ms_st_writer;

/*
 * Start writing the safetensors file at `path` (created or truncated). Usage: declare every
 * tensor with ms_st_writer_add_tensor, then stream their data in declaration order with
 * ms_st_writer_write (any chunk sizes; nothing is held in memory but a small buffer), then
 * ms_st_writer_finish. Freeing an unfinished writer removes the partial file.
 * Errors: MS_ERR_IO (cannot create), MS_ERR_OOM.
 */
ms_status ms_st_writer_init(ms_st_writer **out, const char *path, ms_error *err);
/* Set a __metadata__ string entry (before the first write). */
ms_status ms_st_writer_set_metadata(ms_st_writer *w, const char *key, const char *value, ms_error *err);
/*
 * Declare the next tensor: name (unique, non-empty, not "__metadata__"), dtype, rank and shape.
 * Errors: MS_ERR_INVALID_ARG (duplicate/empty name, bad rank or negative size, after the first
 * write), MS_ERR_OOM.
 */
ms_status ms_st_writer_add_tensor(ms_st_writer *w, const char *name, ms_st_dtype dtype, int n_dims,
                                  const int64_t *shape, ms_error *err);
/* Append n bytes of tensor data (the header is written on the first call). Writing past the
 * declared total is MS_ERR_INVALID_ARG; a failed write MS_ERR_IO. */
ms_status ms_st_writer_write(ms_st_writer *w, const void *bytes, size_t n, ms_error *err);
/* Check every declared byte was written, flush and close. Errors: MS_ERR_INVALID_ARG (short),
 * MS_ERR_IO. After finish (success or not) only ms_st_writer_free is allowed. */
ms_status ms_st_writer_finish(ms_st_writer *w, ms_error *err);
/* Free; removes the file unless finish succeeded. NULL accepted. */
void ms_st_writer_free(ms_st_writer *w);

#ifdef __cplusplus
}
#endif
#endif /* MS_SAFETENSORS_H */
