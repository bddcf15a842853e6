/*
 * silu_mul.cuh - SiLU-and-multiply of the fused gate/up projection: out = silu(gate) * up.
 *
 * Grid-stride over 16-byte vectors of out; each element is read before its own write, so out may
 * alias gate or up.
 */
#pragma once

#include "common/params.h"
#include "common/q8x.cuh"
#include "common/vec.cuh"

namespace ms {

/// T: activation type (float, bf16 or f16).
template <typename T> __device__ __forceinline__ void silu_mul(const ms_silu_mul_params &p) {
    constexpr int VEC = vec_width<T>::value;
    const int per_row = p.inter / VEC;
    const long long total = (long long)p.n_rows * per_row;
    const T *gate = static_cast<const T *>(p.gate), *up = static_cast<const T *>(p.up);
    T *out = static_cast<T *>(p.out);
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const long long r = idx / per_row;
        const int c = (int)(idx % per_row) * VEC;
        float g[VEC], u[VEC];
        load_vec<T>(gate + r * p.gate_stride + c, g);
        load_vec<T>(up + r * p.up_stride + c, u);
#pragma unroll
        for (int e = 0; e < VEC; e++)
            g[e] = g[e] / (1.f + __expf(-g[e])) * u[e];
        store_vec<T>(out + r * p.out_stride + c, g);
    }
}

/// TI: input type (float), TO: output type (bf16 / f16, the down projection's GEMM input). The
/// SiLU-and-multiply written straight in the type the GEMM reads (backend_cuda.c
/// cu_silu_mul_linear), instead of silu_mul<float> and then the linear's convert: the same
/// expression per element, rounded once, so the GEMM sees the bits the two kernels gave. 8
/// elements a thread; out must not alias gate or up (it is narrower).
template <typename TI, typename TO>
__device__ __forceinline__ void silu_mul_to(const ms_silu_mul_params &p) {
    constexpr int V = 8;
    const int per_row = p.inter / V;
    const long long total = (long long)p.n_rows * per_row;
    const TI *gate = static_cast<const TI *>(p.gate), *up = static_cast<const TI *>(p.up);
    TO *out = static_cast<TO *>(p.out);
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const long long r = idx / per_row;
        const int c = (int)(idx % per_row) * V;
        float g[V], u[V];
        load_n<TI, V>(gate + r * p.gate_stride + c, g);
        load_n<TI, V>(up + r * p.up_stride + c, u);
#pragma unroll
        for (int e = 0; e < V; e++)
            g[e] = g[e] / (1.f + __expf(-g[e])) * u[e];
        store_n<TO, V>(out + r * p.out_stride + c, g);
    }
}

/// T: input type (float). The SiLU-and-multiply quantized for the integer GEMV of the down
/// projection (common/q8x.cuh: out int8 values, out_stride bytes, p.out_scale per 32 values; the
/// same expression per element as silu_mul, so the same bytes as silu_mul then ms_qquant_x). 8
/// elements a thread, the 4 threads of a 32-value block consecutive; the CTA's threads step through
/// the grid together (every lane takes part in the shuffles). p.inter a multiple of 32.
template <typename T> __device__ __forceinline__ void silu_mul_q8(const ms_silu_mul_params &p) {
    constexpr int V = 8;
    const int per_row = p.inter / V;
    const long long total = (long long)p.n_rows * per_row;
    const T *gate = static_cast<const T *>(p.gate), *up = static_cast<const T *>(p.up);
    const int sub = (int)(threadIdx.x % (32 / V));
    for (long long i0 = (long long)blockIdx.x * blockDim.x; i0 < total; i0 += (long long)gridDim.x * blockDim.x) {
        const long long idx = i0 + threadIdx.x;
        const bool ok = idx < total;
        const long long r = ok ? idx / per_row : 0;
        const int c = ok ? (int)(idx % per_row) * V : 0;
        float g[V], u[V];
        if (ok) {
            load_n<T, V>(gate + r * p.gate_stride + c, g);
            load_n<T, V>(up + r * p.up_stride + c, u);
#pragma unroll
            for (int e = 0; e < V; e++)
                g[e] = g[e] / (1.f + __expf(-g[e])) * u[e];
        } else {
#pragma unroll
            for (int e = 0; e < V; e++)
                g[e] = 0.f;
        }
        q8x_store<V>(g, ok, static_cast<signed char *>(p.out) + r * p.out_stride + c,
                     p.out_scale + r * p.scale_stride + c / 32, sub);
    }
}

} // namespace ms
