#!/usr/bin/env python3
"""differential.py - random templates rendered by jinja2 3.1.6, for checking the C engine against.

Writes a snippets file (the format of tests/chat/goldens/snippets.json) of N random templates:
whitespace-control soup (text, {{ }}, {# #}, if / for / set blocks with every -/+ marker) and
random expressions over literals, messages and undefined names. Not a committed golden: run it,
then point test_chat_template at the file:

    /tmp/chatvenv/bin/python tests/chat/differential.py --seed 1 --n 5000 -o /tmp/diff.json
    MS_CHAT_SNIPPETS=/tmp/diff.json build/tests/test_chat_template

Known, accepted differences (so the expression generator avoids them): jinja2 folds constant
sub-expressions at compile time with Python semantics (`(7)[:2]` gives undefined when folded, a
TypeError at run time), `items` / `reverse` return lazy iterators that print as
<generator ...>, and `str % x` is Python string formatting.
"""
import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_goldens import env  # noqa: E402

TEXTS = ["\n", "  ", "\t", "x", " y ", "\n  ", "  \n", "\n\n", "z\n", "\r\n", " \t\n "]
ATOMS = ["0", "1", "2", "-3", "7", "2.5", "0.1", "1e3", "'ab'", "'Hé'", "''", "' x '", "none", "true", "false",
         "[1, 2, 3]", "[]", "['a', 'b']", "{'k': 1}", "messages", "messages[0]", "messages[0].content", "undefined_x",
         "'a,b'"]
BINS = ["+", "-", "*", "/", "//", "~", "==", "!=", "<", ">=", "and", "or", "in", "not in"]
FILTS = ["length", "trim", "upper", "lower", "string", "tojson", "first", "last", "list", "int", "float", "join(',')",
         "default('d')", "abs", "title", "capitalize"]
POSTS = ["[0]", "[-1]", "[1:]", "[::-1]", "[:2]", ".strip()", ".split(',')", ".upper()", ".startswith('a')",
         ".get('k')", "['k']", ".content", "[5]"]
VARS = ["messages", "messages[0]", "messages[0].content", "messages[1]['content']", "undefined_x"]
TESTS = ["defined", "none", "string", "number", "mapping", "iterable", "true", "false"]


def sign():
    return random.choice(["", "", "-", "+"])


def soup(depth):
    out = []
    for _ in range(random.randint(1, 6)):
        r = random.random()
        if r < 0.4:
            out.append(random.choice(TEXTS))
        elif r < 0.55:
            out.append("{{%s 'v' %s}}" % (random.choice(["", "-"]), random.choice(["", "-"])))
        elif r < 0.65:
            out.append("{#%s c %s#}" % (sign(), sign()))
        elif r < 0.8 and depth < 3:
            kind = random.choice(["if true", "if false", "for i in [1, 2]", "set s = 1"])
            out.append("{%%%s %s %s%%}" % (sign(), kind, sign()))
            if kind.startswith("set"):
                continue
            out.append(soup(depth + 1))
            if kind.startswith("if") and random.random() < 0.4:
                out.append("{%%%s else %s%%}" % (sign(), sign()))
                out.append(soup(depth + 1))
            out.append("{%%%s %s %s%%}" % (sign(), "endif" if kind.startswith("if") else "endfor", sign()))
        else:
            out.append(random.choice(TEXTS))
    return "".join(out)


def expr(d):
    r = random.random()
    if d > 3 or r < 0.3:
        return random.choice(ATOMS)
    if r < 0.5:
        return "(%s %s %s)" % (expr(d + 1), random.choice(BINS), expr(d + 1))
    if r < 0.62:
        return "%s | %s" % (random.choice(ATOMS), random.choice(FILTS))
    if r < 0.74:
        # a non-constant subject: jinja2 folds constant sub-expressions with Python semantics
        return "(%s)%s" % (random.choice(VARS), random.choice(POSTS))
    if r < 0.82:
        return "(%s is %s%s)" % (expr(d + 1), random.choice(["", "not "]), random.choice(TESTS))
    if r < 0.9:
        return "(not %s)" % expr(d + 1)
    return "(%s if %s else %s)" % (expr(d + 1), expr(d + 1), expr(d + 1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("-o", "--out", required=True)
    a = ap.parse_args()
    random.seed(a.seed)
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "cases.json"), encoding="utf-8") as f:
        msgs = json.load(f)["snippet_messages"]
    res = []
    for i in range(a.n):
        t = soup(0) if i % 2 == 0 else "{{ %s }}" % expr(0)
        try:
            out = env().from_string(t).render(messages=msgs, add_generation_prompt=True, bos_token="<s>",
                                              eos_token="</s>", tools=None)
            res.append({"template": t, "output": out})
        except Exception as e:  # noqa: BLE001
            res.append({"template": t, "error": f"{type(e).__name__}: {e}"})
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(res, f, ensure_ascii=False)
    print(f"{len(res)} templates ({sum('error' in r for r in res)} jinja2 errors) in {a.out}")


if __name__ == "__main__":
    main()
