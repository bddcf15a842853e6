#!/usr/bin/env python3
"""spm_vocab.py MODEL [HF_OUT.json] > vocab.json - a SentencePiece model's vocabulary as GGUF's tokenizer.ggml.*
arrays (the piece, score and type of every id, mapped as llama.cpp's convert_hf_to_gguf.py
_set_vocab_sentencepiece does), in tests/tok/gguf_vocab.py's format, plus "cases": the
`sentencepiece` library's own encode (ids) and decode (text) of test strings. tests/tok_vocab.sh
runs it on a real Mistral tokenizer.model (from the pinned mistral_common wheel) for
tests/test_tok_vocab.c. Exit 3 when sentencepiece (pinned 0.2.0) is missing: the test then skips.
With HF_OUT.json and the `tokenizers` library (pinned 0.22.1) importable, also writes the model as
a Llama-2-style tokenizer.json (make_spm.py's LlamaConverter layout) with "cases" from the
tokenizers library's encode / decode; exit 4 when tokenizers is missing (that file is not written)."""
import json
import sys

try:
    import sentencepiece as spm
except ImportError:
    print("spm_vocab.py: the sentencepiece Python package is not installed (pip install sentencepiece==0.2.0)",
          file=sys.stderr)
    sys.exit(3)

CASES = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    " leading space",
    "  two leading spaces and   inner   runs  ",
    "tabs\tand\nnewlines\n\n",
    "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber Stra\u00dfe",
    "emoji \U0001F600\U0001F389 mix",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3068\u4e2d\u6587",
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5",
    "1234567890 3.14159 -42 1e-9",
    "x = f(y) + 3.14159; // code\n\tif (a && b) { return c[i]; }",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "\u2581already a meta symbol",
    "don't won't I'm you're they'll",
    "https://example.com/path?q=1&r=2 user@example.org",
    "[INST] What is the capital of France? [/INST]",
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e \u0645\u0631\u062d\u0628\u0627",
    "\u00a7\u00b6\u2020\u2021\u2022\u2026\u2030\u2122\u2190\u2192\u221e\u2260",
    " ",
    "",
]


def gguf_type(sp, i):
    if sp.IsUnknown(i):
        return 2
    if sp.IsControl(i):
        return 3
    if sp.IsUnused(i):
        return 5
    if sp.IsByte(i):
        return 6
    return 1


sp = spm.SentencePieceProcessor(model_file=sys.argv[1])
n = sp.GetPieceSize()
out = {
    "model": "llama", "pre": None, "tokens": [sp.IdToPiece(i) for i in range(n)],
    "scores": [sp.GetScore(i) for i in range(n)], "token_type": [gguf_type(sp, i) for i in range(n)],
    "merges": [], "bos_id": sp.bos_id(), "eos_id": sp.eos_id(), "eot_id": -1, "unk_id": sp.unk_id(),
    "pad_id": sp.pad_id(), "add_bos": False, "add_eos": False, "add_space_prefix": True, "chat_template": None,
    "generated_with": f"sentencepiece {spm.__version__}",
    "cases": [{"text": t, "ids": sp.encode(t), "decoded": sp.decode(sp.encode(t))} for t in CASES],
}
json.dump(out, sys.stdout, ensure_ascii=False)

if len(sys.argv) > 2:
    try:
        import tokenizers
        from tokenizers import Tokenizer
    except ImportError:
        print("spm_vocab.py: the tokenizers Python package is not installed (pip install tokenizers==0.22.1)",
              file=sys.stderr)
        sys.exit(4)
    pieces = out["tokens"]
    ids = {p: i for i, p in enumerate(pieces)}
    merges = []
    for p, i in ids.items():
        if sp.IsControl(i) or sp.IsUnknown(i) or sp.IsByte(i):
            continue
        for k in range(1, len(p)):
            a, b = p[:k], p[k:]
            if a in ids and b in ids:
                merges.append((i, ids[a], ids[b], a, b))
    merges.sort()
    specials = [i for i in range(n) if sp.IsControl(i) or sp.IsUnknown(i)]
    tj = {"version": "1.0", "truncation": None, "padding": None,
          "added_tokens": [{"id": i, "content": pieces[i], "single_word": False, "lstrip": False, "rstrip": False,
                            "normalized": False, "special": True} for i in specials],
          "normalizer": {"type": "Sequence", "normalizers": [
              {"type": "Prepend", "prepend": "\u2581"},
              {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
          "pre_tokenizer": None, "post_processor": None,
          "decoder": {"type": "Sequence", "decoders": [
              {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
              {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
          "model": {"type": "BPE", "dropout": None, "unk_token": pieces[sp.unk_id()], "continuing_subword_prefix": None,
                    "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                    "vocab": ids, "merges": [[a, b] for _, _, _, a, b in merges]}}
    tok = Tokenizer.from_str(json.dumps(tj))
    cases = []
    for t in CASES + ["<s>hi</s>there", "a <s> b"]:
        e = tok.encode(t, add_special_tokens=False).ids
        cases.append({"text": t, "ids": e, "decoded": tok.decode(e, skip_special_tokens=False)})
    tj["cases"] = cases
    tj["generated_with"] = f"tokenizers {tokenizers.__version__}"
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
