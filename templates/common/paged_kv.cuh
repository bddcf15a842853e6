/*
 * paged_kv.cuh - addressing of one layer's page arena [n_pages, 2, PS, n_kv_heads, HD] (NHD).
 *
 * Offsets are 64-bit: a layer of a large pool holds more than 2^31 elements.
 */
#pragma once

namespace ms {

template <typename T, int HD, int PS> struct paged_kv {
    T *base;      /* this layer's arena */
    int kv_heads; /* heads per token row */

    __device__ __forceinline__ long long token_stride() const { return (long long)kv_heads * HD; }
    __device__ __forceinline__ long long page_stride() const { return 2LL * PS * kv_heads * HD; }
    /* K row of head h at (page, slot). */
    __device__ __forceinline__ T *k_ptr(int page, int slot, int h) const {
        return base + (long long)page * page_stride() + (long long)slot * token_stride() +
               (long long)h * HD;
    }
    /* V row of head h at (page, slot). */
    __device__ __forceinline__ T *v_ptr(int page, int slot, int h) const {
        return k_ptr(page, slot, h) + (long long)PS * token_stride();
    }
};

/* Number of keys of view b (0 when it has no pages). */
template <int PS>
__device__ __forceinline__ int view_length(const int *kv_indptr, const int *kv_last_page_len,
                                           int b) {
    int n_pages = kv_indptr[b + 1] - kv_indptr[b];
    return n_pages == 0 ? 0 : (n_pages - 1) * PS + kv_last_page_len[b];
}

} // namespace ms
