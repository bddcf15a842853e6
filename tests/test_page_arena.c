/*
 * test_page_arena.c - the device interface (host device) and the page arena: sizing (measure,
 * budget, failures naming the knob), layout and strides, the allocator (all-or-nothing acquire,
 * sink page, owner counts, double-free detection), overlap-safe page copies; reference §9 item 12.
 */
#include "ms_test.h"

#include <string.h>

#include "device.h"
#include "ms_test_impl.h"
#include "page_arena.h"

static ms_page_arena_config small_cfg(int32_t n_pages) {
    ms_page_arena_config c = {.n_layers = 3, .n_pages = n_pages, .page_size = 4,
                              .n_kv_heads = 2, .head_dim = 8, .elem_bytes = 2, .name = "t"};
    return c;
}

/* ---- device ---- */

static void test_host_device_alloc_copy_capacity(void **state) {
    (void)state;
    ms_error err = {0};
    ms_device *dev = NULL;
    assert_int_equal(ms_device_host_init(1000, &dev, &err), MS_OK);
    size_t fr = 0, tot = 0;
    assert_int_equal(ms_device_mem_info(dev, &fr, &tot, &err), MS_OK);
    assert_int_equal(fr, 1000);
    void *a = NULL, *b = NULL;
    assert_int_equal(ms_device_alloc(dev, 600, "a", &a, &err), MS_OK);
    assert_int_equal(((uintptr_t)a) % 16, 0);
    assert_int_equal(ms_device_alloc(dev, 600, "big.one", &b, &err), MS_ERR_OOM);
    assert_non_null(strstr(err.msg, "big.one"));
    assert_null(b);
    assert_int_equal(ms_device_alloc(dev, 400, "b", &b, &err), MS_OK);
    assert_int_equal(ms_device_mem_info(dev, &fr, &tot, &err), MS_OK);
    assert_int_equal(fr, 0);
    assert_int_equal(ms_device_memset(dev, a, 7, 600, NULL, &err), MS_OK);
    ms_device_stream *s = NULL;
    ms_device_event *ev = NULL;
    assert_int_equal(ms_device_stream_init(dev, &s, &err), MS_OK);
    assert_int_equal(ms_device_event_init(dev, &ev, &err), MS_OK);
    /* waiting on an event that was never recorded is a caller bug the host device reports */
    assert_int_equal(ms_device_stream_wait(dev, s, ev, &err), MS_ERR_INVALID_ARG);
    assert_int_equal(ms_device_event_record(dev, ev, s, &err), MS_OK);
    assert_int_equal(ms_device_stream_wait(dev, s, ev, &err), MS_OK);
    assert_int_equal(ms_device_copy(dev, b, a, 400, MS_COPY_D2D, s, &err), MS_OK);
    assert_int_equal(((unsigned char *)b)[399], 7);
    assert_int_equal(ms_device_copy(dev, b, a, 1, (ms_copy_kind)9, s, &err), MS_ERR_INVALID_ARG);
    assert_int_equal(ms_device_synchronize(dev, s, &err), MS_OK);
    assert_string_equal(ms_copy_kind_str(MS_COPY_D2H), "d2h");
    assert_string_equal(ms_copy_kind_str((ms_copy_kind)42), "unknown");
    ms_device_event_free(dev, ev);
    ms_device_stream_free(dev, s);
    ms_device_free_mem(dev, a);
    ms_device_free_mem(dev, b);
    ms_device_free_mem(dev, NULL);
    assert_int_equal(ms_device_mem_info(dev, &fr, &tot, &err), MS_OK);
    assert_int_equal(fr, 1000);
    ms_device_free(dev);
    ms_device_free(NULL);
}

/* ---- sizing ---- */

static void test_measure_strides_and_budget(void **state) {
    (void)state;
    ms_error err = {0};
    ms_page_arena_config c = small_cfg(10);
    ms_page_arena_size sz;
    assert_int_equal(ms_page_arena_measure(&c, &sz, &err), MS_OK);
    assert_int_equal(sz.n_pages, 10);
    assert_int_equal(sz.strides.head, 8);
    assert_int_equal(sz.strides.token, 16);
    assert_int_equal(sz.strides.kv, 64);
    assert_int_equal(sz.strides.page, 128);
    assert_int_equal(sz.strides.layer, 1280);
    assert_int_equal(sz.page_bytes, 256);
    assert_int_equal(sz.bytes, 3 * 10 * 256);
    /* from a budget: one page of every layer is 768 bytes */
    c.n_pages = 0;
    c.budget_bytes = 768 * 37 + 500;
    assert_int_equal(ms_page_arena_measure(&c, &sz, &err), MS_OK);
    assert_int_equal(sz.n_pages, 37);
    assert_true(sz.bytes <= c.budget_bytes);
    /* a budget too small names the knob */
    c.budget_bytes = 768;
    assert_int_equal(ms_page_arena_measure(&c, &sz, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "kv_budget_bytes"));
    c.budget_bytes = 0;
    assert_int_equal(ms_page_arena_measure(&c, &sz, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "kv_num_pages"));
    c = small_cfg(10);
    c.head_dim = 0;
    assert_int_equal(ms_page_arena_measure(&c, &sz, &err), MS_ERR_INVALID_ARG);
    c = small_cfg(10);
    c.elem_bytes = 3;
    assert_int_equal(ms_page_arena_measure(&c, &sz, &err), MS_ERR_INVALID_ARG);
    c = small_cfg(10);
    c.layout = MS_KV_LAYOUT_COUNT;
    assert_int_equal(ms_page_arena_measure(&c, &sz, &err), MS_ERR_UNSUPPORTED);
    c = small_cfg(INT32_MAX);
    c.n_layers = INT32_MAX;
    c.head_dim = INT32_MAX;
    assert_int_equal(ms_page_arena_measure(&c, &sz, &err), MS_ERR_LIMIT);
}

static void test_init_device_oom_names_knob(void **state) {
    (void)state;
    ms_error err = {0};
    ms_device *dev = NULL;
    assert_int_equal(ms_device_host_init(5000, &dev, &err), MS_OK);
    ms_page_arena_config c = small_cfg(10); /* 7680 bytes */
    ms_page_arena *a = NULL;
    assert_int_equal(ms_page_arena_init(&c, dev, &a, &err), MS_ERR_OOM);
    assert_null(a);
    assert_non_null(strstr(err.msg, "kv_num_pages"));
    assert_non_null(strstr(err.msg, "kv.pages"));
    /* sized from what the device reports free: fits */
    size_t fr = 0, tot = 0;
    assert_int_equal(ms_device_mem_info(dev, &fr, &tot, &err), MS_OK);
    c.n_pages = 0;
    c.budget_bytes = fr - 768; /* leave room for the copy staging buffer */
    assert_int_equal(ms_page_arena_init(&c, dev, &a, &err), MS_OK);
    assert_int_equal(ms_page_arena_num_pages(a), 5);
    ms_page_arena_free(a);
    /* host allocation failures during init leak nothing */
    for (int64_t nth = 1; nth < 12; nth++) {
        c = small_cfg(4);
        ms_alloc_fail_nth(nth);
        ms_status st = ms_page_arena_init(&c, dev, &a, &err);
        ms_alloc_fail_nth(0);
        if (st == MS_OK)
            ms_page_arena_free(a);
        else
            assert_int_equal(st, MS_ERR_OOM);
    }
    ms_device_free(dev);
}

/* ---- allocator ---- */

static void test_arena_round_trip_and_sink(void **state) {
    (void)state;
    ms_error err = {0};
    ms_device *dev = NULL;
    assert_int_equal(ms_device_host_init(0, &dev, &err), MS_OK);
    ms_page_arena_config c = small_cfg(6);
    ms_page_arena *a = NULL;
    assert_int_equal(ms_page_arena_init(&c, dev, &a, &err), MS_OK);
    assert_int_equal(ms_page_arena_num_free(a), 5);
    assert_int_equal(ms_page_arena_owners(a, MS_SINK_PAGE), 1);
    assert_int_equal(ms_page_arena_owners(a, 6), -1);
    int32_t p[6] = {0};
    assert_int_equal(ms_page_arena_acquire(a, 3, p), MS_OK);
    assert_int_equal(p[0], 1);
    assert_int_equal(p[1], 2);
    assert_int_equal(p[2], 3);
    /* shortfall: nothing taken */
    int32_t q[6] = {-1, -1, -1, -1, -1, -1};
    assert_int_equal(ms_page_arena_acquire(a, 3, q), MS_ERR_CAPACITY);
    assert_int_equal(q[0], -1);
    assert_int_equal(ms_page_arena_num_free(a), 2);
    assert_int_equal(ms_page_arena_acquire(a, 0, q), MS_OK);
    assert_int_equal(ms_page_arena_release(a, p, 3, &err), MS_OK);
    assert_int_equal(ms_page_arena_num_free(a), 5);
    /* all pages: the sink is never among them */
    assert_int_equal(ms_page_arena_acquire(a, 5, q), MS_OK);
    for (int i = 0; i < 5; i++) {
        assert_int_not_equal(q[i], MS_SINK_PAGE);
        assert_int_equal(ms_page_arena_owners(a, q[i]), 1);
    }
    assert_int_equal(ms_page_arena_num_free(a), 0);
    assert_int_equal(ms_page_arena_release(a, q, 5, &err), MS_OK);
    ms_page_arena_free(a);
    ms_device_free(dev);
}

static void test_release_detects_double_free_and_changes_nothing(void **state) {
    (void)state;
    ms_error err = {0};
    ms_device *dev = NULL;
    assert_int_equal(ms_device_host_init(0, &dev, &err), MS_OK);
    ms_page_arena_config c = small_cfg(8);
    ms_page_arena *a = NULL;
    assert_int_equal(ms_page_arena_init(&c, dev, &a, &err), MS_OK);
    int32_t p[3];
    assert_int_equal(ms_page_arena_acquire(a, 3, p), MS_OK);
    int32_t twice[] = {p[0], p[1], p[0]};
    assert_int_equal(ms_page_arena_release(a, twice, 3, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "double free"));
    assert_int_equal(ms_page_arena_num_free(a), 4);
    assert_int_equal(ms_page_arena_owners(a, p[0]), 1);
    int32_t sink[] = {p[2], MS_SINK_PAGE};
    assert_int_equal(ms_page_arena_release(a, sink, 2, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "sink"));
    int32_t bad[] = {99};
    assert_int_equal(ms_page_arena_release(a, bad, 1, &err), MS_ERR_INVALID_ARG);
    assert_int_equal(ms_page_arena_num_free(a), 4);
    /* shared pages: freed on the last release */
    assert_int_equal(ms_page_arena_retain(a, p, 1, &err), MS_OK);
    assert_int_equal(ms_page_arena_owners(a, p[0]), 2);
    assert_int_equal(ms_page_arena_release(a, p, 3, &err), MS_OK);
    assert_int_equal(ms_page_arena_num_free(a), 6);
    assert_int_equal(ms_page_arena_owners(a, p[0]), 1);
    assert_int_equal(ms_page_arena_release(a, p, 1, &err), MS_OK);
    assert_int_equal(ms_page_arena_release(a, p, 1, &err), MS_ERR_INVALID_ARG);
    assert_int_equal(ms_page_arena_retain(a, p, 1, &err), MS_ERR_INVALID_ARG); /* free page */
    assert_int_equal(ms_page_arena_retain(a, sink + 1, 1, &err), MS_ERR_INVALID_ARG);
    assert_int_equal(ms_page_arena_num_free(a), 7);
    ms_page_arena_free(a);
    ms_device_free(dev);
}

/* ---- layout and copies ---- */

static uint16_t cell(int32_t layer, int32_t page, int kv, int32_t slot, int32_t e) {
    return (uint16_t)(layer * 10000 + page * 100 + kv * 50 + slot * 10 + e);
}

static void fill(ms_page_arena *a) {
    const ms_page_arena_config *c = ms_page_arena_get_config(a);
    for (int32_t l = 0; l < c->n_layers; l++)
        for (int32_t p = 0; p < c->n_pages; p++)
            for (int kv = 0; kv < 2; kv++)
                for (int32_t s = 0; s < c->page_size; s++) {
                    uint16_t *t = ms_page_arena_token_ptr(a, l, p, kv, s);
                    for (int32_t e = 0; e < c->n_kv_heads * c->head_dim; e++)
                        t[e] = cell(l, p, kv, s, e);
                }
}

/* True when page `page` holds what page `was` was filled with. */
static bool page_holds(ms_page_arena *a, int32_t page, int32_t was) {
    const ms_page_arena_config *c = ms_page_arena_get_config(a);
    for (int32_t l = 0; l < c->n_layers; l++)
        for (int kv = 0; kv < 2; kv++)
            for (int32_t s = 0; s < c->page_size; s++) {
                const uint16_t *t = ms_page_arena_token_ptr(a, l, page, kv, s);
                for (int32_t e = 0; e < c->n_kv_heads * c->head_dim; e++)
                    if (t[e] != cell(l, was, kv, s, e))
                        return false;
            }
    return true;
}

static void test_layout_is_nhd_k_then_v(void **state) {
    (void)state;
    ms_error err = {0};
    ms_device *dev = NULL;
    assert_int_equal(ms_device_host_init(0, &dev, &err), MS_OK);
    ms_page_arena_config c = small_cfg(4);
    ms_page_arena *a = NULL;
    assert_int_equal(ms_page_arena_init(&c, dev, &a, &err), MS_OK);
    const ms_page_arena_size *sz = ms_page_arena_get_size(a);
    char *base = ms_page_arena_data(a);
    /* [layers, pages, 2, ps, H, D] in elements of 2 bytes */
    char *tok = ms_page_arena_token_ptr(a, 2, 3, 1, 2);
    size_t elems = 2 * sz->strides.layer + 3 * sz->strides.page + sz->strides.kv +
                   2 * sz->strides.token;
    assert_ptr_equal(tok, base + elems * 2);
    /* zero-initialised */
    for (size_t i = 0; i < sz->bytes; i++)
        assert_int_equal(base[i], 0);
    assert_ptr_equal(ms_page_arena_device(a), dev);
    assert_int_equal(ms_page_arena_page_size(a), 4);
    ms_page_arena_free(a);
    ms_device_free(dev);
}

static void test_copy_pages_overlap_safe(void **state) {
    (void)state;
    ms_error err = {0};
    ms_device *dev = NULL;
    assert_int_equal(ms_device_host_init(0, &dev, &err), MS_OK);
    ms_page_arena_config c = small_cfg(10);
    ms_page_arena *a = NULL;
    assert_int_equal(ms_page_arena_init(&c, dev, &a, &err), MS_OK);
    /* plain copy */
    fill(a);
    int32_t s1[] = {1, 2}, d1[] = {5, 6};
    assert_int_equal(ms_page_arena_copy_pages(a, s1, d1, 2, NULL, &err), MS_OK);
    assert_true(page_holds(a, 5, 1) && page_holds(a, 6, 2) && page_holds(a, 1, 1));
    /* chain: 1->2, 2->3, 3->4 (a naive loop would smear page 1) */
    fill(a);
    int32_t s2[] = {1, 2, 3}, d2[] = {2, 3, 4};
    assert_int_equal(ms_page_arena_copy_pages(a, s2, d2, 3, NULL, &err), MS_OK);
    assert_true(page_holds(a, 2, 1) && page_holds(a, 3, 2) && page_holds(a, 4, 3));
    /* cycle of three plus a self copy and a fan-out from a cycle member */
    fill(a);
    int32_t s3[] = {1, 2, 3, 7, 1}, d3[] = {2, 3, 1, 7, 8};
    assert_int_equal(ms_page_arena_copy_pages(a, s3, d3, 5, NULL, &err), MS_OK);
    assert_true(page_holds(a, 2, 1) && page_holds(a, 3, 2) && page_holds(a, 1, 3));
    assert_true(page_holds(a, 7, 7) && page_holds(a, 8, 1));
    /* two disjoint swaps: the staging buffer is reused */
    fill(a);
    int32_t s4[] = {1, 2, 4, 5}, d4[] = {2, 1, 5, 4};
    assert_int_equal(ms_page_arena_copy_pages(a, s4, d4, 4, NULL, &err), MS_OK);
    assert_true(page_holds(a, 1, 2) && page_holds(a, 2, 1) && page_holds(a, 4, 5) &&
                page_holds(a, 5, 4));
    assert_true(page_holds(a, 9, 9));
    /* invalid: duplicate destination, id out of range; nothing copied */
    fill(a);
    int32_t s5[] = {1, 2}, d5[] = {3, 3};
    assert_int_equal(ms_page_arena_copy_pages(a, s5, d5, 2, NULL, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "two copies"));
    int32_t s6[] = {1}, d6[] = {10};
    assert_int_equal(ms_page_arena_copy_pages(a, s6, d6, 1, NULL, &err), MS_ERR_INVALID_ARG);
    assert_true(page_holds(a, 3, 3));
    /* still usable after the errors */
    int32_t s7[] = {4}, d7[] = {3};
    assert_int_equal(ms_page_arena_copy_pages(a, s7, d7, 1, NULL, &err), MS_OK);
    assert_true(page_holds(a, 3, 4));
    ms_page_arena_free(a);
    ms_device_free(dev);
}

/* Random permutations and fan-outs against a reference built on the host. */
static void test_copy_pages_random_parallel_assignments(void **state) {
    (void)state;
    ms_error err = {0};
    ms_device *dev = NULL;
    assert_int_equal(ms_device_host_init(0, &dev, &err), MS_OK);
    ms_page_arena_config c = small_cfg(24);
    c.n_layers = 1;
    ms_page_arena *a = NULL;
    assert_int_equal(ms_page_arena_init(&c, dev, &a, &err), MS_OK);
    uint64_t rng = 12345;
    for (int round = 0; round < 300; round++) {
        fill(a);
        int32_t perm[24], src[24], dst[24];
        for (int i = 0; i < 24; i++)
            perm[i] = i;
        for (int i = 23; i > 0; i--) {
            rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
            int j = (int)((rng >> 33) % (uint64_t)(i + 1));
            int32_t tmp = perm[i];
            perm[i] = perm[j];
            perm[j] = tmp;
        }
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        int n = 1 + (int)((rng >> 33) % 23);
        for (int i = 0; i < n; i++) {
            dst[i] = perm[i];
            rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
            src[i] = (int32_t)((rng >> 33) % 24);
        }
        assert_int_equal(ms_page_arena_copy_pages(a, src, dst, n, NULL, &err), MS_OK);
        for (int32_t p = 0; p < 24; p++) {
            int32_t was = p;
            for (int i = 0; i < n; i++)
                if (dst[i] == p)
                    was = src[i];
            assert_true(page_holds(a, p, was));
        }
    }
    ms_page_arena_free(a);
    ms_device_free(dev);
}

static void test_copy_across_arenas(void **state) {
    (void)state;
    ms_error err = {0};
    ms_device *dev = NULL;
    assert_int_equal(ms_device_host_init(0, &dev, &err), MS_OK);
    ms_page_arena_config c = small_cfg(6);
    ms_page_arena *a = NULL, *b = NULL, *odd = NULL;
    assert_int_equal(ms_page_arena_init(&c, dev, &a, &err), MS_OK);
    c.n_pages = 3;
    assert_int_equal(ms_page_arena_init(&c, dev, &b, &err), MS_OK);
    c.head_dim = 4;
    assert_int_equal(ms_page_arena_init(&c, dev, &odd, &err), MS_OK);
    fill(a);
    int32_t src[] = {4, 5}, dst[] = {2, 1};
    assert_int_equal(ms_page_arena_copy_across(a, src, b, dst, 2, MS_COPY_D2H, NULL, &err), MS_OK);
    assert_int_equal(ms_page_arena_copy_across(b, dst, a, (int32_t[]){1, 2}, 2, MS_COPY_H2D,
                                               NULL, &err), MS_OK);
    assert_true(page_holds(a, 1, 4) && page_holds(a, 2, 5));
    assert_int_equal(ms_page_arena_copy_across(a, src, odd, dst, 2, MS_COPY_D2H, NULL, &err),
                     MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "geometry"));
    assert_int_equal(ms_page_arena_copy_across(a, src, b, (int32_t[]){3, 1}, 2, MS_COPY_D2H,
                                               NULL, &err), MS_ERR_INVALID_ARG);
    ms_page_arena_free(a);
    ms_page_arena_free(b);
    ms_page_arena_free(odd);
    ms_device_free(dev);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_host_device_alloc_copy_capacity),
        ms_unit_test(test_measure_strides_and_budget),
        ms_unit_test(test_init_device_oom_names_knob),
        ms_unit_test(test_arena_round_trip_and_sink),
        ms_unit_test(test_release_detects_double_free_and_changes_nothing),
        ms_unit_test(test_layout_is_nhd_k_then_v),
        ms_unit_test(test_copy_pages_overlap_safe),
        ms_unit_test(test_copy_pages_random_parallel_assignments),
        ms_unit_test(test_copy_across_arenas),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
