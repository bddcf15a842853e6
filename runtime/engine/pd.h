/*
 * pd.h - [pd] prefill/decode disaggregation: the record a prefill engine publishes for a request
 * whose prompt it computed, and its byte form that travels between processes.
 *
 * A record holds what a decode engine needs to continue the request bitwise as one engine would
 * (docs/pd.md): the request (prompt, max_new_tokens, sampling parameters, ignore_eos), the ids
 * sampled so far (the first one, by the prefill), the sampler's draw counter (sampler.h: a draw
 * is a pure function of (seed, draw), so the counter is all its state), the positions counter
 * (positions.h ms_pos_published), the KV pool's published streams (kv_pool.h ms_kv_published:
 * lengths, released fronts, the publisher's page lists) and their page contents
 * (kv_transfer_host.h ms_kv_payload) with the geometry they were written in.
 *
 * Byte form (ms_pd_record_encode / ms_pd_record_decode), little-endian host order of the two
 * peers (both ends are this build; a version word refuses others):
 *   u32 magic "MSPD", u32 version 1, then i32/u64/f32 fields in the order of ms_pd_record,
 *   arrays after their counts, then per stream its page list and its payload bytes.
 * Decoding checks every count against the bytes left and the limits below: a bad record is one
 * line naming the field and its byte offset, never a crash.
 *
 * Ownership: records from ms_engine_pd_publish or ms_pd_record_decode are owned by the caller
 * (ms_pd_record_free); ms_pd_record_encode returns a malloc'd buffer (ms_free).
 */
#ifndef MS_PD_H
#define MS_PD_H

#include "kv_pool.h"
#include "kv_transfer_host.h"
#include "positions.h"
#include "sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One request handed from a prefill engine to a decode engine (see the top of the file). */
typedef struct ms_pd_record {
    int32_t *prompt;               /* [n_prompt] owned */
    int32_t n_prompt;
    int32_t max_new_tokens;        /* of the whole request (the prefill's ids count) */
    bool ignore_eos;
    ms_sampling_params sampling;
    int32_t *out;                  /* [n_out] ids sampled so far (>= 1), owned */
    int32_t n_out;
    uint64_t draw;                 /* the sampler's draw counter after them */
    ms_pos_published pos;          /* the positions resource's counters */
    ms_kv_published *kv;           /* owned; kv->source is set to `payload` by decode/admit */
    ms_kv_payload *payload;        /* owned page contents of kv's streams */
} ms_pd_record;

/* Free a record and everything it owns (NULL is a no-op). */
void ms_pd_record_free(ms_pd_record *rec);

/* Serialize into a new buffer *out of *n bytes (caller frees with ms_free). Errors:
 * MS_ERR_INVALID_ARG (an incomplete record: no kv or payload, stream counts differ), MS_ERR_OOM. */
ms_status ms_pd_record_encode(const ms_pd_record *rec, uint8_t **out, size_t *n, ms_error *err);

/* Parse bytes made by ms_pd_record_encode into a new record. Errors: MS_ERR_FORMAT naming the
 * field and the byte offset (bad magic or version, a count out of range or past the end, bytes
 * left over), MS_ERR_OOM. */
ms_status ms_pd_record_decode(const uint8_t *buf, size_t n, ms_pd_record **out, ms_error *err);

#ifdef __cplusplus
}
#endif
#endif /* MS_PD_H */
