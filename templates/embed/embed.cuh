/*
 * embed.cuh - embedding gather: out[t] = table[ids[t]].
 *
 * Grid (n_tokens), MS_EMBED_THREADS threads, 16-byte copies. A device kernel cannot return an
 * error, so an out-of-range id writes zeros and raises *bad_id for the host to check.
 */
#pragma once

#include "common/params.h"
#include "common/vec.cuh"

namespace ms {

/// T: bf16 or f16.
template <typename T> __device__ __forceinline__ void embed(const ms_embed_params &p) {
    constexpr int VEC = vec_width<T>::value;
    const int t = blockIdx.x;
    const int id = p.ids[t];
    const bool ok = id >= 0 && id < p.vocab;
    if (!ok && threadIdx.x == 0 && p.bad_id != nullptr)
        atomicExch(p.bad_id, 1);
    const uint4 *src = reinterpret_cast<const uint4 *>(static_cast<const T *>(p.table) +
                                                       (long long)(ok ? id : 0) * p.dim);
    uint4 *dst = reinterpret_cast<uint4 *>(static_cast<T *>(p.out) + (long long)t * p.dim);
    for (int i = threadIdx.x; i < p.dim / VEC; i += blockDim.x)
        dst[i] = ok ? src[i] : make_uint4(0u, 0u, 0u, 0u);
}

} // namespace ms
