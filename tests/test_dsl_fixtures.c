/*
 * test_dsl_fixtures.c - models/llama.mstar, qwen3.mstar and qwen2vl.mstar against real Hugging Face
 * checkpoints (../shared/fixtures/hf): their config parameters evaluate from each config.json
 * (both the transformers 5 rope_parameters layout and the legacy top-level one), and their
 * weights name
 * exactly the tensors of each model.safetensors with the shapes the checkpoint has: every
 * required tensor present for every layer, every checkpoint tensor claimed, ties and optional
 * biases resolved as declared. Also the evaluator's error messages.
 */
#include "ms_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval.h"
#include "model_desc.h"
#include "mstarc.h"

#include "ms_test_impl.h"

typedef struct fixture {
    ms_compile *c;
    const ms_model *m;
    json_t *config;
    json_t *tensors;   /* safetensors header: name -> {dtype, shape, data_offsets} */
    ms_value *values;  /* [n_params] */
    const char *model; /* path of the model file */
    int n_ignored;     /* checkpoint tensors matched by the model's `ignore` patterns */
} fixture;

static json_t *safetensors_header(const char *path) {
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    unsigned char len8[8];
    assert_int_equal(fread(len8, 1, 8, f), 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = (n << 8) | len8[i];
    assert_true(n > 0 && n < (1u << 26));
    char *buf = malloc((size_t)n);
    assert_int_equal(fread(buf, 1, (size_t)n, f), n);
    fclose(f);
    json_error_t jerr;
    json_t *j = json_loadb(buf, (size_t)n, 0, &jerr);
    free(buf);
    assert_non_null(j);
    return j;
}

static void fixture_load_model(fixture *fx, const char *model, const char *name) {
    memset(fx, 0, sizeof *fx);
    ms_error err = {0};
    fx->model = model;
    assert_int_equal(ms_compile_file(model, 0, &fx->c, &err), MS_OK);
    fx->m = ms_compile_model(fx->c);
    char rel[256];
    snprintf(rel, sizeof rel, "hf/%s/config.json", name);
    json_error_t jerr;
    fx->config = json_load_file(ms_test_fixture(rel), 0, &jerr);
    if (fx->config == NULL)
        fprintf(stderr, "cannot read %s: %s\n", ms_test_fixture(rel), jerr.text);
    assert_non_null(fx->config);
    snprintf(rel, sizeof rel, "hf/%s/model.safetensors", name);
    fx->tensors = safetensors_header(ms_test_fixture(rel));
    fx->values = calloc((size_t)fx->m->n_params, sizeof *fx->values);
    if (ms_config_eval(fx->m, fx->config, fx->values, &err) != MS_OK)
        fprintf(stderr, "%s: %s\n", name, err.msg);
    assert_int_equal(err.code, MS_OK);
}

static void fixture_load(fixture *fx, const char *name) { fixture_load_model(fx, "models/llama.mstar", name); }

static void fixture_free(fixture *fx) {
    free(fx->values);
    json_decref(fx->config);
    json_decref(fx->tensors);
    ms_compile_free(fx->c);
}

static const ms_value *param(const fixture *fx, const char *name) {
    const ms_param *p = ms_model_find_param(fx->m, name);
    assert_non_null(p);
    return &fx->values[p->index];
}

static int64_t eval_int(const fixture *fx, const ms_ast_expr *e) {
    ms_value v;
    ms_error err = {0};
    assert_int_equal(ms_expr_eval(e, fx->values, &v, &err), MS_OK);
    assert_int_equal(v.type, MS_TYPE_INT);
    return v.i;
}

/* Replace "{var}" by the layer number. */
static void expand(char *out, size_t n, const char *tmpl, const char *var, int layer) {
    char pat[64];
    snprintf(pat, sizeof pat, "{%s}", var != NULL ? var : "");
    const char *hit = var != NULL ? strstr(tmpl, pat) : NULL;
    if (hit == NULL) {
        snprintf(out, n, "%s", tmpl);
        return;
    }
    snprintf(out, n, "%.*s%d%s", (int)(hit - tmpl), tmpl, layer, hit + strlen(pat));
}

/* Every weight present with its declared shape (or tied / optional), every tensor claimed.
 * Returns the number of tensors matched. */
static int check_weights(fixture *fx, int *n_tied, int *n_absent_optional) {
    json_t *claimed = json_object();
    int matched = 0;
    *n_tied = *n_absent_optional = 0;
    for (int w = 0; w < fx->m->n_weights; w++) {
        const ms_weight *wt = fx->m->weights[w];
        if (wt->tie != NULL && wt->tie_cond != NULL) {
            ms_value c;
            ms_error err = {0};
            assert_int_equal(ms_expr_eval(wt->tie_cond, fx->values, &c, &err), MS_OK);
            if (c.b) {
                (*n_tied)++;
                continue;
            }
        }
        int layers = wt->group != NULL ? (int)eval_int(fx, wt->group->count) : 1;
        for (int l = 0; l < layers; l++) {
            const json_t *t = NULL;
            char name[256] = "";
            for (int k = 0; k < wt->n_names && t == NULL; k++) {
                expand(name, sizeof name, wt->names[k], wt->group != NULL ? wt->group->index_var : NULL, l);
                t = json_object_get(fx->tensors, name);
            }
            if (t == NULL) {
                if (wt->optional) {
                    (*n_absent_optional)++;
                    continue;
                }
                if (wt->tie != NULL) {
                    (*n_tied)++;
                    continue;
                }
                fail_msg("weight '%s' (layer %d): tensor \"%s\" is not in the checkpoint", wt->name, l, name);
            }
            const json_t *shape = json_object_get(t, "shape");
            assert_int_equal((int)json_array_size(shape), wt->rank);
            for (int d = 0; d < wt->rank; d++) {
                int64_t want = eval_int(fx, wt->shape[d]);
                int64_t got = (int64_t)json_integer_value(json_array_get(shape, (size_t)d));
                if (want != got)
                    fail_msg("weight '%s' \"%s\": dimension %d is %lld in the model, %lld in the checkpoint",
                             wt->name, name, d, (long long)want, (long long)got);
            }
            json_object_set_new(claimed, name, json_true());
            matched++;
        }
    }
    const char *key;
    json_t *val;
    /* tensors the model declares present but unused (`ignore`), matched as the engine does */
    const ms_model_desc ign = {.name = fx->m->name, .ignored = fx->m->ignores,
                               .n_ignored = fx->m->n_ignores};
    json_object_foreach(fx->tensors, key, val) {
        if (strcmp(key, "__metadata__") == 0 || json_object_get(claimed, key) != NULL)
            continue;
        if (ms_md_tensor_ignored(&ign, key))
            fx->n_ignored++;
        else
            fail_msg("checkpoint tensor \"%s\" is not named by any weight of %s", key, fx->model);
    }
    json_decref(claimed);
    return matched;
}

static void test_llama_gqa(void **state) {
    (void)state;
    fixture fx;
    fixture_load(&fx, "llama_gqa");
    assert_int_equal(param(&fx, "num_attention_heads")->i, 8);
    assert_int_equal(param(&fx, "num_key_value_heads")->i, 2);
    assert_int_equal(param(&fx, "head_dim")->i, 16);
    assert_int_equal(param(&fx, "kv_dim")->i, 32);
    assert_true(param(&fx, "rope_theta")->f == 10000.0);
    assert_string_equal(param(&fx, "rope_type")->s, "default");
    assert_int_equal(param(&fx, "sliding_window")->type, MS_TYPE_NONE);
    assert_false(param(&fx, "tie_word_embeddings")->b);
    int tied, absent;
    assert_int_equal(check_weights(&fx, &tied, &absent), 2 + 3 * 9 + 1);
    assert_int_equal(tied, 0);
    assert_int_equal(absent, 3 * 3); /* no attention biases */
    /* resource arguments evaluate for this checkpoint */
    const ms_node *n = fx.m->nodes[0];
    ms_value v;
    ms_error err = {0};
    assert_int_equal(ms_expr_eval(ms_resource_arg(n->resources[2], "window"), fx.values, &v, &err), MS_OK);
    assert_int_equal(v.type, MS_TYPE_NONE);
    assert_int_equal(eval_int(&fx, ms_resource_arg(n->resources[0], "kv_heads")), 2);
    fixture_free(&fx);
}

static void test_mistral_window(void **state) {
    (void)state;
    fixture fx;
    fixture_load(&fx, "mistral_window");
    assert_int_equal(param(&fx, "sliding_window")->i, 8);
    assert_int_equal(param(&fx, "head_dim")->i, 32); /* explicit, not hidden / heads = 32 */
    int tied, absent;
    assert_int_equal(check_weights(&fx, &tied, &absent), 2 + 2 * 9 + 1);
    const ms_node *n = fx.m->nodes[0];
    assert_int_equal(eval_int(&fx, ms_resource_arg(n->resources[2], "window")), 8);
    fixture_free(&fx);
}

static void check_llama31(const char *name) {
    fixture fx;
    fixture_load(&fx, name);
    assert_string_equal(param(&fx, "rope_type")->s, "llama3");
    assert_true(param(&fx, "rope_theta")->f == 500000.0);
    assert_true(param(&fx, "rope_factor")->f == 8.0);
    assert_true(param(&fx, "rope_low_freq_factor")->f == 1.0);
    assert_true(param(&fx, "rope_high_freq_factor")->f == 4.0);
    assert_int_equal(param(&fx, "rope_original_max_positions")->i, 64);
    assert_true(param(&fx, "tie_word_embeddings")->b);
    int tied, absent;
    assert_int_equal(check_weights(&fx, &tied, &absent), 1 + 2 * 9 + 1);
    assert_int_equal(tied, 1); /* lm_head = embed */
    /* the scaling argument picks llama3(...) for this config */
    const ms_ast_expr *scaling = ms_resource_arg(fx.m->nodes[0]->resources[1], "scaling");
    ms_value c;
    ms_error err = {0};
    assert_int_equal(ms_expr_eval(scaling->cond, fx.values, &c, &err), MS_OK);
    assert_true(c.b);
    fixture_free(&fx);
}

static void test_llama31_rope(void **state) {
    (void)state;
    check_llama31("llama31_rope");
}

static void test_llama31_rope_legacy_layout(void **state) {
    (void)state;
    check_llama31("llama31_rope_legacy");
}

static void test_qwen3(void **state) {
    (void)state;
    fixture fx;
    fixture_load_model(&fx, "models/qwen3.mstar", "qwen3");
    assert_int_equal(param(&fx, "head_dim")->i, 48); /* its own value, not 96 / 4 */
    assert_int_equal(param(&fx, "q_dim")->i, 192);
    assert_int_equal(param(&fx, "sliding_window")->type, MS_TYPE_NONE); /* null in config.json */
    assert_true(param(&fx, "rms_norm_eps")->f == 1e-6);
    assert_true(param(&fx, "rope_theta")->f == 1000000.0);
    int tied, absent;
    assert_int_equal(check_weights(&fx, &tied, &absent), 1 + 2 * 11 + 1);
    assert_int_equal(tied, 1);
    assert_int_equal(absent, 0);
    ms_value v;
    ms_error err = {0};
    assert_int_equal(ms_expr_eval(ms_resource_arg(fx.m->nodes[0]->resources[0], "retention"), fx.values, &v, &err),
                     MS_OK);
    assert_int_equal(v.type, MS_TYPE_NONE);
    fixture_free(&fx);
}

/* Qwen2-VL's text path: config under text_config, mrope_section read as an int[], q/k/v biases,
 * and the vision tower (visual.*) present but unused. */
static void test_qwen2vl(void **state) {
    (void)state;
    fixture fx;
    fixture_load_model(&fx, "models/qwen2vl.mstar", "qwen2vl_mrope");
    assert_int_equal(param(&fx, "hidden_size")->i, 128); /* text_config.hidden_size */
    assert_int_equal(param(&fx, "head_dim")->i, 32);
    assert_int_equal(param(&fx, "num_key_value_heads")->i, 2);
    assert_int_equal(param(&fx, "max_position_embeddings")->i, 512);
    assert_true(param(&fx, "rope_theta")->f == 10000.0);
    const ms_value *sec = param(&fx, "mrope_section");
    assert_int_equal(sec->type, MS_TYPE_LIST);
    assert_int_equal(sec->n, 3);
    assert_int_equal(sec->list[0], 4);
    assert_int_equal(sec->list[1], 6);
    assert_int_equal(sec->list[2], 6);
    int tied, absent;
    assert_int_equal(check_weights(&fx, &tied, &absent), 1 + 2 * 12 + 1 + 1);
    assert_int_equal(tied, 0);
    assert_int_equal(absent, 0);
    assert_int_equal(fx.n_ignored, 19); /* visual.blocks.0.*, visual.merger.*, patch_embed */
    /* the rope resource's sections evaluate to the config's list */
    ms_value v;
    ms_error err = {0};
    const ms_node *n = fx.m->nodes[0];
    assert_int_equal(ms_expr_eval(ms_resource_arg(n->resources[1], "sections"), fx.values, &v, &err), MS_OK);
    assert_int_equal(v.type, MS_TYPE_LIST);
    assert_int_equal(v.n, 3);
    fixture_free(&fx);
}

static void test_eval_errors_name_the_parameter(void **state) {
    (void)state;
    ms_compile *c = NULL;
    ms_error err = {0};
    assert_int_equal(ms_compile_file("models/llama.mstar", 0, &c, &err), MS_OK);
    const ms_model *m = ms_compile_model(c);
    ms_value *v = calloc((size_t)m->n_params, sizeof *v);
    json_error_t jerr;
    json_t *j = json_loads("{\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"intermediate_size\": 8,"
                           " \"vocab_size\": 16}", 0, &jerr);
    assert_int_equal(ms_config_eval(m, j, v, &err), MS_ERR_FORMAT);
    assert_string_equal(err.msg, "config.json has no \"hidden_size\" (required by parameter 'hidden_size')");
    json_object_set_new(j, "hidden_size", json_string("128"));
    assert_int_equal(ms_config_eval(m, j, v, &err), MS_ERR_FORMAT);
    assert_string_equal(err.msg, "config.json: \"hidden_size\" (parameter 'hidden_size') should be an int, got a string");
    json_object_set_new(j, "hidden_size", json_integer(128));
    json_object_set_new(j, "num_attention_heads", json_integer(0));
    assert_int_equal(ms_config_eval(m, j, v, &err), MS_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "division by zero"));
    json_object_set_new(j, "num_attention_heads", json_integer(4));
    assert_int_equal(ms_config_eval(m, j, v, &err), MS_OK);
    assert_int_equal(v[ms_model_find_param(m, "head_dim")->index].i, 32);
    assert_true(v[ms_model_find_param(m, "rms_norm_eps")->index].f == 1e-5);
    json_decref(j);
    free(v);
    ms_compile_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_llama_gqa),
        ms_unit_test(test_mistral_window),
        ms_unit_test(test_llama31_rope),
        ms_unit_test(test_llama31_rope_legacy_layout),
        ms_unit_test(test_qwen3),
        ms_unit_test(test_qwen2vl),
        ms_unit_test(test_eval_errors_name_the_parameter),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
