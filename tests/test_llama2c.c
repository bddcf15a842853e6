/*
 * test_llama2c.c - llama2.c checkpoints and tokenizer.bin against ../shared/fixtures/llama2c: header,
 * run.c's weight layout (checked against independent reads of the file), Hugging Face-named tensors
 * and derived config, encode/decode exactly reproducing the golden prompt ids and printed text; and
 * bad files written into a mkdtemp folder (too short, too long, bad header, truncated tokenizer).
 */
#include "ms_test.h"

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "checkpoint.h"
#include "hf_config.h"
#include "llama2c.h"
#include "tokenizer_llama2c.h"

#include "ms_test_impl.h"

#define MODEL "llama2c/aidreams260K.bin"
#define TOKENIZER "llama2c/tok512.bin"

/* ---- helpers ---- */

static char tmp_dir[256];

static int tmp_setup(void **state) {
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/ms_test_l2c_XXXXXX");
    if (mkdtemp(tmp_dir) == NULL)
        return -1;
    return ms_test_leak_setup(state);
}

static int tmp_teardown(void **state) {
    DIR *d = opendir(tmp_dir);
    if (d != NULL) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char p[512];
            snprintf(p, sizeof p, "%s/%s", tmp_dir, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(tmp_dir);
    return ms_test_leak_teardown(state);
}

#define tmp_test(f) cmocka_unit_test_setup_teardown(f, tmp_setup, tmp_teardown)

static const char *tmp_path(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmp_dir, name);
    return buf[k];
}

/* Whole fixture file into memory (malloc). */
static unsigned char *read_fixture(const char *rel, size_t *size) {
    FILE *fp = fopen(ms_test_fixture(rel), "rb");
    assert_non_null(fp);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)n);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    *size = (size_t)n;
    return buf;
}

static const char *write_bytes(const char *name, const void *data, size_t n) {
    const char *p = tmp_path(name);
    FILE *fp = fopen(p, "wb");
    assert_non_null(fp);
    assert_int_equal(fwrite(data, 1, n, fp), n);
    fclose(fp);
    return p;
}

static float float_at(const unsigned char *file, size_t offset) {
    float f;
    memcpy(&f, file + offset, 4);
    return f;
}

/* Assert status `want` and a one-line message naming `file` and containing `what`. */
static void check_err(ms_status st, ms_status want, const ms_error *err, const char *file, const char *what) {
    printf("  %-18s %s\n", ms_status_str(st), err->msg);
    if (st != want || strstr(err->msg, file) == NULL || strstr(err->msg, what) == NULL ||
        strchr(err->msg, '\n') != NULL)
        fail_msg("status %s, message '%s'; expected %s naming '%s' and saying '%s'", ms_status_str(st), err->msg,
                 ms_status_str(want), file, what);
}

/* ---- checkpoint ---- */

static void test_header_and_weight_layout(void **state) {
    (void)state;
    ms_error err = {0};
    ms_llama2c *m = NULL;
    if (ms_llama2c_init(&m, ms_test_fixture(MODEL), &err) != MS_OK)
        fail_msg("%s", err.msg);
    const ms_llama2c_config *c = ms_llama2c_get_config(m);
    assert_int_equal(c->dim, 64);
    assert_int_equal(c->hidden_dim, 172);
    assert_int_equal(c->n_layers, 4);
    assert_int_equal(c->n_heads, 4);
    assert_int_equal(c->n_kv_heads, 4);
    assert_int_equal(c->vocab_size, 512);
    assert_int_equal(c->seq_len, 128);
    assert_int_equal(c->head_size, 16);
    assert_true(c->shared_classifier);

    /* Offsets worked out by hand from run.c's memory_map_weights for this header (in bytes):
     * emb 512*64 floats from 28, rms_att 4*64, wq/wk/wv/wo 4*64*64 each, rms_ffn 4*64,
     * w1/w2/w3 4*64*172 each, rms_final 64, freq_cis 2 * 128*8; total 932124 = the file size. */
    size_t size;
    unsigned char *file = read_fixture(MODEL, &size);
    assert_int_equal(size, 932124);
    const ms_llama2c_weights *w = ms_llama2c_get_weights(m);
    const struct {
        const float *p;
        size_t offset, n;
    } sections[] = {
        {w->token_embedding_table, 28, 32768}, {w->rms_att_weight, 131100, 256}, {w->wq, 132124, 16384},
        {w->wk, 197660, 16384},                {w->wv, 263196, 16384},           {w->wo, 328732, 16384},
        {w->rms_ffn_weight, 394268, 256},      {w->w1, 395292, 44032},           {w->w2, 571420, 44032},
        {w->w3, 747548, 44032},                {w->rms_final_weight, 923676, 64},
    };
    for (size_t i = 0; i < MS_ARRAY_LEN(sections); i++) {
        assert_true(sections[i].p[0] == float_at(file, sections[i].offset));
        assert_true(sections[i].p[sections[i].n - 1] == float_at(file, sections[i].offset + 4 * (sections[i].n - 1)));
        assert_int_equal((uintptr_t)sections[i].p % 4, 0);
    }
    assert_ptr_equal(w->wcls, w->token_embedding_table);
    free(file);
    ms_llama2c_free(m);
}

static void test_checkpoint_and_config_from_bin(void **state) {
    (void)state;
    ms_error err = {0};
    ms_ckpt *ck = NULL;
    if (ms_ckpt_init(&ck, ms_test_fixture(MODEL), &err) != MS_OK)
        fail_msg("%s", err.msg);
    assert_int_equal(ms_ckpt_n_files(ck), 0);
    assert_non_null(ms_ckpt_get_llama2c(ck));
    assert_int_equal(ms_llama2c_get_config(ms_ckpt_get_llama2c(ck))->vocab_size, 512);
    assert_int_equal(ms_ckpt_n_tensors(ck), 2 + 9 * 4);
    assert_false(ms_ckpt_has_tensor(ck, "lm_head.weight"));
    const ms_st_tensor *t;
    assert_int_equal(ms_ckpt_expect_tensor(ck, "model.layers.3.mlp.down_proj.weight", MS_ST_DTYPES_FLOAT, 2,
                                           (const int64_t[]){64, 172}, &t, &err),
                     MS_OK);
    ms_llama2c *m = NULL;
    assert_int_equal(ms_llama2c_init(&m, ms_test_fixture(MODEL), &err), MS_OK);
    const ms_llama2c_weights *w = ms_llama2c_get_weights(m);
    assert_memory_equal(t->data, w->w2 + 3 * 64 * 172, 64 * 172 * 4);
    assert_int_equal(ms_ckpt_expect_tensor(ck, "model.layers.1.self_attn.k_proj.weight", MS_ST_DTYPES_FLOAT, 2,
                                           (const int64_t[]){64, 64}, &t, &err),
                     MS_OK);
    assert_memory_equal(t->data, w->wk + 1 * 64 * 64, 64 * 64 * 4);
    assert_int_equal(ms_ckpt_expect_tensor(ck, "model.layers.2.input_layernorm.weight", MS_ST_DTYPES_FLOAT, 1,
                                           (const int64_t[]){64}, &t, &err),
                     MS_OK);
    assert_memory_equal(t->data, w->rms_att_weight + 2 * 64, 64 * 4);
    assert_non_null(ms_st_tensor_f32_data(t));
    ms_llama2c_free(m);
    ms_ckpt_free(ck);

    ms_hf_config *cfg = NULL;
    if (ms_hf_config_init(&cfg, ms_test_fixture(MODEL), &err) != MS_OK)
        fail_msg("%s", err.msg);
    int64_t v;
    assert_int_equal(ms_hf_config_get_int(cfg, "hidden_size", &v, &err), MS_OK);
    assert_int_equal(v, 64);
    assert_int_equal(ms_hf_config_get_int(cfg, "intermediate_size", &v, &err), MS_OK);
    assert_int_equal(v, 172);
    assert_int_equal(ms_hf_config_get_int(cfg, "max_position_embeddings", &v, &err), MS_OK);
    assert_int_equal(v, 128);
    bool b;
    assert_int_equal(ms_hf_config_get_bool(cfg, "rope_interleaved", &b, &err), MS_OK);
    assert_true(b);
    assert_int_equal(ms_hf_config_get_bool(cfg, "tie_word_embeddings", &b, &err), MS_OK);
    assert_true(b);
    ms_rope_params r;
    assert_int_equal(ms_hf_config_get_rope(cfg, &r, &err), MS_OK);
    assert_true(r.theta == 10000.0 && r.type == MS_ROPE_TYPE_DEFAULT);
    int64_t eos[2];
    size_t n;
    assert_int_equal(ms_hf_config_get_eos_ids(cfg, eos, 2, &n, &err), MS_OK);
    assert_int_equal(n, 1);
    assert_int_equal(eos[0], 1);
    assert_non_null(strstr(ms_hf_config_path(cfg), "aidreams260K.bin"));
    ms_hf_config_free(cfg);
}

/* Build a small llama2.c file: header h, then `n_floats` floats valued 0, 1, 2, ... */
static const char *write_l2c(const char *name, const int32_t h[7], size_t n_floats) {
    size_t n = 28 + 4 * n_floats;
    unsigned char *buf = malloc(n);
    assert_non_null(buf);
    memcpy(buf, h, 28);
    for (size_t i = 0; i < n_floats; i++) {
        float f = (float)i;
        memcpy(buf + 28 + 4 * i, &f, 4);
    }
    const char *p = write_bytes(name, buf, n);
    free(buf);
    return p;
}

static void test_unshared_classifier(void **state) {
    (void)state;
    /* dim 8, hidden 12, 2 layers, 2 heads (head 4), 1 kv head, vocab -10 (unshared), seq 4 */
    const int32_t h[7] = {8, 12, 2, 2, 1, -10, 4};
    size_t emb = 80, rms = 16, wq = 128, wkv = 64, wo = 128, w13 = 192, fin = 8, freq = 16;
    size_t before_cls = emb + rms + wq + 2 * wkv + wo + rms + 3 * w13 + fin + freq;
    const char *p = write_l2c("unshared.bin", h, before_cls + emb);
    ms_error err = {0};
    ms_llama2c *m = NULL;
    if (ms_llama2c_init(&m, p, &err) != MS_OK)
        fail_msg("%s", err.msg);
    const ms_llama2c_config *c = ms_llama2c_get_config(m);
    assert_false(c->shared_classifier);
    assert_int_equal(c->vocab_size, 10);
    const ms_llama2c_weights *w = ms_llama2c_get_weights(m);
    assert_true(w->wk[0] == (float)(emb + rms + wq));
    assert_true(w->w3[0] == (float)(emb + rms + wq + 2 * wkv + wo + rms + 2 * w13));
    assert_true(w->wcls[0] == (float)before_cls);
    assert_true(w->wcls[79] == (float)(before_cls + 79));
    assert_int_equal(ms_llama2c_n_tensors(m), 2 + 18 + 1);
    ms_llama2c_free(m);
    ms_ckpt *ck = NULL;
    assert_int_equal(ms_ckpt_init(&ck, p, &err), MS_OK);
    const ms_st_tensor *t;
    assert_int_equal(ms_ckpt_expect_tensor(ck, "lm_head.weight", MS_ST_DTYPES_FLOAT, 2, (const int64_t[]){10, 8},
                                           &t, &err),
                     MS_OK);
    float first;
    memcpy(&first, t->data, 4);
    assert_true(first == (float)before_cls);
    assert_int_equal(ms_ckpt_expect_tensor(ck, "model.layers.1.self_attn.v_proj.weight", MS_ST_DTYPES_FLOAT, 2,
                                           (const int64_t[]){4, 8}, NULL, &err),
                     MS_OK);
    ms_ckpt_free(ck);
    ms_hf_config *cfg = NULL;
    assert_int_equal(ms_hf_config_init(&cfg, p, &err), MS_OK);
    bool tied = true;
    assert_int_equal(ms_hf_config_get_bool(cfg, "tie_word_embeddings", &tied, &err), MS_OK);
    assert_false(tied);
    int64_t kv;
    assert_int_equal(ms_hf_config_get_int(cfg, "num_key_value_heads", &kv, &err), MS_OK);
    assert_int_equal(kv, 1);
    ms_hf_config_free(cfg);
}

static void test_bad_llama2c_files(void **state) {
    (void)state;
    ms_error err = {0};
    ms_llama2c *m = NULL;
    size_t size;
    unsigned char *file = read_fixture(MODEL, &size);
    const char *p = write_bytes("short.bin", file, size - 4);
    check_err(ms_llama2c_init(&m, p, &err), MS_ERR_FORMAT, &err, "short.bin",
              "file too short: 932120 bytes, the header (dim 64, n_layers 4, vocab 512, seq_len 128) implies 932124");
    assert_null(m);
    p = write_bytes("half.bin", file, size / 2);
    check_err(ms_llama2c_init(&m, p, &err), MS_ERR_FORMAT, &err, "half.bin", "file too short");
    /* the same through the checkpoint and config front doors */
    ms_ckpt *ck = NULL;
    check_err(ms_ckpt_init(&ck, p, &err), MS_ERR_FORMAT, &err, "half.bin", "file too short");
    ms_hf_config *cfg = NULL;
    check_err(ms_hf_config_init(&cfg, p, &err), MS_ERR_FORMAT, &err, "half.bin", "file too short");
    p = write_bytes("hdr.bin", file, 20);
    check_err(ms_llama2c_init(&m, p, &err), MS_ERR_FORMAT, &err, "hdr.bin", "a llama2.c header needs 28");
    unsigned char *longer = malloc(size + 8);
    assert_non_null(longer);
    memcpy(longer, file, size);
    memset(longer + size, 0, 8);
    p = write_bytes("long.bin", longer, size + 8);
    check_err(ms_llama2c_init(&m, p, &err), MS_ERR_FORMAT, &err, "long.bin", "file too long: 932132 bytes");
    free(longer);
    free(file);
    check_err(ms_llama2c_init(&m, tmp_path("missing.bin"), &err), MS_ERR_IO, &err, "missing.bin", "cannot open");

    const int32_t zero_dim[7] = {0, 12, 2, 2, 1, 10, 4};
    check_err(ms_llama2c_init(&m, write_l2c("zero.bin", zero_dim, 100), &err), MS_ERR_FORMAT, &err, "zero.bin",
              "header field dim = 0 is not a positive size");
    const int32_t neg_layers[7] = {8, 12, -2, 2, 1, 10, 4};
    check_err(ms_llama2c_init(&m, write_l2c("neg.bin", neg_layers, 100), &err), MS_ERR_FORMAT, &err, "neg.bin",
              "n_layers = -2");
    const int32_t heads[7] = {8, 12, 2, 3, 1, 10, 4};
    check_err(ms_llama2c_init(&m, write_l2c("heads.bin", heads, 100), &err), MS_ERR_FORMAT, &err, "heads.bin",
              "dim 8 is not a multiple of n_heads 3");
    const int32_t kv[7] = {8, 12, 2, 2, 3, 10, 4};
    check_err(ms_llama2c_init(&m, write_l2c("kv.bin", kv, 100), &err), MS_ERR_FORMAT, &err, "kv.bin",
              "n_heads 2 is not a multiple of n_kv_heads 3");
    const int32_t odd[7] = {6, 12, 2, 2, 1, 10, 4};
    check_err(ms_llama2c_init(&m, write_l2c("odd.bin", odd, 100), &err), MS_ERR_FORMAT, &err, "odd.bin",
              "head size 3");
    const int32_t big[7] = {1 << 30, 1 << 30, 1 << 30, 1, 1, 1 << 30, 1 << 30};
    check_err(ms_llama2c_init(&m, write_l2c("big.bin", big, 4), &err), MS_ERR_FORMAT, &err, "big.bin", "overflow");
    const int32_t magic[7] = {0x616b3432, 2, 0, 0, 0, 0, 0};
    check_err(ms_llama2c_init(&m, write_l2c("v2.bin", magic, 4), &err), MS_ERR_UNSUPPORTED, &err, "v2.bin",
              "magic 'ak42'");
}

static void test_llama2c_survives_allocation_failures(void **state) {
    (void)state;
    int failures = 0;
    for (int64_t k = 1; k < 50; k++) {
        ms_error err = {0};
        ms_ckpt *ck = NULL;
        ms_alloc_fail_nth(k);
        ms_status st = ms_ckpt_init(&ck, ms_test_fixture(MODEL), &err);
        ms_alloc_fail_nth(0);
        if (st == MS_OK) {
            ms_ckpt_free(ck);
            break;
        }
        assert_int_equal(st, MS_ERR_OOM);
        failures++;
    }
    assert_true(failures >= 4);
}

/* ---- tokenizer ---- */

static ms_llama2c_tok *load_tok(void) {
    ms_error err = {0};
    ms_llama2c_tok *tok = NULL;
    if (ms_llama2c_tok_init(&tok, ms_test_fixture(TOKENIZER), 512, &err) != MS_OK)
        fail_msg("%s", err.msg);
    return tok;
}

/* What run.c prints for ids (after the first): safe_printf(decode(prev, id)) each, then "\n". */
static char *render(const ms_llama2c_tok *tok, const int32_t *ids, size_t n) {
    size_t cap = 64 + n * 64, len = 0;
    char *out = malloc(cap);
    assert_non_null(out);
    for (size_t i = 1; i < n; i++) {
        const char *piece = ms_llama2c_tok_decode(tok, ids[i - 1], ids[i]);
        assert_non_null(piece);
        if (!ms_llama2c_tok_piece_printable(piece))
            continue;
        size_t pl = strlen(piece);
        assert_true(len + pl + 2 < cap);
        memcpy(out + len, piece, pl);
        len += pl;
    }
    out[len++] = '\n';
    out[len] = '\0';
    return out;
}

static void test_tokenizer_vocab(void **state) {
    (void)state;
    ms_llama2c_tok *tok = load_tok();
    assert_int_equal(ms_llama2c_tok_vocab_size(tok), 512);
    assert_string_equal(ms_llama2c_tok_piece(tok, 0), "<unk>");
    assert_string_equal(ms_llama2c_tok_piece(tok, 1), "\n<s>\n");
    assert_string_equal(ms_llama2c_tok_piece(tok, 3), "<0x00>");
    assert_string_equal(ms_llama2c_tok_piece(tok, 259), "in");
    assert_string_equal(ms_llama2c_tok_piece(tok, 262), " a");
    assert_null(ms_llama2c_tok_piece(tok, 512));
    assert_null(ms_llama2c_tok_piece(tok, -1));
    assert_true(ms_llama2c_tok_score(tok, 260) == -1.0f);
    /* decode: byte tokens become raw bytes, the space after BOS goes */
    assert_string_equal(ms_llama2c_tok_decode(tok, 1, 262), "a");
    assert_string_equal(ms_llama2c_tok_decode(tok, 262, 262), " a");
    assert_string_equal(ms_llama2c_tok_decode(tok, 5, 3 + 'A'), "A");
    const char *nl = ms_llama2c_tok_decode(tok, 5, 3 + '\n');
    assert_string_equal(nl, "\n");
    assert_true(ms_llama2c_tok_piece_printable(nl));
    assert_false(ms_llama2c_tok_piece_printable(ms_llama2c_tok_decode(tok, 5, 3 + 1)));  /* 0x01 */
    assert_false(ms_llama2c_tok_piece_printable(ms_llama2c_tok_decode(tok, 5, 3 + 0)));  /* NUL: "" */
    assert_false(ms_llama2c_tok_piece_printable(NULL));
    assert_null(ms_llama2c_tok_decode(tok, 1, 600));
    ms_llama2c_tok_free(tok);
}

static void test_tokenizer_matches_golden(void **state) {
    (void)state;
    json_error_t jerr;
    json_t *golden = json_load_file(ms_test_fixture("llama2c/aidreams260K.golden.json"), 0, &jerr);
    assert_non_null(golden);
    json_t *cases = json_object_get(golden, "cases");
    assert_int_equal(json_array_size(cases), 4);
    ms_llama2c_tok *tok = load_tok();
    size_t i;
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *prompt = json_string_value(json_object_get(c, "prompt"));
        const char *text = json_string_value(json_object_get(c, "text"));
        json_t *jids = json_object_get(c, "token_ids");
        size_t n_gold = json_array_size(jids);
        assert_int_equal(n_gold, (size_t)json_integer_value(json_object_get(c, "steps")));
        int32_t *gold = malloc(n_gold * sizeof *gold);
        assert_non_null(gold);
        for (size_t k = 0; k < n_gold; k++)
            gold[k] = (int32_t)json_integer_value(json_array_get(jids, k));

        /* encode: BOS + the prompt's ids are the start of what the model saw */
        ms_error err = {0};
        int32_t *ids = NULL;
        size_t n = 0;
        assert_int_equal(ms_llama2c_tok_encode(tok, prompt, true, false, &ids, &n, &err), MS_OK);
        assert_true(n >= 2 && n <= n_gold);
        assert_memory_equal(ids, gold, n * sizeof *ids);
        /* ... and exactly the prompt: rendering them gives the prompt back */
        char *round = render(tok, ids, n);
        round[strlen(round) - 1] = '\0';
        assert_string_equal(round, prompt);
        free(round);
        ms_free(ids);

        /* decode: run.c feeds `steps` tokens and prints the piece of each token it computes, so its
         * text is the rendering of token_ids plus the piece of one last sampled token, then "\n". */
        char *out = render(tok, gold, n_gold);
        size_t out_len = strlen(out) - 1;  /* without the "\n" */
        assert_true(strlen(text) > out_len);
        assert_memory_equal(out, text, out_len);
        char last[64];
        snprintf(last, sizeof last, "%s", text + out_len);
        assert_true(strlen(last) >= 1 && last[strlen(last) - 1] == '\n');
        last[strlen(last) - 1] = '\0';
        bool one_token = false;
        for (int id = 0; id < 512 && !one_token; id++)
            one_token = strcmp(ms_llama2c_tok_decode(tok, gold[n_gold - 1], id), last) == 0;
        if (!one_token)
            fail_msg("case %zu: text after the rendered ids ('%s') is not one token's piece", i, last);
        free(out);
        free(gold);
    }
    ms_llama2c_tok_free(tok);
    json_decref(golden);
}

static void test_tokenizer_encode_edges(void **state) {
    (void)state;
    ms_llama2c_tok *tok = load_tok();
    ms_error err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    /* empty text: BOS only (no dummy prefix), and EOS when asked */
    assert_int_equal(ms_llama2c_tok_encode(tok, "", true, true, &ids, &n, &err), MS_OK);
    assert_int_equal(n, 2);
    assert_int_equal(ids[0], 1);
    assert_int_equal(ids[1], 2);
    ms_free(ids);
    assert_int_equal(ms_llama2c_tok_encode(tok, "", false, false, &ids, &n, &err), MS_OK);
    assert_int_equal(n, 0);
    ms_free(ids);
    /* code points outside the vocabulary fall back to bytes + 3 and render back exactly */
    static const char *const texts[] = {"caf\xc3\xa9 \xf0\x9f\x98\x80!", "a\x80\x80\x80\x80\x80z", "\xff",
                                        "tab\there\nnewline", "  two spaces"};
    for (size_t k = 0; k < MS_ARRAY_LEN(texts); k++) {
        assert_int_equal(ms_llama2c_tok_encode(tok, texts[k], true, false, &ids, &n, &err), MS_OK);
        for (size_t j = 0; j < n; j++)
            assert_true(ids[j] >= 0 && ids[j] < 512);
        /* decode without the printable filter: every byte comes back */
        char buf[256] = {0};
        size_t len = 0;
        for (size_t j = 1; j < n; j++) {
            const char *piece = ms_llama2c_tok_decode(tok, ids[j - 1], ids[j]);
            size_t pl = strlen(piece);
            if (pl == 0 && ids[j] == 3)
                pl = 1;  /* the NUL byte token: never produced from a C string */
            memcpy(buf + len, piece, pl);
            len += pl;
        }
        assert_string_equal(buf, texts[k]);
        ms_free(ids);
    }
    assert_int_equal(ms_llama2c_tok_encode(tok, "\xc3\xa9", false, false, &ids, &n, &err), MS_OK);
    assert_int_equal(n, 3);
    assert_int_equal(ids[1], 0xc3 + 3);
    assert_int_equal(ids[2], 0xa9 + 3);
    ms_free(ids);
    ms_llama2c_tok_free(tok);
}

/* ---- encode: the merge order of run.c, fast ---- */

/* run.c's encode, written as run.c does it (linear lookups, a full rescan after every merge): the
 * reference the tokenizer's heap-based merge must agree with id for id. */
static size_t runc_encode(const ms_llama2c_tok *tok, const char *text, int32_t *out) {
    int nv = ms_llama2c_tok_vocab_size(tok);
    size_t n = 0;
    out[n++] = 1;
    char buf[64];
#define RUNC_LOOKUP(str, id)                                      \
    do {                                                          \
        id = -1;                                                  \
        for (int v_ = 0; v_ < nv && id < 0; v_++)                 \
            if (strcmp(ms_llama2c_tok_piece(tok, v_), str) == 0)  \
                id = v_;                                          \
    } while (0)
    int id;
    if (text[0] != '\0') {
        RUNC_LOOKUP(" ", id);
        out[n++] = id;
    }
    for (const char *c = text; *c != '\0'; c++) {
        buf[0] = *c; /* the texts below are ASCII: one byte, one code point */
        buf[1] = '\0';
        RUNC_LOOKUP(buf, id);
        out[n++] = id >= 0 ? id : (unsigned char)*c + 3;
    }
    for (;;) {
        float best = -1e10f;
        int best_id = -1;
        size_t best_i = 0;
        for (size_t i = 0; i + 1 < n; i++) {
            snprintf(buf, sizeof buf, "%s%s", ms_llama2c_tok_piece(tok, out[i]),
                     ms_llama2c_tok_piece(tok, out[i + 1]));
            RUNC_LOOKUP(buf, id);
            if (id != -1 && ms_llama2c_tok_score(tok, id) > best) {
                best = ms_llama2c_tok_score(tok, id);
                best_id = id;
                best_i = i;
            }
        }
        if (best_id == -1)
            break;
        out[best_i] = best_id;
        memmove(&out[best_i + 1], &out[best_i + 2], (n - best_i - 2) * sizeof *out);
        n--;
    }
#undef RUNC_LOOKUP
    return n;
}

static void test_tokenizer_merge_order_and_speed(void **state) {
    (void)state;
    ms_llama2c_tok *tok = load_tok();
    ms_error err = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    /* seeded random texts over letters, spaces and punctuation: many merges, long words */
    static const char alphabet[] = "eeeeaaaoooiiinnnsssttthhrrdllu  ..,'!wcmfygpb";
    uint64_t seed = 12345;
    char text[200];
    int32_t want[210];
    for (int k = 0; k < 150; k++) {
        size_t len = (size_t)(k % 60) + 1;
        for (size_t i = 0; i < len; i++) {
            seed = seed * 6364136223846793005ull + 1442695040888963407ull;
            text[i] = alphabet[(seed >> 33) % (sizeof alphabet - 1)];
        }
        text[len] = '\0';
        size_t nw = runc_encode(tok, text, want);
        assert_int_equal(ms_llama2c_tok_encode(tok, text, true, false, &ids, &n, &err), MS_OK);
        if (n != nw || memcmp(ids, want, n * sizeof *ids) != 0)
            fail_msg("'%s': %zu ids, run.c's loop gives %zu", text, n, nw);
        ms_free(ids);
    }
    /* 400 KB: was O(n^2) (an 80 KB prompt took minutes before the context check could refuse it) */
    size_t big = 400000;
    char *t = malloc(big + 1);
    assert_non_null(t);
    for (size_t i = 0; i < big; i++)
        t[i] = "the cat sat on a mat. "[i % 22];
    t[big] = '\0';
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    assert_int_equal(ms_llama2c_tok_encode(tok, t, true, false, &ids, &n, &err), MS_OK);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double sec = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    printf("  400 KB encoded into %zu ids in %.3f s\n", n, sec);
    assert_true(n > 1000 && n < big);
    assert_true(sec < 5.0);
    ms_free(ids);
    free(t);
    ms_llama2c_tok_free(tok);
}

/* Tokenizer file builder: max_len, then (score, len, bytes) per token string. */
static const char *write_tok(const char *name, int32_t max_len, const char *const *strs, size_t n) {
    unsigned char buf[4096];
    size_t pos = 0;
    memcpy(buf, &max_len, 4);
    pos = 4;
    for (size_t i = 0; i < n; i++) {
        float score = -(float)i;
        int32_t len = (int32_t)strlen(strs[i]);
        memcpy(buf + pos, &score, 4);
        memcpy(buf + pos + 4, &len, 4);
        memcpy(buf + pos + 8, strs[i], (size_t)len);
        pos += 8 + (size_t)len;
    }
    return write_bytes(name, buf, pos);
}

static void test_bad_tokenizer_files(void **state) {
    (void)state;
    ms_error err = {0};
    ms_llama2c_tok *tok = NULL;
    check_err(ms_llama2c_tok_init(&tok, tmp_path("none.bin"), 512, &err), MS_ERR_IO, &err, "none.bin",
              "cannot open tokenizer");
    check_err(ms_llama2c_tok_init(&tok, tmp_dir, 512, &err), MS_ERR_IO, &err, tmp_dir, "cannot read tokenizer");
    size_t size;
    unsigned char *file = read_fixture(TOKENIZER, &size);
    const char *p = write_bytes("cut.bin", file, size / 2);
    check_err(ms_llama2c_tok_init(&tok, p, 512, &err), MS_ERR_FORMAT, &err, "cut.bin", "truncated");
    assert_null(tok);
    check_err(ms_llama2c_tok_init(&tok, p, 0, &err), MS_ERR_FORMAT, &err, "cut.bin", "truncated");
    /* extra bytes after the last token, read without a vocab size: named as such (the message
     * said "truncated after token 512", an id the file does not hold) */
    unsigned char *plus = malloc(size + 4);
    assert_non_null(plus);
    memcpy(plus, file, size);
    memcpy(plus + size, "junk", 4);
    p = write_bytes("plus.bin", plus, size + 4);
    free(plus);
    check_err(ms_llama2c_tok_init(&tok, p, 0, &err), MS_ERR_FORMAT, &err, "plus.bin",
              "truncated after token 511 (4 stray bytes: a cut token record, or extra bytes after the "
              "last token)");
    p = write_bytes("five.bin", file, 5);
    check_err(ms_llama2c_tok_init(&tok, p, 0, &err), MS_ERR_FORMAT, &err, "five.bin",
              "truncated inside the first token record (1 bytes after the header");
    p = write_bytes("two.bin", file, 2);
    check_err(ms_llama2c_tok_init(&tok, p, 512, &err), MS_ERR_FORMAT, &err, "two.bin", "too short");
    p = write_bytes("full.bin", file, size);
    check_err(ms_llama2c_tok_init(&tok, p, 600, &err), MS_ERR_FORMAT, &err, "full.bin",
              "truncated at token 512 of 600");
    check_err(ms_llama2c_tok_init(&tok, p, 500, &err), MS_ERR_FORMAT, &err, "full.bin",
              "more tokens than the model's vocab_size 500");
    assert_int_equal(ms_llama2c_tok_init(&tok, p, 0, &err), MS_OK);  /* 0: all the file holds */
    assert_int_equal(ms_llama2c_tok_vocab_size(tok), 512);
    ms_llama2c_tok_free(tok);
    tok = NULL;
    free(file);

    static const char *const good[] = {"<unk>", "<s>", "</s>", " ", "a", "b", " a", "ab"};
    p = write_tok("small.bin", 5, good, MS_ARRAY_LEN(good));
    assert_int_equal(ms_llama2c_tok_init(&tok, p, 8, &err), MS_OK);
    int32_t *ids;
    size_t n;
    assert_int_equal(ms_llama2c_tok_encode(tok, "ab", false, false, &ids, &n, &err), MS_OK);
    assert_int_equal(n, 2);  /* " " "a" "b" -> " a" (score -6) beats "ab" (-7): [" a", "b"] */
    assert_int_equal(ids[0], 6);
    assert_int_equal(ids[1], 5);
    ms_free(ids);
    check_err(ms_llama2c_tok_encode(tok, "c", false, false, &ids, &n, &err), MS_ERR_FORMAT, &err, "small.bin",
              "byte fallback id 102 is outside the vocabulary (8 tokens)");
    ms_llama2c_tok_free(tok);
    static const char *const no_space[] = {"<unk>", "<s>", "</s>", "a"};
    p = write_tok("nospace.bin", 5, no_space, MS_ARRAY_LEN(no_space));
    assert_int_equal(ms_llama2c_tok_init(&tok, p, 4, &err), MS_OK);
    check_err(ms_llama2c_tok_encode(tok, "a", true, false, &ids, &n, &err), MS_ERR_FORMAT, &err, "nospace.bin",
              "no \" \" token for the dummy prefix");
    ms_llama2c_tok_free(tok);
    tok = NULL;
    p = write_tok("long.bin", 1, good, MS_ARRAY_LEN(good));
    check_err(ms_llama2c_tok_init(&tok, p, 8, &err), MS_ERR_FORMAT, &err, "long.bin",
              "token 0 has length 5, outside 0 .. max_token_length 1");
    static const char *const nul[] = {"<unk>", "x"};
    p = write_tok("nul.bin", 5, nul, 2);
    {
        /* patch token 1's byte to NUL */
        FILE *fp = fopen(p, "r+b");
        assert_non_null(fp);
        fseek(fp, -1, SEEK_END);
        fputc(0, fp);
        fclose(fp);
    }
    check_err(ms_llama2c_tok_init(&tok, p, 2, &err), MS_ERR_FORMAT, &err, "nul.bin", "token 1 contains a NUL byte");
    p = write_tok("maxlen.bin", 0, good, 1);
    check_err(ms_llama2c_tok_init(&tok, p, 1, &err), MS_ERR_FORMAT, &err, "maxlen.bin", "max_token_length 0");
    unsigned char negrec[12] = {5, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff};
    p = write_bytes("neglen.bin", negrec, sizeof negrec);
    check_err(ms_llama2c_tok_init(&tok, p, 1, &err), MS_ERR_FORMAT, &err, "neglen.bin", "token 0 has length -1");
}

/* Seeded random corruption of tok512.bin: init fails with one line naming the file, or succeeds and
 * encode/decode stay in bounds (ASan/UBSan in make test). */
static void test_tokenizer_corruption_never_crashes(void **state) {
    (void)state;
    size_t size;
    unsigned char *orig = read_fixture(TOKENIZER, &size);
    unsigned char *buf = malloc(size);
    assert_non_null(buf);
    uint64_t rng = 777;
    int ok = 0, bad = 0;
    for (int iter = 0; iter < 200; iter++) {
        memcpy(buf, orig, size);
        size_t len = size;
        for (int e = 0; e < 3; e++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            size_t pos = (size_t)(rng >> 33) % len;
            switch ((rng >> 20) % 4) {
            case 0: buf[pos] = (unsigned char)(rng >> 8); break;
            case 1: buf[pos] ^= 0x80; break;
            case 2: if (iter % 4 == 0) len = pos + 1; break;
            default: buf[pos] = (unsigned char)(pos % 2 ? '<' : ' '); break;
            }
        }
        const char *p = write_bytes("mut.bin", buf, len);
        ms_error err = {0};
        ms_llama2c_tok *tok = NULL;
        ms_status st = ms_llama2c_tok_init(&tok, p, 512, &err);
        if (st != MS_OK) {
            assert_null(tok);
            assert_non_null(strstr(err.msg, "mut.bin"));
            assert_null(strchr(err.msg, '\n'));
            bad++;
            continue;
        }
        int32_t *ids = NULL;
        size_t n = 0;
        st = ms_llama2c_tok_encode(tok, "Once upon a time, \xc3\xa9t\xc3\xa9 <0x41>!", true, true, &ids, &n, &err);
        if (st == MS_OK) {
            for (size_t i = 1; i < n; i++)
                assert_non_null(ms_llama2c_tok_decode(tok, ids[i - 1], ids[i]));
            ms_free(ids);
        }
        for (int id = 0; id < 512; id++)
            (void)ms_llama2c_tok_piece_printable(ms_llama2c_tok_decode(tok, 1, id));
        ms_llama2c_tok_free(tok);
        ok++;
    }
    printf("  corruption: %d rejected, %d still loadable\n", bad, ok);
    assert_true(bad > 20 && ok > 20);
    free(buf);
    free(orig);
}

static void test_tokenizer_survives_allocation_failures(void **state) {
    (void)state;
    int failures = 0;
    for (int64_t k = 1; k < 50; k++) {
        ms_error err = {0};
        ms_llama2c_tok *tok = NULL;
        ms_alloc_fail_nth(k);
        ms_status st = ms_llama2c_tok_init(&tok, ms_test_fixture(TOKENIZER), 512, &err);
        ms_alloc_fail_nth(0);
        if (st == MS_OK) {
            int32_t *ids;
            size_t n;
            ms_alloc_fail_nth(1);
            assert_int_equal(ms_llama2c_tok_encode(tok, "hello", true, false, &ids, &n, &err), MS_ERR_OOM);
            ms_alloc_fail_nth(0);
            ms_llama2c_tok_free(tok);
            break;
        }
        assert_int_equal(st, MS_ERR_OOM);
        failures++;
    }
    assert_true(failures >= 5);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_header_and_weight_layout),
        ms_unit_test(test_checkpoint_and_config_from_bin),
        tmp_test(test_unshared_classifier),
        tmp_test(test_bad_llama2c_files),
        ms_unit_test(test_llama2c_survives_allocation_failures),
        ms_unit_test(test_tokenizer_vocab),
        ms_unit_test(test_tokenizer_matches_golden),
        ms_unit_test(test_tokenizer_encode_edges),
        ms_unit_test(test_tokenizer_merge_order_and_speed),
        tmp_test(test_bad_tokenizer_files),
        tmp_test(test_tokenizer_corruption_never_crashes),
        ms_unit_test(test_tokenizer_survives_allocation_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
