/*
 * cli_chat.c - the `chat` verb (interactive) and `generate --chat MESSAGE` (one turn), cli.h.
 *
 * A conversation is a JSON `messages` array (an optional --system message, then user and
 * assistant turns). Every turn renders the whole conversation through the model's chat template
 * (chat_template.h; the tokenizer's chat_template: tokenizer_config.json's, or a GGUF's
 * tokenizer.chat_template) with add_generation_prompt, encodes the text without adding special
 * tokens (the template writes them, as transformers' apply_chat_template(tokenize=True) does), and
 * generates the reply as one engine request, streamed to stdout as it comes. The reply ends on an
 * end-of-turn token (ms_tok_hf_is_eog: the eos, a GGUF's eot, <|im_end|>, <|eot_id|>, ...; not
 * printed and not kept), the model's eos, --max-new-tokens, or the model's context. The reply's
 * text (special tokens skipped) becomes the assistant message of the next turn.
 *
 * Interactive: one line of stdin is one user message ("> " is shown when stdin is a terminal);
 * an empty line is skipped; Ctrl-C (SIGINT) stops the reply being generated (what it had is kept
 * as the assistant message) and, at the prompt, discards the line; Ctrl-D (end of input) leaves
 * with status 0. A turn that fails (a message that is not valid UTF-8, a conversation longer than
 * the context, a template that refuses it) prints one line on stderr, is dropped from the
 * conversation and the chat goes on; in one-turn mode it is the exit status 1.
 *
 * The whole conversation is prefilled again each turn (the engine keeps no KV between requests):
 * simple, and cheap next to decoding for chat-sized histories.
 */
#include "cli.h"

#include <errno.h>
#include <float.h>
#include <jansson.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "chat_template.h"
#include "engine.h"
#include "threadpool.h"
#include "tokenizer_hf.h"

#define CHAT_DEFAULT_NEW 1024 /* --max-new-tokens when not given (capped by the context) */
#define CHAT_PREFILL 512      /* prompt tokens per step (chunked prefill) and the step budget */

typedef struct chat_opts {
    const char *model;
    const char *tokenizer;
    const char *message; /* --chat: one turn, then exit */
    const char *system;  /* --system */
    int32_t max_new;     /* -1: not given */
    ms_sampling_params sampling;
    bool set_temperature, set_top_k, set_top_p;
    bool verbose_prompt; /* each turn's prompt ids on stderr */
    int32_t page_size;
    int32_t threads;
    const char *device;
    const char *dtype;
} chat_opts;

typedef struct chat {
    const char *prog;
    chat_opts o;
    ms_cli_tok tok;
    ms_chat_template *tmpl;
    ms_engine *eng;
    json_t *messages;
    int32_t max_context;
    size_t n_prompt_total, n_new_total; /* one-turn statistics */
} chat;

static volatile sig_atomic_t chat_interrupted;

static void chat_on_sigint(int sig) {
    (void)sig;
    chat_interrupted = 1;
}

static int chat_fail(const chat *c, const char *fmt, ...) MS_PRINTF(2, 3);
static int chat_fail(const chat *c, const char *fmt, ...) {
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: ", c->prog);
    ms_cli_put_escaped(stderr, buf, sizeof buf);
    fputc('\n', stderr);
    return 1;
}

static void chat_usage(FILE *to, const char *prog) {
    fprintf(
        to,
        "usage: %s chat --model PATH [--tokenizer PATH] [--system TEXT] [--chat MESSAGE]\n"
        "           [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--seed S]\n"
        "           [--verbose-prompt] [--page-size N] [--device auto|cpu|cuda]\n"
        "           [--dtype auto|f32|bf16] [--threads N]\n"
        "       %s generate --chat MESSAGE [--system TEXT] --model PATH [the flags above]\n"
        "  A conversation through the model's chat template: one line of input is one message,\n"
        "  the reply streams as it is generated; Ctrl-C stops a reply, Ctrl-D leaves.\n"
        "  --chat MESSAGE: one turn, then exit.\n",
        prog, prog);
}

/* Returns 0, -1 for --help, else the exit status (message printed). */
static int chat_parse(chat *c, int argc, char **argv, bool from_generate) {
    chat_opts *o = &c->o;
    memset(o, 0, sizeof *o);
    o->max_new = -1;
    o->sampling = (ms_sampling_params){1.0f, 0, 1.0f, 0};
    o->device = "auto";
    static const char *const with_value[] = {
        "--model",       "--tokenizer", "--chat",   "--system", "--max-new-tokens",
        "--temperature", "--top-k",     "--top-p",  "--seed",   "--page-size",
        "--device",      "--dtype",     "--threads"};
    bool seen[MS_ARRAY_LEN(with_value)] = {false};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            chat_usage(stdout, c->prog);
            return -1;
        }
        if (strcmp(a, "--verbose-prompt") == 0) {
            o->verbose_prompt = true;
            continue;
        }
        size_t which = MS_ARRAY_LEN(with_value);
        for (size_t k = 0; k < MS_ARRAY_LEN(with_value); k++)
            if (strcmp(a, with_value[k]) == 0)
                which = k;
        if (which == MS_ARRAY_LEN(with_value)) {
            chat_usage(stderr, c->prog);
            if (strncmp(a, "--", 2) != 0)
                chat_fail(c, "unexpected argument '%s'", a);
            else
                chat_fail(c, "unknown flag '%s'%s", a,
                          from_generate ? " with --chat (see chat --help)" : "");
            return 2;
        }
        if (seen[which]) {
            chat_usage(stderr, c->prog);
            chat_fail(c, "flag %s given twice (give each flag once)", a);
            return 2;
        }
        seen[which] = true;
        if (i + 1 >= argc) {
            chat_usage(stderr, c->prog);
            chat_fail(c, "flag %s needs a value", a);
            return 2;
        }
        const char *v = argv[++i];
        int64_t n;
        if (strcmp(a, "--model") == 0) {
            if (*v == '\0')
                return chat_fail(c, "--model: the path is empty");
            o->model = v;
        } else if (strcmp(a, "--tokenizer") == 0) {
            if (*v == '\0' || strcmp(v, "none") == 0)
                return chat_fail(
                    c, "--tokenizer: '%s': chat needs a tokenizer with a chat template", v);
            o->tokenizer = v;
        } else if (strcmp(a, "--chat") == 0) {
            o->message = v;
        } else if (strcmp(a, "--system") == 0) {
            o->system = v;
        } else if (strcmp(a, "--max-new-tokens") == 0) {
            if (ms_cli_flag_i64(c->prog, a, v, 1, INT32_MAX, "an integer >= 1", &n) != 0)
                return 1;
            o->max_new = (int32_t)n;
        } else if (strcmp(a, "--temperature") == 0) {
            if (ms_cli_flag_f32(c->prog, a, v, 0.0, false, FLT_MAX, "a number >= 0",
                                &o->sampling.temperature) != 0)
                return 1;
            o->set_temperature = true;
        } else if (strcmp(a, "--top-k") == 0) {
            if (ms_cli_flag_i64(c->prog, a, v, 0, INT32_MAX, "an integer >= 0 (0 disables it)",
                                &n) != 0)
                return 1;
            o->sampling.top_k = (int32_t)n;
            o->set_top_k = true;
        } else if (strcmp(a, "--top-p") == 0) {
            if (ms_cli_flag_f32(c->prog, a, v, 0.0, true, 1.0, "a number in (0, 1]",
                                &o->sampling.top_p) != 0)
                return 1;
            o->set_top_p = true;
        } else if (strcmp(a, "--seed") == 0) {
            char *end = NULL;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (*v == '\0' || *end != '\0' || v[0] == '-' || v[0] == '+' || errno == ERANGE)
                return chat_fail(c, "--seed: '%s' is not an unsigned integer (at most %llu)", v,
                                 (unsigned long long)UINT64_MAX);
            o->sampling.seed = (uint64_t)s;
        } else if (strcmp(a, "--page-size") == 0) {
            if (ms_cli_flag_i64(c->prog, a, v, 1, 65536, "an integer in [1, 65536]", &n) != 0)
                return 1;
            o->page_size = (int32_t)n;
        } else if (strcmp(a, "--threads") == 0) {
            char expect[48];
            snprintf(expect, sizeof expect, "an integer in [1, %d]", MS_THREADPOOL_MAX_THREADS);
            if (ms_cli_flag_i64(c->prog, a, v, 1, MS_THREADPOOL_MAX_THREADS, expect, &n) != 0)
                return 1;
            o->threads = (int32_t)n;
        } else if (strcmp(a, "--device") == 0) {
            if (strcmp(v, "auto") != 0 && strcmp(v, "cpu") != 0 && strcmp(v, "cuda") != 0)
                return chat_fail(c, "--device: '%s' is not auto, cpu or cuda", v);
            o->device = v;
        } else if (strcmp(a, "--dtype") == 0) {
            if (strcmp(v, "auto") != 0 && strcmp(v, "f32") != 0 && strcmp(v, "bf16") != 0)
                return chat_fail(c, "--dtype: '%s' is not auto, f32 or bf16", v);
            o->dtype = v;
        }
    }
    if (o->model == NULL) {
        chat_usage(stderr, c->prog);
        chat_fail(c, "--model is required");
        return 2;
    }
    if (from_generate && o->message == NULL) {
        chat_usage(stderr, c->prog);
        chat_fail(c, "generate --chat needs a message");
        return 2;
    }
    return 0;
}

/* Append {"role": role, "content": text}; false when text is not valid UTF-8 (or no memory). */
static bool chat_push(json_t *messages, const char *role, const char *text, size_t len) {
    json_t *content = json_stringn(text, len);
    if (content == NULL)
        return false;
    json_t *m = json_pack("{s:s, s:o}", "role", role, "content", content);
    return m != NULL && json_array_append_new(messages, m) == 0;
}

static double chat_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/*
 * Print the text of reply ids[0 .. n) past the *printed bytes already out. Unless `final`, a
 * trailing U+FFFD (a character whose bytes have not all come yet) is held back.
 */
static int chat_stream(chat *c, const int32_t *ids, size_t n, bool final, size_t *printed,
                       char **text_out, size_t *len_out) {
    ms_error err = {0};
    char *text = NULL;
    size_t len = 0;
    if (ms_tok_hf_decode(c->tok.hf, ids, n, true, &text, &len, &err) != MS_OK)
        return chat_fail(c, "%s", err.msg);
    size_t safe = len;
    while (!final && safe >= 3 && memcmp(text + safe - 3, "\xEF\xBF\xBD", 3) == 0)
        safe -= 3;
    if (safe > *printed) {
        fwrite(text + *printed, 1, safe - *printed, stdout);
        *printed = safe;
    }
    fflush(stdout);
    if (text_out != NULL) {
        *text_out = text;
        *len_out = len;
    } else {
        ms_free(text);
    }
    return ferror(stdout) ? ms_cli_stdout_check(c->prog) : 0;
}

/* One turn: the user's message in, the reply streamed and kept. Returns 0 or 1 (message printed;
 * the user message is dropped again). */
static int chat_turn(chat *c, const char *message, size_t len) {
    ms_error err = {0};
    if (!chat_push(c->messages, "user", message, len))
        return chat_fail(c, "the message is not valid UTF-8 (or out of memory): it was not sent");
    size_t n_msgs = json_array_size(c->messages);
    char *prompt = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = 0;
    ms_rid rid = 0;
    bool added = false;
    char *reply = NULL;
    size_t reply_len = 0;
    if (ms_chat_template_render(c->tmpl, c->messages, true, ms_tok_hf_bos_token(c->tok.hf),
                                ms_tok_hf_eos_token(c->tok.hf), &prompt, &err) != MS_OK) {
        rc = chat_fail(c, "%s", err.msg);
        goto done;
    }
    if (ms_tok_hf_encode(c->tok.hf, prompt, strlen(prompt), false, &ids, &n, &err) != MS_OK) {
        rc = chat_fail(c, "%s", err.msg);
        goto done;
    }
    if (c->o.verbose_prompt) {
        fprintf(stderr, "%s: prompt: %zu tokens:", c->prog, n);
        for (size_t k = 0; k < n; k++)
            fprintf(stderr, " %d", (int)ids[k]);
        fputc('\n', stderr);
    }
    if (n == 0 || n >= (size_t)c->max_context) {
        rc = chat_fail(c,
                       "the conversation is %zu tokens, the model's context %d: no room for a "
                       "reply (start a new chat)",
                       n, (int)c->max_context);
        goto done;
    }
    ms_engine_request rq = {
        .prompt = ids,
        .n_prompt = (int32_t)n,
        .sampling = c->o.sampling,
        .prefill_chunk = CHAT_PREFILL,
    };
    int32_t room = c->max_context - (int32_t)n;
    rq.max_new_tokens = MS_MIN(c->o.max_new > 0 ? c->o.max_new : CHAT_DEFAULT_NEW, room);
    if (ms_engine_add(c->eng, &rq, &rid, &err) != MS_OK) {
        rc = chat_fail(c, "%s", err.msg);
        goto done;
    }
    added = true;
    c->n_prompt_total += n;
    const int32_t *out = NULL;
    int32_t n_out = 0, n_reply = 0;
    size_t printed = 0;
    bool stop = false, nan = false;
    while (!stop && ms_engine_n_active(c->eng) > 0 && !chat_interrupted) {
        ms_engine_step_info info;
        if (ms_engine_step(c->eng, &info, &err) != MS_OK) {
            rc = chat_fail(c, "%s", err.msg);
            goto done;
        }
        ms_finish_reason why;
        MS_ASSERT(ms_engine_output(c->eng, rid, &out, &n_out, &why) == MS_OK);
        if (why == MS_FINISH_ERROR)
            stop = nan = true; /* what came before is printed, then the turn fails */
        while (n_reply < n_out && !stop) {
            if (ms_tok_hf_is_eog(c->tok.hf, out[n_reply]) ||
                (why == MS_FINISH_EOS && n_reply == n_out - 1))
                stop = true; /* the end-of-turn token: neither printed nor kept */
            else
                n_reply++;
        }
        if ((rc = chat_stream(c, out, (size_t)n_reply, false, &printed, NULL, NULL)) != 0)
            goto done;
    }
    if ((rc = chat_stream(c, out, (size_t)n_reply, true, &printed, &reply, &reply_len)) != 0)
        goto done;
    c->n_new_total += (size_t)n_out;
    fputc('\n', stdout);
    if ((rc = ms_cli_stdout_check(c->prog)) != 0)
        goto done;
    if (nan) {
        rc = chat_fail(c, "the model's logits became NaN after %d tokens: the reply stopped",
                       (int)n_out);
        goto done;
    }
    if (!chat_push(c->messages, "assistant", reply, reply_len))
        rc = chat_fail(c, "out of memory keeping the reply");
done:
    if (chat_interrupted) {
        chat_interrupted = 0;
        if (rc == 0)
            fprintf(stderr, "%s: reply stopped (Ctrl-C); Ctrl-D leaves\n", c->prog);
    }
    if (added)
        ms_engine_remove(c->eng, rid);
    if (rc != 0) /* the turn is dropped: the next render must not see it */
        while (json_array_size(c->messages) >= n_msgs)
            json_array_remove(c->messages, json_array_size(c->messages) - 1);
    ms_free(reply);
    ms_free(ids);
    ms_free(prompt);
    return rc;
}

/* SIGINT sets chat_interrupted; `restart`: interrupted system calls restart (while a reply is
 * written, so that stdout never sees EINTR), else they fail with EINTR (the read at the prompt). */
static void chat_sigint(bool restart, struct sigaction *old) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = chat_on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = restart ? SA_RESTART : 0;
    sigaction(SIGINT, &sa, old);
}

/* The interactive loop; returns the exit status. */
static int chat_loop(chat *c) {
    struct sigaction old;
    chat_sigint(false, &old);
    bool tty = isatty(STDIN_FILENO) != 0;
    char *line = NULL;
    size_t cap = 0;
    int rc = 0;
    for (;;) {
        if (tty) {
            fputs("> ", stdout);
            fflush(stdout);
        }
        errno = 0;
        ssize_t got = getline(&line, &cap, stdin);
        if (got < 0) {
            if (errno == EINTR && chat_interrupted) {
                chat_interrupted = 0;
                clearerr(stdin);
                fputs("\n", stdout);
                continue;
            }
            if (ferror(stdin) && errno != 0)
                rc = chat_fail(c, "reading stdin: %s", strerror(errno));
            if (tty)
                fputs("\n", stdout);
            break;
        }
        size_t len = (size_t)got;
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r'))
            len--;
        if (len == 0)
            continue;
        line[len] = '\0';
        if (strlen(line) != len) {
            chat_fail(c, "the message holds a NUL byte: it was not sent");
            continue;
        }
        chat_sigint(true, NULL);
        (void)chat_turn(c, line, len); /* a failed turn said why and is dropped; the chat goes on */
        chat_sigint(false, NULL);
        if (ferror(stdout))
            break;
    }
    free(line);
    sigaction(SIGINT, &old, NULL);
    if (rc == 0)
        rc = ms_cli_stdout_check(c->prog);
    return rc;
}

int ms_cli_chat(int argc, char **argv, const ms_model_desc *desc, const char *prog,
                bool from_generate) {
    chat c;
    memset(&c, 0, sizeof c);
    c.prog = prog;
    int rc = chat_parse(&c, argc, argv, from_generate);
    if (rc != 0)
        return rc < 0 ? ms_cli_stdout_check(prog) : rc;
    ms_error err = {0};
    char *model_dir = NULL;
    ms_md_facts fa;
    if (ms_cli_model_probe(desc, c.o.model, &fa, NULL, &model_dir, &err) != MS_OK) {
        rc = chat_fail(&c, "%s", err.msg);
        goto done;
    }
    if ((rc = ms_cli_tok_init(&c.tok, c.o.tokenizer, model_dir, c.o.model, fa.vocab)) != 0)
        goto done;
    if (c.tok.hf == NULL) {
        rc = chat_fail(&c, "chat needs a tokenizer with a chat template: %s%s",
                       c.tok.l2c != NULL ? c.tok.path : c.o.model,
                       c.tok.l2c != NULL ? " is a llama2.c tokenizer (no chat template)"
                                         : " has no tokenizer.json; give --tokenizer PATH");
        goto done;
    }
    const char *src = ms_tok_hf_chat_template(c.tok.hf);
    if (src == NULL) {
        rc = chat_fail(&c,
                       "%s: the tokenizer has no chat template (no chat_template in "
                       "tokenizer_config.json): chat "
                       "needs one; generate --prompt runs plain text",
                       c.tok.path);
        goto done;
    }
    if (ms_chat_template_init(&c.tmpl, src, "chat_template", &err) != MS_OK) {
        rc = chat_fail(&c, "%s: %s", c.tok.path, err.msg);
        goto done;
    }
    if (!c.o.set_temperature)
        c.o.sampling.temperature = fa.temperature;
    if (!c.o.set_top_k)
        c.o.sampling.top_k = fa.top_k;
    if (!c.o.set_top_p)
        c.o.sampling.top_p = fa.top_p;
    c.messages = json_array();
    if (c.messages == NULL ||
        (c.o.system != NULL && !chat_push(c.messages, "system", c.o.system, strlen(c.o.system)))) {
        rc = chat_fail(&c, c.messages == NULL ? "out of memory"
                                              : "--system: the text is not valid UTF-8");
        goto done;
    }
    ms_engine_options eo = ms_engine_options_default();
    eo.model_path = c.o.model;
    eo.device = c.o.device;
    eo.page_size = c.o.page_size;
    eo.n_threads = c.o.threads;
    eo.dtype = c.o.dtype;
    eo.max_seqs = 1;
    eo.max_tokens = CHAT_PREFILL;
    eo.max_seq_len = fa.max_context;
    eo.prefix_cache = true; /* each turn re-renders the whole history: its pages are cached */
    if (ms_engine_init(&c.eng, desc, &eo, &err) != MS_OK) {
        rc = chat_fail(&c, "%s", err.msg);
        goto done;
    }
    c.max_context = ms_engine_facts(c.eng)->max_context;
    if (c.o.message != NULL) {
        double t0 = chat_now();
        rc = chat_turn(&c, c.o.message, strlen(c.o.message));
        double secs = chat_now() - t0;
        if (rc == 0)
            fprintf(stderr,
                    "%s: chat: %zu prompt tokens, %zu new tokens in %.3f s (%.1f tokens/s) on %s\n",
                    prog, c.n_prompt_total, c.n_new_total, secs,
                    secs > 0 ? (double)c.n_new_total / secs : 0.0, ms_engine_device(c.eng));
    } else {
        rc = chat_loop(&c);
    }
done:
    json_decref(c.messages);
    ms_engine_free(c.eng);
    ms_chat_template_free(c.tmpl);
    ms_cli_tok_free(&c.tok);
    ms_free(model_dir);
    return rc;
}
