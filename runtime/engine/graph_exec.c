/*
 * graph_exec.c - the captured path of the engine's node (graph_exec.h): buckets from the
 * node's capture declarations, padding with the graph plan's dummy rows, warm-up and capture
 * at start-up, staging and the padding check on every padded step, replay.
 *
 * Constraints kept:
 *   - a padded step allocates nothing: the padding bitmap is made at init, the graph plan's
 *     static states at capture;
 *   - graphs are captured largest bucket first, after every bucket's warm-up, so no buffer that
 *     grows on first use is reallocated under a graph captured earlier;
 *   - a (bucket, slot) whose capture failed is never leased (graph_plan.h); the engine stays
 *     usable on the eager path;
 *   - decode rows i of a lease are dummy i of its slot; prefill padding rows n + j are dummy j
 *     (dummy 0 carries the token tail, so only it ever holds more than one page).
 */
#include "graph_exec.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#define GX_MAX_SLOTS 2 /* two with the pre-plan (step N+1 planned while N replays), else one */
#define GX_MAX_GRAPHS (MS_MD_MAX_STEPS * MS_MD_MAX_BUCKETS * GX_MAX_SLOTS)
/* buckets of one step: a token step has up to MS_GRAPH_PREFILL_N_ROWS per declared bucket */
#define GX_STEP_BUCKETS (MS_MD_MAX_BUCKETS * MS_GRAPH_PREFILL_N_ROWS)

/* The staged pre-plan of the next step (graph_exec.h, ms_graph_exec_preplan). */
typedef struct gx_preplan {
    bool pending;             /* admitted, planned and staged; neither taken nor dropped */
    ms_graph_step gs;         /* its rows, lease (slot other than the step it was made under) */
    const ms_step *step;      /* the declaration it was admitted with (caller's, borrowed) */
    ms_step_ctx ctx;          /* its plan results; ctx.lease points at gs.lease */
    ms_rid *rids;             /* [max_bs] its rows' ids (real first, then the slot's dummies) */
} gx_preplan;

struct ms_graph_exec {
    ms_graph_exec_config cfg;
    bool record;                       /* AUTO: graphs are recorded and replayed */
    ms_graph_plan *plan;
    int32_t n_slots;                   /* 2 with cfg.preplan, else 1 */
    int32_t max_bs;                    /* largest kept bucket */
    bool step_on[MS_MD_MAX_STEPS];     /* the step has buckets in the plan */
    bool by_tokens[MS_MD_MAX_STEPS];   /* a token (prefill) step: (tokens, rows) buckets */
    int32_t n_bk[MS_MD_MAX_STEPS];     /* kept buckets of step k */
    int32_t bk_bs[MS_MD_MAX_STEPS][GX_STEP_BUCKETS];    /* their rows */
    int32_t bk_tok[MS_MD_MAX_STEPS][GX_STEP_BUCKETS];   /* their tokens; ascending (tok, rows) */
    int32_t bk_index[MS_MD_MAX_STEPS][GX_STEP_BUCKETS]; /* their graph plan bucket indices */
    uint8_t *mark;                     /* [ceil(n_pages / 8)] padding-check bitmap, zero */
    void *graphs[GX_MAX_GRAPHS];       /* owned, by bucket * GX_MAX_SLOTS + slot */
    uint64_t fingerprint[GX_MAX_GRAPHS]; /* forward arguments at capture */
    bool dummies_in;                   /* dummy rows ingested */
    gx_preplan pre;                    /* cfg.preplan: the next step's staged plan */
    ms_graph_exec_stats st;
};

const char *ms_graph_mode_str(ms_graph_mode m) {
    static const char *const names[MS_GRAPH_MODE_COUNT] = {"auto", "off", "padded"};
    return (m >= 0 && m < MS_GRAPH_MODE_COUNT) ? names[m] : "?";
}

bool ms_graph_exec_step_capturable(const ms_md_node *node, int32_t k) {
    if (node == NULL || k < 0 || k >= node->n_steps)
        return false;
    const ms_md_step *sd = &node->steps[k];
    /* a token step reading explicit positions (M-RoPE prefill) has rows a dummy cannot be */
    return sd->n_buckets > 0 && sd->n_segments == 1 && !sd->all_logits &&
           !(sd->capture_by_tokens && sd->explicit_positions);
}

int32_t ms_graph_exec_buckets(const ms_md_node *node, int32_t k, int32_t max_rows,
                              int32_t max_tokens, int32_t *out, int32_t cap) {
    if (!ms_graph_exec_step_capturable(node, k))
        return 0;
    const ms_md_step *sd = &node->steps[k];
    const int32_t lo = sd->capture_by_tokens ? 2 : 1;
    const int32_t hi = sd->capture_by_tokens ? max_tokens : max_rows;
    int32_t n = 0;
    for (int32_t i = 0; i < sd->n_buckets && n < cap; i++)
        if (sd->buckets[i] >= lo && sd->buckets[i] <= hi &&
            (n == 0 || sd->buckets[i] > out[n - 1])) /* ascending, no duplicate */
            out[n++] = (int32_t)sd->buckets[i];
    return n;
}

/* The row counts of prefill token bucket `tokens` (MS_GRAPH_PREFILL_ROWS: <= max_rows and below
 * tokens), ascending, into out[MS_GRAPH_PREFILL_N_ROWS]; returns their count. */
static int32_t prefill_rows(int32_t tokens, int32_t max_rows, int32_t *out) {
    static const int32_t rows[MS_GRAPH_PREFILL_N_ROWS] = MS_GRAPH_PREFILL_ROWS;
    int32_t n = 0;
    for (int32_t i = 0; i < MS_GRAPH_PREFILL_N_ROWS; i++)
        if (rows[i] <= max_rows && rows[i] < tokens)
            out[n++] = rows[i];
    return n;
}

int32_t ms_graph_exec_dummy_pages(const ms_md_node *node, int32_t max_rows, int32_t max_tokens,
                                  int32_t page_size, bool preplan) {
    int32_t max_bs = 0, max_tok = 0;
    for (int32_t k = 0; node != NULL && k < node->n_steps; k++) {
        int32_t b[MS_MD_MAX_BUCKETS];
        int32_t n = ms_graph_exec_buckets(node, k, max_rows, max_tokens, b, MS_MD_MAX_BUCKETS);
        if (n == 0)
            continue;
        if (!node->steps[k].capture_by_tokens) {
            max_bs = MS_MAX(max_bs, b[n - 1]);
            continue;
        }
        int32_t r[MS_GRAPH_PREFILL_N_ROWS];
        for (int32_t i = 0; i < n; i++) {
            int32_t nr = prefill_rows(b[i], max_rows, r);
            if (nr > 0) {
                max_bs = MS_MAX(max_bs, r[nr - 1]);
                max_tok = MS_MAX(max_tok, b[i]);
            }
        }
    }
    if (max_bs == 0)
        return 0;
    /* a dummy decode row, and a prefill padding row past the first, stores one token: one
       page; dummy 0 carries a prefill tail of up to max_tok tokens (from position 0: whole
       pages); a second slot with the pre-plan */
    const int32_t ps = MS_MAX(page_size, 1);
    const int32_t tail = MS_MAX(1, MS_CEIL_DIV(max_tok, ps));
    return (max_bs - 1 + tail) * (preplan ? 2 : 1);
}

void ms_graph_exec_free(ms_graph_exec *gx) {
    if (gx == NULL)
        return;
    ms_graph_exec_preplan_drop(gx); /* its pages back before the dummy rows go */
    for (int i = 0; i < GX_MAX_GRAPHS; i++)
        if (gx->graphs[i] != NULL)
            gx->cfg.be->iface.graph_free(gx->cfg.be->ctx, gx->graphs[i]);
    if (gx->dummies_in)
        ms_graph_plan_remove_dummies(gx->plan, gx->cfg.runner);
    ms_graph_plan_free(gx->plan);
    ms_free(gx->pre.rids);
    ms_free(gx->mark);
    ms_free(gx);
}

ms_status ms_graph_exec_init(ms_graph_exec **out, const ms_graph_exec_config *cfg,
                             ms_error *err) {
    *out = NULL;
    if (cfg == NULL || cfg->node == NULL || cfg->be == NULL || cfg->runner == NULL ||
        (cfg->mode != MS_GRAPHS_AUTO && cfg->mode != MS_GRAPHS_PADDED) || cfg->max_rows < 1 ||
        cfg->n_pages < 1 || cfg->kv_resource < 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "graphs: bad configuration (mode %s, max_rows %d, pages %d)",
                       cfg == NULL ? "?" : ms_graph_mode_str(cfg->mode),
                       cfg == NULL ? 0 : (int)cfg->max_rows, cfg == NULL ? 0 : (int)cfg->n_pages);
    const ms_backend_i *f = &cfg->be->iface;
    bool can_record = f->graph_capture_begin != NULL && f->graph_capture_end != NULL &&
                      f->graph_launch != NULL && f->graph_free != NULL;
    if (cfg->mode == MS_GRAPHS_AUTO && !can_record)
        return MS_OK; /* the CPU backend: eager, unpadded */
    if (cfg->max_tokens < 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "graphs: max_tokens %d", (int)cfg->max_tokens);
    if (ms_graph_exec_dummy_pages(cfg->node, cfg->max_rows, cfg->max_tokens, 1, cfg->preplan) ==
        0)
        return MS_OK; /* no step declares buckets that fit */
    ms_graph_exec *gx = ms_calloc(1, sizeof *gx);
    if (gx == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "graphs: out of memory");
    gx->cfg = *cfg;
    gx->record = cfg->mode == MS_GRAPHS_AUTO;
    gx->st.mode = cfg->mode;
    gx->n_slots = cfg->preplan ? 2 : 1;
    gx->st.n_slots = gx->n_slots;
    gx->mark = ms_calloc(((size_t)cfg->n_pages + 7) / 8, 1);
    ms_status st = gx->mark == NULL ? MS_FAIL(err, MS_ERR_OOM, "graphs: out of memory") : MS_OK;
    ms_graph_plan_config gc = {.n_slots = gx->n_slots, .dummy_base = MS_RID_DUMMY_BASE};
    if (st == MS_OK)
        st = ms_graph_plan_init(&gx->plan, &gc, err);
    for (int32_t k = 0; st == MS_OK && k < cfg->node->n_steps && k < MS_MD_MAX_STEPS; k++) {
        int32_t b[MS_MD_MAX_BUCKETS];
        int32_t n = ms_graph_exec_buckets(cfg->node, k, cfg->max_rows, cfg->max_tokens, b,
                                          MS_MD_MAX_BUCKETS);
        const bool tok = cfg->node->steps[k].capture_by_tokens;
        gx->by_tokens[k] = tok;
        for (int32_t i = 0; st == MS_OK && i < n; i++) {
            /* walk = step index: a decode bucket is (bs rows, bs tokens), a prefill bucket
               (R rows, T tokens) for each row count R of token bucket T */
            int32_t r[MS_GRAPH_PREFILL_N_ROWS] = {b[i]};
            const int32_t nr = tok ? prefill_rows(b[i], cfg->max_rows, r) : 1;
            for (int32_t j = 0; st == MS_OK && j < nr; j++) {
                int32_t index;
                st = ms_graph_plan_add_bucket(gx->plan, k, r[j], b[i], &index, err);
                const int32_t at = gx->n_bk[k]++;
                gx->bk_bs[k][at] = r[j];
                gx->bk_tok[k][at] = b[i];
                gx->bk_index[k][at] = index;
                gx->max_bs = MS_MAX(gx->max_bs, r[j]);
                gx->st.n_buckets++;
                gx->st.n_prefill_buckets += tok;
            }
        }
        gx->step_on[k] = gx->n_bk[k] > 0;
    }
    if (st == MS_OK && cfg->preplan) {
        gx->pre.rids = ms_calloc((size_t)gx->max_bs, sizeof(ms_rid));
        if (gx->pre.rids == NULL)
            st = MS_FAIL(err, MS_ERR_OOM, "graphs: out of memory");
    }
    if (st == MS_OK) {
        st = ms_graph_plan_ingest_dummies(gx->plan, cfg->runner, err);
        gx->dummies_in = true; /* remove is a no-op for rows never ingested */
    }
    if (st != MS_OK) {
        ms_error_prefix(err, "graphs: ");
        ms_graph_exec_free(gx);
        return st;
    }
    *out = gx;
    return MS_OK;
}

bool ms_graph_exec_is_dummy(const ms_graph_exec *gx, ms_rid rid) {
    return gx != NULL && ms_graph_plan_is_dummy(gx->plan, rid);
}

/* Rows [from, lease->bs) of rows/rids become the lease's dummy rows over step k's label: for a
 * decode step row i is dummy i, one token; for a token step row from + j is dummy j, dummy 0
 * with `tail` tokens, the others one. */
static void fill_dummies(const ms_graph_exec *gx, int32_t k, const ms_slot_lease *lease,
                         ms_md_row *rows, ms_rid *rids, int32_t from, int32_t tail) {
    const ms_md_step *sd = &gx->cfg.node->steps[k];
    const bool tok = gx->by_tokens[k];
    for (int32_t i = from; i < lease->bs; i++) {
        memset(&rows[i], 0, sizeof rows[i]);
        rows[i].rid = ms_graph_plan_dummy_rid(gx->plan, lease->slot, tok ? i - from : i);
        rows[i].len[sd->labels[0]] = tok && i == from ? tail : 1;
        rows[i].sample = false;
        rids[i] = rows[i].rid;
    }
}

/* Reset the padding rows of a leased step without freeing their pages (the mapping of
 * fill_dummies). */
static void release_padding(ms_graph_exec *gx, int32_t k, const ms_slot_lease *lease,
                            int32_t n_real) {
    if (k >= 0 && k < MS_MD_MAX_STEPS && gx->by_tokens[k]) {
        for (int32_t j = 0; j < lease->bs - MS_MAX(n_real, 0); j++)
            ms_step_runner_reset(gx->cfg.runner,
                                 ms_graph_plan_dummy_rid(gx->plan, lease->slot, j), false);
        return;
    }
    ms_graph_plan_release(gx->plan, gx->cfg.runner, lease, n_real);
}

/* Drop the pending pre-plan: its admit and plan undone in every resource (pages back, forks and
 * positions restored), its padding rows reset. */
static void preplan_abandon(ms_graph_exec *gx) {
    gx_preplan *pp = &gx->pre;
    if (!pp->pending)
        return;
    ms_graph_plan_preplan_abandon(gx->plan);
    ms_step_runner_abandon(gx->cfg.runner, pp->step, &pp->ctx);
    release_padding(gx, pp->gs.step, &pp->gs.lease, pp->gs.n_real);
    pp->pending = false;
}

/* Whether a prefill bucket (bs rows, tok tokens) takes n real rows of t tokens with its padding
 * rows (dummy 0 the tail, the others one token each). */
static bool prefill_fits(int32_t bs, int32_t tok, int32_t n, int32_t t) {
    if (bs < n || tok < t)
        return false;
    return bs == n ? tok == t : tok - t >= bs - n;
}

/* ms_graph_exec_pad of a token (prefill) step k (graph_exec.h, "Prefill"); no pre-plan is
 * pending here (the caller refused it). */
static ms_status pad_tokens(ms_graph_exec *gx, int32_t k, ms_md_row *rows, ms_rid *rids,
                            int32_t n_real, int32_t cap, ms_graph_step *gs, ms_error *err) {
    const ms_md_step *sd = &gx->cfg.node->steps[k];
    const ms_label label = sd->labels[0];
    int64_t t_real = 0;
    bool eager = false;
    for (int32_t i = 0; i < n_real; i++) {
        if (ms_graph_plan_is_dummy(gx->plan, rows[i].rid) || rids[i] != rows[i].rid)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "graphs: step %s: row %d has request id %llu (dummy range or not "
                           "the row's)", sd->name, (int)i, (unsigned long long)rids[i]);
        /* tokens of the step's label only, positions from the resource: else eager */
        for (int l = 0; l < MS_MAX_LABELS; l++)
            eager = eager || (l != label && rows[i].len[l] != 0);
        eager = eager || rows[i].len[label] < 1 || rows[i].position_ids != NULL;
        t_real += rows[i].len[label];
    }
    /* the tightest captured (tokens, rows) with room for the padding rows: each refusal raises
       what is asked (rows by one, or tokens to the rows' need), so this ends */
    int32_t need_bs = n_real, bucket = -1;
    int64_t need_tok = t_real;
    ms_slot_lease lease;
    ms_error quiet;
    while (!eager && need_tok <= INT32_MAX) {
        if (ms_graph_plan_select(gx->plan, k, need_bs, (int32_t)need_tok, &bucket, &quiet) !=
            MS_OK) {
            bucket = -1;
            break;
        }
        MS_TRY(ms_graph_plan_capture_lease(gx->plan, bucket, 0, &lease, err));
        if (prefill_fits(lease.bs, lease.n_tokens, n_real, (int32_t)t_real))
            break;
        if (lease.bs == n_real)
            need_bs = n_real + 1; /* a token tail needs a row of its own */
        else
            need_tok = t_real + (lease.bs - n_real);
        bucket = -1;
    }
    /* the slot's lease may land on a larger bucket (this slot's capture of that one failed):
       taken only when it fits too */
    if (eager || bucket < 0 ||
        ms_graph_plan_lease(gx->plan, k, lease.bs, lease.n_tokens, &lease, &quiet) != MS_OK ||
        !prefill_fits(lease.bs, lease.n_tokens, n_real, (int32_t)t_real)) {
        gx->st.n_eager++; /* above the largest bucket, more rows, or none captured: eager */
        return MS_OK;
    }
    if (cap < lease.bs)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "graphs: step %s: room for %d rows, bucket %d", sd->name, (int)cap,
                       (int)lease.bs);
    const int32_t pad_tok = lease.n_tokens - (int32_t)t_real;
    fill_dummies(gx, k, &lease, rows, rids, n_real, pad_tok - (lease.bs - n_real - 1));
    gs->padded = true;
    gs->leased = true;
    gs->lease = lease;
    gs->n_rows = lease.bs;
    gs->n_pad_tokens = pad_tok;
    gx->st.n_replays++;
    gx->st.n_prefill_replays++;
    gx->st.n_padding_rows += (uint64_t)(lease.bs - n_real);
    gx->st.n_padding_tokens += (uint64_t)pad_tok;
    gx->st.last_token_bucket = lease.n_tokens;
    return MS_OK;
}

ms_status ms_graph_exec_pad(ms_graph_exec *gx, int32_t k, ms_md_row *rows, ms_rid *rids,
                            int32_t n_real, int32_t cap, ms_graph_step *gs, ms_error *err) {
    memset(gs, 0, sizeof gs[0]);
    gs->step = k;
    gs->n_real = n_real;
    gs->n_rows = n_real;
    if (gx == NULL)
        return MS_OK;
    /* a pre-plan made for another step kind or other rows is refused by the identity check
       (the tag holds its lease, rid list and step hash) and dropped */
    gx_preplan *pp = &gx->pre;
    bool same = pp->pending && k == pp->gs.step && n_real == pp->gs.n_real;
    for (int32_t i = 0; same && i < n_real; i++)
        same = rids[i] == pp->rids[i];
    if (pp->pending && !same) {
        ms_error quiet;
        ms_status t = ms_graph_plan_preplan_take(gx->plan, &pp->gs.lease, rids, n_real, 0, &quiet);
        MS_ASSERT(t != MS_OK); /* the row count or a rid differs from the tag's */
        (void)t;
        preplan_abandon(gx);
        gx->st.n_preplan_refused++;
    }
    if (k < 0 || k >= MS_MD_MAX_STEPS || !gx->step_on[k] || n_real < 1) {
        ms_graph_exec_preplan_drop(gx); /* the same rows, but a step that is never padded */
        return MS_OK;
    }
    const ms_md_step *sd = &gx->cfg.node->steps[k];
    if (gx->by_tokens[k])
        return pad_tokens(gx, k, rows, rids, n_real, cap, gs, err);
    for (int32_t i = 0; i < n_real; i++) {
        if (ms_graph_plan_is_dummy(gx->plan, rows[i].rid) || rids[i] != rows[i].rid) {
            ms_graph_exec_preplan_drop(gx);
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "graphs: step %s: row %d has request id %llu (dummy range or not "
                           "the row's)", sd->name, (int)i, (unsigned long long)rids[i]);
        }
        /* one token of the step's label per row, positions from the resource: else eager */
        if (rows[i].len[sd->labels[0]] != 1 || rows[i].position_ids != NULL) {
            ms_graph_exec_preplan_drop(gx);
            gx->st.n_eager++;
            return MS_OK;
        }
    }
    ms_slot_lease lease;
    ms_error quiet;
    if (pp->pending) {
        lease = pp->gs.lease; /* the same rows: padded as the pre-plan was, take decides */
        gs->preplan = true;
    } else if (ms_graph_plan_lease(gx->plan, k, n_real, n_real, &lease, &quiet) != MS_OK) {
        gx->st.n_eager++; /* above the largest bucket, or no bucket captured: eager */
        return MS_OK;
    }
    if (cap < lease.bs) {
        ms_graph_exec_preplan_drop(gx);
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "graphs: step %s: room for %d rows, bucket %d", sd->name, (int)cap,
                       (int)lease.bs);
    }
    fill_dummies(gx, k, &lease, rows, rids, n_real, 1);
    gs->padded = true;
    gs->leased = true;
    gs->lease = lease;
    gs->n_rows = lease.bs;
    gs->n_pad_tokens = lease.bs - n_real;
    gx->st.n_replays++;
    gx->st.n_padding_rows += (uint64_t)(lease.bs - n_real);
    gx->st.last_bucket = lease.bs;
    return MS_OK;
}

/* ---- the pre-plan of step N+1 ---- */

bool ms_graph_exec_preplan_pending(const ms_graph_exec *gx) {
    return gx != NULL && gx->pre.pending;
}

bool ms_graph_exec_preplan_drop(ms_graph_exec *gx) {
    if (gx == NULL || !gx->pre.pending)
        return false;
    preplan_abandon(gx);
    gx->st.n_preplan_dropped++;
    return true;
}

ms_status ms_graph_exec_preplan_pad(ms_graph_exec *gx, const ms_graph_step *cur,
                                    ms_md_row *rows, int32_t cap, ms_graph_step *pgs) {
    memset(pgs, 0, sizeof pgs[0]);
    if (gx == NULL || cur == NULL)
        return MS_OK;
    pgs->step = cur->step;
    pgs->n_real = cur->n_real;
    pgs->n_rows = cur->n_real;
    /* only after a replay of real decode rows, one pre-plan at a time (the next prefill batch
       is not predictable) */
    if (!gx->cfg.preplan || gx->pre.pending || !cur->padded || !cur->leased || cur->capture ||
        cur->n_real < 1 || cur->step < 0 || cur->step >= MS_MD_MAX_STEPS ||
        gx->by_tokens[cur->step])
        return MS_OK;
    ms_slot_lease lease;
    ms_error quiet;
    if (ms_graph_plan_lease(gx->plan, cur->step, cur->n_real, cur->n_real, &lease, &quiet) !=
            MS_OK ||
        lease.slot == cur->lease.slot || cap < lease.bs)
        return MS_OK; /* no other captured slot (its capture failed): plan it when it comes */
    for (int32_t i = 0; i < cur->n_real; i++)
        gx->pre.rids[i] = rows[i].rid;
    fill_dummies(gx, cur->step, &lease, rows, gx->pre.rids, cur->n_real, 1);
    pgs->padded = true;
    pgs->leased = true;
    pgs->preplan = true;
    pgs->lease = lease;
    pgs->n_rows = lease.bs;
    pgs->n_pad_tokens = lease.bs - cur->n_real;
    return MS_OK;
}

void ms_graph_exec_preplan_run(ms_graph_exec *gx, const ms_graph_step *pgs, const ms_step *step) {
    if (gx == NULL || pgs == NULL || !pgs->preplan || gx->pre.pending)
        return;
    gx_preplan *pp = &gx->pre;
    pp->gs = *pgs;
    pp->step = step;
    memset(&pp->ctx, 0, sizeof pp->ctx);
    pp->ctx.request_ids = pp->rids;
    pp->ctx.n_rows = pgs->n_rows;
    pp->ctx.n_real = pgs->n_real;
    pp->ctx.lease = &pp->gs.lease;
    pp->ctx.is_preplan = true;
    ms_error e1 = {0};
    ms_status st = ms_graph_plan_preplan_begin(gx->plan, &pp->gs.lease, pp->rids, pgs->n_rows,
                                               ms_step_hash(step), &e1);
    bool admitted = false;
    if (st == MS_OK) {
        ms_admit_outcome o = ms_step_runner_admit(gx->cfg.runner, step, &pp->ctx);
        admitted = o.code == MS_ADMIT_OK;
        if (!admitted)
            st = MS_FAIL(&e1, MS_ERR_CAPACITY, "pre-plan admit: %s", ms_admit_code_str(o.code));
    }
    if (st == MS_OK)
        st = ms_step_runner_plan(gx->cfg.runner, step, &pp->ctx, &e1);
    const ms_kv_plan_set *set =
        st == MS_OK ? pp->ctx.plan_results[gx->cfg.kv_resource] : NULL;
    if (st == MS_OK && (set == NULL || set->n_plans != 1))
        st = MS_FAIL(&e1, MS_ERR_STATE, "graphs: a padded step needs one KV plan label");
    if (st == MS_OK)
        st = ms_graph_exec_check_padding(&set->plans[0], pgs->n_real, gx->cfg.n_pages, gx->mark,
                                         &e1);
    if (st == MS_OK) /* into the other slot's static states: step N's stay as staged */
        st = ms_graph_plan_stage_step(gx->plan, gx->cfg.runner, &pp->ctx, &e1);
    ms_graph_plan_preplan_finish(gx->plan, st == MS_OK);
    if (st == MS_OK) {
        pp->pending = true;
        gx->st.n_preplans++;
        return;
    }
    /* not an error: the step plans normally when it comes */
    ms_graph_plan_preplan_abandon(gx->plan);
    if (admitted)
        ms_step_runner_abandon(gx->cfg.runner, step, &pp->ctx);
    release_padding(gx, pp->gs.step, &pp->gs.lease, pp->gs.n_real);
    if (gx->st.n_preplan_failed++ == 0)
        snprintf(gx->st.first_preplan_failure, sizeof gx->st.first_preplan_failure, "%.150s",
                 e1.msg);
}

ms_status ms_graph_exec_preplan_take(ms_graph_exec *gx, ms_graph_step *gs, const ms_step *step,
                                     const ms_rid *rids, ms_step_ctx *ctx, const ms_step **admitted,
                                     ms_error *err) {
    if (gx == NULL || !gs->preplan)
        return MS_OK;
    gs->preplan = false;
    gx_preplan *pp = &gx->pre;
    if (!pp->pending)
        return MS_FAIL(err, MS_ERR_STATE, "graphs: no pre-plan to take");
    ms_error quiet;
    ms_status t = ms_graph_plan_preplan_take(gx->plan, &gs->lease, rids, gs->n_rows,
                                             ms_step_hash(step), &quiet);
    if (t == MS_ERR_STATE) { /* the same rows, another declaration: planned normally */
        preplan_abandon(gx);
        gx->st.n_preplan_refused++;
        return MS_OK;
    }
    if (t != MS_OK) {
        preplan_abandon(gx);
        return MS_FAIL(err, MS_ERR_STATE, "graphs: the pre-plan vanished: %s", quiet.msg);
    }
    pp->pending = false;
    gs->preplanned = true;
    *ctx = pp->ctx;
    ctx->lease = &gs->lease;
    ctx->is_preplan = false;
    *admitted = pp->step;
    gx->st.n_preplan_taken++;
    return MS_OK;
}

/* ---- the padding check ---- */

static void mark_set(uint8_t *m, int32_t p) { m[p >> 3] |= (uint8_t)(1u << (p & 7)); }
static bool mark_get(const uint8_t *m, int32_t p) { return (m[p >> 3] >> (p & 7)) & 1u; }

ms_status ms_graph_exec_check_padding(const ms_kv_plan *plan, int32_t n_real, int32_t n_pages,
                                      uint8_t *mark, ms_error *err) {
    if (n_real < 0 || n_real > plan->n_views)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "graphs: %d real views of %d", (int)n_real,
                       (int)plan->n_views);
    const int32_t real_pages = plan->kv_indptr[n_real];
    const int32_t real_tokens = plan->qo_indptr[n_real];
    ms_status st = MS_OK;
    for (int32_t i = 0; i < real_pages && st == MS_OK; i++) {
        int32_t p = plan->kv_indices[i];
        if (p < 0 || p >= n_pages)
            st = MS_FAIL(err, MS_ERR_STATE, "graphs: real view page %d outside the %d pages",
                         (int)p, (int)n_pages);
        else
            mark_set(mark, p);
    }
    for (int32_t t = 0; t < real_tokens && st == MS_OK && plan->token_to_page != NULL; t++) {
        int32_t p = plan->token_to_page[t];
        if (p >= 0 && p < n_pages)
            mark_set(mark, p);
    }
    for (int32_t t = real_tokens; st == MS_OK && plan->token_to_page != NULL &&
                                  t < plan->n_tokens; t++) {
        int32_t p = plan->token_to_page[t];
        if (p != MS_SINK_PAGE && p >= 0 && p < n_pages && mark_get(mark, p))
            st = MS_FAIL(err, MS_ERR_STATE,
                         "graphs: padding token %d writes page %d, which a real row holds",
                         (int)t, (int)p);
    }
    /* padding views must not read real pages either (their attention output is discarded, but
       a page shared with a real row would mean the pool handed it out twice) */
    for (int32_t i = real_pages; st == MS_OK && i < plan->kv_indptr[plan->n_views]; i++) {
        int32_t p = plan->kv_indices[i];
        if (p != MS_SINK_PAGE && p >= 0 && p < n_pages && mark_get(mark, p))
            st = MS_FAIL(err, MS_ERR_STATE,
                         "graphs: padding view page %d is a page a real row holds", (int)p);
    }
    memset(mark, 0, ((size_t)n_pages + 7) / 8);
    return st;
}

/* ---- forward: eager, capture or replay ---- */

static uint64_t fnv(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= UINT64_C(0x100000001b3);
    }
    return h;
}

static uint64_t fnv_tensor(uint64_t h, const ms_tensor *t) {
    if (t == NULL)
        return fnv(h, "-", 1);
    h = fnv(h, &t->data, sizeof t->data);
    h = fnv(h, &t->dtype, sizeof t->dtype);
    h = fnv(h, &t->ndim, sizeof t->ndim);
    h = fnv(h, t->shape, sizeof t->shape);
    return fnv(h, t->stride, sizeof t->stride);
}

/* Every pointer and shape a recorded forward baked in, and the batch's host scalars. */
static uint64_t args_fingerprint(const ms_md_forward_args *a) {
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    h = fnv(h, &a->be, sizeof a->be);
    h = fnv(h, &a->config, sizeof a->config);
    h = fnv(h, &a->weights, sizeof a->weights);
    h = fnv(h, &a->kv->data, sizeof a->kv->data);
    h = fnv(h, &a->batch, sizeof a->batch);
    h = fnv(h, &a->batch->n_seqs, sizeof a->batch->n_seqs);
    h = fnv(h, &a->batch->n_tokens, sizeof a->batch->n_tokens);
    h = fnv(h, &a->batch->is_decode, sizeof a->batch->is_decode);
    h = fnv_tensor(h, a->tokens);
    h = fnv_tensor(h, a->positions);
    h = fnv(h, &a->rope->inv_freq, sizeof a->rope->inv_freq);
    h = fnv(h, &a->attn.scale, sizeof a->attn.scale);
    h = fnv(h, &a->attn.window, sizeof a->attn.window);
    h = fnv(h, &a->attn.causal, sizeof a->attn.causal);
    h = fnv(h, &a->workspace, sizeof a->workspace);
    h = fnv(h, &a->max_tokens, sizeof a->max_tokens);
    h = fnv(h, &a->max_seqs, sizeof a->max_seqs);
    h = fnv_tensor(h, a->out_rows);
    return fnv_tensor(h, a->logits);
}

ms_status ms_graph_exec_forward(ms_graph_exec *gx, const ms_graph_step *gs,
                                const ms_step_ctx *ctx, ms_md_forward_fn forward,
                                const ms_md_forward_args *args, ms_error *err) {
    if (gx == NULL || !gs->padded)
        return forward(args, err);
    if (!gs->preplanned) { /* a taken pre-plan was checked and staged when it was made */
        const ms_kv_plan_set *set = ctx->plan_results[gx->cfg.kv_resource];
        if (set == NULL || set->n_plans != 1)
            return MS_FAIL(err, MS_ERR_STATE, "graphs: a padded step needs one KV plan label");
        MS_TRY(ms_graph_exec_check_padding(&set->plans[0], gs->n_real, gx->cfg.n_pages,
                                           gx->mark, err));
        if (!gs->leased)
            return forward(args, err); /* warm-up */
        MS_TRY(ms_graph_plan_stage_step(gx->plan, gx->cfg.runner, ctx, err));
    }
    const int gi = gs->lease.bucket * GX_MAX_SLOTS + gs->lease.slot;
    const ms_backend *be = gx->cfg.be;
    if (gs->capture) {
        gx->fingerprint[gi] = args_fingerprint(args);
        if (!gx->record) /* PADDED: a capture records and runs nothing, as in AUTO, so both
                            leave the dummy rows' pages as the warm-ups wrote them (the GPU
                            tests compare the whole arena) */
            return MS_OK;
        MS_TRY(be->iface.graph_capture_begin(be->ctx, err));
        ms_status st = forward(args, err);
        void *graph = NULL;
        ms_error e2;
        ms_status st2 = be->iface.graph_capture_end(be->ctx, &graph, st == MS_OK ? err : &e2);
        if (st == MS_OK && st2 != MS_OK)
            st = st2;
        if (st != MS_OK) {
            if (graph != NULL)
                be->iface.graph_free(be->ctx, graph);
            return st;
        }
        gx->graphs[gi] = graph;
        return MS_OK;
    }
    if (args_fingerprint(args) != gx->fingerprint[gi])
        return MS_FAIL(err, MS_ERR_STATE,
                       "graphs: replay of bucket %d slot %d with forward buffers or shapes "
                       "other than its capture's", (int)gs->lease.bs, (int)gs->lease.slot);
    if (!gx->record)
        return forward(args, err);
    void *graph = ms_graph_plan_graph(gx->plan, &gs->lease);
    if (graph == NULL)
        return MS_FAIL(err, MS_ERR_STATE, "graphs: bucket %d slot %d has no graph",
                       (int)gs->lease.bs, (int)gs->lease.slot);
    return be->iface.graph_launch(be->ctx, graph, err);
}

void ms_graph_exec_done(ms_graph_exec *gx, const ms_graph_step *gs) {
    if (gx == NULL || !gs->padded)
        return;
    if (gs->leased)
        release_padding(gx, gs->step, &gs->lease, gs->n_real);
    else /* warm-up: every row is a dummy of slot 0 */
        for (int32_t i = 0; i < gs->n_rows; i++)
            ms_step_runner_reset(gx->cfg.runner, ms_graph_plan_dummy_rid(gx->plan, 0, i), false);
}

/* ---- start-up ---- */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

ms_status ms_graph_exec_capture(ms_graph_exec *gx, ms_graph_exec_run_fn run, void *user,
                                ms_md_row *rows, ms_rid *rids, int32_t cap, ms_error *err) {
    if (gx == NULL)
        return MS_OK;
    if (cap < gx->max_bs)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "graphs: room for %d rows, largest bucket %d",
                       (int)cap, (int)gx->max_bs);
    const double t0 = now_s();
    const ms_md_node *node = gx->cfg.node;
    /* pass 0: eager warm-up of every bucket; pass 1: capture. Largest first in both. */
    for (int pass = 0; pass < 2; pass++) {
        for (int32_t k = 0; k < node->n_steps && k < MS_MD_MAX_STEPS; k++) {
            if (!gx->step_on[k])
                continue;
            const int32_t *b = gx->bk_bs[k], *bt = gx->bk_tok[k];
            const bool tok = gx->by_tokens[k];
            for (int32_t i = gx->n_bk[k] - 1; i >= 0; i--) {
                char what[48]; /* the bucket, for the failure messages */
                if (tok)
                    snprintf(what, sizeof what, "%d tokens x %d rows", (int)bt[i], (int)b[i]);
                else
                    snprintf(what, sizeof what, "%d", (int)b[i]);
                const int32_t bucket = gx->bk_index[k][i];
                for (int32_t slot = 0; slot < gx->n_slots; slot++) {
                    ms_graph_step gs;
                    memset(&gs, 0, sizeof gs);
                    gs.step = k;
                    gs.padded = true;
                    gs.n_real = 0;
                    gs.n_rows = b[i];
                    gs.n_pad_tokens = bt[i];
                    MS_TRY(ms_graph_plan_capture_lease(gx->plan, bucket, slot, &gs.lease, err));
                    fill_dummies(gx, k, &gs.lease, rows, rids, 0, tok ? bt[i] - (b[i] - 1) : 1);
                    if (pass == 0) {
                        if (slot > 0)
                            break; /* one warm-up per bucket */
                        gs.lease.slot = 0;
                        ms_error e0;
                        if (run(user, &gs, rows, rids, &e0) != MS_OK) {
                            /* nothing is captured: every step stays eager (the stats and the
                               CLI's start-up line say why) */
                            snprintf(gx->st.first_failure, sizeof gx->st.first_failure,
                                     "warm-up of %.16s bucket %.40s: %.80s", node->steps[k].name,
                                     what, e0.msg);
                            gx->st.n_failed = gx->st.n_buckets * gx->n_slots;
                            gx->st.capture_s = now_s() - t0;
                            return MS_OK;
                        }
                        continue;
                    }
                    gs.leased = true;
                    gs.capture = true;
                    ms_error e1;
                    ms_status st = run(user, &gs, rows, rids, &e1);
                    const int gi = bucket * GX_MAX_SLOTS + slot;
                    MS_TRY(ms_graph_plan_set_captured(gx->plan, bucket, slot, st == MS_OK,
                                                      gx->graphs[gi], err));
                    if (st == MS_OK) {
                        gx->st.n_captured++;
                    } else {
                        if (gx->graphs[gi] != NULL)
                            gx->cfg.be->iface.graph_free(gx->cfg.be->ctx, gx->graphs[gi]);
                        gx->graphs[gi] = NULL;
                        if (gx->st.n_failed++ == 0)
                            snprintf(gx->st.first_failure, sizeof gx->st.first_failure,
                                     "%.16s bucket %.40s: %.80s", node->steps[k].name, what,
                                     e1.msg);
                    }
                }
            }
        }
        if (pass == 0 && gx->record) /* the warm-ups' results are in before any capture */
            MS_TRY(gx->cfg.be->iface.synchronize(gx->cfg.be->ctx, err));
    }
    gx->st.capture_s = now_s() - t0;
    return MS_OK;
}

void ms_graph_exec_get_stats(const ms_graph_exec *gx, ms_graph_exec_stats *st) {
    if (gx == NULL) {
        memset(st, 0, sizeof *st);
        st->mode = MS_GRAPHS_OFF;
        return;
    }
    *st = gx->st;
}

const ms_graph_plan *ms_graph_exec_plan(const ms_graph_exec *gx) {
    return gx != NULL ? gx->plan : NULL;
}
