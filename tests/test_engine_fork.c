/*
 * test_engine_fork.c - n > 1 choices sharing one prompt's KV (engine.h ms_engine_fork, kv_pool.h
 * ms_kv_pool_fork_stream) on the CPU over hf/llama_gqa and models/llama.mstar's descriptor.
 * The reference is the same choices added as independent requests (ms_engine_add, each
 * prefilling the prompt) with the same seeds: every forked choice's ids and the logits each id
 * was sampled from must be bitwise equal (the CPU backend's rows do not depend on the batch).
 * Cases:
 *   - 4 seeded choices over a 40-token prompt (2 full pages shared, the partial one copied), the
 *     prefix cache off and on, chunked prefill; a 33-token prompt (its n - 1 tokens fill two
 *     pages exactly: nothing to copy);
 *   - the pages held mid-run are the parent's plus each fork's own (not n times the prompt),
 *     read from the arena's free count, and every page is free at the end;
 *   - a fork cancelled mid-run frees only its own pages, the parent cancelled mid-run only its
 *     own too (the shared pages stay with the forks), and the others go on unchanged;
 *   - a fork added while the parent already decodes forks at once from its KV;
 *   - offload and recompute-preemption of forks under a small arena: ids equal;
 *   - refusals: unknown parent, another prompt; a finished parent: the fork prefills itself;
 *   - the pool's ms_kv_pool_fork_stream alone (kv_test_util.h): owners per page, the partial
 *     page's bytes copied, each bad argument refused with nothing changed.
 */
#include "ms_test.h"
#include "ms_test_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "kv_test_util.h"

extern const ms_model_desc ms_llama_desc;

#define VOCAB 512 /* hf/llama_gqa */
#define MAXC 6    /* choices */
#define MAXNEW 12

typedef struct fork_cfg {
    int32_t n;           /* choices */
    int32_t n_prompt;
    int32_t max_new;
    int32_t page_size;
    bool cache;          /* prefix cache */
    int32_t chunk;       /* prefill_chunk */
    int32_t kv_pages;    /* 0: the default */
    int32_t host_pages;
    bool fork;           /* ms_engine_fork for choices 1.., else ms_engine_add */
    int32_t fork_late;   /* > 0: choices 1.. are added after this many steps */
    int32_t cancel;      /* choice removed mid-run (-1 none) */
    int32_t cancel_at;   /* ... after this many steps */
    bool check_pages;    /* check the pages held once every choice decodes */
} fork_cfg;

typedef struct fork_out {
    int32_t ids[MAXC][MAXNEW];
    int32_t n_ids[MAXC];
    float *logits[MAXC]; /* [MAXNEW * VOCAB] */
    ms_engine_fork_stats fs;
    ms_engine_kv_stats kv;
    bool pages_checked;
    bool fork_stalled;   /* a fork that decoded sat out a step others decoded in (offloaded,
                            preempted or waiting for pages: KV pressure took a fork) */
} fork_out;

static void out_free(fork_out *o) {
    for (int i = 0; i < MAXC; i++)
        free(o->logits[i]);
}

static void make_prompt(int32_t *p, int32_t n) {
    uint32_t s = 777;
    for (int32_t t = 0; t < n; t++) {
        s = s * 1103515245u + 12345u;
        p[t] = 3 + (int32_t)((s >> 8) % (VOCAB - 3));
    }
}

static int32_t ceil_div(int32_t a, int32_t b) { return (a + b - 1) / b; }

static void run(const fork_cfg *c, fork_out *out) {
    memset(out, 0, sizeof *out);
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture("hf/llama_gqa");
    o.page_size = c->page_size;
    o.max_seqs = MAXC;
    o.max_tokens = 128;
    o.kv_pages = c->kv_pages;
    o.host_kv_pages = c->host_pages;
    o.prefix_cache = c->cache;
    o.n_threads = 1;
    ms_engine *e = NULL;
    ms_error err = {0};
    if (ms_engine_init(&e, &ms_llama_desc, &o, &err) != MS_OK)
        fail_msg("init: %s", err.msg);
    const int32_t free0 = ms_engine_kv_pages_free(e);
    int32_t prompt[128];
    make_prompt(prompt, c->n_prompt);
    ms_rid rids[MAXC];
    bool live[MAXC] = {false}, added[MAXC] = {false};
    int32_t seen[MAXC] = {0};
    for (int32_t i = 0; i < c->n; i++) {
        out->logits[i] = calloc((size_t)MAXNEW * VOCAB, sizeof(float));
        assert_non_null(out->logits[i]);
    }
    const int32_t ps = c->page_size, shared = (c->n_prompt - 1) / ps;
    for (int32_t steps = 0;; steps++) {
        for (int32_t i = 0; i < c->n; i++) {
            if (added[i] || (i > 0 && steps < c->fork_late))
                continue;
            ms_engine_request rq = {.prompt = prompt, .n_prompt = c->n_prompt,
                                    .max_new_tokens = c->max_new, .ignore_eos = true,
                                    .prefill_chunk = c->chunk};
            rq.sampling.temperature = 0.9f;
            rq.sampling.top_p = 0.95f;
            rq.sampling.seed = 1000u + 17u * (uint64_t)i;
            ms_status st = c->fork && i > 0 ? ms_engine_fork(e, rids[0], &rq, &rids[i], &err)
                                            : ms_engine_add(e, &rq, &rids[i], &err);
            if (st != MS_OK)
                fail_msg("add choice %d: %s", i, err.msg);
            added[i] = live[i] = true;
        }
        if (ms_engine_n_active(e) == 0)
            break;
        assert_true(steps < 500);
        if (c->cancel >= 0 && steps == c->cancel_at && live[c->cancel]) {
            /* its own pages only: those past the shared ones (the parent's shared pages stay
               with its forks, a fork's shared pages with the parent) */
            int32_t len = ms_engine_stream_length(e, rids[c->cancel], MS_LABEL_MAIN);
            assert_true(len > c->n_prompt);
            int32_t before = ms_engine_kv_pages_free(e);
            ms_engine_remove(e, rids[c->cancel]);
            live[c->cancel] = false;
            out->n_ids[c->cancel] = -1;
            int32_t own = ceil_div(len, ps) - (c->fork ? shared : 0);
            if (ms_engine_kv_pages_free(e) - before != own)
                fail_msg("cancelling choice %d (%d tokens) freed %d pages, its own are %d",
                         c->cancel, len, ms_engine_kv_pages_free(e) - before, own);
        }
        if (ms_engine_step(e, NULL, &err) != MS_OK)
            fail_msg("step %d: %s", steps, err.msg);
        bool all_decode = true, any_grew = false, fork_sat[MAXC] = {false};
        int32_t expect = 0;
        for (int32_t i = 0; i < c->n; i++) {
            if (!live[i])
                continue;
            const int32_t *ids;
            int32_t n;
            ms_finish_reason why;
            assert_int_equal(ms_engine_output(e, rids[i], &ids, &n, &why), MS_OK);
            if (n > seen[i]) {
                assert_int_equal(n, seen[i] + 1);
                const float *lg = ms_engine_last_logits(e, rids[i]);
                assert_non_null(lg);
                memcpy(out->logits[i] + (size_t)seen[i] * VOCAB, lg, VOCAB * sizeof(float));
                seen[i] = n;
                any_grew = true;
            } else if (i > 0 && n >= 1 && why == MS_FINISH_NONE) {
                fork_sat[i] = true;
            }
            int32_t len = ms_engine_stream_length(e, rids[i], MS_LABEL_MAIN);
            all_decode = all_decode && why == MS_FINISH_NONE && n >= 2 && len > c->n_prompt;
            expect += len > 0 ? ceil_div(len, ps) - (c->fork && i > 0 ? shared : 0) : 0;
            if (why != MS_FINISH_NONE) {
                assert_int_equal(why, MS_FINISH_LENGTH);
                memcpy(out->ids[i], ids, (size_t)n * sizeof(int32_t));
                out->n_ids[i] = n;
                ms_engine_remove(e, rids[i]);
                live[i] = false;
            }
        }
        for (int32_t i = 1; i < c->n; i++)
            out->fork_stalled = out->fork_stalled || (any_grew && fork_sat[i]);
        if (c->check_pages && !out->pages_checked && all_decode && c->fork_late == 0) {
            /* pages held: the parent's, plus each fork's past the shared ones */
            int32_t used = free0 - ms_engine_kv_pages_free(e);
            if (used != expect)
                fail_msg("%d choices hold %d pages, expected %d", c->n, used, expect);
            if (c->fork)
                assert_true(used < c->n * ceil_div(c->n_prompt + 1, ps));
            out->pages_checked = true;
        }
    }
    ms_engine_get_fork_stats(e, &out->fs);
    ms_engine_get_kv_stats(e, &out->kv);
    assert_int_equal(out->fs.n_waiting, 0);
    if (!c->cache) /* the cache keeps its pages; they count as free, but check the plain case */
        assert_int_equal(ms_engine_kv_pages_free(e), free0);
    ms_engine_free(e);
}

/* Every choice not cancelled: the same ids, and bitwise the same logits when `bitwise`. */
static void expect_same(const fork_cfg *c, const fork_out *a, const fork_out *b, bool bitwise,
                        const char *what) {
    for (int32_t i = 0; i < c->n; i++) {
        if (i == c->cancel)
            continue;
        if (a->n_ids[i] != c->max_new || b->n_ids[i] != c->max_new)
            fail_msg("%s: choice %d: %d and %d ids, %d expected", what, i, a->n_ids[i],
                     b->n_ids[i], c->max_new);
        for (int32_t t = 0; t < c->max_new; t++)
            if (a->ids[i][t] != b->ids[i][t])
                fail_msg("%s: choice %d id %d: forked %d, independent %d", what, i, t,
                         a->ids[i][t], b->ids[i][t]);
        if (bitwise && memcmp(a->logits[i], b->logits[i],
                              (size_t)c->max_new * VOCAB * sizeof(float)) != 0)
            fail_msg("%s: choice %d: logits differ (not bitwise)", what, i);
    }
}

/* The forked run's counters. */
typedef struct check_res {
    ms_engine_fork_stats fs;
    ms_engine_kv_stats kv;
    bool fork_stalled;
} check_res;

/* Run c forked and independent; compare. Returns the forked run's counters. */
static check_res check(fork_cfg c, bool bitwise, const char *what) {
    fork_out f, ind;
    c.fork = true;
    run(&c, &f);
    fork_cfg ci = c;
    ci.fork = false;
    ci.check_pages = c.check_pages && !c.cache;
    run(&ci, &ind);
    expect_same(&c, &f, &ind, bitwise, what);
    if (c.check_pages)
        assert_true(f.pages_checked);
    check_res res = {f.fs, f.kv, f.fork_stalled};
    const ms_engine_fork_stats fs = f.fs;
    printf("%s: %lld forks, %lld pages shared, %lld copied, %lld prompt tokens not computed, "
           "%lld fallbacks; offloads %lld, preemptions %lld\n", what, (long long)fs.forks,
           (long long)fs.pages_shared, (long long)fs.pages_copied, (long long)fs.tokens_shared,
           (long long)fs.fallbacks, (long long)f.kv.offloads, (long long)f.kv.preemptions);
    out_free(&f);
    out_free(&ind);
    return res;
}

static fork_cfg base(void) {
    fork_cfg c = {.n = 4, .n_prompt = 40, .max_new = MAXNEW, .page_size = 16, .cancel = -1,
                  .check_pages = true};
    return c;
}

static void test_fork_bitwise(void **state) {
    (void)state;
    fork_cfg c = base();
    ms_engine_fork_stats fs = check(c, true, "40-token prompt, 4 choices").fs;
    assert_int_equal(fs.forks, 3);
    assert_int_equal(fs.pages_shared, 3 * 2); /* 39 tokens: 2 full pages of 16 */
    assert_int_equal(fs.pages_copied, 3);     /* and 7 tokens copied */
    assert_int_equal(fs.tokens_shared, 3 * 39);
    assert_int_equal(fs.fallbacks, 0);
}

static void test_fork_page_boundary(void **state) {
    (void)state;
    fork_cfg c = base();
    c.n_prompt = 33; /* 32 tokens shared: two full pages, nothing to copy */
    ms_engine_fork_stats fs = check(c, true, "33-token prompt").fs;
    assert_int_equal(fs.pages_shared, 3 * 2);
    assert_int_equal(fs.pages_copied, 0);
}

static void test_fork_prefix_cache(void **state) {
    (void)state;
    fork_cfg c = base();
    c.cache = true;
    ms_engine_fork_stats fs = check(c, true, "prefix cache on").fs;
    assert_int_equal(fs.forks, 3);
}

static void test_fork_chunked(void **state) {
    (void)state;
    fork_cfg c = base();
    c.chunk = 8; /* the parent's prompt in 5 steps; the forks wait for the last */
    ms_engine_fork_stats fs = check(c, true, "chunked prefill").fs;
    assert_int_equal(fs.forks, 3);
    c.cache = true;
    fs = check(c, true, "chunked prefill, prefix cache on").fs;
    assert_int_equal(fs.forks, 3);
}

static void test_fork_cancel(void **state) {
    (void)state;
    fork_cfg c = base();
    c.cancel = 2; /* a fork */
    c.cancel_at = 5;
    check(c, true, "fork cancelled");
    c.cancel = 0; /* the parent: the forks keep the shared pages */
    check(c, true, "parent cancelled");
}

static void test_fork_late(void **state) {
    (void)state;
    fork_cfg c = base();
    c.fork_late = 4; /* the parent decodes already: the forks take its first 39 tokens */
    c.check_pages = false;
    ms_engine_fork_stats fs = check(c, true, "forks added while the parent decodes").fs;
    assert_int_equal(fs.forks, 3);
    assert_int_equal(fs.pages_shared, 6);
}

/* A small arena: forks are offloaded and reloaded, or recompute-preempted; ids equal (and every
 * page free at the end: run() checks it). */
static void test_fork_pressure(void **state) {
    (void)state;
    fork_cfg c = base();
    c.page_size = 4;
    c.n_prompt = 21;
    c.check_pages = false;
    c.kv_pages = 1 + 10; /* 4 choices of up to 8 pages each (5 shared): 17 forked, 32 alone */
    c.host_pages = 64;
    check_res r = check(c, true, "offload");
    assert_true(r.fs.forks >= 1);
    assert_true(r.kv.offloads > 0);
    assert_true(r.fork_stalled); /* a fork was the one taken */
    c.host_pages = 0;
    r = check(c, false, "recompute-preemption");
    assert_true(r.fs.forks >= 1);
    assert_true(r.kv.preemptions > 0);
    assert_true(r.fork_stalled);
}

static void test_fork_refusals(void **state) {
    (void)state;
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture("hf/llama_gqa");
    o.page_size = 16;
    o.max_seqs = 4;
    o.n_threads = 1;
    ms_engine *e = NULL;
    ms_error err = {0};
    if (ms_engine_init(&e, &ms_llama_desc, &o, &err) != MS_OK)
        fail_msg("init: %s", err.msg);
    const int32_t free0 = ms_engine_kv_pages_free(e);
    int32_t p[40];
    make_prompt(p, 40);
    ms_engine_request rq = {.prompt = p, .n_prompt = 40, .max_new_tokens = 2,
                            .sampling = ms_sampling_greedy(), .ignore_eos = true};
    ms_rid a, b;
    assert_int_equal(ms_engine_fork(e, 99, &rq, &b, &err), MS_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "unknown parent request 99"));
    assert_int_equal(ms_engine_add(e, &rq, &a, &err), MS_OK);
    rq.n_prompt = 39;
    assert_int_equal(ms_engine_fork(e, a, &rq, &b, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "not the parent's"));
    rq.n_prompt = 40;
    p[5] ^= 1;
    assert_int_equal(ms_engine_fork(e, a, &rq, &b, &err), MS_ERR_INVALID_ARG);
    p[5] ^= 1;
    rq.max_new_tokens = -1; /* ms_engine_add's own checks */
    assert_int_equal(ms_engine_fork(e, a, &rq, &b, &err), MS_ERR_INVALID_ARG);
    rq.max_new_tokens = 2;
    while (ms_engine_n_active(e) > 0)
        assert_int_equal(ms_engine_step(e, NULL, &err), MS_OK);
    /* a finished parent holds no KV: the fork prefills its prompt itself */
    const int32_t *ids_a, *ids_b;
    int32_t na, nb;
    assert_int_equal(ms_engine_fork(e, a, &rq, &b, &err), MS_OK);
    while (ms_engine_n_active(e) > 0)
        assert_int_equal(ms_engine_step(e, NULL, &err), MS_OK);
    assert_int_equal(ms_engine_output(e, a, &ids_a, &na, NULL), MS_OK);
    assert_int_equal(ms_engine_output(e, b, &ids_b, &nb, NULL), MS_OK);
    assert_int_equal(na, 2);
    assert_int_equal(nb, 2);
    assert_memory_equal(ids_a, ids_b, 2 * sizeof(int32_t)); /* greedy: the same ids */
    ms_engine_fork_stats fs;
    ms_engine_get_fork_stats(e, &fs);
    assert_int_equal(fs.forks, 0);
    assert_int_equal(fs.fallbacks, 1);
    ms_engine_remove(e, a);
    ms_engine_remove(e, b);
    assert_int_equal(ms_engine_kv_pages_free(e), free0);
    ms_engine_free(e);
}

/* ms_kv_pool_fork_stream on a pool of its own: 16 pages of 4 tokens. */
static void test_pool_fork_stream(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 16, 4, 0);
    ms_error err = {0};
    const int32_t free0 = ms_page_arena_num_free(f.arena);
    for (ms_rid r = 1; r <= 5; r++)
        kv_ingest(&f, r);
    kv_extend(&f, 1, 0, 10); /* 3 pages: 4 + 4 + 2 tokens */
    int32_t src[4];
    assert_int_equal(ms_kv_pool_stream_pages(f.pool, 1, 0, src, 4), 3);
    kv_write_token(f.arena, src[2], 0, 7.0f); /* token 8 in the partial page */
    ms_kv_fork_info fi;
    assert_int_equal(ms_kv_pool_fork_stream(f.pool, 1, 2, 0, 0, &fi, &err), MS_ERR_INVALID_ARG);
    assert_int_equal(ms_kv_pool_fork_stream(f.pool, 1, 1, 0, 4, &fi, &err), MS_ERR_INVALID_ARG);
    assert_int_equal(ms_kv_pool_fork_stream(f.pool, 9, 2, 0, 4, &fi, &err), MS_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "request 9 is not ingested"));
    assert_int_equal(ms_kv_pool_fork_stream(f.pool, 1, 2, MS_MAX_LABELS, 4, &fi, &err),
                     MS_ERR_INVALID_ARG);
    assert_int_equal(ms_kv_pool_fork_stream(f.pool, 1, 2, 0, 11, &fi, &err), MS_ERR_STATE);
    assert_non_null(strstr(err.msg, "it holds 10"));
    assert_int_equal(ms_page_arena_num_free(f.arena), free0 - 3); /* nothing changed */
    /* 9 tokens: two full pages shared, the third (one token) copied */
    assert_int_equal(ms_kv_pool_fork_stream(f.pool, 1, 2, 0, 9, &fi, &err), MS_OK);
    assert_int_equal(fi.pages_shared, 2);
    assert_int_equal(fi.pages_copied, 1);
    ms_kv_stream_info si = kv_info(&f, 2, 0);
    assert_int_equal(si.stored, 9);
    assert_int_equal(si.n_pages, 3);
    int32_t dst[4];
    assert_int_equal(ms_kv_pool_stream_pages(f.pool, 2, 0, dst, 4), 3);
    assert_int_equal(dst[0], src[0]);
    assert_int_equal(dst[1], src[1]);
    assert_true(dst[2] != src[2]);
    assert_true(kv_token_is(f.arena, dst[2], 0, 7.0f)); /* the partial page's bytes */
    assert_int_equal(ms_page_arena_owners(f.arena, src[0]), 2);
    assert_int_equal(ms_page_arena_owners(f.arena, src[2]), 1);
    kv_check_pages(&f);
    /* the target is not empty now */
    assert_int_equal(ms_kv_pool_fork_stream(f.pool, 1, 2, 0, 4, &fi, &err), MS_ERR_STATE);
    assert_non_null(strstr(err.msg, "not empty"));
    /* no free page for the copy: refused, nothing taken; a page-aligned fork needs none */
    int32_t fr = ms_page_arena_num_free(f.arena);
    kv_extend(&f, 3, 0, fr * 4);
    assert_int_equal(ms_page_arena_num_free(f.arena), 0);
    assert_int_equal(ms_kv_pool_fork_stream(f.pool, 1, 4, 0, 9, &fi, &err), MS_ERR_CAPACITY);
    assert_non_null(strstr(err.msg, "kv_pages"));
    assert_int_equal(ms_kv_pool_stream_pages(f.pool, 4, 0, NULL, 0), 0);
    assert_int_equal(ms_page_arena_owners(f.arena, src[0]), 2);
    assert_int_equal(ms_kv_pool_fork_stream(f.pool, 1, 5, 0, 8, &fi, &err), MS_OK);
    assert_int_equal(fi.pages_copied, 0);
    assert_int_equal(ms_page_arena_owners(f.arena, src[0]), 3);
    kv_check_pages(&f);
    /* the source goes first: its shared pages stay with the forks */
    ms_kv_pool_remove(f.pool, 1);
    assert_int_equal(ms_page_arena_owners(f.arena, src[0]), 2);
    assert_int_equal(ms_page_arena_owners(f.arena, src[2]), 0); /* its own partial page */
    kv_check_pages(&f);
    for (ms_rid r = 2; r <= 5; r++)
        ms_kv_pool_remove(f.pool, r);
    assert_int_equal(ms_page_arena_num_free(f.arena), free0);
    kv_fix_free(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_fork_bitwise),      ms_unit_test(test_fork_page_boundary),
        ms_unit_test(test_fork_prefix_cache), ms_unit_test(test_fork_chunked),
        ms_unit_test(test_fork_cancel),       ms_unit_test(test_fork_late),
        ms_unit_test(test_fork_pressure),     ms_unit_test(test_fork_refusals),
        ms_unit_test(test_pool_fork_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
