/*
 * engine_scratch.c - [scratch] of the engine: a node on a scratch KV (a code predictor: no page
 * arena, its runner over an ms_scratch_kv alone, request i on batch row i, positions = the slots
 * of the frame), and engine.h ms_engine_run_rows_pick / ms_engine_run_rows_codes_pick, which run
 * a step of such a node and pick each request's id from its last returned row. Moved out of
 * engine.c; the private structs are engine_impl.h's. engine.c calls eng_scratch_node and
 * eng_scratch_init when it builds a node's resources, and eng_run_input ([inputs_embeds], which
 * stays in engine.c beside the step it shares eng_run_built / eng_forward_sample with) calls
 * eng_run_scratch for a scratch node.
 */
#include "engine_impl.h"

#include <math.h>
#include <string.h>

/* ---- [scratch] a node on a scratch KV (a code predictor) ---- */

bool eng_scratch_node(const eng_node *nd) {
    for (int32_t i = 0; i < nd->node->n_resources; i++)
        if (nd->node->resources[i].kind == MS_RESOURCE_SCRATCH)
            return true;
    return false;
}

/*
 * The runner of a node on a scratch KV: the scratch alone (ms_scratch_kv_build: segment i is
 * batch row i; max_seqs rows of a frame of facts.max_context slots; KV dtype of the engine),
 * its buffer viewed as the paged KV the attention ops read (page_size = the frame's slots,
 * row r on page r + 1), an attention batch staging its plans. A rope over it reads the
 * engine's RoPE table (the model's), so it must be that table: same style, head and rotary
 * dims, theta, no scaling or sections. Anything else on the node is refused.
 */
ms_status eng_scratch_init(ms_engine *e, eng_node *nd, ms_error *err) {
    const ms_md_node *d = nd->node;
    const ms_md_facts *fa = &nd->facts;
    for (int k = 0; k < MS_RESOURCE_KIND_COUNT; k++)
        nd->idx[k] = -1;
    nd->context_label = -1;
    for (int32_t i = 0; i < d->n_resources; i++) {
        ms_resource_kind k = d->resources[i].kind;
        if ((k != MS_RESOURCE_SCRATCH && k != MS_RESOURCE_POS) || nd->idx[k] >= 0)
            return MS_FAIL(err, MS_ERR_UNSUPPORTED, "model %s: node %s: resource '%s' (%s) beside "
                           "a scratch KV: the node attends through the scratch alone",
                           e->desc->name, d->name, d->resources[i].key,
                           ms_resource_kind_str(k));
        nd->idx[k] = i;
    }
    if (nd->idx[MS_RESOURCE_SCRATCH] != 0 || d->hidden_width == NULL)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "model %s: node %s: a scratch node returns "
                       "hidden rows with the scratch as its first resource", e->desc->name,
                       d->name);
    if (nd->idx[MS_RESOURCE_POS] >= 0) {
        const ms_rope_config *a = &fa->rope, *b = &e->facts.rope;
        if (a->style != b->style || a->head_dim != b->head_dim || a->rotary_dim != b->rotary_dim ||
            a->theta != b->theta || a->scaling != MS_ROPE_SCALING_NONE || a->n_sections != 0 ||
            b->scaling != MS_ROPE_SCALING_NONE || b->n_sections != 0)
            return MS_FAIL(err, MS_ERR_UNSUPPORTED, "model %s: node %s: its rope (head_dim %d, "
                           "theta %g) is not the model's RoPE table (head_dim %d, theta %g): the "
                           "engine keeps one", e->desc->name, d->name, (int)a->head_dim,
                           a->theta, (int)b->head_dim, b->theta);
    }
    if (fa->scratch_rows < 1)
        return MS_FAIL(err, MS_ERR_FORMAT, "model %s: node %s: scratch of %d rows", e->desc->name,
                       d->name, (int)fa->scratch_rows);
    nd->scratch_cfg = (ms_scratch_kv_config){
        .device = e->dev, .max_rows = MS_MIN(fa->scratch_rows, e->max_seqs),
        .layers = fa->n_layers,
        .positions = fa->max_context, .kv_heads = fa->n_kv_heads, .head_dim = fa->head_dim,
        .elem_bytes = ms_dtype_size(e->kvdtype)};
    ms_resource_spec spec = {.key = d->resources[0].key, .kind = MS_RESOURCE_SCRATCH,
                             .build = ms_scratch_kv_build, .config = &nd->scratch_cfg};
    MS_TRY(ms_step_runner_init(&nd->runner, &spec, 1, err));
    nd->scratch = ms_step_runner_resource(nd->runner, 0);
    nd->kv = (ms_paged_kv){
        .data = ms_scratch_kv_data(nd->scratch),
        .dtype = e->kvdtype,
        .n_layers = fa->n_layers,
        .n_pages = ms_scratch_kv_pages(nd->scratch),
        .page_size = fa->max_context,
        .n_kv_heads = fa->n_kv_heads,
        .head_dim = fa->head_dim,
    };
    ms_attn_limits lim = {.max_seqs = e->max_seqs, .max_tokens = e->max_tokens,
                          .max_pages = nd->kv.n_pages};
    MS_TRY(e->be.iface.attn_batch_init(e->be.ctx, &lim, &nd->attn.batch, err));
    nd->attn.scale = fa->attn_scale > 0.0f ? fa->attn_scale : 1.0f / sqrtf((float)fa->head_dim);
    return MS_OK;
}

/*
 * One step of a scratch node over e->rows[0 .. n) (built in e->build; the rows staged in
 * input_dev): admit -> plan on the scratch, the plan staged for the attention ops, positions =
 * the slots of the frame, the forward into hidden_dev [n_tokens, width], commit. A failure
 * after admit abandons the step (the scratch unchanged).
 */
ms_status eng_run_scratch(ms_engine *e, eng_node *nd, const ms_md_step *sd, int32_t n,
                          const int32_t *spans, ms_error *err) {
    const ms_backend_i *f = &e->be.iface;
    void *cx = e->be.ctx;
    ms_step *step = &e->build.step;
    ms_step_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.request_ids = e->rids;
    ctx.n_rows = n;
    ctx.n_real = n;
    ms_admit_outcome o = ms_step_runner_admit(nd->runner, step, &ctx);
    if (o.code != MS_ADMIT_OK)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "step %s.%s: scratch '%s' refused the batch "
                       "(%s): at most %d rows of at most %d slots", nd->node->name, sd->name,
                       nd->node->resources[0].key, ms_admit_code_str(o.code),
                       (int)nd->scratch_cfg.max_rows,
                       (int)nd->facts.max_context);
    ms_status st = ms_step_runner_plan(nd->runner, step, &ctx, err);
    if (st != MS_OK)
        return st; /* the runner abandoned the step */
    const ms_kv_plan *plan = ctx.plan_results[0];
    const int32_t T = plan->n_tokens;
    /* the frame slot of every request's last row (rows request by request, spans[i] each), what
       the forward's `for v in group at <scratch>.slot` reads: -1 when they differ (a forward
       picking a member by it refuses the step) */
    int32_t frame_slot = -1;
    for (int32_t i = 0, t = 0; i < n; i++) {
        t += spans[i];
        const int32_t sl = t >= 1 && t <= T ? plan->token_to_slot[t - 1] : -1;
        if (i == 0 || sl != frame_slot)
            frame_slot = i == 0 ? sl : -1;
        if (frame_slot < 0)
            break;
    }
    ms_attn_params ap = {.scale = nd->attn.scale, .window = 0, .causal = true};
    int64_t rows = 0, cols = 0, width = nd->node->hidden_width(e->config);
    nd->node->input_shape(e->config, &rows, &cols);
    ms_tensor tokens = ms_tensor_1d(e->tokens_dev, MS_DTYPE_I32, T);
    ms_tensor pos = ms_tensor_1d(e->pos_dev, MS_DTYPE_I32, T);
    ms_tensor input = ms_tensor_2d(e->input_dev, MS_DTYPE_F32, T, cols);
    ms_tensor out = ms_tensor_2d(e->hidden_dev, MS_DTYPE_F32, T, width);
    /* [scratch] the ids staged besides the rows (eng_run_input) */
    ms_tensor codes = ms_tensor_2d(e->codes_dev, MS_DTYPE_I32, T,
                                   nd->node->codes_width != NULL
                                       ? nd->node->codes_width(e->config) : 0);
    st = f->attn_batch_stage(cx, nd->attn.batch, plan, &nd->kv, err);
    if (st == MS_OK && f->attn_batch_plan != NULL)
        st = f->attn_batch_plan(cx, nd->attn.batch, &nd->kv, nd->facts.n_q_heads, &ap, err);
    if (st == MS_OK)
        st = f->copy_to_backend(cx, e->tokens_dev, e->tokens_host, (size_t)T * sizeof(int32_t),
                                err);
    if (st == MS_OK) /* a token's position is its slot in the row's frame */
        st = f->copy_to_backend(cx, e->pos_dev, plan->token_to_slot, (size_t)T * sizeof(int32_t),
                                err);
    if (st == MS_OK) {
        ms_md_forward_args args = eng_forward_args(e, &nd->facts);
        args.kv = &nd->kv;
        args.batch = nd->attn.batch;
        args.tokens = &tokens;
        args.positions = &pos;
        args.attn = ap;
        args.logits = &out;
        args.input = &input;
        args.frame_slot = frame_slot;
        args.codes = nd->node->codes_width != NULL ? &codes : NULL;
        st = nd->node->forward(&args, err);
    }
    if (st != MS_OK) {
        ms_step_runner_abandon(nd->runner, step, &ctx);
        return st;
    }
    return ms_step_runner_commit(nd->runner, step, &ctx, err);
}

/* [scratch] ms_engine_run_rows_pick and ms_engine_run_rows_codes_pick (codes NULL: none). */
static ms_status eng_rows_pick(ms_engine *e, const char *node, const char *step_name,
                               const ms_rid *rids, const int32_t *spans, int32_t n,
                               const float *rows, int64_t width, const int32_t *codes,
                               int64_t groups, const int32_t **picked, const float **hidden,
                               ms_error *err) {
    const float *logits;
    if (hidden != NULL)
        *hidden = NULL;
    if (picked == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "run rows %s.%s: no place for the picked ids",
                       node, step_name);
    *picked = NULL;
    if (rows == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "run rows %s.%s: no rows given", node,
                       step_name);
    const float *h = NULL;
    for (int32_t ni = 0; ni < e->n_nodes; ni++)
        if (strcmp(e->nodes[ni].node->name, node) == 0 && e->nodes[ni].scratch == NULL)
            return MS_FAIL(err, MS_ERR_UNSUPPORTED, "run rows %s.%s: the node is not on a "
                           "scratch (ms_engine_run_rows_pick picks from a scratch node's rows)",
                           node, step_name);
    MS_TRY(eng_run_input(e, node, step_name, rids, spans, n, rows, NULL, width, codes, groups,
                         &logits, &h, picked, err));
    if (hidden != NULL)
        *hidden = h;
    return MS_OK;
}

/* [scratch] see engine.h */
ms_status ms_engine_run_rows_pick(ms_engine *e, const char *node, const char *step_name,
                                  const ms_rid *rids, const int32_t *spans, int32_t n,
                                  const float *rows, int64_t width, const int32_t **picked,
                                  const float **hidden, ms_error *err) {
    return eng_rows_pick(e, node, step_name, rids, spans, n, rows, width, NULL, 0, picked,
                         hidden, err);
}

/* [scratch] see engine.h */
ms_status ms_engine_run_rows_codes_pick(ms_engine *e, const char *node, const char *step_name,
                                        const ms_rid *rids, const int32_t *spans, int32_t n,
                                        const float *rows, int64_t width, const int32_t *codes,
                                        int64_t groups, const int32_t **picked,
                                        const float **hidden, ms_error *err) {
    if (hidden != NULL)
        *hidden = NULL;
    if (picked != NULL)
        *picked = NULL;
    if (codes == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "run rows %s.%s: no codes given", node,
                       step_name);
    return eng_rows_pick(e, node, step_name, rids, spans, n, rows, width, codes, groups, picked,
                         hidden, err);
}
