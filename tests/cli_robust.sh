#!/usr/bin/env bash
# cli_robust.sh - edge cases a new user hits (issue 15): degenerate sampling settings, a NaN logit
# row, write errors on stdout, flag limits and number parsing, messages that say what is really
# wrong, config fields that change the maths, output that tells prompts apart. Drives
# `$MS_BUILD/llama/llama` (and `$MS_BUILD/mstarc`) on the shared fixtures; files are mutated in a
# temporary folder. Kept apart from generate_cli.sh so that the two grow without merge churn.
set -uo pipefail
export CUDA_VISIBLE_DEVICES=
build=${MS_BUILD:-build}
bin="$build/llama/llama"
mstarc="$build/mstarc"
fx=${MS_FIXTURES:-../shared/fixtures}
tmp=$(mktemp -d)
trap 'chmod -R u+rwx "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
passed=0
failed=0

ok() { passed=$((passed + 1)); echo "ok   $1"; }
bad() { failed=$((failed + 1)); echo "FAIL $1"; shift; printf '     %s\n' "$@"; }

# expect_error NAME STATUS PATTERN -- ARGS...: `generate ARGS` exits STATUS with a stderr line
# matching PATTERN (the only line for status 1), no sanitizer report, empty stdout.
expect_error() {
    local name=$1 want=$2 pat=$3
    shift 4
    "$bin" generate "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    if [ $rc -ne "$want" ]; then
        bad "$name" "exit $rc, expected $want" "$(head -c 600 "$tmp/err")"
    elif grep -qE 'Sanitizer|runtime error' "$tmp/err"; then
        bad "$name" "sanitizer report:" "$(head -c 600 "$tmp/err")"
    elif [ "$want" -eq 1 ] && [ "$(wc -l <"$tmp/err")" -ne 1 ]; then
        bad "$name" "expected one stderr line" "$(head -c 600 "$tmp/err")"
    elif ! grep -qE -- "$pat" "$tmp/err"; then
        bad "$name" "stderr does not match /$pat/" "$(head -c 600 "$tmp/err")"
    elif [ -s "$tmp/out" ]; then
        bad "$name" "unexpected stdout" "$(head -c 200 "$tmp/out")"
    else
        ok "$name"
    fi
}

gqa="$fx/hf/llama_gqa"

# ---- 1. a temperature whose logit scaling overflows float is greedy (vLLM: T < 1e-5) ----
greedy=$("$bin" generate --model "$gqa" --prompt-ids 1,2,3 --max-new-tokens 4 --temperature 0 --ignore-eos 2>/dev/null)
for t in 1e-45 1e-40 1e-39 1e-38 1e-6; do
    out=$("$bin" generate --model "$gqa" --prompt-ids 1,2,3 --max-new-tokens 4 --temperature "$t" \
        --top-k 40 --top-p 0.9 --seed 3 --ignore-eos 2>/dev/null)
    if [ -n "$greedy" ] && [ "$out" = "$greedy" ]; then ok "--temperature $t is greedy"; else bad "--temperature $t" "got '$out', greedy '$greedy'"; fi
done

# ---- 2. a NaN logit row fails that request alone, naming the prompt ----
# token 90's embedding row is NaN: 1,2,3 (greedy 308 90 474 262) fails at the step that feeds 90
nanm="$tmp/nan_model"
mkdir -p "$nanm" && cp "$gqa/config.json" "$gqa/model.safetensors" "$nanm/"
python3 - "$nanm/model.safetensors" <<'PY'
import json, struct, sys
with open(sys.argv[1], "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    t = json.loads(f.read(n))["model.embed_tokens.weight"]
    hidden = t["shape"][1]
    f.seek(8 + n + t["data_offsets"][0] + 90 * hidden * 4)
    f.write(struct.pack("<f", float("nan")) * hidden)
PY
printf '5,6\n1,2,3\n17,33\n' >"$tmp/nan_prompts"
"$bin" generate --model "$gqa" --prompts-file "$tmp/nan_prompts" --max-new-tokens 4 --temperature 0 --ignore-eos >"$tmp/want" 2>/dev/null
"$bin" generate --model "$nanm" --prompts-file "$tmp/nan_prompts" --max-new-tokens 4 --temperature 0 --ignore-eos >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -eq 1 ] && [ "$(sed -n 1p "$tmp/out")" = "$(sed -n 1p "$tmp/want")" ] &&
    [ "$(sed -n 3p "$tmp/out")" = "$(sed -n 3p "$tmp/want")" ] && [ "$(sed -n 2p "$tmp/out")" = "[2] 308 90" ] &&
    grep -q "^llama: prompt 2 ($tmp/nan_prompts:2): generation failed after 2 new tokens: the model's logits hold NaN; the output of the other prompts is complete$" "$tmp/err"; then
    ok "NaN logits fail prompt 2 alone (named by number and line), the others complete, exit 1"
else
    bad "NaN logit row" "exit $rc" "$(cat "$tmp/out")" "$(head -c 400 "$tmp/err")"
fi
"$bin" generate --model "$nanm" --prompts-file <(printf '5,6\n3,90\n4\n') --max-new-tokens 4 --temperature 0.8 --seed 1 --ignore-eos --output jsonl >"$tmp/out" 2>/dev/null
if [ "$(jq -r 'select(.index == 2) | .finish_reason + ": " + .error' "$tmp/out")" = "error: generation failed after 0 new tokens: the model's logits hold NaN" ] &&
    [ "$(jq -s '[.[] | select(.finish_reason == "length")] | length' "$tmp/out")" -eq 2 ]; then
    ok "NaN logits, sampled, jsonl: finish_reason error for prompt 2, length for the others"
else
    bad "NaN logit row jsonl" "$(cat "$tmp/out")"
fi
"$bin" generate --model "$nanm" --prompt-ids 90 --max-new-tokens 4 >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -eq 1 ] && [ "$(cat "$tmp/out")" = "" ] &&
    tail -n 1 "$tmp/err" | grep -q "^llama: prompt 1 (--prompt-ids): generation failed after 0 new tokens: the model's logits hold NaN$"; then
    ok "NaN logits, one prompt: the last stderr line says so, exit 1"
else
    bad "NaN logits, one prompt" "exit $rc" "$(cat "$tmp/out")" "$(cat "$tmp/err")"
fi

# ---- 3. a failed write to stdout is an error, exit 1 ----
# expect_write_error NAME CMD...: CMD > /dev/full exits 1 with "cannot write the output to stdout"
expect_write_error() {
    local name=$1
    shift
    "$@" >/dev/full 2>"$tmp/err"
    local rc=$?
    if [ $rc -eq 1 ] && grep -q "cannot write the output to stdout: No space left on device" "$tmp/err"; then
        ok "$name > /dev/full: exit 1, says so"
    else
        bad "$name > /dev/full" "exit $rc" "$(head -c 300 "$tmp/err")"
    fi
}
if [ -w /dev/full ]; then
    printf '1,2\n3\n' >"$tmp/two"
    expect_write_error "generate (streamed)" "$bin" generate --model "$gqa" --prompt-ids 1,2,3 --max-new-tokens 4
    expect_write_error "generate (prompts file)" "$bin" generate --model "$gqa" --prompts-file "$tmp/two" --max-new-tokens 4
    expect_write_error "generate --help" "$bin" generate --help
    expect_write_error "mstarc dump" "$mstarc" dump models/llama.mstar
    expect_write_error "mstarc check" "$mstarc" check models/llama.mstar
    expect_write_error "mstarc build --emit-only" "$mstarc" build models/llama.mstar -o "$tmp/emit" --emit-only
else
    echo "skip /dev/full checks: no writable /dev/full"
fi

# ---- 4. --threads: one limit (the CPU thread pool's, 256), checked at the flag ----
out=$("$bin" generate --model "$gqa" --prompt-ids 1,2 --max-new-tokens 2 --device cpu --threads 256 2>/dev/null)
if [ -n "$out" ]; then ok "--threads 256 runs"; else bad "--threads 256" "no output"; fi
for t in 257 1024; do
    expect_error "generate --threads $t" 1 "^llama: --threads: '$t' is too large \(at most 256\)$" \
        -- --model "$gqa" --prompt-ids 1,2 --max-new-tokens 2 --device cpu --threads "$t"
done
"$bin" bench --model "$gqa" --device cpu --threads 300 >"$tmp/out" 2>"$tmp/err"
if [ $? -eq 1 ] && grep -q "^llama: --threads: '300' is too large (at most 256)$" "$tmp/err"; then
    ok "bench --threads 300 refused at the flag"
else
    bad "bench --threads 300" "$(head -c 300 "$tmp/err")"
fi

# ---- 5. several prompts of text: one line each, "[k] " and escaped control bytes; jsonl ----
l2c="$fx/llama2c/aidreams260K.bin"
tok="$fx/llama2c/tok512.bin"
s=(--model "$l2c" --tokenizer "$tok" --max-new-tokens 300 --temperature 1 --seed 5)
"$bin" generate "${s[@]}" --prompt "Hi" >"$tmp/alone" 2>/dev/null
printf 'Hi\nHi\n' >"$tmp/hi2"
"$bin" generate "${s[@]}" --prompts-file "$tmp/hi2" >"$tmp/batch" 2>/dev/null
# the text alone (streamed, raw) has newlines of its own; the batch escapes them
printf '%b\n' "$(sed -n 2p "$tmp/batch" | sed 's/^\[2\] //')" >"$tmp/unescaped"
if [ "$(wc -l <"$tmp/alone")" -gt 1 ] && [ "$(wc -l <"$tmp/batch")" -eq 2 ] &&
    sed -n 1p "$tmp/batch" | grep -q '^\[1\] Hi' && sed -n 2p "$tmp/batch" | grep -q '^\[2\] Hi' &&
    cmp -s "$tmp/unescaped" "$tmp/alone"; then
    ok "prompts file of text: one line per prompt, [k] prefix, newlines escaped (unescaped = alone)"
else
    bad "prompts file text lines" "$(head -c 300 "$tmp/batch")" "$(diff "$tmp/unescaped" "$tmp/alone" | head -4)"
fi
printf 'Once\tupon a \\ time\n' >"$tmp/tab"
"$bin" generate --model "$l2c" --tokenizer "$tok" --prompts-file "$tmp/hi2" --max-new-tokens 4 --temperature 0 --output jsonl >"$tmp/jsonl" 2>/dev/null
if [ "$(wc -l <"$tmp/jsonl")" -eq 2 ] &&
    [ "$(jq -s -c '[.[] | [.index, .source, (.ids | length), .finish_reason, (.text | type)]]' "$tmp/jsonl")" = "[[1,\"$tmp/hi2:1\",4,\"length\",\"string\"],[2,\"$tmp/hi2:2\",4,\"length\",\"string\"]]" ]; then
    ok "--output jsonl: one object per prompt (index, source, text, ids, finish_reason)"
else
    bad "--output jsonl" "$(head -c 400 "$tmp/jsonl")"
fi
"$bin" generate "${s[@]}" --prompts-file "$tmp/hi2" --output jsonl >"$tmp/jsonl" 2>/dev/null
if [ "$(jq -r 'select(.index == 2) | .text' "$tmp/jsonl")" = "$(sed 's/^Hi//' "$tmp/alone")" ]; then
    ok "--output jsonl: text with its newlines, as generated"
else
    bad "--output jsonl text" "$(head -c 300 "$tmp/jsonl")"
fi
"$bin" generate --model "$gqa" --prompt-ids 1,2 --max-new-tokens 2 --output jsonl >"$tmp/jsonl" 2>/dev/null
if [ "$(jq -c '[.index, .source, has("text"), (.ids | length)]' "$tmp/jsonl")" = '[1,"--prompt-ids",false,2]' ]; then
    ok "--output jsonl without a tokenizer: ids only"
else
    bad "--output jsonl ids" "$(cat "$tmp/jsonl")"
fi

# ---- 6. numbers: too large is said so; plain decimal only; a flag once ----
m=(--model "$gqa" --prompt-ids 1,2 --max-new-tokens 2)
expect_error "--max-new-tokens 2147483648" 1 "^llama: --max-new-tokens: '2147483648' is too large \(at most 2147483647\)$" -- --model "$gqa" --prompt-ids 1,2 --max-new-tokens 2147483648
expect_error "--top-k 99999999999" 1 "^llama: --top-k: '99999999999' is too large \(at most 2147483647\)$" -- "${m[@]}" --top-k 99999999999
expect_error "--steps 99999999999999999999" 1 "^llama: --steps: '99999999999999999999' is too large" -- --model "$gqa" --prompt-ids 1,2 --steps 99999999999999999999
expect_error "--temperature 1e309" 1 "^llama: --temperature: '1e309' is too large \(at most 3.40282e\+38\)$" -- "${m[@]}" --temperature 1e309
expect_error "--temperature 1e308" 1 "^llama: --temperature: '1e308' is too large \(at most 3.40282e\+38\)$" -- "${m[@]}" --temperature 1e308
expect_error "--seed 2^64" 1 "^llama: --seed: '18446744073709551616' is too large \(at most 18446744073709551615\)$" -- "${m[@]}" --seed 18446744073709551616
expect_error "--top-p 1.0000000001" 1 "^llama: --top-p: '1.0000000001' is not a number in \(0, 1\]$" -- "${m[@]}" --top-p 1.0000000001
expect_error "--temperature 0x10 (hex)" 1 "^llama: --temperature: '0x10' is not a number >= 0$" -- "${m[@]}" --temperature 0x10
expect_error "--top-p 0x1p-1 (hex)" 1 "^llama: --top-p: '0x1p-1' is not a number in" -- "${m[@]}" --top-p 0x1p-1
expect_error "--temperature inf" 1 "^llama: --temperature: 'inf' is not a number >= 0$" -- "${m[@]}" --temperature inf
expect_error "--max-new-tokens ' 4' (leading space)" 1 "^llama: --max-new-tokens: ' 4' is not an integer >= 0$" -- --model "$gqa" --prompt-ids 1,2 --max-new-tokens " 4"
expect_error "--temperature ' 0.5' (leading space)" 1 "^llama: --temperature: ' 0.5' is not a number >= 0$" -- "${m[@]}" --temperature " 0.5"
expect_error "--seed ' 1' (leading space)" 1 "^llama: --seed: ' 1' is not an unsigned integer$" -- "${m[@]}" --seed " 1"
expect_error "--prompt-ids twice" 2 "^llama: flag --prompt-ids given twice" -- "${m[@]}" --prompt-ids 3,4
expect_error "--temperature twice" 2 "^llama: flag --temperature given twice" -- "${m[@]}" --temperature 0 --temperature 1
"$bin" bench --model "$gqa" --device cpu --runs 99999999999 >"$tmp/out" 2>"$tmp/err"
if [ $? -eq 1 ] && grep -q "^llama: --runs: '99999999999' is too large (at most 1000)$" "$tmp/err"; then
    ok "bench --runs 99999999999: too large"
else
    bad "bench --runs 99999999999" "$(head -c 300 "$tmp/err")"
fi

# ---- 7. each message says what is really wrong ----
expect_error "--prompts-file a folder" 1 "^llama: --prompts-file: $tmp: a folder, not a prompts file" -- --model "$gqa" --prompts-file "$tmp"
mkdir -p "$tmp/loop" && ln -s config.json "$tmp/loop/config.json"
expect_error "model folder whose config.json cannot be read" 1 "^llama: $tmp/loop: cannot read the model folder's config.json \(Too many levels of symbolic links\)$" -- --model "$tmp/loop" --prompt-ids 1
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null; then
    mkdir -p "$tmp/m000" && cp "$gqa/config.json" "$tmp/m000/" && chmod 000 "$tmp/m000" && chmod o+x "$tmp"
    setpriv --reuid=65534 --regid=65534 --clear-groups "$bin" generate --model "$tmp/m000" --prompt-ids 1 >"$tmp/out" 2>"$tmp/err.000"
    rc=$?
    chmod 755 "$tmp/m000"
    if [ $rc -eq 1 ] && grep -q "^llama: $tmp/m000: cannot read the model folder's config.json (Permission denied)$" "$tmp/err.000"; then
        ok "model folder of mode 000 (as nobody): permission denied, not 'no config.json'"
    elif grep -q "Permission denied" "$tmp/err.000" && ! grep -q "$tmp/m000" "$tmp/err.000"; then
        echo "skip mode-000 folder: nobody cannot run $bin here"
    else
        bad "model folder of mode 000" "exit $rc" "$(cat "$tmp/err.000")"
    fi
fi
: >"$tmp/tokenizer.json"
expect_error "empty tokenizer.json" 1 "^llama: $tmp/tokenizer.json: the tokenizer file is empty" -- --model "$gqa" --tokenizer "$tmp/tokenizer.json" --prompt hi
printf '1,2\n\033[31mred\n' >"$tmp/ctl"
expect_error "control bytes in a prompts file are escaped" 1 "^llama: $tmp/ctl:2: entry 1 '\\\\x1b\[31mred' is not a token id" -- --model "$gqa" --prompts-file "$tmp/ctl"
if grep -q $'\033' "$tmp/err"; then bad "control bytes" "raw ESC on stderr"; fi
"$mstarc" build models/llama.mstar -o "" >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -eq 2 ] && grep -q "^mstarc: error: -o: the output folder is empty" "$tmp/err"; then ok "mstarc build -o '': says the folder is empty"; else bad "mstarc -o ''" "exit $rc" "$(cat "$tmp/err")"; fi
"$mstarc" build models/llama.mstar -o "$tmp/o" --arch sm_80 --config /nonexistent >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -eq 1 ] && grep -q "^mstarc: error: --config /nonexistent: no such file or folder" "$tmp/err" && ! grep -q "line -1" "$tmp/err"; then
    ok "mstarc --config /nonexistent: no such file, no '(line -1)'"
else
    bad "mstarc --config /nonexistent" "exit $rc" "$(cat "$tmp/err")"
fi

# ---- 8. config fields that change the maths: what the model file declares is checked ----
# the generated binary (the checks are emitted from models/llama.mstar: its architectures and
# its forward's activation)
if "$mstarc" build models/llama.mstar -o "$tmp/gen" >/dev/null 2>"$tmp/err"; then
    gen="$tmp/gen/llama"
    # expect_gen_error NAME PATTERN -- ARGS: `llama generate ARGS` exits 1, one stderr line
    expect_gen_error() {
        local name=$1 pat=$2
        shift 3
        "$gen" generate "$@" >"$tmp/out" 2>"$tmp/err"
        local rc=$?
        if [ $rc -eq 1 ] && [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -qE -- "$pat" "$tmp/err" && [ ! -s "$tmp/out" ]; then
            ok "$name"
        else
            bad "$name" "exit $rc" "$(head -c 400 "$tmp/err")"
        fi
    }
    mkm() { rm -rf "$tmp/m8" && mkdir "$tmp/m8" && cp "$gqa/config.json" "$gqa/model.safetensors" "$tmp/m8/"; }
    mkm && sed -i 's/"hidden_act": "silu"/"hidden_act": "gelu"/' "$tmp/m8/config.json"
    expect_gen_error "hidden_act gelu refused (the forward computes silu)" "config.json: hidden_act 'gelu' is not the activation this model computes \(silu, swish\)$" -- --model "$tmp/m8" --prompt-ids 1,2
    mkm && sed -i 's/"hidden_act": "silu"/"hidden_act": "swish"/' "$tmp/m8/config.json"
    out=$("$gen" generate --model "$tmp/m8" --prompt-ids 1,2 --max-new-tokens 2 --temperature 0 2>/dev/null)
    want=$("$gen" generate --model "$gqa" --prompt-ids 1,2 --max-new-tokens 2 --temperature 0 2>/dev/null)
    if [ -n "$out" ] && [ "$out" = "$want" ]; then ok "hidden_act swish (= silu) runs"; else bad "hidden_act swish" "$out" "$want"; fi
    mkm && sed -i 's/"LlamaForCausalLM"/"BertModel"/' "$tmp/m8/config.json"
    expect_gen_error "architectures BertModel refused" "config.json: architecture 'BertModel' is not supported by this model \(LlamaForCausalLM, MistralForCausalLM\)$" -- --model "$tmp/m8" --prompt-ids 1,2
    expect_gen_error "whisper_tiny: its architecture, not a missing field" "whisper_tiny/config.json: architecture 'WhisperForConditionalGeneration' is not supported by this model" -- --model "$fx/hf/whisper_tiny" --prompt-ids 1,2
    out=$("$gen" generate --model "$fx/hf/mistral_window" --prompt-ids 1,2 --max-new-tokens 2 2>/dev/null)
    if [ -n "$out" ]; then ok "MistralForCausalLM runs"; else bad "mistral_window" "no output"; fi
    out=$("$gen" generate --model "$fx/llama2c/aidreams260K.bin" --prompt-ids 1,2 --max-new-tokens 2 2>/dev/null)
    if [ -n "$out" ]; then ok "llama2.c checkpoint (no architectures of its own) runs"; else bad "llama2.c with the generated binary" "no output"; fi
    mkm && echo '{"metadata": {}, "weight_map": {}}' >"$tmp/m8/model.safetensors.index.json"
    expect_gen_error "a shard index beside a stray model.safetensors" "$tmp/m8: holds both model.safetensors.index.json and model.safetensors, so which one is the checkpoint is ambiguous" -- --model "$tmp/m8" --prompt-ids 1,2
    out=$("$gen" generate --model "$tmp/m8/model.safetensors" --prompt-ids 1,2 --max-new-tokens 2 --temperature 0 2>/dev/null)
    if [ -n "$out" ] && [ "$out" = "$want" ]; then ok "the single file given itself runs"; else bad "model.safetensors given itself" "$out"; fi
else
    bad "mstarc build models/llama.mstar" "$(head -c 400 "$tmp/err")"
fi

# ---- 9. the context note follows stdout's final newline; --help lists every verb; page sizes ----
l2c="$fx/llama2c/aidreams260K.bin"
"$bin" generate --model "$l2c" --prompt-ids "$(seq -s, 3 122)" --max-new-tokens 50 --ignore-eos >"$tmp/both" 2>&1
if [ "$(sed -n 1p "$tmp/both" | wc -w)" -eq 9 ] && sed -n 2p "$tmp/both" | grep -q "^llama: note: prompt 1 stopped after 9 new tokens"; then
    ok "context note on its own line after the ids (2>&1)"
else
    bad "context note placement" "$(head -c 400 "$tmp/both")"
fi
"$bin" --help >"$tmp/help" 2>&1
if grep -q "llama generate" "$tmp/help" && grep -q "llama bench" "$tmp/help" && grep -q "llama kernels" "$tmp/help"; then
    ok "--help lists generate, bench and kernels"
else
    bad "--help verbs" "$(cat "$tmp/help")"
fi
sed 's/page_size = 16/page_size = 8192/' models/llama.mstar >"$tmp/ps8192.mstar"
"$mstarc" build "$tmp/ps8192.mstar" -o "$tmp/ps8192" --arch sm_80 >"$tmp/out" 2>"$tmp/err"
rc=$?
if grep -q "built without CUDA" "$tmp/err"; then
    echo "skip mstarc --arch page size: no CUDA in this build"
elif [ $rc -eq 1 ] && grep -q "kv_pool kv has page_size 8192, outside the page sizes the CUDA kernels take (1 .. 1024)" "$tmp/err" &&
    ! grep -q "page_size=16" "$tmp/out"; then
    ok "mstarc build --arch: page_size 8192 refused, not checked as 16"
else
    bad "mstarc build --arch page_size 8192" "exit $rc" "$(tail -c 300 "$tmp/out")" "$(head -c 300 "$tmp/err")"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
