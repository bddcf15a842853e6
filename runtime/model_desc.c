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

/* ---- descriptor checks ---- */

static bool weight_layered_ok(const ms_md_weight *w) {
    for (int k = 0; k < MS_MD_MAX_NAMES && w->names[k] != NULL; k++)
        if ((strstr(w->names[k], "{i}") != NULL) != w->per_layer)
            return false;
    return true;
}

static ms_status check_step(const ms_model_desc *d, const ms_md_step *s, const char *which,
                            ms_error *err) {
    if (s == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "model %s: no %s step", d->name, which);
    if (s->span < 0 || s->span >= MS_MD_SPAN_COUNT || s->name == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "model %s: step %s: bad span or name", d->name,
                       which);
    if (s->label < 0 || s->label >= MS_MAX_LABELS || s->pos_advance < 0 || s->n_buckets < 0 ||
        s->n_buckets > MS_MD_MAX_BUCKETS)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "model %s: step %s: label, position advance or bucket count out of range",
                       d->name, s->name);
    for (int32_t b = 0; b < s->n_buckets; b++)
        if (s->buckets[b] < 1 || (b > 0 && s->buckets[b] <= s->buckets[b - 1]))
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "model %s: step %s: capture buckets must be positive and ascending",
                           d->name, s->name);
    return MS_OK;
}

ms_status ms_md_check_desc(const ms_model_desc *d, ms_error *err) {
    const char *name = d->name != NULL ? d->name : "?";
    if (d->name == NULL || d->config_load == NULL || d->facts == NULL || d->weights == NULL ||
        d->weight_shape == NULL || d->weight_tied == NULL || d->resources == NULL ||
        d->workspace_size == NULL || d->forward == NULL || d->config_size == 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "model %s: descriptor is missing a table or "
                       "function", name);
    if (d->n_weights < 1)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "model %s: no weights", name);
    for (int32_t i = 0; i < d->n_weights; i++) {
        const ms_md_weight *w = &d->weights[i];
        const char *key = w->key != NULL ? w->key : "?";
#define WFAIL(...) MS_FAIL(err, MS_ERR_INVALID_ARG, "model %s: weight '%s': %s", name, key, \
                           __VA_ARGS__)
        if (w->key == NULL || w->kind < 0 || w->kind >= MS_MD_WEIGHT_KIND_COUNT)
            return WFAIL("no key or a bad kind");
        if (w->rank < 1 || w->rank > 2)
            return WFAIL("rank must be 1 or 2");
        bool has_name = w->names[0] != NULL;
        if (w->kind == MS_MD_WEIGHT_FUSED ? has_name : !has_name)
            return WFAIL(w->kind == MS_MD_WEIGHT_FUSED ? "a fused entry names no tensor"
                                                       : "no checkpoint name");
        if (!weight_layered_ok(w))
            return WFAIL("per-layer names must contain {i}, global names must not");
        if (w->tie >= 0) {
            const ms_md_weight *t = w->tie < i ? &d->weights[w->tie] : NULL;
            if (t == NULL || t->kind == MS_MD_WEIGHT_PART || t->rank != w->rank ||
                t->per_layer != w->per_layer || w->kind != MS_MD_WEIGHT_TENSOR)
                return WFAIL("tie must name an earlier tensor of the same rank and layering");
        } else if (w->tie_if_missing) {
            return WFAIL("tie_if_missing without a tie");
        }
        if (w->kind == MS_MD_WEIGHT_PART) {
            const ms_md_weight *f = (w->fused >= 0 && w->fused < d->n_weights)
                                        ? &d->weights[w->fused] : NULL;
            bool listed = false;
            for (int32_t p = 0; f != NULL && p < f->n_parts && p < MS_MD_MAX_PARTS; p++)
                listed = listed || f->parts[p] == i;
            if (f == NULL || f->kind != MS_MD_WEIGHT_FUSED || !listed)
                return WFAIL("a part must name a fused entry that lists it");
        } else if (w->fused != -1) {
            return WFAIL("only a part names a fused entry");
        }
        if (w->kind == MS_MD_WEIGHT_FUSED) {
            if (w->n_parts < 2 || w->n_parts > MS_MD_MAX_PARTS)
                return WFAIL("a fused entry needs 2..4 parts");
            bool all_optional = true;
            for (int32_t p = 0; p < w->n_parts; p++) {
                int32_t q = w->parts[p];
                const ms_md_weight *pw = (q >= 0 && q < d->n_weights) ? &d->weights[q] : NULL;
                if (pw == NULL || pw->kind != MS_MD_WEIGHT_PART || pw->fused != i ||
                    pw->rank != w->rank || pw->per_layer != w->per_layer)
                    return WFAIL("every part must be a part entry of its rank and layering "
                                 "naming this entry");
                all_optional = all_optional && pw->optional;
            }
            if (w->optional != all_optional)
                return WFAIL("a fused entry is optional exactly when all its parts are");
        } else if (w->n_parts != 0) {
            return WFAIL("only a fused entry has parts");
        }
#undef WFAIL
    }
    if (d->n_resources < 1 || d->n_resources > MS_MAX_RESOURCES)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "model %s: %d resources (1..%d)", name,
                       (int)d->n_resources, MS_MAX_RESOURCES);
    for (int32_t i = 0; i < d->n_resources; i++) {
        const ms_md_resource *r = &d->resources[i];
        if (r->key == NULL || r->kind < 0 || r->kind >= MS_RESOURCE_KIND_COUNT || r->n_deps < 0 ||
            r->n_deps > MS_MD_MAX_DEPS)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "model %s: resource %d: bad key, kind or "
                           "dependency count", name, (int)i);
        for (int32_t j = 0; j < i; j++) {
            if (strcmp(d->resources[j].key, r->key) == 0)
                return MS_FAIL(err, MS_ERR_INVALID_ARG, "model %s: resource '%s' declared twice",
                               name, r->key);
            if (d->resources[j].kind == r->kind)
                return MS_FAIL(err, MS_ERR_INVALID_ARG,
                               "model %s: resources '%s' and '%s' are both of kind %s", name,
                               d->resources[j].key, r->key, ms_resource_kind_str(r->kind));
        }
        for (int32_t k = 0; k < r->n_deps; k++) {
            int32_t at = r->deps[k] != NULL ? ms_md_resource_index(d, r->deps[k]) : -1;
            if (at < 0 || at >= i)
                return MS_FAIL(err, MS_ERR_INVALID_ARG,
                               "model %s: resource '%s' depends on '%s', which is not an earlier "
                               "resource (the table must be in dependency order)",
                               name, r->key, r->deps[k] != NULL ? r->deps[k] : "?");
        }
    }
    MS_TRY(check_step(d, d->prefill, "prefill", err));
    MS_TRY(check_step(d, d->decode, "decode", err));
    if (d->n_kernels < 0 || (d->n_kernels > 0 && d->kernels == NULL))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "model %s: %d kernel instances without a list",
                       name, (int)d->n_kernels);
    for (int32_t i = 0; i < d->n_kernels; i++)
        if (d->kernels[i] == NULL || d->kernels[i][0] == '\0')
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "model %s: kernel instance %d has no stem",
                           name, (int)i);
    return MS_OK;
}

ms_status ms_md_check_facts(const ms_model_desc *d, const ms_md_facts *f, ms_error *err) {
    /* mstarc refuses these at check time or in the generated config_load; this keeps a descriptor
       from elsewhere from dividing by a zero page size (MS_CEIL_DIV in the KV sizing) */
    if (f->page_size < 1)
        return MS_FAIL(err, MS_ERR_FORMAT,
                       "model %s: KV page size %d under this config is not positive (the "
                       "kv_pool's page_size)", d->name, (int)f->page_size);
    if (f->window < 0)
        return MS_FAIL(err, MS_ERR_FORMAT,
                       "model %s: attention window %d under this config is negative (0 = none)",
                       d->name, (int)f->window);
    return MS_OK;
}

ms_status ms_md_check_shapes(const ms_model_desc *d, const void *config, ms_error *err) {
    ms_md_facts facts;
    MS_TRY(d->facts(config, &facts, err));
    MS_TRY(ms_md_check_facts(d, &facts, err));
    for (int32_t i = 0; i < d->n_weights; i++) {
        const ms_md_weight *w = &d->weights[i];
        int64_t shape[MS_TENSOR_MAX_DIMS] = {1, 1, 1, 1};
        d->weight_shape(config, i, shape);
        for (int32_t r = 0; r < w->rank; r++)
            if (shape[r] < 1)
                return MS_FAIL(err, MS_ERR_FORMAT,
                               "model %s: weight '%s' has dim %d = %lld under this config",
                               d->name, w->key, (int)r, (long long)shape[r]);
        if (w->kind != MS_MD_WEIGHT_FUSED)
            continue;
        int64_t rows = 0;
        for (int32_t p = 0; p < w->n_parts; p++) {
            int64_t ps[MS_TENSOR_MAX_DIMS] = {1, 1, 1, 1};
            d->weight_shape(config, w->parts[p], ps);
            if (w->rank == 2 && ps[1] != shape[1])
                return MS_FAIL(err, MS_ERR_FORMAT,
                               "model %s: fused weight '%s' has %lld columns, its part '%s' %lld",
                               d->name, w->key, (long long)shape[1],
                               d->weights[w->parts[p]].key, (long long)ps[1]);
            rows += ps[0];
        }
        if (rows != shape[0])
            return MS_FAIL(err, MS_ERR_FORMAT,
                           "model %s: fused weight '%s' has %lld rows, its parts sum to %lld",
                           d->name, w->key, (long long)shape[0], (long long)rows);
    }
    return MS_OK;
}
