/*
 * rope_kv.cuh - RoPE on q (in place) and k, fused with the write of k and v into the KV pages.
 *
 * Grid (n_tokens, chunks), MS_ROPE_KV_THREADS threads: the pair slots of a token (q and k heads) and
 * its v elements are spread over the gridDim.y CTAs of the token (one CTA per token left a decode
 * step at batch 1 on one SM: 17 us per layer on the H200, docs/perf.md). Each thread handles whole
 * pairs, so the in-place update of q is race-free; the angle is pos * inv_freq in float and cos/sin use the accurate
 * sincosf (positions reach 10^5 and more). Dims past rotary_dim pass unrotated (to the pages for
 * k). v is converted to the page type. Neox instances with everything 4-element aligned take four
 * pairs (and four v elements) a thread in vector accesses (rope_kv_neox4); the rest one pair, one
 * element a thread.
 *
 * M-RoPE (MROPE instances, Qwen2-VL): rotary pair i takes its position from the stream of the
 * section it falls in (pairs [0, sections[0]) stream 0, the next sections[1] pairs stream 1, ...),
 * the same pair in both rotate-half halves, as the CPU backend and HF's
 * apply_multimodal_rotary_pos_emb do.
 */
#pragma once

#include "common/paged_kv.cuh"
#include "common/params.h"
#include "common/rope.cuh"
#include "common/vec.cuh"

namespace ms {

/* Position stream of rotary pair i under M-RoPE sections (the CPU backend's walk: advance while
 * i is past the section's end and a next section exists). */
__device__ __forceinline__ int mrope_stream(int i, const ms_rope_kv_params &p) {
    const int n = p.n_sections < MS_ROPE_KV_MAX_SECTIONS ? p.n_sections : MS_ROPE_KV_MAX_SECTIONS;
    int s = 0, end = p.sections[0];
    while (i >= end && s + 1 < n) {
        s++;
        end += p.sections[s];
    }
    return s;
}

/* The neox (rotate-half) case with four pairs a thread: slots i0 .. i0 + 3 of a head (i0 a
 * multiple of 4; rot and the strides multiples of 8 and 4, the rows aligned, checked by the
 * caller), so each thread reads and writes 4-element vectors: x[i0 ..] and x[i0 + rot/2 ..], or
 * for the slots past rot/2 the 8 passthrough dims rot + 2 (i0 - rot/2) ... The same arithmetic as
 * the scalar loop below (same inv_freq, sincosf and rotation per pair), so the same bits are
 * expected (the tests check both paths against a double reference, not against each other). One
 * element a thread stored 2-byte page rows at about 45% of the copy bandwidth in a 2048-token
 * prefill (docs/perf.md). */
template <typename TA, typename T, int HD, int PS, int SCALING>
__device__ __forceinline__ void rope_kv_neox4(const ms_rope_kv_params &p, TA *q, const TA *k,
                                              const TA *v, const paged_kv<T, HD, PS> &kv,
                                              int page, int slot, float pos, int rot, float att) {
    constexpr int kGroups = HD / 8; /* 4-slot groups of a head's HD/2 pair slots */
    const int n_groups = (p.n_q_heads + p.n_kv_heads) * kGroups;
    const int tid = blockIdx.y * blockDim.x + threadIdx.x, nthr = gridDim.y * blockDim.x;
    for (int idx = tid; idx < n_groups; idx += nthr) {
        const int head = idx / kGroups, i0 = 4 * (idx % kGroups);
        const bool is_q = head < p.n_q_heads;
        const int hh = is_q ? head : head - p.n_q_heads;
        const TA *src = is_q ? q + head * HD : k + hh * HD;
        if (i0 < rot / 2) {
            const int a = i0, b = i0 + rot / 2;
            float xa[4], xb[4];
            load_any<TA, 4>(src + a, xa);
            load_any<TA, 4>(src + b, xb);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float inv = p.inv_freq != nullptr
                                      ? p.inv_freq[i0 + e]
                                      : rope_inv_freq<SCALING>(i0 + e, rot, p.theta, p.factor,
                                                               p.low_freq_factor,
                                                               p.high_freq_factor,
                                                               p.original_max_pos);
                float sn, cs;
                sincosf(pos * inv, &sn, &cs);
                rope_rotate(xa[e], xb[e], cs * att, sn * att);
            }
            if (is_q) {
                store_any<TA, 4>(q + head * HD + a, xa);
                store_any<TA, 4>(q + head * HD + b, xb);
            } else {
                TA *kh = const_cast<TA *>(k) + hh * HD; /* rotated in place too */
                store_any<TA, 4>(kh + a, xa);
                store_any<TA, 4>(kh + b, xb);
                if (p.kv != nullptr) {
                    T *dst = kv.k_ptr(page, slot, hh);
                    store_any<T, 4>(dst + a, xa);
                    store_any<T, 4>(dst + b, xb);
                }
            }
        } else if (!is_q && p.kv != nullptr) { /* k passthrough dims: to the pages as they are */
            const int a = rot + 2 * (i0 - rot / 2);
            float x0[4], x1[4];
            load_any<TA, 4>(src + a, x0);
            load_any<TA, 4>(src + a + 4, x1);
            T *dst = kv.k_ptr(page, slot, hh);
            store_any<T, 4>(dst + a, x0);
            store_any<T, 4>(dst + a + 4, x1);
        }
    }
    if (p.kv == nullptr)
        return;
    for (int idx = tid; idx < p.n_kv_heads * (HD / 4); idx += nthr) {
        const int hh = idx / (HD / 4), d = 4 * (idx % (HD / 4));
        float x[4];
        load_any<TA, 4>(v + hh * HD + d, x);
        store_any<T, 4>(kv.v_ptr(page, slot, hh) + d, x);
    }
}

/// TA: element type of q, k, v (float, bf16 or f16); T: page type (bf16 or f16); HD: head_dim;
/// PS: page_size; STYLE: kRopeNone / kRopeNeox / kRopeInterleaved;
/// SCALING: kRopeScalingNone / kRopeScalingLlama3 (used when p.inv_freq is NULL);
/// MROPE: positions per M-RoPE section (p.n_sections streams of p.pos).
template <typename TA, typename T, int HD, int PS, int STYLE, int SCALING, bool MROPE = false>
__device__ __forceinline__ void rope_kv(const ms_rope_kv_params &p) {
    static_assert(HD % 2 == 0, "head_dim must be even");
    static_assert(!MROPE || STYLE != kRopeNone, "M-RoPE needs a rotation style");
    const int t = blockIdx.x;
    const int page = p.kv != nullptr ? p.token_to_page[t] : 0;
    const int slot = p.kv != nullptr ? p.token_to_slot[t] : 0;
    const float pos = (!MROPE && p.pos != nullptr) ? (float)p.pos[t] : 0.f;
    const int rot = (STYLE == kRopeNone) ? 0 : (p.rotary_dim > 0 ? p.rotary_dim : HD);
    const float att = p.attn_scaling != 0.f ? p.attn_scaling : 1.f;
    paged_kv<T, HD, PS> kv{static_cast<T *>(p.kv), p.n_kv_heads};
    TA *q = static_cast<TA *>(p.q) + (long long)t * p.q_stride;
    const TA *k = static_cast<const TA *>(p.k) + (long long)t * p.k_stride;
    const TA *v = static_cast<const TA *>(p.v) + (long long)t * p.v_stride;

    if constexpr (STYLE == kRopeNeox && !MROPE && HD % 8 == 0) {
        /* four pairs a thread, 16-byte (f32) / 8-byte (16-bit) accesses, when everything lines up
         * (the usual case: a fused QKV row of f32 or bf16, rotary_dim = head_dim) */
        const bool aligned =
            rot % 8 == 0 && p.q_stride % 4 == 0 && p.k_stride % 4 == 0 && p.v_stride % 4 == 0 &&
            ((reinterpret_cast<unsigned long long>(p.q) | reinterpret_cast<unsigned long long>(p.k) |
              reinterpret_cast<unsigned long long>(p.v)) %
             (4 * sizeof(TA))) == 0 &&
            reinterpret_cast<unsigned long long>(p.kv) % (4 * sizeof(T)) == 0; /* 8-byte page stores */
        if (aligned) {
            rope_kv_neox4<TA, T, HD, PS, SCALING>(p, q, k, v, kv, page, slot, pos, rot, att);
            return;
        }
    }
    /* pair slot i < HD/2 of a head: i < rot/2 rotates a pair; otherwise it stands for the two
     * passthrough dims rot + 2 (i - rot/2) and the one after */
    const int n_slots = (p.n_q_heads + p.n_kv_heads) * (HD / 2);
    const int tid = blockIdx.y * blockDim.x + threadIdx.x, nthr = gridDim.y * blockDim.x;
    for (int idx = tid; idx < n_slots; idx += nthr) {
        const int head = idx / (HD / 2), i = idx % (HD / 2);
        const bool is_q = head < p.n_q_heads;
        const int hh = is_q ? head : head - p.n_q_heads;
        int a, b;
        float xa, xb;
        const TA *src = is_q ? q + head * HD : k + hh * HD;
        if (i < rot / 2) {
            rope_pair<STYLE>(i, rot, a, b);
            const float inv = p.inv_freq != nullptr
                                  ? p.inv_freq[i]
                                  : rope_inv_freq<SCALING>(i, rot, p.theta, p.factor,
                                                           p.low_freq_factor, p.high_freq_factor,
                                                           p.original_max_pos);
            const float pp =
                MROPE ? (float)p.pos[(long long)mrope_stream(i, p) * p.pos_stride + t] : pos;
            float sn, cs;
            sincosf(pp * inv, &sn, &cs);
            xa = to_float(src[a]);
            xb = to_float(src[b]);
            rope_rotate(xa, xb, cs * att, sn * att);
        } else {
            if (is_q)
                continue; /* q passthrough dims stay as they are */
            a = rot + 2 * (i - rot / 2);
            b = a + 1;
            xa = to_float(src[a]);
            xb = to_float(src[b]);
        }
        if (is_q) {
            q[head * HD + a] = from_float<TA>(xa);
            q[head * HD + b] = from_float<TA>(xb);
        } else {
            if (i < rot / 2) { /* k is rotated in place too, as the unfused rope would */
                TA *kh = const_cast<TA *>(k) + hh * HD;
                kh[a] = from_float<TA>(xa);
                kh[b] = from_float<TA>(xb);
            }
            if (p.kv != nullptr) {
                T *dst = kv.k_ptr(page, slot, hh);
                dst[a] = from_float<T>(xa);
                dst[b] = from_float<T>(xb);
            }
        }
    }
    if (p.kv == nullptr)
        return;
    for (int idx = tid; idx < p.n_kv_heads * HD; idx += nthr) {
        const int hh = idx / HD, d = idx % HD;
        kv.v_ptr(page, slot, hh)[d] = from_float<T>(to_float(v[hh * HD + d]));
    }
}

} // namespace ms
