/*
 * blocks.cuh - ggml's quantized block types as the qmatmul kernels read them (ggml-common.h
 * block_q4_0 ... block_q6_K; formulas of ggml-quants.c dequantize_row_*, the same as
 * runtime/loaders/gguf_quant.c).
 *
 * Every type is read in units of 32 consecutive values of a row: a Q4_0/Q4_1/Q5_0/Q8_0 block is
 * one unit, a Q4_K/Q5_K/Q6_K super-block of 256 is eight (its sub-blocks in value order).
 * Rows are kept in the planar layout (gguf_quant.h ms_ggml_rows_to_planar: each row's quant
 * bytes, then its scales). unit(row, nb, k, sub, w) computes the 32 values with the CPU
 * reference's operations in its order, each correctly rounded (no FMA contraction), so the result
 * is bit-exact with ggml's float32 dequantization. The GEMV's loads (Q::load<M>): in rows that
 * start 16-byte aligned, 8 bytes of Q4_0/Q4_1/Q5_0/Q6_K quants and 16 of Q8_0's (and the K-quant
 * headers) per load; otherwise 16-bit ones.
 *
 * Device code for NVRTC; without __CUDA_ARCH__ (tests/test_quant_blocks.cpp, which defines
 * __device__, __forceinline__, uint2 and uint4 first) the same code builds on the host with plain loads,
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
__device__ __forceinline__ float as_float(unsigned u) { return __uint_as_float(u); }
__device__ __forceinline__ unsigned byte_perm(unsigned x, unsigned y, unsigned s) { return __byte_perm(x, y, s); }
__device__ __forceinline__ uint2 ld_u64(const unsigned char *p) { return __ldg(reinterpret_cast<const uint2 *>(p)); }
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
__device__ __forceinline__ float as_float(unsigned u) {
    float f;
    __builtin_memcpy(&f, &u, sizeof f);
    return f;
}
/* PTX prmt (default mode): result byte n is byte (s >> 4 n) & 7 of the pair {x bytes 0..3, y bytes 0..3} */
__device__ __forceinline__ unsigned byte_perm(unsigned x, unsigned y, unsigned s) {
    const unsigned long long v = (unsigned long long)x | ((unsigned long long)y << 32);
    unsigned r = 0;
    for (int n = 0; n < 4; n++)
        r |= (unsigned)((v >> (8 * ((s >> (4 * n)) & 7u))) & 0xffu) << (8 * n);
    return r;
}
__device__ __forceinline__ uint2 ld_u64(const unsigned char *p) {
    uint2 v;
    v.x = ld_u32(p);
    v.y = ld_u32(p + 4);
    return v;
}
#endif

/* Small integers to float without I2F (a quarter-rate instruction on sm_90): the integer goes into
 * the mantissa of 1.5 * 2^23 and the constant is subtracted; exact for q in (-2^22, 2^22), so
 * bit-identical to (float)q. */
__device__ __forceinline__ float i2f(int q) { return as_float(0x4B400000u + (unsigned)q) - 12582912.0f; }

/* c + the dot product of the four signed bytes of a and b (PTX dp4a.s32.s32; the host build
 * multiplies byte by byte). */
#ifdef __CUDA_ARCH__
__device__ __forceinline__ int dp4a(int a, int b, int c) { return __dp4a(a, b, c); }
#else
inline int dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++)
        c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
    return c;
}
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
    d1 = mul_rn(d, i2f(sc));
    m1 = mul_rn(dmin, i2f(m));
}

/* scale_min_k from the header loaded as one uint4 (d and dmin in h.x, the 12 scale bytes in
 * h.y, h.z, h.w): the same values with shifts instead of a byte array indexed at run time (which
 * the GEMV would keep in local memory). */
__device__ __forceinline__ void scale_min_k_u4(const uint4 &h, int j, float &d1, float &m1) {
    const int sh = 8 * (j & 3);
    const unsigned y = h.y >> sh, z = h.z >> sh, w = h.w >> sh;
    int sc, m;
    if (j < 4) {
        sc = (int)(y & 63u);
        m = (int)(z & 63u);
    } else {
        sc = (int)((w & 0xFu) | (((y >> 6) & 3u) << 4));
        m = (int)(((w >> 4) & 0xFu) | (((z >> 6) & 3u) << 4));
    }
    d1 = mul_rn(f16_bits(h.x & 0xffffu), i2f(sc));
    m1 = mul_rn(f16_bits(h.x >> 16), i2f(m));
}

/* The power of 16 at which nibbles16's v[i] sits (the GEMV multiplies x by its inverse, an exact
 * power of 2, so v[i] x'[i] is the same product as nibble x). */
__device__ __forceinline__ constexpr float nib_scale(int i) {
    return i < 8 ? ((i & 1) ? 256.0f : 1.0f) : ((i & 1) ? 4096.0f : 16.0f);
}

/* The 16 nibbles of 8 bytes (w0: bytes 0..3, w1: bytes 4..7, little-endian) minus OFF, as floats,
 * with one AND-OR and one FADD per value and no shift (nor I2F): v[k] (k < 8) is byte k's low
 * nibble, v[8 + k] its high nibble, each exactly (nibble - OFF) * nib_scale(i): the nibble is
 * masked where it sits in its 16-bit half (bits 0, 4, 8 or 12) and or-ed into the mantissa of
 * 2^23, and 2^23 + OFF * scale (an exact float) is subtracted. */
template <int OFF> __device__ __forceinline__ void nibbles16(unsigned w0, unsigned w1, float (&v)[16]) {
    const unsigned ws[4] = {w0 & 0xffffu, w0 >> 16, w1 & 0xffffu, w1 >> 16};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        v[2 * i] = as_float((ws[i] & 0x000fu) | 0x4B000000u) - (8388608.0f + (float)OFF);
        v[2 * i + 1] = as_float((ws[i] & 0x0f00u) | 0x4B000000u) - (8388608.0f + 256.0f * (float)OFF);
        v[8 + 2 * i] = as_float((ws[i] & 0x00f0u) | 0x4B000000u) - (8388608.0f + 16.0f * (float)OFF);
        v[8 + 2 * i + 1] = as_float((ws[i] & 0xf000u) | 0x4B000000u) - (8388608.0f + 4096.0f * (float)OFF);
    }
}

/* The raw words one GEMV lane loads from one row (Q::load, Q::wload), decoded after the loads of all the
 * CTA's rows are in flight (Q::decode); each type uses the words it needs. */
struct qraw {
    unsigned u[8];
};
/* A Q4_K / Q5_K GEMV lane's two sub-blocks 2 k and 2 k + 1: their scales d and offsets m (= -dmin
 * m_j, so that w = d q + m) from the header held in r.u[0..3]. */
__device__ __forceinline__ void pair_scales_k(const qraw &r, int k, float (&d)[2], float (&m)[2]) {
    uint4 h;
    h.x = r.u[0], h.y = r.u[1], h.z = r.u[2], h.w = r.u[3];
    float m0, m1;
    scale_min_k_u4(h, 2 * k, d[0], m0);
    scale_min_k_u4(h, 2 * k + 1, d[1], m1);
    m[0] = -m0;
    m[1] = -m1;
}

/* Byte k (0..7) of the 8 bytes held in two little-endian words. */
__device__ __forceinline__ unsigned byte8(unsigned w0, unsigned w1, int k) {
    return ((k < 4 ? w0 : w1) >> (8 * (k & 3))) & 0xffu;
}
/* Four bytes at a 2-byte aligned address as one word (two 16-bit loads). */
__device__ __forceinline__ unsigned ld_u32_a2(const unsigned char *p) { return ld_u16(p) | (ld_u16(p + 2) << 16); }

/* How Q::load reads a row's bytes (the policy M of Q::load<M>), by the alignment of the row's
 * start: gmem16, rows at 16-byte aligned addresses (row_bytes a multiple of 16, e.g. any Q4_0 row
 * of a multiple of 256 values), loads of the widths the planar layout aligns (8 bytes of Q4_0
 * quants, 16 of Q8_0's); gmem2, rows only 2-byte aligned, every load made of 16-bit ones. The
 * same bytes either way. On the host both are the byte-assembled loads above. */
struct gmem16 {
    static __device__ __forceinline__ unsigned u16(const unsigned char *p) { return ld_u16(p); }
    static __device__ __forceinline__ unsigned u32(const unsigned char *p) { return ld_u32(p); }
    static __device__ __forceinline__ uint2 u64(const unsigned char *p) { return ld_u64(p); }
    static __device__ __forceinline__ uint4 u128(const unsigned char *p) { return ld_u128(p); }
};
struct gmem2 {
    static __device__ __forceinline__ unsigned u16(const unsigned char *p) { return ld_u16(p); }
    static __device__ __forceinline__ unsigned u32(const unsigned char *p) { return ld_u32_a2(p); }
    static __device__ __forceinline__ uint2 u64(const unsigned char *p) {
        uint2 v;
        v.x = ld_u32_a2(p);
        v.y = ld_u32_a2(p + 4);
        return v;
    }
    static __device__ __forceinline__ uint4 u128(const unsigned char *p) {
        uint4 v;
        v.x = ld_u32_a2(p);
        v.y = ld_u32_a2(p + 4);
        v.z = ld_u32_a2(p + 8);
        v.w = ld_u32_a2(p + 12);
        return v;
    }
};

} // namespace quant

/* ---- the block types: kQK values in kBytes bytes, kept in device memory in the planar row
 * layout (gguf_quant.h ms_ggml_rows_to_planar): a row of nb blocks is [the blocks' quant bytes,
 * kP0 each][the rest of each block, its scales, kBytes - kP0 each]; plane_q / plane_h give block
 * k's two parts (for Q4_K and Q5_K, kP0 = kBytes: the blocks unchanged, plane_h = plane_q).
 *
 * unit(row, nb, k, sub, w): values [32 sub, 32 sub + 32) of block k of a planar row of nb blocks,
 * each bit-identical to ggml's float32 dequantization (the dequantize and embedding kernels).
 *
 * The GEMV's reading (qmatmul.cuh qgemv): a row is walked in chunks of 512 values, one warp per
 * chunk; lane L takes 16 of them, two runs of 8 consecutive values at chunk offsets run0(L) and
 * run0(L) + kRun1 (the 32 lanes cover the chunk once). qlane<Q>(row, nb, ch, L, v, d, m) (Q::load,
 * then Q::decode) gives, for run j and k < 8, w[run0 + j kRun1 + k] = d[j] * q + m[j] with
 * q = v[8 j + k] / nib_scale(8 j + k) (or v itself where kNibScaled is false): v holds
 * exact small-integer floats (times nib_scale where kNibScaled, so that no value needs a shift),
 * d and m the run's scale and offset (m = 0 where the type has none: kMin false). Reconstructed
 * in that order the value is bit-identical to unit's (tests/test_quant_blocks.cpp), and the GEMV
 * accumulates d[j] * sum_k v x' + m[j] * sum_k x with x' = x / nib_scale. lane_ok(ch, L, in):
 * the lane's values lie inside a row of `in` values (a 32-value type's last chunk may be partial).
 *
 * The integer GEMV (kI8: Q4_0, Q8_0, Q4_K; qmatmul.cuh qgemv_load_i8, qgemv_dot_i8 / _i8q): x is
 * quantized per 32-value block to int8 like ggml-cuda's q8_1 (dx = amax / 127, q = rint(x 127 /
 * amax)). A lane
 * takes V values of the row in two runs of V / 2, its x q packed into xw[V / 4] (run j in the words
 * j V / 8 .., value order) and xs[j] their integer sums; the exact integer is[j] of each run gives
 * sum_k w x^ = dx (d[j] is[j] + m[j] xs[j]) (x^ = dx q, the quantized x; m = 0 without a min), from
 * dp4a over the weight's bytes as loaded, with no float conversion per value. Two lane shapes:
 *   kWide false (Q4_0, Q8_0): V = 16, the fp32 GEMV's lanes (run0, kRun1, lane_ok, 512-value
 *     chunks), load<M> into qraw, scales(raw, L, d, m), idot(raw, xw[4], xs, is); x quantized
 *     in the CTA (quant_x16) or before the launch (common/q8x.cuh), its words then loaded;
 *   kWide true (Q4_K): V = 32 in 1024-value chunks, runs of 16 at wrun0(L) and wrun0(L) + kWRun1
 *     (wlane_ok), wload<M> into qraw, wscales, widot(raw, xw[8], xs, is): a Q4_K lane's 16-byte
 *     header and its scale decoding are paid once per 32 values instead of 16 (H200, 8B decode at
 *     batch 1: Q4_K 285 -> 422 tok/s). The same shape slowed Q4_0 (448 -> 393) and Q8_0's GEMVs
 *     (+15%): a lane's 32 x values are 128 contiguous bytes, so each of its float4 loads touches 32
 *     lines across the warp, twice the L1 wavefronts of the 16-value lanes (docs/perf.md).
 * The lanes that share an x block are kXLanes consecutive ones (their amax is reduced over them),
 * and kXOneBlock says that both of a lane's runs lie in one x block (and one weight block:
 * d[0] = d[1]).
 * ---- */

/// Block k's quant bytes (plane 0) in a planar row of nb blocks.
template <typename Q>
__device__ __forceinline__ const unsigned char *plane_q(const unsigned char *row, int, int k) {
    return row + (size_t)k * Q::kP0;
}
/// Block k's other bytes (plane 1: its scales, in ggml's order); plane_q for the unchanged types.
template <typename Q>
__device__ __forceinline__ const unsigned char *plane_h(const unsigned char *row, int nb, int k) {
    return Q::kP0 == Q::kBytes ? row + (size_t)k * Q::kBytes
                               : row + (size_t)nb * Q::kP0 + (size_t)k * (Q::kBytes - Q::kP0);
}

/// The GEMV lanes of the 32-value nibble types (Q4_0, Q4_1, Q5_0): lane L of chunk ch takes block
/// 16 ch + L / 2 and its quant bytes 8 (L % 2) .. + 8 (values 8 (L % 2) .. and 16 + 8 (L % 2) ..);
/// load_q8 puts those bytes in r.u[0..1] and returns the block.
struct nib32_lanes {
    static __device__ __forceinline__ int run0(int L) { return 32 * (L >> 1) + 8 * (L & 1); }
    static __device__ __forceinline__ bool lane_ok(int ch, int L, int in) { return (16 * ch + (L >> 1)) * 32 < in; }
    template <typename Q, typename M>
    static __device__ __forceinline__ int load_q8(const unsigned char *row, int nb, int ch, int L, quant::qraw &r) {
        const int k = 16 * ch + (L >> 1);
        const uint2 q = M::u64(plane_q<Q>(row, nb, k) + 8 * (L & 1));
        r.u[0] = q.x;
        r.u[1] = q.y;
        return k;
    }
};

/// block_q4_0: f16 d; 16 bytes of 4-bit q (low nibbles values 0..15, high 16..31); w = (q - 8) d.
/// GEMV lane: unit L / 2 of the chunk, bytes 8 (L % 2) .. + 8: values 8 h .. and 16 + 8 h ...
struct q4_0 : nib32_lanes {
    static constexpr int kQK = 32, kBytes = 18, kP0 = 16, kRun1 = 16, kXLanes = 2;
    static constexpr bool kMin = false, kNibScaled = true, kI8 = true, kXOneBlock = true, kWide = false;
    static __device__ __forceinline__ void unit(const unsigned char *row, int nb, int k, int, float (&w)[32]) {
        unsigned char v[16];
        quant::ld_bytes2<16>(plane_q<q4_0>(row, nb, k), v);
        const float d = quant::f16_bits(quant::ld_u16(plane_h<q4_0>(row, nb, k)));
#pragma unroll
        for (int j = 0; j < 16; j++) {
            w[j] = quant::mul_rn(quant::i2f((v[j] & 0x0F) - 8), d);
            w[j + 16] = quant::mul_rn(quant::i2f((v[j] >> 4) - 8), d);
        }
    }
    template <typename M = quant::gmem2>
    static __device__ __forceinline__ void load(const unsigned char *row, int nb, int ch, int L, quant::qraw &r) {
        const int k = load_q8<q4_0, M>(row, nb, ch, L, r);
        r.u[2] = M::u16(plane_h<q4_0>(row, nb, k));
    }
    static __device__ __forceinline__ void decode(const quant::qraw &r, int, float (&v)[16], float (&d)[2],
                                                  float (&m)[2]) {
        quant::nibbles16<8>(r.u[0], r.u[1], v);
        d[0] = d[1] = quant::f16_bits(r.u[2]);
        m[0] = m[1] = 0.0f;
    }
    static __device__ __forceinline__ void scales(const quant::qraw &r, int, float (&d)[2], float (&m)[2]) {
        d[0] = d[1] = quant::f16_bits(r.u[2]);
        m[0] = m[1] = 0.0f;
    }
    static __device__ __forceinline__ void idot(const quant::qraw &r, const int (&xw)[4], const int (&xs)[2],
                                                int (&is)[2]) {
        /* low nibbles: run 0 (values 8 h ..), high: run 1 (16 + 8 h ..); q - 8 as - 8 sum(x q) */
        const int lo0 = (int)(r.u[0] & 0x0F0F0F0Fu), lo1 = (int)(r.u[1] & 0x0F0F0F0Fu);
        const int hi0 = (int)((r.u[0] >> 4) & 0x0F0F0F0Fu), hi1 = (int)((r.u[1] >> 4) & 0x0F0F0F0Fu);
        is[0] = quant::dp4a(lo1, xw[1], quant::dp4a(lo0, xw[0], -8 * xs[0]));
        is[1] = quant::dp4a(hi1, xw[3], quant::dp4a(hi0, xw[2], -8 * xs[1]));
    }
};

/// block_q4_1: f16 d, f16 m; 16 bytes of 4-bit q; w = q d + m. GEMV lane as Q4_0's.
struct q4_1 : nib32_lanes {
    static constexpr int kQK = 32, kBytes = 20, kP0 = 16, kRun1 = 16;
    static constexpr bool kMin = true, kNibScaled = true, kI8 = false;
    static __device__ __forceinline__ void unit(const unsigned char *row, int nb, int k, int, float (&w)[32]) {
        unsigned char v[16];
        quant::ld_bytes4<16>(plane_q<q4_1>(row, nb, k), v);
        const unsigned char *h = plane_h<q4_1>(row, nb, k);
        const float d = quant::f16_bits(quant::ld_u16(h));
        const float m = quant::f16_bits(quant::ld_u16(h + 2));
#pragma unroll
        for (int j = 0; j < 16; j++) {
            w[j] = quant::add_rn(quant::mul_rn(quant::i2f(v[j] & 0x0F), d), m);
            w[j + 16] = quant::add_rn(quant::mul_rn(quant::i2f(v[j] >> 4), d), m);
        }
    }
    template <typename M = quant::gmem2>
    static __device__ __forceinline__ void load(const unsigned char *row, int nb, int ch, int L, quant::qraw &r) {
        const int k = load_q8<q4_1, M>(row, nb, ch, L, r);
        r.u[2] = M::u32(plane_h<q4_1>(row, nb, k));
    }
    static __device__ __forceinline__ void decode(const quant::qraw &r, int, float (&v)[16], float (&d)[2],
                                                  float (&m)[2]) {
        quant::nibbles16<0>(r.u[0], r.u[1], v);
        d[0] = d[1] = quant::f16_bits(r.u[2] & 0xffffu);
        m[0] = m[1] = quant::f16_bits(r.u[2] >> 16);
    }
};

/// block_q5_0: f16 d; u32 qh (the 5th bits); 16 bytes of low nibbles; w = (q - 16) d. GEMV lane as
/// Q4_0's (values j = 8 h + k and j + 16: qh bits j and j + 16).
struct q5_0 : nib32_lanes {
    static constexpr int kQK = 32, kBytes = 22, kP0 = 16, kRun1 = 16;
    static constexpr bool kMin = false, kNibScaled = false, kI8 = false;
    static __device__ __forceinline__ void unit(const unsigned char *row, int nb, int k, int, float (&w)[32]) {
        unsigned char v[16];
        quant::ld_bytes2<16>(plane_q<q5_0>(row, nb, k), v);
        const unsigned char *h = plane_h<q5_0>(row, nb, k);
        const float d = quant::f16_bits(quant::ld_u16(h));
        const unsigned qh = quant::ld_u32_a2(h + 2);
#pragma unroll
        for (int j = 0; j < 16; j++) {
            const int xh0 = (int)(((qh >> j) << 4) & 0x10u);
            const int xh1 = (int)((qh >> (j + 12)) & 0x10u);
            w[j] = quant::mul_rn(quant::i2f(((v[j] & 0x0F) | xh0) - 16), d);
            w[j + 16] = quant::mul_rn(quant::i2f(((v[j] >> 4) | xh1) - 16), d);
        }
    }
    template <typename M = quant::gmem2>
    static __device__ __forceinline__ void load(const unsigned char *row, int nb, int ch, int L, quant::qraw &r) {
        const int k = load_q8<q5_0, M>(row, nb, ch, L, r);
        const unsigned char *h = plane_h<q5_0>(row, nb, k);
        r.u[2] = M::u16(h + 2) | (M::u16(h + 4) << 16);
        r.u[3] = M::u16(h);
    }
    static __device__ __forceinline__ void decode(const quant::qraw &r, int L, float (&v)[16], float (&d)[2],
                                                  float (&m)[2]) {
        const unsigned qh = r.u[2] >> (8 * (L & 1));
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const unsigned q = quant::byte8(r.u[0], r.u[1], k);
            v[k] = quant::as_float(0x4B000000u | (q & 0x0Fu) | (((qh >> k) & 1u) << 4)) - (8388608.0f + 16.0f);
            v[8 + k] = quant::as_float(0x4B000000u | (q >> 4) | (((qh >> (k + 16)) & 1u) << 4)) - (8388608.0f + 16.0f);
        }
        d[0] = d[1] = quant::f16_bits(r.u[3]);
        m[0] = m[1] = 0.0f;
    }
};

/// block_q8_0: f16 d; 32 int8 q; w = q d. GEMV lane: unit L / 2, values 16 (L % 2) .. + 16 (two
/// runs of 8: kRun1 8), each byte placed into the mantissa of 2^23 by one byte permute.
struct q8_0 {
    static constexpr int kQK = 32, kBytes = 34, kP0 = 32, kRun1 = 8, kXLanes = 2;
    static constexpr bool kMin = false, kNibScaled = false, kI8 = true, kXOneBlock = true, kWide = false;
    static __device__ __forceinline__ void unit(const unsigned char *row, int nb, int k, int, float (&w)[32]) {
        unsigned char v[32];
        quant::ld_bytes2<32>(plane_q<q8_0>(row, nb, k), v);
        const float d = quant::f16_bits(quant::ld_u16(plane_h<q8_0>(row, nb, k)));
#pragma unroll
        for (int j = 0; j < 32; j++)
            w[j] = quant::mul_rn(quant::i2f((signed char)v[j]), d);
    }
    static __device__ __forceinline__ int run0(int L) { return 32 * (L >> 1) + 16 * (L & 1); }
    static __device__ __forceinline__ bool lane_ok(int ch, int L, int in) { return (16 * ch + (L >> 1)) * 32 < in; }
    template <typename M = quant::gmem2>
    static __device__ __forceinline__ void load(const unsigned char *row, int nb, int ch, int L, quant::qraw &r) {
        const int k = 16 * ch + (L >> 1);
        const uint4 q = M::u128(plane_q<q8_0>(row, nb, k) + 16 * (L & 1));
        r.u[0] = q.x, r.u[1] = q.y, r.u[2] = q.z, r.u[3] = q.w;
        r.u[4] = M::u16(plane_h<q8_0>(row, nb, k));
    }
    static __device__ __forceinline__ void decode(const quant::qraw &r, int, float (&v)[16], float (&d)[2],
                                                  float (&m)[2]) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            /* int8 -> its value + 128 (flip the sign bit), then byte n into the low mantissa byte */
            const unsigned w = r.u[i] ^ 0x80808080u;
#pragma unroll
            for (int n = 0; n < 4; n++)
                v[4 * i + n] = quant::as_float(quant::byte_perm(w, 0x4B000000u, 0x7540u | (unsigned)n)) -
                               (8388608.0f + 128.0f);
        }
        d[0] = d[1] = quant::f16_bits(r.u[4]);
        m[0] = m[1] = 0.0f;
    }
    static __device__ __forceinline__ void scales(const quant::qraw &r, int, float (&d)[2], float (&m)[2]) {
        d[0] = d[1] = quant::f16_bits(r.u[4]);
        m[0] = m[1] = 0.0f;
    }
    static __device__ __forceinline__ void idot(const quant::qraw &r, const int (&xw)[4], const int (&)[2],
                                                int (&is)[2]) {
        is[0] = quant::dp4a((int)r.u[1], xw[1], quant::dp4a((int)r.u[0], xw[0], 0));
        is[1] = quant::dp4a((int)r.u[3], xw[3], quant::dp4a((int)r.u[2], xw[2], 0));
    }
};

/// block_q4_K: f16 d, f16 dmin, 12 bytes of 6-bit scales/mins, 128 bytes of 4-bit q; sub-block s
/// (of 8) uses the low (s even) or high nibbles of qs[32 (s / 2) ..]; w = d sc q - dmin m.
/// GEMV lane: super-block L / 16 of the chunk's two, qs bytes 32 k + j0 .. + 8 (k = L / 4 % 4,
/// j0 = 8 (L % 4)): their low nibbles are sub-block 2 k's values j0 .., the high ones 2 k + 1's.
struct q4_k {
    static constexpr int kQK = 256, kBytes = 144, kP0 = 144, kRun1 = 32, kWRun1 = 32, kXLanes = 2;
    static constexpr bool kMin = true, kNibScaled = true, kI8 = true, kXOneBlock = false, kWide = true;
    static __device__ __forceinline__ void unit(const unsigned char *row, int nb, int k, int s, float (&w)[32]) {
        const unsigned char *b = plane_q<q4_k>(row, nb, k);
        unsigned char h[16], q[32];
        quant::ld_bytes16<16>(b, h);
        quant::ld_bytes16<32>(b + 16 + 32 * (s >> 1), q);
        float d1, m1;
        quant::scale_min_k(h, s, d1, m1);
        const int shift = (s & 1) * 4;
#pragma unroll
        for (int l = 0; l < 32; l++)
            w[l] = quant::sub_rn(quant::mul_rn(d1, quant::i2f((q[l] >> shift) & 0xF)), m1);
    }
    static __device__ __forceinline__ int run0(int L) { return 256 * (L >> 4) + 64 * ((L >> 2) & 3) + 8 * (L & 3); }
    static __device__ __forceinline__ bool lane_ok(int ch, int L, int in) { return (2 * ch + (L >> 4)) * 256 < in; }
    template <typename M = quant::gmem2>
    static __device__ __forceinline__ void load(const unsigned char *row, int nb, int ch, int L, quant::qraw &r) {
        const unsigned char *b = plane_q<q4_k>(row, nb, 2 * ch + (L >> 4));
        const uint4 h = M::u128(b);
        const uint2 q = M::u64(b + 16 + 32 * ((L >> 2) & 3) + 8 * (L & 3));
        r.u[0] = h.x, r.u[1] = h.y, r.u[2] = h.z, r.u[3] = h.w, r.u[4] = q.x, r.u[5] = q.y;
    }
    static __device__ __forceinline__ void decode(const quant::qraw &r, int L, float (&v)[16], float (&d)[2],
                                                  float (&m)[2]) {
        const int k = (L >> 2) & 3;
        quant::nibbles16<0>(r.u[4], r.u[5], v);
        quant::pair_scales_k(r, k, d, m);
    }
    /* integer GEMV: lane L of chunk ch takes super-block 4 ch + L / 8, pair k = L / 2 % 4 and quant
     * bytes 32 k + 16 (L % 2) .. + 16 (low nibbles: sub-block 2 k's values 16 (L % 2) .., run 0;
     * high: 2 k + 1's, run 1), with the super-block's 16-byte header */
    static __device__ __forceinline__ int wrun0(int L) { return 256 * (L >> 3) + 64 * ((L >> 1) & 3) + 16 * (L & 1); }
    static __device__ __forceinline__ bool wlane_ok(int ch, int L, int in) { return (4 * ch + (L >> 3)) * 256 < in; }
    template <typename M = quant::gmem2>
    static __device__ __forceinline__ void wload(const unsigned char *row, int nb, int ch, int L, quant::qraw &r) {
        const unsigned char *b = plane_q<q4_k>(row, nb, 4 * ch + (L >> 3));
        const uint4 h = M::u128(b), q = M::u128(b + 16 + 32 * ((L >> 1) & 3) + 16 * (L & 1));
        r.u[0] = h.x, r.u[1] = h.y, r.u[2] = h.z, r.u[3] = h.w;
        r.u[4] = q.x, r.u[5] = q.y, r.u[6] = q.z, r.u[7] = q.w;
    }
    /* the 6-bit scales and mins of sub-blocks 2 k, 2 k + 1 (ggml get_scale_min_k4), four sub-blocks
     * per word at once: j < 4 from bytes 0..3 / 4..7 of the 12, j >= 4 from the low / high nibbles
     * of bytes 8..11 and the top two bits of bytes 0..3 / 4..7 */
    static __device__ __forceinline__ void wscales(const quant::qraw &r, int L, float (&d)[2], float (&m)[2]) {
        const int k = (L >> 1) & 3;
        const unsigned y = r.u[1], z = r.u[2], w = r.u[3];
        const unsigned sc = k < 2 ? (y & 0x3F3F3F3Fu) : ((w & 0x0F0F0F0Fu) | ((y >> 2) & 0x30303030u));
        const unsigned mn = k < 2 ? (z & 0x3F3F3F3Fu) : (((w >> 4) & 0x0F0F0F0Fu) | ((z >> 2) & 0x30303030u));
        const float dd = quant::f16_bits(r.u[0] & 0xffffu), dm = quant::f16_bits(r.u[0] >> 16);
#pragma unroll
        for (int j = 0; j < 2; j++) {
            /* byte 2 (k % 2) + j into the mantissa of 2^23: exact small-integer floats */
            const unsigned sel = 0x7540u | (unsigned)(2 * (k & 1) + j);
            const float s = quant::as_float(quant::byte_perm(sc, 0x4B000000u, sel)) - 8388608.0f;
            const float n = quant::as_float(quant::byte_perm(mn, 0x4B000000u, sel)) - 8388608.0f;
            d[j] = quant::mul_rn(dd, s);
            m[j] = -quant::mul_rn(dm, n);
        }
    }
    static __device__ __forceinline__ void widot(const quant::qraw &r, const int (&xw)[8], const int (&)[2],
                                                 int (&is)[2]) {
        int a = 0, b = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            a = quant::dp4a((int)(r.u[4 + i] & 0x0F0F0F0Fu), xw[i], a);
            b = quant::dp4a((int)((r.u[4 + i] >> 4) & 0x0F0F0F0Fu), xw[4 + i], b);
        }
        is[0] = a;
        is[1] = b;
    }
};

/// block_q5_K: as Q4_K plus 32 bytes qh (bit 2 (s / 2) + (s & 1) of qh[l] is value l's 5th bit).
/// GEMV lane as Q4_K's (qh bytes j0 .. + 8, bits 2 k and 2 k + 1).
struct q5_k {
    static constexpr int kQK = 256, kBytes = 176, kP0 = 176, kRun1 = 32;
    static constexpr bool kMin = true, kNibScaled = false, kI8 = false;
    static __device__ __forceinline__ void unit(const unsigned char *row, int nb, int k, int s, float (&w)[32]) {
        const unsigned char *b = plane_q<q5_k>(row, nb, k);
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
            w[l] = quant::sub_rn(quant::mul_rn(d1, quant::i2f(qv)), m1);
        }
    }
    static __device__ __forceinline__ int run0(int L) { return 256 * (L >> 4) + 64 * ((L >> 2) & 3) + 8 * (L & 3); }
    static __device__ __forceinline__ bool lane_ok(int ch, int L, int in) { return (2 * ch + (L >> 4)) * 256 < in; }
    template <typename M = quant::gmem2>
    static __device__ __forceinline__ void load(const unsigned char *row, int nb, int ch, int L, quant::qraw &r) {
        const unsigned char *b = plane_q<q5_k>(row, nb, 2 * ch + (L >> 4));
        const int k = (L >> 2) & 3, j0 = 8 * (L & 3);
        const uint4 h = M::u128(b);
        const uint2 ql = M::u64(b + 48 + 32 * k + j0), qh = M::u64(b + 16 + j0);
        r.u[0] = h.x, r.u[1] = h.y, r.u[2] = h.z, r.u[3] = h.w;
        r.u[4] = ql.x, r.u[5] = ql.y, r.u[6] = qh.x, r.u[7] = qh.y;
    }
    static __device__ __forceinline__ void decode(const quant::qraw &r, int L, float (&v)[16], float (&d)[2],
                                                  float (&m)[2]) {
        const int k = (L >> 2) & 3;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const unsigned ql = quant::byte8(r.u[4], r.u[5], i), qh = quant::byte8(r.u[6], r.u[7], i);
            v[i] = quant::as_float(0x4B000000u | (ql & 0x0Fu) | (((qh >> (2 * k)) & 1u) << 4)) - 8388608.0f;
            v[8 + i] = quant::as_float(0x4B000000u | (ql >> 4) | (((qh >> (2 * k + 1)) & 1u) << 4)) - 8388608.0f;
        }
        quant::pair_scales_k(r, k, d, m);
    }
};

/// block_q6_K: 128 bytes ql (low 4 bits), 64 bytes qh (high 2 bits), 16 int8 scales, f16 d; value
/// 128 n + 32 k + l (sub-block s = 4 n + k) = d sc[8 n + 2 k + l / 16] (q - 32).
/// GEMV lane: super-block L / 16, n = L / 8 % 2, k' = L / 4 % 2, l0 = 8 (L % 4): ql bytes
/// 64 n + 32 k' + l0 .. + 8 (low nibbles: k = k', high: k = k' + 2) and qh bytes 32 n + l0 .. + 8.
struct q6_k {
    static constexpr int kQK = 256, kBytes = 210, kP0 = 208, kRun1 = 64;
    static constexpr bool kMin = false, kNibScaled = false, kI8 = false;
    static __device__ __forceinline__ void unit(const unsigned char *row, int nb, int blk, int s, float (&w)[32]) {
        const unsigned char *b = plane_q<q6_k>(row, nb, blk);
        const int n = s >> 2, k = s & 3;
        unsigned char ql[32], qh[32], scb[2], db[2];
        quant::ld_bytes2<32>(b + 64 * n + 32 * (k & 1), ql);
        quant::ld_bytes2<32>(b + 128 + 32 * n, qh);
        quant::ld_bytes2<2>(b + 192 + 8 * n + 2 * k, scb);
        quant::ld_bytes2<2>(plane_h<q6_k>(row, nb, blk), db);
        const float d = quant::f16_bits((unsigned)db[0] | ((unsigned)db[1] << 8));
        const float ds0 = quant::mul_rn(d, quant::i2f((signed char)scb[0]));
        const float ds1 = quant::mul_rn(d, quant::i2f((signed char)scb[1]));
        const int lshift = (k >> 1) * 4, hshift = 2 * k;
#pragma unroll
        for (int l = 0; l < 32; l++) {
            const int qv = (((ql[l] >> lshift) & 0xF) | (((qh[l] >> hshift) & 3) << 4)) - 32;
            w[l] = quant::mul_rn(l < 16 ? ds0 : ds1, quant::i2f(qv));
        }
    }
    static __device__ __forceinline__ int run0(int L) {
        return 256 * (L >> 4) + 128 * ((L >> 3) & 1) + 32 * ((L >> 2) & 1) + 8 * (L & 3);
    }
    static __device__ __forceinline__ bool lane_ok(int ch, int L, int in) { return (2 * ch + (L >> 4)) * 256 < in; }
    template <typename M = quant::gmem2>
    static __device__ __forceinline__ void load(const unsigned char *row, int nb, int ch, int L, quant::qraw &r) {
        const int sb = 2 * ch + (L >> 4);
        const unsigned char *b = plane_q<q6_k>(row, nb, sb);
        const int n = (L >> 3) & 1, kp = (L >> 2) & 1, l0 = 8 * (L & 3);
        const uint2 ql = M::u64(b + 64 * n + 32 * kp + l0), qh = M::u64(b + 128 + 32 * n + l0);
        r.u[0] = ql.x;
        r.u[1] = ql.y;
        r.u[2] = qh.x;
        r.u[3] = qh.y;
        /* scales sc[8 n + 2 k + l0 / 16] for k = k' and k' + 2: the 16-bit words at 192 + 8 n + 2 k'
         * and 4 bytes on (the byte l0 / 16 of each) */
        r.u[4] = M::u16(b + 192 + 8 * n + 2 * kp);
        r.u[5] = M::u16(b + 192 + 8 * n + 2 * kp + 4);
        r.u[6] = M::u16(plane_h<q6_k>(row, nb, sb));
    }
    static __device__ __forceinline__ void decode(const quant::qraw &r, int L, float (&v)[16], float (&d)[2],
                                                  float (&m)[2]) {
        const int kp = (L >> 2) & 1, sh = 8 * ((L & 3) >> 1);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const unsigned ql = quant::byte8(r.u[0], r.u[1], i), qh = quant::byte8(r.u[2], r.u[3], i);
            v[i] = quant::as_float(0x4B000000u | (ql & 0x0Fu) | (((qh >> (2 * kp)) & 3u) << 4)) - (8388608.0f + 32.0f);
            v[8 + i] = quant::as_float(0x4B000000u | (ql >> 4) | (((qh >> (2 * kp + 4)) & 3u) << 4)) -
                       (8388608.0f + 32.0f);
        }
        const float dd = quant::f16_bits(r.u[6]);
        d[0] = quant::mul_rn(dd, quant::i2f((signed char)((r.u[4] >> sh) & 0xffu)));
        d[1] = quant::mul_rn(dd, quant::i2f((signed char)((r.u[5] >> sh) & 0xffu)));
        m[0] = m[1] = 0.0f;
    }
};

/// One GEMV lane's values of one row (the block comment above): Q::load, then Q::decode.
template <typename Q>
__device__ __forceinline__ void qlane(const unsigned char *row, int nb, int ch, int L, float (&v)[16], float (&d)[2],
                                      float (&m)[2]) {
    quant::qraw r;
    Q::load(row, nb, ch, L, r);
    Q::decode(r, L, v, d, m);
}

/// Whether Q is an integer-GEMV type with 16-value lanes (kI8 and not kWide: Q4_0, Q8_0), whose GEMV
/// reads x quantized beforehand (common/q8x.cuh) above MS_QGEMV_I8_MAX_COLS x rows and in its
/// ms_qgemv_q_* entries. False for
/// the types without kI8 (they have no kWide).
template <typename Q, bool I8 = Q::kI8> struct i8_narrow {
    static constexpr bool value = false;
};
template <typename Q> struct i8_narrow<Q, true> {
    static constexpr bool value = !Q::kWide;
};

/// The integer GEMV's lane shape of type Q ("The integer GEMV" above): V values a lane in two
/// runs of V / 2 (at run0(L) and run0(L) + kRun1 of a chunk of 32 V values), ok(ch, L, in), the
/// load and the exact run dots.
template <typename Q, bool W = Q::kWide> struct i8_lanes;
template <typename Q> struct i8_lanes<Q, false> {
    static constexpr int V = 16, kRun1 = Q::kRun1;
    static __device__ __forceinline__ int run0(int L) { return Q::run0(L); }
    static __device__ __forceinline__ bool ok(int ch, int L, int in) { return Q::lane_ok(ch, L, in); }
    template <typename M>
    static __device__ __forceinline__ void load(const unsigned char *row, int nb, int ch, int L, quant::qraw &r) {
        Q::template load<M>(row, nb, ch, L, r);
    }
    static __device__ __forceinline__ void scales(const quant::qraw &r, int L, float (&d)[2], float (&m)[2]) {
        Q::scales(r, L, d, m);
    }
    static __device__ __forceinline__ void idot(const quant::qraw &r, const int (&xw)[4], const int (&xs)[2],
                                                int (&is)[2]) {
        Q::idot(r, xw, xs, is);
    }
};
template <typename Q> struct i8_lanes<Q, true> {
    static constexpr int V = 32, kRun1 = Q::kWRun1;
    static __device__ __forceinline__ int run0(int L) { return Q::wrun0(L); }
    static __device__ __forceinline__ bool ok(int ch, int L, int in) { return Q::wlane_ok(ch, L, in); }
    template <typename M>
    static __device__ __forceinline__ void load(const unsigned char *row, int nb, int ch, int L, quant::qraw &r) {
        Q::template wload<M>(row, nb, ch, L, r);
    }
    static __device__ __forceinline__ void scales(const quant::qraw &r, int L, float (&d)[2], float (&m)[2]) {
        Q::wscales(r, L, d, m);
    }
    static __device__ __forceinline__ void idot(const quant::qraw &r, const int (&xw)[8], const int (&xs)[2],
                                                int (&is)[2]) {
        Q::widot(r, xw, xs, is);
    }
};

} // namespace ms
