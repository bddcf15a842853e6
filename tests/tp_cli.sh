#!/usr/bin/env bash
# tp_cli.sh - `--tp N` through the serving binary on the CPU (ranks as threads, engine/tp.h):
# generate's greedy and sampled ids with --tp 2 equal --tp 1 (hf/llama_gqa, 8 q / 2 kv heads)
# and with --tp 4 on hf/llama31_rope (4 / 4 heads), --tp 2 on a sliding-window model, a guided
# (CFG) pair and a config without num_key_value_heads; --tp 3 on llama31_rope and --tp 4 on llama_gqa
# refused with one line naming the counts; bad --tp values refused; bench --tp 2 runs and reports
# tp in its JSON; serve --tp 2 answers a greedy and a sampled (penalties, min_p) completion and
# two over a shared 40-id prefix (the second a prefix-cache hit) with the ids and hit count of
# serve without --tp, and exits 0 on SIGTERM.
set -uo pipefail
export CUDA_VISIBLE_DEVICES=
build=${MS_BUILD:-build}
bin="$build/llama/llama"
fx=${MS_FIXTURES:-../shared/fixtures}
gqa="$fx/hf/llama_gqa"
l31="$fx/hf/llama31_rope"
tmp=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
    rm -rf "$tmp"
}
trap cleanup EXIT
passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok   $1"; }
bad() { failed=$((failed + 1)); echo "FAIL $1"; shift; printf '     %s\n' "$@"; }

gen() { # gen MODEL TP EXTRA...: the ids of one prompt ($ids, default 1,5,9,33,7,100) on stdout
    local m=$1 tp=$2
    shift 2
    timeout 60 "$bin" generate --model "$m" --tokenizer none --prompt-ids "${ids:-1,5,9,33,7,100}" \
        --max-new-tokens 24 --ignore-eos --output ids --device cpu --threads 1 --tp "$tp" "$@" \
        2>"$tmp/gen.err"
}

for args in "" "--temperature 0.8 --top-p 0.9 --seed 5"; do
    # shellcheck disable=SC2086
    a=$(gen "$gqa" 1 $args)
    # shellcheck disable=SC2086
    b=$(gen "$gqa" 2 $args)
    if [ -n "$a" ] && [ "$a" = "$b" ] && grep -q "tensor parallel over 2 ranks" "$tmp/gen.err"; then
        ok "generate --tp 2 = --tp 1 on llama_gqa ${args:-(greedy)}: $(echo "$a" | wc -w) ids"
    else
        bad "generate --tp 2 on llama_gqa $args" "tp 1: $a" "tp 2: $b" "$(cat "$tmp/gen.err")"
    fi
done
a=$(gen "$l31" 1)
b=$(gen "$l31" 4)
if [ -n "$a" ] && [ "$a" = "$b" ]; then
    ok "generate --tp 4 = --tp 1 on llama31_rope (tied head, 1 kv head per rank)"
else
    bad "generate --tp 4 on llama31_rope" "tp 1: $a" "tp 4: $b" "$(cat "$tmp/gen.err")"
fi

# a sliding-window model and a guided (CFG) pair: two streams per request on every rank
mw=$(cd "$fx/hf/mistral_window" && pwd)
a=$(ids=$(seq -s, 1 40) gen "$mw" 1)
b=$(ids=$(seq -s, 1 40) gen "$mw" 2)
if [ -n "$a" ] && [ "$a" = "$b" ]; then
    ok "generate --tp 2 = --tp 1 on mistral_window (sliding window, 40-id prompt)"
else
    bad "generate --tp 2 on mistral_window" "tp 1: $a" "tp 2: $b" "$(cat "$tmp/gen.err")"
fi
cfg=(--negative-prompt-ids 1,7 --guidance-scale 3)
a=$(gen "$fx/hf/llama_cfg" 1 "${cfg[@]}")
b=$(gen "$fx/hf/llama_cfg" 2 "${cfg[@]}")
if [ -n "$a" ] && [ "$a" = "$b" ]; then
    ok "generate --tp 2 = --tp 1 on llama_cfg with a negative prompt (guided pair)"
else
    bad "generate --tp 2 on llama_cfg guided" "tp 1: $a" "tp 2: $b" "$(cat "$tmp/gen.err")"
fi

# a config that leaves num_key_value_heads to the model's default (= num_attention_heads)
mkdir -p "$tmp/nokv"
python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); del c["num_key_value_heads"]; json.dump(c, open(sys.argv[2], "w"))' \
    "$l31/config.json" "$tmp/nokv/config.json"
ln -s "$(cd "$l31" && pwd)/model.safetensors" "$tmp/nokv/model.safetensors"
a=$(gen "$tmp/nokv" 1)
b=$(gen "$tmp/nokv" 2)
if [ -n "$a" ] && [ "$a" = "$b" ]; then
    ok "generate --tp 2 = --tp 1 without num_key_value_heads in config.json"
else
    bad "generate --tp 2 without num_key_value_heads" "tp 1: $a" "tp 2: $b" "$(cat "$tmp/gen.err")"
fi

refused() { # refused NAME WANT CMD...: exit != 0, one line on stderr containing WANT
    local name=$1 want=$2
    shift 2
    "$@" >/dev/null 2>"$tmp/ref.err"
    local rc=$?
    if [ "$rc" -ne 0 ] && [ "$(grep -cF -- "$want" "$tmp/ref.err")" -eq 1 ]; then
        ok "$name: $(grep -F -- "$want" "$tmp/ref.err")"
    else
        bad "$name (rc $rc)" "$(head -c 600 "$tmp/ref.err")"
    fi
}
refused "--tp 3 on 4 kv heads" "does not divide num_attention_heads (4), num_key_value_heads (4)" \
    timeout 30 "$bin" generate --model "$l31" --tokenizer none --prompt-ids 1,2 --device cpu --tp 3
refused "--tp 4 on 2 kv heads" "does not divide num_key_value_heads (2)" \
    timeout 30 "$bin" generate --model "$gqa" --tokenizer none --prompt-ids 1,2 --device cpu --tp 4
refused "--tp 0" "--tp: '0' is not an integer in [1, 64]" \
    timeout 30 "$bin" generate --model "$gqa" --tokenizer none --prompt-ids 1,2 --tp 0
refused "--tp x (bench)" "--tp: 'x' is not an integer in [1, 64]" \
    timeout 30 "$bin" bench --model "$gqa" --tp x
refused "--tp 65 (serve)" "--tp: '65' is too large (at most 64)" \
    timeout 30 "$bin" serve --model "$gqa" --tp 65

if timeout 120 "$bin" bench --model "$gqa" --device cpu --threads 1 --tp 2 --batch 1,2 \
    --prompt-len 8 --new-tokens 4 --prefill none --runs 1 --warmup 0 --json "$tmp/b.json" \
    >"$tmp/bench.out" 2>&1 && grep -q '"tp": 2' "$tmp/b.json"; then
    ok "bench --tp 2: $(grep -c '^| [0-9]' "$tmp/bench.out") decode rows, \"tp\": 2 in the JSON"
else
    bad "bench --tp 2" "$(tail -c 600 "$tmp/bench.out")"
fi

# serve: the same completions with and without --tp 2
complete() { # complete URL BODY: the token_ids of the reply
    curl -s -m 20 "$1/v1/completions" -H 'content-type: application/json' -d "$2" |
        sed -n 's/.*"token_ids":\[\([0-9,]*\)\].*/\1/p'
}
body1='{"prompt":[1,5,9,33,7,100],"max_tokens":12,"temperature":0,"ignore_eos":true}'
body2='{"prompt":[1,5,9,33],"max_tokens":12,"temperature":0.8,"seed":3,"presence_penalty":0.5,"min_p":0.05,"ignore_eos":true}'
pfx=$(seq -s, 11 50)
body3="{\"prompt\":[$pfx,1,2,3],\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true}"
body4="{\"prompt\":[$pfx,7,8],\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true}"
# n = 3 sampled choices: without --tp choices 1 and 2 fork from choice 0 (ms_engine_fork), with
# --tp 2 the engine refuses forks and the server adds them as requests: the same ids either way
body5="{\"prompt\":[$pfx,4],\"max_tokens\":10,\"temperature\":0.9,\"seed\":5,\"n\":3,\"ignore_eos\":true}"
complete_all() { # complete_all URL BODY: every choice's token_ids, ';'-separated
    curl -s -m 20 "$1/v1/completions" -H 'content-type: application/json' -d "$2" |
        grep -o '"token_ids":\[[0-9,]*\]' | sed 's/.*\[//; s/\]//' | paste -sd';'
}
declare -A got
for tp in 1 2; do
    "$bin" serve --model "$gqa" --tokenizer none --device cpu --threads 1 --tp "$tp" --port 0 \
        2>"$tmp/serve$tp.err" &
    pid=$!
    pids+=("$pid")
    url=
    for _ in $(seq 300); do
        url=$(sed -n 's/^listening on //p' "$tmp/serve$tp.err")
        [ -n "$url" ] && break
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if [ -z "$url" ]; then
        bad "serve --tp $tp starts" "$(head -c 600 "$tmp/serve$tp.err")"
        continue
    fi
    got[$tp.1]=$(complete "$url" "$body1")
    got[$tp.2]=$(complete "$url" "$body2")
    got[$tp.3]=$(complete "$url" "$body3") # a 40-id prefix: its pages are cached ...
    got[$tp.4]=$(complete "$url" "$body4") # ... and hit by the next request
    got[$tp.hits]=$(curl -s -m 10 "$url/metrics" | awk '$1 == "mstar_prefix_cache_hit_tokens_total" { print $2 }')
    got[$tp.5]=$(complete_all "$url" "$body5") # after the count: forks take no cache hits
    kill -TERM "$pid"
    rc=0
    wait "$pid" || rc=$?
    if [ "$rc" -eq 0 ]; then ok "serve --tp $tp exits 0 on SIGTERM"; else bad "serve --tp $tp exit $rc" "$(tail -c 400 "$tmp/serve$tp.err")"; fi
done
for k in 1 2 3 4 5; do
    if [ -n "${got[1.$k]:-}" ] && [ "${got[1.$k]}" = "${got[2.$k]:-}" ]; then
        ok "serve --tp 2 = serve (request $k): ${got[1.$k]}"
    else
        bad "serve --tp 2 (request $k)" "tp 1: ${got[1.$k]:-}" "tp 2: ${got[2.$k]:-}"
    fi
done

if [ -n "${got[2.hits]:-}" ] && [ "${got[2.hits]}" != 0 ] && [ "${got[2.hits]}" = "${got[1.hits]:-}" ]; then
    ok "serve --tp 2: prefix cache hits ${got[2.hits]} tokens, as without --tp"
else
    bad "serve --tp 2 prefix cache hits" "tp 1: ${got[1.hits]:-}" "tp 2: ${got[2.hits]:-}"
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
