/*
 * position_ids.h - explicit position ids of a request, read from a JSON file (the CLI's
 * `--position-ids FILE`): M-RoPE models (models/qwen2vl.mstar, scheme explicit) take three
 * position streams t, h, w per token, as transformers' get_rope_index computes them.
 *
 * File format: a JSON array [3][S] (one row per axis: t, h, w) or [S] (one axis) of integers,
 * each in [0, 2^31 - 1]; S is the prompt length. The ids come back axis-major, the layout
 * ms_pos_step.explicit_ids takes (runtime/resource.h): ids[a * n_tokens + t].
 *
 * Errors are one line naming the file and, for a bad value, the element:
 *     ids.json: element [1][5] is a string, expected an integer
 *     ids.json: axis 2 has 23 ids, axis 0 has 24 (the array must be rectangular)
 *     ids.json: 20 position ids per axis, the prompt has 24 tokens
 *
 * Ownership: ms_position_ids_init* fill a caller-owned ms_position_ids whose ids array is owned by
 * it (ms_malloc) and released with ms_position_ids_free (which accepts a zeroed or freed struct).
 * The other arguments are borrowed.
 *
 * Usage:
 *     ms_position_ids pid;
 *     MS_TRY(ms_position_ids_init(&pid, "ids.json", n_prompt_tokens, err));
 *     step.explicit_ids = pid.ids; step.n_axes = pid.n_axes;
 *     ...
 *     ms_position_ids_free(&pid);
 */
#ifndef MS_POSITION_IDS_H
#define MS_POSITION_IDS_H

#include "ms_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest number of ids per axis accepted (a prompt longer than this is refused anyway). */
#define MS_POSITION_IDS_MAX_TOKENS (1 << 24)

/* Position ids of one request. */
typedef struct ms_position_ids {
    int32_t n_axes;   /* 1, or 3 (t, h, w) */
    int32_t n_tokens; /* ids per axis (the prompt length), >= 1 */
    int32_t *ids;     /* [n_axes * n_tokens] axis-major: ids[a * n_tokens + t], each >= 0; owned */
} ms_position_ids;

/*
 * Read the position ids in the JSON file at `path` into *out. n_tokens >= 0 requires exactly
 * that many ids per axis (the prompt length); n_tokens < 0 accepts any count >= 1.
 * Errors (out is left zeroed): MS_ERR_NOT_FOUND / MS_ERR_IO "<path>: cannot read: <reason>";
 * MS_ERR_PARSE "<path>:<line>:<column>: not JSON: <reason>"; MS_ERR_FORMAT for a top level that
 * is not an array, an empty array, a number of axes other than 1 or 3, rows of different lengths,
 * a mix of rows and numbers, an element that is not an integer, negative or past int32, or a
 * count other than n_tokens; MS_ERR_LIMIT for more than MS_POSITION_IDS_MAX_TOKENS ids per axis;
 * MS_ERR_OOM.
 */
ms_status ms_position_ids_init(ms_position_ids *out, const char *path, int32_t n_tokens,
                               ms_error *err);

/* The same, from JSON text in memory; `name` stands for the file in messages. */
ms_status ms_position_ids_init_from_string(ms_position_ids *out, const char *name,
                                           const char *json_text, int32_t n_tokens,
                                           ms_error *err);

/* Release the ids and zero *p. NULL, a zeroed struct and a freed one are accepted. */
void ms_position_ids_free(ms_position_ids *p);

#ifdef __cplusplus
}
#endif
#endif /* MS_POSITION_IDS_H */
