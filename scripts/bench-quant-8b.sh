#!/usr/bin/env bash
# bench-quant-8b.sh - issue [I]'s quantized benchmark on one GPU: writes a Llama-3.1-8B-shaped
# random GGUF per quantization type with the project's own tool (mstar-mkckpt --format gguf
# --quant TYPE: ggml's reference quantizers, llama.cpp's layout and q/k permutation, Llama 3.1
# RoPE scaling as rope_freqs.weight), then runs the serving binary's `bench` verb on it with the
# weights kept quantized on the GPU (backend_cuda_quant.h): decode at batch 1, 8 and 32 with prompt
# 512 and 128 new tokens, prefill 1x2048; median of 3 runs after 1 warm-up; copy bandwidth in the
# same run. Prints one markdown table per type, and the same run with MS_CUDA_QUANT=0 (weights
# dequantized to bf16 at load) when MS_BENCH_BF16=1.
#
#   on the device machine, from the repository root:   scripts/bench-quant-8b.sh [q4_0|q4_k|q8_0 ...]
#
# Each type takes about 3 minutes (GGUF written once and kept, about 4.7 GB for q4_0/q4_k and 8.5 GB
# for q8_0; load; bench); give one type per device command when a command is limited to 10 minutes.
#
# Environment (all optional):
#   MS_BUILD      build folder (default build): $MS_BUILD/mstar-mkckpt and $MS_BUILD/mstarc
#   MS_BENCH_BIN  the serving binary (default $MS_BUILD/llama/llama, generated when missing)
#   MS_BENCH_DIR  where the GGUFs go (default /tmp/l8b-gguf; l8b-<type>.gguf kept when present)
#   MS_BENCH_ARGS extra flags for bench
#   MSTAR_CACHE   NVRTC cubin cache (default /tmp/mstar-cache)
#   OUT           logs: bench-quant-<type>.md / .json / .log, mkckpt-<type>.log (default $MS_BUILD/bench-out)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
build=${MS_BUILD:-build}
bin=${MS_BENCH_BIN:-$build/llama/llama}
dir=${MS_BENCH_DIR:-/tmp/l8b-gguf}
out=${OUT:-$build/bench-out}
export MSTAR_CACHE=${MSTAR_CACHE:-/tmp/mstar-cache}
types=("$@")
[ ${#types[@]} -gt 0 ] || types=(q4_0 q4_k q8_0)
mkdir -p "$out" "$MSTAR_CACHE" "$dir"

die() { echo "bench-quant-8b: $*" >&2; exit 1; }

date -u
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null

if [ ! -x "$bin" ]; then
    [ -x "$build/mstarc" ] || make -j"$(nproc)" "$build/mstarc" >"$out/make.log" 2>&1 ||
        die "building mstarc failed (see $out/make.log)"
    "$build/mstarc" build models/llama.mstar -o "$build/llama" >"$out/mstarc.log" 2>&1 ||
        die "mstarc build models/llama.mstar failed (see $out/mstarc.log)"
    bin=$build/llama/llama
fi
[ -x "$build/mstar-mkckpt" ] || make -j"$(nproc)" "$build/mstar-mkckpt" >>"$out/make.log" 2>&1 ||
    die "building mstar-mkckpt failed (see $out/make.log)"

rc_all=0
for t in "${types[@]}"; do
    case $t in q4_0 | q4_k | q8_0) ;; *) die "unknown type '$t' (q4_0, q4_k, q8_0: mstar-mkckpt's quantizers)" ;; esac
    gguf=$dir/l8b-$t.gguf
    if [ ! -f "$gguf" ]; then
        start=$SECONDS
        timeout 300 "$build/mstar-mkckpt" --preset llama3-8b --max-pos 4096 --format gguf --quant "$t" \
            --out "$gguf" >"$out/mkckpt-$t.log" 2>&1 || die "mstar-mkckpt --quant $t failed or ran past 300 s (see $out/mkckpt-$t.log)"
        echo "$gguf written in $((SECONDS - start)) s ($(du -h "$gguf" | cut -f1))"
    fi
    for mode in quant bf16; do
        [ "$mode" = bf16 ] && [ "${MS_BENCH_BF16:-0}" != 1 ] && continue
        tag=$t; [ "$mode" = bf16 ] && tag=$t-dequantized-bf16
        start=$SECONDS
        # shellcheck disable=SC2054 # "1,8,32" is one argument
        cmd=("$bin" bench --model "$gguf" --device cuda --batch 1,8,32 --prompt-len 512 --new-tokens 128
            --prefill 1x2048 --runs 3 --warmup 1 --seed 1 --json "$out/bench-quant-$tag.json")
        # shellcheck disable=SC2086 # MS_BENCH_ARGS is a list of flags
        if [ "$mode" = bf16 ]; then
            MS_CUDA_QUANT=0 timeout 420 "${cmd[@]}" ${MS_BENCH_ARGS:-} >"$out/bench-quant-$tag.md" 2>"$out/bench-quant-$tag.log"
        else
            timeout 420 "${cmd[@]}" ${MS_BENCH_ARGS:-} >"$out/bench-quant-$tag.md" 2>"$out/bench-quant-$tag.log"
        fi
        rc=$?
        [ $rc -eq 0 ] || rc_all=$rc
        echo "## $tag: exit $rc in $((SECONDS - start)) s"
        echo "command: $([ "$mode" = bf16 ] && echo "MS_CUDA_QUANT=0 ")${cmd[*]} ${MS_BENCH_ARGS:-}"
        tail -n 5 "$out/bench-quant-$tag.log"
        cat "$out/bench-quant-$tag.md"
        echo
    done
done
exit $rc_all
