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

/* A request's token history for penalties: an open-addressing table of distinct ids (linear
 * probing, capacity a power of two, at most half full). */
typedef struct hist_table {
    int32_t *ids;            /* [cap], -1 empty */
    int32_t *out_counts;     /* [cap] times generated */
    uint8_t *in_prompt;      /* [cap] */
    int32_t cap, n;
} hist_table;

typedef struct sample_state {
    ms_sample_row row;
    float guidance_scale;
    ms_sampler_penalties penalties;
    hist_table *hist;        /* NULL: no penalties */
} sample_state;

static void hist_free(hist_table *h) {
    if (h == NULL)
        return;
    ms_free(h->ids);
    ms_free(h->out_counts);
    ms_free(h->in_prompt);
    ms_free(h);
}

static ms_status hist_grow(hist_table *h, int32_t cap) {
    int32_t *ids = ms_malloc((size_t)cap * sizeof *ids);
    int32_t *cnt = ms_calloc((size_t)cap, sizeof *cnt);
    uint8_t *inp = ms_calloc((size_t)cap, 1);
    if (ids == NULL || cnt == NULL || inp == NULL) {
        ms_free(ids);
        ms_free(cnt);
        ms_free(inp);
        return MS_ERR_OOM;
    }
    for (int32_t i = 0; i < cap; i++)
        ids[i] = -1;
    for (int32_t i = 0; i < h->cap; i++) {
        if (h->ids[i] < 0)
            continue;
        uint32_t k = ((uint32_t)h->ids[i] * 2654435761u) & (uint32_t)(cap - 1);
        while (ids[k] >= 0)
            k = (k + 1) & (uint32_t)(cap - 1);
        ids[k] = h->ids[i];
        cnt[k] = h->out_counts[i];
        inp[k] = h->in_prompt[i];
    }
    ms_free(h->ids);
    ms_free(h->out_counts);
    ms_free(h->in_prompt);
    h->ids = ids;
    h->out_counts = cnt;
    h->in_prompt = inp;
    h->cap = cap;
    return MS_OK;
}

static ms_status hist_add(hist_table *h, int32_t id, bool prompt) {
    if (2 * (h->n + 1) > h->cap)
        MS_TRY(hist_grow(h, h->cap > 0 ? 2 * h->cap : 64));
    uint32_t k = ((uint32_t)id * 2654435761u) & (uint32_t)(h->cap - 1);
    while (h->ids[k] >= 0 && h->ids[k] != id)
        k = (k + 1) & (uint32_t)(h->cap - 1);
    if (h->ids[k] < 0) {
        h->ids[k] = id;
        h->n++;
    }
    if (prompt)
        h->in_prompt[k] = 1;
    else
        h->out_counts[k]++;
    return MS_OK;
}

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
    size_t cursor = 0;
    ms_rid rid;
    sample_state *st;
    while ((st = ms_rid_map_next(&s->map, &cursor, &rid)) != NULL)
        hist_free(st->hist);
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
        st->row.min_p = 0.0f;
        st->guidance_scale = o != NULL ? o->guidance_scale : 1.0f;
        st->penalties = (ms_sampler_penalties){0.0f, 0.0f, 1.0f};
        st->hist = NULL;
    }
    return MS_OK;
}

static void res_remove(void *self, ms_rid rid) {
    ms_sample_res *s = self;
    sample_state *st = ms_rid_map_get(&s->map, rid);
    if (st != NULL)
        hist_free(st->hist);
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

/* Row i's CFG partner (the unconditional row it mixes with), or -1: the one rule both
 * ms_sample_res_needs_host and ms_sample_res_mix apply. */
static int32_t guide_of(const ms_sample_step *rec, int32_t i, int32_t n) {
    const int32_t j = rec->guide != NULL ? rec->guide[i] : -1;
    return j >= 0 && j < n && j != i ? j : -1;
}

/* The state of a row whose logits get penalties (it has an output history), else NULL. */
static const sample_state *penalized(const ms_sample_res *s, const ms_segment *seg) {
    const sample_state *st = ms_rid_map_get(&s->map, seg->rid);
    return st != NULL && st->hist != NULL && st->hist->n > 0 ? st : NULL;
}

bool ms_sample_res_needs_host(const ms_sample_res *s, int index, const ms_step *step) {
    const ms_sample_step *rec = step->records[index].rec;
    int32_t n;
    const ms_segment *segs = ms_step_segments(step, index, &n);
    if (rec == NULL)
        return false;
    for (int32_t i = 0; i < n; i++)
        if (guide_of(rec, i, n) >= 0 || penalized(s, &segs[i]) != NULL)
            return true;
    return false;
}

void ms_sample_res_mix(const ms_sample_res *s, int index, const ms_step *step, float *logits,
                       int32_t vocab, int32_t *n_mixed) {
    const ms_sample_step *rec = step->records[index].rec;
    int32_t n;
    const ms_segment *segs = ms_step_segments(step, index, &n);
    *n_mixed = 0;
    if (rec == NULL)
        return;
    for (int32_t i = 0; i < n; i++) {
        const int32_t j = guide_of(rec, i, n);
        if (j < 0)
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
    /* penalties (after CFG: on the distribution the row samples from), before temperature */
    for (int32_t i = 0; i < n; i++) {
        const sample_state *st = penalized(s, &segs[i]);
        if (st == NULL)
            continue;
        ms_sampler_apply_penalties(logits + (size_t)i * (size_t)vocab, vocab, &st->penalties,
                                   st->hist->ids, st->hist->out_counts, st->hist->in_prompt,
                                   st->hist->cap);
        (*n_mixed)++;
    }
}

ms_status ms_sample_res_set_extra(ms_sample_res *s, ms_rid rid, const ms_sample_extra *x,
                                  ms_error *err) {
    sample_state *st = ms_rid_map_get(&s->map, rid);
    if (st == NULL)
        return MS_FAIL(err, MS_ERR_NOT_FOUND, "sampler: unknown request %llu",
                       (unsigned long long)rid);
    const ms_sampler_penalties *p = &x->penalties;
    if (!(x->min_p >= 0.0f && x->min_p <= 1.0f))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "sampler: min_p %g must be in [0, 1]",
                       (double)x->min_p);
    if (!(fabsf(p->presence) <= 2.0f) || !(fabsf(p->frequency) <= 2.0f))
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "sampler: presence %g / frequency %g penalties must be in [-2, 2]",
                       (double)p->presence, (double)p->frequency);
    if (!(p->repetition > 0.0f && p->repetition <= 2.0f))
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "sampler: repetition penalty %g must be in (0, 2]", (double)p->repetition);
    st->row.min_p = x->min_p;
    st->penalties = *p;
    if (!ms_sampler_penalties_off(p) && st->hist == NULL) {
        st->hist = ms_calloc(1, sizeof *st->hist);
        if (st->hist == NULL)
            return MS_FAIL(err, MS_ERR_OOM, "sampler: out of memory for request %llu's history",
                           (unsigned long long)rid);
    }
    return MS_OK;
}

ms_status ms_sample_res_observe(ms_sample_res *s, ms_rid rid, const int32_t *ids, int32_t n,
                                bool prompt, ms_error *err) {
    sample_state *st = ms_rid_map_get(&s->map, rid);
    if (st == NULL)
        return MS_FAIL(err, MS_ERR_NOT_FOUND, "sampler: unknown request %llu",
                       (unsigned long long)rid);
    if (st->hist == NULL)
        return MS_OK;
    for (int32_t i = 0; i < n; i++)
        if (ids[i] >= 0 && hist_add(st->hist, ids[i], prompt) != MS_OK)
            return MS_FAIL(err, MS_ERR_OOM, "sampler: out of memory for request %llu's history",
                           (unsigned long long)rid);
    return MS_OK;
}

/* [pd] */
ms_status ms_sample_res_pd_state(const ms_sample_res *s, ms_rid rid, ms_sampling_params *params,
                                 uint64_t *draw, bool *has_extra, ms_error *err) {
    const sample_state *st = ms_rid_map_get(&s->map, rid);
    if (st == NULL)
        return MS_FAIL(err, MS_ERR_NOT_FOUND, "sampler: unknown request %llu",
                       (unsigned long long)rid);
    *params = st->row.params;
    *draw = st->row.draw;
    *has_extra = st->row.min_p != 0.0f || !ms_sampler_penalties_off(&st->penalties) ||
                 st->guidance_scale != 1.0f;
    return MS_OK;
}

ms_status ms_sample_res_pd_set_draw(ms_sample_res *s, ms_rid rid, uint64_t draw, ms_error *err) {
    sample_state *st = ms_rid_map_get(&s->map, rid);
    if (st == NULL)
        return MS_FAIL(err, MS_ERR_NOT_FOUND, "sampler: unknown request %llu",
                       (unsigned long long)rid);
    st->row.draw = draw;
    return MS_OK;
}
