#!/usr/bin/env bash
# seeds.sh OUTDIR TARGET... - write the seed inputs of the fuzz targets into OUTDIR/<target>/.
#
# Seeds are small valid examples: text files committed beside this script (tests/fuzz/<target>/),
# binary ones generated here with printf (safetensors files, llama2.c checkpoints and tokenizers),
# the DSL's models and golden cases, and, when the shared fixtures are present (MS_FIXTURES, else
# ../shared/fixtures), their small files: every hf/*/config.json (+ generation_config.json) and the
# llama2.c tokenizer tok512.bin. The large fixtures (weights, the real tokenizer.json files) are
# not used: inputs are capped far below their size. Multi-file inputs join their parts with a NUL
# byte, as the targets split them (tests/fuzz_util.h).
set -euo pipefail
out=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
fix=${MS_FIXTURES:-$root/../shared/fixtures}

# le32 N / le64 N: N as little-endian bytes
le32() { local n=$1 i; for i in 0 1 2 3; do printf "\\x$(printf %02x $(((n >> (8 * i)) & 255)))"; done; }
le64() { local n=$1 i; for i in 0 1 2 3 4 5 6 7; do printf "\\x$(printf %02x $(((n >> (8 * i)) & 255)))"; done; }
# safetensors HEADER_JSON DATA_BYTES: a safetensors file with that header and DATA_BYTES bytes of 0x3f
safetensors() { le64 ${#1}; printf '%s' "$1"; head -c "$2" /dev/zero | tr '\0' '\077'; }
# llama2c_ckpt DIM HIDDEN LAYERS HEADS KV_HEADS VOCAB SEQ: header + zero weights of the right size
llama2c_ckpt() {
    local dim=$1 hid=$2 nl=$3 nh=$4 nkv=$5 voc=$6 seq=$7
    local hs=$((dim / nh)) av=${6#-}
    local n=$((av * dim + nl * dim + nl * dim * nh * hs + 2 * nl * dim * nkv * hs + nl * nh * hs * dim))
    n=$((n + nl * dim + 3 * nl * dim * hid + dim + seq * hs))
    [ "$voc" -lt 0 ] && n=$((n + av * dim))
    for v in "$dim" "$hid" "$nl" "$nh" "$nkv" "$voc" "$seq"; do le32 $((v & 0xffffffff)); done
    head -c $((4 * n)) /dev/zero
}
# tok_record SCORE_BITS STRING: one llama2.c tokenizer record
tok_record() { le32 "$1"; le32 ${#2}; printf '%s' "$2"; }

for t in "$@"; do
    d=$out/$t
    rm -rf "$d"
    mkdir -p "$d"
    case $t in
    dsl)
        cp "$root"/models/*.mstar "$d"/
        "$root"/tests/dsl/split.sh "$d" "$root"/tests/dsl/*.test
        rm -f "$d"/*.expected
        ;;
    config)
        cp "$here"/config/*.json "$d"/
        { cat "$here/config/llama31_rope_parameters.json"; printf '\0'; cat "$here/config/generation_config.json"; } \
            >"$d/with_generation_config"
        for c in "$fix"/hf/*/config.json; do
            [ -f "$c" ] || continue
            name=$(basename "$(dirname "$c")")
            g=$(dirname "$c")/generation_config.json
            if [ -f "$g" ]; then
                { cat "$c"; printf '\0'; cat "$g"; } >"$d/fixture_$name"
            else
                cp "$c" "$d/fixture_$name"
            fi
        done
        ;;
    tokenizer_hf)
        for j in gpt2_like llama3_like issue15_bare_vocab spm_like metaspace_like; do
            { cat "$here/tokenizer_hf/$j.json"; printf '\0Hello world caf\xc3\xa9 <|im_start|>user tok 123\n'; } >"$d/$j"
            { cat "$here/tokenizer_hf/$j.json"; printf '\0 the  world\t\xe3\x80\x80e\xcc\x81\0'
              cat "$here/tokenizer_hf/tokenizer_config.json"; } >"$d/${j}_config"
        done
        ;;
    tokenizer_vocab) # tests/fuzz_tokenizer_vocab.c: header bytes, tokens, merges, types, text
        # gpt2, pre smollm: GPT-2's 256 byte-level characters (bytes_to_unicode), "ab", "abc", <|end|>
        { printf '\x20\xff\x00\xff'
          k=0
          for b in $(seq 0 255); do
              if { [ "$b" -ge 33 ] && [ "$b" -le 126 ]; } || { [ "$b" -ge 161 ] && [ "$b" -le 172 ]; } || [ "$b" -ge 174 ]; then
                  c=$b
              else
                  c=$((256 + k))
                  k=$((k + 1))
              fi
              printf "$(printf '\\u%04x' "$c")\n"
          done
          printf 'ab\nabc\n<|end|>\0a b\nab c\0'
          head -c 258 /dev/zero | tr '\0' '\1'
          printf '\3\0abc ab<|end|> 12\n'; } >"$d/gpt2_smollm"
        # llama (+ add_bos, add_space_prefix): <unk> <s> </s>, the 256 byte tokens, a few pieces
        { printf '\x0b\x01\x02\x00<unk>\n<s>\n</s>\n'
          for b in $(seq 0 255); do printf '<0x%02X>\n' "$b"; done
          printf '\xe2\x96\x81\na\nb\n\xe2\x96\x81a\nab\n\xe2\x96\x81ab\0\0\2\3\3'
          head -c 256 /dev/zero | tr '\0' '\6'
          printf '\xf9\xf1\xe9\xe1\xd9\xd1\0ab a b\xc3\xa9\n'; } >"$d/spm"
        ;;
    safetensors)
        cp "$here/safetensors/index.json" "$d/index.json"
        safetensors '{"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]}}' 12 >"$d/f32_bf16.safetensors"
        safetensors '{"i":{"dtype":"I32","shape":[3],"data_offsets":[0,12]},"l":{"dtype":"I64","shape":[],"data_offsets":[12,20]},"h":{"dtype":"F16","shape":[2,0],"data_offsets":[20,20]},"g":{"dtype":"F16","shape":[1],"data_offsets":[20,22]}}' 22 >"$d/int_f16_scalar.safetensors"
        safetensors '{"model.embed_tokens.weight":{"dtype":"F32","shape":[4,2],"data_offsets":[0,32]},"model.norm.weight":{"dtype":"F32","shape":[2],"data_offsets":[32,40]}}   ' 40 >"$d/llama_names.safetensors"
        ;;
    llama2c)
        llama2c_ckpt 4 4 1 2 1 3 2 >"$d/shared.bin"
        llama2c_ckpt 4 6 2 2 2 -5 3 >"$d/unshared.bin"
        { le32 6
          tok_record 0 '<unk>'; tok_record 0 '<s>'; tok_record 0 '</s>'
          for b in $(seq 0 2); do tok_record 0 "<0x0$b>"; done
          tok_record 0 ' '; tok_record 0 'a'; tok_record 0 'b'; tok_record 1065353216 'ab'; tok_record 1073741824 ' a'
        } >"$d/tokenizer.bin"
        [ -f "$fix/llama2c/tok512.bin" ] && cp "$fix/llama2c/tok512.bin" "$d/tok512.bin"
        ;;
    chat_template)
        # every golden template (tests/chat) and the fixtures' chat templates, each with one of the
        # golden conversations; the hand-written seeds of tests/fuzz/chat_template/ as they are
        convs=$(python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))["conversations"]; [print(json.dumps(v, ensure_ascii=False)) for v in c.values()]' "$root/tests/chat/cases.json" 2>/dev/null || true)
        k=0
        for j in "$root"/tests/chat/*.jinja; do
            while IFS= read -r conv; do
                [ -n "$conv" ] || continue
                k=$((k + 1))
                { cat "$j"; printf '\0%s\0\001' "$conv"; } >"$d/$(basename "$j" .jinja)_$k"
            done <<<"$convs"
        done
        for c in "$fix"/tokenizers/*/tokenizer_config.json; do
            [ -f "$c" ] || continue
            python3 -c 'import json,sys; t=json.load(open(sys.argv[1])).get("chat_template"); sys.stdout.write(t if isinstance(t, str) else "")' "$c" \
                >"$d/fixture_$(basename "$(dirname "$c")")" 2>/dev/null || true
        done
        cp "$here"/chat_template/* "$d"/
        ;;
    gguf)
        # the committed tiny models (tests/fuzz/gguf/make_seeds.py) and the dequantization goldens
        cp "$here"/gguf/*.gguf "$d"/
        cp "$root/tests/gguf/dequant_goldens.gguf" "$d"/
        ;;
    serve_request)
        # hand-written request bodies (tests/fuzz/serve_request/: body, NUL, flags byte)
        cp "$here"/serve_request/* "$d"/
        ;;
    audio)
        # small sound files: the first 0.25 s of speech0.wav (when the fixtures are there, else a
        # tone) as 16-bit mono at 16 kHz, 8-bit at 8 kHz, 16-bit stereo at 44.1 kHz, float32 WAV,
        # 24-bit WAV, Sun .au (big-endian), and a 2-sample file; written with Python's struct
        python3 - "$d" "$fix/hf/whisper_base/speech0.wav" <<'PY'
import math, os, struct, sys
out, src = sys.argv[1], sys.argv[2]
try:
    raw = open(src, "rb").read()
    i = raw.index(b"data") + 8
    x = [v / 32768 for v in struct.unpack("<4000h", raw[i:i + 8000])]
except (OSError, ValueError, struct.error):
    x = [0.5 * math.sin(2 * math.pi * 440 * k / 16000) for k in range(4000)]
def wav(name, rate, ch, fmt_tag, bits, frames):
    data = b"".join(frames)
    fmt = struct.pack("<HHIIHH", fmt_tag, ch, rate, rate * ch * bits // 8, ch * bits // 8, bits)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    open(os.path.join(out, name), "wb").write(b"RIFF" + struct.pack("<I", len(body)) + body)
q16 = lambda v: struct.pack("<h", max(-32768, min(32767, int(v * 32767))))
wav("pcm16_16k.wav", 16000, 1, 1, 16, [q16(v) for v in x])
wav("pcm8_8k.wav", 8000, 1, 1, 8, [bytes([int(v * 127) + 128]) for v in x[::2]])
wav("stereo_44k.wav", 44100, 2, 1, 16, [q16(v) + q16(-v) for v in x[:1500]])
wav("float_16k.wav", 16000, 1, 3, 32, [struct.pack("<f", v) for v in x[:1000]])
wav("pcm24_16k.wav", 16000, 1, 1, 24, [struct.pack("<i", int(v * 8388607))[:3] for v in x[:1000]])
wav("two.wav", 16000, 1, 1, 16, [q16(0.5), q16(-0.5)])
au = b"".join(struct.pack(">h", int(v * 32767)) for v in x[:1000])
open(os.path.join(out, "pcm16.au"), "wb").write(struct.pack(">4sIIIII", b".snd", 24, len(au), 3, 22050, 1) + au)
PY
        ;;
    *)
        echo "seeds.sh: unknown target '$t'" >&2
        exit 2
        ;;
    esac
done
