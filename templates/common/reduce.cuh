/*
 * reduce.cuh - warp and block reductions (sum, max) in float.
 *
 * Block reductions use a caller-provided shared buffer of at least 32 floats and end with a
 * barrier, so the buffer can be reused right after; every thread of the block must call them.
 */
#pragma once

namespace ms {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

/* Sum over the block; the result is returned to every thread. */
__device__ __forceinline__ float block_sum(float v, float *buf) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0)
        buf[warp] = v;
    __syncthreads();
    float r = 0.f;
    for (int i = 0; i < nwarps; i++)
        r += buf[i];
    __syncthreads();
    return r;
}

/* Max over the block; the result is returned to every thread. */
__device__ __forceinline__ float block_max(float v, float *buf) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0)
        buf[warp] = v;
    __syncthreads();
    float r = buf[0];
    for (int i = 1; i < nwarps; i++)
        r = fmaxf(r, buf[i]);
    __syncthreads();
    return r;
}

/* Integer sum over the block (counts). */
__device__ __forceinline__ int block_sum_int(int v, int *buf) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, off);
    __syncthreads();
    if (lane == 0)
        buf[warp] = v;
    __syncthreads();
    int r = 0;
    for (int i = 0; i < nwarps; i++)
        r += buf[i];
    __syncthreads();
    return r;
}

} // namespace ms
