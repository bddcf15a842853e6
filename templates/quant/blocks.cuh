/*
 * blocks.cuh - ggml's quantized block types as the qmatmul kernels read them (ggml-common.h
 * block_q4_0 ... block_q6_K; formulas of ggml-quants.c dequantize_row_*, the same as
 * runtime/loaders/gguf_quant.c).
 *
 * Every type is read in units of 32 consecutive values of a row: a Q4_0/Q4_1/Q5_0/Q8_0 block is
 * one unit, a Q4_K/Q5_K/Q6_K super-block of 256 is eight (its sub-blocks in value order).
 * unit(block, sub, w) computes the 32 values with the CPU reference's operations in its order,
 * each correctly rounded (no FMA contraction), so the result is bit-exact with ggml's float32
 * dequantization. Loads: 128-bit for the 16-byte aligned K-quant blocks, 32-bit for Q4_1, 16-bit
 * for the 2-byte aligned Q4_0/Q5_0/Q8_0/Q6_K blocks.
 *
 * Device code for NVRTC; without __CUDA_ARCH__ (tests/test_quant_blocks.cpp, which defines
 * __device__, __forceinline__ and uint4 first) the same code builds on the host with plain loads,
 * so the CPU CI checks it against ms_ggml_dequantize.
 */
#pragma once

namespace ms {
namespace quant {

#ifdef __CUDA_ARCH__
__device__ __forceinline__ unsigned ld_u16(const unsigned char *p) {
    return __ldg(reinterpret_cast<const unsigned short *>(p));
}
__device__ __forceinline__ unsigned ld_u32(const unsigned char *p) {
    return __ldg(reinterpret_cast<const unsigned int *>(p));
}
__device__ __forceinline__ uint4 ld_u128(const unsigned char *p) {
    return __ldg(reinterpret_cast<const uint4 *>(p));
}
/* IEEE half to float (exact). */
__device__ __forceinline__ float f16_bits(unsigned h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)h));
    return f;
}
/* Correctly rounded float operations that the compiler may not contract into an FMA. */
/* (the CUDA intrinsics: these once called themselves, an infinite recursion that NVRTC compiled
 * into kernels writing nothing, so every quantized weight read as zeros on the GPU) */
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub_rn(float a, float b) { return __fsub_rn(a, b); }
#else
/* The host build of tests/test_quant_blocks.cpp (compiled with -ffp-contract=off): plain loads and
 * float arithmetic, and the same exact half conversion in integer operations. */
__device__ __forceinline__ unsigned ld_u16(const unsigned char *p) { return (unsigned)p[0] | ((unsigned)p[1] << 8); }
__device__ __forceinline__ unsigned ld_u32(const unsigned char *p) { return ld_u16(p) | (ld_u16(p + 2) << 16); }
__device__ __forceinline__ uint4 ld_u128(const unsigned char *p) {
    uint4 v;
    v.x = ld_u32(p);
    v.y = ld_u32(p + 4);
    v.z = ld_u32(p + 8);
    v.w = ld_u32(p + 12);
    return v;
}
__device__ __forceinline__ float f16_bits(unsigned h) {
    unsigned s = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, bits;
    if (e == 0 && m == 0) {
        bits = s;
    } else if (e == 0) { /* subnormal: normalize */
        e = 113;
        while (!(m & 0x400u)) {
            m <<= 1;
            e--;
        }
        bits = s | (e << 23) | ((m & 0x3ffu) << 13);
    } else if (e == 31) {
        bits = s | 0x7f800000u | (m << 13);
    } else {
        bits = s | ((e + 112) << 23) | (m << 13);
    }
    float f;
    __builtin_memcpy(&f, &bits, sizeof f);
    return f;
}
__device__ __forceinline__ float mul_rn(float a, float b) { return a * b; }
__device__ __forceinline__ float add_rn(float a, float b) { return a + b; }
__device__ __forceinline__ float sub_rn(float a, float b) { return a - b; }
#endif

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

/* Bytes [0, 8) of an A-byte aligned address (A = 2, 4 or 8) with the widest loads A allows. */
template <int A> __device__ __forceinline__ void ld8(const unsigned char *p, unsigned char (&b)[8]) {
    static_assert(A == 2 || A == 4 || A == 8, "ld8: 2-, 4- or 8-byte alignment");
    unsigned lo, hi;
#ifdef __CUDA_ARCH__
    if (A == 8) {
        const uint2 v = __ldg(reinterpret_cast<const uint2 *>(p));
        lo = v.x;
        hi = v.y;
    } else
#endif
    if (A >= 4) {
        lo = ld_u32(p);
        hi = ld_u32(p + 4);
    } else {
        lo = ld_u16(p) | (ld_u16(p + 2) << 16);
        hi = ld_u16(p + 4) | (ld_u16(p + 6) << 16);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        b[i] = (unsigned char)((lo >> (8 * i)) & 0xffu);
        b[4 + i] = (unsigned char)((hi >> (8 * i)) & 0xffu);
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

/* A Q4_K / Q5_K block's header h[16] (f16 d, f16 dmin, 12 bytes of 6-bit scales and mins):
 * sub-block s's scale d * sc and offset dmin * m (ggml dequantize_row_q4_K / _q5_K). */
__device__ __forceinline__ void scale_min_k(const unsigned char *h, int s, float &d1, float &m1) {
    const float d = f16_bits((unsigned)h[0] | ((unsigned)h[1] << 8));
    const float dmin = f16_bits((unsigned)h[2] | ((unsigned)h[3] << 8));
    int sc, m;
    scale_min_k4(s, h + 4, sc, m);
    d1 = mul_rn(d, (float)sc);
    m1 = mul_rn(dmin, (float)m);
}

} // namespace quant

/* ---- the block types: kQK values in kBytes bytes; unit(block, sub, w) -> values
 *      [32 sub, 32 sub + 32) of the block; slice(block, sub, p, w) -> values
 *      [32 sub + 8 p, 32 sub + 8 p + 8) (p in 0..3), each value bit-identical to unit's: the
 *      GEMV's lanes take 8 consecutive values each, so a warp's x loads are contiguous ---- */

/// block_q4_0: f16 d; 16 bytes of 4-bit q (low nibbles values 0..15, high 16..31); w = (q - 8) d.
struct q4_0 {
    static constexpr int kQK = 32, kBytes = 18;
    static __device__ __forceinline__ void unit(const unsigned char *b, int, float (&w)[32]) {
        unsigned char v[18];
        quant::ld_bytes2<18>(b, v);
        const float d = quant::f16_bits((unsigned)v[0] | ((unsigned)v[1] << 8));
#pragma unroll
        for (int j = 0; j < 16; j++) {
            w[j] = quant::mul_rn((float)((v[2 + j] & 0x0F) - 8), d);
            w[j + 16] = quant::mul_rn((float)((v[2 + j] >> 4) - 8), d);
        }
    }
    static __device__ __forceinline__ void slice(const unsigned char *b, int, int p, float (&w)[8]) {
        unsigned char q[8];
        quant::ld8<2>(b + 2 + 8 * (p & 1), q);
        const float d = quant::f16_bits(quant::ld_u16(b));
        const int shift = (p >> 1) * 4;
#pragma unroll
        for (int k = 0; k < 8; k++)
            w[k] = quant::mul_rn((float)(((q[k] >> shift) & 0x0F) - 8), d);
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
            w[j] = quant::add_rn(quant::mul_rn((float)(v[4 + j] & 0x0F), d), m);
            w[j + 16] = quant::add_rn(quant::mul_rn((float)(v[4 + j] >> 4), d), m);
        }
    }
    static __device__ __forceinline__ void slice(const unsigned char *b, int, int p, float (&w)[8]) {
        unsigned char q[8];
        quant::ld8<4>(b + 4 + 8 * (p & 1), q);
        const unsigned dm = quant::ld_u32(b);
        const float d = quant::f16_bits(dm & 0xffffu), m = quant::f16_bits(dm >> 16);
        const int shift = (p >> 1) * 4;
#pragma unroll
        for (int k = 0; k < 8; k++)
            w[k] = quant::add_rn(quant::mul_rn((float)((q[k] >> shift) & 0x0F), d), m);
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
            w[j] = quant::mul_rn((float)(((v[6 + j] & 0x0F) | xh0) - 16), d);
            w[j + 16] = quant::mul_rn((float)(((v[6 + j] >> 4) | xh1) - 16), d);
        }
    }
    static __device__ __forceinline__ void slice(const unsigned char *b, int, int p, float (&w)[8]) {
        unsigned char q[8];
        quant::ld8<2>(b + 6 + 8 * (p & 1), q);
        const float d = quant::f16_bits(quant::ld_u16(b));
        const unsigned qh = quant::ld_u16(b + 2) | (quant::ld_u16(b + 4) << 16);
        const int shift = (p >> 1) * 4;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const int xh = (int)(((qh >> (8 * p + k)) & 1u) << 4); /* bit j of qh is value j's 5th */
            w[k] = quant::mul_rn((float)((((q[k] >> shift) & 0x0F) | xh) - 16), d);
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
            w[j] = quant::mul_rn((float)(signed char)v[2 + j], d);
    }
    static __device__ __forceinline__ void slice(const unsigned char *b, int, int p, float (&w)[8]) {
        unsigned char q[8];
        quant::ld8<2>(b + 2 + 8 * p, q);
        const float d = quant::f16_bits(quant::ld_u16(b));
#pragma unroll
        for (int k = 0; k < 8; k++)
            w[k] = quant::mul_rn((float)(signed char)q[k], d);
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
        float d1, m1;
        quant::scale_min_k(h, s, d1, m1);
        const int shift = (s & 1) * 4;
#pragma unroll
        for (int l = 0; l < 32; l++)
            w[l] = quant::sub_rn(quant::mul_rn(d1, (float)((q[l] >> shift) & 0xF)), m1);
    }
    static __device__ __forceinline__ void slice(const unsigned char *b, int s, int p, float (&w)[8]) {
        unsigned char h[16], q[8];
        quant::ld_bytes16<16>(b, h);
        quant::ld8<8>(b + 16 + 32 * (s >> 1) + 8 * p, q);
        float d1, m1;
        quant::scale_min_k(h, s, d1, m1);
        const int shift = (s & 1) * 4;
#pragma unroll
        for (int k = 0; k < 8; k++)
            w[k] = quant::sub_rn(quant::mul_rn(d1, (float)((q[k] >> shift) & 0xF)), m1);
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
        float d1, m1;
        quant::scale_min_k(h, s, d1, m1);
        const int shift = (s & 1) * 4;
        const unsigned hbit = 1u << s; /* u1 = 1 << 2j for even s = 2j, u2 = 2 << 2j for odd */
#pragma unroll
        for (int l = 0; l < 32; l++) {
            const int qv = ((ql[l] >> shift) & 0xF) + ((qh[l] & hbit) ? 16 : 0);
            w[l] = quant::sub_rn(quant::mul_rn(d1, (float)qv), m1);
        }
    }
    static __device__ __forceinline__ void slice(const unsigned char *b, int s, int p, float (&w)[8]) {
        unsigned char h[16], qh[8], ql[8];
        quant::ld_bytes16<16>(b, h);
        quant::ld8<8>(b + 16 + 8 * p, qh);
        quant::ld8<8>(b + 48 + 32 * (s >> 1) + 8 * p, ql);
        float d1, m1;
        quant::scale_min_k(h, s, d1, m1);
        const int shift = (s & 1) * 4;
        const unsigned hbit = 1u << s;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const int qv = ((ql[k] >> shift) & 0xF) + ((qh[k] & hbit) ? 16 : 0);
            w[k] = quant::sub_rn(quant::mul_rn(d1, (float)qv), m1);
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
        const float ds0 = quant::mul_rn(d, (float)(signed char)scb[0]);
        const float ds1 = quant::mul_rn(d, (float)(signed char)scb[1]);
        const int lshift = (k >> 1) * 4, hshift = 2 * k;
#pragma unroll
        for (int l = 0; l < 32; l++) {
            const int qv = (((ql[l] >> lshift) & 0xF) | (((qh[l] >> hshift) & 3) << 4)) - 32;
            w[l] = quant::mul_rn(l < 16 ? ds0 : ds1, (float)qv);
        }
    }
    static __device__ __forceinline__ void slice(const unsigned char *b, int s, int p, float (&w)[8]) {
        const int n = s >> 2, k4 = s & 3;
        unsigned char ql[8], qh[8];
        quant::ld8<2>(b + 64 * n + 32 * (k4 & 1) + 8 * p, ql);
        quant::ld8<2>(b + 128 + 32 * n + 8 * p, qh);
        const unsigned scp = quant::ld_u16(b + 192 + 8 * n + 2 * k4);
        const float d = quant::f16_bits(quant::ld_u16(b + 208));
        const float ds = quant::mul_rn(d, (float)(signed char)((scp >> (8 * (p >> 1))) & 0xffu));
        const int lshift = (k4 >> 1) * 4, hshift = 2 * k4;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const int qv = (((ql[k] >> lshift) & 0xF) | (((qh[k] >> hshift) & 3) << 4)) - 32;
            w[k] = quant::mul_rn(ds, (float)qv);
        }
    }
};

} // namespace ms
