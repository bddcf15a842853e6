/*
 * sample_res.c - the sampler resource (sample_res.h): settings per request, sample rows per step,
 * CFG mixing over host logits.
 *
 * Constraints: plan and commit allocate nothing (rows are sized at init); mixing is done in
 * double precision (the reference's log-softmax) and written back as f32.
 */
#include "sample_res.h"

#include <math.h>
#include <string.h>

#include "rid_map.h"

struct ms_sample_res {
    ms_rid_map map;          /* rid -> sample_state */
    ms_sample_row *rows;     /* [max_segments] plan result */
    int32_t max_segments;
};

typedef struct sample_state {
    ms_sample_row row;
    float guidance_scale;
} sample_state;

ms_status ms_sample_res_init(ms_sample_res **out, int32_t max_segments, ms_error *err) {
    *out = NULL;
    ms_sample_res *s = ms_calloc(1, sizeof *s);
    if (s == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "sampler: out of memory");
    ms_rid_map_init(&s->map, sizeof(sample_state));
    s->max_segments = max_segments > 0 ? max_segments : 1;
    s->rows = ms_calloc((size_t)s->max_segments, sizeof *s->rows);
    if (s->rows == NULL) {
        ms_sample_res_free(s);
        return MS_FAIL(err, MS_ERR_OOM, "sampler: out of memory for %d rows",
                       (int)max_segments);
    }
    *out = s;
    return MS_OK;
}

void ms_sample_res_free(ms_sample_res *s) {
    if (s == NULL)
        return;
    ms_rid_map_free(&s->map);
    ms_free(s->rows);
    ms_free(s);
}

static ms_status res_ingest(void *self, ms_rid rid, const void *overrides, ms_error *err) {
    ms_sample_res *s = self;
    sample_state *st;
    bool created;
    if (ms_rid_map_put(&s->map, rid, (void **)&st, &created) != MS_OK)
        return MS_FAIL(err, MS_ERR_OOM, "sampler: out of memory for request %llu",
                       (unsigned long long)rid);
    if (created) {
        const ms_sample_settings *o = overrides;
        st->row.params = o != NULL ? o->params : ms_sampling_greedy();
        st->row.draw = 0;
        st->guidance_scale = o != NULL ? o->guidance_scale : 1.0f;
    }
    return MS_OK;
}

static void res_remove(void *self, ms_rid rid) {
    ms_sample_res *s = self;
    ms_rid_map_remove(&s->map, rid);
}

static ms_admit_outcome res_admit(void *self, int index, const ms_step *step, ms_step_ctx *ctx) {
    (void)ctx;
    ms_sample_res *s = self;
    int32_t n;
    const ms_segment *segs = ms_step_segments(step, index, &n);
    ms_admit_outcome o = ms_admit_ok();
    for (int32_t i = 0; i < n; i++) {
        if (i >= s->max_segments || ms_rid_map_get(&s->map, segs[i].rid) == NULL) {
            o.code = MS_ADMIT_INVALID;
            o.rid = segs[i].rid;
            o.label = segs[i].label;
            return o;
        }
    }
    return o;
}

static ms_status res_plan(void *self, int index, const ms_step *step, ms_step_ctx *ctx,
                          const void **out, ms_error *err) {
    (void)ctx;
    ms_sample_res *s = self;
    int32_t n;
    const ms_segment *segs = ms_step_segments(step, index, &n);
    for (int32_t i = 0; i < n; i++) {
        const sample_state *st = ms_rid_map_get(&s->map, segs[i].rid);
        if (st == NULL)
            return MS_FAIL(err, MS_ERR_NOT_FOUND, "sampler: unknown request %llu",
                           (unsigned long long)segs[i].rid);
        s->rows[i] = st->row;
    }
    *out = s->rows;
    return MS_OK;
}

static ms_status res_commit(void *self, int index, const ms_step *step, ms_step_ctx *ctx,
                            ms_error *err) {
    (void)ctx;
    (void)err;
    ms_sample_res *s = self;
    const ms_sample_step *rec = step->records[index].rec;
    int32_t n;
    const ms_segment *segs = ms_step_segments(step, index, &n);
    for (int32_t i = 0; i < n; i++) {
        sample_state *st = ms_rid_map_get(&s->map, segs[i].rid);
        if (st != NULL && rec->sample[i])
            st->row.draw++;
    }
    return MS_OK;
}

static void res_free(void *self) { ms_sample_res_free(self); }

static const ms_resource_i sample_res_iface = {
    .kind = MS_RESOURCE_SAMPLER,
    .ingest = res_ingest,
    .remove = res_remove,
    .admit = res_admit,
    .plan = res_plan,
    .commit = res_commit,
    .free = res_free,
};

const ms_resource_i *ms_sample_res_iface(void) { return &sample_res_iface; }

/* log-sum-exp of a row, in double. */
static double row_lse(const float *x, int32_t n) {
    double m = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        if (x[i] > m)
            m = x[i];
    double sum = 0.0;
    for (int32_t i = 0; i < n; i++)
        sum += exp((double)x[i] - m);
    return m + log(sum);
}

void ms_sample_res_mix(const ms_sample_res *s, int index, const ms_step *step, float *logits,
                       int32_t vocab, int32_t *n_mixed) {
    const ms_sample_step *rec = step->records[index].rec;
    int32_t n;
    const ms_segment *segs = ms_step_segments(step, index, &n);
    *n_mixed = 0;
    if (rec == NULL || rec->guide == NULL)
        return;
    for (int32_t i = 0; i < n; i++) {
        int32_t j = rec->guide[i];
        if (j < 0 || j >= n || j == i)
            continue;
        const sample_state *st = ms_rid_map_get(&s->map, segs[i].rid);
        double scale = st != NULL ? (double)st->guidance_scale : 1.0;
        float *c = logits + (size_t)i * (size_t)vocab;
        const float *u = logits + (size_t)j * (size_t)vocab;
        double lc = row_lse(c, vocab), lu = row_lse(u, vocab);
        for (int32_t v = 0; v < vocab; v++) {
            double pc = (double)c[v] - lc, pu = (double)u[v] - lu;
            c[v] = (float)(pu + scale * (pc - pu));
        }
        (*n_mixed)++;
    }
}
