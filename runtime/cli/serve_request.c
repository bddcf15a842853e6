/*
 * serve_request.c - the request parser of the `serve` verb (serve_request.h): jansson for the
 * JSON (JSON_REJECT_DUPLICATES; jansson refuses invalid UTF-8, NaN and Infinity), then every
 * field checked for type and range, prompts tokenized through the context's encoder, chat
 * messages rendered through its template callback.
 */
#include "serve_request.h"

#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* src into dst[cap] as one line: control bytes (quoted request text, jansson's excerpts) become
   \xHH; truncated to fit. */
static void one_line(char *dst, size_t cap, const char *src) {
    size_t o = 0;
    for (const unsigned char *c = (const unsigned char *)src; *c != '\0'; c++) {
        bool ctl = *c < 0x20 || *c == 0x7f;
        if (o + (ctl ? 4 : 1) >= cap)
            break;
        if (ctl)
            o += (size_t)snprintf(dst + o, 5, "\\x%02x", *c);
        else
            dst[o++] = (char)*c;
    }
    dst[o] = '\0';
}

/* Record a 4xx/5xx in e; returns false (the parse functions' "stop"). */
static bool perr(ms_serve_error *e, unsigned status, const char *param, const char *fmt, ...)
    MS_PRINTF(4, 5);
static bool perr(ms_serve_error *e, unsigned status, const char *param, const char *fmt, ...) {
    e->status = status;
    e->param = param;
    char raw[sizeof e->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    one_line(e->msg, sizeof e->msg, raw);
    return false;
}

static bool oom(ms_serve_error *e) { return perr(e, 500, NULL, "out of memory"); }

/* The field's value, or NULL when it is absent or null. */
static json_t *field(json_t *root, const char *key) {
    json_t *v = json_object_get(root, key);
    return v == NULL || json_is_null(v) ? NULL : v;
}

static bool get_number(json_t *v, double *out) {
    if (json_is_integer(v))
        *out = (double)json_integer_value(v);
    else if (json_is_real(v))
        *out = json_real_value(v);
    else
        return false;
    return true;
}

/* A number field in [lo, hi] (lo_open: > lo) into *out; absent leaves *out. */
static bool get_range(json_t *root, const char *key, double lo, bool lo_open, double hi,
                      float *out, ms_serve_error *e) {
    json_t *v = field(root, key);
    if (v == NULL)
        return true;
    double x;
    if (!get_number(v, &x))
        return perr(e, 400, key, "'%s' must be a number", key);
    if (!(lo_open ? x > lo : x >= lo) || !(x <= hi))
        return perr(e, 400, key, "'%s' %g is not in %c%g, %g]", key, x, lo_open ? '(' : '[', lo,
                    hi);
    *out = (float)x;
    return true;
}

/* An integer field in [lo, hi] into *out; absent leaves *out. */
static bool get_int(json_t *root, const char *key, long long lo, long long hi, int32_t *out,
                    ms_serve_error *e) {
    json_t *v = field(root, key);
    if (v == NULL)
        return true;
    if (!json_is_integer(v))
        return perr(e, 400, key, "'%s' must be an integer", key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return perr(e, 400, key, "'%s' %lld is not in [%lld, %lld]", key, (long long)x, lo, hi);
    *out = (int32_t)x;
    return true;
}

static bool get_bool(json_t *root, const char *key, bool *out, ms_serve_error *e) {
    json_t *v = field(root, key);
    if (v == NULL)
        return true;
    if (!json_is_boolean(v))
        return perr(e, 400, key, "'%s' must be a boolean", key);
    *out = json_is_true(v);
    return true;
}

/* A string without NUL bytes. */
static bool plain_string(json_t *v) {
    return json_is_string(v) && strlen(json_string_value(v)) == json_string_length(v);
}

/* Text -> ids through the context's encoder into p. */
static bool encode_text(const ms_serve_ctx *ctx, const char *text, bool add_special,
                        const char *param, ms_serve_prompt *p, ms_serve_error *e) {
    int32_t *ids = NULL;
    size_t n = 0;
    ms_error err = {0};
    ms_status st = ctx->encode(ctx->user, text, add_special, &ids, &n, &err);
    if (st != MS_OK || n == 0) {
        ms_free(ids);
        if (st == MS_ERR_OOM)
            return oom(e);
        return perr(e, 400, param, "the %s cannot be tokenized%s%s",
                    strcmp(param, "prompt") == 0 ? "prompt" : "rendered conversation",
                    st != MS_OK ? ": " : " (no tokens)", st != MS_OK ? err.msg : "");
    }
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= ctx->vocab) {
            int32_t bad = ids[i];
            ms_free(ids);
            return perr(e, 400, param, "the tokenizer gave id %d, outside the vocabulary [0, %d)",
                        (int)bad, (int)ctx->vocab);
        }
    if (n > (size_t)ctx->max_context) {
        ms_free(ids);
        return perr(e, 400, param, "the %s of %zu tokens is longer than the model's context (%d)",
                    strcmp(param, "prompt") == 0 ? "prompt" : "conversation", n,
                    (int)ctx->max_context);
    }
    p->ids = ids;
    p->n = (int32_t)n;
    return true;
}

/* One prompt: a string (through the tokenizer) or a list of token ids. `at` names it. */
static bool parse_prompt_one(const ms_serve_ctx *ctx, json_t *v, const char *at,
                             ms_serve_prompt *p, ms_serve_error *e) {
    if (json_is_string(v)) {
        if (ctx->encode == NULL)
            return perr(e, 400, "prompt",
                        "a text prompt needs a tokenizer and the server has none: give token ids "
                        "(a list of integers)");
        if (json_string_length(v) == 0)
            return perr(e, 400, "prompt", "the prompt%s is empty", at);
        if (!plain_string(v))
            return perr(e, 400, "prompt", "the prompt%s holds a NUL character", at);
        if (!encode_text(ctx, json_string_value(v), true, "prompt", p, e))
            return false;
        p->text = ms_strdup(json_string_value(v));
        return p->text != NULL || oom(e);
    }
    if (!json_is_array(v))
        return perr(e, 400, "prompt",
                    "'prompt' must be a string, a list of strings, or a list of token ids");
    size_t n = json_array_size(v);
    if (n == 0)
        return perr(e, 400, "prompt", "the prompt's token id list%s is empty", at);
    if (n > (size_t)ctx->max_context)
        return perr(e, 400, "prompt",
                    "the prompt%s of %zu tokens is longer than the model's context (%d)", at, n,
                    (int)ctx->max_context);
    p->ids = ms_malloc(n * sizeof *p->ids);
    if (p->ids == NULL)
        return oom(e);
    p->n = (int32_t)n;
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(v, i);
        if (!json_is_integer(x))
            return perr(e, 400, "prompt",
                        "prompt%s[%zu] is not an integer (a prompt is a string, a list of "
                        "strings, or token ids)",
                        at, i);
        json_int_t id = json_integer_value(x);
        if (id < 0 || id >= ctx->vocab)
            return perr(e, 400, "prompt",
                        "prompt token %lld at index %zu%s is outside the vocabulary [0, %d)",
                        (long long)id, i, at, (int)ctx->vocab);
        p->ids[i] = (int32_t)id;
    }
    return true;
}

static bool parse_stop(const ms_serve_ctx *ctx, json_t *v, ms_serve_request *r,
                       ms_serve_error *e) {
    if (v == NULL)
        return true;
    json_t *one = json_is_string(v) ? v : NULL;
    if (one == NULL && !json_is_array(v))
        return perr(e, 400, "stop", "'stop' must be a string or a list of strings");
    size_t n = one != NULL ? 1 : json_array_size(v);
    if (n > MS_SERVE_MAX_STOPS)
        return perr(e, 400, "stop", "at most %d stop strings", MS_SERVE_MAX_STOPS);
    if (n > 0 && ctx->encode == NULL)
        return perr(e, 400, "stop", "stop strings need a tokenizer and the server has none");
    for (size_t i = 0; i < n; i++) {
        json_t *x = one != NULL ? one : json_array_get(v, i);
        if (!json_is_string(x))
            return perr(e, 400, "stop", "stop[%zu] is not a string", i);
        size_t len = json_string_length(x);
        if (len == 0 || len > MS_SERVE_MAX_STOP_LEN || !plain_string(x))
            return perr(e, 400, "stop", "stop[%zu] must hold 1 to %d bytes and no NUL", i,
                        MS_SERVE_MAX_STOP_LEN);
        r->stops[r->n_stops] = ms_strdup(json_string_value(x));
        if (r->stops[r->n_stops] == NULL)
            return oom(e);
        r->n_stops++;
    }
    return true;
}

/* A chat request's messages: validated, rendered, encoded without adding special tokens. */
static bool parse_messages(const ms_serve_ctx *ctx, json_t *msgs, ms_serve_prompt *p,
                           ms_serve_error *e) {
    if (msgs == NULL)
        return perr(e, 400, "messages", "'messages' is required");
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return perr(e, 400, "messages", "'messages' must be a non-empty list of messages");
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        if (!json_is_object(m))
            return perr(e, 400, "messages", "messages[%zu] is not an object", i);
        json_t *role = json_object_get(m, "role"), *t = json_object_get(m, "content");
        if (!json_is_string(role))
            return perr(e, 400, "messages", "messages[%zu].role %s", i,
                        role == NULL ? "is missing" : "is not a string");
        if (!json_is_string(t))
            return perr(e, 400, "messages", "messages[%zu].content %s", i,
                        t == NULL ? "is missing"
                                  : "is not a string (only text content is supported)");
        if (!plain_string(t) || !plain_string(role))
            return perr(e, 400, "messages", "messages[%zu] holds a NUL character", i);
    }
    if (ctx->render_chat == NULL || ctx->encode == NULL) {
        e->code = "not_implemented";
        return perr(e, 501, NULL, "%s",
                    ctx->chat_why != NULL ? ctx->chat_why : "the server has no chat template");
    }
    char *text = NULL;
    ms_error err = {0};
    ms_status st = ctx->render_chat(ctx->user, msgs, &text, &err);
    if (st != MS_OK) {
        ms_free(text);
        return st == MS_ERR_OOM ? oom(e) : perr(e, 400, "messages", "%s", err.msg);
    }
    /* the template wrote bos_token itself: encode WITHOUT adding special tokens (as
       transformers' apply_chat_template(tokenize=True) does); special tokens in the text are
       still matched */
    bool ok = encode_text(ctx, text, false, "messages", p, e);
    ms_free(text);
    return ok;
}

/* The fields this parser reads; anything else is logged and ignored. */
static const char *const known_fields[] = {
    "model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
    "top_k", "min_p", "seed", "stop", "ignore_eos", "stream", "stream_options", "n", "best_of",
    "logprobs", "top_logprobs", "echo", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "suffix", "logit_bias", "user", "prompt_logprobs"};

static void log_unknown(const ms_serve_ctx *ctx, json_t *root) {
    if (ctx->log == NULL)
        return;
    const char *key;
    json_t *v;
    json_object_foreach(root, key, v) {
        bool known = false;
        for (size_t i = 0; i < MS_ARRAY_LEN(known_fields) && !known; i++)
            known = strcmp(key, known_fields[i]) == 0;
        if (!known) {
            char raw[160], msg[160];
            /* %.80s: a key is valid UTF-8 (jansson checked) but may be long */
            snprintf(raw, sizeof raw, "ignoring the unknown request field '%.80s'", key);
            one_line(msg, sizeof msg, raw);
            ctx->log(ctx->user, msg);
        }
    }
}

/* A feature the server does not serve: 400 naming it. */
static bool unserved(const ms_serve_ctx *ctx, unsigned cap, const char *param,
                     ms_serve_error *e) {
    if (ctx->caps & cap)
        return true;
    return perr(e, 400, param, "'%s' is not supported by this server yet", param);
}

static bool parse_fields(const ms_serve_ctx *ctx, json_t *root, ms_serve_request *r,
                         ms_serve_error *e) {
    log_unknown(ctx, root);
    json_t *v = field(root, "model");
    if (v != NULL) {
        if (!json_is_string(v))
            return perr(e, 400, "model", "'model' must be a string");
        if (ctx->model_name == NULL || strcmp(json_string_value(v), ctx->model_name) != 0) {
            e->code = "model_not_found";
            return perr(e, 404, "model",
                        "the model '%.200s' does not exist (this server serves '%.200s')",
                        json_string_value(v), ctx->model_name != NULL ? ctx->model_name : "");
        }
    }
    /* sampling: the model's declared defaults, then the request's values */
    r->sampling = ctx->defaults;
    if (!get_range(root, "temperature", 0.0, false, FLT_MAX, &r->sampling.temperature, e) ||
        !get_range(root, "top_p", 0.0, true, 1.0, &r->sampling.top_p, e) ||
        !get_range(root, "min_p", 0.0, false, 1.0, &r->min_p, e) ||
        !get_range(root, "presence_penalty", -2.0, false, 2.0, &r->presence_penalty, e) ||
        !get_range(root, "frequency_penalty", -2.0, false, 2.0, &r->frequency_penalty, e) ||
        !get_range(root, "repetition_penalty", 0.0, true, 2.0, &r->repetition_penalty, e))
        return false;
    int32_t top_k = 0;
    bool has_top_k = field(root, "top_k") != NULL;
    if (!get_int(root, "top_k", -1, INT32_MAX, &top_k, e))
        return false;
    if (has_top_k)
        r->sampling.top_k = top_k < 0 ? 0 : top_k;
    if ((v = field(root, "seed")) != NULL) {
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return perr(e, 400, "seed", "'seed' must be an integer >= 0");
        r->sampling.seed = (uint64_t)json_integer_value(v);
        r->seeded = true;
    } else {
        static _Atomic uint64_t counter;
        r->sampling.seed = (uint64_t)time(NULL) * UINT64_C(6364136223846793005) ^
                           (uint64_t)(uintptr_t)r ^ (++counter << 32);
    }
    ms_error merr = {0};
    if (ms_sampler_check_params(&r->sampling, &merr) != MS_OK)
        return perr(e, 400, NULL, "bad sampling settings: %s", merr.msg);
    if (r->min_p > 0.0f && !unserved(ctx, MS_SERVE_CAP_MIN_P, "min_p", e))
        return false;
    if (r->presence_penalty != 0.0f && !unserved(ctx, MS_SERVE_CAP_PENALTIES, "presence_penalty", e))
        return false;
    if (r->frequency_penalty != 0.0f &&
        !unserved(ctx, MS_SERVE_CAP_PENALTIES, "frequency_penalty", e))
        return false;
    if (r->repetition_penalty != 1.0f &&
        !unserved(ctx, MS_SERVE_CAP_PENALTIES, "repetition_penalty", e))
        return false;

    /* chat's default, as OpenAI's: up to the context (the engine stops there) */
    r->max_tokens = r->chat ? ctx->max_context : MS_SERVE_DEFAULT_MAX_TOKENS;
    const char *mt = field(root, "max_tokens") != NULL ? "max_tokens" : "max_completion_tokens";
    if (!get_int(root, mt, 0, ctx->max_context, &r->max_tokens, e))
        return false;
    if (!get_bool(root, "ignore_eos", &r->ignore_eos, e) ||
        !get_bool(root, "stream", &r->stream, e))
        return false;
    if ((v = field(root, "stream_options")) != NULL) {
        json_t *u = json_object_get(v, "include_usage");
        if (!json_is_object(v) || (u != NULL && !json_is_null(u) && !json_is_boolean(u)))
            return perr(e, 400, "stream_options",
                        "'stream_options' must be an object {\"include_usage\": boolean}");
        r->include_usage = json_is_true(u);
    }
    if (!get_int(root, "n", 1, MS_SERVE_MAX_N, &r->n, e))
        return false;
    if (r->n > 1 && !unserved(ctx, MS_SERVE_CAP_N, "n", e))
        return false;
    if ((v = field(root, "best_of")) != NULL &&
        !(json_is_integer(v) && json_integer_value(v) == r->n))
        return perr(e, 400, "best_of", "'best_of' must equal n (%d): best-of-n is not served",
                    (int)r->n);
    /* logprobs: completions `logprobs: N`; chat `logprobs: true, top_logprobs: N` */
    r->logprobs = -1;
    v = field(root, "logprobs");
    if (r->chat) {
        bool want = false;
        if (!get_bool(root, "logprobs", &want, e))
            return false;
        int32_t top = 0;
        if (!get_int(root, "top_logprobs", 0, MS_SERVE_MAX_LOGPROBS, &top, e))
            return false;
        if (field(root, "top_logprobs") != NULL && !want)
            return perr(e, 400, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
        if (want)
            r->logprobs = top;
    } else {
        if (field(root, "top_logprobs") != NULL)
            return perr(e, 400, "top_logprobs",
                        "'top_logprobs' is a chat field: completions take 'logprobs': N");
        if (!get_int(root, "logprobs", 0, MS_SERVE_MAX_LOGPROBS, &r->logprobs, e))
            return false;
    }
    if (r->logprobs >= 0 && !unserved(ctx, MS_SERVE_CAP_LOGPROBS, "logprobs", e))
        return false;
    if (!get_bool(root, "echo", &r->echo, e))
        return false;
    if (r->echo && r->chat)
        return perr(e, 400, "echo", "'echo' is a completions field, not a chat one");
    if (r->echo && !unserved(ctx, MS_SERVE_CAP_ECHO, "echo", e))
        return false;
    if (r->echo && r->logprobs >= 0 && !(ctx->caps & MS_SERVE_CAP_PROMPT_LOGPROBS))
        return perr(e, 400, "echo",
                    "'echo' with 'logprobs' needs the prompt's logprobs, which this server does not "
                    "compute (--prompt-logprobs-rows 0): drop one of them");
    r->prompt_logprobs = -1;
    if (field(root, "prompt_logprobs") != NULL) {
        if (r->chat)
            return perr(e, 400, "prompt_logprobs",
                        "'prompt_logprobs' is served on completions, not on chat");
        if (!get_int(root, "prompt_logprobs", 0, MS_SERVE_MAX_LOGPROBS, &r->prompt_logprobs, e))
            return false;
        if (!unserved(ctx, MS_SERVE_CAP_PROMPT_LOGPROBS, "prompt_logprobs", e))
            return false;
    }
    if (field(root, "suffix") != NULL)
        return perr(e, 400, "suffix", "'suffix' is not supported");
    if ((v = field(root, "logit_bias")) != NULL && !(json_is_object(v) && json_object_size(v) == 0))
        return perr(e, 400, "logit_bias", "'logit_bias' is not supported");
    return parse_stop(ctx, field(root, "stop"), r, e);
}

static bool parse_prompts(const ms_serve_ctx *ctx, json_t *root, ms_serve_request *r,
                          ms_serve_error *e) {
    if (r->chat) {
        if (json_object_get(root, "prompt") != NULL)
            return perr(e, 400, "prompt", "a chat request has 'messages', not 'prompt'");
        r->prompts = ms_calloc(1, sizeof *r->prompts);
        if (r->prompts == NULL)
            return oom(e);
        r->n_prompts = 1;
        return parse_messages(ctx, field(root, "messages"), &r->prompts[0], e);
    }
    if (json_object_get(root, "messages") != NULL)
        return perr(e, 400, "messages",
                    "'messages' belongs to /v1/chat/completions; completions take 'prompt'");
    /* prompt: a string, a list of strings, token ids, or a list of token id lists */
    json_t *p = field(root, "prompt");
    if (p == NULL)
        return perr(e, 400, "prompt", "'prompt' is required");
    bool batch = json_is_array(p) && json_array_size(p) > 0 &&
                 (json_is_string(json_array_get(p, 0)) || json_is_array(json_array_get(p, 0)));
    size_t n = batch ? json_array_size(p) : 1;
    if (n * (size_t)r->n > (size_t)ctx->max_prompts)
        return perr(e, 400, "prompt",
                    "%zu prompts x n %d in one request: at most %d choices (--max-queue)", n,
                    (int)r->n, (int)ctx->max_prompts);
    r->prompts = ms_calloc(n, sizeof *r->prompts);
    if (r->prompts == NULL)
        return oom(e);
    r->n_prompts = (int32_t)n;
    for (size_t i = 0; i < n; i++) {
        json_t *pi = batch ? json_array_get(p, i) : p;
        char at[32] = "";
        if (batch)
            snprintf(at, sizeof at, " [%zu]", i);
        if (batch && !json_is_string(pi) && !json_is_array(pi))
            return perr(e, 400, "prompt", "prompt[%zu] must be a string or a list of token ids",
                        i);
        if (!parse_prompt_one(ctx, pi, at, &r->prompts[i], e))
            return false;
    }
    return true;
}

ms_status ms_serve_request_parse(const ms_serve_ctx *ctx, const char *body, size_t n, bool chat,
                                 ms_serve_request **out, ms_serve_error *e) {
    *out = NULL;
    memset(e, 0, sizeof *e);
    if (n > ctx->max_body) {
        perr(e, 413, NULL, "the request body of %zu bytes is over the limit of %zu bytes", n,
             ctx->max_body);
        return MS_ERR_PARSE;
    }
    json_error_t jerr;
    json_t *root = json_loadb(body != NULL ? body : "", n, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        perr(e, 400, NULL, "the request body is not valid JSON: %s (line %d, column %d)",
             jerr.text, jerr.line, jerr.column);
        return MS_ERR_PARSE;
    }
    if (!json_is_object(root)) {
        json_decref(root);
        perr(e, 400, NULL, "the request body must be a JSON object");
        return MS_ERR_PARSE;
    }
    ms_serve_request *r = ms_calloc(1, sizeof *r);
    if (r == NULL) {
        json_decref(root);
        oom(e);
        return MS_ERR_OOM;
    }
    r->chat = chat;
    r->n = 1;
    r->repetition_penalty = 1.0f;
    bool ok = parse_fields(ctx, root, r, e) && parse_prompts(ctx, root, r, e);
    json_decref(root);
    if (!ok) {
        ms_serve_request_free(r);
        return e->status >= 500 && e->status != 501 ? MS_ERR_OOM : MS_ERR_PARSE;
    }
    *out = r;
    return MS_OK;
}

void ms_serve_request_free(ms_serve_request *r) {
    if (r == NULL)
        return;
    for (int32_t i = 0; i < r->n_prompts; i++) {
        ms_free(r->prompts[i].ids);
        ms_free(r->prompts[i].text);
    }
    ms_free(r->prompts);
    for (int32_t i = 0; i < r->n_stops; i++)
        ms_free(r->stops[i]);
    ms_free(r);
}

const char *ms_serve_error_type(unsigned status) {
    return status == 401   ? "authentication_error"
           : status == 404 ? "not_found_error"
           : status == 429 ? "rate_limit_error"
           : status == 501 ? "not_implemented"
           : status >= 500 ? "server_error"
                           : "invalid_request_error";
}

json_t *ms_serve_error_json(const ms_serve_error *e) {
    json_t *m = json_string(e->msg);
    if (m == NULL)
        m = json_string("invalid request");
    return json_pack("{s:{s:o, s:s, s:s?, s:s?}}", "error", "message", m, "type",
                     ms_serve_error_type(e->status), "param", e->param, "code", e->code);
}
