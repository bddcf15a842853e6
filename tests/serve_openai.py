#!/usr/bin/env python3
"""serve_openai.py - the official `openai` Python package (1.x) against a running `serve`.

Usage: serve_openai.py BASE_URL EXPECTED_TEXT
       serve_openai.py --chat BASE_URL EXPECTED_CONTENT
  BASE_URL          e.g. http://127.0.0.1:PORT/v1
  EXPECTED_TEXT     the greedy 40-token completion of "The little dog" (what `generate` prints)
  EXPECTED_CONTENT  --chat: the greedy 24-token chat reply to one user message "Hi there" (a
                    server with a chat template); only chat.completions is checked: plain,
                    stream=True with include_usage, and a malformed message raising BadRequestError

Checks completions (text, finish_reason, usage), streaming (chunks reassemble to the same text,
one finish_reason, include_usage), stop strings, and that a bad request raises the client's
BadRequestError with the server's message. Prints "ok NAME" / "FAIL NAME ..." lines and exits 1
on any failure; exit 77 when the package cannot be imported (the caller reports a skip).
"""
import sys

try:
    import openai
except ImportError:
    print("skip: the openai package is not installed (pip install openai==1.109.1)")
    sys.exit(77)

chat = len(sys.argv) > 1 and sys.argv[1] == "--chat"
if chat:
    del sys.argv[1]
base, want = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base, api_key="unused", timeout=30, max_retries=0)
failed = 0


def check(name, cond, detail=""):
    global failed
    if cond:
        print(f"ok   openai: {name}")
    else:
        failed += 1
        print(f"FAIL openai: {name}\n     {detail}")


models = client.models.list()
model = models.data[0].id
check("models.list", len(models.data) == 1, repr(models))

if chat:
    msgs = [{"role": "user", "content": "Hi there"}]
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=24, temperature=0)
    check("chat content", r.choices[0].message.content == want, repr(r.choices[0].message))
    check("chat role and finish_reason", r.choices[0].message.role == "assistant"
          and r.choices[0].finish_reason == "length" and r.object == "chat.completion", repr(r))
    check("chat usage", r.usage is not None and r.usage.completion_tokens == 24
          and r.usage.total_tokens == r.usage.prompt_tokens + 24, repr(r.usage))
    parts, finishes, roles, usage = [], [], [], None
    for chunk in client.chat.completions.create(model=model, messages=msgs, max_tokens=24,
                                                temperature=0, stream=True,
                                                stream_options={"include_usage": True}):
        for c in chunk.choices:
            if c.delta.role is not None:
                roles.append(c.delta.role)
            if c.delta.content is not None:
                parts.append(c.delta.content)
            if c.finish_reason is not None:
                finishes.append(c.finish_reason)
        if chunk.usage is not None:
            usage = chunk.usage
    check("chat stream reassembles", "".join(parts) == want, repr("".join(parts)))
    check("chat stream role once, finish_reason length", roles == ["assistant"]
          and finishes == ["length"], repr((roles, finishes)))
    check("chat stream usage", usage is not None and usage.completion_tokens == 24, repr(usage))
    try:
        client.chat.completions.create(model=model, messages=[{"role": "user"}])
        check("chat bad message raises", False, "no exception")
    except openai.BadRequestError as e:
        check("chat bad message raises BadRequestError", e.status_code == 400
              and "messages[0].content" in str(e), str(e))
    sys.exit(1 if failed else 0)

r = client.completions.create(model=model, prompt="The little dog", max_tokens=40, temperature=0)
check("completion text", r.choices[0].text == want, repr(r.choices[0].text))
check("finish_reason length", r.choices[0].finish_reason == "length", repr(r.choices[0]))
check("usage", r.usage is not None and r.usage.completion_tokens == 40
      and r.usage.total_tokens == r.usage.prompt_tokens + 40, repr(r.usage))

parts, finishes, usage = [], [], None
for chunk in client.completions.create(model=model, prompt="The little dog", max_tokens=40,
                                       temperature=0, stream=True,
                                       stream_options={"include_usage": True}):
    for c in chunk.choices:
        parts.append(c.text)
        if c.finish_reason is not None:
            finishes.append(c.finish_reason)
    if chunk.usage is not None:
        usage = chunk.usage
check("stream reassembles", "".join(parts) == want, repr("".join(parts)))
check("stream finish_reason", finishes == ["length"], repr(finishes))
check("stream usage", usage is not None and usage.completion_tokens == 40, repr(usage))

stop = want[12:19]
r = client.completions.create(model=model, prompt="The little dog", max_tokens=40, temperature=0,
                              stop=[stop])
check("stop", r.choices[0].text == want.split(stop)[0] and r.choices[0].finish_reason == "stop",
      repr((stop, r.choices[0])))
text = "".join(c.choices[0].text for c in client.completions.create(
    model=model, prompt="The little dog", max_tokens=40, temperature=0, stop=[stop], stream=True)
    if c.choices)
check("stop in a stream", text == want.split(stop)[0], repr(text))

try:
    client.completions.create(model=model, prompt="x", temperature=-1)
    check("bad request raises", False, "no exception")
except openai.BadRequestError as e:
    check("bad request raises BadRequestError", e.status_code == 400 and "temperature" in str(e),
          str(e))
try:
    client.completions.create(model="no-such-model", prompt="x")
    check("unknown model raises", False, "no exception")
except openai.NotFoundError as e:
    check("unknown model raises NotFoundError", e.status_code == 404, str(e))

sys.exit(1 if failed else 0)
