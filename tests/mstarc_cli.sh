#!/usr/bin/env bash
# mstarc_cli.sh - drives the `mstarc` command as a user does (CONVENTIONS.md item 16, chibicc's
# driver.sh): exit statuses, stdout/stderr, every golden malformed input of tests/dsl/*.test run
# through `mstarc check`, models checking clean, dump round trips, a missing file.
# Prints "N passed, N failed" (read by scripts/run-tests.sh) and exits 1 on any failure.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${MS_BUILD:-build}
case $build in /*) ;; *) build=$root/$build ;; esac
mstarc=$build/mstarc
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

ok() { passed=$((passed + 1)); }
fail() { failed=$((failed + 1)); echo "FAIL: $*"; }

# check NAME EXPECTED_STATUS CMD... : run CMD in $tmp, keep stdout/stderr in $tmp/out, $tmp/err
check() {
    local name=$1 want=$2
    shift 2
    (cd "$tmp" && "$@" >"$tmp/out" 2>"$tmp/err")
    local rc=$?
    if [ "$rc" -ne "$want" ]; then
        fail "$name: exit status $rc, expected $want"; sed 's/^/    /' "$tmp/err"; return 1
    fi
    return 0
}

# ---- models check clean and round-trip through dump ----
for m in "$root"/models/*.mstar "$root"/tests/dsl/valid/*.mstar; do
    rel=${m#"$root"/}
    if check "check $rel" 0 "$mstarc" check "$m"; then
        if [ -s "$tmp/err" ]; then fail "check $rel: stderr not empty"; else ok; fi
    fi
    if check "dump $rel" 0 "$mstarc" dump "$m"; then
        cp "$tmp/out" "$tmp/d1.mstar"
        if check "dump of dump $rel" 0 "$mstarc" dump d1.mstar && cmp -s "$tmp/out" "$tmp/d1.mstar"; then
            ok
        else
            fail "dump -> parse -> dump of $rel is not byte-identical"
        fi
    fi
done

# ---- golden malformed inputs: exact stderr, nothing on stdout, exit 1 ----
mkdir -p "$tmp/cases"
"$root"/tests/dsl/split.sh "$tmp/cases" "$root"/tests/dsl/*.test
n_cases=0
names=()
for src in "$tmp"/cases/*.mstar; do
    names+=("$(basename "$src" .mstar)")
done
n_cases=${#names[@]}
if [[ $build == */asan || $build == */tsan ]]; then
    # Sanitizer builds start slowly: one run over every case (each file's diagnostics are
    # printed in order), compared with the concatenated expectations. The plain build checks
    # each case on its own.
    : >"$tmp/all.expected"
    files=()
    for name in "${names[@]}"; do
        cat "$tmp/cases/$name.expected" >>"$tmp/all.expected"
        files+=("$name.mstar")
    done
    (cd "$tmp/cases" && "$mstarc" check "${files[@]}" >"$tmp/out" 2>"$tmp/err")
    rc=$?
    if [ $rc -ne 1 ] || [ -s "$tmp/out" ]; then
        fail "golden cases (one run): exit status $rc, stdout: $(cat "$tmp/out")"
    elif ! diff -u "$tmp/all.expected" "$tmp/err" >"$tmp/diff"; then
        fail "golden cases (one run): diagnostics differ"; cat "$tmp/diff"
    else
        ok
    fi
else
    for name in "${names[@]}"; do
        (cd "$tmp/cases" && "$mstarc" check "$name.mstar" >"$tmp/out" 2>"$tmp/err")
        rc=$?
        if [ $rc -ne 1 ]; then
            fail "golden $name: exit status $rc, expected 1"
        elif [ -s "$tmp/out" ]; then
            fail "golden $name: stdout not empty"
        elif ! diff -u "$tmp/cases/$name.expected" "$tmp/err" >"$tmp/diff"; then
            fail "golden $name: diagnostics differ"; cat "$tmp/diff"
        else
            ok
        fi
    done
fi
if [ $n_cases -lt 25 ]; then fail "only $n_cases golden cases (at least 25)"; else ok; fi

# ---- a file that does not exist ----
if check "missing file" 1 "$mstarc" check no-such-model.mstar; then
    if [ "$(cat "$tmp/err")" = "mstarc: error: cannot open 'no-such-model.mstar': No such file or directory" ]; then
        ok
    else
        fail "missing file: unexpected message: $(cat "$tmp/err")"
    fi
fi

# ---- several files: each reported, status 1 when any fails ----
if check "mixed files" 1 "$mstarc" check "$root/models/llama.mstar" no-such-model.mstar "$tmp/cases/syn_missing_model.mstar"; then
    if grep -q "llama.mstar: ok (model llama" "$tmp/out" && grep -q "cannot open 'no-such-model.mstar'" "$tmp/err" &&
        grep -q "syn_missing_model.mstar:1:1: error: syntax error" "$tmp/err"; then
        ok
    else
        fail "mixed files: output"; cat "$tmp/out" "$tmp/err"
    fi
fi

# ---- the error limit ----
{
    echo "model m { config {"
    for i in $(seq 1 30); do echo "    p$i: badtype;"; done
    echo "} }"
} >"$tmp/many.mstar"
if check "max errors" 1 "$mstarc" check --max-errors 3 many.mstar; then
    if [ "$(grep -c ': error: unknown type' "$tmp/err")" = 3 ] && tail -n 1 "$tmp/err" | grep -q "too many errors (3), stopping"; then
        ok
    else
        fail "max errors: output"; cat "$tmp/err"
    fi
fi

# ---- hostile inputs: one clear error, status 1, no crash ----
mkdir -p "$tmp/adir.mstar"
if check "directory" 1 "$mstarc" check adir.mstar; then
    if [ "$(cat "$tmp/err")" = "mstarc: error: cannot read 'adir.mstar': Is a directory" ]; then ok
    else fail "directory: unexpected message: $(cat "$tmp/err")"; fi
fi
: >"$tmp/empty.mstar"
check "empty file" 1 "$mstarc" check empty.mstar &&
    { grep -q "^empty.mstar:1:1: error: syntax error: unexpected end of file, expected 'model'" "$tmp/err" && ok ||
        fail "empty file: $(cat "$tmp/err")"; }
# a left-recursive operator chain deepens neither the parser stack nor the bracket count: the
# tree height limit keeps the recursive checks off the end of the stack (was a segfault)
{ printf 'model m { config { a: int = 1'; for i in $(seq 1 2000); do printf '+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1'; done
  echo '; } }'; } >"$tmp/chain.mstar"
check "100k-term expression" 1 "$mstarc" check chain.mstar &&
    { [ "$(grep -c ': error: ' "$tmp/err")" = 1 ] &&
        grep -q "chain.mstar:1:29: error: expression nested deeper than 256 levels" "$tmp/err" && ok ||
        fail "100k-term expression: $(head -c 300 "$tmp/err")"; }
printf 'model m {\001\377\376 }' >"$tmp/binary.mstar"
check "binary bytes" 1 "$mstarc" check binary.mstar &&
    { grep -aqF "binary.mstar:1:10: error: unexpected character '\\x01'" "$tmp/err" && ok ||
        fail "binary bytes: $(cat "$tmp/err")"; }

# ---- usage errors exit 2 ----
check "no arguments" 2 "$mstarc" && ok
check "unknown command" 2 "$mstarc" compile x.mstar && ok
check "unknown option" 2 "$mstarc" check --frobnicate x.mstar && ok
check "dump two files" 2 "$mstarc" dump a.mstar b.mstar && ok
check "help" 0 "$mstarc" --help && grep -q "usage: mstarc check" "$tmp/out" && ok

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
