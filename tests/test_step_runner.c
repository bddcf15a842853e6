/*
 * test_step_runner.c - the step runner (reference §9 items 20, 21; hazard H2 across resources):
 * dependency order (deps first, ties by name, transitive; unknown/self/cyclic rejected), plan
 * results passed by key and cleared first, undeclared resources skipped, admit all-or-nothing
 * with rollback of earlier resources and the failing index, pending readiness, commit order,
 * publish/ingest sweeps and a step naming a resource the node lacks.
 */
#include "ms_test.h"

#include <string.h>

#include "kv_mock.h"
#include "positions.h"
#include "step_runner.h"

#include "ms_test_impl.h"

/* ---- probe resource: records calls into a shared trace ---- */

typedef struct probe_config {
    const char *name;       /* trace prefix */
    ms_resource_kind kind;
    char *trace;            /* shared buffer */
    size_t trace_cap;
    ms_admit_code admit_code; /* what admit returns */
    int read_index;         /* resource index whose plan result plan() records, -1 none */
    bool publish;           /* publishes an int copy of the rid */
    bool fail_ingest;
} probe_config;

typedef struct probe {
    probe_config cfg;
    int plan_value;           /* this probe's plan output (address used as identity) */
    const void *seen;         /* plan_results[read_index] observed at plan */
    const void *overrides;    /* last ingest override */
    int n_admit, n_rollback, n_plan, n_commit, n_ingest, n_remove, n_reset;
    ms_admit_code retrieve_code;
} probe;

static void probe_trace(probe *p, const char *verb) {
    size_t len = strlen(p->cfg.trace);
    snprintf(p->cfg.trace + len, p->cfg.trace_cap - len, "%s.%s ", p->cfg.name, verb);
}

static ms_status probe_ingest(void *self, ms_rid rid, const void *ov, ms_error *err) {
    (void)rid;
    probe *p = self;
    if (p->cfg.fail_ingest)
        return MS_FAIL(err, MS_ERR_OOM, "probe %s out of memory", p->cfg.name);
    p->n_ingest++;
    p->overrides = ov;
    probe_trace(p, "ingest");
    return MS_OK;
}
static void probe_remove(void *self, ms_rid rid) {
    (void)rid;
    probe *p = self;
    p->n_remove++;
    probe_trace(p, "remove");
}
static void probe_reset(void *self, ms_rid rid, bool free_pages) {
    (void)rid;
    (void)free_pages;
    probe *p = self;
    p->n_reset++;
    probe_trace(p, "reset");
}
static ms_admit_outcome probe_admit(void *self, int index, const ms_step *step, ms_step_ctx *ctx) {
    (void)index;
    (void)step;
    (void)ctx;
    probe *p = self;
    p->n_admit++;
    probe_trace(p, "admit");
    ms_admit_outcome o = ms_admit_ok();
    o.code = p->cfg.admit_code;
    if (o.code == MS_ADMIT_PAGES_SHORT) {
        o.pages_short = 3;
        o.rid = 42;
        o.label = 2;
    }
    return o;
}
static void probe_rollback(void *self, int index, const ms_step *step, ms_step_ctx *ctx) {
    (void)index;
    (void)step;
    (void)ctx;
    probe *p = self;
    p->n_rollback++;
    probe_trace(p, "rollback");
}
static ms_status probe_plan(void *self, int index, const ms_step *step, ms_step_ctx *ctx,
                            const void **out, ms_error *err) {
    (void)index;
    (void)step;
    (void)err;
    probe *p = self;
    p->n_plan++;
    probe_trace(p, "plan");
    p->seen = p->cfg.read_index >= 0 ? ctx->plan_results[p->cfg.read_index] : NULL;
    *out = &p->plan_value;
    return MS_OK;
}
static ms_status probe_commit(void *self, int index, const ms_step *step, ms_step_ctx *ctx,
                              ms_error *err) {
    (void)index;
    (void)step;
    (void)ctx;
    (void)err;
    probe *p = self;
    p->n_commit++;
    probe_trace(p, "commit");
    return MS_OK;
}
static void probe_free(void *self) { ms_free(self); }
static ms_status probe_publish(void *self, ms_rid rid, void **out, ms_error *err) {
    (void)err;
    probe *p = self;
    *out = NULL;
    if (!p->cfg.publish)
        return MS_OK;
    ms_rid *c = ms_malloc(sizeof *c);
    *c = rid;
    *out = c;
    return MS_OK;
}
static void probe_published_free(void *self, void *pub) {
    (void)self;
    ms_free(pub);
}
static ms_admit_outcome probe_retrieve(void *self, ms_rid rid, const void *pub) {
    probe *p = self;
    assert_int_equal(*(const ms_rid *)pub, rid);
    probe_trace(p, "retrieve");
    ms_admit_outcome o = ms_admit_ok();
    o.code = p->retrieve_code;
    return o;
}

static ms_resource_i probe_ifaces[MS_RESOURCE_KIND_COUNT];

static ms_status probe_build(const void *config, const ms_resource_env *env, void **self,
                             const ms_resource_i **iface, ms_error *err) {
    (void)env;
    (void)err;
    const probe_config *c = config;
    probe *p = ms_calloc(1, sizeof *p);
    if (p == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "probe oom");
    p->cfg = *c;
    ms_resource_i *i = &probe_ifaces[c->kind];
    *i = (ms_resource_i){c->kind,      probe_ingest, probe_remove,  probe_reset,
                         probe_admit,  probe_rollback, probe_plan, probe_commit,
                         probe_free,   probe_publish, probe_published_free, probe_retrieve};
    *self = p;
    *iface = i;
    return MS_OK;
}

static char trace[4096];

static probe_config pcfg(const char *name, ms_resource_kind kind) {
    return (probe_config){name, kind, trace, sizeof trace, MS_ADMIT_OK, -1, false, false};
}

#define SPEC(key, kind, deps, nd, cfg) {key, kind, deps, nd, probe_build, cfg, NULL, NULL}

/* ---- §9 item 21: order ---- */

static void test_order_deps_first_ties_by_name_transitive(void **state) {
    (void)state;
    /* c -> b -> a (transitive); d and e independent: order a b c d e by name among ready */
    static const char *const dep_a[] = {"a"};
    static const char *const dep_b[] = {"b"};
    probe_config cc[5] = {pcfg("e", MS_RESOURCE_SAMPLER), pcfg("c", MS_RESOURCE_ATTN),
                          pcfg("b", MS_RESOURCE_POS), pcfg("a", MS_RESOURCE_KV),
                          pcfg("d", MS_RESOURCE_SCRATCH)};
    ms_resource_spec specs[] = {
        SPEC("e", MS_RESOURCE_SAMPLER, NULL, 0, &cc[0]),
        SPEC("c", MS_RESOURCE_ATTN, dep_b, 1, &cc[1]),
        SPEC("b", MS_RESOURCE_POS, dep_a, 1, &cc[2]), SPEC("a", MS_RESOURCE_KV, NULL, 0, &cc[3]),
        SPEC("d", MS_RESOURCE_SCRATCH, NULL, 0, &cc[4]),
    };
    ms_step_runner *r;
    ms_error err = {0};
    assert_int_equal(ms_step_runner_init(&r, specs, 5, &err), MS_OK);
    const int *order = ms_step_runner_order(r);
    const char *want[] = {"a", "b", "c", "d", "e"};
    for (int k = 0; k < 5; k++)
        assert_string_equal(ms_step_runner_key(r, order[k]), want[k]);
    assert_int_equal(ms_step_runner_index(r, "c"), 1);
    assert_int_equal(ms_step_runner_index(r, "zz"), -1);
    assert_int_equal(ms_step_runner_kind(r, 3), MS_RESOURCE_KV);
    assert_int_equal(ms_step_runner_count(r), 5);
    ms_step_runner_free(r);

    /* a dependency on a later-named resource still goes first */
    static const char *const dep_z[] = {"z"};
    probe_config c2[2] = {pcfg("a", MS_RESOURCE_POS), pcfg("z", MS_RESOURCE_KV)};
    ms_resource_spec s2[] = {SPEC("a", MS_RESOURCE_POS, dep_z, 1, &c2[0]),
                             SPEC("z", MS_RESOURCE_KV, NULL, 0, &c2[1])};
    assert_int_equal(ms_step_runner_init(&r, s2, 2, &err), MS_OK);
    assert_string_equal(ms_step_runner_key(r, ms_step_runner_order(r)[0]), "z");
    ms_step_runner_free(r);
}

static void test_order_rejects_unknown_self_cycle_duplicate_and_kind(void **state) {
    (void)state;
    ms_step_runner *r = NULL;
    ms_error err = {0};
    probe_config c[3] = {pcfg("a", MS_RESOURCE_KV), pcfg("b", MS_RESOURCE_POS),
                         pcfg("c", MS_RESOURCE_ATTN)};
    static const char *const dep_nope[] = {"nope"};
    ms_resource_spec unknown[] = {SPEC("a", MS_RESOURCE_KV, dep_nope, 1, &c[0])};
    assert_int_equal(ms_step_runner_init(&r, unknown, 1, &err), MS_ERR_INVALID_ARG);
    assert_string_equal(err.msg, "resource 'a' depends on unknown resource 'nope'");
    static const char *const dep_a[] = {"a"};
    ms_resource_spec self[] = {SPEC("a", MS_RESOURCE_KV, dep_a, 1, &c[0])};
    assert_int_equal(ms_step_runner_init(&r, self, 1, &err), MS_ERR_INVALID_ARG);
    assert_string_equal(err.msg, "resource 'a' depends on itself");
    static const char *const dep_b[] = {"b"};
    static const char *const dep_c[] = {"c"};
    ms_resource_spec cyc[] = {SPEC("a", MS_RESOURCE_KV, dep_b, 1, &c[0]),
                              SPEC("b", MS_RESOURCE_POS, dep_c, 1, &c[1]),
                              SPEC("c", MS_RESOURCE_ATTN, dep_a, 1, &c[2])};
    assert_int_equal(ms_step_runner_init(&r, cyc, 3, &err), MS_ERR_INVALID_ARG);
    assert_string_equal(err.msg, "dependency cycle among resources 'a', 'b', 'c'");
    ms_resource_spec dup[] = {SPEC("a", MS_RESOURCE_KV, NULL, 0, &c[0]),
                              SPEC("a", MS_RESOURCE_POS, NULL, 0, &c[1])};
    assert_int_equal(ms_step_runner_init(&r, dup, 2, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "duplicate resource key 'a'"));
    ms_resource_spec kind[] = {SPEC("a", MS_RESOURCE_POS, NULL, 0, &c[0])};
    assert_int_equal(ms_step_runner_init(&r, kind, 1, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "declared positions but built kv_pool"));
    ms_resource_spec none[] = {{"a", MS_RESOURCE_KV, NULL, 0, NULL, NULL, NULL, NULL}};
    assert_int_equal(ms_step_runner_init(&r, none, 1, &err), MS_ERR_INVALID_ARG);
    assert_int_equal(ms_step_runner_init(&r, none, 0, &err), MS_ERR_INVALID_ARG);
    assert_null(r);
    /* a builder failure after others were built frees them and names the key */
    ms_alloc_fail_nth(3); /* runner, probe a, then probe b fails */
    ms_resource_spec ok2[] = {SPEC("a", MS_RESOURCE_KV, NULL, 0, &c[0]),
                              SPEC("b", MS_RESOURCE_POS, NULL, 0, &c[1])};
    assert_int_equal(ms_step_runner_init(&r, ok2, 2, &err), MS_ERR_OOM);
    assert_non_null(strstr(err.msg, "building resource 'b'"));
    assert_null(r);
}

/* ---- plan / commit sweeps ---- */

typedef struct three {
    ms_step_runner *r;
    probe *kv, *pos, *attn;
    int ikv, ipos, iattn;
} three;

static void three_init(three *t, probe_config *c) {
    static const char *const dep_kv[] = {"kv"};
    static const char *const dep_kv_pos[] = {"kv", "pos"};
    ms_resource_spec specs[] = {
        SPEC("attn", MS_RESOURCE_ATTN, dep_kv_pos, 2, &c[2]),
        SPEC("pos", MS_RESOURCE_POS, dep_kv, 1, &c[1]),
        SPEC("kv", MS_RESOURCE_KV, NULL, 0, &c[0]),
    };
    ms_error err = {0};
    assert_int_equal(ms_step_runner_init(&t->r, specs, 3, &err), MS_OK);
    t->iattn = 0;
    t->ipos = 1;
    t->ikv = 2;
    t->kv = ms_step_runner_resource(t->r, t->ikv);
    t->pos = ms_step_runner_resource(t->r, t->ipos);
    t->attn = ms_step_runner_resource(t->r, t->iattn);
}

static void three_configs(probe_config *c) {
    c[0] = pcfg("kv", MS_RESOURCE_KV);
    c[1] = pcfg("pos", MS_RESOURCE_POS);
    c[2] = pcfg("attn", MS_RESOURCE_ATTN);
    c[1].read_index = 2; /* pos reads kv */
    c[2].read_index = 2;
}

static const int dummy_rec = 1;

static void test_plan_passes_results_by_key_and_clears_stale(void **state) {
    (void)state;
    trace[0] = '\0';
    probe_config c[3];
    three_configs(c);
    three t;
    three_init(&t, c);
    ms_segment seg = {1, 0, 1};
    ms_step step = {.name = "decode", .segments = &seg, .n_segments = 1};
    step.records[t.ikv].rec = &dummy_rec;
    step.records[t.ipos].rec = &dummy_rec;
    step.records[t.iattn].rec = &dummy_rec;
    ms_step_ctx ctx = {0};
    for (int i = 0; i < MS_MAX_RESOURCES; i++)
        ctx.plan_results[i] = &dummy_rec; /* stale junk */
    ms_error err = {0};
    assert_int_equal(ms_step_runner_plan(t.r, &step, &ctx, &err), MS_OK);
    assert_ptr_equal(t.pos->seen, &t.kv->plan_value);
    assert_ptr_equal(t.attn->seen, &t.kv->plan_value);
    assert_ptr_equal(ctx.plan_results[t.ipos], &t.pos->plan_value);
    assert_null(ctx.plan_results[5]); /* cleared */
    assert_string_equal(trace, "kv.plan pos.plan attn.plan ");
    /* a step that does not declare kv: pos sees NULL (stale result not visible), kv not called */
    trace[0] = '\0';
    step.records[t.ikv].rec = NULL;
    assert_int_equal(ms_step_runner_plan(t.r, &step, &ctx, &err), MS_OK);
    assert_null(t.pos->seen);
    assert_null(ctx.plan_results[t.ikv]);
    assert_string_equal(trace, "pos.plan attn.plan ");
    trace[0] = '\0';
    assert_int_equal(ms_step_runner_commit(t.r, &step, &ctx, &err), MS_OK);
    assert_string_equal(trace, "pos.commit attn.commit ");
    assert_int_equal(t.kv->n_commit, 0);
    ms_step_runner_free(t.r);
}

static void test_step_naming_resource_node_lacks_is_error(void **state) {
    (void)state;
    trace[0] = '\0';
    probe_config c[3];
    three_configs(c);
    three t;
    three_init(&t, c);
    ms_segment seg = {1, 0, 1};
    ms_step step = {.name = "decode", .segments = &seg, .n_segments = 1};
    step.records[t.ikv].rec = &dummy_rec;
    step.records[7].rec = &dummy_rec;
    ms_step_ctx ctx = {0};
    ms_admit_outcome o = ms_step_runner_admit(t.r, &step, &ctx);
    assert_int_equal(o.code, MS_ADMIT_INVALID);
    assert_int_equal(o.resource, 7);
    assert_int_equal(t.kv->n_admit, 0);
    ms_error err = {0};
    assert_int_equal(ms_step_runner_plan(t.r, &step, &ctx, &err), MS_ERR_INVALID_ARG);
    assert_string_equal(err.msg, "step decode: declares resource index 7 but the node has 3 "
                                 "resources");
    assert_int_equal(ms_step_runner_commit(t.r, &step, &ctx, &err), MS_ERR_INVALID_ARG);
    /* malformed segments are refused before any resource admits */
    step.records[7].rec = NULL;
    ms_segment neg = {1, 0, -2};
    step.segments = &neg;
    o = ms_step_runner_admit(t.r, &step, &ctx);
    assert_int_equal(o.code, MS_ADMIT_INVALID);
    assert_int_equal(o.resource, -1);
    ms_segment badlabel = {1, MS_MAX_LABELS, 1};
    step.segments = &seg;
    step.records[t.ikv].segments = &badlabel;
    step.records[t.ikv].n_segments = 1;
    o = ms_step_runner_admit(t.r, &step, &ctx);
    assert_int_equal(o.resource, t.ikv);
    assert_int_equal(t.kv->n_admit, 0);
    ms_step_runner_free(t.r);
}

/* ---- admit (H2 across resources) ---- */

static void test_H2_admit_failure_rolls_back_earlier_resources(void **state) {
    (void)state;
    trace[0] = '\0';
    probe_config c[3];
    three_configs(c);
    c[2].admit_code = MS_ADMIT_PAGES_SHORT; /* attn (last in order) fails */
    three t;
    three_init(&t, c);
    ms_segment seg = {1, 0, 1};
    ms_step step = {.name = "decode", .segments = &seg, .n_segments = 1};
    step.records[t.ikv].rec = &dummy_rec;
    step.records[t.ipos].rec = &dummy_rec;
    step.records[t.iattn].rec = &dummy_rec;
    ms_step_ctx ctx = {0};
    ms_admit_outcome o = ms_step_runner_admit(t.r, &step, &ctx);
    assert_int_equal(o.code, MS_ADMIT_PAGES_SHORT);
    assert_int_equal(o.pages_short, 3); /* typed reason preserved */
    assert_int_equal(o.rid, 42);
    assert_int_equal(o.label, 2);
    assert_int_equal(o.resource, t.iattn);
    assert_string_equal(trace, "kv.admit pos.admit attn.admit pos.rollback kv.rollback ");
    ms_step_runner_free(t.r);

    /* the first failing resource short-circuits: later ones are never admitted */
    trace[0] = '\0';
    three_configs(c);
    c[1].admit_code = MS_ADMIT_OFFLOADED;
    three_init(&t, c);
    step.records[t.ikv].rec = &dummy_rec;
    step.records[t.ipos].rec = &dummy_rec;
    step.records[t.iattn].rec = &dummy_rec;
    o = ms_step_runner_admit(t.r, &step, &ctx);
    assert_int_equal(o.code, MS_ADMIT_OFFLOADED);
    assert_int_equal(o.resource, t.ipos);
    assert_string_equal(trace, "kv.admit pos.admit kv.rollback ");
    assert_int_equal(t.attn->n_admit, 0);
    ms_step_runner_free(t.r);
}

static void test_admit_pending_when_any_resource_waits(void **state) {
    (void)state;
    trace[0] = '\0';
    probe_config c[3];
    three_configs(c);
    c[0].admit_code = MS_ADMIT_PENDING;
    three t;
    three_init(&t, c);
    ms_segment seg = {1, 0, 1};
    ms_step step = {.name = "decode", .segments = &seg, .n_segments = 1};
    step.records[t.ikv].rec = &dummy_rec;
    step.records[t.iattn].rec = &dummy_rec;
    ms_step_ctx ctx = {0};
    ms_admit_outcome o = ms_step_runner_admit(t.r, &step, &ctx);
    assert_int_equal(o.code, MS_ADMIT_PENDING);
    assert_int_equal(o.resource, -1);
    assert_int_equal(t.attn->n_admit, 1); /* pending is not a failure: later ones still admit */
    assert_int_equal(t.pos->n_admit, 0);  /* undeclared: skipped */
    ms_step_runner_free(t.r);
}

static void test_H2_rollback_restores_real_kv_reservation(void **state) {
    (void)state;
    /* mock KV + positions + a failing attention probe: KV pages are returned on rollback and a
     * retry reserves exactly the same amount */
    static const char *const dep_kv[] = {"kv"};
    mock_kv_config kc = {8, 16};
    ms_positions_config pc = {MS_POS_SEQUENTIAL, 1, 1, 64, "kv"};
    probe_config ac = pcfg("attn", MS_RESOURCE_ATTN);
    ac.admit_code = MS_ADMIT_INVALID;
    trace[0] = '\0';
    ms_resource_spec specs[] = {
        {"kv", MS_RESOURCE_KV, NULL, 0, mock_kv_build, &kc, NULL, NULL},
        {"pos", MS_RESOURCE_POS, dep_kv, 1, ms_positions_build, &pc, NULL, NULL},
        SPEC("attn", MS_RESOURCE_ATTN, dep_kv, 1, &ac),
    };
    ms_step_runner *r;
    ms_error err = {0};
    assert_int_equal(ms_step_runner_init(&r, specs, 3, &err), MS_OK);
    mock_kv *kv = ms_step_runner_resource(r, 0);
    probe *attn = ms_step_runner_resource(r, 2);
    for (ms_rid rid = 1; rid <= 3; rid++)
        assert_int_equal(ms_step_runner_ingest(r, rid, NULL, &err), MS_OK);
    int32_t free0 = kv->n_free;
    ms_segment segs[] = {{1, 0, 20}, {2, 0, 9}, {3, 0, 1}};
    ms_kv_step ks = {.commit = true};
    ms_pos_step ps = {.n_axes = 1};
    ms_step step = {.name = "prefill", .segments = segs, .n_segments = 3};
    step.records[0].rec = &ks;
    step.records[1].rec = &ps;
    step.records[2].rec = &dummy_rec;
    ms_step_ctx ctx = {0};
    ms_admit_outcome o = ms_step_runner_admit(r, &step, &ctx);
    assert_int_equal(o.code, MS_ADMIT_INVALID);
    assert_int_equal(o.resource, 2);
    assert_int_equal(kv->n_rollback, 1);
    assert_int_equal(kv->n_free, free0); /* nothing stays reserved */
    attn->cfg.admit_code = MS_ADMIT_OK;
    o = ms_step_runner_admit(r, &step, &ctx);
    assert_int_equal(o.code, MS_ADMIT_OK);
    assert_int_equal(kv->n_free, free0 - 3 - 2 - 1);
    o = ms_step_runner_admit(r, &step, &ctx); /* idempotent retry */
    assert_int_equal(kv->n_free, free0 - 6);
    for (ms_rid rid = 1; rid <= 3; rid++)
        ms_step_runner_remove(r, rid);
    assert_int_equal(kv->n_free, free0);
    ms_step_runner_free(r);
}

static void test_plan_failure_abandons_the_step(void **state) {
    (void)state;
    /* mock KV + positions with a tiny id buffer: positions' plan fails after KV planned; the
     * runner rolls every declared resource back, so the KV reservation is returned */
    static const char *const dep_kv[] = {"kv"};
    mock_kv_config kc = {8, 16};
    ms_positions_config pc = {MS_POS_SEQUENTIAL, 1, 1, 4, "kv"};
    ms_resource_spec specs[] = {
        {"kv", MS_RESOURCE_KV, NULL, 0, mock_kv_build, &kc, NULL, NULL},
        {"pos", MS_RESOURCE_POS, dep_kv, 1, ms_positions_build, &pc, NULL, NULL},
    };
    ms_step_runner *r;
    ms_error err = {0};
    assert_int_equal(ms_step_runner_init(&r, specs, 2, &err), MS_OK);
    mock_kv *kv = ms_step_runner_resource(r, 0);
    assert_int_equal(ms_step_runner_ingest(r, 1, NULL, &err), MS_OK);
    int32_t free0 = kv->n_free;
    ms_segment seg = {1, 0, 12};
    ms_kv_step ks = {.commit = true};
    ms_pos_step ps = {.n_axes = 1};
    ms_step step = {.name = "prefill", .segments = &seg, .n_segments = 1};
    step.records[0].rec = &ks;
    step.records[1].rec = &ps;
    ms_step_ctx ctx = {0};
    assert_int_equal(ms_step_runner_admit(r, &step, &ctx).code, MS_ADMIT_OK);
    assert_int_equal(kv->n_free, free0 - 2);
    assert_int_equal(ms_step_runner_plan(r, &step, &ctx, &err), MS_ERR_CAPACITY);
    assert_non_null(strstr(err.msg, "step prefill: pos: positions: step has 12 tokens"));
    assert_int_equal(kv->n_rollback, 1);
    assert_int_equal(kv->n_free, free0);
    for (int i = 0; i < MS_MAX_RESOURCES; i++)
        assert_null(ctx.plan_results[i]);
    ms_step_runner_remove(r, 1);
    ms_step_runner_free(r);
}

/* ---- request sweeps ---- */

static void test_ingest_routes_overrides_and_sweeps_all_resources(void **state) {
    (void)state;
    trace[0] = '\0';
    probe_config c[3];
    three_configs(c);
    three t;
    three_init(&t, c);
    int ov_pos = 5;
    const void *ov[3] = {NULL, &ov_pos, NULL};
    ms_error err = {0};
    assert_int_equal(ms_step_runner_ingest(t.r, 9, ov, &err), MS_OK);
    assert_ptr_equal(t.pos->overrides, &ov_pos);
    assert_null(t.kv->overrides);
    assert_string_equal(trace, "kv.ingest pos.ingest attn.ingest ");
    trace[0] = '\0';
    ms_step_runner_reset(t.r, 9, false);
    ms_step_runner_remove(t.r, 9);
    assert_string_equal(trace, "attn.reset pos.reset kv.reset attn.remove pos.remove kv.remove ");
    ms_step_runner_free(t.r);
    /* a failing ingest names the resource */
    three_configs(c);
    c[1].fail_ingest = true;
    three_init(&t, c);
    assert_int_equal(ms_step_runner_ingest(t.r, 9, NULL, &err), MS_ERR_OOM);
    assert_string_equal(err.msg, "ingest request 9: pos: probe pos out of memory");
    ms_step_runner_free(t.r);
}

static void test_publish_collects_per_key_omits_null_and_retrieves(void **state) {
    (void)state;
    trace[0] = '\0';
    probe_config c[3];
    three_configs(c);
    c[0].publish = true;
    c[2].publish = true;
    three t;
    three_init(&t, c);
    ms_published pub;
    ms_error err = {0};
    assert_int_equal(ms_step_runner_publish(t.r, 77, &pub, &err), MS_OK);
    assert_int_equal(pub.n, 2);
    assert_string_equal(pub.items[0].key, "kv");
    assert_string_equal(pub.items[1].key, "attn");
    assert_int_equal(*(ms_rid *)pub.items[1].data, 77);
    /* retrieve into a second node: matched by key and kind, pending propagates */
    three u;
    three_init(&u, c);
    u.attn->retrieve_code = MS_ADMIT_PENDING;
    trace[0] = '\0';
    ms_admit_outcome o = ms_step_runner_admit_retrieve(u.r, 77, &pub);
    assert_int_equal(o.code, MS_ADMIT_PENDING);
    assert_string_equal(trace, "kv.retrieve attn.retrieve ");
    u.kv->retrieve_code = MS_ADMIT_TRANSFER_FAILED;
    o = ms_step_runner_admit_retrieve(u.r, 77, &pub);
    assert_int_equal(o.code, MS_ADMIT_TRANSFER_FAILED);
    assert_int_equal(o.resource, u.ikv);
    ms_published_free(&pub);
    assert_int_equal(pub.n, 0);
    ms_published_free(NULL);
    ms_step_runner_free(u.r);
    ms_step_runner_free(t.r);
}

/* ---- §9 item 20 with the KV mock and positions ---- */

static void test_forks_before_plans_and_post_forks_see_committed_length(void **state) {
    (void)state;
    static const char *const dep_kv[] = {"kv"};
    mock_kv_config kc = {4, 64};
    ms_positions_config pc = {MS_POS_SEQUENTIAL, 1, 1, 64, "kv"};
    ms_resource_spec specs[] = {
        {"kv", MS_RESOURCE_KV, NULL, 0, mock_kv_build, &kc, NULL, NULL},
        {"pos", MS_RESOURCE_POS, dep_kv, 1, ms_positions_build, &pc, NULL, NULL},
    };
    ms_step_runner *r;
    ms_error err = {0};
    assert_int_equal(ms_step_runner_init(&r, specs, 2, &err), MS_OK);
    mock_kv *kv = ms_step_runner_resource(r, 0);
    ms_positions *pos = ms_step_runner_resource(r, 1);
    assert_int_equal(ms_step_runner_ingest(r, 1, NULL, &err), MS_OK);
    ms_pos_step ps = {.n_axes = 1};
    ms_rid rows[] = {1};
    /* prefill main 6 tokens, post-fork main -> 1: target sees 6 after commit */
    ms_fork post = {0, 1};
    ms_kv_step k1 = {.commit = true, .post_forks = &post, .n_post_forks = 1};
    ms_segment s1[] = {{1, 0, 6}};
    ms_step st1 = {.name = "prefill", .segments = s1, .n_segments = 1};
    st1.records[0].rec = &k1;
    st1.records[1].rec = &ps;
    ms_step_ctx ctx = {.request_ids = rows, .n_rows = 1, .n_real = 1};
    assert_int_equal(ms_step_runner_admit(r, &st1, &ctx).code, MS_ADMIT_OK);
    assert_int_equal(ms_step_runner_plan(r, &st1, &ctx, &err), MS_OK);
    assert_int_equal(ms_step_runner_commit(r, &st1, &ctx, &err), MS_OK);
    assert_int_equal(mock_stored(kv, 1, 1), 6);
    int32_t p;
    assert_int_equal(ms_positions_position(pos, 1, 1, &p, NULL), MS_OK);
    assert_int_equal(p, 6);
    /* combined plan with one label still batches under the combined plan label */
    ms_combined_label cl = {{1}, 1, 9};
    ms_kv_step k2 = {.commit = true, .combined = &cl, .n_combined = 1};
    ms_segment s2[] = {{1, 1, 1}, {1, 0, 0}};
    ms_step st2 = {.name = "decode_cfg", .segments = s2, .n_segments = 2};
    st2.records[0].rec = &k2;
    st2.records[1].rec = &ps;
    assert_int_equal(ms_step_runner_admit(r, &st2, &ctx).code, MS_ADMIT_OK);
    assert_int_equal(ms_step_runner_plan(r, &st2, &ctx, &err), MS_OK);
    const ms_kv_plan_set *set = ctx.plan_results[0];
    assert_int_equal(set->n_plans, 2);
    assert_int_equal(set->plans[0].plan_label, 9); /* declaration order: label 1 first */
    assert_int_equal(set->plans[1].plan_label, 0);
    assert_true(set->plans[0].is_decode);
    const ms_pos_plan *pp = ctx.plan_results[1];
    assert_int_equal(pp->n_tokens, 1);
    assert_int_equal(pp->ids[0], 6);
    assert_int_equal(ms_step_runner_commit(r, &st2, &ctx, &err), MS_OK);
    /* zero-span segment is a no-op at commit */
    assert_int_equal(mock_stored(kv, 1, 0), 6);
    assert_int_equal(ms_positions_position(pos, 1, 0, &p, NULL), MS_OK);
    assert_int_equal(p, 6);
    assert_int_equal(ms_positions_position(pos, 1, 1, &p, NULL), MS_OK);
    assert_int_equal(p, 7);
    ms_step_runner_remove(r, 1);
    ms_step_runner_free(r);
}

static void test_borrowed_instances_are_not_freed(void **state) {
    (void)state;
    /* two nodes share one KV resource object (H9 a): both runners borrow it */
    mock_kv *shared = mock_kv_new(8, 32);
    static const char *const dep_kv[] = {"kv"};
    ms_positions_config pc = {MS_POS_SEQUENTIAL, 1, 1, 64, "kv"};
    ms_resource_spec specs[] = {
        {"kv", MS_RESOURCE_KV, NULL, 0, NULL, NULL, shared, &mock_kv_iface},
        {"pos", MS_RESOURCE_POS, dep_kv, 1, ms_positions_build, &pc, NULL, NULL},
    };
    ms_step_runner *a, *b;
    ms_error err = {0};
    assert_int_equal(ms_step_runner_init(&a, specs, 2, &err), MS_OK);
    assert_int_equal(ms_step_runner_init(&b, specs, 2, &err), MS_OK);
    assert_ptr_equal(ms_step_runner_resource(a, 0), ms_step_runner_resource(b, 0));
    assert_int_equal(ms_step_runner_ingest(a, 1, NULL, &err), MS_OK);
    ms_step_runner_free(a);
    ms_step_runner_free(b);
    assert_non_null(ms_rid_map_get(&shared->reqs, 1)); /* still alive */
    mock_remove(shared, 1);
    mock_kv_free(shared);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_order_deps_first_ties_by_name_transitive),
        ms_unit_test(test_order_rejects_unknown_self_cycle_duplicate_and_kind),
        ms_unit_test(test_plan_passes_results_by_key_and_clears_stale),
        ms_unit_test(test_step_naming_resource_node_lacks_is_error),
        ms_unit_test(test_H2_admit_failure_rolls_back_earlier_resources),
        ms_unit_test(test_admit_pending_when_any_resource_waits),
        ms_unit_test(test_H2_rollback_restores_real_kv_reservation),
        ms_unit_test(test_plan_failure_abandons_the_step),
        ms_unit_test(test_ingest_routes_overrides_and_sweeps_all_resources),
        ms_unit_test(test_publish_collects_per_key_omits_null_and_retrieves),
        ms_unit_test(test_forks_before_plans_and_post_forks_see_committed_length),
        ms_unit_test(test_borrowed_instances_are_not_freed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
