/*
 * test_engine_llama.c - end-to-end tests of the engine with the hand-written Llama descriptor
 * (the one mstarc generates from models/llama.mstar), real resources (KV pool, positions, step runner) and the CPU backend,
 * against ../shared/fixtures:
 *   - llama2c/aidreams260K: the 4 golden cases token-exact for all 128 steps, ids and text;
 *   - hf/llama_gqa, llama31_rope, llama31_rope_legacy, mistral_window: prefill logits at every
 *     prompt position (chunked prefill of 1) and at the last one (whole prompt), decode logits,
 *     all within 1e-3 max abs, and every greedy id;
 *   - batching: the four llama_gqa prompts in ONE ragged batch give the ids they give alone, with
 *     page sizes 4, 16 and 128;
 *   - edges: max_new_tokens 0 and 1, prompt longer than the context, generation reaching it, a
 *     checkpoint split into two shards with an index, pages returned after remove, seeded
 *     sampling independent of the batch, allocation failures during init.
 */
#include "ms_test.h"
#include "ms_test_impl.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "engine.h"
#ifdef MS_HAVE_CUDA
#include "backend_cuda.h"
#endif
#include "safetensors.h"
#include "tokenizer_llama2c.h"

extern const ms_model_desc ms_llama_desc;

#define TOL 1e-3f

/* ---- reference.safetensors (holds I32 tensors, which the model loaders reject on purpose) ---- */

typedef struct ref_file {
    unsigned char *bytes; /* whole file */
    size_t size;
    json_t *header;
    size_t data_at;       /* 8 + header length */
} ref_file;

static void ref_open(ref_file *r, const char *fixture) {
    memset(r, 0, sizeof *r);
    const char *path = ms_test_fixture(fixture);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    r->size = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    r->bytes = ms_malloc(r->size);
    assert_non_null(r->bytes);
    assert_int_equal(fread(r->bytes, 1, r->size, f), r->size);
    fclose(f);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | r->bytes[i];
    json_error_t je;
    r->header = json_loadb((const char *)r->bytes + 8, (size_t)n, 0, &je);
    assert_non_null(r->header);
    r->data_at = 8 + (size_t)n;
}

static void ref_close(ref_file *r) {
    json_decref(r->header);
    ms_free(r->bytes);
}

/* Data of tensor `name` (copied into a fresh ms_malloc'd buffer), element count in *n, rows. */
static void *ref_get(const ref_file *r, const char *name, size_t *n, int64_t *rows) {
    json_t *t = json_object_get(r->header, name);
    if (t == NULL)
        return NULL;
    json_t *off = json_object_get(t, "data_offsets");
    size_t b = (size_t)json_integer_value(json_array_get(off, 0));
    size_t e = (size_t)json_integer_value(json_array_get(off, 1));
    json_t *shape = json_object_get(t, "shape");
    if (rows != NULL)
        *rows = json_integer_value(json_array_get(shape, 0));
    void *p = ms_malloc(e - b);
    assert_non_null(p);
    memcpy(p, r->bytes + r->data_at + b, e - b);
    *n = (e - b) / 4;
    return p;
}

static float max_abs_diff(const float *a, const float *b, size_t n) {
    float m = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float d = fabsf(a[i] - b[i]);
        if (!(d <= m))
            m = isnan(d) ? INFINITY : d;
    }
    return m;
}

/* ---- engine helpers ---- */

static ms_engine *open_engine(const char *path, int32_t page_size, int32_t max_seqs,
                              int32_t max_tokens) {
    ms_engine_options o = ms_engine_options_default();
    o.model_path = path;
    o.page_size = page_size;
    o.max_seqs = max_seqs;
    o.max_tokens = max_tokens;
    o.n_threads = 2;
    ms_engine *e = NULL;
    ms_error err = {0};
    ms_status st = ms_engine_init(&e, &ms_llama_desc, &o, &err);
    if (st != MS_OK)
        fail_msg("engine init %s: %s", path, err.msg);
    return e;
}

static ms_rid add_req(ms_engine *e, const int32_t *ids, int32_t n, int32_t max_new, int32_t chunk,
                      ms_sampling_params sp) {
    ms_engine_request rq = {.prompt = ids, .n_prompt = n, .max_new_tokens = max_new,
                            .sampling = sp, .ignore_eos = true, .prefill_chunk = chunk};
    ms_rid rid = 0;
    ms_error err = {0};
    if (ms_engine_add(e, &rq, &rid, &err) != MS_OK)
        fail_msg("add: %s", err.msg);
    return rid;
}

static void run_all(ms_engine *e) {
    ms_error err = {0};
    while (ms_engine_n_active(e) > 0)
        if (ms_engine_step(e, NULL, &err) != MS_OK)
            fail_msg("step: %s", err.msg);
}

/* Generate greedily for one prompt alone; copy the ids into out (cap). Returns the count. */
static int32_t gen_ids(ms_engine *e, const int32_t *ids, int32_t n, int32_t max_new, int32_t *out,
                       int32_t cap, ms_finish_reason *why) {
    ms_rid rid = add_req(e, ids, n, max_new, 0, ms_sampling_greedy());
    run_all(e);
    const int32_t *o;
    int32_t k;
    assert_int_equal(ms_engine_output(e, rid, &o, &k, why), MS_OK);
    assert_true(k <= cap);
    memcpy(out, o, (size_t)k * sizeof *o);
    ms_engine_remove(e, rid);
    return k;
}

/* ---- llama2.c golden ---- */

static void test_llama2c_golden(void **state) {
    (void)state;
    json_error_t je;
    json_t *g = json_load_file(ms_test_fixture("llama2c/aidreams260K.golden.json"), 0, &je);
    assert_non_null(g);
    ms_engine *e = open_engine(ms_test_fixture("llama2c/aidreams260K.bin"), 0, 1, 256);
    ms_llama2c_tok *tok = NULL;
    ms_error err = {0};
    assert_int_equal(ms_llama2c_tok_init(&tok, ms_test_fixture("llama2c/tok512.bin"), 512, &err),
                     MS_OK);
    json_t *cases = json_object_get(g, "cases");
    assert_int_equal(json_array_size(cases), 4);
    for (size_t c = 0; c < json_array_size(cases); c++) {
        json_t *cs = json_array_get(cases, c);
        const char *prompt = json_string_value(json_object_get(cs, "prompt"));
        int32_t steps = (int32_t)json_integer_value(json_object_get(cs, "steps"));
        json_t *gold = json_object_get(cs, "token_ids");
        int32_t *ids;
        size_t n;
        assert_int_equal(ms_llama2c_tok_encode(tok, prompt, true, false, &ids, &n, &err), MS_OK);
        /* run.c: one forward per position < steps; each position after the prompt samples */
        int32_t max_new = steps - (int32_t)n + 1;
        ms_engine_request rq = {.prompt = ids, .n_prompt = (int32_t)n, .max_new_tokens = max_new,
                                .sampling = ms_sampling_greedy()};
        ms_rid rid;
        assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_OK);
        run_all(e);
        const int32_t *out;
        int32_t n_out;
        ms_finish_reason why;
        assert_int_equal(ms_engine_output(e, rid, &out, &n_out, &why), MS_OK);
        assert_int_equal(n_out, max_new);
        assert_int_equal(why, MS_FINISH_LENGTH);
        assert_int_equal(json_array_size(gold), (size_t)steps);
        /* ids: the whole sequence the model saw */
        for (int32_t i = 0; i < steps; i++) {
            int32_t want = (int32_t)json_integer_value(json_array_get(gold, (size_t)i));
            int32_t got = i < (int32_t)n ? ids[i] : out[i - (int32_t)n];
            if (want != got)
                fail_msg("case %zu: id %d: got %d, golden %d", c, (int)i, (int)got, (int)want);
        }
        /* text: what run.c printed */
        char text[8192];
        size_t tl = 0;
        int prev = ids[0];
        for (int32_t i = 1; i < (int32_t)n + n_out; i++) {
            int t = i < (int32_t)n ? ids[i] : out[i - (int32_t)n];
            const char *piece = ms_llama2c_tok_decode(tok, prev, t);
            if (ms_llama2c_tok_piece_printable(piece)) {
                size_t pl = strlen(piece);
                assert_true(tl + pl + 2 < sizeof text);
                memcpy(text + tl, piece, pl);
                tl += pl;
            }
            prev = t;
        }
        text[tl++] = '\n';
        text[tl] = '\0';
        assert_string_equal(text, json_string_value(json_object_get(cs, "text")));
        ms_engine_remove(e, rid);
        ms_free(ids);
    }
    ms_llama2c_tok_free(tok);
    ms_engine_free(e);
    json_decref(g);
}

/* ---- Hugging Face fixtures ---- */

/* Every prompt of `fx`: whole-prompt prefill + decode against the reference (logits and ids),
 * then the prompt fed one token per step against every prefill row. */
static void check_hf_fixture(const char *fx, int32_t page_size) {
    char path[512];
    snprintf(path, sizeof path, "hf/%s/reference.safetensors", fx);
    ref_file ref;
    ref_open(&ref, path);
    snprintf(path, sizeof path, "hf/%s", fx);
    ms_engine *e = open_engine(ms_test_fixture(path), page_size, 1, 256);
    const int32_t V = ms_engine_facts(e)->vocab;
    for (int p = 0;; p++) {
        char name[64];
        size_t n_in, n_pre, n_dec, n_greedy;
        int64_t rows_dec = 0;
        snprintf(name, sizeof name, "p%d.input_ids", p);
        int32_t *in = ref_get(&ref, name, &n_in, NULL);
        if (in == NULL) {
            assert_true(p > 0);
            break;
        }
        snprintf(name, sizeof name, "p%d.prefill_logits", p);
        float *pre = ref_get(&ref, name, &n_pre, NULL);
        snprintf(name, sizeof name, "p%d.decode_logits", p);
        float *dec = ref_get(&ref, name, &n_dec, &rows_dec);
        snprintf(name, sizeof name, "p%d.greedy_ids", p);
        int32_t *greedy = ref_get(&ref, name, &n_greedy, NULL);
        assert_non_null(pre);
        assert_non_null(dec);
        assert_non_null(greedy);
        assert_int_equal(n_pre, n_in * (size_t)V);
        const int32_t N = (int32_t)n_greedy;
        assert_int_equal(rows_dec, N);

        /* whole prompt in one step, then N decode steps (decode j feeds greedy[j - 1]) */
        ms_rid rid = add_req(e, in, (int32_t)n_in, N + 1, 0, ms_sampling_greedy());
        ms_error err = {0};
        for (int32_t s = 0; s <= N; s++) {
            assert_int_equal(ms_engine_step(e, NULL, &err), MS_OK);
            const float *lg = ms_engine_last_logits(e, rid);
            assert_non_null(lg);
            const float *want = s == 0 ? pre + (n_in - 1) * (size_t)V
                                       : dec + (size_t)(s - 1) * (size_t)V;
            float d = max_abs_diff(lg, want, (size_t)V);
            if (!(d < TOL))
                fail_msg("%s p%d: %s logits of step %d differ by %g", fx, p,
                         s == 0 ? "prefill" : "decode", (int)s, (double)d);
            const int32_t *out;
            int32_t n_out;
            assert_int_equal(ms_engine_output(e, rid, &out, &n_out, NULL), MS_OK);
            assert_int_equal(n_out, s + 1);
            if (s < N && out[s] != greedy[s])
                fail_msg("%s p%d: greedy id %d: got %d, reference %d", fx, p, (int)s,
                         (int)out[s], (int)greedy[s]);
        }
        assert_int_equal(ms_engine_n_active(e), 0);
        ms_engine_remove(e, rid);

        /* the prompt one token per step: logits at every prompt position */
        rid = add_req(e, in, (int32_t)n_in, 1, 1, ms_sampling_greedy());
        for (size_t i = 0; i < n_in; i++) {
            assert_int_equal(ms_engine_step(e, NULL, &err), MS_OK);
            const float *lg = ms_engine_last_logits(e, rid);
            assert_non_null(lg);
            float d = max_abs_diff(lg, pre + i * (size_t)V, (size_t)V);
            if (!(d < TOL))
                fail_msg("%s p%d: prefill logits at position %zu differ by %g", fx, p, i,
                         (double)d);
        }
        const int32_t *out;
        int32_t n_out;
        assert_int_equal(ms_engine_output(e, rid, &out, &n_out, NULL), MS_OK);
        assert_int_equal(n_out, 1);
        assert_int_equal(out[0], greedy[0]);
        ms_engine_remove(e, rid);

        ms_free(in);
        ms_free(pre);
        ms_free(dec);
        ms_free(greedy);
    }
    ms_engine_free(e);
    ref_close(&ref);
}

static void test_hf_llama_gqa(void **state) {
    (void)state;
    check_hf_fixture("llama_gqa", 16);
}

static void test_hf_llama31_rope(void **state) {
    (void)state;
    check_hf_fixture("llama31_rope", 16);
}

static void test_hf_llama31_rope_legacy(void **state) {
    (void)state;
    check_hf_fixture("llama31_rope_legacy", 16);
}

static void test_hf_mistral_window(void **state) {
    (void)state;
    /* page size 4 < window 8: retention releases whole pages behind the window */
    check_hf_fixture("mistral_window", 4);
    check_hf_fixture("mistral_window", 16);
}

/* ---- batching ---- */

#define GQA_PROMPTS 4
#define GQA_NEW 40

typedef struct gqa_ref {
    ref_file ref;
    int32_t *in[GQA_PROMPTS];
    size_t n[GQA_PROMPTS];
    int32_t *greedy[GQA_PROMPTS];
} gqa_ref;

static void gqa_open(gqa_ref *g) {
    ref_open(&g->ref, "hf/llama_gqa/reference.safetensors");
    for (int p = 0; p < GQA_PROMPTS; p++) {
        char name[64];
        size_t ng;
        snprintf(name, sizeof name, "p%d.input_ids", p);
        g->in[p] = ref_get(&g->ref, name, &g->n[p], NULL);
        snprintf(name, sizeof name, "p%d.greedy_ids", p);
        g->greedy[p] = ref_get(&g->ref, name, &ng, NULL);
        assert_non_null(g->in[p]);
        assert_int_equal(ng, GQA_NEW);
    }
    assert_int_equal(g->n[0], 37);
    assert_int_equal(g->n[1], 5);
    assert_int_equal(g->n[2], 64);
    assert_int_equal(g->n[3], 1);
}

static void gqa_close(gqa_ref *g) {
    for (int p = 0; p < GQA_PROMPTS; p++) {
        ms_free(g->in[p]);
        ms_free(g->greedy[p]);
    }
    ref_close(&g->ref);
}

static void test_batch_ragged_pages(void **state) {
    (void)state;
    gqa_ref g;
    gqa_open(&g);
    /* one at a time */
    int32_t alone[GQA_PROMPTS][GQA_NEW];
    ms_engine *e = open_engine(ms_test_fixture("hf/llama_gqa"), 16, 1, 128);
    for (int p = 0; p < GQA_PROMPTS; p++) {
        ms_finish_reason why;
        assert_int_equal(gen_ids(e, g.in[p], (int32_t)g.n[p], GQA_NEW, alone[p], GQA_NEW, &why),
                         GQA_NEW);
        assert_memory_equal(alone[p], g.greedy[p], sizeof alone[p]);
    }
    ms_engine_free(e);

    static const int32_t page_sizes[] = {4, 16, 128};
    for (size_t k = 0; k < MS_ARRAY_LEN(page_sizes); k++) {
        e = open_engine(ms_test_fixture("hf/llama_gqa"), page_sizes[k], GQA_PROMPTS, 128);
        const int32_t free0 = ms_engine_kv_pages_free(e);
        ms_rid rids[GQA_PROMPTS];
        for (int p = 0; p < GQA_PROMPTS; p++)
            rids[p] = add_req(e, g.in[p], (int32_t)g.n[p], GQA_NEW, 0, ms_sampling_greedy());
        ms_engine_step_info info;
        ms_error err = {0};
        assert_int_equal(ms_engine_step(e, &info, &err), MS_OK);
        /* ONE ragged step holds every prompt */
        assert_int_equal(info.n_seqs, GQA_PROMPTS);
        assert_int_equal(info.n_tokens, 37 + 5 + 64 + 1);
        assert_int_equal(info.n_prefill, GQA_PROMPTS);
        run_all(e);
        for (int p = 0; p < GQA_PROMPTS; p++) {
            const int32_t *out;
            int32_t n_out;
            assert_int_equal(ms_engine_output(e, rids[p], &out, &n_out, NULL), MS_OK);
            assert_int_equal(n_out, GQA_NEW);
            if (memcmp(out, alone[p], sizeof alone[p]) != 0)
                fail_msg("page size %d: prompt %d differs in a batch", (int)page_sizes[k], p);
            ms_engine_remove(e, rids[p]);
        }
        assert_int_equal(ms_engine_kv_pages_free(e), free0);
        ms_engine_free(e);
    }
    gqa_close(&g);
}

/* Continuous batching: prompts joining while others decode, and a token budget smaller than the
 * prompts (chunked prefill), give the same ids. */
static void test_batch_continuous(void **state) {
    (void)state;
    gqa_ref g;
    gqa_open(&g);
    ms_engine *e = open_engine(ms_test_fixture("hf/llama_gqa"), 4, GQA_PROMPTS, 24);
    ms_rid rids[GQA_PROMPTS];
    ms_error err = {0};
    rids[0] = add_req(e, g.in[0], (int32_t)g.n[0], GQA_NEW, 0, ms_sampling_greedy());
    for (int s = 0; s < 3; s++)
        assert_int_equal(ms_engine_step(e, NULL, &err), MS_OK);
    for (int p = 1; p < GQA_PROMPTS; p++)
        rids[p] = add_req(e, g.in[p], (int32_t)g.n[p], GQA_NEW, 0, ms_sampling_greedy());
    run_all(e);
    for (int p = 0; p < GQA_PROMPTS; p++) {
        const int32_t *out;
        int32_t n_out;
        assert_int_equal(ms_engine_output(e, rids[p], &out, &n_out, NULL), MS_OK);
        assert_int_equal(n_out, GQA_NEW);
        assert_memory_equal(out, g.greedy[p], GQA_NEW * sizeof(int32_t));
        ms_engine_remove(e, rids[p]);
    }
    ms_engine_free(e);
    gqa_close(&g);
}

/* The decode hot path allocates nothing in steady state: once the engine has served a batch of
 * this shape (the KV pool grows its plan buffers at admit, amortised), a second batch's decode
 * steps make no host allocation in admit, plan, forward, sampling or commit. Page size 16 keeps
 * every stream within the KV pool's initial page-list capacity (8 pages): the pool still grows a
 * stream's page list at admit when it passes that (amortised doubling; a per-stream reserve in
 * ms_kv_pool_config would remove it). */
static void test_decode_allocates_nothing(void **state) {
    (void)state;
    gqa_ref g;
    gqa_open(&g);
    ms_engine *e = open_engine(ms_test_fixture("hf/llama_gqa"), 16, GQA_PROMPTS, 128);
    ms_rid rids[GQA_PROMPTS];
    ms_error err = {0};
    for (int round = 0; round < 2; round++) {
        for (int p = 0; p < GQA_PROMPTS; p++)
            rids[p] = add_req(e, g.in[p], (int32_t)g.n[p], GQA_NEW, 0, ms_sampling_greedy());
        for (int s = 0; s < 2; s++) /* prefill, first decode */
            assert_int_equal(ms_engine_step(e, NULL, &err), MS_OK);
        int64_t before = ms_alloc_get_stats().total_allocs;
        ms_engine_step_info info;
        for (int s = 0; s < GQA_NEW - 2; s++) {
            assert_int_equal(ms_engine_step(e, &info, &err), MS_OK);
            assert_int_equal(info.n_tokens, GQA_PROMPTS);
        }
        if (round == 1)
            assert_int_equal(ms_alloc_get_stats().total_allocs, before);
        assert_int_equal(ms_engine_n_active(e), 0);
        for (int p = 0; p < GQA_PROMPTS; p++) {
            const int32_t *out;
            int32_t n_out;
            assert_int_equal(ms_engine_output(e, rids[p], &out, &n_out, NULL), MS_OK);
            assert_memory_equal(out, g.greedy[p], GQA_NEW * sizeof(int32_t));
            ms_engine_remove(e, rids[p]);
        }
    }
    ms_engine_free(e);
    gqa_close(&g);
}

/* ---- edges ---- */

static void test_max_new_tokens_0_and_1(void **state) {
    (void)state;
    ms_engine *e = open_engine(ms_test_fixture("hf/llama_gqa"), 16, 2, 64);
    const int32_t ids[] = {1, 5, 9, 200};
    int32_t out[4];
    ms_finish_reason why;
    assert_int_equal(gen_ids(e, ids, 4, 0, out, 4, &why), 0);
    assert_int_equal(why, MS_FINISH_LENGTH);
    assert_int_equal(gen_ids(e, ids, 4, 1, out, 4, &why), 1);
    assert_int_equal(why, MS_FINISH_LENGTH);
    ms_engine_free(e);
}

static void test_context_limits(void **state) {
    (void)state;
    ms_engine *e = open_engine(ms_test_fixture("llama2c/aidreams260K.bin"), 16, 1, 256);
    const int32_t ctx = ms_engine_facts(e)->max_context;
    assert_int_equal(ctx, 128);
    int32_t ids[160];
    for (int i = 0; i < 160; i++)
        ids[i] = 3 + (i * 7) % 500;
    ids[0] = 1;
    const int32_t free0 = ms_engine_kv_pages_free(e);

    /* a prompt longer than the context: refused with a clear message */
    ms_engine_request rq = {.prompt = ids, .n_prompt = ctx + 1, .max_new_tokens = 4,
                            .sampling = ms_sampling_greedy(), .ignore_eos = true};
    ms_rid rid;
    ms_error err = {0};
    assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_ERR_LIMIT);
    assert_non_null(strstr(err.msg, "prompt of 129 tokens is longer than the model's context "
                                    "(128 positions)"));
    assert_int_equal(ms_engine_n_active(e), 0);

    /* generation reaching the context stops with MS_FINISH_CONTEXT: 120 prompt tokens feed
     * positions 0..119, then decode feeds 120..127: 9 ids */
    int32_t out[64];
    ms_finish_reason why;
    int32_t n = gen_ids(e, ids, 120, 50, out, 64, &why);
    assert_int_equal(n, 9);
    assert_int_equal(why, MS_FINISH_CONTEXT);
    /* a prompt that fills the context exactly gets the one id of its last position */
    n = gen_ids(e, ids, ctx, 50, out, 64, &why);
    assert_int_equal(n, 1);
    assert_int_equal(why, MS_FINISH_CONTEXT);
    /* max_new exactly up to the context: LENGTH wins */
    n = gen_ids(e, ids, 120, 9, out, 64, &why);
    assert_int_equal(n, 9);
    assert_int_equal(why, MS_FINISH_LENGTH);
    assert_int_equal(ms_engine_kv_pages_free(e), free0);
    ms_engine_free(e);
}

/* ---- shards ---- */

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, n, f), n);
    fclose(f);
}

static void copy_file(const char *from, const char *to) {
    FILE *f = fopen(from, "rb");
    assert_non_null(f);
    char *buf = ms_malloc(1 << 20);
    assert_non_null(buf);
    size_t n = fread(buf, 1, 1 << 20, f);
    fclose(f);
    write_file(to, buf, n);
    ms_free(buf);
}

/* Write the tensors of `ck` with index in [lo, hi) into a safetensors file. */
static void write_shard(const ms_ckpt *ck, size_t lo, size_t hi, const char *path) {
    ms_st_writer *w = NULL;
    ms_error err = {0};
    assert_int_equal(ms_st_writer_init(&w, path, &err), MS_OK);
    for (size_t i = lo; i < hi; i++) {
        const ms_st_tensor *t = ms_ckpt_tensor_at(ck, i);
        assert_int_equal(ms_st_writer_add_tensor(w, t->name, t->dtype, t->n_dims, t->shape, &err),
                         MS_OK);
    }
    for (size_t i = lo; i < hi; i++) {
        const ms_st_tensor *t = ms_ckpt_tensor_at(ck, i);
        assert_int_equal(ms_st_writer_write(w, t->data, t->n_bytes, &err), MS_OK);
    }
    assert_int_equal(ms_st_writer_finish(w, &err), MS_OK);
    ms_st_writer_free(w);
}

static void test_sharded_checkpoint(void **state) {
    (void)state;
    gqa_ref g;
    gqa_open(&g);
    char dir[] = "/tmp/ms_engine_shards_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char p1[256], p2[256], idx[256], cfg[256];
    snprintf(p1, sizeof p1, "%s/model-00001-of-00002.safetensors", dir);
    snprintf(p2, sizeof p2, "%s/model-00002-of-00002.safetensors", dir);
    snprintf(idx, sizeof idx, "%s/model.safetensors.index.json", dir);
    snprintf(cfg, sizeof cfg, "%s/config.json", dir);
    ms_ckpt *ck = NULL;
    ms_error err = {0};
    assert_int_equal(ms_ckpt_init(&ck, ms_test_fixture("hf/llama_gqa/model.safetensors"), &err),
                     MS_OK);
    size_t n = ms_ckpt_n_tensors(ck), half = n / 2;
    write_shard(ck, 0, half, p1);
    write_shard(ck, half, n, p2);
    json_t *map = json_object();
    for (size_t i = 0; i < n; i++)
        json_object_set_new(map, ms_ckpt_tensor_at(ck, i)->name,
                            json_string(i < half ? "model-00001-of-00002.safetensors"
                                                 : "model-00002-of-00002.safetensors"));
    json_t *index = json_pack("{s:{}, s:o}", "metadata", "weight_map", map);
    assert_int_equal(json_dump_file(index, idx, 0), 0);
    json_decref(index);
    ms_ckpt_free(ck);
    copy_file(ms_test_fixture("hf/llama_gqa/config.json"), cfg);

    ms_engine *e = open_engine(dir, 16, 1, 128);
    for (int p = 0; p < GQA_PROMPTS; p++) {
        int32_t out[GQA_NEW];
        ms_finish_reason why;
        assert_int_equal(gen_ids(e, g.in[p], (int32_t)g.n[p], GQA_NEW, out, GQA_NEW, &why),
                         GQA_NEW);
        assert_memory_equal(out, g.greedy[p], sizeof out);
    }
    ms_engine_free(e);
    /* the index file itself is a valid model path too */
    e = open_engine(idx, 16, 1, 128);
    int32_t out[GQA_NEW];
    ms_finish_reason why;
    gen_ids(e, g.in[1], (int32_t)g.n[1], GQA_NEW, out, GQA_NEW, &why);
    assert_memory_equal(out, g.greedy[1], sizeof out);
    ms_engine_free(e);
    unlink(p1);
    unlink(p2);
    unlink(idx);
    unlink(cfg);
    rmdir(dir);
    gqa_close(&g);
}

/* ---- sampling ---- */

static void test_seeded_sampling_batch_independent(void **state) {
    (void)state;
    gqa_ref g;
    gqa_open(&g);
    ms_sampling_params sp = {.temperature = 0.9f, .top_k = 40, .top_p = 0.9f, .seed = 42};
    ms_engine *e = open_engine(ms_test_fixture("hf/llama_gqa"), 16, GQA_PROMPTS, 128);
    int32_t alone[GQA_PROMPTS][16];
    for (int p = 0; p < GQA_PROMPTS; p++) {
        sp.seed = 42 + (uint64_t)p;
        ms_rid rid = add_req(e, g.in[p], (int32_t)g.n[p], 16, 0, sp);
        run_all(e);
        const int32_t *out;
        int32_t n_out;
        assert_int_equal(ms_engine_output(e, rid, &out, &n_out, NULL), MS_OK);
        assert_int_equal(n_out, 16);
        memcpy(alone[p], out, sizeof alone[p]);
        ms_engine_remove(e, rid);
    }
    /* sampling is not greedy here: at least one prompt differs from the argmax ids */
    bool differs = false;
    for (int p = 0; p < GQA_PROMPTS; p++)
        differs = differs || memcmp(alone[p], g.greedy[p], sizeof alone[p]) != 0;
    assert_true(differs);
    ms_rid rids[GQA_PROMPTS];
    for (int p = 0; p < GQA_PROMPTS; p++) {
        sp.seed = 42 + (uint64_t)p;
        rids[p] = add_req(e, g.in[p], (int32_t)g.n[p], 16, 0, sp);
    }
    run_all(e);
    for (int p = 0; p < GQA_PROMPTS; p++) {
        const int32_t *out;
        int32_t n_out;
        assert_int_equal(ms_engine_output(e, rids[p], &out, &n_out, NULL), MS_OK);
        assert_memory_equal(out, alone[p], sizeof alone[p]);
        ms_engine_remove(e, rids[p]);
    }
    ms_engine_free(e);
    gqa_close(&g);
}

/* Stop on the checkpoint's eos ids (llama_gqa: 2): the run stops at the first eos the same
 * request produces with ignore_eos, and keeps that id as its last output. */
static void test_stop_on_eos(void **state) {
    (void)state;
    ms_engine *e = open_engine(ms_test_fixture("hf/llama_gqa"), 16, 1, 64);
    const ms_md_facts *fa = ms_engine_facts(e);
    assert_int_equal(fa->n_eos, 1);
    assert_int_equal(fa->eos_ids[0], 2);
    const int32_t ids[] = {1, 40, 41};
    ms_sampling_params sp = {.temperature = 1.5f, .top_k = 0, .top_p = 1.0f, .seed = 3};
    ms_engine_request rq = {.prompt = ids, .n_prompt = 3, .max_new_tokens = 400,
                            .sampling = sp, .ignore_eos = true};
    ms_rid rid;
    ms_error err = {0};
    assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_OK);
    run_all(e);
    const int32_t *out;
    int32_t n_out;
    ms_finish_reason why;
    assert_int_equal(ms_engine_output(e, rid, &out, &n_out, &why), MS_OK);
    assert_int_equal(n_out, 400);
    assert_int_equal(why, MS_FINISH_LENGTH);
    int32_t first = -1;
    for (int32_t i = 0; i < n_out && first < 0; i++)
        if (out[i] == 2)
            first = i;
    assert_true(first >= 0); /* this seed samples an eos within 400 tokens */
    int32_t *prefix = ms_malloc((size_t)(first + 1) * sizeof *prefix);
    assert_non_null(prefix);
    memcpy(prefix, out, (size_t)(first + 1) * sizeof *prefix);
    ms_engine_remove(e, rid);
    rq.ignore_eos = false;
    assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_OK);
    run_all(e);
    assert_int_equal(ms_engine_output(e, rid, &out, &n_out, &why), MS_OK);
    assert_int_equal(why, MS_FINISH_EOS);
    assert_int_equal(n_out, first + 1);
    assert_memory_equal(out, prefix, (size_t)(first + 1) * sizeof *prefix);
    ms_engine_remove(e, rid);
    ms_free(prefix);
    ms_engine_free(e);
}

/* ---- failures ---- */

/* A forward that fails on demand (the op errors a backend reports). */
static int g_fail_forward_at = -1; /* forward call index that fails, -1 never */
static int g_forward_calls;

static ms_status failing_forward(const ms_md_forward_args *a, ms_error *err) {
    if (g_forward_calls++ == g_fail_forward_at)
        return MS_FAIL(err, MS_ERR_INTERNAL, "injected forward failure");
    return ms_llama_desc.nodes[0].forward(a, err);
}

/* A step whose forward fails is abandoned: nothing it reserved stays, and retrying it gives the
 * same ids as a run that never failed (KV lengths, positions and draw counters untouched). */
static void test_failed_step_is_abandoned(void **state) {
    (void)state;
    gqa_ref g;
    gqa_open(&g);
    ms_model_desc d = ms_llama_desc;
    ms_md_node node = ms_llama_desc.nodes[0];
    node.forward = failing_forward;
    d.nodes = &node;
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture("hf/llama_gqa");
    o.page_size = 4;
    o.max_seqs = 2;
    o.max_tokens = 128;
    ms_engine *e = NULL;
    ms_error err = {0};
    assert_int_equal(ms_engine_init(&e, &d, &o, &err), MS_OK);
    const int32_t free0 = ms_engine_kv_pages_free(e);
    g_forward_calls = 0;
    g_fail_forward_at = 0; /* the prefill */
    ms_rid r0 = add_req(e, g.in[0], (int32_t)g.n[0], GQA_NEW, 0, ms_sampling_greedy());
    ms_rid r1 = add_req(e, g.in[1], (int32_t)g.n[1], GQA_NEW, 0, ms_sampling_greedy());
    assert_int_equal(ms_engine_step(e, NULL, &err), MS_ERR_INTERNAL);
    assert_non_null(strstr(err.msg, "injected forward failure"));
    assert_int_equal(ms_engine_kv_pages_free(e), free0);
    g_fail_forward_at = 7; /* a decode step */
    assert_int_equal(ms_engine_step(e, NULL, &err), MS_OK);
    ms_status st = MS_OK;
    while (ms_engine_n_active(e) > 0) {
        st = ms_engine_step(e, NULL, &err);
        if (st != MS_OK) {
            assert_int_equal(st, MS_ERR_INTERNAL);
            g_fail_forward_at = -1;
        }
    }
    assert_int_equal(g_fail_forward_at, -1); /* the decode failure happened */
    const int32_t *out;
    int32_t n_out;
    assert_int_equal(ms_engine_output(e, r0, &out, &n_out, NULL), MS_OK);
    assert_memory_equal(out, g.greedy[0], GQA_NEW * sizeof(int32_t));
    assert_int_equal(ms_engine_output(e, r1, &out, &n_out, NULL), MS_OK);
    assert_memory_equal(out, g.greedy[1], GQA_NEW * sizeof(int32_t));
    ms_engine_remove(e, r0);
    ms_engine_remove(e, r1);
    assert_int_equal(ms_engine_kv_pages_free(e), free0);
    ms_engine_free(e);
    gqa_close(&g);
}


static void test_device_and_options(void **state) {
    (void)state;
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture("hf/llama_gqa");
    o.device = "cuda";
    ms_engine *e = NULL;
    ms_error err = {0};
#ifdef MS_HAVE_CUDA
    if (!ms_backend_cuda_available()) { /* the GPU path itself is tests/gpu_generate.sh's */
        assert_int_equal(ms_engine_init(&e, &ms_llama_desc, &o, &err), MS_ERR_CUDA);
        assert_non_null(strstr(err.msg, "device 'cuda': cuda:0: no usable CUDA device"));
        assert_null(e);
    }
#else
    assert_int_equal(ms_engine_init(&e, &ms_llama_desc, &o, &err), MS_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "built without CUDA"));
    assert_null(e);
#endif
    o.device = "cpu";
    o.dtype = "f16";
    assert_int_equal(ms_engine_init(&e, &ms_llama_desc, &o, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "unknown dtype 'f16'"));
    o.dtype = NULL;
    o.device = "tpu";
    assert_int_equal(ms_engine_init(&e, &ms_llama_desc, &o, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "tpu"));
    o.device = "cpu";
    o.max_seqs = 0;
    assert_int_equal(ms_engine_init(&e, &ms_llama_desc, &o, &err), MS_ERR_INVALID_ARG);
    o.max_seqs = 2;
    o.model_path = "/nonexistent/model";
    assert_int_equal(ms_engine_init(&e, &ms_llama_desc, &o, &err), MS_ERR_IO);
    assert_non_null(strstr(err.msg, "/nonexistent/model"));

    /* bad requests */
    e = open_engine(ms_test_fixture("hf/llama_gqa"), 16, 1, 64);
    const int32_t bad[] = {1, 512};
    ms_engine_request rq = {.prompt = bad, .n_prompt = 2, .max_new_tokens = 1,
                            .sampling = ms_sampling_greedy()};
    ms_rid rid;
    assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "512"));
    rq.n_prompt = 0;
    assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_ERR_INVALID_ARG);
    rq.n_prompt = 1;
    rq.sampling.top_p = 0.0f;
    assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_ERR_INVALID_ARG);
    rq.sampling = ms_sampling_greedy();
    assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_OK);
    assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_ERR_CAPACITY); /* max_seqs 1 */
    assert_non_null(strstr(err.msg, "max_seqs"));
    ms_engine_free(e); /* frees the running request too */
}

/* The KV arena is sized from max_seq_len; a request that could outgrow it is refused at add with
 * a clear error naming the knob (it could never fit, however many others were offloaded), and
 * one that fits runs and gives its pages back when it is removed. */
static void test_kv_sizing(void **state) {
    (void)state;
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture("hf/llama_gqa");
    o.page_size = 4;
    o.max_seqs = 1;
    o.max_tokens = 16;
    o.max_seq_len = 8;
    ms_engine *e = NULL;
    ms_error err = {0};
    assert_int_equal(ms_engine_init(&e, &ms_llama_desc, &o, &err), MS_OK);
    assert_int_equal(ms_engine_kv_pages_free(e), 2); /* ceil(8 / 4), the sink page apart */
    const int32_t ids[] = {1, 2, 3, 4, 5};
    ms_engine_request rq = {.prompt = ids, .n_prompt = 5, .max_new_tokens = 10,
                            .sampling = ms_sampling_greedy(), .ignore_eos = true};
    ms_rid rid = 0;
    assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_ERR_CAPACITY);
    assert_non_null(strstr(err.msg, "raise kv_pages"));
    assert_non_null(strstr(err.msg, "needs 4 KV pages"));
    rid = add_req(e, ids, 5, 3, 0, ms_sampling_greedy()); /* 8 tokens: 2 pages */
    ms_status st = MS_OK;
    int steps = 0;
    while (st == MS_OK && ms_engine_n_active(e) > 0 && steps++ < 20)
        st = ms_engine_step(e, NULL, &err);
    assert_int_equal(st, MS_OK);
    const int32_t *out;
    int32_t n_out;
    assert_int_equal(ms_engine_output(e, rid, &out, &n_out, NULL), MS_OK);
    assert_int_equal(n_out, 3);
    ms_engine_remove(e, rid);
    assert_int_equal(ms_engine_kv_pages_free(e), 2);
    ms_engine_free(e);
}

/* Every allocation of init failing in turn: an error, never a crash or a leak. */
static void test_init_allocation_failures(void **state) {
    (void)state;
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture("hf/llama31_rope"); /* the tied, llama3-scaled one */
    o.max_seqs = 2;
    o.max_tokens = 64;
    o.n_threads = 1;
    int64_t before = ms_alloc_get_stats().total_allocs;
    ms_engine *e = NULL;
    ms_error err = {0};
    assert_int_equal(ms_engine_init(&e, &ms_llama_desc, &o, &err), MS_OK);
    ms_engine_free(e);
    int64_t n_allocs = ms_alloc_get_stats().total_allocs - before;
    assert_true(n_allocs > 10);
    int failures = 0;
    /* every allocation up to 40, then a spread over the rest (init loads the weights each
     * time: keep the sanitizer builds fast) */
    for (int64_t k = 1; k <= n_allocs; k += (k < 40 ? 1 : MS_MAX(n_allocs / 40, 1))) {
        int64_t live = ms_alloc_get_stats().live_blocks;
        ms_alloc_fail_nth(k);
        ms_status st = ms_engine_init(&e, &ms_llama_desc, &o, &err);
        ms_alloc_fail_nth(0);
        if (st == MS_OK) {
            ms_engine_free(e);
        } else {
            failures++;
            assert_null(e);
            assert_true(err.msg[0] != '\0');
        }
        assert_int_equal(ms_alloc_get_stats().live_blocks, live);
    }
    assert_true(failures > 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_llama2c_golden),
        ms_unit_test(test_hf_llama_gqa),
        ms_unit_test(test_hf_llama31_rope),
        ms_unit_test(test_hf_llama31_rope_legacy),
        ms_unit_test(test_hf_mistral_window),
        ms_unit_test(test_batch_ragged_pages),
        ms_unit_test(test_batch_continuous),
        ms_unit_test(test_decode_allocates_nothing),
        ms_unit_test(test_max_new_tokens_0_and_1),
        ms_unit_test(test_context_limits),
        ms_unit_test(test_sharded_checkpoint),
        ms_unit_test(test_seeded_sampling_batch_independent),
        ms_unit_test(test_stop_on_eos),
        ms_unit_test(test_failed_step_is_abandoned),
        ms_unit_test(test_device_and_options),
        ms_unit_test(test_kv_sizing),
        ms_unit_test(test_init_allocation_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
