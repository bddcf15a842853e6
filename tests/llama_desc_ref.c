/*
 * llama_desc_ref.c - the Llama descriptor written BY HAND in exactly the form mstarc will emit for
 * models/llama.mstar (runtime/engine/model_desc.h). It is the code generator's golden target and the
 * engine's test model until code generation lands: keep it mechanical (tables mirroring the
 * source, switch functions over config expressions, one straight-line forward), never clever.
 *
 * Differences from models/llama.mstar that the language side must pick up (see the report):
 *   - `max_position_embeddings: int = 2048;` (the context limit) and
 *     `rope_interleaved: bool = false;` with `style = rope_interleaved ? interleaved : rotate_half`
 *     (llama2.c checkpoints: the loaders derive a config.json with "rope_interleaved": true and
 *     Hugging Face tensor names, so one descriptor serves both formats).
 *
 * Fusion decisions (what the compiler's lowering decides): Q/K/V weights concatenated at load into
 * one [q_dim + 2 kv_dim, hidden] matrix (and their optional biases into one vector), gate/up into
 * one [2 intermediate, hidden] matrix; "x = x + t; h = rms_norm(x)" runs as add_rms_norm; the
 * final norm and lm_head run on the last token of each sequence only (gather first).
 */
#include <math.h>
#include <string.h>

#include "model_desc.h"

/* ---- config ---- */

typedef struct llama_config {
    int64_t hidden_size;
    int64_t num_hidden_layers;
    int64_t num_attention_heads;
    int64_t num_key_value_heads;
    int64_t head_dim;
    int64_t intermediate_size;
    int64_t vocab_size;
    int64_t max_position_embeddings;
    double rms_norm_eps;
    bool tie_word_embeddings;
    double rope_theta;
    const char *rope_type;
    double rope_factor;
    double rope_low_freq_factor;
    double rope_high_freq_factor;
    int64_t rope_original_max_positions;
    bool rope_interleaved;
    int64_t sliding_window;
    bool has_sliding_window;
    /* let */
    int64_t q_dim;
    int64_t kv_dim;
} llama_config;

/* int values past int32 are refused (the generated loader's check, compiler/codegen.c) */
#define REF_INT32(name)                                                                        \
    MS_TRY(ms_md_cfg_check(hf, c->name >= -2147483647 && c->name <= 2147483647, err,           \
                           #name " (%lld) is out of range (at most 2147483647 in magnitude)",  \
                           (long long)c->name))

static ms_status llama_config_load(const ms_hf_config *hf, void *out, ms_error *err) {
    llama_config *c = out;
    static const char *const s_hidden_size[] = {"hidden_size"};
    static const char *const s_num_hidden_layers[] = {"num_hidden_layers"};
    static const char *const s_num_attention_heads[] = {"num_attention_heads"};
    static const char *const s_num_key_value_heads[] = {"num_key_value_heads"};
    static const char *const s_head_dim[] = {"head_dim"};
    static const char *const s_intermediate_size[] = {"intermediate_size"};
    static const char *const s_vocab_size[] = {"vocab_size"};
    static const char *const s_max_position_embeddings[] = {"max_position_embeddings"};
    static const char *const s_rms_norm_eps[] = {"rms_norm_eps"};
    static const char *const s_tie_word_embeddings[] = {"tie_word_embeddings"};
    static const char *const s_rope_theta[] = {"rope_parameters.rope_theta", "rope_theta"};
    static const char *const s_rope_type[] = {"rope_parameters.rope_type",
                                              "rope_scaling.rope_type"};
    static const char *const s_rope_factor[] = {"rope_parameters.factor", "rope_scaling.factor"};
    static const char *const s_rope_low_freq_factor[] = {"rope_parameters.low_freq_factor",
                                                         "rope_scaling.low_freq_factor"};
    static const char *const s_rope_high_freq_factor[] = {"rope_parameters.high_freq_factor",
                                                          "rope_scaling.high_freq_factor"};
    static const char *const s_rope_original_max_positions[] = {
        "rope_parameters.original_max_position_embeddings",
        "rope_scaling.original_max_position_embeddings"};
    static const char *const s_rope_interleaved[] = {"rope_interleaved"};
    static const char *const s_sliding_window[] = {"sliding_window"};

    MS_TRY(ms_md_cfg_int(hf, s_hidden_size, 1, NULL, &c->hidden_size, NULL, err));
    REF_INT32(hidden_size);
    MS_TRY(ms_md_cfg_int(hf, s_num_hidden_layers, 1, NULL, &c->num_hidden_layers, NULL, err));
    REF_INT32(num_hidden_layers);
    MS_TRY(ms_md_cfg_int(hf, s_num_attention_heads, 1, NULL, &c->num_attention_heads, NULL, err));
    REF_INT32(num_attention_heads);
    {
        const int64_t d = c->num_attention_heads;
        MS_TRY(ms_md_cfg_int(hf, s_num_key_value_heads, 1, &d, &c->num_key_value_heads, NULL,
                             err));
        REF_INT32(num_key_value_heads);
    }
    MS_TRY(ms_md_cfg_check(hf, c->num_attention_heads > 0,
                           err, "num_attention_heads (%lld) must be positive",
                           (long long)c->num_attention_heads));
    {
        const int64_t d = c->hidden_size / c->num_attention_heads;
        MS_TRY(ms_md_cfg_int(hf, s_head_dim, 1, &d, &c->head_dim, NULL, err));
        REF_INT32(head_dim);
    }
    MS_TRY(ms_md_cfg_int(hf, s_intermediate_size, 1, NULL, &c->intermediate_size, NULL, err));
    REF_INT32(intermediate_size);
    MS_TRY(ms_md_cfg_int(hf, s_vocab_size, 1, NULL, &c->vocab_size, NULL, err));
    REF_INT32(vocab_size);
    {
        const int64_t d = 2048;
        MS_TRY(ms_md_cfg_int(hf, s_max_position_embeddings, 1, &d, &c->max_position_embeddings,
                             NULL, err));
        REF_INT32(max_position_embeddings);
    }
    {
        const double d = 1e-5;
        MS_TRY(ms_md_cfg_float(hf, s_rms_norm_eps, 1, &d, &c->rms_norm_eps, NULL, err));
    }
    {
        const bool d = false;
        MS_TRY(ms_md_cfg_bool(hf, s_tie_word_embeddings, 1, &d, &c->tie_word_embeddings, NULL,
                              err));
    }
    {
        const double d = 10000.0;
        MS_TRY(ms_md_cfg_float(hf, s_rope_theta, 2, &d, &c->rope_theta, NULL, err));
    }
    MS_TRY(ms_md_cfg_string(hf, s_rope_type, 2, "default", &c->rope_type, NULL, err));
    {
        const double d = 1.0;
        MS_TRY(ms_md_cfg_float(hf, s_rope_factor, 2, &d, &c->rope_factor, NULL, err));
    }
    {
        const double d = 1.0;
        MS_TRY(ms_md_cfg_float(hf, s_rope_low_freq_factor, 2, &d, &c->rope_low_freq_factor, NULL,
                               err));
    }
    {
        const double d = 4.0;
        MS_TRY(ms_md_cfg_float(hf, s_rope_high_freq_factor, 2, &d, &c->rope_high_freq_factor,
                               NULL, err));
    }
    {
        const int64_t d = 8192;
        MS_TRY(ms_md_cfg_int(hf, s_rope_original_max_positions, 2, &d,
                             &c->rope_original_max_positions, NULL, err));
        REF_INT32(rope_original_max_positions);
    }
    {
        const bool d = false;
        MS_TRY(ms_md_cfg_bool(hf, s_rope_interleaved, 1, &d, &c->rope_interleaved, NULL, err));
    }
    MS_TRY(ms_md_cfg_int(hf, s_sliding_window, 1, NULL, &c->sliding_window,
                         &c->has_sliding_window, err));
    MS_TRY(ms_md_cfg_check(hf, !c->has_sliding_window || (c->sliding_window >= -2147483647 &&
                                                         c->sliding_window <= 2147483647),
                           err, "sliding_window (%lld) is out of range (at most 2147483647 in "
                           "magnitude)", (long long)c->sliding_window));
    c->q_dim = c->num_attention_heads * c->head_dim;
    c->kv_dim = c->num_key_value_heads * c->head_dim;

    /* shape constraints sema cannot prove (they depend on config.json values) */
    MS_TRY(ms_md_cfg_check(hf, c->hidden_size > 0, err, "hidden_size (%lld) must be positive",
                           (long long)c->hidden_size));
    MS_TRY(ms_md_cfg_check(hf, c->num_hidden_layers > 0, err,
                           "num_hidden_layers (%lld) must be positive",
                           (long long)c->num_hidden_layers));
    MS_TRY(ms_md_cfg_check(hf, c->num_key_value_heads > 0 &&
                                   c->num_attention_heads % c->num_key_value_heads == 0,
                           err, "num_attention_heads (%lld) is not a multiple of "
                           "num_key_value_heads (%lld)", (long long)c->num_attention_heads,
                           (long long)c->num_key_value_heads));
    MS_TRY(ms_md_cfg_check(hf, c->head_dim > 0 && c->head_dim % 2 == 0, err,
                           "head_dim (%lld) must be positive and even", (long long)c->head_dim));
    MS_TRY(ms_md_cfg_check(hf, c->intermediate_size > 0, err,
                           "intermediate_size (%lld) must be positive",
                           (long long)c->intermediate_size));
    MS_TRY(ms_md_cfg_check(hf, c->vocab_size > 0, err, "vocab_size (%lld) must be positive",
                           (long long)c->vocab_size));
    MS_TRY(ms_md_cfg_check(hf, c->max_position_embeddings > 0, err,
                           "max_position_embeddings (%lld) must be positive",
                           (long long)c->max_position_embeddings));
    MS_TRY(ms_md_cfg_check(hf, !c->has_sliding_window || c->sliding_window > 0, err,
                           "sliding_window (%lld) must be positive",
                           (long long)c->sliding_window));
    MS_TRY(ms_md_cfg_check(hf, c->rope_theta > 0.0, err, "rope_theta (%g) must be positive",
                           c->rope_theta));
    MS_TRY(ms_md_cfg_check(hf, c->rms_norm_eps >= 0.0, err, "rms_norm_eps (%g) must not be negative",
                           c->rms_norm_eps));
    MS_TRY(ms_md_cfg_check(hf, strcmp(c->rope_type, "default") == 0 ||
                                   strcmp(c->rope_type, "llama3") == 0,
                           err, "rope_type '%s' is not supported by this model (default, llama3)",
                           c->rope_type));
    return MS_OK;
}

static ms_status llama_facts(const void *config, ms_md_facts *out, ms_error *err) {
    (void)err;
    const llama_config *c = config;
    memset(out, 0, sizeof *out);
    out->n_layers = (int32_t)c->num_hidden_layers;
    out->n_q_heads = (int32_t)c->num_attention_heads;
    out->n_kv_heads = (int32_t)c->num_key_value_heads;
    out->head_dim = (int32_t)c->head_dim;
    out->hidden = (int32_t)c->hidden_size;
    out->vocab = (int32_t)c->vocab_size;
    out->max_context = (int32_t)c->max_position_embeddings;
    out->rope.style = c->rope_interleaved ? MS_ROPE_INTERLEAVED : MS_ROPE_ROTATE_HALF;
    out->rope.head_dim = (int32_t)c->head_dim;
    out->rope.rotary_dim = (int32_t)c->head_dim;
    out->rope.theta = c->rope_theta;
    if (strcmp(c->rope_type, "llama3") == 0) {
        out->rope.scaling = MS_ROPE_SCALING_LLAMA3;
        out->rope.factor = c->rope_factor;
        out->rope.low_freq_factor = c->rope_low_freq_factor;
        out->rope.high_freq_factor = c->rope_high_freq_factor;
        out->rope.original_max_position = (double)c->rope_original_max_positions;
    } else {
        out->rope.scaling = MS_ROPE_SCALING_NONE;
    }
    out->window = c->has_sliding_window ? (int32_t)c->sliding_window : 0;
    out->page_size = 16;
    out->kv_dtype = MS_DTYPE_BF16;
    return MS_OK;
}

/* ---- weights ---- */

enum {
    W_EMBED = 0,
    W_ATTN_NORM,
    W_WQ,
    W_WK,
    W_WV,
    W_WQKV,
    W_BQ,
    W_BK,
    W_BV,
    W_BQKV,
    W_WO,
    W_MLP_NORM,
    W_GATE,
    W_UP,
    W_GATE_UP,
    W_DOWN,
    W_FINAL_NORM,
    W_LM_HEAD,
    W_COUNT
};

#define L true  /* per layer */
#define G false /* global */
#define NO_PARTS {0, 0, 0, 0}, 0

static const ms_md_weight llama_weights[W_COUNT] = {
    [W_EMBED] = {"embed", MS_MD_WEIGHT_TENSOR, {"model.embed_tokens.weight", NULL}, G, false, 2,
                 -1, -1, NO_PARTS},
    [W_ATTN_NORM] = {"layers.attn_norm", MS_MD_WEIGHT_TENSOR,
                     {"model.layers.{i}.input_layernorm.weight", NULL}, L, false, 1, -1, -1,
                     NO_PARTS},
    [W_WQ] = {"layers.wq", MS_MD_WEIGHT_PART, {"model.layers.{i}.self_attn.q_proj.weight", NULL},
              L, false, 2, -1, W_WQKV, NO_PARTS},
    [W_WK] = {"layers.wk", MS_MD_WEIGHT_PART, {"model.layers.{i}.self_attn.k_proj.weight", NULL},
              L, false, 2, -1, W_WQKV, NO_PARTS},
    [W_WV] = {"layers.wv", MS_MD_WEIGHT_PART, {"model.layers.{i}.self_attn.v_proj.weight", NULL},
              L, false, 2, -1, W_WQKV, NO_PARTS},
    [W_WQKV] = {"layers.wq+wk+wv", MS_MD_WEIGHT_FUSED, {NULL, NULL}, L, false, 2, -1, -1,
                {W_WQ, W_WK, W_WV, 0}, 3},
    [W_BQ] = {"layers.bq", MS_MD_WEIGHT_PART, {"model.layers.{i}.self_attn.q_proj.bias", NULL},
              L, true, 1, -1, W_BQKV, NO_PARTS},
    [W_BK] = {"layers.bk", MS_MD_WEIGHT_PART, {"model.layers.{i}.self_attn.k_proj.bias", NULL},
              L, true, 1, -1, W_BQKV, NO_PARTS},
    [W_BV] = {"layers.bv", MS_MD_WEIGHT_PART, {"model.layers.{i}.self_attn.v_proj.bias", NULL},
              L, true, 1, -1, W_BQKV, NO_PARTS},
    [W_BQKV] = {"layers.bq+bk+bv", MS_MD_WEIGHT_FUSED, {NULL, NULL}, L, true, 1, -1, -1,
                {W_BQ, W_BK, W_BV, 0}, 3},
    [W_WO] = {"layers.wo", MS_MD_WEIGHT_TENSOR, {"model.layers.{i}.self_attn.o_proj.weight", NULL},
              L, false, 2, -1, -1, NO_PARTS},
    [W_MLP_NORM] = {"layers.mlp_norm", MS_MD_WEIGHT_TENSOR,
                    {"model.layers.{i}.post_attention_layernorm.weight", NULL}, L, false, 1, -1,
                    -1, NO_PARTS},
    [W_GATE] = {"layers.w_gate", MS_MD_WEIGHT_PART, {"model.layers.{i}.mlp.gate_proj.weight", NULL},
                L, false, 2, -1, W_GATE_UP, NO_PARTS},
    [W_UP] = {"layers.w_up", MS_MD_WEIGHT_PART, {"model.layers.{i}.mlp.up_proj.weight", NULL}, L,
              false, 2, -1, W_GATE_UP, NO_PARTS},
    [W_GATE_UP] = {"layers.w_gate+w_up", MS_MD_WEIGHT_FUSED, {NULL, NULL}, L, false, 2, -1, -1,
                   {W_GATE, W_UP, 0, 0}, 2},
    [W_DOWN] = {"layers.w_down", MS_MD_WEIGHT_TENSOR,
                {"model.layers.{i}.mlp.down_proj.weight", NULL},
                L, false, 2, -1, -1, NO_PARTS},
    [W_FINAL_NORM] = {"final_norm", MS_MD_WEIGHT_TENSOR, {"model.norm.weight", NULL}, G, false, 1,
                      -1, -1, NO_PARTS},
    [W_LM_HEAD] = {"lm_head", MS_MD_WEIGHT_TENSOR, {"lm_head.weight", NULL}, G, false, 2, W_EMBED,
                   -1, NO_PARTS},
};

#undef L
#undef G
#undef NO_PARTS

static void llama_weight_shape(const void *config, int32_t w, int64_t *shape) {
    const llama_config *c = config;
    switch (w) {
    case W_EMBED: shape[0] = c->vocab_size; shape[1] = c->hidden_size; break;
    case W_ATTN_NORM: shape[0] = c->hidden_size; break;
    case W_WQ: shape[0] = c->q_dim; shape[1] = c->hidden_size; break;
    case W_WK: shape[0] = c->kv_dim; shape[1] = c->hidden_size; break;
    case W_WV: shape[0] = c->kv_dim; shape[1] = c->hidden_size; break;
    case W_WQKV: shape[0] = c->q_dim + c->kv_dim + c->kv_dim; shape[1] = c->hidden_size; break;
    case W_BQ: shape[0] = c->q_dim; break;
    case W_BK: shape[0] = c->kv_dim; break;
    case W_BV: shape[0] = c->kv_dim; break;
    case W_BQKV: shape[0] = c->q_dim + c->kv_dim + c->kv_dim; break;
    case W_WO: shape[0] = c->hidden_size; shape[1] = c->q_dim; break;
    case W_MLP_NORM: shape[0] = c->hidden_size; break;
    case W_GATE: shape[0] = c->intermediate_size; shape[1] = c->hidden_size; break;
    case W_UP: shape[0] = c->intermediate_size; shape[1] = c->hidden_size; break;
    case W_GATE_UP: shape[0] = c->intermediate_size + c->intermediate_size;
        shape[1] = c->hidden_size; break;
    case W_DOWN: shape[0] = c->hidden_size; shape[1] = c->intermediate_size; break;
    case W_FINAL_NORM: shape[0] = c->hidden_size; break;
    case W_LM_HEAD: shape[0] = c->vocab_size; shape[1] = c->hidden_size; break;
    default: MS_ABORT("llama: no weight %d", (int)w);
    }
}

static bool llama_weight_tied(const void *config, int32_t w) {
    const llama_config *c = config;
    switch (w) {
    case W_LM_HEAD: return c->tie_word_embeddings;
    default: return false;
    }
}

/* ---- the decoder node: resources and steps ---- */

/* Dependency order as sema computes it: KV first, then ready resources by name. */
static const ms_md_resource llama_resources[] = {
    {"kv", MS_RESOURCE_KV, {NULL}, 0},
    {"pos", MS_RESOURCE_POS, {"kv"}, 1},
    {"attn", MS_RESOURCE_ATTN, {"kv", "pos"}, 2},
    {"sample", MS_RESOURCE_SAMPLER, {NULL}, 0},
};

static const ms_md_step llama_prefill = {
    .name = "prefill",
    .span = MS_MD_SPAN_TOKENS,
    .label = MS_LABEL_MAIN,
    .kv_commit = true,
    .attn_causal = true,
    .pos_advance = 0,
    .capture_by_tokens = true,
    .buckets = {32, 64, 128, 256, 512, 1024, 2048},
    .n_buckets = 7,
};

static const ms_md_step llama_decode = {
    .name = "decode",
    .span = MS_MD_SPAN_ONE,
    .label = MS_LABEL_MAIN,
    .kv_commit = true,
    .attn_causal = true,
    .pos_advance = 1,
    .capture_by_tokens = false,
    .buckets = {1, 2, 4, 8, 16, 32, 64, 128, 256},
    .n_buckets = 9,
};

/* ---- forward ---- */

/* Workspace layout (float32 elements, each slice 64-byte aligned) for capacities T tokens and S
 * sequences: x [T, hidden], h [T, hidden], qkv [T, q_dim + 2 kv_dim], o [T, q_dim],
 * t [T, hidden], gu [T, 2 intermediate], xl [S, hidden], logits are the caller's. */
enum { B_X = 0, B_H, B_QKV, B_O, B_T, B_GU, B_XL, B_COUNT };

static size_t llama_layout(const llama_config *c, int32_t T, int32_t S, size_t *off) {
    const size_t t = (size_t)T, s = (size_t)S;
    size_t sizes[B_COUNT];
    sizes[B_X] = t * (size_t)c->hidden_size;
    sizes[B_H] = t * (size_t)c->hidden_size;
    sizes[B_QKV] = t * (size_t)(c->q_dim + 2 * c->kv_dim);
    sizes[B_O] = t * (size_t)c->q_dim;
    sizes[B_T] = t * (size_t)c->hidden_size;
    sizes[B_GU] = t * (size_t)(2 * c->intermediate_size);
    sizes[B_XL] = s * (size_t)c->hidden_size;
    size_t n = 0;
    for (int b = 0; b < B_COUNT; b++) {
        off[b] = n;
        n += (sizes[b] + 15) / 16 * 16;
    }
    return n * sizeof(float);
}

static size_t llama_workspace_size(const void *config, int32_t max_tokens, int32_t max_seqs) {
    size_t off[B_COUNT];
    return llama_layout(config, max_tokens, max_seqs, off);
}

static ms_status llama_forward(const ms_md_forward_args *a, ms_error *err) {
    const llama_config *c = a->config;
    const ms_backend *be = a->be;
    const ms_backend_i *f = &be->iface;
    void *cx = be->ctx;
    const int64_t T = a->batch->n_tokens, S = a->batch->n_seqs;
    const int64_t H = c->hidden_size, QD = c->q_dim, KVD = c->kv_dim, F = c->intermediate_size;
    const int64_t HQ = c->num_attention_heads, HKV = c->num_key_value_heads, D = c->head_dim;
    const float eps = (float)c->rms_norm_eps;
    size_t off[B_COUNT];
    llama_layout(c, a->max_tokens, a->max_seqs, off);
    float *ws = a->workspace;

    ms_tensor x = ms_tensor_2d(ws + off[B_X], MS_DTYPE_F32, T, H);
    ms_tensor h = ms_tensor_2d(ws + off[B_H], MS_DTYPE_F32, T, H);
    ms_tensor qkv = ms_tensor_2d(ws + off[B_QKV], MS_DTYPE_F32, T, QD + 2 * KVD);
    ms_tensor o = ms_tensor_2d(ws + off[B_O], MS_DTYPE_F32, T, QD);
    ms_tensor t = ms_tensor_2d(ws + off[B_T], MS_DTYPE_F32, T, H);
    ms_tensor gu = ms_tensor_2d(ws + off[B_GU], MS_DTYPE_F32, T, 2 * F);
    ms_tensor xl = ms_tensor_2d(ws + off[B_XL], MS_DTYPE_F32, S, H);
    ms_tensor q2 = ms_tensor_slice(&qkv, 1, 0, QD);
    ms_tensor k2 = ms_tensor_slice(&qkv, 1, QD, KVD);
    ms_tensor v2 = ms_tensor_slice(&qkv, 1, QD + KVD, KVD);
    ms_tensor q = ms_tensor_split_heads(&q2, HQ, D);
    ms_tensor k = ms_tensor_split_heads(&k2, HKV, D);
    ms_tensor v = ms_tensor_split_heads(&v2, HKV, D);
    ms_tensor o3 = ms_tensor_split_heads(&o, HQ, D);
    ms_tensor gate = ms_tensor_slice(&gu, 1, 0, F);
    ms_tensor up = ms_tensor_slice(&gu, 1, F, F);
    ms_tensor last = ms_tensor_1d(a->batch->last_token, MS_DTYPE_I32, S);

    /* x = embedding(embed, tokens) */
    MS_TRY(f->embedding(cx, ms_md_weight_get(a, W_EMBED, 0), a->tokens, &x, err));
    for (int32_t l = 0; l < (int32_t)c->num_hidden_layers; l++) {
        /* h = rms_norm(x, l.attn_norm)   (fused with the previous layer's residual add) */
        if (l == 0)
            MS_TRY(f->rms_norm(cx, &x, ms_md_weight_get(a, W_ATTN_NORM, l), eps, &h, err));
        else
            MS_TRY(ms_backend_add_rms_norm(be, &x, &t, ms_md_weight_get(a, W_ATTN_NORM, l), eps,
                                           &h, err));
        /* q, k, v = linear(h, l.wq, l.bq), ...   (one GEMM over the fused QKV weight) */
        const ms_tensor *bqkv = ms_md_weight_get(a, W_BQKV, l);
        MS_TRY(f->linear(cx, &h, ms_md_weight_get(a, W_WQKV, l), bqkv->data ? bqkv : NULL, &qkv,
                         err));
        /* q, k = pos.apply(q, k); the KV write of attn.run fused with it */
        MS_TRY(ms_backend_rope_kv_write(be, &q, &k, &v, a->positions, a->rope, a->kv, l, a->batch,
                                        err));
        MS_TRY(f->attention(cx, &q, a->kv, l, a->batch, &a->attn, &o3, err));
        /* x = x + linear(attn, l.wo); h = rms_norm(x, l.mlp_norm) */
        MS_TRY(f->linear(cx, &o, ms_md_weight_get(a, W_WO, l), NULL, &t, err));
        MS_TRY(ms_backend_add_rms_norm(be, &x, &t, ms_md_weight_get(a, W_MLP_NORM, l), eps, &h,
                                       err));
        /* x = x + linear(silu(linear(h, l.w_gate)) * linear(h, l.w_up), l.w_down) */
        MS_TRY(f->linear(cx, &h, ms_md_weight_get(a, W_GATE_UP, l), NULL, &gu, err));
        MS_TRY(f->silu_mul(cx, &gate, &up, &gate, err));
        MS_TRY(f->linear(cx, &gate, ms_md_weight_get(a, W_DOWN, l), NULL, &t, err));
    }
    MS_TRY(f->add(cx, &x, &t, &x, err));
    /* logits = linear(rms_norm(x, final_norm), lm_head) on the last token of each sequence */
    MS_TRY(f->gather_rows(cx, &x, &last, &xl, err));
    MS_TRY(f->rms_norm(cx, &xl, ms_md_weight_get(a, W_FINAL_NORM, 0), eps, &xl, err));
    MS_TRY(f->linear(cx, &xl, ms_md_weight_get(a, W_LM_HEAD, 0), NULL, a->logits, err));
    return MS_OK;
}

/* ---- the descriptor ---- */

const ms_model_desc ms_llama_ref_desc = {
    .name = "llama",
    .source = "models/llama.mstar (hand-written reference, tests/llama_desc_ref.c)",
    .config_size = sizeof(llama_config),
    .config_load = llama_config_load,
    .facts = llama_facts,
    .weights = llama_weights,
    .n_weights = W_COUNT,
    .weight_shape = llama_weight_shape,
    .weight_tied = llama_weight_tied,
    .resources = llama_resources,
    .n_resources = (int32_t)MS_ARRAY_LEN(llama_resources),
    .prefill = &llama_prefill,
    .decode = &llama_decode,
    .workspace_size = llama_workspace_size,
    .forward = llama_forward,
};
