/*
 * fixture_forward.h - the hand-composed causal-LM forward through the op interface (backend.h)
 * and its fixture drivers, shared by test_llama_cpu_fixture.c (the CPU backend against the
 * Hugging Face references) and test_llama_cuda_fixture.c (the CUDA backend against the references
 * and against the CPU backend), so both run one forward. Header-only for tests: every function
 * is static; include it once per test file after ms_test.h (the includer also includes
 * ms_test_impl.h once).
 *
 * What it composes is what the generated forward does (DESIGN.md section 5 forward): weights
 * loaded through the loaders (checkpoint.h) into backend buffers in a chosen dtype (f32 for the
 * CPU oracle, bf16 as the CUDA backend keeps them) with Q/K/V and gate/up concatenated, biases
 * f32; a page table and the FlashInfer index arrays built here; ops called through the vtable.
 * Variants: GQA, sliding window with released pages, llama3 / linear RoPE scaling, interleaved
 * RoPE (llama2.c), Qwen3's per-head q/k RMSNorm, Qwen2's q/k/v biases, Qwen2-VL's M-RoPE over
 * explicit t/h/w position streams.
 *
 * Drivers (each fills a result; the includer decides what passes):
 *   run_batch      prompts of reference.safetensors as one ragged batch (prefill + greedy decode);
 *   greedy_batch   greedy generation without reference logits (llama2.c golden runs);
 *   run_mrope      Qwen2-VL prefill over explicit position streams;
 *   run_cfg        classifier-free guidance: cond and uncond streams of one request per step.
 * Errors are measured both as max abs (the CPU test's 1e-3) and as the worst row's relative
 * error ||got - ref|| / ||ref|| (the CUDA test's 2e-2); rows after a sequence's ids left the
 * reference's are not compared (the reference describes another sequence from there).
 */
#ifndef MS_TEST_FIXTURE_FORWARD_H
#define MS_TEST_FIXTURE_FORWARD_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "checkpoint.h"
#include "hf_config.h"

#define MAX_LAYERS 8
#define MAX_SEQS 4
#define MAX_PAGES_PER_SEQ 256

/* Run a call that fills the `err` in scope; fail the test with its message. */
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
    ms_dtype wdt;    /* weights (biases stay f32): f32 for the CPU oracle, bf16 as on CUDA */
    ms_dtype kvdt;   /* KV arena, the same as wdt */
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

/* A weight in the model's dtype (m->wdt; a zeroed model: f32). */
static ms_tensor new_weight(model *m, const ms_ckpt *ck, const char *name, int64_t n0, int64_t n1) {
    size_t es = ms_dtype_size(m->wdt);
    ms_tensor t = n1 ? ms_tensor_2d(model_alloc(m, (size_t)(n0 * n1) * es, name), m->wdt, n0, n1)
                     : ms_tensor_1d(model_alloc(m, (size_t)n0 * es, name), m->wdt, n0);
    load_into(m, ck, name, n0, n1, &t);
    return t;
}

/* Load the checkpoint at dir (a Hugging Face folder or a llama2.c .bin) with weights and KV in
 * wdt (f32, bf16 or f16). */
static void model_load(model *m, const ms_backend *be, const char *dir, ms_dtype wdt) {
    ms_error err = {0};
    memset(m, 0, sizeof *m);
    m->be = be;
    m->wdt = wdt;
    m->kvdt = wdt;
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
        w->wqkv = ms_tensor_2d(model_alloc(m, (size_t)((qd + 2 * kd) * m->hidden) *
                                                  ms_dtype_size(m->wdt), "wqkv"),
                               m->wdt, qd + 2 * kd, m->hidden);
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
        w->wgu = ms_tensor_2d(model_alloc(m, (size_t)(2 * m->ff * m->hidden) * ms_dtype_size(m->wdt),
                                          "wgu"),
                              m->wdt, 2 * m->ff, m->hidden);
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
    m->kv = (ms_paged_kv){NULL, m->kvdt, m->n_layers, n_pages, page_size, m->hkv, m->d};
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
    /* the staged batch's attention plan, once per step as the engine makes it */
    if (f->attn_batch_plan != NULL)
        CHECK(f->attn_batch_plan(c, m->batch, &m->kv, m->hq, &ap, &err));

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

/* Errors of the rows compared: prefill rows always, decode rows while the sequence's ids so far
 * equal the reference's. */
typedef struct run_result {
    float err_prefill, err_decode; /* max abs */
    float rel_prefill, rel_decode; /* worst row's ||got - ref|| / ||ref|| */
    int32_t ids[MAX_SEQS][64];
    int min_start_seen;            /* largest kv_start seen (retention happened when > 0) */
    bool same[MAX_SEQS];           /* ids so far equal the reference's */
} run_result;

/* max |a - b| over n values (INFINITY when a holds NaN). */
static float row_abs_err(const float *a, const float *b, int n) {
    float m = 0.0f;
    for (int i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m))
            m = isnan(d) ? INFINITY : d;
    }
    return m;
}

/* ||a - b|| / ||b|| over one row (INFINITY when a holds NaN or inf). */
static float row_rel_err(const float *a, const float *b, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(a[i]) || isinf(a[i]))
            return INFINITY;
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return (float)(den > 0 ? sqrt(num / den) : sqrt(num));
}

/* Fold one compared row into a pair of worst errors. */
static void note_row(const float *got, const float *want, int n, float *abs_err, float *rel_err) {
    *abs_err = fmaxf(*abs_err, row_abs_err(got, want, n));
    *rel_err = fmaxf(*rel_err, row_rel_err(got, want, n));
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
    for (int i = 0; i < MAX_SEQS; i++)
        res->same[i] = true;
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
                for (int j = 0; j < p->len; j++)
                    note_row(host_logits + (size_t)(row + j) * (size_t)m->vocab,
                             p->prefill + (size_t)j * (size_t)m->vocab, m->vocab,
                             &res->err_prefill, &res->rel_prefill);
            } else if (res->same[i]) {
                note_row(host_logits + (size_t)row * (size_t)m->vocab,
                         p->decode + (size_t)(step - 1) * (size_t)m->vocab, m->vocab,
                         &res->err_decode, &res->rel_decode);
            }
            row += span[i];
            res->ids[i][step] = next[i];
            if (next[i] != p->greedy[step])
                res->same[i] = false; /* later reference logits describe another sequence */
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
        for (int i = 0; i < n; i++)
            if (res->same[i])
                note_row(host_logits + (size_t)i * (size_t)m->vocab,
                         pr[which[i]].decode + (size_t)(n_new - 1) * (size_t)m->vocab, m->vocab,
                         &res->err_decode, &res->rel_decode);
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

/* ---- greedy generation without reference logits (llama2.c golden runs) ---- */

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

/* ---- Qwen2-VL text path: M-RoPE with explicit t/h/w position streams ---- */

/* One prompt's prefill (no decode in the fixture). */
typedef struct mrope_result {
    int64_t n_tokens;
    int32_t sections[3];
    float err, rel; /* max abs over all logits; worst row's relative error */
} mrope_result;

/* Prefill hf/qwen2vl_mrope's prompt over its explicit position streams on `be` with weights and
 * KV in wdt, against the reference logits of every position. */
static void run_mrope(const ms_backend *be, ms_dtype wdt, mrope_result *res) {
    ms_error err = {0};
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", ms_test_fixture("hf/qwen2vl_mrope"));
    memset(res, 0, sizeof *res);
    model m;
    model_load(&m, be, dir, wdt);
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
    assert_int_equal(rl, n);
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
    const ms_backend_i *f = &be->iface;
    CHECK(f->copy_to_backend(be->ctx, m.ids, ids, (size_t)n * 4, &err));
    /* explicit positions (the attention mask still uses the KV positions 0 .. n - 1) */
    CHECK(f->copy_to_backend(be->ctx, m.pos, thw, (size_t)(3 * n) * 4, &err));
    CHECK(f->attn_batch_stage(be->ctx, m.batch, &sp->plan, &m.kv, &err));
    model_forward(&m, (int)n);
    float *got = ms_malloc(sizeof(float) * (size_t)(n * m.vocab));
    assert_non_null(got);
    CHECK(f->copy_to_host(be->ctx, got, m.logits, sizeof(float) * (size_t)(n * m.vocab), &err));
    for (int64_t r = 0; r < n; r++)
        note_row(got + (size_t)r * (size_t)m.vocab, want + (size_t)r * (size_t)m.vocab, m.vocab,
                 &res->err, &res->rel);
    res->n_tokens = n;
    for (int k = 0; k < 3; k++)
        res->sections[k] = m.rope.sections[k];
    ms_free(got), ms_free(sp), ms_free(ids), ms_free(thw), ms_free(want);
    ref_close(&rf);
    model_free(&m);
}

/* ---- classifier-free guidance: cond and uncond streams of one request in one batch ---- */

#define CFG_MAX_NEW 64

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

/* Guided generation of hf/llama_cfg: its own guided ids, compared with the reference's. */
typedef struct cfg_result {
    int64_t n_cond, n_uncond, n_new;
    int32_t ids[CFG_MAX_NEW]; /* guided id of every step */
    int64_t same;             /* leading steps whose ids equal the reference's */
    float err, rel;           /* mixed log-probs of the steps fed only reference ids */
} cfg_result;

/* Each step runs the cond and uncond streams as one ragged batch (prefill, then one token each),
 * mixes mixed = lu + scale (lc - lu) of their log-softmaxes on the host and feeds the argmax to
 * both streams. Weights and KV in wdt, pages of page_size tokens. */
static void run_cfg(const ms_backend *be, ms_dtype wdt, int page_size, cfg_result *res) {
    ms_error err = {0};
    char dir[1024], path[2048];
    snprintf(dir, sizeof dir, "%s", ms_test_fixture("hf/llama_cfg"));
    snprintf(path, sizeof path, "%s/reference.safetensors", dir);
    memset(res, 0, sizeof *res);
    model m;
    model_load(&m, be, dir, wdt);
    ref_file rf;
    ref_open(&rf, path);
    int64_t nc, nu, n_new, c, vr;
    int32_t *cond = ref_get(&rf, "cond_ids", "I32", &nc, &c);
    int32_t *uncond = ref_get(&rf, "uncond_ids", "I32", &nu, &c);
    int32_t *greedy = ref_get(&rf, "greedy_ids", "I32", &n_new, &c);
    float *mixed_ref = ref_get(&rf, "mixed_logprobs", "F32", &vr, &c);
    assert_int_equal(vr, n_new);
    assert_int_equal(c, m.vocab);
    assert_true(n_new <= CFG_MAX_NEW && nc + nu <= 64);
    const double scale = 3.0; /* reference.json guidance_scale */
    int ps = page_size;
    model_plan(&m, (int)(nc + nu), 2 * (int)((nc + n_new) / ps + 2) + 2, ps);
    pager pg;
    seq s[2];
    memset(s, 0, sizeof s);
    pager_init(&pg, m.kv.n_pages, ps);
    step_plan *sp = ms_calloc(1, sizeof *sp);
    double *lc = ms_malloc(sizeof(double) * (size_t)m.vocab), *lu = ms_malloc(sizeof(double) * (size_t)m.vocab);
    double *mixed = ms_malloc(sizeof(double) * (size_t)m.vocab);
    float *last = ms_malloc(sizeof(float) * 2 * (size_t)m.vocab);
    float *mixed_f = ms_malloc(sizeof(float) * (size_t)m.vocab);
    assert_true(sp != NULL && lc != NULL && lu != NULL && mixed != NULL && last != NULL &&
                mixed_f != NULL);
    int32_t host_ids[64];
    int32_t id = -1;
    bool same = true;
    const ms_backend_i *f = &be->iface;
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
        CHECK(f->copy_to_backend(be->ctx, m.ids, host_ids, (size_t)tok * 4, &err));
        CHECK(f->copy_to_backend(be->ctx, m.pos, sp->pos, (size_t)tok * 4, &err));
        CHECK(f->attn_batch_stage(be->ctx, m.batch, &sp->plan, &m.kv, &err));
        model_forward(&m, tok);
        CHECK(f->copy_to_host(be->ctx, last, m.last_logits, sizeof(float) * 2 * (size_t)m.vocab, &err));
        log_softmax(last, m.vocab, lc);
        log_softmax(last + m.vocab, m.vocab, lu);
        double best = -INFINITY;
        for (int i = 0; i < m.vocab; i++) {
            mixed[i] = lu[i] + scale * (lc[i] - lu[i]);
            mixed_f[i] = (float)mixed[i];
            if (mixed[i] > best) {
                best = mixed[i];
                id = i;
            }
        }
        if (same) /* this step was fed only the reference's ids */
            note_row(mixed_f, mixed_ref + (size_t)step * (size_t)m.vocab, m.vocab, &res->err,
                     &res->rel);
        res->ids[step] = id;
        if (same && id == greedy[step])
            res->same = step + 1;
        else
            same = false;
        commit_step(&pg, s, 2, span, 0);
    }
    res->n_cond = nc;
    res->n_uncond = nu;
    res->n_new = n_new;
    ms_free(sp), ms_free(lc), ms_free(lu), ms_free(mixed), ms_free(last), ms_free(mixed_f);
    ms_free(cond), ms_free(uncond), ms_free(greedy), ms_free(mixed_ref);
    ref_close(&rf);
    model_free(&m);
}

#endif /* MS_TEST_FIXTURE_FORWARD_H */
