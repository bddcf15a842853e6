#!/usr/bin/env python3
"""serve_soak.py - concurrent streaming clients against a running `serve` (Python stdlib only).

Usage: serve_soak.py BASE_URL [--clients N] [--seconds S] [--chat] [--seed K] [--ids VOCAB]
  BASE_URL   e.g. http://127.0.0.1:PORT (the server's root: /v1/..., /metrics, /health)

N client threads (default 32) each send streaming requests back to back for S seconds (default
60): /v1/completions (and /v1/chat/completions with --chat, when the server has a chat
template) with random prompts, max_tokens 1..48, temperature / top_p / top_k / min_p / seed /
penalties, stop strings, n up to 3, logprobs, stream_options.include_usage. One request in 16 is
abandoned mid-stream (the client closes the socket) to exercise the server freeing it.

Every other response must be complete and parseable: HTTP 200, text/event-stream, every event a
`data: {json}` line then a blank line, the last `data: [DONE]`, one finish_reason per choice index
in [0, n), usage (when asked) consistent with the chunks. A 429 (queue full) is allowed and
retried. At the end: within 30 s mstar_requests_running and mstar_queue_depth are 0 and
mstar_kv_pages_free equals its value at the start (0 pages held), and /health answers 200.
Prints one summary line (requests, tokens, throughput, latency percentiles), an "ok" / "FAIL"
line per check and "soak checks: N passed, N failed"; exit status 1 on any failure.
"""
import argparse
import http.client
import json
import random
import socket
import sys
import threading
import time
import urllib.parse

ap = argparse.ArgumentParser()
ap.add_argument("url")
ap.add_argument("--clients", type=int, default=32)
ap.add_argument("--seconds", type=float, default=60.0)
ap.add_argument("--chat", action="store_true")
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--ids", type=int, default=0, metavar="VOCAB",
                help="prompts of random token ids in [0, VOCAB) (a server without a tokenizer): "
                     "no text, no stop strings, no chat")
args = ap.parse_args()
u = urllib.parse.urlparse(args.url)
host, port = u.hostname, u.port or 80

WORDS = ("Once upon a time the little dog ran to the sea and saw a bird; it sang of"
         " stars, rain, bread, and a red ball. é 日本 ok!").split()


def metrics():
    c = http.client.HTTPConnection(host, port, timeout=10)
    c.request("GET", "/metrics")
    body = c.getresponse().read().decode()
    c.close()
    out = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


lock = threading.Lock()
stats = {"ok": 0, "aborted": 0, "retried": 0, "tokens": 0, "bad": 0}
lat = []          # seconds per complete request
ttft = []         # seconds to the first event
problems = []


def problem(msg):
    with lock:
        stats["bad"] += 1
        if len(problems) < 20:
            problems.append(msg)


def make_body(rng, chat):
    n = rng.choice((1, 1, 1, 2, 3))
    b = {"max_tokens": rng.randint(1, 48), "stream": True, "n": n}
    prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12)))
    if chat:
        b["messages"] = [{"role": "user", "content": prompt}]
    elif args.ids:
        b["prompt"] = [rng.randrange(args.ids) for _ in range(rng.randint(1, 24))]
    else:
        b["prompt"] = prompt
    if rng.random() < 0.7:
        b["temperature"] = round(rng.uniform(0, 1.5), 3)
    if rng.random() < 0.3:
        b["top_p"] = round(rng.uniform(0.5, 1.0), 3)
    if rng.random() < 0.3:
        b["top_k"] = rng.choice((0, 1, 5, 40))
    if rng.random() < 0.2:
        b["min_p"] = round(rng.uniform(0, 0.3), 3)
    if rng.random() < 0.2:
        b["frequency_penalty"] = round(rng.uniform(-1, 1), 3)
        b["presence_penalty"] = round(rng.uniform(-1, 1), 3)
    if rng.random() < 0.1:
        b["repetition_penalty"] = round(rng.uniform(0.8, 1.5), 3)
    if rng.random() < 0.5:
        b["seed"] = rng.randint(0, 1 << 30)
    if rng.random() < 0.3 and not args.ids:
        b["stop"] = [rng.choice(("e", " the", ".", "a ", "\n"))]
    if rng.random() < 0.5:
        b["stream_options"] = {"include_usage": True}
    if rng.random() < 0.2:
        if chat:
            b["logprobs"] = True
            b["top_logprobs"] = rng.randint(0, 3)
        else:
            b["logprobs"] = rng.randint(0, 3)
    if rng.random() < 0.2:
        b["ignore_eos"] = True
    return b


def one_request(rng, chat, abandon):
    body = make_body(rng, chat)
    path = "/v1/chat/completions" if chat else "/v1/completions"
    t0 = time.monotonic()
    first_event = None
    c = http.client.HTTPConnection(host, port, timeout=120)
    try:
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status == 429:
            r.read()
            with lock:
                stats["retried"] += 1
            time.sleep(0.05)
            return
        if r.status != 200:
            problem(f"{path} {json.dumps(body)[:200]}: status {r.status}: {r.read()[:200]!r}")
            return
        if not r.getheader("Content-Type", "").startswith("text/event-stream"):
            problem(f"content type {r.getheader('Content-Type')}")
            return
        if abandon:
            r.read(rng.randint(1, 200))
            c.sock.shutdown(socket.SHUT_RDWR)
            with lock:
                stats["aborted"] += 1
            return
        chunks = []
        while True:  # line by line: the time of the first event is the time to first token
            line = r.readline()
            if not line:
                break
            if first_event is None and line.startswith(b"data: "):
                first_event = time.monotonic()
            chunks.append(line)
        raw = b"".join(chunks).decode("utf-8")
    except (OSError, http.client.HTTPException, UnicodeDecodeError) as e:
        problem(f"{path}: {type(e).__name__}: {e}")
        return
    finally:
        c.close()
    t_end = time.monotonic()
    events = raw.split("\n\n")
    if events[-1] != "" or len(events) < 2:
        problem(f"stream does not end with a blank line: {raw[-120:]!r}")
        return
    events = events[:-1]
    if events[-1] != "data: [DONE]":
        problem(f"stream does not end with [DONE]: {raw[-200:]!r}")
        return
    finish = {}
    tokens = {}
    usage = None
    for ev in events[:-1]:
        if not ev.startswith("data: ") or "\n" in ev:
            problem(f"not one data line: {ev[:120]!r}")
            return
        try:
            o = json.loads(ev[6:])
        except ValueError as e:
            problem(f"chunk is not JSON ({e}): {ev[:160]!r}")
            return
        if "error" in o:
            problem(f"error event: {ev[:200]}")
            return
        if o.get("usage"):
            usage = o["usage"]
        for ch in o.get("choices", []):
            i = ch.get("index")
            if not isinstance(i, int) or not 0 <= i < body["n"]:
                problem(f"choice index {i!r} outside [0, {body['n']})")
                return
            if i in finish:
                problem(f"choice {i} has a chunk after its finish_reason")
                return
            lp = ch.get("logprobs")
            if lp:
                tokens[i] = tokens.get(i, 0) + len(lp["content"] if chat else lp["tokens"])
            if ch.get("finish_reason") is not None:
                finish[i] = ch["finish_reason"]
    if sorted(finish) != list(range(body["n"])):
        problem(f"finish_reason for indices {sorted(finish)} of n={body['n']}")
        return
    bad_f = [f for f in finish.values() if f not in ("stop", "length")]
    if bad_f:
        problem(f"finish_reason {bad_f}")
        return
    if body.get("stream_options") and usage is None:
        problem("include_usage without a usage chunk")
        return
    if usage is not None:
        ct = usage["completion_tokens"]
        if ct > body["max_tokens"] * body["n"] or usage["total_tokens"] != ct + usage["prompt_tokens"]:
            problem(f"usage {usage} for max_tokens {body['max_tokens']} n {body['n']}")
            return
        if body.get("logprobs") not in (None, False) and sum(tokens.values()) != ct:
            problem(f"{sum(tokens.values())} logprob entries for {ct} completion tokens")
            return
    with lock:
        stats["ok"] += 1
        stats["tokens"] += usage["completion_tokens"] if usage else 0
        lat.append(t_end - t0)
        if first_event is not None:
            ttft.append(first_event - t0)


def client(k, until, chat_ok):
    rng = random.Random(args.seed * 1000 + k)
    while time.monotonic() < until:
        one_request(rng, chat_ok and rng.random() < 0.5, rng.random() < 1 / 16)


m0 = metrics()
pages0 = m0["mstar_kv_pages_free"]
chat_ok = False
if args.chat:  # only when the server renders chats
    c = http.client.HTTPConnection(host, port, timeout=30)
    c.request("POST", "/v1/chat/completions",
              json.dumps({"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}))
    chat_ok = c.getresponse().status == 200
    c.close()
t_start = time.monotonic()
until = t_start + args.seconds
threads = [threading.Thread(target=client, args=(k, until, chat_ok)) for k in range(args.clients)]
for t in threads:
    t.start()
for t in threads:
    t.join()
wall = time.monotonic() - t_start

passed = failed = 0


def check(name, cond, detail=""):
    global passed, failed
    if cond:
        passed += 1
        print(f"ok   soak: {name}")
    else:
        failed += 1
        print(f"FAIL soak: {name}\n     {detail}")


m = {}
for _ in range(300):
    m = metrics()
    if (m["mstar_requests_running"] == 0 and m["mstar_queue_depth"] == 0
            and m["mstar_kv_pages_free"] == pages0):
        break
    time.sleep(0.1)


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


print(f"soak: {args.clients} clients x {args.seconds:.0f} s{' (chat too)' if chat_ok else ''}: "
      f"{stats['ok']} complete, {stats['aborted']} abandoned, {stats['retried']} 429 retried, "
      f"{stats['bad']} bad; {stats['tokens']} tokens, {stats['tokens'] / wall:.1f} tok/s; "
      f"latency p50 {pct(lat, 50):.3f} s p99 {pct(lat, 99):.3f} s; "
      f"first event p50 {pct(ttft, 50):.3f} s p99 {pct(ttft, 99):.3f} s")
check("every response complete and parseable", stats["bad"] == 0, "\n     ".join(problems))
check("requests were served", stats["ok"] >= args.clients, f"{stats['ok']} complete")
check("0 running, 0 queued, every KV page free at the end",
      m.get("mstar_requests_running") == 0 and m.get("mstar_queue_depth") == 0
      and m.get("mstar_kv_pages_free") == pages0,
      f"running {m.get('mstar_requests_running')} queued {m.get('mstar_queue_depth')} "
      f"pages free {m.get('mstar_kv_pages_free')} of {pages0}")
try:
    c = http.client.HTTPConnection(host, port, timeout=10)
    c.request("GET", "/health")
    up = c.getresponse().status == 200
    c.close()
except OSError:
    up = False
check("the server is still up (/health)", up)
print(f"soak checks: {passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
