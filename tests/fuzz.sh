#!/usr/bin/env bash
# fuzz.sh TARGET... - run the libFuzzer targets build/fuzz/fuzz_<TARGET> (tests/fuzz_<TARGET>.c,
# built with ASan+UBSan by `make fuzz`), each for FUZZ_SECONDS (default 60), FUZZ_JOBS at a time
# (default 2: one per core of the CI machine), with libFuzzer's -seed FUZZ_SEED (default 1; 0 =
# random).
#
# Per target, under FUZZ_DIR (default build/fuzz): <target>/seeds (rewritten by tests/fuzz/seeds.sh
# on every run), <target>/corpus (kept: later runs start from what earlier ones found),
# <target>/crashes (reproducers), <target>/log (libFuzzer's output) and <target>/tmp (the target's
# scratch files, left behind by a crash). A crash, leak, UBSan report, timeout (-timeout 10 s per
# input) or memory blow-up (-rss_limit_mb 2048) fails the target: its log tail is printed with the
# reproducer's path and the command that replays it. Ends with one line
# "N passed, N failed" (also appended to MS_SUMMARY when set, as scripts/run-tests.sh does); exit
# status 1 when any target failed.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${FUZZ_DIR:-build/fuzz}
secs=${FUZZ_SECONDS:-60}
jobs=${FUZZ_JOBS:-2}
# libFuzzer's seed: fixed by default, so a run explores the same inputs each time (within its
# time limit) and CI does not pass or fail by the luck of a random draw; FUZZ_SEED=0 draws one.
seed=${FUZZ_SEED:-1}

# Per-target libFuzzer options: input size cap and dictionary.
opts() {
    case $1 in
    dsl) echo "-max_len=8192 -dict=$here/dsl/fuzz.dict" ;;
    config) echo "-max_len=8192 -dict=$here/fuzz/config.dict" ;;
    tokenizer_hf) echo "-max_len=16384 -dict=$here/fuzz/tokenizer_hf.dict" ;;
    safetensors) echo "-max_len=4096 -dict=$here/fuzz/safetensors.dict" ;;
    llama2c) echo "-max_len=8192" ;;
    gguf) echo "-max_len=32768" ;;
    chat_template) echo "-max_len=16384 -dict=$here/fuzz/chat_template.dict" ;;
    serve_request) echo "-max_len=8192 -dict=$here/fuzz/serve_request.dict" ;;
    audio) echo "-max_len=16384" ;;
    *) echo "" ;;
    esac
}

run_one() {
    local t=$1 d=$dir/$1
    mkdir -p "$d/corpus" "$d/crashes" "$d/tmp"
    # shellcheck disable=SC2046
    TMPDIR=$d/tmp "$dir/fuzz_$t" -max_total_time="$secs" -seed="$seed" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
        -artifact_prefix="$d/crashes/" $(opts "$t") "$d/corpus" "$d/seeds" >"$d/log" 2>&1
}

for t in "$@"; do
    if [ ! -x "$dir/fuzz_$t" ]; then
        echo "fuzz.sh: $dir/fuzz_$t is not built (make fuzz FUZZ_TARGETS=$t builds and runs it)" >&2
        exit 2
    fi
done
bash "$here/fuzz/seeds.sh" "$dir/seeds.tmp" "$@" || exit 2
for t in "$@"; do
    rm -rf "$dir/$t/seeds"
    mkdir -p "$dir/$t"
    mv "$dir/seeds.tmp/$t" "$dir/$t/seeds"
done
rm -rf "$dir/seeds.tmp"

echo "== fuzz: $# target(s), ${secs} s each, $jobs at a time (libFuzzer, ASan+UBSan)"
declare -A pid_of rc_of
running=0
for t in "$@"; do
    while [ "$running" -ge "$jobs" ]; do
        wait -n
        running=$((running - 1))
    done
    run_one "$t" &
    pid_of[$t]=$!
    running=$((running + 1))
done
for t in "$@"; do
    wait "${pid_of[$t]}"
    rc_of[$t]=$?
done

passed=0
failed=0
for t in "$@"; do
    d=$dir/$t
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$d/log" | tail -n 1)
    units=$(ls "$d/corpus" | wc -l)
    if [ "${rc_of[$t]}" -eq 0 ]; then
        passed=$((passed + 1))
        printf '  ok   fuzz_%-14s %9s inputs in %3s s, corpus %5d\n' "$t" "${runs:-?}" "$secs" "$units"
        continue
    fi
    failed=$((failed + 1))
    repro=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$d/log" | tail -n 1)
    tail -n 60 "$d/log"
    echo "FAIL fuzz_$t (exit ${rc_of[$t]}); full log: $d/log"
    if [ -n "$repro" ]; then
        echo "  reproducer: $repro"
        echo "  replay:     $dir/fuzz_$t $repro"
        echo "  (MS_FUZZ_VERBOSE=1 prints every error message on the way)"
    fi
done
echo "[fuzz]"
echo "$passed passed, $failed failed"
[ -n "${MS_SUMMARY:-}" ] && echo "$passed $failed" >>"$MS_SUMMARY"
[ "$failed" -eq 0 ]
