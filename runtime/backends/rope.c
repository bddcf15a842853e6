/*
 * rope.c - RoPE settings of the op interface (declared in backend.h): inverse frequencies per
 * rotary pair (plain, linear and Llama 3 scaling) and the mapping from config.json's RoPE
 * fields (ms_rope_params of hf_config.h) to an ms_rope_config.
 */
#include "backend.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "hf_config.h"

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

