/*
 * kernel.h - kernel instances: what a specialization is (ms_kernel_spec), its readable URI,
 * its generated instance source (config preamble + extern "C" wrappers around a template of
 * templates/), and the host-side planning the attention kernels need (prefill tile lists, decode
 * KV splits).
 *
 * Pure host C with no CUDA dependency: mstarc calls it to emit per-model instance sources, the
 * runtime to complete the shapes from the checkpoint at load, and the CPU-only CI to test it.
 * NVRTC compilation lives in nvrtc.h, loading and launching in cuda_ops.h.
 *
 * Ownership: functions borrow their arguments; a source returned through `char **` is ms_malloc'd
 * and released with ms_free.
 *
 * Usage:
 *     ms_kernel_spec s = ms_kernel_spec_attn_decode(MS_KERNEL_DTYPE_BF16, 128, 16, 4, false);
 *     char uri[MS_KERNEL_URI_MAX];
 *     MS_TRY(ms_kernel_spec_uri(&s, 90, uri, sizeof uri, err));   // attn_decode_bf16_hd128_ps16_g4_sm90
 *     char *src;
 *     MS_TRY(ms_kernel_spec_source(&s, &src, err));
 */
#ifndef MS_KERNEL_H
#define MS_KERNEL_H

#include "ms_base.h"
#include "../../templates/common/params.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MS_KERNEL_URI_MAX 128
#define MS_KERNEL_MAX_ENTRIES 17 /* misc: 3 helpers + 7 encoder entries + select_rows + gemv +
                                    silu_mul_to + gemv_norm; qmatmul: 8 GEMV widths + dequant +
                                    embed + 2 accumulating GEMVs + x quantization + 4 GEMVs on
                                    quantized x */

/* ORDER MS_KERNEL_OP: keep the op table in kernel.c in sync. */
typedef enum ms_kernel_op {
    MS_KERNEL_OP_ATTN_DECODE = 0, /* attn/decode.cuh (split-KV merged in the same launch) */
    MS_KERNEL_OP_ATTN_PREFILL,    /* attn/prefill.cuh */
    MS_KERNEL_OP_ROPE_KV,         /* rope/rope_kv.cuh */
    MS_KERNEL_OP_RMSNORM,         /* norm/rmsnorm.cuh */
    MS_KERNEL_OP_SILU_MUL,        /* act/silu_mul.cuh */
    MS_KERNEL_OP_EMBED,           /* embed/embed.cuh */
    MS_KERNEL_OP_ARGMAX,          /* sample/sample.cuh */
    MS_KERNEL_OP_SAMPLE,          /* sample/sample.cuh */
    MS_KERNEL_OP_MISC,            /* misc/elementwise.cuh: convert act->dtype, add, gather_rows;
                                     misc/encoder.cuh: layer_norm, gelu, im2col, bias_add */
    MS_KERNEL_OP_RMSNORM_HEADS,   /* norm/rmsnorm.cuh: per-head RMSNorm (Qwen3 q_norm / k_norm) */
    MS_KERNEL_OP_ATTN_DENSE,      /* attn/dense.cuh: attention over the step's own K/V rows */
    MS_KERNEL_OP_QMATMUL,         /* quant/qmatmul.cuh: GEMV over ggml blocks (1..8 x rows) and
                                     their dequantization to bf16 (one instance per ggml type) */
    MS_KERNEL_OP_COUNT
} ms_kernel_op;

/* Element type of an instance. ORDER MS_KERNEL_DTYPE. */
typedef enum ms_kernel_dtype {
    MS_KERNEL_DTYPE_BF16 = 0,
    MS_KERNEL_DTYPE_F16,
    MS_KERNEL_DTYPE_F32, /* logits of argmax / sample only */
    MS_KERNEL_DTYPE_COUNT
} ms_kernel_dtype;

/* RoPE pair layout; values match kRope* in templates/common/rope.cuh. */
typedef enum ms_kernel_rope {
    MS_KERNEL_ROPE_NONE = 0,        /* no rotation: plain KV write */
    MS_KERNEL_ROPE_NEOX = 1,        /* rotate-half (Hugging Face) */
    MS_KERNEL_ROPE_INTERLEAVED = 2, /* pairs (2i, 2i+1) (llama2.c, GPT-J) */
    MS_KERNEL_ROPE_COUNT
} ms_kernel_rope;

/* RoPE frequency scaling; values match kRopeScaling* in templates/common/rope.cuh. */
typedef enum ms_kernel_rope_scaling {
    MS_KERNEL_ROPE_SCALING_NONE = 0,
    MS_KERNEL_ROPE_SCALING_LLAMA3 = 1,
    MS_KERNEL_ROPE_SCALING_COUNT
} ms_kernel_rope_scaling;

/*
 * One kernel specialization: every compile-time choice. Fields an op does not use must be zero
 * (the constructors below do that), so equal instances have equal URIs.
 */
/* The largest KV page size the paged kernels (attention, rope_kv) take. */
#define MS_KERNEL_MAX_PAGE_SIZE 1024

typedef struct ms_kernel_spec {
    ms_kernel_op op;
    ms_kernel_dtype dtype;               /* KV pages and weights (logits type for argmax / sample) */
    ms_kernel_dtype act_dtype;           /* activations (q, o, x, k, v, ...); the constructors set
                                            it to dtype, set F32 for float32 activations */
    int head_dim;                        /* attention, rope_kv, rmsnorm_heads: elements per head */
    int page_size;                       /* attention, rope_kv: tokens per KV page, in
                                            1 .. MS_KERNEL_MAX_PAGE_SIZE */
    int group;                           /* attention: query heads per KV head (1 = MHA) */
    bool causal;                         /* prefill: mask keys after the query */
    bool windowed;                       /* attention: sliding window (size is a launch param) */
    bool add_residual;                   /* rmsnorm: fused residual add */
    ms_kernel_rope rope;                 /* rope_kv */
    ms_kernel_rope_scaling rope_scaling; /* rope_kv */
    bool mrope;                          /* rope_kv: M-RoPE position streams per section */
    int qtype;                           /* qmatmul: ggml block type (gguf_quant.h MS_GGML_TYPE_*:
                                            Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K or Q6_K) */
} ms_kernel_spec;

/* ---- constructors (zero the fields the op ignores) ---- */

ms_kernel_spec ms_kernel_spec_attn_decode(ms_kernel_dtype dt, int head_dim, int page_size,
                                          int group, bool windowed);
ms_kernel_spec ms_kernel_spec_attn_prefill(ms_kernel_dtype dt, int head_dim, int page_size,
                                           int group, bool causal, bool windowed);
ms_kernel_spec ms_kernel_spec_rope_kv(ms_kernel_dtype dt, int head_dim, int page_size,
                                      ms_kernel_rope rope, ms_kernel_rope_scaling scaling);
/* M-RoPE (Qwen2-VL) RoPE + KV write: frequencies from the table (no scaling variant), position
 * streams per section (ms_rope_kv_params.n_sections / sections / pos_stride). rope: NEOX or
 * INTERLEAVED. */
ms_kernel_spec ms_kernel_spec_rope_kv_mrope(ms_kernel_dtype dt, int head_dim, int page_size,
                                            ms_kernel_rope rope);
ms_kernel_spec ms_kernel_spec_rmsnorm(ms_kernel_dtype dt, bool add_residual);
/* Per-head RMSNorm (Qwen3 q_norm / k_norm) of head_dim elements per head; dt: the weight type
 * (activations: act_dtype, set it after the call). head_dim is shape (MS_HEAD_DIM in the
 * shape-free source, like attention and rope_kv): stem rmsnorm_heads_bf16_af32, URI
 * rmsnorm_heads_bf16_hd48_af32. */
ms_kernel_spec ms_kernel_spec_rmsnorm_heads(ms_kernel_dtype dt, int head_dim);
/* Dense attention (a node without a kv_pool, Whisper's encoder) over float32 q/k/v rows of
 * head_dim elements per head (1 .. 256): dtype and act_dtype F32, head_dim is
 * shape (MS_HEAD_DIM): stem attn_dense_f32, URI attn_dense_f32_hd64. */
ms_kernel_spec ms_kernel_spec_attn_dense(int head_dim);
/* op: MS_KERNEL_OP_SILU_MUL, _EMBED, _ARGMAX or _SAMPLE (dtype only). MISC: dtype is the
 * conversion target and the add / gather type is act_dtype (set it after the call). */
ms_kernel_spec ms_kernel_spec_simple(ms_kernel_op op, ms_kernel_dtype dt);
/* Quantized matmul over ggml type `qtype` (MS_GGML_TYPE_*): entries ms_qgemv_1 .. ms_qgemv_8
 * (y = x W^T for exactly that many float32 x rows; from 3 rows up y += x W^T when p.acc),
 * ms_qdequant_bf16 (W to bf16 for the GEMM of more rows), ms_qembed (embedding rows of a
 * quantized table as float32), ms_qgemv_acc_1, ms_qgemv_acc_2 (y += x W^T) and ms_qquant_x (x to
 * int8 per 32 values, templates/common/q8x.cuh, for the GEMVs above 2 rows of the
 * MS_QGEMV_PREQ_TYPE types), ms_qgemv_q_1, _q_2, ms_qgemv_qacc_1, _qacc_2 (those types' 1-2 row
 * GEMVs, set and add, on x quantized by the kernel that produced it; a trap for the others);
 * dtype bf16 (the dequantization target), act_dtype f32. URI qmatmul_q4_0_af32_sm90. */
ms_kernel_spec ms_kernel_spec_qmatmul(int qtype);
/*
 * The qmatmul instances for the ggml types types[n_types] of a checkpoint's quantized weights
 * (duplicates and types that stay dequantized at load, e.g. F16 or Q5_1, are skipped; the
 * supported set is ms_kernel_qmatmul_supported) into out[cap]; *n the count. Errors:
 * MS_ERR_CAPACITY.
 */
ms_status ms_kernel_specs_for_quant(const int *types, int n_types, ms_kernel_spec *out, int cap,
                                    int *n, ms_error *err);
/* True when qmatmul has an instance for ggml type `qtype` (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K,
 * Q6_K). */
bool ms_kernel_qmatmul_supported(int qtype);

/*
 * Check that this build's templates support the spec. MS_ERR_UNSUPPORTED names the value and the
 * supported ones (e.g. "attn_decode: head_dim 48 unsupported (8, 16, 32, 64, 128, 256)").
 */
ms_status ms_kernel_spec_check(const ms_kernel_spec *s, ms_error *err);

/*
 * Readable URI from every parameter, plus "_sm<arch>" when arch > 0, e.g.
 * attn_decode_bf16_hd128_ps16_g4_sm90, attn_prefill_bf16_hd64_ps16_g8_causal_win_sm80,
 * rope_kv_bf16_hd128_ps16_neox_llama3_sm90, rope_kv_bf16_hd32_ps16_neox_mrope_sm90,
 * rmsnorm_bf16_res_sm90, rmsnorm_heads_bf16_hd48_sm90; "_af32" before the arch when
 * the activation type differs from dtype (attn_decode_bf16_hd128_ps16_g4_af32_sm90). It names the generated source
 * file and keys the cubin cache. Fails on an invalid spec or when buf (cap bytes) is too small.
 */
ms_status ms_kernel_spec_uri(const ms_kernel_spec *s, int arch, char *buf, size_t cap,
                             ms_error *err);

/*
 * Instance source: a do-not-edit banner, the template's #include, the config preamble
 * (using / constexpr lines) and the extern "C" wrapper kernels named by ms_kernel_op_entry.
 * Byte-for-byte deterministic. *out is ms_malloc'd (caller frees).
 */
ms_status ms_kernel_spec_source(const ms_kernel_spec *s, char **out, ms_error *err);

/*
 * The URI of `s` without its shape fields (head_dim, page size, group) and without an arch, e.g.
 * attn_prefill_bf16_causal_win_af32: the name of a model's structural kernel instance, whose shape
 * comes from the checkpoint at load (mstarc build writes <stem>.cu). Errors as ms_kernel_spec_uri.
 */
ms_status ms_kernel_spec_stem(const ms_kernel_spec *s, char *buf, size_t cap, ms_error *err);

/*
 * The instance source without its banner: the template's #include, the config preamble and the
 * extern "C" wrappers. shape_macros: the shape fields are written as MS_HEAD_DIM, MS_PAGE_SIZE and
 * MS_GROUP, which the compiling side defines (mstarc's per-model instances); otherwise as the
 * spec's numbers (exactly the text of ms_kernel_spec_source after its first line). *out is
 * ms_malloc'd (caller frees).
 */
ms_status ms_kernel_spec_body(const ms_kernel_spec *s, bool shape_macros, char **out,
                              ms_error *err);

/*
 * The shape macros the compiling side puts in front of a shape-free instance (the text mstarc
 * writes to DIR/kernels/<stem>.cu): "#define MS_HEAD_DIM <hd>\n#define MS_PAGE_SIZE <ps>\n"
 * (attention also "#define MS_GROUP <g>\n"; rmsnorm_heads only "#define MS_HEAD_DIM <hd>\n"), then
 * "#line 1\n" so NVRTC's log numbers the lines of the instance file (ms_kernel_op_shape says
 * which). Ops without shape parameters get "". Written to buf (cap bytes).
 * Errors: those of ms_kernel_spec_check; MS_ERR_INVALID_ARG when buf is too small.
 */
ms_status ms_kernel_spec_shape_defines(const ms_kernel_spec *s, char *buf, size_t cap,
                                       ms_error *err);

/*
 * The guard of a shape-free instance source: "#if !defined(MS_HEAD_DIM) ..." over the macros of
 * ms_kernel_op_shape, an #error naming the stem and the missing macros, "#endif"; "" for ops
 * without shape parameters. The one text both the runtime (ms_kernel_spec_instance_source) and
 * mstarc (DIR/kernels/<stem>.cu) write. Written to buf (cap bytes). Errors: those of
 * ms_kernel_spec_stem; MS_ERR_INVALID_ARG when buf is too small.
 */
ms_status ms_kernel_spec_shape_guard(const ms_kernel_spec *s, char *buf, size_t cap,
                                     ms_error *err);

/*
 * The text the runtime compiles for an instance at load: ms_kernel_spec_shape_defines, a
 * do-not-edit comment, the guard that names the missing macros (shaped ops) and
 * ms_kernel_spec_body(s, true, ...). Apart from comments it is the text mstarc compiles for the
 * same spec (the shape defines followed by DIR/kernels/<stem>.cu), so both share one cubin cache
 * entry (nvrtc_cache.h hashes sources without their comments). *out is ms_malloc'd (caller frees).
 */
ms_status ms_kernel_spec_instance_source(const ms_kernel_spec *s, char **out, ms_error *err);

/*
 * Parse a comma-separated architecture list for `flag` ("sm_80,sm_90"; each item sm_XX, smXX,
 * compute_XX or XX with 50 <= XX <= 199) into archs[0..*n) (at most cap). MS_ERR_INVALID_ARG,
 * naming the flag and the item, for an empty list or item, a malformed or too old architecture
 * (sm_7, sm_abc) and a duplicate.
 */
ms_status ms_kernel_parse_arch_list(const char *flag, const char *text, int *archs, int cap,
                                    int *n, ms_error *err);

/* The shape macros an op's shape-free source reads (defined by the compiling side). */
typedef enum ms_kernel_shape {
    MS_KERNEL_SHAPE_NONE = 0, /* none: the stem is the whole structure */
    MS_KERNEL_SHAPE_HEAD_DIM, /* MS_HEAD_DIM (rmsnorm_heads) */
    MS_KERNEL_SHAPE_PAGED,    /* MS_HEAD_DIM, MS_PAGE_SIZE (rope_kv) */
    MS_KERNEL_SHAPE_GROUPED,  /* MS_HEAD_DIM, MS_PAGE_SIZE, MS_GROUP (attention) */
} ms_kernel_shape;

/* Which shape macros an op's source reads (MS_KERNEL_SHAPE_NONE for an invalid op). */
ms_kernel_shape ms_kernel_op_shape(ms_kernel_op op);

/* Template header of an op ("attn/decode.cuh"), NULL for an invalid op. */
const char *ms_kernel_op_header(ms_kernel_op op);

/* Name of entry `i` of an op's module (i = 0: main kernel; misc has convert, add, gather_rows,
 * then layer_norm, layer_norm_f32, gelu, im2col, im2col_f32, bias_add, bias_add_f32, select_rows: the _f32
 * entries take float weights / write float columns, the others the instance's dtype), NULL past
 * the last. */
const char *ms_kernel_op_entry(ms_kernel_op op, int i);
/* Short op name used in URIs ("attn_decode", ...). */
const char *ms_kernel_op_name(ms_kernel_op op);
/* Short dtype name used in URIs ("bf16", "f16", "f32"). */
const char *ms_kernel_dtype_name(ms_kernel_dtype dt);

/* ---- the instances a decoder model needs ---- */

/* What decides a decoder's kernel instances (read from config.json and the model file). */
typedef struct ms_kernel_model_shape {
    int head_dim;
    int n_q_heads;
    int n_kv_heads;
    int page_size;
    ms_kernel_rope rope;          /* NEOX (rotate-half), INTERLEAVED, or NONE (no RoPE) */
    bool windowed;                /* sliding-window attention */
    ms_kernel_dtype weight_dtype; /* bf16 or f16 (f32 weights need no template instance) */
    ms_kernel_dtype kv_dtype;     /* bf16 or f16 */
} ms_kernel_model_shape;

/*
 * The kernel instances the CUDA backend (backend_cuda.c) runs for a decoder of this shape with
 * float32 activations: attention decode and causal prefill, RoPE + KV write in the model's style
 * (frequencies come as a table, so no scaling variant; rope NONE: the plain KV write of a model
 * without RoPE; the M-RoPE variant for mrope), RMSNorm (without the residual add, which mstarc
 * puts in the linear before it: linear_add; and the per-head norm for qk_norm), the elementwise helpers, SiLU-and-multiply, embedding, argmax
 * and sampling. Writes up to cap specs to out and
 * their number to *n. MS_ERR_UNSUPPORTED (naming the value) when a shape is outside the templates;
 * MS_ERR_CAPACITY when cap is too small. Used by the CI test that compiles every instance of the
 * repository's models; precompiling a model (mstarc --arch --config, `kernels`) takes the exact
 * set of ms_kernel_specs_for_stems instead.
 */
ms_status ms_kernel_specs_for_decoder(const ms_kernel_model_shape *shape, ms_kernel_spec *out,
                                      int cap, int *n, ms_error *err);

/*
 * ms_kernel_specs_for_decoder for a decoder variant: qk_norm adds the per-head RMSNorm of q and k
 * (Qwen3 q_norm / k_norm, rmsnorm_heads with the shape's head_dim and weight dtype); mrope takes
 * the M-RoPE RoPE + KV write (Qwen2-VL mrope_section) instead of the plain one. Errors as
 * ms_kernel_specs_for_decoder.
 */
ms_status ms_kernel_specs_for_decoder_variant(const ms_kernel_model_shape *shape, bool qk_norm,
                                              bool mrope, ms_kernel_spec *out, int cap, int *n,
                                              ms_error *err);

/*
 * The instances a model loads for a checkpoint of this shape, exact: of every variant the CUDA
 * backend can request for the shape (attention decode at shape->windowed, prefill causal and not,
 * RoPE + KV write plain and M-RoPE in shape->rope, RMSNorm with and without the residual add,
 * the per-head RMSNorm, embedding, elementwise helpers, SiLU-and-multiply, argmax, sampling;
 * float32 activations), those whose stem (ms_kernel_spec_stem) is in stems[0..n_stems): the
 * list mstarc emitted for the model (ms_model_desc.kernels, the files DIR/kernels/<stem>.cu). A
 * stem of a variant this shape does not take (the windowed attention of an unwindowed
 * checkpoint) matches nothing. Order: that of ms_kernel_specs_for_decoder_variant. Errors as
 * ms_kernel_specs_for_decoder (only the listed specs are checked).
 */
ms_status ms_kernel_specs_for_stems(const ms_kernel_model_shape *shape, const char *const *stems,
                                    int n_stems, ms_kernel_spec *out, int cap, int *n,
                                    ms_error *err);

/* ---- host planning for the attention kernels ---- */

/*
 * Prefill tile list: request b with n_q = qo_indptr[b+1] - qo_indptr[b] query tokens packs
 * n_q * group rows into ceil(n_q * group / MS_ATTN_PREFILL_ROWS) tiles. Writes tile_req[i] (the
 * request) and tile_idx[i] (tile number within it) for every tile, in request order, and
 * *n_tiles. tile_req / tile_idx may be NULL to only count. MS_ERR_CAPACITY when more than cap
 * tiles are needed; MS_ERR_INVALID_ARG for a decreasing qo_indptr.
 */
ms_status ms_kernel_attn_prefill_tiles(const int32_t *qo_indptr, int batch, int group,
                                     int32_t *tile_req, int32_t *tile_idx, int cap,
                                     int *n_tiles, ms_error *err);

/*
 * Decode KV split: pick n_splits and pages_per_split so that the batch * n_kv_heads * n_splits
 * CTAs fit in one wave of n_slots resident CTAs (multiprocessors x ms_cuda_module.blocks_per_sm)
 * without splits shorter than min_pages pages: a second, partial wave would leave most of the
 * device idle while it runs. Batches with at least n_slots (request, KV head) pairs get no
 * split. max_pages is the longest view's page count. Always n_splits >= 1 and
 * n_splits * pages_per_split >= max_pages; n_splits <= max_splits (the partial buffers' size).
 */
void ms_kernel_attn_decode_split(int batch, int n_kv_heads, int max_pages, int n_slots,
                               int min_pages, int max_splits, int *n_splits,
                               int *pages_per_split);

#ifdef __cplusplus
}
#endif
#endif /* MS_KERNEL_H */
