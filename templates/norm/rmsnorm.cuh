/*
 * rmsnorm.cuh - RMSNorm, optionally fused with the residual add that precedes it; and the
 * per-head RMSNorm of q and k (Qwen3 q_norm / k_norm).
 *
 * rmsnorm: grid (n_rows), MS_RMSNORM_THREADS threads, 16-byte vectors of activations. Pass 1
 * forms h (= x, or x + residual rounded to T and stored back to residual) and its sum of squares
 * in float; pass 2 writes h * rsqrt(mean + eps) * weight. Rows of up to 4 vectors per thread
 * (8192 bf16 values at 256 threads) keep h and the weight in registers, the weight loaded in pass 1
 * beside x so that both reads overlap (a decode step's norms are latency-bound: one CTA per row;
 * ncu on the H200 had them at 6.2 us each at batch 1, two dependent trips to device memory); longer
 * rows re-read h in pass 2 (the same thread wrote it, so no barrier is needed). Both give the same
 * bits: the same sums in the same order.
 *
 * rmsnorm_heads: one warp per (token, head) row of HD elements, MS_RMSNORM_THREADS / 32 rows per
 * CTA, grid ceil(n_rows * n_heads / (MS_RMSNORM_THREADS / 32)). Lane l holds elements
 * l, l + 32, ... in registers, so the row is read once and may be normalized in place; scalar
 * accesses (head_dim need not be a multiple of 16 bytes, e.g. 48 bf16).
 */
#pragma once

#include "common/params.h"
#include "common/q8x.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"

namespace ms {

/// TA: activation type of x and residual (float, bf16, f16); TW: weight type;
/// ADD_RESIDUAL: fuse residual = x + residual before the norm; TO: type of out (TA, or the 16-bit
/// input type of the GEMM that reads it: backend_cuda.c cu_rms_norm_linear; the value is the
/// same float rounded once, as the linear's convert would; or q8x_out: out quantized per 32 values
/// for the integer GEMV, common/q8x.cuh, from the same float values, p.dim a multiple of 32).
template <typename TA, typename TW, bool ADD_RESIDUAL, typename TO = TA>
__device__ __forceinline__ void rmsnorm(const ms_rmsnorm_params &p) {
    using T = TA;
    constexpr int VEC = vec_width<T>::value;
    __shared__ float s_buf[32];
    const int row = blockIdx.x;
    const T *x = static_cast<const T *>(p.x) + (long long)row * p.x_stride;
    T *res = ADD_RESIDUAL ? static_cast<T *>(p.residual) + (long long)row * p.dim : nullptr;
    const TW *w = static_cast<const TW *>(p.weight);
    constexpr bool kQ8 = is_q8x_out<TO>::value;
    static_assert(!kQ8 || 32 % VEC == 0, "rmsnorm: q8 output needs whole 32-value blocks of lanes");
    /* out as TO, or (kQ8) the int8 values and the scales of the row */
    using TS = typename q8x_storage<TO>::type;
    TS *out = static_cast<TS *>(p.out) + (long long)row * p.out_stride;
    signed char *q8 = reinterpret_cast<signed char *>(out);
    float *q8d = kQ8 ? p.out_scale + (long long)row * p.scale_stride : nullptr;
    const int nv = p.dim / VEC;
    constexpr int kKeep = 4; /* 16-byte vectors per thread kept in registers: dim up to 4 x 8 x 256 bf16 */

    constexpr bool kWVec = (VEC * sizeof(TW)) % 16 == 0; /* the weight's VEC elements are whole 16-byte chunks */
    if (nv <= kKeep * (int)blockDim.x) {
        /* the row in registers: x (and residual) and the weight loaded together, the row read once */
        float hv[kKeep][VEC], wv[kKeep][VEC];
        float ss = 0.f;
#pragma unroll
        for (int k = 0; k < kKeep; k++) {
            const int i = threadIdx.x + k * blockDim.x;
            if (i < nv) {
                if constexpr (kWVec) {
                    load_n<TW, VEC>(w + i * VEC, wv[k]);
                } else {
#pragma unroll
                    for (int e = 0; e < VEC; e++)
                        wv[k][e] = to_float(w[i * VEC + e]);
                }
                load_vec<T>(x + i * VEC, hv[k]);
                if (ADD_RESIDUAL) {
                    float rv[VEC];
                    load_vec<T>(res + i * VEC, rv);
#pragma unroll
                    for (int e = 0; e < VEC; e++)
                        hv[k][e] = to_float(from_float<T>(hv[k][e] + rv[e]));
                    store_vec<T>(res + i * VEC, hv[k]);
                }
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    ss += hv[k][e] * hv[k][e];
            }
        }
        ss = block_sum(ss, s_buf);
        const float inv = rsqrtf(ss / (float)p.dim + p.eps);
#pragma unroll
        for (int k = 0; k < kKeep; k++) {
            const int i = threadIdx.x + k * blockDim.x;
            if constexpr (kQ8) {
                if (k * (int)blockDim.x >= nv)
                    break; /* uniform over the CTA: every lane of a warp takes part in the shuffles */
                float o[VEC];
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    o[e] = i < nv ? hv[k][e] * inv * wv[k][e] : 0.f;
                q8x_store<VEC>(o, i < nv, q8 + i * VEC, q8d + i / (32 / VEC), i % (32 / VEC));
            } else if (i < nv) {
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    hv[k][e] = hv[k][e] * inv * wv[k][e];
                store_any<TO, VEC>(out + i * VEC, hv[k]);
            }
        }
        return;
    }
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
    if constexpr (kQ8) {
        /* the CTA steps together, so that every lane of a warp takes part in the shuffles */
        for (int base = 0; base < nv; base += blockDim.x) {
            const int i = base + threadIdx.x;
            float hv[VEC];
            if (i < nv) {
                load_vec<T>((ADD_RESIDUAL ? (const T *)res : x) + i * VEC, hv);
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    hv[e] = hv[e] * inv * to_float(w[i * VEC + e]);
            } else {
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    hv[e] = 0.f;
            }
            q8x_store<VEC>(hv, i < nv, q8 + i * VEC, q8d + i / (32 / VEC), i % (32 / VEC));
        }
    } else {
        for (int i = threadIdx.x; i < nv; i += blockDim.x) {
            float hv[VEC];
            load_vec<T>((ADD_RESIDUAL ? (const T *)res : x) + i * VEC, hv);
#pragma unroll
            for (int e = 0; e < VEC; e++)
                hv[e] = hv[e] * inv * to_float(w[i * VEC + e]);
            store_any<TO, VEC>(out + i * VEC, hv);
        }
    }
}

/// TA: activation type of x and out (float, bf16, f16); TW: weight type; HD: head_dim.
template <typename TA, typename TW, int HD>
__device__ __forceinline__ void rmsnorm_heads(const ms_rmsnorm_params &p) {
    static_assert(HD >= 1 && HD <= 1024, "head_dim must be in [1, 1024]");
    constexpr int PER = (HD + 31) / 32; /* elements per lane */
    constexpr int ROWS = MS_RMSNORM_THREADS / 32;
    const int lane = threadIdx.x & 31;
    const long long row = (long long)blockIdx.x * ROWS + (threadIdx.x >> 5);
    if (row >= (long long)p.n_rows * p.n_heads)
        return; /* the whole warp leaves: row is uniform across it */
    const long long t = row / p.n_heads;
    const int h = (int)(row - t * p.n_heads);
    const TA *x = static_cast<const TA *>(p.x) + t * p.x_stride + (long long)h * HD;
    TA *out = static_cast<TA *>(p.out) + t * p.out_stride + (long long)h * HD;
    const TW *w = static_cast<const TW *>(p.weight);

    float v[PER];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int i = lane + 32 * k;
        v[k] = (HD % 32 == 0 || i < HD) ? to_float(x[i]) : 0.f;
        ss += v[k] * v[k];
    }
    ss = warp_sum(ss);
    const float inv = rsqrtf(ss / (float)HD + p.eps);
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int i = lane + 32 * k;
        if (HD % 32 == 0 || i < HD)
            out[i] = from_float<TA>(v[k] * inv * to_float(w[i]));
    }
}

} // namespace ms
