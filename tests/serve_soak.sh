#!/usr/bin/env bash
# serve_soak.sh - soak the `serve` verb: SOAK_CLIENTS (default 32) concurrent streaming clients for
# SOAK_SECONDS (default 60) against a tiny model (tests/serve_soak.py: every response complete and
# parseable, 0 KV pages held at the end per /metrics, the server still up), then SIGTERM: exit 0
# with nothing from a sanitizer (under `make SAN=asan`: ASan+UBSan+LeakSanitizer).
#
# Defaults (CI, CPU): the llama2.c fixture aidreams260K with its tokenizer, --max-seqs 16.
# Knobs for a longer run, e.g. on the GPU (scripts/gpu-batch.sh's optional soak step):
#   SOAK_CLIENTS=256 SOAK_SECONDS=600 SOAK_MODEL=DIR SOAK_TOKENIZER=none|PATH
#   SOAK_MAX_SEQS=256 (default 16)  SOAK_ARGS="--device cuda ..."  BIN=path/to/llama (default $MS_BUILD/llama/llama)
#   SOAK_IDS=VOCAB: token-id prompts (a model without a tokenizer, e.g. hf/llama_gqa: 512)
set -uo pipefail
export CUDA_VISIBLE_DEVICES=${SOAK_CUDA_VISIBLE_DEVICES-}
build=${MS_BUILD:-build}
bin=${BIN:-$build/llama/llama}
fx=${MS_FIXTURES:-../shared/fixtures}
model=${SOAK_MODEL:-$fx/llama2c/aidreams260K.bin}
tok=${SOAK_TOKENIZER-$fx/llama2c/tok512.bin}
clients=${SOAK_CLIENTS:-32}
# CI runs the TEST_SCRIPTS twice (plain, then the ASan build): the ASan pass soaks 20 s by default
# (the same paths under the sanitizer; the 60 s soak is the plain pass), keeping CI's soak at 80 s
case $build in */asan) secs=${SOAK_SECONDS:-20} ;; *) secs=${SOAK_SECONDS:-60} ;; esac
tmp=$(mktemp -d)
pid=
cleanup() {
    [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
tok_args=()
[ -n "$tok" ] && tok_args=(--tokenizer "$tok")
# shellcheck disable=SC2086
"$bin" serve --model "$model" "${tok_args[@]}" --port 0 --max-seqs "${SOAK_MAX_SEQS:-16}" --max-queue 1024 ${SOAK_ARGS:-} \
    2>"$tmp/err" &
pid=$!
url=
for _ in $(seq 600); do
    url=$(sed -n 's/^listening on //p' "$tmp/err")
    [ -n "$url" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
done
if [ -z "$url" ]; then
    echo "FAIL soak: the server does not start"
    head -c 800 "$tmp/err"
    echo "0 passed, 1 failed"
    exit 1
fi
"${PYTHON:-python3}" tests/serve_soak.py "$url" --clients "$clients" --seconds "$secs" --chat ${SOAK_IDS:+--ids "$SOAK_IDS"} \
    >"$tmp/soak.out" 2>&1
rc=$?
cat "$tmp/soak.out"
passed=$(grep -c '^ok ' "$tmp/soak.out")
failed=$(grep -c '^FAIL ' "$tmp/soak.out")
if [ $rc -ne 0 ] && [ "$failed" -eq 0 ]; then
    echo "FAIL soak: serve_soak.py exits $rc"
    failed=1
fi
kill -TERM "$pid"
for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then
    echo "FAIL soak: SIGTERM does not stop the server within 30 s"
    failed=$((failed + 1))
else
    wait "$pid"
    src=$?
    pid=
    if [ $src -ne 0 ] || grep -qE 'Sanitizer|runtime error|leak' "$tmp/err"; then
        echo "FAIL soak: the server exits $src after SIGTERM"
        grep -m5 -E 'Sanitizer|runtime error|leak' "$tmp/err"
        failed=$((failed + 1))
    else
        echo "ok   soak: SIGTERM exits 0, nothing from a sanitizer ($(tail -n 1 "$tmp/err" | sed 's/.*serve: //'))"
        passed=$((passed + 1))
    fi
fi
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
