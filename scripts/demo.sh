#!/usr/bin/env bash
# demo.sh - the main job on the embedded default: check the example model with the compiler.
# (Code generation and text generation join here when they land; see README.md.)
set -euo pipefail
build=${MS_BUILD:-build}
echo "== mstarc check models/llama.mstar"
"$build/mstarc" check models/llama.mstar
echo "ok: models/llama.mstar checks clean"
