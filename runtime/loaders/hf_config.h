/*
 * hf_config.h - Hugging Face config.json (+ generation_config.json) with typed, named access.
 *
 * The compiler declares a model's config parameters (name, type, default); generated code fills them
 * through ms_hf_config_get (or the typed wrappers), which distinguish "absent" from "wrong type":
 * a missing or null key is reported as not present (the caller applies its default or reports a
 * missing required field with ms_hf_config_require), a key of the wrong type is always an error.
 *
 * Keys are dotted paths into config.json ("rope_parameters.rope_theta"). A key whose first component
 * is absent at the top level is looked up in a top-level "text_config" object when there is one
 * (multimodal checkpoints such as Qwen2-VL nest the language model's fields there, and transformers'
 * get_text_config does the same lookup).
 *
 * RoPE parameters come in two layouts found in the wild: the older top-level "rope_theta" plus an
 * optional "rope_scaling" object (most published checkpoints), and transformers 5's
 * "rope_parameters" object holding rope_theta and the scaling fields. ms_hf_config_get_rope reads
 * both into one ms_rope_params, and plain lookups treat them as one: "rope_theta" (and
 * "partial_rotary_factor") missing at the top level is read from rope_parameters, a missing
 * "rope_parameters.X" from the top-level rope_theta or rope_scaling.X, a missing "rope_scaling.X"
 * from rope_parameters.X. So a model that declares `rope_theta: float = 10000.0` gets 500000 from
 * either layout of a Llama 3.1 config, never the default by accident.
 *
 * Ownership: ms_hf_config_* functions borrow their arguments; the config returned by
 * ms_hf_config_init is owned by the caller (ms_hf_config_free, NULL accepted); strings returned by
 * accessors live as long as the config.
 * Errors: one line "<path>: <problem>" naming the file and the field.
 *
 * Usage:
 *     ms_hf_config *cfg = NULL;
 *     MS_TRY(ms_hf_config_init(&cfg, "path/to/model_dir", err));
 *     int64_t hidden, kv_heads;
 *     MS_TRY(ms_hf_config_get_int(cfg, "hidden_size", &hidden, err));
 *     MS_TRY(ms_hf_config_get_int_or(cfg, "num_key_value_heads", n_heads, &kv_heads, err));
 */
#ifndef MS_HF_CONFIG_H
#define MS_HF_CONFIG_H

#include "ms_base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ms_hf_config ms_hf_config;

/*
 * Load the config at `path`: a folder (reads <path>/config.json, and <path>/generation_config.json
 * when it exists), a config .json file (its sibling generation_config.json is read when present),
 * a weights file (*.safetensors, model.safetensors.index.json: the config.json beside it), or a
 * llama2.c checkpoint (*.bin): the config is derived from its header (ms_llama2c_config_json), or a
 * GGUF (*.gguf): the config is derived from its `<arch>.*` metadata (ms_gguf_model_config_json).
 * Errors: MS_ERR_NOT_FOUND / MS_ERR_IO (cannot read config.json), MS_ERR_PARSE (malformed JSON,
 * with line:column), MS_ERR_FORMAT (top level is not an object), MS_ERR_OOM.
 */
ms_status ms_hf_config_init(ms_hf_config **out, const char *path, ms_error *err);
/*
 * Same, from JSON text in memory (`name` is used in messages, e.g. the llama2.c file a config was
 * derived from). No generation config.
 */
ms_status ms_hf_config_init_from_string(ms_hf_config **out, const char *name, const char *json_text,
                                        ms_error *err);
/* Free. NULL accepted. */
void ms_hf_config_free(ms_hf_config *cfg);

/* Path of config.json as read (borrowed). */
const char *ms_hf_config_path(const ms_hf_config *cfg);

/* ---- typed access ---- */

/* Types a config parameter can have. */
typedef enum ms_cfg_type {
    MS_CFG_INT = 0,     /* JSON integer (or a real with an integral value, e.g. 8192.0) */
    MS_CFG_FLOAT,       /* JSON real or integer */
    MS_CFG_BOOL,        /* JSON true / false */
    MS_CFG_STRING,      /* JSON string */
    MS_CFG_INT_LIST,    /* JSON array of integers (a bare integer counts as a list of one) */
    MS_CFG_FLOAT_LIST,  /* JSON array of numbers (a bare number counts as a list of one) */
    MS_CFG_TYPE_COUNT
} ms_cfg_type;

/* One looked-up value. Only the member of the requested type is set. */
typedef struct ms_cfg_value {
    ms_cfg_type type;  /* the requested type */
    bool present;      /* false: key missing or null (no other member set) */
    int64_t i;         /* MS_CFG_INT */
    double f;          /* MS_CFG_FLOAT */
    bool b;            /* MS_CFG_BOOL */
    const char *s;     /* MS_CFG_STRING, borrowed from the config */
    size_t n;          /* MS_CFG_*_LIST: element count (read the elements with the _list accessors) */
} ms_cfg_value;

/* Name of a type for messages ("integer", "float", ...). */
const char *ms_cfg_type_name(ms_cfg_type t);

/*
 * Look up `key` as `type`. MS_OK with out->present = false when the key is missing or null;
 * MS_ERR_FORMAT "<path>: field 'key' is a string, expected an integer" when present with another
 * type (or a list element has another type).
 */
ms_status ms_hf_config_get(const ms_hf_config *cfg, const char *key, ms_cfg_type type, ms_cfg_value *out,
                           ms_error *err);
/* ms_hf_config_get, and a missing/null key is MS_ERR_NOT_FOUND
 * "<path>: required field 'key' is missing". */
ms_status ms_hf_config_require(const ms_hf_config *cfg, const char *key, ms_cfg_type type, ms_cfg_value *out,
                               ms_error *err);
/* Whether `key` is present and not null. */
bool ms_hf_config_has(const ms_hf_config *cfg, const char *key);
/* Set top-level `key` to the integer `value` (replacing what was there): tensor parallelism's
 * per-rank config (engine/tp.c: local head and MLP counts). Errors: MS_ERR_INVALID_ARG (a dotted
 * key), MS_ERR_OOM. */
ms_status ms_hf_config_set_int(ms_hf_config *cfg, const char *key, int64_t value, ms_error *err);

/* Required typed fields (missing -> MS_ERR_NOT_FOUND, wrong type -> MS_ERR_FORMAT). */
ms_status ms_hf_config_get_int(const ms_hf_config *cfg, const char *key, int64_t *out, ms_error *err);
ms_status ms_hf_config_get_float(const ms_hf_config *cfg, const char *key, double *out, ms_error *err);
ms_status ms_hf_config_get_bool(const ms_hf_config *cfg, const char *key, bool *out, ms_error *err);
ms_status ms_hf_config_get_string(const ms_hf_config *cfg, const char *key, const char **out, ms_error *err);
/* Optional typed fields: `def` when missing or null; wrong type is still MS_ERR_FORMAT. */
ms_status ms_hf_config_get_int_or(const ms_hf_config *cfg, const char *key, int64_t def, int64_t *out,
                                  ms_error *err);
ms_status ms_hf_config_get_float_or(const ms_hf_config *cfg, const char *key, double def, double *out,
                                    ms_error *err);
ms_status ms_hf_config_get_bool_or(const ms_hf_config *cfg, const char *key, bool def, bool *out,
                                   ms_error *err);
ms_status ms_hf_config_get_string_or(const ms_hf_config *cfg, const char *key, const char *def,
                                     const char **out, ms_error *err);
/*
 * Lists: copy up to `cap` elements into out and set *n to the element count. Missing/null: *n = 0
 * and MS_OK when `required` is false, MS_ERR_NOT_FOUND otherwise. More than `cap` elements:
 * MS_ERR_LIMIT naming the field.
 */
ms_status ms_hf_config_get_int_list(const ms_hf_config *cfg, const char *key, bool required, int64_t *out,
                                    size_t cap, size_t *n, ms_error *err);
ms_status ms_hf_config_get_float_list(const ms_hf_config *cfg, const char *key, bool required, double *out,
                                      size_t cap, size_t *n, ms_error *err);

/* One declared config parameter, as the compiler emits them (a static table per model). */
typedef struct ms_cfg_param {
    const char *key;    /* dotted key, e.g. "num_key_value_heads" */
    ms_cfg_type type;
    bool required;      /* missing/null -> MS_ERR_NOT_FOUND; else the caller applies its default */
} ms_cfg_param;

/*
 * Look up every parameter of params[n] into values[n] (values[i].present tells whether the caller's
 * default applies). Stops at the first error (wrong type, missing required field), which names the
 * file and the field. Typical generated code:
 *     static const ms_cfg_param P[] = {{"hidden_size", MS_CFG_INT, true},
 *                                      {"num_key_value_heads", MS_CFG_INT, false}};
 *     ms_cfg_value v[2];
 *     MS_TRY(ms_hf_config_fill(cfg, P, 2, v, err));
 *     int64_t kv_heads = v[1].present ? v[1].i : n_heads;
 */
ms_status ms_hf_config_fill(const ms_hf_config *cfg, const ms_cfg_param *params, size_t n, ms_cfg_value *values,
                            ms_error *err);

/* ---- RoPE ---- */

/* RoPE frequency schemes (transformers' rope_type). ORDER MS_ROPE_TYPE: rope_type_names in .c. */
typedef enum ms_rope_type {
    MS_ROPE_TYPE_DEFAULT = 0,  /* inv_freq[i] = theta^(-2i/d) */
    MS_ROPE_TYPE_LINEAR,       /* positions divided by factor */
    MS_ROPE_TYPE_LLAMA3,       /* Llama 3.1 piecewise frequency scaling */
    MS_ROPE_TYPE_DYNAMIC,      /* dynamic NTK (theta grows past original_max_position_embeddings) */
    MS_ROPE_TYPE_YARN,         /* YaRN */
    MS_ROPE_TYPE_COUNT
} ms_rope_type;

/* Name as written in config.json ("default", "llama3", ...). */
const char *ms_rope_type_name(ms_rope_type t);

#define MS_ROPE_MAX_SECTIONS 4

/* RoPE parameters, whichever config layout they came from. Fields that do not apply keep the
 * neutral value given in the comment. */
typedef struct ms_rope_params {
    ms_rope_type type;
    double theta;                  /* base; 10000 when the config names none */
    double factor;                 /* scaling factor (linear, llama3, dynamic, yarn); 1.0 otherwise */
    double low_freq_factor;        /* llama3; 0 otherwise */
    double high_freq_factor;       /* llama3; 0 otherwise */
    int64_t original_max_position_embeddings;  /* llama3 (required), dynamic/yarn (optional); 0 if none */
    double beta_fast;              /* yarn (default 32); 0 otherwise */
    double beta_slow;              /* yarn (default 1); 0 otherwise */
    double attention_factor;       /* yarn (0 = derive from factor); 0 otherwise */
    double partial_rotary_factor;  /* fraction of head_dim rotated; 1.0 when absent */
    int n_mrope_sections;          /* M-RoPE (Qwen2-VL): number of sections, 0 when not M-RoPE */
    int64_t mrope_section[MS_ROPE_MAX_SECTIONS];  /* [n_mrope_sections] t/h/w sizes in rotary pairs */
} ms_rope_params;

/*
 * Read the RoPE parameters from either layout: "rope_parameters" {rope_theta, rope_type|type, ...}
 * when present, else top-level "rope_theta" and "rope_scaling" {rope_type|type, ...} (null or absent
 * scaling = default). A "type": "mrope" entry means default frequencies with mrope_section.
 * Errors: MS_ERR_UNSUPPORTED for an unknown rope_type (named), MS_ERR_NOT_FOUND for a field the
 * type requires (e.g. "rope_parameters.low_freq_factor" for llama3), MS_ERR_FORMAT for wrong types.
 */
ms_status ms_hf_config_get_rope(const ms_hf_config *cfg, ms_rope_params *out, ms_error *err);

/* ---- stop ids ---- */

/*
 * End-of-sequence ids: generation_config.json's eos_token_id when it has one, else config.json's
 * (text_config fallback applies); an int or a list of ints; null/absent = none (*n = 0). Duplicates
 * are dropped. More than `cap` ids: MS_ERR_LIMIT. Negative ids: MS_ERR_FORMAT.
 */
ms_status ms_hf_config_get_eos_ids(const ms_hf_config *cfg, int64_t *out, size_t cap, size_t *n,
                                   ms_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MS_HF_CONFIG_H */
