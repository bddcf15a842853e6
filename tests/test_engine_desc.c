/*
 * test_engine_desc.c - the model descriptor contract (runtime/engine/model_desc.h): config parameter
 * helpers (sources in order, defaults, optional values, wrong types, checks), name templates,
 * the table checks that catch code generator bugs, run against the generated Llama descriptor
 * (models/llama.mstar) and mutations of it, and the generated step runners and walks.
 */
#include "ms_test.h"
#include "ms_test_impl.h"

#include <string.h>

#include "engine.h"
#include "model_desc.h"

extern const ms_model_desc ms_llama_desc;

/* Index of the weight row `key` of the generated table. */
static int32_t wix(const char *key) {
    for (int32_t i = 0; i < ms_llama_desc.n_weights; i++)
        if (strcmp(ms_llama_desc.weights[i].key, key) == 0)
            return i;
    fail_msg("no weight %s", key);
    return -1;
}

static ms_hf_config *cfg_from(const char *json) {
    ms_hf_config *hf = NULL;
    ms_error err = {0};
    assert_int_equal(ms_hf_config_init_from_string(&hf, "test/config.json", json, &err), MS_OK);
    return hf;
}

static void test_cfg_sources_defaults_optional(void **state) {
    (void)state;
    ms_hf_config *hf = cfg_from("{\"a\": 3, \"rope_parameters\": {\"rope_theta\": 500000.0},"
                                " \"rope_theta\": 10.0, \"flag\": true, \"s\": \"llama3\","
                                " \"bad\": \"x\"}");
    ms_error err = {0};
    static const char *const s_a[] = {"a"};
    static const char *const s_theta[] = {"rope_parameters.rope_theta", "rope_theta"};
    static const char *const s_legacy[] = {"rope_parameters.nope", "rope_theta"};
    static const char *const s_missing[] = {"missing", "also_missing"};
    static const char *const s_flag[] = {"flag"};
    static const char *const s_s[] = {"s"};
    static const char *const s_bad[] = {"bad"};
    int64_t i = 0;
    double f = 0;
    bool b = false, present = false;
    const char *str = NULL;
    assert_int_equal(ms_md_cfg_int(hf, s_a, 1, NULL, &i, NULL, &err), MS_OK);
    assert_int_equal(i, 3);
    /* the first present source wins; the second is the fallback */
    assert_int_equal(ms_md_cfg_float(hf, s_theta, 2, NULL, &f, NULL, &err), MS_OK);
    assert_true(f == 500000.0);
    assert_int_equal(ms_md_cfg_float(hf, s_legacy, 2, NULL, &f, NULL, &err), MS_OK);
    assert_true(f == 10.0);
    /* default */
    const int64_t d = 42;
    assert_int_equal(ms_md_cfg_int(hf, s_missing, 2, &d, &i, &present, &err), MS_OK);
    assert_int_equal(i, 42);
    assert_true(present);
    /* optional without default: absent, value untouched */
    i = 7;
    assert_int_equal(ms_md_cfg_int(hf, s_missing, 2, NULL, &i, &present, &err), MS_OK);
    assert_false(present);
    assert_int_equal(i, 7);
    /* required and missing: names the first source and the file */
    assert_int_equal(ms_md_cfg_int(hf, s_missing, 2, NULL, &i, NULL, &err), MS_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "test/config.json: required field 'missing' is missing"));
    /* wrong type is an error even with a default */
    assert_int_equal(ms_md_cfg_int(hf, s_bad, 1, &d, &i, NULL, &err), MS_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "'bad'"));
    assert_int_equal(ms_md_cfg_bool(hf, s_flag, 1, NULL, &b, NULL, &err), MS_OK);
    assert_true(b);
    assert_int_equal(ms_md_cfg_string(hf, s_s, 1, NULL, &str, NULL, &err), MS_OK);
    assert_string_equal(str, "llama3");
    assert_int_equal(ms_md_cfg_string(hf, s_missing, 2, "default", &str, NULL, &err), MS_OK);
    assert_string_equal(str, "default");
    assert_int_equal(ms_md_cfg_check(hf, true, &err, "never"), MS_OK);
    assert_int_equal(ms_md_cfg_check(hf, false, &err, "x (%d) is odd", 3), MS_ERR_FORMAT);
    assert_string_equal(err.msg, "test/config.json: x (3) is odd");
    ms_hf_config_free(hf);
}

static void test_expand_name(void **state) {
    (void)state;
    char buf[64];
    ms_error err = {0};
    assert_int_equal(ms_md_expand_name("model.layers.{i}.mlp.{i}", 12, buf, sizeof buf, &err),
                     MS_OK);
    assert_string_equal(buf, "model.layers.12.mlp.12");
    assert_int_equal(ms_md_expand_name("model.norm.weight", 3, buf, sizeof buf, &err), MS_OK);
    assert_string_equal(buf, "model.norm.weight");
    char small[8];
    assert_int_equal(ms_md_expand_name("model.layers.{i}", 1, small, sizeof small, &err),
                     MS_ERR_LIMIT);
    assert_int_equal(ms_md_expand_name("a{i}", 100, small, sizeof small, &err), MS_OK);
    assert_string_equal(small, "a100");
}

static void test_llama_desc_tables(void **state) {
    (void)state;
    ms_error err = {0};
    assert_int_equal(ms_md_check_desc(&ms_llama_desc, &err), MS_OK);
    assert_int_equal(ms_llama_desc.n_nodes, 1);
    const ms_md_node *n = &ms_llama_desc.nodes[0];
    assert_string_equal(n->name, "decoder");
    assert_int_equal(ms_md_resource_index(n, "kv"), 0);
    assert_int_equal(ms_md_resource_index(n, "attn"), 2);
    assert_int_equal(ms_md_resource_index(n, "nope"), -1);
    /* every declared argument as data: key and source text, in declaration order */
    const ms_md_resource *kv = &n->resources[0];
    assert_true(kv->n_args >= 4);
    assert_string_equal(kv->args[0].key, "layers");
    assert_string_equal(kv->args[0].text, "num_hidden_layers");
    bool page_size = false;
    for (int32_t i = 0; i < kv->n_args; i++)
        page_size = page_size || (strcmp(kv->args[i].key, "page_size") == 0 &&
                                  strcmp(kv->args[i].text, "16") == 0);
    assert_true(page_size);

    /* shapes under the llama_gqa config: fused QKV = 128 + 2 * 32 rows */
    ms_hf_config *hf = NULL;
    assert_int_equal(ms_hf_config_init(&hf, ms_test_fixture("hf/llama_gqa"), &err), MS_OK);
    void *cfg = ms_calloc(1, ms_llama_desc.config_size);
    assert_int_equal(ms_llama_desc.config_load(hf, cfg, &err), MS_OK);
    assert_int_equal(ms_md_check_shapes(&ms_llama_desc, cfg, &err), MS_OK);
    int64_t shape[4] = {0};
    ms_llama_desc.weight_shape(cfg, wix("layers.wq+wk+wv"), shape);
    assert_int_equal(shape[0], 8 * 16 + 2 * 2 * 16);
    assert_int_equal(shape[1], 128);
    ms_md_facts fa;
    assert_int_equal(ms_llama_desc.facts(cfg, &fa, &err), MS_OK);
    assert_int_equal(fa.n_q_heads, 8);
    assert_int_equal(fa.n_kv_heads, 2);
    assert_int_equal(fa.head_dim, 16);
    assert_int_equal(fa.max_context, 512);
    assert_int_equal(fa.rope.style, MS_ROPE_ROTATE_HALF);
    assert_int_equal(fa.window, 0);
    assert_int_equal(ms_md_check_facts(&ms_llama_desc, &fa, &err), MS_OK);
    /* a zero page size divided the engine by zero (MS_CEIL_DIV): refused with the value */
    fa.page_size = 0;
    assert_int_equal(ms_md_check_facts(&ms_llama_desc, &fa, &err), MS_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "KV page size 0 under this config is not positive"));
    fa.page_size = 16;
    fa.window = -1;
    assert_int_equal(ms_md_check_facts(&ms_llama_desc, &fa, &err), MS_ERR_FORMAT);
    assert_false(ms_llama_desc.weight_tied(cfg, wix("lm_head")));
    ms_free(cfg);
    ms_hf_config_free(hf);
}

/* Each mutation of the tables is a generator bug the check names. */
static void test_desc_check_catches_bugs(void **state) {
    (void)state;
    ms_md_weight w[64];
    ms_md_resource r[4];
    assert_true(ms_llama_desc.n_weights <= 64 && ms_llama_desc.nodes[0].n_resources == 4);
    ms_model_desc d;
    ms_md_node node;
    ms_error err = {0};
    static const struct {
        const char *what;
        int kind; /* 0 weight field, 1 resource, 2 kernel list */
    } cases[] = {
        {"per-layer names must contain {i}", 0}, {"tie must name an earlier", 0},
        {"a part must name a fused entry that lists it", 0}, {"a fused entry needs 2..4 parts", 0},
        {"rank must be 1, 2 or 3", 0}, {"optional exactly when", 0},
        {"not an earlier resource", 1}, {"declared twice", 1}, {"are both of kind", 1},
        {"2 kernel instances without a list", 2}, {"kernel instance 1 has no stem", 2},
    };
    static const char *const stems[] = {"argmax_f32", ""};
    for (size_t c = 0; c < MS_ARRAY_LEN(cases); c++) {
        memcpy(w, ms_llama_desc.weights, (size_t)ms_llama_desc.n_weights * sizeof *w);
        memcpy(r, ms_llama_desc.nodes[0].resources, sizeof r);
        d = ms_llama_desc;
        d.weights = w;
        node = ms_llama_desc.nodes[0];
        node.resources = r;
        d.nodes = &node;
        switch (c) {
        case 0: w[wix("layers.wo")].names[0] = "model.layers.self_attn.o_proj.weight"; break;
        case 1: w[wix("lm_head")].tie = wix("lm_head"); break;
        case 2: w[wix("layers.wq")].fused = wix("layers.w_gate+w_up"); break;
        case 3: w[wix("layers.w_gate+w_up")].n_parts = 5; break;
        case 4: w[wix("final_norm")].rank = 4; break;
        case 5: w[wix("layers.bq+bk+bv")].optional = false; break;
        case 6: r[1].deps[0] = "attn"; break;
        case 7: r[3].key = "kv"; r[3].kind = MS_RESOURCE_SCRATCH; break;
        case 8: r[3].kind = MS_RESOURCE_POS; break;
        case 9: d.kernels = NULL; d.n_kernels = 2; break;
        case 10: d.kernels = stems; d.n_kernels = 2; break;
        }
        assert_int_equal(ms_md_check_desc(&d, &err), MS_ERR_INVALID_ARG);
        if (strstr(err.msg, cases[c].what) == NULL)
            fail_msg("case %zu: '%s' does not say '%s'", c, err.msg, cases[c].what);
        assert_non_null(strstr(err.msg, "model llama"));
    }
    /* a broken descriptor never reaches the loaders */
    d = ms_llama_desc;
    node = ms_llama_desc.nodes[0];
    node.forward = NULL;
    d.nodes = &node;
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture("hf/llama_gqa");
    ms_engine *e = NULL;
    assert_int_equal(ms_engine_init(&e, &d, &o, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "model llama: node decoder: no resource table, "
                                    "workspace_size or forward"));
    assert_null(e);
    /* a descriptor of two nodes runs (tests/test_engine_nodes.c), each node with the resources
       the engine needs: a second node of a KV pool alone is refused naming it, nothing leaks */
    ms_md_node two[2] = {ms_llama_desc.nodes[0], ms_llama_desc.nodes[0]};
    two[1].name = "encoder";
    two[1].n_resources = 1;
    d = ms_llama_desc;
    d.nodes = two;
    d.n_nodes = 2;
    assert_int_equal(ms_md_check_desc(&d, &err), MS_OK);
    assert_int_equal(ms_engine_init(&e, &d, &o, &err), MS_ERR_INVALID_ARG);
    assert_string_equal(err.msg, "model llama: node encoder: the LLM engine needs kv, positions, "
                                 "attention and sampler resources");
    assert_null(e);
    /* two copies of the decoder node: both are built */
    two[1].n_resources = ms_llama_desc.nodes[0].n_resources;
    assert_int_equal(ms_engine_init(&e, &d, &o, &err), MS_OK);
    ms_engine_free(e);
}

/* The generated step runners: llama's guided decode declares both streams label-major under one
 * combined plan label, and the sampler record pairs each row's cond segment with its uncond one. */
static int32_t step_ix(const char *name) {
    const ms_md_node *n = &ms_llama_desc.nodes[0];
    for (int32_t i = 0; i < n->n_steps; i++)
        if (strcmp(n->steps[i].name, name) == 0)
            return i;
    fail_msg("no step %s", name);
    return -1;
}

static void test_step_runners(void **state) {
    (void)state;
    ms_error err = {0};
    ms_md_step_build b;
    assert_int_equal(ms_md_step_build_init(&b, 8, 64, &err), MS_OK);
    ms_md_row rows[2];
    memset(rows, 0, sizeof rows);
    rows[0].rid = 7;
    rows[1].rid = 9;
    for (int r = 0; r < 2; r++) {
        rows[r].len[0] = rows[r].len[1] = 1;
        rows[r].sample = true;
    }
    const ms_md_step *dg = &ms_llama_desc.nodes[0].steps[step_ix("decode_guided")];
    assert_int_equal(dg->n_segments, 2);
    assert_int_equal(dg->run(NULL, rows, 2, &b, &err), MS_OK);
    assert_string_equal(b.step.name, "decode_guided");
    assert_int_equal(b.step.n_segments, 4);
    /* label-major: main of rows 7, 9, then cfg_uncond of rows 7, 9 */
    const ms_rid want_rid[] = {7, 9, 7, 9};
    const ms_label want_label[] = {0, 0, 1, 1};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(b.segments[i].rid, want_rid[i]);
        assert_int_equal(b.segments[i].label, want_label[i]);
        assert_int_equal(b.segments[i].span, 1);
    }
    const ms_kv_step *kv = b.step.records[0].rec;
    assert_true(kv->commit);
    assert_int_equal(kv->n_combined, 1);
    assert_int_equal(kv->combined[0].n_labels, 2);
    assert_int_equal(kv->combined[0].plan_label, 2); /* cfg */
    const ms_pos_step *ps = b.step.records[1].rec;
    assert_non_null(ps->advance);
    assert_int_equal(ps->advance[3], 1);
    const ms_sample_step *ss = b.step.records[3].rec;
    assert_true(ss->sample[0] && ss->sample[1] && !ss->sample[2] && !ss->sample[3]);
    assert_int_equal(ss->guide[0], 2);
    assert_int_equal(ss->guide[1], 3);
    assert_int_equal(ss->guide[2], -1);

    /* plain prefill: spans from len(tokens) of main, the scheme's advance, no guide */
    rows[0].len[0] = 5;
    rows[1].len[0] = 3;
    rows[1].sample = false; /* a prompt chunk */
    const ms_md_step *pf = &ms_llama_desc.nodes[0].steps[step_ix("prefill")];
    assert_int_equal(pf->run(NULL, rows, 2, &b, &err), MS_OK);
    assert_int_equal(b.step.n_segments, 2);
    assert_int_equal(b.n_tokens, 8);
    assert_int_equal(b.segments[1].span, 3);
    ps = b.step.records[1].rec;
    assert_null(ps->advance);
    assert_null(ps->explicit_ids);
    ss = b.step.records[3].rec;
    assert_true(ss->sample[0] && !ss->sample[1]);

    /* capacity: more tokens than the build holds */
    rows[0].len[0] = 100;
    assert_int_equal(pf->run(NULL, rows, 1, &b, &err), MS_ERR_CAPACITY);
    ms_md_step_build_free(&b);
}

/* Explicit position ids ([axes][row tokens], or with a stride) land in packed axis-major order. */
static void test_step_explicit_positions(void **state) {
    (void)state;
    ms_error err = {0};
    ms_md_step_build b;
    assert_int_equal(ms_md_step_build_init(&b, 4, 16, &err), MS_OK);
    /* row 0: 2 tokens, 3 axes; row 1: the last 3 of a 4-token prompt (stride 4), 3 axes */
    static const int32_t ids0[] = {0, 1, 10, 11, 20, 21};
    static const int32_t ids1[] = {100, 101, 102, 103, 110, 111, 112, 113, 120, 121, 122, 123};
    ms_md_row rows[2];
    memset(rows, 0, sizeof rows);
    rows[0] = (ms_md_row){.rid = 1, .sample = true, .position_ids = ids0, .n_position_axes = 3};
    rows[1] = (ms_md_row){.rid = 2, .sample = true, .position_ids = ids1 + 1,
                          .n_position_axes = 3, .position_stride = 4};
    ms_md_step_begin(&b, "explicit", rows);
    assert_int_equal(ms_md_step_segment(&b, 0, 0, 2, -1, &err), MS_OK);
    assert_int_equal(ms_md_step_segment(&b, 1, 0, 3, -1, &err), MS_OK);
    assert_int_equal(ms_md_step_pos(&b, 1, false, true, &err), MS_OK);
    const ms_pos_step *ps = b.step.records[1].rec;
    assert_int_equal(ps->n_axes, 3);
    static const int32_t want[] = {0, 1, 101, 102, 103, 10, 11, 111, 112, 113,
                                   20, 21, 121, 122, 123};
    assert_memory_equal(ps->explicit_ids, want, sizeof want);
    /* a row without ids is refused */
    rows[1].position_ids = NULL;
    assert_int_equal(ms_md_step_pos(&b, 1, false, true, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "request 2 has no explicit position ids"));
    ms_md_step_build_free(&b);
}

/* The walks as data, and the facts carry the sampler's declared defaults. */
static void test_walks_and_sampler_defaults(void **state) {
    (void)state;
    const ms_model_desc *d = &ms_llama_desc;
    assert_int_equal(d->n_walks, 2);
    assert_string_equal(d->walks[1].name, "guided");
    assert_int_equal(d->walks[1].loop_begin, 1);
    assert_int_equal(d->walks[1].n_items, 2);
    assert_int_equal(d->walks[1].items[0].node, 0);
    const ms_md_node *n = &d->nodes[d->walks[1].items[0].node];
    assert_string_equal(n->steps[d->walks[1].items[0].step].name, "prefill_guided");
    assert_string_equal(n->steps[d->walks[1].items[1].step].name, "decode_guided");
    assert_string_equal(n->labels[1], "cfg_uncond");
    assert_string_equal(n->labels[2], "cfg");
    ms_error err = {0};
    ms_hf_config *hf = NULL;
    assert_int_equal(ms_hf_config_init(&hf, ms_test_fixture("hf/llama_gqa"), &err), MS_OK);
    void *cfg = ms_calloc(1, d->config_size);
    assert_int_equal(d->config_load(hf, cfg, &err), MS_OK);
    ms_md_facts fa;
    assert_int_equal(d->facts(cfg, &fa, &err), MS_OK);
    assert_true(fa.temperature == 1.0f && fa.top_k == 0 && fa.top_p == 1.0f);
    assert_true(fa.attn_scale == 0.0f);
    ms_free(cfg);
    ms_hf_config_free(hf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_cfg_sources_defaults_optional),
        ms_unit_test(test_expand_name),
        ms_unit_test(test_llama_desc_tables),
        ms_unit_test(test_desc_check_catches_bugs),
        ms_unit_test(test_step_runners),
        ms_unit_test(test_step_explicit_positions),
        ms_unit_test(test_walks_and_sampler_defaults),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
