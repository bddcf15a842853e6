/*
 * test_engine_nodes.c - a model of several nodes through the engine: the descriptor mstarc
 * generates from tests/codegen/two_nodes.mstar (nodes `reader` and `writer` over the llama_gqa
 * checkpoint, each with its own KV pool, positions, attention and sampler; walk
 * reader.prefill then writer.prefill then loop writer.decode), on the CPU in float32 against
 * ../shared/fixtures/hf/llama_gqa:
 *   - one request: the reader's prefill samples the reference's first greedy id from logits
 *     within 1e-3 of prefill_logits' last row; the writer's prefill (its own, empty stream)
 *     gives the same; each decode step's logits are decode_logits[j] and its id greedy_ids[j + 1];
 *     while it runs both nodes hold the prompt's KV pages, and remove returns every page;
 *   - the four prompts in one run (rows of different nodes in different engine steps): each
 *     request's ids equal the reference;
 *   - a walk item's node is its own: a request finishing at the reader (max_new_tokens 1)
 *     leaves nothing in the writer.
 */
#include "ms_test.h"
#include "ms_test_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine.h"
#include "fixture_ref.h"
#include "safetensors.h"

extern const ms_model_desc ms_two_nodes_desc;

#define TOL 1e-3f
#define N_DECODE 12 /* decode steps checked per prompt (of the reference's 40) */

static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m))
            m = d;
    }
    return m;
}

static ms_engine *open_engine(int32_t max_seqs) {
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture("hf/llama_gqa");
    o.max_seqs = max_seqs;
    o.max_tokens = 256;
    o.max_seq_len = 128;
    o.n_threads = 2;
    ms_engine *e = NULL;
    ms_error err = {0};
    if (ms_engine_init(&e, &ms_two_nodes_desc, &o, &err) != MS_OK)
        fail_msg("engine: %s", err.msg);
    return e;
}

static void test_nodes_descriptor(void **state) {
    (void)state;
    const ms_model_desc *d = &ms_two_nodes_desc;
    assert_int_equal(d->n_nodes, 2);
    assert_string_equal(d->nodes[0].name, "reader");
    assert_string_equal(d->nodes[1].name, "writer");
    assert_int_equal(d->nodes[0].n_steps, 1);
    assert_int_equal(d->nodes[1].n_steps, 2);
    /* the walk crosses the nodes: (reader, prefill), (writer, prefill), loop (writer, decode) */
    assert_int_equal(d->n_walks, 1);
    assert_int_equal(d->walks[0].n_items, 3);
    assert_int_equal(d->walks[0].loop_begin, 2);
    assert_int_equal(d->walks[0].items[0].node, 0);
    assert_int_equal(d->walks[0].items[1].node, 1);
    assert_int_equal(d->walks[0].items[1].step, 0);
    assert_int_equal(d->walks[0].items[2].node, 1);
    assert_int_equal(d->walks[0].items[2].step, 1);
    /* each node's own forward */
    assert_true(d->nodes[0].forward != d->nodes[1].forward);
    ms_error err = {0};
    assert_int_equal(ms_md_check_desc(d, &err), MS_OK);
}

static void test_nodes_reference(void **state) {
    (void)state;
    ms_st_file *f = ms_test_ref_open("hf/llama_gqa");
    size_t np, npre, ndec, ng;
    int32_t *prompt = ms_test_ref_tensor(f, "p0.input_ids", true, &np);
    float *pre = ms_test_ref_tensor(f, "p0.prefill_logits", false, &npre);
    float *dec = ms_test_ref_tensor(f, "p0.decode_logits", false, &ndec);
    int32_t *greedy = ms_test_ref_tensor(f, "p0.greedy_ids", true, &ng);

    ms_engine *e = open_engine(2);
    const size_t V = (size_t)ms_engine_facts(e)->vocab;
    assert_int_equal(npre, np * V);
    const int32_t free0 = ms_engine_kv_pages_free(e);
    const int32_t ps = ms_engine_page_size(e);
    ms_engine_request rq = {.prompt = prompt, .n_prompt = (int32_t)np,
                            .max_new_tokens = 2 + N_DECODE, .sampling = ms_sampling_greedy(),
                                .ignore_eos = true}; /* the reference treats eos as any id */
    ms_rid rid;
    ms_error err = {0};
    assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_OK);
    const int32_t *ids;
    int32_t n;
    ms_finish_reason why;
    /* reader.prefill */
    ms_engine_step_info info;
    assert_int_equal(ms_engine_step(e, &info, &err), MS_OK);
    assert_int_equal(info.n_tokens, (int)np);
    double d = max_diff(ms_engine_last_logits(e, rid), pre + (np - 1) * V, V);
    if (d > TOL)
        fail_msg("reader prefill: max |logit diff| %g", d);
    assert_int_equal(ms_engine_output(e, rid, &ids, &n, NULL), MS_OK);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], greedy[0]);
    const int32_t pages = (int32_t)((np + (size_t)ps - 1) / (size_t)ps);
    assert_int_equal(ms_engine_kv_pages_free(e), free0 - pages);
    /* writer.prefill: the prompt again, into the writer's own pool */
    assert_int_equal(ms_engine_step(e, &info, &err), MS_OK);
    assert_int_equal(info.n_tokens, (int)np);
    d = max_diff(ms_engine_last_logits(e, rid), pre + (np - 1) * V, V);
    if (d > TOL)
        fail_msg("writer prefill: max |logit diff| %g", d);
    assert_int_equal(ms_engine_kv_pages_free(e), free0 - 2 * pages);
    assert_int_equal(ms_engine_stream_length(e, rid, 0), (int)np);
    /* writer.decode: the writer's stream goes on from the prompt */
    for (int j = 0; j < N_DECODE; j++) {
        assert_int_equal(ms_engine_step(e, &info, &err), MS_OK);
        assert_int_equal(info.n_tokens, 1);
        d = max_diff(ms_engine_last_logits(e, rid), dec + (size_t)j * V, V);
        if (d > TOL)
            fail_msg("decode step %d: max |logit diff| %g", j + 1, d);
    }
    assert_int_equal(ms_engine_output(e, rid, &ids, &n, &why), MS_OK);
    assert_int_equal(n, 2 + N_DECODE);
    assert_int_equal(why, MS_FINISH_LENGTH);
    assert_int_equal(ids[1], greedy[0]);
    for (int j = 0; j < N_DECODE; j++)
        assert_int_equal(ids[2 + j], greedy[1 + j]);
    ms_engine_remove(e, rid);
    assert_int_equal(ms_engine_kv_pages_free(e), free0);

    /* a request whose walk stops at the reader holds nothing in the writer */
    rq.max_new_tokens = 1;
    assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_OK);
    while (ms_engine_n_active(e) > 0)
        assert_int_equal(ms_engine_step(e, NULL, &err), MS_OK);
    assert_int_equal(ms_engine_output(e, rid, &ids, &n, &why), MS_OK);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], greedy[0]);
    assert_int_equal(ms_engine_kv_pages_free(e), free0);
    ms_engine_remove(e, rid);
    ms_engine_free(e);
    ms_free(prompt);
    ms_free(pre);
    ms_free(dec);
    ms_free(greedy);
    ms_st_file_free(f);
}

static void test_nodes_batch(void **state) {
    (void)state;
    ms_st_file *f = ms_test_ref_open("hf/llama_gqa");
    enum { NP = 4 };
    int32_t *prompt[NP], *greedy[NP];
    size_t np[NP], ng;
    /* a request on this walk holds one stream per node: 2 of max_seqs */
    ms_engine *e = open_engine(2 * NP);
    const int32_t free0 = ms_engine_kv_pages_free(e);
    ms_rid rid[NP];
    ms_error err = {0};
    for (int p = 0; p < NP; p++) {
        char name[64];
        snprintf(name, sizeof name, "p%d.input_ids", p);
        prompt[p] = ms_test_ref_tensor(f, name, true, &np[p]);
        snprintf(name, sizeof name, "p%d.greedy_ids", p);
        greedy[p] = ms_test_ref_tensor(f, name, true, &ng);
        ms_engine_request rq = {.prompt = prompt[p], .n_prompt = (int32_t)np[p],
                                .max_new_tokens = 2 + N_DECODE, .sampling = ms_sampling_greedy(),
                                .ignore_eos = true}; /* the reference treats eos as any id */
        if (ms_engine_add(e, &rq, &rid[p], &err) != MS_OK)
            fail_msg("add %d: %s", p, err.msg);
    }
    int steps = 0;
    while (ms_engine_n_active(e) > 0 && steps++ < 100)
        if (ms_engine_step(e, NULL, &err) != MS_OK)
            fail_msg("step: %s", err.msg);
    assert_int_equal(ms_engine_n_active(e), 0);
    for (int p = 0; p < NP; p++) {
        const int32_t *ids;
        int32_t n;
        assert_int_equal(ms_engine_output(e, rid[p], &ids, &n, NULL), MS_OK);
        assert_int_equal(n, 2 + N_DECODE);
        assert_int_equal(ids[0], greedy[p][0]);
        assert_int_equal(ids[1], greedy[p][0]);
        for (int j = 0; j < N_DECODE; j++)
            if (ids[2 + j] != greedy[p][1 + j])
                fail_msg("prompt %d decode %d: id %d, reference %d", p, j, (int)ids[2 + j],
                         (int)greedy[p][1 + j]);
        ms_engine_remove(e, rid[p]);
        ms_free(prompt[p]);
        ms_free(greedy[p]);
    }
    assert_int_equal(ms_engine_kv_pages_free(e), free0);
    ms_engine_free(e);
    ms_st_file_free(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_nodes_descriptor),
        ms_unit_test(test_nodes_reference),
        ms_unit_test(test_nodes_batch),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
