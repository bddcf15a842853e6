/*
 * gemv.cuh - small-batch linear of the decode path: y[b, o] = sum_k round_T(x[b, k]) * W[o, k]
 * for n_rows <= MS_GEMV_MAX_ROWS rows of x (f32) against a bf16 / f16 weight W [out, in].
 *
 * Why: at batch 1 cuBLAS streams the small decode projections of an 8B Llama (fused QKV
 * 6144x4096, o_proj 4096x4096) at 63-77% of copy bandwidth, picks split-K with a separate reduce
 * kernel for o_proj and down_proj, and needs x converted to the weight type by an extra kernel
 * first (../shared/PERFORMANCE.md; the ncu profile in docs/perf.md, 2026-12-01). This kernel reads
 * x in f32, rounds it to T in registers (the same operand precision as the cuBLAS path, which
 * multiplies round_T(x)), accumulates in f32 and writes y once.
 *
 * Grid ceil(out / MS_GEMV_WARPS), MS_GEMV_WARPS * 32 threads: one warp per output row. Lane l
 * reads 16-byte vectors l, l + 32, ... of the weight row, MS_GEMV_UNROLL of them in flight, and
 * the matching 8 (bf16/f16) elements of each x row through the read-only cache (x is small and
 * shared by every row: it stays in L1/L2); a warp shuffle sums the lanes. Requires in % 8 == 0,
 * 16-byte aligned rows of W and x (w_stride % 8 == 0, x_stride % 4 == 0); the host falls back to
 * cuBLAS otherwise.
 */
#pragma once

#include "common/params.h"
#include "common/reduce.cuh"
#include "common/vec.cuh"

namespace ms {

/// T: weight type (bf16 or f16).
template <typename T> __device__ __forceinline__ void gemv(const ms_gemv_params &p) {
    constexpr int VEC = vec_width<T>::value; /* 8 */
    constexpr int R = MS_GEMV_MAX_ROWS;
    const int lane = threadIdx.x & 31;
    const long long o = (long long)blockIdx.x * MS_GEMV_WARPS + (threadIdx.x >> 5);
    if (o >= p.n_out)
        return; /* whole warp: o is uniform across it */
    const T *w = static_cast<const T *>(p.w) + o * p.w_stride;
    const float *x = static_cast<const float *>(p.x);
    const int nv = p.n_in / VEC;
    float acc[R];
#pragma unroll
    for (int b = 0; b < R; b++)
        acc[b] = 0.f;
    for (int v0 = lane; v0 < nv; v0 += 32 * MS_GEMV_UNROLL) {
        uint4 wv[MS_GEMV_UNROLL];
#pragma unroll
        for (int u = 0; u < MS_GEMV_UNROLL; u++) {
            const int v = v0 + u * 32;
            wv[u] = v < nv ? __ldg(reinterpret_cast<const uint4 *>(w) + v) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < MS_GEMV_UNROLL; u++) {
            const int v = v0 + u * 32;
            if (v >= nv)
                break;
            float wf[VEC];
            unpack_vec<T>(wv[u], wf);
#pragma unroll
            for (int b = 0; b < R; b++) {
                if (b >= p.n_rows)
                    break;
                const float4 *xp =
                    reinterpret_cast<const float4 *>(x + (long long)b * p.x_stride + v * VEC);
                const float4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
                const float xf[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
                for (int e = 0; e < VEC; e++)
                    acc[b] = fmaf(to_float(from_float<T>(xf[e])), wf[e], acc[b]);
            }
        }
    }
    float *y = static_cast<float *>(p.y);
#pragma unroll
    for (int b = 0; b < R; b++) {
        if (b >= p.n_rows)
            break;
        const float s = warp_sum(acc[b]);
        if (lane == 0)
            y[(long long)b * p.y_stride + o] = s;
    }
}

} // namespace ms
