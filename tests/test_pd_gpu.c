/*
 * test_pd_gpu.c - [pd] the GPU KV transfers (engine/pd_gpu.h) at the interface level:
 * WRITTEN WITHOUT A GPU, NEVER RUN YET (run by scripts/gpu-batch.sh's pd-gpu step).
 *   - CUDA IPC: a parent process fills pages of its CUDA arena with a known pattern (a function
 *     of page, layer and byte) and exports the arena; a child process (forked before either
 *     touches CUDA) opens it and pulls remote pages [3, 1, 4] into its own pages [2, 5, 6]
 *     through ms_pd_ipc_iface() (start, poll, wait, release); every byte equals the pattern of
 *     the source page and the untouched local page 3 is still zero;
 *   - NCCL send/recv (2 GPUs): rank 0 sends a published stream of pages [3, 1] of its arena,
 *     rank 1 receives them into pages [4, 2] of its own, the first page it already holds
 *     (token_begin on page 1) going to the staging buffer: page 4 stays zero, page 2 equals
 *     rank 0's page 1.
 *   - the engine's handover on CUDA over the host transfer (engine.h ms_engine_pd_publish /
 *     ms_engine_pd_admit, hf/llama_gqa, bf16): 3 greedy requests prefilled together on engine P,
 *     handed over through the record's bytes, decoded together on engine D give the ids of one
 *     engine running them together (the same batches step by step, so the same rows), and
 *     every page is free on both at the end.
 * Skips (saying why) without a GPU, with one GPU (the NCCL case) or without NCCL.
 */
#include "ms_test.h"
#include "ms_test_impl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cuda_check.h"
#include "device_cuda.h"
#include "engine.h"
#include "nccl_comm.h"
#include "page_arena.h"
#include "pd.h"
#include "pd_gpu.h"

extern const ms_model_desc ms_llama_desc;

#define LAYERS 3
#define PAGES 8
#define PS 4

static uint8_t pattern(int32_t page, int32_t layer, size_t i) {
    return (uint8_t)(page * 31 + layer * 7 + (int)(i % 251) + 1);
}

static ms_page_arena *arena_on(ms_device *dev) {
    ms_page_arena_config c = {.n_layers = LAYERS, .n_pages = PAGES, .page_size = PS,
                              .n_kv_heads = 2, .head_dim = 8, .elem_bytes = 2,
                              .layout = MS_KV_LAYOUT_NHD, .name = "pd"};
    ms_page_arena *a = NULL;
    ms_error err = {0};
    if (ms_page_arena_init(&c, dev, &a, &err) != MS_OK)
        fail_msg("arena: %s", err.msg);
    return a;
}

static void fill(ms_page_arena *a, int32_t page) {
    size_t pb = ms_page_arena_get_size(a)->page_bytes;
    uint8_t *h = malloc(pb);
    assert_non_null(h);
    for (int32_t l = 0; l < LAYERS; l++) {
        for (size_t i = 0; i < pb; i++)
            h[i] = pattern(page, l, i);
        assert_int_equal(cudaMemcpy(ms_page_arena_token_ptr(a, l, page, 0, 0), h, pb,
                                    cudaMemcpyHostToDevice), cudaSuccess);
    }
    free(h);
}

/* 1 when every layer of page `page` holds src's pattern (src < 0: zeros). */
static int holds(ms_page_arena *a, int32_t page, int32_t src) {
    size_t pb = ms_page_arena_get_size(a)->page_bytes;
    uint8_t *h = malloc(pb);
    int ok = h != NULL;
    for (int32_t l = 0; l < LAYERS && ok; l++) {
        ok = cudaMemcpy(h, ms_page_arena_token_ptr(a, l, page, 0, 0), pb,
                        cudaMemcpyDeviceToHost) == cudaSuccess;
        for (size_t i = 0; i < pb && ok; i++)
            ok = h[i] == (src < 0 ? 0 : pattern(src, l, i));
    }
    free(h);
    return ok;
}

static int gpu_count(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

/* The child: open the parent's arena, pull three pages, check them; exit code = failures. */
static int ipc_child(int rfd) {
    ms_pd_ipc_handle h;
    if (read(rfd, &h, sizeof h) != (ssize_t)sizeof h)
        return 10;
    ms_device *dev = NULL;
    ms_error err = {0};
    if (ms_device_cuda_init(0, &dev, &err) != MS_OK)
        return 11;
    ms_page_arena *a = arena_on(dev);
    ms_pd_ipc *x = NULL;
    if (ms_pd_ipc_open(&h, a, &x, &err) != MS_OK) {
        fprintf(stderr, "ipc open: %s\n", err.msg);
        return 12;
    }
    const ms_kv_transfer_i *t = ms_pd_ipc_iface();
    int32_t local[3] = {2, 5, 6}, remote[3] = {3, 1, 4};
    ms_kv_transfer_desc d = {.rid = 1, .label = 0, .page_size = PS, .start = 0,
                             .token_begin = 0, .token_end = 3 * PS - 1, .local_pages = local,
                             .n_local_pages = 3, .remote_pages = remote, .n_remote_pages = 3};
    uint64_t hd = 0;
    int bad = 0;
    if (t->start(x, &d, &hd, &err) != MS_OK) {
        fprintf(stderr, "ipc start: %s\n", err.msg);
        bad++;
    } else {
        ms_kv_transfer_state s = t->poll(x, hd);
        bad += s == MS_KV_TRANSFER_FAILED;
        bad += t->wait(x, hd) != MS_KV_TRANSFER_DONE;
        t->release(x, hd);
        for (int i = 0; i < 3; i++)
            bad += !holds(a, local[i], remote[i]);
        bad += !holds(a, 3, -1);
    }
    /* a page outside the peer's arena is refused at start */
    remote[0] = PAGES;
    bad += t->start(x, &d, &hd, &err) != MS_ERR_INVALID_ARG;
    ms_pd_ipc_free(x);
    ms_page_arena_free(a);
    ms_device_free(dev);
    return bad;
}

static void test_ipc(void **state) {
    (void)state;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork(); /* before CUDA in either process */
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[1]);
        _exit(ipc_child(fds[0]));
    }
    close(fds[0]);
    if (gpu_count() < 1) {
        close(fds[1]);
        waitpid(pid, NULL, 0);
        print_message("skipped: no CUDA device (the IPC transfer did not run)\n");
        skip();
    }
    ms_device *dev = NULL;
    ms_error err = {0};
    if (ms_device_cuda_init(0, &dev, &err) != MS_OK)
        fail_msg("cuda: %s", err.msg);
    ms_page_arena *a = arena_on(dev);
    for (int32_t p = 1; p < PAGES; p++)
        fill(a, p);
    ms_pd_ipc_handle h;
    if (ms_pd_ipc_export(a, &h, &err) != MS_OK)
        fail_msg("export: %s", err.msg);
    assert_int_equal(write(fds[1], &h, sizeof h), (ssize_t)sizeof h);
    close(fds[1]);
    int status = 0;
    waitpid(pid, &status, 0); /* the arena lives until the child is done with it */
    ms_page_arena_free(a);
    ms_device_free(dev);
    assert_true(WIFEXITED(status));
    if (WEXITSTATUS(status) != 0)
        fail_msg("the IPC child failed %d check(s)", WEXITSTATUS(status));
}

typedef struct nccl_rank {
    int32_t rank;
    ms_nccl_id id;
    int bad;
    char msg[MS_ERROR_MSG_MAX + 16];
} nccl_rank;

static void *nccl_main(void *arg) {
    nccl_rank *r = arg;
    ms_error err = {0};
    ms_device *dev = NULL;
    ms_nccl_comm *comm = NULL;
    ms_pd_nccl *x = NULL;
    ms_page_arena *a = NULL;
    if (ms_device_cuda_init(r->rank, &dev, &err) != MS_OK ||
        ms_nccl_comm_init(r->rank, r->rank, 2, &r->id, 1 << 16, &comm, &err) != MS_OK) {
        snprintf(r->msg, sizeof r->msg, "%s", err.msg);
        r->bad++;
        goto done;
    }
    a = arena_on(dev);
    if (ms_pd_nccl_init(comm, 1 - r->rank, a, &x, &err) != MS_OK) {
        snprintf(r->msg, sizeof r->msg, "%s", err.msg);
        r->bad++;
        goto done;
    }
    if (r->rank == 0) {
        for (int32_t p = 1; p < PAGES; p++)
            fill(a, p);
        int32_t pages[2] = {3, 1};
        ms_kv_published pub = {.rid = 1, .world_size = 1, .page_size = PS, .n_streams = 1};
        pub.streams[0] = (ms_kv_published_stream){.label = 0, .length = 2 * PS, .start = 0,
                                                   .n_pages = 2, .pages = pages};
        if (ms_pd_nccl_send(x, &pub, &err) != MS_OK) {
            snprintf(r->msg, sizeof r->msg, "send: %s", err.msg);
            r->bad++;
        }
    } else {
        int32_t local[2] = {4, 2}, remote[2] = {3, 1};
        ms_kv_transfer_desc d = {.rid = 1, .page_size = PS, .start = 0, .token_begin = PS,
                                 .token_end = 2 * PS, .local_pages = local, .n_local_pages = 2,
                                 .remote_pages = remote, .n_remote_pages = 2};
        const ms_kv_transfer_i *t = ms_pd_nccl_iface();
        uint64_t h = 0;
        if (t->start(x, &d, &h, &err) != MS_OK) {
            snprintf(r->msg, sizeof r->msg, "recv: %s", err.msg);
            r->bad++;
        } else {
            r->bad += t->wait(x, h) != MS_KV_TRANSFER_DONE;
            t->release(x, h);
            r->bad += !holds(a, 2, 1); /* page 1 of rank 0 */
            r->bad += !holds(a, 4, -1); /* held already: went to the staging buffer */
        }
    }
done:
    ms_pd_nccl_free(x);
    ms_page_arena_free(a);
    ms_nccl_comm_free(comm);
    ms_device_free(dev);
    return NULL;
}

static void test_nccl(void **state) {
    (void)state;
    if (gpu_count() < 2) {
        print_message("skipped: the NCCL transfer needs 2 GPUs (%d here)\n", gpu_count());
        skip();
    }
    if (!ms_nccl_available(NULL)) {
        print_message("skipped: no libnccl.so.2\n");
        skip();
    }
    nccl_rank r[2] = {{.rank = 0}, {.rank = 1}};
    ms_error err = {0};
    if (ms_nccl_unique_id(&r[0].id, &err) != MS_OK)
        fail_msg("unique id: %s", err.msg);
    r[1].id = r[0].id;
    pthread_t th[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&th[i], NULL, nccl_main, &r[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 2; i++)
        if (r[i].bad != 0)
            fail_msg("rank %d: %d failed check(s) %s", i, r[i].bad, r[i].msg);
}

#define NREQ 3
#define NEW 10

static ms_engine *cuda_engine(void) {
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture("hf/llama_gqa");
    o.device = "cuda";
    o.dtype = "bf16";
    o.page_size = 16;
    o.max_seqs = NREQ;
    o.max_tokens = 128;
    o.prefix_cache = false;
    ms_engine *e = NULL;
    ms_error err = {0};
    if (ms_engine_init(&e, &ms_llama_desc, &o, &err) != MS_OK)
        fail_msg("init on cuda: %s", err.msg);
    return e;
}

/* Run NREQ greedy requests to the end; pd: prefill on one engine, decode on another. */
static void engine_run(bool pd, int32_t ids[NREQ][NEW]) {
    static const int32_t len[NREQ] = {7, 16, 33};
    ms_engine *p = cuda_engine(), *d = pd ? cuda_engine() : p;
    const int32_t fp = ms_engine_kv_pages_free(p), fd = ms_engine_kv_pages_free(d);
    ms_rid rid[NREQ];
    ms_error err = {0};
    int32_t prompt[40];
    for (int32_t i = 0; i < NREQ; i++) {
        for (int32_t t = 0; t < len[i]; t++)
            prompt[t] = 3 + (int32_t)((uint32_t)(t * 7919 + i * 104729) % 500u);
        ms_engine_request rq = {.prompt = prompt, .n_prompt = len[i], .max_new_tokens = NEW,
                                .ignore_eos = true, .sampling = ms_sampling_greedy()};
        if (ms_engine_add(p, &rq, &rid[i], &err) != MS_OK)
            fail_msg("add: %s", err.msg);
    }
    if (ms_engine_step(p, NULL, &err) != MS_OK)
        fail_msg("prefill step: %s", err.msg);
    if (pd) {
        for (int32_t i = 0; i < NREQ; i++) {
            ms_pd_record *rec = NULL, *back = NULL;
            uint8_t *buf = NULL;
            size_t n = 0;
            if (ms_engine_pd_publish(p, rid[i], &rec, &err) != MS_OK ||
                ms_pd_record_encode(rec, &buf, &n, &err) != MS_OK ||
                ms_pd_record_decode(buf, n, &back, &err) != MS_OK ||
                ms_engine_pd_admit(d, back, &rid[i], &err) != MS_OK)
                fail_msg("handover of request %d: %s", (int)i, err.msg);
            ms_free(buf);
            ms_pd_record_free(rec);
            ms_pd_record_free(back);
        }
        assert_int_equal(ms_engine_kv_pages_free(p), fp);
    }
    for (int32_t steps = 0; ms_engine_n_active(d) > 0; steps++) {
        assert_true(steps < 100);
        if (ms_engine_step(d, NULL, &err) != MS_OK)
            fail_msg("step: %s", err.msg);
    }
    for (int32_t i = 0; i < NREQ; i++) {
        const int32_t *out;
        int32_t n;
        assert_int_equal(ms_engine_output(d, rid[i], &out, &n, NULL), MS_OK);
        assert_int_equal(n, NEW);
        memcpy(ids[i], out, sizeof ids[i]);
        ms_engine_remove(d, rid[i]);
    }
    assert_int_equal(ms_engine_kv_pages_free(d), fd);
    if (pd)
        ms_engine_free(p);
    ms_engine_free(d);
}

static void test_engine_host_cuda(void **state) {
    (void)state;
    if (gpu_count() < 1) {
        print_message("skipped: no CUDA device (the CUDA handover did not run)\n");
        skip();
    }
    int32_t one[NREQ][NEW], two[NREQ][NEW];
    engine_run(false, one);
    engine_run(true, two);
    for (int32_t i = 0; i < NREQ; i++)
        for (int32_t t = 0; t < NEW; t++)
            if (one[i][t] != two[i][t])
                fail_msg("request %d id %d: one engine %d, prefill + decode %d", (int)i, (int)t,
                         one[i][t], two[i][t]);
}

int main(void) {
    /* no CUDA call here: test_ipc forks before either process touches CUDA */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ipc),
        cmocka_unit_test(test_nccl),
        cmocka_unit_test(test_engine_host_cuda),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
