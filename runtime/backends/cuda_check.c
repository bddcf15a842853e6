/*
 * cuda_check.c - failure records for the CUDA / NVRTC / cuBLAS check macros (cuda_check.h).
 *
 * Constraint: no allocation here, so a failure on an out-of-memory path is still reported.
 */
#include "cuda_check.h"

#include <stdio.h>

ms_status ms_cuda_record_failure(ms_error *err, ms_status code, const char *lib, int num,
                                 const char *text, const char *call, int device, const char *file,
                                 int line, const char *func) {
    char dev[32] = "";
    if (device >= 0)
        snprintf(dev, sizeof dev, " [device %d]", device);
    return ms_error_set(err, code, file, line, func, "%s error %d (%s) in %s%s at %s:%d (%s)", lib,
                        num, text != NULL ? text : "?", call, dev, file, line, func);
}

int ms_cuda_current_device(void) {
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky-free error so later calls see their own */
        return -1;
    }
    return dev;
}

const char *ms_cublas_status_str(cublasStatus_t st) {
    switch (st) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case CUBLAS_STATUS_MAPPING_ERROR: return "mapping error";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "internal error";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "license error";
    }
    return "unknown cuBLAS status";
}
