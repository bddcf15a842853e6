/*
 * test_codegen_llama.c - the descriptor mstarc generates from models/llama.mstar
 * (build/gen/llama/llama_gen.c, `mstarc build --emit-only`, linked in by tests/build.mk) run by
 * the engine against ../shared/fixtures (the generated descriptor is the reference now; the
 * hand-written one is gone):
 *   - the generated node: labels, steps with their runners, walks;
 *   - hf/llama_gqa, llama31_rope, llama31_rope_legacy, mistral_window: prefill and decode logits
 *     within 1e-3 of the reference, greedy ids equal;
 *   - llama2c/aidreams260K: the 4 golden cases token-exact (ids) for all 128 steps;
 *   - a bad config.json (missing field, wrong type, GQA, odd head_dim, unsupported rope_type, bad
 *     window, an int past int32, theta 0, negative epsilon) fails with a message naming
 *     config.json and the field.
 */
#include "ms_test.h"
#include "ms_test_impl.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "hf_config.h"
#include "tokenizer_llama2c.h"


extern const ms_model_desc ms_llama_desc;

#define TOL 1e-3f

/* ---- reference.safetensors (I32 and F32 tensors; read raw) ---- */

typedef struct ref_file {
    unsigned char *bytes; /* whole file */
    size_t size;
    json_t *header;
    size_t data_at;       /* 8 + header length */
} ref_file;

static void ref_open(ref_file *r, const char *fixture) {
    memset(r, 0, sizeof *r);
    FILE *f = fopen(ms_test_fixture(fixture), "rb");
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

/* Copy of tensor `name` (ms_malloc'd), elements in *n; NULL when absent. */
static void *ref_get(const ref_file *r, const char *name, size_t *n) {
    json_t *t = json_object_get(r->header, name);
    if (t == NULL)
        return NULL;
    json_t *off = json_object_get(t, "data_offsets");
    size_t b = (size_t)json_integer_value(json_array_get(off, 0));
    size_t e = (size_t)json_integer_value(json_array_get(off, 1));
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

static ms_engine *open_engine(const ms_model_desc *d, const char *path, int32_t page_size) {
    ms_engine_options o = ms_engine_options_default();
    o.model_path = path;
    o.page_size = page_size;
    o.max_seqs = 1;
    o.max_tokens = 256;
    o.n_threads = 2;
    ms_engine *e = NULL;
    ms_error err = {0};
    if (ms_engine_init(&e, d, &o, &err) != MS_OK)
        fail_msg("engine init %s (%s): %s", path, d->name, err.msg);
    return e;
}

static ms_rid add_req(ms_engine *e, const int32_t *ids, int32_t n, int32_t max_new,
                      int32_t chunk) {
    ms_engine_request rq = {.prompt = ids, .n_prompt = n, .max_new_tokens = max_new,
                            .sampling = ms_sampling_greedy(), .ignore_eos = true,
                            .prefill_chunk = chunk};
    ms_rid rid = 0;
    ms_error err = {0};
    if (ms_engine_add(e, &rq, &rid, &err) != MS_OK)
        fail_msg("add: %s", err.msg);
    return rid;
}

/* ---- the generated node ---- */

static void test_node_tables(void **state) {
    (void)state;
    const ms_model_desc *g = &ms_llama_desc;
    ms_error err = {0};
    assert_int_equal(ms_md_check_desc(g, &err), MS_OK);
    assert_string_equal(g->name, "llama");
    assert_string_equal(g->source, "models/llama.mstar");
    assert_int_equal(g->n_nodes, 1);
    const ms_md_node *n = &g->nodes[0];
    assert_string_equal(n->name, "decoder");
    assert_string_equal(n->labels[0], "main");
    assert_int_equal(n->n_resources, 4);
    assert_string_equal(n->resources[0].key, "kv");
    assert_string_equal(n->resources[3].key, "sample");
    /* sampler(vocab = vocab_size): its one argument as data */
    assert_int_equal(n->resources[3].n_args, 1);
    assert_string_equal(n->resources[3].args[0].key, "vocab");
    assert_string_equal(n->resources[3].args[0].text, "vocab_size");
    assert_true(n->n_steps >= 2);
    assert_string_equal(n->steps[0].name, "prefill");
    assert_string_equal(n->steps[1].name, "decode");
    assert_true(n->steps[0].capture_by_tokens);
    assert_int_equal(n->steps[1].n_buckets, 9);
    assert_string_equal(g->walks[0].name, "generate");
    assert_int_equal(g->walks[0].n_items, 2);
    assert_int_equal(g->walks[0].items[0].node, 0);
    assert_int_equal(g->walks[0].items[0].step, 0);
    assert_int_equal(g->walks[0].items[1].node, 0);
    assert_int_equal(g->walks[0].items[1].step, 1);
    assert_int_equal(g->walks[0].loop_begin, 1);
}

/* ---- bad config.json: the generated checks name the file and the field ---- */

/* A model folder in a temp dir: llama_gqa's config.json edited by `edit`, its weights linked. */
static void make_model(char *dir, size_t cap, void (*edit)(json_t *cfg)) {
    snprintf(dir, cap, "%s/ms_codegen_cfg_XXXXXX",
             getenv("TMPDIR") != NULL ? getenv("TMPDIR") : "/tmp");
    assert_non_null(mkdtemp(dir));
    json_error_t je;
    json_t *cfg = json_load_file(ms_test_fixture("hf/llama_gqa/config.json"), 0, &je);
    assert_non_null(cfg);
    edit(cfg);
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    assert_int_equal(json_dump_file(cfg, path, 0), 0);
    json_decref(cfg);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    assert_int_equal(symlink(ms_test_fixture("hf/llama_gqa/model.safetensors"), path), 0);
}

static void remove_model(const char *dir) {
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    rmdir(dir);
}

static void edit_no_hidden(json_t *c) { json_object_del(c, "hidden_size"); }
static void edit_kv_heads(json_t *c) { json_object_set_new(c, "num_key_value_heads", json_integer(3)); }
static void edit_rope_type(json_t *c) {
    json_object_set_new(json_object_get(c, "rope_parameters"), "rope_type", json_string("yarn"));
}
static void edit_odd_head_dim(json_t *c) { json_object_set_new(c, "head_dim", json_integer(15)); }
static void edit_window(json_t *c) { json_object_set_new(c, "sliding_window", json_integer(0)); }
static void edit_huge_context(json_t *c) {
    /* 2^32 + 2: was truncated to a context of 2 positions */
    json_object_set_new(c, "max_position_embeddings", json_integer(4294967298LL));
}
static void edit_huge_window(json_t *c) {
    json_object_set_new(c, "sliding_window", json_integer(-4294967296LL));
}
static void edit_theta(json_t *c) {
    /* was "rope: theta 0 must be a positive number", naming neither the file nor the key */
    json_object_set_new(json_object_get(c, "rope_parameters"), "rope_theta", json_real(0.0));
}
static void edit_eps(json_t *c) { json_object_set_new(c, "rms_norm_eps", json_real(-1e-5)); }
static void edit_layers_type(json_t *c) {
    json_object_set_new(c, "num_hidden_layers", json_string("three"));
}

static void test_bad_config_like_reference(void **state) {
    (void)state;
    static const struct {
        void (*edit)(json_t *);
        const char *needle;
    } cases[] = {
        {edit_no_hidden, "hidden_size"},     {edit_kv_heads, "not a multiple of"},
        {edit_rope_type, "rope_type 'yarn'"}, {edit_odd_head_dim, "head_dim (15)"},
        {edit_window, "sliding_window (0)"}, {edit_layers_type, "num_hidden_layers"},
        {edit_huge_context, "max_position_embeddings (4294967298) is out of range"},
        {edit_huge_window, "sliding_window (-4294967296) is out of range"},
        {edit_theta, "rope_theta (0) must be positive"},
        {edit_eps, "rms_norm_eps (-1e-05) must not be negative"},
    };
    for (size_t i = 0; i < MS_ARRAY_LEN(cases); i++) {
        char dir[512];
        make_model(dir, sizeof dir, cases[i].edit);
        ms_engine_options o = ms_engine_options_default();
        o.model_path = dir;
        o.max_seqs = 1;
        o.max_tokens = 64;
        ms_engine *e = NULL;
        ms_error eg = {0};
        ms_status sg = ms_engine_init(&e, &ms_llama_desc, &o, &eg);
        assert_null(e);
        assert_int_not_equal(sg, MS_OK);
        if (strstr(eg.msg, cases[i].needle) == NULL || strstr(eg.msg, "config.json") == NULL)
            fail_msg("case %zu: '%s' lacks '%s' or the file", i, eg.msg, cases[i].needle);
        remove_model(dir);
    }
}

/* ---- Hugging Face fixtures ---- */

static void check_hf_fixture(const char *fx, int32_t page_size) {
    char path[512];
    snprintf(path, sizeof path, "hf/%s/reference.safetensors", fx);
    ref_file ref;
    ref_open(&ref, path);
    snprintf(path, sizeof path, "hf/%s", fx);
    ms_engine *eg = open_engine(&ms_llama_desc, ms_test_fixture(path), page_size);
    const int32_t V = ms_engine_facts(eg)->vocab;
    ms_error err = {0};
    for (int p = 0;; p++) {
        char name[64];
        size_t n_in, n_pre, n_dec, n_greedy;
        snprintf(name, sizeof name, "p%d.input_ids", p);
        int32_t *in = ref_get(&ref, name, &n_in);
        if (in == NULL) {
            assert_true(p > 0);
            break;
        }
        snprintf(name, sizeof name, "p%d.prefill_logits", p);
        float *pre = ref_get(&ref, name, &n_pre);
        snprintf(name, sizeof name, "p%d.decode_logits", p);
        float *dec = ref_get(&ref, name, &n_dec);
        snprintf(name, sizeof name, "p%d.greedy_ids", p);
        int32_t *greedy = ref_get(&ref, name, &n_greedy);
        assert_non_null(pre);
        assert_non_null(dec);
        assert_non_null(greedy);
        const int32_t N = (int32_t)n_greedy;
        assert_int_equal(n_pre, n_in * (size_t)V);
        assert_int_equal(n_dec, (size_t)N * (size_t)V);

        ms_rid rg = add_req(eg, in, (int32_t)n_in, N + 1, 0);
        for (int32_t s = 0; s <= N; s++) {
            assert_int_equal(ms_engine_step(eg, NULL, &err), MS_OK);
            const float *lg = ms_engine_last_logits(eg, rg);
            assert_non_null(lg);
            const float *want = s == 0 ? pre + (n_in - 1) * (size_t)V
                                       : dec + (size_t)(s - 1) * (size_t)V;
            float d = max_abs_diff(lg, want, (size_t)V);
            if (!(d < TOL))
                fail_msg("%s p%d: %s logits of step %d differ by %g", fx, p,
                         s == 0 ? "prefill" : "decode", (int)s, (double)d);
            const int32_t *out;
            int32_t n_out;
            assert_int_equal(ms_engine_output(eg, rg, &out, &n_out, NULL), MS_OK);
            assert_int_equal(n_out, s + 1);
            if (s < N && out[s] != greedy[s])
                fail_msg("%s p%d: greedy id %d: got %d, reference %d", fx, p, (int)s,
                         (int)out[s], (int)greedy[s]);
        }
        ms_engine_remove(eg, rg);
        ms_free(in);
        ms_free(pre);
        ms_free(dec);
        ms_free(greedy);
    }
    ms_engine_free(eg);
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
    check_hf_fixture("mistral_window", 4);
}

/* ---- llama2.c golden ---- */

static void test_llama2c_golden(void **state) {
    (void)state;
    json_error_t je;
    json_t *g = json_load_file(ms_test_fixture("llama2c/aidreams260K.golden.json"), 0, &je);
    assert_non_null(g);
    ms_engine *e = open_engine(&ms_llama_desc, ms_test_fixture("llama2c/aidreams260K.bin"), 0);
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
        int32_t max_new = steps - (int32_t)n + 1;
        ms_engine_request rq = {.prompt = ids, .n_prompt = (int32_t)n, .max_new_tokens = max_new,
                                .sampling = ms_sampling_greedy()};
        ms_rid rid;
        assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_OK);
        while (ms_engine_n_active(e) > 0)
            assert_int_equal(ms_engine_step(e, NULL, &err), MS_OK);
        const int32_t *out;
        int32_t n_out;
        assert_int_equal(ms_engine_output(e, rid, &out, &n_out, NULL), MS_OK);
        assert_int_equal(n_out, max_new);
        assert_int_equal(json_array_size(gold), (size_t)steps);
        for (int32_t i = 0; i < steps; i++) {
            int32_t want = (int32_t)json_integer_value(json_array_get(gold, (size_t)i));
            int32_t got = i < (int32_t)n ? ids[i] : out[i - (int32_t)n];
            if (want != got)
                fail_msg("case %zu: id %d: got %d, golden %d", c, (int)i, (int)got, (int)want);
        }
        ms_engine_remove(e, rid);
        ms_free(ids);
    }
    ms_llama2c_tok_free(tok);
    ms_engine_free(e);
    json_decref(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_node_tables),
        ms_unit_test(test_bad_config_like_reference),
        ms_unit_test(test_hf_llama_gqa),
        ms_unit_test(test_hf_llama31_rope),
        ms_unit_test(test_hf_llama31_rope_legacy),
        ms_unit_test(test_hf_mistral_window),
        ms_unit_test(test_llama2c_golden),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
