/*
 * rmsnorm.cuh - RMSNorm, optionally fused with the residual add that precedes it.
 *
 * Grid (n_rows), MS_RMSNORM_THREADS threads, 16-byte vectors of activations. Pass 1 forms h (= x, or x + residual
 * rounded to T and stored back to residual) and its sum of squares in float; pass 2 re-reads h
 * (the same thread wrote it, so no barrier is needed) and writes h * rsqrt(mean + eps) * weight.
 */
#pragma once

#include "common/params.h"
#include "common/reduce.cuh"
#include "common/vec.cuh"

namespace ms {

/// TA: activation type of x, residual and out (float, bf16, f16); TW: weight type;
/// ADD_RESIDUAL: fuse residual = x + residual before the norm.
template <typename TA, typename TW, bool ADD_RESIDUAL>
__device__ __forceinline__ void rmsnorm(const ms_rmsnorm_params &p) {
    using T = TA;
    constexpr int VEC = vec_width<T>::value;
    __shared__ float s_buf[32];
    const int row = blockIdx.x;
    const T *x = static_cast<const T *>(p.x) + (long long)row * p.x_stride;
    T *res = ADD_RESIDUAL ? static_cast<T *>(p.residual) + (long long)row * p.dim : nullptr;
    const TW *w = static_cast<const TW *>(p.weight);
    T *out = static_cast<T *>(p.out) + (long long)row * p.out_stride;
    const int nv = p.dim / VEC;

    float ss = 0.f;
    for (int i = threadIdx.x; i < nv; i += blockDim.x) {
        float hv[VEC];
        load_vec<T>(x + i * VEC, hv);
        if (ADD_RESIDUAL) {
            float rv[VEC];
            load_vec<T>(res + i * VEC, rv);
#pragma unroll
            for (int e = 0; e < VEC; e++)
                hv[e] = to_float(from_float<T>(hv[e] + rv[e]));
            store_vec<T>(res + i * VEC, hv);
        }
#pragma unroll
        for (int e = 0; e < VEC; e++)
            ss += hv[e] * hv[e];
    }
    ss = block_sum(ss, s_buf);
    const float inv = rsqrtf(ss / (float)p.dim + p.eps);
    for (int i = threadIdx.x; i < nv; i += blockDim.x) {
        float hv[VEC];
        load_vec<T>((ADD_RESIDUAL ? (const T *)res : x) + i * VEC, hv);
#pragma unroll
        for (int e = 0; e < VEC; e++)
            hv[e] = hv[e] * inv * to_float(w[i * VEC + e]);
        store_vec<T>(out + i * VEC, hv);
    }
}

} // namespace ms
