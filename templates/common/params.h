/*
 * params.h - kernel parameter structs shared by the host (C11) and the device templates (NVRTC C++).
 *
 * Every kernel takes one of these structs by value. The layout must be identical on both sides, so
 * fields are only pointers, int and float (no stdint, no bool, no enums), and this file includes
 * nothing. Block sizes that the host launcher and the device template must agree on are macros here.
 *
 * Layout vocabulary (DESIGN.md section 2): the page arena of one layer is
 * [n_pages, 2, page_size, n_kv_heads, head_dim] (NHD, K at index 0, V at 1); the paged index
 * arrays are FlashInfer's (qo_indptr, kv_indptr, kv_indices, kv_last_page_len) plus kv_start.
 * "T" below is the instance's element type (bf16 or f16) of KV pages and weights; activations (q,
 * o, x, ...) use the instance's activation type (f32, bf16 or f16). Pointers are void * here.
 */
#ifndef MS_KERNEL_PARAMS_H
#define MS_KERNEL_PARAMS_H

/* ---- block sizes (host launcher and template must agree) ---- */

#define MS_ATTN_DECODE_THREADS 128   /* one CTA: all query heads of one KV head, one KV split */
#define MS_ATTN_DECODE_MAX_SPLITS 64 /* KV splits per request (the in-kernel merge's table) */
#define MS_ATTN_PREFILL_THREADS 128  /* 4 warps x 16 packed (token, head-in-group) rows */
#define MS_ATTN_PREFILL_ROWS 64      /* packed query rows per CTA (MS_ATTN_PREFILL_THREADS / 2) */
#define MS_ATTN_PREFILL_MIN_CTAS 3   /* __launch_bounds__ minimum resident CTAs per SM at
                                        head_dim <= 128 (168 registers, 56 bytes of spill at 128
                                        on sm_90); 1 above (256: a kilobyte of spill) */
#define MS_ROPE_KV_THREADS 128       /* per CTA; a token takes up to 64 CTAs */
#define MS_RMSNORM_THREADS 256       /* one CTA per row; per-head norm: one warp per head row */
#define MS_SILU_MUL_THREADS 256      /* grid-stride over 16-byte vectors */
#define MS_EMBED_THREADS 128         /* one CTA per token */
#define MS_ARGMAX_THREADS 512        /* one CTA per row */
#define MS_SAMPLE_THREADS 512        /* one CTA per row */
#define MS_MISC_THREADS 256          /* grid-stride elementwise helpers */
#define MS_GEMV_THREADS 256          /* 16-bit weight GEMV (misc/gemv.cuh): 8 warps split K */
#define MS_GEMV_ROWS 16              /* output rows per CTA (one mma m16 tile) */
#define MS_GEMV_MAX_COLS 8           /* x rows (the mma n8 operand) */
#define MS_GEMV_UNROLL 2             /* 64-value K blocks a warp loads before its first mma */
#define MS_ATTN_DENSE_THREADS 128    /* 4 warps, one (query row, head) each */

/* Most M-RoPE position streams of rope_kv (the host's MS_ROPE_MAX_SECTIONS, backend.h). */
#define MS_ROPE_KV_MAX_SECTIONS 4

/* ---- attention (prefill and decode share one struct) ---- */

/*
 * Paged attention over one layer. Request b has query rows [qo_indptr[b], qo_indptr[b+1]) and a
 * KV view of n_pages = kv_indptr[b+1] - kv_indptr[b] pages holding
 * length = (n_pages - 1) * page_size + kv_last_page_len[b] keys at logical positions
 * [kv_start[b], kv_start[b] + length). Its query rows are the LAST rows of the view: query i sits
 * at position kv_start[b] + length - n_q + i. Causal: a query at position P sees keys <= P;
 * window W > 0 (windowed instances only): keys > P - W, i.e. P-W+1 .. P.
 */
typedef struct ms_attn_kernel_params {
    const void *q;               /* [n_tokens, n_q_heads, head_dim] T, token row stride q_stride */
    void *o;                     /* [n_tokens, n_q_heads, head_dim] T, token row stride o_stride */
    const void *kv;              /* this layer: [n_pages_total, 2, page_size, n_kv_heads, head_dim] T */
    const int *qo_indptr;        /* [batch + 1] */
    const int *kv_indptr;        /* [batch + 1] */
    const int *kv_indices;       /* [kv_indptr[batch]] page ids */
    const int *kv_last_page_len; /* [batch], in [1, page_size] when the view has pages */
    const int *kv_start;         /* [batch] logical position of the view's first key */
    const int *tile_req;         /* prefill: [n_tiles] request of each CTA's query tile */
    const int *tile_idx;         /* prefill: [n_tiles] tile number within the request */
    float *part_o;               /* decode, n_splits > 1: [batch, n_splits, n_q_heads, head_dim] f32 */
    float *part_lse;             /* decode, n_splits > 1: [batch, n_splits, n_q_heads], log2 units */
    int *split_counter;          /* decode, n_splits > 1: [batch, n_kv_heads], all 0 before the
                                    launch and again after it (the kernel resets them) */
    int batch;                   /* requests */
    int n_q_heads;               /* = n_kv_heads * group */
    int n_kv_heads;
    int q_stride;                /* elements between consecutive tokens of q (>= n_q_heads*head_dim) */
    int o_stride;                /* elements between consecutive tokens of o */
    int n_splits;                /* decode: KV splits per request (1 = no merge pass) */
    int pages_per_split;         /* decode: least pages of a split; view b splits its own pages
                                    into n_splits parts of max(this, ceil(pages_b / n_splits)) */
    int window;                  /* windowed instances: W > 0 keys; ignored otherwise */
    float sm_scale;              /* softmax scale, usually 1/sqrt(head_dim) */
} ms_attn_kernel_params;

/* ---- RoPE fused with the KV write ---- */

/*
 * Rotates q and k in place, writes the rotated k and v into the pages (with kv == NULL: only the
 * in-place rotation; v is not read). Token t is written to slot
 * token_to_slot[t] of page token_to_page[t] at position pos[t]. The first rotary_dim dims of each
 * head rotate (pairs (i, i + rotary_dim/2) or (2i, 2i+1), i < rotary_dim/2); the rest pass.
 * Frequencies: the table inv_freq[rotary_dim / 2] when given (the host computes it once, e.g.
 * ms_rope_compute_inv_freq), else theta^(-2i/rotary_dim) then (llama3 instances) Llama 3.1
 * scaling with factor, low_freq_factor, high_freq_factor and original_max_pos. cos and sin are
 * multiplied by attn_scaling (0 means 1).
 */
typedef struct ms_rope_kv_params {
    void *q;                  /* [n_tokens, n_q_heads, head_dim] TA, row stride q_stride, in place */
    const void *k;            /* [n_tokens, n_kv_heads, head_dim] TA, row stride k_stride, rotated
                                 in place (const: the pages are the output that matters) */
    const void *v;            /* [n_tokens, n_kv_heads, head_dim] TA, row stride v_stride */
    void *kv;                 /* this layer: [n_pages_total, 2, page_size, n_kv_heads, head_dim] T */
    const int *pos;           /* [n_tokens] RoPE positions */
    const int *token_to_page; /* [n_tokens] */
    const int *token_to_slot; /* [n_tokens] in [0, page_size) */
    int n_tokens;
    int n_q_heads;
    int n_kv_heads;
    int q_stride;             /* elements between tokens of q */
    int k_stride;             /* elements between tokens of k */
    int v_stride;             /* elements between tokens of v */
    float theta;              /* RoPE base */
    float factor;             /* llama3: scaling factor (e.g. 8) */
    float low_freq_factor;    /* llama3 (e.g. 1) */
    float high_freq_factor;   /* llama3 (e.g. 4) */
    float original_max_pos;   /* llama3: original_max_position_embeddings (e.g. 8192) */
    const float *inv_freq;    /* [rotary_dim / 2] f32 or NULL (then computed from theta, ...) */
    int rotary_dim;           /* even, <= head_dim; 0 = head_dim */
    float attn_scaling;       /* multiplies cos and sin; 0 = 1 */
    /* M-RoPE instances only (Qwen2-VL): rotary pair i takes its position from stream s(i), the
     * section it falls in: pairs [0, sections[0]) stream 0, the next sections[1] pairs stream 1,
     * ...; pos is then [n_sections, n_tokens] with pos[s * pos_stride + t]. */
    int n_sections;           /* 1 .. MS_ROPE_KV_MAX_SECTIONS; sum(sections) == rotary_dim / 2 */
    int sections[MS_ROPE_KV_MAX_SECTIONS]; /* [n_sections] rotary pairs per position stream */
    int pos_stride;           /* elements between the position streams (>= n_tokens) */
} ms_rope_kv_params;

/* ---- RMSNorm fused with the residual add ---- */

/*
 * add_residual instances: h = x + residual (rounded to T), residual = h, out = rmsnorm(h) * weight.
 * Plain instances: out = rmsnorm(x) * weight. out may alias x.
 * Per-head instances (rmsnorm_heads, Qwen3 q_norm / k_norm): each of the n_heads heads of
 * dim = head_dim elements of a token row is normalized on its own with the [head_dim] weight:
 * head h of token t is x + t * x_stride + h * dim (heads packed in the row; the token stride is
 * free, e.g. the q or k columns of a fused QKV output). residual is not used.
 */
typedef struct ms_rmsnorm_params {
    const void *x;       /* [n_rows, dim] T, row stride x_stride */
    void *residual;      /* [n_rows, dim] T, row stride dim, in/out (add_residual only) */
    const void *weight;  /* [dim] TW (the instance's dtype; activations use its act dtype) */
    void *out;           /* [n_rows, dim] T, row stride out_stride; ms_rmsnorm_q8: int8 values in
                            the layout of common/q8x.cuh, out_stride in bytes */
    int n_rows;
    int dim;             /* multiple of 16 bytes of T (ms_rmsnorm_q8: a multiple of 32 too) */
    int x_stride;
    int out_stride;
    float eps;
    int n_heads;         /* per-head instances: heads per token row (n_rows counts tokens) */
    float *out_scale;    /* ms_rmsnorm_q8: out's scale per 32 values, row stride scale_stride */
    int scale_stride;
} ms_rmsnorm_params;

/* ---- dense attention (no pages: the step's own K/V rows) ---- */

/*
 * Segment b holds the packed rows [indptr[b], indptr[b+1]) (indptr[0] == 0, indptr[n_seqs] ==
 * n_tokens); query row t of segment b attends to K/V rows indptr[b] .. indptr[b+1] - 1, not
 * causal, no window: out = softmax(scale * q k^T) v per query head h over KV head
 * h / (n_q_heads / n_kv_heads). Everything is float32.
 */
typedef struct ms_attn_dense_params {
    const void *q;       /* [n_tokens, n_q_heads, head_dim] f32, token row stride q_stride */
    const void *k;       /* [n_tokens, n_kv_heads, head_dim] f32, token row stride k_stride */
    const void *v;       /* [n_tokens, n_kv_heads, head_dim] f32, token row stride v_stride */
    void *o;             /* [n_tokens, n_q_heads, head_dim] f32, token row stride o_stride */
    const int *indptr;   /* [n_seqs + 1] segment offsets */
    int n_seqs;
    int n_tokens;
    int n_q_heads;       /* = n_kv_heads * group */
    int n_kv_heads;
    int q_stride;        /* elements between token rows */
    int k_stride;
    int v_stride;
    int o_stride;
    float scale;         /* logit scale, 1 / sqrt(head_dim) for Whisper */
} ms_attn_dense_params;

/* ---- SiLU and multiply ---- */

/* out[t, i] = silu(gate[t, i]) * up[t, i]; gate and up are usually the halves of one gate/up
 * GEMM output row (up = gate + inter, both with row stride 2 * inter). out may alias gate or up. */
typedef struct ms_silu_mul_params {
    const void *gate;    /* [n_rows, inter] T, row stride gate_stride */
    const void *up;      /* [n_rows, inter] T, row stride up_stride */
    void *out;           /* [n_rows, inter] T, row stride out_stride; ms_silu_mul_q8: int8 values
                            in the layout of common/q8x.cuh, out_stride in bytes */
    int n_rows;
    int inter;           /* multiple of 16 bytes of T; strides too (ms_silu_mul_q8: inter a
                            multiple of 32) */
    int gate_stride;
    int up_stride;
    int out_stride;
    float *out_scale;    /* ms_silu_mul_q8: out's scale per 32 values, row stride scale_stride */
    int scale_stride;
} ms_silu_mul_params;

/* ---- embedding gather ---- */

/* out[t] = table[ids[t]]; an id outside [0, vocab) writes zeros and sets *bad_id = 1. */
typedef struct ms_embed_params {
    const int *ids;      /* [n_tokens] */
    const void *table;   /* [vocab, dim] TW (the instance's dtype) */
    void *out;           /* [n_tokens, dim] TA (the instance's act dtype) */
    int *bad_id;         /* [1] set to 1 when an id is out of range (may be NULL) */
    int n_tokens;
    int vocab;
    int dim;             /* multiple of 16 bytes of T */
} ms_embed_params;

/* ---- argmax and sampling ---- */

/* ids[r] = the first index of the largest logit of row r. */
typedef struct ms_argmax_params {
    const void *logits;  /* [n_rows, vocab] TL, row stride stride */
    int *ids;            /* [n_rows] */
    int n_rows;
    int vocab;
    int stride;
} ms_argmax_params;

/*
 * Top-k / top-p sampling per row with temperature; the random coin comes from the host.
 * Semantics (the same as the CPU sampler, sampler.h, and the reference in
 * tests/test_gpu_kernels.c):
 *   a row holding a NaN logit: ids[r] = -1 (MS_SAMPLE_ID_NAN; the engine fails that request);
 *   temperature[r] < 1e-5 (MS_SAMPLER_MIN_TEMPERATURE), 0 included: argmax (first index of the
 *   maximum);
 *   otherwise p_i = exp((l_i - max l) / T). Top-k (0 < k < vocab): keep l_i >= the k-th largest
 *   logit (ties at the boundary are all kept). Top-p (p < 1): of those, keep p_i >= tau with tau
 *   the largest value such that the kept mass is >= top_p * (mass kept by top-k). The token is the
 *   first index, in vocabulary order, whose running kept mass exceeds uniform[r] * (kept mass).
 */
typedef struct ms_sample_params {
    const void *logits;        /* [n_rows, vocab] TL, row stride stride */
    const float *temperature;  /* [n_rows] */
    const int *top_k;          /* [n_rows], <= 0 or >= vocab: off */
    const float *top_p;        /* [n_rows], >= 1: off */
    const float *uniform;      /* [n_rows] coins in [0, 1) */
    int *ids;                  /* [n_rows] */
    int n_rows;
    int vocab;
    int stride;
    const float *min_p;        /* [n_rows] in [0, 1], 0: off; kept also needs
                                  exp((l - max) / T) >= min_p (after top-k / top-p, sampler.h) */
} ms_sample_params;

/* ---- elementwise helpers (convert, add, gather_rows; encoder: gelu, bias_add) ---- */

/* 2-D strided operands of n_rows x n_cols; strides in elements. */
typedef struct ms_misc_params {
    const void *a;     /* [n_rows or more, n_cols] source (convert: TS; add, gather: T) */
    const void *b;     /* add: [n_rows, n_cols] T; bias_add: [n_cols] bias (T or float) */
    void *out;         /* [n_rows, n_cols] (convert: TD; else T) */
    const int *rows;   /* gather_rows: [n_rows] source row or -1; select_rows: [n_rows] key */
    int n_rows;
    int n_cols;
    int a_stride;
    int b_stride;
    int out_stride;
} ms_misc_params;

/* y[c, r] (+)= sum_i T(x[c, i]) * w[r, i] for c < n (misc/gemv.cuh, the misc module's ms_gemv;
 * T = the module's dtype, bf16 or f16). Strides in elements. */
typedef struct ms_gemv_params {
    const void *w; /* [rows, in] T, row stride w_stride (a multiple of 8), 16-byte aligned */
    const void *x; /* [n, in] float, row stride x_stride (a multiple of 4), 16-byte aligned */
    void *y;       /* [n, rows] float, row stride y_stride */
    int rows;
    int in;        /* a multiple of 8 */
    int n;         /* 1..MS_GEMV_MAX_COLS */
    int w_stride;
    int x_stride;
    int y_stride;
    int acc;       /* 1: y += the products (linear_add, the residual add in the output), 0: y = */
    /* RMSNorm folded in (rms_norm_linear at the GEMV's sizes, the ms_gemv_norm entry): x is read
       raw, each value times norm_w[i] before rounding to T, and each output times
       rsqrt(sum_i x[c, i]^2 / in + eps) of its x row. [in] T (the weights' type), 16-byte
       aligned; NULL: none. The host folds for bf16 only (backend_cuda.c norm_gemv). */
    const void *norm_w;
    float eps;
} ms_gemv_params;

/* ---- encoder helpers of the misc module (misc/encoder.cuh) ---- */

/* LayerNorm over rows of dim elements; strides in elements. */
typedef struct ms_layer_norm_params {
    const void *x;      /* [n_rows, dim] TA, row stride x_stride */
    const void *weight; /* [dim] TW (the instance's dtype, or float for the _f32 entry) */
    const void *bias;   /* [dim] TW, or NULL */
    void *out;          /* [n_rows, dim] TA, row stride out_stride (may alias x) */
    int n_rows;
    int dim;
    int x_stride;
    int out_stride;
    float eps;
} ms_layer_norm_params;

/* Columns of a 1-D convolution (torch.nn.Conv1d, zero padding, dilation 1). */
typedef struct ms_im2col_params {
    const void *x; /* [t_in, c_in] TA, row stride x_stride (token-major) */
    void *col;     /* [t_out, c_in * k] TD (the instance's dtype, or float for the _f32 entry), packed */
    int t_in;
    int c_in;
    int k;         /* kernel width */
    int stride;
    int padding;   /* zeros on both sides */
    int t_out;     /* (t_in + 2 padding - k) / stride + 1 */
    int x_stride;
} ms_im2col_params;

#endif /* MS_KERNEL_PARAMS_H */
