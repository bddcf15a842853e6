/*
 * gguf_model.c - GGUF models under Hugging Face names and config keys (gguf_model.h).
 *
 * Dequantization (and the un-permutation) runs one tensor per task on a thread pool of the online
 * CPUs (at most 16): an 8B checkpoint is 8e9 values to convert.
 *
 * Constraints: the mapping tables are the only place a GGUF name or key is spelled; every tensor in
 * the file must map (no silent drops); the config is derived from metadata alone (no tensor data
 * is touched), so ms_hf_config_init on a .gguf stays cheap.
 */
#include "gguf_model.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf_quant.h"
#include "threadpool.h"

struct ms_gguf_model {
    ms_gguf *g;
    ms_st_tensor *tensors;  /* [n] sorted by name; data points into bufs */
    char **names;           /* [n] owned Hugging Face names */
    float **bufs;           /* [n] owned float32 data */
    int64_t *permute_groups; /* [n] heads to un-permute (q: n_head, k: n_head_kv), 0 = none */
    ms_status *status;      /* [n] conversion results of the parallel pass */
    size_t *src;            /* [n] index of tensor i in the GGUF (rope_freqs.weight is not a weight) */
    size_t n;
};

/* ---- architectures ---- */

typedef struct gguf_arch {
    const char *name;          /* general.architecture */
    const char *model_type;    /* config.json model_type */
    const char *hf_class;      /* config.json architectures[0] */
    bool permuted_qk;          /* the converter applied LlamaModel.permute */
} gguf_arch;

static const gguf_arch gguf_archs[] = {
    {"llama", "llama", "LlamaForCausalLM", true},
    {"qwen2", "qwen2", "Qwen2ForCausalLM", false},
    {"qwen3", "qwen3", "Qwen3ForCausalLM", false},
};

static ms_status find_arch(const ms_gguf *g, const gguf_arch **out, ms_error *err) {
    const char *a;
    MS_TRY(ms_gguf_get_string(g, "general.architecture", &a, NULL, err));
    for (size_t i = 0; i < MS_ARRAY_LEN(gguf_archs); i++)
        if (strcmp(gguf_archs[i].name, a) == 0) {
            *out = &gguf_archs[i];
            return MS_OK;
        }
    return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: general.architecture '%s' is not supported (supported: llama, "
                   "qwen2, qwen3)", ms_gguf_path(g), a);
}

/* "<arch>.<suffix>" into buf. */
static const char *akey(char *buf, size_t cap, const gguf_arch *a, const char *suffix) {
    snprintf(buf, cap, "%s.%s", a->name, suffix);
    return buf;
}

/* ---- the architecture's shape facts ---- */

typedef struct arch_dims {
    int64_t hidden, layers, heads, kv_heads, head_dim, ffn, vocab;
} arch_dims;

static ms_status read_dims(const ms_gguf *g, const gguf_arch *a, arch_dims *d, ms_error *err) {
    char k[128];
    const char *path = ms_gguf_path(g);
    MS_TRY(ms_gguf_get_int(g, akey(k, sizeof k, a, "embedding_length"), &d->hidden, err));
    MS_TRY(ms_gguf_get_int(g, akey(k, sizeof k, a, "block_count"), &d->layers, err));
    MS_TRY(ms_gguf_get_int(g, akey(k, sizeof k, a, "attention.head_count"), &d->heads, err));
    MS_TRY(ms_gguf_get_int_or(g, akey(k, sizeof k, a, "attention.head_count_kv"), d->heads, &d->kv_heads, err));
    MS_TRY(ms_gguf_get_int(g, akey(k, sizeof k, a, "feed_forward_length"), &d->ffn, err));
    if (d->hidden <= 0 || d->layers <= 0 || d->heads <= 0 || d->kv_heads <= 0 || d->ffn <= 0 ||
        d->heads % d->kv_heads != 0 || d->hidden > (1 << 20) || d->layers > 4096 || d->heads > 4096 ||
        d->ffn > (1 << 24))
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: inconsistent %s dimensions (embedding_length %lld, block_count "
                       "%lld, head_count %lld, head_count_kv %lld, feed_forward_length %lld)", path, a->name,
                       (long long)d->hidden, (long long)d->layers, (long long)d->heads, (long long)d->kv_heads,
                       (long long)d->ffn);
    MS_TRY(ms_gguf_get_int_or(g, akey(k, sizeof k, a, "attention.key_length"), d->hidden / d->heads, &d->head_dim,
                              err));
    int64_t vlen;
    MS_TRY(ms_gguf_get_int_or(g, akey(k, sizeof k, a, "attention.value_length"), d->head_dim, &vlen, err));
    if (d->head_dim <= 0 || d->head_dim > 1024 || d->head_dim % 2 != 0 || vlen != d->head_dim)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: %s head size: key_length %lld, value_length %lld (must be equal, "
                       "even and at most 1024)", path, a->name, (long long)d->head_dim, (long long)vlen);
    int64_t rot;
    MS_TRY(ms_gguf_get_int_or(g, akey(k, sizeof k, a, "rope.dimension_count"), d->head_dim, &rot, err));
    if (rot != d->head_dim)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: %s.rope.dimension_count %lld differs from the head size %lld "
                       "(partial rotary is not supported)", path, a->name, (long long)rot, (long long)d->head_dim);
    const ms_gguf_tensor *emb = ms_gguf_find_tensor(g, "token_embd.weight");
    int64_t rows = emb != NULL && emb->n_dims == 2 ? emb->ne[1] : -1;
    MS_TRY(ms_gguf_get_int_or(g, akey(k, sizeof k, a, "vocab_size"), rows, &d->vocab, err));
    if (d->vocab <= 0) {
        const ms_gguf_kv *toks = ms_gguf_find_kv(g, "tokenizer.ggml.tokens");
        d->vocab = toks != NULL && toks->type == MS_GGUF_ARRAY ? (int64_t)toks->n : 0;
    }
    if (d->vocab <= 0)
        return MS_FAIL(err, MS_ERR_NOT_FOUND, "%s: no vocabulary size (%s.vocab_size, token_embd.weight or "
                       "tokenizer.ggml.tokens)", path, a->name);
    return MS_OK;
}

/* ---- Llama 3 rope scaling from rope_freqs.weight ---- */

/* The Llama 3 scaling (transformers _compute_llama3_parameters) that a rope_freqs.weight encodes. */
typedef struct llama3_rope {
    bool present;            /* the file has rope_freqs.weight with some factor != 1 */
    double factor, low_freq_factor, high_freq_factor, original_max_position;
} llama3_rope;

/* The factor convert_hf_to_gguf.py (LlamaModel.generate_extra_tensors) writes for default
 * frequency f under parameters r: 1 above the high-frequency wavelength, `factor` below the
 * low one, 1 / ((1 - smooth) / factor + smooth) between. */
static double llama3_factor_of(const llama3_rope *r, float f) {
    double wavelen = 2.0 * M_PI / (double)f;
    double low_wl = r->original_max_position / r->low_freq_factor;
    double high_wl = r->original_max_position / r->high_freq_factor;
    if (wavelen < high_wl)
        return 1.0;
    if (wavelen > low_wl)
        return r->factor;
    double smooth = (r->original_max_position / wavelen - r->low_freq_factor) /
                    (r->high_freq_factor - r->low_freq_factor);
    return 1.0 / ((1.0 - smooth) / r->factor + smooth);
}

/* Index of the first dimension where r does not reproduce ff[n] (relative 1e-5), or n. */
static int64_t llama3_mismatch(const llama3_rope *r, const float *freq, const float *ff, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double want = llama3_factor_of(r, freq[i]);
        if (!(fabs(want - (double)ff[i]) <= 1e-5 * fabs(want)))
            return i;
    }
    return n;
}

/*
 * Recover the Llama 3 scaling parameters from rope_freqs.weight (ne[0] = head_dim / 2, one
 * divisor per rotary pair: llama.cpp's rope uses theta_i = pos * base^(-2i/d) / ff[i]). The
 * factors depend on original_max_position only through the two wavelengths
 * original / low_freq_factor and original / high_freq_factor, so low_freq_factor is fixed at 1
 * (its value in every published Llama 3.x config) and: factor = max ff; from the smoothed
 * dimensions s_i = (1/ff_i - 1/factor) / (1 - 1/factor) = (original * u_i - 1) / (high - 1),
 * u_i = f_i / 2pi, two of them give original and high, one gives original with high = 4 (Llama 3's
 * value), none leaves Llama 3.1's defaults (4, 8192). Values are snapped to integers
 * (original) and thousandths (factor, high), as config.json holds them. The result is
 * then checked against every dimension with the converter's formula: a tensor that no Llama 3
 * parameters reproduce is MS_ERR_UNSUPPORTED naming it and the dimension.
 */
static ms_status read_rope_freqs(const ms_gguf *g, const arch_dims *d, double theta, llama3_rope *out,
                                 ms_error *err) {
    memset(out, 0, sizeof *out);
    const ms_gguf_tensor *t = ms_gguf_find_tensor(g, "rope_freqs.weight");
    if (t == NULL)
        return MS_OK;
    const char *path = ms_gguf_path(g);
    int64_t n = d->head_dim / 2;
    if (t->n_dims != 1 || t->ne[0] != n)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: tensor 'rope_freqs.weight' has %d dims, ne[0] %lld; expected one "
                       "factor per rotary pair (%lld)", path, t->n_dims, (long long)t->ne[0], (long long)n);
    float ff[512], freq[512];
    MS_TRY(ms_gguf_tensor_to_f32(g, t, ff, (size_t)n, err));
    double factor = 0.0;
    for (int64_t i = 0; i < n; i++) {
        if (!(ff[i] >= 1.0f - 1e-6f) || !isfinite(ff[i]))
            return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: tensor 'rope_freqs.weight'[%lld] = %g: not a Llama 3 "
                           "frequency factor (all must be finite and >= 1)", path, (long long)i, (double)ff[i]);
        factor = fmax(factor, (double)ff[i]);
        /* the default frequencies as transformers and the converter compute them (float32) */
        freq[i] = 1.0f / powf((float)theta, (float)(2 * i) / (float)d->head_dim);
    }
    if (factor <= 1.0 + 1e-6)
        return MS_OK; /* all ones: default frequencies */
    int64_t first = -1, last = -1;
    for (int64_t i = 0; i < n; i++)
        if (fabs(ff[i] - 1.0) > 1e-6 && fabs(ff[i] - factor) > 1e-6 * factor) {
            if (first < 0)
                first = i;
            last = i;
        }
    llama3_rope r = {.present = true, .factor = factor, .low_freq_factor = 1.0, .high_freq_factor = 4.0,
                     .original_max_position = 8192.0};
    double s0 = 0, u0 = 0;
    if (first >= 0) {
        s0 = (1.0 / ff[first] - 1.0 / factor) / (1.0 - 1.0 / factor);
        u0 = (double)freq[first] / (2.0 * M_PI);
    }
    if (first >= 0 && last > first) {
        double s1 = (1.0 / ff[last] - 1.0 / factor) / (1.0 - 1.0 / factor);
        double u1 = (double)freq[last] / (2.0 * M_PI);
        double alpha = (s1 - s0) / (u1 - u0), beta = s0 - alpha * u0;
        if (beta < 0) {
            r.high_freq_factor = 1.0 - 1.0 / beta;
            r.original_max_position = -alpha / beta;
        }
    } else if (first >= 0 && u0 > 0) {
        r.original_max_position = (s0 * (r.high_freq_factor - 1.0) + 1.0) / u0;
    }
    llama3_rope snapped = r;
    snapped.original_max_position = round(r.original_max_position);
    snapped.high_freq_factor = round(r.high_freq_factor * 1000.0) / 1000.0;
    snapped.factor = round(r.factor * 1000.0) / 1000.0;
    bool sane = snapped.original_max_position >= 1 && snapped.high_freq_factor > snapped.low_freq_factor;
    int64_t bad = sane ? llama3_mismatch(&snapped, freq, ff, n) : 0;
    if (bad == n) {
        *out = snapped;
        return MS_OK;
    }
    return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: tensor 'rope_freqs.weight' is not a Llama 3 rope scaling (best "
                   "fit factor %g, high_freq_factor %g, original_max_position_embeddings %g gives %g at "
                   "dimension %lld, the file has %g)", path, snapped.factor, snapped.high_freq_factor,
                   snapped.original_max_position, llama3_factor_of(&snapped, freq[bad]), (long long)bad, (double)ff[bad]);
}

/* ---- config.json ---- */

static int jset(json_t *o, const char *k, json_t *v) {
    return v == NULL ? -1 : json_object_set_new(o, k, v);
}

ms_status ms_gguf_model_config_json(const ms_gguf *g, char **out, ms_error *err) {
    *out = NULL;
    const char *path = ms_gguf_path(g);
    const gguf_arch *a;
    MS_TRY(find_arch(g, &a, err));
    arch_dims d;
    MS_TRY(read_dims(g, a, &d, err));
    char k[128];
    int64_t ctx, bos = -1, eos = -1, window = 0, orig = 0;
    double eps, theta, factor = 1.0;
    MS_TRY(ms_gguf_get_int_or(g, akey(k, sizeof k, a, "context_length"), 2048, &ctx, err));
    MS_TRY(ms_gguf_get_float(g, akey(k, sizeof k, a, "attention.layer_norm_rms_epsilon"), &eps, err));
    MS_TRY(ms_gguf_get_float_or(g, akey(k, sizeof k, a, "rope.freq_base"), 10000.0, &theta, err));
    MS_TRY(ms_gguf_get_int_or(g, akey(k, sizeof k, a, "attention.sliding_window"), 0, &window, err));
    MS_TRY(ms_gguf_get_int_or(g, "tokenizer.ggml.bos_token_id", -1, &bos, err));
    MS_TRY(ms_gguf_get_int_or(g, "tokenizer.ggml.eos_token_id", -1, &eos, err));
    const char *scaling = "none";
    if (ms_gguf_find_kv(g, akey(k, sizeof k, a, "rope.scaling.type")) != NULL)
        MS_TRY(ms_gguf_get_string(g, k, &scaling, NULL, err));
    if (strcmp(scaling, "none") != 0) {
        if (strcmp(scaling, "linear") != 0 && strcmp(scaling, "yarn") != 0)
            return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: %s.rope.scaling.type '%s' is not supported (supported: "
                           "none, linear, yarn)", path, a->name, scaling);
        MS_TRY(ms_gguf_get_float(g, akey(k, sizeof k, a, "rope.scaling.factor"), &factor, err));
        MS_TRY(ms_gguf_get_int_or(g, akey(k, sizeof k, a, "rope.scaling.original_context_length"), 0, &orig, err));
    }
    llama3_rope l3 = {0};
    if (theta > 0)
        MS_TRY(read_rope_freqs(g, &d, theta, &l3, err));
    if (l3.present && strcmp(scaling, "none") != 0)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: both %s.rope.scaling.type '%s' and a rope_freqs.weight tensor", path,
                       a->name, scaling);
    if (ctx <= 0 || eps <= 0 || theta <= 0 || window < 0 || factor <= 0)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: inconsistent %s values (context_length %lld, rms epsilon %g, "
                       "rope.freq_base %g, sliding_window %lld, rope.scaling.factor %g)", path, a->name,
                       (long long)ctx, eps, theta, (long long)window, factor);
    json_t *o = json_object(), *archs = json_array();
    int bad = o == NULL || archs == NULL;
    if (!bad) {
        bad |= json_array_append_new(archs, json_string(a->hf_class));
        bad |= jset(o, "architectures", archs);
        archs = NULL;
        bad |= jset(o, "model_type", json_string(a->model_type));
        bad |= jset(o, "hidden_size", json_integer(d.hidden));
        bad |= jset(o, "num_hidden_layers", json_integer(d.layers));
        bad |= jset(o, "num_attention_heads", json_integer(d.heads));
        bad |= jset(o, "num_key_value_heads", json_integer(d.kv_heads));
        bad |= jset(o, "head_dim", json_integer(d.head_dim));
        bad |= jset(o, "intermediate_size", json_integer(d.ffn));
        bad |= jset(o, "vocab_size", json_integer(d.vocab));
        bad |= jset(o, "max_position_embeddings", json_integer(ctx));
        bad |= jset(o, "rms_norm_eps", json_real(eps));
        bad |= jset(o, "rope_theta", json_real(theta));
        bad |= jset(o, "tie_word_embeddings", json_boolean(ms_gguf_find_tensor(g, "output.weight") == NULL));
        bad |= jset(o, "attention_bias", json_boolean(ms_gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL));
        if (window > 0) {
            bad |= jset(o, "sliding_window", json_integer(window));
            bad |= jset(o, "use_sliding_window", json_true());
        } else if (strcmp(a->name, "llama") != 0) {
            bad |= jset(o, "use_sliding_window", json_false());
        }
        if (strcmp(scaling, "none") != 0) {
            json_t *rs = json_object();
            bad |= jset(o, "rope_scaling", rs);
            if (rs != NULL) {
                bad |= jset(rs, "rope_type", json_string(scaling));
                bad |= jset(rs, "factor", json_real(factor));
                if (orig > 0)
                    bad |= jset(rs, "original_max_position_embeddings", json_integer(orig));
            }
        }
        if (l3.present) {
            json_t *rs = json_object();
            bad |= jset(o, "rope_scaling", rs);
            if (rs != NULL) {
                bad |= jset(rs, "rope_type", json_string("llama3"));
                bad |= jset(rs, "factor", json_real(l3.factor));
                bad |= jset(rs, "low_freq_factor", json_real(l3.low_freq_factor));
                bad |= jset(rs, "high_freq_factor", json_real(l3.high_freq_factor));
                bad |= jset(rs, "original_max_position_embeddings", json_integer((json_int_t)l3.original_max_position));
            }
        }
        if (bos >= 0)
            bad |= jset(o, "bos_token_id", json_integer(bos));
        if (eos >= 0)
            bad |= jset(o, "eos_token_id", json_integer(eos));
    }
    json_decref(archs);
    char *text = bad ? NULL : json_dumps(o, JSON_SORT_KEYS | JSON_REAL_PRECISION(17));
    json_decref(o);
    if (text == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory for the derived config", path);
    *out = ms_strdup(text);
    free(text);
    if (*out == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory for the derived config", path);
    return MS_OK;
}

/* ---- tensor names ---- */

/* ORDER: per-layer suffixes and their Hugging Face names. */
static const char *const layer_map[][2] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
};

static const char *const global_map[][2] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};

/* Which rows to un-permute: 0 none, 1 q (n_head groups), 2 k (n_head_kv groups). */
typedef struct name_map {
    char *hf;      /* ms_malloc'd */
    int permute;
} name_map;

static ms_status map_name(const ms_gguf *g, const char *name, int64_t n_layers, name_map *out, ms_error *err) {
    out->hf = NULL;
    out->permute = 0;
    for (size_t i = 0; i < MS_ARRAY_LEN(global_map); i++)
        if (strcmp(name, global_map[i][0]) == 0) {
            out->hf = ms_strdup(global_map[i][1]);
            goto done;
        }
    if (strncmp(name, "blk.", 4) == 0 && name[4] >= '0' && name[4] <= '9') {
        char *end;
        long layer = strtol(name + 4, &end, 10);
        if (*end == '.' && layer >= 0 && layer < n_layers && (name[4] != '0' || end == name + 5)) {
            for (size_t i = 0; i < MS_ARRAY_LEN(layer_map); i++)
                if (strcmp(end + 1, layer_map[i][0]) == 0) {
                    out->hf = ms_asprintf("model.layers.%ld.%s", layer, layer_map[i][1]);
                    out->permute = strncmp(layer_map[i][0], "attn_q.", 7) == 0   ? 1
                                   : strncmp(layer_map[i][0], "attn_k.", 7) == 0 ? 2
                                                                                 : 0;
                    goto done;
                }
        } else if (*end == '.' && layer >= n_layers) {
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: tensor '%s' names layer %ld, but the model has %lld layers",
                           ms_gguf_path(g), name, layer, (long long)n_layers);
        }
    }
    return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: tensor '%s' has no Hugging Face counterpart this loader knows "
                   "(supported: token_embd, output_norm, output and blk.N.{attn_norm, attn_q/k/v, attn_output, "
                   "attn_q/k_norm, ffn_norm, ffn_gate/up/down})", ms_gguf_path(g), name);
done:
    if (out->hf == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", ms_gguf_path(g));
    return MS_OK;
}

/* Undo LlamaModel.permute on rows [n_rows] of `cols` floats: n_groups heads of hd rows each. */
static ms_status unpermute_rows(float *w, int64_t n_rows, int64_t cols, int64_t n_groups, const char *path,
                                const char *name, ms_error *err) {
    if (n_groups <= 0 || n_rows % n_groups != 0 || (n_rows / n_groups) % 2 != 0)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: tensor '%s' has %lld rows, not a multiple of %lld heads of an even "
                       "size", path, name, (long long)n_rows, (long long)n_groups);
    int64_t hd = n_rows / n_groups, half = hd / 2;
    size_t row_bytes = (size_t)cols * sizeof(float);
    float *tmp = ms_malloc((size_t)hd * row_bytes);
    if (tmp == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory un-permuting '%s'", path, name);
    for (int64_t h = 0; h < n_groups; h++) {
        float *head = w + h * hd * cols;
        memcpy(tmp, head, (size_t)hd * row_bytes);
        /* GGUF row 2*j + s holds Hugging Face row s*half + j */
        for (int64_t j = 0; j < half; j++)
            for (int64_t s = 0; s < 2; s++)
                memcpy(head + (s * half + j) * cols, tmp + (2 * j + s) * cols, row_bytes);
    }
    ms_free(tmp);
    return MS_OK;
}

static int cmp_st(const void *x, const void *y) {
    return strcmp(((const ms_st_tensor *)x)->name, ((const ms_st_tensor *)y)->name);
}

/* Serial part of loading tensor i: map its name, check type and shape, allocate its float32
 * buffer and fill its descriptor. The conversion itself runs in parallel (convert_task). */
static ms_status prepare_tensor(ms_gguf_model *m, const gguf_arch *a, const arch_dims *d, size_t i, ms_error *err) {
    const ms_gguf *g = m->g;
    const char *path = ms_gguf_path(g);
    const ms_gguf_tensor *gt = ms_gguf_tensor_at(g, m->src[i]);
    name_map nm;
    MS_TRY(map_name(g, gt->name, d->layers, &nm, err));
    m->names[i] = nm.hf;
    if (!ms_ggml_type_can_dequantize(gt->type))
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: tensor '%s' has ggml type %s, which this build cannot "
                       "dequantize (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)",
                       path, gt->name, ms_ggml_type_name(gt->type));
    if (gt->n_dims > 2)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: tensor '%s' has %d dimensions, a weight has 1 or 2", path,
                       gt->name, gt->n_dims);
    if (gt->n_elems > ((size_t)1 << 40))
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: tensor '%s' is absurdly large (%zu elements)", path, gt->name,
                       gt->n_elems);
    ms_st_tensor *t = &m->tensors[i];
    t->name = nm.hf;
    t->dtype = MS_ST_DTYPE_F32;
    t->n_dims = gt->n_dims;
    for (int k = 0; k < gt->n_dims; k++)
        t->shape[k] = gt->ne[gt->n_dims - 1 - k];
    t->n_elems = gt->n_elems;
    t->n_bytes = gt->n_elems * sizeof(float);
    t->file_offset = gt->file_offset;
    t->file_path = path;
    if (a->permuted_qk && nm.permute != 0) {
        int64_t groups = nm.permute == 1 ? d->heads : d->kv_heads;
        if (t->shape[0] != groups * d->head_dim)
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: tensor '%s' has %lld rows, the metadata implies %lld heads x "
                           "%lld", path, gt->name, (long long)t->shape[0], (long long)groups, (long long)d->head_dim);
        m->permute_groups[i] = groups;
    }
    float *buf = ms_malloc(gt->n_elems * sizeof *buf);
    if (buf == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory for tensor '%s' (%zu floats)", path, gt->name,
                       gt->n_elems);
    m->bufs[i] = buf;
    t->data = buf;
    return MS_OK;
}

/* Parallel part: dequantize tensor `task` and undo the permutation; the status goes to
 * m->status[task] (the message is made afterwards, in tensor order, on the calling thread). */
static void convert_task(void *arg, int32_t task, int32_t thread) {
    (void)thread;
    ms_gguf_model *m = arg;
    size_t i = (size_t)task;
    const ms_gguf_tensor *gt = ms_gguf_tensor_at(m->g, m->src[i]);
    ms_status st = ms_ggml_dequantize(gt->type, gt->data, m->bufs[i], gt->n_elems);
    if (st == MS_OK && m->permute_groups[i] > 0) {
        const ms_st_tensor *t = &m->tensors[i];
        ms_error local = {0};
        st = unpermute_rows(m->bufs[i], t->shape[0], t->n_dims == 2 ? t->shape[1] : 1, m->permute_groups[i],
                            ms_gguf_path(m->g), gt->name, &local);
    }
    m->status[i] = st;
}

/* Threads for the conversion: the online CPUs, at most 16 (memory bandwidth saturates first). */
static int32_t convert_threads(void) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > 16 ? 16 : (int32_t)n;
}

ms_status ms_gguf_model_init(ms_gguf_model **out, const char *path, ms_error *err) {
    *out = NULL;
    ms_gguf_model *m = ms_calloc(1, sizeof *m);
    if (m == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", path);
    ms_status st = ms_gguf_init(&m->g, path, err);
    const gguf_arch *a = NULL;
    arch_dims d;
    if (st == MS_OK)
        st = find_arch(m->g, &a, err);
    if (st == MS_OK)
        st = read_dims(m->g, a, &d, err);
    /* rope_freqs.weight (Llama 3 scaling) goes into the config, not the weights: check it here */
    size_t n_file = st == MS_OK ? ms_gguf_n_tensors(m->g) : 0, n = n_file;
    if (st == MS_OK && ms_gguf_find_tensor(m->g, "rope_freqs.weight") != NULL) {
        char k[128];
        double theta = 0;
        llama3_rope l3;
        st = ms_gguf_get_float_or(m->g, akey(k, sizeof k, a, "rope.freq_base"), 10000.0, &theta, err);
        if (st == MS_OK && !(theta > 0))
            st = MS_FAIL(err, MS_ERR_FORMAT, "%s: %s.rope.freq_base %g is not positive", path, a->name, theta);
        if (st == MS_OK)
            st = read_rope_freqs(m->g, &d, theta, &l3, err);
        n--;
    }
    if (st == MS_OK) {
        m->src = ms_calloc(n ? n : 1, sizeof *m->src);
        if (m->src == NULL)
            st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", path);
        for (size_t j = 0, i = 0; st == MS_OK && j < n_file; j++)
            if (strcmp(ms_gguf_tensor_at(m->g, j)->name, "rope_freqs.weight") != 0)
                m->src[i++] = j;
    }
    if (st == MS_OK) {
        m->tensors = ms_calloc(n ? n : 1, sizeof *m->tensors);
        m->names = ms_calloc(n ? n : 1, sizeof *m->names);
        m->bufs = ms_calloc(n ? n : 1, sizeof *m->bufs);
        m->permute_groups = ms_calloc(n ? n : 1, sizeof *m->permute_groups);
        m->status = ms_calloc(n ? n : 1, sizeof *m->status);
        if (!m->tensors || !m->names || !m->bufs || !m->permute_groups || !m->status)
            st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", path);
        else
            m->n = n;
        for (size_t i = 0; st == MS_OK && i < n; i++)
            st = prepare_tensor(m, a, &d, i, err);
    }
    if (st == MS_OK && n > 0) {
        ms_threadpool *pool = NULL;
        int32_t threads = n > 1 ? convert_threads() : 1;
        st = ms_threadpool_init(&pool, threads, err);
        if (st == MS_OK) {
            ms_threadpool_run(pool, (int32_t)n, convert_task, m);
            ms_threadpool_free(pool);
        }
        for (size_t i = 0; st == MS_OK && i < n; i++)
            if (m->status[i] != MS_OK)
                st = MS_FAIL(err, m->status[i], "%s: tensor '%s': cannot convert to float32 (%s)", path,
                             ms_gguf_tensor_at(m->g, m->src[i])->name, ms_status_str(m->status[i]));
    }
    if (st == MS_OK) {
        /* sort descriptors; the name/buffer arrays are only for freeing, order does not matter */
        qsort(m->tensors, m->n, sizeof *m->tensors, cmp_st);
        for (size_t i = 1; i < m->n && st == MS_OK; i++)
            if (strcmp(m->tensors[i - 1].name, m->tensors[i].name) == 0)
                st = MS_FAIL(err, MS_ERR_FORMAT, "%s: two tensors map to '%s'", path, m->tensors[i].name);
    }
    if (st != MS_OK) {
        ms_gguf_model_free(m);
        return st;
    }
    *out = m;
    return MS_OK;
}

void ms_gguf_model_free(ms_gguf_model *m) {
    if (m == NULL)
        return;
    for (size_t i = 0; i < m->n; i++) {
        ms_free(m->names ? m->names[i] : NULL);
        ms_free(m->bufs ? m->bufs[i] : NULL);
    }
    ms_free(m->names);
    ms_free(m->bufs);
    ms_free(m->permute_groups);
    ms_free(m->status);
    ms_free(m->src);
    ms_free(m->tensors);
    ms_gguf_free(m->g);
    ms_free(m);
}

const ms_gguf *ms_gguf_model_file(const ms_gguf_model *m) {
    return m->g;
}

size_t ms_gguf_model_n_tensors(const ms_gguf_model *m) {
    return m->n;
}

const ms_st_tensor *ms_gguf_model_tensor_at(const ms_gguf_model *m, size_t i) {
    MS_ASSERT(i < m->n);
    return &m->tensors[i];
}

/* ---- the quantized blocks as stored ---- */

/* Original (file-order) index of the tensor with Hugging Face name `name`, or -1. */
static ptrdiff_t find_raw(const ms_gguf_model *m, const char *name) {
    for (size_t i = 0; i < m->n; i++)
        if (m->names[i] != NULL && strcmp(m->names[i], name) == 0)
            return (ptrdiff_t)i;
    return -1;
}

ms_status ms_gguf_model_raw_info(const ms_gguf_model *m, const char *name, ms_gguf_raw_info *out, ms_error *err) {
    memset(out, 0, sizeof *out);
    ptrdiff_t i = find_raw(m, name);
    if (i < 0)
        return MS_FAIL(err, MS_ERR_NOT_FOUND, "%s: no tensor '%s'", ms_gguf_path(m->g), name);
    const ms_gguf_tensor *gt = ms_gguf_tensor_at(m->g, m->src[i]);
    out->type = gt->type;
    out->rows = gt->n_dims == 2 ? gt->ne[1] : 1;
    out->cols = gt->ne[0];
    out->row_bytes = gt->n_bytes / (size_t)out->rows;
    out->permute_groups = m->permute_groups[i];
    return MS_OK;
}

ms_status ms_gguf_model_copy_raw_rows(const ms_gguf_model *m, const char *name, int64_t row0, int64_t n_rows,
                                      void *dst, size_t cap, ms_error *err) {
    ms_gguf_raw_info ri;
    MS_TRY(ms_gguf_model_raw_info(m, name, &ri, err));
    if (row0 < 0 || n_rows < 0 || row0 + n_rows > ri.rows || (size_t)n_rows * ri.row_bytes > cap)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: tensor '%s': rows [%lld, %lld) of %lld (%zu bytes each) into "
                       "%zu bytes", ms_gguf_path(m->g), name, (long long)row0, (long long)(row0 + n_rows),
                       (long long)ri.rows, ri.row_bytes, cap);
    const ms_gguf_tensor *gt = ms_gguf_tensor_at(m->g, m->src[find_raw(m, name)]);
    const uint8_t *src = gt->data;
    uint8_t *d = dst;
    int64_t hd = ri.permute_groups > 0 ? ri.rows / ri.permute_groups : 0, half = hd / 2;
    for (int64_t r = row0; r < row0 + n_rows; r++) {
        int64_t g = r;
        if (hd > 0) { /* Hugging Face row h hd + s half + j is GGUF row h hd + 2 j + s */
            int64_t h = r / hd, rem = r % hd;
            g = h * hd + 2 * (rem % half) + rem / half;
        }
        memcpy(d + (size_t)(r - row0) * ri.row_bytes, src + (size_t)g * ri.row_bytes, ri.row_bytes);
    }
    return MS_OK;
}
