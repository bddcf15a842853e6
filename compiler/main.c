/*
 * main.c - the `mstarc` command.
 *
 *   mstarc check FILE...     parse and check each model file; diagnostics on stderr
 *   mstarc dump FILE         print the checked model in canonical form on stdout
 *   mstarc build FILE -o DIR the serving binary and its kernel instances (build_cmd.c; --arch
 *                            precompiles the kernels with NVRTC)
 *   options: --max-errors N (default 20), -h/--help
 *
 * Exit status: 0 when every file checks clean, 1 when any file has errors or cannot be read,
 * 2 on a usage error. Only this file calls exit().
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "codegen.h"
#include "mstarc.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: mstarc check [--max-errors N] FILE...\n"
            "       mstarc dump [--max-errors N] FILE\n"
            "       mstarc build FILE -o DIR [--arch sm_80,sm_90 [--config CKPT]]\n"
            "                                  (see mstarc build --help)\n"
            "\n"
            "  check   parse and check model files (see dsl/README.md); errors go to stderr\n"
            "  dump    print the checked model in canonical form (parses back to the same text)\n");
}

/* Flush stdout and check it for a write error (a full disk, a closed pipe): 0, or 1 with a
 * message. Every command calls it before returning success. */
static int stdout_check(void) {
    int before = errno; /* a failed implicit flush (a full buffer) left its reason here */
    errno = 0;
    int e = fflush(stdout) != 0 ? errno : 0;
    if (e == 0 && !ferror(stdout))
        return 0;
    if (e == 0)
        e = before;
    fprintf(stderr, "mstarc: error: cannot write the output to stdout: %s\n",
            e != 0 ? strerror(e) : "a write failed");
    return 1;
}

/* Compile one file; print diagnostics. Returns the session on success (caller frees). */
static ms_compile *compile_one(const char *path, int max_errors, bool *ok) {
    ms_compile *c = NULL;
    ms_error err = {0};
    ms_status st = ms_compile_file(path, max_errors, &c, &err);
    if (st == MS_OK) {
        *ok = true;
        return c;
    }
    *ok = false;
    if (c != NULL) {
        ms_diags_print(ms_compile_diags(c), stderr);
        ms_compile_free(c);
    } else if (st == MS_ERR_IO) {
        fprintf(stderr, "mstarc: error: %s\n", err.msg);
    } else {
        fprintf(stderr, "mstarc: error: %s\n", err.msg[0] != '\0' ? err.msg : ms_status_str(st));
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return stdout_check();
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "build") == 0)
        return ms_mstarc_build_main(argc - 1, argv + 1);
    if (strcmp(cmd, "check") != 0 && strcmp(cmd, "dump") != 0) {
        fprintf(stderr, "mstarc: error: unknown command '%s'\n", cmd);
        usage(stderr);
        return 2;
    }
    int max_errors = 0;
    const char *files[256];
    int n_files = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--max-errors") == 0) {
            char *end = NULL;
            long v = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
            if (i + 1 >= argc || end == argv[i + 1] || *end != '\0' || v < 1 || v > 100000) {
                fprintf(stderr, "mstarc: error: --max-errors needs a number from 1 to 100000\n");
                return 2;
            }
            max_errors = (int)v;
            i++;
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            fprintf(stderr, "mstarc: error: unknown option '%s'\n", argv[i]);
            return 2;
        } else if (n_files < (int)MS_ARRAY_LEN(files)) {
            files[n_files++] = argv[i];
        } else {
            fprintf(stderr, "mstarc: error: at most %d files per run\n", (int)MS_ARRAY_LEN(files));
            return 2;
        }
    }
    if (n_files == 0) {
        fprintf(stderr, "mstarc: error: %s needs a model file\n", cmd);
        usage(stderr);
        return 2;
    }
    if (strcmp(cmd, "dump") == 0) {
        if (n_files != 1) {
            fprintf(stderr, "mstarc: error: dump takes one file\n");
            return 2;
        }
        bool ok;
        ms_compile *c = compile_one(files[0], max_errors, &ok);
        if (!ok)
            return 1;
        ms_strbuf b = {0};
        ms_status st = ms_model_dump(ms_compile_model(c), &b);
        ms_compile_free(c);
        if (st != MS_OK) {
            ms_strbuf_free(&b);
            fprintf(stderr, "mstarc: error: out of memory while dumping\n");
            return 1;
        }
        fputs(b.data, stdout);
        ms_strbuf_free(&b);
        return stdout_check();
    }
    int failed = 0;
    for (int i = 0; i < n_files; i++) {
        bool ok;
        ms_compile *c = compile_one(files[i], max_errors, &ok);
        if (!ok) {
            failed++;
            continue;
        }
        const ms_model *m = ms_compile_model(c);
        int steps = 0;
        for (int k = 0; k < m->n_nodes; k++)
            steps += m->nodes[k]->n_steps;
        printf("%s: ok (model %s: %d node%s, %d step%s, %d weight%s)\n", files[i], m->name, m->n_nodes,
               m->n_nodes == 1 ? "" : "s", steps, steps == 1 ? "" : "s", m->n_weights,
               m->n_weights == 1 ? "" : "s");
        ms_compile_free(c);
    }
    int out_rc = stdout_check();
    return failed > 0 ? 1 : out_rc;
}
