#!/usr/bin/env bash
# chat.sh - the `chat` verb and `generate --chat` of `$MS_BUILD/llama/llama` on a tiny random
# checkpoint with Llama 3.1's real tokenizer.json + tokenizer_config.json (its chat template) from
# ../shared/fixtures/tokenizers, as tests/serve.sh builds it. The oracle is the plumbing, not the
# rendering (test_chat_template's jinja2 goldens prove that): a turn's prompt ids must be those of
# the text the template renders (a literal, re-checked with Python jinja2 when it imports), its
# reply the greedy continuation `generate` gives for that text; the template's eos ends a reply
# (not printed); the history of an interactive chat is rendered whole each turn; Ctrl-C stops a
# reply and the chat goes on, end of input leaves with 0; every bad input is one line on stderr.
# With scripts/fetch-model.sh (the SmolLM2 GGUF) the demo question gets the reference answer.
set -uo pipefail
export CUDA_VISIBLE_DEVICES=
build=${MS_BUILD:-build}
bin="$build/llama/llama"
fx=${MS_FIXTURES:-../shared/fixtures}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0
detail=
ok() { passed=$((passed + 1)); echo "ok   $1"; }
bad() { failed=$((failed + 1)); echo "FAIL $1"; [ -n "$detail" ] && printf '     %s\n' "$detail"; }
check() {
    local name=$1
    shift
    if "$@"; then ok "$name"; else bad "$name"; fi
    detail=
}
# ids NAME: the ids of a "... tokens: 1 2 3" line of stderr file NAME (the first such line, or line $2)
ids() { grep 'tokens: ' "$1" | sed -n "${2:-1}p" | sed 's/.*tokens: //'; }
one_line() { [ "$(wc -l <"$1")" -eq 1 ] && grep -q -- "$2" "$1" && ! grep -q 'Sanitizer\|runtime error' "$1"; }

"$build/mstar-mkckpt" --preset tiny --vocab 128256 --seed 7 --out "$tmp/l3" >/dev/null || bad "mstar-mkckpt writes the checkpoint"
mk_dir() { # mk_dir DIR CKPT CONFIG.json: a checkpoint folder with Llama 3.1's tokenizer and CONFIG
    mkdir -p "$1"
    for f in config.json generation_config.json model.safetensors; do ln -s "$2/$f" "$1/$f"; done
    ln -s "$(realpath "$fx/tokenizers/llama3_1")/tokenizer.json" "$1/tokenizer.json"
    ln -s "$(realpath "$3")" "$1/tokenizer_config.json"
}
mk_dir "$tmp/m" "$tmp/l3" "$fx/tokenizers/llama3_1/tokenizer_config.json"

# ---- one turn: prompt ids, reply ----
rendered=$'<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n'
render() { # render CONFIG MESSAGES_JSON: Python jinja2's rendering (as transformers'), "|"-terminated
    "${PYTHON:-python3}" -c '
import json, sys, jinja2
cfg = json.load(open(sys.argv[1]))
env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
def rx(m): raise jinja2.exceptions.TemplateError(m)
env.globals["raise_exception"] = rx
t = env.from_string(cfg["chat_template"])
sys.stdout.write(t.render(messages=json.loads(sys.argv[2]), add_generation_prompt=True,
                          bos_token=cfg["bos_token"], eos_token=cfg["eos_token"]) + "|")' "$@"
}
have_jinja=0
"${PYTHON:-python3}" -c 'import jinja2' 2>/dev/null && have_jinja=1
if [ $have_jinja = 1 ]; then
    jr=$(render "$fx/tokenizers/llama3_1/tokenizer_config.json" '[{"role": "user", "content": "Hi there"}]')
    check "jinja2 renders the expected one-turn prompt" [ "${jr%|}" = "$rendered" ]
fi
"$bin" generate --chat "Hi there" --model "$tmp/m" --temperature 0 --max-new-tokens 8 --verbose-prompt \
    >"$tmp/c1.out" 2>"$tmp/c1.err"
rc=$?
# (generate --prompt adds <|begin_of_text|> itself, the tokenizer's post-processor; chat encodes the
# rendered text without adding specials, as apply_chat_template does)
"$bin" generate --prompt "${rendered#<|begin_of_text|>}" --model "$tmp/m" --temperature 0 --max-new-tokens 8 --ignore-eos \
    --no-display-prompt --verbose-prompt >"$tmp/g1.out" 2>"$tmp/g1.err"
detail="rc $rc chat $(ids "$tmp/c1.err") generate $(ids "$tmp/g1.err")"
check "generate --chat: the prompt is the rendered text's 12 ids" \
    [ $rc = 0 -a "$(ids "$tmp/c1.err")" = "$(ids "$tmp/g1.err")" -a "$(ids "$tmp/c1.err" | wc -w)" = 12 ]
detail="chat $(od -c "$tmp/c1.out" | head -3) generate $(od -c "$tmp/g1.out" | head -3)"
check "generate --chat: the reply is generate's greedy text for it, streamed, one newline" cmp -s "$tmp/c1.out" "$tmp/g1.out"
check "generate --chat: a statistics line on stderr" grep -q 'chat: 12 prompt tokens, 8 new tokens' "$tmp/c1.err"
"$bin" chat --chat "Hi there" --model "$tmp/m" --temperature 0 --max-new-tokens 8 >"$tmp/c1b.out" 2>/dev/null
check "chat --chat: the same one turn" cmp -s "$tmp/c1.out" "$tmp/c1b.out"

# ---- --system ----
"$bin" generate --chat "Hi there" --system "Be brief." --model "$tmp/m" --temperature 0 --max-new-tokens 2 \
    --verbose-prompt >/dev/null 2>"$tmp/s.err"
if [ $have_jinja = 1 ]; then
    sr=$(render "$fx/tokenizers/llama3_1/tokenizer_config.json" '[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]')
    sr=${sr%|}
    "$bin" generate --prompt "${sr#<|begin_of_text|>}" --model "$tmp/m" --max-new-tokens 1 --verbose-prompt >/dev/null 2>"$tmp/s2.err"
    detail="chat $(ids "$tmp/s.err") want $(ids "$tmp/s2.err")"
    check "--system: the prompt renders the system message first (jinja2)" [ "$(ids "$tmp/s.err")" = "$(ids "$tmp/s2.err")" ]
else
    check "--system: the prompt holds the system message" [ "$(ids "$tmp/s.err" | wc -w)" -gt 12 ]
fi

# ---- the template's eos ends the reply ----
# the random model never picks <|eot_id|>; a config naming as eos the token it picks second for
# "Hi there" (.FindControl, after one token of spaces and a tab; tests/serve.sh uses the same)
jq '. + {eos_token: {content: ".FindControl", special: false}}' "$fx/tokenizers/llama3_1/tokenizer_config.json" >"$tmp/eos_cfg.json"
mk_dir "$tmp/e" "$tmp/l3" "$tmp/eos_cfg.json"
"$bin" generate --chat "Hi there" --model "$tmp/e" --temperature 0 --max-new-tokens 8 >"$tmp/e.out" 2>"$tmp/e.err"
rc=$?
detail="rc $rc $(od -c "$tmp/e.out" | head -3) $(cat "$tmp/e.err")"
check "eos: the reply stops at the template's eos token, which is not printed" \
    [ $rc = 0 -a "$(cat "$tmp/e.out")" = $'                \t' ]
check "eos: it is counted as the reply's 2nd and last token" grep -q 'chat: 12 prompt tokens, 2 new tokens' "$tmp/e.err"

# ---- interactive: the history is rendered whole each turn ----
printf 'Hi there\n\nHow are you?\n' | "$bin" chat --model "$tmp/m" --temperature 0 --max-new-tokens 4 --verbose-prompt \
    >"$tmp/i.out" 2>"$tmp/i.err"
rc=$?
detail="rc $rc $(cat "$tmp/i.err")"
check "chat: two messages (an empty line skipped), two replies, exit 0 at end of input" \
    [ $rc = 0 -a "$(grep -c 'prompt: ' "$tmp/i.err")" = 2 -a "$(wc -l <"$tmp/i.out")" = 2 ]
"$bin" generate --chat "Hi there" --model "$tmp/m" --temperature 0 --max-new-tokens 4 >"$tmp/i1.out" 2>/dev/null
check "chat: the first reply equals the one-turn reply" [ "$(head -1 "$tmp/i.out")" = "$(cat "$tmp/i1.out")" ]
p1=$(ids "$tmp/i.err" 1)
p2=$(ids "$tmp/i.err" 2)
detail="turn 1: $p1 / turn 2: $p2"
check "chat: turn 2's prompt starts with turn 1's (the history comes first)" [ "${p2#"$p1"}" != "$p2" ]
if [ $have_jinja = 1 ]; then
    reply1=$(head -1 "$tmp/i.out")
    msgs=$(jq -cn --arg r "$reply1" '[{role: "user", content: "Hi there"}, {role: "assistant", content: $r}, {role: "user", content: "How are you?"}]')
    r2=$(render "$fx/tokenizers/llama3_1/tokenizer_config.json" "$msgs")
    r2=${r2%|}
    "$bin" generate --prompt "${r2#<|begin_of_text|>}" --model "$tmp/m" --max-new-tokens 1 --verbose-prompt >/dev/null 2>"$tmp/i2.err"
    detail="chat $p2 want $(ids "$tmp/i2.err")"
    check "chat: turn 2's prompt is the jinja2 rendering of user, assistant (reply 1), user" [ "$p2" = "$(ids "$tmp/i2.err")" ]
fi

# ---- Ctrl-C stops a reply, the chat goes on; end of input leaves ----
"$build/mstar-mkckpt" --preset tiny --vocab 128256 --seed 7 --max-pos 8192 --eos 128001 --out "$tmp/long" >/dev/null
mk_dir "$tmp/L" "$tmp/long" "$fx/tokenizers/llama3_1/tokenizer_config.json"
mkfifo "$tmp/in"
"$bin" chat --model "$tmp/L" --temperature 0 <"$tmp/in" >"$tmp/int.out" 2>"$tmp/int.err" &
pid=$!
exec 3>"$tmp/in"
# The random model's greedy reply may itself hold newline tokens, and how much of it is printed
# before the signal lands depends on the machine's speed, so the replies are told apart by the
# output's size at each step, not by its line count: reply k grew the output by more than 8 bytes,
# and after its stop the output ends with the one newline the chat adds.
sizes=()
interrupt_reply() { # the reply to $1 is under way (output grows), then SIGINT
    local before
    before=$(wc -c <"$tmp/int.out")
    echo "$1" >&3
    for _ in $(seq 600); do [ "$(wc -c <"$tmp/int.out")" -gt $((before + 8)) ] && break; sleep 0.05; done
    kill -INT $pid
    for _ in $(seq 600); do [ "$(grep -c 'reply stopped' "$tmp/int.err")" -ge "$2" ] && break; sleep 0.05; done
    sleep 0.2 # the newline that ends the stopped reply
    sizes+=("$before" "$(wc -c <"$tmp/int.out")" "$(tail -c 1 "$tmp/int.out" | od -An -c | tr -d ' ')")
}
interrupt_reply "Tell me a long story" 1
interrupt_reply "Another one" 2
exec 3>&-
wait $pid
rc=$?
detail="rc $rc $(head -c 300 "$tmp/int.err") sizes (before, after, last byte) ${sizes[*]}"
check "Ctrl-C: each reply stops (one line saying so), the next message is answered, end of input exits 0" \
    [ $rc = 0 -a "$(grep -c 'reply stopped (Ctrl-C)' "$tmp/int.err")" = 2 -a "${sizes[1]}" -gt $((sizes[0] + 8)) \
    -a "${sizes[2]}" = '\n' -a "${sizes[4]}" -gt $((sizes[3] + 8)) -a "${sizes[5]}" = '\n' \
    -a "$(wc -c <"$tmp/int.out")" = "${sizes[4]}" ]

# ---- bad input: one line each ----
"$bin" generate --chat "Hi" --model "$fx/hf/llama_gqa" >/dev/null 2>"$tmp/b1"
rc=$?
detail="rc $rc $(cat "$tmp/b1")"
check "no tokenizer: exit 1, one line" [ $rc = 1 ] && check "  ... saying chat needs one" one_line "$tmp/b1" "chat needs a tokenizer with a chat template"
jq 'del(.chat_template)' "$fx/tokenizers/llama3_1/tokenizer_config.json" >"$tmp/nt_cfg.json"
mk_dir "$tmp/nt" "$tmp/l3" "$tmp/nt_cfg.json"
"$bin" generate --chat "Hi" --model "$tmp/nt" >/dev/null 2>"$tmp/b2"
rc=$?
detail="rc $rc $(cat "$tmp/b2")"
check "no chat template: exit 1, one line naming the tokenizer" [ $rc = 1 ] && check "  ... one line" one_line "$tmp/b2" "has no chat template"
jq '. + {chat_template: "{% for m in messages %}{{ m.content + 1 }}{% endfor %}"}' "$fx/tokenizers/llama3_1/tokenizer_config.json" >"$tmp/te_cfg.json"
mk_dir "$tmp/te" "$tmp/l3" "$tmp/te_cfg.json"
"$bin" generate --chat "Hi" --model "$tmp/te" >/dev/null 2>"$tmp/b3"
rc=$?
detail="rc $rc $(cat "$tmp/b3")"
check "a template failing at render: exit 1, one line" [ $rc = 1 ] && check "  ... one line" one_line "$tmp/b3" "chat_template:1:"
"$bin" generate --chat "Hi" --prompt "x" --model "$tmp/m" >/dev/null 2>"$tmp/b4"
rc=$?
check "generate --chat with --prompt: usage error 2 naming the flag" [ $rc = 2 ] && grep -q "unknown flag '--prompt' with --chat" "$tmp/b4" && ok "  ... named"
"$bin" generate --model "$tmp/m" --prompt --chat --max-new-tokens 2 >/dev/null 2>"$tmp/b4b"
rc=$?
detail="rc $rc $(cat "$tmp/b4b")"
check "generate --prompt --chat: '--chat' is the prompt's text here, not the chat flag" [ $rc = 0 ] && check "  ... a generate run" grep -q "1 prompt(s), 3 prompt tokens" "$tmp/b4b"
"$bin" chat --model "$tmp/m" --max-new-tokens 0 </dev/null >/dev/null 2>"$tmp/b5"
rc=$?
detail="rc $rc $(cat "$tmp/b5")"
check "--max-new-tokens 0: exit 1, one line" [ $rc = 1 ] && check "  ... one line" one_line "$tmp/b5" "max-new-tokens"
"$bin" chat --model "$tmp/m" --seed -1 </dev/null >/dev/null 2>"$tmp/b6"
check "--seed -1: exit 1, one line" one_line "$tmp/b6" "seed"
long=$(head -c 3000 /dev/zero | tr '\0' 'a' | sed 's/aaaa/word /g')
printf '%s\n\xff\xfe bad\nHi there\n' "$long" | "$bin" chat --model "$tmp/m" --temperature 0 --max-new-tokens 4 >"$tmp/b7.out" 2>"$tmp/b7.err"
rc=$?
detail="rc $rc $(cat "$tmp/b7.err")"
check "a message too long for the context, one not UTF-8: one line each, the chat goes on" \
    [ $rc = 0 -a "$(wc -l <"$tmp/b7.err")" = 2 -a "$(wc -l <"$tmp/b7.out")" = 1 ] &&
    check "  ... naming the problems" grep -q "no room for a reply" "$tmp/b7.err" && check "  ... UTF-8" grep -q "not valid UTF-8" "$tmp/b7.err"
check "  ... and the reply after them is the first reply of a fresh chat" [ "$(cat "$tmp/b7.out")" = "$(cat "$tmp/i1.out")" ]

# ---- the demo model (SmolLM2 GGUF) when scripts/fetch-model.sh can fetch it ----
if [ -x scripts/fetch-model.sh ]; then
    gguf=$(scripts/fetch-model.sh smollm2)
    frc=$?
    if [ $frc = 0 ]; then
        want=$(jq -r '.cases[0].greedy_text' "$fx/gguf/smollm2/reference.json")
        want=${want%%<|im_end|>*}  # the reference runs 48 steps past EOS; the turn ends at <|im_end|>
        "$bin" generate --chat "What is the capital of France?" --model "$gguf" --temperature 0 --max-new-tokens 48 \
            >"$tmp/sm.out" 2>"$tmp/sm.err"
        rc=$?
        detail="rc $rc got '$(head -c 300 "$tmp/sm.out")' want '$want' $(tail -2 "$tmp/sm.err")"
        check "smollm2: the demo question gets the reference answer" [ $rc = 0 -a "$(cat "$tmp/sm.out")" = "$want" ]
    else
        echo "skip smollm2: scripts/fetch-model.sh smollm2 exit $frc"
    fi
else
    echo "skip smollm2: no scripts/fetch-model.sh"
fi

echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
