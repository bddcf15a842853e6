/*
 * kv_pool.h - the KV pool resource (DESIGN.md §2-§4): paged KV streams per (request, label) over
 * a page arena, with the resource lifecycle ingest / admit / plan / commit / remove / reset, plus
 * publish / admit_retrieve (KV transfer), offload / reload (host tier) and windowed retention.
 *
 * A stream holds a page list (a high-water mark: it grows at admit and shrinks only at reset with
 * free, offload, retention or remove; its host array is sized for the pool's per-stream maximum,
 * all usable arena pages, at the stream's first reservation, so admit never reallocates it), the committed length `stored` (logical tokens, including
 * those released from the front), `released` (tokens dropped by retention, a multiple of the page
 * size; pages[0] holds logical token `released`), a retention window, a generation counter and
 * flags. Page ids are never the sink page.
 *
 * Guarantees:
 *   - admit reserves pages for every segment and every fork of the step, all or nothing across
 *     the whole step: on any failure no stream changed and the free count is unchanged; the
 *     outcome names the pages short, the stream's label and the request. Sizes are totals, so a
 *     retry is idempotent. admit_rollback undoes what the step's admit reserved.
 *   - plan allocates nothing when the step was admitted (buffers are sized at admit); views are
 *     snapshots sliced to ceil(length / page_size) pages, never the high-water list.
 *   - commit advances lengths (when the KV step commits), applies post-forks sized by the
 *     source's length, then retention. A non-committing step keeps its reservation.
 *   - generation: bumped when a stream takes new pages, is reset, is a fork target, releases
 *     pages by retention, is reloaded or receives a transfer; appending inside held pages keeps it.
 *   - one mutex per pool around every stream access; blocking waits (transfers, offload copies)
 *     happen with the mutex released (hazard F4).
 *   - device ordering: pages released at commit may still be read by the forward just launched,
 *     so every write into pages the pool hands out is ordered after the compute stream (fork
 *     copies run on it; reload copies and transfers wait on an event recorded on it); offload
 *     reads wait on the same kind of event (H4) and finish before their pages are released.
 *
 * Ownership: ms_kv_pool_* functions borrow their arguments. The pool returned by
 * ms_kv_pool_init is owned by the caller and released with ms_kv_pool_free; the arenas, device
 * streams and transfer interface named in its config are borrowed and must outlive it. Plan
 * results are owned by the pool; two buffer sets alternate, so a plan set stays valid through
 * the next admit() and plan() (a pre-plan of step N+1 never touches step N's plan) and may be
 * reused by the admit after that.
 *
 * Usage (one decode step for two requests):
 *     ms_kv_pool_config cfg = {.arena = arena};
 *     ms_kv_pool *kv = NULL;
 *     MS_TRY(ms_kv_pool_init(&cfg, &kv, err));
 *     MS_TRY(ms_kv_pool_ingest(kv, 1, NULL, err));
 *     ms_segment segs[] = {{1, MS_LABEL_MAIN, 1}, {2, MS_LABEL_MAIN, 1}};
 *     ms_kv_step ks = {.commit = true};
 *     ms_step step = {.name = "decode", .segments = segs, .n_segments = 2};
 *     step.records[0].rec = &ks;
 *     ms_admit_outcome o = ms_kv_pool_admit(kv, 0, &step, NULL);
 *     const ms_kv_plan_set *plan;
 *     MS_TRY(ms_kv_pool_plan(kv, 0, &step, NULL, &plan, err));
 *     ... forward writes K/V at plan->plans[0].token_to_page / token_to_slot ...
 *     MS_TRY(ms_kv_pool_commit(kv, 0, &step, NULL, err));
 */
#ifndef MS_KV_POOL_H
#define MS_KV_POOL_H

#include "device.h"
#include "ms_base.h"
#include "page_arena.h"
#include "resource.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- KV transfer interface (prefill/decode disaggregation) ---- */

/* State of a transfer. ORDER MS_KV_TRANSFER */
typedef enum ms_kv_transfer_state {
    MS_KV_TRANSFER_PENDING = 0,
    MS_KV_TRANSFER_DONE,
    MS_KV_TRANSFER_FAILED,
    MS_KV_TRANSFER_STATE_COUNT
} ms_kv_transfer_state;

/*
 * One transfer: copy logical tokens [token_begin, token_end) of a published stream into local
 * pages. Both page lists start at logical token `start` (page i holds tokens
 * [start + i * page_size, start + (i + 1) * page_size)). The arrays are valid only during start().
 */
typedef struct ms_kv_transfer_desc {
    ms_rid rid;
    ms_label label;
    int32_t page_size;
    int32_t start;                /* logical token of page 0 of both lists (retention) */
    int32_t token_begin;          /* first token to move */
    int32_t token_end;            /* one past the last token to move */
    const int32_t *local_pages;   /* [n_local_pages] this pool's pages */
    int32_t n_local_pages;
    const int32_t *remote_pages;  /* [n_remote_pages] the publisher's pages */
    int32_t n_remote_pages;
    const void *source;           /* the publisher's identity (ms_kv_published.source) */
    ms_device_event *compute_done;/* recorded on the pool's compute stream just before start():
                                     the local pages may have been released by a commit whose
                                     forward still runs, so the back end orders its writes after
                                     it (cudaStreamWaitEvent); NULL when the pool has no event */
} ms_kv_transfer_desc;

/*
 * Transfer back end (RDMA, CUDA IPC, or a test fake). start and poll are called with the pool's
 * mutex held: they must not block and must not call back into the pool. wait blocks and is
 * called with the mutex released.
 */
typedef struct ms_kv_transfer_i {
    /* Start a transfer; *handle identifies it. Errors: any status (latched as a failed
     * transfer for the request). */
    ms_status (*start)(void *ctx, const ms_kv_transfer_desc *desc, uint64_t *handle,
                       ms_error *err);
    /* Non-blocking state of a transfer. */
    ms_kv_transfer_state (*poll)(void *ctx, uint64_t handle);
    /* Block until the transfer finished; returns DONE or FAILED. */
    ms_kv_transfer_state (*wait)(void *ctx, uint64_t handle);
    /* Forget a finished transfer (optional: no-op). */
    void (*release)(void *ctx, uint64_t handle);
} ms_kv_transfer_i;

/* ---- configuration ---- */

/* Construction parameters of a pool. Zero values pick the defaults in the comments. */
typedef struct ms_kv_pool_config {
    ms_page_arena *arena;               /* device pages (borrowed), required */
    ms_page_arena *host_arena;          /* offload tier of the same geometry (borrowed); NULL:
                                           offload and reload decline with MS_ERR_UNSUPPORTED */
    ms_device_stream *compute_stream;   /* stream the forward runs on; fork copies are queued
                                           here (NULL: synchronous copies) */
    ms_device_stream *copy_stream;      /* offload / reload copies (NULL: synchronous) */
    int32_t window;                     /* default retention window (tokens) of every stream;
                                           0 keeps everything */
    int32_t world_size;                 /* tensor-parallel ranks (0 = 1): published info from a
                                           different world size is a failed transfer */
    int32_t rank;                       /* this pool's rank */
    const ms_kv_transfer_i *transfer;   /* NULL: admit_retrieve fails (transfer failed) */
    void *transfer_ctx;
    const void *source;                 /* identity put into published info (e.g. an engine) */
    int32_t max_pages_per_stream;       /* pages one stream holds at most in normal use (the
                                           context limit in pages): its page list is sized to this
                                           at its first reservation, so admit allocates nothing
                                           on decode; 0 = every usable arena page. A stream that
                                           needs more still gets them (the list then grows). */
} ms_kv_pool_config;

/* Per-request overrides passed to ingest (the resource's `overrides`). */
typedef struct ms_kv_request_config {
    bool set_window;           /* true: `window` replaces the pool default for this request */
    int32_t window;            /* retention window tokens, 0 keeps everything */
    uint32_t retrieve_labels;  /* bit l set: admit_retrieve pulls label l; 0 pulls every label */
} ms_kv_request_config;

typedef struct ms_kv_pool ms_kv_pool;

/*
 * Create a pool over cfg->arena. Creates device events for ordering offload/reload copies (when
 * a host arena is given) and transfers (when a transfer interface is given). Errors:
 * MS_ERR_INVALID_ARG (no arena, negative window, host arena of another geometry), MS_ERR_OOM,
 * device errors.
 */
ms_status ms_kv_pool_init(const ms_kv_pool_config *cfg, ms_kv_pool **out, ms_error *err);

/* Release every request's pages and the pool (NULL is a no-op). Waits for pending transfers. */
void ms_kv_pool_free(ms_kv_pool *pool);

/* The resource interface of the pool (kind MS_RESOURCE_KV); `self` is the ms_kv_pool *. */
const ms_resource_i *ms_kv_pool_resource_i(void);

/* ---- request lifetime ---- */

/*
 * Create the request's state with an empty "main" stream; other labels appear on their first
 * reservation. Idempotent: ingesting an existing request changes nothing (hazard H10).
 * `overrides` may be NULL. Errors: MS_ERR_INVALID_ARG (negative window), MS_ERR_OOM.
 */
ms_status ms_kv_pool_ingest(ms_kv_pool *pool, ms_rid rid, const ms_kv_request_config *overrides,
                            ms_error *err);

/*
 * Start an empty stream from shared pages (prefix caching, prefix_cache.h): the stream of
 * (rid, label) takes over one owner of each of pages[0..n) (the owner ms_prefix_cache_lookup took
 * for the caller) and holds n * page_size committed tokens, as if a prefill had computed them.
 * The next step's segments start at token n * page_size. The pages are released with the
 * stream like its own. Errors (nothing changes): MS_ERR_NOT_FOUND (not ingested), MS_ERR_STATE
 * (the stream already holds tokens or pages, is offloaded, or has a step or transfer in flight),
 * MS_ERR_INVALID_ARG (a free, sink or out-of-range page), MS_ERR_OOM.
 */
ms_status ms_kv_pool_adopt_prefix(ms_kv_pool *pool, ms_rid rid, ms_label label,
                                  const int32_t *pages, int32_t n, ms_error *err);

/* What one ms_kv_pool_fork_stream did. */
typedef struct ms_kv_fork_info {
    int32_t pages_shared;   /* full pages the target now shares with the source (one more owner
                               each, no copy) */
    int32_t pages_copied;   /* 0 or 1: the partial last page, copied into a fresh page */
} ms_kv_fork_info;

/*
 * Fork the first n_tokens committed tokens of stream (src_rid, label) into the empty stream
 * (dst_rid, label) of another request (n > 1 choices over one prompt, as vLLM / SGLang fork a
 * sequence group): the n_tokens / page_size full pages are shared (ms_page_arena_retain: one
 * more owner each, never written again by either side: both append past n_tokens), the partial
 * page holding the rest, if any, is copied into a fresh page (queued on the compute stream
 * after the forward that wrote it), and the target holds n_tokens committed tokens, as if a
 * prefill had computed them. Each side releases its own owners (remove, reset, offload,
 * retention); a shared page returns to the arena when its last holder lets go. Errors (nothing
 * changes): MS_ERR_INVALID_ARG (n_tokens < 1, src == dst, a label out of range),
 * MS_ERR_NOT_FOUND (a request not ingested), MS_ERR_STATE (the source holds fewer tokens, has
 * released some to its window, is offloaded or has a step or transfer in flight; the target is
 * not empty), MS_ERR_CAPACITY (no free page for the partial copy), MS_ERR_OOM, device errors
 * of the copy. *info (may be NULL) gets the page counts.
 */
ms_status ms_kv_pool_fork_stream(ms_kv_pool *pool, ms_rid src_rid, ms_rid dst_rid,
                                 ms_label label, int32_t n_tokens, ms_kv_fork_info *info,
                                 ms_error *err);

/* Free everything the request holds (device pages, host-tier pages, state); waits outside the
 * lock for a pending transfer or offload of it first. Unknown rid: no-op. */
void ms_kv_pool_remove(ms_kv_pool *pool, ms_rid rid);

/*
 * Clear a dummy/padding row: every stream's length, released count and flags go to 0 and its
 * generation is bumped; free_pages releases its pages (device and host tier), otherwise they
 * stay as a reservation for reuse. With free_pages it waits for an offload of the request to
 * finish; without, a running offload sees the change and abandons. Unknown rid: no-op.
 */
void ms_kv_pool_reset(ms_kv_pool *pool, ms_rid rid, bool free_pages);

/* Change one stream's retention window (tokens, 0 keeps all); applies from the next commit.
 * Creates the stream if needed. Errors: MS_ERR_NOT_FOUND, MS_ERR_INVALID_ARG. */
ms_status ms_kv_pool_set_window(ms_kv_pool *pool, ms_rid rid, ms_label label, int32_t window,
                                ms_error *err);

/* ---- step lifecycle (the resource verbs; `index` selects step->records[index]) ---- */

/*
 * Reserve pages for the step: every segment with span > 0 needs ceil((stored + span -
 * released) / page_size) pages (after pre-forks), every fork target the pages of its source's
 * length (post-forks: after this step's span when the step commits). Forks apply to every row
 * of ctx->request_ids (or, without ctx rows, to each request of the segments). All or nothing.
 * Outcomes: OK; PENDING (a transfer into a stream of the step is still arriving; nothing
 * reserved); PAGES_SHORT (pages_short = pages needed beyond the free count, label/rid = the
 * first stream that did not fit); OFFLOADED; TRANSFER_FAILED (terminal for the request);
 * INVALID (unknown request, bad label or span, duplicate (request, label) segment, combined
 * label without segments); NO_MEMORY (host allocation failed; nothing changed).
 * A record NULL at `index` means the step does not use the pool: OK.
 */
ms_admit_outcome ms_kv_pool_admit(ms_kv_pool *pool, int index, const ms_step *step,
                                  ms_step_ctx *ctx);

/* Undo what the admit of `step` reserved (pages taken, streams created, in-flight marks) and
 * the pre-forks its plan applied (lengths restored, generation bumped: the target's bytes were
 * overwritten). Streams admitted by another step are untouched. */
void ms_kv_pool_admit_rollback(ms_kv_pool *pool, int index, const ms_step *step,
                               ms_step_ctx *ctx);

/*
 * Build the step's plan: apply pre-forks (copies queued on the compute stream), group segments
 * into plan labels (combined labels label-major), and fill views, FlashInfer index arrays and
 * per-token write addresses (decode fast path when every span is 1). A zero-span segment on an
 * absent label gets an empty view (H6). *out is owned by the pool (see top of file); NULL when
 * the step does not use the pool. Errors: MS_ERR_STATE (a stream was not admitted for this
 * length, is offloaded or has a transfer pending), MS_ERR_NOT_FOUND (unknown request), device
 * errors of the fork copies.
 */
ms_status ms_kv_pool_plan(ms_kv_pool *pool, int index, const ms_step *step, ms_step_ctx *ctx,
                          const ms_kv_plan_set **out, ms_error *err);

/*
 * Advance host state after the forward was launched: stored += span for every segment (when the
 * KV step commits), post-forks, retention; clears the in-flight marks. Spans of a stream
 * offloaded meanwhile are dropped with a warning (H3c). Errors: MS_ERR_STATE (a post-fork target
 * was not reserved; the other parts still apply), device errors of the fork copies.
 */
ms_status ms_kv_pool_commit(ms_kv_pool *pool, int index, const ms_step *step, ms_step_ctx *ctx,
                            ms_error *err);

/* ---- publish / retrieve ---- */

/* One published stream: a copy, never the live list (H11). */
typedef struct ms_kv_published_stream {
    ms_label label;
    int32_t length;    /* stored tokens (logical end) */
    int32_t start;     /* tokens released from the front (page 0 holds token `start`) */
    int32_t n_pages;   /* ceil((length - start) / page_size) */
    int32_t *pages;    /* [n_pages] copy of the page list */
} ms_kv_published_stream;

/* What publish exports for one request of one rank. Owned by the caller. */
typedef struct ms_kv_published {
    ms_rid rid;
    int32_t world_size;
    int32_t rank;
    int32_t page_size;
    const void *source;                              /* the publishing pool's config.source */
    int32_t n_streams;
    ms_kv_published_stream streams[MS_MAX_LABELS];   /* [n_streams] in label order */
} ms_kv_published;

/*
 * Export the request's streams (length, start, page list copies) under the lock. Errors:
 * MS_ERR_NOT_FOUND for an unknown or removed request (*out = NULL), MS_ERR_STATE when offloaded,
 * MS_ERR_OOM.
 */
ms_status ms_kv_pool_publish(ms_kv_pool *pool, ms_rid rid, ms_kv_published **out, ms_error *err);

/* Free a published record (NULL is a no-op). */
void ms_kv_published_free(ms_kv_published *pub);

/*
 * Reserve pages up to the published lengths and start one transfer per stream that is behind
 * (the request's retrieve_labels filter which labels). All or nothing for the reservation
 * (PAGES_SHORT, nothing changed). Once started, the stream's length is the published length and
 * a read is pending: admit_retrieve and admit report PENDING until the transfer is done (polling
 * never restarts it). A failed start or transfer, a world-size or page-size mismatch, or a
 * missing transfer interface latch TRANSFER_FAILED for that request only: every later admit of
 * it fails the same way (remove frees it). Unknown request: INVALID.
 */
ms_admit_outcome ms_kv_pool_admit_retrieve(ms_kv_pool *pool, ms_rid rid,
                                           const ms_kv_published *pub);

/* ---- offload / reload (host tier) ---- */

/*
 * Move every stream of the request to the host tier: claim the streams (admit then refuses the
 * request), queue device-to-host copies on the copy stream after an event recorded on the compute
 * stream (H4), wait for them with the lock released, then release the device pages only if no
 * claimed stream changed meanwhile (generation, length, page count); otherwise abandon (host
 * pages released, streams back on the device) and return MS_ERR_STATE. *pages_freed (may be
 * NULL) gets the device pages released. Errors: MS_ERR_NOT_FOUND, MS_ERR_UNSUPPORTED (no host
 * tier), MS_ERR_STATE (a step is in flight (H3a), a transfer is pending, another offload or
 * reload of it runs, or abandoned), MS_ERR_CAPACITY (host tier short; nothing changed), device
 * errors (abandoned). An already offloaded request: MS_OK, 0 freed.
 */
ms_status ms_kv_pool_offload(ms_kv_pool *pool, ms_rid rid, int32_t *pages_freed, ms_error *err);

/*
 * Bring an offloaded request back: all or nothing (MS_ERR_CAPACITY when device pages are short:
 * nothing moved, it stays offloaded). Host-to-device copies are queued on the copy stream and the
 * compute stream waits for them. Not offloaded: MS_OK. Errors: MS_ERR_NOT_FOUND, MS_ERR_STATE
 * (another offload/reload of it runs), MS_ERR_CAPACITY, MS_ERR_OOM, device errors.
 */
ms_status ms_kv_pool_reload(ms_kv_pool *pool, ms_rid rid, ms_error *err);

/* True while the request is offloaded or being offloaded. */
bool ms_kv_pool_is_offloaded(ms_kv_pool *pool, ms_rid rid);

/* Device pages an offload of the request would free now (0 when offloaded or unknown). */
int32_t ms_kv_pool_reclaimable(ms_kv_pool *pool, ms_rid rid);

/*
 * Offload candidates, least recently used first: requests holding device pages, not offloaded,
 * with no step in flight, no pending transfer and no offload/reload running. Writes up to `max`
 * (at most 64) ids to out and returns how many were written.
 */
int32_t ms_kv_pool_lru_candidates(ms_kv_pool *pool, ms_rid *out, int32_t max);

/* Offload priority of a request: the pool tick of its last admit/commit/ingest (lower = colder,
 * offloaded first); 0 for an unknown request. */
uint64_t ms_kv_pool_last_active(ms_kv_pool *pool, ms_rid rid);

/* ---- inspection (tests, metrics) ---- */

/* Snapshot of one stream. */
typedef struct ms_kv_stream_info {
    int32_t stored;        /* committed logical tokens */
    int32_t released;      /* tokens released from the front */
    int32_t n_pages;       /* device pages held (high-water) */
    int32_t n_host_pages;  /* host-tier pages held (offloaded) */
    int32_t window;        /* retention window, 0 = none */
    uint32_t generation;
    bool offloaded;
    bool read_pending;
    bool read_error;
    bool step_in_flight;
} ms_kv_stream_info;

/* Fill *out for (rid, label). Errors: MS_ERR_NOT_FOUND (unknown request or absent label). */
ms_status ms_kv_pool_stream_info(ms_kv_pool *pool, ms_rid rid, ms_label label,
                                 ms_kv_stream_info *out);

/* Copy up to `max` page ids of the stream's device page list into out; returns the list's
 * length (-1 for an unknown stream). */
int32_t ms_kv_pool_stream_pages(ms_kv_pool *pool, ms_rid rid, ms_label label, int32_t *out,
                                int32_t max);

/* True when the request is known. */
bool ms_kv_pool_has_request(ms_kv_pool *pool, ms_rid rid);
/* Number of known requests. */
int32_t ms_kv_pool_num_requests(ms_kv_pool *pool);
/* The device arena. */
ms_page_arena *ms_kv_pool_arena(const ms_kv_pool *pool);

/*
 * Add, per page id, the references the pool holds: dev_counts[arena pages] for device pages,
 * host_counts[host arena pages] (may be NULL) for host-tier pages. Used to check that every page
 * is free or owned exactly as counted.
 */
void ms_kv_pool_count_pages(ms_kv_pool *pool, int32_t *dev_counts, int32_t *host_counts);

/*
 * A digest of the pool's page allocation: every live request's streams (label, stored, released,
 * device and host page lists, offloaded flag) hashed with XXH3-128 per request and summed
 * (independent of hash-table order), plus the free page counts. Tensor-parallel ranks that ran
 * the same admissions hold equal digests; tp_check.h compares them across ranks (reference
 * §7.6 post_warmup_validate, hazard H17).
 */
typedef struct ms_kv_pool_digest {
    uint64_t lo, hi;      /* sum over requests of their XXH3-128 (low, high) */
    int32_t n_requests;
    int32_t n_free;       /* free device pages */
    int32_t n_host_free;  /* free host-tier pages (0 without a host arena) */
} ms_kv_pool_digest;
ms_kv_pool_digest ms_kv_pool_allocation_digest(ms_kv_pool *pool);

/* Host allocations made inside plan() since init (0 when every step was admitted first). */
int64_t ms_kv_pool_plan_allocs(ms_kv_pool *pool);

/*
 * Host array growths made inside admit() and its resource verb since init. A stream's page list
 * is sized once, at its first reservation, for the pool's per-stream maximum (every usable arena
 * page: ms_page_arena_num_pages - 1), and the plan buffers' page indices for the whole arena, so
 * this grows only when a step's shape (segments, tokens, forks) exceeds every earlier one: a
 * decode that adds one token per step performs none after its first admit.
 */
int64_t ms_kv_pool_admit_allocs(ms_kv_pool *pool);

#ifdef __cplusplus
}
#endif
#endif /* MS_KV_POOL_H */
