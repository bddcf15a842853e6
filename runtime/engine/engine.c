/*
 * engine.c - the generic LLM engine (engine.h): backend, config, checkpoint, weights through the
 * descriptor's declarations, resources from a table of makers keyed by kind (through the step
 * runner), and the walk executor: each step the scheduler (walk.h) picks one step of the
 * node, the requests standing there become its rows, the model's generated step runner declares
 * the step, and admit -> plan -> forward -> (CFG mixing, sampling) -> commit runs it.
 *
 * Constraints kept:
 *   - everything a step needs is allocated at init for the worst case (max_seqs rows, max_tokens
 *     tokens): ms_engine_step allocates nothing (resources allocate nothing after admit);
 *   - a sequence never feeds a token at position max_context or beyond, so positions never
 *     wrap: the id sampled at position max_context - 1 is returned and the request finishes with
 *     MS_FINISH_CONTEXT;
 *   - one-line errors name the file (config.json, the shard) and the tensor or field.
 */
#include "engine_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <stdlib.h>

#include "attn_plan.h"
#include "backend.h"
#include "checkpoint.h"
#include "device.h"
#include "gguf_model.h"
#include "graph_exec.h"
#ifdef MS_HAVE_CUDA
#include "backend_cuda.h"
#include "device_cuda.h"
#endif
#include "cross_attn.h"
#include "kv_pool.h"
#include "kv_transfer_host.h"
#include "model_probe.h"
#include "page_arena.h"
#include "pd.h"
#include "positions.h"
#include "prefix_cache.h"
#include "rid_map.h"
#include "sample_res.h"
#include "scratch.h"
#include "walk.h"
#include "step_runner.h"
#include "tp.h"

/* ---- engine-side resources: attention staging and the sampler ---- */

/* eng_attn (engine_impl.h): the plan below stages it. */

static ms_status eng_attn_plan(void *self, int index, const ms_step *step, ms_step_ctx *ctx,
                               const void **out, ms_error *err) {
    eng_attn *a = self;
    const ms_kv_plan_set *set = ctx->plan_results[a->kv_index];
    /* the query plan: the one plan label besides a cross resource's context */
    const ms_kv_plan *qp = NULL;
    int32_t n_q = 0;
    for (int32_t p = 0; set != NULL && p < set->n_plans; p++)
        if (set->plans[p].plan_label != a->context_label) {
            qp = qp != NULL ? qp : &set->plans[p];
            n_q++;
        }
    if (n_q != 1)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                       "attention: step %s needs exactly one plan label (got %d)", step->name,
                       (int)n_q);
    const void *inner_out = NULL;
    MS_TRY(ms_attn_iface.plan(a->inner, index, step, ctx, &inner_out, err));
    const ms_attn_plan_set *ap = inner_out;
    a->entry = ms_attn_plan_find(ap, qp->plan_label);
    MS_ASSERT(a->entry != NULL);
    a->params = (ms_attn_params){.scale = a->scale, .window = a->window,
                                 .causal = a->entry->causal};
    /* staged and planned once per step: each layer's attention only launches */
    a->query_plan = qp;
    MS_TRY(ms_backend_attn_stage(a->be, a->batch, qp, a->kv, a->n_q_heads, &a->params, err));
    *out = a;
    return MS_OK;
}

static void eng_attn_free(void *self) { (void)self; /* owned by the engine */ }

static const ms_resource_i eng_attn_iface = {
    .kind = MS_RESOURCE_ATTN,
    .plan = eng_attn_plan,
    .free = eng_attn_free,
};


ms_engine_options ms_engine_options_default(void) {
    ms_engine_options o;
    memset(&o, 0, sizeof o);
    o.device = "cpu";
    o.max_seqs = 8;
    o.max_tokens = 2048;
    o.graphs = MS_GRAPHS_OFF;
    return o;
}

const char *ms_finish_reason_str(ms_finish_reason r) {
    static const char *const names[MS_FINISH_REASON_COUNT] = {"running", "length", "eos",
                                                              "context", "error"};
    return (r >= 0 && r < MS_FINISH_REASON_COUNT) ? names[r] : "?";
}

const ms_md_facts *ms_engine_facts(const ms_engine *e) { return &e->facts; }
const char *ms_engine_device(const ms_engine *e) { return e->be.iface.name; }
/* The page size of the first node with KV pages (a dense encoder node has none). */
static int32_t eng_page_size(const ms_engine *e) {
    for (int32_t i = 0; i < e->n_nodes; i++)
        if (!e->nodes[i].dense)
            return e->nodes[i].kv.page_size;
    return 0;
}

int32_t ms_engine_page_size(const ms_engine *e) { return eng_page_size(e); }

ms_status ms_engine_synchronize(ms_engine *e, ms_error *err) {
    return e->be.iface.synchronize(e->be.ctx, err);
}

size_t ms_engine_weight_bytes(const ms_engine *e) { return e->wslab_bytes; }

static int eng_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double eng_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

ms_status ms_engine_copy_bandwidth(ms_engine *e, size_t bytes, int32_t reps, double *gbps,
                                   ms_error *err) {
    if (bytes < ((size_t)1 << 20) || reps < 1)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "copy bandwidth: %zu bytes x %d copies (need >= 1 MiB, >= 1 copy)", bytes,
                       (int)reps);
    (void)e; /* only the CUDA build asks the backend */
#ifdef MS_HAVE_CUDA
    if (strcmp(e->be.iface.name, "cuda") == 0)
        return ms_backend_cuda_copy_bandwidth(&e->be, bytes, reps, gbps, err);
#endif
    char *a = ms_malloc(bytes), *b = ms_malloc(bytes);
    double *t = ms_calloc((size_t)reps, sizeof *t);
    if (a == NULL || b == NULL || t == NULL) {
        ms_free(a);
        ms_free(b);
        ms_free(t);
        return MS_FAIL(err, MS_ERR_OOM, "copy bandwidth: out of memory for 2 x %zu bytes", bytes);
    }
    memset(a, 1, bytes);
    memcpy(b, a, bytes); /* first touch of b outside the timing */
    for (int32_t i = 0; i < reps; i++) {
        a[(size_t)i % bytes] = (char)i; /* the copy cannot be elided */
        double t0 = eng_now_s();
        memcpy(b, a, bytes);
        t[i] = eng_now_s() - t0;
    }
    volatile char sink = b[(size_t)(reps - 1) % bytes];
    (void)sink;
    qsort(t, (size_t)reps, sizeof *t, eng_cmp_double);
    double s = t[reps / 2];
    *gbps = s > 0.0 ? 2.0 * (double)bytes / s / 1e9 : 0.0;
    ms_free(a);
    ms_free(b);
    ms_free(t);
    return MS_OK;
}
int32_t ms_engine_n_active(const ms_engine *e) { return e->n_active; }

int32_t ms_engine_stream_length(const ms_engine *e, ms_rid rid, ms_label label) {
    const eng_req *r = eng_find_req(e, rid, NULL);
    if (r == NULL)
        return -1;
    ms_md_walk_item it = ms_walk_item(e->desc, r->walk);
    int32_t node = it.node >= 0 ? it.node : 0;
    ms_kv_stream_info si;
    if (e->nodes[node].pool == NULL) /* [encoder] a dense node keeps no stream */
        return -1;
    if (ms_kv_pool_stream_info(e->nodes[node].pool, rid, label, &si) != MS_OK)
        return -1;
    return si.stored;
}

int32_t ms_engine_kv_pages_free(const ms_engine *e) {
    int32_t n = 0;
    for (int32_t i = 0; i < e->n_nodes; i++)
        if (e->nodes[i].arena != NULL) /* [scratch] a scratch node has no page arena */
            n += ms_page_arena_num_free(e->nodes[i].arena);
    if (e->pcache != NULL) /* [prefix] pages only the cache holds are evicted on demand */
        n += ms_prefix_cache_stats(e->pcache).unreferenced;
    return n;
}

/* Backend allocation with a name. */
static ms_status eng_alloc(ms_engine *e, size_t bytes, const char *name, void **out,
                           ms_error *err) {
    return e->be.iface.buffer_alloc(e->be.ctx, bytes == 0 ? 64 : bytes, name, out, err);
}

static void eng_bfree(ms_engine *e, void *p) {
    if (p != NULL && e->be.ctx != NULL)
        e->be.iface.buffer_free(e->be.ctx, p);
}

/* ---- loading: backend, config ---- */

/* True when device "auto" resolves to cuda: a CUDA build with a usable GPU. */
bool eng_cuda_usable(void) {
#ifdef MS_HAVE_CUDA
    return ms_backend_cuda_available();
#else
    return false;
#endif
}

/* Make the backend and the KV device named by opt.device ("auto": cuda when a GPU is usable,
 * else cpu), and pick the weight and KV storage dtypes that backend computes with. */
static ms_status eng_backend_init(ms_engine *e, ms_error *err) {
    const char *dev = e->opt.device == NULL ? "auto" : e->opt.device;
    if (strcmp(dev, "auto") == 0)
        dev = eng_cuda_usable() ? "cuda" : "cpu";
    const char *dt = e->opt.dtype == NULL ? "auto" : e->opt.dtype;
    bool bf16 = strcmp(dt, "bf16") == 0;
    if (!bf16 && strcmp(dt, "auto") != 0 && strcmp(dt, "f32") != 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "unknown dtype '%s' (expected auto, f32 or bf16)",
                       dt);
    if (strcmp(dev, "cpu") == 0) {
        ms_backend_cpu_options co = {.n_threads = e->opt.n_threads};
        e->wdtype = bf16 ? MS_DTYPE_BF16 : MS_DTYPE_F32;
        e->kvdtype = e->wdtype;
        MS_TRY(ms_backend_cpu_init(&e->be, &co, err));
        return ms_device_host_init(0, &e->dev, err);
    }
    if (strcmp(dev, "cuda") == 0) {
        if (strcmp(dt, "f32") == 0)
            return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                           "dtype 'f32' on device 'cuda': the CUDA backend keeps weights and KV "
                           "in bf16 (use --dtype bf16 or auto)");
#ifdef MS_HAVE_CUDA
        e->wdtype = MS_DTYPE_BF16;
        e->kvdtype = MS_DTYPE_BF16;
        /* [tp] rank r on device r */
        ms_backend_cuda_options cuo = {
            .device = e->opt.tp_member != NULL ? e->opt.tp_member->device : 0};
        ms_status st = ms_device_cuda_init(cuo.device, &e->dev, err);
        if (st != MS_OK) {
            ms_error_prefix(err, "device 'cuda': ");
            return st;
        }
        return ms_backend_cuda_init(&e->be, &cuo, err);
#else
        return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                       "device 'cuda': this binary was built without CUDA; use --device cpu");
#endif
    }
    return MS_FAIL(err, MS_ERR_INVALID_ARG, "unknown device '%s' (expected auto, cpu or cuda)",
                   dev);
}

/* The model path and its config through the one probe every verb uses (model_probe.h); the
 * engine keeps the config and adds the eos / bos ids. */
static ms_status eng_facts_init(ms_engine *e, ms_error *err) {
    ms_model_probe p;
    MS_TRY(ms_model_probe_init(&p, e->desc, e->opt.model_path, err));
    e->hf = ms_model_probe_take_hf(&p);
    e->config = ms_model_probe_take_config(&p);
    e->facts = p.facts;
    ms_model_probe_free(&p);
    int64_t eos[MS_MD_MAX_EOS];
    size_t n_eos = 0;
    MS_TRY(ms_hf_config_get_eos_ids(e->hf, eos, MS_MD_MAX_EOS, &n_eos, err));
    e->facts.n_eos = 0;
    for (size_t i = 0; i < n_eos; i++)
        if (eos[i] < e->facts.vocab)
            e->facts.eos_ids[e->facts.n_eos++] = (int32_t)eos[i];
    int64_t bos = -1;
    MS_TRY(ms_hf_config_get_int_or(e->hf, "bos_token_id", -1, &bos, err));
    e->facts.bos_id = (bos >= 0 && bos < e->facts.vocab) ? (int32_t)bos : -1;
    return MS_OK;
}

/* ---- loading: weights ---- */

static ms_dtype eng_st_dtype(ms_st_dtype d) {
    switch (d) {
    case MS_ST_DTYPE_BF16: return MS_DTYPE_BF16;
    case MS_ST_DTYPE_F16: return MS_DTYPE_F16;
    default: return MS_DTYPE_F32;
    }
}

/* Instances of weight entry w: its layer group's count, 1 for a global entry. */
static int32_t eng_instances(const ms_engine *e, int32_t w) {
    if (!e->desc->weights[w].per_layer)
        return 1;
    return e->desc->weight_layers != NULL ? e->desc->weight_layers(e->config, w)
                                          : e->facts.n_layers;
}

/* [tp] The shape weight w is stored with on this engine (tp.h: its rank's part). */
static void eng_tp_shape(const ms_engine *e, int32_t w, int64_t *shape) {
    if (e->tps != NULL)
        ms_tp_local_shape(e->tps, w, shape);
    else
        e->desc->weight_shape(e->config, w, shape);
}

/* [tp] The host tensor loaded into weight w of `shape`: the checkpoint tensor, or this rank's
 * slice of it (a view into the mmap: only the slice is read). */
static ms_tensor eng_tp_source(const ms_engine *e, int32_t w, const ms_st_tensor *t,
                               const int64_t *shape) {
    if (e->tps != NULL)
        return ms_tp_source(e->tps, w, t->data, eng_st_dtype(t->dtype));
    return ms_tensor_make((void *)t->data, eng_st_dtype(t->dtype), e->desc->weights[w].rank,
                          shape);
}

/* The checkpoint tensor of (entry w, layer), trying its names in order; NULL when absent. */
static ms_status eng_find(ms_engine *e, int32_t w, int32_t layer, const ms_st_tensor **out,
                          char *name0, size_t cap, ms_error *err) {
    const ms_md_weight *d = &e->desc->weights[w];
    *out = NULL;
    for (int k = 0; k < MS_MD_MAX_NAMES && d->names[k] != NULL; k++) {
        char name[512];
        MS_TRY(ms_md_expand_name(d->names[k], layer, name, sizeof name, err));
        if (k == 0)
            snprintf(name0, cap, "%s", name);
        const ms_st_tensor *t = ms_ckpt_find_tensor(e->ck, name);
        if (t != NULL) {
            *out = t;
            snprintf(name0, cap, "%s", name);
            return MS_OK;
        }
    }
    return MS_OK;
}

/* Validate the tensor found for (w, layer) against its declared shape. */
static ms_status eng_expect(ms_engine *e, int32_t w, const char *name, ms_error *err) {
    const ms_md_weight *d = &e->desc->weights[w];
    int64_t shape[MS_TENSOR_MAX_DIMS] = {0};
    if (e->tps != NULL) /* [tp] the checkpoint holds the whole tensor */
        ms_tp_full_shape(e->tps, w, shape);
    else
        e->desc->weight_shape(e->config, w, shape);
    return ms_ckpt_expect_tensor(e->ck, name, MS_ST_DTYPES_FLOAT, d->rank, shape, NULL, err);
}

/*
 * Quantized weights (GGUF): the block dtype in which checkpoint tensor `name` (a rank-2 weight)
 * stays on this backend, or MS_DTYPE_COUNT to dequantize it to the weight dtype as usual. Only
 * when the checkpoint is a .gguf storing it in a block type the backend takes (weight_dtype_ok:
 * CUDA keeps Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K). The same answer in both weight passes.
 */
static ms_dtype eng_quant_dtype(const ms_engine *e, const char *name, int32_t rank) {
    const ms_gguf_model *gm = ms_ckpt_get_gguf_model(e->ck);
    /* [tp] quantized blocks are not split across ranks: a tensor-parallel rank loads bf16 */
    if (rank != 2 || gm == NULL || e->be.iface.weight_dtype_ok == NULL || e->tps != NULL)
        return MS_DTYPE_COUNT;
    ms_gguf_raw_info ri;
    if (ms_gguf_model_raw_info(gm, name, &ri, NULL) != MS_OK)
        return MS_DTYPE_COUNT;
    ms_dtype dt = ms_dtype_from_ggml(ri.type);
    return dt != MS_DTYPE_COUNT && e->be.iface.weight_dtype_ok(e->be.ctx, dt) ? dt : MS_DTYPE_COUNT;
}

/* Load dst (block dtype, [rows, cols]) from the GGUF blocks of parts names[n] (rows[n] each, in
 * row order: a FUSED entry's parts), staged in one host buffer. */
static ms_status eng_load_quant(ms_engine *e, const ms_tensor *dst, const char *const *names,
                                const int64_t *rows, int32_t n, ms_error *err) {
    const ms_gguf_model *gm = ms_ckpt_get_gguf_model(e->ck);
    size_t rb = ms_dtype_row_bytes(dst->dtype, dst->shape[1]), bytes = rb * (size_t)dst->shape[0];
    uint8_t *buf = ms_malloc(bytes ? bytes : 1);
    if (buf == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "out of memory staging %zu bytes of quantized weights (%s)",
                       bytes, names[0]);
    ms_status st = MS_OK;
    size_t at = 0;
    for (int32_t p = 0; p < n && st == MS_OK; p++) {
        st = ms_gguf_model_copy_raw_rows(gm, names[p], 0, rows[p], buf + at, bytes - at, err);
        at += (size_t)rows[p] * rb;
    }
    if (st == MS_OK) {
        ms_tensor src = ms_tensor_make(buf, dst->dtype, 2, dst->shape);
        st = e->be.iface.tensor_load(e->be.ctx, dst, &src, err);
    }
    ms_free(buf);
    return st;
}

/* Resolve (and with `load`, load) every weight instance. Without `load` it validates every
 * tensor and returns the slab bytes in *bytes. */
static ms_status eng_weights_pass(ms_engine *e, bool load, size_t *bytes, ms_error *err) {
    const ms_model_desc *d = e->desc;
    const ms_backend_i *f = &e->be.iface;
    const size_t es = ms_dtype_size(e->wdtype);
    size_t off = 0;
    for (int32_t w = 0; w < d->n_weights; w++) {
        const ms_md_weight *wd = &d->weights[w];
        int32_t n_inst = eng_instances(e, w);
        int64_t shape[MS_TENSOR_MAX_DIMS] = {1, 1, 1, 1};
        eng_tp_shape(e, w, shape); /* [tp] this rank's part */
        size_t elems = 1;
        for (int32_t r = 0; r < wd->rank; r++)
            elems *= (size_t)shape[r];
        for (int32_t l = 0; l < n_inst; l++) {
            ms_tensor *dst = &e->weights[e->woff[w] + l];
            char name[512] = "";
            if (wd->kind == MS_MD_WEIGHT_PART)
                continue; /* loaded with its FUSED entry */
            if (wd->kind == MS_MD_WEIGHT_TENSOR) {
                bool tied = wd->tie >= 0 && d->weight_tied(e->config, w);
                const ms_st_tensor *t = NULL;
                if (!tied)
                    MS_TRY(eng_find(e, w, l, &t, name, sizeof name, err));
                if (t == NULL && wd->tie >= 0 && wd->tie_if_missing)
                    tied = true;
                if (tied) {
                    /* tie: use the other entry's tensor (declared earlier in the table) */
                    MS_ASSERT(wd->tie < w);
                    if (load)
                        *dst = e->weights[e->woff[wd->tie] + (wd->per_layer ? l : 0)];
                    if (load && e->tps != NULL) { /* [tp] this rank's vocabulary rows */
                        *dst = ms_tp_tied_view(e->tps, w, dst);
                        MS_TRY(ms_tp_note_weight(e->tps, w, dst, err));
                    }
                    continue;
                }
                if (t == NULL && wd->optional) {
                    if (load)
                        memset(dst, 0, sizeof *dst);
                    continue;
                }
                /* t is NULL for a missing tensor: eng_expect names it below */
                const ms_dtype qdt =
                    t != NULL ? eng_quant_dtype(e, t->name, wd->rank) : MS_DTYPE_COUNT;
                if (!load) {
                    MS_TRY(eng_expect(e, w, name, err)); /* names the missing/mismatching one */
                    size_t wb = qdt != MS_DTYPE_COUNT
                                    ? ms_dtype_row_bytes(qdt, shape[1]) * (size_t)shape[0]
                                    : elems * es;
                    off += (wb + 63) / 64 * 64;
                    continue;
                }
                if (qdt != MS_DTYPE_COUNT) {
                    /* kept quantized (backend_cuda_quant.h: planar rows of ggml blocks) */
                    *dst = ms_tensor_make((char *)e->wslab + off, qdt, 2, shape);
                    const char *nm = t->name;
                    MS_TRY(eng_load_quant(e, dst, &nm, &shape[0], 1, err));
                    off += (ms_dtype_row_bytes(qdt, shape[1]) * (size_t)shape[0] + 63) / 64 * 64;
                    continue;
                }
                *dst = ms_tensor_make((char *)e->wslab + off, e->wdtype, wd->rank, shape);
                ms_tensor src = eng_tp_source(e, w, t, shape); /* [tp] its slice */
                MS_TRY(f->tensor_load(e->be.ctx, dst, &src, err));
                if (e->tps != NULL)
                    MS_TRY(ms_tp_note_weight(e->tps, w, dst, err));
                off += (elems * es + 63) / 64 * 64;
                continue;
            }
            /* FUSED: rows of its parts in order */
            const ms_st_tensor *pt[MS_MD_MAX_PARTS] = {NULL};
            char pname[MS_MD_MAX_PARTS][512];
            int32_t n_found = 0;
            for (int32_t p = 0; p < wd->n_parts; p++) {
                int32_t pw = wd->parts[p];
                MS_TRY(eng_find(e, pw, l, &pt[p], pname[p], sizeof pname[p], err));
                if (pt[p] != NULL)
                    n_found++;
                else if (!d->weights[pw].optional && !load)
                    MS_TRY(eng_expect(e, pw, pname[p], err)); /* "not found" naming it */
            }
            if (n_found == 0 && wd->optional) {
                if (load)
                    memset(dst, 0, sizeof *dst);
                continue;
            }
            /* all parts in one block dtype: the fused rows stay quantized (rows of blocks concatenate) */
            ms_dtype qdt = n_found == wd->n_parts && wd->rank == 2 ? eng_quant_dtype(e, pt[0]->name, 2)
                                                                   : MS_DTYPE_COUNT;
            for (int32_t p = 1; p < wd->n_parts && qdt != MS_DTYPE_COUNT; p++)
                if (eng_quant_dtype(e, pt[p]->name, 2) != qdt)
                    qdt = MS_DTYPE_COUNT;
            const size_t fused_bytes = qdt != MS_DTYPE_COUNT
                                           ? ms_dtype_row_bytes(qdt, shape[1]) * (size_t)shape[0]
                                           : elems * es;
            if (!load) {
                for (int32_t p = 0; p < wd->n_parts; p++)
                    if (pt[p] != NULL)
                        MS_TRY(eng_expect(e, wd->parts[p], pname[p], err));
                off += (fused_bytes + 63) / 64 * 64;
                continue;
            }
            if (qdt != MS_DTYPE_COUNT) {
                *dst = ms_tensor_make((char *)e->wslab + off, qdt, 2, shape);
                const char *names[MS_MD_MAX_PARTS];
                int64_t prow[MS_MD_MAX_PARTS];
                for (int32_t p = 0; p < wd->n_parts; p++) {
                    int64_t pshape[MS_TENSOR_MAX_DIMS] = {1, 1, 1, 1};
                    d->weight_shape(e->config, wd->parts[p], pshape);
                    names[p] = pt[p]->name;
                    prow[p] = pshape[0];
                }
                MS_TRY(eng_load_quant(e, dst, names, prow, wd->n_parts, err));
                off += (fused_bytes + 63) / 64 * 64;
                continue;
            }
            *dst = ms_tensor_make((char *)e->wslab + off, e->wdtype, wd->rank, shape);
            if (n_found < wd->n_parts)
                MS_TRY(f->buffer_fill(e->be.ctx, dst->data, 0, elems * es, err));
            int64_t row = 0;
            for (int32_t p = 0; p < wd->n_parts; p++) {
                int64_t pshape[MS_TENSOR_MAX_DIMS] = {1, 1, 1, 1};
                eng_tp_shape(e, wd->parts[p], pshape);
                if (pt[p] != NULL) {
                    ms_tensor part = ms_tensor_slice(dst, 0, row, pshape[0]);
                    ms_tensor src = eng_tp_source(e, wd->parts[p], pt[p], pshape);
                    MS_TRY(f->tensor_load(e->be.ctx, &part, &src, err));
                }
                row += pshape[0];
            }
            MS_ASSERT(row == shape[0]);
            off += (elems * es + 63) / 64 * 64;
        }
    }
    if (bytes != NULL)
        *bytes = off;
    return MS_OK;
}

/* Index of the checkpoint tensor named `name` (tensors are in ascending strcmp order), or -1. */
static ptrdiff_t eng_tensor_index(const ms_ckpt *ck, const char *name) {
    size_t lo = 0, hi = ms_ckpt_n_tensors(ck);
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(ms_ckpt_tensor_at(ck, mid)->name, name);
        if (c == 0)
            return (ptrdiff_t)mid;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

/*
 * Every checkpoint tensor must be one the model declares: a checkpoint of another family (Qwen3's
 * q_norm / k_norm, a vision tower, attention biases the model lacks) would otherwise run as this
 * model and print plausible but wrong ids with exit status 0. MS_ERR_FORMAT names the first
 * unclaimed tensor, its file and how many there are.
 */
static ms_status eng_check_unclaimed(ms_engine *e, ms_error *err) {
    const ms_model_desc *d = e->desc;
    size_t n = ms_ckpt_n_tensors(e->ck);
    bool *claimed = ms_calloc(n > 0 ? n : 1, sizeof *claimed);
    if (claimed == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "out of memory checking the checkpoint's tensors");
    ms_status st = MS_OK;
    for (int32_t w = 0; w < d->n_weights && st == MS_OK; w++) {
        const ms_md_weight *wd = &d->weights[w];
        int32_t n_inst = eng_instances(e, w);
        for (int32_t l = 0; l < n_inst && st == MS_OK; l++)
            for (int k = 0; k < MS_MD_MAX_NAMES && wd->names[k] != NULL && st == MS_OK; k++) {
                char name[512];
                st = ms_md_expand_name(wd->names[k], l, name, sizeof name, err);
                ptrdiff_t i = st == MS_OK ? eng_tensor_index(e->ck, name) : -1;
                if (i >= 0)
                    claimed[i] = true;
            }
    }
    size_t n_extra = 0, first = 0;
    for (size_t i = 0; i < n && st == MS_OK; i++)
        if (!claimed[i] && !ms_md_tensor_ignored(d, ms_ckpt_tensor_at(e->ck, i)->name) &&
            n_extra++ == 0)
            first = i;
    if (st == MS_OK && n_extra > 0) {
        const ms_st_tensor *t = ms_ckpt_tensor_at(e->ck, first);
        st = MS_FAIL(err, MS_ERR_FORMAT,
                     "%s: tensor '%s' is not a weight of model '%s' (%zu such tensor%s): the "
                     "checkpoint is of another model family or variant",
                     t->file_path, t->name, d->name, n_extra, n_extra == 1 ? "" : "s");
    }
    ms_free(claimed);
    return st;
}

static ms_status eng_weights_init(ms_engine *e, ms_error *err) {
    const ms_model_desc *d = e->desc;
    e->woff = ms_calloc((size_t)d->n_weights, sizeof *e->woff);
    if (e->woff == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "out of memory for the weight table");
    int32_t n = 0;
    for (int32_t w = 0; w < d->n_weights; w++) {
        e->woff[w] = n;
        n += eng_instances(e, w);
    }
    e->weights = ms_calloc((size_t)n, sizeof *e->weights);
    if (e->weights == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "out of memory for the weight table");
    size_t bytes = 0;
    MS_TRY(eng_weights_pass(e, false, &bytes, err));
    MS_TRY(eng_check_unclaimed(e, err));
    MS_TRY(eng_alloc(e, bytes, "weights", &e->wslab, err));
    e->wslab_bytes = bytes;
    return eng_weights_pass(e, true, NULL, err);
}

/* ---- loading: KV, resources, step buffers ---- */

/* [graphs] whether the engine makes the captured path (graph_exec.h modes): models of one node
 * only (a walk across nodes, e.g. Whisper's encoder then decoder, runs eager). */
static bool eng_graphs_wanted(const ms_engine *e) {
    if (e->n_nodes != 1 || e->nodes[0].dense) /* [encoder] a dense node runs eager */
        return false;
    if (e->opt.graphs == MS_GRAPHS_PADDED)
        return true;
    return e->opt.graphs == MS_GRAPHS_AUTO && e->be.iface.graph_capture_begin != NULL;
}

/* [graphs] the largest prefill token bucket kept: max_tokens, and no more than a stream holds:
 * dummy 0 carries a bucket's token tail as one stream (graph_exec.h), which must stay within
 * what a request may be (positions inside the context); a batch of several requests above the
 * stream length runs eager */
static int32_t eng_graph_max_tokens(const ms_engine *e, const eng_node *nd) {
    int32_t seq_len = nd->facts.max_context;
    if (e->opt.max_seq_len > 0 && e->opt.max_seq_len < seq_len)
        seq_len = e->opt.max_seq_len;
    return MS_MIN(e->max_tokens, seq_len);
}

/* [graphs] whether the captured path pre-plans step N+1 while step N replays (graph_exec.h): not
 * with what touches the runner's streams between steps on its own (prefix sealing, the host KV
 * tier, tensor parallelism) */
static bool eng_preplan_wanted(const ms_engine *e) {
    return eng_graphs_wanted(e) && !e->opt.no_preplan && !e->opt.prefix_cache &&
           e->opt.host_kv_pages == 0 && e->opt.tp <= 1 && e->opt.tp_member == NULL;
}

/* The page arena and the KV pool over it (node nd's KV resource). */
static ms_status eng_resources_init(ms_engine *e, eng_node *nd, ms_error *err) {
    if (eng_scratch_node(nd))
        return MS_OK; /* [scratch] no page arena: eng_scratch_init */
    const ms_md_facts *fa = &nd->facts;
    const int32_t ps = e->opt.page_size > 0 ? e->opt.page_size : fa->page_size;
    int32_t seq_len = fa->max_context;
    if (e->opt.max_seq_len > 0 && e->opt.max_seq_len < seq_len)
        seq_len = e->opt.max_seq_len;
    /* a cross-attention context stream is written in one step: up to max_tokens rows */
    for (int32_t r = 0; r < nd->node->n_resources; r++)
        if (nd->node->resources[r].kind == MS_RESOURCE_CROSS)
            seq_len = MS_MAX(seq_len, e->max_tokens);
    const int32_t per_seq = MS_CEIL_DIV(seq_len, ps);
    int32_t pages = e->opt.kv_pages;
    if (pages == 0 && e->opt.gpu_memory_fraction > 0)
        MS_TRY(eng_kv_pages_from_fraction(e, nd, ps, &pages, err));
    if (e->tps != NULL && e->opt.gpu_memory_fraction > 0) /* [tp] the fullest GPU sizes all */
        MS_TRY(ms_tp_min_i32(e->tps, &pages, err));
    if (pages == 0) {
        if ((int64_t)per_seq * e->max_seqs + 1 > INT32_MAX)
            return MS_FAIL(err, MS_ERR_LIMIT, "kv_pages: %d sequences of %d pages overflow",
                           (int)e->max_seqs, (int)per_seq);
        pages = per_seq * e->max_seqs + 1;
    }
    /* [graphs] the dummy rows' pages come on top of what real requests were promised */
    if (eng_graphs_wanted(e))
        pages += ms_graph_exec_dummy_pages(nd->node, e->max_seqs, eng_graph_max_tokens(e, nd),
                                           ps, eng_preplan_wanted(e));
    ms_page_arena_config ac = {
        .n_layers = fa->n_layers,
        .n_pages = pages,
        .page_size = ps,
        .n_kv_heads = fa->n_kv_heads,
        .head_dim = fa->head_dim,
        .elem_bytes = (int32_t)ms_dtype_size(e->kvdtype),
        .layout = MS_KV_LAYOUT_NHD,
        .name = nd->node->name,
    };
    MS_TRY(ms_page_arena_init(&ac, e->dev, &nd->arena, err));
    /* a stream holds at most its context in pages (+1: a view need not start page-aligned) */
    MS_TRY(eng_host_arena_init(e, nd, &ac, err));
    ms_kv_pool_config pc = {.arena = nd->arena, .host_arena = nd->host_arena,
                            .window = fa->window, .source = e,
                            .max_pages_per_stream = per_seq + 1};
    nd->pd_host.arena = nd->arena; /* [pd] */
    pc.transfer = e->opt.kv_transfer != NULL ? e->opt.kv_transfer : ms_kv_host_transfer_iface();
    pc.transfer_ctx = e->opt.kv_transfer != NULL ? e->opt.kv_transfer_ctx : &nd->pd_host;
    MS_TRY(ms_kv_pool_init(&pc, &nd->pool, err));
    nd->kv = (ms_paged_kv){
        .data = ms_page_arena_data(nd->arena),
        .dtype = e->kvdtype,
        .n_layers = fa->n_layers,
        .n_pages = pages,
        .page_size = ps,
        .n_kv_heads = fa->n_kv_heads,
        .head_dim = fa->head_dim,
    };
    nd->pages_free_initial = ms_page_arena_num_free(nd->arena);

    nd->kv_pages = pages;
    nd->batch_pages = (int32_t)MS_MAX(
        (int64_t)pages, MS_MIN((int64_t)e->max_seqs * (per_seq + 1), (int64_t)e->max_seqs * pages));
    if (nd->batch_pages > (1 << 28))
        nd->batch_pages = MS_MAX(pages, 1 << 28); /* an int32 buffer's bound; shared reads cap */
    return MS_OK;
}

/* ---- resources: one interface maker per kind ---- */

/* Fill spec (key, kind, deps already set) with the engine's resource of its kind. */
typedef ms_status (*eng_res_make_fn)(ms_engine *e, eng_node *nd, int32_t index,
                                     ms_resource_spec *spec, ms_error *err);

static ms_status eng_make_kv(ms_engine *e, eng_node *nd, int32_t index,
                             ms_resource_spec *spec, ms_error *err) {
    (void)e;
    (void)index;
    (void)err;
    spec->instance = nd->pool;
    spec->iface = ms_kv_pool_resource_i();
    return MS_OK;
}

static ms_status eng_make_pos(ms_engine *e, eng_node *nd, int32_t index,
                              ms_resource_spec *spec, ms_error *err) {
    (void)index;
    /* M-RoPE (facts.rope sections, Qwen2-VL): one position stream per section (t, h, w), ids
       from the request on a `pos explicit` step, else one id repeated on every axis; plain RoPE:
       one axis, explicit ids of a `pos explicit` step pass through when the request gives them
       (ms_md_row.position_ids) */
    const int32_t ns = nd->facts.rope.n_sections;
    if (ns > MS_POS_MAX_AXES)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                       "model %s: %d M-RoPE sections, the positions resource takes at most %d "
                       "position streams", e->desc->name, (int)ns, MS_POS_MAX_AXES);
    const int32_t axes = ns > 1 ? ns : 1;
    nd->pos_cfg = (ms_positions_config){.scheme = axes > 1 ? MS_POS_EXPLICIT : MS_POS_SEQUENTIAL,
                                       .n_axes = axes,
                                       .max_tokens = e->max_tokens,
                                       .kv_key = nd->node->resources[nd->idx[MS_RESOURCE_KV]].key};
    spec->build = ms_positions_build;
    spec->config = &nd->pos_cfg;
    return MS_OK;
}

static ms_status eng_make_attn(ms_engine *e, eng_node *nd, int32_t index,
                               ms_resource_spec *spec, ms_error *err) {
    (void)index;
    int kv = nd->idx[MS_RESOURCE_KV];
    ms_attn_limits lim = {.max_seqs = e->max_seqs, .max_tokens = e->max_tokens,
                          .max_pages = nd->batch_pages};
    MS_TRY(e->be.iface.attn_batch_init(e->be.ctx, &lim, &nd->attn.batch, err));
    nd->attn.be = &e->be;
    nd->attn.kv = &nd->kv;
    nd->attn.n_q_heads = nd->facts.n_q_heads;
    nd->attn.scale = nd->facts.attn_scale > 0.0f ? nd->facts.attn_scale
                                               : 1.0f / sqrtf((float)nd->facts.head_dim);
    nd->attn.window = nd->facts.window;
    nd->attn.kv_index = kv;
    ms_attn_config atc = {.kv_key = nd->node->resources[kv].key, .max_rows = e->max_seqs,
                          .max_pages = nd->batch_pages};
    MS_TRY(ms_attn_init(&nd->attn.inner, &atc, kv, err));
    spec->instance = &nd->attn;
    spec->iface = &eng_attn_iface;
    return MS_OK;
}

static ms_status eng_make_sampler(ms_engine *e, eng_node *nd, int32_t index,
                                  ms_resource_spec *spec, ms_error *err) {
    (void)index;
    MS_TRY(ms_sample_res_init(&nd->sampler, e->max_seqs, err));
    spec->instance = nd->sampler;
    spec->iface = ms_sample_res_iface();
    return MS_OK;
}

static ms_status eng_make_cross(ms_engine *e, eng_node *nd, int32_t index,
                               ms_resource_spec *spec, ms_error *err) {
    (void)index;
    /* the context stream is a label of the node's KV pool, which also gives the query rows */
    const char *kv_key = nd->node->resources[nd->idx[MS_RESOURCE_KV]].key;
    nd->cross_cfg = (ms_cross_config){.context_kv_key = kv_key, .query_kv_key = kv_key,
                                      .context_label = nd->context_label,
                                      .max_rows = e->max_seqs, .max_pages = nd->kv_pages};
    ms_attn_limits lim = {.max_seqs = e->max_seqs, .max_tokens = e->max_tokens,
                          .max_pages = nd->kv_pages};
    MS_TRY(e->be.iface.attn_batch_init(e->be.ctx, &lim, &nd->ctx_batch, err));
    MS_TRY(e->be.iface.attn_batch_init(e->be.ctx, &lim, &nd->cross_batch, err));
    nd->zeros = ms_calloc((size_t)e->max_seqs, sizeof *nd->zeros);
    if (nd->zeros == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "out of memory for the cross views");
    nd->cross_params = (ms_attn_params){
        .scale = nd->facts.attn_scale > 0.0f ? nd->facts.attn_scale
                                              : 1.0f / sqrtf((float)nd->facts.head_dim),
        .window = 0,
        .causal = false};
    spec->build = ms_cross_build;
    spec->config = &nd->cross_cfg;
    return MS_OK;
}

/* The label a node's cross resource reads as its context (its `context = <label>` argument),
 * -1 without a cross resource; MS_ERR_FORMAT when the label is not one of the node's. */
static ms_status eng_context_label(const ms_engine *e, const ms_md_node *d, ms_label *out,
                                   ms_error *err) {
    *out = -1;
    for (int32_t i = 0; i < d->n_resources; i++) {
        const ms_md_resource *r = &d->resources[i];
        if (r->kind != MS_RESOURCE_CROSS)
            continue;
        for (int32_t a = 0; a < r->n_args; a++)
            if (strcmp(r->args[a].key, "context") == 0)
                for (int32_t l = 0; l < d->n_labels; l++)
                    if (strcmp(d->labels[l], r->args[a].text) == 0)
                        *out = l;
        if (*out < 0)
            return MS_FAIL(err, MS_ERR_FORMAT,
                           "model %s: node %s: cross resource '%s' names no context label of "
                           "the node", e->desc->name, d->name, r->key);
    }
    return MS_OK;
}

/* The resource interfaces the engine runs, by kind (NULL: not run by the engine). Kinds are
 * made in the descriptor's dependency order, so the KV pool exists before what reads it. */
static const eng_res_make_fn eng_res_makers[MS_RESOURCE_KIND_COUNT] = {
    [MS_RESOURCE_KV] = eng_make_kv,
    [MS_RESOURCE_POS] = eng_make_pos,
    [MS_RESOURCE_ATTN] = eng_make_attn,
    [MS_RESOURCE_SAMPLER] = eng_make_sampler,
    [MS_RESOURCE_CROSS] = eng_make_cross,
};

static ms_status eng_runner_init(ms_engine *e, eng_node *nd, ms_error *err) {
    const ms_md_node *d = nd->node;
    if (eng_scratch_node(nd))
        return eng_scratch_init(e, nd, err); /* [scratch] */
    if (d->n_resources < 1 || d->n_resources > MS_MAX_RESOURCES)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "model %s: %d resources", e->desc->name,
                       (int)d->n_resources);
    for (int k = 0; k < MS_RESOURCE_KIND_COUNT; k++)
        nd->idx[k] = -1;
    for (int32_t i = 0; i < d->n_resources; i++)
        nd->idx[d->resources[i].kind] = i; /* ms_md_check_desc: one of each kind */
    /* a node returning hidden states (an encoder) samples nothing */
    const bool sampled = d->hidden_width == NULL;
    if (nd->idx[MS_RESOURCE_KV] < 0 || nd->idx[MS_RESOURCE_POS] < 0 ||
        nd->idx[MS_RESOURCE_ATTN] < 0 || (sampled && nd->idx[MS_RESOURCE_SAMPLER] < 0))
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "model %s: node %s: the LLM engine needs kv, positions, attention and "
                       "sampler resources", e->desc->name, d->name);
    MS_TRY(eng_context_label(e, d, &nd->context_label, err));
    nd->attn.context_label = nd->context_label;
    ms_resource_spec specs[MS_MAX_RESOURCES];
    memset(specs, 0, sizeof specs);
    for (int32_t i = 0; i < d->n_resources; i++) {
        const ms_md_resource *r = &d->resources[i];
        ms_resource_spec *s = &specs[i];
        s->key = r->key;
        s->kind = r->kind;
        s->deps = r->deps;
        s->n_deps = r->n_deps;
        eng_res_make_fn make = eng_res_makers[r->kind];
        if (make == NULL)
            return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                           "model %s: node %s: resource '%s' of kind %s is not supported by the "
                           "LLM engine", e->desc->name, d->name, r->key,
                           ms_resource_kind_str(r->kind));
        MS_TRY(make(e, nd, i, s, err));
    }
    return ms_step_runner_init(&nd->runner, specs, d->n_resources, err);
}

/* ---- init: kernels, step buffers, the engine; free ([encoder] nodes: engine_dense.c) ---- */

/* The model's CUDA kernel instances at this checkpoint's shape, loaded once (backend.h
 * kernels_load): no step compiles or looks up an instance it was not built with. Backends
 * without the entry (CPU) and descriptors listing no kernels load nothing here. */
static ms_status eng_kernels_init(ms_engine *e, ms_error *err) {
    if (e->be.iface.kernels_load == NULL || e->desc->n_kernels == 0)
        return MS_OK;
    ms_kernel_spec specs[MS_MD_MAX_KERNEL_SPECS];
    int n = 0;
    MS_TRY(ms_md_kernel_specs(e->desc, &e->facts, eng_page_size(e), specs,
                              MS_MD_MAX_KERNEL_SPECS, &n, err));
    /* [scratch] a node of another shape (a code predictor: its heads, its frame as the page
       size) adds its own instances of the same stems */
    for (int32_t i = 1; i < e->n_nodes; i++) {
        const eng_node *nd = &e->nodes[i];
        if (nd->scratch == NULL)
            continue;
        ms_kernel_spec more[MS_MD_MAX_KERNEL_SPECS];
        int m = 0;
        MS_TRY(ms_md_kernel_specs(e->desc, &nd->facts, nd->kv.page_size, more,
                                  MS_MD_MAX_KERNEL_SPECS, &m, err));
        for (int k = 0; k < m; k++) {
            bool seen = false;
            char a[256], b[256];
            MS_TRY(ms_kernel_spec_uri(&more[k], 0, a, sizeof a, err));
            for (int j = 0; j < n && !seen; j++) {
                MS_TRY(ms_kernel_spec_uri(&specs[j], 0, b, sizeof b, err));
                seen = strcmp(a, b) == 0;
            }
            if (seen)
                continue;
            if (n == MS_MD_MAX_KERNEL_SPECS)
                return MS_FAIL(err, MS_ERR_LIMIT, "model %s: more than %d kernel instances",
                               e->desc->name, MS_MD_MAX_KERNEL_SPECS);
            specs[n++] = more[k];
        }
    }
    return e->be.iface.kernels_load(e->be.ctx, specs, n, err);
}

static ms_status eng_buffers_init(ms_engine *e, ms_error *err) {
    const ms_md_facts *fa = &e->facts;
    e->max_out = e->max_seqs;
    int32_t n_axes = 1;
    for (int32_t i = 0; i < e->n_nodes; i++) {
        const ms_md_node *nd = e->nodes[i].node;
        for (int32_t k = 0; k < nd->n_steps; k++)
            if (nd->steps[k].all_logits)
                e->max_out = MS_MAX(e->max_seqs, e->max_tokens);
        n_axes = MS_MAX(n_axes, e->nodes[i].pos_cfg.n_axes);
    }
    /* [prompt logprobs] every prompt row of such a request's prefill returns its logits */
    e->plp_rows = MS_MIN(MS_MAX(e->opt.prompt_logprobs_rows, 0), e->max_tokens);
    e->max_out = MS_MAX(e->max_out, e->max_seqs + e->plp_rows);
    /* [encoder] a dense node's step holds its own windows' rows (eng_dense_init) */
    e->buf_tokens = e->max_tokens;
    for (int32_t i = 0; i < e->n_nodes; i++)
        if (e->nodes[i].dense)
            e->buf_tokens = MS_MAX(e->buf_tokens, e->nodes[i].dense_tokens);
    const size_t V = (size_t)fa->vocab, S = (size_t)e->max_out, T = (size_t)e->buf_tokens;
    /* one workspace, the largest node's: the nodes' steps run one at a time */
    e->workspace_bytes = 0;
    for (int32_t i = 0; i < e->n_nodes; i++)
        e->workspace_bytes = MS_MAX(e->workspace_bytes,
                                    e->nodes[i].node->workspace_size(
                                        e->config, e->nodes[i].dense ? e->nodes[i].dense_tokens
                                                                     : e->max_tokens,
                                        e->max_out));
    MS_TRY(eng_alloc(e, e->workspace_bytes, "forward.workspace", &e->workspace, err));
    MS_TRY(eng_alloc(e, T * sizeof(int32_t), "step.tokens", (void **)&e->tokens_dev, err));
    MS_TRY(eng_alloc(e, (size_t)n_axes * T * sizeof(int32_t), "step.positions",
                     (void **)&e->pos_dev, err));
    MS_TRY(eng_alloc(e, S * V * sizeof(float), "step.logits", (void **)&e->logits_dev, err));
    for (int32_t i = 0; i < e->n_nodes; i++) {
        const ms_md_node *nd = e->nodes[i].node;
        if (nd->hidden_width != NULL)
            e->hidden_cap_width = MS_MAX(e->hidden_cap_width, nd->hidden_width(e->config));
        if (nd->codes_width != NULL) { /* [scratch] a row of ids per token besides the rows */
            const int64_t g = nd->codes_width(e->config);
            if (g < 1 || g > INT32_MAX / (int64_t)T)
                return MS_FAIL(err, MS_ERR_FORMAT, "model %s: node %s: %lld code columns",
                               e->desc->name, nd->name, (long long)g);
            e->codes_cap = MS_MAX(e->codes_cap, (int64_t)T * g);
        }
        if (nd->input_shape != NULL) {
            int64_t rows = 0, cols = 0;
            nd->input_shape(e->config, &rows, &cols);
            if (rows == -2) { /* [inputs_embeds] its head's input rows have the rows' width;
                                 [scratch] a scratch node's hidden rows their own */
                e->last_hidden_width = MS_MAX(e->last_hidden_width, cols);
                if (nd->hidden_width != NULL)
                    e->last_hidden_width = MS_MAX(e->last_hidden_width,
                                                  nd->hidden_width(e->config));
            }
            if (rows == -3) /* [codes] the head's input rows have the node's width */
                e->last_hidden_width = MS_MAX(e->last_hidden_width, e->nodes[i].facts.hidden);
            if (rows == -1 || rows == -2 || rows == -3)
                rows = e->max_tokens; /* a step's context rows or [inputs_embeds] a row per
                                         token ([codes] of ids): within its tokens */
            if (rows < 1 || cols < 1 || rows > INT32_MAX / cols)
                return MS_FAIL(err, MS_ERR_FORMAT, "model %s: node %s: input of %lld x %lld",
                               e->desc->name, nd->name, (long long)rows, (long long)cols);
            /* [encoder] a dense node's step stages the inputs of all its windows */
            const int64_t nw = e->nodes[i].dense ? e->nodes[i].max_windows : 1;
            if (rows * cols > INT32_MAX / nw)
                return MS_FAIL(err, MS_ERR_FORMAT, "model %s: node %s: %lld inputs of %lld x %lld",
                               e->desc->name, nd->name, (long long)nw, (long long)rows,
                               (long long)cols);
            e->input_cap = MS_MAX(e->input_cap, nw * rows * cols);
        }
    }
    if (e->hidden_cap_width > 0)
        MS_TRY(eng_alloc(e, T * (size_t)e->hidden_cap_width * sizeof(float), "step.hidden",
                         (void **)&e->hidden_dev, err));
    if (e->last_hidden_width > 0) { /* [inputs_embeds] */
        MS_TRY(eng_alloc(e, S * (size_t)e->last_hidden_width * sizeof(float), "step.last_hidden",
                         (void **)&e->last_hidden_dev, err));
        e->last_hidden_host = ms_malloc(S * (size_t)e->last_hidden_width * sizeof(float));
        if (e->last_hidden_host == NULL)
            return MS_FAIL(err, MS_ERR_OOM, "out of memory for the last hidden rows");
    }
    if (e->input_cap > 0) {
        MS_TRY(eng_alloc(e, (size_t)e->input_cap * sizeof(float), "step.input",
                         (void **)&e->input_dev, err));
        e->input_host = ms_malloc((size_t)e->input_cap * sizeof(float));
        if (e->input_host == NULL)
            return MS_FAIL(err, MS_ERR_OOM, "out of memory for the input staging buffer");
    }
    if (e->codes_cap > 0) { /* [scratch] */
        MS_TRY(eng_alloc(e, (size_t)e->codes_cap * sizeof(int32_t), "step.codes",
                         (void **)&e->codes_dev, err));
        e->codes_host = ms_malloc((size_t)e->codes_cap * sizeof(int32_t));
        if (e->codes_host == NULL)
            return MS_FAIL(err, MS_ERR_OOM, "out of memory for the codes staging buffer");
    }
    MS_TRY(eng_alloc(e, S * sizeof(int32_t), "step.ids", (void **)&e->ids_dev, err));
    e->sample_ws_bytes = e->be.iface.sample_workspace_size(e->be.ctx, e->max_seqs, fa->vocab);
    if (e->max_out > e->max_seqs) {
        int32_t *iota = ms_malloc(T * sizeof(int32_t));
        if (iota == NULL)
            return MS_FAIL(err, MS_ERR_OOM, "out of memory for the block rows");
        for (size_t t = 0; t < T; t++)
            iota[t] = (int32_t)t;
        ms_status st = eng_alloc(e, T * sizeof(int32_t), "step.out_rows",
                                 (void **)&e->out_rows_dev, err);
        if (st == MS_OK)
            st = e->be.iface.copy_to_backend(e->be.ctx, e->out_rows_dev, iota,
                                             T * sizeof(int32_t), err);
        ms_free(iota);
        MS_TRY(st);
    }
    MS_TRY(eng_alloc(e, e->sample_ws_bytes, "sampler.workspace", &e->sample_ws, err));

    /* RoPE table (a model of learned position tables has none: theta 0) */
    int32_t rd = fa->rope.rotary_dim > 0 ? fa->rope.rotary_dim : fa->head_dim;
    if (fa->rope.theta <= 0.0)
        rd = 0;
    float *inv = ms_calloc((size_t)rd / 2 + 1, sizeof(float));
    if (inv == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "out of memory for the RoPE table");
    ms_status st = rd > 0 ? ms_rope_compute_inv_freq(&fa->rope, inv, err) : MS_OK;
    if (st == MS_OK)
        st = eng_alloc(e, (size_t)rd / 2 * sizeof(float), "rope.inv_freq", (void **)&e->inv_freq,
                       err);
    if (st == MS_OK)
        st = e->be.iface.copy_to_backend(e->be.ctx, e->inv_freq, inv,
                                         (size_t)rd / 2 * sizeof(float), err);
    ms_free(inv);
    MS_TRY(st);
    memset(&e->rope, 0, sizeof e->rope);
    e->rope.style = fa->rope.style;
    e->rope.rotary_dim = rd;
    e->rope.inv_freq = e->inv_freq;
    e->rope.attention_scaling = 1.0f;
    e->rope.n_sections = fa->rope.n_sections > 1 ? fa->rope.n_sections : 0;
    for (int32_t k = 0; k < e->rope.n_sections; k++)
        e->rope.sections[k] = fa->rope.sections[k];

    e->logits_host = ms_malloc(S * V * sizeof(float));
    e->tokens_host = ms_malloc(T * sizeof(int32_t));
    e->ids_host = ms_malloc(S * sizeof(int32_t));
    e->rows = ms_calloc(S, sizeof *e->rows);
    e->row_reqs = ms_calloc(S, sizeof *e->row_reqs);
    e->rids = ms_calloc(S, sizeof *e->rids);
    if (e->logits_host == NULL || e->tokens_host == NULL || e->ids_host == NULL ||
        e->rows == NULL || e->row_reqs == NULL || e->rids == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "out of memory for step buffers");
    if (e->plp_rows > 0) { /* [prompt logprobs] */
        MS_TRY(eng_alloc(e, S * sizeof(int32_t), "step.prompt_logprobs_rows",
                         (void **)&e->plp_rows_dev, err));
        e->plp_rows_host = ms_malloc(S * sizeof(int32_t));
        e->plp_scratch = ms_malloc(ms_sampler_scratch_size(fa->vocab));
        if (e->plp_rows_host == NULL || e->plp_scratch == NULL)
            return MS_FAIL(err, MS_ERR_OOM, "out of memory for the prompt logprobs buffers");
    }
    /* a step has at most max_seqs segments: a request takes one slot of max_seqs per stream */
    return ms_md_step_build_init(&e->build, e->max_seqs, e->buf_tokens, err);
}

static ms_status eng_graphs_init(ms_engine *e, ms_error *err); /* [graphs], end of file */

/* ms_engine_init; shared_ck: [tp] the checkpoint the group opened once (borrowed), NULL: open
 * opt->model_path's. */
ms_status eng_init(ms_engine **out, const ms_model_desc *desc,
                   const ms_engine_options *opt, ms_ckpt *shared_ck, ms_error *err) {
    *out = NULL;
    if (desc == NULL || opt == NULL || opt->model_path == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "engine: no model path");
    if (opt->max_seqs < 1 || opt->max_tokens < opt->max_seqs || opt->page_size < 0 ||
        opt->kv_pages < 0 || opt->max_seq_len < 0 || opt->n_threads < 0 ||
        opt->host_kv_pages < 0 || !(opt->gpu_memory_fraction >= 0 && opt->gpu_memory_fraction <= 1))
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "engine: bad options (max_seqs %d >= 1, max_tokens %d >= max_seqs, "
                       "page_size %d >= 0, kv_pages %d >= 0, host_kv_pages %d >= 0, "
                       "gpu_memory_fraction %g in [0, 1])",
                       (int)opt->max_seqs, (int)opt->max_tokens, (int)opt->page_size,
                       (int)opt->kv_pages, (int)opt->host_kv_pages,
                       opt->gpu_memory_fraction);
    MS_TRY(ms_md_check_desc(desc, err)); /* 1 .. MS_MD_MAX_NODES nodes */
    if (opt->tp < 0 || opt->tp > 64)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "engine: tp %d (0..64)", (int)opt->tp);
    if (opt->tp > 1 && opt->tp_member == NULL) /* [tp] one engine per rank */
        return eng_tp_init(out, desc, opt, err);
    ms_engine *e = ms_calloc(1, sizeof *e);
    if (e == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "out of memory for the engine");
    e->desc = desc;
    e->n_nodes = desc->n_nodes;
    for (int32_t i = 0; i < e->n_nodes; i++) {
        e->nodes[i].node = &desc->nodes[i];
        e->nodes[i].step0 = e->n_sched_steps;
        e->n_sched_steps += desc->nodes[i].n_steps;
    }
    e->opt = *opt;
    e->max_seqs = opt->max_seqs;
    e->max_tokens = opt->max_tokens;
    e->next_rid = 1;
    ms_status st = eng_backend_init(e, err);
    if (st == MS_OK)
        st = eng_facts_init(e, err);
    if (st == MS_OK && opt->tp_member != NULL) /* [tp] the local config and facts */
        st = ms_tp_rank_init(&e->tps, opt->tp_member, desc, e->hf, &e->config, &e->facts, err);
    if (st == MS_OK && shared_ck != NULL) { /* [tp] every rank reads the one checkpoint */
        e->ck = shared_ck;
        e->ck_borrowed = true;
    } else if (st == MS_OK) {
        st = ms_ckpt_init(&e->ck, opt->model_path, err);
    }
    if (st == MS_OK)
        st = eng_weights_init(e, err);
    if (st == MS_OK && e->tps != NULL) /* [tp] the row-parallel and vocabulary hooks */
        st = ms_tp_rank_attach(e->tps, &e->be, e->max_tokens, err);
    for (int32_t i = 0; i < e->n_nodes && st == MS_OK; i++) {
        eng_node *nd = &e->nodes[i];
        nd->facts = e->facts;
        if (nd->node->facts != NULL)
            st = nd->node->facts(e->config, &nd->facts, err);
        if (st == MS_OK && eng_node_is_dense(nd->node)) { /* [encoder] no pages, no runner */
            st = eng_dense_init(e, nd, err);
            continue;
        }
        if (st == MS_OK)
            st = ms_md_check_facts(e->desc, &nd->facts, err);
        if (st == MS_OK)
            st = eng_resources_init(e, nd, err);
        if (st == MS_OK)
            st = eng_runner_init(e, &e->nodes[i], err);
    }
    if (st == MS_OK)
        st = eng_kernels_init(e, err);
    if (st == MS_OK)
        st = eng_buffers_init(e, err);
    if (st == MS_OK)
        st = eng_graphs_init(e, err); /* [graphs] */
    if (st == MS_OK)
        st = eng_prefix_init(e, err); /* [prefix] */
    if (st == MS_OK && e->tps != NULL) /* [tp] every rank allocated alike */
        st = eng_tp_check(e, "after warm-up", err);
    if (st != MS_OK) {
        ms_engine_free(e);
        return st;
    }
    *out = e;
    return MS_OK;
}

ms_status ms_engine_init(ms_engine **out, const ms_model_desc *desc,
                         const ms_engine_options *opt, ms_error *err) {
    return eng_init(out, desc, opt, NULL, err);
}

static void eng_req_free(eng_req *r) {
    if (r == NULL)
        return;
    for (int l = 0; l < MS_MAX_LABELS; l++)
        ms_free(r->prompt[l]);
    ms_free(r->positions);
    ms_free(r->out);
    ms_free(r->features);
    ms_free(r->context);
    ms_free(r->plp);
    ms_free(r);
}

/* Remove rid from every node's runner (a request not in one is a no-op there). */
static void eng_runners_remove(ms_engine *e, ms_rid rid) {
    for (int32_t i = 0; i < e->n_nodes; i++)
        if (e->nodes[i].runner != NULL)
            ms_step_runner_remove(e->nodes[i].runner, rid);
}

void ms_engine_free(ms_engine *e) {
    if (e == NULL)
        return;
    ms_tp_group_free(e->tpg); /* [tp] the other ranks' engines first */
    for (size_t i = 0; i < e->n_reqs; i++) {
        if (e->reqs[i]->in_runner)
            eng_runners_remove(e, e->reqs[i]->rid);
        eng_req_free(e->reqs[i]);
    }
    ms_free(e->reqs);
    ms_graph_exec_free(e->gx); /* [graphs] before the runner its dummy rows live in */
    ms_prefix_cache_free(e->pcache); /* [prefix] its pages go back to the arena first */
    for (int32_t i = 0; i < e->n_nodes; i++) {
        eng_node *nd = &e->nodes[i];
        ms_step_runner_free(nd->runner);
        ms_kv_pool_free(nd->pool);
        ms_page_arena_free(nd->arena);
        ms_page_arena_free(nd->host_arena);
        ms_attn_free(nd->attn.inner);
        ms_sample_res_free(nd->sampler);
        ms_free(nd->zeros);
        if (e->be.ctx != NULL) {
            ms_dense_batch_free(&e->be, nd->dense_batch);
            if (nd->attn.batch != NULL)
                e->be.iface.attn_batch_free(e->be.ctx, nd->attn.batch);
            if (nd->ctx_batch != NULL)
                e->be.iface.attn_batch_free(e->be.ctx, nd->ctx_batch);
            if (nd->cross_batch != NULL)
                e->be.iface.attn_batch_free(e->be.ctx, nd->cross_batch);
        }
    }
    ms_device_free(e->host_dev);
    ms_device_free(e->dev);
    if (e->be.ctx != NULL) {
        eng_bfree(e, e->wslab);
        eng_bfree(e, e->inv_freq);
        eng_bfree(e, e->workspace);
        eng_bfree(e, e->tokens_dev);
        eng_bfree(e, e->pos_dev);
        eng_bfree(e, e->logits_dev);
        eng_bfree(e, e->ids_dev);
        eng_bfree(e, e->sample_ws);
        eng_bfree(e, e->out_rows_dev);
        eng_bfree(e, e->hidden_dev);
        eng_bfree(e, e->input_dev);
        eng_bfree(e, e->codes_dev);
        eng_bfree(e, e->plp_rows_dev);
        eng_bfree(e, e->last_hidden_dev);
    }
    ms_free(e->input_host);
    ms_free(e->codes_host);
    ms_free(e->plp_rows_host);
    ms_free(e->plp_scratch);
    ms_free(e->last_hidden_host);
    ms_tp_rank_detach(e->tps, &e->be); /* [tp] */
    ms_tp_rank_free(e->tps);
    ms_backend_free(&e->be);
    ms_free(e->weights);
    ms_free(e->woff);
    if (!e->ck_borrowed)
        ms_ckpt_free(e->ck);
    ms_free(e->config);
    ms_hf_config_free(e->hf);
    ms_free(e->logits_host);
    ms_free(e->tokens_host);
    ms_free(e->ids_host);
    ms_free(e->rows);
    ms_free(e->row_reqs);
    ms_free(e->rids);
    ms_md_step_build_free(&e->build);
    ms_md_step_build_free(&e->pre_build); /* [graphs] after gx (its pre-plan borrows it) */
    ms_free(e->pre_rows);
    ms_free(e->pre_samples);
    ms_free(e);
}

/* ---- requests ---- */

eng_req *eng_find_req(const ms_engine *e, ms_rid rid, size_t *at) {
    for (size_t i = 0; i < e->n_reqs; i++)
        if (e->reqs[i]->rid == rid) {
            if (at != NULL)
                *at = i;
            return e->reqs[i];
        }
    return NULL;
}

/* Leave the batch: free what the resources hold; the output stays until ms_engine_remove. */
static void eng_finish(ms_engine *e, eng_req *r, ms_finish_reason why) {
    r->finish = why;
    if (r->in_runner) {
        eng_runners_remove(e, r->rid);
        r->in_runner = false;
    }
    e->n_active--;
    e->n_streams_active -= r->n_streams;
}

/* Label named `name` of the first node (where a request's walk starts), or -1. */
static int32_t eng_label(const ms_engine *e, const char *name) {
    const ms_md_node *nd = e->nodes[0].node;
    for (int32_t l = 0; l < nd->n_labels; l++)
        if (strcmp(nd->labels[l], name) == 0)
            return l;
    return -1;
}

ms_sampling_params ms_engine_sampling_defaults(const ms_engine *e) {
    ms_sampling_params p = {e->facts.temperature, e->facts.top_k, e->facts.top_p, 0};
    return p;
}

/* Validate one stream's prompt. */
static ms_status eng_check_prompt(const ms_engine *e, const int32_t *ids, int32_t n,
                                  const char *what, ms_error *err) {
    const ms_md_facts *fa = &e->facts;
    if (n < 1 || ids == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "empty %s: at least one token is needed", what);
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= fa->vocab)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "%s token %d at index %d is outside the vocabulary [0, %d)", what,
                           (int)ids[i], (int)i, (int)fa->vocab);
    if (n > fa->max_context)
        return MS_FAIL(err, MS_ERR_LIMIT,
                       "%s of %d tokens is longer than the model's context (%d positions)", what,
                       (int)n, (int)fa->max_context);
    return MS_OK;
}

/* ms_engine_add, and ms_engine_fork's request (fork_of: the parent it waits for, 0 none). */
ms_status eng_add(ms_engine *e, const ms_engine_request *rq, ms_rid fork_of, ms_rid *rid,
                  ms_error *err) {
    MS_TRY(eng_check_prompt(e, rq->prompt, rq->n_prompt, "prompt", err));
    if (rq->max_new_tokens < 0 || rq->prefill_chunk < 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "max_new_tokens (%d) must be >= 0",
                       (int)rq->max_new_tokens);
    MS_TRY(ms_sampler_check_params(&rq->sampling, err));
    bool guided = rq->negative_prompt != NULL || rq->n_negative_prompt > 0;
    int32_t uncond = -1;
    if (guided) {
        MS_TRY(eng_check_prompt(e, rq->negative_prompt, rq->n_negative_prompt,
                                "negative prompt", err));
        if (!isfinite(rq->guidance_scale))
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "guidance scale %g is not a finite number",
                           (double)rq->guidance_scale);
        uncond = eng_label(e, "cfg_uncond");
        if (uncond < 0)
            return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                           "model %s declares no cfg_uncond label: it has no guided walk (a "
                           "negative prompt needs one)", e->desc->name);
    }
    if (rq->position_ids != NULL &&
        (rq->n_position_axes < 1 || rq->n_position_axes > MS_MD_MAX_AXES))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "position ids with %d axes (1 or 3)",
                       (int)rq->n_position_axes);
    bool has_prompt[MS_MAX_LABELS] = {false};
    has_prompt[MS_LABEL_MAIN] = true;
    if (uncond >= 0)
        has_prompt[uncond] = true;
    int32_t walk = ms_walk_find(e->desc, has_prompt);
    if (walk < 0)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "model %s has no walk starting with a step over "
                       "%s", e->desc->name, guided ? "main and cfg_uncond" : "main alone");
    bool takes_ids = false;
    {
        const ms_md_walk *wk = &e->desc->walks[walk];
        /* a node returning hidden states runs as the walk's first item, over the request's
           features; the next item's node reads its rows as its cross resource's context */
        for (int32_t i = 0; i < wk->n_items; i++) {
            const eng_node *nd = &e->nodes[wk->items[i].node];
            if (nd->node->hidden_width == NULL || nd->scratch != NULL)
                continue; /* [scratch] a code predictor's rows come from ms_engine_run_rows */
            const eng_node *next = i + 1 < wk->n_items ? &e->nodes[wk->items[i + 1].node] : NULL;
            if (i != 0 || nd->node->input_shape == NULL || next == NULL ||
                next->context_label < 0 || i + 1 >= wk->loop_begin)
                return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                               "walk '%s' runs node %s, whose forward returns hidden states, "
                               "other than as its first item feeding the next node's cross "
                               "resource: run it through ms_engine_encode", wk->name,
                               nd->node->name);
            int64_t rows = 0, cols = 0;
            nd->node->input_shape(e->config, &rows, &cols);
            if (rq->features == NULL || rq->n_feature_channels != cols ||
                rq->n_feature_frames != rows)
                return MS_FAIL(err, MS_ERR_INVALID_ARG,
                               "walk '%s' starts at node %s, which takes features [%lld, %lld] "
                               "(channels, frames); the request gives %s [%lld, %lld]",
                               wk->name, nd->node->name, (long long)cols, (long long)rows,
                               rq->features == NULL ? "none" : "features",
                               (long long)rq->n_feature_channels, (long long)rq->n_feature_frames);
            /* the context step takes the prompt and the rows in one step */
            if ((int64_t)rq->n_prompt + nd->facts.max_context > e->max_tokens)
                return MS_FAIL(err, MS_ERR_CAPACITY,
                               "a prompt of %d tokens and %d context rows are prefilled in one "
                               "step: above max_tokens %d (raise max_tokens)", (int)rq->n_prompt,
                               (int)nd->facts.max_context, (int)e->max_tokens);
        }
        if (rq->features != NULL && !e->nodes[wk->items[0].node].node->hidden_width)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "features given, but walk '%s' does not start at a node reading them",
                           wk->name);
        for (int32_t i = 0; i < wk->loop_begin; i++)
            takes_ids = takes_ids || e->desc->nodes[wk->items[i].node]
                                                  .steps[wk->items[i].step].explicit_positions;
        if (rq->position_ids != NULL && !takes_ids)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "position ids given, but no prompt step of walk '%s' declares "
                           "`pos explicit`", wk->name);
        const int32_t axes = e->nodes[0].pos_cfg.n_axes; /* every node's: one facts.rope */
        if (rq->position_ids != NULL && rq->n_position_axes != axes)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "position ids with %d axes, model %s takes %d (%s)",
                           (int)rq->n_position_axes, e->desc->name, (int)axes,
                           axes > 1 ? "t, h, w" : "one");
    }
    /* a `pos explicit` prompt without ids is text: ids 0 .. n - 1, the same on every axis (what
       transformers' get_rope_index gives a prompt without image or video tokens) */
    const bool own_ids = takes_ids && rq->position_ids == NULL;
    const int32_t n_axes_ids =
        rq->position_ids != NULL ? rq->n_position_axes : e->nodes[0].pos_cfg.n_axes;
    /* [encoder] a dense node's windows hold no stream (nothing is kept between steps) */
    int32_t n_streams = ms_walk_n_streams(e->desc, walk) - eng_walk_dense_streams(e, walk);
    if (rq->prompt_logprobs) { /* [prompt logprobs] */
        if (e->plp_rows < 1)
            return MS_FAIL(err, MS_ERR_UNSUPPORTED, "prompt logprobs asked, but the engine keeps "
                           "no prompt rows' logits (set options.prompt_logprobs_rows)");
        if (e->n_nodes != 1 || n_streams != 1 || rq->features != NULL ||
            e->nodes[0].context_label >= 0)
            return MS_FAIL(err, MS_ERR_UNSUPPORTED, "prompt logprobs: one-stream token requests "
                           "of a one-node model only");
        if (rq->prompt_top_logprobs < 0 || rq->prompt_top_logprobs > MS_ENGINE_MAX_TOP_LOGPROBS)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "prompt_top_logprobs %d outside [0, %d]",
                           (int)rq->prompt_top_logprobs, MS_ENGINE_MAX_TOP_LOGPROBS);
    }
    MS_TRY(eng_kv_check_fits(e, rq, n_streams, err)); /* [kv pressure] */
    if (e->n_streams_active + n_streams > e->max_seqs)
        return MS_FAIL(err, MS_ERR_CAPACITY,
                       "%d requests (%d streams) are already running (raise max_seqs)",
                       (int)e->n_active, (int)e->n_streams_active);
    if (guided && rq->n_prompt + rq->n_negative_prompt > e->max_tokens)
        return MS_FAIL(err, MS_ERR_CAPACITY,
                       "a guided prompt pair of %d + %d tokens is prefilled in one step: above "
                       "max_tokens %d (raise max_tokens)", (int)rq->n_prompt,
                       (int)rq->n_negative_prompt, (int)e->max_tokens);
    eng_req *r = ms_calloc(1, sizeof *r);
    if (r == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "out of memory for a request");
    r->prompt[MS_LABEL_MAIN] = ms_malloc((size_t)rq->n_prompt * sizeof(int32_t));
    if (uncond >= 0)
        r->prompt[uncond] = ms_malloc((size_t)rq->n_negative_prompt * sizeof(int32_t));
    if (rq->position_ids != NULL || own_ids)
        r->positions = ms_malloc((size_t)n_axes_ids * (size_t)rq->n_prompt * sizeof(int32_t));
    if (rq->features != NULL) {
        size_t nf = (size_t)rq->n_feature_channels * (size_t)rq->n_feature_frames;
        r->features = ms_malloc(nf * sizeof(float));
        if (r->features != NULL)
            memcpy(r->features, rq->features, nf * sizeof(float));
        r->n_channels = rq->n_feature_channels;
        r->n_frames = rq->n_feature_frames;
    }
    r->out = ms_malloc((size_t)(rq->max_new_tokens > 0 ? rq->max_new_tokens : 1) *
                       sizeof(int32_t));
    if (rq->prompt_logprobs) /* [prompt logprobs] */
        r->plp = ms_calloc((size_t)rq->n_prompt, sizeof *r->plp);
    if (r->prompt[MS_LABEL_MAIN] == NULL || (uncond >= 0 && r->prompt[uncond] == NULL) ||
        (rq->prompt_logprobs && r->plp == NULL) ||
        (rq->features != NULL && r->features == NULL) ||
        ((rq->position_ids != NULL || own_ids) && r->positions == NULL) || r->out == NULL ||
        ms_grow((void **)&e->reqs, &e->cap_reqs, e->n_reqs + 1, sizeof *e->reqs) != MS_OK) {
        eng_req_free(r);
        return MS_FAIL(err, MS_ERR_OOM, "out of memory for a request");
    }
    memcpy(r->prompt[MS_LABEL_MAIN], rq->prompt, (size_t)rq->n_prompt * sizeof(int32_t));
    r->n_prompt[MS_LABEL_MAIN] = rq->n_prompt;
    r->n_orig_prompt = rq->n_prompt;
    r->longest = rq->n_prompt;
    if (uncond >= 0) {
        memcpy(r->prompt[uncond], rq->negative_prompt,
               (size_t)rq->n_negative_prompt * sizeof(int32_t));
        r->n_prompt[uncond] = rq->n_negative_prompt;
        r->longest = MS_MAX(r->longest, rq->n_negative_prompt);
    }
    if (rq->position_ids != NULL) {
        memcpy(r->positions, rq->position_ids,
               (size_t)rq->n_position_axes * (size_t)rq->n_prompt * sizeof(int32_t));
        r->n_position_axes = rq->n_position_axes;
    } else if (own_ids) {
        for (int32_t a = 0; a < n_axes_ids; a++)
            for (int32_t t = 0; t < rq->n_prompt; t++)
                r->positions[(size_t)a * (size_t)rq->n_prompt + (size_t)t] = t;
        r->n_position_axes = n_axes_ids;
    }
    r->n_streams = n_streams;
    r->walk = (ms_walk_pos){walk, 0};
    r->max_new = rq->max_new_tokens;
    r->chunk = rq->prefill_chunk;
    r->ignore_eos = rq->ignore_eos;
    r->rid = e->next_rid++;
    r->row = -1;
    ms_sample_settings ss = {.params = rq->sampling,
                             .guidance_scale = guided ? rq->guidance_scale : 1.0f};
    ms_status st = MS_OK;
    for (int32_t i = 0; i < e->n_nodes && st == MS_OK; i++) {
        const void *overrides[MS_MAX_RESOURCES] = {NULL};
        if (e->nodes[i].dense)
            continue; /* [encoder] no per-request state: its step keeps nothing */
        if (e->nodes[i].idx[MS_RESOURCE_SAMPLER] >= 0)
            overrides[e->nodes[i].idx[MS_RESOURCE_SAMPLER]] = &ss;
        st = ms_step_runner_ingest(e->nodes[i].runner, r->rid, overrides, err);
    }
    if (st != MS_OK) {
        eng_runners_remove(e, r->rid);
        eng_req_free(r);
        return st;
    }
    r->in_runner = true;
    r->no_seal = r->positions != NULL || r->features != NULL;
    r->fork_of = r->max_new > 0 ? fork_of : 0; /* [fork] its prompt's KV comes from the parent */
    if (r->plp != NULL) { /* [prompt logprobs] entry 0 has none */
        r->plp_top = rq->prompt_top_logprobs;
        r->plp[0].logprob = NAN;
        r->plp_next = 1;
    }
    if (r->fork_of == 0 && r->plp == NULL) /* [prompt logprobs] every prompt row is computed */
        eng_prefix_adopt(e, r); /* [prefix] a cached prefix is not computed again */
    e->fork_stats.n_waiting += r->fork_of != 0;
    e->reqs[e->n_reqs++] = r;
    e->n_active++;
    e->n_streams_active += n_streams;
    if (r->max_new == 0 && r->plp == NULL) /* [prompt logprobs] those still prefill */
        eng_finish(e, r, MS_FINISH_LENGTH);
    *rid = r->rid;
    return MS_OK;
}

ms_status ms_engine_output(const ms_engine *e, ms_rid rid, const int32_t **ids, int32_t *n,
                           ms_finish_reason *reason) {
    const eng_req *r = eng_find_req(e, rid, NULL);
    if (r == NULL)
        return MS_FAIL(NULL, MS_ERR_NOT_FOUND, "unknown request");
    *ids = r->out;
    *n = r->n_out;
    if (reason != NULL)
        *reason = r->finish;
    return MS_OK;
}

/* The last forward's logits rows into logits_host, unless they are there already: a sampled
 * step leaves them on the backend (eng_forward_sample), and whoever reads them copies them here
 * first (the backend's sample does not modify them). */
static ms_status eng_logits_to_host(ms_engine *e, ms_error *err) {
    if (e->logits_on_host)
        return MS_OK;
    MS_TRY(e->be.iface.copy_to_host(e->be.ctx, e->logits_host, e->logits_dev,
                                    (size_t)e->logits_rows * (size_t)e->facts.vocab * sizeof(float),
                                    err));
    e->logits_on_host = true;
    return MS_OK;
}

const float *ms_engine_last_logits(const ms_engine *e, ms_rid rid) {
    const eng_req *r = eng_find_req(e, rid, NULL);
    if (r == NULL || r->row < 0 || (!e->logits_on_host && r->row >= e->logits_rows))
        return NULL;
    /* the engine is const for callers; the copy fills a cache */
    ms_error err = {0};
    if (eng_logits_to_host((ms_engine *)(uintptr_t)e, &err) != MS_OK)
        return NULL;
    return e->logits_host + (size_t)r->row * (size_t)e->facts.vocab;
}

void eng_remove(ms_engine *e, ms_rid rid) {
    size_t at;
    eng_req *r = eng_find_req(e, rid, &at);
    if (r == NULL)
        return;
    if (r->finish == MS_FINISH_NONE) {
        e->n_active--;
        e->n_streams_active -= r->n_streams;
    }
    if (r->in_runner)
        eng_runners_remove(e, rid);
    e->fork_stats.n_waiting -= r->fork_of != 0; /* [fork] */
    eng_req_free(r);
    memmove(&e->reqs[at], &e->reqs[at + 1], (e->n_reqs - at - 1) * sizeof *e->reqs);
    e->n_reqs--;
}

/* ---- the step: pick a (node, step), batch the requests standing there, run it ---- */

static bool eng_is_eos(const ms_engine *e, int32_t id) {
    for (int32_t i = 0; i < e->facts.n_eos; i++)
        if (e->facts.eos_ids[i] == id)
            return true;
    return false;
}

/*
 * Rows of step k: every active request standing at k, in arrival order, within max_seqs rows and
 * the max_tokens budget. A prefix step feeds the remaining prompt of each stream (a one-stream
 * prompt is cut to the chunk and to what is left of the budget: chunked prefill; several streams
 * go whole or wait); a loop step feeds one token (the last id) per stream.
 */
static int32_t eng_rows(ms_engine *e, ms_md_walk_item item, int32_t *n_prefill) {
    const ms_md_step *sd = &e->nodes[item.node].node->steps[item.step];
    int32_t n = 0, budget = e->max_tokens;
    int32_t plp_left = e->plp_rows; /* [prompt logprobs] extra logits rows left in the step */
    *n_prefill = 0;
    for (size_t i = 0; i < e->n_reqs && n < e->max_seqs; i++) {
        eng_req *r = e->reqs[i];
        ms_md_walk_item at = ms_walk_item(e->desc, r->walk);
        if (r->finish != MS_FINISH_NONE || at.node != item.node || at.step != item.step)
            continue;
        if (eng_kv_skip(e, r))
            continue; /* [kv pressure] offloaded, or waiting for pages */
        if (r->fork_of != 0)
            continue; /* [fork] waits for its parent's prompt KV */
        ms_md_row row;
        memset(&row, 0, sizeof row);
        row.rid = r->rid;
        int32_t need = 0;
        if (ms_walk_in_loop(e->desc, r->walk)) {
            for (int32_t s = 0; s < sd->n_segments; s++)
                row.len[sd->labels[s]] = 1;
            need = sd->n_segments;
            row.sample = true;
            if (need > budget)
                continue;
        } else {
            bool done = true;
            for (int32_t s = 0; s < sd->n_segments; s++) {
                ms_label l = sd->labels[s];
                int32_t left = r->n_prompt[l] - r->consumed[l];
                if (sd->n_segments == 1) {
                    if (r->chunk > 0 && left > r->chunk)
                        left = r->chunk;
                    if (left > budget)
                        left = budget;
                    if (r->plp != NULL && left > plp_left + 1)
                        left = plp_left + 1; /* [prompt logprobs] a row per token */
                }
                row.len[l] = left;
                need += left;
                done = done && r->consumed[l] + left == r->n_prompt[l];
            }
            if (need < 1 || need > budget)
                continue; /* waits for a step with room */
            row.sample = done;
            if (r->positions != NULL && sd->explicit_positions) {
                row.position_ids = r->positions + r->consumed[MS_LABEL_MAIN];
                row.n_position_axes = r->n_position_axes;
                row.position_stride = r->n_prompt[MS_LABEL_MAIN];
            }
            *n_prefill += done;
        }
        budget -= need;
        if (r->plp != NULL && !ms_walk_in_loop(e->desc, r->walk))
            plp_left -= need - 1; /* [prompt logprobs] */
        e->rows[n] = row;
        e->row_reqs[n] = r;
        e->rids[n] = r->rid;
        n++;
    }
    return n;
}

/* Pack the step's tokens in segment order: each segment takes its row's tokens for its label. */
static ms_status eng_pack_tokens(ms_engine *e, const eng_node *en, int32_t k, ms_error *err) {
    const ms_md_node *nd = en->node;
    const ms_md_step_build *b = &e->build;
    int32_t t = 0;
    for (int32_t i = 0; i < b->step.n_segments; i++) {
        const ms_segment *sg = &b->segments[i];
        eng_req *r = e->row_reqs[b->seg_row[i]];
        if (r == NULL) { /* [graphs] a dummy padding row: token 0 */
            memset(e->tokens_host + t, 0, (size_t)sg->span * sizeof(int32_t));
            t += sg->span;
            continue;
        }
        if (sg->label == en->context_label) {
            /* context rows, not ids: staged as the forward's input (eng_stage_cross) */
            t += sg->span;
            continue;
        }
        if (ms_walk_in_loop(e->desc, r->walk)) {
            if (sg->span > 1 || (sg->span == 1 && r->n_out < 1))
                return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                               "step %s: a loop step feeds the last sampled id (span %d)",
                               nd->steps[k].name, (int)sg->span);
            if (sg->span == 1)
                e->tokens_host[t] = r->out[r->n_out - 1];
        } else {
            if (r->prompt[sg->label] == NULL ||
                r->consumed[sg->label] + sg->span > r->n_prompt[sg->label])
                return MS_FAIL(err, MS_ERR_INVALID_ARG,
                               "step %s: request %llu has no %d prompt tokens for label %s",
                               nd->steps[k].name, (unsigned long long)r->rid,
                               (int)sg->span, nd->labels[sg->label]);
            memcpy(e->tokens_host + t, r->prompt[sg->label] + r->consumed[sg->label],
                   (size_t)sg->span * sizeof(int32_t));
        }
        t += sg->span;
    }
    return MS_OK;
}

/*
 * A step of a node with a cross resource: stage the context rows' write addresses (the context
 * label's KV plan) into ctx_batch and their rows (each row's encoder output, segment order) into
 * the input buffer, and the queries over each row's context view (the cross resource's plan:
 * zero-span reads after the write) into cross_batch.
 */
static ms_status eng_stage_cross(ms_engine *e, eng_node *nd, const ms_kv_plan_set *set,
                                 const ms_step_ctx *ctx, const eng_attn *ap, ms_error *err) {
    const ms_backend_i *f = &e->be.iface;
    const ms_md_step_build *b = &e->build;
    const ms_kv_plan *cp = ms_kv_plan_find(set, nd->context_label);
    if (cp == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "step %s: node %s reads its context, but the step declares no segment "
                       "on label %s", b->step.name, nd->node->name,
                       nd->node->labels[nd->context_label]);
    nd->ctx_rows = cp->n_tokens;
    if (cp->n_tokens > 0) {
        int64_t in_rows = 0, w = 0; /* the context rows' width: the node's input columns */
        nd->node->input_shape(e->config, &in_rows, &w);
        int64_t at = 0;
        for (int32_t i = 0; i < b->step.n_segments; i++) {
            const ms_segment *sg = &b->segments[i];
            if (sg->label != nd->context_label || sg->span == 0)
                continue;
            const eng_req *r = e->row_reqs[b->seg_row[i]];
            if (r == NULL || r->context == NULL || r->n_context != sg->span ||
                r->context_width != w)
                return MS_FAIL(err, MS_ERR_INVALID_ARG,
                               "step %s: request %llu brings no %d context rows of width %lld",
                               b->step.name, (unsigned long long)sg->rid, (int)sg->span,
                               (long long)w);
            memcpy(e->input_host + at * w, r->context,
                   (size_t)sg->span * (size_t)w * sizeof(float));
            at += sg->span;
        }
        MS_ASSERT(at == cp->n_tokens);
        MS_TRY(f->copy_to_backend(e->be.ctx, e->input_dev, e->input_host,
                                  (size_t)(at * w) * sizeof(float), err));
        MS_TRY(ms_backend_attn_stage(&e->be, nd->ctx_batch, cp, &nd->kv, nd->attn.n_q_heads,
                                     &nd->cross_params, err));
    }
    const ms_cross_plan_set *xs = ctx->plan_results[nd->idx[MS_RESOURCE_CROSS]];
    const ms_cross_buffers *xb = NULL;
    for (int32_t k = 0; xs != NULL && k < xs->n_plans; k++)
        if (xs->plans[k].plan_label == ap->query_plan->plan_label)
            xb = xs->plans[k].buffers;
    if (xb == NULL || xb->n_rows != ap->query_plan->n_views ||
        xb->qo_indptr[xb->n_rows] != ap->query_plan->n_tokens)
        return MS_FAIL(err, MS_ERR_INTERNAL, "step %s: the cross plan does not cover the queries",
                       b->step.name);
    const ms_kv_plan *qp = ap->query_plan;
    ms_kv_plan xp = {
        .plan_label = qp->plan_label,
        .n_views = xb->n_rows,
        .views = qp->views, /* not read by staging */
        .n_tokens = qp->n_tokens,
        .qo_indptr = xb->qo_indptr,
        .kv_indptr = xb->kv_indptr,
        .kv_indices = xb->kv_indices,
        .kv_last_page_len = xb->kv_last_page_len,
        .kv_start = nd->zeros,
        .token_to_page = qp->token_to_page, /* nothing is written through this batch */
        .token_to_slot = qp->token_to_slot,
        .is_decode = qp->is_decode,
    };
    return ms_backend_attn_stage(&e->be, nd->cross_batch, &xp, &nd->kv, nd->attn.n_q_heads,
                                 &nd->cross_params, err);
}

static ms_status eng_preplan(ms_engine *e, eng_node *nd, const ms_md_step *sd,
                             const ms_graph_step *gs, ms_error *err); /* [graphs] */

/* Queue the forward of a planned step, mix guided rows, sample one id per segment into
 * e->ids_host (the logits land in e->logits_host). `admitted` is the declaration the step was
 * admitted with; *committed is set when the step was committed here ([graphs] before the
 * pre-plan of the next step), and the caller must not commit or abandon it again. */

static ms_status eng_forward_sample(ms_engine *e, eng_node *nd, const ms_md_step *sd,
                                    ms_step_ctx *ctx, const ms_graph_step *gs, bool sample,
                                    const ms_step *admitted, bool *committed, ms_error *err) {
    const ms_backend_i *f = &e->be.iface;
    void *cx = e->be.ctx;
    const ms_step *step = &e->build.step;
    const ms_kv_plan_set *set = ctx->plan_results[nd->idx[MS_RESOURCE_KV]];
    const ms_pos_plan *pp = ctx->plan_results[nd->idx[MS_RESOURCE_POS]];
    const eng_attn *ap = ctx->plan_results[nd->idx[MS_RESOURCE_ATTN]];
    /* with a cross resource the context rows are packed after the queries' tokens (segments are
       label-major, the queries' label first): the forward reads the queries' tokens and
       positions, and the context rows as its input */
    const bool cross = nd->context_label >= 0;
    const int32_t n_tok = cross ? ap->query_plan->n_tokens : e->build.n_tokens;
    const int32_t n = sd->all_logits ? n_tok
                      : cross        ? ap->query_plan->n_views
                                     : step->n_segments; /* logits rows */
    const size_t V = (size_t)e->facts.vocab;
    int32_t n_pos = 0;
    const int32_t *pos_ids = ms_pos_plan_ids(pp, set->plans[0].plan_label, 0, &n_pos);
    MS_ASSERT(pos_ids != NULL && n_pos == n_tok);
    MS_TRY(f->copy_to_backend(cx, e->tokens_dev, e->tokens_host,
                              (size_t)n_tok * sizeof(int32_t), err));
    /* every axis (M-RoPE t/h/w: [n_axes, n_tok], axis-major as the plan holds them) */
    const int32_t n_axes = pp->n_axes;
    MS_ASSERT((cross ? n_axes == 1 : pp->n_tokens == n_tok) && pos_ids == pp->ids);
    MS_TRY(f->copy_to_backend(cx, e->pos_dev, pp->ids,
                              (size_t)n_axes * (size_t)n_tok * sizeof(int32_t), err));
    if (cross)
        MS_TRY(eng_stage_cross(e, nd, set, ctx, ap, err));
    ms_tensor tokens = ms_tensor_1d(e->tokens_dev, MS_DTYPE_I32, n_tok);
    ms_tensor pos = n_axes > 1 ? ms_tensor_2d(e->pos_dev, MS_DTYPE_I32, n_axes, n_tok)
                               : ms_tensor_1d(e->pos_dev, MS_DTYPE_I32, n_tok);
    /* [prompt logprobs] the rows of every prompt token a request asks logprobs of, after the
       segments' own last rows (eng_plp_rows): logits [n + n_plp, vocab], sampled over n */
    const int32_t n_plp = sample && !sd->all_logits && !cross ? eng_plp_rows(e, n) : 0;
    ms_tensor plp_rows = ms_tensor_1d(e->plp_rows_dev, MS_DTYPE_I32, n + n_plp);
    if (n_plp > 0)
        MS_TRY(f->copy_to_backend(cx, e->plp_rows_dev, e->plp_rows_host,
                                  (size_t)(n + n_plp) * sizeof(int32_t), err));
    ms_tensor logits = ms_tensor_2d(e->logits_dev, MS_DTYPE_F32, n + n_plp, e->facts.vocab);
    /* a node returning hidden states: every token's row, and its shaped input staged */
    const bool hidden = nd->node->hidden_width != NULL;
    if (hidden)
        logits = ms_tensor_2d(e->hidden_dev, MS_DTYPE_F32, n_tok,
                              nd->node->hidden_width(e->config));
    ms_tensor input;
    memset(&input, 0, sizeof input);
    if (nd->node->input_shape != NULL) {
        int64_t rows = 0, cols = 0;
        nd->node->input_shape(e->config, &rows, &cols);
        if (rows == -1) /* the context rows of this step */
            rows = nd->ctx_rows;
        else if (rows == -2 || rows == -3) { /* [inputs_embeds] a row per token
                                                (ms_engine_run_rows), [codes] of ids */
            if (!e->rows_staged || e->codes_staged != (rows == -3))
                return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                               "step %s: node %s reads a row %s per token, not token ids: run "
                               "it through %s", sd->name, nd->node->name,
                               rows == -3 ? "of codes" : "(inputs_embeds)",
                               rows == -3 ? "ms_engine_run_codes" : "ms_engine_run_rows");
            rows = n_tok;
        }
        input = ms_tensor_2d(e->input_dev, e->codes_staged ? MS_DTYPE_I32 : MS_DTYPE_F32, rows,
                             cols);
    }
    ms_tensor out_rows = ms_tensor_1d(e->out_rows_dev, MS_DTYPE_I32, n_tok);
    /* [inputs_embeds] the rows the head reads, for ms_engine_run_rows */
    ms_tensor last_hidden = ms_tensor_2d(e->last_hidden_dev, MS_DTYPE_F32, n,
                                         nd->facts.hidden);
    ms_md_forward_args args = eng_forward_args(e, &e->facts);
    args.kv = &nd->kv;
    args.batch = ap->batch;
    args.tokens = &tokens;
    args.positions = &pos;
    args.attn = ap->params;
    args.out_rows = sd->all_logits ? &out_rows : n_plp > 0 ? &plp_rows : NULL;
    args.logits = &logits;
    args.input = nd->node->input_shape != NULL ? &input : NULL;
    args.context_batch = cross ? nd->ctx_batch : NULL;
    args.cross_batch = cross ? nd->cross_batch : NULL;
    args.cross_attn = nd->cross_params;
    args.last_hidden = e->rows_staged ? &last_hidden : NULL;
    /* [graphs] eager, captured or replayed (graph_exec.h; e->gx NULL: eager) */
    MS_TRY(ms_graph_exec_forward(e->gx, gs, ctx, nd->node->forward, &args, err));
    const int sidx = nd->idx[MS_RESOURCE_SAMPLER];
    const ms_sample_row *rows = sidx >= 0 ? ctx->plan_results[sidx] : NULL;
    /* the logits come to the host when something here reads them (the caller of a step without
       sampling, prompt logprobs, CFG mixing, penalties: decided on step N's sampler records,
       before a pre-plan replans the sampler); otherwise they stay on the backend and
       ms_engine_last_logits copies them on first read: at batch 64 over a 128k vocabulary the
       copy was 33 MB a step (about 3 ms of host time on the H200, issue [G]) */
    const bool need_host = !sample || n_plp > 0 || sd->all_logits ||
                           (sidx >= 0 && ms_sample_res_needs_host(nd->sampler, sidx, step));
    /* [graphs] while the replay runs: step N is committed (its lengths are what step N+1 plans
       from) and step N+1 pre-planned into the other slot (graph_exec.h); the pre-plan plans
       the sampler again, so step N's sample rows are kept first */
    if (sample && rows != NULL && e->pre_rows != NULL && gs->padded && gs->leased &&
        !gs->capture && e->fork_stats.n_waiting == 0 && !hidden && n_plp == 0 && !need_host) {
        memcpy(e->pre_samples, rows, (size_t)gs->n_real * sizeof *rows);
        rows = e->pre_samples;
        MS_TRY(ms_step_runner_commit(nd->runner, admitted, ctx, err));
        *committed = true;
        MS_TRY(eng_preplan(e, nd, sd, gs, err));
    }
    if (hidden)
        return MS_OK; /* ms_engine_encode reads hidden_dev */
    e->logits_rows = n + n_plp;
    e->logits_on_host = false;
    if (need_host)
        MS_TRY(eng_logits_to_host(e, err));
    if (sample && e->plp_rows > 0)
        eng_plp_collect(e, n); /* [prompt logprobs] before penalties touch the rows */
    if (!sample)
        return MS_OK; /* ms_engine_run_step: the caller reads the logits */

    /* batched CFG: the sampler mixes each guided row with its unconditional row (host logits),
       and the mixed rows go back for the backend's sample call */
    int32_t n_mixed = 0;
    if (e->logits_on_host)
        ms_sample_res_mix(nd->sampler, sidx, step, e->logits_host, e->facts.vocab, &n_mixed);
    if (n_mixed > 0)
        MS_TRY(f->copy_to_backend(cx, e->logits_dev, e->logits_host,
                                  (size_t)n * V * sizeof(float), err));

    /* [graphs] padding rows (one segment each, after the real ones) sample nothing */
    const int32_t n_s = gs->padded ? gs->n_real : n;
    ms_tensor real_logits = ms_tensor_2d(e->logits_dev, MS_DTYPE_F32, n_s, e->facts.vocab);
    ms_tensor ids = ms_tensor_1d(e->ids_dev, MS_DTYPE_I32, n_s);
    MS_TRY(f->sample(cx, &real_logits, rows, e->sample_ws, e->sample_ws_bytes, &ids, err));
    MS_TRY(f->copy_to_host(cx, e->ids_host, e->ids_dev, (size_t)n_s * sizeof(int32_t), err));
    if (e->tps != NULL) /* [tp] rank 0's ids on every rank */
        MS_TRY(ms_tp_share_ids(e->tps, e->ids_host, n_s, err));
    return MS_OK;
}

/* Run the step declared in e->build over gs's rows of node nd (tokens packed; [graphs] real rows
 * first, padding up to gs->n_rows): admit -> plan -> forward (-> sampling of the real rows when
 * `sample`) -> commit. A failure after admit abandons the step. eng_run_built then resets the
 * padding rows either way. */
static ms_status eng_run_built_rows(ms_engine *e, eng_node *nd, const ms_md_step *sd,
                                    const ms_graph_step *gs, bool sample, ms_error *err);

static ms_status eng_run_built(ms_engine *e, eng_node *nd, const ms_md_step *sd,
                               const ms_graph_step *gs, bool sample, ms_error *err) {
    ms_status st = eng_run_built_rows(e, nd, sd, gs, sample, err);
    ms_graph_exec_done(e->gx, gs); /* [graphs] padding rows reset, pages kept */
    return st;
}

static ms_status eng_run_built_rows(ms_engine *e, eng_node *nd, const ms_md_step *sd,
                                    const ms_graph_step *gs, bool sample, ms_error *err) {
    ms_step *step = &e->build.step;
    ms_step_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.request_ids = e->rids;
    ctx.n_rows = gs->n_rows;
    ctx.n_real = gs->n_real;
    ctx.lease = gs->leased ? &gs->lease : NULL;
    ctx.capture = gs->capture;
    bool committed = false;
    if (gs->preplanned) { /* [graphs] admitted and planned while the last step ran */
        ctx = e->taken_ctx;
        ms_status st = eng_forward_sample(e, nd, sd, &ctx, gs, sample, e->taken_step,
                                          &committed, err);
        if (st != MS_OK && !committed)
            ms_step_runner_abandon(nd->runner, e->taken_step, &ctx);
        if (st != MS_OK || committed)
            return st;
        return ms_step_runner_commit(nd->runner, e->taken_step, &ctx, err);
    }
    ms_admit_outcome o = ms_step_runner_admit(nd->runner, step, &ctx);
    if (o.code == MS_ADMIT_PAGES_SHORT && e->pcache != NULL &&
        ms_prefix_cache_evict(e->pcache, o.pages_short) >= o.pages_short)
        o = ms_step_runner_admit(nd->runner, step, &ctx); /* [prefix] LRU cached pages made room */
    if (o.code != MS_ADMIT_OK) {
        if (o.code == MS_ADMIT_PAGES_SHORT) {
            e->short_rid = o.rid; /* [kv pressure] eng_kv_make_room reads it */
            return MS_FAIL(err, MS_ERR_CAPACITY,
                           "step %s: KV pages short by %d for request %llu (raise kv_pages)",
                           sd->name, (int)o.pages_short, (unsigned long long)o.rid);
        }
        return MS_FAIL(err, MS_ERR_INTERNAL, "step %s: admit failed (%s) at resource %d",
                       sd->name, ms_admit_code_str(o.code), (int)o.resource);
    }
    MS_TRY(ms_step_runner_plan(nd->runner, step, &ctx, err));
    ms_status st = eng_forward_sample(e, nd, sd, &ctx, gs, sample, step, &committed, err);
    if (st != MS_OK && !committed) {
        ms_step_runner_abandon(nd->runner, step, &ctx);
        return st;
    }
    if (st != MS_OK || committed)
        return st; /* [graphs] committed before the pre-plan */
    return ms_step_runner_commit(nd->runner, step, &ctx, err);
}

ms_status ms_engine_run_step(ms_engine *e, ms_rid rid, const char *step_name,
                             const int32_t *tokens, int32_t n_tokens, const float **logits,
                             int32_t *n_rows, ms_error *err) {
    *logits = NULL;
    *n_rows = 0;
    ms_graph_exec_preplan_drop(e->gx); /* [graphs] it touches the runner */
    if (e->tpg != NULL) /* [tp] */
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "run_step: not with tensor parallelism");
    eng_req *r = eng_find_req(e, rid, NULL);
    if (r == NULL || !r->in_runner || r->finish != MS_FINISH_NONE)
        return MS_FAIL(err, MS_ERR_NOT_FOUND, "run step %s: request %llu is not running",
                       step_name, (unsigned long long)rid);
    /* the step of that name in the first node declaring one */
    int32_t k = -1;
    eng_node *nd = NULL;
    for (int32_t ni = 0; ni < e->n_nodes && k < 0; ni++)
        for (int32_t i = 0; i < e->nodes[ni].node->n_steps && k < 0; i++)
            if (strcmp(e->nodes[ni].node->steps[i].name, step_name) == 0) {
                k = i;
                nd = &e->nodes[ni];
            }
    if (k < 0)
        return MS_FAIL(err, MS_ERR_NOT_FOUND, "model %s has no step '%s'", e->desc->name,
                       step_name);
    const ms_md_step *sd = &nd->node->steps[k];
    if (sd->n_segments != 1 || sd->labels[0] != MS_LABEL_MAIN)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                       "run step %s: only steps over the main stream alone run this way",
                       sd->name);
    if (nd->scratch != NULL) /* [scratch] */
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "run step %s: node %s attends over a scratch KV "
                       "and reads rows: run it through ms_engine_run_rows", sd->name,
                       nd->node->name);
    if (n_tokens < 1 || n_tokens > e->max_tokens || tokens == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "run step %s: %d tokens (1 .. max_tokens %d)",
                       sd->name, (int)n_tokens, (int)e->max_tokens);
    for (int32_t i = 0; i < n_tokens; i++)
        if (tokens[i] < 0 || tokens[i] >= e->facts.vocab)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "run step %s: token %d at index %d is outside the vocabulary [0, %d)",
                           sd->name, (int)tokens[i], (int)i, (int)e->facts.vocab);
    ms_md_row row;
    memset(&row, 0, sizeof row);
    row.rid = rid;
    row.len[MS_LABEL_MAIN] = n_tokens;
    e->rows[0] = row;
    e->row_reqs[0] = r;
    e->rids[0] = rid;
    MS_TRY(sd->run(e->config, e->rows, 1, &e->build, err));
    if (e->build.n_tokens != n_tokens)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "run step %s: it declares %d tokens, %d given",
                       sd->name, (int)e->build.n_tokens, (int)n_tokens);
    if (r->longest + r->n_out + n_tokens > e->facts.max_context)
        return MS_FAIL(err, MS_ERR_LIMIT, "run step %s: %d more tokens pass the model's context "
                       "(%d positions)", sd->name, (int)n_tokens, (int)e->facts.max_context);
    memcpy(e->tokens_host, tokens, (size_t)n_tokens * sizeof(int32_t));
    for (size_t i = 0; i < e->n_reqs; i++)
        e->reqs[i]->row = -1;
    ms_graph_step gs = {.step = k, .n_real = 1, .n_rows = 1}; /* eager, unpadded */
    MS_TRY(eng_run_built(e, nd, sd, &gs, false, err));
    if (e->build.kv.commit)
        r->longest += n_tokens; /* the stream grew outside its walk */
    r->no_seal = true; /* [prefix] its KV no longer follows prompt ++ output */
    r->row = 0;
    *logits = e->logits_host;
    *n_rows = sd->all_logits ? n_tokens : 1;
    return MS_OK;
}

/* ---- [inputs_embeds] [codes] a step over the rows or ids the caller gives (engine.h); a
 * [scratch] node's through eng_run_scratch (engine_scratch.c) ---- */

/* [inputs_embeds] see engine.h */
const ms_md_facts *ms_engine_node_facts(const ms_engine *e, const char *name) {
    for (int32_t i = 0; i < e->n_nodes; i++)
        if (name != NULL && strcmp(e->nodes[i].node->name, name) == 0)
            return &e->nodes[i].facts;
    return NULL;
}

const struct ms_ckpt *ms_engine_checkpoint(const ms_engine *e) { return e->ck; }

const ms_model_desc *ms_engine_desc(const ms_engine *e) { return e->desc; }

int32_t ms_engine_max_seqs(const ms_engine *e) { return e->max_seqs; }

/* [inputs_embeds] ms_engine_run_rows (rows: f32 rows) and [codes] ms_engine_run_codes (codes:
 * int32 ids, token-major, staged codebook-major): see engine.h */
ms_status eng_run_input(ms_engine *e, const char *node, const char *step_name,
                        const ms_rid *rids, const int32_t *spans, int32_t n,
                        const float *rows, const int32_t *codes, int64_t width,
                        const int32_t *row_codes, int64_t row_groups,
                        const float **logits, const float **hidden,
                        const int32_t **picked, ms_error *err) {
    const bool ids = codes != NULL;
    if (picked != NULL)
        *picked = NULL;
    const char *verb = ids ? "run codes" : "run rows";
    *logits = NULL;
    ms_graph_exec_preplan_drop(e->gx); /* [graphs] it touches the runner */
    if (hidden != NULL)
        *hidden = NULL;
    if (e->tpg != NULL) /* [tp] the ranks replay add, step and remove only */
        return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                       "run_rows: not with tensor parallelism (--tp %d)",
                       (int)ms_tp_group_world(e->tpg));
    eng_node *nd = NULL;
    for (int32_t ni = 0; ni < e->n_nodes && nd == NULL; ni++)
        if (strcmp(e->nodes[ni].node->name, node) == 0)
            nd = &e->nodes[ni];
    if (nd == NULL)
        return MS_FAIL(err, MS_ERR_NOT_FOUND, "model %s has no node '%s'", e->desc->name, node);
    int64_t in_rows = 0, in_cols = 0;
    if (nd->node->input_shape != NULL)
        nd->node->input_shape(e->config, &in_rows, &in_cols);
    const bool scratch = nd->scratch != NULL; /* [scratch] returns hidden rows */
    if (in_rows != (ids ? -3 : -2) || (nd->node->hidden_width != NULL && !scratch))
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "node %s does not read %s: %s", node,
                       ids ? "a row of codes per token" : "a row per token (inputs_embeds)",
                       in_rows == -3   ? "run its steps through ms_engine_run_codes"
                       : in_rows == -2 ? "run its steps through ms_engine_run_rows"
                                       : "run its steps on token ids");
    if (scratch && hidden == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s %s.%s: the node returns hidden rows: "
                       "pass `hidden`", verb, node, step_name);
    if (picked != NULL && !scratch && nd->sampler == NULL)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s %s.%s: the node has no sampler to pick "
                       "ids with", verb, node, step_name);
    int32_t k = -1;
    for (int32_t i = 0; i < nd->node->n_steps && k < 0; i++)
        if (strcmp(nd->node->steps[i].name, step_name) == 0)
            k = i;
    if (k < 0)
        return MS_FAIL(err, MS_ERR_NOT_FOUND, "node %s has no step '%s'", node, step_name);
    const ms_md_step *sd = &nd->node->steps[k];
    if (sd->n_segments != 1 || sd->labels[0] != MS_LABEL_MAIN)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                       "%s %s: only steps over the main stream alone run this way",
                       verb, sd->name);
    if (e->pcache != NULL)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s %s.%s: the prefix cache keys pages on "
                       "token ids, which rows are not: turn options.prefix_cache off", verb, node,
                       sd->name);
    if (width != in_cols || (rows == NULL && codes == NULL))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s %s.%s: rows of width %lld given, the "
                       "node reads %lld", verb, node, sd->name, (long long)width, (long long)in_cols);
    /* [scratch] a node reading a row of ids per token besides its rows takes both */
    const int64_t row_cols = nd->node->codes_width != NULL ? nd->node->codes_width(e->config) : 0;
    if (row_cols > 0 && row_codes == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s %s.%s: the node reads a row of %lld codes per "
                       "token besides its rows: run it through ms_engine_run_rows_codes_pick",
                       verb, node, sd->name, (long long)row_cols);
    if (row_codes != NULL && row_cols == 0)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s %s.%s: the node reads no codes besides its "
                       "rows", verb, node, sd->name);
    if (row_codes != NULL && row_groups != row_cols)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s %s.%s: rows of %lld codes given, the node "
                       "reads %lld", verb, node, sd->name, (long long)row_groups,
                       (long long)row_cols);
    if (n < 1 || n > e->max_seqs)
        return MS_FAIL(err, MS_ERR_CAPACITY, "%s %s.%s: %d requests (1 .. max_seqs %d)",
                       verb, node, sd->name, (int)n, (int)e->max_seqs);
    int64_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        eng_req *r = eng_find_req(e, rids[i], NULL);
        if (r == NULL || !r->in_runner || r->finish != MS_FINISH_NONE)
            return MS_FAIL(err, MS_ERR_NOT_FOUND, "%s %s.%s: request %llu is not running",
                           verb, node, sd->name, (unsigned long long)rids[i]);
        for (int32_t j = 0; j < i; j++)
            if (rids[j] == rids[i])
                return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s %s.%s: request %llu given "
                               "twice", verb, node, sd->name, (unsigned long long)rids[i]);
        if (spans[i] < 1)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s %s.%s: request %llu: %d rows "
                           "(at least 1)", verb, node, sd->name, (unsigned long long)rids[i],
                           (int)spans[i]);
        if (!scratch && r->longest + spans[i] > nd->facts.max_context)
            return MS_FAIL(err, MS_ERR_LIMIT, "%s %s.%s: request %llu: %d more rows pass "
                           "the node's context (%d positions)", verb, node, sd->name,
                           (unsigned long long)rids[i], (int)spans[i],
                           (int)nd->facts.max_context);
        total += spans[i];
        ms_md_row row;
        memset(&row, 0, sizeof row);
        row.rid = rids[i];
        row.len[MS_LABEL_MAIN] = spans[i];
        e->rows[i] = row;
        e->row_reqs[i] = r;
        e->rids[i] = rids[i];
    }
    if (total > e->max_tokens)
        return MS_FAIL(err, MS_ERR_CAPACITY, "%s %s.%s: %lld rows in one step, above "
                       "max_tokens %d (raise max_tokens)", verb, node, sd->name, (long long)total,
                       (int)e->max_tokens);
    MS_TRY(sd->run(e->config, e->rows, n, &e->build, err));
    if (e->build.n_tokens != total)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s %s.%s: it declares %d tokens, %lld "
                       "rows given", verb, node, sd->name, (int)e->build.n_tokens, (long long)total);
    /* the rows are the tokens' input; the ids the forward never reads are 0 */
    memset(e->tokens_host, 0, (size_t)total * sizeof(int32_t));
    if (ids) {
        /* [codes] each code in [0, vocab); staged codebook-major (column c of the T rows at
           c * T, what the forward's embedding(table, codes, column = c) reads contiguously) */
        int32_t *st = (int32_t *)(void *)e->input_host;
        for (int64_t t = 0; t < total; t++)
            for (int64_t c = 0; c < width; c++) {
                const int32_t v = codes[t * width + c];
                if (v < 0 || v >= nd->facts.vocab)
                    return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s %s.%s: row %lld, column %lld: "
                                   "code %d is outside [0, %d)", verb, node, sd->name,
                                   (long long)t, (long long)c, (int)v, (int)nd->facts.vocab);
                st[c * total + t] = v;
            }
        MS_TRY(e->be.iface.copy_to_backend(e->be.ctx, e->input_dev, st,
                                           (size_t)total * (size_t)width * sizeof(int32_t), err));
    } else {
        MS_TRY(e->be.iface.copy_to_backend(e->be.ctx, e->input_dev, rows,
                                           (size_t)total * (size_t)width * sizeof(float), err));
    }
    if (row_codes != NULL) {
        /* [scratch] the ids besides the rows, each in [0, the model's vocabulary) (the frame's
           codes, embedded by the forward), staged codebook-major as [codes] */
        for (int64_t t = 0; t < total; t++)
            for (int64_t c = 0; c < row_cols; c++) {
                const int32_t v = row_codes[t * row_cols + c];
                if (v < 0 || v >= e->facts.vocab)
                    return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s %s.%s: row %lld, column %lld: "
                                   "code %d is outside [0, %d)", verb, node, sd->name,
                                   (long long)t, (long long)c, (int)v, (int)e->facts.vocab);
                e->codes_host[c * total + t] = v;
            }
        MS_TRY(e->be.iface.copy_to_backend(e->be.ctx, e->codes_dev, e->codes_host,
                                           (size_t)total * (size_t)row_cols * sizeof(int32_t),
                                           err));
    }
    for (size_t i = 0; i < e->n_reqs; i++)
        e->reqs[i]->row = -1;
    if (scratch) {
        /* [scratch] request i is batch row i: a frame's steps list the same requests in the
           same order (the scratch refuses a row continuing another request's frame); every
           request's last row is returned */
        if (picked != NULL)
            for (int32_t i = 1; i < n; i++)
                if (spans[i] != spans[0])
                    return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s %s.%s: picking ids from a "
                                   "scratch node's last rows takes one span for every request "
                                   "(request %llu brings %d rows, the first %d)", verb, node,
                                   sd->name, (unsigned long long)rids[i], (int)spans[i],
                                   (int)spans[0]);
        MS_TRY(eng_run_scratch(e, nd, sd, n, spans, err));
        const int64_t w = nd->node->hidden_width(e->config);
        if (picked != NULL) {
            /* [scratch] greedy: the backend's batched sample over each request's last row
               (rows spans[0] apart in hidden_dev), in place on the backend */
            ms_sample_row srows[MS_ENGINE_MAX_PICK];
            if (n > MS_ENGINE_MAX_PICK)
                return MS_FAIL(err, MS_ERR_CAPACITY, "%s %s.%s: %d requests to pick for (at "
                               "most %d)", verb, node, sd->name, (int)n, MS_ENGINE_MAX_PICK);
            for (int32_t i = 0; i < n; i++)
                srows[i] = (ms_sample_row){.params = ms_sampling_greedy()};
            ms_tensor last = ms_tensor_2d(e->hidden_dev + (size_t)(spans[0] - 1) * (size_t)w,
                                          MS_DTYPE_F32, n, w);
            last.stride[0] = (int64_t)spans[0] * w;
            ms_tensor ids_t = ms_tensor_1d(e->ids_dev, MS_DTYPE_I32, n);
            MS_TRY(e->be.iface.sample(e->be.ctx, &last, srows, e->sample_ws, e->sample_ws_bytes,
                                      &ids_t, err));
            MS_TRY(e->be.iface.copy_to_host(e->be.ctx, e->ids_host, e->ids_dev,
                                            (size_t)n * sizeof(int32_t), err));
            *picked = e->ids_host;
        }
        int64_t t = 0;
        for (int32_t i = 0; i < n; i++) {
            t += spans[i];
            MS_TRY(e->be.iface.copy_to_host(e->be.ctx, e->last_hidden_host + (size_t)i * (size_t)w,
                                            e->hidden_dev + (size_t)(t - 1) * (size_t)w,
                                            (size_t)w * sizeof(float), err));
        }
        *hidden = e->last_hidden_host;
        return MS_OK;
    }
    ms_graph_step gs = {.step = k, .n_real = n, .n_rows = n}; /* eager, unpadded */
    e->rows_staged = true;
    e->codes_staged = ids;
    /* [codes] with `picked`: the node's sampler picks each request's id from its last row's
       logits on the backend (the requests' own sampling settings) */
    ms_status st = eng_run_built(e, nd, sd, &gs, picked != NULL, err);
    e->rows_staged = e->codes_staged = false;
    MS_TRY(st);
    if (picked != NULL)
        *picked = e->ids_host;
    for (int32_t i = 0; i < n; i++) {
        eng_req *r = e->row_reqs[i];
        if (e->build.kv.commit)
            r->longest += spans[i]; /* the stream grew outside its walk */
        r->no_seal = true;           /* [prefix] its KV follows no ids */
        r->row = i;
    }
    if (hidden != NULL) {
        MS_TRY(e->be.iface.copy_to_host(e->be.ctx, e->last_hidden_host, e->last_hidden_dev,
                                        (size_t)n * (size_t)nd->facts.hidden * sizeof(float),
                                        err));
        *hidden = e->last_hidden_host;
    }
    /* a picking step left its logits on the backend (eng_forward_sample): the caller reads them */
    MS_TRY(eng_logits_to_host(e, err));
    *logits = e->logits_host;
    return MS_OK;
}

/* [inputs_embeds] see engine.h */
ms_status ms_engine_run_rows(ms_engine *e, const char *node, const char *step_name,
                             const ms_rid *rids, const int32_t *spans, int32_t n,
                             const float *rows, int64_t width, const float **logits,
                             const float **hidden, ms_error *err) {
    return eng_run_input(e, node, step_name, rids, spans, n, rows, NULL, width, NULL, 0, logits,
                         hidden, NULL, err);
}

/* [codes] see engine.h */
ms_status ms_engine_run_codes(ms_engine *e, const char *node, const char *step_name,
                              const ms_rid *rids, const int32_t *spans, int32_t n,
                              const int32_t *codes, int64_t groups, const float **logits,
                              const float **hidden, ms_error *err) {
    *logits = NULL;
    if (hidden != NULL)
        *hidden = NULL;
    if (codes == NULL) /* eng_run_input tells the two apart by codes != NULL */
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "run codes %s.%s: no codes given", node,
                       step_name);
    return eng_run_input(e, node, step_name, rids, spans, n, NULL, codes, groups, NULL, 0,
                         logits, hidden, NULL, err);
}

/* [codes] see engine.h */
ms_status ms_engine_run_codes_pick(ms_engine *e, const char *node, const char *step_name,
                                   const ms_rid *rids, const int32_t *spans, int32_t n,
                                   const int32_t *codes, int64_t groups, const int32_t **picked,
                                   const float **logits, const float **hidden, ms_error *err) {
    *logits = NULL;
    if (hidden != NULL)
        *hidden = NULL;
    if (picked == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "run codes %s.%s: no place for the picked ids",
                       node, step_name);
    *picked = NULL;
    if (codes == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "run codes %s.%s: no codes given", node,
                       step_name);
    return eng_run_input(e, node, step_name, rids, spans, n, NULL, codes, groups, NULL, 0,
                         logits, hidden, picked, err);
}

/* ---- the engine step (ms_engine_step, on every [tp] rank: engine_tp.c); [encoder] steps:
 * eng_step_encode (engine_dense.c) ---- */

ms_status eng_step(ms_engine *e, ms_engine_step_info *info, ms_error *err) {
    ms_engine_step_info inf = {0, 0, 0};
    if (info != NULL)
        *info = inf;
    const ms_model_desc *d = e->desc;
    /* [graphs] a pre-plan does not outlive a fork about to take its rows' KV */
    if (e->fork_stats.n_waiting > 0)
        ms_graph_exec_preplan_drop(e->gx);
    /* 0. [kv pressure] offloaded requests come back first when pages allow */
    MS_TRY(eng_kv_reload(e, err));
    for (size_t i = 0; i < e->n_reqs; i++)
        e->reqs[i]->kv_wait = false;
    eng_fork_poll(e); /* [fork] forks whose parent's KV is ready, or gone */

    /* 1. the scheduler picks the step: requests waiting at each step of each node (the
       scheduler's index of node i's step k is nodes[i].step0 + k) */
    int32_t waiting[MS_MD_MAX_NODES * MS_MD_MAX_STEPS] = {0};
    bool in_loop[MS_MD_MAX_NODES * MS_MD_MAX_STEPS] = {false};
    for (size_t i = 0; i < e->n_reqs; i++) {
        eng_req *r = e->reqs[i];
        r->row = -1;
        if (r->finish != MS_FINISH_NONE || r->fork_of != 0) /* [fork] waiting: not a row */
            continue;
        ms_md_walk_item it = ms_walk_item(d, r->walk);
        if (it.step >= 0) {
            int32_t k = e->nodes[it.node].step0 + it.step;
            waiting[k]++;
            in_loop[k] = in_loop[k] || ms_walk_in_loop(d, r->walk);
        }
    }
    int32_t k = ms_walk_pick(&e->sched, waiting, in_loop, e->n_sched_steps);
    if (k < 0)
        return MS_OK;
    ms_md_walk_item item = {e->n_nodes - 1, 0};
    while (e->nodes[item.node].step0 > k)
        item.node--;
    item.step = k - e->nodes[item.node].step0;
    eng_node *nd = &e->nodes[item.node];
    const ms_md_step *sd = &nd->node->steps[item.step];
    if (nd->node->hidden_width != NULL)
        return eng_step_encode(e, nd, item, info, err);

    /* 2. its rows, and the declaration from the generated step runner; [kv pressure] a
       page-short admit makes room (eng_kv_make_room) and the rows are built again */
    int32_t n;
    ms_graph_step gs;
    for (;;) {
        n = eng_rows(e, item, &inf.n_prefill);
        if (n == 0)
            return MS_OK;
        /* [graphs] a batch a captured bucket covers is padded with dummy rows (graph_exec.h; a
           model of several nodes has no graphs: e->gx NULL leaves the batch as it is) */
        ms_graph_exec *gx = e->gx;
        for (int32_t j = 0; gx != NULL && sd->capture_by_tokens && j < n; j++)
            if (e->row_reqs[j]->plp != NULL) { /* prompt logprobs: other logits rows, eager */
                ms_graph_exec_preplan_drop(gx);
                gx = NULL;
            }
        MS_TRY(ms_graph_exec_pad(gx, item.step, e->rows, e->rids, n, e->max_seqs, &gs, err));
        for (int32_t j = n; j < gs.n_rows; j++)
            e->row_reqs[j] = NULL;
        MS_TRY(sd->run(e->config, e->rows, gs.n_rows, &e->build, err));
        /* [graphs] the pending pre-plan is taken for the identical batch, else refused */
        MS_TRY(ms_graph_exec_preplan_take(e->gx, &gs, &e->build.step, e->rids, &e->taken_ctx,
                                          &e->taken_step, err));
        MS_TRY(eng_pack_tokens(e, nd, item.step, err));
        e->short_rid = 0;
        ms_status st = eng_run_built(e, nd, sd, &gs, true, err);
        if (st == MS_OK)
            break;
        if (st != MS_ERR_CAPACITY || e->short_rid == 0)
            return st;
        MS_TRY(eng_kv_make_room(e, nd, item, n, err));
    }

    /* 6. each request's walk moves on: prompts consumed, ids appended, stops */
    const ms_md_step_build *b = &e->build;
    for (int32_t i = 0; i < b->step.n_segments; i++) {
        eng_req *r = e->row_reqs[b->seg_row[i]];
        if (r == NULL)
            continue; /* [graphs] padding */
        if (!ms_walk_in_loop(d, r->walk))
            r->consumed[b->segments[i].label] += b->segments[i].span;
        if (r->row < 0)
            r->row = i; /* the row's first segment: its logits (mixed for a CFG pair), its id */
    }
    for (int32_t j = 0; j < n; j++) {
        eng_req *r = e->row_reqs[j];
        eng_prefix_seal(e, r); /* [prefix] its newly full pages, committed by this step */
        eng_fork_resolve(e, r); /* [fork] before it may finish: its forks take its prompt KV */
        if (!e->rows[j].sample)
            continue; /* a prompt chunk: the request stays at this step */
        ms_walk_pos prev = r->walk;
        ms_walk_advance(d, &r->walk);
        if (!ms_walk_in_loop(d, prev) && !ms_walk_in_loop(d, r->walk))
            memset(r->consumed, 0, sizeof r->consumed); /* the next prefix step reads again */
        if (r->row < 0)
            continue;
        int32_t id = e->ids_host[r->row];
        if (r->max_new == 0) { /* [prompt logprobs] a prompt scored, nothing generated */
            eng_finish(e, r, MS_FINISH_LENGTH);
            continue;
        }
        if (id == MS_SAMPLE_ID_NAN) { /* NaN logits: this request fails alone */
            eng_finish(e, r, MS_FINISH_ERROR);
            continue;
        }
        r->out[r->n_out++] = id;
        if (!r->ignore_eos && eng_is_eos(e, id))
            eng_finish(e, r, MS_FINISH_EOS);
        else if (r->n_out >= r->max_new)
            eng_finish(e, r, MS_FINISH_LENGTH);
        else if (r->longest + r->n_out > e->facts.max_context)
            eng_finish(e, r, MS_FINISH_CONTEXT); /* the next token would sit at max_context */
        else if (ms_walk_step(d, r->walk) < 0)
            eng_finish(e, r, MS_FINISH_LENGTH);  /* a walk without a loop ended */
    }
    inf.n_seqs = n;
    inf.n_tokens = b->n_tokens - gs.n_pad_tokens; /* [graphs] the padding rows' tokens */
    if (info != NULL)
        *info = inf;
    return MS_OK;
}

/* ---- [graphs] the captured path at start-up (graph_exec.h) ---- */

/* [graphs] Pre-plan step N+1 (graph_exec.h, ms_graph_exec_preplan_*) over step N's real rows,
 * each continuing with one token, after step N (gs) was launched and committed. */
static ms_status eng_preplan(ms_engine *e, eng_node *nd, const ms_md_step *sd,
                             const ms_graph_step *gs, ms_error *err) {
    (void)nd;
    memcpy(e->pre_rows, e->rows, (size_t)gs->n_real * sizeof *e->rows);
    ms_graph_step pgs;
    MS_TRY(ms_graph_exec_preplan_pad(e->gx, gs, e->pre_rows, e->max_seqs, &pgs));
    if (!pgs.preplan)
        return MS_OK;
    /* the rows step N was declared over: declaring them again cannot fail but for a bug */
    MS_TRY(sd->run(e->config, e->pre_rows, pgs.n_rows, &e->pre_build, err));
    ms_graph_exec_preplan_run(e->gx, &pgs, &e->pre_build.step);
    return MS_OK;
}

/* One step over dummy rows only (ms_graph_exec_run_fn): warm-up or capture; samples nothing. */
static ms_status eng_graph_run(void *user, const ms_graph_step *gs, ms_md_row *rows,
                               ms_rid *rids, ms_error *err) {
    ms_engine *e = user;
    (void)rids; /* e->rids: the capture fills the engine's own row arrays */
    eng_node *nd = &e->nodes[0]; /* graphs serve models of one node (eng_graphs_wanted) */
    const ms_md_step *sd = &nd->node->steps[gs->step];
    for (int32_t j = 0; j < gs->n_rows; j++)
        e->row_reqs[j] = NULL;
    MS_TRY(sd->run(e->config, rows, gs->n_rows, &e->build, err));
    MS_TRY(eng_pack_tokens(e, nd, gs->step, err));
    return eng_run_built(e, nd, sd, gs, false, err);
}

static ms_status eng_graphs_init(ms_engine *e, ms_error *err) {
    if (e->opt.graphs < 0 || e->opt.graphs >= MS_GRAPH_MODE_COUNT)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "engine: graphs mode %d", (int)e->opt.graphs);
    if (eng_graphs_wanted(e)) {
        eng_node *nd = &e->nodes[0];
        ms_graph_exec_config gc = {.mode = e->opt.graphs, .node = nd->node, .be = &e->be,
                                   .runner = nd->runner, .max_rows = e->max_seqs,
                                   .max_tokens = eng_graph_max_tokens(e, nd),
                                   .n_pages = nd->kv_pages, .kv_resource = nd->idx[MS_RESOURCE_KV],
                                   .preplan = eng_preplan_wanted(e)};
        MS_TRY(ms_graph_exec_init(&e->gx, &gc, err));
        if (e->gx != NULL && gc.preplan) {
            e->pre_rows = ms_calloc((size_t)e->max_seqs, sizeof *e->pre_rows);
            e->pre_samples = ms_calloc((size_t)e->max_seqs, sizeof *e->pre_samples);
            if (e->pre_rows == NULL || e->pre_samples == NULL)
                return MS_FAIL(err, MS_ERR_OOM, "graphs: out of memory for the pre-plan");
            MS_TRY(ms_md_step_build_init(&e->pre_build, e->max_seqs, e->buf_tokens, err));
        }
        MS_TRY(ms_graph_exec_capture(e->gx, eng_graph_run, e, e->rows, e->rids, e->max_seqs,
                                     err));
        /* the dummy rows hold their pages from their warm-up on */
        nd->pages_free_initial = ms_page_arena_num_free(nd->arena);
    }
    return MS_OK;
}

void ms_engine_graph_stats(const ms_engine *e, ms_graph_exec_stats *st) {
    ms_graph_exec_get_stats(e->gx, st);
}

const ms_graph_exec *ms_engine_graphs(const ms_engine *e) { return e != NULL ? e->gx : NULL; }

size_t ms_engine_kv_bytes(const ms_engine *e) {
    const ms_paged_kv *kv = &e->nodes[0].kv; /* the first node's arena */
    return (size_t)kv->n_layers * (size_t)kv->n_pages * 2 * (size_t)kv->page_size *
           (size_t)kv->n_kv_heads * (size_t)kv->head_dim * ms_dtype_size(kv->dtype);
}

ms_status ms_engine_kv_copy(ms_engine *e, void *host, size_t bytes, ms_error *err) {
    if (e->nodes[0].kv.data == NULL) /* [encoder] a dense node has no arena */
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "kv copy: node %s has no KV arena",
                       e->nodes[0].node->name);
    if (host == NULL || bytes != ms_engine_kv_bytes(e))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "kv copy: %zu bytes given, the arena has %zu",
                       bytes, ms_engine_kv_bytes(e));
    return e->be.iface.copy_to_host(e->be.ctx, host, e->nodes[0].kv.data, bytes, err);
}

/* ---- the sampler resource, for the server's per-request extras (engine.h) ---- */

struct ms_sample_res *ms_engine_sampler(ms_engine *e) {
    /* the node that samples (Whisper's decoder, a decoder-only model's only node) */
    for (int32_t i = 0; i < e->n_nodes; i++)
        if (e->nodes[i].sampler != NULL)
            return e->nodes[i].sampler;
    return NULL;
}
