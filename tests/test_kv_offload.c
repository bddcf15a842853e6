/*
 * test_kv_offload.c - the host tier (offload / reload with claims, LRU candidates), publish and
 * admit_retrieve (KV transfer), and their hazards: reference §9 items 6, 14, 15, 16 and hazards
 * F4, H3 (a, b, c), H4, H5c, H11, H12.
 */
#include "ms_test.h"

#include "kv_test_util.h"
#include "ms_test_impl.h"

#define PS 8

/* ---- a tracing device: forwards to the host device and records ordering operations ---- */

typedef enum trace_op_kind { OP_RECORD, OP_WAIT, OP_COPY, OP_SYNC } trace_op_kind;

typedef struct trace_op {
    trace_op_kind op;
    const void *stream;
    const void *event;
    ms_copy_kind kind;
} trace_op;

typedef struct tracer {
    ms_device *inner;
    trace_op ops[2048];
    int n;
    void (*on_sync)(void *user); /* called once, at the next synchronize */
    void *user;
    bool fail_sync;
} tracer;

static void trace(tracer *t, trace_op_kind op, const void *stream, const void *event,
                  ms_copy_kind kind) {
    if (t->n < (int)MS_ARRAY_LEN(t->ops)) {
        trace_op o = {op, stream, event, kind};
        t->ops[t->n++] = o;
    }
}

static ms_status tr_mem_info(void *self, size_t *f, size_t *t, ms_error *err) {
    return ms_device_mem_info(((tracer *)self)->inner, f, t, err);
}
static ms_status tr_alloc(void *self, size_t b, const char *n, void **out, ms_error *err) {
    return ms_device_alloc(((tracer *)self)->inner, b, n, out, err);
}
static void tr_free(void *self, void *p) { ms_device_free_mem(((tracer *)self)->inner, p); }
static ms_status tr_memset(void *self, void *p, int v, size_t b, ms_device_stream *s,
                           ms_error *err) {
    return ms_device_memset(((tracer *)self)->inner, p, v, b, s, err);
}
static ms_status tr_copy(void *self, void *d, const void *s, size_t b, ms_copy_kind k,
                         ms_device_stream *st, ms_error *err) {
    tracer *t = self;
    trace(t, OP_COPY, st, NULL, k);
    return ms_device_copy(t->inner, d, s, b, k, st, err);
}
static ms_status tr_stream_init(void *self, ms_device_stream **out, ms_error *err) {
    return ms_device_stream_init(((tracer *)self)->inner, out, err);
}
static void tr_stream_free(void *self, ms_device_stream *s) {
    ms_device_stream_free(((tracer *)self)->inner, s);
}
static ms_status tr_event_init(void *self, ms_device_event **out, ms_error *err) {
    return ms_device_event_init(((tracer *)self)->inner, out, err);
}
static void tr_event_free(void *self, ms_device_event *e) {
    ms_device_event_free(((tracer *)self)->inner, e);
}
static ms_status tr_record(void *self, ms_device_event *e, ms_device_stream *s, ms_error *err) {
    tracer *t = self;
    trace(t, OP_RECORD, s, e, MS_COPY_H2H);
    return ms_device_event_record(t->inner, e, s, err);
}
static ms_status tr_wait(void *self, ms_device_stream *s, ms_device_event *e, ms_error *err) {
    tracer *t = self;
    trace(t, OP_WAIT, s, e, MS_COPY_H2H);
    return ms_device_stream_wait(t->inner, s, e, err);
}
static ms_status tr_sync(void *self, ms_device_stream *s, ms_error *err) {
    tracer *t = self;
    trace(t, OP_SYNC, s, NULL, MS_COPY_H2H);
    if (t->on_sync != NULL) {
        void (*fn)(void *) = t->on_sync;
        t->on_sync = NULL;
        fn(t->user);
    }
    if (t->fail_sync)
        return MS_FAIL(err, MS_ERR_CUDA, "injected synchronize failure");
    return ms_device_synchronize(t->inner, s, err);
}

static const ms_device_i tracer_iface = {
    .name = "tracer",
    .mem_info = tr_mem_info,
    .alloc = tr_alloc,
    .free = tr_free,
    .memset = tr_memset,
    .copy = tr_copy,
    .stream_init = tr_stream_init,
    .stream_free = tr_stream_free,
    .event_init = tr_event_init,
    .event_free = tr_event_free,
    .event_record = tr_record,
    .stream_wait = tr_wait,
    .synchronize = tr_sync,
};

/* Fixture on a tracing device with a host tier of `host_pages`. */
static void init_traced(kv_fix *f, tracer *t, int32_t n_pages, int32_t host_pages) {
    memset(t, 0, sizeof *t);
    ms_error err = {0};
    assert_int_equal(ms_device_host_init(0, &t->inner, &err), MS_OK);
    ms_device *dev = NULL;
    assert_int_equal(ms_device_wrap_init(&tracer_iface, t, &dev, &err), MS_OK);
    kv_fix_opts o = {.dev = dev};
    kv_fix_init_opts(f, n_pages, PS, host_pages, &o);
}

static void free_traced(kv_fix *f, tracer *t) {
    kv_fix_free(f); /* frees the wrapper device (destroy is NULL: t stays ours) */
    ms_device_free(t->inner);
}

/* Write a distinct value into every stored token of (rid, label). */
static void stamp_stream(kv_fix *f, ms_rid rid, ms_label label, float base) {
    ms_kv_stream_info in = kv_info(f, rid, label);
    int32_t pages[64];
    ms_kv_pool_stream_pages(f->pool, rid, label, pages, 64);
    for (int32_t x = in.released; x < in.stored; x++)
        kv_write_token(f->arena, pages[(x - in.released) / PS], (x - in.released) % PS,
                       base + (float)x);
}

static bool stream_holds(kv_fix *f, ms_page_arena *a, ms_rid rid, ms_label label, float base) {
    ms_kv_stream_info in = kv_info(f, rid, label);
    int32_t pages[64];
    ms_kv_pool_stream_pages(f->pool, rid, label, pages, 64);
    for (int32_t x = in.released; x < in.stored; x++)
        if (!kv_token_is(a, pages[(x - in.released) / PS], (x - in.released) % PS,
                         base + (float)x))
            return false;
    return true;
}

/* ---- offload / reload ---- */

static void test_offload_without_tier_declines(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 16, PS, 0);
    kv_ingest(&f, 1);
    kv_extend(&f, 1, 0, 10);
    ms_error err = {0};
    int32_t freed = -1;
    assert_int_equal(ms_kv_pool_offload(f.pool, 1, &freed, &err), MS_ERR_UNSUPPORTED);
    assert_int_equal(freed, 0);
    assert_false(ms_kv_pool_is_offloaded(f.pool, 1));
    assert_int_equal(ms_kv_pool_reload(f.pool, 1, &err), MS_OK); /* nothing to reload */
    assert_int_equal(kv_info(&f, 1, 0).n_pages, 2);
    kv_fix_free(&f);
}

static void test_offload_reload_round_trip(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 16, PS, 16);
    kv_ingest(&f, 1);
    kv_ingest(&f, 2);
    kv_extend(&f, 1, 0, 13);
    kv_extend(&f, 1, 2, 3);
    kv_extend(&f, 2, 0, 5);
    stamp_stream(&f, 1, 0, 1000);
    stamp_stream(&f, 1, 2, 2000);
    /* a high-water reservation beyond the length is freed too but not copied */
    kv_tstep t;
    kv_step_init(&t, false);
    kv_step_seg(&t, 1, 0, 20);
    kv_run(&f, &t);
    int32_t free0 = ms_page_arena_num_free(f.arena);
    int32_t held = ms_kv_pool_reclaimable(f.pool, 1);
    assert_int_equal(held, 5 + 1);
    ms_error err = {0};
    int32_t freed = 0;
    assert_int_equal(ms_kv_pool_offload(f.pool, 1, &freed, &err), MS_OK);
    assert_int_equal(freed, held);
    assert_int_equal(ms_page_arena_num_free(f.arena), free0 + held);
    assert_true(ms_kv_pool_is_offloaded(f.pool, 1));
    assert_int_equal(ms_kv_pool_reclaimable(f.pool, 1), 0);
    ms_kv_stream_info in = kv_info(&f, 1, 0);
    assert_int_equal(in.n_pages, 0);
    assert_int_equal(in.n_host_pages, 2);
    assert_int_equal(in.stored, 13);
    kv_check_pages(&f);
    /* offloading again is a no-op */
    assert_int_equal(ms_kv_pool_offload(f.pool, 1, &freed, &err), MS_OK);
    assert_int_equal(freed, 0);
    /* admit refuses an offloaded request */
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 1);
    ms_admit_outcome o = kv_admit(&f, &t);
    assert_int_equal(o.code, MS_ADMIT_OFFLOADED);
    assert_int_equal(o.rid, 1);
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 5, 4); /* a label the request has not created yet */
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_OFFLOADED);
    /* plan refuses an offloaded stream and names it */
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 0);
    const ms_kv_plan_set *set = NULL;
    assert_int_equal(ms_kv_pool_plan(f.pool, 0, &t.step, NULL, &set, &err), MS_ERR_STATE);
    assert_non_null(strstr(err.msg, "offloaded"));
    assert_null(set);
    kv_step_init(&t, true);
    kv_step_seg(&t, 404, 0, 0);
    assert_int_equal(ms_kv_pool_plan(f.pool, 0, &t.step, NULL, &set, &err), MS_ERR_NOT_FOUND);
    assert_non_null(strstr(err.msg, "404"));
    /* scribble over the freed device pages, then reload */
    int32_t scratch[15];
    int32_t n_free = ms_page_arena_num_free(f.arena);
    assert_int_equal(ms_page_arena_acquire(f.arena, n_free, scratch), MS_OK);
    for (int32_t i = 0; i < n_free; i++)
        kv_write_token(f.arena, scratch[i], 0, -1);
    assert_int_equal(ms_page_arena_release(f.arena, scratch, n_free, &err), MS_OK);
    uint32_t gen = in.generation;
    assert_int_equal(ms_kv_pool_reload(f.pool, 1, &err), MS_OK);
    assert_false(ms_kv_pool_is_offloaded(f.pool, 1));
    in = kv_info(&f, 1, 0);
    assert_int_equal(in.stored, 13);
    assert_int_equal(in.n_pages, 2);
    assert_int_equal(in.n_host_pages, 0);
    assert_true(in.generation != gen);
    assert_true(stream_holds(&f, f.arena, 1, 0, 1000));
    assert_true(stream_holds(&f, f.arena, 1, 2, 2000));
    assert_int_equal(ms_page_arena_num_free(f.host), 15);
    kv_extend(&f, 1, 0, 4);
    assert_int_equal(kv_info(&f, 1, 0).stored, 17);
    kv_check_pages(&f);
    kv_fix_free(&f);
}

static void test_reload_all_or_nothing_when_short(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 6, PS, 16); /* 5 usable device pages */
    kv_ingest(&f, 1);
    kv_ingest(&f, 2);
    kv_extend(&f, 1, 0, 16);
    kv_extend(&f, 1, 1, 16);
    ms_error err = {0};
    assert_int_equal(ms_kv_pool_offload(f.pool, 1, NULL, &err), MS_OK);
    kv_extend(&f, 2, 0, 2 * PS); /* 3 free pages left, 4 needed */
    assert_int_equal(ms_kv_pool_reload(f.pool, 1, &err), MS_ERR_CAPACITY);
    assert_non_null(strstr(err.msg, "needs 4"));
    assert_true(ms_kv_pool_is_offloaded(f.pool, 1));
    assert_int_equal(kv_info(&f, 1, 0).n_pages, 0);
    assert_int_equal(kv_info(&f, 1, 1).n_host_pages, 2);
    assert_int_equal(ms_page_arena_num_free(f.arena), 3);
    kv_check_pages(&f);
    /* remove clears the host tier */
    ms_kv_pool_remove(f.pool, 1);
    assert_int_equal(ms_page_arena_num_free(f.host), 15);
    kv_check_pages(&f);
    kv_fix_free(&f);
}

static void test_offload_host_tier_full_changes_nothing(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 16, PS, 3); /* 2 usable host pages */
    kv_ingest(&f, 1);
    kv_extend(&f, 1, 0, 3 * PS);
    ms_error err = {0};
    assert_int_equal(ms_kv_pool_offload(f.pool, 1, NULL, &err), MS_ERR_CAPACITY);
    assert_non_null(strstr(err.msg, "kv_host_pages"));
    assert_false(ms_kv_pool_is_offloaded(f.pool, 1));
    assert_int_equal(kv_info(&f, 1, 0).n_pages, 3);
    assert_int_equal(ms_page_arena_num_free(f.host), 2);
    kv_extend(&f, 1, 0, 1); /* still usable */
    assert_int_equal(ms_kv_pool_offload(f.pool, 77, NULL, &err), MS_ERR_NOT_FOUND);
    assert_int_equal(ms_kv_pool_reload(f.pool, 77, &err), MS_ERR_NOT_FOUND);
    kv_check_pages(&f);
    kv_fix_free(&f);
}

static void test_lru_candidates_and_reclaimable(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 32, PS, 32);
    for (ms_rid r = 1; r <= 5; r++)
        kv_ingest(&f, r);
    kv_extend(&f, 3, 0, 4);
    kv_extend(&f, 1, 0, 9);
    kv_extend(&f, 4, 0, 1);
    kv_extend(&f, 2, 0, 2);
    /* 5 holds no pages: not a candidate. 4 has a step in flight: not a candidate. */
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 4, 0, 1);
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_OK);
    ms_rid out[8];
    int32_t n = ms_kv_pool_lru_candidates(f.pool, out, 8);
    assert_int_equal(n, 3);
    assert_int_equal(out[0], 3);
    assert_int_equal(out[1], 1);
    assert_int_equal(out[2], 2);
    assert_true(ms_kv_pool_last_active(f.pool, 3) < ms_kv_pool_last_active(f.pool, 2));
    assert_int_equal(ms_kv_pool_last_active(f.pool, 99), 0);
    assert_int_equal(ms_kv_pool_lru_candidates(f.pool, out, 1), 1);
    assert_int_equal(out[0], 3);
    assert_int_equal(ms_kv_pool_reclaimable(f.pool, 1), 2);
    assert_int_equal(ms_kv_pool_reclaimable(f.pool, 5), 0);
    kv_plan(&f, &t);
    kv_commit(&f, &t);
    kv_extend(&f, 3, 0, 1); /* 3 becomes the most recent */
    n = ms_kv_pool_lru_candidates(f.pool, out, 8);
    assert_int_equal(n, 4);
    assert_int_equal(out[0], 1);
    assert_int_equal(out[3], 3);
    ms_error err = {0};
    assert_int_equal(ms_kv_pool_offload(f.pool, 1, NULL, &err), MS_OK);
    n = ms_kv_pool_lru_candidates(f.pool, out, 8);
    assert_int_equal(n, 3);
    assert_int_equal(out[0], 2);
    kv_fix_free(&f);
}

/* H3a: a request with an admitted, uncommitted step cannot be offloaded. */
static void test_H3a_offload_refused_while_step_in_flight(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 16, PS, 16);
    kv_ingest(&f, 1);
    kv_extend(&f, 1, 0, 10);
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 1);
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_OK);
    ms_error err = {0};
    assert_int_equal(ms_kv_pool_offload(f.pool, 1, NULL, &err), MS_ERR_STATE);
    assert_non_null(strstr(err.msg, "in flight"));
    assert_false(ms_kv_pool_is_offloaded(f.pool, 1));
    kv_plan(&f, &t);
    kv_commit(&f, &t);
    assert_int_equal(ms_kv_pool_offload(f.pool, 1, NULL, &err), MS_OK);
    /* a rolled-back step no longer blocks */
    assert_int_equal(ms_kv_pool_reload(f.pool, 1, &err), MS_OK);
    assert_int_equal(kv_admit(&f, &t).code, MS_ADMIT_OK);
    ms_kv_pool_admit_rollback(f.pool, 0, &t.step, NULL);
    assert_int_equal(ms_kv_pool_offload(f.pool, 1, NULL, &err), MS_OK);
    kv_check_pages(&f);
    kv_fix_free(&f);
}

/* State for the concurrent-admit hook of H3b. */
typedef struct h3b_ctx {
    kv_fix *f;
    ms_admit_code same_rid;
    ms_admit_code other_rid;
    int32_t free_during;
} h3b_ctx;

static void h3b_admit_during_copy(void *user) {
    h3b_ctx *c = user;
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 2 * PS);
    c->same_rid = kv_admit(c->f, &t).code;
    kv_step_init(&t, true);
    kv_step_seg(&t, 2, 0, 2 * PS);
    c->other_rid = kv_admit(c->f, &t).code;
    kv_plan(c->f, &t);
    kv_commit(c->f, &t);
    c->free_during = ms_page_arena_num_free(c->f->arena);
}

/* H3b: an admit that runs while the offload copies (lock released) cannot attach pages to the
 * claimed request; nothing leaks and the free count is conserved. */
static void test_H3b_admit_during_offload_copy_no_leak(void **state) {
    (void)state;
    kv_fix f;
    tracer tr;
    init_traced(&f, &tr, 32, 32);
    kv_ingest(&f, 1);
    kv_ingest(&f, 2);
    kv_extend(&f, 1, 0, 20);
    h3b_ctx c = {.f = &f};
    tr.on_sync = h3b_admit_during_copy;
    tr.user = &c;
    ms_error err = {0};
    int32_t freed = 0;
    assert_int_equal(ms_kv_pool_offload(f.pool, 1, &freed, &err), MS_OK);
    assert_int_equal(c.same_rid, MS_ADMIT_OFFLOADED);
    assert_int_equal(c.other_rid, MS_ADMIT_OK);
    assert_int_equal(freed, 3);
    assert_int_equal(ms_page_arena_num_free(f.arena), c.free_during + 3);
    assert_int_equal(kv_info(&f, 1, 0).n_pages, 0);
    assert_int_equal(kv_check_pages(&f), 2);
    free_traced(&f, &tr);
}

static void h3b_reset_during_copy(void *user) {
    h3b_ctx *c = user;
    ms_kv_pool_reset(c->f->pool, 1, false);
}

/* H3b: a stream that changes while the copy runs makes the offload abandon: the device pages
 * stay with the stream, the host copies are dropped. */
static void test_H3b_change_during_offload_abandons(void **state) {
    (void)state;
    kv_fix f;
    tracer tr;
    init_traced(&f, &tr, 32, 32);
    kv_ingest(&f, 1);
    kv_extend(&f, 1, 0, 20);
    h3b_ctx c = {.f = &f};
    tr.on_sync = h3b_reset_during_copy;
    tr.user = &c;
    ms_error err = {0};
    int32_t freed = -1;
    assert_int_equal(ms_kv_pool_offload(f.pool, 1, &freed, &err), MS_ERR_STATE);
    assert_non_null(strstr(err.msg, "changed"));
    assert_int_equal(freed, 0);
    assert_false(ms_kv_pool_is_offloaded(f.pool, 1));
    ms_kv_stream_info in = kv_info(&f, 1, 0);
    assert_int_equal(in.stored, 0);
    assert_int_equal(in.n_pages, 3);
    assert_int_equal(in.n_host_pages, 0);
    assert_int_equal(ms_page_arena_num_free(f.host), 31);
    kv_check_pages(&f);
    /* a device failure while copying abandons too */
    kv_extend(&f, 1, 0, 5);
    tr.fail_sync = true;
    assert_int_equal(ms_kv_pool_offload(f.pool, 1, NULL, &err), MS_ERR_CUDA);
    tr.fail_sync = false;
    assert_false(ms_kv_pool_is_offloaded(f.pool, 1));
    assert_int_equal(kv_info(&f, 1, 0).stored, 5);
    kv_check_pages(&f);
    free_traced(&f, &tr);
}

/* H3c: a commit that arrives after a successful offload drops its spans; reload restores the
 * pre-offload length. */
static void test_H3c_commit_after_offload_drops_spans(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 16, PS, 16);
    kv_ingest(&f, 1);
    kv_extend(&f, 1, 0, 10);
    ms_error err = {0};
    assert_int_equal(ms_kv_pool_offload(f.pool, 1, NULL, &err), MS_OK);
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 3);
    kv_step_post_fork(&t, 0, 1);
    ms_log_set_level(MS_LOG_ERROR); /* the drop is logged as a warning */
    kv_commit(&f, &t);
    ms_log_set_level(MS_LOG_INFO);
    assert_int_equal(kv_info(&f, 1, 0).stored, 10);
    ms_kv_stream_info none;
    assert_int_equal(ms_kv_pool_stream_info(f.pool, 1, 1, &none), MS_ERR_NOT_FOUND);
    assert_int_equal(ms_kv_pool_reload(f.pool, 1, &err), MS_OK);
    assert_int_equal(kv_info(&f, 1, 0).stored, 10);
    kv_check_pages(&f);
    kv_fix_free(&f);
}

/* H4: the device-to-host copies of an offload are ordered after an event recorded on the
 * compute stream; reload makes the compute stream wait for its host-to-device copies. */
static void test_H4_offload_copies_wait_on_compute_event(void **state) {
    (void)state;
    kv_fix f;
    tracer tr;
    init_traced(&f, &tr, 32, 32);
    kv_ingest(&f, 1);
    kv_extend(&f, 1, 0, 20);
    tr.n = 0;
    ms_error err = {0};
    assert_int_equal(ms_kv_pool_offload(f.pool, 1, NULL, &err), MS_OK);
    int rec = -1, wait = -1, first_copy = -1, last_copy = -1, sync = -1;
    for (int i = 0; i < tr.n; i++) {
        trace_op *o = &tr.ops[i];
        if (o->op == OP_RECORD && o->stream == f.compute && rec < 0)
            rec = i;
        if (o->op == OP_WAIT && o->stream == f.copy && o->event == tr.ops[rec < 0 ? 0 : rec].event)
            wait = i;
        if (o->op == OP_COPY) {
            assert_int_equal(o->kind, MS_COPY_D2H);
            assert_ptr_equal(o->stream, f.copy);
            if (first_copy < 0)
                first_copy = i;
            last_copy = i;
        }
        if (o->op == OP_SYNC && o->stream == f.copy)
            sync = i;
    }
    assert_true(rec >= 0 && wait > rec && first_copy > wait && sync > last_copy);
    assert_int_equal(last_copy - first_copy + 1, 3 * 2); /* 3 pages x 2 layers */
    /* reload: the copy stream waits for the compute stream (the new pages may still be read by
     * a running forward), copies, then the compute stream waits on the copies' event */
    tr.n = 0;
    assert_int_equal(ms_kv_pool_reload(f.pool, 1, &err), MS_OK);
    int copies = 0, rec2 = -1, wait2 = -1, rec1 = -1, wait1 = -1;
    for (int i = 0; i < tr.n; i++) {
        trace_op *o = &tr.ops[i];
        if (o->op == OP_RECORD && o->stream == f.compute && rec1 < 0)
            rec1 = i;
        if (o->op == OP_WAIT && o->stream == f.copy && rec1 >= 0 && o->event == tr.ops[rec1].event)
            wait1 = i;
        if (o->op == OP_COPY) {
            assert_int_equal(o->kind, MS_COPY_H2D);
            assert_ptr_equal(o->stream, f.copy);
            assert_true(rec2 < 0);
            assert_true(wait1 > rec1 && wait1 >= 0 && i > wait1);
            copies++;
        }
        if (o->op == OP_RECORD && o->stream == f.copy)
            rec2 = i;
        if (o->op == OP_WAIT && o->stream == f.compute && rec2 >= 0 &&
            o->event == tr.ops[rec2].event)
            wait2 = i;
    }
    assert_int_equal(copies, 6);
    assert_true(rec2 >= 0 && wait2 > rec2);
    /* pre/post-fork copies go to the compute stream (ordered after the running step, H5d) */
    tr.n = 0;
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_pre_fork(&t, 0, 1);
    kv_step_seg(&t, 1, 1, 1);
    kv_run(&f, &t);
    int fork_copies = 0;
    for (int i = 0; i < tr.n; i++)
        if (tr.ops[i].op == OP_COPY) {
            assert_ptr_equal(tr.ops[i].stream, f.compute);
            assert_int_equal(tr.ops[i].kind, MS_COPY_D2D);
            fork_copies++;
        }
    assert_int_equal(fork_copies, 3 * 2);
    free_traced(&f, &tr);
}

/* H5c: a fork whose source belongs to an offloaded request is refused. */
static void test_H5c_fork_from_offloaded_source_refused(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 16, PS, 16);
    kv_ingest(&f, 1);
    kv_ingest(&f, 2);
    kv_extend(&f, 1, 0, 10);
    ms_error err = {0};
    assert_int_equal(ms_kv_pool_offload(f.pool, 1, NULL, &err), MS_OK);
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 2, 0, 1);
    kv_step_row(&t, 2);
    kv_step_row(&t, 1); /* the fork applies to every row */
    kv_step_pre_fork(&t, 0, 1);
    int32_t free0 = ms_page_arena_num_free(f.arena);
    ms_admit_outcome o = kv_admit(&f, &t);
    assert_int_equal(o.code, MS_ADMIT_OFFLOADED);
    assert_int_equal(o.rid, 1);
    assert_int_equal(ms_page_arena_num_free(f.arena), free0);
    kv_fix_free(&f);
}

/* ---- publish / retrieve ---- */

/* A transfer back end that copies real bytes between two arenas when a transfer completes. */
typedef struct xfer {
    ms_page_arena *remote;
    ms_page_arena *local;
    struct {
        ms_kv_transfer_desc d;
        int32_t local_pages[64];
        int32_t remote_pages[64];
        ms_kv_transfer_state st;
    } t[32];
    int n;
    int polls;
    bool instant;
    bool fail;
    kv_fix *reenter; /* wait() calls into this pool (F4: must not deadlock) */
} xfer;

static void xfer_copy(xfer *x, int h) {
    const ms_kv_transfer_desc *d = &x->t[h].d;
    const ms_page_arena_config *c = ms_page_arena_get_config(x->local);
    size_t row = (size_t)c->n_kv_heads * (size_t)c->head_dim * (size_t)c->elem_bytes;
    for (int32_t tok = d->token_begin; tok < d->token_end; tok++) {
        int32_t i = (tok - d->start) / d->page_size, s = (tok - d->start) % d->page_size;
        for (int32_t l = 0; l < c->n_layers; l++)
            for (int kv = 0; kv < 2; kv++)
                memcpy(ms_page_arena_token_ptr(x->local, l, x->t[h].local_pages[i], kv, s),
                       ms_page_arena_token_ptr(x->remote, l, x->t[h].remote_pages[i], kv, s),
                       row);
    }
}

static void xfer_finish(xfer *x, int h) {
    if (x->t[h].st != MS_KV_TRANSFER_PENDING)
        return;
    if (x->fail) {
        x->t[h].st = MS_KV_TRANSFER_FAILED;
        return;
    }
    xfer_copy(x, h);
    x->t[h].st = MS_KV_TRANSFER_DONE;
}

static ms_status xfer_start(void *ctx, const ms_kv_transfer_desc *d, uint64_t *h, ms_error *err) {
    (void)err;
    xfer *x = ctx;
    assert_true(x->n < 32 && d->n_local_pages <= 64 && d->n_remote_pages <= 64);
    x->t[x->n].d = *d;
    memcpy(x->t[x->n].local_pages, d->local_pages, (size_t)d->n_local_pages * sizeof(int32_t));
    memcpy(x->t[x->n].remote_pages, d->remote_pages, (size_t)d->n_remote_pages * sizeof(int32_t));
    x->t[x->n].st = MS_KV_TRANSFER_PENDING;
    x->t[x->n].d.local_pages = NULL; /* only valid during start */
    x->t[x->n].d.remote_pages = NULL;
    *h = (uint64_t)x->n;
    if (x->instant)
        xfer_finish(x, x->n);
    x->n++;
    return MS_OK;
}

static ms_kv_transfer_state xfer_poll(void *ctx, uint64_t h) {
    xfer *x = ctx;
    x->polls++;
    return x->t[h].st;
}

static ms_kv_transfer_state xfer_wait(void *ctx, uint64_t h) {
    xfer *x = ctx;
    if (x->reenter != NULL)
        (void)ms_kv_pool_num_requests(x->reenter->pool); /* deadlocks if the lock were held */
    xfer_finish(x, (int)h);
    return x->t[h].st;
}

static const ms_kv_transfer_i xfer_i = {.start = xfer_start, .poll = xfer_poll, .wait = xfer_wait};

/* Producer pool `p` and consumer pool `c` (with the transfer) on one host device. */
static void init_pd(kv_fix *p, kv_fix *c, xfer *x, int32_t c_pages) {
    memset(x, 0, sizeof *x);
    kv_fix_init(p, 32, PS, 0);
    kv_fix_opts o = {.transfer = &xfer_i, .transfer_ctx = x};
    kv_fix_init_opts(c, c_pages, PS, 0, &o);
    x->remote = p->arena;
    x->local = c->arena;
}

static void test_publish_copies_and_unknown_publishes_nothing(void **state) {
    (void)state;
    kv_fix f;
    kv_fix_init(&f, 32, PS, 0);
    kv_ingest(&f, 1);
    kv_extend(&f, 1, 0, 12);
    kv_extend(&f, 1, 3, 4);
    ms_error err = {0};
    ms_kv_published *pub = NULL;
    assert_int_equal(ms_kv_pool_publish(f.pool, 1, &pub, &err), MS_OK);
    assert_int_equal(pub->n_streams, 2);
    assert_int_equal(pub->page_size, PS);
    assert_int_equal(pub->streams[0].label, 0);
    assert_int_equal(pub->streams[0].length, 12);
    assert_int_equal(pub->streams[0].n_pages, 2);
    assert_int_equal(pub->streams[1].label, 3);
    int32_t p0 = pub->streams[0].pages[0];
    /* H11: a copy: later changes and removal do not touch it */
    ms_kv_pool_reset(f.pool, 1, true);
    ms_kv_pool_remove(f.pool, 1);
    assert_int_equal(pub->streams[0].pages[0], p0);
    assert_int_equal(pub->streams[0].length, 12);
    ms_kv_published *none = (ms_kv_published *)1;
    assert_int_equal(ms_kv_pool_publish(f.pool, 1, &none, &err), MS_ERR_NOT_FOUND);
    assert_null(none);
    ms_kv_published_free(pub);
    ms_kv_published_free(NULL);
    /* publishing an offloaded request is refused */
    kv_fix g;
    kv_fix_init(&g, 8, PS, 8);
    kv_ingest(&g, 1);
    kv_extend(&g, 1, 0, 3);
    assert_int_equal(ms_kv_pool_offload(g.pool, 1, NULL, &err), MS_OK);
    assert_int_equal(ms_kv_pool_publish(g.pool, 1, &pub, &err), MS_ERR_STATE);
    kv_fix_free(&g);
    kv_fix_free(&f);
}

static void test_publish_retrieve_round_trip(void **state) {
    (void)state;
    kv_fix p, c;
    xfer x;
    init_pd(&p, &c, &x, 32);
    kv_ingest(&p, 1);
    kv_extend(&p, 1, 0, 19);
    kv_extend(&p, 1, 2, 5);
    stamp_stream(&p, 1, 0, 100);
    stamp_stream(&p, 1, 2, 500);
    ms_error err = {0};
    ms_kv_published *pub = NULL;
    assert_int_equal(ms_kv_pool_publish(p.pool, 1, &pub, &err), MS_OK);
    kv_ingest(&c, 1);
    x.instant = true;
    ms_admit_outcome o = ms_kv_pool_admit_retrieve(c.pool, 1, pub);
    assert_int_equal(o.code, MS_ADMIT_OK); /* an instant transfer is not pending */
    assert_int_equal(x.n, 2);
    /* writes are ordered after the compute stream (pages may come from a running step) */
    assert_non_null(x.t[0].d.compute_done);
    assert_int_equal(kv_info(&c, 1, 0).stored, 19);
    assert_int_equal(kv_info(&c, 1, 2).stored, 5);
    assert_false(kv_info(&c, 1, 0).read_pending);
    assert_true(stream_holds(&c, c.arena, 1, 0, 100));
    assert_true(stream_holds(&c, c.arena, 1, 2, 500));
    /* decode continues on the consumer */
    kv_extend(&c, 1, 0, 1);
    assert_int_equal(kv_info(&c, 1, 0).stored, 20);
    /* retrieving the same (now stale) publish again changes nothing and starts nothing */
    assert_int_equal(ms_kv_pool_admit_retrieve(c.pool, 1, pub).code, MS_ADMIT_OK);
    assert_int_equal(x.n, 2);
    assert_int_equal(kv_info(&c, 1, 0).stored, 20);
    /* the producer grows: only the new tokens move */
    kv_extend(&p, 1, 0, 10);
    stamp_stream(&p, 1, 0, 100);
    ms_kv_published_free(pub);
    assert_int_equal(ms_kv_pool_publish(p.pool, 1, &pub, &err), MS_OK);
    assert_int_equal(ms_kv_pool_admit_retrieve(c.pool, 1, pub).code, MS_ADMIT_OK);
    assert_int_equal(x.n, 3);
    assert_int_equal(x.t[2].d.token_begin, 20);
    assert_int_equal(x.t[2].d.token_end, 29);
    ms_kv_published_free(pub);
    kv_check_pages(&c);
    kv_fix_free(&p);
    kv_fix_free(&c);
}

/* A pending transfer: admit_retrieve and admit report PENDING, polling never restarts it. */
static void test_retrieve_pending_until_done(void **state) {
    (void)state;
    kv_fix p, c;
    xfer x;
    init_pd(&p, &c, &x, 32);
    kv_ingest(&p, 1);
    kv_extend(&p, 1, 0, 9);
    stamp_stream(&p, 1, 0, 7);
    ms_error err = {0};
    ms_kv_published *pub = NULL;
    assert_int_equal(ms_kv_pool_publish(p.pool, 1, &pub, &err), MS_OK);
    kv_ingest(&c, 1);
    assert_int_equal(ms_kv_pool_admit_retrieve(c.pool, 1, pub).code, MS_ADMIT_PENDING);
    assert_true(kv_info(&c, 1, 0).read_pending);
    assert_int_equal(kv_info(&c, 1, 0).stored, 9);
    for (int k = 0; k < 3; k++)
        assert_int_equal(ms_kv_pool_admit_retrieve(c.pool, 1, pub).code, MS_ADMIT_PENDING);
    assert_int_equal(x.n, 1);
    /* admit reports pending residency and reserves nothing meanwhile */
    int32_t free0 = ms_page_arena_num_free(c.arena);
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 10);
    assert_int_equal(kv_admit(&c, &t).code, MS_ADMIT_PENDING);
    assert_int_equal(ms_page_arena_num_free(c.arena), free0);
    /* plan refuses a stream still receiving */
    const ms_kv_plan_set *set = NULL;
    assert_int_equal(ms_kv_pool_plan(c.pool, 0, &t.step, NULL, &set, &err), MS_ERR_STATE);
    /* offload refuses it too */
    xfer_finish(&x, 0);
    assert_int_equal(ms_kv_pool_admit_retrieve(c.pool, 1, pub).code, MS_ADMIT_OK);
    assert_int_equal(x.n, 1);
    assert_true(stream_holds(&c, c.arena, 1, 0, 7));
    assert_int_equal(kv_admit(&c, &t).code, MS_ADMIT_OK);
    kv_plan(&c, &t);
    kv_commit(&c, &t);
    assert_int_equal(kv_info(&c, 1, 0).stored, 19);
    ms_kv_published_free(pub);
    kv_fix_free(&p);
    kv_fix_free(&c);
}

/* admit_retrieve can fail like an admit (pages short): nothing changes, not terminal. */
static void test_retrieve_pages_short_changes_nothing(void **state) {
    (void)state;
    kv_fix p, c;
    xfer x;
    init_pd(&p, &c, &x, 3); /* consumer: 2 usable pages */
    kv_ingest(&p, 1);
    kv_extend(&p, 1, 0, 20);
    ms_error err = {0};
    ms_kv_published *pub = NULL;
    assert_int_equal(ms_kv_pool_publish(p.pool, 1, &pub, &err), MS_OK);
    kv_ingest(&c, 1);
    x.instant = true;
    ms_admit_outcome o = ms_kv_pool_admit_retrieve(c.pool, 1, pub);
    assert_int_equal(o.code, MS_ADMIT_PAGES_SHORT);
    assert_int_equal(o.pages_short, 1);
    assert_int_equal(x.n, 0);
    assert_int_equal(kv_info(&c, 1, 0).stored, 0);
    assert_int_equal(ms_page_arena_num_free(c.arena), 2);
    /* unknown request */
    assert_int_equal(ms_kv_pool_admit_retrieve(c.pool, 9, pub).code, MS_ADMIT_INVALID);
    assert_int_equal(ms_kv_pool_admit_retrieve(c.pool, 1, NULL).code, MS_ADMIT_INVALID);
    ms_kv_published_free(pub);
    kv_fix_free(&p);
    kv_fix_free(&c);
}

/* H12: a failed transfer is latched as a terminal failure of that request only. */
static void test_H12_failed_transfer_is_terminal_for_the_request(void **state) {
    (void)state;
    kv_fix p, c;
    xfer x;
    init_pd(&p, &c, &x, 32);
    kv_ingest(&p, 1);
    kv_extend(&p, 1, 0, 12);
    ms_error err = {0};
    ms_kv_published *pub = NULL;
    assert_int_equal(ms_kv_pool_publish(p.pool, 1, &pub, &err), MS_OK);
    kv_ingest(&c, 1);
    kv_ingest(&c, 2);
    assert_int_equal(ms_kv_pool_admit_retrieve(c.pool, 1, pub).code, MS_ADMIT_PENDING);
    x.fail = true;
    xfer_finish(&x, 0);
    ms_admit_outcome o = ms_kv_pool_admit_retrieve(c.pool, 1, pub);
    assert_int_equal(o.code, MS_ADMIT_TRANSFER_FAILED);
    assert_true(ms_admit_failed(o));
    assert_true(kv_info(&c, 1, 0).read_error);
    /* terminal: every later admit of it fails the same way */
    kv_tstep t;
    kv_step_init(&t, true);
    kv_step_seg(&t, 1, 0, 1);
    assert_int_equal(kv_admit(&c, &t).code, MS_ADMIT_TRANSFER_FAILED);
    assert_int_equal(ms_kv_pool_admit_retrieve(c.pool, 1, pub).code, MS_ADMIT_TRANSFER_FAILED);
    /* other requests are unaffected */
    kv_extend(&c, 2, 0, 4);
    /* remove frees what it held */
    ms_kv_pool_remove(c.pool, 1);
    assert_int_equal(kv_check_pages(&c), 1);
    /* a world-size mismatch fails only that request, without raising */
    ms_kv_published bad = *pub;
    bad.world_size = 2;
    bad.n_streams = 0;
    kv_ingest(&c, 3);
    assert_int_equal(ms_kv_pool_admit_retrieve(c.pool, 3, &bad).code, MS_ADMIT_TRANSFER_FAILED);
    kv_step_init(&t, true);
    kv_step_seg(&t, 3, 0, 1);
    assert_int_equal(kv_admit(&c, &t).code, MS_ADMIT_TRANSFER_FAILED);
    kv_extend(&c, 2, 0, 4);
    /* reset (dummy-row reuse) clears the latch */
    ms_kv_pool_reset(c.pool, 3, true);
    assert_int_equal(kv_admit(&c, &t).code, MS_ADMIT_OK);
    ms_kv_published_free(pub);
    kv_fix_free(&p);
    kv_fix_free(&c);
}

static void test_H12_start_failure_and_no_transfer_interface(void **state) {
    (void)state;
    kv_fix f;
    kv_fake_transfer fx = {.fail_start = true};
    kv_fix_opts o = {.transfer = &kv_fake_transfer_i, .transfer_ctx = &fx};
    kv_fix_init_opts(&f, 16, PS, 0, &o);
    kv_ingest(&f, 1);
    ms_kv_published pub = {.rid = 1, .world_size = 1, .page_size = PS, .n_streams = 1};
    int32_t pages[] = {3, 4};
    pub.streams[0] = (ms_kv_published_stream){0, 12, 0, 2, pages};
    ms_log_set_level(MS_LOG_ERROR);
    assert_int_equal(ms_kv_pool_admit_retrieve(f.pool, 1, &pub).code, MS_ADMIT_TRANSFER_FAILED);
    ms_log_set_level(MS_LOG_INFO);
    kv_check_pages(&f);
    ms_kv_pool_remove(f.pool, 1);
    assert_int_equal(ms_page_arena_num_free(f.arena), 15);
    kv_fix_free(&f);
    /* no transfer interface at all */
    kv_fix g;
    kv_fix_init(&g, 16, PS, 0);
    kv_ingest(&g, 1);
    assert_int_equal(ms_kv_pool_admit_retrieve(g.pool, 1, &pub).code, MS_ADMIT_TRANSFER_FAILED);
    kv_fix_free(&g);
}

/* F4: remove waits for a pending transfer with the pool's lock released (the back end's wait
 * calls into the pool), then frees everything. */
static void test_F4_remove_waits_for_transfer_outside_lock(void **state) {
    (void)state;
    kv_fix p, c;
    xfer x;
    init_pd(&p, &c, &x, 32);
    x.reenter = &c;
    kv_ingest(&p, 1);
    kv_extend(&p, 1, 0, 30);
    ms_error err = {0};
    ms_kv_published *pub = NULL;
    assert_int_equal(ms_kv_pool_publish(p.pool, 1, &pub, &err), MS_OK);
    kv_ingest(&c, 1);
    assert_int_equal(ms_kv_pool_admit_retrieve(c.pool, 1, pub).code, MS_ADMIT_PENDING);
    assert_int_equal(x.t[0].st, MS_KV_TRANSFER_PENDING);
    ms_kv_pool_remove(c.pool, 1);
    assert_int_equal(x.t[0].st, MS_KV_TRANSFER_DONE); /* waited before freeing the pages */
    assert_false(ms_kv_pool_has_request(c.pool, 1));
    assert_int_equal(ms_page_arena_num_free(c.arena), 31);
    /* reset also drains first */
    kv_ingest(&c, 2);
    assert_int_equal(ms_kv_pool_admit_retrieve(c.pool, 2, pub).code, MS_ADMIT_PENDING);
    ms_kv_pool_reset(c.pool, 2, true);
    assert_int_equal(x.t[1].st, MS_KV_TRANSFER_DONE);
    assert_int_equal(kv_info(&c, 2, 0).stored, 0);
    assert_int_equal(ms_page_arena_num_free(c.arena), 31);
    /* freeing the pool with a transfer pending waits too */
    kv_ingest(&c, 3);
    assert_int_equal(ms_kv_pool_admit_retrieve(c.pool, 3, pub).code, MS_ADMIT_PENDING);
    x.reenter = NULL;
    ms_kv_published_free(pub);
    kv_fix_free(&c); /* the consumer first: its pending transfer reads the producer's arena */
    assert_int_equal(x.t[2].st, MS_KV_TRANSFER_DONE);
    kv_fix_free(&p);
}

/* Retention travels with publish: the consumer mirrors the start and fetches only the pages
 * still present. */
static void test_retrieve_with_retention_start(void **state) {
    (void)state;
    kv_fix p, c;
    xfer x;
    memset(&x, 0, sizeof x);
    kv_fix_opts po = {.window = 8};
    kv_fix_init_opts(&p, 32, PS, 0, &po);
    kv_fix_opts co = {.transfer = &xfer_i, .transfer_ctx = &x, .window = 8};
    kv_fix_init_opts(&c, 32, PS, 0, &co);
    x.remote = p.arena;
    x.local = c.arena;
    x.instant = true;
    kv_ingest(&p, 1);
    for (int k = 0; k < 7; k++)
        kv_extend(&p, 1, 0, 5);
    stamp_stream(&p, 1, 0, 0);
    ms_error err = {0};
    ms_kv_published *pub = NULL;
    assert_int_equal(ms_kv_pool_publish(p.pool, 1, &pub, &err), MS_OK);
    assert_true(pub->streams[0].start > 0);
    kv_ingest(&c, 1);
    assert_int_equal(ms_kv_pool_admit_retrieve(c.pool, 1, pub).code, MS_ADMIT_OK);
    ms_kv_stream_info in = kv_info(&c, 1, 0);
    assert_int_equal(in.stored, 35);
    assert_int_equal(in.released, pub->streams[0].start);
    assert_int_equal(x.t[0].d.token_begin, pub->streams[0].start);
    assert_true(stream_holds(&c, c.arena, 1, 0, 0));
    ms_kv_published_free(pub);
    kv_fix_free(&p);
    kv_fix_free(&c);
}

/* H4 for transfers: pages a transfer fills may have been released by a commit whose forward is
 * still running, so admit_retrieve hands the back end an event recorded on the compute stream. */
static void test_H4_transfer_ordered_after_compute_event(void **state) {
    (void)state;
    tracer tr;
    memset(&tr, 0, sizeof tr);
    ms_error err = {0};
    assert_int_equal(ms_device_host_init(0, &tr.inner, &err), MS_OK);
    ms_device *dev = NULL;
    assert_int_equal(ms_device_wrap_init(&tracer_iface, &tr, &dev, &err), MS_OK);
    kv_fake_transfer fx = {.instant = true};
    kv_fix_opts o = {.dev = dev, .transfer = &kv_fake_transfer_i, .transfer_ctx = &fx};
    kv_fix f;
    kv_fix_init_opts(&f, 16, PS, 0, &o);
    kv_ingest(&f, 1);
    ms_kv_published pub = {.rid = 1, .world_size = 1, .page_size = PS, .n_streams = 1};
    int32_t pages[] = {3, 4};
    pub.streams[0] = (ms_kv_published_stream){0, 12, 0, 2, pages};
    tr.n = 0;
    assert_int_equal(ms_kv_pool_admit_retrieve(f.pool, 1, &pub).code, MS_ADMIT_OK);
    assert_int_equal(fx.n, 1);
    int rec = -1;
    for (int i = 0; i < tr.n; i++)
        if (tr.ops[i].op == OP_RECORD && tr.ops[i].stream == f.compute)
            rec = i;
    assert_true(rec >= 0);
    assert_ptr_equal(fx.descs[0].compute_done, tr.ops[rec].event);
    /* polling a finished retrieve records nothing new */
    tr.n = 0;
    assert_int_equal(ms_kv_pool_admit_retrieve(f.pool, 1, &pub).code, MS_ADMIT_OK);
    assert_int_equal(tr.n, 0);
    kv_fix_free(&f);
    ms_device_free(tr.inner);
}

/* The request's retrieve_labels filter which published labels are pulled. */
static void test_retrieve_only_needed_labels(void **state) {
    (void)state;
    kv_fix p, c;
    xfer x;
    init_pd(&p, &c, &x, 32);
    x.instant = true;
    kv_ingest(&p, 1);
    kv_extend(&p, 1, 0, 9);
    kv_extend(&p, 1, 1, 6);
    kv_extend(&p, 1, 2, 3);
    ms_error err = {0};
    ms_kv_published *pub = NULL;
    assert_int_equal(ms_kv_pool_publish(p.pool, 1, &pub, &err), MS_OK);
    ms_kv_request_config rc = {.retrieve_labels = (1u << 0) | (1u << 2)};
    assert_int_equal(ms_kv_pool_ingest(c.pool, 1, &rc, &err), MS_OK);
    assert_int_equal(ms_kv_pool_admit_retrieve(c.pool, 1, pub).code, MS_ADMIT_OK);
    assert_int_equal(x.n, 2);
    assert_int_equal(kv_info(&c, 1, 0).stored, 9);
    assert_int_equal(kv_info(&c, 1, 2).stored, 3);
    ms_kv_stream_info none;
    assert_int_equal(ms_kv_pool_stream_info(c.pool, 1, 1, &none), MS_ERR_NOT_FOUND);
    /* a page-size mismatch is a failed transfer for the request */
    ms_kv_published bad = *pub;
    bad.page_size = PS * 2;
    bad.n_streams = 0;
    kv_ingest(&c, 2);
    assert_int_equal(ms_kv_pool_admit_retrieve(c.pool, 2, &bad).code, MS_ADMIT_TRANSFER_FAILED);
    ms_kv_published_free(pub);
    kv_fix_free(&c);
    kv_fix_free(&p);
}

/* The resource interface's publish / admit_retrieve, as the runner's publish sweep uses them. */
static void test_resource_vtable_publish_and_retrieve(void **state) {
    (void)state;
    kv_fix p, c;
    xfer x;
    init_pd(&p, &c, &x, 32);
    x.instant = true;
    const ms_resource_i *ri = ms_kv_pool_resource_i();
    assert_non_null(ri->publish);
    assert_non_null(ri->published_free);
    assert_non_null(ri->admit_retrieve);
    kv_ingest(&p, 1);
    kv_extend(&p, 1, 0, 11);
    ms_error err = {0};
    void *pub = (void *)1;
    assert_int_equal(ri->publish(p.pool, 42, &pub, &err), MS_OK); /* holds nothing for 42 */
    assert_null(pub);
    assert_int_equal(ri->publish(p.pool, 1, &pub, &err), MS_OK);
    assert_non_null(pub);
    kv_ingest(&c, 1);
    assert_int_equal(ri->admit_retrieve(c.pool, 1, pub).code, MS_ADMIT_OK);
    assert_int_equal(kv_info(&c, 1, 0).stored, 11);
    assert_int_equal(ri->admit_retrieve(c.pool, 1, NULL).code, MS_ADMIT_OK);
    ri->published_free(p.pool, pub);
    kv_fix_free(&c);
    kv_fix_free(&p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_offload_without_tier_declines),
        ms_unit_test(test_offload_reload_round_trip),
        ms_unit_test(test_reload_all_or_nothing_when_short),
        ms_unit_test(test_offload_host_tier_full_changes_nothing),
        ms_unit_test(test_lru_candidates_and_reclaimable),
        ms_unit_test(test_H3a_offload_refused_while_step_in_flight),
        ms_unit_test(test_H3b_admit_during_offload_copy_no_leak),
        ms_unit_test(test_H3b_change_during_offload_abandons),
        ms_unit_test(test_H3c_commit_after_offload_drops_spans),
        ms_unit_test(test_H4_offload_copies_wait_on_compute_event),
        ms_unit_test(test_H5c_fork_from_offloaded_source_refused),
        ms_unit_test(test_publish_copies_and_unknown_publishes_nothing),
        ms_unit_test(test_publish_retrieve_round_trip),
        ms_unit_test(test_retrieve_pending_until_done),
        ms_unit_test(test_retrieve_pages_short_changes_nothing),
        ms_unit_test(test_H12_failed_transfer_is_terminal_for_the_request),
        ms_unit_test(test_H12_start_failure_and_no_transfer_interface),
        ms_unit_test(test_F4_remove_waits_for_transfer_outside_lock),
        ms_unit_test(test_retrieve_with_retention_start),
        ms_unit_test(test_H4_transfer_ordered_after_compute_event),
        ms_unit_test(test_retrieve_only_needed_labels),
        ms_unit_test(test_resource_vtable_publish_and_retrieve),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
