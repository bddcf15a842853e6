/*
 * sample.cuh - argmax and top-k / top-p sampling on device, one CTA per row.
 *
 * Exact, sort-free: thresholds are found by bisection over the 32-bit order keys of the logits
 * (a monotone map float -> uint32), so the top-k threshold is exactly the k-th largest logit and
 * the top-p threshold exactly one of the logits. Each bisection step is one pass over the row
 * with a block reduction: 32 passes for top-k (counts), 32 for top-p (masses) and 32 for the draw,
 * which walks the kept tokens by decreasing logit then increasing id (sampler.h, llama2.c
 * sample_mult) without sorting: the largest key whose mass above reaches the target, then the
 * right tie by a block scan of counts. Semantics: see ms_sample_params in params.h.
 */
#pragma once

#include "common/params.h"
#include "common/reduce.cuh"
#include "common/vec.cuh"

namespace ms {

/* Monotone key: a < b as floats <=> key(a) < key(b) as unsigned (NaN excluded). */
__device__ __forceinline__ unsigned order_key(float f) {
    unsigned u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Block argmax: largest value, first index on ties. Every thread gets the result. */
template <typename TL>
__device__ __forceinline__ int block_argmax(const TL *row, int vocab, float *s_val, int *s_idx) {
    float best = neg_inf();
    int best_i = 0x7fffffff;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = to_float(row[i]);
        if (v > best) { /* strided ascending: the first hit of a value is its smallest index */
            best = v;
            best_i = i;
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, off);
        int oi = __shfl_xor_sync(0xffffffffu, best_i, off);
        if (ov > best || (ov == best && oi < best_i)) {
            best = ov;
            best_i = oi;
        }
    }
    __syncthreads();
    if (lane == 0) {
        s_val[warp] = best;
        s_idx[warp] = best_i;
    }
    __syncthreads();
    best = s_val[0];
    best_i = s_idx[0];
    for (int w = 1; w < nwarps; w++) {
        if (s_val[w] > best || (s_val[w] == best && s_idx[w] < best_i)) {
            best = s_val[w];
            best_i = s_idx[w];
        }
    }
    __syncthreads();
    return best_i == 0x7fffffff ? 0 : best_i;
}

/// TL: logits type (float, bf16 or f16).
template <typename TL> __device__ __forceinline__ void argmax(const ms_argmax_params &p) {
    __shared__ float s_val[32];
    __shared__ int s_idx[32];
    const TL *row = static_cast<const TL *>(p.logits) + (long long)blockIdx.x * p.stride;
    int id = block_argmax<TL>(row, p.vocab, s_val, s_idx);
    if (threadIdx.x == 0)
        p.ids[blockIdx.x] = id;
}

/// TL: logits type (float, bf16 or f16).
template <typename TL> __device__ __forceinline__ void sample(const ms_sample_params &p) {
    __shared__ float s_val[32];
    __shared__ int s_idx[32];
    __shared__ float s_scan[MS_SAMPLE_THREADS];
    const int r = blockIdx.x, vocab = p.vocab;
    const TL *row = static_cast<const TL *>(p.logits) + (long long)r * p.stride;
    const float temp = p.temperature[r];
    if (!(temp > 0.f)) {
        int id = block_argmax<TL>(row, vocab, s_val, s_idx);
        if (threadIdx.x == 0)
            p.ids[r] = id;
        return;
    }
    const int k = p.top_k[r];
    const float top_p = p.top_p[r];
    const float u = p.uniform[r];

    float mx = neg_inf();
    for (int i = threadIdx.x; i < vocab; i += blockDim.x)
        mx = fmaxf(mx, to_float(row[i]));
    mx = block_max(mx, s_val);
    const float sc = kLog2e / temp;

    /* ---- top-k threshold: the largest key with count(key_i >= key) >= k ---- */
    unsigned lo = 0u;
    if (k > 0 && k < vocab) {
        unsigned hi = 0xffffffffu;
        while (lo < hi) {
            unsigned mid = lo + (unsigned)(((unsigned long long)hi - lo + 1ull) / 2ull);
            int cnt = 0;
            for (int i = threadIdx.x; i < vocab; i += blockDim.x)
                cnt += order_key(to_float(row[i])) >= mid;
            cnt = block_sum_int(cnt, s_idx);
            if (cnt >= k)
                lo = mid;
            else
                hi = mid - 1u;
        }
    }

    /* ---- top-p threshold: the largest key >= lo whose kept mass is >= top_p * mass(lo) ---- */
    if (top_p < 1.f) {
        float z = 0.f;
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
            float l = to_float(row[i]);
            if (order_key(l) >= lo)
                z += exp2f((l - mx) * sc);
        }
        z = block_sum(z, s_val);
        const float target = top_p * z;
        unsigned hi = 0xffffffffu;
        while (lo < hi) {
            unsigned mid = lo + (unsigned)(((unsigned long long)hi - lo + 1ull) / 2ull);
            float mass = 0.f;
            for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
                float l = to_float(row[i]);
                if (order_key(l) >= mid)
                    mass += exp2f((l - mx) * sc);
            }
            mass = block_sum(mass, s_val);
            if (mass >= target)
                lo = mid;
            else
                hi = mid - 1u;
        }
    }

    /* ---- draw (sampler.h order): walking the kept tokens by decreasing logit, then increasing
     * id, the first whose running mass exceeds u * kept mass. Found as the largest key vstar
     * with mass(key >= vstar) > target, then the right one among the ties at vstar. ---- */
    float zk = 0.f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float l = to_float(row[i]);
        if (order_key(l) >= lo)
            zk += exp2f((l - mx) * sc);
    }
    zk = block_sum(zk, s_val);
    const float target = u * zk;
    unsigned vlo = lo, vhi = 0xffffffffu;
    while (vlo < vhi) {
        unsigned mid = vlo + (unsigned)(((unsigned long long)vhi - vlo + 1ull) / 2ull);
        float mass = 0.f;
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
            float l = to_float(row[i]);
            if (order_key(l) >= mid)
                mass += exp2f((l - mx) * sc);
        }
        mass = block_sum(mass, s_val);
        if (mass > target)
            vlo = mid;
        else
            vhi = mid - 1u;
    }
    const unsigned vstar = vlo;
    float above = 0.f;
    int ties = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float l = to_float(row[i]);
        unsigned kk = order_key(l);
        if (kk > vstar)
            above += exp2f((l - mx) * sc);
        ties += kk == vstar;
    }
    above = block_sum(above, s_val);
    ties = block_sum_int(ties, s_idx);
    const unsigned vbits = (vstar & 0x80000000u) ? (vstar & 0x7fffffffu) : ~vstar;
    const float pstar = exp2f((__uint_as_float(vbits) - mx) * sc);
    int j = pstar > 0.f ? (int)((target - above) / pstar) : 0;
    j = j < 0 ? 0 : (j >= ties ? ties - 1 : j);
    if (ties <= 0)
        j = 0;
    /* the j-th tie in vocabulary order: per-thread contiguous chunks, serial scan of counts */
    const int chunk = (vocab + blockDim.x - 1) / blockDim.x;
    const int c0 = threadIdx.x * chunk, c1 = min(vocab, c0 + chunk);
    int mine = 0;
    for (int i = c0; i < c1; i++)
        mine += order_key(to_float(row[i])) == vstar;
    int *s_cnt = reinterpret_cast<int *>(s_scan);
    s_cnt[threadIdx.x] = mine;
    __syncthreads();
    if (threadIdx.x == 0) {
        int run = 0;
        for (int i = 0; i < (int)blockDim.x; i++) {
            int v = s_cnt[i];
            s_cnt[i] = run;
            run += v;
        }
    }
    __syncthreads();
    const int before = s_cnt[threadIdx.x];
    if (mine > 0 && j >= before && j < before + mine) {
        int seen = before;
        for (int i = c0; i < c1; i++) {
            if (order_key(to_float(row[i])) == vstar) {
                if (seen == j) {
                    p.ids[r] = i;
                    break;
                }
                seen++;
            }
        }
    }
}

} // namespace ms
