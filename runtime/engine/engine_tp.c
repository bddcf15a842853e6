/*
 * engine_tp.c - [tp] of the engine (engine.h options.tp, ms_engine_tp_world, ms_engine_tp_rank):
 * tensor parallelism (tp.h, docs/tp.md). Moved out of engine.c; the private structs are
 * engine_impl.h's. engine.c's ms_engine_init calls eng_tp_init for options.tp > 1 and eng_tp_check
 * after warm-up.
 *
 * Rank 0's engine drives one engine per rank on threads (ms_tp_group_start with eng_tp_make):
 * every rank is an ordinary engine built by eng_init over the one checkpoint the group opened,
 * with options.tp_member naming its split. ms_engine_add, ms_engine_remove and ms_engine_step
 * (the public entry points, here because they dispatch) run eng_add / eng_remove / eng_step on
 * every rank and check that the ranks agree (the request id, each step's rows and tokens, every
 * node's KV allocation after a step); without a group they are the single engine's calls.
 */
#include "engine_impl.h"

#include <string.h>
#include <unistd.h>

#include "model_probe.h"
#include "tp_check.h"

/* ---- [tp] tensor parallelism (tp.h): rank 0 drives one engine per rank ---- */

typedef struct eng_tp_make_arg {
    const ms_model_desc *desc;
    ms_engine_options opt;
    ms_ckpt *ck; /* opened once: a GGUF is dequantized once, not per rank */
} eng_tp_make_arg;

static ms_status eng_tp_make(const ms_tp_member *m, void *arg, void **engine, ms_error *err) {
    eng_tp_make_arg *a = arg;
    ms_engine_options o = a->opt;
    o.tp_member = m;
    ms_engine *e = NULL;
    ms_status st = eng_init(&e, a->desc, &o, a->ck, err);
    *engine = e;
    return st;
}

static void eng_tp_free(void *engine) { ms_engine_free(engine); }

ms_status eng_tp_init(ms_engine **out, const ms_model_desc *desc,
                      const ms_engine_options *opt, ms_error *err) {
    eng_tp_make_arg a = {desc, *opt, NULL};
    const char *dev = opt->device == NULL ? "auto" : opt->device;
    if (strcmp(dev, "auto") == 0)
        dev = eng_cuda_usable() ? "cuda" : "cpu";
    a.opt.device = dev;
    a.opt.graphs = MS_GRAPHS_OFF; /* the gathers are not captured */
    if (strcmp(dev, "cpu") == 0 && a.opt.n_threads == 0) { /* the cores shared by the ranks */
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        a.opt.n_threads = n > opt->tp ? (int32_t)(n / opt->tp) : 1;
    }
    /* the path and config checked as a single engine would (the same one-line errors), then
       the checkpoint opened once for every rank */
    ms_model_probe p;
    ms_status st = ms_model_probe_init(&p, desc, opt->model_path, err);
    ms_model_probe_free(&p);
    if (st == MS_OK)
        st = ms_ckpt_init(&a.ck, opt->model_path, err);
    void *leader = NULL;
    ms_tp_group *g = NULL;
    if (st == MS_OK)
        st = ms_tp_group_start(opt->tp, dev, eng_tp_make, eng_tp_free, &a, &leader, &g, err);
    if (st != MS_OK) {
        ms_ckpt_free(a.ck);
        return st;
    }
    ms_engine *e = leader;
    e->tpg = g;
    e->ck_borrowed = false; /* rank 0 frees it, after the group (ms_engine_free) */
    *out = e;
    return MS_OK;
}

/* Every node's KV allocation against the other ranks' (tp_check.h). */
ms_status eng_tp_check(ms_engine *e, const char *when, ms_error *err) {
    const ms_tp_member *m = ms_tp_rank_member(e->tps);
    for (int32_t i = 0; i < e->n_nodes; i++)
        if (e->nodes[i].pool != NULL)
            MS_TRY(ms_tp_check_allocation(&m->coll, e->nodes[i].pool, when, err));
    return MS_OK;
}

typedef struct eng_tp_call {
    const ms_engine_request *rq;
    ms_rid rid;                     /* add: rank 0's; remove: the one */
    ms_engine_step_info info[64];   /* step: each rank's */
} eng_tp_call;

static ms_status eng_tp_add_fn(void *engine, int32_t rank, void *arg, ms_error *err) {
    eng_tp_call *c = arg;
    ms_rid rid = 0;
    MS_TRY(eng_add(engine, c->rq, 0, &rid, err));
    if (rid != c->rid)
        return MS_FAIL(err, MS_ERR_STATE,
                       "tensor parallel: rank %d named the request %llu, rank 0 %llu", (int)rank,
                       (unsigned long long)rid, (unsigned long long)c->rid);
    return MS_OK;
}

static ms_status eng_tp_nothing(void *engine, int32_t rank, void *arg, ms_error *err) {
    (void)engine, (void)rank, (void)arg, (void)err;
    return MS_OK;
}

static ms_status eng_tp_remove_fn(void *engine, int32_t rank, void *arg, ms_error *err) {
    (void)rank, (void)err;
    eng_remove(engine, ((eng_tp_call *)arg)->rid);
    return MS_OK;
}

static ms_status eng_tp_step_fn(void *engine, int32_t rank, void *arg, ms_error *err) {
    eng_tp_call *c = arg;
    MS_TRY(eng_step(engine, &c->info[rank], err));
    return eng_tp_check(engine, "after a step", err);
}

ms_status ms_engine_add(ms_engine *e, const ms_engine_request *rq, ms_rid *rid, ms_error *err) {
    ms_status st = eng_add(e, rq, 0, rid, err);
    if (st != MS_OK || e->tpg == NULL)
        return st;
    eng_tp_call c = {.rq = rq, .rid = *rid};
    return ms_tp_group_run(e->tpg, e, eng_tp_nothing, eng_tp_add_fn, &c, err);
}

void ms_engine_remove(ms_engine *e, ms_rid rid) {
    ms_graph_exec_preplan_drop(e->gx); /* [graphs] before its rows' streams go */
    if (e->tpg == NULL) {
        eng_remove(e, rid);
        return;
    }
    eng_tp_call c = {.rid = rid};
    if (ms_tp_group_run(e->tpg, e, eng_tp_remove_fn, eng_tp_remove_fn, &c, NULL) != MS_OK)
        eng_remove(e, rid); /* a failed group still lets rank 0 drop it (no-op if done) */
}

ms_status ms_engine_step(ms_engine *e, ms_engine_step_info *info, ms_error *err) {
    if (e->tpg == NULL)
        return eng_step(e, info, err);
    eng_tp_call c;
    memset(&c, 0, sizeof c);
    MS_TRY(ms_tp_group_run(e->tpg, e, eng_tp_step_fn, eng_tp_step_fn, &c, err));
    for (int32_t r = 1; r < ms_tp_group_world(e->tpg); r++)
        if (memcmp(&c.info[r], &c.info[0], sizeof c.info[0]) != 0)
            return MS_FAIL(err, MS_ERR_STATE,
                           "tensor parallel: rank %d stepped %d requests / %d tokens, rank 0 "
                           "%d / %d", (int)r, c.info[r].n_seqs, c.info[r].n_tokens,
                           c.info[0].n_seqs, c.info[0].n_tokens);
    if (info != NULL)
        *info = c.info[0];
    return MS_OK;
}

int32_t ms_engine_tp_world(const ms_engine *e) {
    return e->tpg != NULL ? ms_tp_group_world(e->tpg) : 1;
}

const ms_engine *ms_engine_tp_rank(const ms_engine *e, int32_t r) {
    if (r == 0)
        return e;
    return e->tpg != NULL ? ms_tp_group_engine(e->tpg, r) : NULL;
}
