/*
 * scratch.h - scratch pool resource (kind MS_RESOURCE_SCRATCH, DESIGN.md §3 "Scratch pool"): a
 * fixed-shape buffer indexed by batch row, overwritten every outer step (code predictors of TTS
 * talkers), with no per-request lifetime. It is a resource so that a captured graph sees one
 * stable address: the buffer is allocated once at init and never moves.
 *
 * Admit refuses (MS_ADMIT_INVALID) a step with more batch rows than max_rows; plan hands out the
 * base address and row stride (ms_scratch_plan); row r lives at base + r * row_bytes.
 *
 * The buffer is device memory allocated once through the device interface (device.h; the host
 * device in tests and on CPU) and zero-filled there.
 *
 * Ownership: ms_scratch_init returns an object owned by the caller (ms_scratch_free), which also
 * owns the buffer; the device is borrowed and must outlive the resource.
 *
 * Usage:
 *     ms_scratch_config sc = {.device = dev, .max_rows = 16, .row_bytes = 2 * 16 * 8 * 128 * 2};
 *     {"code_predictor", MS_RESOURCE_SCRATCH, NULL, 0, ms_scratch_build, &sc, NULL, NULL}
 */
#ifndef MS_SCRATCH_H
#define MS_SCRATCH_H

#include "device.h"
#include "resource.h"
#include "step_runner.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Configuration. */
typedef struct ms_scratch_config {
    ms_device *device; /* where the buffer lives (borrowed), required */
    int32_t max_rows;  /* batch rows the buffer holds (>= 1) */
    size_t row_bytes;  /* bytes per row (> 0), e.g. layers * 2 * groups * heads * dim * dtype */
} ms_scratch_config;

/* Plan result. */
typedef struct ms_scratch_plan {
    void *base;        /* [max_rows * row_bytes] device memory, fixed for the resource's lifetime */
    size_t row_bytes;  /* stride between rows */
    int32_t n_rows;    /* rows of this step */
} ms_scratch_plan;

/* Opaque resource. */
typedef struct ms_scratch ms_scratch;

/* Create and allocate the buffer on cfg->device (zero-filled). MS_ERR_INVALID_ARG for a missing
 * device or bad sizes (including an overflowing max_rows * row_bytes); MS_ERR_OOM naming the
 * bytes and the knob; device errors. */
ms_status ms_scratch_init(ms_scratch **out, const ms_scratch_config *cfg, ms_error *err);

/* Free the resource and its buffer. NULL is a no-op. */
void ms_scratch_free(ms_scratch *s);

/* Device address of batch row `row` (0 <= row < max_rows), or NULL out of range. */
void *ms_scratch_row(const ms_scratch *s, int32_t row);

/* Rows the buffer holds. */
int32_t ms_scratch_max_rows(const ms_scratch *s);

/* Step-runner builder (no dependencies). */
ms_status ms_scratch_build(const void *config, const ms_resource_env *env, void **self,
                           const ms_resource_i **iface, ms_error *err);

/* The resource interface (kind MS_RESOURCE_SCRATCH). */
extern const ms_resource_i ms_scratch_iface;

#ifdef __cplusplus
}
#endif
#endif /* MS_SCRATCH_H */
