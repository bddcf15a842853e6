/*
 * pd.c - [pd] the prefill/decode record and its byte form (pd.h). The engine entry points that
 * make and consume records are ms_engine_pd_publish / ms_engine_pd_admit (engine.c, [pd]).
 */
#include "pd.h"

#include <string.h>

#define PD_MAGIC 0x4450534du /* "MSPD" little-endian */
#define PD_VERSION 1u
/* bounds a decoder accepts before allocating (a record of a real request stays far below) */
#define PD_MAX_TOKENS (1 << 24)
#define PD_MAX_PAGE_BYTES ((uint64_t)1 << 30)

void ms_pd_record_free(ms_pd_record *rec) {
    if (rec == NULL)
        return;
    ms_free(rec->prompt);
    ms_free(rec->out);
    ms_kv_published_free(rec->kv);
    ms_kv_payload_free(rec->payload);
    ms_free(rec);
}

/* ---- writer ---- */

typedef struct pd_buf {
    uint8_t *p;
    size_t n, cap;
    bool oom;
} pd_buf;

static void put(pd_buf *b, const void *src, size_t n) {
    if (b->oom)
        return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n)
            cap *= 2;
        uint8_t *q = ms_realloc(b->p, cap);
        if (q == NULL) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    if (n > 0)
        memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void put_u32(pd_buf *b, uint32_t v) { put(b, &v, sizeof v); }
static void put_i32(pd_buf *b, int32_t v) { put(b, &v, sizeof v); }
static void put_u64(pd_buf *b, uint64_t v) { put(b, &v, sizeof v); }
static void put_f32(pd_buf *b, float v) { put(b, &v, sizeof v); }

ms_status ms_pd_record_encode(const ms_pd_record *rec, uint8_t **out, size_t *n, ms_error *err) {
    *out = NULL;
    *n = 0;
    const ms_kv_published *kv = rec->kv;
    const ms_kv_payload *pl = rec->payload;
    if (kv == NULL || pl == NULL || kv->n_streams != pl->n_streams || rec->n_prompt < 1 ||
        rec->n_out < 1 || rec->prompt == NULL || rec->out == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "pd record: incomplete (prompt, ids, kv streams "
                       "and their payload are required)");
    pd_buf b = {0};
    put_u32(&b, PD_MAGIC);
    put_u32(&b, PD_VERSION);
    put_i32(&b, rec->n_prompt);
    put(&b, rec->prompt, (size_t)rec->n_prompt * sizeof(int32_t));
    put_i32(&b, rec->max_new_tokens);
    put_i32(&b, rec->ignore_eos ? 1 : 0);
    put_f32(&b, rec->sampling.temperature);
    put_i32(&b, rec->sampling.top_k);
    put_f32(&b, rec->sampling.top_p);
    put_u64(&b, rec->sampling.seed);
    put_i32(&b, rec->n_out);
    put(&b, rec->out, (size_t)rec->n_out * sizeof(int32_t));
    put_u64(&b, rec->draw);
    for (int l = 0; l < MS_MAX_LABELS; l++)
        put_i32(&b, rec->pos.counter[l]);
    put_i32(&b, kv->world_size);
    put_i32(&b, kv->rank);
    put_i32(&b, kv->page_size);
    put_i32(&b, pl->n_layers);
    put_u64(&b, (uint64_t)pl->page_bytes);
    put_i32(&b, kv->n_streams);
    for (int32_t i = 0; i < kv->n_streams; i++) {
        const ms_kv_published_stream *s = &kv->streams[i];
        put_i32(&b, s->label);
        put_i32(&b, s->length);
        put_i32(&b, s->start);
        put_i32(&b, s->n_pages);
        put(&b, s->pages, (size_t)s->n_pages * sizeof(int32_t));
        put(&b, pl->bytes[i], (size_t)pl->n_pages[i] * (size_t)pl->n_layers * pl->page_bytes);
    }
    if (b.oom) {
        ms_free(b.p);
        return MS_FAIL(err, MS_ERR_OOM, "pd record: out of host memory encoding %zu bytes", b.n);
    }
    *out = b.p;
    *n = b.n;
    return MS_OK;
}

/* ---- reader ---- */

typedef struct pd_rd {
    const uint8_t *p;
    size_t n, at;
    ms_error *err;
    ms_status st;
} pd_rd;

static bool get(pd_rd *r, void *dst, size_t n, const char *what) {
    if (r->st != MS_OK)
        return false;
    if (n > r->n - r->at) {
        r->st = MS_FAIL(r->err, MS_ERR_FORMAT, "pd record: %s (%zu bytes) at byte %zu runs past "
                        "the end (%zu bytes)", what, n, r->at, r->n);
        return false;
    }
    if (n > 0)
        memcpy(dst, r->p + r->at, n);
    r->at += n;
    return true;
}

/* An i32 in [lo, hi], else a format error naming it. */
static int32_t get_i32(pd_rd *r, const char *what, int64_t lo, int64_t hi) {
    int32_t v = 0;
    size_t at = r->at;
    if (get(r, &v, sizeof v, what) && (v < lo || v > hi)) {
        r->st = MS_FAIL(r->err, MS_ERR_FORMAT, "pd record: %s %d at byte %zu outside [%lld, %lld]",
                        what, (int)v, at, (long long)lo, (long long)hi);
        v = 0;
    }
    return v;
}

static int32_t *get_ids(pd_rd *r, int32_t n, const char *what) {
    if (r->st != MS_OK)
        return NULL;
    int32_t *ids = ms_malloc((size_t)MS_MAX(n, 1) * sizeof(int32_t));
    if (ids == NULL) {
        r->st = MS_FAIL(r->err, MS_ERR_OOM, "pd record: out of host memory for %s", what);
        return NULL;
    }
    if (!get(r, ids, (size_t)n * sizeof(int32_t), what)) {
        ms_free(ids);
        return NULL;
    }
    return ids;
}

ms_status ms_pd_record_decode(const uint8_t *buf, size_t n, ms_pd_record **out, ms_error *err) {
    *out = NULL;
    pd_rd r = {.p = buf, .n = n, .err = err, .st = MS_OK};
    uint32_t magic = 0, version = 0;
    get(&r, &magic, sizeof magic, "magic");
    if (r.st == MS_OK && magic != PD_MAGIC)
        return MS_FAIL(err, MS_ERR_FORMAT, "pd record: bad magic 0x%08x at byte 0 (not a "
                       "prefill record)", (unsigned)magic);
    get(&r, &version, sizeof version, "version");
    if (r.st == MS_OK && version != PD_VERSION)
        return MS_FAIL(err, MS_ERR_FORMAT, "pd record: version %u at byte 4, this build reads %u",
                       (unsigned)version, PD_VERSION);
    if (r.st != MS_OK)
        return r.st;
    ms_pd_record *rec = ms_calloc(1, sizeof *rec);
    ms_kv_published *kv = ms_calloc(1, sizeof *kv);
    ms_kv_payload *pl = ms_calloc(1, sizeof *pl);
    if (rec == NULL || kv == NULL || pl == NULL) {
        ms_free(rec);
        ms_free(kv);
        ms_free(pl);
        return MS_FAIL(err, MS_ERR_OOM, "pd record: out of host memory");
    }
    rec->kv = kv;
    rec->payload = pl;
    rec->n_prompt = get_i32(&r, "prompt length", 1, PD_MAX_TOKENS);
    rec->prompt = get_ids(&r, rec->n_prompt, "prompt ids");
    rec->max_new_tokens = get_i32(&r, "max_new_tokens", 1, PD_MAX_TOKENS);
    rec->ignore_eos = get_i32(&r, "ignore_eos", 0, 1) != 0;
    get(&r, &rec->sampling.temperature, sizeof(float), "temperature");
    get(&r, &rec->sampling.top_k, sizeof(int32_t), "top_k");
    get(&r, &rec->sampling.top_p, sizeof(float), "top_p");
    get(&r, &rec->sampling.seed, sizeof(uint64_t), "seed");
    rec->n_out = get_i32(&r, "sampled id count", 1, rec->max_new_tokens);
    rec->out = get_ids(&r, rec->n_out, "sampled ids");
    get(&r, &rec->draw, sizeof(uint64_t), "draw counter");
    for (int l = 0; l < MS_MAX_LABELS; l++)
        rec->pos.counter[l] = get_i32(&r, "position counter", 0, PD_MAX_TOKENS);
    kv->world_size = get_i32(&r, "world size", 0, 64);
    kv->rank = get_i32(&r, "rank", 0, 63);
    kv->page_size = get_i32(&r, "page size", 1, 1 << 16);
    pl->page_size = kv->page_size;
    pl->n_layers = get_i32(&r, "layer count", 1, 1 << 16);
    uint64_t page_bytes = 0;
    size_t at_pb = r.at;
    get(&r, &page_bytes, sizeof page_bytes, "page bytes");
    if (r.st == MS_OK && (page_bytes == 0 || page_bytes > PD_MAX_PAGE_BYTES))
        r.st = MS_FAIL(err, MS_ERR_FORMAT, "pd record: page bytes %llu at byte %zu outside "
                       "[1, %llu]", (unsigned long long)page_bytes, at_pb,
                       (unsigned long long)PD_MAX_PAGE_BYTES);
    pl->page_bytes = (size_t)page_bytes;
    int32_t n_streams = get_i32(&r, "stream count", 0, MS_MAX_LABELS);
    for (int32_t i = 0; i < n_streams && r.st == MS_OK; i++) {
        ms_kv_published_stream *s = &kv->streams[i];
        s->label = (ms_label)get_i32(&r, "stream label", 0, MS_MAX_LABELS - 1);
        s->length = get_i32(&r, "stream length", 0, PD_MAX_TOKENS);
        s->start = get_i32(&r, "stream start", 0, s->length);
        s->n_pages = get_i32(&r, "stream page count", 0, PD_MAX_TOKENS);
        s->pages = get_ids(&r, s->n_pages, "stream pages");
        if (s->pages == NULL)
            break;
        kv->n_streams = i + 1;
        pl->label[i] = s->label;
        pl->n_pages[i] = s->n_pages;
        size_t nb = (size_t)s->n_pages * (size_t)pl->n_layers;
        if (nb != 0 && pl->page_bytes > (r.n - r.at) / nb) {
            r.st = MS_FAIL(err, MS_ERR_FORMAT, "pd record: stream %d's %d pages of %d layers at "
                           "byte %zu run past the end (%zu bytes)", (int)i, (int)s->n_pages,
                           (int)pl->n_layers, r.at, r.n);
            break;
        }
        nb *= pl->page_bytes;
        pl->bytes[i] = ms_malloc(MS_MAX(nb, (size_t)1));
        if (pl->bytes[i] == NULL) {
            r.st = MS_FAIL(err, MS_ERR_OOM, "pd record: out of host memory (%zu bytes)", nb);
            break;
        }
        pl->n_streams = i + 1;
        get(&r, pl->bytes[i], nb, "page contents");
    }
    if (r.st == MS_OK && r.at != r.n)
        r.st = MS_FAIL(err, MS_ERR_FORMAT, "pd record: %zu bytes left over at byte %zu",
                       r.n - r.at, r.at);
    if (r.st != MS_OK) {
        ms_pd_record_free(rec);
        return r.st;
    }
    kv->source = pl;
    *out = rec;
    return MS_OK;
}
