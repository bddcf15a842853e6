/*
 * test_hf_config.c - config.json typed access, both RoPE layouts, eos ids; on every hf fixture and
 * on configs written into a mkdtemp folder.
 */
#include "ms_test.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hf_config.h"

#include "ms_test_impl.h"

/* ---- helpers ---- */

static char tmp_dir[256];

static int tmp_setup(void **state) {
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/ms_test_cfg_XXXXXX");
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

static const char *write_tmp(const char *name, const char *text) {
    static char p[512];
    snprintf(p, sizeof p, "%s/%s", tmp_dir, name);
    FILE *fp = fopen(p, "w");
    assert_non_null(fp);
    fputs(text, fp);
    fclose(fp);
    return p;
}

/* Assert a one-line message that names `file` and contains `what`. */
static void assert_msg(const ms_error *err, const char *file, const char *what) {
    if (strstr(err->msg, file) == NULL || strstr(err->msg, what) == NULL || strchr(err->msg, '\n') != NULL)
        fail_msg("message '%s' should name '%s' and say '%s'", err->msg, file, what);
}

static ms_hf_config *load_fixture(const char *rel) {
    ms_error err = {0};
    ms_hf_config *cfg = NULL;
    if (ms_hf_config_init(&cfg, ms_test_fixture(rel), &err) != MS_OK)
        fail_msg("%s", err.msg);
    return cfg;
}

/* ---- fixtures ---- */

/* The fields a Llama-family model declares, read from every causal LM fixture. */
static void test_fixture_configs_fill_llama_fields(void **state) {
    (void)state;
    static const struct {
        const char *dir;
        int64_t hidden, layers, heads, kv_heads, head_dim, inter, vocab;
        double eps;
        bool tied;
    } want[] = {
        {"hf/llama_gqa", 128, 3, 8, 2, 16, 344, 512, 1e-5, false},
        {"hf/llama31_rope", 128, 2, 4, 4, 32, 256, 512, 1e-5, true},
        {"hf/llama31_rope_legacy", 128, 2, 4, 4, 32, 256, 512, 1e-5, true},
        {"hf/qwen3", 96, 2, 4, 2, 48, 192, 512, 1e-6, true},
        {"hf/mistral_window", 128, 2, 4, 2, 32, 256, 512, 1e-5, false},
        {"hf/llama_cfg", 64, 2, 4, 2, 16, 128, 512, 1e-6, false},
        {"hf/qwen2vl_mrope", 128, 2, 4, 2, 32, 256, 512, 1e-6, false},  /* via text_config */
    };
    for (size_t k = 0; k < MS_ARRAY_LEN(want); k++) {
        ms_hf_config *cfg = load_fixture(want[k].dir);
        ms_error err = {0};
        int64_t hidden, layers, heads, kv, hd, inter, vocab;
        double eps;
        bool tied;
        assert_int_equal(ms_hf_config_get_int(cfg, "hidden_size", &hidden, &err), MS_OK);
        assert_int_equal(ms_hf_config_get_int(cfg, "num_hidden_layers", &layers, &err), MS_OK);
        assert_int_equal(ms_hf_config_get_int(cfg, "num_attention_heads", &heads, &err), MS_OK);
        assert_int_equal(ms_hf_config_get_int_or(cfg, "num_key_value_heads", heads, &kv, &err), MS_OK);
        assert_int_equal(ms_hf_config_get_int_or(cfg, "head_dim", hidden / heads, &hd, &err), MS_OK);
        assert_int_equal(ms_hf_config_get_int(cfg, "intermediate_size", &inter, &err), MS_OK);
        assert_int_equal(ms_hf_config_get_int(cfg, "vocab_size", &vocab, &err), MS_OK);
        assert_int_equal(ms_hf_config_get_float_or(cfg, "rms_norm_eps", 1e-5, &eps, &err), MS_OK);
        assert_int_equal(ms_hf_config_get_bool_or(cfg, "tie_word_embeddings", false, &tied, &err), MS_OK);
        assert_int_equal(hidden, want[k].hidden);
        assert_int_equal(layers, want[k].layers);
        assert_int_equal(heads, want[k].heads);
        assert_int_equal(kv, want[k].kv_heads);
        assert_int_equal(hd, want[k].head_dim);
        assert_int_equal(inter, want[k].inter);
        assert_int_equal(vocab, want[k].vocab);
        assert_true(eps == want[k].eps);
        assert_int_equal(tied, want[k].tied);
        ms_rope_params rope;
        if (ms_hf_config_get_rope(cfg, &rope, &err) != MS_OK)
            fail_msg("%s", err.msg);
        int64_t eos[4];
        size_t n_eos;
        assert_int_equal(ms_hf_config_get_eos_ids(cfg, eos, 4, &n_eos, &err), MS_OK);
        assert_int_equal(n_eos, 1);
        ms_hf_config_free(cfg);
    }
}

static void test_both_rope_layouts_agree(void **state) {
    (void)state;
    ms_hf_config *a = load_fixture("hf/llama31_rope");
    ms_hf_config *b = load_fixture("hf/llama31_rope_legacy");
    ms_error err = {0};
    ms_rope_params ra, rb;
    assert_int_equal(ms_hf_config_get_rope(a, &ra, &err), MS_OK);
    assert_int_equal(ms_hf_config_get_rope(b, &rb, &err), MS_OK);
    assert_int_equal(ra.type, MS_ROPE_TYPE_LLAMA3);
    assert_true(ra.theta == 500000.0);
    assert_true(ra.factor == 8.0);
    assert_true(ra.low_freq_factor == 1.0);
    assert_true(ra.high_freq_factor == 4.0);
    assert_int_equal(ra.original_max_position_embeddings, 64);
    assert_true(ra.partial_rotary_factor == 1.0);
    assert_memory_equal(&ra, &rb, sizeof ra);
    /* plain lookups see one layout: rope_theta and the scaling fields read the same from both */
    static const char *const keys[] = {"rope_theta", "rope_parameters.rope_theta", "rope_parameters.factor",
                                       "rope_scaling.factor", "rope_scaling.high_freq_factor",
                                       "rope_parameters.original_max_position_embeddings"};
    static const double want[] = {500000.0, 500000.0, 8.0, 8.0, 4.0, 64.0};
    for (size_t k = 0; k < MS_ARRAY_LEN(keys); k++) {
        double x = 0, y = 0;
        assert_int_equal(ms_hf_config_get_float(a, keys[k], &x, &err), MS_OK);
        assert_int_equal(ms_hf_config_get_float(b, keys[k], &y, &err), MS_OK);
        assert_true(x == want[k] && y == want[k]);
    }
    const char *ta, *tb;
    assert_int_equal(ms_hf_config_get_string(a, "rope_scaling.rope_type", &ta, &err), MS_OK);
    assert_int_equal(ms_hf_config_get_string(b, "rope_parameters.rope_type", &tb, &err), MS_OK);
    assert_string_equal(ta, "llama3");
    assert_string_equal(tb, "llama3");
    assert_string_equal(ms_rope_type_name(ra.type), "llama3");
    ms_hf_config_free(a);
    ms_hf_config_free(b);
}

static void test_rope_default_qwen3_and_mrope(void **state) {
    (void)state;
    ms_error err = {0};
    ms_rope_params r;
    ms_hf_config *cfg = load_fixture("hf/qwen3");
    assert_int_equal(ms_hf_config_get_rope(cfg, &r, &err), MS_OK);
    assert_int_equal(r.type, MS_ROPE_TYPE_DEFAULT);
    assert_true(r.theta == 1e6);
    assert_true(r.factor == 1.0);
    assert_int_equal(r.n_mrope_sections, 0);
    ms_hf_config_free(cfg);
    /* a weights file stands for its folder */
    cfg = load_fixture("hf/qwen3/model.safetensors");
    assert_non_null(strstr(ms_hf_config_path(cfg), "hf/qwen3/config.json"));
    ms_hf_config_free(cfg);
    {
        ms_error e2 = {0};
        ms_hf_config *c2 = NULL;
        assert_int_equal(ms_hf_config_init(&c2, "/nonexistent/model.safetensors.index.json", &e2), MS_ERR_NOT_FOUND);
        assert_msg(&e2, "/nonexistent/config.json", "cannot read");
    }
    cfg = load_fixture("hf/qwen2vl_mrope/config.json");
    assert_int_equal(ms_hf_config_get_rope(cfg, &r, &err), MS_OK);
    assert_int_equal(r.type, MS_ROPE_TYPE_DEFAULT);
    assert_true(r.theta == 10000.0);
    assert_int_equal(r.n_mrope_sections, 3);
    assert_int_equal(r.mrope_section[0], 4);
    assert_int_equal(r.mrope_section[1], 6);
    assert_int_equal(r.mrope_section[2], 6);
    /* eos from generation_config.json */
    int64_t eos[4];
    size_t n;
    assert_int_equal(ms_hf_config_get_eos_ids(cfg, eos, 4, &n, &err), MS_OK);
    assert_int_equal(n, 1);
    assert_int_equal(eos[0], 151645);
    ms_hf_config_free(cfg);
}

static void test_generic_accessor_types(void **state) {
    (void)state;
    ms_hf_config *cfg = load_fixture("hf/mistral_window");
    ms_error err = {0};
    ms_cfg_value v;
    assert_int_equal(ms_hf_config_get(cfg, "sliding_window", MS_CFG_INT, &v, &err), MS_OK);
    assert_true(v.present);
    assert_int_equal(v.i, 8);
    assert_int_equal(ms_hf_config_get(cfg, "model_type", MS_CFG_STRING, &v, &err), MS_OK);
    assert_string_equal(v.s, "mistral");
    assert_int_equal(ms_hf_config_get(cfg, "architectures", MS_CFG_STRING, &v, &err), MS_ERR_FORMAT);
    assert_msg(&err, "mistral_window/config.json", "field 'architectures' is a list, expected a string");
    assert_int_equal(ms_hf_config_get(cfg, "no_such_field", MS_CFG_FLOAT, &v, &err), MS_OK);
    assert_false(v.present);
    assert_int_equal(ms_hf_config_get(cfg, "rope_parameters.rope_theta", MS_CFG_FLOAT, &v, &err), MS_OK);
    assert_true(v.present && v.f == 10000.0);
    assert_int_equal(ms_hf_config_get(cfg, "rope_parameters.rope_theta", MS_CFG_INT, &v, &err), MS_OK);
    assert_int_equal(v.i, 10000);  /* 10000.0 is integral */
    assert_int_equal(ms_hf_config_get(cfg, "rms_norm_eps", MS_CFG_INT, &v, &err), MS_ERR_FORMAT);
    assert_msg(&err, "config.json", "field 'rms_norm_eps' is a real number, expected an integer");
    assert_int_equal(ms_hf_config_get(cfg, "use_cache", MS_CFG_BOOL, &v, &err), MS_OK);
    assert_true(v.b);
    assert_int_equal(ms_hf_config_get(cfg, "hidden_size", MS_CFG_INT_LIST, &v, &err), MS_OK);
    assert_int_equal(v.n, 1);
    assert_true(ms_hf_config_has(cfg, "sliding_window"));
    assert_false(ms_hf_config_has(cfg, "rope_scaling"));
    const char *s;
    assert_int_equal(ms_hf_config_get_string_or(cfg, "hidden_act", "gelu", &s, &err), MS_OK);
    assert_string_equal(s, "silu");
    assert_int_equal(ms_hf_config_get_string_or(cfg, "nope", "gelu", &s, &err), MS_OK);
    assert_string_equal(s, "gelu");
    ms_hf_config_free(cfg);

    /* null counts as absent; text_config fallback; lists */
    cfg = load_fixture("hf/qwen2vl_mrope");
    assert_int_equal(ms_hf_config_get(cfg, "sliding_window", MS_CFG_INT, &v, &err), MS_OK);
    assert_false(v.present);
    int64_t sec[4];
    size_t n;
    assert_int_equal(ms_hf_config_get_int_list(cfg, "rope_parameters.mrope_section", true, sec, 4, &n, &err),
                     MS_OK);
    assert_int_equal(n, 3);
    assert_int_equal(ms_hf_config_get_int_list(cfg, "rope_parameters.mrope_section", true, sec, 2, &n, &err),
                     MS_ERR_LIMIT);
    assert_int_equal(ms_hf_config_get_int_list(cfg, "absent_list", false, sec, 4, &n, &err), MS_OK);
    assert_int_equal(n, 0);
    assert_int_equal(ms_hf_config_get_int_list(cfg, "absent_list", true, sec, 4, &n, &err), MS_ERR_NOT_FOUND);
    int64_t ps;
    assert_int_equal(ms_hf_config_get_int(cfg, "vision_config.patch_size", &ps, &err), MS_OK);
    assert_int_equal(ps, 14);
    ms_hf_config_free(cfg);
}

/* Every hf fixture's config loads, fills a declared table, and has eos ids; whisper's own fields. */
static void test_every_fixture_config_and_fill(void **state) {
    (void)state;
    static const char *const dirs[] = {"hf/llama_gqa", "hf/llama31_rope", "hf/llama31_rope_legacy", "hf/qwen3",
                                       "hf/mistral_window", "hf/llama_cfg", "hf/qwen2vl_mrope", "hf/whisper_tiny"};
    for (size_t k = 0; k < MS_ARRAY_LEN(dirs); k++) {
        ms_hf_config *cfg = load_fixture(dirs[k]);
        ms_error err = {0};
        static const ms_cfg_param common[] = {
            {"vocab_size", MS_CFG_INT, true},
            {"tie_word_embeddings", MS_CFG_BOOL, false},
            {"model_type", MS_CFG_STRING, true},
            {"architectures", MS_CFG_STRING, false},
        };
        ms_cfg_value v[4];
        /* architectures is a list: the declared type is wrong, and the error says so */
        assert_int_equal(ms_hf_config_fill(cfg, common, 4, v, &err), MS_ERR_FORMAT);
        assert_msg(&err, dirs[k], "field 'architectures' is a list, expected a string");
        assert_int_equal(ms_hf_config_fill(cfg, common, 3, v, &err), MS_OK);
        assert_int_equal(v[0].i, 512);
        assert_true(v[1].present);
        assert_non_null(v[2].s);
        int64_t eos[4];
        size_t n;
        assert_int_equal(ms_hf_config_get_eos_ids(cfg, eos, 4, &n, &err), MS_OK);
        assert_int_equal(n, 1);
        ms_hf_config_free(cfg);
    }
    ms_hf_config *cfg = load_fixture("hf/whisper_tiny");
    ms_error err = {0};
    static const ms_cfg_param whisper[] = {
        {"d_model", MS_CFG_INT, true},           {"encoder_layers", MS_CFG_INT, true},
        {"decoder_layers", MS_CFG_INT, true},    {"num_mel_bins", MS_CFG_INT, true},
        {"max_source_positions", MS_CFG_INT, true}, {"decoder_start_token_id", MS_CFG_INT, true},
        {"scale_embedding", MS_CFG_BOOL, true},  {"suppress_tokens", MS_CFG_INT_LIST, false},
        {"activation_function", MS_CFG_STRING, true},
    };
    ms_cfg_value v[MS_ARRAY_LEN(whisper)];
    assert_int_equal(ms_hf_config_fill(cfg, whisper, MS_ARRAY_LEN(whisper), v, &err), MS_OK);
    assert_int_equal(v[0].i, 64);
    assert_int_equal(v[1].i, 2);
    assert_int_equal(v[3].i, 80);
    assert_int_equal(v[4].i, 32);
    assert_int_equal(v[5].i, 3);
    assert_false(v[6].b);
    assert_false(v[7].present);  /* null */
    assert_string_equal(v[8].s, "gelu");
    static const ms_cfg_param missing[] = {{"d_model", MS_CFG_INT, true}, {"hidden_size", MS_CFG_INT, true}};
    assert_int_equal(ms_hf_config_fill(cfg, missing, 2, v, &err), MS_ERR_NOT_FOUND);
    assert_msg(&err, "whisper_tiny/config.json", "required field 'hidden_size' is missing");
    ms_hf_config_free(cfg);
}

/* ---- configs written in a temp folder ---- */

static void test_missing_required_field_names_file_and_field(void **state) {
    (void)state;
    write_tmp("config.json", "{\"num_hidden_layers\": 2, \"vocab_size\": 32}");
    ms_error err = {0};
    ms_hf_config *cfg = NULL;
    assert_int_equal(ms_hf_config_init(&cfg, tmp_dir, &err), MS_OK);
    int64_t v;
    assert_int_equal(ms_hf_config_get_int(cfg, "hidden_size", &v, &err), MS_ERR_NOT_FOUND);
    assert_msg(&err, tmp_dir, "/config.json: required field 'hidden_size' is missing");
    double f;
    assert_int_equal(ms_hf_config_get_float(cfg, "rms_norm_eps", &f, &err), MS_ERR_NOT_FOUND);
    assert_msg(&err, "config.json", "'rms_norm_eps'");
    ms_rope_params r;
    assert_int_equal(ms_hf_config_get_rope(cfg, &r, &err), MS_OK);  /* no rope fields: defaults */
    assert_true(r.theta == 10000.0 && r.type == MS_ROPE_TYPE_DEFAULT);
    size_t n = 9;
    int64_t eos[2];
    assert_int_equal(ms_hf_config_get_eos_ids(cfg, eos, 2, &n, &err), MS_OK);
    assert_int_equal(n, 0);
    ms_hf_config_free(cfg);
}

static void test_malformed_json_names_line_and_column(void **state) {
    (void)state;
    const char *p = write_tmp("config.json", "{\n  \"hidden_size\": 64,\n  \"vocab_size\": ,\n}\n");
    ms_error err = {0};
    ms_hf_config *cfg = NULL;
    assert_int_equal(ms_hf_config_init(&cfg, p, &err), MS_ERR_PARSE);
    assert_null(cfg);
    assert_msg(&err, "config.json:3:", "malformed JSON");
    write_tmp("config.json", "[1, 2]");
    assert_int_equal(ms_hf_config_init(&cfg, tmp_dir, &err), MS_ERR_FORMAT);
    assert_msg(&err, "config.json", "top level is not a JSON object");
    /* bad generation_config.json is an error too (it decides the stop ids) */
    write_tmp("config.json", "{\"eos_token_id\": 2}");
    write_tmp("generation_config.json", "{\"eos_token_id\": [2, 3");
    assert_int_equal(ms_hf_config_init(&cfg, tmp_dir, &err), MS_ERR_PARSE);
    assert_msg(&err, "generation_config.json:1:", "malformed JSON");
}

static void test_missing_config_file(void **state) {
    (void)state;
    ms_error err = {0};
    ms_hf_config *cfg = NULL;
    assert_int_equal(ms_hf_config_init(&cfg, tmp_dir, &err), MS_ERR_NOT_FOUND);
    assert_msg(&err, "config.json", "cannot read");
    /* a folder named config.json: jansson read it as an empty file ("malformed JSON ... near end
     * of file"); it is now named for what it is */
    char dir[600];
    snprintf(dir, sizeof dir, "%s/config.json", tmp_dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_int_equal(ms_hf_config_init(&cfg, tmp_dir, &err), MS_ERR_IO);
    assert_null(cfg);
    assert_msg(&err, "config.json", "cannot read: not a regular file");
    assert_int_equal(rmdir(dir), 0);
    /* the same for the optional generation_config.json */
    write_tmp("config.json", "{\"eos_token_id\": 2}");
    snprintf(dir, sizeof dir, "%s/generation_config.json", tmp_dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    assert_int_equal(ms_hf_config_init(&cfg, tmp_dir, &err), MS_ERR_IO);
    assert_msg(&err, "generation_config.json", "not a regular file");
    assert_int_equal(rmdir(dir), 0);
}

static void test_eos_lists_and_precedence(void **state) {
    (void)state;
    write_tmp("config.json", "{\"eos_token_id\": 7}");
    write_tmp("generation_config.json", "{\"eos_token_id\": [128001, 128008, 128009, 128008]}");
    ms_error err = {0};
    ms_hf_config *cfg = NULL;
    assert_int_equal(ms_hf_config_init(&cfg, tmp_dir, &err), MS_OK);
    int64_t eos[4];
    size_t n;
    assert_int_equal(ms_hf_config_get_eos_ids(cfg, eos, 4, &n, &err), MS_OK);
    assert_int_equal(n, 3);
    assert_int_equal(eos[0], 128001);
    assert_int_equal(eos[2], 128009);
    assert_int_equal(ms_hf_config_get_eos_ids(cfg, eos, 2, &n, &err), MS_ERR_LIMIT);
    ms_hf_config_free(cfg);
    /* generation config without eos: falls back to config.json */
    write_tmp("generation_config.json", "{\"eos_token_id\": null}");
    assert_int_equal(ms_hf_config_init(&cfg, tmp_dir, &err), MS_OK);
    assert_int_equal(ms_hf_config_get_eos_ids(cfg, eos, 4, &n, &err), MS_OK);
    assert_int_equal(n, 1);
    assert_int_equal(eos[0], 7);
    ms_hf_config_free(cfg);
    write_tmp("generation_config.json", "{\"eos_token_id\": [\"x\"]}");
    assert_int_equal(ms_hf_config_init(&cfg, tmp_dir, &err), MS_OK);
    assert_int_equal(ms_hf_config_get_eos_ids(cfg, eos, 4, &n, &err), MS_ERR_FORMAT);
    assert_msg(&err, "generation_config.json", "field 'eos_token_id'[0] is a string");
    ms_hf_config_free(cfg);
}

static void test_rope_errors_and_other_types(void **state) {
    (void)state;
    ms_error err = {0};
    ms_hf_config *cfg = NULL;
    ms_rope_params r;
    /* llama3 missing a field, in each layout */
    write_tmp("config.json", "{\"rope_parameters\": {\"rope_type\": \"llama3\", \"rope_theta\": 5e5,"
                             " \"factor\": 8.0, \"high_freq_factor\": 4.0,"
                             " \"original_max_position_embeddings\": 8192}}");
    assert_int_equal(ms_hf_config_init(&cfg, tmp_dir, &err), MS_OK);
    assert_int_equal(ms_hf_config_get_rope(cfg, &r, &err), MS_ERR_NOT_FOUND);
    assert_msg(&err, "config.json", "required field 'rope_parameters.low_freq_factor' is missing");
    ms_hf_config_free(cfg);
    write_tmp("config.json", "{\"rope_theta\": 5e5, \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0,"
                             " \"low_freq_factor\": 1, \"high_freq_factor\": 4}}");
    assert_int_equal(ms_hf_config_init(&cfg, tmp_dir, &err), MS_OK);
    assert_int_equal(ms_hf_config_get_rope(cfg, &r, &err), MS_ERR_NOT_FOUND);
    assert_msg(&err, "config.json", "'rope_scaling.original_max_position_embeddings' is missing");
    ms_hf_config_free(cfg);
    /* older "type" key, linear */
    write_tmp("config.json", "{\"rope_theta\": 1000, \"rope_scaling\": {\"type\": \"linear\", \"factor\": 4}}");
    assert_int_equal(ms_hf_config_init(&cfg, tmp_dir, &err), MS_OK);
    assert_int_equal(ms_hf_config_get_rope(cfg, &r, &err), MS_OK);
    assert_int_equal(r.type, MS_ROPE_TYPE_LINEAR);
    assert_true(r.factor == 4.0 && r.theta == 1000.0);
    const char *ty;
    assert_int_equal(ms_hf_config_get_string(cfg, "rope_parameters.rope_type", &ty, &err), MS_OK);
    assert_string_equal(ty, "linear");  /* from the older "type" key */
    ms_hf_config_free(cfg);
    /* yarn defaults */
    write_tmp("config.json", "{\"rope_parameters\": {\"rope_type\": \"yarn\", \"rope_theta\": 1e6, \"factor\": 4,"
                             " \"original_max_position_embeddings\": 32768}}");
    assert_int_equal(ms_hf_config_init(&cfg, tmp_dir, &err), MS_OK);
    assert_int_equal(ms_hf_config_get_rope(cfg, &r, &err), MS_OK);
    assert_int_equal(r.type, MS_ROPE_TYPE_YARN);
    assert_true(r.beta_fast == 32.0 && r.beta_slow == 1.0);
    assert_int_equal(r.original_max_position_embeddings, 32768);
    ms_hf_config_free(cfg);
    /* unknown type, wrong types */
    write_tmp("config.json", "{\"rope_scaling\": {\"rope_type\": \"longrope\"}}");
    assert_int_equal(ms_hf_config_init(&cfg, tmp_dir, &err), MS_OK);
    assert_int_equal(ms_hf_config_get_rope(cfg, &r, &err), MS_ERR_UNSUPPORTED);
    assert_msg(&err, "config.json", "rope_scaling.rope_type 'longrope' is not supported");
    ms_hf_config_free(cfg);
    write_tmp("config.json", "{\"rope_theta\": \"big\"}");
    assert_int_equal(ms_hf_config_init(&cfg, tmp_dir, &err), MS_OK);
    assert_int_equal(ms_hf_config_get_rope(cfg, &r, &err), MS_ERR_FORMAT);
    assert_msg(&err, "config.json", "field 'rope_theta' is a string, expected a number");
    ms_hf_config_free(cfg);
    write_tmp("config.json", "{\"rope_scaling\": 3}");
    assert_int_equal(ms_hf_config_init(&cfg, tmp_dir, &err), MS_OK);
    assert_int_equal(ms_hf_config_get_rope(cfg, &r, &err), MS_ERR_FORMAT);
    assert_msg(&err, "config.json", "'rope_scaling' is an integer, expected an object");
    ms_hf_config_free(cfg);
}

/* Every float -> integer conversion is range-checked, the message naming the field: a real
 * original_max_position_embeddings past int64 used to be converted anyway (undefined behaviour,
 * found by fuzzing). */
static void test_out_of_range_numbers_name_the_field(void **state) {
    (void)state;
    ms_error err = {0};
    ms_hf_config *cfg = NULL;
    ms_rope_params r;
    static const char *const origs[] = {"1e300", "9223372036854775808.0", "-1e300", "1.5"};
    for (size_t i = 0; i < MS_ARRAY_LEN(origs); i++) {
        char text[512];
        snprintf(text, sizeof text, "{\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0,"
                 " \"low_freq_factor\": 1, \"high_freq_factor\": 4, \"original_max_position_embeddings\": %s}}",
                 origs[i]);
        assert_int_equal(ms_hf_config_init_from_string(&cfg, "cfg.json", text, &err), MS_OK);
        assert_int_equal(ms_hf_config_get_rope(cfg, &r, &err), MS_ERR_FORMAT);
        assert_msg(&err, "cfg.json", i < 2 ? "field 'rope_scaling.original_max_position_embeddings' is"
                                            : "original_max_position_embeddings");
        ms_hf_config_free(cfg);
    }
    /* dynamic / yarn read it as optional: the same check */
    assert_int_equal(ms_hf_config_init_from_string(&cfg, "cfg.json", "{\"rope_parameters\": {\"rope_type\": \"yarn\","
                     " \"factor\": 4, \"original_max_position_embeddings\": 1e19}}", &err), MS_OK);
    assert_int_equal(ms_hf_config_get_rope(cfg, &r, &err), MS_ERR_FORMAT);
    assert_msg(&err, "cfg.json", "'rope_parameters.original_max_position_embeddings' is 1e+19, not a count");
    ms_hf_config_free(cfg);
    /* the largest double below 2^63 converts exactly */
    assert_int_equal(ms_hf_config_init_from_string(&cfg, "cfg.json", "{\"rope_parameters\": {\"rope_type\": \"yarn\","
                     " \"factor\": 4, \"original_max_position_embeddings\": 9223372036854774784.0}}", &err), MS_OK);
    assert_int_equal(ms_hf_config_get_rope(cfg, &r, &err), MS_OK);
    assert_true(r.original_max_position_embeddings == INT64_C(9223372036854774784));
    ms_hf_config_free(cfg);
    /* integer fields given as integral reals: in range converts, out of range names the field */
    assert_int_equal(ms_hf_config_init_from_string(&cfg, "cfg.json", "{\"a\": 8192.0, \"b\": 1e300, \"c\": -1e19,"
                     " \"d\": [1, 2e19]}", &err), MS_OK);
    int64_t v;
    assert_int_equal(ms_hf_config_get_int(cfg, "a", &v, &err), MS_OK);
    assert_int_equal(v, 8192);
    assert_int_equal(ms_hf_config_get_int(cfg, "b", &v, &err), MS_ERR_FORMAT);
    assert_msg(&err, "cfg.json", "field 'b' is 1e+300, outside the 64-bit integer range");
    assert_int_equal(ms_hf_config_get_int(cfg, "c", &v, &err), MS_ERR_FORMAT);
    assert_msg(&err, "cfg.json", "field 'c' is -1e+19, outside the 64-bit integer range");
    int64_t list[4];
    size_t n;
    assert_int_equal(ms_hf_config_get_int_list(cfg, "d", true, list, 4, &n, &err), MS_ERR_FORMAT);
    assert_msg(&err, "cfg.json", "field 'd'[1] is 2e+19, outside the 64-bit integer range");
    ms_hf_config_free(cfg);
}

static void test_config_from_string(void **state) {
    (void)state;
    ms_error err = {0};
    ms_hf_config *cfg = NULL;
    assert_int_equal(ms_hf_config_init_from_string(&cfg, "model.bin", "{\"hidden_size\": 64}", &err), MS_OK);
    int64_t v;
    assert_int_equal(ms_hf_config_get_int(cfg, "hidden_size", &v, &err), MS_OK);
    assert_int_equal(v, 64);
    assert_int_equal(ms_hf_config_get_int(cfg, "vocab_size", &v, &err), MS_ERR_NOT_FOUND);
    assert_msg(&err, "model.bin", "'vocab_size'");
    ms_hf_config_free(cfg);
    assert_int_equal(ms_hf_config_init_from_string(&cfg, "x", "{", &err), MS_ERR_PARSE);
}

static void test_config_survives_allocation_failures(void **state) {
    (void)state;
    int failures = 0;
    for (int64_t k = 1; k < 100; k++) {
        ms_error err = {0};
        ms_hf_config *cfg = NULL;
        ms_alloc_fail_nth(k);
        ms_status st = ms_hf_config_init(&cfg, ms_test_fixture("hf/llama_gqa"), &err);
        ms_alloc_fail_nth(0);
        if (st == MS_OK) {
            ms_hf_config_free(cfg);
            break;
        }
        assert_int_equal(st, MS_ERR_OOM);
        failures++;
    }
    assert_true(failures >= 3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_fixture_configs_fill_llama_fields),
        ms_unit_test(test_both_rope_layouts_agree),
        ms_unit_test(test_rope_default_qwen3_and_mrope),
        ms_unit_test(test_generic_accessor_types),
        ms_unit_test(test_every_fixture_config_and_fill),
        tmp_test(test_missing_required_field_names_file_and_field),
        tmp_test(test_malformed_json_names_line_and_column),
        tmp_test(test_missing_config_file),
        tmp_test(test_eos_lists_and_precedence),
        tmp_test(test_rope_errors_and_other_types),
        ms_unit_test(test_out_of_range_numbers_name_the_field),
        ms_unit_test(test_config_from_string),
        ms_unit_test(test_config_survives_allocation_failures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
