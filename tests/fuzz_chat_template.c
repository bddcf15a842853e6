/*
 * fuzz_chat_template.c - libFuzzer target for the Jinja chat-template engine
 * (runtime/tokenizers/chat_template.c).
 *
 * Input: template text, then optionally a NUL and a JSON `messages` array (when it is missing or
 * does not parse, a fixed three-message conversation is used), then optionally a NUL and one byte
 * whose low bit is add_generation_prompt. The template is parsed; a parsed one is rendered twice
 * (the two renders must agree byte for byte: rendering is deterministic) through
 * ms_chat_template_render, and once through render_vars with extra variables. A failure must be
 * one line and not out of memory, nothing may leak; ASan/UBSan catch the rest.
 * Run it with `make fuzz FUZZ_TARGETS=chat_template`.
 */
#include "fuzz_util.h"

#include <jansson.h>

#include "chat_template.h"

static const char fuzz_default_messages[] =
    "[{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi <think>x</think>\"},"
    " {\"role\": \"assistant\", \"content\": \"<think>\\nhm\\n</think>\\n\\nHello \\u00e9\"}]";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 65536)
        return -1;
    int64_t live = ms_alloc_get_stats().live_blocks;
    const uint8_t *tmpl, *msgs = NULL, *flags = NULL;
    size_t tmpl_len, msgs_len = 0, flags_len = 0;
    fuzz_part(data, size, 0, &tmpl, &tmpl_len);
    bool have_msgs = fuzz_part(data, size, 1, &msgs, &msgs_len);
    bool agp = fuzz_part(data, size, 2, &flags, &flags_len) && flags_len > 0 && (flags[0] & 1);
    char *text = fuzz_strndup(tmpl, tmpl_len);
    json_t *messages = NULL;
    if (have_msgs)
        messages = json_loadb((const char *)msgs, msgs_len, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    if (messages == NULL)
        messages = json_loads(fuzz_default_messages, 0, NULL);
    if (messages == NULL)
        abort();

    ms_chat_template *t = NULL;
    ms_error err = {0};
    ms_status st = ms_chat_template_init(&t, text, "fuzz.jinja", &err);
    fuzz_check_error("fuzz_chat_template", st, &err);
    if (st == MS_OK) {
        char *a = NULL, *b = NULL;
        ms_status s1 = ms_chat_template_render(t, messages, agp, "<s>", "</s>", &a, &err);
        fuzz_check_error("fuzz_chat_template", s1, &err);
        char first_msg[MS_ERROR_MSG_MAX];
        snprintf(first_msg, sizeof first_msg, "%s", err.msg);
        ms_status s2 = ms_chat_template_render(t, messages, agp, "<s>", "</s>", &b, &err);
        if (s1 != s2 || (s1 == MS_OK && strcmp(a, b) != 0) || (s1 != MS_OK && strcmp(first_msg, err.msg) != 0)) {
            fprintf(stderr, "fuzz_chat_template: two renders differ (status %d vs %d)\n", (int)s1, (int)s2);
            abort();
        }
        if ((s1 == MS_OK) != (a != NULL)) {
            fprintf(stderr, "fuzz_chat_template: status %d with output %p\n", (int)s1, (void *)a);
            abort();
        }
        ms_free(a);
        ms_free(b);
        json_t *vars =
            json_pack("{s:O,s:b,s:n,s:s,s:b,s:[{s:s}]}", "messages", messages, "add_generation_prompt", !agp, "tools",
                      "date_string", "26 Jul 2024", "enable_thinking", false, "documents", "title", "d");
        if (vars != NULL) {
            size_t len = 0;
            st = ms_chat_template_render_vars(t, vars, &a, &len, &err);
            fuzz_check_error("fuzz_chat_template", st, &err);
            if (st == MS_OK && strlen(a) > len) {
                fprintf(stderr, "fuzz_chat_template: output longer than its length\n");
                abort();
            }
            ms_free(a);
            json_decref(vars);
        }
    }
    ms_chat_template_free(t);
    json_decref(messages);
    free(text);
    fuzz_check_leaks("fuzz_chat_template", live);
    return 0;
}
