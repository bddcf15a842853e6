#!/usr/bin/env bash
# gpu_generate.sh - the eager GPU path of the generated serving binary, end to end (device machine
# only; `make gpu-test` runs it). On hf/llama_gqa all reference prompts run as ONE batch
# (--prompts-file, greedy, --max-new-tokens 16) with --device cuda and --device cpu --dtype bf16:
# the first 16 ids of every prompt must be equal, or on at most one prompt those of --device cpu
# in float32 (the near tie below). On the llama2.c aidreams260K golden (greedy, 128 steps) the
# CUDA text must equal the golden text; the script reports how many leading characters match and
# the tokens/s lines of both devices. On hf/llama_cfg the guided pair (--negative-prompt-ids,
# --guidance-scale 3) must give on cuda the first 16 ids of the CPU bf16 run.
#
# Environment: MS_BUILD (build folder, default build), BIN (the binary; default $MS_BUILD/llama/llama,
# built with $MS_BUILD/mstarc when missing), MS_FIXTURES (default ../shared/fixtures), PREP (a
# folder holding gqa_prompts.txt, l2c_prompt.txt, l2c_want.txt, l2c_steps.txt; default: extracted
# from the fixtures with python3).
set -uo pipefail
build=${MS_BUILD:-build}
bin=${BIN:-$build/llama/llama}
fx=${MS_FIXTURES:-../shared/fixtures}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok   $1"; }
bad() { failed=$((failed + 1)); echo "FAIL $1"; shift; printf '     %s\n' "$@"; }

if [ ! -x "$bin" ]; then
    "$build/mstarc" build models/llama.mstar -o "$build/llama" >/dev/null || exit 1
fi
prep=${PREP:-}
if [ -z "$prep" ]; then
    prep=$tmp/prep
    mkdir -p "$prep"
    python3 - "$fx" "$prep" <<'PY' || exit 1
import json, struct, sys
fx, out = sys.argv[1], sys.argv[2]
with open(fx + "/hf/llama_gqa/reference.safetensors", "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))
    base = 8 + n
    lines = []
    for p in range(4):
        t = h["p%d.input_ids" % p]
        a, b = t["data_offsets"]
        f.seek(base + a)
        ids = struct.unpack("<%di" % ((b - a) // 4), f.read(b - a))
        lines.append(",".join(str(i) for i in ids))
open(out + "/gqa_prompts.txt", "w").write("\n".join(lines) + "\n")
g = json.load(open(fx + "/llama2c/aidreams260K.golden.json"))["cases"][0]
open(out + "/l2c_prompt.txt", "w").write(g["prompt"])
open(out + "/l2c_want.txt", "w").write(g["text"])
open(out + "/l2c_steps.txt", "w").write(str(g["steps"]))
PY
fi

# ---- hf/llama_gqa: one batch of every prompt, cuda against cpu ----
# the acceptance comparison runs the CPU over the same bf16 weights and KV (--dtype bf16): with
# float32 weights prompt 2 parts at step 10 on a near tie that bf16 rounding alone flips (see
# test_llama_cuda_fixture.c); the float32 CPU run is reported too.
run_gqa() { # NAME ARGS...
    local name=$1
    shift
    "$bin" generate --model "$fx/hf/llama_gqa" --prompts-file "$prep/gqa_prompts.txt" \
        --temperature 0 --max-new-tokens 16 --ignore-eos "$@" >"$tmp/gqa.$name" 2>"$tmp/gqa.$name.err"
    echo "rc $? ($name): $(tail -n 1 "$tmp/gqa.$name.err")"
}
# first_diff A B: per prompt line, the index of the first differing id (or "=")
first_diff() {
    paste -d'|' "$1" "$2" | awk -F'|' '{ n = split($1, a, " "); m = split($2, b, " "); d = "=";
        for (i = 2; i <= n; i++) if (a[i] != b[i]) { d = i - 2; break }
        if (d == "=" && n != m) d = "len"; printf "%s%s", (NR > 1 ? " " : ""), d }'
}
run_gqa cuda --device cuda
run_gqa cpu_bf16 --device cpu --dtype bf16
run_gqa cpu_f32 --device cpu
n_prompts=$(grep -c . "$prep/gqa_prompts.txt")
echo "first differing id per prompt, cuda vs cpu bf16: $(first_diff "$tmp/gqa.cuda" "$tmp/gqa.cpu_bf16")"
echo "first differing id per prompt, cuda vs cpu f32:  $(first_diff "$tmp/gqa.cuda" "$tmp/gqa.cpu_f32")"
# each prompt's 16 ids equal those of a CPU run: the bf16 one, or where the GPU's own rounding
# takes the other side of prompt 2's near tie at step 10 (the decode GEMVs at up to 4 rows fold
# the RMSNorm in and round x w to bf16 before the rsqrt, not x rsqrt(..) w), the float32 one; a
# real fault parts from both
n_match=$(paste -d'|' "$tmp/gqa.cuda" "$tmp/gqa.cpu_bf16" "$tmp/gqa.cpu_f32" |
    awk -F'|' '$1 == $2 || $1 == $3 { n++ } END { print n + 0 }')
if [ "$(grep -c '^\[' "$tmp/gqa.cuda")" -eq "$n_prompts" ] && [ "$n_match" -eq "$n_prompts" ] &&
    [ "$(first_diff "$tmp/gqa.cuda" "$tmp/gqa.cpu_bf16" | tr ' ' '\n' | grep -vc '^=$')" -le 1 ]; then
    ok "llama_gqa: $n_prompts prompts in one batch, 16 greedy ids each, cuda == cpu (bf16, or f32 on at most one prompt)"
else
    bad "llama_gqa cuda vs cpu bf16" "cuda: $(head -c 400 "$tmp/gqa.cuda")" "cpu:  $(head -c 400 "$tmp/gqa.cpu_bf16")" \
        "$(head -c 400 "$tmp/gqa.cuda.err")"
fi
if grep -q ' on cuda,' "$tmp/gqa.cuda.err"; then ok "llama_gqa: the run reports device cuda"; else bad "no 'on cuda' in the tokens/s line"; fi

# ---- llama2.c aidreams260K golden on cuda ----
steps=$(cat "$prep/l2c_steps.txt")
for d in cuda cpu; do
    "$bin" generate --model "$fx/llama2c/aidreams260K.bin" --tokenizer "$fx/llama2c/tok512.bin" \
        --prompt "$(cat "$prep/l2c_prompt.txt")" --temperature 0 --steps "$steps" --device "$d" \
        >"$tmp/l2c.$d" 2>"$tmp/l2c.$d.err"
    echo "rc $? ($d): $(tail -n 1 "$tmp/l2c.$d.err")"
done
printf '%s\n' "$(cat "$prep/l2c_want.txt")" >"$tmp/want" # the binary ends its text with a newline
same=$(cmp "$tmp/l2c.cuda" "$tmp/want" 2>/dev/null | sed -n 's/.*byte \([0-9]*\).*/\1/p')
total=$(wc -c <"$tmp/want")
if cmp -s "$tmp/l2c.cuda" "$tmp/want"; then
    ok "llama2c golden on cuda: text exact ($total bytes)"
else
    bad "llama2c golden on cuda: first difference at byte ${same:-?} of $total" \
        "got:  $(head -c 300 "$tmp/l2c.cuda")" "want: $(head -c 300 "$tmp/want")" "$(head -c 300 "$tmp/l2c.cuda.err")"
fi
if cmp -s "$tmp/l2c.cpu" "$tmp/want"; then ok "llama2c golden on cpu: text exact"; else bad "llama2c golden on cpu"; fi

# ---- batched CFG on cuda: hf/llama_cfg, the guided pair as one request (host-side mixing over
# the copied logits); ids equal to the CPU over bf16 weights and KV, the reference's reported ----
if [ -d "$fx/hf/llama_cfg" ]; then
    python3 - "$fx/hf/llama_cfg/reference.safetensors" >"$tmp/cfg_ids" <<'PY'
import json, struct, sys, array
b = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n])
for k in ('cond_ids', 'uncond_ids', 'greedy_ids'):
    s, e = h[k]['data_offsets']
    print(','.join(str(x) for x in array.array('i', b[8 + n + s:8 + n + e])))
PY
    cond=$(sed -n 1p "$tmp/cfg_ids"); uncond=$(sed -n 2p "$tmp/cfg_ids"); want=$(sed -n 3p "$tmp/cfg_ids" | tr , ' ')
    for d in "cuda" "cpu --dtype bf16"; do
        # shellcheck disable=SC2086
        "$bin" generate --model "$fx/hf/llama_cfg" --prompt-ids "$cond" --negative-prompt-ids "$uncond" \
            --guidance-scale 3 --max-new-tokens 25 --temperature 0 --device $d >"$tmp/cfg.${d%% *}" 2>"$tmp/cfg.${d%% *}.err"
        echo "rc $? (cfg $d): $(tail -n 1 "$tmp/cfg.${d%% *}.err")"
    done
    [ "$(cat "$tmp/cfg.cuda")" = "$want" ] && echo "cfg cuda: the reference's 25 ids" || echo "cfg cuda: $(cat "$tmp/cfg.cuda") (reference $want)"
    if [ -s "$tmp/cfg.cuda" ] && [ "$(cut -d' ' -f1-16 "$tmp/cfg.cuda")" = "$(cut -d' ' -f1-16 "$tmp/cfg.cpu")" ]; then
        ok "llama_cfg guided on cuda: 16 first ids equal to cpu bf16"
    else
        bad "llama_cfg guided cuda vs cpu bf16" "cuda: $(cat "$tmp/cfg.cuda")" "cpu:  $(cat "$tmp/cfg.cpu")" "$(head -c 300 "$tmp/cfg.cuda.err")"
    fi
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
