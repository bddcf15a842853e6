/*
 * engine_fork.c - [fork] of the engine (engine.h ms_engine_fork, ms_engine_get_fork_stats): n > 1
 * choices over one prompt. Moved out of engine.c; the private structs are engine_impl.h's, and
 * engine.c calls eng_fork_poll at a step's start and eng_fork_resolve after a step a parent ran in.
 *
 * A fork is an ordinary request (its own prompt copy, sampler state, output) whose main stream
 * starts from its parent's KV instead of computing the prompt: once the parent's stream holds
 * the prompt's first n - 1 tokens, kv_pool.h ms_kv_pool_fork_stream shares their full pages and
 * copies the partial one, the positions counter starts at n - 1, and the fork's walk feeds only
 * the prompt's last token, whose logits row gives its first id under its own seed (as a prompt
 * the prefix cache holds whole still computes its last token). From then on nothing tells a fork
 * from a request that prefilled itself: offload, recompute-preemption (prompt ++ output) and
 * remove act on its own pages only. A fork whose parent's KV is gone (finished, removed,
 * offloaded past its prompt, a window released part of it) prefills its prompt itself.
 */
#include "engine_impl.h"

#include <string.h>

/* The fork prefills its prompt itself (through the prefix cache when it is on). */
static void eng_fork_detach(ms_engine *e, eng_req *c) {
    c->fork_of = 0;
    e->fork_stats.n_waiting--;
    e->fork_stats.fallbacks++;
    eng_prefix_adopt(e, c);
}

/* Fork c from parent p when p's KV holds c's prompt but its last token; keep waiting while p
 * still prefills; detach when p cannot give it. */
static void eng_fork_one(ms_engine *e, const eng_req *p, eng_req *c) {
    eng_node *nd = &e->nodes[0];
    const int32_t t = c->n_prompt[MS_LABEL_MAIN] - 1;
    ms_kv_stream_info si;
    if (t < 1 || p->finish != MS_FINISH_NONE || !p->in_runner || p->kv_offloaded ||
        ms_kv_pool_stream_info(nd->pool, p->rid, MS_LABEL_MAIN, &si) != MS_OK ||
        si.released > 0) {
        eng_fork_detach(e, c);
        return;
    }
    if (si.stored < t)
        return; /* the parent has not computed the prompt yet */
    /* the pool has no compute stream here (its copies are synchronous): the partial page's
       bytes are complete, since the step that wrote them copied its logits to the host after */
    ms_kv_fork_info fi;
    ms_error err = {0};
    ms_status st = ms_kv_pool_fork_stream(nd->pool, p->rid, c->rid, MS_LABEL_MAIN, t, &fi, &err);
    if (st == MS_ERR_CAPACITY && e->pcache != NULL && ms_prefix_cache_evict(e->pcache, 1) >= 1)
        st = ms_kv_pool_fork_stream(nd->pool, p->rid, c->rid, MS_LABEL_MAIN, t, &fi, &err);
    int pi = nd->idx[MS_RESOURCE_POS];
    if (st == MS_OK && pi >= 0) {
        ms_pos_published pub;
        memset(&pub, 0, sizeof pub);
        pub.counter[MS_LABEL_MAIN] = t;
        st = ms_positions_retrieve(ms_step_runner_resource(nd->runner, pi), c->rid, &pub, &err);
        if (st != MS_OK)
            ms_kv_pool_reset(nd->pool, c->rid, true);
    }
    if (st != MS_OK) {
        ms_log(MS_LOG_DEBUG, "fork of request %llu from %llu: %s; it prefills its prompt",
               (unsigned long long)c->rid, (unsigned long long)p->rid, err.msg);
        eng_fork_detach(e, c);
        return;
    }
    c->consumed[MS_LABEL_MAIN] = t;
    c->fork_of = 0;
    e->fork_stats.n_waiting--;
    e->fork_stats.forks++;
    e->fork_stats.pages_shared += fi.pages_shared;
    e->fork_stats.pages_copied += fi.pages_copied;
    e->fork_stats.tokens_shared += t;
}

/* Fork every request waiting for `parent` whose KV is ready (after a step it ran in). */
void eng_fork_resolve(ms_engine *e, const eng_req *parent) {
    if (e->fork_stats.n_waiting == 0 || parent == NULL)
        return;
    for (size_t i = 0; i < e->n_reqs; i++)
        if (e->reqs[i]->fork_of == parent->rid)
            eng_fork_one(e, parent, e->reqs[i]);
}

/* At a step's start: forks whose parent finished, was removed or sits in the host tier
 * prefill themselves; those whose parent's KV is ready fork. */
void eng_fork_poll(ms_engine *e) {
    if (e->fork_stats.n_waiting == 0)
        return;
    for (size_t i = 0; i < e->n_reqs; i++) {
        eng_req *c = e->reqs[i];
        if (c->fork_of == 0)
            continue;
        const eng_req *p = eng_find_req(e, c->fork_of, NULL);
        if (p == NULL)
            eng_fork_detach(e, c);
        else
            eng_fork_one(e, p, c);
    }
}

ms_status ms_engine_fork(ms_engine *e, ms_rid parent, const ms_engine_request *rq, ms_rid *rid,
                         ms_error *err) {
    ms_graph_exec_preplan_drop(e->gx); /* [graphs] it touches the runner */
    const eng_req *p = eng_find_req(e, parent, NULL);
    if (p == NULL)
        return MS_FAIL(err, MS_ERR_NOT_FOUND, "fork: unknown parent request %llu",
                       (unsigned long long)parent);
    if (e->tpg != NULL) /* [tp] every rank must run the same allocation: forks are not replayed */
        return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                       "fork: not with tensor parallelism (--tp %d): add the choices as requests",
                       (int)ms_tp_group_world(e->tpg));
    const eng_node *nd = &e->nodes[0];
    if (e->n_nodes != 1 || nd->pool == NULL || nd->context_label >= 0)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                       "fork: model %s runs %d nodes%s: only a one-node model with a KV pool "
                       "forks a request (add the choices as requests)", e->desc->name,
                       (int)e->n_nodes, nd->context_label >= 0 ? " with cross-attention" : "");
    if (rq->negative_prompt != NULL || rq->n_negative_prompt > 0 || rq->position_ids != NULL ||
        rq->features != NULL || p->n_streams != 1 || p->positions != NULL || p->features != NULL)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                       "fork of request %llu: guided pairs, explicit positions and features are "
                       "not forked (add the choices as requests)", (unsigned long long)parent);
    if (rq->prompt_logprobs)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "fork of request %llu: a fork computes no prompt "
                       "rows (read the parent's prompt logprobs)", (unsigned long long)parent);
    if (rq->n_prompt != p->n_orig_prompt || rq->prompt == NULL ||
        memcmp(rq->prompt, p->prompt[MS_LABEL_MAIN], (size_t)rq->n_prompt * sizeof(int32_t)) != 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "fork of request %llu: the prompt (%d tokens) is not the parent's (%d "
                       "tokens)", (unsigned long long)parent, (int)rq->n_prompt,
                       (int)p->n_orig_prompt);
    /* a finished parent's KV is gone: the fork is a request that prefills itself */
    const bool wait = p->finish == MS_FINISH_NONE && p->in_runner;
    MS_TRY(eng_add(e, rq, wait ? parent : 0, rid, err));
    e->fork_stats.fallbacks += !wait;
    eng_req *c = eng_find_req(e, *rid, NULL);
    if (c != NULL && c->fork_of != 0)
        eng_fork_one(e, p, c); /* a parent already past its prompt forks at once */
    return MS_OK;
}

void ms_engine_get_fork_stats(const ms_engine *e, ms_engine_fork_stats *out) {
    memset(out, 0, sizeof *out);
    if (e != NULL)
        *out = e->fork_stats;
}
