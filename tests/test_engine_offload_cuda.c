/*
 * test_engine_offload_cuda.c - KV pressure on the GPU (GPU_TESTS: `make gpu-test`): the host tier
 * in pinned memory (device_cuda.h ms_device_cuda_host_init, cudaHostAlloc), offload / reload
 * copies between it and the device arena, recompute-preemption, and --gpu-memory-fraction's
 * sizing (engine.h gpu_memory_fraction). hf/llama_gqa on device cuda (bf16): six greedy requests
 * under a 12-page arena give the same ids as under a large one (the GPU's rows need not be
 * bitwise batch-independent, so ids, not logits, are compared), the counters show offloads,
 * reloads and preemptions, and every device and host page is free at the end.
 * MS_OFFLOAD_DEVICE=cpu runs the same logic on the CPU backend (a dry run without a GPU; the
 * gpu_memory_fraction case then checks the refusal instead).
 */
#include "ms_test.h"
#include "ms_test_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

extern const ms_model_desc ms_llama_desc;

#define N_REQ 6
#define MAX_NEW 20
#define VOCAB 512 /* hf/llama_gqa */

static const char *test_device(void) {
    const char *d = getenv("MS_OFFLOAD_DEVICE");
    return d != NULL && d[0] != '\0' ? d : "cuda";
}

typedef struct run_out {
    int32_t ids[N_REQ][MAX_NEW];
    ms_engine_kv_stats kv;
} run_out;

static ms_engine *open_engine(int32_t kv_pages, int32_t host_pages, double fraction) {
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture("hf/llama_gqa");
    o.device = test_device();
    o.dtype = "bf16";
    o.page_size = 4;
    o.max_seqs = N_REQ;
    o.max_tokens = 64;
    o.kv_pages = kv_pages;
    o.host_kv_pages = host_pages;
    o.gpu_memory_fraction = fraction;
    o.n_threads = 2;
    ms_engine *e = NULL;
    ms_error err = {0};
    if (ms_engine_init(&e, &ms_llama_desc, &o, &err) != MS_OK)
        fail_msg("init on %s: %s", o.device, err.msg);
    return e;
}

/* N_REQ greedy requests of 6 + 2i prompt ids, all added at once, finished ones removed. */
static void run_all(ms_engine *e, run_out *out) {
    memset(out, 0, sizeof *out);
    ms_error err = {0};
    const int32_t free0 = ms_engine_kv_pages_free(e);
    ms_rid rids[N_REQ];
    bool live[N_REQ];
    for (int i = 0; i < N_REQ; i++) {
        int32_t p[32];
        int32_t np = 6 + 2 * i;
        for (int32_t t = 0; t < np; t++)
            p[t] = (int32_t)((7 + 31 * i + 13 * t) % (VOCAB - 3)) + 3;
        ms_engine_request rq = {.prompt = p, .n_prompt = np, .max_new_tokens = MAX_NEW,
                                .sampling = ms_sampling_greedy(), .ignore_eos = true,
                                .prefill_chunk = i == 1 ? 4 : 0};
        if (ms_engine_add(e, &rq, &rids[i], &err) != MS_OK)
            fail_msg("add %d: %s", i, err.msg);
        live[i] = true;
    }
    int steps = 0;
    while (ms_engine_n_active(e) > 0) {
        assert_true(steps++ < 2000);
        if (ms_engine_step(e, NULL, &err) != MS_OK)
            fail_msg("step %d: %s", steps, err.msg);
        for (int i = 0; i < N_REQ; i++) {
            const int32_t *ids;
            int32_t n;
            ms_finish_reason why;
            if (!live[i])
                continue;
            assert_int_equal(ms_engine_output(e, rids[i], &ids, &n, &why), MS_OK);
            if (why != MS_FINISH_NONE) {
                assert_int_equal(n, MAX_NEW);
                memcpy(out->ids[i], ids, (size_t)n * sizeof(int32_t));
                ms_engine_remove(e, rids[i]);
                live[i] = false;
            }
        }
    }
    ms_engine_get_kv_stats(e, &out->kv);
    assert_int_equal(ms_engine_kv_pages_free(e), free0);
    assert_int_equal(out->kv.host_pages_free, out->kv.host_pages);
}

static void expect_same(const run_out *a, const run_out *b) {
    for (int i = 0; i < N_REQ; i++)
        for (int t = 0; t < MAX_NEW; t++)
            if (a->ids[i][t] != b->ids[i][t])
                fail_msg("request %d id %d: %d vs %d", i, t, a->ids[i][t], b->ids[i][t]);
}

static void test_offload_pinned(void **state) {
    (void)state;
    run_out big, small, full;
    ms_engine *e = open_engine(0, 0, 0);
    run_all(e, &big);
    ms_engine_free(e);
    e = open_engine(13, 64, 0); /* offload and reload only */
    run_all(e, &small);
    ms_engine_free(e);
    e = open_engine(13, 5, 0); /* the host tier full too: recompute-preemption */
    run_all(e, &full);
    ms_engine_free(e);
    assert_true(small.kv.offloads > 0);
    assert_int_equal(small.kv.reloads, small.kv.offloads);
    assert_int_equal(small.kv.preemptions, 0);
    assert_true(full.kv.preemptions > 0);
    expect_same(&big, &small);
    expect_same(&big, &full);
    printf("%s: %lld offloads (%lld pages) and %lld reloads; host tier full: %lld preemptions\n",
           test_device(), (long long)small.kv.offloads, (long long)small.kv.pages_offloaded,
           (long long)small.kv.reloads, (long long)full.kv.preemptions);
}

/* gpu_memory_fraction sizes the arena from free memory; requests run on it. */
static void test_gpu_memory_fraction(void **state) {
    (void)state;
    if (strcmp(test_device(), "cuda") != 0) {
        ms_engine_options o = ms_engine_options_default();
        o.model_path = ms_test_fixture("hf/llama_gqa");
        o.device = test_device();
        o.gpu_memory_fraction = 0.5;
        ms_engine *e = NULL;
        ms_error err = {0};
        assert_int_equal(ms_engine_init(&e, &ms_llama_desc, &o, &err), MS_ERR_UNSUPPORTED);
        return;
    }
    ms_engine *e = open_engine(0, 0, 0.5);
    const int32_t pages = ms_engine_kv_pages_free(e);
    /* one page of hf/llama_gqa: 3 layers x 2 x 4 tokens x 2 heads x 16 x bf16 = 1536 bytes */
    printf("gpu_memory_fraction 0.5: %d KV pages (%.2f GB)\n", (int)pages,
           (double)ms_engine_kv_bytes(e) / 1e9);
    assert_true(pages > 1000);
    run_out r;
    run_all(e, &r);
    ms_engine_free(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_offload_pinned),
        ms_unit_test(test_gpu_memory_fraction),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
