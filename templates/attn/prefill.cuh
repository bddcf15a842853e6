/*
 * prefill.cuh - paged attention for prefill: ragged batch, causal or not, sliding window, online
 * softmax, QK^T and PV on tensor cores (mma.m16n8k16, bf16/f16 in, float accumulate).
 *
 * Grid (n_tiles, n_kv_heads). The query rows of request b for KV head h are packed as
 * row = token * G + g (FlashInfer's GQA packing), so the G heads that share K/V share one K/V
 * tile. CTA = 4 warps x 16 rows = 64 packed rows; tile t of the grid covers rows
 * [tile_idx[t] * 64, +64) of request tile_req[t] (the host builds both lists). K/V tiles of BK keys
 * are staged in shared memory (rows padded by 16 bytes: conflict-free fragment loads); keys past
 * the tile's last query (causal), before the window, or past the view are zero-filled or masked,
 * never read from pages they do not belong to. S = QK^T stays in registers and its accumulator
 * layout is reused directly as the A operand of PV (FlashAttention-2).
 */
#pragma once

#include "common/mma.cuh"
#include "common/paged_kv.cuh"
#include "common/params.h"
#include "common/smem.cuh"
#include "common/vec.cuh"

namespace ms {

/// T: bf16 or f16; HD: head_dim (multiple of 16, <= 256); PS: page_size; G: GQA group;
/// CAUSAL: mask keys after the query's position; WINDOWED: mask keys at or before P - window.
template <typename T, int HD, int PS, int G, bool CAUSAL, bool WINDOWED> struct attn_prefill_cfg {
    static constexpr int kThreads = MS_ATTN_PREFILL_THREADS;
    static constexpr int kRows = MS_ATTN_PREFILL_ROWS;
    static_assert(kRows == 16 * (kThreads / 32), "one warp per 16 rows");
    static constexpr int kBK = HD <= 128 ? 64 : 32;   /* keys per shared-memory tile */
    static constexpr int kLd = HD + 16 / (int)sizeof(T); /* padded smem row (elements) */
    static constexpr int kVec = vec_width<T>::value;
    static_assert(HD % 16 == 0 && HD <= 256, "head_dim must be a multiple of 16, at most 256");
    static_assert(sizeof(T) == 2, "tensor-core prefill needs a 16-bit type");
};

/// TA: element type of q and o (float, bf16 or f16); the rest as attn_prefill_cfg.
template <typename TA, typename T, int HD, int PS, int G, bool CAUSAL, bool WINDOWED>
__device__ __forceinline__ void attn_prefill(const ms_attn_kernel_params &p) {
    using C = attn_prefill_cfg<T, HD, PS, G, CAUSAL, WINDOWED>;
    constexpr int BK = C::kBK, LD = C::kLd, VEC = C::kVec, NT = C::kThreads;
    __shared__ __align__(16) unsigned short sK[BK * LD];
    __shared__ __align__(16) unsigned short sV[BK * LD];

    /* the list's tiles in reverse: a request's last tiles see the most keys (causal), so they
       start first and the short ones fill the tail of the grid */
    const int tile = gridDim.x - 1 - blockIdx.x;
    const int h = blockIdx.y;
    const int b = p.tile_req[tile];
    const int row_base = p.tile_idx[tile] * C::kRows;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gid = lane >> 2, tig = lane & 3;

    const int q0 = p.qo_indptr[b];
    const int n_q = p.qo_indptr[b + 1] - q0;
    const int n_rows = n_q * G;
    if (row_base >= n_rows)
        return;
    const int p0 = p.kv_indptr[b];
    const int length = view_length<PS>(p.kv_indptr, p.kv_last_page_len, b);
    const int start = p.kv_start[b];
    const int qpos0 = start + length - n_q; /* position of query token 0 */

    /* ---- this thread's two rows ---- */
    int rows[2], qpos[2], qtok[2], qhead[2];
    bool rvalid[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        rows[i] = row_base + warp * 16 + gid + 8 * i;
        rvalid[i] = rows[i] < n_rows;
        qtok[i] = rvalid[i] ? rows[i] / G : 0;
        qhead[i] = h * G + (rvalid[i] ? rows[i] % G : 0);
        qpos[i] = qpos0 + qtok[i];
    }

    /* ---- Q fragments straight from global memory (converted to T) ---- */
    const TA *q = static_cast<const TA *>(p.q);
    unsigned qa[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const TA *qr = q + (long long)(q0 + qtok[i]) * p.q_stride + (long long)qhead[i] * HD +
                           kk * 16 + 2 * tig;
            float a0 = 0.f, a1 = 0.f, b0 = 0.f, b1 = 0.f;
            if (rvalid[i]) {
                load2(qr, a0, a1);
                load2(qr + 8, b0, b1);
            }
            qa[kk][i] = pack2<T>(a0, a1);
            qa[kk][i + 2] = pack2<T>(b0, b1);
        }
    }

    /* ---- key range of the CTA ---- */
    const int last_row = min(n_rows, row_base + C::kRows) - 1;
    const int tok_lo = row_base / G, tok_hi = last_row / G;
    int kend = length;
    if (CAUSAL)
        kend = min(kend, qpos0 + tok_hi - start + 1);
    int kbeg = 0;
    if (WINDOWED)
        kbeg = max(0, qpos0 + tok_lo - p.window + 1 - start);

    const float scale = p.sm_scale * kLog2e;
    float o[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m[2] = {neg_inf(), neg_inf()};
    float l[2] = {0.f, 0.f};

    paged_kv<const T, HD, PS> kv{static_cast<const T *>(p.kv), p.n_kv_heads};
    const unsigned sK0 = smem_addr(sK), sV0 = smem_addr(sV);
    /* the tile is below the diagonal and inside the window and the view for every row of the CTA:
       no element needs the mask (the unmasked branch computes the same values) */
    const int qpos_lo = qpos0 + tok_lo, qpos_hi = qpos0 + tok_hi;

    /* K (or V) rows of keys [t0, t0 + BK) into shared memory with cp.async; keys at or past kend
       are zero-filled, never read from pages they do not belong to */
    auto stage = [&](unsigned sbase, bool is_v, int t0) {
        for (int idx = tid; idx < BK * (HD / VEC); idx += NT) {
            const int key = idx / (HD / VEC), cc = idx % (HD / VEC);
            const int j = t0 + key;
            const bool ok = j < kend;
            const T *src = static_cast<const T *>(p.kv);
            if (ok) {
                const int page = p.kv_indices[p0 + j / PS];
                src = (is_v ? kv.v_ptr(page, j % PS, h) : kv.k_ptr(page, j % PS, h)) + cc * VEC;
            }
            cp_async16(sbase + (unsigned)(key * LD + cc * VEC) * 2u, src, ok);
        }
        cp_async_commit();
    };

    /* FlashAttention-2's overlap with one buffer each: V of this tile loads during S = QK^T, K of
       the next during O += PV. Fragments come from ldmatrix (common/smem.cuh); the mma sequence
       and the softmax are those of the plain loop, so the sums are the same. */
    if (kbeg < kend)
        stage(sK0, false, kbeg);
    for (int t0 = kbeg; t0 < kend; t0 += BK) {
        cp_async_wait_all();
        __syncthreads(); /* K[t0] visible; every warp is past the PV that read sV */
        stage(sV0, true, t0);

        /* ---- S = Q K^T (16 rows x BK keys per warp) ---- */
        float s[BK / 8][4];
#pragma unroll
        for (int n = 0; n < BK / 8; n++) {
            s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
            /* lane -> row (key n * 8 + lane % 8), column block lane / 8 of 8 dims */
            const unsigned a = sK0 + (unsigned)((n * 8 + (lane & 7)) * LD + (lane >> 3) * 8) * 2u;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk += 2) {
                unsigned b[4];
                if (kk + 1 < HD / 16) {
                    ldmatrix_x4(a + kk * 32u, b[0], b[1], b[2], b[3]);
                } else {
                    /* the last odd block: .x2 reads the addresses of lanes 0..15 only */
                    ldmatrix_x2(a + kk * 32u, b[0], b[1]);
                    b[2] = b[3] = 0u;
                }
                mma_m16n8k16<T>::run(s[n], qa[kk], b[0], b[1]);
                if (kk + 1 < HD / 16)
                    mma_m16n8k16<T>::run(s[n], qa[kk + 1], b[2], b[3]);
            }
        }

        /* ---- scale, mask, online softmax (rows gid and gid+8; a quad shares a row) ---- */
        bool need_mask = t0 + BK > kend;
        if (CAUSAL)
            need_mask = need_mask || start + t0 + BK - 1 > qpos_lo;
        if (WINDOWED)
            need_mask = need_mask || start + t0 <= qpos_hi - p.window;
        float mx[2] = {neg_inf(), neg_inf()};
        if (need_mask) {
#pragma unroll
            for (int n = 0; n < BK / 8; n++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = e >> 1;
                    const int j = t0 + n * 8 + 2 * tig + (e & 1);
                    const int kpos = start + j;
                    bool masked = j >= kend;
                    if (CAUSAL)
                        masked = masked || kpos > qpos[i];
                    if (WINDOWED)
                        masked = masked || kpos <= qpos[i] - p.window;
                    float v = masked ? neg_inf() : s[n][e] * scale;
                    s[n][e] = v;
                    mx[i] = fmaxf(mx[i], v);
                }
            }
        } else {
#pragma unroll
            for (int n = 0; n < BK / 8; n++) {
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const float v = s[n][e] * scale;
                    s[n][e] = v;
                    mx[e >> 1] = fmaxf(mx[e >> 1], v);
                }
            }
        }
        float alpha[2], muse[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
            float m_new = fmaxf(m[i], mx[i]);
            muse[i] = m_new == neg_inf() ? 0.f : m_new;
            alpha[i] = exp2f(m[i] - muse[i]);
            m[i] = m_new;
            l[i] *= alpha[i];
        }
#pragma unroll
        for (int n = 0; n < BK / 8; n++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = e >> 1;
                float pe = exp2f(s[n][e] - muse[i]);
                s[n][e] = pe;
                l[i] += pe;
            }
        }
#pragma unroll
        for (int n = 0; n < HD / 8; n++) {
            o[n][0] *= alpha[0];
            o[n][1] *= alpha[0];
            o[n][2] *= alpha[1];
            o[n][3] *= alpha[1];
        }

        cp_async_wait_all();
        __syncthreads(); /* V[t0] visible; every warp is done with sK */
        if (t0 + BK < kend)
            stage(sK0, false, t0 + BK);

        /* ---- O += P V ---- */
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            unsigned pa[4];
            pa[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
            pa[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
            pa[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
            pa[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
            /* lane -> row (key kk * 16 + (lane / 8 % 2) * 8 + lane % 8), dims block lane / 16 */
            const unsigned a =
                sV0 + (unsigned)((kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD +
                                 (lane >> 4) * 8) * 2u;
#pragma unroll
            for (int n = 0; n < HD / 8; n += 2) {
                unsigned b0, b1, b2, b3;
                ldmatrix_x4_trans(a + n * 16u, b0, b1, b2, b3);
                mma_m16n8k16<T>::run(o[n], pa, b0, b1);
                mma_m16n8k16<T>::run(o[n + 1], pa, b2, b3);
            }
        }
    }

    /* ---- normalize and write ---- */
    TA *out = static_cast<TA *>(p.o);
#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
        const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
        if (!rvalid[i])
            continue;
        TA *orow = out + (long long)(q0 + qtok[i]) * p.o_stride + (long long)qhead[i] * HD;
#pragma unroll
        for (int n = 0; n < HD / 8; n++)
            store2(orow + n * 8 + 2 * tig, o[n][2 * i] * inv, o[n][2 * i + 1] * inv);
    }
}

} // namespace ms
