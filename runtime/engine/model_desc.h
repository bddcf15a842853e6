/*
 * model_desc.h - the contract between the C that mstarc generates for a model and the runtime's
 * generic engine (engine.h). The code generator is written against this header.
 *
 * A model file (models/llama.mstar) compiles into ONE `const ms_model_desc` object plus the few
 * functions it points to. The generated side stays small and mechanical: static tables that mirror
 * the source's config, weights, nodes (resources, labels, steps) and walks, switch functions that
 * evaluate the source's config expressions, and per node a forward function that is a straight
 * line of ms_backend_i calls over buffers planned up front. Everything else (reading config.json and checkpoints, validating and
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
 *   4. per node (`nodes`: one ms_md_node each, in declaration order), its tables:
 *      a. resources: a static ms_md_resource table in dependency order (KV first), whose index
 *         is the resource index of ms_step.records (what mstarc's sema computed), each row with
 *         the resource's declared keyed arguments as data (ms_md_arg: key and the value's
 *         source text, for tools and messages; the values the runtime uses come from facts);
 *      b. labels: the node's stream label names (main first);
 *      c. steps: per declared step an ms_md_step row and a generated step runner that fills the
 *         step's declaration (ms_step: segments, KV / positions / attention / sampler records)
 *         for a batch of rows through the ms_md_step_* helpers below;
 *      d. forward: the node's `forward` queues it on a backend for one staged step, reading its
 *         weights with ms_md_weight_get and carving activations out of a workspace sized up
 *         front by its `workspace_size` for the worst-case step (no allocation on the decode
 *         hot path).
 *   5. walks (model-level, they may cross nodes): ms_md_walk as data, items (node, step) pairs
 *      (ms_md_walk_item) in order, `then` sequences flattened, `loop ... until stop` as a range.
 *   (mstarc emits each node's resources, labels and steps, then the walks, then the forward,
 *   then the `<model>_nodes` table that points to them.)
 *
 * Conventions fixed by this contract:
 *   - weights are addressed by (weight index, layer); per-layer entries have `n_layers` instances,
 *     others one (layer 0). PART entries have no tensor of their own (the forward reads the FUSED
 *     entry); an absent optional tensor is a tensor with data == NULL.
 *   - the forward's outputs are the logits of the LAST token of each view of the step, in view
 *     order (or, with ms_md_forward_args.out_rows, of the rows it lists: a step declared with
 *     `attn causal = false`, a block step of dense generation, returns every token's logits): [n_seqs, vocab] float32, which the engine samples.
 *   - resource indices, label values (ms_label) and step indices are per node; a walk item names
 *     its node. Generated names carry the node: `<model>_<node>_run_<step>`,
 *     `<model>_<node>_forward`, `<model>_<node>_workspace_size`, `<model>_<node>_facts`, buffer
 *     enums `B_<NODE>_*`. The engine runs descriptors of 1..MS_MD_MAX_NODES nodes, each with its
 *     own KV pool, positions, attention and sampler (engine.h) under its own facts (KV layout,
 *     heads, what its streams hold); the model's facts (vocabulary, context, sampling defaults)
 *     are the first sampling node's, and its RoPE table is shared, so mstarc build lowers a
 *     later node's rope only when it equals the first node's (compiler/lower_check.c).
 *
 * Mapping from the checked model (compiler/model.h) to what a generator emits:
 *   - ms_param (declaration order): a field of the config struct (int64_t / double / bool /
 *     const char * / ms_md_int_list for `int[]`; an optional `x: T?` adds `bool has_x`), read by
 *     one ms_md_cfg_<type> call (ms_md_cfg_int_list for `int[]`)
 *     with its `sources` (a static array) and its default (NULL when it has none; a default that
 *     is an expression over earlier params is evaluated into a local first); `let` params are
 *     computed after every read param; constraints that depend on config values go through
 *     ms_md_cfg_check.
 *   - resource arguments become `facts` assignments: kv_pool(layers, kv_heads, head_dim,
 *     page_size, dtype, retention = window(W)) -> n_layers, n_kv_heads, head_dim, page_size,
 *     kv_dtype, window; rope(theta, style, scaling = llama3(...), sections) -> rope.* (sections:
 *     rope.n_sections / rope.sections, checked in config_load by ms_md_cfg_check_sections); attention(q_heads,
 *     window) -> n_q_heads, window; sampler(vocab) -> vocab. hidden comes from the embedding's
 *     width, max_context from the `max_position_embeddings` param.
 *   - ms_weight (with the lowering's fusion groups): one ms_md_weight row each, PART rows for
 *     fused members and one FUSED row per group; per-layer groups set per_layer; `or w if cond`
 *     sets tie (weight_tied evaluates cond); `or w` alone sets tie + tie_if_missing;
 *     weight_shape is a switch over rows evaluating the shape expressions.
 *   - ms_node (ms_model.nodes, in order): one ms_md_node row of `<model>_nodes` (name, the
 *     tables below named `<model>_<node>_resources` / `_labels` / `_steps`, the forward).
 *   - ms_resource in resource-index order: ms_md_resource rows (key, kind, dep keys, and the
 *     keyed arguments of its constructor call in source order as `<model>_<node>_<res>_args`:
 *     the key as written and the canonical source text of the value (print.h), e.g.
 *     {"page_size", "16"}, {"window", "has(sliding_window) ? sliding_window : none"}; positional
 *     arguments are the dependencies; defaults not written are not listed).
 *   - labels: the node's label names (main first), `labels`.
 *   - ms_step_decl: one ms_md_step per step with its generated runner `<model>_run_<step>`:
 *     for each segment declaration (in order) and each row, one ms_md_step_segment call with the
 *     span expression in C (len(tokens) is rows[r].len[<the segment's label>]); then one ms_md_step_<kind> call per resource
 *     the step uses (kv: commit, combined labels and forks as static arrays; pos: custom
 *     advance, explicit ids; attn: causal; sampler) with its resource index.
 *   - walks: one ms_md_walk each: its node.step items flattened into (node index, step index
 *     within that node) pairs, the loop's range.
 *   - the kernel instances of ms_codegen_kernels (DIR/kernels/<stem>.cu): a static array of their
 *     stems, `kernels` (none, NULL and 0, when the model's kernels are not expressible).
 *   - `ignore "visual.*";` patterns of the weights blocks: a static array, `ignored` (none: NULL
 *     and 0).
 *   - a node without a sampler (an encoder): its forward returns every token's row
 *     (`hidden_width`); a shaped forward parameter (`features: [C, L]` read as transpose(x), or
 *     a cross resource's context rows `audio: [_, d]`) becomes ms_md_forward_args.input
 *     (`input_shape`; -1 rows: the step's context rows, `A` in the generated forward;
 *     -2 rows [inputs_embeds]: one row per token of a sampling node's step, `frames: [_, H]`
 *     standing for embedding(table, tokens), run through ms_engine_run_rows; the forward may
 *     carry its residual stream in those rows; -3 rows [codes]: one row of int32 ids per token,
 *     `codes: [_, G] ids`, run through ms_engine_run_codes and staged codebook-major: column c
 *     of the T rows at c * T);
 *     `xattn.write(k, v)` a kv_write through context_batch guarded by A > 0, `xattn.run(q)` an
 *     attention through cross_batch (cross_attn: not causal); the cross record marks the
 *     resource used (ms_md_step_cross);
 *   - the forward's op list: one backend call per op on views of the workspace, whose layout
 *     (one slice per planned buffer, 64-byte aligned) is a static function of (max_tokens,
 *     max_seqs) shared by workspace_size and forward.
 *
 * Ownership: a descriptor is static, read-only data; functions it points to borrow their
 * arguments. ms_md_* helpers borrow theirs.
 *
 * Usage (what a generated file looks like; the tests/codegen goldens are examples):
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
#include "kernel.h"
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
/* Most elements of an `int[]` config parameter (mrope_section has 3). */
#define MS_MD_MAX_LIST 8

/* The value of an `int[]` config parameter: a field of the generated config struct. */
typedef struct ms_md_int_list {
    int32_t n;                    /* elements, 0 .. MS_MD_MAX_LIST */
    int64_t v[MS_MD_MAX_LIST];    /* [n], each within int32 */
} ms_md_int_list;

/*
 * An `int[]` parameter (`mrope_section: int[] from "rope_parameters.mrope_section"`): the first
 * present source, else *dflt, else absent / missing as for ms_md_cfg_int. The value must be a JSON
 * array of integers (a bare integer counts as a list of one, as config.json's eos_token_id does):
 * MS_ERR_FORMAT "<config.json>: field 'k' is a string, expected a list of integers" or
 * "field 'k'[1] is a real number, expected an integer"; more than MS_MD_MAX_LIST elements is
 * MS_ERR_LIMIT "field 'k' has 9 entries, at most 8 supported"; an element past int32 is
 * MS_ERR_FORMAT naming it.
 */
ms_status ms_md_cfg_int_list(const ms_hf_config *hf, const char *const *sources, int n_sources,
                             const ms_md_int_list *dflt, ms_md_int_list *out, bool *present,
                             ms_error *err);
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

/*
 * Check a rope resource's M-RoPE sections (`what`: their source text, e.g. "mrope_section") for
 * a rotary width of rotary_dim: none (n 0: plain RoPE) passes; otherwise 1..MS_ROPE_MAX_SECTIONS
 * non-negative sections summing to rotary_dim / 2, else MS_ERR_FORMAT "<config.json>:
 * mrope_section [4, 6, 5] covers 15 rotary pairs, rotary_dim 32 has 16".
 */
ms_status ms_md_cfg_check_sections(const ms_hf_config *hf, const char *what, ms_md_int_list sec,
                                   int64_t rotary_dim, ms_error *err);

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
    ms_rope_config rope;    /* style (rotate-half / interleaved), theta, llama3 scaling,
                               M-RoPE sections (n_sections 0: one position stream) */
    int32_t window;         /* sliding window in tokens (attention mask and KV retention); 0 none */
    int32_t page_size;      /* default KV page size (the kv_pool's page_size argument) */
    bool no_kv;             /* a node without a kv_pool (dense attention over its step's own
                               rows): no pages, page_size 0 and kv_dtype unused */
    ms_dtype kv_dtype;      /* KV dtype the model asks for on a device backend (CPU uses f32) */
    float attn_scale;       /* attention(scale = ...): softmax scale; 0 = 1 / sqrt(head_dim) */
    /* sampler(temperature = ..., top_k = ..., top_p = ...): the request defaults (the CLI's
       flags override them); the language's defaults are 1.0, off (0), off (1.0) */
    float temperature;
    int32_t top_k;
    float top_p;
    /* filled by the engine from config.json / generation_config.json (generated code leaves
       them): */
    int32_t bos_id;         /* bos_token_id, -1 none */
    int32_t eos_ids[MS_MD_MAX_EOS]; /* stop ids */
    int32_t n_eos;
    /* [scratch] a node on a scratch KV: its `rows` (the batch rows its buffer holds; the engine
       takes min(rows, max_seqs)); 0 otherwise (generated code sets it) */
    int32_t scratch_rows;
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
    int32_t rank;                        /* 1, 2, or 3 (conv1d [out, in, kernel]) */
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

/* One declared argument of a resource, as data: its key and the source text of its value in the
 * canonical spelling of `mstarc dump` ({"page_size", "16"}, {"window", "has(sliding_window) ?
 * sliding_window : none"}). For tools and messages (a dump, `kernels --list`); the values the
 * runtime uses come through ms_md_facts, evaluated by the generated `facts` under the loaded
 * config, never from this text. */
typedef struct ms_md_arg {
    const char *key;                      /* the constructor key, e.g. "page_size" */
    const char *text;                     /* the value's source text */
} ms_md_arg;

/* One resource of a node, in dependency order (its position is its resource index). The
 * engine takes the parameters of each kind from ms_md_facts (kv: layers, kv heads, head_dim,
 * page size, retention = window; pos: sequential scheme + rope; attn: q heads, window;
 * sampler: vocab); `args` are the declared arguments as text (ms_md_arg). */
typedef struct ms_md_resource {
    const char *key;                      /* "kv", "pos", "attn", "sample" */
    ms_resource_kind kind;
    const char *deps[MS_MD_MAX_DEPS];     /* keys it reads plan results of */
    int32_t n_deps;
    const ms_md_arg *args;                /* [n_args] the keyed arguments given in the source,
                                             in declaration order (defaults not listed); NULL
                                             when n_args is 0 */
    int32_t n_args;
} ms_md_resource;

/* ---- steps: generated step runners ---- */

#define MS_MD_MAX_BUCKETS 16
#define MS_MD_MAX_AXES 3        /* explicit position axes (t/h/w M-RoPE ids) */
#define MS_MD_MAX_STEPS 64      /* steps of a node */

/*
 * One batch row handed to a step runner: one request standing at this step. A step has one token
 * input (`step prefill(tokens)`), and a request's input holds one token list per stream it feeds:
 * a CFG pair's prompt is the prompt for `main` and the negative prompt for `cfg_uncond`; in a
 * loop step every stream gets the last sampled id. So `len(tokens)` in the segment of label l is
 * len[l], and that segment's tokens are the row's tokens for stream l.
 */
typedef struct ms_md_row {
    ms_rid rid;
    int32_t len[MS_MAX_LABELS];     /* tokens of the input for stream label l this step */
    bool sample;                    /* the row samples an id after this step (its inputs end
                                       here; false for a prompt chunk that is not the last) */
    const int32_t *position_ids;    /* [n_position_axes][tokens of the row, in its segments'
                                       order] explicit ids for a `pos explicit` step, or NULL */
    int32_t n_position_axes;        /* 1 or 3 (M-RoPE t/h/w) when position_ids != NULL */
    int32_t position_stride;        /* ids between one axis and the next; 0 = the row's tokens */
} ms_md_row;

/* Sampler record of a step (the sampler resource reads it at plan and commit). */
typedef struct ms_sample_step {
    const bool *sample;    /* [n_segments] the segment's last-token logits give the row's id */
    const int32_t *guide;  /* [n_segments] batched CFG: index of the segment whose logits are the
                              unconditional side mixed into this one, -1 none */
} ms_sample_step;

/*
 * What a step runner fills: the step declaration (segments and one record per resource) in
 * runtime-owned buffers sized for the worst case at engine init (ms_md_step_build_init), so
 * building a step allocates nothing. Segment i carries its row (seg_row); the engine packs the
 * row's tokens for the segment's label, segment by segment.
 */
typedef struct ms_md_step_build {
    /* capacities (set by ms_md_step_build_init) */
    int32_t cap_segments;
    int32_t cap_tokens;
    /* the declaration */
    const ms_md_row *rows;         /* the batch being built (borrowed, set by begin) */
    ms_step step;                  /* name, segments, records[resource index] */
    ms_segment *segments;          /* [cap_segments] label-major: every row's first segment,
                                      then every row's second, ... (the combined-label order) */
    int32_t *seg_row;              /* [cap_segments] row of segment i */
    int32_t *advance;              /* [cap_segments] position advance (records with a custom
                                      advance) */
    bool *sample;                  /* [cap_segments] sampler record */
    int32_t *guide;                /* [cap_segments] sampler record */
    int32_t *explicit_ids;         /* [MS_MD_MAX_AXES * cap_tokens] packed axis-major */
    int32_t n_tokens;              /* sum of spans */
    ms_kv_step kv;
    ms_pos_step pos;
    ms_attn_step attn;
    ms_sample_step sampler;
} ms_md_step_build;

/*
 * A step runner (generated, one per declared step): fill b for rows[0..n_rows) standing at the
 * step, under the loaded config: segments with labels and spans (span expressions evaluated from
 * config and len(input)), then the records of the resources the step uses, each through one
 * ms_md_step_* call. Errors: MS_ERR_CAPACITY when the batch exceeds b's capacities,
 * MS_ERR_INVALID_ARG for a negative span or an explicit step without ids.
 */
typedef ms_status (*ms_md_step_run_fn)(const void *config, const ms_md_row *rows,
                                       int32_t n_rows, ms_md_step_build *b, ms_error *err);

/* One step declaration of a node. */
typedef struct ms_md_step {
    const char *name;                      /* "prefill", "decode" */
    int32_t n_segments;                    /* segments per row */
    ms_label labels[MS_MAX_LABELS];        /* [n_segments] the label of each, in order (a
                                              request's walk starts at a step over exactly the
                                              streams it brings prompts for) */
    bool explicit_positions;               /* `pos explicit`: rows carry position ids */
    bool all_logits;                       /* `attn causal = false` (a block step): the logits
                                              of every token, not only each view's last */
    ms_md_step_run_fn run;                 /* the generated step runner */
    bool capture_by_tokens;                /* capture buckets count tokens (prefill) or rows */
    int32_t buckets[MS_MD_MAX_BUCKETS];    /* capture buckets, ascending (CUDA graphs) */
    int32_t n_buckets;
} ms_md_step;

/* One item of a walk: step `step` of node `node` (indices into ms_model_desc.nodes and that
 * node's steps). */
typedef struct ms_md_walk_item {
    int32_t node;
    int32_t step;
} ms_md_walk_item;

/*
 * A walk as data: the (node, step) items a request runs in order, `items[0 .. n_items)`, with
 * `loop ... until stop` as the range [loop_begin, n_items) that repeats until the request stops
 * (loop_begin == n_items: no loop; items after a loop are refused by mstarc). Items before the
 * loop consume the request's prompt inputs (input k = prompt k); items in the loop consume the
 * last sampled id in every input.
 */
typedef struct ms_md_walk {
    const char *name;                      /* "generate", "guided" */
    const ms_md_walk_item *items;          /* [n_items] node.step in order */
    int32_t n_items;
    int32_t loop_begin;                    /* first item of the loop; n_items: none */
} ms_md_walk;

/* ---- step-runner helpers (runtime side of the generated runners) ---- */

/* Allocate b's buffers for steps of up to max_segments segments and max_tokens tokens. */
ms_status ms_md_step_build_init(ms_md_step_build *b, int32_t max_segments, int32_t max_tokens,
                                ms_error *err);
void ms_md_step_build_free(ms_md_step_build *b);

/* Start a step named `name` over `rows` (borrowed until the step is built): no segments, no
 * records. */
void ms_md_step_begin(ms_md_step_build *b, const char *name, const ms_md_row *rows);

/* Append row `row`'s segment `label += span` with position advance `advance` (-1: the scheme's
 * rule, the span). Errors as for ms_md_step_run_fn. */
ms_status ms_md_step_segment(ms_md_step_build *b, int32_t row, ms_label label, int64_t span,
                             int64_t advance, ms_error *err);

/* The KV record at resource index `index` (arrays are static data of the generated file). */
void ms_md_step_kv(ms_md_step_build *b, int index, bool commit,
                   const ms_combined_label *combined, int32_t n_combined,
                   const ms_fork *pre_forks, int32_t n_pre_forks, const ms_fork *post_forks,
                   int32_t n_post_forks);

/* The positions record: custom advance per segment when `custom_advance`; explicit ids gathered
 * from the rows (their position_ids) into packed order when `explicit_ids`. Errors:
 * MS_ERR_INVALID_ARG when an explicit step's row has no ids. */
ms_status ms_md_step_pos(ms_md_step_build *b, int index, bool custom_advance, bool explicit_ids,
                         ms_error *err);

/* The attention record. */
void ms_md_step_attn(ms_md_step_build *b, int index, bool causal);

/* The cross-attention record (cross_attn.h: the resource reads the step's segments and the KV
 * plans; the record only marks it used). */
void ms_md_step_cross(ms_md_step_build *b, int index);

/* [scratch] The scratch KV record (scratch.h, ms_scratch_kv_step): whether the step begins a
 * frame (`code begin = true`: each row's scratch is emptied before its writes). */
void ms_md_step_scratch(ms_md_step_build *b, int index, bool begin_frame);

/* The sampler record: the first segment of each sampling row samples; under a combined label of
 * two or more labels (batched CFG) the row's segment of the combine's second label guides the one
 * of its first (mixed = uncond + s * (cond - uncond) over log-softmaxes). */
void ms_md_step_sampler(ms_md_step_build *b, int index);

/* ---- forward ---- */

/* Everything one forward call sees. Built by the engine per step. */
typedef struct ms_md_forward_args {
    const ms_backend *be;            /* the backend ops are queued on */
    const void *config;              /* the model's config struct */
    const ms_md_facts *facts;
    const ms_tensor *weights;        /* read through ms_md_weight_get */
    const int32_t *weight_offset;    /* [n_weights] first tensor of entry w in `weights` */
    const ms_paged_kv *kv;           /* the KV page arena */
    const ms_attn_batch *batch;      /* the step's staged plan (views, write addresses); NULL
                                        for a node without a kv_pool (dense below) */
    const ms_dense_batch *dense;     /* a node without a kv_pool (an encoder): the step's
                                        segments, one window each, for attention_dense; kv and
                                        batch are NULL then. NULL for every other node */
    const ms_tensor *tokens;         /* [n_tokens] i32, backend memory, packed segment order */
    const ms_tensor *input;          /* a node's shaped input (ms_md_node.input_shape), token-
                                        major [rows, cols] f32 backend memory; NULL otherwise */
    const ms_tensor *positions;      /* [n_tokens] i32, backend memory (positions resource) */
    const ms_rope_table *rope;       /* inv_freq in backend memory */
    ms_attn_params attn;             /* scale, window, causal (from the step declaration) */
    /* a node with a cross resource (NULL otherwise): */
    const ms_attn_batch *context_batch; /* write addresses of the step's context rows (the
                                        input's rows, segment order); 0 tokens: none */
    const ms_attn_batch *cross_batch;   /* the step's queries (batch's tokens) over each row's
                                        context view, from the cross resource's plan */
    ms_attn_params cross_attn;          /* not causal, no window, the model's scale */
    void *workspace;                 /* backend memory of workspace_size(max_tokens, max_seqs) */
    int32_t max_tokens;              /* the workspace's token capacity (layout is fixed by it) */
    int32_t max_seqs;                /* the workspace's row capacity */
    const ms_tensor *out_rows;       /* [n_out] i32 backend memory: the packed token rows whose
                                        logits are returned, in order (all rows of a block step),
                                        n_out <= max_seqs; NULL: the last token of each view */
    ms_tensor *logits;               /* out: [n_out or batch->n_seqs, vocab] f32, backend memory;
                                        a node without a sampler (hidden_width set): every
                                        token's row, [batch->n_tokens, hidden_width] f32 */
    /* [inputs_embeds] a node reading a row per token (input_shape rows -2): when not NULL,
       out: [batch->n_seqs, width] f32 backend memory, the rows its logits' head reads (the
       final-normed hidden state of each view's last token); NULL: not asked for */
    ms_tensor *last_hidden;
    /* [scratch] a node on a scratch (a code predictor): the frame slot of the step's last rows
       when every request's last row is at that one slot, -1 when they differ; what
       `for v in group at <scratch>.slot [+|- k]` reads to pick the group's member (the
       per-codebook head; its forward refuses -1). Set only for such a node */
    int32_t frame_slot;
    /* [scratch] a node reading a row of ids per token besides its float rows (ms_md_node.
       codes_width: a code predictor's frame codes next to the talker's hidden rows): the ids,
       [n_tokens, codes_width] i32 backend memory staged codebook-major (column c of the T rows
       at c * T); NULL for every other node */
    const ms_tensor *codes;
} ms_md_forward_args;

/* Tensor of weight entry `w`, layer `layer` (0 for global weights). Data NULL when an optional
 * tensor is absent. */
static inline const ms_tensor *ms_md_weight_get(const ms_md_forward_args *a, int32_t w,
                                                int32_t layer) {
    return &a->weights[a->weight_offset[w] + layer];
}

/* ---- nodes ---- */

#define MS_MD_MAX_NODES 8       /* nodes of a model */

/* Bytes of workspace a node's forward needs for steps of up to max_tokens tokens over max_seqs
 * views (the layout depends only on these capacities). */
typedef size_t (*ms_md_workspace_fn)(const void *config, int32_t max_tokens, int32_t max_seqs);
/* Queue one step's forward. Errors: the first failing op's status and message. */
typedef ms_status (*ms_md_forward_fn)(const ms_md_forward_args *args, ms_error *err);
/* Columns of the hidden rows a node's forward returns, under a loaded config. */
typedef int64_t (*ms_md_width_fn)(const void *config);
/* The [rows, cols] of a node's shaped input as its forward reads it (token-major: the declared
 * `features: [C, L]` is read as transpose(features), [L, C]), under a loaded config. */
typedef void (*ms_md_shape_fn)(const void *config, int64_t *rows, int64_t *cols);

/* One node of the model (`node decoder { ... }`): its stream labels, resources, steps and
 * forward. Resource indices (ms_step.records), label values (ms_label) and step indices are the
 * node's own. */
typedef struct ms_md_node {
    const char *name;                /* "decoder" */
    const char *const *labels;       /* [n_labels] stream label names; labels[0] is "main" */
    int32_t n_labels;
    const ms_md_resource *resources; /* [n_resources] in dependency order */
    int32_t n_resources;
    const ms_md_step *steps;         /* [n_steps] in declaration order */
    int32_t n_steps;
    ms_md_workspace_fn workspace_size;
    ms_md_forward_fn forward;
    /* a node without a sampler (an encoder): its forward returns every token's row of hidden
       states, hidden_width(config) columns, run through ms_engine_encode; NULL: a node whose
       forward returns logits that the engine samples */
    ms_md_width_fn hidden_width;
    /* the node's own facts (KV layout, attention, max_context: what its streams hold); NULL:
       the model's (ms_model_desc.facts, which are the first sampling node's) */
    ms_status (*facts)(const void *config, ms_md_facts *out, ms_error *err);
    /* its forward reads a shaped input (audio features) instead of token ids: the shape the
       engine stages; NULL: token ids */
    ms_md_shape_fn input_shape;
    /* [scratch] its forward also reads a row of ids per token (`codes: [_, G] ids` next to its
       `rows: [_, H]`; ms_md_forward_args.codes): their columns G; NULL: no such input */
    ms_md_width_fn codes_width;
} ms_md_node;

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
    /* Instances of per-layer entry w: its group's count (a model of several layer groups, an
       encoder's and a decoder's); NULL: facts.n_layers for every per-layer entry. */
    int32_t (*weight_layers)(const void *config, int32_t w);

    /* nodes and walks */
    const ms_md_node *nodes;      /* [n_nodes] in declaration order (the engine builds every
                                     node's resources; walks cross them) */
    int32_t n_nodes;
    const ms_md_walk *walks;      /* [n_walks] in declaration order; a request takes the first
                                     whose first item has as many inputs as it gives prompts */
    int32_t n_walks;

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

    /* checkpoint tensors present but unused (DSL `ignore "visual.*";` in weights) */
    const char *const *ignored;   /* [n_ignored] patterns, '*' matching any run of characters */
    int32_t n_ignored;            /* 0: every checkpoint tensor must be a declared weight */
} ms_model_desc;

/*
 * Expand a name template: "{i}" becomes the decimal `layer` (other text is copied). Writes at most
 * cap bytes (NUL included); MS_ERR_LIMIT when it does not fit.
 */
ms_status ms_md_expand_name(const char *tmpl, int32_t layer, char *buf, size_t cap,
                            ms_error *err);

/*
 * Check a descriptor's tables for consistency (what a code generator bug would break), without a
 * config: every function pointer set; weights: kind valid, rank 1 to 3, TENSOR/PART entries name
 * at least one template (a per-layer one containing "{i}", a global one none), a tie points to an
 * earlier TENSOR/FUSED entry of the same rank and layering, a PART names a FUSED entry that lists
 * it, a FUSED entry has 2..MS_MD_MAX_PARTS PART entries of its rank and layering, each listing it;
 * nodes: 1..MS_MD_MAX_NODES with unique names, each with a forward and workspace_size, its
 * resources (unique keys, dependencies among earlier keys (dependency order), at most one of
 * each kind, every argument with a key and a text), labels (main first) and 1..MS_MD_MAX_STEPS
 * steps (labels within the node's, buckets ascending); walks: at least one, each item naming a
 * valid (node, step) pair, the loop within the items; kernels: n_kernels >= 0, each stem a
 * non-empty string (kernels non-NULL when n_kernels > 0). Errors: MS_ERR_INVALID_ARG
 * "model <name>: weight 'x': <problem>" ("model <name>: node <node>: ..." for a node's tables).
 * The engine runs it first at init.
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

/* Most kernel instances one model loads for one checkpoint shape (ms_kernel_specs_for_stems). */
#define MS_MD_MAX_KERNEL_SPECS 64

/*
 * The CUDA kernel instances a loaded model runs (what the CUDA backend loads at engine init, the
 * `kernels` verb compiles and `mstarc build --arch --config` precompiles): the descriptor's
 * kernel stems at the checkpoint's shape as the CUDA backend sees it — head_dim, query and KV
 * heads, `page_size` (the one in use), RoPE style (none when the model has no RoPE: theta <= 0),
 * sliding window, bf16 weights and KV — through ms_kernel_specs_for_stems. Writes up to cap specs
 * and *n. A descriptor listing no kernels gives *n = 0. Errors: ms_kernel_specs_for_stems's.
 */
ms_status ms_md_kernel_specs(const ms_model_desc *d, const ms_md_facts *facts, int32_t page_size,
                             ms_kernel_spec *out, int cap, int *n, ms_error *err);

/*
 * Whether checkpoint tensor `name` is one the model declares present but unused: it matches one
 * of d->ignored, where '*' matches any run of characters (dots included) and every other
 * character itself ("visual.*" matches "visual.blocks.0.attn.qkv.weight"). Such tensors are
 * neither loaded nor an error; the engine's unclaimed-tensor check skips them.
 */
bool ms_md_tensor_ignored(const ms_model_desc *d, const char *name);

/* Resource index of `key` in node n's table, or -1. */
int32_t ms_md_resource_index(const ms_md_node *n, const char *key);

#ifdef __cplusplus
}
#endif
#endif /* MS_MODEL_DESC_H */
