/*
 * ast.c - builders of the syntax tree, called only from grammar actions (grammar.y).
 *
 * Builders never fail: they allocate from the parse arena, which longjmps to the parse driver
 * when memory runs out (arena.h). They copy locations and link children; no analysis here.
 */
#include "parse_impl.h"

#include <string.h>

#define NEW(ctx, T) ((T *)ms_arena_alloc((ctx)->arena, sizeof(T)))

const char *ms_op_str(ms_op op) {
    /* ORDER MS_OP */
    static const char *const names[MS_OP_COUNT] = {
        "+", "-", "*", "/", "%", "==", "!=", "<", "<=", ">", ">=", "&&", "||", "->", "..", "-", "!",
    };
    return (unsigned)op < MS_OP_COUNT ? names[op] : "?";
}

/* ---- expressions ---- */

static ms_ast_expr *expr_new(ms_parse_ctx *ctx, ms_expr_kind kind, ms_loc loc) {
    ms_ast_expr *e = NEW(ctx, ms_ast_expr);
    e->kind = kind;
    e->loc = loc;
    e->height = 1;
    return e;
}

static int height_of(const ms_ast_expr *e) { return e != NULL ? e->height : 0; }

static int args_height(const ms_ptr_vec *args) {
    int h = 0;
    for (int i = 0; i < args->n; i++) {
        const ms_ast_arg *a = args->items[i];
        if (a != NULL && height_of(a->value) > h)
            h = height_of(a->value);
    }
    return h;
}

/*
 * Bound the tree height so that the recursive checks, evaluators and code generators cannot
 * overflow the stack on an operator chain of any length (`1 + 1 + ... + 1` is left-recursive:
 * it never deepens the parser's stack nor the bracket count). Past the limit the error is
 * reported once per file and the builder returns `keep` (an operand) instead of a new node, so
 * the tree stays bounded and the rest of the file is still checked.
 */
static ms_ast_expr *bounded(ms_parse_ctx *ctx, ms_ast_expr *e, ms_ast_expr *keep) {
    if (e->height <= MS_PARSE_MAX_EXPR_HEIGHT)
        return e;
    if (!ctx->expr_too_deep) {
        ctx->expr_too_deep = true;
        ms_diags_error(ctx->diags, e->loc, "expression nested deeper than %d levels "
                       "(split it with 'let' parameters or forward names)", MS_PARSE_MAX_EXPR_HEIGHT);
    }
    return keep != NULL ? keep : e;
}

ms_ast_expr *ms_ast_int(ms_parse_ctx *ctx, ms_loc loc, int64_t v) {
    ms_ast_expr *e = expr_new(ctx, MS_EXPR_INT, loc);
    e->ival = v;
    return e;
}

ms_ast_expr *ms_ast_float(ms_parse_ctx *ctx, ms_loc loc, double v) {
    ms_ast_expr *e = expr_new(ctx, MS_EXPR_FLOAT, loc);
    e->fval = v;
    return e;
}

ms_ast_expr *ms_ast_bool(ms_parse_ctx *ctx, ms_loc loc, bool v) {
    ms_ast_expr *e = expr_new(ctx, MS_EXPR_BOOL, loc);
    e->bval = v;
    return e;
}

ms_ast_expr *ms_ast_string(ms_parse_ctx *ctx, ms_loc loc, const char *s) {
    ms_ast_expr *e = expr_new(ctx, MS_EXPR_STRING, loc);
    e->text = s;
    return e;
}

ms_ast_expr *ms_ast_none(ms_parse_ctx *ctx, ms_loc loc) { return expr_new(ctx, MS_EXPR_NONE, loc); }

ms_ast_expr *ms_ast_name(ms_parse_ctx *ctx, ms_loc loc, const char *name) {
    ms_ast_expr *e = expr_new(ctx, MS_EXPR_NAME, loc);
    e->text = name;
    return e;
}

ms_ast_expr *ms_ast_member(ms_parse_ctx *ctx, ms_loc loc, ms_ast_expr *obj, const char *field) {
    ms_ast_expr *e = expr_new(ctx, MS_EXPR_MEMBER, loc);
    e->lhs = obj;
    e->text = field;
    e->height = 1 + height_of(obj);
    return bounded(ctx, e, obj);
}

ms_ast_expr *ms_ast_call(ms_parse_ctx *ctx, ms_loc loc, ms_ast_expr *callee, ms_ptr_vec *args) {
    ms_ast_expr *e = expr_new(ctx, MS_EXPR_CALL, loc);
    e->lhs = callee;
    e->args = *args;
    e->height = 1 + (height_of(callee) > args_height(args) ? height_of(callee) : args_height(args));
    return bounded(ctx, e, NULL); /* arguments nest only inside brackets, which are bounded */
}

ms_ast_expr *ms_ast_unary(ms_parse_ctx *ctx, ms_loc loc, ms_op op, ms_ast_expr *a) {
    ms_ast_expr *e = expr_new(ctx, MS_EXPR_UNARY, loc);
    e->op = op;
    e->lhs = a;
    e->height = 1 + height_of(a);
    return bounded(ctx, e, a);
}

ms_ast_expr *ms_ast_binary(ms_parse_ctx *ctx, ms_loc loc, ms_op op, ms_ast_expr *a, ms_ast_expr *b) {
    ms_ast_expr *e = expr_new(ctx, MS_EXPR_BINARY, loc);
    e->op = op;
    e->lhs = a;
    e->rhs = b;
    e->height = 1 + (height_of(a) > height_of(b) ? height_of(a) : height_of(b));
    return bounded(ctx, e, a);
}

ms_ast_expr *ms_ast_cond(ms_parse_ctx *ctx, ms_loc loc, ms_ast_expr *c, ms_ast_expr *a, ms_ast_expr *b) {
    ms_ast_expr *e = expr_new(ctx, MS_EXPR_COND, loc);
    e->cond = c;
    e->lhs = a;
    e->rhs = b;
    int h = height_of(c) > height_of(a) ? height_of(c) : height_of(a);
    e->height = 1 + (h > height_of(b) ? h : height_of(b));
    return bounded(ctx, e, a);
}

ms_ast_expr *ms_ast_list(ms_parse_ctx *ctx, ms_loc loc, ms_ptr_vec *items) {
    ms_ast_expr *e = expr_new(ctx, MS_EXPR_LIST, loc);
    e->args = *items;
    e->height = 1 + args_height(items);
    return bounded(ctx, e, NULL);
}

ms_ast_arg *ms_ast_arg_new(ms_parse_ctx *ctx, ms_loc name_loc, const char *name, ms_ast_expr *v) {
    ms_ast_arg *a = NEW(ctx, ms_ast_arg);
    a->name = name;
    a->name_loc = name_loc;
    a->value = v;
    return a;
}

ms_ast_ident *ms_ast_ident_new(ms_parse_ctx *ctx, ms_loc loc, const char *name) {
    ms_ast_ident *i = NEW(ctx, ms_ast_ident);
    i->name = name;
    i->loc = loc;
    return i;
}

ms_ast_ident *ms_ast_list_type(ms_parse_ctx *ctx, ms_loc loc, ms_ast_ident *elem) {
    size_t n = strlen(elem->name);
    char *name = ms_arena_alloc(ctx->arena, n + 3);
    memcpy(name, elem->name, n);
    memcpy(name + n, "[]", 3);
    return ms_ast_ident_new(ctx, loc, name);
}

/* ---- lists ---- */

ms_ptr_vec *ms_ast_vec(ms_parse_ctx *ctx) { return NEW(ctx, ms_ptr_vec); }

ms_ptr_vec *ms_ast_vec1(ms_parse_ctx *ctx, void *item) {
    return ms_ast_vec_push(ctx, ms_ast_vec(ctx), item);
}

ms_ptr_vec *ms_ast_vec_push(ms_parse_ctx *ctx, ms_ptr_vec *v, void *item) {
    /* The arena longjmps on OOM, so the status is always MS_OK here. */
    (void)ms_ptr_vec_push(ctx->arena, v, item);
    return v;
}

/* ---- model ---- */

static ms_ast_model *model(ms_parse_ctx *ctx) {
    if (ctx->model == NULL)
        ctx->model = NEW(ctx, ms_ast_model);
    return ctx->model;
}

static void append_all(ms_parse_ctx *ctx, ms_ptr_vec *dst, const ms_ptr_vec *src) {
    for (int i = 0; i < src->n; i++)
        ms_ast_vec_push(ctx, dst, src->items[i]);
}

ms_ast_param *ms_ast_param_new(ms_parse_ctx *ctx, ms_loc loc, bool derived, ms_ast_ident *name,
                               ms_ast_ident *type, bool optional, ms_ast_expr *dflt,
                               ms_ptr_vec *sources) {
    ms_ast_param *p = NEW(ctx, ms_ast_param);
    p->loc = loc;
    p->derived = derived;
    p->name = *name;
    p->type = *type;
    p->optional = optional;
    p->dflt = dflt;
    p->sources = *sources;
    return p;
}

void ms_ast_model_add_params(ms_parse_ctx *ctx, ms_ptr_vec *params) {
    append_all(ctx, &model(ctx)->params, params);
}

void ms_ast_model_add_weights(ms_parse_ctx *ctx, ms_ptr_vec *weights) {
    append_all(ctx, &model(ctx)->weights, weights);
}

void ms_ast_model_add_node(ms_parse_ctx *ctx, ms_ast_node *node) {
    ms_ast_vec_push(ctx, &model(ctx)->nodes, node);
}

void ms_ast_model_add_walk(ms_parse_ctx *ctx, ms_ast_walk *walk) {
    ms_ast_vec_push(ctx, &model(ctx)->walks, walk);
}

void ms_ast_model_finish(ms_parse_ctx *ctx, ms_loc loc, ms_ast_ident *name) {
    ms_ast_model *m = model(ctx);
    m->name = *name;
    m->loc = loc;
}

/* ---- weights ---- */

ms_ast_weight *ms_ast_weight_suffix(ms_parse_ctx *ctx, ms_ast_ident *tie, ms_ast_expr *tie_cond,
                                    bool optional) {
    ms_ast_weight *w = NEW(ctx, ms_ast_weight);
    if (tie != NULL)
        w->tie = *tie;
    w->tie_cond = tie_cond;
    w->optional = optional;
    return w;
}

ms_ast_weight *ms_ast_weight_tensor(ms_parse_ctx *ctx, ms_loc loc, ms_ast_ident *name,
                                    ms_ptr_vec *names, ms_ptr_vec *shape, ms_ast_weight *suffix) {
    (void)ctx;
    ms_ast_weight *w = suffix;
    w->kind = MS_AST_WEIGHT_TENSOR;
    w->loc = loc;
    w->name = *name;
    w->names = *names;
    w->shape = *shape;
    return w;
}

ms_ast_weight *ms_ast_weight_ignore(ms_parse_ctx *ctx, ms_loc loc, ms_ptr_vec *patterns) {
    ms_ast_weight *w = NEW(ctx, ms_ast_weight);
    w->kind = MS_AST_WEIGHT_IGNORE;
    w->loc = loc;
    w->names = *patterns;
    return w;
}

ms_ast_weight *ms_ast_weight_group(ms_parse_ctx *ctx, ms_loc loc, ms_ast_ident *name,
                                   ms_ast_ident *index, ms_ast_expr *count, ms_ptr_vec *members) {
    ms_ast_weight *w = NEW(ctx, ms_ast_weight);
    w->kind = MS_AST_WEIGHT_GROUP;
    w->loc = loc;
    w->name = *name;
    w->index = *index;
    w->count = count;
    w->members = *members;
    return w;
}

/* ---- nodes ---- */

ms_ast_node *ms_ast_node_new(ms_parse_ctx *ctx) { return NEW(ctx, ms_ast_node); }

static void node_order(ms_parse_ctx *ctx, ms_ast_node *n, ms_ast_node_item_kind kind, void *item) {
    ms_ast_node_item *it = NEW(ctx, ms_ast_node_item);
    it->kind = kind;
    it->item = item;
    ms_ast_vec_push(ctx, &n->order, it);
}

ms_ast_node *ms_ast_node_add_labels(ms_parse_ctx *ctx, ms_ast_node *n, ms_ptr_vec *labels) {
    append_all(ctx, &n->labels, labels);
    node_order(ctx, n, MS_AST_NODE_LABELS, labels);
    return n;
}

ms_ast_node *ms_ast_node_add_resource(ms_parse_ctx *ctx, ms_ast_node *n, ms_loc loc,
                                      ms_ast_ident *name, ms_ast_expr *ctor) {
    ms_ast_resource *r = NEW(ctx, ms_ast_resource);
    r->name = *name;
    r->ctor = ctor;
    /* The span of a resource declaration starts at `resource`, not at the node's first item. */
    r->loc = loc;
    r->loc.first_line = name->loc.first_line;
    r->loc.first_column = name->loc.first_column;
    ms_ast_vec_push(ctx, &n->resources, r);
    node_order(ctx, n, MS_AST_NODE_RESOURCE, r);
    return n;
}

ms_ast_node *ms_ast_node_add_step(ms_parse_ctx *ctx, ms_ast_node *n, ms_ast_step *s) {
    ms_ast_vec_push(ctx, &n->steps, s);
    node_order(ctx, n, MS_AST_NODE_STEP, s);
    return n;
}

ms_ast_node *ms_ast_node_add_forward(ms_parse_ctx *ctx, ms_ast_node *n, ms_ast_forward *f) {
    ms_ast_vec_push(ctx, &n->forwards, f);
    node_order(ctx, n, MS_AST_NODE_FORWARD, f);
    return n;
}

ms_ast_node *ms_ast_node_finish(ms_parse_ctx *ctx, ms_ast_node *n, ms_loc loc, ms_ast_ident *name) {
    (void)ctx;
    n->name = *name;
    n->loc = loc;
    return n;
}

ms_ast_segment *ms_ast_segment_new(ms_parse_ctx *ctx, ms_ast_ident *label, ms_ast_expr *span) {
    ms_ast_segment *s = NEW(ctx, ms_ast_segment);
    s->label = *label;
    s->span = span;
    return s;
}

ms_ast_step_item *ms_ast_step_segments(ms_parse_ctx *ctx, ms_loc loc, ms_ptr_vec *segments) {
    ms_ast_step_item *it = NEW(ctx, ms_ast_step_item);
    it->kind = MS_AST_STEP_SEGMENTS;
    it->loc = loc;
    it->segments = *segments;
    return it;
}

ms_ast_step_item *ms_ast_step_capture(ms_parse_ctx *ctx, ms_loc loc, ms_ast_ident *dim,
                                      ms_ptr_vec *buckets) {
    ms_ast_step_item *it = NEW(ctx, ms_ast_step_item);
    it->kind = MS_AST_STEP_CAPTURE;
    it->loc = loc;
    it->dim = *dim;
    it->buckets = *buckets;
    return it;
}

ms_ast_step_item *ms_ast_step_record(ms_parse_ctx *ctx, ms_loc loc, ms_ast_ident *resource,
                                     ms_ptr_vec *fields) {
    ms_ast_step_item *it = NEW(ctx, ms_ast_step_item);
    it->kind = MS_AST_STEP_RECORD;
    it->loc = loc;
    it->resource = *resource;
    it->fields = *fields;
    return it;
}

ms_ast_arg *ms_ast_field(ms_parse_ctx *ctx, ms_loc loc, const char *name, ms_ast_expr *value) {
    if (value == NULL)
        value = ms_ast_bool(ctx, loc, true);
    return ms_ast_arg_new(ctx, loc, name, value);
}

ms_ast_step *ms_ast_step_new(ms_parse_ctx *ctx, ms_loc loc, ms_ast_ident *name, ms_ptr_vec *params,
                             ms_ptr_vec *items) {
    ms_ast_step *s = NEW(ctx, ms_ast_step);
    s->loc = loc;
    s->name = *name;
    s->params = *params;
    s->items = *items;
    return s;
}

/* ---- forward ---- */

static ms_ast_stmt *stmt_new(ms_parse_ctx *ctx, ms_ast_stmt_kind kind, ms_loc loc) {
    ms_ast_stmt *s = NEW(ctx, ms_ast_stmt);
    s->kind = kind;
    s->loc = loc;
    return s;
}

ms_ast_stmt *ms_ast_stmt_assign(ms_parse_ctx *ctx, ms_loc loc, ms_ptr_vec *lhs, ms_ptr_vec *rhs) {
    ms_ast_stmt *s = stmt_new(ctx, MS_AST_STMT_ASSIGN, loc);
    s->lhs = *lhs;
    s->rhs = *rhs;
    return s;
}

ms_ast_stmt *ms_ast_stmt_expr(ms_parse_ctx *ctx, ms_loc loc, ms_ptr_vec *exprs) {
    ms_ast_stmt *s = stmt_new(ctx, MS_AST_STMT_EXPR, loc);
    s->rhs = *exprs;
    return s;
}

ms_ast_stmt *ms_ast_stmt_for(ms_parse_ctx *ctx, ms_loc loc, ms_ast_ident *var, ms_ast_ident *group,
                             ms_ptr_vec *body) {
    ms_ast_stmt *s = stmt_new(ctx, MS_AST_STMT_FOR, loc);
    s->var = *var;
    s->group = *group;
    s->body = *body;
    return s;
}

ms_ast_stmt *ms_ast_stmt_for_at(ms_parse_ctx *ctx, ms_loc loc, ms_ast_ident *var,
                                ms_ast_ident *group, ms_ast_ident *word, ms_ast_expr *at,
                                ms_ptr_vec *body) {
    ms_ast_stmt *s = ms_ast_stmt_for(ctx, loc, var, group, body);
    if (strcmp(word->name, "at") != 0)
        ms_diags_error(ctx->diags, word->loc, "expected 'at' or '{' after 'for %s in %s', got "
                       "'%s'", var->name, group->name, word->name);
    s->at = at;
    return s;
}

ms_ast_stmt *ms_ast_stmt_return(ms_parse_ctx *ctx, ms_loc loc, ms_ptr_vec *values) {
    ms_ast_stmt *s = stmt_new(ctx, MS_AST_STMT_RETURN, loc);
    s->rhs = *values;
    return s;
}

ms_ast_fparam *ms_ast_fparam_new(ms_parse_ctx *ctx, ms_ast_ident *name, ms_ptr_vec *shape) {
    ms_ast_fparam *p = NEW(ctx, ms_ast_fparam);
    p->name = *name;
    if (shape != NULL) {
        p->shape = *shape;
        p->has_shape = true;
    }
    return p;
}

ms_ast_forward *ms_ast_forward_new(ms_parse_ctx *ctx, ms_loc loc, ms_ast_ident *name,
                                   ms_ptr_vec *params, ms_ast_ident *result, ms_ptr_vec *body) {
    ms_ast_forward *f = NEW(ctx, ms_ast_forward);
    f->loc = loc;
    if (name != NULL)
        f->name = *name;
    f->params = *params;
    f->result = *result;
    f->body = *body;
    return f;
}

/* ---- walks ---- */

ms_ast_walk_item *ms_ast_walk_step(ms_parse_ctx *ctx, ms_loc loc, ms_ast_ident *node,
                                   ms_ast_ident *step) {
    ms_ast_walk_item *w = NEW(ctx, ms_ast_walk_item);
    w->kind = MS_AST_WALK_STEP;
    w->loc = loc;
    w->node = *node;
    w->step = *step;
    return w;
}

ms_ast_walk_item *ms_ast_walk_seq(ms_parse_ctx *ctx, ms_loc loc, ms_ast_walk_item *a,
                                  ms_ast_walk_item *b) {
    if (a->kind == MS_AST_WALK_SEQ) {
        /* a then b then c: one flat sequence */
        ms_ast_vec_push(ctx, &a->items, b);
        a->loc = loc;
        return a;
    }
    ms_ast_walk_item *w = NEW(ctx, ms_ast_walk_item);
    w->kind = MS_AST_WALK_SEQ;
    w->loc = loc;
    ms_ast_vec_push(ctx, &w->items, a);
    ms_ast_vec_push(ctx, &w->items, b);
    return w;
}

ms_ast_walk_item *ms_ast_walk_loop(ms_parse_ctx *ctx, ms_loc loc, ms_ast_walk_item *body,
                                   ms_ast_ident *until) {
    ms_ast_walk_item *w = NEW(ctx, ms_ast_walk_item);
    w->kind = MS_AST_WALK_LOOP;
    w->loc = loc;
    w->body = body;
    w->until = *until;
    return w;
}

ms_ast_walk *ms_ast_walk_new(ms_parse_ctx *ctx, ms_loc loc, ms_ast_ident *name,
                             ms_ast_walk_item *body) {
    ms_ast_walk *w = NEW(ctx, ms_ast_walk);
    w->loc = loc;
    w->name = *name;
    w->body = body;
    return w;
}

void ms_ast_discard(ms_parse_ctx *ctx, const void *value) {
    (void)value;
    ctx->n_discarded++;
}
