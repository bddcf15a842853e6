/*
 * eval.c - config values and config expression evaluation. See eval.h.
 *
 * Parameters are evaluated on demand (a parameter's default may use parameters declared after
 * it); sema already rejected cycles, and a depth bound keeps a bad model from recursing forever.
 * Integer arithmetic is 64-bit with C semantics (/ truncates); overflow is reported.
 */
#include "eval.h"

#include <math.h>
#include <string.h>

typedef struct evaluator {
    const ms_model *m;
    const json_t *config;
    ms_value *values;
    unsigned char *state;  /* [n_params] 0 = not yet, 1 = in progress, 2 = done */
    ms_error *err;
} evaluator;

static ms_status eval_expr(evaluator *ev, const ms_ast_expr *e, ms_value *out, int depth);

/* config.json value at a dotted path, or NULL (JSON null counts as absent). */
static const json_t *json_path(const json_t *root, const char *path) {
    const json_t *cur = root;
    char key[256];
    const char *p = path;
    while (cur != NULL) {
        const char *dot = strchr(p, '.');
        size_t n = dot != NULL ? (size_t)(dot - p) : strlen(p);
        if (n >= sizeof key || !json_is_object(cur))
            return NULL;
        memcpy(key, p, n);
        key[n] = '\0';
        cur = json_object_get(cur, key);
        if (dot == NULL)
            break;
        p = dot + 1;
    }
    return cur != NULL && !json_is_null(cur) ? cur : NULL;
}

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

static ms_status from_json(evaluator *ev, const ms_param *p, const char *key, const json_t *j, ms_value *out) {
    switch (p->type) {
    case MS_TYPE_INT:
        if (json_is_integer(j)) {
            out->type = MS_TYPE_INT;
            out->i = (int64_t)json_integer_value(j);
            out->f = (double)out->i;
            return MS_OK;
        }
        break;
    case MS_TYPE_FLOAT:
        if (json_is_number(j)) {
            out->type = MS_TYPE_FLOAT;
            out->f = json_number_value(j);
            return MS_OK;
        }
        break;
    case MS_TYPE_BOOL:
        if (json_is_boolean(j)) {
            out->type = MS_TYPE_BOOL;
            out->b = json_is_true(j);
            return MS_OK;
        }
        break;
    case MS_TYPE_STRING:
        if (json_is_string(j)) {
            out->type = MS_TYPE_STRING;
            out->s = json_string_value(j);
            return MS_OK;
        }
        break;
    case MS_TYPE_LIST: {
        /* an array of integers; a bare integer is a list of one (as the runtime reads it) */
        if (!json_is_array(j) && !json_is_integer(j))
            break;
        size_t n = json_is_array(j) ? json_array_size(j) : 1;
        if (n > MS_MD_MAX_LIST)
            return MS_FAIL(ev->err, MS_ERR_FORMAT, "config.json: \"%s\" (parameter '%s') has %zu "
                           "elements, at most %d", key, p->name, n, MS_MD_MAX_LIST);
        for (size_t k = 0; k < n; k++) {
            const json_t *e = json_is_array(j) ? json_array_get(j, k) : j;
            if (!json_is_integer(e))
                return MS_FAIL(ev->err, MS_ERR_FORMAT, "config.json: \"%s\"[%zu] (parameter '%s') "
                               "should be an int, got %s", key, k, p->name, json_kind(e));
            out->list[k] = (int64_t)json_integer_value(e);
        }
        out->type = MS_TYPE_LIST;
        out->n = (int32_t)n;
        return MS_OK;
    }
    default:
        break;
    }
    return MS_FAIL(ev->err, MS_ERR_FORMAT, "config.json: \"%s\" (parameter '%s') should be %s %s, got %s", key,
                   p->name, p->type == MS_TYPE_INT || p->type == MS_TYPE_LIST ? "an" : "a",
                   ms_type_str(p->type), json_kind(j));
}

static ms_status eval_param(evaluator *ev, const ms_param *p, int depth) {
    if (ev->state[p->index] == 2)
        return MS_OK;
    if (ev->state[p->index] == 1 || depth > 256)
        return MS_FAIL(ev->err, MS_ERR_FORMAT, "parameter '%s' depends on itself", p->name);
    ev->state[p->index] = 1;
    ms_value *out = &ev->values[p->index];
    memset(out, 0, sizeof *out);
    if (!p->derived) {
        for (int k = 0; k < p->n_sources; k++) {
            const json_t *j = json_path(ev->config, p->sources[k]);
            if (j != NULL) {
                MS_TRY(from_json(ev, p, p->sources[k], j, out));
                ev->state[p->index] = 2;
                return MS_OK;
            }
        }
    }
    if (p->dflt != NULL) {
        MS_TRY(eval_expr(ev, p->dflt, out, depth + 1));
        if (p->type == MS_TYPE_FLOAT && out->type == MS_TYPE_INT)
            out->type = MS_TYPE_FLOAT;
    } else if (p->optional) {
        out->type = MS_TYPE_NONE;
    } else {
        return MS_FAIL(ev->err, MS_ERR_FORMAT, "config.json has no \"%s\" (required by parameter '%s')",
                       p->sources[0], p->name);
    }
    ev->state[p->index] = 2;
    return MS_OK;
}

static double num(const ms_value *v) { return v->type == MS_TYPE_INT ? (double)v->i : v->f; }

static ms_status eval_binary(evaluator *ev, const ms_ast_expr *e, const ms_value *a, const ms_value *b,
                             ms_value *out) {
    bool ints = a->type == MS_TYPE_INT && b->type == MS_TYPE_INT;
    out->type = MS_TYPE_BOOL;
    switch (e->op) {
    case MS_OP_AND: out->b = a->b && b->b; return MS_OK;
    case MS_OP_OR: out->b = a->b || b->b; return MS_OK;
    case MS_OP_EQ:
    case MS_OP_NE: {
        bool eq;
        if (a->type == MS_TYPE_STRING || b->type == MS_TYPE_STRING)
            eq = a->type == b->type && strcmp(a->s, b->s) == 0;
        else if (a->type == MS_TYPE_BOOL || b->type == MS_TYPE_BOOL)
            eq = a->type == b->type && a->b == b->b;
        else
            eq = ints ? a->i == b->i : num(a) == num(b);
        out->b = e->op == MS_OP_EQ ? eq : !eq;
        return MS_OK;
    }
    case MS_OP_LT: out->b = ints ? a->i < b->i : num(a) < num(b); return MS_OK;
    case MS_OP_LE: out->b = ints ? a->i <= b->i : num(a) <= num(b); return MS_OK;
    case MS_OP_GT: out->b = ints ? a->i > b->i : num(a) > num(b); return MS_OK;
    case MS_OP_GE: out->b = ints ? a->i >= b->i : num(a) >= num(b); return MS_OK;
    default: break;
    }
    if (ints) {
        int64_t r = 0;
        bool bad = false;
        switch (e->op) {
        case MS_OP_ADD: bad = __builtin_add_overflow(a->i, b->i, &r); break;
        case MS_OP_SUB: bad = __builtin_sub_overflow(a->i, b->i, &r); break;
        case MS_OP_MUL: bad = __builtin_mul_overflow(a->i, b->i, &r); break;
        case MS_OP_DIV:
        case MS_OP_MOD:
            if (b->i == 0)
                return MS_FAIL(ev->err, MS_ERR_FORMAT, "line %d: division by zero", e->loc.first_line);
            if (a->i == INT64_MIN && b->i == -1)
                bad = true;
            else
                r = e->op == MS_OP_DIV ? a->i / b->i : a->i % b->i;
            break;
        default: break;
        }
        if (bad)
            return MS_FAIL(ev->err, MS_ERR_FORMAT, "line %d: integer overflow", e->loc.first_line);
        out->type = MS_TYPE_INT;
        out->i = r;
        out->f = (double)r;
        return MS_OK;
    }
    double x = num(a), y = num(b), r = 0.0;
    switch (e->op) {
    case MS_OP_ADD: r = x + y; break;
    case MS_OP_SUB: r = x - y; break;
    case MS_OP_MUL: r = x * y; break;
    case MS_OP_DIV:
        if (y == 0.0)
            return MS_FAIL(ev->err, MS_ERR_FORMAT, "line %d: division by zero", e->loc.first_line);
        r = x / y;
        break;
    default:
        return MS_FAIL(ev->err, MS_ERR_INVALID_ARG, "line %d: '%s' cannot be evaluated", e->loc.first_line,
                       ms_op_str(e->op));
    }
    out->type = MS_TYPE_FLOAT;
    out->f = r;
    return MS_OK;
}

static ms_status eval_expr(evaluator *ev, const ms_ast_expr *e, ms_value *out, int depth) {
    memset(out, 0, sizeof *out);
    if (depth > 4096)
        return MS_FAIL(ev->err, MS_ERR_FORMAT, "expression nested too deeply");
    switch (e->kind) {
    case MS_EXPR_INT:
        out->type = MS_TYPE_INT;
        out->i = e->ival;
        out->f = (double)e->ival;
        return MS_OK;
    case MS_EXPR_FLOAT:
        out->type = MS_TYPE_FLOAT;
        out->f = e->fval;
        return MS_OK;
    case MS_EXPR_BOOL:
        out->type = MS_TYPE_BOOL;
        out->b = e->bval;
        return MS_OK;
    case MS_EXPR_STRING:
        out->type = MS_TYPE_STRING;
        out->s = e->text;
        return MS_OK;
    case MS_EXPR_NONE:
        out->type = MS_TYPE_NONE;
        return MS_OK;
    case MS_EXPR_NAME: {
        if (e->sym == NULL || e->sym->kind != MS_SYM_PARAM)
            return MS_FAIL(ev->err, MS_ERR_INVALID_ARG, "line %d: '%s' is not a config parameter",
                           e->loc.first_line, e->text);
        const ms_param *p = e->sym->param;
        if (ev->state != NULL)
            MS_TRY(eval_param(ev, p, depth + 1));
        *out = ev->values[p->index];
        if (out->type == MS_TYPE_NONE)
            return MS_FAIL(ev->err, MS_ERR_FORMAT, "line %d: optional parameter '%s' is absent", e->loc.first_line,
                           p->name);
        return MS_OK;
    }
    case MS_EXPR_UNARY: {
        ms_value a;
        MS_TRY(eval_expr(ev, e->lhs, &a, depth + 1));
        if (e->op == MS_OP_NOT) {
            out->type = MS_TYPE_BOOL;
            out->b = !a.b;
        } else if (a.type == MS_TYPE_INT) {
            if (a.i == INT64_MIN)
                return MS_FAIL(ev->err, MS_ERR_FORMAT, "line %d: integer overflow", e->loc.first_line);
            out->type = MS_TYPE_INT;
            out->i = -a.i;
            out->f = (double)out->i;
        } else {
            out->type = MS_TYPE_FLOAT;
            out->f = -a.f;
        }
        return MS_OK;
    }
    case MS_EXPR_BINARY: {
        ms_value a, b;
        MS_TRY(eval_expr(ev, e->lhs, &a, depth + 1));
        if ((e->op == MS_OP_AND && !a.b) || (e->op == MS_OP_OR && a.b)) {
            out->type = MS_TYPE_BOOL;
            out->b = a.b;
            return MS_OK;
        }
        MS_TRY(eval_expr(ev, e->rhs, &b, depth + 1));
        return eval_binary(ev, e, &a, &b, out);
    }
    case MS_EXPR_LIST:
        if (e->args.n > MS_MD_MAX_LIST)
            return MS_FAIL(ev->err, MS_ERR_FORMAT, "line %d: a list of more than %d elements",
                           e->loc.first_line, MS_MD_MAX_LIST);
        for (int k = 0; k < e->args.n; k++) {
            ms_value v;
            MS_TRY(eval_expr(ev, ((const ms_ast_arg *)e->args.items[k])->value, &v, depth + 1));
            if (v.type != MS_TYPE_INT)
                return MS_FAIL(ev->err, MS_ERR_FORMAT, "line %d: list element %d is not an int",
                               e->loc.first_line, k);
            out->list[k] = v.i;
        }
        out->type = MS_TYPE_LIST;
        out->n = (int32_t)e->args.n;
        return MS_OK;
    case MS_EXPR_COND: {
        ms_value c;
        MS_TRY(eval_expr(ev, e->cond, &c, depth + 1));
        return eval_expr(ev, c.b ? e->lhs : e->rhs, out, depth + 1);
    }
    case MS_EXPR_CALL: {
        const char *fn = e->lhs->kind == MS_EXPR_NAME ? e->lhs->text : "";
        if (strcmp(fn, "has") == 0 && e->args.n == 1) {
            const ms_ast_expr *a = ((const ms_ast_arg *)e->args.items[0])->value;
            if (a->sym == NULL || a->sym->kind != MS_SYM_PARAM)
                return MS_FAIL(ev->err, MS_ERR_INVALID_ARG, "line %d: has() of a non-parameter", e->loc.first_line);
            if (ev->state != NULL)
                MS_TRY(eval_param(ev, a->sym->param, depth + 1));
            out->type = MS_TYPE_BOOL;
            out->b = ev->values[a->sym->param->index].type != MS_TYPE_NONE;
            return MS_OK;
        }
        if ((strcmp(fn, "min") == 0 || strcmp(fn, "max") == 0) && e->args.n == 2) {
            ms_value a, b;
            MS_TRY(eval_expr(ev, ((const ms_ast_arg *)e->args.items[0])->value, &a, depth + 1));
            MS_TRY(eval_expr(ev, ((const ms_ast_arg *)e->args.items[1])->value, &b, depth + 1));
            bool take_a = (num(&a) < num(&b)) == (fn[1] == 'i');
            *out = take_a ? a : b;
            if (a.type != b.type) {
                out->f = num(out);
                out->type = MS_TYPE_FLOAT;
            }
            return MS_OK;
        }
        return MS_FAIL(ev->err, MS_ERR_INVALID_ARG, "line %d: %s() is not a config value (it is evaluated by its resource)",
                       e->loc.first_line, fn);
    }
    default:
        return MS_FAIL(ev->err, MS_ERR_INVALID_ARG, "line %d: not a config expression", e->loc.first_line);
    }
}

ms_status ms_config_eval(const ms_model *m, const json_t *config, ms_value *values, ms_error *err) {
    if (!json_is_object(config))
        return MS_FAIL(err, MS_ERR_FORMAT, "config.json is not a JSON object");
    unsigned char *state = ms_calloc((size_t)(m->n_params > 0 ? m->n_params : 1), 1);
    if (state == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "out of memory");
    evaluator ev = {m, config, values, state, err};
    ms_status st = MS_OK;
    for (int i = 0; i < m->n_params && st == MS_OK; i++)
        st = eval_param(&ev, m->params[i], 0);
    ms_free(state);
    return st;
}

ms_status ms_expr_eval(const ms_ast_expr *e, const ms_value *values, ms_value *out, ms_error *err) {
    evaluator ev = {NULL, NULL, (ms_value *)values, NULL, err};
    return eval_expr(&ev, e, out, 0);
}
