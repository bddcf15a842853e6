/*
 * eval.h - values of a checked model's config parameters for one checkpoint: reads config.json
 * (jansson) through each parameter's sources, applies defaults and derived definitions, and
 * evaluates config expressions (weight shapes, resource arguments, conditions).
 *
 * This is the semantics the loader and the generated code implement; the compiler's tests use
 * it to prove the models (models/<name>.mstar) against the real checkpoints in ../shared/fixtures.
 *
 * Ownership: values point into the model (names) and into the json object (strings); they stay
 * valid while both do. Functions borrow their arguments.
 *
 * Usage:
 *     ms_value *v = calloc(m->n_params, sizeof *v);
 *     if (ms_config_eval(m, json, v, &err) != MS_OK) ... err.msg names the parameter and the key
 *     ms_value dim; ms_expr_eval(m->weights[0]->shape[0], v, &dim, &err);
 */
#ifndef MS_EVAL_H
#define MS_EVAL_H

#include <jansson.h>

#include "model.h"
#include "model_desc.h" /* MS_MD_MAX_LIST: the runtime's bound on int[] values */

/* A config value. */
typedef struct ms_value {
    ms_type type;      /* INT, FLOAT, BOOL, STRING, LIST (int[]), or NONE (absent optional / `none`) */
    int64_t i;         /* INT */
    double f;          /* FLOAT (also set for INT) */
    bool b;            /* BOOL */
    const char *s;     /* STRING (borrowed) */
    int32_t n;         /* LIST: elements */
    int64_t list[MS_MD_MAX_LIST]; /* LIST [n] */
} ms_value;

/*
 * Evaluate every parameter of m for the config.json object `config` into values[m->n_params]
 * (indexed by ms_param.index). A required parameter missing from config.json, a value of the
 * wrong JSON type, or an expression that cannot be evaluated (division by zero) fails with
 * MS_ERR_FORMAT and a message naming the parameter and the keys tried.
 */
ms_status ms_config_eval(const ms_model *m, const json_t *config, ms_value *values, ms_error *err);

/* Evaluate a checked config expression with the parameter values from ms_config_eval. */
ms_status ms_expr_eval(const ms_ast_expr *e, const ms_value *values, ms_value *out, ms_error *err);

#endif /* MS_EVAL_H */
