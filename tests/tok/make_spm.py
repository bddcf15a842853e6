#!/usr/bin/env python3
"""make_spm.py - regenerate the SentencePiece goldens of tests/test_tok_vocab.c (run from the
project root; needs sentencepiece==0.2.0 and tokenizers==0.22.1 from PyPI, pinned here because the
goldens depend on them; the test itself needs neither).

1. Trains a tiny SentencePiece BPE model (byte_fallback, add_dummy_prefix, identity normalization,
   no whitespace cleanup: Llama's settings) on a fixed corpus, single-threaded.
2. spm_tiny.json: its vocabulary as GGUF's tokenizer.ggml.* arrays (piece, score, type mapped as
   llama.cpp's convert_hf_to_gguf.py _set_vocab_sentencepiece does) in tests/tok/gguf_vocab.py's
   format, plus "cases": sentencepiece's own encode (ids) and decode (text) of test strings.
3. llama_legacy.json / llama_metaspace.json / llama_split.json: the same vocabulary as Hugging Face
   tokenizer.json files in the layout transformers' LlamaConverter writes (BPE, byte_fallback,
   merges of every piece split into two pieces, ordered by the merged piece's id; legacy
   Prepend+Replace normalizer, or a Metaspace pre-tokenizer), each with "cases": the `tokenizers`
   library's encode (add_special_tokens=False) and decode (skip_special_tokens=False).
"""
import json
import os
import sys
import tempfile

import sentencepiece as spm
import tokenizers
from tokenizers import Tokenizer

assert spm.__version__ == "0.2.0", spm.__version__
assert tokenizers.__version__ == "0.22.1", tokenizers.__version__
HERE = os.path.dirname(os.path.abspath(__file__))

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A tokenizer turns text into token ids and back again.",
    "SentencePiece treats the input as a raw stream of Unicode characters.",
    "Spaces are escaped with the meta symbol before merging pieces.",
    "Byte fallback turns unknown characters into UTF-8 byte tokens.",
    "Llama and Mistral models use this kind of vocabulary.",
    "Numbers like 12, 345 and 6789 appear in text too.",
    "Caf\u00e9 cr\u00e8me, na\u00efve r\u00e9sum\u00e9, \u00fcber stra\u00dfe.",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3068\u4e2d\u6587\u6587\u672c\u3002",
    "def main():\n    return 0\n",
    "She said: \"hello, world!\" and left; then (quietly) came back.",
]
CORPUS = [f"{s} {w}" for i in range(60) for s in SENTENCES for w in [SENTENCES[(i * 7) % len(SENTENCES)][:20]]]

CASES = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    " leading space",
    "  two leading spaces and   inner   runs  ",
    "tabs\tand\nnewlines\n\n",
    "Caf\u00e9 na\u00efve",
    "emoji \U0001F600\U0001F389 mix",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
    "unseen \u0416\u0437\u0444 letters \u00a7",
    "1234567890",
    "x = f(y) + 3.14159; // code",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "\u2581already a meta symbol",
    " ",
    "",
]
HF_EXTRA = ["<s>hi</s>there", "a <s> b", "</s>"]


def train(tmp):
    corpus = os.path.join(tmp, "corpus.txt")
    with open(corpus, "w", encoding="utf-8") as f:
        f.write("\n".join(CORPUS) + "\n")
    prefix = os.path.join(tmp, "tiny")
    spm.SentencePieceTrainer.train(
        input=corpus, model_prefix=prefix, model_type="bpe", vocab_size=700, byte_fallback=True,
        character_coverage=0.995, normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=True, split_digits=True, num_threads=1, minloglevel=2, unk_id=0, bos_id=1,
        eos_id=2, pad_id=-1)
    return spm.SentencePieceProcessor(model_file=prefix + ".model")


def gguf_type(sp, i):
    # convert_hf_to_gguf.py _set_vocab_sentencepiece: NORMAL 1, UNKNOWN 2, CONTROL 3, USER_DEFINED 4,
    # UNUSED 5, BYTE 6
    if sp.IsUnknown(i):
        return 2
    if sp.IsControl(i):
        return 3
    if sp.IsUnused(i):
        return 5
    if sp.IsByte(i):
        return 6
    return 1


def main():
    with tempfile.TemporaryDirectory() as tmp:
        sp = train(tmp)
    n = sp.GetPieceSize()
    pieces = [sp.IdToPiece(i) for i in range(n)]
    vocab = {
        "model": "llama", "pre": None, "tokens": pieces, "scores": [sp.GetScore(i) for i in range(n)],
        "token_type": [gguf_type(sp, i) for i in range(n)], "merges": [], "bos_id": sp.bos_id(),
        "eos_id": sp.eos_id(), "eot_id": -1, "unk_id": sp.unk_id(), "pad_id": -1, "add_bos": False,
        "add_eos": False, "add_space_prefix": True, "chat_template": None,
        "generated_with": f"sentencepiece {spm.__version__} (tests/tok/make_spm.py)",
        "cases": [{"text": t, "ids": sp.encode(t), "decoded": sp.decode(sp.encode(t))} for t in CASES],
    }
    with open(os.path.join(HERE, "spm_tiny.json"), "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False, indent=0)
        f.write("\n")

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
    model = {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
             "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
             "vocab": ids, "merges": [[a, b] for _, _, _, a, b in merges]}
    added = [{"id": i, "content": pieces[i], "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i in (0, 1, 2)]
    legacy_decoder = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
        {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    variants = {
        "llama_legacy.json": ({"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}, None, legacy_decoder),
        "llama_metaspace.json": (None, {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                                        "split": False}, legacy_decoder),
        "llama_split.json": (None, {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always",
                                    "split": True}, legacy_decoder),
    }
    for name, (norm, pre, dec) in variants.items():
        tj = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": norm,
              "pre_tokenizer": pre, "post_processor": None, "decoder": dec, "model": model}
        tok = Tokenizer.from_str(json.dumps(tj))
        cases = []
        for t in CASES + HF_EXTRA:
            e = tok.encode(t, add_special_tokens=False).ids
            cases.append({"text": t, "ids": e, "decoded": tok.decode(e, skip_special_tokens=False)})
        tj["cases"] = cases
        tj["generated_with"] = f"tokenizers {tokenizers.__version__} (tests/tok/make_spm.py)"
        with open(os.path.join(HERE, name), "w", encoding="utf-8") as f:
            json.dump(tj, f, ensure_ascii=False, indent=0)
            f.write("\n")
    print("wrote spm_tiny.json and", ", ".join(variants), file=sys.stderr)


main()
