#!/usr/bin/env bash
# talker_cli.sh - the `talker codes` verb end to end on the CPU: models/talker.mstar compiled by
# mstarc into its serving binary, ../shared/fixtures/hf/talker_codepred's weights, the prompt
# frames of its reference.safetensors (prompt_codes) as a text file: the printed frames must be
# reference.json's codes [12, 4]; two prompts in one batch (the second shifted) give the first's
# codes unchanged; --frames N prints N frames; bad input (missing, malformed, empty files, a
# code outside the vocabulary, frames of the wrong width, past the context, bad flags) is one
# line each, exit 1 or 2, no crash.
set -uo pipefail
export CUDA_VISIBLE_DEVICES=
build=${MS_BUILD:-build}
fx=${MS_FIXTURES:-../shared/fixtures}
tc=$fx/hf/talker_codepred
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok   $1"; }
bad() { failed=$((failed + 1)); echo "FAIL $1"; [ -n "${2:-}" ] && printf '     %s\n' "$2"; }

if [ ! -f "$tc/model.safetensors" ]; then
    echo "skip talker_cli.sh: $tc is not there"
    echo "0 passed, 0 failed"
    exit 0
fi
"$build/mstarc" build models/talker.mstar -o "$tmp/tk" >"$tmp/mstarc.log" 2>&1 ||
    { cat "$tmp/mstarc.log"; echo "0 passed, 1 failed"; exit 1; }
bin="$tmp/tk/talker"
# the prompt frames (reference.safetensors prompt_codes [5, 4], int) and the reference codes
python3 - "$tc" "$tmp" <<'PY'
import json, struct, sys
fx, tmp = sys.argv[1], sys.argv[2]
with open(fx + "/reference.safetensors", "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))
    m = h["prompt_codes"]
    f.seek(8 + n + m["data_offsets"][0])
    raw = f.read(m["data_offsets"][1] - m["data_offsets"][0])
fmt = {"I32": "i", "I64": "q"}[m["dtype"]]
v = struct.unpack("<%d%s" % (len(raw) // struct.calcsize(fmt), fmt), raw)
rows, cols = m["shape"]
with open(tmp + "/prompt.txt", "w") as o:
    o.write("# prompt_codes of hf/talker_codepred\n\n")
    for r in range(rows):
        o.write(" ".join(str(x) for x in v[r * cols:(r + 1) * cols]) + "\n")
with open(tmp + "/shifted.txt", "w") as o:
    for r in range(rows):
        o.write(" ".join(str((x + 17) % 96) for x in v[r * cols:(r + 1) * cols]) + "\n")
codes = json.load(open(fx + "/reference.json"))["codes"]
with open(tmp + "/want.txt", "w") as o:
    for c in codes:
        o.write(" ".join(str(x) for x in c) + "\n")
PY
[ -s "$tmp/prompt.txt" ] || { echo "FAIL reading the reference"; echo "0 passed, 1 failed"; exit 1; }

run() { "$bin" talker "$@" >"$tmp/out" 2>"$tmp/err"; echo $?; }

rc=$(run codes --model "$tc" --device cpu --prompt-codes "$tmp/prompt.txt")
if [ "$rc" = 0 ] && cmp -s "$tmp/out" "$tmp/want.txt"; then ok "the reference codes [12, 4]"
else bad "the reference codes: exit $rc" "$(diff "$tmp/out" "$tmp/want.txt" | head -5; head -2 "$tmp/err")"; fi

rc=$(run codes --model "$tc" --device cpu --prompt-codes "$tmp/prompt.txt" --prompt-codes "$tmp/shifted.txt")
if [ "$rc" = 0 ] && [ "$(head -12 "$tmp/out")" = "$(cat "$tmp/want.txt")" ] &&
    [ "$(sed -n 13p "$tmp/out")" = "" ] && [ "$(sed -n '14,$p' "$tmp/out" | wc -l)" = 12 ] &&
    [ "$(sed -n '14,$p' "$tmp/out")" != "$(cat "$tmp/want.txt")" ]; then
    ok "two prompts in one batch: the first's codes unchanged, the second's its own"
else bad "two prompts: exit $rc" "$(head -3 "$tmp/err")"; fi

rc=$(run codes --model "$tc" --device cpu --prompt-codes "$tmp/prompt.txt" --frames 3)
if [ "$rc" = 0 ] && [ "$(cat "$tmp/out")" = "$(head -3 "$tmp/want.txt")" ]; then ok "--frames 3"
else bad "--frames 3: exit $rc" "$(head -2 "$tmp/err")"; fi

# expect NAME STATUS REGEX ARGS...: exit STATUS, stderr's last line matches REGEX, no stdout
expect() {
    local name=$1 want=$2 regex=$3
    shift 3
    local rc
    rc=$(run "$@")
    if [ "$rc" = "$want" ] && tail -1 "$tmp/err" | grep -Eq -e "$regex" && [ ! -s "$tmp/out" ]; then
        ok "$name"
    else
        bad "$name: exit $rc" "$(tail -2 "$tmp/err")"
    fi
}
printf '1 2 3 4\n5 x 7 8\n' >"$tmp/word.txt"
printf '1 2 3 4\n5 6 7\n' >"$tmp/short.txt"
printf '1 2 3\n' >"$tmp/three.txt"
printf '1 2 3 4\n5 6 96 8\n' >"$tmp/vocab.txt"
printf '# nothing\n\n' >"$tmp/empty.txt"
m=(--model "$tc" --device cpu)
expect "a missing file" 1 "nope.txt: No such file" codes "${m[@]}" --prompt-codes "$tmp/nope.txt"
expect "a word among the codes" 1 "word.txt:2: 'x' is not a code" codes "${m[@]}" --prompt-codes "$tmp/word.txt"
expect "a short frame" 1 "short.txt:2: 3 codes, the first frame has 4" codes "${m[@]}" --prompt-codes "$tmp/short.txt"
expect "frames of the wrong width" 1 "three.txt: frames of 3 codes, the model's have 4" codes "${m[@]}" --prompt-codes "$tmp/three.txt"
expect "a code outside the vocabulary" 1 "vocab.txt: frame 2: code 96 is outside the vocabulary \[0, 96\)" codes "${m[@]}" --prompt-codes "$tmp/vocab.txt"
expect "an empty file" 1 "empty.txt: no frames" codes "${m[@]}" --prompt-codes "$tmp/empty.txt"
expect "past the context" 1 "pass the talker's context \(256 positions\)" codes "${m[@]}" --prompt-codes "$tmp/prompt.txt" --frames 300
expect "no subcommand" 2 "talker takes the subcommand 'codes'"
expect "another subcommand" 2 "talker takes the subcommand 'codes'" speak "${m[@]}"
expect "no prompt" 2 "needs --model and at least one --prompt-codes" codes "${m[@]}"
expect "--frames 0" 2 "frames" codes "${m[@]}" --prompt-codes "$tmp/prompt.txt" --frames 0
expect "an unknown flag" 2 "unknown flag '--speed'" codes "${m[@]}" --speed 2
expect "a flag without its value" 2 "--prompt-codes needs a value" codes "${m[@]}" --prompt-codes
expect "a checkpoint that is not there" 1 "." codes --model "$tmp/none" --device cpu --prompt-codes "$tmp/prompt.txt"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
