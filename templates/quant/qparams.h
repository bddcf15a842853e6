/*
 * qparams.h - the parameter struct of the quantized matmul instances (templates/quant/qmatmul.cuh),
 * shared by the host launcher (C11, backend_cuda_quant.c) and the device template (NVRTC C++).
 * Like common/params.h: only pointers and int, and this file includes nothing.
 *
 * Weights are ggml's blocks (ggml-common.h block_q4_0 ... block_q6_K, little-endian) in the planar
 * row layout (gguf_quant.h ms_ggml_rows_to_planar: each row's quant bytes, then its scales), one
 * row of `in` values per output feature: row r starts at w + r * row_bytes, row_bytes = in / QK *
 * block bytes (QK 32 for Q4_0/Q4_1/Q5_0/Q8_0, 256 for Q4_K/Q5_K/Q6_K).
 */
#ifndef MS_QPARAMS_H
#define MS_QPARAMS_H

#define MS_QGEMV_THREADS 128   /* one CTA: MS_QGEMV_ROWS_OF(nc) output rows, K split over its 4 warps */
/* output rows per CTA of ms_qgemv_<nc>: up to 2 x rows each lane keeps x in registers for all of
 * them; above, the rows' decoded values, with one x row at a time */
#define MS_QGEMV_ROWS_OF(nc) ((nc) <= 2 ? 8 : 4)
#define MS_QGEMV_MAX_COLS 8    /* x rows of the largest gemv entry (ms_qgemv_8) */
/* x rows up to which the GEMV has accumulating entries of its own (ms_qgemv_acc_<nc>: y += x W^T,
 * linear_add's residual add), so that ms_qgemv_<nc> stores without reading y; above, one entry
 * reads p.acc at run time (qmatmul.cuh kQStore*) */
#define MS_QGEMV_ACC_COLS 2
/* x rows up to which the Q4_0 / Q8_0 / Q4_K GEMV of a float x quantizes it to int8 in each CTA
 * and uses dp4a (blocks.cuh, "The integer GEMV"); above, that quantization's cost (per x row, over
 * 4 weight rows) outweighed the cheaper dot (H200, 8B decode at batch 8: Q4_0 677 tok/s against
 * 746, Q4_K 355 against 660; docs/perf.md) */
#define MS_QGEMV_I8_MAX_COLS 2
/* The integer types (Q4_0, Q8_0, Q4_K: kI8) take the dp4a dot above it too, on x quantized before
 * the launch into p.qx / p.qd (common/q8x.cuh: by ms_qquant_x, the same int8 values as the in-CTA
 * quantization, and the same scales but in a block holding a NaN), and so do their ms_qgemv_q_*
 * entries at 1 .. MS_QGEMV_I8_MAX_COLS rows (x quantized by the kernel that produced it); the
 * other types take the fp32 dot above it. MS_QGEMV_PREQ_TYPE: the ggml types (Q4_0 = 2, Q8_0 = 8,
 * Q4_K = 12; the instance static_asserts that it agrees with the block structs' kI8) */
#define MS_QGEMV_PREQ_TYPE(t) ((t) == 2 || (t) == 8 || (t) == 12)
/* an x block whose amax is below this quantizes to zeros (127 / amax would overflow to inf for
 * amax under about 3.7e-37; the values dropped are under 2^-96 each) */
#define MS_QGEMV_I8_MIN_AMAX 0x1p-96f

#define MS_QDEQUANT_THREADS 256 /* grid-stride over 32-value units */
#define MS_QQUANT_X_LANES 4     /* ms_qquant_x: threads a 32-value x block (8 values each) */

/*
 * y[c, r] = sum_i x[c, i] * W[r, i] for c < n (the gemv entries: ms_qgemv_<n> for n in 1..8), or
 * out_bf16[r, i] = bf16(W[r, i]) (ms_qdequant_bf16: the prefill path dequantizes a weight into a
 * bf16 workspace for the tensor-core GEMM). x, y float32; strides in elements.
 */
typedef struct ms_qmatmul_params {
    const void *w;   /* [rows, row_bytes] ggml blocks, 16-byte aligned base */
    const void *x;   /* [n, in] float, row stride x_stride (16-byte aligned rows) */
    void *y;         /* [n, rows] float, row stride y_stride */
    void *out_bf16;  /* dequant: [rows, in] bf16, packed rows */
    int rows;        /* output features */
    int in;          /* input features, a multiple of the block size */
    int row_bytes;   /* bytes of one weight row */
    int n;           /* x rows (gemv) */
    int x_stride;
    int y_stride;
    int wide;        /* gemv: 1 = w and row_bytes are multiples of 16 (every row 16-byte aligned): the
                        planar rows' 8- and 16-byte loads; 0 = 16-bit loads */
    int acc;         /* gemv: 1 = y += x W^T (linear_add: the residual add in the output), 0 = y =;
                        read by the entries above MS_QGEMV_ACC_COLS rows only (the narrower ones
                        store as their name says: ms_qgemv_<n> sets, ms_qgemv_acc_<n> adds) */
    void *qx;        /* MS_QGEMV_PREQ_TYPE gemv above MS_QGEMV_I8_MAX_COLS rows and ms_qgemv_q_*
                        (read), ms_qquant_x (written): x's int8 values
                        [n, in], row stride qx_stride bytes (a multiple of 16, 16-byte aligned
                        base; common/q8x.cuh) */
    void *qd;        /* the same: x's scale per 32 values, float [n, in / 32], row stride qd_stride */
    int qx_stride;
    int qd_stride;
} ms_qmatmul_params;

#endif /* MS_QPARAMS_H */
