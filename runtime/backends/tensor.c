/*
 * tensor.c - dtypes and tensor views of the op interface (declared in backend.h): names and
 * element sizes, row-major views with free outer strides, slices, head splits, shape strings.
 * Descriptions only: nothing here owns or touches the memory a tensor points at.
 */
#include "backend.h"

#include <stdio.h>
#include <string.h>

#include "gguf_quant.h"

/* ---- dtypes ---- */

const char *ms_dtype_str(ms_dtype dt) {
    switch (dt) {
    case MS_DTYPE_F32: return "f32";
    case MS_DTYPE_BF16: return "bf16";
    case MS_DTYPE_F16: return "f16";
    case MS_DTYPE_I32: return "i32";
    case MS_DTYPE_Q4_0: return "q4_0";
    case MS_DTYPE_Q4_1: return "q4_1";
    case MS_DTYPE_Q5_0: return "q5_0";
    case MS_DTYPE_Q8_0: return "q8_0";
    case MS_DTYPE_Q4_K: return "q4_k";
    case MS_DTYPE_Q5_K: return "q5_k";
    case MS_DTYPE_Q6_K: return "q6_k";
    default: return "?";
    }
}

size_t ms_dtype_size(ms_dtype dt) {
    switch (dt) {
    case MS_DTYPE_F32: return 4;
    case MS_DTYPE_BF16: return 2;
    case MS_DTYPE_F16: return 2;
    case MS_DTYPE_I32: return 4;
    default: return 0;
    }
}

/* ORDER: MS_DTYPE_Q4_0 .. MS_DTYPE_Q6_K */
static const uint32_t quant_ggml[] = {MS_GGML_TYPE_Q4_0, MS_GGML_TYPE_Q4_1, MS_GGML_TYPE_Q5_0, MS_GGML_TYPE_Q8_0,
                                      MS_GGML_TYPE_Q4_K, MS_GGML_TYPE_Q5_K, MS_GGML_TYPE_Q6_K};

bool ms_dtype_is_quant(ms_dtype dt) {
    return dt >= MS_DTYPE_Q4_0 && dt <= MS_DTYPE_Q6_K;
}

int ms_dtype_ggml_type(ms_dtype dt) {
    return ms_dtype_is_quant(dt) ? (int)quant_ggml[dt - MS_DTYPE_Q4_0] : -1;
}

ms_dtype ms_dtype_from_ggml(uint32_t type) {
    for (int i = 0; i < (int)MS_ARRAY_LEN(quant_ggml); i++)
        if (quant_ggml[i] == type)
            return (ms_dtype)(MS_DTYPE_Q4_0 + i);
    return MS_DTYPE_COUNT;
}

size_t ms_dtype_row_bytes(ms_dtype dt, int64_t cols) {
    if (cols < 0)
        return 0;
    if (!ms_dtype_is_quant(dt))
        return (size_t)cols * ms_dtype_size(dt);
    uint32_t t = quant_ggml[dt - MS_DTYPE_Q4_0];
    size_t blk = ms_ggml_type_block(t);
    return blk == 0 || (size_t)cols % blk != 0 ? 0 : (size_t)cols / blk * ms_ggml_type_block_bytes(t);
}

/* The scalar conversions declared in backend.h (ms_bf16_to_f32, ...) are defined once, in
 * safetensors.c (same prototypes in safetensors.h); the loaders and the backends share them. */

/* ---- tensors ---- */

ms_tensor ms_tensor_make(void *data, ms_dtype dt, int32_t ndim, const int64_t *shape) {
    MS_ASSERT(ndim >= 1 && ndim <= MS_TENSOR_MAX_DIMS);
    ms_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dt;
    t.ndim = ndim;
    for (int i = 0; i < MS_TENSOR_MAX_DIMS; i++)
        t.shape[i] = 1;
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        t.shape[i] = shape[i];
        t.stride[i] = s;
        s *= shape[i];
    }
    return t;
}

ms_tensor ms_tensor_1d(void *data, ms_dtype dt, int64_t n0) {
    int64_t s[1] = {n0};
    return ms_tensor_make(data, dt, 1, s);
}

ms_tensor ms_tensor_2d(void *data, ms_dtype dt, int64_t n0, int64_t n1) {
    int64_t s[2] = {n0, n1};
    return ms_tensor_make(data, dt, 2, s);
}

ms_tensor ms_tensor_3d(void *data, ms_dtype dt, int64_t n0, int64_t n1, int64_t n2) {
    int64_t s[3] = {n0, n1, n2};
    return ms_tensor_make(data, dt, 3, s);
}

ms_tensor ms_tensor_slice(const ms_tensor *t, int32_t dim, int64_t start, int64_t len) {
    MS_ASSERT(dim >= 0 && dim < t->ndim);
    MS_ASSERT(start >= 0 && len >= 0 && start + len <= t->shape[dim]);
    ms_tensor v = *t;
    v.data = (char *)t->data + (size_t)(start * t->stride[dim]) * ms_dtype_size(t->dtype);
    v.shape[dim] = len;
    return v;
}

ms_tensor ms_tensor_split_heads(const ms_tensor *t, int64_t h, int64_t d) {
    MS_ASSERT(t->ndim == 2 && t->shape[1] == h * d && t->stride[1] == 1);
    ms_tensor v = *t;
    v.ndim = 3;
    v.shape[1] = h;
    v.shape[2] = d;
    v.stride[1] = d;
    v.stride[2] = 1;
    return v;
}

int64_t ms_tensor_numel(const ms_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

bool ms_tensor_is_contiguous(const ms_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s)
            return false;
        s *= t->shape[i];
    }
    return true;
}

const char *ms_tensor_shape_str(const ms_tensor *t, char *buf, size_t size) {
    size_t o = 0;
    if (size == 0)
        return buf;
    buf[0] = '\0';
    o += (size_t)snprintf(buf + o, size - o, "[");
    for (int i = 0; i < t->ndim && o < size; i++)
        o += (size_t)snprintf(buf + o, size - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (o < size)
        snprintf(buf + o, size - o, "]");
    return buf;
}

