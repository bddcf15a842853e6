#!/usr/bin/env bash
# bench_cli.sh - drives `$MS_BUILD/llama/llama bench` (the serving binary's benchmark verb) on the
# tiny hf/llama_gqa fixture on the CPU: the markdown table and the JSON report have the promised
# structure (one row per batch size and prefill shape, in order) and every figure is positive and
# finite. Speed is never asserted. Then every bad flag: exit 2 for usage errors, exit 1 with ONE
# stderr line naming the flag for bad values, and nothing from a sanitizer (under
# `make SAN=asan`, MS_BUILD=build/asan).
set -uo pipefail
# The binaries default to --device auto: hide any GPU so these CPU-exact checks run on the CPU
# backend on GPU hosts too (tests/gpu_generate.sh covers the CUDA path).
export CUDA_VISIBLE_DEVICES=
build=${MS_BUILD:-build}
bin="$build/llama/llama"
fx=${MS_FIXTURES:-../shared/fixtures}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

ok() { passed=$((passed + 1)); echo "ok   $1"; }
bad() { failed=$((failed + 1)); echo "FAIL $1"; shift; printf '     %s\n' "$@"; }

gqa="$fx/hf/llama_gqa"
base=(--model "$gqa" --device cpu --threads 1 --prompt-len 8 --new-tokens 4 --runs 2)

# expect_error NAME STATUS PATTERN -- ARGS...: exit STATUS, no sanitizer report, stderr matching
# PATTERN (exactly one line for status 1), empty stdout.
expect_error() {
    local name=$1 want=$2 pat=$3
    shift 4
    "$bin" bench "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    local lines
    lines=$(wc -l <"$tmp/err")
    if [ $rc -ne "$want" ]; then
        bad "$name" "exit $rc, expected $want" "$(head -c 600 "$tmp/err")"
    elif grep -qE 'Sanitizer|runtime error' "$tmp/err"; then
        bad "$name" "sanitizer report:" "$(head -c 600 "$tmp/err")"
    elif [ "$want" -eq 1 ] && [ "$lines" -ne 1 ]; then
        bad "$name" "expected one stderr line, got $lines" "$(head -c 600 "$tmp/err")"
    elif ! grep -qE -- "$pat" "$tmp/err"; then
        bad "$name" "stderr does not match /$pat/" "$(head -c 600 "$tmp/err")"
    elif [ -s "$tmp/out" ]; then
        bad "$name" "unexpected stdout" "$(head -c 200 "$tmp/out")"
    else
        ok "$name"
    fi
}

# positive_finite X: X is a decimal number > 0 (no nan, inf)
positive_finite() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$ ]] && awk -v x="$1" 'BEGIN { exit !(x > 0) }'; }

# ---- the acceptance run: table + JSON ----
"$bin" bench "${base[@]}" --batch 1,2 --prefill 1x8,2x4 --json "$tmp/b.json" >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -ne 0 ] || grep -qE 'Sanitizer|runtime error' "$tmp/err"; then
    bad "bench --batch 1,2 runs" "exit $rc" "$(head -c 600 "$tmp/err")"
else
    ok "bench --batch 1,2 --prefill 1x8,2x4 runs (exit 0, no sanitizer report)"
fi

# decode table: header, rule, one row per batch size in order, 8 columns, figures positive
hdr='| batch | prompt | new | decode tok/s | ms/token | limit tok/s | fraction | e2e tok/s |'
if grep -qxF -- "$hdr" "$tmp/out" && grep -A1 -xF -- "$hdr" "$tmp/out" | tail -1 | grep -qx '|---|---|---|---|---|---|---|---|'; then
    ok "decode table header and rule"
else
    bad "decode table header" "$(head -c 600 "$tmp/out")"
fi
rows=$(grep -A3 -xF -- "$hdr" "$tmp/out" | tail -n +3 | grep '^| [0-9]')
want_b=(1 2)
n=0
row_ok=1
while IFS='|' read -r _ b p nw tps ms lim frac e2e _; do
    b=${b// /} p=${p// /} nw=${nw// /} tps=${tps// /} ms=${ms// /} lim=${lim// /} frac=${frac// /} e2e=${e2e// /}
    if [ "$b" != "${want_b[$n]:-x}" ] || [ "$p" != 8 ] || [ "$nw" != 4 ]; then
        row_ok=0
    fi
    for x in "$tps" "$ms" "$lim" "${frac%\%}" "$e2e"; do
        positive_finite "$x" || row_ok=0
    done
    n=$((n + 1))
done <<<"$rows"
if [ "$n" -eq 2 ] && [ "$row_ok" -eq 1 ]; then
    ok "decode rows: batch 1 then 2, prompt 8, new 4, figures positive and finite"
else
    bad "decode rows" "$rows"
fi

# prefill table: the compute limit columns read "-" on the CPU (no bf16 peak in the table)
phdr='| prefill | tokens | prefill tok/s | ms | GFLOP/token | limit tok/s | fraction |'
if grep -A1 -xF -- "$phdr" "$tmp/out" | tail -1 | grep -qx '|---|---|---|---|---|---|---|'; then
    ok "prefill table header and rule (7 columns)"
else
    bad "prefill table header" "$(head -c 900 "$tmp/out")"
fi
prows=$(grep -A4 -xF -- "$phdr" "$tmp/out" | tail -n +3 | grep '^| [0-9]')
want_s=(1x8 2x4)
n=0
row_ok=1
while IFS='|' read -r _ s t tps ms gf lim frac _; do
    s=${s// /} t=${t// /} tps=${tps// /} ms=${ms// /} gf=${gf// /} lim=${lim// /} frac=${frac// /}
    [ "$s" = "${want_s[$n]:-x}" ] && [ "$t" = 8 ] && [ "$lim" = - ] && [ "$frac" = - ] || row_ok=0
    positive_finite "$tps" && positive_finite "$ms" && positive_finite "$gf" || row_ok=0
    n=$((n + 1))
done <<<"$prows"
if [ "$n" -eq 2 ] && [ "$row_ok" -eq 1 ]; then
    ok "prefill rows: 1x8 then 2x4, 8 tokens, figures positive and finite, limit '-' on the cpu"
else
    bad "prefill rows" "$prows"
fi
if grep -qxE 'cpu: dense bf16 peak -; prefill limit = peak / FLOPs per prompt token .*' "$tmp/out"; then
    ok "peak line: '-' for the cpu, formula named"
else
    bad "peak line" "$(head -3 "$tmp/out")"
fi

if grep -qE '^device cpu, weights [0-9.]+ GB, copy bandwidth [0-9.]+ GB/s' "$tmp/out"; then
    ok "header line names the device, weights and copy bandwidth"
else
    bad "header line" "$(head -3 "$tmp/out")"
fi

# JSON: the same rows; every figure a positive finite number; runs_tok_s has --runs entries
if jq -e '
    .device == "cpu" and .runs == 2 and .warmup == 1 and .weight_bytes > 0 and .copy_gbps > 0
    and ([.decode[].batch] == [1, 2]) and ([.decode[].prompt] == [8, 8]) and ([.decode[].new] == [4, 4])
    and all(.decode[]; .tok_s > 0 and .ms_per_token > 0 and .limit_tok_s > 0 and .fraction > 0
            and .e2e_tok_s > 0
            and (.runs_tok_s | length == 2 and all(.[]; . > 0))
            and ((.fraction - .tok_s / .limit_tok_s) | fabs) < 1e-9)
    and ([.prefill[] | "\(.batch)x\(.len)"] == ["1x8", "2x4"])
    and all(.prefill[]; .tok_s > 0 and .ms > 0 and (.runs_tok_s | length == 2)
            and .flops_per_token > 0 and .limit_tok_s == null and .fraction == null)
    and .bf16_peak_tflops == null
    and (.decode[1].limit_tok_s / .decode[0].limit_tok_s - 2 | fabs) < 1e-9
    ' "$tmp/b.json" >/dev/null; then
    ok "JSON report: rows, positive figures, fraction = tok/s / limit, limit scales with batch, no compute limit on the cpu"
else
    bad "JSON report" "$(head -c 800 "$tmp/b.json")"
fi

# FLOPs per prompt token of llama_gqa (hidden 128, 8 heads / 2 KV heads of 16, ffn 344, 3 layers,
# vocab 512): 2 x matmul parameters + 2 x lm_head / L + 4 x layers x 128 x (L + 1) / 2
want_f=$(awk 'BEGIN { p = 3 * (128*128 + 2*128*32 + 128*128 + 3*128*344); for (L = 8; L >= 4; L -= 4) printf "%d ", 2*p + 2*512*128/L + 4*3*128*(L+1)/2 }')
got_f=$(jq -r '[.prefill[].flops_per_token | floor] | map(tostring) | join(" ")' "$tmp/b.json")
if [ "$got_f " = "$want_f" ]; then
    ok "prefill FLOPs per token as the documented formula: $got_f"
else
    bad "prefill FLOPs per token" "got '$got_f', want '$want_f'"
fi

# --prefill none: no prefill table, still a decode row; default runs give 5 entries
"$bin" bench --model "$gqa" --device cpu --threads 1 --prompt-len 4 --new-tokens 2 --batch 3 \
    --prefill none --warmup 0 --seed 7 --json "$tmp/c.json" >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -eq 0 ] && ! grep -qF -- "$phdr" "$tmp/out" && grep -q '^| 3 | 4 | 2 | ' "$tmp/out" &&
    jq -e '(.prefill | length) == 0 and (.decode[0].runs_tok_s | length) == 5 and .warmup == 0 and .seed == 7' "$tmp/c.json" >/dev/null; then
    ok "--prefill none, --warmup 0, default --runs 5"
else
    bad "--prefill none" "exit $rc" "$(head -c 400 "$tmp/out")" "$(head -c 400 "$tmp/err")"
fi

# a step budget below the batch's prompts: chunked prefill, the decode phase still the whole batch
"$bin" bench "${base[@]}" --batch 3 --prefill 2x8 --max-tokens 10 >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -eq 0 ] && grep -q '^| 3 | 8 | 4 | ' "$tmp/out" && grep -q '^| 2x8 | 16 | ' "$tmp/out" &&
    ! grep -qE 'Sanitizer|runtime error' "$tmp/err"; then
    ok "--max-tokens 10: chunked prefill of 3 x 8 and 2 x 8"
else
    bad "--max-tokens 10" "exit $rc" "$(head -c 400 "$tmp/out")" "$(head -c 400 "$tmp/err")"
fi

# ---- bad flags ----
expect_error "no flags" 2 "--model is required" --
expect_error "unknown flag" 2 "unknown flag '--batches'" -- "${base[@]}" --batches 1
expect_error "stray argument" 2 "unexpected argument 'extra'" -- "${base[@]}" extra
expect_error "flag without value" 2 "flag --runs needs a value" -- "${base[@]}" --runs
expect_error "batch 0" 1 "--batch: '0' is not a comma-separated list" -- "${base[@]}" --batch 0
expect_error "batch empty entry" 1 "--batch: '1,,2' is not" -- "${base[@]}" --batch 1,,2
expect_error "batch trailing comma" 1 "--batch: '1,' is not" -- "${base[@]}" --batch 1,
expect_error "batch too large" 1 "--batch: '5000' is not" -- "${base[@]}" --batch 5000
expect_error "prefill no length" 1 "--prefill: '2x' is not" -- "${base[@]}" --prefill 2x
expect_error "prefill no x" 1 "--prefill: '2048' is not" -- "${base[@]}" --prefill 2048
expect_error "prefill zero" 1 "--prefill: '0x8' is not" -- "${base[@]}" --prefill 0x8
expect_error "runs 0" 1 "--runs: '0' is not an integer in \[1, 1000\]" -- "${base[@]}" --runs 0
expect_error "warmup negative" 1 "--warmup: '-1' is not" -- "${base[@]}" --warmup -1
expect_error "new-tokens 1" 1 "--new-tokens: '1' is not an integer >= 2" -- "${base[@]}" --new-tokens 1
expect_error "prompt-len text" 1 "--prompt-len: 'abc' is not" -- "${base[@]}" --prompt-len abc
expect_error "max-tokens 0" 1 "--max-tokens: '0' is not an integer >= 1" -- "${base[@]}" --max-tokens 0
expect_error "seed negative" 1 "--seed: '-3' is not" -- "${base[@]}" --seed -3
expect_error "device gpu" 1 "--device: 'gpu' is not auto, cpu or cuda" -- "${base[@]}" --device gpu
expect_error "dtype f16" 1 "--dtype: 'f16' is not" -- "${base[@]}" --dtype f16
expect_error "over the context" 1 "--prompt-len 510 \+ --new-tokens 4 .*context of 512" -- "${base[@]}" --batch 1 --prompt-len 510 --prefill none
expect_error "prefill over the context" 1 "context of 512" -- "${base[@]}" --batch 1 --prefill 1x600
expect_error "no such model" 1 "$tmp/nothing: cannot open the model" -- --model "$tmp/nothing" --device cpu
expect_error "model /dev/null" 1 "^[^:]*: /dev/null: not a model: a character device" -- --model /dev/null --device cpu

# an unwritable JSON path: the table is printed, then one error line, exit 1
"$bin" bench "${base[@]}" --batch 1 --prefill none --runs 1 --json "$tmp/no/such/dir/b.json" >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -eq 1 ] && [ "$(grep -c "cannot write the JSON report" "$tmp/err")" -eq 1 ] && grep -q "$tmp/no/such/dir/b.json" "$tmp/err" &&
    ! grep -qE 'Sanitizer|runtime error' "$tmp/err"; then
    ok "unwritable --json: exit 1 naming the file"
else
    bad "unwritable --json" "exit $rc" "$(head -c 400 "$tmp/err")"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
