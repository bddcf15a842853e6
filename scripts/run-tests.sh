#!/usr/bin/env bash
# run-tests.sh LABEL TEST... - run test binaries (cmocka) and shell drivers (*.sh) in order.
#
# Stops at the first failing program. Counts cmocka's "[  PASSED  ] N test(s)" and
# "[  FAILED  ] N test(s)" lines (a shell driver counts as one test unless it prints its own
# "N passed, N failed" line) and ends with one summary line "N passed, N failed".
set -uo pipefail
label=$1
shift
passed=0
failed=0
for t in "$@"; do
    log=$(mktemp)
    start=$(date +%s.%N)
    if [[ $t == *.sh ]]; then
        bash "$t" >"$log" 2>&1
    else
        "$t" >"$log" 2>&1
    fi
    rc=$?
    secs=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
    p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test(s)\./\1/p' "$log" | awk '{ s += $1 } END { print s + 0 }')
    f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test(s),.*/\1/p' "$log" | awk '{ s += $1 } END { print s + 0 }')
    if [ "$p" -eq 0 ] && [ "$f" -eq 0 ]; then
        line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
        if [ -n "$line" ]; then
            p=$(echo "$line" | awk '{ print $1 }')
            f=$(echo "$line" | awk '{ print $3 }')
        elif [ $rc -eq 0 ]; then
            p=1
        else
            f=1
        fi
    fi
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then
        f=1
    fi
    passed=$((passed + p))
    failed=$((failed + f))
    if [ $rc -ne 0 ]; then
        cat "$log"
        echo "FAIL $t (exit $rc, ${secs}s)"
        rm -f "$log"
        echo "[$label] stopped at the first failing program"
        echo "$passed passed, $failed failed"
        [ -n "${MS_SUMMARY:-}" ] && echo "$passed $failed" >>"$MS_SUMMARY"
        exit 1
    fi
    printf '  ok   %-40s %4d tests  %6ss\n' "$t" "$p" "$secs"
    rm -f "$log"
done
echo "[$label]"
echo "$passed passed, $failed failed"
[ -n "${MS_SUMMARY:-}" ] && echo "$passed $failed" >>"$MS_SUMMARY"
exit 0
