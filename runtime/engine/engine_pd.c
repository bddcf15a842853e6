/*
 * engine_pd.c - [pd] of the engine: prefill/decode disaggregation (pd.h, docs/pd.md). The
 * engine.h entry points ms_engine_pd_host_transfer, ms_engine_pd_publish (a prefill engine's
 * record of a request's prompt KV) and ms_engine_pd_admit (a decode engine takes one in). Moved
 * out of engine.c; the private structs and eng_add / eng_find_req are engine_impl.h's.
 */
#include "engine_impl.h"

#include <string.h>
#include <time.h>

/* What both sides support: one-node token models, no tensor parallelism. */
static ms_status eng_pd_supported(const ms_engine *e, const char *what, ms_error *err) {
    if (e->n_nodes != 1 || e->nodes[0].pool == NULL || e->tpg != NULL || e->tps != NULL)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: prefill/decode handover covers one-node "
                       "models with a KV pool and no tensor parallelism (model %s)", what,
                       e->desc->name);
    return MS_OK;
}

ms_kv_host_transfer *ms_engine_pd_host_transfer(ms_engine *e) {
    return e->n_nodes == 1 && e->nodes[0].pool != NULL ? &e->nodes[0].pd_host : NULL;
}

ms_status ms_engine_pd_publish(ms_engine *e, ms_rid rid, ms_pd_record **out, ms_error *err) {
    *out = NULL;
    ms_graph_exec_preplan_drop(e->gx); /* [graphs] it touches the runner */
    MS_TRY(eng_pd_supported(e, "pd publish", err));
    eng_req *r = eng_find_req(e, rid, NULL);
    if (r == NULL)
        return MS_FAIL(err, MS_ERR_NOT_FOUND, "pd publish: unknown request %llu",
                       (unsigned long long)rid);
    const unsigned long long id = (unsigned long long)rid;
    if (r->n_streams != 1 || r->positions != NULL || r->features != NULL || r->plp != NULL)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "pd publish: request %llu has several streams, "
                       "explicit positions, features or prompt logprobs", id);
    if (r->finish != MS_FINISH_NONE)
        return MS_FAIL(err, MS_ERR_STATE, "pd publish: request %llu already finished (%s)", id,
                       ms_finish_reason_str(r->finish));
    if (!r->in_runner || r->kv_offloaded || r->fork_of != 0 || r->n_out < 1 ||
        !ms_walk_in_loop(e->desc, r->walk))
        return MS_FAIL(err, MS_ERR_STATE, "pd publish: request %llu has not finished its "
                       "prefill (or its KV is offloaded)", id);
    eng_node *nd = &e->nodes[0];
    const int si = nd->idx[MS_RESOURCE_SAMPLER], pi = nd->idx[MS_RESOURCE_POS];
    if (si < 0)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "pd publish: model %s samples nothing",
                       e->desc->name);
    MS_TRY(ms_engine_synchronize(e, err));
    ms_pd_record *rec = ms_calloc(1, sizeof *rec);
    if (rec == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "pd publish: out of host memory");
    bool extra = false;
    ms_status st = ms_sample_res_pd_state(ms_step_runner_resource(nd->runner, si), rid,
                                          &rec->sampling, &rec->draw, &extra, err);
    if (st == MS_OK && extra)
        st = MS_FAIL(err, MS_ERR_UNSUPPORTED, "pd publish: request %llu has min_p, penalties "
                     "or a guidance scale, which a record does not carry", id);
    if (st == MS_OK && pi >= 0)
        st = ms_positions_publish(ms_step_runner_resource(nd->runner, pi), rid, &rec->pos, err);
    if (st == MS_OK)
        st = ms_kv_pool_publish(nd->pool, rid, &rec->kv, err);
    if (st == MS_OK)
        st = ms_kv_payload_export(nd->arena, rec->kv, &rec->payload, err);
    if (st == MS_OK) {
        /* the original prompt: a recompute-preempted request's prompt grew by its ids */
        rec->n_prompt = r->n_orig_prompt;
        rec->n_out = r->n_out;
        rec->prompt = ms_malloc((size_t)rec->n_prompt * sizeof(int32_t));
        rec->out = ms_malloc((size_t)rec->n_out * sizeof(int32_t));
        if (rec->prompt == NULL || rec->out == NULL)
            st = MS_FAIL(err, MS_ERR_OOM, "pd publish: out of host memory");
    }
    if (st != MS_OK) {
        ms_pd_record_free(rec);
        return st;
    }
    memcpy(rec->prompt, r->prompt[MS_LABEL_MAIN], (size_t)rec->n_prompt * sizeof(int32_t));
    memcpy(rec->out, r->out, (size_t)rec->n_out * sizeof(int32_t));
    rec->max_new_tokens = r->max_new;
    rec->ignore_eos = r->ignore_eos;
    rec->kv->source = rec->payload;
    ms_engine_remove(e, rid);
    *out = rec;
    return MS_OK;
}

/* The record's KV is one main stream holding the prompt and every id but the last (fed next). */
static ms_status eng_pd_check_record(const ms_engine *e, const ms_pd_record *rec, ms_error *err) {
    if (rec == NULL || rec->kv == NULL || rec->payload == NULL || rec->prompt == NULL ||
        rec->out == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "pd admit: incomplete record");
    if (rec->n_out < 1 || rec->n_out >= rec->max_new_tokens)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "pd admit: record with %d ids of max_new_tokens "
                       "%d leaves nothing to decode", (int)rec->n_out, (int)rec->max_new_tokens);
    const int64_t want = (int64_t)rec->n_prompt + rec->n_out - 1;
    const ms_kv_published *kv = rec->kv;
    if (kv->n_streams != 1 || kv->streams[0].label != MS_LABEL_MAIN ||
        kv->streams[0].length != want || rec->pos.counter[MS_LABEL_MAIN] != want)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "pd admit: record's KV (%d streams, main length "
                       "%d, position %d) does not hold its %d prompt tokens and %d ids",
                       (int)kv->n_streams, kv->n_streams > 0 ? (int)kv->streams[0].length : 0,
                       (int)rec->pos.counter[MS_LABEL_MAIN], (int)rec->n_prompt,
                       (int)rec->n_out - 1);
    for (int32_t i = 0; i < rec->n_out; i++)
        if (rec->out[i] < 0 || rec->out[i] >= e->facts.vocab)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "pd admit: record id %d (%d) outside the "
                           "vocabulary (%d)", (int)i, (int)rec->out[i], (int)e->facts.vocab);
    return MS_OK;
}

ms_status ms_engine_pd_admit(ms_engine *e, const ms_pd_record *rec, ms_rid *rid, ms_error *err) {
    *rid = 0;
    ms_graph_exec_preplan_drop(e->gx); /* [graphs] it touches the runner */
    MS_TRY(eng_pd_supported(e, "pd admit", err));
    MS_TRY(eng_pd_check_record(e, rec, err));
    eng_node *nd = &e->nodes[0];
    ms_walk_pos w = {0, 0};
    ms_engine_request rq = {.prompt = rec->prompt, .n_prompt = rec->n_prompt,
                            .max_new_tokens = rec->max_new_tokens, .sampling = rec->sampling,
                            .ignore_eos = rec->ignore_eos};
    ms_rid id = 0;
    MS_TRY(eng_add(e, &rq, 0, &id, err));
    eng_req *r = eng_find_req(e, id, NULL);
    MS_ASSERT(r != NULL);
    const unsigned long long uid = (unsigned long long)id;
    ms_status st = MS_OK;
    w = r->walk;
    ms_walk_advance(e->desc, &w);
    if (r->n_streams != 1 || !ms_walk_in_loop(e->desc, w))
        st = MS_FAIL(err, MS_ERR_UNSUPPORTED, "pd admit: model %s's walk does not decode after "
                     "one prefill step of one stream", e->desc->name);
    if (st == MS_OK) {
        ms_kv_published kv = *rec->kv; /* shallow: the payload is what the host transfer reads */
        kv.source = rec->payload;
        ms_admit_outcome o = ms_kv_pool_admit_retrieve(nd->pool, id, &kv);
        while (o.code == MS_ADMIT_PENDING) { /* an asynchronous transfer: wait for it */
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
            o = ms_kv_pool_admit_retrieve(nd->pool, id, &kv);
        }
        if (o.code == MS_ADMIT_TRANSFER_FAILED)
            st = MS_FAIL(err, MS_ERR_IO, "pd admit: request %llu: the KV transfer failed", uid);
        else if (o.code == MS_ADMIT_PAGES_SHORT || o.code == MS_ADMIT_NO_MEMORY)
            st = MS_FAIL(err, MS_ERR_CAPACITY, "pd admit: request %llu: %s (%d pages short)",
                         uid, ms_admit_code_str(o.code), (int)o.pages_short);
        else if (o.code != MS_ADMIT_OK)
            st = MS_FAIL(err, MS_ERR_STATE, "pd admit: request %llu: %s", uid,
                         ms_admit_code_str(o.code));
    }
    const int pi = nd->idx[MS_RESOURCE_POS], si = nd->idx[MS_RESOURCE_SAMPLER];
    if (st == MS_OK && pi >= 0)
        st = ms_positions_retrieve(ms_step_runner_resource(nd->runner, pi), id, &rec->pos, err);
    if (st == MS_OK && si >= 0)
        st = ms_sample_res_pd_set_draw(ms_step_runner_resource(nd->runner, si), id, rec->draw,
                                       err);
    if (st != MS_OK) {
        ms_engine_remove(e, id); /* its pages go back; the other requests are untouched */
        return st;
    }
    r->consumed[MS_LABEL_MAIN] = rec->n_prompt;
    r->walk = w;
    memcpy(r->out, rec->out, (size_t)rec->n_out * sizeof(int32_t));
    r->n_out = rec->n_out;
    r->no_seal = true; /* [prefix] its pages came from elsewhere: not listed in the cache */
    *rid = id;
    return MS_OK;
}
