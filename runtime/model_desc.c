/*
 * model_desc.c - helpers that code generated against model_desc.h calls: typed config parameters
 * with sources, defaults and optional values; name template expansion.
 *
 * Constraints: every failure is one line naming config.json and the field.
 */
#include "model_desc.h"

#include <stdio.h>
#include <string.h>

/* ---- config parameters ---- */

/* Find the first present source; *which = index or -1. */
static ms_status cfg_find(const ms_hf_config *hf, const char *const *sources, int n_sources,
                          ms_cfg_type type, ms_cfg_value *v, ms_error *err) {
    MS_ASSERT(n_sources >= 1);
    for (int i = 0; i < n_sources; i++) {
        MS_TRY(ms_hf_config_get(hf, sources[i], type, v, err));
        if (v->present)
            return MS_OK;
    }
    v->present = false;
    return MS_OK;
}

/* The outcome when no source is present and there is no default. */
static ms_status cfg_absent(const ms_hf_config *hf, const char *const *sources, bool *present,
                            ms_error *err) {
    if (present != NULL) {
        *present = false;
        return MS_OK;
    }
    return MS_FAIL(err, MS_ERR_NOT_FOUND, "%s: required field '%s' is missing",
                   ms_hf_config_path(hf), sources[0]);
}

ms_status ms_md_cfg_int(const ms_hf_config *hf, const char *const *sources, int n_sources,
                        const int64_t *dflt, int64_t *out, bool *present, ms_error *err) {
    ms_cfg_value v;
    MS_TRY(cfg_find(hf, sources, n_sources, MS_CFG_INT, &v, err));
    if (!v.present && dflt == NULL)
        return cfg_absent(hf, sources, present, err);
    *out = v.present ? v.i : *dflt;
    if (present != NULL)
        *present = true;
    return MS_OK;
}

ms_status ms_md_cfg_float(const ms_hf_config *hf, const char *const *sources, int n_sources,
                          const double *dflt, double *out, bool *present, ms_error *err) {
    ms_cfg_value v;
    MS_TRY(cfg_find(hf, sources, n_sources, MS_CFG_FLOAT, &v, err));
    if (!v.present && dflt == NULL)
        return cfg_absent(hf, sources, present, err);
    *out = v.present ? v.f : *dflt;
    if (present != NULL)
        *present = true;
    return MS_OK;
}

ms_status ms_md_cfg_bool(const ms_hf_config *hf, const char *const *sources, int n_sources,
                         const bool *dflt, bool *out, bool *present, ms_error *err) {
    ms_cfg_value v;
    MS_TRY(cfg_find(hf, sources, n_sources, MS_CFG_BOOL, &v, err));
    if (!v.present && dflt == NULL)
        return cfg_absent(hf, sources, present, err);
    *out = v.present ? v.b : *dflt;
    if (present != NULL)
        *present = true;
    return MS_OK;
}

ms_status ms_md_cfg_string(const ms_hf_config *hf, const char *const *sources, int n_sources,
                           const char *dflt, const char **out, bool *present, ms_error *err) {
    ms_cfg_value v;
    MS_TRY(cfg_find(hf, sources, n_sources, MS_CFG_STRING, &v, err));
    if (!v.present && dflt == NULL)
        return cfg_absent(hf, sources, present, err);
    *out = v.present ? v.s : dflt;
    if (present != NULL)
        *present = true;
    return MS_OK;
}

ms_status ms_md_cfg_check(const ms_hf_config *hf, bool cond, ms_error *err, const char *fmt, ...) {
    if (cond)
        return MS_OK;
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return MS_FAIL(err, MS_ERR_FORMAT, "%s: %s", ms_hf_config_path(hf), what);
}

/* ---- names and tables ---- */

ms_status ms_md_expand_name(const char *tmpl, int32_t layer, char *buf, size_t cap,
                            ms_error *err) {
    size_t n = 0;
    for (const char *p = tmpl; *p != '\0';) {
        char num[16];
        const char *piece = p;
        size_t len = 1;
        if (strncmp(p, "{i}", 3) == 0) {
            snprintf(num, sizeof num, "%d", (int)layer);
            piece = num;
            len = strlen(num);
            p += 3;
        } else {
            p++;
        }
        if (n + len + 1 > cap)
            return MS_FAIL(err, MS_ERR_LIMIT, "weight name template '%s' is too long", tmpl);
        memcpy(buf + n, piece, len);
        n += len;
    }
    buf[n] = '\0';
    return MS_OK;
}

int32_t ms_md_resource_index(const ms_model_desc *d, const char *key) {
    for (int32_t i = 0; i < d->n_resources; i++)
        if (strcmp(d->resources[i].key, key) == 0)
            return i;
    return -1;
}
