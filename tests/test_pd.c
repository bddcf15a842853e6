/*
 * test_pd.c - [pd] prefill/decode disaggregation on the CPU over hf/llama_gqa and
 * models/llama.mstar's descriptor (engine.h ms_engine_pd_publish / ms_engine_pd_admit, pd.h's
 * record and byte form, kv_transfer_host.h's host transfer).
 * The reference is one engine running the same requests (ms_engine_add). The PD run prefills
 * them on engine P, publishes each (P frees its pages), carries the record through its byte
 * form (encode, decode) and admits it on engine D, which decodes to the end. Every request's
 * ids and the logits each id was sampled from must be bitwise equal to the reference (the CPU
 * backend's rows do not depend on the batch; the first id and its logits come from P).
 * Cases:
 *   - 5 concurrent requests of prompts 5, 16 (one full page), 17, 32 (two full pages: on a
 *     page boundary) and 40 tokens, greedy and seeded-sampled (top_p, per-request seeds);
 *   - the decode engine's prefix cache already holding the 40-token prompt's first 2 pages: its
 *     admit adopts them and the host transfer copies fewer bytes (token_begin > 0), same ids;
 *   - an injected transfer failure (a wrapper around the engine's host transfer: one request's
 *     start fails, another's transfer reports FAILED when polled): those requests alone fail
 *     (MS_ERR_IO naming the request, their pages freed), the others give the reference ids;
 *   - every page is free on both engines at the end, and no host block leaks;
 *   - refusals: publish of an unknown request, of a request still prefilling; a record whose
 *     bytes are cut, carry a bad magic, bytes left over or an inconsistent KV length.
 */
#include "ms_test.h"
#include "ms_test_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "pd.h"

extern const ms_model_desc ms_llama_desc;

#define VOCAB 512 /* hf/llama_gqa */
#define NREQ 5
#define MAXNEW 10
#define PS 16

static const int32_t prompt_len[NREQ] = {5, 16, 17, 32, 40};

typedef struct run_out {
    int32_t ids[NREQ][MAXNEW];
    int32_t n_ids[NREQ];
    float logits[NREQ][MAXNEW][VOCAB];
    ms_status admit[NREQ];  /* PD run: what ms_engine_pd_admit returned */
    uint64_t xfer_bytes;    /* PD run: bytes the decode engine's host transfer copied */
} run_out;

/* A transfer wrapping the engine's host transfer: the fail_start-th start fails, the
 * fail_poll-th start succeeds but its transfer then reports FAILED (counted from 1; 0 none). */
typedef struct fail_xfer {
    const ms_kv_transfer_i *inner;
    void *inner_ctx;
    int32_t n_starts;
    int32_t fail_start, fail_poll;
    uint64_t bad_handle;
} fail_xfer;

static ms_status fx_start(void *ctx, const ms_kv_transfer_desc *d, uint64_t *h, ms_error *err) {
    fail_xfer *f = ctx;
    f->n_starts++;
    if (f->n_starts == f->fail_start)
        return MS_FAIL(err, MS_ERR_IO, "injected transfer failure (request %llu)",
                       (unsigned long long)d->rid);
    MS_TRY(f->inner->start(f->inner_ctx, d, h, err));
    if (f->n_starts == f->fail_poll)
        f->bad_handle = *h;
    return MS_OK;
}
static ms_kv_transfer_state fx_poll(void *ctx, uint64_t h) {
    fail_xfer *f = ctx;
    if (f->bad_handle != 0 && h == f->bad_handle)
        return MS_KV_TRANSFER_FAILED;
    return f->inner->poll(f->inner_ctx, h);
}
static void fx_release(void *ctx, uint64_t h) {
    fail_xfer *f = ctx;
    f->inner->release(f->inner_ctx, h);
}
static const ms_kv_transfer_i fx_iface = {fx_start, fx_poll, fx_poll, fx_release};

static void make_prompt(int32_t *p, int32_t n, uint32_t s) {
    for (int32_t t = 0; t < n; t++) {
        s = s * 1103515245u + 12345u;
        p[t] = 3 + (int32_t)((s >> 8) % (VOCAB - 3));
    }
}

static ms_engine *make_engine(fail_xfer *fx, bool cache) {
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture("hf/llama_gqa");
    o.page_size = PS;
    o.max_seqs = NREQ;
    o.max_tokens = 160;
    o.prefix_cache = cache;
    o.n_threads = 1;
    if (fx != NULL) {
        o.kv_transfer = &fx_iface;
        o.kv_transfer_ctx = fx;
    }
    ms_engine *e = NULL;
    ms_error err = {0};
    if (ms_engine_init(&e, &ms_llama_desc, &o, &err) != MS_OK)
        fail_msg("init: %s", err.msg);
    if (fx != NULL) {
        fx->inner = ms_kv_host_transfer_iface();
        fx->inner_ctx = ms_engine_pd_host_transfer(e);
        assert_non_null(fx->inner_ctx);
    }
    return e;
}

static ms_engine_request make_rq(int32_t i, const int32_t *prompt, bool sampled) {
    ms_engine_request rq = {.prompt = prompt, .n_prompt = prompt_len[i],
                            .max_new_tokens = MAXNEW, .ignore_eos = true};
    rq.sampling = ms_sampling_greedy();
    if (sampled) {
        rq.sampling.temperature = 0.9f;
        rq.sampling.top_p = 0.95f;
        rq.sampling.seed = 4242u + 31u * (uint64_t)i;
    }
    return rq;
}

/* Record the new id of every live request (and its logits); remove finished ones. */
static void collect(ms_engine *e, const ms_rid *rids, bool *live, run_out *out) {
    for (int32_t i = 0; i < NREQ; i++) {
        if (!live[i])
            continue;
        const int32_t *ids;
        int32_t n;
        ms_finish_reason why;
        assert_int_equal(ms_engine_output(e, rids[i], &ids, &n, &why), MS_OK);
        if (n > out->n_ids[i]) {
            assert_int_equal(n, out->n_ids[i] + 1);
            const float *lg = ms_engine_last_logits(e, rids[i]);
            assert_non_null(lg);
            memcpy(out->logits[i][n - 1], lg, sizeof out->logits[i][n - 1]);
            out->ids[i][n - 1] = ids[n - 1];
            out->n_ids[i] = n;
        }
        if (why != MS_FINISH_NONE) {
            assert_int_equal(why, MS_FINISH_LENGTH);
            ms_engine_remove(e, rids[i]);
            live[i] = false;
        }
    }
}

static bool any_live(const bool *live) {
    for (int32_t i = 0; i < NREQ; i++)
        if (live[i])
            return true;
    return false;
}

static void run_one(bool sampled, run_out *out) {
    memset(out, 0, sizeof *out);
    ms_engine *e = make_engine(NULL, false);
    const int32_t free0 = ms_engine_kv_pages_free(e);
    int32_t prompts[NREQ][64];
    ms_rid rids[NREQ];
    bool live[NREQ];
    ms_error err = {0};
    for (int32_t i = 0; i < NREQ; i++) {
        make_prompt(prompts[i], prompt_len[i], 100u + (uint32_t)i);
        ms_engine_request rq = make_rq(i, prompts[i], sampled);
        if (ms_engine_add(e, &rq, &rids[i], &err) != MS_OK)
            fail_msg("add %d: %s", (int)i, err.msg);
        live[i] = true;
    }
    for (int32_t steps = 0; any_live(live); steps++) {
        assert_true(steps < 100);
        if (ms_engine_step(e, NULL, &err) != MS_OK)
            fail_msg("step: %s", err.msg);
        collect(e, rids, live, out);
    }
    assert_int_equal(ms_engine_kv_pages_free(e), free0);
    ms_engine_free(e);
}

/* Prefill on P, hand over through the byte form, decode on D (through `fx` when given). */
static void run_pd(bool sampled, fail_xfer *fx, bool d_cache, run_out *out) {
    memset(out, 0, sizeof *out);
    ms_engine *p = make_engine(NULL, false), *d = make_engine(fx, d_cache);
    const int32_t p_free0 = ms_engine_kv_pages_free(p), d_free0 = ms_engine_kv_pages_free(d);
    int32_t prompts[NREQ][64];
    ms_error err = {0};
    if (d_cache) { /* D caches the 40-token prompt's 2 full pages: its admit transfers the rest */
        int32_t pr[64];
        make_prompt(pr, prompt_len[NREQ - 1], 100u + (uint32_t)(NREQ - 1));
        ms_engine_request rq = make_rq(NREQ - 1, pr, sampled);
        rq.max_new_tokens = 1;
        ms_rid r0;
        if (ms_engine_add(d, &rq, &r0, &err) != MS_OK || ms_engine_step(d, NULL, &err) != MS_OK)
            fail_msg("seeding D's prefix cache: %s", err.msg);
        ms_engine_remove(d, r0);
        ms_prefix_stats ps;
        ms_engine_prefix_stats(d, &ps);
        assert_true(ps.entries >= 2); /* the cache lists the prompt's full pages */
    }
    ms_rid prids[NREQ], drids[NREQ];
    bool live[NREQ];
    for (int32_t i = 0; i < NREQ; i++) {
        make_prompt(prompts[i], prompt_len[i], 100u + (uint32_t)i);
        ms_engine_request rq = make_rq(i, prompts[i], sampled);
        if (ms_engine_add(p, &rq, &prids[i], &err) != MS_OK)
            fail_msg("add %d: %s", (int)i, err.msg);
        live[i] = true;
    }
    /* still prefilling: nothing to publish yet */
    ms_pd_record *rec = NULL;
    assert_int_equal(ms_engine_pd_publish(p, prids[0], &rec, &err), MS_ERR_STATE);
    assert_null(rec);
    assert_int_equal(ms_engine_pd_publish(p, 9999, &rec, &err), MS_ERR_NOT_FOUND);
    /* one step prefills every prompt (111 tokens <= max_tokens) and samples each first id */
    if (ms_engine_step(p, NULL, &err) != MS_OK)
        fail_msg("prefill step: %s", err.msg);
    collect(p, prids, live, out);
    for (int32_t i = 0; i < NREQ; i++) {
        assert_int_equal(out->n_ids[i], 1);
        if (ms_engine_pd_publish(p, prids[i], &rec, &err) != MS_OK)
            fail_msg("publish %d: %s", (int)i, err.msg);
        uint8_t *buf = NULL;
        size_t n = 0;
        if (ms_pd_record_encode(rec, &buf, &n, &err) != MS_OK)
            fail_msg("encode %d: %s", (int)i, err.msg);
        ms_pd_record_free(rec);
        rec = NULL;
        if (ms_pd_record_decode(buf, n, &rec, &err) != MS_OK)
            fail_msg("decode %d: %s", (int)i, err.msg);
        ms_free(buf);
        out->admit[i] = ms_engine_pd_admit(d, rec, &drids[i], &err);
        if (out->admit[i] != MS_OK) {
            assert_int_equal(out->admit[i], MS_ERR_IO);
            assert_non_null(strstr(err.msg, "KV transfer failed"));
            live[i] = false;
        }
        ms_pd_record_free(rec);
        rec = NULL;
    }
    /* P holds nothing once every request is handed over */
    assert_int_equal(ms_engine_n_active(p), 0);
    assert_int_equal(ms_engine_kv_pages_free(p), p_free0);
    for (int32_t steps = 0; any_live(live); steps++) {
        assert_true(steps < 100);
        if (ms_engine_step(d, NULL, &err) != MS_OK)
            fail_msg("decode step: %s", err.msg);
        collect(d, drids, live, out);
    }
    assert_int_equal(ms_engine_n_active(d), 0);
    out->xfer_bytes = ms_engine_pd_host_transfer(d)->bytes;
    if (d_cache) { /* the cached pages were adopted, not sent: the host transfer moved fewer */
        ms_prefix_stats ps;
        ms_engine_prefix_stats(d, &ps);
        assert_true(ps.hit_tokens >= 2 * PS);
    }
    assert_int_equal(ms_engine_kv_pages_free(d), d_free0); /* cached pages count as free */
    ms_engine_free(p);
    ms_engine_free(d);
}

static void expect_same(const run_out *a, const run_out *b, int32_t skip1, int32_t skip2) {
    for (int32_t i = 0; i < NREQ; i++) {
        if (i == skip1 || i == skip2)
            continue;
        if (a->n_ids[i] != MAXNEW || b->n_ids[i] != MAXNEW)
            fail_msg("request %d: %d and %d ids, %d expected", (int)i, a->n_ids[i], b->n_ids[i],
                     MAXNEW);
        for (int32_t t = 0; t < MAXNEW; t++) {
            if (a->ids[i][t] != b->ids[i][t])
                fail_msg("request %d (prompt %d): id %d differs: %d vs %d", (int)i,
                         prompt_len[i], (int)t, a->ids[i][t], b->ids[i][t]);
            if (memcmp(a->logits[i][t], b->logits[i][t], sizeof a->logits[i][t]) != 0)
                fail_msg("request %d (prompt %d): logits of id %d differ", (int)i,
                         prompt_len[i], (int)t);
        }
    }
}

static run_out ref_out, pd_out; /* large: static */

static void test_round_trip_greedy(void **state) {
    (void)state;
    run_one(false, &ref_out);
    run_pd(false, NULL, false, &pd_out);
    expect_same(&ref_out, &pd_out, -1, -1);
}

static void test_round_trip_sampled(void **state) {
    (void)state;
    run_one(true, &ref_out);
    run_pd(true, NULL, false, &pd_out);
    expect_same(&ref_out, &pd_out, -1, -1);
    /* the seeds matter: request 0's sampled ids are not all greedy */
    run_out *g = calloc(1, sizeof *g);
    assert_non_null(g);
    run_one(false, g);
    bool differs = false;
    for (int32_t i = 0; i < NREQ; i++)
        differs = differs || memcmp(g->ids[i], ref_out.ids[i], sizeof g->ids[i]) != 0;
    free(g);
    assert_true(differs);
}

/* D's prefix cache holds the first 2 pages of the 40-token prompt: admit adopts them and the
 * host transfer moves only the tokens after (token_begin > 0); still bitwise the reference. */
static void test_round_trip_prefix_cached(void **state) {
    (void)state;
    run_one(true, &ref_out);
    run_pd(true, NULL, false, &pd_out);
    const uint64_t whole = pd_out.xfer_bytes;
    run_pd(true, NULL, true, &pd_out);
    expect_same(&ref_out, &pd_out, -1, -1);
    /* 2 pages of every layer fewer (page_bytes = 2 * 16 tokens * kv heads * head dim * 4) */
    assert_true(pd_out.xfer_bytes < whole);
    assert_true(whole > 0);
}

static void test_transfer_failure(void **state) {
    (void)state;
    run_one(true, &ref_out);
    fail_xfer fx = {.fail_start = 2, .fail_poll = 4};
    run_pd(true, &fx, false, &pd_out);
    assert_int_equal(pd_out.admit[0], MS_OK);
    assert_int_equal(pd_out.admit[1], MS_ERR_IO); /* start failed */
    assert_int_equal(pd_out.admit[2], MS_OK);
    assert_int_equal(pd_out.admit[3], MS_ERR_IO); /* polled FAILED */
    assert_int_equal(pd_out.admit[4], MS_OK);
    assert_int_equal(pd_out.n_ids[1], 1);         /* only the prefill's id */
    assert_int_equal(pd_out.n_ids[3], 1);
    expect_same(&ref_out, &pd_out, 1, 3);
}

static void test_bad_records(void **state) {
    (void)state;
    ms_engine *p = make_engine(NULL, false), *d = make_engine(NULL, false);
    const int32_t d_free0 = ms_engine_kv_pages_free(d);
    int32_t prompt[20];
    make_prompt(prompt, 17, 7);
    ms_engine_request rq = make_rq(2, prompt, false);
    ms_rid rid;
    ms_error err = {0};
    assert_int_equal(ms_engine_add(p, &rq, &rid, &err), MS_OK);
    assert_int_equal(ms_engine_step(p, NULL, &err), MS_OK);
    ms_pd_record *rec = NULL, *bad = NULL;
    assert_int_equal(ms_engine_pd_publish(p, rid, &rec, &err), MS_OK);
    uint8_t *buf = NULL;
    size_t n = 0;
    assert_int_equal(ms_pd_record_encode(rec, &buf, &n, &err), MS_OK);
    /* cut at every length: a format error, never a crash or a leak */
    for (size_t cut = 0; cut < n; cut += (cut < 200 ? 1 : 997)) {
        assert_int_equal(ms_pd_record_decode(buf, cut, &bad, &err), MS_ERR_FORMAT);
        assert_null(bad);
    }
    uint8_t *longer = malloc(n + 1);
    assert_non_null(longer);
    memcpy(longer, buf, n);
    longer[n] = 0;
    assert_int_equal(ms_pd_record_decode(longer, n + 1, &bad, &err), MS_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "left over"));
    longer[0] ^= 0xff;
    assert_int_equal(ms_pd_record_decode(longer, n, &bad, &err), MS_ERR_FORMAT);
    assert_non_null(strstr(err.msg, "magic"));
    free(longer);
    /* an inconsistent KV length: refused before anything is added */
    rec->kv->streams[0].length++;
    ms_rid drid = 0;
    assert_int_equal(ms_engine_pd_admit(d, rec, &drid, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "pd admit"));
    rec->kv->streams[0].length--;
    /* a page size the decode engine does not use: the transfer fails for it alone */
    rec->kv->page_size = PS / 2;
    rec->payload->page_size = PS / 2;
    assert_int_equal(ms_engine_pd_admit(d, rec, &drid, &err), MS_ERR_IO);
    assert_int_equal(ms_engine_n_active(d), 0);
    assert_int_equal(ms_engine_kv_pages_free(d), d_free0);
    ms_free(buf);
    ms_pd_record_free(rec);
    ms_engine_free(p);
    ms_engine_free(d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_round_trip_greedy),
        ms_unit_test(test_round_trip_sampled),
        ms_unit_test(test_round_trip_prefix_cached),
        ms_unit_test(test_transfer_failure),
        ms_unit_test(test_bad_records),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
