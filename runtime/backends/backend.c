/*
 * backend.c - backend-independent pieces of the op interface (backend.h): dtypes and scalar
 * conversions, tensor views, the paged KV arena size, RoPE inverse frequencies, the host-side
 * check of attention plans, and the fallbacks of optional vtable entries.
 *
 * Nothing here touches backend memory except through the vtable.
 */
#include "backend.h"

#include <math.h>

#include "hf_config.h"
#include <stdio.h>
#include <string.h>

/* ---- dtypes ---- */

const char *ms_dtype_str(ms_dtype dt) {
    switch (dt) {
    case MS_DTYPE_F32: return "f32";
    case MS_DTYPE_BF16: return "bf16";
    case MS_DTYPE_F16: return "f16";
    case MS_DTYPE_I32: return "i32";
    default: return "?";
    }
}

size_t ms_dtype_size(ms_dtype dt) {
    switch (dt) {
    case MS_DTYPE_F32: return 4;
    case MS_DTYPE_BF16: return 2;
    case MS_DTYPE_F16: return 2;
    case MS_DTYPE_I32: return 4;
    default: return 0;
    }
}

/* The scalar conversions declared in backend.h (ms_bf16_to_f32, ...) are defined once, in
 * safetensors.c (same prototypes in safetensors.h); the loaders and the backends share them. */

/* ---- tensors ---- */

ms_tensor ms_tensor_make(void *data, ms_dtype dt, int32_t ndim, const int64_t *shape) {
    MS_ASSERT(ndim >= 1 && ndim <= MS_TENSOR_MAX_DIMS);
    ms_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dt;
    t.ndim = ndim;
    for (int i = 0; i < MS_TENSOR_MAX_DIMS; i++)
        t.shape[i] = 1;
    int64_t s = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        t.shape[i] = shape[i];
        t.stride[i] = s;
        s *= shape[i];
    }
    return t;
}

ms_tensor ms_tensor_1d(void *data, ms_dtype dt, int64_t n0) {
    int64_t s[1] = {n0};
    return ms_tensor_make(data, dt, 1, s);
}

ms_tensor ms_tensor_2d(void *data, ms_dtype dt, int64_t n0, int64_t n1) {
    int64_t s[2] = {n0, n1};
    return ms_tensor_make(data, dt, 2, s);
}

ms_tensor ms_tensor_3d(void *data, ms_dtype dt, int64_t n0, int64_t n1, int64_t n2) {
    int64_t s[3] = {n0, n1, n2};
    return ms_tensor_make(data, dt, 3, s);
}

ms_tensor ms_tensor_slice(const ms_tensor *t, int32_t dim, int64_t start, int64_t len) {
    MS_ASSERT(dim >= 0 && dim < t->ndim);
    MS_ASSERT(start >= 0 && len >= 0 && start + len <= t->shape[dim]);
    ms_tensor v = *t;
    v.data = (char *)t->data + (size_t)(start * t->stride[dim]) * ms_dtype_size(t->dtype);
    v.shape[dim] = len;
    return v;
}

ms_tensor ms_tensor_split_heads(const ms_tensor *t, int64_t h, int64_t d) {
    MS_ASSERT(t->ndim == 2 && t->shape[1] == h * d && t->stride[1] == 1);
    ms_tensor v = *t;
    v.ndim = 3;
    v.shape[1] = h;
    v.shape[2] = d;
    v.stride[1] = d;
    v.stride[2] = 1;
    return v;
}

int64_t ms_tensor_numel(const ms_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

bool ms_tensor_is_contiguous(const ms_tensor *t) {
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != s)
            return false;
        s *= t->shape[i];
    }
    return true;
}

const char *ms_tensor_shape_str(const ms_tensor *t, char *buf, size_t size) {
    size_t o = 0;
    if (size == 0)
        return buf;
    buf[0] = '\0';
    o += (size_t)snprintf(buf + o, size - o, "[");
    for (int i = 0; i < t->ndim && o < size; i++)
        o += (size_t)snprintf(buf + o, size - o, "%s%lld", i ? ", " : "", (long long)t->shape[i]);
    if (o < size)
        snprintf(buf + o, size - o, "]");
    return buf;
}

/* ---- paged KV arena ---- */

size_t ms_paged_kv_bytes(const ms_paged_kv *kv) {
    return (size_t)kv->n_layers * (size_t)kv->n_pages * 2u * (size_t)kv->page_size *
           (size_t)kv->n_kv_heads * (size_t)kv->head_dim * ms_dtype_size(kv->dtype);
}

/* ---- RoPE inverse frequencies ---- */

ms_status ms_rope_compute_inv_freq(const ms_rope_config *c, float *inv_freq, ms_error *err) {
    int32_t r = c->rotary_dim ? c->rotary_dim : c->head_dim;
    if (c->head_dim <= 0 || r <= 0 || r > c->head_dim || r % 2 != 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "rope: rotary_dim %d must be even and in (0, head_dim %d]", r, c->head_dim);
    if (!(c->theta > 0.0) || !isfinite(c->theta))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "rope: theta %g must be a positive number",
                       c->theta);
    if (c->style < 0 || c->style >= MS_ROPE_STYLE_COUNT)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "rope: unknown style %d", (int)c->style);
    if (c->scaling != MS_ROPE_SCALING_NONE && !(c->factor > 0.0))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "rope: scaling factor %g must be positive",
                       c->factor);
    if (c->scaling == MS_ROPE_SCALING_LLAMA3 &&
        (!(c->original_max_position > 0.0) || !(c->high_freq_factor > c->low_freq_factor) ||
         !(c->low_freq_factor > 0.0)))
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "rope: llama3 scaling needs original_max_position_embeddings > 0 and "
                       "high_freq_factor (%g) > low_freq_factor (%g) > 0",
                       c->high_freq_factor, c->low_freq_factor);
    if (c->scaling < 0 || c->scaling >= MS_ROPE_SCALING_COUNT)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "rope: unknown scaling %d", (int)c->scaling);

    /* transformers _compute_default_rope_parameters, in float32:
     * 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)) */
    float base = (float)c->theta;
    for (int32_t j = 0; j < r / 2; j++) {
        float e = (float)(2 * j) / (float)r;
        inv_freq[j] = 1.0f / powf(base, e);
    }
    if (c->scaling == MS_ROPE_SCALING_LINEAR) {
        for (int32_t j = 0; j < r / 2; j++)
            inv_freq[j] = inv_freq[j] / (float)c->factor;
    } else if (c->scaling == MS_ROPE_SCALING_LLAMA3) {
        /* transformers _compute_llama3_parameters; tensors are float32, Python scalars double */
        double old_ctx = c->original_max_position;
        float low_wavelen = (float)(old_ctx / c->low_freq_factor);
        float high_wavelen = (float)(old_ctx / c->high_freq_factor);
        float factor = (float)c->factor;
        for (int32_t j = 0; j < r / 2; j++) {
            float f = inv_freq[j];
            float wavelen = (float)(2.0 * M_PI) / f;
            float g = wavelen > low_wavelen ? f / factor : f;
            float smooth = ((float)old_ctx / wavelen - (float)c->low_freq_factor) /
                           (float)(c->high_freq_factor - c->low_freq_factor);
            float smoothed = (1.0f - smooth) * g / factor + smooth * g;
            bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
            inv_freq[j] = medium ? smoothed : g;
        }
    }
    return MS_OK;
}

ms_status ms_rope_config_from_hf(const ms_rope_params *p, ms_rope_style style,
                                 int32_t head_dim, ms_rope_config *out, ms_error *err) {
    memset(out, 0, sizeof *out);
    if (head_dim <= 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "rope: head_dim %d must be positive", head_dim);
    if (!(p->partial_rotary_factor > 0.0 && p->partial_rotary_factor <= 1.0))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "rope: partial_rotary_factor %g outside (0, 1]",
                       p->partial_rotary_factor);
    out->style = style;
    out->head_dim = head_dim;
    /* transformers: int(head_dim * partial_rotary_factor) */
    out->rotary_dim = (int32_t)((double)head_dim * p->partial_rotary_factor);
    out->theta = p->theta;
    out->factor = p->factor;
    switch (p->type) {
    case MS_ROPE_TYPE_DEFAULT:
        out->scaling = MS_ROPE_SCALING_NONE;
        break;
    case MS_ROPE_TYPE_LINEAR:
        out->scaling = MS_ROPE_SCALING_LINEAR;
        break;
    case MS_ROPE_TYPE_LLAMA3:
        out->scaling = MS_ROPE_SCALING_LLAMA3;
        out->low_freq_factor = p->low_freq_factor;
        out->high_freq_factor = p->high_freq_factor;
        out->original_max_position = (double)p->original_max_position_embeddings;
        break;
    default:
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "rope: rope_type '%s' is not supported yet",
                       ms_rope_type_name(p->type));
    }
    return MS_OK;
}

/* ---- attention plan check ---- */

ms_status ms_attn_batch_check(const ms_attn_limits *limits, const ms_kv_plan *plan,
                              const ms_paged_kv *kv, ms_attn_batch *shape, ms_error *err) {
    int32_t n = plan->n_views;
    int32_t ps = kv->page_size;
    if (n < 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "attn_batch_stage: n_views %d < 0", n);
    if (n > limits->max_seqs)
        return MS_FAIL(err, MS_ERR_CAPACITY,
                       "attn_batch_stage: %d views exceed the batch limit max_seqs = %d", n,
                       limits->max_seqs);
    if (n > 0 && (plan->qo_indptr == NULL || plan->kv_indptr == NULL ||
                  plan->kv_last_page_len == NULL))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "attn_batch_stage: plan arrays missing");
    int32_t n_tokens = n > 0 ? plan->qo_indptr[n] : 0;
    int32_t n_pages = n > 0 ? plan->kv_indptr[n] : 0;
    if (n > 0 && (plan->qo_indptr[0] != 0 || plan->kv_indptr[0] != 0))
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "attn_batch_stage: qo_indptr[0] = %d and kv_indptr[0] = %d must be 0",
                       plan->qo_indptr[0], plan->kv_indptr[0]);
    if (n_tokens > limits->max_tokens)
        return MS_FAIL(err, MS_ERR_CAPACITY,
                       "attn_batch_stage: %d query tokens exceed the batch limit max_tokens = %d",
                       n_tokens, limits->max_tokens);
    if (n_pages > limits->max_pages)
        return MS_FAIL(err, MS_ERR_CAPACITY,
                       "attn_batch_stage: %d pages exceed the batch limit max_pages = %d", n_pages,
                       limits->max_pages);
    if (plan->n_tokens != n_tokens)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "attn_batch_stage: plan n_tokens %d != qo_indptr[n_views] %d",
                       plan->n_tokens, n_tokens);
    if ((plan->token_to_page == NULL) != (plan->token_to_slot == NULL))
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "attn_batch_stage: token_to_page and token_to_slot must be both set or "
                       "both NULL");
    if (n_pages > 0 && plan->kv_indices == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "attn_batch_stage: kv_indices missing");
    /* monotonic first, so no later read goes past the arrays' ends */
    for (int32_t i = 0; i < n; i++) {
        int32_t q_len = plan->qo_indptr[i + 1] - plan->qo_indptr[i];
        int32_t np = plan->kv_indptr[i + 1] - plan->kv_indptr[i];
        if (q_len < 0 || np < 0)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "attn_batch_stage: view %d: indptr decreases (q_len %d, pages %d)", i,
                           q_len, np);
    }

    int32_t max_q = 0, max_kv = 0;
    bool decode = n > 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t q_len = plan->qo_indptr[i + 1] - plan->qo_indptr[i];
        int32_t np = plan->kv_indptr[i + 1] - plan->kv_indptr[i];
        int32_t last = plan->kv_last_page_len[i];
        if ((np == 0 && last != 0) || (np > 0 && (last < 1 || last > ps)))
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "attn_batch_stage: view %d: kv_last_page_len %d out of range for %d "
                           "page(s) of size %d", i, last, np, ps);
        int32_t len = np > 0 ? (np - 1) * ps + last : 0;
        int32_t start = plan->kv_start ? plan->kv_start[i] : 0;
        if (start < 0 || start % ps != 0)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "attn_batch_stage: view %d: kv_start %d must be a non-negative "
                           "multiple of the page size %d", i, start, ps);
        for (int32_t p = plan->kv_indptr[i]; p < plan->kv_indptr[i + 1]; p++)
            if (plan->kv_indices[p] < 0 || plan->kv_indices[p] >= kv->n_pages)
                return MS_FAIL(err, MS_ERR_INVALID_ARG,
                               "attn_batch_stage: view %d: page id %d outside the arena's %d pages",
                               i, plan->kv_indices[p], kv->n_pages);
        max_q = MS_MAX(max_q, q_len);
        max_kv = MS_MAX(max_kv, len);
        if (q_len != 1)
            decode = false;
    }
    for (int32_t t = 0; plan->token_to_page != NULL && t < n_tokens; t++) {
        if (plan->token_to_page[t] < 0 || plan->token_to_page[t] >= kv->n_pages)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "attn_batch_stage: token %d: write page %d outside the arena's %d pages",
                           t, plan->token_to_page[t], kv->n_pages);
        if (plan->token_to_slot[t] < 0 || plan->token_to_slot[t] >= ps)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "attn_batch_stage: token %d: write slot %d outside [0, %d)", t,
                           plan->token_to_slot[t], ps);
    }
    shape->limits = *limits;
    shape->page_size = ps;
    shape->n_seqs = n;
    shape->n_tokens = n_tokens;
    shape->n_pages = n_pages;
    shape->max_q_len = max_q;
    shape->max_kv_len = max_kv;
    shape->is_decode = decode;
    return MS_OK;
}

/* ---- wrappers and fallbacks ---- */

ms_status ms_backend_attn_stage(const ms_backend *b, ms_attn_batch *batch, const ms_kv_plan *plan,
                                const ms_paged_kv *kv, int32_t n_q_heads,
                                const ms_attn_params *params, ms_error *err) {
    MS_TRY(b->iface.attn_batch_stage(b->ctx, batch, plan, kv, err));
    if (b->iface.attn_batch_plan == NULL)
        return MS_OK;
    return b->iface.attn_batch_plan(b->ctx, batch, kv, n_q_heads, params, err);
}

void ms_backend_free(ms_backend *b) {
    if (b == NULL)
        return;
    if (b->iface.free != NULL && b->ctx != NULL)
        b->iface.free(b->ctx);
    memset(b, 0, sizeof *b);
}

ms_status ms_backend_add_rms_norm(const ms_backend *b, ms_tensor *residual, const ms_tensor *x,
                                  const ms_tensor *w, float eps, ms_tensor *out, ms_error *err) {
    if (b->iface.add_rms_norm != NULL)
        return b->iface.add_rms_norm(b->ctx, residual, x, w, eps, out, err);
    MS_TRY(b->iface.add(b->ctx, residual, x, residual, err));
    return b->iface.rms_norm(b->ctx, residual, w, eps, out, err);
}

ms_status ms_backend_rope_kv_write(const ms_backend *b, ms_tensor *q, ms_tensor *k,
                                   const ms_tensor *v, const ms_tensor *pos,
                                   const ms_rope_table *rope, const ms_paged_kv *kv, int32_t layer,
                                   const ms_attn_batch *batch, ms_error *err) {
    if (b->iface.rope_kv_write != NULL)
        return b->iface.rope_kv_write(b->ctx, q, k, v, pos, rope, kv, layer, batch, err);
    MS_TRY(b->iface.rope(b->ctx, q, k, pos, rope, err));
    return b->iface.kv_write(b->ctx, kv, layer, k, v, batch, err);
}
