#!/usr/bin/env bash
# tok_vocab.sh - SmolLM2's GGUF tokenizer (tokenizer.ggml.* metadata through ms_tok_hf_from_vocab)
# against llama.cpp's ids in ../shared/fixtures/gguf/smollm2/reference.json: fetches the model with
# scripts/fetch-model.sh smollm2 (the one path the tests use; $MSTAR_SMOLLM2_GGUF overrides it for
# development), dumps its tokenizer metadata with tests/tok/gguf_vocab.py (the pinned `gguf`
# package) and runs test_tok_vocab with MS_TOK_SMOLLM2_JSON set. Skips, saying why, when the model
# cannot be fetched or the gguf package is missing.
set -uo pipefail
build=${MS_BUILD:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

gguf=${MSTAR_SMOLLM2_GGUF:-}
if [ -z "$gguf" ]; then
    if [ ! -x scripts/fetch-model.sh ]; then
        echo "skip tok_vocab.sh: scripts/fetch-model.sh is not there (set MSTAR_SMOLLM2_GGUF to the GGUF)"
        exit 0
    fi
    gguf=$(scripts/fetch-model.sh smollm2)
    rc=$?
    if [ $rc -eq 2 ]; then
        echo "skip tok_vocab.sh: the SmolLM2 GGUF cannot be fetched (scripts/fetch-model.sh smollm2 exit 2)"
        exit 0
    elif [ $rc -ne 0 ] || [ ! -f "$gguf" ]; then
        echo "FAIL tok_vocab.sh: scripts/fetch-model.sh smollm2 failed (exit $rc)"
        exit 1
    fi
fi
python3 tests/tok/gguf_vocab.py "$gguf" >"$tmp/vocab.json" 2>"$tmp/err"
rc=$?
if [ $rc -eq 3 ] || ! command -v python3 >/dev/null; then
    echo "skip tok_vocab.sh: $(cat "$tmp/err")"
    exit 0
elif [ $rc -ne 0 ]; then
    echo "FAIL tok_vocab.sh: tests/tok/gguf_vocab.py $gguf: $(tail -1 "$tmp/err")"
    exit 1
fi
MS_TOK_SMOLLM2_JSON="$tmp/vocab.json" "$build/tests/test_tok_vocab"
