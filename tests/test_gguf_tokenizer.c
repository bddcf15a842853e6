/*
 * test_gguf_tokenizer.c - the tokenizer a GGUF carries (engine/gguf_tokenizer.h) read straight
 * from the file: SmolLM2-135M-Instruct's (fetched by scripts/fetch-model.sh) gives llama.cpp's ids
 * on every tokenizer_cases entry of ../shared/fixtures/gguf/smollm2/reference.json and its chat
 * template renders every chat case to prompt_text byte for byte; small GGUFs written with
 * ms_gguf_writer without a tokenizer, without tokens, with an unknown tokenizer model, or a
 * SentencePiece one without scores fail with
 * one line naming the file and the key. (tests/tok_vocab.sh checks the same vocabulary through the
 * gguf Python package's reading; this is the path generate, chat and serve take.)
 */
#include "ms_test.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "chat_template.h"
#include "gguf.h"
#include "gguf_tokenizer.h"
#include "ms_test_impl.h"

static char *fetch_model(void) {
    FILE *p = popen("scripts/fetch-model.sh smollm2", "r");
    if (p == NULL)
        return NULL;
    char line[4096] = {0};
    char *got = fgets(line, sizeof line, p);
    int rc = pclose(p);
    if (got == NULL || rc != 0)
        return NULL;
    line[strcspn(line, "\n")] = '\0';
    return ms_strdup(line);
}

static void test_smollm2_from_the_file(void **state) {
    (void)state;
    char *model = fetch_model();
    if (model == NULL) {
        printf("test_gguf_tokenizer: SKIPPED: scripts/fetch-model.sh smollm2 could not fetch the "
               "model (see its message above)\n");
        skip();
    }
    ms_error err = {0};
    ms_tok_hf *tok = NULL;
    if (ms_gguf_tokenizer_load(model, &tok, &err) != MS_OK)
        fail_msg("%s", err.msg);
    assert_int_equal(ms_tok_hf_vocab_size(tok), 49152);
    assert_int_equal(ms_tok_hf_eos_id(tok), 2);
    assert_true(ms_tok_hf_is_eog(tok, 2));
    json_t *ref = json_load_file(ms_test_fixture("gguf/smollm2/reference.json"), 0, NULL);
    assert_non_null(ref);
    const json_t *cases = json_object_get(ref, "tokenizer_cases");
    assert_int_equal(json_array_size(cases), 16);
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const json_t *c = json_array_get(cases, i), *want = json_object_get(c, "ids");
        const json_t *text = json_object_get(c, "text");
        int32_t *ids = NULL;
        size_t n = 0;
        assert_int_equal(ms_tok_hf_encode(tok, json_string_value(text), json_string_length(text),
                                          true, &ids, &n, &err),
                         MS_OK);
        if (n != json_array_size(want))
            fail_msg("case %zu: %zu ids, llama.cpp has %zu", i, n, json_array_size(want));
        for (size_t k = 0; k < n; k++)
            if (ids[k] != (int32_t)json_integer_value(json_array_get(want, k)))
                fail_msg("case %zu id %zu: %d, llama.cpp %lld", i, k, ids[k],
                         (long long)json_integer_value(json_array_get(want, k)));
        ms_free(ids);
    }
    const char *src = ms_tok_hf_chat_template(tok);
    assert_non_null(src);
    ms_chat_template *tmpl = NULL;
    assert_int_equal(ms_chat_template_init(&tmpl, src, model, &err), MS_OK);
    const json_t *chat = json_object_get(ref, "cases");
    int rendered_cases = 0;
    for (size_t i = 0; i < json_array_size(chat); i++) {
        const json_t *cs = json_array_get(chat, i);
        const char *kind = json_string_value(json_object_get(cs, "kind"));
        if (kind == NULL || strcmp(kind, "chat") != 0)
            continue;
        char *out = NULL;
        assert_int_equal(ms_chat_template_render(tmpl, json_object_get(cs, "messages"), true,
                                                 ms_tok_hf_bos_token(tok), ms_tok_hf_eos_token(tok),
                                                 &out, &err),
                         MS_OK);
        assert_string_equal(out, json_string_value(json_object_get(cs, "prompt_text")));
        ms_free(out);
        rendered_cases++;
    }
    assert_int_equal(rendered_cases, 3);
    ms_chat_template_free(tmpl);
    json_decref(ref);
    ms_tok_hf_free(tok);
    ms_free(model);
}

/* A GGUF with the given tokenizer keys and no tensors; returns its path (static buffer). */
static const char *write_gguf(const char *model, bool tokens, int64_t eos) {
    static char path[64];
    snprintf(path, sizeof path, "/tmp/ms-gguf-tok-%d.gguf", (int)getpid());
    ms_error err = {0};
    ms_gguf_writer *w = NULL;
    assert_int_equal(ms_gguf_writer_init(&w, path, &err), MS_OK);
    assert_int_equal(ms_gguf_writer_set_str(w, "general.architecture", "llama", &err), MS_OK);
    if (model != NULL)
        assert_int_equal(ms_gguf_writer_set_str(w, "tokenizer.ggml.model", model, &err), MS_OK);
    if (tokens) {
        const char *t[3] = {"<unk>", "a", "b"};
        assert_int_equal(ms_gguf_writer_set_str_array(w, "tokenizer.ggml.tokens", t, 3, &err),
                         MS_OK);
    }
    if (eos >= 0)
        assert_int_equal(ms_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos,
                                                &err),
                         MS_OK);
    assert_int_equal(ms_gguf_writer_finish(w, &err), MS_OK);
    ms_gguf_writer_free(w);
    return path;
}

static void expect_msg(const ms_error *err, const char *needle) {
    if (strstr(err->msg, needle) == NULL)
        fail_msg("message lacks '%s': %s", needle, err->msg);
}

static void test_bad_tokenizer_metadata(void **state) {
    (void)state;
    ms_error err = {0};
    ms_tok_hf *tok = NULL;
    const char *p = write_gguf(NULL, false, -1);
    assert_int_equal(ms_gguf_tokenizer_load(p, &tok, &err), MS_ERR_NOT_FOUND);
    expect_msg(&err, "no tokenizer");
    expect_msg(&err, p);
    p = write_gguf("gpt2", false, -1);
    assert_int_equal(ms_gguf_tokenizer_load(p, &tok, &err), MS_ERR_NOT_FOUND);
    expect_msg(&err, "tokenizer.ggml.tokens");
    p = write_gguf("wordpiece", true, -1);
    assert_true(ms_gguf_tokenizer_load(p, &tok, &err) != MS_OK);
    expect_msg(&err, "wordpiece");
    /* a SentencePiece vocabulary needs its scores */
    p = write_gguf("llama", true, 2);
    assert_true(ms_gguf_tokenizer_load(p, &tok, &err) != MS_OK);
    expect_msg(&err, "tokenizer.ggml.scores");
    assert_null(tok);
    assert_true(ms_gguf_tokenizer_load("/nonexistent.gguf", &tok, &err) != MS_OK);
    expect_msg(&err, "/nonexistent.gguf");
    unlink(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_smollm2_from_the_file),
        ms_unit_test(test_bad_tokenizer_metadata),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
