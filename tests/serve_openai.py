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
one finish_reason, include_usage), stop strings, n > 1 (indices, finish_reason per choice, the
stream's chunks per index, seeded choices equal lone requests), logprobs (greedy: the best token;
top_k 2: the two kept probabilities sum to 1), echo (with logprobs: the prompt's tokens first,
max_tokens 0 scoring a prompt, vLLM's prompt_logprobs through extra_body), and that a bad
request raises the client's
BadRequestError with the server's message. Chat: also logprobs (top_logprobs, bytes) and n = 2. Prints "ok NAME" / "FAIL NAME ..." lines and exits 1
on any failure; exit 77 when the package cannot be imported (the caller reports a skip).
"""
import math
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
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=6, temperature=0,
                                       logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content if r.choices[0].logprobs else None
    check("chat logprobs: one entry per token, 2 top entries, bytes spell the content",
          content is not None and len(content) == 6
          and all(len(c.top_logprobs) == 2 and c.logprob <= 0 for c in content)
          and bytes(b for c in content for b in c.bytes).decode("utf-8", "replace")
          == r.choices[0].message.content, repr(r.choices[0]))
    r = client.chat.completions.create(model=model, messages=msgs, max_tokens=6, temperature=0.8,
                                       seed=2, n=2)
    check("chat n=2: two choices", [c.index for c in r.choices] == [0, 1], repr(r))
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

# n > 1: n choices, index 0..n-1, each with its finish_reason; seeded choice k equals a lone
# request seeded seed + k (the server's rule), so batching changes nothing (vllm #51226)
r = client.completions.create(model=model, prompt="The little dog", max_tokens=12,
                              temperature=0.9, seed=5, n=3)
check("n=3 gives 3 choices, index 0..2, finish_reason each",
      [c.index for c in r.choices] == [0, 1, 2]
      and all(c.finish_reason == "length" for c in r.choices)
      and r.usage.completion_tokens == 36, repr(r))
alone = [client.completions.create(model=model, prompt="The little dog", max_tokens=12,
                                   temperature=0.9, seed=5 + k).choices[0].text for k in range(3)]
check("n=3 seeded choices equal lone requests seeded seed + k",
      [c.text for c in r.choices] == alone, repr(([c.text for c in r.choices], alone)))
texts, fins = {}, {}
for chunk in client.completions.create(model=model, prompt="The little dog", max_tokens=12,
                                       temperature=0.9, seed=5, n=3, stream=True):
    for c in chunk.choices:
        texts[c.index] = texts.get(c.index, "") + c.text
        if c.finish_reason is not None:
            fins.setdefault(c.index, []).append(c.finish_reason)
check("n=3 stream: each index reassembles, one finish_reason each (TGI #1648)",
      [texts.get(k) for k in range(3)] == alone and fins == {0: ["length"], 1: ["length"],
                                                             2: ["length"]}, repr((texts, fins)))

# logprobs: greedy reports the model's distribution; the token is the top one; tokens spell the text
r = client.completions.create(model=model, prompt="The little dog", max_tokens=8, temperature=0,
                              logprobs=3)
lp = r.choices[0].logprobs
check("logprobs: 8 tokens spelling the text, 3+ top entries, the greedy token the best",
      lp is not None and len(lp.tokens) == 8 and "".join(lp.tokens) == r.choices[0].text
      and all(len(t) >= 3 for t in lp.top_logprobs)
      and all(abs(lp.token_logprobs[i] - max(lp.top_logprobs[i].values())) < 1e-6
              for i in range(8)), repr(lp))
# with top_k 2 the sampled distribution has two ids: their probabilities sum to 1 (the logprobs
# are those of the distribution sampled from, sglang #2664, not of the raw logits)
r = client.completions.create(model=model, prompt="The little dog", max_tokens=8,
                              temperature=0.7, logprobs=2, seed=3, extra_body={"top_k": 2})
tops = r.choices[0].logprobs.top_logprobs
check("logprobs with top_k 2: the two kept ids' probabilities sum to 1",
      len(tops) == 8 and all(abs(sum(math.exp(v) for v in t.values()) - 1) < 1e-4 for t in tops),
      repr(tops))
# echo with logprobs: the prompt's tokens lead (the first with null entries, as OpenAI), then the
# generated ones, whose logprobs are those of the same request without echo; tokens spell the
# text and text_offset counts the bytes before each token
plain = client.completions.create(model=model, prompt="The little dog", max_tokens=8,
                                  temperature=0, logprobs=2).choices[0]
r = client.completions.create(model=model, prompt="The little dog", max_tokens=8, temperature=0,
                              echo=True, logprobs=2)
c = r.choices[0]
lp = c.logprobs
n_p = len(lp.tokens) - 8 if lp is not None else 0
offs = [sum(len(t.encode()) for t in lp.tokens[:i]) for i in range(len(lp.tokens))] if lp else []
check("echo with logprobs: prompt tokens first (the first null), then the completion's",
      lp is not None and n_p >= 2 and c.text == "The little dog" + plain.text
      and "".join(lp.tokens) == c.text and lp.token_logprobs[0] is None
      and lp.top_logprobs[0] is None
      and all(v <= 0 for v in lp.token_logprobs[1:])
      and all(len(t) >= 2 for t in lp.top_logprobs[1:])
      and lp.text_offset == offs
      and all(abs(a - b) < 1e-6 for a, b in zip(lp.token_logprobs[n_p:],
                                                 plain.logprobs.token_logprobs))
      and len(lp.token_logprobs[n_p:]) == 8, repr(lp))
# max_tokens 0: the prompt scored alone; vLLM's prompt_logprobs (extra_body) give the same values
r0 = client.completions.create(model=model, prompt="The little dog", max_tokens=0, echo=True,
                               logprobs=0, extra_body={"prompt_logprobs": 1})
c0 = r0.choices[0]
plp = getattr(c0, "prompt_logprobs", None)
ok0 = (c0.text == "The little dog" and c0.logprobs is not None
       and len(c0.logprobs.tokens) == n_p and plp is not None and len(plp) == n_p
       and plp[0] is None and r0.usage.completion_tokens == 0)
if ok0:
    for i in range(1, n_p):
        got = [v["logprob"] for v in plp[i].values()]
        ok0 = ok0 and len(plp[i]) in (1, 2) and any(
            abs(g - lp.token_logprobs[i]) < 1e-6 for g in got) and all(
            v["rank"] >= 1 for v in plp[i].values())
check("max_tokens 0 echo scores the prompt; prompt_logprobs agree with echo's",
      ok0, repr((c0, plp)))
stream_lp = None
for chunk in client.completions.create(model=model, prompt="The little dog", max_tokens=4,
                                       temperature=0, echo=True, logprobs=1, stream=True):
    if stream_lp is None and chunk.choices and chunk.choices[0].logprobs is not None:
        stream_lp = chunk.choices[0].logprobs
check("echo with logprobs in a stream: the first chunk carries the prompt's logprobs",
      stream_lp is not None and stream_lp.tokens == lp.tokens[:n_p]
      and stream_lp.token_logprobs[0] is None, repr(stream_lp))
r = client.completions.create(model=model, prompt="The little dog", max_tokens=40, temperature=0,
                              echo=True)
check("echo: the prompt, then the completion", r.choices[0].text == "The little dog" + want,
      repr(r.choices[0].text))

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
