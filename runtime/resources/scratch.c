/*
 * scratch.c - scratch pool resource: one buffer of max_rows fixed-size rows, allocated at init,
 * handed out by batch row (see scratch.h).
 */
#include "scratch.h"

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
