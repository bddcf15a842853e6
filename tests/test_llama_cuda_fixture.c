/*
 * test_llama_cuda_fixture.c - the Llama forward of test_llama_cpu_fixture.c (copied: a test file
 * has one main) on the CUDA backend, with bf16 weights and KV, against Hugging Face's reference
 * logits and against the CPU backend's greedy ids (GPU_TESTS: `make gpu-test`).
 *
 * Acceptance (issue 5): prefill and decode logits within 2e-2 relative error (||gpu - ref|| /
 * ||ref|| per row, worst row) of the float32 reference, and greedy ids equal to the CPU
 * backend's for at least the first 16 generated tokens; the CPU backend runs over the same bf16
 * weights and KV (with float32 weights, llama_gqa prompt 1 parts at step 10 on a near tie that
 * bf16 weight rounding alone flips, device run of 2026-11-29). Decode rows are compared with the
 * reference only while the GPU's ids still equal the reference's (after a divergence the
 * reference logits describe another sequence). Fixtures: llama_gqa (GQA 4, head_dim 16, ragged
 * batch of 37/5/64/1 tokens), mistral_window (window 8 with released pages), llama31_rope (llama3
 * scaling, tied embeddings), each with page size 16. Qwen3's per-head q/k norm over QKV views and
 * llama2.c are not run on CUDA yet (see backend_cuda.h limits).
 */
#include "ms_test.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backend_cuda.h"
#include "checkpoint.h"
#include "hf_config.h"
#include "ms_test_impl.h"

#define MAX_LAYERS 8
#define MAX_SEQS 4
#define MAX_PAGES_PER_SEQ 256
#define TOL 2e-2f  /* relative, bf16 weights and KV */
#define SAME_IDS 16 /* generated ids that must equal the CPU backend's */

#define CHECK(expr)                                                                    \
    do {                                                                               \
        ms_status st_ = (expr);                                                        \
        if (st_ != MS_OK)                                                              \
            fail_msg("%s failed: %s (%s)", #expr, err.msg, ms_status_str(st_));        \
    } while (0)

/* ---- reference.safetensors (minimal reader: whole file in memory, jansson header) ---- */

typedef struct ref_file {
    char *buf;
    size_t size;
    json_t *hdr;
    size_t data0; /* offset of the data region */
} ref_file;

static void ref_open(ref_file *r, const char *path) {
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    r->size = (size_t)n;
    r->buf = ms_malloc(r->size);
    assert_non_null(r->buf);
    assert_int_equal(fread(r->buf, 1, r->size, f), r->size);
    fclose(f);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--)
        hl = (hl << 8) | (uint8_t)r->buf[i];
    assert_true(hl + 8 <= r->size);
    json_error_t je;
    r->hdr = json_loadb(r->buf + 8, (size_t)hl, 0, &je);
    if (r->hdr == NULL)
        fail_msg("%s: header: %s", path, je.text);
    r->data0 = 8 + (size_t)hl;
}

static void ref_close(ref_file *r) {
    json_decref(r->hdr);
    ms_free(r->buf);
}

/* Copy tensor `name` (dtype F32 or I32, 4 bytes each) into a fresh buffer; *n = element count,
 * rows/cols = shape (cols 1 for 1-D). */
static void *ref_get(const ref_file *r, const char *name, const char *dtype, int64_t *rows,
                     int64_t *cols) {
    json_t *t = json_object_get(r->hdr, name);
    if (t == NULL)
        fail_msg("reference tensor %s missing", name);
    assert_string_equal(json_string_value(json_object_get(t, "dtype")), dtype);
    json_t *shape = json_object_get(t, "shape"), *off = json_object_get(t, "data_offsets");
    *rows = json_integer_value(json_array_get(shape, 0));
    *cols = json_array_size(shape) > 1 ? json_integer_value(json_array_get(shape, 1)) : 1;
    size_t b = (size_t)json_integer_value(json_array_get(off, 0));
    size_t e = (size_t)json_integer_value(json_array_get(off, 1));
    assert_int_equal(e - b, (size_t)(*rows * *cols) * 4);
    assert_true(r->data0 + e <= r->size);
    void *out = ms_malloc(e - b);
    assert_non_null(out);
    memcpy(out, r->buf + r->data0 + b, e - b);
    return out;
}

/* ---- the model ---- */

typedef struct layer_w {
    ms_tensor attn_norm, wqkv, wo, mlp_norm, wgu, wdown, q_norm, k_norm;
    ms_tensor bqkv; /* [q + k + v] fused bias (Qwen2), data NULL when the model has none */
} layer_w;

typedef struct model {
    const ms_backend *be;
    ms_dtype wdt;  /* weights (bf16 on both backends in check_fixture) */
    ms_dtype kvdt; /* KV arena (same as wdt) */
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
    size_t es = ms_dtype_size(m->wdt);
    ms_tensor t = n1 ? ms_tensor_2d(model_alloc(m, (size_t)(n0 * n1) * es, name), m->wdt, n0, n1)
                     : ms_tensor_1d(model_alloc(m, (size_t)n0 * es, name), m->wdt, n0);
    load_into(m, ck, name, n0, n1, &t);
    return t;
}

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
    ms_rope_config rc = {style, m->d, (int32_t)lround(m->d * rp.partial_rotary_factor),
                         rp.theta, MS_ROPE_SCALING_NONE, rp.factor, rp.low_freq_factor,
                         rp.high_freq_factor, (double)rp.original_max_position_embeddings};
    if (rp.type == MS_ROPE_TYPE_LLAMA3)
        rc.scaling = MS_ROPE_SCALING_LLAMA3;
    else if (rp.type == MS_ROPE_TYPE_LINEAR)
        rc.scaling = MS_ROPE_SCALING_LINEAR;
    else
        assert_int_equal(rp.type, MS_ROPE_TYPE_DEFAULT);
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
    float err_prefill, err_decode; /* worst row relative error (decode: rows before divergence) */
    int32_t ids[MAX_SEQS][64];
    int min_start_seen;            /* largest kv_start seen (retention happened when > 0) */
    bool same[MAX_SEQS];           /* ids so far equal the reference's */
} run_result;

/* ||a - b|| / ||b|| over one row (INFINITY when a holds NaN). */
static float row_err(const float *a, const float *b, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; i++) {
        if (isnan(a[i]) || isinf(a[i]))
            return INFINITY;
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return (float)(den > 0 ? sqrt(num / den) : sqrt(num));
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
                for (int j = 0; j < p->len; j++) {
                    float e = row_err(host_logits + (size_t)(row + j) * (size_t)m->vocab,
                                      p->prefill + (size_t)j * (size_t)m->vocab, m->vocab);
                    res->err_prefill = fmaxf(res->err_prefill, e);
                }
            } else if (res->same[i]) {
                float e = row_err(host_logits + (size_t)row * (size_t)m->vocab,
                                  p->decode + (size_t)(step - 1) * (size_t)m->vocab, m->vocab);
                res->err_decode = fmaxf(res->err_decode, e);
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
        for (int i = 0; i < n; i++) {
            if (!res->same[i])
                continue;
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
        if (json_object_get(rf->hdr, name) == NULL)
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

/* One fixture: the CPU backend and the CUDA backend, both over bf16 weights and KV, run all
 * prompts as one ragged batch with page size 16; the GPU's logits against the float32 reference,
 * its ids against the CPU backend's on the same rounded parameters. */
static void check_fixture(const char *rel) {
    ms_error err = {0};
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", ms_test_fixture(rel));
    prompt_ref pr[MAX_SEQS];
    ref_file rf;
    memset(pr, 0, sizeof pr);
    int np = load_prompts(dir, pr, &rf);
    assert_true(np >= 1);
    int total = 0, most = 0;
    for (int i = 0; i < np; i++)
        total += (int)pr[i].len, most = MS_MAX(most, (int)(pr[i].len + pr[i].n_new));
    const int ps = 16, all[MAX_SEQS] = {0, 1, 2, 3};
    run_result *r = ms_calloc(2, sizeof *r);
    assert_non_null(r);
    for (int which = 0; which < 2; which++) {
        ms_backend be;
        if (which == 0) {
            CHECK(ms_backend_cpu_init(&be, &(ms_backend_cpu_options){2}, &err));
        } else {
            const char *c = getenv("MS_KERNEL_CACHE_TEST");
            ms_backend_cuda_options o = {0, c != NULL && c[0] ? c : "build/kernel-cache-test"};
            CHECK(ms_backend_cuda_init(&be, &o, &err));
        }
        model m;
        /* both backends hold the same bf16 weights and KV, so their greedy ids can only part
           where activation rounding (bf16 GEMM inputs on CUDA) flips a near tie */
        model_load(&m, &be, dir, MS_DTYPE_BF16);
        model_plan(&m, MS_MAX(total, np), np * (most / ps + 2) + 2, ps);
        run_batch(&m, pr, all, np, ps, &r[which]);
        model_free(&m);
        ms_backend_free(&be);
    }
    int n_same = 0;
    for (int i = 0; i < np; i++) {
        int k = 0;
        while (k < pr[i].n_new && r[1].ids[i][k] == r[0].ids[i][k])
            k++;
        if (k < MS_MIN(SAME_IDS, (int)pr[i].n_new))
            fail_msg("%s prompt %d: GPU id %d at step %d, CPU backend %d", rel, i, r[1].ids[i][k],
                     k, r[0].ids[i][k]);
        n_same = i == 0 ? k : MS_MIN(n_same, k);
    }
    printf("fixture %-18s %d prompt(s), page size 16: GPU relative error prefill %.2e, decode "
           "%.2e (tol %.0e); GPU ids equal the CPU backend's for the first %d+ steps\n",
           rel, np, (double)r[1].err_prefill, (double)r[1].err_decode, (double)TOL, n_same);
    if (!(r[1].err_prefill < TOL && r[1].err_decode < TOL))
        fail_msg("%s: relative error prefill %g decode %g (tolerance %g)", rel,
                 (double)r[1].err_prefill, (double)r[1].err_decode, (double)TOL);
    ms_free(r);
    free_prompts(pr, np, &rf);
}

static void test_llama_gqa(void **state) {
    (void)state;
    check_fixture("hf/llama_gqa");
}

static void test_mistral_window(void **state) {
    (void)state;
    check_fixture("hf/mistral_window");
}

static void test_llama31_rope(void **state) {
    (void)state;
    check_fixture("hf/llama31_rope");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_llama_gqa),
        ms_unit_test(test_mistral_window),
        ms_unit_test(test_llama31_rope),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
