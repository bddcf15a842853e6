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
 * (MS_QGEMV_ROWS_OF(NC)); the K dimension is split over its warps in chunks of 256 values, and in
 * a chunk each lane takes 8 consecutive values: its x loads are contiguous across the warp and
 * kept in registers for all R rows (x is read from L1/L2 once per R rows, not once per row), and
 * it dequantizes the matching 8-value slice of each row (Q::slice, bit-identical to unit). fp32
 * accumulation; partial sums reduced with warp shuffles and one shared-memory pass in a fixed
 * order (deterministic). (The first version had each thread take a whole 32-value unit: its x
 * loads strided 128 bytes across the warp and each x row was re-read for every pair of rows,
 * which held Q4_0 decode of an 8B model at 147 tok/s on the H200.)
 */
#pragma once

#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "quant/blocks.cuh"
#include "quant/qparams.h"

namespace ms {

/* ---- kernels ---- */

/// Q: block type; NC: x rows (exactly p.n); R: output rows per CTA (MS_QGEMV_ROWS_OF(NC)).
/// Grid: ceil(rows / R) CTAs of MS_QGEMV_THREADS threads.
///
/// The input features are walked in chunks of 256 values; a chunk is split K-wise over the CTA's
/// warps (warp w takes chunks w, w + NW, ...). In a chunk, lane l takes values [8 l, 8 l + 8):
/// its two float4 loads of each x row are contiguous across the warp (1 KB per row, coalesced)
/// and held in registers for the R weight rows, whose 8-value slices (Q::slice: unit l / 4 of the
/// chunk, slice l % 4; the 32-value types' block l / 4, the K-quants' sub-block l / 4) each lane
/// dequantizes and multiplies. Partial sums: warp shuffles, then one shared-memory pass over the
/// warps in a fixed order (deterministic).
template <typename Q, int NC, int R> __device__ __forceinline__ void qgemv(const ms_qmatmul_params &p) {
    static_assert(NC >= 1 && NC <= MS_QGEMV_MAX_COLS && R >= 1, "qgemv: 1..8 x rows");
    static_assert(Q::kQK == 32 || Q::kQK == 256, "qgemv: 32- or 256-value blocks");
    constexpr int NW = MS_QGEMV_THREADS / 32;
    __shared__ float red[NW][R * NC];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r0 = blockIdx.x * R;
    const int chunks = (p.in + 255) / 256;
    const unsigned char *w = static_cast<const unsigned char *>(p.w);
    const float *x = static_cast<const float *>(p.x);
    const int ul = lane >> 2, sl = lane & 3;
    float acc[R][NC];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int c = 0; c < NC; c++)
            acc[r][c] = 0.f;
    for (int ch = warp; ch < chunks; ch += NW) {
        const int v0 = ch * 256 + lane * 8;
        if (v0 < p.in) { /* the 32-value types' last chunk may be partial (in % 256 != 0) */
            float xv[NC][8];
#pragma unroll
            for (int c = 0; c < NC; c++) {
                const float4 *xp = reinterpret_cast<const float4 *>(x + (size_t)c * (size_t)p.x_stride + (size_t)v0);
                const float4 a = __ldg(xp), b = __ldg(xp + 1);
                xv[c][0] = a.x, xv[c][1] = a.y, xv[c][2] = a.z, xv[c][3] = a.w;
                xv[c][4] = b.x, xv[c][5] = b.y, xv[c][6] = b.z, xv[c][7] = b.w;
            }
            const int blk = Q::kQK == 32 ? ch * 8 + ul : ch, sub = Q::kQK == 32 ? 0 : ul;
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (r0 + r < p.rows) {
                    float wv[8];
                    Q::slice(w + (size_t)(r0 + r) * (size_t)p.row_bytes + (size_t)blk * Q::kBytes, sub, sl, wv);
#pragma unroll
                    for (int c = 0; c < NC; c++) {
                        float a = acc[r][c];
#pragma unroll
                        for (int k = 0; k < 8; k++)
                            a = fmaf(wv[k], xv[c][k], a);
                        acc[r][c] = a;
                    }
                }
            }
        }
    }
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
