/*
 * backend.h - the op interface between generated forward code and a compute backend.
 *
 * mstarc lowers a model's forward to an op list; each op is one call through an `ms_backend_i`
 * vtable on a backend's `ctx`. The CPU backend (backend_cpu.c, float32, a pthreads pool) is the
 * reference and the oracle; the CUDA backend (bf16 weights and KV, fp32 accumulation, cuBLAS GEMMs,
 * NVRTC template kernels, one stream, CUDA-graph capture) implements the same table.
 *
 * Ownership: ms_backend_* functions and vtable entries borrow their arguments. Memory returned by
 * `buffer_alloc` is owned by the caller and released with `buffer_free` on the same backend;
 * objects made by `*_init` entries are released by the matching `*_free` entry (NULL accepted).
 * `ms_tensor` and `ms_paged_kv` are descriptions (views), never owners.
 *
 * Memory model:
 *   - "backend memory" is what `buffer_alloc` returns: host memory for the CPU backend, device
 *     memory for CUDA. Every tensor data pointer given to an op is backend memory unless the op
 *     says "host". Host data moves in with `copy_to_backend` / `tensor_load` and out with
 *     `copy_to_host` (which waits for queued work).
 *   - Ops are queued in call order on the backend's single stream; an op may return before its
 *     result exists (CUDA). `synchronize` waits. Results are visible to later ops in order.
 *   - Buffers are planned up front: the runtime allocates weights, the KV page arena, activation
 *     buffers for the worst-case step, attention batches (`attn_batch_init` with limits) and the
 *     sampling workspace once at startup. Ops never allocate: the decode hot path does no malloc or
 *     cudaMalloc, and a step made only of ops (plus `attn_batch_stage`, which writes fixed
 *     addresses) can be captured into a CUDA graph between `graph_capture_begin/_end`.
 *
 * Tensors: row-major; the innermost dimension is contiguous (stride 1); outer strides are free, so
 * column slices of a concatenated output are valid operands (e.g. Q, K and V as views of one
 * [n, (hq + 2 hkv) * d] QKV GEMM output; gate and up as halves of one [n, 2 f] output). For 3-D
 * activations [n_tokens, n_heads, head_dim] the head stride must equal head_dim (heads packed in a
 * row); the token stride is free. Activations are float32 on the CPU backend; CUDA may use bf16
 * activations where its ops say so. Weights may be f32, bf16 or f16 on every backend (converted on
 * the fly or at load). Integer tensors (token ids, positions, row indices) are int32.
 *
 * Numerics: accumulation is float32 everywhere. The CPU backend's results do not depend on the
 * number of threads (each output element is computed by one thread with a fixed reduction order).
 *
 * Errors: every fallible entry returns ms_status and fills the optional `err` with one line naming
 * the op and the bad operand ("linear: shapes x [7, 36], w [45, 37], y [7, 45] do not fit
 * y = x w^T").
 * Shape/dtype checks are cheap host checks done on every call. Values inside backend memory (token
 * ids, page ids) are checked by the CPU backend; a device backend checks them on the host where it
 * has them (attn_batch_stage) and documents what it cannot check.
 *
 * Lowering the model language's forward (DESIGN.md §5) to ops, as test_llama_cpu_fixture.c does
 * by hand:
 *     embedding(embed, tokens)              -> embedding (ids uploaded with copy_to_backend)
 *     rms_norm(x, w, eps)                   -> rms_norm; after `x = x + y` -> add_rms_norm
 *     q, k, v = linear(h, wq), (h, wk), ... -> ONE linear over the concatenated [q + k + v, in]
 *                                              weight (tensor_load into row slices at load) and
 *                                              column views q/k/v of its output (split_heads)
 *     q_norm / k_norm (Qwen3)               -> rms_norm on the 3-D head views, in place
 *     pos.apply(q, k)                       -> rope_kv_write (RoPE + this layer's KV write)
 *     attn.run(q, k, v, layer = l)          -> attention over the staged batch of the step
 *     x = x + linear(a, w)                  -> linear_add (y += a w^T: the add in the linear's
 *                                              output) when nothing reads the product; else add,
 *                                              or add_rms_norm with the next norm
 *     silu(linear(h, g)) * linear(h, u)     -> ONE linear over [gate; up], then silu_mul on the
 *                                              two column halves
 *     linear(silu(a) * b, w)                -> silu_mul_linear (the product a temporary)
 *     linear(rms_norm(x, ...), w)           -> rms_norm_linear (the norm read by that linear only)
 *     return linear(norm(x), lm_head)       -> gather_rows(batch->last_token) before lm_head when
 *                                              only the last token's logits are needed; then
 *                                              argmax or sample
 * Once per step, before the layers: attn_batch_stage(plan of the KV resource) and the copies of
 * token ids and position ids into their planned buffers.
 *
 * Usage (one Llama layer; q/k/v are views of a QKV output; names are planned buffers):
 *     ms_backend be;
 *     MS_TRY(ms_backend_cpu_init(&be, NULL, err));
 *     const ms_backend_i *f = &be.iface;
 *     MS_TRY(f->attn_batch_stage(be.ctx, batch, plan, &kv, err));        // once per step
 *     MS_TRY(f->rms_norm(be.ctx, &x, &attn_norm, eps, &h, err));
 *     MS_TRY(f->linear(be.ctx, &h, &w_qkv, NULL, &qkv, err));
 *     MS_TRY(ms_backend_rope_kv_write(&be, &q, &k, &v, &pos, &rope, &kv, layer, batch, err));
 *     MS_TRY(f->attention(be.ctx, &q, &kv, layer, batch, &attn, &o, err));
 *     MS_TRY(ms_backend_linear_add(&be, &o, &wo, NULL, &t, &x, err));      // x += o wo^T
 *     MS_TRY(f->rms_norm(be.ctx, &x, &mlp_norm, eps, &h, err));
 *     ...
 *     ms_backend_free(&be);
 */
#ifndef MS_BACKEND_H
#define MS_BACKEND_H

#include "ms_base.h"
#include "resource.h"
#include "sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- dtypes ---- */

/* Element types. ORDER MS_DTYPE: keep ms_dtype_str() and ms_dtype_size() in sync. */
typedef enum ms_dtype {
    MS_DTYPE_F32 = 0, /* IEEE binary32 */
    MS_DTYPE_BF16,    /* bfloat16: the upper 16 bits of a binary32 */
    MS_DTYPE_F16,     /* IEEE binary16 */
    MS_DTYPE_I32,     /* int32 (ids, positions, indices) */
    /* ggml quantized blocks (ggml-common.h; GGUF weights kept quantized, each row's bytes in the
     * backend's layout: the CUDA backend's planar rows, backend_cuda_quant.h): weights of linear
     * and embedding only, [rows, cols] with cols a multiple of the block, rows packed
     * (ms_dtype_row_bytes), on backends whose weight_dtype_ok accepts them (CUDA) */
    MS_DTYPE_Q4_0,
    MS_DTYPE_Q4_1,
    MS_DTYPE_Q5_0,
    MS_DTYPE_Q8_0,
    MS_DTYPE_Q4_K,
    MS_DTYPE_Q5_K,
    MS_DTYPE_Q6_K,
    MS_DTYPE_COUNT
} ms_dtype;

/* "f32", "bf16", "f16", "i32"; "?" for anything else. */
const char *ms_dtype_str(ms_dtype dt);
/* Bytes per element (4, 2, 2, 4); 0 for an invalid dtype and for the block types (Q*). */
size_t ms_dtype_size(ms_dtype dt);
/* True for the ggml block types MS_DTYPE_Q4_0 .. MS_DTYPE_Q6_K. */
bool ms_dtype_is_quant(ms_dtype dt);
/* The ggml type number (gguf_quant.h MS_GGML_TYPE_*) of a block type; -1 for any other dtype. */
int ms_dtype_ggml_type(ms_dtype dt);
/* The block dtype of ggml type `type`, or MS_DTYPE_COUNT when it has none (F16, Q5_1, ...). */
ms_dtype ms_dtype_from_ggml(uint32_t type);
/* Bytes of one row of `cols` elements: cols * size, or cols / block * block bytes for a block
 * type; 0 when cols is not a multiple of the block or dt is invalid. */
size_t ms_dtype_row_bytes(ms_dtype dt, int64_t cols);

/* Scalar conversions (round to nearest even; NaN stays NaN; f16 overflow gives +-inf). Defined in
 * safetensors.c and declared identically in safetensors.h; repeated here so backends need only
 * this header. */
float ms_bf16_to_f32(uint16_t h);
uint16_t ms_f32_to_bf16(float f);
float ms_f16_to_f32(uint16_t h);
uint16_t ms_f32_to_f16(float f);

/* ---- tensors ---- */

#define MS_TENSOR_MAX_DIMS 4

/*
 * A strided view of backend memory (never an owner). shape[i] > 0 for i < ndim; stride[i] is in
 * elements; stride[ndim - 1] == 1 for every operand of an op.
 */
typedef struct ms_tensor {
    void *data;                         /* first element, backend memory */
    ms_dtype dtype;
    int32_t ndim;                       /* 1..MS_TENSOR_MAX_DIMS */
    int64_t shape[MS_TENSOR_MAX_DIMS];  /* elements per dimension; unused entries 1 */
    int64_t stride[MS_TENSOR_MAX_DIMS]; /* elements between neighbours; unused entries 0 */
} ms_tensor;

/* A contiguous row-major tensor over `data` (shape[0..ndim) given; ndim in 1..4). */
ms_tensor ms_tensor_make(void *data, ms_dtype dt, int32_t ndim, const int64_t *shape);
/* Contiguous 1-D, 2-D and 3-D shorthands. */
ms_tensor ms_tensor_1d(void *data, ms_dtype dt, int64_t n0);
ms_tensor ms_tensor_2d(void *data, ms_dtype dt, int64_t n0, int64_t n1);
ms_tensor ms_tensor_3d(void *data, ms_dtype dt, int64_t n0, int64_t n1, int64_t n2);
/* View of indices [start, start + len) of dimension `dim` (same strides). MS_ASSERTs the range. */
ms_tensor ms_tensor_slice(const ms_tensor *t, int32_t dim, int64_t start, int64_t len);
/* View of a 2-D tensor [n, h * d] (last stride 1) as [n, h, d]. MS_ASSERTs that shape[1] == h*d. */
ms_tensor ms_tensor_split_heads(const ms_tensor *t, int64_t h, int64_t d);
/* Number of elements (product of the shape). */
int64_t ms_tensor_numel(const ms_tensor *t);
/* True when the strides are exactly the row-major strides of the shape. */
bool ms_tensor_is_contiguous(const ms_tensor *t);
/* "[4, 8, 16]" into buf (for messages); returns buf. */
const char *ms_tensor_shape_str(const ms_tensor *t, char *buf, size_t size);

/* ---- the paged KV arena ---- */

/*
 * The page arena of one KV pool (DESIGN.md §2): one buffer of
 *     [n_layers, n_pages, 2, page_size, n_kv_heads, head_dim]   (NHD; K at index 0, V at 1)
 * Element (layer, page, kv, slot, head, i) lives at
 *     ((((layer * n_pages + page) * 2 + kv) * page_size + slot) * n_kv_heads + head) * head_dim
 *     + i.
 * Page 0 is the sink page (MS_SINK_PAGE): padding writes land there.
 */
typedef struct ms_paged_kv {
    void *data;          /* backend memory, see the layout above */
    ms_dtype dtype;      /* f32 (CPU), bf16 / f16 (CUDA) */
    int32_t n_layers;
    int32_t n_pages;     /* including the sink page */
    int32_t page_size;   /* tokens per page */
    int32_t n_kv_heads;
    int32_t head_dim;
} ms_paged_kv;

/* Bytes of the arena's buffer. */
size_t ms_paged_kv_bytes(const ms_paged_kv *kv);
/* Element offset of (layer, page, kv 0|1, slot, head, 0). */
static inline int64_t ms_paged_kv_offset(const ms_paged_kv *kv, int32_t layer, int32_t page,
                                         int32_t kv_idx, int32_t slot, int32_t head) {
    int64_t o = (int64_t)layer * kv->n_pages + page;
    o = (o * 2 + kv_idx) * kv->page_size + slot;
    return (o * kv->n_kv_heads + head) * kv->head_dim;
}

/* ---- attention batches (staged paged index arrays) ---- */

/* Worst-case sizes an attention batch is made for (planned at startup). */
typedef struct ms_attn_limits {
    int32_t max_seqs;   /* views per plan (batch rows, padding included) */
    int32_t max_tokens; /* query tokens per step (qo_indptr[n_seqs]) */
    int32_t max_pages;  /* pages over all views (kv_indptr[n_seqs]) */
} ms_attn_limits;

/*
 * One plan label's paged index arrays staged into backend memory at fixed addresses (graph-stable:
 * restaging keeps every pointer). Made by `attn_batch_init`, filled by `attn_batch_stage` from an
 * ms_kv_plan (resource.h; FlashInfer layout), read by `kv_write`, `attention` and `gather_rows`.
 * A runner keeps one per graph slot so step N+1 can be staged while step N runs.
 *
 * Semantics of view i (ms_kv_view): present tokens are logical positions [kv_start[i],
 * kv_start[i] + len_i) with len_i = (kv_indptr[i+1] - kv_indptr[i] - 1) * page_size +
 * kv_last_page_len[i] (0 when the view has no page); logical position p lives in page
 * kv_indices[kv_indptr[i] + (p - kv_start[i]) / page_size], slot (p - kv_start[i]) % page_size.
 * Its q_len_i = qo_indptr[i+1] - qo_indptr[i] query rows are the last q_len_i present tokens:
 * query row j has absolute position kv_start[i] + len_i - q_len_i + j (this is the position the
 * causal mask and the sliding window use; RoPE takes its own position ids).
 *
 * Read-only plans (cross-attention over a context stream written earlier, DESIGN.md §3): the
 * query rows are another stream's tokens, q_len_i is unrelated to len_i, the mask is off
 * (ms_attn_params.causal = false, window 0); such a plan may leave kv_start (all 0) and
 * token_to_page / token_to_slot NULL (every write address is then the sink page).
 */
typedef struct ms_attn_batch {
    ms_attn_limits limits;
    int32_t page_size;
    int32_t n_seqs;            /* views staged */
    int32_t n_tokens;          /* qo_indptr[n_seqs] */
    int32_t n_pages;           /* kv_indptr[n_seqs] */
    int32_t max_q_len;         /* max over views of q_len_i */
    int32_t max_kv_len;        /* max over views of len_i */
    bool is_decode;            /* every view has q_len_i == 1 */
    /* backend memory, capacity from limits; entries past the staged counts are padding: */
    int32_t *qo_indptr;        /* [max_seqs + 1] */
    int32_t *kv_indptr;        /* [max_seqs + 1] */
    int32_t *kv_indices;       /* [max_pages] */
    int32_t *kv_last_page_len; /* [max_seqs] in [1, page_size], 0 for a view without pages */
    int32_t *kv_start;         /* [max_seqs] logical position of the first present token */
    int32_t *token_to_page;    /* [max_tokens] write page of query token t; tail = MS_SINK_PAGE */
    int32_t *token_to_slot;    /* [max_tokens] write slot in [0, page_size); tail = 0 */
    int32_t *last_token;       /* [max_seqs] qo_indptr[i+1] - 1, or -1 when q_len_i == 0 */
    void *impl;                /* backend-private (split-KV schedule, host mirrors); may be NULL */
} ms_attn_batch;

/* ---- dense segments (attention without pages) ---- */

/*
 * The segments of one dense step (a node without a kv_pool, e.g. the Whisper encoder): every
 * segment's query rows are also its keys and values, so attention needs only the segments' row
 * offsets. Segment i holds the packed rows [indptr[i], indptr[i+1]); a row attends to the rows
 * of its own segment and to no other (CSR over the step's rows, like ms_attn_batch.qo_indptr,
 * with no page table, no pages and no write addresses).
 * Made once for the worst case by ms_dense_batch_init (one small backend buffer), restaged every
 * step by ms_dense_batch_stage at the same address (graph-stable), released by
 * ms_dense_batch_free.
 */
typedef struct ms_dense_batch {
    int32_t max_seqs;   /* capacity: segments per step */
    int32_t max_tokens; /* capacity: rows per step (indptr[n_seqs]) */
    int32_t n_seqs;     /* segments staged */
    int32_t n_tokens;   /* indptr[n_seqs] */
    int32_t max_len;    /* longest staged segment (rows) */
    int32_t *indptr;    /* backend memory [max_seqs + 1], indptr[0] == 0, strictly increasing */
    int32_t *indptr_host; /* [max_seqs + 1] host mirror of the staged offsets */
} ms_dense_batch;

struct ms_backend;

/*
 * Make a dense batch for up to max_seqs segments and max_tokens rows (both > 0): one backend
 * buffer of max_seqs + 1 int32 (named "dense.indptr") and its host mirror. *out is owned by the
 * caller (ms_dense_batch_free on the same backend). Errors: MS_ERR_INVALID_ARG, MS_ERR_OOM.
 */
ms_status ms_dense_batch_init(const struct ms_backend *b, int32_t max_seqs, int32_t max_tokens,
                              ms_dense_batch **out, ms_error *err);
/*
 * Stage n_seqs segments of lens[i] rows each (host array, every length >= 1) into `db`: the
 * offsets go to its fixed backend buffer (copy_to_backend), n_tokens and max_len are set.
 * Allocates nothing. MS_ERR_CAPACITY names the limit (segments or rows) that is exceeded;
 * MS_ERR_INVALID_ARG the first segment of no rows.
 */
ms_status ms_dense_batch_stage(const struct ms_backend *b, ms_dense_batch *db,
                               const int32_t *lens, int32_t n_seqs, ms_error *err);
/* Release a dense batch (NULL is a no-op). */
void ms_dense_batch_free(const struct ms_backend *b, ms_dense_batch *db);

/* ---- RoPE ---- */

/* ORDER MS_ROPE_STYLE */
typedef enum ms_rope_style {
    MS_ROPE_ROTATE_HALF = 0, /* HF rotate_half: pairs (x[i], x[i + r/2]), i < r/2 (GPT-NeoX) */
    MS_ROPE_INTERLEAVED,     /* llama2.c run.c / GPT-J: pairs (x[2i], x[2i+1]) */
    MS_ROPE_STYLE_COUNT
} ms_rope_style;

/* ORDER MS_ROPE_SCALING */
typedef enum ms_rope_scaling {
    MS_ROPE_SCALING_NONE = 0, /* HF rope_type "default" */
    MS_ROPE_SCALING_LINEAR,   /* HF "linear": inv_freq / factor */
    MS_ROPE_SCALING_LLAMA3,   /* HF "llama3": _compute_llama3_parameters */
    MS_ROPE_SCALING_COUNT
} ms_rope_scaling;

/* Most M-RoPE position streams (the same value hf_config.h uses for mrope_section). */
#ifndef MS_ROPE_MAX_SECTIONS
#define MS_ROPE_MAX_SECTIONS 4
#endif

/* RoPE settings of a model, as read from its config. */
typedef struct ms_rope_config {
    ms_rope_style style;
    int32_t head_dim;
    int32_t rotary_dim;              /* even, <= head_dim (partial rotary); 0 means head_dim */
    double theta;                    /* rope_theta (base) */
    ms_rope_scaling scaling;
    double factor;                   /* linear / llama3 "factor" */
    double low_freq_factor;          /* llama3 */
    double high_freq_factor;         /* llama3 */
    double original_max_position;    /* llama3 original_max_position_embeddings */
    int32_t n_sections;              /* M-RoPE (Qwen2-VL): position streams, 0 = one (plain RoPE);
                                        frequencies stay the default ones */
    int32_t sections[MS_ROPE_MAX_SECTIONS]; /* [n_sections] rotary pairs per stream (t, h, w),
                                               summing to rotary_dim / 2 (ms_rope_table.sections) */
} ms_rope_config;

/*
 * Host: inverse frequencies inv_freq[j], j < rotary_dim / 2, in float32 exactly as transformers
 * computes them (modeling_rope_utils.py): default 1 / theta^(2j / rotary_dim) with the exponent
 * formed in float32; linear divides by factor; llama3 follows _compute_llama3_parameters (wavelen
 * = 2 pi / inv_freq; wavelen > orig/low_freq_factor: inv_freq / factor; wavelen <
 * orig/high_freq_factor: unchanged; else (1 - s) inv_freq / factor + s inv_freq with s = (orig /
 * wavelen - low) / (high - low)). Returns MS_ERR_INVALID_ARG naming a bad field.
 */
ms_status ms_rope_compute_inv_freq(const ms_rope_config *c, float *inv_freq, ms_error *err);

struct ms_rope_params;

/*
 * Host: the RoPE settings of a config.json (hf_config.h ms_hf_config_get_rope, either layout) as
 * an ms_rope_config for `style` and `head_dim`: theta, rotary_dim = head_dim *
 * partial_rotary_factor, default / linear / llama3 scaling. MS_ERR_UNSUPPORTED names rope types
 * the backends do not implement yet (dynamic, yarn); M-RoPE sections are copied by the caller
 * into ms_rope_table.sections (frequencies are the default ones).
 */
ms_status ms_rope_config_from_hf(const struct ms_rope_params *p, ms_rope_style style,
                                 int32_t head_dim, ms_rope_config *out, ms_error *err);

/*
 * RoPE table handed to the rope ops: style, rotary width and the inverse frequencies in backend
 * memory (upload the output of ms_rope_compute_inv_freq once at load).
 *
 * M-RoPE (Qwen2-VL, HF apply_multimodal_rotary_pos_emb): with n_sections > 0 the position ids
 * have one stream per section (t, h, w) and rotary pair j takes its angle from the stream of the
 * section it falls in: pairs [0, sections[0]) use stream 0, the next sections[1] pairs stream 1,
 * ... (HF splits cos/sin by mrope_section * 2 and takes chunk i from axis i % 3: the same pairs
 * in both rotate-half halves). sum(sections) == rotary_dim / 2.
 */
typedef struct ms_rope_table {
    ms_rope_style style;
    int32_t rotary_dim;      /* even; rotates dims [0, rotary_dim) of each head, the rest pass */
    const float *inv_freq;   /* [rotary_dim / 2] f32, backend memory */
    float attention_scaling; /* multiplies cos and sin (HF attention_factor; 1: default, llama3) */
    int32_t n_sections;      /* 0: one position stream; else M-RoPE sections (<= MAX_SECTIONS) */
    int32_t sections[MS_ROPE_MAX_SECTIONS]; /* [n_sections] rotary pairs per position stream */
} ms_rope_table;

/* ---- attention parameters ---- */

/* Per-call settings of `attention` (one per attention layer kind of a model). */
typedef struct ms_attn_params {
    float scale;     /* logit scale, normally 1 / sqrt(head_dim) */
    int32_t window;  /* sliding window in tokens, 0 = none: a query at position i sees keys
                        i - window + 1 .. i (HF/Mistral sliding_window; fixture mistral_window) */
    bool causal;     /* keys after the query's position are masked */
} ms_attn_params;

/* ---- the vtable ---- */

struct ms_kernel_spec; /* kernel.h */

/*
 * Entries marked "optional" may be NULL; use the ms_backend_* wrappers below, which fall back as
 * the trailing comment says. Unless stated, an output may not alias an input.
 */
typedef struct ms_backend_i {
    const char *name; /* "cpu", "cuda" */

    /* -- memory -- */

    /* Allocate `bytes` (> 0) of backend memory, 64-byte aligned, contents undefined. `name` labels
     * the allocation in the out-of-memory message ("kv.arena: 2.1 GB requested, ..."). */
    ms_status (*buffer_alloc)(void *ctx, size_t bytes, const char *name, void **out, ms_error *err);
    /* Release memory from buffer_alloc (NULL is a no-op). Waits for queued work that uses it. */
    void (*buffer_free)(void *ctx, void *ptr);
    /* Set `bytes` bytes at dst (backend memory) to `byte` (queued). */
    ms_status (*buffer_fill)(void *ctx, void *dst, int byte, size_t bytes, ms_error *err);
    /* Host -> backend copy; src may be reused as soon as the call returns. */
    ms_status (*copy_to_backend)(void *ctx, void *dst, const void *src_host, size_t bytes,
                                 ms_error *err);
    /* Backend -> host copy; waits for queued work first, data is in dst_host on return. */
    ms_status (*copy_to_host)(void *ctx, void *dst_host, const void *src, size_t bytes,
                              ms_error *err);
    /*
     * Load a host tensor (e.g. an mmapped checkpoint tensor, f32/bf16/f16) into backend tensor
     * `dst` (a view, so row slices of a concatenated QKV or gate/up weight are valid targets),
     * converting dtype (f32 <-> bf16 <-> f16, round to nearest even). Shapes must be equal. src
     * may be unaligned (read with memcpy).
     */
    ms_status (*tensor_load)(void *ctx, const ms_tensor *dst, const ms_tensor *src_host,
                             ms_error *err);
    /* Wait until every queued op finished; reports an asynchronous failure. */
    ms_status (*synchronize)(void *ctx, ms_error *err);

    /* -- attention batches -- */

    /* Make a batch with fixed buffers for `limits` (all > 0). */
    ms_status (*attn_batch_init)(void *ctx, const ms_attn_limits *limits, ms_attn_batch **out,
                                 ms_error *err);
    /* Release a batch (NULL is a no-op). */
    void (*attn_batch_free)(void *ctx, ms_attn_batch *batch);
    /*
     * Stage `plan` (host arrays, resource.h) for the arena `kv`: check counts against the limits,
     * indptr monotonic, page ids in [0, kv->n_pages), last-page lengths, kv_start and write
     * slots in range; copy into the batch's fixed buffers; set the padding tail of
     * token_to_page/slot to the sink page; compute last_token, max_q_len, max_kv_len. Allocates
     * nothing. MS_ERR_INVALID_ARG names the view and field; MS_ERR_CAPACITY names the limit.
     * plan->views is not read (the arrays are the contract).
     */
    ms_status (*attn_batch_stage)(void *ctx, ms_attn_batch *batch, const ms_kv_plan *plan,
                                  const ms_paged_kv *kv, ms_error *err);
    /*
     * Plan attention over the batch just staged, once per step, for every layer's `attention`
     * call of the step (optional, default: none; the CPU backend plans nothing): the kernel kind
     * (decode when every view has one query row, else prefill), its instance for (kv dtype,
     * head_dim, page size, n_q_heads / kv->n_kv_heads, params->causal, params->window > 0), the
     * decode split-KV count from the device's occupancy, the prefill tile list (uploaded here).
     * After it `attention` only launches: no kernel lookup, no allocation, no host planning or
     * upload inside a layer. Staging again clears the plan; an `attention` call whose batch was
     * not planned, or was planned for other heads or mask, is MS_ERR_STATE. Errors: a kernel
     * instance that is neither loaded (kernels_load) nor compilable, MS_ERR_CAPACITY (tiles).
     */
    ms_status (*attn_batch_plan)(void *ctx, ms_attn_batch *batch, const ms_paged_kv *kv,
                                 int32_t n_q_heads, const ms_attn_params *params, ms_error *err);
    /*
     * Load the kernel instances a model runs (specs [n], struct ms_kernel_spec of
     * kernel.h: the model's generated kernel list at the checkpoint's shape, as
     * ms_kernel_specs_for_stems gives it), once at init (optional, default: none). From then on
     * the backend's instance table is sealed: an op needing an instance outside it fails with
     * MS_ERR_STATE naming the instance (the generated list missed it) instead of compiling in
     * the middle of a step. Errors: NVRTC / driver failures naming the instance.
     */
    ms_status (*kernels_load)(void *ctx, const struct ms_kernel_spec *specs, int n,
                              ms_error *err);
    /*
     * Whether weights of dtype `dt` can be loaded (tensor_load from host data of the same dtype)
     * and computed with by linear and embedding (optional, default: f32, bf16 and f16 only). The
     * CUDA backend accepts the ggml block types (backend_cuda_quant.h) unless MS_CUDA_QUANT=0.
     */
    bool (*weight_dtype_ok)(void *ctx, ms_dtype dt);

    /* -- ops (all queued; shapes in the comments; n = tokens of the step) -- */

    /*
     * Embedding gather (HF nn.Embedding; llama2.c run.c `forward`: content_row = token_embedding +
     * token * dim): out[t, :] = table[ids[t], :].
     * table [V, d] f32|bf16|f16; ids [n] i32 in [0, V); out [n, d] f32.
     */
    ms_status (*embedding)(void *ctx, const ms_tensor *table, const ms_tensor *ids, ms_tensor *out,
                           ms_error *err);
    /*
     * Linear layer (HF nn.Linear; llama2.c `matmul`): y[t, o] = sum_i x[t, i] * w[o, i] (+ b[o]),
     * i.e. y = x W^T with W [out, in] as stored in checkpoints.
     * x [n, in] f32; w [out, in] f32|bf16|f16 (rows contiguous); bias [out] or NULL; y [n, out]
     * f32 (may be a column slice of a wider buffer). Accumulation in f32.
     */
    ms_status (*linear)(void *ctx, const ms_tensor *x, const ms_tensor *w, const ms_tensor *bias,
                        ms_tensor *y, ms_error *err);
    /*
     * RMSNorm over the last dimension (HF LlamaRMSNorm / Qwen3RMSNorm; llama2.c `rmsnorm`):
     * out = x * rsqrt(mean(x^2) + eps) * w, all in f32.
     * x [n, d] or [n, h, d] (the latter is per-head norm, Qwen3 q_norm/k_norm with w [head_dim]);
     * w [d] f32|bf16|f16; out like x (may alias x).
     */
    ms_status (*rms_norm)(void *ctx, const ms_tensor *x, const ms_tensor *w, float eps,
                          ms_tensor *out, ms_error *err);
    /*
     * Residual add fused with RMSNorm (optional, default: add(residual, x, residual), then
     * rms_norm(residual, w, eps, out)): residual += x; out = rms_norm(residual).
     * residual [n, d] f32 (in/out); x [n, d]; w [d]; out [n, d].
     */
    ms_status (*add_rms_norm)(void *ctx, ms_tensor *residual, const ms_tensor *x,
                              const ms_tensor *w, float eps, ms_tensor *out, ms_error *err);
    /*
     * RMSNorm, after the residual add when residual != NULL, followed by its projection
     * (optional, default: add_rms_norm(residual, x, norm_w, eps, h) or rms_norm(x, norm_w, eps,
     * h), then linear(h, w, bias, y)): residual += x and h = rms_norm(residual), or h =
     * rms_norm(x); y = linear(h, w, bias). Shapes as those entries; h [n, d] f32 may be left
     * unwritten by a backend that never materialises it in f32 (contents unspecified after).
     * The CUDA backend writes the norm straight in the GEMM's 16-bit input type (one convert
     * kernel and an f32 pass less, the same bits as the norm then linear's convert).
     */
    ms_status (*rms_norm_linear)(void *ctx, ms_tensor *residual, const ms_tensor *x,
                                 const ms_tensor *norm_w, float eps, ms_tensor *h,
                                 const ms_tensor *w, const ms_tensor *bias, ms_tensor *y,
                                 ms_error *err);
    /*
     * Rotary position embedding, in place on q and k (HF apply_rotary_pos_emb with rotate_half, or
     * llama2.c run.c's interleaved pairs). For token t with position p = pos[t] and pair j <
     * rotary_dim / 2: angle = p * inv_freq[j] (f32), c = cos(angle) * s_att,
     * s = sin(angle) * s_att;
     * (a, b) -> (a c - b s, b c + a s) where (a, b) = (x[j], x[j + r/2]) (ROTATE_HALF) or
     * (x[2j], x[2j+1]) (INTERLEAVED). Dims >= rotary_dim are unchanged. With M-RoPE sections,
     * pair j uses p = pos[s(j), t] (see ms_rope_table).
     * q [n, hq, d] f32; k [n, hkv, d] f32 or NULL; pos [n] i32 >= 0, or [n_sections, n] (one
     * stream per section, stream-major like ms_pos_step.explicit_ids) when rope->n_sections > 0.
     */
    ms_status (*rope)(void *ctx, ms_tensor *q, ms_tensor *k, const ms_tensor *pos,
                      const ms_rope_table *rope, ms_error *err);
    /*
     * Write the step's new K and V into their pages: for token t, page = token_to_page[t], slot =
     * token_to_slot[t] of `batch`, K at kv index 0 and V at 1 of layer `layer` (converted to
     * kv->dtype). k, v [batch->n_tokens, n_kv_heads, head_dim] f32.
     */
    ms_status (*kv_write)(void *ctx, const ms_paged_kv *kv, int32_t layer, const ms_tensor *k,
                          const ms_tensor *v, const ms_attn_batch *batch, ms_error *err);
    /*
     * RoPE fused with the KV write (optional, default: rope(q, k, pos, rope) then kv_write(kv,
     * layer, k, v, batch)). q and k are rotated in place as in `rope`.
     */
    ms_status (*rope_kv_write)(void *ctx, ms_tensor *q, ms_tensor *k, const ms_tensor *v,
                               const ms_tensor *pos, const ms_rope_table *rope,
                               const ms_paged_kv *kv, int32_t layer, const ms_attn_batch *batch,
                               ms_error *err);
    /*
     * Paged attention for prefill and decode (HF eager_attention_forward with repeat_kv; llama2.c
     * run.c's per-head loop): for view i, query row j at absolute position P (see ms_attn_batch)
     * and query head h, with KV head g = h / (hq / hkv) (GQA; hq % hkv == 0):
     *     s_k = scale * dot(q[t, h, :], K[k, g, :]) for present keys k at logical position pk with
     *           (!causal || pk <= P) and (window == 0 || pk > P - window);
     *     out[t, h, :] = sum_k softmax(s)_k V[k, g, :]   (max-subtracted softmax in f32).
     * A query with no visible key gets zeros. Keys come from layer `layer` of `kv` (written by
     * kv_write earlier in the step, so a query sees its own token).
     * q [batch->n_tokens, hq, d] f32; out [batch->n_tokens, hq, d] f32; d == kv->head_dim.
     */
    ms_status (*attention)(void *ctx, const ms_tensor *q, const ms_paged_kv *kv, int32_t layer,
                           const ms_attn_batch *batch, const ms_attn_params *params,
                           ms_tensor *out, ms_error *err);
    /*
     * SwiGLU gate (HF LlamaMLP: act_fn(gate_proj(x)) * up_proj(x) with ACT2FN["silu"]; llama2.c
     * run.c: val *= 1 / (1 + expf(-val)); val *= hb2): out = gate * sigmoid(gate) * up.
     * gate, up [n, f] f32 (e.g. the halves of one gate/up GEMM output); out [n, f] (may alias
     * gate or up).
     */
    ms_status (*silu_mul)(void *ctx, const ms_tensor *gate, const ms_tensor *up, ms_tensor *out,
                          ms_error *err);
    /*
     * SwiGLU followed by its projection (optional, default: silu_mul(gate, up, tmp), then
     * linear(tmp, w, bias, y)): y = linear(silu(gate) * up, w, bias). gate, up [n, f] f32; tmp
     * [n, f] f32 (may alias gate; a backend that never materialises the product in f32 may leave
     * it unwritten: its contents afterwards are unspecified); w [out, f]; y [n, out] as linear.
     * The CUDA backend writes the product straight in the GEMM's 16-bit input type (one kernel
     * and one pass over the product less than silu_mul + linear's convert, the same bits).
     */
    ms_status (*silu_mul_linear)(void *ctx, const ms_tensor *gate, const ms_tensor *up,
                                 ms_tensor *tmp, const ms_tensor *w, const ms_tensor *bias,
                                 ms_tensor *y, ms_error *err);
    /*
     * Residual linear (optional, default: linear(x, w, bias, tmp), then add(y, tmp, y)):
     * y += x W^T (+ bias), the decoder's `x = x + linear(a, w)` with the add in the linear's
     * output (mstarc's fuse_linear_add) instead of a pass of its own. x, w, bias as linear; y
     * [n, out] f32, packed rows or a column slice, must not overlap x; tmp [n, out] f32 scratch
     * (the default writes the product there; a backend that adds in the GEMV's / GEMM's output
     * leaves it unwritten). Equal to the default up to the order of the two sums when there is
     * a bias (y + xW^T + b against y + (xW^T + b)).
     */
    ms_status (*linear_add)(void *ctx, const ms_tensor *x, const ms_tensor *w,
                            const ms_tensor *bias, ms_tensor *tmp, ms_tensor *y, ms_error *err);
    /*
     * SwiGLU, its projection and the residual add (optional, default: silu_mul_linear(gate, up,
     * prod, w, bias, tmp), then add(y, tmp, y)): y += linear(silu(gate) * up, w, bias). gate, up,
     * prod as silu_mul_linear's gate, up, tmp; tmp and y as linear_add's (y may be gate or up,
     * not overlap prod).
     */
    ms_status (*silu_mul_linear_add)(void *ctx, const ms_tensor *gate, const ms_tensor *up,
                                     ms_tensor *prod, const ms_tensor *w, const ms_tensor *bias,
                                     ms_tensor *tmp, ms_tensor *y, ms_error *err);
    /* Elementwise out = a + b (residual add). a, b, out [n, d] f32; out may alias a or b. */
    ms_status (*add)(void *ctx, const ms_tensor *a, const ms_tensor *b, ms_tensor *out,
                     ms_error *err);

    /* -- encoder ops (Whisper; optional for decoder-only models: NULL = MS_ERR_UNSUPPORTED) -- */

    /*
     * Dense self-attention over the step's own K/V rows (no pages, no pool; the Whisper encoder's
     * bidirectional attention, HF WhisperAttention / eager_attention_forward without a mask):
     * for segment i of `db` (rows [s0, s1) = [indptr[i], indptr[i+1])), query row t in it, query
     * head h and KV head g = h / (hq / hkv):
     *     s_k = scale * dot(q[t, h, :], k[r, g, :]) for every row r in [s0, s1);
     *     out[t, h, :] = sum_r softmax(s)_r v[r, g, :]   (max-subtracted online softmax in f32,
     *     keys in row order: the paged `attention` of a non-causal view over the same rows gives
     *     the same numbers when the arena is f32).
     * Not causal, no window (params->causal must be false and params->window 0: a masked dense
     * form does not exist; MS_ERR_INVALID_ARG says so). A row never sees another segment's rows.
     * q, out [db->n_tokens, hq, d] f32; k, v [db->n_tokens, hkv, d] f32 (hq % hkv == 0; views of
     * a fused QKV output are fine); out may not alias q, k or v. The CUDA backend runs the
     * attn_dense template instance (templates/attn/dense.cuh) for d (f32 activations).
     */
    ms_status (*attention_dense)(void *ctx, const ms_tensor *q, const ms_tensor *k,
                                 const ms_tensor *v, const ms_dense_batch *db,
                                 const ms_attn_params *params, ms_tensor *out, ms_error *err);

    /*
     * LayerNorm over the last dimension (torch.nn.LayerNorm, biased variance):
     * out = (x - mean(x)) * rsqrt(mean((x - mean)^2) + eps) * w + b, in f32.
     * x [n, d] f32; w, b [d] f32|bf16|f16 (b may be NULL); out [n, d] (may alias x).
     */
    ms_status (*layer_norm)(void *ctx, const ms_tensor *x, const ms_tensor *w, const ms_tensor *b,
                            float eps, ms_tensor *out, ms_error *err);
    /*
     * Exact GELU (HF ACT2FN["gelu"], torch.nn.functional.gelu without approximation):
     * out = 0.5 * x * (1 + erf(x / sqrt(2))). x, out [n, d] f32 (out may alias x).
     */
    ms_status (*gelu)(void *ctx, const ms_tensor *x, ms_tensor *out, ms_error *err);
    /*
     * 1-D convolution over time (torch.nn.Conv1d, zero padding, dilation 1), token-major:
     * y[t, o] = b[o] + sum_{c, k} w[o, c, k] * x[t * stride + k - padding, c] (x outside
     * [0, T_in) reads 0). x [T_in, C_in] f32; w [C_out, C_in, K] f32|bf16|f16; bias [C_out] or
     * NULL; y [T_out, C_out] f32 with T_out = (T_in + 2 padding - K) / stride + 1.
     */
    ms_status (*conv1d)(void *ctx, const ms_tensor *x, const ms_tensor *w, const ms_tensor *bias,
                        int32_t stride, int32_t padding, ms_tensor *y, ms_error *err);
    /*
     * Row gather (logits of the last token of each sequence: rows = batch->last_token):
     * out[r, :] = x[rows[r], :], or zeros when rows[r] == -1.
     * x [n, d] f32; rows [m] i32 in [-1, n); out [m, d] f32.
     */
    ms_status (*gather_rows)(void *ctx, const ms_tensor *x, const ms_tensor *rows, ms_tensor *out,
                             ms_error *err);
    /*
     * Row select (a code predictor's input: the frame's first row is in_proj(h), the others a
     * code's embedding): out[r, :] = key[r] == 0 ? a[r, :] : b[r, :].
     * key [n] i32 (the rows' frame positions); a, b, out [n, d] f32 (out may alias a or b).
     * Errors: MS_ERR_INVALID_ARG on other shapes; other dtypes are refused by each backend's
     * tensor check (MS_ERR_UNSUPPORTED on the CPU, MS_ERR_INVALID_ARG on CUDA).
     */
    ms_status (*select_rows)(void *ctx, const ms_tensor *key, const ms_tensor *a,
                             const ms_tensor *b, ms_tensor *out, ms_error *err);
    /*
     * Greedy ids: ids[r] = argmax logits[r, :], lowest index on ties (torch.argmax, llama2.c
     * sample_argmax). logits [m, V] f32; ids [m] i32 (backend memory).
     */
    ms_status (*argmax)(void *ctx, const ms_tensor *logits, ms_tensor *ids, ms_error *err);
    /* Bytes of workspace `sample` needs for m rows of V logits. */
    size_t (*sample_workspace_size)(void *ctx, int32_t m, int32_t vocab);
    /*
     * Sample one id per row with the semantics of sampler.h (greedy rows = argmax; others
     * temperature / top-k / top-p with the uniform of (seed, draw)). logits [m, V] f32; rows [m]
     * host array; workspace: backend memory of sample_workspace_size(m, V) bytes; ids [m] i32.
     * A row whose logits hold NaN gets MS_SAMPLE_ID_NAN (-1), not an error: one broken
     * sequence must not fail the batch. Bad settings are an error naming the row.
     */
    ms_status (*sample)(void *ctx, const ms_tensor *logits, const ms_sample_row *rows,
                        void *workspace, size_t workspace_bytes, ms_tensor *ids, ms_error *err);

    /* -- graphs (optional, default: MS_ERR_UNSUPPORTED, the runner stays eager) -- */

    /* Start recording the ops queued from now on instead of running them. */
    ms_status (*graph_capture_begin)(void *ctx, ms_error *err);
    /* Stop recording; *graph is an executable graph owned by the caller (graph_free). */
    ms_status (*graph_capture_end)(void *ctx, void **graph, ms_error *err);
    /* Queue a recorded graph (reads the current contents of the buffers it captured). */
    ms_status (*graph_launch)(void *ctx, void *graph, ms_error *err);
    /* Release a graph (NULL is a no-op). */
    void (*graph_free)(void *ctx, void *graph);

    /* Release the backend and everything it still holds. */
    void (*free)(void *ctx);
} ms_backend_i;

/* A backend: its table (embedded) and its state. */
typedef struct ms_backend {
    ms_backend_i iface;
    void *ctx;
} ms_backend;

/* Release a backend (iface.free(ctx)) and clear the struct. NULL or a zeroed struct is a no-op. */
void ms_backend_free(ms_backend *b);

/* ---- wrappers for optional entries (fall back as documented in the table) ---- */

/* iface.add_rms_norm when set, else add(residual, x, residual) then rms_norm(residual, w, eps,
 * out). Errors: those of the entries called. */
ms_status ms_backend_add_rms_norm(const ms_backend *b, ms_tensor *residual, const ms_tensor *x,
                                  const ms_tensor *w, float eps, ms_tensor *out, ms_error *err);
/* iface.rms_norm_linear when set, else ms_backend_add_rms_norm(residual, x, norm_w, eps, h) (or
 * rms_norm(x, norm_w, eps, h) when residual is NULL) then linear(h, w, bias, y). Errors: those of
 * the entries called. */
ms_status ms_backend_rms_norm_linear(const ms_backend *b, ms_tensor *residual, const ms_tensor *x,
                                     const ms_tensor *norm_w, float eps, ms_tensor *h,
                                     const ms_tensor *w, const ms_tensor *bias, ms_tensor *y,
                                     ms_error *err);
/* iface.silu_mul_linear when set, else silu_mul(gate, up, tmp) then linear(tmp, w, bias, y).
 * Errors: those of the entries called. */
ms_status ms_backend_silu_mul_linear(const ms_backend *b, const ms_tensor *gate,
                                     const ms_tensor *up, ms_tensor *tmp, const ms_tensor *w,
                                     const ms_tensor *bias, ms_tensor *y, ms_error *err);
/* iface.linear_add when set, else linear(x, w, bias, tmp) then add(y, tmp, y): y += x W^T (+ bias).
 * Errors: those of the entries called. */
ms_status ms_backend_linear_add(const ms_backend *b, const ms_tensor *x, const ms_tensor *w,
                                const ms_tensor *bias, ms_tensor *tmp, ms_tensor *y,
                                ms_error *err);
/* iface.silu_mul_linear_add when set, else ms_backend_silu_mul_linear(gate, up, prod, w, bias, tmp)
 * then add(y, tmp, y). Errors: those of the entries called. */
ms_status ms_backend_silu_mul_linear_add(const ms_backend *b, const ms_tensor *gate,
                                         const ms_tensor *up, ms_tensor *prod, const ms_tensor *w,
                                         const ms_tensor *bias, ms_tensor *tmp, ms_tensor *y,
                                         ms_error *err);
/* iface.rope_kv_write when set, else rope(q, k, pos, rope) then kv_write(kv, layer, k, v,
 * batch). Errors: those of the entries called. */
ms_status ms_backend_rope_kv_write(const ms_backend *b, ms_tensor *q, ms_tensor *k,
                                   const ms_tensor *v, const ms_tensor *pos,
                                   const ms_rope_table *rope, const ms_paged_kv *kv, int32_t layer,
                                   const ms_attn_batch *batch, ms_error *err);

/*
 * Stage `plan` into `batch` (attn_batch_stage) and plan attention over it for n_q_heads query
 * heads and `params` (attn_batch_plan, when the backend has it): what every caller does once per
 * step before the layers. Errors: those of the two entries.
 */
ms_status ms_backend_attn_stage(const ms_backend *b, ms_attn_batch *batch, const ms_kv_plan *plan,
                                const ms_paged_kv *kv, int32_t n_q_heads,
                                const ms_attn_params *params, ms_error *err);

/*
 * Host-side check shared by every backend's attn_batch_stage: validates `plan` against `limits`
 * and `kv` as documented for attn_batch_stage and returns the scalar fields (n_seqs, n_tokens,
 * n_pages, max_q_len, max_kv_len, is_decode) in *shape. Touches no backend memory.
 */
ms_status ms_attn_batch_check(const ms_attn_limits *limits, const ms_kv_plan *plan,
                              const ms_paged_kv *kv, ms_attn_batch *shape, ms_error *err);

/* ---- the CPU backend ---- */

/* Settings of the CPU backend. */
typedef struct ms_backend_cpu_options {
    int32_t n_threads; /* worker threads incl. the caller, <= MS_THREADPOOL_MAX_THREADS (256);
                          0 = online CPUs (at most 64) */
} ms_backend_cpu_options;

/*
 * Make the float32 CPU backend (backend_cpu.c) into *out. opt may be NULL (defaults). Backend
 * memory is host memory: buffer_alloc returns ms_malloc'd blocks aligned to 64 bytes, and any
 * other host pointer (an mmapped checkpoint tensor, a KV arena from the host ms_device) is a valid
 * operand too. Ops run on the calling thread and the pool before returning, so synchronize is a
 * no-op. Graph entries are NULL. Returns MS_ERR_OOM / MS_ERR_INVALID_ARG / MS_ERR_INTERNAL (a
 * thread could not start) with a message; *out is zeroed on failure.
 */
ms_status ms_backend_cpu_init(ms_backend *out, const ms_backend_cpu_options *opt, ms_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MS_BACKEND_H */
