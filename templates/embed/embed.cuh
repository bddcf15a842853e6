/*
 * embed.cuh - embedding gather: out[t] = table[ids[t]].
 *
 * Grid (n_tokens), MS_EMBED_THREADS threads, converting element by element. A device kernel cannot return an
 * error, so an out-of-range id writes zeros and raises *bad_id for the host to check.
 */
#pragma once

#include "common/params.h"
#include "common/vec.cuh"

namespace ms {

/// TW: table type (bf16 or f16); TA: output type (float, bf16 or f16).
template <typename TW, typename TA> __device__ __forceinline__ void embed(const ms_embed_params &p) {
    const int t = blockIdx.x;
    const int id = p.ids[t];
    const bool ok = id >= 0 && id < p.vocab;
    if (!ok && threadIdx.x == 0 && p.bad_id != nullptr)
        atomicExch(p.bad_id, 1);
    const TW *src = static_cast<const TW *>(p.table) + (long long)(ok ? id : 0) * p.dim;
    TA *dst = static_cast<TA *>(p.out) + (long long)t * p.dim;
    for (int i = threadIdx.x; i < p.dim; i += blockDim.x)
        dst[i] = from_float<TA>(ok ? to_float(src[i]) : 0.f);
}

} // namespace ms
