/*
 * chat_template.c - a Jinja subset for chat templates: lexer, recursive-descent parser, tree-walking
 * renderer (chat_template.h lists what is supported and the limits).
 *
 * Hand-written rather than flex/bison: Jinja's lexer is modal (text, then tokens inside {{ }} / {% %}
 * whose end markers depend on bracket balance, whitespace control rewriting the neighbouring text),
 * which is a few dozen lines by hand and awkward as a flex scanner; the expression grammar is a
 * precedence ladder that recursive descent mirrors one function per jinja2 parser method, so the
 * precedence (filters bind tighter than binary operators, `not` looser than comparisons) follows
 * jinja2/parser.py directly.
 *
 * Memory: the parsed tree lives in one arena owned by the template; every value made while
 * rendering lives in a per-render arena freed at the end (namespace objects are shared by
 * reference, as in Python), so nothing is reference counted. Every recursion is bounded: the parser
 * refuses trees deeper than CT_MAX_NODE_DEPTH, values deeper than CT_MAX_VALUE_DEPTH are refused
 * where they are built, so evaluation, repr, tojson and comparison recurse a bounded amount.
 */
#include "chat_template.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Most items a range() may make (jinja2 sandbox.MAX_RANGE). */
#define CT_MAX_RANGE 100000

#define CT_MAX_NODE_DEPTH 128
#define CT_MAX_BLOCK_DEPTH 64
#define CT_MAX_VALUE_DEPTH 64
#define CT_MAX_STEPS 10000000LL
#define CT_MAX_MEM ((size_t)512 << 20)
#define CT_CHUNK 65536

/* ---- arena ---- */

typedef struct ct_chunk {
    struct ct_chunk *next;
    size_t used, cap;
    max_align_t data[];
} ct_chunk;

typedef struct ct_arena {
    ct_chunk *head;
    size_t total;  /* bytes taken from ms_malloc */
} ct_arena;

static void *arena_alloc(ct_arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (a->head == NULL || a->head->cap - a->head->used < n) {
        size_t cap = n > CT_CHUNK ? n : CT_CHUNK;
        if (a->total + cap > CT_MAX_MEM + CT_CHUNK)
            return NULL;
        ct_chunk *c = ms_malloc(sizeof *c + cap);
        if (c == NULL)
            return NULL;
        c->next = a->head;
        c->used = 0;
        c->cap = cap;
        a->head = c;
        a->total += cap;
    }
    void *p = (char *)a->head->data + a->head->used;
    a->head->used += n;
    return p;
}

static void arena_free(ct_arena *a) {
    ct_chunk *c = a->head;
    while (c != NULL) {
        ct_chunk *n = c->next;
        ms_free(c);
        c = n;
    }
    a->head = NULL;
    a->total = 0;
}

/* ---- values ---- */

typedef enum {
    V_UNDEF,
    V_NONE,
    V_BOOL,
    V_INT,
    V_FLOAT,
    V_STR,
    V_LIST,
    V_DICT,
    V_LOOP,
    V_FUNC
} vkind; /* V_FUNC: a global function named as a value (u.i: funcs[] index) */

typedef struct ct_list ct_list;
typedef struct ct_dict ct_dict;
typedef struct ct_loop ct_loop;

typedef struct ct_val {
    vkind k;
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t n;
        } s;
        ct_list *l;
        ct_dict *d;
        ct_loop *loop;
    } u;
} ct_val;

struct ct_list {
    ct_val *v;
    size_t n, cap;
    int depth;   /* 1 + the deepest element's depth */
    bool tuple;  /* a Python tuple: (a, b) literals, items() pairs; only repr and == differ */
};

struct ct_dict {
    ct_val *keys;  /* strings */
    ct_val *vals;
    size_t n, cap;
    int depth;
    bool ns;  /* a namespace(): attributes may be assigned */
};

struct ct_loop {
    const ct_list *items;
    size_t i;
};

static ct_val v_undef(void) { return (ct_val){.k = V_UNDEF}; }
static ct_val v_none(void) { return (ct_val){.k = V_NONE}; }
static ct_val v_bool(bool b) { return (ct_val){.k = V_BOOL, .u.b = b}; }
static ct_val v_int(int64_t i) { return (ct_val){.k = V_INT, .u.i = i}; }
static ct_val v_float(double f) { return (ct_val){.k = V_FLOAT, .u.f = f}; }
static ct_val v_str(const char *p, size_t n) { return (ct_val){.k = V_STR, .u.s = {p, n}}; }

static int v_depth(ct_val v) {
    if (v.k == V_LIST)
        return v.u.l->depth;
    if (v.k == V_DICT)
        return v.u.d->depth;
    return 0;
}

/* ---- tree ---- */

typedef enum {
    /* statements */
    N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETATTR, N_SETBLOCK, N_BREAK, N_CONTINUE,
    /* expressions */
    E_LIT, E_NAME, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_METHOD, E_FILTER, E_TEST, E_NOT, E_NEG, E_POS,
    E_BIN, E_AND, E_OR, E_COND, E_LIST, E_DICT, E_CONCAT
} nkind;

typedef enum {
    OP_ADD,
    OP_SUB,
    OP_MUL,
    OP_DIV,
    OP_FLOORDIV,
    OP_MOD,
    OP_POW,
    OP_EQ,
    OP_NE,
    OP_LT,
    OP_GT,
    OP_LE,
    OP_GE,
    OP_IN,
    OP_NOTIN
} binop;

typedef struct node node;
typedef struct nodelist {
    node **v;
    size_t n;
} nodelist;

struct node {
    nkind k;
    int op;          /* binop, or the builtin index of a call / filter / test / method */
    int depth;       /* height of the subtree (bounded) */
    size_t off;      /* source offset (line:col in errors) */
    const char *s;   /* text / name / attribute */
    size_t n;        /* its length */
    ct_val lit;      /* E_LIT */
    node *a, *b, *c; /* operands (E_SLICE: object, start, stop, step in a, b, c, args.v[0]) */
    nodelist args;   /* call / filter / test arguments; list / dict items (dict: k, v, k, v ...) */
    const char **kw; /* keyword names of args (NULL entries for positional), or NULL */
    nodelist body, orelse;
    const char **names; /* for: the loop variable(s) */
    size_t nnames;
    bool negate;     /* E_TEST: `is not` */
};

struct ms_chat_template {
    ct_arena arena;
    char *src;  /* normalized source */
    size_t len;
    char *name;
    nodelist root;
};

/* line:col of a source offset */
static void src_pos(const char *src, size_t off, int *line, int *col) {
    int l = 1, c = 1;
    for (size_t i = 0; i < off && src[i] != '\0'; i++) {
        if (src[i] == '\n') {
            l++;
            c = 1;
        } else {
            c++;
        }
    }
    *line = l;
    *col = c;
}

/* ---- lexer ---- */

typedef enum {
    T_TEXT,
    T_VAR_BEGIN,
    T_VAR_END,
    T_BLOCK_BEGIN,
    T_BLOCK_END,
    T_NAME,
    T_STR,
    T_INT,
    T_FLOAT,
    T_OP,
    T_EOF
} tkind;

typedef struct tok {
    tkind k;
    size_t off;
    const char *s;  /* T_TEXT, T_NAME, T_STR (decoded), T_OP (the operator text) */
    size_t n;
    int64_t i;
    double f;
} tok;

typedef struct parser {
    ms_chat_template *t;
    const char *src;
    size_t len;
    tok *toks;
    size_t ntoks, cap, pos;
    int block_depth;
    ms_error *err;
    ms_status st;
} parser;

static ms_status perr(parser *p, ms_status code, size_t off, const char *fmt, ...) MS_PRINTF(4, 5);
static ms_status perr(parser *p, ms_status code, size_t off, const char *fmt, ...) {
    if (p->st != MS_OK)
        return p->st;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line, col;
    src_pos(p->src, off, &line, &col);
    p->st = code;
    MS_FAIL(p->err, code, "%s:%d:%d: %s", p->t->name, line, col, msg);
    return code;
}

static bool emit(parser *p, tok t) {
    if (ms_grow((void **)&p->toks, &p->cap, p->ntoks + 1, sizeof *p->toks) != MS_OK) {
        perr(p, MS_ERR_OOM, t.off, "out of memory");
        return false;
    }
    p->toks[p->ntoks++] = t;
    return true;
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
static bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }

static void put_utf8(char *o, size_t *n, uint32_t cp) {
    if (cp < 0x80) {
        o[(*n)++] = (char)cp;
    } else if (cp < 0x800) {
        o[(*n)++] = (char)(0xC0 | (cp >> 6));
        o[(*n)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        o[(*n)++] = (char)(0xE0 | (cp >> 12));
        o[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[(*n)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        o[(*n)++] = (char)(0xF0 | (cp >> 18));
        o[(*n)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        o[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[(*n)++] = (char)(0x80 | (cp & 0x3F));
    }
}

static int hexval(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* A string literal at src[*i] (a quote): decoded with Python's escapes. */
static bool lex_string(parser *p, size_t *i) {
    const char *s = p->src;
    size_t start = *i;
    char q = s[start];
    size_t j = start + 1;
    while (j < p->len && s[j] != q) {
        if (s[j] == '\\' && j + 1 < p->len)
            j++;
        j++;
    }
    if (j >= p->len) {
        perr(p, MS_ERR_PARSE, start, "unterminated string");
        return false;
    }
    char *o = arena_alloc(&p->t->arena, j - start + 1);
    if (o == NULL) {
        perr(p, MS_ERR_OOM, start, "out of memory");
        return false;
    }
    size_t n = 0;
    for (size_t k = start + 1; k < j; k++) {
        if (s[k] != '\\') {
            o[n++] = s[k];
            continue;
        }
        char e = s[++k];
        int digits = 0;
        switch (e) {
        case 'n': o[n++] = '\n'; break;
        case 't': o[n++] = '\t'; break;
        case 'r': o[n++] = '\r'; break;
        case 'a': o[n++] = '\a'; break;
        case 'b': o[n++] = '\b'; break;
        case 'f': o[n++] = '\f'; break;
        case 'v': o[n++] = '\v'; break;
        case '\\': o[n++] = '\\'; break;
        case '\'': o[n++] = '\''; break;
        case '"': o[n++] = '"'; break;
        case '\n': break;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default:
            if (e >= '0' && e <= '7') {
                uint32_t cp = 0;
                int c = 0;
                while (c < 3 && k < j && s[k] >= '0' && s[k] <= '7') {
                    cp = cp * 8 + (uint32_t)(s[k] - '0');
                    k++;
                    c++;
                }
                k--;
                put_utf8(o, &n, cp);
            } else {
                o[n++] = '\\';
                o[n++] = e;
            }
        }
        if (digits > 0) {
            uint32_t cp = 0;
            for (int d = 0; d < digits; d++) {
                int h = k + 1 < j ? hexval(s[k + 1]) : -1;
                if (h < 0) {
                    perr(p, MS_ERR_PARSE, k, "truncated \\%c escape", e);
                    return false;
                }
                cp = cp * 16 + (uint32_t)h;
                k++;
            }
            if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
                perr(p, MS_ERR_PARSE, k, "escape outside the Unicode range");
                return false;
            }
            put_utf8(o, &n, cp);
        }
    }
    o[n] = '\0';
    *i = j + 1;
    return emit(p, (tok){.k = T_STR, .off = start, .s = o, .n = n});
}

static bool lex_number(parser *p, size_t *i) {
    const char *s = p->src;
    size_t start = *i, j = *i;
    char buf[128];
    size_t bn = 0;
    bool isf = false;
    while (j < p->len && (is_digit(s[j]) || s[j] == '_')) {
        if (s[j] != '_' && bn < sizeof buf - 1)
            buf[bn++] = s[j];
        j++;
    }
    if (j + 1 < p->len && s[j] == '.' && is_digit(s[j + 1])) {
        isf = true;
        if (bn < sizeof buf - 1)
            buf[bn++] = '.';
        j++;
        while (j < p->len && (is_digit(s[j]) || s[j] == '_')) {
            if (s[j] != '_' && bn < sizeof buf - 1)
                buf[bn++] = s[j];
            j++;
        }
    }
    if (j < p->len && (s[j] == 'e' || s[j] == 'E')) {
        size_t k = j + 1;
        if (k < p->len && (s[k] == '+' || s[k] == '-'))
            k++;
        if (k < p->len && is_digit(s[k])) {
            isf = true;
            if (bn < sizeof buf - 1)
                buf[bn++] = 'e';
            for (size_t m = j + 1; m < k; m++)
                if (bn < sizeof buf - 1)
                    buf[bn++] = s[m];
            j = k;
            while (j < p->len && is_digit(s[j])) {
                if (bn < sizeof buf - 1)
                    buf[bn++] = s[j];
                j++;
            }
        }
    }
    buf[bn] = '\0';
    if (bn >= sizeof buf - 1) {
        perr(p, MS_ERR_PARSE, start, "number literal too long");
        return false;
    }
    *i = j;
    errno = 0;
    if (isf)
        return emit(p, (tok){.k = T_FLOAT, .off = start, .f = strtod(buf, NULL)});
    long long v = strtoll(buf, NULL, 10);
    if (errno == ERANGE) {
        perr(p, MS_ERR_UNSUPPORTED, start, "integer literal beyond 64 bits");
        return false;
    }
    return emit(p, (tok){.k = T_INT, .off = start, .i = (int64_t)v});
}

/* Text before a tag at src[a .. b), with whitespace control; line_start: a starts a line. */
static bool emit_text(parser *p, size_t a, size_t b, char tag, char sign) {
    if (sign == '-') {
        while (b > a && is_ws(p->src[b - 1]))
            b--;
    } else if (sign != '+' && (tag == '%' || tag == '#')) {
        /* lstrip_blocks: spaces and tabs between the line's start and the tag */
        size_t l = b;
        while (l > a && (p->src[l - 1] == ' ' || p->src[l - 1] == '\t'))
            l--;
        if ((l > a && p->src[l - 1] == '\n') || (l == a && (a == 0 || p->src[a - 1] == '\n')))
            b = l;
    }
    if (b > a)
        return emit(p, (tok){.k = T_TEXT, .off = a, .s = p->src + a, .n = b - a});
    return true;
}

static const char *const ops3[] = {"**", "//", "==", "!=", "<=", ">="};

static bool lex(parser *p) {
    const char *s = p->src;
    size_t i = 0, text_start = 0;
    while (i < p->len) {
        if (s[i] != '{' || i + 1 >= p->len || (s[i + 1] != '{' && s[i + 1] != '%' && s[i + 1] != '#')) {
            i++;
            continue;
        }
        char tag = s[i + 1];
        char sign = i + 2 < p->len ? s[i + 2] : 0;
        if (sign != '-' && sign != '+')
            sign = 0;
        if (tag == '{' && sign == '+')
            sign = 0;
        if (!emit_text(p, text_start, i, tag, sign))
            return false;
        size_t tag_off = i;
        i += 2 + (sign != 0);
        bool strip_after = false, trim = false;
        if (tag == '#') {
            const char *e = NULL;
            for (size_t j = i; j + 1 < p->len; j++)
                if (s[j] == '#' && s[j + 1] == '}') {
                    e = s + j;
                    break;
                }
            if (e == NULL)
                return perr(p, MS_ERR_PARSE, tag_off, "unterminated comment"), false;
            size_t j = (size_t)(e - s);
            strip_after = j > i && s[j - 1] == '-';
            trim = !strip_after && !(j > i && s[j - 1] == '+');
            i = j + 2;
        } else {
            if (!emit(p, (tok){.k = tag == '{' ? T_VAR_BEGIN : T_BLOCK_BEGIN, .off = tag_off}))
                return false;
            int bal = 0;
            for (;;) {
                while (i < p->len && is_ws(s[i]))
                    i++;
                if (i >= p->len)
                    return perr(p, MS_ERR_PARSE, tag_off, "unterminated '{%c' tag", tag), false;
                char endc = tag == '{' ? '}' : '%';
                if (bal == 0) {
                    size_t k = i;
                    char es = 0;
                    if ((s[k] == '-' || (s[k] == '+' && tag == '%')) && k + 1 < p->len && s[k + 1] == endc) {
                        es = s[k];
                        k++;
                    }
                    if (s[k] == endc && k + 1 < p->len && s[k + 1] == '}') {
                        if (!emit(p, (tok){.k = tag == '{' ? T_VAR_END : T_BLOCK_END, .off = i}))
                            return false;
                        i = k + 2;
                        strip_after = es == '-';
                        trim = tag == '%' && es == 0;
                        break;
                    }
                }
                char c = s[i];
                if (c == '\'' || c == '"') {
                    if (!lex_string(p, &i))
                        return false;
                } else if (is_digit(c)) {
                    if (!lex_number(p, &i))
                        return false;
                } else if (is_alpha(c)) {
                    size_t j = i;
                    while (j < p->len && (is_alpha(s[j]) || is_digit(s[j])))
                        j++;
                    if (!emit(p, (tok){.k = T_NAME, .off = i, .s = s + i, .n = j - i}))
                        return false;
                    i = j;
                } else {
                    size_t n = 0;
                    for (size_t k = 0; k < MS_ARRAY_LEN(ops3); k++)
                        if (i + 1 < p->len && s[i] == ops3[k][0] && s[i + 1] == ops3[k][1])
                            n = 2;
                    if (n == 0) {
                        if (strchr("+-*/%~[](){}<>=.:|,", c) == NULL || c == '\0')
                            return perr(p, MS_ERR_PARSE, i, "unexpected character '%c'", c), false;
                        n = 1;
                    }
                    if (c == '(' || c == '[' || c == '{')
                        bal++;
                    else if ((c == ')' || c == ']' || c == '}') && bal > 0)
                        bal--;
                    if (!emit(p, (tok){.k = T_OP, .off = i, .s = s + i, .n = n}))
                        return false;
                    i += n;
                }
            }
        }
        if (strip_after) {
            while (i < p->len && is_ws(s[i]))
                i++;
        } else if (trim && i < p->len && s[i] == '\n') {
            i++;
        }
        text_start = i;
    }
    if (!emit_text(p, text_start, p->len, 0, 0))
        return false;
    return emit(p, (tok){.k = T_EOF, .off = p->len});
}

/* ---- parser ---- */

static tok *peek(parser *p) { return &p->toks[p->pos]; }
static tok *peek2(parser *p) { return &p->toks[p->pos + 1 < p->ntoks ? p->pos + 1 : p->pos]; }
static tok *next_tok(parser *p) {
    tok *t = &p->toks[p->pos];
    if (t->k != T_EOF)
        p->pos++;
    return t;
}
static bool tok_is(const tok *t, tkind k, const char *s) {
    return t->k == k && (s == NULL || (t->n == strlen(s) && memcmp(t->s, s, t->n) == 0));
}
static bool is_op(parser *p, const char *s) { return tok_is(peek(p), T_OP, s); }
static bool is_name(parser *p, const char *s) { return tok_is(peek(p), T_NAME, s); }
static bool accept_op(parser *p, const char *s) {
    if (!is_op(p, s))
        return false;
    p->pos++;
    return true;
}
static bool accept_name(parser *p, const char *s) {
    if (!is_name(p, s))
        return false;
    p->pos++;
    return true;
}

static const char *tok_desc(const tok *t, char *buf, size_t n) {
    switch (t->k) {
    case T_EOF: return "end of template";
    case T_VAR_END: return "'}}'";
    case T_BLOCK_END: return "'%}'";
    case T_TEXT: return "text";
    case T_STR: return "a string";
    case T_INT: case T_FLOAT: return "a number";
    default: snprintf(buf, n, "'%.*s'", (int)MS_MIN(t->n, (size_t)40), t->s); return buf;
    }
}

static bool expect_op(parser *p, const char *s) {
    if (accept_op(p, s))
        return true;
    char b[64];
    perr(p, MS_ERR_PARSE, peek(p)->off, "expected '%s', found %s", s, tok_desc(peek(p), b, sizeof b));
    return false;
}

static node *mk(parser *p, nkind k, size_t off, node *a, node *b, node *c) {
    node *n = arena_alloc(&p->t->arena, sizeof *n);
    if (n == NULL) {
        perr(p, MS_ERR_OOM, off, "out of memory");
        return NULL;
    }
    memset(n, 0, sizeof *n);
    n->k = k;
    n->off = off;
    n->a = a;
    n->b = b;
    n->c = c;
    int d = 0;
    if (a != NULL && a->depth > d) d = a->depth;
    if (b != NULL && b->depth > d) d = b->depth;
    if (c != NULL && c->depth > d) d = c->depth;
    n->depth = d + 1;
    if (n->depth > CT_MAX_NODE_DEPTH) {
        perr(p, MS_ERR_LIMIT, off, "expression nested deeper than %d", CT_MAX_NODE_DEPTH);
        return NULL;
    }
    return n;
}

static bool list_add(parser *p, nodelist *l, node *n, size_t *cap) {
    if (ms_grow((void **)&l->v, cap, l->n + 1, sizeof *l->v) != MS_OK) {
        perr(p, MS_ERR_OOM, n->off, "out of memory");
        return false;
    }
    l->v[l->n++] = n;
    return true;
}

/* Move a list grown with ms_grow into the arena (so the tree frees at once). */
static bool list_seal(parser *p, nodelist *l, const char ***kw) {
    node **v = NULL;
    const char **k = NULL;
    if (l->n > 0) {
        v = arena_alloc(&p->t->arena, l->n * sizeof *v);
        if (kw != NULL && *kw != NULL)
            k = arena_alloc(&p->t->arena, l->n * sizeof *k);
        if (v == NULL || (kw != NULL && *kw != NULL && k == NULL)) {
            ms_free(l->v);
            if (kw != NULL) {
                ms_free((void *)*kw);
                *kw = NULL;
            }
            l->v = NULL;
            l->n = 0;
            perr(p, MS_ERR_OOM, 0, "out of memory");
            return false;
        }
        memcpy(v, l->v, l->n * sizeof *v);
        if (k != NULL)
            memcpy(k, *kw, l->n * sizeof *k);
    }
    ms_free(l->v);
    l->v = v;
    if (kw != NULL) {
        ms_free((void *)*kw);
        *kw = k;
    }
    return true;
}

static void update_depth(parser *p, node *n, const nodelist *l) {
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i]->depth + 1 > n->depth)
            n->depth = l->v[i]->depth + 1;
    if (n->depth > CT_MAX_NODE_DEPTH)
        perr(p, MS_ERR_LIMIT, n->off, "expression nested deeper than %d", CT_MAX_NODE_DEPTH);
}

static char *arena_strndup(parser *p, const char *s, size_t n) {
    char *o = arena_alloc(&p->t->arena, n + 1);
    if (o == NULL) {
        perr(p, MS_ERR_OOM, 0, "out of memory");
        return NULL;
    }
    memcpy(o, s, n);
    o[n] = '\0';
    return o;
}

static node *parse_expr(parser *p);
static node *parse_or(parser *p);
static node *parse_unary(parser *p, bool with_filter);

/* Builtins: ORDER of these tables is the op index stored in the node. */
static const char *const filters[] = {"trim", "tojson", "length", "count", "default", "d", "upper", "lower",
                                      "replace", "string", "first", "last", "join", "list", "int", "float",
                                      "abs", "capitalize", "title", "safe", "items", "reverse", "map", "select",
                                      "reject", "selectattr", "rejectattr"};
enum { F_TRIM, F_TOJSON, F_LENGTH, F_COUNT, F_DEFAULT, F_D, F_UPPER, F_LOWER, F_REPLACE, F_STRING, F_FIRST,
       F_LAST, F_JOIN, F_LIST, F_INT, F_FLOAT, F_ABS, F_CAPITALIZE, F_TITLE, F_SAFE, F_ITEMS, F_REVERSE, F_MAP,
       F_SELECT, F_REJECT, F_SELECTATTR, F_REJECTATTR };
static const char *const tests[] = {"defined", "undefined", "none", "string", "number", "integer", "float",
                                    "boolean", "true", "false", "mapping", "iterable", "sequence", "odd",
                                    "even", "divisibleby", "eq", "equalto", "ne", "lower", "upper"};
enum { X_DEFINED, X_UNDEFINED, X_NONE, X_STRING, X_NUMBER, X_INTEGER, X_FLOAT, X_BOOLEAN, X_TRUE, X_FALSE,
       X_MAPPING, X_ITERABLE, X_SEQUENCE, X_ODD, X_EVEN, X_DIVISIBLEBY, X_EQ, X_EQUALTO, X_NE, X_LOWER, X_UPPER };
static const char *const funcs[] = {"raise_exception", "namespace", "range", "strftime_now", "dict"};
enum { G_RAISE, G_NAMESPACE, G_RANGE, G_STRFTIME, G_DICT };
static const char *const methods[] = {"strip", "lstrip", "rstrip", "startswith", "endswith", "split", "upper",
                                      "lower", "replace", "title", "capitalize", "find", "count", "join",
                                      "get", "items", "keys", "values"};
enum { M_STRIP, M_LSTRIP, M_RSTRIP, M_STARTSWITH, M_ENDSWITH, M_SPLIT, M_UPPER, M_LOWER, M_REPLACE, M_TITLE,
       M_CAPITALIZE, M_FIND, M_COUNT, M_JOIN, M_GET, M_ITEMS, M_KEYS, M_VALUES };

static int lookup(const char *const *tab, size_t n, const char *s, size_t len) {
    for (size_t i = 0; i < n; i++)
        if (strlen(tab[i]) == len && memcmp(tab[i], s, len) == 0)
            return (int)i;
    return -1;
}

/* (args) after a callee; the '(' is the current token. */
static bool parse_args(parser *p, node *n) {
    size_t cap = 0, kcap = 0;
    const char **kw = NULL;
    bool any_kw = false;
    if (!expect_op(p, "("))
        return false;
    while (!is_op(p, ")")) {
        if (n->args.n > 0 && !expect_op(p, ","))
            goto fail;
        if (is_op(p, ")"))
            break;
        const char *name = NULL;
        if (peek(p)->k == T_NAME && tok_is(peek2(p), T_OP, "=")) {
            tok *t = next_tok(p);
            p->pos++;
            name = arena_strndup(p, t->s, t->n);
            if (name == NULL)
                goto fail;
            any_kw = true;
        } else if (any_kw) {
            perr(p, MS_ERR_PARSE, peek(p)->off, "positional argument after a keyword argument");
            goto fail;
        }
        node *a = parse_expr(p);
        if (a == NULL)
            goto fail;
        if (!list_add(p, &n->args, a, &cap))
            goto fail;
        if (ms_grow((void **)&kw, &kcap, n->args.n, sizeof *kw) != MS_OK) {
            perr(p, MS_ERR_OOM, a->off, "out of memory");
            goto fail;
        }
        kw[n->args.n - 1] = name;
    }
    p->pos++;
    if (!any_kw) {
        ms_free(kw);
        kw = NULL;
    }
    n->kw = kw;
    if (!list_seal(p, &n->args, &n->kw))
        return false;
    update_depth(p, n, &n->args);
    return p->st == MS_OK;
fail:
    ms_free(kw);
    ms_free(n->args.v);
    n->args.v = NULL;
    n->args.n = 0;
    return false;
}

static node *parse_primary(parser *p) {
    tok *t = peek(p);
    char b[64];
    if (t->k == T_NAME) {
        p->pos++;
        static const char *const lits[] = {"true", "True", "false", "False", "none", "None"};
        int li = lookup(lits, 6, t->s, t->n);
        if (li >= 0) {
            node *n = mk(p, E_LIT, t->off, NULL, NULL, NULL);
            if (n != NULL)
                n->lit = li < 2 ? v_bool(true) : li < 4 ? v_bool(false) : v_none();
            return n;
        }
        node *n = mk(p, E_NAME, t->off, NULL, NULL, NULL);
        if (n != NULL) {
            n->s = t->s;
            n->n = t->n;
        }
        return n;
    }
    if (t->k == T_STR) {
        /* adjacent strings concatenate */
        size_t total = 0, k = p->pos;
        while (p->toks[k].k == T_STR)
            total += p->toks[k++].n;
        char *o = arena_alloc(&p->t->arena, total + 1);
        if (o == NULL)
            return perr(p, MS_ERR_OOM, t->off, "out of memory"), NULL;
        size_t n = 0;
        while (peek(p)->k == T_STR) {
            tok *s = next_tok(p);
            memcpy(o + n, s->s, s->n);
            n += s->n;
        }
        o[n] = '\0';
        node *e = mk(p, E_LIT, t->off, NULL, NULL, NULL);
        if (e != NULL)
            e->lit = v_str(o, n);
        return e;
    }
    if (t->k == T_INT || t->k == T_FLOAT) {
        p->pos++;
        node *e = mk(p, E_LIT, t->off, NULL, NULL, NULL);
        if (e != NULL)
            e->lit = t->k == T_INT ? v_int(t->i) : v_float(t->f);
        return e;
    }
    if (tok_is(t, T_OP, "(") || tok_is(t, T_OP, "[")) {
        bool paren = t->s[0] == '(';
        const char *close = paren ? ")" : "]";
        p->pos++;
        node *l = mk(p, E_LIST, t->off, NULL, NULL, NULL);
        if (l == NULL)
            return NULL;
        size_t cap = 0;
        bool comma = false;
        while (!is_op(p, close)) {
            if (l->args.n > 0 && !expect_op(p, ","))
                goto fail_list;
            if (l->args.n > 0)
                comma = true;
            if (is_op(p, close))
                break;
            node *e = parse_expr(p);
            if (e == NULL || !list_add(p, &l->args, e, &cap))
                goto fail_list;
        }
        p->pos++;
        l->op = paren;  /* a tuple */
        if (paren && l->args.n == 1 && !comma) {
            node *e = l->args.v[0];
            ms_free(l->args.v);
            return e;
        }
        if (!list_seal(p, &l->args, NULL))
            return NULL;
        update_depth(p, l, &l->args);
        return p->st == MS_OK ? l : NULL;
    fail_list:
        ms_free(l->args.v);
        l->args.v = NULL;
        return NULL;
    }
    if (tok_is(t, T_OP, "{")) {
        p->pos++;
        node *d = mk(p, E_DICT, t->off, NULL, NULL, NULL);
        if (d == NULL)
            return NULL;
        size_t cap = 0;
        while (!is_op(p, "}")) {
            if (d->args.n > 0 && !expect_op(p, ","))
                goto fail_dict;
            if (is_op(p, "}"))
                break;
            node *k = parse_expr(p);
            if (k == NULL || !list_add(p, &d->args, k, &cap) || !expect_op(p, ":"))
                goto fail_dict;
            node *v = parse_expr(p);
            if (v == NULL || !list_add(p, &d->args, v, &cap))
                goto fail_dict;
        }
        p->pos++;
        if (!list_seal(p, &d->args, NULL))
            return NULL;
        update_depth(p, d, &d->args);
        return p->st == MS_OK ? d : NULL;
    fail_dict:
        ms_free(d->args.v);
        d->args.v = NULL;
        return NULL;
    }
    perr(p, MS_ERR_PARSE, t->off, "expected an expression, found %s", tok_desc(t, b, sizeof b));
    return NULL;
}

static node *parse_postfix(parser *p, node *n) {
    while (n != NULL) {
        tok *t = peek(p);
        if (tok_is(t, T_OP, ".")) {
            p->pos++;
            tok *nm = peek(p);
            if (nm->k == T_INT) {
                p->pos++;
                node *idx = mk(p, E_LIT, nm->off, NULL, NULL, NULL);
                if (idx == NULL)
                    return NULL;
                idx->lit = v_int(nm->i);
                n = mk(p, E_ITEM, t->off, n, idx, NULL);
                continue;
            }
            if (nm->k != T_NAME) {
                char b[64];
                perr(p, MS_ERR_PARSE, nm->off, "expected an attribute name, found %s", tok_desc(nm, b, sizeof b));
                return NULL;
            }
            p->pos++;
            if (is_op(p, "(")) {
                int m = lookup(methods, MS_ARRAY_LEN(methods), nm->s, nm->n);
                if (m < 0) {
                    perr(p, MS_ERR_UNSUPPORTED, nm->off, "unsupported method '%.*s'", (int)MS_MIN(nm->n, (size_t)64),
                         nm->s);
                    return NULL;
                }
                node *c = mk(p, E_METHOD, nm->off, n, NULL, NULL);
                if (c == NULL)
                    return NULL;
                c->op = m;
                c->s = nm->s;
                c->n = nm->n;
                if (!parse_args(p, c))
                    return NULL;
                n = c;
                continue;
            }
            node *a = mk(p, E_ATTR, nm->off, n, NULL, NULL);
            if (a == NULL)
                return NULL;
            a->s = nm->s;
            a->n = nm->n;
            n = a;
        } else if (tok_is(t, T_OP, "[")) {
            p->pos++;
            node *parts[3] = {NULL, NULL, NULL};
            int np = 0;
            bool slice = false;
            for (;;) {
                if (is_op(p, ":")) {
                    p->pos++;
                    slice = true;
                    if (++np > 2) {
                        perr(p, MS_ERR_PARSE, peek(p)->off, "too many ':' in a slice");
                        return NULL;
                    }
                    continue;
                }
                if (is_op(p, "]"))
                    break;
                if (parts[np] != NULL) {
                    expect_op(p, "]");
                    return NULL;
                }
                parts[np] = parse_expr(p);
                if (parts[np] == NULL)
                    return NULL;
            }
            p->pos++;
            if (!slice) {
                if (parts[0] == NULL) {
                    perr(p, MS_ERR_PARSE, t->off, "empty subscript");
                    return NULL;
                }
                n = mk(p, E_ITEM, t->off, n, parts[0], NULL);
            } else {
                node *s = mk(p, E_SLICE, t->off, n, parts[0], parts[1]);
                if (s == NULL)
                    return NULL;
                if (parts[2] != NULL) {
                    size_t cap = 0;
                    if (!list_add(p, &s->args, parts[2], &cap) || !list_seal(p, &s->args, NULL))
                        return NULL;
                    update_depth(p, s, &s->args);
                }
                n = s;
            }
        } else if (tok_is(t, T_OP, "(")) {
            if (n->k != E_NAME) {
                perr(p, MS_ERR_UNSUPPORTED, t->off,
                     "only the functions raise_exception, namespace, range, strftime_now and dict can be called");
                return NULL;
            }
            int g = lookup(funcs, MS_ARRAY_LEN(funcs), n->s, n->n);
            if (g < 0) {
                perr(p, MS_ERR_UNSUPPORTED, n->off, "unsupported function '%.*s'", (int)MS_MIN(n->n, (size_t)64), n->s);
                return NULL;
            }
            node *c = mk(p, E_CALL, n->off, NULL, NULL, NULL);
            if (c == NULL)
                return NULL;
            c->op = g;
            c->s = n->s;
            c->n = n->n;
            if (!parse_args(p, c))
                return NULL;
            n = c;
        } else {
            break;
        }
    }
    return n;
}

static node *parse_filters(parser *p, node *n) {
    while (n != NULL) {
        if (is_op(p, "|")) {
            p->pos++;
            tok *nm = peek(p);
            if (nm->k != T_NAME) {
                char b[64];
                perr(p, MS_ERR_PARSE, nm->off, "expected a filter name, found %s", tok_desc(nm, b, sizeof b));
                return NULL;
            }
            p->pos++;
            int f = lookup(filters, MS_ARRAY_LEN(filters), nm->s, nm->n);
            if (f < 0) {
                perr(p, MS_ERR_UNSUPPORTED, nm->off, "unsupported filter '%.*s'", (int)MS_MIN(nm->n, (size_t)64),
                     nm->s);
                return NULL;
            }
            node *c = mk(p, E_FILTER, nm->off, n, NULL, NULL);
            if (c == NULL)
                return NULL;
            c->op = f;
            c->s = nm->s;
            c->n = nm->n;
            if (is_op(p, "(") && !parse_args(p, c))
                return NULL;
            n = c;
        } else if (is_name(p, "is")) {
            p->pos++;
            bool neg = accept_name(p, "not");
            tok *nm = peek(p);
            if (nm->k != T_NAME) {
                char b[64];
                perr(p, MS_ERR_PARSE, nm->off, "expected a test name, found %s", tok_desc(nm, b, sizeof b));
                return NULL;
            }
            p->pos++;
            int x = lookup(tests, MS_ARRAY_LEN(tests), nm->s, nm->n);
            if (x < 0) {
                perr(p, MS_ERR_UNSUPPORTED, nm->off, "unsupported test '%.*s'", (int)MS_MIN(nm->n, (size_t)64), nm->s);
                return NULL;
            }
            node *c = mk(p, E_TEST, nm->off, n, NULL, NULL);
            if (c == NULL)
                return NULL;
            c->op = x;
            c->negate = neg;
            if (is_op(p, "(")) {
                if (!parse_args(p, c))
                    return NULL;
            } else {
                tok *a = peek(p);
                bool arg = a->k == T_STR || a->k == T_INT || a->k == T_FLOAT || tok_is(a, T_OP, "[") ||
                           tok_is(a, T_OP, "{") ||
                           (a->k == T_NAME && !tok_is(a, T_NAME, "else") && !tok_is(a, T_NAME, "or") &&
                            !tok_is(a, T_NAME, "and") && !tok_is(a, T_NAME, "if") && !tok_is(a, T_NAME, "is") &&
                            !tok_is(a, T_NAME, "in") && !tok_is(a, T_NAME, "not"));
                if (arg) {
                    node *e = parse_primary(p);
                    e = parse_postfix(p, e);
                    size_t cap = 0;
                    if (e == NULL || !list_add(p, &c->args, e, &cap) || !list_seal(p, &c->args, NULL))
                        return NULL;
                    update_depth(p, c, &c->args);
                }
            }
            n = c;
        } else {
            break;
        }
    }
    return n;
}

static bool nest_enter(parser *p) {
    if (++p->block_depth > CT_MAX_NODE_DEPTH + CT_MAX_BLOCK_DEPTH) {
        perr(p, MS_ERR_LIMIT, peek(p)->off, "expression nested deeper than %d", CT_MAX_NODE_DEPTH);
        return false;
    }
    return true;
}

static node *parse_unary(parser *p, bool with_filter) {
    tok *t = peek(p);
    node *n;
    if (tok_is(t, T_OP, "-") || tok_is(t, T_OP, "+")) {
        p->pos++;
        node *a = nest_enter(p) ? parse_unary(p, false) : NULL;
        p->block_depth--;
        n = a == NULL ? NULL : mk(p, t->s[0] == '-' ? E_NEG : E_POS, t->off, a, NULL, NULL);
    } else {
        n = parse_postfix(p, parse_primary(p));
    }
    return with_filter ? parse_filters(p, n) : n;
}

static node *parse_pow(parser *p) {
    node *l = parse_unary(p, true);
    while (l != NULL && is_op(p, "**")) {
        tok *t = next_tok(p);
        node *r = parse_unary(p, true);
        l = r == NULL ? NULL : mk(p, E_BIN, t->off, l, r, NULL);
        if (l != NULL)
            l->op = OP_POW;
    }
    return l;
}

static node *parse_math2(parser *p) {
    node *l = parse_pow(p);
    for (;;) {
        int op = is_op(p, "*")    ? OP_MUL
                 : is_op(p, "/")  ? OP_DIV
                 : is_op(p, "//") ? OP_FLOORDIV
                 : is_op(p, "%")  ? OP_MOD
                                  : -1;
        if (l == NULL || op < 0)
            return l;
        tok *t = next_tok(p);
        node *r = parse_pow(p);
        l = r == NULL ? NULL : mk(p, E_BIN, t->off, l, r, NULL);
        if (l != NULL)
            l->op = op;
    }
}

static node *parse_concat(parser *p) {
    node *l = parse_math2(p);
    while (l != NULL && is_op(p, "~")) {
        tok *t = next_tok(p);
        node *r = parse_math2(p);
        l = r == NULL ? NULL : mk(p, E_CONCAT, t->off, l, r, NULL);
    }
    return l;
}

static node *parse_math1(parser *p) {
    node *l = parse_concat(p);
    for (;;) {
        int op = is_op(p, "+") ? OP_ADD : is_op(p, "-") ? OP_SUB : -1;
        if (l == NULL || op < 0)
            return l;
        tok *t = next_tok(p);
        node *r = parse_concat(p);
        l = r == NULL ? NULL : mk(p, E_BIN, t->off, l, r, NULL);
        if (l != NULL)
            l->op = op;
    }
}

static node *parse_compare(parser *p) {
    node *l = parse_math1(p);
    for (;;) {
        if (l == NULL)
            return NULL;
        int op = -1;
        tok *t = peek(p);
        static const char *const cmp[] = {"==", "!=", "<", ">", "<=", ">="};
        for (int k = 0; k < 6; k++)
            if (is_op(p, cmp[k]))
                op = OP_EQ + k;
        if (op >= 0) {
            p->pos++;
        } else if (is_name(p, "in")) {
            p->pos++;
            op = OP_IN;
        } else if (is_name(p, "not") && tok_is(peek2(p), T_NAME, "in")) {
            p->pos += 2;
            op = OP_NOTIN;
        } else {
            return l;
        }
        node *r = parse_math1(p);
        l = r == NULL ? NULL : mk(p, E_BIN, t->off, l, r, NULL);
        if (l != NULL)
            l->op = op;
    }
}

static node *parse_not(parser *p) {
    if (is_name(p, "not")) {
        tok *t = next_tok(p);
        node *a = nest_enter(p) ? parse_not(p) : NULL;
        p->block_depth--;
        return a == NULL ? NULL : mk(p, E_NOT, t->off, a, NULL, NULL);
    }
    return parse_compare(p);
}

static node *parse_and(parser *p) {
    node *l = parse_not(p);
    while (l != NULL && is_name(p, "and")) {
        tok *t = next_tok(p);
        node *r = parse_not(p);
        l = r == NULL ? NULL : mk(p, E_AND, t->off, l, r, NULL);
    }
    return l;
}

static node *parse_or(parser *p) {
    node *l = parse_and(p);
    while (l != NULL && is_name(p, "or")) {
        tok *t = next_tok(p);
        node *r = parse_and(p);
        l = r == NULL ? NULL : mk(p, E_OR, t->off, l, r, NULL);
    }
    return l;
}

static node *parse_expr(parser *p) {
    /* The C recursion per nested bracket is bounded by the node depth check (mk) only after the
     * inner expression is built, so bound the descent itself too. */
    if (++p->block_depth > CT_MAX_NODE_DEPTH + CT_MAX_BLOCK_DEPTH) {
        p->block_depth--;
        perr(p, MS_ERR_LIMIT, peek(p)->off, "expression nested deeper than %d", CT_MAX_NODE_DEPTH);
        return NULL;
    }
    node *n = parse_or(p);
    while (n != NULL && is_name(p, "if")) {
        tok *t = next_tok(p);
        node *c = parse_or(p);
        node *e = NULL;
        if (c != NULL && accept_name(p, "else")) {
            e = parse_expr(p);
            if (e == NULL)
                c = NULL;
        }
        n = c == NULL ? NULL : mk(p, E_COND, t->off, n, c, e);
    }
    p->block_depth--;
    return n;
}

/* ---- statements ---- */

static bool expect_block_end(parser *p) {
    if (peek(p)->k == T_BLOCK_END) {
        p->pos++;
        return true;
    }
    char b[64];
    perr(p, MS_ERR_PARSE, peek(p)->off, "expected '%%}', found %s", tok_desc(peek(p), b, sizeof b));
    return false;
}

/* Parse statements until a block tag named in `ends` (NULL-terminated); the BLOCK_BEGIN and the
 * tag name are consumed, *which receives the index of the end tag. */
static bool parse_body(parser *p, nodelist *out, const char *const *ends, int *which, size_t open_off,
                       const char *opener);

static bool parse_for(parser *p, node *n) {
    size_t cap = 0;
    const char **names = NULL;
    for (;;) {
        tok *t = peek(p);
        if (t->k != T_NAME) {
            char b[64];
            perr(p, MS_ERR_PARSE, t->off, "expected a loop variable, found %s", tok_desc(t, b, sizeof b));
            ms_free(names);
            return false;
        }
        p->pos++;
        if (ms_grow((void **)&names, &cap, n->nnames + 1, sizeof *names) != MS_OK) {
            ms_free(names);
            return perr(p, MS_ERR_OOM, t->off, "out of memory"), false;
        }
        names[n->nnames] = arena_strndup(p, t->s, t->n);
        if (names[n->nnames++] == NULL) {
            ms_free(names);
            return false;
        }
        if (!accept_op(p, ","))
            break;
    }
    n->names = arena_alloc(&p->t->arena, n->nnames * sizeof *n->names);
    if (n->names == NULL) {
        ms_free(names);
        return perr(p, MS_ERR_OOM, n->off, "out of memory"), false;
    }
    memcpy(n->names, names, n->nnames * sizeof *names);
    ms_free(names);
    if (!accept_name(p, "in")) {
        char b[64];
        return perr(p, MS_ERR_PARSE, peek(p)->off, "expected 'in', found %s", tok_desc(peek(p), b, sizeof b)), false;
    }
    n->a = parse_or(p);  /* jinja2: parse_tuple(with_condexpr=False) */
    if (n->a == NULL)
        return false;
    if (accept_name(p, "if")) {
        n->b = parse_expr(p);
        if (n->b == NULL)
            return false;
    }
    if (is_name(p, "recursive"))
        return perr(p, MS_ERR_UNSUPPORTED, peek(p)->off, "unsupported: recursive loops"), false;
    if (!expect_block_end(p))
        return false;
    static const char *const ends[] = {"endfor", "else", NULL};
    int which;
    if (!parse_body(p, &n->body, ends, &which, n->off, "for"))
        return false;
    if (which == 1) {
        if (!expect_block_end(p))
            return false;
        static const char *const ends2[] = {"endfor", NULL};
        if (!parse_body(p, &n->orelse, ends2, &which, n->off, "for"))
            return false;
    }
    return expect_block_end(p);
}

static bool parse_if(parser *p, node *n) {
    n->a = parse_expr(p);
    if (n->a == NULL || !expect_block_end(p))
        return false;
    static const char *const ends[] = {"endif", "elif", "else", NULL};
    int which;
    if (!parse_body(p, &n->body, ends, &which, n->off, "if"))
        return false;
    if (which == 1) {
        size_t off = p->toks[p->pos - 1].off;
        node *e = mk(p, N_IF, off, NULL, NULL, NULL);
        size_t cap = 0;
        if (e == NULL || !list_add(p, &n->orelse, e, &cap) || !list_seal(p, &n->orelse, NULL))
            return false;
        return parse_if(p, e);
    }
    if (which == 2) {
        if (!expect_block_end(p))
            return false;
        static const char *const ends2[] = {"endif", NULL};
        if (!parse_body(p, &n->orelse, ends2, &which, n->off, "if"))
            return false;
    }
    return expect_block_end(p);
}

static bool parse_set(parser *p, node *n) {
    tok *t = peek(p);
    if (t->k != T_NAME) {
        char b[64];
        return perr(p, MS_ERR_PARSE, t->off, "expected a name to set, found %s", tok_desc(t, b, sizeof b)), false;
    }
    p->pos++;
    n->s = t->s;
    n->n = t->n;
    if (accept_op(p, ".")) {
        tok *a = peek(p);
        if (a->k != T_NAME) {
            char b[64];
            return perr(p, MS_ERR_PARSE, a->off, "expected an attribute name, found %s", tok_desc(a, b, sizeof b)),
                   false;
        }
        p->pos++;
        n->k = N_SETATTR;
        n->names = arena_alloc(&p->t->arena, sizeof *n->names);
        if (n->names == NULL)
            return perr(p, MS_ERR_OOM, a->off, "out of memory"), false;
        n->names[0] = arena_strndup(p, a->s, a->n);
        if (n->names[0] == NULL)
            return false;
        n->nnames = 1;
    }
    if (is_op(p, ",") )
        return perr(p, MS_ERR_UNSUPPORTED, peek(p)->off, "unsupported: set with several targets"), false;
    if (n->k == N_SET && peek(p)->k == T_BLOCK_END) {
        p->pos++;
        n->k = N_SETBLOCK;
        static const char *const ends[] = {"endset", NULL};
        int which;
        if (!parse_body(p, &n->body, ends, &which, n->off, "set"))
            return false;
        return expect_block_end(p);
    }
    if (!expect_op(p, "="))
        return false;
    n->a = parse_expr(p);
    if (n->a == NULL)
        return false;
    return expect_block_end(p);
}

static bool parse_body(parser *p, nodelist *out, const char *const *ends, int *which, size_t open_off,
                       const char *opener) {
    size_t cap = 0;
    if (++p->block_depth > CT_MAX_BLOCK_DEPTH) {
        perr(p, MS_ERR_LIMIT, open_off, "blocks nested deeper than %d", CT_MAX_BLOCK_DEPTH);
        goto fail;
    }
    for (;;) {
        tok *t = peek(p);
        node *n = NULL;
        if (t->k == T_EOF) {
            if (ends == NULL)
                break;
            int line, col;
            src_pos(p->src, open_off, &line, &col);
            perr(p, MS_ERR_PARSE, t->off, "missing '{%% %s %%}' (to close '{%% %s %%}' at %d:%d)", ends[0], opener,
                 line, col);
            goto fail;
        }
        if (t->k == T_TEXT) {
            p->pos++;
            n = mk(p, N_TEXT, t->off, NULL, NULL, NULL);
            if (n == NULL)
                goto fail;
            n->s = t->s;
            n->n = t->n;
        } else if (t->k == T_VAR_BEGIN) {
            p->pos++;
            node *e = parse_expr(p);
            if (e == NULL)
                goto fail;
            if (peek(p)->k != T_VAR_END) {
                char b[64];
                perr(p, MS_ERR_PARSE, peek(p)->off, "expected '}}', found %s", tok_desc(peek(p), b, sizeof b));
                goto fail;
            }
            p->pos++;
            n = mk(p, N_OUT, t->off, e, NULL, NULL);
            if (n == NULL)
                goto fail;
        } else if (t->k == T_BLOCK_BEGIN) {
            p->pos++;
            tok *nm = peek(p);
            if (nm->k != T_NAME) {
                char b[64];
                perr(p, MS_ERR_PARSE, nm->off, "expected a tag name, found %s", tok_desc(nm, b, sizeof b));
                goto fail;
            }
            for (int k = 0; ends != NULL && ends[k] != NULL; k++) {
                if (tok_is(nm, T_NAME, ends[k])) {
                    p->pos++;
                    *which = k;
                    goto done;
                }
            }
            p->pos++;
            if (tok_is(nm, T_NAME, "for")) {
                n = mk(p, N_FOR, nm->off, NULL, NULL, NULL);
                if (n == NULL || !parse_for(p, n))
                    goto fail;
            } else if (tok_is(nm, T_NAME, "if")) {
                n = mk(p, N_IF, nm->off, NULL, NULL, NULL);
                if (n == NULL || !parse_if(p, n))
                    goto fail;
            } else if (tok_is(nm, T_NAME, "set")) {
                n = mk(p, N_SET, nm->off, NULL, NULL, NULL);
                if (n == NULL || !parse_set(p, n))
                    goto fail;
            } else if (tok_is(nm, T_NAME, "generation")) {
                /* transformers' AssistantTracker: marks assistant text, renders its body as is */
                n = mk(p, N_IF, nm->off, NULL, NULL, NULL);
                node *yes = mk(p, E_LIT, nm->off, NULL, NULL, NULL);
                if (n == NULL || yes == NULL || !expect_block_end(p))
                    goto fail;
                yes->lit = v_bool(true);
                n->a = yes;
                static const char *const gen_end[] = {"endgeneration", NULL};
                int w;
                if (!parse_body(p, &n->body, gen_end, &w, nm->off, "generation") || !expect_block_end(p))
                    goto fail;
            } else if (tok_is(nm, T_NAME, "break") || tok_is(nm, T_NAME, "continue")) {
                n = mk(p, nm->s[0] == 'b' ? N_BREAK : N_CONTINUE, nm->off, NULL, NULL, NULL);
                if (n == NULL || !expect_block_end(p))
                    goto fail;
            } else {
                static const char *const known_ends[] = {"endfor", "endif", "elif", "else", "endset", "endgeneration"};
                if (lookup(known_ends, MS_ARRAY_LEN(known_ends), nm->s, nm->n) >= 0)
                    perr(p, MS_ERR_PARSE, nm->off, "unexpected '{%% %.*s %%}'", (int)nm->n, nm->s);
                else
                    perr(p, MS_ERR_UNSUPPORTED, nm->off, "unsupported tag '%.*s'", (int)MS_MIN(nm->n, (size_t)64),
                         nm->s);
                goto fail;
            }
        } else {
            char b[64];
            perr(p, MS_ERR_PARSE, t->off, "unexpected %s", tok_desc(t, b, sizeof b));
            goto fail;
        }
        if (!list_add(p, out, n, &cap))
            goto fail;
    }
done:
    p->block_depth--;
    return list_seal(p, out, NULL);
fail:
    p->block_depth--;
    ms_free(out->v);
    out->v = NULL;
    out->n = 0;
    return false;
}

/* ---- public: init / free ---- */

void ms_chat_template_free(ms_chat_template *t) {
    if (t == NULL)
        return;
    arena_free(&t->arena);
    ms_free(t->src);
    ms_free(t->name);
    ms_free(t);
}

/* jinja2 reads the source through str.splitlines() + "\n".join: every line break (\r\n, \r, \n,
 * \v, \f, \x1c-\x1e, U+0085, U+2028, U+2029) becomes \n and one trailing break is dropped. */
static char *normalize_source(const char *text, size_t *len_out) {
    size_t n = strlen(text);
    char *o = ms_malloc(n + 1);
    if (o == NULL)
        return NULL;
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)text[i];
        if (c == '\r') {
            if (i + 1 < n && text[i + 1] == '\n')
                i++;
            o[j++] = '\n';
        } else if (c == '\v' || c == '\f' || c == 0x1c || c == 0x1d || c == 0x1e) {
            o[j++] = '\n';
        } else if (c == 0xC2 && i + 1 < n && (unsigned char)text[i + 1] == 0x85) {
            o[j++] = '\n';
            i++;
        } else if (c == 0xE2 && i + 2 < n && (unsigned char)text[i + 1] == 0x80 &&
                   ((unsigned char)text[i + 2] == 0xA8 || (unsigned char)text[i + 2] == 0xA9)) {
            o[j++] = '\n';
            i += 2;
        } else {
            o[j++] = (char)c;
        }
    }
    if (j > 0 && o[j - 1] == '\n')
        j--;
    o[j] = '\0';
    *len_out = j;
    return o;
}

ms_status ms_chat_template_init(ms_chat_template **out, const char *text, const char *name, ms_error *err) {
    *out = NULL;
    if (text == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "chat template: no text");
    ms_chat_template *t = ms_calloc(1, sizeof *t);
    if (t == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "chat template: out of memory");
    t->name = ms_strdup(name != NULL ? name : "chat_template");
    t->src = normalize_source(text, &t->len);
    if (t->name == NULL || t->src == NULL) {
        ms_chat_template_free(t);
        return MS_FAIL(err, MS_ERR_OOM, "chat template: out of memory");
    }
    parser p = {.t = t, .src = t->src, .len = t->len, .err = err, .st = MS_OK};
    if (lex(&p)) {
        int which;
        parse_body(&p, &t->root, NULL, &which, 0, "");
    }
    ms_free(p.toks);
    if (p.st != MS_OK) {
        ms_chat_template_free(t);
        return p.st;
    }
    *out = t;
    return MS_OK;
}

/* ---- renderer ---- */

/* Names point into the template or the variables' JSON keys, which outlive the render. */
typedef struct scope_ent {
    const char *name;
    size_t len;
    ct_val v;
} scope_ent;

typedef struct scope {
    struct scope *up;
    scope_ent *e;
    size_t n, cap;
} scope;

typedef struct buf {
    char *p;
    size_t n, cap;
} buf;

typedef struct render {
    const ms_chat_template *t;
    ct_arena a;
    ms_error *err;
    ms_status st;
    int64_t steps;
    buf *out;
    scope *sc;
    int brk;  /* 1 break, 2 continue */
} render;

static bool rerr(render *r, ms_status code, const node *n, const char *fmt, ...) MS_PRINTF(4, 5);
static bool rerr(render *r, ms_status code, const node *n, const char *fmt, ...) {
    if (r->st != MS_OK)
        return false;
    char msg[800];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int line = 0, col = 0;
    src_pos(r->t->src, n != NULL ? n->off : 0, &line, &col);
    r->st = code;
    MS_FAIL(r->err, code, "%s:%d:%d: %s", r->t->name, line, col, msg);
    return false;
}

static void *ralloc(render *r, const node *n, size_t sz) {
    void *p = arena_alloc(&r->a, sz);
    if (p == NULL) {
        if (r->a.total + sz > CT_MAX_MEM)
            rerr(r, MS_ERR_LIMIT, n, "the render needs more than %zu MiB", CT_MAX_MEM >> 20);
        else
            rerr(r, MS_ERR_OOM, n, "out of memory");
    }
    return p;
}

static bool buf_add(render *r, const node *n, buf *b, const char *s, size_t len) {
    if (len == 0)
        return true;
    if (b->n + len + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + len + 1)
            cap *= 2;
        if (cap > CT_MAX_MEM)
            return rerr(r, MS_ERR_LIMIT, n, "the output exceeds %zu MiB", CT_MAX_MEM >> 20);
        char *np = ms_realloc(b->p, cap);
        if (np == NULL)
            return rerr(r, MS_ERR_OOM, n, "out of memory");
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, len);
    b->n += len;
    b->p[b->n] = '\0';
    return true;
}

static const char *type_name(ct_val v) {
    switch (v.k) {
    case V_UNDEF: return "undefined";
    case V_NONE: return "none";
    case V_BOOL: return "bool";
    case V_INT: return "int";
    case V_FLOAT: return "float";
    case V_STR: return "string";
    case V_LIST: return "list";
    case V_DICT: return v.u.d->ns ? "namespace" : "dict";
    case V_LOOP: return "loop";
    case V_FUNC: return "function";
    }
    return "?";
}

static bool truthy(ct_val v) {
    switch (v.k) {
    case V_UNDEF: case V_NONE: return false;
    case V_BOOL: return v.u.b;
    case V_INT: return v.u.i != 0;
    case V_FLOAT: return v.u.f != 0.0;
    case V_STR: return v.u.s.n > 0;
    case V_LIST: return v.u.l->n > 0;
    case V_DICT: return v.u.d->ns || v.u.d->n > 0;
    case V_LOOP: case V_FUNC: return true;
    }
    return false;
}

static ct_list *new_list(render *r, const node *n, size_t cap) {
    ct_list *l = ralloc(r, n, sizeof *l);
    if (l == NULL)
        return NULL;
    memset(l, 0, sizeof *l);
    l->depth = 1;
    if (cap > 0) {
        l->v = ralloc(r, n, cap * sizeof *l->v);
        if (l->v == NULL)
            return NULL;
        l->cap = cap;
    }
    return l;
}

static bool list_push(render *r, const node *n, ct_list *l, ct_val v) {
    if (v_depth(v) + 1 > CT_MAX_VALUE_DEPTH)
        return rerr(r, MS_ERR_LIMIT, n, "a value nested deeper than %d", CT_MAX_VALUE_DEPTH);
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 4;
        ct_val *nv = ralloc(r, n, cap * sizeof *nv);
        if (nv == NULL)
            return false;
        if (l->n > 0)
            memcpy(nv, l->v, l->n * sizeof *nv);
        l->v = nv;
        l->cap = cap;
    }
    l->v[l->n++] = v;
    if (v_depth(v) + 1 > l->depth)
        l->depth = v_depth(v) + 1;
    return true;
}

static ct_dict *new_dict(render *r, const node *n) {
    ct_dict *d = ralloc(r, n, sizeof *d);
    if (d != NULL) {
        memset(d, 0, sizeof *d);
        d->depth = 1;
    }
    return d;
}

static bool str_eq(ct_val a, const char *s, size_t n) { return a.u.s.n == n && memcmp(a.u.s.p, s, n) == 0; }

static ct_val *dict_find(const ct_dict *d, const char *s, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (str_eq(d->keys[i], s, n))
            return &d->vals[i];
    return NULL;
}

static bool dict_set(render *r, const node *n, ct_dict *d, ct_val k, ct_val v) {
    if (v_depth(v) + 1 > CT_MAX_VALUE_DEPTH)
        return rerr(r, MS_ERR_LIMIT, n, "a value nested deeper than %d", CT_MAX_VALUE_DEPTH);
    ct_val *slot = dict_find(d, k.u.s.p, k.u.s.n);
    if (slot != NULL) {
        *slot = v;
    } else {
        if (d->n == d->cap) {
            size_t cap = d->cap ? d->cap * 2 : 4;
            ct_val *nk = ralloc(r, n, cap * sizeof *nk), *nv = ralloc(r, n, cap * sizeof *nv);
            if (nk == NULL || nv == NULL)
                return false;
            if (d->n > 0) {
                memcpy(nk, d->keys, d->n * sizeof *nk);
                memcpy(nv, d->vals, d->n * sizeof *nv);
            }
            d->keys = nk;
            d->vals = nv;
            d->cap = cap;
        }
        d->keys[d->n] = k;
        d->vals[d->n++] = v;
    }
    if (v_depth(v) + 1 > d->depth)
        d->depth = v_depth(v) + 1;
    return true;
}

/* ---- strings: UTF-8 code points, Python's whitespace ---- */

/* Length in bytes of the code point at s[0] (an invalid byte counts as one). */
static size_t cp_len(const char *s, size_t n) {
    unsigned char c = (unsigned char)s[0];
    size_t l = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (l > n)
        return 1;
    for (size_t i = 1; i < l; i++)
        if (((unsigned char)s[i] & 0xC0) != 0x80)
            return 1;
    return l;
}

static uint32_t cp_at(const char *s, size_t l) {
    const unsigned char *u = (const unsigned char *)s;
    switch (l) {
    case 2: return ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3F);
    case 3: return ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3F);
    case 4:
        return ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) | ((uint32_t)(u[2] & 0x3F) << 6) |
               (u[3] & 0x3F);
    default: return u[0];
    }
}

static size_t cp_count(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i += cp_len(s + i, n - i))
        c++;
    return c;
}

/* Python's str.isspace */
static bool py_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Strip from the left (mode 1), right (2) or both (3): whitespace, or the code points of chars. */
/* Whether the code point at q (l bytes, value c) is one strip() removes: Python whitespace when
 * chars is NULL, else one of the code points of the string chars. */
static bool strip_hit(const ct_val *chars, const char *q, size_t l, uint32_t c) {
    if (chars == NULL)
        return py_space(c);
    for (size_t i = 0; i < chars->u.s.n;) {
        size_t l2 = cp_len(chars->u.s.p + i, chars->u.s.n - i);
        if (l2 == l && memcmp(chars->u.s.p + i, q, l) == 0)
            return true;
        i += l2;
    }
    return false;
}

static ct_val str_strip(ct_val s, int mode, const ct_val *chars) {
    const char *p = s.u.s.p;
    size_t a = 0, b = s.u.s.n;
    if (mode & 1) {
        while (a < b) {
            size_t l = cp_len(p + a, b - a);
            uint32_t c = cp_at(p + a, l);
            bool hit = strip_hit(chars, p + a, l, c);
            if (!hit)
                break;
            a += l;
        }
    }
    if (mode & 2) {
        while (b > a) {
            size_t st = b - 1;
            while (st > a && ((unsigned char)p[st] & 0xC0) == 0x80 && b - st < 4)
                st--;
            size_t l = cp_len(p + st, b - st);
            if (st + l != b) {
                st = b - 1;
                l = 1;
            }
            uint32_t c = cp_at(p + st, l);
            bool hit = strip_hit(chars, p + st, l, c);
            if (!hit)
                break;
            b = st;
        }
    }
    return v_str(p + a, b - a);
}

/* Case mappings of Python's str for ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic (other
 * code points are left as they are; ß upper-cases to "SS", final sigma is not special-cased). */
static uint32_t cp_upper(uint32_t c) {
    if (c >= 'a' && c <= 'z')
        return c - 32;
    if (c < 0x80)
        return c;
    if (c >= 0xE0 && c <= 0xFE && c != 0xF7)
        return c - 32;
    if (c == 0xFF)
        return 0x178;
    if (c == 0xB5)
        return 0x39C;
    if (c >= 0x100 && c <= 0x17F) {
        if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E))
            return c % 2 == 0 ? c - 1 : c;
        if (c == 0x131)
            return 'I';
        if (c == 0x17F)
            return 'S';
        if (c == 0x130 || c == 0x138 || c == 0x149 || c == 0x178)
            return c;
        return c % 2 == 1 ? c - 1 : c;
    }
    if (c >= 0x3B1 && c <= 0x3CB)
        return c == 0x3C2 ? 0x3A3 : c - 32;
    if (c == 0x3AC)
        return 0x386;
    if (c >= 0x3AD && c <= 0x3AF)
        return c - 37;
    if (c == 0x3CC)
        return 0x38C;
    if (c == 0x3CD || c == 0x3CE)
        return c - 63;
    if (c >= 0x430 && c <= 0x44F)
        return c - 32;
    if (c >= 0x450 && c <= 0x45F)
        return c - 80;
    return c;
}

static uint32_t cp_lower(uint32_t c) {
    if (c >= 'A' && c <= 'Z')
        return c + 32;
    if (c < 0x80)
        return c;
    if (c >= 0xC0 && c <= 0xDE && c != 0xD7)
        return c + 32;
    if (c == 0x178)
        return 0xFF;
    if (c >= 0x100 && c <= 0x17F) {
        if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E))
            return c % 2 == 1 ? c + 1 : c;
        if (c == 0x130 || c == 0x131 || c == 0x138 || c == 0x149 || c == 0x17F)
            return c;
        return c % 2 == 0 ? c + 1 : c;
    }
    if (c >= 0x391 && c <= 0x3AB && c != 0x3A2)
        return c + 32;
    if (c == 0x386)
        return 0x3AC;
    if (c >= 0x388 && c <= 0x38A)
        return c + 37;
    if (c == 0x38C)
        return 0x3CC;
    if (c == 0x38E || c == 0x38F)
        return c + 63;
    if (c >= 0x410 && c <= 0x42F)
        return c + 32;
    if (c >= 0x400 && c <= 0x40F)
        return c + 80;
    return c;
}

static bool cp_cased(uint32_t c) { return c == 0xDF || cp_upper(c) != c || cp_lower(c) != c; }

/* mode 0: str.upper, 1: str.lower, 2: str.capitalize, 3: str.title, 4: jinja2's title filter
 * (words split at runs of - ( { [ < and white space; first character upper, the rest lower). */
static ct_val str_case(render *r, const node *n, ct_val s, int mode) {
    char *o = ralloc(r, n, 2 * s.u.s.n + 1);
    if (o == NULL)
        return v_undef();
    size_t w = 0;
    bool word_start = true;
    for (size_t i = 0; i < s.u.s.n;) {
        size_t l = cp_len(s.u.s.p + i, s.u.s.n - i);
        uint32_t c = cp_at(s.u.s.p + i, l);
        bool valid = l > 1 || (unsigned char)s.u.s.p[i] < 0x80;
        bool up;
        if (mode == 0)
            up = true;
        else if (mode == 1)
            up = false;
        else if (mode == 2)
            up = i == 0;
        else
            up = word_start;
        if (mode == 3)
            word_start = !cp_cased(c);
        else if (mode == 4)
            word_start = c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || py_space(c);
        if (!valid) {
            o[w++] = s.u.s.p[i];
        } else if (c == 0xDF && up) {
            o[w++] = 'S';
            o[w++] = mode == 0 || mode == 4 ? 'S' : 's';
        } else {
            put_utf8(o, &w, up ? cp_upper(c) : cp_lower(c));
        }
        i += l;
    }
    o[w] = '\0';
    return v_str(o, w);
}

static ct_val str_cat(render *r, const node *n, const char *a, size_t an, const char *b, size_t bn) {
    char *o = ralloc(r, n, an + bn + 1);
    if (o == NULL)
        return v_undef();
    if (an)
        memcpy(o, a, an);
    if (bn)
        memcpy(o + an, b, bn);
    o[an + bn] = '\0';
    return v_str(o, an + bn);
}

static const char *find_sub(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn == 0)
        return h;
    if (nn > hn)
        return NULL;
    for (size_t i = 0; i + nn <= hn; i++)
        if (h[i] == nd[0] && memcmp(h + i, nd, nn) == 0)
            return h + i;
    return NULL;
}

static ct_val str_replace(render *r, const node *n, ct_val s, ct_val from, ct_val to, int64_t count) {
    buf b = {0};
    size_t i = 0;
    int64_t done = 0;
    bool ok = true;
    if (from.u.s.n == 0) {
        /* Python inserts `to` between every code point (and at both ends) */
        while (ok && (count < 0 || done < count) && i <= s.u.s.n) {
            ok = buf_add(r, n, &b, to.u.s.p, to.u.s.n);
            done++;
            if (i == s.u.s.n)
                break;
            size_t l = cp_len(s.u.s.p + i, s.u.s.n - i);
            ok = ok && buf_add(r, n, &b, s.u.s.p + i, l);
            i += l;
        }
    } else {
        while (ok && (count < 0 || done < count)) {
            const char *f = find_sub(s.u.s.p + i, s.u.s.n - i, from.u.s.p, from.u.s.n);
            if (f == NULL)
                break;
            size_t at = (size_t)(f - s.u.s.p);
            ok = buf_add(r, n, &b, s.u.s.p + i, at - i) && buf_add(r, n, &b, to.u.s.p, to.u.s.n);
            i = at + from.u.s.n;
            done++;
        }
    }
    if (ok && i < s.u.s.n)
        ok = buf_add(r, n, &b, s.u.s.p + i, s.u.s.n - i);
    ct_val res = v_undef();
    if (ok) {
        char *o = ralloc(r, n, b.n + 1);
        if (o != NULL) {
            if (b.n)
                memcpy(o, b.p, b.n);
            o[b.n] = '\0';
            res = v_str(o, b.n);
        }
    }
    ms_free(b.p);
    return res;
}

/* ---- conversions: Python's str() / repr() and json.dumps ---- */

/* Python's repr of a float (shortest round-trip digits, exponent when < 1e-4 or >= 1e16). */
static void py_float(double f, char *o, size_t on, bool json) {
    if (isnan(f)) {
        snprintf(o, on, "%s", json ? "NaN" : "nan");
        return;
    }
    if (isinf(f)) {
        snprintf(o, on, "%s", f > 0 ? (json ? "Infinity" : "inf") : (json ? "-Infinity" : "-inf"));
        return;
    }
    char tmp[64];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f)
            break;
    }
    /* tmp = [-]d[.ddd]e[+-]XX */
    char digits[32];
    size_t nd = 0;
    const char *q = tmp;
    bool neg = *q == '-';
    if (neg)
        q++;
    while (*q != 'e') {
        if (*q != '.')
            digits[nd++] = *q;
        q++;
    }
    int exp = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = '\0';
    size_t k = 0;
    char *w = o;
    if (neg)
        w[k++] = '-';
    if (exp >= -5 && exp < 16) {
        if (exp < 0) {
            w[k++] = '0';
            w[k++] = '.';
            for (int z = 0; z < -exp - 1; z++)
                w[k++] = '0';
            for (size_t i = 0; i < nd; i++)
                w[k++] = digits[i];
        } else {
            for (int i = 0; i <= exp; i++)
                w[k++] = (size_t)i < nd ? digits[i] : '0';
            w[k++] = '.';
            if ((size_t)exp + 1 < nd) {
                for (size_t i = (size_t)exp + 1; i < nd; i++)
                    w[k++] = digits[i];
            } else {
                w[k++] = '0';
            }
        }
        w[k] = '\0';
        if (exp == -5) {
            /* Python switches to the exponent below 1e-4 */
            goto expo;
        }
        return;
    }
expo:
    k = neg ? 1 : 0;
    w[k++] = digits[0];
    if (nd > 1) {
        w[k++] = '.';
        for (size_t i = 1; i < nd; i++)
            w[k++] = digits[i];
    }
    snprintf(w + k, on - k, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
}

static bool write_val(render *r, const node *n, buf *b, ct_val v, int how);
enum { W_STR, W_REPR, W_JSON };

static bool write_json_str(render *r, const node *n, buf *b, ct_val s) {
    bool ok = buf_add(r, n, b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; ok && i < s.u.s.n; i++) {
        unsigned char c = (unsigned char)s.u.s.p[i];
        const char *esc = NULL;
        char hex[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) {
                snprintf(hex, sizeof hex, "\\u%04x", c);
                esc = hex;
            }
        }
        if (esc != NULL) {
            ok = buf_add(r, n, b, s.u.s.p + run, i - run) && buf_add(r, n, b, esc, strlen(esc));
            run = i + 1;
        }
    }
    return ok && buf_add(r, n, b, s.u.s.p + run, s.u.s.n - run) && buf_add(r, n, b, "\"", 1);
}

static bool write_repr_str(render *r, const node *n, buf *b, ct_val s) {
    char q = memchr(s.u.s.p, '\'', s.u.s.n) != NULL && memchr(s.u.s.p, '"', s.u.s.n) == NULL ? '"' : '\'';
    bool ok = buf_add(r, n, b, &q, 1);
    for (size_t i = 0; ok && i < s.u.s.n; i++) {
        unsigned char c = (unsigned char)s.u.s.p[i];
        char e[8];
        if (c == (unsigned char)q || c == '\\') {
            e[0] = '\\';
            e[1] = (char)c;
            ok = buf_add(r, n, b, e, 2);
        } else if (c == '\n') {
            ok = buf_add(r, n, b, "\\n", 2);
        } else if (c == '\r') {
            ok = buf_add(r, n, b, "\\r", 2);
        } else if (c == '\t') {
            ok = buf_add(r, n, b, "\\t", 2);
        } else if (c < 0x20 || c == 0x7f) {
            snprintf(e, sizeof e, "\\x%02x", c);
            ok = buf_add(r, n, b, e, 4);
        } else {
            ok = buf_add(r, n, b, (const char *)&s.u.s.p[i], 1);
        }
    }
    return ok && buf_add(r, n, b, &q, 1);
}

typedef struct json_fmt {
    int indent;  /* -1: none */
    int level;
} json_fmt;

static bool write_json(render *r, const node *n, buf *b, ct_val v, json_fmt *jf);

static bool json_newline(render *r, const node *n, buf *b, const json_fmt *jf) {
    if (!buf_add(r, n, b, "\n", 1))
        return false;
    for (int i = 0; i < jf->indent * jf->level; i++)
        if (!buf_add(r, n, b, " ", 1))
            return false;
    return true;
}

static bool write_json(render *r, const node *n, buf *b, ct_val v, json_fmt *jf) {
    char tmp[64];
    switch (v.k) {
    case V_NONE: return buf_add(r, n, b, "null", 4);
    case V_BOOL: return v.u.b ? buf_add(r, n, b, "true", 4) : buf_add(r, n, b, "false", 5);
    case V_INT: snprintf(tmp, sizeof tmp, "%" PRId64, v.u.i); return buf_add(r, n, b, tmp, strlen(tmp));
    case V_FLOAT: py_float(v.u.f, tmp, sizeof tmp, true); return buf_add(r, n, b, tmp, strlen(tmp));
    case V_STR: return write_json_str(r, n, b, v);
    case V_LIST: {
        if (v.u.l->n == 0)
            return buf_add(r, n, b, "[]", 2);
        if (!buf_add(r, n, b, "[", 1))
            return false;
        jf->level++;
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i > 0 && !buf_add(r, n, b, jf->indent >= 0 ? "," : ", ", jf->indent >= 0 ? 1 : 2))
                return false;
            if (jf->indent >= 0 && !json_newline(r, n, b, jf))
                return false;
            if (!write_json(r, n, b, v.u.l->v[i], jf))
                return false;
        }
        jf->level--;
        if (jf->indent >= 0 && !json_newline(r, n, b, jf))
            return false;
        return buf_add(r, n, b, "]", 1);
    }
    case V_DICT: {
        if (v.u.d->ns)
            return rerr(r, MS_ERR_FORMAT, n, "tojson: a namespace is not JSON serializable");
        if (v.u.d->n == 0)
            return buf_add(r, n, b, "{}", 2);
        if (!buf_add(r, n, b, "{", 1))
            return false;
        jf->level++;
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i > 0 && !buf_add(r, n, b, jf->indent >= 0 ? "," : ", ", jf->indent >= 0 ? 1 : 2))
                return false;
            if (jf->indent >= 0 && !json_newline(r, n, b, jf))
                return false;
            if (!write_json_str(r, n, b, v.u.d->keys[i]) || !buf_add(r, n, b, ": ", 2) ||
                !write_json(r, n, b, v.u.d->vals[i], jf))
                return false;
        }
        jf->level--;
        if (jf->indent >= 0 && !json_newline(r, n, b, jf))
            return false;
        return buf_add(r, n, b, "}", 1);
    }
    default:
        return rerr(r, MS_ERR_FORMAT, n, "tojson: a value of type %s is not JSON serializable", type_name(v));
    }
}

/* str(v) (W_STR) or repr(v) (W_REPR, inside containers) */
static bool write_val(render *r, const node *n, buf *b, ct_val v, int how) {
    char tmp[64];
    switch (v.k) {
    case V_UNDEF: return true;
    case V_NONE: return buf_add(r, n, b, "None", 4);
    case V_BOOL: return v.u.b ? buf_add(r, n, b, "True", 4) : buf_add(r, n, b, "False", 5);
    case V_INT: snprintf(tmp, sizeof tmp, "%" PRId64, v.u.i); return buf_add(r, n, b, tmp, strlen(tmp));
    case V_FLOAT: py_float(v.u.f, tmp, sizeof tmp, false); return buf_add(r, n, b, tmp, strlen(tmp));
    case V_STR: return how == W_REPR ? write_repr_str(r, n, b, v) : buf_add(r, n, b, v.u.s.p, v.u.s.n);
    case V_LIST:
        if (!buf_add(r, n, b, v.u.l->tuple ? "(" : "[", 1))
            return false;
        for (size_t i = 0; i < v.u.l->n; i++)
            if ((i > 0 && !buf_add(r, n, b, ", ", 2)) || !write_val(r, n, b, v.u.l->v[i], W_REPR))
                return false;
        if (v.u.l->tuple && v.u.l->n == 1 && !buf_add(r, n, b, ",", 1))
            return false;
        return buf_add(r, n, b, v.u.l->tuple ? ")" : "]", 1);
    case V_DICT:
        if (v.u.d->ns)
            return buf_add(r, n, b, "<Namespace>", 11);
        if (!buf_add(r, n, b, "{", 1))
            return false;
        for (size_t i = 0; i < v.u.d->n; i++)
            if ((i > 0 && !buf_add(r, n, b, ", ", 2)) || !write_repr_str(r, n, b, v.u.d->keys[i]) ||
                !buf_add(r, n, b, ": ", 2) || !write_val(r, n, b, v.u.d->vals[i], W_REPR))
                return false;
        return buf_add(r, n, b, "}", 1);
    case V_LOOP: return buf_add(r, n, b, "<LoopContext>", 13);
    case V_FUNC: {
        char tmp2[64];
        snprintf(tmp2, sizeof tmp2, "<function %s>", funcs[v.u.i]);
        return buf_add(r, n, b, tmp2, strlen(tmp2));
    }
    }
    return true;
}

/* A value as a string value (str()). */
static bool to_str(render *r, const node *n, ct_val v, ct_val *out) {
    if (v.k == V_STR) {
        *out = v;
        return true;
    }
    if (v.k == V_UNDEF) {
        *out = v_str("", 0);
        return true;
    }
    buf b = {0};
    bool ok = write_val(r, n, &b, v, W_STR);
    if (ok) {
        char *o = ralloc(r, n, b.n + 1);
        ok = o != NULL;
        if (ok) {
            if (b.n)
                memcpy(o, b.p, b.n);
            o[b.n] = '\0';
            *out = v_str(o, b.n);
        }
    }
    ms_free(b.p);
    return ok;
}

/* ---- comparisons ---- */

static bool is_num(ct_val v) { return v.k == V_INT || v.k == V_FLOAT || v.k == V_BOOL; }
static double num_f(ct_val v) { return v.k == V_INT ? (double)v.u.i : v.k == V_BOOL ? (v.u.b ? 1.0 : 0.0) : v.u.f; }
static int64_t num_i(ct_val v) { return v.k == V_BOOL ? (v.u.b ? 1 : 0) : v.u.i; }

static bool val_eq(ct_val a, ct_val b) {
    if (is_num(a) && is_num(b)) {
        if (a.k != V_FLOAT && b.k != V_FLOAT)
            return num_i(a) == num_i(b);
        return num_f(a) == num_f(b);
    }
    if (a.k != b.k)
        return false;
    switch (a.k) {
    case V_UNDEF: case V_NONE: return true;
    case V_STR: return a.u.s.n == b.u.s.n && memcmp(a.u.s.p, b.u.s.p, a.u.s.n) == 0;
    case V_LIST:
        if (a.u.l->n != b.u.l->n || a.u.l->tuple != b.u.l->tuple)
            return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!val_eq(a.u.l->v[i], b.u.l->v[i]))
                return false;
        return true;
    case V_DICT:
        if (a.u.d->ns || b.u.d->ns)
            return a.u.d == b.u.d;
        if (a.u.d->n != b.u.d->n)
            return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            const ct_val *o = dict_find(b.u.d, a.u.d->keys[i].u.s.p, a.u.d->keys[i].u.s.n);
            if (o == NULL || !val_eq(a.u.d->vals[i], *o))
                return false;
        }
        return true;
    case V_LOOP: return a.u.loop == b.u.loop;
    case V_FUNC: return a.u.i == b.u.i;
    default: return false;
    }
}

/* <0, 0, >0; false when the types do not order */
static bool val_cmp(ct_val a, ct_val b, int *res) {
    if (is_num(a) && is_num(b)) {
        if (a.k != V_FLOAT && b.k != V_FLOAT) {
            int64_t x = num_i(a), y = num_i(b);
            *res = x < y ? -1 : x > y;
        } else {
            double x = num_f(a), y = num_f(b);
            if (isnan(x) || isnan(y)) {
                *res = 2;  /* every comparison false */
                return true;
            }
            *res = x < y ? -1 : x > y;
        }
        return true;
    }
    if (a.k == V_STR && b.k == V_STR) {
        size_t m = MS_MIN(a.u.s.n, b.u.s.n);
        int c = m ? memcmp(a.u.s.p, b.u.s.p, m) : 0;
        *res = c != 0 ? (c < 0 ? -1 : 1) : (a.u.s.n < b.u.s.n ? -1 : a.u.s.n > b.u.s.n);
        return true;
    }
    if (a.k == V_LIST && b.k == V_LIST) {
        for (size_t i = 0; i < a.u.l->n && i < b.u.l->n; i++) {
            if (val_eq(a.u.l->v[i], b.u.l->v[i]))
                continue;
            return val_cmp(a.u.l->v[i], b.u.l->v[i], res);
        }
        *res = a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
        return true;
    }
    return false;
}

/* ---- scopes ---- */

static ct_val *scope_find(render *r, const char *s, size_t n) {
    for (scope *sc = r->sc; sc != NULL; sc = sc->up)
        for (size_t i = sc->n; i-- > 0;)
            if (sc->e[i].len == n && memcmp(sc->e[i].name, s, n) == 0)
                return &sc->e[i].v;
    return NULL;
}

static bool scope_set(render *r, const node *nd, const char *name, size_t n, ct_val v) {
    scope *sc = r->sc;
    for (size_t i = 0; i < sc->n; i++)
        if (sc->e[i].len == n && memcmp(sc->e[i].name, name, n) == 0) {
            sc->e[i].v = v;
            return true;
        }
    if (sc->n == sc->cap) {
        size_t cap = sc->cap ? sc->cap * 2 : 8;
        scope_ent *ne = ralloc(r, nd, cap * sizeof *ne);
        if (ne == NULL)
            return false;
        if (sc->n)
            memcpy(ne, sc->e, sc->n * sizeof *ne);
        sc->e = ne;
        sc->cap = cap;
    }
    sc->e[sc->n++] = (scope_ent){.name = name, .len = n, .v = v};
    return true;
}

/* ---- evaluation ---- */

static bool eval(render *r, const node *n, ct_val *out);
static bool exec_list(render *r, const nodelist *l);

static bool step(render *r, const node *n) {
    if (++r->steps > CT_MAX_STEPS)
        return rerr(r, MS_ERR_LIMIT, n, "the render takes more than %lld steps", (long long)CT_MAX_STEPS);
    return r->st == MS_OK;
}

/* Positional or keyword argument `k` (name kwname) of a call node; NULL when absent. */
static const node *arg_node(const node *n, size_t k, const char *kwname) {
    if (n->kw != NULL && kwname != NULL)
        for (size_t i = 0; i < n->args.n; i++)
            if (n->kw[i] != NULL && strcmp(n->kw[i], kwname) == 0)
                return n->args.v[i];
    if (k < n->args.n && (n->kw == NULL || n->kw[k] == NULL))
        return n->args.v[k];
    return NULL;
}

static bool eval_arg(render *r, const node *n, size_t k, const char *kwname, ct_val *out, bool *present) {
    const node *a = arg_node(n, k, kwname);
    *present = a != NULL;
    if (a == NULL) {
        *out = v_undef();
        return true;
    }
    return eval(r, a, out);
}

static bool need_str(render *r, const node *n, ct_val v, const char *what) {
    if (v.k == V_STR)
        return true;
    return rerr(r, MS_ERR_FORMAT, n, "%s expects a string, not %s", what, type_name(v));
}

/* Items of an iterable (list / dict keys / string code points / undefined = empty). */
static bool iterate(render *r, const node *n, ct_val v, ct_list **out) {
    if (v.k == V_LIST) {
        *out = v.u.l;
        return true;
    }
    if (v.k == V_UNDEF) {
        *out = new_list(r, n, 0);
        return *out != NULL;
    }
    if (v.k == V_DICT && !v.u.d->ns) {
        ct_list *l = new_list(r, n, v.u.d->n);
        if (l == NULL)
            return false;
        for (size_t i = 0; i < v.u.d->n; i++)
            if (!list_push(r, n, l, v.u.d->keys[i]))
                return false;
        *out = l;
        return true;
    }
    if (v.k == V_STR) {
        ct_list *l = new_list(r, n, 0);
        if (l == NULL)
            return false;
        for (size_t i = 0; i < v.u.s.n;) {
            size_t cl = cp_len(v.u.s.p + i, v.u.s.n - i);
            if (!list_push(r, n, l, v_str(v.u.s.p + i, cl)))
                return false;
            i += cl;
        }
        *out = l;
        return true;
    }
    return rerr(r, MS_ERR_FORMAT, n, "a value of type %s is not iterable", type_name(v));
}

static bool length_of(render *r, const node *n, ct_val v, int64_t *len) {
    switch (v.k) {
    case V_UNDEF: *len = 0; return true;
    case V_STR: *len = (int64_t)cp_count(v.u.s.p, v.u.s.n); return true;
    case V_LIST: *len = (int64_t)v.u.l->n; return true;
    case V_DICT: if (!v.u.d->ns) { *len = (int64_t)v.u.d->n; return true; } break;
    default: break;
    }
    return rerr(r, MS_ERR_FORMAT, n, "a value of type %s has no length", type_name(v));
}

/* Python index normalisation: false when out of range */
static bool py_index(int64_t i, size_t len, size_t *out) {
    if (i < 0)
        i += (int64_t)len;
    if (i < 0 || (uint64_t)i >= len)
        return false;
    *out = (size_t)i;
    return true;
}

static bool get_item(render *r, const node *n, ct_val obj, ct_val key, ct_val *out) {
    *out = v_undef();
    if (obj.k == V_UNDEF)
        return rerr(r, MS_ERR_FORMAT, n, "an undefined value has no items");
    if (obj.k == V_DICT) {
        if (key.k == V_STR) {
            const ct_val *f = dict_find(obj.u.d, key.u.s.p, key.u.s.n);
            if (f != NULL)
                *out = *f;
        }
        return true;
    }
    if (obj.k == V_LIST && (key.k == V_INT || key.k == V_BOOL)) {
        size_t i;
        if (py_index(num_i(key), obj.u.l->n, &i))
            *out = obj.u.l->v[i];
        return true;
    }
    if (obj.k == V_STR && (key.k == V_INT || key.k == V_BOOL)) {
        size_t len = cp_count(obj.u.s.p, obj.u.s.n), i;
        if (py_index(num_i(key), len, &i)) {
            size_t b = 0;
            for (size_t c = 0; c < i; c++)
                b += cp_len(obj.u.s.p + b, obj.u.s.n - b);
            *out = v_str(obj.u.s.p + b, cp_len(obj.u.s.p + b, obj.u.s.n - b));
        }
        return true;
    }
    return true;  /* jinja2: undefined (none, numbers, a missing key or index) */
}

static bool get_attr(render *r, const node *n, ct_val obj, const char *s, size_t len, ct_val *out) {
    *out = v_undef();
    if (obj.k == V_UNDEF)
        return rerr(r, MS_ERR_FORMAT, n, "an undefined value has no attribute '%.*s'", (int)MS_MIN(len, (size_t)64), s);
    if (obj.k == V_DICT) {
        const ct_val *f = dict_find(obj.u.d, s, len);
        if (f != NULL)
            *out = *f;
        return true;
    }
    if (obj.k == V_LOOP) {
        const ct_loop *lp = obj.u.loop;
        int64_t i = (int64_t)lp->i, total = (int64_t)lp->items->n;
#define IS(x) (len == strlen(x) && memcmp(s, x, len) == 0)
        if (IS("index0")) *out = v_int(i);
        else if (IS("index")) *out = v_int(i + 1);
        else if (IS("revindex")) *out = v_int(total - i);
        else if (IS("revindex0")) *out = v_int(total - i - 1);
        else if (IS("first")) *out = v_bool(i == 0);
        else if (IS("last")) *out = v_bool(i == total - 1);
        else if (IS("length")) *out = v_int(total);
        else if (IS("depth")) *out = v_int(1);
        else if (IS("depth0")) *out = v_int(0);
        else if (IS("previtem")) { if (i > 0) *out = lp->items->v[i - 1]; }
        else if (IS("nextitem")) { if (i + 1 < total) *out = lp->items->v[i + 1]; }
#undef IS
        return true;
    }
    return true;  /* jinja2: undefined */
}

/* Python slice of a list or string. */
static bool do_slice(render *r, const node *n, ct_val obj, ct_val a, ct_val b, ct_val c, ct_val *out) {
    int64_t stepv = 1;
    if (c.k != V_UNDEF && c.k != V_NONE) {
        if (c.k != V_INT)
            return rerr(r, MS_ERR_FORMAT, n, "slice step must be an integer");
        stepv = c.u.i;
        if (stepv == 0)
            return rerr(r, MS_ERR_FORMAT, n, "slice step cannot be zero");
    }
    size_t len;
    ct_list *items = NULL;
    if (obj.k == V_LIST) {
        len = obj.u.l->n;
    } else if (obj.k == V_STR) {
        if (!iterate(r, n, obj, &items))
            return false;
        len = items->n;
    } else if (obj.k == V_UNDEF) {
        return rerr(r, MS_ERR_FORMAT, n, "an undefined value cannot be sliced");
    } else {
        /* jinja2 slices with Python's own [] (not environment.getitem): a TypeError */
        return rerr(r, MS_ERR_FORMAT, n, "a value of type %s cannot be sliced", type_name(obj));
    }
    int64_t L = (int64_t)len, lo, hi;
    for (int k = 0; k < 2; k++) {
        ct_val x = k == 0 ? a : b;
        int64_t *dst = k == 0 ? &lo : &hi;
        if (x.k == V_UNDEF || x.k == V_NONE) {
            *dst = stepv > 0 ? (k == 0 ? 0 : L) : (k == 0 ? L - 1 : -1);
            if (k == 1 && stepv < 0)
                *dst = INT64_MIN;
            continue;
        }
        if (x.k != V_INT && x.k != V_BOOL)
            return rerr(r, MS_ERR_FORMAT, n, "slice indices must be integers");
        int64_t v = num_i(x);
        if (v < 0) {
            v = v < -L ? (stepv > 0 ? 0 : -1) : v + L;
        } else if (v >= L) {
            v = stepv > 0 ? L : L - 1;
        }
        *dst = v;
    }
    if (hi == INT64_MIN)
        hi = -1;
    ct_list *res = new_list(r, n, 0);
    if (res == NULL)
        return false;
    const ct_list *src = obj.k == V_LIST ? obj.u.l : items;
    res->tuple = src->tuple;
    for (int64_t i = lo; stepv > 0 ? i < hi : i > hi; i += stepv) {
        if (i < 0 || i >= L)
            break;
        if (!list_push(r, n, res, src->v[i]))
            return false;
        if (!step(r, n))
            return false;
    }
    if (obj.k == V_LIST) {
        *out = (ct_val){.k = V_LIST, .u.l = res};
        return true;
    }
    size_t total = 0;
    for (size_t i = 0; i < res->n; i++)
        total += res->v[i].u.s.n;
    char *o = ralloc(r, n, total + 1);
    if (o == NULL)
        return false;
    size_t w = 0;
    for (size_t i = 0; i < res->n; i++) {
        memcpy(o + w, res->v[i].u.s.p, res->v[i].u.s.n);
        w += res->v[i].u.s.n;
    }
    o[w] = '\0';
    *out = v_str(o, w);
    return true;
}

static bool arith(render *r, const node *n, int op, ct_val a, ct_val b, ct_val *out) {
    if (op == OP_ADD && a.k == V_STR && b.k == V_STR) {
        *out = str_cat(r, n, a.u.s.p, a.u.s.n, b.u.s.p, b.u.s.n);
        return r->st == MS_OK;
    }
    if (op == OP_ADD && a.k == V_LIST && b.k == V_LIST) {
        ct_list *l = new_list(r, n, a.u.l->n + b.u.l->n);
        if (l == NULL)
            return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!list_push(r, n, l, a.u.l->v[i]))
                return false;
        for (size_t i = 0; i < b.u.l->n; i++)
            if (!list_push(r, n, l, b.u.l->v[i]))
                return false;
        *out = (ct_val){.k = V_LIST, .u.l = l};
        return true;
    }
    if (op == OP_MUL &&
        ((a.k == V_STR && (b.k == V_INT || b.k == V_BOOL)) || (b.k == V_STR && (a.k == V_INT || a.k == V_BOOL)))) {
        ct_val s = a.k == V_STR ? a : b;
        int64_t k = num_i(a.k == V_STR ? b : a);
        if (k <= 0) {
            *out = v_str("", 0);
            return true;
        }
        if (s.u.s.n > 0 && (uint64_t)k > CT_MAX_MEM / s.u.s.n)
            return rerr(r, MS_ERR_LIMIT, n, "the render needs more than %zu MiB", CT_MAX_MEM >> 20);
        size_t total = s.u.s.n * (size_t)k;
        char *o = ralloc(r, n, total + 1);
        if (o == NULL)
            return false;
        for (int64_t i = 0; i < k; i++)
            memcpy(o + (size_t)i * s.u.s.n, s.u.s.p, s.u.s.n);
        o[total] = '\0';
        *out = v_str(o, total);
        return true;
    }
    if (op == OP_MUL &&
        ((a.k == V_LIST && (b.k == V_INT || b.k == V_BOOL)) || (b.k == V_LIST && (a.k == V_INT || a.k == V_BOOL)))) {
        const ct_list *src = a.k == V_LIST ? a.u.l : b.u.l;
        int64_t k = num_i(a.k == V_LIST ? b : a);
        ct_list *l = new_list(r, n, 0);
        if (l == NULL)
            return false;
        for (int64_t i = 0; i < k; i++)
            for (size_t j = 0; j < src->n; j++)
                if (!list_push(r, n, l, src->v[j]) || !step(r, n))
                    return false;
        *out = (ct_val){.k = V_LIST, .u.l = l};
        return true;
    }
    if (!is_num(a) || !is_num(b)) {
        static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**"};
        return rerr(r, MS_ERR_FORMAT, n, "unsupported operand types for %s: %s and %s", names[op], type_name(a),
                    type_name(b));
    }
    bool fl = a.k == V_FLOAT || b.k == V_FLOAT;
    if (op == OP_DIV) {
        double y = num_f(b);
        if (y == 0.0)
            return rerr(r, MS_ERR_FORMAT, n, "division by zero");
        *out = v_float(num_f(a) / y);
        return true;
    }
    if (fl) {
        double x = num_f(a), y = num_f(b), z;
        switch (op) {
        case OP_ADD: z = x + y; break;
        case OP_SUB: z = x - y; break;
        case OP_MUL: z = x * y; break;
        case OP_POW: z = pow(x, y); break;
        default:
            if (y == 0.0)
                return rerr(r, MS_ERR_FORMAT, n, "division by zero");
            z = floor(x / y);
            if (op == OP_MOD) {
                z = fmod(x, y);
                if (z != 0.0 && ((z < 0) != (y < 0)))
                    z += y;
            }
        }
        *out = v_float(z);
        return true;
    }
    int64_t x = num_i(a), y = num_i(b), z = 0;
    bool ovf = false;
    switch (op) {
    case OP_ADD: ovf = __builtin_add_overflow(x, y, &z); break;
    case OP_SUB: ovf = __builtin_sub_overflow(x, y, &z); break;
    case OP_MUL: ovf = __builtin_mul_overflow(x, y, &z); break;
    case OP_POW:
        if (y < 0) {
            *out = v_float(pow((double)x, (double)y));
            return true;
        }
        z = 1;
        for (int64_t i = 0; i < y && !ovf; i++) {
            ovf = __builtin_mul_overflow(z, x, &z);
            if (z == 0 || z == 1)
                break;
            if (z == -1 && x == -1) {
                z = (y % 2 == 0) ? 1 : -1;
                break;
            }
        }
        break;
    default:
        if (y == 0)
            return rerr(r, MS_ERR_FORMAT, n, "integer division or modulo by zero");
        if (x == INT64_MIN && y == -1) {
            ovf = op == OP_FLOORDIV;
            z = 0;
            break;
        }
        z = x / y;
        int64_t m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
            z -= 1;
            m += y;
        }
        if (op == OP_MOD)
            z = m;
    }
    if (ovf)
        return rerr(r, MS_ERR_LIMIT, n, "integer overflow (values beyond 64 bits are not supported)");
    *out = v_int(z);
    return true;
}

static bool contains(render *r, const node *n, ct_val hay, ct_val needle, bool *res) {
    if (hay.k == V_STR) {
        if (needle.k != V_STR)
            return rerr(r, MS_ERR_FORMAT, n, "'in <string>' requires a string on the left, not %s", type_name(needle));
        *res = find_sub(hay.u.s.p, hay.u.s.n, needle.u.s.p, needle.u.s.n) != NULL;
        return true;
    }
    if (hay.k == V_LIST) {
        *res = false;
        for (size_t i = 0; i < hay.u.l->n && !*res; i++)
            *res = val_eq(hay.u.l->v[i], needle);
        return true;
    }
    if (hay.k == V_DICT && !hay.u.d->ns) {
        if (needle.k == V_LIST || needle.k == V_DICT)
            return rerr(r, MS_ERR_FORMAT, n, "unhashable type: '%s'", type_name(needle));
        *res = needle.k == V_STR && dict_find(hay.u.d, needle.u.s.p, needle.u.s.n) != NULL;
        return true;
    }
    if (hay.k == V_UNDEF) {
        *res = false;
        return true;
    }
    return rerr(r, MS_ERR_FORMAT, n, "a value of type %s does not support 'in'", type_name(hay));
}

static bool json_to_val(render *r, const json_t *j, ct_val *out, int depth);

static bool str_split(render *r, const node *n, ct_val s, const ct_val *sep, int64_t maxsplit, ct_val *out) {
    ct_list *l = new_list(r, n, 0);
    if (l == NULL)
        return false;
    const char *p = s.u.s.p;
    size_t len = s.u.s.n, i = 0;
    int64_t splits = 0;
    if (sep == NULL) {
        for (;;) {
            while (i < len) {
                size_t cl = cp_len(p + i, len - i);
                if (!py_space(cp_at(p + i, cl)))
                    break;
                i += cl;
            }
            if (i >= len)
                break;
            size_t st = i;
            if (maxsplit >= 0 && splits >= maxsplit) {
                ct_val rest = str_strip(v_str(p + st, len - st), 2, NULL);
                if (!list_push(r, n, l, rest))
                    return false;
                break;
            }
            while (i < len) {
                size_t cl = cp_len(p + i, len - i);
                if (py_space(cp_at(p + i, cl)))
                    break;
                i += cl;
            }
            if (!list_push(r, n, l, v_str(p + st, i - st)) || !step(r, n))
                return false;
            splits++;
        }
    } else {
        if (sep->u.s.n == 0)
            return rerr(r, MS_ERR_FORMAT, n, "split: empty separator");
        for (;;) {
            const char *f =
                (maxsplit >= 0 && splits >= maxsplit) ? NULL : find_sub(p + i, len - i, sep->u.s.p, sep->u.s.n);
            if (f == NULL) {
                if (!list_push(r, n, l, v_str(p + i, len - i)))
                    return false;
                break;
            }
            size_t at = (size_t)(f - p);
            if (!list_push(r, n, l, v_str(p + i, at - i)) || !step(r, n))
                return false;
            i = at + sep->u.s.n;
            splits++;
        }
    }
    *out = (ct_val){.k = V_LIST, .u.l = l};
    return true;
}

static bool starts_ends(render *r, const node *n, ct_val s, ct_val x, bool ends, bool *res) {
    if (x.k == V_LIST) {
        *res = false;
        for (size_t i = 0; i < x.u.l->n; i++) {
            bool h;
            if (!starts_ends(r, n, s, x.u.l->v[i], ends, &h))
                return false;
            if (h)
                *res = true;
        }
        return true;
    }
    if (!need_str(r, n, x, ends ? "endswith" : "startswith"))
        return false;
    if (x.u.s.n > s.u.s.n)
        *res = false;
    else
        *res = memcmp(s.u.s.p + (ends ? s.u.s.n - x.u.s.n : 0), x.u.s.p, x.u.s.n) == 0;
    return true;
}

static bool join_list(render *r, const node *n, ct_val seq, ct_val sep, ct_val *out) {
    ct_list *items;
    if (!iterate(r, n, seq, &items))
        return false;
    buf b = {0};
    bool ok = true;
    for (size_t i = 0; ok && i < items->n; i++) {
        if (i > 0)
            ok = buf_add(r, n, &b, sep.u.s.p, sep.u.s.n);
        ok = ok && write_val(r, n, &b, items->v[i], W_STR);
    }
    if (ok) {
        char *o = ralloc(r, n, b.n + 1);
        ok = o != NULL;
        if (ok) {
            if (b.n)
                memcpy(o, b.p, b.n);
            o[b.n] = '\0';
            *out = v_str(o, b.n);
        }
    }
    ms_free(b.p);
    return ok;
}

static bool items_list(render *r, const node *n, ct_val d, ct_val *out) {
    if (d.k == V_UNDEF) {
        *out = (ct_val){.k = V_LIST, .u.l = new_list(r, n, 0)};
        return out->u.l != NULL;
    }
    if (d.k != V_DICT || d.u.d->ns)
        return rerr(r, MS_ERR_FORMAT, n, "items() of a %s", type_name(d));
    ct_list *l = new_list(r, n, d.u.d->n);
    if (l == NULL)
        return false;
    for (size_t i = 0; i < d.u.d->n; i++) {
        ct_list *pair = new_list(r, n, 2);
        if (pair != NULL)
            pair->tuple = true;
        if (pair == NULL || !list_push(r, n, pair, d.u.d->keys[i]) || !list_push(r, n, pair, d.u.d->vals[i]) ||
            !list_push(r, n, l, (ct_val){.k = V_LIST, .u.l = pair}))
            return false;
    }
    *out = (ct_val){.k = V_LIST, .u.l = l};
    return true;
}

static bool eval_method(render *r, const node *n, ct_val *out) {
    ct_val obj, a0, a1, a2;
    bool p0, p1, p2;
    if (!eval(r, n->a, &obj) || !eval_arg(r, n, 0, NULL, &a0, &p0) || !eval_arg(r, n, 1, NULL, &a1, &p1) ||
        !eval_arg(r, n, 2, NULL, &a2, &p2))
        return false;
    *out = v_undef();
    int m = n->op;
    if (m >= M_GET) {
        if (obj.k != V_DICT || obj.u.d->ns)
            return rerr(r, MS_ERR_FORMAT, n, "%s has no method '%s'", type_name(obj), methods[m]);
        if (m == M_GET) {
            const ct_val *f = a0.k == V_STR ? dict_find(obj.u.d, a0.u.s.p, a0.u.s.n) : NULL;
            *out = f != NULL ? *f : p1 ? a1 : v_none();
            return true;
        }
        if (m == M_ITEMS)
            return items_list(r, n, obj, out);
        ct_list *l = new_list(r, n, obj.u.d->n);
        if (l == NULL)
            return false;
        for (size_t i = 0; i < obj.u.d->n; i++)
            if (!list_push(r, n, l, m == M_KEYS ? obj.u.d->keys[i] : obj.u.d->vals[i]))
                return false;
        *out = (ct_val){.k = V_LIST, .u.l = l};
        return true;
    }
    if (obj.k != V_STR)
        return rerr(r, MS_ERR_FORMAT, n, "%s has no method '%s'", type_name(obj), methods[m]);
    switch (m) {
    case M_STRIP: case M_LSTRIP: case M_RSTRIP: {
        if (p0 && a0.k != V_NONE && !need_str(r, n, a0, methods[m]))
            return false;
        *out = str_strip(obj, m == M_STRIP ? 3 : m == M_LSTRIP ? 1 : 2, p0 && a0.k == V_STR ? &a0 : NULL);
        return true;
    }
    case M_STARTSWITH: case M_ENDSWITH: {
        bool res = false;
        if (!starts_ends(r, n, obj, a0, m == M_ENDSWITH, &res))
            return false;
        *out = v_bool(res);
        return true;
    }
    case M_SPLIT: {
        ct_val sep = p0 ? a0 : v_none();
        const node *ms = arg_node(n, 1, "maxsplit");
        ct_val mx = v_int(-1);
        if (ms != NULL && !eval(r, ms, &mx))
            return false;
        const node *sn = arg_node(n, 0, "sep");
        if (sn != NULL && !eval(r, sn, &sep))
            return false;
        if (sep.k != V_NONE && !need_str(r, n, sep, "split"))
            return false;
        if (mx.k != V_INT)
            return rerr(r, MS_ERR_FORMAT, n, "split: maxsplit must be an integer");
        return str_split(r, n, obj, sep.k == V_STR ? &sep : NULL, mx.u.i, out);
    }
    case M_UPPER: *out = str_case(r, n, obj, 0); break;
    case M_LOWER: *out = str_case(r, n, obj, 1); break;
    case M_CAPITALIZE: *out = str_case(r, n, obj, 2); break;
    case M_TITLE: *out = str_case(r, n, obj, 3); break;
    case M_REPLACE:
        if (!need_str(r, n, a0, "replace") || !need_str(r, n, a1, "replace"))
            return false;
        if (p2 && a2.k != V_INT)
            return rerr(r, MS_ERR_FORMAT, n, "replace: count must be an integer");
        *out = str_replace(r, n, obj, a0, a1, p2 ? a2.u.i : -1);
        break;
    case M_FIND: case M_COUNT: {
        if (!need_str(r, n, a0, methods[m]))
            return false;
        if (m == M_FIND) {
            const char *f = find_sub(obj.u.s.p, obj.u.s.n, a0.u.s.p, a0.u.s.n);
            *out = v_int(f == NULL ? -1 : (int64_t)cp_count(obj.u.s.p, (size_t)(f - obj.u.s.p)));
        } else if (a0.u.s.n == 0) {
            *out = v_int((int64_t)cp_count(obj.u.s.p, obj.u.s.n) + 1);
        } else {
            int64_t c = 0;
            size_t i = 0;
            const char *f;
            while ((f = find_sub(obj.u.s.p + i, obj.u.s.n - i, a0.u.s.p, a0.u.s.n)) != NULL) {
                c++;
                i = (size_t)(f - obj.u.s.p) + a0.u.s.n;
            }
            *out = v_int(c);
        }
        return true;
    }
    case M_JOIN:
        return join_list(r, n, a0, obj, out);
    default:
        break;
    }
    return r->st == MS_OK;
}

static bool filter_select(render *r, const node *n, ct_val seq, const ct_val *attr, const ct_val *tname, ct_val targ,
                          bool keep, ct_val *out);

static bool eval_filter(render *r, const node *n, ct_val *out) {
    ct_val v;
    if (!eval(r, n->a, &v))
        return false;
    ct_val a0, a1, a2;
    bool p0, p1, p2;
    int f = n->op;
    if (f != F_TOJSON && (!eval_arg(r, n, 0, NULL, &a0, &p0) || !eval_arg(r, n, 1, NULL, &a1, &p1) ||
                          !eval_arg(r, n, 2, NULL, &a2, &p2)))
        return false;
    *out = v_undef();
    switch (f) {
    case F_TRIM: {
        ct_val s;
        if (!to_str(r, n, v, &s))
            return false;
        if (p0 && a0.k != V_NONE && !need_str(r, n, a0, "trim"))
            return false;
        *out = str_strip(s, 3, p0 && a0.k == V_STR ? &a0 : NULL);
        return true;
    }
    case F_TOJSON: {
        const node *ind = arg_node(n, 0, "indent");
        json_fmt jf = {.indent = -1, .level = 0};
        if (ind != NULL) {
            ct_val iv;
            if (!eval(r, ind, &iv))
                return false;
            if (iv.k == V_INT) {
                if (iv.u.i < 0 || iv.u.i > 64)
                    return rerr(r, MS_ERR_FORMAT, n, "tojson: indent out of range");
                jf.indent = (int)iv.u.i;
            } else if (iv.k != V_NONE) {
                return rerr(r, MS_ERR_FORMAT, n, "tojson: indent must be an integer");
            }
        }
        buf b = {0};
        bool ok = write_json(r, n, &b, v, &jf);
        if (ok) {
            char *o = ralloc(r, n, b.n + 1);
            ok = o != NULL;
            if (ok) {
                if (b.n)
                    memcpy(o, b.p, b.n);
                o[b.n] = '\0';
                *out = v_str(o, b.n);
            }
        }
        ms_free(b.p);
        return ok;
    }
    case F_LENGTH: case F_COUNT: {
        int64_t len = 0;
        if (!length_of(r, n, v, &len))
            return false;
        *out = v_int(len);
        return true;
    }
    case F_DEFAULT: case F_D: {
        const node *bn = arg_node(n, 1, "boolean");
        ct_val bv = v_bool(false);
        if (bn != NULL && !eval(r, bn, &bv))
            return false;
        bool use = v.k == V_UNDEF || (truthy(bv) && !truthy(v));
        *out = use ? (p0 ? a0 : v_str("", 0)) : v;
        return true;
    }
    case F_UPPER: case F_LOWER: case F_CAPITALIZE: case F_TITLE: {
        ct_val s;
        if (!to_str(r, n, v, &s))
            return false;
        *out = str_case(r, n, s, f == F_UPPER ? 0 : f == F_LOWER ? 1 : f == F_CAPITALIZE ? 2 : 4);
        return r->st == MS_OK;
    }
    case F_REPLACE: {
        ct_val s, x, y;
        if (!to_str(r, n, v, &s) || !to_str(r, n, a0, &x) || !to_str(r, n, a1, &y))
            return false;
        if (p2 && a2.k != V_INT)
            return rerr(r, MS_ERR_FORMAT, n, "replace: count must be an integer");
        *out = str_replace(r, n, s, x, y, p2 ? a2.u.i : -1);
        return r->st == MS_OK;
    }
    case F_STRING: case F_SAFE:
        return to_str(r, n, v, out);
    case F_FIRST: case F_LAST: {
        ct_list *items;
        if (!iterate(r, n, v, &items))
            return false;
        if (items->n > 0)
            *out = items->v[f == F_FIRST ? 0 : items->n - 1];
        return true;
    }
    case F_JOIN: {
        ct_val sep = v_str("", 0);
        if (p0 && !to_str(r, n, a0, &sep))
            return false;
        return join_list(r, n, v, sep, out);
    }
    case F_LIST: {
        ct_list *items;
        if (!iterate(r, n, v, &items))
            return false;
        *out = (ct_val){.k = V_LIST, .u.l = items};
        return true;
    }
    case F_REVERSE: {
        if (v.k == V_STR) {
            return do_slice(r, n, v, v_undef(), v_undef(), v_int(-1), out);
        }
        ct_list *items;
        if (!iterate(r, n, v, &items))
            return false;
        return do_slice(r, n, (ct_val){.k = V_LIST, .u.l = items}, v_undef(), v_undef(), v_int(-1), out);
    }
    case F_INT: case F_FLOAT:
        if (v.k == V_UNDEF)  /* int(Undefined) raises in jinja2 */
            return rerr(r, MS_ERR_FORMAT, n, "%s of an undefined value", filters[f]);
        if (f == F_FLOAT)
            goto do_float;
        if (v.k == V_INT || v.k == V_BOOL) {
            *out = v_int(num_i(v));
        } else if (v.k == V_FLOAT) {
            if (!(v.u.f > -9.2e18 && v.u.f < 9.2e18))
                *out = p0 ? a0 : v_int(0);
            else
                *out = v_int((int64_t)v.u.f);
        } else if (v.k == V_STR) {
            char tmp[64];
            size_t l = MS_MIN(v.u.s.n, sizeof tmp - 1);
            memcpy(tmp, v.u.s.p, l);
            tmp[l] = '\0';
            char *end;
            errno = 0;
            long long x = strtoll(tmp, &end, 10);
            while (*end == ' ')
                end++;
            *out =
                (end != tmp && *end == '\0' && errno == 0 && l == v.u.s.n) ? v_int((int64_t)x) : (p0 ? a0 : v_int(0));
        } else {
            *out = p0 ? a0 : v_int(0);
        }
        return true;
    do_float: {
        if (is_num(v)) {
            *out = v_float(num_f(v));
        } else if (v.k == V_STR) {
            char tmp[64];
            size_t l = MS_MIN(v.u.s.n, sizeof tmp - 1);
            memcpy(tmp, v.u.s.p, l);
            tmp[l] = '\0';
            char *end;
            double x = strtod(tmp, &end);
            *out = (end != tmp && *end == '\0' && l == v.u.s.n) ? v_float(x) : (p0 ? a0 : v_float(0.0));
        } else {
            *out = p0 ? a0 : v_float(0.0);
        }
        return true;
    }
    case F_ABS:
        if (v.k == V_INT) {
            if (v.u.i == INT64_MIN)
                return rerr(r, MS_ERR_LIMIT, n, "integer overflow (values beyond 64 bits are not supported)");
            *out = v_int(v.u.i < 0 ? -v.u.i : v.u.i);
        } else if (v.k == V_FLOAT) {
            *out = v_float(fabs(v.u.f));
        } else if (v.k == V_BOOL) {
            *out = v_int(v.u.b);
        } else {
            return rerr(r, MS_ERR_FORMAT, n, "abs of a %s", type_name(v));
        }
        return true;
    case F_ITEMS:
        return items_list(r, n, v, out);
    case F_SELECT: case F_REJECT:
        return filter_select(r, n, v, NULL, p0 ? &a0 : NULL, a1, f == F_SELECT, out);
    case F_SELECTATTR: case F_REJECTATTR:
        if (!p0 || a0.k != V_STR)
            return rerr(r, MS_ERR_FORMAT, n, "%s needs an attribute name", filters[f]);
        return filter_select(r, n, v, &a0, p1 ? &a1 : NULL, a2, f == F_SELECTATTR, out);
    case F_MAP: {
        /* map(attribute='x'[, default=...]) or map('filter') for a filter without arguments */
        const node *an = arg_node(n, 99, "attribute"), *dn = arg_node(n, 99, "default");
        ct_val attr = v_undef(), dflt = v_undef();
        if ((an != NULL && !eval(r, an, &attr)) || (dn != NULL && !eval(r, dn, &dflt)))
            return false;
        int mf = -1;
        if (an == NULL) {
            if (!p0 || a0.k != V_STR)
                return rerr(r, MS_ERR_FORMAT, n, "map needs attribute= or a filter name");
            static const char *const ok[] = {"trim", "upper", "lower", "string", "length", "count", "int", "float",
                                             "tojson", "first", "last", "capitalize", "title", "list", "abs", "safe"};
            if (lookup(ok, MS_ARRAY_LEN(ok), a0.u.s.p, a0.u.s.n) < 0)
                return rerr(r, MS_ERR_UNSUPPORTED, n, "map: unsupported filter '%.*s'",
                            (int)MS_MIN(a0.u.s.n, (size_t)64), a0.u.s.p);
            mf = lookup(filters, MS_ARRAY_LEN(filters), a0.u.s.p, a0.u.s.n);
        } else if (attr.k != V_STR) {
            return rerr(r, MS_ERR_FORMAT, n, "map: attribute must be a string");
        }
        ct_list *items;
        if (!iterate(r, n, v, &items))
            return false;
        ct_list *l = new_list(r, n, items->n);
        if (l == NULL)
            return false;
        for (size_t i = 0; i < items->n; i++) {
            ct_val x = items->v[i];
            if (mf < 0) {
                if (!get_attr(r, n, x, attr.u.s.p, attr.u.s.n, &x))
                    return false;
                if (x.k == V_UNDEF && dn != NULL)
                    x = dflt;
            } else {
                node fake = *n;
                node lit = {.k = E_LIT, .lit = x, .off = n->off};
                fake.a = &lit;
                fake.op = mf;
                fake.args.n = 0;
                fake.kw = NULL;
                if (!eval_filter(r, &fake, &x))
                    return false;
            }
            if (!list_push(r, n, l, x) || !step(r, n))
                return false;
        }
        *out = (ct_val){.k = V_LIST, .u.l = l};
        return true;
    }
    default:
        return rerr(r, MS_ERR_INTERNAL, n, "internal: a filter the parser resolved has no evaluator");
    }
}

/* Test number `op` (tests[]) on v with argument a0: *res. */
static bool apply_test(render *r, const node *n, int op, ct_val v, ct_val a0, bool *resp) {
    bool res = false;
    switch (op) {
    case X_DEFINED: res = v.k != V_UNDEF; break;
    case X_UNDEFINED: res = v.k == V_UNDEF; break;
    case X_NONE: res = v.k == V_NONE; break;
    case X_STRING: res = v.k == V_STR; break;
    case X_NUMBER: res = v.k == V_INT || v.k == V_FLOAT || v.k == V_BOOL; break;
    case X_INTEGER: res = v.k == V_INT; break;
    case X_FLOAT: res = v.k == V_FLOAT; break;
    case X_BOOLEAN: res = v.k == V_BOOL; break;
    case X_TRUE: res = v.k == V_BOOL && v.u.b; break;
    case X_FALSE: res = v.k == V_BOOL && !v.u.b; break;
    case X_MAPPING: res = v.k == V_DICT && !v.u.d->ns; break;
    case X_ITERABLE: case X_SEQUENCE:  /* jinja2's Undefined iterates (empty) and has a length */
        res = v.k == V_LIST || v.k == V_STR || v.k == V_UNDEF || (v.k == V_DICT && !v.u.d->ns);
        break;
    case X_ODD: case X_EVEN:
        if (v.k == V_FLOAT) {
            /* Python: value % 2 == 1 (odd) / value % 2 == 0 (even), floor modulo */
            double m = fmod(v.u.f, 2.0);
            if (m < 0)
                m += 2.0;
            res = op == X_ODD ? m == 1.0 : m == 0.0;
            break;
        }
        if (v.k != V_INT && v.k != V_BOOL)
            return rerr(r, MS_ERR_FORMAT, n, "%s of a %s", tests[op], type_name(v));
        res = (num_i(v) % 2 != 0) == (op == X_ODD);
        break;
    case X_DIVISIBLEBY:
        if ((v.k != V_INT && v.k != V_BOOL) || (a0.k != V_INT && a0.k != V_BOOL))
            return rerr(r, MS_ERR_FORMAT, n, "divisibleby needs integers");
        if (num_i(a0) == 0)
            return rerr(r, MS_ERR_FORMAT, n, "divisibleby zero");
        res = num_i(a0) == -1 || num_i(v) % num_i(a0) == 0;
        break;
    case X_EQ: case X_EQUALTO: res = val_eq(v, a0); break;
    case X_NE: res = !val_eq(v, a0); break;
    case X_LOWER: case X_UPPER: {
        ct_val s;
        if (!to_str(r, n, v, &s))
            return false;
        ct_val c = str_case(r, n, s, op == X_UPPER ? 0 : 1);
        if (r->st != MS_OK)
            return false;
        bool cased = false;
        for (size_t i = 0; i < s.u.s.n; i++)
            if ((s.u.s.p[i] >= 'a' && s.u.s.p[i] <= 'z') || (s.u.s.p[i] >= 'A' && s.u.s.p[i] <= 'Z'))
                cased = true;
        res = cased && val_eq(s, c);
        break;
    }
    default: return rerr(r, MS_ERR_INTERNAL, n, "internal: a test the parser resolved has no evaluator");
    }
    *resp = res;
    return true;
}

static bool eval_test(render *r, const node *n, ct_val *out) {
    ct_val v, a0;
    bool p0, res = false;
    if (!eval(r, n->a, &v) || !eval_arg(r, n, 0, NULL, &a0, &p0) || !apply_test(r, n, n->op, v, a0, &res))
        return false;
    *out = v_bool(res != n->negate);
    return true;
}

/* select / reject (attr == NULL) and selectattr / rejectattr: items passing test `tname`
 * (truthiness when absent) with argument targ. */
static bool filter_select(render *r, const node *n, ct_val seq, const ct_val *attr, const ct_val *tname, ct_val targ,
                          bool keep, ct_val *out) {
    ct_list *items;
    if (!iterate(r, n, seq, &items))
        return false;
    int op = -1;
    if (tname != NULL) {
        if (tname->k != V_STR)
            return rerr(r, MS_ERR_FORMAT, n, "the test name must be a string");
        static const char *const aliases[] = {"==", "!=", "equalto"};
        int al = lookup(aliases, 3, tname->u.s.p, tname->u.s.n);
        op = al == 0 || al == 2 ? X_EQ
             : al == 1          ? X_NE
                                : lookup(tests, MS_ARRAY_LEN(tests), tname->u.s.p, tname->u.s.n);
        if (op < 0)
            return rerr(r, MS_ERR_UNSUPPORTED, n, "unsupported test '%.*s'", (int)MS_MIN(tname->u.s.n, (size_t)64),
                        tname->u.s.p);
    }
    ct_list *l = new_list(r, n, 0);
    if (l == NULL)
        return false;
    for (size_t i = 0; i < items->n; i++) {
        ct_val v = items->v[i];
        if (attr != NULL && !get_attr(r, n, v, attr->u.s.p, attr->u.s.n, &v))
            return false;
        bool res = truthy(v);
        if (op >= 0 && !apply_test(r, n, op, v, targ, &res))
            return false;
        if (res == keep && !list_push(r, n, l, items->v[i]))
            return false;
        if (!step(r, n))
            return false;
    }
    *out = (ct_val){.k = V_LIST, .u.l = l};
    return true;
}

static bool eval_call(render *r, const node *n, ct_val *out) {
    *out = v_undef();
    switch (n->op) {
    case G_RAISE: {
        ct_val m = v_str("", 0), a0;
        bool p0;
        if (!eval_arg(r, n, 0, NULL, &a0, &p0))
            return false;
        if (p0 && !to_str(r, n, a0, &m))
            return false;
        return rerr(r, MS_ERR_INVALID_ARG, n, "raise_exception: %.*s", (int)MS_MIN(m.u.s.n, (size_t)700), m.u.s.p);
    }
    case G_NAMESPACE: case G_DICT: {
        ct_dict *d = new_dict(r, n);
        if (d == NULL)
            return false;
        d->ns = n->op == G_NAMESPACE;
        for (size_t i = 0; i < n->args.n; i++) {
            ct_val v;
            if (!eval(r, n->args.v[i], &v))
                return false;
            if (n->kw == NULL || n->kw[i] == NULL) {
                if (v.k != V_DICT || v.u.d->ns)
                    return rerr(r, MS_ERR_FORMAT, n, "%s() takes keyword arguments or a dict", funcs[n->op]);
                for (size_t k = 0; k < v.u.d->n; k++)
                    if (!dict_set(r, n, d, v.u.d->keys[k], v.u.d->vals[k]))
                        return false;
                continue;
            }
            if (!dict_set(r, n, d, v_str(n->kw[i], strlen(n->kw[i])), v))
                return false;
        }
        *out = (ct_val){.k = V_DICT, .u.d = d};
        return true;
    }
    case G_RANGE: {
        int64_t a[3] = {0, 0, 1};
        size_t na = n->args.n;
        if (na < 1 || na > 3 || n->kw != NULL)
            return rerr(r, MS_ERR_FORMAT, n, "range() takes 1 to 3 positional arguments");
        for (size_t i = 0; i < na; i++) {
            ct_val v;
            if (!eval(r, n->args.v[i], &v))
                return false;
            if (v.k != V_INT && v.k != V_BOOL)
                return rerr(r, MS_ERR_FORMAT, n, "range() takes integers, not %s", type_name(v));
            a[na == 1 ? 1 : i] = num_i(v);
        }
        if (a[2] == 0)
            return rerr(r, MS_ERR_FORMAT, n, "range() step cannot be zero");
        /* jinja2's sandbox refuses ranges over MAX_RANGE = 100000 items (sandbox.py safe_range):
           a template must not make a list of millions (found by fuzz_chat_template) */
        __int128 span = (__int128)a[1] - a[0], st = a[2];
        __int128 items = st > 0 ? (span > 0 ? (span + st - 1) / st : 0)
                                : (span < 0 ? (-span + -st - 1) / -st : 0);
        if (items > CT_MAX_RANGE)
            return rerr(r, MS_ERR_LIMIT, n, "range() of %lld items is over the limit of %d",
                        (long long)(items > INT64_MAX ? INT64_MAX : items), CT_MAX_RANGE);
        ct_list *l = new_list(r, n, 0);
        if (l == NULL)
            return false;
        for (int64_t i = a[0]; a[2] > 0 ? i < a[1] : i > a[1];) {
            if (!list_push(r, n, l, v_int(i)) || !step(r, n))
                return false;
            if (__builtin_add_overflow(i, a[2], &i))
                break;
        }
        *out = (ct_val){.k = V_LIST, .u.l = l};
        return true;
    }
    case G_STRFTIME: {
        ct_val f, a0;
        bool p0;
        if (!eval_arg(r, n, 0, NULL, &a0, &p0) || !to_str(r, n, a0, &f))
            return false;
        char fmt[256], res[512];
        size_t l = MS_MIN(f.u.s.n, sizeof fmt - 1);
        memcpy(fmt, f.u.s.p, l);
        fmt[l] = '\0';
        time_t now = time(NULL);
        struct tm tmv;
        localtime_r(&now, &tmv);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
        size_t w = strftime(res, sizeof res, fmt, &tmv);
#pragma GCC diagnostic pop
        char *o = ralloc(r, n, w + 1);
        if (o == NULL)
            return false;
        memcpy(o, res, w);
        o[w] = '\0';
        *out = v_str(o, w);
        return true;
    }
    default:
        return rerr(r, MS_ERR_INTERNAL, n, "internal: a function the parser resolved has no evaluator");
    }
}

static bool eval(render *r, const node *n, ct_val *out) {
    *out = v_undef();
    if (!step(r, n))
        return false;
    switch (n->k) {
    case E_LIT: *out = n->lit; return true;
    case E_NAME: {
        const ct_val *v = scope_find(r, n->s, n->n);
        if (v != NULL) {
            *out = *v;
        } else {
            /* the globals are defined (`strftime_now is defined`, as Llama 3.2's template asks) */
            int g = lookup(funcs, MS_ARRAY_LEN(funcs), n->s, n->n);
            if (g >= 0)
                *out = (ct_val){.k = V_FUNC, .u.i = g};
        }
        return true;
    }
    case E_ATTR: {
        ct_val o;
        return eval(r, n->a, &o) && get_attr(r, n, o, n->s, n->n, out);
    }
    case E_ITEM: {
        ct_val o, k;
        if (!eval(r, n->a, &o) || !eval(r, n->b, &k))
            return false;
        if (o.k == V_LOOP && k.k == V_STR)
            return get_attr(r, n, o, k.u.s.p, k.u.s.n, out);
        return get_item(r, n, o, k, out);
    }
    case E_SLICE: {
        ct_val o, a = v_undef(), b = v_undef(), c = v_undef();
        if (!eval(r, n->a, &o) || (n->b != NULL && !eval(r, n->b, &a)) || (n->c != NULL && !eval(r, n->c, &b)) ||
            (n->args.n > 0 && !eval(r, n->args.v[0], &c)))
            return false;
        return do_slice(r, n, o, a, b, c, out);
    }
    case E_CALL: return eval_call(r, n, out);
    case E_METHOD: return eval_method(r, n, out);
    case E_FILTER: return eval_filter(r, n, out);
    case E_TEST: return eval_test(r, n, out);
    case E_NOT: {
        ct_val v;
        if (!eval(r, n->a, &v))
            return false;
        *out = v_bool(!truthy(v));
        return true;
    }
    case E_NEG: case E_POS: {
        ct_val v;
        if (!eval(r, n->a, &v))
            return false;
        if (v.k == V_FLOAT) {
            *out = v_float(n->k == E_NEG ? -v.u.f : v.u.f);
        } else if (v.k == V_INT || v.k == V_BOOL) {
            int64_t x = num_i(v);
            if (n->k == E_NEG && x == INT64_MIN)
                return rerr(r, MS_ERR_LIMIT, n, "integer overflow (values beyond 64 bits are not supported)");
            *out = v_int(n->k == E_NEG ? -x : x);
        } else {
            return rerr(r, MS_ERR_FORMAT, n, "bad operand type for unary %c: %s", n->k == E_NEG ? '-' : '+',
                        type_name(v));
        }
        return true;
    }
    case E_AND: case E_OR: {
        ct_val a;
        if (!eval(r, n->a, &a))
            return false;
        if (truthy(a) == (n->k == E_OR)) {
            *out = a;
            return true;
        }
        return eval(r, n->b, out);
    }
    case E_COND: {
        ct_val c;
        if (!eval(r, n->b, &c))
            return false;
        if (truthy(c))
            return eval(r, n->a, out);
        if (n->c != NULL)
            return eval(r, n->c, out);
        *out = v_undef();
        return true;
    }
    case E_CONCAT: {
        ct_val a, b, sa, sb;
        if (!eval(r, n->a, &a) || !eval(r, n->b, &b) || !to_str(r, n, a, &sa) || !to_str(r, n, b, &sb))
            return false;
        *out = str_cat(r, n, sa.u.s.p, sa.u.s.n, sb.u.s.p, sb.u.s.n);
        return r->st == MS_OK;
    }
    case E_BIN: {
        ct_val a, b;
        if (!eval(r, n->a, &a) || !eval(r, n->b, &b))
            return false;
        if (n->op <= OP_POW)
            return arith(r, n, n->op, a, b, out);
        if (n->op == OP_EQ || n->op == OP_NE) {
            *out = v_bool(val_eq(a, b) == (n->op == OP_EQ));
            return true;
        }
        if (n->op == OP_IN || n->op == OP_NOTIN) {
            bool res = false;
            if (!contains(r, n, b, a, &res))
                return false;
            *out = v_bool(res == (n->op == OP_IN));
            return true;
        }
        int c;
        if (!val_cmp(a, b, &c)) {
            static const char *const names[] = {"<", ">", "<=", ">="};
            return rerr(r, MS_ERR_FORMAT, n, "'%s' not supported between %s and %s", names[n->op - OP_LT], type_name(a),
                        type_name(b));
        }
        bool res = c == 2 ? false
                 : n->op == OP_LT ? c < 0 : n->op == OP_GT ? c > 0 : n->op == OP_LE ? c <= 0 : c >= 0;
        *out = v_bool(res);
        return true;
    }
    case E_LIST: {
        ct_list *l = new_list(r, n, n->args.n);
        if (l == NULL)
            return false;
        l->tuple = n->op != 0;
        for (size_t i = 0; i < n->args.n; i++) {
            ct_val v;
            if (!eval(r, n->args.v[i], &v) || !list_push(r, n, l, v))
                return false;
        }
        *out = (ct_val){.k = V_LIST, .u.l = l};
        return true;
    }
    case E_DICT: {
        ct_dict *d = new_dict(r, n);
        if (d == NULL)
            return false;
        for (size_t i = 0; i + 1 < n->args.n; i += 2) {
            ct_val k, v;
            if (!eval(r, n->args.v[i], &k) || !eval(r, n->args.v[i + 1], &v))
                return false;
            if (k.k != V_STR)
                return rerr(r, MS_ERR_UNSUPPORTED, n->args.v[i], "dict keys must be strings here, not %s",
                            type_name(k));
            if (!dict_set(r, n, d, k, v))
                return false;
        }
        *out = (ct_val){.k = V_DICT, .u.d = d};
        return true;
    }
    default:
        return rerr(r, MS_ERR_INTERNAL, n, "not an expression");
    }
}

static bool emit_val(render *r, const node *n, ct_val v) {
    if (v.k == V_STR)
        return buf_add(r, n, r->out, v.u.s.p, v.u.s.n);
    return write_val(r, n, r->out, v, W_STR);
}

static bool exec_for(render *r, const node *n) {
    ct_val seqv;
    ct_list *items;
    if (!eval(r, n->a, &seqv) || !iterate(r, n, seqv, &items))
        return false;
    scope sc = {.up = r->sc};
    if (n->b != NULL) {
        /* `for x in y if cond`: filter first; loop.* counts the filtered items */
        ct_list *kept = new_list(r, n, 0);
        if (kept == NULL)
            return false;
        for (size_t i = 0; i < items->n; i++) {
            sc.n = 0;
            r->sc = &sc;
            bool ok = true;
            if (n->nnames == 1) {
                ok = scope_set(r, n, n->names[0], strlen(n->names[0]), items->v[i]);
            } else {
                for (size_t k = 0; ok && k < n->nnames; k++) {
                    ct_val it = items->v[i];
                    ok = it.k == V_LIST && it.u.l->n == n->nnames;
                    ok = ok ? scope_set(r, n, n->names[k], strlen(n->names[k]), it.u.l->v[k])
                            : rerr(r, MS_ERR_FORMAT, n, "cannot unpack a %s into %zu loop variables", type_name(it),
                                   n->nnames);
                }
            }
            ct_val c;
            ok = ok && eval(r, n->b, &c);
            r->sc = sc.up;
            if (!ok)
                return false;
            if (truthy(c) && !list_push(r, n, kept, items->v[i]))
                return false;
        }
        items = kept;
    }
    ct_loop lp = {.items = items, .i = 0};
    for (size_t i = 0; i < items->n; i++) {
        if (!step(r, n))
            return false;
        sc.n = 0;  /* a fresh scope per iteration (jinja2) */
        r->sc = &sc;
        lp.i = i;
        bool ok = scope_set(r, n, "loop", 4, (ct_val){.k = V_LOOP, .u.loop = &lp});
        ct_val it = items->v[i];
        if (n->nnames == 1) {
            ok = ok && scope_set(r, n, n->names[0], strlen(n->names[0]), it);
        } else if (ok && (it.k != V_LIST || it.u.l->n != n->nnames)) {
            ok = rerr(r, MS_ERR_FORMAT, n, "cannot unpack a %s into %zu loop variables", type_name(it), n->nnames);
        } else {
            for (size_t k = 0; ok && k < n->nnames; k++)
                ok = scope_set(r, n, n->names[k], strlen(n->names[k]), it.u.l->v[k]);
        }
        ok = ok && exec_list(r, &n->body);
        r->sc = sc.up;
        if (!ok)
            return false;
        if (r->brk == 1) {
            r->brk = 0;
            break;
        }
        r->brk = 0;
    }
    if (items->n == 0 && n->orelse.n > 0)
        return exec_list(r, &n->orelse);
    return true;
}

static bool exec_list(render *r, const nodelist *l) {
    for (size_t i = 0; i < l->n; i++) {
        const node *n = l->v[i];
        if (!step(r, n))
            return false;
        switch (n->k) {
        case N_TEXT:
            if (!buf_add(r, n, r->out, n->s, n->n))
                return false;
            break;
        case N_OUT: {
            ct_val v;
            if (!eval(r, n->a, &v) || !emit_val(r, n, v))
                return false;
            break;
        }
        case N_IF: {
            ct_val c;
            if (!eval(r, n->a, &c))
                return false;
            if (!exec_list(r, truthy(c) ? &n->body : &n->orelse))
                return false;
            break;
        }
        case N_FOR:
            if (!exec_for(r, n))
                return false;
            break;
        case N_SET: {
            ct_val v;
            if (!eval(r, n->a, &v) || !scope_set(r, n, n->s, n->n, v))
                return false;
            break;
        }
        case N_SETATTR: {
            ct_val *ns = scope_find(r, n->s, n->n);
            if (ns == NULL || ns->k != V_DICT || !ns->u.d->ns)
                return rerr(r, MS_ERR_FORMAT, n, "cannot assign attribute on a non-namespace object");
            ct_dict *d = ns->u.d;
            ct_val v;
            if (!eval(r, n->a, &v) || !dict_set(r, n, d, v_str(n->names[0], strlen(n->names[0])), v))
                return false;
            break;
        }
        case N_SETBLOCK: {
            buf b = {0}, *saved = r->out;
            r->out = &b;
            bool ok = exec_list(r, &n->body);
            r->out = saved;
            ct_val v = v_str("", 0);
            if (ok && b.n > 0) {
                char *o = ralloc(r, n, b.n + 1);
                ok = o != NULL;
                if (ok) {
                    memcpy(o, b.p, b.n + 1);
                    v = v_str(o, b.n);
                }
            }
            ms_free(b.p);
            if (!ok || !scope_set(r, n, n->s, n->n, v))
                return false;
            break;
        }
        case N_BREAK: case N_CONTINUE: {
            bool in_loop = scope_find(r, "loop", 4) != NULL;
            if (!in_loop)
                return rerr(r, MS_ERR_FORMAT, n, "'%s' outside a loop", n->k == N_BREAK ? "break" : "continue");
            r->brk = n->k == N_BREAK ? 1 : 2;
            return true;
        }
        default:
            return rerr(r, MS_ERR_INTERNAL, n, "not a statement");
        }
        if (r->brk)
            return true;
    }
    return true;
}

static bool json_to_val(render *r, const json_t *j, ct_val *out, int depth) {
    if (depth > CT_MAX_VALUE_DEPTH)
        return rerr(r, MS_ERR_LIMIT, NULL, "an input value nested deeper than %d", CT_MAX_VALUE_DEPTH);
    switch (json_typeof(j)) {
    case JSON_NULL: *out = v_none(); return true;
    case JSON_TRUE: *out = v_bool(true); return true;
    case JSON_FALSE: *out = v_bool(false); return true;
    case JSON_INTEGER: *out = v_int((int64_t)json_integer_value(j)); return true;
    case JSON_REAL: *out = v_float(json_real_value(j)); return true;
    case JSON_STRING: *out = v_str(json_string_value(j), json_string_length(j)); return true;
    case JSON_ARRAY: {
        ct_list *l = new_list(r, NULL, json_array_size(j));
        if (l == NULL)
            return false;
        for (size_t i = 0; i < json_array_size(j); i++) {
            ct_val v;
            if (!json_to_val(r, json_array_get(j, i), &v, depth + 1) || !list_push(r, NULL, l, v))
                return false;
        }
        *out = (ct_val){.k = V_LIST, .u.l = l};
        return true;
    }
    case JSON_OBJECT: {
        ct_dict *d = new_dict(r, NULL);
        if (d == NULL)
            return false;
        const char *k;
        const json_t *v;
        json_object_foreach((json_t *)j, k, v) {
            ct_val cv;
            if (!json_to_val(r, v, &cv, depth + 1) || !dict_set(r, NULL, d, v_str(k, strlen(k)), cv))
                return false;
        }
        *out = (ct_val){.k = V_DICT, .u.d = d};
        return true;
    }
    }
    return false;
}

ms_status ms_chat_template_render_vars(const ms_chat_template *t, const json_t *vars, char **out, size_t *out_len,
                                       ms_error *err) {
    *out = NULL;
    if (out_len != NULL)
        *out_len = 0;
    if (!json_is_object(vars))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: the template variables must be a JSON object", t->name);
    buf b = {0};
    scope top = {0};
    render r = {.t = t, .err = err, .st = MS_OK, .out = &b, .sc = &top};
    const char *k;
    const json_t *v;
    bool ok = true;
    json_object_foreach((json_t *)vars, k, v) {
        ct_val cv;
        ok = json_to_val(&r, v, &cv, 0) && scope_set(&r, NULL, k, strlen(k), cv);
        if (!ok)
            break;
    }
    /* the template's own globals live in a scope of their own above the variables */
    scope tpl = {.up = &top};
    r.sc = &tpl;
    ok = ok && exec_list(&r, &t->root);
    ms_status st = r.st;
    arena_free(&r.a);
    if (!ok || st != MS_OK) {
        ms_free(b.p);
        return st != MS_OK ? st : MS_FAIL(err, MS_ERR_INTERNAL, "%s: render failed", t->name);
    }
    if (b.p == NULL) {
        b.p = ms_malloc(1);
        if (b.p == NULL)
            return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", t->name);
        b.p[0] = '\0';
    }
    *out = b.p;
    if (out_len != NULL)
        *out_len = b.n;
    return MS_OK;
}

ms_status ms_chat_template_render(const ms_chat_template *t, const json_t *messages, bool add_generation_prompt,
                                  const char *bos_token, const char *eos_token, char **out, ms_error *err) {
    *out = NULL;
    json_t *vars = json_object();
    if (vars == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", t->name);
    int bad = json_object_set(vars, "messages", messages != NULL ? (json_t *)messages : json_null());
    bad |= json_object_set_new(vars, "add_generation_prompt", json_boolean(add_generation_prompt));
    bad |= json_object_set_new(vars, "tools", json_null());
    if (bos_token != NULL)
        bad |= json_object_set_new(vars, "bos_token", json_string(bos_token));
    if (eos_token != NULL)
        bad |= json_object_set_new(vars, "eos_token", json_string(eos_token));
    ms_status st =
        bad ? MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: bad messages, bos_token or eos_token (not UTF-8?)", t->name)
            : ms_chat_template_render_vars(t, vars, out, NULL, err);
    json_decref(vars);
    return st;
}

ms_status ms_chat_template_load_config(const char *path, char **text, ms_error *err) {
    *text = NULL;
    json_error_t je;
    json_t *cfg = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
    if (cfg == NULL) {
        FILE *f = fopen(path, "rb");
        if (f == NULL)
            return MS_FAIL(err, MS_ERR_IO, "%s: cannot open (%s)", path, strerror(errno));
        fclose(f);
        return MS_FAIL(err, MS_ERR_PARSE, "%s:%d:%d: %s", path, je.line, je.column, je.text);
    }
    ms_status st = MS_OK;
    const json_t *tmpl = json_object_get(cfg, "chat_template");
    if (json_is_array(tmpl)) {
        const json_t *pick = NULL;
        for (size_t i = 0; i < json_array_size(tmpl); i++) {
            const json_t *e = json_array_get(tmpl, i);
            const char *name = json_string_value(json_object_get(e, "name"));
            if (name != NULL && strcmp(name, "default") == 0)
                pick = json_object_get(e, "template");
        }
        if (pick == NULL) {
            st = MS_FAIL(err, MS_ERR_NOT_FOUND, "%s: chat_template lists no template named 'default'", path);
            goto done;
        }
        tmpl = pick;
    }
    if (tmpl == NULL || json_is_null(tmpl)) {
        st = MS_FAIL(err, MS_ERR_NOT_FOUND, "%s: no chat_template", path);
    } else if (!json_is_string(tmpl)) {
        st = MS_FAIL(err, MS_ERR_FORMAT, "%s: chat_template is not a string", path);
    } else {
        *text = ms_strdup(json_string_value(tmpl));
        if (*text == NULL)
            st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", path);
    }
done:
    json_decref(cfg);
    return st;
}
