/*
 * kv_transfer_host.h - [pd] the host KV transfer: the page contents of a published request
 * travel with its record (ms_kv_payload, bytes on the host), and the receiving pool's transfer
 * (ms_kv_transfer_i) copies them into its own pages. It moves KV between processes on any
 * backend: the record is serialized by the caller (runtime/engine/pd.h) and carried over a
 * socket, a pipe or a file; start() copies synchronously (H2D on CUDA, memcpy on the CPU), so a
 * transfer is DONE when start returns.
 *
 * Layout of a payload: for stream i of the published record (ms_kv_published.streams[i], same
 * order), pages [n_pages] of it, each page every layer: bytes[i][page][layer][page_bytes], with
 * page_bytes = 2 * page_size * n_kv_heads * head_dim * elem_bytes (K then V, page_arena.h NHD).
 *
 * Ownership: ms_kv_payload_export returns a payload owned by the caller (ms_kv_payload_free).
 * The transfer's ctx (ms_kv_host_transfer) borrows its arena. The payload a transfer reads is
 * named by ms_kv_transfer_desc.source (ms_kv_published.source set to the payload by the
 * importer) and must outlive the transfer (start copies it all before returning).
 */
#ifndef MS_KV_TRANSFER_HOST_H
#define MS_KV_TRANSFER_HOST_H

#include "kv_pool.h"
#include "page_arena.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Page contents of one published request (see the layout above). */
typedef struct ms_kv_payload {
    int32_t n_layers;
    int32_t page_size;
    size_t page_bytes;                 /* one page of one layer, K and V */
    int32_t n_streams;
    int32_t n_pages[MS_MAX_LABELS];    /* [n_streams] pages of stream i */
    ms_label label[MS_MAX_LABELS];     /* [n_streams] label of stream i */
    uint8_t *bytes[MS_MAX_LABELS];     /* [n_streams] n_pages[i] * n_layers * page_bytes, owned */
} ms_kv_payload;

/*
 * Copy the contents of every page of `pub` (a record ms_kv_pool_publish made from a pool over
 * `arena`) to the host. Synchronizes nothing: the caller makes sure the steps that wrote the
 * pages finished (ms_engine_synchronize). Errors: MS_ERR_INVALID_ARG (a page outside the arena),
 * MS_ERR_OOM, device copy errors.
 */
ms_status ms_kv_payload_export(ms_page_arena *arena, const ms_kv_published *pub,
                               ms_kv_payload **out, ms_error *err);

/* Free a payload (NULL is a no-op). */
void ms_kv_payload_free(ms_kv_payload *p);

/* The host transfer's context: the arena its pool writes into (borrowed) and its handle count. */
typedef struct ms_kv_host_transfer {
    ms_page_arena *arena;
    uint64_t next_handle;
    uint64_t n_transfers;   /* transfers started (statistics) */
    uint64_t bytes;         /* bytes copied into the arena */
} ms_kv_host_transfer;

/*
 * The host transfer interface: ctx is an ms_kv_host_transfer, desc->source an ms_kv_payload.
 * start fails (MS_ERR_INVALID_ARG, one line naming the request and what) when the payload is
 * missing, of another geometry, lacks the label or holds fewer pages than the range needs, or a
 * local page list is short; a device copy error fails it too. poll and wait then return DONE.
 */
const ms_kv_transfer_i *ms_kv_host_transfer_iface(void);

#ifdef __cplusplus
}
#endif
#endif /* MS_KV_TRANSFER_HOST_H */
