/*
 * kv_mock.h - test-only KV resource (kind MS_RESOURCE_KV) producing ms_kv_plan_set, used to test
 * positions, attention, cross-attention and the step runner without the real KV pool.
 *
 * It keeps what the consumers read: streams per (rid, label) with stored length and a page list,
 * whole-page admit (all-or-nothing, idempotent, with rollback), views sliced to the length,
 * FlashInfer index arrays, per-token write addresses, decode detection by "every span == 1",
 * combined labels label-major, pre-forks at plan and post-forks at commit (lengths and pages
 * mirrored), reset with or without freeing, and a trace of calls. Page 0 is the sink, never
 * handed out. Include in one test file only (static functions).
 */
#ifndef KV_MOCK_H
#define KV_MOCK_H

#include <stdio.h>
#include <string.h>

#include "resource.h"
#include "rid_map.h"
#include "step_runner.h"

#define MOCK_MAX_STREAM_PAGES 160

typedef struct mock_stream {
    bool exists;
    int32_t stored;
    int32_t n_pages;
    int32_t pages[MOCK_MAX_STREAM_PAGES];
    uint32_t gen;
} mock_stream;

typedef struct mock_req {
    mock_stream s[MS_MAX_LABELS];
} mock_req;

typedef struct mock_undo {
    ms_rid rid;
    ms_label label;
    int32_t n_pages_before;
    bool existed;
} mock_undo;

typedef struct mock_kv_config {
    int32_t page_size;
    int32_t n_pages; /* including the sink page 0 */
} mock_kv_config;

typedef struct mock_kv {
    int32_t page_size;
    int32_t n_pages;
    int32_t *free_pages; /* stack of free page ids */
    int32_t n_free;
    ms_rid_map reqs;     /* rid -> mock_req */
    mock_undo undo[256];
    int32_t n_undo;
    /* plan output storage (re-made every plan) */
    ms_kv_plan plans[MS_MAX_LABELS];
    ms_kv_plan_set set;
    void *blocks[MS_MAX_LABELS * 8];
    int n_blocks;
    /* test knobs and counters */
    int fail_admit;      /* > 0: the next admits fail with PAGES_SHORT */
    bool admit_pending;  /* admits report PENDING */
    int n_admit, n_rollback, n_plan, n_commit;
    char *trace;         /* optional shared trace buffer (appended "kv.<verb> ") */
    size_t trace_cap;
} mock_kv;

static void mock_trace(mock_kv *kv, const char *verb) {
    if (kv->trace != NULL) {
        size_t len = strlen(kv->trace);
        snprintf(kv->trace + len, kv->trace_cap - len, "kv.%s ", verb);
    }
}

static void mock_release(mock_kv *kv, mock_stream *s, int32_t keep) {
    while (s->n_pages > keep) {
        int32_t p = s->pages[--s->n_pages];
        MS_ASSERT(p != MS_SINK_PAGE);
        kv->free_pages[kv->n_free++] = p;
    }
}

static inline mock_kv *mock_kv_new(int32_t page_size, int32_t n_pages) {
    mock_kv *kv = ms_calloc(1, sizeof *kv);
    MS_ASSERT(kv != NULL);
    kv->page_size = page_size;
    kv->n_pages = n_pages;
    kv->free_pages = ms_calloc((size_t)n_pages, sizeof *kv->free_pages);
    MS_ASSERT(kv->free_pages != NULL);
    for (int32_t p = n_pages - 1; p >= 1; p--) /* page 0 is the sink; lowest ids handed first */
        kv->free_pages[kv->n_free++] = p;
    ms_rid_map_init(&kv->reqs, sizeof(mock_req));
    return kv;
}

static void mock_free_blocks(mock_kv *kv) {
    for (int i = 0; i < kv->n_blocks; i++)
        ms_free(kv->blocks[i]);
    kv->n_blocks = 0;
}

static void mock_kv_free(void *self) {
    mock_kv *kv = self;
    if (kv == NULL)
        return;
    mock_free_blocks(kv);
    ms_rid_map_free(&kv->reqs);
    ms_free(kv->free_pages);
    ms_free(kv);
}

static mock_stream *mock_stream_of(mock_kv *kv, ms_rid rid, ms_label label) {
    mock_req *r = ms_rid_map_get(&kv->reqs, rid);
    return r != NULL && r->s[label].exists ? &r->s[label] : NULL;
}

static ms_status mock_ingest(void *self, ms_rid rid, const void *ov, ms_error *err) {
    (void)ov;
    mock_kv *kv = self;
    mock_req *r;
    bool created;
    if (ms_rid_map_put(&kv->reqs, rid, (void **)&r, &created) != MS_OK)
        return MS_FAIL(err, MS_ERR_OOM, "mock kv: oom");
    r->s[MS_LABEL_MAIN].exists = true;
    return MS_OK;
}

static void mock_remove(void *self, ms_rid rid) {
    mock_kv *kv = self;
    mock_req *r = ms_rid_map_get(&kv->reqs, rid);
    if (r == NULL)
        return;
    for (int l = 0; l < MS_MAX_LABELS; l++)
        mock_release(kv, &r->s[l], 0);
    ms_rid_map_remove(&kv->reqs, rid);
}

static void mock_reset(void *self, ms_rid rid, bool free_pages) {
    mock_kv *kv = self;
    mock_req *r = ms_rid_map_get(&kv->reqs, rid);
    if (r == NULL)
        return;
    for (int l = 0; l < MS_MAX_LABELS; l++) {
        if (free_pages)
            mock_release(kv, &r->s[l], 0);
        r->s[l].stored = 0;
        r->s[l].gen++;
    }
}

/* Pages stream (rid,label) must hold for `len` tokens beyond what it holds. */
static int32_t mock_need(mock_kv *kv, ms_rid rid, ms_label label, int32_t len) {
    mock_stream *s = mock_stream_of(kv, rid, label);
    int32_t have = s != NULL ? s->n_pages : 0;
    int32_t need = (int32_t)MS_CEIL_DIV(len, kv->page_size) - have;
    return need > 0 ? need : 0;
}

static int32_t mock_span_of(const ms_segment *segs, int32_t n, ms_rid rid, ms_label label) {
    int32_t span = 0;
    for (int32_t i = 0; i < n; i++)
        if (segs[i].rid == rid && segs[i].label == label)
            span += segs[i].span;
    return span;
}

static ms_rid mock_row(const ms_step_ctx *ctx, const ms_segment *segs, int32_t r) {
    return (ctx->request_ids != NULL && ctx->n_rows > 0) ? ctx->request_ids[r] : segs[r].rid;
}

static int32_t mock_rows(const ms_step_ctx *ctx, int32_t n_segs) {
    return (ctx->request_ids != NULL && ctx->n_rows > 0) ? ctx->n_rows : n_segs;
}

static ms_admit_outcome mock_admit(void *self, int index, const ms_step *step, ms_step_ctx *ctx) {
    mock_kv *kv = self;
    kv->n_admit++;
    mock_trace(kv, "admit");
    const ms_kv_step *ks = step->records[index].rec;
    int32_t n;
    const ms_segment *segs = ms_step_segments(step, index, &n);
    ms_admit_outcome o = ms_admit_ok();
    if (kv->fail_admit > 0) {
        kv->fail_admit--;
        o.code = MS_ADMIT_PAGES_SHORT;
        o.pages_short = 1;
        o.rid = n > 0 ? segs[0].rid : 0;
        return o;
    }
    for (int32_t i = 0; i < n; i++)
        if (ms_rid_map_get(&kv->reqs, segs[i].rid) == NULL) {
            o.code = MS_ADMIT_INVALID;
            o.rid = segs[i].rid;
            o.label = segs[i].label;
            return o;
        }
    /* total need (targets of forks, then segments); all-or-nothing */
    typedef struct { ms_rid rid; ms_label label; int32_t len; } want_t;
    want_t want[512];
    int32_t n_want = 0;
    int32_t rows = mock_rows(ctx, n);
    for (int pass = 0; pass < 2; pass++) {
        const ms_fork *fk = pass == 0 ? ks->pre_forks : ks->post_forks;
        int32_t nf = pass == 0 ? ks->n_pre_forks : ks->n_post_forks;
        for (int32_t f = 0; f < nf; f++)
            for (int32_t r = 0; r < rows; r++) {
                ms_rid rid = mock_row(ctx, segs, r);
                mock_stream *src = mock_stream_of(kv, rid, fk[f].from);
                int32_t extra =
                    pass == 1 && ks->commit ? mock_span_of(segs, n, rid, fk[f].from) : 0;
                int32_t len = (src ? src->stored : 0) + extra;
                if (len > 0)
                    want[n_want++] = (want_t){rid, fk[f].to, len};
            }
    }
    for (int32_t i = 0; i < n; i++) {
        if (segs[i].span == 0)
            continue;
        mock_stream *s = mock_stream_of(kv, segs[i].rid, segs[i].label);
        want[n_want++] = (want_t){segs[i].rid, segs[i].label, (s ? s->stored : 0) + segs[i].span};
    }
    int32_t total = 0;
    for (int32_t w = 0; w < n_want; w++)
        total += mock_need(kv, want[w].rid, want[w].label, want[w].len);
    if (total > kv->n_free) {
        o.code = MS_ADMIT_PAGES_SHORT;
        o.pages_short = total - kv->n_free;
        o.rid = n_want ? want[0].rid : 0;
        o.label = n_want ? want[0].label : 0;
        return o;
    }
    kv->n_undo = 0;
    for (int32_t w = 0; w < n_want; w++) {
        int32_t need = mock_need(kv, want[w].rid, want[w].label, want[w].len);
        if (need == 0)
            continue;
        mock_req *r = ms_rid_map_get(&kv->reqs, want[w].rid);
        mock_stream *s = &r->s[want[w].label];
        MS_ASSERT(s->n_pages + need <= MOCK_MAX_STREAM_PAGES);
        kv->undo[kv->n_undo++] = (mock_undo){want[w].rid, want[w].label, s->n_pages, s->exists};
        s->exists = true;
        for (int32_t k = 0; k < need; k++)
            s->pages[s->n_pages++] = kv->free_pages[--kv->n_free];
        s->gen++;
    }
    if (kv->admit_pending)
        o.code = MS_ADMIT_PENDING;
    return o;
}

static void mock_admit_rollback(void *self, int index, const ms_step *step, ms_step_ctx *ctx) {
    (void)index;
    (void)step;
    (void)ctx;
    mock_kv *kv = self;
    kv->n_rollback++;
    mock_trace(kv, "rollback");
    for (int32_t u = kv->n_undo - 1; u >= 0; u--) {
        mock_req *r = ms_rid_map_get(&kv->reqs, kv->undo[u].rid);
        if (r == NULL)
            continue;
        mock_stream *s = &r->s[kv->undo[u].label];
        mock_release(kv, s, kv->undo[u].n_pages_before);
        s->exists = kv->undo[u].existed;
    }
    kv->n_undo = 0;
}

static void *mock_block(mock_kv *kv, size_t n, size_t elem) {
    MS_ASSERT(kv->n_blocks < (int)MS_ARRAY_LEN(kv->blocks));
    void *p = ms_calloc(n ? n : 1, elem);
    MS_ASSERT(p != NULL);
    kv->blocks[kv->n_blocks++] = p;
    return p;
}

static void mock_fork(mock_kv *kv, ms_rid rid, const ms_fork *fk) {
    mock_req *r = ms_rid_map_get(&kv->reqs, rid);
    if (r == NULL || !r->s[fk->from].exists)
        return;
    mock_stream *src = &r->s[fk->from], *dst = &r->s[fk->to];
    dst->exists = true;
    dst->stored = src->stored;
    dst->gen++;
}

static ms_status mock_plan(void *self, int index, const ms_step *step, ms_step_ctx *ctx,
                           const void **out, ms_error *err) {
    (void)err;
    mock_kv *kv = self;
    kv->n_plan++;
    mock_trace(kv, "plan");
    mock_free_blocks(kv);
    const ms_kv_step *ks = step->records[index].rec;
    int32_t n;
    const ms_segment *segs = ms_step_segments(step, index, &n);
    int32_t rows = mock_rows(ctx, n);
    for (int32_t f = 0; f < ks->n_pre_forks; f++)
        for (int32_t r = 0; r < rows; r++)
            mock_fork(kv, mock_row(ctx, segs, r), &ks->pre_forks[f]);
    /* group segments into plan labels in order of first appearance */
    int32_t n_plans = 0;
    ms_label plan_of[MS_MAX_LABELS];
    for (int l = 0; l < MS_MAX_LABELS; l++) {
        plan_of[l] = (ms_label)l;
        for (int32_t c = 0; c < ks->n_combined; c++)
            for (int32_t k = 0; k < ks->combined[c].n_labels; k++)
                if (ks->combined[c].labels[k] == l)
                    plan_of[l] = ks->combined[c].plan_label;
    }
    ms_label order[MS_MAX_LABELS];
    for (int32_t i = 0; i < n; i++) {
        ms_label pl = plan_of[segs[i].label];
        bool seen = false;
        for (int32_t p = 0; p < n_plans; p++)
            seen = seen || order[p] == pl;
        if (!seen)
            order[n_plans++] = pl;
    }
    for (int32_t p = 0; p < n_plans; p++) {
        ms_kv_plan *kp = &kv->plans[p];
        memset(kp, 0, sizeof *kp);
        kp->plan_label = order[p];
        /* segments of this plan: label-major for combined labels */
        const ms_combined_label *cl = NULL;
        for (int32_t c = 0; c < ks->n_combined; c++)
            if (ks->combined[c].plan_label == order[p])
                cl = &ks->combined[c];
        int32_t idx[512];
        int32_t m = 0;
        if (cl != NULL) {
            for (int32_t k = 0; k < cl->n_labels; k++)
                for (int32_t i = 0; i < n; i++)
                    if (segs[i].label == cl->labels[k])
                        idx[m++] = i;
        } else {
            for (int32_t i = 0; i < n; i++)
                if (plan_of[segs[i].label] == order[p])
                    idx[m++] = i;
        }
        ms_kv_view *views = mock_block(kv, (size_t)m, sizeof *views);
        int32_t *qo = mock_block(kv, (size_t)m + 1, sizeof(int32_t));
        int32_t *kvp = mock_block(kv, (size_t)m + 1, sizeof(int32_t));
        int32_t *last = mock_block(kv, (size_t)m, sizeof(int32_t));
        int32_t *start = mock_block(kv, (size_t)m, sizeof(int32_t));
        int32_t tot_pages = 0, tot_tok = 0;
        for (int32_t v = 0; v < m; v++) {
            const ms_segment *sg = &segs[idx[v]];
            mock_stream *s = mock_stream_of(kv, sg->rid, sg->label);
            int32_t len = (s ? s->stored : 0) + sg->span;
            tot_pages += (int32_t)MS_CEIL_DIV(len, kv->page_size);
            tot_tok += sg->span;
        }
        int32_t *ind = mock_block(kv, (size_t)tot_pages, sizeof(int32_t));
        int32_t *t2p = mock_block(kv, (size_t)tot_tok, sizeof(int32_t));
        int32_t *t2s = mock_block(kv, (size_t)tot_tok, sizeof(int32_t));
        bool decode = m > 0;
        for (int32_t v = 0; v < m; v++) {
            const ms_segment *sg = &segs[idx[v]];
            mock_stream *s = mock_stream_of(kv, sg->rid, sg->label);
            int32_t stored = s ? s->stored : 0;
            int32_t len = stored + sg->span;
            int32_t np = (int32_t)MS_CEIL_DIV(len, kv->page_size);
            MS_ASSERT(s != NULL || np == 0);
            views[v] = (ms_kv_view){sg->rid, sg->label, ind + kvp[v], np, 0, len, sg->span,
                                    s ? s->gen : 0};
            for (int32_t k = 0; k < np; k++)
                ind[kvp[v] + k] = s->pages[k];
            for (int32_t k = 0; k < sg->span; k++) {
                int32_t g = stored + k;
                t2p[qo[v] + k] = s->pages[g / kv->page_size];
                t2s[qo[v] + k] = g % kv->page_size;
            }
            qo[v + 1] = qo[v] + sg->span;
            kvp[v + 1] = kvp[v] + np;
            int32_t rem = len % kv->page_size;
            last[v] = np == 0 ? 0 : (rem == 0 ? kv->page_size : rem);
            decode = decode && sg->span == 1;
        }
        kp->n_views = m;
        kp->views = views;
        kp->n_tokens = tot_tok;
        kp->qo_indptr = qo;
        kp->kv_indptr = kvp;
        kp->kv_indices = ind;
        kp->kv_last_page_len = last;
        kp->kv_start = start;
        kp->token_to_page = t2p;
        kp->token_to_slot = t2s;
        kp->is_decode = decode;
    }
    kv->set = (ms_kv_plan_set){kv->page_size, n_plans, kv->plans, ks->pre_forks, ks->n_pre_forks,
                               ks->post_forks, ks->n_post_forks, ks->commit};
    *out = &kv->set;
    return MS_OK;
}

static ms_status mock_commit(void *self, int index, const ms_step *step, ms_step_ctx *ctx,
                             ms_error *err) {
    (void)err;
    mock_kv *kv = self;
    kv->n_commit++;
    mock_trace(kv, "commit");
    const ms_kv_step *ks = step->records[index].rec;
    int32_t n;
    const ms_segment *segs = ms_step_segments(step, index, &n);
    if (ks->commit)
        for (int32_t i = 0; i < n; i++) {
            mock_stream *s = mock_stream_of(kv, segs[i].rid, segs[i].label);
            if (s != NULL && segs[i].span > 0)
                s->stored += segs[i].span;
        }
    int32_t rows = mock_rows(ctx, n);
    for (int32_t f = 0; f < ks->n_post_forks; f++)
        for (int32_t r = 0; r < rows; r++)
            mock_fork(kv, mock_row(ctx, segs, r), &ks->post_forks[f]);
    return MS_OK;
}

static const ms_resource_i mock_kv_iface = {
    .kind = MS_RESOURCE_KV,
    .ingest = mock_ingest,
    .remove = mock_remove,
    .reset = mock_reset,
    .admit = mock_admit,
    .admit_rollback = mock_admit_rollback,
    .plan = mock_plan,
    .commit = mock_commit,
    .free = mock_kv_free,
};

static inline ms_status mock_kv_build(const void *config, const ms_resource_env *env, void **self,
                               const ms_resource_i **iface, ms_error *err) {
    (void)env;
    (void)err;
    const mock_kv_config *c = config;
    *self = mock_kv_new(c->page_size, c->n_pages);
    *iface = &mock_kv_iface;
    return MS_OK;
}

/* Stored length of (rid, label), -1 if absent. */
static inline int32_t mock_stored(mock_kv *kv, ms_rid rid, ms_label label) {
    mock_stream *s = mock_stream_of(kv, rid, label);
    return s ? s->stored : -1;
}

#endif /* KV_MOCK_H */
