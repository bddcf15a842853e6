#!/usr/bin/env bash
# bench_serve.sh - scripts/bench_serve.py (bench-serve, the serve load generator) against the
# llama2.c fixture on the CPU: closed loop (--concurrency) and open loop (--rate), exact output
# lengths (ignore_eos: 16 requests x 8 tokens = 128 output tokens, with uniform and normal
# prompt lengths), every latency figure present and ordered (p50 <= p90 <= p99), a malformed
# length distribution refused naming it, a dead server failing the run.
set -uo pipefail
export CUDA_VISIBLE_DEVICES=
build=${MS_BUILD:-build}
fx=${MS_FIXTURES:-../shared/fixtures}
tmp=$(mktemp -d)
pid=
cleanup() {
    [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
passed=0
failed=0
check() { # check NAME CONDITION-COMMAND...
    local name=$1
    shift
    if "$@"; then passed=$((passed + 1)); echo "ok   $name"; else failed=$((failed + 1)); echo "FAIL $name"; echo "     ${detail:-}"; fi
    detail=
}
"$build/llama/llama" serve --model "$fx/llama2c/aidreams260K.bin" --tokenizer "$fx/llama2c/tok512.bin" \
    --port 0 --max-seqs 8 2>"$tmp/err" &
pid=$!
url=
for _ in $(seq 300); do
    url=$(sed -n 's/^listening on //p' "$tmp/err")
    [ -n "$url" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
done
[ -n "$url" ] || { echo "FAIL bench-serve: the server does not start"; cat "$tmp/err"; echo "0 passed, 1 failed"; exit 1; }
sane() { # sane JSON: completed, output tokens, ordered percentiles, positive throughput
    jq -e --argjson n "$2" --argjson t "$3" '.completed == $n and .failed == 0 and .output_tokens == $t
        and .output_throughput > 0 and ([.ttft_s, .itl_s, .tpot_s, .e2e_s] | all(.p50 <= .p90 and .p90 <= .p99 and .p50 > 0))' "$1" >/dev/null
}
python3 scripts/bench_serve.py "$url" --concurrency 4 --num-prompts 16 --prompt-len uniform:4-20 \
    --output-len fixed:8 --json "$tmp/c.json" >"$tmp/c.out" 2>&1
rc=$?
detail="exit $rc: $(cat "$tmp/c.out") $(head -c 400 "$tmp/c.json" 2>/dev/null)"
check "bench-serve --concurrency 4: 16 requests, 128 output tokens, TTFT/ITL/TPOT/E2E percentiles" sane "$tmp/c.json" 16 128
cat "$tmp/c.out"
python3 scripts/bench_serve.py "$url" --rate 40 --num-prompts 16 --prompt-len normal:12,4 \
    --output-len fixed:8 --ids 512 --temperature 0.8 --json "$tmp/r.json" >"$tmp/r.out" 2>&1
rc=$?
detail="exit $rc: $(cat "$tmp/r.out")"
check "bench-serve --rate 40 (Poisson), token-id prompts: the same totals" sane "$tmp/r.json" 16 128
python3 scripts/bench_serve.py "$url" --prompt-len gauss:3 >"$tmp/bad.out" 2>&1
rc=$?
detail="exit $rc: $(cat "$tmp/bad.out")"
check "bench-serve: a malformed distribution is refused naming it" [ $rc -ne 0 -a "$(grep -c "gauss:3" "$tmp/bad.out")" = 1 ]
kill -TERM "$pid"
wait "$pid"
pid=
python3 scripts/bench_serve.py "$url" --num-prompts 2 --warmup 0 >"$tmp/dead.out" 2>&1
rc=$?
detail="exit $rc: $(cat "$tmp/dead.out")"
check "bench-serve: a dead server fails the run" [ $rc -ne 0 ]
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
