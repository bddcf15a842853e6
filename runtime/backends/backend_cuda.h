/*
 * backend_cuda.h - the CUDA backend of the op interface (backend.h). CUDA builds only
 * (MS_HAVE_CUDA).
 *
 * Numerics: activations are float32 (the same tensors as the CPU backend's, so generated code runs
 * unchanged on either); weights are bf16 (converted at load by tensor_load into bf16 buffers; f32
 * weights also work) with cuBLAS GEMMs in float32 accumulation (the activation operand is rounded
 * to bf16 first); the KV arena is bf16 or f16; attention, RoPE + KV write, norms, SiLU, embedding,
 * argmax and sampling run NVRTC-compiled template instances (templates/), compiled for the
 * device's sm_XX on first use and cached on disk (nvrtc_cache.h).
 *
 * RMSNorm over a 3-D [n, h, d] view is the per-head norm (Qwen3 q_norm / k_norm; any token
 * stride, packed heads); RoPE takes M-RoPE sections (Qwen2-VL, positions [n_sections, n]).
 * Attention takes head_dim in multiples of 16 up to 256 (decode alone: multiples of 8).
 *
 * Limits of this first version (each returns MS_ERR_UNSUPPORTED naming the case): per-head
 * RMSNorm over heads that are not packed; a bias that is not f32; silu_mul or add_rms_norm
 * operands whose rows are not uniformly strided; head_dim outside the templates' sets.
 * Workspaces (the bf16 copy of GEMM inputs, split-KV partials) grow on first use, so run one
 * eager warm-up step before capturing graphs. Sampling has sampler.h's semantics (the same id as
 * the CPU backend for the same uniform, up to float rounding at the boundaries).
 *
 * Ownership: as backend.h.
 */
#ifndef MS_BACKEND_CUDA_H
#define MS_BACKEND_CUDA_H

#include "backend.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ms_backend_cuda_options {
    int32_t device;        /* CUDA device ordinal */
    const char *cache_dir; /* cubin cache folder; NULL = $MSTAR_CACHE / ~/.cache/mstar */
} ms_backend_cuda_options;

/*
 * Make the CUDA backend on opt->device (opt NULL: device 0, default cache) into *out: a stream, a
 * cuBLAS handle, the device's arch. MS_ERR_CUDA when no device is usable (message from the
 * runtime, e.g. "no CUDA-capable device is detected"); *out is zeroed on failure.
 */
ms_status ms_backend_cuda_init(ms_backend *out, const ms_backend_cuda_options *opt, ms_error *err);

/* The backend's one stream (a cudaStream_t) for work queued beside its ops in order, e.g. the
 * NCCL all-reduce of a row-parallel layer (engine/tp.c); NULL for a zeroed backend. Borrowed. */
void *ms_backend_cuda_stream(const ms_backend *be);
/* CUDA devices visible (cudaGetDeviceCount), 0 without a driver or a GPU; never fails. */
int32_t ms_backend_cuda_device_count(void);

/*
 * True when at least one CUDA device is usable (cudaGetDeviceCount succeeds with a count > 0).
 * False without a driver or a GPU; never fails (the runtime's error is cleared). Used by the
 * engine's device "auto".
 */
bool ms_backend_cuda_available(void);

/*
 * Device copy bandwidth of be (a CUDA backend from ms_backend_cuda_init): `reps` device-to-device
 * cudaMemcpyAsync copies of `bytes` bytes (>= 1 MiB) on the backend's stream, each timed with
 * events; *gbps = read + write bytes (2 * bytes) over the median time, in GB/s (1e9 bytes/s). The
 * two buffers are allocated and freed here. Errors: MS_ERR_INVALID_ARG (bytes < 1 MiB, reps < 1),
 * MS_ERR_CUDA (allocation or copy failed; nothing left allocated), MS_ERR_OOM.
 */
ms_status ms_backend_cuda_copy_bandwidth(const ms_backend *be, size_t bytes, int32_t reps,
                                         double *gbps, ms_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MS_BACKEND_CUDA_H */
