#!/usr/bin/env bash
# pd_cli.sh - [pd] prefill/decode disaggregation through HTTP (docs/pd.md): a prefill server
# (`serve --role prefill`) and a decode server (`serve --role decode --prefill-url URL`) give the
# same completions as one `serve`, greedy and seeded-sampled, text and token-id prompts, n = 2,
# several requests at once; the decode server really asks its peer (the peer's prompt tokens
# grow; with the peer gone it answers 502 naming it); the peer refuses what a record does not
# carry; bad flags are refused in one line; every server exits 0 on SIGTERM with every KV page
# free and nothing from a sanitizer. Models: llama2.c aidreams260K with its tokenizer.
set -uo pipefail
export CUDA_VISIBLE_DEVICES=
build=${MS_BUILD:-build}
bin="$build/llama/llama"
fx=${MS_FIXTURES:-../shared/fixtures}
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
check() {
    local name=$1
    shift
    if "$@"; then ok "$name"; else bad "$name" "${detail:-}"; fi
    detail=
}
l2c="$fx/llama2c/aidreams260K.bin"
tok="$fx/llama2c/tok512.bin"

# start NAME ARGS...: a server in the background; sets url_NAME and pid_NAME
start() {
    local name=$1 url="" p
    shift
    "$bin" serve --model "$l2c" --tokenizer "$tok" --max-seqs 8 "$@" --port 0 2>"$tmp/$name.err" &
    p=$!
    pids+=("$p")
    for _ in $(seq 300); do
        url=$(sed -n 's/^listening on //p' "$tmp/$name.err")
        [ -n "$url" ] && break
        kill -0 "$p" 2>/dev/null || break
        sleep 0.1
    done
    eval "url_$name=\$url; pid_$name=\$p"
    if [ -z "$url" ]; then bad "$name: starts" "$(head -c 600 "$tmp/$name.err")"; return 1; fi
    ok "$name: starts ($url)"
}
stop() {
    local name=$1 p rc
    eval "p=\$pid_$name"
    kill -TERM "$p"
    for _ in $(seq 200); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$p" 2>/dev/null; then bad "$name: stops" "still running"; kill -KILL "$p"; return; fi
    wait "$p"
    rc=$?
    detail="exit $rc $(tail -c 600 "$tmp/$name.err")"
    clean() { [ "$1" -eq 0 ] && ! grep -qE 'Sanitizer|runtime error|leak' "$2"; }
    check "$name: SIGTERM exits 0, nothing from a sanitizer" clean $rc "$tmp/$name.err"
}
metric() { curl -s -m 10 "$1/metrics" | awk -v m="$2" '$1 == m { print $2 }'; }
# complete URL BODY OUT: the HTTP status
complete() {
    printf '%s' "$2" >"$3.body" # one body file per request: they may run at once
    curl -s -m 60 -o "$3" -w '%{http_code}' -H 'Content-Type: application/json' \
        --data-binary @"$3.body" "$1/v1/completions"
}

start one || exit 1
start pre --role prefill || exit 1
start dec --role decode --prefill-url "$url_pre" || exit 1
free_dec=$(metric "$url_dec" mstar_kv_pages_free)
free_pre=$(metric "$url_pre" mstar_kv_pages_free)

bodies=(
    '{"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0}'
    '{"prompt": "The little dog", "max_tokens": 30, "temperature": 0.8, "top_p": 0.9, "seed": 7, "ignore_eos": true}'
    '{"prompt": [1, 79, 64, 300, 12, 9, 44, 101, 7, 250, 3, 18, 77, 90, 41, 400], "max_tokens": 16, "temperature": 0.7, "seed": 11, "ignore_eos": true}'
    '{"prompt": "Lily and Tom went to the park", "max_tokens": 20, "n": 2, "temperature": 1.0, "seed": 3, "ignore_eos": true}'
)
pt0=$(metric "$url_pre" mstar_prompt_tokens_total)
for i in "${!bodies[@]}"; do
    s1=$(complete "$url_one" "${bodies[$i]}" "$tmp/one.$i")
    s2=$(complete "$url_dec" "${bodies[$i]}" "$tmp/dec.$i")
    a=$(jq -c '[.choices[] | [.text, .finish_reason]]' "$tmp/one.$i" 2>/dev/null)
    b=$(jq -c '[.choices[] | [.text, .finish_reason]]' "$tmp/dec.$i" 2>/dev/null)
    detail="one: $s1 $a | pd: $s2 $b $(head -c 300 "$tmp/dec.$i")"
    check "request $i: prefill + decode servers give one server's completion" \
        [ "$s1" = 200 -a "$s2" = 200 -a -n "$a" -a "$a" = "$b" ]
done
pt1=$(metric "$url_pre" mstar_prompt_tokens_total)
detail="prompt tokens $pt0 -> $pt1"
check "the prefill server computed the prompts" [ "${pt1%.*}" -gt "${pt0%.*}" ]

# 6 at once, mixed lengths, against one server's answers one by one
cpids=()
for i in 0 1 2 3 4 5; do
    body="{\"prompt\": \"Sam had a red ball $i times\", \"max_tokens\": $((8 + 3 * i)), \"temperature\": 0.9, \"seed\": $((100 + i)), \"ignore_eos\": true}"
    complete "$url_one" "$body" "$tmp/cone.$i" >/dev/null
    (complete "$url_dec" "$body" "$tmp/cdec.$i" >"$tmp/cdec.$i.st") &
    cpids+=($!)
done
wait "${cpids[@]}"
same=0
for i in 0 1 2 3 4 5; do
    [ "$(cat "$tmp/cdec.$i.st")" = 200 ] && [ "$(jq -c .choices[0].text "$tmp/cone.$i")" = "$(jq -c .choices[0].text "$tmp/cdec.$i")" ] && same=$((same + 1))
done
detail="$same of 6 equal"
check "6 concurrent requests through prefill + decode equal one server's" [ $same = 6 ]

st=$(complete "$url_dec" '{"prompt": "Hi", "max_tokens": 4, "logprobs": 2}' "$tmp/lp")
detail="$st $(head -c 300 "$tmp/lp")"
# has STATUS WANT FILE TEXT: the status is WANT and FILE holds TEXT
has() { [ "$1" = "$2" ] && grep -q -- "$4" "$3"; }
check "decode server: logprobs refused with 400 naming them" has "$st" 400 "$tmp/lp" "role decode"
printf '%s' '{"prompt": "Hi", "max_tokens": 4, "n": 2}' >"$tmp/body"
st=$(curl -s -m 30 -o "$tmp/pn" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary @"$tmp/body" "$url_pre/v1/pd/prefill")
detail="$st $(head -c 300 "$tmp/pn")"
check "prefill server: /v1/pd/prefill with n = 2 refused with 400" [ "$st" = 400 ]
st=$(curl -s -m 30 -o "$tmp/pd404" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary @"$tmp/body" "$url_dec/v1/pd/prefill")
check "decode server has no /v1/pd/prefill (404)" [ "$st" = 404 ]

sleep 0.3
detail="decode $(metric "$url_dec" mstar_kv_pages_free) of $free_dec, prefill $(metric "$url_pre" mstar_kv_pages_free) of $free_pre"
check "every KV page free on both servers" \
    [ "$(metric "$url_dec" mstar_kv_pages_free)" = "$free_dec" -a "$(metric "$url_pre" mstar_kv_pages_free)" = "$free_pre" ]

stop pre
st=$(complete "$url_dec" '{"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}' "$tmp/gone")
detail="$st $(head -c 300 "$tmp/gone")"
check "peer gone: 502 naming the prefill peer" has "$st" 502 "$tmp/gone" "prefill peer"
stop dec
stop one

# bad flags: exit non-zero, one line naming the flag
badflag() {
    local want=$1
    shift
    "$bin" serve --model "$l2c" --tokenizer "$tok" --port 0 "$@" >/dev/null 2>"$tmp/flag.err"
    local rc=$?
    detail="rc $rc: $(tail -n 2 "$tmp/flag.err")"
    one_line() { [ "$1" -ne 0 ] && [ "$(grep -c . "$2")" = 1 ] && grep -q -- "$3" "$2"; }
    check "refused: $*" one_line $rc "$tmp/flag.err" "$want"
}
badflag "not prefill or decode" --role both
badflag "needs --prefill-url" --role decode
badflag "give it with --role decode" --prefill-url http://127.0.0.1:9
badflag "give it with --role decode" --role prefill --prefill-url http://127.0.0.1:9
badflag "expected http://HOST:PORT" --role decode --prefill-url ftp://x:1
badflag "1..65535" --role decode --prefill-url http://127.0.0.1:99999
badflag "one rank only" --role prefill --tp 2

echo "$passed passed, $failed failed" # the form scripts/run-tests.sh counts (it read "pd_cli.sh: ..." as 1 test)
[ $failed -eq 0 ]
