/*
 * mma.cuh - the tensor-core instruction mma.sync.m16n8k16 (sm_80+) with float accumulators.
 *
 * Fragment layout (PTX ISA, per thread: gid = lane / 4, tig = lane % 4):
 *   A 16x16 row-major, 4 regs of 2 elements: {A[gid][2tig..+1], A[gid+8][2tig..+1],
 *                                             A[gid][2tig+8..+9], A[gid+8][2tig+8..+9]}
 *   B 16x8 (k x n), 2 regs: {B[2tig..+1][gid], B[2tig+8..+9][gid]}
 *   C/D 16x8 float, 4 regs: {C[gid][2tig], C[gid][2tig+1], C[gid+8][2tig], C[gid+8][2tig+1]}
 * The lower-indexed element of each pair sits in the low 16 bits.
 */
#pragma once

#include "common/vec.cuh"

namespace ms {

template <typename T> struct mma_m16n8k16;

template <> struct mma_m16n8k16<bf16> {
    static __device__ __forceinline__ void run(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                               unsigned b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

template <> struct mma_m16n8k16<f16> {
    static __device__ __forceinline__ void run(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                               unsigned b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

} // namespace ms
