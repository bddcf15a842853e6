/*
 * test_chat_template.c - the Jinja chat-template engine (runtime/tokenizers/chat_template.c)
 * against goldens rendered by Python jinja2 3.1.6 (tests/chat/gen_goldens.py): the templates of
 * Llama 3.1 and Qwen3 (../shared/fixtures/tokenizers), SmolLM2 (its GGUF's), Mistral Instruct
 * and a hand-written one covering the subset, over the conversations of tests/chat/cases.json,
 * with and without add_generation_prompt, byte for byte (raise_exception cases: the message).
 * Then errors: unsupported features at load with line:col, syntax errors, raise_exception,
 * undefined variables, type errors, deep nesting, huge inputs, limits, allocation failures,
 * tokenizer_config.json loading. Run from the project root (tests/chat/ is read from there).
 */
#include "ms_test.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat_template.h"

#include "ms_test_impl.h"

#define CASES "tests/chat/cases.json"

/* Whole file into a malloc'd NUL-terminated string (NULL when absent). */
static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    assert_non_null(s);
    assert_int_equal(fread(s, 1, (size_t)n, f), (size_t)n);
    s[n] = '\0';
    fclose(f);
    if (len != NULL)
        *len = (size_t)n;
    return s;
}

/* The template text of a cases.json template spec (ms_malloc'd). */
static char *spec_text(const json_t *spec, char *name, size_t name_len) {
    ms_error err = {0};
    const char *file = json_string_value(json_object_get(spec, "file"));
    if (file != NULL) {
        snprintf(name, name_len, "tests/chat/%s", file);
        char *t = read_file(name, NULL);
        assert_non_null(t);
        char *c = ms_strdup(t);
        free(t);
        return c;
    }
    snprintf(name, name_len, "%s", ms_test_fixture(json_string_value(json_object_get(spec, "fixture"))));
    char *text = NULL;
    ms_status st = ms_chat_template_load_config(name, &text, &err);
    if (st != MS_OK)
        fail_msg("%s", err.msg);
    return text;
}

static void test_goldens(void **state) {
    (void)state;
    json_error_t je;
    json_t *cases = json_load_file(CASES, 0, &je);
    if (cases == NULL)
        fail_msg("%s: %s", CASES, je.text);
    const char *tname;
    json_t *spec;
    int n_ok = 0, n_err = 0, n_bad = 0;
    json_object_foreach(json_object_get(cases, "templates"), tname, spec) {
        char path[4096];
        char *text = spec_text(spec, path, sizeof path);
        ms_chat_template *t = NULL;
        ms_error err = {0};
        if (ms_chat_template_init(&t, text, path, &err) != MS_OK)
            fail_msg("%s", err.msg);
        ms_free(text);
        const char *cname;
        json_t *conv;
        json_object_foreach(json_object_get(cases, "conversations"), cname, conv) {
            for (int gen = 0; gen < 2; gen++) {
                json_t *vars = json_deep_copy(json_object_get(spec, "vars"));
                json_object_set(vars, "messages", conv);
                json_object_set_new(vars, "add_generation_prompt", json_boolean(gen));
                json_object_set_new(vars, "tools", json_null());
                char golden[512];
                snprintf(golden, sizeof golden, "tests/chat/goldens/%s.%s.%s", tname, cname, gen ? "gen" : "nogen");
                char gpath[600];
                snprintf(gpath, sizeof gpath, "%s.txt", golden);
                size_t want_len = 0;
                char *want = read_file(gpath, &want_len);
                char *got = NULL;
                size_t got_len = 0;
                ms_status st = ms_chat_template_render_vars(t, vars, &got, &got_len, &err);
                if (want != NULL) {
                    if (st != MS_OK) {
                        fprintf(stderr, "%s: render failed: %s\n", gpath, err.msg);
                        n_bad++;
                    } else if (got_len != want_len || memcmp(got, want, want_len) != 0) {
                        size_t d = 0;
                        while (d < got_len && d < want_len && got[d] == want[d])
                            d++;
                        fprintf(
                            stderr,
                            "%s: differs at byte %zu (got %zu bytes, want %zu)\n  got:  \"%.60s\"\n  want: \"%.60s\"\n",
                            gpath, d, got_len, want_len, got + d, want + d);
                        n_bad++;
                    } else {
                        n_ok++;
                    }
                } else {
                    snprintf(gpath, sizeof gpath, "%s.err", golden);
                    want = read_file(gpath, NULL);
                    assert_non_null(want);
                    char *msg = want + strlen("ERROR: ");
                    msg[strcspn(msg, "\n")] = '\0';
                    if (st != MS_ERR_INVALID_ARG || strstr(err.msg, "raise_exception: ") == NULL ||
                        strstr(err.msg, msg) == NULL) {
                        fprintf(stderr, "%s: want raise_exception '%s', got status %d: %s\n", gpath, msg, (int)st,
                                st == MS_OK ? got : err.msg);
                        n_bad++;
                    } else {
                        n_err++;
                    }
                }
                free(want);
                ms_free(got);
                json_decref(vars);
            }
        }
        ms_chat_template_free(t);
    }
    json_decref(cases);
    fprintf(stderr, "goldens: %d identical, %d raise_exception as expected, %d wrong\n", n_ok, n_err, n_bad);
    assert_int_equal(n_bad, 0);
    assert_true(n_ok >= 50);
}

/* tests/chat/goldens/snippets.json: small templates over cases.json's snippet_messages; a snippet
 * jinja2 refused must fail here too (at load or render). */
static void test_snippets(void **state) {
    (void)state;
    json_error_t je;
    json_t *cases = json_load_file(CASES, 0, &je);
    /* MS_CHAT_SNIPPETS: another file of the same form (tests/chat/differential.py writes one) */
    const char *sp = getenv("MS_CHAT_SNIPPETS");
    json_t *snips = json_load_file(sp != NULL && *sp ? sp : "tests/chat/goldens/snippets.json", 0, &je);
    assert_non_null(cases);
    assert_non_null(snips);
    const json_t *msgs = json_object_get(cases, "snippet_messages");
    size_t i;
    json_t *c;
    int bad = 0;
    json_array_foreach(snips, i, c) {
        const char *src = json_string_value(json_object_get(c, "template"));
        const char *want = json_string_value(json_object_get(c, "output"));
        ms_error err = {0};
        ms_chat_template *t = NULL;
        char *out = NULL;
        ms_status st = ms_chat_template_init(&t, src, "snippet", &err);
        if (st == MS_OK)
            st = ms_chat_template_render(t, msgs, true, "<s>", "</s>", &out, &err);
        if (want == NULL && st == MS_OK) {
            fprintf(stderr, "snippet %zu: jinja2 fails (%s), we render \"%s\"\n  %s\n", i,
                    json_string_value(json_object_get(c, "error")), out, src);
            bad++;
        } else if (want != NULL && st != MS_OK) {
            fprintf(stderr, "snippet %zu: %s\n  %s\n", i, err.msg, src);
            bad++;
        } else if (want != NULL && strcmp(out, want) != 0) {
            fprintf(stderr, "snippet %zu differs:\n  src:  %s\n  got:  \"%s\"\n  want: \"%s\"\n", i, src, out, want);
            bad++;
        }
        ms_free(out);
        ms_chat_template_free(t);
    }
    fprintf(stderr, "snippets: %zu, %d wrong\n", json_array_size(snips), bad);
    json_decref(snips);
    json_decref(cases);
    assert_int_equal(bad, 0);
}

/* ---- helpers for the error cases ---- */

/* Render `src` with messages = [{"role": "user", "content": "hi"}]; returns the status. */
static ms_status render_src(const char *src, char **out, ms_error *err) {
    ms_chat_template *t = NULL;
    *out = NULL;
    ms_status st = ms_chat_template_init(&t, src, "t.jinja", err);
    if (st != MS_OK)
        return st;
    json_t *msgs = json_pack("[{s:s,s:s}]", "role", "user", "content", "hi");
    st = ms_chat_template_render(t, msgs, true, "<s>", "</s>", out, err);
    json_decref(msgs);
    ms_chat_template_free(t);
    return st;
}

static void expect_out(const char *src, const char *want) {
    char *out = NULL;
    ms_error err = {0};
    ms_status st = render_src(src, &out, &err);
    if (st != MS_OK)
        fail_msg("%s: %s", src, err.msg);
    if (strcmp(out, want) != 0)
        fail_msg("%s: got \"%s\", want \"%s\"", src, out, want);
    ms_free(out);
}

static void expect_fail(const char *src, ms_status code, const char *msg) {
    char *out = NULL;
    ms_error err = {0};
    ms_status st = render_src(src, &out, &err);
    if (st != code || strstr(err.msg, msg) == NULL)
        fail_msg("%s: got status %d \"%s\", want %d \"%s\"", src, (int)st, st == MS_OK ? out : err.msg, (int)code, msg);
    assert_null(out);
    assert_null(strchr(err.msg, '\n'));
}

static void test_load_errors(void **state) {
    (void)state;
    expect_fail("hello\n{% macro m() %}{% endmacro %}", MS_ERR_UNSUPPORTED, "t.jinja:2:4: unsupported tag 'macro'");
    expect_fail("{{ x | wordwrap }}", MS_ERR_UNSUPPORTED, "t.jinja:1:8: unsupported filter 'wordwrap'");
    expect_fail("a\n  {% if x is sameas 1 %}{% endif %}", MS_ERR_UNSUPPORTED,
                "t.jinja:2:14: unsupported test 'sameas'");
    expect_fail("{{ cycler(1) }}", MS_ERR_UNSUPPORTED, "t.jinja:1:4: unsupported function 'cycler'");
    expect_fail("{{ 'a'.zfill(3) }}", MS_ERR_UNSUPPORTED, "t.jinja:1:8: unsupported method 'zfill'");
    expect_fail("{% raw %}x{% endraw %}", MS_ERR_UNSUPPORTED, "unsupported tag 'raw'");
    expect_fail("{% for x in y recursive %}{% endfor %}", MS_ERR_UNSUPPORTED, "recursive");
    expect_fail("{% if x %}no end", MS_ERR_PARSE, "t.jinja:1:17: missing '{% endif %}' (to close '{% if %}' at 1:4)");
    expect_fail("{{ 'unterminated }}", MS_ERR_PARSE, "t.jinja:1:4: unterminated string");
    expect_fail("{{ 1 + }}", MS_ERR_PARSE, "t.jinja:1:8: expected an expression, found '}}'");
    expect_fail("{% endfor %}", MS_ERR_PARSE, "unexpected '{% endfor %}'");
    expect_fail("{{ a b }}", MS_ERR_PARSE, "expected '}}'");
    expect_fail("{# open comment", MS_ERR_PARSE, "unterminated comment");
    expect_fail("{{ x", MS_ERR_PARSE, "unterminated '{{' tag");
    expect_fail("{{ 99999999999999999999 }}", MS_ERR_UNSUPPORTED, "beyond 64 bits");
    expect_fail("{{ x @ y }}", MS_ERR_PARSE, "unexpected character '@'");
    expect_fail("{% set a, b = 1, 2 %}", MS_ERR_UNSUPPORTED, "t.jinja:1:9: unsupported: set with several targets");
    /* NULL text */
    ms_chat_template *t = (ms_chat_template *)1;
    ms_error err = {0};
    assert_int_equal(ms_chat_template_init(&t, NULL, "x", &err), MS_ERR_INVALID_ARG);
    assert_null(t);
}

static void test_render_errors(void **state) {
    (void)state;
    expect_fail("ok\n{{ raise_exception('Conversation roles must alternate') }}", MS_ERR_INVALID_ARG,
                "t.jinja:2:4: raise_exception: Conversation roles must alternate");
    expect_fail("{{ raise_exception('two\nlines') }}", MS_ERR_INVALID_ARG, "raise_exception: two\\nlines");
    expect_fail("{{ 'a' + 1 }}", MS_ERR_FORMAT, "unsupported operand types for +: string and int");
    expect_fail("{{ missing.attr }}", MS_ERR_FORMAT, "an undefined value has no attribute 'attr'");
    expect_fail("{{ 1 // 0 }}", MS_ERR_FORMAT, "division or modulo by zero");
    expect_fail("{{ 9223372036854775807 + 1 }}", MS_ERR_LIMIT, "integer overflow");
    expect_fail("{% set x = 1 %}{% set x.y = 2 %}", MS_ERR_FORMAT, "non-namespace");
    expect_fail("{{ none | tojson }}{{ (messages[0], loop) | tojson }}", MS_ERR_FORMAT, "not JSON serializable");
    expect_fail("{{ 'a' < 1 }}", MS_ERR_FORMAT, "'<' not supported between string and int");
    expect_fail("{{ 'x' * 1000000000 * 1000 }}", MS_ERR_LIMIT, "MiB");
    expect_fail("{% set r = range(5000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}", MS_ERR_LIMIT,
                "steps");
    expect_fail("{% set ns = namespace(x=[]) %}{% for i in range(100) %}{% set ns.x = [ns.x] %}{% endfor %}",
                MS_ERR_LIMIT, "nested deeper than 64");
    expect_fail("{% for x in 5 %}{% endfor %}", MS_ERR_FORMAT, "int is not iterable");
    /* jinja2's sandbox MAX_RANGE: a range of millions is refused before it is built (fuzz) */
    expect_fail("{{ range(66666620) | length }}", MS_ERR_LIMIT,
                "t.jinja:1:4: range() of 66666620 items is over the limit of 100000");
    expect_fail("{{ range(9223372036854775807, -9223372036854775807, -1) | length }}", MS_ERR_LIMIT,
                "over the limit of 100000");
    expect_out("{{ range(100000) | length }} {{ range(10, 0, -3) | list | length }}", "100000 4");
}

static void test_undefined_and_semantics(void **state) {
    (void)state;
    expect_out(
        "[{{ nope }}][{{ nope | length }}][{{ nope is defined }}][{% for x in nope %}x{% endfor %}][{{ nope ~ 'a' }}]",
        "[][0][False][][a]");
    expect_out("{{ messages[5] is defined }}{{ messages[0].nokey is defined }}{{ messages[-1]['content'] }}",
               "FalseFalsehi");
    expect_out("{% set x = 1 %}{% for i in range(3) %}{{ x }}{% set x = x + 1 %}{{ x }};{% endfor %}{{ x }}",
               "12;12;12;1");
    expect_out("{% for i in range(3) %}{% if i == 1 %}{% set y = 5 %}{% endif %}{{ y }};{% endfor %}", ";5;;");
    expect_out("{{ bos_token }}{{ eos_token }}{{ add_generation_prompt }}{{ tools }}", "<s></s>TrueNone");
    expect_out("{{ 'abc'[::-1] }}{{ [1,2,3][1:] }}{{ 'héllo'[1:3] }}{{ 'abcdef'[::2] }}{{ [1,2,3][-5:-1] }}",
               "cba[2, 3]élace[1, 2]");
    expect_out("{{ 1 if 0 }}|{{ 'a' and 'b' }}|{{ '' or 'c' }}|{{ not 1 == 2 }}|{{ 1 in [1] }}|{{ 'k' in {'k': 1} }}",
               "|b|c|True|True|True");
    expect_out("{{ 0.1 + 0.2 }} {{ 1.0 }} {{ 1e16 }} {{ 123456789.123 }} {{ -0.0 }} {{ 2 ** -1 }} {{ 10 / 4 }}",
               "0.30000000000000004 1.0 1e+16 123456789.123 -0.0 0.5 2.5");
    expect_out("{{ {'a': 'é\"\\u0001'} | tojson }} {{ 'x\\ty' | tojson }} {{ [1.5e300, 1e-7] | tojson }}",
               "{\"a\": \"é\\\"\\u0001\"} \"x\\ty\" [1.5e+300, 1e-07]");
    expect_out("  {%- if true -%}  a  {%- endif -%}  \n b", "ab");
    expect_out("x\r\ny\n", "x\ny");
    expect_out("{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}", "[hi]");
    expect_out("{{ \"it's\" }} {{ ['it\\'s', \"q\"] }}", "it's [\"it's\", 'q']");
}

/* Deep nesting fails cleanly (bounded recursion), at load and in input values. */
static void test_deep_nesting(void **state) {
    (void)state;
    size_t n = 100000;
    char *src = malloc(8 * n + 16);
    assert_non_null(src);
    const char *const pats[] = {"(", "[", "-", "not ", "{% if 1 %}"};
    for (size_t k = 0; k < MS_ARRAY_LEN(pats); k++) {
        size_t w = 0;
        memcpy(src + w, "{{ ", 3);
        w = k == 4 ? 0 : 3;
        size_t pl = strlen(pats[k]);
        for (size_t i = 0; i < n / pl / 2 && w + pl < 4 * n; i++) {
            memcpy(src + w, pats[k], pl);
            w += pl;
        }
        size_t opened = w - (k == 4 ? 0 : 3);
        src[w++] = '1';
        for (size_t i = 0; k < 2 && i < opened; i++)
            src[w++] = k == 0 ? ')' : ']';
        memcpy(src + w, k == 4 ? "" : " }}", k == 4 ? 1 : 4);
        char *out = NULL;
        ms_error err = {0};
        ms_status st = render_src(src, &out, &err);
        if (st == MS_OK || strstr(err.msg, "nested deeper than") == NULL)
            fail_msg("pattern '%s': status %d: %s", pats[k], (int)st, err.msg);
    }
    /* a long flat chain: left-deep tree */
    size_t w = 0;
    memcpy(src, "{{ 1", 4);
    w = 4;
    for (size_t i = 0; i < 20000; i++) {
        memcpy(src + w, "+1", 2);
        w += 2;
    }
    memcpy(src + w, " }}", 4);
    char *out = NULL;
    ms_error err = {0};
    assert_int_equal(render_src(src, &out, &err), MS_ERR_LIMIT);
    free(src);
    /* deeply nested input JSON */
    json_t *deep = json_string("x");
    for (int i = 0; i < 500; i++) {
        json_t *a = json_array();
        json_array_append_new(a, deep);
        deep = a;
    }
    json_t *msgs = json_pack("[{s:s,s:o}]", "role", "user", "content", deep);
    ms_chat_template *t = NULL;
    assert_int_equal(ms_chat_template_init(&t, "{{ messages }}", "t", &err), MS_OK);
    assert_int_equal(ms_chat_template_render(t, msgs, false, NULL, NULL, &out, &err), MS_ERR_LIMIT);
    assert_null(out);
    json_decref(msgs);
    ms_chat_template_free(t);
}

/* A 16 MB message through the real Qwen3 template, and 20,000 messages. */
static void test_huge_input(void **state) {
    (void)state;
    ms_error err = {0};
    char *text = NULL;
    assert_int_equal(
        ms_chat_template_load_config(ms_test_fixture("tokenizers/qwen3/tokenizer_config.json"), &text, &err), MS_OK);
    ms_chat_template *t = NULL;
    assert_int_equal(ms_chat_template_init(&t, text, "qwen3", &err), MS_OK);
    ms_free(text);
    size_t big = 16u << 20;
    char *content = malloc(big + 1);
    assert_non_null(content);
    memset(content, 'a', big);
    content[big] = '\0';
    json_t *msgs = json_pack("[{s:s,s:s}]", "role", "user", "content", content);
    free(content);
    char *out = NULL;
    ms_status st = ms_chat_template_render(t, msgs, true, NULL, "<|im_end|>", &out, &err);
    if (st != MS_OK)
        fail_msg("%s", err.msg);
    assert_true(strlen(out) > big);
    ms_free(out);
    json_decref(msgs);
    msgs = json_array();
    for (int i = 0; i < 20000; i++)
        json_array_append_new(msgs,
                              json_pack("{s:s,s:s}", "role", i % 2 ? "assistant" : "user", "content", "hello there"));
    st = ms_chat_template_render(t, msgs, true, NULL, "<|im_end|>", &out, &err);
    if (st != MS_OK)
        fail_msg("%s", err.msg);
    assert_true(strlen(out) > 20000 * 20);
    ms_free(out);
    json_decref(msgs);
    ms_chat_template_free(t);
}

/* Every allocation of init and render failing in turn: a clean error, no leak, no crash. */
static void test_alloc_failures(void **state) {
    (void)state;
    char path[4096];
    json_t *spec = json_pack("{s:s}", "fixture", "tokenizers/qwen3/tokenizer_config.json");
    char *text = spec_text(spec, path, sizeof path);
    json_decref(spec);
    json_t *msgs = json_pack("[{s:s,s:s},{s:s,s:s}]", "role", "user", "content", "hi", "role", "assistant", "content",
                             "<think>a</think>b");
    int failures = 0;
    for (int64_t k = 1; k < 400; k++) {
        ms_error err = {0};
        ms_chat_template *t = NULL;
        char *out = NULL;
        ms_alloc_fail_nth(k);
        ms_status st = ms_chat_template_init(&t, text, "qwen3", &err);
        if (st == MS_OK)
            st = ms_chat_template_render(t, msgs, true, NULL, "<|im_end|>", &out, &err);
        ms_alloc_fail_nth(0);
        if (st != MS_OK) {
            assert_int_equal(st, MS_ERR_OOM);
            assert_null(out);
            failures++;
        }
        ms_free(out);
        ms_chat_template_free(t);
        if (st == MS_OK)
            break;
    }
    assert_true(failures > 3);
    ms_free(text);
    json_decref(msgs);
}

static void test_load_config(void **state) {
    (void)state;
    char dir[] = "/tmp/ms_test_chat_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char p[256];
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    ms_error err = {0};
    char *text = NULL;
    FILE *f = fopen(p, "w");
    fputs("{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}, {\"name\": \"default\", \"template\": "
          "\"D{{ 1 }}\"}]}",
          f);
    fclose(f);
    assert_int_equal(ms_chat_template_load_config(p, &text, &err), MS_OK);
    assert_string_equal(text, "D{{ 1 }}");
    ms_free(text);
    f = fopen(p, "w");
    fputs("{\"bos_token\": \"<s>\"}", f);
    fclose(f);
    assert_int_equal(ms_chat_template_load_config(p, &text, &err), MS_ERR_NOT_FOUND);
    assert_null(text);
    f = fopen(p, "w");
    fputs("{\"chat_template\": 5}", f);
    fclose(f);
    assert_int_equal(ms_chat_template_load_config(p, &text, &err), MS_ERR_FORMAT);
    f = fopen(p, "w");
    fputs("{\"chat_template\": ", f);
    fclose(f);
    assert_int_equal(ms_chat_template_load_config(p, &text, &err), MS_ERR_PARSE);
    unlink(p);
    assert_int_equal(ms_chat_template_load_config(p, &text, &err), MS_ERR_IO);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_goldens),
        ms_unit_test(test_snippets),
        ms_unit_test(test_load_errors),
        ms_unit_test(test_render_errors),
        ms_unit_test(test_undefined_and_semantics),
        ms_unit_test(test_deep_nesting),
        ms_unit_test(test_huge_input),
        ms_unit_test(test_alloc_failures),
        ms_unit_test(test_load_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
