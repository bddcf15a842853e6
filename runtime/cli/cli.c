/*
 * cli.c - the verbs of a serving binary (cli.h): `generate` here and the dispatch to the others
 * (`chat` cli_chat.c, `transcribe` cli_transcribe.c, `serve` cli_serve.c, `bench` cli_bench.c,
 * `kernels` cli_kernels.c, `talker` cli_talker.c), and the helpers they share (model probe, id lists, streaming UTF-8,
 * the tokenizer: tokenizer.json, a llama2.c .bin, or a GGUF's own through gguf_tokenizer.h).
 *
 * Order of work in generate: flags, then the model's config (ms_cli_model_probe: the path and the
 * vocabulary), then the tokenizer and its check against the vocabulary, then the prompts, then the
 * engine (weights), so that a mistake in any input is reported before the expensive steps.
 *
 * Constraints: every bad flag value gets a one-line error naming the flag and the value; every
 * load error is the engine's or loader's one-line message (file and problem); nothing leaks on any
 * path.
 */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cli_talker.h"
#include "cli_transcribe.h"
#include "engine.h"
#include "gguf_tokenizer.h"
#include "hf_config.h"
#include "model_probe.h"
#include "position_ids.h"
#include "threadpool.h"
#include "tokenizer_hf.h"
#include "tokenizer_llama2c.h"

/* ---- id lists ---- */

ms_status ms_cli_parse_ids(const char *s, int32_t **ids, size_t *n, ms_error *err) {
    *ids = NULL;
    *n = 0;
    size_t cap = 0, k = 0;
    int32_t *v = NULL;
    const char *p = s;
    for (;;) {
        size_t entry = k + 1;
        while (*p == ' ' || *p == '\t')
            p++;
        const char *digits = p;
        int64_t x = 0;
        bool big = false;
        while (*p >= '0' && *p <= '9') {
            x = x * 10 + (*p - '0');
            big = big || x > INT32_MAX;
            if (big)
                x = 0; /* keep scanning the digits without overflowing */
            p++;
        }
        size_t n_digits = (size_t)(p - digits);
        while (*p == ' ' || *p == '\t')
            p++;
        if (n_digits == 0 && (*p == ',' || *p == '\0')) {
            ms_free(v);
            if (*p == '\0' && k == 0)
                return MS_FAIL(err, MS_ERR_PARSE,
                               "no token ids (expected comma-separated ids such as 1,2,3)");
            return MS_FAIL(err, MS_ERR_PARSE,
                           "entry %zu is empty (a leading, trailing or doubled comma)", entry);
        }
        if (n_digits == 0 || (*p != ',' && *p != '\0')) {
            const char *bad = digits;
            size_t len = strcspn(bad, ",");
            ms_free(v);
            return MS_FAIL(err, MS_ERR_PARSE, "entry %zu '%.*s' is not a token id (a decimal "
                                              "integer >= 0)",
                           entry, (int)MS_MIN(len, (size_t)40), bad);
        }
        if (big) {
            ms_free(v);
            return MS_FAIL(err, MS_ERR_PARSE, "entry %zu '%.*s' is above the largest id %d",
                           entry, (int)MS_MIN(n_digits, (size_t)40), digits, INT32_MAX);
        }
        if (ms_grow((void **)&v, &cap, k + 1, sizeof *v) != MS_OK) {
            ms_free(v);
            return MS_FAIL(err, MS_ERR_OOM, "out of memory for %zu token ids", k + 1);
        }
        v[k++] = (int32_t)x;
        if (*p == '\0')
            break;
        p++; /* the comma */
    }
    *ids = v;
    *n = k;
    return MS_OK;
}

/* ---- streaming UTF-8 ---- */

/* Bytes in the sequence led by b (1 .. 4; 0: b cannot lead one) and the range of its second byte
 * (Unicode table 3-7, as Rust's from_utf8 checks it). */
static int utf8_lead(unsigned b, unsigned *lo, unsigned *hi) {
    *lo = 0x80;
    *hi = 0xBF;
    if (b < 0x80)
        return 1;
    if (b >= 0xC2 && b <= 0xDF)
        return 2;
    if (b >= 0xE0 && b <= 0xEF) {
        if (b == 0xE0)
            *lo = 0xA0;
        else if (b == 0xED)
            *hi = 0x9F;
        return 3;
    }
    if (b >= 0xF0 && b <= 0xF4) {
        if (b == 0xF0)
            *lo = 0x90;
        else if (b == 0xF4)
            *hi = 0x8F;
        return 4;
    }
    return 0;
}

static size_t utf8_fffd(char *out) {
    memcpy(out, "\xEF\xBF\xBD", 3);
    return 3;
}

size_t ms_cli_utf8_push(ms_cli_utf8 *s, const char *bytes, size_t n, char *out) {
    MS_ASSERT(s->n_pend >= 0 && s->n_pend <= 3);
    size_t np = (size_t)s->n_pend, total = np + n, i = 0, w = 0;
    unsigned char held[3];
    memcpy(held, s->pend, np);
#define AT(k) ((k) < np ? held[(k)] : (unsigned char)bytes[(k) - np])
    s->n_pend = 0;
    while (i < total) {
        unsigned lo, hi;
        unsigned b = AT(i);
        int len = utf8_lead(b, &lo, &hi);
        if (len == 1) {
            out[w++] = (char)b;
            i++;
            continue;
        }
        if (len == 0) {
            w += utf8_fffd(out + w);
            i++;
            continue;
        }
        size_t k = 1;
        bool bad = false;
        for (; k < (size_t)len && i + k < total; k++) {
            unsigned c = AT(i + k);
            if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) {
                bad = true;
                break;
            }
        }
        if (bad) {
            w += utf8_fffd(out + w); /* the maximal subpart i .. i + k - 1 */
            i += k;
        } else if (k < (size_t)len) {
            for (size_t j = 0; j < k; j++) /* incomplete at the end: hold back */
                s->pend[j] = AT(i + j);
            s->n_pend = (int32_t)k;
            i += k;
        } else {
            for (size_t j = 0; j < k; j++)
                out[w++] = (char)AT(i + j);
            i += k;
        }
    }
#undef AT
    return w;
}

size_t ms_cli_utf8_flush(ms_cli_utf8 *s, char *out) {
    bool any = s->n_pend > 0;
    s->n_pend = 0;
    return any ? utf8_fffd(out) : 0;
}

/* ---- model probe ---- */

ms_status ms_cli_model_probe(const ms_model_desc *desc, const char *path, ms_md_facts *facts,
                             int64_t *layer_matmul_params, char **dir, ms_error *err) {
    if (dir != NULL)
        *dir = NULL;
    ms_model_probe p;
    MS_TRY(ms_model_probe_init(&p, desc, path, err));
    *facts = p.facts;
    if (layer_matmul_params != NULL) {
        int64_t sum = 0;
        for (int32_t w = 0; w < desc->n_weights; w++) {
            const ms_md_weight *wd = &desc->weights[w];
            if (!wd->per_layer || wd->rank != 2 || wd->kind == MS_MD_WEIGHT_PART)
                continue;
            int64_t shape[2] = {0, 0};
            desc->weight_shape(p.config, w, shape);
            sum += shape[0] * shape[1];
        }
        *layer_matmul_params = sum * facts->n_layers;
    }
    if (dir != NULL) {
        *dir = p.folder;
        p.folder = NULL;
    }
    ms_model_probe_free(&p);
    return MS_OK;
}

/* ---- flag parsing ---- */

#define CLI_DEFAULT_NEW 256 /* --max-new-tokens when neither it nor --steps is given */

typedef enum cli_output { CLI_OUT_AUTO = 0, CLI_OUT_TEXT, CLI_OUT_IDS, CLI_OUT_JSONL } cli_output;

typedef struct cli_opts {
    const char *model;
    const char *tokenizer;  /* NULL: the checkpoint's tokenizer.json if any; "none": none */
    const char *prompt;
    const char *prompt_ids;
    const char *prompts_file;
    int32_t max_new;        /* -1 = not given */
    int32_t steps;          /* -1 = not given */
    ms_sampling_params sampling;
    bool set_temperature;   /* the sampling flags given: the others take the model's declared */
    bool set_top_k;         /* sampler(temperature, top_k, top_p) defaults */
    bool set_top_p;
    const char *negative_prompt;      /* batched CFG: text (needs a tokenizer) */
    const char *negative_prompt_ids;  /* or ids */
    const char *position_ids;         /* --position-ids FILE: JSON [3][S] or [S] ids of the one
                                         prompt (M-RoPE t/h/w), for a `pos explicit` model */
    float guidance_scale;             /* 1 unless --guidance-scale */
    bool set_guidance;
    bool ignore_eos;
    bool no_graphs;         /* --no-graphs: every step eager (engine.h graphs) */
    bool no_prefix_cache;   /* --no-prefix-cache: no KV shared across requests (prefix_cache) */
    bool no_display_prompt; /* text output: the generated text only */
    bool verbose_prompt;    /* the prompts' ids on stderr */
    cli_output output;
    int32_t page_size;
    int32_t threads;
    const char *dtype;
    const char *device;
    int32_t tp;             /* --tp N: tensor-parallel ranks (engine.h tp); 0 = off */
} cli_opts;

static const char *g_prog = "mstar";

static int cli_fail(const char *fmt, ...) MS_PRINTF(1, 2);
static int cli_fail(const char *fmt, ...) {
    /* one line, whatever a prompt file or flag held: control bytes are escaped (\x1b, \n) */
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: ", g_prog);
    /* control bytes only: a backslash stays as is, since messages of the loaders (ms_error)
       arrive with their quoted names already escaped */
    size_t len = n < 0 ? 0 : MS_MIN((size_t)n, sizeof buf - 1);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)buf[i];
        if (c == '\\' || (c >= 0x20 && c != 0x7f))
            fputc(c, stderr);
        else
            ms_cli_write_escaped(stderr, &buf[i], 1);
    }
    fputs(n >= (int)sizeof buf ? "...\n" : "\n", stderr);
    return 1;
}

int ms_cli_stdout_check(const char *prog) {
    int before = errno; /* a failed implicit flush (a full buffer) left its reason here */
    errno = 0;
    int e = fflush(stdout) != 0 ? errno : 0;
    if (e == 0 && !ferror(stdout))
        return 0;
    if (e == 0)
        e = before;
    fprintf(stderr, "%s: cannot write the output to stdout: %s\n", prog,
            e != 0 ? strerror(e) : "a write failed");
    return 1;
}

bool ms_cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (s == NULL || *s == '\0' || isspace((unsigned char)*s))
        return false;
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

void ms_cli_write_escaped(FILE *f, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c == '\r')
            fputs("\\r", f);
        else if (c == '\\')
            fputs("\\\\", f);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\x%02x", c);
        else
            fputc(c, f);
    }
}

void ms_cli_put_escaped(FILE *f, const char *s, size_t max) {
    size_t n = strnlen(s, max);
    ms_cli_write_escaped(f, s, n);
    if (s[n] != '\0')
        fputs("...", f);
}

/* "<prog>: FLAG: 'V' WHAT" on stderr (V escaped, at most 200 bytes); returns 1. */
static int flag_fail(const char *prog, const char *flag, const char *v, const char *fmt, ...)
    MS_PRINTF(4, 5);
static int flag_fail(const char *prog, const char *flag, const char *v, const char *fmt, ...) {
    fprintf(stderr, "%s: %s: '", prog, flag);
    ms_cli_put_escaped(stderr, v, 200);
    fputs("' ", stderr);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return 1;
}

int ms_cli_flag_i64(const char *prog, const char *flag, const char *v, int64_t lo, int64_t hi,
                    const char *expect, int64_t *out) {
    if (ms_cli_parse_i64(v, lo, hi, out))
        return 0;
    /* a plain decimal integer (optional sign, digits only) above hi: say so, not "not an integer" */
    const char *d = v + (*v == '+' || *v == '-');
    bool digits = *d != '\0' && strspn(d, "0123456789") == strlen(d);
    if (digits && *v != '-') {
        errno = 0;
        long long x = strtoll(v, NULL, 10);
        if (errno == ERANGE || x > hi)
            return flag_fail(prog, flag, v, "is too large (at most %lld)", (long long)hi);
    }
    return flag_fail(prog, flag, v, "is not %s", expect);
}

int ms_cli_flag_tp(const char *prog, const char *v, int32_t *out) {
    int64_t n = 0;
    if (ms_cli_flag_i64(prog, "--tp", v, 1, 64, "an integer in [1, 64]", &n) != 0)
        return 1;
    *out = (int32_t)n;
    return 0;
}

int ms_cli_flag_f32(const char *prog, const char *flag, const char *v, double lo, bool lo_open,
                    double hi, const char *expect, float *out) {
    /* plain decimal only: strtod would also take hex floats, inf, nan and leading spaces */
    bool plain = *v != '\0' && strspn(v, "0123456789+-.eE") == strlen(v) &&
                 strpbrk(v, "0123456789") != NULL;
    char *end = NULL;
    errno = 0;
    double x = plain ? strtod(v, &end) : 0.0;
    if (!plain || end == v || *end != '\0')
        return flag_fail(prog, flag, v, "is not %s", expect);
    bool overflow = (errno == ERANGE && fabs(x) > 1.0) || fabs(x) > FLT_MAX;
    if (overflow && x > 0 && hi >= FLT_MAX)
        return flag_fail(prog, flag, v, "is too large (at most %g)", (double)FLT_MAX);
    if (overflow || (lo_open ? !(x > lo) : !(x >= lo)) || !(x <= hi))
        return flag_fail(prog, flag, v, "is not %s", expect);
    *out = (float)x; /* an underflow (1e-400) is its nearest float, 0 or a denormal */
    return 0;
}

static bool parse_u64(const char *s, uint64_t *out) {
    if (s == NULL || *s == '\0' || *s == '-' || isspace((unsigned char)*s))
        return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return false;
    *out = v;
    return true;
}

static void usage(FILE *to) {
    fprintf(to,
            "usage: %s generate --model PATH [--tokenizer PATH|none]\n"
            "           (--prompt TEXT | --prompt-ids 1,2,3 | --prompts-file FILE)\n"
            "           [--max-new-tokens N | --steps N] [--temperature T] [--top-k K]\n"
            "           [--top-p P] [--seed S] [--ignore-eos] [--output text|ids|jsonl]\n"
            "           [--negative-prompt TEXT | --negative-prompt-ids 1,2,3]\n"
            "           [--guidance-scale S] [--position-ids FILE]\n"
            "           [--no-display-prompt] [--verbose-prompt] [--page-size N]\n"
            "           [--device auto|cpu|cuda] [--dtype auto|f32|bf16] [--threads N]\n"
            "           [--no-graphs] [--no-prefix-cache] [--tp N]\n"
            "       %s generate --chat MESSAGE [--system TEXT] --model PATH [...] (one chat turn)\n"
            "       %s chat --model PATH [...]    (%s chat --help)\n"
            "       %s transcribe --model PATH AUDIO... (%s transcribe --help)\n"
            "       %s talker codes --model PATH --prompt-codes FILE (%s talker --help)\n"
            "       %s serve --model PATH [...]   (%s serve --help)\n"
            "       %s bench --model PATH [...]   (%s bench --help)\n"
            "       %s kernels --model PATH [...] (%s kernels --help)\n",
            g_prog, g_prog, g_prog, g_prog, g_prog, g_prog, g_prog, g_prog, g_prog, g_prog, g_prog,
            g_prog, g_prog, g_prog);
}

void ms_cli_print_graphs(const struct ms_engine *e, FILE *to) {
    ms_graph_exec_stats st;
    ms_engine_graph_stats(e, &st);
    if (st.mode == MS_GRAPHS_OFF)
        return;
    /* n_captured counts (bucket, slot) graphs: two slots per bucket with the pre-plan; the
       prefill buckets are (tokens, rows) pairs (graph_exec.h) */
    fprintf(to, "graphs: %d of %d decode + prefill buckets captured (%d decode, %d prefill; %d "
            "slot%s each) in %.2f s%s%s\n",
            (int)(st.n_captured / MS_MAX(st.n_slots, 1)), (int)st.n_buckets,
            (int)(st.n_buckets - st.n_prefill_buckets), (int)st.n_prefill_buckets,
            (int)st.n_slots, st.n_slots == 1 ? "" : "s", st.capture_s,
            st.n_failed > 0 ? "; first failure: " : "", st.first_failure);
}

/* Returns 0 on success, -1 for --help, else the exit status (message printed). */
static int parse_generate(int argc, char **argv, cli_opts *o) {
    memset(o, 0, sizeof *o);
    o->max_new = -1;
    o->steps = -1;
    o->sampling = (ms_sampling_params){1.0f, 0, 1.0f, 0};
    o->device = "auto";
    static const char *const with_value[] = {
        "--model", "--tokenizer", "--prompt", "--prompt-ids", "--prompts-file",
        "--max-new-tokens", "--steps", "--temperature", "--top-k", "--top-p", "--seed",
        "--page-size", "--device", "--threads", "--dtype", "--output",
        "--negative-prompt", "--negative-prompt-ids", "--guidance-scale", "--position-ids",
        "--tp"};
    bool seen[MS_ARRAY_LEN(with_value)] = {false}; /* a second value is an error, not a silent
                                                     replacement of the first */
    o->guidance_scale = 1.0f;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--ignore-eos") == 0) {
            o->ignore_eos = true;
            continue;
        }
        if (strcmp(a, "--no-prefix-cache") == 0) {
            o->no_prefix_cache = true;
            continue;
        }
        if (strcmp(a, "--no-graphs") == 0) {
            o->no_graphs = true;
            continue;
        }
        if (strcmp(a, "--no-display-prompt") == 0) {
            o->no_display_prompt = true;
            continue;
        }
        if (strcmp(a, "--verbose-prompt") == 0) {
            o->verbose_prompt = true;
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
        size_t which = MS_ARRAY_LEN(with_value);
        for (size_t k = 0; k < MS_ARRAY_LEN(with_value); k++)
            if (strcmp(a, with_value[k]) == 0)
                which = k;
        if (which == MS_ARRAY_LEN(with_value)) {
            usage(stderr);
            cli_fail("unknown flag '%s'", a);
            return 2;
        }
        if (seen[which]) {
            usage(stderr);
            cli_fail("flag %s given twice (give each flag once)", a);
            return 2;
        }
        seen[which] = true;
        if (i + 1 >= argc) {
            usage(stderr);
            cli_fail("flag %s needs a value", a);
            return 2;
        }
        const char *v = argv[++i];
        int64_t n;
        if (strcmp(a, "--model") == 0) {
            if (*v == '\0')
                return cli_fail("--model: the path is empty");
            o->model = v;
        } else if (strcmp(a, "--tokenizer") == 0) {
            if (*v == '\0')
                return cli_fail("--tokenizer: the path is empty (give a path or 'none')");
            o->tokenizer = v;
        } else if (strcmp(a, "--prompt") == 0) {
            o->prompt = v;
        } else if (strcmp(a, "--prompt-ids") == 0) {
            o->prompt_ids = v;
        } else if (strcmp(a, "--prompts-file") == 0) {
            o->prompts_file = v;
        } else if (strcmp(a, "--max-new-tokens") == 0) {
            if (ms_cli_flag_i64(g_prog, a, v, 0, INT32_MAX, "an integer >= 0", &n) != 0)
                return 1;
            o->max_new = (int32_t)n;
        } else if (strcmp(a, "--steps") == 0) {
            if (ms_cli_flag_i64(g_prog, a, v, 1, INT32_MAX, "an integer >= 1", &n) != 0)
                return 1;
            o->steps = (int32_t)n;
        } else if (strcmp(a, "--temperature") == 0) {
            if (ms_cli_flag_f32(g_prog, a, v, 0.0, false, FLT_MAX, "a number >= 0",
                                &o->sampling.temperature) != 0)
                return 1;
            o->set_temperature = true;
        } else if (strcmp(a, "--top-k") == 0) {
            if (ms_cli_flag_i64(g_prog, a, v, 0, INT32_MAX, "an integer >= 0 (0 disables it)",
                                &n) != 0)
                return 1;
            o->sampling.top_k = (int32_t)n;
            o->set_top_k = true;
        } else if (strcmp(a, "--top-p") == 0) {
            if (ms_cli_flag_f32(g_prog, a, v, 0.0, true, 1.0, "a number in (0, 1]",
                                &o->sampling.top_p) != 0)
                return 1;
            o->set_top_p = true;
        } else if (strcmp(a, "--negative-prompt") == 0) {
            o->negative_prompt = v;
        } else if (strcmp(a, "--negative-prompt-ids") == 0) {
            o->negative_prompt_ids = v;
        } else if (strcmp(a, "--position-ids") == 0) {
            if (*v == '\0')
                return cli_fail("--position-ids: the path is empty");
            o->position_ids = v;
        } else if (strcmp(a, "--guidance-scale") == 0) {
            if (ms_cli_flag_f32(g_prog, a, v, -FLT_MAX, false, FLT_MAX, "a number",
                                &o->guidance_scale) != 0)
                return 1;
            o->set_guidance = true;
        } else if (strcmp(a, "--seed") == 0) {
            if (!parse_u64(v, &o->sampling.seed))
                return *v != '\0' && strspn(v, "0123456789") == strlen(v)
                           ? flag_fail(g_prog, a, v, "is too large (at most %llu)",
                                       (unsigned long long)UINT64_MAX)
                           : flag_fail(g_prog, a, v, "is not an unsigned integer");
        } else if (strcmp(a, "--page-size") == 0) {
            if (ms_cli_flag_i64(g_prog, a, v, 1, 65536, "an integer in [1, 65536]", &n) != 0)
                return 1;
            o->page_size = (int32_t)n;
        } else if (strcmp(a, "--threads") == 0) {
            char expect[48];
            snprintf(expect, sizeof expect, "an integer in [1, %d]", MS_THREADPOOL_MAX_THREADS);
            if (ms_cli_flag_i64(g_prog, a, v, 1, MS_THREADPOOL_MAX_THREADS, expect, &n) != 0)
                return 1;
            o->threads = (int32_t)n;
        } else if (strcmp(a, "--device") == 0) {
            if (strcmp(v, "auto") != 0 && strcmp(v, "cpu") != 0 && strcmp(v, "cuda") != 0)
                return cli_fail("--device: '%s' is not auto, cpu or cuda", v);
            o->device = v;
        } else if (strcmp(a, "--dtype") == 0) {
            if (strcmp(v, "auto") != 0 && strcmp(v, "f32") != 0 && strcmp(v, "bf16") != 0)
                return cli_fail("--dtype: '%s' is not auto, f32 or bf16", v);
            o->dtype = v;
        } else if (strcmp(a, "--tp") == 0) {
            if (ms_cli_flag_tp(g_prog, v, &o->tp) != 0)
                return 1;
        } else if (strcmp(a, "--output") == 0) {
            if (strcmp(v, "text") == 0)
                o->output = CLI_OUT_TEXT;
            else if (strcmp(v, "ids") == 0)
                o->output = CLI_OUT_IDS;
            else if (strcmp(v, "jsonl") == 0)
                o->output = CLI_OUT_JSONL;
            else
                return cli_fail("--output: '%s' is not text, ids or jsonl", v);
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
    if (o->negative_prompt != NULL && o->negative_prompt_ids != NULL) {
        usage(stderr);
        cli_fail("give --negative-prompt or --negative-prompt-ids, not both");
        return 2;
    }
    if (o->set_guidance && o->negative_prompt == NULL && o->negative_prompt_ids == NULL) {
        usage(stderr);
        cli_fail("--guidance-scale needs --negative-prompt or --negative-prompt-ids");
        return 2;
    }
    if (o->position_ids != NULL && o->prompts_file != NULL) {
        usage(stderr);
        cli_fail("--position-ids describes one prompt: use --prompt or --prompt-ids with it");
        return 2;
    }
    if (o->max_new >= 0 && o->steps >= 0) {
        usage(stderr);
        cli_fail("give --max-new-tokens or --steps, not both");
        return 2;
    }
    return 0;
}

/* ---- tokenizer ---- */

/* The tokenizer in use (cli.h ms_cli_tok): at most one of l2c / hf. */
typedef ms_cli_tok cli_tok;

static void tok_free(cli_tok *t) {
    ms_llama2c_tok_free(t->l2c);
    ms_tok_hf_free(t->hf);
    ms_free(t->path);
    memset(t, 0, sizeof *t);
}

static bool tok_any(const cli_tok *t) { return t->l2c != NULL || t->hf != NULL; }

/* tokenizer_config.json beside `path`: add_bos_token / add_eos_token when they are booleans (the
 * file's syntax was checked by ms_tok_hf_init). */
static void tok_read_config(cli_tok *t) {
    t->add_bos = t->add_eos = -1;
    const char *slash = strrchr(t->path, '/');
    char *cfg = slash == NULL ? ms_strdup("tokenizer_config.json")
                              : ms_asprintf("%.*s/tokenizer_config.json",
                                            (int)(slash - t->path), t->path);
    if (cfg == NULL)
        return;
    json_t *root = json_load_file(cfg, 0, NULL);
    ms_free(cfg);
    if (root == NULL)
        return;
    json_t *b = json_object_get(root, "add_bos_token"), *e = json_object_get(root, "add_eos_token");
    if (json_is_boolean(b))
        t->add_bos = json_is_true(b) ? 1 : 0;
    if (json_is_boolean(e))
        t->add_eos = json_is_true(e) ? 1 : 0;
    json_decref(root);
}

/*
 * Choose and load the tokenizer (see cli.h): `given` is --tokenizer's value (NULL when absent),
 * `model_dir` the checkpoint folder (NULL for a llama2.c file); then check it against the model's
 * vocabulary. No tokenizer leaves *t empty. Returns 0 or the exit status (message printed).
 */
static bool ends_with_gguf(const char *p) {
    size_t n = p != NULL ? strlen(p) : 0;
    return n >= 5 && strcmp(p + n - 5, ".gguf") == 0;
}

static int tok_init(cli_tok *t, const char *given, const char *model_dir, const char *model_path,
                    int32_t vocab) {
    memset(t, 0, sizeof *t);
    struct stat st;
    if (given != NULL && strcmp(given, "none") == 0)
        return 0;
    /* a GGUF's own tokenizer (tokenizer.ggml.*): --tokenizer FILE.gguf, or the model when it is
       a .gguf and no --tokenizer is given */
    const char *gguf = ends_with_gguf(given) ? given
                       : given == NULL && model_dir == NULL && ends_with_gguf(model_path)
                           ? model_path
                           : NULL;
    if (gguf != NULL) {
        ms_error err = {0};
        ms_status gs = ms_gguf_tokenizer_load(gguf, &t->hf, &err);
        if (gs == MS_ERR_NOT_FOUND && given == NULL)
            return 0; /* a GGUF without a tokenizer runs on token ids, like a folder without one */
        if (gs != MS_OK)
            return cli_fail("%s", err.msg);
        t->path = ms_strdup(gguf);
        t->add_bos = t->add_eos = -1; /* the vocabulary's add_bos_token / add_eos_token apply */
        if (t->path == NULL)
            return cli_fail("out of memory");
        int32_t n = ms_tok_hf_vocab_size(t->hf);
        if (n > vocab)
            return cli_fail("%s: the tokenizer's ids go up to %d, beyond the model's vocabulary "
                            "of %d ids: this tokenizer is not the model's",
                            gguf, (int)n - 1, (int)vocab);
        return 0;
    }
    if (given != NULL) {
        if (stat(given, &st) != 0)
            return cli_fail("--tokenizer: %s: cannot open the tokenizer (%s)", given,
                            errno == ENOENT ? "no such file or folder" : strerror(errno));
        t->path = S_ISDIR(st.st_mode) ? ms_asprintf("%s/tokenizer.json", given) : ms_strdup(given);
        if (t->path == NULL)
            return cli_fail("out of memory");
        if (S_ISDIR(st.st_mode) && stat(t->path, &st) != 0)
            return cli_fail("--tokenizer: %s: the folder has no tokenizer.json", given);
        if (!S_ISREG(st.st_mode))
            return cli_fail("--tokenizer: %s: not a tokenizer: %s (expected a tokenizer.json or "
                            "a llama2.c tokenizer .bin)",
                            t->path, ms_model_probe_file_kind(st.st_mode));
    } else {
        if (model_dir == NULL)
            return 0;
        t->path = ms_asprintf("%s/tokenizer.json", model_dir);
        if (t->path == NULL)
            return cli_fail("out of memory");
        if (stat(t->path, &st) != 0) {
            ms_free(t->path);
            t->path = NULL;
            return 0;
        }
    }
    /* the kind by content: a JSON object (after an optional UTF-8 BOM and white space) */
    FILE *f = fopen(t->path, "rb");
    if (f == NULL)
        return cli_fail("%s: cannot open the tokenizer (%s)", t->path, strerror(errno));
    unsigned char head[64];
    size_t got = fread(head, 1, sizeof head, f);
    fclose(f);
    size_t i = got >= 3 && memcmp(head, "\xEF\xBB\xBF", 3) == 0 ? 3 : 0;
    while (i < got && (head[i] == ' ' || head[i] == '\t' || head[i] == '\n' || head[i] == '\r'))
        i++;
    if (got == 0)
        return cli_fail("%s: the tokenizer file is empty (expected a tokenizer.json or a llama2.c "
                        "tokenizer .bin)",
                        t->path);
    bool is_json = i < got && head[i] == '{';
    ms_error err = {0};
    /* the checkpoint's own tokenizer.json was not asked for: say how to run without it */
    const char *hint = given == NULL ? " (the checkpoint folder's tokenizer.json; --tokenizer none "
                                       "runs on token ids without it)"
                                     : "";
    if (is_json) {
        if (ms_tok_hf_init(&t->hf, t->path, &err) != MS_OK)
            return cli_fail("%s%s", err.msg, hint);
        tok_read_config(t);
        int32_t n = ms_tok_hf_vocab_size(t->hf);
        if (n > vocab)
            return cli_fail("%s: the tokenizer's ids go up to %d, beyond the model's vocabulary "
                            "of %d ids: this tokenizer is not the model's%s",
                            t->path, (int)n - 1, (int)vocab, hint);
    } else {
        /* vocab 0: as many tokens as the file holds, so that a size mismatch is named below */
        if (ms_llama2c_tok_init(&t->l2c, t->path, 0, &err) != MS_OK)
            return cli_fail("%s", err.msg);
        int n = ms_llama2c_tok_vocab_size(t->l2c);
        if (n != vocab)
            return cli_fail("%s: the tokenizer has %d tokens, the model's vocabulary is %d",
                            t->path, n, (int)vocab);
    }
    return 0;
}

/* Encode NUL-terminated `text` into a fresh array (BOS / special tokens as cli.h says). */
static int tok_encode(const cli_tok *t, const char *text, const char *where, int32_t **ids,
                      size_t *n) {
    ms_error err = {0};
    *ids = NULL;
    *n = 0;
    if (t->l2c != NULL) {
        if (ms_llama2c_tok_encode(t->l2c, text, true, false, ids, n, &err) != MS_OK)
            return cli_fail("%s: %s", where, err.msg);
        return 0;
    }
    if (ms_tok_hf_encode(t->hf, text, strlen(text), t->add_bos != 0, ids, n, &err) != MS_OK)
        return cli_fail("%s: %s", where, err.msg);
    int32_t bos = ms_tok_hf_bos_id(t->hf), eos = ms_tok_hf_eos_id(t->hf);
    bool want_bos = t->add_bos == 1 && bos >= 0 && (*n == 0 || (*ids)[0] != bos);
    bool want_eos = t->add_eos == 1 && eos >= 0 && (*n == 0 || (*ids)[*n - 1] != eos);
    if (want_bos || want_eos) {
        size_t m = *n + (want_bos ? 1 : 0) + (want_eos ? 1 : 0);
        int32_t *v = ms_malloc(m * sizeof *v);
        if (v == NULL)
            return cli_fail("out of memory");
        size_t k = 0;
        if (want_bos)
            v[k++] = bos;
        for (size_t i = 0; i < *n; i++)
            v[k++] = (*ids)[i];
        if (want_eos)
            v[k++] = eos;
        ms_free(*ids);
        *ids = v;
        *n = m;
    }
    if (*n == 0)
        return cli_fail("%s: the text encodes to no tokens", where);
    return 0;
}

/* The tokenizer for the other verbs (serve): cli.h. */
int ms_cli_tok_init(ms_cli_tok *t, const char *given, const char *model_dir,
                    const char *model_path, int32_t vocab) {
    return tok_init(t, given, model_dir, model_path, vocab);
}

int ms_cli_tok_encode(const ms_cli_tok *t, const char *text, const char *where, int32_t **ids,
                      size_t *n) {
    return tok_encode(t, text, where, ids, n);
}

void ms_cli_tok_free(ms_cli_tok *t) { tok_free(t); }

/* ---- prompts ---- */

typedef struct cli_prompt {
    int32_t *ids;
    size_t n;
    char *where; /* where it came from: "--prompt", "--prompt-ids" or "FILE:LINE" */
} cli_prompt;

typedef struct cli_prompts {
    cli_prompt *v;
    size_t n, cap;
} cli_prompts;

static void prompts_free(cli_prompts *p) {
    for (size_t i = 0; i < p->n; i++) {
        ms_free(p->v[i].ids);
        ms_free(p->v[i].where);
    }
    ms_free(p->v);
    memset(p, 0, sizeof *p);
}

/* Add one prompt: text through the tokenizer, or an id list when tok is NULL. */
static int add_prompt(cli_prompts *ps, const char *text, const char *where, const cli_tok *tok) {
    if (ms_grow((void **)&ps->v, &ps->cap, ps->n + 1, sizeof *ps->v) != MS_OK)
        return cli_fail("out of memory");
    cli_prompt *p = &ps->v[ps->n];
    if (tok != NULL) {
        int rc = tok_encode(tok, text, where, &p->ids, &p->n);
        if (rc != 0) {
            ms_free(p->ids);
            p->ids = NULL;
            return rc;
        }
    } else {
        ms_error err = {0};
        if (ms_cli_parse_ids(text, &p->ids, &p->n, &err) != MS_OK)
            return cli_fail("%s: %s", where, err.msg);
    }
    p->where = ms_strdup(where);
    if (p->where == NULL) {
        ms_free(p->ids);
        p->ids = NULL;
        return cli_fail("out of memory");
    }
    ps->n++;
    return 0;
}

static int read_prompts_file(const char *path, const cli_tok *tok, cli_prompts *ps) {
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return cli_fail("--prompts-file: %s: a folder, not a prompts file (one prompt per line)",
                        path);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return cli_fail("--prompts-file: %s: cannot open the prompts file: %s", path,
                        strerror(errno));
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
        if (strlen(line) != (size_t)len) {
            rc = cli_fail("%s:%d: the line holds a NUL byte", path, lineno);
            break;
        }
        char where[600];
        snprintf(where, sizeof where, "%s:%d", path, lineno);
        rc = add_prompt(ps, line, where, tok);
    }
    free(line); /* from getline (libc), not ms_malloc */
    if (rc == 0 && ferror(f))
        rc = cli_fail("--prompts-file: %s: cannot read the prompts file: %s", path,
                      strerror(errno));
    fclose(f);
    if (rc == 0 && ps->n == 0)
        rc = cli_fail("%s: no prompts (the file has no non-empty line)", path);
    return rc;
}

/* ---- output ---- */

/*
 * The output of one prompt, printed as it grows (streaming) or at the end. Three forms:
 *   - one prompt, text: the text exactly as decoded (run.c's output for llama2.c), streamed;
 *   - several prompts, text: "[k] " then the text with newlines, carriage returns, backslashes
 *     and other control bytes escaped (\n, \r, \\, \t, \xHH), so one line is one prompt;
 *   - ids: the ids, "[k]" first when there are several prompts;
 *   - jsonl (capture set): the text is collected for one JSON object per prompt.
 */
typedef struct cli_printer {
    const cli_tok *tok;     /* NULL: ids */
    bool several;           /* "[k]" prefixes and, for text, escaped control bytes */
    bool capture;           /* jsonl: text into buf, nothing printed */
    int32_t printed;        /* output ids printed so far */
    int prev;               /* llama2.c: the previous token (run.c's decode needs it) */
    ms_cli_utf8 utf8;       /* tokenizer.json: bytes of a split character held back */
    char *buf;              /* capture: the text so far (ms_malloc'd) */
    size_t n_buf, cap_buf;  /* its length and capacity, bytes */
    bool oom;               /* capture: an append failed */
} cli_printer;

/* Text bytes of the output: to the capture buffer, escaped (several prompts), or as they are. */
static void pr_out(cli_printer *pr, const char *s, size_t n) {
    if (pr->capture) {
        if (ms_grow((void **)&pr->buf, &pr->cap_buf, pr->n_buf + n + 1, 1) != MS_OK) {
            pr->oom = true;
            return;
        }
        memcpy(pr->buf + pr->n_buf, s, n);
        pr->n_buf += n;
        pr->buf[pr->n_buf] = '\0';
    } else if (pr->several) {
        ms_cli_write_escaped(stdout, s, n);
    } else {
        fwrite(s, 1, n, stdout);
    }
}

static void hf_put(cli_printer *pr, int32_t id) {
    if (ms_tok_hf_is_special(pr->tok->hf, id))
        return;
    size_t len;
    const char *b = ms_tok_hf_token_bytes(pr->tok->hf, id, &len);
    while (b != NULL && len > 0) { /* in slices: the output buffer stays on the stack */
        char out[MS_CLI_UTF8_OUT_MAX(64)];
        size_t take = MS_MIN(len, (size_t)64);
        size_t w = ms_cli_utf8_push(&pr->utf8, b, take, out);
        pr_out(pr, out, w);
        b += take;
        len -= take;
    }
}

/* Start prompt k (1-based) of `prompt`: the "[k]" prefix and the echoed prompt text. */
static void printer_begin(cli_printer *pr, size_t k, const cli_prompt *prompt, bool echo) {
    pr->printed = 0;
    pr->prev = -1;
    pr->n_buf = 0;
    memset(&pr->utf8, 0, sizeof pr->utf8);
    if (pr->capture)
        echo = false; /* jsonl: "text" is the generated text only */
    else if (pr->several)
        printf(pr->tok == NULL ? "[%zu]" : "[%zu] ", k);
    if (pr->tok == NULL)
        return;
    if (pr->tok->l2c != NULL) {
        /* run.c prints every piece after BOS, non-printable single bytes skipped */
        for (size_t i = 0; i < prompt->n; i++) {
            int t = prompt->ids[i];
            if (echo && !(i == 0 && t == MS_LLAMA2C_TOK_BOS)) {
                const char *piece = ms_llama2c_tok_decode(pr->tok->l2c, pr->prev, t);
                if (ms_llama2c_tok_piece_printable(piece))
                    pr_out(pr, piece, strlen(piece));
            }
            pr->prev = t;
        }
    } else if (echo) {
        for (size_t i = 0; i < prompt->n; i++)
            hf_put(pr, prompt->ids[i]);
    }
}

/* Print out[pr->printed .. upto). */
static void printer_feed(cli_printer *pr, const int32_t *out, int32_t upto) {
    for (int32_t k = pr->printed; k < upto; k++) {
        int t = out[k];
        if (pr->tok == NULL) {
            if (!pr->capture)
                printf("%s%d", (k > 0 || pr->several) ? " " : "", t);
        } else if (pr->tok->l2c != NULL) {
            const char *piece = ms_llama2c_tok_decode(pr->tok->l2c, pr->prev, t);
            if (ms_llama2c_tok_piece_printable(piece))
                pr_out(pr, piece, strlen(piece));
            pr->prev = t;
        } else {
            hf_put(pr, t);
        }
    }
    pr->printed = MS_MAX(pr->printed, upto);
}

static void printer_end(cli_printer *pr) {
    char out[3];
    size_t w = ms_cli_utf8_flush(&pr->utf8, out);
    pr_out(pr, out, w);
    if (!pr->capture)
        fputc('\n', stdout);
}

/* Why a request finished with MS_FINISH_ERROR, after n_out tokens (a static buffer). */
static const char *nan_reason(int32_t n_out) {
    static char buf[128];
    snprintf(buf, sizeof buf,
             "generation failed after %d new tokens: the model's logits hold NaN", (int)n_out);
    return buf;
}

/* jsonl: one object for prompt k on one line: {"index", "source", "text" (with a tokenizer),
 * "ids", "finish_reason"}. The text is made valid UTF-8 first (a llama2.c piece may not be). */
static int print_jsonl(cli_printer *pr, size_t k, const char *source, const int32_t *ids,
                       int32_t n_ids, ms_finish_reason why) {
    json_t *o = json_object(), *arr = json_array();
    bool bad = o == NULL || arr == NULL || pr->oom;
    bad = bad || json_object_set_new(o, "index", json_integer((json_int_t)k)) != 0;
    bad = bad || json_object_set_new(o, "source", json_string(source)) != 0;
    if (!bad && pr->tok != NULL) {
        ms_cli_utf8 u = {0};
        char *t = ms_malloc(MS_CLI_UTF8_OUT_MAX(pr->n_buf) + 3);
        bad = t == NULL;
        if (!bad) {
            size_t w = ms_cli_utf8_push(&u, pr->buf != NULL ? pr->buf : "", pr->n_buf, t);
            w += ms_cli_utf8_flush(&u, t + w);
            bad = json_object_set_new(o, "text", json_stringn(t, w)) != 0;
        }
        ms_free(t);
    }
    for (int32_t i = 0; !bad && i < n_ids; i++)
        bad = json_array_append_new(arr, json_integer(ids[i])) != 0;
    bad = bad || json_object_set(o, "ids", arr) != 0;
    bad = bad || json_object_set_new(o, "finish_reason", json_string(ms_finish_reason_str(why)));
    if (why == MS_FINISH_ERROR)
        bad = bad || json_object_set_new(o, "error", json_string(nan_reason(n_ids))) != 0;
    char *line = bad ? NULL : json_dumps(o, JSON_COMPACT);
    json_decref(arr);
    json_decref(o);
    if (line == NULL)
        return cli_fail("out of memory for the JSON output of prompt %zu", k);
    fputs(line, stdout);
    fputc('\n', stdout);
    free(line); /* jansson's allocator: malloc */
    return 0;
}

/* Output ids to print: as text, all but a final eos id; as ids, all (the eos id included, as the
 * engine keeps it). */
static int32_t printable(const cli_printer *pr, int32_t n_out, ms_finish_reason why) {
    return n_out - (pr->tok != NULL && why == MS_FINISH_EOS && n_out > 0 ? 1 : 0);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- generate ---- */

static int cmd_generate(int argc, char **argv, const ms_model_desc *desc) {
    /* generate --chat MESSAGE: one chat turn (cli_chat.c); a flag's value is not a flag */
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--chat") == 0)
            return ms_cli_chat(argc, argv, desc, g_prog, true);
        bool boolean = strcmp(argv[i], "--ignore-eos") == 0 ||
                       strcmp(argv[i], "--no-display-prompt") == 0 ||
                       strcmp(argv[i], "--verbose-prompt") == 0;
        if (strncmp(argv[i], "--", 2) == 0 && !boolean)
            i++;
    }
    cli_opts o;
    int rc = parse_generate(argc, argv, &o);
    if (rc != 0)
        return rc < 0 ? ms_cli_stdout_check(g_prog) : rc;

    ms_error err = {0};
    cli_tok tok = {0};
    ms_engine *eng = NULL;
    cli_prompts ps = {0}, neg = {0};
    ms_position_ids pids = {0};
    ms_rid *rids = NULL;
    char *model_dir = NULL;
    cli_printer pr = {0}; /* before any goto done: done frees its capture buffer */

    /* the model's facts first (config only): the tokenizer is checked against the vocabulary */
    ms_md_facts fa;
    if (ms_cli_model_probe(desc, o.model, &fa, NULL, &model_dir, &err) != MS_OK) {
        rc = cli_fail("%s", err.msg);
        goto done;
    }
    if ((rc = tok_init(&tok, o.tokenizer, model_dir, o.model, fa.vocab)) != 0)
        goto done;
    /* the model's declared sampler settings are the defaults of the flags not given */
    if (!o.set_temperature)
        o.sampling.temperature = fa.temperature;
    if (!o.set_top_k)
        o.sampling.top_k = fa.top_k;
    if (!o.set_top_p)
        o.sampling.top_p = fa.top_p;
    if (o.negative_prompt != NULL && !tok_any(&tok)) {
        rc = cli_fail("--negative-prompt needs a tokenizer; give --negative-prompt-ids instead");
        goto done;
    }
    if (o.prompt != NULL && !tok_any(&tok)) {
        if (o.tokenizer != NULL) /* "none" */
            rc = cli_fail("--prompt needs a tokenizer (--tokenizer none was given); give token "
                          "ids with --prompt-ids instead");
        else
            rc = cli_fail("--prompt needs a tokenizer: %s has no tokenizer.json; give "
                          "--tokenizer PATH (tokenizer.json or a llama2.c tokenizer .bin) or "
                          "token ids with --prompt-ids",
                          o.model);
        goto done;
    }
    if (o.output == CLI_OUT_TEXT && !tok_any(&tok)) {
        rc = cli_fail("--output text needs a tokenizer: %s has no tokenizer.json; give "
                      "--tokenizer PATH",
                      o.model);
        goto done;
    }
    bool jsonl = o.output == CLI_OUT_JSONL;
    bool text_out = tok_any(&tok) && o.output != CLI_OUT_IDS;
    /* --prompt-ids are always ids; prompts-file lines are text when a tokenizer is in use */
    if (o.prompt != NULL)
        rc = add_prompt(&ps, o.prompt, "--prompt", &tok);
    else if (o.prompt_ids != NULL)
        rc = add_prompt(&ps, o.prompt_ids, "--prompt-ids", NULL);
    else
        rc = read_prompts_file(o.prompts_file, tok_any(&tok) ? &tok : NULL, &ps);
    if (rc != 0)
        goto done;
    /* batched CFG: one negative prompt guides every prompt (each pair is one request) */
    if (o.negative_prompt != NULL)
        rc = add_prompt(&neg, o.negative_prompt, "--negative-prompt", &tok);
    else if (o.negative_prompt_ids != NULL)
        rc = add_prompt(&neg, o.negative_prompt_ids, "--negative-prompt-ids", NULL);
    if (rc != 0)
        goto done;
    const bool guided = neg.n > 0;
    const size_t n_neg = guided ? neg.v[0].n : 0;
    /* explicit position ids of the one prompt (checked against its length here, against the
       model's position axes when the request is added) */
    if (o.position_ids != NULL) {
        if (ms_position_ids_init(&pids, o.position_ids, (int32_t)ps.v[0].n, &err) != MS_OK) {
            rc = cli_fail("--position-ids: %s", err.msg);
            goto done;
        }
    }

    size_t total = 0;
    for (size_t i = 0; i < ps.n; i++) {
        total += ps.v[i].n;
        if (o.verbose_prompt) {
            fprintf(stderr, "%s: prompt %zu: %zu tokens:", g_prog, i + 1, ps.v[i].n);
            for (size_t k = 0; k < ps.v[i].n; k++)
                fprintf(stderr, " %d", (int)ps.v[i].ids[k]);
            fputc('\n', stderr);
        }
        /* run.c's -n counts positions from the first prompt token: a prompt as long as --steps
         * leaves nothing to generate (a longer-than-context prompt is the engine's error) */
        if (o.steps >= 0 && ps.v[i].n <= (size_t)fa.max_context && ps.v[i].n > (size_t)o.steps) {
            char which[48] = "the prompt";
            if (ps.n > 1)
                snprintf(which, sizeof which, "prompt %zu", i + 1);
            rc = cli_fail("--steps %d counts positions including the prompt (as llama2.c's -n), "
                          "and %s has %zu tokens, which leaves none to generate: give --steps "
                          "%zu or more, or --max-new-tokens N to count new tokens only",
                          (int)o.steps, which, ps.v[i].n, ps.v[i].n);
            goto done;
        }
    }
    /* worst-case sizes from the prompts: a batch of up to 64 rows, a prefill budget of up to
     * 1024 tokens per step (longer prompts are prefilled in chunks), KV pages for the longest
     * sequence a request can reach (prompt + new tokens, capped at the context by the engine) */
    ms_engine_options eo = ms_engine_options_default();
    eo.model_path = o.model;
    eo.device = o.device;
    eo.page_size = o.page_size;
    eo.n_threads = o.threads;
    eo.dtype = o.dtype;
    eo.graphs = o.no_graphs ? MS_GRAPHS_OFF : MS_GRAPHS_AUTO;
    eo.prefix_cache = !o.no_prefix_cache; /* on by default, as vLLM and SGLang serve */
    eo.tp = o.tp; /* [tp] */
    /* a guided pair takes two of max_seqs (two streams) and prefills both prompts in one step */
    const int32_t per_req = guided ? 2 : 1;
    eo.max_seqs = (int32_t)MS_MIN(ps.n, (size_t)64) * per_req;
    eo.max_tokens = (int32_t)MS_MAX(MS_MIN(total + ps.n * n_neg, (size_t)1024),
                                    (size_t)eo.max_seqs);
    int64_t longest = 0;
    for (size_t i = 0; i < ps.n; i++) {
        int64_t new_tokens = o.steps >= 0 ? (int64_t)o.steps + 1
                                          : (o.max_new >= 0 ? o.max_new : CLI_DEFAULT_NEW);
        longest = MS_MAX(longest, (int64_t)MS_MAX(ps.v[i].n, n_neg) + new_tokens);
        if (guided)
            eo.max_tokens = (int32_t)MS_MAX((size_t)eo.max_tokens,
                                            MS_MIN(ps.v[i].n + n_neg, (size_t)INT32_MAX));
    }
    eo.max_seq_len = (int32_t)MS_MIN(longest, (int64_t)INT32_MAX);
    if (ms_engine_init(&eng, desc, &eo, &err) != MS_OK) {
        rc = cli_fail("%s", err.msg);
        goto done;
    }
    ms_cli_print_graphs(eng, stderr);
    const ms_md_facts *efa = ms_engine_facts(eng);

    rids = ms_calloc(ps.n, sizeof *rids);
    if (rids == NULL) {
        rc = cli_fail("out of memory");
        goto done;
    }
    /* one prompt streams its output step by step; several print in order at the end, one line
     * each ("[k] ", text escaped); jsonl: one object per prompt at the end */
    bool stream = ps.n == 1 && !jsonl;
    pr.tok = text_out ? &tok : NULL;
    pr.several = ps.n > 1 && !jsonl;
    pr.capture = jsonl;
    bool echo = !o.no_display_prompt;
    size_t next = 0, n_gen = 0;
    double t0 = now_s(), t_first = 0.0;
    bool first_done = false;
    for (;;) {
        /* continuous batching: requests join at step boundaries */
        while (next < ps.n && ms_engine_n_active(eng) * per_req < eo.max_seqs) {
            ms_engine_request rq = {
                .prompt = ps.v[next].ids,
                .n_prompt = (int32_t)ps.v[next].n,
                .sampling = o.sampling,
                .ignore_eos = o.ignore_eos,
                .negative_prompt = guided ? neg.v[0].ids : NULL,
                .n_negative_prompt = (int32_t)n_neg,
                .guidance_scale = o.guidance_scale,
                .position_ids = pids.ids,
                .n_position_axes = pids.n_axes,
            };
            if (o.steps >= 0) {
                int32_t steps = MS_MIN(o.steps, efa->max_context);
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
            if (stream) {
                printer_begin(&pr, next + 1, &ps.v[next], echo);
                if (fflush(stdout) != 0 || ferror(stdout)) {
                    rc = ms_cli_stdout_check(g_prog);
                    goto done;
                }
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
        if (stream) {
            const int32_t *out;
            int32_t n_out;
            ms_finish_reason why;
            MS_ASSERT(ms_engine_output(eng, rids[0], &out, &n_out, &why) == MS_OK);
            printer_feed(&pr, out, printable(&pr, n_out, why));
            if (fflush(stdout) != 0 || ferror(stdout)) { /* nothing left to write to: stop */
                rc = ms_cli_stdout_check(g_prog);
                goto done;
            }
        }
    }
    double t1 = now_s();

    for (size_t i = 0; i < ps.n; i++) {
        const int32_t *out;
        int32_t n_out;
        ms_finish_reason why;
        MS_ASSERT(ms_engine_output(eng, rids[i], &out, &n_out, &why) == MS_OK);
        n_gen += (size_t)n_out;
        if (!stream)
            printer_begin(&pr, i + 1, &ps.v[i], echo);
        printer_feed(&pr, out, printable(&pr, n_out, why));
        printer_end(&pr);
        if (jsonl && (rc = print_jsonl(&pr, i + 1, ps.v[i].where, out, n_out, why)) != 0)
            goto done;
    }
    if ((rc = ms_cli_stdout_check(g_prog)) != 0)
        goto done;
    /* notes after stdout is complete, so that with 2>&1 they follow the text's final newline */
    for (size_t i = 0; i < ps.n; i++) {
        const int32_t *out;
        int32_t n_out;
        ms_finish_reason why;
        MS_ASSERT(ms_engine_output(eng, rids[i], &out, &n_out, &why) == MS_OK);
        if (why == MS_FINISH_CONTEXT)
            fprintf(stderr,
                    "%s: note: prompt %zu stopped after %d new tokens: the sequence reached the "
                    "model's context (%d tokens)\n",
                    g_prog, i + 1, (int)n_out, (int)efa->max_context);
    }
    double secs = t1 - t0;
    double dec_secs = t1 - t_first;
    fprintf(stderr,
            "%s: %zu prompt(s), %zu prompt tokens, %zu new tokens in %.3f s: %.1f tokens/s "
            "(first step %.1f ms, decode %.1f tokens/s) on %s, page size %d\n",
            g_prog, ps.n, total, n_gen, secs, secs > 0 ? (double)n_gen / secs : 0.0,
            first_done ? 1e3 * (t_first - t0) : 0.0,
            dec_secs > 0 && n_gen > ps.n ? (double)(n_gen - ps.n) / dec_secs : 0.0,
            ms_engine_device(eng), (int)ms_engine_page_size(eng));
    if (ms_engine_tp_world(eng) > 1) /* [tp] */
        fprintf(stderr, "%s: tensor parallel over %d ranks, %zu weight bytes per rank (rank 0)\n",
                g_prog, (int)ms_engine_tp_world(eng), ms_engine_weight_bytes(eng));
    /* a request whose logits went NaN failed alone: its line is what it made before, the others
     * are complete; name it by its number and where it came from, exit 1 */
    for (size_t i = 0; i < ps.n; i++) {
        const int32_t *out;
        int32_t n_out;
        ms_finish_reason why;
        MS_ASSERT(ms_engine_output(eng, rids[i], &out, &n_out, &why) == MS_OK);
        if (why != MS_FINISH_ERROR)
            continue;
        fprintf(stderr, "%s: prompt %zu (", g_prog, i + 1);
        ms_cli_put_escaped(stderr, ps.v[i].where, 300);
        fprintf(stderr, "): %s%s\n", nan_reason(n_out),
                ps.n > 1 ? "; the output of the other prompts is complete" : "");
        rc = 1;
    }

done:
    ms_position_ids_free(&pids);
    ms_free(pr.buf);
    ms_free(rids);
    prompts_free(&ps);
    prompts_free(&neg);
    ms_engine_free(eng);
    tok_free(&tok);
    ms_free(model_dir);
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
    if (strcmp(argv[1], "serve") == 0)
        return ms_cli_serve(argc - 2, argv + 2, desc, g_prog);
    if (strcmp(argv[1], "chat") == 0)
        return ms_cli_chat(argc - 2, argv + 2, desc, g_prog, false);
    if (strcmp(argv[1], "transcribe") == 0)
        return ms_cli_transcribe(argc - 2, argv + 2, desc, g_prog);
    if (strcmp(argv[1], "talker") == 0)
        return ms_cli_talker(argc - 2, argv + 2, desc, g_prog);
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(stdout);
        return ms_cli_stdout_check(g_prog);
    }
    usage(stderr);
    fprintf(stderr, "%s: unknown verb '%s' (this binary serves: generate, chat, transcribe, talker, serve, bench, kernels)\n",
            g_prog, argv[1]);
    return 2;
}
