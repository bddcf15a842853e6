/*
 * engine_prefix.c - [prefix] of the engine (engine.h options.prefix_cache, ms_engine_prefix_stats):
 * prefix caching over prefix_cache.h. Moved out of engine.c; the private structs are
 * engine_impl.h's. engine.c's init calls eng_prefix_init, its add (and engine_fork.c's detach)
 * eng_prefix_adopt, and its step eng_prefix_seal after a step committed a request's KV.
 */
#include "engine_impl.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

/* Largest page size whose pages are cached (the ids of one page are hashed from the stack). */
#define MS_PREFIX_MAX_PAGE 256

/* ---- [prefix] prefix caching (prefix_cache.h) ----
 *
 * Models of one node with a KV pool (no cross-attention context): at add, the longest cached
 * run of full pages of the prompt is adopted into the request's main stream (the pool takes the
 * lookup's owners, the positions counter starts after it, the prompt is consumed that far); after
 * every step, each full page the step committed is listed under the key chained from the
 * request's previous page over prompt ++ output ids. A page-short admit evicts least recently used
 * pages only the cache holds and tries once more. A guided (CFG) pair's streams are cached each
 * under its label's key bytes. Not for explicit positions, encoder walks or dense block steps
 * (their KV depends on more than the ids), nor past a page the sliding window released. */

ms_status eng_prefix_init(ms_engine *e, ms_error *err) {
    if (!e->opt.prefix_cache || e->n_nodes != 1)
        return MS_OK; /* several nodes: each node's streams are its own (not yet cached) */
    eng_node *nd = &e->nodes[0];
    if (nd->pool == NULL || nd->context_label >= 0 || nd->kv.page_size > MS_PREFIX_MAX_PAGE)
        return MS_OK;
    /* the root: what changes the KV of the same ids (prefix_cache.h): the model, its config
       struct (shapes, RoPE, norms), the checkpoint (path, size, mtime), the KV dtype */
    char weights[1200];
    struct stat st;
    if (stat(e->opt.model_path, &st) == 0)
        snprintf(weights, sizeof weights, "%s size %lld mtime %lld", e->opt.model_path,
                 (long long)st.st_size, (long long)st.st_mtime);
    else
        snprintf(weights, sizeof weights, "%s", e->opt.model_path);
    char positions[64];
    snprintf(positions, sizeof positions, "config %zu bytes", e->desc->config_size);
    ms_prefix_fingerprint fp = {.model = e->desc->name, .weights = weights,
                                .kv_dtype = ms_dtype_str(e->kvdtype),
                                .page_size = nd->kv.page_size, .positions = positions};
    MS_TRY(ms_prefix_root(&fp, &e->proot, err));
    ms_prefix_key cfg = ms_prefix_page_key(e->proot, NULL, 0, e->config, e->desc->config_size);
    e->proot = cfg; /* the config struct's bytes are part of the root */
    return ms_prefix_cache_init(nd->arena, MS_MAX(nd->kv_pages - 1, 1), &e->pcache, err);
}

/* The key bytes a stream's label adds to each of its pages: none for main, the label's index for
 * another (a CFG pair's unconditional stream keys its pages apart, as prefix_cache.h asks). */
static ms_prefix_extra eng_prefix_extra(const ms_label *l) {
    ms_prefix_extra x = {*l == MS_LABEL_MAIN ? NULL : l, *l == MS_LABEL_MAIN ? 0 : sizeof *l};
    return x;
}

/* Adopt the cached prefix of stream `l`'s prompt (see above). */
static void eng_prefix_adopt_label(ms_engine *e, eng_req *r, ms_label l) {
    eng_node *nd = &e->nodes[0];
    const int32_t ps = nd->kv.page_size, n = r->n_prompt[l];
    int32_t max_pages = (n - 1) / ps;
    if (max_pages < 1)
        return;
    int32_t stack_pages[64];
    ms_prefix_key stack_keys[64];
    ms_prefix_extra stack_x[64];
    const bool big = max_pages > 64;
    int32_t *pages = big ? ms_malloc((size_t)max_pages * sizeof *pages) : stack_pages;
    ms_prefix_key *keys = big ? ms_malloc((size_t)max_pages * sizeof *keys) : stack_keys;
    ms_prefix_extra *xs = big ? ms_malloc((size_t)max_pages * sizeof *xs) : stack_x;
    if (pages == NULL || keys == NULL || xs == NULL)
        goto done; /* no memory for the lookup: compute the prompt */
    for (int32_t i = 0; i < max_pages; i++)
        xs[i] = eng_prefix_extra(&l);
    int32_t hit = ms_prefix_cache_lookup(e->pcache, e->proot, r->prompt[l], n, xs, max_pages,
                                         pages, keys);
    if (hit > 0) {
        ms_error err = {0};
        ms_status st = ms_kv_pool_adopt_prefix(nd->pool, r->rid, l, pages, hit, &err);
        int pi = nd->idx[MS_RESOURCE_POS];
        if (st == MS_OK && pi >= 0) {
            ms_pos_published pub;
            memset(&pub, 0, sizeof pub);
            pub.counter[l] = hit * ps;
            st = ms_positions_retrieve(ms_step_runner_resource(nd->runner, pi), r->rid, &pub,
                                       &err);
        }
        if (st != MS_OK) {
            /* the pool refused (it changed nothing) or positions did: give the pages back and
               compute the whole prompt */
            if (ms_kv_pool_stream_pages(nd->pool, r->rid, l, NULL, 0) > 0)
                ms_kv_pool_reset(nd->pool, r->rid, true);
            else
                (void)ms_page_arena_release(nd->arena, pages, hit, NULL);
        } else {
            r->consumed[l] = hit * ps;
            r->sealed[l] = hit;
            r->seal_key[l] = keys[hit - 1];
        }
    }
done:
    if (big) {
        ms_free(pages);
        ms_free(keys);
        ms_free(xs);
    }
}

void eng_prefix_adopt(ms_engine *e, eng_req *r) {
    if (e->pcache == NULL || r->no_seal)
        return;
    for (ms_label l = 0; l < MS_MAX_LABELS; l++)
        if (r->prompt[l] != NULL)
            eng_prefix_adopt_label(e, r, l);
}

/* List stream `l`'s newly full pages (see above); false when the stream can list no more. */
static bool eng_prefix_seal_label(ms_engine *e, eng_req *r, ms_label l) {
    eng_node *nd = &e->nodes[0];
    ms_kv_stream_info info;
    if (ms_kv_pool_stream_info(nd->pool, r->rid, l, &info) != MS_OK)
        return true; /* not created yet */
    if (info.released > 0)
        return false; /* the window cut the stream: its chain cannot go on */
    const int32_t ps = nd->kv.page_size, full = info.stored / ps;
    if (full <= r->sealed[l])
        return true;
    /* the stored ids: the stream's prompt ++ the output, of which the first `stored` are in the
       KV (a CFG pair feeds each sampled id to both of its streams) */
    const int32_t np = r->n_prompt[l];
    if (info.stored > np + r->n_out)
        return false; /* not the walk's own tokens (no_seal covers the known cases) */
    int32_t stack_pages[64];
    int32_t *pages = full <= 64 ? stack_pages : ms_malloc((size_t)full * sizeof *pages);
    if (pages == NULL)
        return true;
    const ms_prefix_extra x = eng_prefix_extra(&l);
    if (ms_kv_pool_stream_pages(nd->pool, r->rid, l, pages, full) >= full) {
        int32_t ids[MS_PREFIX_MAX_PAGE];
        for (int32_t k = r->sealed[l]; k < full; k++) {
            for (int32_t t = 0; t < ps; t++) {
                int32_t at = k * ps + t;
                ids[t] = at < np ? r->prompt[l][at] : r->out[at - np];
            }
            /* page k's parent: the root for the first page, else page k - 1's key */
            ms_prefix_key key = ms_prefix_page_key(k == 0 ? e->proot : r->seal_key[l], ids, ps,
                                                   x.data, x.len);
            int32_t listed;
            ms_error err = {0};
            if (ms_prefix_cache_insert(e->pcache, key, pages[k], &listed, &err) != MS_OK)
                break;
            r->seal_key[l] = key;
            r->sealed[l] = k + 1;
        }
    }
    if (pages != stack_pages)
        ms_free(pages);
    return true;
}

void eng_prefix_seal(ms_engine *e, eng_req *r) {
    if (e->pcache == NULL || r == NULL || r->no_seal)
        return;
    for (ms_label l = 0; l < MS_MAX_LABELS && !r->no_seal; l++)
        if (r->prompt[l] != NULL && !eng_prefix_seal_label(e, r, l))
            r->no_seal = true;
}

void ms_engine_prefix_stats(const ms_engine *e, ms_prefix_stats *out) {
    memset(out, 0, sizeof *out);
    if (e != NULL && e->pcache != NULL)
        *out = ms_prefix_cache_stats(e->pcache);
}
