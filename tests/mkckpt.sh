#!/usr/bin/env bash
# mkckpt.sh - mstar-mkckpt end to end: writes checkpoints that load and check clean, is
# deterministic per seed, shards (directly or by --split of a fixture) into checkpoints that check
# clean, and fails bad input with one line naming the file and the problem, exit status 1.
# Run by scripts/run-tests.sh with MS_BUILD set; prints "N passed, N failed".
set -uo pipefail
build=${MS_BUILD:-build}
tool="$build/mstar-mkckpt"
fixtures=${MS_FIXTURES:-../shared/fixtures}
tmp=$(mktemp -d /tmp/ms_test_mkckpt_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

check() {  # check NAME COMMAND...: the command must succeed
    local name=$1
    shift
    if out=$("$@" 2>&1); then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "FAIL $name: $*"
        echo "$out"
    fi
}

check_fails() {  # check_fails NAME EXPECTED_TEXT COMMAND...: exit 1, one stderr line containing the text
    local name=$1 want=$2
    shift 2
    local err rc
    err=$("$@" 2>&1 >/dev/null)
    rc=$?
    if [ $rc -eq 1 ] && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] && [[ $err == *"$want"* ]]; then
        passed=$((passed + 1))
        echo "  ok (exit $rc): $err"
    else
        failed=$((failed + 1))
        echo "FAIL $name: exit $rc, stderr '$err', expected one line with '$want'"
    fi
}

# ---- generation ----
# (every ASan process costs about a second: commands are grouped to keep the suite fast)
check "default small model" "$tool" --out "$tmp/small"
check "same seed, same bytes" bash -c "'$tool' --preset tiny --out '$tmp/a' >/dev/null && '$tool' --preset tiny --out '$tmp/b' >/dev/null && cmp '$tmp/a/model.safetensors' '$tmp/b/model.safetensors'"
check "other seed, other bytes" bash -c "'$tool' --preset tiny --seed 2 --out '$tmp/c' >/dev/null && ! cmp -s '$tmp/a/model.safetensors' '$tmp/c/model.safetensors'"
check "bf16 tied legacy-config sharded" "$tool" --preset tiny --dtype bf16 --tie --legacy-config --shards 3 --out "$tmp/t3"
check "index lists 3 shards" bash -c "[ \$(grep -o 'model-0000[0-9]-of-00003.safetensors' '$tmp/t3/model.safetensors.index.json' | sort -u | wc -l) -eq 3 ]"
check "bos and eos ids" bash -c "'$tool' --preset tiny --bos 7 --eos 3,5 --out '$tmp/be' >/dev/null && [ \"\$(jq -c '[.bos_token_id, .eos_token_id]' '$tmp/be/config.json')\" = '[7,[3,5]]' ] && [ \"\$(jq -c '[.bos_token_id, .eos_token_id]' '$tmp/be/generation_config.json')\" = '[7,[3,5]]' ]"
check "custom shape" "$tool" --preset tiny --hidden 96 --heads 6 --kv-heads 3 --head-dim 16 --layers 3 --intermediate 200 --vocab 300 --out "$tmp/custom"
# a direct 2-shard write and a --split of the single file give byte-identical shards
check "split equals direct shards" bash -c "'$tool' --preset tiny --shards 2 --out '$tmp/d2' >/dev/null && '$tool' --split '$tmp/a' --shards 2 --out '$tmp/s2' >/dev/null && cmp '$tmp/d2/model-00001-of-00002.safetensors' '$tmp/s2/model-00001-of-00002.safetensors' && cmp '$tmp/d2/model-00002-of-00002.safetensors' '$tmp/s2/model-00002-of-00002.safetensors' && cmp '$tmp/d2/model.safetensors.index.json' '$tmp/s2/model.safetensors.index.json'"
check "split llama_gqa in 2" "$tool" --split "$fixtures/hf/llama_gqa" --shards 2 --out "$tmp/gqa2"
check "split copies config.json" cmp "$fixtures/hf/llama_gqa/config.json" "$tmp/gqa2/config.json"

# ---- everything written, and the Llama fixtures, check clean as Llamas ----
check "checkpoints check" "$tool" --check "$tmp/small" "$tmp/t3" "$tmp/custom" "$tmp/gqa2" \
    "$fixtures/hf/llama_gqa" "$fixtures/hf/llama31_rope" "$fixtures/hf/llama31_rope_legacy" \
    "$fixtures/hf/mistral_window" "$fixtures/hf/llama_cfg" "$fixtures/llama2c/aidreams260K.bin"
check "check output" bash -c "[ \$('$tool' --check '$tmp/small' '$tmp/t3' '$fixtures/hf/llama31_rope' | grep -c '^ok: ') -eq 3 ]"

# ---- bad input ----
check_fails "unknown option" "unknown option '--bogus'" "$tool" --bogus 1
check_fails "bad number" "--layers 'x' is not an integer" "$tool" --layers x
check_fails "unknown switch last" "unknown option '--bogus'" "$tool" --preset tiny --bogus
check_fails "value missing" "--seed needs a value" "$tool" --preset tiny --seed
check_fails "eos outside the vocabulary" "--eos 300 is outside the vocabulary of 256 ids" "$tool" --preset tiny --eos 300 --out "$tmp/never"
check_fails "eos empty entry" "--eos '3,' is not one to three comma-separated token ids" "$tool" --preset tiny --eos 3, --out "$tmp/never"
check_fails "bos not an id" "--bos 'x' is not a token id" "$tool" --preset tiny --bos x --out "$tmp/never"
check_fails "tie conflict" "give --tie or --no-tie, not both" "$tool" --tie --no-tie --out "$tmp/never"
# sizes that cannot fit on the disk are refused before writing (and leave no folder behind)
check_fails "too big for the disk" "GB but only" "$tool" --hidden 1048576 --intermediate 4194304 \
    --layers 4096 --vocab 16777216 --out "$tmp/huge"
check "no folder left" test ! -e "$tmp/huge"
check_fails "missing checkpoint" "nope: cannot read" "$tool" --check "$tmp/nope"
head -c 100000 "$tmp/a/model.safetensors" >"$tmp/trunc.safetensors"
mkdir -p "$tmp/trunc" && cp "$tmp/a/config.json" "$tmp/trunc/" && mv "$tmp/trunc.safetensors" "$tmp/trunc/model.safetensors"
check_fails "truncated safetensors" "trunc/model.safetensors: tensor" "$tool" --check "$tmp/trunc"
mkdir -p "$tmp/nofield" && cp "$tmp/a/model.safetensors" "$tmp/nofield/" &&
    grep -v '"vocab_size"' "$tmp/a/config.json" >"$tmp/nofield/config.json"
check_fails "config missing a field" "nofield/config.json: required field 'vocab_size' is missing" "$tool" --check "$tmp/nofield"
mkdir -p "$tmp/shape" && cp "$tmp/a/model.safetensors" "$tmp/shape/" &&
    sed 's/"intermediate_size": 128/"intermediate_size": 96/' "$tmp/a/config.json" >"$tmp/shape/config.json"
check_fails "shape mismatch" "has shape [128, 64], the model declares [96, 64]" "$tool" --check "$tmp/shape"
mkdir -p "$tmp/untied" && cp "$tmp/c/model.safetensors" "$tmp/untied/" &&
    sed 's/"num_hidden_layers": 2/"num_hidden_layers": 3/' "$tmp/c/config.json" >"$tmp/untied/config.json"
check_fails "missing tensor" "tensor 'model.layers.2.input_layernorm.weight' not found" "$tool" --check "$tmp/untied"
head -c 1000 "$fixtures/llama2c/aidreams260K.bin" >"$tmp/short.bin"
check_fails "llama2.c too short" "short.bin: file too short: 1000 bytes" "$tool" --check "$tmp/short.bin"
check_fails "unwritable output" "cannot create folder" "$tool" --preset tiny --out /proc/nope/x

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
