/*
 * engine_kv.c - [kv pressure] of the engine (engine.h options.host_kv_pages, gpu_memory_fraction,
 * ms_engine_get_kv_stats): the host tier, offload / reload and recompute-preemption. Moved out of
 * engine.c; the private structs are engine_impl.h's. engine.c calls eng_kv_pages_from_fraction and
 * eng_host_arena_init when it builds a node's KV, eng_kv_check_fits at add, eng_kv_skip when it
 * batches a step's rows, eng_kv_reload at a step's start and eng_kv_make_room when a step's admit
 * came out page-short (then it builds the rows again).
 *
 * A page-short admit makes room: a prefill waits while decodes run or other rows share its step;
 * else the least recently used request (one outside the step first) is offloaded to the node's
 * host tier (pinned memory on cuda), or recompute-preempted (its KV dropped, re-prefilled later
 * over prompt + generated ids). Offloaded requests reload first, oldest first, when the free pages
 * cover them plus one per running decode; requests that have not started wait meanwhile. Counters
 * in e->kv_stats.
 */
#include "engine_impl.h"

#include <string.h>

#ifdef MS_HAVE_CUDA
#include "device_cuda.h"
#endif

/* ---- [kv pressure] host tier, offload / reload, recompute-preemption ---- */

/* Device KV pages for options.gpu_memory_fraction F (like vLLM's gpu_memory_utilization): the
 * arena may use what is free on the device after the weights, less the (1 - F) of the total kept
 * free for the per-step buffers and other processes, split evenly over the nodes. */
ms_status eng_kv_pages_from_fraction(ms_engine *e, const eng_node *nd, int32_t ps,
                                     int32_t *pages, ms_error *err) {
    const double f = e->opt.gpu_memory_fraction;
    if (strncmp(e->dev->iface->name, "cuda", 4) != 0)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                       "gpu_memory_fraction %g: device '%s' has no memory to take a fraction of "
                       "(set kv_pages instead)", f, e->dev->iface->name);
    size_t fr = 0, tot = 0;
    MS_TRY(ms_device_mem_info(e->dev, &fr, &tot, err));
    const double keep = (1.0 - f) * (double)tot;
    if ((double)fr <= keep)
        return MS_FAIL(err, MS_ERR_CAPACITY,
                       "gpu_memory_fraction %g: %.2f of %.2f GB free after the weights, %.2f GB "
                       "to stay free: nothing left for the KV arena (raise it or set kv_pages)",
                       f, (double)fr / 1e9, (double)tot / 1e9, keep / 1e9);
    const ms_md_facts *fa = &nd->facts;
    ms_page_arena_config ac = {
        .n_layers = fa->n_layers,
        .page_size = ps,
        .n_kv_heads = fa->n_kv_heads,
        .head_dim = fa->head_dim,
        .elem_bytes = (int32_t)ms_dtype_size(e->kvdtype),
        .layout = MS_KV_LAYOUT_NHD,
        .budget_bytes = (size_t)(((double)fr - keep) / (double)e->n_nodes),
        .name = nd->node->name,
    };
    ms_page_arena_size sz;
    ms_status st = ms_page_arena_measure(&ac, &sz, err);
    if (st != MS_OK) {
        ms_error_prefix(err, "gpu_memory_fraction: ");
        return st;
    }
    *pages = sz.n_pages;
    return MS_OK;
}

/* Node nd's offload tier: options.host_kv_pages usable pages (+ the sink page every arena
 * keeps) of the device arena's geometry, in pinned host memory on cuda (device_cuda.h
 * ms_device_cuda_host_init), plain host memory on cpu. host_kv_pages 0: none. */
ms_status eng_host_arena_init(ms_engine *e, eng_node *nd, const ms_page_arena_config *dev,
                              ms_error *err) {
    if (e->opt.host_kv_pages == 0)
        return MS_OK;
    if (e->host_dev == NULL) {
        if (strncmp(e->dev->iface->name, "cuda", 4) == 0) {
#ifdef MS_HAVE_CUDA
            MS_TRY(ms_device_cuda_host_init(0, &e->host_dev, err));
#else
            return MS_FAIL(err, MS_ERR_UNSUPPORTED, "host_kv_pages: a cuda device in a build "
                           "without CUDA");
#endif
        } else {
            MS_TRY(ms_device_host_init(0, &e->host_dev, err));
        }
    }
    if (e->opt.host_kv_pages >= INT32_MAX)
        return MS_FAIL(err, MS_ERR_LIMIT, "host_kv_pages %d: too many pages",
                       (int)e->opt.host_kv_pages);
    ms_page_arena_config hc = *dev;
    hc.n_pages = e->opt.host_kv_pages + 1;
    hc.budget_bytes = 0;
    hc.name = "kv host tier";
    ms_status st = ms_page_arena_init(&hc, e->host_dev, &nd->host_arena, err);
    if (st != MS_OK)
        ms_error_prefix(err, "host_kv_pages: ");
    return st;
}

/* A request that can never fit is refused at add: per node with a KV arena, its streams need
 * ceil(min(prompt + max_new_tokens, context) / page_size) pages each (a windowed node: the
 * window's pages + 1); more than the arena's usable pages can never be held at once, however
 * many others are offloaded or preempted. */
ms_status eng_kv_check_fits(const ms_engine *e, const ms_engine_request *rq,
                            int32_t n_streams, ms_error *err) {
    for (int32_t i = 0; i < e->n_nodes; i++) {
        const eng_node *nd = &e->nodes[i];
        if (nd->node->hidden_width != NULL || nd->context_label >= 0)
            continue; /* an encoder's stream lives one call; a cross node's context is sized
                         by the arena's own rule */
        const int32_t ps = nd->kv.page_size;
        int64_t tokens = (int64_t)MS_MAX(rq->n_prompt, rq->n_negative_prompt) +
                         rq->max_new_tokens;
        if (tokens > nd->facts.max_context)
            tokens = nd->facts.max_context;
        int64_t per = (tokens + ps - 1) / ps;
        if (nd->facts.window > 0)
            per = MS_MIN(per, (int64_t)MS_CEIL_DIV(nd->facts.window, ps) + 1);
        const int64_t streams = rq->negative_prompt != NULL ? 2 : 1;
        const int64_t need = per * streams;
        const int32_t usable = nd->pages_free_initial;
        if (need > usable)
            return MS_FAIL(err, MS_ERR_CAPACITY,
                           "request of %d prompt + %d new tokens needs %lld KV pages of %d "
                           "tokens (max context %d), the arena holds %d (raise kv_pages or "
                           "lower max_tokens)",
                           (int)MS_MAX(rq->n_prompt, rq->n_negative_prompt),
                           (int)rq->max_new_tokens, (long long)need, (int)ps,
                           (int)nd->facts.max_context, (int)usable);
    }
    (void)n_streams;
    return MS_OK;
}

/* A request that has not started (fresh prefill). */
static bool eng_kv_fresh(const eng_req *r) {
    if (r->n_out > 0 || r->walk.at != 0)
        return false;
    for (int l = 0; l < MS_MAX_LABELS; l++)
        if (r->consumed[l] != 0)
            return false;
    return true;
}

/* True when a step must leave r out: offloaded, waiting for pages in this engine step, or a fresh
 * prefill while some request waits to come back (offloaded or recompute-preempted). */
bool eng_kv_skip(const ms_engine *e, const eng_req *r) {
    return r->kv_offloaded || r->kv_wait || (e->kv_n_parked > 0 && eng_kv_fresh(r));
}

/* Requests waiting to come back: offloaded, or preempted and not yet re-prefilling. */
static void eng_kv_count_parked(ms_engine *e) {
    int32_t n = 0;
    for (size_t i = 0; i < e->n_reqs; i++) {
        const eng_req *r = e->reqs[i];
        if (r->finish == MS_FINISH_NONE &&
            (r->kv_offloaded || (r->n_out > 0 && eng_kv_fresh(r))))
            n++;
    }
    e->kv_n_parked = n;
}

/* Host-tier pages rid holds in node nd. */
static int32_t eng_kv_host_pages(eng_node *nd, ms_rid rid) {
    int32_t n = 0;
    for (ms_label l = 0; l < MS_MAX_LABELS; l++) {
        ms_kv_stream_info si;
        if (ms_kv_pool_stream_info(nd->pool, rid, l, &si) == MS_OK)
            n += si.n_host_pages;
    }
    return n;
}

/* Decoding requests that run (not offloaded): each may take a page in the next step. */
static int32_t eng_kv_running(const ms_engine *e) {
    int32_t n = 0;
    for (size_t i = 0; i < e->n_reqs; i++) {
        const eng_req *r = e->reqs[i];
        if (r->finish == MS_FINISH_NONE && !r->kv_offloaded && ms_walk_in_loop(e->desc, r->walk))
            n++;
    }
    return n;
}

/* Bring offloaded requests back, oldest first, while each node's free pages cover the request's
 * pages plus one per running decode (so the reload is not undone by the next step's growth); the
 * first that does not fit stops the pass (no younger one jumps ahead). */
ms_status eng_kv_reload(ms_engine *e, ms_error *err) {
    int32_t running = -1;
    for (size_t i = 0; i < e->n_reqs; i++) {
        eng_req *r = e->reqs[i];
        if (!r->kv_offloaded || r->finish != MS_FINISH_NONE)
            continue;
        if (running < 0)
            running = eng_kv_running(e);
        bool fits = true;
        int32_t pages = 0;
        for (int32_t k = 0; k < e->n_nodes && fits; k++) {
            eng_node *nd = &e->nodes[k];
            if (nd->host_arena == NULL || !ms_kv_pool_is_offloaded(nd->pool, r->rid))
                continue;
            int32_t need = eng_kv_host_pages(nd, r->rid);
            int32_t fr = ms_page_arena_num_free(nd->arena);
            /* [prefix] pages only the prefix cache holds are free on demand */
            if (fr < need + running && k == 0 && e->pcache != NULL &&
                fr + ms_prefix_cache_stats(e->pcache).unreferenced >= need + running)
                fr += ms_prefix_cache_evict(e->pcache, need + running - fr);
            fits = fr >= need + running;
            pages += need;
        }
        if (!fits)
            break;
        for (int32_t k = 0; k < e->n_nodes; k++) {
            eng_node *nd = &e->nodes[k];
            if (nd->host_arena == NULL || !ms_kv_pool_is_offloaded(nd->pool, r->rid))
                continue;
            ms_status st = ms_kv_pool_reload(nd->pool, r->rid, err);
            if (st == MS_ERR_CAPACITY) {
                fits = false;
                break;
            }
            if (st != MS_OK) {
                ms_error_prefix(err, "kv reload: ");
                return st;
            }
        }
        if (!fits)
            break;
        r->kv_offloaded = false;
        e->kv_stats.reloads++;
        e->kv_stats.pages_reloaded += pages;
        if (ms_walk_in_loop(e->desc, r->walk))
            running++;
    }
    eng_kv_count_parked(e);
    return MS_OK;
}

/* Offload v's KV on every node to the host tier. *done false when no node has a host tier or
 * the host tier is full (MS_ERR_CAPACITY: nothing of that node moved). */
static ms_status eng_kv_offload(ms_engine *e, eng_req *v, bool *done, ms_error *err) {
    *done = false;
    int32_t freed_all = 0;
    for (int32_t k = 0; k < e->n_nodes; k++) {
        eng_node *nd = &e->nodes[k];
        if (nd->host_arena == NULL || ms_kv_pool_reclaimable(nd->pool, v->rid) == 0)
            continue;
        int32_t freed = 0;
        ms_error e2 = {0};
        ms_status st = ms_kv_pool_offload(nd->pool, v->rid, &freed, &e2);
        if (st == MS_ERR_CAPACITY)
            break; /* host tier full */
        if (st != MS_OK) {
            *err = e2;
            ms_error_prefix(err, "kv offload: ");
            return st;
        }
        freed_all += freed;
        *done = true;
    }
    if (*done) {
        v->kv_offloaded = true;
        e->kv_stats.offloads++;
        e->kv_stats.pages_offloaded += freed_all;
    }
    return MS_OK;
}

/* Recompute-preemption is possible for a one-node, one-stream, token-only request whose walk has
 * one prompt item: its state is its prompt and its output ids. */
static bool eng_kv_can_recompute(const ms_engine *e, const eng_req *r) {
    return e->n_nodes == 1 && r->n_streams == 1 && r->positions == NULL &&
           r->features == NULL && r->context == NULL &&
           e->desc->walks[r->walk.walk].loop_begin == 1;
}

/* Drop v's KV (pages back, positions to 0) and put it back at its walk's prompt step with prompt
 * = original prompt + every id generated so far: its re-prefill computes the KV again and samples
 * the id the next decode would have (the sampler's state and the output are kept). */
static ms_status eng_kv_recompute(ms_engine *e, eng_req *v, ms_error *err) {
    eng_node *nd = &e->nodes[0];
    const int32_t n0 = v->n_orig_prompt;
    int32_t *p = ms_malloc((size_t)(n0 + v->n_out) * sizeof(int32_t));
    if (p == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "out of memory for a preempted request's prompt");
    memcpy(p, v->prompt[MS_LABEL_MAIN], (size_t)n0 * sizeof(int32_t));
    memcpy(p + n0, v->out, (size_t)v->n_out * sizeof(int32_t));
    ms_free(v->prompt[MS_LABEL_MAIN]);
    v->prompt[MS_LABEL_MAIN] = p;
    v->n_prompt[MS_LABEL_MAIN] = n0 + v->n_out;
    memset(v->consumed, 0, sizeof v->consumed);
    v->walk.at = 0;
    ms_kv_pool_reset(nd->pool, v->rid, true);
    /* [prefix] its pages listed so far stay valid in the cache, but the sealing reads prompt ++
       output, and the prompt now holds the output too: list nothing more for it */
    v->no_seal = true;
    ms_positions_reset(ms_step_runner_resource(nd->runner, nd->idx[MS_RESOURCE_POS]), v->rid);
    e->kv_stats.preemptions++;
    return MS_OK;
}

/* True when rid is one of the step's n rows. */
static bool eng_kv_in_rows(const ms_engine *e, int32_t n, ms_rid rid) {
    for (int32_t j = 0; j < n; j++)
        if (e->rids[j] == rid)
            return true;
    return false;
}

/*
 * A step's admit came out page-short for e->short_rid (s) on node nd. In order:
 *  1. s is a prefill and decodes run, or other rows share the step: s waits (left out of this
 *     engine step); decodes keep priority and free pages as they finish;
 *  2. else a victim, least recently used first (the pool's LRU candidates), one not in this
 *     step before one in it, never s, never a finished request: offloaded to the host tier, or
 *     recompute-preempted when the host tier is full (or absent) and it can be;
 *  3. nothing to take pages from: s waits when some other request holds pages (finished ones
 *     the caller has not removed yet); else the step fails naming kv_pages (ms_engine_add
 *     refuses what can never fit, so this is not reached by a request the arena holds alone).
 * [prefix] the admit already evicted what only the prefix cache held.
 * The caller builds the rows again.
 */
ms_status eng_kv_make_room(ms_engine *e, eng_node *nd, ms_md_walk_item item, int32_t n,
                           ms_error *err) {
    (void)item;
    eng_req *s = eng_find_req(e, e->short_rid, NULL);
    if (s == NULL)
        return MS_FAIL(err, MS_ERR_INTERNAL, "kv pressure: page-short request %llu not found",
                       (unsigned long long)e->short_rid);
    ms_error dropped = *err; /* the admit's message, for case 3 */
    if (!ms_walk_in_loop(e->desc, s->walk)) {
        if (n > 1) { /* the step's other rows go first; s takes what they leave next time */
            s->kv_wait = true;
            return MS_OK;
        }
        for (size_t i = 0; i < e->n_reqs; i++) {
            const eng_req *r = e->reqs[i];
            if (r != s && r->finish == MS_FINISH_NONE && !r->kv_offloaded && !r->kv_wait &&
                ms_walk_in_loop(e->desc, r->walk)) {
                s->kv_wait = true;
                return MS_OK;
            }
        }
    }
    ms_rid cand[64];
    int32_t m = ms_kv_pool_lru_candidates(nd->pool, cand, 64);
    for (int pass = 0; pass < 2; pass++) {
        for (int32_t i = 0; i < m; i++) {
            if (cand[i] == s->rid || eng_kv_in_rows(e, n, cand[i]) != (pass == 1))
                continue;
            eng_req *v = eng_find_req(e, cand[i], NULL);
            if (v == NULL || v->finish != MS_FINISH_NONE || v->kv_offloaded)
                continue;
            bool done = false;
            MS_TRY(eng_kv_offload(e, v, &done, err));
            if (!done && eng_kv_can_recompute(e, v)) {
                MS_TRY(eng_kv_recompute(e, v, err));
                done = true;
            }
            if (done) {
                v->kv_wait = pass == 1; /* a row of this step: not again in this step */
                eng_kv_count_parked(e);
                return MS_OK;
            }
        }
    }
    for (size_t i = 0; i < e->n_reqs; i++) {
        const eng_req *r = e->reqs[i];
        if (r == s || r->kv_offloaded)
            continue;
        for (ms_label l = 0; l < MS_MAX_LABELS; l++)
            if (ms_kv_pool_stream_pages(nd->pool, r->rid, l, NULL, 0) > 0) {
                s->kv_wait = true; /* r holds pages nothing here can take (finished, not yet
                                      removed): they come back when it is */
                return MS_OK;
            }
    }
    *err = dropped;
    return MS_ERR_CAPACITY;
}

void ms_engine_get_kv_stats(const ms_engine *e, ms_engine_kv_stats *out) {
    *out = e->kv_stats;
    out->n_offloaded = 0;
    for (size_t i = 0; i < e->n_reqs; i++)
        out->n_offloaded += e->reqs[i]->kv_offloaded;
    out->host_pages = 0;
    out->host_pages_free = 0;
    for (int32_t k = 0; k < e->n_nodes; k++)
        if (e->nodes[k].host_arena != NULL) {
            out->host_pages += ms_page_arena_num_pages(e->nodes[k].host_arena) - 1;
            out->host_pages_free += ms_page_arena_num_free(e->nodes[k].host_arena);
        }
}
