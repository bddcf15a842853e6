/*
 * fuzz_dsl.c - libFuzzer target for the model language front end (`make fuzz-dsl`).
 *
 * For every input: compile it (lexer, parser, semantic pass), print the diagnostics (to a
 * null stream), and when it checks clean, dump it, compile the dump and dump again: the two
 * dumps must be identical; then evaluate its config for a synthetic config.json (every int 3,
 * float 0.5, bool alternating, string "llama3") and every weight shape and layer count. Aborts (a finding) on any difference, on a leaked ms_malloc block,
 * or on an out-of-memory result (inputs are capped at 64 KiB, far from any limit). Crashes,
 * leaks and undefined behaviour are caught by ASan/UBSan, with which the target is built.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval.h"
#include "mstarc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static FILE *null_out(void) {
    static FILE *f;
    if (f == NULL)
        f = fopen("/dev/null", "w");
    return f;
}

/* Evaluation must fail cleanly or succeed; results are not checked (random models). */
static void eval_config(const ms_model *m) {
    json_t *cfg = json_object();
    for (int i = 0; i < m->n_params; i++) {
        const ms_param *p = m->params[i];
        json_t *v = p->type == MS_TYPE_INT     ? json_integer(3)
                    : p->type == MS_TYPE_FLOAT ? json_real(0.5)
                    : p->type == MS_TYPE_BOOL  ? json_boolean(i % 2)
                                               : json_string("llama3");
        json_object_set_new(cfg, p->sources[0], v);
    }
    ms_value *vals = calloc((size_t)m->n_params + 1, sizeof *vals);
    ms_error err = {0};
    if (ms_config_eval(m, cfg, vals, &err) == MS_OK) {
        for (int w = 0; w < m->n_weights; w++) {
            ms_value out;
            for (int d = 0; d < m->weights[w]->rank; d++)
                ms_expr_eval(m->weights[w]->shape[d], vals, &out, &err);
            if (m->weights[w]->group != NULL)
                ms_expr_eval(m->weights[w]->group->count, vals, &out, &err);
        }
    }
    free(vals);
    json_decref(cfg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 65536)
        return -1;
    int64_t live = ms_alloc_get_stats().live_blocks;
    ms_compile *c = NULL;
    ms_error err = {0};
    ms_status st = ms_compile_source("fuzz.mstar", (const char *)data, size, 0, &c, &err);
    if (st == MS_ERR_OOM) {
        fprintf(stderr, "fuzz_dsl: unexpected out of memory: %s\n", err.msg);
        abort();
    }
    if (st != MS_OK) {
        if (c == NULL || ms_compile_diags(c)->n_errors == 0) {
            fprintf(stderr, "fuzz_dsl: failure without a diagnostic (status %d)\n", (int)st);
            abort();
        }
        ms_diags_print(ms_compile_diags(c), null_out());
    } else {
        ms_strbuf d1 = {0}, d2 = {0};
        if (ms_model_dump(ms_compile_model(c), &d1) != MS_OK)
            abort();
        ms_compile *c2 = NULL;
        if (ms_compile_source("dump.mstar", d1.data, d1.len, 0, &c2, &err) != MS_OK) {
            fprintf(stderr, "fuzz_dsl: the dump does not check:\n%s\n", d1.data);
            if (c2 != NULL)
                ms_diags_print(ms_compile_diags(c2), stderr);
            abort();
        }
        if (ms_model_dump(ms_compile_model(c2), &d2) != MS_OK || strcmp(d1.data, d2.data) != 0) {
            fprintf(stderr, "fuzz_dsl: dump -> parse -> dump differs:\n%s\n---\n%s\n", d1.data, d2.data);
            abort();
        }
        ms_compile_free(c2);
        ms_strbuf_free(&d1);
        ms_strbuf_free(&d2);
        eval_config(ms_compile_model(c));
    }
    ms_compile_free(c);
    if (ms_alloc_get_stats().live_blocks != live) {
        fprintf(stderr, "fuzz_dsl: %lld block(s) leaked\n",
                (long long)(ms_alloc_get_stats().live_blocks - live));
        abort();
    }
    return 0;
}
