/*
 * cli_talker.c - the `talker codes` verb (cli_talker.h): prompt files of audio-code frames, one
 * engine, ms_engine_talker_codes over every prompt at once, the generated frames printed.
 */
#include "cli_talker.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "engine.h"
#include "talker.h"

#define TK_MAX_PROMPTS 64
#define TK_MAX_FRAMES 4096 /* prompt frames one file may hold */

static void tk_usage(FILE *f, const char *prog) {
    fprintf(f,
            "usage: %s talker codes --model DIR --prompt-codes FILE [--prompt-codes FILE ...]\n"
            "           [--frames N] [--device auto|cpu|cuda] [--dtype auto|f32|bf16]\n"
            "           [--threads N]\n",
            prog);
}

/* One prompt file read as rows of integers: codes [n_frames * width] (ms_malloc'd). */
typedef struct tk_prompt {
    const char *path;
    int32_t *codes;
    int32_t n_frames;
    int32_t width;    /* codes per line (the first line's count; every line must match) */
} tk_prompt;

/* Read p->path; 0, or 1 after one line naming FILE:LINE. */
static int tk_read(const char *prog, tk_prompt *p) {
    FILE *f = fopen(p->path, "r");
    if (f == NULL) {
        fprintf(stderr, "%s: %s: %s\n", prog, p->path, strerror(errno));
        return 1;
    }
    char line[4096];
    int32_t cap = 0, lineno = 0;
    int rc = 0;
    p->codes = NULL;
    p->n_frames = p->width = 0;
    while (rc == 0 && fgets(line, sizeof line, f) != NULL) {
        lineno++;
        size_t len = strlen(line);
        if (len == sizeof line - 1 && line[len - 1] != '\n') {
            fprintf(stderr, "%s: %s:%d: line longer than %zu bytes\n", prog, p->path, (int)lineno,
                    sizeof line - 2);
            rc = 1;
            break;
        }
        char *s = line;
        while (*s == ' ' || *s == '\t')
            s++;
        if (*s == '\n' || *s == '\r' || *s == '\0' || *s == '#')
            continue;
        int32_t vals[MS_TALKER_MAX_GROUPS];
        int32_t n = 0;
        while (*s != '\0' && *s != '\n' && *s != '\r') {
            char *end = s;
            while (*end != '\0' && *end != ' ' && *end != '\t' && *end != '\n' && *end != '\r')
                end++;
            char save = *end;
            *end = '\0';
            int64_t v = 0;
            if (!ms_cli_parse_i64(s, 0, INT32_MAX, &v)) {
                fprintf(stderr, "%s: %s:%d: '", prog, p->path, (int)lineno);
                ms_cli_put_escaped(stderr, s, 40);
                fprintf(stderr, "' is not a code (an integer >= 0)\n");
                rc = 1;
                break;
            }
            if (n == MS_TALKER_MAX_GROUPS) {
                fprintf(stderr, "%s: %s:%d: more than %d codes on a line\n", prog, p->path,
                        (int)lineno, MS_TALKER_MAX_GROUPS);
                rc = 1;
                break;
            }
            vals[n++] = (int32_t)v;
            *end = save;
            s = end;
            while (*s == ' ' || *s == '\t')
                s++;
        }
        if (rc != 0)
            break;
        if (p->width == 0)
            p->width = n;
        if (n != p->width) {
            fprintf(stderr, "%s: %s:%d: %d codes, the first frame has %d\n", prog, p->path,
                    (int)lineno, (int)n, (int)p->width);
            rc = 1;
            break;
        }
        if (p->n_frames == TK_MAX_FRAMES) {
            fprintf(stderr, "%s: %s: more than %d frames\n", prog, p->path, TK_MAX_FRAMES);
            rc = 1;
            break;
        }
        if (p->n_frames == cap) {
            int32_t nc = cap == 0 ? 64 : 2 * cap;
            int32_t *grown = ms_realloc(p->codes,
                                        (size_t)nc * (size_t)p->width * sizeof(int32_t));
            if (grown == NULL) {
                fprintf(stderr, "%s: %s: out of memory\n", prog, p->path);
                rc = 1;
                break;
            }
            p->codes = grown;
            cap = nc;
        }
        memcpy(p->codes + (size_t)p->n_frames * (size_t)p->width, vals,
               (size_t)n * sizeof(int32_t));
        p->n_frames++;
    }
    if (rc == 0 && ferror(f)) {
        fprintf(stderr, "%s: %s: read error\n", prog, p->path);
        rc = 1;
    }
    if (rc == 0 && p->n_frames == 0) {
        fprintf(stderr, "%s: %s: no frames (one line of codes per frame)\n", prog, p->path);
        rc = 1;
    }
    fclose(f);
    return rc;
}

int ms_cli_talker(int argc, char **argv, const ms_model_desc *desc, const char *prog) {
    if (argc >= 1 && (strcmp(argv[0], "--help") == 0 || strcmp(argv[0], "-h") == 0)) {
        tk_usage(stdout, prog);
        return ms_cli_stdout_check(prog);
    }
    if (argc < 1 || strcmp(argv[0], "codes") != 0) {
        tk_usage(stderr, prog);
        fprintf(stderr, "%s: talker takes the subcommand 'codes'\n", prog);
        return 2;
    }
    const char *model = NULL, *device = "auto", *dtype = NULL;
    int64_t frames = 12, threads = 0;
    tk_prompt pr[TK_MAX_PROMPTS];
    int32_t n_pr = 0;
    memset(pr, 0, sizeof pr);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool takes = strcmp(a, "--model") == 0 || strcmp(a, "--prompt-codes") == 0 ||
                     strcmp(a, "--frames") == 0 || strcmp(a, "--device") == 0 ||
                     strcmp(a, "--dtype") == 0 || strcmp(a, "--threads") == 0;
        if (takes && i + 1 >= argc) {
            tk_usage(stderr, prog);
            fprintf(stderr, "%s: %s needs a value\n", prog, a);
            return 2;
        }
        if (strcmp(a, "--model") == 0) {
            model = argv[++i];
        } else if (strcmp(a, "--prompt-codes") == 0) {
            if (n_pr == TK_MAX_PROMPTS) {
                fprintf(stderr, "%s: at most %d prompts in one run\n", prog, TK_MAX_PROMPTS);
                return 2;
            }
            pr[n_pr++].path = argv[++i];
        } else if (strcmp(a, "--frames") == 0) {
            if (ms_cli_flag_i64(prog, a, argv[++i], 1, 1 << 20, "an integer >= 1", &frames) != 0)
                return 2;
        } else if (strcmp(a, "--device") == 0) {
            device = argv[++i];
        } else if (strcmp(a, "--dtype") == 0) {
            dtype = argv[++i];
        } else if (strcmp(a, "--threads") == 0) {
            if (ms_cli_flag_i64(prog, a, argv[++i], 0, 1024, "an integer >= 0", &threads) != 0)
                return 2;
        } else {
            tk_usage(stderr, prog);
            fprintf(stderr, "%s: unknown %s '", prog, a[0] == '-' ? "flag" : "argument");
            ms_cli_put_escaped(stderr, a, 100);
            fprintf(stderr, "'\n");
            return 2;
        }
    }
    if (model == NULL || n_pr == 0) {
        tk_usage(stderr, prog);
        fprintf(stderr, "%s: talker codes needs --model and at least one --prompt-codes FILE\n",
                prog);
        return 2;
    }
    int rc = 1;
    ms_engine *e = NULL;
    ms_talker_item items[TK_MAX_PROMPTS];
    memset(items, 0, sizeof items);
    ms_error err = {0};
    int32_t total = 0, longest = 0;
    for (int32_t k = 0; k < n_pr; k++) {
        if (tk_read(prog, &pr[k]) != 0)
            goto done;
        total += pr[k].n_frames;
        longest = MS_MAX(longest, pr[k].n_frames);
    }
    ms_engine_options o = ms_engine_options_default();
    o.model_path = model;
    o.device = device;
    o.dtype = dtype;
    o.n_threads = (int32_t)threads;
    o.max_seqs = n_pr;
    o.max_tokens = MS_MAX(total, 2 * n_pr);     /* every prompt prefilled in one step */
    o.max_seq_len = (int32_t)MS_MIN((int64_t)longest + frames, INT32_MAX);
    if (ms_engine_init(&e, desc, &o, &err) != MS_OK) {
        fprintf(stderr, "%s: %s\n", prog, err.msg);
        goto done;
    }
    ms_talker_glue glue = ms_talker_glue_default();
    const ms_md_facts *pf = ms_engine_node_facts(e, glue.predictor);
    const ms_md_facts *tf = ms_engine_node_facts(e, glue.talker);
    if (pf == NULL || tf == NULL) {
        fprintf(stderr, "%s: model %s has no '%s' and '%s' nodes: not a talker model\n", prog,
                desc->name, glue.talker, glue.predictor);
        goto done;
    }
    for (int32_t k = 0; k < n_pr; k++) {
        if (pr[k].width != pf->max_context) {
            fprintf(stderr, "%s: %s: frames of %d codes, the model's have %d\n", prog, pr[k].path,
                    (int)pr[k].width, (int)pf->max_context);
            goto done;
        }
        for (int32_t i = 0; i < pr[k].n_frames * pr[k].width; i++)
            if (pr[k].codes[i] >= tf->vocab) {
                fprintf(stderr, "%s: %s: frame %d: code %d is outside the vocabulary [0, %d)\n",
                        prog, pr[k].path, (int)(i / pr[k].width + 1), (int)pr[k].codes[i],
                        (int)tf->vocab);
                goto done;
            }
        items[k] = (ms_talker_item){.prompt_codes = pr[k].codes, .n_prompt = pr[k].n_frames,
                                    .n_frames = (int32_t)frames};
    }
    if (ms_engine_talker_codes(e, &glue, items, n_pr, &err) != MS_OK) {
        fprintf(stderr, "%s: %s\n", prog, err.msg);
        goto done;
    }
    for (int32_t k = 0; k < n_pr; k++) {
        if (k > 0)
            printf("\n");
        for (int32_t f = 0; f < items[k].n_frames; f++) {
            for (int32_t g = 0; g < pr[k].width; g++)
                printf("%s%d", g ? " " : "", (int)items[k].codes[f * pr[k].width + g]);
            printf("\n");
        }
    }
    rc = ms_cli_stdout_check(prog);
done:
    for (int32_t k = 0; k < n_pr; k++) {
        ms_free(pr[k].codes);
        ms_free(items[k].codes);
    }
    ms_engine_free(e);
    return rc;
}
