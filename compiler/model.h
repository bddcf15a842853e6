/*
 * model.h - the checked model: what compiler/sema.c builds from the syntax tree once every name,
 * type, shape and resource relation has been proven consistent. This is the structure the code
 * generator walks (op list of the forward, resource specs per node, step declarations in the
 * runtime/resources/resource.h vocabulary); the dumper prints it back as canonical source.
 *
 * Ownership: everything lives in the compilation's arena (see mstarc.h) and is read-only for
 * users. Expressions are the syntax tree's (dsl/ast.h): config expressions are evaluated against
 * config.json at load time, so they stay expressions here; names inside them are resolved
 * (ms_ast_expr.sym points at an ms_ast_sym below).
 *
 * Walking a model:
 *     for (int i = 0; i < m->n_nodes; i++) {
 *         const ms_node *n = m->nodes[i];
 *         for (int r = 0; r < n->n_resources; r++)      // dependency order = resource index
 *             emit_spec(n->resources[r]);               // ms_resource_arg(res, "page_size") ...
 *         for (int s = 0; s < n->n_steps; s++)
 *             emit_step(n->steps[s]);                   // segments + recs[resource index]
 *         for (int f = 0; f < n->n_forwards; f++)
 *             emit_forward(n->forwards[f]->ast->body);  // statements with resolved names/shapes
 *     }
 */
#ifndef MS_MODEL_H
#define MS_MODEL_H

#include "ast.h"
#include "resource.h"

typedef struct ms_param ms_param;
typedef struct ms_weight ms_weight;
typedef struct ms_group ms_group;
typedef struct ms_resource ms_resource;
typedef struct ms_node ms_node;
typedef struct ms_forward ms_forward;
typedef struct ms_step_decl ms_step_decl;

/* ---- value types ---- */

/* Types of config values, resource arguments and forward values. ORDER MS_TYPE (ms_type_str) */
typedef enum ms_type {
    MS_TYPE_UNKNOWN = 0, /* after an error: accepted everywhere to avoid cascades */
    MS_TYPE_INT,         /* int64 */
    MS_TYPE_FLOAT,       /* double */
    MS_TYPE_BOOL,
    MS_TYPE_STRING,
    MS_TYPE_NONE,        /* the literal none */
    MS_TYPE_WORD,        /* an enum word (rotate_half, bf16, ...) */
    MS_TYPE_WINDOW,      /* window(W) */
    MS_TYPE_SCALING,     /* llama3(...) / linear(...) RoPE scaling */
    MS_TYPE_LIST,        /* [a, b, ...] of ints: list literals and `int[]` config parameters */
    MS_TYPE_TENSOR,      /* forward value with a shape (ms_ast_expr.dims) */
    MS_TYPE_TUPLE,       /* several values (pos.apply returns (q, k)) */
    MS_TYPE_LAYER,       /* loop variable over a weight group */
    MS_TYPE_RESOURCE,    /* a resource of the node (only as a method's object) */
    MS_TYPE_COUNT
} ms_type;

const char *ms_type_str(ms_type t);

/* ---- symbols (what a name refers to) ---- */

/* ORDER MS_SYM */
typedef enum ms_sym_kind {
    MS_SYM_PARAM = 0,   /* config parameter: param */
    MS_SYM_WEIGHT,      /* top-level weight or group member: weight */
    MS_SYM_GROUP,       /* weight group: group */
    MS_SYM_RESOURCE,    /* resource of the enclosing node: resource */
    MS_SYM_LABEL,       /* stream label of the enclosing node: label (index) */
    MS_SYM_INPUT,       /* step input or forward parameter: index = position */
    MS_SYM_LOCAL,       /* forward binding: index = binding number within the forward */
    MS_SYM_LAYER,       /* for-loop variable: group */
    MS_SYM_WORD,        /* enum word or constructor name (no declaration) */
    MS_SYM_BUILTIN,     /* builtin function of the forward (embedding, linear, ...) */
    MS_SYM_KIND_COUNT
} ms_sym_kind;

/* The target of a resolved name; ms_ast_expr.sym points at one of these. */
struct ms_ast_sym {
    ms_sym_kind kind;
    const char *name;
    const ms_param *param;        /* PARAM */
    const ms_weight *weight;      /* WEIGHT */
    const ms_group *group;        /* GROUP, LAYER */
    const ms_resource *resource;  /* RESOURCE */
    int index;                    /* LABEL: label index; INPUT: position; LOCAL: binding number */
};

/* ---- config ---- */

/* A config parameter. Value at load time: derived -> dflt evaluated; else the first of
 * `sources` present in config.json; else dflt; else absent (only allowed when optional). */
struct ms_param {
    const char *name;
    ms_type type;                 /* INT, FLOAT, BOOL, STRING or LIST (`int[]`) */
    bool optional;                /* may be absent; uses must be guarded with has(name) */
    bool derived;                 /* `let`: never read from config.json */
    const ms_ast_expr *dflt;      /* default / definition, or NULL */
    const char **sources;         /* [n_sources] config.json keys (dotted paths) tried in order */
    int n_sources;                /* >= 1 (the name itself when none was written) */
    int index;                    /* position in ms_model.params (declaration order) */
    const ms_ast_param *ast;
    ms_ast_sym sym;               /* the symbol names resolve to */
};

/* ---- weights ---- */

/* A per-layer group `name[index < count] { ... }`. */
struct ms_group {
    const char *name;
    const char *index_var;        /* the {index} variable of the name templates */
    const ms_ast_expr *count;     /* number of layers (int config expression) */
    ms_weight **members;          /* [n_members] */
    int n_members;
    const ms_ast_weight *ast;
    ms_ast_sym sym;
};

/* One checkpoint tensor (per layer when group != NULL). */
struct ms_weight {
    const char *name;             /* DSL name (member name inside a group) */
    const ms_group *group;        /* NULL for a top-level weight */
    const char **names;           /* [n_names] checkpoint name templates tried in order ({i}) */
    int n_names;
    const ms_ast_expr **shape;    /* [rank] int config expressions */
    int rank;
    const ms_weight *tie;         /* use this weight instead (when tie_cond holds / when missing) */
    const ms_ast_expr *tie_cond;  /* bool config expression, NULL = only when the tensor is missing */
    bool optional;                /* may be absent (the forward then skips it, e.g. a bias) */
    bool used;                    /* read by a forward, a resource argument or a used tie (always
                                     true in a checked model: unused weights are errors) */
    int index;                    /* position in ms_model.weights */
    const ms_ast_weight *ast;
    ms_ast_sym sym;
};

/* ---- resources ---- */

/* Type of a resource argument (constructor key). ORDER MS_ARG */
typedef enum ms_arg_type {
    MS_ARG_INT = 0,     /* int config expression */
    MS_ARG_FLOAT,       /* float (or int) config expression */
    MS_ARG_BOOL,        /* bool config expression */
    MS_ARG_ENUM,        /* one word of ms_res_key.words */
    MS_ARG_WINDOW,      /* window(W) or none */
    MS_ARG_SCALING,     /* llama3(factor, low_freq_factor, high_freq_factor,
                           original_max_positions), linear(factor) or none */
    MS_ARG_INT_LIST,    /* [int, ...] or none */
    MS_ARG_WEIGHT,      /* name of a top-level weight */
    MS_ARG_LABEL,       /* label of the node */
    MS_ARG_INT_OR_NONE, /* int config expression or none */
    MS_ARG_TYPE_COUNT
} ms_arg_type;

/* One key a resource constructor accepts. */
typedef struct ms_res_key {
    const char *name;
    ms_arg_type type;
    bool required;
    const char *dflt;             /* default, as source text (documentation and dump), or NULL */
    const char *const *words;     /* ENUM: NULL-terminated allowed words */
} ms_res_key;

#define MS_RES_MAX_KEYS 12

/* A resource constructor (kv_pool, rope, positions, attention, cross, scratch, sampler). */
typedef struct ms_res_spec {
    const char *ctor;             /* constructor name in the language */
    ms_resource_kind kind;        /* runtime kind (runtime/resources/resource.h) */
    bool needs_kv;                /* must depend on exactly one kv_pool */
    ms_res_key keys[MS_RES_MAX_KEYS]; /* terminated by a NULL name */
} ms_res_spec;

/* The spec of constructor `ctor`, or NULL. */
const ms_res_spec *ms_res_spec_find(const char *ctor);
/* Every spec, [*n]. */
const ms_res_spec *ms_res_specs(int *n);

/* A resource of a node. */
struct ms_resource {
    const char *name;
    const ms_res_spec *spec;
    ms_resource_kind kind;        /* spec->kind */
    int index;                    /* dependency order (ties: ms_resource_kind order, then name): the resource index
                                     of ms_step.records and ms_step_ctx.plan_results */
    const ms_resource **deps;     /* [n_deps] resources this one depends on (positional args) */
    int n_deps;
    const ms_resource *kv;        /* the kv_pool dependency (needs_kv), else NULL */
    const ms_resource *scratch;   /* a rope's scratch dependency (positions = slots of the frame:
                                     a code predictor's), instead of a kv_pool; else NULL */
    const ms_ast_expr *args[MS_RES_MAX_KEYS]; /* by key position in spec->keys; NULL = default */
    const ms_ast_resource *ast;
    ms_ast_sym sym;
};

/* Argument `key` of r (NULL when not given: the spec's default applies). MS_ASSERTs that key is
 * a key of r's constructor. */
const ms_ast_expr *ms_resource_arg(const ms_resource *r, const char *key);

/* ---- steps ---- */

typedef struct ms_segment_decl {
    int label;                    /* label index in the node */
    const ms_ast_expr *span;      /* int expression over step inputs (len(tokens)) and config */
} ms_segment_decl;

typedef struct ms_fork_decl {
    int from;                     /* label index */
    int to;
} ms_fork_decl;

typedef struct ms_combined_decl {
    int labels[MS_MAX_COMBINED_LABELS]; /* [n_labels] source labels in plan order */
    int n_labels;
    int plan_label;
} ms_combined_decl;

/* What a step declares for one resource (mirrors the records of runtime/resources/resource.h). Defaults
 * apply to fields the step does not write. */
typedef struct ms_step_rec {
    const ms_resource *resource;
    bool written;                 /* the step had a record for this resource */
    /* KV */
    bool commit;                  /* default true */
    ms_combined_decl *combined;   /* [n_combined] */
    int n_combined;
    ms_fork_decl *pre_forks;      /* [n_pre_forks] */
    int n_pre_forks;
    ms_fork_decl *post_forks;     /* [n_post_forks] */
    int n_post_forks;
    /* ATTN */
    bool causal;                  /* default: the resource's causal argument (true) */
    /* POS */
    const ms_ast_expr *advance;   /* custom advance (int expression), NULL = the scheme's rule */
    bool explicit_ids;            /* the request supplies position ids */
    /* SCRATCH */
    bool begin_frame;             /* `code begin = true`: each row's scratch is emptied first */
} ms_step_rec;

/* ORDER MS_CAPTURE */
typedef enum ms_capture_dim {
    MS_CAPTURE_NONE = 0,          /* eager only */
    MS_CAPTURE_BATCH,             /* buckets over the number of rows */
    MS_CAPTURE_TOKENS,            /* buckets over the number of tokens */
    MS_CAPTURE_DIM_COUNT
} ms_capture_dim;

/* A step declaration of a node. */
struct ms_step_decl {
    const char *name;
    const char **inputs;          /* [n_inputs] token-id inputs */
    int n_inputs;
    ms_segment_decl *segments;    /* [n_segments] in declaration order (packed order) */
    int n_segments;
    ms_step_rec recs[MS_MAX_RESOURCES]; /* by resource index; [n_resources of the node] */
    ms_capture_dim capture;
    int64_t *buckets;             /* [n_buckets] strictly increasing graph buckets */
    int n_buckets;
    const ms_forward *forward;    /* the forward this step runs */
    const ms_ast_step *ast;
};

/* ---- forward ---- */

/* A forward pass. Its body is ast->body: statements whose expressions carry, after checking,
 * the resolved symbol (expr->sym), the value type (expr->type) and for tensors the shape
 * (expr->dims[rank], NULL = dynamic dimension such as the token count). */
struct ms_forward {
    const char *name;             /* "forward" for the default forward, else its name */
    const ms_ast_forward *ast;
    int n_inputs;                 /* ast->params.n */
    int n_locals;                 /* bindings made (MS_SYM_LOCAL index range) */
};

/* ---- nodes, walks, model ---- */

typedef struct ms_label_decl {
    const char *name;
    int index;                    /* the ms_label value (main = 0) */
    ms_ast_sym sym;
} ms_label_decl;

struct ms_node {
    const char *name;
    ms_label_decl *labels;        /* [n_labels], labels[0] is main */
    int n_labels;
    ms_resource **resources;      /* [n_resources] in dependency order */
    int n_resources;
    ms_step_decl **steps;         /* [n_steps] in declaration order */
    int n_steps;
    ms_forward **forwards;        /* [n_forwards] */
    int n_forwards;
    const ms_ast_node *ast;
};

typedef struct ms_walk {
    const char *name;
    const ms_ast_walk_item *body; /* STEP items refer to checked node.step pairs */
    const ms_ast_walk *ast;
} ms_walk;

/* The checked model. */
typedef struct ms_model {
    const char *name;
    ms_param **params;            /* [n_params] declaration order */
    int n_params;
    ms_group **groups;            /* [n_groups] */
    int n_groups;
    ms_weight **weights;          /* [n_weights] every tensor, group members included, in order */
    int n_weights;
    ms_node **nodes;              /* [n_nodes] */
    int n_nodes;
    ms_walk **walks;              /* [n_walks] */
    int n_walks;
    const char **ignores;         /* [n_ignores] `ignore` patterns of the weights blocks, in order:
                                     checkpoint tensors present but not loaded ('*' = any run) */
    const ms_ast_expr **ignore_exprs; /* [n_ignores] their STRING expressions (locations) */
    int n_ignores;
    const ms_ast_model *ast;
} ms_model;

/* Lookups by name (NULL when absent). */
const ms_param *ms_model_find_param(const ms_model *m, const char *name);
const ms_weight *ms_model_find_weight(const ms_model *m, const char *name);
const ms_node *ms_model_find_node(const ms_model *m, const char *name);
const ms_step_decl *ms_node_find_step(const ms_node *n, const char *name);

/*
 * The semantic pass: check `ast` and build the checked model in `arena`. Errors go to `diags`
 * (several, up to its limit). Returns MS_OK and *out, or MS_ERR_PARSE (*out = NULL) when any
 * error was reported. The arena should have an out-of-memory jmp_buf (mstarc.h sets one).
 */
ms_status ms_sema_check(ms_arena *arena, ms_diags *diags, const ms_ast_model *ast, ms_model **out);

#endif /* MS_MODEL_H */
