/*
 * model_probe.h - what a compiled model learns about a --model path before any weight is read:
 * the path checked (a checkpoint folder with config.json, a .safetensors file or shard index
 * .json inside one, or a llama2.c .bin), config.json read through the descriptor's own config
 * loader (typed parameters, defaults, the checks the model file declares: architecture,
 * hidden_act, sizes), its facts and its shapes checked. The engine, `generate`, `bench` and the
 * `kernels` verb all start here, so a bad path or config gets the same one line from each.
 *
 * Ownership: ms_model_probe_init fills a caller-owned struct whose members it owns; release them
 * with ms_model_probe_free (also after a failed init, and twice). Nothing is kept on failure.
 *
 * Usage:
 *     ms_model_probe p;
 *     MS_TRY(ms_model_probe_init(&p, &ms_llama_desc, "/models/Llama-3.2-1B", err));
 *     printf("%d layers\n", p.facts.n_layers);
 *     ms_model_probe_free(&p);
 */
#ifndef MS_MODEL_PROBE_H
#define MS_MODEL_PROBE_H

#include "hf_config.h"
#include "model_desc.h"
#include "ms_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A probed model path. */
typedef struct ms_model_probe {
    char *folder;        /* the checkpoint folder (owned; NULL for a llama2.c .bin) */
    bool llama2c;        /* the path is a llama2.c checkpoint (its config comes from its header) */
    ms_hf_config *hf;    /* config.json (+ generation_config.json), or the .bin's derived config */
    void *config;        /* [desc->config_size] the model's config struct, loaded (owned) */
    ms_md_facts facts;   /* desc->facts of it (bos/eos are the engine's: not filled here) */
} ms_model_probe;

/*
 * Probe `path` for `desc` as described at the top of the file. Errors, each one line naming the
 * path: MS_ERR_IO "<path>: cannot open the model (no such file or folder)" or a folder whose
 * config.json cannot be read (with the reason); MS_ERR_NOT_FOUND "<path>: not a model: the
 * folder has no config.json (expected ...)"; MS_ERR_FORMAT for a device, pipe or socket, or an
 * unknown file type; the config loader's errors (config.json missing a field, a checkpoint of
 * another architecture, ...), ms_md_check_shapes' errors; MS_ERR_OOM. On failure *p is zeroed.
 */
ms_status ms_model_probe_init(ms_model_probe *p, const ms_model_desc *desc, const char *path,
                              ms_error *err);

/* Release what the probe holds and zero it. A zeroed or already freed probe is accepted. */
void ms_model_probe_free(ms_model_probe *p);

/* What a path that is neither a folder nor a regular file is, for messages: "a character
 * device", "a block device", "a pipe", "a socket" (`mode`: struct stat's st_mode). */
const char *ms_model_probe_file_kind(unsigned mode);

/* Take the config.json handle out of the probe (the caller frees it with ms_hf_config_free). */
ms_hf_config *ms_model_probe_take_hf(ms_model_probe *p);
/* Take the loaded config struct out of the probe (the caller frees it with ms_free). */
void *ms_model_probe_take_config(ms_model_probe *p);

#ifdef __cplusplus
}
#endif
#endif /* MS_MODEL_PROBE_H */
