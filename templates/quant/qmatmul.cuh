/*
 * qmatmul.cuh - matmuls over weights kept in ggml's quantized block layout (quant/qparams.h):
 * the decode GEMV y = x W^T for 1..8 rows of x, and the dequantization of W into bf16 that the
 * prefill path feeds to the tensor-core GEMM, and the embedding gather from a quantized table.
 *
 * Block formats and the dequantization formulas are ggml's (ggml-common.h, ggml-quants.c
 * dequantize_row_*; the same as runtime/loaders/gguf_quant.c). Every type is read in units of 32
 * consecutive values of a row: a Q4_0/Q4_1/Q5_0/Q8_0 block is one unit, a Q4_K/Q5_K/Q6_K
 * super-block of 256 is eight (its sub-blocks in value order). unit() computes the 32 values with
 * the CPU reference's operations in its order, each rounded (__fmul_rn / __fadd_rn, no FMA
 * contraction), so qdequant_bf16 gives bf16(dequantize_row_*) exactly.
 *
 * GEMV (ms_qgemv_<NC>): one CTA of MS_QGEMV_THREADS threads computes MS_QGEMV_ROWS output rows;
 * its threads stride over the 32-value units of the rows (split-K over the whole CTA, so even a
 * 1024-row projection puts 512 CTAs x 4 warps in flight), consecutive threads reading consecutive
 * blocks (coalesced; the 16-byte aligned K-quant blocks with 128-bit loads, the 2-byte aligned
 * legacy blocks with 16/32-bit loads). Each thread dequantizes its unit of both rows into
 * registers, then streams the matching 32 floats of each x row (8 x 128-bit read-only loads,
 * served by L1/L2: x is shared by every CTA) and accumulates in fp32. Partial sums are reduced
 * with warp shuffles and one shared-memory pass in a fixed order (deterministic).
 */
#pragma once

#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "quant/qparams.h"

namespace ms {
namespace quant {

__device__ __forceinline__ unsigned ld_u16(const unsigned char *p) {
    return __ldg(reinterpret_cast<const unsigned short *>(p));
}
__device__ __forceinline__ unsigned ld_u32(const unsigned char *p) {
    return __ldg(reinterpret_cast<const unsigned int *>(p));
}
__device__ __forceinline__ uint4 ld_u128(const unsigned char *p) {
    return __ldg(reinterpret_cast<const uint4 *>(p));
}
__device__ __forceinline__ float f16_bits(unsigned h) {
    f16 v;
    v.x = (unsigned short)h;
    return to_float(v);
}

/* Bytes [0, N) of a 2-byte aligned address, with 16-bit loads. */
template <int N> __device__ __forceinline__ void ld_bytes2(const unsigned char *p, unsigned char (&b)[N]) {
#pragma unroll
    for (int k = 0; k < N / 2; k++) {
        const unsigned u = ld_u16(p + 2 * k);
        b[2 * k] = (unsigned char)(u & 0xffu);
        b[2 * k + 1] = (unsigned char)(u >> 8);
    }
}
/* Bytes [0, N) of a 4-byte aligned address, with 32-bit loads. */
template <int N> __device__ __forceinline__ void ld_bytes4(const unsigned char *p, unsigned char (&b)[N]) {
#pragma unroll
    for (int k = 0; k < N / 4; k++) {
        const unsigned u = ld_u32(p + 4 * k);
#pragma unroll
        for (int i = 0; i < 4; i++)
            b[4 * k + i] = (unsigned char)((u >> (8 * i)) & 0xffu);
    }
}
/* Bytes [0, N) of a 16-byte aligned address, with 128-bit loads. */
template <int N> __device__ __forceinline__ void ld_bytes16(const unsigned char *p, unsigned char (&b)[N]) {
#pragma unroll
    for (int k = 0; k < N / 16; k++) {
        const uint4 v = ld_u128(p + 16 * k);
        const unsigned w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                b[16 * k + 4 * j + i] = (unsigned char)((w[j] >> (8 * i)) & 0xffu);
    }
}

/* ggml-quants.c get_scale_min_k4: the j-th 6-bit scale and min of a Q4_K / Q5_K block. */
__device__ __forceinline__ void scale_min_k4(int j, const unsigned char *q, int &d, int &m) {
    if (j < 4) {
        d = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

} // namespace quant

/* ---- the block types: kQK values in kBytes bytes; unit(block, sub, w) -> values
 *      [32 sub, 32 sub + 32) of the block ---- */

/// block_q4_0: f16 d; 16 bytes of 4-bit q (low nibbles values 0..15, high 16..31); w = (q - 8) d.
struct q4_0 {
    static constexpr int kQK = 32, kBytes = 18;
    static __device__ __forceinline__ void unit(const unsigned char *b, int, float (&w)[32]) {
        unsigned char v[18];
        quant::ld_bytes2<18>(b, v);
        const float d = quant::f16_bits((unsigned)v[0] | ((unsigned)v[1] << 8));
#pragma unroll
        for (int j = 0; j < 16; j++) {
            w[j] = __fmul_rn((float)((v[2 + j] & 0x0F) - 8), d);
            w[j + 16] = __fmul_rn((float)((v[2 + j] >> 4) - 8), d);
        }
    }
};

/// block_q4_1: f16 d, f16 m; 16 bytes of 4-bit q; w = q d + m.
struct q4_1 {
    static constexpr int kQK = 32, kBytes = 20;
    static __device__ __forceinline__ void unit(const unsigned char *b, int, float (&w)[32]) {
        unsigned char v[20];
        quant::ld_bytes4<20>(b, v);
        const float d = quant::f16_bits((unsigned)v[0] | ((unsigned)v[1] << 8));
        const float m = quant::f16_bits((unsigned)v[2] | ((unsigned)v[3] << 8));
#pragma unroll
        for (int j = 0; j < 16; j++) {
            w[j] = __fadd_rn(__fmul_rn((float)(v[4 + j] & 0x0F), d), m);
            w[j + 16] = __fadd_rn(__fmul_rn((float)(v[4 + j] >> 4), d), m);
        }
    }
};

/// block_q5_0: f16 d; u32 qh (the 5th bits); 16 bytes of low nibbles; w = (q - 16) d.
struct q5_0 {
    static constexpr int kQK = 32, kBytes = 22;
    static __device__ __forceinline__ void unit(const unsigned char *b, int, float (&w)[32]) {
        unsigned char v[22];
        quant::ld_bytes2<22>(b, v);
        const float d = quant::f16_bits((unsigned)v[0] | ((unsigned)v[1] << 8));
        const unsigned qh = (unsigned)v[2] | ((unsigned)v[3] << 8) | ((unsigned)v[4] << 16) |
                            ((unsigned)v[5] << 24);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int xh0 = (int)(((qh >> j) << 4) & 0x10u);
            const int xh1 = (int)((qh >> (j + 12)) & 0x10u);
            w[j] = __fmul_rn((float)(((v[6 + j] & 0x0F) | xh0) - 16), d);
            w[j + 16] = __fmul_rn((float)(((v[6 + j] >> 4) | xh1) - 16), d);
        }
    }
};

/// block_q8_0: f16 d; 32 int8 q; w = q d.
struct q8_0 {
    static constexpr int kQK = 32, kBytes = 34;
    static __device__ __forceinline__ void unit(const unsigned char *b, int, float (&w)[32]) {
        unsigned char v[34];
        quant::ld_bytes2<34>(b, v);
        const float d = quant::f16_bits((unsigned)v[0] | ((unsigned)v[1] << 8));
#pragma unroll
        for (int j = 0; j < 32; j++)
            w[j] = __fmul_rn((float)(signed char)v[2 + j], d);
    }
};

/// block_q4_K: f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of 4-bit q; sub-block s
/// (of 8) uses the low (s even) or high nibbles of qs[32 (s / 2) ..]; w = d sc q - dmin m.
struct q4_k {
    static constexpr int kQK = 256, kBytes = 144;
    static __device__ __forceinline__ void unit(const unsigned char *b, int s, float (&w)[32]) {
        unsigned char h[16], q[32];
        quant::ld_bytes16<16>(b, h);
        quant::ld_bytes16<32>(b + 16 + 32 * (s >> 1), q);
        const float d = quant::f16_bits((unsigned)h[0] | ((unsigned)h[1] << 8));
        const float dmin = quant::f16_bits((unsigned)h[2] | ((unsigned)h[3] << 8));
        int sc, m;
        quant::scale_min_k4(s, h + 4, sc, m);
        const float d1 = __fmul_rn(d, (float)sc), m1 = __fmul_rn(dmin, (float)m);
        const int shift = (s & 1) * 4;
#pragma unroll
        for (int l = 0; l < 32; l++)
            w[l] = __fsub_rn(__fmul_rn(d1, (float)((q[l] >> shift) & 0xF)), m1);
    }
};

/// block_q5_K: as Q4_K plus 32 bytes qh (bit 2 (s / 2) + (s & 1) of qh[l] is value l's 5th bit).
struct q5_k {
    static constexpr int kQK = 256, kBytes = 176;
    static __device__ __forceinline__ void unit(const unsigned char *b, int s, float (&w)[32]) {
        unsigned char h[16], qh[32], ql[32];
        quant::ld_bytes16<16>(b, h);
        quant::ld_bytes16<32>(b + 16, qh);
        quant::ld_bytes16<32>(b + 48 + 32 * (s >> 1), ql);
        const float d = quant::f16_bits((unsigned)h[0] | ((unsigned)h[1] << 8));
        const float dmin = quant::f16_bits((unsigned)h[2] | ((unsigned)h[3] << 8));
        int sc, m;
        quant::scale_min_k4(s, h + 4, sc, m);
        const float d1 = __fmul_rn(d, (float)sc), m1 = __fmul_rn(dmin, (float)m);
        const int shift = (s & 1) * 4;
        const unsigned hbit = 1u << s; /* u1 = 1 << 2j for even s = 2j, u2 = 2 << 2j for odd */
#pragma unroll
        for (int l = 0; l < 32; l++) {
            const int qv = ((ql[l] >> shift) & 0xF) + ((qh[l] & hbit) ? 16 : 0);
            w[l] = __fsub_rn(__fmul_rn(d1, (float)qv), m1);
        }
    }
};

/// block_q6_K: 128 bytes ql (low 4 bits), 64 bytes qh (high 2 bits), 16 int8 scales, f16 d; value
/// 128 n + 32 k + l (sub-block s = 4 n + k) = d sc[8 n + 2 k + l / 16] (q - 32).
struct q6_k {
    static constexpr int kQK = 256, kBytes = 210;
    static __device__ __forceinline__ void unit(const unsigned char *b, int s, float (&w)[32]) {
        const int n = s >> 2, k = s & 3;
        unsigned char ql[32], qh[32], scb[2], db[2];
        quant::ld_bytes2<32>(b + 64 * n + 32 * (k & 1), ql);
        quant::ld_bytes2<32>(b + 128 + 32 * n, qh);
        quant::ld_bytes2<2>(b + 192 + 8 * n + 2 * k, scb);
        quant::ld_bytes2<2>(b + 208, db);
        const float d = quant::f16_bits((unsigned)db[0] | ((unsigned)db[1] << 8));
        const float ds0 = __fmul_rn(d, (float)(signed char)scb[0]);
        const float ds1 = __fmul_rn(d, (float)(signed char)scb[1]);
        const int lshift = (k >> 1) * 4, hshift = 2 * k;
#pragma unroll
        for (int l = 0; l < 32; l++) {
            const int qv = (((ql[l] >> lshift) & 0xF) | (((qh[l] >> hshift) & 3) << 4)) - 32;
            w[l] = __fmul_rn(l < 16 ? ds0 : ds1, (float)qv);
        }
    }
};

/* ---- kernels ---- */

/// Q: block type; NC: x rows (1..MS_QGEMV_MAX_COLS). Grid: ceil(rows / MS_QGEMV_ROWS) CTAs of
/// MS_QGEMV_THREADS threads.
template <typename Q, int NC> __device__ __forceinline__ void qgemv(const ms_qmatmul_params &p) {
    static_assert(NC >= 1 && NC <= MS_QGEMV_MAX_COLS, "qgemv: 1..8 x rows");
    constexpr int R = MS_QGEMV_ROWS, U = Q::kQK / 32, NW = MS_QGEMV_THREADS / 32;
    __shared__ float red[NW][R * NC];
    const int units = p.in / 32;
    const int r0 = blockIdx.x * R;
    const unsigned char *w = static_cast<const unsigned char *>(p.w);
    const float *x = static_cast<const float *>(p.x);
    float acc[R][NC];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int c = 0; c < NC; c++)
            acc[r][c] = 0.f;
    for (int u = threadIdx.x; u < units; u += MS_QGEMV_THREADS) {
        const int blk = u / U, sub = u % U;
        float wv[R][32];
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (r0 + r < p.rows) {
                Q::unit(w + (size_t)(r0 + r) * (size_t)p.row_bytes + (size_t)blk * Q::kBytes, sub, wv[r]);
            } else {
#pragma unroll
                for (int l = 0; l < 32; l++)
                    wv[r][l] = 0.f;
            }
        }
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const float4 *xp = reinterpret_cast<const float4 *>(x + (size_t)c * (size_t)p.x_stride + (size_t)u * 32);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const float4 xv = __ldg(xp + k);
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float a = acc[r][c];
                    a = fmaf(wv[r][4 * k + 0], xv.x, a);
                    a = fmaf(wv[r][4 * k + 1], xv.y, a);
                    a = fmaf(wv[r][4 * k + 2], xv.z, a);
                    a = fmaf(wv[r][4 * k + 3], xv.w, a);
                    acc[r][c] = a;
                }
            }
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const float v = warp_sum(acc[r][c]);
            if (lane == 0)
                red[warp][r * NC + c] = v;
        }
    __syncthreads();
    if (threadIdx.x < R * NC) {
        const int r = threadIdx.x / NC, c = threadIdx.x % NC;
        float v = 0.f;
#pragma unroll
        for (int i = 0; i < NW; i++)
            v += red[i][threadIdx.x];
        if (r0 + r < p.rows)
            static_cast<float *>(p.y)[(size_t)c * (size_t)p.y_stride + (size_t)(r0 + r)] = v;
    }
}

/// W -> bf16 [rows, in] (packed rows), bit-exact with bf16(dequantize_row_*). Grid-stride over
/// units; MS_QDEQUANT_THREADS threads per CTA.
template <typename Q> __device__ __forceinline__ void qdequant_bf16(const ms_qmatmul_params &p) {
    constexpr int U = Q::kQK / 32;
    const int per_row = p.in / 32;
    const long long total = (long long)p.rows * per_row;
    const unsigned char *w = static_cast<const unsigned char *>(p.w);
    bf16 *out = static_cast<bf16 *>(p.out_bf16);
    for (long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        const long long r = idx / per_row;
        const int u = (int)(idx % per_row);
        float v[32];
        Q::unit(w + (size_t)r * (size_t)p.row_bytes + (size_t)(u / U) * Q::kBytes, u % U, v);
        store_n<bf16, 32>(out + (size_t)r * (size_t)p.in + (size_t)u * 32, v);
    }
}

/// Embedding gather from a quantized table: out[t, :] = W[ids[t], :] in float32 (p.x: int ids
/// [p.n], p.y: out rows at p.y_stride). Grid: p.n CTAs of MS_QGEMV_THREADS threads over the row's
/// units; ids outside [0, rows) give zeros (the host checks ids where it has them).
template <typename Q> __device__ __forceinline__ void qembed(const ms_qmatmul_params &p) {
    constexpr int U = Q::kQK / 32;
    const int t = blockIdx.x;
    const int id = static_cast<const int *>(p.x)[t];
    const unsigned char *w = static_cast<const unsigned char *>(p.w);
    float *out = static_cast<float *>(p.y) + (size_t)t * (size_t)p.y_stride;
    for (int u = threadIdx.x; u < p.in / 32; u += MS_QGEMV_THREADS) {
        float v[32];
        if (id >= 0 && id < p.rows) {
            Q::unit(w + (size_t)id * (size_t)p.row_bytes + (size_t)(u / U) * Q::kBytes, u % U, v);
        } else {
#pragma unroll
            for (int l = 0; l < 32; l++)
                v[l] = 0.f;
        }
        store_n<float, 32>(out + (size_t)u * 32, v);
    }
}

} // namespace ms
