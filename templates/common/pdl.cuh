/*
 * pdl.cuh - programmatic dependent launch (PDL, sm_90 and later): the two griddepcontrol
 * instructions every kernel of ours executes (CUDA programming guide, "Programmatic Dependent
 * Launch and Synchronization"; PTX ISA "griddepcontrol").
 *
 * On sm_90 the launchers (cuda_ops.c, backend_cuda_quant.c) may launch a kernel with
 * cudaLaunchAttributeProgrammaticStreamSerialization (cuda_ops.h ms_cuda_pdl: the decode attention
 * by default, every kernel with MS_CUDA_PDL=all), so a grid may start before the kernel ahead of
 * it in the stream has finished: as soon as every CTA of that kernel has executed
 * pdl_launch_dependents (or exited). The contract that keeps this exact: a kernel reads nothing
 * another kernel writes, and writes nothing, before its pdl_wait() (which returns once the kernels
 * it depends on have completed and their writes are visible). What it may do before: read the
 * weights (written by copies that completed before the step began), compute addresses, prefetch
 * to L2 (attn/decode.cuh does). Each kernel calls pdl_launch_dependents first, so the launch of the next kernel, its
 * prologue and its weight prefetch overlap this kernel's tail; the wait keeps the order of every
 * memory access, also transitively (kernel N + 2 waits for N + 1, which waited for N).
 *
 * Below sm_90, or when a grid was launched without the attribute, both are no-ops (the launch
 * already waited for the previous kernel).
 */
#pragma once

namespace ms {

/* Let the next kernel of the stream launch once every CTA of this grid has called this. */
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Wait until the kernels this grid depends on have completed and their writes are visible. */
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

} // namespace ms
