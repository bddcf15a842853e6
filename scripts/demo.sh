#!/usr/bin/env bash
# demo.sh - the main job on the embedded default (run by `make demo` after `make all`):
#   1. write a small seeded random-weight Llama checkpoint with the project's own tool into build/
#      (config.json + generation_config.json + model.safetensors, Hugging Face names);
#   2. check models/llama.mstar with the compiler;
#   3. generate from the checkpoint with the serving binary, printing ids and tokens/s.
# The serving binary is build/llama-ref (the engine over the hand-written Llama descriptor) until
# `mstarc build` emits build/llama/llama; then MS_DEMO_BIN (or this default) switches to it.
# Point it at a real checkpoint with MS_DEMO_MODEL=/path/to/hf_folder (see README.md).
set -euo pipefail
build=${MS_BUILD:-build}
bin=${MS_DEMO_BIN:-$build/llama-ref}
model=${MS_DEMO_MODEL:-$build/demo-llama}

if [ -z "${MS_DEMO_MODEL:-}" ]; then
    echo "== mstar-mkckpt: seeded random-weight Llama checkpoint into $model"
    "$build/mstar-mkckpt" --out "$model" --seed 1
fi

echo "== mstarc check models/llama.mstar"
"$build/mstarc" check models/llama.mstar
echo "ok: models/llama.mstar checks clean"

echo "== $bin generate --model $model (4 prompts in one ragged batch)"
printf '1,15,300,42\n1,7\n1,99,100,101,102,103,104,105\n1\n' >"$build/demo-prompts.txt"
"$bin" generate --model "$model" --prompts-file "$build/demo-prompts.txt" --max-new-tokens 32 \
    --temperature 0.8 --top-k 40 --top-p 0.95 --seed 1 --ignore-eos
