/*
 * lower_check.c - refuse, with file:line:col, the constructs of a checked model that the code
 * generator cannot lower yet (see lower_check.h). One place lists them, so the generator's
 * lowering code does not have to notice each one it would otherwise skip.
 */
#include "lower_check.h"

#include "print.h"

#include <string.h>

/* The builtins the generator lowers (codegen.c, lower): silu only as silu(a) * b, transpose
 * only of a node's shaped input. */
static const char *const LOWERED_BUILTINS[] = {
    "embedding", "rms_norm", "head_rms_norm", "linear", "silu", "layer_norm", "gelu", "conv1d",
    "transpose", NULL,
};

typedef struct lcheck {
    const char *source;
    ms_error *err;
    bool failed;                /* a construct was refused (err filled) */
    bool oom;                   /* a text buffer could not grow: MS_ERR_OOM, not a refusal */
} lcheck;

static void refuse(lcheck *c, ms_loc loc, const char *fmt, ...) MS_PRINTF(3, 4);
static void refuse(lcheck *c, ms_loc loc, const char *fmt, ...) {
    if (c->failed)
        return; /* the first construct in source order is reported */
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    MS_FAIL(c->err, MS_ERR_UNSUPPORTED, "%s:%d:%d: %s", c->source, loc.first_line, loc.first_column, msg);
    c->failed = true;
}

/* A resource argument, NULL when not given (or not a key of this constructor). */
static const ms_ast_expr *arg_of(const ms_resource *r, const char *key) {
    for (int k = 0; k < MS_RES_MAX_KEYS && r->spec->keys[k].name != NULL; k++)
        if (strcmp(r->spec->keys[k].name, key) == 0)
            return r->args[k];
    return NULL;
}

/* The first leaf of e (both branches of conditionals) that is the word `word`, or NULL. */
static const ms_ast_expr *find_word(const ms_ast_expr *e, const char *word) {
    if (e == NULL)
        return NULL;
    if (e->kind == MS_EXPR_COND) {
        const ms_ast_expr *a = find_word(e->lhs, word);
        return a != NULL ? a : find_word(e->rhs, word);
    }
    return e->kind == MS_EXPR_NAME && strcmp(e->text, word) == 0 ? e : NULL;
}

/* Whether e is the literal 0 (0 or 0.0: soft_cap off). */
static bool is_zero(const ms_ast_expr *e) {
    return (e->kind == MS_EXPR_INT && e->ival == 0) || (e->kind == MS_EXPR_FLOAT && e->fval == 0.0);
}

static void check_resource(lcheck *c, const ms_resource *r) {
    switch (r->kind) {
    case MS_RESOURCE_CROSS: /* lowered: xattn.write of the context rows, xattn.run */
        return;
    case MS_RESOURCE_SCRATCH: {
        /* [scratch] lowered as the node's KV (ms_scratch_kv: a frame of shape[0] slots per
           batch row, emptied when a step begins a frame): code.run is attention over it */
        const ms_ast_expr *shape = arg_of(r, "shape");
        if (shape == NULL || shape->kind != MS_EXPR_LIST || shape->args.n != 3)
            refuse(c, shape != NULL ? shape->loc : r->ast->name.loc, "scratch '%s': mstarc build "
                   "lowers shape = [positions, kv_heads, head_dim] (a list of three) only",
                   r->name);
        else if (arg_of(r, "layers") == NULL)
            refuse(c, r->ast->name.loc, "scratch '%s': mstarc build needs layers = <count> (the "
                   "layers its KV holds)", r->name);
        else if (arg_of(r, "q_heads") == NULL)
            refuse(c, r->ast->name.loc, "scratch '%s': mstarc build needs q_heads = <count> (the "
                   "query heads of code.run)", r->name);
        return;
    }
    case MS_RESOURCE_POS: {
        /* rope and learned tables (positions(kv, table = ...), read by pos.embed) are lowered */
        const ms_ast_expr *block = find_word(arg_of(r, "scheme"), "block");
        if (block != NULL)
            refuse(c, block->loc, "%s '%s': scheme = block is not lowered by mstarc build yet", r->spec->ctor,
                   r->name);
        return;
    }
    case MS_RESOURCE_ATTN: {
        const ms_ast_expr *cap = arg_of(r, "soft_cap");
        if (cap != NULL && !is_zero(cap))
            refuse(c, cap->loc, "attention '%s': soft_cap (logit soft-capping) is not lowered by mstarc "
                   "build yet", r->name);
        return;
    }
    default:
        return;
    }
}

/* The text of a window-valued argument with window(W) written as W (a retention and an attention
 * window compare equal when they hold the same values under the same conditions). */
static void window_text(ms_strbuf *b, const ms_ast_expr *e) {
    if (e->kind == MS_EXPR_COND) {
        ms_strbuf_puts(b, "(");
        ms_expr_print(b, e->cond);
        ms_strbuf_puts(b, " ? ");
        window_text(b, e->lhs);
        ms_strbuf_puts(b, " : ");
        window_text(b, e->rhs);
        ms_strbuf_puts(b, ")");
        return;
    }
    if (e->kind == MS_EXPR_CALL && e->lhs->kind == MS_EXPR_NAME && strcmp(e->lhs->text, "window") == 0 &&
        e->args.n == 1) {
        window_text(b, ((const ms_ast_arg *)e->args.items[0])->value);
        return;
    }
    ms_expr_print(b, e);
}

/* The engine has one window (ms_md_facts.window, the attention's) for masking and for releasing
 * KV pages, so a kv_pool retention is lowered only when it is that same window. */
static void check_retention(lcheck *c, const ms_node *node) {
    for (int r = 0; r < node->n_resources; r++) {
        const ms_resource *kv = node->resources[r];
        const ms_ast_expr *ret = kv->kind == MS_RESOURCE_KV ? arg_of(kv, "retention") : NULL;
        if (ret == NULL || ret->kind == MS_EXPR_NONE)
            continue;
        for (int a = 0; a < node->n_resources; a++) {
            const ms_resource *at = node->resources[a];
            if (at->kind != MS_RESOURCE_ATTN || at->kv != kv)
                continue;
            const ms_ast_expr *win = arg_of(at, "window");
            ms_strbuf x = {0}, y = {0};
            window_text(&x, ret);
            if (win != NULL)
                window_text(&y, win);
            bool same = win != NULL && x.data != NULL && y.data != NULL && strcmp(x.data, y.data) == 0;
            c->oom = c->oom || x.oom || y.oom;
            ms_strbuf_free(&x);
            ms_strbuf_free(&y);
            if (!same && !c->oom)
                refuse(c, ret->loc, "kv_pool '%s': a retention other than attention '%s''s window is not "
                       "lowered by mstarc build yet (the engine releases KV pages by the attention window)",
                       kv->name, at->name);
        }
    }
}

/* Whether node n declares a sampler (its forward returns logits). */
static bool has_sampler(const ms_node *n) {
    for (int r = 0; r < n->n_resources; r++)
        if (n->resources[r]->kind == MS_RESOURCE_SAMPLER)
            return true;
    return false;
}

/* Whether node n declares a cross resource (its forward may read the context rows). */
static bool has_cross(const ms_node *n) {
    for (int r = 0; r < n->n_resources; r++)
        if (n->resources[r]->kind == MS_RESOURCE_CROSS)
            return true;
    return false;
}

/* Whether node n attends over a scratch KV (a code predictor). */
static bool has_scratch(const ms_node *n) {
    for (int r = 0; r < n->n_resources; r++)
        if (n->resources[r]->kind == MS_RESOURCE_SCRATCH)
            return true;
    return false;
}

/* The engine passes one list of token ids to the forward, plus one 2-D input: an encoder's
 * features (a node without a sampler, ms_engine_encode) or the context rows a node's cross
 * resource writes (another node's output); [scratch] a node on a scratch may read a float row
 * and a row of ids per token together (sema checks them: one of each, `_` rows). */
static void check_inputs(lcheck *c, const ms_node *node, const ms_forward *f) {
    const ms_ast_forward *af = f->ast;
    int n_shaped = 0, n_ids = 0;
    const ms_ast_fparam *p0 = af->params.n == 2 ? af->params.items[0] : NULL;
    const ms_ast_fparam *p1 = af->params.n == 2 ? af->params.items[1] : NULL;
    if (has_scratch(node) && !has_sampler(node) && p0 != NULL && p0->has_shape &&
        p1->has_shape && (p0->elem.name != NULL) != (p1->elem.name != NULL))
        return; /* a code predictor's h rows and frame codes (ms_engine_run_rows_codes_pick) */
    for (int i = 0; i < af->params.n; i++) {
        const ms_ast_fparam *p = af->params.items[i];
        n_shaped += p->has_shape;
        n_ids += !p->has_shape;
        /* [inputs_embeds] a sampling node without a cross resource may take one 2-D input
           instead of token ids: one row per token of the step (check_embeds) */
        bool embeds = has_sampler(node) && !has_cross(node);
        if (p->has_shape && (p->shape.n != 2 || n_shaped > 1 || (embeds && af->params.n != 1)))
            refuse(c, p->name.loc, "forward parameter '%s' is a shaped tensor; mstarc build lowers "
                   "forwards over token ids, one 2-D input of a node without a sampler, or one "
                   "[_, width] input alone (a row per token) of a sampling node only yet",
                   p->name.name);
        else if (p->has_shape && embeds && p->shape.items[0] != NULL &&
                 !(((const ms_ast_expr *)p->shape.items[0])->kind == MS_EXPR_NAME &&
                   strcmp(((const ms_ast_expr *)p->shape.items[0])->text, "_") == 0))
            refuse(c, ((const ms_ast_expr *)p->shape.items[0])->loc, "forward parameter '%s': "
                   "the rows of a sampling node's input are the step's tokens: declare them `_`",
                   p->name.name);
        else if (p->elem.name != NULL && !embeds)
            refuse(c, p->elem.loc, "forward parameter '%s': mstarc build lowers a row of ids "
                   "per token ([codes]) for a sampling node without a cross resource only yet",
                   p->name.name);
        else if (!p->has_shape && n_ids > 1)
            refuse(c, p->name.loc, "forward parameter '%s': mstarc build lowers forwards of one "
                   "token input yet", p->name.name);
    }
}

static void check_expr(lcheck *c, const ms_ast_expr *e) {
    if (e == NULL || c->failed)
        return;
    if (e->kind == MS_EXPR_CALL && e->lhs->kind == MS_EXPR_NAME && e->lhs->sym != NULL &&
        e->lhs->sym->kind == MS_SYM_BUILTIN) {
        bool lowered = false;
        for (int i = 0; LOWERED_BUILTINS[i] != NULL; i++)
            lowered = lowered || strcmp(LOWERED_BUILTINS[i], e->lhs->text) == 0;
        if (!lowered && !c->failed) {
            ms_strbuf b = {0};
            ms_expr_print(&b, e);
            c->oom = c->oom || b.oom;
            if (!c->oom)
                refuse(c, e->loc, "cannot lower '%.200s' yet: mstarc build lowers the builtins embedding, "
                       "rms_norm, head_rms_norm, layer_norm, linear, silu(a) * b, gelu, conv1d and "
                       "transpose (of a shaped input), not %s", b.data != NULL ? b.data : "",
                       e->lhs->text);
            ms_strbuf_free(&b);
        }
    }
    check_expr(c, e->lhs);
    check_expr(c, e->rhs);
    check_expr(c, e->cond);
    for (int i = 0; i < e->args.n; i++)
        check_expr(c, ((const ms_ast_arg *)e->args.items[i])->value);
}

static void check_stmts(lcheck *c, const ms_ptr_vec *body) {
    for (int i = 0; i < body->n && !c->failed; i++) {
        const ms_ast_stmt *st = body->items[i];
        for (int k = 0; k < st->rhs.n; k++)
            check_expr(c, st->rhs.items[k]);
        if (st->kind == MS_AST_STMT_FOR)
            check_stmts(c, &st->body);
    }
}

/* The resource of `kind` in node n, or NULL. */
static const ms_resource *res_of_kind(const ms_node *n, ms_resource_kind kind) {
    for (int r = 0; r < n->n_resources; r++)
        if (n->resources[r]->kind == kind)
            return n->resources[r];
    return NULL;
}

/* The canonical text of every keyed argument of r ("key=value;" in key order), into b. */
static void args_text(ms_strbuf *b, const ms_resource *r) {
    for (int k = 0; k < MS_RES_MAX_KEYS && r->spec->keys[k].name != NULL; k++) {
        if (r->args[k] == NULL)
            continue;
        ms_strbuf_printf(b, "%s=", r->spec->keys[k].name);
        ms_expr_print(b, r->args[k]);
        ms_strbuf_puts(b, ";");
    }
}

/*
 * The engine keeps one RoPE table per model (from the model's facts: the first sampling node's),
 * so a later node's rope must be the first node's: the same arguments as written. Each node has
 * its own KV layout, attention and learned position table (its ms_md_node.facts).
 */
static void check_same_rope(lcheck *c, const ms_node *first, const ms_node *node) {
    const ms_resource *a = res_of_kind(first, MS_RESOURCE_POS);
    const ms_resource *b = res_of_kind(node, MS_RESOURCE_POS);
    if (a == NULL || b == NULL || strcmp(b->spec->ctor, "rope") != 0)
        return;
    if (b->scratch != NULL)
        return; /* [scratch] its values are checked against the model's table at load */
    ms_strbuf x = {0}, y = {0};
    args_text(&x, a);
    args_text(&y, b);
    bool same = strcmp(a->spec->ctor, "rope") == 0 && x.data != NULL && y.data != NULL &&
                strcmp(x.data, y.data) == 0;
    bool empty = strcmp(a->spec->ctor, "rope") == 0 && x.data == NULL && y.data == NULL;
    c->oom = c->oom || x.oom || y.oom;
    ms_strbuf_free(&x);
    ms_strbuf_free(&y);
    if (!same && !empty && !c->oom)
        refuse(c, b->ast->name.loc, "node '%s': rope '%s' differs from %s '%s' of node '%s': the "
               "engine keeps one RoPE table per model, so a later node's rope must declare the "
               "first node's arguments", node->name, b->name, a->spec->ctor, a->name, first->name);
}

/*
 * A node returning hidden states (no sampler: an encoder) keeps nothing, so mstarc build lowers
 * it with a dense attention and no kv_pool (the engine batches its windows, ms_engine_encode);
 * a node without a kv_pool is only such a node: one eager step of one segment (a window) per
 * request, no cross-attention.
 */
static void check_dense_node(lcheck *c, const ms_node *node) {
    const ms_resource *kv = res_of_kind(node, MS_RESOURCE_KV);
    const ms_resource *attn = res_of_kind(node, MS_RESOURCE_ATTN);
    const ms_resource *smp = res_of_kind(node, MS_RESOURCE_SAMPLER);
    const ms_resource *cross = res_of_kind(node, MS_RESOURCE_CROSS);
    if (kv != NULL && smp == NULL) {
        refuse(c, kv->ast->name.loc, "node '%s' returns hidden states (no sampler) and keeps nothing: "
               "mstarc build lowers it with a dense attention, so drop kv_pool '%s' and write "
               "attention(q_heads = ..., head_dim = ...)", node->name, kv->name);
        return;
    }
    if (kv != NULL || attn == NULL)
        return;
    if (smp != NULL || cross != NULL) {
        const ms_resource *r = smp != NULL ? smp : cross;
        refuse(c, r->ast->name.loc, "node '%s' has no kv_pool (a dense attention): mstarc build lowers "
               "it as an encoder returning hidden rows, without a %s", node->name, r->spec->ctor);
        return;
    }
    for (int k = 0; k < node->n_steps; k++) {
        const ms_step_decl *s = node->steps[k];
        if (node->n_steps != 1 || s->n_segments != 1) {
            refuse(c, s->ast->name.loc, "step '%s': a node without a kv_pool runs one step of one "
                   "segment per request (its window)", s->name);
            return;
        }
        if (s->capture != MS_CAPTURE_NONE) {
            refuse(c, s->ast->name.loc, "step '%s': a dense node's step runs eager (no capture)", s->name);
            return;
        }
    }
}

ms_status ms_lower_check(const ms_model *m, const char *source, ms_error *err) {
    lcheck c = {source, err, false, false};
    for (int n = 1; n < m->n_nodes && !c.failed; n++)
        check_same_rope(&c, m->nodes[0], m->nodes[n]);
    for (int n = 0; n < m->n_nodes && !c.failed; n++) {
        const ms_node *node = m->nodes[n];
        /* resources in source order (node->resources is in dependency order) */
        for (int i = 0; i < node->ast->resources.n && !c.failed; i++) {
            const ms_ast_resource *ar = node->ast->resources.items[i];
            for (int r = 0; r < node->n_resources; r++)
                if (node->resources[r]->ast == ar)
                    check_resource(&c, node->resources[r]);
        }
        check_retention(&c, node);
        if (!c.failed)
            check_dense_node(&c, node);
        for (int f = 0; f < node->n_forwards && !c.failed; f++) {
            check_inputs(&c, node, node->forwards[f]);
            check_stmts(&c, &node->forwards[f]->ast->body);
        }
    }
    if (c.oom)
        return MS_FAIL(err, MS_ERR_OOM, "out of memory while checking %s for mstarc build", source);
    return c.failed ? MS_ERR_UNSUPPORTED : MS_OK;
}
