/*
 * rope.cuh - rotary position embedding: frequencies (plain and Llama 3.1 scaled) and the pair
 * rotation for both layouts.
 *
 * Styles (template parameter of the RoPE kernels; the numbers match MS_ROPE_* on the host):
 *   kRopeNone (0): no rotation;
 *   kRopeNeox (1): rotate-half (Hugging Face): pair (i, i + head_dim/2), frequency i;
 *   kRopeInterleaved (2): pairs (2i, 2i+1) (llama2.c, GPT-J), frequency i.
 * Frequencies are computed in float as Hugging Face does: theta^(-2i/d), angle = pos * inv_freq.
 */
#pragma once

namespace ms {

constexpr int kRopeNone = 0;
constexpr int kRopeNeox = 1;
constexpr int kRopeInterleaved = 2;

constexpr int kRopeScalingNone = 0;
constexpr int kRopeScalingLlama3 = 1;

/* inv_freq of pair i of a head_dim-wide head. */
template <int SCALING>
__device__ __forceinline__ float rope_inv_freq(int i, int head_dim, float theta, float factor,
                                               float low_freq_factor, float high_freq_factor,
                                               float original_max_pos) {
    float inv = 1.0f / powf(theta, (float)(2 * i) / (float)head_dim);
    if (SCALING == kRopeScalingLlama3) {
        const float two_pi = 6.283185307179586f;
        float low_wavelen = original_max_pos / low_freq_factor;
        float high_wavelen = original_max_pos / high_freq_factor;
        float wavelen = two_pi / inv;
        if (wavelen > low_wavelen) {
            inv = inv / factor;
        } else if (!(wavelen < high_wavelen)) {
            float smooth = (original_max_pos / wavelen - low_freq_factor) /
                           (high_freq_factor - low_freq_factor);
            inv = (1.0f - smooth) * inv / factor + smooth * inv;
        }
    }
    return inv;
}

/* Indices of the two elements of pair i. */
template <int STYLE> __device__ __forceinline__ void rope_pair(int i, int head_dim, int &a, int &b) {
    if (STYLE == kRopeInterleaved) {
        a = 2 * i;
        b = 2 * i + 1;
    } else {
        a = i;
        b = i + head_dim / 2;
    }
}

/* (x_a, x_b) -> (x_a cos - x_b sin, x_b cos + x_a sin). */
__device__ __forceinline__ void rope_rotate(float &xa, float &xb, float c, float s) {
    float a = xa, b = xb;
    xa = a * c - b * s;
    xb = b * c + a * s;
}

} // namespace ms
