/*
 * engine_dense.c - [encoder] of the engine: dense nodes (engine.h ms_engine_encode,
 * ms_engine_encode_batch, ms_engine_transcribe, and a walk whose first item is an encoder).
 * Moved out of engine.c; the private structs are engine_impl.h's. engine.c calls
 * eng_node_is_dense and eng_dense_init when it builds the nodes, eng_walk_dense_streams at add and
 * eng_step_encode when the scheduler picks an encoder's step.
 *
 * A node without a kv_pool or a scratch has no page arena, pool or step runner and nothing per
 * request: the generated step runner's segments, one window each, are staged as an
 * ms_dense_batch for the forward's attention_dense, positions numbered from 0 per window, and the
 * windows of one step run in ONE forward. As a walk's first item, over ms_engine_request.features,
 * every request standing at the encode step is encoded in one step and its rows become the next
 * node's cross-attention context (Whisper).
 */
#include "engine_impl.h"

#include <math.h>
#include <string.h>

/* ---- [encoder] dense nodes ---- */

/* A node without a kv_pool or a scratch: its attention reads the step's own K/V rows
   (attention_dense). */
bool eng_node_is_dense(const ms_md_node *d) {
    for (int32_t i = 0; i < d->n_resources; i++)
        if (d->resources[i].kind == MS_RESOURCE_KV || d->resources[i].kind == MS_RESOURCE_SCRATCH)
            return false;
    return true;
}

/*
 * A dense node: the engine runs it as an encoder (a shaped input in, every row's hidden state
 * out, one step of one segment per window) with nothing per request: no page arena, no pool, no
 * step runner. It owns one dense batch (the segments' offsets) sized for the windows one step
 * holds.
 */
ms_status eng_dense_init(ms_engine *e, eng_node *nd, ms_error *err) {
    const ms_md_node *d = nd->node;
    for (int k = 0; k < MS_RESOURCE_KIND_COUNT; k++)
        nd->idx[k] = -1;
    for (int32_t i = 0; i < d->n_resources; i++)
        nd->idx[d->resources[i].kind] = i;
    if (d->hidden_width == NULL || d->input_shape == NULL || d->n_steps != 1 ||
        nd->idx[MS_RESOURCE_ATTN] < 0 || nd->idx[MS_RESOURCE_SAMPLER] >= 0 ||
        nd->idx[MS_RESOURCE_CROSS] >= 0)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                       "model %s: node %s has no kv_pool: the engine runs such a node as an "
                       "encoder (a shaped input, hidden rows out, one step, a dense attention, "
                       "no sampler or cross resource)", e->desc->name, d->name);
    const ms_md_facts *fa = &nd->facts;
    if (fa->max_context < 1 || fa->head_dim < 1 || fa->n_q_heads < 1)
        return MS_FAIL(err, MS_ERR_FORMAT,
                       "model %s: node %s: window of %d rows, head_dim %d, %d query heads under "
                       "this config (all must be positive)", e->desc->name, d->name,
                       (int)fa->max_context, (int)fa->head_dim, (int)fa->n_q_heads);
    nd->dense = true;
    nd->context_label = -1;
    nd->pos_cfg.n_axes = 1; /* one position stream: each window's rows from 0 */
    const int32_t want = e->opt.encode_windows;
    if (want < 0 || want > e->max_seqs || (int64_t)want * fa->max_context > INT32_MAX / 4)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "encode_windows %d: node %s batches 1 to max_seqs (%d) windows of %d rows "
                       "(0: what max_tokens holds)", (int)want, d->name, (int)e->max_seqs,
                       (int)fa->max_context);
    nd->max_windows = want > 0 ? want
                               : MS_MAX(1, MS_MIN(e->max_seqs, e->max_tokens / fa->max_context));
    nd->dense_tokens = nd->max_windows * fa->max_context;
    nd->dense_params = (ms_attn_params){
        .scale = fa->attn_scale > 0.0f ? fa->attn_scale : 1.0f / sqrtf((float)fa->head_dim),
        .window = 0,
        .causal = false};
    return ms_dense_batch_init(&e->be, nd->max_windows, nd->dense_tokens, &nd->dense_batch, err);
}

/* [encoder] The streams ms_walk_n_streams counts at the dense nodes of walk w: their step's
 * labels, once per node. They hold nothing, so a request takes no slot of max_seqs for them. */
int32_t eng_walk_dense_streams(const ms_engine *e, int32_t w) {
    const ms_md_walk *wk = &e->desc->walks[w];
    bool counted[MS_MD_MAX_NODES] = {false};
    int32_t n = 0;
    for (int32_t i = 0; i < wk->n_items; i++) {
        const ms_md_walk_item it = wk->items[i];
        if (!e->nodes[it.node].dense || counted[it.node])
            continue;
        counted[it.node] = true;
        bool seen[MS_MAX_LABELS] = {false};
        const ms_md_step *s = &e->nodes[it.node].node->steps[it.step];
        for (int32_t k = 0; k < s->n_segments; k++)
            if (!seen[s->labels[k]]) {
                seen[s->labels[k]] = true;
                n++;
            }
    }
    return n;
}

/*
 * [encoder] One step of dense node nd over n windows (items[i].input [channels, frames] each,
 * channel-major): the generated step runner declares one segment per window, the inputs are
 * staged token-major one after another, positions number each window's rows from 0, the dense
 * batch carries the segments' offsets, and the forward runs once over all of them (eager). Each
 * window's hidden rows go to its own out. Nothing is kept: no request state, no pages.
 */
static ms_status eng_encode_windows(ms_engine *e, eng_node *nd, ms_engine_encode_item *items,
                                    int32_t n, ms_error *err) {
    for (int32_t i = 0; i < n; i++)
        items[i].n_rows = items[i].width = 0;
    if (!nd->dense)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "encode: node %s has a kv_pool (an encoder "
                       "runs a dense attention)", nd->node->name);
    if (n < 1 || n > nd->max_windows)
        return MS_FAIL(err, MS_ERR_CAPACITY,
                       "encode: %d windows in one step; node %s batches 1 to %d (options."
                       "encode_windows, else the whole windows of max_tokens %d)", (int)n,
                       nd->node->name, (int)nd->max_windows, (int)e->max_tokens);
    int64_t rows = 0, cols = 0; /* one window as the forward reads it: [frames, channels] */
    nd->node->input_shape(e->config, &rows, &cols);
    for (int32_t i = 0; i < n; i++)
        if (items[i].input == NULL || items[i].n_channels != cols || items[i].n_frames != rows)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "encode: window %d: node %s takes input [%lld, %lld] (channels, "
                           "frames), got [%lld, %lld]", (int)i, nd->node->name, (long long)cols,
                           (long long)rows, (long long)items[i].n_channels,
                           (long long)items[i].n_frames);
    const ms_md_step *sd = &nd->node->steps[0];
    for (int32_t i = 0; i < n; i++) {
        memset(&e->rows[i], 0, sizeof e->rows[i]);
        e->rows[i].rid = e->next_rid++; /* a window of this step alone */
    }
    MS_TRY(sd->run(e->config, e->rows, n, &e->build, err));
    const ms_step *st = &e->build.step;
    if (st->n_segments != n)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                       "encode: step %s of node %s declares %d segments for %d windows (one "
                       "each)", sd->name, nd->node->name, (int)st->n_segments, (int)n);
    int32_t *lens = e->ids_host; /* [max_seqs] scratch: n <= max_windows <= max_seqs */
    const int64_t w = nd->node->hidden_width(e->config);
    for (int32_t i = 0; i < n; i++) {
        lens[i] = st->segments[i].span;
        if (e->build.seg_row[i] != i || lens[i] < 1)
            return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                           "encode: step %s of node %s: segment %d is not one window of rows",
                           sd->name, nd->node->name, (int)i);
        if (items[i].out == NULL || items[i].cap < (int64_t)lens[i] * w)
            return MS_FAIL(err, MS_ERR_CAPACITY,
                           "encode: window %d: node %s returns [%d, %lld], the output holds "
                           "%lld floats", (int)i, nd->node->name, (int)lens[i], (long long)w,
                           (long long)items[i].cap);
    }
    const int32_t n_tok = e->build.n_tokens;
    if (n_tok > nd->dense_tokens)
        return MS_FAIL(err, MS_ERR_CAPACITY,
                       "encode: step %s of node %s declares %d tokens, its buffers hold %d",
                       sd->name, nd->node->name, (int)n_tok, (int)nd->dense_tokens);
    /* token-major staging, window after window: input[c, t] -> input_host[t, c] */
    const int64_t per = rows * cols;
    for (int32_t i = 0; i < n; i++)
        for (int64_t t = 0; t < rows; t++)
            for (int64_t c = 0; c < cols; c++)
                e->input_host[i * per + t * cols + c] = items[i].input[c * rows + t];
    const ms_backend_i *f = &e->be.iface;
    void *cx = e->be.ctx;
    MS_TRY(f->copy_to_backend(cx, e->input_dev, e->input_host, (size_t)(n * per) * sizeof(float),
                              err));
    /* positions: each window's rows from 0 (staged through the token buffer, then the forward
       reads no ids: zeros) */
    for (int32_t i = 0, t = 0; i < n; i++)
        for (int32_t j = 0; j < lens[i]; j++)
            e->tokens_host[t++] = j;
    MS_TRY(f->copy_to_backend(cx, e->pos_dev, e->tokens_host, (size_t)n_tok * sizeof(int32_t),
                              err));
    memset(e->tokens_host, 0, (size_t)n_tok * sizeof(int32_t));
    MS_TRY(f->copy_to_backend(cx, e->tokens_dev, e->tokens_host,
                              (size_t)n_tok * sizeof(int32_t), err));
    MS_TRY(ms_dense_batch_stage(&e->be, nd->dense_batch, lens, n, err));
    ms_tensor tokens = ms_tensor_1d(e->tokens_dev, MS_DTYPE_I32, n_tok);
    ms_tensor pos = ms_tensor_1d(e->pos_dev, MS_DTYPE_I32, n_tok);
    ms_tensor hidden = ms_tensor_2d(e->hidden_dev, MS_DTYPE_F32, n_tok, w);
    ms_tensor input = ms_tensor_2d(e->input_dev, MS_DTYPE_F32, (int64_t)n * rows, cols);
    ms_md_forward_args args = eng_forward_args(e, &nd->facts);
    args.dense = nd->dense_batch;
    args.tokens = &tokens;
    args.input = &input;
    args.positions = &pos;
    args.attn = nd->dense_params;
    args.max_tokens = nd->dense_tokens; /* the node's layout capacity (eng_buffers_init) */
    args.logits = &hidden;
    MS_TRY(nd->node->forward(&args, err));
    for (int32_t i = 0, t = 0; i < n; i++) {
        MS_TRY(f->copy_to_host(cx, items[i].out, e->hidden_dev + (size_t)t * (size_t)w,
                               (size_t)lens[i] * (size_t)w * sizeof(float), err));
        t += lens[i];
    }
    for (int32_t i = 0; i < n; i++) {
        items[i].n_rows = lens[i];
        items[i].width = w;
    }
    return MS_OK;
}

/* Node `name` of e when it reads a shaped input and returns hidden states, else NULL. */
static eng_node *eng_encoder_node(ms_engine *e, const char *name) {
    for (int32_t i = 0; i < e->n_nodes; i++)
        if (name != NULL && strcmp(e->nodes[i].node->name, name) == 0 &&
            e->nodes[i].node->hidden_width != NULL && e->nodes[i].node->input_shape != NULL &&
            e->nodes[i].scratch == NULL) /* [scratch] its rows: ms_engine_run_rows */
            return &e->nodes[i];
    return NULL;
}

ms_status ms_engine_encode_batch(ms_engine *e, const char *node, ms_engine_encode_item *items,
                                 int32_t n_items, ms_error *err) {
    for (int32_t i = 0; i < n_items && items != NULL; i++)
        items[i].n_rows = items[i].width = 0;
    if (e->tpg != NULL) /* [tp] */
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "encode: not with tensor parallelism");
    eng_node *nd = eng_encoder_node(e, node);
    if (nd == NULL)
        return MS_FAIL(err, MS_ERR_NOT_FOUND,
                       "encode: model %s has no node '%s' reading a shaped input and returning "
                       "hidden states", e->desc->name, node != NULL ? node : "(null)");
    if (items == NULL && n_items > 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "encode: %d windows and no list",
                       (int)n_items);
    return eng_encode_windows(e, nd, items, n_items, err);
}

ms_status ms_engine_encode(ms_engine *e, const char *node, const float *input, int64_t n_channels,
                           int64_t n_frames, float *out, int64_t cap, int64_t *n_rows,
                           int64_t *width, ms_error *err) {
    ms_engine_encode_item it = {.input = input, .n_channels = n_channels, .n_frames = n_frames,
                                .out = out, .cap = cap};
    ms_status st = ms_engine_encode_batch(e, node, &it, 1, err);
    *n_rows = it.n_rows;
    *width = it.width;
    return st;
}

ms_status ms_engine_transcribe(ms_engine *e, ms_engine_transcript *items, int32_t n_items,
                               ms_error *err) {
    for (int32_t i = 0; i < n_items; i++) {
        items[i].ids = NULL;
        items[i].n_ids = 0;
        items[i].finish = MS_FINISH_NONE;
    }
    if (e->n_active > 0)
        return MS_FAIL(err, MS_ERR_STATE, "transcribe: %d requests are already running",
                       (int)e->n_active);
    ms_status st = MS_OK;
    int32_t next = 0; /* first item not yet added */
    ms_rid rids[MS_TRANSCRIBE_MAX_BATCH];
    int32_t first[MS_TRANSCRIBE_MAX_BATCH];
    while (st == MS_OK && next < n_items) {
        /* a wave: as many items as max_seqs takes (each holds its walk's streams) */
        int32_t n = 0;
        while (next < n_items && n < MS_TRANSCRIBE_MAX_BATCH) {
            const ms_engine_transcript *t = &items[next];
            ms_engine_request rq = {.prompt = t->prompt, .n_prompt = t->n_prompt,
                                    .max_new_tokens = t->max_new_tokens,
                                    .sampling = ms_sampling_greedy(), .features = t->features,
                                    .n_feature_channels = t->n_channels,
                                    .n_feature_frames = t->n_frames};
            st = ms_engine_add(e, &rq, &rids[n], err);
            if (st == MS_ERR_CAPACITY && n > 0) {
                st = MS_OK; /* full: run this wave, the item goes in the next */
                break;
            }
            if (st != MS_OK) {
                ms_error_prefix(err, "transcribe item %d: ", (int)next);
                break;
            }
            first[n++] = next++;
        }
        while (st == MS_OK && e->n_active > 0)
            st = ms_engine_step(e, NULL, err);
        for (int32_t k = 0; k < n; k++) {
            const int32_t *ids;
            int32_t m;
            ms_finish_reason why;
            ms_engine_transcript *t = &items[first[k]];
            if (st == MS_OK && ms_engine_output(e, rids[k], &ids, &m, &why) == MS_OK) {
                t->ids = ms_malloc((size_t)(m > 0 ? m : 1) * sizeof(int32_t));
                if (t->ids == NULL) {
                    st = MS_FAIL(err, MS_ERR_OOM, "transcribe: out of memory for %d ids", (int)m);
                } else {
                    memcpy(t->ids, ids, (size_t)m * sizeof(int32_t));
                    t->n_ids = m;
                    t->finish = why;
                }
            }
            ms_engine_remove(e, rids[k]);
        }
    }
    if (st != MS_OK)
        for (int32_t i = 0; i < n_items; i++) {
            ms_free(items[i].ids);
            items[i].ids = NULL;
            items[i].n_ids = 0;
        }
    return st;
}

/*
 * [encoder] An engine step at a node returning hidden states (the walk's first item,
 * ms_engine_add): the requests standing there (arrival order, as many as one step batches:
 * nd->max_windows) are encoded in ONE forward, a window each; each one's rows become the context
 * prompt of its next item's node, and its walk moves on (nothing is sampled).
 */
ms_status eng_step_encode(ms_engine *e, eng_node *nd, ms_md_walk_item item,
                          ms_engine_step_info *info, ms_error *err) {
    eng_req *batch[MS_TRANSCRIBE_MAX_BATCH];
    ms_engine_encode_item items[MS_TRANSCRIBE_MAX_BATCH];
    const int32_t lim = MS_MIN(nd->max_windows, MS_TRANSCRIBE_MAX_BATCH);
    int32_t n = 0;
    for (size_t i = 0; i < e->n_reqs && n < lim; i++) {
        ms_md_walk_item at = ms_walk_item(e->desc, e->reqs[i]->walk);
        if (e->reqs[i]->finish == MS_FINISH_NONE && at.node == item.node && at.step == item.step)
            batch[n++] = e->reqs[i];
    }
    MS_ASSERT(n > 0);
    const int64_t w = nd->node->hidden_width(e->config);
    const int64_t cap = (int64_t)nd->facts.max_context * w;
    for (int32_t k = 0; k < n; k++) {
        eng_req *r = batch[k];
        MS_ASSERT(r->features != NULL);
        if (r->context == NULL)
            r->context = ms_malloc((size_t)cap * sizeof(float));
        if (r->context == NULL)
            return MS_FAIL(err, MS_ERR_OOM, "out of memory for %lld context rows",
                           (long long)cap);
        items[k] = (ms_engine_encode_item){.input = r->features, .n_channels = r->n_channels,
                                           .n_frames = r->n_frames, .out = r->context,
                                           .cap = cap};
    }
    MS_TRY(eng_encode_windows(e, nd, items, n, err));
    int32_t total = 0;
    for (int32_t k = 0; k < n; k++) {
        eng_req *r = batch[k];
        ms_free(r->features); /* the features are not read again */
        r->features = NULL;
        r->n_context = (int32_t)items[k].n_rows;
        r->context_width = items[k].width;
        total += r->n_context;
        ms_walk_advance(e->desc, &r->walk);
        const eng_node *next = &e->nodes[ms_walk_item(e->desc, r->walk).node];
        r->n_prompt[next->context_label] = r->n_context;
        r->consumed[next->context_label] = 0;
    }
    if (info != NULL)
        *info = (ms_engine_step_info){.n_seqs = n, .n_tokens = total, .n_prefill = 0};
    return MS_OK;
}
