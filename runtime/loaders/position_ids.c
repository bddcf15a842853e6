/*
 * position_ids.c - explicit position ids from a JSON file ([3][S] or [S] integers), validated and
 * flattened axis-major for ms_pos_step.explicit_ids (see position_ids.h).
 *
 * Constraints: every failure is one line naming the file and, for a bad value, the element
 * ([axis][token], or [token] for one axis); nothing is kept on failure; the ids array comes from
 * ms_malloc so tests count it.
 */
#include "position_ids.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* "a string", "a real number 2.5", ... for messages. */
static const char *json_kind(const json_t *j) {
    switch (json_typeof(j)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a bool";
    default: return "null";
    }
}

/* Element `e` at [axis][t] (axis < 0: a one-axis file, [t]) into *out. */
static ms_status read_id(const char *name, const json_t *e, int32_t axis, size_t t, int32_t *out,
                         ms_error *err) {
    char at[48];
    if (axis < 0)
        snprintf(at, sizeof at, "[%zu]", t);
    else
        snprintf(at, sizeof at, "[%d][%zu]", (int)axis, t);
    if (!json_is_integer(e))
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: element %s is %s, expected an integer", name, at,
                       json_kind(e));
    json_int_t v = json_integer_value(e);
    if (v < 0)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: element %s is %" JSON_INTEGER_FORMAT
                       ": position ids are >= 0", name, at, v);
    if (v > INT32_MAX)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: element %s is %" JSON_INTEGER_FORMAT
                       ", past int32 (%d)", name, at, v, INT32_MAX);
    *out = (int32_t)v;
    return MS_OK;
}

/* Validate the parsed document and fill *out (zeroed on failure). */
static ms_status from_json(ms_position_ids *out, const char *name, const json_t *root,
                           int32_t n_tokens, ms_error *err) {
    if (!json_is_array(root))
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: top level is %s; position ids are a JSON array "
                       "[3][S] (t, h, w) or [S]", name, json_kind(root));
    size_t n0 = json_array_size(root);
    if (n0 == 0)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: no position ids (an empty array)", name);
    bool rows = json_is_array(json_array_get(root, 0));
    size_t n_axes = rows ? n0 : 1;
    size_t len = rows ? json_array_size(json_array_get(root, 0)) : n0;
    if (rows && n_axes != 1 && n_axes != 3)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: %zu position axes; ids are [3][S] (t, h, w) or "
                       "[S]", name, n_axes);
    for (size_t a = 0; a < n_axes && rows; a++) {
        const json_t *row = json_array_get(root, a);
        if (!json_is_array(row))
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: element [%zu] is %s, expected an array of "
                           "ids like element [0]", name, a, json_kind(row));
        if (json_array_size(row) != len)
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: axis %zu has %zu ids, axis 0 has %zu (the "
                           "array must be rectangular)", name, a, json_array_size(row), len);
    }
    if (len == 0)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: no position ids (axis 0 is empty)", name);
    if (len > MS_POSITION_IDS_MAX_TOKENS)
        return MS_FAIL(err, MS_ERR_LIMIT, "%s: %zu position ids per axis, at most %d", name, len,
                       MS_POSITION_IDS_MAX_TOKENS);
    if (n_tokens >= 0 && len != (size_t)n_tokens)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: %zu position id%s per axis, the prompt has %d "
                       "token%s", name, len, len == 1 ? "" : "s", (int)n_tokens,
                       n_tokens == 1 ? "" : "s");
    int32_t *ids = ms_malloc(n_axes * len * sizeof *ids);
    if (ids == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory for %zu position ids", name,
                       n_axes * len);
    for (size_t a = 0; a < n_axes; a++) {
        const json_t *row = rows ? json_array_get(root, a) : root;
        for (size_t t = 0; t < len; t++) {
            const json_t *e = json_array_get(row, t);
            ms_status st = read_id(name, e, rows ? (int32_t)a : -1, t, &ids[a * len + t], err);
            if (st != MS_OK) {
                ms_free(ids);
                return st;
            }
        }
    }
    out->n_axes = (int32_t)n_axes;
    out->n_tokens = (int32_t)len;
    out->ids = ids;
    return MS_OK;
}

ms_status ms_position_ids_init_from_string(ms_position_ids *out, const char *name,
                                           const char *json_text, int32_t n_tokens,
                                           ms_error *err) {
    memset(out, 0, sizeof *out);
    json_error_t jerr;
    json_t *root = json_loads(json_text, 0, &jerr);
    if (root == NULL)
        return MS_FAIL(err, MS_ERR_PARSE, "%s:%d:%d: not JSON: %s", name, jerr.line, jerr.column,
                       jerr.text);
    ms_status st = from_json(out, name, root, n_tokens, err);
    json_decref(root);
    return st;
}

ms_status ms_position_ids_init(ms_position_ids *out, const char *path, int32_t n_tokens,
                               ms_error *err) {
    memset(out, 0, sizeof *out);
    struct stat sb;
    if (stat(path, &sb) != 0)
        return MS_FAIL(err, errno == ENOENT ? MS_ERR_NOT_FOUND : MS_ERR_IO, "%s: cannot read: %s",
                       path, strerror(errno));
    if (!S_ISREG(sb.st_mode)) /* jansson reads a folder as an empty file */
        return MS_FAIL(err, MS_ERR_IO, "%s: cannot read: not a regular file", path);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (root == NULL) {
        if (access(path, R_OK) != 0)
            return MS_FAIL(err, MS_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
        return MS_FAIL(err, MS_ERR_PARSE, "%s:%d:%d: not JSON: %s", path, jerr.line, jerr.column,
                       jerr.text);
    }
    ms_status st = from_json(out, path, root, n_tokens, err);
    json_decref(root);
    return st;
}

void ms_position_ids_free(ms_position_ids *p) {
    if (p == NULL)
        return;
    ms_free(p->ids);
    memset(p, 0, sizeof *p);
}
