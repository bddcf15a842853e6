/*
 * tp.c - tensor parallelism: the per-rank config and weight slices, the linear hook, and the
 * group of rank threads (see tp.h).
 */
#include "tp.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#ifdef MS_HAVE_CUDA
#include "backend_cuda.h"
#include "nccl_comm.h"
#endif

/* ---- per rank ---- */

typedef struct tp_noted {
    const void *data;
    ms_tp_split split;
    int32_t w;
    int64_t rows;  /* shape[0] of this rank's part */
} tp_noted;

struct ms_tp_rank {
    ms_tp_member m;
    const ms_model_desc *desc;
    void *full;                /* the full config struct (owned) */
    void *local;               /* the local one (the engine's, borrowed) */
    int32_t vocab;             /* full vocabulary */
    int32_t vocab_rows;        /* ceil(V / world): the padded shard of the output head */
    ms_tp_split *split;        /* [n_weights] */
    tp_noted *noted;           /* ROW and VOCAB instances */
    size_t n_noted, cap_noted;
    /* attached */
    ms_backend *be;
    ms_status (*linear)(void *ctx, const ms_tensor *x, const ms_tensor *w, const ms_tensor *bias,
                        ms_tensor *y, ms_error *err); /* the backend's own */
    ms_status (*embedding)(void *ctx, const ms_tensor *table, const ms_tensor *ids,
                           ms_tensor *out, ms_error *err); /* the backend's own */
    /* the backend's own fused linears (NULL: it has none, and ms_backend_*_linear's default
       path goes through the hooked linear) */
    ms_status (*silu_mul_linear)(void *ctx, const ms_tensor *gate, const ms_tensor *up,
                                 ms_tensor *tmp, const ms_tensor *w, const ms_tensor *bias,
                                 ms_tensor *y, ms_error *err);
    ms_status (*rms_norm_linear)(void *ctx, ms_tensor *residual, const ms_tensor *x,
                                 const ms_tensor *norm_w, float eps, ms_tensor *h,
                                 const ms_tensor *w, const ms_tensor *bias, ms_tensor *y,
                                 ms_error *err);
    /* the backend's own residual linears (backend.h linear_add, silu_mul_linear_add; NULL: the
       ms_backend_*_add default goes through the hooked linear / silu_mul_linear and add) */
    ms_status (*linear_add)(void *ctx, const ms_tensor *x, const ms_tensor *w,
                            const ms_tensor *bias, ms_tensor *tmp, ms_tensor *y, ms_error *err);
    ms_status (*silu_mul_linear_add)(void *ctx, const ms_tensor *gate, const ms_tensor *up,
                                     ms_tensor *prod, const ms_tensor *w, const ms_tensor *bias,
                                     ms_tensor *tmp, ms_tensor *y, ms_error *err);
    float *scratch;            /* backend [chunk, vocab_rows] local logits */
    float *gathered;           /* host [world, chunk, vocab_rows] (cpu) */
    int64_t chunk;             /* rows per gather */
    int32_t *ids_all;          /* host [world, max_rows] ms_tp_share_ids */
    int32_t max_rows;
};

/* The hooked linear finds its rank by the backend's ctx (kept as is, so every other entry and
 * every backend-specific call keeps working). */
#define TP_MAX_ATTACHED 256
static pthread_mutex_t g_reg_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    void *ctx;
    ms_tp_rank *t;
} g_reg[TP_MAX_ATTACHED];

static ms_tp_rank *tp_lookup(void *ctx) {
    ms_tp_rank *t = NULL;
    pthread_mutex_lock(&g_reg_mu);
    for (int i = 0; i < TP_MAX_ATTACHED && t == NULL; i++)
        if (g_reg[i].ctx == ctx)
            t = g_reg[i].t;
    pthread_mutex_unlock(&g_reg_mu);
    return t;
}

static ms_tp_split tp_classify(const ms_model_desc *d, const ms_md_facts *full_facts, int32_t w,
                               const int64_t *full, const int64_t *loc, int32_t world) {
    const ms_md_weight *wd = &d->weights[w];
    bool same = true;
    for (int32_t i = 0; i < wd->rank; i++)
        same = same && full[i] == loc[i];
    if (same) {
        if (wd->kind == MS_MD_WEIGHT_TENSOR && wd->rank == 2 && wd->tie >= 0 &&
            full[0] == full_facts->vocab)
            return MS_TP_VOCAB;
        return MS_TP_REPLICATED;
    }
    bool rest0 = true, rest1 = full[0] == loc[0];
    for (int32_t i = 1; i < wd->rank; i++)
        rest0 = rest0 && full[i] == loc[i];
    for (int32_t i = 2; i < wd->rank; i++)
        rest1 = rest1 && full[i] == loc[i];
    if (rest0 && loc[0] * world == full[0])
        return MS_TP_COLUMN;
    if (wd->rank >= 2 && rest1 && loc[1] * world == full[1])
        return MS_TP_ROW;
    return (ms_tp_split)-1;
}

static ms_status tp_set_div(ms_hf_config *hf, const char *key, int32_t world, ms_error *err) {
    int64_t v = 0;
    MS_TRY(ms_hf_config_get_int(hf, key, &v, err));
    if (v <= 0 || v % world != 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "tensor parallel: --tp %d does not divide %s (%lld) of %s", world, key,
                       (long long)v, ms_hf_config_path(hf));
    return ms_hf_config_set_int(hf, key, v / world, err);
}

ms_status ms_tp_rank_init(ms_tp_rank **out, const ms_tp_member *m, const ms_model_desc *desc,
                          ms_hf_config *hf, void **config, ms_md_facts *facts, ms_error *err) {
    *out = NULL;
    if (m == NULL || m->world < 1 || m->rank < 0 || m->rank >= m->world)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "tensor parallel: no valid rank");
    const ms_md_facts full_facts = *facts;
    /* every count checked before any is changed, so the message names the first that fails */
    static const char *const keys[] = {"num_attention_heads", "num_key_value_heads",
                                       "intermediate_size"};
    /* head counts the config leaves to the model's defaults: the facts' (the model resolved
       them), written out so that dividing them below divides what the model uses */
    if (!ms_hf_config_has(hf, keys[0]))
        MS_TRY(ms_hf_config_set_int(hf, keys[0], full_facts.n_q_heads, err));
    if (!ms_hf_config_has(hf, keys[1]))
        MS_TRY(ms_hf_config_set_int(hf, keys[1], full_facts.n_kv_heads, err));
    char bad[256] = "";
    size_t nb = 0;
    for (size_t i = 0; i < MS_ARRAY_LEN(keys); i++) {
        int64_t v = 0;
        if (!ms_hf_config_has(hf, keys[i]))
            return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                           "tensor parallel: %s has no %s (only models with HF head and MLP "
                           "counts can be split)", ms_hf_config_path(hf), keys[i]);
        MS_TRY(ms_hf_config_get_int(hf, keys[i], &v, err));
        if ((v <= 0 || v % m->world != 0) && nb < sizeof bad)
            nb += (size_t)snprintf(bad + nb, sizeof bad - nb, "%s%s (%lld)", nb > 0 ? ", " : "",
                                   keys[i], (long long)v);
    }
    if (nb > 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "tensor parallel: --tp %d does not divide %s of %s", m->world, bad,
                       ms_hf_config_path(hf));
    if (full_facts.vocab < m->world)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "tensor parallel: --tp %d is more than the vocabulary (%d)", m->world,
                       (int)full_facts.vocab);
    if (!ms_hf_config_has(hf, "head_dim"))
        MS_TRY(ms_hf_config_set_int(hf, "head_dim", full_facts.head_dim, err));
    for (size_t i = 0; i < MS_ARRAY_LEN(keys); i++)
        MS_TRY(tp_set_div(hf, keys[i], m->world, err));

    ms_tp_rank *t = ms_calloc(1, sizeof *t);
    if (t == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "tensor parallel: out of memory");
    t->m = *m;
    t->desc = desc;
    t->full = *config;
    t->vocab = full_facts.vocab;
    t->vocab_rows = (full_facts.vocab + m->world - 1) / m->world;
    ms_status st = MS_OK;
    t->local = ms_calloc(1, desc->config_size > 0 ? desc->config_size : 1);
    t->split = ms_calloc((size_t)desc->n_weights, sizeof *t->split);
    if (t->local == NULL || t->split == NULL)
        st = MS_FAIL(err, MS_ERR_OOM, "tensor parallel: out of memory");
    if (st == MS_OK)
        st = desc->config_load(hf, t->local, err);
    ms_md_facts lf;
    memset(&lf, 0, sizeof lf);
    if (st == MS_OK)
        st = desc->facts(t->local, &lf, err);
    if (st == MS_OK && (lf.n_q_heads * m->world != full_facts.n_q_heads ||
                        lf.n_kv_heads * m->world != full_facts.n_kv_heads ||
                        lf.head_dim != full_facts.head_dim || lf.hidden != full_facts.hidden ||
                        lf.vocab != full_facts.vocab))
        st = MS_FAIL(err, MS_ERR_UNSUPPORTED,
                     "tensor parallel: model '%s' over %d ranks gives %d q / %d kv heads of %d "
                     "(hidden %d) per rank from %d / %d of %d (hidden %d): its config does not "
                     "split by head",
                     desc->name, m->world, lf.n_q_heads, lf.n_kv_heads, lf.head_dim, lf.hidden,
                     full_facts.n_q_heads, full_facts.n_kv_heads, full_facts.head_dim,
                     full_facts.hidden);
    for (int32_t w = 0; w < desc->n_weights && st == MS_OK; w++) {
        const ms_md_weight *wd = &desc->weights[w];
        int64_t fs[MS_TENSOR_MAX_DIMS] = {1, 1, 1, 1}, ls[MS_TENSOR_MAX_DIMS] = {1, 1, 1, 1};
        if (wd->kind == MS_MD_WEIGHT_FUSED) {
            t->split[w] = MS_TP_COLUMN; /* its parts' (checked below) */
            continue;
        }
        desc->weight_shape(t->full, w, fs);
        desc->weight_shape(t->local, w, ls);
        ms_tp_split s = tp_classify(desc, &full_facts, w, fs, ls, m->world);
        if ((int)s < 0 || (wd->kind == MS_MD_WEIGHT_PART && s != MS_TP_COLUMN &&
                           s != MS_TP_REPLICATED))
            st = MS_FAIL(err, MS_ERR_FORMAT,
                         "tensor parallel: weight '%s' of model '%s' is [%lld, %lld] whole and "
                         "[%lld, %lld] per rank over %d ranks: not a row or column split",
                         wd->key, desc->name, (long long)fs[0], (long long)fs[1],
                         (long long)ls[0], (long long)ls[1], m->world);
        else
            t->split[w] = s;
    }
    if (st != MS_OK) {
        t->full = NULL; /* still the caller's */
        ms_free(t->local);
        ms_tp_rank_free(t);
        return st;
    }
    lf.n_eos = full_facts.n_eos;
    memcpy(lf.eos_ids, full_facts.eos_ids, sizeof lf.eos_ids);
    lf.bos_id = full_facts.bos_id;
    *facts = lf;
    *config = t->local;
    *out = t;
    return MS_OK;
}

void ms_tp_rank_free(ms_tp_rank *t) {
    if (t == NULL)
        return;
    ms_free(t->full);
    ms_free(t->split);
    ms_free(t->noted);
    ms_free(t->ids_all);
    ms_free(t); /* t->local is the engine's config now */
}

ms_tp_split ms_tp_weight_split(const ms_tp_rank *t, int32_t w) { return t->split[w]; }

void ms_tp_full_shape(const ms_tp_rank *t, int32_t w, int64_t *shape) {
    t->desc->weight_shape(t->full, w, shape);
}

/* Rows [*r0, *r0 + *n) of this rank's vocabulary shard. */
static void tp_vocab_range(const ms_tp_rank *t, int64_t *r0, int64_t *n) {
    int64_t a = (int64_t)t->m.rank * t->vocab_rows;
    int64_t b = a + t->vocab_rows < t->vocab ? a + t->vocab_rows : t->vocab;
    *r0 = a;
    *n = b > a ? b - a : 0;
}

void ms_tp_local_shape(const ms_tp_rank *t, int32_t w, int64_t *shape) {
    t->desc->weight_shape(t->local, w, shape);
    if (t->split[w] == MS_TP_VOCAB) {
        int64_t r0, n;
        tp_vocab_range(t, &r0, &n);
        shape[0] = n;
    }
}

ms_tensor ms_tp_source(const ms_tp_rank *t, int32_t w, const void *data, ms_dtype dt) {
    const ms_md_weight *wd = &t->desc->weights[w];
    int64_t fs[MS_TENSOR_MAX_DIMS] = {1, 1, 1, 1}, ls[MS_TENSOR_MAX_DIMS] = {1, 1, 1, 1};
    ms_tp_full_shape(t, w, fs);
    ms_tp_local_shape(t, w, ls);
    ms_tensor full = ms_tensor_make((void *)data, dt, wd->rank, fs);
    switch (t->split[w]) {
    case MS_TP_COLUMN: return ms_tensor_slice(&full, 0, (int64_t)t->m.rank * ls[0], ls[0]);
    case MS_TP_ROW: return ms_tensor_slice(&full, 1, (int64_t)t->m.rank * ls[1], ls[1]);
    case MS_TP_VOCAB: {
        int64_t r0, n;
        tp_vocab_range(t, &r0, &n);
        return ms_tensor_slice(&full, 0, r0, n);
    }
    default: return full;
    }
}

ms_tensor ms_tp_tied_view(const ms_tp_rank *t, int32_t w, const ms_tensor *tied) {
    if (t->split[w] != MS_TP_VOCAB)
        return *tied;
    int64_t r0, n;
    tp_vocab_range(t, &r0, &n);
    return ms_tensor_slice(tied, 0, r0, n);
}

ms_status ms_tp_note_weight(ms_tp_rank *t, int32_t w, const ms_tensor *dst, ms_error *err) {
    ms_tp_split s = t->split[w];
    if (s != MS_TP_ROW && s != MS_TP_VOCAB)
        return MS_OK;
    if (ms_grow((void **)&t->noted, &t->cap_noted, t->n_noted + 1, sizeof *t->noted) != MS_OK)
        return MS_FAIL(err, MS_ERR_OOM, "tensor parallel: out of memory");
    t->noted[t->n_noted++] = (tp_noted){dst->data, s, w, dst->shape[0]};
    return MS_OK;
}

const ms_tp_member *ms_tp_rank_member(const ms_tp_rank *t) { return &t->m; }

ms_status ms_tp_min_i32(ms_tp_rank *t, int32_t *v, ms_error *err) {
    int32_t *all = ms_calloc((size_t)t->m.world, sizeof *all);
    if (all == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "tensor parallel: out of memory");
    ms_status st = ms_collective_all_gather(&t->m.coll, v, sizeof *v, all, err);
    for (int32_t r = 0; r < t->m.world && st == MS_OK; r++)
        if (all[r] < *v)
            *v = all[r];
    ms_free(all);
    return st;
}

static ms_tp_split tp_split_of(const ms_tp_rank *t, const void *data) {
    for (size_t i = 0; i < t->n_noted; i++)
        if (t->noted[i].data == data)
            return t->noted[i].split;
    return MS_TP_REPLICATED;
}

/* Sum y [n, d] over the ranks (rows contiguous). */
static ms_status tp_all_reduce(ms_tp_rank *t, ms_tensor *y, ms_error *err) {
    const int64_t n = y->shape[0], d = y->shape[1];
#ifdef MS_HAVE_CUDA
    if (t->m.nccl != NULL) {
        if (y->stride[0] != d)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "tensor parallel: the row-parallel output [%lld, %lld] is not "
                           "contiguous", (long long)n, (long long)d);
        return ms_nccl_all_reduce_sum(t->m.nccl, y->data, (size_t)(n * d), MS_DTYPE_F32,
                                      ms_backend_cuda_stream(t->be), err);
    }
#endif
    if (y->stride[0] == d)
        return ms_collective_all_reduce_sum_f32(&t->m.coll, y->data, (size_t)(n * d), err);
    for (int64_t r = 0; r < n; r++)
        MS_TRY(ms_collective_all_reduce_sum_f32(&t->m.coll, (float *)y->data + r * y->stride[0],
                                                (size_t)d, err));
    return MS_OK;
}

/* y [n, V] = x [n, in] w_local^T gathered over the ranks, in chunks of t->chunk rows. */
static ms_status tp_vocab_linear(ms_tp_rank *t, void *ctx, const ms_tensor *x,
                                 const ms_tensor *w, ms_tensor *y, ms_error *err) {
    const int64_t n = x->shape[0], V = y->shape[1], Vr = t->vocab_rows;
    if (V != t->vocab || y->shape[0] != n)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "tensor parallel: the output head writes [%lld, %lld], expected [%lld, %d]",
                       (long long)y->shape[0], (long long)V, (long long)n, (int)t->vocab);
    for (int64_t r0 = 0; r0 < n; r0 += t->chunk) {
        int64_t c = n - r0 < t->chunk ? n - r0 : t->chunk;
        ms_tensor xs = ms_tensor_slice(x, 0, r0, c);
        ms_tensor loc = ms_tensor_2d(t->scratch, MS_DTYPE_F32, c, Vr);
        if (w->shape[0] > 0) {
            ms_tensor lw = ms_tensor_slice(&loc, 1, 0, w->shape[0]);
            MS_TRY(t->linear(ctx, &xs, w, NULL, &lw, err));
        }
        ms_tensor ys = ms_tensor_slice(y, 0, r0, c);
#ifdef MS_HAVE_CUDA
        if (t->m.nccl != NULL) {
            MS_TRY(ms_nccl_all_gather_rows(t->m.nccl, t->scratch, c, Vr, ys.data, ys.stride[0], V,
                                           ms_backend_cuda_stream(t->be), err));
            continue;
        }
#endif
        size_t bytes = (size_t)(c * Vr) * sizeof(float);
        MS_TRY(ms_collective_all_gather(&t->m.coll, t->scratch, bytes, t->gathered, err));
        for (int32_t k = 0; k < t->m.world; k++) {
            int64_t c0 = (int64_t)k * Vr, m = V - c0 < Vr ? V - c0 : Vr;
            const float *blk = t->gathered + (size_t)k * (size_t)(c * Vr);
            for (int64_t r = 0; r < c && m > 0; r++)
                memcpy((float *)ys.data + r * ys.stride[0] + c0, blk + r * Vr,
                       (size_t)m * sizeof(float));
        }
    }
    return MS_OK;
}

static ms_status tp_linear(void *ctx, const ms_tensor *x, const ms_tensor *w,
                           const ms_tensor *bias, ms_tensor *y, ms_error *err) {
    ms_tp_rank *t = tp_lookup(ctx);
    if (t == NULL)
        return MS_FAIL(err, MS_ERR_STATE, "tensor parallel: linear on a detached backend");
    switch (tp_split_of(t, w->data)) {
    case MS_TP_ROW:
        if (y->ndim != 2)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "tensor parallel: row-parallel linear "
                           "into a %d-D output", (int)y->ndim);
        MS_TRY(t->linear(ctx, x, w, t->m.rank == 0 ? bias : NULL, y, err));
        return tp_all_reduce(t, y, err);
    case MS_TP_VOCAB:
        if (bias != NULL || y->ndim != 2)
            return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                           "tensor parallel: the vocabulary-parallel head takes no bias");
        return tp_vocab_linear(t, ctx, x, w, y, err);
    default: return t->linear(ctx, x, w, bias, y, err);
    }
}

/* The fused entries (backend.h silu_mul_linear, rms_norm_linear) under the same split rules as
   tp_linear: a row-parallel weight runs the backend's fused op with the bias on rank 0 and then
   the all-reduce; the vocabulary-parallel head runs the unfused pair through tp_linear; a column
   split or a replicated weight needs no communication. */
static ms_status tp_silu_mul_linear(void *ctx, const ms_tensor *gate, const ms_tensor *up,
                                    ms_tensor *tmp, const ms_tensor *w, const ms_tensor *bias,
                                    ms_tensor *y, ms_error *err) {
    ms_tp_rank *t = tp_lookup(ctx);
    if (t == NULL)
        return MS_FAIL(err, MS_ERR_STATE, "tensor parallel: linear on a detached backend");
    switch (tp_split_of(t, w->data)) {
    case MS_TP_ROW:
        if (y->ndim != 2)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "tensor parallel: row-parallel linear "
                           "into a %d-D output", (int)y->ndim);
        MS_TRY(t->silu_mul_linear(ctx, gate, up, tmp, w, t->m.rank == 0 ? bias : NULL, y, err));
        return tp_all_reduce(t, y, err);
    case MS_TP_VOCAB:
        MS_TRY(t->be->iface.silu_mul(ctx, gate, up, tmp, err));
        return tp_linear(ctx, tmp, w, bias, y, err);
    default: return t->silu_mul_linear(ctx, gate, up, tmp, w, bias, y, err);
    }
}

static ms_status tp_rms_norm_linear(void *ctx, ms_tensor *residual, const ms_tensor *x,
                                    const ms_tensor *norm_w, float eps, ms_tensor *h,
                                    const ms_tensor *w, const ms_tensor *bias, ms_tensor *y,
                                    ms_error *err) {
    ms_tp_rank *t = tp_lookup(ctx);
    if (t == NULL)
        return MS_FAIL(err, MS_ERR_STATE, "tensor parallel: linear on a detached backend");
    switch (tp_split_of(t, w->data)) {
    case MS_TP_ROW:
        if (y->ndim != 2)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "tensor parallel: row-parallel linear "
                           "into a %d-D output", (int)y->ndim);
        MS_TRY(t->rms_norm_linear(ctx, residual, x, norm_w, eps, h, w,
                                  t->m.rank == 0 ? bias : NULL, y, err));
        return tp_all_reduce(t, y, err);
    case MS_TP_VOCAB:
        if (residual != NULL)
            MS_TRY(ms_backend_add_rms_norm(t->be, residual, x, norm_w, eps, h, err));
        else
            MS_TRY(t->be->iface.rms_norm(ctx, x, norm_w, eps, h, err));
        return tp_linear(ctx, h, w, bias, y, err);
    default: return t->rms_norm_linear(ctx, residual, x, norm_w, eps, h, w, bias, y, err);
    }
}

/* The residual linears (backend.h linear_add, silu_mul_linear_add): a row-parallel weight's
   partial product must be summed over the ranks before the add (each rank adding its part into
   its own copy of the residual would add the residual world times), so it runs into tmp, is
   all-reduced there and then added; the vocabulary head the same through tp_linear; a column
   split or a replicated weight is the backend's own. */
static ms_status tp_linear_add(void *ctx, const ms_tensor *x, const ms_tensor *w,
                               const ms_tensor *bias, ms_tensor *tmp, ms_tensor *y,
                               ms_error *err) {
    ms_tp_rank *t = tp_lookup(ctx);
    if (t == NULL)
        return MS_FAIL(err, MS_ERR_STATE, "tensor parallel: linear on a detached backend");
    switch (tp_split_of(t, w->data)) {
    case MS_TP_ROW:
    case MS_TP_VOCAB:
        MS_TRY(tp_linear(ctx, x, w, bias, tmp, err));
        return t->be->iface.add(ctx, y, tmp, y, err);
    default: return t->linear_add(ctx, x, w, bias, tmp, y, err);
    }
}

static ms_status tp_silu_mul_linear_add(void *ctx, const ms_tensor *gate, const ms_tensor *up,
                                        ms_tensor *prod, const ms_tensor *w, const ms_tensor *bias,
                                        ms_tensor *tmp, ms_tensor *y, ms_error *err) {
    ms_tp_rank *t = tp_lookup(ctx);
    if (t == NULL)
        return MS_FAIL(err, MS_ERR_STATE, "tensor parallel: linear on a detached backend");
    switch (tp_split_of(t, w->data)) {
    case MS_TP_ROW:
    case MS_TP_VOCAB:
        MS_TRY(ms_backend_silu_mul_linear(t->be, gate, up, prod, w, bias, tmp, err));
        return t->be->iface.add(ctx, y, tmp, y, err);
    default: return t->silu_mul_linear_add(ctx, gate, up, prod, w, bias, tmp, y, err);
    }
}

ms_status ms_tp_share_ids(ms_tp_rank *t, int32_t *ids, int32_t n, ms_error *err) {
    if (n < 0 || n > t->max_rows)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "tensor parallel: %d ids to share, room for %d",
                       (int)n, (int)t->max_rows);
    if (n == 0)
        return MS_OK;
    size_t bytes = (size_t)n * sizeof(int32_t);
    MS_TRY(ms_collective_all_gather(&t->m.coll, ids, bytes, t->ids_all, err));
    memcpy(ids, t->ids_all, bytes); /* rank 0's block */
    return MS_OK;
}

/* A split weight is only ever a linear's: a lookup into this rank's vocabulary rows (a model
 * whose tied weight is an input table, not an output head) would read the wrong rows, so it
 * fails. The replicated embedding a tied head views has the whole vocabulary: it passes. */
static ms_status tp_embedding(void *ctx, const ms_tensor *table, const ms_tensor *ids,
                              ms_tensor *out, ms_error *err) {
    ms_tp_rank *t = tp_lookup(ctx);
    if (t == NULL)
        return MS_FAIL(err, MS_ERR_STATE, "tensor parallel: embedding on a detached backend");
    for (size_t i = 0; i < t->n_noted; i++)
        if (t->noted[i].data == table->data && t->noted[i].rows == table->shape[0])
            return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                           "tensor parallel: weight '%s' is split across ranks but read as an "
                           "embedding table",
                           t->desc->weights[t->noted[i].w].key);
    return t->embedding(ctx, table, ids, out, err);
}

ms_status ms_tp_rank_attach(ms_tp_rank *t, ms_backend *be, int32_t max_rows, ms_error *err) {
    if (t->be != NULL || max_rows < 1)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "tensor parallel: backend attached twice or for %d rows", (int)max_rows);
    t->ids_all = ms_calloc((size_t)t->m.world * (size_t)max_rows, sizeof *t->ids_all);
    if (t->ids_all == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "tensor parallel: out of memory for the ids");
    t->max_rows = max_rows;
    size_t max_bytes = t->m.coll.iface != NULL && t->m.coll.iface->max_bytes != NULL
                           ? t->m.coll.iface->max_bytes(t->m.coll.ctx)
                           : 0;
    t->chunk = (int64_t)(max_bytes / ((size_t)t->vocab_rows * sizeof(float)));
    if (t->chunk < 1)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "tensor parallel: a %d-id vocabulary shard does not fit the transport's "
                       "%zu bytes", (int)t->vocab_rows, max_bytes);
    if (t->chunk > 64)
        t->chunk = 64;
    size_t sb = (size_t)t->chunk * (size_t)t->vocab_rows * sizeof(float);
    MS_TRY(be->iface.buffer_alloc(be->ctx, sb, "tp logits shard", (void **)&t->scratch, err));
    if (t->m.nccl == NULL) {
        t->gathered = ms_malloc(sb * (size_t)t->m.world);
        if (t->gathered == NULL) {
            be->iface.buffer_free(be->ctx, t->scratch);
            t->scratch = NULL;
            return MS_FAIL(err, MS_ERR_OOM, "tensor parallel: out of memory for the logits");
        }
    }
    pthread_mutex_lock(&g_reg_mu);
    int slot = -1;
    for (int i = 0; i < TP_MAX_ATTACHED && slot < 0; i++)
        if (g_reg[i].ctx == NULL)
            slot = i;
    if (slot >= 0) {
        g_reg[slot].ctx = be->ctx;
        g_reg[slot].t = t;
    }
    pthread_mutex_unlock(&g_reg_mu);
    if (slot < 0) {
        be->iface.buffer_free(be->ctx, t->scratch);
        ms_free(t->gathered);
        t->scratch = NULL;
        t->gathered = NULL;
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "tensor parallel: more than %d ranks attached in one process",
                       TP_MAX_ATTACHED);
    }
    t->be = be;
    t->linear = be->iface.linear;
    t->embedding = be->iface.embedding;
    t->silu_mul_linear = be->iface.silu_mul_linear;
    t->rms_norm_linear = be->iface.rms_norm_linear;
    t->linear_add = be->iface.linear_add;
    t->silu_mul_linear_add = be->iface.silu_mul_linear_add;
    be->iface.linear = tp_linear;
    be->iface.embedding = tp_embedding;
    if (t->silu_mul_linear != NULL)
        be->iface.silu_mul_linear = tp_silu_mul_linear;
    if (t->rms_norm_linear != NULL)
        be->iface.rms_norm_linear = tp_rms_norm_linear;
    if (t->linear_add != NULL)
        be->iface.linear_add = tp_linear_add;
    if (t->silu_mul_linear_add != NULL)
        be->iface.silu_mul_linear_add = tp_silu_mul_linear_add;
    return MS_OK;
}

void ms_tp_rank_detach(ms_tp_rank *t, ms_backend *be) {
    if (t == NULL || t->be == NULL)
        return;
    pthread_mutex_lock(&g_reg_mu);
    for (int i = 0; i < TP_MAX_ATTACHED; i++)
        if (g_reg[i].t == t)
            g_reg[i].ctx = NULL, g_reg[i].t = NULL;
    pthread_mutex_unlock(&g_reg_mu);
    be->iface.linear = t->linear;
    be->iface.embedding = t->embedding;
    be->iface.silu_mul_linear = t->silu_mul_linear;
    be->iface.rms_norm_linear = t->rms_norm_linear;
    be->iface.linear_add = t->linear_add;
    be->iface.silu_mul_linear_add = t->silu_mul_linear_add;
    if (be->ctx != NULL)
        be->iface.buffer_free(be->ctx, t->scratch);
    ms_free(t->gathered);
    t->scratch = NULL;
    t->gathered = NULL;
    t->be = NULL;
}

/* ---- the group ---- */

typedef struct tp_worker {
    ms_tp_group *g;
    int32_t rank;
    pthread_t thread;
    bool started;
    void *engine;
    ms_status st;      /* of the last call */
    ms_error err;
} tp_worker;

struct ms_tp_group {
    int32_t world;
    bool cuda;
    ms_collective_local *local;
    ms_tp_member *members;   /* [world] */
#ifdef MS_HAVE_CUDA
    ms_nccl_id id;
    ms_nccl_comm **comms;    /* [world] */
#endif
    tp_worker *workers;      /* [world]; [0] unused (the caller's thread) */
    ms_tp_make_fn make;
    ms_tp_free_fn free_engine;
    void *make_arg;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t gen;            /* calls posted */
    int32_t done;            /* workers finished the current call (or their init) */
    ms_tp_fn fn;             /* the current call, NULL: quit */
    void *arg;
    bool failed;
    int32_t first_failed;    /* the rank that failed first (its error is the group's) */
};

/* Make a rank's transport and engine (on its own thread). */
static ms_status tp_make_rank(ms_tp_group *g, int32_t r, void **engine, ms_error *err) {
    ms_tp_member *m = &g->members[r];
#ifdef MS_HAVE_CUDA
    if (g->cuda) {
        MS_TRY(ms_nccl_comm_init(r, r, g->world, &g->id, (size_t)16 << 20, &g->comms[r], err));
        m->nccl = g->comms[r];
        m->coll = ms_nccl_collective(g->comms[r]);
    }
#endif
    return g->make(m, g->make_arg, engine, err);
}

static void tp_fail(ms_tp_group *g, int32_t rank) {
    if (!g->failed)
        g->first_failed = rank;
    g->failed = true;
    if (g->local != NULL)
        ms_collective_local_abort(g->local);
}

static void *tp_worker_main(void *p) {
    tp_worker *wk = p;
    ms_tp_group *g = wk->g;
    wk->st = tp_make_rank(g, wk->rank, &wk->engine, &wk->err);
    pthread_mutex_lock(&g->mu);
    if (wk->st != MS_OK)
        tp_fail(g, wk->rank);
    g->done++;
    pthread_cond_broadcast(&g->cv);
    uint64_t seen = 0;
    for (;;) {
        while (g->gen == seen)
            pthread_cond_wait(&g->cv, &g->mu);
        seen = g->gen;
        ms_tp_fn fn = g->fn;
        void *arg = g->arg;
        if (fn == NULL)
            break;
        pthread_mutex_unlock(&g->mu);
        ms_error e = {0};
        ms_status st = wk->engine != NULL ? fn(wk->engine, wk->rank, arg, &e)
                                          : MS_FAIL(&e, MS_ERR_STATE, "no engine");
        pthread_mutex_lock(&g->mu);
        wk->st = st;
        wk->err = e;
        if (st != MS_OK)
            tp_fail(g, wk->rank);
        g->done++;
        pthread_cond_broadcast(&g->cv);
    }
    pthread_mutex_unlock(&g->mu);
    if (wk->engine != NULL && g->free_engine != NULL)
        g->free_engine(wk->engine);
    wk->engine = NULL;
    return NULL;
}

/* Wait until every worker finished the current call. Errors: the first rank to fail (the others
 * usually fail after it, their collectives aborted): rank 0's as is (already in err), another's
 * prefixed with its rank. */
static ms_status tp_wait(ms_tp_group *g, ms_status lead, ms_error *err) {
    pthread_mutex_lock(&g->mu);
    while (g->done < g->world - 1)
        pthread_cond_wait(&g->cv, &g->mu);
    int32_t first = g->failed ? g->first_failed : -1;
    pthread_mutex_unlock(&g->mu);
    if (first > 0 && first < g->world && g->workers[first].st != MS_OK) {
        if (err != NULL) {
            *err = g->workers[first].err;
            ms_error_prefix(err, "tensor parallel rank %d: ", (int)first);
        }
        return g->workers[first].st;
    }
    if (lead != MS_OK)
        return lead;
    for (int32_t r = 1; r < g->world; r++)
        if (g->workers[r].st != MS_OK) {
            if (err != NULL) {
                *err = g->workers[r].err;
                ms_error_prefix(err, "tensor parallel rank %d: ", (int)r);
            }
            return g->workers[r].st;
        }
    return MS_OK;
}

void ms_tp_group_free(ms_tp_group *g) {
    if (g == NULL)
        return;
    pthread_mutex_lock(&g->mu);
    g->fn = NULL;
    g->gen++;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    for (int32_t r = 1; r < g->world; r++)
        if (g->workers[r].started)
            pthread_join(g->workers[r].thread, NULL);
#ifdef MS_HAVE_CUDA
    if (g->comms != NULL)
        for (int32_t r = 0; r < g->world; r++)
            ms_nccl_comm_free(g->comms[r]);
    ms_free(g->comms);
#endif
    ms_collective_local_free(g->local);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    ms_free(g->members);
    ms_free(g->workers);
    ms_free(g);
}

ms_status ms_tp_group_start(int32_t world, const char *device, ms_tp_make_fn make,
                            ms_tp_free_fn free_engine, void *arg, void **leader,
                            ms_tp_group **group, ms_error *err) {
    *leader = NULL;
    *group = NULL;
    if (world < 2 || world > 64 || make == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "tensor parallel: --tp %d (2..64)", (int)world);
    bool cuda = device != NULL && strcmp(device, "cuda") == 0;
    if (!cuda && (device == NULL || strcmp(device, "cpu") != 0))
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "tensor parallel: device '%s' (expected cpu or cuda)",
                       device != NULL ? device : "(none)");
    ms_tp_group *g = ms_calloc(1, sizeof *g);
    if (g == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "tensor parallel: out of memory");
    g->world = world;
    g->cuda = cuda;
    g->make = make;
    g->free_engine = free_engine;
    g->make_arg = arg;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->members = ms_calloc((size_t)world, sizeof *g->members);
    g->workers = ms_calloc((size_t)world, sizeof *g->workers);
    ms_status st = MS_OK;
    if (g->members == NULL || g->workers == NULL)
        st = MS_FAIL(err, MS_ERR_OOM, "tensor parallel: out of memory");
    if (st == MS_OK && cuda) {
#ifdef MS_HAVE_CUDA
        int n_dev = (int)ms_backend_cuda_device_count();
        if (n_dev < world)
            st = MS_FAIL(err, MS_ERR_CUDA, "tensor parallel: --tp %d needs %d GPUs, %d visible",
                         (int)world, (int)world, n_dev);
        if (st == MS_OK) {
            g->comms = ms_calloc((size_t)world, sizeof *g->comms);
            st = g->comms == NULL ? MS_FAIL(err, MS_ERR_OOM, "tensor parallel: out of memory")
                                  : ms_nccl_unique_id(&g->id, err);
        }
#else
        st = MS_FAIL(err, MS_ERR_UNSUPPORTED,
                     "tensor parallel on device 'cuda': this binary was built without CUDA");
#endif
    }
    if (st == MS_OK && !cuda)
        st = ms_collective_local_init(world, (size_t)4 << 20, &g->local, err);
    for (int32_t r = 0; r < world && st == MS_OK; r++) {
        ms_tp_member *m = &g->members[r];
        m->rank = r;
        m->world = world;
        m->device = r;
        if (!cuda)
            m->coll = ms_collective_local_rank(g->local, r);
    }
    if (st != MS_OK) {
        ms_tp_group_free(g);
        return st;
    }
    for (int32_t r = 1; r < world; r++) {
        tp_worker *wk = &g->workers[r];
        wk->g = g;
        wk->rank = r;
        if (pthread_create(&wk->thread, NULL, tp_worker_main, wk) != 0) {
            /* no rank can finish its warm-up check without this one: fail the others */
            pthread_mutex_lock(&g->mu);
            tp_fail(g, 0);
            for (int32_t k = r; k < world; k++)
                g->done++;
            pthread_mutex_unlock(&g->mu);
            st = MS_FAIL(err, MS_ERR_OOM, "tensor parallel: cannot start rank %d's thread",
                         (int)r);
            break;
        }
        wk->started = true;
    }
    void *e0 = NULL;
    ms_status lead = st;
    if (lead == MS_OK) {
        lead = tp_make_rank(g, 0, &e0, err);
        if (lead != MS_OK) {
            pthread_mutex_lock(&g->mu);
            tp_fail(g, 0);
            pthread_mutex_unlock(&g->mu);
        }
    }
    st = tp_wait(g, lead, err);
    if (st != MS_OK) {
        if (e0 != NULL && free_engine != NULL)
            free_engine(e0);
        ms_tp_group_free(g);
        return st;
    }
    *leader = e0;
    *group = g;
    return MS_OK;
}

ms_status ms_tp_group_run(ms_tp_group *g, void *leader, ms_tp_fn leader_fn, ms_tp_fn follower_fn,
                          void *arg, ms_error *err) {
    pthread_mutex_lock(&g->mu);
    if (g->failed) {
        pthread_mutex_unlock(&g->mu);
        return MS_FAIL(err, MS_ERR_STATE,
                       "tensor parallel: the group failed earlier (its ranks may differ)");
    }
    g->done = 0;
    g->fn = follower_fn;
    g->arg = arg;
    g->gen++;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    ms_status lead = leader_fn(leader, 0, arg, err);
    if (lead != MS_OK) {
        pthread_mutex_lock(&g->mu);
        tp_fail(g, 0);
        pthread_mutex_unlock(&g->mu);
    }
    return tp_wait(g, lead, err);
}

int32_t ms_tp_group_world(const ms_tp_group *g) { return g->world; }

void *ms_tp_group_engine(const ms_tp_group *g, int32_t r) {
    return r >= 1 && r < g->world ? g->workers[r].engine : NULL;
}
