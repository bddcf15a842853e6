/*
 * test_codegen_qwen2vl.c - the descriptor mstarc generates from models/qwen2vl.mstar
 * (build/gen/qwen2vl/qwen2vl_gen.c, `mstarc build --emit-only`, linked in by tests/build.mk)
 * against ../shared/fixtures/hf/qwen2vl_mrope, without the engine:
 *   - the tables pass ms_md_check_desc and list the M-RoPE rope_kv instance (not the plain one);
 *   - config_load reads the text model under text_config and mrope_section as an int[]; facts
 *     carry rope sections [4, 6, 6] over head_dim 32 (rotary_dim 32: 16 pairs);
 *   - every checkpoint tensor is a declared weight (some name of it, for some layer) or matched
 *     by the model's ignore patterns (the vision tower), and every declared weight is present;
 *   - bad mrope_section values fail config_load naming config.json and the field: not a list,
 *     an element that is not an integer, too many elements, sections that do not cover the
 *     rotary pairs, more than 4 sections, absent.
 */
#include "ms_test.h"
#include "ms_test_impl.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "hf_config.h"
#include "model_desc.h"

extern const ms_model_desc ms_qwen2vl_desc;

static const char *const FIXTURE = "hf/qwen2vl_mrope";

/* config_load + facts of `hf` into a fresh config struct (returned, ms_free) and *facts. */
static ms_status load(const ms_hf_config *hf, void **config, ms_md_facts *facts, ms_error *err) {
    const ms_model_desc *d = &ms_qwen2vl_desc;
    *config = ms_calloc(1, d->config_size);
    assert_non_null(*config);
    ms_status st = d->config_load(hf, *config, err);
    if (st == MS_OK)
        st = d->facts(*config, facts, err);
    return st;
}

static void test_descriptor_tables(void **state) {
    (void)state;
    const ms_model_desc *d = &ms_qwen2vl_desc;
    ms_error err = {0};
    assert_int_equal(ms_md_check_desc(d, &err), MS_OK);
    bool mrope = false, plain = false;
    for (int32_t i = 0; i < d->n_kernels; i++) {
        mrope = mrope || strcmp(d->kernels[i], "rope_kv_bf16_neox_mrope_af32") == 0;
        plain = plain || strcmp(d->kernels[i], "rope_kv_bf16_neox_af32") == 0;
    }
    assert_true(mrope);
    assert_false(plain);
    assert_int_equal(d->n_ignored, 2);
    assert_true(ms_md_tensor_ignored(d, "visual.blocks.0.attn.qkv.weight"));
    assert_true(ms_md_tensor_ignored(d, "model.visual.merger.mlp.0.bias"));
    assert_false(ms_md_tensor_ignored(d, "model.layers.0.self_attn.q_proj.weight"));
    assert_false(ms_md_tensor_ignored(d, "visual")); /* "visual.*" needs the dot */
}

static void test_fixture_facts(void **state) {
    (void)state;
    ms_error err = {0};
    ms_hf_config *hf = NULL;
    assert_int_equal(ms_hf_config_init(&hf, ms_test_fixture(FIXTURE), &err), MS_OK);
    void *config = NULL;
    ms_md_facts f;
    ms_status st = load(hf, &config, &f, &err);
    if (st != MS_OK)
        fail_msg("%s", err.msg);
    assert_int_equal(f.n_layers, 2);
    assert_int_equal(f.n_q_heads, 4);
    assert_int_equal(f.n_kv_heads, 2);
    assert_int_equal(f.head_dim, 32);
    assert_int_equal(f.hidden, 128);
    assert_int_equal(f.vocab, 512);
    assert_int_equal(f.max_context, 512);
    assert_int_equal(f.window, 0); /* use_sliding_window false */
    assert_int_equal(f.rope.style, MS_ROPE_ROTATE_HALF);
    assert_int_equal(f.rope.head_dim, 32);
    assert_int_equal(f.rope.rotary_dim, 32);
    assert_true(f.rope.theta == 10000.0);
    assert_int_equal(f.rope.scaling, MS_ROPE_SCALING_NONE);
    assert_int_equal(f.rope.n_sections, 3);
    assert_int_equal(f.rope.sections[0], 4);
    assert_int_equal(f.rope.sections[1], 6);
    assert_int_equal(f.rope.sections[2], 6);
    assert_int_equal(ms_md_check_shapes(&ms_qwen2vl_desc, config, &err), MS_OK);
    ms_free(config);
    ms_hf_config_free(hf);
}

/* Every checkpoint tensor declared (some name, some layer) or ignored; every declared one there. */
static void test_every_tensor_declared_or_ignored(void **state) {
    (void)state;
    const ms_model_desc *d = &ms_qwen2vl_desc;
    ms_error err = {0};
    ms_hf_config *hf = NULL;
    assert_int_equal(ms_hf_config_init(&hf, ms_test_fixture(FIXTURE), &err), MS_OK);
    void *config = NULL;
    ms_md_facts f;
    assert_int_equal(load(hf, &config, &f, &err), MS_OK);
    ms_ckpt *ck = NULL;
    assert_int_equal(ms_ckpt_init(&ck, ms_test_fixture(FIXTURE), &err), MS_OK);
    size_t n = ms_ckpt_n_tensors(ck);
    bool *claimed = calloc(n, sizeof *claimed);
    assert_non_null(claimed);
    int declared = 0;
    for (int32_t w = 0; w < d->n_weights; w++) {
        const ms_md_weight *wd = &d->weights[w];
        if (wd->kind == MS_MD_WEIGHT_FUSED)
            continue;
        for (int32_t l = 0; l < (wd->per_layer ? f.n_layers : 1); l++) {
            bool found = false;
            for (int k = 0; k < MS_MD_MAX_NAMES && wd->names[k] != NULL; k++) {
                char name[256];
                assert_int_equal(ms_md_expand_name(wd->names[k], l, name, sizeof name, &err), MS_OK);
                for (size_t i = 0; i < n; i++)
                    if (strcmp(ms_ckpt_tensor_at(ck, i)->name, name) == 0) {
                        claimed[i] = true;
                        found = true;
                    }
            }
            if (!found && !wd->optional && wd->tie < 0)
                fail_msg("weight '%s' layer %d: no tensor in the checkpoint", wd->key, (int)l);
            declared += found;
        }
    }
    int ignored = 0;
    for (size_t i = 0; i < n; i++) {
        const char *name = ms_ckpt_tensor_at(ck, i)->name;
        if (claimed[i])
            continue;
        if (!ms_md_tensor_ignored(d, name))
            fail_msg("checkpoint tensor '%s' is neither declared nor ignored", name);
        assert_int_equal(strncmp(name, "visual.", 7), 0);
        ignored++;
    }
    assert_int_equal(declared, 1 + 2 * 12 + 1 + 1); /* embed, 12 per layer, norm, lm_head */
    assert_int_equal(ignored, 19);                   /* the vision tower */
    assert_int_equal((size_t)(declared + ignored), n);
    free(claimed);
    ms_ckpt_free(ck);
    ms_free(config);
    ms_hf_config_free(hf);
}

/* The fixture's config.json with text_config.rope_parameters.mrope_section replaced by `value`
 * (JSON text; NULL: removed), loaded; returns config_load's status, message in err. */
static ms_status load_with_sections(const char *value, ms_error *err) {
    char path[512];
    snprintf(path, sizeof path, "%s/config.json", ms_test_fixture(FIXTURE));
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    assert_non_null(root);
    json_t *rp = json_object_get(json_object_get(root, "text_config"), "rope_parameters");
    assert_non_null(rp);
    if (value == NULL) {
        json_object_del(rp, "mrope_section");
    } else {
        json_t *v = json_loads(value, JSON_DECODE_ANY, &je);
        assert_non_null(v);
        json_object_set_new(rp, "mrope_section", v);
    }
    char *text = json_dumps(root, 0);
    json_decref(root);
    ms_hf_config *hf = NULL;
    assert_int_equal(ms_hf_config_init_from_string(&hf, "qwen2vl/config.json", text, err), MS_OK);
    free(text);
    void *config = NULL;
    ms_md_facts f;
    memset(err, 0, sizeof *err);
    ms_status st = load(hf, &config, &f, err);
    ms_free(config);
    ms_hf_config_free(hf);
    return st;
}

static void test_bad_mrope_section(void **state) {
    (void)state;
    static const struct {
        const char *value;
        ms_status st;
        const char *msg;
    } cases[] = {
        {"\"4,6,6\"", MS_ERR_FORMAT, "qwen2vl/config.json: field 'text_config.rope_parameters.mrope_section' is a string, expected a list of integers"},
        {"[4, \"6\", 6]", MS_ERR_FORMAT, "qwen2vl/config.json: field 'text_config.rope_parameters.mrope_section'[1] is a string, expected an integer"},
        {"[4, 6.5, 6]", MS_ERR_FORMAT, "qwen2vl/config.json: field 'text_config.rope_parameters.mrope_section'[1] is a real number, expected an integer"},
        {"[1, 1, 1, 1, 1, 1, 1, 1, 8]", MS_ERR_LIMIT, "qwen2vl/config.json: field 'text_config.rope_parameters.mrope_section' has 9 entries, at most 8 supported"},
        {"[4, 6, 5]", MS_ERR_FORMAT, "qwen2vl/config.json: mrope_section [4, 6, 5] covers 15 rotary pairs, rotary_dim 32 has 16"},
        {"[4, 4, 4, 2, 2]", MS_ERR_FORMAT, "qwen2vl/config.json: mrope_section [4, 4, 4, 2, 2]: M-RoPE takes 1 to 4 non-negative sections"},
        {"[4, 14, -2]", MS_ERR_FORMAT, "qwen2vl/config.json: mrope_section [4, 14, -2]: M-RoPE takes 1 to 4 non-negative sections"},
        {"[4, 6, 4294967296]", MS_ERR_FORMAT, "qwen2vl/config.json: field 'text_config.rope_parameters.mrope_section'[2] (4294967296) is out of range (at most 2147483647 in magnitude)"},
        {NULL, MS_ERR_NOT_FOUND, "qwen2vl/config.json: required field 'text_config.rope_parameters.mrope_section' is missing"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ms_error err;
        ms_status st = load_with_sections(cases[i].value, &err);
        if (st != cases[i].st || strcmp(err.msg, cases[i].msg) != 0)
            fail_msg("case %zu (%s): got %d \"%s\", want %d \"%s\"", i,
                     cases[i].value != NULL ? cases[i].value : "absent", (int)st, err.msg,
                     (int)cases[i].st, cases[i].msg);
    }
    /* a bare integer is a list of one: one section of 16 pairs is M-RoPE over one stream */
    ms_error err;
    assert_int_equal(load_with_sections("16", &err), MS_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_descriptor_tables),
        ms_unit_test(test_fixture_facts),
        ms_unit_test(test_every_tensor_declared_or_ignored),
        ms_unit_test(test_bad_mrope_section),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
