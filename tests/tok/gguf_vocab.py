#!/usr/bin/env python3
"""gguf_vocab.py GGUF > vocab.json - the tokenizer metadata of a GGUF file as JSON, for
tests/test_tok_vocab.c (read with the `gguf` package that llama.cpp publishes, pinned in
scripts/install-deps.sh). Keys: model, pre, tokens, scores, token_type, merges, bos_id, eos_id,
eot_id, unk_id, pad_id (-1 when absent), add_bos, add_eos, add_space_prefix (null when absent),
chat_template. Exit 3 when the gguf package is missing (the test then skips)."""
import json
import sys

try:
    from gguf import GGUFReader
except ImportError:
    print("gguf_vocab.py: the gguf Python package is not installed (pip install gguf==0.19.0)", file=sys.stderr)
    sys.exit(3)

r = GGUFReader(sys.argv[1])


def get(key, default=None):
    f = r.fields.get(key)
    return default if f is None else f.contents()


out = {
    "model": get("tokenizer.ggml.model"),
    "pre": get("tokenizer.ggml.pre"),
    "tokens": get("tokenizer.ggml.tokens", []),
    "scores": get("tokenizer.ggml.scores"),
    "token_type": get("tokenizer.ggml.token_type"),
    "merges": get("tokenizer.ggml.merges", []),
    "chat_template": get("tokenizer.chat_template"),
    "add_bos": get("tokenizer.ggml.add_bos_token"),
    "add_eos": get("tokenizer.ggml.add_eos_token"),
    "add_space_prefix": get("tokenizer.ggml.add_space_prefix"),
}
for name, key in (("bos_id", "bos_token_id"), ("eos_id", "eos_token_id"), ("eot_id", "eot_token_id"),
                  ("unk_id", "unknown_token_id"), ("pad_id", "padding_token_id")):
    out[name] = int(get("tokenizer.ggml." + key, -1))
if out["scores"] is not None:
    out["scores"] = [float(x) for x in out["scores"]]
json.dump(out, sys.stdout, ensure_ascii=False)
