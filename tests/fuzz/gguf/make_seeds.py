#!/usr/bin/env python3
"""make_seeds.py - write the committed GGUF seeds of fuzz_gguf (standard library only).

Two tiny but valid models that ms_ckpt_init opens: a llama v3 file (Q8_0 token embedding, Q4_0
weights, a tokenizer vocabulary) and a qwen2 v2 file (F32 embedding, Q8_0 weights). Run from the
repository root: python3 tests/fuzz/gguf/make_seeds.py
"""
import struct


def s(x):
    b = x.encode()
    return struct.pack('<Q', len(b)) + b


def kv_u32(k, v): return s(k) + struct.pack('<II', 4, v)
def kv_f32(k, v): return s(k) + struct.pack('<If', 6, v)
def kv_str(k, v): return s(k) + struct.pack('<I', 8) + s(v)
def kv_strarr(k, vs): return s(k) + struct.pack('<IIQ', 9, 8, len(vs)) + b''.join(s(v) for v in vs)
def kv_f32arr(k, vs): return s(k) + struct.pack('<IIQ', 9, 6, len(vs)) + b''.join(struct.pack('<f', v) for v in vs)


SIZES = {0: (1, 4), 8: (32, 34), 2: (32, 18)}  # ggml type: (block elements, block bytes)


def tiny(version, arch, emb_type, w_type):
    H, HEADS, KVH, HD, FF, V = 32, 2, 1, 16, 32, 8
    kvs = [kv_str('general.architecture', arch), kv_u32(arch + '.embedding_length', H),
           kv_u32(arch + '.block_count', 1), kv_u32(arch + '.attention.head_count', HEADS),
           kv_u32(arch + '.attention.head_count_kv', KVH), kv_u32(arch + '.feed_forward_length', FF),
           kv_u32(arch + '.context_length', 64), kv_f32(arch + '.attention.layer_norm_rms_epsilon', 1e-5),
           kv_f32(arch + '.rope.freq_base', 10000.0), kv_str('tokenizer.ggml.model', 'gpt2'),
           kv_strarr('tokenizer.ggml.tokens', ['a', 'b', '<|im_end|>', '\u0120the', 'c', 'd', 'e', 'f']),
           kv_f32arr('tokenizer.ggml.scores', [0.0] * 8), kv_u32('tokenizer.ggml.eos_token_id', 2)]
    ts = [('token_embd.weight', [H, V], emb_type), ('output_norm.weight', [H], 0),
          ('blk.0.attn_norm.weight', [H], 0), ('blk.0.attn_q.weight', [H, HEADS * HD], w_type),
          ('blk.0.attn_k.weight', [H, KVH * HD], w_type), ('blk.0.attn_v.weight', [H, KVH * HD], w_type),
          ('blk.0.attn_output.weight', [H, H], w_type), ('blk.0.ffn_norm.weight', [H], 0),
          ('blk.0.ffn_gate.weight', [H, FF], w_type), ('blk.0.ffn_up.weight', [H, FF], w_type),
          ('blk.0.ffn_down.weight', [FF, H], w_type)]
    infos, datas = b'', b''
    for name, ne, t in ts:
        blk, nb = SIZES[t]
        n = 1
        for x in ne:
            n *= x
        infos += s(name) + struct.pack('<I', len(ne)) + b''.join(struct.pack('<Q', x) for x in ne)
        infos += struct.pack('<IQ', t, len(datas))
        if t == 0:
            d = b''.join(struct.pack('<f', ((i % 13) - 6) * 0.01) for i in range(n))
        else:
            d = b''.join(struct.pack('<e', 0.01) + bytes((j * 5) % 256 for j in range(nb - 2)) for _ in range(n // blk))
        datas += d + b'\0' * ((-len(d)) % 32)
    hdr = b'GGUF' + struct.pack('<IQQ', version, len(ts), len(kvs)) + b''.join(kvs) + infos
    hdr += b'\0' * ((-len(hdr)) % 32)
    return hdr + datas


open('tests/fuzz/gguf/llama_q8_q4_0_v3.gguf', 'wb').write(tiny(3, 'llama', 8, 2))
open('tests/fuzz/gguf/qwen2_f32_q8_0_v2.gguf', 'wb').write(tiny(2, 'qwen2', 0, 8))
