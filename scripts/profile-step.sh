#!/usr/bin/env bash
# profile-step.sh - where a decode step's GPU time goes: runs the serving binary's `bench` under
# Nsight Compute (ncu, one metric: gpu__time_duration.sum, so each kernel is replayed once) with
# CUDA graphs off, and prints the kernels aggregated by (name, grid, block): launches, total and
# mean microseconds, share of the total. Device machine only (needs ncu and a GPU).
#
#   scripts/profile-step.sh BIN MODEL [BATCH] [NEW_TOKENS] [OUT_FILE]
#
# e.g. scripts/profile-step.sh .gpu-bundle/bin/llama/llama /tmp/l8b-gguf/l8b-q4_0.gguf 1 4
# The prompt is 64 tokens and `--prefill none`; ncu skips the first MS_PROF_SKIP launches (default
# 400: start-up and the prefill step of an 8B model) and times the next MS_PROF_COUNT (default
# 600, about one and a half decode steps of 32 layers): ncu replays every kernel it times, at
# tens of milliseconds each, so a whole bench run under it takes minutes.
set -uo pipefail
bin=${1:?usage: profile-step.sh BIN MODEL [BATCH] [NEW_TOKENS] [OUT_FILE]}
model=${2:?usage: profile-step.sh BIN MODEL [BATCH] [NEW_TOKENS] [OUT_FILE]}
batch=${3:-1}
new=${4:-4}
out=${5:-/tmp/profile-$batch.csv}
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -n 1)
[ -n "$ncu" ] || { echo "profile-step: ncu not found"; exit 2; }
"$ncu" --csv --metrics gpu__time_duration.sum --launch-skip "${MS_PROF_SKIP:-400}" \
    --launch-count "${MS_PROF_COUNT:-600}" \
    "$bin" bench --model "$model" --device cuda --batch "$batch" --prompt-len 64 --new-tokens "$new" \
    --prefill none --runs 1 --warmup 0 --seed 1 --no-graphs >"$out" 2>"$out.err"
rc=$?
python3 - "$out" "$batch" "$new" <<'PY'
import csv, sys, collections
rows = []
with open(sys.argv[1], newline='') as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get('Metric Name') != 'gpu__time_duration.sum':
        continue
    v = float(r['Metric Value'].replace(',', ''))
    u = r.get('Metric Unit', 'nsecond')
    us = v / 1000 if u.startswith('n') else v * 1000 if u.startswith('m') else v
    rows.append((r['Kernel Name'][:60], r.get('Grid Size', ''), r.get('Block Size', ''), us))
agg = collections.defaultdict(lambda: [0, 0.0])
for name, g, b, us in rows:
    a = agg[(name, g, b)]
    a[0] += 1
    a[1] += us
total = sum(a[1] for a in agg.values())
print(f"batch {sys.argv[2]}, {sys.argv[3]} new tokens: {len(rows)} kernels, {total / 1000:.2f} ms of GPU time")
print(f"{'kernel':60} {'grid':>14} {'block':>10} {'n':>6} {'total us':>10} {'mean us':>9} {'share':>6}")
for (name, g, b), (n, us) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:45]:
    print(f"{name:60} {g:>14} {b:>10} {n:6d} {us:10.1f} {us / n:9.2f} {100 * us / total:5.1f}%")
PY
exit $rc
