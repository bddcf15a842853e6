/*
 * qmatmul.cuh - matmuls over weights kept in ggml's quantized block layout (quant/qparams.h):
 * the decode GEMV y = x W^T for 1..8 rows of x, and the dequantization of W into bf16 that the
 * prefill path feeds to the tensor-core GEMM, and the embedding gather from a quantized table.
 *
 * The block types and their 32-value units are in quant/blocks.cuh (bit-exact with ggml's
 * dequantize_row_*, checked on the host by tests/test_quant_blocks.cpp), so qdequant_bf16 gives
 * bf16(dequantize_row_*) exactly.
 *
 * GEMV (ms_qgemv_<NC>, NC = 1..8 x rows; more rows take the dequantize + tensor-core GEMM
 * path of backend_cuda_quant.c): one CTA of MS_QGEMV_THREADS threads computes R output rows
 * (MS_QGEMV_ROWS_OF(NC)); the K dimension is split over its warps in chunks of 512 values, and in
 * a chunk each lane takes 16 values, two runs of 8 (Q::run0, Q::kRun1: the values one group of
 * its weight bytes holds, e.g. the low and high nibbles of 8 Q4_0 bytes). Its x loads (float4)
 * are kept in registers for all R rows, pre-multiplied by the exact power of 2 that lets the
 * weights be read without shifts (quant::nibbles16); per row the lane turns its bytes into exact
 * small-integer floats (Q::load then Q::decode: an AND-OR and an FADD per value, no I2F, which is quarter-rate on
 * sm_90) and accumulates d * sum(q x) + m * sum(x) per run in fp32. Partial sums are reduced with
 * warp shuffles and one shared-memory pass in a fixed order (deterministic).
 *
 * The integer GEMV (Q4_0, Q8_0 and Q4_K at every width) takes x quantized per 32 values to int8, like ggml-cuda's q8_1 (common/q8x.cuh), and the
 * dot of weight and x bytes with dp4a, four products per instruction instead of an AND-OR, FADD
 * and FFMA per value: the fp32 GEMV was issue-bound (ncu, Q4_0 gate/up: issue slots 58% busy, the
 * same values per second as Q8_0 at twice the bytes). y then differs from the fp32 dot by x's
 * rounding to 8 bits (test_quant_cuda checks it against the same quantized x). Where x is
 * quantized:
 *   - in each CTA (quant_x16 for the 16-value lanes of Q4_0 and Q8_0, qgemv_dot_i8; quant_x for
 *     Q4_K's 32-value lanes, chunks of 1024, i8_lanes, blocks.cuh "The integer GEMV": a
 *     super-block header read and decoded once per 32 values) at 1-2 x rows of a float x;
 *   - before the launch (p.qx, p.qd; load_qx16, qgemv_dot_i8q; load_qx32, qgemv_dot_wideq: the
 *     same values and sums): at 3-8 rows by ms_qquant_x once per call, where quantizing in every CTA cost more
 *     than the dot saved; and at any width by the kernel that produced x (the RMSNorm before qkv
 *     and gate/up, the SiLU-and-multiply before down: backend_cuda.c), through the ms_qgemv_q_*
 *     entries at 1-2 rows, so no CTA spends instructions on it (ncu, 8B down projection at batch
 *     1: 6.05M instructions quantizing in each CTA, 3.74M reading it).
 * The other types take the fp32 dot (Q4_K did above 2 rows until its 3-8-row entries read x
 * quantized once per call: H200, 8B Q4_K decode at batch 8, docs/perf.md).
 *
 * History (Q4_0 decode of an 8B model on the H200, docs/perf.md): one 32-value unit per thread
 * (x loads strided across the warp, each x row re-read per pair of rows): 147 tok/s; 8 values
 * per lane dequantized bit-exactly (an I2F and a rounded multiply per value, then the FMA):
 * 165 tok/s, the GEMV then issue-bound on I2F (ncu: gate/up at about 0.9 TB/s); nibbles to
 * floats without I2F: 255; planar rows (8-byte loads): 260; the integer dot: 424. (Q4_K with the
 * integer dot: 285 tok/s; with its 32-value lanes: 422.)
 */
#pragma once

#include "common/pdl.cuh"
#include "common/q8x.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "quant/blocks.cuh"
#include "quant/qparams.h"

namespace ms {

/* ---- kernels ---- */

/// The lane's 16 x values of one x row's chunk (xc: the chunk's first value; runs at o0, o1),
/// multiplied by 1 / nib_scale where the type's v carry it (exact: powers of 2), and the plain sums
/// of each run (used by the types with a min).
template <typename Q>
__device__ __forceinline__ void load_x(const float *xc, int o0, int o1, float (&xs)[16], float (&xsum)[2]) {
    const float4 *a = reinterpret_cast<const float4 *>(xc + o0), *b = reinterpret_cast<const float4 *>(xc + o1);
    const float4 v0 = __ldg(a), v1 = __ldg(a + 1), v2 = __ldg(b), v3 = __ldg(b + 1);
    const float xv[16] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w,
                          v2.x, v2.y, v2.z, v2.w, v3.x, v3.y, v3.z, v3.w};
    xsum[0] = xsum[1] = 0.f;
#pragma unroll
    for (int i = 0; i < 16; i++) {
        if (Q::kMin)
            xsum[i >> 3] += xv[i];
        xs[i] = Q::kNibScaled ? xv[i] * (1.0f / quant::nib_scale(i)) : xv[i];
    }
}

/// acc + d[0] sum_k v[k] xs[k] + d[1] sum_k v[8 + k] xs[8 + k] (+ m[j] xsum[j] for the types with a
/// min): one lane's 16 values of one weight row against one x row, fp32.
template <typename Q>
__device__ __forceinline__ float dot16(const float (&v)[16], const float (&d)[2], const float (&m)[2],
                                       const float (&xs)[16], const float (&xsum)[2], float acc) {
    float t0 = 0.f, t1 = 0.f;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        t0 = fmaf(v[k], xs[k], t0);
        t1 = fmaf(v[8 + k], xs[8 + k], t1);
    }
    acc = fmaf(d[0], t0, acc);
    acc = fmaf(d[1], t1, acc);
    if (Q::kMin) {
        acc = fmaf(m[0], xsum[0], acc);
        acc = fmaf(m[1], xsum[1], acc);
    }
    return acc;
}

/// One warp chunk of 512 input values for R weight rows (rows[r]: planar rows of nb blocks, read
/// as M says; ch: the chunk) against NC x rows (xc: x row 0 at the chunk's first value, rows
/// x_stride apart): acc[r][c] += the lane's 16 products.
template <typename Q, int NC, int R, typename M>
__device__ __forceinline__ void qgemv_chunk(const unsigned char *const (&rows)[R], int nb, int ch, const float *xc,
                                            int x_stride, int lane, float (&acc)[R][NC]) {
    const int o0 = Q::run0(lane), o1 = o0 + Q::kRun1;
    /* every row's bytes first, so that all R rows' loads are in flight together */
    quant::qraw raw[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        Q::template load<M>(rows[r], nb, ch, lane, raw[r]);
    if (NC <= 2) {
        /* few x rows: x in registers (pre-scaled), each weight row decoded and used at once */
        float xs[NC][16], xsum[NC][2];
#pragma unroll
        for (int c = 0; c < NC; c++)
            load_x<Q>(xc + (size_t)c * (size_t)x_stride, o0, o1, xs[c], xsum[c]);
#pragma unroll
        for (int r = 0; r < R; r++) {
            float v[16], d[2], m[2];
            Q::decode(raw[r], lane, v, d, m);
#pragma unroll
            for (int c = 0; c < NC; c++)
                acc[r][c] = dot16<Q>(v, d, m, xs[c], xsum[c], acc[r][c]);
        }
    } else {
        /* more x rows: the R decoded rows in registers, one x row at a time (from L1/L2) */
        float v[R][16], d[R][2], m[R][2];
#pragma unroll
        for (int r = 0; r < R; r++)
            Q::decode(raw[r], lane, v[r], d[r], m[r]);
#pragma unroll
        for (int c = 0; c < NC; c++) {
            float xs[16], xsum[2];
            load_x<Q>(xc + (size_t)c * (size_t)x_stride, o0, o1, xs, xsum);
#pragma unroll
            for (int r = 0; r < R; r++)
                acc[r][c] = dot16<Q>(v[r], d[r], m[r], xs, xsum, acc[r][c]);
        }
    }
}

/* The integer GEMV in two lane shapes (blocks.cuh "The integer GEMV"): the 16-value lanes of Q4_0
 * and Q8_0 (quant_x16, qgemv_load_i8, qgemv_dot_i8) and the 32-value lanes of Q4_K (quant_x,
 * qgemv_load_wide, qgemv_dot_wide). They are kept apart, not one template over V: the generic form
 * compiled Q8_0's 16-value GEMV 12% slower (H200, bench_kernels qgemv, same lease, reproduced) with
 * the same instruction count, so the 16-value code stays as it was measured. */

/// The lane's 16 x values of one x row's chunk (runs at o0, o1, as load_x) quantized for the
/// integer GEMV (blocks.cuh, "The integer GEMV"): per 32-value x block, dx = amax / 127 and
/// q = rint(x fl(127 / amax)) (ties to even; 0 where amax < MS_QGEMV_I8_MIN_AMAX; ggml-cuda's q8_1
/// rounds x / d half away from zero instead), amax reduced over the Q::kXLanes lanes that share the
/// block (every lane of the warp calls this; !ok lanes give zeros). xw: the run's q as int8 words,
/// xs: their sums. rint by the magic constant 1.5 2^23: the float's low byte is q's two's
/// complement, so four q pack into a word with three byte permutes.
template <typename Q>
__device__ __forceinline__ void quant_x16(const float *xc, int o0, int o1, bool ok, int (&xw)[4], float (&dx)[2],
                                          int (&xs)[2]) {
    float xv[16];
    if (ok) {
        const float4 *a = reinterpret_cast<const float4 *>(xc + o0), *b = reinterpret_cast<const float4 *>(xc + o1);
        const float4 v0 = __ldg(a), v1 = __ldg(a + 1), v2 = __ldg(b), v3 = __ldg(b + 1);
        const float t[16] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w,
                             v2.x, v2.y, v2.z, v2.w, v3.x, v3.y, v3.z, v3.w};
#pragma unroll
        for (int i = 0; i < 16; i++)
            xv[i] = t[i];
    } else {
#pragma unroll
        for (int i = 0; i < 16; i++)
            xv[i] = 0.f;
    }
    float am[2] = {0.f, 0.f};
    bool nan = false; /* fmaxf drops NaN: the lane's scale carries it instead, so y is NaN as fp32's
                         (an inf in x gives NaN too, where the fp32 dot gives inf) */
#pragma unroll
    for (int i = 0; i < 16; i++) {
        am[i >> 3] = fmaxf(am[i >> 3], fabsf(xv[i]));
        nan |= xv[i] != xv[i];
    }
    if (Q::kXOneBlock)
        am[0] = am[1] = fmaxf(am[0], am[1]);
#pragma unroll
    for (int o = 1; o < Q::kXLanes; o <<= 1)
#pragma unroll
        for (int j = 0; j < 2; j++)
            am[j] = fmaxf(am[j], __shfl_xor_sync(0xffffffffu, am[j], o));
#pragma unroll
    for (int j = 0; j < 2; j++) {
        dx[j] = am[j] / 127.0f;
        const float id = am[j] >= MS_QGEMV_I8_MIN_AMAX ? 127.0f / am[j] : 0.f;
        unsigned b[8];
#pragma unroll
        for (int k = 0; k < 8; k++)
            b[k] = __float_as_uint(fmaf(xv[8 * j + k], id, 12582912.0f));
        xw[2 * j] = (int)__byte_perm(__byte_perm(b[0], b[1], 0x0040u), __byte_perm(b[2], b[3], 0x0040u), 0x5410u);
        xw[2 * j + 1] = (int)__byte_perm(__byte_perm(b[4], b[5], 0x0040u), __byte_perm(b[6], b[7], 0x0040u), 0x5410u);
        xs[j] = quant::dp4a(xw[2 * j + 1], 0x01010101, quant::dp4a(xw[2 * j], 0x01010101, 0));
        if (nan)
            dx[j] = __int_as_float(0x7fffffff);
    }
}

/// The R rows' bytes and scales of the lane's share of chunk ch (zeros for !ok lanes), for
/// qgemv_dot_i8. (Issuing them a chunk ahead of their use, software pipelined, was measured and
/// dropped: the doubled registers cost more resident warps than the overlap bought; docs/perf.md)
template <typename Q, int R, typename M>
__device__ __forceinline__ void qgemv_load_i8(const unsigned char *const (&rows)[R], int nb, int ch, int lane, bool ok,
                                              quant::qraw (&raw)[R]) {
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (ok) {
            Q::template load<M>(rows[r], nb, ch, lane, raw[r]);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++)
                raw[r].u[i] = 0u;
        }
    }
}

/// The integer dot of the 16-value types on the R rows' loaded bytes (qgemv_load_i8): per x row c
/// its quantized values from xq(c, o0, o1, xw, dx, xs) (quant_x16 in the CTA, or load_qx16 from
/// ms_qquant_x's output: the same values) and per weight row the runs' exact integer dots (Q::idot:
/// dp4a), scaled once per run: acc += dx (d is + m xs).
template <typename Q, int NC, int R, typename XQ>
__device__ __forceinline__ void qgemv_dot_i8_with(const quant::qraw (&raw)[R], int lane, const XQ &xq,
                                                  float (&acc)[R][NC]) {
    const int o0 = Q::run0(lane), o1 = o0 + Q::kRun1;
    /* the scales once per row (not per x row) */
    float d[R][2], m[R][2];
#pragma unroll
    for (int r = 0; r < R; r++)
        Q::scales(raw[r], lane, d[r], m[r]);
#pragma unroll
    for (int c = 0; c < NC; c++) {
        int xw[4], xs[2];
        float dx[2];
        xq(c, o0, o1, xw, dx, xs);
#pragma unroll
        for (int r = 0; r < R; r++) {
            int is[2];
            Q::idot(raw[r], xw, xs, is);
            float a = acc[r][c];
            if (Q::kXOneBlock && !Q::kMin) {
                a = fmaf(d[r][0] * dx[0], (float)(is[0] + is[1]), a);
            } else {
#pragma unroll
                for (int j = 0; j < 2; j++)
                    a = fmaf(dx[j], fmaf(d[r][j], (float)is[j], m[r][j] * (float)xs[j]), a);
            }
            acc[r][c] = a;
        }
    }
}

/// qgemv_chunk for the kI8 types at up to MS_QGEMV_I8_MAX_COLS x rows: qgemv_dot_i8_with on x
/// quantized in the CTA (quant_x16). ok: the lane's values lie in the row (the lanes outside still
/// take part in quant_x16's shuffles, with zeros).
template <typename Q, int NC, int R>
__device__ __forceinline__ void qgemv_dot_i8(const quant::qraw (&raw)[R], const float *xc, int x_stride, int lane,
                                             bool ok, float (&acc)[R][NC]) {
    qgemv_dot_i8_with<Q, NC, R>(
        raw, lane,
        [&](int c, int o0, int o1, int (&xw)[4], float (&dx)[2], int (&xs)[2]) {
            quant_x16<Q>(xc + (size_t)c * (size_t)x_stride, o0, o1, ok, xw, dx, xs);
        },
        acc);
}

/// The lane's 16 x values of one x row's chunk in the common/q8x.cuh layout (qx: the chunk's int8
/// values, qd: its scales per 32 values; written by ms_qquant_x or by the kernel that produced x):
/// the xw, xs and dx quant_x16 computes from the same x, bit for bit (the same amax, scale and
/// rounding, once per launch instead of per CTA), except that a NaN makes its whole block's dx NaN
/// where quant_x16 marks only the lane that holds it (y's row is NaN either way). !ok lanes: zeros.
template <typename Q>
__device__ __forceinline__ void load_qx16(const signed char *qx, const float *qd, int o0, int o1, bool ok,
                                          int (&xw)[4], float (&dx)[2], int (&xs)[2]) {
    if (ok) {
        const uint2 a = __ldg(reinterpret_cast<const uint2 *>(qx + o0));
        const uint2 b = __ldg(reinterpret_cast<const uint2 *>(qx + o1));
        xw[0] = (int)a.x;
        xw[1] = (int)a.y;
        xw[2] = (int)b.x;
        xw[3] = (int)b.y;
        dx[0] = __ldg(qd + o0 / 32);
        dx[1] = Q::kXOneBlock ? dx[0] : __ldg(qd + o1 / 32);
    } else {
        xw[0] = xw[1] = xw[2] = xw[3] = 0;
        dx[0] = dx[1] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < 2; j++)
        xs[j] = quant::dp4a(xw[2 * j + 1], 0x01010101, quant::dp4a(xw[2 * j], 0x01010101, 0));
}

/// qgemv_dot_i8 with x quantized beforehand (the 16-value types above MS_QGEMV_I8_MAX_COLS x rows,
/// and at any width in the PREQ entries): the same sums in the same order, the x words loaded
/// (load_qx16) instead of computed.
template <typename Q, int NC, int R>
__device__ __forceinline__ void qgemv_dot_i8q(const quant::qraw (&raw)[R], const signed char *qx, const float *qd,
                                              int qx_stride, int qd_stride, int lane, bool ok, float (&acc)[R][NC]) {
    qgemv_dot_i8_with<Q, NC, R>(
        raw, lane,
        [&](int c, int o0, int o1, int (&xw)[4], float (&dx)[2], int (&xs)[2]) {
            load_qx16<Q>(qx + (size_t)c * (size_t)qx_stride, qd + (size_t)c * (size_t)qd_stride, o0, o1, ok, xw,
                         dx, xs);
        },
        acc);
}

/// The lane's V x values of one x row's chunk (two runs of V / 2 at o0, o1: i8_lanes) quantized for
/// the integer GEMV: per 32-value x block, dx = amax / 127 and q = rint(x fl(127 / amax)) (ties to
/// even; 0 where amax < MS_QGEMV_I8_MIN_AMAX; ggml-cuda's q8_1 rounds x / d half away from zero
/// instead), amax reduced over the Q::kXLanes lanes that share the block (every lane of the warp
/// calls this; !ok lanes give zeros). xw: run j's q as int8 words xw[j V / 8 ..], xs: their sums.
/// rint by the magic constant 1.5 2^23: the float's low byte is q's two's complement, so four q
/// pack into a word with three byte permutes.
template <typename Q, int V>
__device__ __forceinline__ void quant_x(const float *xc, int o0, int o1, bool ok, int (&xw)[V / 4], float (&dx)[2],
                                        int (&xs)[2]) {
    constexpr int H = V / 2; /* values a run */
    float xv[V];
    if (ok) {
        const float4 *a = reinterpret_cast<const float4 *>(xc + o0), *b = reinterpret_cast<const float4 *>(xc + o1);
#pragma unroll
        for (int i = 0; i < H / 4; i++) {
            const float4 u = __ldg(a + i), v = __ldg(b + i);
            xv[4 * i] = u.x, xv[4 * i + 1] = u.y, xv[4 * i + 2] = u.z, xv[4 * i + 3] = u.w;
            xv[H + 4 * i] = v.x, xv[H + 4 * i + 1] = v.y, xv[H + 4 * i + 2] = v.z, xv[H + 4 * i + 3] = v.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < V; i++)
            xv[i] = 0.f;
    }
    float am[2] = {0.f, 0.f};
    bool nan = false; /* fmaxf drops NaN: the lane's scale carries it instead, so y is NaN as fp32's
                         (an inf in x gives NaN too, where the fp32 dot gives inf) */
#pragma unroll
    for (int i = 0; i < V; i++) {
        am[i / H] = fmaxf(am[i / H], fabsf(xv[i]));
        nan |= xv[i] != xv[i];
    }
    if (Q::kXOneBlock)
        am[0] = am[1] = fmaxf(am[0], am[1]);
#pragma unroll
    for (int o = 1; o < Q::kXLanes; o <<= 1)
#pragma unroll
        for (int j = 0; j < 2; j++)
            am[j] = fmaxf(am[j], __shfl_xor_sync(0xffffffffu, am[j], o));
#pragma unroll
    for (int j = 0; j < 2; j++) {
        dx[j] = am[j] / 127.0f;
        const float id = am[j] >= MS_QGEMV_I8_MIN_AMAX ? 127.0f / am[j] : 0.f;
        int s = 0;
#pragma unroll
        for (int w = 0; w < H / 4; w++) {
            unsigned b[4];
#pragma unroll
            for (int k = 0; k < 4; k++)
                b[k] = __float_as_uint(fmaf(xv[H * j + 4 * w + k], id, 12582912.0f));
            xw[(H / 4) * j + w] =
                (int)__byte_perm(__byte_perm(b[0], b[1], 0x0040u), __byte_perm(b[2], b[3], 0x0040u), 0x5410u);
            s = quant::dp4a(xw[(H / 4) * j + w], 0x01010101, s);
        }
        xs[j] = s;
        if (nan)
            dx[j] = __int_as_float(0x7fffffff);
    }
}

/// qgemv_load_i8 for the wide-lane types (i8_lanes<Q>: 32 values a lane, chunks of 1024): the R
/// rows' (rows[0 .. R - 1]) bytes and scales of the lane's share of chunk ch (zeros for !ok lanes).
template <typename Q, int R, typename M>
__device__ __forceinline__ void qgemv_load_wide(const unsigned char *const *rows, int nb, int ch, int lane, bool ok,
                                              quant::qraw (&raw)[R]) {
#pragma unroll
    for (int r = 0; r < R; r++) {
        if (ok) {
            i8_lanes<Q>::template load<M>(rows[r], nb, ch, lane, raw[r]);
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++)
                raw[r].u[i] = 0u;
        }
    }
}

/// The integer dot of the wide-lane types on the R rows' loaded bytes (qgemv_load_wide), one
/// 1024-value chunk: per x row c its quantized values from xq(c, o0, o1, xw, dx, xs) (quant_x in
/// the CTA, or load_qx32 from x quantized beforehand: the same values) and per weight row the runs'
/// exact integer dots (dp4a), scaled once per run: acc[r][c] += dx (d is + m xs) for r < R.
template <typename Q, int NC, int R, typename XQ>
__device__ __forceinline__ void qgemv_dot_wide_with(const quant::qraw (&raw)[R], int lane, const XQ &xq,
                                                    float (*acc)[NC]) {
    using I = i8_lanes<Q>;
    const int o0 = I::run0(lane), o1 = o0 + I::kRun1;
    /* the scales once per row (not per x row) */
    float d[R][2], m[R][2];
#pragma unroll
    for (int r = 0; r < R; r++)
        I::scales(raw[r], lane, d[r], m[r]);
#pragma unroll
    for (int c = 0; c < NC; c++) {
        int xw[I::V / 4], xs[2];
        float dx[2];
        xq(c, o0, o1, xw, dx, xs);
#pragma unroll
        for (int r = 0; r < R; r++) {
            int is[2];
            I::idot(raw[r], xw, xs, is);
            float a = acc[r][c];
            if (Q::kXOneBlock && !Q::kMin) {
                a = fmaf(d[r][0] * dx[0], (float)(is[0] + is[1]), a);
            } else {
#pragma unroll
                for (int j = 0; j < 2; j++)
                    a = fmaf(dx[j], fmaf(d[r][j], (float)is[j], m[r][j] * (float)xs[j]), a);
            }
            acc[r][c] = a;
        }
    }
}

/// qgemv_dot_i8 for the wide-lane types at up to MS_QGEMV_I8_MAX_COLS x rows: qgemv_dot_wide_with
/// on x quantized in the CTA (quant_x). ok: the lane's values lie in the row (the lanes outside
/// still take part in quant_x's shuffles, with zeros).
template <typename Q, int NC, int R>
__device__ __forceinline__ void qgemv_dot_wide(const quant::qraw (&raw)[R], const float *xc, int x_stride, int lane,
                                             bool ok, float (*acc)[NC]) {
    using I = i8_lanes<Q>;
    qgemv_dot_wide_with<Q, NC, R>(
        raw, lane,
        [&](int c, int o0, int o1, int (&xw)[I::V / 4], float (&dx)[2], int (&xs)[2]) {
            quant_x<Q, I::V>(xc + (size_t)c * (size_t)x_stride, o0, o1, ok, xw, dx, xs);
        },
        acc);
}

/// The lane's 32 x values (two runs of 16 at o0, o1, each its own 32-value x block) in the
/// common/q8x.cuh layout: the xw, dx and xs quant_x<Q, 32> computes from the same x (a NaN marks
/// its whole block's dx, where quant_x marks the lanes holding it). !ok lanes: zeros.
__device__ __forceinline__ void load_qx32(const signed char *qx, const float *qd, int o0, int o1, bool ok,
                                          int (&xw)[8], float (&dx)[2], int (&xs)[2]) {
    if (ok) {
        const uint4 a = __ldg(reinterpret_cast<const uint4 *>(qx + o0));
        const uint4 b = __ldg(reinterpret_cast<const uint4 *>(qx + o1));
        xw[0] = (int)a.x, xw[1] = (int)a.y, xw[2] = (int)a.z, xw[3] = (int)a.w;
        xw[4] = (int)b.x, xw[5] = (int)b.y, xw[6] = (int)b.z, xw[7] = (int)b.w;
        dx[0] = __ldg(qd + o0 / 32);
        dx[1] = __ldg(qd + o1 / 32);
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++)
            xw[i] = 0;
        dx[0] = dx[1] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < 2; j++) {
        int s = 0;
#pragma unroll
        for (int w = 0; w < 4; w++)
            s = quant::dp4a(xw[4 * j + w], 0x01010101, s);
        xs[j] = s;
    }
}

/// qgemv_dot_wide with x quantized beforehand (the wide-lane types above MS_QGEMV_I8_MAX_COLS x
/// rows, and in the PREQ entries): the same sums in the same order, the x words loaded.
template <typename Q, int NC, int R>
__device__ __forceinline__ void qgemv_dot_wideq(const quant::qraw (&raw)[R], const signed char *qx, const float *qd,
                                                int qx_stride, int qd_stride, int lane, bool ok, float (*acc)[NC]) {
    static_assert(i8_lanes<Q>::V == 32, "qgemv_dot_wideq: 32-value lanes");
    qgemv_dot_wide_with<Q, NC, R>(
        raw, lane,
        [&](int c, int o0, int o1, int (&xw)[8], float (&dx)[2], int (&xs)[2]) {
            load_qx32(qx + (size_t)c * (size_t)qx_stride, qd + (size_t)c * (size_t)qd_stride, o0, o1, ok, xw, dx,
                      xs);
        },
        acc);
}

/// How a GEMV entry stores its sums (linear_add's residual add: y's old value + the sum).
/// kQStoreSet: y = v; kQStoreAdd: y += v (the ms_qgemv_acc_<NC> entries); kQStoreRuntime: as
/// p.acc says (the entries above MS_QGEMV_ACC_COLS x rows). The decode sizes get entries of
/// their own per store, so that ms_qgemv_1 / _2 compile exactly as before the add existed (the
/// same SASS): with the add a run-time choice, the read of y reshaped Q4_K's chunk loop (a spill,
/// a branch around its x loads, or, stored out of line, a loop 5% slower: 8B Q4_K batch 1 at
/// 406-411 tok/s, 428 with these entries; docs/perf.md, eleventh and twelfth sessions).
enum { kQStoreSet = 0, kQStoreAdd = 1, kQStoreRuntime = 2 };

/// The CTA's sums of rows [r0, r0 + R) into y (stored as ST says, kQStore*; rows past p.rows
/// are not stored), and acc zeroed:
/// warp shuffles, then one pass over red in warp order (deterministic). Contains a __syncthreads;
/// red may be written again only after another.
template <int NC, int R, int NW, int ST>
__device__ __forceinline__ void qgemv_store(float (&acc)[R][NC], float (&red)[NW][R * NC], int r0,
                                            const ms_qmatmul_params &p) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const float v = warp_sum(acc[r][c]);
            if (lane == 0)
                red[warp][r * NC + c] = v;
            acc[r][c] = 0.f;
        }
    __syncthreads();
    if (threadIdx.x < R * NC) {
        const int r = threadIdx.x / NC, c = threadIdx.x % NC;
        float v = 0.f;
#pragma unroll
        for (int i = 0; i < NW; i++)
            v += red[i][threadIdx.x];
        float *yp = static_cast<float *>(p.y) + (size_t)c * (size_t)p.y_stride + (size_t)(r0 + r);
        if (r0 + r < p.rows) {
            if constexpr (ST == kQStoreSet)
                *yp = v;
            else if constexpr (ST == kQStoreAdd)
                *yp += v;
            else
                *yp = p.acc ? *yp + v : v;
        }
    }
}

/// Q: block type; NC: x rows (exactly p.n); R: output rows per CTA (MS_QGEMV_ROWS_OF(NC)); PREQ:
/// the integer types (kI8) read x quantized beforehand (p.qx, p.qd) at 1 ..
/// MS_QGEMV_I8_MAX_COLS rows too, where otherwise each CTA quantizes the float x (above, they
/// always read it quantized). Grid: ceil(rows / R) CTAs of MS_QGEMV_THREADS threads; warp w takes chunks w, w + NW, ... of
/// 512 input values (1024 in the integer GEMV of the wide-lane types); the rows past p.rows of the last CTA read the last row and store nothing.
template <typename Q, int NC, int R, typename M, int ST, bool PREQ>
__device__ __forceinline__ void qgemv_plain(const ms_qmatmul_params &p) {
    constexpr int NW = MS_QGEMV_THREADS / 32;
    __shared__ float red[NW][R * NC];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r0 = blockIdx.x * R;
    const int chunks = (p.in + 511) / 512;
    const unsigned char *w = static_cast<const unsigned char *>(p.w);
    const float *x = static_cast<const float *>(p.x);
    const unsigned char *rows[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        rows[r] = w + (size_t)(r0 + r < p.rows ? r0 + r : p.rows - 1) * (size_t)p.row_bytes;
    float acc[R][NC];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int c = 0; c < NC; c++)
            acc[r][c] = 0.f;
    const int nb = p.in / Q::kQK;
    if constexpr (Q::kI8 && NC <= MS_QGEMV_I8_MAX_COLS && !PREQ) {
        if constexpr (!Q::kWide) {
            /* 16-value lanes, 512-value chunks */
            for (int ch = warp; ch < chunks; ch += NW) {
                const bool ok = Q::lane_ok(ch, lane, p.in);
                quant::qraw raw[R];
                qgemv_load_i8<Q, R, M>(rows, nb, ch, lane, ok, raw);
                qgemv_dot_i8<Q, NC, R>(raw, x + (size_t)ch * 512, p.x_stride, lane, ok, acc);
            }
        } else {
            /* 32-value lanes, 1024-value chunks; the bytes of RG rows in flight together: all R at
             * one x row, R / 2 at a time at two, each group quantizing x again (8 rows of 8 words
             * and two x rows spilled under the 128 registers of 4 CTAs per SM) */
            using I = i8_lanes<Q>;
            constexpr int RG = NC > 1 ? R / 2 : R;
            static_assert(R % RG == 0, "qgemv: row groups");
            const int wchunks = (p.in + 32 * I::V - 1) / (32 * I::V);
            for (int ch = warp; ch < wchunks; ch += NW) {
                const bool ok = I::ok(ch, lane, p.in);
#pragma unroll
                for (int g = 0; g < R; g += RG) {
                    quant::qraw raw[RG];
                    qgemv_load_wide<Q, RG, M>(rows + g, nb, ch, lane, ok, raw);
                    qgemv_dot_wide<Q, NC, RG>(raw, x + (size_t)ch * (32 * I::V), p.x_stride, lane, ok, acc + g);
                }
            }
        }
    } else if constexpr (i8_narrow<Q>::value) {
        /* more x rows, or PREQ, 16-value integer types: x quantized before the launch (p.qx, p.qd:
         * ms_qquant_x, or the kernel that produced x: common/q8x.cuh), so the CTAs share it
         * instead of each quantizing every x row again */
        const signed char *qx = static_cast<const signed char *>(p.qx);
        const float *qd = static_cast<const float *>(p.qd);
        for (int ch = warp; ch < chunks; ch += NW) {
            const bool ok = Q::lane_ok(ch, lane, p.in);
            quant::qraw raw[R];
            qgemv_load_i8<Q, R, M>(rows, nb, ch, lane, ok, raw);
            qgemv_dot_i8q<Q, NC, R>(raw, qx + (size_t)ch * 512, qd + (size_t)ch * 16, p.qx_stride, p.qd_stride,
                                    lane, ok, acc);
        }
    } else if constexpr (Q::kI8) {
        /* more x rows, or PREQ, the wide-lane integer types (Q4_K): x quantized before the launch,
         * 32-value lanes, 1024-value chunks; all R rows' bytes in flight together, or R / 2 at a
         * time at 8 rows a CTA and two x rows (as the in-CTA form) and above 4 x rows (all 4 took
         * 249-255 registers at 7-8 x rows) */
        static_assert(Q::kWide, "qgemv: the wide-lane branch");
        using I = i8_lanes<Q>;
        constexpr int RG = (NC > 1 && R > 4) || NC > 4 ? R / 2 : R;
        static_assert(R % RG == 0, "qgemv: row groups");
        const signed char *qx = static_cast<const signed char *>(p.qx);
        const float *qd = static_cast<const float *>(p.qd);
        const int wchunks = (p.in + 32 * I::V - 1) / (32 * I::V);
        for (int ch = warp; ch < wchunks; ch += NW) {
            const bool ok = I::ok(ch, lane, p.in);
#pragma unroll
            for (int g = 0; g < R; g += RG) {
                quant::qraw raw[RG];
                qgemv_load_wide<Q, RG, M>(rows + g, nb, ch, lane, ok, raw);
                qgemv_dot_wideq<Q, NC, RG>(raw, qx + (size_t)ch * (32 * I::V), qd + (size_t)ch * I::V, p.qx_stride,
                                           p.qd_stride, lane, ok, acc + g);
            }
        }
    } else {
        for (int ch = warp; ch < chunks; ch += NW) {
            if (!Q::lane_ok(ch, lane, p.in))
                continue;
            qgemv_chunk<Q, NC, R, M>(rows, nb, ch, x + (size_t)ch * 512, p.x_stride, lane, acc);
        }
    }
    qgemv_store<NC, R, NW, ST>(acc, red, r0, p);
}

/// Resident CTAs per SM an ms_qgemv_<NC> entry is compiled for (__launch_bounds__'s second
/// argument): 4 for the integer entries (Q4_K's took 152 registers, 3 CTAs per SM; 4 caps them at
/// 128, where ptxas spills nothing), otherwise 1 (no cap: the fp32 entries of the K-quants spill
/// under any cap that adds a CTA).
template <typename Q, int NC> struct qgemv_min_ctas {
    static constexpr int value = Q::kI8 && NC <= MS_QGEMV_I8_MAX_COLS ? 4 : 1;
};

/// The GEMV entry: p.wide (rows at 16-byte aligned addresses) reads the planar rows with 8- and
/// 16-byte loads, otherwise with 16-bit ones (quant::gmem16, gmem2); ST: how it stores (kQStore*);
/// PREQ: as qgemv_plain's (the ms_qgemv_q_* entries).
template <typename Q, int NC, int R, int ST = kQStoreRuntime, bool PREQ = false>
__device__ __forceinline__ void qgemv(const ms_qmatmul_params &p) {
    static_assert(NC >= 1 && NC <= MS_QGEMV_MAX_COLS && R >= 1, "qgemv: 1..8 x rows");
    static_assert(Q::kQK == 32 || Q::kQK == 256, "qgemv: 32- or 256-value blocks");
    /* PDL (common/pdl.cuh): the next kernel may launch; x and y only after the wait. (An L2
     * prefetch of the CTA's weight rows before the wait was measured and dropped: docs/perf.md) */
    pdl_launch_dependents();
    pdl_wait();
    if (p.wide)
        qgemv_plain<Q, NC, R, quant::gmem16, ST, PREQ>(p);
    else
        qgemv_plain<Q, NC, R, quant::gmem2, ST, PREQ>(p);
}

/// x [n, in] float (p.x, p.x_stride) -> int8 values p.qx and scales p.qd per 32 values
/// (common/q8x.cuh; the values and scales quant_x16 computes in the CTAs), for the GEMV of Q4_0, Q8_0
/// and Q4_K above MS_QGEMV_I8_MAX_COLS rows where no kernel before wrote x in that form.
/// MS_QQUANT_X_LANES (4) threads a block, 8 values
/// each (two float4 loads), the block's amax and NaN flag reduced over the 4 by shuffles; the
/// CTA's threads step through the grid together (every lane takes part in each shuffle).
/// MS_QDEQUANT_THREADS threads per CTA (a multiple of 4); p.in a multiple of 32.
__device__ __forceinline__ void qquant_x(const ms_qmatmul_params &p) {
    constexpr int L = MS_QQUANT_X_LANES;
    static_assert(L == 4 && MS_QDEQUANT_THREADS % 32 == 0, "qquant_x: 4 lanes a block, whole warps");
    const int nbk = p.in / 32;
    const long long total = (long long)p.n * nbk * L;
    const int sub = (int)(threadIdx.x % L);
    for (long long i0 = (long long)blockIdx.x * blockDim.x; i0 < total; i0 += (long long)gridDim.x * blockDim.x) {
        const long long idx = i0 + threadIdx.x;
        const bool ok = idx < total;
        const long long blk = idx / L;
        const int r = ok ? (int)(blk / nbk) : 0, k = ok ? (int)(blk % nbk) : 0;
        float v[8];
        if (ok) {
            const float4 *src = reinterpret_cast<const float4 *>(static_cast<const float *>(p.x) +
                                                                 (size_t)r * (size_t)p.x_stride) +
                                8 * k + 2 * sub;
            const float4 a = __ldg(src), b = __ldg(src + 1);
            v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++)
                v[i] = 0.f;
        }
        q8x_store<8>(v, ok, static_cast<signed char *>(p.qx) + (size_t)r * (size_t)p.qx_stride + 32 * (size_t)k + 8 * sub,
                     static_cast<float *>(p.qd) + (size_t)r * (size_t)p.qd_stride + k, sub);
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
        Q::unit(w + (size_t)r * (size_t)p.row_bytes, p.in / Q::kQK, u / U, u % U, v);
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
            Q::unit(w + (size_t)id * (size_t)p.row_bytes, p.in / Q::kQK, u / U, u % U, v);
        } else {
#pragma unroll
            for (int l = 0; l < 32; l++)
                v[l] = 0.f;
        }
        store_n<float, 32>(out + (size_t)u * 32, v);
    }
}

} // namespace ms
