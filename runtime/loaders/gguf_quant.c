/*
 * gguf_quant.c - ggml block geometry, scalar dequantizers and reference quantizers.
 *
 * Every routine transcribes ggml's scalar reference (ggml/src/ggml-quants.c: dequantize_row_q4_0,
 * _q4_1, _q5_0, _q5_1, _q8_0, _q4_K, _q5_K, _q6_K; quantize_row_q4_0_ref, _q8_0_ref, _q4_K_ref
 * with make_qkx2_quants and nearest_int), keeping its float operations and their order so the
 * results are bit-identical. Blocks are read byte by byte (halves through memcpy-free shifts), so
 * the source may sit at any address inside a mapped file.
 */
#include "gguf_quant.h"

#include <math.h>
#include <string.h>

#include "safetensors.h"

#define QK_K 256

typedef struct ggml_type_info {
    const char *name;
    uint32_t block;       /* elements per block */
    uint32_t block_bytes; /* bytes per block */
} ggml_type_info;

/* ORDER MS_GGML_TYPE: indexed by the ggml_type value; {NULL} marks retired values.
 * Sizes: ggml-common.h (block_* structs) and gguf-py constants.py GGML_QUANT_SIZES. */
static const ggml_type_info ggml_types[MS_GGML_TYPE_COUNT] = {
    [MS_GGML_TYPE_F32] = {"F32", 1, 4},
    [MS_GGML_TYPE_F16] = {"F16", 1, 2},
    [MS_GGML_TYPE_Q4_0] = {"Q4_0", 32, 18},
    [MS_GGML_TYPE_Q4_1] = {"Q4_1", 32, 20},
    [MS_GGML_TYPE_Q5_0] = {"Q5_0", 32, 22},
    [MS_GGML_TYPE_Q5_1] = {"Q5_1", 32, 24},
    [MS_GGML_TYPE_Q8_0] = {"Q8_0", 32, 34},
    [MS_GGML_TYPE_Q8_1] = {"Q8_1", 32, 36},
    [MS_GGML_TYPE_Q2_K] = {"Q2_K", QK_K, 84},
    [MS_GGML_TYPE_Q3_K] = {"Q3_K", QK_K, 110},
    [MS_GGML_TYPE_Q4_K] = {"Q4_K", QK_K, 144},
    [MS_GGML_TYPE_Q5_K] = {"Q5_K", QK_K, 176},
    [MS_GGML_TYPE_Q6_K] = {"Q6_K", QK_K, 210},
    [MS_GGML_TYPE_Q8_K] = {"Q8_K", QK_K, 292},
    [MS_GGML_TYPE_IQ2_XXS] = {"IQ2_XXS", QK_K, 66},
    [MS_GGML_TYPE_IQ2_XS] = {"IQ2_XS", QK_K, 74},
    [MS_GGML_TYPE_IQ3_XXS] = {"IQ3_XXS", QK_K, 98},
    [MS_GGML_TYPE_IQ1_S] = {"IQ1_S", QK_K, 50},
    [MS_GGML_TYPE_IQ4_NL] = {"IQ4_NL", 32, 18},
    [MS_GGML_TYPE_IQ3_S] = {"IQ3_S", QK_K, 110},
    [MS_GGML_TYPE_IQ2_S] = {"IQ2_S", QK_K, 82},
    [MS_GGML_TYPE_IQ4_XS] = {"IQ4_XS", QK_K, 136},
    [MS_GGML_TYPE_I8] = {"I8", 1, 1},
    [MS_GGML_TYPE_I16] = {"I16", 1, 2},
    [MS_GGML_TYPE_I32] = {"I32", 1, 4},
    [MS_GGML_TYPE_I64] = {"I64", 1, 8},
    [MS_GGML_TYPE_F64] = {"F64", 1, 8},
    [MS_GGML_TYPE_IQ1_M] = {"IQ1_M", QK_K, 56},
    [MS_GGML_TYPE_BF16] = {"BF16", 1, 2},
    [MS_GGML_TYPE_TQ1_0] = {"TQ1_0", QK_K, 54},
    [MS_GGML_TYPE_TQ2_0] = {"TQ2_0", QK_K, 66},
    [MS_GGML_TYPE_MXFP4] = {"MXFP4", 32, 17},
};

bool ms_ggml_type_known(uint32_t t) {
    return t < MS_GGML_TYPE_COUNT && ggml_types[t].name != NULL;
}

const char *ms_ggml_type_name(uint32_t t) {
    return ms_ggml_type_known(t) ? ggml_types[t].name : "?";
}

size_t ms_ggml_type_block(uint32_t t) {
    return ms_ggml_type_known(t) ? ggml_types[t].block : 0;
}

size_t ms_ggml_type_block_bytes(uint32_t t) {
    return ms_ggml_type_known(t) ? ggml_types[t].block_bytes : 0;
}

bool ms_ggml_type_can_dequantize(uint32_t t) {
    switch (t) {
    case MS_GGML_TYPE_F32:
    case MS_GGML_TYPE_F16:
    case MS_GGML_TYPE_BF16:
    case MS_GGML_TYPE_Q4_0:
    case MS_GGML_TYPE_Q4_1:
    case MS_GGML_TYPE_Q5_0:
    case MS_GGML_TYPE_Q5_1:
    case MS_GGML_TYPE_Q8_0:
    case MS_GGML_TYPE_Q4_K:
    case MS_GGML_TYPE_Q5_K:
    case MS_GGML_TYPE_Q6_K:
        return true;
    default:
        return false;
    }
}

/* ---- little-endian reads ---- */

static float rd_f16(const uint8_t *p) {
    return ms_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

static uint32_t rd_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static void wr_f16(uint8_t *p, float f) {
    uint16_t h = ms_f32_to_f16(f);
    p[0] = (uint8_t)(h & 0xff);
    p[1] = (uint8_t)(h >> 8);
}

/* ggml-quants.c get_scale_min_k4: the j-th 6-bit scale and min of a Q4_K/Q5_K block. */
static void get_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

/* ---- dequantize_row_* ---- */

static void dq_q4_0(const uint8_t *b, float *y, size_t nb) {
    for (size_t i = 0; i < nb; i++, b += 18, y += 32) {
        const float d = rd_f16(b);
        const uint8_t *qs = b + 2;
        for (int j = 0; j < 16; j++) {
            const int x0 = (qs[j] & 0x0F) - 8;
            const int x1 = (qs[j] >> 4) - 8;
            y[j] = (float)x0 * d;
            y[j + 16] = (float)x1 * d;
        }
    }
}

static void dq_q4_1(const uint8_t *b, float *y, size_t nb) {
    for (size_t i = 0; i < nb; i++, b += 20, y += 32) {
        const float d = rd_f16(b), m = rd_f16(b + 2);
        const uint8_t *qs = b + 4;
        for (int j = 0; j < 16; j++) {
            const int x0 = qs[j] & 0x0F;
            const int x1 = qs[j] >> 4;
            y[j] = (float)x0 * d + m;
            y[j + 16] = (float)x1 * d + m;
        }
    }
}

static void dq_q5_0(const uint8_t *b, float *y, size_t nb) {
    for (size_t i = 0; i < nb; i++, b += 22, y += 32) {
        const float d = rd_f16(b);
        const uint32_t qh = rd_u32(b + 2);
        const uint8_t *qs = b + 6;
        for (int j = 0; j < 16; j++) {
            const uint8_t xh_0 = (uint8_t)(((qh >> (j + 0)) << 4) & 0x10);
            const uint8_t xh_1 = (uint8_t)(((qh >> (j + 12))) & 0x10);
            const int x0 = ((qs[j] & 0x0F) | xh_0) - 16;
            const int x1 = ((qs[j] >> 4) | xh_1) - 16;
            y[j] = (float)x0 * d;
            y[j + 16] = (float)x1 * d;
        }
    }
}

static void dq_q5_1(const uint8_t *b, float *y, size_t nb) {
    for (size_t i = 0; i < nb; i++, b += 24, y += 32) {
        const float d = rd_f16(b), m = rd_f16(b + 2);
        const uint32_t qh = rd_u32(b + 4);
        const uint8_t *qs = b + 8;
        for (int j = 0; j < 16; j++) {
            const uint8_t xh_0 = (uint8_t)(((qh >> (j + 0)) << 4) & 0x10);
            const uint8_t xh_1 = (uint8_t)(((qh >> (j + 12))) & 0x10);
            const int x0 = (qs[j] & 0x0F) | xh_0;
            const int x1 = (qs[j] >> 4) | xh_1;
            y[j] = (float)x0 * d + m;
            y[j + 16] = (float)x1 * d + m;
        }
    }
}

static void dq_q8_0(const uint8_t *b, float *y, size_t nb) {
    for (size_t i = 0; i < nb; i++, b += 34, y += 32) {
        const float d = rd_f16(b);
        for (int j = 0; j < 32; j++)
            y[j] = (float)(int8_t)b[2 + j] * d;
    }
}

static void dq_q4_k(const uint8_t *b, float *y, size_t nb) {
    for (size_t i = 0; i < nb; i++, b += 144) {
        const float d = rd_f16(b), min = rd_f16(b + 2);
        const uint8_t *scales = b + 4, *q = b + 16;
        int is = 0;
        uint8_t sc, m;
        for (int j = 0; j < QK_K; j += 64) {
            get_scale_min_k4(is + 0, scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            get_scale_min_k4(is + 1, scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; ++l)
                *y++ = d1 * (float)(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; ++l)
                *y++ = d2 * (float)(q[l] >> 4) - m2;
            q += 32;
            is += 2;
        }
    }
}

static void dq_q5_k(const uint8_t *b, float *y, size_t nb) {
    for (size_t i = 0; i < nb; i++, b += 176) {
        const float d = rd_f16(b), min = rd_f16(b + 2);
        const uint8_t *scales = b + 4, *qh = b + 16, *ql = b + 48;
        int is = 0;
        uint8_t sc, m;
        unsigned u1 = 1, u2 = 2;
        for (int j = 0; j < QK_K; j += 64) {
            get_scale_min_k4(is + 0, scales, &sc, &m);
            const float d1 = d * sc, m1 = min * m;
            get_scale_min_k4(is + 1, scales, &sc, &m);
            const float d2 = d * sc, m2 = min * m;
            for (int l = 0; l < 32; ++l)
                *y++ = d1 * (float)((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
            for (int l = 0; l < 32; ++l)
                *y++ = d2 * (float)((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
            ql += 32;
            is += 2;
            u1 <<= 2;
            u2 <<= 2;
        }
    }
}

static void dq_q6_k(const uint8_t *b, float *y, size_t nb) {
    for (size_t i = 0; i < nb; i++, b += 210) {
        const float d = rd_f16(b + 208);
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *sc = (const int8_t *)(b + 192);
        for (int n = 0; n < QK_K; n += 128) {
            for (int l = 0; l < 32; ++l) {
                int is = l / 16;
                const int8_t q1 = (int8_t)((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int8_t q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int8_t q3 = (int8_t)((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int8_t q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l + 0] = d * (float)sc[is + 0] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
            y += 128;
            ql += 64;
            qh += 32;
            sc += 8;
        }
    }
}

ms_status ms_ggml_dequantize(uint32_t t, const void *src, float *dst, size_t n) {
    if (!ms_ggml_type_can_dequantize(t))
        return MS_ERR_UNSUPPORTED;
    const size_t blk = ggml_types[t].block;
    if (n % blk != 0)
        return MS_ERR_INVALID_ARG;
    const uint8_t *b = src;
    const size_t nb = n / blk;
    switch (t) {
    case MS_GGML_TYPE_F32:
        memcpy(dst, src, n * sizeof *dst);
        break;
    case MS_GGML_TYPE_F16:
        for (size_t i = 0; i < n; i++)
            dst[i] = rd_f16(b + 2 * i);
        break;
    case MS_GGML_TYPE_BF16:
        for (size_t i = 0; i < n; i++)
            dst[i] = ms_bf16_to_f32((uint16_t)(b[2 * i] | (b[2 * i + 1] << 8)));
        break;
    case MS_GGML_TYPE_Q4_0: dq_q4_0(b, dst, nb); break;
    case MS_GGML_TYPE_Q4_1: dq_q4_1(b, dst, nb); break;
    case MS_GGML_TYPE_Q5_0: dq_q5_0(b, dst, nb); break;
    case MS_GGML_TYPE_Q5_1: dq_q5_1(b, dst, nb); break;
    case MS_GGML_TYPE_Q8_0: dq_q8_0(b, dst, nb); break;
    case MS_GGML_TYPE_Q4_K: dq_q4_k(b, dst, nb); break;
    case MS_GGML_TYPE_Q5_K: dq_q5_k(b, dst, nb); break;
    case MS_GGML_TYPE_Q6_K: dq_q6_k(b, dst, nb); break;
    default:
        return MS_ERR_UNSUPPORTED; /* excluded by ms_ggml_type_can_dequantize above */
    }
    return MS_OK;
}

/* ---- reference quantizers ---- */

/* ggml-quants.c nearest_int: round to nearest (ties to even) through the float mantissa;
 * valid for |fval| <= 4194303, which every caller below guarantees by clamping its inputs'
 * range first (|q| <= 63 or 15 after scaling). */
static int nearest_int(float fval) {
    float val = fval + 12582912.f;
    int i;
    memcpy(&i, &val, sizeof(int));
    return (i & 0x007fffff) - 0x00400000;
}

static void q_q4_0(const float *x, uint8_t *b, size_t nb) {
    for (size_t i = 0; i < nb; i++, x += 32, b += 18) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < 32; j++) {
            const float v = x[j];
            if (amax < fabsf(v)) {
                amax = fabsf(v);
                max = v;
            }
        }
        const float d = max / -8;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        wr_f16(b, d);
        for (int j = 0; j < 16; j++) {
            const float x0 = x[j] * id;
            const float x1 = x[16 + j] * id;
            const uint8_t xi0 = (uint8_t)MS_MIN(15, (int8_t)(x0 + 8.5f));
            const uint8_t xi1 = (uint8_t)MS_MIN(15, (int8_t)(x1 + 8.5f));
            b[2 + j] = (uint8_t)(xi0 | (xi1 << 4));
        }
    }
}

static void q_q8_0(const float *x, uint8_t *b, size_t nb) {
    for (size_t i = 0; i < nb; i++, x += 32, b += 34) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(x[j]));
        const float d = amax / ((1 << 7) - 1);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        wr_f16(b, d);
        for (int j = 0; j < 32; ++j)
            b[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
    }
}

/* ggml-quants.c make_qkx2_quants (weighted min/scale search over nstep + 1 candidate scales). */
static float make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L,
                              float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep,
                              bool use_mad) {
    float min = x[0];
    float max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min)
            min = x[i];
        if (x[i] > max)
            max = x[i];
        float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0)
        min = 0;
    if (max == min) {
        for (int i = 0; i < n; ++i)
            L[i] = 0;
        *the_min = -min;
        return 0.f;
    }
    float iscale = (float)nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; ++i) {
        int l = nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)MS_MAX(0, MS_MIN(nmax, l));
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        float w = weights[i];
        best_error += w * diff;
    }
    if (nstep < 1) {
        *the_min = -min;
        return scale;
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            int l = nearest_int(iscale * (x[i] - min));
            l = MS_MAX(0, MS_MIN(nmax, l));
            Laux[i] = (uint8_t)l;
            float w = weights[i];
            sum_l += w * (float)l;
            sum_l2 += w * (float)l * (float)l;
            sum_xl += w * (float)l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; ++i) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                float w = weights[i];
                cur_error += w * diff;
            }
            if (cur_error < best_error) {
                for (int i = 0; i < n; ++i)
                    L[i] = Laux[i];
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

static void q_q4_k(const float *x, uint8_t *b, size_t nb) {
    uint8_t L[QK_K], Laux[32];
    float weights[32], mins[QK_K / 32], scales[QK_K / 32];
    for (size_t i = 0; i < nb; i++, x += QK_K, b += 144) {
        uint8_t *yscales = b + 4;
        memset(yscales, 0, 12);
        float max_scale = 0; /* as the min is subtracted, scales are always positive */
        float max_min = 0;
        for (int j = 0; j < QK_K / 32; ++j) {
            float sum_x2 = 0;
            for (int l = 0; l < 32; ++l)
                sum_x2 += x[32 * j + l] * x[32 * j + l];
            float av_x = sqrtf(sum_x2 / 32);
            for (int l = 0; l < 32; ++l)
                weights[l] = av_x + fabsf(x[32 * j + l]);
            scales[j] = make_qkx2_quants(32, 15, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, -1.f,
                                         0.1f, 20, false);
            if (scales[j] > max_scale)
                max_scale = scales[j];
            if (mins[j] > max_min)
                max_min = mins[j];
        }
        float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
        float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
        for (int j = 0; j < QK_K / 32; ++j) {
            uint8_t ls = (uint8_t)nearest_int(inv_scale * scales[j]);
            uint8_t lm = (uint8_t)nearest_int(inv_min * mins[j]);
            ls = MS_MIN(63, ls);
            lm = MS_MIN(63, lm);
            if (j < 4) {
                yscales[j] = ls;
                yscales[j + 4] = lm;
            } else {
                yscales[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
                yscales[j - 4] |= (uint8_t)((ls >> 4) << 6);
                yscales[j - 0] |= (uint8_t)((lm >> 4) << 6);
            }
        }
        wr_f16(b, max_scale / 63.f);
        wr_f16(b + 2, max_min / 63.f);
        const float dd = rd_f16(b), dmin = rd_f16(b + 2);
        uint8_t sc, m;
        for (int j = 0; j < QK_K / 32; ++j) {
            get_scale_min_k4(j, yscales, &sc, &m);
            const float d = dd * sc;
            if (d == 0.0f)
                continue;
            const float dm = dmin * m;
            for (int ii = 0; ii < 32; ++ii) {
                int l = nearest_int((x[32 * j + ii] + dm) / d);
                l = MS_MAX(0, MS_MIN(15, l));
                L[32 * j + ii] = (uint8_t)l;
            }
        }
        uint8_t *q = b + 16;
        for (int j = 0; j < QK_K; j += 64) {
            for (int l = 0; l < 32; ++l)
                q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
            q += 32;
        }
    }
}

ms_status ms_ggml_quantize(uint32_t t, const float *x, void *dst, size_t n) {
    uint8_t *b = dst;
    switch (t) {
    case MS_GGML_TYPE_F32:
        memcpy(dst, x, n * sizeof *x);
        return MS_OK;
    case MS_GGML_TYPE_F16:
        for (size_t i = 0; i < n; i++)
            wr_f16(b + 2 * i, x[i]);
        return MS_OK;
    case MS_GGML_TYPE_BF16:
        for (size_t i = 0; i < n; i++) {
            uint16_t h = ms_f32_to_bf16(x[i]);
            b[2 * i] = (uint8_t)(h & 0xff);
            b[2 * i + 1] = (uint8_t)(h >> 8);
        }
        return MS_OK;
    case MS_GGML_TYPE_Q4_0:
    case MS_GGML_TYPE_Q8_0:
    case MS_GGML_TYPE_Q4_K:
        break;
    default:
        return MS_ERR_UNSUPPORTED;
    }
    const size_t blk = ggml_types[t].block;
    if (n % blk != 0)
        return MS_ERR_INVALID_ARG;
    if (t == MS_GGML_TYPE_Q4_0)
        q_q4_0(x, b, n / blk);
    else if (t == MS_GGML_TYPE_Q8_0)
        q_q8_0(x, b, n / blk);
    else
        q_q4_k(x, b, n / blk);
    return MS_OK;
}

/* ---- the planar row layout of the CUDA kernels ---- */

bool ms_ggml_planar_split(uint32_t t, size_t *off, size_t *p0) {
    size_t o = 0, n = ms_ggml_type_block_bytes(t);
    bool split = true;
    switch (t) {
    case MS_GGML_TYPE_Q4_0: o = 2, n = 16; break;
    case MS_GGML_TYPE_Q4_1: o = 4, n = 16; break;
    case MS_GGML_TYPE_Q5_0: o = 6, n = 16; break;
    case MS_GGML_TYPE_Q8_0: o = 2, n = 32; break;
    case MS_GGML_TYPE_Q6_K: o = 0, n = 208; break;
    default: split = false; break;
    }
    if (off != NULL)
        *off = o;
    if (p0 != NULL)
        *p0 = n;
    return split;
}

ms_status ms_ggml_rows_to_planar(uint32_t t, const void *src, void *dst, size_t n_rows, size_t in) {
    const size_t blk = ms_ggml_type_block(t), bb = ms_ggml_type_block_bytes(t);
    if (blk == 0 || bb == 0 || in == 0 || in % blk != 0 || src == NULL || dst == NULL)
        return MS_ERR_INVALID_ARG;
    const size_t nb = in / blk, rb = nb * bb;
    size_t off, p0;
    if (!ms_ggml_planar_split(t, &off, &p0)) {
        memcpy(dst, src, n_rows * rb);
        return MS_OK;
    }
    const size_t p1 = bb - p0;
    for (size_t r = 0; r < n_rows; r++) {
        const uint8_t *s = (const uint8_t *)src + r * rb;
        uint8_t *q = (uint8_t *)dst + r * rb, *h = q + nb * p0;
        for (size_t k = 0; k < nb; k++, s += bb) {
            memcpy(q + k * p0, s + off, p0);
            /* the bytes before and after the quants, in order (one of the two is empty) */
            memcpy(h + k * p1, s, off);
            memcpy(h + k * p1 + off, s + off + p0, bb - off - p0);
        }
    }
    return MS_OK;
}
