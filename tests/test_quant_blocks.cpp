/*
 * test_quant_blocks.cpp - the GPU's reading of ggml blocks (templates/quant/blocks.cuh), built for
 * the host, against the CPU reference ms_ggml_dequantize (bit-exact with ggml): for every type the
 * CUDA backend keeps quantized (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K), 64 blocks of random
 * bytes (f16 scales set to finite random values; plus one block of edge values: zero, subnormal,
 * negative and large scales), every 32-value unit unit(block, sub, w) and every 8-value slice
 * slice(block, sub, p, w) (the GEMV's) must give exactly the float32 bits of the CPU's
 * dequantization. Without a GPU this is how CI checks the kernels'
 * formulas, bit layouts and unit indexing; test_quant_cuda checks the same on the device.
 *
 * C++ because the template is (compiled here with -ffp-contract=off, as the device code forbids
 * contraction with __fmul_rn / __fadd_rn).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
extern "C" { /* cmocka.h declares its functions without C linkage for C++ */
#include "ms_test.h"
}

#include "gguf_quant.h"
#include "safetensors.h"

/* the CUDA vocabulary blocks.cuh uses, for a host build */
#define __device__
#define __forceinline__ inline
struct uint2 {
    unsigned x, y;
};
struct uint4 {
    unsigned x, y, z, w;
};
#include "quant/blocks.cuh"

extern "C" {
#include "ms_test_impl.h"
}

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static uint64_t next_u64(void) {
    uint64_t z = (g_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void put_f16(uint8_t *p, uint16_t h) {
    p[0] = (uint8_t)(h & 0xff);
    p[1] = (uint8_t)(h >> 8);
}

/* A random finite f16 (any exponent, any sign), or one of the edge values. */
static uint16_t rand_f16(int edge) {
    static const uint16_t edges[] = {0x0000, 0x8000, 0x0001, 0x03ff, 0x8201, 0x3c00, 0xbc00, 0x7bff, 0x1400};
    if (edge >= 0)
        return edges[edge % (int)(sizeof edges / sizeof edges[0])];
    uint16_t h;
    do
        h = (uint16_t)next_u64();
    while (((h >> 10) & 0x1f) == 0x1f); /* no inf / NaN: those stay NaN on both sides but do not compare */
    return h;
}

/* Byte offsets of the f16 fields of a block of `type`. */
static int f16_fields(uint32_t type, int *off) {
    switch (type) {
    case MS_GGML_TYPE_Q4_0:
    case MS_GGML_TYPE_Q5_0:
    case MS_GGML_TYPE_Q8_0: off[0] = 0; return 1;
    case MS_GGML_TYPE_Q4_1:
    case MS_GGML_TYPE_Q4_K:
    case MS_GGML_TYPE_Q5_K: off[0] = 0; off[1] = 2; return 2;
    case MS_GGML_TYPE_Q6_K: off[0] = 208; return 1;
    default: return 0;
    }
}

template <typename Q> static void check_type(uint32_t type) {
    const int n_blocks = 64 + 9;
    const size_t bb = ms_ggml_type_block_bytes(type), qk = ms_ggml_type_block(type);
    assert_int_equal(bb, (size_t)Q::kBytes);
    assert_int_equal(qk, (size_t)Q::kQK);
    uint8_t *b = (uint8_t *)malloc(bb * n_blocks);
    float *want = (float *)malloc(sizeof(float) * qk * n_blocks);
    assert_true(b != NULL && want != NULL);
    for (size_t i = 0; i < bb * n_blocks; i++)
        b[i] = (uint8_t)next_u64();
    int off[2];
    int nf = f16_fields(type, off);
    for (int k = 0; k < n_blocks; k++)
        for (int f = 0; f < nf; f++)
            put_f16(b + (size_t)k * bb + off[f], rand_f16(k >= 64 ? k - 64 + f : -1));
    assert_int_equal(ms_ggml_dequantize(type, b, want, qk * n_blocks), MS_OK);
    size_t checked = 0;
    for (int k = 0; k < n_blocks; k++)
        for (int s = 0; s < Q::kQK / 32; s++) {
            float w[32];
            Q::unit(b + (size_t)k * bb, s, w);
            for (int l = 0; l < 32; l++) {
                float r = want[(size_t)k * qk + (size_t)s * 32 + l];
                if (memcmp(&w[l], &r, sizeof r) != 0 && !(isnan(w[l]) && isnan(r))) {
                    unsigned bits;
                    memcpy(&bits, &w[l], sizeof bits);
                    fail_msg("%s block %d unit %d value %d: %.9g (0x%08x), CPU %.9g", ms_ggml_type_name(type), k, s,
                             l, (double)w[l], bits, (double)r);
                }
                checked++;
            }
            /* the GEMV's 8-value slices: the same bits as the unit's */
            for (int p = 0; p < 4; p++) {
                float v[8];
                Q::slice(b + (size_t)k * bb, s, p, v);
                for (int l = 0; l < 8; l++) {
                    float r = want[(size_t)k * qk + (size_t)s * 32 + (size_t)p * 8 + l];
                    if (memcmp(&v[l], &r, sizeof r) != 0 && !(isnan(v[l]) && isnan(r)))
                        fail_msg("%s block %d unit %d slice %d value %d: %.9g, CPU %.9g", ms_ggml_type_name(type),
                                 k, s, p, l, (double)v[l], (double)r);
                    checked++;
                }
            }
        }
    printf("%s: %zu values of %d blocks (units and slices) bit-exact with ms_ggml_dequantize\n", ms_ggml_type_name(type), checked,
           n_blocks);
    free(b);
    free(want);
}

static void test_units_bit_exact(void **state) {
    (void)state;
    check_type<ms::q4_0>(MS_GGML_TYPE_Q4_0);
    check_type<ms::q4_1>(MS_GGML_TYPE_Q4_1);
    check_type<ms::q5_0>(MS_GGML_TYPE_Q5_0);
    check_type<ms::q8_0>(MS_GGML_TYPE_Q8_0);
    check_type<ms::q4_k>(MS_GGML_TYPE_Q4_K);
    check_type<ms::q5_k>(MS_GGML_TYPE_Q5_K);
    check_type<ms::q6_k>(MS_GGML_TYPE_Q6_K);
}

/* The host half conversion is exact for every f16 (the device uses cvt.f32.f16). */
static void test_f16_bits(void **state) {
    (void)state;
    for (unsigned h = 0; h < 0x10000u; h++) {
        float a = ms::quant::f16_bits(h), b = ms_f16_to_f32((uint16_t)h);
        if (memcmp(&a, &b, sizeof a) != 0 && !(isnan(a) && isnan(b)))
            fail_msg("f16 0x%04x: %.9g, ms_f16_to_f32 %.9g", h, (double)a, (double)b);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_units_bit_exact),
        cmocka_unit_test(test_f16_bits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
