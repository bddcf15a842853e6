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
#include "engine.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "attn_plan.h"
#include "backend.h"
#include "checkpoint.h"
#include "device.h"
#include "graph_exec.h"
#ifdef MS_HAVE_CUDA
#include "backend_cuda.h"
#include "device_cuda.h"
#endif
#include "kv_pool.h"
#include "model_probe.h"
#include "page_arena.h"
#include "positions.h"
#include "rid_map.h"
#include "sample_res.h"
#include "walk.h"
#include "step_runner.h"

/* ---- engine-side resources: attention staging and the sampler ---- */

/*
 * Attention resource (kind MS_RESOURCE_ATTN) of the engine: the runner's attention resource
 * (attn_plan.h: kernel choice per plan label, causal flag, persistent host plan buffers) plus the
 * backend staging: at plan it stages the step's KV plan into the backend's attention batch (fixed
 * addresses, allocates nothing) and files itself as the plan result, so the forward reads the
 * batch and the attention plan entry.
 */
typedef struct eng_attn {
    ms_attn *inner;                    /* the runner's attention resource (owned) */
    const ms_backend *be;
    ms_attn_batch *batch;              /* backend-owned, made at init for the worst case */
    const ms_paged_kv *kv;
    int kv_index;                      /* resource index of the KV pool */
    const ms_attn_plan_entry *entry;   /* plan result: the main label's attention plan */
    int32_t n_q_heads;                 /* query heads (the attention resource's q_heads) */
    float scale;                       /* logit scale */
    int32_t window;                    /* sliding window, 0 none */
    ms_attn_params params;             /* plan result: what every layer's attention runs with */
} eng_attn;

static ms_status eng_attn_plan(void *self, int index, const ms_step *step, ms_step_ctx *ctx,
                               const void **out, ms_error *err) {
    eng_attn *a = self;
    const ms_kv_plan_set *set = ctx->plan_results[a->kv_index];
    if (set == NULL || set->n_plans != 1)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                       "attention: step %s needs exactly one plan label (got %d)", step->name,
                       set == NULL ? 0 : (int)set->n_plans);
    const void *inner_out = NULL;
    MS_TRY(ms_attn_iface.plan(a->inner, index, step, ctx, &inner_out, err));
    const ms_attn_plan_set *ap = inner_out;
    a->entry = ms_attn_plan_find(ap, set->plans[0].plan_label);
    MS_ASSERT(a->entry != NULL);
    a->params = (ms_attn_params){.scale = a->scale, .window = a->window,
                                 .causal = a->entry->causal};
    /* staged and planned once per step: each layer's attention only launches */
    MS_TRY(ms_backend_attn_stage(a->be, a->batch, &set->plans[0], a->kv, a->n_q_heads,
                                 &a->params, err));
    *out = a;
    return MS_OK;
}

static void eng_attn_free(void *self) { (void)self; /* owned by the engine */ }

static const ms_resource_i eng_attn_iface = {
    .kind = MS_RESOURCE_ATTN,
    .plan = eng_attn_plan,
    .free = eng_attn_free,
};

/* ---- the engine ---- */

/* One request: its streams' prompts, its position in its walk, its output. */
typedef struct eng_req {
    ms_rid rid;
    int32_t *prompt[MS_MAX_LABELS];   /* [n_prompt[l]] owned copy per stream label, or NULL */
    int32_t n_prompt[MS_MAX_LABELS];
    int32_t consumed[MS_MAX_LABELS];  /* prompt tokens fed so far per stream */
    int32_t longest;                  /* longest prompt (the context check) */
    int32_t n_streams;                /* streams it holds (slots of max_seqs it takes) */
    ms_walk_pos walk;                 /* where it stands */
    int32_t *positions;               /* [n_axes * n_prompt[main]] explicit prompt ids, or NULL */
    int32_t n_position_axes;
    int32_t *out;                     /* [max_new] generated ids */
    int32_t n_out;
    int32_t max_new;
    int32_t chunk;                    /* prompt tokens per step, 0 = all */
    bool ignore_eos;
    bool in_runner;                   /* ingested into the resources and not yet removed */
    ms_finish_reason finish;
    int32_t row;                      /* logits row (segment) of its id in the last step, -1 */
} eng_req;

struct ms_engine {
    const ms_model_desc *desc;
    const ms_md_node *node;       /* the node the engine runs: desc->nodes[0] (n_nodes is 1) */
    ms_engine_options opt;
    ms_backend be;
    ms_hf_config *hf;
    void *config;                 /* [desc->config_size] */
    ms_md_facts facts;
    ms_ckpt *ck;

    /* weights: one slab, views per (entry, instance) */
    ms_dtype wdtype;              /* storage dtype of the weights: f32 on CPU, bf16 on CUDA */
    ms_dtype kvdtype;             /* KV arena dtype: f32 on CPU, bf16 on CUDA */
    void *wslab;
    size_t wslab_bytes;           /* bytes of wslab */
    ms_tensor *weights;           /* [n_instances] */
    int32_t *woff;                /* [n_weights] first instance of entry w */

    /* RoPE */
    float *inv_freq;              /* backend memory [rotary_dim / 2] */
    ms_rope_table rope;

    /* KV and resources */
    ms_device *dev;
    ms_page_arena *arena;
    ms_kv_pool *pool;
    ms_paged_kv kv;
    int32_t kv_pages;             /* pages of the arena */
    eng_attn attn;
    ms_sample_res *sampler;
    ms_step_runner *runner;
    int idx[MS_RESOURCE_KIND_COUNT]; /* resource index of each kind, -1 absent */
    ms_positions_config pos_cfg;

    /* per-step buffers (worst case: max_seqs rows, max_seqs views, max_tokens tokens) */
    int32_t max_seqs, max_tokens;
    int32_t max_out;              /* logits rows of a step: max_seqs, or max_tokens when a step
                                     returns every token's logits (a block step) */
    int32_t *out_rows_dev;        /* backend [max_tokens] 0, 1, 2, ...: the rows of a block step */
    void *workspace;              /* backend */
    size_t workspace_bytes;
    int32_t *tokens_dev;          /* backend [max_tokens] */
    int32_t *pos_dev;             /* backend [n_axes * max_tokens] */
    float *logits_dev;            /* backend [max_seqs * vocab] */
    int32_t *ids_dev;             /* backend [max_seqs] */
    void *sample_ws;              /* backend */
    size_t sample_ws_bytes;
    float *logits_host;           /* [max_seqs * vocab] */
    int32_t *tokens_host;         /* [max_tokens] */
    int32_t *ids_host;            /* [max_seqs] */
    ms_md_row *rows;              /* [max_seqs] the step's batch rows */
    eng_req **row_reqs;           /* [max_seqs] their requests */
    ms_rid *rids;                 /* [max_seqs] */
    ms_md_step_build build;       /* the step declaration the generated runner fills */
    ms_sched sched;
    ms_graph_exec *gx;            /* [graphs] the captured path (graph_exec.h), NULL: eager */

    /* requests */
    eng_req **reqs;               /* [n_reqs] every request not yet removed, in arrival order */
    size_t n_reqs, cap_reqs;
    int32_t n_active;
    int32_t n_streams_active;     /* streams of the active requests (<= max_seqs) */
    ms_rid next_rid;
    int32_t pages_free_initial;
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
int32_t ms_engine_page_size(const ms_engine *e) { return e->kv.page_size; }

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
    ms_kv_stream_info si;
    if (ms_kv_pool_stream_info(e->pool, rid, label, &si) != MS_OK)
        return -1;
    return si.stored;
}

int32_t ms_engine_kv_pages_free(const ms_engine *e) {
    return ms_page_arena_num_free(e->arena);
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
static bool eng_cuda_usable(void) {
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
        ms_status st = ms_device_cuda_init(0, &e->dev, err);
        if (st != MS_OK) {
            ms_error_prefix(err, "device 'cuda': ");
            return st;
        }
        return ms_backend_cuda_init(&e->be, NULL, err);
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
    e->desc->weight_shape(e->config, w, shape);
    return ms_ckpt_expect_tensor(e->ck, name, MS_ST_DTYPES_FLOAT, d->rank, shape, NULL, err);
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
        int32_t n_inst = wd->per_layer ? e->facts.n_layers : 1;
        int64_t shape[MS_TENSOR_MAX_DIMS] = {1, 1, 1, 1};
        d->weight_shape(e->config, w, shape);
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
                    continue;
                }
                if (t == NULL && wd->optional) {
                    if (load)
                        memset(dst, 0, sizeof *dst);
                    continue;
                }
                if (!load) {
                    MS_TRY(eng_expect(e, w, name, err)); /* names the missing/mismatching one */
                    off += (elems * es + 63) / 64 * 64;
                    continue;
                }
                *dst = ms_tensor_make((char *)e->wslab + off, e->wdtype, wd->rank, shape);
                ms_tensor src = ms_tensor_make((void *)t->data, eng_st_dtype(t->dtype), wd->rank,
                                               shape);
                MS_TRY(f->tensor_load(e->be.ctx, dst, &src, err));
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
            if (!load) {
                for (int32_t p = 0; p < wd->n_parts; p++)
                    if (pt[p] != NULL)
                        MS_TRY(eng_expect(e, wd->parts[p], pname[p], err));
                off += (elems * es + 63) / 64 * 64;
                continue;
            }
            *dst = ms_tensor_make((char *)e->wslab + off, e->wdtype, wd->rank, shape);
            if (n_found < wd->n_parts)
                MS_TRY(f->buffer_fill(e->be.ctx, dst->data, 0, elems * es, err));
            int64_t row = 0;
            for (int32_t p = 0; p < wd->n_parts; p++) {
                int64_t pshape[MS_TENSOR_MAX_DIMS] = {1, 1, 1, 1};
                d->weight_shape(e->config, wd->parts[p], pshape);
                if (pt[p] != NULL) {
                    ms_tensor part = ms_tensor_slice(dst, 0, row, pshape[0]);
                    ms_tensor src = ms_tensor_make((void *)pt[p]->data,
                                                   eng_st_dtype(pt[p]->dtype), wd->rank, pshape);
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
        int32_t n_inst = wd->per_layer ? e->facts.n_layers : 1;
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
        n += d->weights[w].per_layer ? e->facts.n_layers : 1;
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

/* [graphs] whether the engine makes the captured path (graph_exec.h modes). */
static bool eng_graphs_wanted(const ms_engine *e) {
    if (e->opt.graphs == MS_GRAPHS_PADDED)
        return true;
    return e->opt.graphs == MS_GRAPHS_AUTO && e->be.iface.graph_capture_begin != NULL;
}

/* The page arena and the KV pool over it (the engine's KV resource). */
static ms_status eng_resources_init(ms_engine *e, ms_error *err) {
    const ms_md_facts *fa = &e->facts;
    const int32_t ps = e->opt.page_size > 0 ? e->opt.page_size : fa->page_size;
    int32_t seq_len = fa->max_context;
    if (e->opt.max_seq_len > 0 && e->opt.max_seq_len < seq_len)
        seq_len = e->opt.max_seq_len;
    const int32_t per_seq = MS_CEIL_DIV(seq_len, ps);
    int32_t pages = e->opt.kv_pages;
    if (pages == 0) {
        if ((int64_t)per_seq * e->max_seqs + 1 > INT32_MAX)
            return MS_FAIL(err, MS_ERR_LIMIT, "kv_pages: %d sequences of %d pages overflow",
                           (int)e->max_seqs, (int)per_seq);
        pages = per_seq * e->max_seqs + 1;
    }
    /* [graphs] the dummy rows' pages come on top of what real requests were promised */
    if (eng_graphs_wanted(e))
        pages += ms_graph_exec_dummy_pages(e->node, e->max_seqs);
    ms_page_arena_config ac = {
        .n_layers = fa->n_layers,
        .n_pages = pages,
        .page_size = ps,
        .n_kv_heads = fa->n_kv_heads,
        .head_dim = fa->head_dim,
        .elem_bytes = (int32_t)ms_dtype_size(e->kvdtype),
        .layout = MS_KV_LAYOUT_NHD,
        .name = "kv",
    };
    MS_TRY(ms_page_arena_init(&ac, e->dev, &e->arena, err));
    /* a stream holds at most its context in pages (+1: a view need not start page-aligned) */
    ms_kv_pool_config pc = {.arena = e->arena, .window = fa->window, .source = e,
                            .max_pages_per_stream = per_seq + 1};
    MS_TRY(ms_kv_pool_init(&pc, &e->pool, err));
    e->kv = (ms_paged_kv){
        .data = ms_page_arena_data(e->arena),
        .dtype = e->kvdtype,
        .n_layers = fa->n_layers,
        .n_pages = pages,
        .page_size = ps,
        .n_kv_heads = fa->n_kv_heads,
        .head_dim = fa->head_dim,
    };
    e->pages_free_initial = ms_page_arena_num_free(e->arena);

    e->kv_pages = pages;
    return MS_OK;
}

/* ---- resources: one interface maker per kind ---- */

/* Fill spec (key, kind, deps already set) with the engine's resource of its kind. */
typedef ms_status (*eng_res_make_fn)(ms_engine *e, int32_t index, ms_resource_spec *spec,
                                     ms_error *err);

static ms_status eng_make_kv(ms_engine *e, int32_t index, ms_resource_spec *spec,
                             ms_error *err) {
    (void)index;
    (void)err;
    spec->instance = e->pool;
    spec->iface = ms_kv_pool_resource_i();
    return MS_OK;
}

static ms_status eng_make_pos(ms_engine *e, int32_t index, ms_resource_spec *spec,
                              ms_error *err) {
    (void)index;
    /* M-RoPE (facts.rope sections, Qwen2-VL): one position stream per section (t, h, w), ids
       from the request on a `pos explicit` step, else one id repeated on every axis; plain RoPE:
       one axis, explicit ids of a `pos explicit` step pass through when the request gives them
       (ms_md_row.position_ids) */
    const int32_t ns = e->facts.rope.n_sections;
    if (ns > MS_POS_MAX_AXES)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                       "model %s: %d M-RoPE sections, the positions resource takes at most %d "
                       "position streams", e->desc->name, (int)ns, MS_POS_MAX_AXES);
    const int32_t axes = ns > 1 ? ns : 1;
    e->pos_cfg = (ms_positions_config){.scheme = axes > 1 ? MS_POS_EXPLICIT : MS_POS_SEQUENTIAL,
                                       .n_axes = axes,
                                       .max_tokens = e->max_tokens,
                                       .kv_key = e->node->resources[e->idx[MS_RESOURCE_KV]].key};
    spec->build = ms_positions_build;
    spec->config = &e->pos_cfg;
    return MS_OK;
}

static ms_status eng_make_attn(ms_engine *e, int32_t index, ms_resource_spec *spec,
                               ms_error *err) {
    (void)index;
    int kv = e->idx[MS_RESOURCE_KV];
    ms_attn_limits lim = {.max_seqs = e->max_seqs, .max_tokens = e->max_tokens,
                          .max_pages = e->kv_pages};
    MS_TRY(e->be.iface.attn_batch_init(e->be.ctx, &lim, &e->attn.batch, err));
    e->attn.be = &e->be;
    e->attn.kv = &e->kv;
    e->attn.n_q_heads = e->facts.n_q_heads;
    e->attn.scale = e->facts.attn_scale > 0.0f ? e->facts.attn_scale
                                               : 1.0f / sqrtf((float)e->facts.head_dim);
    e->attn.window = e->facts.window;
    e->attn.kv_index = kv;
    ms_attn_config atc = {.kv_key = e->node->resources[kv].key, .max_rows = e->max_seqs,
                          .max_pages = e->kv_pages};
    MS_TRY(ms_attn_init(&e->attn.inner, &atc, kv, err));
    spec->instance = &e->attn;
    spec->iface = &eng_attn_iface;
    return MS_OK;
}

static ms_status eng_make_sampler(ms_engine *e, int32_t index, ms_resource_spec *spec,
                                  ms_error *err) {
    (void)index;
    MS_TRY(ms_sample_res_init(&e->sampler, e->max_seqs, err));
    spec->instance = e->sampler;
    spec->iface = ms_sample_res_iface();
    return MS_OK;
}

/* The resource interfaces the engine runs, by kind (NULL: not run by the engine). Kinds are
 * made in the descriptor's dependency order, so the KV pool exists before what reads it. */
static const eng_res_make_fn eng_res_makers[MS_RESOURCE_KIND_COUNT] = {
    [MS_RESOURCE_KV] = eng_make_kv,
    [MS_RESOURCE_POS] = eng_make_pos,
    [MS_RESOURCE_ATTN] = eng_make_attn,
    [MS_RESOURCE_SAMPLER] = eng_make_sampler,
};

static ms_status eng_runner_init(ms_engine *e, ms_error *err) {
    const ms_md_node *d = e->node;
    if (d->n_resources < 1 || d->n_resources > MS_MAX_RESOURCES)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "model %s: %d resources", e->desc->name,
                       (int)d->n_resources);
    for (int k = 0; k < MS_RESOURCE_KIND_COUNT; k++)
        e->idx[k] = -1;
    for (int32_t i = 0; i < d->n_resources; i++)
        e->idx[d->resources[i].kind] = i; /* ms_md_check_desc: one of each kind */
    if (e->idx[MS_RESOURCE_KV] < 0 || e->idx[MS_RESOURCE_POS] < 0 ||
        e->idx[MS_RESOURCE_ATTN] < 0 || e->idx[MS_RESOURCE_SAMPLER] < 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "model %s: the LLM engine needs kv, positions, attention and sampler "
                       "resources", e->desc->name);
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
                           "model %s: resource '%s' of kind %s is not supported by the LLM engine",
                           e->desc->name, r->key, ms_resource_kind_str(r->kind));
        MS_TRY(make(e, i, s, err));
    }
    return ms_step_runner_init(&e->runner, specs, d->n_resources, err);
}

/* The model's CUDA kernel instances at this checkpoint's shape, loaded once (backend.h
 * kernels_load): no step compiles or looks up an instance it was not built with. Backends
 * without the entry (CPU) and descriptors listing no kernels load nothing here. */
static ms_status eng_kernels_init(ms_engine *e, ms_error *err) {
    if (e->be.iface.kernels_load == NULL || e->desc->n_kernels == 0)
        return MS_OK;
    ms_kernel_spec specs[MS_MD_MAX_KERNEL_SPECS];
    int n = 0;
    MS_TRY(ms_md_kernel_specs(e->desc, &e->facts, e->kv.page_size, specs, MS_MD_MAX_KERNEL_SPECS,
                              &n, err));
    return e->be.iface.kernels_load(e->be.ctx, specs, n, err);
}

static ms_status eng_buffers_init(ms_engine *e, ms_error *err) {
    const ms_md_facts *fa = &e->facts;
    e->max_out = e->max_seqs;
    for (int32_t k = 0; k < e->node->n_steps; k++)
        if (e->node->steps[k].all_logits)
            e->max_out = MS_MAX(e->max_seqs, e->max_tokens);
    const size_t V = (size_t)fa->vocab, S = (size_t)e->max_out, T = (size_t)e->max_tokens;
    e->workspace_bytes = e->node->workspace_size(e->config, e->max_tokens, e->max_out);
    MS_TRY(eng_alloc(e, e->workspace_bytes, "forward.workspace", &e->workspace, err));
    MS_TRY(eng_alloc(e, T * sizeof(int32_t), "step.tokens", (void **)&e->tokens_dev, err));
    MS_TRY(eng_alloc(e, (size_t)e->pos_cfg.n_axes * T * sizeof(int32_t), "step.positions",
                     (void **)&e->pos_dev, err));
    MS_TRY(eng_alloc(e, S * V * sizeof(float), "step.logits", (void **)&e->logits_dev, err));
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

    /* RoPE table */
    int32_t rd = fa->rope.rotary_dim > 0 ? fa->rope.rotary_dim : fa->head_dim;
    float *inv = ms_calloc((size_t)rd / 2 + 1, sizeof(float));
    if (inv == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "out of memory for the RoPE table");
    ms_status st = ms_rope_compute_inv_freq(&fa->rope, inv, err);
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
    /* a step has at most max_seqs segments: a request takes one slot of max_seqs per stream */
    return ms_md_step_build_init(&e->build, e->max_seqs, e->max_tokens, err);
}

static ms_status eng_graphs_init(ms_engine *e, ms_error *err); /* [graphs], end of file */

ms_status ms_engine_init(ms_engine **out, const ms_model_desc *desc,
                         const ms_engine_options *opt, ms_error *err) {
    *out = NULL;
    if (desc == NULL || opt == NULL || opt->model_path == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "engine: no model path");
    if (opt->max_seqs < 1 || opt->max_tokens < opt->max_seqs || opt->page_size < 0 ||
        opt->kv_pages < 0 || opt->max_seq_len < 0 || opt->n_threads < 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "engine: bad options (max_seqs %d >= 1, max_tokens %d >= max_seqs, "
                       "page_size %d >= 0, kv_pages %d >= 0)",
                       (int)opt->max_seqs, (int)opt->max_tokens, (int)opt->page_size,
                       (int)opt->kv_pages);
    MS_TRY(ms_md_check_desc(desc, err));
    if (desc->n_nodes != 1)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                       "model %s has %d nodes; the engine runs models of one node yet",
                       desc->name, (int)desc->n_nodes);
    ms_engine *e = ms_calloc(1, sizeof *e);
    if (e == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "out of memory for the engine");
    e->desc = desc;
    e->node = &desc->nodes[0];
    e->opt = *opt;
    e->max_seqs = opt->max_seqs;
    e->max_tokens = opt->max_tokens;
    e->next_rid = 1;
    ms_status st = eng_backend_init(e, err);
    if (st == MS_OK)
        st = eng_facts_init(e, err);
    if (st == MS_OK)
        st = ms_ckpt_init(&e->ck, opt->model_path, err);
    if (st == MS_OK)
        st = eng_weights_init(e, err);
    if (st == MS_OK)
        st = eng_resources_init(e, err);
    if (st == MS_OK)
        st = eng_runner_init(e, err);
    if (st == MS_OK)
        st = eng_kernels_init(e, err);
    if (st == MS_OK)
        st = eng_buffers_init(e, err);
    if (st == MS_OK)
        st = eng_graphs_init(e, err); /* [graphs] */
    if (st != MS_OK) {
        ms_engine_free(e);
        return st;
    }
    *out = e;
    return MS_OK;
}

static void eng_req_free(eng_req *r) {
    if (r == NULL)
        return;
    for (int l = 0; l < MS_MAX_LABELS; l++)
        ms_free(r->prompt[l]);
    ms_free(r->positions);
    ms_free(r->out);
    ms_free(r);
}

void ms_engine_free(ms_engine *e) {
    if (e == NULL)
        return;
    for (size_t i = 0; i < e->n_reqs; i++) {
        if (e->reqs[i]->in_runner)
            ms_step_runner_remove(e->runner, e->reqs[i]->rid);
        eng_req_free(e->reqs[i]);
    }
    ms_free(e->reqs);
    ms_graph_exec_free(e->gx); /* [graphs] before the runner its dummy rows live in */
    ms_step_runner_free(e->runner);
    ms_kv_pool_free(e->pool);
    ms_page_arena_free(e->arena);
    ms_device_free(e->dev);
    ms_attn_free(e->attn.inner);
    ms_sample_res_free(e->sampler);
    if (e->be.ctx != NULL) {
        if (e->attn.batch != NULL)
            e->be.iface.attn_batch_free(e->be.ctx, e->attn.batch);
        eng_bfree(e, e->wslab);
        eng_bfree(e, e->inv_freq);
        eng_bfree(e, e->workspace);
        eng_bfree(e, e->tokens_dev);
        eng_bfree(e, e->pos_dev);
        eng_bfree(e, e->logits_dev);
        eng_bfree(e, e->ids_dev);
        eng_bfree(e, e->sample_ws);
        eng_bfree(e, e->out_rows_dev);
    }
    ms_backend_free(&e->be);
    ms_free(e->weights);
    ms_free(e->woff);
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
    ms_free(e);
}

/* ---- requests ---- */

static eng_req *eng_find_req(const ms_engine *e, ms_rid rid, size_t *at) {
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
        ms_step_runner_remove(e->runner, r->rid);
        r->in_runner = false;
    }
    e->n_active--;
    e->n_streams_active -= r->n_streams;
}

/* Label named `name` in the descriptor, or -1. */
static int32_t eng_label(const ms_engine *e, const char *name) {
    for (int32_t l = 0; l < e->node->n_labels; l++)
        if (strcmp(e->node->labels[l], name) == 0)
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

ms_status ms_engine_add(ms_engine *e, const ms_engine_request *rq, ms_rid *rid, ms_error *err) {
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
        for (int32_t i = 0; i < wk->loop_begin; i++)
            takes_ids = takes_ids || e->desc->nodes[wk->items[i].node]
                                                  .steps[wk->items[i].step].explicit_positions;
        if (rq->position_ids != NULL && !takes_ids)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "position ids given, but no prompt step of walk '%s' declares "
                           "`pos explicit`", wk->name);
        if (rq->position_ids != NULL && rq->n_position_axes != e->pos_cfg.n_axes)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "position ids with %d axes, model %s takes %d (%s)",
                           (int)rq->n_position_axes, e->desc->name, (int)e->pos_cfg.n_axes,
                           e->pos_cfg.n_axes > 1 ? "t, h, w" : "one");
    }
    /* a `pos explicit` prompt without ids is text: ids 0 .. n - 1, the same on every axis (what
       transformers' get_rope_index gives a prompt without image or video tokens) */
    const bool own_ids = takes_ids && rq->position_ids == NULL;
    const int32_t n_axes_ids = rq->position_ids != NULL ? rq->n_position_axes : e->pos_cfg.n_axes;
    int32_t n_streams = ms_walk_n_streams(e->desc, walk);
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
    r->out = ms_malloc((size_t)(rq->max_new_tokens > 0 ? rq->max_new_tokens : 1) *
                       sizeof(int32_t));
    if (r->prompt[MS_LABEL_MAIN] == NULL || (uncond >= 0 && r->prompt[uncond] == NULL) ||
        ((rq->position_ids != NULL || own_ids) && r->positions == NULL) || r->out == NULL ||
        ms_grow((void **)&e->reqs, &e->cap_reqs, e->n_reqs + 1, sizeof *e->reqs) != MS_OK) {
        eng_req_free(r);
        return MS_FAIL(err, MS_ERR_OOM, "out of memory for a request");
    }
    memcpy(r->prompt[MS_LABEL_MAIN], rq->prompt, (size_t)rq->n_prompt * sizeof(int32_t));
    r->n_prompt[MS_LABEL_MAIN] = rq->n_prompt;
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
    const void *overrides[MS_MAX_RESOURCES] = {NULL};
    ms_sample_settings ss = {.params = rq->sampling,
                             .guidance_scale = guided ? rq->guidance_scale : 1.0f};
    overrides[e->idx[MS_RESOURCE_SAMPLER]] = &ss;
    ms_status st = ms_step_runner_ingest(e->runner, r->rid, overrides, err);
    if (st != MS_OK) {
        ms_step_runner_remove(e->runner, r->rid);
        eng_req_free(r);
        return st;
    }
    r->in_runner = true;
    e->reqs[e->n_reqs++] = r;
    e->n_active++;
    e->n_streams_active += n_streams;
    if (r->max_new == 0)
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

const float *ms_engine_last_logits(const ms_engine *e, ms_rid rid) {
    const eng_req *r = eng_find_req(e, rid, NULL);
    if (r == NULL || r->row < 0)
        return NULL;
    return e->logits_host + (size_t)r->row * (size_t)e->facts.vocab;
}

void ms_engine_remove(ms_engine *e, ms_rid rid) {
    size_t at;
    eng_req *r = eng_find_req(e, rid, &at);
    if (r == NULL)
        return;
    if (r->finish == MS_FINISH_NONE) {
        e->n_active--;
        e->n_streams_active -= r->n_streams;
    }
    if (r->in_runner)
        ms_step_runner_remove(e->runner, rid);
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
static int32_t eng_rows(ms_engine *e, int32_t k, int32_t *n_prefill) {
    const ms_md_step *sd = &e->node->steps[k];
    int32_t n = 0, budget = e->max_tokens;
    *n_prefill = 0;
    for (size_t i = 0; i < e->n_reqs && n < e->max_seqs; i++) {
        eng_req *r = e->reqs[i];
        if (r->finish != MS_FINISH_NONE || ms_walk_step(e->desc, r->walk) != k)
            continue;
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
        e->rows[n] = row;
        e->row_reqs[n] = r;
        e->rids[n] = r->rid;
        n++;
    }
    return n;
}

/* Pack the step's tokens in segment order: each segment takes its row's tokens for its label. */
static ms_status eng_pack_tokens(ms_engine *e, int32_t k, ms_error *err) {
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
        if (ms_walk_in_loop(e->desc, r->walk)) {
            if (sg->span > 1 || (sg->span == 1 && r->n_out < 1))
                return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                               "step %s: a loop step feeds the last sampled id (span %d)",
                               e->node->steps[k].name, (int)sg->span);
            if (sg->span == 1)
                e->tokens_host[t] = r->out[r->n_out - 1];
        } else {
            if (r->prompt[sg->label] == NULL ||
                r->consumed[sg->label] + sg->span > r->n_prompt[sg->label])
                return MS_FAIL(err, MS_ERR_INVALID_ARG,
                               "step %s: request %llu has no %d prompt tokens for label %s",
                               e->node->steps[k].name, (unsigned long long)r->rid,
                               (int)sg->span, e->node->labels[sg->label]);
            memcpy(e->tokens_host + t, r->prompt[sg->label] + r->consumed[sg->label],
                   (size_t)sg->span * sizeof(int32_t));
        }
        t += sg->span;
    }
    return MS_OK;
}

/* Queue the forward of a planned step, mix guided rows, sample one id per segment into
 * e->ids_host (the logits land in e->logits_host). */
static ms_status eng_forward_sample(ms_engine *e, const ms_md_step *sd, const ms_step_ctx *ctx,
                                    const ms_graph_step *gs, bool sample, ms_error *err) {
    const ms_backend_i *f = &e->be.iface;
    void *cx = e->be.ctx;
    const ms_step *step = &e->build.step;
    const int32_t n_tok = e->build.n_tokens;
    const int32_t n = sd->all_logits ? n_tok : step->n_segments; /* logits rows */
    const size_t V = (size_t)e->facts.vocab;
    const ms_kv_plan_set *set = ctx->plan_results[e->idx[MS_RESOURCE_KV]];
    const ms_pos_plan *pp = ctx->plan_results[e->idx[MS_RESOURCE_POS]];
    int32_t n_pos = 0;
    const int32_t *pos_ids = ms_pos_plan_ids(pp, set->plans[0].plan_label, 0, &n_pos);
    MS_ASSERT(pos_ids != NULL && n_pos == n_tok);
    MS_TRY(f->copy_to_backend(cx, e->tokens_dev, e->tokens_host,
                              (size_t)n_tok * sizeof(int32_t), err));
    /* every axis (M-RoPE t/h/w: [n_axes, n_tok], axis-major as the plan holds them) */
    const int32_t n_axes = pp->n_axes;
    MS_ASSERT(pp->n_tokens == n_tok && pos_ids == pp->ids);
    MS_TRY(f->copy_to_backend(cx, e->pos_dev, pp->ids,
                              (size_t)n_axes * (size_t)n_tok * sizeof(int32_t), err));
    ms_tensor tokens = ms_tensor_1d(e->tokens_dev, MS_DTYPE_I32, n_tok);
    ms_tensor pos = n_axes > 1 ? ms_tensor_2d(e->pos_dev, MS_DTYPE_I32, n_axes, n_tok)
                               : ms_tensor_1d(e->pos_dev, MS_DTYPE_I32, n_tok);
    ms_tensor logits = ms_tensor_2d(e->logits_dev, MS_DTYPE_F32, n, e->facts.vocab);
    ms_tensor out_rows = ms_tensor_1d(e->out_rows_dev, MS_DTYPE_I32, n_tok);
    const eng_attn *ap = ctx->plan_results[e->idx[MS_RESOURCE_ATTN]];
    ms_md_forward_args args = {
        .be = &e->be,
        .config = e->config,
        .facts = &e->facts,
        .weights = e->weights,
        .weight_offset = e->woff,
        .kv = &e->kv,
        .batch = ap->batch,
        .tokens = &tokens,
        .positions = &pos,
        .rope = &e->rope,
        .attn = ap->params,
        .workspace = e->workspace,
        .max_tokens = e->max_tokens,
        .max_seqs = e->max_out,
        .out_rows = sd->all_logits ? &out_rows : NULL,
        .logits = &logits,
    };
    /* [graphs] eager, captured or replayed (graph_exec.h) */
    MS_TRY(ms_graph_exec_forward(e->gx, gs, ctx, e->node->forward, &args, err));
    MS_TRY(f->copy_to_host(cx, e->logits_host, e->logits_dev, (size_t)n * V * sizeof(float),
                           err));
    if (!sample)
        return MS_OK; /* ms_engine_run_step: the caller reads the logits */

    /* batched CFG: the sampler mixes each guided row with its unconditional row (host logits),
       and the mixed rows go back for the backend's sample call */
    int sidx = e->idx[MS_RESOURCE_SAMPLER];
    int32_t n_mixed = 0;
    ms_sample_res_mix(e->sampler, sidx, step, e->logits_host, e->facts.vocab, &n_mixed);
    if (n_mixed > 0)
        MS_TRY(f->copy_to_backend(cx, e->logits_dev, e->logits_host,
                                  (size_t)n * V * sizeof(float), err));

    const ms_sample_row *rows = ctx->plan_results[sidx];
    /* [graphs] padding rows (one segment each, after the real ones) sample nothing */
    const int32_t n_s = gs->padded ? gs->n_real : n;
    ms_tensor real_logits = ms_tensor_2d(e->logits_dev, MS_DTYPE_F32, n_s, e->facts.vocab);
    ms_tensor ids = ms_tensor_1d(e->ids_dev, MS_DTYPE_I32, n_s);
    MS_TRY(f->sample(cx, &real_logits, rows, e->sample_ws, e->sample_ws_bytes, &ids, err));
    MS_TRY(f->copy_to_host(cx, e->ids_host, e->ids_dev, (size_t)n_s * sizeof(int32_t), err));
    return MS_OK;
}

/* Run the step declared in e->build over gs's rows (tokens packed; [graphs] real rows first,
 * padding up to gs->n_rows): admit -> plan -> forward (-> sampling of the real rows when
 * `sample`) -> commit. A failure after admit abandons the step. eng_run_built then resets the
 * padding rows either way. */
static ms_status eng_run_built_rows(ms_engine *e, const ms_md_step *sd, const ms_graph_step *gs,
                                    bool sample, ms_error *err);

static ms_status eng_run_built(ms_engine *e, const ms_md_step *sd, const ms_graph_step *gs,
                               bool sample, ms_error *err) {
    ms_status st = eng_run_built_rows(e, sd, gs, sample, err);
    ms_graph_exec_done(e->gx, gs); /* [graphs] padding rows reset, pages kept */
    return st;
}

static ms_status eng_run_built_rows(ms_engine *e, const ms_md_step *sd, const ms_graph_step *gs,
                                    bool sample, ms_error *err) {
    ms_step *step = &e->build.step;
    ms_step_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.request_ids = e->rids;
    ctx.n_rows = gs->n_rows;
    ctx.n_real = gs->n_real;
    ctx.lease = gs->leased ? &gs->lease : NULL;
    ctx.capture = gs->capture;
    ms_admit_outcome o = ms_step_runner_admit(e->runner, step, &ctx);
    if (o.code != MS_ADMIT_OK) {
        if (o.code == MS_ADMIT_PAGES_SHORT)
            return MS_FAIL(err, MS_ERR_CAPACITY,
                           "step %s: KV pages short by %d for request %llu (raise kv_pages)",
                           sd->name, (int)o.pages_short, (unsigned long long)o.rid);
        return MS_FAIL(err, MS_ERR_INTERNAL, "step %s: admit failed (%s) at resource %d",
                       sd->name, ms_admit_code_str(o.code), (int)o.resource);
    }
    MS_TRY(ms_step_runner_plan(e->runner, step, &ctx, err));
    ms_status st = eng_forward_sample(e, sd, &ctx, gs, sample, err);
    if (st != MS_OK) {
        ms_step_runner_abandon(e->runner, step, &ctx);
        return st;
    }
    return ms_step_runner_commit(e->runner, step, &ctx, err);
}

ms_status ms_engine_run_step(ms_engine *e, ms_rid rid, const char *step_name,
                             const int32_t *tokens, int32_t n_tokens, const float **logits,
                             int32_t *n_rows, ms_error *err) {
    *logits = NULL;
    *n_rows = 0;
    eng_req *r = eng_find_req(e, rid, NULL);
    if (r == NULL || !r->in_runner || r->finish != MS_FINISH_NONE)
        return MS_FAIL(err, MS_ERR_NOT_FOUND, "run step %s: request %llu is not running",
                       step_name, (unsigned long long)rid);
    int32_t k = -1;
    for (int32_t i = 0; i < e->node->n_steps; i++)
        if (strcmp(e->node->steps[i].name, step_name) == 0)
            k = i;
    if (k < 0)
        return MS_FAIL(err, MS_ERR_NOT_FOUND, "model %s has no step '%s'", e->desc->name,
                       step_name);
    const ms_md_step *sd = &e->node->steps[k];
    if (sd->n_segments != 1 || sd->labels[0] != MS_LABEL_MAIN)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED,
                       "run step %s: only steps over the main stream alone run this way",
                       sd->name);
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
    MS_TRY(eng_run_built(e, sd, &gs, false, err));
    if (e->build.kv.commit)
        r->longest += n_tokens; /* the stream grew outside its walk */
    r->row = 0;
    *logits = e->logits_host;
    *n_rows = sd->all_logits ? n_tokens : 1;
    return MS_OK;
}

ms_status ms_engine_step(ms_engine *e, ms_engine_step_info *info, ms_error *err) {
    ms_engine_step_info inf = {0, 0, 0};
    if (info != NULL)
        *info = inf;
    const ms_model_desc *d = e->desc;

    /* 1. the scheduler picks the step: requests waiting at each step */
    int32_t waiting[MS_MD_MAX_STEPS] = {0};
    bool in_loop[MS_MD_MAX_STEPS] = {false};
    for (size_t i = 0; i < e->n_reqs; i++) {
        eng_req *r = e->reqs[i];
        r->row = -1;
        if (r->finish != MS_FINISH_NONE)
            continue;
        int32_t k = ms_walk_step(d, r->walk);
        if (k >= 0) {
            waiting[k]++;
            in_loop[k] = in_loop[k] || ms_walk_in_loop(d, r->walk);
        }
    }
    int32_t k = ms_walk_pick(&e->sched, waiting, in_loop, e->node->n_steps);
    if (k < 0)
        return MS_OK;
    const ms_md_step *sd = &e->node->steps[k];

    /* 2. its rows, and the declaration from the generated step runner */
    int32_t n = eng_rows(e, k, &inf.n_prefill);
    if (n == 0)
        return MS_OK;
    /* [graphs] a batch a captured bucket covers is padded with dummy rows (graph_exec.h) */
    ms_graph_step gs;
    MS_TRY(ms_graph_exec_pad(e->gx, k, e->rows, e->rids, n, e->max_seqs, &gs, err));
    for (int32_t j = n; j < gs.n_rows; j++)
        e->row_reqs[j] = NULL;
    MS_TRY(sd->run(e->config, e->rows, gs.n_rows, &e->build, err));
    MS_TRY(eng_pack_tokens(e, k, err));
    MS_TRY(eng_run_built(e, sd, &gs, true, err));

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
        if (!e->rows[j].sample)
            continue; /* a prompt chunk: the request stays at this step */
        ms_walk_pos prev = r->walk;
        ms_walk_advance(d, &r->walk);
        if (!ms_walk_in_loop(d, prev) && !ms_walk_in_loop(d, r->walk))
            memset(r->consumed, 0, sizeof r->consumed); /* the next prefix step reads again */
        if (r->row < 0)
            continue;
        int32_t id = e->ids_host[r->row];
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
    inf.n_tokens = b->n_tokens - (gs.n_rows - gs.n_real); /* [graphs] one token per padding row */
    if (info != NULL)
        *info = inf;
    return MS_OK;
}

/* ---- [graphs] the captured path at start-up (graph_exec.h) ---- */

/* One step over dummy rows only (ms_graph_exec_run_fn): warm-up or capture; samples nothing. */
static ms_status eng_graph_run(void *user, const ms_graph_step *gs, ms_md_row *rows,
                               ms_rid *rids, ms_error *err) {
    ms_engine *e = user;
    (void)rids; /* e->rids: the capture fills the engine's own row arrays */
    const ms_md_step *sd = &e->node->steps[gs->step];
    for (int32_t j = 0; j < gs->n_rows; j++)
        e->row_reqs[j] = NULL;
    MS_TRY(sd->run(e->config, rows, gs->n_rows, &e->build, err));
    MS_TRY(eng_pack_tokens(e, gs->step, err));
    return eng_run_built(e, sd, gs, false, err);
}

static ms_status eng_graphs_init(ms_engine *e, ms_error *err) {
    if (e->opt.graphs < 0 || e->opt.graphs >= MS_GRAPH_MODE_COUNT)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "engine: graphs mode %d", (int)e->opt.graphs);
    if (eng_graphs_wanted(e)) {
        ms_graph_exec_config gc = {.mode = e->opt.graphs, .node = e->node, .be = &e->be,
                                   .runner = e->runner, .max_rows = e->max_seqs,
                                   .n_pages = e->kv_pages, .kv_resource = e->idx[MS_RESOURCE_KV]};
        MS_TRY(ms_graph_exec_init(&e->gx, &gc, err));
        MS_TRY(ms_graph_exec_capture(e->gx, eng_graph_run, e, e->rows, e->rids, e->max_seqs,
                                     err));
    }
    /* the dummy rows hold their pages from their warm-up on */
    e->pages_free_initial = ms_page_arena_num_free(e->arena);
    return MS_OK;
}

void ms_engine_graph_stats(const ms_engine *e, ms_graph_exec_stats *st) {
    ms_graph_exec_get_stats(e->gx, st);
}

const ms_graph_exec *ms_engine_graphs(const ms_engine *e) { return e != NULL ? e->gx : NULL; }

size_t ms_engine_kv_bytes(const ms_engine *e) {
    const ms_paged_kv *kv = &e->kv;
    return (size_t)kv->n_layers * (size_t)kv->n_pages * 2 * (size_t)kv->page_size *
           (size_t)kv->n_kv_heads * (size_t)kv->head_dim * ms_dtype_size(kv->dtype);
}

ms_status ms_engine_kv_copy(ms_engine *e, void *host, size_t bytes, ms_error *err) {
    if (host == NULL || bytes != ms_engine_kv_bytes(e))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "kv copy: %zu bytes given, the arena has %zu",
                       bytes, ms_engine_kv_bytes(e));
    return e->be.iface.copy_to_host(e->be.ctx, host, e->kv.data, bytes, err);
}
