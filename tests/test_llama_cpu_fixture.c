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
 * The forward, the page table and the fixture drivers are in fixture_forward.h (shared with
 * test_llama_cuda_fixture.c, which runs the same forward on the CUDA backend); here they run with
 * float32 weights and KV. The reference files are read with the loaders' safetensors reader
 * (F32 and I32 data tensors); the llama2.c golden JSON with jansson. Whisper's encoder-decoder
 * forward is local to this file (its encoder ops exist only on the CPU backend).
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

#include "fixture_forward.h"

#define TOL 1e-3f

/* ---- Hugging Face fixtures with prompts and greedy decode ---- */

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
        model_load(&m, &be, dir, MS_DTYPE_F32);
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
    model_load(&m, &be, bin, MS_DTYPE_F32);
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
    ms_backend be;
    CHECK(ms_backend_cpu_init(&be, &(ms_backend_cpu_options){2}, &err));
    mrope_result r;
    run_mrope(&be, MS_DTYPE_F32, &r);
    printf("fixture hf/qwen2vl_mrope        1 prompt of %lld tokens (M-RoPE sections %d/%d/%d): "
           "max abs error %.3g\n", (long long)r.n_tokens, r.sections[0], r.sections[1],
           r.sections[2], (double)r.err);
    if (!(r.err < TOL))
        fail_msg("qwen2vl_mrope: max abs error %g", (double)r.err);
    ms_backend_free(&be);
}

/* ---- classifier-free guidance: cond and uncond streams of one request in one batch ---- */

static void test_llama_cfg(void **state) {
    (void)state;
    ms_error err = {0};
    ms_backend be;
    CHECK(ms_backend_cpu_init(&be, &(ms_backend_cpu_options){2}, &err));
    cfg_result r;
    run_cfg(&be, MS_DTYPE_F32, 4, &r);
    if (r.same < r.n_new)
        fail_msg("llama_cfg step %lld: id %d differs from the reference's", (long long)r.same,
                 r.ids[r.same]);
    printf("fixture hf/llama_cfg            cond %lld + uncond %lld tokens, %lld guided steps: "
           "max abs error of mixed log-probs %.3g; greedy ids equal\n", (long long)r.n_cond,
           (long long)r.n_uncond, (long long)r.n_new, (double)r.err);
    if (!(r.err < TOL))
        fail_msg("llama_cfg: max abs error %g", (double)r.err);
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
    float enc_err = row_abs_err(enc_out.data, enc_ref, T * w->d);

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
        float e = row_abs_err(host, want, w->vocab);
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
