/*
 * llama2c.c - llama2.c legacy `.bin` checkpoints: header validation, run.c's weight layout over an
 * mmap, and Hugging Face-named tensor descriptors over the same memory.
 *
 * Constraints: every size is computed in uint64 with overflow checks before any pointer is formed;
 * the file size must match the header exactly (a short file is the common corruption, a long one
 * usually means the newer export format or a wrong file); weights are never copied.
 */
#include "llama2c.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define L2C_HEADER_BYTES 28
/* "ak42" little-endian: the version 1/2 export formats of llama2.c's export.py. */
#define L2C_MAGIC 0x616b3432u

struct ms_llama2c {
    char *path;                  /* as given */
    void *map;                   /* whole-file read-only mapping */
    size_t map_size;             /* file size in bytes */
    ms_llama2c_config cfg;       /* validated header */
    ms_llama2c_weights w;        /* views into map */
    ms_st_tensor *tensors;       /* [n_tensors] HF-named views, sorted by name */
    size_t n_tensors;
    char *names;                 /* storage of the tensor names */
};

/* ---- header ---- */

/* Float counts of each section, computed from a header (overflow-checked). */
typedef struct l2c_sizes {
    uint64_t emb, rms, wq, wkv, wo, w13, w2, final, freq, cls, total;  /* floats */
} l2c_sizes;

static bool l2c_mul(uint64_t a, uint64_t b, uint64_t *out) {
    return !__builtin_mul_overflow(a, b, out);
}

static bool l2c_compute_sizes(const ms_llama2c_config *c, l2c_sizes *s) {
    uint64_t L = (uint64_t)c->n_layers, d = (uint64_t)c->dim, h = (uint64_t)c->hidden_dim;
    uint64_t qd = (uint64_t)c->n_heads * (uint64_t)c->head_size;
    uint64_t kvd = (uint64_t)c->n_kv_heads * (uint64_t)c->head_size;
    uint64_t t;
    bool ok = l2c_mul((uint64_t)c->vocab_size, d, &s->emb) && l2c_mul(L, d, &s->rms) &&
              l2c_mul(L, d, &t) && l2c_mul(t, qd, &s->wq) && l2c_mul(t, kvd, &s->wkv) &&
              l2c_mul(L, qd, &t) && l2c_mul(t, d, &s->wo) && l2c_mul(L, d, &t) && l2c_mul(t, h, &s->w13);
    if (!ok)
        return false;
    s->w2 = s->w13;
    s->final = d;
    ok = l2c_mul((uint64_t)c->seq_len, (uint64_t)c->head_size / 2, &t) && l2c_mul(t, 2, &s->freq);
    if (!ok)
        return false;
    s->cls = c->shared_classifier ? 0 : s->emb;
    uint64_t parts[] = {s->emb, s->rms, s->wq, s->wkv, s->wkv, s->wo, s->rms, s->w13, s->w2, s->w13,
                        s->final, s->freq, s->cls};
    s->total = 0;
    for (size_t i = 0; i < MS_ARRAY_LEN(parts); i++) {
        if (__builtin_add_overflow(s->total, parts[i], &s->total))
            return false;
    }
    uint64_t bytes;
    return l2c_mul(s->total, 4, &bytes) && bytes <= UINT64_MAX - L2C_HEADER_BYTES;
}

/* Validate the raw header fields and the file size. */
static ms_status l2c_check_header(const char *path, const int32_t h[7], uint64_t file_size,
                                  ms_llama2c_config *c, l2c_sizes *s, ms_error *err) {
    if ((uint32_t)h[0] == L2C_MAGIC)
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: llama2.c version 1/2 export (magic 'ak42') is not supported; "
                       "export with the legacy format (version 0)", path);
    static const char *const names[7] = {"dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size",
                                         "seq_len"};
    for (int i = 0; i < 7; i++) {
        if (h[i] == 0 || (h[i] < 0 && i != 5) || h[i] == INT32_MIN)
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: header field %s = %d is not a positive size (not a llama2.c "
                           "checkpoint?)", path, names[i], h[i]);
    }
    memset(c, 0, sizeof *c);
    c->dim = h[0];
    c->hidden_dim = h[1];
    c->n_layers = h[2];
    c->n_heads = h[3];
    c->n_kv_heads = h[4];
    c->shared_classifier = h[5] > 0;
    c->vocab_size = h[5] > 0 ? h[5] : -h[5];
    c->seq_len = h[6];
    if (c->dim % c->n_heads != 0)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: dim %d is not a multiple of n_heads %d", path, c->dim, c->n_heads);
    c->head_size = c->dim / c->n_heads;
    if (c->head_size % 2 != 0)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: head size %d (dim / n_heads) is odd; RoPE needs pairs", path,
                       c->head_size);
    if (c->n_kv_heads > c->n_heads || c->n_heads % c->n_kv_heads != 0)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: n_heads %d is not a multiple of n_kv_heads %d", path, c->n_heads,
                       c->n_kv_heads);
    if (!l2c_compute_sizes(c, s))
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: header sizes overflow (dim %d, hidden_dim %d, n_layers %d, "
                       "vocab %d, seq_len %d)", path, c->dim, c->hidden_dim, c->n_layers, c->vocab_size, c->seq_len);
    uint64_t want = L2C_HEADER_BYTES + 4 * s->total;
    if (file_size < want)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: file too short: %llu bytes, the header (dim %d, n_layers %d, vocab %d,"
                       " seq_len %d) implies %llu", path, (unsigned long long)file_size, c->dim, c->n_layers,
                       c->vocab_size, c->seq_len, (unsigned long long)want);
    if (file_size > want)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: file too long: %llu bytes, the header (dim %d, n_layers %d, vocab %d,"
                       " seq_len %d) implies %llu", path, (unsigned long long)file_size, c->dim, c->n_layers,
                       c->vocab_size, c->seq_len, (unsigned long long)want);
    return MS_OK;
}

/* Open `path`, read the header and validate it against the file size. Returns the fd in *fd_out
 * (caller closes) and the size. */
static ms_status l2c_open(const char *path, int *fd_out, uint64_t *size_out, ms_llama2c_config *c, l2c_sizes *s,
                          ms_error *err) {
    *fd_out = -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return MS_FAIL(err, MS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return MS_FAIL(err, MS_ERR_IO, "%s: not a readable regular file", path);
    }
    int32_t h[7];
    ssize_t got = pread(fd, h, sizeof h, 0);
    if (got != (ssize_t)sizeof h) {
        close(fd);
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: file too short: %lld bytes, a llama2.c header needs %d", path,
                       (long long)sb.st_size, L2C_HEADER_BYTES);
    }
    ms_status st = l2c_check_header(path, h, (uint64_t)sb.st_size, c, s, err);
    if (st != MS_OK) {
        close(fd);
        return st;
    }
    *fd_out = fd;
    *size_out = (uint64_t)sb.st_size;
    return MS_OK;
}

ms_status ms_llama2c_read_config(const char *path, ms_llama2c_config *out, ms_error *err) {
    int fd;
    uint64_t size;
    l2c_sizes s;
    MS_TRY(l2c_open(path, &fd, &size, out, &s, err));
    close(fd);
    return MS_OK;
}

/* ---- tensors under Hugging Face names ---- */

static int l2c_cmp_tensor(const void *a, const void *b) {
    return strcmp(((const ms_st_tensor *)a)->name, ((const ms_st_tensor *)b)->name);
}

/* Append one tensor view. `names` has room; *npos is the write position in it. */
static void l2c_add(ms_llama2c *m, char *names, size_t *npos, size_t cap, const char *name, const float *data,
                    int n_dims, int64_t d0, int64_t d1) {
    ms_st_tensor *t = &m->tensors[m->n_tensors++];
    int n = snprintf(names + *npos, cap - *npos, "%s", name);
    MS_ASSERT(n > 0 && (size_t)n < cap - *npos);
    t->name = names + *npos;
    *npos += (size_t)n + 1;
    t->dtype = MS_ST_DTYPE_F32;
    t->n_dims = n_dims;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->n_elems = (size_t)d0 * (size_t)(n_dims == 2 ? d1 : 1);
    t->n_bytes = t->n_elems * sizeof(float);
    t->data = data;
    t->file_offset = (size_t)((const char *)data - (const char *)m->map);
    t->file_path = m->path;
}

static ms_status l2c_build_tensors(ms_llama2c *m, ms_error *err) {
    const ms_llama2c_config *c = &m->cfg;
    const ms_llama2c_weights *w = &m->w;
    size_t n = 2 + 9 * (size_t)c->n_layers + (c->shared_classifier ? 0 : 1);
    size_t cap = n * 64;  /* longest name: "model.layers.<10 digits>.post_attention_layernorm.weight" */
    m->tensors = ms_calloc(n, sizeof *m->tensors);
    m->names = ms_malloc(cap);
    if (m->tensors == NULL || m->names == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory for %zu tensor descriptors", m->path, n);
    size_t pos = 0;
    int64_t d = c->dim, h = c->hidden_dim, qd = (int64_t)c->n_heads * c->head_size;
    int64_t kvd = (int64_t)c->n_kv_heads * c->head_size, V = c->vocab_size;
    char name[96];
    l2c_add(m, m->names, &pos, cap, "model.embed_tokens.weight", w->token_embedding_table, 2, V, d);
    l2c_add(m, m->names, &pos, cap, "model.norm.weight", w->rms_final_weight, 1, d, 0);
    if (!c->shared_classifier)
        l2c_add(m, m->names, &pos, cap, "lm_head.weight", w->wcls, 2, V, d);
    for (int64_t l = 0; l < c->n_layers; l++) {
#define L2C_LAYER(suffix, base, per, nd, a, b)                                          \
    do {                                                                                \
        snprintf(name, sizeof name, "model.layers.%lld." suffix, (long long)l);         \
        l2c_add(m, m->names, &pos, cap, name, (base) + l * (per), nd, a, b);            \
    } while (0)
        L2C_LAYER("input_layernorm.weight", w->rms_att_weight, d, 1, d, 0);
        L2C_LAYER("self_attn.q_proj.weight", w->wq, qd * d, 2, qd, d);
        L2C_LAYER("self_attn.k_proj.weight", w->wk, kvd * d, 2, kvd, d);
        L2C_LAYER("self_attn.v_proj.weight", w->wv, kvd * d, 2, kvd, d);
        L2C_LAYER("self_attn.o_proj.weight", w->wo, d * qd, 2, d, qd);
        L2C_LAYER("post_attention_layernorm.weight", w->rms_ffn_weight, d, 1, d, 0);
        L2C_LAYER("mlp.gate_proj.weight", w->w1, h * d, 2, h, d);
        L2C_LAYER("mlp.down_proj.weight", w->w2, d * h, 2, d, h);
        L2C_LAYER("mlp.up_proj.weight", w->w3, h * d, 2, h, d);
#undef L2C_LAYER
    }
    MS_ASSERT(m->n_tensors == n);
    qsort(m->tensors, m->n_tensors, sizeof *m->tensors, l2c_cmp_tensor);
    return MS_OK;
}

/* ---- init / free ---- */

ms_status ms_llama2c_init(ms_llama2c **out, const char *path, ms_error *err) {
    *out = NULL;
    ms_llama2c *m = ms_calloc(1, sizeof *m);
    if (m == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", path);
    ms_status st;
    int fd = -1;
    uint64_t size;
    l2c_sizes s;
    m->path = ms_strdup(path);
    if (m->path == NULL) {
        st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", path);
        goto fail;
    }
    st = l2c_open(path, &fd, &size, &m->cfg, &s, err);
    if (st != MS_OK)
        goto fail;
    m->map_size = (size_t)size;
    m->map = mmap(NULL, m->map_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m->map == MAP_FAILED) {
        m->map = NULL;
        st = MS_FAIL(err, MS_ERR_IO, "%s: cannot mmap: %s", path, strerror(errno));
        goto fail;
    }
    /* The mapping is page-aligned and the header is 28 bytes, so every float is 4-byte aligned. */
    const float *p = (const float *)((const char *)m->map + L2C_HEADER_BYTES);
    ms_llama2c_weights *w = &m->w;
    w->token_embedding_table = p;
    p += s.emb;
    w->rms_att_weight = p;
    p += s.rms;
    w->wq = p;
    p += s.wq;
    w->wk = p;
    p += s.wkv;
    w->wv = p;
    p += s.wkv;
    w->wo = p;
    p += s.wo;
    w->rms_ffn_weight = p;
    p += s.rms;
    w->w1 = p;
    p += s.w13;
    w->w2 = p;
    p += s.w2;
    w->w3 = p;
    p += s.w13;
    w->rms_final_weight = p;
    p += s.final;
    p += s.freq;  /* freq_cis_real and freq_cis_imag: unused (RoPE is recomputed) */
    w->wcls = m->cfg.shared_classifier ? w->token_embedding_table : p;
    p += s.cls;
    MS_ASSERT((const char *)p == (const char *)m->map + m->map_size);
    st = l2c_build_tensors(m, err);
    if (st != MS_OK)
        goto fail;
    *out = m;
    return MS_OK;
fail:
    ms_llama2c_free(m);
    return st;
}

void ms_llama2c_free(ms_llama2c *m) {
    if (m == NULL)
        return;
    if (m->map != NULL)
        munmap(m->map, m->map_size);
    ms_free(m->tensors);
    ms_free(m->names);
    ms_free(m->path);
    ms_free(m);
}

const char *ms_llama2c_path(const ms_llama2c *m) {
    return m->path;
}

const ms_llama2c_config *ms_llama2c_get_config(const ms_llama2c *m) {
    return &m->cfg;
}

const ms_llama2c_weights *ms_llama2c_get_weights(const ms_llama2c *m) {
    return &m->w;
}

size_t ms_llama2c_n_tensors(const ms_llama2c *m) {
    return m->n_tensors;
}

const ms_st_tensor *ms_llama2c_tensor_at(const ms_llama2c *m, size_t i) {
    MS_ASSERT(i < m->n_tensors);
    return &m->tensors[i];
}

ms_status ms_llama2c_config_json(const ms_llama2c_config *c, const char *path, char **out, ms_error *err) {
    *out = ms_asprintf(
        "{\n"
        "  \"architectures\": [\"LlamaForCausalLM\"],\n"
        "  \"model_type\": \"llama\",\n"
        "  \"source_format\": \"llama2c\",\n"
        "  \"hidden_size\": %d,\n"
        "  \"intermediate_size\": %d,\n"
        "  \"num_hidden_layers\": %d,\n"
        "  \"num_attention_heads\": %d,\n"
        "  \"num_key_value_heads\": %d,\n"
        "  \"head_dim\": %d,\n"
        "  \"vocab_size\": %d,\n"
        "  \"max_position_embeddings\": %d,\n"
        "  \"rms_norm_eps\": 1e-05,\n"
        "  \"rope_theta\": 10000.0,\n"
        "  \"rope_interleaved\": true,\n"
        "  \"hidden_act\": \"silu\",\n"
        "  \"tie_word_embeddings\": %s,\n"
        "  \"bos_token_id\": 1,\n"
        "  \"eos_token_id\": 1\n"
        "}\n",
        c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->head_size, c->vocab_size, c->seq_len,
        c->shared_classifier ? "true" : "false");
    if (*out == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", path);
    return MS_OK;
}
