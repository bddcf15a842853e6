/*
 * step_runner.c - builds a node's resources from specs, orders them by dependency once, and runs
 * the step sweeps (see step_runner.h for the contract).
 *
 * Constraints kept here: the order is computed at init and never changes; admit is
 * all-or-nothing across resources (rollback of earlier ones in reverse order); plan results are
 * passed only through ctx->plan_results, which is cleared before every plan sweep.
 */
#include "step_runner.h"

#include <stdio.h>
#include <string.h>

/* One resource of the node. */
typedef struct runner_res {
    char key[MS_RESOURCE_KEY_MAX + 1];
    ms_resource_kind kind;
    void *self;
    const ms_resource_i *iface;
    bool owned;                 /* built by the runner (freed by it) */
} runner_res;

struct ms_step_runner {
    int n;                                  /* resources */
    runner_res res[MS_MAX_RESOURCES];       /* [n] in spec order (index = key in records) */
    int order[MS_MAX_RESOURCES];            /* [n] dependency order */
};

/* ---- dependency order ---- */

int ms_resource_env_dep(const ms_resource_env *env, const char *key, ms_resource_kind kind,
                        ms_error *err) {
    const ms_resource_spec *self = &env->specs[env->self];
    if (key == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "resource '%s': no dependency key configured",
                       self->key);
    bool declared = false;
    for (int32_t d = 0; d < self->n_deps; d++)
        if (strcmp(self->deps[d], key) == 0)
            declared = true;
    if (!declared)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "resource '%s': reads '%s' but does not list it in its deps", self->key,
                       key);
    for (int i = 0; i < env->n_specs; i++) {
        if (strcmp(env->specs[i].key, key) != 0)
            continue;
        if (env->specs[i].kind != kind)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "resource '%s': dependency '%s' is a %s resource, expected %s",
                           self->key, key, ms_resource_kind_str(env->specs[i].kind),
                           ms_resource_kind_str(kind));
        return i;
    }
    return MS_FAIL(err, MS_ERR_INVALID_ARG, "resource '%s': unknown dependency '%s'", self->key,
                   key);
}

static int find_spec(const ms_resource_spec *specs, int n, const char *key) {
    for (int i = 0; i < n; i++)
        if (strcmp(specs[i].key, key) == 0)
            return i;
    return -1;
}

/* Kahn's algorithm; among ready resources the smallest key goes first. */
static ms_status compute_order(const ms_resource_spec *specs, int n, int *order, ms_error *err) {
    bool dep[MS_MAX_RESOURCES][MS_MAX_RESOURCES] = {{false}}; /* dep[i][j]: i depends on j */
    for (int i = 0; i < n; i++) {
        if (specs[i].n_deps < 0 || (specs[i].n_deps > 0 && specs[i].deps == NULL))
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "resource '%s': bad dependency list",
                           specs[i].key);
        for (int32_t d = 0; d < specs[i].n_deps; d++) {
            const char *k = specs[i].deps[d];
            if (k == NULL)
                return MS_FAIL(err, MS_ERR_INVALID_ARG, "resource '%s': NULL dependency key",
                               specs[i].key);
            int j = find_spec(specs, n, k);
            if (j < 0)
                return MS_FAIL(err, MS_ERR_INVALID_ARG,
                               "resource '%s' depends on unknown resource '%s'", specs[i].key, k);
            if (j == i)
                return MS_FAIL(err, MS_ERR_INVALID_ARG, "resource '%s' depends on itself",
                               specs[i].key);
            dep[i][j] = true;
        }
    }
    bool done[MS_MAX_RESOURCES] = {false};
    for (int k = 0; k < n; k++) {
        int pick = -1;
        for (int i = 0; i < n; i++) {
            if (done[i])
                continue;
            bool ready = true;
            for (int j = 0; j < n; j++)
                if (dep[i][j] && !done[j])
                    ready = false;
            if (ready && (pick < 0 || strcmp(specs[i].key, specs[pick].key) < 0))
                pick = i;
        }
        if (pick < 0) {
            char names[256] = "";
            size_t len = 0;
            for (int i = 0; i < n && len + 2 < sizeof names; i++) {
                if (done[i])
                    continue;
                int w = snprintf(names + len, sizeof names - len, "%s'%s'", len ? ", " : "",
                                 specs[i].key);
                if (w < 0)
                    break;
                len += (size_t)w;
                if (len >= sizeof names)
                    len = sizeof names - 1;
            }
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "dependency cycle among resources %s", names);
        }
        done[pick] = true;
        order[k] = pick;
    }
    return MS_OK;
}

/* ---- init / free ---- */

ms_status ms_step_runner_init(ms_step_runner **out, const ms_resource_spec *specs, int n,
                              ms_error *err) {
    *out = NULL;
    if (specs == NULL || n < 1 || n > MS_MAX_RESOURCES)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "step runner: %d resources (expected 1..%d)", n,
                       MS_MAX_RESOURCES);
    for (int i = 0; i < n; i++) {
        const char *k = specs[i].key;
        if (k == NULL || k[0] == '\0' || strlen(k) > MS_RESOURCE_KEY_MAX)
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "step runner: resource %d has an empty or too long key (max %d)", i,
                           MS_RESOURCE_KEY_MAX);
        if (find_spec(specs, i, k) >= 0)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "step runner: duplicate resource key '%s'", k);
        if ((int)specs[i].kind < 0 || specs[i].kind >= MS_RESOURCE_KIND_COUNT)
            return MS_FAIL(err, MS_ERR_INVALID_ARG, "resource '%s': unknown kind %d", k,
                           (int)specs[i].kind);
        if (specs[i].build == NULL && (specs[i].instance == NULL || specs[i].iface == NULL))
            return MS_FAIL(err, MS_ERR_INVALID_ARG,
                           "resource '%s': neither a builder nor an instance given", k);
    }
    ms_step_runner *r = ms_calloc(1, sizeof *r);
    if (r == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "step runner: out of memory");
    ms_status st = compute_order(specs, n, r->order, err);
    if (st != MS_OK)
        goto fail;
    for (int k = 0; k < n; k++) {
        int i = r->order[k]; /* build in dependency order */
        runner_res *rr = &r->res[i];
        const ms_resource_spec *sp = &specs[i];
        snprintf(rr->key, sizeof rr->key, "%s", sp->key);
        if (sp->build != NULL) {
            ms_resource_env env = {specs, n, i};
            st = sp->build(sp->config, &env, &rr->self, &rr->iface, err);
            if (st != MS_OK) {
                ms_error_prefix(err, "building resource '%s': ", sp->key);
                goto fail;
            }
            rr->owned = true;
        } else {
            rr->self = sp->instance;
            rr->iface = sp->iface;
        }
        rr->kind = sp->kind;
        if (rr->iface->kind != sp->kind) {
            st = MS_FAIL(err, MS_ERR_INVALID_ARG, "resource '%s': declared %s but built %s",
                         sp->key, ms_resource_kind_str(sp->kind),
                         ms_resource_kind_str(rr->iface->kind));
            goto fail;
        }
    }
    r->n = n;
    *out = r;
    return MS_OK;
fail:
    for (int i = 0; i < n; i++)
        if (r->res[i].owned && r->res[i].iface->free != NULL)
            r->res[i].iface->free(r->res[i].self);
    ms_free(r);
    return st;
}

void ms_step_runner_free(ms_step_runner *r) {
    if (r == NULL)
        return;
    for (int k = r->n - 1; k >= 0; k--) {
        runner_res *rr = &r->res[r->order[k]];
        if (rr->owned && rr->iface->free != NULL)
            rr->iface->free(rr->self);
    }
    ms_free(r);
}

int ms_step_runner_count(const ms_step_runner *r) { return r->n; }

int ms_step_runner_index(const ms_step_runner *r, const char *key) {
    for (int i = 0; i < r->n; i++)
        if (strcmp(r->res[i].key, key) == 0)
            return i;
    return -1;
}

const char *ms_step_runner_key(const ms_step_runner *r, int i) {
    MS_ASSERT(i >= 0 && i < r->n);
    return r->res[i].key;
}

ms_resource_kind ms_step_runner_kind(const ms_step_runner *r, int i) {
    MS_ASSERT(i >= 0 && i < r->n);
    return r->res[i].kind;
}

void *ms_step_runner_resource(const ms_step_runner *r, int i) {
    MS_ASSERT(i >= 0 && i < r->n);
    return r->res[i].self;
}

const int *ms_step_runner_order(const ms_step_runner *r) { return r->order; }

/* ---- request sweeps ---- */

ms_status ms_step_runner_ingest(ms_step_runner *r, ms_rid rid, const void *const *overrides,
                                ms_error *err) {
    for (int k = 0; k < r->n; k++) {
        int i = r->order[k];
        runner_res *rr = &r->res[i];
        if (rr->iface->ingest == NULL)
            continue;
        ms_status st = rr->iface->ingest(rr->self, rid, overrides ? overrides[i] : NULL, err);
        if (st != MS_OK) {
            ms_error_prefix(err, "ingest request %llu: %s: ", (unsigned long long)rid, rr->key);
            return st;
        }
    }
    return MS_OK;
}

void ms_step_runner_remove(ms_step_runner *r, ms_rid rid) {
    for (int k = r->n - 1; k >= 0; k--) {
        runner_res *rr = &r->res[r->order[k]];
        if (rr->iface->remove != NULL)
            rr->iface->remove(rr->self, rid);
    }
}

void ms_step_runner_reset(ms_step_runner *r, ms_rid rid, bool free_pages) {
    for (int k = r->n - 1; k >= 0; k--) {
        runner_res *rr = &r->res[r->order[k]];
        if (rr->iface->reset != NULL)
            rr->iface->reset(rr->self, rid, free_pages);
    }
}

/* ---- step sweeps ---- */

/* Index of the first record the node lacks, or -1. */
static int unknown_record(const ms_step_runner *r, const ms_step *step) {
    for (int i = r->n; i < MS_MAX_RESOURCES; i++)
        if (step->records[i].rec != NULL)
            return i;
    return -1;
}

static bool segments_valid(const ms_segment *segs, int32_t n) {
    if (n < 0 || (n > 0 && segs == NULL))
        return false;
    for (int32_t s = 0; s < n; s++)
        if (segs[s].span < 0 || segs[s].label < 0 || segs[s].label >= MS_MAX_LABELS)
            return false;
    return true;
}

static ms_admit_outcome invalid_outcome(int resource) {
    ms_admit_outcome o = ms_admit_ok();
    o.code = MS_ADMIT_INVALID;
    o.resource = resource;
    return o;
}

ms_admit_outcome ms_step_runner_admit(ms_step_runner *r, const ms_step *step, ms_step_ctx *ctx) {
    int bad = unknown_record(r, step);
    if (bad >= 0)
        return invalid_outcome(bad);
    if (!segments_valid(step->segments, step->n_segments))
        return invalid_outcome(-1);
    for (int i = 0; i < r->n; i++)
        if (step->records[i].rec != NULL && step->records[i].segments != NULL &&
            !segments_valid(step->records[i].segments, step->records[i].n_segments))
            return invalid_outcome(i);
    int admitted[MS_MAX_RESOURCES];
    int n_admitted = 0;
    bool pending = false;
    for (int k = 0; k < r->n; k++) {
        int i = r->order[k];
        runner_res *rr = &r->res[i];
        if (step->records[i].rec == NULL)
            continue;
        ms_admit_outcome o = ms_admit_ok();
        if (rr->iface->admit != NULL)
            o = rr->iface->admit(rr->self, i, step, ctx);
        if (ms_admit_failed(o)) {
            for (int a = n_admitted - 1; a >= 0; a--) {
                runner_res *ra = &r->res[admitted[a]];
                if (ra->iface->admit_rollback != NULL)
                    ra->iface->admit_rollback(ra->self, admitted[a], step, ctx);
            }
            o.resource = i;
            return o;
        }
        pending = pending || o.code == MS_ADMIT_PENDING;
        admitted[n_admitted++] = i;
    }
    ms_admit_outcome ok = ms_admit_ok();
    if (pending)
        ok.code = MS_ADMIT_PENDING;
    return ok;
}

void ms_step_runner_abandon(ms_step_runner *r, const ms_step *step, ms_step_ctx *ctx) {
    for (int k = r->n - 1; k >= 0; k--) {
        int i = r->order[k];
        runner_res *rr = &r->res[i];
        if (step->records[i].rec != NULL &&
            rr->iface->admit_rollback != NULL)
            rr->iface->admit_rollback(rr->self, i, step, ctx);
    }
}

ms_status ms_step_runner_plan(ms_step_runner *r, const ms_step *step, ms_step_ctx *ctx,
                              ms_error *err) {
    for (int i = 0; i < MS_MAX_RESOURCES; i++)
        ctx->plan_results[i] = NULL;
    int bad = unknown_record(r, step);
    if (bad >= 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "step %s: declares resource index %d but the node has %d resources",
                       step->name ? step->name : "?", bad, r->n);
    for (int k = 0; k < r->n; k++) {
        int i = r->order[k];
        runner_res *rr = &r->res[i];
        if (step->records[i].rec == NULL || rr->iface->plan == NULL)
            continue;
        const void *out = NULL;
        ms_status st = rr->iface->plan(rr->self, i, step, ctx, &out, err);
        if (st != MS_OK) {
            ms_error_prefix(err, "step %s: %s: ", step->name ? step->name : "?", rr->key);
            /* all or nothing: the step will not run, release what it holds */
            ms_step_runner_abandon(r, step, ctx);
            for (int j = 0; j < MS_MAX_RESOURCES; j++)
                ctx->plan_results[j] = NULL;
            return st;
        }
        ctx->plan_results[i] = out;
    }
    return MS_OK;
}

ms_status ms_step_runner_commit(ms_step_runner *r, const ms_step *step, ms_step_ctx *ctx,
                                ms_error *err) {
    int bad = unknown_record(r, step);
    if (bad >= 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "step %s: declares resource index %d but the node has %d resources",
                       step->name ? step->name : "?", bad, r->n);
    for (int k = 0; k < r->n; k++) {
        int i = r->order[k];
        runner_res *rr = &r->res[i];
        if (step->records[i].rec == NULL || rr->iface->commit == NULL)
            continue;
        ms_status st = rr->iface->commit(rr->self, i, step, ctx, err);
        if (st != MS_OK) {
            ms_error_prefix(err, "step %s: %s: ", step->name ? step->name : "?", rr->key);
            return st;
        }
    }
    return MS_OK;
}

/* ---- publish / retrieve ---- */

void ms_published_free(ms_published *pub) {
    if (pub == NULL)
        return;
    for (int32_t k = 0; k < pub->n; k++) {
        ms_published_item *it = &pub->items[k];
        if (it->data != NULL && it->iface->published_free != NULL)
            it->iface->published_free(it->owner, it->data);
        it->data = NULL;
    }
    pub->n = 0;
}

ms_status ms_step_runner_publish(ms_step_runner *r, ms_rid rid, ms_published *out, ms_error *err) {
    memset(out, 0, sizeof *out);
    for (int k = 0; k < r->n; k++) {
        runner_res *rr = &r->res[r->order[k]];
        if (rr->iface->publish == NULL)
            continue;
        void *data = NULL;
        ms_status st = rr->iface->publish(rr->self, rid, &data, err);
        if (st != MS_OK) {
            ms_error_prefix(err, "publish request %llu: %s: ", (unsigned long long)rid, rr->key);
            ms_published_free(out);
            return st;
        }
        if (data == NULL)
            continue;
        ms_published_item *it = &out->items[out->n++];
        memcpy(it->key, rr->key, sizeof it->key);
        it->kind = rr->kind;
        it->data = data;
        it->owner = rr->self;
        it->iface = rr->iface;
    }
    return MS_OK;
}

ms_admit_outcome ms_step_runner_admit_retrieve(ms_step_runner *r, ms_rid rid,
                                               const ms_published *pub) {
    bool pending = false;
    for (int k = 0; k < r->n; k++) {
        int i = r->order[k];
        runner_res *rr = &r->res[i];
        if (rr->iface->admit_retrieve == NULL)
            continue;
        const ms_published_item *it = NULL;
        for (int32_t p = 0; p < pub->n; p++)
            if (pub->items[p].kind == rr->kind && strcmp(pub->items[p].key, rr->key) == 0)
                it = &pub->items[p];
        if (it == NULL)
            continue;
        ms_admit_outcome o = rr->iface->admit_retrieve(rr->self, rid, it->data);
        if (ms_admit_failed(o)) {
            o.resource = i;
            return o;
        }
        pending = pending || o.code == MS_ADMIT_PENDING;
    }
    ms_admit_outcome ok = ms_admit_ok();
    if (pending)
        ok.code = MS_ADMIT_PENDING;
    return ok;
}
