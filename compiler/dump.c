/*
 * dump.c - canonical print of a checked model (see ms_model_dump in mstarc.h).
 *
 * The layout is fixed: 4-space indentation, one declaration per line, config then weights then
 * nodes then walks, node items in source order. Comments (lines or trailing text starting with
 * '#') carry what the checker resolved; the parser ignores them, so dump -> parse -> dump is
 * byte-identical.
 */
#include "mstarc.h"

#include <inttypes.h>
#include <string.h>

typedef struct dumper {
    ms_strbuf *b;
    int indent;
} dumper;

static void line_start(dumper *d) {
    for (int i = 0; i < d->indent; i++)
        ms_strbuf_puts(d->b, "    ");
}

static void exprs(dumper *d, const ms_ptr_vec *v) {
    for (int i = 0; i < v->n; i++) {
        if (i > 0)
            ms_strbuf_puts(d->b, ", ");
        ms_expr_print(d->b, v->items[i]);
    }
}

static void idents(dumper *d, const ms_ptr_vec *v) {
    for (int i = 0; i < v->n; i++)
        ms_strbuf_printf(d->b, "%s%s", i > 0 ? ", " : "", ((const ms_ast_ident *)v->items[i])->name);
}

/* ---- config and weights ---- */

static void dump_param(dumper *d, const ms_param *p) {
    const ms_ast_param *a = p->ast;
    line_start(d);
    ms_strbuf_printf(d->b, "%s%s: %s%s", a->derived ? "let " : "", p->name, a->type.name, a->optional ? "?" : "");
    if (a->dflt != NULL) {
        ms_strbuf_puts(d->b, " = ");
        ms_expr_print(d->b, a->dflt);
    }
    if (a->sources.n > 0) {
        ms_strbuf_puts(d->b, " from ");
        exprs(d, &a->sources);
    }
    ms_strbuf_puts(d->b, ";\n");
}

static void dump_tensor(dumper *d, const ms_ast_weight *w) {
    line_start(d);
    ms_strbuf_printf(d->b, "%s = ", w->name.name);
    for (int i = 0; i < w->names.n; i++) {
        if (i > 0)
            ms_strbuf_puts(d->b, " | ");
        ms_expr_print(d->b, w->names.items[i]);
    }
    ms_strbuf_puts(d->b, " [");
    exprs(d, &w->shape);
    ms_strbuf_puts(d->b, "]");
    if (w->tie.name != NULL) {
        ms_strbuf_printf(d->b, " or %s", w->tie.name);
        if (w->tie_cond != NULL) {
            ms_strbuf_puts(d->b, " if ");
            ms_expr_print(d->b, w->tie_cond);
        }
    }
    if (w->optional)
        ms_strbuf_puts(d->b, " optional");
    ms_strbuf_puts(d->b, ";\n");
}

/* ---- nodes ---- */

static const char *kind_name(ms_resource_kind k) { return ms_resource_kind_str(k); }

static void dump_resource(dumper *d, const ms_node *n, const ms_ast_resource *ar) {
    const ms_resource *r = NULL;
    for (int i = 0; i < n->n_resources; i++)
        if (n->resources[i]->ast == ar)
            r = n->resources[i];
    line_start(d);
    ms_strbuf_printf(d->b, "resource %s = ", ar->name.name);
    ms_expr_print(d->b, ar->ctor);
    ms_strbuf_puts(d->b, ";");
    if (r != NULL) {
        ms_strbuf_printf(d->b, "  # index %d, kind %s", r->index, kind_name(r->kind));
        bool first = true;
        for (int k = 0; k < MS_RES_MAX_KEYS && r->spec->keys[k].name != NULL; k++) {
            if (r->args[k] != NULL || r->spec->keys[k].dflt == NULL)
                continue;
            ms_strbuf_printf(d->b, "%s%s = %s", first ? "; defaults: " : ", ", r->spec->keys[k].name,
                             r->spec->keys[k].dflt);
            first = false;
        }
    }
    ms_strbuf_puts(d->b, "\n");
}

static void dump_step(dumper *d, const ms_node *n, const ms_ast_step *as) {
    const ms_step_decl *sd = ms_node_find_step(n, as->name.name);
    line_start(d);
    ms_strbuf_printf(d->b, "step %s(", as->name.name);
    idents(d, &as->params);
    ms_strbuf_puts(d->b, ") {");
    if (sd != NULL && sd->forward != NULL)
        ms_strbuf_printf(d->b, "  # runs %s", sd->forward->name);
    ms_strbuf_puts(d->b, "\n");
    d->indent++;
    for (int i = 0; i < as->items.n; i++) {
        const ms_ast_step_item *it = as->items.items[i];
        line_start(d);
        switch (it->kind) {
        case MS_AST_STEP_SEGMENTS:
            ms_strbuf_puts(d->b, "segments ");
            for (int k = 0; k < it->segments.n; k++) {
                const ms_ast_segment *sg = it->segments.items[k];
                ms_strbuf_printf(d->b, "%s%s += ", k > 0 ? ", " : "", sg->label.name);
                ms_expr_print(d->b, sg->span);
            }
            ms_strbuf_puts(d->b, ";\n");
            break;
        case MS_AST_STEP_CAPTURE:
            ms_strbuf_printf(d->b, "capture %s in [", it->dim.name);
            exprs(d, &it->buckets);
            ms_strbuf_puts(d->b, "];");
            if (sd != NULL) {
                ms_strbuf_puts(d->b, "  # buckets");
                for (int k = 0; k < sd->n_buckets; k++)
                    ms_strbuf_printf(d->b, " %" PRId64, sd->buckets[k]);
            }
            ms_strbuf_puts(d->b, "\n");
            break;
        case MS_AST_STEP_RECORD:
            ms_strbuf_printf(d->b, "%s", it->resource.name);
            for (int k = 0; k < it->fields.n; k++) {
                const ms_ast_arg *f = it->fields.items[k];
                ms_strbuf_printf(d->b, "%s%s = ", k > 0 ? ", " : " ", f->name);
                ms_expr_print(d->b, f->value);
            }
            ms_strbuf_puts(d->b, ";\n");
            break;
        default:
            ms_strbuf_puts(d->b, "\n");
        }
    }
    if (sd != NULL) {
        /* the resolved step declaration: one record per resource in dependency order */
        for (int r = 0; r < n->n_resources && r < MS_MAX_RESOURCES; r++) {
            const ms_step_rec *rec = &sd->recs[r];
            line_start(d);
            ms_strbuf_printf(d->b, "# [%d] %s:", r, rec->resource->name);
            switch (rec->resource->kind) {
            case MS_RESOURCE_KV:
                ms_strbuf_printf(d->b, " commit %s, %d combined, %d pre-fork(s), %d post-fork(s)",
                                 rec->commit ? "true" : "false", rec->n_combined, rec->n_pre_forks,
                                 rec->n_post_forks);
                break;
            case MS_RESOURCE_ATTN:
                ms_strbuf_printf(d->b, " causal %s", rec->causal ? "true" : "false");
                break;
            case MS_RESOURCE_POS:
                ms_strbuf_puts(d->b, " advance ");
                if (rec->advance != NULL)
                    ms_expr_print(d->b, rec->advance);
                else
                    ms_strbuf_puts(d->b, "(scheme rule)");
                ms_strbuf_printf(d->b, ", explicit ids %s", rec->explicit_ids ? "true" : "false");
                break;
            case MS_RESOURCE_SCRATCH:
                ms_strbuf_printf(d->b, " begin %s", rec->begin_frame ? "true" : "false");
                break;
            default:
                ms_strbuf_puts(d->b, " no step fields");
            }
            ms_strbuf_puts(d->b, rec->written ? "\n" : " (defaults)\n");
        }
    }
    d->indent--;
    line_start(d);
    ms_strbuf_puts(d->b, "}\n");
}

static void dump_stmts(dumper *d, const ms_ptr_vec *body);

static void dump_stmt(dumper *d, const ms_ast_stmt *st) {
    line_start(d);
    switch (st->kind) {
    case MS_AST_STMT_ASSIGN:
        exprs(d, &st->lhs);
        ms_strbuf_puts(d->b, " = ");
        exprs(d, &st->rhs);
        ms_strbuf_puts(d->b, ";\n");
        break;
    case MS_AST_STMT_EXPR:
        exprs(d, &st->rhs);
        ms_strbuf_puts(d->b, ";\n");
        break;
    case MS_AST_STMT_RETURN:
        ms_strbuf_puts(d->b, "return ");
        exprs(d, &st->rhs);
        ms_strbuf_puts(d->b, ";\n");
        break;
    case MS_AST_STMT_FOR:
        ms_strbuf_printf(d->b, "for %s in %s ", st->var.name, st->group.name);
        if (st->at != NULL) {
            ms_strbuf_puts(d->b, "at ");
            ms_expr_print(d->b, st->at);
            ms_strbuf_puts(d->b, " ");
        }
        ms_strbuf_puts(d->b, "{\n");
        d->indent++;
        dump_stmts(d, &st->body);
        d->indent--;
        line_start(d);
        ms_strbuf_puts(d->b, "}\n");
        break;
    default:
        ms_strbuf_puts(d->b, "\n");
    }
}

static void dump_stmts(dumper *d, const ms_ptr_vec *body) {
    for (int i = 0; i < body->n; i++)
        dump_stmt(d, body->items[i]);
}

static void dump_forward(dumper *d, const ms_ast_forward *f) {
    line_start(d);
    ms_strbuf_puts(d->b, "forward");
    if (f->name.name != NULL)
        ms_strbuf_printf(d->b, " %s", f->name.name);
    ms_strbuf_puts(d->b, "(");
    for (int i = 0; i < f->params.n; i++) {
        const ms_ast_fparam *p = f->params.items[i];
        ms_strbuf_printf(d->b, "%s%s", i > 0 ? ", " : "", p->name.name);
        if (p->has_shape) {
            ms_strbuf_puts(d->b, ": [");
            exprs(d, &p->shape);
            ms_strbuf_puts(d->b, "]");
            if (p->elem.name != NULL)
                ms_strbuf_printf(d->b, " %s", p->elem.name);
        }
    }
    ms_strbuf_printf(d->b, ") -> %s {\n", f->result.name);
    d->indent++;
    dump_stmts(d, &f->body);
    d->indent--;
    line_start(d);
    ms_strbuf_puts(d->b, "}\n");
}

static void dump_node(dumper *d, const ms_node *n) {
    const ms_ast_node *an = n->ast;
    line_start(d);
    ms_strbuf_printf(d->b, "node %s {  # labels:", n->name);
    for (int i = 0; i < n->n_labels; i++)
        ms_strbuf_printf(d->b, " %d=%s", i, n->labels[i].name);
    ms_strbuf_puts(d->b, "\n");
    d->indent++;
    for (int i = 0; i < an->order.n; i++) {
        const ms_ast_node_item *it = an->order.items[i];
        switch (it->kind) {
        case MS_AST_NODE_LABELS:
            line_start(d);
            ms_strbuf_puts(d->b, "labels ");
            idents(d, it->item);
            ms_strbuf_puts(d->b, ";\n");
            break;
        case MS_AST_NODE_RESOURCE:
            dump_resource(d, n, it->item);
            break;
        case MS_AST_NODE_STEP:
            dump_step(d, n, it->item);
            break;
        case MS_AST_NODE_FORWARD:
            dump_forward(d, it->item);
            break;
        default:
            break;
        }
    }
    d->indent--;
    line_start(d);
    ms_strbuf_puts(d->b, "}\n");
}

/* ---- walks ---- */

static void dump_walk_item(dumper *d, const ms_ast_walk_item *w, bool nested) {
    switch (w->kind) {
    case MS_AST_WALK_STEP:
        ms_strbuf_printf(d->b, "%s.%s", w->node.name, w->step.name);
        break;
    case MS_AST_WALK_SEQ:
        if (nested)
            ms_strbuf_puts(d->b, "(");
        for (int i = 0; i < w->items.n; i++) {
            if (i > 0)
                ms_strbuf_puts(d->b, " then ");
            dump_walk_item(d, w->items.items[i], true);
        }
        if (nested)
            ms_strbuf_puts(d->b, ")");
        break;
    case MS_AST_WALK_LOOP:
        ms_strbuf_puts(d->b, "loop ");
        dump_walk_item(d, w->body, false);
        ms_strbuf_printf(d->b, " until %s", w->until.name);
        break;
    default:
        break;
    }
}

ms_status ms_model_dump(const ms_model *m, ms_strbuf *out) {
    dumper dd = {out, 0};
    dumper *d = &dd;
    ms_strbuf_printf(d->b, "# mstarc dump of model %s: %d config parameter(s), %d weight(s), %d node(s), %d walk(s)\n",
                     m->name, m->n_params, m->n_weights, m->n_nodes, m->n_walks);
    ms_strbuf_printf(d->b, "model %s {\n", m->name);
    d->indent = 1;
    if (m->n_params > 0) {
        line_start(d);
        ms_strbuf_puts(d->b, "config {\n");
        d->indent++;
        for (int i = 0; i < m->n_params; i++)
            dump_param(d, m->params[i]);
        d->indent--;
        line_start(d);
        ms_strbuf_puts(d->b, "}\n");
    }
    const ms_ast_model *a = m->ast;
    if (a->weights.n > 0) {
        line_start(d);
        ms_strbuf_puts(d->b, "weights {\n");
        d->indent++;
        for (int i = 0; i < a->weights.n; i++) {
            const ms_ast_weight *w = a->weights.items[i];
            if (w->kind == MS_AST_WEIGHT_TENSOR) {
                dump_tensor(d, w);
                continue;
            }
            if (w->kind == MS_AST_WEIGHT_IGNORE) {
                line_start(d);
                ms_strbuf_puts(d->b, "ignore ");
                exprs(d, &w->names);
                ms_strbuf_puts(d->b, ";  # present in the checkpoint, not loaded\n");
                continue;
            }
            line_start(d);
            ms_strbuf_printf(d->b, "%s[%s < ", w->name.name, w->index.name);
            ms_expr_print(d->b, w->count);
            ms_strbuf_puts(d->b, "] {\n");
            d->indent++;
            for (int k = 0; k < w->members.n; k++)
                dump_tensor(d, w->members.items[k]);
            d->indent--;
            line_start(d);
            ms_strbuf_puts(d->b, "}\n");
        }
        d->indent--;
        line_start(d);
        ms_strbuf_puts(d->b, "}\n");
    }
    for (int i = 0; i < m->n_nodes; i++)
        dump_node(d, m->nodes[i]);
    for (int i = 0; i < m->n_walks; i++) {
        line_start(d);
        ms_strbuf_printf(d->b, "walk %s = ", m->walks[i]->name);
        dump_walk_item(d, m->walks[i]->body, false);
        ms_strbuf_puts(d->b, ";\n");
    }
    ms_strbuf_puts(d->b, "}\n");
    return out->oom ? MS_ERR_OOM : MS_OK;
}
