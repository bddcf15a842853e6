/*
 * sample.cuh - argmax and top-k / top-p sampling on device, one CTA per row.
 *
 * Exact, sort-free: thresholds are found by bisection over the 32-bit order keys of the logits
 * (a monotone map float -> uint32), so the top-k threshold is exactly the k-th largest logit and
 * the top-p threshold exactly one of the logits. Each bisection step is one pass over the row
 * with a block reduction: 32 passes for top-k (counts) and 32 for top-p (masses). The final draw
 * walks the kept tokens in vocabulary order: per-thread contiguous chunks, a block scan of the
 * chunk masses, then one thread scans its chunk. min_p is a per-token test in the draw (the
 * maximum's p is 1, so no search is needed). Semantics: see ms_sample_params in params.h.
 *
 * Row passes (row_pass): one CTA reads a whole row (128,256 floats for Llama 3) per pass, so a
 * pass is bound by how many bytes the CTA keeps in flight, not by the GPU's bandwidth. A plain
 * strided loop has one 4-byte load in flight per thread: 250 dependent round trips per pass, 110
 * us for one argmax over a Llama 3 row (ncu, H200, 2026-12-02: 4.7% of a batch-1 decode step).
 * row_pass reads 16-byte vectors, ROW_PASS_UNROLL of them per thread at a time (64 KiB in flight
 * per CTA of 512 threads), and still hands each thread its elements in ascending index order,
 * which the argmax's first-index tie rule relies on.
 */
#pragma once

#include "common/params.h"
#include "common/reduce.cuh"
#include "common/vec.cuh"

namespace ms {

/* 16-byte vectors each thread loads before it uses any (row_pass). */
#define ROW_PASS_UNROLL 4

/* Call f(value, index) for every element of row[0, n), each thread its own elements in ascending
 * index order: first the elements before row's first 16-byte boundary (one per thread), then
 * 16-byte vectors strided over the block, ROW_PASS_UNROLL loads in flight, then the tail. row must
 * be aligned to sizeof(TL) (as any TL pointer is). Every thread of the block must call it. */
template <typename TL, typename F>
__device__ __forceinline__ void row_pass(const TL *row, int n, F &&f) {
    constexpr int V = 16 / (int)sizeof(TL);
    const int T = blockDim.x, t = threadIdx.x;
    int head = (int)(((16u - ((unsigned)(size_t)row & 15u)) & 15u) / (unsigned)sizeof(TL));
    if (head > n)
        head = n;
    if (t < head)
        f(to_float(row[t]), t);
    const int nv = (n - head) / V;
    const uint4 *body = reinterpret_cast<const uint4 *>(row + head);
    int j = t;
    for (; j + (ROW_PASS_UNROLL - 1) * T < nv; j += ROW_PASS_UNROLL * T) {
        vec16<TL> w[ROW_PASS_UNROLL];
#pragma unroll
        for (int u = 0; u < ROW_PASS_UNROLL; u++)
            w[u].u = body[j + u * T];
#pragma unroll
        for (int u = 0; u < ROW_PASS_UNROLL; u++) {
            const int i0 = head + (j + u * T) * V;
#pragma unroll
            for (int e = 0; e < V; e++)
                f(to_float(w[u].e[e]), i0 + e);
        }
    }
    for (; j < nv; j += T) {
        vec16<TL> w;
        w.u = body[j];
        const int i0 = head + j * V;
#pragma unroll
        for (int e = 0; e < V; e++)
            f(to_float(w.e[e]), i0 + e);
    }
    for (int i = head + nv * V + t; i < n; i += T)
        f(to_float(row[i]), i);
}

/* Monotone key: a < b as floats <=> key(a) < key(b) as unsigned (NaN excluded). */
__device__ __forceinline__ unsigned order_key(float f) {
    unsigned u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Block argmax: largest value, first index on ties (NaN never chosen). Every thread gets the
 * result, and in *any_nan whether the row holds a NaN. */
template <typename TL>
__device__ __forceinline__ int block_argmax(const TL *row, int vocab, float *s_val, int *s_idx,
                                            int *any_nan) {
    float best = neg_inf();
    int best_i = 0x7fffffff;
    int nan = 0;
    row_pass(row, vocab, [&](float v, int i) {
        nan |= v != v;
        if (v > best) { /* ascending per thread: the first hit of a value is its smallest index */
            best = v;
            best_i = i;
        }
    });
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
    *any_nan = __syncthreads_or(nan); /* also the barrier before s_val / s_idx are reused */
    return best_i == 0x7fffffff ? 0 : best_i;
}

/// TL: logits type (float, bf16 or f16).
template <typename TL> __device__ __forceinline__ void argmax(const ms_argmax_params &p) {
    __shared__ float s_val[32];
    __shared__ int s_idx[32];
    const TL *row = static_cast<const TL *>(p.logits) + (long long)blockIdx.x * p.stride;
    int any_nan;
    int id = block_argmax<TL>(row, p.vocab, s_val, s_idx, &any_nan);
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
    /* below 1e-5 (MS_SAMPLER_MIN_TEMPERATURE, sampler.h): greedy, as the CPU sampler; a denormal
     * temp would make kLog2e / temp infinite and (l - mx) * sc NaN at the maximum */
    if (!(temp >= 1e-5f)) {
        int any_nan;
        int id = block_argmax<TL>(row, vocab, s_val, s_idx, &any_nan);
        if (threadIdx.x == 0)
            p.ids[r] = any_nan ? -1 : id; /* a NaN row fails its request alone (params.h) */
        return;
    }
    const int k = p.top_k[r];
    const float top_p = p.top_p[r];
    const float u = p.uniform[r];
    const float min_p = p.min_p != nullptr ? p.min_p[r] : 0.f; /* 0: exp2f(.) >= 0 always */

    float mx = neg_inf();
    int nan = 0;
    row_pass(row, vocab, [&](float l, int) {
        nan |= l != l;
        mx = fmaxf(mx, l);
    });
    if (__syncthreads_or(nan)) { /* the same answer in every thread: the whole block returns */
        if (threadIdx.x == 0)
            p.ids[r] = -1;
        return;
    }
    mx = block_max(mx, s_val);
    const float sc = kLog2e / temp;

    /* ---- top-k threshold: the largest key with count(key_i >= key) >= k ---- */
    unsigned lo = 0u;
    if (k > 0 && k < vocab) {
        unsigned hi = 0xffffffffu;
        while (lo < hi) {
            unsigned mid = lo + (unsigned)(((unsigned long long)hi - lo + 1ull) / 2ull);
            int cnt = 0;
            row_pass(row, vocab, [&](float l, int) { cnt += order_key(l) >= mid; });
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
        row_pass(row, vocab, [&](float l, int) {
            if (order_key(l) >= lo)
                z += exp2f((l - mx) * sc);
        });
        z = block_sum(z, s_val);
        const float target = top_p * z;
        unsigned hi = 0xffffffffu;
        while (lo < hi) {
            unsigned mid = lo + (unsigned)(((unsigned long long)hi - lo + 1ull) / 2ull);
            float mass = 0.f;
            row_pass(row, vocab, [&](float l, int) {
                if (order_key(l) >= mid)
                    mass += exp2f((l - mx) * sc);
            });
            mass = block_sum(mass, s_val);
            if (mass >= target)
                lo = mid;
            else
                hi = mid - 1u;
        }
    }

    /* ---- draw: first index (vocabulary order) whose running kept mass exceeds u * total ---- */
    const int chunk = (vocab + blockDim.x - 1) / blockDim.x;
    const int c0 = threadIdx.x * chunk, c1 = min(vocab, c0 + chunk);
    float mine = 0.f;
    int last_kept = -1;
    /* min_p (after top-k / top-p, as the CPU sampler): also keep only exp((l - mx) / T) >= min_p */
    for (int i = c0; i < c1; i++) {
        float l = to_float(row[i]);
        float e = exp2f((l - mx) * sc);
        if (order_key(l) >= lo && e >= min_p) {
            mine += e;
            last_kept = i;
        }
    }
    s_scan[threadIdx.x] = mine;
    __syncthreads();
    if (threadIdx.x == 0) { /* exclusive scan, serial: 512 adds, once per row */
        float run = 0.f;
        for (int i = 0; i < (int)blockDim.x; i++) {
            float v = s_scan[i];
            s_scan[i] = run;
            run += v;
        }
        s_val[0] = run;
    }
    __syncthreads();
    const float total = s_val[0];
    const float target = u * total;
    const float before = s_scan[threadIdx.x];
    int found = 0x7fffffff;
    if (mine > 0.f && target >= before && target < before + mine) {
        float run = before;
        for (int i = c0; i < c1; i++) {
            float l = to_float(row[i]);
            float e = exp2f((l - mx) * sc);
            if (order_key(l) >= lo && e >= min_p) {
                run += e;
                if (target < run) {
                    found = i;
                    break;
                }
            }
        }
        if (found == 0x7fffffff)
            found = last_kept; /* rounding between the chunk sum and the rescan */
    }
    /* fallback when rounding put the target past the total: the last kept index */
    int fallback = last_kept;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        found = min(found, __shfl_xor_sync(0xffffffffu, found, off));
        fallback = max(fallback, __shfl_xor_sync(0xffffffffu, fallback, off));
    }
    __syncthreads();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    if (lane == 0) {
        s_idx[warp] = found;
        reinterpret_cast<int *>(s_val)[warp] = fallback;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int f = 0x7fffffff, fb = -1;
        for (int w = 0; w < nwarps; w++) {
            f = min(f, s_idx[w]);
            fb = max(fb, reinterpret_cast<int *>(s_val)[w]);
        }
        p.ids[r] = f != 0x7fffffff ? f : (fb >= 0 ? fb : 0);
    }
}

} // namespace ms
