/*
 * smem.cuh - staging tiles in shared memory for the tensor-core loops (sm_80+): cp.async copies
 * global -> shared without passing through registers (so a tile's load overlaps the compute on
 * the one before), and ldmatrix reads mma.m16n8k16 B fragments (common/mma.cuh) of 8x8 16-bit
 * blocks in one instruction per four fragments registers.
 *
 * PTX ISA: "cp.async" (cp-size 16 with .cg; src-size 0 fills the 16 bytes with zeros, no global
 * read), "cp.async.commit_group", "cp.async.wait_group"; "ldmatrix" (.x2 / .x4, .trans).
 * Addresses passed as `unsigned` are shared-state-space addresses (smem_addr()).
 *
 * ldmatrix fragment mapping: lanes 8i .. 8i + 7 give the row addresses (16 bytes each, 16-byte
 * aligned) of 8x8 matrix i; each thread receives, of matrix i, register i holding row lane / 4,
 * columns 2 (lane % 4) and 2 (lane % 4) + 1 (the B fragment of mma when rows are n and columns k);
 * with .trans it receives rows 2 (lane % 4), 2 (lane % 4) + 1 of column lane / 4 instead (the B
 * fragment when rows are k and columns n).
 */
#pragma once

namespace ms {

/* Shared-state-space address of a __shared__ object. */
__device__ __forceinline__ unsigned smem_addr(const void *p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

/* Copy 16 bytes global -> shared, asynchronously; `valid` false writes 16 zero bytes and reads
   nothing (src must still be a valid generic address). */
__device__ __forceinline__ void cp_async16(unsigned dst, const void *src, bool valid) {
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n)
                 : "memory");
}
/* Close the group of cp.async issued since the last commit. */
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
/* Wait for every committed group of this thread (a __syncthreads() after it publishes the tile). */
__device__ __forceinline__ void cp_async_wait_all() {
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

__device__ __forceinline__ void ldmatrix_x4(unsigned addr, unsigned &r0, unsigned &r1,
                                            unsigned &r2, unsigned &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2(unsigned addr, unsigned &r0, unsigned &r1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r0), "=r"(r1)
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned addr, unsigned &r0, unsigned &r1,
                                                  unsigned &r2, unsigned &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}

} // namespace ms
