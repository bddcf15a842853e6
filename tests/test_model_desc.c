/*
 * test_model_desc.c - the model_desc.h helpers for list values and checkpoint tensors the model
 * ignores: ms_md_cfg_int_list (sources in order, defaults, optional values, a bare integer, every
 * refusal naming config.json and the field), ms_md_cfg_check_sections (M-RoPE sections against
 * the rotary width), ms_md_tensor_ignored ('*' patterns) and the descriptor check of the ignore
 * list. (The other config helpers and table checks: test_engine_desc.c.)
 */
#include "ms_test.h"
#include "ms_test_impl.h"

#include <string.h>

#include "model_desc.h"

static ms_hf_config *cfg_from(const char *json) {
    ms_hf_config *hf = NULL;
    ms_error err = {0};
    assert_int_equal(ms_hf_config_init_from_string(&hf, "t/config.json", json, &err), MS_OK);
    return hf;
}

static void test_int_list_sources_defaults_optional(void **state) {
    (void)state;
    ms_hf_config *hf = cfg_from("{\"a\": [4, 6, 6], \"b\": null, \"one\": 16, \"empty\": [],"
                                " \"text_config\": {\"rope_parameters\": {\"mrope_section\": [16, 24, 24]}}}");
    ms_error err = {0};
    ms_md_int_list v;
    bool present = false;
    static const char *const ab[] = {"b", "a"}; /* null counts as absent: the next source */
    assert_int_equal(ms_md_cfg_int_list(hf, ab, 2, NULL, &v, &present, &err), MS_OK);
    assert_true(present);
    assert_int_equal(v.n, 3);
    assert_int_equal(v.v[0], 4);
    assert_int_equal(v.v[2], 6);
    /* the text_config fallback of a nested key (Qwen2-VL) */
    static const char *const rp[] = {"rope_parameters.mrope_section"};
    assert_int_equal(ms_md_cfg_int_list(hf, rp, 1, NULL, &v, NULL, &err), MS_OK);
    assert_int_equal(v.n, 3);
    assert_int_equal(v.v[1], 24);
    static const char *const one[] = {"one"}; /* a bare integer: a list of one */
    assert_int_equal(ms_md_cfg_int_list(hf, one, 1, NULL, &v, NULL, &err), MS_OK);
    assert_int_equal(v.n, 1);
    assert_int_equal(v.v[0], 16);
    static const char *const empty[] = {"empty"};
    assert_int_equal(ms_md_cfg_int_list(hf, empty, 1, NULL, &v, NULL, &err), MS_OK);
    assert_int_equal(v.n, 0);
    /* absent: the default, an optional's presence flag, or the missing-field error */
    static const char *const none[] = {"missing", "b"};
    const ms_md_int_list d = {.n = 2, .v = {1, 2}};
    present = false;
    assert_int_equal(ms_md_cfg_int_list(hf, none, 2, &d, &v, &present, &err), MS_OK);
    assert_true(present);
    assert_int_equal(v.n, 2);
    assert_int_equal(v.v[1], 2);
    present = true;
    v.n = 7;
    assert_int_equal(ms_md_cfg_int_list(hf, none, 2, NULL, &v, &present, &err), MS_OK);
    assert_false(present);
    assert_int_equal(v.n, 7); /* left as is */
    assert_int_equal(ms_md_cfg_int_list(hf, none, 2, NULL, &v, NULL, &err), MS_ERR_NOT_FOUND);
    assert_string_equal(err.msg, "t/config.json: required field 'missing' is missing");
    ms_hf_config_free(hf);
}

static void test_int_list_refusals_name_the_field(void **state) {
    (void)state;
    static const struct {
        const char *json;
        ms_status st;
        const char *msg;
    } cases[] = {
        {"{\"k\": \"4,6,6\"}", MS_ERR_FORMAT, "t/config.json: field 'k' is a string, expected a list of integers"},
        {"{\"k\": {\"t\": 4}}", MS_ERR_FORMAT, "t/config.json: field 'k' is an object, expected a list of integers"},
        {"{\"k\": [4, true]}", MS_ERR_FORMAT, "t/config.json: field 'k'[1] is a boolean, expected an integer"},
        {"{\"k\": [4, [6]]}", MS_ERR_FORMAT, "t/config.json: field 'k'[1] is a list, expected an integer"},
        {"{\"k\": [1, 2, 3, 4, 5, 6, 7, 8, 9]}", MS_ERR_LIMIT, "t/config.json: field 'k' has 9 entries, at most 8 supported"},
        {"{\"k\": [1, -2147483648]}", MS_ERR_FORMAT, "t/config.json: field 'k'[1] (-2147483648) is out of range (at most 2147483647 in magnitude)"},
    };
    static const char *const k[] = {"k"};
    for (size_t i = 0; i < MS_ARRAY_LEN(cases); i++) {
        ms_hf_config *hf = cfg_from(cases[i].json);
        ms_error err = {0};
        ms_md_int_list v = {0};
        ms_status st = ms_md_cfg_int_list(hf, k, 1, NULL, &v, NULL, &err);
        if (st != cases[i].st || strcmp(err.msg, cases[i].msg) != 0)
            fail_msg("case %zu (%s): got %d \"%s\", want %d \"%s\"", i, cases[i].json, (int)st,
                     err.msg, (int)cases[i].st, cases[i].msg);
        assert_int_equal(v.n, 0);
        ms_hf_config_free(hf);
    }
}

static void test_check_sections(void **state) {
    (void)state;
    ms_hf_config *hf = cfg_from("{}");
    ms_error err = {0};
    const ms_md_int_list ok = {.n = 3, .v = {4, 6, 6}};
    assert_int_equal(ms_md_cfg_check_sections(hf, "mrope_section", ok, 32, &err), MS_OK);
    const ms_md_int_list none = {.n = 0};
    assert_int_equal(ms_md_cfg_check_sections(hf, "mrope_section", none, 32, &err), MS_OK);
    const ms_md_int_list short_ = {.n = 3, .v = {16, 24, 16}};
    assert_int_equal(ms_md_cfg_check_sections(hf, "mrope_section", short_, 128, &err),
                     MS_ERR_FORMAT);
    assert_string_equal(err.msg, "t/config.json: mrope_section [16, 24, 16] covers 56 rotary "
                                 "pairs, rotary_dim 128 has 64");
    const ms_md_int_list five = {.n = 5, .v = {4, 4, 4, 2, 2}};
    assert_int_equal(ms_md_cfg_check_sections(hf, "s", five, 32, &err), MS_ERR_FORMAT);
    assert_string_equal(err.msg, "t/config.json: s [4, 4, 4, 2, 2]: M-RoPE takes 1 to 4 "
                                 "non-negative sections");
    ms_hf_config_free(hf);
}

static void test_tensor_ignored_patterns(void **state) {
    (void)state;
    static const char *const pats[] = {"visual.*", "*.rotary_emb.inv_freq", "mtp.*.weight", "exact"};
    const ms_model_desc d = {.name = "m", .ignored = pats, .n_ignored = 4};
    assert_true(ms_md_tensor_ignored(&d, "visual.blocks.0.attn.qkv.weight"));
    assert_true(ms_md_tensor_ignored(&d, "visual."));
    assert_false(ms_md_tensor_ignored(&d, "visual"));
    assert_false(ms_md_tensor_ignored(&d, "model.visual.x"));
    assert_true(ms_md_tensor_ignored(&d, "model.layers.3.self_attn.rotary_emb.inv_freq"));
    assert_false(ms_md_tensor_ignored(&d, "model.layers.3.self_attn.rotary_emb.inv_freq2"));
    assert_true(ms_md_tensor_ignored(&d, "mtp.0.norm.weight"));
    assert_true(ms_md_tensor_ignored(&d, "mtp..weight"));
    assert_false(ms_md_tensor_ignored(&d, "mtp.0.norm.bias"));
    assert_true(ms_md_tensor_ignored(&d, "exact"));
    assert_false(ms_md_tensor_ignored(&d, "exact.weight"));
    assert_false(ms_md_tensor_ignored(&d, ""));
    const ms_model_desc none = {.name = "m"};
    assert_false(ms_md_tensor_ignored(&none, "visual.x"));
}

/* A descriptor that passes the check except where a case breaks it (one tensor, one resource). */
static ms_status no_cfg(const ms_hf_config *hf, void *c, ms_error *err) {
    (void)hf, (void)c, (void)err;
    return MS_OK;
}
static ms_status no_facts(const void *c, ms_md_facts *f, ms_error *err) {
    (void)c, (void)f, (void)err;
    return MS_OK;
}
static void no_shape(const void *c, int32_t w, int64_t *s) { (void)c, (void)w, (void)s; }
static bool no_tie(const void *c, int32_t w) { (void)c, (void)w; return false; }
static size_t no_ws(const void *c, int32_t t, int32_t s) { (void)c, (void)t, (void)s; return 0; }
static ms_status no_fwd(const ms_md_forward_args *a, ms_error *err) { (void)a, (void)err; return MS_OK; }

static ms_status no_run(const void *c, const ms_md_row *rows, int32_t n, ms_md_step_build *b,
                        ms_error *err) {
    (void)c, (void)rows, (void)n, (void)b, (void)err;
    return MS_OK;
}

static void test_desc_check_ignore_list(void **state) {
    (void)state;
    static const ms_md_weight w[] = {{.key = "embed", .names = {"embed"}, .rank = 2, .tie = -1,
                                      .fused = -1}};
    static const ms_md_resource r[] = {{.key = "kv", .kind = MS_RESOURCE_KV}};
    static const ms_md_step step = {.name = "s", .n_segments = 1, .labels = {MS_LABEL_MAIN},
                                    .run = no_run};
    static const int32_t walk_steps[] = {0};
    static const ms_md_walk walk = {.name = "w", .steps = walk_steps, .n_steps = 1,
                                    .loop_begin = 1};
    static const char *const labels[] = {"main"};
    static const char *const pats[] = {"visual.*", ""};
    ms_model_desc d = {.name = "m", .config_size = 8, .config_load = no_cfg, .facts = no_facts,
                       .weights = w, .n_weights = 1, .weight_shape = no_shape,
                       .weight_tied = no_tie, .resources = r, .n_resources = 1, .labels = labels,
                       .n_labels = 1, .steps = &step, .n_steps = 1, .walks = &walk, .n_walks = 1,
                       .workspace_size = no_ws, .forward = no_fwd,
                       .ignored = pats, .n_ignored = 1};
    ms_error err = {0};
    assert_int_equal(ms_md_check_desc(&d, &err), MS_OK);
    d.n_ignored = 2;
    assert_int_equal(ms_md_check_desc(&d, &err), MS_ERR_INVALID_ARG);
    assert_string_equal(err.msg, "model m: ignore pattern 1 is empty");
    d.ignored = NULL;
    assert_int_equal(ms_md_check_desc(&d, &err), MS_ERR_INVALID_ARG);
    assert_string_equal(err.msg, "model m: 2 ignore patterns without a list");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_int_list_sources_defaults_optional),
        ms_unit_test(test_int_list_refusals_name_the_field),
        ms_unit_test(test_check_sections),
        ms_unit_test(test_tensor_ignored_patterns),
        ms_unit_test(test_desc_check_ignore_list),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
