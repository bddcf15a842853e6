/*
 * fuzz_dsl.c - libFuzzer target for the model language front end (`make fuzz-dsl`).
 *
 * For every input: compile it (lexer, parser, semantic pass), print the diagnostics (to a
 * null stream), and when it checks clean, dump it, compile the dump and dump again: the two
 * dumps must be identical. Aborts (a finding) on any difference, on a leaked ms_malloc block,
 * or on an out-of-memory result (inputs are capped at 64 KiB, far from any limit). Crashes,
 * leaks and undefined behaviour are caught by ASan/UBSan, with which the target is built.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mstarc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static FILE *null_out(void) {
    static FILE *f;
    if (f == NULL)
        f = fopen("/dev/null", "w");
    return f;
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
    }
    ms_compile_free(c);
    if (ms_alloc_get_stats().live_blocks != live) {
        fprintf(stderr, "fuzz_dsl: %lld block(s) leaked\n",
                (long long)(ms_alloc_get_stats().live_blocks - live));
        abort();
    }
    return 0;
}
