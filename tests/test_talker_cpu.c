/*
 * test_talker_cpu.c - the talker + code predictor of hf/talker_codepred (reference.json "what":
 * the structure of Qwen3-TTS / Qwen3-Omni's talker) composed by hand through the op interface
 * (backend.h) on the CPU backend in float32, with the code predictor's cache on the scratch KV
 * (runtime/resources/scratch.h, ms_scratch_kv: keyed by batch row, emptied when a frame begins,
 * one stable buffer), as test_llama_cpu_fixture.c composes Llama. It is the oracle the compiled
 * model (models/talker.mstar, not written yet) must match, and it checks the scratch KV on the
 * fixture's real weights:
 *   - from prompt_codes [5, 4], 12 frames generated greedily equal the reference codes [12, 4]
 *     exactly; talker_logits [12, 96] and predictor_logits [12, 3, 96] within 1e-3;
 *   - four requests with different prompts (the fixture's, its codes shifted, its frames
 *     reversed, its codebooks permuted and shifted) in one batch give each request's codes and
 *     logits of its run alone;
 *   - the scratch KV's buffer never moves over the run;
 *   - select_rows, the op the compiled predictor builds its input with (models/talker.mstar's
 *     `code.first`: in_proj(h) at a frame's slot 0, a code's embedding elsewhere), takes each
 *     row from a or b by its key, in place too, and refuses mismatched shapes and a float key.
 * Per frame t, for every batch row at once: the talker runs one position over the frame
 * embedding (embed_tokens(c0) + sum_j codebook_embeds[j-1](c_j); the prompt's positions all at
 * once), its final hidden state h gives c0 = argmax(lm_head(h)); the predictor begins a frame on
 * the scratch over [in_proj(h), embeds[0](c0)] at positions 0, 1 and takes c1 from heads[0] of
 * its last row, then feeds embeds[j-1](c_{j-1}) at position j for c_j from heads[j-1]. The
 * talker's own cache is a second ms_scratch_kv spanning the whole request (one "frame" of
 * prompt + 12 positions): a stand-in for the KV pool the compiled model will use. The
 * predictor's cache is driven through a step runner (ms_scratch_kv_build: admit, plan, commit;
 * segment i = batch row i, the record saying whether a frame begins), as a node's resource.
 */
#include "ms_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "checkpoint.h"
#include "device.h"
#include "fixture_ref.h"
#include "ms_test_impl.h"
#include "scratch.h"
#include "step_runner.h"

#define CHECK(expr)                                                                    \
    do {                                                                               \
        ms_status st_ = (expr);                                                        \
        if (st_ != MS_OK)                                                              \
            fail_msg("%s: %s", #expr, err.msg);                                        \
    } while (0)

enum { G = 4, P = 5, F = 12, V = 96, B_MAX = 4, T_MAX = B_MAX * P };

typedef struct layer {
    ms_tensor in_norm, wq, wk, wv, wo, post_norm, wg, wu, wd;
} layer;

/* One Llama decoder (no embedding, no head): its weights, RoPE table and cache. */
typedef struct dec {
    int H, L, hq, hkv, d, ff;
    float eps;
    layer l[2];
    ms_tensor norm;
    float inv[32];
    ms_rope_table rope;
    ms_scratch_kv *cache;
    ms_step_runner *runner; /* the predictor: its cache through the step runner, as a node's */
    ms_paged_kv kv;
    ms_attn_batch *batch;
    /* step buffers [T_MAX, ...] */
    float *h, *q, *k, *v, *att, *t, *g, *u;
} dec;

typedef struct world {
    ms_backend be;
    ms_device *dev;
    ms_ckpt *ck;
    dec talker, cp;
    ms_tensor embed, lm_head, cb[G - 1], in_proj, cp_embeds[G - 1], heads[G - 1];
} world;

static ms_tensor weight(world *w, const char *name, int64_t n0, int64_t n1) {
    ms_error err = {0};
    int64_t shape[2] = {n0, n1};
    const ms_st_tensor *t;
    CHECK(ms_ckpt_expect_tensor(w->ck, name, MS_ST_DTYPES_FLOAT, n1 ? 2 : 1, shape, &t, &err));
    assert_int_equal(t->dtype, MS_ST_DTYPE_F32);
    return n1 ? ms_tensor_2d((void *)t->data, MS_DTYPE_F32, n0, n1)
              : ms_tensor_1d((void *)t->data, MS_DTYPE_F32, n0);
}

static float *buf(int64_t n) {
    float *p = ms_calloc((size_t)n, sizeof(float));
    assert_non_null(p);
    return p;
}

/* Load decoder `prefix` ("talker.model" / "code_predictor") with its cache of `positions`. */
static void dec_init(world *w, dec *m, const char *prefix, int H, int hq, int hkv, int ff,
                     int positions, bool runner) {
    ms_error err = {0};
    *m = (dec){.H = H, .L = 2, .hq = hq, .hkv = hkv, .d = 16, .ff = ff, .eps = 1e-6f};
    char name[160];
    for (int i = 0; i < m->L; i++) {
        layer *l = &m->l[i];
#define W(field, fmt, n0, n1) \
    (snprintf(name, sizeof name, "%s.layers.%d." fmt, prefix, i), l->field = weight(w, name, n0, n1))
        W(in_norm, "input_layernorm.weight", H, 0);
        W(wq, "self_attn.q_proj.weight", hq * 16, H);
        W(wk, "self_attn.k_proj.weight", hkv * 16, H);
        W(wv, "self_attn.v_proj.weight", hkv * 16, H);
        W(wo, "self_attn.o_proj.weight", H, hq * 16);
        W(post_norm, "post_attention_layernorm.weight", H, 0);
        W(wg, "mlp.gate_proj.weight", ff, H);
        W(wu, "mlp.up_proj.weight", ff, H);
        W(wd, "mlp.down_proj.weight", H, ff);
#undef W
    }
    snprintf(name, sizeof name, "%s.norm.weight", prefix);
    m->norm = weight(w, name, H, 0);
    /* HF default RoPE (rope_theta 10000): inv_freq[i] = theta^(-2i / d), rotate-half */
    for (int i = 0; i < m->d / 2; i++)
        m->inv[i] = (float)(1.0 / pow(10000.0, (double)(2 * i) / m->d));
    m->rope = (ms_rope_table){.style = MS_ROPE_ROTATE_HALF, .rotary_dim = m->d,
                              .inv_freq = m->inv, .attention_scaling = 1.0f};
    ms_scratch_kv_config sc = {w->dev, B_MAX, m->L, positions, hkv, m->d, sizeof(float)};
    if (runner) {
        ms_resource_spec spec = {"code_predictor", MS_RESOURCE_SCRATCH, NULL, 0,
                                 ms_scratch_kv_build, &sc, NULL, NULL};
        CHECK(ms_step_runner_init(&m->runner, &spec, 1, &err));
        m->cache = ms_step_runner_resource(m->runner, 0);
    } else {
        CHECK(ms_scratch_kv_init(&m->cache, &sc, &err));
    }
    m->kv = (ms_paged_kv){ms_scratch_kv_data(m->cache), MS_DTYPE_F32, m->L,
                          ms_scratch_kv_pages(m->cache), positions, hkv, m->d};
    assert_int_equal(ms_paged_kv_bytes(&m->kv), ms_scratch_kv_bytes(m->cache));
    ms_attn_limits lim = {B_MAX, T_MAX, B_MAX};
    CHECK(w->be.iface.attn_batch_init(w->be.ctx, &lim, &m->batch, &err));
    m->h = buf(T_MAX * H);
    m->q = buf(T_MAX * hq * 16);
    m->k = buf(T_MAX * hkv * 16);
    m->v = buf(T_MAX * hkv * 16);
    m->att = buf(T_MAX * hq * 16);
    m->t = buf(T_MAX * H);
    m->g = buf(T_MAX * ff);
    m->u = buf(T_MAX * ff);
}

static void dec_free(world *w, dec *m) {
    w->be.iface.attn_batch_free(w->be.ctx, m->batch);
    if (m->runner != NULL)
        ms_step_runner_free(m->runner); /* frees the cache */
    else
        ms_scratch_kv_free(m->cache);
    float *bufs[] = {m->h, m->q, m->k, m->v, m->att, m->t, m->g, m->u};
    for (size_t i = 0; i < MS_ARRAY_LEN(bufs); i++)
        ms_free(bufs[i]);
}

/*
 * One step: plan `rows` on the decoder's cache, stage it, run the layers over x [n, H] (the
 * step's input rows, packed by row; overwritten with the residual stream) at positions pos [n],
 * and write the final-normed last row of every batch row into out [n_rows, H]; commit.
 */
static void dec_step(world *w, dec *m, const ms_scratch_kv_row *rows, int32_t n_rows, float *x,
                     const int32_t *pos, int32_t n, float *out) {
    ms_error err = {0};
    const ms_backend_i *f = &w->be.iface;
    void *c = w->be.ctx;
    ms_kv_plan own;
    const ms_kv_plan *plan = &own;
    ms_segment segs[B_MAX];
    ms_rid rids[B_MAX];
    static const ms_scratch_kv_step begin = {true}, cont = {false};
    ms_step step = {.name = "code_predictor", .segments = segs, .n_segments = n_rows};
    ms_step_ctx ctx = {.request_ids = rids, .n_rows = n_rows, .n_real = n_rows};
    if (m->runner != NULL) { /* segment i is batch row i; the record says a frame begins */
        for (int32_t i = 0; i < n_rows; i++) {
            assert_int_equal(rows[i].row, i);
            segs[i] = (ms_segment){rows[i].rid, 0, rows[i].span};
            rids[i] = rows[i].rid;
            CHECK(ms_step_runner_ingest(m->runner, rows[i].rid, NULL, &err));
        }
        step.records[0].rec = rows[0].begin_frame ? &begin : &cont;
        assert_int_equal(ms_step_runner_admit(m->runner, &step, &ctx).code, MS_ADMIT_OK);
        CHECK(ms_step_runner_plan(m->runner, &step, &ctx, &err));
        plan = ctx.plan_results[0];
    } else {
        CHECK(ms_scratch_kv_plan(m->cache, rows, n_rows, &own, &err));
    }
    assert_int_equal(plan->n_tokens, n);
    CHECK(f->attn_batch_stage(c, m->batch, plan, &m->kv, &err));
    const int qd = m->hq * m->d, kd = m->hkv * m->d;
    ms_tensor tx = ms_tensor_2d(x, MS_DTYPE_F32, n, m->H);
    ms_tensor th = ms_tensor_2d(m->h, MS_DTYPE_F32, n, m->H);
    ms_tensor tt = ms_tensor_2d(m->t, MS_DTYPE_F32, n, m->H);
    ms_tensor q2 = ms_tensor_2d(m->q, MS_DTYPE_F32, n, qd);
    ms_tensor k2 = ms_tensor_2d(m->k, MS_DTYPE_F32, n, kd);
    ms_tensor v2 = ms_tensor_2d(m->v, MS_DTYPE_F32, n, kd);
    ms_tensor q3 = ms_tensor_split_heads(&q2, m->hq, m->d);
    ms_tensor k3 = ms_tensor_split_heads(&k2, m->hkv, m->d);
    ms_tensor v3 = ms_tensor_split_heads(&v2, m->hkv, m->d);
    ms_tensor a2 = ms_tensor_2d(m->att, MS_DTYPE_F32, n, qd);
    ms_tensor a3 = ms_tensor_split_heads(&a2, m->hq, m->d);
    ms_tensor tg = ms_tensor_2d(m->g, MS_DTYPE_F32, n, m->ff);
    ms_tensor tu = ms_tensor_2d(m->u, MS_DTYPE_F32, n, m->ff);
    ms_tensor tp = ms_tensor_1d((void *)pos, MS_DTYPE_I32, n);
    ms_attn_params ap = {1.0f / sqrtf((float)m->d), 0, true};
    if (f->attn_batch_plan != NULL)
        CHECK(f->attn_batch_plan(c, m->batch, &m->kv, m->hq, &ap, &err));
    for (int i = 0; i < m->L; i++) {
        const layer *l = &m->l[i];
        CHECK(f->rms_norm(c, &tx, &l->in_norm, m->eps, &th, &err));
        CHECK(f->linear(c, &th, &l->wq, NULL, &q2, &err));
        CHECK(f->linear(c, &th, &l->wk, NULL, &k2, &err));
        CHECK(f->linear(c, &th, &l->wv, NULL, &v2, &err));
        CHECK(ms_backend_rope_kv_write(&w->be, &q3, &k3, &v3, &tp, &m->rope, &m->kv, i, m->batch,
                                       &err));
        CHECK(f->attention(c, &q3, &m->kv, i, m->batch, &ap, &a3, &err));
        CHECK(f->linear(c, &a2, &l->wo, NULL, &tt, &err));
        CHECK(f->add(c, &tx, &tt, &tx, &err));
        CHECK(f->rms_norm(c, &tx, &l->post_norm, m->eps, &th, &err));
        CHECK(f->linear(c, &th, &l->wg, NULL, &tg, &err));
        CHECK(f->linear(c, &th, &l->wu, NULL, &tu, &err));
        CHECK(f->silu_mul(c, &tg, &tu, &tg, &err));
        CHECK(f->linear(c, &tg, &l->wd, NULL, &tt, &err));
        CHECK(f->add(c, &tx, &tt, &tx, &err));
    }
    CHECK(f->rms_norm(c, &tx, &m->norm, m->eps, &th, &err));
    ms_tensor last = ms_tensor_1d(m->batch->last_token, MS_DTYPE_I32, n_rows);
    ms_tensor to = ms_tensor_2d(out, MS_DTYPE_F32, n_rows, m->H);
    CHECK(f->gather_rows(c, &th, &last, &to, &err));
    if (m->runner != NULL)
        CHECK(ms_step_runner_commit(m->runner, &step, &ctx, &err));
    else
        CHECK(ms_scratch_kv_commit(m->cache, &err));
}

/* out [n, d] = sum over the tables of table[g](ids[g][t]) (ids g-major [n_tables][n]). */
static void embed_sum(world *w, const ms_tensor *const *tables, int n_tables,
                      int32_t (*ids)[T_MAX], int32_t n, float *out, float *tmp, int d) {
    ms_error err = {0};
    ms_tensor to = ms_tensor_2d(out, MS_DTYPE_F32, n, d), tt = ms_tensor_2d(tmp, MS_DTYPE_F32, n, d);
    for (int g = 0; g < n_tables; g++) {
        ms_tensor ti = ms_tensor_1d(ids[g], MS_DTYPE_I32, n);
        CHECK(w->be.iface.embedding(w->be.ctx, tables[g], &ti, g == 0 ? &to : &tt, &err));
        if (g > 0)
            CHECK(w->be.iface.add(w->be.ctx, &to, &tt, &to, &err));
    }
}

/* logits [n, V] = linear(x [n, d], head); ids[i] = argmax. */
static void head_argmax(world *w, const float *x, int32_t n, int d, const ms_tensor *head,
                        float *logits, int32_t *ids) {
    ms_error err = {0};
    ms_tensor tx = ms_tensor_2d((void *)x, MS_DTYPE_F32, n, d);
    ms_tensor tl = ms_tensor_2d(logits, MS_DTYPE_F32, n, V);
    ms_tensor ti = ms_tensor_1d(ids, MS_DTYPE_I32, n);
    CHECK(w->be.iface.linear(w->be.ctx, &tx, head, NULL, &tl, &err));
    CHECK(w->be.iface.argmax(w->be.ctx, &tl, &ti, &err));
}

typedef struct result {
    int32_t codes[F][G];
    float tlog[F][V];
    float plog[F][G - 1][V];
} result;

static void world_init(world *w) {
    ms_error err = {0};
    memset(w, 0, sizeof *w);
    CHECK(ms_backend_cpu_init(&w->be, &(ms_backend_cpu_options){1}, &err));
    CHECK(ms_device_host_init(0, &w->dev, &err));
    CHECK(ms_ckpt_init(&w->ck, ms_test_fixture("hf/talker_codepred"), &err));
    w->embed = weight(w, "talker.model.embed_tokens.weight", V, 64);
    w->lm_head = weight(w, "talker.lm_head.weight", V, 64);
    w->in_proj = weight(w, "code_predictor.in_proj.weight", 32, 64);
    char name[96];
    for (int j = 0; j < G - 1; j++) {
        snprintf(name, sizeof name, "talker.codebook_embeds.%d.weight", j);
        w->cb[j] = weight(w, name, V, 64);
        snprintf(name, sizeof name, "code_predictor.embeds.%d.weight", j);
        w->cp_embeds[j] = weight(w, name, V, 32);
        snprintf(name, sizeof name, "code_predictor.heads.%d.weight", j);
        w->heads[j] = weight(w, name, V, 32);
    }
    dec_init(w, &w->talker, "talker.model", 64, 4, 2, 160, P + F, false);
    dec_init(w, &w->cp, "code_predictor", 32, 2, 1, 96, G, true);
}

static void world_free(world *w) {
    dec_free(w, &w->talker);
    dec_free(w, &w->cp);
    ms_ckpt_free(w->ck);
    ms_device_free(w->dev);
    ms_backend_free(&w->be);
}

/* Generate F frames for n requests (prompts[i] [P][G]) as one batch, request i on batch row i. */
static void generate(world *w, const int32_t (*const *prompts)[G], int32_t n, ms_rid rid0,
                     result *res) {
    ms_error err = {0};
    const ms_tensor *ttables[G] = {&w->embed, &w->cb[0], &w->cb[1], &w->cb[2]};
    static int32_t ids[G][T_MAX], pos[T_MAX], c[G][B_MAX];
    static float x[T_MAX * 64], tmp[T_MAX * 64], h[B_MAX * 64], y[B_MAX * 32], xc[B_MAX * 2 * 32];
    static float logits[B_MAX * V];
    ms_scratch_kv_row rows[B_MAX];
    void *const cp_base = ms_scratch_kv_data(w->cp.cache);
    /* the prompt: P positions of every row, frame embeddings summed over the codebooks */
    int32_t nt = 0;
    for (int32_t r = 0; r < n; r++) {
        rows[r] = (ms_scratch_kv_row){rid0 + (ms_rid)r, r, P, true};
        for (int p = 0; p < P; p++, nt++) {
            for (int g = 0; g < G; g++)
                ids[g][nt] = prompts[r][p][g];
            pos[nt] = p;
        }
    }
    embed_sum(w, ttables, G, ids, nt, x, tmp, 64);
    dec_step(w, &w->talker, rows, n, x, pos, nt, h);
    for (int f = 0; f < F; f++) {
        /* c0 from the talker's last hidden state of each row */
        head_argmax(w, h, n, 64, &w->lm_head, logits, c[0]);
        for (int32_t r = 0; r < n; r++)
            memcpy(res[r].tlog[f], logits + (size_t)r * V, sizeof res[r].tlog[f]);
        /* the predictor begins a frame on the scratch: [in_proj(h), embeds[0](c0)] at 0, 1 */
        ms_tensor th = ms_tensor_2d(h, MS_DTYPE_F32, n, 64);
        ms_tensor pair = ms_tensor_2d(xc, MS_DTYPE_F32, n, 64); /* row r: tokens 2r, 2r + 1 */
        ms_tensor first = ms_tensor_slice(&pair, 1, 0, 32), second = ms_tensor_slice(&pair, 1, 32, 32);
        CHECK(w->be.iface.linear(w->be.ctx, &th, &w->in_proj, NULL, &first, &err));
        ms_tensor tc = ms_tensor_1d(c[0], MS_DTYPE_I32, n);
        CHECK(w->be.iface.embedding(w->be.ctx, &w->cp_embeds[0], &tc, &second, &err));
        for (int32_t r = 0; r < n; r++) {
            rows[r] = (ms_scratch_kv_row){rid0 + (ms_rid)r, r, 2, true};
            pos[2 * r] = 0;
            pos[2 * r + 1] = 1;
        }
        dec_step(w, &w->cp, rows, n, xc, pos, 2 * n, y);
        for (int j = 1; j < G; j++) {
            head_argmax(w, y, n, 32, &w->heads[j - 1], logits, c[j]);
            for (int32_t r = 0; r < n; r++)
                memcpy(res[r].plog[f][j - 1], logits + (size_t)r * V, sizeof res[r].plog[f][0]);
            if (j == G - 1)
                break;
            /* the next code group: embeds[j](c_j) at position j + 1 (reference.json, step 2) */
            ms_tensor tj = ms_tensor_1d(c[j], MS_DTYPE_I32, n);
            ms_tensor tx = ms_tensor_2d(xc, MS_DTYPE_F32, n, 32);
            CHECK(w->be.iface.embedding(w->be.ctx, &w->cp_embeds[j], &tj, &tx, &err));
            for (int32_t r = 0; r < n; r++) {
                rows[r] = (ms_scratch_kv_row){rid0 + (ms_rid)r, r, 1, false};
                pos[r] = j + 1;
            }
            dec_step(w, &w->cp, rows, n, xc, pos, n, y);
        }
        assert_ptr_equal(ms_scratch_kv_data(w->cp.cache), cp_base);
        for (int32_t r = 0; r < n; r++)
            for (int g = 0; g < G; g++)
                res[r].codes[f][g] = c[g][r];
        if (f == F - 1)
            break;
        /* the next talker input: this frame's embeddings summed, one position per row */
        for (int32_t r = 0; r < n; r++) {
            for (int g = 0; g < G; g++)
                ids[g][r] = c[g][r];
            pos[r] = P + f;
            rows[r] = (ms_scratch_kv_row){rid0 + (ms_rid)r, r, 1, false};
        }
        embed_sum(w, ttables, G, ids, n, x, tmp, 64);
        dec_step(w, &w->talker, rows, n, x, pos, n, h);
    }
}

static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m))
            m = isnan(d) ? INFINITY : d;
    }
    return m;
}

static void test_reference_codes_and_logits(void **state) {
    (void)state;
    ms_st_file *rf = ms_test_ref_open("hf/talker_codepred");
    size_t np, nc, nt, npl;
    int32_t *prompt = ms_test_ref_tensor(rf, "prompt_codes", true, &np);
    int32_t *codes = ms_test_ref_tensor(rf, "codes", true, &nc);
    float *tlog = ms_test_ref_tensor(rf, "talker_logits", false, &nt);
    float *plog = ms_test_ref_tensor(rf, "predictor_logits", false, &npl);
    assert_int_equal(np, P * G);
    assert_int_equal(nc, F * G);
    assert_int_equal(nt, F * V);
    assert_int_equal(npl, F * (G - 1) * V);
    world w;
    world_init(&w);
    static result res;
    const int32_t(*pr[1])[G] = {(const int32_t(*)[G])prompt};
    generate(&w, pr, 1, 1, &res);
    double et = max_diff(&res.tlog[0][0], tlog, nt), ep = max_diff(&res.plog[0][0][0], plog, npl);
    int wrong = 0;
    for (size_t i = 0; i < nc; i++)
        wrong += (&res.codes[0][0])[i] != codes[i];
    printf("talker_codepred (CPU f32): %d of %zu codes differ; max |talker_logits| error %.3g, "
           "max |predictor_logits| error %.3g\n", wrong, nc, et, ep);
    assert_int_equal(wrong, 0);
    assert_true(et < 1e-3);
    assert_true(ep < 1e-3);
    world_free(&w);
    ms_free(prompt);
    ms_free(codes);
    ms_free(tlog);
    ms_free(plog);
    ms_st_file_free(rf);
}

static void test_batch_of_four_equals_each_alone(void **state) {
    (void)state;
    ms_st_file *rf = ms_test_ref_open("hf/talker_codepred");
    size_t np;
    int32_t *prompt = ms_test_ref_tensor(rf, "prompt_codes", true, &np);
    static int32_t pr[B_MAX][P][G];
    for (int p = 0; p < P; p++)
        for (int g = 0; g < G; g++) {
            int32_t v = prompt[p * G + g];
            pr[0][p][g] = v;                                   /* the fixture's */
            pr[1][p][g] = (v + 17) % V;                        /* shifted */
            pr[2][P - 1 - p][g] = v;                           /* frames reversed */
            pr[3][p][(g + 1) % G] = (v + 41) % V;              /* codebooks permuted, shifted */
        }
    world w;
    world_init(&w);
    static result alone[B_MAX], batch[B_MAX];
    for (int i = 0; i < B_MAX; i++) {
        const int32_t(*one[1])[G] = {(const int32_t(*)[G])pr[i]};
        generate(&w, one, 1, (ms_rid)(10 + i), &alone[i]);
    }
    const int32_t(*all[B_MAX])[G] = {(const int32_t(*)[G])pr[0], (const int32_t(*)[G])pr[1],
                                     (const int32_t(*)[G])pr[2], (const int32_t(*)[G])pr[3]};
    generate(&w, all, B_MAX, 20, batch);
    int distinct = 0;
    for (int i = 0; i < B_MAX; i++) {
        assert_memory_equal(batch[i].codes, alone[i].codes, sizeof batch[i].codes);
        double et = max_diff(&batch[i].tlog[0][0], &alone[i].tlog[0][0], F * V);
        double ep = max_diff(&batch[i].plog[0][0][0], &alone[i].plog[0][0][0], F * (G - 1) * V);
        printf("request %d: batched vs alone: codes equal, max logits difference %.3g / %.3g\n",
               i, et, ep);
        assert_true(et < 1e-5 && ep < 1e-5);
        if (i > 0 && memcmp(alone[i].codes, alone[0].codes, sizeof alone[0].codes) != 0)
            distinct++;
    }
    assert_int_equal(distinct, B_MAX - 1); /* the prompts lead to different codes */
    world_free(&w);
    ms_free(prompt);
    ms_st_file_free(rf);
}

static void test_select_rows(void **state) {
    (void)state;
    ms_error err = {0};
    ms_backend be;
    CHECK(ms_backend_cpu_init(&be, NULL, &err));
    enum { N = 5, D = 3, LD = 4 };
    int32_t key[N] = {0, 2, 0, 1, 3};
    float a[N * LD], b[N * LD], out[N * LD];
    for (int i = 0; i < N * LD; i++) {
        a[i] = (float)i;
        b[i] = -(float)i - 100.0f;
        out[i] = 7.0f;
    }
    ms_tensor kt = ms_tensor_1d(key, MS_DTYPE_I32, N);
    ms_tensor at = ms_tensor_2d(a, MS_DTYPE_F32, N, D), bt = ms_tensor_2d(b, MS_DTYPE_F32, N, D);
    ms_tensor ot = ms_tensor_2d(out, MS_DTYPE_F32, N, D);
    at.stride[0] = bt.stride[0] = ot.stride[0] = LD;
    CHECK(be.iface.select_rows(be.ctx, &kt, &at, &bt, &ot, &err));
    for (int r = 0; r < N; r++) {
        for (int c = 0; c < D; c++)
            assert_true(out[r * LD + c] == (key[r] == 0 ? a : b)[r * LD + c]);
        assert_true(out[r * LD + D] == 7.0f); /* past the row's width: untouched */
    }
    CHECK(be.iface.select_rows(be.ctx, &kt, &at, &bt, &bt, &err)); /* in place: out is b */
    for (int r = 0; r < N; r++)
        for (int c = 0; c < D; c++)
            assert_true(b[r * LD + c] == out[r * LD + c]);
    ms_tensor short_key = ms_tensor_1d(key, MS_DTYPE_I32, N - 1);
    assert_int_equal(be.iface.select_rows(be.ctx, &short_key, &at, &bt, &ot, &err),
                     MS_ERR_INVALID_ARG);
    printf("select_rows, a short key: %s\n", err.msg);
    ms_tensor narrow = ms_tensor_2d(a, MS_DTYPE_F32, N, D - 1);
    assert_int_equal(be.iface.select_rows(be.ctx, &kt, &narrow, &bt, &ot, &err),
                     MS_ERR_INVALID_ARG);
    ms_tensor fkey = ms_tensor_1d(a, MS_DTYPE_F32, N); /* keys are i32 */
    assert_int_equal(be.iface.select_rows(be.ctx, &fkey, &at, &bt, &ot, &err),
                     MS_ERR_UNSUPPORTED);
    ms_backend_free(&be);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_select_rows),
        ms_unit_test(test_reference_codes_and_logits),
        ms_unit_test(test_batch_of_four_equals_each_alone),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
