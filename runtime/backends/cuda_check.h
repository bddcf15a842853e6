/*
 * cuda_check.h - check macros for every CUDA runtime, NVRTC and cuBLAS call (CONVENTIONS.md item 4).
 *
 * On failure the *_TRY macros record, through ms_error, the stringified call, the function,
 * file:line, the current device and the library's own error string, then return an ms_status from
 * the enclosing function. The *_CHECK variants abort instead: only for teardown and "cannot
 * happen" paths. The record goes to an explicit `err` argument (the caller's ms_error *, may be
 * NULL) rather than a variable captured by name, so every use shows where the detail goes.
 *
 * There is no MS_CU_TRY: the project does not link the driver library (cudart is static and loads
 * it lazily, so binaries start on machines without a GPU); modules are loaded through cudart's
 * cudaLibrary* calls instead of cuModule*.
 *
 * Usage:
 *     MS_CUDA_TRY(err, cudaMalloc(&p, bytes));
 *     MS_NVRTC_TRY(err, nvrtcGetCUBINSize(prog, &size));
 *     MS_CUBLAS_TRY(err, cublasCreate(&h));
 */
#ifndef MS_CUDA_CHECK_H
#define MS_CUDA_CHECK_H

#include "ms_base.h"

#ifdef MS_HAVE_CUDA
/* The toolkit headers test undefined macros (__cplusplus, _MSC_VER) in #if. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wundef"
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nvrtc.h>
#pragma GCC diagnostic pop
#endif

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Record a failed library call in err and return `code`: "<lib> error <num> (<text>) in <call>
 * [device N] at file:line (func)". device < 0 omits the device (NVRTC runs without one).
 */
ms_status ms_cuda_record_failure(ms_error *err, ms_status code, const char *lib, int num,
                                 const char *text, const char *call, int device, const char *file,
                                 int line, const char *func);

/* Current device, or -1 when none can be queried (used in failure records only). */
int ms_cuda_current_device(void);

/*
 * Generic form: evaluate expr once; if it differs from ok, record it (to_str(result) gives the
 * library's text) under status code and return that code.
 */
#define MS_CUDA_TRY_GEN(err, code, lib, expr, ok, to_str, device)                              \
    do {                                                                                       \
        __typeof__(expr) ms_cuda_res_ = (expr);                                                \
        if (ms_cuda_res_ != (ok))                                                              \
            return ms_cuda_record_failure((err), (code), (lib), (int)ms_cuda_res_,             \
                                          to_str(ms_cuda_res_), #expr, (device), __FILE__,     \
                                          __LINE__, __func__);                                 \
    } while (0)

/* Abort variant of MS_CUDA_TRY_GEN (teardown / cannot-happen paths). */
#define MS_CUDA_CHECK_GEN(lib, expr, ok, to_str)                                               \
    do {                                                                                       \
        __typeof__(expr) ms_cuda_res_ = (expr);                                                \
        if (ms_cuda_res_ != (ok))                                                              \
            ms_abort(__FILE__, __LINE__, "%s error %d (%s) in %s", (lib), (int)ms_cuda_res_,   \
                     to_str(ms_cuda_res_), #expr);                                             \
    } while (0)

#ifdef MS_HAVE_CUDA
/* Text of a cuBLAS status (cublasGetStatusString exists, but this stays valid on old releases). */
const char *ms_cublas_status_str(cublasStatus_t st);

#define MS_CUDA_TRY(err, expr)                                                                 \
    MS_CUDA_TRY_GEN(err, MS_ERR_CUDA, "CUDA", expr, cudaSuccess, cudaGetErrorString,           \
                    ms_cuda_current_device())
#define MS_NVRTC_TRY(err, expr)                                                                \
    MS_CUDA_TRY_GEN(err, MS_ERR_NVRTC, "NVRTC", expr, NVRTC_SUCCESS, nvrtcGetErrorString, -1)
#define MS_CUBLAS_TRY(err, expr)                                                               \
    MS_CUDA_TRY_GEN(err, MS_ERR_CUBLAS, "cuBLAS", expr, CUBLAS_STATUS_SUCCESS,                 \
                    ms_cublas_status_str, ms_cuda_current_device())
#define MS_CUDA_CHECK(expr) MS_CUDA_CHECK_GEN("CUDA", expr, cudaSuccess, cudaGetErrorString)
#define MS_CUBLAS_CHECK(expr)                                                                  \
    MS_CUDA_CHECK_GEN("cuBLAS", expr, CUBLAS_STATUS_SUCCESS, ms_cublas_status_str)
#endif

#ifdef __cplusplus
}
#endif
#endif /* MS_CUDA_CHECK_H */
