/*
 * cli_serve.c - the `serve` verb (cli.h ms_cli_serve): an OpenAI-compatible HTTP server over one
 * compiled model.
 *
 * Threads: libmicrohttpd runs one thread per connection (MHD_USE_THREAD_PER_CONNECTION); ONE
 * scheduler thread owns the engine (engine.h is not thread-safe) and runs ms_engine_step in a
 * loop. A handler parses and validates a request completely (JSON, types, ranges, ids against the
 * vocabulary, the prompt against the context), tokenizes it, and enqueues one choice per prompt
 * into a FIFO; the scheduler moves queued choices into the engine at step boundaries (continuous
 * batching), decodes each new id to text, matches stop strings on the decoded text, and hands text
 * back through the job's buffer and condition variable. A stream is a callback response whose
 * reader blocks on that condition variable; when the client goes away libmicrohttpd destroys the
 * response, its free callback marks the job aborted, and the scheduler removes its requests from
 * the engine (ms_engine_remove) at the next step boundary.
 *
 * Chat: /v1/chat/completions renders `messages` with the chat template loaded at start
 * (chat_template.h; --chat-template, else tokenizer_config.json's), encodes the text without
 * adding special tokens (the template wrote bos_token), and runs it as a completion whose replies
 * are chat objects; the template's eos token is a stop id of the job (besides the model's eos).
 *
 * Locking: one mutex (srv.mu) guards the queue, every job's state and the counters; the engine is
 * touched by the scheduler thread only (the handlers read the KV page counts it publishes).
 * A job is freed by whoever drops the last of its references: the handler's (a plain reply: when
 * it has been built; a stream: the response's free callback) and one per choice the scheduler
 * still holds (queued or running).
 *
 * Constraints: every bad request gets a 4xx with OpenAI's error body and the server keeps serving;
 * stop strings never reach the client (text that may begin a stop string is held back); text sent
 * is valid UTF-8 (a character split across tokens waits for its last byte); SIGINT / SIGTERM stop
 * the server, abort what runs, free everything and return 0.
 */
#include "cli.h"

#include <arpa/inet.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "chat_template.h"
#include "engine.h"
#include "pd.h"
#include "pd_http.h"
#include "sample_res.h"
#include "serve_request.h"
#include "threadpool.h"
#include "tokenizer_hf.h"
#include "tokenizer_llama2c.h"

#define SRV_MAX_BODY (1u << 20)   /* request body limit, bytes (413 above) */
/* the optional request fields served (serve_request.h MS_SERVE_CAP_*) */
#define SRV_CAPS                                                                          \
    (MS_SERVE_CAP_N | MS_SERVE_CAP_LOGPROBS | MS_SERVE_CAP_ECHO | MS_SERVE_CAP_PENALTIES | \
     MS_SERVE_CAP_MIN_P)

/* ---- types ---- */

typedef struct srv srv;
typedef struct srv_job srv_job;

/* A Prometheus histogram of seconds over fixed buckets. */
static const double srv_buckets[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                     0.25,  0.5,    1.0,   2.5,  5.0,   10.0};
#define SRV_N_BUCKETS ((int)MS_ARRAY_LEN(srv_buckets))
typedef struct srv_hist {
    uint64_t n[SRV_N_BUCKETS + 1]; /* per bucket (not cumulative); the last: above them all */
    uint64_t count;
    double sum;                    /* seconds */
} srv_hist;

static void hist_observe(srv_hist *h, double secs) {
    int b = 0;
    while (b < SRV_N_BUCKETS && secs > srv_buckets[b])
        b++;
    h->n[b]++;
    h->count++;
    h->sum += secs;
}

typedef enum srv_state { CH_QUEUED = 0, CH_RUNNING, CH_DONE } srv_state;

/* The logprobs of one generated token (sampler.h ms_sampler_logprobs: the distribution it was
   sampled from). */
typedef struct srv_lp {
    int32_t id;
    int32_t prev;                        /* the token before it (llama2.c pieces depend on it) */
    float lp;
    int32_t n_top;
    int32_t top_ids[MS_SERVE_MAX_LOGPROBS];
    float top_lps[MS_SERVE_MAX_LOGPROBS];
    size_t offset;                       /* bytes of text before it (completions' text_offset) */
} srv_lp;

/* One prompt of a job: one engine request. */
typedef struct srv_choice {
    srv_job *job;
    int32_t index;              /* the choice's index in the reply */
    int32_t *prompt;            /* [n_prompt] ids (ms_malloc'd) */
    int32_t n_prompt;
    srv_state state;
    ms_rid rid;                 /* valid while RUNNING */
    int32_t n_seen;             /* output ids decoded so far */
    int32_t n_gen;              /* completion tokens (up to and including a stop's token) */
    int prev;                   /* llama2.c: the previous token (its decode needs it) */
    ms_cli_utf8 utf8;           /* bytes of a split character held back */
    char *text;                 /* [n_text] decoded generated text, valid UTF-8 (ms_malloc'd) */
    size_t n_text, cap_text;
    size_t n_sent;              /* bytes of text streamed */
    int32_t *ids_new;           /* no tokenizer: ids not streamed yet; [n_ids_new] */
    size_t n_ids_new, cap_ids_new;
    const char *finish;         /* "length" / "stop" / "error" once done */
    uint64_t seed;              /* this choice's seed: the request's + its index among n */
    char *echo;                 /* echo: the prompt's text, sent first (ms_malloc'd; NULL none) */
    size_t n_echo;
    bool echo_sent;
    srv_lp *lps;                /* logprobs: [n_lps] per generated token (ms_malloc'd) */
    size_t n_lps, cap_lps, n_lps_sent;
    bool role_sent;             /* chat stream: the {"role": "assistant"} delta went out */
    ms_engine_prompt_logprob *plp; /* prompt logprobs: [n_prompt] once its prefill computed
                                      them (ms_malloc'd copy of ms_engine_prompt_logprobs) */
    bool plp_sent;              /* stream: they went out (the echo chunk / the first chunk) */
    double t_last;              /* when its last token came (monotonic seconds) */
    struct srv_choice *next_q;  /* FIFO link */
    /* [pd] (docs/pd.md): a decode server's record from its prefill peer (NULL: prefill here);
       a prefill server's encoded record of this choice, its reply */
    ms_pd_record *pd_rec;
    uint8_t *pd_bytes;
    size_t n_pd_bytes;
} srv_choice;

struct srv_job {
    srv *s;
    srv_choice *ch;             /* [n_ch] */
    int32_t n_ch;
    int32_t n;                  /* choices per prompt: ch[p * n] is prompt p's first */
    ms_sampling_params sampling;
    ms_sample_extra extra;      /* min_p, penalties (sample_res.h) */
    bool has_extra;             /* not all off */
    int32_t logprobs;           /* -1 none, else top logprobs per token */
    int32_t prompt_logprobs;    /* -1 none, else vLLM's prompt_logprobs (top entries) */
    bool echo_lp;               /* echo with logprobs: the prompt's tokens lead the logprobs */
    int32_t plp_top;            /* -1: no prompt logprobs computed, else their top entries */
    int32_t max_tokens;
    bool ignore_eos;
    char *stops[MS_SERVE_MAX_STOPS]; /* ms_malloc'd */
    int32_t n_stops;
    bool stream, include_usage;
    bool chat;                  /* /v1/chat/completions: chat objects, message / delta */
    int32_t stop_id;            /* chat: the template's eos id, a stop id too (-1: none) */
    char id[40];
    long long created;
    double t_arrival;           /* monotonic seconds */
    pthread_cond_t cv;          /* admission, finished choices, stream bytes */
    int32_t n_admitted, n_done;
    unsigned fail_status;       /* != 0: failed (HTTP status) */
    char fail_msg[256];
    bool aborted;               /* the client went away */
    bool handler_done;          /* the handler's reference is dropped */
    int32_t sched_refs;         /* choices queued or running */
    char *sse;                  /* stream bytes (ms_malloc'd), [n_sse], sse_off read */
    size_t n_sse, cap_sse, sse_off;
    bool sse_end;
    bool counted;               /* its outcome counted in the metrics */
    bool enqueued;              /* counted in srv.n_jobs */
    bool pd_prefill;            /* [pd] POST /v1/pd/prefill: published after its first id */
};

typedef struct srv_opts {
    const char *model, *tokenizer, *host, *api_key, *device, *dtype, *chat_template;
    int32_t port, max_seqs, max_tokens_per_step, page_size, threads, max_queue, kv_pages;
    bool no_graphs; /* --no-graphs: every step eager (engine.h graphs) */
    bool no_prefix_cache; /* --no-prefix-cache: no KV shared across requests (prefix_cache) */
    int32_t prompt_logprobs_rows; /* --prompt-logprobs-rows: engine.h prompt_logprobs_rows */
    int32_t host_kv_pages;      /* --host-kv-pages: the host tier (engine.h host_kv_pages) */
    float gpu_memory_fraction;  /* --gpu-memory-fraction: 0 unset (engine.h) */
    int32_t tp;                 /* --tp N: tensor-parallel ranks (engine.h tp); 0 = off */
    const char *role;           /* [pd] --role prefill|decode; NULL: one engine does both */
    const char *prefill_url;    /* [pd] --prefill-url (decode role): the prefill peer */
    ms_pd_peer peer;            /* [pd] prefill_url parsed */
} srv_opts;

struct srv {
    srv_opts o;
    const char *prog;
    char *name;                 /* the model's id in /v1/models (ms_malloc'd) */
    ms_engine *eng;
    ms_cli_tok tok;
    bool has_tok;
    ms_chat_template *tmpl;     /* NULL: no chat template (chat requests get tmpl_why) */
    char *bos_tok, *eos_tok;    /* the template's bos / eos tokens (ms_malloc'd; NULL: unset) */
    int32_t chat_eos_id;        /* eos_tok's id (-1: none): chat requests stop on it */
    char tmpl_why[320];
    ms_md_facts fa;             /* the engine's facts (read-only after init) */
    void *lp_scratch;           /* the scheduler's ms_sampler_logprobs scratch */
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* the scheduler waits for work here */
    srv_choice *q_head, *q_tail;
    int32_t n_queued;
    srv_choice **run;           /* [n_run] choices in the engine (capacity max_seqs) */
    int32_t n_run;
    bool stopping;
    int32_t n_jobs;             /* jobs enqueued and not yet freed */
    pthread_cond_t idle_cv;     /* n_jobs reached 0 */
    uint64_t next_id;
    /* metrics (under mu) */
    uint64_t n_success, n_error, n_aborted, prompt_tokens, gen_tokens;
    int32_t kv_free, kv_total;  /* published by the scheduler */
    ms_prefix_stats pstats;     /* the engine's prefix cache, published by the scheduler */
    ms_engine_kv_stats kv;      /* offload / preemption counters, published by the scheduler */
    ms_engine_fork_stats forks; /* n > 1 choices sharing their prompt's KV (published) */
    srv_hist ttft, itl;         /* time to first token (from arrival), between tokens */
};

static void srv_log(const srv *s, const char *fmt, ...) MS_PRINTF(2, 3);
static void srv_log(const srv *s, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: serve: ", s->prog);
    ms_cli_put_escaped(stderr, buf, sizeof buf);
    fputc('\n', stderr);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- jobs ---- */

/* Free a job; one that was enqueued is freed under mu. */
static void job_free(srv_job *j) {
    if (j == NULL)
        return;
    if (j->enqueued && --j->s->n_jobs == 0)
        pthread_cond_broadcast(&j->s->idle_cv);
    for (int32_t i = 0; i < j->n_ch; i++) {
        ms_free(j->ch[i].prompt);
        ms_free(j->ch[i].text);
        ms_free(j->ch[i].ids_new);
        ms_free(j->ch[i].echo);
        ms_free(j->ch[i].lps);
        ms_free(j->ch[i].plp);
        ms_pd_record_free(j->ch[i].pd_rec); /* [pd] */
        ms_free(j->ch[i].pd_bytes);
    }
    for (int32_t i = 0; i < j->n_stops; i++)
        ms_free(j->stops[i]);
    ms_free(j->ch);
    ms_free(j->sse);
    pthread_cond_destroy(&j->cv);
    ms_free(j);
}

/* Count the job's outcome once (under mu). */
static void job_count(srv_job *j, bool ok) {
    if (j->counted)
        return;
    j->counted = true;
    srv *s = j->s;
    if (j->aborted)
        s->n_aborted++;
    else if (ok && j->fail_status == 0)
        s->n_success++;
    else
        s->n_error++;
}

/* Drop the handler's reference (under mu). */
static void job_release_handler(srv_job *j) {
    j->handler_done = true;
    if (j->n_done < j->n_ch && j->fail_status == 0)
        j->aborted = true; /* the client left before the end */
    if (j->sched_refs == 0) {
        job_count(j, true);
        job_free(j);
    } else {
        pthread_cond_signal(&j->s->cv);
    }
}

/* Drop one scheduler reference (under mu). */
static void job_release_sched(srv_job *j) {
    MS_ASSERT(j->sched_refs > 0);
    if (--j->sched_refs == 0 && j->handler_done) {
        job_count(j, true);
        job_free(j);
    }
}

static void sse_append(srv_job *j, const char *s, size_t n) {
    if (ms_grow((void **)&j->sse, &j->cap_sse, j->n_sse + n + 1, 1) != MS_OK)
        return; /* out of memory: the chunk is lost, the stream still ends */
    memcpy(j->sse + j->n_sse, s, n);
    j->n_sse += n;
    j->sse[j->n_sse] = '\0';
    pthread_cond_broadcast(&j->cv); /* the stream's reader */
}

/* "data: <obj>\n\n" (obj consumed). */
static void sse_event(srv_job *j, json_t *obj) {
    char *line = obj != NULL ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (line == NULL)
        return;
    sse_append(j, "data: ", 6);
    sse_append(j, line, strlen(line));
    sse_append(j, "\n\n", 2);
    free(line); /* jansson's allocator: malloc */
}

static json_t *usage_json(const srv_job *j) {
    int64_t p = 0, c = 0;
    for (int32_t i = 0; i < j->n_ch; i++) {
        p += j->ch[i].n_prompt;
        c += j->ch[i].n_gen;
    }
    return json_pack("{s:I, s:I, s:I}", "prompt_tokens", (json_int_t)p, "completion_tokens",
                     (json_int_t)c, "total_tokens", (json_int_t)(p + c));
}

/* A completion object (a reply, or one stream chunk holding `choices`). */
static json_t *completion_json(const srv_job *j, json_t *choices) {
    const char *obj = !j->chat    ? "text_completion"
                      : j->stream ? "chat.completion.chunk"
                                  : "chat.completion";
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:o}", "id", j->id, "object", obj,
                          "created", (json_int_t)j->created, "model", j->s->name, "choices",
                          choices);
    return o;
}

static json_t *ids_json(const int32_t *ids, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; a != NULL && i < n; i++)
        json_array_append_new(a, json_integer(ids[i]));
    return a;
}

/* A token's text for logprobs: its piece (tokenizer.json: its bytes; llama2.c: its piece after
   prev), or "token_id:N" without a tokenizer (vLLM's return_tokens_as_token_ids spelling).
   Bytes that are not valid UTF-8 (a character split across tokens) become U+FFFD in the
   string; chat's "bytes" field carries them exactly. */
static json_t *token_json(const srv *s, int32_t prev, int32_t id, json_t **bytes) {
    const char *b = NULL;
    size_t n = 0;
    char tmp[32];
    if (s->tok.l2c != NULL) {
        b = ms_llama2c_tok_decode(s->tok.l2c, prev, id);
        n = b != NULL ? strlen(b) : 0;
    } else if (s->tok.hf != NULL) {
        b = ms_tok_hf_token_bytes(s->tok.hf, id, &n);
    } else {
        n = (size_t)snprintf(tmp, sizeof tmp, "token_id:%d", (int)id);
        b = tmp;
    }
    if (b == NULL) {
        b = "";
        n = 0;
    }
    if (bytes != NULL) {
        *bytes = json_array();
        for (size_t i = 0; *bytes != NULL && i < n; i++)
            json_array_append_new(*bytes, json_integer((unsigned char)b[i]));
    }
    json_t *t = json_stringn(b, n);
    if (t != NULL)
        return t;
    char *fix = ms_malloc(3 * n + 1); /* every non-ASCII byte -> U+FFFD (3 bytes) */
    size_t k = 0;
    for (size_t i = 0; fix != NULL && i < n; i++) {
        if ((unsigned char)b[i] < 0x80 && b[i] != '\0') {
            fix[k++] = b[i];
        } else {
            memcpy(fix + k, "\xef\xbf\xbd", 3);
            k += 3;
        }
    }
    t = fix != NULL ? json_stringn(fix, k) : NULL;
    ms_free(fix);
    return t != NULL ? t : json_string("");
}

/* The token before prompt token i (llama2.c pieces depend on it; choice_echo's rule). */
static int32_t prompt_prev(const srv_choice *c, int32_t i) { return i > 0 ? c->prompt[i - 1] : 1; }

/* The text of prompt position i holding `id` (the prompt's own token or a top one): as the echo
   decodes it (llama2.c: a leading BOS prints nothing), so the tokens spell the echoed text. */
static json_t *prompt_token_json(const srv *s, const srv_choice *c, int32_t i, int32_t id) {
    if (s->tok.l2c != NULL && i == 0 && id == 1)
        return json_string("");
    return token_json(s, prompt_prev(c, i), id, NULL);
}

/* vLLM's prompt_logprobs of c: [null, {"<id>": {logprob, rank, decoded_token}, ...}, ...], per
   prompt token its own entry and its top ones (ranks 1..k). */
static json_t *prompt_logprobs_json(const srv_job *j, const srv_choice *c) {
    json_t *arr = json_array();
    for (int32_t i = 0; arr != NULL && i < c->n_prompt; i++) {
        const ms_engine_prompt_logprob *e = &c->plp[i];
        if (i == 0) {
            json_array_append_new(arr, json_null());
            continue;
        }
        json_t *d = json_object();
        char key[16];
        for (int32_t k = 0; d != NULL && k < e->n_top && k < j->prompt_logprobs; k++) {
            snprintf(key, sizeof key, "%d", (int)e->top_ids[k]);
            json_object_set_new(d, key, json_pack("{s:f, s:i, s:o}", "logprob",
                                                  (double)e->top_logprobs[k], "rank", (int)(k + 1),
                                                  "decoded_token",
                                                  prompt_token_json(j->s, c, i, e->top_ids[k])));
        }
        snprintf(key, sizeof key, "%d", (int)c->prompt[i]);
        if (d != NULL)
            json_object_set_new(d, key, json_pack("{s:f, s:i, s:o}", "logprob",
                                                  isnan(e->logprob) ? (double)MS_SAMPLER_LOGPROB_FLOOR
                                                                    : (double)e->logprob,
                                                  "rank", (int)e->rank, "decoded_token",
                                                  prompt_token_json(j->s, c, i, c->prompt[i])));
        json_array_append_new(arr, d);
    }
    return arr;
}

/* Logprobs of c's tokens [from, to): completions' legacy object {tokens, token_logprobs,
   top_logprobs, text_offset}, or chat's {content: [{token, logprob, bytes, top_logprobs}]}. The
   sampled token is always among a token's top_logprobs entries of a completion (as vLLM). With
   `prompt` (echo with logprobs) the prompt's tokens lead, the first with null entries (OpenAI's
   echo), and the generated tokens' text_offset counts the echoed text before them. */
static json_t *logprobs_json(const srv_job *j, const srv_choice *c, size_t from, size_t to,
                             bool prompt) {
    const srv *s = j->s;
    if (j->chat) {
        json_t *content = json_array();
        for (size_t i = from; content != NULL && i < to; i++) {
            const srv_lp *e = &c->lps[i];
            json_t *bytes = NULL, *top = json_array();
            json_t *tok = token_json(s, e->prev, e->id, &bytes);
            for (int32_t k = 0; top != NULL && k < e->n_top; k++) {
                json_t *tb = NULL;
                json_t *tt = token_json(s, e->prev, e->top_ids[k], &tb);
                json_array_append_new(top, json_pack("{s:o, s:f, s:o}", "token", tt, "logprob",
                                                     (double)e->top_lps[k], "bytes", tb));
            }
            json_array_append_new(content,
                                  json_pack("{s:o, s:f, s:o, s:o}", "token", tok, "logprob",
                                            (double)e->lp, "bytes", bytes, "top_logprobs", top));
        }
        return json_pack("{s:o}", "content", content);
    }
    json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
    size_t off = 0;
    for (int32_t i = 0; prompt && c->plp != NULL && i < c->n_prompt; i++) {
        const ms_engine_prompt_logprob *e = &c->plp[i];
        json_t *tt = prompt_token_json(s, c, i, c->prompt[i]);
        size_t tl = tt != NULL ? json_string_length(tt) : 0;
        json_array_append_new(offs, json_integer((json_int_t)off));
        off += tl;
        if (i == 0) {
            json_array_append_new(toks, tt);
            json_array_append_new(lps, json_null());
            json_array_append_new(tops, json_null());
            continue;
        }
        const double lp = isnan(e->logprob) ? (double)MS_SAMPLER_LOGPROB_FLOOR : (double)e->logprob;
        json_t *d = json_object();
        for (int32_t k = 0; d != NULL && k < e->n_top && k < j->logprobs; k++) {
            json_t *kt = prompt_token_json(s, c, i, e->top_ids[k]);
            if (kt != NULL && json_object_get(d, json_string_value(kt)) == NULL)
                json_object_set_new(d, json_string_value(kt), json_real((double)e->top_logprobs[k]));
            json_decref(kt);
        }
        if (d != NULL && tt != NULL)
            json_object_set_new(d, json_string_value(tt), json_real(lp));
        json_array_append_new(toks, tt);
        json_array_append_new(lps, json_real(lp));
        json_array_append_new(tops, d);
    }
    const size_t shift = j->echo_lp ? c->n_echo : 0; /* the echoed text comes first */
    for (size_t i = from; i < to; i++) {
        const srv_lp *e = &c->lps[i];
        json_array_append_new(toks, token_json(s, e->prev, e->id, NULL));
        json_array_append_new(lps, json_real((double)e->lp));
        json_array_append_new(offs, json_integer((json_int_t)(e->offset + shift)));
        json_t *d = json_object();
        for (int32_t k = 0; d != NULL && k < e->n_top; k++) {
            json_t *tt = token_json(s, e->prev, e->top_ids[k], NULL);
            if (tt != NULL && json_object_get(d, json_string_value(tt)) == NULL)
                json_object_set_new(d, json_string_value(tt), json_real((double)e->top_lps[k]));
            json_decref(tt);
        }
        json_t *tt = token_json(s, e->prev, e->id, NULL);
        if (d != NULL && tt != NULL)
            json_object_set_new(d, json_string_value(tt), json_real((double)e->lp));
        json_decref(tt);
        json_array_append_new(tops, d);
    }
    return json_pack("{s:o, s:o, s:o, s:o}", "tokens", toks, "token_logprobs", lps,
                     "top_logprobs", tops, "text_offset", offs);
}

/* One choice of a chunk or reply: text [n] bytes, finish (NULL: null); logprobs of its tokens
   [lp_from, lp_to) when the request asked for them. */
static json_t *choice_json(const srv_job *j, const srv_choice *c, const char *text, size_t n,
                           const int32_t *ids, size_t n_ids, const char *finish, size_t lp_from,
                           size_t lp_to, bool prompt_lp) {
    if (j->chat) { /* a reply's message, or a chunk's delta (role first, then content pieces) */
        json_t *m;
        if (!j->stream)
            m = json_pack("{s:s, s:s%}", "role", "assistant", "content", text, n);
        else if (!c->role_sent)
            m = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
        else if (n > 0)
            m = json_pack("{s:s%}", "content", text, n);
        else
            m = json_object();
        return json_pack("{s:i, s:o, s:o, s:o}", "index", (int)c->index,
                         j->stream ? "delta" : "message", m, "logprobs",
                         j->logprobs >= 0 && lp_to > lp_from
                             ? logprobs_json(j, c, lp_from, lp_to, false)
                             : json_null(),
                         "finish_reason", finish != NULL ? json_string(finish) : json_null());
    }
    json_t *o = json_pack("{s:i, s:s%, s:o, s:o}", "index", (int)c->index, "text", text, n,
                          "logprobs",
                          j->logprobs >= 0 ? logprobs_json(j, c, lp_from, lp_to,
                                                           prompt_lp && j->echo_lp)
                                           : json_null(),
                          "finish_reason", finish != NULL ? json_string(finish) : json_null());
    if (o != NULL && !j->s->has_tok)
        json_object_set_new(o, "token_ids", ids_json(ids, n_ids));
    /* vLLM's prompt_logprobs: in the reply, and in a stream's first chunk of the choice */
    if (o != NULL && prompt_lp && j->prompt_logprobs >= 0 && c->plp != NULL)
        json_object_set_new(o, "prompt_logprobs", prompt_logprobs_json(j, c));
    return o;
}

/* ---- scheduler ---- */

/* Bytes at the end of text[from..n) that could begin a stop string (held back). */
static size_t stop_holdback(const srv_job *j, const char *text, size_t from, size_t n) {
    size_t hold = 0;
    for (int32_t k = 0; k < j->n_stops; k++) {
        size_t sl = strlen(j->stops[k]);
        for (size_t m = MS_MIN(sl - 1, n - from); m > hold; m--)
            if (memcmp(text + n - m, j->stops[k], m) == 0) {
                hold = m;
                break;
            }
    }
    return hold;
}

static void text_push(srv_choice *c, const char *bytes, size_t n) {
    if (n == 0)
        return;
    if (ms_grow((void **)&c->text, &c->cap_text, c->n_text + MS_CLI_UTF8_OUT_MAX(n) + 4, 1) !=
        MS_OK)
        return;
    c->n_text += ms_cli_utf8_push(&c->utf8, bytes, n, c->text + c->n_text);
}

static void text_flush(srv_choice *c) {
    if (ms_grow((void **)&c->text, &c->cap_text, c->n_text + 4, 1) != MS_OK)
        return;
    c->n_text += ms_cli_utf8_flush(&c->utf8, c->text + c->n_text);
}

/* Decode id onto c's text (a special token of a tokenizer.json prints nothing). */
static void decode_id(srv *s, srv_choice *c, int32_t id) {
    if (s->tok.l2c != NULL) {
        const char *piece = ms_llama2c_tok_decode(s->tok.l2c, c->prev, id);
        if (ms_llama2c_tok_piece_printable(piece))
            text_push(c, piece, strlen(piece));
        c->prev = id;
    } else if (s->tok.hf != NULL) {
        if (ms_tok_hf_is_special(s->tok.hf, id))
            return;
        size_t len;
        const char *b = ms_tok_hf_token_bytes(s->tok.hf, id, &len);
        if (b != NULL)
            text_push(c, b, len);
    }
}

/* Stream what c may send now; a finished choice sends its last chunk. */
static void choice_emit(srv_choice *c, bool final) {
    srv_job *j = c->job;
    if (!j->stream)
        return;
    if (j->chat && !c->role_sent) { /* the first chunk: {"role": "assistant", "content": ""} */
        json_t *arr = json_array();
        json_array_append_new(arr, choice_json(j, c, "", 0, NULL, 0, NULL, 0, 0, false));
        json_t *o = completion_json(j, arr);
        if (o != NULL && j->include_usage)
            json_object_set_new(o, "usage", json_null());
        sse_event(j, o);
        c->role_sent = true;
    }
    if (j->plp_top >= 0 && c->plp == NULL && !final)
        return; /* prompt logprobs go first: the prefill has not made them yet */
    if (c->echo != NULL && !c->echo_sent) { /* echo: the prompt's text is the first chunk */
        json_t *arr = json_array();
        json_array_append_new(arr, choice_json(j, c, c->echo, c->n_echo, NULL, 0, NULL, 0, 0,
                                               !c->plp_sent));
        c->plp_sent = true;
        json_t *o = completion_json(j, arr);
        if (o != NULL && j->include_usage)
            json_object_set_new(o, "usage", json_null());
        sse_event(j, o);
        c->echo_sent = true;
    }
    size_t safe = final ? c->n_text : c->n_text - stop_holdback(j, c->text, c->n_sent, c->n_text);
    safe = MS_MAX(safe, c->n_sent);
    bool any = safe > c->n_sent || c->n_ids_new > 0;
    /* chat: the content pieces, then a last chunk with an empty delta and the finish_reason */
    for (int part = 0; part < 2 && (any || final); part++) {
        bool last = j->chat ? part == 1 : final;
        if (j->chat && (part == 0 ? !any : !final))
            continue;
        if (!j->chat && part == 1)
            break;
        json_t *arr = json_array();
        size_t n = j->chat && part == 1 ? 0 : safe - c->n_sent;
        json_array_append_new(arr, choice_json(j, c, c->text != NULL ? c->text + c->n_sent : "",
                                               n, c->ids_new, c->n_ids_new,
                                               last ? c->finish : NULL, c->n_lps_sent, c->n_lps,
                                               !c->plp_sent));
        c->plp_sent = true;
        json_t *o = completion_json(j, arr);
        if (o != NULL && j->include_usage)
            json_object_set_new(o, "usage", json_null());
        sse_event(j, o);
        c->n_sent = safe;
        c->n_ids_new = 0;
        c->n_lps_sent = c->n_lps;
    }
}

/* The job's stream ends: the usage chunk (stream_options.include_usage) and [DONE]. */
static void job_end_stream(srv_job *j) {
    if (j->stream && !j->sse_end) {
        if (j->include_usage && j->fail_status == 0) {
            json_t *o = completion_json(j, json_array());
            if (o != NULL)
                json_object_set_new(o, "usage", usage_json(j));
            sse_event(j, o);
        }
        sse_append(j, "data: [DONE]\n\n", 14);
        j->sse_end = true;
    }
}

/* c leaves the engine (under mu): remove, count, wake the handler. */
static void choice_finish(srv *s, srv_choice *c, int32_t slot) {
    srv_job *j = c->job;
    ms_engine_remove(s->eng, c->rid);
    s->run[slot] = s->run[--s->n_run];
    c->state = CH_DONE;
    s->gen_tokens += (uint64_t)c->n_gen;
    j->n_done++;
    if (j->n_done == j->n_ch)
        job_end_stream(j);
    pthread_cond_broadcast(&j->cv);
    job_release_sched(j);
}

static void job_fail(srv_job *j, unsigned status, const char *msg);
/* [pd] prefill/decode roles (docs/pd.md), defined at the end of the file */
static bool pd_harvest_prefill(srv *s, srv_choice *c, int32_t n, ms_finish_reason why);
static ms_status pd_admit_choice(srv *s, srv_choice *c, ms_error *err);

/* The logprobs of c's one new id out[n - 1] from the last step's logits, the row it was sampled
   from (penalties applied: sample_res mixes them into the host logits before sampling). false
   with why[] set when they cannot be had. */
static bool take_logprobs(srv *s, srv_choice *c, const int32_t *out, int32_t n, char *why,
                          size_t cap) {
    srv_job *j = c->job;
    if (n - c->n_seen != 1) {
        snprintf(why, cap, "logprobs need one token per step, and this model made %d in one",
                 (int)(n - c->n_seen));
        return false;
    }
    const float *z = ms_engine_last_logits(s->eng, c->rid);
    if (z == NULL || ms_grow((void **)&c->lps, &c->cap_lps, c->n_lps + 1, sizeof *c->lps) != MS_OK) {
        snprintf(why, cap, "%s", z == NULL ? "logprobs: the step's logits are gone" : "out of memory");
        return false;
    }
    srv_lp *e = &c->lps[c->n_lps];
    memset(e, 0, sizeof *e);
    e->id = out[n - 1];
    e->prev = n >= 2 ? out[n - 2] : c->prompt[c->n_prompt - 1];
    e->offset = c->n_text;
    ms_sample_row row = {.params = j->sampling, .draw = 0, .min_p = j->extra.min_p};
    ms_error err = {0};
    if (ms_sampler_logprobs(z, s->fa.vocab, &row, s->lp_scratch, e->id, j->logprobs, &e->lp,
                            e->top_ids, e->top_lps, &e->n_top, &err) != MS_OK) {
        snprintf(why, cap, "logprobs: %s", err.msg);
        return false;
    }
    c->n_lps++;
    return true;
}

/* Take c's new output ids (under mu); true when it is finished. */
static bool choice_harvest(srv *s, srv_choice *c) {
    srv_job *j = c->job;
    const int32_t *out;
    int32_t n;
    ms_finish_reason why;
    if (ms_engine_output(s->eng, c->rid, &out, &n, &why) != MS_OK) {
        c->finish = "error";
        return true;
    }
    if (j->pd_prefill) /* [pd] */
        return pd_harvest_prefill(s, c, n, why);
    if (j->plp_top >= 0 && c->plp == NULL) { /* prompt logprobs, once the prefill made them */
        const ms_engine_prompt_logprob *lp;
        int32_t n_lp = 0;
        if (ms_engine_prompt_logprobs(s->eng, c->rid, &lp, &n_lp) == MS_OK &&
            n_lp == c->n_prompt) {
            c->plp = ms_malloc((size_t)n_lp * sizeof *c->plp);
            if (c->plp == NULL) {
                job_fail(j, 500, "out of memory for prompt logprobs");
                c->finish = "error";
                return true;
            }
            memcpy(c->plp, lp, (size_t)n_lp * sizeof *c->plp);
        } else if (why != MS_FINISH_NONE) {
            job_fail(j, 500, "the prompt logprobs were not computed");
            c->finish = "error";
            return true;
        }
    }
    bool stopped = false;
    if (n > c->n_seen) {
        double t = now_s();
        if (c->n_seen == 0)
            hist_observe(&s->ttft, t - j->t_arrival);
        else
            hist_observe(&s->itl, (t - c->t_last) / (double)(n - c->n_seen));
        c->t_last = t;
        char fail[MS_ERROR_MSG_MAX + 32] = "";
        ms_error err = {0};
        /* penalties: the sampler's history learns the new ids before the next step (a finished
           request's sampler state is gone with its other resources) */
        if (j->has_extra && why == MS_FINISH_NONE &&
            ms_sample_res_observe(ms_engine_sampler(s->eng), c->rid, out + c->n_seen,
                                  n - c->n_seen, false, &err) != MS_OK)
            snprintf(fail, sizeof fail, "%s", err.msg);
        if (fail[0] == '\0' && j->logprobs >= 0)
            take_logprobs(s, c, out, n, fail, sizeof fail);
        if (fail[0] != '\0') {
            srv_log(s, "%s: %s", j->id, fail);
            job_fail(j, 500, fail);
            c->finish = "error";
            return true;
        }
    }
    for (int32_t k = c->n_seen; k < n && !stopped; k++) {
        c->n_gen = k + 1;
        if (!s->has_tok) { /* ids out, the eos id included (as generate prints ids) */
            if (ms_grow((void **)&c->ids_new, &c->cap_ids_new, c->n_ids_new + 1,
                        sizeof *c->ids_new) == MS_OK)
                c->ids_new[c->n_ids_new++] = out[k];
            continue;
        }
        if (k == n - 1 && why == MS_FINISH_EOS)
            break; /* the eos id is counted, not printed */
        if (out[k] == j->stop_id) { /* chat: the template's eos ends the turn (counted) */
            text_flush(c);
            stopped = true;
            break;
        }
        size_t before = c->n_text;
        decode_id(s, c, out[k]);
        /* the earliest stop string the new bytes complete: the text ends before it */
        size_t best = SIZE_MAX;
        for (int32_t q = 0; q < j->n_stops; q++) {
            size_t sl = strlen(j->stops[q]);
            size_t from = before >= sl - 1 ? before - (sl - 1) : 0;
            if (c->n_text < from + sl)
                continue;
            const char *hit = memmem(c->text + from, c->n_text - from, j->stops[q], sl);
            if (hit != NULL)
                best = MS_MIN(best, (size_t)(hit - c->text));
        }
        if (best != SIZE_MAX) {
            c->n_text = best;
            memset(&c->utf8, 0, sizeof c->utf8);
            stopped = true;
        }
    }
    c->n_seen = n;
    if (stopped)
        c->finish = "stop";
    else if (why == MS_FINISH_EOS)
        c->finish = "stop";
    else if (why == MS_FINISH_LENGTH || why == MS_FINISH_CONTEXT)
        c->finish = "length";
    else if (why == MS_FINISH_ERROR)
        c->finish = "error";
    bool done = c->finish != NULL;
    if (done && !stopped)
        text_flush(c);
    choice_emit(c, done);
    return done;
}

/* Fail a job that is not streaming yet (under mu): its handler replies `status`. */
static void job_fail(srv_job *j, unsigned status, const char *msg) {
    if (j->fail_status == 0) {
        j->fail_status = status;
        snprintf(j->fail_msg, sizeof j->fail_msg, "%s", msg);
    }
    if (j->stream && j->n_admitted > 0) {
        json_t *e = json_pack("{s:{s:s, s:s, s:n, s:n}}", "error", "message", msg, "type",
                              status >= 500 ? "server_error" : "invalid_request_error", "param",
                              "code");
        sse_event(j, e);
        sse_append(j, "data: [DONE]\n\n", 14);
        j->sse_end = true;
    }
    pthread_cond_broadcast(&j->cv);
}

static void sched_publish(srv *s) {
    s->kv_free = ms_engine_kv_pages_free(s->eng);
    ms_engine_prefix_stats(s->eng, &s->pstats);
    ms_engine_get_kv_stats(s->eng, &s->kv);
    ms_engine_get_fork_stats(s->eng, &s->forks);
}

static void *sched_main(void *arg) {
    srv *s = arg;
    const char *delay_env = getenv("MS_SERVE_STEP_DELAY_MS"); /* tests: slow steps */
    long delay_ms = delay_env != NULL ? atol(delay_env) : 0;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        /* requests of aborted or failed jobs leave at the step boundary */
        for (int32_t i = s->n_run - 1; i >= 0; i--) {
            srv_choice *c = s->run[i];
            if (c->job->aborted || c->job->fail_status != 0 || s->stopping) {
                if (s->stopping && !c->job->aborted)
                    job_fail(c->job, 503, "the server is shutting down");
                c->finish = c->finish != NULL ? c->finish : "abort";
                choice_finish(s, c, i);
            }
        }
        /* continuous batching: queued requests join at the step boundary */
        while (s->q_head != NULL && (s->n_run < s->o.max_seqs || s->stopping)) {
            srv_choice *c = s->q_head;
            s->q_head = c->next_q;
            if (s->q_head == NULL)
                s->q_tail = NULL;
            s->n_queued--;
            srv_job *j = c->job;
            if (s->stopping || j->aborted || j->fail_status != 0) {
                if (s->stopping)
                    job_fail(j, 503, "the server is shutting down");
                c->state = CH_DONE;
                job_release_sched(j);
                continue;
            }
            ms_engine_request rq = {.prompt = c->prompt,
                                    .n_prompt = c->n_prompt,
                                    .max_new_tokens = j->max_tokens,
                                    .sampling = j->sampling,
                                    .ignore_eos = j->ignore_eos};
            rq.sampling.seed = c->seed;
            ms_error err = {0};
            /* choice k > 0 of a prompt forks from choice 0 while that one is in the engine: one
               prefill, the prompt's KV pages shared (engine.h ms_engine_fork); a model that
               cannot fork (several nodes) adds the choice as a request of its own */
            const srv_choice *first = &j->ch[c->index - c->index % j->n];
            ms_status st = MS_ERR_UNSUPPORTED;
            if (j->plp_top >= 0) { /* prompt logprobs: every choice computes its prompt */
                rq.prompt_logprobs = true;
                rq.prompt_top_logprobs = j->plp_top;
            } else if (first != c && first->state == CH_RUNNING) {
                st = ms_engine_fork(s->eng, first->rid, &rq, &c->rid, &err);
            }
            if (c->pd_rec != NULL) /* [pd] prefilled by the peer: decode it here */
                st = pd_admit_choice(s, c, &err);
            else if (st == MS_ERR_UNSUPPORTED)
                st = ms_engine_add(s->eng, &rq, &c->rid, &err);
            if (st == MS_OK && j->has_extra) { /* min_p, penalties: the sampler resource's */
                ms_sample_res *sr = ms_engine_sampler(s->eng);
                st = ms_sample_res_set_extra(sr, c->rid, &j->extra, &err);
                if (st == MS_OK)
                    st = ms_sample_res_observe(sr, c->rid, c->prompt, c->n_prompt, true, &err);
                if (st != MS_OK)
                    ms_engine_remove(s->eng, c->rid);
            }
            if (st != MS_OK) {
                srv_log(s, "%s: cannot add the request: %s", j->id, err.msg);
                /* a request the KV arena can never hold (engine.h ms_engine_add): the
                   client's to change, 400 like a prompt over the context */
                job_fail(j, st == MS_ERR_CAPACITY || st == MS_ERR_LIMIT ? 400 : 500, err.msg);
                c->state = CH_DONE;
                job_release_sched(j);
                continue;
            }
            c->state = CH_RUNNING;
            c->prev = c->prompt[c->n_prompt - 1];
            s->run[s->n_run++] = c;
            s->prompt_tokens += (uint64_t)c->n_prompt;
            j->n_admitted++;
            pthread_cond_broadcast(&j->cv);
        }
        for (int32_t i = s->n_run - 1; i >= 0; i--) /* max_tokens 0 finishes at once */
            if (choice_harvest(s, s->run[i]))
                choice_finish(s, s->run[i], i);
        sched_publish(s);
        if (s->stopping && s->n_run == 0 && s->q_head == NULL)
            break;
        if (s->n_run == 0) {
            pthread_cond_wait(&s->cv, &s->mu);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        ms_error err = {0};
        ms_status st = ms_engine_step(s->eng, NULL, &err);
        if (delay_ms > 0)
            nanosleep(&(struct timespec){delay_ms / 1000, (delay_ms % 1000) * 1000000L}, NULL);
        pthread_mutex_lock(&s->mu);
        if (st != MS_OK) {
            srv_log(s, "step failed: %s", err.msg);
            for (int32_t i = s->n_run - 1; i >= 0; i--) {
                job_fail(s->run[i]->job, 500, err.msg);
                s->run[i]->finish = "error";
                choice_finish(s, s->run[i], i);
            }
            continue;
        }
        for (int32_t i = s->n_run - 1; i >= 0; i--)
            if (choice_harvest(s, s->run[i]))
                choice_finish(s, s->run[i], i);
    }
    sched_publish(s);
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- HTTP replies ---- */

static enum MHD_Result reply_raw(struct MHD_Connection *con, unsigned status, const char *type,
                                 const char *body, size_t n) {
    struct MHD_Response *r =
        MHD_create_response_from_buffer(n, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (r == NULL)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result ret = MHD_queue_response(con, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result reply_json(struct MHD_Connection *con, unsigned status, json_t *o) {
    char *body = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (body == NULL) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":"
                                  "\"server_error\",\"param\":null,\"code\":null}}";
        return reply_raw(con, 500, "application/json", oom, sizeof oom - 1);
    }
    enum MHD_Result ret = reply_raw(con, status, "application/json", body, strlen(body));
    free(body);
    return ret;
}

/* OpenAI's error body: {"error": {"message", "type", "param", "code"}}. */
static enum MHD_Result reply_error(srv *s, struct MHD_Connection *con, unsigned status,
                                   const char *param, const char *code, const char *fmt, ...)
    MS_PRINTF(6, 7);
static enum MHD_Result reply_error(srv *s, struct MHD_Connection *con, unsigned status,
                                   const char *param, const char *code, const char *fmt, ...) {
    pthread_mutex_lock(&s->mu);
    s->n_error++;
    pthread_mutex_unlock(&s->mu);
    ms_serve_error e = {.status = status, .param = param, .code = code};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.msg, sizeof e.msg, fmt, ap);
    va_end(ap);
    json_t *o = ms_serve_error_json(&e);
    return reply_json(con, status, o);
}

/* ---- requests: serve_request.h parses, the job takes its prompts ---- */

static ms_status srv_encode(void *user, const char *text, bool add_special, int32_t **ids,
                            size_t *n, ms_error *err) {
    srv *s = user;
    if (add_special) { /* as generate: llama2.c with BOS; tokenizer.json its post-processor */
        if (ms_cli_tok_encode(&s->tok, text, "prompt", ids, n) != 0)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "the tokenizer refused the text");
        return MS_OK;
    }
    if (s->tok.hf != NULL)
        return ms_tok_hf_encode(s->tok.hf, text, strlen(text), false, ids, n, err);
    return ms_llama2c_tok_encode(s->tok.l2c, text, false, false, ids, n, err);
}

static ms_status srv_render(void *user, json_t *messages, char **text, ms_error *err) {
    srv *s = user;
    return ms_chat_template_render(s->tmpl, messages, true, s->bos_tok, s->eos_tok, text, err);
}

static void srv_parse_log(void *user, const char *msg) { srv_log(user, "%s", msg); }

/* The parser's view of this server. */
static ms_serve_ctx srv_parse_ctx(srv *s) {
    ms_serve_ctx c = {
        .model_name = s->name,
        .vocab = s->fa.vocab,
        .max_context = s->fa.max_context,
        .max_prompts = s->o.max_queue,
        .max_body = SRV_MAX_BODY,
        .caps = SRV_CAPS | (s->o.prompt_logprobs_rows > 0 ? MS_SERVE_CAP_PROMPT_LOGPROBS : 0u),
        .defaults = {s->fa.temperature, s->fa.top_k, s->fa.top_p, 0},
        .encode = s->has_tok ? srv_encode : NULL,
        .render_chat = s->tmpl != NULL ? srv_render : NULL,
        .chat_why = s->tmpl_why,
        .log = srv_parse_log,
        .user = s,
    };
    return c;
}

/* Echo of choice c's prompt p (handler thread; the tokenizers are thread-safe): the text as
   given, else c's prompt ids decoded; without a tokenizer the ids lead token_ids. false: out of
   memory */
static bool choice_echo(srv *s, srv_choice *c, const ms_serve_prompt *p) {
    if (!s->has_tok) {
        if (ms_grow((void **)&c->ids_new, &c->cap_ids_new, (size_t)c->n_prompt,
                    sizeof *c->ids_new) != MS_OK)
            return false;
        memcpy(c->ids_new, c->prompt, (size_t)c->n_prompt * sizeof *c->prompt);
        c->n_ids_new = (size_t)c->n_prompt;
        return true;
    }
    if (p->text != NULL) {
        c->n_echo = strlen(p->text);
        c->echo = ms_strdup(p->text);
        return c->echo != NULL;
    }
    /* decode into c->text, then move it to echo; llama2.c: a leading BOS (id 1) prints nothing
       (tokenizer_llama2c.h decodes from the id after it) */
    int32_t from = s->tok.l2c != NULL && c->prompt[0] == 1 ? 1 : 0;
    for (int32_t i = from; i < c->n_prompt; i++) {
        c->prev = i > 0 ? c->prompt[i - 1] : 1;
        decode_id(s, c, c->prompt[i]);
    }
    text_flush(c);
    c->echo = c->text != NULL ? c->text : ms_strdup("");
    c->n_echo = c->n_text;
    c->text = NULL;
    c->n_text = c->cap_text = 0;
    memset(&c->utf8, 0, sizeof c->utf8);
    return c->echo != NULL;
}

/* A job (ms_calloc'd, cv set up) from a parsed request; takes the request's prompts and stops.
   NULL out of memory.
   n > 1: choice 0 of a prompt is an engine request; choices 1 .. n - 1 fork from it
   (ms_engine_fork, at admission): one prefill of the prompt, its full KV pages shared, each
   choice with its own sampler state. Choice k of a prompt samples with seed + k, so a seeded
   request's choices differ and each is reproducible (and equal to a request of seed + k). */
static srv_job *job_from_request(srv *s, ms_serve_request *r) {
    srv_job *j = ms_calloc(1, sizeof *j);
    size_t n_ch = (size_t)r->n_prompts * (size_t)r->n;
    if (j == NULL || (j->ch = ms_calloc(n_ch, sizeof *j->ch)) == NULL) {
        ms_free(j);
        return NULL;
    }
    pthread_cond_init(&j->cv, NULL);
    j->s = s;
    j->chat = r->chat;
    j->n_ch = (int32_t)n_ch;
    j->n = r->n;
    j->sampling = r->sampling;
    j->extra = (ms_sample_extra){r->min_p,
                                 {r->presence_penalty, r->frequency_penalty, r->repetition_penalty}};
    j->has_extra = r->min_p > 0.0f || !ms_sampler_penalties_off(&j->extra.penalties);
    j->logprobs = r->logprobs;
    j->prompt_logprobs = r->prompt_logprobs;
    j->echo_lp = r->echo && r->logprobs >= 0;
    j->plp_top = MS_MAX(r->prompt_logprobs, j->echo_lp ? r->logprobs : -1);
    j->max_tokens = r->max_tokens;
    j->ignore_eos = r->ignore_eos;
    j->stream = r->stream;
    j->include_usage = r->include_usage;
    j->stop_id = r->chat && !r->ignore_eos ? s->chat_eos_id : -1;
    for (int32_t i = 0; i < r->n_stops; i++) {
        j->stops[i] = r->stops[i];
        r->stops[i] = NULL;
    }
    j->n_stops = r->n_stops;
    for (size_t i = 0; i < n_ch; i++) {
        j->ch[i].job = j;
        j->ch[i].index = (int32_t)i;
        ms_serve_prompt *p = &r->prompts[i / (size_t)r->n];
        j->ch[i].seed = r->sampling.seed + (uint64_t)(i % (size_t)r->n);
        j->ch[i].n_prompt = p->n;
        if (i % (size_t)r->n == 0) { /* the first choice of a prompt takes its ids */
            j->ch[i].prompt = p->ids;
            p->ids = NULL;
        } else {
            j->ch[i].prompt = ms_malloc((size_t)p->n * sizeof *j->ch[i].prompt);
            if (j->ch[i].prompt != NULL)
                memcpy(j->ch[i].prompt, j->ch[i - (i % (size_t)r->n)].prompt,
                       (size_t)p->n * sizeof *j->ch[i].prompt);
        }
        if (j->ch[i].prompt == NULL || (r->echo && !choice_echo(s, &j->ch[i], p))) {
            job_free(j);
            return NULL;
        }
    }
    return j;
}

/* ---- connections ---- */

typedef struct srv_conn {
    char *body;                 /* [n] bytes (ms_malloc'd) */
    size_t n, cap;
    bool too_big;
} srv_conn;

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    srv_job *j = cls;
    pthread_mutex_lock(&j->s->mu);
    while (j->sse_off == j->n_sse && !j->sse_end)
        pthread_cond_wait(&j->cv, &j->s->mu);
    size_t n = MS_MIN(max, j->n_sse - j->sse_off);
    memcpy(buf, j->sse + j->sse_off, n);
    j->sse_off += n;
    pthread_mutex_unlock(&j->s->mu);
    return n > 0 ? (ssize_t)n : MHD_CONTENT_READER_END_OF_STREAM;
}

/* The stream's response is gone (complete, or the client left): drop the handler's reference. */
static void sse_free(void *cls) {
    srv_job *j = cls;
    srv *s = j->s;
    pthread_mutex_lock(&s->mu);
    if (!j->sse_end)
        srv_log(s, "%s: the client went away: aborting its request", j->id);
    job_release_handler(j);
    pthread_mutex_unlock(&s->mu);
}

/* Whether the client closed its end of the connection (it sends nothing more while it waits). */
static bool client_gone(struct MHD_Connection *con) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(con, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci == NULL)
        return false;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0)
        return false;
    if (p.revents & (POLLRDHUP | POLLHUP | POLLERR))
        return true;
    char c;
    return (p.revents & POLLIN) && recv(ci->connect_fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

static unsigned pd_prefill_check(srv_job *j, char *msg, size_t cap);            /* [pd] */
static unsigned pd_fetch_records(srv *s, srv_job *j, char *msg, size_t cap);    /* [pd] */
static enum MHD_Result pd_reply_record(srv *s, struct MHD_Connection *con, srv_job *j);
static int pd_check_opts(srv_opts *o, const char *prog);                       /* [pd] */

static enum MHD_Result handle_completion_pd(srv *s, struct MHD_Connection *con, srv_conn *cc,
                                            bool chat, bool pd_prefill) {
    ms_serve_ctx pc = srv_parse_ctx(s);
    ms_serve_request *rq = NULL;
    ms_serve_error e;
    if (ms_serve_request_parse(&pc, cc->body, cc->n, chat, &rq, &e) != MS_OK)
        return reply_error(s, con, e.status, e.param, e.code, "%s", e.msg);
    srv_job *j = job_from_request(s, rq);
    ms_serve_request_free(rq);
    if (j == NULL)
        return reply_error(s, con, 500, NULL, NULL, "out of memory");
    { /* [pd] a prefill for the decode peer, or a decode server asking its peer */
        unsigned pst = 0;
        char pmsg[MS_ERROR_MSG_MAX + 64] = "";
        if (pd_prefill)
            pst = pd_prefill_check(j, pmsg, sizeof pmsg);
        else if (s->o.role != NULL && strcmp(s->o.role, "decode") == 0)
            pst = pd_fetch_records(s, j, pmsg, sizeof pmsg);
        if (pst != 0) {
            job_free(j);
            return reply_error(s, con, pst, NULL, NULL, "%s", pmsg);
        }
    }
    pthread_mutex_lock(&s->mu);
    if (s->stopping || s->n_queued + j->n_ch > s->o.max_queue) {
        bool stopping = s->stopping;
        pthread_mutex_unlock(&s->mu);
        job_free(j);
        return stopping ? reply_error(s, con, 503, NULL, NULL, "the server is shutting down")
                        : reply_error(s, con, 429, NULL, "queue_full",
                                      "the queue is full (%d requests waiting; --max-queue): "
                                      "retry later",
                                      (int)s->o.max_queue);
    }
    snprintf(j->id, sizeof j->id, "%s-%llu", chat ? "chatcmpl" : "cmpl",
             (unsigned long long)++s->next_id);
    j->enqueued = true;
    s->n_jobs++;
    j->created = (long long)time(NULL);
    j->t_arrival = now_s();
    for (int32_t i = 0; i < j->n_ch; i++) {
        srv_choice *c = &j->ch[i];
        if (s->q_tail != NULL)
            s->q_tail->next_q = c;
        else
            s->q_head = c;
        s->q_tail = c;
        s->n_queued++;
        j->sched_refs++;
    }
    pthread_cond_signal(&s->cv);
    /* a stream starts once its first prompt runs; a plain reply waits for all of them, watching
       the client's socket meanwhile: a client that hung up aborts its job */
    while (j->fail_status == 0 && (j->stream ? j->n_admitted == 0 : j->n_done < j->n_ch)) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_nsec += 100 * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        if (pthread_cond_timedwait(&j->cv, &s->mu, &until) == ETIMEDOUT && client_gone(con)) {
            srv_log(s, "%s: the client went away: aborting its request", j->id);
            job_release_handler(j);
            pthread_mutex_unlock(&s->mu);
            return MHD_NO; /* close the connection */
        }
    }
    if (j->fail_status != 0) {
        unsigned st = j->fail_status;
        char msg[256];
        snprintf(msg, sizeof msg, "%s", j->fail_msg);
        j->counted = true; /* as the error reply */
        job_release_handler(j);
        pthread_mutex_unlock(&s->mu);
        return reply_error(s, con, st, NULL, NULL, "%s", msg);
    }
    if (j->pd_prefill) /* [pd] the record's bytes */
        return pd_reply_record(s, con, j);
    if (j->stream) {
        pthread_mutex_unlock(&s->mu);
        struct MHD_Response *r =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, sse_read, j, sse_free);
        if (r == NULL) {
            pthread_mutex_lock(&s->mu);
            job_release_handler(j);
            pthread_mutex_unlock(&s->mu);
            return MHD_NO;
        }
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        enum MHD_Result ret = MHD_queue_response(con, 200, r);
        MHD_destroy_response(r); /* the free callback runs once the connection is done with it */
        return ret;
    }
    json_t *arr = json_array();
    for (int32_t i = 0; i < j->n_ch; i++) {
        srv_choice *c = &j->ch[i];
        /* echo: the prompt's text first */
        char *full = c->echo != NULL ? ms_malloc(c->n_echo + c->n_text + 1) : NULL;
        if (full != NULL) { /* bytes, not %s: decoded text may hold NUL bytes */
            memcpy(full, c->echo, c->n_echo);
            if (c->n_text > 0)
                memcpy(full + c->n_echo, c->text, c->n_text);
        }
        if (full != NULL)
            json_array_append_new(arr, choice_json(j, c, full, c->n_echo + c->n_text, c->ids_new,
                                                   c->n_ids_new, c->finish, 0, c->n_lps, true));
        else
            json_array_append_new(arr, choice_json(j, c, c->text != NULL ? c->text : "",
                                                   c->n_text, c->ids_new, c->n_ids_new,
                                                   c->finish, 0, c->n_lps, true));
        ms_free(full);
    }
    json_t *o = completion_json(j, arr);
    if (o != NULL)
        json_object_set_new(o, "usage", usage_json(j));
    job_release_handler(j);
    pthread_mutex_unlock(&s->mu);
    return reply_json(con, 200, o);
}

static enum MHD_Result handle_models(srv *s, struct MHD_Connection *con, const char *which) {
    json_t *m = json_pack("{s:s, s:s, s:I, s:s, s:i}", "id", s->name, "object", "model",
                          "created", (json_int_t)0, "owned_by", "mstar", "max_model_len",
                          (int)s->fa.max_context);
    if (which != NULL) {
        if (strcmp(which, s->name) != 0) {
            json_decref(m);
            return reply_error(s, con, 404, "model", "model_not_found",
                               "the model '%.200s' does not exist", which);
        }
        return reply_json(con, 200, m);
    }
    return reply_json(con, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", m));
}

static enum MHD_Result handle_metrics(srv *s, struct MHD_Connection *con) {
    pthread_mutex_lock(&s->mu);
    char *t = ms_asprintf(
        "# HELP mstar_requests_total Completion requests by outcome.\n"
        "# TYPE mstar_requests_total counter\n"
        "mstar_requests_total{outcome=\"success\"} %llu\n"
        "mstar_requests_total{outcome=\"error\"} %llu\n"
        "mstar_requests_total{outcome=\"aborted\"} %llu\n"
        "# HELP mstar_prompt_tokens_total Prompt tokens admitted.\n"
        "# TYPE mstar_prompt_tokens_total counter\n"
        "mstar_prompt_tokens_total %llu\n"
        "# HELP mstar_generation_tokens_total Tokens generated.\n"
        "# TYPE mstar_generation_tokens_total counter\n"
        "mstar_generation_tokens_total %llu\n"
        "# HELP mstar_requests_running Requests (prompts) in the engine.\n"
        "# TYPE mstar_requests_running gauge\n"
        "mstar_requests_running %d\n"
        "# HELP mstar_queue_depth Prompts waiting to join the engine.\n"
        "# TYPE mstar_queue_depth gauge\n"
        "mstar_queue_depth %d\n"
        "# HELP mstar_kv_pages_free KV pages free.\n"
        "# TYPE mstar_kv_pages_free gauge\n"
        "mstar_kv_pages_free %d\n"
        "# HELP mstar_kv_pages_used KV pages held by requests.\n"
        "# TYPE mstar_kv_pages_used gauge\n"
        "mstar_kv_pages_used %d\n"
        "# HELP mstar_kv_pages_cached KV pages the prefix cache lists (counted as free when only "
        "it holds them).\n"
        "# TYPE mstar_kv_pages_cached gauge\n"
        "mstar_kv_pages_cached %d\n"
        "# HELP mstar_prefix_cache_lookups_total Prompts looked up in the prefix cache.\n"
        "# TYPE mstar_prefix_cache_lookups_total counter\n"
        "mstar_prefix_cache_lookups_total %llu\n"
        "# HELP mstar_prefix_cache_hit_tokens_total Prompt tokens served from the prefix cache.\n"
        "# TYPE mstar_prefix_cache_hit_tokens_total counter\n"
        "mstar_prefix_cache_hit_tokens_total %llu\n"
        "# HELP mstar_prefix_cache_evictions_total Cached pages evicted to make room.\n"
        "# TYPE mstar_prefix_cache_evictions_total counter\n"
        "mstar_prefix_cache_evictions_total %llu\n"
        "# HELP mstar_kv_pages_offloaded KV pages in the host tier now (--host-kv-pages).\n"
        "# TYPE mstar_kv_pages_offloaded gauge\n"
        "mstar_kv_pages_offloaded %d\n"
        "# HELP mstar_kv_host_pages_free Host-tier KV pages free.\n"
        "# TYPE mstar_kv_host_pages_free gauge\n"
        "mstar_kv_host_pages_free %d\n"
        "# HELP mstar_kv_requests_offloaded Requests whose KV is in the host tier now.\n"
        "# TYPE mstar_kv_requests_offloaded gauge\n"
        "mstar_kv_requests_offloaded %d\n"
        "# HELP mstar_kv_offloads_total Requests moved to the host tier when pages ran short.\n"
        "# TYPE mstar_kv_offloads_total counter\n"
        "mstar_kv_offloads_total %lld\n"
        "# HELP mstar_kv_offloaded_pages_total Device KV pages freed by offloads.\n"
        "# TYPE mstar_kv_offloaded_pages_total counter\n"
        "mstar_kv_offloaded_pages_total %lld\n"
        "# HELP mstar_kv_reloads_total Offloaded requests brought back.\n"
        "# TYPE mstar_kv_reloads_total counter\n"
        "mstar_kv_reloads_total %lld\n"
        "# HELP mstar_kv_preemptions_total Recompute-preemptions (KV dropped, re-prefilled).\n"
        "# TYPE mstar_kv_preemptions_total counter\n"
        "mstar_kv_preemptions_total %lld\n"
        "# HELP mstar_kv_forks_total Choices (n > 1) whose prompt KV was forked from choice 0.\n"
        "# TYPE mstar_kv_forks_total counter\n"
        "mstar_kv_forks_total %lld\n"
        "# HELP mstar_kv_fork_pages_shared_total Full KV pages forks shared by reference.\n"
        "# TYPE mstar_kv_fork_pages_shared_total counter\n"
        "mstar_kv_fork_pages_shared_total %lld\n"
        "# HELP mstar_kv_fork_tokens_shared_total Prompt tokens forks did not compute again.\n"
        "# TYPE mstar_kv_fork_tokens_shared_total counter\n"
        "mstar_kv_fork_tokens_shared_total %lld\n",
        (unsigned long long)s->n_success, (unsigned long long)s->n_error,
        (unsigned long long)s->n_aborted, (unsigned long long)s->prompt_tokens,
        (unsigned long long)s->gen_tokens, (int)s->n_run, (int)s->n_queued, (int)s->kv_free,
        (int)(s->kv_total - s->kv_free), (int)s->pstats.entries,
        (unsigned long long)s->pstats.lookups, (unsigned long long)s->pstats.hit_tokens,
        (unsigned long long)s->pstats.evictions, (int)(s->kv.host_pages - s->kv.host_pages_free),
        (int)s->kv.host_pages_free, (int)s->kv.n_offloaded, (long long)s->kv.offloads,
        (long long)s->kv.pages_offloaded, (long long)s->kv.reloads,
        (long long)s->kv.preemptions, (long long)s->forks.forks,
        (long long)s->forks.pages_shared, (long long)s->forks.tokens_shared);
    const srv_hist *hs[2] = {&s->ttft, &s->itl};
    static const char *const hname[2] = {"mstar_time_to_first_token_seconds",
                                         "mstar_inter_token_latency_seconds"};
    static const char *const hhelp[2] = {"From the request's arrival to its first token.",
                                         "Between consecutive tokens of a request."};
    for (int h = 0; h < 2 && t != NULL; h++) {
        char *u = ms_asprintf("%s# HELP %s %s\n# TYPE %s histogram\n", t, hname[h], hhelp[h],
                              hname[h]);
        uint64_t cum = 0;
        for (int b = 0; b <= SRV_N_BUCKETS && u != NULL; b++) {
            cum += hs[h]->n[b];
            char le[32];
            if (b < SRV_N_BUCKETS)
                snprintf(le, sizeof le, "%g", srv_buckets[b]);
            else
                snprintf(le, sizeof le, "+Inf");
            char *w = ms_asprintf("%s%s_bucket{le=\"%s\"} %llu\n", u, hname[h], le,
                                  (unsigned long long)cum);
            ms_free(u);
            u = w;
        }
        char *w = u == NULL ? NULL
                            : ms_asprintf("%s%s_sum %.6f\n%s_count %llu\n", u, hname[h],
                                          hs[h]->sum, hname[h],
                                          (unsigned long long)hs[h]->count);
        ms_free(u);
        ms_free(t);
        t = w;
    }
    pthread_mutex_unlock(&s->mu);
    if (t == NULL)
        return MHD_NO;
    enum MHD_Result r = reply_raw(con, 200, "text/plain; version=0.0.4", t, strlen(t));
    ms_free(t);
    return r;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *con, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    (void)version;
    srv *s = cls;
    srv_conn *cc = *con_cls;
    bool post = strcmp(method, "POST") == 0;
    if (cc == NULL) {
        cc = ms_calloc(1, sizeof *cc);
        if (cc == NULL)
            return MHD_NO;
        *con_cls = cc;
        const char *cl = MHD_lookup_connection_value(con, MHD_HEADER_KIND, "Content-Length");
        if (post && cl != NULL && strtoull(cl, NULL, 10) > SRV_MAX_BODY) {
            cc->too_big = true;
            return reply_error(s, con, 413, NULL, NULL,
                               "the request body of %.30s bytes is over the limit of %u bytes", cl,
                               SRV_MAX_BODY);
        }
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        size_t n = *upload_data_size;
        *upload_data_size = 0;
        if (cc->too_big || cc->n + n > SRV_MAX_BODY) {
            cc->too_big = true;
            return MHD_YES;
        }
        if (ms_grow((void **)&cc->body, &cc->cap, cc->n + n + 1, 1) != MS_OK)
            return MHD_NO;
        memcpy(cc->body + cc->n, upload_data, n);
        cc->n += n;
        return MHD_YES;
    }
    if (cc->too_big)
        return reply_error(s, con, 413, NULL, NULL, "the request body is over the limit of %u bytes",
                           SRV_MAX_BODY);
    bool v1 = strncmp(url, "/v1/", 4) == 0;
    if (v1 && s->o.api_key != NULL) {
        const char *auth = MHD_lookup_connection_value(con, MHD_HEADER_KIND, "Authorization");
        if (auth == NULL || strncmp(auth, "Bearer ", 7) != 0 ||
            strcmp(auth + 7, s->o.api_key) != 0)
            return reply_error(s, con, 401, NULL, "invalid_api_key",
                               "a valid API key is required (Authorization: Bearer KEY)");
    }
    bool get = strcmp(method, "GET") == 0;
    if (strcmp(url, "/v1/completions") == 0) {
        if (!post)
            return reply_error(s, con, 405, NULL, NULL, "use POST for /v1/completions");
        return handle_completion_pd(s, con, cc, false, false);
    }
    if (strcmp(url, "/v1/chat/completions") == 0) {
        if (!post)
            return reply_error(s, con, 405, NULL, NULL, "use POST for /v1/chat/completions");
        if (!s->has_tok)
            return reply_error(s, con, 501, NULL, "not_implemented",
                               "chat needs a tokenizer and the server has none: use /v1/completions "
                               "with token ids");
        return handle_completion_pd(s, con, cc, true, false);
    }
    if (strcmp(url, "/v1/pd/prefill") == 0 && s->o.role != NULL &&
        strcmp(s->o.role, "prefill") == 0) { /* [pd] the decode peer's prefill */
        if (!post)
            return reply_error(s, con, 405, NULL, NULL, "use POST for /v1/pd/prefill");
        return handle_completion_pd(s, con, cc, false, true);
    }
    if (strcmp(url, "/v1/models") == 0 && get)
        return handle_models(s, con, NULL);
    if (strncmp(url, "/v1/models/", 11) == 0 && get)
        return handle_models(s, con, url + 11);
    if (strcmp(url, "/health") == 0 && get)
        return reply_raw(con, 200, "application/json", "{\"status\":\"ok\"}", 15);
    if (strcmp(url, "/metrics") == 0 && get)
        return handle_metrics(s, con);
    return reply_error(s, con, 404, NULL, NULL, "no such endpoint: %s %.200s", method, url);
}

static void on_completed(void *cls, struct MHD_Connection *con, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)cls;
    (void)con;
    (void)toe;
    srv_conn *cc = *con_cls;
    if (cc != NULL) {
        ms_free(cc->body);
        ms_free(cc);
        *con_cls = NULL;
    }
}

/* ---- flags ---- */

static void serve_usage(FILE *to, const char *prog) {
    fprintf(to,
            "usage: %s serve --model PATH [--tokenizer PATH|none] [--host ADDR] [--port N]\n"
            "           [--api-key KEY] [--max-seqs N] [--max-tokens-per-step N]\n"
            "           [--max-queue N] [--kv-pages N | --gpu-memory-fraction F]\n"
            "           [--host-kv-pages N] [--page-size N]\n"
            "           [--device auto|cpu|cuda] [--dtype auto|f32|bf16] [--threads N]\n"
            "           [--chat-template FILE.jinja|tokenizer_config.json] [--no-graphs]\n"
            "           [--no-prefix-cache] [--prompt-logprobs-rows N] [--tp N]\n"
            "           [--role prefill | --role decode --prefill-url http://HOST:PORT]\n"
            "  OpenAI-compatible HTTP server: POST /v1/completions, /v1/chat/completions (the\n"
            "  chat template: --chat-template, else the tokenizer's or the model folder's\n"
            "  tokenizer_config.json), GET /v1/models, /health, /metrics. --host defaults to\n"
            "  127.0.0.1, --port to 8000 (0: a free port, printed as 'listening on\n"
            "  http://HOST:PORT' on stderr). SIGINT / SIGTERM stop it. When KV pages run\n"
            "  short the least recently used request's KV moves to a host tier of\n"
            "  --host-kv-pages pages (0: none) and back, or is recomputed later;\n"
            "  --gpu-memory-fraction F in (0, 1] sizes the device KV from the memory free\n"
            "  after the weights (cuda; instead of --kv-pages). Prompt logprobs (echo with\n"
            "  logprobs, prompt_logprobs) return up to --prompt-logprobs-rows (64; 0: not\n"
            "  served) prompt rows' logits a step. --role splits prefill from decode\n"
            "  (docs/pd.md): clients talk to the decode server, which has the prefill\n"
            "  server compute each prompt and send back its KV, then decodes it.\n",
            prog);
}

static int parse_serve(int argc, char **argv, srv_opts *o, const char *prog) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8000;
    o->device = "auto";
    o->max_seqs = 16;
    o->max_tokens_per_step = 2048;
    o->max_queue = 256;
    o->prompt_logprobs_rows = 64;
    static const char *const with_value[] = {
        "--model", "--tokenizer", "--host", "--port", "--api-key", "--max-seqs",
        "--max-tokens-per-step", "--device", "--dtype", "--page-size", "--threads",
        "--max-queue", "--kv-pages", "--chat-template", "--host-kv-pages",
        "--gpu-memory-fraction", "--prompt-logprobs-rows", "--tp",
        "--role", "--prefill-url"}; /* [pd] the last two */
    bool seen[MS_ARRAY_LEN(with_value)] = {false};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            serve_usage(stdout, prog);
            return -1;
        }
        if (strcmp(a, "--no-prefix-cache") == 0) {
            o->no_prefix_cache = true;
            continue;
        }
        if (strcmp(a, "--no-graphs") == 0) {
            o->no_graphs = true;
            continue;
        }
        size_t which = MS_ARRAY_LEN(with_value);
        for (size_t k = 0; k < MS_ARRAY_LEN(with_value); k++)
            if (strcmp(a, with_value[k]) == 0)
                which = k;
        if (which == MS_ARRAY_LEN(with_value)) {
            serve_usage(stderr, prog);
            fprintf(stderr, "%s: %s '", prog,
                    strncmp(a, "--", 2) == 0 ? "unknown flag" : "unexpected argument");
            ms_cli_put_escaped(stderr, a, 200);
            fputs("'\n", stderr);
            return 2;
        }
        if (seen[which] || i + 1 >= argc) {
            serve_usage(stderr, prog);
            fprintf(stderr, "%s: flag %s %s\n", prog, a,
                    seen[which] ? "given twice (give each flag once)" : "needs a value");
            return 2;
        }
        seen[which] = true;
        const char *v = argv[++i];
        int64_t n;
        char expect[64];
        if (strcmp(a, "--model") == 0) {
            o->model = v;
        } else if (strcmp(a, "--tokenizer") == 0) {
            o->tokenizer = v;
        } else if (strcmp(a, "--host") == 0) {
            o->host = v;
        } else if (strcmp(a, "--chat-template") == 0) {
            o->chat_template = v;
        } else if (strcmp(a, "--api-key") == 0) {
            if (*v == '\0') {
                fprintf(stderr, "%s: --api-key: the key is empty\n", prog);
                return 1;
            }
            o->api_key = v;
        } else if (strcmp(a, "--port") == 0) {
            if (ms_cli_flag_i64(prog, a, v, 0, 65535, "a port in [0, 65535]", &n) != 0)
                return 1;
            o->port = (int32_t)n;
        } else if (strcmp(a, "--max-seqs") == 0) {
            if (ms_cli_flag_i64(prog, a, v, 1, 4096, "an integer in [1, 4096]", &n) != 0)
                return 1;
            o->max_seqs = (int32_t)n;
        } else if (strcmp(a, "--max-tokens-per-step") == 0) {
            if (ms_cli_flag_i64(prog, a, v, 1, 1 << 20, "an integer in [1, 1048576]", &n) != 0)
                return 1;
            o->max_tokens_per_step = (int32_t)n;
        } else if (strcmp(a, "--max-queue") == 0) {
            if (ms_cli_flag_i64(prog, a, v, 1, 1 << 20, "an integer in [1, 1048576]", &n) != 0)
                return 1;
            o->max_queue = (int32_t)n;
        } else if (strcmp(a, "--kv-pages") == 0) {
            if (ms_cli_flag_i64(prog, a, v, 0, INT32_MAX, "an integer >= 0 (0: enough)", &n) !=
                0)
                return 1;
            o->kv_pages = (int32_t)n;
        } else if (strcmp(a, "--host-kv-pages") == 0) {
            if (ms_cli_flag_i64(prog, a, v, 0, INT32_MAX - 1, "an integer >= 0 (0: no host tier)",
                                &n) != 0)
                return 1;
            o->host_kv_pages = (int32_t)n;
        } else if (strcmp(a, "--prompt-logprobs-rows") == 0) {
            if (ms_cli_flag_i64(prog, a, v, 0, 65536, "an integer in [0, 65536] (0: none)", &n) !=
                0)
                return 1;
            o->prompt_logprobs_rows = (int32_t)n;
        } else if (strcmp(a, "--gpu-memory-fraction") == 0) {
            if (ms_cli_flag_f32(prog, a, v, 0.0, true, 1.0, "a number in (0, 1]",
                                &o->gpu_memory_fraction) != 0)
                return 1;
        } else if (strcmp(a, "--tp") == 0) {
            if (ms_cli_flag_tp(prog, v, &o->tp) != 0)
                return 1;
        } else if (strcmp(a, "--page-size") == 0) {
            if (ms_cli_flag_i64(prog, a, v, 1, 65536, "an integer in [1, 65536]", &n) != 0)
                return 1;
            o->page_size = (int32_t)n;
        } else if (strcmp(a, "--threads") == 0) {
            snprintf(expect, sizeof expect, "an integer in [1, %d]", MS_THREADPOOL_MAX_THREADS);
            if (ms_cli_flag_i64(prog, a, v, 1, MS_THREADPOOL_MAX_THREADS, expect, &n) != 0)
                return 1;
            o->threads = (int32_t)n;
        } else if (strcmp(a, "--device") == 0) {
            if (strcmp(v, "auto") != 0 && strcmp(v, "cpu") != 0 && strcmp(v, "cuda") != 0) {
                fprintf(stderr, "%s: --device: '", prog);
                ms_cli_put_escaped(stderr, v, 200);
                fputs("' is not auto, cpu or cuda\n", stderr);
                return 1;
            }
            o->device = v;
        } else if (strcmp(a, "--role") == 0) { /* [pd] */
            o->role = v;
        } else if (strcmp(a, "--prefill-url") == 0) {
            o->prefill_url = v;
        } else if (strcmp(a, "--dtype") == 0) {
            if (strcmp(v, "auto") != 0 && strcmp(v, "f32") != 0 && strcmp(v, "bf16") != 0) {
                fprintf(stderr, "%s: --dtype: '", prog);
                ms_cli_put_escaped(stderr, v, 200);
                fputs("' is not auto, f32 or bf16\n", stderr);
                return 1;
            }
            o->dtype = v;
        }
    }
    if (o->model == NULL || *o->model == '\0') {
        serve_usage(stderr, prog);
        fprintf(stderr, "%s: --model is required\n", prog);
        return 2;
    }
    if (pd_check_opts(o, prog) != 0) /* [pd] */
        return 1;
    if (o->gpu_memory_fraction > 0 && o->kv_pages > 0) {
        fprintf(stderr, "%s: --gpu-memory-fraction and --kv-pages both size the KV arena (give "
                        "one)\n", prog);
        return 1;
    }
    if (o->max_tokens_per_step < o->max_seqs) {
        fprintf(stderr, "%s: --max-tokens-per-step %d is below --max-seqs %d (a step holds one "
                        "token of every running request)\n",
                prog, (int)o->max_tokens_per_step, (int)o->max_seqs);
        return 1;
    }
    return 0;
}

/* The model's name in /v1/models: the last component of --model. */
static char *model_name(const char *path) {
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    size_t b = n;
    while (b > 0 && path[b - 1] != '/')
        b--;
    return ms_asprintf("%.*s", (int)(n - b), path + b);
}

/* ---- the chat template ---- */

/* A whole file into a fresh NUL-terminated ms_malloc block; NULL (and a message) on failure. */
static char *read_text_file(const char *path, ms_error *err) {
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        MS_FAIL(err, MS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    char *buf = NULL;
    size_t n = 0, cap = 0, got;
    do {
        if (ms_grow((void **)&buf, &cap, n + 65536 + 1, 1) != MS_OK) {
            fclose(f);
            ms_free(buf);
            MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", path);
            return NULL;
        }
        got = fread(buf + n, 1, 65536, f);
        n += got;
    } while (got > 0);
    bool bad = ferror(f) != 0;
    fclose(f);
    if (bad || memchr(buf, '\0', n) != NULL) {
        ms_free(buf);
        MS_FAIL(err, MS_ERR_IO, "%s: %s", path,
                bad ? "read error" : "holds a NUL byte (not a template)");
        return NULL;
    }
    buf[n] = '\0';
    return buf;
}

/* bos_token / eos_token of a tokenizer_config.json: a string or {"content": string}; NULL else. */
static char *config_token(const char *cfg_path, const char *key) {
    json_t *root = json_load_file(cfg_path, 0, NULL);
    json_t *v = json_object_get(root, key);
    if (json_is_object(v))
        v = json_object_get(v, "content");
    char *out = json_is_string(v) ? ms_strdup(json_string_value(v)) : NULL;
    json_decref(root);
    return out;
}

/* Load s->tmpl: --chat-template (a .json is a tokenizer_config.json), else the tokenizer's
   tokenizer_config.json (ms_tok_hf read it), else the model folder's. No template leaves
   tmpl NULL and tmpl_why set; a template that does not parse is an error (returns 1). */
static int load_chat_template(srv *s, const char *model_dir) {
    ms_error err = {0};
    char *text = NULL, *name = NULL, *cfg = NULL;
    const char *ct = s->o.chat_template;
    size_t ctl = ct != NULL ? strlen(ct) : 0;
    if (ct != NULL && ctl >= 5 && strcmp(ct + ctl - 5, ".json") == 0) {
        cfg = ms_strdup(ct);
    } else if (ct != NULL) {
        text = read_text_file(ct, &err);
        if (text == NULL) {
            fprintf(stderr, "%s: --chat-template: %s\n", s->prog, err.msg);
            return 1;
        }
        name = ms_strdup(ct);
    } else if (s->tok.hf != NULL && ms_tok_hf_chat_template(s->tok.hf) != NULL) {
        text = ms_strdup(ms_tok_hf_chat_template(s->tok.hf));
        const char *slash = strrchr(s->tok.path, '/');
        name = slash != NULL ? ms_asprintf("%.*s/tokenizer_config.json",
                                           (int)(slash - s->tok.path), s->tok.path)
                             : ms_strdup("tokenizer_config.json");
    } else if (model_dir != NULL) {
        char *p = ms_asprintf("%s/tokenizer_config.json", model_dir);
        if (p != NULL && access(p, R_OK) == 0)
            cfg = p;
        else
            ms_free(p);
    }
    if (cfg != NULL) {
        ms_status st = ms_chat_template_load_config(cfg, &text, &err);
        if (st == MS_ERR_NOT_FOUND && ct == NULL) {
            ms_free(cfg);
            cfg = NULL;
        } else if (st != MS_OK) {
            fprintf(stderr, "%s: %s%s\n", s->prog, ct != NULL ? "--chat-template: " : "", err.msg);
            ms_free(cfg);
            return 1;
        } else {
            name = ms_strdup(cfg);
        }
    }
    if (text == NULL) {
        snprintf(s->tmpl_why, sizeof s->tmpl_why,
                 "the model has no chat template (no chat_template in a tokenizer_config.json); "
                 "give --chat-template FILE, or use /v1/completions");
        ms_free(cfg);
        ms_free(name);
        return 0;
    }
    /* bos / eos: the config the template came from, else the tokenizer's */
    if (cfg != NULL) {
        s->bos_tok = config_token(cfg, "bos_token");
        s->eos_tok = config_token(cfg, "eos_token");
    }
    if (s->tok.hf != NULL) {
        if (s->bos_tok == NULL && ms_tok_hf_bos_token(s->tok.hf) != NULL)
            s->bos_tok = ms_strdup(ms_tok_hf_bos_token(s->tok.hf));
        if (s->eos_tok == NULL && ms_tok_hf_eos_token(s->tok.hf) != NULL)
            s->eos_tok = ms_strdup(ms_tok_hf_eos_token(s->tok.hf));
    }
    s->chat_eos_id = -1;
    if (s->eos_tok != NULL && s->tok.hf != NULL) {
        int32_t id = ms_tok_hf_token_id(s->tok.hf, s->eos_tok);
        if (id >= 0 && id < s->fa.vocab)
            s->chat_eos_id = id;
    }
    ms_status st =
        ms_chat_template_init(&s->tmpl, text, name != NULL ? name : "chat_template", &err);
    ms_free(text);
    ms_free(cfg);
    ms_free(name);
    if (st != MS_OK) {
        fprintf(stderr, "%s: the chat template does not load: %s\n", s->prog, err.msg);
        return 1;
    }
    return 0;
}

/* ---- serve ---- */

int ms_cli_serve(int argc, char **argv, const ms_model_desc *desc, const char *prog) {
    srv s;
    memset(&s, 0, sizeof s);
    s.prog = prog;
    int rc = parse_serve(argc, argv, &s.o, prog);
    if (rc != 0)
        return rc < 0 ? ms_cli_stdout_check(prog) : rc;
    ms_error err = {0};
    char *dir = NULL;
    struct MHD_Daemon *d = NULL;
    pthread_t sched;
    bool sched_started = false, mu_ready = false;
    ms_md_facts fa;
    if (ms_cli_model_probe(desc, s.o.model, &fa, NULL, &dir, &err) != MS_OK) {
        fprintf(stderr, "%s: %s\n", prog, err.msg);
        rc = 1;
        goto done;
    }
    if ((rc = ms_cli_tok_init(&s.tok, s.o.tokenizer, dir, s.o.model, fa.vocab)) != 0)
        goto done;
    s.has_tok = s.tok.l2c != NULL || s.tok.hf != NULL;
    s.chat_eos_id = -1;
    s.fa.vocab = fa.vocab;
    if (s.has_tok && (rc = load_chat_template(&s, dir)) != 0)
        goto done;
    if (!s.has_tok)
        snprintf(s.tmpl_why, sizeof s.tmpl_why, "chat needs a tokenizer and the server has none");
    s.name = model_name(s.o.model);
    s.run = ms_calloc((size_t)s.o.max_seqs, sizeof *s.run);
    if (s.name == NULL || s.run == NULL) {
        fprintf(stderr, "%s: out of memory\n", prog);
        rc = 1;
        goto done;
    }
    ms_engine_options eo = ms_engine_options_default();
    eo.model_path = s.o.model;
    eo.device = s.o.device;
    eo.dtype = s.o.dtype;
    eo.page_size = s.o.page_size;
    eo.n_threads = s.o.threads;
    eo.max_seqs = s.o.max_seqs;
    eo.max_tokens = s.o.max_tokens_per_step;
    eo.kv_pages = s.o.kv_pages;
    eo.host_kv_pages = s.o.host_kv_pages;
    eo.gpu_memory_fraction = s.o.gpu_memory_fraction;
    eo.graphs = s.o.no_graphs ? MS_GRAPHS_OFF : MS_GRAPHS_AUTO;
    eo.prefix_cache = !s.o.no_prefix_cache; /* on by default, as vLLM and SGLang serve */
    eo.prompt_logprobs_rows = s.o.prompt_logprobs_rows;
    eo.tp = s.o.tp; /* [tp] */
    double t0 = now_s();
    if (ms_engine_init(&s.eng, desc, &eo, &err) != MS_OK) {
        fprintf(stderr, "%s: %s\n", prog, err.msg);
        rc = 1;
        goto done;
    }
    ms_cli_print_graphs(s.eng, stderr);
    s.fa = *ms_engine_facts(s.eng);
    s.lp_scratch = ms_malloc(ms_sampler_scratch_size(s.fa.vocab));
    if (s.lp_scratch == NULL) {
        fprintf(stderr, "%s: out of memory\n", prog);
        rc = 1;
        goto done;
    }
    s.kv_total = s.kv_free = ms_engine_kv_pages_free(s.eng);
    ms_engine_get_kv_stats(s.eng, &s.kv);
    pthread_mutex_init(&s.mu, NULL);
    pthread_cond_init(&s.cv, NULL);
    pthread_cond_init(&s.idle_cv, NULL);
    mu_ready = true;

    /* SIGINT / SIGTERM are taken by sigwait below: block them in every thread started here */
    sigset_t sigs, old;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, &old);
    signal(SIGPIPE, SIG_IGN);

    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", (int)s.o.port);
    int gai = getaddrinfo(s.o.host, port_s, &hints, &ai);
    if (gai != 0) {
        fprintf(stderr, "%s: --host: '%s': %s\n", prog, s.o.host, gai_strerror(gai));
        rc = 1;
        goto done;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_ERROR_LOG | (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
    d = MHD_start_daemon(flags, (uint16_t)s.o.port, NULL, NULL, on_request, &s,
                         MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED,
                         on_completed, &s, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120,
                         MHD_OPTION_END);
    freeaddrinfo(ai);
    if (d == NULL) {
        fprintf(stderr, "%s: cannot listen on %s port %d (in use, or not an address of this "
                        "host)\n",
                prog, s.o.host, (int)s.o.port);
        rc = 1;
        goto done;
    }
    if (pthread_create(&sched, NULL, sched_main, &s) != 0) {
        fprintf(stderr, "%s: cannot start the scheduler thread\n", prog);
        rc = 1;
        goto done;
    }
    sched_started = true;
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    int port = info != NULL ? (int)info->port : (int)s.o.port;
    bool v6 = strchr(s.o.host, ':') != NULL;
    fprintf(stderr,
            "%s: serving %s on %s (%d KV pages of %d tokens, max %d sequences) loaded in %.2f s\n"
            "listening on http://%s%s%s:%d\n",
            prog, s.name, ms_engine_device(s.eng), (int)s.kv_total,
            (int)ms_engine_page_size(s.eng), (int)s.o.max_seqs, now_s() - t0, v6 ? "[" : "",
            s.o.host, v6 ? "]" : "", port);
    fflush(stderr);

    int sig = 0;
    sigwait(&sigs, &sig);
    srv_log(&s, "%s: stopping", sig == SIGINT ? "SIGINT" : "SIGTERM");
    pthread_mutex_lock(&s.mu);
    s.stopping = true;
    pthread_cond_signal(&s.cv);
    pthread_mutex_unlock(&s.mu);
    pthread_join(sched, NULL);
    sched_started = false;
    /* every job is finished or failed now: give the streams up to 2 s to send their last chunks
       (an error event and [DONE]), then close every connection */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 2;
    pthread_mutex_lock(&s.mu);
    while (s.n_jobs > 0 && pthread_cond_timedwait(&s.idle_cv, &s.mu, &until) != ETIMEDOUT) {
    }
    pthread_mutex_unlock(&s.mu);
    MHD_stop_daemon(d);
    d = NULL;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    srv_log(&s, "stopped: %llu completed, %llu failed, %llu aborted; %d of %d KV pages free",
            (unsigned long long)s.n_success, (unsigned long long)s.n_error,
            (unsigned long long)s.n_aborted, (int)ms_engine_kv_pages_free(s.eng),
            (int)s.kv_total);
    rc = 0;

done:
    if (sched_started) {
        pthread_mutex_lock(&s.mu);
        s.stopping = true;
        pthread_cond_signal(&s.cv);
        pthread_mutex_unlock(&s.mu);
        pthread_join(sched, NULL);
    }
    if (d != NULL)
        MHD_stop_daemon(d);
    if (mu_ready) {
        pthread_cond_destroy(&s.cv);
        pthread_cond_destroy(&s.idle_cv);
        pthread_mutex_destroy(&s.mu);
    }
    ms_engine_free(s.eng);
    ms_free(s.lp_scratch);
    ms_cli_tok_free(&s.tok);
    ms_chat_template_free(s.tmpl);
    ms_free(s.bos_tok);
    ms_free(s.eos_tok);
    ms_free(s.run);
    ms_free(s.name);
    ms_free(dir);
    return rc;
}

/* ---- [pd] prefill / decode roles (docs/pd.md) ----
 * The client talks to the decode server. For each choice it POSTs the prompt ids and the
 * resolved sampling settings to its prefill peer's /v1/pd/prefill (a completions body); the
 * prefill server runs the prompt to its first id, publishes the request (engine.h
 * ms_engine_pd_publish) and replies with the record's bytes (pd.h, application/octet-stream);
 * the decode server admits it (ms_engine_pd_admit: the KV moves through the host transfer) and
 * decodes to the end. A request that finishes at its first id (eos) gets 409 from the peer and
 * is prefilled by the decode server itself; max_tokens < 2 never asks the peer. */

/* A prefill server's choice after a step (under mu): published once it has its first id. */
static bool pd_harvest_prefill(srv *s, srv_choice *c, int32_t n, ms_finish_reason why) {
    srv_job *j = c->job;
    if (why != MS_FINISH_NONE) {
        job_fail(j, 409, "the request finished at its first id: nothing to hand over");
        c->finish = "stop";
        return true;
    }
    if (n < 1)
        return false; /* still prefilling */
    ms_pd_record *rec = NULL;
    ms_error err = {0};
    ms_status st = ms_engine_pd_publish(s->eng, c->rid, &rec, &err);
    if (st == MS_OK)
        st = ms_pd_record_encode(rec, &c->pd_bytes, &c->n_pd_bytes, &err);
    ms_pd_record_free(rec);
    if (st != MS_OK) {
        srv_log(s, "%s: pd publish: %s", j->id, err.msg);
        job_fail(j, 500, err.msg);
        c->finish = "error";
        return true;
    }
    c->n_gen = n;
    c->finish = "length";
    return true;
}

/* A decode server's choice joining the engine from its record (under mu; the record is used). */
static ms_status pd_admit_choice(srv *s, srv_choice *c, ms_error *err) {
    ms_status st = ms_engine_pd_admit(s->eng, c->pd_rec, &c->rid, err);
    ms_pd_record_free(c->pd_rec);
    c->pd_rec = NULL;
    return st;
}

/* Settings a record does not carry (pd.h): refused on both roles with 400. */
static const char *pd_unsupported(const srv_job *j) {
    if (j->logprobs >= 0 || j->prompt_logprobs >= 0 || j->echo_lp)
        return "logprobs";
    if (j->has_extra)
        return "min_p and penalties";
    return NULL;
}

static unsigned pd_prefill_check(srv_job *j, char *msg, size_t cap) {
    const char *what = pd_unsupported(j);
    if (what == NULL && (j->n_ch != 1 || j->stream || j->max_tokens < 2))
        what = "n > 1, stream or max_tokens < 2";
    if (what != NULL) {
        snprintf(msg, cap, "/v1/pd/prefill: %s not served on a prefill server", what);
        return 400;
    }
    j->pd_prefill = true;
    return 0;
}

static unsigned pd_fetch_records(srv *s, srv_job *j, char *msg, size_t cap) {
    const char *what = pd_unsupported(j);
    if (what != NULL) {
        snprintf(msg, cap, "%s: not served with --role decode (docs/pd.md)", what);
        return 400;
    }
    if (j->max_tokens < 2)
        return 0; /* nothing to decode after the first id: prefilled here */
    for (int32_t i = 0; i < j->n_ch; i++) {
        srv_choice *c = &j->ch[i];
        c->seed &= (uint64_t)INT64_MAX; /* a JSON integer; an unseeded request's seed is random */
        json_t *ids = ids_json(c->prompt, (size_t)c->n_prompt);
        json_t *b = json_pack("{s:o, s:i, s:f, s:f, s:i, s:I, s:b}", "prompt", ids, "max_tokens",
                              (int)j->max_tokens, "temperature", (double)j->sampling.temperature,
                              "top_p", (double)j->sampling.top_p, "top_k",
                              (int)j->sampling.top_k, "seed", (json_int_t)c->seed, "ignore_eos",
                              (int)j->ignore_eos);
        char *body = b != NULL ? json_dumps(b, JSON_COMPACT) : NULL;
        json_decref(b);
        if (body == NULL) {
            snprintf(msg, cap, "out of memory");
            return 500;
        }
        unsigned code = 0;
        uint8_t *reply = NULL;
        size_t n = 0;
        char type[64];
        ms_error err = {0};
        ms_status st = ms_pd_http_post(&s->o.peer, "/v1/pd/prefill", body, strlen(body), 600,
                                       (size_t)1 << 34, &code, &reply, &n, type, &err);
        free(body);
        if (st == MS_OK && code == 200 && strcmp(type, "application/octet-stream") == 0)
            st = ms_pd_record_decode(reply, n, &c->pd_rec, &err);
        else if (st == MS_OK && code != 409) {
            snprintf(err.msg, sizeof err.msg, "HTTP %u: %.200s", code, (const char *)reply);
            st = MS_ERR_IO;
        }
        ms_free(reply);
        if (st != MS_OK) {
            srv_log(s, "prefill peer %s: %s", s->o.prefill_url, err.msg);
            snprintf(msg, cap, "prefill peer %s: %s", s->o.prefill_url, err.msg);
            return 502;
        }
    }
    return 0;
}

/* The prefill reply (under mu, which it releases). */
static enum MHD_Result pd_reply_record(srv *s, struct MHD_Connection *con, srv_job *j) {
    const srv_choice *c = &j->ch[0];
    enum MHD_Result ret = reply_raw(con, 200, "application/octet-stream",
                                    (const char *)c->pd_bytes, c->n_pd_bytes);
    job_release_handler(j);
    pthread_mutex_unlock(&s->mu);
    return ret;
}

static int pd_check_opts(srv_opts *o, const char *prog) {
    const bool decode = o->role != NULL && strcmp(o->role, "decode") == 0;
    if (o->role != NULL && !decode && strcmp(o->role, "prefill") != 0) {
        fprintf(stderr, "%s: --role: '", prog);
        ms_cli_put_escaped(stderr, o->role, 200);
        fputs("' is not prefill or decode\n", stderr);
        return 1;
    }
    if (o->prefill_url != NULL && !decode) {
        fprintf(stderr, "%s: --prefill-url is the decode server's peer: give it with --role "
                        "decode\n", prog);
        return 1;
    }
    if (decode && o->prefill_url == NULL) {
        fprintf(stderr, "%s: --role decode needs --prefill-url http://HOST:PORT (its prefill "
                        "server)\n", prog);
        return 1;
    }
    if (o->role != NULL && o->tp > 1) {
        fprintf(stderr, "%s: --role with --tp %d: prefill/decode handover covers one rank only "
                        "(docs/pd.md)\n", prog, (int)o->tp);
        return 1;
    }
    ms_error err = {0};
    if (decode && ms_pd_peer_parse(o->prefill_url, &o->peer, &err) != MS_OK) {
        fprintf(stderr, "%s: %s\n", prog, err.msg);
        return 1;
    }
    return 0;
}
