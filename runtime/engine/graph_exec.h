/*
 * graph_exec.h - the captured (CUDA-graph) path of the engine's node (DESIGN.md §4, issue 10
 * [G] item 1), over the host bookkeeping of graph_plan.h.
 *
 * What it does, per step kind of the node that declares `capture batch in [...]` (a step of one
 * segment per row, one token per row, the last token's logits: decode):
 *   - buckets: the declared batch sizes up to the engine's max_seqs (larger ones could never be
 *     filled); a batch of n rows runs on the smallest bucket bs >= n (ms_graph_plan_select);
 *     n above the largest bucket, a row feeding more than one token, or a step without
 *     buckets runs eager, unpadded (sglang PR #33900, TensorRT-LLM #10688: never index a graph
 *     table past its end);
 *   - padding: rows [n, bs) are the slot's persistent dummy rows (ids >= MS_RID_DUMMY_BASE,
 *     ingested once into every resource, one KV page each, reset without freeing after every
 *     step); they are planned like real rows, so the staged plan (ids, positions, page table,
 *     indptr, write addresses, last-token rows) is the real batch's plus dummy rows that read
 *     and write only their own pages, and the write addresses past bs tokens point at the sink
 *     page (attn_batch_stage and ms_graph_plan_stage_kv). Every padded step checks, on the host,
 *     that no padding write address lands on a page a real row holds (vllm #43810, sglang PR
 *     #32477) and fails the step naming the page otherwise;
 *   - capture: at start-up (ms_graph_exec_capture) every bucket first runs one eager warm-up
 *     step over dummy rows, largest first (buffers that grow on first use, cuBLAS heuristics,
 *     the attention split partials reach their final size before any capture), then each
 *     (bucket, slot) is captured over dummy rows under a capture lease. A capture that fails
 *     leaves its bucket eager (it is never leased) and the engine goes on;
 *   - replay: the real plan is staged into the same fixed addresses (the engine's step buffers
 *     and attention batch), then the graph of the lease's (bucket, slot) is launched. The
 *     forward arguments (every pointer and shape the graph baked in) are fingerprinted at
 *     capture and compared at each replay: a replay with other buffers or shapes is an error,
 *     not a silent read of capture-time metadata (sglang PR #1469, vllm #13418);
 *   - the attention decode split count depends only on the staged rows (the bucket), not on the
 *     views' lengths (backend_cuda.c attn_batch_plan, templates/attn/decode.cuh), so a graph and
 *     an eager launch over the same padded rows run the same kernels with the same launch
 *     parameters: bitwise identical outputs (MS_GRAPHS_PADDED runs that eager path).
 * Sampling runs after the forward, eagerly, over the real rows only.
 *
 * Prefill, per step kind that declares `capture tokens in [...]` (one segment per row, rows of
 * any length, the last token's logits; models/llama.mstar: prefill over [32 .. 2048]):
 *   - buckets are (T tokens, R rows): T every declared token bucket up to cfg.max_tokens (the
 *     engine's max_tokens, capped at the stream length: dummy 0 carries a tail as one stream),
 *     R each of MS_GRAPH_PREFILL_ROWS (1, 2, 4, 8) up to max_seqs and below T (R < T
 *     keeps a view of two or more tokens, so the batch stays a prefill batch: the same kernel).
 *     A graph bakes in the forward's row counts (T token rows through every layer, R logits
 *     rows), the attention batch's n_tokens / n_seqs, and the prefill attention's grid, so R
 *     is fixed by the bucket like T is;
 *   - a batch of n rows and T_real tokens runs on the tightest captured (T, R), smallest T
 *     first, with R >= n and room for the padding rows: R == n needs T == T_real, R > n needs
 *     T - T_real >= R - n. That is the smallest token bucket >= T_real unless the rows need
 *     more room (then the next one up). Above the largest token bucket, more than 8 rows,
 *     rows with explicit positions (M-RoPE), or a step whose rows ask prompt logprobs (the
 *     engine: other logits rows) run eager, unpadded;
 *   - padding: row n is the slot's dummy 0 with the token tail T - T_real - (R - n - 1),
 *     rows n+1 .. R-1 are dummies 1 .. R-n-1 with one token each, none sampling. They are
 *     planned like real rows: the tail's KV goes to dummy 0's own pages (it holds up to
 *     ceil(T_max / page_size) pages, reserved on top of the arena by
 *     ms_graph_exec_dummy_pages and kept between steps), every write address past T is the
 *     sink page, and the same host padding check as decode refuses a padding write on a page
 *     a real row holds. Padding rows attend only within their own views, and every op of the
 *     forward is row-wise outside attention, so real rows' outputs are those of the unpadded
 *     batch on the CPU (bitwise: tests/test_graph_exec.c) and the graph's are those of the
 *     padded eager step on the GPU (bitwise: tests/test_graphs_cuda.c). Against the unpadded
 *     eager step on the GPU they are close, not bitwise: cuBLAS picks its kernels by the
 *     GEMMs' row count (as for padded decode);
 *   - the prefill attention's grid is fixed by (n_tokens, n_seqs) alone: backend_cuda.c
 *     attn_batch_plan launches floor((n_tokens * G + 63 * n_seqs) / 64) tiles (the most any
 *     ragged split of n_tokens over n_seqs views needs), the ones past the real tile list
 *     pointing past every view's rows, so they return at once and write nothing. Eager steps
 *     launch the same grid, so graph and eager over the same padded batch are bitwise equal;
 *   - the token and position uploads (T entries), the attention batch's index arrays and the
 *     tile list are copied before the replay into the buffers the graph reads, like decode;
 *   - no pre-plan (the next prefill batch is not predictable): a pending decode pre-plan is
 *     refused and dropped by a prefill step;
 *   - capture: eagerly at start-up with the decode buckets (warm-ups largest first, then each
 *     (bucket, slot)). models/llama.mstar at max_tokens 2048, max_seqs >= 8 and a context of
 *     at least 2048 has 7 token buckets x 4 row counts = 28 prefill buckets (56 graphs with
 *     the pre-plan's two slots).
 *     The warm-ups cost about 4 x (32 + 64 + ... + 2048) = 16k tokens of prefill (about half a
 *     second for an 8B model at 30k tok/s on the H200) and a capture records without running;
 *     the row counts are capped at 8 because a prefill step of more rows is thousands of
 *     tokens in practice, compute-bound, where a graph saves nothing measurable.
 *
 * Modes (ms_graph_mode): AUTO captures when the backend records graphs (CUDA) and is off
 * otherwise; OFF is the unpadded eager path (`--no-graphs`); PADDED takes the same leases,
 * padding and staging as a replay but runs the forward eagerly on any backend (the CPU tests of
 * the host side, and the eager half of the GPU bitwise tests); its capture steps run no forward,
 * as a CUDA capture only records, so both modes leave the same bytes in the dummy rows' pages
 * (a prefill capture would otherwise write a whole token bucket's tail there).
 *
 * Pre-plan (cfg.preplan, the engine's default with graphs): two slots per bucket; after step
 * N's forward is launched and step N committed, step N+1 over the same rows is admitted,
 * planned, padding-checked and staged into the other slot; it is taken only for the identical
 * batch (ms_graph_plan_preplan_take: lease, rid list, step hash), otherwise refused and undone
 * (protocol below). The engine's step stays synchronous (it copies the logits to the host), so
 * what overlaps the GPU is that host planning of step N+1 while step N's graph runs. Decode
 * steps only.
 *
 * Not done yet (issue 10 item 1, see runtime/engine/README.md): capture is eager at start-up,
 * not lazy per bucket (the lead's H200 run decides whether the prefill buckets keep start-up
 * under the 5 s of issue 10; MS_GRAPH_PREFILL_ROWS and the declared token buckets are the knobs);
 * the graphs of the prefill buckets have not run on a GPU yet (tests/test_graphs_cuda.c has
 * the case; this tree was built without one). Steps of two segments per row (the guided
 * pair) have no buckets and stay eager.
 *
 * Ownership: ms_graph_exec_init returns an object owned by the caller (ms_graph_exec_free, which
 * frees the graphs and removes the dummy rows). The backend, node and runner are borrowed and
 * must outlive it. Not thread-safe: called from the engine's step thread.
 */
#ifndef MS_GRAPH_EXEC_H
#define MS_GRAPH_EXEC_H

#include "backend.h"
#include "graph_plan.h"
#include "model_desc.h"
#include "step_runner.h"

#ifdef __cplusplus
extern "C" {
#endif

/* How the engine uses the captured path. ORDER MS_GRAPH_MODE */
typedef enum ms_graph_mode {
    MS_GRAPHS_AUTO = 0, /* capture where the backend records graphs (CUDA), else off */
    MS_GRAPHS_OFF,      /* eager, unpadded (`--no-graphs`) */
    MS_GRAPHS_PADDED,   /* leases, padding and staging as a replay, forward run eagerly */
    MS_GRAPH_MODE_COUNT
} ms_graph_mode;

/* "auto", "off", "padded". */
const char *ms_graph_mode_str(ms_graph_mode m);

/* Configuration (all borrowed). */
typedef struct ms_graph_exec_config {
    ms_graph_mode mode;          /* AUTO or PADDED (OFF: do not make one) */
    const ms_md_node *node;      /* its steps' capture buckets */
    const ms_backend *be;        /* graph entries (AUTO needs all four) */
    ms_step_runner *runner;      /* the node's resources (dummy rows go into each) */
    int32_t max_rows;            /* the engine's max_seqs: buckets above it are dropped */
    int32_t max_tokens;          /* tokens of the largest prefill batch (the engine: max_tokens,
                                    at most a stream's length): token buckets above it are
                                    dropped (0: no token buckets) */
    int32_t n_pages;             /* KV pages of the arena (the padding check's page bitmap) */
    int kv_resource;             /* resource index of the KV pool in the runner */
    bool preplan;                /* two slots per bucket and the pre-plan of step N+1 while
                                    step N replays (ms_graph_exec_preplan_*); false: one slot */
} ms_graph_exec_config;

typedef struct ms_graph_exec ms_graph_exec;

/* Row counts of a prefill (token) bucket: each that is <= max_seqs and below the bucket's
 * tokens (graph_exec.h, "Prefill"). */
#define MS_GRAPH_PREFILL_ROWS {1, 2, 4, 8}
#define MS_GRAPH_PREFILL_N_ROWS 4

/*
 * Whether step k of node qualifies for the captured path: buckets declared (by batch: decode;
 * by tokens: prefill), one segment per row, last-token logits only, and for a token step no
 * explicit positions (`pos explicit`: M-RoPE prefill rows carry ids a dummy row has not).
 */
bool ms_graph_exec_step_capturable(const ms_md_node *node, int32_t k);

/* The declared buckets of step k that are kept, ascending, into out[cap]: a batch step's sizes
 * <= max_rows, a token step's token counts <= max_tokens that leave room for one row (>= 2);
 * returns their count (0 when the step does not qualify). */
int32_t ms_graph_exec_buckets(const ms_md_node *node, int32_t k, int32_t max_rows,
                              int32_t max_tokens, int32_t *out, int32_t cap);

/* KV pages the dummy rows hold for (node, max_rows, max_tokens, page_size): per slot (two with
 * preplan, else one) one page per dummy row of the largest kept row count (decode bucket or
 * prefill row count), and for dummy 0, which carries a prefill step's token tail,
 * ceil(largest kept token bucket / page_size) pages instead of one; 0 when no step qualifies.
 * The engine adds them to the arena so real requests keep the pages they were promised.
 * page_size < 1 is taken as 1. */
int32_t ms_graph_exec_dummy_pages(const ms_md_node *node, int32_t max_rows, int32_t max_tokens,
                                  int32_t page_size, bool preplan);

/*
 * Make the captured path: buckets of every qualifying step (a token step's (tokens, rows)
 * pairs), the graph plan (one or two slots), the dummy rows ingested into the runner. *out =
 * NULL (and MS_OK) when no step qualifies, or in mode AUTO when the backend has no graph
 * entries. Errors: MS_ERR_INVALID_ARG (mode OFF or out of range, bad sizes, max_tokens < 0),
 * MS_ERR_OOM, MS_ERR_LIMIT (more buckets than the graph plan holds), the resources' ingest
 * errors. Nothing is left allocated on failure.
 */
ms_status ms_graph_exec_init(ms_graph_exec **out, const ms_graph_exec_config *cfg,
                             ms_error *err);

/* Free the graphs (backend graph_free), remove the dummy rows, free. NULL is a no-op. */
void ms_graph_exec_free(ms_graph_exec *gx);

/* Whether rid is one of the dummy rows (false for NULL gx). */
bool ms_graph_exec_is_dummy(const ms_graph_exec *gx, ms_rid rid);

/* One step's use of the captured path, filled by ms_graph_exec_pad (or by the capture driver). */
typedef struct ms_graph_step {
    bool padded;          /* rows were padded to a bucket */
    bool leased;          /* lease below is valid (replay or capture) */
    bool capture;         /* this step is being captured */
    bool preplan;         /* padded on the pending pre-plan's lease (ms_graph_exec_pad) or made
                             for one (ms_graph_exec_preplan_pad); ms_graph_exec_preplan_take
                             decides */
    bool preplanned;      /* the step runs on a taken pre-plan: admitted, planned, checked and
                             staged already */
    int32_t step;         /* step index in the node */
    int32_t n_real;       /* real rows (first in the row arrays) */
    int32_t n_rows;       /* rows of the step: the bucket when padded, else n_real */
    int32_t n_pad_tokens; /* tokens of the padding rows (decode: n_rows - n_real; prefill: the
                             bucket's tokens less the real rows'), 0 when not padded */
    ms_slot_lease lease;
} ms_graph_step;

/*
 * Before step k is declared over rows[0, n_real) (rids[i] == rows[i].rid): when a captured
 * bucket covers it, append the lease's dummy rows to rows and rids (row arrays of cap entries;
 * a dummy row feeds one token of its label, or for a prefill step the first one the token
 * tail, and samples nothing) and fill gs. Otherwise gs says eager (padded false, n_rows =
 * n_real). gx NULL: eager. Errors: MS_ERR_INVALID_ARG (a real rid in the dummy range, cap
 * below the bucket).
 */
ms_status ms_graph_exec_pad(ms_graph_exec *gx, int32_t k, ms_md_row *rows, ms_rid *rids,
                            int32_t n_real, int32_t cap, ms_graph_step *gs, ms_error *err);

/*
 * After plan, instead of calling the forward: stage the step's plan into the lease's static
 * states (graph_plan.h, sink tail) and check the padding rows' write addresses against the real
 * rows' pages, then run `forward(args)` eagerly (not leased, or mode PADDED), record it into
 * the (bucket, slot) graph (gs->capture), or launch that graph (replay; the arguments must match
 * the capture's fingerprint). Errors: MS_ERR_STATE (a padding row writes a real row's page, a
 * replay without a graph, arguments other than the capture's), the forward's and the backend's
 * errors. gx NULL or gs not padded: forward(args).
 */
ms_status ms_graph_exec_forward(ms_graph_exec *gx, const ms_graph_step *gs,
                                const ms_step_ctx *ctx, ms_md_forward_fn forward,
                                const ms_md_forward_args *args, ms_error *err);

/*
 * The pre-plan (cfg.preplan): step N+1 admitted, planned, padding-checked and staged into the
 * other slot while step N's graph runs, taken only for the identical batch.
 *
 * Protocol (the engine, after step N's forward is launched and step N is committed):
 *   1. copy step N's real rows (one token each, every row continuing) into a rows array and
 *      call ms_graph_exec_preplan_pad(gx, N's gs, rows, cap, &pgs): it leases the next slot
 *      (another slot than N's; else pgs.preplan stays false and nothing is pre-planned) and
 *      appends that slot's dummy rows;
 *   2. declare the step over those rows into a declaration the engine keeps apart from step
 *      N's (it must outlive the pre-plan) and call ms_graph_exec_preplan_run: admit (is_preplan),
 *      plan, padding check, staging under the tag (lease, rid list, ms_step_hash). A failure
 *      there (pages short, a plan error) undoes it and is counted (n_preplan_failed,
 *      first_preplan_failure): the step then plans normally;
 *   3. step N+1: ms_graph_exec_pad refuses the pre-plan (identity check, n_preplan_refused)
 *      and drops it when the step kind or the real rid list differs (a request finished or
 *      joined), else pads on its lease (gs->preplan); after declaring the step,
 *      ms_graph_exec_preplan_take compares the declaration's hash: on a match gs->preplanned
 *      and *ctx / *admitted are the pre-plan's (skip admit and plan; commit with *admitted);
 *      otherwise it is refused and dropped and the step admits and plans normally on the same
 *      lease.
 * Anything else that touches the runner between two steps (remove, fork, run_step, transfers)
 * must call ms_graph_exec_preplan_drop first.
 */

/* Step 1 above: rows[0, cur->n_real) are the rows of the predicted step (rids are kept in gx);
 * pgs->preplan says whether to go on. Allocates nothing; always MS_OK. */
ms_status ms_graph_exec_preplan_pad(ms_graph_exec *gx, const ms_graph_step *cur,
                                    ms_md_row *rows, int32_t cap, ms_graph_step *pgs);

/* Step 2 above: `step` (borrowed until the pre-plan is taken or dropped) declared over
 * pgs->n_rows rows. Never fails: a pre-plan that cannot be made is undone and counted. */
void ms_graph_exec_preplan_run(ms_graph_exec *gx, const ms_graph_step *pgs, const ms_step *step);

/* Step 3 above: rids[gs->n_rows] the step's rows, step its declaration. MS_OK whether taken or
 * refused (gs->preplanned says); MS_ERR_STATE when gs->preplan is set but nothing is pending. */
ms_status ms_graph_exec_preplan_take(ms_graph_exec *gx, ms_graph_step *gs, const ms_step *step,
                                     const ms_rid *rids, ms_step_ctx *ctx,
                                     const ms_step **admitted, ms_error *err);

/* Drop a pending pre-plan (its admit and plan undone, padding rows reset); returns whether
 * there was one (n_preplan_dropped). NULL gx: false. */
bool ms_graph_exec_preplan_drop(ms_graph_exec *gx);

/* Whether a pre-plan is pending (false for NULL gx). */
bool ms_graph_exec_preplan_pending(const ms_graph_exec *gx);

/* After the step (committed or abandoned): reset the padding rows without freeing their pages.
 * gx NULL or gs not padded: no-op. */
void ms_graph_exec_done(ms_graph_exec *gx, const ms_graph_step *gs);

/*
 * One step over dummy rows only, run by the caller's step code: rows/rids filled by
 * ms_graph_exec_warm_rows, then declare -> admit -> plan -> ms_graph_exec_forward -> commit ->
 * ms_graph_exec_done, sampling nothing. gs->leased = false is the eager warm-up, true the
 * capture of gs->lease.
 */
typedef ms_status (*ms_graph_exec_run_fn)(void *user, const ms_graph_step *gs, ms_md_row *rows,
                                          ms_rid *rids, ms_error *err);

/*
 * Warm up every bucket (largest first), then capture every (bucket, slot), through run. Capture
 * failures are counted (ms_graph_exec_stats, first_failure) and leave their bucket eager; a
 * warm-up failure captures nothing (every step eager, every pair counted as failed). rows/rids:
 * room for the largest bucket. Errors: MS_ERR_INVALID_ARG (cap), the backend's synchronize.
 */
ms_status ms_graph_exec_capture(ms_graph_exec *gx, ms_graph_exec_run_fn run, void *user,
                                ms_md_row *rows, ms_rid *rids, int32_t cap, ms_error *err);

/* Counters of the captured path. */
typedef struct ms_graph_exec_stats {
    ms_graph_mode mode;      /* AUTO (graphs recorded) or PADDED */
    int32_t n_buckets;       /* buckets over all qualifying steps */
    int32_t n_slots;         /* slots per bucket: 2 with the pre-plan, else 1 */
    int32_t n_captured;      /* (bucket, slot) pairs captured */
    int32_t n_failed;        /* (bucket, slot) pairs whose capture failed (eager) */
    double capture_s;        /* wall time of ms_graph_exec_capture, warm-up included */
    uint64_t n_replays;      /* padded steps run on a bucket (graph launches in AUTO) */
    uint64_t n_eager;        /* steps of a qualifying step kind that ran eager, unpadded */
    uint64_t n_padding_rows; /* dummy rows run over all padded steps */
    int32_t last_bucket;     /* bucket rows of the last padded step, 0 none */
    int32_t n_prefill_buckets;  /* of n_buckets: (tokens, rows) buckets of token steps */
    uint64_t n_prefill_replays; /* of n_replays: padded prefill steps */
    uint64_t n_padding_tokens;  /* tokens of the padding rows over all padded prefill steps */
    int32_t last_token_bucket;  /* bucket tokens of the last padded prefill step, 0 none */
    char first_failure[160]; /* the first capture failure's message, "" none */
    uint64_t n_preplans;        /* pre-plans made (ms_graph_exec_preplan_run succeeded) */
    uint64_t n_preplan_taken;   /* ... taken by the identical next batch */
    uint64_t n_preplan_refused; /* ... refused by the identity check (other rows or step) */
    uint64_t n_preplan_dropped; /* ... dropped unseen (another engine call, an eager step) */
    uint64_t n_preplan_failed;  /* pre-plans that could not be made (undone) */
    char first_preplan_failure[160]; /* the first such failure's message, "" none */
} ms_graph_exec_stats;

/* Fill *st (zeroed, mode OFF, for NULL gx). */
void ms_graph_exec_get_stats(const ms_graph_exec *gx, ms_graph_exec_stats *st);

/* The graph plan (tests: static states, leases). NULL for NULL gx. */
const ms_graph_plan *ms_graph_exec_plan(const ms_graph_exec *gx);

/*
 * Host check used on every padded step: in the KV plan of the step's rows (views [0, n_real)
 * real, [n_real, n_views) padding), no padding token's write page (token_to_page of the tokens
 * of views >= n_real, and every token past the views' tokens up to `capacity`) is a page some
 * real view reads or writes, except MS_SINK_PAGE; mark is a zeroed scratch bitmap of
 * ceil(n_pages / 8) bytes, zeroed again on return. MS_ERR_STATE naming the token and the page.
 */
ms_status ms_graph_exec_check_padding(const ms_kv_plan *plan, int32_t n_real, int32_t n_pages,
                                      uint8_t *mark, ms_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MS_GRAPH_EXEC_H */
