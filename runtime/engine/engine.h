/*
 * engine.h - the generic LLM engine: one compiled model (model_desc.h) on one backend, serving
 * requests as one ragged continuous batch.
 *
 * At init the engine builds the backend and the device its KV arena lives on (cpu: the CPU
 * backend, f32 weights and KV in host memory; cuda: the CUDA backend, bf16 weights and KV, the
 * arena in device memory through device_cuda.h; auto: cuda when a GPU is usable), reads
 * config.json (or a llama2.c .bin through the loaders, which derive a config and expose Hugging
 * Face tensor names), validates and loads every declared weight into one planned set of backend
 * buffers (fused entries concatenated), builds each node's resources through its own step runner
 * (KV pool over its own page arena, positions, attention: the runner's plan plus backend staging,
 * sampler; every node of the descriptor, in order), and sizes every per-step buffer for the worst
 * case: after the first step of each kind (which creates the attention plan buffers), decode steps
 * allocate nothing. With options.graphs (graph_exec.h) and a model of one node, the decode buckets
 * the model declares are warmed up and captured as CUDA graphs at init, and a decode batch a bucket
 * covers is padded with dummy rows and replayed (models of several nodes run eager).
 *
 * Each request walks the model's walk (model_desc.h ms_md_walk; a guided pair the walk over its
 * two streams); a walk may cross nodes (node A's prefill, then node B's prefill and decode loop):
 * a request is ingested into every node's runner at add, each node's streams are its own (a node's
 * prefix step reads the prompt again), and it leaves every runner when it finishes. Each
 * ms_engine_step the scheduler (walk.h) picks one (node, step) and batches every request standing
 * there as one ragged step (prefill rows within the token budget, chunked; decode rows one token
 * per stream); the model's generated step runner declares it; admit -> plan -> forward -> commit;
 * then one id is sampled per request and its walk moves on. A request finishes on an eos id
 * (unless ignore_eos), after max_new_tokens, or when its sequence reaches the model's context; it
 * then leaves the batch and ms_engine_remove frees everything it held.  A walk may also start at a
 * node reading features (Whisper's encoder: ms_engine_request.features): that node runs one
 * request per engine step and its rows become the next node's cross-attention context, written
 * once with the prompt's prefill and read with zero spans after.
 *
 * Ownership: ms_engine_* functions borrow their arguments (prompts are copied at add); the engine
 * returned by ms_engine_init is owned by the caller (ms_engine_free). The descriptor must outlive
 * the engine.
 *
 * Usage:
 *     ms_engine_options o = ms_engine_options_default();
 *     o.model_path = "model_dir";  o.max_seqs = 4;  o.max_tokens = 256;
 *     ms_engine *e;
 *     MS_TRY(ms_engine_init(&e, &ms_llama_desc, &o, err));
 *     ms_engine_request rq = {.prompt = ids, .n_prompt = n, .max_new_tokens = 16,
 *                             .sampling = ms_sampling_greedy()};
 *     ms_rid rid;
 *     MS_TRY(ms_engine_add(e, &rq, &rid, err));
 *     while (ms_engine_n_active(e) > 0) MS_TRY(ms_engine_step(e, NULL, err));
 *     const int32_t *out; int32_t n; ms_engine_output(e, rid, &out, &n, NULL);
 *     ms_engine_remove(e, rid);
 *     ms_engine_free(e);
 */
#ifndef MS_ENGINE_H
#define MS_ENGINE_H

#include "graph_exec.h"
#include "kv_pool.h"
#include "prefix_cache.h"
#include "model_desc.h"
#include "ms_base.h"
#include "sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- options ---- */

/* Engine construction options. Start from ms_engine_options_default(). */
typedef struct ms_engine_options {
    const char *model_path;  /* HF folder (config.json + safetensors, sharded or not), a shard
                                index .json, or a llama2.c .bin; required */
    const char *device;      /* "cpu" (default; deterministic for library users), "cuda", or
                                "auto" ("cuda" when a GPU is usable, else "cpu"; the serving
                                binary's default). Weights and KV are f32 on cpu, bf16 on cuda. */
    int32_t page_size;       /* KV page size in tokens; 0 = the model's default */
    int32_t max_seqs;        /* requests in one batch (>= 1) */
    int32_t max_tokens;      /* tokens in one step (prefill budget), >= max_seqs */
    int32_t kv_pages;        /* KV pages incl. the sink page; 0 = enough for max_seqs
                                sequences of max_seq_len tokens */
    int32_t max_seq_len;     /* tokens one sequence may hold, for sizing the KV arena when
                                kv_pages is 0; 0 = the model's context. Capped at the context. */
    int32_t n_threads;       /* CPU backend threads; 0 = online CPUs */
    const char *dtype;       /* storage of the weights and the KV cache: NULL or "auto" = the
                                backend's (f32 on cpu, bf16 on cuda), "f32" (cpu only) or "bf16"
                                (cpu: the numbers the cuda device computes with) */
    ms_graph_mode graphs;    /* the captured path (graph_exec.h): MS_GRAPHS_AUTO captures every
                                decode bucket of the model's `capture batch in [...]` up to
                                max_seqs at init (CUDA; off on cpu) and replays batches they
                                cover; MS_GRAPHS_OFF (the default here; the CLI's --no-graphs)
                                runs every step eager; MS_GRAPHS_PADDED pads like a replay and
                                runs eager (tests). With graphs the arena gets one extra KV page
                                per dummy row. */
    bool no_preplan;         /* [graphs] with graphs on: no pre-plan of step N+1 while step N
                                replays (graph_exec.h), one slot per bucket instead of two
                                (tests compare the two; the default pre-plans, except with
                                prefix_cache, host_kv_pages or tp, which it is off with) */
    bool prefix_cache;       /* share sealed KV pages across requests (prefix_cache.h): a prompt
                                whose leading full pages are cached skips computing them; pages
                                only the cache holds count as free and are evicted least
                                recently used when admit needs them. Models of one node with a
                                KV pool; not for guided pairs, explicit positions or dense block
                                steps. Off by default here; the CLI's generate and serve turn it
                                on (--no-prefix-cache). Outputs are unchanged. */
    /* [kv pressure] (ms_engine_step): */
    int32_t host_kv_pages;   /* usable pages of the host tier per node (same geometry as the
                                device arena; pinned host memory on cuda, through
                                device_cuda.h): an LRU request's KV is offloaded there when
                                device pages run short and reloaded when they free up; 0 = no
                                tier (recompute-preemption only) */
    double gpu_memory_fraction; /* (0, 1]: with kv_pages 0, size the device arena from the
                                memory free after the weights, keeping (1 - F) of the device's
                                total free (vLLM's gpu_memory_utilization; cuda only); 0 = off
                                (the kv_pages / max_seq_len rule) */
    int32_t prompt_logprobs_rows; /* [prompt logprobs] logits rows one step may return beyond
                                one per request, for requests asking for prompt logprobs
                                (ms_engine_request.prompt_logprobs; such a prompt is prefilled
                                at most this many + 1 tokens a step; the logits buffers grow by
                                this many rows of vocab floats); 0 = none: such requests are
                                refused. Capped at max_tokens. */
    /* [tp] tensor parallelism (tp.h): */
    int32_t tp;              /* ranks (0 or 1: off): heads, MLP and the output head split over
                                tp engines on tp threads (cpu) or GPUs (cuda, NCCL); this engine
                                is rank 0 and drives the others. CUDA graphs are off with it.
                                Errors at init: tp outside 0..64, N not dividing the head or MLP
                                counts (one line naming them), fewer than N GPUs, no NCCL. */
    const struct ms_tp_member *tp_member; /* set by the group for each rank's engine; NULL */
    /* [encoder] (a node without a kv_pool: ms_engine_encode_batch, the encode step): */
    int32_t encode_windows;  /* windows one encoder step batches, each a segment of its own
                                (1 .. max_seqs); its buffers are sized for them apart from
                                max_tokens; 0 = the whole windows max_tokens holds (at least 1) */
    /* [pd] the KV transfer a decode engine's pool pulls published requests through
       (ms_engine_pd_admit); NULL: the host transfer (kv_transfer_host.h) over this engine's
       arena, whose context ms_engine_pd_host_transfer returns (a caller may wrap it) */
    const ms_kv_transfer_i *kv_transfer;
    void *kv_transfer_ctx;
} ms_engine_options;

/* Defaults: device "cpu", page_size 0, max_seqs 8, max_tokens 2048, kv_pages 0, max_seq_len 0,
 * n_threads 0, graphs MS_GRAPHS_OFF, prefix_cache false, host_kv_pages 0,
 * gpu_memory_fraction 0. */
ms_engine_options ms_engine_options_default(void);

/* ---- engine ---- */

typedef struct ms_engine ms_engine;

/*
 * Build an engine for `desc` as described at the top of the file. Errors (one line naming the file
 * and the problem): MS_ERR_UNSUPPORTED (device "cuda" in a build without the CUDA backend),
 * MS_ERR_CUDA (device "cuda" without a usable GPU), MS_ERR_INVALID_ARG (bad options, an unknown
 * device), the loaders' errors (MS_ERR_IO,
 * MS_ERR_FORMAT, MS_ERR_PARSE, MS_ERR_NOT_FOUND: missing config field or tensor),
 * MS_ERR_OOM. Nothing is left allocated on failure.
 */
ms_status ms_engine_init(ms_engine **out, const ms_model_desc *desc,
                         const ms_engine_options *opt, ms_error *err);

/* Free the engine and every request it still holds. NULL is a no-op. */
void ms_engine_free(ms_engine *e);

/* The loaded model's facts (bos/eos ids filled in). */
const ms_md_facts *ms_engine_facts(const ms_engine *e);
/* Name of the backend ("cpu"). */
const char *ms_engine_device(const ms_engine *e);
/* The page size in use. */
int32_t ms_engine_page_size(const ms_engine *e);

/* ---- measurement (bench verb) ---- */

/* Wait until the backend finished every queued op (its synchronize entry); a host clock read after
 * it covers the device work. Errors: the backend's asynchronous failure (MS_ERR_CUDA on cuda). */
ms_status ms_engine_synchronize(ms_engine *e, ms_error *err);

/* Bytes of the loaded weights in backend memory (the one weight slab; a tied weight counted
 * once): what a decode step reads at least once. */
size_t ms_engine_weight_bytes(const ms_engine *e);

/*
 * Copy bandwidth of the engine's memory in GB/s (1e9 bytes/s), read + write bytes counted, median
 * of `reps` copies of `bytes` bytes (>= 1 MiB): cuda: device-to-device cudaMemcpyAsync timed with
 * events (ms_backend_cuda_copy_bandwidth); cpu: host memcpy between two fresh buffers timed with
 * the monotonic clock. Errors: MS_ERR_INVALID_ARG (bytes < 1 MiB, reps < 1), MS_ERR_OOM,
 * MS_ERR_CUDA. Allocates and frees its own buffers.
 */
ms_status ms_engine_copy_bandwidth(ms_engine *e, size_t bytes, int32_t reps, double *gbps,
                                   ms_error *err);

/* Counters of the captured path (capture time, buckets, replays; mode OFF when the engine has
 * none): the CLI prints the capture time at start-up. */
void ms_engine_graph_stats(const ms_engine *e, ms_graph_exec_stats *st);

/* The engine's captured path (tests: its graph plan's static states), or NULL (eager; NULL e). */
const ms_graph_exec *ms_engine_graphs(const ms_engine *e);

/* Bytes of the KV page arena (every layer, K and V, the sink page included). */
size_t ms_engine_kv_bytes(const ms_engine *e);

/* Copy the whole KV page arena (ms_engine_kv_bytes bytes, layout of backend.h
 * ms_paged_kv_offset) into host memory `host` after the queued work finished: tests compare the
 * pages' bytes of two runs (padding rows never write a real request's pages).
 * MS_ERR_INVALID_ARG when bytes is not the arena's size; the backend's copy errors. */
ms_status ms_engine_kv_copy(ms_engine *e, void *host, size_t bytes, ms_error *err);

/* ---- requests ---- */

/* Why a request stopped. ORDER MS_FINISH: keep ms_finish_reason_str in sync. */
typedef enum ms_finish_reason {
    MS_FINISH_NONE = 0,   /* still running */
    MS_FINISH_LENGTH,     /* max_new_tokens generated */
    MS_FINISH_EOS,        /* sampled an eos id (kept as the last output token) */
    MS_FINISH_CONTEXT,    /* the sequence reached the model's context: the id sampled at position
                             max_context - 1 is the last one (prompt + output = max_context + 1) */
    MS_FINISH_ERROR,      /* its logits held NaN (MS_SAMPLE_ID_NAN): it stopped, nothing appended;
                             the other requests of the batch go on */
    MS_FINISH_REASON_COUNT
} ms_finish_reason;

/* "running", "length", "eos", "context", "error". */
const char *ms_finish_reason_str(ms_finish_reason r);

/* A generation request. */
typedef struct ms_engine_request {
    const int32_t *prompt;        /* [n_prompt] token ids in [0, vocab); copied */
    int32_t n_prompt;             /* >= 1 */
    int32_t max_new_tokens;       /* >= 0 */
    ms_sampling_params sampling;  /* validated with ms_sampler_check_params */
    bool ignore_eos;              /* do not stop on the model's eos ids */
    int32_t prefill_chunk;        /* prompt tokens consumed per step (chunked prefill); 0 = the
                                     whole prompt in one step. Steps that do not reach the end
                                     of the prompt sample nothing. A guided pair is never cut. */
    /* batched CFG: a negative prompt makes the request a guided pair, ONE request over two
       streams (main: prompt, cfg_uncond: negative prompt) on the model's guided walk; each id is
       sampled from mixed = logsoftmax(uncond) + guidance_scale * (logsoftmax(cond) -
       logsoftmax(uncond)) and appended to both streams. NULL / 0: unguided. */
    const int32_t *negative_prompt;  /* [n_negative_prompt] ids; copied */
    int32_t n_negative_prompt;
    float guidance_scale;            /* finite; used only with a negative prompt */
    /* explicit positions of the prompt ([n_position_axes][n_prompt], copied) for steps that
       declare `pos explicit`; NULL: the positions resource's scheme */
    const int32_t *position_ids;
    int32_t n_position_axes;         /* 1, or 3 (t/h/w M-RoPE) */
    /* a walk that starts at a node reading features (Whisper's encoder): the features
       [n_feature_channels, n_feature_frames] f32, channel-major (transformers' input_features[0],
       [80, 3000] for Whisper), copied. The encoder's rows become the context of the next node's
       cross resource, prefilled with the prompt in one step. NULL: a token-only walk. */
    const float *features;
    int64_t n_feature_channels;
    int64_t n_feature_frames;
    /* [prompt logprobs] keep the logprob of every prompt token under the model given the tokens
       before it, with the prompt_top_logprobs most probable ids (ms_engine_prompt_logprobs): the
       engine returns the logits of every prompt row of this request's prefill (options
       .prompt_logprobs_rows bounds the rows a step returns). Its prompt is computed whole: the
       prefix cache gives it nothing. With max_new_tokens 0 the prompt is still prefilled (a
       prompt scored: OpenAI's echo with max_tokens 0); nothing is generated. One-stream token
       requests only. */
    bool prompt_logprobs;
    int32_t prompt_top_logprobs;     /* [0, MS_ENGINE_MAX_TOP_LOGPROBS] */
} ms_engine_request;

/* The model's declared sampler settings (sampler(temperature, top_k, top_p)) as request
 * defaults, seed 0. Callers start a request's `sampling` from it and override what they set. */
ms_sampling_params ms_engine_sampling_defaults(const ms_engine *e);

/*
 * Add a request; it joins the batch at the next step. A prompt longer than the model's context
 * (n_prompt > max_context) is refused with MS_ERR_LIMIT "prompt of N tokens is longer than the
 * model's context (M positions)"; ids out of range, an empty prompt, bad sampling settings:
 * MS_ERR_INVALID_ARG; more than max_seqs active requests or a prompt over max_tokens:
 * MS_ERR_CAPACITY naming the option to raise (a request takes one of max_seqs per stream: a guided
 * pair two); a request whose prompt + max_new_tokens (capped at the context) needs more KV pages
 * than the arena holds: MS_ERR_CAPACITY naming the pages, the max context and kv_pages. A negative prompt on a model without a cfg_uncond label: MS_ERR_UNSUPPORTED. A
 * request with max_new_tokens 0 finishes at once.
 */
ms_status ms_engine_add(ms_engine *e, const ms_engine_request *rq, ms_rid *rid, ms_error *err);

/*
 * Add a request that shares `parent`'s prompt KV instead of computing it (n > 1 choices over one
 * prompt: vLLM's / SGLang's forked sequences). rq is checked like ms_engine_add's (its own
 * max_new_tokens, sampling and seed, ignore_eos, prefill_chunk) and its prompt must be the
 * parent's prompt as added. The fork waits (it is in no step) until the parent's main stream
 * holds the prompt's first n_prompt - 1 tokens: at once when the parent is past its prefill,
 * else right after the step that computes them (before the parent may finish in it). Then its
 * stream takes those tokens' full pages by reference (kv_pool.h ms_kv_pool_fork_stream: one
 * more owner per page) and a copy of the partial page, and its walk feeds only the prompt's last
 * token, whose logits give its first id under its own sampler state: its ids and logits are
 * bitwise those of the same request added alone. A P-page prompt with n choices thus holds
 * floor((n_prompt - 1) / page_size) pages once, not n times. Each choice frees only its own
 * pages (finish, remove); a shared page returns when its last holder goes. A fork whose parent
 * cannot give its KV (finished or removed before, offloaded to the host tier, its window
 * released part of the prompt, a one-token prompt, no free page for the copy) prefills its
 * prompt itself, with the prefix cache when it is on (ms_engine_get_fork_stats counts it).
 * Offload and recompute-preemption treat a fork like any request. Errors: ms_engine_add's;
 * MS_ERR_NOT_FOUND (unknown parent), MS_ERR_UNSUPPORTED (a model of several nodes or with
 * cross-attention, guided pairs, explicit positions, features, an engine with tensor
 * parallelism (options.tp > 1: the ranks replay adds, not forks): add such choices with
 * ms_engine_add), MS_ERR_INVALID_ARG (a prompt other than the parent's).
 */
ms_status ms_engine_fork(ms_engine *e, ms_rid parent, const ms_engine_request *rq, ms_rid *rid,
                         ms_error *err);

/* [fork] counters since init (metrics, tests). */
typedef struct ms_engine_fork_stats {
    int64_t forks;          /* requests whose prompt KV came from their parent's */
    int64_t pages_shared;   /* full pages those forks shared by reference (no copy, no compute) */
    int64_t pages_copied;   /* partial pages they copied */
    int64_t tokens_shared;  /* prompt tokens they did not compute */
    int64_t fallbacks;      /* forks that prefilled their prompt themselves */
    int32_t n_waiting;      /* forks waiting for their parent's prefill now */
} ms_engine_fork_stats;

/* Fill *out (see ms_engine_fork_stats; zeros for NULL e). */
void ms_engine_get_fork_stats(const ms_engine *e, ms_engine_fork_stats *out);

/* Requests added and not yet finished. */
int32_t ms_engine_n_active(const ms_engine *e);

/* Per-step report: how many requests and tokens the step ran. */
typedef struct ms_engine_step_info {
    int32_t n_seqs;      /* requests in the step */
    int32_t n_tokens;    /* tokens computed (prompt tokens + one per decoding request) */
    int32_t n_prefill;   /* requests that consumed their prompt in this step */
} ms_engine_step_info;

/*
 * Run one (node, step) over the requests standing at it (see the top of the file). Finished
 * requests keep
 * their output until removed. No active request: MS_OK with a zeroed info. Errors: a failing
 * resource or op (message names the step and the resource), MS_ERR_CAPACITY when the KV pages run
 * short and nothing can make room (names kv_pages).
 *
 * KV pressure (vLLM-style; outputs are unchanged by it): at the start of a step offloaded
 * requests are reloaded, oldest first, when the free pages cover them plus one page per running
 * decode; while any request waits to come back, requests that have not started wait. When the
 * step's admit is page-short for request s: a prefill s waits while decodes run (decodes keep
 * priority); otherwise the least recently used request (kv_pool.h ms_kv_pool_lru_candidates),
 * one outside this step first, is offloaded to the host tier (options.host_kv_pages), or, when
 * the tier is full or absent, recompute-preempted (its KV dropped; it re-prefills prompt +
 * generated ids later: one-node, one-stream, token-only requests); then the step is built
 * again. Finished requests are never taken: remove them promptly (they hold pages until then).
 * ms_engine_add refuses a request that could never fit in the arena alone.
 */
ms_status ms_engine_step(ms_engine *e, ms_engine_step_info *info, ms_error *err);

/*
 * Run the step named `step_name` (of the first node declaring one) for request rid alone,
 * outside its walk, over
 * `tokens` [n_tokens] given by the caller (its main stream): dense generation's block steps
 * (`refine`: kv commit = false, pos advance = 0, attn causal = false; a committing block step), or
 * an ordinary step fed an id of the caller's choosing. Nothing is sampled and the request's walk
 * and output do not move; a committing step grows the stream. *logits = the step's logits
 * ([*n_rows, vocab] f32 host, borrowed until the next step): every token's for a step declared
 * `attn causal = false`, else the last token's. Errors: MS_ERR_NOT_FOUND (unknown or finished
 * request, unknown step), MS_ERR_UNSUPPORTED (a step over other labels), MS_ERR_INVALID_ARG (bad
 * tokens, a count the step does not declare), MS_ERR_LIMIT (past the context), the step's own.
 */
ms_status ms_engine_run_step(ms_engine *e, ms_rid rid, const char *step_name,
                             const int32_t *tokens, int32_t n_tokens, const float **logits,
                             int32_t *n_rows, ms_error *err);

/* [inputs_embeds] The facts of node `name` (its KV layout, width, context: ms_md_facts), or
 * NULL when the model has no such node. Borrowed until ms_engine_free. */
const ms_md_facts *ms_engine_node_facts(const ms_engine *e, const char *name);

/* [inputs_embeds] The loaded checkpoint (tensors the model's nodes do not read, e.g. a talker's
 * glue: talker.h) and the engine's batch rows (options.max_seqs). Borrowed until ms_engine_free. */
const struct ms_ckpt *ms_engine_checkpoint(const ms_engine *e);
/* The compiled model the engine runs (its walks: ms_engine_talker_codes follows one). */
const ms_model_desc *ms_engine_desc(const ms_engine *e);
int32_t ms_engine_max_seqs(const ms_engine *e);

/*
 * [inputs_embeds] Run step `step_name` of node `node`, whose forward reads one row per token
 * instead of token ids (`forward(frames: [_, hidden_size]) -> logits`: a talker's frame
 * embeddings, computed outside the node), for requests rids[0 .. n) at once: request i brings
 * spans[i] rows (its tokens of the step's main segment), packed request by request into
 * rows [sum(spans), width] f32 host (copied to the backend; the forward may overwrite its
 * copy). Nothing is sampled and the requests' walks and outputs do not move; a committing step
 * grows each main stream by its span. *logits = the last row's logits of each request
 * ([n, vocab] f32 host, borrowed until the next step); *hidden (when hidden != NULL) = the
 * rows the logits' head read: each request's final-normed hidden state of its last row
 * ([n, width] f32 host, borrowed until the next step; a talker's h_t). Requests are added with ms_engine_add
 * as usual (their prompt ids are only checked). Errors: MS_ERR_NOT_FOUND (no such node or step,
 * a request not running), MS_ERR_UNSUPPORTED (a node reading token ids, a step over other
 * labels), MS_ERR_INVALID_ARG (a width other than the node's, a span below 1, a request given
 * twice), MS_ERR_CAPACITY (more than max_seqs requests, rows above max_tokens), MS_ERR_LIMIT
 * (past the node's context), the step's own. ms_engine_step refuses such a node's steps.
 */
ms_status ms_engine_run_rows(ms_engine *e, const char *node, const char *step_name,
                             const ms_rid *rids, const int32_t *spans, int32_t n,
                             const float *rows, int64_t width, const float **logits,
                             const float **hidden, ms_error *err);

/*
 * [codes] ms_engine_run_rows for a node whose forward reads a row of ids per token
 * (`forward(codes: [_, G] ids)`, input_shape rows -3: a talker reading a frame's G codebook
 * codes and embedding them itself, models/talker.mstar): codes [sum(spans), groups] int32 host,
 * token-major, each in [0, the node's vocabulary) (staged codebook-major for the forward's
 * embedding(table, codes, column = c)). Everything else, outputs and errors as
 * ms_engine_run_rows ("run codes" in the messages); MS_ERR_INVALID_ARG also names a code out of
 * range (row, column), MS_ERR_UNSUPPORTED a node reading float rows or token ids.
 */
ms_status ms_engine_run_codes(ms_engine *e, const char *node, const char *step_name,
                              const ms_rid *rids, const int32_t *spans, int32_t n,
                              const int32_t *codes, int64_t groups, const float **logits,
                              const float **hidden, ms_error *err);

/* Most requests one ms_engine_run_rows_pick picks for. */
#define MS_ENGINE_MAX_PICK 256

/*
 * [scratch] ms_engine_run_rows on a node attending over a scratch KV (a code predictor, whose
 * forward returns every row's head logits), then each request's id is picked greedily from its
 * last row on the engine's backend (the backend's batched sample with greedy rows: the argmax,
 * lowest id on ties, as ms_engine_step's greedy sampling). Every request brings the same span.
 * *picked = [n] int32 host (MS_SAMPLE_ID_NAN for a row holding NaN), borrowed until the next
 * step; *hidden (when not NULL) = each request's last row, as ms_engine_run_rows. Errors:
 * ms_engine_run_rows', MS_ERR_INVALID_ARG (picked or rows NULL, spans that differ),
 * MS_ERR_UNSUPPORTED (a node not on a scratch), MS_ERR_CAPACITY (more than MS_ENGINE_MAX_PICK
 * requests), the backend sample's (rows wider than the engine's sampling workspace holds).
 */
ms_status ms_engine_run_rows_pick(ms_engine *e, const char *node, const char *step_name,
                                  const ms_rid *rids, const int32_t *spans, int32_t n,
                                  const float *rows, int64_t width, const int32_t **picked,
                                  const float **hidden, ms_error *err);

/*
 * [scratch] ms_engine_run_rows_pick for a node whose forward reads a row of ids per token
 * besides its float rows (`forward(h: [_, H], codes: [_, G] ids)`, ms_md_node.codes_width: a
 * code predictor over the talker's hidden rows and the frame's codes, models/talker.mstar):
 * codes [sum(spans), groups] int32 host, token-major, row t the ids of rows' row t, each in
 * [0, the model's vocabulary) (staged codebook-major for the forward's embedding(table, codes,
 * column = c)). Everything else, outputs and errors as ms_engine_run_rows_pick; also
 * MS_ERR_INVALID_ARG (codes NULL, groups other than the node's, a code out of range naming row
 * and column), MS_ERR_UNSUPPORTED (a node reading no codes besides its rows). A node reading
 * both refuses ms_engine_run_rows_pick and ms_engine_run_rows (MS_ERR_INVALID_ARG).
 */
ms_status ms_engine_run_rows_codes_pick(ms_engine *e, const char *node, const char *step_name,
                                        const ms_rid *rids, const int32_t *spans, int32_t n,
                                        const float *rows, int64_t width, const int32_t *codes,
                                        int64_t groups, const int32_t **picked,
                                        const float **hidden, ms_error *err);

/*
 * [codes] ms_engine_run_codes, then the node's sampler resource picks one id per request from
 * its last row's logits, on the engine's backend (the backend's batched sample, as
 * ms_engine_step samples: each request's own sampling settings, greedy for temperature 0; the
 * requests' outputs and walks still do not move). *picked = [n] int32 host, request i's id at
 * i (MS_SAMPLE_ID_NAN for a row whose logits hold NaN), borrowed until the next step; *logits
 * and *hidden as ms_engine_run_codes. Errors: ms_engine_run_codes', MS_ERR_INVALID_ARG (picked
 * NULL), MS_ERR_UNSUPPORTED (a node without a sampler, a node on a scratch).
 */
ms_status ms_engine_run_codes_pick(ms_engine *e, const char *node, const char *step_name,
                                   const ms_rid *rids, const int32_t *spans, int32_t n,
                                   const int32_t *codes, int64_t groups, const int32_t **picked,
                                   const float **logits, const float **hidden, ms_error *err);

/*
 * Run node `node`'s forward over one shaped input (an encoder: log-mel features) and return its
 * hidden states: input [n_channels, n_frames] f32 host, channel-major as the model file declares
 * it (`forward encode(features: [num_mel_bins, n_frames])`, transformers' input_features[0]); the
 * engine stages it token-major, runs the node's one step (its declared segment: one window; the
 * node has no kv_pool, so nothing is admitted, kept or freed: a dense attention over the step's
 * own rows) and copies the rows to
 * out [*n_rows, *width] f32 host (cap floats). Other requests are untouched. Errors:
 * MS_ERR_NOT_FOUND (no such node, or not one returning hidden states), MS_ERR_INVALID_ARG (the
 * input's shape is not the declared one), MS_ERR_CAPACITY (out too small, the step over
 * max_tokens), the step's own.
 */
ms_status ms_engine_encode(ms_engine *e, const char *node, const float *input, int64_t n_channels,
                           int64_t n_frames, float *out, int64_t cap, int64_t *n_rows,
                           int64_t *width, ms_error *err);

/* One window of ms_engine_encode_batch: its input in, its hidden rows out. */
typedef struct ms_engine_encode_item {
    const float *input;         /* [n_channels, n_frames] f32 host, channel-major */
    int64_t n_channels, n_frames;
    float *out;                 /* [n_rows, width] f32 host, the caller's (cap floats) */
    int64_t cap;
    int64_t n_rows, width;      /* out: the rows written (0 on error) */
} ms_engine_encode_item;

/*
 * ms_engine_encode for several windows in ONE step of node `node` (a node without a kv_pool: its
 * dense attention keeps each window's rows to themselves, so every window's rows equal what it
 * gives encoded alone; bitwise on the CPU backend): items[0 .. n_items) in, each one's rows into
 * its own out. At most the windows the workspace holds (max_seqs, and whole windows within
 * max_tokens). Errors: MS_ERR_NOT_FOUND (no such node), MS_ERR_CAPACITY (too many windows, an
 * out too small; naming the window), MS_ERR_INVALID_ARG (a window's input shape), the forward's.
 */
ms_status ms_engine_encode_batch(ms_engine *e, const char *node, ms_engine_encode_item *items,
                                 int32_t n_items, ms_error *err);

/* Most items ms_engine_transcribe runs as one wave (batch). */
#define MS_TRANSCRIBE_MAX_BATCH 64

/* One audio window of ms_engine_transcribe: its features and prompt in, its ids out. */
typedef struct ms_engine_transcript {
    const float *features;      /* [n_channels, n_frames] f32 host, channel-major (Whisper:
                                   [80, 3000] log-mel, transformers' input_features[0]) */
    int64_t n_channels, n_frames;
    const int32_t *prompt;      /* [n_prompt] decoder prompt ids (Whisper: <|startoftranscript|>,
                                   language, task, <|notimestamps|>) */
    int32_t n_prompt;
    int32_t max_new_tokens;
    int32_t *ids;               /* out: [n_ids] greedy ids, ms_malloc'd (the caller ms_frees),
                                   the model's eos id last when it stopped on it */
    int32_t n_ids;
    ms_finish_reason finish;    /* out: eos, length or context */
} ms_engine_transcript;

/*
 * Greedy transcription of items[0 .. n_items) on a model whose walk starts at a node reading
 * features (models/whisper.mstar): each item is a request (ms_engine_request.features, its
 * prompt, greedy sampling, the model's eos ids stop it); as many as max_seqs takes (a Whisper
 * request holds 2 streams: the decoder's ids and its context; its dense encoder keeps none) run
 * as one wave: encoded together (up to encode_windows per step), prefilled, then decoded as one
 * batch; the next wave follows. The engine
 * must have no running requests (MS_ERR_STATE). Errors: ms_engine_add's (naming the item) and
 * ms_engine_step's; on error no item holds ids and every request is removed.
 */
ms_status ms_engine_transcribe(ms_engine *e, ms_engine_transcript *items, int32_t n_items,
                               ms_error *err);

/* Committed tokens of rid's stream `label` (0 main) in the node of the walk item rid stands at
 * (node 0 once its walk is over), or -1 when it holds none there. */
int32_t ms_engine_stream_length(const ms_engine *e, ms_rid rid, ms_label label);

/*
 * Output of a request so far: generated ids (*ids borrowed until the next step or remove) and the
 * finish reason (may be NULL). MS_ERR_NOT_FOUND for an unknown rid.
 */
ms_status ms_engine_output(const ms_engine *e, ms_rid rid, const int32_t **ids, int32_t *n,
                           ms_finish_reason *reason);

/*
 * Logits of rid's last token in the last step ([vocab] f32, borrowed until the next step), or NULL
 * when rid was not in the last step. For a guided pair: the mixed log-probs it sampled from. Tests compare them to reference logits (with prefill_chunk 1,
 * every prompt position).
 */
const float *ms_engine_last_logits(const ms_engine *e, ms_rid rid);

/* [prompt logprobs] The most top entries a prompt position keeps (OpenAI's logprobs limit). */
#define MS_ENGINE_MAX_TOP_LOGPROBS 20

/* One prompt position's logprob (ms_engine_prompt_logprobs). */
typedef struct ms_engine_prompt_logprob {
    float logprob;       /* log p(prompt[i] | prompt[0..i)): log_softmax of the raw logits of
                            row i - 1 (temperature 1, nothing truncated: vLLM's raw prompt
                            logprobs); NaN when that row held NaN */
    int32_t rank;        /* 1 + the number of ids with a larger logit (vLLM's rank) */
    int32_t n_top;       /* entries of top_* (prompt_top_logprobs; 0 when NaN) */
    int32_t top_ids[MS_ENGINE_MAX_TOP_LOGPROBS];     /* most probable first, id ascending on ties */
    float top_logprobs[MS_ENGINE_MAX_TOP_LOGPROBS];  /* their log_softmax values */
} ms_engine_prompt_logprob;

/*
 * Prompt logprobs of rid (added with prompt_logprobs): *lp = [n_prompt] entries (borrowed until
 * ms_engine_remove), entry i for prompt token i; entry 0 has none (OpenAI's and vLLM's null:
 * logprob NaN, n_top 0). *n = entries known so far: 1 until the prefill computed more, n_prompt
 * once the prompt is prefilled (they stay after the request finished). Computed from the logits
 * of each prompt row as the prefill ran them, so they do not depend on chunking. Errors:
 * MS_ERR_NOT_FOUND (unknown rid), MS_ERR_STATE (added without prompt_logprobs).
 */
ms_status ms_engine_prompt_logprobs(const ms_engine *e, ms_rid rid,
                                    const ms_engine_prompt_logprob **lp, int32_t *n);

/* Free everything rid holds (KV pages, positions, sampler state, its record). Unknown: no-op. */
void ms_engine_remove(ms_engine *e, ms_rid rid);

/* [kv pressure] counters since init, and the host tier now (metrics). */
typedef struct ms_engine_kv_stats {
    int64_t offloads;          /* requests moved to the host tier */
    int64_t pages_offloaded;   /* device pages those offloads freed */
    int64_t reloads;           /* requests brought back */
    int64_t pages_reloaded;    /* host-tier pages they brought back */
    int64_t preemptions;       /* recompute-preemptions (KV dropped, re-prefilled later) */
    int32_t n_offloaded;       /* requests in the host tier now */
    int32_t host_pages;        /* usable host-tier pages over the nodes (0: no tier) */
    int32_t host_pages_free;   /* of which free now */
} ms_engine_kv_stats;

/* Fill *out (see ms_engine_kv_stats). */
void ms_engine_get_kv_stats(const ms_engine *e, ms_engine_kv_stats *out);

/* KV pages free right now, summed over the nodes' page arenas (tests: returns to its initial
 * value after every remove). */
int32_t ms_engine_kv_pages_free(const ms_engine *e);

/*
 * The engine's sampler resource (sample_res.h) for request settings beyond ms_engine_request:
 * min_p and penalties (ms_sample_res_set_extra after ms_engine_add; ms_sample_res_observe with
 * the prompt, then with each new output id, between steps). Borrowed until ms_engine_free; use
 * it only from the thread that steps the engine. The serve verb's scheduler is its user.
 */
struct ms_sample_res *ms_engine_sampler(ms_engine *e);

/* Prefix-cache counters (lookups, hit pages and tokens, inserts, evictions, listed pages; all
 * zero when options.prefix_cache is off or the model is not cached). */
void ms_engine_prefix_stats(const ms_engine *e, ms_prefix_stats *out);

/* ---- [tp] tensor parallelism (tp.h) ---- */

/* Ranks of e's group (options.tp), 1 without. */
int32_t ms_engine_tp_world(const ms_engine *e);
/* Rank r's engine of e's group (0: e itself; for per-rank stats such as ms_engine_weight_bytes
 * and ms_engine_kv_pages_free), NULL when r is out of range. Borrowed; read only, between
 * calls on e. */
const ms_engine *ms_engine_tp_rank(const ms_engine *e, int32_t r);

/* ---- [pd] prefill/decode disaggregation (pd.h, docs/pd.md) ---- */

struct ms_pd_record;

/*
 * Prefill side: hand request rid over. It must have finished its prefill and be decoding (at
 * least one id sampled, standing at its walk's loop, not finished, not offloaded): the engine
 * synchronizes, publishes its KV pool streams, copies their pages' contents to the host
 * (ms_kv_payload), records its prompt, settings, ids, the sampler's draw counter and the
 * positions counters into a new record *out (caller-owned, ms_pd_record_free), then removes
 * the request (its pages return to the arena). One-node token models, one stream per request
 * (no guided pair, explicit positions or prompt logprobs), no tensor parallelism, no min_p /
 * penalties. Errors (the request is left as it was): MS_ERR_NOT_FOUND (unknown rid),
 * MS_ERR_STATE (still prefilling, finished, offloaded), MS_ERR_UNSUPPORTED (the cases above),
 * MS_ERR_OOM, device copy errors.
 */
ms_status ms_engine_pd_publish(ms_engine *e, ms_rid rid, struct ms_pd_record **out,
                               ms_error *err);

/*
 * Decode side: add the request a prefill engine published. It is added as ms_engine_add would
 * (same checks and capacity), then its KV pool admit_retrieves the record's streams through the
 * engine's transfer (options.kv_transfer; waits for it), its positions and draw counter are set
 * from the record and its ids so far become its output: the next ms_engine_step decodes it as
 * the one engine that prefilled it would have (bitwise on the CPU). The record is borrowed (it
 * may be freed after the call). A failed transfer fails this request only: it is removed (its
 * pages freed), the others are untouched, and the call returns MS_ERR_IO naming the request.
 * Other errors: MS_ERR_INVALID_ARG (a record inconsistent with itself or this model: stream
 * lengths, labels, page geometry), MS_ERR_CAPACITY (no pages or slots now: retry later),
 * ms_engine_add's errors, MS_ERR_UNSUPPORTED (as for publish).
 */
ms_status ms_engine_pd_admit(ms_engine *e, const struct ms_pd_record *rec, ms_rid *rid,
                             ms_error *err);

/* The engine's built-in host transfer context (kv_transfer_host.h ms_kv_host_transfer over its
 * arena) for a caller wrapping it in options.kv_transfer; NULL for a model of several nodes. */
struct ms_kv_host_transfer *ms_engine_pd_host_transfer(ms_engine *e);

#ifdef __cplusplus
}
#endif
#endif /* MS_ENGINE_H */
