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

/* ---- scratch KV: a fixed-shape paged KV keyed by batch row (code predictors) ---- */

/*
 * The code predictor of a TTS talker (../shared/reference/mstar-resource-layer.md §7.3) attends
 * only within one audio frame: its cache holds at most `positions` tokens (the code groups of a
 * frame) per batch row, is emptied when the row begins a new frame, and has no per-request
 * lifetime. ms_scratch_kv lays that cache out as the paged KV arena the attention ops already
 * read (backend.h, ms_paged_kv: element offset ((layer * n_pages + page) * 2 + kv) * page_size +
 * slot, then head, then dim) with page_size = positions and n_pages = max_rows + 1: page 0 is the
 * sink page (padding writes), batch row r owns page r + 1 in every layer for the resource's
 * lifetime. The buffer is allocated once at init (zero-filled) and never moves, so a captured
 * graph can record its address; ms_scratch_kv_plan builds the ms_kv_plan (resource.h) that
 * attn_batch_stage stages, so kv_write and attention need no scratch-specific op.
 *
 * Hazards it refuses (one-line errors naming the batch row and the counts): a row continuing a
 * frame it never began, or one another request began (the batch was recomposed mid-frame: it
 * would read that request's keys), a frame longer than `positions`, a row given twice in one
 * step, a row outside [0, max_rows), a negative span.
 * Beginning a frame empties the row (its length drops to 0 before the step's tokens are
 * written), so stale keys of the previous frame or of the row's previous request are never
 * visible: the view's length only covers slots written in the current frame.
 *
 * Ownership: ms_scratch_kv_init returns an object owned by the caller (ms_scratch_kv_free) that
 * owns the buffer; the device is borrowed and must outlive it. A plan's arrays are owned by the
 * object and valid until its next plan call.
 */
typedef struct ms_scratch_kv_config {
    ms_device *device;  /* where the buffer lives (borrowed), required */
    int32_t max_rows;   /* batch rows (>= 1) */
    int32_t layers;     /* decoder layers of the node (>= 1) */
    int32_t positions;  /* tokens per frame per row (>= 1): the page size */
    int32_t kv_heads;   /* KV heads (>= 1) */
    int32_t head_dim;   /* per head (>= 1) */
    size_t elem_bytes;  /* bytes per element: 4 (f32, CPU), 2 (bf16 / f16) */
} ms_scratch_kv_config;

/* One batch row of a step over the scratch KV. */
typedef struct ms_scratch_kv_row {
    ms_rid rid;         /* the request on the row (a frame is one request's: see the hazards) */
    int32_t row;        /* batch row, 0 .. max_rows - 1 */
    int32_t span;       /* tokens this step writes (query rows), >= 0 */
    bool begin_frame;   /* the row starts a new frame: emptied before the writes */
} ms_scratch_kv_row;

typedef struct ms_scratch_kv ms_scratch_kv;

/* Create and allocate (zero-filled) the buffer. MS_ERR_INVALID_ARG for a missing device, a
 * non-positive size or an overflowing total; device errors prefixed with the sizes. */
ms_status ms_scratch_kv_init(ms_scratch_kv **out, const ms_scratch_kv_config *cfg, ms_error *err);

/* Free the object and its buffer. NULL is a no-op. */
void ms_scratch_kv_free(ms_scratch_kv *s);

/* The buffer (device memory, fixed for the object's lifetime) and its size in bytes. */
void *ms_scratch_kv_data(const ms_scratch_kv *s);
size_t ms_scratch_kv_bytes(const ms_scratch_kv *s);

/* Pages of the arena (max_rows + 1, the sink page included) and the page owned by batch row
 * `row` (row + 1; -1 outside [0, max_rows)). */
int32_t ms_scratch_kv_pages(const ms_scratch_kv *s);
int32_t ms_scratch_kv_row_page(const ms_scratch_kv *s, int32_t row);

/* Tokens row `row` holds in its current frame (0 after a new frame begins empty; -1 outside). */
int32_t ms_scratch_kv_length(const ms_scratch_kv *s, int32_t row);

/*
 * Plan one step over rows[0 .. n) in packed order (view i = rows[i]): each row's view is its own
 * page, length = tokens held after this step's writes (counted from 0 when begin_frame),
 * to_compute = span, start 0; token j of view i is written to slot (length - span + j) of the
 * row's page. The lengths advance at ms_scratch_kv_commit (a plan that is not committed, e.g.
 * an abandoned step, changes nothing; a second plan replaces it). On error nothing changes.
 * *out points into the object's arrays (valid until the next plan).
 */
ms_status ms_scratch_kv_plan(ms_scratch_kv *s, const ms_scratch_kv_row *rows, int32_t n,
                             ms_kv_plan *out, ms_error *err);

/* Apply the last plan (the rows' lengths and frame owners). MS_ERR_INVALID_ARG when no plan is
 * pending (committed already, or none made). */
ms_status ms_scratch_kv_commit(ms_scratch_kv *s, ms_error *err);

/* Drop the pending plan, if any (the step was abandoned). */
void ms_scratch_kv_abandon(ms_scratch_kv *s);

/*
 * The step record of a scratch KV resource (ms_step_record.rec): whether the step begins a
 * frame. Through the step runner (ms_scratch_kv_build, kind MS_RESOURCE_SCRATCH) segment i of a
 * step is batch row i, its rid the row's request and its span the row's tokens; admit refuses
 * (MS_ADMIT_INVALID) more segments than max_rows or a span above positions; plan returns an
 * ms_kv_plan; commit applies it; admit_rollback drops it.
 */
typedef struct ms_scratch_kv_step {
    bool begin_frame;
} ms_scratch_kv_step;

/* Step-runner builder: config is an ms_scratch_kv_config (no dependencies). */
ms_status ms_scratch_kv_build(const void *config, const ms_resource_env *env, void **self,
                              const ms_resource_i **iface, ms_error *err);

/* The scratch KV's resource interface (kind MS_RESOURCE_SCRATCH). */
extern const ms_resource_i ms_scratch_kv_iface;

#ifdef __cplusplus
}
#endif
#endif /* MS_SCRATCH_H */
