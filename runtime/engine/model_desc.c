/*
 * model_desc.c - helpers that code generated against model_desc.h calls: typed config parameters
 * with sources, defaults and optional values (int lists included); name template expansion;
 * the descriptor's ignore patterns (checkpoint tensors present but unused).
 *
 * Constraints: every failure is one line naming config.json and the field.
 */
#include "model_desc.h"
#include "scratch.h"

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

ms_status ms_md_cfg_int_list(const ms_hf_config *hf, const char *const *sources, int n_sources,
                             const ms_md_int_list *dflt, ms_md_int_list *out, bool *present,
                             ms_error *err) {
    MS_ASSERT(n_sources >= 1);
    for (int i = 0; i < n_sources; i++) {
        ms_cfg_value v;
        MS_TRY(ms_hf_config_get(hf, sources[i], MS_CFG_INT_LIST, &v, err));
        if (!v.present)
            continue;
        int64_t vals[MS_MD_MAX_LIST];
        size_t n = 0;
        MS_TRY(ms_hf_config_get_int_list(hf, sources[i], true, vals, MS_MD_MAX_LIST, &n, err));
        for (size_t k = 0; k < n; k++)
            if (vals[k] < -2147483647 || vals[k] > 2147483647)
                return MS_FAIL(err, MS_ERR_FORMAT, "%s: field '%s'[%zu] (%lld) is out of range (at "
                               "most 2147483647 in magnitude)", ms_hf_config_path(hf), sources[i],
                               k, (long long)vals[k]);
        memset(out, 0, sizeof *out);
        out->n = (int32_t)n;
        memcpy(out->v, vals, n * sizeof vals[0]);
        if (present != NULL)
            *present = true;
        return MS_OK;
    }
    if (dflt == NULL)
        return cfg_absent(hf, sources, present, err);
    MS_ASSERT(dflt->n >= 0 && dflt->n <= MS_MD_MAX_LIST);
    *out = *dflt;
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

ms_status ms_md_cfg_check_sections(const ms_hf_config *hf, const char *what, ms_md_int_list sec,
                                   int64_t rotary_dim, ms_error *err) {
    if (sec.n == 0)
        return MS_OK;
    char text[160];
    size_t at = 0;
    int64_t sum = 0;
    bool negative = false;
    for (int32_t k = 0; k < sec.n && k < MS_MD_MAX_LIST; k++) {
        int w = snprintf(text + at, sizeof text - at, "%s%lld", k ? ", " : "[", (long long)sec.v[k]);
        at = w > 0 && (size_t)w < sizeof text - at ? at + (size_t)w : at;
        sum += sec.v[k];
        negative = negative || sec.v[k] < 0;
    }
    snprintf(text + at, sizeof text - at, "]");
    if (sec.n > MS_ROPE_MAX_SECTIONS || negative)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: %s %s: M-RoPE takes 1 to %d non-negative sections",
                       ms_hf_config_path(hf), what, text, MS_ROPE_MAX_SECTIONS);
    if (sum * 2 != rotary_dim)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: %s %s covers %lld rotary pairs, rotary_dim %lld "
                       "has %lld", ms_hf_config_path(hf), what, text, (long long)sum,
                       (long long)rotary_dim, (long long)(rotary_dim / 2));
    return MS_OK;
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

bool ms_md_tensor_ignored(const ms_model_desc *d, const char *name) {
    for (int32_t i = 0; i < d->n_ignored; i++)
        if (d->ignored[i] != NULL && ms_glob_match(d->ignored[i], name))
            return true;
    return false;
}

int32_t ms_md_resource_index(const ms_md_node *n, const char *key) {
    for (int32_t i = 0; i < n->n_resources; i++)
        if (strcmp(n->resources[i].key, key) == 0)
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

static ms_status check_step(const ms_model_desc *d, const ms_md_node *n, const ms_md_step *s,
                            ms_error *err) {
    if (s->name == NULL || s->run == NULL || s->n_segments < 1 || s->n_segments > MS_MAX_LABELS)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "model %s: node %s: step %s: no name or runner, or segments out of range",
                       d->name, n->name, s->name != NULL ? s->name : "?");
    for (int32_t i = 0; i < s->n_segments; i++)
        if (s->labels[i] < 0 || s->labels[i] >= n->n_labels)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "model %s: node %s: step %s: label %d out of range", d->name, n->name,
                           s->name, (int)s->labels[i]);
    if (s->n_buckets < 0 || s->n_buckets > MS_MD_MAX_BUCKETS)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "model %s: node %s: step %s: bucket count out of range", d->name, n->name,
                       s->name);
    for (int32_t b = 0; b < s->n_buckets; b++)
        if (s->buckets[b] < 1 || (b > 0 && s->buckets[b] <= s->buckets[b - 1]))
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "model %s: node %s: step %s: capture buckets must be positive and "
                           "ascending", d->name, n->name, s->name);
    return MS_OK;
}

/* A node's tables: resources (unique keys and kinds, dependency order, arguments with key and
 * text), labels (main first), steps. */
static ms_status check_node(const ms_model_desc *d, int32_t ni, ms_error *err) {
    const char *name = d->name;
    const ms_md_node *n = &d->nodes[ni];
    if (n->name == NULL || n->name[0] == '\0')
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "model %s: node %d has no name", name, (int)ni);
    for (int32_t j = 0; j < ni; j++)
        if (d->nodes[j].name != NULL && strcmp(d->nodes[j].name, n->name) == 0)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "model %s: node '%s' declared twice", name,
                           n->name);
    const char *nn = n->name;
    if (n->resources == NULL || n->workspace_size == NULL || n->forward == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "model %s: node %s: no resource table, "
                       "workspace_size or forward", name, nn);
    if (n->n_resources < 1 || n->n_resources > MS_MAX_RESOURCES)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "model %s: node %s: %d resources (1..%d)", name,
                       nn, (int)n->n_resources, MS_MAX_RESOURCES);
    for (int32_t i = 0; i < n->n_resources; i++) {
        const ms_md_resource *r = &n->resources[i];
        if (r->key == NULL || r->kind < 0 || r->kind >= MS_RESOURCE_KIND_COUNT || r->n_deps < 0 ||
            r->n_deps > MS_MD_MAX_DEPS)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "model %s: node %s: resource %d: bad key, "
                           "kind or dependency count", name, nn, (int)i);
        for (int32_t j = 0; j < i; j++) {
            if (strcmp(n->resources[j].key, r->key) == 0)
                return MS_FAIL(err, MS_ERR_INVALID_ARG,
                               "model %s: node %s: resource '%s' declared twice", name, nn,
                               r->key);
            if (n->resources[j].kind == r->kind)
                return MS_FAIL(err, MS_ERR_INVALID_ARG,
                               "model %s: node %s: resources '%s' and '%s' are both of kind %s",
                               name, nn, n->resources[j].key, r->key,
                               ms_resource_kind_str(r->kind));
        }
        for (int32_t k = 0; k < r->n_deps; k++) {
            int32_t at = r->deps[k] != NULL ? ms_md_resource_index(n, r->deps[k]) : -1;
            if (at < 0 || at >= i)
                return MS_FAIL(err, MS_ERR_INVALID_ARG,
                               "model %s: node %s: resource '%s' depends on '%s', which is not "
                               "an earlier resource (the table must be in dependency order)",
                               name, nn, r->key, r->deps[k] != NULL ? r->deps[k] : "?");
        }
        if (r->n_args < 0 || (r->n_args > 0 && r->args == NULL))
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "model %s: node %s: resource '%s': %d arguments without a list", name,
                           nn, r->key, (int)r->n_args);
        for (int32_t k = 0; k < r->n_args; k++)
            if (r->args[k].key == NULL || r->args[k].key[0] == '\0' || r->args[k].text == NULL)
                return MS_FAIL(err, MS_ERR_INVALID_ARG,
                               "model %s: node %s: resource '%s': argument %d has no key or text",
                               name, nn, r->key, (int)k);
    }
    if (n->labels == NULL || n->n_labels < 1 || n->n_labels > MS_MAX_LABELS ||
        n->labels[0] == NULL || strcmp(n->labels[0], "main") != 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "model %s: node %s: labels must start with main (1..%d)", name, nn,
                       MS_MAX_LABELS);
    if (n->steps == NULL || n->n_steps < 1 || n->n_steps > MS_MD_MAX_STEPS)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "model %s: node %s: no steps (or more than %d)",
                       name, nn, MS_MD_MAX_STEPS);
    for (int32_t i = 0; i < n->n_steps; i++)
        MS_TRY(check_step(d, n, &n->steps[i], err));
    return MS_OK;
}

static ms_status check_walk(const ms_model_desc *d, const ms_md_walk *w, ms_error *err) {
    if (w->name == NULL || w->items == NULL || w->n_items < 1 || w->loop_begin < 0 ||
        w->loop_begin > w->n_items)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "model %s: walk %s: no items or a bad loop",
                       d->name, w->name != NULL ? w->name : "?");
    for (int32_t i = 0; i < w->n_items; i++) {
        ms_md_walk_item it = w->items[i];
        if (it.node < 0 || it.node >= d->n_nodes)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "model %s: walk %s: item %d names node %d, not one of the %d nodes",
                           d->name, w->name, (int)i, (int)it.node, (int)d->n_nodes);
        if (it.step < 0 || it.step >= d->nodes[it.node].n_steps)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "model %s: walk %s: item %d names step %d of node %s, which has %d",
                           d->name, w->name, (int)i, (int)it.step, d->nodes[it.node].name,
                           (int)d->nodes[it.node].n_steps);
    }
    return MS_OK;
}

ms_status ms_md_check_desc(const ms_model_desc *d, ms_error *err) {
    const char *name = d->name != NULL ? d->name : "?";
    if (d->name == NULL || d->config_load == NULL || d->facts == NULL || d->weights == NULL ||
        d->weight_shape == NULL || d->weight_tied == NULL || d->nodes == NULL ||
        d->config_size == 0)
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
        if (w->rank < 1 || w->rank > 3)
            return WFAIL("rank must be 1, 2 or 3 (a conv1d kernel)");
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
    if (d->n_nodes < 1 || d->n_nodes > MS_MD_MAX_NODES)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "model %s: %d nodes (1..%d)", name,
                       (int)d->n_nodes, MS_MD_MAX_NODES);
    for (int32_t i = 0; i < d->n_nodes; i++)
        MS_TRY(check_node(d, i, err));
    if (d->walks == NULL || d->n_walks < 1)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "model %s: no walk", name);
    for (int32_t i = 0; i < d->n_walks; i++)
        MS_TRY(check_walk(d, &d->walks[i], err));
    if (d->n_kernels < 0 || (d->n_kernels > 0 && d->kernels == NULL))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "model %s: %d kernel instances without a list",
                       name, (int)d->n_kernels);
    for (int32_t i = 0; i < d->n_kernels; i++)
        if (d->kernels[i] == NULL || d->kernels[i][0] == '\0')
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "model %s: kernel instance %d has no stem",
                           name, (int)i);
    if (d->n_ignored < 0 || (d->n_ignored > 0 && d->ignored == NULL))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "model %s: %d ignore patterns without a list",
                       name, (int)d->n_ignored);
    for (int32_t i = 0; i < d->n_ignored; i++)
        if (d->ignored[i] == NULL || d->ignored[i][0] == '\0')
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "model %s: ignore pattern %d is empty", name,
                           (int)i);
    return MS_OK;
}

ms_status ms_md_check_facts(const ms_model_desc *d, const ms_md_facts *f, ms_error *err) {
    /* mstarc refuses these at check time or in the generated config_load; this keeps a descriptor
       from elsewhere from dividing by a zero page size (MS_CEIL_DIV in the KV sizing) */
    if (f->page_size < 1 && !f->no_kv) /* a dense node has no pages */
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

ms_status ms_md_kernel_specs(const ms_model_desc *d, const ms_md_facts *f, int32_t page_size,
                             ms_kernel_spec *out, int cap, int *n, ms_error *err) {
    *n = 0;
    if (d->n_kernels == 0)
        return MS_OK;
    ms_kernel_model_shape sh = {
        .head_dim = f->head_dim,
        .n_q_heads = f->n_q_heads,
        .n_kv_heads = f->n_kv_heads,
        .page_size = page_size,
        .rope = f->rope.theta <= 0.0 ? MS_KERNEL_ROPE_NONE
                : f->rope.style == MS_ROPE_INTERLEAVED ? MS_KERNEL_ROPE_INTERLEAVED
                                                       : MS_KERNEL_ROPE_NEOX,
        .windowed = f->window > 0,
        .weight_dtype = MS_KERNEL_DTYPE_BF16,
        .kv_dtype = MS_KERNEL_DTYPE_BF16,
    };
    return ms_kernel_specs_for_stems(&sh, d->kernels, d->n_kernels, out, cap, n, err);
}

/* ---- step-runner helpers ---- */

ms_status ms_md_step_build_init(ms_md_step_build *b, int32_t max_segments, int32_t max_tokens,
                                ms_error *err) {
    memset(b, 0, sizeof *b);
    size_t S = (size_t)(max_segments > 0 ? max_segments : 1);
    size_t T = (size_t)(max_tokens > 0 ? max_tokens : 1);
    b->segments = ms_calloc(S, sizeof *b->segments);
    b->seg_row = ms_calloc(S, sizeof *b->seg_row);
    b->advance = ms_calloc(S, sizeof *b->advance);
    b->sample = ms_calloc(S, sizeof *b->sample);
    b->guide = ms_calloc(S, sizeof *b->guide);
    b->explicit_ids = ms_calloc(MS_MD_MAX_AXES * T, sizeof *b->explicit_ids);
    if (b->segments == NULL || b->seg_row == NULL || b->advance == NULL || b->sample == NULL || b->guide == NULL || b->explicit_ids == NULL) {
        ms_md_step_build_free(b);
        return MS_FAIL(err, MS_ERR_OOM, "out of memory for step declarations");
    }
    b->cap_segments = (int32_t)S;
    b->cap_tokens = (int32_t)T;
    return MS_OK;
}

void ms_md_step_build_free(ms_md_step_build *b) {
    ms_free(b->segments);
    ms_free(b->seg_row);
    ms_free(b->advance);
    ms_free(b->sample);
    ms_free(b->guide);
    ms_free(b->explicit_ids);
    memset(b, 0, sizeof *b);
}

void ms_md_step_begin(ms_md_step_build *b, const char *name, const ms_md_row *rows) {
    memset(&b->step, 0, sizeof b->step);
    b->step.name = name;
    b->rows = rows;
    b->step.segments = b->segments;
    b->step.n_segments = 0;
    b->n_tokens = 0;
}

ms_status ms_md_step_segment(ms_md_step_build *b, int32_t row, ms_label label, int64_t span,
                             int64_t advance, ms_error *err) {
    int32_t n = b->step.n_segments;
    if (span < 0 || span > INT32_MAX)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "step %s: segment span %lld is out of range",
                       b->step.name, (long long)span);
    if (n >= b->cap_segments || span > (int64_t)(b->cap_tokens - b->n_tokens))
        return MS_FAIL(err, MS_ERR_CAPACITY,
                       "step %s: %d segments / %lld more tokens exceed the step's capacity "
                       "(%d segments, %d tokens)", b->step.name, (int)n + 1, (long long)span,
                       (int)b->cap_segments, (int)b->cap_tokens);
    b->segments[n] = (ms_segment){b->rows[row].rid, label, (int32_t)span};
    b->seg_row[n] = row;
    b->advance[n] = advance < 0 ? (int32_t)span : (int32_t)advance;
    b->step.n_segments = n + 1;
    b->n_tokens += (int32_t)span;
    return MS_OK;
}

void ms_md_step_kv(ms_md_step_build *b, int index, bool commit,
                   const ms_combined_label *combined, int32_t n_combined,
                   const ms_fork *pre_forks, int32_t n_pre_forks, const ms_fork *post_forks,
                   int32_t n_post_forks) {
    b->kv = (ms_kv_step){.commit = commit, .combined = combined, .n_combined = n_combined,
                         .pre_forks = pre_forks, .n_pre_forks = n_pre_forks,
                         .post_forks = post_forks, .n_post_forks = n_post_forks};
    b->step.records[index].rec = &b->kv;
}

ms_status ms_md_step_pos(ms_md_step_build *b, int index, bool custom_advance, bool explicit_ids,
                         ms_error *err) {
    b->pos = (ms_pos_step){.advance = custom_advance ? b->advance : NULL, .n_axes = 1};
    if (explicit_ids) {
        int32_t n_axes = 0;
        for (int32_t i = 0; i < b->step.n_segments; i++) {
            const ms_md_row *r = &b->rows[b->seg_row[i]];
            if (r->position_ids == NULL || r->n_position_axes < 1 ||
                r->n_position_axes > MS_MD_MAX_AXES || (n_axes && r->n_position_axes != n_axes))
                return MS_FAIL(err, MS_ERR_INVALID_ARG,
                               "step %s: request %llu has no explicit position ids (or another "
                               "number of axes than the batch)", b->step.name,
                               (unsigned long long)r->rid);
            n_axes = r->n_position_axes;
        }
        /* the row's ids cover its tokens in its segments' order: offset = its earlier spans */
        int32_t T = b->n_tokens, t = 0;
        for (int32_t i = 0; i < b->step.n_segments; i++) {
            const ms_md_row *r = &b->rows[b->seg_row[i]];
            int32_t off = 0, row_tokens = 0;
            for (int32_t j = 0; j < b->step.n_segments; j++)
                if (b->seg_row[j] == b->seg_row[i]) {
                    if (j < i)
                        off += b->segments[j].span;
                    row_tokens += b->segments[j].span;
                }
            int32_t stride = r->position_stride > 0 ? r->position_stride : row_tokens;
            for (int32_t a = 0; a < n_axes; a++)
                memcpy(b->explicit_ids + (size_t)a * (size_t)T + (size_t)t,
                       r->position_ids + (size_t)a * (size_t)stride + (size_t)off,
                       (size_t)b->segments[i].span * sizeof(int32_t));
            t += b->segments[i].span;
        }
        b->pos.explicit_ids = b->explicit_ids;
        b->pos.n_axes = n_axes > 0 ? n_axes : 1;
    }
    b->step.records[index].rec = &b->pos;
    return MS_OK;
}

void ms_md_step_attn(ms_md_step_build *b, int index, bool causal) {
    b->attn = (ms_attn_step){.causal = causal};
    b->step.records[index].rec = &b->attn;
}

void ms_md_step_cross(ms_md_step_build *b, int index) {
    static const int used = 1; /* the resource reads the step itself */
    b->step.records[index].rec = &used;
}

void ms_md_step_scratch(ms_md_step_build *b, int index, bool begin_frame) {
    static const ms_scratch_kv_step begin = {true}, cont = {false};
    b->step.records[index].rec = begin_frame ? &begin : &cont;
}

void ms_md_step_sampler(ms_md_step_build *b, int index) {
    int32_t n = b->step.n_segments;
    ms_label cond = MS_LABEL_MAIN, uncond = -1;
    if (b->kv.n_combined > 0 && b->kv.combined[0].n_labels >= 2) {
        cond = b->kv.combined[0].labels[0];
        uncond = b->kv.combined[0].labels[1];
    } else if (n > 0) {
        cond = b->segments[0].label;
    }
    for (int32_t i = 0; i < n; i++) {
        b->sample[i] = b->segments[i].label == cond && b->rows[b->seg_row[i]].sample;
        b->guide[i] = -1;
        if (!b->sample[i] || uncond < 0)
            continue;
        for (int32_t j = 0; j < n; j++)
            if (b->seg_row[j] == b->seg_row[i] && b->segments[j].label == uncond)
                b->guide[i] = j;
    }
    b->sampler = (ms_sample_step){.sample = b->sample, .guide = b->guide};
    b->step.records[index].rec = &b->sampler;
}
