/*
 * test_gguf_fixtures.c - GGUF files of the Hugging Face fixtures through the loaders: each fixture
 * (hf/llama_gqa: llama, GQA 8/2, untied lm_head; hf/qwen3: per-head q/k RMSNorm, head_dim 48 !=
 * hidden / heads, tied embeddings) is converted here to an F32 GGUF the way llama.cpp's
 * convert_hf_to_gguf.py writes one (llama.cpp tensor names, `<arch>.*` keys, and for llama the
 * q/k rows permuted by LlamaModel.permute), then run from the .gguf alone (config derived from its
 * metadata, weights un-permuted at load) by the hand-composed forward of fixture_forward.h on the
 * CPU backend: prefill and decode logits within 1e-3 of the fixture's transformers reference and
 * greedy ids equal, as test_llama_cpu_fixture.c checks the safetensors originals. This checks
 * the config derivation (head_dim from key_length, kv heads, tying, theta, eps) and the name map
 * for both families, beyond the one real llama file of test_gguf_smollm2.c.
 */
#include "ms_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "checkpoint.h"
#include "gguf.h"
#include "gguf_quant.h"
#include "hf_config.h"
#include "ms_test_impl.h"

/* only run_batch of the shared drivers is used here */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"
#include "fixture_forward.h"
#pragma GCC diagnostic pop

#define TOL 1e-3f

/* Hugging Face name -> GGUF name; *permute 1 for q_proj, 2 for k_proj (weights). */
static bool to_gguf_name(const char *hf, char *out, size_t cap, int *permute) {
    static const char *const global[][2] = {{"model.embed_tokens.weight", "token_embd.weight"},
                                            {"model.norm.weight", "output_norm.weight"},
                                            {"lm_head.weight", "output.weight"}};
    static const char *const layer[][2] = {
        {"self_attn.q_proj.weight", "attn_q.weight"},   {"self_attn.k_proj.weight", "attn_k.weight"},
        {"input_layernorm.weight", "attn_norm.weight"}, {"self_attn.v_proj.weight", "attn_v.weight"},
        {"self_attn.o_proj.weight", "attn_output.weight"}, {"self_attn.q_norm.weight", "attn_q_norm.weight"},
        {"self_attn.k_norm.weight", "attn_k_norm.weight"}, {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},   {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
    };
    *permute = 0;
    for (size_t i = 0; i < MS_ARRAY_LEN(global); i++)
        if (strcmp(hf, global[i][0]) == 0) {
            snprintf(out, cap, "%s", global[i][1]);
            return true;
        }
    long l;
    int used = 0;
    if (sscanf(hf, "model.layers.%ld.%n", &l, &used) != 1 || used == 0)
        return false;
    for (size_t i = 0; i < MS_ARRAY_LEN(layer); i++)
        if (strcmp(hf + used, layer[i][0]) == 0) {
            snprintf(out, cap, "blk.%ld.%s", l, layer[i][1]);
            *permute = i < 2 ? (int)i + 1 : 0;
            return true;
        }
    return false;
}

/* LlamaModel.permute: reshape(n_head, 2, hd / 2, cols).swapaxes(1, 2), written out. */
static void permute_rows(const float *src, float *dst, int64_t rows, int64_t cols, int64_t n_head) {
    int64_t hd = rows / n_head, half = hd / 2;
    for (int64_t h = 0; h < n_head; h++)
        for (int64_t s = 0; s < 2; s++)
            for (int64_t j = 0; j < half; j++)
                memcpy(dst + (h * hd + 2 * j + s) * cols, src + (h * hd + s * half + j) * cols,
                       (size_t)cols * sizeof *src);
}

/* rope_freqs.weight as convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors computes it for
 * rope_type llama3 (torch float32 tensors, Python-float parameters): one divisor per rotary pair. */
static void llama3_rope_factors(const ms_rope_params *rp, int dim, float *out) {
    double orig = (double)rp->original_max_position_embeddings;
    float low_wl = (float)(orig / rp->low_freq_factor);
    float high_wl = (float)(orig / rp->high_freq_factor);
    for (int i = 0; i < dim / 2; i++) {
        float freq = 1.0f / powf((float)rp->theta, (float)(2 * i) / (float)dim);
        float wavelen = (float)(2.0 * M_PI) / freq;
        if (wavelen < high_wl) {
            out[i] = 1.0f;
        } else if (wavelen > low_wl) {
            out[i] = (float)rp->factor;
        } else {
            float smooth = ((float)orig / wavelen - (float)rp->low_freq_factor) /
                           (float)(rp->high_freq_factor - rp->low_freq_factor);
            out[i] = 1.0f / ((1.0f - smooth) / (float)rp->factor + smooth);
        }
    }
}

/* Write fixture `rel` as an F32 GGUF of architecture `arch` at `out`. */
static void convert(const char *rel, const char *arch, const char *out) {
    ms_error err = {0};
    const char *dir = ms_test_fixture(rel);
    ms_hf_config *cfg = NULL;
    ms_ckpt *ck = NULL;
    CHECK(ms_hf_config_init(&cfg, dir, &err));
    CHECK(ms_ckpt_init(&ck, dir, &err));
    int64_t hidden, layers, heads, kv, hd, ff, vocab, ctx;
    double eps;
    ms_rope_params rp;
    CHECK(ms_hf_config_get_int(cfg, "hidden_size", &hidden, &err));
    CHECK(ms_hf_config_get_int(cfg, "num_hidden_layers", &layers, &err));
    CHECK(ms_hf_config_get_int(cfg, "num_attention_heads", &heads, &err));
    CHECK(ms_hf_config_get_int(cfg, "num_key_value_heads", &kv, &err));
    CHECK(ms_hf_config_get_int(cfg, "head_dim", &hd, &err));
    CHECK(ms_hf_config_get_int(cfg, "intermediate_size", &ff, &err));
    CHECK(ms_hf_config_get_int(cfg, "vocab_size", &vocab, &err));
    CHECK(ms_hf_config_get_int(cfg, "max_position_embeddings", &ctx, &err));
    CHECK(ms_hf_config_get_float(cfg, "rms_norm_eps", &eps, &err));
    CHECK(ms_hf_config_get_rope(cfg, &rp, &err));
    assert_true(rp.type == MS_ROPE_TYPE_DEFAULT || (rp.type == MS_ROPE_TYPE_LLAMA3 && strcmp(arch, "llama") == 0));
    ms_hf_config_free(cfg);
    bool llama = strcmp(arch, "llama") == 0;

    ms_gguf_writer *w = NULL;
    CHECK(ms_gguf_writer_init(&w, out, &err));
    char k[96];
#define AK(s) (snprintf(k, sizeof k, "%s.%s", arch, s), k)
    CHECK(ms_gguf_writer_set_str(w, "general.architecture", arch, &err));
    CHECK(ms_gguf_writer_set_u32(w, AK("embedding_length"), (uint32_t)hidden, &err));
    CHECK(ms_gguf_writer_set_u32(w, AK("block_count"), (uint32_t)layers, &err));
    CHECK(ms_gguf_writer_set_u32(w, AK("attention.head_count"), (uint32_t)heads, &err));
    CHECK(ms_gguf_writer_set_u32(w, AK("attention.head_count_kv"), (uint32_t)kv, &err));
    CHECK(ms_gguf_writer_set_u32(w, AK("attention.key_length"), (uint32_t)hd, &err));
    CHECK(ms_gguf_writer_set_u32(w, AK("attention.value_length"), (uint32_t)hd, &err));
    CHECK(ms_gguf_writer_set_u32(w, AK("feed_forward_length"), (uint32_t)ff, &err));
    CHECK(ms_gguf_writer_set_u32(w, AK("context_length"), (uint32_t)ctx, &err));
    CHECK(ms_gguf_writer_set_u32(w, AK("vocab_size"), (uint32_t)vocab, &err));
    CHECK(ms_gguf_writer_set_f32(w, AK("attention.layer_norm_rms_epsilon"), (float)eps, &err));
    CHECK(ms_gguf_writer_set_f32(w, AK("rope.freq_base"), (float)rp.theta, &err));
#undef AK
    size_t n = ms_ckpt_n_tensors(ck);
    float rope_ff[512];
    int64_t n_ff = hd / 2;
    if (rp.type == MS_ROPE_TYPE_LLAMA3) {
        llama3_rope_factors(&rp, (int)hd, rope_ff);
        CHECK(ms_gguf_writer_add_tensor(w, "rope_freqs.weight", MS_GGML_TYPE_F32, 1, &n_ff, &err));
    }
    for (size_t i = 0; i < n; i++) {
        const ms_st_tensor *t = ms_ckpt_tensor_at(ck, i);
        char g[96];
        int perm;
        if (!to_gguf_name(t->name, g, sizeof g, &perm))
            fail_msg("%s: no GGUF name for %s", rel, t->name);
        int64_t ne[2] = {t->n_dims == 2 ? t->shape[1] : t->shape[0], t->shape[0]};
        CHECK(ms_gguf_writer_add_tensor(w, g, MS_GGML_TYPE_F32, t->n_dims, ne, &err));
    }
    if (rp.type == MS_ROPE_TYPE_LLAMA3)
        CHECK(ms_gguf_writer_write(w, rope_ff, (size_t)n_ff * sizeof *rope_ff, &err));
    for (size_t i = 0; i < n; i++) {
        const ms_st_tensor *t = ms_ckpt_tensor_at(ck, i);
        char g[96];
        int perm;
        to_gguf_name(t->name, g, sizeof g, &perm);
        float *x = NULL;
        CHECK(ms_ckpt_load_f32(ck, t->name, MS_ST_DTYPES_FLOAT, t->n_dims, t->shape, &x, &err));
        if (llama && perm != 0) {
            float *y = ms_malloc(t->n_elems * sizeof *y);
            assert_non_null(y);
            permute_rows(x, y, t->shape[0], t->shape[1], perm == 1 ? heads : kv);
            ms_free(x);
            x = y;
        }
        CHECK(ms_gguf_writer_write(w, x, t->n_elems * sizeof *x, &err));
        ms_free(x);
    }
    CHECK(ms_gguf_writer_finish(w, &err));
    ms_gguf_writer_free(w);
    ms_ckpt_free(ck);
}

/* The RoPE inverse frequencies the config at `path` (a checkpoint folder or a .gguf) implies, into
 * inv[rotary_dim / 2]; returns rotary_dim. */
static int rope_inv_freq_of(const char *path, float *inv) {
    ms_error err = {0};
    ms_hf_config *cfg = NULL;
    CHECK(ms_hf_config_init(&cfg, path, &err));
    int64_t hd;
    CHECK(ms_hf_config_get_int(cfg, "head_dim", &hd, &err));
    ms_rope_params rp;
    CHECK(ms_hf_config_get_rope(cfg, &rp, &err));
    ms_hf_config_free(cfg);
    ms_rope_config rc;
    CHECK(ms_rope_config_from_hf(&rp, MS_ROPE_ROTATE_HALF, (int32_t)hd, &rc, &err));
    assert_true(rc.rotary_dim / 2 <= 512);
    CHECK(ms_rope_compute_inv_freq(&rc, inv, &err));
    return rc.rotary_dim;
}

static void check_gguf_fixture(const char *rel, const char *arch, int page_size, bool same_as_safetensors) {
    ms_error err = {0};
    char gguf[] = "/tmp/ms_test_gguf_fx_XXXXXX.gguf";
    int fd = mkstemps(gguf, 5);
    assert_true(fd >= 0);
    close(fd);
    convert(rel, arch, gguf);
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
    model m;
    model_load(&m, &be, gguf, MS_DTYPE_F32);
    model_plan(&m, MS_MAX(total, np), np * (most / page_size + 2) + 2, page_size);
    int all[MAX_SEQS] = {0, 1, 2, 3};
    run_result r;
    run_batch(&m, pr, all, np, page_size, &r);
    for (int i = 0; i < np; i++)
        for (int j = 0; j < pr[i].n_new; j++)
            if (r.ids[i][j] != pr[i].greedy[j])
                fail_msg("%s as GGUF: prompt %d step %d: id %d, reference %d", rel, i, j, r.ids[i][j],
                         pr[i].greedy[j]);
    if (!(r.err_prefill < TOL && r.err_decode < TOL))
        fail_msg("%s as GGUF: max abs error prefill %g decode %g", rel, (double)r.err_prefill,
                 (double)r.err_decode);
    printf("fixture %-14s as %s GGUF: %d prompt(s), max abs error prefill %.3g, decode %.3g; greedy ids "
           "equal\n", rel, arch, np, (double)r.err_prefill, (double)r.err_decode);
    model_free(&m);
    if (same_as_safetensors) {
        /* the same weights from the safetensors original: the derived RoPE (and with it every
         * logit) must be the same bits, so the errors against the reference are equal too */
        float inv_g[512], inv_s[512];
        int rd = rope_inv_freq_of(gguf, inv_g), rd_s = rope_inv_freq_of(dir, inv_s);
        assert_int_equal(rd, rd_s);
        for (int i = 0; i < rd / 2; i++)
            if (memcmp(&inv_g[i], &inv_s[i], sizeof(float)) != 0)
                fail_msg("%s as GGUF: inv_freq[%d] %.9g, from config.json %.9g", rel, i, (double)inv_g[i],
                         (double)inv_s[i]);
        run_result rs;
        model_load(&m, &be, dir, MS_DTYPE_F32);
        model_plan(&m, MS_MAX(total, np), np * (most / page_size + 2) + 2, page_size);
        run_batch(&m, pr, all, np, page_size, &rs);
        model_free(&m);
        if (memcmp(&rs.err_prefill, &r.err_prefill, sizeof r.err_prefill) != 0 ||
            memcmp(&rs.err_decode, &r.err_decode, sizeof r.err_decode) != 0 ||
            memcmp(&rs.rel_prefill, &r.rel_prefill, sizeof r.rel_prefill) != 0 ||
            memcmp(&rs.rel_decode, &r.rel_decode, sizeof r.rel_decode) != 0 || memcmp(rs.ids, r.ids, sizeof r.ids) != 0)
            fail_msg("%s: GGUF and safetensors runs differ (max abs error prefill %.9g vs %.9g, decode %.9g vs "
                     "%.9g)", rel, (double)r.err_prefill, (double)rs.err_prefill, (double)r.err_decode,
                     (double)rs.err_decode);
        printf("fixture %-14s: GGUF (rope_freqs.weight) and safetensors (rope_type llama3): %d inv_freq equal, "
               "same errors and ids\n", rel, rd / 2);
    }
    free_prompts(pr, np, &rf);
    ms_backend_free(&be);
    unlink(gguf);
}

static void test_llama_gqa_gguf(void **state) {
    (void)state;
    check_gguf_fixture("hf/llama_gqa", "llama", 16, false);
}

static void test_qwen3_gguf(void **state) {
    (void)state;
    check_gguf_fixture("hf/qwen3", "qwen3", 8, false);
}

/* Llama 3.1 scaling: llama.cpp's converter stores it as rope_freqs.weight (no GGUF key); the
 * loader recovers rope_type llama3 from it, so the GGUF runs exactly as the safetensors original. */
static void test_llama31_rope_gguf(void **state) {
    (void)state;
    check_gguf_fixture("hf/llama31_rope", "llama", 16, true);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_llama_gqa_gguf),
        ms_unit_test(test_qwen3_gguf),
        ms_unit_test(test_llama31_rope_gguf),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
