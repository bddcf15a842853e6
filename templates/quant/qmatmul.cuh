/*
 * qmatmul.cuh - matmuls over weights kept in ggml's quantized block layout (quant/qparams.h):
 * the decode GEMV y = x W^T for 1..8 rows of x, and the dequantization of W into bf16 that the
 * prefill path feeds to the tensor-core GEMM, and the embedding gather from a quantized table.
 *
 * The block types and their 32-value units are in quant/blocks.cuh (bit-exact with ggml's
 * dequantize_row_*, checked on the host by tests/test_quant_blocks.cpp), so qdequant_bf16 gives
 * bf16(dequantize_row_*) exactly.
 *
 * GEMV (ms_qgemv_<NC>): one CTA of MS_QGEMV_THREADS threads computes MS_QGEMV_ROWS output rows
 * (the wide entries ms_qgemv_16 / _32: one row for up to 16 / 32 x rows, so a block is read once
 * per step however many rows the batch has);
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
#include "quant/blocks.cuh"
#include "quant/qparams.h"

namespace ms {

/* ---- kernels ---- */

/// Q: block type; NC: the most x rows (p.n <= NC: rows past p.n are skipped); R: output rows per
/// CTA (MS_QGEMV_ROWS for the narrow entries, 1 for the wide ones, whose accumulators take the
/// registers). Grid: ceil(rows / R) CTAs of MS_QGEMV_THREADS threads.
template <typename Q, int NC, int R> __device__ __forceinline__ void qgemv(const ms_qmatmul_params &p) {
    static_assert(NC >= 1 && NC <= MS_QGEMV_WIDE_COLS && R >= 1, "qgemv: 1..32 x rows");
    constexpr int U = Q::kQK / 32, NW = MS_QGEMV_THREADS / 32;
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
            if (NC > MS_QGEMV_MAX_COLS && c >= p.n) /* wide entries: up to NC rows; narrow: exactly NC */
                break;
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
        if (r0 + r < p.rows && (NC <= MS_QGEMV_MAX_COLS || c < p.n))
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
