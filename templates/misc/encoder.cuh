/*
 * encoder.cuh - the encoder ops of the eager CUDA path (Whisper): LayerNorm with bias, exact GELU,
 * im2col for conv1d (the GEMM itself is cuBLAS's), and a broadcast bias add. Part of the misc
 * module (misc/elementwise.cuh includes it), which every model loads, so no model's kernel list
 * has to name these instances.
 *
 * layer_norm: grid (n_rows), MS_MISC_THREADS threads, scalar accesses; pass 1 sums x, pass 2 the
 * squared deviations from the mean (two passes as torch.nn.LayerNorm's biased variance, without
 * the cancellation of E[x^2] - E[x]^2), pass 3 writes. Each thread writes only elements it read,
 * after the block reductions' barriers, so out may alias x.
 * gelu, im2col, bias_add: grid-stride over the output elements, MS_MISC_THREADS threads.
 */
#pragma once

#include "common/params.h"
#include "common/reduce.cuh"
#include "common/vec.cuh"

namespace ms {

/// TA: activation type of x and out; TW: weight and bias type.
/// out[r, :] = (x[r, :] - mean) * rsqrt(var + eps) * w + b  (b optional).
template <typename TA, typename TW> __device__ __forceinline__ void layer_norm(const ms_layer_norm_params &p) {
    __shared__ float s_buf[32];
    const long long row = blockIdx.x;
    const TA *x = static_cast<const TA *>(p.x) + row * p.x_stride;
    TA *out = static_cast<TA *>(p.out) + row * p.out_stride;
    const TW *w = static_cast<const TW *>(p.weight);
    const TW *b = static_cast<const TW *>(p.bias);
    float s = 0.f;
    for (int i = threadIdx.x; i < p.dim; i += blockDim.x)
        s += to_float(x[i]);
    const float mean = block_sum(s, s_buf) / (float)p.dim;
    float ss = 0.f;
    for (int i = threadIdx.x; i < p.dim; i += blockDim.x) {
        const float d = to_float(x[i]) - mean;
        ss += d * d;
    }
    const float inv = rsqrtf(block_sum(ss, s_buf) / (float)p.dim + p.eps);
    for (int i = threadIdx.x; i < p.dim; i += blockDim.x) {
        float v = (to_float(x[i]) - mean) * inv * to_float(w[i]);
        if (b != nullptr)
            v += to_float(b[i]);
        out[i] = from_float<TA>(v);
    }
}

/// T: element type. out[r, c] = 0.5 a (1 + erf(a / sqrt 2)), a = a[r, c] (out may alias a).
template <typename T> __device__ __forceinline__ void gelu(const ms_misc_params &p) {
    const long long total = (long long)p.n_rows * p.n_cols;
    const T *a = static_cast<const T *>(p.a);
    T *out = static_cast<T *>(p.out);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long r = i / p.n_cols, c = i % p.n_cols;
        const float v = to_float(a[r * p.a_stride + c]);
        out[r * p.out_stride + c] = from_float<T>(0.5f * v * (1.f + erff(v * 0.70710678118654752f)));
    }
}

/// TS: source (activation) type; TD: column type (the GEMM input type).
/// col[t, c * k + j] = x[t * stride + j - padding, c], 0 outside [0, t_in): the columns of
/// torch.nn.Conv1d as a GEMM with w [c_out, c_in, k] viewed as [c_out, c_in * k].
template <typename TS, typename TD> __device__ __forceinline__ void im2col(const ms_im2col_params &p) {
    const int width = p.c_in * p.k;
    const long long total = (long long)p.t_out * width;
    const TS *x = static_cast<const TS *>(p.x);
    TD *col = static_cast<TD *>(p.col);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long t = i / width;
        const int rem = (int)(i - t * width), c = rem / p.k, j = rem - c * p.k;
        const long long src = t * p.stride + j - p.padding;
        const float v = src >= 0 && src < p.t_in ? to_float(x[src * p.x_stride + c]) : 0.f;
        col[i] = from_float<TD>(v);
    }
}

/// TA: activation type of a and out; TB: bias type. out[r, c] = a[r, c] + b[c] (out may alias a).
template <typename TA, typename TB> __device__ __forceinline__ void bias_add(const ms_misc_params &p) {
    const long long total = (long long)p.n_rows * p.n_cols;
    const TA *a = static_cast<const TA *>(p.a);
    const TB *b = static_cast<const TB *>(p.b);
    TA *out = static_cast<TA *>(p.out);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long r = i / p.n_cols, c = i % p.n_cols;
        out[r * p.out_stride + c] = from_float<TA>(to_float(a[r * p.a_stride + c]) + to_float(b[c]));
    }
}

} // namespace ms
