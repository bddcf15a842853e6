/*
 * test_engine_desc.c - the model descriptor contract (runtime/model_desc.h): config parameter
 * helpers (sources in order, defaults, optional values, wrong types, checks), name templates,
 * and the table checks that catch code generator bugs, run against the hand-written Llama
 * descriptor and mutations of it.
 */
#include "ms_test.h"
#include "ms_test_impl.h"

#include <string.h>

#include "engine.h"
#include "model_desc.h"

#include "llama_desc_ref.c"

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
    assert_int_equal(ms_md_check_desc(&ms_llama_ref_desc, &err), MS_OK);
    assert_int_equal(ms_md_resource_index(&ms_llama_ref_desc, "kv"), 0);
    assert_int_equal(ms_md_resource_index(&ms_llama_ref_desc, "attn"), 2);
    assert_int_equal(ms_md_resource_index(&ms_llama_ref_desc, "nope"), -1);

    /* shapes under the llama_gqa config: fused QKV = 128 + 2 * 32 rows */
    ms_hf_config *hf = NULL;
    assert_int_equal(ms_hf_config_init(&hf, ms_test_fixture("hf/llama_gqa"), &err), MS_OK);
    void *cfg = ms_calloc(1, ms_llama_ref_desc.config_size);
    assert_int_equal(ms_llama_ref_desc.config_load(hf, cfg, &err), MS_OK);
    assert_int_equal(ms_md_check_shapes(&ms_llama_ref_desc, cfg, &err), MS_OK);
    int64_t shape[4] = {0};
    ms_llama_ref_desc.weight_shape(cfg, W_WQKV, shape);
    assert_int_equal(shape[0], 8 * 16 + 2 * 2 * 16);
    assert_int_equal(shape[1], 128);
    ms_md_facts fa;
    assert_int_equal(ms_llama_ref_desc.facts(cfg, &fa, &err), MS_OK);
    assert_int_equal(fa.n_q_heads, 8);
    assert_int_equal(fa.n_kv_heads, 2);
    assert_int_equal(fa.head_dim, 16);
    assert_int_equal(fa.max_context, 512);
    assert_int_equal(fa.rope.style, MS_ROPE_ROTATE_HALF);
    assert_int_equal(fa.window, 0);
    assert_int_equal(ms_md_check_facts(&ms_llama_ref_desc, &fa, &err), MS_OK);
    /* a zero page size divided the engine by zero (MS_CEIL_DIV): refused with the value */
    fa.page_size = 0;
    assert_int_equal(ms_md_check_facts(&ms_llama_ref_desc, &fa, &err), MS_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "KV page size 0 under this config is not positive"));
    fa.page_size = 16;
    fa.window = -1;
    assert_int_equal(ms_md_check_facts(&ms_llama_ref_desc, &fa, &err), MS_ERR_FORMAT);
    assert_false(ms_llama_ref_desc.weight_tied(cfg, W_LM_HEAD));
    ms_free(cfg);
    ms_hf_config_free(hf);
}

/* Each mutation of the tables is a generator bug the check names. */
static void test_desc_check_catches_bugs(void **state) {
    (void)state;
    ms_md_weight w[W_COUNT];
    ms_md_resource r[4];
    ms_model_desc d;
    ms_error err = {0};
    static const struct {
        const char *what;
        int kind; /* 0 weight field, 1 resource, 2 kernel list */
    } cases[] = {
        {"per-layer names must contain {i}", 0}, {"tie must name an earlier", 0},
        {"a part must name a fused entry that lists it", 0}, {"a fused entry needs 2..4 parts", 0},
        {"rank must be 1 or 2", 0}, {"optional exactly when", 0},
        {"not an earlier resource", 1}, {"declared twice", 1}, {"are both of kind", 1},
        {"2 kernel instances without a list", 2}, {"kernel instance 1 has no stem", 2},
    };
    static const char *const stems[] = {"argmax_f32", ""};
    for (size_t c = 0; c < MS_ARRAY_LEN(cases); c++) {
        memcpy(w, llama_weights, sizeof w);
        memcpy(r, llama_resources, sizeof r);
        d = ms_llama_ref_desc;
        d.weights = w;
        d.resources = r;
        switch (c) {
        case 0: w[W_WO].names[0] = "model.layers.self_attn.o_proj.weight"; break;
        case 1: w[W_LM_HEAD].tie = W_LM_HEAD; break;
        case 2: w[W_WQ].fused = W_GATE_UP; break;
        case 3: w[W_GATE_UP].n_parts = 5; break;
        case 4: w[W_FINAL_NORM].rank = 3; break;
        case 5: w[W_BQKV].optional = false; break;
        case 6: r[1].deps[0] = "attn"; break;
        case 7: r[3].key = "kv"; r[3].kind = MS_RESOURCE_SCRATCH; break;
        case 8: r[3].kind = MS_RESOURCE_POS; break;
        case 9: d.n_kernels = 2; break;
        case 10: d.kernels = stems; d.n_kernels = 2; break;
        }
        assert_int_equal(ms_md_check_desc(&d, &err), MS_ERR_INVALID_ARG);
        if (strstr(err.msg, cases[c].what) == NULL)
            fail_msg("case %zu: '%s' does not say '%s'", c, err.msg, cases[c].what);
        assert_non_null(strstr(err.msg, "model llama"));
    }
    /* a broken descriptor never reaches the loaders */
    d = ms_llama_ref_desc;
    d.forward = NULL;
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture("hf/llama_gqa");
    ms_engine *e = NULL;
    assert_int_equal(ms_engine_init(&e, &d, &o, &err), MS_ERR_INVALID_ARG);
    assert_null(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_cfg_sources_defaults_optional),
        ms_unit_test(test_expand_name),
        ms_unit_test(test_llama_desc_tables),
        ms_unit_test(test_desc_check_catches_bugs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
