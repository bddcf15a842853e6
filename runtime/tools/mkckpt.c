/*
 * mkckpt.c - mstar-mkckpt: write seeded random-weight Llama checkpoints (config.json,
 * generation_config.json, model.safetensors with Hugging Face names), split a checkpoint into
 * shards with an index, or check that a checkpoint holds a consistent Llama.
 *
 *   mstar-mkckpt [--out DIR] [--preset tiny|small|llama3-8b] [--dtype f32|bf16] [--seed N]
 *                [--hidden N] [--layers N] [--heads N] [--kv-heads N] [--head-dim N]
 *                [--intermediate N] [--vocab N] [--max-pos N] [--rope-theta X] [--tie | --no-tie]
 *                [--legacy-config] [--shards N] [--bos ID] [--eos ID[,ID[,ID]]]
 *   mstar-mkckpt --format gguf [--quant q4_0|q4_k|q8_0|f32|f16|bf16] [--out FILE.gguf | DIR] [model options]
 *   mstar-mkckpt --split SRC --shards N --out DIR
 *   mstar-mkckpt --check PATH...
 *
 * Default: the "small" preset into build/demo-llama (what `make demo` uses). Weights are uniform with
 * standard deviation 0.02 (norm weights 1.0), drawn per tensor from a stream seeded by (seed, tensor
 * name), so a tensor's values do not depend on the others or on the chunking. Data is generated
 * and written in chunks: an 8B checkpoint never sits in memory.
 *
 * --format gguf writes the same weights (same seed, same values) as one GGUF v3 file of architecture
 * llama instead: 2-D weights quantized with ggml's reference quantizers (gguf_quant.h) to --quant
 * (default q8_0), norms and any matrix whose rows are not a multiple of the quant block kept F32
 * (as llama.cpp's quantizer keeps such tensors in a wider type), q_proj/k_proj rows permuted as
 * convert_hf_to_gguf.py's LlamaModel.permute does, so every GGUF reader (ours un-permutes at load)
 * sees a llama.cpp-style file. Llama 3.1 frequency scaling has no GGUF key: like llama.cpp's
 * converter, the llama3-8b preset's GGUF holds a rope_freqs.weight tensor (one F32 divisor per
 * rotary pair), from which our loader recovers rope_type llama3. An 8B-shaped GGUF is about 4.7 GB in q4_0.
 * Quantization runs on a thread pool of the online CPUs (at most 64); values are generated in
 * the same sequential streams as for safetensors, so the result does not depend on the thread count.
 *
 * Constraints: a CLI main: errors are one line "mstar-mkckpt: <problem>" on stderr and exit status 1;
 * a failed write leaves no partial model file (the writer removes it).
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "checkpoint.h"
#include "gguf.h"
#include "gguf_quant.h"
#include "hf_config.h"
#include "ms_base.h"
#include "threadpool.h"
#include "safetensors.h"

#define MK_CHUNK ((size_t)1 << 20)  /* elements generated per write */
#define MK_MAX_SHARDS 64

/* ---- options ---- */

typedef struct mk_model {
    int64_t hidden, layers, heads, kv_heads, head_dim, inter, vocab, max_pos;
    double theta, eps;
    bool tie;
    bool llama3_rope;        /* Llama 3.1 rope scaling (factor 8, 1, 4, original 8192) */
    int64_t bos;
    int64_t eos[3];
    int n_eos;
} mk_model;

typedef struct mk_opts {
    const char *out;         /* output folder */
    const char *split;       /* --split SRC */
    const char *check;       /* --check PATH (more paths follow in argv[check_next ..]) */
    int check_next;          /* argv index after the first --check path */
    int argc;
    char **argv;
    ms_st_dtype dtype;
    bool dtype_set;
    uint64_t seed;
    int shards;              /* 1 = single model.safetensors */
    bool legacy_config;      /* rope_theta + rope_scaling instead of rope_parameters */
    bool gguf;               /* --format gguf */
    uint32_t quant;          /* --quant: the ggml type of 2-D weights in a GGUF */
    bool quant_set;
    mk_model m;
} mk_opts;

static void mk_preset(mk_model *m, const char *name, bool *ok) {
    *ok = true;
    memset(m, 0, sizeof *m);
    m->theta = 10000.0;
    m->eps = 1e-5;
    m->bos = 1;
    m->eos[0] = 2;
    m->n_eos = 1;
    if (strcmp(name, "tiny") == 0) {
        *m = (mk_model){.hidden = 64, .layers = 2, .heads = 4, .kv_heads = 2, .head_dim = 16, .inter = 128,
                        .vocab = 256, .max_pos = 256, .theta = 10000.0, .eps = 1e-5, .tie = false, .bos = 1,
                        .eos = {2}, .n_eos = 1};
    } else if (strcmp(name, "small") == 0) {
        *m = (mk_model){.hidden = 256, .layers = 4, .heads = 8, .kv_heads = 2, .head_dim = 32, .inter = 768,
                        .vocab = 4096, .max_pos = 1024, .theta = 10000.0, .eps = 1e-5, .tie = false, .bos = 1,
                        .eos = {2}, .n_eos = 1};
    } else if (strcmp(name, "llama3-8b") == 0) {
        *m = (mk_model){.hidden = 4096, .layers = 32, .heads = 32, .kv_heads = 8, .head_dim = 128, .inter = 14336,
                        .vocab = 128256, .max_pos = 131072, .theta = 500000.0, .eps = 1e-5, .tie = false,
                        .llama3_rope = true, .bos = 128000, .eos = {128001, 128008, 128009}, .n_eos = 3};
    } else {
        *ok = false;
    }
}

static void usage(FILE *fp) {
    fputs("usage: mstar-mkckpt [--out DIR] [--preset tiny|small|llama3-8b] [--dtype f32|bf16] [--seed N]\n"
          "                    [--hidden N] [--layers N] [--heads N] [--kv-heads N] [--head-dim N]\n"
          "                    [--intermediate N] [--vocab N] [--max-pos N] [--rope-theta X]\n"
          "                    [--tie | --no-tie] [--legacy-config] [--shards N]\n"
          "                    [--bos ID] [--eos ID[,ID[,ID]]]   (bos_token_id / eos_token_id)\n"
          "       mstar-mkckpt --format gguf [--quant q4_0|q4_k|q8_0|f32|f16|bf16] [--out FILE.gguf|DIR]\n"
          "                    [model options as above]   (one llama GGUF; default quant q8_0)\n"
          "       mstar-mkckpt --split SRC --shards N --out DIR\n"
          "       mstar-mkckpt --check PATH...   (stops at the first failing checkpoint)\n"
          "Writes a seeded random-weight Llama checkpoint (config.json, generation_config.json,\n"
          "model.safetensors) with Hugging Face tensor names; default: --preset small --dtype f32\n"
          "--seed 1 --out build/demo-llama. llama3-8b defaults to bf16 (about 16 GB).\n",
          fp);
}

static int die(const char *fmt, ...) MS_PRINTF(1, 2);
static int die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fputs("mstar-mkckpt: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

static bool parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

/* Parse argv into o. Returns 0, or 1 after printing the error, or 2 for --help. */
static int parse_args(int argc, char **argv, mk_opts *o) {
    bool ok;
    memset(o, 0, sizeof *o);
    o->out = "build/demo-llama";
    o->dtype = MS_ST_DTYPE_F32;
    o->seed = 1;
    o->shards = 1;
    mk_preset(&o->m, "small", &ok);
    /* the preset first, so explicit sizes override it wherever they appear */
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--preset") == 0) {
            mk_preset(&o->m, argv[i + 1], &ok);
            if (!ok)
                return die("unknown preset '%s' (tiny, small, llama3-8b)", argv[i + 1]);
            if (strcmp(argv[i + 1], "llama3-8b") == 0)
                o->dtype = MS_ST_DTYPE_BF16;
        }
    }
    /* flags that take a value: anything else that is not a switch is unknown */
    static const char *const valued[] = {
        "--out", "--preset", "--dtype", "--seed", "--hidden", "--layers", "--heads", "--kv-heads",
        "--head-dim", "--intermediate", "--vocab", "--max-pos", "--rope-theta", "--shards",
        "--split", "--check", "--bos", "--eos", "--format", "--quant",
    };
    const char *tie_flag = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0)
            return 2;
        if (strcmp(a, "--tie") == 0 || strcmp(a, "--no-tie") == 0) {
            if (tie_flag != NULL && strcmp(tie_flag, a) != 0)
                return die("give --tie or --no-tie, not both");
            tie_flag = a;
            o->m.tie = strcmp(a, "--tie") == 0;
            continue;
        }
        if (strcmp(a, "--legacy-config") == 0) {
            o->legacy_config = true;
            continue;
        }
        bool takes_value = false;
        for (size_t k = 0; k < MS_ARRAY_LEN(valued) && !takes_value; k++)
            takes_value = strcmp(a, valued[k]) == 0;
        if (!takes_value)
            return die("unknown option '%s'; see --help", a);
        if (i + 1 >= argc)
            return die("%s needs a value; see --help", a);
        const char *v = argv[++i];
        int64_t n;
        struct {
            const char *flag;
            int64_t *dst;
            int64_t hi;
        } ints[] = {
            {"--hidden", &o->m.hidden, 1 << 20},   {"--layers", &o->m.layers, 4096},
            {"--heads", &o->m.heads, 4096},        {"--kv-heads", &o->m.kv_heads, 4096},
            {"--head-dim", &o->m.head_dim, 4096},  {"--intermediate", &o->m.inter, 1 << 22},
            {"--vocab", &o->m.vocab, 1 << 24},     {"--max-pos", &o->m.max_pos, 1 << 24},
        };
        bool handled = false;
        for (size_t k = 0; k < MS_ARRAY_LEN(ints) && !handled; k++) {
            if (strcmp(a, ints[k].flag) != 0)
                continue;
            if (!parse_int(v, 1, ints[k].hi, ints[k].dst))
                return die("%s '%s' is not an integer in 1 .. %lld", a, v, (long long)ints[k].hi);
            handled = true;
        }
        if (handled)
            continue;
        if (strcmp(a, "--preset") == 0) {
            continue;  /* applied above */
        } else if (strcmp(a, "--out") == 0) {
            o->out = v;
        } else if (strcmp(a, "--split") == 0) {
            o->split = v;
        } else if (strcmp(a, "--check") == 0) {
            o->check = v;
            o->check_next = i + 1;
            o->argc = argc;
            o->argv = argv;
            break;  /* every later argument is another checkpoint to check */
        } else if (strcmp(a, "--dtype") == 0) {
            o->dtype_set = true;
            if (strcmp(v, "f32") == 0)
                o->dtype = MS_ST_DTYPE_F32;
            else if (strcmp(v, "bf16") == 0)
                o->dtype = MS_ST_DTYPE_BF16;
            else
                return die("--dtype '%s' is not f32 or bf16", v);
        } else if (strcmp(a, "--format") == 0) {
            if (strcmp(v, "gguf") != 0 && strcmp(v, "safetensors") != 0)
                return die("--format '%s' is not safetensors or gguf", v);
            o->gguf = strcmp(v, "gguf") == 0;
        } else if (strcmp(a, "--quant") == 0) {
            static const struct {
                const char *name;
                uint32_t type;
            } quants[] = {{"q4_0", MS_GGML_TYPE_Q4_0}, {"q4_k", MS_GGML_TYPE_Q4_K}, {"q8_0", MS_GGML_TYPE_Q8_0},
                          {"f32", MS_GGML_TYPE_F32},   {"f16", MS_GGML_TYPE_F16},   {"bf16", MS_GGML_TYPE_BF16}};
            o->quant_set = false;
            for (size_t k = 0; k < MS_ARRAY_LEN(quants) && !o->quant_set; k++)
                if (strcmp(v, quants[k].name) == 0) {
                    o->quant = quants[k].type;
                    o->quant_set = true;
                }
            if (!o->quant_set)
                return die("--quant '%s' is not q4_0, q4_k, q8_0, f32, f16 or bf16", v);
        } else if (strcmp(a, "--seed") == 0) {
            if (!parse_int(v, 0, INT64_MAX, &n))
                return die("--seed '%s' is not a non-negative integer", v);
            o->seed = (uint64_t)n;
        } else if (strcmp(a, "--shards") == 0) {
            if (!parse_int(v, 1, MK_MAX_SHARDS, &n))
                return die("--shards '%s' is not an integer in 1 .. %d", v, MK_MAX_SHARDS);
            o->shards = (int)n;
        } else if (strcmp(a, "--bos") == 0) {
            if (!parse_int(v, 0, INT32_MAX, &o->m.bos))
                return die("--bos '%s' is not a token id (an integer >= 0)", v);
        } else if (strcmp(a, "--eos") == 0) {
            /* one to three ids, comma-separated; every entry non-empty */
            const char *p = v;
            o->m.n_eos = 0;
            for (;;) {
                char item[24];
                size_t len = strcspn(p, ",");
                if (o->m.n_eos == (int)MS_ARRAY_LEN(o->m.eos) || len == 0 || len >= sizeof item)
                    return die("--eos '%s' is not one to three comma-separated token ids", v);
                memcpy(item, p, len);
                item[len] = '\0';
                if (!parse_int(item, 0, INT32_MAX, &o->m.eos[o->m.n_eos]))
                    return die("--eos '%s': '%s' is not a token id (an integer >= 0)", v, item);
                o->m.n_eos++;
                if (p[len] == '\0')
                    break;
                p += len + 1;
            }
        } else if (strcmp(a, "--rope-theta") == 0) {
            char *end;
            o->m.theta = strtod(v, &end);
            if (end == v || *end != '\0' || !(o->m.theta > 0.0) || !isfinite(o->m.theta))
                return die("--rope-theta '%s' is not a positive number", v);
        } else {
            return die("unknown option '%s'; see --help", a);
        }
    }
    const mk_model *m = &o->m;
    if (o->quant_set && !o->gguf)
        return die("--quant needs --format gguf (safetensors takes --dtype)");
    if (o->gguf && (o->shards != 1 || o->legacy_config))
        return die("--format gguf writes one file: --shards and --legacy-config do not apply");
    if (o->gguf && o->dtype_set)
        return die("--format gguf takes --quant, not --dtype");
    if (o->gguf && !o->quant_set)
        o->quant = MS_GGML_TYPE_Q8_0;
    if (m->heads % m->kv_heads != 0)
        return die("--heads %lld is not a multiple of --kv-heads %lld", (long long)m->heads, (long long)m->kv_heads);
    if (m->head_dim % 2 != 0)
        return die("--head-dim %lld is odd; RoPE needs pairs", (long long)m->head_dim);
    if (m->bos >= m->vocab)
        return die("--bos %lld is outside the vocabulary of %lld ids", (long long)m->bos,
                   (long long)m->vocab);
    for (int i = 0; i < m->n_eos; i++)
        if (m->eos[i] >= m->vocab)
            return die("--eos %lld is outside the vocabulary of %lld ids", (long long)m->eos[i],
                       (long long)m->vocab);
    return 0;
}

/* ---- random weights ---- */

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* FNV-1a of a tensor name, mixed with the seed: the tensor's own stream. */
static uint64_t stream_seed(uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const char *p = name; *p; p++)
        h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    uint64_t s = seed ^ h;
    return splitmix64(&s);
}

/* A declared tensor: name, shape, and whether it is a norm weight (all ones). */
typedef struct mk_tensor {
    char name[96];
    int n_dims;
    int64_t shape[2];
    bool is_norm;
} mk_tensor;

static void mk_add(mk_tensor *t, size_t *n, size_t cap, const char *name, int n_dims, int64_t d0, int64_t d1,
                   bool is_norm) {
    MS_ASSERT(*n < cap);
    mk_tensor *x = &t[(*n)++];
    snprintf(x->name, sizeof x->name, "%s", name);
    x->n_dims = n_dims;
    x->shape[0] = d0;
    x->shape[1] = d1;
    x->is_norm = is_norm;
}

/* The tensors of a Hugging Face Llama with shape m (names as in fixtures/hf/llama_gqa), in file order. */
static size_t mk_declare(const mk_model *m, mk_tensor *t, size_t cap) {
    size_t n = 0;
    int64_t q = m->heads * m->head_dim, kv = m->kv_heads * m->head_dim;
    char name[96];
    mk_add(t, &n, cap, "model.embed_tokens.weight", 2, m->vocab, m->hidden, false);
    for (int64_t l = 0; l < m->layers; l++) {
        static const struct {
            const char *suffix;
            int n_dims;
            int rows, cols;  /* 0 hidden, 1 q, 2 kv, 3 inter */
            bool is_norm;
        } layer[] = {
            {"input_layernorm", 1, 0, 0, true},       {"self_attn.q_proj", 2, 1, 0, false},
            {"self_attn.k_proj", 2, 2, 0, false},     {"self_attn.v_proj", 2, 2, 0, false},
            {"self_attn.o_proj", 2, 0, 1, false},     {"post_attention_layernorm", 1, 0, 0, true},
            {"mlp.gate_proj", 2, 3, 0, false},        {"mlp.up_proj", 2, 3, 0, false},
            {"mlp.down_proj", 2, 0, 3, false},
        };
        const int64_t dims[4] = {m->hidden, q, kv, m->inter};
        for (size_t k = 0; k < MS_ARRAY_LEN(layer); k++) {
            snprintf(name, sizeof name, "model.layers.%lld.%s.weight", (long long)l, layer[k].suffix);
            mk_add(t, &n, cap, name, layer[k].n_dims, dims[layer[k].rows],
                   layer[k].n_dims == 2 ? dims[layer[k].cols] : 0, layer[k].is_norm);
        }
    }
    mk_add(t, &n, cap, "model.norm.weight", 1, m->hidden, 0, true);
    if (!m->tie)
        mk_add(t, &n, cap, "lm_head.weight", 2, m->vocab, m->hidden, false);
    return n;
}

/* The next k values of tensor t's stream s (norms: ones). */
static void mk_fill(const mk_tensor *t, uint64_t *s, float *f32, size_t k) {
    const float amp = 0.02f * 1.7320508f;  /* uniform(-a, a) has std a / sqrt(3) = 0.02 */
    for (size_t i = 0; i < k; i++) {
        if (t->is_norm) {
            f32[i] = 1.0f;
        } else {
            /* 24 random bits -> [-1, 1) */
            float u = (float)(splitmix64(s) >> 40) * 0x1p-23f - 1.0f;
            f32[i] = u * amp;
        }
    }
}

/* Stream one tensor's values through the writer. f32 / u16 are MK_CHUNK-element scratch buffers. */
static ms_status mk_write_tensor(ms_st_writer *w, const mk_tensor *t, ms_st_dtype dtype, uint64_t seed, float *f32,
                                 uint16_t *u16, ms_error *err) {
    size_t n = (size_t)t->shape[0] * (size_t)(t->n_dims == 2 ? t->shape[1] : 1);
    uint64_t s = stream_seed(seed, t->name);
    for (size_t done = 0; done < n;) {
        size_t k = MS_MIN(MK_CHUNK, n - done);
        mk_fill(t, &s, f32, k);
        if (dtype == MS_ST_DTYPE_BF16) {
            for (size_t i = 0; i < k; i++)
                u16[i] = ms_f32_to_bf16(f32[i]);
            MS_TRY(ms_st_writer_write(w, u16, k * sizeof *u16, err));
        } else {
            MS_TRY(ms_st_writer_write(w, f32, k * sizeof *f32, err));
        }
        done += k;
    }
    return MS_OK;
}

/* ---- config files ---- */

static int mk_write_json(const char *dir, const char *name, json_t *obj) {
    char *path = ms_asprintf("%s/%s", dir, name);
    if (path == NULL)
        return die("out of memory");
    int rc = 0;
    if (json_dump_file(obj, path, JSON_INDENT(2) | JSON_REAL_PRECISION(10)) != 0)
        rc = die("%s: cannot write: %s", path, strerror(errno));
    ms_free(path);
    return rc;
}

static json_t *mk_eos_json(const mk_model *m) {
    if (m->n_eos == 1)
        return json_integer(m->eos[0]);
    json_t *a = json_array();
    for (int i = 0; i < m->n_eos; i++)
        json_array_append_new(a, json_integer(m->eos[i]));
    return a;
}

static int mk_write_configs(const mk_opts *o) {
    const mk_model *m = &o->m;
    json_t *rope = json_object();
    if (m->llama3_rope) {
        json_object_set_new(rope, "rope_type", json_string("llama3"));
        json_object_set_new(rope, "factor", json_real(8.0));
        json_object_set_new(rope, "low_freq_factor", json_real(1.0));
        json_object_set_new(rope, "high_freq_factor", json_real(4.0));
        json_object_set_new(rope, "original_max_position_embeddings", json_integer(8192));
    } else {
        json_object_set_new(rope, "rope_type", json_string("default"));
    }
    json_t *cfg = json_object();
    json_t *arch = json_array();
    json_array_append_new(arch, json_string("LlamaForCausalLM"));
    json_object_set_new(cfg, "architectures", arch);
    json_object_set_new(cfg, "model_type", json_string("llama"));
    json_object_set_new(cfg, "hidden_size", json_integer(m->hidden));
    json_object_set_new(cfg, "intermediate_size", json_integer(m->inter));
    json_object_set_new(cfg, "num_hidden_layers", json_integer(m->layers));
    json_object_set_new(cfg, "num_attention_heads", json_integer(m->heads));
    json_object_set_new(cfg, "num_key_value_heads", json_integer(m->kv_heads));
    json_object_set_new(cfg, "head_dim", json_integer(m->head_dim));
    json_object_set_new(cfg, "vocab_size", json_integer(m->vocab));
    json_object_set_new(cfg, "max_position_embeddings", json_integer(m->max_pos));
    json_object_set_new(cfg, "rms_norm_eps", json_real(m->eps));
    json_object_set_new(cfg, "hidden_act", json_string("silu"));
    json_object_set_new(cfg, "attention_bias", json_false());
    json_object_set_new(cfg, "mlp_bias", json_false());
    json_object_set_new(cfg, "tie_word_embeddings", json_boolean(m->tie));
    json_object_set_new(cfg, "bos_token_id", json_integer(m->bos));
    json_object_set_new(cfg, "eos_token_id", mk_eos_json(m));
    json_object_set_new(cfg, "dtype", json_string(o->dtype == MS_ST_DTYPE_BF16 ? "bfloat16" : "float32"));
    if (o->legacy_config) {
        /* the older layout: top-level rope_theta, rope_scaling null for default frequencies */
        json_object_set_new(cfg, "rope_theta", json_real(m->theta));
        if (m->llama3_rope) {
            json_object_set(cfg, "rope_scaling", rope);
        } else {
            json_object_set_new(cfg, "rope_scaling", json_null());
        }
    } else {
        json_object_set_new(rope, "rope_theta", json_real(m->theta));
        json_object_set(cfg, "rope_parameters", rope);
    }
    json_object_set_new(cfg, "generated_by", json_string("mstar-mkckpt (random weights)"));
    json_decref(rope);
    int rc = mk_write_json(o->out, "config.json", cfg);
    json_decref(cfg);
    if (rc != 0)
        return rc;
    json_t *gen = json_object();
    json_object_set_new(gen, "bos_token_id", json_integer(m->bos));
    json_object_set_new(gen, "eos_token_id", mk_eos_json(m));
    rc = mk_write_json(o->out, "generation_config.json", gen);
    json_decref(gen);
    return rc;
}

/* ---- writing a model, possibly sharded ---- */

static int mk_mkdir(const char *dir) {
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return die("%s: cannot create folder: %s", dir, strerror(errno));
    struct stat sb;
    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode))
        return die("%s: not a folder", dir);
    return 0;
}

/* Shard file name k (0-based) of n, Hugging Face style. */
static void mk_shard_name(char *buf, size_t cap, int k, int n) {
    if (n == 1)
        snprintf(buf, cap, "model.safetensors");
    else
        snprintf(buf, cap, "model-%05d-of-%05d.safetensors", k + 1, n);
}

/* Split tensors [0, n) with byte sizes bytes[] into `shards` contiguous groups of about equal size:
 * first[k] is the first tensor of shard k; first[shards] = n. */
static void mk_plan_shards(const uint64_t *bytes, size_t n, int shards, size_t *first) {
    MS_ASSERT(shards >= 1 && (size_t)shards <= n);
    uint64_t total = 0, acc = 0;
    for (size_t i = 0; i < n; i++)
        total += bytes[i];
    size_t i = 0;
    for (int k = 0; k < shards; k++) {
        first[k] = i;
        uint64_t target = total / (uint64_t)shards * (uint64_t)(k + 1);
        if (k == shards - 1)
            target = total;
        acc += bytes[i++];  /* every shard holds at least one tensor */
        size_t keep = (size_t)(shards - k - 1);  /* tensors left for the shards after this one */
        while (i < n - keep && acc + bytes[i] / 2 <= target)
            acc += bytes[i++];
    }
    first[shards] = n;
}

static int mk_write_index(const char *dir, const char *const *names, const size_t *first, int shards,
                          uint64_t total) {
    json_t *idx = json_object();
    json_t *meta = json_object();
    json_t *map = json_object();
    json_object_set_new(meta, "total_size", json_integer((json_int_t)total));
    for (int k = 0; k < shards; k++) {
        char shard[64];
        mk_shard_name(shard, sizeof shard, k, shards);
        for (size_t i = first[k]; i < first[k + 1]; i++)
            json_object_set_new(map, names[i], json_string(shard));
    }
    json_object_set_new(idx, "metadata", meta);
    json_object_set_new(idx, "weight_map", map);
    int rc = mk_write_json(dir, "model.safetensors.index.json", idx);
    json_decref(idx);
    return rc;
}

static int mk_cmp_tensor(const void *a, const void *b) {
    return strcmp(((const mk_tensor *)a)->name, ((const mk_tensor *)b)->name);
}

static int mk_generate(const mk_opts *o) {
    const mk_model *m = &o->m;
    size_t cap = 3 + 9 * (size_t)m->layers;
    mk_tensor *t = ms_calloc(cap, sizeof *t);
    float *f32 = ms_malloc(MK_CHUNK * sizeof *f32);
    uint16_t *u16 = ms_malloc(MK_CHUNK * sizeof *u16);
    uint64_t *bytes = ms_calloc(cap, sizeof *bytes);
    const char **names = ms_calloc(cap, sizeof *names);
    size_t first[MK_MAX_SHARDS + 1];
    ms_st_writer *w = NULL;
    int rc = 0;
    if (!t || !f32 || !u16 || !bytes || !names) {
        rc = die("out of memory");
        goto done;
    }
    size_t n = mk_declare(m, t, cap);
    /* file order = name order, as a split of the same checkpoint writes it */
    qsort(t, n, sizeof *t, mk_cmp_tensor);
    if ((size_t)o->shards > n) {
        rc = die("--shards %d is more than the %zu tensors", o->shards, n);
        goto done;
    }
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        bytes[i] = (uint64_t)t[i].shape[0] * (uint64_t)(t[i].n_dims == 2 ? t[i].shape[1] : 1) *
                   ms_st_dtype_size(o->dtype);
        total += bytes[i];
        names[i] = t[i].name;
    }
    struct stat out_sb;
    bool out_existed = stat(o->out, &out_sb) == 0;
    if ((rc = mk_mkdir(o->out)) != 0)
        goto done;
    /* refuse up front what cannot fit (a mistyped size once wrote 13 GB in a minute) */
    struct statvfs fs;
    if (statvfs(o->out, &fs) == 0 && total > (uint64_t)fs.f_bavail * fs.f_frsize) {
        rc = die("%s: the checkpoint needs %.1f GB but only %.1f GB are free there", o->out,
                 (double)total / 1e9, (double)fs.f_bavail * (double)fs.f_frsize / 1e9);
        if (!out_existed)
            rmdir(o->out);
        goto done;
    }
    if ((rc = mk_write_configs(o)) != 0)
        goto done;
    mk_plan_shards(bytes, n, o->shards, first);
    for (int k = 0; k < o->shards; k++) {
        char shard[64];
        mk_shard_name(shard, sizeof shard, k, o->shards);
        char *path = ms_asprintf("%s/%s", o->out, shard);
        ms_error err = {0};
        ms_status st = path ? ms_st_writer_init(&w, path, &err) : MS_FAIL(&err, MS_ERR_OOM, "out of memory");
        ms_free(path);
        if (st == MS_OK)
            st = ms_st_writer_set_metadata(w, "format", "pt", &err);
        for (size_t i = first[k]; st == MS_OK && i < first[k + 1]; i++)
            st = ms_st_writer_add_tensor(w, t[i].name, o->dtype, t[i].n_dims, t[i].shape, &err);
        for (size_t i = first[k]; st == MS_OK && i < first[k + 1]; i++)
            st = mk_write_tensor(w, &t[i], o->dtype, o->seed, f32, u16, &err);
        if (st == MS_OK)
            st = ms_st_writer_finish(w, &err);
        ms_st_writer_free(w);
        w = NULL;
        if (st != MS_OK) {
            rc = die("%s", err.msg);
            goto done;
        }
    }
    if (o->shards > 1 && (rc = mk_write_index(o->out, names, first, o->shards, total)) != 0)
        goto done;
    printf("wrote %s: Llama %lld layers, hidden %lld, heads %lld/%lld, head_dim %lld, ffn %lld, vocab %lld, "
           "%s, %zu tensors, %.1f MB in %d file(s), seed %llu\n",
           o->out, (long long)m->layers, (long long)m->hidden, (long long)m->heads, (long long)m->kv_heads,
           (long long)m->head_dim, (long long)m->inter, (long long)m->vocab, ms_st_dtype_name(o->dtype), n,
           (double)total / 1e6, o->shards, (unsigned long long)o->seed);
done:
    ms_free(t);
    ms_free(f32);
    ms_free(u16);
    ms_free(bytes);
    ms_free(names);
    return rc;
}

/* ---- writing a GGUF ---- */

/* Hugging Face name -> llama.cpp GGUF name (the inverse of gguf_model.h's table). */
static bool mk_gguf_name(const char *hf, char *out, size_t cap, int *permute) {
    static const char *const global[][2] = {{"model.embed_tokens.weight", "token_embd.weight"},
                                            {"model.norm.weight", "output_norm.weight"},
                                            {"lm_head.weight", "output.weight"}};
    static const char *const layer[][2] = {
        {"input_layernorm.weight", "attn_norm.weight"},  {"self_attn.q_proj.weight", "attn_q.weight"},
        {"self_attn.k_proj.weight", "attn_k.weight"},    {"self_attn.v_proj.weight", "attn_v.weight"},
        {"self_attn.o_proj.weight", "attn_output.weight"}, {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},     {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"},
    };
    *permute = 0;
    for (size_t i = 0; i < MS_ARRAY_LEN(global); i++)
        if (strcmp(hf, global[i][0]) == 0) {
            snprintf(out, cap, "%s", global[i][1]);
            return true;
        }
    long l;
    int used = 0;
    if (sscanf(hf, "model.layers.%ld.%n", &l, &used) != 1 || used == 0)
        return false;
    for (size_t i = 0; i < MS_ARRAY_LEN(layer); i++)
        if (strcmp(hf + used, layer[i][0]) == 0) {
            snprintf(out, cap, "blk.%ld.%s", l, layer[i][1]);
            *permute = i == 1 ? 1 : i == 2 ? 2 : 0;
            return true;
        }
    return false;
}

/* convert_hf_to_gguf.py LlamaModel.permute on rows [rows, cols] in place: n_groups heads. */
static bool mk_permute_rows(float *w, int64_t rows, int64_t cols, int64_t n_groups) {
    int64_t hd = rows / n_groups, half = hd / 2;
    size_t row_bytes = (size_t)cols * sizeof(float);
    float *tmp = ms_malloc((size_t)hd * row_bytes);
    if (tmp == NULL)
        return false;
    for (int64_t h = 0; h < n_groups; h++) {
        float *head = w + h * hd * cols;
        memcpy(tmp, head, (size_t)hd * row_bytes);
        /* Hugging Face row s*half + j goes to GGUF row 2*j + s */
        for (int64_t j = 0; j < half; j++)
            for (int64_t s = 0; s < 2; s++)
                memcpy(head + (2 * j + s) * cols, tmp + (s * half + j) * cols, row_bytes);
    }
    ms_free(tmp);
    return true;
}

static ms_status mk_gguf_meta(ms_gguf_writer *w, const mk_model *m, uint32_t quant, ms_error *err) {
    /* llama_ftype (llama.h) of the file's main type: ALL_F32 0, MOSTLY_F16 1, Q4_0 2, Q8_0 7,
     * Q4_K_M 15 (ours is all-Q4_K, the closest label), BF16 32 */
    uint32_t ftype = quant == MS_GGML_TYPE_Q4_0 ? 2 : quant == MS_GGML_TYPE_Q8_0 ? 7 : quant == MS_GGML_TYPE_Q4_K ? 15
                   : quant == MS_GGML_TYPE_F16 ? 1 : quant == MS_GGML_TYPE_BF16 ? 32 : 0;
    MS_TRY(ms_gguf_writer_set_str(w, "general.architecture", "llama", err));
    MS_TRY(ms_gguf_writer_set_str(w, "general.name", "mstar-mkckpt random weights", err));
    MS_TRY(ms_gguf_writer_set_u32(w, "general.file_type", ftype, err));
    MS_TRY(ms_gguf_writer_set_u32(w, "general.quantization_version", 2, err));
    MS_TRY(ms_gguf_writer_set_u32(w, "llama.block_count", (uint32_t)m->layers, err));
    MS_TRY(ms_gguf_writer_set_u32(w, "llama.context_length", (uint32_t)m->max_pos, err));
    MS_TRY(ms_gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)m->hidden, err));
    MS_TRY(ms_gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)m->inter, err));
    MS_TRY(ms_gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)m->heads, err));
    MS_TRY(ms_gguf_writer_set_u32(w, "llama.attention.head_count_kv", (uint32_t)m->kv_heads, err));
    MS_TRY(ms_gguf_writer_set_u32(w, "llama.attention.key_length", (uint32_t)m->head_dim, err));
    MS_TRY(ms_gguf_writer_set_u32(w, "llama.attention.value_length", (uint32_t)m->head_dim, err));
    MS_TRY(ms_gguf_writer_set_u32(w, "llama.rope.dimension_count", (uint32_t)m->head_dim, err));
    MS_TRY(ms_gguf_writer_set_f32(w, "llama.rope.freq_base", (float)m->theta, err));
    MS_TRY(ms_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", (float)m->eps, err));
    MS_TRY(ms_gguf_writer_set_u32(w, "llama.vocab_size", (uint32_t)m->vocab, err));
    MS_TRY(ms_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)m->bos, err));
    /* GGUF has one eos id; the others of --eos are not representable */
    return ms_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)m->eos[0], err);
}

/* One quantization job: n values of x into dst as `type`, split over the pool by whole blocks. */
typedef struct mk_qjob {
    uint32_t type;
    const float *x;
    uint8_t *dst;
    size_t n_blocks, blk, bpb, per_task;
    ms_status *st; /* [tasks] */
} mk_qjob;

static void mk_qtask(void *arg, int32_t task, int32_t thread) {
    (void)thread;
    const mk_qjob *j = arg;
    size_t b0 = (size_t)task * j->per_task, b1 = MS_MIN(j->n_blocks, b0 + j->per_task);
    j->st[task] = b0 >= b1 ? MS_OK
                           : ms_ggml_quantize(j->type, j->x + b0 * j->blk, j->dst + b0 * j->bpb, (b1 - b0) * j->blk);
}

/* Quantize x[n] into dst with every thread of the pool (the reference quantizers are scalar: Q4_K
 * runs at about 2 M values/s per core, an 8B checkpoint is 8e9 values). */
static ms_status mk_quantize(ms_threadpool *pool, uint32_t type, const float *x, uint8_t *dst, size_t n) {
    ms_status st[MS_THREADPOOL_MAX_THREADS];
    mk_qjob j = {.type = type, .x = x, .dst = dst, .blk = ms_ggml_type_block(type),
                 .bpb = ms_ggml_type_block_bytes(type), .st = st};
    j.n_blocks = n / j.blk;
    int32_t tasks = ms_threadpool_n_threads(pool);
    j.per_task = MS_CEIL_DIV(j.n_blocks, (size_t)tasks);
    if (n % j.blk != 0)
        return MS_ERR_INVALID_ARG;
    ms_threadpool_run(pool, tasks, mk_qtask, &j);
    for (int32_t i = 0; i < tasks; i++)
        if (st[i] != MS_OK)
            return st[i];
    return MS_OK;
}

/* Generate tensor t (permuted when `permute` names its head count) as type `type` into w. */
static ms_status mk_gguf_tensor(ms_gguf_writer *w, ms_threadpool *pool, const mk_tensor *t, uint32_t type,
                                int64_t permute_groups, uint64_t seed, float *f32, uint8_t *q, ms_error *err) {
    size_t n = (size_t)t->shape[0] * (size_t)(t->n_dims == 2 ? t->shape[1] : 1);
    uint64_t s = stream_seed(seed, t->name);
    size_t bpb = ms_ggml_type_block_bytes(type), blk = ms_ggml_type_block(type);
    if (permute_groups > 0) {
        /* whole tensor: rows move across chunk boundaries (q_proj of an 8B is 64 MB of floats) */
        float *all = ms_malloc(n * sizeof *all);
        uint8_t *qa = ms_malloc(n / blk * bpb);
        ms_status st = MS_OK;
        if (all == NULL || qa == NULL || (mk_fill(t, &s, all, n), !mk_permute_rows(all, t->shape[0], t->shape[1],
                                                                                     permute_groups)))
            st = MS_FAIL(err, MS_ERR_OOM, "out of memory for tensor '%s'", t->name);
        if (st == MS_OK && mk_quantize(pool, type, all, qa, n) != MS_OK)
            st = MS_FAIL(err, MS_ERR_INTERNAL, "tensor '%s': cannot quantize to %s", t->name, ms_ggml_type_name(type));
        if (st == MS_OK)
            st = ms_gguf_writer_write(w, qa, n / blk * bpb, err);
        ms_free(all);
        ms_free(qa);
        return st;
    }
    for (size_t done = 0; done < n;) {
        size_t k = MS_MIN(MK_CHUNK, n - done); /* MK_CHUNK is a multiple of every block size */
        mk_fill(t, &s, f32, k);
        if (mk_quantize(pool, type, f32, q, k) != MS_OK)
            return MS_FAIL(err, MS_ERR_INTERNAL, "tensor '%s': cannot quantize to %s", t->name,
                           ms_ggml_type_name(type));
        MS_TRY(ms_gguf_writer_write(w, q, k / blk * bpb, err));
        done += k;
    }
    return MS_OK;
}

static bool mk_ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* rope_freqs.weight[head_dim / 2] for the Llama 3.1 scaling (factor 8, low 1, high 4, original
 * 8192), as convert_hf_to_gguf.py's LlamaModel.generate_extra_tensors computes it (float32). */
static void mk_llama3_rope_freqs(const mk_model *m, float *out) {
    const double factor = 8.0, low = 1.0, high = 4.0, orig = 8192.0;
    float low_wl = (float)(orig / low), high_wl = (float)(orig / high);
    for (int64_t i = 0; i < m->head_dim / 2; i++) {
        float freq = 1.0f / powf((float)m->theta, (float)(2 * i) / (float)m->head_dim);
        float wavelen = (float)(2.0 * M_PI) / freq;
        float smooth = ((float)orig / wavelen - (float)low) / (float)(high - low);
        out[i] = wavelen < high_wl ? 1.0f : wavelen > low_wl ? (float)factor
                                                             : 1.0f / ((1.0f - smooth) / (float)factor + smooth);
    }
}

static int mk_generate_gguf(const mk_opts *o) {
    const mk_model *m = &o->m;
    size_t cap = 3 + 9 * (size_t)m->layers;
    mk_tensor *t = ms_calloc(cap, sizeof *t);
    uint32_t *types = ms_calloc(cap, sizeof *types);
    float *f32 = ms_malloc(MK_CHUNK * sizeof *f32);
    uint8_t *q = ms_malloc(MK_CHUNK * sizeof(float));
    char *path = NULL;
    ms_gguf_writer *w = NULL;
    ms_threadpool *pool = NULL;
    int rc = 0;
    if (!t || !types || !f32 || !q) {
        rc = die("out of memory");
        goto done;
    }
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    ms_error perr = {0};
    if (ms_threadpool_init(&pool, cpus < 1 ? 1 : cpus > 64 ? 64 : (int32_t)cpus, &perr) != MS_OK) {
        rc = die("%s", perr.msg);
        goto done;
    }
    size_t n = mk_declare(m, t, cap);
    if (mk_ends_with(o->out, ".gguf")) {
        path = ms_strdup(o->out);
    } else {
        if ((rc = mk_mkdir(o->out)) != 0)
            goto done;
        path = ms_asprintf("%s/model.gguf", o->out);
    }
    if (path == NULL) {
        rc = die("out of memory");
        goto done;
    }
    uint64_t total = 0;
    size_t n_wide = 0; /* 2-D weights kept F32: rows not a multiple of the quant block */
    for (size_t i = 0; i < n; i++) {
        int64_t cols = t[i].n_dims == 2 ? t[i].shape[1] : t[i].shape[0];
        if (t[i].is_norm) {
            types[i] = MS_GGML_TYPE_F32;
        } else if ((size_t)cols % ms_ggml_type_block(o->quant) != 0) {
            types[i] = MS_GGML_TYPE_F32;
            n_wide++;
        } else {
            types[i] = o->quant;
        }
        uint64_t elems = (uint64_t)t[i].shape[0] * (uint64_t)(t[i].n_dims == 2 ? t[i].shape[1] : 1);
        total += elems / ms_ggml_type_block(types[i]) * ms_ggml_type_block_bytes(types[i]);
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash != NULL)
        *slash = '\0';
    struct statvfs fs;
    if (statvfs(slash ? dir : ".", &fs) == 0 && total > (uint64_t)fs.f_bavail * fs.f_frsize) {
        rc = die("%s: the checkpoint needs %.1f GB but only %.1f GB are free there", path, (double)total / 1e9,
                 (double)fs.f_bavail * (double)fs.f_frsize / 1e9);
        goto done;
    }
    ms_error err = {0};
    ms_status st = ms_gguf_writer_init(&w, path, &err);
    if (st == MS_OK)
        st = mk_gguf_meta(w, m, o->quant, &err);
    for (size_t i = 0; st == MS_OK && i < n; i++) {
        char gname[96];
        int perm;
        if (!mk_gguf_name(t[i].name, gname, sizeof gname, &perm))
            st = MS_FAIL(&err, MS_ERR_INTERNAL, "tensor '%s' has no GGUF name", t[i].name);
        int64_t ne[2] = {t[i].n_dims == 2 ? t[i].shape[1] : t[i].shape[0], t[i].shape[0]};
        if (st == MS_OK)
            st = ms_gguf_writer_add_tensor(w, gname, types[i], t[i].n_dims, ne, &err);
    }
    float *rope_ff = NULL;
    int64_t n_ff = m->head_dim / 2;
    if (st == MS_OK && m->llama3_rope) {
        rope_ff = ms_malloc((size_t)n_ff * sizeof *rope_ff);
        st = rope_ff == NULL ? MS_FAIL(&err, MS_ERR_OOM, "out of memory") : MS_OK;
        if (st == MS_OK) {
            mk_llama3_rope_freqs(m, rope_ff);
            st = ms_gguf_writer_add_tensor(w, "rope_freqs.weight", MS_GGML_TYPE_F32, 1, &n_ff, &err);
        }
    }
    for (size_t i = 0; st == MS_OK && i < n; i++) {
        char gname[96];
        int perm;
        mk_gguf_name(t[i].name, gname, sizeof gname, &perm);
        int64_t groups = perm == 1 ? m->heads : perm == 2 ? m->kv_heads : 0;
        st = mk_gguf_tensor(w, pool, &t[i], types[i], groups, o->seed, f32, q, &err);
    }
    if (st == MS_OK && rope_ff != NULL) /* declared last, so written last */
        st = ms_gguf_writer_write(w, rope_ff, (size_t)n_ff * sizeof *rope_ff, &err);
    ms_free(rope_ff);
    if (st == MS_OK)
        st = ms_gguf_writer_finish(w, &err);
    if (st != MS_OK) {
        rc = die("%s", err.msg);
        goto done;
    }
    printf("wrote %s: GGUF llama %lld layers, hidden %lld, heads %lld/%lld, head_dim %lld, ffn %lld, vocab %lld, "
           "%s (%zu matrices kept F32: rows not a multiple of %zu), %zu tensors, %.1f MB, seed %llu%s\n",
           path, (long long)m->layers, (long long)m->hidden, (long long)m->heads, (long long)m->kv_heads,
           (long long)m->head_dim, (long long)m->inter, (long long)m->vocab, ms_ggml_type_name(o->quant), n_wide,
           ms_ggml_type_block(o->quant), n, (double)total / 1e6, (unsigned long long)o->seed,
           m->llama3_rope ? "; Llama 3.1 RoPE scaling as rope_freqs.weight" : "");
done:
    ms_gguf_writer_free(w);
    ms_threadpool_free(pool);
    ms_free(path);
    ms_free(t);
    ms_free(types);
    ms_free(f32);
    ms_free(q);
    return rc;
}

/* ---- split an existing checkpoint into shards ---- */

static int mk_copy_file(const char *src_dir, const char *dst_dir, const char *name, bool required) {
    char *src = ms_asprintf("%s/%s", src_dir, name);
    char *dst = ms_asprintf("%s/%s", dst_dir, name);
    int rc = 0;
    FILE *in = NULL, *out = NULL;
    if (src == NULL || dst == NULL) {
        rc = die("out of memory");
        goto done;
    }
    in = fopen(src, "rb");
    if (in == NULL) {
        if (required)
            rc = die("%s: cannot open: %s", src, strerror(errno));
        goto done;
    }
    out = fopen(dst, "wb");
    if (out == NULL) {
        rc = die("%s: cannot create: %s", dst, strerror(errno));
        goto done;
    }
    char buf[65536];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, in)) > 0) {
        if (fwrite(buf, 1, got, out) != got) {
            rc = die("%s: write failed: %s", dst, strerror(errno));
            goto done;
        }
    }
done:
    if (in)
        fclose(in);
    if (out && fclose(out) != 0 && rc == 0)
        rc = die("%s: close failed: %s", dst, strerror(errno));
    ms_free(src);
    ms_free(dst);
    return rc;
}

static int mk_split(const mk_opts *o) {
    ms_error err = {0};
    ms_ckpt *ck = NULL;
    if (ms_ckpt_init(&ck, o->split, &err) != MS_OK)
        return die("%s", err.msg);
    size_t n = ms_ckpt_n_tensors(ck);
    uint64_t *bytes = ms_calloc(n ? n : 1, sizeof *bytes);
    const char **names = ms_calloc(n ? n : 1, sizeof *names);
    size_t first[MK_MAX_SHARDS + 1];
    int rc = 0;
    if (bytes == NULL || names == NULL) {
        rc = die("out of memory");
        goto done;
    }
    if ((size_t)o->shards > n) {
        rc = die("%s: --shards %d is more than its %zu tensors", o->split, o->shards, n);
        goto done;
    }
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        bytes[i] = ms_ckpt_tensor_at(ck, i)->n_bytes;
        names[i] = ms_ckpt_tensor_at(ck, i)->name;
        total += bytes[i];
    }
    if ((rc = mk_mkdir(o->out)) != 0)
        goto done;
    struct stat sb;
    if (stat(o->split, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        if ((rc = mk_copy_file(o->split, o->out, "config.json", false)) != 0 ||
            (rc = mk_copy_file(o->split, o->out, "generation_config.json", false)) != 0)
            goto done;
    }
    mk_plan_shards(bytes, n, o->shards, first);
    for (int k = 0; k < o->shards; k++) {
        char shard[64];
        mk_shard_name(shard, sizeof shard, k, o->shards);
        char *path = ms_asprintf("%s/%s", o->out, shard);
        ms_st_writer *w = NULL;
        ms_status st = path ? ms_st_writer_init(&w, path, &err) : MS_FAIL(&err, MS_ERR_OOM, "out of memory");
        ms_free(path);
        if (st == MS_OK)
            st = ms_st_writer_set_metadata(w, "format", "pt", &err);
        for (size_t i = first[k]; st == MS_OK && i < first[k + 1]; i++) {
            const ms_st_tensor *t = ms_ckpt_tensor_at(ck, i);
            st = ms_st_writer_add_tensor(w, t->name, t->dtype, t->n_dims, t->shape, &err);
        }
        for (size_t i = first[k]; st == MS_OK && i < first[k + 1]; i++) {
            const ms_st_tensor *t = ms_ckpt_tensor_at(ck, i);
            st = ms_st_writer_write(w, t->data, t->n_bytes, &err);
        }
        if (st == MS_OK)
            st = ms_st_writer_finish(w, &err);
        ms_st_writer_free(w);
        if (st != MS_OK) {
            rc = die("%s", err.msg);
            goto done;
        }
    }
    if (o->shards > 1 && (rc = mk_write_index(o->out, names, first, o->shards, total)) != 0)
        goto done;
    printf("wrote %s: %zu tensors of %s in %d shard(s)\n", o->out, n, o->split, o->shards);
done:
    ms_free(bytes);
    ms_free(names);
    ms_ckpt_free(ck);
    return rc;
}

/* ---- check a checkpoint as a Llama ---- */

static int mk_check(const char *path) {
    ms_error err = {0};
    ms_hf_config *cfg = NULL;
    ms_ckpt *ck = NULL;
    int rc = 0;
    int64_t hidden, layers, heads, kv, hd, inter, vocab;
    bool tie;
    ms_rope_params rope;
    ms_status st = ms_hf_config_init(&cfg, path, &err);
    if (st == MS_OK)
        st = ms_hf_config_get_int(cfg, "hidden_size", &hidden, &err);
    if (st == MS_OK)
        st = ms_hf_config_get_int(cfg, "num_hidden_layers", &layers, &err);
    if (st == MS_OK)
        st = ms_hf_config_get_int(cfg, "num_attention_heads", &heads, &err);
    if (st == MS_OK)
        st = ms_hf_config_get_int_or(cfg, "num_key_value_heads", heads, &kv, &err);
    if (st == MS_OK && heads > 0)
        st = ms_hf_config_get_int_or(cfg, "head_dim", hidden / heads, &hd, &err);
    if (st == MS_OK)
        st = ms_hf_config_get_int(cfg, "intermediate_size", &inter, &err);
    if (st == MS_OK)
        st = ms_hf_config_get_int(cfg, "vocab_size", &vocab, &err);
    if (st == MS_OK)
        st = ms_hf_config_get_bool_or(cfg, "tie_word_embeddings", false, &tie, &err);
    if (st == MS_OK)
        st = ms_hf_config_get_rope(cfg, &rope, &err);
    if (st == MS_OK)
        st = ms_ckpt_init(&ck, path, &err);
    if (st != MS_OK) {
        rc = die("%s", err.msg);
        goto done;
    }
    if (!ms_ckpt_has_tensor(ck, "lm_head.weight") && !tie) {
        rc = die("%s: tensor 'lm_head.weight' not found and tie_word_embeddings is false", ms_ckpt_path(ck));
        goto done;
    }
    mk_model m = {.hidden = hidden, .layers = layers, .heads = heads, .kv_heads = kv, .head_dim = hd,
                  .inter = inter, .vocab = vocab, .tie = !ms_ckpt_has_tensor(ck, "lm_head.weight")};
    size_t cap = 3 + 9 * (size_t)(layers > 0 ? layers : 0);
    mk_tensor *t = ms_calloc(cap, sizeof *t);
    if (t == NULL) {
        rc = die("out of memory");
        goto done;
    }
    size_t n = mk_declare(&m, t, cap);
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (ms_ckpt_expect_tensor(ck, t[i].name, MS_ST_DTYPES_FLOAT, t[i].n_dims, t[i].shape, NULL, &err) != MS_OK)
            rc = die("%s", err.msg);
    }
    ms_free(t);
    if (rc == 0)
        printf("ok: %s: Llama, %lld layers, hidden %lld, heads %lld/%lld, head_dim %lld, vocab %lld, %s, rope %s "
               "theta %g, %zu tensors in %zu file(s)%s\n",
               ms_ckpt_path(ck), (long long)layers, (long long)hidden, (long long)heads, (long long)kv, (long long)hd,
               (long long)vocab, m.tie ? "tied embeddings" : "lm_head", ms_rope_type_name(rope.type), rope.theta,
               ms_ckpt_n_tensors(ck), ms_ckpt_get_llama2c(ck) || ms_ckpt_get_gguf(ck) ? (size_t)1 : ms_ckpt_n_files(ck),
               ms_ckpt_get_llama2c(ck) ? " (llama2.c, interleaved RoPE)"
               : ms_ckpt_get_gguf(ck)  ? " (GGUF, dequantized to F32)"
                                       : "");
done:
    ms_ckpt_free(ck);
    ms_hf_config_free(cfg);
    return rc;
}

int main(int argc, char **argv) {
    mk_opts o;
    int rc = parse_args(argc, argv, &o);
    if (rc == 2) {
        usage(stdout);
        return 0;
    }
    if (rc != 0)
        return rc;
    if (o.check != NULL) {
        rc = mk_check(o.check);
        for (int i = o.check_next; rc == 0 && i < o.argc; i++)
            rc = mk_check(o.argv[i]);
        return rc;
    }
    if (o.split != NULL)
        return mk_split(&o);
    return o.gguf ? mk_generate_gguf(&o) : mk_generate(&o);
}
