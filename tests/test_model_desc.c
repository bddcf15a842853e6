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
#include "walk.h"

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

/* The fixture: one weight, one node of one resource and one step, one walk over it. */
static const ms_md_weight fx_w[] = {{.key = "embed", .names = {"embed"}, .rank = 2, .tie = -1,
                                     .fused = -1}};
static const ms_md_arg fx_args[] = {{"page_size", "16"},
                                    {"window", "has(sliding_window) ? sliding_window : none"}};
static const ms_md_resource fx_r[] = {{.key = "kv", .kind = MS_RESOURCE_KV, .args = fx_args,
                                       .n_args = 2}};
static const ms_md_step fx_step = {.name = "s", .n_segments = 1, .labels = {MS_LABEL_MAIN},
                                   .run = no_run};
static const char *const fx_labels[] = {"main"};
static const ms_md_node fx_node = {.name = "decoder", .labels = fx_labels, .n_labels = 1,
                                   .resources = fx_r, .n_resources = 1, .steps = &fx_step,
                                   .n_steps = 1, .workspace_size = no_ws, .forward = no_fwd};
static const ms_md_walk_item fx_items[] = {{0, 0}};
static const ms_md_walk fx_walk = {.name = "w", .items = fx_items, .n_items = 1,
                                   .loop_begin = 1};

static ms_model_desc fx_desc(void) {
    return (ms_model_desc){.name = "m", .config_size = 8, .config_load = no_cfg,
                           .facts = no_facts, .weights = fx_w, .n_weights = 1,
                           .weight_shape = no_shape, .weight_tied = no_tie, .nodes = &fx_node,
                           .n_nodes = 1, .walks = &fx_walk, .n_walks = 1};
}

static void test_desc_check_ignore_list(void **state) {
    (void)state;
    static const char *const pats[] = {"visual.*", ""};
    ms_model_desc d = fx_desc();
    d.ignored = pats;
    d.n_ignored = 1;
    ms_error err = {0};
    assert_int_equal(ms_md_check_desc(&d, &err), MS_OK);
    d.n_ignored = 2;
    assert_int_equal(ms_md_check_desc(&d, &err), MS_ERR_INVALID_ARG);
    assert_string_equal(err.msg, "model m: ignore pattern 1 is empty");
    d.ignored = NULL;
    assert_int_equal(ms_md_check_desc(&d, &err), MS_ERR_INVALID_ARG);
    assert_string_equal(err.msg, "model m: 2 ignore patterns without a list");
}

/* The node table: a count within 1..MS_MD_MAX_NODES, unique names, each node's forward and
 * tables; the check is general (two nodes pass it; the engine refuses them at init). */
static void test_desc_check_nodes(void **state) {
    (void)state;
    ms_error err = {0};
    ms_model_desc d = fx_desc();
    ms_md_node nodes[2] = {fx_node, fx_node};
    nodes[1].name = "encoder";
    d.nodes = nodes;
    d.n_nodes = 2;
    assert_int_equal(ms_md_check_desc(&d, &err), MS_OK);

    d.n_nodes = 0;
    assert_int_equal(ms_md_check_desc(&d, &err), MS_ERR_INVALID_ARG);
    assert_string_equal(err.msg, "model m: 0 nodes (1..8)");
    d.n_nodes = 2;

    nodes[1].name = "decoder";
    assert_int_equal(ms_md_check_desc(&d, &err), MS_ERR_INVALID_ARG);
    assert_string_equal(err.msg, "model m: node 'decoder' declared twice");
    nodes[1].name = NULL;
    assert_int_equal(ms_md_check_desc(&d, &err), MS_ERR_INVALID_ARG);
    assert_string_equal(err.msg, "model m: node 1 has no name");
    nodes[1].name = "encoder";

    nodes[1].forward = NULL;
    assert_int_equal(ms_md_check_desc(&d, &err), MS_ERR_INVALID_ARG);
    assert_string_equal(err.msg, "model m: node encoder: no resource table, workspace_size or "
                                 "forward");
    nodes[1].forward = fx_node.forward;

    static const char *const bad_labels[] = {"cond"};
    nodes[1].labels = bad_labels;
    assert_int_equal(ms_md_check_desc(&d, &err), MS_ERR_INVALID_ARG);
    assert_string_equal(err.msg, "model m: node encoder: labels must start with main (1..16)");
    nodes[1].labels = fx_labels;

    nodes[1].n_steps = 0;
    assert_int_equal(ms_md_check_desc(&d, &err), MS_ERR_INVALID_ARG);
    assert_string_equal(err.msg, "model m: node encoder: no steps (or more than 64)");
    nodes[1].n_steps = 1;

    /* a step's label is checked against its own node's labels */
    ms_md_step two = fx_step;
    two.labels[0] = 1;
    nodes[1].steps = &two;
    assert_int_equal(ms_md_check_desc(&d, &err), MS_ERR_INVALID_ARG);
    assert_string_equal(err.msg, "model m: node encoder: step s: label 1 out of range");
    static const char *const two_labels[] = {"main", "cfg_uncond"};
    nodes[1].labels = two_labels;
    nodes[1].n_labels = 2;
    assert_int_equal(ms_md_check_desc(&d, &err), MS_OK);
}

/* Resource arguments: each with a key and a text; a count without a list. */
static void test_desc_check_resource_args(void **state) {
    (void)state;
    ms_error err = {0};
    ms_model_desc d = fx_desc();
    ms_md_node node = fx_node;
    ms_md_resource r = fx_r[0];
    ms_md_arg args[2] = {fx_args[0], fx_args[1]};
    r.args = args;
    node.resources = &r;
    d.nodes = &node;
    assert_int_equal(ms_md_check_desc(&d, &err), MS_OK);
    assert_string_equal(d.nodes[0].resources[0].args[1].text,
                        "has(sliding_window) ? sliding_window : none");

    args[1].text = NULL;
    assert_int_equal(ms_md_check_desc(&d, &err), MS_ERR_INVALID_ARG);
    assert_string_equal(err.msg, "model m: node decoder: resource 'kv': argument 1 has no key "
                                 "or text");
    args[1] = fx_args[1];
    args[0].key = "";
    assert_int_equal(ms_md_check_desc(&d, &err), MS_ERR_INVALID_ARG);
    assert_string_equal(err.msg, "model m: node decoder: resource 'kv': argument 0 has no key "
                                 "or text");
    args[0] = fx_args[0];

    r.args = NULL;
    assert_int_equal(ms_md_check_desc(&d, &err), MS_ERR_INVALID_ARG);
    assert_string_equal(err.msg, "model m: node decoder: resource 'kv': 2 arguments without a "
                                 "list");
    r.n_args = 0;
    assert_int_equal(ms_md_check_desc(&d, &err), MS_OK); /* a resource with none */
    r.n_args = -1;
    r.args = args;
    assert_int_equal(ms_md_check_desc(&d, &err), MS_ERR_INVALID_ARG);
}

/* Walk items name a valid (node, step) pair; the loop lies within the items. */
static void test_desc_check_walk_items(void **state) {
    (void)state;
    ms_error err = {0};
    ms_model_desc d = fx_desc();
    ms_md_node nodes[2] = {fx_node, fx_node};
    nodes[1].name = "encoder";
    ms_md_step steps2[2] = {fx_step, fx_step};
    steps2[1].name = "t";
    nodes[1].steps = steps2;
    nodes[1].n_steps = 2;
    d.nodes = nodes;
    d.n_nodes = 2;
    ms_md_walk_item items[3] = {{1, 0}, {0, 0}, {1, 1}};
    ms_md_walk w = {.name = "w", .items = items, .n_items = 3, .loop_begin = 2};
    d.walks = &w;
    assert_int_equal(ms_md_check_desc(&d, &err), MS_OK);

    items[2] = (ms_md_walk_item){2, 0};
    assert_int_equal(ms_md_check_desc(&d, &err), MS_ERR_INVALID_ARG);
    assert_string_equal(err.msg, "model m: walk w: item 2 names node 2, not one of the 2 nodes");
    items[2] = (ms_md_walk_item){-1, 0};
    assert_int_equal(ms_md_check_desc(&d, &err), MS_ERR_INVALID_ARG);
    assert_string_equal(err.msg, "model m: walk w: item 2 names node -1, not one of the 2 nodes");

    /* step 1 exists in node 1 (two steps) but not in node 0 (one) */
    items[2] = (ms_md_walk_item){0, 1};
    assert_int_equal(ms_md_check_desc(&d, &err), MS_ERR_INVALID_ARG);
    assert_string_equal(err.msg, "model m: walk w: item 2 names step 1 of node decoder, which "
                                 "has 1");
    items[2] = (ms_md_walk_item){1, -1};
    assert_int_equal(ms_md_check_desc(&d, &err), MS_ERR_INVALID_ARG);
    assert_string_equal(err.msg, "model m: walk w: item 2 names step -1 of node encoder, which "
                                 "has 2");
    items[2] = (ms_md_walk_item){1, 1};

    w.loop_begin = 4;
    assert_int_equal(ms_md_check_desc(&d, &err), MS_ERR_INVALID_ARG);
    assert_string_equal(err.msg, "model m: walk w: no items or a bad loop");
    w.loop_begin = 3;
    w.items = NULL;
    assert_int_equal(ms_md_check_desc(&d, &err), MS_ERR_INVALID_ARG);
    assert_string_equal(err.msg, "model m: walk w: no items or a bad loop");
    w.items = items;
    assert_int_equal(ms_md_check_desc(&d, &err), MS_OK);
    d.n_walks = 0;
    assert_int_equal(ms_md_check_desc(&d, &err), MS_ERR_INVALID_ARG);
    assert_string_equal(err.msg, "model m: no walk");
}

/* The walk executor's bookkeeping goes through each item's node: its step, the labels of the
 * first item's node, and streams counted per (node, label). */
static void test_walk_items_across_nodes(void **state) {
    (void)state;
    ms_model_desc d = fx_desc();
    static const char *const two_labels[] = {"main", "cfg_uncond"};
    ms_md_step enc_steps[2] = {fx_step, fx_step};
    enc_steps[1].name = "t";
    enc_steps[1].n_segments = 2;
    enc_steps[1].labels[1] = 1;
    ms_md_node nodes[2] = {fx_node, fx_node};
    nodes[1].name = "encoder";
    nodes[1].labels = two_labels;
    nodes[1].n_labels = 2;
    nodes[1].steps = enc_steps;
    nodes[1].n_steps = 2;
    ms_md_walk_item items[3] = {{1, 0}, {0, 0}, {1, 1}};
    ms_md_walk w = {.name = "w", .items = items, .n_items = 3, .loop_begin = 2};
    d.nodes = nodes;
    d.n_nodes = 2;
    d.walks = &w;
    ms_error err = {0};
    assert_int_equal(ms_md_check_desc(&d, &err), MS_OK);

    ms_walk_pos p = {0, 0};
    assert_int_equal(ms_walk_item(&d, p).node, 1);
    assert_int_equal(ms_walk_step(&d, p), 0);
    ms_walk_advance(&d, &p);
    assert_int_equal(ms_walk_item(&d, p).node, 0);
    assert_false(ms_walk_in_loop(&d, p));
    ms_walk_advance(&d, &p);
    assert_int_equal(ms_walk_item(&d, p).node, 1);
    assert_int_equal(ms_walk_step(&d, p), 1);
    assert_true(ms_walk_in_loop(&d, p));
    ms_walk_advance(&d, &p); /* the loop repeats its one item */
    assert_int_equal(p.at, 2);
    assert_int_equal(ms_walk_item(&d, (ms_walk_pos){0, 3}).node, -1);
    assert_int_equal(ms_walk_step(&d, (ms_walk_pos){1, 0}), -1);

    /* encoder.main, decoder.main, encoder.cfg_uncond */
    assert_int_equal(ms_walk_n_streams(&d, 0), 3);
    /* the first item is the encoder's: a prompt for its main stream alone takes the walk */
    bool has[MS_MAX_LABELS] = {true};
    assert_int_equal(ms_walk_find(&d, has), 0);
    has[1] = true;
    assert_int_equal(ms_walk_find(&d, has), -1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_int_list_sources_defaults_optional),
        ms_unit_test(test_int_list_refusals_name_the_field),
        ms_unit_test(test_check_sections),
        ms_unit_test(test_tensor_ignored_patterns),
        ms_unit_test(test_desc_check_ignore_list),
        ms_unit_test(test_desc_check_nodes),
        ms_unit_test(test_desc_check_resource_args),
        ms_unit_test(test_desc_check_walk_items),
        ms_unit_test(test_walk_items_across_nodes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
