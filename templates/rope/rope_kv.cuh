/*
 * rope_kv.cuh - RoPE on q (in place) and k, fused with the write of k and v into the KV pages.
 *
 * Grid (n_tokens), MS_ROPE_KV_THREADS threads. Each thread rotates whole pairs, so the in-place
 * update of q is race-free; the angle is pos * inv_freq in float and cos/sin use the accurate
 * sincosf (positions reach 10^5 and more). v is copied with 16-byte accesses.
 */
#pragma once

#include "common/paged_kv.cuh"
#include "common/params.h"
#include "common/rope.cuh"
#include "common/vec.cuh"

namespace ms {

/// T: bf16 or f16; HD: head_dim; PS: page_size; STYLE: kRopeNone / kRopeNeox / kRopeInterleaved;
/// SCALING: kRopeScalingNone / kRopeScalingLlama3.
template <typename T, int HD, int PS, int STYLE, int SCALING>
__device__ __forceinline__ void rope_kv(const ms_rope_kv_params &p) {
    static_assert(HD % 2 == 0, "head_dim must be even");
    constexpr int VEC = vec_width<T>::value;
    static_assert(HD % VEC == 0, "head_dim must be a multiple of 16 bytes");
    const int t = blockIdx.x;
    const int page = p.token_to_page[t], slot = p.token_to_slot[t];
    const float pos = (float)p.pos[t];
    paged_kv<T, HD, PS> kv{static_cast<T *>(p.kv), p.n_kv_heads};
    T *q = static_cast<T *>(p.q) + (long long)t * p.q_stride;
    const T *k = static_cast<const T *>(p.k) + (long long)t * p.k_stride;
    const T *v = static_cast<const T *>(p.v) + (long long)t * p.v_stride;

    if (STYLE == kRopeNone) {
        for (int idx = threadIdx.x; idx < p.n_kv_heads * (HD / VEC); idx += blockDim.x) {
            int hh = idx / (HD / VEC), cc = idx % (HD / VEC);
            *reinterpret_cast<uint4 *>(kv.k_ptr(page, slot, hh) + cc * VEC) =
                *reinterpret_cast<const uint4 *>(k + hh * HD + cc * VEC);
        }
    } else {
        const int n_pairs = (p.n_q_heads + p.n_kv_heads) * (HD / 2);
        for (int idx = threadIdx.x; idx < n_pairs; idx += blockDim.x) {
            const int head = idx / (HD / 2), i = idx % (HD / 2);
            int a, bb;
            rope_pair<STYLE>(i, HD, a, bb);
            const float inv = rope_inv_freq<SCALING>(i, HD, p.theta, p.factor, p.low_freq_factor,
                                                     p.high_freq_factor, p.original_max_pos);
            float sn, cs;
            sincosf(pos * inv, &sn, &cs);
            if (head < p.n_q_heads) {
                T *qh = q + head * HD;
                float xa = to_float(qh[a]), xb = to_float(qh[bb]);
                rope_rotate(xa, xb, cs, sn);
                qh[a] = from_float<T>(xa);
                qh[bb] = from_float<T>(xb);
            } else {
                const int hh = head - p.n_q_heads;
                const T *kh = k + hh * HD;
                float xa = to_float(kh[a]), xb = to_float(kh[bb]);
                rope_rotate(xa, xb, cs, sn);
                T *dst = kv.k_ptr(page, slot, hh);
                dst[a] = from_float<T>(xa);
                dst[bb] = from_float<T>(xb);
            }
        }
    }
    for (int idx = threadIdx.x; idx < p.n_kv_heads * (HD / VEC); idx += blockDim.x) {
        int hh = idx / (HD / VEC), cc = idx % (HD / VEC);
        *reinterpret_cast<uint4 *>(kv.v_ptr(page, slot, hh) + cc * VEC) =
            *reinterpret_cast<const uint4 *>(v + hh * HD + cc * VEC);
    }
}

} // namespace ms
