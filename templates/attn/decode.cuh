/*
 * decode.cuh - paged attention for decode: one query row per request.
 *
 * Grid (n_splits, n_kv_heads, batch). One CTA serves all G query heads of one KV head, so each
 * K/V byte is read once per KV head, and one split of the request's pages. With n_splits > 1 the
 * CTA writes a normalized partial output and its log-sum-exp (log2 units) and
 * ms_attn_decode_merge combines them; with one split it writes the final output.
 *
 * Thread layout: a key row (HD elements) is read by TPK = HD / VEC threads with 16-byte loads;
 * the 128 threads read KPI = 128 / TPK keys per pass, UNROLL passes per tile of TILE keys. Each
 * thread keeps q and the output accumulator of its HD/TPK slice for all G heads in registers.
 * Per tile: scores to shared memory, then one warp per head updates the online softmax (running
 * max m, sum l, rescale alpha), then the V pass accumulates p * v. For G <= 4 the V rows are
 * loaded with the K rows, so they are in flight during the scores and the softmax. Keys outside the view or the
 * window are never loaded, so stale page contents (even NaN) cannot leak into the result.
 */
#pragma once

#include "common/params.h"
#include "common/paged_kv.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"

namespace ms {

/// T: element type of the KV pages (bf16 or f16); HD: head_dim; PS: page_size;
/// G: query heads per KV head (GQA group); WINDOWED: mask keys outside p.window.
template <typename T, int HD, int PS, int G, bool WINDOWED> struct attn_decode_cfg {
    static constexpr int kThreads = MS_ATTN_DECODE_THREADS;
    static constexpr int kWarps = kThreads / 32;
    static constexpr int kVec = vec_width<T>::value;
    static constexpr int kTpk = HD / kVec;
    static_assert(HD % kVec == 0, "head_dim must be a multiple of 16 bytes");
    static_assert(kTpk >= 1 && kTpk <= 32 && (32 % kTpk) == 0,
                  "head_dim / (16 bytes) must divide the warp size");
    static constexpr int kKpi = kThreads / kTpk;
    static constexpr int kUnrollWant = 64 / kKpi;
    static constexpr int kUnroll = kUnrollWant < 1 ? 1 : (kUnrollWant > 8 ? 8 : kUnrollWant);
    static constexpr int kTile = kKpi * kUnroll;
    static_assert(G >= 1 && G <= 16, "group must be in [1, 16]");
    /* Load V together with K (twice the bytes in flight) when registers allow: q and the
     * accumulators take 2 * G * kVec registers per thread, so not for G > 4. */
    static constexpr bool kPrefetchV = G <= 4;
};

/// TA: element type of q and o (float, bf16 or f16); the rest as attn_decode_cfg.
template <typename TA, typename T, int HD, int PS, int G, bool WINDOWED>
__device__ __forceinline__ void attn_decode(const ms_attn_kernel_params &p) {
    using C = attn_decode_cfg<T, HD, PS, G, WINDOWED>;
    constexpr int VEC = C::kVec, TPK = C::kTpk, KPI = C::kKpi, UNROLL = C::kUnroll;
    constexpr int TILE = C::kTile;
    __shared__ float s_score[G][TILE];
    __shared__ float s_alpha[G];
    __shared__ float s_m[G];
    __shared__ float s_l[G];
    __shared__ float s_red[KPI * HD];

    const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int c = tid % TPK, r = tid / TPK;

    const int n_q = p.qo_indptr[b + 1] - p.qo_indptr[b];
    if (n_q <= 0)
        return; /* no query row for this request: nothing to write */
    const int row = p.qo_indptr[b + 1] - 1;
    const int p0 = p.kv_indptr[b];
    const int length = view_length<PS>(p.kv_indptr, p.kv_last_page_len, b);
    const int start = p.kv_start[b];
    const int qpos = start + length - 1;
    int kbeg = split * p.pages_per_split * PS;
    int kend = min(length, (split + 1) * p.pages_per_split * PS);
    if (WINDOWED)
        kbeg = max(kbeg, qpos - p.window + 1 - start);

    paged_kv<const T, HD, PS> kv{static_cast<const T *>(p.kv), p.n_kv_heads};
    const TA *q = static_cast<const TA *>(p.q);
    const float qscale = p.sm_scale * kLog2e;

    float qf[G][VEC];
    float acc[G][VEC];
#pragma unroll
    for (int g = 0; g < G; g++) {
        load_n<TA, VEC>(q + (long long)row * p.q_stride + (long long)(h * G + g) * HD + c * VEC,
                        qf[g]);
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            qf[g][e] *= qscale;
            acc[g][e] = 0.f;
        }
    }
    if (tid < G) {
        s_m[tid] = neg_inf();
        s_l[tid] = 0.f;
    }
    __syncthreads();

    for (int t0 = kbeg; t0 < kend; t0 += TILE) {
        /* ---- K pass: scores of TILE keys for all G heads ---- */
        uint4 raw[UNROLL];
        uint4 vraw[C::kPrefetchV ? UNROLL : 1];
        bool valid[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            int j = t0 + u * KPI + r;
            valid[u] = j < kend;
            raw[u] = make_uint4(0u, 0u, 0u, 0u);
            if (C::kPrefetchV)
                vraw[C::kPrefetchV ? u : 0] = raw[u];
            if (valid[u]) {
                int page = p.kv_indices[p0 + j / PS];
                raw[u] = *reinterpret_cast<const uint4 *>(kv.k_ptr(page, j % PS, h) + c * VEC);
                if (C::kPrefetchV) /* V in flight during the scores and the softmax */
                    vraw[C::kPrefetchV ? u : 0] =
                        *reinterpret_cast<const uint4 *>(kv.v_ptr(page, j % PS, h) + c * VEC);
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            float kf[VEC];
            unpack_vec<T>(raw[u], kf);
#pragma unroll
            for (int g = 0; g < G; g++) {
                float dot = 0.f;
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    dot += qf[g][e] * kf[e];
#pragma unroll
                for (int off = TPK / 2; off > 0; off >>= 1)
                    dot += __shfl_xor_sync(0xffffffffu, dot, off);
                if (c == 0)
                    s_score[g][u * KPI + r] = valid[u] ? dot : neg_inf();
            }
        }
        __syncthreads();

        /* ---- online softmax update, one warp per head (key t0 is valid: m_new is finite) ---- */
        for (int g = warp; g < G; g += C::kWarps) {
            float mt = neg_inf();
            for (int i = lane; i < TILE; i += 32)
                mt = fmaxf(mt, s_score[g][i]);
            mt = warp_max(mt);
            float m_old = s_m[g];
            float m_new = fmaxf(m_old, mt);
            float sum = 0.f;
            for (int i = lane; i < TILE; i += 32) {
                float e = exp2f(s_score[g][i] - m_new);
                s_score[g][i] = e;
                sum += e;
            }
            sum = warp_sum(sum);
            __syncwarp();
            if (lane == 0) {
                float alpha = exp2f(m_old - m_new);
                s_alpha[g] = alpha;
                s_l[g] = s_l[g] * alpha + sum;
                s_m[g] = m_new;
            }
        }
        __syncthreads();

        /* ---- V pass ---- */
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            if (C::kPrefetchV) {
                raw[u] = vraw[C::kPrefetchV ? u : 0];
                continue;
            }
            int j = t0 + u * KPI + r;
            raw[u] = make_uint4(0u, 0u, 0u, 0u);
            if (valid[u]) {
                int page = p.kv_indices[p0 + j / PS];
                raw[u] = *reinterpret_cast<const uint4 *>(kv.v_ptr(page, j % PS, h) + c * VEC);
            }
        }
#pragma unroll
        for (int g = 0; g < G; g++) {
            float a = s_alpha[g];
#pragma unroll
            for (int e = 0; e < VEC; e++)
                acc[g][e] *= a;
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            if (!valid[u])
                continue;
            float vf[VEC];
            unpack_vec<T>(raw[u], vf);
#pragma unroll
            for (int g = 0; g < G; g++) {
                float pw = s_score[g][u * KPI + r];
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    acc[g][e] += pw * vf[e];
            }
        }
        __syncthreads();
    }

    /* ---- reduce the KPI partial accumulators of each head and write ---- */
#pragma unroll
    for (int g = 0; g < G; g++) {
#pragma unroll
        for (int e = 0; e < VEC; e++)
            s_red[r * HD + c * VEC + e] = acc[g][e];
        __syncthreads();
        const int qh = h * G + g;
        const float l = s_l[g];
        const float inv_l = l > 0.f ? 1.f / l : 0.f;
        for (int d = tid; d < HD; d += C::kThreads) {
            float s = 0.f;
            for (int i = 0; i < KPI; i++)
                s += s_red[i * HD + d];
            if (p.n_splits == 1) {
                TA *o = static_cast<TA *>(p.o);
                o[(long long)row * p.o_stride + (long long)qh * HD + d] = from_float<TA>(s * inv_l);
            } else {
                long long pi = ((long long)b * p.n_splits + split) * p.n_q_heads + qh;
                p.part_o[pi * HD + d] = s * inv_l;
                if (d == 0)
                    p.part_lse[pi] = l > 0.f ? s_m[g] + log2f(l) : neg_inf();
            }
        }
        __syncthreads();
    }
}

/* Merge of split partials: grid (n_q_heads, batch), MS_ATTN_MERGE_THREADS threads. */
template <typename TA, int HD>
__device__ __forceinline__ void attn_decode_merge(const ms_attn_kernel_params &p) {
    const int qh = blockIdx.x, b = blockIdx.y;
    if (p.qo_indptr[b + 1] - p.qo_indptr[b] <= 0)
        return;
    const int row = p.qo_indptr[b + 1] - 1;
    const long long base = (long long)b * p.n_splits * p.n_q_heads + qh;
    float m = neg_inf();
    for (int s = 0; s < p.n_splits; s++)
        m = fmaxf(m, p.part_lse[base + (long long)s * p.n_q_heads]);
    TA *o = static_cast<TA *>(p.o);
    for (int d = threadIdx.x; d < HD; d += blockDim.x) {
        float num = 0.f, den = 0.f;
        if (m != neg_inf()) {
            for (int s = 0; s < p.n_splits; s++) {
                long long pi = base + (long long)s * p.n_q_heads;
                float lse = p.part_lse[pi];
                if (lse == neg_inf())
                    continue;
                float w = exp2f(lse - m);
                num += w * p.part_o[pi * HD + d];
                den += w;
            }
        }
        o[(long long)row * p.o_stride + (long long)qh * HD + d] =
            from_float<TA>(den > 0.f ? num / den : 0.f);
    }
}

} // namespace ms
