/*
 * test_quant_smollm2_cuda.c - SmolLM2-135M-Instruct Q4_1 (token embedding Q8_0) on the GPU with its
 * weights kept quantized (backend_cuda_quant.h), through the engine and models/llama.mstar
 * (GPU_TESTS: `make gpu-test`; the model comes from scripts/fetch-model.sh, skipped without it).
 *
 * The 5 cases of ../shared/fixtures/gguf/smollm2 run as one ragged batch on cuda and on the CPU
 * with bf16 weights (dtype "bf16": the CPU backend rounding weights as the GPU's bf16 path would).
 * Checks: on cuda the relative logit error ||gpu - ref|| / ||ref|| of the 8 reference rows
 * (pK.logits: transformers over the dequantized float32 weights) under 3e-2 (bf16 activations:
 * the CPU's bf16 run is up to 2.4e-2 from the reference, the H200's up to 2.4e-2), over the rows
 * whose history equals the reference's greedy ids; the first 16 greedy ids of every case equal to the
 * CPU bf16 run's, or an earlier difference at a near-tie of the CPU's logits (gap < 5e-2; the
 * reference's own row 5 of case 4 is an exact tie) in at most two cases; the device weight bytes below 60% of what the
 * same model takes dequantized to bf16 (the blocks stayed blocks: Q4_1 is 5 bits per value).
 * Then, without any download, small mstar-mkckpt GGUFs in q4_0, q4_k and q8_0 ($MS_BUILD/mstar-mkckpt):
 * the logits after a 40-token prompt (prefill: dequantize + GEMM) and after 3 decode steps (GEMV)
 * within 2e-2 relative of the CPU's float32 run (the decode row when both runs fed the same 3
 * ids), weight bytes under half of the CPU's f32.
 */
#include "ms_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "safetensors.h"

#include "fixture_ref.h"
#include "ms_test_impl.h"

extern const ms_model_desc ms_llama_desc;

#define N_CASES 5
#define N_NEW 24
#define N_SAME 16
#define N_LOGITS 8

static char *fetch_model(void) {
    FILE *p = popen("scripts/fetch-model.sh smollm2", "r");
    if (p == NULL)
        return NULL;
    char line[4096] = {0};
    char *got = fgets(line, sizeof line, p);
    int rc = pclose(p);
    if (got == NULL || rc != 0)
        return NULL;
    line[strcspn(line, "\n")] = '\0';
    return ms_strdup(line);
}

typedef struct run {
    int32_t ids[N_CASES][N_NEW];
    float *lg[N_CASES];   /* [N_NEW, V]: the logits each generated id was picked from */
    float rel[N_CASES];   /* worst row's relative logit error against the reference (same history) */
    int n_rel[N_CASES];   /* reference rows compared: those whose history equals the reference's */
    size_t weight_bytes;
} run;

static void run_engine(const char *model, const char *device, const char *dtype, int32_t *const *ids,
                       const size_t *n_ids, run *r, int32_t *vocab) {
    memset(r, 0, sizeof *r);
    ms_engine_options o = ms_engine_options_default();
    o.model_path = model;
    o.device = device;
    o.dtype = dtype;
    o.page_size = 16;
    o.max_seqs = N_CASES;
    o.max_tokens = 512;
    o.max_seq_len = 320;
    o.n_threads = 2;
    ms_engine *e = NULL;
    ms_error err = {0};
    if (ms_engine_init(&e, &ms_llama_desc, &o, &err) != MS_OK)
        fail_msg("engine init %s on %s: %s", model, device, err.msg);
    const int32_t V = ms_engine_facts(e)->vocab;
    *vocab = V;
    r->weight_bytes = ms_engine_weight_bytes(e);
    ms_rid rid[N_CASES];
    for (int c = 0; c < N_CASES; c++) {
        r->lg[c] = ms_malloc(sizeof(float) * (size_t)N_NEW * (size_t)V);
        assert_non_null(r->lg[c]);
        ms_engine_request rq = {.prompt = ids[c], .n_prompt = (int32_t)n_ids[c], .max_new_tokens = N_NEW,
                                .sampling = ms_sampling_greedy(), .ignore_eos = true};
        if (ms_engine_add(e, &rq, &rid[c], &err) != MS_OK)
            fail_msg("add case %d: %s", c, err.msg);
    }
    int kept[N_CASES] = {0};
    while (ms_engine_n_active(e) > 0) {
        if (ms_engine_step(e, NULL, &err) != MS_OK)
            fail_msg("step on %s: %s", device, err.msg);
        for (int c = 0; c < N_CASES; c++) {
            const int32_t *out;
            int32_t n_out;
            assert_int_equal(ms_engine_output(e, rid[c], &out, &n_out, NULL), MS_OK);
            if (n_out == 0 || n_out - 1 != kept[c] || kept[c] >= N_NEW)
                continue;
            const float *lg = ms_engine_last_logits(e, rid[c]);
            assert_non_null(lg);
            memcpy(r->lg[c] + (size_t)kept[c] * (size_t)V, lg, sizeof(float) * (size_t)V);
            kept[c]++;
        }
    }
    for (int c = 0; c < N_CASES; c++) {
        const int32_t *out;
        int32_t n_out;
        assert_int_equal(ms_engine_output(e, rid[c], &out, &n_out, NULL), MS_OK);
        assert_int_equal(n_out, N_NEW);
        assert_int_equal(kept[c], N_NEW);
        memcpy(r->ids[c], out, sizeof r->ids[c]);
    }
    ms_engine_free(e);
}

/* The relative logit error ||got - ref|| / ||ref|| of reference row k (the logits transformers
 * picked its greedy id k from), over the rows whose history (ids 0..k-1) equals the reference's:
 * after a run picks another id (the reference has exact ties, e.g. case 4 row 5) its rows follow
 * another text and are not comparable. */
static void rel_vs_ref(run *r, int c, const float *ref, const int32_t *ref_ids, int32_t V) {
    r->rel[c] = 0.f;
    r->n_rel[c] = 0;
    for (int k = 0; k < N_LOGITS; k++) {
        if (k > 0 && r->ids[c][k - 1] != ref_ids[k - 1])
            break;
        double num = 0, den = 0;
        for (int32_t v = 0; v < V; v++) {
            double d = (double)r->lg[c][(size_t)k * (size_t)V + (size_t)v] - ref[(size_t)k * (size_t)V + (size_t)v];
            num += d * d;
            den += (double)ref[(size_t)k * (size_t)V + (size_t)v] * ref[(size_t)k * (size_t)V + (size_t)v];
        }
        float rel = (float)sqrt(num / den);
        r->rel[c] = isnan(rel) ? INFINITY : fmaxf(r->rel[c], rel);
        r->n_rel[c]++;
    }
}

static void test_smollm2_q4_1_cuda(void **state) {
    (void)state;
    char *model = fetch_model();
    if (model == NULL) {
        printf("test_quant_smollm2_cuda: SKIPPED: scripts/fetch-model.sh smollm2 could not fetch the model\n");
        skip();
    }
    ms_st_file *refs = ms_test_ref_open("gguf/smollm2");
    int32_t *ids[N_CASES], *ref_ids[N_CASES];
    float *logits[N_CASES];
    size_t n_ids[N_CASES];
    for (int c = 0; c < N_CASES; c++) {
        char name[64];
        size_t n;
        snprintf(name, sizeof name, "p%d.input_ids", c);
        ids[c] = ms_test_ref_tensor(refs, name, true, &n_ids[c]);
        snprintf(name, sizeof name, "p%d.logits", c);
        logits[c] = ms_test_ref_tensor(refs, name, false, &n);
        snprintf(name, sizeof name, "p%d.greedy_ids", c);
        ref_ids[c] = ms_test_ref_tensor(refs, name, true, &n);
        assert_true(n >= N_LOGITS);
    }
    ms_st_file_free(refs);
    run *gpu = ms_calloc(1, sizeof *gpu), *cpu = ms_calloc(1, sizeof *cpu);
    assert_true(gpu != NULL && cpu != NULL);
    int32_t V = 0;
    run_engine(model, "cuda", NULL, ids, n_ids, gpu, &V);
    run_engine(model, "cpu", "bf16", ids, n_ids, cpu, &V);
    printf("smollm2 Q4_1 weights: %zu bytes on cuda (kept quantized), %zu as bf16 on the CPU\n",
           gpu->weight_bytes, cpu->weight_bytes);
    if (!((double)gpu->weight_bytes < 0.6 * (double)cpu->weight_bytes))
        fail_msg("cuda weights take %zu bytes, bf16 %zu: the blocks were not kept", gpu->weight_bytes,
                 cpu->weight_bytes);
    /* every case's figures first, then the checks (a failure names the case) */
    int same[N_CASES], diverged = 0;
    double gap[N_CASES];
    for (int c = 0; c < N_CASES; c++) {
        rel_vs_ref(gpu, c, logits[c], ref_ids[c], V);
        rel_vs_ref(cpu, c, logits[c], ref_ids[c], V);
        same[c] = 0;
        while (same[c] < N_NEW && gpu->ids[c][same[c]] == cpu->ids[c][same[c]])
            same[c]++;
        gap[c] = 0.0;
        if (same[c] < N_NEW) { /* how far below the CPU's best the device's pick was, in the CPU's logits */
            const float *z = cpu->lg[c] + (size_t)same[c] * (size_t)V;
            float mx = z[0];
            for (int32_t v = 1; v < V; v++)
                mx = fmaxf(mx, z[v]);
            gap[c] = (double)mx - (double)z[gpu->ids[c][same[c]]];
        }
        printf("smollm2 Q4_1 case %d on cuda: relative logit error %.3g over %d reference rows (cpu bf16 %.3g over "
               "%d), %d of %d ids equal to the cpu bf16 run", c, (double)gpu->rel[c], gpu->n_rel[c],
               (double)cpu->rel[c], cpu->n_rel[c], same[c], N_NEW);
        if (same[c] < N_NEW)
            printf(" (then %d vs %d, %.3g below the cpu's maximum)", gpu->ids[c][same[c]], cpu->ids[c][same[c]],
                   gap[c]);
        printf("\n");
    }
    for (int c = 0; c < N_CASES; c++) {
        /* 3e-2, not issue [I]'s 2e-2: the error is the bf16 activations', which both backends round
         * (the quantized kernels accumulate in fp32; their own error is in test_quant_cuda): the
         * CPU's bf16 run of the same weights is 0.7e-2 to 2.4e-2 from the float32 reference on these
         * cases, the H200's 1.5e-2 to 2.4e-2 (2026-12-02) */
        const float tol = 3e-2f;
        if (gpu->n_rel[c] < 1 || !(gpu->rel[c] < tol))
            fail_msg("case %d: relative logit error %g on cuda over %d rows (tolerance %g; the cpu bf16 run's %g)", c,
                     (double)gpu->rel[c], gpu->n_rel[c], (double)tol, (double)cpu->rel[c]);
        /* ids equal to the CPU bf16 run's for N_SAME tokens; an earlier difference only at a near-tie
         * of the CPU's logits (gap < 5e-2: the reference itself has an exact tie in case 4), in at
         * most two of the five cases */
        if (same[c] < N_SAME) {
            if (!(gap[c] < 5e-2))
                fail_msg("case %d: greedy id %d: cuda %d, cpu bf16 %d, %.3g below the cpu's best (no near-tie)", c,
                         same[c], (int)gpu->ids[c][same[c]], (int)cpu->ids[c][same[c]], gap[c]);
            diverged++;
        }
    }
    if (diverged > 2)
        fail_msg("%d of %d cases left the cpu bf16 run's ids before %d tokens", diverged, N_CASES, N_SAME);
    for (int c = 0; c < N_CASES; c++) {
        ms_free(ids[c]);
        ms_free(logits[c]);
        ms_free(ref_ids[c]);
        ms_free(gpu->lg[c]);
        ms_free(cpu->lg[c]);
    }
    ms_free(gpu);
    ms_free(cpu);
    ms_free(model);
}

/* ---- mstar-mkckpt GGUFs (no download): every quantizer's type through the engine on cuda ---- */

static ms_engine *engine_on(const char *model, const char *device, ms_error *err) {
    ms_engine_options o = ms_engine_options_default();
    o.model_path = model;
    o.device = device;
    o.page_size = 16;
    o.max_seqs = 2;
    o.max_tokens = 128;
    o.max_seq_len = 128;
    o.n_threads = 2;
    ms_engine *e = NULL;
    return ms_engine_init(&e, &ms_llama_desc, &o, err) == MS_OK ? e : NULL;
}

/* The logits after a 40-token prompt (the prefill's last row: the dequantize + GEMM path) and
 * after 3 decode steps (the GEMV path), copied into rows[2][V]. */
static void prompt_logits(ms_engine *e, float *rows, int32_t V, int32_t *ids3) {
    ms_error err = {0};
    int32_t prompt[40];
    for (int i = 0; i < 40; i++)
        prompt[i] = (int32_t)((i * 37 + 11) % V);
    ms_engine_request rq = {.prompt = prompt, .n_prompt = 40, .max_new_tokens = 4,
                            .sampling = ms_sampling_greedy(), .ignore_eos = true};
    ms_rid rid;
    if (ms_engine_add(e, &rq, &rid, &err) != MS_OK)
        fail_msg("add: %s", err.msg);
    int step = 0;
    while (ms_engine_n_active(e) > 0) {
        if (ms_engine_step(e, NULL, &err) != MS_OK)
            fail_msg("step: %s", err.msg);
        const float *lg = ms_engine_last_logits(e, rid);
        if (lg != NULL && (step == 0 || step == 3))
            memcpy(rows + (step == 0 ? 0 : V), lg, sizeof(float) * (size_t)V);
        step++;
    }
    const int32_t *out;
    int32_t n_out;
    assert_int_equal(ms_engine_output(e, rid, &out, &n_out, NULL), MS_OK);
    assert_true(n_out >= 3);
    memcpy(ids3, out, 3 * sizeof *ids3);
}

static void test_mkckpt_gguf_cuda(void **state) {
    (void)state;
    const char *b = getenv("MS_BUILD");
    char mk[1024];
    snprintf(mk, sizeof mk, "%s/mstar-mkckpt", b != NULL ? b : "build");
    static const char *const quants[] = {"q4_0", "q4_k", "q8_0"};
    for (size_t q = 0; q < MS_ARRAY_LEN(quants); q++) {
        char path[256], cmd[2048];
        snprintf(path, sizeof path, "/tmp/ms_test_quant_cuda_%d_%s.gguf", (int)getpid(), quants[q]);
        snprintf(cmd, sizeof cmd, "%s --format gguf --quant %s --hidden 256 --intermediate 512 --heads 4 "
                 "--kv-heads 2 --head-dim 64 --vocab 512 --layers 2 --seed 3 --out %s >/dev/null", mk, quants[q], path);
        if (system(cmd) != 0)
            fail_msg("%s failed", cmd);
        ms_error err = {0};
        ms_engine *g = engine_on(path, "cuda", &err);
        if (g == NULL)
            fail_msg("cuda engine on %s: %s", path, err.msg);
        ms_engine *c = engine_on(path, "cpu", &err);
        if (c == NULL)
            fail_msg("cpu engine on %s: %s", path, err.msg);
        const int32_t V = ms_engine_facts(g)->vocab;
        float *lg = ms_malloc(sizeof(float) * 2 * (size_t)V), *lc = ms_malloc(sizeof(float) * 2 * (size_t)V);
        assert_true(lg != NULL && lc != NULL);
        int32_t ig[3], ic[3];
        prompt_logits(g, lg, V, ig);
        prompt_logits(c, lc, V, ic);
        size_t gb = ms_engine_weight_bytes(g), cb = ms_engine_weight_bytes(c);
        /* decode step 3 is compared only when both fed the same 3 ids (random weights: near ties) */
        const int rows = memcmp(ig, ic, sizeof ig) == 0 ? 2 : 1;
        if (rows == 1)
            printf("mkckpt %s: the first 3 greedy ids differ (cuda %d %d %d, cpu %d %d %d): decode logits not "
                   "compared\n", quants[q], ig[0], ig[1], ig[2], ic[0], ic[1], ic[2]);
        for (int r = 0; r < rows; r++) {
            double num = 0, den = 0;
            for (int32_t v = 0; v < V; v++) {
                double d = (double)lg[(size_t)r * V + v] - lc[(size_t)r * V + v];
                num += d * d;
                den += (double)lc[(size_t)r * V + v] * lc[(size_t)r * V + v];
            }
            double rel = sqrt(num / den);
            printf("mkckpt %s GGUF on cuda: %s logits relative error %.3g against the CPU (f32); weights %zu bytes "
                   "(cpu f32 %zu)\n", quants[q], r == 0 ? "prefill" : "decode step 3", rel, gb, cb);
            if (!(rel < 2e-2))
                fail_msg("%s: %s relative logit error %g (tolerance 2e-2)", quants[q], r == 0 ? "prefill" : "decode",
                         rel);
        }
        /* the blocks stayed blocks: at most 8.5 bits per weight value against the CPU's 32 */
        if (!((double)gb < 0.5 * (double)cb))
            fail_msg("%s: cuda weights %zu bytes vs cpu f32 %zu: not kept quantized", quants[q], gb, cb);
        ms_free(lg);
        ms_free(lc);
        ms_engine_free(g);
        ms_engine_free(c);
        unlink(path);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_smollm2_q4_1_cuda),
        ms_unit_test(test_mkckpt_gguf_cuda),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
