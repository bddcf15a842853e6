/*
 * hf_config.c - config.json / generation_config.json: dotted-key typed lookup, both RoPE layouts,
 * eos ids.
 *
 * Constraints: the JSON trees stay owned by jansson for the config's lifetime (accessors return
 * borrowed strings into them); absent and null are the same thing (transformers writes null for
 * "not set"); every type mismatch is an error naming the file and the dotted key.
 */
#include "hf_config.h"

#include "gguf_model.h"
#include "llama2c.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct ms_hf_config {
    char *path;       /* config.json as read */
    char *gen_path;   /* generation_config.json, NULL when there is none */
    json_t *root;     /* config.json object */
    json_t *gen;      /* generation_config.json object or NULL */
};

/* ---- loading ---- */

/* Load a JSON object from `path`; `optional` turns a missing file into *out = NULL, MS_OK. */
static ms_status cfg_load_object(const char *path, bool optional, json_t **out, ms_error *err) {
    *out = NULL;
    if (optional && access(path, F_OK) != 0)
        return MS_OK;
    struct stat sb;
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode)) /* jansson reads a folder as an empty file */
        return MS_FAIL(err, MS_ERR_IO, "%s: cannot read: not a regular file", path);
    json_error_t jerr;
    json_t *v = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (v == NULL) {
        if (access(path, R_OK) != 0)
            return MS_FAIL(err, errno == ENOENT ? MS_ERR_NOT_FOUND : MS_ERR_IO, "%s: cannot read: %s", path,
                           strerror(errno));
        return MS_FAIL(err, MS_ERR_PARSE, "%s:%d:%d: malformed JSON: %s", path, jerr.line, jerr.column,
                       jerr.text);
    }
    if (!json_is_object(v)) {
        json_decref(v);
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: top level is not a JSON object", path);
    }
    *out = v;
    return MS_OK;
}

/* A llama2.c .bin: the config is derived from its header. */
static ms_status cfg_init_llama2c(ms_hf_config **out, const char *path, ms_error *err) {
    ms_llama2c_config lc;
    MS_TRY(ms_llama2c_read_config(path, &lc, err));
    char *text = NULL;
    MS_TRY(ms_llama2c_config_json(&lc, path, &text, err));
    ms_status st = ms_hf_config_init_from_string(out, path, text, err);
    ms_free(text);
    return st;
}

/* A .gguf: the config is derived from its metadata (gguf_model.h). */
static ms_status cfg_init_gguf(ms_hf_config **out, const char *path, ms_error *err) {
    ms_gguf *g = NULL;
    MS_TRY(ms_gguf_init(&g, path, err));
    char *text = NULL;
    ms_status st = ms_gguf_model_config_json(g, &text, err);
    ms_gguf_free(g);
    if (st == MS_OK)
        st = ms_hf_config_init_from_string(out, path, text, err);
    ms_free(text);
    return st;
}

/* Whether path[0 .. len) ends with `suffix`. */
static bool cfg_ends_with(const char *path, size_t len, const char *suffix) {
    size_t n = strlen(suffix);
    return len >= n && strncmp(path + len - n, suffix, n) == 0;
}

ms_status ms_hf_config_init(ms_hf_config **out, const char *path, ms_error *err) {
    *out = NULL;
    size_t plen = strlen(path);
    struct stat pst;
    if (plen > 4 && strcmp(path + plen - 4, ".bin") == 0 && stat(path, &pst) == 0 && S_ISREG(pst.st_mode))
        return cfg_init_llama2c(out, path, err);
    if (plen > 5 && strcmp(path + plen - 5, ".gguf") == 0 && stat(path, &pst) == 0 && S_ISREG(pst.st_mode))
        return cfg_init_gguf(out, path, err);
    ms_hf_config *cfg = ms_calloc(1, sizeof *cfg);
    if (cfg == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", path);
    ms_status st = MS_OK;
    struct stat sb;
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/')
        len--;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        cfg->path = ms_asprintf("%.*s/config.json", (int)len, path);
        cfg->gen_path = ms_asprintf("%.*s/generation_config.json", (int)len, path);
    } else {
        /* a weights file (model.safetensors or a shard index) stands for its folder */
        bool weights = cfg_ends_with(path, len, ".safetensors") ||
                       cfg_ends_with(path, len, "model.safetensors.index.json");
        const char *slash = strrchr(path, '/');
        int dir_len = slash ? (int)(slash - path) : 1;
        const char *dir = slash ? path : ".";
        cfg->path = weights ? ms_asprintf("%.*s/config.json", dir_len, dir) : ms_strdup(path);
        cfg->gen_path = ms_asprintf("%.*s/generation_config.json", dir_len, dir);
    }
    if (cfg->path == NULL || cfg->gen_path == NULL) {
        st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", path);
        goto fail;
    }
    st = cfg_load_object(cfg->path, false, &cfg->root, err);
    if (st != MS_OK)
        goto fail;
    st = cfg_load_object(cfg->gen_path, true, &cfg->gen, err);
    if (st != MS_OK)
        goto fail;
    if (cfg->gen == NULL) {
        ms_free(cfg->gen_path);
        cfg->gen_path = NULL;
    }
    *out = cfg;
    return MS_OK;
fail:
    ms_hf_config_free(cfg);
    return st;
}

ms_status ms_hf_config_init_from_string(ms_hf_config **out, const char *name, const char *json_text,
                                        ms_error *err) {
    *out = NULL;
    ms_hf_config *cfg = ms_calloc(1, sizeof *cfg);
    if (cfg == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", name);
    ms_status st = MS_OK;
    cfg->path = ms_strdup(name);
    if (cfg->path == NULL) {
        st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", name);
        goto fail;
    }
    json_error_t jerr;
    cfg->root = json_loads(json_text, JSON_REJECT_DUPLICATES, &jerr);
    if (cfg->root == NULL) {
        st = MS_FAIL(err, MS_ERR_PARSE, "%s:%d:%d: malformed JSON: %s", name, jerr.line, jerr.column, jerr.text);
        goto fail;
    }
    if (!json_is_object(cfg->root)) {
        st = MS_FAIL(err, MS_ERR_FORMAT, "%s: top level is not a JSON object", name);
        goto fail;
    }
    *out = cfg;
    return MS_OK;
fail:
    ms_hf_config_free(cfg);
    return st;
}

void ms_hf_config_free(ms_hf_config *cfg) {
    if (cfg == NULL)
        return;
    json_decref(cfg->root);
    json_decref(cfg->gen);
    ms_free(cfg->path);
    ms_free(cfg->gen_path);
    ms_free(cfg);
}

const char *ms_hf_config_path(const ms_hf_config *cfg) {
    return cfg->path;
}

/* ---- lookup ---- */

/* Follow a dotted key from `obj`; a decimal component indexes an array ("architectures.0");
 * NULL when any component is missing or neither an object nor an array. */
static json_t *cfg_walk(json_t *obj, const char *key) {
    const char *p = key;
    for (;;) {
        const char *dot = strchr(p, '.');
        size_t len = dot ? (size_t)(dot - p) : strlen(p);
        if (json_is_array(obj)) {
            size_t idx = 0, k = 0;
            for (; k < len && k < 9 && p[k] >= '0' && p[k] <= '9'; k++)
                idx = idx * 10 + (size_t)(p[k] - '0');
            if (len == 0 || k != len)
                return NULL;
            obj = json_array_get(obj, idx);
            if (obj == NULL || dot == NULL)
                return obj;
            p = dot + 1;
            continue;
        }
        if (!json_is_object(obj))
            return NULL;
        obj = json_object_getn(obj, p, len);
        if (obj == NULL || dot == NULL)
            return obj;
        p = dot + 1;
    }
}

/* RoPE keys that transformers 5 moved from the top level into "rope_parameters". */
static bool cfg_is_moved_rope_key(const char *key) {
    return strcmp(key, "rope_theta") == 0 || strcmp(key, "partial_rotary_factor") == 0;
}

/*
 * `key` in one config object, with the RoPE layouts made interchangeable: a missing "rope_theta" /
 * "partial_rotary_factor" is read from "rope_parameters"; a missing "rope_parameters.X" from the
 * older top-level rope_theta / partial_rotary_factor or "rope_scaling.X" (rope_type falls back to
 * the older "type"); a missing "rope_scaling.X" from "rope_parameters.X". Null counts as absent.
 */
static json_t *cfg_lookup_in(json_t *obj, const char *key) {
    json_t *v = cfg_walk(obj, key);
    if (v != NULL && !json_is_null(v))
        return v;
    json_t *params = json_object_get(obj, "rope_parameters");
    json_t *scaling = json_object_get(obj, "rope_scaling");
    const char *dot = strchr(key, '.');
    v = NULL;
    if (dot == NULL) {
        if (cfg_is_moved_rope_key(key) && json_is_object(params))
            v = json_object_get(params, key);
    } else if (strncmp(key, "rope_parameters.", 16) == 0 && !json_is_object(params)) {
        const char *sub = dot + 1;
        if (cfg_is_moved_rope_key(sub))
            v = json_object_get(obj, sub);
        else if (json_is_object(scaling)) {
            v = json_object_get(scaling, sub);
            if ((v == NULL || json_is_null(v)) && strcmp(sub, "rope_type") == 0)
                v = json_object_get(scaling, "type");
        }
    } else if (strncmp(key, "rope_scaling.", 13) == 0 && !json_is_object(scaling) && json_is_object(params)) {
        v = json_object_get(params, dot + 1);
    }
    return json_is_null(v) ? NULL : v;
}

/* Resolve `key` in config.json (cfg_lookup_in), then in "text_config" when the key's first
 * component is absent at the top level. NULL when absent or null. */
static json_t *cfg_lookup(const ms_hf_config *cfg, const char *key) {
    json_t *v = cfg_lookup_in(cfg->root, key);
    if (v != NULL)
        return v;
    const char *dot = strchr(key, '.');
    size_t len = dot ? (size_t)(dot - key) : strlen(key);
    json_t *text = json_object_get(cfg->root, "text_config");
    if (json_object_getn(cfg->root, key, len) == NULL && json_is_object(text))
        return cfg_lookup_in(text, key);
    return NULL;
}

static const char *cfg_json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "a list";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "a JSON value";
}

const char *ms_cfg_type_name(ms_cfg_type t) {
    /* ORDER MS_CFG_TYPE */
    static const char *const names[MS_CFG_TYPE_COUNT] = {
        "an integer", "a number", "a boolean", "a string", "a list of integers", "a list of numbers",
    };
    if ((unsigned)t >= MS_CFG_TYPE_COUNT)
        return "?";
    return names[t];
}

/* Whether the double d converts to int64_t without undefined behaviour: [-2^63, 2^63) (NaN not). */
static bool cfg_in_int64(double d) {
    return d >= -0x1p63 && d < 0x1p63;
}

/* Integer value of v (integer, or real with an integral value in int64 range). */
static bool cfg_as_int(const json_t *v, int64_t *out) {
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return true;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d == floor(d) && cfg_in_int64(d)) {
            *out = (int64_t)d;
            return true;
        }
    }
    return false;
}

/* Whether v is a real with an integral value outside int64 (1e300): not "a real number", which
 * would misdescribe it. */
static bool cfg_is_huge_integral(const json_t *v) {
    double d = json_is_real(v) ? json_real_value(v) : 0.0;
    return d == floor(d) && !cfg_in_int64(d);
}

/* Convert a present, non-null value `v` of field `where.key` (display name) to `type`. */
static ms_status cfg_convert(const char *path, const char *key, const json_t *v, ms_cfg_type type,
                             ms_cfg_value *out, ms_error *err) {
    out->present = true;
    switch (type) {
    case MS_CFG_INT:
        if (cfg_as_int(v, &out->i))
            return MS_OK;
        break;
    case MS_CFG_FLOAT:
        if (json_is_number(v)) {
            out->f = json_number_value(v);
            return MS_OK;
        }
        break;
    case MS_CFG_BOOL:
        if (json_is_boolean(v)) {
            out->b = json_is_true(v);
            return MS_OK;
        }
        break;
    case MS_CFG_STRING:
        if (json_is_string(v)) {
            out->s = json_string_value(v);
            return MS_OK;
        }
        break;
    case MS_CFG_INT_LIST:
    case MS_CFG_FLOAT_LIST: {
        if (json_is_number(v)) {
            int64_t dummy;
            if (type == MS_CFG_FLOAT_LIST || cfg_as_int(v, &dummy)) {
                out->n = 1;
                return MS_OK;
            }
            break;
        }
        if (!json_is_array(v))
            break;
        for (size_t i = 0; i < json_array_size(v); i++) {
            const json_t *e = json_array_get(v, i);
            int64_t dummy;
            bool ok = type == MS_CFG_INT_LIST ? cfg_as_int(e, &dummy) : json_is_number(e);
            if (!ok && type == MS_CFG_INT_LIST && cfg_is_huge_integral(e))
                return MS_FAIL(err, MS_ERR_FORMAT, "%s: field '%s'[%zu] is %g, outside the 64-bit integer range",
                               path, key, i, json_real_value(e));
            if (!ok)
                return MS_FAIL(err, MS_ERR_FORMAT, "%s: field '%s'[%zu] is %s, expected %s", path, key, i,
                               cfg_json_kind(e), type == MS_CFG_INT_LIST ? "an integer" : "a number");
        }
        out->n = json_array_size(v);
        return MS_OK;
    }
    default:
        MS_ABORT("invalid config type %d", (int)type);
    }
    out->present = false;
    if ((type == MS_CFG_INT || type == MS_CFG_INT_LIST) && cfg_is_huge_integral(v))
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: field '%s' is %g, outside the 64-bit integer range", path, key,
                       json_real_value(v));
    return MS_FAIL(err, MS_ERR_FORMAT, "%s: field '%s' is %s, expected %s", path, key, cfg_json_kind(v),
                   ms_cfg_type_name(type));
}

ms_status ms_hf_config_get(const ms_hf_config *cfg, const char *key, ms_cfg_type type, ms_cfg_value *out,
                           ms_error *err) {
    memset(out, 0, sizeof *out);
    out->type = type;
    json_t *v = cfg_lookup(cfg, key);
    if (v == NULL)
        return MS_OK;
    return cfg_convert(cfg->path, key, v, type, out, err);
}

ms_status ms_hf_config_require(const ms_hf_config *cfg, const char *key, ms_cfg_type type, ms_cfg_value *out,
                               ms_error *err) {
    MS_TRY(ms_hf_config_get(cfg, key, type, out, err));
    if (!out->present)
        return MS_FAIL(err, MS_ERR_NOT_FOUND, "%s: required field '%s' is missing", cfg->path, key);
    return MS_OK;
}

ms_status ms_hf_config_fill(const ms_hf_config *cfg, const ms_cfg_param *params, size_t n, ms_cfg_value *values,
                            ms_error *err) {
    for (size_t i = 0; i < n; i++) {
        if (params[i].required)
            MS_TRY(ms_hf_config_require(cfg, params[i].key, params[i].type, &values[i], err));
        else
            MS_TRY(ms_hf_config_get(cfg, params[i].key, params[i].type, &values[i], err));
    }
    return MS_OK;
}

bool ms_hf_config_has(const ms_hf_config *cfg, const char *key) {
    return cfg_lookup(cfg, key) != NULL;
}

ms_status ms_hf_config_set_int(ms_hf_config *cfg, const char *key, int64_t value, ms_error *err) {
    if (strchr(key, '.') != NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: cannot set nested key '%s'", cfg->path, key);
    json_t *v = json_integer((json_int_t)value);
    if (v == NULL || json_object_set_new(cfg->root, key, v) != 0)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory setting '%s'", cfg->path, key);
    return MS_OK;
}

ms_status ms_hf_config_get_int(const ms_hf_config *cfg, const char *key, int64_t *out, ms_error *err) {
    ms_cfg_value v;
    MS_TRY(ms_hf_config_require(cfg, key, MS_CFG_INT, &v, err));
    *out = v.i;
    return MS_OK;
}

ms_status ms_hf_config_get_float(const ms_hf_config *cfg, const char *key, double *out, ms_error *err) {
    ms_cfg_value v;
    MS_TRY(ms_hf_config_require(cfg, key, MS_CFG_FLOAT, &v, err));
    *out = v.f;
    return MS_OK;
}

ms_status ms_hf_config_get_bool(const ms_hf_config *cfg, const char *key, bool *out, ms_error *err) {
    ms_cfg_value v;
    MS_TRY(ms_hf_config_require(cfg, key, MS_CFG_BOOL, &v, err));
    *out = v.b;
    return MS_OK;
}

ms_status ms_hf_config_get_string(const ms_hf_config *cfg, const char *key, const char **out, ms_error *err) {
    ms_cfg_value v;
    MS_TRY(ms_hf_config_require(cfg, key, MS_CFG_STRING, &v, err));
    *out = v.s;
    return MS_OK;
}

ms_status ms_hf_config_get_int_or(const ms_hf_config *cfg, const char *key, int64_t def, int64_t *out,
                                  ms_error *err) {
    ms_cfg_value v;
    MS_TRY(ms_hf_config_get(cfg, key, MS_CFG_INT, &v, err));
    *out = v.present ? v.i : def;
    return MS_OK;
}

ms_status ms_hf_config_get_float_or(const ms_hf_config *cfg, const char *key, double def, double *out,
                                    ms_error *err) {
    ms_cfg_value v;
    MS_TRY(ms_hf_config_get(cfg, key, MS_CFG_FLOAT, &v, err));
    *out = v.present ? v.f : def;
    return MS_OK;
}

ms_status ms_hf_config_get_bool_or(const ms_hf_config *cfg, const char *key, bool def, bool *out,
                                   ms_error *err) {
    ms_cfg_value v;
    MS_TRY(ms_hf_config_get(cfg, key, MS_CFG_BOOL, &v, err));
    *out = v.present ? v.b : def;
    return MS_OK;
}

ms_status ms_hf_config_get_string_or(const ms_hf_config *cfg, const char *key, const char *def,
                                     const char **out, ms_error *err) {
    ms_cfg_value v;
    MS_TRY(ms_hf_config_get(cfg, key, MS_CFG_STRING, &v, err));
    *out = v.present ? v.s : def;
    return MS_OK;
}

/* Copy a validated list value (or bare number) into ints / doubles. */
static void cfg_copy_list(const json_t *v, int64_t *ints, double *reals) {
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (ints != NULL)
            cfg_as_int(e, &ints[i]);
        else
            reals[i] = json_number_value(e);
    }
}

static ms_status cfg_get_list(const ms_hf_config *cfg, const json_t *v, const char *path, const char *key,
                              ms_cfg_type type, bool required, int64_t *ints, double *reals, size_t cap,
                              size_t *n, ms_error *err) {
    *n = 0;
    if (v == NULL) {
        if (required)
            return MS_FAIL(err, MS_ERR_NOT_FOUND, "%s: required field '%s' is missing", path, key);
        return MS_OK;
    }
    (void)cfg;
    ms_cfg_value val = {.type = type};
    MS_TRY(cfg_convert(path, key, v, type, &val, err));
    if (val.n > cap)
        return MS_FAIL(err, MS_ERR_LIMIT, "%s: field '%s' has %zu entries, at most %zu supported", path, key,
                       val.n, cap);
    cfg_copy_list(v, ints, reals);
    *n = val.n;
    return MS_OK;
}

ms_status ms_hf_config_get_int_list(const ms_hf_config *cfg, const char *key, bool required, int64_t *out,
                                    size_t cap, size_t *n, ms_error *err) {
    return cfg_get_list(cfg, cfg_lookup(cfg, key), cfg->path, key, MS_CFG_INT_LIST, required, out, NULL, cap,
                        n, err);
}

ms_status ms_hf_config_get_float_list(const ms_hf_config *cfg, const char *key, bool required, double *out,
                                      size_t cap, size_t *n, ms_error *err) {
    return cfg_get_list(cfg, cfg_lookup(cfg, key), cfg->path, key, MS_CFG_FLOAT_LIST, required, NULL, out,
                        cap, n, err);
}

/* ---- RoPE ---- */

/* ORDER MS_ROPE_TYPE */
static const char *const rope_type_names[MS_ROPE_TYPE_COUNT] = {"default", "linear", "llama3", "dynamic",
                                                                "yarn"};

const char *ms_rope_type_name(ms_rope_type t) {
    if ((unsigned)t >= MS_ROPE_TYPE_COUNT)
        return "?";
    return rope_type_names[t];
}

/* Field `field` of the scaling object `obj` (display prefix `prefix`), as a number. */
static ms_status rope_num(const ms_hf_config *cfg, json_t *obj, const char *prefix, const char *field,
                          bool required, double def, double *out, ms_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", prefix, field);
    json_t *v = json_object_get(obj, field);
    if (v == NULL || json_is_null(v)) {
        if (required)
            return MS_FAIL(err, MS_ERR_NOT_FOUND, "%s: required field '%s' is missing", cfg->path, key);
        *out = def;
        return MS_OK;
    }
    ms_cfg_value val;
    MS_TRY(cfg_convert(cfg->path, key, v, MS_CFG_FLOAT, &val, err));
    *out = val.f;
    return MS_OK;
}

ms_status ms_hf_config_get_rope(const ms_hf_config *cfg, ms_rope_params *out, ms_error *err) {
    memset(out, 0, sizeof *out);
    out->type = MS_ROPE_TYPE_DEFAULT;
    out->factor = 1.0;
    out->partial_rotary_factor = 1.0;

    /* Which object holds the scaling fields, and what it is called in messages. */
    json_t *params = cfg_lookup(cfg, "rope_parameters");
    const char *prefix = "rope_parameters";
    json_t *obj = params;
    if (params == NULL) {
        obj = cfg_lookup(cfg, "rope_scaling");
        prefix = "rope_scaling";
    }
    if (obj != NULL && !json_is_object(obj))
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: field '%s' is %s, expected an object", cfg->path, prefix,
                       cfg_json_kind(obj));

    /* theta: rope_parameters.rope_theta, else top-level rope_theta, else the Llama default. */
    MS_TRY(ms_hf_config_get_float_or(cfg, "rope_theta", 10000.0, &out->theta, err));
    if (params != NULL)
        MS_TRY(rope_num(cfg, params, prefix, "rope_theta", false, out->theta, &out->theta, err));
    if (!(out->theta > 0.0))
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: rope_theta %g is not positive", cfg->path, out->theta);
    MS_TRY(ms_hf_config_get_float_or(cfg, "partial_rotary_factor", 1.0, &out->partial_rotary_factor, err));
    if (obj == NULL)
        return MS_OK;
    MS_TRY(rope_num(cfg, obj, prefix, "partial_rotary_factor", false, out->partial_rotary_factor,
                    &out->partial_rotary_factor, err));

    /* rope_type (transformers >= 4.45) wins over the older "type"; "mrope" is default frequencies
     * plus sections. */
    const char *tname = NULL;
    json_t *jt = json_object_get(obj, "rope_type");
    if (jt == NULL || json_is_null(jt))
        jt = json_object_get(obj, "type");
    if (jt != NULL && !json_is_null(jt)) {
        if (!json_is_string(jt))
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: field '%s.rope_type' is %s, expected a string", cfg->path,
                           prefix, cfg_json_kind(jt));
        tname = json_string_value(jt);
    }
    if (tname == NULL || strcmp(tname, "mrope") == 0) {
        out->type = MS_ROPE_TYPE_DEFAULT;
    } else {
        int found = -1;
        for (int t = 0; t < MS_ROPE_TYPE_COUNT; t++) {
            if (strcmp(tname, rope_type_names[t]) == 0)
                found = t;
        }
        if (found < 0)
            return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                           "%s: %s.rope_type '%s' is not supported (default, linear, llama3, dynamic, yarn are)",
                           cfg->path, prefix, tname);
        out->type = (ms_rope_type)found;
    }

    json_t *sections = json_object_get(obj, "mrope_section");
    if (sections != NULL && !json_is_null(sections)) {
        char key[64];
        snprintf(key, sizeof key, "%s.mrope_section", prefix);
        size_t n;
        MS_TRY(cfg_get_list(cfg, sections, cfg->path, key, MS_CFG_INT_LIST, true, out->mrope_section, NULL,
                            MS_ROPE_MAX_SECTIONS, &n, err));
        out->n_mrope_sections = (int)n;
    }

    double orig = 0.0;
    switch (out->type) {
    case MS_ROPE_TYPE_DEFAULT:
        break;
    case MS_ROPE_TYPE_LINEAR:
        MS_TRY(rope_num(cfg, obj, prefix, "factor", true, 1.0, &out->factor, err));
        break;
    case MS_ROPE_TYPE_LLAMA3:
        MS_TRY(rope_num(cfg, obj, prefix, "factor", true, 1.0, &out->factor, err));
        MS_TRY(rope_num(cfg, obj, prefix, "low_freq_factor", true, 0.0, &out->low_freq_factor, err));
        MS_TRY(rope_num(cfg, obj, prefix, "high_freq_factor", true, 0.0, &out->high_freq_factor, err));
        MS_TRY(rope_num(cfg, obj, prefix, "original_max_position_embeddings", true, 0.0, &orig, err));
        if (!(out->high_freq_factor > out->low_freq_factor) || !(orig > 0.0))
            return MS_FAIL(err, MS_ERR_FORMAT,
                           "%s: %s: llama3 needs high_freq_factor > low_freq_factor and "
                           "original_max_position_embeddings > 0 (got %g, %g, %g)",
                           cfg->path, prefix, out->high_freq_factor, out->low_freq_factor, orig);
        break;
    case MS_ROPE_TYPE_DYNAMIC:
        MS_TRY(rope_num(cfg, obj, prefix, "factor", true, 1.0, &out->factor, err));
        MS_TRY(rope_num(cfg, obj, prefix, "original_max_position_embeddings", false, 0.0, &orig, err));
        break;
    case MS_ROPE_TYPE_YARN:
        MS_TRY(rope_num(cfg, obj, prefix, "factor", true, 1.0, &out->factor, err));
        MS_TRY(rope_num(cfg, obj, prefix, "original_max_position_embeddings", false, 0.0, &orig, err));
        MS_TRY(rope_num(cfg, obj, prefix, "beta_fast", false, 32.0, &out->beta_fast, err));
        MS_TRY(rope_num(cfg, obj, prefix, "beta_slow", false, 1.0, &out->beta_slow, err));
        MS_TRY(rope_num(cfg, obj, prefix, "attention_factor", false, 0.0, &out->attention_factor, err));
        break;
    default:
        MS_ABORT("rope type %d", (int)out->type);
    }
    /* Read as a number (8192.0 is common); a count in int64 before the conversion. */
    if (orig != floor(orig) || orig < 0.0 || !cfg_in_int64(orig))
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: field '%s.original_max_position_embeddings' is %g, not a count in "
                       "0 .. 2^63-1", cfg->path, prefix, orig);
    out->original_max_position_embeddings = (int64_t)orig;
    if (out->type != MS_ROPE_TYPE_DEFAULT && !(out->factor > 0.0))
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: %s.factor %g is not positive", cfg->path, prefix, out->factor);
    return MS_OK;
}

/* ---- eos ids ---- */

ms_status ms_hf_config_get_eos_ids(const ms_hf_config *cfg, int64_t *out, size_t cap, size_t *n, ms_error *err) {
    *n = 0;
    const char *path = cfg->path;
    json_t *v = NULL;
    if (cfg->gen != NULL) {
        v = json_object_get(cfg->gen, "eos_token_id");
        if (json_is_null(v))
            v = NULL;
        path = cfg->gen_path;
    }
    if (v == NULL) {
        v = cfg_lookup(cfg, "eos_token_id");
        path = cfg->path;
    }
    if (v == NULL)
        return MS_OK;
    int64_t ids[256];
    size_t m;
    MS_TRY(cfg_get_list(cfg, v, path, "eos_token_id", MS_CFG_INT_LIST, true, ids, NULL, MS_ARRAY_LEN(ids), &m,
                        err));
    for (size_t i = 0; i < m; i++) {
        if (ids[i] < 0)
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: eos_token_id %lld is negative", path, (long long)ids[i]);
        bool dup = false;
        for (size_t j = 0; j < *n && !dup; j++)
            dup = out[j] == ids[i];
        if (dup)
            continue;
        if (*n >= cap)
            return MS_FAIL(err, MS_ERR_LIMIT, "%s: more than %zu eos ids", path, cap);
        out[(*n)++] = ids[i];
    }
    return MS_OK;
}
