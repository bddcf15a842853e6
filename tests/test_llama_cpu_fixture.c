/*
 * test_llama_cpu_fixture.c - a hand-composed Llama forward through the op interface (backend.h)
 * on the CPU backend, checked against Hugging Face transformers' reference outputs in
 * ../shared/fixtures/hf (float32, eager attention):
 *   - llama_gqa (GQA 8/2, head_dim 16, untied lm_head; 4 prompts of 37, 5, 64, 1 tokens, 40 new),
 *   - mistral_window (sliding_window 8; pages outside the window released as retention does, so
 *     attention runs with kv_start > 0),
 *   - llama31_rope and llama31_rope_legacy (llama3 frequency scaling, theta 5e5, tied embeddings;
 *     both config.json layouts),
 *   - qwen3 (per-head q/k RMSNorm, head_dim 48 != hidden / heads, tied embeddings),
 *   - llama2c/aidreams260K (llama2.c .bin through the loaders, interleaved-pair RoPE): the 4 golden
 *     cases of run.c token-exact for 128 steps, ids and printed text,
 *   - qwen2vl_mrope (Qwen2-VL text path: q/k/v biases, M-RoPE sections [4, 6, 6] over explicit
 *     t/h/w position streams): prefill logits within 1e-3,
 *   - llama_cfg (classifier-free guidance: the cond and uncond streams of one request in one
 *     ragged batch, guidance mixed on the host): mixed log-probs within 1e-3, guided ids equal,
 *   - whisper_tiny (encoder: conv1d + GELU front end, LayerNorm, non-causal self-attention over a
 *     scratch page stream; decoder: learned positions, causal self-attention, cross-attention
 *     over the encoder's K/V written once into a context stream and read with a read-only plan):
 *     encoder output, first and decode logits within 1e-3, greedy ids equal.
 * For every prompt: prefill logits at every position and decode logits of every step within 1e-3
 * max abs of the reference, greedy ids equal. All prompts of a fixture run as ONE ragged batch
 * (prefill step, then batched decode steps) with several page sizes; llama_gqa also runs each
 * prompt alone and must give the same ids.
 *
 * This composes what the generated forward will do (DESIGN.md §5 forward) before the code
 * generator exists: weights loaded through the loaders (checkpoint.h) into backend buffers with
 * Q/K/V and gate/up concatenated, a page table and the FlashInfer index arrays built here, ops
 * called through the vtable. The reference files are read with the loaders' safetensors reader
 * (F32 and I32 data tensors); the llama2.c golden JSON with jansson.
 */
#include "ms_test.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "checkpoint.h"
#include "hf_config.h"
#include "ms_test_impl.h"
#include "tokenizer_llama2c.h"

#define MAX_LAYERS 8
#define MAX_SEQS 4
#define MAX_PAGES_PER_SEQ 256
#define TOL 1e-3f

#define CHECK(expr)                                                                    \
    do {                                                                               \
        ms_status st_ = (expr);                                                        \
        if (st_ != MS_OK)                                                              \
            fail_msg("%s failed: %s (%s)", #expr, err.msg, ms_status_str(st_));        \
    } while (0)

/* ---- reference.safetensors (through the loaders' reader: F32 and I32 data tensors) ---- */

typedef struct ref_file {
    ms_st_file *f;
} ref_file;

static void ref_open(ref_file *r, const char *path) {
    ms_error err = {0};
    r->f = NULL;
    CHECK(ms_st_file_init(&r->f, path, &err));
}

static void ref_close(ref_file *r) {
    ms_st_file_free(r->f);
}

static bool ref_has(const ref_file *r, const char *name) {
    return ms_st_file_find_tensor(r->f, name) != NULL;
}

/* Copy tensor `name` ("F32" or "I32") into a fresh ms_malloc'd buffer; rows/cols = its shape
 * (cols 1 for 1-D). */
static void *ref_get(const ref_file *r, const char *name, const char *dtype, int64_t *rows,
                     int64_t *cols) {
    ms_error err = {0};
    const ms_st_tensor *t = ms_st_file_find_tensor(r->f, name);
    if (t == NULL)
        fail_msg("reference tensor %s missing", name);
    assert_string_equal(ms_st_dtype_name(t->dtype), dtype);
    assert_true(t->n_dims == 1 || t->n_dims == 2);
    *rows = t->shape[0];
    *cols = t->n_dims > 1 ? t->shape[1] : 1;
    void *out = ms_malloc(t->n_elems * 4);
    assert_non_null(out);
    if (t->dtype == MS_ST_DTYPE_I32)
        CHECK(ms_st_tensor_to_i32(t, out, t->n_elems, &err));
    else
        CHECK(ms_st_tensor_to_f32(t, out, t->n_elems, &err));
    return out;
}

/* ---- the model ---- */

typedef struct layer_w {
    ms_tensor attn_norm, wqkv, wo, mlp_norm, wgu, wdown, q_norm, k_norm;
    ms_tensor bqkv; /* [q + k + v] fused bias (Qwen2), data NULL when the model has none */
} layer_w;

typedef struct model {
    const ms_backend *be;
    int hidden, n_layers, hq, hkv, d, ff, vocab, window;
    float eps;
    bool tied, qk_norm, qkv_bias;
    int pos_streams; /* 1, or the M-RoPE sections (position ids are [pos_streams, n]) */
    ms_rope_table rope;
    ms_tensor embed, lm_head, final_norm;
    layer_w L[MAX_LAYERS];
    void *bufs[128];
    int n_bufs;
    /* step state */
    ms_paged_kv kv;
    ms_attn_batch *batch;
    int max_tokens;
    float *x, *h, *qkv, *att, *t, *gu, *act, *logits, *last_logits;
    int32_t *ids, *pos, *next_ids;
} model;

static void *model_alloc(model *m, size_t bytes, const char *name) {
    ms_error err = {0};
    void *p = NULL;
    CHECK(m->be->iface.buffer_alloc(m->be->ctx, bytes, name, &p, &err));
    assert_true(m->n_bufs < (int)MS_ARRAY_LEN(m->bufs));
    m->bufs[m->n_bufs++] = p;
    return p;
}

static ms_dtype st_dtype(ms_st_dtype d) {
    return d == MS_ST_DTYPE_F32 ? MS_DTYPE_F32 : d == MS_ST_DTYPE_BF16 ? MS_DTYPE_BF16 : MS_DTYPE_F16;
}

/* Load checkpoint tensor `name` of shape [n0, n1] (n1 = 0: 1-D) into backend view dst. */
static void load_into(model *m, const ms_ckpt *ck, const char *name, int64_t n0, int64_t n1,
                      const ms_tensor *dst) {
    ms_error err = {0};
    int64_t shape[2] = {n0, n1};
    const ms_st_tensor *t;
    CHECK(ms_ckpt_expect_tensor(ck, name, MS_ST_DTYPES_FLOAT, n1 ? 2 : 1, shape, &t, &err));
    ms_tensor src = n1 ? ms_tensor_2d((void *)t->data, st_dtype(t->dtype), n0, n1)
                       : ms_tensor_1d((void *)t->data, st_dtype(t->dtype), n0);
    CHECK(m->be->iface.tensor_load(m->be->ctx, dst, &src, &err));
}

static ms_tensor new_weight(model *m, const ms_ckpt *ck, const char *name, int64_t n0, int64_t n1) {
    ms_tensor t = n1 ? ms_tensor_2d(model_alloc(m, (size_t)(n0 * n1) * 4, name), MS_DTYPE_F32, n0, n1)
                     : ms_tensor_1d(model_alloc(m, (size_t)n0 * 4, name), MS_DTYPE_F32, n0);
    load_into(m, ck, name, n0, n1, &t);
    return t;
}

static void model_load(model *m, const ms_backend *be, const char *dir) {
    ms_error err = {0};
    memset(m, 0, sizeof *m);
    m->be = be;
    ms_hf_config *cfg = NULL;
    CHECK(ms_hf_config_init(&cfg, dir, &err));
    int64_t v;
    CHECK(ms_hf_config_get_int(cfg, "hidden_size", &v, &err));
    m->hidden = (int)v;
    CHECK(ms_hf_config_get_int(cfg, "num_hidden_layers", &v, &err));
    m->n_layers = (int)v;
    CHECK(ms_hf_config_get_int(cfg, "num_attention_heads", &v, &err));
    m->hq = (int)v;
    CHECK(ms_hf_config_get_int_or(cfg, "num_key_value_heads", m->hq, &v, &err));
    m->hkv = (int)v;
    CHECK(ms_hf_config_get_int_or(cfg, "head_dim", m->hidden / m->hq, &v, &err));
    m->d = (int)v;
    CHECK(ms_hf_config_get_int(cfg, "intermediate_size", &v, &err));
    m->ff = (int)v;
    CHECK(ms_hf_config_get_int(cfg, "vocab_size", &v, &err));
    m->vocab = (int)v;
    CHECK(ms_hf_config_get_int_or(cfg, "sliding_window", 0, &v, &err));
    m->window = (int)v;
    bool use_window; /* Qwen2/3 configs carry a sliding_window that is off unless this is set */
    CHECK(ms_hf_config_get_bool_or(cfg, "use_sliding_window", true, &use_window, &err));
    if (!use_window)
        m->window = 0;
    double eps;
    CHECK(ms_hf_config_get_float_or(cfg, "rms_norm_eps", 1e-6, &eps, &err));
    m->eps = (float)eps;
    CHECK(ms_hf_config_get_bool_or(cfg, "tie_word_embeddings", false, &m->tied, &err));
    bool interleaved;
    CHECK(ms_hf_config_get_bool_or(cfg, "rope_interleaved", false, &interleaved, &err));
    ms_rope_params rp;
    CHECK(ms_hf_config_get_rope(cfg, &rp, &err));
    ms_hf_config_free(cfg);
    assert_true(m->n_layers <= MAX_LAYERS);

    ms_rope_style style = interleaved ? MS_ROPE_INTERLEAVED : MS_ROPE_ROTATE_HALF;
    ms_rope_config rc;
    CHECK(ms_rope_config_from_hf(&rp, style, m->d, &rc, &err));
    float inv[512];
    assert_true(rc.rotary_dim > 0 && rc.rotary_dim / 2 <= 512);
    CHECK(ms_rope_compute_inv_freq(&rc, inv, &err));
    size_t inv_bytes = sizeof(float) * (size_t)(rc.rotary_dim / 2);
    float *inv_b = model_alloc(m, inv_bytes, "rope.inv_freq");
    CHECK(be->iface.copy_to_backend(be->ctx, inv_b, inv, inv_bytes, &err));
    m->rope = (ms_rope_table){.style = style, .rotary_dim = rc.rotary_dim, .inv_freq = inv_b,
                              .attention_scaling = 1.0f, .n_sections = rp.n_mrope_sections};
    assert_true(rp.n_mrope_sections <= MS_ROPE_MAX_SECTIONS);
    for (int k = 0; k < rp.n_mrope_sections; k++)
        m->rope.sections[k] = (int32_t)rp.mrope_section[k];
    m->pos_streams = rp.n_mrope_sections > 0 ? rp.n_mrope_sections : 1;

    ms_ckpt *ck = NULL;
    CHECK(ms_ckpt_init(&ck, dir, &err));
    m->embed = new_weight(m, ck, "model.embed_tokens.weight", m->vocab, m->hidden);
    m->final_norm = new_weight(m, ck, "model.norm.weight", m->hidden, 0);
    assert_int_equal(m->tied, !ms_ckpt_has_tensor(ck, "lm_head.weight"));
    m->lm_head = m->tied ? m->embed : new_weight(m, ck, "lm_head.weight", m->vocab, m->hidden);
    m->qk_norm = ms_ckpt_has_tensor(ck, "model.layers.0.self_attn.q_norm.weight");
    m->qkv_bias = ms_ckpt_has_tensor(ck, "model.layers.0.self_attn.q_proj.bias");
    int qd = m->hq * m->d, kd = m->hkv * m->d;
    char name[128];
    for (int l = 0; l < m->n_layers; l++) {
        layer_w *w = &m->L[l];
#define LNAME(fmt) (snprintf(name, sizeof name, "model.layers.%d." fmt, l), name)
        w->attn_norm = new_weight(m, ck, LNAME("input_layernorm.weight"), m->hidden, 0);
        w->mlp_norm = new_weight(m, ck, LNAME("post_attention_layernorm.weight"), m->hidden, 0);
        w->wo = new_weight(m, ck, LNAME("self_attn.o_proj.weight"), m->hidden, qd);
        w->wdown = new_weight(m, ck, LNAME("mlp.down_proj.weight"), m->hidden, m->ff);
        if (m->qk_norm) {
            w->q_norm = new_weight(m, ck, LNAME("self_attn.q_norm.weight"), m->d, 0);
            w->k_norm = new_weight(m, ck, LNAME("self_attn.k_norm.weight"), m->d, 0);
        }
        /* concatenated at load: QKV [q + k + v, hidden] and gate/up [2 ff, hidden] */
        w->wqkv = ms_tensor_2d(model_alloc(m, (size_t)((qd + 2 * kd) * m->hidden) * 4, "wqkv"),
                               MS_DTYPE_F32, qd + 2 * kd, m->hidden);
        ms_tensor part = ms_tensor_slice(&w->wqkv, 0, 0, qd);
        load_into(m, ck, LNAME("self_attn.q_proj.weight"), qd, m->hidden, &part);
        part = ms_tensor_slice(&w->wqkv, 0, qd, kd);
        load_into(m, ck, LNAME("self_attn.k_proj.weight"), kd, m->hidden, &part);
        part = ms_tensor_slice(&w->wqkv, 0, qd + kd, kd);
        load_into(m, ck, LNAME("self_attn.v_proj.weight"), kd, m->hidden, &part);
        if (m->qkv_bias) {
            w->bqkv = ms_tensor_1d(model_alloc(m, (size_t)(qd + 2 * kd) * 4, "bqkv"), MS_DTYPE_F32,
                                   qd + 2 * kd);
            part = ms_tensor_slice(&w->bqkv, 0, 0, qd);
            load_into(m, ck, LNAME("self_attn.q_proj.bias"), qd, 0, &part);
            part = ms_tensor_slice(&w->bqkv, 0, qd, kd);
            load_into(m, ck, LNAME("self_attn.k_proj.bias"), kd, 0, &part);
            part = ms_tensor_slice(&w->bqkv, 0, qd + kd, kd);
            load_into(m, ck, LNAME("self_attn.v_proj.bias"), kd, 0, &part);
        }
        w->wgu = ms_tensor_2d(model_alloc(m, (size_t)(2 * m->ff * m->hidden) * 4, "wgu"),
                              MS_DTYPE_F32, 2 * m->ff, m->hidden);
        part = ms_tensor_slice(&w->wgu, 0, 0, m->ff);
        load_into(m, ck, LNAME("mlp.gate_proj.weight"), m->ff, m->hidden, &part);
        part = ms_tensor_slice(&w->wgu, 0, m->ff, m->ff);
        load_into(m, ck, LNAME("mlp.up_proj.weight"), m->ff, m->hidden, &part);
#undef LNAME
    }
    ms_ckpt_free(ck);
}

/* Plan the step buffers for `max_tokens` tokens and an arena of n_pages pages. */
static void model_plan(model *m, int max_tokens, int n_pages, int page_size) {
    ms_error err = {0};
    m->max_tokens = max_tokens;
    size_t T = (size_t)max_tokens;
    int row_qkv = (m->hq + 2 * m->hkv) * m->d;
    m->x = model_alloc(m, T * (size_t)m->hidden * 4, "x");
    m->h = model_alloc(m, T * (size_t)m->hidden * 4, "h");
    m->t = model_alloc(m, T * (size_t)m->hidden * 4, "t");
    m->qkv = model_alloc(m, T * (size_t)row_qkv * 4, "qkv");
    m->att = model_alloc(m, T * (size_t)(m->hq * m->d) * 4, "att");
    m->gu = model_alloc(m, T * (size_t)(2 * m->ff) * 4, "gu");
    m->act = model_alloc(m, T * (size_t)m->ff * 4, "act");
    m->logits = model_alloc(m, T * (size_t)m->vocab * 4, "logits");
    m->last_logits = model_alloc(m, MAX_SEQS * (size_t)m->vocab * 4, "last_logits");
    m->ids = model_alloc(m, T * 4, "ids");
    m->pos = model_alloc(m, T * 4 * (size_t)m->pos_streams, "pos");
    m->next_ids = model_alloc(m, MAX_SEQS * 4, "next_ids");
    m->kv = (ms_paged_kv){NULL, MS_DTYPE_F32, m->n_layers, n_pages, page_size, m->hkv, m->d};
    m->kv.data = model_alloc(m, ms_paged_kv_bytes(&m->kv), "kv.arena");
    ms_attn_limits lim = {MAX_SEQS, max_tokens, MAX_SEQS * MAX_PAGES_PER_SEQ};
    CHECK(m->be->iface.attn_batch_init(m->be->ctx, &lim, &m->batch, &err));
}

static void model_free(model *m) {
    m->be->iface.attn_batch_free(m->be->ctx, m->batch);
    for (int i = 0; i < m->n_bufs; i++)
        m->be->iface.buffer_free(m->be->ctx, m->bufs[i]);
}

/* One step of the forward over the staged batch: x -> logits [n, vocab] for every token, and the
 * greedy id of each sequence's last token in next_ids. */
static void model_forward(model *m, int n) {
    ms_error err = {0};
    const ms_backend *be = m->be;
    const ms_backend_i *f = &be->iface;
    void *c = be->ctx;
    int qd = m->hq * m->d, kd = m->hkv * m->d, row_qkv = qd + 2 * kd;
    ms_tensor ids = ms_tensor_1d(m->ids, MS_DTYPE_I32, n);
    ms_tensor pos = m->pos_streams > 1 ? ms_tensor_2d(m->pos, MS_DTYPE_I32, m->pos_streams, n)
                                       : ms_tensor_1d(m->pos, MS_DTYPE_I32, n);
    ms_tensor x = ms_tensor_2d(m->x, MS_DTYPE_F32, n, m->hidden);
    ms_tensor h = ms_tensor_2d(m->h, MS_DTYPE_F32, n, m->hidden);
    ms_tensor t = ms_tensor_2d(m->t, MS_DTYPE_F32, n, m->hidden);
    ms_tensor qkv = ms_tensor_2d(m->qkv, MS_DTYPE_F32, n, row_qkv);
    ms_tensor q2 = ms_tensor_slice(&qkv, 1, 0, qd), k2 = ms_tensor_slice(&qkv, 1, qd, kd);
    ms_tensor v2 = ms_tensor_slice(&qkv, 1, qd + kd, kd);
    ms_tensor q = ms_tensor_split_heads(&q2, m->hq, m->d), k = ms_tensor_split_heads(&k2, m->hkv, m->d);
    ms_tensor v = ms_tensor_split_heads(&v2, m->hkv, m->d);
    ms_tensor att = ms_tensor_3d(m->att, MS_DTYPE_F32, n, m->hq, m->d);
    ms_tensor att2 = ms_tensor_2d(m->att, MS_DTYPE_F32, n, qd);
    ms_tensor gu = ms_tensor_2d(m->gu, MS_DTYPE_F32, n, 2 * m->ff);
    ms_tensor g = ms_tensor_slice(&gu, 1, 0, m->ff), u = ms_tensor_slice(&gu, 1, m->ff, m->ff);
    ms_tensor act = ms_tensor_2d(m->act, MS_DTYPE_F32, n, m->ff);
    ms_tensor logits = ms_tensor_2d(m->logits, MS_DTYPE_F32, n, m->vocab);
    ms_attn_params ap = {1.0f / sqrtf((float)m->d), m->window, true};

    CHECK(f->embedding(c, &m->embed, &ids, &x, &err));
    CHECK(f->rms_norm(c, &x, &m->L[0].attn_norm, m->eps, &h, &err));
    for (int l = 0; l < m->n_layers; l++) {
        const layer_w *w = &m->L[l];
        CHECK(f->linear(c, &h, &w->wqkv, m->qkv_bias ? &w->bqkv : NULL, &qkv, &err));
        if (m->qk_norm) {
            CHECK(f->rms_norm(c, &q, &w->q_norm, m->eps, &q, &err));
            CHECK(f->rms_norm(c, &k, &w->k_norm, m->eps, &k, &err));
        }
        CHECK(ms_backend_rope_kv_write(be, &q, &k, &v, &pos, &m->rope, &m->kv, l, m->batch, &err));
        CHECK(f->attention(c, &q, &m->kv, l, m->batch, &ap, &att, &err));
        CHECK(f->linear(c, &att2, &w->wo, NULL, &t, &err));
        CHECK(ms_backend_add_rms_norm(be, &x, &t, &w->mlp_norm, m->eps, &h, &err));
        CHECK(f->linear(c, &h, &w->wgu, NULL, &gu, &err));
        CHECK(f->silu_mul(c, &g, &u, &act, &err));
        CHECK(f->linear(c, &act, &w->wdown, NULL, &t, &err));
        const ms_tensor *next = l + 1 < m->n_layers ? &m->L[l + 1].attn_norm : &m->final_norm;
        CHECK(ms_backend_add_rms_norm(be, &x, &t, next, m->eps, &h, &err));
    }
    CHECK(f->linear(c, &h, &m->lm_head, NULL, &logits, &err));
    int ns = m->batch->n_seqs;
    ms_tensor rows = ms_tensor_1d(m->batch->last_token, MS_DTYPE_I32, ns);
    ms_tensor last = ms_tensor_2d(m->last_logits, MS_DTYPE_F32, ns, m->vocab);
    ms_tensor next_ids = ms_tensor_1d(m->next_ids, MS_DTYPE_I32, ns);
    CHECK(f->gather_rows(c, &logits, &rows, &last, &err));
    CHECK(f->argmax(c, &last, &next_ids, &err));
}

/* ---- sequences, the page table and the KV plan ---- */

typedef struct seq {
    int32_t pages[MAX_PAGES_PER_SEQ]; /* pages covering [start, total) */
    int n_pages;
    int start;  /* first present logical position (retention), multiple of page_size */
    int total;  /* tokens stored so far (logical end) */
} seq;

typedef struct pager {
    int32_t free_ids[4096];
    int n_free;
    int page_size;
} pager;

static int gcd(int a, int b) {
    return b == 0 ? a : gcd(b, a % b);
}

static void pager_init(pager *p, int n_pages, int page_size) {
    assert_true(n_pages >= 2 && n_pages - 1 <= (int)MS_ARRAY_LEN(p->free_ids));
    p->page_size = page_size;
    p->n_free = 0;
    /* hand pages out in a scrambled order (a multiplicative permutation of 1 .. n_pages - 1) so
     * neighbours in a sequence are not neighbours in the arena; page 0 is the sink */
    int mult = 7;
    while (gcd(mult, n_pages - 1) != 1)
        mult++;
    for (int i = n_pages - 2; i >= 0; i--)
        p->free_ids[p->n_free++] = (int32_t)(((int64_t)i * mult) % (n_pages - 1) + 1);
}

typedef struct step_plan {
    ms_kv_view views[MAX_SEQS];
    int32_t qo[MAX_SEQS + 1], kvp[MAX_SEQS + 1], idx[MAX_SEQS * MAX_PAGES_PER_SEQ];
    int32_t last[MAX_SEQS], kst[MAX_SEQS];
    int32_t t2p[1024], t2s[1024], pos[1024];
    ms_kv_plan plan;
} step_plan;

/* Build the plan of one step where sequence i adds span[i] tokens (pages taken as needed). */
static void plan_step(step_plan *sp, pager *pg, seq *s, int n_seqs, const int *span) {
    int ps = pg->page_size, tok = 0;
    sp->qo[0] = sp->kvp[0] = 0;
    for (int i = 0; i < n_seqs; i++) {
        int end = s[i].total + span[i];
        while (s[i].start + s[i].n_pages * ps < end) {
            assert_true(pg->n_free > 0 && s[i].n_pages < MAX_PAGES_PER_SEQ);
            s[i].pages[s[i].n_pages++] = pg->free_ids[--pg->n_free];
        }
        for (int j = 0; j < span[i]; j++, tok++) {
            int p = s[i].total + j;
            assert_true(tok < 1024);
            sp->t2p[tok] = s[i].pages[(p - s[i].start) / ps];
            sp->t2s[tok] = p % ps;
            sp->pos[tok] = p;
        }
        memcpy(sp->idx + sp->kvp[i], s[i].pages, (size_t)s[i].n_pages * sizeof(int32_t));
        sp->kvp[i + 1] = sp->kvp[i] + s[i].n_pages;
        sp->qo[i + 1] = sp->qo[i] + span[i];
        int len = end - s[i].start;
        sp->last[i] = s[i].n_pages ? (len % ps ? len % ps : ps) : 0;
        sp->kst[i] = s[i].start;
        sp->views[i] = (ms_kv_view){(ms_rid)i, 0, s[i].pages, s[i].n_pages, s[i].start, len,
                                    span[i], 0};
    }
    sp->plan = (ms_kv_plan){0, n_seqs, sp->views, tok, sp->qo, sp->kvp, sp->idx, sp->last,
                            sp->kst, sp->t2p, sp->t2s, false};
}

/* Commit: lengths advance; with a window, whole pages entirely before the last `window` tokens
 * go back to the pager (DESIGN.md §3 windowed retention). */
static void commit_step(pager *pg, seq *s, int n_seqs, const int *span, int window) {
    for (int i = 0; i < n_seqs; i++) {
        s[i].total += span[i];
        while (window > 0 && s[i].n_pages > 0 && s[i].start + pg->page_size <= s[i].total - window) {
            pg->free_ids[pg->n_free++] = s[i].pages[0];
            memmove(s[i].pages, s[i].pages + 1, (size_t)(s[i].n_pages - 1) * sizeof(int32_t));
            s[i].n_pages--;
            s[i].start += pg->page_size;
        }
    }
}

/* ---- running a fixture ---- */

typedef struct prompt_ref {
    int32_t *ids;
    int64_t len;
    float *prefill; /* [len, vocab] */
    float *decode;  /* [n_new, vocab] */
    int32_t *greedy;
    int64_t n_new;
} prompt_ref;

typedef struct run_result {
    float err_prefill, err_decode; /* max abs over the prompts run */
    int32_t ids[MAX_SEQS][64];
    int min_start_seen;            /* largest kv_start seen (retention happened when > 0) */
} run_result;

static float row_err(const float *a, const float *b, int n) {
    float m = 0.0f;
    for (int i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m))
            m = isnan(d) ? INFINITY : d;
    }
    return m;
}

/* Run prompts[which[0..n)] as one ragged batch: one prefill step, then n_new decode steps, each
 * checked against the reference. */
static void run_batch(model *m, const prompt_ref *pr, const int *which, int n, int page_size,
                      run_result *res) {
    ms_error err = {0};
    const ms_backend_i *f = &m->be->iface;
    pager pg;
    seq s[MAX_SEQS];
    memset(s, 0, sizeof s);
    memset(res, 0, sizeof *res);
    pager_init(&pg, m->kv.n_pages, page_size);
    step_plan *sp = ms_calloc(1, sizeof *sp);
    assert_non_null(sp);
    int span[MAX_SEQS], n_new = (int)pr[which[0]].n_new;
    int32_t host_ids[1024], next[MAX_SEQS];
    float *host_logits = ms_malloc(sizeof(float) * (size_t)m->max_tokens * (size_t)m->vocab);
    for (int step = 0; step < n_new; step++) {
        /* step 0 = prefill of every prompt; step j >= 1 feeds greedy id j - 1 */
        int tok = 0;
        for (int i = 0; i < n; i++) {
            const prompt_ref *p = &pr[which[i]];
            span[i] = step == 0 ? (int)p->len : 1;
            if (step == 0)
                for (int j = 0; j < p->len; j++)
                    host_ids[tok++] = p->ids[j];
            else
                host_ids[tok++] = res->ids[i][step - 1];
        }
        plan_step(sp, &pg, s, n, span);
        assert_true(tok <= m->max_tokens);
        CHECK(f->copy_to_backend(m->be->ctx, m->ids, host_ids, (size_t)tok * 4, &err));
        CHECK(f->copy_to_backend(m->be->ctx, m->pos, sp->pos, (size_t)tok * 4, &err));
        CHECK(f->attn_batch_stage(m->be->ctx, m->batch, &sp->plan, &m->kv, &err));
        for (int i = 0; i < n; i++)
            res->min_start_seen = MS_MAX(res->min_start_seen, s[i].start);
        model_forward(m, tok);
        CHECK(f->copy_to_host(m->be->ctx, host_logits, m->logits, (size_t)tok * (size_t)m->vocab * 4, &err));
        CHECK(f->copy_to_host(m->be->ctx, next, m->next_ids, (size_t)n * 4, &err));
        int row = 0;
        for (int i = 0; i < n; i++) {
            const prompt_ref *p = &pr[which[i]];
            if (step == 0) {
                for (int j = 0; j < p->len; j++) {
                    float e = row_err(host_logits + (size_t)(row + j) * (size_t)m->vocab,
                                      p->prefill + (size_t)j * (size_t)m->vocab, m->vocab);
                    res->err_prefill = fmaxf(res->err_prefill, e);
                }
            } else {
                float e = row_err(host_logits + (size_t)row * (size_t)m->vocab,
                                  p->decode + (size_t)(step - 1) * (size_t)m->vocab, m->vocab);
                res->err_decode = fmaxf(res->err_decode, e);
            }
            row += span[i];
            res->ids[i][step] = next[i];
        }
        commit_step(&pg, s, n, span, m->window);
    }
    /* the last decode step (feeding greedy id n_new - 1) has reference logits too */
    {
        int tok = 0;
        for (int i = 0; i < n; i++) {
            span[i] = 1;
            host_ids[tok++] = res->ids[i][n_new - 1];
        }
        plan_step(sp, &pg, s, n, span);
        CHECK(f->copy_to_backend(m->be->ctx, m->ids, host_ids, (size_t)tok * 4, &err));
        CHECK(f->copy_to_backend(m->be->ctx, m->pos, sp->pos, (size_t)tok * 4, &err));
        CHECK(f->attn_batch_stage(m->be->ctx, m->batch, &sp->plan, &m->kv, &err));
        model_forward(m, tok);
        CHECK(f->copy_to_host(m->be->ctx, host_logits, m->logits, (size_t)tok * (size_t)m->vocab * 4, &err));
        for (int i = 0; i < n; i++) {
            float e = row_err(host_logits + (size_t)i * (size_t)m->vocab,
                              pr[which[i]].decode + (size_t)(n_new - 1) * (size_t)m->vocab, m->vocab);
            res->err_decode = fmaxf(res->err_decode, e);
        }
    }
    ms_free(host_logits);
    ms_free(sp);
}

static int load_prompts(const char *dir, prompt_ref *pr, ref_file *rf) {
    char path[2048], name[64];
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    ref_open(rf, path);
    int n = 0;
    for (; n < MAX_SEQS; n++) {
        snprintf(name, sizeof name, "p%d.input_ids", n);
        if (!ref_has(rf, name))
            break;
        int64_t r, c, vr, vc;
        pr[n].ids = ref_get(rf, name, "I32", &pr[n].len, &c);
        snprintf(name, sizeof name, "p%d.prefill_logits", n);
        pr[n].prefill = ref_get(rf, name, "F32", &r, &vc);
        assert_int_equal(r, pr[n].len);
        snprintf(name, sizeof name, "p%d.decode_logits", n);
        pr[n].decode = ref_get(rf, name, "F32", &pr[n].n_new, &vc);
        snprintf(name, sizeof name, "p%d.greedy_ids", n);
        pr[n].greedy = ref_get(rf, name, "I32", &vr, &c);
        assert_int_equal(vr, pr[n].n_new);
        assert_true(pr[n].n_new <= 64);
    }
    return n;
}

static void free_prompts(prompt_ref *pr, int n, ref_file *rf) {
    for (int i = 0; i < n; i++)
        ms_free(pr[i].ids), ms_free(pr[i].prefill), ms_free(pr[i].decode), ms_free(pr[i].greedy);
    ref_close(rf);
}

/* Check one fixture: all prompts as one ragged batch for each page size; with `singles`, also
 * each prompt alone (same ids required). Prints the worst errors. */
static void check_fixture(const char *rel, const int *page_sizes, int n_ps, bool singles,
                          bool expect_retention) {
    ms_error err = {0};
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", ms_test_fixture(rel));
    ms_backend be;
    CHECK(ms_backend_cpu_init(&be, &(ms_backend_cpu_options){2}, &err));
    prompt_ref pr[MAX_SEQS];
    ref_file rf;
    memset(pr, 0, sizeof pr);
    int np = load_prompts(dir, pr, &rf);
    assert_true(np >= 1);
    int total = 0, most = 0;
    for (int i = 0; i < np; i++)
        total += (int)pr[i].len, most = MS_MAX(most, (int)(pr[i].len + pr[i].n_new));
    float worst_p = 0.0f, worst_d = 0.0f;
    int all[MAX_SEQS] = {0, 1, 2, 3};
    run_result batched[8];
    for (int k = 0; k < n_ps; k++) {
        model m;
        model_load(&m, &be, dir);
        int ps = page_sizes[k];
        model_plan(&m, MS_MAX(total, np), np * (most / ps + 2) + 2, ps);
        run_result *r = &batched[k];
        run_batch(&m, pr, all, np, ps, r);
        for (int i = 0; i < np; i++)
            for (int j = 0; j < pr[i].n_new; j++)
                if (r->ids[i][j] != pr[i].greedy[j])
                    fail_msg("%s page_size %d prompt %d step %d: id %d, reference %d", rel, ps, i,
                             j, r->ids[i][j], pr[i].greedy[j]);
        if (!(r->err_prefill < TOL && r->err_decode < TOL))
            fail_msg("%s page_size %d: max abs error prefill %g decode %g", rel, ps,
                     (double)r->err_prefill, (double)r->err_decode);
        if (expect_retention && ps < 8)
            assert_true(r->min_start_seen > 0);
        worst_p = fmaxf(worst_p, r->err_prefill);
        worst_d = fmaxf(worst_d, r->err_decode);
        if (singles && k == 0) {
            for (int i = 0; i < np; i++) {
                run_result one;
                run_batch(&m, pr, &i, 1, ps, &one);
                assert_memory_equal(one.ids[0], r->ids[i], sizeof(int32_t) * (size_t)pr[i].n_new);
                worst_p = fmaxf(worst_p, one.err_prefill);
                worst_d = fmaxf(worst_d, one.err_decode);
            }
        }
        model_free(&m);
    }
    printf("fixture %-22s %d prompt(s), page sizes", rel, np);
    for (int k = 0; k < n_ps; k++)
        printf(" %d", page_sizes[k]);
    printf(": max abs error prefill %.3g, decode %.3g; greedy ids equal\n", (double)worst_p,
           (double)worst_d);
    free_prompts(pr, np, &rf);
    ms_backend_free(&be);
}

static void test_llama_gqa(void **state) {
    (void)state;
    int ps[3] = {4, 16, 128};
    check_fixture("hf/llama_gqa", ps, 3, true, false);
}

static void test_mistral_window(void **state) {
    (void)state;
    int ps[2] = {4, 16};
    check_fixture("hf/mistral_window", ps, 2, true, true);
}

static void test_llama31_rope(void **state) {
    (void)state;
    int ps[2] = {16, 5};
    check_fixture("hf/llama31_rope", ps, 2, false, false);
}

static void test_llama31_rope_legacy(void **state) {
    (void)state;
    int ps[1] = {16};
    check_fixture("hf/llama31_rope_legacy", ps, 1, false, false);
}

static void test_qwen3(void **state) {
    (void)state;
    int ps[1] = {8};
    check_fixture("hf/qwen3", ps, 1, false, false);
}

/* ---- llama2.c golden runs (interleaved RoPE, run.c's greedy loop) ---- */

#define GOLDEN_MAX 160

/* Greedy generation for n prompts as one ragged batch: one prefill step, then decode steps until
 * every sequence holds `total` ids. out[i][0..total) = prompt then generated ids. */
static void greedy_batch(model *m, int32_t *const *prompts, const int *lens, int n, int total,
                         int page_size, int32_t out[][GOLDEN_MAX]) {
    ms_error err = {0};
    const ms_backend_i *f = &m->be->iface;
    pager pg;
    seq s[MAX_SEQS];
    memset(s, 0, sizeof s);
    pager_init(&pg, m->kv.n_pages, page_size);
    step_plan *sp = ms_calloc(1, sizeof *sp);
    assert_non_null(sp);
    int have[MAX_SEQS], span[MAX_SEQS], min_len = total;
    assert_true(total <= GOLDEN_MAX);
    int32_t host_ids[1024], next[MAX_SEQS];
    for (int i = 0; i < n; i++) {
        memcpy(out[i], prompts[i], sizeof(int32_t) * (size_t)lens[i]);
        have[i] = lens[i];
        min_len = MS_MIN(min_len, lens[i]);
    }
    for (int step = 0; step < total - min_len; step++) {
        int tok = 0;
        for (int i = 0; i < n; i++) {
            span[i] = step == 0 ? lens[i] : 1;
            for (int j = 0; j < span[i]; j++)
                host_ids[tok++] = out[i][have[i] - span[i] + j];
        }
        plan_step(sp, &pg, s, n, span);
        CHECK(f->copy_to_backend(m->be->ctx, m->ids, host_ids, (size_t)tok * 4, &err));
        CHECK(f->copy_to_backend(m->be->ctx, m->pos, sp->pos, (size_t)tok * 4, &err));
        CHECK(f->attn_batch_stage(m->be->ctx, m->batch, &sp->plan, &m->kv, &err));
        model_forward(m, tok);
        CHECK(f->copy_to_host(m->be->ctx, next, m->next_ids, (size_t)n * 4, &err));
        for (int i = 0; i < n; i++)
            if (have[i] < total)
                out[i][have[i]++] = next[i];
        commit_step(&pg, s, n, span, 0);
    }
    ms_free(sp);
}

static void test_llama2c_aidreams_golden(void **state) {
    (void)state;
    ms_error err = {0};
    char bin[2048], tokp[2048], golden[2048];
    snprintf(bin, sizeof bin, "%s", ms_test_fixture("llama2c/aidreams260K.bin"));
    snprintf(tokp, sizeof tokp, "%s", ms_test_fixture("llama2c/tok512.bin"));
    snprintf(golden, sizeof golden, "%s", ms_test_fixture("llama2c/aidreams260K.golden.json"));
    json_error_t je;
    json_t *g = json_load_file(golden, 0, &je);
    if (g == NULL)
        fail_msg("%s: %s", golden, je.text);
    json_t *cases = json_object_get(g, "cases");
    int n = (int)json_array_size(cases);
    assert_true(n >= 1 && n <= MAX_SEQS);
    ms_backend be;
    CHECK(ms_backend_cpu_init(&be, &(ms_backend_cpu_options){2}, &err));
    model m;
    model_load(&m, &be, bin);
    assert_int_equal(m.rope.style, MS_ROPE_INTERLEAVED);
    ms_llama2c_tok *tok = NULL;
    CHECK(ms_llama2c_tok_init(&tok, tokp, m.vocab, &err));
    int32_t *prompts[MAX_SEQS];
    int lens[MAX_SEQS], steps = 0;
    for (int i = 0; i < n; i++) {
        json_t *c = json_array_get(cases, (size_t)i);
        size_t np;
        CHECK(ms_llama2c_tok_encode(tok, json_string_value(json_object_get(c, "prompt")), true,
                                    false, &prompts[i], &np, &err));
        lens[i] = (int)np;
        steps = (int)json_integer_value(json_object_get(c, "steps"));
        assert_int_equal(steps, 128);
    }
    int page_sizes[2] = {16, 3};
    for (int k = 0; k < 2; k++) {
        model_plan(&m, 256, n * (GOLDEN_MAX / page_sizes[k] + 2) + 2, page_sizes[k]);
        /* run.c: positions 0 .. steps - 1 are fed; the token after the last one is printed too */
        int32_t out[MAX_SEQS][GOLDEN_MAX];
        greedy_batch(&m, prompts, lens, n, steps + 1, page_sizes[k], out);
        for (int i = 0; i < n; i++) {
            json_t *c = json_array_get(cases, (size_t)i);
            json_t *ids = json_object_get(c, "token_ids");
            assert_int_equal(json_array_size(ids), 128);
            for (int j = 0; j < 128; j++)
                if (out[i][j] != json_integer_value(json_array_get(ids, (size_t)j)))
                    fail_msg("aidreams case %d page_size %d position %d: id %d, golden %d", i,
                             page_sizes[k], j, out[i][j],
                             (int)json_integer_value(json_array_get(ids, (size_t)j)));
            /* the text run.c prints: every piece after BOS, non-printable bytes skipped */
            char text[4096];
            size_t o = 0;
            for (int j = 1; j <= steps; j++) {
                const char *piece = ms_llama2c_tok_decode(tok, out[i][j - 1], out[i][j]);
                if (piece == NULL || !ms_llama2c_tok_piece_printable(piece))
                    continue;
                size_t pl = strlen(piece);
                assert_true(o + pl + 2 < sizeof text);
                memcpy(text + o, piece, pl);
                o += pl;
            }
            text[o++] = '\n';
            text[o] = '\0';
            assert_string_equal(text, json_string_value(json_object_get(c, "text")));
        }
        /* model_plan allocated buffers for this page size; release them before the next */
        m.be->iface.attn_batch_free(m.be->ctx, m.batch);
        m.batch = NULL;
    }
    printf("llama2c aidreams260K: %d golden cases token-exact for 128 steps (ids and text), "
           "page sizes 16 and 3, one ragged batch\n", n);
    for (int i = 0; i < n; i++)
        ms_free(prompts[i]);
    ms_llama2c_tok_free(tok);
    model_free(&m);
    ms_backend_free(&be);
    json_decref(g);
}

/* ---- Qwen2-VL text path: M-RoPE with explicit t/h/w position streams ---- */

static void test_qwen2vl_mrope(void **state) {
    (void)state;
    ms_error err = {0};
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", ms_test_fixture("hf/qwen2vl_mrope"));
    ms_backend be;
    CHECK(ms_backend_cpu_init(&be, &(ms_backend_cpu_options){2}, &err));
    model m;
    model_load(&m, &be, dir);
    assert_int_equal(m.pos_streams, 3);
    assert_true(m.qkv_bias);
    ref_file rf;
    char path[2048];
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    ref_open(&rf, path);
    int64_t n, c, r3, n3, rl, vl;
    int32_t *ids = ref_get(&rf, "input_ids", "I32", &n, &c);
    int32_t *thw = ref_get(&rf, "position_ids_thw", "I32", &r3, &n3);
    float *want = ref_get(&rf, "logits", "F32", &rl, &vl);
    assert_int_equal(r3, 3);
    assert_int_equal(n3, n);
    assert_int_equal(vl, m.vocab);
    int ps = 16;
    model_plan(&m, (int)n, (int)n / ps + 4, ps);
    pager pg;
    seq s[1];
    memset(s, 0, sizeof s);
    pager_init(&pg, m.kv.n_pages, ps);
    step_plan *sp = ms_calloc(1, sizeof *sp);
    assert_non_null(sp);
    int span[1] = {(int)n};
    plan_step(sp, &pg, s, 1, span);
    const ms_backend_i *f = &be.iface;
    CHECK(f->copy_to_backend(be.ctx, m.ids, ids, (size_t)n * 4, &err));
    /* explicit positions (the attention mask still uses the KV positions 0 .. n - 1) */
    CHECK(f->copy_to_backend(be.ctx, m.pos, thw, (size_t)(3 * n) * 4, &err));
    CHECK(f->attn_batch_stage(be.ctx, m.batch, &sp->plan, &m.kv, &err));
    model_forward(&m, (int)n);
    float *got = ms_malloc(sizeof(float) * (size_t)(n * m.vocab));
    CHECK(f->copy_to_host(be.ctx, got, m.logits, sizeof(float) * (size_t)(n * m.vocab), &err));
    float e = row_err(got, want, (int)(n * m.vocab));
    printf("fixture hf/qwen2vl_mrope        1 prompt of %lld tokens (M-RoPE sections %d/%d/%d): "
           "max abs error %.3g\n", (long long)n, m.rope.sections[0], m.rope.sections[1],
           m.rope.sections[2], (double)e);
    if (!(e < TOL))
        fail_msg("qwen2vl_mrope: max abs error %g", (double)e);
    ms_free(got), ms_free(sp), ms_free(ids), ms_free(thw), ms_free(want);
    ref_close(&rf);
    model_free(&m);
    ms_backend_free(&be);
}

/* ---- classifier-free guidance: cond and uncond streams of one request in one batch ---- */

static void log_softmax(const float *z, int n, double *out) {
    double mx = -INFINITY, sum = 0.0;
    for (int i = 0; i < n; i++)
        mx = fmax(mx, z[i]);
    for (int i = 0; i < n; i++)
        sum += exp(z[i] - mx);
    double lse = mx + log(sum);
    for (int i = 0; i < n; i++)
        out[i] = z[i] - lse;
}

static void test_llama_cfg(void **state) {
    (void)state;
    ms_error err = {0};
    char dir[1024], path[2048];
    snprintf(dir, sizeof dir, "%s", ms_test_fixture("hf/llama_cfg"));
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    ms_backend be;
    CHECK(ms_backend_cpu_init(&be, &(ms_backend_cpu_options){2}, &err));
    model m;
    model_load(&m, &be, dir);
    ref_file rf;
    ref_open(&rf, path);
    int64_t nc, nu, n_new, c, vr;
    int32_t *cond = ref_get(&rf, "cond_ids", "I32", &nc, &c);
    int32_t *uncond = ref_get(&rf, "uncond_ids", "I32", &nu, &c);
    int32_t *greedy = ref_get(&rf, "greedy_ids", "I32", &n_new, &c);
    float *mixed_ref = ref_get(&rf, "mixed_logprobs", "F32", &vr, &c);
    assert_int_equal(vr, n_new);
    assert_int_equal(c, m.vocab);
    const double scale = 3.0; /* reference.json guidance_scale */
    int ps = 4;
    model_plan(&m, (int)(nc + nu), 2 * (int)((nc + n_new) / ps + 2) + 2, ps);
    pager pg;
    seq s[2];
    memset(s, 0, sizeof s);
    pager_init(&pg, m.kv.n_pages, ps);
    step_plan *sp = ms_calloc(1, sizeof *sp);
    double *lc = ms_malloc(sizeof(double) * (size_t)m.vocab), *lu = ms_malloc(sizeof(double) * (size_t)m.vocab);
    float *last = ms_malloc(sizeof(float) * 2 * (size_t)m.vocab);
    int32_t host_ids[64];
    int32_t id = -1;
    float worst = 0.0f;
    const ms_backend_i *f = &be.iface;
    for (int step = 0; step < n_new; step++) {
        int span[2], tok = 0;
        if (step == 0) {
            span[0] = (int)nc, span[1] = (int)nu;
            memcpy(host_ids, cond, sizeof(int32_t) * (size_t)nc);
            memcpy(host_ids + nc, uncond, sizeof(int32_t) * (size_t)nu);
            tok = (int)(nc + nu);
        } else {
            span[0] = span[1] = 1;
            host_ids[0] = host_ids[1] = id; /* the guided id goes to both streams */
            tok = 2;
        }
        plan_step(sp, &pg, s, 2, span);
        CHECK(f->copy_to_backend(be.ctx, m.ids, host_ids, (size_t)tok * 4, &err));
        CHECK(f->copy_to_backend(be.ctx, m.pos, sp->pos, (size_t)tok * 4, &err));
        CHECK(f->attn_batch_stage(be.ctx, m.batch, &sp->plan, &m.kv, &err));
        model_forward(&m, tok);
        CHECK(f->copy_to_host(be.ctx, last, m.last_logits, sizeof(float) * 2 * (size_t)m.vocab, &err));
        log_softmax(last, m.vocab, lc);
        log_softmax(last + m.vocab, m.vocab, lu);
        double best = -INFINITY;
        for (int i = 0; i < m.vocab; i++) {
            double mixed = lu[i] + scale * (lc[i] - lu[i]);
            worst = fmaxf(worst, (float)fabs(mixed - mixed_ref[(size_t)step * (size_t)m.vocab + (size_t)i]));
            if (mixed > best) {
                best = mixed;
                id = i;
            }
        }
        if (id != greedy[step])
            fail_msg("llama_cfg step %d: id %d, reference %d", step, id, greedy[step]);
        commit_step(&pg, s, 2, span, 0);
    }
    printf("fixture hf/llama_cfg            cond %lld + uncond %lld tokens, %lld guided steps: "
           "max abs error of mixed log-probs %.3g; greedy ids equal\n", (long long)nc,
           (long long)nu, (long long)n_new, (double)worst);
    if (!(worst < TOL))
        fail_msg("llama_cfg: max abs error %g", (double)worst);
    ms_free(sp), ms_free(lc), ms_free(lu), ms_free(last);
    ms_free(cond), ms_free(uncond), ms_free(greedy), ms_free(mixed_ref);
    ref_close(&rf);
    model_free(&m);
    ms_backend_free(&be);
}

/* ---- Whisper: encoder (conv front end, LayerNorm, GELU), decoder with cross-attention ---- */

typedef struct wsp_attn {
    ms_tensor wqkv, bqkv, wo, bo; /* fused [q; k; v] weight and bias (k has no bias: zeros) */
} wsp_attn;

typedef struct wsp_layer {
    ms_tensor ln1_w, ln1_b, ln2_w, ln2_b, ln3_w, ln3_b, fc1_w, fc1_b, fc2_w, fc2_b;
    wsp_attn self, cross;
} wsp_layer;

typedef struct wsp {
    model m; /* buffers, loader helpers and backend */
    int d, heads, hd, ffn, enc_layers, dec_layers, vocab, n_frames, n_mels;
    ms_tensor conv1_w, conv1_b, conv2_w, conv2_b, enc_pos, enc_ln_w, enc_ln_b;
    ms_tensor dec_tok, dec_pos, dec_ln_w, dec_ln_b;
    wsp_layer enc[4], dec[4];
} wsp;

static ms_tensor wsp_vec(wsp *w, const ms_ckpt *ck, const char *name, int64_t n) {
    return new_weight(&w->m, ck, name, n, 0);
}

/* Fused [q; k; v] projection of `prefix` (".self_attn" style): weights [3 d, d], bias with zeros
 * for k (Whisper's k_proj has no bias). */
static void wsp_load_attn(wsp *w, const ms_ckpt *ck, const char *prefix, wsp_attn *a) {
    ms_error err = {0};
    char name[160];
    int d = w->d;
    a->wqkv = ms_tensor_2d(model_alloc(&w->m, (size_t)(3 * d * d) * 4, "wqkv"), MS_DTYPE_F32, 3 * d, d);
    a->bqkv = ms_tensor_1d(model_alloc(&w->m, (size_t)(3 * d) * 4, "bqkv"), MS_DTYPE_F32, 3 * d);
    CHECK(w->m.be->iface.buffer_fill(w->m.be->ctx, a->bqkv.data, 0, (size_t)(3 * d) * 4, &err));
    const char *proj[3] = {"q_proj", "k_proj", "v_proj"};
    for (int p = 0; p < 3; p++) {
        ms_tensor part = ms_tensor_slice(&a->wqkv, 0, p * d, d);
        snprintf(name, sizeof name, "%s.%s.weight", prefix, proj[p]);
        load_into(&w->m, ck, name, d, d, &part);
        if (p != 1) {
            ms_tensor bpart = ms_tensor_slice(&a->bqkv, 0, p * d, d);
            snprintf(name, sizeof name, "%s.%s.bias", prefix, proj[p]);
            load_into(&w->m, ck, name, d, 0, &bpart);
        }
    }
    snprintf(name, sizeof name, "%s.out_proj.weight", prefix);
    a->wo = new_weight(&w->m, ck, name, d, d);
    snprintf(name, sizeof name, "%s.out_proj.bias", prefix);
    a->bo = wsp_vec(w, ck, name, d);
}

static void wsp_load_layer(wsp *w, const ms_ckpt *ck, const char *stack, int l, wsp_layer *L,
                           bool decoder) {
    char p[128], name[160];
    snprintf(p, sizeof p, "model.%s.layers.%d", stack, l);
#define WN(fmt) (snprintf(name, sizeof name, "%s." fmt, p), name)
    L->ln1_w = wsp_vec(w, ck, WN("self_attn_layer_norm.weight"), w->d);
    L->ln1_b = wsp_vec(w, ck, WN("self_attn_layer_norm.bias"), w->d);
    L->ln3_w = wsp_vec(w, ck, WN("final_layer_norm.weight"), w->d);
    L->ln3_b = wsp_vec(w, ck, WN("final_layer_norm.bias"), w->d);
    L->fc1_w = new_weight(&w->m, ck, WN("fc1.weight"), w->ffn, w->d);
    L->fc1_b = wsp_vec(w, ck, WN("fc1.bias"), w->ffn);
    L->fc2_w = new_weight(&w->m, ck, WN("fc2.weight"), w->d, w->ffn);
    L->fc2_b = wsp_vec(w, ck, WN("fc2.bias"), w->d);
    wsp_load_attn(w, ck, WN("self_attn"), &L->self);
    if (decoder) {
        L->ln2_w = wsp_vec(w, ck, WN("encoder_attn_layer_norm.weight"), w->d);
        L->ln2_b = wsp_vec(w, ck, WN("encoder_attn_layer_norm.bias"), w->d);
        wsp_load_attn(w, ck, WN("encoder_attn"), &L->cross);
    }
#undef WN
}

/* Scratch buffers of one Whisper pass over n rows. */
typedef struct wsp_bufs {
    ms_tensor x, h, qkv, att, t, f;
} wsp_bufs;

static wsp_bufs wsp_bufs_make(wsp *w, int n) {
    wsp_bufs b;
    b.x = ms_tensor_2d(model_alloc(&w->m, (size_t)(n * w->d) * 4, "x"), MS_DTYPE_F32, n, w->d);
    b.h = ms_tensor_2d(model_alloc(&w->m, (size_t)(n * w->d) * 4, "h"), MS_DTYPE_F32, n, w->d);
    b.t = ms_tensor_2d(model_alloc(&w->m, (size_t)(n * w->d) * 4, "t"), MS_DTYPE_F32, n, w->d);
    b.att = ms_tensor_2d(model_alloc(&w->m, (size_t)(n * w->d) * 4, "att"), MS_DTYPE_F32, n, w->d);
    b.qkv = ms_tensor_2d(model_alloc(&w->m, (size_t)(n * 3 * w->d) * 4, "qkv"), MS_DTYPE_F32, n,
                         3 * w->d);
    b.f = ms_tensor_2d(model_alloc(&w->m, (size_t)(n * w->ffn) * 4, "f"), MS_DTYPE_F32, n, w->ffn);
    return b;
}

static ms_tensor rows_of(const ms_tensor *t, int n) {
    return ms_tensor_slice(t, 0, 0, n);
}

/* x += out_proj(attention) for one attention block; q/k/v from h. With `cross`, only q is
 * projected here (K/V of the context are in the arena already). */
static void wsp_attn_block(wsp *w, const wsp_attn *a, wsp_bufs *b, int n, const ms_paged_kv *kv,
                           int layer, ms_attn_batch *write_batch, ms_attn_batch *read_batch,
                           bool causal) {
    ms_error err = {0};
    const ms_backend_i *f = &w->m.be->iface;
    void *c = w->m.be->ctx;
    int d = w->d;
    ms_tensor h = rows_of(&b->h, n), qkv = rows_of(&b->qkv, n), att = rows_of(&b->att, n);
    ms_tensor t = rows_of(&b->t, n), x = rows_of(&b->x, n);
    CHECK(f->linear(c, &h, &a->wqkv, &a->bqkv, &qkv, &err));
    ms_tensor q2 = ms_tensor_slice(&qkv, 1, 0, d), k2 = ms_tensor_slice(&qkv, 1, d, d);
    ms_tensor v2 = ms_tensor_slice(&qkv, 1, 2 * d, d);
    ms_tensor q = ms_tensor_split_heads(&q2, w->heads, w->hd);
    ms_tensor k = ms_tensor_split_heads(&k2, w->heads, w->hd);
    ms_tensor v = ms_tensor_split_heads(&v2, w->heads, w->hd);
    if (write_batch != NULL)
        CHECK(f->kv_write(c, kv, layer, &k, &v, write_batch, &err));
    ms_tensor att3 = ms_tensor_split_heads(&att, w->heads, w->hd);
    ms_attn_params ap = {1.0f / sqrtf((float)w->hd), 0, causal};
    CHECK(f->attention(c, &q, kv, layer, read_batch, &ap, &att3, &err));
    CHECK(f->linear(c, &att, &a->wo, &a->bo, &t, &err));
    CHECK(f->add(c, &x, &t, &x, &err));
}

static void wsp_mlp_block(wsp *w, const wsp_layer *L, wsp_bufs *b, int n) {
    ms_error err = {0};
    const ms_backend_i *f = &w->m.be->iface;
    void *c = w->m.be->ctx;
    ms_tensor x = rows_of(&b->x, n), h = rows_of(&b->h, n), fb = rows_of(&b->f, n);
    ms_tensor t = rows_of(&b->t, n);
    CHECK(f->layer_norm(c, &x, &L->ln3_w, &L->ln3_b, 1e-5f, &h, &err));
    CHECK(f->linear(c, &h, &L->fc1_w, &L->fc1_b, &fb, &err));
    CHECK(f->gelu(c, &fb, &fb, &err));
    CHECK(f->linear(c, &fb, &L->fc2_w, &L->fc2_b, &t, &err));
    CHECK(f->add(c, &x, &t, &x, &err));
}

/* Plan one stream of `len` tokens written in one step (encoder self-attention, cross context). */
static void wsp_plan_stream(step_plan *sp, const ms_paged_kv *kv, int len, ms_attn_batch *batch,
                            const ms_backend *be) {
    ms_error err = {0};
    pager pg;
    seq s[1];
    memset(s, 0, sizeof s);
    pager_init(&pg, kv->n_pages, kv->page_size);
    int span[1] = {len};
    plan_step(sp, &pg, s, 1, span);
    CHECK(be->iface.attn_batch_stage(be->ctx, batch, &sp->plan, kv, &err));
}

static void test_whisper_tiny(void **state) {
    (void)state;
    ms_error err = {0};
    char dir[1024], path[2048];
    snprintf(dir, sizeof dir, "%s", ms_test_fixture("hf/whisper_tiny"));
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    ms_backend be;
    CHECK(ms_backend_cpu_init(&be, &(ms_backend_cpu_options){2}, &err));
    wsp *w = ms_calloc(1, sizeof *w);
    assert_non_null(w);
    w->m.be = &be;
    ms_hf_config *cfg = NULL;
    CHECK(ms_hf_config_init(&cfg, dir, &err));
    int64_t v;
    CHECK(ms_hf_config_get_int(cfg, "d_model", &v, &err));
    w->d = (int)v;
    CHECK(ms_hf_config_get_int(cfg, "decoder_attention_heads", &v, &err));
    w->heads = (int)v;
    w->hd = w->d / w->heads;
    CHECK(ms_hf_config_get_int(cfg, "decoder_ffn_dim", &v, &err));
    w->ffn = (int)v;
    CHECK(ms_hf_config_get_int(cfg, "encoder_layers", &v, &err));
    w->enc_layers = (int)v;
    CHECK(ms_hf_config_get_int(cfg, "decoder_layers", &v, &err));
    w->dec_layers = (int)v;
    CHECK(ms_hf_config_get_int(cfg, "vocab_size", &v, &err));
    w->vocab = (int)v;
    CHECK(ms_hf_config_get_int(cfg, "max_source_positions", &v, &err));
    w->n_frames = (int)v;
    CHECK(ms_hf_config_get_int(cfg, "num_mel_bins", &v, &err));
    w->n_mels = (int)v;
    int64_t max_target;
    CHECK(ms_hf_config_get_int(cfg, "max_target_positions", &max_target, &err));
    ms_hf_config_free(cfg);
    assert_true(w->enc_layers <= 4 && w->dec_layers <= 4);

    ms_ckpt *ck = NULL;
    CHECK(ms_ckpt_init(&ck, dir, &err));
    w->conv1_w = ms_tensor_3d(model_alloc(&w->m, (size_t)(w->d * w->n_mels * 3) * 4, "conv1"),
                              MS_DTYPE_F32, w->d, w->n_mels, 3);
    w->conv2_w = ms_tensor_3d(model_alloc(&w->m, (size_t)(w->d * w->d * 3) * 4, "conv2"),
                              MS_DTYPE_F32, w->d, w->d, 3);
    {
        const ms_st_tensor *t;
        int64_t s1[3] = {w->d, w->n_mels, 3}, s2[3] = {w->d, w->d, 3};
        CHECK(ms_ckpt_expect_tensor(ck, "model.encoder.conv1.weight", MS_ST_DTYPES_FLOAT, 3, s1, &t, &err));
        ms_tensor src = ms_tensor_3d((void *)t->data, st_dtype(t->dtype), w->d, w->n_mels, 3);
        CHECK(be.iface.tensor_load(be.ctx, &w->conv1_w, &src, &err));
        CHECK(ms_ckpt_expect_tensor(ck, "model.encoder.conv2.weight", MS_ST_DTYPES_FLOAT, 3, s2, &t, &err));
        src = ms_tensor_3d((void *)t->data, st_dtype(t->dtype), w->d, w->d, 3);
        CHECK(be.iface.tensor_load(be.ctx, &w->conv2_w, &src, &err));
    }
    w->conv1_b = wsp_vec(w, ck, "model.encoder.conv1.bias", w->d);
    w->conv2_b = wsp_vec(w, ck, "model.encoder.conv2.bias", w->d);
    w->enc_pos = new_weight(&w->m, ck, "model.encoder.embed_positions.weight", w->n_frames, w->d);
    w->enc_ln_w = wsp_vec(w, ck, "model.encoder.layer_norm.weight", w->d);
    w->enc_ln_b = wsp_vec(w, ck, "model.encoder.layer_norm.bias", w->d);
    w->dec_tok = new_weight(&w->m, ck, "model.decoder.embed_tokens.weight", w->vocab, w->d);
    w->dec_pos = new_weight(&w->m, ck, "model.decoder.embed_positions.weight", max_target, w->d);
    w->dec_ln_w = wsp_vec(w, ck, "model.decoder.layer_norm.weight", w->d);
    w->dec_ln_b = wsp_vec(w, ck, "model.decoder.layer_norm.bias", w->d);
    assert_false(ms_ckpt_has_tensor(ck, "proj_out.weight")); /* tied: logits use embed_tokens */
    for (int l = 0; l < w->enc_layers; l++)
        wsp_load_layer(w, ck, "encoder", l, &w->enc[l], false);
    for (int l = 0; l < w->dec_layers; l++)
        wsp_load_layer(w, ck, "decoder", l, &w->dec[l], true);
    ms_ckpt_free(ck);

    ref_file rf;
    ref_open(&rf, path);
    int64_t r, c, n_new;
    float *feat = ref_get(&rf, "input_features", "F32", &r, &c);
    assert_int_equal(r, w->n_mels);
    int64_t frames_in = c;
    float *enc_ref = ref_get(&rf, "encoder_hidden", "F32", &r, &c);
    float *first_ref = ref_get(&rf, "first_logits", "F32", &r, &c);
    float *dec_ref = ref_get(&rf, "decode_logits", "F32", &n_new, &c);
    int32_t *start = ref_get(&rf, "decoder_start_ids", "I32", &r, &c);
    int32_t *greedy = ref_get(&rf, "greedy_ids", "I32", &r, &c);

    /* ---- encoder ---- */
    const ms_backend_i *f = &be.iface;
    int T = w->n_frames, ps = 8;
    float *xin = model_alloc(&w->m, (size_t)(frames_in * w->n_mels) * 4, "mel");
    for (int64_t t = 0; t < frames_in; t++) /* [mels, frames] -> token-major [frames, mels] */
        for (int mb = 0; mb < w->n_mels; mb++)
            xin[t * w->n_mels + mb] = feat[(int64_t)mb * frames_in + t];
    ms_tensor tin = ms_tensor_2d(xin, MS_DTYPE_F32, frames_in, w->n_mels);
    ms_tensor c1 = ms_tensor_2d(model_alloc(&w->m, (size_t)(frames_in * w->d) * 4, "c1"),
                                MS_DTYPE_F32, frames_in, w->d);
    wsp_bufs eb = wsp_bufs_make(w, T);
    CHECK(f->conv1d(be.ctx, &tin, &w->conv1_w, &w->conv1_b, 1, 1, &c1, &err));
    CHECK(f->gelu(be.ctx, &c1, &c1, &err));
    CHECK(f->conv1d(be.ctx, &c1, &w->conv2_w, &w->conv2_b, 2, 1, &eb.h, &err));
    CHECK(f->gelu(be.ctx, &eb.h, &eb.h, &err));
    CHECK(f->add(be.ctx, &eb.h, &w->enc_pos, &eb.x, &err));
    ms_paged_kv enc_kv = {NULL, MS_DTYPE_F32, w->enc_layers, T / ps + 3, ps, w->heads, w->hd};
    enc_kv.data = model_alloc(&w->m, ms_paged_kv_bytes(&enc_kv), "enc.kv");
    ms_attn_limits lim = {2, (int)max_target + T, 64};
    ms_attn_batch *enc_b, *ctx_b, *cross_b, *dec_b;
    CHECK(f->attn_batch_init(be.ctx, &lim, &enc_b, &err));
    CHECK(f->attn_batch_init(be.ctx, &lim, &ctx_b, &err));
    CHECK(f->attn_batch_init(be.ctx, &lim, &cross_b, &err));
    CHECK(f->attn_batch_init(be.ctx, &lim, &dec_b, &err));
    step_plan *sp = ms_calloc(1, sizeof *sp), *ctx_sp = ms_calloc(1, sizeof *ctx_sp);
    wsp_plan_stream(sp, &enc_kv, T, enc_b, &be);
    for (int l = 0; l < w->enc_layers; l++) {
        const wsp_layer *L = &w->enc[l];
        CHECK(f->layer_norm(be.ctx, &eb.x, &L->ln1_w, &L->ln1_b, 1e-5f, &eb.h, &err));
        wsp_attn_block(w, &L->self, &eb, T, &enc_kv, l, enc_b, enc_b, false);
        wsp_mlp_block(w, L, &eb, T);
    }
    ms_tensor enc_out = ms_tensor_2d(model_alloc(&w->m, (size_t)(T * w->d) * 4, "enc.out"),
                                     MS_DTYPE_F32, T, w->d);
    CHECK(f->layer_norm(be.ctx, &eb.x, &w->enc_ln_w, &w->enc_ln_b, 1e-5f, &enc_out, &err));
    float enc_err = row_err(enc_out.data, enc_ref, T * w->d);

    /* ---- cross-attention context: K/V of the encoder output, written once per layer ---- */
    ms_paged_kv ctx_kv = {NULL, MS_DTYPE_F32, w->dec_layers, T / ps + 3, ps, w->heads, w->hd};
    ctx_kv.data = model_alloc(&w->m, ms_paged_kv_bytes(&ctx_kv), "cross.kv");
    wsp_plan_stream(ctx_sp, &ctx_kv, T, ctx_b, &be);
    for (int l = 0; l < w->dec_layers; l++) {
        const wsp_attn *a = &w->dec[l].cross;
        ms_tensor wkv = ms_tensor_slice(&a->wqkv, 0, w->d, 2 * w->d);
        ms_tensor bkv = ms_tensor_slice(&a->bqkv, 0, w->d, 2 * w->d);
        ms_tensor kvo = ms_tensor_slice(&eb.qkv, 1, 0, 2 * w->d);
        CHECK(f->linear(be.ctx, &enc_out, &wkv, &bkv, &kvo, &err));
        ms_tensor k2 = ms_tensor_slice(&kvo, 1, 0, w->d), v2 = ms_tensor_slice(&kvo, 1, w->d, w->d);
        ms_tensor k = ms_tensor_split_heads(&k2, w->heads, w->hd);
        ms_tensor vv = ms_tensor_split_heads(&v2, w->heads, w->hd);
        CHECK(f->kv_write(be.ctx, &ctx_kv, l, &k, &vv, ctx_b, &err));
    }

    /* ---- decoder: start id, then greedy ---- */
    ms_paged_kv dec_kv = {NULL, MS_DTYPE_F32, w->dec_layers, (int)max_target / ps + 3, ps,
                          w->heads, w->hd};
    dec_kv.data = model_alloc(&w->m, ms_paged_kv_bytes(&dec_kv), "dec.kv");
    wsp_bufs db = wsp_bufs_make(w, 1);
    int32_t *ids_b = model_alloc(&w->m, 4, "ids"), *pos_b = model_alloc(&w->m, 4, "pos");
    ms_tensor logits = ms_tensor_2d(model_alloc(&w->m, (size_t)w->vocab * 4, "logits"),
                                    MS_DTYPE_F32, 1, w->vocab);
    ms_tensor pe = ms_tensor_2d(model_alloc(&w->m, (size_t)w->d * 4, "pe"), MS_DTYPE_F32, 1, w->d);
    pager pg;
    seq s[1];
    memset(s, 0, sizeof s);
    pager_init(&pg, dec_kv.n_pages, ps);
    float *host = ms_malloc(sizeof(float) * (size_t)w->vocab);
    float first_err = 0.0f, dec_err = 0.0f;
    int32_t id = start[0];
    for (int step = 0; step <= n_new; step++) {
        int span[1] = {1};
        plan_step(sp, &pg, s, 1, span);
        CHECK(f->copy_to_backend(be.ctx, ids_b, &id, 4, &err));
        CHECK(f->copy_to_backend(be.ctx, pos_b, sp->pos, 4, &err));
        CHECK(f->attn_batch_stage(be.ctx, dec_b, &sp->plan, &dec_kv, &err));
        /* cross: this step's query row over the context (read-only plan) */
        int32_t qo[2] = {0, 1};
        ms_kv_plan cp = {0, 1, NULL, 1, qo, ctx_sp->kvp, ctx_sp->idx, ctx_sp->last, NULL, NULL,
                         NULL, false};
        CHECK(f->attn_batch_stage(be.ctx, cross_b, &cp, &ctx_kv, &err));
        ms_tensor tids = ms_tensor_1d(ids_b, MS_DTYPE_I32, 1), tpos = ms_tensor_1d(pos_b, MS_DTYPE_I32, 1);
        CHECK(f->embedding(be.ctx, &w->dec_tok, &tids, &db.x, &err));
        CHECK(f->embedding(be.ctx, &w->dec_pos, &tpos, &pe, &err));
        CHECK(f->add(be.ctx, &db.x, &pe, &db.x, &err));
        for (int l = 0; l < w->dec_layers; l++) {
            const wsp_layer *L = &w->dec[l];
            CHECK(f->layer_norm(be.ctx, &db.x, &L->ln1_w, &L->ln1_b, 1e-5f, &db.h, &err));
            wsp_attn_block(w, &L->self, &db, 1, &dec_kv, l, dec_b, dec_b, true);
            CHECK(f->layer_norm(be.ctx, &db.x, &L->ln2_w, &L->ln2_b, 1e-5f, &db.h, &err));
            wsp_attn_block(w, &L->cross, &db, 1, &ctx_kv, l, NULL, cross_b, false);
            wsp_mlp_block(w, L, &db, 1);
        }
        CHECK(f->layer_norm(be.ctx, &db.x, &w->dec_ln_w, &w->dec_ln_b, 1e-5f, &db.h, &err));
        CHECK(f->linear(be.ctx, &db.h, &w->dec_tok, NULL, &logits, &err));
        CHECK(f->copy_to_host(be.ctx, host, logits.data, sizeof(float) * (size_t)w->vocab, &err));
        const float *want = step == 0 ? first_ref : dec_ref + (size_t)(step - 1) * (size_t)w->vocab;
        float e = row_err(host, want, w->vocab);
        if (step == 0)
            first_err = e;
        else
            dec_err = fmaxf(dec_err, e);
        commit_step(&pg, s, 1, span, 0);
        if (step == n_new)
            break;
        id = ms_sampler_argmax(host, w->vocab);
        if (id != greedy[step])
            fail_msg("whisper step %d: id %d, reference %d", step, id, greedy[step]);
    }
    printf("fixture hf/whisper_tiny         encoder %d frames -> %d positions: max abs error "
           "encoder %.3g, first logits %.3g, decode %.3g; %lld greedy ids equal\n",
           (int)frames_in, T, (double)enc_err, (double)first_err, (double)dec_err,
           (long long)n_new);
    if (!(enc_err < TOL && first_err < TOL && dec_err < TOL))
        fail_msg("whisper: max abs error encoder %g first %g decode %g", (double)enc_err,
                 (double)first_err, (double)dec_err);
    ms_free(host), ms_free(sp), ms_free(ctx_sp);
    ms_free(feat), ms_free(enc_ref), ms_free(first_ref), ms_free(dec_ref), ms_free(start);
    ms_free(greedy);
    ref_close(&rf);
    f->attn_batch_free(be.ctx, enc_b);
    f->attn_batch_free(be.ctx, ctx_b);
    f->attn_batch_free(be.ctx, cross_b);
    f->attn_batch_free(be.ctx, dec_b);
    model_free(&w->m);
    ms_free(w);
    ms_backend_free(&be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_llama_gqa),
        ms_unit_test(test_mistral_window),
        ms_unit_test(test_llama31_rope),
        ms_unit_test(test_llama31_rope_legacy),
        ms_unit_test(test_qwen3),
        ms_unit_test(test_llama2c_aidreams_golden),
        ms_unit_test(test_qwen2vl_mrope),
        ms_unit_test(test_llama_cfg),
        ms_unit_test(test_whisper_tiny),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
