#!/usr/bin/env bash
# kernels_gpu.sh - precompiled kernels are the ones the engine loads (device machine only; `make
# gpu-test` runs it): `mstarc build --arch <the GPU's sm_XX> --config hf/llama_gqa` fills an empty
# cache, then the built binary generates on the GPU from that checkpoint (greedy, then sampled, so
# argmax and sampling both load) and must add NO cubin to the cache: every instance the CUDA
# backend compiled at load was a cache hit. Then the `kernels` verb without --arch (the GPU's
# architecture) reports hits only. A new cubin names the instance the precompile missed.
#
# Environment: MS_BUILD (build folder, default build), MS_FIXTURES (default ../shared/fixtures).
set -uo pipefail
build=${MS_BUILD:-build}
fx=${MS_FIXTURES:-../shared/fixtures}
gqa="$fx/hf/llama_gqa"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export MSTAR_CACHE="$tmp/cache"
unset MSTAR_TEMPLATES_DIR
passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok   $1"; }
bad() { failed=$((failed + 1)); echo "FAIL $1"; shift; printf '     %s\n' "$@"; }

cap=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
if [ -z "$cap" ]; then
    bad "a GPU is present" "nvidia-smi reports no compute capability"
    echo "$passed passed, $failed failed"
    exit 1
fi
arch="sm_$cap"

if "$build/mstarc" build models/llama.mstar -o "$tmp/b" --arch "$arch" --config "$gqa" >"$tmp/out" 2>"$tmp/err"; then
    ok "mstarc build --arch $arch --config llama_gqa ($(grep -c ' compiled ' "$tmp/out") compiled)"
else
    bad "mstarc build --arch $arch --config llama_gqa" "$(head -c 1500 "$tmp/err")"
fi
find "$MSTAR_CACHE" -name '*.cubin' -printf '%f\n' 2>/dev/null | sort >"$tmp/before"

for mode in greedy sampled; do
    if [ $mode = greedy ]; then flags=(--temperature 0); else flags=(--temperature 0.8 --top-p 0.9 --seed 1); fi
    if "$tmp/b/llama" generate --device cuda --model "$gqa" --prompt-ids 1,79,64 \
        --max-new-tokens 8 "${flags[@]}" >"$tmp/out" 2>"$tmp/err"; then
        ok "generate --device cuda ($mode) runs"
    else
        bad "generate --device cuda ($mode) runs" "$(head -c 1500 "$tmp/err")"
    fi
done
find "$MSTAR_CACHE" -name '*.cubin' -printf '%f\n' 2>/dev/null | sort >"$tmp/after"
new=$(comm -13 "$tmp/before" "$tmp/after")
if [ -z "$new" ] && [ -s "$tmp/before" ]; then
    ok "generate loaded only precompiled instances ($(wc -l <"$tmp/before") cubins, none added)"
else
    bad "generate loaded only precompiled instances" "compiled at load, missed by the precompile:" $new
fi

if "$tmp/b/llama" kernels --model "$gqa" >"$tmp/out" 2>"$tmp/err" &&
    grep -qE "^[0-9]+ hits, 0 compiled" "$tmp/out"; then
    ok "kernels (the GPU's $arch): hits only"
else
    bad "kernels (the GPU's $arch): hits only" "$(cat "$tmp/out" "$tmp/err" | head -c 1500)"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
