/*
 * print.c - canonical expression text and the text buffer. See print.h.
 *
 * Parentheses: a child is wrapped when its precedence is lower than its parent's, or equal on
 * the side where the grammar would associate differently (right operand of a left-associative
 * operator, either operand of a non-associative one). Levels follow grammar.y.
 */
#include "print.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- buffer ---- */

static void strbuf_reserve(ms_strbuf *b, size_t extra) {
    if (b->oom)
        return;
    if (ms_grow((void **)&b->data, &b->cap, b->len + extra + 1, 1) != MS_OK)
        b->oom = true;
}

void ms_strbuf_puts(ms_strbuf *b, const char *s) {
    size_t n = strlen(s);
    strbuf_reserve(b, n);
    if (b->oom)
        return;
    memcpy(b->data + b->len, s, n + 1);
    b->len += n;
}

void ms_strbuf_printf(ms_strbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char small[256];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n < sizeof small) {
        ms_strbuf_puts(b, small);
        return;
    }
    strbuf_reserve(b, (size_t)n);
    if (b->oom)
        return;
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void ms_strbuf_free(ms_strbuf *b) {
    if (b == NULL)
        return;
    ms_free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
    b->oom = false;
}

/* ---- expressions ---- */

enum {
    PREC_COND = 1,
    PREC_OR,
    PREC_AND,
    PREC_ARROW,
    PREC_CMP,
    PREC_RANGE,
    PREC_ADD,
    PREC_MUL,
    PREC_UNARY,
    PREC_PRIMARY
};

static int op_prec(ms_op op) {
    switch (op) {
    case MS_OP_OR: return PREC_OR;
    case MS_OP_AND: return PREC_AND;
    case MS_OP_ARROW: return PREC_ARROW;
    case MS_OP_EQ: case MS_OP_NE: case MS_OP_LT: case MS_OP_LE: case MS_OP_GT: case MS_OP_GE:
        return PREC_CMP;
    case MS_OP_RANGE: return PREC_RANGE;
    case MS_OP_ADD: case MS_OP_SUB: return PREC_ADD;
    case MS_OP_MUL: case MS_OP_DIV: case MS_OP_MOD: return PREC_MUL;
    default: return PREC_UNARY;
    }
}

static bool op_nonassoc(int prec) { return prec == PREC_ARROW || prec == PREC_CMP || prec == PREC_RANGE; }

static int expr_prec(const ms_ast_expr *e) {
    switch (e->kind) {
    case MS_EXPR_COND: return PREC_COND;
    case MS_EXPR_BINARY: return op_prec(e->op);
    case MS_EXPR_UNARY: return PREC_UNARY;
    default: return PREC_PRIMARY;
    }
}

static void print_prec(ms_strbuf *b, const ms_ast_expr *e, int min_prec);

void ms_string_print(ms_strbuf *b, const char *s) {
    ms_strbuf_puts(b, "\"");
    for (const char *p = s; *p != '\0'; p++) {
        switch (*p) {
        case '"': ms_strbuf_puts(b, "\\\""); break;
        case '\\': ms_strbuf_puts(b, "\\\\"); break;
        case '\n': ms_strbuf_puts(b, "\\n"); break;
        case '\t': ms_strbuf_puts(b, "\\t"); break;
        default: {
            char c[2] = {*p, '\0'};
            ms_strbuf_puts(b, c);
        }
        }
    }
    ms_strbuf_puts(b, "\"");
}

static void print_float(ms_strbuf *b, double v) {
    char buf[64];
    double mag = fabs(v);
    if (v == 0.0 || (mag >= 1e-3 && mag < 1e15)) {
        /* plain decimal notation, shortest that reads back exactly: 10000.0, 0.5, 0.001 */
        for (int dec = 1; dec <= 20; dec++) {
            snprintf(buf, sizeof buf, "%.*f", dec, v);
            if (strtod(buf, NULL) == v) {
                ms_strbuf_puts(b, buf);
                return;
            }
        }
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            break;
    }
    /* Keep it a float literal for the lexer: digits '.' digits, or an exponent. */
    if (strpbrk(buf, ".e") == NULL)
        strcat(buf, ".0");
    /* "1e+20" is fine for the lexer; "1.5e-05" too. */
    ms_strbuf_puts(b, buf);
}

static void print_args(ms_strbuf *b, const ms_ptr_vec *args) {
    for (int i = 0; i < args->n; i++) {
        const ms_ast_arg *a = args->items[i];
        if (i > 0)
            ms_strbuf_puts(b, ", ");
        if (a->name != NULL)
            ms_strbuf_printf(b, "%s = ", a->name);
        print_prec(b, a->value, 0);
    }
}

static void print_prec(ms_strbuf *b, const ms_ast_expr *e, int min_prec) {
    int prec = expr_prec(e);
    bool paren = prec < min_prec;
    if (paren)
        ms_strbuf_puts(b, "(");
    switch (e->kind) {
    case MS_EXPR_INT: ms_strbuf_printf(b, "%lld", (long long)e->ival); break;
    case MS_EXPR_FLOAT: print_float(b, e->fval); break;
    case MS_EXPR_BOOL: ms_strbuf_puts(b, e->bval ? "true" : "false"); break;
    case MS_EXPR_STRING: ms_string_print(b, e->text); break;
    case MS_EXPR_NONE: ms_strbuf_puts(b, "none"); break;
    case MS_EXPR_NAME: ms_strbuf_puts(b, e->text); break;
    case MS_EXPR_MEMBER:
        print_prec(b, e->lhs, PREC_PRIMARY);
        ms_strbuf_printf(b, ".%s", e->text);
        break;
    case MS_EXPR_CALL:
        print_prec(b, e->lhs, PREC_PRIMARY);
        ms_strbuf_puts(b, "(");
        print_args(b, &e->args);
        ms_strbuf_puts(b, ")");
        break;
    case MS_EXPR_UNARY:
        ms_strbuf_puts(b, ms_op_str(e->op));
        print_prec(b, e->lhs, PREC_UNARY);
        break;
    case MS_EXPR_BINARY: {
        bool na = op_nonassoc(prec);
        print_prec(b, e->lhs, na ? prec + 1 : prec);
        ms_strbuf_printf(b, " %s ", ms_op_str(e->op));
        print_prec(b, e->rhs, prec + 1);
        break;
    }
    case MS_EXPR_COND:
        print_prec(b, e->cond, PREC_COND + 1);
        ms_strbuf_puts(b, " ? ");
        print_prec(b, e->lhs, PREC_COND);
        ms_strbuf_puts(b, " : ");
        print_prec(b, e->rhs, PREC_COND);
        break;
    case MS_EXPR_LIST:
        ms_strbuf_puts(b, "[");
        print_args(b, &e->args);
        ms_strbuf_puts(b, "]");
        break;
    default:
        ms_strbuf_puts(b, "?");
    }
    if (paren)
        ms_strbuf_puts(b, ")");
}

void ms_expr_print(ms_strbuf *b, const ms_ast_expr *e) { print_prec(b, e, 0); }

const char *ms_expr_str(ms_arena *a, const ms_ast_expr *e) {
    ms_strbuf b = {0};
    ms_expr_print(&b, e);
    if (b.oom || b.data == NULL) {
        ms_strbuf_free(&b);
        ms_arena_oom(a);
        return "?";
    }
    /* the copy must not longjmp past the buffer (a leak): copy without the jump, free, then
       report a failed copy the arena's way */
    jmp_buf *jb = a->oom_jmp;
    a->oom_jmp = NULL;
    const char *s = ms_arena_strdup(a, b.data);
    a->oom_jmp = jb;
    ms_strbuf_free(&b);
    if (s == NULL) {
        ms_arena_oom(a);
        return "?";
    }
    return s;
}
