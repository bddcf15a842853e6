/*
 * cli.c - the verbs of a serving binary (cli.h): `generate` here, `bench` in bench.c.
 *
 * Constraints: every bad flag value gets a one-line error naming the flag and the value; every
 * load error is the engine's one-line message (file and problem); nothing leaks on any path.
 */
#include "cli.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "tokenizer_llama2c.h"

/* ---- flag parsing ---- */

#define CLI_DEFAULT_NEW 256 /* --max-new-tokens when neither it nor --steps is given */

typedef struct cli_opts {
    const char *model;
    const char *tokenizer;
    const char *prompt;
    const char *prompt_ids;
    const char *prompts_file;
    int32_t max_new;        /* -1 = not given */
    int32_t steps;          /* -1 = not given */
    ms_sampling_params sampling;
    bool ignore_eos;
    int32_t page_size;
    int32_t threads;
    const char *dtype;
    const char *device;
} cli_opts;

static const char *g_prog = "mstar";

static int cli_fail(const char *fmt, ...) MS_PRINTF(1, 2);
static int cli_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", g_prog);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

static bool parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (s == NULL || *s == '\0')
        return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

static bool parse_u64(const char *s, uint64_t *out) {
    if (s == NULL || *s == '\0' || *s == '-')
        return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return false;
    *out = v;
    return true;
}

static bool parse_f(const char *s, float *out) {
    if (s == NULL || *s == '\0')
        return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || *end != '\0' || !isfinite(v))
        return false;
    *out = (float)v;
    return true;
}

static void usage(FILE *to) {
    fprintf(to,
            "usage: %s generate --model PATH [--tokenizer PATH]\n"
            "           (--prompt TEXT | --prompt-ids 1,2,3 | --prompts-file FILE)\n"
            "           [--max-new-tokens N | --steps N] [--temperature T] [--top-k K]\n"
            "           [--top-p P] [--seed S] [--ignore-eos] [--page-size N]\n"
            "           [--device auto|cpu|cuda] [--dtype auto|f32|bf16] [--threads N]\n"
            "       %s bench --model PATH [...]   (%s bench --help)\n",
            g_prog, g_prog, g_prog);
}

/* Returns 0 on success, else the exit status (message printed). */
static int parse_generate(int argc, char **argv, cli_opts *o) {
    memset(o, 0, sizeof *o);
    o->max_new = -1;
    o->steps = -1;
    o->sampling = (ms_sampling_params){1.0f, 0, 1.0f, 0};
    o->device = "auto";
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--ignore-eos") == 0) {
            o->ignore_eos = true;
            continue;
        }
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return -1;
        }
        if (strncmp(a, "--", 2) != 0) {
            usage(stderr);
            cli_fail("unexpected argument '%s'", a);
            return 2;
        }
        static const char *const with_value[] = {
            "--model", "--tokenizer", "--prompt", "--prompt-ids", "--prompts-file",
            "--max-new-tokens", "--steps", "--temperature", "--top-k", "--top-p", "--seed",
            "--page-size", "--device", "--threads", "--dtype"};
        bool known = false;
        for (size_t k = 0; k < MS_ARRAY_LEN(with_value); k++)
            known = known || strcmp(a, with_value[k]) == 0;
        if (!known) {
            usage(stderr);
            cli_fail("unknown flag '%s'", a);
            return 2;
        }
        if (i + 1 >= argc) {
            cli_fail("flag %s needs a value", a);
            return 2;
        }
        const char *v = argv[++i];
        int64_t n;
        if (strcmp(a, "--model") == 0) {
            o->model = v;
        } else if (strcmp(a, "--tokenizer") == 0) {
            o->tokenizer = v;
        } else if (strcmp(a, "--prompt") == 0) {
            o->prompt = v;
        } else if (strcmp(a, "--prompt-ids") == 0) {
            o->prompt_ids = v;
        } else if (strcmp(a, "--prompts-file") == 0) {
            o->prompts_file = v;
        } else if (strcmp(a, "--max-new-tokens") == 0) {
            if (!parse_i64(v, 0, INT32_MAX, &n))
                return cli_fail("--max-new-tokens: '%s' is not an integer >= 0", v);
            o->max_new = (int32_t)n;
        } else if (strcmp(a, "--steps") == 0) {
            if (!parse_i64(v, 1, INT32_MAX, &n))
                return cli_fail("--steps: '%s' is not an integer >= 1", v);
            o->steps = (int32_t)n;
        } else if (strcmp(a, "--temperature") == 0) {
            if (!parse_f(v, &o->sampling.temperature) || o->sampling.temperature < 0.0f)
                return cli_fail("--temperature: '%s' is not a number >= 0", v);
        } else if (strcmp(a, "--top-k") == 0) {
            if (!parse_i64(v, 0, INT32_MAX, &n))
                return cli_fail("--top-k: '%s' is not an integer >= 0 (0 disables it)", v);
            o->sampling.top_k = (int32_t)n;
        } else if (strcmp(a, "--top-p") == 0) {
            if (!parse_f(v, &o->sampling.top_p) || !(o->sampling.top_p > 0.0f) ||
                o->sampling.top_p > 1.0f)
                return cli_fail("--top-p: '%s' is not a number in (0, 1]", v);
        } else if (strcmp(a, "--seed") == 0) {
            if (!parse_u64(v, &o->sampling.seed))
                return cli_fail("--seed: '%s' is not an unsigned integer", v);
        } else if (strcmp(a, "--page-size") == 0) {
            if (!parse_i64(v, 1, 65536, &n))
                return cli_fail("--page-size: '%s' is not an integer in [1, 65536]", v);
            o->page_size = (int32_t)n;
        } else if (strcmp(a, "--threads") == 0) {
            if (!parse_i64(v, 1, 1024, &n))
                return cli_fail("--threads: '%s' is not an integer in [1, 1024]", v);
            o->threads = (int32_t)n;
        } else if (strcmp(a, "--device") == 0) {
            if (strcmp(v, "auto") != 0 && strcmp(v, "cpu") != 0 && strcmp(v, "cuda") != 0)
                return cli_fail("--device: '%s' is not auto, cpu or cuda", v);
            o->device = v;
        } else if (strcmp(a, "--dtype") == 0) {
            if (strcmp(v, "auto") != 0 && strcmp(v, "f32") != 0 && strcmp(v, "bf16") != 0)
                return cli_fail("--dtype: '%s' is not auto, f32 or bf16", v);
            o->dtype = v;
        }
    }
    if (o->model == NULL) {
        usage(stderr);
        cli_fail("--model is required");
        return 2;
    }
    int n_src = (o->prompt != NULL) + (o->prompt_ids != NULL) + (o->prompts_file != NULL);
    if (n_src != 1) {
        usage(stderr);
        cli_fail("give exactly one of --prompt, --prompt-ids, --prompts-file");
        return 2;
    }
    if (o->max_new >= 0 && o->steps >= 0) {
        cli_fail("give --max-new-tokens or --steps, not both");
        return 2;
    }
    if (o->prompt != NULL && o->tokenizer == NULL)
        return cli_fail("--prompt needs --tokenizer (this binary reads llama2.c tokenizer.bin); "
                        "give token ids with --prompt-ids instead");
    return 0;
}

/* ---- prompts ---- */

typedef struct cli_prompt {
    int32_t *ids;
    size_t n;
} cli_prompt;

typedef struct cli_prompts {
    cli_prompt *v;
    size_t n, cap;
} cli_prompts;

static void prompts_free(cli_prompts *p) {
    for (size_t i = 0; i < p->n; i++)
        ms_free(p->v[i].ids);
    ms_free(p->v);
    memset(p, 0, sizeof *p);
}

/* Parse "1,2, 3" into a fresh array. `where` names the source for messages. */
static int parse_ids(const char *s, const char *where, cli_prompt *out) {
    size_t cap = 0, n = 0;
    int32_t *ids = NULL;
    const char *p = s;
    while (*p != '\0') {
        while (*p == ' ' || *p == '\t')
            p++;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno != 0 || v < 0 || v > INT32_MAX) {
            ms_free(ids);
            return cli_fail("%s: '%s' is not a comma-separated list of token ids", where, s);
        }
        if (ms_grow((void **)&ids, &cap, n + 1, sizeof *ids) != MS_OK) {
            ms_free(ids);
            return cli_fail("out of memory");
        }
        ids[n++] = (int32_t)v;
        p = end;
        while (*p == ' ' || *p == '\t' || *p == '\r')
            p++;
        if (*p == ',')
            p++;
        else if (*p != '\0') {
            ms_free(ids);
            return cli_fail("%s: '%s' is not a comma-separated list of token ids", where, s);
        }
    }
    if (n == 0)
        return cli_fail("%s: no token ids", where);
    out->ids = ids;
    out->n = n;
    return 0;
}

static int add_prompt(cli_prompts *ps, const char *text, const char *where,
                      const ms_llama2c_tok *tok) {
    if (ms_grow((void **)&ps->v, &ps->cap, ps->n + 1, sizeof *ps->v) != MS_OK)
        return cli_fail("out of memory");
    cli_prompt *p = &ps->v[ps->n];
    if (tok != NULL) {
        ms_error err = {0};
        if (ms_llama2c_tok_encode(tok, text, true, false, &p->ids, &p->n, &err) != MS_OK)
            return cli_fail("%s: %s", where, err.msg);
    } else {
        int rc = parse_ids(text, where, p);
        if (rc != 0)
            return rc;
    }
    ps->n++;
    return 0;
}

static int read_prompts_file(const char *path, const ms_llama2c_tok *tok, cli_prompts *ps) {
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return cli_fail("%s: cannot open the prompts file: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int rc = 0, lineno = 0;
    while (rc == 0 && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            line[--len] = '\0';
        if (len == 0)
            continue;
        char where[600];
        snprintf(where, sizeof where, "%s:%d", path, lineno);
        rc = add_prompt(ps, line, where, tok);
    }
    free(line); /* from getline (libc), not ms_malloc */
    fclose(f);
    if (rc == 0 && ps->n == 0)
        rc = cli_fail("%s: no prompts (the file has no non-empty line)", path);
    return rc;
}

/* ---- output ---- */

/* Print a sequence as run.c does: every piece after BOS, non-printable single bytes skipped. */
static void print_text(const ms_llama2c_tok *tok, const int32_t *prompt, size_t n_prompt,
                       const int32_t *out, int32_t n_out, bool drop_last) {
    int prev = -1;
    size_t total = n_prompt + (size_t)n_out - (drop_last ? 1 : 0);
    for (size_t i = 0; i < total; i++) {
        int t = i < n_prompt ? prompt[i] : out[i - n_prompt];
        if (i == 0 && t == MS_LLAMA2C_TOK_BOS) {
            prev = t;
            continue;
        }
        const char *piece = ms_llama2c_tok_decode(tok, prev, t);
        if (ms_llama2c_tok_piece_printable(piece))
            fputs(piece, stdout);
        prev = t;
    }
    fputc('\n', stdout);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- generate ---- */

static int cmd_generate(int argc, char **argv, const ms_model_desc *desc) {
    cli_opts o;
    int rc = parse_generate(argc, argv, &o);
    if (rc != 0)
        return rc < 0 ? 0 : rc;

    ms_error err = {0};
    ms_llama2c_tok *tok = NULL;
    ms_engine *eng = NULL;
    cli_prompts ps = {0};
    ms_rid *rids = NULL;

    /* the model's facts first: the tokenizer needs the vocabulary size */
    ms_engine_options eo = ms_engine_options_default();
    eo.model_path = o.model;
    eo.device = o.device;
    eo.page_size = o.page_size;
    eo.n_threads = o.threads;
    eo.dtype = o.dtype;

    if (o.tokenizer != NULL) {
        /* vocab 0: as many tokens as the file holds; checked against the model below */
        if (ms_llama2c_tok_init(&tok, o.tokenizer, 0, &err) != MS_OK) {
            rc = cli_fail("%s", err.msg);
            goto done;
        }
    }
    if (o.prompt != NULL)
        rc = add_prompt(&ps, o.prompt, "--prompt", tok);
    else if (o.prompt_ids != NULL)
        rc = add_prompt(&ps, o.prompt_ids, "--prompt-ids", NULL);
    else
        rc = read_prompts_file(o.prompts_file, tok, &ps);
    if (rc != 0)
        goto done;

    size_t total = 0;
    for (size_t i = 0; i < ps.n; i++)
        total += ps.v[i].n;
    /* worst-case sizes from the prompts: a batch of up to 64 rows, a prefill budget of up to
     * 1024 tokens per step (longer prompts are prefilled in chunks), KV pages for the longest
     * sequence a request can reach (prompt + new tokens, capped at the context by the engine) */
    eo.max_seqs = (int32_t)MS_MIN(ps.n, (size_t)64);
    eo.max_tokens = (int32_t)MS_MAX(MS_MIN(total, (size_t)1024), (size_t)eo.max_seqs);
    int64_t longest = 0;
    for (size_t i = 0; i < ps.n; i++) {
        int64_t new_tokens = o.steps >= 0 ? (int64_t)o.steps + 1
                                          : (o.max_new >= 0 ? o.max_new : CLI_DEFAULT_NEW);
        longest = MS_MAX(longest, (int64_t)ps.v[i].n + new_tokens);
    }
    eo.max_seq_len = (int32_t)MS_MIN(longest, (int64_t)INT32_MAX);
    if (ms_engine_init(&eng, desc, &eo, &err) != MS_OK) {
        rc = cli_fail("%s", err.msg);
        goto done;
    }
    const ms_md_facts *fa = ms_engine_facts(eng);
    if (tok != NULL && ms_llama2c_tok_vocab_size(tok) < fa->vocab) {
        rc = cli_fail("%s: the tokenizer has %d tokens, the model's vocabulary is %d",
                      o.tokenizer, ms_llama2c_tok_vocab_size(tok), (int)fa->vocab);
        goto done;
    }

    rids = ms_calloc(ps.n, sizeof *rids);
    if (rids == NULL) {
        rc = cli_fail("out of memory");
        goto done;
    }
    size_t next = 0, n_gen = 0;
    double t0 = now_s(), t_first = 0.0;
    bool first_done = false;
    for (;;) {
        /* continuous batching: requests join at step boundaries */
        while (next < ps.n && ms_engine_n_active(eng) < eo.max_seqs) {
            ms_engine_request rq = {
                .prompt = ps.v[next].ids,
                .n_prompt = (int32_t)ps.v[next].n,
                .sampling = o.sampling,
                .ignore_eos = o.ignore_eos,
            };
            if (o.steps >= 0) {
                int32_t steps = MS_MIN(o.steps, fa->max_context);
                /* run.c: a forward per position < steps, each after the prompt samples */
                rq.max_new_tokens = MS_MAX(steps - rq.n_prompt + 1, 0);
            } else {
                rq.max_new_tokens = o.max_new >= 0 ? o.max_new : CLI_DEFAULT_NEW;
            }
            if (ms_engine_add(eng, &rq, &rids[next], &err) != MS_OK) {
                rc = ps.n > 1 ? cli_fail("prompt %zu: %s", next + 1, err.msg)
                              : cli_fail("%s", err.msg);
                goto done;
            }
            next++;
        }
        if (ms_engine_n_active(eng) == 0 && next == ps.n)
            break;
        ms_engine_step_info info;
        if (ms_engine_step(eng, &info, &err) != MS_OK) {
            rc = cli_fail("%s", err.msg);
            goto done;
        }
        if (!first_done) {
            t_first = now_s();
            first_done = true;
        }
    }
    double t1 = now_s();

    for (size_t i = 0; i < ps.n; i++) {
        const int32_t *out;
        int32_t n_out;
        ms_finish_reason why;
        MS_ASSERT(ms_engine_output(eng, rids[i], &out, &n_out, &why) == MS_OK);
        n_gen += (size_t)n_out;
        if (tok != NULL) {
            print_text(tok, ps.v[i].ids, ps.v[i].n, out, n_out, why == MS_FINISH_EOS);
        } else {
            if (ps.n > 1)
                printf("[%zu]", i + 1);
            for (int32_t k = 0; k < n_out; k++)
                printf("%s%d", (k > 0 || ps.n > 1) ? " " : "", (int)out[k]);
            printf("\n");
        }
        if (why == MS_FINISH_CONTEXT)
            fprintf(stderr,
                    "%s: note: prompt %zu stopped after %d new tokens: the sequence reached the "
                    "model's context (%d tokens)\n",
                    g_prog, i + 1, (int)n_out, (int)fa->max_context);
    }
    fflush(stdout);
    double secs = t1 - t0;
    double dec_secs = t1 - t_first;
    fprintf(stderr,
            "%s: %zu prompt(s), %zu prompt tokens, %zu new tokens in %.3f s: %.1f tokens/s "
            "(decode %.1f tokens/s) on %s, page size %d\n",
            g_prog, ps.n, total, n_gen, secs, secs > 0 ? (double)n_gen / secs : 0.0,
            dec_secs > 0 && n_gen > ps.n ? (double)(n_gen - ps.n) / dec_secs : 0.0,
            ms_engine_device(eng), (int)ms_engine_page_size(eng));

done:
    ms_free(rids);
    prompts_free(&ps);
    ms_engine_free(eng);
    ms_llama2c_tok_free(tok);
    return rc;
}

int ms_cli_main(int argc, char **argv, const ms_model_desc *desc) {
    if (argc >= 1 && argv[0] != NULL) {
        const char *slash = strrchr(argv[0], '/');
        g_prog = slash != NULL ? slash + 1 : argv[0];
    }
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (strcmp(argv[1], "generate") == 0)
        return cmd_generate(argc - 2, argv + 2, desc);
    if (strcmp(argv[1], "bench") == 0)
        return ms_cli_bench(argc - 2, argv + 2, desc, g_prog);
    if (strcmp(argv[1], "kernels") == 0)
        return ms_cli_kernels(argc - 2, argv + 2, desc, g_prog);
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(stdout);
        return 0;
    }
    usage(stderr);
    fprintf(stderr, "%s: unknown verb '%s' (this binary serves: generate, bench, kernels)\n",
            g_prog, argv[1]);
    return 2;
}
