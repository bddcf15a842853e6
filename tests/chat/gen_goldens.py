#!/usr/bin/env python3
"""gen_goldens.py - render the chat-template goldens of tests/test_chat_template.c with Python jinja2.

Pinned: jinja2==3.1.6 (PyPI). Regenerate (from the project root):
    python3 -m venv /tmp/chatvenv && /tmp/chatvenv/bin/pip install jinja2==3.1.6
    /tmp/chatvenv/bin/python tests/chat/gen_goldens.py
It reads the templates (tests/chat/*.jinja and the shared fixtures' tokenizer_config.json files),
the conversations of tests/chat/cases.json, and writes tests/chat/goldens/<template>.<case>.<gen|nogen>.txt:
the exact rendered text, or, when the template raises, "ERROR: <message>\n" in a .err file; and
tests/chat/goldens/snippets.json: each template of tests/chat/snippets.json rendered over cases.json's
snippet_messages ({"template", "output"} or {"template", "error"}).
The environment is the one transformers' apply_chat_template builds (transformers/utils/chat_template_utils.py):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]), raise_exception,
strftime_now and tojson (json.dumps with ensure_ascii=False) as it defines them.
"""
import json
import os
from datetime import datetime
import sys

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

assert jinja2.__version__ == "3.1.6", f"jinja2 {jinja2.__version__}: pin 3.1.6"

here = os.path.dirname(os.path.abspath(__file__))
root = os.path.dirname(os.path.dirname(here))
fixtures = os.environ.get("MS_FIXTURES", os.path.join(root, "..", "shared", "fixtures"))


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def strftime_now(format):
    return datetime.now().strftime(format)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def env():
    e = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    e.filters["tojson"] = tojson
    e.globals["raise_exception"] = raise_exception
    e.globals["strftime_now"] = strftime_now
    return e


def template_text(spec):
    if "file" in spec:
        with open(os.path.join(here, spec["file"]), encoding="utf-8") as f:
            return f.read()
    with open(os.path.join(fixtures, spec["fixture"]), encoding="utf-8") as f:
        t = json.load(f)["chat_template"]
    if isinstance(t, list):
        t = next(x["template"] for x in t if x["name"] == "default")
    return t


def main():
    with open(os.path.join(here, "cases.json"), encoding="utf-8") as f:
        cases = json.load(f)
    out = os.path.join(here, "goldens")
    os.makedirs(out, exist_ok=True)
    for old in os.listdir(out):
        os.remove(os.path.join(out, old))
    n = 0
    for tname, spec in cases["templates"].items():
        tmpl = env().from_string(template_text(spec))
        for cname, conv in cases["conversations"].items():
            for gen in (False, True):
                variables = dict(spec.get("vars", {}))
                variables.update(messages=conv, add_generation_prompt=gen, tools=None)
                base = os.path.join(out, f"{tname}.{cname}.{'gen' if gen else 'nogen'}")
                try:
                    text = tmpl.render(**variables)
                    with open(base + ".txt", "w", encoding="utf-8", newline="") as f:
                        f.write(text)
                except jinja2.exceptions.TemplateError as e:
                    with open(base + ".err", "w", encoding="utf-8", newline="") as f:
                        f.write(f"ERROR: {e}\n")
                n += 1
    # snippets.json: small templates, each rendered over one fixed conversation
    with open(os.path.join(here, "snippets.json"), encoding="utf-8") as f:
        snippets = json.load(f)
    res = []
    for s in snippets:
        try:
            text = env().from_string(s).render(messages=cases["snippet_messages"], add_generation_prompt=True,
                                               bos_token="<s>", eos_token="</s>", tools=None)
            res.append({"template": s, "output": text})
        except jinja2.exceptions.TemplateSyntaxError as e:
            res.append({"template": s, "error": f"TemplateSyntaxError: {e}"})
        except Exception as e:  # noqa: BLE001 - any render error: the C engine must fail too
            res.append({"template": s, "error": f"{type(e).__name__}: {e}"})
    with open(os.path.join(out, "snippets.json"), "w", encoding="utf-8", newline="") as f:
        json.dump(res, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"jinja2 {jinja2.__version__}: {n} goldens and {len(res)} snippets in {os.path.relpath(out, root)}")


if __name__ == "__main__":
    sys.exit(main())
