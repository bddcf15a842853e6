/*
 * test_talker.c - the talker node of models/talker.mstar (build/gen/talker/talker_gen.c, mstarc
 * build --emit-only) run by the engine on the CPU (f32) over ../shared/fixtures/hf/talker_codepred.
 * Its forward reads a row of G codes per position and embeds them itself (the frame embedding,
 * the sum of the frame's G code embeddings, as reference.json's "what" spells it out: the
 * model's forward(codes: [_, G] ids)) through ms_engine_run_codes:
 *   - teacher-forced with the reference codes (the prompt's 5 frames prefilled, then frame t of
 *     the reference codes decoded to give frame t + 1's logits), its 12 logit rows are within
 *     1e-3 of talker_logits [12, 96] and their argmax is each frame's reference c0;
 *   - four requests with different prompts (the fixture's, shifted, frames reversed, codebooks
 *     permuted and shifted) in one batch give each request's logits of its run alone (1e-5),
 *     and the prompts give different logits;
 *   - bad calls (unknown node / step, a width other than the node's, a zero span, a request
 *     given twice, an unknown request, a code outside the vocabulary, rows past the context,
 *     float rows to the talker, codes to the predictor) fail with a one-line error, and
 *     ms_engine_step refuses the node (it reads codes, not token ids).
 *   - the whole per-frame loop over the two compiled nodes (the talker on its KV pool, the
 *     code_predictor on its scratch KV reading the talker's h rows and the frame's codes, its
 *     forward building its input itself, in_proj(h) at slot 0 and a code's embedding elsewhere,
 *     and ending in the head its frame slot picks: `for hd in heads at code.slot - 1`), the
 *     argmax done here on the host: from prompt_codes [5, 4] the 12 generated frames equal the
 *     reference codes
 *     [12, 4] exactly, talker_logits and predictor_logits within 1e-3; four prompts batched
 *     give each request's codes and logits of its run alone;
 *   - the scratch's hazards through the compiled node: a row continuing a frame another
 *     request began, a frame never begun, a fifth token in a frame of four, a step ending at
 *     slot 0 (no input table, no head) or ragged spans are refused, and so are rows of the
 *     predictor's width (not the talker's), missing or out-of-range codes; a frame
 *     begun again starts empty (bitwise the same rows), two rows never read each other's keys.
 *   - the codes picked on the backend: ms_engine_run_codes_pick (the talker's sampler resource)
 *     over four batched greedy prompts picks each row's argmax and the reference c0 codes;
 *     ms_engine_run_rows_codes_pick over the predictor's frames (two rows each, then one) picks
 *     each request's last row's argmax; misuse of both is refused.
 * tests/test_talker_cpu.c is the hand-built oracle of the same loop.
 */
#include "ms_test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checkpoint.h"
#include "engine.h"
#include "fixture_ref.h"
#include "ms_test_impl.h"
#include "talker.h"

extern const ms_model_desc ms_talker_desc;

#define CHECK(expr)                                                                    \
    do {                                                                               \
        ms_status st_ = (expr);                                                        \
        if (st_ != MS_OK)                                                              \
            fail_msg("%s: %s", #expr, err.msg);                                        \
    } while (0)

enum { G = 4, P = 5, F = 12, V = 96, H = 64, HC = 32, B = 4 };

/* The checkpoint's tables the tests read on the host. */
typedef struct tables {
    ms_ckpt *ck;
    const float *lm_head; /* talker.lm_head.weight [V, H] */
} tables;

static void tables_init(tables *tb) {
    ms_error err = {0};
    CHECK(ms_ckpt_init(&tb->ck, ms_test_fixture("hf/talker_codepred"), &err));
    int64_t shape[2] = {V, H};
    const ms_st_tensor *t;
    CHECK(ms_ckpt_expect_tensor(tb->ck, "talker.lm_head.weight", MS_ST_DTYPES_FLOAT, 2, shape, &t,
                                &err));
    tb->lm_head = (const float *)t->data;
}

static ms_engine *engine_new(void) {
    ms_error err = {0};
    ms_engine_options o = ms_engine_options_default();
    o.model_path = ms_test_fixture("hf/talker_codepred");
    o.max_seqs = B;
    o.max_tokens = B * P;
    o.max_seq_len = P + F;
    o.n_threads = 2;
    ms_engine *e = NULL;
    CHECK(ms_engine_init(&e, &ms_talker_desc, &o, &err));
    return e;
}

/* A request whose prompt ids are the prompt's codebook-0 codes (checked, never read). */
static ms_rid add_request(ms_engine *e, const int32_t (*prompt)[G]) {
    ms_error err = {0};
    int32_t ids[P];
    for (int p = 0; p < P; p++)
        ids[p] = prompt[p][0];
    ms_engine_request rq = {.prompt = ids, .n_prompt = P, .max_new_tokens = F,
                            .sampling = ms_engine_sampling_defaults(e)};
    ms_rid rid;
    CHECK(ms_engine_add(e, &rq, &rid, &err));
    return rid;
}

/*
 * Requests rids[0 .. n) with prompts[i] [P][G]: prefill every prompt in one step, then decode
 * the reference frames codes[0 .. F - 1) one step each (teacher forcing); logits[i][f] = the
 * logits request i gives for frame f (frame 0 from the prompt's last position).
 */
static void run(ms_engine *e, const tables *tb, const ms_rid *rids, int n,
                const int32_t (*const *prompts)[G], const int32_t *codes, float (*logits)[F][V]) {
    ms_error err = {0};
    static int32_t rows[B * P * G];
    int32_t spans[B];
    const float *out;
    for (int i = 0; i < n; i++) {
        spans[i] = P;
        memcpy(rows + (size_t)i * P * G, prompts[i], (size_t)P * G * sizeof(int32_t));
    }
    const float *hid;
    CHECK(ms_engine_run_codes(e, "talker", "prefill", rids, spans, n, rows, G, &out, &hid, &err));
    for (int i = 0; i < n; i++) {
        memcpy(logits[i][0], out + (size_t)i * V, sizeof logits[i][0]);
        /* the hidden rows are what the head read: lm_head(h) is the logits */
        for (int v = 0; v < V; v++) {
            double acc = 0.0;
            for (int d = 0; d < H; d++)
                acc += (double)tb->lm_head[(size_t)v * H + (size_t)d] * hid[(size_t)i * H + (size_t)d];
            assert_true(fabs(acc - out[(size_t)i * V + (size_t)v]) < 1e-4);
        }
    }
    for (int f = 1; f < F; f++) {
        for (int i = 0; i < n; i++) {
            spans[i] = 1;
            memcpy(rows + (size_t)i * G, codes + (size_t)(f - 1) * G, G * sizeof(int32_t));
        }
        CHECK(ms_engine_run_codes(e, "talker", "decode", rids, spans, n, rows, G, &out, NULL, &err));
        for (int i = 0; i < n; i++)
            memcpy(logits[i][f], out + (size_t)i * V, sizeof logits[i][f]);
    }
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

static double max_diff(const float *a, const float *b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= m))
            m = isnan(d) ? INFINITY : d;
    }
    return m;
}

typedef struct ref {
    int32_t *prompt, *codes;
    float *tlog;
} ref;

static void ref_load(ref *r) {
    ms_st_file *rf = ms_test_ref_open("hf/talker_codepred");
    size_t np, nc, nt;
    r->prompt = ms_test_ref_tensor(rf, "prompt_codes", true, &np);
    r->codes = ms_test_ref_tensor(rf, "codes", true, &nc);
    r->tlog = ms_test_ref_tensor(rf, "talker_logits", false, &nt);
    assert_int_equal(np, P * G);
    assert_int_equal(nc, F * G);
    assert_int_equal(nt, F * V);
    ms_st_file_free(rf);
}

static void ref_free(ref *r) {
    ms_free(r->prompt);
    ms_free(r->codes);
    ms_free(r->tlog);
}

static void test_talker_logits_teacher_forced(void **state) {
    (void)state;
    ref r;
    ref_load(&r);
    tables tb;
    tables_init(&tb);
    ms_engine *e = engine_new();
    ms_rid rid = add_request(e, (const int32_t(*)[G])r.prompt);
    static float logits[1][F][V];
    const int32_t(*pr[1])[G] = {(const int32_t(*)[G])r.prompt};
    run(e, &tb, &rid, 1, pr, r.codes, logits);
    double et = max_diff(&logits[0][0][0], r.tlog, F * V);
    int wrong = 0;
    for (int f = 0; f < F; f++)
        wrong += argmax(logits[0][f], V) != r.codes[f * G];
    printf("talker node (compiled, CPU f32, teacher-forced): max |talker_logits| error %.3g, "
           "%d of %d c0 codes differ\n", et, wrong, F);
    assert_true(et < 1e-3);
    assert_int_equal(wrong, 0);
    assert_int_equal(ms_engine_stream_length(e, rid, MS_LABEL_MAIN), P + F - 1);
    int32_t free0 = ms_engine_kv_pages_free(e);
    ms_engine_remove(e, rid);
    assert_true(ms_engine_kv_pages_free(e) > free0);
    ms_engine_free(e);
    ms_ckpt_free(tb.ck);
    ref_free(&r);
}

static void test_batch_of_four_equals_each_alone(void **state) {
    (void)state;
    ref r;
    ref_load(&r);
    tables tb;
    tables_init(&tb);
    static int32_t pr[B][P][G];
    for (int p = 0; p < P; p++)
        for (int g = 0; g < G; g++) {
            int32_t v = r.prompt[p * G + g];
            pr[0][p][g] = v;                      /* the fixture's */
            pr[1][p][g] = (v + 17) % V;           /* shifted */
            pr[2][P - 1 - p][g] = v;              /* frames reversed */
            pr[3][p][(g + 1) % G] = (v + 41) % V; /* codebooks permuted, shifted */
        }
    const int32_t(*all[B])[G] = {(const int32_t(*)[G])pr[0], (const int32_t(*)[G])pr[1],
                                 (const int32_t(*)[G])pr[2], (const int32_t(*)[G])pr[3]};
    static float alone[B][F][V], batch[B][F][V];
    ms_engine *e = engine_new();
    const int32_t free0 = ms_engine_kv_pages_free(e);
    for (int i = 0; i < B; i++) {
        ms_rid rid = add_request(e, all[i]);
        run(e, &tb, &rid, 1, &all[i], r.codes, &alone[i]);
        ms_engine_remove(e, rid);
    }
    ms_rid rids[B];
    for (int i = 0; i < B; i++)
        rids[i] = add_request(e, all[i]);
    run(e, &tb, rids, B, all, r.codes, batch);
    for (int i = 0; i < B; i++) {
        double d = max_diff(&batch[i][0][0], &alone[i][0][0], F * V);
        printf("request %d: batched vs alone: max logits difference %.3g\n", i, d);
        assert_true(d < 1e-5);
        if (i > 0)
            assert_true(max_diff(&alone[i][0][0], &alone[0][0][0], V) > 1e-3);
        ms_engine_remove(e, rids[i]);
    }
    assert_int_equal(ms_engine_kv_pages_free(e), free0);
    ms_engine_free(e);
    ms_ckpt_free(tb.ck);
    ref_free(&r);
}

/* err's message must contain `want`. */
static void expect_fail(ms_status st, const ms_error *err, ms_status code, const char *want) {
    if (st != code)
        fail_msg("status %d (%s), expected %d: %s", (int)st, err->msg, (int)code, want);
    if (strstr(err->msg, want) == NULL)
        fail_msg("message '%s' lacks '%s'", err->msg, want);
}

static void test_bad_calls(void **state) {
    (void)state;
    ref r;
    ref_load(&r);
    ms_engine *e = engine_new();
    ms_rid rid = add_request(e, (const int32_t(*)[G])r.prompt);
    static float rows[(P + F + 1) * H];
    static int32_t codes[(P + F + 1) * H]; /* zeros: codes in range */
    const float *out;
    int32_t span = 1;
    ms_error err = {0};
    ms_rid two[2] = {rid, rid};
    int32_t spans2[2] = {1, 1};
    expect_fail(ms_engine_run_codes(e, "predictor", "decode", &rid, &span, 1, codes, G, &out, NULL, &err),
                &err, MS_ERR_NOT_FOUND, "no node 'predictor'");
    expect_fail(ms_engine_run_codes(e, "talker", "refine", &rid, &span, 1, codes, G, &out, NULL, &err),
                &err, MS_ERR_NOT_FOUND, "no step 'refine'");
    expect_fail(ms_engine_run_codes(e, "talker", "decode", &rid, &span, 1, codes, 3, &out, NULL, &err),
                &err, MS_ERR_INVALID_ARG, "width 3");
    expect_fail(ms_engine_run_codes(e, "talker", "decode", &rid, &span, 1, NULL, G, &out, NULL, &err),
                &err, MS_ERR_INVALID_ARG, "run codes talker.decode");
    span = 0;
    expect_fail(ms_engine_run_codes(e, "talker", "decode", &rid, &span, 1, codes, G, &out, NULL, &err),
                &err, MS_ERR_INVALID_ARG, "0 rows");
    expect_fail(ms_engine_run_codes(e, "talker", "decode", two, spans2, 2, codes, G, &out, NULL, &err),
                &err, MS_ERR_INVALID_ARG, "given twice");
    ms_rid ghost = rid + 100;
    span = 1;
    expect_fail(ms_engine_run_codes(e, "talker", "decode", &ghost, &span, 1, codes, G, &out, NULL, &err),
                &err, MS_ERR_NOT_FOUND, "not running");
    /* [codes] a code outside the vocabulary (row 0, codebook 2), refused before it runs */
    codes[2] = V;
    expect_fail(ms_engine_run_codes(e, "talker", "prefill", &rid, &span, 1, codes, G, &out, NULL, &err),
                &err, MS_ERR_INVALID_ARG, "row 0, column 2: code 96 is outside [0, 96)");
    codes[2] = -1;
    expect_fail(ms_engine_run_codes(e, "talker", "prefill", &rid, &span, 1, codes, G, &out, NULL, &err),
                &err, MS_ERR_INVALID_ARG, "code -1");
    codes[2] = 0;
    /* float rows to the talker (it reads codes), codes to the predictor (it reads rows) */
    expect_fail(ms_engine_run_rows(e, "talker", "decode", &rid, &span, 1, rows, H, &out, NULL, &err),
                &err, MS_ERR_UNSUPPORTED, "ms_engine_run_codes");
    const float *hid0;
    expect_fail(ms_engine_run_codes(e, "code_predictor", "begin", &rid, &span, 1, codes, G, &out,
                                    &hid0, &err), &err, MS_ERR_UNSUPPORTED, "ms_engine_run_rows");
    assert_int_equal(ms_engine_stream_length(e, rid, MS_LABEL_MAIN), 0);
    /* past the node's context: max_position_embeddings = 256 positions */
    const int32_t ctx = ms_engine_facts(e)->max_context;
    assert_int_equal(ctx, 256);
    span = ctx + 1;
    ms_status st = ms_engine_run_codes(e, "talker", "prefill", &rid, &span, 1, codes, G, &out, NULL, &err);
    assert_true(st == MS_ERR_LIMIT || st == MS_ERR_CAPACITY);
    assert_int_equal(ms_engine_stream_length(e, rid, MS_LABEL_MAIN), 0);
    /* the walk's own steps would read ids: refused, nothing changed */
    expect_fail(ms_engine_step(e, NULL, &err), &err, MS_ERR_UNSUPPORTED, "of codes");
    /* the other entry points of the engine refuse the nodes they cannot feed */
    const float *lg;
    int32_t nr;
    int32_t ids[2] = {1, 2};
    expect_fail(ms_engine_run_step(e, rid, "prefill", ids, 2, &lg, &nr, &err), &err,
                MS_ERR_UNSUPPORTED, "ms_engine_run_codes");
    expect_fail(ms_engine_run_step(e, rid, "begin", ids, 2, &lg, &nr, &err), &err,
                MS_ERR_UNSUPPORTED, "scratch KV");
    float feat[2 * 32];
    int64_t rows_out = 0, width = 0;
    memset(feat, 0, sizeof feat);
    expect_fail(ms_engine_encode(e, "code_predictor", feat, 32, 2, rows, 0, &rows_out, &width,
                                 &err), &err, MS_ERR_NOT_FOUND, "code_predictor");
    assert_int_equal(ms_engine_stream_length(e, rid, MS_LABEL_MAIN), 0);
    ms_engine_remove(e, rid);
    ms_engine_free(e);
    ref_free(&r);
}


/* ---- the whole per-frame loop: talker node, then the code predictor node on its scratch ---- */

typedef struct result {
    int32_t codes[F][G];
    float tlog[F][V];
    float plog[F][G - 1][V];
} result;

/* The predictor's step `step` for requests rids[0 .. n) (request i on batch row i), spans[i]
 * tokens each (the same span), a talker hidden row h [sum, H] and a row of the frame's codes
 * [sum, G] per token; y [n, V] = each request's last row through the head its frame slot picks
 * (the model's `for hd in heads at code.slot - 1`): the logits of the next code, whose argmax
 * is the pick. */
static void predictor_step(ms_engine *e, const char *step, const ms_rid *rids, const int32_t *spans,
                           int n, const float *h, const int32_t *codes, float *y) {
    ms_error err = {0};
    const float *hid;
    const int32_t *pick;
    CHECK(ms_engine_run_rows_codes_pick(e, "code_predictor", step, rids, spans, n, h, H, codes,
                                        G, &pick, &hid, &err));
    memcpy(y, hid, (size_t)n * V * sizeof(float));
    for (int i = 0; i < n; i++)
        assert_int_equal(pick[i], argmax(y + (size_t)i * V, V));
}

/*
 * Generate F frames greedily for requests rids[0 .. n) with prompts[i] [P][G] in one batch
 * (reference.json "what"): the talker prefills the prompt's frame embeddings; per frame, c0 =
 * argmax(logits), the predictor begins a frame over two tokens reading h and the codes
 * (its forward: [in_proj(h), embeds[0](c0)]) and takes c1 from heads[0] of its last row, then
 * one token per code (embeds[j-1](c_{j-1})) for c_j from heads[j-1]; the frame's codes are the
 * talker's next input.
 */
static void generate(ms_engine *e, const ms_rid *rids, int n, const int32_t (*const *prompts)[G],
                     result *res) {
    ms_error err = {0};
    static int32_t rows[B * P * G], pc[B * 2 * G];
    static float y[B * V], ph[B * 2 * H];
    int32_t spans[B], c[B][G];
    const float *out, *hid;
    for (int i = 0; i < n; i++) {
        spans[i] = P;
        memcpy(rows + (size_t)i * P * G, prompts[i], (size_t)P * G * sizeof(int32_t));
    }
    CHECK(ms_engine_run_codes(e, "talker", "prefill", rids, spans, n, rows, G, &out, &hid, &err));
    for (int f = 0; f < F; f++) {
        for (int i = 0; i < n; i++) {
            memcpy(res[i].tlog[f], out + (size_t)i * V, sizeof res[i].tlog[f]);
            memset(c[i], 0, sizeof c[i]);
            c[i][0] = argmax(res[i].tlog[f], V);
            /* tokens 2i, 2i + 1 (slots 0, 1): h and the frame's codes so far */
            for (int t = 2 * i; t <= 2 * i + 1; t++) {
                memcpy(ph + (size_t)t * H, hid + (size_t)i * H, H * sizeof(float));
                memcpy(pc + (size_t)t * G, c[i], sizeof c[i]);
            }
            spans[i] = 2;
        }
        predictor_step(e, "begin", rids, spans, n, ph, pc, y);
        for (int j = 1; j < G; j++) {
            for (int i = 0; i < n; i++) {
                memcpy(res[i].plog[f][j - 1], y + (size_t)i * V, V * sizeof(float));
                c[i][j] = argmax(res[i].plog[f][j - 1], V);
                /* token i of the next step: h (row 2i of the begin step's), codes up to c_j */
                memmove(ph + (size_t)i * H, ph + (size_t)(j == 1 ? 2 * i : i) * H,
                        H * sizeof(float));
                memcpy(pc + (size_t)i * G, c[i], sizeof c[i]);
                spans[i] = 1;
            }
            if (j < G - 1) /* embeds[j](c_j) at position j + 1 */
                predictor_step(e, "next", rids, spans, n, ph, pc, y);
        }
        for (int i = 0; i < n; i++)
            memcpy(res[i].codes[f], c[i], sizeof c[i]);
        if (f == F - 1)
            break;
        for (int i = 0; i < n; i++) {
            memcpy(rows + (size_t)i * G, c[i], sizeof c[i]);
            spans[i] = 1;
        }
        CHECK(ms_engine_run_codes(e, "talker", "decode", rids, spans, n, rows, G, &out, &hid, &err));
    }
}

static void test_codes_compiled(void **state) {
    (void)state;
    ref r;
    ref_load(&r);
    ms_st_file *rf = ms_test_ref_open("hf/talker_codepred");
    size_t npl;
    float *plog = ms_test_ref_tensor(rf, "predictor_logits", false, &npl);
    assert_int_equal(npl, F * (G - 1) * V);
    ms_st_file_free(rf);
    ms_engine *e = engine_new();
    ms_rid rid = add_request(e, (const int32_t(*)[G])r.prompt);
    static result res;
    const int32_t(*pr[1])[G] = {(const int32_t(*)[G])r.prompt};
    generate(e, &rid, 1, pr, &res);
    int wrong = 0;
    for (int i = 0; i < F * G; i++)
        wrong += (&res.codes[0][0])[i] != r.codes[i];
    double et = max_diff(&res.tlog[0][0], r.tlog, F * V);
    double ep = max_diff(&res.plog[0][0][0], plog, npl);
    printf("talker + code_predictor (compiled, CPU f32): %d of %d codes differ; max "
           "|talker_logits| error %.3g, max |predictor_logits| error %.3g\n", wrong, F * G, et, ep);
    assert_int_equal(wrong, 0);
    assert_true(et < 1e-3);
    assert_true(ep < 1e-3);
    ms_engine_remove(e, rid);
    ms_engine_free(e);
    ms_free(plog);
    ref_free(&r);
}

static void test_codes_batch_of_four_equals_each_alone(void **state) {
    (void)state;
    ref r;
    ref_load(&r);
    static int32_t pr[B][P][G];
    for (int p = 0; p < P; p++)
        for (int g = 0; g < G; g++) {
            int32_t v = r.prompt[p * G + g];
            pr[0][p][g] = v;
            pr[1][p][g] = (v + 17) % V;
            pr[2][P - 1 - p][g] = v;
            pr[3][p][(g + 1) % G] = (v + 41) % V;
        }
    const int32_t(*all[B])[G] = {(const int32_t(*)[G])pr[0], (const int32_t(*)[G])pr[1],
                                 (const int32_t(*)[G])pr[2], (const int32_t(*)[G])pr[3]};
    static result alone[B], batch[B];
    ms_engine *e = engine_new();
    for (int i = 0; i < B; i++) {
        ms_rid rid = add_request(e, all[i]);
        generate(e, &rid, 1, &all[i], &alone[i]);
        ms_engine_remove(e, rid);
    }
    ms_rid rids[B];
    for (int i = 0; i < B; i++)
        rids[i] = add_request(e, all[i]);
    generate(e, rids, B, all, batch);
    int distinct = 0;
    for (int i = 0; i < B; i++) {
        assert_memory_equal(batch[i].codes, alone[i].codes, sizeof batch[i].codes);
        double et = max_diff(&batch[i].tlog[0][0], &alone[i].tlog[0][0], F * V);
        double ep = max_diff(&batch[i].plog[0][0][0], &alone[i].plog[0][0][0], F * (G - 1) * V);
        printf("request %d: batched vs alone: codes equal, max logits difference %.3g / %.3g\n",
               i, et, ep);
        assert_true(et < 1e-5 && ep < 1e-5);
        if (i > 0 && memcmp(alone[i].codes, alone[0].codes, sizeof alone[0].codes) != 0)
            distinct++;
        ms_engine_remove(e, rids[i]);
    }
    assert_int_equal(distinct, B - 1);
    ms_engine_free(e);
    ref_free(&r);
}

/* A predictor input of up to four tokens: a talker hidden row and a row of codes each. */
typedef struct pin {
    float h[4 * H];
    int32_t c[4 * G];
} pin;

/* Tokens t = 0 .. 3 of a distinct input per `seed`: rows in about [-0.5, 0.5], codes in [0, V). */
static void pin_fill(pin *p, int seed) {
    for (int k = 0; k < 4 * H; k++)
        p->h[k] = 0.01f * (float)((k % H * 7 + seed * 13) % 97) - 0.48f;
    for (int k = 0; k < 4 * G; k++)
        p->c[k] = (k % G * 29 + seed * 31) % V;
}

/*
 * The scratch's hazards through the compiled node: a row continuing a frame another request
 * began (the batch recomposed mid-frame) is refused and changes nothing; a request continuing
 * a frame it never began is refused; a frame longer than its G slots is refused; a frame begun
 * again starts empty (the same inputs give bitwise the same rows whatever came before). Both
 * requests get the same inputs (the pin's tokens 0, 1 for a begin, token 0 for a next).
 */
static void test_scratch_hazards(void **state) {
    (void)state;
    ref r;
    ref_load(&r);
    ms_engine *e = engine_new();
    ms_rid a = add_request(e, (const int32_t(*)[G])r.prompt);
    ms_rid b = add_request(e, (const int32_t(*)[G])r.prompt);
    /* pair: two tokens per request (both requests the same), single: one each, other: another
       input of two tokens each */
    static pin pair, single, other;
    pin_fill(&pair, 1);
    pin_fill(&other, 2);
    pin_fill(&single, 3);
    for (int t = 2; t < 4; t++) { /* request b's tokens: request a's */
        memcpy(pair.h + t * H, pair.h + (t - 2) * H, H * sizeof(float));
        memcpy(pair.c + t * G, pair.c + (t - 2) * G, G * sizeof(int32_t));
        memcpy(other.h + t * H, other.h + (t - 2) * H, H * sizeof(float));
        memcpy(other.c + t * G, other.c + (t - 2) * G, G * sizeof(int32_t));
    }
    memcpy(single.h + H, single.h, H * sizeof(float));
    memcpy(single.c + G, single.c, G * sizeof(int32_t));
    static float y1[2 * V], y2[2 * V], y3[2 * V], y4[2 * V];
    ms_error err = {0};
    const float *lg, *hid;
    const int32_t *pick;
    ms_rid ab[2] = {a, b}, ba[2] = {b, a};
    int32_t two[2] = {2, 2}, one[2] = {1, 1}, two_one[2] = {2, 1};
#define PSTEP(step, rq, sp, in)                                                             \
    ms_engine_run_rows_codes_pick(e, "code_predictor", step, rq, sp, 2, (in).h, H, (in).c, G, \
                                  &pick, &hid, &err)
    /* next before any begin: a frame never begun */
    expect_fail(PSTEP("next", ab, one, pair), &err, MS_ERR_INVALID_ARG, "never began");
    printf("a frame never begun: %s\n", err.msg);
    /* frame 1 of both rows, then both rows' second step */
    predictor_step(e, "begin", ab, two, 2, pair.h, pair.c, y1);
    /* the batch recomposed mid-frame: row 0 would read request a's keys for b */
    expect_fail(PSTEP("next", ba, one, pair), &err, MS_ERR_INVALID_ARG, "scratch kv");
    printf("recomposed mid-frame: %s\n", err.msg);
    predictor_step(e, "next", ab, one, 2, single.h, single.c, y2);
    predictor_step(e, "next", ab, one, 2, single.h, single.c, y3);
    /* a fifth token in a frame of four slots */
    expect_fail(PSTEP("next", ab, one, pair), &err, MS_ERR_CAPACITY, "would hold 5 tokens");
    printf("a fifth token: %s\n", err.msg);
    /* a new frame starts empty: the same inputs give the same rows as frame 1 */
    predictor_step(e, "begin", ab, two, 2, pair.h, pair.c, y4);
    assert_memory_equal(y1, y4, sizeof y1);
    predictor_step(e, "next", ab, one, 2, single.h, single.c, y4);
    assert_memory_equal(y2, y4, sizeof y2);
    /* the input table and the head are picked by the frame slot of the step's last rows: a
       frame begun over one row ends at slot 0 (no code before it to embed, no head gives
       code 0): refused, the scratch unchanged (the next step continues the frame); ragged
       spans are refused before the step runs */
    expect_fail(PSTEP("begin", ab, one, other), &err, MS_ERR_INVALID_ARG,
                "frame slot 0 picks cp_embeds[-1], outside [0, 3)");
    printf("a frame of one row: %s\n", err.msg);
    expect_fail(PSTEP("begin", ab, two_one, other), &err, MS_ERR_INVALID_ARG,
                "takes one span for every request");
    printf("ragged spans: %s\n", err.msg);
    predictor_step(e, "next", ab, one, 2, single.h, single.c, y4);
    assert_memory_equal(y3, y4, sizeof y3);
    /* a frame of other inputs in between, then the first frame's inputs again */
    predictor_step(e, "begin", ab, two, 2, other.h, other.c, y4);
    predictor_step(e, "next", ab, one, 2, other.h, other.c, y4);
    assert_true(memcmp(y4, y2, sizeof y2) != 0);
    predictor_step(e, "begin", ab, two, 2, pair.h, pair.c, y4);
    assert_memory_equal(y1, y4, sizeof y1);
    /* the two rows got the same inputs: equal rows (neither read the other's keys) */
    assert_memory_equal(y1, y1 + V, V * sizeof(float));
    assert_memory_equal(y3, y3 + V, V * sizeof(float));
    /* the slot-0 row's h and the slot-1 row's code both matter: changing either changes the
       frame's logits (the forward reads in_proj(h) at slot 0 and embeds[0](c0) at slot 1) */
    static pin alt;
    alt = pair;
    alt.h[0] += 0.25f;
    alt.h[2 * H] += 0.25f;
    predictor_step(e, "begin", ab, two, 2, alt.h, alt.c, y4);
    assert_true(memcmp(y4, y1, sizeof y1) != 0);
    alt = pair;
    alt.h[H] += 0.25f; /* h of the slot-1 row: not read */
    alt.h[3 * H] += 0.25f;
    predictor_step(e, "begin", ab, two, 2, alt.h, alt.c, y4);
    assert_memory_equal(y4, y1, sizeof y1);
    alt = pair;
    alt.c[G] = (alt.c[G] + 1) % V; /* c0 of the slot-1 row */
    alt.c[3 * G] = (alt.c[3 * G] + 1) % V;
    predictor_step(e, "begin", ab, two, 2, alt.h, alt.c, y4);
    assert_true(memcmp(y4, y1, sizeof y1) != 0);
    /* rows of the predictor's width, not the talker's */
    expect_fail(ms_engine_run_rows_codes_pick(e, "code_predictor", "begin", ab, two, 2, pair.h,
                                              HC, pair.c, G, &pick, &hid, &err),
                &err, MS_ERR_INVALID_ARG, "rows of width 32 given, the node reads 64");
    /* the codes: given, of the node's width, each in range */
    expect_fail(ms_engine_run_rows_codes_pick(e, "code_predictor", "begin", ab, two, 2, pair.h,
                                              H, NULL, G, &pick, &hid, &err),
                &err, MS_ERR_INVALID_ARG, "no codes given");
    expect_fail(ms_engine_run_rows_codes_pick(e, "code_predictor", "begin", ab, two, 2, pair.h,
                                              H, pair.c, G - 1, &pick, &hid, &err),
                &err, MS_ERR_INVALID_ARG, "rows of 3 codes given, the node reads 4");
    alt = pair;
    alt.c[2 * G + 1] = V;
    expect_fail(PSTEP("begin", ab, two, alt), &err, MS_ERR_INVALID_ARG,
                "row 2, column 1: code 96 is outside [0, 96)");
    printf("a code out of range: %s\n", err.msg);
    /* the node reads codes besides its rows: the rows alone are refused */
    expect_fail(ms_engine_run_rows(e, "code_predictor", "begin", ab, two, 2, pair.h, H, &lg, &hid,
                                   &err),
                &err, MS_ERR_INVALID_ARG, "run it through ms_engine_run_rows_codes_pick");
    expect_fail(ms_engine_run_rows_pick(e, "code_predictor", "begin", ab, two, 2, pair.h, H,
                                        &pick, &hid, &err),
                &err, MS_ERR_INVALID_ARG, "a row of 4 codes per token besides its rows");
#undef PSTEP
    ms_engine_remove(e, a);
    ms_engine_remove(e, b);
    ms_engine_free(e);
    ref_free(&r);
}


/* ---- the engine entry point (talker.h): the same loop with its glue in the runtime ---- */

static void test_engine_talker_codes(void **state) {
    (void)state;
    ref r;
    ref_load(&r);
    ms_st_file *rf = ms_test_ref_open("hf/talker_codepred");
    size_t npl;
    float *plog = ms_test_ref_tensor(rf, "predictor_logits", false, &npl);
    ms_st_file_free(rf);
    ms_engine *e = engine_new();
    static float tl[F][V], pl[F][G - 1][V];
    ms_talker_item it = {.prompt_codes = r.prompt, .n_prompt = P, .n_frames = F,
                         .talker_logits = &tl[0][0], .predictor_logits = &pl[0][0][0]};
    ms_talker_glue glue = ms_talker_glue_default();
    ms_error err = {0};
    CHECK(ms_engine_talker_codes(e, &glue, &it, 1, &err));
    assert_memory_equal(it.codes, r.codes, F * G * sizeof(int32_t));
    double et = max_diff(&tl[0][0], r.tlog, F * V), ep = max_diff(&pl[0][0][0], plog, npl);
    printf("ms_engine_talker_codes (CPU f32): codes equal; logits errors %.3g / %.3g\n", et, ep);
    assert_true(et < 1e-3 && ep < 1e-3);
    ms_free(it.codes);
    assert_int_equal(ms_engine_n_active(e), 0);

    /* four prompts in one call (one wave of max_seqs 4) equal each alone; 6 items: two waves */
    static int32_t pr[6][P][G];
    for (int p = 0; p < P; p++)
        for (int g = 0; g < G; g++) {
            int32_t v = r.prompt[p * G + g];
            pr[0][p][g] = v;
            pr[1][p][g] = (v + 17) % V;
            pr[2][P - 1 - p][g] = v;
            pr[3][p][(g + 1) % G] = (v + 41) % V;
            pr[4][p][g] = (v * 5 + 3) % V;
            pr[5][p][g] = (v + 60) % V;
        }
    ms_talker_item all[6], one;
    for (int i = 0; i < 6; i++)
        all[i] = (ms_talker_item){.prompt_codes = &pr[i][0][0], .n_prompt = P, .n_frames = F - i};
    CHECK(ms_engine_talker_codes(e, &glue, all, 6, &err));
    for (int i = 0; i < 6; i++) {
        one = (ms_talker_item){.prompt_codes = &pr[i][0][0], .n_prompt = P, .n_frames = F - i};
        CHECK(ms_engine_talker_codes(e, &glue, &one, 1, &err));
        assert_memory_equal(one.codes, all[i].codes, (size_t)(F - i) * G * sizeof(int32_t));
        ms_free(one.codes);
        ms_free(all[i].codes);
    }

    /* bad input: one line each, nothing held */
    static int32_t bad[P][G];
    memcpy(bad, r.prompt, sizeof bad);
    bad[3][2] = V;
    it = (ms_talker_item){.prompt_codes = &bad[0][0], .n_prompt = P, .n_frames = 2};
    expect_fail(ms_engine_talker_codes(e, &glue, &it, 1, &err), &err, MS_ERR_INVALID_ARG,
                "item 0: prompt frame 3, codebook 2: code 96 is outside [0, 96)");
    assert_null(it.codes);
    it = (ms_talker_item){.prompt_codes = r.prompt, .n_prompt = P, .n_frames = 0};
    expect_fail(ms_engine_talker_codes(e, &glue, &it, 1, &err), &err, MS_ERR_INVALID_ARG,
                "0 frames to generate");
    it = (ms_talker_item){.prompt_codes = r.prompt, .n_prompt = P, .n_frames = 300};
    expect_fail(ms_engine_talker_codes(e, &glue, &it, 1, &err), &err, MS_ERR_LIMIT,
                "pass the talker's context (256 positions)");
    ms_talker_glue g2 = glue;
    it = (ms_talker_item){.prompt_codes = r.prompt, .n_prompt = P, .n_frames = 2};
    g2.predictor = "predictor";
    expect_fail(ms_engine_talker_codes(e, &g2, &it, 1, &err), &err, MS_ERR_NOT_FOUND,
                "no node 'predictor'");
    assert_int_equal(ms_engine_n_active(e), 0);
    ms_engine_free(e);
    ms_free(plog);
    ref_free(&r);
}

/*
 * ms_engine_run_codes_pick: the talker node's sampler resource picks c0 on the backend. Four
 * greedy requests with different prompts in one batch: over the prefill and every teacher-forced
 * decode, each picked id is its logits' argmax (the host's) and the logits equal
 * ms_engine_run_codes' (the same step); the reference c0 codes come out. A request sampling at
 * temperature 1 picks an id in range; the predictor (no sampler) and a NULL `picked` are refused.
 */
static void test_sampler_picks_c0(void **state) {
    (void)state;
    ref r;
    ref_load(&r);
    ms_error err = {0};
    static int32_t rows[B * P * G];
    static float plain[B][V];
    int32_t spans[B];
    ms_rid rids[B], mirror[B];
    ms_engine *e = engine_new();
    ms_engine *e2 = engine_new(); /* the same steps through ms_engine_run_codes */
    for (int i = 0; i < B; i++) {
        int32_t ids[P];
        for (int p = 0; p < P; p++)
            for (int g = 0; g < G; g++) {
                int32_t v = (r.prompt[p * G + g] + 13 * i) % V;
                rows[((size_t)i * P + (size_t)p) * G + (size_t)g] = v;
                if (g == 0)
                    ids[p] = v;
            }
        ms_engine_request rq = {.prompt = ids, .n_prompt = P, .max_new_tokens = F,
                                .sampling = ms_sampling_greedy()};
        CHECK(ms_engine_add(e, &rq, &rids[i], &err));
        CHECK(ms_engine_add(e2, &rq, &mirror[i], &err));
        spans[i] = P;
    }
    int wrong = 0;
    for (int f = 0; f < F; f++) {
        const float *out, *out2, *hid;
        const int32_t *pick;
        const char *step = f == 0 ? "prefill" : "decode";
        CHECK(ms_engine_run_codes(e2, "talker", step, mirror, spans, B, rows, G, &out2, NULL,
                                  &err));
        memcpy(plain, out2, sizeof plain);
        CHECK(ms_engine_run_codes_pick(e, "talker", step, rids, spans, B, rows, G, &pick, &out,
                                       &hid, &err));
        assert_non_null(hid);
        for (int i = 0; i < B; i++) {
            assert_int_equal(pick[i], argmax(out + (size_t)i * V, V));
            assert_true(max_diff(out + (size_t)i * V, plain[i], V) == 0.0);
        }
        /* request 0 carries the fixture's prompt: its picks are the reference c0 codes */
        wrong += pick[0] != r.codes[f * G];
        for (int i = 0; i < B; i++) {
            spans[i] = 1;
            memcpy(rows + (size_t)i * G, r.codes + (size_t)f * G, G * sizeof(int32_t));
        }
    }
    printf("run_codes_pick: %d of %d picked c0 codes differ from the reference; every pick is "
           "its row's argmax\n", wrong, F);
    assert_int_equal(wrong, 0);
    for (int i = 0; i < B; i++)
        ms_engine_remove(e2, mirror[i]);
    /* a sampled (temperature 1) request: an id in range */
    int32_t ids[P];
    for (int p = 0; p < P; p++)
        ids[p] = r.prompt[p * G];
    ms_engine_request rq = {.prompt = ids, .n_prompt = P, .max_new_tokens = F,
                            .sampling = ms_sampling_greedy()};
    rq.sampling.temperature = 1.0f;
    rq.sampling.seed = 7;
    ms_rid hot;
    CHECK(ms_engine_add(e2, &rq, &hot, &err));
    const float *out;
    const int32_t *pick;
    int32_t span = P;
    CHECK(ms_engine_run_codes_pick(e2, "talker", "prefill", &hot, &span, 1, r.prompt, G, &pick,
                                   &out, NULL, &err));
    assert_true(pick[0] >= 0 && pick[0] < V);
    span = 1;
    expect_fail(ms_engine_run_codes_pick(e, "talker", "decode", rids, &span, 1, r.codes, G, NULL,
                                         &out, NULL, &err),
                &err, MS_ERR_INVALID_ARG, "no place for the picked ids");
    expect_fail(ms_engine_run_codes_pick(e, "code_predictor", "next", rids, &span, 1, r.codes, G,
                                         &pick, &out, NULL, &err),
                &err, MS_ERR_UNSUPPORTED, "node code_predictor does not read a row of codes");
    assert_null(pick);
    ms_engine_free(e);
    ms_engine_free(e2);
    ref_free(&r);
}

/*
 * ms_engine_run_rows_codes_pick: the predictor's codes picked on the backend from each request's
 * last row. Four requests, a frame begun over two distinct tokens each (the pick reads every
 * second row: rows 2i + 1), then a next step of one token each: every pick is the argmax of the
 * row ms_engine_run_rows_codes_pick returns, and the frames' inputs differ so that the picks
 * do. Different spans, the talker node (not on a scratch) and a NULL `picked` are refused.
 */
static void test_predictor_picks(void **state) {
    (void)state;
    ref r;
    ref_load(&r);
    ms_error err = {0};
    ms_engine *e = engine_new();
    ms_rid rids[B];
    for (int i = 0; i < B; i++)
        rids[i] = add_request(e, (const int32_t(*)[G])r.prompt);
    static float rows[2 * B * H];
    static int32_t codes[2 * B * G];
    for (int k = 0; k < 2 * B * H; k++)
        rows[k] = 0.05f * (float)((k * 7 + k / H * 11) % 23) - 0.5f;
    for (int k = 0; k < 2 * B * G; k++)
        codes[k] = (k * 37 + k / G * 5) % V;
    int32_t spans[B] = {2, 2, 2, 2};
    const int32_t *pick;
    const float *hid;
    int distinct = 0;
    CHECK(ms_engine_run_rows_codes_pick(e, "code_predictor", "begin", rids, spans, B, rows, H,
                                        codes, G, &pick, &hid, &err));
    for (int i = 0; i < B; i++) {
        assert_int_equal(pick[i], argmax(hid + (size_t)i * V, V));
        distinct += i > 0 && pick[i] != pick[0];
    }
    for (int i = 0; i < B; i++)
        spans[i] = 1;
    CHECK(ms_engine_run_rows_codes_pick(e, "code_predictor", "next", rids, spans, B, rows, H,
                                        codes, G, &pick, &hid, &err));
    for (int i = 0; i < B; i++)
        assert_int_equal(pick[i], argmax(hid + (size_t)i * V, V));
    printf("run_rows_codes_pick: every pick is its last row's argmax (%d of %d picks differ "
           "from request 0's at the frame's begin)\n", distinct, B - 1);
    assert_true(distinct > 0);
    int32_t ragged[2] = {2, 1};
    expect_fail(ms_engine_run_rows_codes_pick(e, "code_predictor", "begin", rids, ragged, 2, rows,
                                              H, codes, G, &pick, &hid, &err),
                &err, MS_ERR_INVALID_ARG, "takes one span for every request");
    expect_fail(ms_engine_run_rows_codes_pick(e, "code_predictor", "begin", rids, spans, 1, rows,
                                              H, codes, G, NULL, &hid, &err),
                &err, MS_ERR_INVALID_ARG, "no place for the picked ids");
    expect_fail(ms_engine_run_rows_codes_pick(e, "talker", "decode", rids, spans, 1, rows, H,
                                              codes, G, &pick, &hid, &err),
                &err, MS_ERR_UNSUPPORTED, "not on a scratch");
    assert_null(pick);
    for (int i = 0; i < B; i++)
        ms_engine_remove(e, rids[i]);
    ms_engine_free(e);
    ref_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_talker_logits_teacher_forced),
        ms_unit_test(test_batch_of_four_equals_each_alone),
        ms_unit_test(test_bad_calls),
        ms_unit_test(test_codes_compiled),
        ms_unit_test(test_codes_batch_of_four_equals_each_alone),
        ms_unit_test(test_scratch_hazards),
        ms_unit_test(test_engine_talker_codes),
        ms_unit_test(test_sampler_picks_c0),
        ms_unit_test(test_predictor_picks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
