/*
 * model_probe.c - the one check of a --model path and its config (model_probe.h).
 */
#include "model_probe.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#define PROBE_MODEL_KINDS                                                                         \
    "expected a checkpoint folder (config.json + *.safetensors), a .safetensors file or "         \
    "shard index .json inside one, a llama2.c .bin file or a .gguf file"

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

const char *ms_model_probe_file_kind(unsigned mode) {
    mode_t m = (mode_t)mode;
    if (S_ISCHR(m))
        return "a character device";
    if (S_ISBLK(m))
        return "a block device";
    if (S_ISFIFO(m))
        return "a pipe";
    if (S_ISSOCK(m))
        return "a socket";
    return "neither a folder nor a regular file";
}

/* The checkpoint folder of `path` into p->folder (llama2.c: none), or the one-line error. */
static ms_status probe_path(ms_model_probe *p, const char *path, ms_error *err) {
    struct stat st;
    if (stat(path, &st) != 0)
        return MS_FAIL(err, MS_ERR_IO, "%s: cannot open the model (%s)", path,
                       errno == ENOENT ? "no such file or folder" : strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        char *cfg = ms_asprintf("%s/config.json", path);
        if (cfg == NULL)
            return MS_FAIL(err, MS_ERR_OOM, "out of memory");
        struct stat cst;
        bool has = stat(cfg, &cst) == 0;
        int e = errno;
        ms_free(cfg);
        if (!has && e != ENOENT)
            return MS_FAIL(err, MS_ERR_IO, "%s: cannot read the model folder's config.json (%s)",
                           path, strerror(e));
        if (!has)
            return MS_FAIL(err, MS_ERR_NOT_FOUND,
                           "%s: not a model: the folder has no config.json (%s)", path,
                           PROBE_MODEL_KINDS);
        p->folder = ms_strdup(path);
    } else if (!S_ISREG(st.st_mode)) {
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: not a model: %s (%s)", path,
                       ms_model_probe_file_kind(st.st_mode), PROBE_MODEL_KINDS);
    } else if (ends_with(path, ".safetensors") || ends_with(path, ".json")) {
        const char *slash = strrchr(path, '/');
        p->folder = slash == NULL ? ms_strdup(".") : ms_strndup(path, (size_t)(slash - path));
    } else if (ends_with(path, ".bin") || ends_with(path, ".gguf")) {
        p->llama2c = true; /* the file describes itself: hf_config derives config.json from it */
        return MS_OK;
    } else {
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: not a model: unknown file type (%s)", path,
                       PROBE_MODEL_KINDS);
    }
    return p->folder != NULL ? MS_OK : MS_FAIL(err, MS_ERR_OOM, "out of memory");
}

ms_status ms_model_probe_init(ms_model_probe *p, const ms_model_desc *desc, const char *path,
                              ms_error *err) {
    memset(p, 0, sizeof *p);
    ms_status st = probe_path(p, path, err);
    /* config.json of the folder (a llama2.c file derives its own from the header) */
    if (st == MS_OK)
        st = ms_hf_config_init(&p->hf, p->llama2c ? path : p->folder, err);
    if (st == MS_OK) {
        p->config = ms_calloc(1, desc->config_size > 0 ? desc->config_size : 1);
        if (p->config == NULL)
            st = MS_FAIL(err, MS_ERR_OOM, "out of memory for the model config");
    }
    if (st == MS_OK)
        st = desc->config_load(p->hf, p->config, err);
    if (st == MS_OK)
        st = desc->facts(p->config, &p->facts, err);
    if (st == MS_OK)
        st = ms_md_check_shapes(desc, p->config, err);
    if (st != MS_OK)
        ms_model_probe_free(p);
    return st;
}

void ms_model_probe_free(ms_model_probe *p) {
    ms_free(p->folder);
    ms_hf_config_free(p->hf);
    ms_free(p->config);
    memset(p, 0, sizeof *p);
}

ms_hf_config *ms_model_probe_take_hf(ms_model_probe *p) {
    ms_hf_config *hf = p->hf;
    p->hf = NULL;
    return hf;
}

void *ms_model_probe_take_config(ms_model_probe *p) {
    void *c = p->config;
    p->config = NULL;
    return c;
}
