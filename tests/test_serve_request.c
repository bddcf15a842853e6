/*
 * test_serve_request.c - the serve verb's request parser (runtime/cli/serve_request.c) without
 * HTTP: defaults (the model's sampler settings, max_tokens 16 / the context for chat, n 1, no
 * logprobs), every field read into the request (ranges at both ends), top_k -1 meaning off,
 * max_completion_tokens, prompts as text / ids / lists (choice order prompt * n + k), chat through
 * the render callback without special tokens, and each refusal with its status, param and a
 * message naming the field: 400, 404, 413, 501; capabilities the server lacks are refused.
 */
#include "ms_test.h"

#include <string.h>

#include "serve_request.h"
#include "ms_test_impl.h"

/* A byte tokenizer: id = byte + 3, BOS 1 when special tokens are added. */
static ms_status t_encode(void *user, const char *text, bool add_special, int32_t **ids, size_t *n,
                          ms_error *err) {
    (void)user;
    (void)err;
    size_t len = strlen(text), k = 0;
    *ids = ms_malloc((len + 1) * sizeof **ids);
    if (add_special)
        (*ids)[k++] = 1;
    for (size_t i = 0; i < len; i++)
        (*ids)[k++] = (unsigned char)text[i] + 3;
    *n = k;
    return MS_OK;
}

/* "R:" + content of each message; a role "bad" fails as raise_exception would. */
static ms_status t_render(void *user, json_t *messages, char **text, ms_error *err) {
    (void)user;
    char buf[256] = "";
    for (size_t i = 0; i < json_array_size(messages); i++) {
        json_t *m = json_array_get(messages, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (strcmp(role, "bad") == 0)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "the template refuses role bad");
        strncat(buf, role, sizeof buf - strlen(buf) - 1);
        strncat(buf, ":", sizeof buf - strlen(buf) - 1);
        strncat(buf, json_string_value(json_object_get(m, "content")), sizeof buf - strlen(buf) - 1);
    }
    *text = ms_strdup(buf);
    return MS_OK;
}

static int n_logged;
static void t_log(void *user, const char *msg) {
    (void)user;
    assert_non_null(strstr(msg, "unknown request field"));
    n_logged++;
}

static ms_serve_ctx ctx(unsigned caps) {
    ms_serve_ctx c = {
        .model_name = "m",
        .vocab = 300,
        .max_context = 64,
        .max_prompts = 8,
        .max_body = 2048,
        .caps = caps,
        .defaults = {0.7f, 40, 0.9f, 0},
        .encode = t_encode,
        .render_chat = t_render,
        .chat_why = "no template here",
        .log = t_log,
    };
    return c;
}

#define ALL_CAPS                                                                                \
    (MS_SERVE_CAP_N | MS_SERVE_CAP_LOGPROBS | MS_SERVE_CAP_ECHO | MS_SERVE_CAP_PENALTIES |      \
     MS_SERVE_CAP_MIN_P)

static ms_serve_request *parse_ok(const ms_serve_ctx *c, const char *body, bool chat) {
    ms_serve_request *r = NULL;
    ms_serve_error e;
    ms_status st = ms_serve_request_parse(c, body, strlen(body), chat, &r, &e);
    if (st != MS_OK)
        fail_msg("%s: refused %u %s: %s", body, e.status, e.param ? e.param : "-", e.msg);
    return r;
}

/* Refused with `status`, param `param` (NULL: none) and a message holding `want`. */
static void refused(const ms_serve_ctx *c, const char *body, bool chat, unsigned status,
                    const char *param, const char *want) {
    ms_serve_request *r = (ms_serve_request *)1;
    ms_serve_error e;
    ms_status st = ms_serve_request_parse(c, body, strlen(body), chat, &r, &e);
    if (st == MS_OK)
        fail_msg("%s: accepted", body);
    assert_null(r);
    assert_int_equal(st, MS_ERR_PARSE);
    if (e.status != status || strstr(e.msg, want) == NULL ||
        (param == NULL ? e.param != NULL : (e.param == NULL || strcmp(e.param, param) != 0)))
        fail_msg("%s: %u %s: %s (want %u %s '%s')", body, e.status, e.param ? e.param : "-", e.msg,
                 status, param ? param : "-", want);
    assert_null(strchr(e.msg, '\n'));
    json_t *o = ms_serve_error_json(&e);
    assert_non_null(o);
    json_decref(o);
}

static void test_defaults_and_fields(void **state) {
    (void)state;
    ms_serve_ctx c = ctx(ALL_CAPS);
    ms_serve_request *r = parse_ok(&c, "{\"prompt\": \"ab\"}", false);
    assert_int_equal(r->n_prompts, 1);
    assert_int_equal(r->prompts[0].n, 3); /* BOS + 2 bytes */
    assert_int_equal(r->prompts[0].ids[0], 1);
    assert_int_equal(r->prompts[0].ids[1], 'a' + 3);
    assert_string_equal(r->prompts[0].text, "ab");
    assert_int_equal(r->n, 1);
    assert_int_equal(r->max_tokens, MS_SERVE_DEFAULT_MAX_TOKENS);
    assert_float_equal(r->sampling.temperature, 0.7f, 0.0);
    assert_int_equal(r->sampling.top_k, 40);
    assert_float_equal(r->sampling.top_p, 0.9f, 0.0);
    assert_false(r->seeded);
    assert_int_equal(r->logprobs, -1);
    assert_float_equal(r->repetition_penalty, 1.0f, 0.0);
    assert_false(r->stream || r->echo || r->ignore_eos || r->include_usage);
    ms_serve_request_free(r);

    n_logged = 0;
    r = parse_ok(&c,
                 "{\"model\": \"m\", \"prompt\": [[5, 6], \"x\"], \"n\": 3, \"best_of\": 3, "
                 "\"max_completion_tokens\": 64, \"temperature\": 0, \"top_p\": 1, \"top_k\": -1, "
                 "\"min_p\": 1, \"seed\": 9, \"stop\": [\"a\", \"bc\"], \"stream\": true, "
                 "\"stream_options\": {\"include_usage\": true}, \"logprobs\": 20, "
                 "\"presence_penalty\": -2, \"frequency_penalty\": 2, \"repetition_penalty\": 2, "
                 "\"ignore_eos\": true, \"user\": \"u\", \"whatever\": [1], \"also\": null}",
                 false);
    assert_int_equal(n_logged, 2);
    assert_int_equal(r->n_prompts, 2);
    assert_int_equal(r->n, 3);
    assert_int_equal(r->prompts[0].n, 2);
    assert_null(r->prompts[0].text);
    assert_int_equal(r->prompts[1].ids[1], 'x' + 3);
    assert_int_equal(r->max_tokens, 64);
    assert_float_equal(r->sampling.temperature, 0.0f, 0.0);
    assert_int_equal(r->sampling.top_k, 0);
    assert_float_equal(r->min_p, 1.0f, 0.0);
    assert_true(r->seeded);
    assert_int_equal((int)r->sampling.seed, 9);
    assert_int_equal(r->n_stops, 2);
    assert_string_equal(r->stops[1], "bc");
    assert_true(r->stream && r->include_usage && r->ignore_eos);
    assert_int_equal(r->logprobs, 20);
    assert_float_equal(r->presence_penalty, -2.0f, 0.0);
    assert_float_equal(r->frequency_penalty, 2.0f, 0.0);
    assert_float_equal(r->repetition_penalty, 2.0f, 0.0);
    ms_serve_request_free(r);

    r = parse_ok(&c, "{\"prompt\": \"q\", \"echo\": true, \"stop\": \"z\", \"max_tokens\": 0}", false);
    assert_true(r->echo);
    assert_int_equal(r->n_stops, 1);
    assert_int_equal(r->max_tokens, 0);
    ms_serve_request_free(r);

    /* chat: rendered, encoded without special tokens; default max_tokens the context */
    r = parse_ok(&c,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"logprobs\": true, "
                 "\"top_logprobs\": 3, \"n\": 2}",
                 true);
    assert_true(r->chat);
    assert_int_equal(r->n_prompts, 1);
    assert_int_equal(r->prompts[0].n, 7); /* "user:hi", no BOS */
    assert_int_equal(r->prompts[0].ids[0], 'u' + 3);
    assert_null(r->prompts[0].text);
    assert_int_equal(r->max_tokens, 64);
    assert_int_equal(r->logprobs, 3);
    assert_int_equal(r->n, 2);
    ms_serve_request_free(r);
    r = parse_ok(&c, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"logprobs\": true}",
                 true);
    assert_int_equal(r->logprobs, 0);
    ms_serve_request_free(r);
}

static void test_refusals(void **state) {
    (void)state;
    ms_serve_ctx c = ctx(ALL_CAPS);
    refused(&c, "{\"prompt\": \"x\",", false, 400, NULL, "not valid JSON");
    refused(&c, "", false, 400, NULL, "not valid JSON");
    refused(&c, "[1]", false, 400, NULL, "must be a JSON object");
    refused(&c, "{\"prompt\": \"x\", \"prompt\": \"y\"}", false, 400, NULL, "not valid JSON");
    refused(&c, "{\"prompt\": \"\\u00ff\xff\"}", false, 400, NULL, "not valid JSON");
    refused(&c, "{\"max_tokens\": 3}", false, 400, "prompt", "'prompt' is required");
    refused(&c, "{\"prompt\": 5}", false, 400, "prompt", "must be a string");
    refused(&c, "{\"prompt\": []}", false, 400, "prompt", "is empty");
    refused(&c, "{\"prompt\": [1, 300]}", false, 400, "prompt", "token 300 at index 1");
    refused(&c, "{\"prompt\": [[1], [2, -1]]}", false, 400, "prompt", "at index 1 [1]");
    refused(&c, "{\"prompt\": [1, 2.5]}", false, 400, "prompt", "prompt[1] is not an integer");
    refused(&c, "{\"prompt\": \"\"}", false, 400, "prompt", "is empty");
    refused(&c, "{\"prompt\": \"a\\u0000b\"}", false, 400, NULL, "u0000 is not allowed"); /* jansson */
    char big[200] = "{\"prompt\": \"";
    memset(big + strlen(big), 'a', 70);
    strcat(big, "\"}");
    refused(&c, big, false, 400, "prompt", "longer than the model's context (64)");
    refused(&c, "{\"prompt\": \"x\", \"model\": \"other\"}", false, 404, "model", "'other' does not exist");
    refused(&c, "{\"prompt\": \"x\", \"model\": 3}", false, 400, "model", "must be a string");
    refused(&c, "{\"prompt\": \"x\", \"temperature\": -0.5}", false, 400, "temperature", "-0.5 is not in");
    refused(&c, "{\"prompt\": \"x\", \"temperature\": \"1\"}", false, 400, "temperature", "must be a number");
    refused(&c, "{\"prompt\": \"x\", \"top_p\": 0}", false, 400, "top_p", "not in (0, 1]");
    refused(&c, "{\"prompt\": \"x\", \"top_k\": -2}", false, 400, "top_k", "-2 is not in");
    refused(&c, "{\"prompt\": \"x\", \"min_p\": 1.01}", false, 400, "min_p", "not in [0, 1]");
    refused(&c, "{\"prompt\": \"x\", \"presence_penalty\": 2.5}", false, 400, "presence_penalty", "not in [-2, 2]");
    refused(&c, "{\"prompt\": \"x\", \"repetition_penalty\": 0}", false, 400, "repetition_penalty", "not in (0, 2]");
    refused(&c, "{\"prompt\": \"x\", \"seed\": -1}", false, 400, "seed", ">= 0");
    refused(&c, "{\"prompt\": \"x\", \"max_tokens\": 65}", false, 400, "max_tokens", "65 is not in [0, 64]");
    refused(&c, "{\"prompt\": \"x\", \"max_completion_tokens\": -1}", false, 400, "max_completion_tokens", "not in");
    refused(&c, "{\"prompt\": \"x\", \"n\": 17}", false, 400, "n", "17 is not in [1, 16]");
    refused(&c, "{\"prompt\": [\"a\", \"b\", \"c\"], \"n\": 3}", false, 400, "prompt", "at most 8 choices");
    refused(&c, "{\"prompt\": \"x\", \"n\": 2, \"best_of\": 3}", false, 400, "best_of", "must equal n (2)");
    refused(&c, "{\"prompt\": \"x\", \"logprobs\": 21}", false, 400, "logprobs", "21 is not in [0, 20]");
    refused(&c, "{\"prompt\": \"x\", \"logprobs\": true}", false, 400, "logprobs", "must be an integer");
    refused(&c, "{\"prompt\": \"x\", \"top_logprobs\": 1}", false, 400, "top_logprobs", "chat field");
    refused(&c, "{\"prompt\": \"x\", \"echo\": true, \"logprobs\": 0}", false, 400, "echo", "prompt's logprobs");
    refused(&c, "{\"prompt\": \"x\", \"stream\": 1}", false, 400, "stream", "must be a boolean");
    refused(&c, "{\"prompt\": \"x\", \"stream_options\": {\"include_usage\": 1}}", false, 400, "stream_options", "include_usage");
    refused(&c, "{\"prompt\": \"x\", \"stop\": [\"\"]}", false, 400, "stop", "stop[0] must hold 1 to 256 bytes");
    refused(&c, "{\"prompt\": \"x\", \"stop\": 4}", false, 400, "stop", "a string or a list");
    refused(&c, "{\"prompt\": \"x\", \"suffix\": \"s\"}", false, 400, "suffix", "not supported");
    refused(&c, "{\"prompt\": \"x\", \"logit_bias\": {\"1\": 2}}", false, 400, "logit_bias", "not supported");
    refused(&c, "{\"prompt\": \"x\", \"messages\": []}", false, 400, "messages", "chat/completions");
    /* chat */
    refused(&c, "{\"prompt\": \"x\", \"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}", true, 400, "prompt", "not 'prompt'");
    refused(&c, "{}", true, 400, "messages", "'messages' is required");
    refused(&c, "{\"messages\": []}", true, 400, "messages", "non-empty list");
    refused(&c, "{\"messages\": [{\"role\": \"user\"}]}", true, 400, "messages", "messages[0].content is missing");
    refused(&c, "{\"messages\": [{\"role\": \"bad\", \"content\": \"a\"}]}", true, 400, "messages", "refuses role bad");
    refused(&c, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"echo\": true}", true, 400, "echo", "completions field");
    refused(&c, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"top_logprobs\": 2}", true, 400, "top_logprobs", "needs 'logprobs': true");
    refused(&c, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"logprobs\": 2}", true, 400, "logprobs", "must be a boolean");
    /* 413 before parsing */
    char huge[2100];
    memset(huge, ' ', sizeof huge - 1);
    huge[sizeof huge - 1] = '\0';
    refused(&c, huge, false, 413, NULL, "over the limit of 2048 bytes");
    /* no template: 501; no tokenizer: text, stop and chat refused */
    c.render_chat = NULL;
    refused(&c, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}", true, 501, NULL, "no template here");
    c = ctx(ALL_CAPS);
    c.encode = NULL;
    refused(&c, "{\"prompt\": \"x\"}", false, 400, "prompt", "needs a tokenizer");
    refused(&c, "{\"prompt\": [1], \"stop\": \"x\"}", false, 400, "stop", "need a tokenizer");
    ms_serve_request *r = parse_ok(&c, "{\"prompt\": [1, 2]}", false);
    ms_serve_request_free(r);
    /* capabilities the server lacks */
    c = ctx(0);
    refused(&c, "{\"prompt\": \"x\", \"n\": 2}", false, 400, "n", "not supported by this server");
    refused(&c, "{\"prompt\": \"x\", \"logprobs\": 1}", false, 400, "logprobs", "not supported");
    refused(&c, "{\"prompt\": \"x\", \"echo\": true}", false, 400, "echo", "not supported");
    refused(&c, "{\"prompt\": \"x\", \"min_p\": 0.1}", false, 400, "min_p", "not supported");
    refused(&c, "{\"prompt\": \"x\", \"frequency_penalty\": 0.1}", false, 400, "frequency_penalty", "not supported");
    r = parse_ok(&c, "{\"prompt\": \"x\", \"n\": 1, \"min_p\": 0, \"repetition_penalty\": 1, \"logprobs\": null}", false);
    ms_serve_request_free(r);
    assert_string_equal(ms_serve_error_type(429), "rate_limit_error");
    assert_string_equal(ms_serve_error_type(404), "not_found_error");
    assert_string_equal(ms_serve_error_type(503), "server_error");
}

/* echo with logprobs and vLLM's prompt_logprobs: served with MS_SERVE_CAP_PROMPT_LOGPROBS */
static void test_prompt_logprobs_fields(void **state) {
    (void)state;
    ms_serve_ctx c = ctx(ALL_CAPS | MS_SERVE_CAP_PROMPT_LOGPROBS);
    ms_serve_request *r = parse_ok(&c, "{\"prompt\": \"ab\"}", false);
    assert_int_equal(r->prompt_logprobs, -1);
    ms_serve_request_free(r);
    r = parse_ok(&c, "{\"prompt\": \"ab\", \"echo\": true, \"logprobs\": 2, \"max_tokens\": 0}", false);
    assert_true(r->echo);
    assert_int_equal(r->logprobs, 2);
    ms_serve_request_free(r);
    r = parse_ok(&c, "{\"prompt\": \"ab\", \"prompt_logprobs\": 3}", false);
    assert_int_equal(r->prompt_logprobs, 3);
    ms_serve_request_free(r);
    r = parse_ok(&c, "{\"prompt\": \"ab\", \"prompt_logprobs\": null}", false);
    assert_int_equal(r->prompt_logprobs, -1);
    ms_serve_request_free(r);
    refused(&c, "{\"prompt\": \"x\", \"prompt_logprobs\": 21}", false, 400, "prompt_logprobs", "21 is not in [0, 20]");
    refused(&c, "{\"prompt\": \"x\", \"prompt_logprobs\": true}", false, 400, "prompt_logprobs", "must be an integer");
    refused(&c, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"prompt_logprobs\": 1}", true, 400, "prompt_logprobs", "not on chat");
    c = ctx(ALL_CAPS);
    refused(&c, "{\"prompt\": \"x\", \"prompt_logprobs\": 1}", false, 400, "prompt_logprobs", "not supported");
    refused(&c, "{\"prompt\": \"x\", \"echo\": true, \"logprobs\": 0}", false, 400, "echo", "--prompt-logprobs-rows 0");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_defaults_and_fields),
        ms_unit_test(test_refusals),
        ms_unit_test(test_prompt_logprobs_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
