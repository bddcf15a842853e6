/*
 * test_nccl.c - NCCL communicators (backends/nccl_comm.h) and the tensor-parallel allocation
 * check over them. Without a GPU (CI): the library loads lazily and reports its version, bad
 * arguments fail with one line, nothing crashes. With a GPU (MS_NCCL_GPU=1, scripts/gpu-batch.sh):
 * a one-rank group on device 0: the host all_gather, an in-place all-reduce of f32 and bf16, and
 * ms_tp_check_allocation over NCCL. Several ranks need several GPUs (issue [K]): not here.
 */
#include "ms_test.h"

#include <stdlib.h>
#include <string.h>

#include "cuda_check.h"
#include "kv_test_util.h"
#include "ms_test_impl.h"
#include "nccl_comm.h"
#include "tp_check.h"

static bool gpu_wanted(void) {
    const char *g = getenv("MS_NCCL_GPU");
    return g != NULL && strcmp(g, "1") == 0;
}

static void test_library_and_bad_arguments(void **state) {
    (void)state;
    ms_error err = {0};
    int version = 0;
    if (!ms_nccl_available(&version)) {
        ms_nccl_id id;
        assert_int_equal(ms_nccl_unique_id(&id, &err), MS_ERR_UNSUPPORTED);
        assert_non_null(strstr(err.msg, "libnccl"));
        print_message("NCCL not loadable here: %s\n", err.msg);
        return;
    }
    print_message("NCCL %d loaded lazily\n", version);
    assert_true(version > 0);
    assert_string_equal(getenv("NCCL_NVLS_ENABLE"), "0");
    ms_nccl_comm *c = NULL;
    ms_nccl_id id = {{0}};
    assert_int_equal(ms_nccl_comm_init(0, 2, 2, &id, 64, &c, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "rank 2 of 2"));
    assert_int_equal(ms_nccl_comm_init(0, 0, 1, NULL, 64, &c, &err), MS_ERR_INVALID_ARG);
    assert_int_equal(ms_nccl_comm_init(0, 0, 1, &id, 0, &c, &err), MS_ERR_INVALID_ARG);
    assert_null(c);
    ms_nccl_comm_free(NULL);
}

static void test_one_rank_on_the_gpu(void **state) {
    (void)state;
    if (!gpu_wanted()) {
        print_message("skipped: set MS_NCCL_GPU=1 on a machine with a GPU\n");
        return;
    }
    ms_error err = {0};
    ms_nccl_id id;
    assert_int_equal(ms_nccl_unique_id(&id, &err), MS_OK);
    ms_nccl_comm *c = NULL;
    if (ms_nccl_comm_init(0, 0, 1, &id, 256, &c, &err) != MS_OK)
        fail_msg("comm init: %s", err.msg);
    ms_collective col = ms_nccl_collective(c);
    int32_t mine[4] = {7, 8, 9, 10}, got[4] = {0};
    assert_int_equal(ms_collective_all_gather(&col, mine, sizeof mine, got, &err), MS_OK);
    assert_memory_equal(mine, got, sizeof mine);
    char big[512] = {0};
    assert_int_equal(ms_collective_all_gather(&col, big, sizeof big, big, &err),
                     MS_ERR_INVALID_ARG);
    /* in-place sum over one rank leaves the values */
    float h[1000];
    for (int i = 0; i < 1000; i++)
        h[i] = (float)i * 0.5f;
    void *d = NULL;
    assert_int_equal(cudaMalloc(&d, sizeof h), cudaSuccess);
    assert_int_equal(cudaMemcpy(d, h, sizeof h, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(ms_nccl_all_reduce_sum(c, d, 1000, MS_DTYPE_F32, NULL, &err), MS_OK);
    float back[1000];
    assert_int_equal(cudaMemcpy(back, d, sizeof back, cudaMemcpyDeviceToHost), cudaSuccess);
    assert_memory_equal(h, back, sizeof h);
    assert_int_equal(ms_nccl_all_reduce_sum(c, d, 500, MS_DTYPE_BF16, NULL, &err), MS_OK);
    assert_int_equal(ms_nccl_all_reduce_sum(c, d, 10, MS_DTYPE_I32, NULL, &err),
                     MS_ERR_INVALID_ARG);
    cudaFree(d);
    /* the allocation check over NCCL */
    kv_fix f;
    kv_fix_init(&f, 32, 8, 0);
    kv_ingest(&f, 1);
    kv_extend(&f, 1, MS_LABEL_MAIN, 20);
    if (ms_tp_check_allocation(&col, f.pool, "after warm-up", &err) != MS_OK)
        fail_msg("tp check: %s", err.msg);
    kv_fix_free(&f);
    ms_nccl_comm_free(c);
    print_message("one rank on device 0: all_gather, all-reduce f32/bf16, tp check over NCCL\n");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_library_and_bad_arguments),
        ms_unit_test(test_one_rank_on_the_gpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
