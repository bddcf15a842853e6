/*
 * silu_mul.cuh - SiLU-and-multiply of the fused gate/up projection: out = silu(gate) * up.
 *
 * Grid-stride over 16-byte vectors of out; row r reads gate at [r, i] and up at [r, inter + i].
 */
#pragma once

#include "common/params.h"
#include "common/vec.cuh"

namespace ms {

/// T: bf16 or f16.
template <typename T> __device__ __forceinline__ void silu_mul(const ms_silu_mul_params &p) {
    constexpr int VEC = vec_width<T>::value;
    const int per_row = p.inter / VEC;
    const long long total = (long long)p.n_rows * per_row;
    const T *gu = static_cast<const T *>(p.gate_up);
    T *out = static_cast<T *>(p.out);
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const long long r = idx / per_row;
        const int c = (int)(idx % per_row) * VEC;
        float g[VEC], u[VEC];
        load_vec<T>(gu + r * 2 * p.inter + c, g);
        load_vec<T>(gu + r * 2 * p.inter + p.inter + c, u);
#pragma unroll
        for (int e = 0; e < VEC; e++)
            g[e] = g[e] / (1.f + __expf(-g[e])) * u[e];
        store_vec<T>(out + r * p.inter + c, g);
    }
}

} // namespace ms
