/*
 * fuzz_gguf.c - libFuzzer target for GGUF files: the reader (runtime/loaders/gguf.c, from memory
 * and through mmap), ggml dequantization (gguf_quant.c) and GGUF models as checkpoints and configs
 * (gguf_model.c through ms_ckpt_init and ms_hf_config_init).
 *
 * For a file the reader accepts, every metadata entry is read through the element accessors (and
 * every string to its last byte, checking s[len] == 0), every tensor's data is summed to its last
 * byte (the mapping is not ASan-guarded: a view past it faults) and dequantized when its type
 * allows, and the typed getters are asked for keys of every type. The same bytes are then opened
 * as a model checkpoint and as a config. A failure must be one line and nothing may leak; ASan/UBSan
 * catch the rest. Run it with `make fuzz FUZZ_TARGETS=gguf`; seeds: tests/fuzz/gguf/ and the
 * dequantization goldens (tests/fuzz/seeds.sh).
 */
#include "fuzz_util.h"

#include "checkpoint.h"
#include "gguf.h"
#include "gguf_quant.h"
#include "hf_config.h"

#define T "fuzz_gguf"

static void fuzz_reader(const uint8_t *data, size_t size) {
    ms_error err = {0};
    ms_gguf *g = NULL;
    ms_status st = ms_gguf_init_from_memory(&g, "input.gguf", data, size, &err);
    fuzz_check_error(T, st, &err);
    if (st != MS_OK)
        return;
    volatile uint64_t sink = 0;
    for (size_t i = 0; i < ms_gguf_n_kv(g); i++) {
        const ms_gguf_kv *kv = ms_gguf_kv_at(g, i);
        if (ms_gguf_find_kv(g, kv->key) != kv)
            abort();
        for (size_t j = 0; j < kv->n; j++) {
            int64_t v;
            double d;
            const ms_gguf_str *s = ms_gguf_kv_str(kv, j);
            if (s != NULL) {
                for (size_t b = 0; b < s->len; b++)
                    sink += (uint8_t)s->s[b];
                if (s->s[s->len] != '\0')
                    abort();
            }
            if (ms_gguf_kv_int(kv, j, &v))
                sink += (uint64_t)v;
            if (ms_gguf_kv_float(kv, j, &d))
                sink += d == d;
        }
        int64_t v;
        double d;
        bool b;
        const char *s;
        const ms_gguf_kv *arr;
        fuzz_check_error(T, ms_gguf_get_int(g, kv->key, &v, &err), &err);
        fuzz_check_error(T, ms_gguf_get_float(g, kv->key, &d, &err), &err);
        fuzz_check_error(T, ms_gguf_get_bool(g, kv->key, &b, &err), &err);
        fuzz_check_error(T, ms_gguf_get_string(g, kv->key, &s, NULL, &err), &err);
        fuzz_check_error(T, ms_gguf_get_array(g, kv->key, MS_GGUF_STRING, &arr, &err), &err);
    }
    for (size_t i = 0; i < ms_gguf_n_tensors(g); i++) {
        const ms_gguf_tensor *t = ms_gguf_tensor_at(g, i);
        if (ms_gguf_find_tensor(g, t->name) != t)
            abort();
        const uint8_t *p = t->data;
        for (size_t b = 0; b < t->n_bytes; b++)
            sink += p[b];
        if (t->n_elems <= (1u << 20)) {
            float *y = ms_malloc(t->n_elems * sizeof *y);
            if (y == NULL)
                abort();
            fuzz_check_error(T, ms_gguf_tensor_to_f32(g, t, y, t->n_elems, &err), &err);
            ms_free(y);
        }
    }
    (void)sink;
    ms_gguf_free(g);
}

static void fuzz_model(const char *path) {
    ms_error err = {0};
    ms_gguf *g = NULL;
    fuzz_check_error(T, ms_gguf_init(&g, path, &err), &err);
    ms_gguf_free(g);
    ms_ckpt *ck = NULL;
    ms_status st = ms_ckpt_init(&ck, path, &err);
    fuzz_check_error(T, st, &err);
    if (st == MS_OK) {
        for (size_t i = 0; i < ms_ckpt_n_tensors(ck); i++) {
            const ms_st_tensor *t = ms_ckpt_tensor_at(ck, i);
            float *w = NULL;
            st = ms_ckpt_load_f32(ck, t->name, MS_ST_DTYPES_FLOAT, t->n_dims, t->shape, &w, &err);
            fuzz_check_error(T, st, &err);
            ms_free(w);
        }
    }
    ms_ckpt_free(ck);
    ms_hf_config *cfg = NULL;
    st = ms_hf_config_init(&cfg, path, &err);
    fuzz_check_error(T, st, &err);
    if (st == MS_OK) {
        ms_rope_params rp;
        fuzz_check_error(T, ms_hf_config_get_rope(cfg, &rp, &err), &err);
        int64_t eos[4], v;
        size_t n;
        fuzz_check_error(T, ms_hf_config_get_eos_ids(cfg, eos, 4, &n, &err), &err);
        fuzz_check_error(T, ms_hf_config_get_int(cfg, "vocab_size", &v, &err), &err);
    }
    ms_hf_config_free(cfg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size > 1 << 20)
        return -1;
    int64_t live = ms_alloc_get_stats().live_blocks;
    fuzz_reader(data, size);
    fuzz_model(fuzz_write("model.gguf", data, size));
    fuzz_unlink("model.gguf"); /* fuzz_util.h's exit cleanup does not know this name */
    fuzz_check_leaks(T, live);
    return 0;
}
