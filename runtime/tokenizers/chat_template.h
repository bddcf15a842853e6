/*
 * chat_template.h - Jinja chat templates (tokenizer_config.json's `chat_template`, a GGUF's
 * `tokenizer.chat_template`) parsed and rendered by an engine of our own, byte for byte as
 * transformers' apply_chat_template renders them with Python jinja2 (3.1):
 * Environment(trim_blocks=True, lstrip_blocks=True), keep_trailing_newline=False, the loopcontrols
 * extension, raise_exception and strftime_now as globals, and tojson as json.dumps(ensure_ascii=False).
 *
 * The subset real chat templates use (anything else fails at load, "<name>:<line>:<col>: ..."):
 *   - text, {{ expr }}, {% stmt %}, {# comment #}, whitespace control {%- -%} {{- -}} {#- -#}
 *     and {%+ +%}, trim_blocks / lstrip_blocks; \r\n and \r in the source become \n and one
 *     trailing newline is dropped, as jinja2 does;
 *   - statements: if / elif / else, for (one name or a tuple of names; `if` filter; else; loop.index,
 *     index0, revindex, revindex0, first, last, length, previtem, nextitem), break / continue,
 *     set NAME = expr, set NS.ATTR = expr (NS a namespace()), {% set NAME %}...{% endset %},
 *     {% generation %}...{% endgeneration %} (transformers' marker: renders its body);
 *     scoping as jinja2's: a for body is a fresh scope per iteration, if does not open one;
 *   - expressions: none/true/false (any case jinja2 allows), ints, floats, strings (Python
 *     escapes), lists, tuples, dicts, NAME, a.b, a[b], slices a[b:c:d], calls, filters, tests,
 *     `x if c else y`, and/or/not, == != < > <= >=, in / not in, + - * / // % ** ~, unary - +;
 *   - globals: raise_exception(msg), namespace(k=v, ...), range(...), strftime_now(fmt);
 *   - filters: trim, tojson(indent=), length / count, default / d, upper, lower, replace, string,
 *     first, last, join, list, int, float, abs, capitalize, title, safe, items, reverse,
 *     map(attribute=, default=) / map('<filter without arguments>'), select / reject and
 *     selectattr / rejectattr (with a test name and argument, or truthiness);
 *   - tests: defined, undefined, none, string, number, integer, float, boolean, true, false,
 *     mapping, iterable, sequence, odd, even, divisibleby, eq / ne / equalto, lower, upper;
 *   - methods: str.strip / lstrip / rstrip / startswith / endswith / split / upper / lower /
 *     replace / title / capitalize / find / count / join, dict.get / items / keys / values.
 * Values: none, bool, int (64-bit; overflow is an error, not a big integer), float (printed as
 * Python's repr), string (UTF-8; length, indexing and slicing count code points), list and tuple,
 * dict (string keys, insertion order), namespace, undefined (jinja2's default Undefined: prints as
 * "", is false, iterates as empty; an attribute of it, or arithmetic on it, is an error).
 * upper / lower / title / capitalize map ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic
 * letters as Python does, other scripts are left as they are; strip / trim / split() use Python's
 * white space. Not supported: macros, call blocks, include / import / extends, filter blocks,
 * `{% set a, b = ... %}`, recursive loops, loop.cycle, the `is sameas` family of rare tests.
 *
 * Limits (errors, never crashes): 128 levels of nesting in expressions and 64 of blocks, 64 levels
 * of list/dict nesting in values, 10,000,000 evaluation steps and 512 MiB of memory per render.
 *
 * Errors: ms_chat_template_init fails with MS_ERR_PARSE (a syntax error) or MS_ERR_UNSUPPORTED (an
 * unsupported tag, filter, test, function or method) and "<name>:<line>:<col>: <what>". Render
 * fails with MS_ERR_INVALID_ARG for raise_exception ("<name>:<line>:<col>: raise_exception: <msg>":
 * the template refused the conversation, e.g. roles that do not alternate: a client error),
 * MS_ERR_FORMAT for a type error in the template (e.g. '+' on a string and an int), MS_ERR_LIMIT
 * for a limit above and MS_ERR_OOM; messages are one line.
 *
 * Thread safety: a parsed template is read-only; several threads may render it at once.
 *
 * Ownership: ms_chat_template_* functions borrow their arguments; the template returned by init is
 * owned by the caller (ms_chat_template_free, NULL accepted); strings returned through out
 * parameters are fresh ms_malloc blocks the caller frees with ms_free.
 *
 * Usage (a server turning an OpenAI `messages` array into a prompt):
 *     ms_error err = {0};
 *     char *text = NULL;
 *     ms_status st = ms_chat_template_load_config("model/tokenizer_config.json", &text, &err);
 *     ms_chat_template *t = NULL;
 *     if (st == MS_OK)
 *         st = ms_chat_template_init(&t, text, "model/tokenizer_config.json", &err);
 *     ms_free(text);
 *     // messages: a jansson array of {"role": ..., "content": ...} objects
 *     char *prompt = NULL;
 *     if (st == MS_OK)
 *         st = ms_chat_template_render(t, messages, true, "<|begin_of_text|>", "<|eot_id|>", &prompt, &err);
 *     if (st != MS_OK) fprintf(stderr, "%s\n", err.msg);   // raise_exception: MS_ERR_INVALID_ARG -> 400
 *     ... tokenize prompt (the template already wrote bos_token: encode without adding specials) ...
 *     ms_free(prompt);
 *     ms_chat_template_free(t);
 */
#ifndef MS_CHAT_TEMPLATE_H
#define MS_CHAT_TEMPLATE_H

#include <jansson.h>

#include "ms_base.h"

typedef struct ms_chat_template ms_chat_template;

/*
 * Parse `text` (NUL-terminated Jinja source) into *out. `name` (a file name, borrowed during the
 * call and copied) prefixes every error message, at load and at render. On failure *out is NULL.
 */
ms_status ms_chat_template_init(ms_chat_template **out, const char *text, const char *name, ms_error *err);

/* Release a template (NULL accepted). */
void ms_chat_template_free(ms_chat_template *t);

/*
 * Render with the variables of apply_chat_template: messages (a JSON array, borrowed),
 * add_generation_prompt, bos_token and eos_token (NULL: undefined), and tools = none. *out receives
 * the rendered text (NUL-terminated, ms_malloc, caller frees); NULL on failure.
 */
ms_status ms_chat_template_render(const ms_chat_template *t, const json_t *messages, bool add_generation_prompt,
                                  const char *bos_token, const char *eos_token, char **out, ms_error *err);

/*
 * Render with every variable given: `vars` is a JSON object whose members become the template's
 * variables (messages, add_generation_prompt, bos_token, tools, date_string, enable_thinking, ...);
 * a name it lacks is undefined. *out / *out_len (out_len may be NULL) receive the text.
 */
ms_status ms_chat_template_render_vars(const ms_chat_template *t, const json_t *vars, char **out, size_t *out_len,
                                       ms_error *err);

/*
 * Read the chat template of a tokenizer_config.json at `path`: its `chat_template` string, or, for
 * the list-of-named-templates form ([{"name": ..., "template": ...}]), the one named "default".
 * *text receives a fresh copy (ms_malloc, caller frees). MS_ERR_NOT_FOUND when the file has no
 * chat template; MS_ERR_IO / MS_ERR_PARSE / MS_ERR_FORMAT for an unreadable or malformed file.
 */
ms_status ms_chat_template_load_config(const char *path, char **text, ms_error *err);

#endif /* MS_CHAT_TEMPLATE_H */
