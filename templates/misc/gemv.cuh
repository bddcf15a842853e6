/*
 * gemv.cuh - the decode GEMV over 16-bit weights (bf16 or f16, the misc module's dtype T):
 * y[c, r] = sum_i T(x[c, i]) * W[r, i] for c < n <= MS_GEMV_MAX_COLS x rows, float x in, float y
 * out (p.acc: y[c, r] += the sum, the residual add of linear_add). It replaces, at decode batch sizes, the eager path's two launches (ms_convert of x into a
 * T scratch, then cuBLAS's GEMM): x is rounded to T in registers with the same cvt.rn the convert
 * used, so the products are the same and only the summation order differs from cuBLAS's.
 *
 * Why our own: at 1..8 x rows a step reads every weight once and does almost no arithmetic, so
 * the GEMV is bound by how many weight bytes are in flight. cuBLAS reaches 29-63% of copy
 * bandwidth on an 8B model's small projections (../shared/PERFORMANCE.md) and needs the convert
 * launch before it; a step of 32 layers paid both four times a layer.
 *
 * Work split: one CTA of MS_GEMV_THREADS threads (8 warps) computes MS_GEMV_ROWS (16) output rows,
 * one m16 tile of mma.sync.m16n8k16 (common/mma.cuh) with the x rows as the n8 operand (rows past
 * n are zeros). (A CTA of two tiles, 32 rows sharing each x load, was measured and dropped: slower
 * at 1..4 x rows, docs/perf.md.) K is cut into blocks of 64 values; warp w takes blocks w, w + 8, ..., and
 * MS_GEMV_UNROLL of them at once, all their loads issued before the first mma.
 *
 * Loads and the k permutation: lane (gid, tig) = (lane / 4, lane % 4) reads, per 64-value block,
 * the 16 consecutive values [16 tig, 16 tig + 16) of weight rows gid and gid + 8 (two 16-byte
 * loads each; the four lanes of a row read one 128-byte line) and the same 16 x values of x row
 * gid. A dot product does not care in which order its k values are summed, so the block's 64
 * values are fed to the four k16 steps permuted: in step s the lane's fragment slots {2 tig,
 * 2 tig + 1} hold values 16 tig + 4 s + {0, 1} and slots {2 tig + 8, 2 tig + 9} values
 * 16 tig + 4 s + {2, 3}, for the A (weight) and the B (x) operand alike. Each of the 64 values
 * meets its own x value exactly once.
 *
 * Programmatic dependent launch (common/pdl.cuh; the launcher allows it for this entry by
 * default, cuda_ops.c): each warp prefetches its first blocks' weight lines to L2 before
 * pdl_wait, so a GEMV grid that starts during the previous kernel's tail has its first weight
 * bytes on the way when x becomes readable.
 *
 * Reduction: each warp's 16 x 8 accumulator tile goes to shared memory; thread (r, c) sums the 8
 * warps in warp order (deterministic: the same inputs give the same bits, eager or graph).
 *
 * The folded RMSNorm (p.norm_w in T, the ms_gemv_norm entry: backend_cuda.c cu_rms_norm_linear
 * at these sizes with bf16 weights, so a decode layer's norms are no launches of their own; the
 * host does not fold for f16, where x w, rounded before the rsqrt, can pass 65504): norm(x) W^T =
 * rsqrt(mean(x^2) + eps) (x * w) W^T per x row, so each lane loads the norm weights beside its x
 * values and, where it rounds x for the mma, sums their raw squares and multiplies them by the
 * weights (a first version did that right after each x load, inside the batch of loads, and ran
 * the 8B model's batch-1 decode at 177 tok/s against 210 unfolded: docs/perf.md); every CTA reads the whole x row anyway, so the sum of squares costs an FMA a
 * value and one more shared-memory reduction (four lanes, then the warps in order: every CTA gets
 * the same bits), and the rsqrt scales each output once. Against the norm kernel and then the
 * GEMV, x w is rounded to T instead of x rsqrt(..) w (rounding error of the same size, another
 * bit pattern).
 *
 * Requirements (the host checks them, backend_cuda.c cu_linear, and uses cuBLAS otherwise, and at
 * more than GEMV_MAX_N x rows, where the step ran slower with it): n in 1..MS_GEMV_MAX_COLS; in, the weight row stride and x's row stride multiples of 8, 8 and 4
 * elements with w and x 16-byte aligned; a K tail of a block is zero-filled in 8-value steps.
 */
#pragma once

#include "common/mma.cuh"
#include "common/params.h"
#include "common/pdl.cuh"
#include "common/vec.cuh"

namespace ms {

/// Two floats rounded to T (round to nearest even) in one 32-bit register, lo in the low half
/// (the mma fragment order).
template <typename T> __device__ __forceinline__ unsigned gemv_pack2(float lo, float hi);
template <> __device__ __forceinline__ unsigned gemv_pack2<bf16>(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
template <> __device__ __forceinline__ unsigned gemv_pack2<f16>(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/// 16 weight bytes, read once per step: not kept in L1 (x, which every row reads, is).
__device__ __forceinline__ uint4 gemv_load_w(const void *p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

__device__ __forceinline__ unsigned gemv_word(const uint4 &v, int i) {
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

/// The two T values of a 32-bit word as floats, lo the low half.
template <typename T> __device__ __forceinline__ void gemv_unpack2(unsigned w, float &lo, float &hi) {
    T a, b;
    a.x = (unsigned short)(w & 0xffffu);
    b.x = (unsigned short)(w >> 16);
    lo = to_float(a);
    hi = to_float(b);
}

/// T: the weight type (bf16 or f16); NORM: the folded RMSNorm (p.norm_w, the ms_gemv_norm entry).
/// Grid: ceil(rows / MS_GEMV_ROWS) CTAs of MS_GEMV_THREADS threads.
template <typename T, bool NORM = false> __device__ __forceinline__ void gemv(const ms_gemv_params &p) {
    static_assert(sizeof(T) == 2, "gemv: 16-bit weights");
    pdl_launch_dependents();
    constexpr int NW = MS_GEMV_THREADS / 32, U = MS_GEMV_UNROLL;
    static_assert(MS_GEMV_ROWS == 16 && MS_GEMV_ROWS * MS_GEMV_MAX_COLS <= MS_GEMV_THREADS,
                  "gemv: one m16 tile, one output per thread");
    __shared__ float red[NW][MS_GEMV_ROWS * MS_GEMV_MAX_COLS];
    __shared__ float ssq[NORM ? NW : 1][MS_GEMV_MAX_COLS]; /* NORM: each warp's sum of x^2 per x row */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    const int r0 = blockIdx.x * MS_GEMV_ROWS;
    /* the lane's weight rows gid and gid + 8 of the CTA's, clamped to the last row */
    const int ra = r0 + gid < p.rows ? r0 + gid : p.rows - 1;
    const int rb = r0 + gid + 8 < p.rows ? r0 + gid + 8 : p.rows - 1;
    const T *wa = static_cast<const T *>(p.w) + (size_t)ra * (size_t)p.w_stride;
    const T *wb = static_cast<const T *>(p.w) + (size_t)rb * (size_t)p.w_stride;
    const bool has_x = gid < p.n;
    const float *xr = static_cast<const float *>(p.x) + (size_t)(has_x ? gid : 0) * (size_t)p.x_stride;
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    float ss = 0.f; /* NORM: the lane's sum of x^2 over its values of x row gid */
    const int nblk = (p.in + 63) >> 6;
    /* before the PDL wait: ask L2 for the lines of the warp's first U blocks, so that a grid
       started during the previous kernel's tail (common/pdl.cuh) has them on the way when x, that
       kernel's output, becomes readable. (Register loads here were moved after the wait by
       ptxas, which may hoist griddepcontrol.wait; prefetches stay, as attn/decode.cuh's do.) */
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int k = (warp + u * NW) * 64 + 16 * tig;
#pragma unroll
        for (int h = 0; h < 2; h++)
            if (k + 8 * h < p.in) {
                asm volatile("prefetch.global.L2 [%0];" ::"l"(wa + k + 8 * h));
                asm volatile("prefetch.global.L2 [%0];" ::"l"(wb + k + 8 * h));
            }
    }
    pdl_wait();
    for (int b0 = warp; b0 < nblk; b0 += NW * U) {
        uint4 wlo[U][2], whi[U][2];
        float4 xv[U][4];
        uint4 nwr[NORM ? U : 1][2]; /* NORM: the norm weights of the lane's x values, raw T */
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int k = (b0 + u * NW) * 64 + 16 * tig;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const bool ok = k + 8 * h < p.in && b0 + u * NW < nblk;
                const uint4 z = make_uint4(0u, 0u, 0u, 0u);
                wlo[u][h] = ok ? gemv_load_w(wa + k + 8 * h) : z;
                whi[u][h] = ok ? gemv_load_w(wb + k + 8 * h) : z;
                const float4 *xp = reinterpret_cast<const float4 *>(xr + k + 8 * h);
                const float4 zf = make_float4(0.f, 0.f, 0.f, 0.f);
                xv[u][2 * h] = ok && has_x ? __ldg(xp) : zf;
                xv[u][2 * h + 1] = ok && has_x ? __ldg(xp + 1) : zf;
                if constexpr (NORM) /* the norm weights of the same 8 values, used with x below
                                       (kept in L1: every CTA reads them) */
                    nwr[u][h] = ok && has_x ? __ldg(reinterpret_cast<const uint4 *>(
                                                  static_cast<const T *>(p.norm_w) + k + 8 * h))
                                            : z;
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++)
#pragma unroll
            for (int s = 0; s < 4; s++) {
                /* step s: words 2 s, 2 s + 1 of the lane's 16 values (k 16 tig + 4 s .. + 3) */
                const uint4 &lo = wlo[u][s >> 1], &hi = whi[u][s >> 1];
                const int w0 = 2 * (s & 1);
                const unsigned a[4] = {gemv_word(lo, w0), gemv_word(hi, w0), gemv_word(lo, w0 + 1),
                                       gemv_word(hi, w0 + 1)};
                float4 xs = xv[u][s];
                if constexpr (NORM) {
                    /* the norm: the raw squares summed, x times its weight (values 4 s .. 4 s + 3
                       of the lane's 16: words 2 (s & 1), + 1 of the h = s / 2 load); here, where
                       x is consumed, so that no load of the batch above waits for x */
                    const uint4 &nv = nwr[NORM ? u : 0][s >> 1];
                    float n0, n1, n2, n3;
                    gemv_unpack2<T>(gemv_word(nv, 2 * (s & 1)), n0, n1);
                    gemv_unpack2<T>(gemv_word(nv, 2 * (s & 1) + 1), n2, n3);
                    ss = fmaf(xs.x, xs.x, ss), ss = fmaf(xs.y, xs.y, ss);
                    ss = fmaf(xs.z, xs.z, ss), ss = fmaf(xs.w, xs.w, ss);
                    xs.x *= n0, xs.y *= n1, xs.z *= n2, xs.w *= n3;
                }
                mma_m16n8k16<T>::run(d, a, gemv_pack2<T>(xs.x, xs.y), gemv_pack2<T>(xs.z, xs.w));
            }
    }
    /* C fragment: {C[gid][2 tig], C[gid][2 tig + 1], C[gid + 8][2 tig], C[gid + 8][2 tig + 1]},
       C[weight row][x row] */
    red[warp][gid * 8 + 2 * tig] = d[0];
    red[warp][gid * 8 + 2 * tig + 1] = d[1];
    red[warp][(gid + 8) * 8 + 2 * tig] = d[2];
    red[warp][(gid + 8) * 8 + 2 * tig + 1] = d[3];
    if constexpr (NORM) {
        /* x row gid's squares: the four lanes of the group, then (below) the warps in order */
        ss += __shfl_xor_sync(0xffffffffu, ss, 1);
        ss += __shfl_xor_sync(0xffffffffu, ss, 2);
        if (tig == 0)
            ssq[warp][gid] = ss;
    }
    __syncthreads();
    if (threadIdx.x < MS_GEMV_ROWS * MS_GEMV_MAX_COLS) {
        const int r = threadIdx.x >> 3, c = threadIdx.x & 7;
        float v = 0.f;
#pragma unroll
        for (int i = 0; i < NW; i++)
            v += red[i][threadIdx.x];
        if constexpr (NORM) {
            float t = 0.f;
#pragma unroll
            for (int i = 0; i < NW; i++)
                t += ssq[i][c];
            v *= rsqrtf(t / (float)p.in + p.eps);
        }
        if (c < p.n && r0 + r < p.rows) {
            /* acc: the residual add of linear_add, y's old value + the sum (the bits of the
               separate add kernel's a + b) */
            float *yp = static_cast<float *>(p.y) + (size_t)c * (size_t)p.y_stride + (size_t)(r0 + r);
            *yp = p.acc ? *yp + v : v;
        }
    }
}

} // namespace ms
