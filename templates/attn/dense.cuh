/*
 * attn/dense.cuh - dense (unpaged) self-attention over the step's own K/V rows: the Whisper
 * encoder's bidirectional attention (backend.h attention_dense; HF WhisperAttention without a
 * mask). No pages, no page table: segment b holds the packed rows [indptr[b], indptr[b+1]) and
 * each of its query rows attends to every K/V row of that segment and to no other.
 *
 * One warp per (query row, query head): grid (ceil(n_tokens / ROWS), n_q_heads) with
 * ROWS = MS_ATTN_DENSE_THREADS / 32 query rows per CTA. Lane l holds elements l, l + 32, ... (those
 * below head_dim: Whisper tiny's fixture has 16) of q and of the output accumulator in registers; for each key row of the segment (in row order)
 * the warp forms the dot product with a shuffle reduction and updates a running max / sum (the
 * online softmax of the CPU reference, in float). Activations are float32 (the CUDA backend's),
 * so there is no dtype parameter. Simple rather than fast: a tiled tensor-core variant is the
 * next step (docs/perf.md), this one is the correctness baseline the GPU test pins.
 */
#pragma once

#include "common/params.h"
#include "common/reduce.cuh"

namespace ms {

/// HD: head_dim, 1 .. 256 (lanes hold ceil(HD / 32) elements each, the last ones masked).
template <int HD>
__device__ __forceinline__ void attn_dense(const ms_attn_dense_params &p) {
    static_assert(HD >= 1 && HD <= 256, "head_dim must be in [1, 256]");
    constexpr int PER = (HD + 31) / 32;
    constexpr int ROWS = MS_ATTN_DENSE_THREADS / 32;
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.x * ROWS + (threadIdx.x >> 5);
    const int h = blockIdx.y;
    if (t >= p.n_tokens)
        return; /* the whole warp leaves: t is uniform across it */
    const int g = h / (p.n_q_heads / p.n_kv_heads);
    /* the segment of row t: binary search over the offsets (uniform across the warp) */
    int lo = 0, hi = p.n_seqs - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (p.indptr[mid] <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    const int r0 = p.indptr[lo], r1 = p.indptr[lo + 1];
    const float *q = static_cast<const float *>(p.q) + (long long)t * p.q_stride + (long long)h * HD;
    const float *k = static_cast<const float *>(p.k) + (long long)g * HD;
    const float *v = static_cast<const float *>(p.v) + (long long)g * HD;
    float qv[PER], acc[PER];
#pragma unroll
    for (int e = 0; e < PER; e++) {
        qv[e] = lane + 32 * e < HD ? q[lane + 32 * e] : 0.f;
        acc[e] = 0.f;
    }
    float m = __int_as_float(0xff800000), l = 0.f; /* -inf (NVRTC has no math.h) */
    for (int r = r0; r < r1; r++) {
        const float *kr = k + (long long)r * p.k_stride;
        float s = 0.f;
#pragma unroll
        for (int e = 0; e < PER; e++)
            if (lane + 32 * e < HD)
                s += qv[e] * kr[lane + 32 * e];
        s = warp_sum(s) * p.scale;
        if (s > m) {
            const float corr = __expf(m - s); /* 0 when m was -inf */
            l *= corr;
#pragma unroll
            for (int e = 0; e < PER; e++)
                acc[e] *= corr;
            m = s;
        }
        const float w = __expf(s - m);
        l += w;
        const float *vr = v + (long long)r * p.v_stride;
#pragma unroll
        for (int e = 0; e < PER; e++)
            if (lane + 32 * e < HD)
                acc[e] += w * vr[lane + 32 * e];
    }
    const float inv = l > 0.f ? 1.f / l : 0.f;
    float *o = static_cast<float *>(p.o) + (long long)t * p.o_stride + (long long)h * HD;
#pragma unroll
    for (int e = 0; e < PER; e++)
        if (lane + 32 * e < HD)
            o[lane + 32 * e] = acc[e] * inv;
}

} // namespace ms
