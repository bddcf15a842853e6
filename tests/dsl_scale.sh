#!/usr/bin/env bash
# dsl_scale.sh - `mstarc check` is linear in the size of a model (issue 9, item 3): generated
# 100k-line models check clean within a time limit a loaded 2-core CI machine meets easily
# (10 s; 40 s under the sanitizers) but the quadratic checker did not (a 100k let chain took
# 423 s and 9.9 GB, 50k config parameters 6 s and 2.5 GB; now each takes well under a second):
#   - 100k config parameters with defaults (duplicate lookups and default-cycle search);
#   - a chain of 100k lets whose last one is a weight dimension, compared in a linear() with
#     its closed form `d + 99999` (symbolic expansion of derived parameters, memoized);
#   - 100k weights, each read by one forward statement (weight lookups, checkpoint-name
#     duplicates, forward bindings).
# Prints "N passed, N failed" (read by scripts/run-tests.sh) and exits 1 on any failure.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${MS_BUILD:-build}
case $build in /*) ;; *) build=$root/$build ;; esac
mstarc=$build/mstarc
limit=10
if [[ $build == */asan || $build == */tsan ]]; then limit=40; fi
n=100000
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

# check NAME FILE: mstarc check FILE succeeds within $limit seconds
check() {
    local name=$1 file=$2
    local t0 t1 rc
    t0=$(date +%s%N)
    timeout "$limit" "$mstarc" check "$file" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    t1=$(date +%s%N)
    local ms=$(((t1 - t0) / 1000000))
    if [ "$rc" -eq 124 ]; then
        failed=$((failed + 1)); echo "FAIL: $name: not done after ${limit} s (quadratic checking?)"
    elif [ "$rc" -ne 0 ]; then
        failed=$((failed + 1)); echo "FAIL: $name: exit status $rc"; head -5 "$tmp/err"
    else
        passed=$((passed + 1)); echo "ok: $name: ${ms} ms"
    fi
}

# the common tail: a weight table, one node and a forward; $1 = extra weights, $2 = extra forward
tail_of() {
    cat <<EOM
    }
    weights {
        emb = "emb" [v, d];
        layers[i < nl] { w = "l.{i}.w" [d, d]; }
$1
    }
    node dec {
        resource kv = kv_pool(layers = nl, kv_heads = 1, head_dim = d);
        step s(t) { segments main += len(t); }
        forward(t) -> y {
            x = embedding(emb, t);
$2
            for l in layers { x = linear(x, l.w); }
            return x;
        }
    }
}
EOM
}

{
    echo "model params {"
    echo "    config {"
    echo "        d: int; nl: int; v: int;"
    awk -v n=$n 'BEGIN { for (i = 0; i < n; i++) printf "        p%d: int = %d;\n", i, i + 1 }'
    tail_of "" ""
} >"$tmp/params.mstar"
check "$n config parameters" "$tmp/params.mstar"

{
    echo "model lets {"
    echo "    config {"
    echo "        d: int; nl: int; v: int;"
    echo "        let a0: int = d;"
    awk -v n=$n 'BEGIN { for (i = 1; i < n; i++) printf "        let a%d: int = a%d + 1;\n", i, i - 1 }'
    tail_of "        up = \"up\" [a$((n - 1)), d];
        down = \"down\" [d, d + $((n - 1))];" "            x = linear(linear(x, up), down);"
} >"$tmp/lets.mstar"
check "a chain of $n lets" "$tmp/lets.mstar"

{
    echo "model many {"
    echo "    config {"
    echo "        d: int; nl: int; v: int;"
    tail_of "$(awk -v n=$n 'BEGIN { for (i = 0; i < n; i++) printf "        w%d = \"w%d\" [d, d];\n", i, i }')" \
        "$(awk -v n=$n 'BEGIN { for (i = 0; i < n; i++) printf "            x = linear(x, w%d);\n", i }')"
} >"$tmp/weights.mstar"
check "$n weights and forward statements" "$tmp/weights.mstar"

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
