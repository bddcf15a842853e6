#!/usr/bin/env bash
# run-tests.sh LABEL TEST... - run test binaries (cmocka) and shell drivers (*.sh).
#
# Runs MS_TEST_JOBS programs at a time (default 1: one after another), started in list order,
# and reports them in list order. Programs do not share files or ports: the binaries and drivers
# write under mkdtemp / mktemp -d folders (the NVRTC caches they share write each cubin through
# a temporary name and a rename), and the servers listen on --port 0. Several at once fill the
# cores that a single-threaded test, NVRTC (one thread per compile), HTTP clients or the
# fixed-length soak leave idle.
#
# Stops at the first failing program (with MS_TEST_JOBS > 1: starts nothing new, lets the ones
# running finish, and reports up to the first failure in list order). Counts cmocka's
# "[  PASSED  ] N test(s)" and "[  FAILED  ] N test(s)" lines (a shell driver counts as one test
# unless it prints its own "N passed, N failed" line) and ends with one summary line
# "N passed, N failed" (also appended to MS_SUMMARY when set). The seconds printed per program
# are its wall time (with MS_TEST_JOBS > 1, shared with the others running).
set -uo pipefail
label=$1
shift
jobs=${MS_TEST_JOBS:-1}
case $jobs in '' | *[!0-9]* | 0) echo "run-tests.sh: MS_TEST_JOBS must be a positive integer (got '$jobs')" >&2; exit 2 ;; esac
passed=0
failed=0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# run_one I T: run test T, its output in $work/I.log, then "rc secs" in $work/I.done.
run_one() {
    local i=$1 t=$2 start rc
    start=$(date +%s.%N)
    if [[ $t == *.sh ]]; then
        bash "$t" >"$work/$i.log" 2>&1
    else
        "$t" >"$work/$i.log" 2>&1
    fi
    rc=$?
    echo "$rc $(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')" >"$work/$i.tmp"
    mv "$work/$i.tmp" "$work/$i.done"
}

# report I T: count test T's result; on a failure print its log, the summary, and exit 1.
report() {
    local i=$1 t=$2 log=$work/$1.log rc secs p f line
    read -r rc secs <"$work/$i.done"
    p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test(s)\./\1/p' "$log" | awk '{ s += $1 } END { print s + 0 }')
    f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test(s),.*/\1/p' "$log" | awk '{ s += $1 } END { print s + 0 }')
    if [ "$p" -eq 0 ] && [ "$f" -eq 0 ]; then
        line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
        if [ -n "$line" ]; then
            p=$(echo "$line" | awk '{ print $1 }')
            f=$(echo "$line" | awk '{ print $3 }')
        elif [ "$rc" -eq 0 ]; then
            p=1
        else
            f=1
        fi
    fi
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        f=1
    fi
    passed=$((passed + p))
    failed=$((failed + f))
    if [ "$rc" -ne 0 ]; then
        cat "$log"
        echo "FAIL $t (exit $rc, ${secs}s)"
        wait # drivers still running (MS_TEST_JOBS > 1): let them end before their folder goes
        echo "[$label] stopped at the first failing program"
        echo "$passed passed, $failed failed"
        [ -n "${MS_SUMMARY:-}" ] && echo "$passed $failed" >>"$MS_SUMMARY"
        exit 1
    fi
    printf '  ok   %-40s %4d tests  %6ss\n' "$t" "$p" "$secs"
}

# keep up to $jobs programs running; report each, in list order, once it and all before it are done
n=$#
progs=("$@")
next=0
shown=0
running=0
stop=0
while [ $shown -lt $n ]; do
    while [ $stop -eq 0 ] && [ $next -lt $n ] && [ $running -lt "$jobs" ]; do
        run_one $next "${progs[$next]}" &
        next=$((next + 1))
        running=$((running + 1))
    done
    if [ -f "$work/$shown.done" ]; then
        read -r rc _ <"$work/$shown.done"
        [ "$rc" -ne 0 ] && stop=1
        report $shown "${progs[$shown]}"
        shown=$((shown + 1))
        continue
    fi
    sleep 0.1
    running=0
    for ((k = shown; k < next; k++)); do
        [ -f "$work/$k.done" ] || running=$((running + 1))
    done
done
echo "[$label]"
echo "$passed passed, $failed failed"
[ -n "${MS_SUMMARY:-}" ] && echo "$passed $failed" >>"$MS_SUMMARY"
exit 0
