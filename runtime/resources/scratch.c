/*
 * scratch.c - scratch pool resource: one buffer of max_rows fixed-size rows, allocated at init,
 * handed out by batch row (see scratch.h).
 */
#include "scratch.h"

#include <string.h>

struct ms_scratch {
    ms_scratch_config cfg;
    unsigned char *base;     /* [max_rows * row_bytes] */
    ms_scratch_plan plan;    /* last plan */
};

ms_status ms_scratch_init(ms_scratch **out, const ms_scratch_config *cfg, ms_error *err) {
    *out = NULL;
    if (cfg->device == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "scratch: no device configured");
    if (cfg->max_rows < 1 || cfg->row_bytes == 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "scratch: max_rows %d, row_bytes %zu (need > 0)",
                       cfg->max_rows, cfg->row_bytes);
    if (cfg->row_bytes > SIZE_MAX / (size_t)cfg->max_rows)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "scratch: %d rows of %zu bytes overflow",
                       cfg->max_rows, cfg->row_bytes);
    ms_scratch *s = ms_calloc(1, sizeof *s);
    if (s == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "scratch: out of memory");
    size_t bytes = (size_t)cfg->max_rows * cfg->row_bytes;
    void *base = NULL;
    ms_status st = ms_device_alloc(cfg->device, bytes, "scratch", &base, err);
    if (st == MS_OK)
        st = ms_device_memset(cfg->device, base, 0, bytes, NULL, err);
    if (st != MS_OK) {
        ms_error_prefix(err, "scratch: %d rows x %zu bytes (scratch max_rows): ", cfg->max_rows,
                        cfg->row_bytes);
        ms_device_free_mem(cfg->device, base);
        ms_free(s);
        return st;
    }
    s->cfg = *cfg;
    s->base = base;
    s->plan = (ms_scratch_plan){base, cfg->row_bytes, 0};
    *out = s;
    return MS_OK;
}

void ms_scratch_free(ms_scratch *s) {
    if (s == NULL)
        return;
    ms_device_free_mem(s->cfg.device, s->base);
    ms_free(s);
}

void *ms_scratch_row(const ms_scratch *s, int32_t row) {
    if (row < 0 || row >= s->cfg.max_rows)
        return NULL;
    return s->base + (size_t)row * s->cfg.row_bytes;
}

int32_t ms_scratch_max_rows(const ms_scratch *s) { return s->cfg.max_rows; }

/* Batch rows of a step: the context's rows, else its segment count. */
static int32_t step_rows(const ms_step *step, int index, const ms_step_ctx *ctx) {
    if (ctx->request_ids != NULL && ctx->n_rows > 0)
        return ctx->n_rows;
    int32_t n;
    (void)ms_step_segments(step, index, &n);
    return n;
}

static ms_admit_outcome iface_admit(void *self, int index, const ms_step *step,
                                    ms_step_ctx *ctx) {
    ms_scratch *s = self;
    ms_admit_outcome o = ms_admit_ok();
    if (step_rows(step, index, ctx) > s->cfg.max_rows)
        o.code = MS_ADMIT_INVALID; /* can never fit: the buffer is fixed at init */
    return o;
}

static ms_status iface_plan(void *self, int index, const ms_step *step, ms_step_ctx *ctx,
                            const void **out, ms_error *err) {
    ms_scratch *s = self;
    int32_t rows = step_rows(step, index, ctx);
    if (rows > s->cfg.max_rows)
        return MS_FAIL(err, MS_ERR_CAPACITY, "scratch: %d rows, above max_rows %d", rows,
                       s->cfg.max_rows);
    s->plan.n_rows = rows;
    *out = &s->plan;
    return MS_OK;
}

static void iface_free(void *self) { ms_scratch_free(self); }

const ms_resource_i ms_scratch_iface = {
    .kind = MS_RESOURCE_SCRATCH,
    .admit = iface_admit,
    .plan = iface_plan,
    .free = iface_free,
};

ms_status ms_scratch_build(const void *config, const ms_resource_env *env, void **self,
                           const ms_resource_i **iface, ms_error *err) {
    (void)env;
    if (config == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "scratch: no config");
    ms_scratch *s;
    MS_TRY(ms_scratch_init(&s, config, err));
    *self = s;
    *iface = &ms_scratch_iface;
    return MS_OK;
}

/* ---- scratch KV ---- */

struct ms_scratch_kv {
    ms_scratch_kv_config cfg;
    void *data;              /* the arena, [layers][max_rows + 1][2][positions][kv_heads][head_dim] */
    size_t bytes;
    int32_t *length;         /* [max_rows] tokens held in the current frame, -1: no frame begun */
    ms_rid *holder;          /* [max_rows] the request whose frame the row holds */
    bool pending;            /* a plan is waiting for commit */
    int32_t n_pending;       /* its rows: pend_row[i] gets pend_len[i], pend_rid[i] */
    int32_t *pend_row, *pend_len;
    ms_rid *pend_rid;
    uint32_t *seen;          /* [max_rows] plan-call stamp of the last step naming the row */
    uint32_t stamp;
    /* plan arrays, sized for max_rows views and max_rows * positions tokens: */
    ms_kv_view *views;
    int32_t *pages;          /* [max_rows] views[i].pages points at pages[i] */
    int32_t *qo_indptr, *kv_indptr, *kv_indices, *kv_last_page_len, *kv_start;
    int32_t *token_to_page, *token_to_slot;
    ms_kv_plan plan;                   /* the runner's plan result */
    ms_scratch_kv_row *scratch_rows;   /* [max_rows] the runner's rows */
};

/* a * b into *out; false on overflow. */
static bool mul_size(size_t a, size_t b, size_t *out) {
    if (a != 0 && b > SIZE_MAX / a)
        return false;
    *out = a * b;
    return true;
}

ms_status ms_scratch_kv_init(ms_scratch_kv **out, const ms_scratch_kv_config *cfg, ms_error *err) {
    *out = NULL;
    if (cfg->device == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "scratch kv: no device configured");
    if (cfg->max_rows < 1 || cfg->layers < 1 || cfg->positions < 1 || cfg->kv_heads < 1 ||
        cfg->head_dim < 1 || cfg->elem_bytes == 0 || cfg->max_rows == INT32_MAX)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "scratch kv: max_rows %d, layers %d, positions %d, kv_heads %d, head_dim %d, "
                       "elem_bytes %zu (each must be > 0)", cfg->max_rows, cfg->layers,
                       cfg->positions, cfg->kv_heads, cfg->head_dim, cfg->elem_bytes);
    size_t bytes = cfg->elem_bytes, tokens;
    bool ok = mul_size(bytes, (size_t)cfg->layers, &bytes) &&
              mul_size(bytes, (size_t)cfg->max_rows + 1, &bytes) && mul_size(bytes, 2, &bytes) &&
              mul_size(bytes, (size_t)cfg->positions, &bytes) &&
              mul_size(bytes, (size_t)cfg->kv_heads, &bytes) &&
              mul_size(bytes, (size_t)cfg->head_dim, &bytes) &&
              mul_size((size_t)cfg->max_rows, (size_t)cfg->positions, &tokens) && tokens <= INT32_MAX;
    if (!ok)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "scratch kv: %d rows x %d layers x %d positions x %d heads x %d dims overflow",
                       cfg->max_rows, cfg->layers, cfg->positions, cfg->kv_heads, cfg->head_dim);
    ms_scratch_kv *s = ms_calloc(1, sizeof *s);
    if (s == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "scratch kv: out of memory");
    const size_t R = (size_t)cfg->max_rows;
    s->length = ms_malloc(R * sizeof(int32_t));
    s->seen = ms_calloc(R, sizeof(uint32_t));
    s->holder = ms_calloc(R, sizeof(ms_rid));
    s->pend_row = ms_calloc(R, sizeof(int32_t));
    s->pend_len = ms_calloc(R, sizeof(int32_t));
    s->pend_rid = ms_calloc(R, sizeof(ms_rid));
    s->scratch_rows = ms_calloc(R, sizeof(ms_scratch_kv_row));
    s->views = ms_calloc(R, sizeof(ms_kv_view));
    s->pages = ms_calloc(R, sizeof(int32_t));
    s->qo_indptr = ms_calloc(R + 1, sizeof(int32_t));
    s->kv_indptr = ms_calloc(R + 1, sizeof(int32_t));
    s->kv_indices = ms_calloc(R, sizeof(int32_t));
    s->kv_last_page_len = ms_calloc(R, sizeof(int32_t));
    s->kv_start = ms_calloc(R, sizeof(int32_t));
    s->token_to_page = ms_calloc(tokens, sizeof(int32_t));
    s->token_to_slot = ms_calloc(tokens, sizeof(int32_t));
    if (s->length == NULL || s->seen == NULL || s->holder == NULL || s->pend_row == NULL ||
        s->pend_len == NULL || s->pend_rid == NULL || s->scratch_rows == NULL || s->views == NULL || s->pages == NULL ||
        s->qo_indptr == NULL || s->kv_indptr == NULL || s->kv_indices == NULL ||
        s->kv_last_page_len == NULL || s->kv_start == NULL || s->token_to_page == NULL ||
        s->token_to_slot == NULL) {
        ms_scratch_kv_free(s);
        return MS_FAIL(err, MS_ERR_OOM, "scratch kv: out of memory for %d rows", cfg->max_rows);
    }
    for (size_t r = 0; r < R; r++)
        s->length[r] = -1;
    s->cfg = *cfg;
    ms_status st = ms_device_alloc(cfg->device, bytes, "scratch kv", &s->data, err);
    if (st == MS_OK)
        st = ms_device_memset(cfg->device, s->data, 0, bytes, NULL, err);
    if (st != MS_OK) {
        ms_error_prefix(err, "scratch kv: %d rows x %zu bytes (scratch rows): ", cfg->max_rows,
                        bytes / R);
        ms_scratch_kv_free(s);
        return st;
    }
    s->bytes = bytes;
    *out = s;
    return MS_OK;
}

void ms_scratch_kv_free(ms_scratch_kv *s) {
    if (s == NULL)
        return;
    if (s->data != NULL)
        ms_device_free_mem(s->cfg.device, s->data);
    ms_free(s->length);
    ms_free(s->seen);
    ms_free(s->holder);
    ms_free(s->pend_row);
    ms_free(s->pend_len);
    ms_free(s->pend_rid);
    ms_free(s->scratch_rows);
    ms_free(s->views);
    ms_free(s->pages);
    ms_free(s->qo_indptr);
    ms_free(s->kv_indptr);
    ms_free(s->kv_indices);
    ms_free(s->kv_last_page_len);
    ms_free(s->kv_start);
    ms_free(s->token_to_page);
    ms_free(s->token_to_slot);
    ms_free(s);
}

void *ms_scratch_kv_data(const ms_scratch_kv *s) { return s->data; }

size_t ms_scratch_kv_bytes(const ms_scratch_kv *s) { return s->bytes; }

int32_t ms_scratch_kv_pages(const ms_scratch_kv *s) { return s->cfg.max_rows + 1; }

int32_t ms_scratch_kv_row_page(const ms_scratch_kv *s, int32_t row) {
    return row >= 0 && row < s->cfg.max_rows ? row + 1 : -1;
}

int32_t ms_scratch_kv_length(const ms_scratch_kv *s, int32_t row) {
    if (row < 0 || row >= s->cfg.max_rows)
        return -1;
    return s->length[row] < 0 ? 0 : s->length[row];
}

ms_status ms_scratch_kv_plan(ms_scratch_kv *s, const ms_scratch_kv_row *rows, int32_t n,
                             ms_kv_plan *out, ms_error *err) {
    if (n < 0 || n > s->cfg.max_rows)
        return MS_FAIL(err, MS_ERR_CAPACITY, "scratch kv: %d rows, above max_rows %d", n,
                       s->cfg.max_rows);
    if (++s->stamp == 0) { /* wrapped: clear the stamps so none looks current */
        memset(s->seen, 0, (size_t)s->cfg.max_rows * sizeof(uint32_t));
        s->stamp = 1;
    }
    /* validate everything first: on error nothing changes */
    for (int32_t i = 0; i < n; i++) {
        const ms_scratch_kv_row *q = &rows[i];
        if (q->row < 0 || q->row >= s->cfg.max_rows)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "scratch kv: view %d names batch row %d "
                           "(rows 0 .. %d)", i, q->row, s->cfg.max_rows - 1);
        if (s->seen[q->row] == s->stamp)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "scratch kv: batch row %d is given twice in "
                           "one step", q->row);
        s->seen[q->row] = s->stamp;
        if (q->span < 0)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "scratch kv: batch row %d has span %d",
                           q->row, q->span);
        if (!q->begin_frame && s->length[q->row] < 0)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "scratch kv: batch row %d continues a frame "
                           "it never began (its keys would be another frame's)", q->row);
        if (!q->begin_frame && s->holder[q->row] != q->rid)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "scratch kv: batch row %d continues request "
                           "%llu's frame for request %llu (the batch changed mid-frame)", q->row,
                           (unsigned long long)s->holder[q->row], (unsigned long long)q->rid);
        int64_t held = q->begin_frame ? 0 : s->length[q->row];
        if (held + q->span > s->cfg.positions)
            return MS_FAIL(err, MS_ERR_CAPACITY, "scratch kv: batch row %d would hold %lld tokens "
                           "in one frame, above the scratch's %d positions", q->row,
                           (long long)(held + q->span), s->cfg.positions);
    }
    const int32_t P = s->cfg.positions;
    int32_t t = 0;
    s->qo_indptr[0] = 0;
    s->kv_indptr[0] = 0;
    bool decode = n > 0;
    for (int32_t i = 0; i < n; i++) {
        const ms_scratch_kv_row *q = &rows[i];
        int32_t held = q->begin_frame ? 0 : s->length[q->row];
        int32_t len = held + q->span;
        s->pend_row[i] = q->row;
        s->pend_len[i] = len;
        s->pend_rid[i] = q->rid;
        s->pages[i] = q->row + 1;
        s->views[i] = (ms_kv_view){.rid = q->rid, .label = 0, .pages = &s->pages[i],
                                   .n_pages = len > 0 ? 1 : 0, .start = 0, .length = len,
                                   .to_compute = q->span, .generation = 0};
        s->qo_indptr[i + 1] = s->qo_indptr[i] + q->span;
        s->kv_indptr[i + 1] = s->kv_indptr[i] + (len > 0 ? 1 : 0);
        if (len > 0)
            s->kv_indices[s->kv_indptr[i]] = q->row + 1;
        s->kv_last_page_len[i] = len == 0 ? 0 : (len % P == 0 ? P : len % P);
        s->kv_start[i] = 0;
        for (int32_t j = 0; j < q->span; j++, t++) {
            s->token_to_page[t] = q->row + 1;
            s->token_to_slot[t] = held + j;
        }
        if (q->span != 1)
            decode = false;
    }
    *out = (ms_kv_plan){.plan_label = 0, .n_views = n, .views = s->views, .n_tokens = t,
                        .qo_indptr = s->qo_indptr, .kv_indptr = s->kv_indptr,
                        .kv_indices = s->kv_indices, .kv_last_page_len = s->kv_last_page_len,
                        .kv_start = s->kv_start, .token_to_page = s->token_to_page,
                        .token_to_slot = s->token_to_slot, .is_decode = decode};
    s->pending = true;
    s->n_pending = n;
    return MS_OK;
}

ms_status ms_scratch_kv_commit(ms_scratch_kv *s, ms_error *err) {
    if (!s->pending)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "scratch kv: commit without a pending plan");
    for (int32_t i = 0; i < s->n_pending; i++) {
        s->length[s->pend_row[i]] = s->pend_len[i];
        s->holder[s->pend_row[i]] = s->pend_rid[i];
    }
    s->pending = false;
    s->n_pending = 0;
    return MS_OK;
}

void ms_scratch_kv_abandon(ms_scratch_kv *s) {
    s->pending = false;
    s->n_pending = 0;
}

/* ---- the scratch KV through the step runner ---- */

/* The rows of a step: segment i is batch row i. Fills rows[0 .. n); false: more than max_rows. */
static bool skv_rows(const ms_scratch_kv *s, int index, const ms_step *step,
                     ms_scratch_kv_row *rows, int32_t *n) {
    const ms_segment *seg = ms_step_segments(step, index, n);
    if (*n > s->cfg.max_rows)
        return false;
    const ms_scratch_kv_step *rec = step->records[index].rec;
    const bool begin = rec != NULL && rec->begin_frame;
    for (int32_t i = 0; i < *n; i++)
        rows[i] = (ms_scratch_kv_row){seg[i].rid, i, seg[i].span, begin};
    return true;
}

static ms_admit_outcome skv_admit(void *self, int index, const ms_step *step, ms_step_ctx *ctx) {
    (void)ctx;
    ms_scratch_kv *s = self;
    ms_admit_outcome o = ms_admit_ok();
    int32_t n;
    const ms_segment *seg = ms_step_segments(step, index, &n);
    if (n > s->cfg.max_rows) {
        o.code = MS_ADMIT_INVALID; /* can never fit: the buffer is fixed at init */
        return o;
    }
    for (int32_t i = 0; i < n; i++)
        if (seg[i].span > s->cfg.positions) {
            o.code = MS_ADMIT_INVALID;
            o.rid = seg[i].rid;
            return o;
        }
    return o;
}

static ms_status skv_plan(void *self, int index, const ms_step *step, ms_step_ctx *ctx,
                          const void **out, ms_error *err) {
    (void)ctx;
    ms_scratch_kv *s = self;
    int32_t n;
    if (!skv_rows(s, index, step, s->scratch_rows, &n))
        return MS_FAIL(err, MS_ERR_CAPACITY, "scratch kv: step '%s' has %d rows, above max_rows %d",
                       step->name != NULL ? step->name : "?", n, s->cfg.max_rows);
    ms_status st = ms_scratch_kv_plan(s, s->scratch_rows, n, &s->plan, err);
    if (st != MS_OK) {
        ms_error_prefix(err, "step '%s': ", step->name != NULL ? step->name : "?");
        return st;
    }
    *out = &s->plan;
    return MS_OK;
}

static ms_status skv_commit(void *self, int index, const ms_step *step, ms_step_ctx *ctx,
                            ms_error *err) {
    (void)index, (void)step, (void)ctx;
    return ms_scratch_kv_commit(self, err);
}

static void skv_rollback(void *self, int index, const ms_step *step, ms_step_ctx *ctx) {
    (void)index, (void)step, (void)ctx;
    ms_scratch_kv_abandon(self);
}

static void skv_free(void *self) { ms_scratch_kv_free(self); }

const ms_resource_i ms_scratch_kv_iface = {
    .kind = MS_RESOURCE_SCRATCH,
    .admit = skv_admit,
    .admit_rollback = skv_rollback,
    .plan = skv_plan,
    .commit = skv_commit,
    .free = skv_free,
};

ms_status ms_scratch_kv_build(const void *config, const ms_resource_env *env, void **self,
                              const ms_resource_i **iface, ms_error *err) {
    (void)env;
    if (config == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "scratch kv: no config");
    ms_scratch_kv *s;
    MS_TRY(ms_scratch_kv_init(&s, config, err));
    *self = s;
    *iface = &ms_scratch_kv_iface;
    return MS_OK;
}
