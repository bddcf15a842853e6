/*
 * fuzz_config.c - libFuzzer target for config.json / generation_config.json (runtime/hf_config.c).
 *
 * Input: config.json bytes, optionally followed by a NUL and generation_config.json bytes. Both are
 * written into a private folder and loaded with ms_hf_config_init (the folder form), and the first
 * part also through ms_hf_config_init_from_string. On a loaded config: every key a model declares
 * in practice, read as each of the six types (ms_hf_config_get, the _or and required wrappers, the
 * list readers into a small array), ms_hf_config_fill, ms_hf_config_get_rope and the RoPE tables
 * built from it (ms_rope_config_from_hf + ms_rope_compute_inv_freq, as the engine does), and
 * ms_hf_config_get_eos_ids. Results are not checked against anything (random configs); a failure
 * must be one line and not out of memory, nothing may leak, and ASan/UBSan (with which the target
 * is built) catch the rest. Run it with `make fuzz FUZZ_TARGETS=config` (tests/fuzz.sh).
 */
#include "fuzz_util.h"

#include "backend.h"
#include "hf_config.h"

/* Keys read by the models in models/ and the engine, plus dotted and text_config forms. */
static const char *const fuzz_keys[] = {
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "vocab_size", "max_position_embeddings", "rms_norm_eps", "rope_theta", "partial_rotary_factor",
    "tie_word_embeddings", "hidden_act", "model_type", "architectures", "sliding_window", "eos_token_id",
    "bos_token_id", "torch_dtype", "attention_bias", "rope_scaling.factor", "rope_scaling.rope_type",
    "rope_parameters.rope_theta", "rope_parameters.rope_type", "rope_parameters.mrope_section",
    "rope_scaling.mrope_section", "text_config.hidden_size", "a.b.c.d", "", ".", "rope_parameters.",
};

static void fuzz_read_keys(const ms_hf_config *cfg) {
    ms_error err = {0};
    for (size_t k = 0; k < MS_ARRAY_LEN(fuzz_keys); k++) {
        const char *key = fuzz_keys[k];
        for (int t = 0; t < MS_CFG_TYPE_COUNT; t++) {
            ms_cfg_value v;
            fuzz_check_error("fuzz_config", ms_hf_config_get(cfg, key, (ms_cfg_type)t, &v, &err), &err);
            fuzz_check_error("fuzz_config", ms_hf_config_require(cfg, key, (ms_cfg_type)t, &v, &err), &err);
        }
        int64_t i;
        double f;
        bool b;
        const char *s;
        ms_hf_config_get_int_or(cfg, key, 1, &i, &err);
        ms_hf_config_get_float_or(cfg, key, 1.0, &f, &err);
        ms_hf_config_get_bool_or(cfg, key, false, &b, &err);
        ms_hf_config_get_string_or(cfg, key, "x", &s, &err);
        int64_t ints[3];
        double reals[3];
        size_t n;
        fuzz_check_error("fuzz_config", ms_hf_config_get_int_list(cfg, key, false, ints, 3, &n, &err), &err);
        fuzz_check_error("fuzz_config", ms_hf_config_get_float_list(cfg, key, true, reals, 3, &n, &err), &err);
        (void)ms_hf_config_has(cfg, key);
    }
    static const ms_cfg_param params[] = {
        {"hidden_size", MS_CFG_INT, true},         {"num_key_value_heads", MS_CFG_INT, false},
        {"rms_norm_eps", MS_CFG_FLOAT, false},     {"tie_word_embeddings", MS_CFG_BOOL, false},
        {"hidden_act", MS_CFG_STRING, false},      {"rope_scaling.mrope_section", MS_CFG_INT_LIST, false},
    };
    ms_cfg_value vals[MS_ARRAY_LEN(params)];
    fuzz_check_error("fuzz_config", ms_hf_config_fill(cfg, params, MS_ARRAY_LEN(params), vals, &err), &err);
}

static void fuzz_rope_and_eos(const ms_hf_config *cfg) {
    ms_error err = {0};
    ms_rope_params rp;
    ms_status st = ms_hf_config_get_rope(cfg, &rp, &err);
    fuzz_check_error("fuzz_config", st, &err);
    if (st == MS_OK) {
        static const int32_t head_dims[] = {2, 64, 128};
        for (size_t h = 0; h < MS_ARRAY_LEN(head_dims); h++) {
            ms_rope_config rc;
            st = ms_rope_config_from_hf(&rp, MS_ROPE_ROTATE_HALF, head_dims[h], &rc, &err);
            fuzz_check_error("fuzz_config", st, &err);
            if (st == MS_OK) {
                float inv_freq[64];
                fuzz_check_error("fuzz_config", ms_rope_compute_inv_freq(&rc, inv_freq, &err), &err);
            }
        }
    }
    int64_t eos[4];
    size_t n;
    fuzz_check_error("fuzz_config", ms_hf_config_get_eos_ids(cfg, eos, MS_ARRAY_LEN(eos), &n, &err), &err);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 65536)
        return -1;
    int64_t live = ms_alloc_get_stats().live_blocks;
    const uint8_t *cfg_text, *gen_text;
    size_t cfg_len, gen_len;
    fuzz_part(data, size, 0, &cfg_text, &cfg_len);
    fuzz_write("config.json", cfg_text, cfg_len);
    if (fuzz_part(data, size, 1, &gen_text, &gen_len))
        fuzz_write("generation_config.json", gen_text, gen_len);
    else
        fuzz_unlink("generation_config.json");

    ms_error err = {0};
    ms_hf_config *cfg = NULL;
    ms_status st = ms_hf_config_init(&cfg, fuzz_dir(), &err);
    fuzz_check_error("fuzz_config", st, &err);
    if (st == MS_OK) {
        fuzz_read_keys(cfg);
        fuzz_rope_and_eos(cfg);
    }
    ms_hf_config_free(cfg);

    char *text = fuzz_strndup(cfg_text, cfg_len);
    cfg = NULL;
    st = ms_hf_config_init_from_string(&cfg, "config.json", text, &err);
    fuzz_check_error("fuzz_config", st, &err);
    if (st == MS_OK)
        fuzz_rope_and_eos(cfg);
    ms_hf_config_free(cfg);
    free(text);
    fuzz_check_leaks("fuzz_config", live);
    return 0;
}
