/*
 * ast.h - the syntax tree of a model file (dsl/README.md is the language reference).
 *
 * Built only by the grammar actions through the ms_ast_* builders below (CONVENTIONS.md item 8);
 * every node lives in the compilation's ms_arena and is never freed on its own. The tree is
 * purely syntactic: names are strings, nothing is resolved. compiler/sema.c checks it and builds
 * the checked model (compiler/model.h), which points back into these nodes for expressions and
 * forward bodies; sema also fills the few `sema:` annotation fields marked below.
 *
 * Lists are ms_ptr_vec (arena.h) of the element type named in the field comment.
 */
#ifndef MS_AST_H
#define MS_AST_H

#include "arena.h"
#include "diag.h"

typedef struct ms_parse_ctx ms_parse_ctx;

/* ---- expressions ---- */

/* ORDER MS_EXPR */
typedef enum ms_expr_kind {
    MS_EXPR_INT = 0,  /* ival */
    MS_EXPR_FLOAT,    /* fval */
    MS_EXPR_BOOL,     /* bval */
    MS_EXPR_STRING,   /* text (unescaped) */
    MS_EXPR_NONE,     /* the literal `none` (absent optional value) */
    MS_EXPR_NAME,     /* text: a bare identifier (parameter, weight, label, enum word, ...) */
    MS_EXPR_MEMBER,   /* lhs.text: layer member (l.wq) or resource method (pos.apply) */
    MS_EXPR_CALL,     /* lhs(args): lhs is a NAME or MEMBER */
    MS_EXPR_UNARY,    /* op lhs */
    MS_EXPR_BINARY,   /* lhs op rhs */
    MS_EXPR_COND,     /* cond ? lhs : rhs */
    MS_EXPR_LIST,     /* [args] (args unnamed) */
    MS_EXPR_KIND_COUNT
} ms_expr_kind;

/* ORDER MS_OP (keep ms_op_str in sync) */
typedef enum ms_op {
    MS_OP_ADD = 0,
    MS_OP_SUB,
    MS_OP_MUL,
    MS_OP_DIV,    /* integer division on ints (truncating), real division otherwise */
    MS_OP_MOD,
    MS_OP_EQ,
    MS_OP_NE,
    MS_OP_LT,
    MS_OP_LE,
    MS_OP_GT,
    MS_OP_GE,
    MS_OP_AND,
    MS_OP_OR,
    MS_OP_ARROW,  /* a -> b: fork source into target, combined labels into a plan label */
    MS_OP_RANGE,  /* a .. b: capture buckets, powers of two from a to b */
    MS_OP_NEG,    /* unary - */
    MS_OP_NOT,    /* unary ! */
    MS_OP_COUNT
} ms_op;

/* Source spelling of an operator ("+", "->", ...). */
const char *ms_op_str(ms_op op);

typedef struct ms_ast_expr ms_ast_expr;
typedef struct ms_ast_sym ms_ast_sym;

/* A call argument or list element: `name = value` or a bare `value` (name NULL). */
typedef struct ms_ast_arg {
    const char *name;      /* keyword, or NULL for a positional argument */
    ms_loc name_loc;       /* location of the keyword */
    ms_ast_expr *value;    /* never NULL */
} ms_ast_arg;

/* An expression. Which fields are meaningful depends on `kind` (see ms_expr_kind). */
struct ms_ast_expr {
    ms_expr_kind kind;
    ms_loc loc;            /* the whole expression */
    int64_t ival;          /* MS_EXPR_INT */
    double fval;           /* MS_EXPR_FLOAT */
    bool bval;             /* MS_EXPR_BOOL */
    const char *text;      /* STRING value, NAME identifier, MEMBER field name */
    ms_op op;              /* UNARY, BINARY */
    ms_ast_expr *lhs;      /* UNARY operand, BINARY left, MEMBER object, CALL callee, COND then */
    ms_ast_expr *rhs;      /* BINARY right, COND else */
    ms_ast_expr *cond;     /* COND condition */
    ms_ptr_vec args;       /* CALL arguments, LIST elements: ms_ast_arg* */
    int height;            /* parser: levels of the tree below and including this node (leaf 1) */
    /* sema: what a NAME (or the object of a MEMBER) refers to; NULL until checked. */
    const ms_ast_sym *sym;
    /* sema: the value's type (an ms_type, see compiler/model.h) and, for tensors in a forward,
     * its shape: dims[rank] int config expressions, NULL for a dynamic dimension. */
    int type;
    int rank;
    const ms_ast_expr **dims;
};

/* An identifier with its location (references: labels, resources, groups, ...). */
typedef struct ms_ast_ident {
    const char *name;
    ms_loc loc;
} ms_ast_ident;

/* ---- config ---- */

/* `[let] name: type[?] [= default] [from "key", ...];` */
typedef struct ms_ast_param {
    ms_ast_ident name;
    ms_ast_ident type;     /* int | float | bool | string (checked by sema) */
    bool optional;         /* `type?`: may be absent in config.json and has no default */
    bool derived;          /* `let`: always computed from `dflt`, never read from config.json */
    ms_ast_expr *dflt;     /* default (or, when derived, the definition); NULL when none */
    ms_ptr_vec sources;    /* config.json keys tried in order (dotted paths), ms_ast_expr* STRING;
                              empty = the parameter's own name */
    ms_loc loc;            /* the whole declaration */
} ms_ast_param;

/* ---- weights ---- */

/* ORDER MS_AST_WEIGHT */
typedef enum ms_ast_weight_kind {
    MS_AST_WEIGHT_TENSOR = 0,  /* one checkpoint tensor */
    MS_AST_WEIGHT_GROUP,       /* per-layer group: name[index < count] { tensors } */
    MS_AST_WEIGHT_IGNORE,      /* ignore "pattern", ...: checkpoint tensors present but unused */
    MS_AST_WEIGHT_KIND_COUNT
} ms_ast_weight_kind;

/* `name = "ckpt.name" | "alt.name" [d0, d1] [or other [if cond]] [optional];`, a group, or
 * `ignore "visual.*", ...;` (IGNORE: no name; the patterns are in `names`). */
typedef struct ms_ast_weight {
    ms_ast_weight_kind kind;
    ms_ast_ident name;
    ms_loc loc;
    /* TENSOR */
    ms_ptr_vec names;      /* checkpoint name templates tried in order, ms_ast_expr* STRING
                              (IGNORE: the patterns, `*` matching any run of characters) */
    ms_ptr_vec shape;      /* dimensions, ms_ast_expr* (int expressions over config) */
    ms_ast_ident tie;      /* `or other`: use weight `other` instead (name NULL when none) */
    ms_ast_expr *tie_cond; /* `if cond`: tie only when cond holds (NULL: when the tensor is missing) */
    bool optional;         /* may be absent from the checkpoint (a bias) */
    /* GROUP */
    ms_ast_ident index;    /* the index variable used as {index} in name templates */
    ms_ast_expr *count;    /* number of layers (int expression) */
    ms_ptr_vec members;    /* ms_ast_weight* TENSOR */
} ms_ast_weight;

/* ---- nodes ---- */

/* `resource name = ctor(args);` */
typedef struct ms_ast_resource {
    ms_ast_ident name;
    ms_ast_expr *ctor;     /* MS_EXPR_CALL (checked by sema) */
    ms_loc loc;
} ms_ast_resource;

/* One `label += span` of a segments statement. */
typedef struct ms_ast_segment {
    ms_ast_ident label;
    ms_ast_expr *span;
} ms_ast_segment;

/* ORDER MS_AST_STEP_ITEM */
typedef enum ms_ast_step_item_kind {
    MS_AST_STEP_SEGMENTS = 0, /* segments a += n, b += m; */
    MS_AST_STEP_CAPTURE,      /* capture batch in [1, 2, 4 .. 64]; */
    MS_AST_STEP_RECORD,       /* resource record: kv commit = false, pre_fork = main -> x; */
    MS_AST_STEP_ITEM_KIND_COUNT
} ms_ast_step_item_kind;

typedef struct ms_ast_step_item {
    ms_ast_step_item_kind kind;
    ms_loc loc;
    ms_ptr_vec segments;   /* SEGMENTS: ms_ast_segment* */
    ms_ast_ident dim;      /* CAPTURE: batch | tokens */
    ms_ptr_vec buckets;    /* CAPTURE: ms_ast_expr* (ints or a .. b ranges) */
    ms_ast_ident resource; /* RECORD: the resource */
    ms_ptr_vec fields;     /* RECORD: ms_ast_arg* (value a BOOL true for a bare flag) */
} ms_ast_step_item;

/* `step name(params) { items }` */
typedef struct ms_ast_step {
    ms_ast_ident name;
    ms_ptr_vec params;     /* ms_ast_ident* (token-id inputs of the step) */
    ms_ptr_vec items;      /* ms_ast_step_item* */
    ms_loc loc;
} ms_ast_step;

/* ORDER MS_AST_STMT */
typedef enum ms_ast_stmt_kind {
    MS_AST_STMT_ASSIGN = 0, /* lhs... = rhs...; */
    MS_AST_STMT_EXPR,       /* rhs[0]; (a call for its effect) */
    MS_AST_STMT_FOR,        /* for var in group { body } */
    MS_AST_STMT_RETURN,     /* return rhs...; */
    MS_AST_STMT_KIND_COUNT
} ms_ast_stmt_kind;

typedef struct ms_ast_stmt {
    ms_ast_stmt_kind kind;
    ms_loc loc;
    ms_ptr_vec lhs;        /* ASSIGN targets: ms_ast_expr* (sema requires NAMEs) */
    ms_ptr_vec rhs;        /* ASSIGN/RETURN values, EXPR expression: ms_ast_expr* */
    ms_ast_ident var;      /* FOR loop variable */
    ms_ast_ident group;    /* FOR weight group iterated */
    ms_ptr_vec body;       /* FOR body: ms_ast_stmt* */
    ms_ast_expr *at;       /* FOR ... at <expr>: the one member of the group the body reads
                              (`for hd in heads at code.slot - 1`: the step's frame slot), or
                              NULL: every member in turn */
} ms_ast_stmt;

/* A forward parameter: `name` (token ids [T]), `name: [d0, d1]` (`_` = dynamic dimension) or
 * `name: [d0, d1] ids` (an element type after the shape: sema accepts `ids`, int32 ids). */
typedef struct ms_ast_fparam {
    ms_ast_ident name;
    ms_ptr_vec shape;      /* ms_ast_expr*; empty = token ids */
    bool has_shape;
    ms_ast_ident elem;     /* the element type word (NULL name: float rows) */
} ms_ast_fparam;

/* `forward [name](params) -> result { body }` */
typedef struct ms_ast_forward {
    ms_ast_ident name;     /* NULL name: the default forward */
    ms_ptr_vec params;     /* ms_ast_fparam* */
    ms_ast_ident result;
    ms_ptr_vec body;       /* ms_ast_stmt* */
    ms_loc loc;
} ms_ast_forward;

/* `node name { labels ...; resource ...; step ...; forward ... }` */
typedef struct ms_ast_node {
    ms_ast_ident name;
    ms_ptr_vec labels;     /* ms_ast_ident* declared labels (main is implicit) */
    ms_ptr_vec resources;  /* ms_ast_resource* in source order */
    ms_ptr_vec steps;      /* ms_ast_step* */
    ms_ptr_vec forwards;   /* ms_ast_forward* */
    ms_ptr_vec order;      /* every item above in source order, as ms_ast_node_item* (for dump) */
    ms_loc loc;
} ms_ast_node;

/* ORDER MS_AST_NODE_ITEM */
typedef enum ms_ast_node_item_kind {
    MS_AST_NODE_LABELS = 0,
    MS_AST_NODE_RESOURCE,
    MS_AST_NODE_STEP,
    MS_AST_NODE_FORWARD,
    MS_AST_NODE_ITEM_KIND_COUNT
} ms_ast_node_item_kind;

/* One item of a node body, in source order. */
typedef struct ms_ast_node_item {
    ms_ast_node_item_kind kind;
    void *item;            /* ms_ptr_vec* of idents (LABELS), ms_ast_resource*, ms_ast_step*,
                              ms_ast_forward* */
} ms_ast_node_item;

/* ---- walks ---- */

/* ORDER MS_AST_WALK */
typedef enum ms_ast_walk_kind {
    MS_AST_WALK_STEP = 0,  /* node.step */
    MS_AST_WALK_SEQ,       /* a then b then c */
    MS_AST_WALK_LOOP,      /* loop body until cond */
    MS_AST_WALK_KIND_COUNT
} ms_ast_walk_kind;

typedef struct ms_ast_walk_item {
    ms_ast_walk_kind kind;
    ms_loc loc;
    ms_ast_ident node;     /* STEP */
    ms_ast_ident step;     /* STEP */
    ms_ptr_vec items;      /* SEQ: ms_ast_walk_item* (>= 2) */
    struct ms_ast_walk_item *body; /* LOOP */
    ms_ast_ident until;    /* LOOP: stop condition (stop) */
} ms_ast_walk_item;

/* `walk name = seq;` */
typedef struct ms_ast_walk {
    ms_ast_ident name;
    ms_ast_walk_item *body;
    ms_loc loc;
} ms_ast_walk;

/* ---- the file ---- */

/* `model name { config {...} weights {...} node ... walk ... }` */
typedef struct ms_ast_model {
    ms_ast_ident name;
    ms_ptr_vec params;     /* ms_ast_param*, every config block in order */
    ms_ptr_vec weights;    /* ms_ast_weight*, every weights block in order */
    ms_ptr_vec nodes;      /* ms_ast_node* */
    ms_ptr_vec walks;      /* ms_ast_walk* */
    ms_loc loc;
} ms_ast_model;

/* ---- builders (called only from grammar actions; never fail: the arena longjmps on OOM) ---- */

ms_ast_expr *ms_ast_int(ms_parse_ctx *ctx, ms_loc loc, int64_t v);
ms_ast_expr *ms_ast_float(ms_parse_ctx *ctx, ms_loc loc, double v);
ms_ast_expr *ms_ast_bool(ms_parse_ctx *ctx, ms_loc loc, bool v);
ms_ast_expr *ms_ast_string(ms_parse_ctx *ctx, ms_loc loc, const char *s);
ms_ast_expr *ms_ast_none(ms_parse_ctx *ctx, ms_loc loc);
ms_ast_expr *ms_ast_name(ms_parse_ctx *ctx, ms_loc loc, const char *name);
ms_ast_expr *ms_ast_member(ms_parse_ctx *ctx, ms_loc loc, ms_ast_expr *obj, const char *field);
ms_ast_expr *ms_ast_call(ms_parse_ctx *ctx, ms_loc loc, ms_ast_expr *callee, ms_ptr_vec *args);
ms_ast_expr *ms_ast_unary(ms_parse_ctx *ctx, ms_loc loc, ms_op op, ms_ast_expr *e);
ms_ast_expr *ms_ast_binary(ms_parse_ctx *ctx, ms_loc loc, ms_op op, ms_ast_expr *a, ms_ast_expr *b);
ms_ast_expr *ms_ast_cond(ms_parse_ctx *ctx, ms_loc loc, ms_ast_expr *c, ms_ast_expr *a, ms_ast_expr *b);
ms_ast_expr *ms_ast_list(ms_parse_ctx *ctx, ms_loc loc, ms_ptr_vec *items);
ms_ast_arg *ms_ast_arg_new(ms_parse_ctx *ctx, ms_loc name_loc, const char *name, ms_ast_expr *v);
ms_ast_ident *ms_ast_ident_new(ms_parse_ctx *ctx, ms_loc loc, const char *name);
/* The list type `elem[]` of a config parameter: an identifier named "<elem>[]" at loc. */
ms_ast_ident *ms_ast_list_type(ms_parse_ctx *ctx, ms_loc loc, ms_ast_ident *elem);

/* An empty list / a list with one element / the list with `item` appended (returns `v`). */
ms_ptr_vec *ms_ast_vec(ms_parse_ctx *ctx);
ms_ptr_vec *ms_ast_vec1(ms_parse_ctx *ctx, void *item);
ms_ptr_vec *ms_ast_vec_push(ms_parse_ctx *ctx, ms_ptr_vec *v, void *item);

ms_ast_param *ms_ast_param_new(ms_parse_ctx *ctx, ms_loc loc, bool derived, ms_ast_ident *name,
                               ms_ast_ident *type, bool optional, ms_ast_expr *dflt,
                               ms_ptr_vec *sources);
/* Add the parameters of one config block to the model. */
void ms_ast_model_add_params(ms_parse_ctx *ctx, ms_ptr_vec *params);
void ms_ast_model_add_weights(ms_parse_ctx *ctx, ms_ptr_vec *weights);
void ms_ast_model_add_node(ms_parse_ctx *ctx, ms_ast_node *node);
void ms_ast_model_add_walk(ms_parse_ctx *ctx, ms_ast_walk *walk);
/* Finish the model: name and location (the items were added as they were parsed). */
void ms_ast_model_finish(ms_parse_ctx *ctx, ms_loc loc, ms_ast_ident *name);

ms_ast_weight *ms_ast_weight_tensor(ms_parse_ctx *ctx, ms_loc loc, ms_ast_ident *name,
                                    ms_ptr_vec *names, ms_ptr_vec *shape, ms_ast_weight *suffix);
/* The suffix part of a tensor declaration (tie, condition, optional), merged by
 * ms_ast_weight_tensor. NULL tie: none. */
ms_ast_weight *ms_ast_weight_suffix(ms_parse_ctx *ctx, ms_ast_ident *tie, ms_ast_expr *tie_cond,
                                    bool optional);
/* `ignore "pattern", ...;` in a weights block (loc: the keyword). */
ms_ast_weight *ms_ast_weight_ignore(ms_parse_ctx *ctx, ms_loc loc, ms_ptr_vec *patterns);
ms_ast_weight *ms_ast_weight_group(ms_parse_ctx *ctx, ms_loc loc, ms_ast_ident *name,
                                   ms_ast_ident *index, ms_ast_expr *count, ms_ptr_vec *members);

ms_ast_node *ms_ast_node_new(ms_parse_ctx *ctx);
ms_ast_node *ms_ast_node_add_labels(ms_parse_ctx *ctx, ms_ast_node *n, ms_ptr_vec *labels);
ms_ast_node *ms_ast_node_add_resource(ms_parse_ctx *ctx, ms_ast_node *n, ms_loc loc,
                                      ms_ast_ident *name, ms_ast_expr *ctor);
ms_ast_node *ms_ast_node_add_step(ms_parse_ctx *ctx, ms_ast_node *n, ms_ast_step *s);
ms_ast_node *ms_ast_node_add_forward(ms_parse_ctx *ctx, ms_ast_node *n, ms_ast_forward *f);
ms_ast_node *ms_ast_node_finish(ms_parse_ctx *ctx, ms_ast_node *n, ms_loc loc, ms_ast_ident *name);

ms_ast_segment *ms_ast_segment_new(ms_parse_ctx *ctx, ms_ast_ident *label, ms_ast_expr *span);
ms_ast_step_item *ms_ast_step_segments(ms_parse_ctx *ctx, ms_loc loc, ms_ptr_vec *segments);
ms_ast_step_item *ms_ast_step_capture(ms_parse_ctx *ctx, ms_loc loc, ms_ast_ident *dim,
                                      ms_ptr_vec *buckets);
ms_ast_step_item *ms_ast_step_record(ms_parse_ctx *ctx, ms_loc loc, ms_ast_ident *resource,
                                     ms_ptr_vec *fields);
/* A record field: `name = value`, or a bare flag `name` (value NULL: true). */
ms_ast_arg *ms_ast_field(ms_parse_ctx *ctx, ms_loc loc, const char *name, ms_ast_expr *value);
ms_ast_step *ms_ast_step_new(ms_parse_ctx *ctx, ms_loc loc, ms_ast_ident *name, ms_ptr_vec *params,
                             ms_ptr_vec *items);

ms_ast_stmt *ms_ast_stmt_assign(ms_parse_ctx *ctx, ms_loc loc, ms_ptr_vec *lhs, ms_ptr_vec *rhs);
ms_ast_stmt *ms_ast_stmt_expr(ms_parse_ctx *ctx, ms_loc loc, ms_ptr_vec *exprs);
ms_ast_stmt *ms_ast_stmt_for(ms_parse_ctx *ctx, ms_loc loc, ms_ast_ident *var, ms_ast_ident *group,
                             ms_ptr_vec *body);
/* `for var in group at <expr> { body }` (word must be "at": a one-line error otherwise). */
ms_ast_stmt *ms_ast_stmt_for_at(ms_parse_ctx *ctx, ms_loc loc, ms_ast_ident *var,
                                ms_ast_ident *group, ms_ast_ident *word, ms_ast_expr *at,
                                ms_ptr_vec *body);
ms_ast_stmt *ms_ast_stmt_return(ms_parse_ctx *ctx, ms_loc loc, ms_ptr_vec *values);
ms_ast_fparam *ms_ast_fparam_new(ms_parse_ctx *ctx, ms_ast_ident *name, ms_ptr_vec *shape);
ms_ast_forward *ms_ast_forward_new(ms_parse_ctx *ctx, ms_loc loc, ms_ast_ident *name,
                                   ms_ptr_vec *params, ms_ast_ident *result, ms_ptr_vec *body);

ms_ast_walk_item *ms_ast_walk_step(ms_parse_ctx *ctx, ms_loc loc, ms_ast_ident *node,
                                   ms_ast_ident *step);
ms_ast_walk_item *ms_ast_walk_seq(ms_parse_ctx *ctx, ms_loc loc, ms_ast_walk_item *a,
                                  ms_ast_walk_item *b);
ms_ast_walk_item *ms_ast_walk_loop(ms_parse_ctx *ctx, ms_loc loc, ms_ast_walk_item *body,
                                   ms_ast_ident *until);
ms_ast_walk *ms_ast_walk_new(ms_parse_ctx *ctx, ms_loc loc, ms_ast_ident *name,
                             ms_ast_walk_item *body);

/* %destructor hook: a semantic value bison discarded during error recovery. The value stays in
 * the arena (released with the compilation); this only counts it (ctx statistics). */
void ms_ast_discard(ms_parse_ctx *ctx, const void *value);

#endif /* MS_AST_H */
