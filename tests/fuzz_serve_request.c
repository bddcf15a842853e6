/*
 * fuzz_serve_request.c - libFuzzer target for the `serve` request parser
 * (runtime/cli/serve_request.c): any bytes as the body of POST /v1/completions or
 * /v1/chat/completions.
 *
 * Input: the body, then optionally a NUL and one flags byte: bit 0 chat, bit 1 no tokenizer,
 * bit 2 no chat template, bits 3..7 the MS_SERVE_CAP_* served. The tokenizer is a byte tokenizer
 * (id = byte + 3, BOS 1 when special tokens are added) over a vocabulary of 259 with a context of
 * 48 tokens, so long prompts and ids past the vocabulary are reachable; chat renders through the
 * real template engine (a small Llama-3-like template that raises on a bad role).
 *
 * Checked: a parsed request holds what serve_request.h promises (1..max_context ids in the
 * vocabulary per prompt, prompts x n within max_prompts, every range, stop strings of 1..256
 * bytes); a refused one has a 4xx or 501 status, a one-line message and an error body that
 * serializes; nothing runs out of memory, nothing leaks; ASan/UBSan catch the rest.
 * Run it with `make fuzz FUZZ_TARGETS=serve_request`.
 */
#include "fuzz_util.h"

#include <jansson.h>
#include <math.h>

#include "chat_template.h"
#include "serve_request.h"

#define FZ_VOCAB 259
#define FZ_CONTEXT 48
#define FZ_MAX_PROMPTS 8

static const char fz_template[] =
    "{{ bos_token }}{% for m in messages %}"
    "{% if m.role not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('bad role: ' + m.role) }}{% endif %}"
    "<|{{ m.role }}|>{{ m.content | trim }}<|end|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}";

static ms_chat_template *fz_tmpl;

static ms_status fz_encode(void *user, const char *text, bool add_special, int32_t **ids,
                           size_t *n, ms_error *err) {
    (void)user;
    size_t len = strlen(text);
    *ids = ms_malloc((len + 1) * sizeof **ids);
    if (*ids == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "fuzz tokenizer: out of memory");
    size_t k = 0;
    if (add_special)
        (*ids)[k++] = 1;
    for (size_t i = 0; i < len; i++)
        (*ids)[k++] = (unsigned char)text[i] + 3;
    *n = k;
    return MS_OK;
}

static ms_status fz_render(void *user, json_t *messages, char **text, ms_error *err) {
    (void)user;
    return ms_chat_template_render(fz_tmpl, messages, true, "<s>", "</s>", text, err);
}

static void fz_log(void *user, const char *msg) {
    (void)user;
    if (msg[0] == '\0' || strchr(msg, '\n') != NULL) {
        fprintf(stderr, "fuzz_serve_request: a log line that is empty or not one line\n");
        abort();
    }
}

static void fz_fail(const char *what) {
    fprintf(stderr, "fuzz_serve_request: %s\n", what);
    abort();
}

static void check_request(const ms_serve_ctx *c, const ms_serve_request *r, bool chat) {
    if (r->chat != chat || r->n_prompts < 1 || (chat && r->n_prompts != 1))
        fz_fail("bad prompt count");
    if (r->n < 1 || r->n > MS_SERVE_MAX_N || r->n_prompts * r->n > c->max_prompts)
        fz_fail("n out of range");
    if (r->n > 1 && !(c->caps & MS_SERVE_CAP_N))
        fz_fail("n > 1 accepted without the capability");
    for (int32_t i = 0; i < r->n_prompts; i++) {
        const ms_serve_prompt *p = &r->prompts[i];
        if (p->ids == NULL || p->n < 1 || p->n > c->max_context)
            fz_fail("prompt length out of range");
        for (int32_t k = 0; k < p->n; k++)
            if (p->ids[k] < 0 || p->ids[k] >= c->vocab)
                fz_fail("prompt id outside the vocabulary");
    }
    ms_error err = {0};
    if (ms_sampler_check_params(&r->sampling, &err) != MS_OK)
        fz_fail("sampling settings the sampler refuses");
    if (!(r->min_p >= 0.0f && r->min_p <= 1.0f) ||
        !(fabsf(r->presence_penalty) <= 2.0f && fabsf(r->frequency_penalty) <= 2.0f) ||
        !(r->repetition_penalty > 0.0f && r->repetition_penalty <= 2.0f))
        fz_fail("a sampling field out of range");
    if (r->max_tokens < 0 || r->max_tokens > c->max_context)
        fz_fail("max_tokens out of range");
    if (r->logprobs < -1 || r->logprobs > MS_SERVE_MAX_LOGPROBS ||
        (r->logprobs >= 0 && !(c->caps & MS_SERVE_CAP_LOGPROBS)))
        fz_fail("logprobs out of range");
    if (r->echo && (chat || !(c->caps & MS_SERVE_CAP_ECHO) || r->logprobs >= 0))
        fz_fail("echo accepted where it is not served");
    for (int32_t i = 0; i < r->n_prompts; i++)
        if (r->prompts[i].text != NULL && (chat || c->encode == NULL))
            fz_fail("a prompt text kept for a chat or without a tokenizer");
    if (r->n_stops < 0 || r->n_stops > MS_SERVE_MAX_STOPS || (r->n_stops > 0 && c->encode == NULL))
        fz_fail("stop count out of range");
    for (int32_t i = 0; i < r->n_stops; i++) {
        size_t len = r->stops[i] != NULL ? strlen(r->stops[i]) : 0;
        if (len < 1 || len > MS_SERVE_MAX_STOP_LEN)
            fz_fail("stop string length out of range");
    }
}

static void check_error(const ms_serve_error *e, ms_status st) {
    if (st != MS_ERR_PARSE)
        fz_fail("a refusal that is not MS_ERR_PARSE (out of memory?)");
    if (!((e->status >= 400 && e->status < 500) || e->status == 501))
        fz_fail("a refusal without a 4xx / 501 status");
    if (e->msg[0] == '\0' || strchr(e->msg, '\n') != NULL)
        fz_fail("an error message that is empty or not one line");
    json_t *o = ms_serve_error_json(e);
    char *s = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
    if (s == NULL)
        fz_fail("the error body does not serialize");
    free(s);
    json_decref(o);
    static int verbose = -1;
    if (verbose < 0)
        verbose = getenv("MS_FUZZ_VERBOSE") != NULL && strcmp(getenv("MS_FUZZ_VERBOSE"), "1") == 0;
    if (verbose)
        fprintf(stderr, "fuzz_serve_request: %u %s: %s\n", e->status,
                e->param != NULL ? e->param : "-", e->msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 65536)
        return -1;
    if (fz_tmpl == NULL) {
        ms_error err = {0};
        if (ms_chat_template_init(&fz_tmpl, fz_template, "fuzz.jinja", &err) != MS_OK) {
            fprintf(stderr, "fuzz_serve_request: the fixed template does not load: %s\n", err.msg);
            abort();
        }
    }
    int64_t live = ms_alloc_get_stats().live_blocks;
    const uint8_t *body, *flags = NULL;
    size_t body_len, flags_len = 0;
    fuzz_part(data, size, 0, &body, &body_len);
    unsigned f = fuzz_part(data, size, 1, &flags, &flags_len) && flags_len > 0 ? flags[0] : 0xf8u;
    bool chat = f & 1;
    ms_serve_ctx c = {
        .model_name = "fuzz-model",
        .vocab = FZ_VOCAB,
        .max_context = FZ_CONTEXT,
        .max_prompts = FZ_MAX_PROMPTS,
        .max_body = 4096,
        .caps = (f >> 3) & 0x1fu,
        .defaults = ms_sampling_greedy(),
        .encode = (f & 2) ? NULL : fz_encode,
        .render_chat = (f & 4) ? NULL : fz_render,
        .chat_why = "no chat template in this fuzz run",
        .log = fz_log,
    };
    /* a private copy of exactly body_len bytes: ASan sees a read past the body */
    char *copy = malloc(body_len > 0 ? body_len : 1);
    if (copy == NULL)
        abort();
    memcpy(copy, body, body_len);
    ms_serve_request *r = NULL;
    ms_serve_error e;
    ms_status st = ms_serve_request_parse(&c, copy, body_len, chat, &r, &e);
    if (st == MS_OK) {
        if (r == NULL)
            fz_fail("MS_OK without a request");
        check_request(&c, r, chat);
    } else {
        if (r != NULL)
            fz_fail("a refusal with a request");
        check_error(&e, st);
    }
    ms_serve_request_free(r);
    free(copy);
    fuzz_check_leaks("fuzz_serve_request", live);
    return 0;
}
