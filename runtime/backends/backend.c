/*
 * backend.c - backend-independent pieces of the op interface (backend.h): the paged KV arena
 * size, the host-side check of attention plans, staging with its plan, and the fallbacks of
 * optional vtable entries (dtypes and tensor views are in tensor.c, RoPE tables in rope.c).
 *
 * Nothing here touches backend memory except through the vtable.
 */
#include "backend.h"

#include <math.h>

#include <stdio.h>
#include <string.h>

/* ---- paged KV arena ---- */

size_t ms_paged_kv_bytes(const ms_paged_kv *kv) {
    return (size_t)kv->n_layers * (size_t)kv->n_pages * 2u * (size_t)kv->page_size *
           (size_t)kv->n_kv_heads * (size_t)kv->head_dim * ms_dtype_size(kv->dtype);
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

ms_status ms_backend_rms_norm_linear(const ms_backend *b, ms_tensor *residual, const ms_tensor *x,
                                     const ms_tensor *norm_w, float eps, ms_tensor *h,
                                     const ms_tensor *w, const ms_tensor *bias, ms_tensor *y,
                                     ms_error *err) {
    if (b->iface.rms_norm_linear != NULL)
        return b->iface.rms_norm_linear(b->ctx, residual, x, norm_w, eps, h, w, bias, y, err);
    if (residual != NULL)
        MS_TRY(ms_backend_add_rms_norm(b, residual, x, norm_w, eps, h, err));
    else
        MS_TRY(b->iface.rms_norm(b->ctx, x, norm_w, eps, h, err));
    return b->iface.linear(b->ctx, h, w, bias, y, err);
}

ms_status ms_backend_silu_mul_linear(const ms_backend *b, const ms_tensor *gate,
                                     const ms_tensor *up, ms_tensor *tmp, const ms_tensor *w,
                                     const ms_tensor *bias, ms_tensor *y, ms_error *err) {
    if (b->iface.silu_mul_linear != NULL)
        return b->iface.silu_mul_linear(b->ctx, gate, up, tmp, w, bias, y, err);
    MS_TRY(b->iface.silu_mul(b->ctx, gate, up, tmp, err));
    return b->iface.linear(b->ctx, tmp, w, bias, y, err);
}

ms_status ms_backend_linear_add(const ms_backend *b, const ms_tensor *x, const ms_tensor *w,
                                const ms_tensor *bias, ms_tensor *tmp, ms_tensor *y,
                                ms_error *err) {
    if (b->iface.linear_add != NULL)
        return b->iface.linear_add(b->ctx, x, w, bias, tmp, y, err);
    MS_TRY(b->iface.linear(b->ctx, x, w, bias, tmp, err));
    return b->iface.add(b->ctx, y, tmp, y, err);
}

ms_status ms_backend_silu_mul_linear_add(const ms_backend *b, const ms_tensor *gate,
                                         const ms_tensor *up, ms_tensor *prod, const ms_tensor *w,
                                         const ms_tensor *bias, ms_tensor *tmp, ms_tensor *y,
                                         ms_error *err) {
    if (b->iface.silu_mul_linear_add != NULL)
        return b->iface.silu_mul_linear_add(b->ctx, gate, up, prod, w, bias, tmp, y, err);
    MS_TRY(ms_backend_silu_mul_linear(b, gate, up, prod, w, bias, tmp, err));
    return b->iface.add(b->ctx, y, tmp, y, err);
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

/* ---- dense segments ---- */

ms_status ms_dense_batch_init(const ms_backend *b, int32_t max_seqs, int32_t max_tokens,
                              ms_dense_batch **out, ms_error *err) {
    *out = NULL;
    if (b == NULL || max_seqs < 1 || max_tokens < 1 || max_seqs == INT32_MAX)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "dense batch: limits must be positive (max_seqs %d, max_tokens %d)",
                       (int)max_seqs, (int)max_tokens);
    ms_dense_batch *db = ms_calloc(1, sizeof *db);
    if (db == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "out of memory for a dense batch");
    db->max_seqs = max_seqs;
    db->max_tokens = max_tokens;
    const size_t bytes = ((size_t)max_seqs + 1) * sizeof(int32_t);
    db->indptr_host = ms_calloc((size_t)max_seqs + 1, sizeof(int32_t));
    ms_status st = db->indptr_host != NULL
                       ? b->iface.buffer_alloc(b->ctx, bytes, "dense.indptr",
                                               (void **)&db->indptr, err)
                       : MS_FAIL(err, MS_ERR_OOM, "out of memory for a dense batch");
    if (st == MS_OK)
        st = b->iface.copy_to_backend(b->ctx, db->indptr, db->indptr_host, bytes, err);
    if (st != MS_OK) {
        ms_dense_batch_free(b, db);
        return st;
    }
    *out = db;
    return MS_OK;
}

ms_status ms_dense_batch_stage(const ms_backend *b, ms_dense_batch *db, const int32_t *lens,
                               int32_t n_seqs, ms_error *err) {
    if (db == NULL || (lens == NULL && n_seqs > 0) || n_seqs < 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "dense batch: nothing to stage");
    if (n_seqs > db->max_seqs)
        return MS_FAIL(err, MS_ERR_CAPACITY,
                       "dense batch: %d segments, the batch holds %d (max_seqs)", (int)n_seqs,
                       (int)db->max_seqs);
    int64_t n = 0;
    int32_t longest = 0;
    for (int32_t i = 0; i < n_seqs; i++) {
        if (lens[i] < 1)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "dense batch: segment %d has %d rows "
                           "(at least 1)", (int)i, (int)lens[i]);
        n += lens[i];
        if (n > db->max_tokens)
            return MS_FAIL(err, MS_ERR_CAPACITY,
                           "dense batch: %lld rows over %d segments, the batch holds %d "
                           "(max_tokens)", (long long)n, (int)(i + 1), (int)db->max_tokens);
        longest = MS_MAX(longest, lens[i]);
    }
    db->indptr_host[0] = 0;
    for (int32_t i = 0; i < n_seqs; i++)
        db->indptr_host[i + 1] = db->indptr_host[i] + lens[i];
    MS_TRY(b->iface.copy_to_backend(b->ctx, db->indptr, db->indptr_host,
                                    ((size_t)n_seqs + 1) * sizeof(int32_t), err));
    db->n_seqs = n_seqs;
    db->n_tokens = (int32_t)n;
    db->max_len = longest;
    return MS_OK;
}

void ms_dense_batch_free(const ms_backend *b, ms_dense_batch *db) {
    if (db == NULL)
        return;
    if (b != NULL && db->indptr != NULL)
        b->iface.buffer_free(b->ctx, db->indptr);
    ms_free(db->indptr_host);
    ms_free(db);
}
