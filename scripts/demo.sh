#!/usr/bin/env bash
# demo.sh - the main job on the embedded default (run by `make demo` after `make all`):
#   1. write a small seeded random-weight Llama checkpoint with the project's own tool into build/
#      (config.json + generation_config.json + model.safetensors, Hugging Face names);
#   2. compile models/llama.mstar into the serving binary build/llama/llama
#      (`mstarc build models/llama.mstar -o build/llama`: generated C + libmstar);
#   3. generate from the checkpoint with that binary, printing ids and tokens/s.
# MS_DEMO_BIN picks another binary (default: build/llama/llama, the one mstarc builds).
# Point it at a real checkpoint with MS_DEMO_MODEL=/path/to/hf_folder (see README.md).
set -euo pipefail
build=${MS_BUILD:-build}
bin=${MS_DEMO_BIN:-$build/llama/llama}
model=${MS_DEMO_MODEL:-$build/demo-llama}

if [ -z "${MS_DEMO_MODEL:-}" ]; then
    echo "== mstar-mkckpt: seeded random-weight Llama checkpoint into $model"
    "$build/mstar-mkckpt" --out "$model" --seed 1
fi

echo "== mstarc build models/llama.mstar -o $build/llama"
"$build/mstarc" build models/llama.mstar -o "$build/llama"

echo "== $bin generate --model $model (4 prompts in one ragged batch)"
printf '1,15,300,42\n1,7\n1,99,100,101,102,103,104,105\n1\n' >"$build/demo-prompts.txt"
"$bin" generate --model "$model" --tokenizer none --prompts-file "$build/demo-prompts.txt" --max-new-tokens 32 \
    --temperature 0.8 --top-k 40 --top-p 0.95 --seed 1 --ignore-eos
