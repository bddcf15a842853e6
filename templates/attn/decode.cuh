/*
 * decode.cuh - paged attention for decode: one query row per request.
 *
 * Grid (n_splits, n_kv_heads, batch), MS_ATTN_DECODE_THREADS threads. One CTA serves all G query
 * heads of one KV head (each K/V byte is read once per KV head) over one split of the request's
 * keys: split s covers keys [s * P * PS, (s + 1) * P * PS) with the view's split size
 * P = max(pages_per_split, ceil(view pages / n_splits)), so n_splits splits always cover the
 * whole view and the launch does not depend on the views' lengths (a CUDA graph captured once
 * replays for any). The splits that start past the view's end (n_active of them do not: a
 * decode step of a request far shorter than the batch's capacity, for which n_splits was
 * planned) exit at once, uncounted and unmerged; with one active split its CTA writes o itself.
 * Two key loops share the same epilogue: a tensor-core one for GQA (attn_decode_mma, below) and
 * a CUDA-core one for G = 1 and head dims that are not a multiple of 16 (attn_decode_simt):
 *
 * CUDA-core layout (after FlashDecoding / FlashInfer's decode kernels, with warps that never wait for each
 * other inside the key loop): a key row of HD elements is read by TPK = HD / VEC lanes with
 * 16-byte loads, padded to TPL (the next power of two) lanes so that a score reduces with xor
 * shuffles; a warp therefore reads KPL = 32 / TPL keys per load and a chunk of KW = KPL * UNROLL
 * keys per step. Warp w takes chunks w, w + NW, w + 2 NW, ... of the split. The loads of the next
 * chunk (K and V) are issued before the current chunk is computed, so two chunks per warp are in
 * flight. Every group of TPL lanes (one key of each load) keeps its own online softmax (running
 * max m and sum l in log2 units, output accumulator of its HD/TPK slice for all G heads), so the
 * loop has no barrier and no shared memory. At the end the KPL groups of a warp merge with
 * shuffles, the warps through shared memory.
 *
 * Splits (n_active > 1): each active CTA writes its normalized partial output and log-sum-exp to
 * part_o / part_lse, then counts itself in split_counter[b * n_kv_heads + h]; the last CTA of
 * (b, h) to arrive merges the active splits and writes o, then resets the counter to 0 (the threadfence
 * reduction of the CUDA programming guide, "Memory fence functions", with the fences folded into
 * one acq_rel atomic after a barrier, as CUTLASS's semaphore does). So one launch does the whole
 * decode attention: no merge kernel, and the counters are ready for the next launch. Launches
 * that share split_counter must not run concurrently.
 *
 * Prologue: every CTA asks L2 for the first K and V rows of its split (up to 128 KiB and its
 * share of 4 MiB per launch: all of a launch of up to 2k keys at batch 1; attn_decode_prefetch),
 * so a short launch requests its first bytes at once rather than two register steps per warp at a
 * time. With programmatic dependent launch (sm_90; the launcher allows it, cuda_ops.c) that
 * happens before the wait: every CTA first lets the next kernel of the stream launch
 * (griddepcontrol.launch_dependents), then reads what the previous kernel cannot change - the
 * request bounds and page ids, staged by copies that completed before the previous kernel
 * started - and prefetches (coherent with the previous kernel's writes: L2 is the point of
 * coherence and nothing lands in L1). Only then it waits for the previous kernel
 * (griddepcontrol.wait: complete, its writes visible), loads q and K/V and writes anything.
 * So the launch, the bounds -> page ids round trips and the first K/V bytes overlap the tail of
 * the kernel before (the rope/KV write in a layer, the previous attention when launches queue
 * back to back). Below sm_90, or launched without the attribute, the two griddepcontrol
 * instructions are no-ops.
 *
 * Keys outside the view or the window are never loaded, so stale page contents (even NaN) cannot
 * leak into the result.
 */
#pragma once

#include "common/mma.cuh"
#include "common/params.h"
#include "common/paged_kv.cuh"
#include "common/pdl.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"

namespace ms {

/* Smallest power of two >= n (n >= 1). */
__host__ __device__ constexpr int pow2_ceil(int n) { return n <= 1 ? 1 : 2 * pow2_ceil((n + 1) / 2); }


/* L2 bytes the CTAs of one launch prefetch at their start, all together (at most 8 lines of 128
 * bytes per thread, 128 KiB per CTA). 4 MiB: a short launch (batch 1 up to 2k keys) is prefetched
 * whole, a long one only its first steps. With 32 MiB (all of 1 x 8k) every launch from 8k keys
 * up was 1-2 us slower (H200, bench_kernels attn: 1 x 8k 19.8 against 18.8 us, 8 x 8k 74.1
 * against 73.6, 32 x 2k 71.5 against 71.2; none at all: 1 x 512 9.6 against 9.1, 1 x 2k 12.4
 * against 11.9; docs/perf.md, twelfth session): prefetches queued ahead of the loads that need
 * the same lines slow the loads. */
constexpr long long kAttnDecodePrefetchBytes = 4LL << 20;

/* At the CTA's start (before pdl_wait): ask L2 for the 128-byte lines of the K and V rows of KV
 * head h of keys [k0, k0 + n) inside [kmin, kend), n the CTA's share of
 * kAttnDecodePrefetchBytes (a short split: all of it). The whole launch's first bytes are then
 * requested at once instead of two register steps per warp at a time, and on sm_90 they come in
 * while the previous kernel finishes. Thread i takes kKeys consecutive keys k0 + i * kKeys + ...
 * (all lines of their K and V rows: 8 lines a thread), so it loads one page id per key,
 * p.kv_indices[p0 + key / PS]. (Spreading a thread's lines over 8 keys cost 8 page-id loads and
 * 8 address computations a thread: about 550 instructions of a prologue that every CTA issues,
 * at two warps a scheduler, before its first key.) A prefetch only moves data closer (L2 is the
 * point of coherence, nothing lands in L1): the loads after the wait read the same rows. */
template <typename T, int HD, int PS>
__device__ __forceinline__ void attn_decode_prefetch(const ms_attn_kernel_params &p,
                                                     const paged_kv<const T, HD, PS> &kv, int h,
                                                     int p0, int k0, int kmin, int kend) {
    constexpr int kRowBytes = HD * (int)sizeof(T);
    constexpr int kLines = (kRowBytes + 127) / 128; /* per K or V row */
    constexpr int kPerThread = 8;                   /* lines, so the prologue stays short */
    constexpr int kKeys = kPerThread / (2 * kLines) > 0 ? kPerThread / (2 * kLines) : 1;
    constexpr int kThreads = MS_ATTN_DECODE_THREADS;
    const long long ctas = (long long)gridDim.x * gridDim.y * gridDim.z;
    const long long budget = kAttnDecodePrefetchBytes / (ctas * 2 * kLines * 128);
    const int n = (int)min(min((long long)(kend - k0), budget), (long long)(kKeys * kThreads));
    /* unrolled: the page-id loads of a thread's keys are independent and issue together */
#pragma unroll
    for (int kk = 0; kk < kKeys; kk++) {
        const int i = (int)threadIdx.x * kKeys + kk, j = k0 + i;
        if (i < n && j >= kmin) {
            const char *row = reinterpret_cast<const char *>(
                kv.k_ptr(p.kv_indices[p0 + j / PS], j % PS, h));
            const long long v_off = (long long)PS * kv.token_stride() * (long long)sizeof(T);
#pragma unroll
            for (int line = 0; line < kLines; line++) {
                asm volatile("prefetch.global.L2 [%0];" ::"l"(row + 128 * line));
                asm volatile("prefetch.global.L2 [%0];" ::"l"(row + v_off + 128 * line));
            }
        }
    }
}

/* The keys one CTA of a decode launch covers: request b's bounds, loaded in one round of
 * independent loads before any branch, and split `split`'s share of its view. Each view sizes its
 * own splits, max(pages_per_split, ceil(view pages / n_splits)) pages, so every split count covers
 * the whole view and a launch whose n_splits was fixed at graph capture stays correct however
 * long the views grow. */
template <int PS, bool WINDOWED> struct attn_decode_keys {
    bool has_row; /* the request has a query row this step (else the CTA writes nothing) */
    int row;      /* its last query row: the token decoded */
    int p0;       /* first entry of the view in kv_indices */
    int kbeg;     /* the split's first key (a multiple of PS) */
    int kend;     /* one past its last key, at most the view's length */
    int kmin;     /* first key that counts: kbeg, or the window's first key if later */
    int n_active; /* splits of the view that start before its end (at least 1): the CTAs past
                     them exit at once and the merge counts and reads only these */
    __device__ __forceinline__ attn_decode_keys(const ms_attn_kernel_params &p, int b, int split) {
        const int qo0 = p.qo_indptr[b], qo1 = p.qo_indptr[b + 1];
        const int pb = p.kv_indptr[b], p1 = p.kv_indptr[b + 1];
        const int last_len = p.kv_last_page_len[b], start = p.kv_start[b];
        has_row = qo1 - qo0 > 0;
        row = qo1 - 1;
        p0 = pb;
        const int length = p1 == pb ? 0 : (p1 - pb - 1) * PS + last_len;
        const int qpos = start + length - 1;
        const int pps = max(p.pages_per_split, (p1 - pb + p.n_splits - 1) / p.n_splits);
        kbeg = split * pps * PS;
        kend = min(length, (split + 1) * pps * PS);
        kmin = WINDOWED ? max(kbeg, qpos - p.window + 1 - start) : kbeg;
        const long long span = (long long)pps * PS;
        n_active = length > 0 ? (int)min((long long)p.n_splits, (length + span - 1) / span) : 1;
    }
};

/// T: element type of the KV pages (bf16 or f16); HD: head_dim; PS: page_size;
/// G: query heads per KV head (GQA group); WINDOWED: mask keys outside p.window.
template <typename T, int HD, int PS, int G, bool WINDOWED> struct attn_decode_cfg {
    static constexpr int kThreads = MS_ATTN_DECODE_THREADS;
    static constexpr int kWarps = kThreads / 32;
    static constexpr int kVec = vec_width<T>::value;
    static_assert(HD % kVec == 0, "head_dim must be a multiple of 16 bytes");
    static constexpr int kTpk = HD / kVec;          /* lanes that hold a key row */
    static constexpr int kTpl = pow2_ceil(kTpk);    /* lanes per key, padded to a power of 2 */
    static_assert(kTpl <= 32, "head_dim above 32 x 16 bytes");
    static constexpr int kKpl = 32 / kTpl;          /* keys per warp load */
    static_assert(G >= 1 && G <= 16, "group must be in [1, 16]");
    /* Loads per chunk: q and the accumulators take 2 * G * kVec registers per lane, the two
     * chunks in flight 4 * kUnroll * 4 (K and V, current and next). */
    static constexpr int kUnroll = G <= 2 ? 8 : (G <= 4 ? 4 : 2);
    static constexpr int kChunk = kKpl * kUnroll;   /* keys per warp step */
};

/* Per-warp results of the key loop, merged by attn_decode_finish. */
template <int HD, int G, int NW> struct attn_decode_smem {
    float m[NW][G];       /* running max per warp and head (log2 units, scaled) */
    float l[NW][G];       /* sum of exp2(score - m) */
    float acc[NW][G][HD]; /* sum of exp2(score - m) * v, not normalized */
    int last;             /* this CTA is the last split of its (request, KV head) */
};

/* Merge the warps of the CTA (every warp filled its m, l, acc) and write o, or the split's
 * partial and then, in the last split CTA of (b, h), the merge of all splits. Every thread of
 * the CTA calls it. */
template <typename TA, int HD, int G, int NW>
__device__ __forceinline__ void attn_decode_finish(const ms_attn_kernel_params &p,
                                                   attn_decode_smem<HD, G, NW> &sm, int row, int n_active) {
    const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x;
    constexpr int NT = NW * 32;
    __syncthreads();

    /* ---- merge the warps: thread i writes (head g, dim d) pairs i, i + kThreads, ... ---- */
    TA *o = static_cast<TA *>(p.o);
    for (int i = tid; i < G * HD; i += NT) {
        const int g = i / HD, d = i % HD, qh = h * G + g;
        float mm = neg_inf();
#pragma unroll
        for (int w = 0; w < NW; w++)
            mm = fmaxf(mm, sm.m[w][g]);
        float num = 0.f, den = 0.f;
        if (mm != neg_inf()) {
#pragma unroll
            for (int w = 0; w < NW; w++) {
                const float sw = sm.m[w][g] == neg_inf() ? 0.f : exp2f(sm.m[w][g] - mm);
                num += sm.acc[w][g][d] * sw;
                den += sm.l[w][g] * sw;
            }
        }
        const float out = den > 0.f ? num / den : 0.f;
        if (n_active == 1) {
            o[(long long)row * p.o_stride + (long long)qh * HD + d] = from_float<TA>(out);
        } else {
            const long long pi = ((long long)b * p.n_splits + split) * p.n_q_heads + qh;
            p.part_o[pi * HD + d] = out;
            if (d == 0)
                p.part_lse[pi] = den > 0.f ? mm + log2f(den) : neg_inf();
        }
    }
    if (n_active == 1)
        return;

    /* ---- the last split CTA of (b, h) merges all splits ---- */
    /* The barrier orders the CTA's partial writes before thread 0's atomic, whose release (gpu
     * scope, cumulative over what the barrier ordered before it) publishes them with the count;
     * its acquire in the last CTA, then the barrier, orders that CTA's partial reads after every
     * split's count (PTX memory model: release and acquire patterns, causality order; CUTLASS
     * semaphore.h does the same). One fence instead of __threadfence() on both sides: 1 x 8k 0.3
     * us and 1 x 2k 0.4 us less a launch (docs/perf.md). */
    __syncthreads();
    int *counter = p.split_counter + (long long)b * p.n_kv_heads + h;
    if (tid == 0) {
        int old;
        asm volatile("atom.add.acq_rel.gpu.s32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
        sm.last = old == n_active - 1;
    }
    __syncthreads();
    if (!sm.last)
        return;
    /* one pass over the splits with a running max (online softmax over the partials): thread i
     * owns 4 consecutive dims of one head; the log-sum-exp and partial loads of 16 splits are
     * issued together */
    constexpr int SC = 16;
    const long long base = (long long)b * p.n_splits * p.n_q_heads;
    for (int i = tid; i < G * HD / 4; i += NT) {
        const int g = (4 * i) / HD, d = (4 * i) % HD, qh = h * G + g;
        const float *lse_p = p.part_lse + base + qh;
        const float4 *src = reinterpret_cast<const float4 *>(p.part_o + (base + qh) * HD + d);
        const long long step = (long long)p.n_q_heads * HD / 4; /* one split, in float4 */
        float mm = neg_inf(), den = 0.f;
        float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int s0 = 0; s0 < n_active; s0 += SC) {
            float ls[SC];
            float4 v[SC];
#pragma unroll
            for (int k = 0; k < SC; k++) {
                const bool in = s0 + k < n_active;
                ls[k] = in ? __ldcg(lse_p + (long long)(s0 + k) * p.n_q_heads) : neg_inf();
                v[k] = in ? __ldcg(src + (s0 + k) * step) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
            float mc = mm;
#pragma unroll
            for (int k = 0; k < SC; k++)
                mc = fmaxf(mc, ls[k]);
            if (mc == neg_inf())
                continue; /* no split with keys yet */
            const float sc = mm == neg_inf() ? 0.f : exp2f(mm - mc);
            den *= sc;
            sum.x *= sc;
            sum.y *= sc;
            sum.z *= sc;
            sum.w *= sc;
#pragma unroll
            for (int k = 0; k < SC; k++) {
                const float w = ls[k] == neg_inf() ? 0.f : exp2f(ls[k] - mc);
                den += w;
                sum.x += w * v[k].x;
                sum.y += w * v[k].y;
                sum.z += w * v[k].z;
                sum.w += w * v[k].w;
            }
            mm = mc;
        }
        const float inv = den > 0.f ? 1.f / den : 0.f;
        float out[4] = {sum.x * inv, sum.y * inv, sum.z * inv, sum.w * inv};
        TA *dst = o + (long long)row * p.o_stride + (long long)qh * HD + d;
#pragma unroll
        for (int e = 0; e < 4; e++)
            dst[e] = from_float<TA>(out[e]);
    }
    if (tid == 0)
        *counter = 0; /* ready for the next launch */
}

/// CUDA-core path. TA: element type of q and o (float, bf16 or f16); the rest as attn_decode_cfg.
template <typename TA, typename T, int HD, int PS, int G, bool WINDOWED>
__device__ __forceinline__ void attn_decode_simt(const ms_attn_kernel_params &p) {
    using C = attn_decode_cfg<T, HD, PS, G, WINDOWED>;
    constexpr int VEC = C::kVec, TPK = C::kTpk, TPL = C::kTpl, KPL = C::kKpl;
    constexpr int U = C::kUnroll, CH = C::kChunk, NW = C::kWarps;
    __shared__ attn_decode_smem<HD, G, NW> sm;

    const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int c = lane % TPL, r = lane / TPL;
    const bool active = c < TPK; /* padding lanes hold zeros */
    pdl_launch_dependents();

    const attn_decode_keys<PS, WINDOWED> ks(p, b, split);
    if (!ks.has_row)
        return; /* no query row for this request: nothing to write (uniform over the splits) */
    if (split >= ks.n_active)
        return; /* past the view's end: no keys, not merged (n_active is the same in every CTA of b) */
    const int row = ks.row, p0 = ks.p0, kbeg = ks.kbeg, kend = ks.kend, kmin = ks.kmin;

    paged_kv<const T, HD, PS> kv{static_cast<const T *>(p.kv), p.n_kv_heads};
    const TA *q = static_cast<const TA *>(p.q);
    const float qscale = p.sm_scale * kLog2e;

    float qf[G][VEC];
    float acc[G][VEC];
    float m[G], l[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
#pragma unroll
        for (int e = 0; e < VEC; e++) {
            qf[g][e] = 0.f;
            acc[g][e] = 0.f;
        }
        m[g] = neg_inf();
        l[g] = 0.f;
    }

    /* Chunk k covers keys [kbeg + k * CH, kbeg + (k + 1) * CH); skip the chunks before kmin. */
    const int first = (kmin - kbeg) / CH;
    const int n_chunks = kend > kbeg ? (kend - kbeg + CH - 1) / CH : 0;

    /* Page ids of chunk k's keys for this lane (-1 for keys outside [kmin, kend)):
     * loaded two chunk steps before the K/V loads that need them, so a page-table read never
     * stalls the loads behind it. */
    auto load_pages = [&](int k, int (&pg)[U]) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j = kbeg + k * CH + u * KPL + r;
            pg[u] = k < n_chunks && j >= kmin && j < kend ? p.kv_indices[p0 + j / PS] : -1;
        }
    };
    /* K and V rows of chunk k into registers (zeros for keys outside [kmin, kend)). */
    auto load_chunk = [&](int k, const int (&pg)[U], uint4 (&kr)[U], uint4 (&vr)[U]) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j = kbeg + k * CH + u * KPL + r;
            kr[u] = make_uint4(0u, 0u, 0u, 0u);
            vr[u] = kr[u];
            if (active && pg[u] >= 0) {
                const T *kp = kv.k_ptr(pg[u], j % PS, h) + c * VEC;
                kr[u] = *reinterpret_cast<const uint4 *>(kp);
                vr[u] = *reinterpret_cast<const uint4 *>(kp + (long long)PS * kv.token_stride());
            }
        }
    };

    /* Chunk k: scores, online softmax update, p * v (the chunk's K and V rows in kr, vr). */
    auto compute_chunk = [&](int k, const uint4 (&kr)[U], const uint4 (&vr)[U]) {
        float s[G][U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j = kbeg + k * CH + u * KPL + r;
            const bool valid = j >= kmin && j < kend;
            float kf[VEC];
            unpack_vec<T>(kr[u], kf);
#pragma unroll
            for (int g = 0; g < G; g++) {
                float dot = 0.f;
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    dot += qf[g][e] * kf[e];
#pragma unroll
                for (int off = TPL / 2; off > 0; off >>= 1)
                    dot += __shfl_xor_sync(0xffffffffu, dot, off);
                s[g][u] = valid ? dot : neg_inf();
            }
        }
#pragma unroll
        for (int g = 0; g < G; g++) {
            float mx = s[g][0];
#pragma unroll
            for (int u = 1; u < U; u++)
                mx = fmaxf(mx, s[g][u]);
            const float m_new = fmaxf(m[g], mx);
            /* m_new = -inf: no valid key yet in this lane group; exp2(-inf - -inf) is NaN */
            const float alpha = m_new == neg_inf() ? 1.f : exp2f(m[g] - m_new);
            m[g] = m_new;
            l[g] *= alpha;
#pragma unroll
            for (int e = 0; e < VEC; e++)
                acc[g][e] *= alpha;
#pragma unroll
            for (int u = 0; u < U; u++) {
                s[g][u] = m_new == neg_inf() ? 0.f : exp2f(s[g][u] - m_new);
                l[g] += s[g][u];
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            float vf[VEC];
            unpack_vec<T>(vr[u], vf);
#pragma unroll
            for (int g = 0; g < G; g++)
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    acc[g][e] += s[g][u] * vf[e];
        }
    };

    /* Two register buffers, no copies between them (a register move would wait for the load):
     * while one chunk is computed the next is in flight, and a buffer is refilled as soon as
     * its chunk is done. */
    uint4 ka[U], va[U], kb[U], vb[U];
    int pa[U], pb[U];
    int k = first + warp;
    load_pages(k, pa);
    load_pages(k + NW, pb);
    attn_decode_prefetch<T, HD, PS>(p, kv, h, p0, kbeg + first * CH, kmin, kend);
    pdl_wait(); /* q and the pages' contents may come from the previous kernel */
    if (active) {
#pragma unroll
        for (int g = 0; g < G; g++) {
            load_n<TA, VEC>(q + (long long)row * p.q_stride + (long long)(h * G + g) * HD +
                                c * VEC,
                            qf[g]);
#pragma unroll
            for (int e = 0; e < VEC; e++)
                qf[g][e] *= qscale;
        }
    }
    load_chunk(k, pa, ka, va);
    load_pages(k + 2 * NW, pa);
    load_chunk(k + NW, pb, kb, vb);
    load_pages(k + 3 * NW, pb);
    for (; k < n_chunks; k += 2 * NW) {
        compute_chunk(k, ka, va);
        load_chunk(k + 2 * NW, pa, ka, va);
        load_pages(k + 4 * NW, pa);
        if (k + NW >= n_chunks)
            break;
        compute_chunk(k + NW, kb, vb);
        load_chunk(k + 3 * NW, pb, kb, vb);
        load_pages(k + 5 * NW, pb);
    }

    /* ---- merge the KPL lane groups of the warp (lanes c, c + TPL, ...) ---- */
#pragma unroll
    for (int off = TPL; off < 32; off <<= 1) {
#pragma unroll
        for (int g = 0; g < G; g++) {
            const float mo = __shfl_xor_sync(0xffffffffu, m[g], off);
            const float lo = __shfl_xor_sync(0xffffffffu, l[g], off);
            const float mn = fmaxf(m[g], mo);
            const float a = m[g] == neg_inf() ? 0.f : exp2f(m[g] - mn);
            const float bb = mo == neg_inf() ? 0.f : exp2f(mo - mn);
            m[g] = mn;
            l[g] = l[g] * a + lo * bb;
#pragma unroll
            for (int e = 0; e < VEC; e++)
                acc[g][e] = acc[g][e] * a + __shfl_xor_sync(0xffffffffu, acc[g][e], off) * bb;
        }
    }
    if (r == 0) {
#pragma unroll
        for (int g = 0; g < G; g++) {
            if (active)
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    sm.acc[warp][g][c * VEC + e] = acc[g][e];
            if (c == 0) {
                sm.m[warp][g] = m[g];
                sm.l[warp][g] = l[g];
            }
        }
    }

    attn_decode_finish<TA, HD, G, NW>(p, sm, row, ks.n_active);
}


/* ---- tensor-core path (GQA groups >= 2, head_dim a multiple of 16) ---- */

/*
 * The G query heads of the KV head are the rows of a 16-row mma.m16n8k16 tile (rows >= G are
 * zero), keys its columns, FlashInfer's "decode with tensor cores" for GQA: QK^T and PV cost
 * 32 mma per 16 keys instead of G * HD * 32 / 32 FMA per lane, which left the CUDA-core loop
 * issue-bound at about 60% of copy bandwidth for G = 4.
 * Fragments come straight from 16-byte global loads, with no shared memory: the head dimensions
 * are permuted consistently in Q and K (a dot product does not care about the order), so a lane
 * loading 8 consecutive elements of a key row holds its B operands for two k-steps; for PV each
 * lane loads a contiguous slice of HD/8 dims of 4 keys and pairs them with a byte permute, so
 * the output dims of a lane are contiguous too. Warp w takes 16-key steps w, w + NW, ...; two
 * steps are in flight per warp (register double buffer, page ids two steps ahead).
 * With pages of a multiple of 16 keys (kPageSteps, the usual 16) a step is one page's run of 16
 * rows: one page id a step, the lane's addresses that page's base plus offsets fixed for the
 * launch, and a step whose keys are all in the view (all but a split's first and last, with a
 * window) loads and scores without per-key predicates. Before that change every key of a step
 * looked up its own page id and built its own 64-bit address: 540 instructions a step, at two
 * warps a scheduler the loop's limit (8 x 8k at 80% of copy bandwidth, 128 x 640 at 69%; after,
 * about 280 a step and 85% / 78%, docs/perf.md).
 */
template <int HD> struct attn_decode_mma_cfg {
    static_assert(HD % 16 == 0 && HD <= 256, "tensor-core decode: head_dim multiple of 16");
    static constexpr int kSteps = HD / 16;   /* k-steps of QK^T */
    static constexpr int kTiles = HD / 8;    /* n-tiles of PV (output dims per lane: 2 * kTiles / 8) */
    static constexpr int kVWords = HD / 16;  /* 32-bit words of one key's V slice per lane */
};

/* First of the 4 head dims that lane quad position c feeds to k-step t (Q and K agree). */
template <int HD> __device__ __forceinline__ int mma_kdim(int t, int c) {
    return (t / 2) * 32 + 32 <= HD ? (t / 2) * 32 + 8 * c + 4 * (t % 2) : 16 * t + 4 * c;
}

template <typename TA, typename T, int HD, int PS, int G, bool WINDOWED>
__device__ __forceinline__ void attn_decode_mma(const ms_attn_kernel_params &p) {
    using C = attn_decode_mma_cfg<HD>;
    constexpr int KS = C::kSteps, NTL = C::kTiles, VW = C::kVWords;
    constexpr int NW = MS_ATTN_DECODE_THREADS / 32, STEP = 16;
    static_assert(G <= 16, "group above the 16 rows of an mma tile");
    __shared__ attn_decode_smem<HD, G, NW> sm;

    const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    pdl_launch_dependents();

    const attn_decode_keys<PS, WINDOWED> ks(p, b, split);
    if (!ks.has_row)
        return; /* no query row for this request: nothing to write (uniform over the splits) */
    if (split >= ks.n_active)
        return; /* past the view's end: no keys, not merged (n_active is the same in every CTA of b) */
    const int row = ks.row, p0 = ks.p0, kbeg = ks.kbeg, kend = ks.kend, kmin = ks.kmin;

    paged_kv<const T, HD, PS> kv{static_cast<const T *>(p.kv), p.n_kv_heads};
    const float scale = p.sm_scale * kLog2e;

    /* Q as the A operand (rows gid and gid + 8: heads, permuted dims), loaded after pdl_wait */
    const TA *q = static_cast<const TA *>(p.q) + (long long)row * p.q_stride + (long long)h * G * HD;
    unsigned qa[KS][4];

    float o[NTL][4];
#pragma unroll
    for (int n = 0; n < NTL; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m[2] = {neg_inf(), neg_inf()};
    float l[2] = {0.f, 0.f};

    const int first = (kmin - kbeg) / STEP;
    const int n_steps = kend > kbeg ? (kend - kbeg + STEP - 1) / STEP : 0;

    /* Page ids of a step's keys. PS a multiple of 16 (kPageSteps: every split starts on a page,
     * so each 16-key step lies in one page): one page id per step, the same for the warp's lanes
     * (one broadcast load), and the lane's K/V addresses are that page's base plus offsets fixed
     * for the launch. Otherwise: k[t] for the K key of each tile (keys 8t + gid), v[i] for the
     * V keys (2 tig + {0, 1, 8, 9}). -1 outside [kmin, kend) or past the split. */
    constexpr bool kPageSteps = PS % STEP == 0;
    struct pages {
        int k[kPageSteps ? 1 : 2], v[kPageSteps ? 1 : 4];
    };
    auto key_k = [&](int st, int t) { return kbeg + st * STEP + 8 * t + gid; };
    auto key_v = [&](int st, int i) { return kbeg + st * STEP + 2 * tig + (i & 1) + 8 * (i >> 1); };
    auto in_view = [&](int j) { return j >= kmin && j < kend; };
    auto page_of = [&](int st, int j) {
        return st < n_steps && in_view(j) ? p.kv_indices[p0 + j / PS] : -1;
    };
    auto load_pages = [&](int st, pages &pg) {
        if constexpr (kPageSteps) {
            pg.k[0] = st < n_steps ? p.kv_indices[p0 + (kbeg + st * STEP) / PS] : -1;
        } else {
#pragma unroll
            for (int t = 0; t < 2; t++)
                pg.k[t] = page_of(st, key_k(st, t));
#pragma unroll
            for (int i = 0; i < 4; i++)
                pg.v[i] = page_of(st, key_v(st, i));
        }
    };
    /* kPageSteps: element offsets of the lane's K rows (tile t: key 8t + gid, dims 8 tig ..) and
     * V rows (key 2 tig + {0, 1, 8, 9}, dims NTL gid ..) from a step's first key row of head 0 */
    const long long ts = kv.token_stride();
    const long long off_k = (long long)gid * ts + (long long)h * HD + 8 * tig;
    const long long off_v = (long long)(2 * tig) * ts + (long long)PS * ts + (long long)h * HD +
                            NTL * gid;
    /* raw operands of one step: K words [tile][k-step][b0, b1], V words [key][VW] */
    struct operands {
        unsigned k[2][KS][2];
        unsigned v[4][VW];
    };
    /* FULL: every key of the step is in [kmin, kend) and its page is known (kPageSteps only),
     * so the loads need no predicate and no zero fill: the common case, one branch a step (the
     * lambda is inlined at both calls with FULL a constant) */
    auto load_step_body = [&](const bool FULL, int st, const pages &pg, operands &op) {
        const T *page_base = nullptr; /* kPageSteps: the step's first key row, head 0 */
        if constexpr (kPageSteps) {
            const int key0 = kbeg + st * STEP;
            page_base = kv.k_ptr(pg.k[0] < 0 ? 0 : pg.k[0], key0 % PS, 0);
        }
#pragma unroll
        for (int t = 0; t < 2; t++) {
            const int j = key_k(st, t);
            bool ok;
            const T *kp;
            if constexpr (kPageSteps) {
                ok = FULL || (pg.k[0] >= 0 && in_view(j));
                kp = page_base + off_k + (long long)(8 * t) * ts;
            } else {
                ok = pg.k[t] >= 0;
                kp = ok ? kv.k_ptr(pg.k[t], j % PS, h) + 8 * tig : nullptr;
            }
#pragma unroll
            for (int s2 = 0; s2 < KS / 2; s2++) {
                uint4 w = make_uint4(0u, 0u, 0u, 0u);
                if (ok)
                    w = *reinterpret_cast<const uint4 *>(kp + s2 * 32);
                op.k[t][2 * s2][0] = w.x;
                op.k[t][2 * s2][1] = w.y;
                op.k[t][2 * s2 + 1][0] = w.z;
                op.k[t][2 * s2 + 1][1] = w.w;
            }
            if (KS % 2) {
                uint2 w = make_uint2(0u, 0u);
                if (ok)
                    w = *reinterpret_cast<const uint2 *>(kp - 8 * tig + 16 * (KS - 1) + 4 * tig);
                op.k[t][KS - 1][0] = w.x;
                op.k[t][KS - 1][1] = w.y;
            }
        }
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int j = key_v(st, i);
            bool ok;
            const T *vp;
            if constexpr (kPageSteps) {
                ok = FULL || (pg.k[0] >= 0 && in_view(j));
                vp = page_base + off_v + (long long)((i & 1) + 8 * (i >> 1)) * ts;
            } else {
                ok = pg.v[i] >= 0;
                vp = ok ? kv.v_ptr(pg.v[i], j % PS, h) + NTL * gid : nullptr;
            }
            if (VW % 4 == 0) {
#pragma unroll
                for (int w4 = 0; w4 < VW / 4; w4++) {
                    uint4 w = make_uint4(0u, 0u, 0u, 0u);
                    if (ok)
                        w = reinterpret_cast<const uint4 *>(vp)[w4];
                    op.v[i][4 * w4] = w.x;
                    op.v[i][4 * w4 + 1] = w.y;
                    op.v[i][4 * w4 + 2] = w.z;
                    op.v[i][4 * w4 + 3] = w.w;
                }
            } else if (VW % 2 == 0) {
#pragma unroll
                for (int w2 = 0; w2 < VW / 2; w2++) {
                    uint2 w = make_uint2(0u, 0u);
                    if (ok)
                        w = reinterpret_cast<const uint2 *>(vp)[w2];
                    op.v[i][2 * w2] = w.x;
                    op.v[i][2 * w2 + 1] = w.y;
                }
            } else {
#pragma unroll
                for (int w1 = 0; w1 < VW; w1++)
                    op.v[i][w1] = ok ? reinterpret_cast<const unsigned *>(vp)[w1] : 0u;
            }
        }
    };
    auto step_full = [&](int st) {
        const int key0 = kbeg + st * STEP;
        return kPageSteps && st < n_steps && key0 >= kmin && key0 + STEP <= kend;
    };
    auto load_step = [&](int st, const pages &pg, operands &op) {
        if (step_full(st))
            load_step_body(true, st, pg, op);
        else
            load_step_body(false, st, pg, op);
    };
    auto compute_step = [&](int st, const operands &op) {
        float s[2][4];
#pragma unroll
        for (int t = 0; t < 2; t++) {
            s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < KS; kk++)
                mma_m16n8k16<T>::run(s[t], qa[kk], op.k[t][kk][0], op.k[t][kk][1]);
        }
        /* C layout: s[t][e] = S[row gid + 8 (e >> 1)][key 8t + 2 tig + (e & 1)]. Rows gid + 8
         * are heads >= 8: with G <= 8 (NR = 1) they are padding (zero q rows), so their softmax is
         * not computed and their P rows are zeros (o's rows gid + 8 stay 0, never written). */
        constexpr int NR = G <= 8 ? 1 : 2;
        float mx[2] = {neg_inf(), neg_inf()};
#pragma unroll
        for (int t = 0; t < 2; t++)
#pragma unroll
            for (int e = 0; e < 2 * NR; e++)
                s[t][e] *= scale;
        if (!step_full(st)) /* uniform over the warp: only a split's first and last steps */
#pragma unroll
            for (int t = 0; t < 2; t++)
#pragma unroll
                for (int e = 0; e < 2 * NR; e++)
                    if (!in_view(kbeg + st * STEP + 8 * t + 2 * tig + (e & 1)))
                        s[t][e] = neg_inf();
#pragma unroll
        for (int t = 0; t < 2; t++)
#pragma unroll
            for (int e = 0; e < 2 * NR; e++)
                mx[e >> 1] = fmaxf(mx[e >> 1], s[t][e]);
        float alpha[2] = {1.f, 1.f}, muse[2] = {0.f, 0.f};
#pragma unroll
        for (int i = 0; i < NR; i++) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
            const float m_new = fmaxf(m[i], mx[i]);
            muse[i] = m_new == neg_inf() ? 0.f : m_new;
            alpha[i] = exp2f(m[i] - muse[i]); /* m = -inf: 0, and o, l are 0 anyway */
            m[i] = m_new;
            l[i] *= alpha[i];
        }
        /* rescale o only when some row's max moved (rare once a few keys are seen) */
        if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
            for (int n = 0; n < NTL; n++) {
                o[n][0] *= alpha[0];
                o[n][1] *= alpha[0];
                if (NR == 2) {
                    o[n][2] *= alpha[1];
                    o[n][3] *= alpha[1];
                }
            }
        }
#pragma unroll
        for (int t = 0; t < 2; t++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                if ((e >> 1) < NR) {
                    const float pe = exp2f(s[t][e] - muse[e >> 1]);
                    s[t][e] = pe;
                    l[e >> 1] += pe;
                } else {
                    s[t][e] = 0.f;
                }
            }
        unsigned pa[4];
        pa[0] = pack2<T>(s[0][0], s[0][1]);
        pa[1] = pack2<T>(s[0][2], s[0][3]);
        pa[2] = pack2<T>(s[1][0], s[1][1]);
        pa[3] = pack2<T>(s[1][2], s[1][3]);
#pragma unroll
        for (int n = 0; n < NTL; n++) {
            const unsigned sel = (n & 1) ? 0x7632u : 0x5410u;
            const unsigned b0 = __byte_perm(op.v[0][n >> 1], op.v[1][n >> 1], sel);
            const unsigned b1 = __byte_perm(op.v[2][n >> 1], op.v[3][n >> 1], sel);
            mma_m16n8k16<T>::run(o[n], pa, b0, b1);
        }
    };

    operands A, B;
    pages pA, pB;
    int st = first + warp;
    load_pages(st, pA);
    load_pages(st + NW, pB);
    attn_decode_prefetch<T, HD, PS>(p, kv, h, p0, kbeg + first * STEP, kmin, kend);
    pdl_wait(); /* q and the pages' contents may come from the previous kernel */
#pragma unroll
    for (int t = 0; t < KS; t++) {
        const int d = mma_kdim<HD>(t, tig);
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int r = gid + 8 * i;
            float a0 = 0.f, a1 = 0.f, b0 = 0.f, b1 = 0.f;
            if (r < G) {
                load2(q + r * HD + d, a0, a1);
                load2(q + r * HD + d + 2, b0, b1);
            }
            qa[t][i] = pack2<T>(a0, a1);
            qa[t][i + 2] = pack2<T>(b0, b1);
        }
    }
    load_step(st, pA, A);
    load_pages(st + 2 * NW, pA);
    load_step(st + NW, pB, B);
    load_pages(st + 3 * NW, pB);
    for (; st < n_steps; st += 2 * NW) {
        compute_step(st, A);
        load_step(st + 2 * NW, pA, A);
        load_pages(st + 4 * NW, pA);
        if (st + NW >= n_steps)
            break;
        compute_step(st + NW, B);
        load_step(st + 3 * NW, pB, B);
        load_pages(st + 5 * NW, pB);
    }

    /* ---- this warp's rows into shared memory: lane (gid, tig) holds dims
     * NTL * (2 tig + c) + n of row gid + 8 i in o[n][2 i + c] ---- */
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
        const int r = gid + 8 * i;
        if (r < G) {
#pragma unroll
            for (int n = 0; n < NTL; n++) {
                sm.acc[warp][r][NTL * (2 * tig) + n] = o[n][2 * i];
                sm.acc[warp][r][NTL * (2 * tig + 1) + n] = o[n][2 * i + 1];
            }
            if (tig == 0) {
                sm.m[warp][r] = m[i];
                sm.l[warp][r] = l[i];
            }
        }
    }
    attn_decode_finish<TA, HD, G, NW>(p, sm, row, ks.n_active);
}

/// Decode attention (see the file comment): the tensor-core path for GQA groups >= 2 with a
/// 16-bit KV type and head_dim a multiple of 16, the CUDA-core path otherwise.
template <typename TA, typename T, int HD, int PS, int G, bool WINDOWED>
__device__ __forceinline__ void attn_decode(const ms_attn_kernel_params &p) {
    if constexpr (G >= 2 && HD % 16 == 0 && sizeof(T) == 2)
        attn_decode_mma<TA, T, HD, PS, G, WINDOWED>(p);
    else
        attn_decode_simt<TA, T, HD, PS, G, WINDOWED>(p);
}

} // namespace ms
