#!/usr/bin/env bash
# generate_cli.sh - drives `$MS_BUILD/llama-ref generate` (the serving binary over the hand-written
# Llama descriptor) as a user would: the acceptance line on the llama2.c golden, output counts,
# context limits, every bad flag value and every kind of bad input file. Each failure case must
# exit 1 (2 for usage errors) with ONE line on stderr naming the file/flag and the problem, and
# nothing from a sanitizer (under `make SAN=asan`, MS_BUILD=build/asan: ASan+UBSan+LeakSanitizer).
#
# Files are mutated in a temporary folder (fixtures stay read-only): header edits keep the header's
# length so only the intended field lies.
set -uo pipefail
# The binaries default to --device auto: hide any GPU so these CPU-exact checks run on the CPU
# backend on GPU hosts too (tests/gpu_generate.sh covers the CUDA path).
export CUDA_VISIBLE_DEVICES=
build=${MS_BUILD:-build}
bin="$build/llama-ref"
fx=${MS_FIXTURES:-../shared/fixtures}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

ok() { passed=$((passed + 1)); echo "ok   $1"; }
bad() { failed=$((failed + 1)); echo "FAIL $1"; shift; printf '     %s\n' "$@"; }

# expect_error NAME STATUS PATTERN -- ARGS...: exit STATUS, exactly one stderr line matching
# PATTERN, no sanitizer report, empty stdout.
expect_error() {
    local name=$1 want=$2 pat=$3
    shift 4
    "$bin" generate "$@" >"$tmp/out" 2>"$tmp/err"
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

gqa="$fx/hf/llama_gqa"
l2c="$fx/llama2c/aidreams260K.bin"
tok="$fx/llama2c/tok512.bin"
golden="$fx/llama2c/aidreams260K.golden.json"

# ---- acceptance: the llama2.c golden, text exact ----
# the acceptance line itself (one prompt), then every case as one ragged batch from a prompts file
jq -j ".cases[0].text" "$golden" >"$tmp/want"
if "$bin" generate --model "$l2c" --tokenizer "$tok" --prompt "$(jq -r '.cases[0].prompt' "$golden")" \
    --temperature 0 --steps "$(jq -r '.cases[0].steps' "$golden")" >"$tmp/got" 2>"$tmp/err" &&
    cmp -s "$tmp/got" "$tmp/want" && grep -q 'tokens/s' "$tmp/err"; then
    ok "golden case 0 (--prompt, --steps 128): text exact, tokens/s reported"
else
    bad "golden case 0" "$(diff "$tmp/got" "$tmp/want" | head -5)" "$(head -c 300 "$tmp/err")"
fi
jq -r '.cases[].prompt' "$golden" >"$tmp/golden_prompts"
jq -j '.cases[].text' "$golden" >"$tmp/want"
if [ "$(jq '[.cases[].steps] | unique | length' "$golden")" -eq 1 ] &&
    "$bin" generate --model "$l2c" --tokenizer "$tok" --prompts-file "$tmp/golden_prompts" \
        --temperature 0 --steps "$(jq -r '.cases[0].steps' "$golden")" >"$tmp/got" 2>"$tmp/err" &&
    cmp -s "$tmp/got" "$tmp/want"; then
    ok "all $(jq '.cases | length' "$golden") golden cases in one batch: text exact"
else
    bad "golden cases in one batch" "$(diff "$tmp/got" "$tmp/want" | head -5)" "$(head -c 300 "$tmp/err")"
fi

# ---- output counts ----
for n in 0 1; do
    out=$("$bin" generate --model "$gqa" --prompt-ids 1,17,33,250 --max-new-tokens "$n" \
        --temperature 0 --ignore-eos 2>/dev/null)
    got=$(echo "$out" | wc -w)
    if [ "$got" -eq "$n" ]; then ok "--max-new-tokens $n gives $n ids"; else bad "--max-new-tokens $n" "got $got ids: $out"; fi
done

# a prompts file runs as one batch and gives the ids each prompt gives alone (page size 4)
printf '1,17,33,250\n\n5,6\n1\n' >"$tmp/prompts"
"$bin" generate --model "$gqa" --prompts-file "$tmp/prompts" --max-new-tokens 8 --temperature 0 \
    --ignore-eos --page-size 4 >"$tmp/batch" 2>/dev/null
: >"$tmp/alone"
i=1
for p in 1,17,33,250 5,6 1; do
    echo "[$i] $("$bin" generate --model "$gqa" --prompt-ids "$p" --max-new-tokens 8 \
        --temperature 0 --ignore-eos 2>/dev/null)" >>"$tmp/alone"
    i=$((i + 1))
done
if cmp -s "$tmp/batch" "$tmp/alone" && [ "$(wc -l <"$tmp/batch")" -eq 3 ]; then
    ok "prompts file: one batch, same ids as one at a time"
else
    bad "prompts file batch" "$(diff "$tmp/batch" "$tmp/alone" | head -6)"
fi

# seeded sampling is reproducible
a=$("$bin" generate --model "$gqa" --prompt-ids 1,2,3 --max-new-tokens 12 --temperature 0.8 --top-k 40 --top-p 0.9 --seed 7 --ignore-eos 2>/dev/null)
b=$("$bin" generate --model "$gqa" --prompt-ids 1,2,3 --max-new-tokens 12 --temperature 0.8 --top-k 40 --top-p 0.9 --seed 7 --ignore-eos 2>/dev/null)
if [ -n "$a" ] && [ "$a" = "$b" ]; then ok "seeded sampling reproducible"; else bad "seeded sampling" "$a" "$b"; fi

# ---- context limits (aidreams260K: 128 positions) ----
ids129=$(seq -s, 3 131)
expect_error "prompt longer than the context" 1 "prompt of 129 tokens is longer than the model's context \(128 positions\)" \
    -- --model "$l2c" --prompt-ids "$ids129" --max-new-tokens 4
ids120=$(seq -s, 3 122)
out=$("$bin" generate --model "$l2c" --prompt-ids "$ids120" --max-new-tokens 50 --ignore-eos 2>"$tmp/err")
rc=$?
if [ $rc -eq 0 ] && [ "$(echo "$out" | wc -w)" -eq 9 ] &&
    grep -q "reached the model's context (128 tokens)" "$tmp/err"; then
    ok "generation reaching the context stops after 9 ids with a note"
else
    bad "generation reaching the context" "rc $rc, ids: $out" "$(cat "$tmp/err")"
fi

# ---- bad flag values ----
m=(--model "$gqa" --prompt-ids 1,2)
expect_error "--temperature -1" 1 "--temperature: '-1'" -- "${m[@]}" --temperature -1
expect_error "--temperature nan" 1 "--temperature: 'nan'" -- "${m[@]}" --temperature nan
expect_error "--top-p 0" 1 "--top-p: '0' is not a number in \(0, 1\]" -- "${m[@]}" --top-p 0
expect_error "--top-p 1.5" 1 "--top-p: '1.5'" -- "${m[@]}" --top-p 1.5
expect_error "--top-k x" 1 "--top-k: 'x'" -- "${m[@]}" --top-k x
expect_error "--seed -3" 1 "--seed: '-3'" -- "${m[@]}" --seed -3
expect_error "--steps 0" 1 "--steps: '0'" -- "${m[@]}" --steps 0
expect_error "--max-new-tokens -1" 1 "--max-new-tokens: '-1'" -- "${m[@]}" --max-new-tokens -1
expect_error "--page-size 0" 1 "--page-size: '0'" -- "${m[@]}" --page-size 0
expect_error "--dtype f16" 1 "--dtype: 'f16' is not auto, f32 or bf16" -- "${m[@]}" --dtype f16
expect_error "--dtype f32 on cuda" 1 "dtype 'f32' on device 'cuda': the CUDA backend keeps weights and KV in bf16" -- "${m[@]}" --device cuda --dtype f32
# bf16 weights and KV on the CPU (what the CUDA device computes with): runs, same count of ids
out=$("$bin" generate --model "$gqa" --prompt-ids 1,17,33,250 --max-new-tokens 16 --temperature 0 --device cpu --dtype bf16 2>"$tmp/err")
if [ "$(echo "$out" | wc -w)" -eq 16 ] && grep -q ' on cpu,' "$tmp/err"; then
    ok "--dtype bf16 on cpu: 16 ids"
else
    bad "--dtype bf16 on cpu" "$out" "$(head -c 300 "$tmp/err")"
fi
expect_error "--device tpu" 1 "--device: 'tpu' is not auto, cpu or cuda" -- "${m[@]}" --device tpu
# without a usable GPU (no driver, no device, or a build without CUDA) --device auto falls back to
# the CPU silently and --device cuda is a one-line error; with one, auto picks cuda
"$bin" generate "${m[@]}" --max-new-tokens 2 >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -eq 0 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q ' on cpu,' "$tmp/err"; then
    ok "--device auto (the default) without a GPU: cpu, no warning"
    expect_error "--device cuda without a GPU" 1 "device 'cuda': (cuda:0: no usable CUDA device|this binary was built without CUDA)" -- "${m[@]}" --device cuda
elif [ $rc -eq 0 ] && grep -q ' on cuda,' "$tmp/err"; then
    ok "--device auto (the default) with a GPU: cuda"
else
    bad "--device auto" "rc $rc" "$(head -c 600 "$tmp/err")"
fi
expect_error "--prompt-ids 1,x" 1 "--prompt-ids: '1,x' is not a comma-separated list" -- --model "$gqa" --prompt-ids 1,x
expect_error "token id out of range" 1 "prompt token 512 at index 1 is outside the vocabulary \[0, 512\)" -- --model "$gqa" --prompt-ids 1,512
expect_error "--prompt without tokenizer" 1 "--prompt needs --tokenizer" -- --model "$gqa" --prompt hello
expect_error "missing prompts file" 1 "$tmp/none.txt: cannot open the prompts file" -- --model "$gqa" --prompts-file "$tmp/none.txt"
expect_error "unknown flag" 2 "unknown flag '--bogus'" -- "${m[@]}" --bogus 1
expect_error "no model" 2 "--model is required" -- --prompt-ids 1
expect_error "two prompt sources" 2 "exactly one of" -- "${m[@]}" --prompt x
expect_error "--steps and --max-new-tokens" 2 "not both" -- "${m[@]}" --steps 4 --max-new-tokens 2
expect_error "flag without value" 2 "flag --seed needs a value" -- "${m[@]}" --seed

# ---- bad input files ----
mk() { rm -rf "$tmp/m" && mkdir "$tmp/m" && cp "$gqa/config.json" "$gqa/model.safetensors" "$tmp/m/"; }
st="$tmp/m/model.safetensors"
g=(--prompt-ids 1,2 --max-new-tokens 2)

mk && truncate -s 100000 "$st"
expect_error "truncated safetensors" 1 "$st: tensor '.*': data_offsets .* run past the data region" -- --model "$tmp/m" "${g[@]}"
mk && perl -pi -e 's/"data_offsets":\[0,262144\]/"data_offsets":[0,962144]/' "$st"
expect_error "header lying about offsets" 1 "$st: tensor 'lm_head.weight': data_offsets \[0, 962144\]" -- --model "$tmp/m" "${g[@]}"
mk && perl -pi -e 's/"lm_head.weight":\{"dtype":"F32"/"lm_head.weight":{"dtype":"I32"/' "$st"
expect_error "wrong dtype" 1 "$st: tensor 'lm_head.weight' has dtype I32" -- --model "$tmp/m" "${g[@]}"
mk && perl -pi -e 's/"model.norm.weight"/"model.norm.weighX"/' "$st"
expect_error "missing tensor" 1 "$st: tensor 'model.norm.weight' not found" -- --model "$tmp/m" "${g[@]}"
mk && perl -pi -e 's/"lm_head.weight":\{"dtype":"F32","shape":\[512,128\]/"lm_head.weight":{"dtype":"F32","shape":[128,512]/' "$st"
expect_error "shape mismatch" 1 "$st: tensor 'lm_head.weight' has shape \[128, 512\], the model declares \[512, 128\]" -- --model "$tmp/m" "${g[@]}"
# a checkpoint of another family (Qwen3: q_norm / k_norm the Llama model lacks) is refused, not run
expect_error "checkpoint of another family" 1 "model.safetensors: tensor 'model.layers.0.self_attn.k_norm.weight' is not a weight of model 'llama' \(4 such tensors\)" -- --model "$fx/hf/qwen3" "${g[@]}"
mk && grep -v '"hidden_size"' "$gqa/config.json" >"$tmp/m/config.json"
expect_error "config.json missing a field" 1 "$tmp/m/config.json: required field 'hidden_size' is missing" -- --model "$tmp/m" "${g[@]}"
mk && sed 's/"num_key_value_heads": 2/"num_key_value_heads": 3/' "$gqa/config.json" >"$tmp/m/config.json"
expect_error "config.json inconsistent" 1 "$tmp/m/config.json: num_attention_heads \(8\) is not a multiple of num_key_value_heads \(3\)" -- --model "$tmp/m" "${g[@]}"
mk && echo '{"hidden_size": ' >"$tmp/m/config.json"
expect_error "config.json not JSON" 1 "$tmp/m/config.json" -- --model "$tmp/m" "${g[@]}"
expect_error "no such model" 1 "$tmp/nothing: cannot open the model" -- --model "$tmp/nothing" "${g[@]}"
head -c 5000 "$l2c" >"$tmp/short.bin"
expect_error "llama2.c file too short" 1 "$tmp/short.bin: file too short" -- --model "$tmp/short.bin" "${g[@]}"
expect_error "unreadable tokenizer" 1 "$tmp/nope.bin: cannot open tokenizer" -- --model "$l2c" --tokenizer "$tmp/nope.bin" --prompt hi --max-new-tokens 2
head -c 3000 "$tok" >"$tmp/tok.bin"
expect_error "truncated tokenizer" 1 "$tmp/tok.bin: truncated after token" -- --model "$l2c" --tokenizer "$tmp/tok.bin" --prompt hi --max-new-tokens 2

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
