/*
 * model_desc.h - the contract between the C that mstarc generates for a model and the runtime's
 * generic engine (engine.h). The code generator is written against this header.
 *
 * A model file (models/llama.mstar) compiles into ONE `const ms_model_desc` object plus the few
 * functions it points to. The generated side stays small and mechanical: static tables that mirror
 * the source's config, weights, resources and steps, switch functions that evaluate the source's
 * config expressions, and a forward function that is a straight line of ms_backend_i calls over
 * buffers planned up front. Everything else (reading config.json and checkpoints, validating and
 * uploading weights, building resources through the step runner, batching, sampling, stopping,
 * context limits, the CLI) is the engine's.
 *
 * What generated code supplies (in the order a generator emits it):
 *   1. config: a model-specific struct (`config_size` bytes) and `config_load`, which fills it
 *      from config.json through ms_md_cfg_get (typed parameters; sources tried in order;
 *      defaults; optional values with a presence flag; derived `let` values computed last).
 *   2. shape facts: `facts` fills ms_md_facts from the struct (layers, heads, KV heads, head_dim,
 *      hidden, vocab, max context, RoPE config incl. style and llama3 scaling, sliding window,
 *      default page size, bos/eos ids, the step budget of the forward's workspace).
 *   3. weights: a static ms_md_weight table (checkpoint name templates with {i} expanded per
 *      layer, alternatives, optional tensors, ties, fusion: a FUSED entry is the row-wise
 *      concatenation of its PART entries, loaded once at startup, so Q/K/V and gate/up run as
 *      one GEMM each), `weight_shape` (dims per entry) and `weight_tied` (tie conditions).
 *   4. resources: a static ms_md_resource table for each node in dependency order (KV first),
 *      whose index is the resource index of ms_step.records (what mstarc's sema computed).
 *   5. steps: static ms_md_step declarations (prefill: main += len(tokens); decode: main += 1;
 *      their per-resource records and capture buckets).
 *   6. forward: `forward` queues the model on a backend for one staged step, reading its weights
 *      with ms_md_weight_get and carving activations out of a workspace sized up front by
 *      `workspace_size` for the worst-case step (no allocation on the decode hot path).
 *
 * Conventions fixed by this contract:
 *   - weights are addressed by (weight index, layer); per-layer entries have `n_layers` instances,
 *     others one (layer 0). PART entries have no tensor of their own (the forward reads the FUSED
 *     entry); an absent optional tensor is a tensor with data == NULL.
 *   - the forward's outputs are the logits of the LAST token of each view of the step, in view
 *     order: [n_seqs, vocab] float32, which the engine samples.
 *   - one node (`decoder`) is implemented by the engine today; the node table exists so encoder
 *     and cross-attention nodes can be described the same way later.
 *
 * Mapping from the checked model (compiler/model.h) to what a generator emits:
 *   - ms_param (declaration order): a field of the config struct (int64_t / double / bool /
 *     const char *; an optional `x: T?` adds `bool has_x`), read by one ms_md_cfg_<type> call
 *     with its `sources` (a static array) and its default (NULL when it has none; a default that
 *     is an expression over earlier params is evaluated into a local first); `let` params are
 *     computed after every read param; constraints that depend on config values go through
 *     ms_md_cfg_check.
 *   - resource arguments become `facts` assignments: kv_pool(layers, kv_heads, head_dim,
 *     page_size, dtype, retention = window(W)) -> n_layers, n_kv_heads, head_dim, page_size,
 *     kv_dtype, window; rope(theta, style, scaling = llama3(...)) -> rope.*; attention(q_heads,
 *     window) -> n_q_heads, window; sampler(vocab) -> vocab. hidden comes from the embedding's
 *     width, max_context from the `max_position_embeddings` param.
 *   - ms_weight (with the lowering's fusion groups): one ms_md_weight row each, PART rows for
 *     fused members and one FUSED row per group; per-layer groups set per_layer; `or w if cond`
 *     sets tie (weight_tied evaluates cond); `or w` alone sets tie + tie_if_missing;
 *     weight_shape is a switch over rows evaluating the shape expressions.
 *   - ms_resource in resource-index order: ms_md_resource rows (key, kind, dep keys).
 *   - ms_step_decl: one ms_md_step per step (`prefill` spans len(tokens), `decode` spans 1).
 *   - the kernel instances of ms_codegen_kernels (DIR/kernels/<stem>.cu): a static array of their
 *     stems, `kernels` (none, NULL and 0, when the model's kernels are not expressible).
 *   - the forward's op list: one backend call per op on views of the workspace, whose layout
 *     (one slice per planned buffer, 64-byte aligned) is a static function of (max_tokens,
 *     max_seqs) shared by workspace_size and forward.
 *
 * Ownership: a descriptor is static, read-only data; functions it points to borrow their
 * arguments. ms_md_* helpers borrow theirs.
 *
 * Usage (what a generated file looks like; tests/llama_desc_ref.c is the golden example):
 *     static ms_status llama_config_load(const ms_hf_config *hf, void *out, ms_error *err) {
 *         llama_config *c = out;
 *         static const char *const src_hidden[] = {"hidden_size"};
 *         MS_TRY(ms_md_cfg_int(hf, src_hidden, 1, NULL, &c->hidden_size, err));
 *         ...
 *     }
 *     const ms_model_desc ms_llama_desc = {.name = "llama", .config_load = llama_config_load, ...};
 */
#ifndef MS_MODEL_DESC_H
#define MS_MODEL_DESC_H

#include "backend.h"
#include "hf_config.h"
#include "ms_base.h"
#include "resource.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- config ---- */

/*
 * Read one config parameter: the first of sources[0..n_sources) present (not null) in config.json
 * wins; else *dflt when dflt != NULL; else, when `present` != NULL (an optional parameter,
 * `x: int?`), *present = false and *out is left as is; else MS_ERR_NOT_FOUND
 * "<config.json>: required field 'x' is missing". A present value of the wrong type is
 * MS_ERR_FORMAT naming the field. `present` (may be NULL) is set true when a value was found or
 * the default applied.
 */
ms_status ms_md_cfg_int(const ms_hf_config *hf, const char *const *sources, int n_sources,
                        const int64_t *dflt, int64_t *out, bool *present, ms_error *err);
ms_status ms_md_cfg_float(const ms_hf_config *hf, const char *const *sources, int n_sources,
                          const double *dflt, double *out, bool *present, ms_error *err);
ms_status ms_md_cfg_bool(const ms_hf_config *hf, const char *const *sources, int n_sources,
                         const bool *dflt, bool *out, bool *present, ms_error *err);
/* Strings are borrowed from hf (valid while the config lives; the engine keeps it). */
ms_status ms_md_cfg_string(const ms_hf_config *hf, const char *const *sources, int n_sources,
                           const char *dflt, const char **out, bool *present, ms_error *err);

/*
 * Check a derived or loaded value: `cond` false gives MS_ERR_FORMAT
 * "<config.json>: <what>" (e.g. "hidden_size (100) is not a multiple of num_attention_heads (3)").
 * Generated code calls it for the shape constraints sema could not prove statically.
 */
ms_status ms_md_cfg_check(const ms_hf_config *hf, bool cond, ms_error *err, const char *fmt, ...)
    MS_PRINTF(4, 5);

/* ---- shape facts ---- */

#define MS_MD_MAX_EOS 8

/* What the engine needs to know about a loaded model (one decoder node). */
typedef struct ms_md_facts {
    int32_t n_layers;       /* decoder layers (instances of per-layer weights) */
    int32_t n_q_heads;      /* query heads */
    int32_t n_kv_heads;     /* KV heads (divides n_q_heads) */
    int32_t head_dim;       /* per head */
    int32_t hidden;         /* model width */
    int32_t vocab;          /* logits per token */
    int32_t max_context;    /* positions the model was trained for (max_position_embeddings);
                               a sequence never holds more tokens than this */
    ms_rope_config rope;    /* style (rotate-half / interleaved), theta, llama3 scaling */
    int32_t window;         /* sliding window in tokens (attention mask and KV retention); 0 none */
    int32_t page_size;      /* default KV page size (the kv_pool's page_size argument) */
    ms_dtype kv_dtype;      /* KV dtype the model asks for on a device backend (CPU uses f32) */
    /* filled by the engine from config.json / generation_config.json (generated code leaves
       them): */
    int32_t bos_id;         /* bos_token_id, -1 none */
    int32_t eos_ids[MS_MD_MAX_EOS]; /* stop ids */
    int32_t n_eos;
} ms_md_facts;

/* ---- weights ---- */

/* ORDER MS_MD_WEIGHT_KIND */
typedef enum ms_md_weight_kind {
    MS_MD_WEIGHT_TENSOR = 0, /* a checkpoint tensor in its own buffer */
    MS_MD_WEIGHT_PART,       /* a checkpoint tensor loaded into rows of a FUSED entry */
    MS_MD_WEIGHT_FUSED,      /* no checkpoint tensor: rows = its parts concatenated in order */
    MS_MD_WEIGHT_KIND_COUNT
} ms_md_weight_kind;

#define MS_MD_MAX_NAMES 2
#define MS_MD_MAX_PARTS 4

/* One declared weight (a row of the generated weight table). */
typedef struct ms_md_weight {
    const char *key;                     /* DSL name, e.g. "layers.wq", "lm_head" (messages) */
    ms_md_weight_kind kind;
    const char *names[MS_MD_MAX_NAMES];  /* checkpoint name templates tried in order; "{i}" is the
                                            layer index; unused entries NULL (FUSED: none) */
    bool per_layer;                      /* one instance per layer ("{i}" in the names) */
    bool optional;                       /* may be absent: data NULL (the forward skips it) */
    int32_t rank;                        /* 1 or 2 */
    int32_t tie;                         /* index of the weight used instead (declared earlier
                                            in the table) when weight_tied() says so (DSL
                                            `or embed if cond`), or, with tie_if_missing, when
                                            this tensor is absent (`or embed`); -1 none */
    int32_t fused;                       /* PART: index of its FUSED entry; else -1 */
    int32_t parts[MS_MD_MAX_PARTS];      /* FUSED: indices of its parts in row order */
    int32_t n_parts;                     /* FUSED: 2..MS_MD_MAX_PARTS; else 0 */
    bool tie_if_missing;                 /* the tie has no condition: it applies exactly when
                                            the checkpoint lacks this tensor */
} ms_md_weight;

/* ---- resources ---- */

#define MS_MD_MAX_DEPS 4

/* One resource of a node, in dependency order (its position is its resource index). The
 * engine takes the parameters of each kind from ms_md_facts (kv: layers, kv heads, head_dim,
 * page size, retention = window; pos: sequential scheme + rope; attn: q heads, window;
 * sampler: vocab). */
typedef struct ms_md_resource {
    const char *key;                      /* "kv", "pos", "attn", "sample" */
    ms_resource_kind kind;
    const char *deps[MS_MD_MAX_DEPS];     /* keys it reads plan results of */
    int32_t n_deps;
} ms_md_resource;

/* ---- steps ---- */

/* How a step's main segment span is formed. ORDER MS_MD_SPAN */
typedef enum ms_md_span {
    MS_MD_SPAN_TOKENS = 0, /* segments main += len(tokens) */
    MS_MD_SPAN_ONE,        /* segments main += 1 */
    MS_MD_SPAN_COUNT
} ms_md_span;

#define MS_MD_MAX_BUCKETS 16

/* One step declaration (the records the engine puts in ms_step.records[resource index]). */
typedef struct ms_md_step {
    const char *name;                      /* "prefill", "decode" */
    ms_md_span span;
    ms_label label;                        /* stream the segment extends (MS_LABEL_MAIN) */
    bool kv_commit;                        /* kv record: lengths advance at commit */
    bool attn_causal;                      /* attention record: causal mask */
    int32_t pos_advance;                   /* positions advance per segment; 0 = the scheme's
                                              rule (span) */
    bool capture_by_tokens;                /* capture buckets count tokens (prefill) or rows */
    int32_t buckets[MS_MD_MAX_BUCKETS];    /* capture buckets, ascending (CUDA graphs) */
    int32_t n_buckets;
} ms_md_step;

/* ---- forward ---- */

/* Everything one forward call sees. Built by the engine per step. */
typedef struct ms_md_forward_args {
    const ms_backend *be;            /* the backend ops are queued on */
    const void *config;              /* the model's config struct */
    const ms_md_facts *facts;
    const ms_tensor *weights;        /* read through ms_md_weight_get */
    const int32_t *weight_offset;    /* [n_weights] first tensor of entry w in `weights` */
    const ms_paged_kv *kv;           /* the KV page arena */
    const ms_attn_batch *batch;      /* the step's staged plan (views, write addresses) */
    const ms_tensor *tokens;         /* [n_tokens] i32, backend memory, packed segment order */
    const ms_tensor *positions;      /* [n_tokens] i32, backend memory (positions resource) */
    const ms_rope_table *rope;       /* inv_freq in backend memory */
    ms_attn_params attn;             /* scale, window, causal (from the step declaration) */
    void *workspace;                 /* backend memory of workspace_size(max_tokens, max_seqs) */
    int32_t max_tokens;              /* the workspace's token capacity (layout is fixed by it) */
    int32_t max_seqs;                /* the workspace's row capacity */
    ms_tensor *logits;               /* out: [batch->n_seqs, vocab] f32, backend memory */
} ms_md_forward_args;

/* Tensor of weight entry `w`, layer `layer` (0 for global weights). Data NULL when an optional
 * tensor is absent. */
static inline const ms_tensor *ms_md_weight_get(const ms_md_forward_args *a, int32_t w,
                                                int32_t layer) {
    return &a->weights[a->weight_offset[w] + layer];
}

/* ---- the descriptor ---- */

/* A compiled model. Generated as one `const ms_model_desc ms_<model>_desc`. */
typedef struct ms_model_desc {
    const char *name;             /* model name ("llama") */
    const char *source;           /* model file it was generated from ("models/llama.mstar") */

    /* config */
    size_t config_size;           /* bytes of the model's config struct (zeroed before load) */
    ms_status (*config_load)(const ms_hf_config *hf, void *config, ms_error *err);
    ms_status (*facts)(const void *config, ms_md_facts *out, ms_error *err);

    /* weights */
    const ms_md_weight *weights;  /* [n_weights] */
    int32_t n_weights;
    /* Dims of entry w (FUSED: the concatenation) into shape[rank]. */
    void (*weight_shape)(const void *config, int32_t w, int64_t *shape);
    /* Whether entry w is replaced by its `tie` entry under this config (DSL `or x if cond`). */
    bool (*weight_tied)(const void *config, int32_t w);

    /* the decoder node */
    const ms_md_resource *resources; /* [n_resources] in dependency order */
    int32_t n_resources;
    const ms_md_step *prefill;    /* the step that consumes a prompt */
    const ms_md_step *decode;     /* the step that consumes one sampled token */

    /* forward */
    /* Bytes of workspace the forward needs for steps of up to max_tokens tokens over max_seqs
     * views (the layout depends only on these capacities). */
    size_t (*workspace_size)(const void *config, int32_t max_tokens, int32_t max_seqs);
    /* Queue one step's forward. Errors: the first failing op's status and message. */
    ms_status (*forward)(const ms_md_forward_args *args, ms_error *err);

    /* CUDA kernel instances */
    /* [n_kernels] stems (ms_kernel_spec_stem, e.g. "rmsnorm_heads_bf16_af32") of every kernel
     * instance the forward can load on the CUDA backend: exactly the files mstarc writes to
     * DIR/kernels/<stem>.cu, config-dependent variants included (both attention variants of a
     * conditional window, both RoPE styles of a conditional style). The instances a checkpoint
     * loads are those of ms_kernel_specs_for_stems at its shape (the `kernels` verb and
     * `mstarc build --arch --config` both take them so): which norms (residual, per-head), which
     * RoPE + KV write (plain, none, M-RoPE) are facts of this list, not guessed from weights. */
    const char *const *kernels;
    int32_t n_kernels;            /* 0: no CUDA instances (a model the templates cannot express, or
                                     a hand-written descriptor): the `kernels` verb refuses it */
} ms_model_desc;

/*
 * Expand a name template: "{i}" becomes the decimal `layer` (other text is copied). Writes at most
 * cap bytes (NUL included); MS_ERR_LIMIT when it does not fit.
 */
ms_status ms_md_expand_name(const char *tmpl, int32_t layer, char *buf, size_t cap,
                            ms_error *err);

/*
 * Check a descriptor's tables for consistency (what a code generator bug would break), without a
 * config: every function pointer set; weights: kind valid, rank 1 or 2, TENSOR/PART entries name
 * at least one template (a per-layer one containing "{i}", a global one none), a tie points to an
 * earlier TENSOR/FUSED entry of the same rank and layering, a PART names a FUSED entry that lists
 * it, a FUSED entry has 2..MS_MD_MAX_PARTS PART entries of its rank and layering, each listing it;
 * resources: unique keys, dependencies among earlier keys (dependency order), at most one of each
 * kind; steps: spans valid, buckets ascending; kernels: n_kernels >= 0, each stem a non-empty
 * string (kernels non-NULL when n_kernels > 0). Errors: MS_ERR_INVALID_ARG
 * "model <name>: weight 'x': <problem>". The engine runs it first at init.
 */
ms_status ms_md_check_desc(const ms_model_desc *d, ms_error *err);

/*
 * Check the facts of a loaded config (d->facts' output): a positive KV page size and a
 * non-negative window. Errors: MS_ERR_FORMAT naming the model and the value.
 */
ms_status ms_md_check_facts(const ms_model_desc *d, const ms_md_facts *f, ms_error *err);

/*
 * Check a descriptor's shapes under a loaded config: every dim positive, and each FUSED entry's
 * rows the sum of its parts' rows with equal trailing dims; and its facts (ms_md_check_facts).
 * Errors: MS_ERR_FORMAT naming the entry and the dims (or the fact).
 */
ms_status ms_md_check_shapes(const ms_model_desc *d, const void *config, ms_error *err);

/* Resource index of `key` in the descriptor's table, or -1. */
int32_t ms_md_resource_index(const ms_model_desc *d, const char *key);

#ifdef __cplusplus
}
#endif
#endif /* MS_MODEL_DESC_H */
