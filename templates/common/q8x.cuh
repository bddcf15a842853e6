/*
 * q8x.cuh - activations quantized to int8 per 32 values for the integer GEMV of the 16-value
 * quantized types (quant/qmatmul.cuh: Q4_0 and Q8_0 read x in this form, load_qx16, and Q4_K,
 * load_qx32).
 *
 * Layout (the host's, backend_cuda_quant.c qx_layout): row r's values at q + r * q_stride bytes
 * (int8, in order), its scales at d + r * d_stride floats, one per 32 values. Per 32-value block:
 * dx = amax / 127 and q = rint(x fl(127 / amax)), ties to even, by the magic constant 1.5 2^23
 * (the float's low byte is then q's two's complement, so four q pack into a word with three byte
 * permutes); q = 0 where amax < MS_QGEMV_I8_MIN_AMAX (127 / amax would overflow); dx is NaN where
 * the block holds a NaN (fmaxf drops NaN, so the flag carries it: the GEMV's row is then NaN, as
 * the fp32 dot's; an inf in x gives NaN too, where the fp32 dot gives inf). This is ggml-cuda's
 * q8_1 quantization (quantize.cu) except its rounding: ggml rounds x / d half away from zero.
 *
 * The producers write it in the same pass that computes x (norm/rmsnorm.cuh with TO = q8x_out,
 * act/silu_mul.cuh silu_mul_q8), or quant/qmatmul.cuh qquant_x from a float x. All give the same
 * bytes for the same float x.
 */
#pragma once

#include "quant/qparams.h"

namespace ms {

/// The marker output type of the producers that write x quantized (rmsnorm's TO).
struct q8x_out {};

template <typename T> struct is_q8x_out {
    static constexpr bool value = false;
};
template <> struct is_q8x_out<q8x_out> {
    static constexpr bool value = true;
};
/// The element type a producer's out pointer has: T, or signed char (the int8 values) for q8x_out.
template <typename T> struct q8x_storage {
    using type = T;
};
template <> struct q8x_storage<q8x_out> {
    using type = signed char;
};

/// One lane's V consecutive values (V = 4 or 8) of a 32-value block held by 32 / V consecutive
/// lanes of the warp (sub: this lane's place among them, 0 first), quantized as the file header
/// says: amax and the NaN flag reduced over the block's lanes by shuffles, so every lane of the
/// warp must call this (lanes with !ok pass zeros and store nothing). q: the lane's first int8
/// (V-byte aligned); d: the block's scale, stored by lane sub 0.
template <int V>
__device__ __forceinline__ void q8x_store(const float (&v)[V], bool ok, signed char *q, float *d, int sub) {
    static_assert(V == 4 || V == 8, "q8x_store: 4 or 8 values a lane");
    constexpr int L = 32 / V; /* lanes a block */
    float am = 0.f;
    bool nan = false;
#pragma unroll
    for (int i = 0; i < V; i++) {
        am = fmaxf(am, fabsf(v[i]));
        nan |= v[i] != v[i];
    }
    unsigned nanw = nan ? 1u : 0u;
#pragma unroll
    for (int o = 1; o < L; o <<= 1) {
        am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
        nanw |= __shfl_xor_sync(0xffffffffu, nanw, o);
    }
    if (!ok)
        return;
    const float id = am >= MS_QGEMV_I8_MIN_AMAX ? 127.0f / am : 0.f;
    unsigned w[V / 4];
#pragma unroll
    for (int j = 0; j < V / 4; j++) {
        unsigned b[4];
#pragma unroll
        for (int e = 0; e < 4; e++)
            b[e] = __float_as_uint(fmaf(v[4 * j + e], id, 12582912.0f));
        w[j] = __byte_perm(__byte_perm(b[0], b[1], 0x0040u), __byte_perm(b[2], b[3], 0x0040u), 0x5410u);
    }
    if constexpr (V == 8)
        *reinterpret_cast<uint2 *>(q) = make_uint2(w[0], w[1]);
    else
        *reinterpret_cast<unsigned *>(q) = w[0];
    if (sub == 0)
        *d = nanw ? __int_as_float(0x7fffffff) : am / 127.0f;
}

} // namespace ms
