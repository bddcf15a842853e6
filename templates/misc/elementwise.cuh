/*
 * elementwise.cuh - small row-wise helpers of the eager CUDA path: type conversion (activations to
 * the GEMM input type), residual add, row gather. All take ms_misc_params; 2-D strided rows.
 *
 * Grid-stride over rows x cols with MS_MISC_THREADS threads per block, element by element (these
 * run on activations, which are small next to weights and KV); convert, on every linear's input,
 * has a 2-D grid and 8-element vectors.
 */
#pragma once

#include "common/params.h"
#include "common/vec.cuh"

namespace ms {

/// TS: source type, TD: destination type. dst[r, c] = src[r, c].
/// Grid (x: column blocks, y: rows, each a stride loop): no 64-bit division per element, and 8
/// elements a thread (16- / 32-byte accesses) when the columns, both strides and both pointers
/// allow it; element by element otherwise. The linear's input (backend_cuda.c cu_linear) goes
/// through here: a prefill's 2048 x 14336 SwiGLU output is 176 MB of traffic.
template <typename TS, typename TD> __device__ __forceinline__ void convert(const ms_misc_params &p) {
    constexpr int V = 8;
    const TS *src = static_cast<const TS *>(p.a);
    TD *dst = static_cast<TD *>(p.out);
    const bool vec = p.n_cols % V == 0 && p.a_stride % V == 0 && p.out_stride % V == 0 &&
                     (reinterpret_cast<unsigned long long>(src) % 16) == 0 &&
                     (reinterpret_cast<unsigned long long>(dst) % 16) == 0;
    const int units = vec ? p.n_cols / V : p.n_cols;
    for (int r = blockIdx.y; r < p.n_rows; r += gridDim.y) {
        const TS *s = src + (long long)r * p.a_stride;
        TD *d = dst + (long long)r * p.out_stride;
        for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < units; c += gridDim.x * blockDim.x) {
            if (vec) {
                float f[V];
                load_n<TS, V>(s + c * V, f);
                store_n<TD, V>(d + c * V, f);
            } else {
                d[c] = from_float<TD>(to_float(s[c]));
            }
        }
    }
}

/// T: element type. out[r, c] = a[r, c] + b[r, c] (out may alias a or b).
template <typename T> __device__ __forceinline__ void add(const ms_misc_params &p) {
    const long long total = (long long)p.n_rows * p.n_cols;
    const T *a = static_cast<const T *>(p.a), *b = static_cast<const T *>(p.b);
    T *out = static_cast<T *>(p.out);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long r = i / p.n_cols, c = i % p.n_cols;
        out[r * p.out_stride + c] =
            from_float<T>(to_float(a[r * p.a_stride + c]) + to_float(b[r * p.b_stride + c]));
    }
}

/// T: element type. out[r, :] = a[rows[r], :], zeros when rows[r] < 0.
template <typename T> __device__ __forceinline__ void gather_rows(const ms_misc_params &p) {
    const long long total = (long long)p.n_rows * p.n_cols;
    const T *a = static_cast<const T *>(p.a);
    T *out = static_cast<T *>(p.out);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long r = i / p.n_cols, c = i % p.n_cols;
        int src = p.rows[r];
        out[r * p.out_stride + c] = src >= 0 ? a[(long long)src * p.a_stride + c] : from_float<T>(0.f);
    }
}

/// T: element type. out[r, :] = rows[r] == 0 ? a[r, :] : b[r, :] (a code predictor's input:
/// the frame's first row from a, the others from b; out may alias a or b).
template <typename T> __device__ __forceinline__ void select_rows(const ms_misc_params &p) {
    const long long total = (long long)p.n_rows * p.n_cols;
    const T *a = static_cast<const T *>(p.a), *b = static_cast<const T *>(p.b);
    T *out = static_cast<T *>(p.out);
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long r = i / p.n_cols, c = i % p.n_cols;
        out[r * p.out_stride + c] = p.rows[r] == 0 ? a[r * p.a_stride + c] : b[r * p.b_stride + c];
    }
}

} // namespace ms

// the encoder ops (LayerNorm, GELU, im2col, bias add), the 16-bit weight GEMV and the SiLU-and-
// multiply into the GEMM input type (act/silu_mul.cuh silu_mul_to) are entries of the same module
#include "act/silu_mul.cuh"
#include "misc/encoder.cuh"
#include "misc/gemv.cuh"
