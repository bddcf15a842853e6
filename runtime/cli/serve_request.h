/*
 * serve_request.h - the `serve` verb's request parser: the JSON body of POST /v1/completions or
 * /v1/chat/completions -> a validated ms_serve_request, or an OpenAI error (HTTP status, type,
 * the field at fault, a one-line message naming it). No HTTP here (it builds without
 * libmicrohttpd: tests/fuzz_serve_request.c fuzzes it alone); the server (cli_serve.c) turns a
 * request into engine requests.
 *
 * Field semantics follow OpenAI's API reference (completions, chat completions) and vLLM's
 * extensions (top_k, min_p, repetition_penalty, ignore_eos):
 *   model (string: must be the served model's name, else 404 model_not_found), prompt (a string,
 *   a list of strings, token ids, or a list of token id lists; completions only), messages (chat
 *   only: a non-empty list of {role: string, content: string}), max_tokens /
 *   max_completion_tokens ([0, context]; default 16 for completions as OpenAI's, the context for
 *   chat), temperature (>= 0, finite), top_p ((0, 1]), top_k (-1 or 0: off, else >= 1), min_p
 *   ([0, 1]), seed (integer >= 0; absent: a fresh one), stop (a string or up to
 *   MS_SERVE_MAX_STOPS strings of 1..MS_SERVE_MAX_STOP_LEN bytes), n ([1, MS_SERVE_MAX_N]),
 *   presence_penalty / frequency_penalty ([-2, 2], OpenAI's range), repetition_penalty ((0, 2],
 *   vLLM's > 0 with an upper bound of ours), logprobs (completions: an integer in
 *   [0, MS_SERVE_MAX_LOGPROBS]; chat: a boolean, with top_logprobs in [0, MS_SERVE_MAX_LOGPROBS]),
 *   echo (completions; with logprobs the prompt's tokens come first in the logprobs, the first
 *   one with null entries, as OpenAI), prompt_logprobs (completions, vLLM's: an integer in
 *   [0, MS_SERVE_MAX_LOGPROBS], each prompt token's logprob with that many top entries; both
 *   need MS_SERVE_CAP_PROMPT_LOGPROBS), ignore_eos, stream, stream_options.include_usage. null
 *   means absent.
 *   best_of must be absent or equal to n; suffix and logit_bias are refused (not served). Unknown
 *   fields are reported through ms_serve_ctx.log and ignored, as vLLM does.
 *
 * Status codes: 400 for every malformed or invalid body (bad JSON, non-UTF-8 bytes, wrong types,
 * values out of range, ids outside the vocabulary, a prompt over the context, a feature the
 * server does not serve): OpenAI answers 400 for all of these and its client raises
 * BadRequestError; 422 is not used. 404 for an unknown model, 413 for a body over
 * ms_serve_ctx.max_body, 501 for chat on a server without a chat template, 500 out of memory.
 *
 * Ownership: ms_serve_request_parse returns a request owned by the caller
 * (ms_serve_request_free; the caller may take prompts[i].ids and stops[i], setting them NULL).
 * The context and its callbacks are borrowed for the call; the callbacks must be thread-safe when
 * several threads parse at once (the server's handlers do).
 */
#ifndef MS_SERVE_REQUEST_H
#define MS_SERVE_REQUEST_H

#include <jansson.h>

#include "ms_base.h"
#include "sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MS_SERVE_MAX_STOPS 16            /* stop strings per request */
#define MS_SERVE_MAX_STOP_LEN 256        /* bytes per stop string */
#define MS_SERVE_MAX_N 16                /* choices per prompt */
#define MS_SERVE_MAX_LOGPROBS 20         /* top logprobs per token (vLLM's default max_logprobs) */
#define MS_SERVE_DEFAULT_MAX_TOKENS 16   /* OpenAI's default max_tokens for completions */

/* Optional fields the server serves; a request using one it does not is refused (400). */
enum {
    MS_SERVE_CAP_N = 1u << 0,         /* n > 1 */
    MS_SERVE_CAP_LOGPROBS = 1u << 1,  /* logprobs / top_logprobs */
    MS_SERVE_CAP_ECHO = 1u << 2,      /* echo */
    MS_SERVE_CAP_PENALTIES = 1u << 3, /* presence / frequency / repetition penalties != neutral */
    MS_SERVE_CAP_MIN_P = 1u << 4,     /* min_p > 0 */
    MS_SERVE_CAP_PROMPT_LOGPROBS = 1u << 5, /* echo with logprobs, prompt_logprobs */
};

/* What the parser validates against, and how it tokenizes. */
typedef struct ms_serve_ctx {
    const char *model_name;        /* the served model's id (the `model` field must match) */
    int32_t vocab;                 /* token ids must be in [0, vocab) */
    int32_t max_context;           /* prompt tokens and max_tokens at most this */
    int32_t max_prompts;           /* prompts x n per request at most this (the queue size) */
    size_t max_body;               /* bytes; a longer body is a 413 */
    unsigned caps;                 /* MS_SERVE_CAP_* served */
    ms_sampling_params defaults;   /* the model's declared sampler settings (seed ignored) */
    /* Text -> ids into a fresh ms_malloc'd *ids (add_special: BOS etc. as `generate` adds them;
     * false for a rendered chat, whose template wrote them). Returns MS_OK, or a failure with a
     * one-line message in *err (MS_ERR_OOM for out of memory). NULL: the server has no tokenizer
     * (text prompts, stop strings and chat are refused). */
    ms_status (*encode)(void *user, const char *text, bool add_special, int32_t **ids,
                        size_t *n_ids, ms_error *err);
    /* messages (validated: a non-empty array of {role, content} strings) -> the prompt text
     * through the chat template, a fresh ms_malloc'd NUL-terminated *text. Failures: MS_ERR_OOM,
     * or any other code with a one-line message (a 400 naming `messages`). NULL: no template
     * (chat requests get 501 with chat_why). */
    ms_status (*render_chat)(void *user, json_t *messages, char **text, ms_error *err);
    const char *chat_why;          /* why chat is not served (render_chat NULL) */
    /* An ignored unknown field (a log line; may be NULL). */
    void (*log)(void *user, const char *msg);
    void *user;                    /* passed to the callbacks */
} ms_serve_ctx;

/* One prompt: ids in [0, vocab), 1 <= n <= max_context. */
typedef struct ms_serve_prompt {
    int32_t *ids;                  /* [n] (ms_malloc'd) */
    int32_t n;
    char *text;                    /* a text prompt as given (echo), else NULL (ms_malloc'd) */
} ms_serve_prompt;

/* A validated request. Choices: n_prompts * n, choice index = prompt * n + k (OpenAI's order). */
typedef struct ms_serve_request {
    bool chat;
    ms_serve_prompt *prompts;      /* [n_prompts] (ms_malloc'd) */
    int32_t n_prompts;
    int32_t n;                     /* choices per prompt, [1, MS_SERVE_MAX_N] */
    ms_sampling_params sampling;   /* defaults overridden by the request; validated */
    bool seeded;                   /* `seed` was given (else sampling.seed is a fresh one) */
    float min_p;                   /* [0, 1]; 0 off */
    float presence_penalty;        /* [-2, 2]; 0 off */
    float frequency_penalty;       /* [-2, 2]; 0 off */
    float repetition_penalty;      /* (0, 2]; 1 off */
    int32_t max_tokens;            /* [0, max_context] */
    int32_t logprobs;              /* -1: none; else top logprobs per token, [0, MAX_LOGPROBS] */
    bool echo;                     /* completions: the prompt's text comes first */
    int32_t prompt_logprobs;       /* -1: none; else top entries per prompt token (vLLM's
                                      prompt_logprobs), [0, MAX_LOGPROBS] */
    bool ignore_eos, stream, include_usage;
    char *stops[MS_SERVE_MAX_STOPS]; /* [n_stops] NUL-terminated, 1..MAX_STOP_LEN bytes */
    int32_t n_stops;
} ms_serve_request;

/* An error reply: OpenAI's {"error": {"message", "type", "param", "code"}}. */
typedef struct ms_serve_error {
    unsigned status;               /* HTTP status: 400, 404, 413, 500, 501 */
    const char *param;             /* the field at fault (static string), or NULL */
    const char *code;              /* "model_not_found", ... (static string), or NULL */
    char msg[400];                 /* one line, naming the field and the value's place */
} ms_serve_error;

/*
 * Parse body[0..n) (not NUL-terminated; any bytes) as a completion (chat: chat completion)
 * request. On success *out is a fresh request and e is untouched; on failure *out is NULL and *e
 * says why. Returns MS_OK, MS_ERR_PARSE (4xx: e->status) or MS_ERR_OOM (500).
 */
ms_status ms_serve_request_parse(const ms_serve_ctx *ctx, const char *body, size_t n, bool chat,
                                 ms_serve_request **out, ms_serve_error *e);

/* Free a request (NULL: no-op). */
void ms_serve_request_free(ms_serve_request *r);

/* OpenAI's error type for an HTTP status: invalid_request_error (4xx), authentication_error
 * (401), not_found_error (404), rate_limit_error (429), not_implemented (501), server_error
 * (5xx). */
const char *ms_serve_error_type(unsigned status);

/* The error body of e (a new jansson reference; NULL out of memory). A message with invalid UTF-8
 * (quoted request bytes) is replaced by "invalid request". */
json_t *ms_serve_error_json(const ms_serve_error *e);

#ifdef __cplusplus
}
#endif
#endif /* MS_SERVE_REQUEST_H */
