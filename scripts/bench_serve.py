#!/usr/bin/env python3
"""bench_serve.py - `bench-serve`: a load generator for `<binary> serve` (Python stdlib only).

Usage:
  scripts/bench_serve.py URL [--concurrency N | --rate R] [--num-prompts K]
                         [--prompt-len DIST] [--output-len DIST] [--ids VOCAB]
                         [--temperature T] [--seed S] [--json FILE] [--warmup W]
  URL           the server's root, e.g. http://127.0.0.1:8000
  --concurrency N   N clients, each sending its next request when the last one ends (default 1)
  --rate R          open loop instead: requests arrive as a Poisson process of R per second
                    (at most 1024 in flight)
  --num-prompts K   requests in the measured run (default 64)
  DIST              fixed:N | uniform:A-B | normal:MEAN,SD (rounded, at least 1): prompt
                    lengths in tokens (--ids: random ids; else words, about a token each) and
                    output lengths (max_tokens with ignore_eos, so each request makes exactly
                    that many tokens unless the context ends it); defaults fixed:128, fixed:128
  --ids VOCAB       token-id prompts in [0, VOCAB) (a server without a tokenizer)
  --shared-prefix N with --ids: every prompt starts with the same N ids (a system prompt)
  --warmup W        requests sent (and not measured) before the run, default 2

Every request is a streaming /v1/completions with stream_options.include_usage. Measured, as
vLLM's benchmark_serving does: TTFT (request sent to its first token's chunk), ITL (between
consecutive token chunks of a request), TPOT ((latency - TTFT) / (output tokens - 1)), end-to-end
latency, request and output-token throughput over the run's wall time. Prints a table of mean /
p50 / p90 / p99 and, with --json, writes the same numbers. Exit 1 when a request fails (its status
and message are printed).
"""
import argparse
import http.client
import json
import math
import queue
import random
import sys
import threading
import time
import urllib.parse

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("url")
g = ap.add_mutually_exclusive_group()
g.add_argument("--concurrency", type=int, default=None)
g.add_argument("--rate", type=float, default=None)
ap.add_argument("--num-prompts", type=int, default=64)
ap.add_argument("--prompt-len", default="fixed:128")
ap.add_argument("--output-len", default="fixed:128")
ap.add_argument("--ids", type=int, default=0)
ap.add_argument("--shared-prefix", type=int, default=0,
                help="with --ids: every prompt starts with the same N random ids (a system "
                     "prompt; what prefix caching serves)")
ap.add_argument("--temperature", type=float, default=0.0)
ap.add_argument("--seed", type=int, default=0)
ap.add_argument("--json", default=None)
ap.add_argument("--warmup", type=int, default=2)
args = ap.parse_args()
u = urllib.parse.urlparse(args.url)
host, port = u.hostname, u.port or 80
rng = random.Random(args.seed)
if args.shared_prefix and not args.ids:
    sys.exit("bench_serve: --shared-prefix needs --ids")
SHARED = [random.Random(args.seed + 1).randrange(args.ids) for _ in range(args.shared_prefix)] \
    if args.shared_prefix else []


def dist(spec):
    kind, _, val = spec.partition(":")
    try:
        if kind == "fixed":
            n = int(val)
            return lambda: n
        if kind == "uniform":
            a, b = (int(x) for x in val.split("-"))
            return lambda: rng.randint(a, b)
        if kind == "normal":
            m, sd = (float(x) for x in val.split(","))
            return lambda: max(1, int(round(rng.gauss(m, sd))))
    except ValueError:
        pass
    sys.exit(f"bench_serve: bad length distribution '{spec}' (fixed:N, uniform:A-B, "
             "normal:MEAN,SD)")


plen, olen = dist(args.prompt_len), dist(args.output_len)
WORDS = "the a of and to in is was he for it with as his on be at by had are but".split()


def make_request():
    n_in, n_out = max(1, plen()), max(1, olen())
    if args.ids:
        prompt = SHARED + [rng.randrange(args.ids) for _ in range(n_in)]
    else:
        prompt = " ".join(rng.choice(WORDS) for _ in range(n_in))
    body = {"prompt": prompt, "max_tokens": n_out, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}, "temperature": args.temperature,
            "seed": rng.randrange(1 << 30)}
    return json.dumps(body), n_out


def run_one(body):
    """One streaming request: (ok, ttft, [itl...], latency, output tokens, prompt tokens, err)."""
    t0 = time.perf_counter()
    c = http.client.HTTPConnection(host, port, timeout=600)
    try:
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            return (False, 0, [], 0, 0, 0, f"status {r.status}: {r.read()[:300]!r}")
        ttft, last, itl, usage = None, None, [], None
        while True:
            line = r.readline()
            if not line:
                break
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            now = time.perf_counter()
            o = json.loads(line[6:])
            if "error" in o:
                return (False, 0, [], 0, 0, 0, json.dumps(o)[:300])
            if o.get("usage"):
                usage = o["usage"]
            has_token = any(ch.get("text") or ch.get("token_ids") for ch in o.get("choices", []))
            if has_token:
                if ttft is None:
                    ttft = now - t0
                else:
                    itl.append(now - last)
                last = now
        lat = time.perf_counter() - t0
        if usage is None:
            return (False, 0, [], 0, 0, 0, "no usage chunk")
        return (True, ttft if ttft is not None else lat, itl, lat, usage["completion_tokens"],
                usage["prompt_tokens"], "")
    except (OSError, http.client.HTTPException, ValueError) as e:
        return (False, 0, [], 0, 0, 0, f"{type(e).__name__}: {e}")
    finally:
        c.close()


for _ in range(args.warmup):
    ok = run_one(make_request()[0])
    if not ok[0]:
        sys.exit(f"bench_serve: warmup request failed: {ok[6]}")

reqs = [make_request() for _ in range(args.num_prompts)]
results, lock = [], threading.Lock()


def record(res):
    with lock:
        results.append(res)


t_start = time.perf_counter()
if args.rate is None:
    conc = args.concurrency or 1
    q = queue.Queue()
    for r in reqs:
        q.put(r)

    def worker():
        while True:
            try:
                body, _ = q.get_nowait()
            except queue.Empty:
                return
            record(run_one(body))

    ts = [threading.Thread(target=worker) for _ in range(min(conc, len(reqs)))]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    mode = f"concurrency {conc}"
else:
    sem = threading.Semaphore(1024)
    ts = []

    def fire(body):
        try:
            record(run_one(body))
        finally:
            sem.release()

    for body, _ in reqs:
        time.sleep(rng.expovariate(args.rate))
        sem.acquire()
        t = threading.Thread(target=fire, args=(body,))
        t.start()
        ts.append(t)
    for t in ts:
        t.join()
    mode = f"rate {args.rate:g}/s (Poisson)"
wall = time.perf_counter() - t_start

bad = [r for r in results if not r[0]]
good = [r for r in results if r[0]]
out_tok = sum(r[4] for r in good)
in_tok = sum(r[5] for r in good)


def stats(xs):
    xs = sorted(xs)
    if not xs:
        return {"mean": math.nan, "p50": math.nan, "p90": math.nan, "p99": math.nan}
    pick = lambda p: xs[min(len(xs) - 1, int(math.ceil(p / 100 * len(xs))) - 1)]
    return {"mean": sum(xs) / len(xs), "p50": pick(50), "p90": pick(90), "p99": pick(99)}


ttft = stats([r[1] for r in good])
itl = stats([x for r in good for x in r[2]])
tpot = stats([(r[3] - r[1]) / (r[4] - 1) for r in good if r[4] > 1])
e2e = stats([r[3] for r in good])
summary = {
    "mode": mode, "num_prompts": len(reqs), "completed": len(good), "failed": len(bad),
    "prompt_len": args.prompt_len, "output_len": args.output_len, "wall_s": wall,
    "request_throughput": len(good) / wall, "output_throughput": out_tok / wall,
    "total_token_throughput": (in_tok + out_tok) / wall, "output_tokens": out_tok,
    "prompt_tokens": in_tok, "ttft_s": ttft, "itl_s": itl, "tpot_s": tpot, "e2e_s": e2e,
}
print(f"bench-serve: {mode}, {len(good)}/{len(reqs)} requests in {wall:.2f} s "
      f"(prompt {args.prompt_len}, output {args.output_len})")
print(f"  throughput: {summary['request_throughput']:.2f} req/s, "
      f"{summary['output_throughput']:.1f} output tok/s, "
      f"{summary['total_token_throughput']:.1f} total tok/s "
      f"({in_tok} prompt + {out_tok} output tokens)")
print(f"  {'ms':<6} {'mean':>9} {'p50':>9} {'p90':>9} {'p99':>9}")
for name, st in (("TTFT", ttft), ("ITL", itl), ("TPOT", tpot), ("E2E", e2e)):
    print(f"  {name:<6} " + " ".join(f"{1000 * st[k]:9.2f}" for k in ("mean", "p50", "p90", "p99")))
for r in bad[:5]:
    print(f"  failed: {r[6]}")
if args.json:
    with open(args.json, "w") as f:
        json.dump(summary, f, indent=2)
sys.exit(1 if bad else 0)
