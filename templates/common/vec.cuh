/*
 * vec.cuh - element types, conversions and 16-byte vector access for the kernel templates.
 *
 * NVRTC compiles device code only and a deployment may lack the toolkit headers, so this file
 * includes nothing: bf16 and f16 are raw 16-bit storage types converted with PTX cvt (sm_80+).
 * All arithmetic is done in float; T is only how values are stored.
 */
#pragma once

namespace ms {

/* bfloat16 storage (raw bits). */
struct bf16 {
    unsigned short x;
};
/* IEEE half storage (raw bits). */
struct f16 {
    unsigned short x;
};

__device__ __forceinline__ float to_float(bf16 v) { return __uint_as_float(((unsigned)v.x) << 16); }
__device__ __forceinline__ float to_float(f16 v) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.x));
    return f;
}
__device__ __forceinline__ float to_float(float v) { return v; }

/* Round-to-nearest-even conversion from float. */
template <typename T> __device__ __forceinline__ T from_float(float f);
template <> __device__ __forceinline__ bf16 from_float<bf16>(float f) {
    bf16 r;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.x) : "f"(f));
    return r;
}
template <> __device__ __forceinline__ f16 from_float<f16>(float f) {
    f16 r;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.x) : "f"(f));
    return r;
}
template <> __device__ __forceinline__ float from_float<float>(float f) { return f; }

/* Elements of T in one 16-byte access. */
template <typename T> struct vec_width {
    static constexpr int value = 16 / (int)sizeof(T);
};

/* 16 raw bytes viewed as N elements of T. */
template <typename T> union vec16 {
    uint4 u;
    T e[16 / sizeof(T)];
};

/* Load 16 bytes (must be 16-byte aligned) and widen to float. */
template <typename T>
__device__ __forceinline__ void load_vec(const T *p, float (&f)[16 / sizeof(T)]) {
    vec16<T> v;
    v.u = *reinterpret_cast<const uint4 *>(p);
#pragma unroll
    for (int i = 0; i < (int)(16 / sizeof(T)); i++)
        f[i] = to_float(v.e[i]);
}

/* Widen a raw 16-byte vector already in registers. */
template <typename T>
__device__ __forceinline__ void unpack_vec(uint4 u, float (&f)[16 / sizeof(T)]) {
    vec16<T> v;
    v.u = u;
#pragma unroll
    for (int i = 0; i < (int)(16 / sizeof(T)); i++)
        f[i] = to_float(v.e[i]);
}

/* Round to T and store 16 bytes (must be 16-byte aligned). */
template <typename T>
__device__ __forceinline__ void store_vec(T *p, const float (&f)[16 / sizeof(T)]) {
    vec16<T> v;
#pragma unroll
    for (int i = 0; i < (int)(16 / sizeof(T)); i++)
        v.e[i] = from_float<T>(f[i]);
    *reinterpret_cast<uint4 *>(p) = v.u;
}

/* Load N elements of T (N * sizeof(T) a multiple of 16 bytes, 16-byte aligned) as float. */
template <typename T, int N> __device__ __forceinline__ void load_n(const T *p, float (&f)[N]) {
    constexpr int W = 16 / (int)sizeof(T);
    static_assert(N % W == 0, "load_n: N elements must fill whole 16-byte chunks");
#pragma unroll
    for (int c = 0; c < N / W; c++) {
        vec16<T> v;
        v.u = reinterpret_cast<const uint4 *>(p)[c];
#pragma unroll
        for (int i = 0; i < W; i++)
            f[c * W + i] = to_float(v.e[i]);
    }
}

/* Store N floats as T (N * sizeof(T) a multiple of 16 bytes, 16-byte aligned). */
template <typename T, int N> __device__ __forceinline__ void store_n(T *p, const float (&f)[N]) {
    constexpr int W = 16 / (int)sizeof(T);
    static_assert(N % W == 0, "store_n: N elements must fill whole 16-byte chunks");
#pragma unroll
    for (int c = 0; c < N / W; c++) {
        vec16<T> v;
#pragma unroll
        for (int i = 0; i < W; i++)
            v.e[i] = from_float<T>(f[c * W + i]);
        reinterpret_cast<uint4 *>(p)[c] = v.u;
    }
}

/* Store N floats as T: 16-byte vectors when N * sizeof(T) is a multiple of 16 bytes, one 8-byte
   store when it is 8 (float rows written as 16-bit: 4 values), element by element otherwise. p is
   aligned to the access. */
template <typename T, int N> __device__ __forceinline__ void store_any(T *p, const float (&f)[N]) {
    if constexpr ((N * sizeof(T)) % 16 == 0) {
        store_n<T, N>(p, f);
    } else if constexpr (N * sizeof(T) == 8 && sizeof(T) == 2) {
        uint2 v;
        v.x = (unsigned)from_float<T>(f[0]).x | ((unsigned)from_float<T>(f[1]).x << 16);
        v.y = (unsigned)from_float<T>(f[2]).x | ((unsigned)from_float<T>(f[3]).x << 16);
        *reinterpret_cast<uint2 *>(p) = v;
    } else {
#pragma unroll
        for (int i = 0; i < N; i++)
            p[i] = from_float<T>(f[i]);
    }
}

/* Load N elements of T as floats: store_any's counterpart (16-byte vectors when N * sizeof(T) is
   a multiple of 16 bytes, one 8-byte load when it is 8 for a 16-bit type, element by element
   otherwise). p is aligned to the access. */
template <typename T, int N> __device__ __forceinline__ void load_any(const T *p, float (&f)[N]) {
    if constexpr ((N * sizeof(T)) % 16 == 0) {
        load_n<T, N>(p, f);
    } else if constexpr (N * sizeof(T) == 8 && sizeof(T) == 2) {
        const uint2 u = *reinterpret_cast<const uint2 *>(p);
        T e[4];
        e[0].x = (unsigned short)(u.x & 0xffffu);
        e[1].x = (unsigned short)(u.x >> 16);
        e[2].x = (unsigned short)(u.y & 0xffffu);
        e[3].x = (unsigned short)(u.y >> 16);
#pragma unroll
        for (int i = 0; i < 4; i++)
            f[i] = to_float(e[i]);
    } else {
#pragma unroll
        for (int i = 0; i < N; i++)
            f[i] = to_float(p[i]);
    }
}

/* Load two consecutive elements (8-byte aligned for float, 4-byte for 16-bit types). */
__device__ __forceinline__ void load2(const float *p, float &a, float &b) {
    float2 v = *reinterpret_cast<const float2 *>(p);
    a = v.x;
    b = v.y;
}
template <typename T> __device__ __forceinline__ void load2(const T *p, float &a, float &b) {
    a = to_float(p[0]);
    b = to_float(p[1]);
}
__device__ __forceinline__ void store2(float *p, float a, float b) {
    *reinterpret_cast<float2 *>(p) = make_float2(a, b);
}
template <typename T> __device__ __forceinline__ void store2(T *p, float a, float b) {
    unsigned v = (unsigned)from_float<T>(a).x | ((unsigned)from_float<T>(b).x << 16);
    *reinterpret_cast<unsigned *>(p) = v;
}

/* Two 16-bit values packed into one 32-bit register, lower index in the low half (mma operands). */
template <typename T> __device__ __forceinline__ unsigned pack2(float lo, float hi) {
    T a = from_float<T>(lo), b = from_float<T>(hi);
    return (unsigned)a.x | ((unsigned)b.x << 16);
}
__device__ __forceinline__ unsigned pack2_raw(unsigned short lo, unsigned short hi) {
    return (unsigned)lo | ((unsigned)hi << 16);
}

/* Negative infinity without <cmath>. */
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

constexpr float kLog2e = 1.4426950408889634f;

} // namespace ms
