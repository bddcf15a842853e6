#!/usr/bin/env bash
# install-deps.sh - install, with apt-get, the Debian packages mstar-c needs that are missing.
#
# Idempotent: checks each package with dpkg-query first and does nothing when all are present.
# Needs root (or sudo) and apt-get only when something is missing; otherwise says what to install
# and exits 1.
set -euo pipefail

# Build tools and libraries (DESIGN.md §7): flex/bison for the language front end, cmocka for the
# tests, jansson (JSON), libmicrohttpd (HTTP), PCRE2 (tokenizer regexes), xxHash (prefix-cache
# keys); clang for the fuzz target; curl and jq for the shell tests (tests/serve.sh talks HTTP
# with curl).
PACKAGES=(
    make
    gcc
    flex
    bison
    pkg-config
    libcmocka-dev
    libjansson-dev
    libmicrohttpd-dev
    libpcre2-dev
    libxxhash-dev
    clang
    python3
    curl
    jq
    # the audio front end (runtime/audio): sound files, resampling, FFT
    libsndfile1-dev
    libsamplerate0-dev
    libfftw3-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done

# Python packages (PyPI, with pip): the official openai client that tests/serve.sh drives the
# server with. Not fatal: without it (no pip, no network) serve.sh says it skips those tests.
OPENAI_PIN=openai==1.109.1
# gguf-py: tests/tok_vocab.sh reads GGUF tokenizer metadata with it; tests/gguf/make_goldens.py
# regenerates the committed GGUF dequantization goldens with it (the C tests do not need it).
GGUF_PIN=gguf==0.19.0
pip_deps() {
    command -v python3 >/dev/null 2>&1 || return 0
    if ! python3 -c 'import openai' 2>/dev/null &&
        ! python3 -m pip install -q --disable-pip-version-check "$OPENAI_PIN" >/dev/null 2>&1; then
        echo "install-deps: could not pip-install $OPENAI_PIN; tests/serve.sh will skip its openai client tests" >&2
    fi
    # gguf, sentencepiece, tokenizers: tests/tok_vocab.sh reads a GGUF's tokenizer metadata and makes a
    # SentencePiece model's goldens with them (it skips those parts without them);
    # tests/gguf/make_goldens.py regenerates the dequantization goldens with gguf.
    for pin in "$GGUF_PIN" sentencepiece==0.2.0 tokenizers==0.22.1; do
        python3 -c "import ${pin%%=*}" 2>/dev/null || python3 -m pip install -q --disable-pip-version-check "$pin" \
            >/dev/null 2>&1 || echo "install-deps: could not pip-install $pin; tests/tok_vocab.sh will skip a part" >&2
    done
    return 0
}

if [ ${#missing[@]} -eq 0 ]; then
    pip_deps
    exit 0
fi

echo "install-deps: missing Debian packages: ${missing[*]}"
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-deps: apt-get not found; install these packages with your system's package manager." >&2
    exit 1
fi
SUDO=
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
        SUDO=sudo
    else
        echo "install-deps: not root and no passwordless sudo; run as root: apt-get install ${missing[*]}" >&2
        exit 1
    fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps: installed ${missing[*]}"
pip_deps
