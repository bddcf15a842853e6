/*
 * sample.cuh - argmax and top-k / top-p / min_p sampling on device, one CTA per row.
 *
 * Exact and sort-free: thresholds are found by bisection over the 32-bit order keys of the logits
 * (a monotone map float -> uint32), so the top-k threshold is exactly the k-th largest logit and
 * the top-p threshold exactly one of the logits; the draw takes the first token in vocabulary
 * order whose running kept mass exceeds u * total. min_p is a per-token test in the draw (the
 * maximum's p is 1, so no search is needed). Semantics: see ms_sample_params in params.h.
 *
 * Candidates (sample): the searches run over the tokens that can be kept at all, staged in shared
 * memory (MS_SAMPLE_CANDIDATES) in vocabulary order, after a bound that takes one or two passes
 * over the row: for top-k (k <= MS_SAMPLE_THREADS) the k-th largest of the threads' maxima (k
 * distinct logits are >= it, so the k-th largest logit is); for top-p alone, p(token) >= (1 -
 * top_p) / 2 / vocab of the row's mass (the tokens below hold less than 1 - top_p of it, so the
 * nucleus's threshold lies above them); for min_p alone, min_p itself. Warp w stages a contiguous
 * segment of the row, 32 consecutive logits per step, ordered by ballots, after a counting pass.
 * Then 32 bisection steps for top-k and for top-p cost a block reduction over a few candidates
 * each, and one warp scans the kept ones for the draw. A row with more candidates, top-k above
 * MS_SAMPLE_THREADS or no bound takes the whole-row search (sample_full_row): 32 passes over the
 * row for each threshold and the draw over per-thread contiguous chunks (H200, 128,256 logits, T
 * 0.8, top-k 40, top-p 0.95: 944 us a row; bench_kernels sample).
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

/* Candidates sample() keeps in shared memory (logit and id: 16 KiB); a row with more takes the
 * whole-row search (sample_full_row). */
#define MS_SAMPLE_CANDIDATES 2048

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

/* A warp's pass over row[b0, b1) in order: 32 consecutive logits per step (lane L the step's
 * L-th), 8 steps of loads in flight; f(value, index, in) at every step by every lane of the warp
 * (in: index < b1; the value is -inf outside), so f may use warp votes. */
template <typename TL, typename F>
__device__ __forceinline__ void segment_pass(const TL *row, int b0, int b1, int lane, F &&f) {
    for (int base = b0; base < b1; base += 256) {
        float v[8];
#pragma unroll
        for (int s8 = 0; s8 < 8; s8++) {
            const int i = base + 32 * s8 + lane;
            v[s8] = i < b1 ? to_float(row[i]) : neg_inf();
        }
#pragma unroll
        for (int s8 = 0; s8 < 8; s8++) {
            const int i = base + 32 * s8 + lane;
            f(v[s8], i, i < b1);
        }
    }
}

/* Monotone key: a < b as floats <=> key(a) < key(b) as unsigned (NaN excluded). */
__device__ __forceinline__ unsigned order_key(float f) {
    unsigned u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Largest / least key over the block (every thread gets it); buf: 32 ints. sm_80's redux.sync. */
__device__ __forceinline__ unsigned block_max_key(unsigned v, int *buf) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    v = __reduce_max_sync(0xffffffffu, v);
    __syncthreads();
    if (lane == 0)
        buf[warp] = (int)v;
    __syncthreads();
    unsigned r = 0u;
    for (int i = 0; i < nwarps; i++)
        r = max(r, (unsigned)buf[i]);
    __syncthreads();
    return r;
}
__device__ __forceinline__ unsigned block_min_key(unsigned v, int *buf) {
    return ~block_max_key(~v, buf);
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

/// The whole-row search (the fallback of sample: top-k above MS_SAMPLE_THREADS, or more than
/// MS_SAMPLE_CANDIDATES candidates, or nothing to bound them): bisections over the row's keys (32
/// passes each for top-k and top-p) and the draw over per-thread contiguous chunks. mx: the row's
/// maximum, kmax: its largest key (both searches end there), sc: log2(e) / T. Writes ids[r].
template <typename TL>
__device__ __noinline__ void sample_full_row(int *ids, int vocab, const TL *row, int r, int k, float top_p, float u,
                                             float min_p, float mx, unsigned kmax, float sc, float *s_val,
                                             int *s_idx, float *s_scan) {
    /* ---- top-k threshold: the largest key with count(key_i >= key) >= k ---- */
    unsigned lo = 0u;
    if (k > 0 && k < vocab) {
        unsigned hi = kmax;
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
        unsigned hi = kmax;
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
            if (e > 0.f) /* the rounding fallbacks below must not pick a zero-mass token */
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
        ids[r] = f != 0x7fffffff ? f : (fb >= 0 ? fb : 0);
    }
}

/// TL: logits type (float, bf16 or f16).
template <typename TL> __device__ __forceinline__ void sample(const ms_sample_params &p) {
    __shared__ float s_val[32];
    __shared__ int s_idx[32];
    __shared__ float s_scan[MS_SAMPLE_THREADS];
    __shared__ float c_val[MS_SAMPLE_CANDIDATES]; /* the candidates' logits, vocabulary order */
    __shared__ int c_idx[MS_SAMPLE_CANDIDATES];   /* and their token ids */
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
    unsigned tkey = 0u; /* this thread's largest key (the top-k bound below): keys, not floats, so
                           that -0 < +0 as in the searches */
    int nan = 0;
    row_pass(row, vocab, [&](float l, int) {
        nan |= l != l;
        mx = fmaxf(mx, l);
        tkey = max(tkey, order_key(l));
    });
    if (__syncthreads_or(nan)) { /* the same answer in every thread: the whole block returns */
        if (threadIdx.x == 0)
            p.ids[r] = -1;
        return;
    }
    mx = block_max(mx, s_val);
    const unsigned kmax = block_max_key(tkey, s_idx);
    if (mx == -neg_inf()) { /* +inf takes all the mass (as the CPU sampler): its first index */
        int any_nan;
        int id = block_argmax<TL>(row, vocab, s_val, s_idx, &any_nan);
        if (threadIdx.x == 0)
            p.ids[r] = id;
        return;
    }
    const float sc = kLog2e / temp;

    /* ---- a lower bound on the kept set: the candidates ---- */
    const bool use_k = k > 0 && k < vocab, use_p = top_p < 1.f;
    bool fast;
    unsigned lbk = 0u; /* top-k: every key >= lbk is a candidate */
    float eps = 0.f, zfull = 0.f;
    if (use_k) {
        /* the k-th largest of the threads' largest keys: k distinct elements are >= it, so the
         * k-th largest key is too */
        fast = k <= (int)blockDim.x;
        if (fast) {
            unsigned *keys = reinterpret_cast<unsigned *>(s_scan);
            keys[threadIdx.x] = tkey;
            __syncthreads();
            int gt = 0, ge = 0;
            for (int i = 0; i < (int)blockDim.x; i++) {
                const unsigned v = keys[i];
                gt += v > tkey;
                ge += v >= tkey;
            }
            lbk = block_max_key(gt < k && ge >= k ? tkey : 0u, s_idx);
        }
    } else if (use_p) {
        /* top-p alone: the tokens with exp((l - mx) / T) < eps = (1 - top_p) z / vocab hold less
         * than (1 - top_p) of the mass z, so the nucleus's threshold is above them (eps is taken at
         * half that, a margin for float sums) */
        row_pass(row, vocab, [&](float l, int) { zfull += exp2f((l - mx) * sc); });
        zfull = block_sum(zfull, s_val);
        eps = 0.5f * (1.f - top_p) * zfull / (float)vocab;
        fast = true;
    } else {
        eps = min_p; /* min_p alone: its own bound; nothing at all: every token, the whole row */
        fast = min_p > 0.f;
    }
    const unsigned lbk_ = lbk;
    const float eps_ = eps;
    auto candidate = [&](float l) { return use_k ? order_key(l) >= lbk_ : exp2f((l - mx) * sc) >= eps_; };

    /* ---- the candidates into shared memory in vocabulary order: warp w takes a contiguous
     * segment, 32 consecutive values per step (8 steps of loads in flight), ballots order them;
     * a counting pass sizes each warp's share first ---- */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int seg = (vocab + nwarps - 1) / nwarps;
    const int b0 = warp * seg, b1 = min(vocab, b0 + seg);
    int n_cand = 0, mine = 0;
    if (fast) {
        segment_pass(row, b0, b1, lane, [&](float v, int, bool in) {
            mine += __popc(__ballot_sync(0xffffffffu, in && candidate(v)));
        });
        __syncthreads();
        if (lane == 0)
            s_idx[warp] = mine; /* the warp's count (every lane holds it) */
        __syncthreads();
        int before = 0;
        for (int w = 0; w < nwarps; w++) {
            if (w == warp)
                mine = before;
            before += s_idx[w];
        }
        n_cand = before;
        __syncthreads();
    }
    if (!fast || n_cand > MS_SAMPLE_CANDIDATES) {
        sample_full_row<TL>(p.ids, vocab, row, r, k, top_p, u, min_p, mx, kmax, sc, s_val, s_idx, s_scan);
        return;
    }
    {
        int pos = mine; /* this warp's first slot */
        segment_pass(row, b0, b1, lane, [&](float v, int i, bool in) {
            const bool c = in && candidate(v);
            const unsigned m = __ballot_sync(0xffffffffu, c);
            if (c) {
                const int at = pos + __popc(m & ((1u << lane) - 1u));
                c_val[at] = v;
                c_idx[at] = i;
            }
            pos += __popc(m);
        });
        __syncthreads();
    }

    /* ---- top-k over the candidates: every logit >= lb is one, so the counts are the row's ---- */
    unsigned lo = 0u;
    if (use_k) {
        lo = lbk;
        unsigned hi = kmax;
        while (lo < hi) {
            unsigned mid = lo + (unsigned)(((unsigned long long)hi - lo + 1ull) / 2ull);
            int cnt = 0;
            for (int i = threadIdx.x; i < n_cand; i += blockDim.x)
                cnt += order_key(c_val[i]) >= mid;
            cnt = block_sum_int(cnt, s_idx);
            if (cnt >= k)
                lo = mid;
            else
                hi = mid - 1u;
        }
    }

    /* ---- top-p over the candidates: the largest key >= lo whose kept mass is >= top_p * mass(lo)
     * (mass(lo): the top-k set's, or the row's z when top-p is alone) ---- */
    if (use_p) {
        float z = zfull;
        if (use_k) {
            z = 0.f;
            for (int i = threadIdx.x; i < n_cand; i += blockDim.x)
                if (order_key(c_val[i]) >= lo)
                    z += exp2f((c_val[i] - mx) * sc);
            z = block_sum(z, s_val);
        } else {
            unsigned least = 0xffffffffu; /* the least candidate's key: where the search starts */
            for (int i = threadIdx.x; i < n_cand; i += blockDim.x)
                least = min(least, order_key(c_val[i]));
            lo = block_min_key(least, s_idx);
        }
        const float target = top_p * z;
        unsigned hi = kmax;
        while (lo < hi) {
            unsigned mid = lo + (unsigned)(((unsigned long long)hi - lo + 1ull) / 2ull);
            float mass = 0.f;
            for (int i = threadIdx.x; i < n_cand; i += blockDim.x)
                if (order_key(c_val[i]) >= mid)
                    mass += exp2f((c_val[i] - mx) * sc);
            mass = block_sum(mass, s_val);
            if (mass >= target)
                lo = mid;
            else
                hi = mid - 1u;
        }
    }

    /* ---- draw: the first candidate (vocabulary order) whose running kept mass exceeds u * total;
     * warp 0 scans 32 at a time (a shuffle scan per step, steps in order: deterministic) ---- */
    if (warp == 0) {
        float total = 0.f;
        for (int b = 0; b < n_cand; b += 32) {
            const int i = b + lane;
            float e = 0.f;
            if (i < n_cand) {
                const float ei = exp2f((c_val[i] - mx) * sc);
                if (order_key(c_val[i]) >= lo && ei >= min_p)
                    e = ei;
            }
            total += warp_sum(e);
        }
        const float target = u * total;
        float run = 0.f;
        int found = -1, last = -1;
        for (int b = 0; b < n_cand && found < 0; b += 32) {
            const int i = b + lane;
            float e = 0.f;
            bool kept = false;
            if (i < n_cand) {
                const float ei = exp2f((c_val[i] - mx) * sc);
                kept = order_key(c_val[i]) >= lo && ei >= min_p;
                e = kept ? ei : 0.f;
            }
            float incl = e; /* inclusive scan over the step's lanes */
#pragma unroll
            for (int off = 1; off < 32; off <<= 1) {
                const float o = __shfl_up_sync(0xffffffffu, incl, off);
                if (lane >= off)
                    incl += o;
            }
            /* e > 0: a float scan need not be monotone, and a zero-mass token must never win */
            const unsigned hit = __ballot_sync(0xffffffffu, kept && e > 0.f && target < run + incl);
            const unsigned km = __ballot_sync(0xffffffffu, kept && e > 0.f);
            if (km != 0u)
                last = c_idx[b + 31 - __clz(km)];
            if (hit != 0u)
                found = c_idx[b + __ffs(hit) - 1];
            run += __shfl_sync(0xffffffffu, incl, 31);
        }
        if (lane == 0)
            p.ids[r] = found >= 0 ? found : (last >= 0 ? last : 0); /* rounding past the total: the last kept */
    }
}

} // namespace ms
