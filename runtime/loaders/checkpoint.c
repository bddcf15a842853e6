/*
 * checkpoint.c - single-file and sharded safetensors checkpoints behind one sorted name index.
 *
 * Constraints: the index is validated against the shards in both directions before the checkpoint
 * is handed out, so a lookup never has to consider inconsistency; lookups are binary searches over
 * one sorted array of borrowed descriptors (no hashing, no allocation after init).
 */
#include "checkpoint.h"

#include "gguf_model.h"
#include "llama2c.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct ms_ckpt {
    char *path;                    /* describing file: index .json or the single .safetensors */
    ms_st_file **files;            /* [n_files] open shards */
    size_t n_files;
    ms_llama2c *l2c;               /* a llama2.c .bin instead of safetensors (then n_files == 0) */
    ms_gguf_model *gguf;           /* a .gguf instead of safetensors (then n_files == 0) */
    const ms_st_tensor **tensors;  /* [n_tensors] borrowed from files, sorted by name */
    size_t n_tensors;
};

static int ck_cmp_tensor_ptr(const void *a, const void *b) {
    const ms_st_tensor *x = *(const ms_st_tensor *const *)a;
    const ms_st_tensor *y = *(const ms_st_tensor *const *)b;
    return strcmp(x->name, y->name);
}

static bool ck_ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* A shard name must stay inside the index's folder: relative, no ".." component, not empty. */
static bool ck_shard_name_ok(const char *name) {
    if (name[0] == '\0' || name[0] == '/')
        return false;
    const char *p = name;
    while (*p) {
        const char *slash = strchr(p, '/');
        size_t len = slash ? (size_t)(slash - p) : strlen(p);
        if (len == 2 && p[0] == '.' && p[1] == '.')
            return false;
        if (slash == NULL)
            break;
        p = slash + 1;
    }
    return true;
}

/* Collect every shard's tensors into ck->tensors, sorted. */
static ms_status ck_build_index(ms_ckpt *ck, ms_error *err) {
    size_t n = ck->l2c ? ms_llama2c_n_tensors(ck->l2c) : 0;
    n += ck->gguf ? ms_gguf_model_n_tensors(ck->gguf) : 0;
    for (size_t i = 0; i < ck->n_files; i++)
        n += ms_st_file_n_tensors(ck->files[i]);
    ck->tensors = ms_calloc(n ? n : 1, sizeof *ck->tensors);
    if (ck->tensors == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory for the tensor index", ck->path);
    for (size_t i = 0; i < ck->n_files; i++) {
        for (size_t j = 0; j < ms_st_file_n_tensors(ck->files[i]); j++)
            ck->tensors[ck->n_tensors++] = ms_st_file_tensor_at(ck->files[i], j);
    }
    for (size_t j = 0; ck->l2c != NULL && j < ms_llama2c_n_tensors(ck->l2c); j++)
        ck->tensors[ck->n_tensors++] = ms_llama2c_tensor_at(ck->l2c, j);
    for (size_t j = 0; ck->gguf != NULL && j < ms_gguf_model_n_tensors(ck->gguf); j++)
        ck->tensors[ck->n_tensors++] = ms_gguf_model_tensor_at(ck->gguf, j);
    qsort(ck->tensors, ck->n_tensors, sizeof *ck->tensors, ck_cmp_tensor_ptr);
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const ms_st_tensor *t = ck->tensors[i];
        if (!(MS_ST_DTYPES_FLOAT & MS_ST_DTYPE_BIT(t->dtype)))
            return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s, not supported for weights "
                           "(supported: F32, BF16, F16)", t->file_path, t->name, ms_st_dtype_name(t->dtype));
    }
    for (size_t i = 1; i < ck->n_tensors; i++) {
        if (strcmp(ck->tensors[i - 1]->name, ck->tensors[i]->name) == 0)
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: tensor '%s' appears in both %s and %s", ck->path,
                           ck->tensors[i]->name, ck->tensors[i - 1]->file_path, ck->tensors[i]->file_path);
    }
    return MS_OK;
}

static ms_status ck_open_single(ms_ckpt *ck, ms_error *err) {
    ck->files = ms_calloc(1, sizeof *ck->files);
    if (ck->files == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", ck->path);
    MS_TRY(ms_st_file_init(&ck->files[0], ck->path, err));
    ck->n_files = 1;
    return ck_build_index(ck, err);
}

/* Path of shard `shard` of the index ck->path: "<index folder>/<shard>" (ms_malloc'd, NULL on OOM). */
static char *ck_shard_path(const ms_ckpt *ck, const char *shard) {
    const char *slash = strrchr(ck->path, '/');
    int dir_len = slash ? (int)(slash - ck->path) : 1;
    const char *dir = slash ? ck->path : ".";
    return ms_asprintf("%.*s/%s", dir_len, dir, shard);
}

/* Open every shard the weight map names (each once, in order of first mention). */
static ms_status ck_open_shards(ms_ckpt *ck, json_t *map, ms_error *err) {
    size_t cap = 0;
    const char *tname;
    json_t *v;
    json_object_foreach(map, tname, v) {
        if (!json_is_string(v))
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: weight_map entry '%s' is not a file name", ck->path, tname);
        const char *shard = json_string_value(v);
        if (!ck_shard_name_ok(shard))
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: weight_map entry '%s' names shard '%s' outside the "
                           "checkpoint folder", ck->path, tname, shard);
        char *shard_path = ck_shard_path(ck, shard);
        if (shard_path == NULL)
            return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", ck->path);
        bool seen = false;
        for (size_t i = 0; i < ck->n_files && !seen; i++)
            seen = strcmp(ms_st_file_path(ck->files[i]), shard_path) == 0;
        ms_status st = MS_OK;
        if (!seen) {
            if (ms_grow((void **)&ck->files, &cap, ck->n_files + 1, sizeof *ck->files) != MS_OK)
                st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", ck->path);
            else
                st = ms_st_file_init(&ck->files[ck->n_files], shard_path, err);
            if (st == MS_OK)
                ck->n_files++;
        }
        ms_free(shard_path);
        if (st != MS_OK)
            return st;
    }
    return MS_OK;
}

static ms_status ck_open_index(ms_ckpt *ck, ms_error *err) {
    json_error_t jerr;
    json_t *root = json_load_file(ck->path, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL) {
        if (jerr.line < 0 || access(ck->path, R_OK) != 0)
            return MS_FAIL(err, MS_ERR_IO, "%s: cannot read: %s", ck->path, jerr.text);
        return MS_FAIL(err, MS_ERR_PARSE, "%s:%d:%d: malformed JSON: %s", ck->path, jerr.line,
                       jerr.column, jerr.text);
    }
    ms_status st = MS_OK;
    json_t *map = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(map)) {
        st = MS_FAIL(err, MS_ERR_FORMAT, "%s: shard index has no 'weight_map' object", ck->path);
        goto done;
    }
    if (json_object_size(map) == 0) {
        st = MS_FAIL(err, MS_ERR_FORMAT, "%s: shard index has an empty 'weight_map'", ck->path);
        goto done;
    }
    st = ck_open_shards(ck, map, err);
    if (st != MS_OK)
        goto done;
    st = ck_build_index(ck, err);
    if (st != MS_OK)
        goto done;
    /* Both directions: every shard tensor is mapped to its own shard, every mapped tensor exists. */
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const ms_st_tensor *t = ck->tensors[i];
        json_t *v = json_object_get(map, t->name);
        if (v == NULL) {
            st = MS_FAIL(err, MS_ERR_FORMAT, "%s: shard %s holds tensor '%s' that weight_map does not list",
                         ck->path, t->file_path, t->name);
            goto done;
        }
        char *mapped = ck_shard_path(ck, json_string_value(v));
        if (mapped == NULL) {
            st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", ck->path);
            goto done;
        }
        bool same = strcmp(mapped, t->file_path) == 0;
        ms_free(mapped);
        if (!same) {
            st = MS_FAIL(err, MS_ERR_FORMAT, "%s: tensor '%s' is mapped to %s but stored in %s", ck->path,
                         t->name, json_string_value(v), t->file_path);
            goto done;
        }
    }
    const char *tname;
    json_t *v;
    json_object_foreach(map, tname, v) {
        if (ms_ckpt_find_tensor(ck, tname) == NULL) {
            st = MS_FAIL(err, MS_ERR_FORMAT, "%s: weight_map lists tensor '%s' but shard %s does not hold it",
                         ck->path, tname, json_string_value(v));
            goto done;
        }
    }
done:
    json_decref(root);
    return st;
}

ms_status ms_ckpt_init(ms_ckpt **out, const char *path, ms_error *err) {
    *out = NULL;
    ms_ckpt *ck = ms_calloc(1, sizeof *ck);
    if (ck == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", path);
    ms_status st;
    struct stat sb;
    if (stat(path, &sb) != 0) {
        st = MS_FAIL(err, errno == ENOENT ? MS_ERR_NOT_FOUND : MS_ERR_IO, "%s: cannot open checkpoint: %s",
                     path, strerror(errno));
        goto fail;
    }
    bool index = false;
    if (S_ISDIR(sb.st_mode)) {
        size_t len = strlen(path);
        while (len > 1 && path[len - 1] == '/')
            len--;
        ck->path = ms_asprintf("%.*s/model.safetensors.index.json", (int)len, path);
        if (ck->path == NULL) {
            st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", path);
            goto fail;
        }
        index = access(ck->path, F_OK) == 0;
        char *single = index ? ms_asprintf("%.*s/model.safetensors", (int)len, path) : NULL;
        if (index && single == NULL) {
            st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", path);
            goto fail;
        }
        bool both = single != NULL && access(single, F_OK) == 0;
        ms_free(single);
        if (both) {
            /* transformers would load the single file, an index-first loader the shards: which
             * one is meant is the user's call, not a silent pick */
            st = MS_FAIL(err, MS_ERR_FORMAT,
                         "%s: holds both model.safetensors.index.json and model.safetensors, so "
                         "which one is the checkpoint is ambiguous: remove the stray one, or give "
                         "the file itself as the model",
                         path);
            goto fail;
        }
        if (!index) {
            ms_free(ck->path);
            ck->path = ms_asprintf("%.*s/model.safetensors", (int)len, path);
            if (ck->path == NULL) {
                st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", path);
                goto fail;
            }
            if (access(ck->path, F_OK) != 0) {
                st = MS_FAIL(err, MS_ERR_NOT_FOUND,
                             "%s: folder holds neither model.safetensors nor model.safetensors.index.json", path);
                goto fail;
            }
        }
    } else {
        ck->path = ms_strdup(path);
        if (ck->path == NULL) {
            st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", path);
            goto fail;
        }
        index = ck_ends_with(path, ".json");
    }
    if (index) {
        st = ck_open_index(ck, err);
    } else if (ck_ends_with(ck->path, ".gguf")) {
        st = ms_gguf_model_init(&ck->gguf, ck->path, err);
        if (st == MS_OK)
            st = ck_build_index(ck, err);
    } else if (ck_ends_with(ck->path, ".bin")) {
        st = ms_llama2c_init(&ck->l2c, ck->path, err);
        if (st == MS_OK)
            st = ck_build_index(ck, err);
    } else {
        st = ck_open_single(ck, err);
    }
    if (st != MS_OK)
        goto fail;
    *out = ck;
    return MS_OK;
fail:
    ms_ckpt_free(ck);
    return st;
}

void ms_ckpt_free(ms_ckpt *ck) {
    if (ck == NULL)
        return;
    for (size_t i = 0; i < ck->n_files; i++)
        ms_st_file_free(ck->files[i]);
    ms_free(ck->files);
    ms_llama2c_free(ck->l2c);
    ms_gguf_model_free(ck->gguf);
    ms_free(ck->tensors);
    ms_free(ck->path);
    ms_free(ck);
}

const char *ms_ckpt_path(const ms_ckpt *ck) {
    return ck->path;
}

size_t ms_ckpt_n_files(const ms_ckpt *ck) {
    return ck->n_files;
}

const ms_llama2c *ms_ckpt_get_llama2c(const ms_ckpt *ck) {
    return ck->l2c;
}

const ms_gguf *ms_ckpt_get_gguf(const ms_ckpt *ck) {
    return ck->gguf ? ms_gguf_model_file(ck->gguf) : NULL;
}

const struct ms_gguf_model *ms_ckpt_get_gguf_model(const ms_ckpt *ck) {
    return ck->gguf;
}

size_t ms_ckpt_n_tensors(const ms_ckpt *ck) {
    return ck->n_tensors;
}

const ms_st_tensor *ms_ckpt_tensor_at(const ms_ckpt *ck, size_t i) {
    MS_ASSERT(i < ck->n_tensors);
    return ck->tensors[i];
}

const ms_st_tensor *ms_ckpt_find_tensor(const ms_ckpt *ck, const char *name) {
    ms_st_tensor key = {.name = name};
    const ms_st_tensor *kp = &key;
    const ms_st_tensor **hit = bsearch(&kp, ck->tensors, ck->n_tensors, sizeof *ck->tensors,
                                       ck_cmp_tensor_ptr);
    return hit ? *hit : NULL;
}

bool ms_ckpt_has_tensor(const ms_ckpt *ck, const char *name) {
    return ms_ckpt_find_tensor(ck, name) != NULL;
}

/* ---- declared weights ---- */

ms_status ms_ckpt_expect_tensor(const ms_ckpt *ck, const char *name, unsigned dtype_mask, int n_dims,
                                const int64_t *shape, const ms_st_tensor **out, ms_error *err) {
    char want[160], have[160];
    if (out != NULL)
        *out = NULL;
    MS_ASSERT(n_dims >= 0 && n_dims <= MS_ST_MAX_DIMS);
    ms_st_shape_str(n_dims, shape, want, sizeof want);
    const ms_st_tensor *t = ms_ckpt_find_tensor(ck, name);
    if (t == NULL)
        return MS_FAIL(err, MS_ERR_NOT_FOUND, "%s: tensor '%s' not found (the model declares it as %s)",
                       ck->path, name, want);
    if (!(dtype_mask & MS_ST_DTYPE_BIT(t->dtype))) {
        char accepted[64];
        ms_st_dtype_mask_str(dtype_mask, accepted, sizeof accepted);
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: tensor '%s' has dtype %s, the model accepts %s",
                       t->file_path, name, ms_st_dtype_name(t->dtype), accepted);
    }
    bool match = t->n_dims == n_dims;
    for (int i = 0; match && i < n_dims; i++)
        match = shape[i] == -1 || shape[i] == t->shape[i];
    if (!match) {
        ms_st_shape_str(t->n_dims, t->shape, have, sizeof have);
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: tensor '%s' has shape %s, the model declares %s",
                       t->file_path, name, have, want);
    }
    if (out != NULL)
        *out = t;
    return MS_OK;
}

ms_status ms_ckpt_load_f32(const ms_ckpt *ck, const char *name, unsigned dtype_mask, int n_dims,
                           const int64_t *shape, float **out, ms_error *err) {
    *out = NULL;
    const ms_st_tensor *t;
    MS_TRY(ms_ckpt_expect_tensor(ck, name, dtype_mask, n_dims, shape, &t, err));
    float *buf = ms_malloc(t->n_elems ? t->n_elems * sizeof *buf : 1);
    if (buf == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory for tensor '%s' (%zu floats)", t->file_path,
                       name, t->n_elems);
    ms_status st = ms_st_tensor_to_f32(t, buf, t->n_elems, err);
    if (st != MS_OK) {
        ms_free(buf);
        return st;
    }
    *out = buf;
    return MS_OK;
}

ms_status ms_ckpt_load_bf16(const ms_ckpt *ck, const char *name, unsigned dtype_mask, int n_dims,
                            const int64_t *shape, uint16_t **out, ms_error *err) {
    *out = NULL;
    const ms_st_tensor *t;
    MS_TRY(ms_ckpt_expect_tensor(ck, name, dtype_mask, n_dims, shape, &t, err));
    uint16_t *buf = ms_malloc(t->n_elems ? t->n_elems * sizeof *buf : 1);
    if (buf == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory for tensor '%s' (%zu bf16)", t->file_path,
                       name, t->n_elems);
    ms_status st = ms_st_tensor_to_bf16(t, buf, t->n_elems, err);
    if (st != MS_OK) {
        ms_free(buf);
        return st;
    }
    *out = buf;
    return MS_OK;
}
