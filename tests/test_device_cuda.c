/*
 * test_device_cuda.c - the CUDA device (device_cuda.h). Runs in CI without a GPU: there,
 * ms_device_cuda_init must fail with MS_ERR_CUDA and one message naming the device ("cuda:0") and
 * the reason, leaving nothing allocated; a bad ordinal names itself. On a machine with a GPU the
 * same binary checks the device for real: memset, copies in every direction on the synchronous
 * (NULL) stream and on a stream ordered by an event, mem_info, and an allocation larger than the
 * GPU failing with MS_ERR_OOM naming the buffer.
 */
#include "ms_test.h"

#include <stdint.h>
#include <string.h>

#include "backend_cuda.h"
#include "device_cuda.h"

#include "ms_test_impl.h"

static void test_init_without_gpu_names_the_device(void **state) {
    (void)state;
    if (ms_backend_cuda_available())
        skip();
    ms_device *dev = (ms_device *)1;
    ms_error err = {0};
    assert_int_equal(ms_device_cuda_init(0, &dev, &err), MS_ERR_CUDA);
    assert_null(dev);
    assert_non_null(strstr(err.msg, "cuda:0: no usable CUDA device ("));
    assert_null(strchr(err.msg, '\n'));
}

static void test_bad_ordinal_names_itself(void **state) {
    (void)state;
    ms_device *dev = NULL;
    ms_error err = {0};
    assert_int_equal(ms_device_cuda_init(4096, &dev, &err), MS_ERR_CUDA);
    assert_null(dev);
    assert_non_null(strstr(err.msg, "cuda:4096"));
    assert_int_equal(ms_device_cuda_init(-1, &dev, &err), MS_ERR_CUDA);
    assert_non_null(strstr(err.msg, "cuda:-1"));
}

static void test_copies_and_streams_on_gpu(void **state) {
    (void)state;
    if (!ms_backend_cuda_available())
        skip();
    ms_device *dev = NULL;
    ms_error err = {0};
    assert_int_equal(ms_device_cuda_init(0, &dev, &err), MS_OK);
    assert_string_equal(dev->iface->name, "cuda:0");
    size_t fr = 0, tot = 0;
    assert_int_equal(ms_device_mem_info(dev, &fr, &tot, &err), MS_OK);
    assert_true(fr > 0 && fr <= tot);

    enum { N = 1 << 16 };
    uint8_t *h = ms_malloc(N), *back = ms_malloc(N);
    assert_non_null(h);
    assert_non_null(back);
    for (int i = 0; i < N; i++)
        h[i] = (uint8_t)(i * 7 + 3);
    void *a = NULL, *b = NULL;
    assert_int_equal(ms_device_alloc(dev, N, "t.a", &a, &err), MS_OK);
    assert_int_equal(ms_device_alloc(dev, N, "t.b", &b, &err), MS_OK);
    /* synchronous: memset, then read back */
    assert_int_equal(ms_device_memset(dev, a, 0x5a, N, NULL, &err), MS_OK);
    assert_int_equal(ms_device_copy(dev, back, a, N, MS_COPY_D2H, NULL, &err), MS_OK);
    for (int i = 0; i < N; i++)
        assert_int_equal(back[i], 0x5a);
    /* ordered: h2d on s1, event, d2d + d2h on s2 after the event */
    ms_device_stream *s1 = NULL, *s2 = NULL;
    ms_device_event *ev = NULL;
    assert_int_equal(ms_device_stream_init(dev, &s1, &err), MS_OK);
    assert_int_equal(ms_device_stream_init(dev, &s2, &err), MS_OK);
    assert_int_equal(ms_device_event_init(dev, &ev, &err), MS_OK);
    assert_int_equal(ms_device_copy(dev, a, h, N, MS_COPY_H2D, s1, &err), MS_OK);
    assert_int_equal(ms_device_event_record(dev, ev, s1, &err), MS_OK);
    assert_int_equal(ms_device_stream_wait(dev, s2, ev, &err), MS_OK);
    assert_int_equal(ms_device_copy(dev, b, a, N, MS_COPY_D2D, s2, &err), MS_OK);
    memset(back, 0, N);
    assert_int_equal(ms_device_copy(dev, back, b, N, MS_COPY_D2H, s2, &err), MS_OK);
    assert_int_equal(ms_device_synchronize(dev, s2, &err), MS_OK);
    assert_memory_equal(back, h, N);
    assert_int_equal(ms_device_synchronize(dev, NULL, &err), MS_OK);
    /* an allocation beyond the GPU names the buffer */
    void *big = NULL;
    assert_int_equal(ms_device_alloc(dev, tot * 2, "t.too_big", &big, &err), MS_ERR_OOM);
    assert_null(big);
    assert_non_null(strstr(err.msg, "t.too_big"));
    ms_device_event_free(dev, ev);
    ms_device_stream_free(dev, s1);
    ms_device_stream_free(dev, s2);
    ms_device_free_mem(dev, a);
    ms_device_free_mem(dev, b);
    ms_device_free(dev);
    ms_free(h);
    ms_free(back);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_init_without_gpu_names_the_device),
        ms_unit_test(test_bad_ordinal_names_itself),
        ms_unit_test(test_copies_and_streams_on_gpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
