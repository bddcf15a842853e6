/*
 * sema.c - the semantic pass: checks a model's syntax tree and builds the checked model
 * (model.h). Reports through the same diagnostics list as the parser (CONVENTIONS.md item 9).
 *
 * Order of checks (each phase records errors and keeps going, so one run shows many):
 *   1. config: types, duplicates, defaults (types, cycles), optional/derived rules;
 *   2. weights: groups, name templates ({i}), shapes (int config expressions), ties;
 *   3. per node: labels, resources (constructor keys and types, dependencies, cycles, order, sizes
 *      known without config.json),
 *      forwards (names, bindings, calls, tensor shapes against the declared weights), steps
 *      (segments, records of declared resources, commit/advance, capture buckets);
 *   4. walks: node.step references, loop stop conditions.
 * Shapes are compared symbolically: each dimension is put in a canonical form (derived `let`
 * parameters expanded, sums and products flattened and sorted, integer constants folded) and
 * two dimensions match when their canonical texts are equal. A dynamic dimension (token count)
 * matches anything. Checking is linear in the size of the model: names are looked up in hash
 * tables (strmap.h), default cycles are found in one pass, and each derived parameter's canonical
 * form is built once (canon_memo).
 */
#include "model.h"

#include <stdlib.h>
#include <string.h>

#include "model_desc.h" /* MS_MD_MAX_LIST, MS_ROPE_MAX_SECTIONS: limits the runtime keeps */
#include "print.h"
#include "strmap.h"

#define MAX_RANK 8

/* ---- pass state ---- */

/* A forward value (what an expression evaluates to). */
typedef struct fval {
    ms_type t;
    int rank;                      /* TENSOR */
    const ms_ast_expr **dims;      /* TENSOR [rank], NULL entries = dynamic */
    int n;                         /* TUPLE */
    struct fval *elems;            /* TUPLE [n] */
    const ms_group *group;         /* LAYER */
    const ms_resource *res;        /* RESOURCE */
} fval;

/* A name bound in a forward. */
typedef struct binding {
    const char *name;
    fval v;
    ms_ast_sym *sym;
    int depth;                     /* loop nesting where it was introduced */
    int prev;                      /* the binding of the same name it hides, -1 none */
} binding;

typedef enum cx_mode {
    CX_CONFIG = 0,                 /* config parameters only */
    CX_SPAN,                       /* plus step inputs and len(input) */
} cx_mode;

typedef struct sema {
    ms_arena *a;
    ms_diags *d;
    ms_model *m;
    const ms_param *guards[64];    /* optional params proven present by has(p) ? ... */
    int n_guards;
    ms_node *node;                 /* node being checked */
    const ms_ast_forward *fwd;     /* forward being checked ([codes] its `ids` parameters) */
    bool ids_ok;                   /* [codes] checking embedding()'s ids argument */
    const ms_ast_step *step;       /* step being checked (CX_SPAN inputs) */
    binding *binds;                /* forward scope */
    int n_binds;
    int cap_binds;
    int depth;
    int n_locals;
    ms_ast_sym *builtin_sym;
    ms_ast_sym *word_sym;
    int canon_budget;              /* nodes canon() may still visit (a guard on huge expressions) */
    /* name lookups (strmap.h), so checking is linear in the model's size */
    ms_strmap params;              /* name -> ms_param */
    ms_strmap weights;             /* top-level name -> ms_weight */
    ms_strmap groups;              /* name -> ms_group */
    ms_strmap members;             /* "group.member" -> ms_weight */
    ms_strmap nodes;               /* name -> ms_node */
    ms_strmap steps;               /* "node.step" -> ms_step_decl */
    ms_strmap resources;           /* name -> ms_resource of s->node */
    ms_strmap bind_map;            /* name -> index + 1 of its newest binding in binds */
    ms_strmap forwards;            /* name -> ms_forward of s->node ("forward": the unnamed one) */
    struct canon_memo *memos;      /* [n_params] canonical forms of derived parameters */
} sema;

#define NEW(s, T) ((T *)ms_arena_alloc((s)->a, sizeof(T)))
#define NEWN(s, T, n) ((T *)ms_arena_alloc((s)->a, sizeof(T) * (size_t)((n) > 0 ? (n) : 1)))

static void err(sema *s, ms_loc loc, const char *fmt, ...) MS_PRINTF(3, 4);
static void err(sema *s, ms_loc loc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    ms_diags_verror(s->d, loc, fmt, ap);
    va_end(ap);
}

const char *ms_type_str(ms_type t) {
    /* ORDER MS_TYPE */
    static const char *const names[MS_TYPE_COUNT] = {
        "unknown", "int", "float", "bool", "string", "none", "word", "window", "scaling",
        "int[]", "tensor", "tuple", "layer", "resource",
    };
    return (unsigned)t < MS_TYPE_COUNT ? names[t] : "unknown";
}

/* The text of a buffer, moved into the arena; out of memory unwinds like the arena's own. */
static const char *take(sema *s, ms_strbuf *b) {
    if (b->oom) {
        ms_strbuf_free(b);
        ms_arena_oom(s->a);
        return "?";
    }
    const char *t = ms_arena_strdup(s->a, b->data != NULL ? b->data : "");
    ms_strbuf_free(b);
    return t != NULL ? t : "?";
}

/* ---- suggestions ---- */

static int edit_distance(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 40 || lb > 40)
        return 99;
    int row[41];
    for (size_t j = 0; j <= lb; j++)
        row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int prev = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int cur = row[j];
            int cost = a[i - 1] == b[j - 1] ? 0 : 1;
            int best = prev + cost;
            if (row[j] + 1 < best)
                best = row[j] + 1;
            if (row[j - 1] + 1 < best)
                best = row[j - 1] + 1;
            row[j] = best;
            prev = cur;
        }
    }
    return row[lb];
}

/* Candidate collector for "did you mean". */
typedef struct suggest {
    const char *name;
    const char *best;
    int best_d;
} suggest;

static void suggest_add(suggest *g, const char *cand) {
    if (cand == NULL)
        return;
    int d = edit_distance(g->name, cand);
    int limit = (int)strlen(g->name) / 3;
    if (limit < 1)
        limit = 1;
    if (d <= limit && (g->best == NULL || d < g->best_d || (d == g->best_d && strcmp(cand, g->best) < 0))) {
        g->best = cand;
        g->best_d = d;
    }
}

static const char *suggest_text(sema *s, const suggest *g) {
    if (g->best == NULL)
        return "";
    return ms_arena_sprintf(s->a, " (did you mean '%s'?)", g->best);
}

/* ---- lookups ---- */

/* The pass's lookups go through its maps (filled as declarations are checked, so a lookup sees
 * the declarations before the current one, as a duplicate check needs); the public ms_model_find_*
 * below scan the checked model. */
static ms_param *find_param(sema *s, const char *name) { return ms_strmap_get(&s->params, name); }

static ms_weight *find_top_weight(sema *s, const char *name) { return ms_strmap_get(&s->weights, name); }

static ms_group *find_group(sema *s, const char *name) { return ms_strmap_get(&s->groups, name); }

static const char *member_key(sema *s, const ms_group *g, const char *name) {
    return ms_arena_sprintf(s->a, "%s.%s", g->name, name);
}

static ms_weight *find_member(sema *s, const ms_group *g, const char *name) {
    return ms_strmap_get(&s->members, member_key(s, g, name));
}

/* A resource of s->node (the node being checked). */
static ms_resource *find_resource(sema *s, const char *name) { return ms_strmap_get(&s->resources, name); }

static const char *step_key(sema *s, const ms_node *n, const char *name) {
    return ms_arena_sprintf(s->a, "%s.%s", n->name, name);
}

static ms_label_decl *find_label(const ms_node *n, const char *name) {
    for (int i = 0; i < n->n_labels; i++)
        if (strcmp(n->labels[i].name, name) == 0)
            return &n->labels[i];
    return NULL;
}

const ms_param *ms_model_find_param(const ms_model *m, const char *name) {
    for (int i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i]->name, name) == 0)
            return m->params[i];
    return NULL;
}

const ms_weight *ms_model_find_weight(const ms_model *m, const char *name) {
    for (int i = 0; i < m->n_weights; i++)
        if (m->weights[i]->group == NULL && strcmp(m->weights[i]->name, name) == 0)
            return m->weights[i];
    return NULL;
}

const ms_node *ms_model_find_node(const ms_model *m, const char *name) {
    for (int i = 0; i < m->n_nodes; i++)
        if (strcmp(m->nodes[i]->name, name) == 0)
            return m->nodes[i];
    return NULL;
}

const ms_step_decl *ms_node_find_step(const ms_node *n, const char *name) {
    for (int i = 0; i < n->n_steps; i++)
        if (strcmp(n->steps[i]->name, name) == 0)
            return n->steps[i];
    return NULL;
}

static bool is_guarded(const sema *s, const ms_param *p) {
    for (int i = 0; i < s->n_guards; i++)
        if (s->guards[i] == p)
            return true;
    return false;
}

/* ---- resource constructor specs ---- */

static const char *const WORDS_DTYPE[] = {"bf16", "f16", "f32", NULL};
static const char *const WORDS_STYLE[] = {"rotate_half", "interleaved", NULL};
static const char *const WORDS_SCHEME[] = {"sequential", "block", "explicit", NULL};

/* ORDER: specs are listed by runtime kind. */
static const ms_res_spec SPECS[] = {
    {"kv_pool", MS_RESOURCE_KV, false, {
        {"layers", MS_ARG_INT, true, NULL, NULL},
        {"kv_heads", MS_ARG_INT, true, NULL, NULL},
        {"head_dim", MS_ARG_INT, true, NULL, NULL},
        {"page_size", MS_ARG_INT, false, "16", NULL},
        {"dtype", MS_ARG_ENUM, false, "bf16", WORDS_DTYPE},
        {"retention", MS_ARG_WINDOW, false, "none", NULL},
        {NULL, 0, false, NULL, NULL}}},
    {"rope", MS_RESOURCE_POS, true, {
        {"theta", MS_ARG_FLOAT, true, NULL, NULL},
        {"style", MS_ARG_ENUM, false, "rotate_half", WORDS_STYLE},
        {"head_dim", MS_ARG_INT, false, "the kv_pool's head_dim", NULL},
        {"rotary_dim", MS_ARG_INT, false, "head_dim", NULL},
        {"scaling", MS_ARG_SCALING, false, "none", NULL},
        {"sections", MS_ARG_INT_LIST, false, "none", NULL},
        {"scheme", MS_ARG_ENUM, false, "sequential", WORDS_SCHEME},
        {NULL, 0, false, NULL, NULL}}},
    /* positions and attention need a kv_pool in a node that has one; in a node without one
       they are the dense forms (check_dense: the step's own rows, nothing kept) */
    {"positions", MS_RESOURCE_POS, false, {
        {"table", MS_ARG_WEIGHT, true, NULL, NULL},
        {"scheme", MS_ARG_ENUM, false, "sequential", WORDS_SCHEME},
        {NULL, 0, false, NULL, NULL}}},
    {"attention", MS_RESOURCE_ATTN, false, {
        {"q_heads", MS_ARG_INT, true, NULL, NULL},
        {"causal", MS_ARG_BOOL, false, "true (dense: false)", NULL},
        {"head_dim", MS_ARG_INT, false, "the kv_pool's head_dim (dense: required)", NULL},
        {"kv_heads", MS_ARG_INT, false, "the kv_pool's kv_heads (dense: q_heads)", NULL},
        {"window", MS_ARG_INT_OR_NONE, false, "none", NULL},
        {"scale", MS_ARG_FLOAT, false, "1 / sqrt(head_dim)", NULL},
        {"soft_cap", MS_ARG_FLOAT, false, "0.0 (off)", NULL},
        {NULL, 0, false, NULL, NULL}}},
    {"cross", MS_RESOURCE_CROSS, true, {
        {"context", MS_ARG_LABEL, true, NULL, NULL},
        {"q_heads", MS_ARG_INT, true, NULL, NULL},
        {"scale", MS_ARG_FLOAT, false, "1 / sqrt(head_dim)", NULL},
        {NULL, 0, false, NULL, NULL}}},
    {"scratch", MS_RESOURCE_SCRATCH, false, {
        {"shape", MS_ARG_INT_LIST, true, NULL, NULL},
        {"rows", MS_ARG_INT, true, NULL, NULL},
        {"dtype", MS_ARG_ENUM, false, "bf16", WORDS_DTYPE},
        {"layers", MS_ARG_INT, false, "none (required by mstarc build)", NULL},
        {"q_heads", MS_ARG_INT, false, "none (required by mstarc build)", NULL},
        {NULL, 0, false, NULL, NULL}}},
    {"sampler", MS_RESOURCE_SAMPLER, false, {
        {"vocab", MS_ARG_INT, true, NULL, NULL},
        {"temperature", MS_ARG_FLOAT, false, "1.0", NULL},
        {"top_k", MS_ARG_INT, false, "0 (off)", NULL},
        {"top_p", MS_ARG_FLOAT, false, "1.0 (off)", NULL},
        {NULL, 0, false, NULL, NULL}}},
};

const ms_res_spec *ms_res_specs(int *n) {
    *n = (int)MS_ARRAY_LEN(SPECS);
    return SPECS;
}

const ms_res_spec *ms_res_spec_find(const char *ctor) {
    for (size_t i = 0; i < MS_ARRAY_LEN(SPECS); i++)
        if (strcmp(SPECS[i].ctor, ctor) == 0)
            return &SPECS[i];
    return NULL;
}

static int spec_key(const ms_res_spec *spec, const char *key) {
    for (int i = 0; i < MS_RES_MAX_KEYS && spec->keys[i].name != NULL; i++)
        if (strcmp(spec->keys[i].name, key) == 0)
            return i;
    return -1;
}

const ms_ast_expr *ms_resource_arg(const ms_resource *r, const char *key) {
    int k = spec_key(r->spec, key);
    MS_ASSERT(k >= 0);
    return r->args[k];
}

static const char *spec_keys_text(sema *s, const ms_res_spec *spec) {
    ms_strbuf b = {0};
    for (int i = 0; i < MS_RES_MAX_KEYS && spec->keys[i].name != NULL; i++)
        ms_strbuf_printf(&b, "%s%s", i > 0 ? ", " : "", spec->keys[i].name);
    return take(s, &b);
}

static const char *words_text(sema *s, const char *const *words) {
    ms_strbuf b = {0};
    for (int i = 0; words[i] != NULL; i++)
        ms_strbuf_printf(&b, "%s%s", i == 0 ? "" : words[i + 1] == NULL ? " or " : ", ", words[i]);
    return take(s, &b);
}

/* ---- config expressions ---- */

static bool numeric(ms_type t) { return t == MS_TYPE_INT || t == MS_TYPE_FLOAT || t == MS_TYPE_UNKNOWN; }

static ms_type cexpr(sema *s, ms_ast_expr *e, cx_mode mode);

static ms_type set_type(ms_ast_expr *e, ms_type t) {
    e->type = (int)t;
    return t;
}

/* Push the optional parameters a condition proves present: has(p), or a conjunction of
 * conditions with has(p) among them (has(w) && use_w). Returns the number pushed. */
static int push_guards(sema *s, const ms_ast_expr *c) {
    if (c->kind == MS_EXPR_BINARY && c->op == MS_OP_AND)
        return push_guards(s, c->lhs) + push_guards(s, c->rhs);
    if (c->kind == MS_EXPR_CALL && c->lhs->kind == MS_EXPR_NAME && strcmp(c->lhs->text, "has") == 0 &&
        c->args.n == 1) {
        const ms_ast_arg *a = c->args.items[0];
        const ms_param *p = a->value->kind == MS_EXPR_NAME ? find_param(s, a->value->text) : NULL;
        if (p != NULL && s->n_guards < 64) {
            s->guards[s->n_guards++] = p;
            return 1;
        }
    }
    return 0;
}

static int step_input(const sema *s, const char *name) {
    if (s->step == NULL)
        return -1;
    for (int i = 0; i < s->step->params.n; i++) {
        const ms_ast_ident *id = s->step->params.items[i];
        if (strcmp(id->name, name) == 0)
            return i;
    }
    return -1;
}

static ms_type cname(sema *s, ms_ast_expr *e, cx_mode mode) {
    ms_param *p = find_param(s, e->text);
    if (p != NULL) {
        e->sym = &p->sym;
        if (p->optional && !is_guarded(s, p))
            err(s, e->loc, "optional parameter '%s' may be absent here; guard it with has(%s) ? ... : ...",
                p->name, p->name);
        return p->type;
    }
    if (mode == CX_SPAN && step_input(s, e->text) >= 0) {
        err(s, e->loc, "step input '%s' is a token list; use len(%s) for its length", e->text, e->text);
        return MS_TYPE_UNKNOWN;
    }
    suggest g = {e->text, NULL, 0};
    for (int i = 0; i < s->m->n_params; i++)
        suggest_add(&g, s->m->params[i]->name);
    err(s, e->loc, "unknown config parameter '%s'%s", e->text, suggest_text(s, &g));
    return MS_TYPE_UNKNOWN;
}

static ms_type ccall(sema *s, ms_ast_expr *e, cx_mode mode) {
    if (e->lhs->kind != MS_EXPR_NAME) {
        err(s, e->loc, "only has(), len(), min() and max() can be called in a config expression");
        return MS_TYPE_UNKNOWN;
    }
    const char *fn = e->lhs->text;
    e->lhs->sym = s->builtin_sym;
    for (int i = 0; i < e->args.n; i++) {
        const ms_ast_arg *a = e->args.items[i];
        if (a->name != NULL) {
            err(s, a->name_loc, "%s() takes no named arguments", fn);
            return MS_TYPE_UNKNOWN;
        }
    }
    if (strcmp(fn, "has") == 0) {
        const ms_ast_arg *a = e->args.n == 1 ? e->args.items[0] : NULL;
        if (a == NULL || a->value->kind != MS_EXPR_NAME) {
            err(s, e->loc, "has() takes one config parameter name");
            return MS_TYPE_BOOL;
        }
        ms_param *p = find_param(s, a->value->text);
        if (p == NULL) {
            cname(s, a->value, mode); /* reports the unknown name */
            return MS_TYPE_BOOL;
        }
        a->value->sym = &p->sym;
        a->value->type = (int)p->type;
        if (!p->optional)
            err(s, a->value->loc, "has(%s) is always true: '%s' is not optional (declare it '%s: %s?')",
                p->name, p->name, p->name, ms_type_str(p->type));
        return MS_TYPE_BOOL;
    }
    if (strcmp(fn, "len") == 0) {
        const ms_ast_arg *a = e->args.n == 1 ? e->args.items[0] : NULL;
        if (mode != CX_SPAN) {
            err(s, e->loc, "len() is only allowed in segment spans");
            return MS_TYPE_INT;
        }
        if (a == NULL || a->value->kind != MS_EXPR_NAME || step_input(s, a->value->text) < 0) {
            err(s, e->loc, "len() takes one input of the step");
            return MS_TYPE_INT;
        }
        return MS_TYPE_INT;
    }
    if (strcmp(fn, "min") == 0 || strcmp(fn, "max") == 0) {
        if (e->args.n != 2) {
            err(s, e->loc, "%s() takes two arguments", fn);
            return MS_TYPE_UNKNOWN;
        }
        ms_type a = cexpr(s, ((ms_ast_arg *)e->args.items[0])->value, mode);
        ms_type b = cexpr(s, ((ms_ast_arg *)e->args.items[1])->value, mode);
        if (!numeric(a) || !numeric(b)) {
            err(s, e->loc, "%s() needs numbers", fn);
            return MS_TYPE_UNKNOWN;
        }
        return a == MS_TYPE_INT && b == MS_TYPE_INT ? MS_TYPE_INT : MS_TYPE_FLOAT;
    }
    err(s, e->lhs->loc, "unknown function '%s' in a config expression (has, len, min, max)", fn);
    return MS_TYPE_UNKNOWN;
}

/* Unify two branch types of a conditional; MS_TYPE_COUNT when incompatible. */
static ms_type unify(ms_type a, ms_type b) {
    if (a == MS_TYPE_UNKNOWN)
        return b;
    if (b == MS_TYPE_UNKNOWN || a == b)
        return a;
    if (numeric(a) && numeric(b))
        return MS_TYPE_FLOAT;
    return MS_TYPE_COUNT;
}

/*
 * Value of an int constant expression: int literals under unary '-' and '+ - * / %'. False when
 * e is not one, or when its value does not fit in int64 (or divides by zero): the caller reports
 * the overflow where both operands are constants that fit (so once, at the innermost operator).
 */
static bool const_int(const ms_ast_expr *e, int64_t *v) {
    int64_t a, b;
    switch (e->kind) {
    case MS_EXPR_INT: *v = e->ival; return true;
    case MS_EXPR_UNARY:
        return e->op == MS_OP_NEG && const_int(e->lhs, &a) && !__builtin_sub_overflow(0, a, v);
    case MS_EXPR_BINARY:
        if (!const_int(e->lhs, &a) || !const_int(e->rhs, &b))
            return false;
        switch (e->op) {
        case MS_OP_ADD: return !__builtin_add_overflow(a, b, v);
        case MS_OP_SUB: return !__builtin_sub_overflow(a, b, v);
        case MS_OP_MUL: return !__builtin_mul_overflow(a, b, v);
        case MS_OP_DIV:
        case MS_OP_MOD:
            if (b == 0 || (a == INT64_MIN && b == -1))
                return false;
            *v = e->op == MS_OP_DIV ? a / b : a % b;
            return true;
        default: return false;
        }
    default: return false;
    }
}

/* Report an int constant operator whose operands fit but whose result does not. */
static void check_const_overflow(sema *s, const ms_ast_expr *e) {
    int64_t a = 0, b = 0, v = 0;
    bool operands = e->kind == MS_EXPR_UNARY ? const_int(e->lhs, &a)
                                             : const_int(e->lhs, &a) && const_int(e->rhs, &b);
    if (!operands || const_int(e, &v))
        return;
    if (e->kind == MS_EXPR_BINARY && (e->op == MS_OP_DIV || e->op == MS_OP_MOD) && b == 0)
        return; /* "division by zero", reported already */
    err(s, e->loc, "integer overflow: this constant does not fit in 64 bits");
}

static void cexpr_want(sema *s, ms_ast_expr *e, ms_type want, const char *what);

static ms_type cexpr(sema *s, ms_ast_expr *e, cx_mode mode) {
    switch (e->kind) {
    case MS_EXPR_INT: return set_type(e, MS_TYPE_INT);
    case MS_EXPR_FLOAT: return set_type(e, MS_TYPE_FLOAT);
    case MS_EXPR_BOOL: return set_type(e, MS_TYPE_BOOL);
    case MS_EXPR_STRING: return set_type(e, MS_TYPE_STRING);
    case MS_EXPR_NONE:
        err(s, e->loc, "'none' is not a value here");
        return set_type(e, MS_TYPE_UNKNOWN);
    case MS_EXPR_NAME: return set_type(e, cname(s, e, mode));
    case MS_EXPR_CALL: return set_type(e, ccall(s, e, mode));
    case MS_EXPR_UNARY: {
        ms_type t = cexpr(s, e->lhs, mode);
        if (e->op == MS_OP_NOT) {
            if (t != MS_TYPE_BOOL && t != MS_TYPE_UNKNOWN)
                err(s, e->loc, "'!' needs a bool, got %s", ms_type_str(t));
            return set_type(e, MS_TYPE_BOOL);
        }
        if (!numeric(t)) {
            err(s, e->loc, "'-' needs a number, got %s", ms_type_str(t));
            return set_type(e, MS_TYPE_UNKNOWN);
        }
        if (t == MS_TYPE_INT)
            check_const_overflow(s, e);
        return set_type(e, t);
    }
    case MS_EXPR_BINARY: {
        if (e->op == MS_OP_ARROW || e->op == MS_OP_RANGE) {
            err(s, e->loc, "'%s' is not allowed in a config expression", ms_op_str(e->op));
            return set_type(e, MS_TYPE_UNKNOWN);
        }
        ms_type a = cexpr(s, e->lhs, mode);
        int saved = s->n_guards;
        if (e->op == MS_OP_AND)
            push_guards(s, e->lhs); /* has(w) && w > 4 */
        ms_type b = cexpr(s, e->rhs, mode);
        s->n_guards = saved;
        if (a == MS_TYPE_UNKNOWN || b == MS_TYPE_UNKNOWN)
            return set_type(e, e->op >= MS_OP_EQ ? MS_TYPE_BOOL : MS_TYPE_UNKNOWN);
        switch (e->op) {
        case MS_OP_AND:
        case MS_OP_OR:
            if (a != MS_TYPE_BOOL || b != MS_TYPE_BOOL)
                err(s, e->loc, "'%s' needs bools, got %s and %s", ms_op_str(e->op), ms_type_str(a),
                    ms_type_str(b));
            return set_type(e, MS_TYPE_BOOL);
        case MS_OP_EQ:
        case MS_OP_NE:
            if (a == MS_TYPE_LIST || b == MS_TYPE_LIST)
                err(s, e->loc, "int[] values cannot be compared");
            else if (unify(a, b) == MS_TYPE_COUNT)
                err(s, e->loc, "cannot compare %s with %s", ms_type_str(a), ms_type_str(b));
            return set_type(e, MS_TYPE_BOOL);
        case MS_OP_LT: case MS_OP_LE: case MS_OP_GT: case MS_OP_GE:
            if (!numeric(a) || !numeric(b))
                err(s, e->loc, "'%s' needs numbers, got %s and %s", ms_op_str(e->op), ms_type_str(a),
                    ms_type_str(b));
            return set_type(e, MS_TYPE_BOOL);
        default:
            if (!numeric(a) || !numeric(b)) {
                err(s, e->loc, "'%s' needs numbers, got %s and %s", ms_op_str(e->op), ms_type_str(a),
                    ms_type_str(b));
                return set_type(e, MS_TYPE_UNKNOWN);
            }
            if (e->op == MS_OP_MOD && (a != MS_TYPE_INT || b != MS_TYPE_INT))
                err(s, e->loc, "'%%' needs ints");
            if ((e->op == MS_OP_DIV || e->op == MS_OP_MOD) && e->rhs->kind == MS_EXPR_INT && e->rhs->ival == 0)
                err(s, e->rhs->loc, "division by zero");
            if (a == MS_TYPE_INT && b == MS_TYPE_INT)
                check_const_overflow(s, e);
            return set_type(e, a == MS_TYPE_INT && b == MS_TYPE_INT ? MS_TYPE_INT : MS_TYPE_FLOAT);
        }
    }
    case MS_EXPR_COND: {
        ms_type c = cexpr(s, e->cond, mode);
        if (c != MS_TYPE_BOOL && c != MS_TYPE_UNKNOWN)
            err(s, e->cond->loc, "condition must be a bool, got %s", ms_type_str(c));
        int saved = s->n_guards;
        push_guards(s, e->cond);
        ms_type a = cexpr(s, e->lhs, mode);
        s->n_guards = saved;
        ms_type b = cexpr(s, e->rhs, mode);
        ms_type u = unify(a, b);
        if (u == MS_TYPE_COUNT) {
            err(s, e->loc, "branches have different types: %s and %s", ms_type_str(a), ms_type_str(b));
            u = MS_TYPE_UNKNOWN;
        }
        return set_type(e, u);
    }
    case MS_EXPR_LIST:
        /* an int[] value: [16, 24, 24], elements int expressions */
        for (int i = 0; i < e->args.n; i++) {
            ms_ast_arg *a = e->args.items[i];
            if (a->name != NULL)
                err(s, a->name_loc, "a list takes no named elements");
            cexpr_want(s, a->value, MS_TYPE_INT, "a list element");
        }
        if (e->args.n > MS_MD_MAX_LIST)
            err(s, e->loc, "a list holds at most %d elements, this one %d", MS_MD_MAX_LIST, e->args.n);
        return set_type(e, MS_TYPE_LIST);
    case MS_EXPR_MEMBER:
    default:
        err(s, e->loc, "a config expression holds numbers, bools, strings, int lists and parameters only");
        return set_type(e, MS_TYPE_UNKNOWN);
    }
}

/* Check `e` as a config expression of type `want` (int accepted for float). */
static void cexpr_want(sema *s, ms_ast_expr *e, ms_type want, const char *what) {
    ms_type t = cexpr(s, e, CX_CONFIG);
    if (t == MS_TYPE_UNKNOWN || t == want || (want == MS_TYPE_FLOAT && t == MS_TYPE_INT))
        return;
    err(s, e->loc, "%s must be %s %s, got %s", what,
        want == MS_TYPE_INT || want == MS_TYPE_LIST ? "an" : "a", ms_type_str(want),
        ms_type_str(t));
}

/* ---- canonical dimensions ---- */

static void canon_into(sema *s, ms_strbuf *b, const ms_ast_expr *e, int depth);

#define MS_CANON_MAX_OPS 64        /* operands kept per flattened sum or product */
#define MS_CANON_MAX_MEMO 1024     /* a derived parameter's canonical text longer than this is
                                      replaced by an opaque "#name" (equal only to itself) */
#define CANON_UNKNOWN "\001"       /* starts the text of a parameter on a default cycle: no
                                      printed expression holds it (ASCII control character) */

/*
 * The canonical form of a derived parameter, computed once (config_memos, dependencies first) and
 * reused wherever the parameter appears, so a chain of n lets costs O(n), not O(n^2) or worse:
 *   - text: canon_into of its definition;
 *   - flat, op, ops, konst: when the definition is a sum (product), its flattened operand texts and
 *     folded constant, which a sum (product) using the parameter splices in;
 *   - is_const, value: the definition is an int constant (folded like a literal).
 */
typedef struct canon_memo {
    bool done;
    const char *text;
    bool flat;                     /* a sum or product: op, ops and konst are set */
    ms_op op;                      /* MS_OP_ADD or MS_OP_MUL */
    const char **ops;              /* [n_ops] */
    int n_ops;
    int64_t konst;
    bool is_const;
    int64_t value;
} canon_memo;

/* The memo of e when e names a derived parameter whose memo is ready, else NULL. */
static const canon_memo *memo_of(const sema *s, const ms_ast_expr *e) {
    if (s->memos == NULL || e->kind != MS_EXPR_NAME || e->sym == NULL || e->sym->kind != MS_SYM_PARAM ||
        !e->sym->param->derived || e->sym->param->dflt == NULL)
        return NULL;
    const canon_memo *m = &s->memos[e->sym->param->index];
    return m->done ? m : NULL;
}

static int64_t fold(ms_op op, int64_t k, int64_t x) {
    /* wrapping (defined) arithmetic: the text only has to be the same for equal inputs */
    return (int64_t)(op == MS_OP_ADD ? (uint64_t)k + (uint64_t)x : (uint64_t)k * (uint64_t)x);
}

static int cmp_str(const void *x, const void *y) {
    return strcmp(*(const char *const *)x, *(const char *const *)y);
}

/* Flatten a chain of the same commutative op into canonical operand texts, folding ints. */
static void canon_flat(sema *s, const ms_ast_expr *e, ms_op op, const char **out, int *n, int max,
                       int64_t *konst, int depth) {
    if (--s->canon_budget < 0) {
        if (*n < max)
            out[(*n)++] = "...";
        return;
    }
    if (e->kind == MS_EXPR_BINARY && e->op == op) {
        canon_flat(s, e->lhs, op, out, n, max, konst, depth + 1);
        canon_flat(s, e->rhs, op, out, n, max, konst, depth + 1);
        return;
    }
    const canon_memo *m = memo_of(s, e);
    if (m != NULL) {
        if (m->is_const) {
            *konst = fold(op, *konst, m->value);
        } else if (m->flat && m->op == op) {
            for (int i = 0; i < m->n_ops; i++)
                if (*n < max)
                    out[(*n)++] = m->ops[i];
            *konst = fold(op, *konst, m->konst);
        } else if (*n < max) {
            out[(*n)++] = m->text;
        }
        return;
    }
    if (e->kind == MS_EXPR_INT) {
        *konst = fold(op, *konst, e->ival);
        return;
    }
    ms_strbuf b = {0};
    canon_into(s, &b, e, depth + 1);
    const char *t = take(s, &b);
    if (*n < max)
        out[(*n)++] = t;
}

static void canon_into(sema *s, ms_strbuf *b, const ms_ast_expr *e, int depth) {
    if (depth > 64 || --s->canon_budget < 0) {
        ms_strbuf_puts(b, "...");
        return;
    }
    const canon_memo *m = memo_of(s, e);
    if (m != NULL) {
        ms_strbuf_puts(b, m->text);
        return;
    }
    if (e->kind == MS_EXPR_BINARY && (e->op == MS_OP_ADD || e->op == MS_OP_MUL)) {
        const char *ops[MS_CANON_MAX_OPS];
        int n = 0;
        int64_t k = e->op == MS_OP_ADD ? 0 : 1;
        canon_flat(s, e, e->op, ops, &n, MS_CANON_MAX_OPS, &k, depth);
        qsort(ops, (size_t)n, sizeof ops[0], cmp_str);
        bool first = true;
        if ((e->op == MS_OP_ADD && k != 0) || (e->op == MS_OP_MUL && k != 1) || n == 0) {
            ms_strbuf_printf(b, "%lld", (long long)k);
            first = false;
        }
        if (n > 0 || !first) {
            for (int i = 0; i < n; i++) {
                ms_strbuf_printf(b, "%s%s", first ? "(" : e->op == MS_OP_ADD ? "+" : "*", ops[i]);
                if (first)
                    first = false;
            }
        }
        if (n > 0)
            ms_strbuf_puts(b, ")");
        return;
    }
    if (e->kind == MS_EXPR_BINARY) {
        ms_strbuf_puts(b, "(");
        canon_into(s, b, e->lhs, depth + 1);
        ms_strbuf_puts(b, ms_op_str(e->op));
        canon_into(s, b, e->rhs, depth + 1);
        ms_strbuf_puts(b, ")");
        return;
    }
    ms_expr_print(b, e);
}

/*
 * Canonical text of a dimension. Derived parameters come from their memos (above), so a chain of
 * lets, even one that doubles at each step (`let a2 = a1 + a1; ...`), costs one splice per use;
 * a sum keeps at most MS_CANON_MAX_OPS operands. As a guard on huge expressions one text visits
 * at most MS_CANON_BUDGET nodes; past that it holds "..." and compares unequal to a full text (a
 * shape error naming both dimensions instead of a hang).
 */
#define MS_CANON_BUDGET 20000
static const char *canon(sema *s, const ms_ast_expr *e) {
    s->canon_budget = MS_CANON_BUDGET;
    ms_strbuf b = {0};
    canon_into(s, &b, e, 0);
    const char *t = take(s, &b);
    /* "(x)" for a single operand after folding: strip the parentheses */
    size_t n = strlen(t);
    if (n > 2 && t[0] == '(' && t[n - 1] == ')' && strpbrk(t + 1, "()+*-/%") == t + n - 1)
        t = ms_arena_strndup(s->a, t + 1, n - 2);
    return t;
}

static bool dims_eq(sema *s, const ms_ast_expr *a, const ms_ast_expr *b) {
    if (a == NULL || b == NULL)
        return true;
    const char *ca = canon(s, a), *cb = canon(s, b);
    /* a parameter on a default cycle (reported already) matches anything: no cascade */
    if (strstr(ca, CANON_UNKNOWN) != NULL || strstr(cb, CANON_UNKNOWN) != NULL)
        return true;
    return strcmp(ca, cb) == 0;
}

static const char *dim_text(sema *s, const ms_ast_expr *d) {
    return d == NULL ? "_" : ms_expr_str(s->a, d);
}

static const char *shape_text(sema *s, const fval *v) {
    ms_strbuf b = {0};
    ms_strbuf_puts(&b, "[");
    for (int i = 0; i < v->rank; i++)
        ms_strbuf_printf(&b, "%s%s", i > 0 ? ", " : "", dim_text(s, v->dims[i]));
    ms_strbuf_puts(&b, "]");
    return take(s, &b);
}

/* ---- 1. config ---- */

static bool type_from_name(const char *n, ms_type *t) {
    if (strcmp(n, "int") == 0)
        *t = MS_TYPE_INT;
    else if (strcmp(n, "float") == 0)
        *t = MS_TYPE_FLOAT;
    else if (strcmp(n, "bool") == 0)
        *t = MS_TYPE_BOOL;
    else if (strcmp(n, "string") == 0)
        *t = MS_TYPE_STRING;
    else if (strcmp(n, "int[]") == 0)
        *t = MS_TYPE_LIST;
    else
        return false;
    return true;
}

/* ---- config dependency graph: default cycles and memo order ---- */

/* The parameters e names (resolved), appended to *out (duplicates allowed). */
static void param_edges(sema *s, const ms_ast_expr *e, int **out, int *n, int *cap) {
    if (e == NULL)
        return;
    if (e->kind == MS_EXPR_NAME && e->sym != NULL && e->sym->kind == MS_SYM_PARAM) {
        if (*n == *cap) {
            int ncap = *cap < 8 ? 8 : *cap * 2;
            int *nb = NEWN(s, int, ncap);
            if (*n > 0)
                memcpy(nb, *out, sizeof *nb * (size_t)*n);
            *out = nb;
            *cap = ncap;
        }
        (*out)[(*n)++] = e->sym->param->index;
        return;
    }
    param_edges(s, e->lhs, out, n, cap);
    param_edges(s, e->rhs, out, n, cap);
    param_edges(s, e->cond, out, n, cap);
    for (int i = 0; i < e->args.n; i++)
        param_edges(s, ((const ms_ast_arg *)e->args.items[i])->value, out, n, cap);
}

/*
 * Strongly connected components of "p's default names q" (Tarjan, iterative: a chain of 100k
 * lets must not recurse 100k deep), linear in the size of the config. Sets on_cycle[p] when p
 * reaches itself (a component of two or more, or a self reference) and fills order[] with every
 * parameter, each after the parameters its default names (components in reverse topological
 * order), the order in which derived parameters' memos can be built.
 */
static void param_sccs(sema *s, bool *on_cycle, int *order) {
    int n = s->m->n_params;
    int **to = NEWN(s, int *, n);
    int *n_to = NEWN(s, int, n);
    for (int p = 0; p < n; p++) {
        int cap = 0;
        param_edges(s, s->m->params[p]->dflt, &to[p], &n_to[p], &cap);
    }
    int *index = NEWN(s, int, n), *low = NEWN(s, int, n), *edge = NEWN(s, int, n);
    int *stack = NEWN(s, int, n), *calls = NEWN(s, int, n);
    bool *on_stack = NEWN(s, bool, n);
    for (int p = 0; p < n; p++)
        index[p] = -1;
    int next = 0, n_stack = 0, n_order = 0;
    for (int root = 0; root < n; root++) {
        if (index[root] >= 0)
            continue;
        int n_calls = 0;
        calls[n_calls++] = root;
        index[root] = low[root] = next++;
        stack[n_stack++] = root;
        on_stack[root] = true;
        while (n_calls > 0) {
            int v = calls[n_calls - 1];
            if (edge[v] < n_to[v]) {
                int w = to[v][edge[v]++];
                if (w == v) {
                    on_cycle[v] = true;
                } else if (index[w] < 0) {
                    index[w] = low[w] = next++;
                    stack[n_stack++] = w;
                    on_stack[w] = true;
                    calls[n_calls++] = w;
                } else if (on_stack[w] && index[w] < low[v]) {
                    low[v] = index[w];
                }
                continue;
            }
            n_calls--;
            if (n_calls > 0 && low[v] < low[calls[n_calls - 1]])
                low[calls[n_calls - 1]] = low[v];
            if (low[v] != index[v])
                continue;
            int first = n_stack;
            do
                first--;
            while (stack[first] != v);
            for (int i = first; i < n_stack; i++) {
                on_stack[stack[i]] = false;
                on_cycle[stack[i]] = on_cycle[stack[i]] || n_stack - first > 1;
                order[n_order++] = stack[i];
            }
            n_stack = first;
        }
    }
}

/* Build the canonical memo of every derived parameter, dependencies first (order from
 * param_sccs); a parameter on a cycle gets the text CANON_UNKNOWN "name" (an unknown dimension). */
static void config_memos(sema *s, const bool *on_cycle, const int *order) {
    int n = s->m->n_params;
    canon_memo *memos = NEWN(s, canon_memo, n);
    s->memos = memos;
    for (int i = 0; i < n; i++) {
        const ms_param *p = s->m->params[order[i]];
        canon_memo *m = &memos[p->index];
        if (!p->derived || p->dflt == NULL)
            continue;
        const ms_ast_expr *d = p->dflt;
        const canon_memo *alias = on_cycle[p->index] ? NULL : memo_of(s, d);
        if (on_cycle[p->index]) {
            m->text = ms_arena_sprintf(s->a, "%s%s", CANON_UNKNOWN, p->name); /* dims_eq accepts it */
        } else if (alias != NULL) {
            *m = *alias;
        } else if (const_int(d, &m->value)) {
            m->is_const = true; /* `let ps: int = -16;` folds like the literal */
            m->text = ms_arena_sprintf(s->a, "%lld", (long long)m->value);
        } else {
            s->canon_budget = MS_CANON_BUDGET;
            ms_strbuf b = {0};
            canon_into(s, &b, d, 0);
            m->text = take(s, &b);
            if (strlen(m->text) > MS_CANON_MAX_MEMO)
                m->text = ms_arena_sprintf(s->a, "#%s", p->name);
            if (d->kind == MS_EXPR_BINARY && (d->op == MS_OP_ADD || d->op == MS_OP_MUL)) {
                const char *ops[MS_CANON_MAX_OPS];
                int64_t k = d->op == MS_OP_ADD ? 0 : 1;
                s->canon_budget = MS_CANON_BUDGET;
                canon_flat(s, d, d->op, ops, &m->n_ops, MS_CANON_MAX_OPS, &k, 0);
                m->flat = true;
                m->op = d->op;
                m->konst = k;
                m->ops = NEWN(s, const char *, m->n_ops);
                memcpy(m->ops, ops, sizeof *ops * (size_t)m->n_ops);
            }
        }
        m->done = true;
    }
}

static void check_config(sema *s) {
    const ms_ast_model *ast = s->m->ast;
    s->m->params = NEWN(s, ms_param *, ast->params.n);
    for (int i = 0; i < ast->params.n; i++) {
        const ms_ast_param *ap = ast->params.items[i];
        ms_param *prev = find_param(s, ap->name.name);
        if (prev != NULL) {
            err(s, ap->name.loc, "config parameter '%s' is declared twice (first at line %d)",
                ap->name.name, prev->ast->name.loc.first_line);
            continue;
        }
        ms_param *p = NEW(s, ms_param);
        p->name = ap->name.name;
        p->ast = ap;
        p->optional = ap->optional;
        p->derived = ap->derived;
        p->dflt = ap->dflt;
        p->index = s->m->n_params;
        p->sym.kind = MS_SYM_PARAM;
        p->sym.name = p->name;
        p->sym.param = p;
        if (!type_from_name(ap->type.name, &p->type)) {
            err(s, ap->type.loc, "unknown type '%s' (int, float, bool, string or int[])", ap->type.name);
            p->type = MS_TYPE_UNKNOWN;
        }
        if (ap->sources.n > 0) {
            p->n_sources = ap->sources.n;
            p->sources = NEWN(s, const char *, ap->sources.n);
            for (int k = 0; k < ap->sources.n; k++) {
                const ms_ast_expr *src = ap->sources.items[k];
                p->sources[k] = src->text;
                if (src->text[0] == '\0' || src->text[0] == '.' || src->text[strlen(src->text) - 1] == '.' ||
                    strstr(src->text, "..") != NULL)
                    err(s, src->loc, "config key \"%s\" is not a dotted path (like \"rope_scaling.factor\")",
                        src->text);
            }
        } else {
            p->n_sources = 1;
            p->sources = NEWN(s, const char *, 1);
            p->sources[0] = p->name;
        }
        if (p->derived && p->dflt == NULL)
            err(s, ap->loc, "derived parameter '%s' needs a definition: let %s: %s = <expression>;",
                p->name, p->name, ap->type.name);
        if (p->derived && p->optional)
            err(s, ap->name.loc, "derived parameter '%s' cannot be optional", p->name);
        if (p->derived && ap->sources.n > 0)
            err(s, ((ms_ast_expr *)ap->sources.items[0])->loc,
                "derived parameter '%s' is never read from config.json; drop 'from'", p->name);
        if (p->optional && !p->derived && p->dflt != NULL)
            err(s, ap->dflt->loc, "optional parameter '%s' has a default, so it is never absent; drop the '?'",
                p->name);
        s->m->params[s->m->n_params++] = p;
        ms_strmap_put(&s->params, p->name, p);
    }
    /* defaults: types and cycles (after every name is known) */
    for (int i = 0; i < s->m->n_params; i++) {
        ms_param *p = s->m->params[i];
        if (p->dflt == NULL || p->type == MS_TYPE_UNKNOWN)
            continue;
        cexpr_want(s, (ms_ast_expr *)p->dflt, p->type,
                   ms_arena_sprintf(s->a, "default of '%s'", p->name));
    }
    bool *on_cycle = NEWN(s, bool, s->m->n_params);
    int *order = NEWN(s, int, s->m->n_params);
    param_sccs(s, on_cycle, order);
    for (int i = 0; i < s->m->n_params; i++) {
        ms_param *p = s->m->params[i];
        if (p->dflt != NULL && on_cycle[i])
            err(s, p->ast->name.loc, "config parameter '%s' depends on itself through its default", p->name);
    }
    config_memos(s, on_cycle, order);
}

/* ---- 2. weights ---- */

/* Check a name template: {var} only inside a group, with the group's index variable. */
static void check_template(sema *s, const ms_ast_expr *str, const ms_group *g) {
    const char *t = str->text;
    bool uses_index = false;
    for (const char *p = t; *p != '\0'; p++) {
        if (*p == '}') {
            err(s, str->loc, "unmatched '}' in name template \"%s\"", t);
            return;
        }
        if (*p != '{')
            continue;
        const char *end = strchr(p, '}');
        if (end == NULL) {
            err(s, str->loc, "unclosed '{' in name template \"%s\"", t);
            return;
        }
        size_t n = (size_t)(end - p - 1);
        if (g == NULL) {
            err(s, str->loc, "name template \"%s\" uses {%.*s} outside a per-layer group", t, (int)n, p + 1);
            return;
        }
        if (strlen(g->index_var) != n || strncmp(p + 1, g->index_var, n) != 0) {
            err(s, str->loc, "name template \"%s\" uses {%.*s}, but the layer index is {%s}", t, (int)n,
                p + 1, g->index_var);
            return;
        }
        uses_index = true;
        p = end;
    }
    if (g != NULL && !uses_index)
        err(s, str->loc, "name template \"%s\" does not use the layer index {%s}: every layer would load the same tensor",
            t, g->index_var);
}

static ms_weight *make_tensor(sema *s, const ms_ast_weight *aw, ms_group *g) {
    ms_weight *w = NEW(s, ms_weight);
    w->name = aw->name.name;
    w->ast = aw;
    w->group = g;
    w->optional = aw->optional;
    w->tie_cond = aw->tie_cond;
    w->index = s->m->n_weights;
    w->sym.kind = MS_SYM_WEIGHT;
    w->sym.name = w->name;
    w->sym.weight = w;
    w->n_names = aw->names.n;
    w->names = NEWN(s, const char *, aw->names.n);
    for (int k = 0; k < aw->names.n; k++) {
        const ms_ast_expr *str = aw->names.items[k];
        w->names[k] = str->text;
        check_template(s, str, g);
    }
    w->rank = aw->shape.n;
    w->shape = NEWN(s, const ms_ast_expr *, aw->shape.n);
    if (aw->shape.n > MAX_RANK)
        err(s, aw->name.loc, "weight '%s' has %d dimensions (at most %d)", w->name, aw->shape.n, MAX_RANK);
    for (int k = 0; k < aw->shape.n; k++) {
        ms_ast_expr *d = aw->shape.items[k];
        w->shape[k] = d;
        cexpr_want(s, d, MS_TYPE_INT, "a weight dimension");
        if (d->kind == MS_EXPR_INT && d->ival <= 0)
            err(s, d->loc, "weight dimension must be positive, got %lld", (long long)d->ival);
    }
    return w;
}

/* `ignore "p", ...;`: checkpoint tensors that are present but unused (a vision tower). */
static void add_ignores(sema *s, const ms_ast_weight *aw) {
    int cap = s->m->n_ignores + aw->names.n;
    const char **next = NEWN(s, const char *, cap);
    const ms_ast_expr **locs = NEWN(s, const ms_ast_expr *, cap);
    for (int i = 0; i < s->m->n_ignores; i++) {
        next[i] = s->m->ignores[i];
        locs[i] = s->m->ignore_exprs[i];
    }
    s->m->ignores = next;
    s->m->ignore_exprs = locs;
    for (int k = 0; k < aw->names.n; k++) {
        const ms_ast_expr *str = aw->names.items[k];
        const char *t = str->text;
        if (t[0] == '\0' || strcmp(t, "*") == 0) {
            err(s, str->loc, "ignore pattern \"%s\" would hide every tensor of the checkpoint; name a "
                "prefix like \"visual.*\"", t);
            continue;
        }
        if (strchr(t, '{') != NULL || strchr(t, '}') != NULL) {
            err(s, str->loc, "ignore pattern \"%s\" has '{' or '}': patterns take '*' (any run of "
                "characters), not name templates", t);
            continue;
        }
        bool dup = false;
        for (int i = 0; i < s->m->n_ignores && !dup; i++)
            if (strcmp(s->m->ignores[i], t) == 0) {
                err(s, str->loc, "ignore pattern \"%s\" is given twice (first at line %d)", t,
                    s->m->ignore_exprs[i]->loc.first_line);
                dup = true;
            }
        if (dup)
            continue;
        s->m->ignore_exprs[s->m->n_ignores] = str;
        s->m->ignores[s->m->n_ignores++] = t;
    }
}

/* An ignore pattern must not match a tensor the model loads: the checkpoint would then be
 * checked less than the model claims. Templates are matched with {i} as layer 0. */
static void check_ignores(sema *s) {
    if (s->m->n_ignores == 0)
        return;
    for (int i = 0; i < s->m->n_weights; i++) {
        const ms_weight *w = s->m->weights[i];
        for (int k = 0; k < w->n_names; k++) {
            char name[1024]; /* checkpoint names are far shorter; a longer one is cut */
            size_t at = 0;
            for (const char *p = w->names[k]; *p != '\0' && at + 1 < sizeof name; p++) {
                const char *end = *p == '{' ? strchr(p, '}') : NULL;
                name[at++] = end != NULL ? '0' : *p;
                if (end != NULL)
                    p = end;
            }
            name[at] = '\0';
            for (int q = 0; q < s->m->n_ignores; q++)
                if (ms_glob_match(s->m->ignores[q], name))
                    err(s, s->m->ignore_exprs[q]->loc,
                        "ignore pattern \"%s\" matches \"%s\" of weight '%s%s%s', which the model "
                        "loads", s->m->ignores[q], w->names[k], w->group != NULL ? w->group->name : "",
                        w->group != NULL ? "." : "", w->name);
        }
    }
}

static void check_weights(sema *s) {
    const ms_ast_model *ast = s->m->ast;
    int total = 0;
    for (int i = 0; i < ast->weights.n; i++) {
        const ms_ast_weight *aw = ast->weights.items[i];
        total += aw->kind == MS_AST_WEIGHT_GROUP ? aw->members.n : 1;
    }
    s->m->weights = NEWN(s, ms_weight *, total);
    s->m->groups = NEWN(s, ms_group *, ast->weights.n);
    for (int i = 0; i < ast->weights.n; i++) {
        const ms_ast_weight *aw = ast->weights.items[i];
        if (aw->kind == MS_AST_WEIGHT_IGNORE) {
            add_ignores(s, aw);
            continue;
        }
        const char *name = aw->name.name;
        const ms_weight *pw = find_top_weight(s, name);
        const ms_group *pg = find_group(s, name);
        if (pw != NULL || pg != NULL) {
            err(s, aw->name.loc, "weight '%s' is declared twice (first at line %d)", name,
                pw != NULL ? pw->ast->name.loc.first_line : pg->ast->name.loc.first_line);
            continue;
        }
        if (aw->kind == MS_AST_WEIGHT_TENSOR) {
            ms_weight *w = make_tensor(s, aw, NULL);
            s->m->weights[s->m->n_weights++] = w;
            ms_strmap_put(&s->weights, w->name, w);
            continue;
        }
        ms_group *g = NEW(s, ms_group);
        g->name = name;
        g->ast = aw;
        g->index_var = aw->index.name;
        g->count = aw->count;
        g->sym.kind = MS_SYM_GROUP;
        g->sym.name = name;
        g->sym.group = g;
        cexpr_want(s, aw->count, MS_TYPE_INT, "the layer count");
        g->members = NEWN(s, ms_weight *, aw->members.n);
        s->m->groups[s->m->n_groups++] = g;
        ms_strmap_put(&s->groups, g->name, g);
        for (int k = 0; k < aw->members.n; k++) {
            const ms_ast_weight *am = aw->members.items[k];
            if (am->kind == MS_AST_WEIGHT_IGNORE) {
                err(s, am->loc, "'ignore' belongs in the weights block, not in group '%s' (patterns "
                    "match whole checkpoint names)", name);
                continue;
            }
            if (am->kind == MS_AST_WEIGHT_GROUP) {
                err(s, am->name.loc, "weight groups cannot be nested ('%s' inside '%s')", am->name.name, name);
                continue;
            }
            const ms_weight *dup = find_member(s, g, am->name.name);
            if (dup != NULL) {
                err(s, am->name.loc, "weight '%s.%s' is declared twice (first at line %d)", name,
                    am->name.name, dup->ast->name.loc.first_line);
                continue;
            }
            ms_weight *w = make_tensor(s, am, g);
            g->members[g->n_members++] = w;
            s->m->weights[s->m->n_weights++] = w;
            ms_strmap_put(&s->members, member_key(s, g, w->name), w);
        }
    }
    /* duplicate checkpoint names (against the earlier weights' names), ties */
    ms_strmap names;
    ms_strmap_init(&names, s->a);
    for (int i = 0; i < s->m->n_weights; i++) {
        ms_weight *w = s->m->weights[i];
        for (int k = 0; k < w->n_names; k++) {
            const ms_weight *o = ms_strmap_get(&names, w->names[k]);
            if (o != NULL && o != w)
                err(s, ((ms_ast_expr *)w->ast->names.items[k])->loc,
                    "checkpoint name \"%s\" is already used by weight '%s' (line %d)", w->names[k],
                    o->name, o->ast->name.loc.first_line);
        }
        for (int k = 0; k < w->n_names; k++)
            if (ms_strmap_get(&names, w->names[k]) == NULL)
                ms_strmap_put(&names, w->names[k], w);
        if (w->ast->tie.name == NULL)
            continue;
        const ms_ast_ident *tie = &w->ast->tie;
        const ms_weight *t = w->group != NULL ? find_member(s, w->group, tie->name) : NULL;
        if (t == NULL)
            t = find_top_weight(s, tie->name);
        if (t == NULL) {
            suggest g = {tie->name, NULL, 0};
            for (int j = 0; j < s->m->n_weights; j++)
                if (s->m->weights[j]->group == NULL || s->m->weights[j]->group == w->group)
                    suggest_add(&g, s->m->weights[j]->name);
            err(s, tie->loc, "weight '%s' is tied to unknown weight '%s'%s", w->name, tie->name,
                suggest_text(s, &g));
            continue;
        }
        if (t == w) {
            err(s, tie->loc, "weight '%s' is tied to itself", w->name);
            continue;
        }
        if (t->ast->tie.name != NULL) {
            err(s, tie->loc, "weight '%s' is tied to '%s', which is itself tied; tie to the source", w->name,
                t->name);
            continue;
        }
        w->tie = t;
        bool same = t->rank == w->rank;
        for (int k = 0; same && k < w->rank; k++)
            same = dims_eq(s, w->shape[k], t->shape[k]);
        if (!same) {
            fval a = {.t = MS_TYPE_TENSOR, .rank = w->rank, .dims = w->shape};
            fval b = {.t = MS_TYPE_TENSOR, .rank = t->rank, .dims = t->shape};
            err(s, tie->loc, "weight '%s' %s is tied to '%s' with a different shape %s", w->name,
                shape_text(s, &a), t->name, shape_text(s, &b));
        }
        if (w->tie_cond != NULL)
            cexpr_want(s, (ms_ast_expr *)w->tie_cond, MS_TYPE_BOOL, "a tie condition");
    }
    check_ignores(s);
}

/* ---- 3a. resources ---- */

static ms_ast_sym *word_sym(sema *s, const char *name) {
    ms_ast_sym *y = NEW(s, ms_ast_sym);
    y->kind = MS_SYM_WORD;
    y->name = name;
    return y;
}

static void check_named_ctor(sema *s, ms_ast_expr *e, const char *ctor, const char *const *keys,
                             const ms_type *types, int n_keys, int n_required) {
    bool seen[8] = {false};
    for (int i = 0; i < e->args.n; i++) {
        ms_ast_arg *a = e->args.items[i];
        if (a->name == NULL) {
            err(s, a->value->loc, "%s() takes named arguments only", ctor);
            continue;
        }
        int k = -1;
        for (int j = 0; j < n_keys; j++)
            if (strcmp(keys[j], a->name) == 0)
                k = j;
        if (k < 0) {
            ms_strbuf b = {0};
            for (int j = 0; j < n_keys; j++)
                ms_strbuf_printf(&b, "%s%s", j > 0 ? ", " : "", keys[j]);
            err(s, a->name_loc, "unknown key '%s' for %s() (expected %s)", a->name, ctor,
                b.data != NULL ? b.data : "");
            ms_strbuf_free(&b);
            continue;
        }
        if (seen[k])
            err(s, a->name_loc, "key '%s' is given twice", a->name);
        seen[k] = true;
        cexpr_want(s, a->value, types[k], ms_arena_sprintf(s->a, "%s() key '%s'", ctor, a->name));
    }
    for (int j = 0; j < n_required; j++)
        if (!seen[j])
            err(s, e->loc, "%s() needs '%s'", ctor, keys[j]);
}

static void check_arg(sema *s, const ms_res_spec *spec, const ms_res_key *key, ms_ast_expr *e) {
    if (e->kind == MS_EXPR_COND) {
        ms_type c = cexpr(s, e->cond, CX_CONFIG);
        if (c != MS_TYPE_BOOL && c != MS_TYPE_UNKNOWN)
            err(s, e->cond->loc, "condition must be a bool, got %s", ms_type_str(c));
        int saved = s->n_guards;
        push_guards(s, e->cond);
        check_arg(s, spec, key, e->lhs);
        s->n_guards = saved;
        check_arg(s, spec, key, e->rhs);
        return;
    }
    bool nullable = key->type == MS_ARG_WINDOW || key->type == MS_ARG_SCALING ||
                    key->type == MS_ARG_INT_LIST || key->type == MS_ARG_INT_OR_NONE;
    if (e->kind == MS_EXPR_NONE) {
        e->type = MS_TYPE_NONE;
        if (!nullable)
            err(s, e->loc, "'%s' of %s cannot be none", key->name, spec->ctor);
        return;
    }
    const char *what = ms_arena_sprintf(s->a, "'%s' of %s", key->name, spec->ctor);
    switch (key->type) {
    case MS_ARG_INT:
    case MS_ARG_INT_OR_NONE:
        cexpr_want(s, e, MS_TYPE_INT, what);
        break;
    case MS_ARG_FLOAT:
        cexpr_want(s, e, MS_TYPE_FLOAT, what);
        break;
    case MS_ARG_BOOL:
        cexpr_want(s, e, MS_TYPE_BOOL, what);
        break;
    case MS_ARG_ENUM: {
        bool ok = false;
        if (e->kind == MS_EXPR_NAME)
            for (int i = 0; key->words[i] != NULL; i++)
                ok = ok || strcmp(key->words[i], e->text) == 0;
        if (!ok) {
            err(s, e->loc, "%s must be %s", what, words_text(s, key->words));
        } else {
            e->sym = word_sym(s, e->text);
            e->type = MS_TYPE_WORD;
        }
        break;
    }
    case MS_ARG_WINDOW:
        if (e->kind != MS_EXPR_CALL || e->lhs->kind != MS_EXPR_NAME || strcmp(e->lhs->text, "window") != 0 ||
            e->args.n != 1 || ((ms_ast_arg *)e->args.items[0])->name != NULL) {
            err(s, e->loc, "%s must be window(<tokens>) or none", what);
            break;
        }
        e->lhs->sym = word_sym(s, "window");
        e->type = MS_TYPE_WINDOW;
        cexpr_want(s, ((ms_ast_arg *)e->args.items[0])->value, MS_TYPE_INT, "a window size");
        break;
    case MS_ARG_SCALING: {
        if (e->kind != MS_EXPR_CALL || e->lhs->kind != MS_EXPR_NAME) {
            err(s, e->loc, "%s must be llama3(...), linear(factor = ...) or none", what);
            break;
        }
        static const char *const l3[] = {"factor", "low_freq_factor", "high_freq_factor",
                                         "original_max_positions"};
        static const ms_type l3t[] = {MS_TYPE_FLOAT, MS_TYPE_FLOAT, MS_TYPE_FLOAT, MS_TYPE_INT};
        static const char *const lin[] = {"factor"};
        static const ms_type lint[] = {MS_TYPE_FLOAT};
        if (strcmp(e->lhs->text, "llama3") == 0) {
            check_named_ctor(s, e, "llama3", l3, l3t, 4, 4);
        } else if (strcmp(e->lhs->text, "linear") == 0) {
            check_named_ctor(s, e, "linear", lin, lint, 1, 1);
        } else {
            err(s, e->lhs->loc, "unknown RoPE scaling '%s' (llama3 or linear)", e->lhs->text);
            break;
        }
        e->lhs->sym = word_sym(s, e->lhs->text);
        e->type = MS_TYPE_SCALING;
        break;
    }
    case MS_ARG_INT_LIST:
        if (e->kind == MS_EXPR_NAME && find_param(s, e->text) != NULL) {
            /* an int[] config parameter (mrope_section: int[] from "rope_parameters....") */
            cexpr_want(s, e, MS_TYPE_LIST, what);
            break;
        }
        if (e->kind != MS_EXPR_LIST || e->args.n == 0) {
            err(s, e->loc, "%s must be a list of ints like [16, 24, 24] or an int[] parameter", what);
            break;
        }
        if (strcmp(key->name, "sections") == 0 && e->args.n > MS_ROPE_MAX_SECTIONS)
            err(s, e->loc, "%s has %d sections, at most %d", what, e->args.n, MS_ROPE_MAX_SECTIONS);
        e->type = MS_TYPE_LIST;
        for (int i = 0; i < e->args.n; i++) {
            ms_ast_arg *a = e->args.items[i];
            cexpr_want(s, a->value, MS_TYPE_INT, "a list element");
            if (a->value->kind == MS_EXPR_INT && a->value->ival <= 0)
                err(s, a->value->loc, "list element must be positive");
        }
        break;
    case MS_ARG_WEIGHT: {
        ms_weight *w = e->kind == MS_EXPR_NAME ? find_top_weight(s, e->text) : NULL;
        if (w == NULL) {
            err(s, e->loc, "%s must name a top-level weight", what);
            break;
        }
        w->used = true;
        e->sym = &w->sym;
        e->type = MS_TYPE_TENSOR;
        break;
    }
    case MS_ARG_LABEL: {
        const ms_label_decl *l = e->kind == MS_EXPR_NAME ? find_label(s->node, e->text) : NULL;
        if (l == NULL) {
            err(s, e->loc, "%s must name a label of node '%s' (declare it with 'labels %s;')", what,
                s->node->name, e->kind == MS_EXPR_NAME ? e->text : "<name>");
            break;
        }
        e->sym = &l->sym;
        e->type = MS_TYPE_WORD;
        break;
    }
    default:
        break;
    }
}

/* Cycle text "a -> b -> a" starting at r (r is on a cycle). */
static bool dep_path(const ms_resource *cur, const ms_resource *target, const ms_resource **path, int *n,
                     int depth) {
    if (depth > MS_MAX_RESOURCES + 1)
        return false;
    for (int i = 0; i < cur->n_deps; i++) {
        path[(*n)++] = cur->deps[i];
        if (cur->deps[i] == target || dep_path(cur->deps[i], target, path, n, depth + 1))
            return true;
        (*n)--;
    }
    return false;
}

/* ---- 3a'. resource argument values known at check time ---- */

/* The value of an int expression known without config.json: constant arithmetic, or a derived
 * parameter defined as an int constant (through any chain of lets). */
static bool known_int(const sema *s, const ms_ast_expr *e, int64_t *v) {
    if (const_int(e, v))
        return true;
    const canon_memo *m = memo_of(s, e);
    if (m != NULL && m->is_const) {
        *v = m->value;
        return true;
    }
    return false;
}

/* The branches of an argument that are values (a conditional's both sides, window(W)'s W; a none
 * leaf is skipped), [*n] of at most cap. */
static void value_leaves(const ms_ast_expr *e, const ms_ast_expr **out, int *n, int cap) {
    if (e == NULL || e->kind == MS_EXPR_NONE)
        return;
    if (e->kind == MS_EXPR_COND) {
        value_leaves(e->lhs, out, n, cap);
        value_leaves(e->rhs, out, n, cap);
        return;
    }
    if (e->kind == MS_EXPR_CALL && e->lhs->kind == MS_EXPR_NAME && strcmp(e->lhs->text, "window") == 0 &&
        e->args.n == 1) {
        value_leaves(((const ms_ast_arg *)e->args.items[0])->value, out, n, cap);
        return;
    }
    if (*n < cap)
        out[(*n)++] = e;
}

/* Keys whose every value must be a positive int. A zero page size divided the runtime by zero;
 * rotary_dim = 0 was read as "the whole head" and window = 0 as "no window". */
static const struct {
    const char *ctor, *key, *what, *hint;
} POSITIVE_KEYS[] = {
    {"kv_pool", "layers", "'layers'", ""},
    {"kv_pool", "kv_heads", "'kv_heads'", ""},
    {"kv_pool", "head_dim", "'head_dim'", ""},
    {"kv_pool", "page_size", "'page_size'", ""},
    {"kv_pool", "retention", "the 'retention' window", " (none: keep every token)"},
    {"rope", "head_dim", "'head_dim'", ""},
    {"rope", "rotary_dim", "'rotary_dim'", ""},
    {"attention", "q_heads", "'q_heads'", ""},
    {"attention", "window", "'window'", " (none: no window)"},
    {"cross", "q_heads", "'q_heads'", ""},
    {"scratch", "rows", "'rows'", ""},
    {"sampler", "vocab", "'vocab'", ""},
};

/*
 * Refuse resource argument values that are wrong whatever config.json says: a non-positive size
 * (page_size, head counts, window, ...), and a rope rotary_dim that is odd or larger than the
 * head (pairs of dimensions are rotated, within one head). Values that depend on config.json are
 * checked when the compiled model loads (codegen.c, emit_config_load).
 */
static void check_values(sema *s, const ms_resource *r) {
    for (size_t i = 0; i < MS_ARRAY_LEN(POSITIVE_KEYS); i++) {
        if (strcmp(POSITIVE_KEYS[i].ctor, r->spec->ctor) != 0)
            continue;
        const ms_ast_expr *leaves[16];
        int n = 0;
        value_leaves(r->args[spec_key(r->spec, POSITIVE_KEYS[i].key)], leaves, &n, 16);
        for (int k = 0; k < n; k++) {
            int64_t v;
            if (known_int(s, leaves[k], &v) && v <= 0)
                err(s, leaves[k]->loc, "%s of %s must be positive, got %lld%s", POSITIVE_KEYS[i].what,
                    r->spec->ctor, (long long)v, POSITIVE_KEYS[i].hint);
        }
    }
    if (strcmp(r->spec->ctor, "rope") != 0)
        return;
    const ms_ast_expr *rd[16], *hd[16];
    int n_rd = 0, n_hd = 0;
    value_leaves(r->args[spec_key(r->spec, "rotary_dim")], rd, &n_rd, 16);
    const ms_ast_expr *head = r->args[spec_key(r->spec, "head_dim")];
    if (head == NULL && r->kv != NULL)
        head = r->kv->args[spec_key(r->kv->spec, "head_dim")];
    value_leaves(head, hd, &n_hd, 16);
    bool head_known = n_hd > 0; /* every branch of head_dim is a known int: the largest is head_max */
    int64_t head_max = 0, h;
    for (int k = 0; k < n_hd; k++) {
        if (!known_int(s, hd[k], &h))
            head_known = false;
        else if (h > head_max)
            head_max = h;
    }
    for (int k = 0; k < n_rd; k++) {
        int64_t v;
        if (!known_int(s, rd[k], &v) || v <= 0)
            continue;
        if (v % 2 != 0)
            err(s, rd[k]->loc, "'rotary_dim' of rope must be even (dimensions rotate in pairs), got %lld",
                (long long)v);
        else if (head_known && v > head_max)
            err(s, rd[k]->loc, "'rotary_dim' of rope is %lld, more than its head_dim %lld", (long long)v,
                (long long)head_max);
    }
}

/* True for an argument written as `true` (a literal). */
static bool arg_is_true(const ms_ast_expr *e) { return e != NULL && e->kind == MS_EXPR_BOOL && e->bval; }

/*
 * Dense forms: in a node without a kv_pool, `attention(q_heads = H, head_dim = D)` attends over
 * the step's own K/V rows, bidirectionally within each segment (nothing is stored, so there is no
 * causal order to keep and no window to release), and `positions(table = W)` numbers each
 * segment's rows from 0. In a node with a kv_pool both must name it, and the paged attention
 * takes its head_dim and kv_heads from the pool.
 */
static void check_dense(sema *s, const ms_node *node, ms_resource **list, int count) {
    const ms_resource *pool = NULL;
    for (int i = 0; i < count; i++)
        if (list[i]->kind == MS_RESOURCE_KV && pool == NULL)
            pool = list[i];
    for (int i = 0; i < count; i++) {
        ms_resource *r = list[i];
        const bool attn = r->kind == MS_RESOURCE_ATTN, pos = strcmp(r->spec->ctor, "positions") == 0;
        if (!attn && !pos)
            continue;
        const ms_ast_expr *c = r->ast->ctor;
        if (r->kv == NULL && pool != NULL) {
            err(s, c->loc, "%s '%s' needs a kv_pool to work on: %s(%s, ...) (only in a node without a "
                "kv_pool does it work on the step's own rows)", r->spec->ctor, r->name, r->spec->ctor,
                pool->name);
            continue;
        }
        if (attn && r->kv != NULL) {
            static const char *const from_pool[] = {"head_dim", "kv_heads"};
            for (size_t k = 0; k < MS_ARRAY_LEN(from_pool); k++) {
                const ms_ast_expr *a = r->args[spec_key(r->spec, from_pool[k])];
                if (a != NULL)
                    err(s, a->loc, "attention '%s' reads %s from kv_pool '%s'; '%s' is for a dense "
                        "attention (a node without a kv_pool)", r->name, from_pool[k], r->kv->name,
                        from_pool[k]);
            }
            continue;
        }
        if (r->kv != NULL)
            continue;
        if (pos) {
            const ms_ast_expr *sc = r->args[spec_key(r->spec, "scheme")];
            if (sc != NULL && !(sc->kind == MS_EXPR_NAME && strcmp(sc->text, "sequential") == 0))
                err(s, sc->loc, "positions '%s' without a kv_pool numbers each segment's rows from 0: "
                    "only scheme = sequential", r->name);
            continue;
        }
        if (r->args[spec_key(r->spec, "head_dim")] == NULL)
            err(s, c->loc, "dense attention '%s' (no kv_pool) needs 'head_dim'", r->name);
        const ms_ast_expr *ca = r->args[spec_key(r->spec, "causal")];
        if (arg_is_true(ca))
            err(s, ca->loc, "dense attention '%s' sees every row of its segment (nothing is stored, so "
                "there is no causal order): causal attention needs a kv_pool", r->name);
        const ms_ast_expr *wa = r->args[spec_key(r->spec, "window")];
        if (wa != NULL && wa->kind != MS_EXPR_NONE)
            err(s, wa->loc, "dense attention '%s' takes no window (a window masks a stream's history; "
                "a dense segment has none)", r->name);
    }
    (void)node;
}

static void check_resources(sema *s, ms_node *node, const ms_ast_node *an) {
    int n = an->resources.n;
    ms_resource **list = NEWN(s, ms_resource *, n);
    int count = 0;
    node->resources = list;
    ms_strmap_init(&s->resources, s->a);
    for (int i = 0; i < n; i++) {
        const ms_ast_resource *ar = an->resources.items[i];
        node->n_resources = count;
        const ms_resource *prev = find_resource(s, ar->name.name);
        if (prev != NULL) {
            err(s, ar->name.loc, "resource '%s' is declared twice in node '%s' (first at line %d)",
                ar->name.name, node->name, prev->ast->name.loc.first_line);
            continue;
        }
        ms_ast_expr *c = ar->ctor;
        if (c->kind != MS_EXPR_CALL || c->lhs->kind != MS_EXPR_NAME) {
            err(s, c->loc, "a resource is made by a constructor call like kv_pool(...)");
            continue;
        }
        const ms_res_spec *spec = ms_res_spec_find(c->lhs->text);
        if (spec == NULL) {
            int ns;
            const ms_res_spec *all = ms_res_specs(&ns);
            suggest g = {c->lhs->text, NULL, 0};
            for (int k = 0; k < ns; k++)
                suggest_add(&g, all[k].ctor);
            err(s, c->lhs->loc,
                "unknown resource kind '%s'%s (kv_pool, rope, positions, attention, cross, scratch, sampler)",
                c->lhs->text, suggest_text(s, &g));
            continue;
        }
        ms_resource *r = NEW(s, ms_resource);
        r->name = ar->name.name;
        r->spec = spec;
        r->kind = spec->kind;
        r->ast = ar;
        r->sym.kind = MS_SYM_RESOURCE;
        r->sym.name = r->name;
        r->sym.resource = r;
        c->lhs->sym = word_sym(s, spec->ctor);
        list[count++] = r;
        ms_strmap_put(&s->resources, r->name, r);
    }
    node->n_resources = count;
    if (count > MS_MAX_RESOURCES)
        err(s, an->loc, "node '%s' has %d resources (at most %d)", node->name, count, MS_MAX_RESOURCES);
    /* arguments and dependencies (every resource name is known now) */
    for (int i = 0; i < count; i++) {
        ms_resource *r = list[i];
        ms_ast_expr *c = r->ast->ctor;
        r->deps = NEWN(s, const ms_resource *, c->args.n);
        for (int k = 0; k < c->args.n; k++) {
            ms_ast_arg *a = c->args.items[k];
            if (a->name == NULL) {
                const ms_resource *d = a->value->kind == MS_EXPR_NAME ? find_resource(s, a->value->text) : NULL;
                if (d == NULL) {
                    if (a->value->kind != MS_EXPR_NAME) {
                        err(s, a->value->loc, "positional arguments of %s() are resources it depends on; "
                                              "write other values as key = value", r->spec->ctor);
                    } else {
                        suggest g = {a->value->text, NULL, 0};
                        for (int j = 0; j < count; j++)
                            suggest_add(&g, list[j]->name);
                        err(s, a->value->loc, "resource '%s' depends on unknown resource '%s'%s", r->name,
                            a->value->text, suggest_text(s, &g));
                    }
                    continue;
                }
                if (d == r) {
                    err(s, a->value->loc, "resource '%s' depends on itself", r->name);
                    continue;
                }
                a->value->sym = &d->sym;
                a->value->type = MS_TYPE_RESOURCE;
                bool dup = false;
                for (int j = 0; j < r->n_deps; j++)
                    dup = dup || r->deps[j] == d;
                if (dup) {
                    err(s, a->value->loc, "resource '%s' lists dependency '%s' twice", r->name, d->name);
                    continue;
                }
                r->deps[r->n_deps++] = d;
                /* a rope over a scratch KV: positions are the slots of the frame */
                if (d->kind == MS_RESOURCE_SCRATCH && r->kind == MS_RESOURCE_POS &&
                    r->kv == NULL && r->scratch == NULL) {
                    r->scratch = d;
                    continue;
                }
                if (d->kind == MS_RESOURCE_KV) {
                    if (r->kv != NULL)
                        err(s, a->value->loc, "%s '%s' depends on two kv_pools ('%s' and '%s')", r->spec->ctor,
                            r->name, r->kv->name, d->name);
                    else
                        r->kv = d;
                }
                continue;
            }
            int key = spec_key(r->spec, a->name);
            if (key < 0) {
                suggest g = {a->name, NULL, 0};
                for (int j = 0; j < MS_RES_MAX_KEYS && r->spec->keys[j].name != NULL; j++)
                    suggest_add(&g, r->spec->keys[j].name);
                err(s, a->name_loc, "unknown key '%s' for %s%s (expected one of: %s)", a->name, r->spec->ctor,
                    suggest_text(s, &g), spec_keys_text(s, r->spec));
                continue;
            }
            if (r->args[key] != NULL) {
                err(s, a->name_loc, "key '%s' is given twice", a->name);
                continue;
            }
            r->args[key] = a->value;
            check_arg(s, r->spec, &r->spec->keys[key], a->value);
        }
        for (int k = 0; k < MS_RES_MAX_KEYS && r->spec->keys[k].name != NULL; k++)
            if (r->spec->keys[k].required && r->args[k] == NULL)
                err(s, c->loc, "%s '%s' needs '%s'", r->spec->ctor, r->name, r->spec->keys[k].name);
        if (r->spec->needs_kv && r->kv == NULL && r->scratch == NULL)
            err(s, c->loc, "%s '%s' needs a kv_pool to work on: %s(<kv_pool>, ...)", r->spec->ctor, r->name,
                r->spec->ctor);
        if (r->spec->kind == MS_RESOURCE_KV && r->n_deps > 0)
            err(s, c->loc, "kv_pool '%s' takes no resource arguments", r->name);
    }
    check_dense(s, node, list, count);
    for (int i = 0; i < count; i++)
        check_values(s, list[i]);
    /* windowed retention releases old pages: every attention over that pool must mask to a window */
    for (int i = 0; i < count; i++) {
        const ms_resource *r = list[i];
        if (r->kind != MS_RESOURCE_ATTN || r->kv == NULL)
            continue;
        const ms_ast_expr *ret = r->kv->args[spec_key(r->kv->spec, "retention")];
        const ms_ast_expr *win = r->args[spec_key(r->spec, "window")];
        if (ret != NULL && ret->kind != MS_EXPR_NONE && (win == NULL || win->kind == MS_EXPR_NONE))
            err(s, r->ast->name.loc,
                "attention '%s' attends to every token, but kv_pool '%s' releases tokens outside its retention window; give '%s' a window",
                r->name, r->kv->name, r->name);
    }
    /* dependency order: Kahn's algorithm; among ready resources the first kind (KV, positions,
     * attention, cross, scratch, sampler: ms_resource_kind order), then the first name */
    bool placed[MS_MAX_RESOURCES * 4] = {false};
    ms_resource **order = NEWN(s, ms_resource *, count);
    int n_order = 0;
    int lim = count < MS_MAX_RESOURCES * 4 ? count : MS_MAX_RESOURCES * 4;
    while (n_order < lim) {
        int best = -1;
        for (int i = 0; i < lim; i++) {
            if (placed[i])
                continue;
            bool ready = true;
            for (int k = 0; k < list[i]->n_deps && ready; k++)
                for (int j = 0; j < lim; j++)
                    if (list[j] == list[i]->deps[k] && !placed[j])
                        ready = false;
            if (!ready)
                continue;
            if (best < 0 || list[i]->kind < list[best]->kind ||
                (list[i]->kind == list[best]->kind && strcmp(list[i]->name, list[best]->name) < 0))
                best = i;
        }
        if (best < 0)
            break;
        placed[best] = true;
        list[best]->index = n_order;
        order[n_order++] = list[best];
    }
    if (n_order < lim) {
        /* report one cycle, starting at the first unplaced resource in source order that is on one */
        for (int i = 0; i < lim; i++) {
            if (placed[i])
                continue;
            const ms_resource *path[MS_MAX_RESOURCES * 4 + 2];
            int np = 0;
            if (!dep_path(list[i], list[i], path, &np, 0))
                continue;
            ms_strbuf b = {0};
            ms_strbuf_puts(&b, list[i]->name);
            for (int k = 0; k < np; k++)
                ms_strbuf_printf(&b, " -> %s", path[k]->name);
            err(s, list[i]->ast->name.loc, "resource dependency cycle: %s", b.data != NULL ? b.data : "");
            ms_strbuf_free(&b);
            break;
        }
        for (int i = 0; i < lim; i++)
            if (!placed[i]) {
                list[i]->index = n_order;
                order[n_order++] = list[i];
            }
    }
    node->resources = order;
    node->n_resources = n_order;
}

/* ---- 3b. forward ---- */

static fval fv(ms_type t) {
    fval v = {0};
    v.t = t;
    return v;
}

static fval tensor(sema *s, int rank, const ms_ast_expr *const *dims) {
    fval v = fv(MS_TYPE_TENSOR);
    v.rank = rank;
    v.dims = NEWN(s, const ms_ast_expr *, rank);
    for (int i = 0; i < rank; i++)
        v.dims[i] = dims != NULL ? dims[i] : NULL;
    return v;
}

static void annotate(ms_ast_expr *e, const fval *v) {
    e->type = (int)v->t;
    e->rank = v->rank;
    e->dims = v->dims;
}

static binding *lookup(sema *s, const char *name) {
    intptr_t i = (intptr_t)ms_strmap_get(&s->bind_map, name);
    return i > 0 ? &s->binds[i - 1] : NULL;
}

/* Drop the bindings made since there were n (a loop body's), unhiding what they hid. */
static void unbind_to(sema *s, int n) {
    for (int i = s->n_binds - 1; i >= n; i--)
        ms_strmap_put(&s->bind_map, s->binds[i].name, (void *)(intptr_t)(s->binds[i].prev + 1));
    s->n_binds = n;
}

static void bind(sema *s, const char *name, fval v, ms_sym_kind kind, int index) {
    if (s->n_binds == s->cap_binds) {
        int ncap = s->cap_binds < 16 ? 16 : s->cap_binds * 2;
        binding *nb = NEWN(s, binding, ncap);
        if (s->n_binds > 0)
            memcpy(nb, s->binds, sizeof *nb * (size_t)s->n_binds);
        s->binds = nb;
        s->cap_binds = ncap;
    }
    binding *b = &s->binds[s->n_binds];
    b->prev = (int)(intptr_t)ms_strmap_get(&s->bind_map, name) - 1;
    ms_strmap_put(&s->bind_map, name, (void *)(intptr_t)(s->n_binds + 1));
    s->n_binds++;
    b->name = name;
    b->v = v;
    b->depth = s->depth;
    b->sym = NEW(s, ms_ast_sym);
    b->sym->kind = kind;
    b->sym->name = name;
    b->sym->index = index;
    b->sym->group = v.group;
}

static fval fexpr(sema *s, ms_ast_expr *e);

static bool want_tensor(sema *s, const ms_ast_expr *e, const fval *v, const char *what) {
    if (v->t == MS_TYPE_TENSOR)
        return true;
    if (v->t != MS_TYPE_UNKNOWN)
        err(s, e->loc, "%s must be a tensor, got %s", what, ms_type_str(v->t));
    return false;
}

static bool want_scalar(sema *s, ms_ast_expr *e, const char *what) {
    fval v = fexpr(s, e);
    if (v.t == MS_TYPE_UNKNOWN || v.t == MS_TYPE_FLOAT || v.t == MS_TYPE_INT)
        return true;
    err(s, e->loc, "%s must be a number, got %s", what, ms_type_str(v.t));
    return false;
}

static const ms_ast_expr *last_dim(const fval *v) { return v->rank > 0 ? v->dims[v->rank - 1] : NULL; }

/* Positional args of a call [n]; named args are looked up with named(). */
static ms_ast_expr *pos_arg(const ms_ast_expr *call, int i) {
    int k = 0;
    for (int j = 0; j < call->args.n; j++) {
        ms_ast_arg *a = call->args.items[j];
        if (a->name == NULL && k++ == i)
            return a->value;
    }
    return NULL;
}

static int n_pos_args(const ms_ast_expr *call) {
    int k = 0;
    for (int j = 0; j < call->args.n; j++)
        k += ((ms_ast_arg *)call->args.items[j])->name == NULL;
    return k;
}

/* Named argument `key`; reports keys outside `allowed` (NULL-terminated) once per call. */
static ms_ast_expr *named_arg(const ms_ast_expr *call, const char *key) {
    for (int j = 0; j < call->args.n; j++) {
        ms_ast_arg *a = call->args.items[j];
        if (a->name != NULL && strcmp(a->name, key) == 0)
            return a->value;
    }
    return NULL;
}

static bool check_named(sema *s, const ms_ast_expr *call, const char *fn, const char *const *allowed) {
    bool ok = true;
    for (int j = 0; j < call->args.n; j++) {
        ms_ast_arg *a = call->args.items[j];
        if (a->name == NULL)
            continue;
        bool found = false;
        for (int k = 0; allowed != NULL && allowed[k] != NULL; k++)
            found = found || strcmp(allowed[k], a->name) == 0;
        if (!found) {
            err(s, a->name_loc, "%s takes no argument '%s'", fn, a->name);
            ok = false;
        }
        for (int k = 0; k < j; k++) {
            ms_ast_arg *b = call->args.items[k];
            if (b->name != NULL && strcmp(b->name, a->name) == 0) {
                err(s, a->name_loc, "argument '%s' is given twice", a->name);
                ok = false;
            }
        }
    }
    return ok;
}

static bool arity(sema *s, const ms_ast_expr *call, const char *fn, int lo, int hi) {
    int n = n_pos_args(call);
    if (n >= lo && n <= hi)
        return true;
    if (lo == hi)
        err(s, call->loc, "%s takes %d argument%s, got %d", fn, lo, lo == 1 ? "" : "s", n);
    else
        err(s, call->loc, "%s takes %d to %d arguments, got %d", fn, lo, hi, n);
    return false;
}

static void dim_mismatch(sema *s, ms_loc loc, const char *fn, const char *what_a, const ms_ast_expr *a,
                         const char *what_b, const ms_ast_expr *b) {
    err(s, loc, "shape mismatch in %s: %s is %s but %s is %s", fn, what_a, dim_text(s, a), what_b, dim_text(s, b));
}

static const char *wname(sema *s, const ms_ast_expr *e) {
    if (e->kind == MS_EXPR_NAME || e->kind == MS_EXPR_MEMBER)
        return ms_arena_sprintf(s->a, "'%s'", ms_expr_str(s->a, e));
    return "the weight";
}

/* Weight operand: a tensor value of the given rank. */
static bool want_weight(sema *s, ms_ast_expr *e, fval *v, int rank, const char *fn) {
    *v = fexpr(s, e);
    if (v->t == MS_TYPE_UNKNOWN)
        return false;
    if (v->t != MS_TYPE_TENSOR) {
        err(s, e->loc, "%s needs a weight here, got %s", fn, ms_type_str(v->t));
        return false;
    }
    if (v->rank != rank) {
        err(s, e->loc, "%s needs a %d-D weight, %s has shape %s", fn, rank, wname(s, e), shape_text(s, v));
        return false;
    }
    return true;
}

static const ms_ast_expr *mul_dims(sema *s, const ms_ast_expr *a, const ms_ast_expr *b) {
    if (a == NULL || b == NULL)
        return NULL;
    ms_ast_expr *e = NEW(s, ms_ast_expr);
    e->kind = MS_EXPR_BINARY;
    e->op = MS_OP_MUL;
    e->lhs = (ms_ast_expr *)a;
    e->rhs = (ms_ast_expr *)b;
    e->loc = a->loc;
    e->type = MS_TYPE_INT;
    return e;
}

/* Head dimension of a resource: its head_dim argument, else its kv_pool's. */
static const ms_ast_expr *res_head_dim(const ms_resource *r) {
    int k = spec_key(r->spec, "head_dim");
    if (k >= 0 && r->args[k] != NULL && r->args[k]->kind != MS_EXPR_COND)
        return r->args[k];
    if (r->kv != NULL) {
        const ms_ast_expr *d = r->kv->args[spec_key(r->kv->spec, "head_dim")];
        return d != NULL && d->kind != MS_EXPR_COND ? d : NULL;
    }
    return NULL;
}

static const ms_ast_expr *res_arg_plain(const ms_resource *r, const char *key) {
    int k = spec_key(r->spec, key);
    const ms_ast_expr *e = k >= 0 ? r->args[k] : NULL;
    return e != NULL && e->kind != MS_EXPR_COND ? e : NULL;
}

static const ms_ast_expr *res_arg_plain(const ms_resource *r, const char *key);

/* layer = <loop variable>, iterating a group with as many layers as the resource's KV pool. */
static bool want_layer(sema *s, const ms_ast_expr *call, const char *fn, const ms_resource *r) {
    ms_ast_expr *l = named_arg(call, "layer");
    if (l == NULL) {
        err(s, call->loc, "%s needs layer = <loop variable> (which layer's KV to use)", fn);
        return false;
    }
    fval v = fexpr(s, l);
    if (v.t != MS_TYPE_LAYER && v.t != MS_TYPE_UNKNOWN) {
        err(s, l->loc, "layer must be a for-loop variable over a weight group, got %s", ms_type_str(v.t));
        return false;
    }
    const ms_resource *pool = r->kind == MS_RESOURCE_KV ? r : r->kv;
    const ms_ast_expr *layers = pool != NULL ? res_arg_plain(pool, "layers") : NULL;
    if (v.t == MS_TYPE_LAYER && v.group != NULL && layers != NULL && !dims_eq(s, v.group->count, layers))
        err(s, l->loc, "%s: group '%s' has %s layers but kv_pool '%s' has layers = %s", fn, v.group->name,
            ms_expr_str(s->a, v.group->count), pool->name, ms_expr_str(s->a, layers));
    return true;
}

static fval method_call(sema *s, ms_ast_expr *e, const ms_resource *r, const char *m) {
    char fn[160];
    snprintf(fn, sizeof fn, "%s.%s", r->name, m);
    static const char *const layer_only[] = {"layer", NULL};
    switch (r->kind) {
    case MS_RESOURCE_POS:
        if (strcmp(m, "apply") == 0 && strcmp(r->spec->ctor, "rope") == 0) {
            if (!check_named(s, e, fn, NULL) || !arity(s, e, fn, 2, 2))
                return fv(MS_TYPE_UNKNOWN);
            fval q = fexpr(s, pos_arg(e, 0));
            fval k = fexpr(s, pos_arg(e, 1));
            want_tensor(s, pos_arg(e, 0), &q, "q");
            want_tensor(s, pos_arg(e, 1), &k, "k");
            fval t = fv(MS_TYPE_TUPLE);
            t.n = 2;
            t.elems = NEWN(s, fval, 2);
            t.elems[0] = q;
            t.elems[1] = k;
            return t;
        }
        if (strcmp(m, "embed") == 0 && strcmp(r->spec->ctor, "positions") == 0) {
            if (!check_named(s, e, fn, NULL) || !arity(s, e, fn, 1, 1))
                return fv(MS_TYPE_UNKNOWN);
            fval ids = fexpr(s, pos_arg(e, 0));
            want_tensor(s, pos_arg(e, 0), &ids, "ids");
            const ms_ast_expr *tab = res_arg_plain(r, "table");
            const ms_weight *w = tab != NULL && tab->sym != NULL ? tab->sym->weight : NULL;
            const ms_ast_expr *dims[2] = {ids.rank > 0 ? ids.dims[0] : NULL,
                                          w != NULL && w->rank == 2 ? w->shape[1] : NULL};
            return tensor(s, 2, dims);
        }
        break;
    case MS_RESOURCE_ATTN:
    case MS_RESOURCE_CROSS:
    case MS_RESOURCE_SCRATCH: {
        bool is_cross = r->kind == MS_RESOURCE_CROSS;
        if (r->kind == MS_RESOURCE_SCRATCH && strcmp(m, "first") == 0) {
            /* code.first(a, b): each row from a where it is its frame's first (slot 0), from
               b elsewhere (a code predictor's input: in_proj(h) then the codes' embeddings) */
            if (!check_named(s, e, fn, NULL) || !arity(s, e, fn, 2, 2))
                return fv(MS_TYPE_UNKNOWN);
            fval a = fexpr(s, pos_arg(e, 0)), b = fexpr(s, pos_arg(e, 1));
            bool ta = want_tensor(s, pos_arg(e, 0), &a, "the first rows");
            bool tb = want_tensor(s, pos_arg(e, 1), &b, "the other rows");
            if (ta && tb && (a.rank != 2 || b.rank != 2))
                err(s, e->loc, "%s takes rows [n, d], got rank %d and %d", fn, a.rank, b.rank);
            else if (ta && tb && !dims_eq(s, last_dim(&a), last_dim(&b)))
                dim_mismatch(s, pos_arg(e, 1)->loc, fn, "the other rows' width", last_dim(&b),
                             "the first rows' width", last_dim(&a));
            return ta ? a : tb ? b : fv(MS_TYPE_UNKNOWN);
        }
        if (strcmp(m, "run") == 0 || (is_cross && strcmp(m, "write") == 0)) {
            bool write = strcmp(m, "write") == 0;
            int want = is_cross ? (write ? 2 : 1) : 3;
            if (!check_named(s, e, fn, layer_only) || !arity(s, e, fn, want, want))
                return fv(MS_TYPE_UNKNOWN);
            fval v[3];
            for (int i = 0; i < want; i++) {
                v[i] = fexpr(s, pos_arg(e, i));
                want_tensor(s, pos_arg(e, i), &v[i], i == 0 && !write ? "q" : i == (write ? 0 : 1) ? "k" : "v");
            }
            want_layer(s, e, fn, r);
            const ms_ast_expr *hd = res_head_dim(r);
            const ms_ast_expr *qh = res_arg_plain(r, "q_heads");
            const ms_ast_expr *kvh = r->kv != NULL ? res_arg_plain(r->kv, "kv_heads") : NULL;
            if (r->kind == MS_RESOURCE_ATTN && r->kv == NULL) /* dense: its own kv_heads or q_heads */
                kvh = res_arg_plain(r, "kv_heads") != NULL ? res_arg_plain(r, "kv_heads") : qh;
            const ms_ast_expr *qdim = mul_dims(s, qh, hd);
            const ms_ast_expr *kvdim = mul_dims(s, kvh, hd);
            if (r->kind == MS_RESOURCE_SCRATCH) {
                /* q's shape (a 2-D array sized for rank 2 overflowed on a q of higher rank:
                   fuzz_dsl) */
                return v[0].rank > 0 ? tensor(s, v[0].rank, v[0].dims) : tensor(s, 2, NULL);
            }
            if (!write && v[0].t == MS_TYPE_TENSOR && !dims_eq(s, last_dim(&v[0]), qdim))
                dim_mismatch(s, pos_arg(e, 0)->loc, fn, "q's last dimension", last_dim(&v[0]),
                             "q_heads * head_dim", qdim);
            for (int i = write ? 0 : 1; i < want; i++)
                if (v[i].t == MS_TYPE_TENSOR && !dims_eq(s, last_dim(&v[i]), kvdim))
                    dim_mismatch(s, pos_arg(e, i)->loc, fn, i == (write ? 0 : 1) ? "k's last dimension" : "v's last dimension",
                                 last_dim(&v[i]), "kv_heads * head_dim", kvdim);
            if (write)
                return fv(MS_TYPE_NONE);
            const ms_ast_expr *dims[2] = {v[0].rank > 0 ? v[0].dims[0] : NULL, qdim};
            return tensor(s, 2, dims);
        }
        break;
    }
    case MS_RESOURCE_SAMPLER:
        if (strcmp(m, "sample") == 0) {
            if (!check_named(s, e, fn, NULL) || !arity(s, e, fn, 1, 1))
                return fv(MS_TYPE_UNKNOWN);
            fval l = fexpr(s, pos_arg(e, 0));
            if (want_tensor(s, pos_arg(e, 0), &l, "logits")) {
                const ms_ast_expr *vocab = res_arg_plain(r, "vocab");
                if (!dims_eq(s, last_dim(&l), vocab))
                    dim_mismatch(s, pos_arg(e, 0)->loc, fn, "the logits' last dimension", last_dim(&l), "vocab",
                                 vocab);
            }
            const ms_ast_expr *dims[1] = {l.rank > 0 ? l.dims[0] : NULL};
            return tensor(s, 1, dims);
        }
        break;
    default:
        break;
    }
    static const char *const methods[MS_RESOURCE_KIND_COUNT] = {
        "none", "apply (rope) / embed (positions)", "run", "run, write", "run, first", "sample",
    };
    err(s, e->lhs->loc, "%s '%s' has no method '%s' (methods: %s)", r->spec->ctor, r->name, m,
        methods[r->kind]);
    return fv(MS_TYPE_UNKNOWN);
}

static const char *const BUILTINS[] = {
    "embedding", "rms_norm", "head_rms_norm", "layer_norm", "linear", "silu", "gelu", "relu", "tanh",
    "sigmoid", "softmax", "conv1d", "transpose", NULL,
};

/* [codes] The forward parameter `e` names when it is declared `name: [d0, d1] ids`, else NULL. */
static const ms_ast_fparam *ids_param(const sema *s, const ms_ast_expr *e) {
    if (s->fwd == NULL || e == NULL || e->kind != MS_EXPR_NAME || e->sym == NULL ||
        e->sym->kind != MS_SYM_INPUT || e->sym->index < 0 || e->sym->index >= s->fwd->params.n)
        return NULL;
    const ms_ast_fparam *p = s->fwd->params.items[e->sym->index];
    return p->elem.name != NULL && strcmp(p->name.name, e->text) == 0 ? p : NULL;
}

/* [codes] Whether e names the variable of an enclosing `for` over a weight group. */
static bool loop_var(sema *s, ms_ast_expr *e) {
    if (e->kind != MS_EXPR_NAME)
        return false;
    binding *b = lookup(s, e->text);
    if (b == NULL || b->v.t != MS_TYPE_LAYER)
        return false;
    e->sym = b->sym;
    set_type(e, MS_TYPE_INT);
    return true;
}

/* [codes] embedding()'s `column = c`: an int config expression, or the loop variable of an
 * enclosing `for` (its index in the group) plus or alone with one. */
static void check_column(sema *s, ms_ast_expr *c) {
    if (loop_var(s, c))
        return;
    if (c->kind == MS_EXPR_BINARY && c->op == MS_OP_ADD && (loop_var(s, c->lhs) || loop_var(s, c->rhs))) {
        ms_ast_expr *rest = c->lhs->sym != NULL && c->lhs->sym->kind == MS_SYM_LAYER ? c->rhs : c->lhs;
        if (rest->kind == MS_EXPR_NAME && loop_var(s, rest))
            err(s, rest->loc, "embedding()'s column adds one loop variable");
        else
            cexpr_want(s, rest, MS_TYPE_INT, "embedding()'s column");
        set_type(c, MS_TYPE_INT);
        return;
    }
    cexpr_want(s, c, MS_TYPE_INT, "embedding()'s column (an int, or <loop variable> + an int)");
}

static fval builtin_call(sema *s, ms_ast_expr *e, const char *fn) {
    e->lhs->sym = s->builtin_sym;
    static const char *const conv_keys[] = {"stride", "padding", NULL};
    static const char *const embed_keys[] = {"column", NULL};
    if (!check_named(s, e, fn, strcmp(fn, "conv1d") == 0     ? conv_keys
                               : strcmp(fn, "embedding") == 0 ? embed_keys
                                                              : NULL))
        return fv(MS_TYPE_UNKNOWN);
    if (strcmp(fn, "embedding") == 0) {
        if (!arity(s, e, fn, 2, 2))
            return fv(MS_TYPE_UNKNOWN);
        s->ids_ok = pos_arg(e, 1)->kind == MS_EXPR_NAME; /* [codes] embedding(table, codes, ...) */
        fval w, ids = fexpr(s, pos_arg(e, 1));
        s->ids_ok = false;
        bool ok = want_weight(s, pos_arg(e, 0), &w, 2, fn);
        want_tensor(s, pos_arg(e, 1), &ids, "token ids");
        /* [codes] column c of a `[_, G] ids` input: one id per row */
        ms_ast_expr *col = named_arg(e, "column");
        const ms_ast_fparam *ip = ids_param(s, pos_arg(e, 1));
        if (col != NULL && ip == NULL)
            err(s, pos_arg(e, 1)->loc, "embedding(table, x, column = c) reads a column of a "
                "forward parameter declared `x: [_, n] ids`");
        else if (col == NULL && ip != NULL)
            err(s, pos_arg(e, 1)->loc, "embedding() of '%s' (a row of ids per token) names the "
                "column it reads: embedding(table, %s, column = <int>)", ip->name.name, ip->name.name);
        else if (col != NULL)
            check_column(s, col);
        const ms_ast_expr *dims[2] = {ids.rank > 0 ? ids.dims[0] : NULL, ok ? w.dims[1] : NULL};
        return tensor(s, 2, dims);
    }
    if (strcmp(fn, "rms_norm") == 0 || strcmp(fn, "head_rms_norm") == 0 || strcmp(fn, "layer_norm") == 0) {
        bool ln = strcmp(fn, "layer_norm") == 0;
        if (!arity(s, e, fn, ln ? 4 : 3, ln ? 4 : 3))
            return fv(MS_TYPE_UNKNOWN);
        fval x = fexpr(s, pos_arg(e, 0)), w;
        bool tx = want_tensor(s, pos_arg(e, 0), &x, "the input");
        bool tw = want_weight(s, pos_arg(e, 1), &w, 1, fn);
        if (ln && pos_arg(e, 2)->kind != MS_EXPR_NONE) {
            fval b;
            if (want_weight(s, pos_arg(e, 2), &b, 1, fn) && tw && !dims_eq(s, b.dims[0], w.dims[0]))
                dim_mismatch(s, pos_arg(e, 2)->loc, fn, "the bias", b.dims[0], "the weight", w.dims[0]);
        }
        want_scalar(s, pos_arg(e, ln ? 3 : 2), "eps");
        if (tx && tw && strcmp(fn, "head_rms_norm") != 0 && !dims_eq(s, last_dim(&x), w.dims[0]))
            dim_mismatch(s, pos_arg(e, 1)->loc, fn, "the input's last dimension", last_dim(&x),
                         ms_arena_sprintf(s->a, "the size of %s", wname(s, pos_arg(e, 1))), w.dims[0]);
        return tx ? x : fv(MS_TYPE_UNKNOWN);
    }
    if (strcmp(fn, "linear") == 0) {
        if (!arity(s, e, fn, 2, 3))
            return fv(MS_TYPE_UNKNOWN);
        fval x = fexpr(s, pos_arg(e, 0)), w;
        bool tx = want_tensor(s, pos_arg(e, 0), &x, "the input");
        bool tw = want_weight(s, pos_arg(e, 1), &w, 2, fn);
        if (pos_arg(e, 2) != NULL) {
            fval b;
            if (want_weight(s, pos_arg(e, 2), &b, 1, fn) && tw && !dims_eq(s, b.dims[0], w.dims[0]))
                dim_mismatch(s, pos_arg(e, 2)->loc, fn, "the bias size", b.dims[0], "the weight's output dimension",
                             w.dims[0]);
        }
        if (!tx || !tw)
            return fv(MS_TYPE_UNKNOWN);
        if (!dims_eq(s, last_dim(&x), w.dims[1]))
            dim_mismatch(s, pos_arg(e, 1)->loc, fn, "the input's last dimension", last_dim(&x),
                         ms_arena_sprintf(s->a, "the input dimension of %s %s", wname(s, pos_arg(e, 1)),
                                          shape_text(s, &w)),
                         w.dims[1]);
        fval out = tensor(s, x.rank, x.dims);
        if (out.rank > 0)
            out.dims[out.rank - 1] = w.dims[0];
        return out;
    }
    if (strcmp(fn, "conv1d") == 0) {
        if (!arity(s, e, fn, 2, 3))
            return fv(MS_TYPE_UNKNOWN);
        fval x = fexpr(s, pos_arg(e, 0)), w;
        want_tensor(s, pos_arg(e, 0), &x, "the input");
        bool tw = want_weight(s, pos_arg(e, 1), &w, 3, fn);
        if (pos_arg(e, 2) != NULL) {
            fval b;
            want_weight(s, pos_arg(e, 2), &b, 1, fn);
        }
        for (int j = 0; j < e->args.n; j++) {
            ms_ast_arg *a = e->args.items[j];
            if (a->name != NULL)
                cexpr_want(s, a->value, MS_TYPE_INT, a->name);
        }
        /* [out_channels, frames']: frames depend on stride and padding, left dynamic */
        const ms_ast_expr *dims[2] = {NULL, tw ? w.dims[0] : NULL};
        return tensor(s, 2, dims);
    }
    if (strcmp(fn, "transpose") == 0) {
        if (!arity(s, e, fn, 1, 1))
            return fv(MS_TYPE_UNKNOWN);
        fval x = fexpr(s, pos_arg(e, 0));
        if (!want_tensor(s, pos_arg(e, 0), &x, "the input"))
            return fv(MS_TYPE_UNKNOWN);
        if (x.rank != 2) {
            err(s, pos_arg(e, 0)->loc, "transpose needs a 2-D tensor, got shape %s", shape_text(s, &x));
            return fv(MS_TYPE_UNKNOWN);
        }
        const ms_ast_expr *dims[2] = {x.dims[1], x.dims[0]};
        return tensor(s, 2, dims);
    }
    /* elementwise activations */
    if (!arity(s, e, fn, 1, 1))
        return fv(MS_TYPE_UNKNOWN);
    fval x = fexpr(s, pos_arg(e, 0));
    return want_tensor(s, pos_arg(e, 0), &x, "the input") ? x : fv(MS_TYPE_UNKNOWN);
}

static fval fcall(sema *s, ms_ast_expr *e) {
    ms_ast_expr *callee = e->lhs;
    if (callee->kind == MS_EXPR_MEMBER && callee->lhs->kind == MS_EXPR_NAME) {
        const ms_resource *r = find_resource(s, callee->lhs->text);
        if (r != NULL && lookup(s, callee->lhs->text) == NULL) {
            callee->lhs->sym = &r->sym;
            callee->lhs->type = MS_TYPE_RESOURCE;
            return method_call(s, e, r, callee->text);
        }
        if (lookup(s, callee->lhs->text) == NULL) {
            suggest g = {callee->lhs->text, NULL, 0};
            for (int i = 0; i < s->node->n_resources; i++)
                suggest_add(&g, s->node->resources[i]->name);
            err(s, callee->lhs->loc, "unknown resource '%s' in node '%s'%s", callee->lhs->text, s->node->name,
                suggest_text(s, &g));
            return fv(MS_TYPE_UNKNOWN);
        }
    }
    if (callee->kind != MS_EXPR_NAME) {
        err(s, callee->loc, "only builtin functions and resource methods can be called");
        return fv(MS_TYPE_UNKNOWN);
    }
    for (int i = 0; BUILTINS[i] != NULL; i++)
        if (strcmp(BUILTINS[i], callee->text) == 0)
            return builtin_call(s, e, callee->text);
    suggest g = {callee->text, NULL, 0};
    for (int i = 0; BUILTINS[i] != NULL; i++)
        suggest_add(&g, BUILTINS[i]);
    err(s, callee->loc, "unknown function '%s'%s", callee->text, suggest_text(s, &g));
    return fv(MS_TYPE_UNKNOWN);
}

static fval fname(sema *s, ms_ast_expr *e) {
    binding *b = lookup(s, e->text);
    if (b != NULL) {
        e->sym = b->sym;
        return b->v;
    }
    ms_weight *w = find_top_weight(s, e->text);
    if (w != NULL) {
        w->used = true;
        e->sym = &w->sym;
        return tensor(s, w->rank, w->shape);
    }
    const ms_param *p = find_param(s, e->text);
    if (p != NULL) {
        e->sym = &p->sym;
        if (p->optional)
            err(s, e->loc, "optional parameter '%s' cannot be used in a forward", p->name);
        return fv(p->type);
    }
    if (find_group(s, e->text) != NULL) {
        err(s, e->loc, "'%s' is a per-layer weight group; iterate it with 'for l in %s { ... }'", e->text, e->text);
        return fv(MS_TYPE_UNKNOWN);
    }
    if (find_resource(s, e->text) != NULL) {
        err(s, e->loc, "resource '%s' is not a value; call one of its methods", e->text);
        return fv(MS_TYPE_UNKNOWN);
    }
    suggest g = {e->text, NULL, 0};
    for (int i = 0; i < s->n_binds; i++)
        suggest_add(&g, s->binds[i].name);
    for (int i = 0; i < s->m->n_weights; i++)
        if (s->m->weights[i]->group == NULL)
            suggest_add(&g, s->m->weights[i]->name);
    for (int i = 0; i < s->m->n_params; i++)
        suggest_add(&g, s->m->params[i]->name);
    err(s, e->loc, "unknown name '%s'%s", e->text, suggest_text(s, &g));
    return fv(MS_TYPE_UNKNOWN);
}

static fval fexpr_inner(sema *s, ms_ast_expr *e) {
    switch (e->kind) {
    case MS_EXPR_INT: return fv(MS_TYPE_INT);
    case MS_EXPR_FLOAT: return fv(MS_TYPE_FLOAT);
    case MS_EXPR_BOOL: return fv(MS_TYPE_BOOL);
    case MS_EXPR_NONE: return fv(MS_TYPE_NONE);
    case MS_EXPR_STRING:
        err(s, e->loc, "strings are not forward values");
        return fv(MS_TYPE_UNKNOWN);
    case MS_EXPR_NAME: {
        fval v = fname(s, e);
        const ms_ast_fparam *ip = s->ids_ok ? NULL : ids_param(s, e);
        if (ip != NULL) /* [codes] */
            err(s, e->loc, "'%s' holds ids: read its columns with embedding(table, %s, column = "
                "<int>)", e->text, e->text);
        return v;
    }
    case MS_EXPR_MEMBER: {
        if (e->lhs->kind == MS_EXPR_NAME) {
            binding *b = lookup(s, e->lhs->text);
            if (b != NULL && b->v.t == MS_TYPE_LAYER) {
                e->lhs->sym = b->sym;
                e->lhs->type = MS_TYPE_LAYER;
                ms_weight *w = find_member(s, b->v.group, e->text);
                if (w == NULL) {
                    suggest g = {e->text, NULL, 0};
                    for (int i = 0; i < b->v.group->n_members; i++)
                        suggest_add(&g, b->v.group->members[i]->name);
                    err(s, e->loc, "weight group '%s' has no weight '%s'%s", b->v.group->name, e->text,
                        suggest_text(s, &g));
                    return fv(MS_TYPE_UNKNOWN);
                }
                w->used = true;
                e->sym = &w->sym;
                return tensor(s, w->rank, w->shape);
            }
            if (find_resource(s, e->lhs->text) != NULL && b == NULL) {
                err(s, e->loc, "'%s.%s' is a method; call it", e->lhs->text, e->text);
                return fv(MS_TYPE_UNKNOWN);
            }
        }
        fval o = fexpr(s, e->lhs);
        if (o.t != MS_TYPE_UNKNOWN)
            err(s, e->loc, "'.%s' needs a layer loop variable on its left, got %s", e->text, ms_type_str(o.t));
        return fv(MS_TYPE_UNKNOWN);
    }
    case MS_EXPR_CALL: return fcall(s, e);
    case MS_EXPR_UNARY: {
        fval v = fexpr(s, e->lhs);
        if (e->op == MS_OP_NOT || v.t == MS_TYPE_TUPLE || v.t == MS_TYPE_LAYER) {
            if (v.t != MS_TYPE_UNKNOWN)
                err(s, e->loc, "'%s' cannot apply to %s here", ms_op_str(e->op), ms_type_str(v.t));
            return fv(MS_TYPE_UNKNOWN);
        }
        return v;
    }
    case MS_EXPR_BINARY: {
        fval a = fexpr(s, e->lhs);
        fval b = fexpr(s, e->rhs);
        if (a.t == MS_TYPE_UNKNOWN || b.t == MS_TYPE_UNKNOWN)
            return fv(MS_TYPE_UNKNOWN);
        if (e->op > MS_OP_MOD) {
            err(s, e->loc, "'%s' is not a forward operation (use + - * / %%)", ms_op_str(e->op));
            return fv(MS_TYPE_UNKNOWN);
        }
        bool ta = a.t == MS_TYPE_TENSOR, tb = b.t == MS_TYPE_TENSOR;
        bool sa = a.t == MS_TYPE_INT || a.t == MS_TYPE_FLOAT, sb = b.t == MS_TYPE_INT || b.t == MS_TYPE_FLOAT;
        if ((!ta && !sa) || (!tb && !sb)) {
            err(s, e->loc, "'%s' needs tensors or numbers, got %s and %s", ms_op_str(e->op), ms_type_str(a.t),
                ms_type_str(b.t));
            return fv(MS_TYPE_UNKNOWN);
        }
        if (ta && tb) {
            bool same = a.rank == b.rank;
            for (int i = 0; same && i < a.rank; i++)
                same = dims_eq(s, a.dims[i], b.dims[i]);
            if (!same) {
                err(s, e->loc, "shape mismatch in '%s': %s and %s", ms_op_str(e->op), shape_text(s, &a),
                    shape_text(s, &b));
                return fv(MS_TYPE_UNKNOWN);
            }
            /* keep the better-known dims */
            fval r = tensor(s, a.rank, a.dims);
            for (int i = 0; i < r.rank; i++)
                if (r.dims[i] == NULL)
                    r.dims[i] = b.dims[i];
            return r;
        }
        if (ta)
            return a;
        if (tb)
            return b;
        return fv(a.t == MS_TYPE_INT && b.t == MS_TYPE_INT ? MS_TYPE_INT : MS_TYPE_FLOAT);
    }
    case MS_EXPR_COND:
        err(s, e->loc, "conditionals are not allowed in a forward (the graph is static)");
        return fv(MS_TYPE_UNKNOWN);
    case MS_EXPR_LIST:
    default:
        err(s, e->loc, "lists are not forward values");
        return fv(MS_TYPE_UNKNOWN);
    }
}

static fval fexpr(sema *s, ms_ast_expr *e) {
    if (e == NULL)
        return fv(MS_TYPE_UNKNOWN);
    fval v = fexpr_inner(s, e);
    annotate(e, &v);
    return v;
}

static void check_stmts(sema *s, ms_forward *f, const ms_ptr_vec *body, bool top, bool *returned);

static void check_assign(sema *s, ms_forward *f, ms_ast_stmt *st) {
    fval vals[16];
    int n = 0;
    if (st->rhs.n == 1) {
        fval v = fexpr(s, st->rhs.items[0]);
        if (v.t == MS_TYPE_TUPLE) {
            for (int i = 0; i < v.n && i < 16; i++)
                vals[n++] = v.elems[i];
        } else {
            vals[n++] = v;
        }
    } else {
        for (int i = 0; i < st->rhs.n; i++) {
            fval v = fexpr(s, st->rhs.items[i]);
            if (v.t == MS_TYPE_TUPLE) {
                err(s, ((ms_ast_expr *)st->rhs.items[i])->loc, "a tuple cannot be part of a list of values");
                v = fv(MS_TYPE_UNKNOWN);
            }
            if (n < 16)
                vals[n++] = v;
        }
    }
    bool unknown = n == 1 && vals[0].t == MS_TYPE_UNKNOWN;
    if (n != st->lhs.n && !unknown) {
        err(s, st->loc, "%d name%s bound to %d value%s", st->lhs.n, st->lhs.n == 1 ? "" : "s", n, n == 1 ? "" : "s");
        unknown = true;
    }
    for (int i = 0; i < st->lhs.n; i++) {
        ms_ast_expr *t = st->lhs.items[i];
        if (t->kind != MS_EXPR_NAME) {
            err(s, t->loc, "only names can be bound (got an expression on the left of '=')");
            continue;
        }
        fval v = unknown ? fv(MS_TYPE_UNKNOWN) : vals[i];
        if (v.t == MS_TYPE_NONE) {
            err(s, ((ms_ast_expr *)st->rhs.items[st->rhs.n == 1 ? 0 : i])->loc, "this call returns nothing");
            v = fv(MS_TYPE_UNKNOWN);
        }
        for (int k = 0; k < i; k++) {
            const ms_ast_expr *o = st->lhs.items[k];
            if (o->kind == MS_EXPR_NAME && strcmp(o->text, t->text) == 0)
                err(s, t->loc, "'%s' is bound twice in one statement", t->text);
        }
        if (find_top_weight(s, t->text) != NULL || find_param(s, t->text) != NULL ||
            find_resource(s, t->text) != NULL || find_group(s, t->text) != NULL) {
            err(s, t->loc, "cannot bind '%s': it names a %s", t->text,
                find_top_weight(s, t->text) != NULL ? "weight"
                : find_param(s, t->text) != NULL   ? "config parameter"
                : find_group(s, t->text) != NULL   ? "weight group"
                                                       : "resource");
            continue;
        }
        binding *b = lookup(s, t->text);
        if (b != NULL && b->v.t == MS_TYPE_LAYER) {
            err(s, t->loc, "cannot rebind loop variable '%s'", t->text);
            continue;
        }
        if (b != NULL && b->sym->kind == MS_SYM_INPUT) {
            /* rebinding an input makes a new local that shadows it */
            b = NULL;
        }
        if (b != NULL) {
            b->v = v;
            t->sym = b->sym;
        } else {
            bind(s, t->text, v, MS_SYM_LOCAL, f->n_locals++);
            t->sym = s->binds[s->n_binds - 1].sym;
        }
        annotate(t, &v);
    }
}

/* `for v in group at <scratch>.slot [+|- int]`: the one member of the group the body reads,
 * picked per step by the frame slot of the step's last rows (a node on a scratch: a code
 * predictor's per-codebook heads, `for hd in heads at code.slot - 1`). */
static void check_for_at(sema *s, ms_ast_expr *at) {
    ms_ast_expr *slot = at, *rest = NULL;
    if (at->kind == MS_EXPR_BINARY && (at->op == MS_OP_ADD || at->op == MS_OP_SUB)) {
        slot = at->lhs;
        rest = at->rhs;
    }
    const ms_resource *r = slot->kind == MS_EXPR_MEMBER && slot->lhs != NULL &&
                                   slot->lhs->kind == MS_EXPR_NAME
                               ? find_resource(s, slot->lhs->text)
                               : NULL;
    if (r == NULL || r->kind != MS_RESOURCE_SCRATCH || strcmp(slot->text, "slot") != 0) {
        err(s, at->loc, "'at' takes <scratch>.slot, alone or plus or minus an int (the frame "
            "slot of the step's last rows: a node on a scratch)");
        return;
    }
    if (rest != NULL)
        cexpr_want(s, rest, MS_TYPE_INT, "the offset of 'at'");
}

static void check_stmts(sema *s, ms_forward *f, const ms_ptr_vec *body, bool top, bool *returned) {
    for (int i = 0; i < body->n; i++) {
        ms_ast_stmt *st = body->items[i];
        if (*returned) {
            err(s, st->loc, "statement after return is never run");
            return;
        }
        switch (st->kind) {
        case MS_AST_STMT_ASSIGN:
            check_assign(s, f, st);
            break;
        case MS_AST_STMT_EXPR: {
            if (st->rhs.n != 1) {
                err(s, st->loc, "a list of values does nothing here; bind it with '='");
                break;
            }
            ms_ast_expr *e = st->rhs.items[0];
            fval v = fexpr(s, e);
            if (e->kind != MS_EXPR_CALL)
                err(s, e->loc, "this expression does nothing; bind it with '=' or return it");
            else if (v.t != MS_TYPE_NONE && v.t != MS_TYPE_UNKNOWN)
                err(s, e->loc, "the result of this call is unused; bind it with '='");
            break;
        }
        case MS_AST_STMT_FOR: {
            const ms_group *g = find_group(s, st->group.name);
            if (g == NULL) {
                suggest sg = {st->group.name, NULL, 0};
                for (int k = 0; k < s->m->n_groups; k++)
                    suggest_add(&sg, s->m->groups[k]->name);
                err(s, st->group.loc, "'%s' is not a weight group%s", st->group.name, suggest_text(s, &sg));
            }
            int saved = s->n_binds;
            s->depth++;
            fval lv = fv(g != NULL ? MS_TYPE_LAYER : MS_TYPE_UNKNOWN);
            lv.group = g;
            if (lookup(s, st->var.name) != NULL || find_top_weight(s, st->var.name) != NULL)
                err(s, st->var.loc, "loop variable '%s' hides another name", st->var.name);
            bind(s, st->var.name, lv, MS_SYM_LAYER, 0);
            if (st->at != NULL) {
                /* one member: the body runs once and may end the forward */
                check_for_at(s, st->at);
                check_stmts(s, f, &st->body, top, returned);
                s->depth--;
                unbind_to(s, saved);
                break;
            }
            check_stmts(s, f, &st->body, false, returned);
            if (*returned) {
                err(s, st->loc, "return inside a for loop; return after the loop");
                *returned = false;
            }
            s->depth--;
            unbind_to(s, saved);
            break;
        }
        case MS_AST_STMT_RETURN: {
            if (!top) {
                *returned = true;
                return;
            }
            for (int k = 0; k < st->rhs.n; k++) {
                ms_ast_expr *e = st->rhs.items[k];
                fval v = fexpr(s, e);
                if (v.t != MS_TYPE_TENSOR && v.t != MS_TYPE_UNKNOWN)
                    err(s, e->loc, "a forward returns tensors, got %s", ms_type_str(v.t));
            }
            *returned = true;
            break;
        }
        default:
            break;
        }
    }
}

static void check_forward(sema *s, ms_node *node, ms_forward *f) {
    const ms_ast_forward *af = f->ast;
    s->fwd = af;
    unbind_to(s, 0);
    s->depth = 0;
    const ms_ast_fparam *rows_in = NULL, *ids_in = NULL; /* the shaped float and ids inputs */
    for (int i = 0; i < af->params.n; i++) {
        const ms_ast_fparam *p = af->params.items[i];
        if (p->has_shape) {
            /* the engine stages one shaped float input and one `ids` input at most; both
               together are a row per token each (a code predictor's h rows and codes) */
            const ms_ast_fparam **slot = p->elem.name != NULL ? &ids_in : &rows_in;
            if (*slot != NULL)
                err(s, p->name.loc, "forward parameter '%s': a forward reads at most one shaped "
                    "%s input ('%s' is one)", p->name.name, p->elem.name != NULL ? "ids" : "float",
                    (*slot)->name.name);
            else
                *slot = p;
            if (rows_in != NULL && ids_in != NULL && *slot == p) {
                const ms_ast_fparam *bad = NULL;
                for (int k = 0; k < 2 && bad == NULL; k++) {
                    const ms_ast_fparam *q = k == 0 ? rows_in : ids_in;
                    const ms_ast_expr *d0 = q->shape.n == 2 ? q->shape.items[0] : NULL;
                    if (d0 == NULL || d0->kind != MS_EXPR_NAME || strcmp(d0->text, "_") != 0)
                        bad = q;
                }
                if (bad != NULL)
                    err(s, bad->name.loc, "forward parameter '%s': read together with '%s', "
                        "each input is a row per token: [_, <width>]", bad->name.name,
                        (bad == rows_in ? ids_in : rows_in)->name.name);
            }
        }
        for (int k = 0; k < i; k++) {
            const ms_ast_fparam *q = af->params.items[k];
            if (strcmp(q->name.name, p->name.name) == 0)
                err(s, p->name.loc, "forward parameter '%s' is declared twice", p->name.name);
        }
        fval v;
        if (p->elem.name != NULL && strcmp(p->elem.name, "ids") != 0)
            err(s, p->elem.loc, "forward parameter '%s': element type '%s' (only 'ids': int32 "
                "ids, read by embedding(table, %s, column = <int>))", p->name.name, p->elem.name,
                p->name.name);
        else if (p->elem.name != NULL && p->shape.n != 2)
            err(s, p->name.loc, "forward parameter '%s': ids are [rows, columns], not %d-D",
                p->name.name, p->shape.n);
        if (p->has_shape) {
            v = tensor(s, p->shape.n, NULL);
            for (int k = 0; k < p->shape.n; k++) {
                ms_ast_expr *d = p->shape.items[k];
                if (d->kind == MS_EXPR_NAME && strcmp(d->text, "_") == 0) {
                    d->sym = word_sym(s, "_");
                    continue;
                }
                cexpr_want(s, d, MS_TYPE_INT, "a dimension");
                v.dims[k] = d;
            }
        } else {
            v = tensor(s, 1, NULL); /* token ids [T] */
        }
        bind(s, p->name.name, v, MS_SYM_INPUT, i);
    }
    bool returned = false;
    check_stmts(s, f, &af->body, true, &returned);
    if (!returned)
        err(s, af->result.loc, "forward '%s' never returns '%s'; end it with 'return <value>;'", f->name,
            af->result.name);
    (void)node;
}

/* ---- 3c. steps ---- */

static int label_of(sema *s, const ms_ast_expr *e, const char *what) {
    if (e->kind != MS_EXPR_NAME) {
        err(s, e->loc, "%s must be a label", what);
        return -1;
    }
    ms_label_decl *l = find_label(s->node, e->text);
    if (l == NULL) {
        suggest g = {e->text, NULL, 0};
        for (int i = 0; i < s->node->n_labels; i++)
            suggest_add(&g, s->node->labels[i].name);
        err(s, e->loc, "unknown label '%s' in node '%s'%s (declare it with 'labels %s;')", e->text,
            s->node->name, suggest_text(s, &g), e->text);
        return -1;
    }
    ((ms_ast_expr *)e)->sym = &l->sym;
    return l->index;
}

/* `a -> b` or a list of them. */
static void forks(sema *s, ms_ast_expr *v, ms_fork_decl **out, int *n) {
    int cap = v->kind == MS_EXPR_LIST ? v->args.n : 1;
    *out = NEWN(s, ms_fork_decl, cap);
    *n = 0;
    for (int i = 0; i < cap; i++) {
        ms_ast_expr *f = v->kind == MS_EXPR_LIST ? ((ms_ast_arg *)v->args.items[i])->value : v;
        if (f->kind != MS_EXPR_BINARY || f->op != MS_OP_ARROW) {
            err(s, f->loc, "a fork is written <from label> -> <to label>");
            continue;
        }
        int a = label_of(s, f->lhs, "a fork source");
        int b = label_of(s, f->rhs, "a fork target");
        if (a >= 0 && a == b)
            err(s, f->loc, "a fork from '%s' to itself", f->lhs->text);
        if (a >= 0 && b >= 0 && a != b) {
            (*out)[*n].from = a;
            (*out)[(*n)++].to = b;
        }
    }
}

static void combines(sema *s, ms_ast_expr *v, ms_step_rec *rec) {
    bool many = v->kind == MS_EXPR_LIST && v->args.n > 0 &&
                ((ms_ast_arg *)v->args.items[0])->value->kind == MS_EXPR_BINARY;
    int cap = many ? v->args.n : 1;
    rec->combined = NEWN(s, ms_combined_decl, cap);
    for (int i = 0; i < cap; i++) {
        ms_ast_expr *c = many ? ((ms_ast_arg *)v->args.items[i])->value : v;
        if (c->kind != MS_EXPR_BINARY || c->op != MS_OP_ARROW || c->lhs->kind != MS_EXPR_LIST) {
            err(s, c->loc, "a combined plan label is written [label, label, ...] -> plan_label");
            continue;
        }
        ms_combined_decl *d = &rec->combined[rec->n_combined];
        int n = c->lhs->args.n;
        if (n < 2 || n > MS_MAX_COMBINED_LABELS) {
            err(s, c->lhs->loc, "a combined plan label merges 2 to %d labels, got %d", MS_MAX_COMBINED_LABELS, n);
            continue;
        }
        bool ok = true;
        for (int k = 0; k < n; k++) {
            int l = label_of(s, ((ms_ast_arg *)c->lhs->args.items[k])->value, "a combined label");
            for (int j = 0; j < k && l >= 0; j++)
                if (d->labels[j] == l) {
                    err(s, ((ms_ast_arg *)c->lhs->args.items[k])->value->loc, "label listed twice in a combined plan");
                    ok = false;
                }
            ok = ok && l >= 0;
            d->labels[k] = l;
        }
        d->n_labels = n;
        d->plan_label = label_of(s, c->rhs, "a plan label");
        for (int k = 0; k < n && d->plan_label >= 0; k++)
            if (d->labels[k] == d->plan_label) {
                err(s, c->rhs->loc, "the plan label must differ from the labels it combines");
                ok = false;
            }
        if (ok && d->plan_label >= 0)
            rec->n_combined++;
    }
}

static bool bool_literal(sema *s, const ms_ast_arg *f, bool *out) {
    if (f->value->kind != MS_EXPR_BOOL) {
        err(s, f->value->loc, "'%s' must be true or false", f->name);
        return false;
    }
    f->value->type = MS_TYPE_BOOL;
    *out = f->value->bval;
    return true;
}

static void check_record(sema *s, ms_step_decl *d, const ms_ast_step_item *it) {
    const ms_resource *r = find_resource(s, it->resource.name);
    if (r == NULL) {
        suggest g = {it->resource.name, NULL, 0};
        for (int i = 0; i < s->node->n_resources; i++)
            suggest_add(&g, s->node->resources[i]->name);
        err(s, it->resource.loc, "step '%s' uses undeclared resource '%s'%s", d->name, it->resource.name,
            suggest_text(s, &g));
        return;
    }
    if (r->index >= MS_MAX_RESOURCES)
        return;
    ms_step_rec *rec = &d->recs[r->index];
    if (rec->written) {
        err(s, it->resource.loc, "step '%s' has two records for resource '%s'", d->name, r->name);
        return;
    }
    rec->written = true;
    static const char *const kv_fields[] = {"commit", "combine", "pre_fork", "post_fork", NULL};
    static const char *const attn_fields[] = {"causal", NULL};
    static const char *const pos_fields[] = {"advance", "explicit", NULL};
    static const char *const scratch_fields[] = {"begin", NULL};
    static const char *const none_fields[] = {NULL};
    const char *const *allowed = r->kind == MS_RESOURCE_KV        ? kv_fields
                                 : r->kind == MS_RESOURCE_ATTN    ? attn_fields
                                 : r->kind == MS_RESOURCE_POS     ? pos_fields
                                 : r->kind == MS_RESOURCE_SCRATCH ? scratch_fields
                                                                  : none_fields;
    for (int i = 0; i < it->fields.n; i++) {
        ms_ast_arg *f = it->fields.items[i];
        bool known = false;
        for (int k = 0; allowed[k] != NULL; k++)
            known = known || strcmp(allowed[k], f->name) == 0;
        for (int k = 0; k < i; k++)
            if (strcmp(((ms_ast_arg *)it->fields.items[k])->name, f->name) == 0) {
                err(s, f->name_loc, "field '%s' is given twice", f->name);
                known = false;
                goto next;
            }
        if (!known) {
            ms_strbuf b = {0};
            for (int k = 0; allowed[k] != NULL; k++)
                ms_strbuf_printf(&b, "%s%s", k > 0 ? ", " : "", allowed[k]);
            err(s, f->name_loc, "unknown field '%s' for %s '%s' in a step (%s%s)", f->name, r->spec->ctor, r->name,
                b.data != NULL ? "expected: " : "it takes no fields", b.data != NULL ? b.data : "");
            ms_strbuf_free(&b);
            continue;
        }
        if ((r->kind == MS_RESOURCE_POS || r->kind == MS_RESOURCE_ATTN) && r->kv == NULL &&
            (strcmp(f->name, "advance") == 0 || strcmp(f->name, "explicit") == 0 ||
             (strcmp(f->name, "causal") == 0 && arg_is_true(f->value)))) {
            err(s, f->name_loc, "step '%s': %s '%s' has no kv_pool (it works on the step's own rows): "
                "%s", d->name, r->spec->ctor, r->name,
                strcmp(f->name, "causal") == 0 ? "it is not causal"
                                               : "its positions restart at 0 every step (no advance, no explicit ids)");
            continue;
        }
        if (strcmp(f->name, "commit") == 0)
            bool_literal(s, f, &rec->commit);
        else if (strcmp(f->name, "causal") == 0)
            bool_literal(s, f, &rec->causal);
        else if (strcmp(f->name, "explicit") == 0)
            bool_literal(s, f, &rec->explicit_ids);
        else if (strcmp(f->name, "begin") == 0)
            bool_literal(s, f, &rec->begin_frame);
        else if (strcmp(f->name, "pre_fork") == 0)
            forks(s, f->value, &rec->pre_forks, &rec->n_pre_forks);
        else if (strcmp(f->name, "post_fork") == 0)
            forks(s, f->value, &rec->post_forks, &rec->n_post_forks);
        else if (strcmp(f->name, "combine") == 0)
            combines(s, f->value, rec);
        else if (strcmp(f->name, "advance") == 0) {
            ms_type t = cexpr(s, f->value, CX_SPAN);
            if (t != MS_TYPE_INT && t != MS_TYPE_UNKNOWN)
                err(s, f->value->loc, "advance must be an int, got %s", ms_type_str(t));
            rec->advance = f->value;
        }
    next:;
    }
}

static void check_capture(sema *s, ms_step_decl *d, const ms_ast_step_item *it) {
    if (d->capture != MS_CAPTURE_NONE) {
        err(s, it->loc, "step '%s' declares capture twice", d->name);
        return;
    }
    if (strcmp(it->dim.name, "batch") == 0) {
        d->capture = MS_CAPTURE_BATCH;
    } else if (strcmp(it->dim.name, "tokens") == 0) {
        d->capture = MS_CAPTURE_TOKENS;
    } else {
        err(s, it->dim.loc, "capture buckets are over 'batch' or 'tokens', not '%s'", it->dim.name);
        return;
    }
    int64_t vals[64];
    ms_loc locs[64];
    int n = 0;
    for (int i = 0; i < it->buckets.n; i++) {
        ms_ast_expr *b = it->buckets.items[i];
        if (b->kind == MS_EXPR_INT) {
            if (n < 64) {
                locs[n] = b->loc;
                vals[n++] = b->ival;
            }
            b->type = MS_TYPE_INT;
            continue;
        }
        if (b->kind == MS_EXPR_BINARY && b->op == MS_OP_RANGE && b->lhs->kind == MS_EXPR_INT &&
            b->rhs->kind == MS_EXPR_INT) {
            int64_t lo = b->lhs->ival, hi = b->rhs->ival;
            bool p2 = lo > 0 && hi > 0 && (lo & (lo - 1)) == 0 && (hi & (hi - 1)) == 0;
            if (!p2) {
                err(s, b->loc, "a bucket range a .. b steps by powers of two: both ends must be powers of two");
                continue;
            }
            if (lo > hi) {
                err(s, b->loc, "capture buckets must increase: range %lld .. %lld goes down", (long long)lo,
                    (long long)hi);
                continue;
            }
            for (int64_t v = lo; v <= hi && n < 64; v *= 2) {
                locs[n] = b->loc;
                vals[n++] = v;
            }
            b->type = MS_TYPE_LIST;
            continue;
        }
        err(s, b->loc, "a capture bucket is an integer or a range like 1 .. 256");
    }
    if (n >= 64)
        err(s, it->loc, "at most 64 capture buckets");
    for (int i = 0; i < n; i++) {
        if (vals[i] <= 0) {
            err(s, locs[i], "capture bucket must be positive, got %lld", (long long)vals[i]);
            return;
        }
        if (i > 0 && vals[i] <= vals[i - 1]) {
            err(s, locs[i], "capture buckets must increase: %lld comes after %lld", (long long)vals[i],
                (long long)vals[i - 1]);
            return;
        }
    }
    d->buckets = NEWN(s, int64_t, n);
    memcpy(d->buckets, vals, sizeof *vals * (size_t)n);
    d->n_buckets = n;
}

static void check_step(sema *s, ms_node *node, ms_step_decl *d) {
    const ms_ast_step *as = d->ast;
    s->step = as;
    d->n_inputs = as->params.n;
    d->inputs = NEWN(s, const char *, as->params.n);
    for (int i = 0; i < as->params.n; i++) {
        const ms_ast_ident *p = as->params.items[i];
        d->inputs[i] = p->name;
        for (int k = 0; k < i; k++)
            if (strcmp(d->inputs[k], p->name) == 0)
                err(s, p->loc, "step input '%s' is declared twice", p->name);
    }
    for (int r = 0; r < node->n_resources && r < MS_MAX_RESOURCES; r++) {
        d->recs[r].resource = node->resources[r];
        d->recs[r].commit = true;
        const ms_ast_expr *causal = res_arg_plain(node->resources[r], "causal");
        /* the attention's own default: causal, a dense attention (no kv_pool) not */
        const bool dense = node->resources[r]->kind == MS_RESOURCE_ATTN && node->resources[r]->kv == NULL;
        d->recs[r].causal = node->resources[r]->kind != MS_RESOURCE_ATTN ||
                            (causal == NULL ? !dense : causal->kind != MS_EXPR_BOOL || causal->bval);
    }
    int n_seg = 0;
    for (int i = 0; i < as->items.n; i++) {
        const ms_ast_step_item *it = as->items.items[i];
        if (it->kind == MS_AST_STEP_SEGMENTS)
            n_seg += it->segments.n;
    }
    d->segments = NEWN(s, ms_segment_decl, n_seg);
    const ms_ast_step_item *seg_item = NULL;
    for (int i = 0; i < as->items.n; i++) {
        const ms_ast_step_item *it = as->items.items[i];
        switch (it->kind) {
        case MS_AST_STEP_SEGMENTS:
            seg_item = it;
            for (int k = 0; k < it->segments.n; k++) {
                ms_ast_segment *sg = it->segments.items[k];
                ms_label_decl *l = find_label(node, sg->label.name);
                ms_type t = cexpr(s, sg->span, CX_SPAN);
                if (t != MS_TYPE_INT && t != MS_TYPE_UNKNOWN)
                    err(s, sg->span->loc, "a span is an int, got %s", ms_type_str(t));
                if (sg->span->kind == MS_EXPR_UNARY && sg->span->op == MS_OP_NEG)
                    err(s, sg->span->loc, "a span cannot be negative (0 reads without extending)");
                if (l == NULL) {
                    suggest g = {sg->label.name, NULL, 0};
                    for (int j = 0; j < node->n_labels; j++)
                        suggest_add(&g, node->labels[j].name);
                    err(s, sg->label.loc, "segment on unknown label '%s'%s (declare it with 'labels %s;')",
                        sg->label.name, suggest_text(s, &g), sg->label.name);
                    continue;
                }
                for (int j = 0; j < d->n_segments; j++)
                    if (d->segments[j].label == l->index)
                        err(s, sg->label.loc, "step '%s' has two segments on label '%s'", d->name, l->name);
                d->segments[d->n_segments].label = l->index;
                d->segments[d->n_segments++].span = sg->span;
            }
            break;
        case MS_AST_STEP_CAPTURE:
            check_capture(s, d, it);
            break;
        case MS_AST_STEP_RECORD:
            check_record(s, d, it);
            break;
        default:
            break;
        }
    }
    if (seg_item == NULL && node->n_resources > 0) {
        bool has_kv = false;
        for (int r = 0; r < node->n_resources; r++)
            has_kv = has_kv || node->resources[r]->kind == MS_RESOURCE_KV;
        if (has_kv)
            err(s, as->name.loc, "step '%s' declares no segments (add 'segments main += len(%s);')", d->name,
                d->n_inputs > 0 ? d->inputs[0] : "tokens");
    }
    /* a non-committing KV step must not advance positions */
    for (int r = 0; r < node->n_resources && r < MS_MAX_RESOURCES; r++) {
        const ms_step_rec *kv = &d->recs[r];
        if (kv->resource->kind != MS_RESOURCE_KV || kv->commit)
            continue;
        for (int p = 0; p < node->n_resources && p < MS_MAX_RESOURCES; p++) {
            const ms_step_rec *pos = &d->recs[p];
            if (pos->resource->kind != MS_RESOURCE_POS || pos->resource->kv != kv->resource || pos->advance == NULL)
                continue;
            if (pos->advance->kind == MS_EXPR_INT && pos->advance->ival == 0)
                continue;
            err(s, pos->advance->loc,
                "step '%s' does not commit '%s' (commit = false) but advances positions by %s; a non-committing step must advance by 0",
                d->name, kv->resource->name, ms_expr_str(s->a, pos->advance));
        }
    }
    /* combined labels must come from segments of this step */
    for (int r = 0; r < node->n_resources && r < MS_MAX_RESOURCES; r++) {
        const ms_step_rec *rec = &d->recs[r];
        for (int c = 0; c < rec->n_combined; c++)
            for (int k = 0; k < rec->combined[c].n_labels; k++) {
                bool found = false;
                for (int j = 0; j < d->n_segments; j++)
                    found = found || d->segments[j].label == rec->combined[c].labels[k];
                if (!found)
                    err(s, as->name.loc, "step '%s' combines label '%s' but has no segment on it", d->name,
                        node->labels[rec->combined[c].labels[k]].name);
            }
    }
    /* the forward */
    const ms_forward *fw = ms_strmap_get(&s->forwards, d->name);
    if (fw == NULL)
        fw = ms_strmap_get(&s->forwards, "forward"); /* the unnamed forward ("forward" is a keyword) */
    if (fw == NULL) {
        err(s, as->name.loc, "step '%s' has no forward to run (declare 'forward(...) -> out { ... }' or 'forward %s(...)')",
            d->name, d->name);
    } else {
        d->forward = fw;
        if (fw->n_inputs != d->n_inputs)
            err(s, as->name.loc, "step '%s' has %d input%s but %s takes %d", d->name, d->n_inputs,
                d->n_inputs == 1 ? "" : "s",
                ms_arena_sprintf(s->a, fw->ast->name.name != NULL ? "forward '%s'" : "the forward%s",
                                 fw->ast->name.name != NULL ? fw->name : ""),
                fw->n_inputs);
    }
    s->step = NULL;
}

/* ---- 3. nodes ---- */

static void check_node(sema *s, ms_node *node) {
    const ms_ast_node *an = node->ast;
    s->node = node;
    /* labels */
    node->labels = NEWN(s, ms_label_decl, an->labels.n + 1);
    node->labels[0].name = "main";
    node->n_labels = 1;
    for (int i = 0; i < an->labels.n; i++) {
        const ms_ast_ident *id = an->labels.items[i];
        if (strcmp(id->name, "main") == 0)
            continue; /* implicit; writing it is harmless */
        if (find_label(node, id->name) != NULL) {
            err(s, id->loc, "label '%s' is declared twice", id->name);
            continue;
        }
        if (node->n_labels >= MS_MAX_LABELS) {
            err(s, id->loc, "node '%s' has more than %d labels", node->name, MS_MAX_LABELS);
            break;
        }
        node->labels[node->n_labels].name = id->name;
        node->n_labels++;
    }
    for (int i = 0; i < node->n_labels; i++) {
        node->labels[i].index = i;
        node->labels[i].sym.kind = MS_SYM_LABEL;
        node->labels[i].sym.name = node->labels[i].name;
        node->labels[i].sym.index = i;
    }
    check_resources(s, node, an);
    /* forwards */
    ms_strmap_init(&s->forwards, s->a);
    node->forwards = NEWN(s, ms_forward *, an->forwards.n);
    for (int i = 0; i < an->forwards.n; i++) {
        const ms_ast_forward *af = an->forwards.items[i];
        ms_forward *f = NEW(s, ms_forward);
        f->ast = af;
        f->name = af->name.name != NULL ? af->name.name : "forward";
        f->n_inputs = af->params.n;
        if (ms_strmap_get(&s->forwards, f->name) != NULL) {
            err(s, af->name.name != NULL ? af->name.loc : af->loc, "node '%s' has two forwards named '%s'",
                node->name, f->name);
            continue;
        }
        check_forward(s, node, f);
        node->forwards[node->n_forwards++] = f;
        ms_strmap_put(&s->forwards, f->name, f);
    }
    /* steps */
    node->steps = NEWN(s, ms_step_decl *, an->steps.n);
    for (int i = 0; i < an->steps.n; i++) {
        const ms_ast_step *as = an->steps.items[i];
        const char *key = step_key(s, node, as->name.name);
        if (ms_strmap_get(&s->steps, key) != NULL) {
            err(s, as->name.loc, "step '%s' is declared twice in node '%s'", as->name.name, node->name);
            continue;
        }
        ms_step_decl *d = NEW(s, ms_step_decl);
        d->name = as->name.name;
        d->ast = as;
        check_step(s, node, d);
        node->steps[node->n_steps++] = d;
        ms_strmap_put(&s->steps, key, d);
    }
    if (an->steps.n == 0)
        err(s, an->name.loc, "node '%s' declares no step", node->name);
    s->node = NULL;
}

/* ---- 4. walks ---- */

static void check_walk_item(sema *s, const ms_ast_walk_item *w, int loops) {
    switch (w->kind) {
    case MS_AST_WALK_STEP: {
        const ms_node *n = ms_strmap_get(&s->nodes, w->node.name);
        if (n == NULL) {
            suggest g = {w->node.name, NULL, 0};
            for (int i = 0; i < s->m->n_nodes; i++)
                suggest_add(&g, s->m->nodes[i]->name);
            err(s, w->node.loc, "walk uses unknown node '%s'%s", w->node.name, suggest_text(s, &g));
            return;
        }
        if (ms_strmap_get(&s->steps, step_key(s, n, w->step.name)) == NULL) {
            suggest g = {w->step.name, NULL, 0};
            for (int i = 0; i < n->n_steps; i++)
                suggest_add(&g, n->steps[i]->name);
            err(s, w->step.loc, "node '%s' has no step '%s'%s", n->name, w->step.name, suggest_text(s, &g));
        }
        return;
    }
    case MS_AST_WALK_SEQ:
        for (int i = 0; i < w->items.n; i++)
            check_walk_item(s, w->items.items[i], loops);
        return;
    case MS_AST_WALK_LOOP:
        if (strcmp(w->until.name, "stop") != 0)
            err(s, w->until.loc, "unknown stop condition '%s' (a loop runs until stop: end of sequence or token limit)",
                w->until.name);
        if (loops > 0)
            err(s, w->loc, "loops cannot be nested");
        check_walk_item(s, w->body, loops + 1);
        return;
    default:
        return;
    }
}

/* ---- entry ---- */

ms_status ms_sema_check(ms_arena *arena, ms_diags *diags, const ms_ast_model *ast, ms_model **out) {
    *out = NULL;
    int errors_before = diags->n_errors;
    sema st = {0};
    sema *s = &st;
    s->a = arena;
    s->d = diags;
    s->m = ms_arena_alloc(arena, sizeof(ms_model));
    if (s->m == NULL)
        return MS_ERR_OOM;
    s->m->ast = ast;
    s->m->name = ast->name.name;
    s->builtin_sym = NEW(s, ms_ast_sym);
    s->builtin_sym->kind = MS_SYM_BUILTIN;
    s->builtin_sym->name = "builtin";
    ms_strmap *maps[] = {&s->params, &s->weights, &s->groups, &s->members, &s->nodes, &s->steps,
                         &s->resources, &s->bind_map};
    for (size_t i = 0; i < MS_ARRAY_LEN(maps); i++)
        ms_strmap_init(maps[i], arena);

    check_config(s);
    check_weights(s);
    s->m->nodes = NEWN(s, ms_node *, ast->nodes.n);
    for (int i = 0; i < ast->nodes.n; i++) {
        const ms_ast_node *an = ast->nodes.items[i];
        if (ms_strmap_get(&s->nodes, an->name.name) != NULL) {
            err(s, an->name.loc, "node '%s' is declared twice", an->name.name);
            continue;
        }
        ms_node *n = NEW(s, ms_node);
        n->name = an->name.name;
        n->ast = an;
        s->m->nodes[s->m->n_nodes++] = n;
        ms_strmap_put(&s->nodes, n->name, n);
    }
    for (int i = 0; i < s->m->n_nodes; i++)
        check_node(s, s->m->nodes[i]);
    if (s->m->n_nodes == 0)
        err(s, ast->name.loc, "model '%s' declares no node", s->m->name);
    s->m->walks = NEWN(s, ms_walk *, ast->walks.n);
    ms_strmap walks;
    ms_strmap_init(&walks, s->a);
    for (int i = 0; i < ast->walks.n; i++) {
        const ms_ast_walk *aw = ast->walks.items[i];
        if (ms_strmap_get(&walks, aw->name.name) != NULL)
            err(s, aw->name.loc, "walk '%s' is declared twice", aw->name.name);
        else
            ms_strmap_put(&walks, aw->name.name, (void *)aw);
        check_walk_item(s, aw->body, 0);
        ms_walk *w = NEW(s, ms_walk);
        w->name = aw->name.name;
        w->ast = aw;
        w->body = aw->body;
        s->m->walks[s->m->n_walks++] = w;
    }
    /* A declared weight nobody reads is a typo or dead weight (it would still be loaded onto the
     * device). Checked only on an otherwise clean model: an error in a forward can hide a use. */
    if (diags->n_errors == errors_before) {
        for (int i = 0; i < s->m->n_weights; i++)
            if (s->m->weights[i]->used && s->m->weights[i]->tie != NULL)
                ((ms_weight *)s->m->weights[i]->tie)->used = true;
        for (int i = 0; i < s->m->n_weights; i++) {
            const ms_weight *w = s->m->weights[i];
            if (!w->used)
                err(s, w->ast->name.loc, "weight '%s%s%s' is never used: no forward or resource reads it",
                    w->group != NULL ? w->group->name : "", w->group != NULL ? "." : "", w->name);
        }
    }
    if (diags->n_errors > errors_before || diags->stopped || diags->oom)
        return MS_ERR_PARSE;
    *out = s->m;
    return MS_OK;
}
