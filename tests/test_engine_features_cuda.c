/*
 * test_engine_features_cuda.c - the model features of issue [E] on the GPU through the engine API
 * and the descriptors mstarc generates (GPU_TESTS: `make gpu-test`, scripts/gpu-batch.sh):
 *   - batched CFG (models/llama.mstar's guided walk) on hf/llama_cfg;
 *   - M-RoPE (models/qwen2vl.mstar, t/h/w ids from the reference) on hf/qwen2vl_mrope;
 *   - dense generation (tests/codegen/dense.mstar's block steps) on hf/llama_dense.
 * Each runs on device cuda (bf16 weights and KV) and on the CPU backend over the same bf16
 * storage (dtype bf16): the GPU's logits against the transformers reference by relative error
 * ||gpu - ref|| / ||ref|| under 2e-2 (rows whose sequence still equals the reference's), and its
 * greedy ids equal the CPU bf16 run's for at least 16 tokens. One line per feature is printed
 * with the figures. MS_FEATURES_DEVICE=cpu runs the "GPU" side on the CPU backend (a dry run
 * of the test's logic on a machine without a GPU).
 */
#include "ms_test.h"
#include "ms_test_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "fixture_ref.h"
#include "safetensors.h"

extern const ms_model_desc ms_llama_desc;
extern const ms_model_desc ms_qwen2vl_desc;
extern const ms_model_desc ms_llama_dense_desc;

#define REL_TOL 2e-2
#define N_IDS 16

/* Squared-error accumulator of a relative error over several rows. */
typedef struct rel_acc {
    double num, den;
} rel_acc;

static void rel_add(rel_acc *a, const float *got, const float *want, size_t n) {
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - (double)want[i];
        a->num += d * d;
        a->den += (double)want[i] * (double)want[i];
    }
}

static double rel_of(const rel_acc *a) { return a->den > 0.0 ? sqrt(a->num / a->den) : 0.0; }

static const char *gpu_device(void) {
    const char *d = getenv("MS_FEATURES_DEVICE");
    return d != NULL && d[0] != '\0' ? d : "cuda";
}

static ms_engine *open_on(const ms_model_desc *d, const char *fixture, const char *device) {
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture(fixture);
    o.device = device;
    o.dtype = "bf16";
    o.max_seqs = 4;
    o.max_tokens = 64;
    ms_engine *e = NULL;
    ms_error err = {0};
    if (ms_engine_init(&e, d, &o, &err) != MS_OK)
        fail_msg("engine (%s, %s): %s", fixture, device, err.msg);
    return e;
}

/* Run rq to the end; copy up to cap ids; when `want` is given, add the last logits of every step
 * whose row is in `want` (rows [n_want, vocab]) while the ids still equal `ref_ids`. */
static int32_t run_request(ms_engine *e, const ms_engine_request *rq, int32_t *ids, int32_t cap,
                           const float *want, int32_t n_want, const int32_t *ref_ids,
                           rel_acc *acc) {
    ms_error err = {0};
    const size_t V = (size_t)ms_engine_facts(e)->vocab;
    ms_rid rid;
    if (ms_engine_add(e, rq, &rid, &err) != MS_OK)
        fail_msg("add: %s", err.msg);
    int32_t row = 0;
    bool same = true;
    while (ms_engine_n_active(e) > 0) {
        if (ms_engine_step(e, NULL, &err) != MS_OK)
            fail_msg("step: %s", err.msg);
        const float *lg = ms_engine_last_logits(e, rid);
        if (lg == NULL)
            continue;
        if (want != NULL && row < n_want && same)
            rel_add(acc, lg, want + (size_t)row * V, V);
        const int32_t *out;
        int32_t n;
        assert_int_equal(ms_engine_output(e, rid, &out, &n, NULL), MS_OK);
        if (ref_ids != NULL && n > 0 && row < n_want && out[n - 1] != ref_ids[row])
            same = false; /* later reference rows describe another sequence */
        row++;
    }
    const int32_t *out;
    int32_t n;
    assert_int_equal(ms_engine_output(e, rid, &out, &n, NULL), MS_OK);
    int32_t k = MS_MIN(n, cap);
    memcpy(ids, out, sizeof(int32_t) * (size_t)k);
    ms_engine_remove(e, rid);
    return k;
}

static int32_t same_prefix(const int32_t *a, const int32_t *b, int32_t n) {
    int32_t k = 0;
    while (k < n && a[k] == b[k])
        k++;
    return k;
}

static void test_cfg_on_cuda(void **state) {
    (void)state;
    ms_st_file *f = ms_test_ref_open("hf/llama_cfg");
    size_t nc, nu, ng, nm;
    int32_t *cond = ms_test_ref_tensor(f, "cond_ids", true, &nc);
    int32_t *uncond = ms_test_ref_tensor(f, "uncond_ids", true, &nu);
    int32_t *greedy = ms_test_ref_tensor(f, "greedy_ids", true, &ng);
    float *mixed = ms_test_ref_tensor(f, "mixed_logprobs", false, &nm);
    ms_engine_request rq = {.prompt = cond, .n_prompt = (int32_t)nc,
                            .max_new_tokens = (int32_t)ng, .sampling = ms_sampling_greedy(),
                            .ignore_eos = true, .negative_prompt = uncond,
                            .n_negative_prompt = (int32_t)nu, .guidance_scale = 3.0f};
    int32_t gpu[64], cpu[64];
    rel_acc acc = {0, 0};
    ms_engine *eg = open_on(&ms_llama_desc, "hf/llama_cfg", gpu_device());
    int32_t ng_ = run_request(eg, &rq, gpu, 64, mixed, (int32_t)ng, greedy, &acc);
    ms_engine_free(eg);
    ms_engine *ec = open_on(&ms_llama_desc, "hf/llama_cfg", "cpu");
    int32_t nc_ = run_request(ec, &rq, cpu, 64, NULL, 0, NULL, NULL);
    ms_engine_free(ec);
    int32_t eq = same_prefix(gpu, cpu, MS_MIN(ng_, nc_));
    int32_t eq_ref = same_prefix(gpu, greedy, ng_);
    printf("engine cfg hf/llama_cfg on %s: %d guided ids, relative error of the mixed "
           "log-probs %.2e (tol %.0e), ids equal the cpu bf16 run's for %d, the reference's "
           "for %d\n", gpu_device(), (int)ng_, rel_of(&acc), REL_TOL, (int)eq, (int)eq_ref);
    assert_true(rel_of(&acc) < REL_TOL);
    assert_true(eq >= MS_MIN(N_IDS, ng_));
    ms_free(cond);
    ms_free(uncond);
    ms_free(greedy);
    ms_free(mixed);
    ms_st_file_free(f);
}

static void test_mrope_on_cuda(void **state) {
    (void)state;
    ms_st_file *f = ms_test_ref_open("hf/qwen2vl_mrope");
    size_t n, np, nl;
    int32_t *ids = ms_test_ref_tensor(f, "input_ids", true, &n);
    int32_t *thw = ms_test_ref_tensor(f, "position_ids_thw", true, &np);
    float *logits = ms_test_ref_tensor(f, "logits", false, &nl);
    /* every prompt position: one token per step, its logits the request's last */
    ms_engine_request rq = {.prompt = ids, .n_prompt = (int32_t)n, .max_new_tokens = N_IDS,
                            .sampling = ms_sampling_greedy(), .ignore_eos = true,
                            .prefill_chunk = 1, .position_ids = thw, .n_position_axes = 3};
    ms_engine *eg = open_on(&ms_qwen2vl_desc, "hf/qwen2vl_mrope", gpu_device());
    rel_acc acc = {0, 0};
    int32_t gpu[N_IDS], cpu[N_IDS];
    int32_t ng = run_request(eg, &rq, gpu, N_IDS, logits, (int32_t)n, NULL, &acc);
    ms_engine_free(eg);
    ms_engine *ec = open_on(&ms_qwen2vl_desc, "hf/qwen2vl_mrope", "cpu");
    int32_t nc = run_request(ec, &rq, cpu, N_IDS, NULL, 0, NULL, NULL);
    ms_engine_free(ec);
    int32_t eq = same_prefix(gpu, cpu, MS_MIN(ng, nc));
    printf("engine mrope hf/qwen2vl_mrope on %s: %d positions, relative error %.2e (tol "
           "%.0e), %d greedy ids after the prompt equal the cpu bf16 run's\n", gpu_device(), (int)n,
           rel_of(&acc), REL_TOL, (int)eq);
    assert_true(rel_of(&acc) < REL_TOL);
    assert_int_equal(eq, N_IDS);
    ms_free(ids);
    ms_free(thw);
    ms_free(logits);
    ms_st_file_free(f);
}

/* Dense generation: prefix, refine steps, commit block, then 16 greedy decode steps. */
static void dense_run(const char *device, ms_st_file *f, rel_acc *acc, int32_t *ids,
                      int32_t *free_ok) {
    ms_error err = {0};
    size_t np, n;
    int32_t *prompt = ms_test_ref_tensor(f, "prompt_ids", true, &np);
    ms_engine *e = open_on(&ms_llama_dense_desc, "hf/llama_gqa", device);
    const size_t V = (size_t)ms_engine_facts(e)->vocab;
    ms_engine_request rq = {.prompt = prompt, .n_prompt = (int32_t)np,
                            .max_new_tokens = N_IDS + 1, .sampling = ms_sampling_greedy(),
                            .ignore_eos = true};
    ms_rid rid;
    assert_int_equal(ms_engine_add(e, &rq, &rid, &err), MS_OK);
    assert_int_equal(ms_engine_step(e, NULL, &err), MS_OK);
    const int32_t free_prefix = ms_engine_kv_pages_free(e);
    *free_ok = 1;
    for (int k = 0;; k++) {
        char name[64];
        snprintf(name, sizeof name, "refine%d.block_ids", k);
        if (ms_st_file_find_tensor(f, name) == NULL)
            break;
        size_t nb, nl;
        int32_t *block = ms_test_ref_tensor(f, name, true, &nb);
        snprintf(name, sizeof name, "refine%d.logits", k);
        float *want = ms_test_ref_tensor(f, name, false, &nl);
        const float *got;
        int32_t rows;
        if (ms_engine_run_step(e, rid, "refine", block, (int32_t)nb, &got, &rows, &err) != MS_OK)
            fail_msg("refine on %s: %s", device, err.msg);
        if (acc != NULL)
            rel_add(acc, got, want, nb * V);
        if (ms_engine_kv_pages_free(e) != free_prefix ||
            ms_engine_stream_length(e, rid, 0) != (int32_t)np)
            *free_ok = 0;
        ms_free(block);
        ms_free(want);
    }
    size_t nb, nl;
    int32_t *block = ms_test_ref_tensor(f, "commit.block_ids", true, &nb);
    float *want = ms_test_ref_tensor(f, "commit.logits", false, &nl);
    const float *got;
    int32_t rows;
    if (ms_engine_run_step(e, rid, "commit_block", block, (int32_t)nb, &got, &rows, &err) != MS_OK)
        fail_msg("commit_block on %s: %s", device, err.msg);
    if (acc != NULL)
        rel_add(acc, got, want, nb * V);
    /* greedy decode over the committed block: feed the argmax of the block's last row */
    int32_t next = 0;
    for (size_t v = 1; v < V; v++)
        if (got[(size_t)(rows - 1) * V + v] > got[(size_t)(rows - 1) * V + (size_t)next])
            next = (int32_t)v;
    for (int32_t i = 0; i < N_IDS; i++) {
        ids[i] = next;
        if (ms_engine_run_step(e, rid, "decode", &next, 1, &got, &rows, &err) != MS_OK)
            fail_msg("decode on %s: %s", device, err.msg);
        next = 0;
        for (size_t v = 1; v < V; v++)
            if (got[v] > got[(size_t)next])
                next = (int32_t)v;
    }
    (void)n;
    ms_engine_remove(e, rid);
    ms_engine_free(e);
    ms_free(prompt);
    ms_free(block);
    ms_free(want);
}

static void test_dense_on_cuda(void **state) {
    (void)state;
    ms_st_file *f = ms_test_ref_open("hf/llama_dense");
    rel_acc acc = {0, 0};
    int32_t gpu[N_IDS], cpu[N_IDS], ok_g = 0, ok_c = 0;
    dense_run(gpu_device(), f, &acc, gpu, &ok_g);
    dense_run("cpu", f, NULL, cpu, &ok_c);
    int32_t eq = same_prefix(gpu, cpu, N_IDS);
    printf("engine dense hf/llama_dense on %s: refine and commit-block logits relative error "
           "%.2e (tol %.0e), refine steps keep free pages and stream length: %s, %d decode ids "
           "after the block equal the cpu bf16 run's\n", gpu_device(), rel_of(&acc), REL_TOL,
           ok_g ? "yes" : "NO", (int)eq);
    assert_true(rel_of(&acc) < REL_TOL);
    assert_true(ok_g && ok_c);
    assert_int_equal(eq, N_IDS);
    ms_st_file_free(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_cfg_on_cuda),
        ms_unit_test(test_mrope_on_cuda),
        ms_unit_test(test_dense_on_cuda),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
