/*
 * walk.c - walk positions and the step choice (walk.h).
 *
 * Constraints: no allocation; deterministic (ties broken by step index), so a run's batches and
 * therefore its outputs do not depend on timing.
 */
#include "walk.h"

ms_md_walk_item ms_walk_item(const ms_model_desc *d, ms_walk_pos p) {
    ms_md_walk_item none = {-1, -1};
    if (p.walk < 0 || p.walk >= d->n_walks)
        return none;
    const ms_md_walk *w = &d->walks[p.walk];
    return p.at >= 0 && p.at < w->n_items ? w->items[p.at] : none;
}

int32_t ms_walk_step(const ms_model_desc *d, ms_walk_pos p) {
    return ms_walk_item(d, p).step;
}

bool ms_walk_in_loop(const ms_model_desc *d, ms_walk_pos p) {
    const ms_md_walk *w = &d->walks[p.walk];
    return p.at >= w->loop_begin && p.at < w->n_items;
}

void ms_walk_advance(const ms_model_desc *d, ms_walk_pos *p) {
    const ms_md_walk *w = &d->walks[p->walk];
    p->at++;
    if (p->at == w->n_items && w->loop_begin < w->n_items)
        p->at = w->loop_begin;
}

/* The step declaration of walk item `it`. */
static const ms_md_step *item_step(const ms_model_desc *d, ms_md_walk_item it) {
    return &d->nodes[it.node].steps[it.step];
}

int32_t ms_walk_find(const ms_model_desc *d, const bool *has_prompt) {
    for (int32_t w = 0; w < d->n_walks; w++) {
        ms_md_walk_item first = d->walks[w].items[0];
        const ms_md_step *s = item_step(d, first);
        bool covers[MS_MAX_LABELS] = {false};
        for (int32_t i = 0; i < s->n_segments; i++)
            covers[s->labels[i]] = true;
        bool same = true;
        for (int32_t l = 0; l < d->nodes[first.node].n_labels; l++)
            same = same && covers[l] == has_prompt[l];
        if (same)
            return w;
    }
    return -1;
}

/* [scratch] Whether node n keeps its KV on a scratch (rows per step, no stream of a request). */
static bool node_on_scratch(const ms_md_node *n) {
    for (int32_t r = 0; r < n->n_resources; r++)
        if (n->resources[r].kind == MS_RESOURCE_SCRATCH)
            return true;
    return false;
}

int32_t ms_walk_n_streams(const ms_model_desc *d, int32_t w) {
    bool seen[MS_MD_MAX_NODES][MS_MAX_LABELS] = {{false}};
    int32_t n = 0;
    const ms_md_walk *wk = &d->walks[w];
    for (int32_t i = 0; i < wk->n_items; i++) {
        ms_md_walk_item it = wk->items[i];
        if (node_on_scratch(&d->nodes[it.node]))
            continue;
        const ms_md_step *s = item_step(d, it);
        for (int32_t k = 0; k < s->n_segments; k++)
            if (!seen[it.node][s->labels[k]]) {
                seen[it.node][s->labels[k]] = true;
                n++;
            }
    }
    return n;
}

int32_t ms_walk_pick(ms_sched *s, const int32_t *waiting, const bool *in_loop, int32_t n_steps) {
    int32_t loop = -1, prefix = -1;
    for (int32_t k = 0; k < n_steps; k++) {
        if (waiting[k] <= 0)
            continue;
        if (in_loop[k]) {
            if (loop < 0 || waiting[k] > waiting[loop])
                loop = k;
        } else if (prefix < 0) {
            prefix = k;
        }
    }
    int32_t pick = loop;
    if (pick < 0 || (prefix >= 0 && s->last_was_loop))
        pick = prefix;
    if (pick >= 0)
        s->last_was_loop = in_loop[pick];
    return pick;
}
