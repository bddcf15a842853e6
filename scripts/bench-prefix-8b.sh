#!/usr/bin/env bash
# bench-prefix-8b.sh - issue [J]'s prefix-caching benchmark on one GPU: `serve --device cuda` on the
# Llama-3.1-8B-shaped random bf16 checkpoint (scripts/bench-8b.sh's), then scripts/bench_serve.py
# at concurrency 16: every prompt a 2,000-id shared system prompt plus a 50-id user turn, 16 output
# tokens; once with the prefix cache (the default) and once with --no-prefix-cache. Prints TTFT
# percentiles of both and their ratio (target: at least 5x lower with the cache).
#
#   on the device machine, from the repository root:   scripts/bench-prefix-8b.sh
#
# Environment: MS_BUILD (mstar-mkckpt, llama/llama; default build), MS_BP_CKPT (default /tmp/l8b),
# MS_BP_SHARED / MS_BP_TURN / MS_BP_OUTPUT (2000 / 50 / 16), MS_BP_PROMPTS (64), OUT (logs);
# a CPU dry run: MS_BP_CKPT=../shared/fixtures/hf/llama_gqa MS_BP_DEVICE=cpu MS_BP_VOCAB=512
# MS_BP_SHARED=300 MS_BP_TURN=20 MS_BP_OUTPUT=4 MS_BP_PROMPTS=16.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
build=${MS_BUILD:-build}
ckpt=${MS_BP_CKPT:-/tmp/l8b}
out=${OUT:-$build/bench-out}
shared=${MS_BP_SHARED:-2000} turn=${MS_BP_TURN:-50} olen=${MS_BP_OUTPUT:-16}
prompts=${MS_BP_PROMPTS:-64}
export MSTAR_CACHE=${MSTAR_CACHE:-/tmp/mstar-cache}
mkdir -p "$out" "$MSTAR_CACHE"
pid=
trap '[ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null' EXIT
die() { echo "bench-prefix-8b: $*" >&2; exit 1; }
[ -x "$build/llama/llama" ] || die "$build/llama/llama is missing (make -j all)"
if [ ! -f "$ckpt/config.json" ]; then
    timeout 240 "$build/mstar-mkckpt" --preset llama3-8b --dtype bf16 --max-pos 4096 --out "$ckpt" \
        >"$out/mkckpt.log" 2>&1 || die "mstar-mkckpt failed (see $out/mkckpt.log)"
fi
pages=$((16 * ((shared + turn + olen + 15) / 16 + 1) + 64))
for mode in cache nocache; do
    flags=(--device "${MS_BP_DEVICE:-cuda}" --max-seqs 16 --max-tokens-per-step 8192 --kv-pages "$pages" --port 0)
    [ "$mode" = nocache ] && flags+=(--no-prefix-cache)
    "$build/llama/llama" serve --model "$ckpt" --tokenizer none "${flags[@]}" 2>"$out/serve-$mode.log" &
    pid=$!
    url=
    for _ in $(seq 900); do
        url=$(sed -n 's/^listening on //p' "$out/serve-$mode.log")
        [ -n "$url" ] && break
        kill -0 "$pid" 2>/dev/null || die "serve did not start: $(tail -n 2 "$out/serve-$mode.log")"
        sleep 0.1
    done
    [ -n "$url" ] || die "serve did not print its address"
    python3 scripts/bench_serve.py "$url" --concurrency 16 --num-prompts "$prompts" --ids "${MS_BP_VOCAB:-128256}" \
        --shared-prefix "$shared" --prompt-len "fixed:$turn" --output-len "fixed:$olen" --warmup 2 \
        --json "$out/bench-prefix-$mode.json" >"$out/bench-prefix-$mode.txt" 2>&1 ||
        die "bench_serve.py failed ($mode): $(tail -n 3 "$out/bench-prefix-$mode.txt")"
    curl -s "$url/metrics" | grep '^mstar_prefix_cache' >"$out/metrics-$mode.txt"
    kill -TERM "$pid"; wait "$pid"; pid=
done
python3 - "$out" "$shared" "$turn" <<'PY'
import json, sys
out, shared, turn = sys.argv[1:4]
r = {m: json.load(open(f"{out}/bench-prefix-{m}.json")) for m in ("cache", "nocache")}
def q(m, k):
    return 1000.0 * r[m]["ttft_s"][k]
print(f"\nprefix caching, concurrency 16: {shared}-id shared system prompt + {turn}-id turns\n")
print("| | TTFT p50 ms | TTFT p99 ms |")
print("|---|---|---|")
for m in ("cache", "nocache"):
    print(f"| {m} | {q(m, 'p50'):.1f} | {q(m, 'p99'):.1f} |")
print(f"\nTTFT p50 ratio (no cache / cache): {q('nocache', 'p50') / q('cache', 'p50'):.1f}x")
PY
cat "$out/metrics-cache.txt"
