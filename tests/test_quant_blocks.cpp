/*
 * test_quant_blocks.cpp - the GPU's reading of ggml blocks (templates/quant/blocks.cuh), built for
 * the host, against the CPU reference ms_ggml_dequantize (bit-exact with ggml): for every type the
 * CUDA backend keeps quantized (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K), 64 blocks of random
 * bytes (f16 scales set to finite random values; plus one block of edge values: zero, subnormal,
 * negative and large scales), laid out as the GPU keeps them (ms_ggml_rows_to_planar: one row of
 * 73 blocks, and 73 rows of one block), every 32-value unit unit(row, nb, k, sub, w) must give
 * exactly the float32 bits of the CPU's dequantization, and so must the GEMV's lanes (ms::qlane: every value of
 * the row read by exactly one lane of one 512-value chunk, d q + m rebuilt bit-exactly), whose
 * accumulation as qgemv does it must match the float64 dot product with a random x. Without a GPU this is how CI checks the kernels'
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
    /* the device's planar rows: one row of all the blocks, and one row per block */
    uint8_t *pl = (uint8_t *)malloc(bb * n_blocks), *pl1 = (uint8_t *)malloc(bb * n_blocks);
    assert_true(pl != NULL && pl1 != NULL);
    assert_int_equal(ms_ggml_rows_to_planar(type, b, pl, 1, qk * n_blocks), MS_OK);
    assert_int_equal(ms_ggml_rows_to_planar(type, b, pl1, n_blocks, qk), MS_OK);
    assert_int_equal(ms_ggml_rows_to_planar(type, b, pl1, 1, qk + 1), MS_ERR_INVALID_ARG);
    size_t checked = 0;
    for (int k = 0; k < n_blocks; k++)
        for (int s = 0; s < Q::kQK / 32; s++) {
            float w[32], w1[32];
            Q::unit(pl, n_blocks, k, s, w);
            Q::unit(pl1 + (size_t)k * bb, 1, 0, s, w1);
            if (memcmp(w, w1, sizeof w) != 0)
                fail_msg("%s block %d unit %d: a row of one block reads otherwise", ms_ggml_type_name(type), k, s);
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
        }
    /* the GEMV's reading: the blocks as one row of n_blocks * kQK values, walked in 512-value
     * chunks by 32 lanes (ms::qlane): every value covered once, reconstructed bit-exactly, and the
     * lane's sum over an x row (x pre-scaled by 1 / nib_scale, as qgemv does) close to the float64
     * dot product of the CPU's values */
    const int in = n_blocks * Q::kQK;
    char *seen = (char *)calloc((size_t)in, 1);
    float *x = (float *)malloc(sizeof(float) * (size_t)in);
    assert_true(seen != NULL && x != NULL);
    for (int i = 0; i < in; i++)
        x[i] = (float)((double)(next_u64() >> 11) * 0x1p-53 * 2.0 - 1.0);
    double dot = 0.0, mag = 0.0, ref = 0.0;
    for (int ch = 0; ch < (in + 511) / 512; ch++)
        for (int L = 0; L < 32; L++) {
            if (!Q::lane_ok(ch, L, in))
                continue;
            float v[16], d[2], m[2];
            ms::qlane<Q>(pl, n_blocks, ch, L, v, d, m);
            for (int j = 0; j < 2; j++) {
                float t = 0.f, xsum = 0.f;
                for (int k = 0; k < 8; k++) {
                    const int i = 8 * j + k, pos = ch * 512 + Q::run0(L) + j * Q::kRun1 + k;
                    assert_true(pos >= 0 && pos < in);
                    if (seen[pos]++)
                        fail_msg("%s: value %d read by two lanes (chunk %d lane %d)", ms_ggml_type_name(type), pos,
                                 ch, L);
                    const float s = Q::kNibScaled ? ms::quant::nib_scale(i) : 1.0f;
                    const float q = v[i] / s; /* exact: v = q s, s a power of 2 */
                    const float wv = Q::kMin ? ms::quant::add_rn(ms::quant::mul_rn(d[j], q), m[j])
                                             : ms::quant::mul_rn(d[j], q);
                    const float r = want[pos];
                    if (memcmp(&wv, &r, sizeof r) != 0 && !(isnan(wv) && isnan(r)))
                        fail_msg("%s chunk %d lane %d value %d (row value %d): %.9g, CPU %.9g", ms_ggml_type_name(type),
                                 ch, L, i, pos, (double)wv, (double)r);
                    t = fmaf(v[i], x[pos] * (1.0f / s), t);
                    xsum += x[pos];
                    if (isfinite(r)) {
                        ref += (double)r * (double)x[pos];
                        mag += fabs((double)r * (double)x[pos]);
                    }
                    checked++;
                }
                dot += (double)d[j] * (double)t + (Q::kMin ? (double)m[j] * (double)xsum : 0.0);
            }
        }
    for (int i = 0; i < in; i++)
        if (!seen[i])
            fail_msg("%s: value %d of the row read by no lane", ms_ggml_type_name(type), i);
    /* the integer GEMV's lanes (kI8, ms::i8_lanes: V values a lane in two runs, chunks of 32 V);
     * random int8 x q packed as quant_x packs them; every value covered once, each run inside one
     * x block shared by kXLanes consecutive lanes, and per run d is + m xs must be the dot of the
     * CPU's values with q (fp32 rounding of d is, m xs only) */
    if constexpr (Q::kI8) {
        using I = ms::i8_lanes<Q>;
        constexpr int V = I::V, H = V / 2, C = 32 * V;
        signed char *xq = (signed char *)malloc((size_t)in);
        assert_non_null(xq);
        memset(seen, 0, (size_t)in);
        for (int i = 0; i < in; i++)
            xq[i] = (signed char)((int)(next_u64() % 255) - 127);
        for (int ch = 0; ch < (in + C - 1) / C; ch++)
            for (int L = 0; L < 32; L++) {
                if (!I::ok(ch, L, in))
                    continue;
                ms::quant::qraw r;
                I::template load<ms::quant::gmem2>(pl, n_blocks, ch, L, r);
                int xw[V / 4] = {0}, xs[2] = {0, 0}, is[2];
                float d[2], m[2];
                for (int j = 0; j < 2; j++)
                    for (int k = 0; k < H; k++) {
                        const int pos = ch * C + I::run0(L) + j * I::kRun1 + k;
                        assert_true(pos >= 0 && pos < in);
                        if (seen[pos]++)
                            fail_msg("%s integer lane: value %d read by two lanes (chunk %d lane %d)",
                                     ms_ggml_type_name(type), pos, ch, L);
                        const int first = ch * C + I::run0(L & ~(Q::kXLanes - 1)) + j * I::kRun1;
                        if (pos / 32 != first / 32 || (Q::kXOneBlock && pos / 32 != (ch * C + I::run0(L)) / 32))
                            fail_msg("%s integer lane: chunk %d lane %d run %d leaves its x block",
                                     ms_ggml_type_name(type), ch, L, j);
                        xw[(H / 4) * j + k / 4] |= (int)((unsigned)(unsigned char)xq[pos] << (8 * (k % 4)));
                        xs[j] += xq[pos];
                    }
                I::idot(r, xw, xs, is);
                I::scales(r, L, d, m);
                for (int j = 0; j < 2; j++) {
                    double exp = 0, mag = 0;
                    for (int k = 0; k < H; k++) {
                        const int pos = ch * C + I::run0(L) + j * I::kRun1 + k;
                        exp += (double)want[pos] * xq[pos];
                        mag += fabs((double)want[pos] * xq[pos]);
                    }
                    const double got = (double)d[j] * is[j] + (double)m[j] * xs[j];
                    if (isfinite(mag) && !(fabs(got - exp) <= 1e-6 * mag + 1e-30))
                        fail_msg("%s integer lane: chunk %d lane %d run %d: %.9g, CPU values %.9g",
                                 ms_ggml_type_name(type), ch, L, j, got, exp);
                }
            }
        for (int i = 0; i < in; i++)
            if (!seen[i])
                fail_msg("%s: value %d of the row read by no integer lane", ms_ggml_type_name(type), i);
        free(xq);
    }
    if (isfinite(mag) && !(fabs(dot - ref) <= 1e-5 * mag + 1e-30))
        fail_msg("%s: the lanes' dot product %.9g, float64 %.9g (sum |w x| %.3g)", ms_ggml_type_name(type), dot, ref,
                 mag);
    free(seen);
    free(x);
    printf("%s: %zu values of %d blocks (units and GEMV lanes) bit-exact with ms_ggml_dequantize\n", ms_ggml_type_name(type), checked,
           n_blocks);
    free(b);
    free(pl);
    free(pl1);
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
