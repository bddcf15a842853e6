#!/usr/bin/env python3
"""make_goldens.py - write tests/gguf/dequant_goldens.gguf, the dequantization goldens of test_gguf.c.

For each ggml type the loader dequantizes (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K,
Q5_K, Q6_K) it draws random but valid blocks (random bytes; every f16 scale a finite value drawn
from a normal distribution, so no NaN/inf enters), and stores in one GGUF file:
    q.<TYPE>  the raw blocks, as a [2, 256] tensor of that ggml type
    f.<TYPE>  gguf.quants.dequantize(raw, TYPE) as an F32 [2, 256] tensor
and, for the two types gguf-py can quantize bit-exactly like ggml's reference quantizers (Q4_0,
Q8_0: quantize_row_q4_0_ref, quantize_row_q8_0_ref):
    x.<TYPE>  random float32 input [2, 256] (one row scaled down, one block all zeros)
    z.<TYPE>  gguf.quants.quantize(x, TYPE), the blocks our ms_ggml_quantize must reproduce
The file is written with gguf-py's GGUFWriter, so it also checks that our parser reads what the
reference writer produces. Pinned: gguf==0.19.0 (scripts/install-deps.sh installs it).
Run: python3 tests/gguf/make_goldens.py [OUT] (default tests/gguf/dequant_goldens.gguf).
Seeded: rerunning produces the same file.
"""
import importlib.metadata
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

ROWS, COLS = 2, 256
TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"]
# byte offsets of the f16 scales inside a block (ggml-common.h block_* structs)
F16_AT = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
          "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


def raw_blocks(rng, name):
    qt = T[name]
    blk, nbytes = GGML_QUANT_SIZES[qt]
    n = ROWS * COLS
    if name == "F32":
        return rng.standard_normal(n).astype(np.float32).view(np.uint8)
    if name == "F16":
        return rng.standard_normal(n).astype(np.float16).view(np.uint8)
    if name == "BF16":
        f = rng.standard_normal(n).astype(np.float32).view(np.uint32)
        return (f >> 16).astype(np.uint16).view(np.uint8)
    nb = n // blk
    b = rng.integers(0, 256, size=(nb, nbytes), dtype=np.uint8)
    for off in F16_AT[name]:
        b[:, off:off + 2] = (rng.standard_normal(nb) * 0.05).astype(np.float16).view(np.uint8).reshape(nb, 2)
    return b.reshape(-1)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/gguf/dequant_goldens.gguf"
    rng = np.random.default_rng(20261201)
    w = gguf.GGUFWriter(out, arch="goldens")
    w.add_string("goldens.source", "gguf-py %s gguf.quants.dequantize" % importlib.metadata.version("gguf"))
    for name in TYPES:
        qt = T[name]
        raw = raw_blocks(rng, name)
        row_bytes = raw.size // ROWS
        raw2 = raw.reshape(ROWS, row_bytes)
        ref = dequantize(raw2, qt).astype(np.float32)
        assert ref.shape == (ROWS, COLS), (name, ref.shape)
        assert np.isfinite(ref).all(), name
        w.add_tensor("q." + name, raw2, raw_dtype=qt)
        w.add_tensor("f." + name, ref)
    for name in ["Q4_0", "Q8_0"]:
        x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
        x[1] *= 0.01
        x[0, :32] = 0.0
        z = quantize(x, T[name])
        w.add_tensor("x." + name, x)
        w.add_tensor("z." + name, z, raw_dtype=T[name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
