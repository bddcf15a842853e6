#!/usr/bin/env bash
# tok_vocab.sh - runs tests/test_tok_vocab with the two real vocabularies it needs from outside:
#   - SmolLM2's GGUF tokenizer (tokenizer.ggml.* through ms_tok_hf_from_vocab) against llama.cpp's
#     ids in ../shared/fixtures/gguf/smollm2/reference.json: the model comes from
#     scripts/fetch-model.sh smollm2 (the one path the tests use; $MSTAR_SMOLLM2_GGUF overrides it
#     for development), its metadata through tests/tok/gguf_vocab.py (the pinned `gguf` package);
#   - Mistral 7B's SentencePiece model (tokenizer.model.v1 in the PyPI wheel mistral_common 1.5.4,
#     Apache-2.0; fetched with pip, sha256 checked, cached under $MSTAR_MODELS, default
#     ~/.cache/mstar/models) against the `sentencepiece` library's own encode and decode
#     (tests/tok/spm_vocab.py, sentencepiece 0.2.0), and as a Llama-2-style tokenizer.json against
#     the `tokenizers` library (0.22.1) when it is installed.
# Each part that cannot be had (no registry, no package) says it skips; the rest still runs.
set -uo pipefail
build=${MS_BUILD:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0

# ---- SmolLM2 GGUF ----
gguf=${MSTAR_SMOLLM2_GGUF:-}
if [ -z "$gguf" ]; then
    if [ ! -x scripts/fetch-model.sh ]; then
        echo "skip smollm2: scripts/fetch-model.sh is not there (set MSTAR_SMOLLM2_GGUF to the GGUF)"
    else
        gguf=$(scripts/fetch-model.sh smollm2)
        rc=$?
        if [ $rc -eq 2 ]; then
            echo "skip smollm2: the GGUF cannot be fetched (scripts/fetch-model.sh smollm2 exit 2)"
            gguf=
        elif [ $rc -ne 0 ] || [ ! -f "$gguf" ]; then
            echo "FAIL smollm2: scripts/fetch-model.sh smollm2 failed (exit $rc)"
            gguf=
            status=1
        fi
    fi
fi
if [ -n "$gguf" ]; then
    python3 tests/tok/gguf_vocab.py "$gguf" >"$tmp/smollm2.json" 2>"$tmp/err"
    rc=$?
    if [ $rc -eq 0 ]; then
        export MS_TOK_SMOLLM2_JSON="$tmp/smollm2.json"
    elif [ $rc -eq 3 ]; then
        echo "skip smollm2: $(cat "$tmp/err")"
    else
        echo "FAIL smollm2: tests/tok/gguf_vocab.py $gguf: $(tail -1 "$tmp/err")"
        status=1
    fi
fi

# ---- Mistral's SentencePiece model ----
models=${MSTAR_MODELS:-$HOME/.cache/mstar/models}
mc=mistral_common-1.5.4-py3-none-any.whl
mc_sha=acef3367a4386d5dd3d9e23330348bbebe90a5cbd2fc5587d8a8d13d9893e537
spm_model="$models/mistral_common-1.5.4/tokenizer.model.v1"
if [ ! -f "$spm_model" ]; then
    if python3 -m pip download -q --no-deps --disable-pip-version-check mistral_common==1.5.4 -d "$tmp/dl" \
        >"$tmp/pip.log" 2>&1 && [ -f "$tmp/dl/$mc" ]; then
        got=$(sha256sum "$tmp/dl/$mc" | cut -d' ' -f1)
        if [ "$got" != "$mc_sha" ]; then
            echo "FAIL mistral: $mc has sha256 $got, expected $mc_sha"
            status=1
        elif mkdir -p "$models/mistral_common-1.5.4" &&
            python3 -c 'import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read("mistral_common/data/tokenizer.model.v1"))' \
                "$tmp/dl/$mc" >"$tmp/tokenizer.model.v1" && mv "$tmp/tokenizer.model.v1" "$spm_model"; then
            :
        else
            echo "FAIL mistral: cannot unpack tokenizer.model.v1 from $mc into $models"
            status=1
        fi
    else
        echo "skip mistral: cannot download $mc from PyPI ($(tail -1 "$tmp/pip.log"))"
    fi
fi
if [ -f "$spm_model" ]; then
    mkdir -p "$tmp/mistral_hf"
    python3 tests/tok/spm_vocab.py "$spm_model" "$tmp/mistral_hf/tokenizer.json" >"$tmp/mistral.json" 2>"$tmp/err"
    rc=$?
    if [ $rc -eq 0 ] || [ $rc -eq 4 ]; then
        export MS_TOK_MISTRAL_JSON="$tmp/mistral.json"
        if [ $rc -eq 0 ]; then
            export MS_TOK_MISTRAL_HF="$tmp/mistral_hf/tokenizer.json"
        else
            echo "skip mistral tokenizer.json: $(cat "$tmp/err")"
        fi
    elif [ $rc -eq 3 ]; then
        echo "skip mistral: $(cat "$tmp/err")"
    else
        echo "FAIL mistral: tests/tok/spm_vocab.py: $(tail -1 "$tmp/err")"
        status=1
    fi
fi

"$build/tests/test_tok_vocab" || status=1
exit $status
