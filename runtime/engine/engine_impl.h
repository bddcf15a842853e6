/*
 * engine_impl.h - the engine's private definitions, shared by the files that implement engine.h:
 * engine.c, engine_dense.c ([encoder]), engine_scratch.c ([scratch]), engine_prefix.c ([prefix]),
 * engine_kv.c ([kv pressure]), engine_tp.c ([tp]), engine_fork.c ([fork]), engine_plp.c
 * ([prompt logprobs]) and engine_pd.c ([pd]). Not a public header: nothing outside
 * runtime/engine/engine*.c includes it; engine.h is the API.
 *
 * It holds the request (eng_req), the node (eng_node) and the engine (struct ms_engine), and the
 * prototypes of the internal functions more than one of those files calls. Ownership and units
 * are as each field's comment says; the functions keep engine.c's conventions (an ms_error set on
 * every failure, nothing allocated per step).
 */
#ifndef MS_ENGINE_IMPL_H
#define MS_ENGINE_IMPL_H

#include "engine.h"

#include "attn_plan.h"
#include "backend.h"
#include "checkpoint.h"
#include "device.h"
#include "graph_exec.h"
#include "cross_attn.h"
#include "kv_pool.h"
#include "kv_transfer_host.h"
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

/* ---- engine-side resources: attention staging (eng_attn_iface in engine.c) ---- */

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
    ms_label context_label;            /* a cross resource's context label (not a query plan
                                          label), -1 none */
    const ms_attn_plan_entry *entry;   /* plan result: the main label's attention plan */
    int32_t n_q_heads;                 /* query heads (the attention resource's q_heads) */
    float scale;                       /* logit scale */
    int32_t window;                    /* sliding window, 0 none */
    ms_attn_params params;             /* plan result: what every layer's attention runs with */
    const ms_kv_plan *query_plan;      /* plan result: the KV plan staged into batch */
} eng_attn;

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
    /* [kv pressure] (eng_kv_*): */
    bool kv_offloaded;                /* its KV sits in the host tier: no step takes it */
    bool kv_wait;                     /* left out of the rest of this engine step (page-short) */
    int32_t n_orig_prompt;            /* main prompt length at add (recompute grows prompt) */
    ms_finish_reason finish;
    int32_t row;                      /* logits row (segment) of its id in the last step, -1 */
    /* a walk starting at a node that reads features (an encoder): */
    float *features;                  /* [n_channels * n_frames] copy, channel-major; NULL */
    int64_t n_channels, n_frames;
    float *context;                   /* [n_context * context_width] the encoder's rows, NULL */
    int32_t n_context;
    int64_t context_width;
    /* [prefix] prefix caching (prefix_cache.h): full pages of its main stream listed so far, the
       key of the last one, and whether it may list more (not for guided pairs, explicit
       positions, encoder walks, dense block steps, or a stream the window has cut) */
    int32_t sealed[MS_MAX_LABELS];
    ms_prefix_key seal_key[MS_MAX_LABELS];
    bool no_seal;
    /* [fork] (ms_engine_fork): the request whose prompt KV this one waits to share, 0 none
       (never forked, or forked already, or prefilling its prompt itself) */
    ms_rid fork_of;
    /* [prompt logprobs] (request.prompt_logprobs): [n_orig_prompt] entries, NULL none; the top
       entries each keeps; the next entry to fill (entries [1, plp_next) are known) */
    ms_engine_prompt_logprob *plp;
    int32_t plp_top;
    int32_t plp_next;
} eng_req;

/*
 * One node of the model as the engine runs it: its KV page arena and pool, its resources through
 * its own step runner (a request is ingested into every node's runner at add and removed from
 * all of them when it finishes). Each node's streams are its own: a walk that crosses nodes
 * prefills each node it visits.
 */
typedef struct eng_node {
    const ms_md_node *node;       /* desc->nodes[i] */
    ms_md_facts facts;            /* its own (ms_md_node.facts), else the model's */
    int32_t step0;                /* scheduler index of its step 0 (steps of all nodes in a row) */
    ms_page_arena *arena;
    ms_kv_pool *pool;
    ms_paged_kv kv;
    int32_t kv_pages;             /* pages of the arena */
    int32_t pages_free_initial;
    ms_page_arena *host_arena;    /* [kv pressure] the offload tier (host_kv_pages), or NULL */
    int32_t batch_pages;          /* page entries one step's views may read: the arena's pages,
                                     or more when pages are shared (prefix cache, forks): up to
                                     max_seqs streams of their context's pages each */
    eng_attn attn;
    ms_sample_res *sampler;
    ms_step_runner *runner;
    int idx[MS_RESOURCE_KIND_COUNT]; /* resource index of each kind, -1 absent */
    ms_positions_config pos_cfg;
    /* cross-attention (a node with a cross resource): the context stream is a label of its own
       KV pool, written by the step that brings the context rows, read by every later step */
    ms_cross_config cross_cfg;
    ms_label context_label;       /* -1 none */
    ms_attn_batch *ctx_batch;     /* the context rows' write addresses (staged per step) */
    ms_attn_batch *cross_batch;   /* the queries over the context views (staged per step) */
    ms_attn_params cross_params;  /* not causal, no window, the attention's scale */
    int32_t ctx_rows;             /* context rows of the step being run (its input) */
    int32_t *zeros;               /* [max_seqs] kv_start of the cross views */
    /* [scratch] a node on a scratch KV (a code predictor): its runner holds the scratch alone,
       nd->kv views its buffer, nd->attn.batch stages its plans (eng_scratch_init) */
    ms_scratch_kv_config scratch_cfg;
    ms_scratch_kv *scratch;       /* owned by the runner; NULL: not a scratch node */
    /* [encoder] a node without a kv_pool (dense attention, eng_dense_init): no arena, pool or
       runner; its step's segments (one window per request) go to the forward as dense_batch */
    bool dense;
    ms_dense_batch *dense_batch;  /* [max_windows] segments, backend-owned offsets */
    ms_attn_params dense_params;  /* not causal, no window, the attention's scale */
    int32_t max_windows;          /* windows one step batches: options.encode_windows, or the
                                     whole windows max_tokens holds (codegen.c NW) */
    int32_t dense_tokens;         /* rows of max_windows windows: the node's own token capacity
                                     (its workspace layout, the step buffers are sized for it) */
    ms_kv_host_transfer pd_host;  /* [pd] the built-in host transfer into this node's arena */
} eng_node;

struct ms_engine {
    const ms_model_desc *desc;
    eng_node nodes[MS_MD_MAX_NODES]; /* [n_nodes] desc->nodes in order */
    int32_t n_nodes;
    int32_t n_sched_steps;        /* steps of all nodes (the scheduler's indices) */
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

    /* the KV device (every node's arena lives on it) */
    ms_device *dev;
    ms_device *host_dev;          /* [kv pressure] the offload tier's memory (pinned on cuda) */
    ms_engine_kv_stats kv_stats;  /* [kv pressure] counters */
    ms_rid short_rid;             /* [kv pressure] the request a page-short admit named */
    int32_t kv_n_parked;          /* [kv pressure] requests waiting to come back */

    /* per-step buffers (worst case: max_seqs rows, max_seqs views, max_tokens tokens) */
    int32_t max_seqs, max_tokens;
    int32_t buf_tokens;           /* rows of the per-step token buffers: max_tokens, or a dense
                                     node's windows when more ([encoder]) */
    int32_t max_out;              /* logits rows of a step: max_seqs, or max_tokens when a step
                                     returns every token's logits (a block step) */
    int32_t *out_rows_dev;        /* backend [max_tokens] 0, 1, 2, ...: the rows of a block step */
    void *workspace;              /* backend */
    size_t workspace_bytes;
    int32_t *tokens_dev;          /* backend [max_tokens] */
    int32_t *pos_dev;             /* backend [n_axes * max_tokens] */
    float *logits_dev;            /* backend [max_seqs * vocab] */
    /* nodes returning hidden states (ms_engine_encode; none: NULL, 0) */
    float *hidden_dev;            /* backend [max_tokens * hidden_cap_width] their output */
    int64_t hidden_cap_width;     /* widest hidden row of those nodes */
    float *input_dev;             /* backend [input_cap] a shaped input, token-major */
    float *input_host;            /* [input_cap] staging (the transpose) */
    int64_t input_cap;            /* elements of the largest declared shaped input */
    /* [scratch] the ids a node reads besides its rows (ms_md_node.codes_width; none: NULL, 0) */
    int32_t *codes_dev;           /* backend [codes_cap], codebook-major */
    int32_t *codes_host;          /* [codes_cap] staging */
    int64_t codes_cap;            /* max_tokens * the widest codes_width */
    int32_t *ids_dev;             /* backend [max_seqs] */
    void *sample_ws;              /* backend */
    size_t sample_ws_bytes;
    float *logits_host;           /* [max_seqs * vocab] */
    int32_t logits_rows;          /* rows of logits_dev the last forward wrote */
    bool logits_on_host;          /* ... and logits_host holds them (else: copied when read) */
    int32_t *tokens_host;         /* [max_tokens] */
    int32_t *ids_host;            /* [max_seqs] */
    ms_md_row *rows;              /* [max_seqs] the step's batch rows */
    eng_req **row_reqs;           /* [max_seqs] their requests */
    ms_rid *rids;                 /* [max_seqs] */
    ms_md_step_build build;       /* the step declaration the generated runner fills */
    ms_sched sched;
    ms_graph_exec *gx;            /* [graphs] the captured path (graph_exec.h), NULL: eager */
    ms_md_step_build pre_build;   /* [graphs] the pre-plan's declaration of step N+1 */
    ms_md_row *pre_rows;          /* [graphs] [max_seqs] its rows; NULL: no pre-plan */
    ms_sample_row *pre_samples;   /* [graphs] [max_seqs] step N's sample rows, kept from its plan
                                     (the pre-plan plans the sampler again) */
    ms_step_ctx taken_ctx;        /* [graphs] a taken pre-plan's context (ms_graph_exec_pad) */
    const ms_step *taken_step;    /* [graphs] ... and the declaration it was admitted with */
    ms_prefix_cache *pcache;      /* [prefix] sealed pages shared across requests, NULL: off */
    ms_prefix_key proot;          /* [prefix] the root key: model, config, weights, KV dtype */
    ms_tp_rank *tps;              /* [tp] this rank's split (options.tp_member), NULL: whole */
    ms_tp_group *tpg;             /* [tp] rank 0: the group it drives, NULL otherwise */
    bool ck_borrowed;             /* [tp] ck is the group's one checkpoint (rank 0 frees it) */

    /* requests */
    eng_req **reqs;               /* [n_reqs] every request not yet removed, in arrival order */
    size_t n_reqs, cap_reqs;
    int32_t n_active;
    int32_t n_streams_active;     /* streams of the active requests (<= max_seqs) */
    ms_rid next_rid;
    ms_engine_fork_stats fork_stats; /* [fork] counters; n_waiting: requests with fork_of */
    /* [prompt logprobs] (options.prompt_logprobs_rows; 0: none, the rest NULL) */
    int32_t plp_rows;             /* extra logits rows a step may return */
    int32_t *plp_rows_dev;        /* backend [max_out] the token rows a step's logits come from */
    int32_t *plp_rows_host;       /* [max_out] staging */
    void *plp_scratch;            /* ms_sampler_scratch_size(vocab) bytes */
    bool rows_staged;             /* [inputs_embeds] ms_engine_run_rows staged the input rows */
    bool codes_staged;            /* [codes] ms_engine_run_codes staged them: int32 ids,
                                     codebook-major (input_shape rows -3) */
    float *last_hidden_dev;       /* [inputs_embeds] backend [max_seqs * last_hidden_width] the
                                     rows a forward's head read (ms_engine_run_rows' hidden) */
    float *last_hidden_host;      /* [max_seqs * last_hidden_width] */
    int64_t last_hidden_width;    /* widest row-per-token input; 0: no such node */
};

/* ---- internal functions shared across engine*.c ---- */

/* engine.c: the request `rid` of e (NULL: none; removed requests are gone); *at (when not NULL)
 * gets its index in e->reqs. */
eng_req *eng_find_req(const ms_engine *e, ms_rid rid, size_t *at);

/* engine.c: add request rq to e, as ms_engine_add (engine.h) does, with fork_of: the request
 * whose prompt KV it waits to share ([fork], ms_engine_fork), 0 none. *rid gets its id. Errors:
 * ms_engine_add's. */
ms_status eng_add(ms_engine *e, const ms_engine_request *rq, ms_rid fork_of, ms_rid *rid,
                  ms_error *err);

/* engine_prefix.c [prefix]: adopt the prefix cache's sealed pages for r's streams (no-op when
 * off). */
void eng_prefix_adopt(ms_engine *e, eng_req *r);

/* engine_fork.c [fork]: fork every request waiting for `parent` whose KV is ready (called after
 * a step `parent` ran in; NULL parent or no waiting fork: nothing). */
void eng_fork_resolve(ms_engine *e, const eng_req *parent);

/* engine_fork.c [fork]: at a step's start, forks whose parent finished, was removed or sits in
 * the host tier prefill themselves; those whose parent's KV is ready fork. */
void eng_fork_poll(ms_engine *e);

/* engine_plp.c [prompt logprobs]: stage the step's logits rows into e->plp_rows_host for its
 * n_seg segments; returns the rows beyond the segments' own (0 when options.prompt_logprobs_rows
 * is 0 or no request of the step asks for prompt logprobs). */
int32_t eng_plp_rows(ms_engine *e, int32_t n_seg);

/* engine_plp.c [prompt logprobs]: fill the prompt-logprob entries the step's rows give, once
 * their logits reached e->logits_host (before penalties or CFG mixing touch the rows). */
void eng_plp_collect(ms_engine *e, int32_t n_seg);

/* engine.c: true when device "auto" resolves to cuda (a CUDA build with a usable GPU). */
bool eng_cuda_usable(void);

/* engine.c: ms_engine_init of one engine (no [tp] group); shared_ck: the checkpoint a [tp] group
 * opened once (borrowed), NULL: open opt->model_path's. *out gets the engine (caller frees it with
 * ms_engine_free), NULL on failure. Errors: ms_engine_init's. */
ms_status eng_init(ms_engine **out, const ms_model_desc *desc, const ms_engine_options *opt,
                   ms_ckpt *shared_ck, ms_error *err);

/* engine.c: ms_engine_remove on this engine alone (no [tp] dispatch); an unknown rid: no-op. */
void eng_remove(ms_engine *e, ms_rid rid);

/* engine.c: ms_engine_step on this engine alone (no [tp] dispatch); info (may be NULL) gets the
 * step's rows and tokens. Errors: ms_engine_step's. */
ms_status eng_step(ms_engine *e, ms_engine_step_info *info, ms_error *err);

/* engine_tp.c [tp]: start the group of options.tp ranks (rank 0's engine in *out, the caller
 * frees it with ms_engine_free, which stops the group). Errors: the probe's, the checkpoint's,
 * any rank's init. */
ms_status eng_tp_init(ms_engine **out, const ms_model_desc *desc, const ms_engine_options *opt,
                      ms_error *err);

/* engine_tp.c [tp]: check every node's KV allocation against the other ranks' (tp_check.h);
 * `when` names the moment in the error. MS_ERR_STATE when they differ. */
ms_status eng_tp_check(ms_engine *e, const char *when, ms_error *err);

/* engine_kv.c [kv pressure]: *pages gets node nd's device KV pages of page size ps for
 * options.gpu_memory_fraction (the free device memory after the weights, less the (1 - F) of the
 * total kept free, split evenly over the nodes). MS_ERR_UNSUPPORTED off cuda, MS_ERR_CAPACITY
 * when nothing is left. */
ms_status eng_kv_pages_from_fraction(ms_engine *e, const eng_node *nd, int32_t ps,
                                     int32_t *pages, ms_error *err);

/* engine_kv.c [kv pressure]: node nd's offload tier (nd->host_arena, owned by the node):
 * options.host_kv_pages usable pages of the device arena's geometry `dev`, pinned on cuda;
 * host_kv_pages 0: none. Errors: the host device's or the arena's. */
ms_status eng_host_arena_init(ms_engine *e, eng_node *nd, const ms_page_arena_config *dev,
                              ms_error *err);

/* engine_kv.c [kv pressure]: refuse at add (MS_ERR_CAPACITY, naming kv_pages) a request of
 * n_streams streams that no node's arena could hold alone. */
ms_status eng_kv_check_fits(const ms_engine *e, const ms_engine_request *rq, int32_t n_streams,
                            ms_error *err);

/* engine_kv.c [kv pressure]: true when a step must leave r out (offloaded, waiting for pages in
 * this engine step, or a fresh prefill while some request waits to come back). */
bool eng_kv_skip(const ms_engine *e, const eng_req *r);

/* engine_kv.c [kv pressure]: at a step's start, bring offloaded requests back, oldest first, while
 * the free pages cover them plus one per running decode. Errors: the transfer's. */
ms_status eng_kv_reload(ms_engine *e, ms_error *err);

/* engine_kv.c [kv pressure]: a step's admit of `item` over n rows came out page-short for
 * e->short_rid on node nd: make room (wait, offload or recompute-preempt a victim); the caller
 * builds the rows again. MS_ERR_CAPACITY when nothing can give pages. */
ms_status eng_kv_make_room(ms_engine *e, eng_node *nd, ms_md_walk_item item, int32_t n,
                           ms_error *err);

/* engine_prefix.c [prefix]: make e->pcache and e->proot when options.prefix_cache is on and the
 * model has one node with a KV pool, no cross context and pages of at most 256 ids (else nothing:
 * off). Errors: the root key's, the cache's allocation. */
ms_status eng_prefix_init(ms_engine *e, ms_error *err);

/* engine_prefix.c [prefix]: list r's newly full pages (committed by the step just run) in the
 * prefix cache, each under the key chained over prompt ++ output ids (no-op when off, r NULL or
 * r->no_seal; a stream the window cut sets r->no_seal). */
void eng_prefix_seal(ms_engine *e, eng_req *r);

/* The forward arguments every node call shares (backend, config, weights and their instance
 * offsets, RoPE table, workspace, max_tokens / max_seqs of the engine's buffers) with `facts` (the
 * node's own or the model's); the caller adds the step's tensors and resources. */
static inline ms_md_forward_args eng_forward_args(ms_engine *e, const ms_md_facts *facts) {
    return (ms_md_forward_args){
        .be = &e->be,
        .config = e->config,
        .facts = facts,
        .weights = e->weights,
        .weight_offset = e->woff,
        .rope = &e->rope,
        .workspace = e->workspace,
        .max_tokens = e->max_tokens,
        .max_seqs = e->max_out,
    };
}

/* engine_scratch.c [scratch]: true when node nd has a scratch resource (a code predictor). */
bool eng_scratch_node(const eng_node *nd);

/* engine_scratch.c [scratch]: node nd's runner over its scratch KV alone (nd->runner, nd->scratch,
 * nd->kv viewing its buffer, nd->attn.batch). MS_ERR_UNSUPPORTED for another resource beside the
 * scratch or a rope that is not the model's RoPE table, MS_ERR_FORMAT for no scratch rows. */
ms_status eng_scratch_init(ms_engine *e, eng_node *nd, ms_error *err);

/* engine_scratch.c [scratch]: one step of scratch node nd over e->rows[0 .. n) (declared in
 * e->build, the rows staged in e->input_dev; spans[i] tokens of request i): admit, plan, forward
 * into e->hidden_dev [n_tokens, width], commit. A failure after admit abandons the step. */
ms_status eng_run_scratch(ms_engine *e, eng_node *nd, const ms_md_step *sd, int32_t n,
                          const int32_t *spans, ms_error *err);

/* engine.c [inputs_embeds] [codes] [scratch]: one step `step_name` of node `node` over requests
 * rids[0 .. n) (spans[i] tokens each) reading the caller's int32 `codes` [sum(spans), width] when
 * not NULL, else its f32 `rows` [sum(spans), width], and for a scratch node reading ids besides its
 * rows `row_codes`
 * [sum(spans), row_groups] (else NULL, 0). *logits (engine-owned, valid until the next step),
 * *hidden (may be NULL; required for a scratch node) and *picked (NULL: no picking) get the
 * step's results. Errors name the node and step: unknown, not reading such input, bad widths. */
ms_status eng_run_input(ms_engine *e, const char *node, const char *step_name, const ms_rid *rids,
                        const int32_t *spans, int32_t n, const float *rows, const int32_t *codes,
                        int64_t width, const int32_t *row_codes, int64_t row_groups,
                        const float **logits, const float **hidden, const int32_t **picked,
                        ms_error *err);

/* engine_dense.c [encoder]: true when node d has neither a kv_pool nor a scratch (a dense node:
 * its attention reads the step's own K/V rows). */
bool eng_node_is_dense(const ms_md_node *d);

/* engine_dense.c [encoder]: set up dense node nd (no arena, pool or runner; nd->dense_batch
 * backend-owned, nd->max_windows windows a step). MS_ERR_UNSUPPORTED for a node the engine cannot
 * run as an encoder, MS_ERR_FORMAT / MS_ERR_INVALID_ARG for its facts / options.encode_windows. */
ms_status eng_dense_init(ms_engine *e, eng_node *nd, ms_error *err);

/* engine_dense.c [encoder]: the streams ms_walk_n_streams counts at the dense nodes of walk w
 * (their step's labels, once per node); they hold nothing, so no slot of max_seqs. */
int32_t eng_walk_dense_streams(const ms_engine *e, int32_t w);

/* engine_dense.c [encoder]: the engine step at dense node nd's `item`: the requests standing
 * there (up to nd->max_windows) encoded in ONE forward, their rows the next node's context
 * prompt, their walks moved on; info (may be NULL) gets the rows and tokens. MS_ERR_OOM for the
 * context rows, else the forward's errors. */
ms_status eng_step_encode(ms_engine *e, eng_node *nd, ms_md_walk_item item,
                          ms_engine_step_info *info, ms_error *err);

#endif /* MS_ENGINE_IMPL_H */
