/*
 * test_dsl.c - the model language front end and `mstarc` library: golden malformed inputs
 * (tests/dsl/<group>.test), every models/<name>.mstar and tests/dsl/valid/<name>.mstar checking clean and
 * round-tripping through the dump, the checked model's structure, out-of-memory injection at
 * every allocation, the error limit, deep nesting, and the arena.
 *
 * Runs from the project root (paths are relative to it).
 */
#include "ms_test.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "dsl.h"
#include "mstarc.h"

#include "ms_test_impl.h"

/* ---- helpers ---- */

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf == NULL || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        return NULL;
    }
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* Sorted list of files in dir ending in suffix ("dir/name"), count in *n; free with free_list. */
static char **list_files(const char *dir, const char *suffix, int *n) {
    DIR *d = opendir(dir);
    *n = 0;
    if (d == NULL)
        return NULL;
    char **v = NULL;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name), sl = strlen(suffix);
        if (l <= sl || strcmp(e->d_name + l - sl, suffix) != 0)
            continue;
        v = realloc(v, sizeof *v * (size_t)(*n + 1));
        size_t need = strlen(dir) + l + 2;
        v[*n] = malloc(need);
        snprintf(v[*n], need, "%s/%s", dir, e->d_name);
        (*n)++;
    }
    closedir(d);
    for (int i = 0; i < *n; i++)
        for (int j = i + 1; j < *n; j++)
            if (strcmp(v[j], v[i]) < 0) {
                char *t = v[i];
                v[i] = v[j];
                v[j] = t;
            }
    return v;
}

static void free_list(char **v, int n) {
    for (int i = 0; i < n; i++)
        free(v[i]);
    free(v);
}

/* Diagnostics of a compilation as text. */
static char *diag_text(const ms_compile *c) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    ms_diags_print(ms_compile_diags(c), f);
    fclose(f);
    return buf;
}

static char *dump_text(const ms_model *m) {
    ms_strbuf b = {0};
    assert_int_equal(ms_model_dump(m, &b), MS_OK);
    char *s = strdup(b.data);
    ms_strbuf_free(&b);
    return s;
}

/* ---- golden malformed inputs ---- */

typedef struct golden_case {
    char name[128];
    char *src;       /* malloc */
    char *expected;  /* malloc */
} golden_case;

/* Parse one .test file (format in tests/dsl/README.md). Returns the number of cases. */
static int parse_test_file(const char *path, golden_case *cases, int max) {
    char *text = read_text(path);
    assert_non_null(text);
    int n = 0;
    char *p = text;
    golden_case *cur = NULL;
    int mode = 0; /* 0 outside, 1 source, 2 expected */
    size_t slen = 0, elen = 0;
    while (*p != '\0') {
        char *nl = strchr(p, '\n');
        size_t ll = nl != NULL ? (size_t)(nl - p) : strlen(p);
        if (ll >= 4 && strncmp(p, "%%% ", 4) == 0) {
            assert_true(n < max);
            cur = &cases[n++];
            memset(cur, 0, sizeof *cur);
            snprintf(cur->name, sizeof cur->name, "%.*s", (int)(ll - 4), p + 4);
            cur->src = calloc(1, strlen(p) + 1);
            cur->expected = calloc(1, strlen(p) + 1);
            slen = elen = 0;
            mode = 1;
        } else if (mode == 1 && ll == 3 && strncmp(p, "---", 3) == 0) {
            mode = 2;
        } else if (mode == 1) {
            memcpy(cur->src + slen, p, ll);
            slen += ll;
            cur->src[slen++] = '\n';
        } else if (mode == 2 && ll == 0) {
            mode = 0;
        } else if (mode == 2) {
            memcpy(cur->expected + elen, p, ll);
            elen += ll;
            cur->expected[elen++] = '\n';
        }
        p = nl != NULL ? nl + 1 : p + ll;
    }
    free(text);
    return n;
}

static void test_golden_malformed_inputs(void **state) {
    (void)state;
    int nf = 0;
    char **files = list_files("tests/dsl", ".test", &nf);
    assert_true(nf >= 5);
    int total = 0, failed = 0;
    static golden_case cases[256];
    for (int f = 0; f < nf; f++) {
        int n = parse_test_file(files[f], cases, 256);
        assert_true(n > 0);
        for (int i = 0; i < n; i++) {
            char fname[160];
            snprintf(fname, sizeof fname, "%.120s.mstar", cases[i].name);
            ms_compile *c = NULL;
            ms_error err = {0};
            ms_status st = ms_compile_source(fname, cases[i].src, strlen(cases[i].src), 0, &c, &err);
            total++;
            if (st != MS_ERR_PARSE || c == NULL) {
                fprintf(stderr, "%s: case %s: expected errors, got status %d\n", files[f], cases[i].name, (int)st);
                failed++;
            } else {
                char *got = diag_text(c);
                if (strcmp(got, cases[i].expected) != 0) {
                    fprintf(stderr, "%s: case %s: diagnostics differ\n--- expected\n%s--- got\n%s", files[f],
                            cases[i].name, cases[i].expected, got);
                    failed++;
                }
                free(got);
            }
            ms_compile_free(c);
            free(cases[i].src);
            free(cases[i].expected);
        }
    }
    free_list(files, nf);
    fprintf(stderr, "golden: %d case(s), %d failed\n", total, failed);
    assert_int_equal(failed, 0);
    assert_true(total >= 25);
}

/* ---- valid models ---- */

static void check_clean_and_round_trip(const char *path) {
    ms_compile *c = NULL;
    ms_error err = {0};
    ms_status st = ms_compile_file(path, 0, &c, &err);
    if (st != MS_OK) {
        if (c != NULL)
            ms_diags_print(ms_compile_diags(c), stderr);
        fprintf(stderr, "%s: %s\n", path, err.msg);
    }
    assert_int_equal(st, MS_OK);
    char *d1 = dump_text(ms_compile_model(c));
    ms_compile *c2 = NULL;
    st = ms_compile_source("dump.mstar", d1, strlen(d1), 0, &c2, &err);
    if (st != MS_OK && c2 != NULL)
        ms_diags_print(ms_compile_diags(c2), stderr);
    assert_int_equal(st, MS_OK);
    char *d2 = dump_text(ms_compile_model(c2));
    if (strcmp(d1, d2) != 0)
        fprintf(stderr, "%s: dump -> parse -> dump differs\n--- first\n%s--- second\n%s", path, d1, d2);
    assert_string_equal(d1, d2);
    free(d1);
    free(d2);
    ms_compile_free(c);
    ms_compile_free(c2);
}

static void test_models_check_clean_and_round_trip(void **state) {
    (void)state;
    int n = 0;
    char **files = list_files("models", ".mstar", &n);
    assert_true(n >= 1);
    for (int i = 0; i < n; i++)
        check_clean_and_round_trip(files[i]);
    free_list(files, n);
    files = list_files("tests/dsl/valid", ".mstar", &n);
    assert_true(n >= 1);
    for (int i = 0; i < n; i++)
        check_clean_and_round_trip(files[i]);
    free_list(files, n);
}

/* ---- the checked model ---- */

static const char *canon_text(const ms_ast_expr *e, char *buf, size_t n) {
    ms_strbuf b = {0};
    ms_expr_print(&b, e);
    snprintf(buf, n, "%s", b.data);
    ms_strbuf_free(&b);
    return buf;
}

static void test_llama_checked_model_structure(void **state) {
    (void)state;
    ms_compile *c = NULL;
    ms_error err = {0};
    assert_int_equal(ms_compile_file("models/llama.mstar", 0, &c, &err), MS_OK);
    const ms_model *m = ms_compile_model(c);
    char buf[256];
    assert_string_equal(m->name, "llama");
    /* config */
    const ms_param *theta = ms_model_find_param(m, "rope_theta");
    assert_non_null(theta);
    assert_int_equal(theta->type, MS_TYPE_FLOAT);
    assert_int_equal(theta->n_sources, 2);
    assert_string_equal(theta->sources[0], "rope_parameters.rope_theta");
    assert_string_equal(theta->sources[1], "rope_theta");
    const ms_param *sw = ms_model_find_param(m, "sliding_window");
    assert_true(sw->optional);
    assert_null(sw->dflt);
    assert_true(ms_model_find_param(m, "kv_dim")->derived);
    const ms_param *hd = ms_model_find_param(m, "head_dim");
    assert_string_equal(canon_text(hd->dflt, buf, sizeof buf), "hidden_size / num_attention_heads");
    assert_int_equal(hd->dflt->lhs->sym->kind, MS_SYM_PARAM);
    /* weights: 3 top-level + 12 per layer */
    assert_int_equal(m->n_weights, 15);
    assert_int_equal(m->n_groups, 1);
    assert_string_equal(m->groups[0]->index_var, "i");
    assert_int_equal(m->groups[0]->n_members, 12);
    const ms_weight *wq = m->groups[0]->members[1];
    assert_string_equal(wq->name, "wq");
    assert_string_equal(wq->names[0], "model.layers.{i}.self_attn.q_proj.weight");
    assert_int_equal(wq->rank, 2);
    assert_string_equal(canon_text(wq->shape[0], buf, sizeof buf), "q_dim");
    assert_true(m->groups[0]->members[4]->optional); /* bq */
    const ms_weight *head = ms_model_find_weight(m, "lm_head");
    assert_non_null(head->tie);
    assert_string_equal(head->tie->name, "embed");
    assert_non_null(head->tie_cond);
    /* node and resources in dependency order */
    assert_int_equal(m->n_nodes, 1);
    const ms_node *n = m->nodes[0];
    assert_int_equal(n->n_labels, 3); /* main and the batched CFG labels */
    assert_string_equal(n->labels[0].name, "main");
    assert_string_equal(n->labels[1].name, "cfg_uncond");
    assert_string_equal(n->labels[2].name, "cfg");
    assert_int_equal(n->n_resources, 4);
    static const char *const order[] = {"kv", "pos", "attn", "sample"};
    static const ms_resource_kind kinds[] = {MS_RESOURCE_KV, MS_RESOURCE_POS, MS_RESOURCE_ATTN,
                                             MS_RESOURCE_SAMPLER};
    for (int i = 0; i < 4; i++) {
        assert_string_equal(n->resources[i]->name, order[i]);
        assert_int_equal(n->resources[i]->kind, kinds[i]);
        assert_int_equal(n->resources[i]->index, i);
    }
    const ms_resource *kv = n->resources[0];
    const ms_ast_expr *ps = ms_resource_arg(kv, "page_size");
    assert_int_equal(ps->kind, MS_EXPR_INT);
    assert_int_equal(ps->ival, 16);
    assert_int_equal(ms_resource_arg(kv, "retention")->kind, MS_EXPR_COND);
    const ms_resource *attn = n->resources[2];
    assert_ptr_equal(attn->kv, kv);
    assert_int_equal(attn->n_deps, 2);
    assert_null(ms_resource_arg(attn, "scale"));
    /* steps */
    assert_int_equal(n->n_steps, 4); /* prefill, decode and their guided (CFG) forms */
    const ms_step_decl *dg = ms_node_find_step(n, "decode_guided");
    assert_int_equal(dg->n_segments, 2);
    assert_int_equal(dg->recs[0].n_combined, 1);
    assert_int_equal(dg->recs[0].combined[0].n_labels, 2);
    assert_int_equal(dg->recs[0].combined[0].plan_label, 2);
    const ms_step_decl *pre = ms_node_find_step(n, "prefill");
    assert_int_equal(pre->n_segments, 1);
    assert_int_equal(pre->segments[0].label, 0);
    assert_int_equal(pre->capture, MS_CAPTURE_TOKENS);
    assert_int_equal(pre->n_buckets, 7);
    assert_int_equal(pre->buckets[0], 32);
    assert_int_equal(pre->buckets[6], 2048);
    assert_true(pre->recs[2].written);
    assert_true(pre->recs[2].causal);
    assert_false(pre->recs[0].written);
    assert_true(pre->recs[0].commit);
    const ms_step_decl *dec = ms_node_find_step(n, "decode");
    assert_int_equal(dec->capture, MS_CAPTURE_BATCH);
    assert_int_equal(dec->n_buckets, 9);
    assert_int_equal(dec->buckets[3], 8);
    assert_int_equal(dec->buckets[8], 256);
    assert_int_equal(dec->recs[1].advance->ival, 1);
    assert_ptr_equal(dec->forward, n->forwards[0]);
    /* forward: the returned logits are [tokens, vocab_size] */
    const ms_ast_forward *fw = n->forwards[0]->ast;
    const ms_ast_stmt *ret = fw->body.items[fw->body.n - 1];
    assert_int_equal(ret->kind, MS_AST_STMT_RETURN);
    const ms_ast_expr *logits = ret->rhs.items[0];
    assert_int_equal(logits->type, MS_TYPE_TENSOR);
    assert_int_equal(logits->rank, 2);
    assert_null(logits->dims[0]);
    assert_string_equal(canon_text(logits->dims[1], buf, sizeof buf), "vocab_size");
    const ms_ast_stmt *loop = fw->body.items[1];
    assert_int_equal(loop->kind, MS_AST_STMT_FOR);
    const ms_ast_stmt *qkv = loop->body.items[1];
    const ms_ast_expr *q = qkv->lhs.items[0];
    assert_int_equal(q->sym->kind, MS_SYM_LOCAL);
    assert_string_equal(canon_text(q->dims[1], buf, sizeof buf), "q_dim");
    /* walk */
    assert_int_equal(m->n_walks, 2); /* generate and guided */
    assert_int_equal(m->walks[0]->body->kind, MS_AST_WALK_SEQ);
    ms_compile_free(c);
}

/* ---- error paths ---- */

static void test_missing_file_is_an_io_error(void **state) {
    (void)state;
    ms_compile *c = NULL;
    ms_error err = {0};
    assert_int_equal(ms_compile_file("tests/dsl/no-such-file.mstar", 0, &c, &err), MS_ERR_IO);
    assert_null(c);
    assert_string_equal(err.msg, "cannot open 'tests/dsl/no-such-file.mstar': No such file or directory");
    assert_int_equal(ms_compile_file("tests/dsl", 0, &c, &err), MS_ERR_IO);
    assert_null(c);
    assert_non_null(strstr(err.msg, "tests/dsl"));
}

static void test_error_limit_stops_and_says_so(void **state) {
    (void)state;
    char src[4096] = "model m {\n    config {\n";
    for (int i = 0; i < 30; i++)
        strcat(src, "        x: nosuchtype;\n");
    strcat(src, "    }\n}\n");
    ms_compile *c = NULL;
    ms_error err = {0};
    assert_int_equal(ms_compile_source("lim.mstar", src, strlen(src), 5, &c, &err), MS_ERR_PARSE);
    const ms_diags *d = ms_compile_diags(c);
    assert_int_equal(d->n_errors, 5);
    assert_true(d->stopped);
    char *t = diag_text(c);
    assert_non_null(strstr(t, "lim.mstar: error: too many errors (5), stopping\n"));
    free(t);
    ms_compile_free(c);
}

static void test_deep_nesting_is_an_error_not_a_crash(void **state) {
    (void)state;
    size_t depth = 20000;
    char *src = malloc(depth * 2 + 200);
    strcpy(src, "model m { config { x: int = ");
    size_t l = strlen(src);
    for (size_t i = 0; i < depth; i++)
        src[l++] = '-';
    strcpy(src + l, "1; } }\n");
    ms_compile *c = NULL;
    ms_error err = {0};
    assert_int_equal(ms_compile_source("deep.mstar", src, strlen(src), 0, &c, &err), MS_ERR_PARSE);
    char *t = diag_text(c);
    assert_non_null(strstr(t, "nesting too deep"));
    free(t);
    ms_compile_free(c);
    /* brackets */
    strcpy(src, "model m { config { x: int = ");
    l = strlen(src);
    for (size_t i = 0; i < 300; i++)
        src[l++] = '(';
    strcpy(src + l, "1; } }\n");
    assert_int_equal(ms_compile_source("deep.mstar", src, strlen(src), 0, &c, &err), MS_ERR_PARSE);
    t = diag_text(c);
    assert_non_null(strstr(t, "brackets nested deeper than 256 levels"));
    free(t);
    ms_compile_free(c);
    free(src);
}

static void test_nul_bytes_and_empty_input(void **state) {
    (void)state;
    const char src[] = "model m {\0 }";
    ms_compile *c = NULL;
    ms_error err = {0};
    assert_int_equal(ms_compile_source("nul.mstar", src, sizeof src - 1, 0, &c, &err), MS_ERR_PARSE);
    char *t = diag_text(c);
    assert_non_null(strstr(t, "nul.mstar:1:10: error: unexpected character '\\x00'"));
    free(t);
    ms_compile_free(c);
    assert_int_equal(ms_compile_source("empty.mstar", "", 0, 0, &c, &err), MS_ERR_PARSE);
    t = diag_text(c);
    assert_string_equal(t, "empty.mstar:1:1: error: syntax error: unexpected end of file, expected 'model'\n"
                           "\n    ^\n");
    free(t);
    ms_compile_free(c);
}

/* Fail each allocation in turn: every run ends in MS_OK or MS_ERR_OOM, never leaks, and once
 * the failure point passes the last allocation the compilation succeeds. */
static void oom_sweep(const char *path, ms_status final) {
    char *src = read_text(path);
    assert_non_null(src);
    int runs = 0;
    for (int64_t nth = 1; nth < 100000; nth++) {
        int64_t live = ms_alloc_get_stats().live_blocks;
        ms_alloc_fail_nth(nth);
        ms_compile *c = NULL;
        ms_error err = {0};
        ms_status st = ms_compile_source(path, src, strlen(src), 0, &c, &err);
        ms_alloc_fail_nth(0);
        runs++;
        if (st == MS_ERR_OOM) {
            assert_null(c);
            assert_non_null(strstr(err.msg, "out of memory"));
            assert_int_equal(ms_alloc_get_stats().live_blocks, live);
            continue;
        }
        assert_int_equal(st, final);
        if (st == MS_OK) {
            ms_strbuf b = {0};
            ms_alloc_fail_nth(1);
            assert_int_equal(ms_model_dump(ms_compile_model(c), &b), MS_ERR_OOM);
            ms_alloc_fail_nth(0);
            ms_strbuf_free(&b);
        }
        ms_compile_free(c);
        assert_int_equal(ms_alloc_get_stats().live_blocks, live);
        break;
    }
    assert_true(runs > 3);
    free(src);
}

static void test_out_of_memory_everywhere(void **state) {
    (void)state;
    oom_sweep("models/llama.mstar", MS_OK);
    oom_sweep("tests/dsl/syntax.test", MS_ERR_PARSE); /* not a model: syntax errors */
}

/* ---- arena and printer ---- */

static void test_arena_alignment_growth_and_vectors(void **state) {
    (void)state;
    ms_arena a;
    ms_arena_init(&a);
    for (int i = 0; i < 1000; i++) {
        char *p = ms_arena_alloc(&a, (size_t)(i % 37) + 1);
        assert_non_null(p);
        assert_int_equal((uintptr_t)p % 16, 0);
        assert_int_equal(p[0], 0);
    }
    void *big = ms_arena_alloc(&a, 100000);
    assert_non_null(big);
    assert_string_equal(ms_arena_sprintf(&a, "%s-%d", "x", 7), "x-7");
    ms_ptr_vec v = {0};
    for (intptr_t i = 0; i < 100; i++)
        assert_int_equal(ms_ptr_vec_push(&a, &v, (void *)i), MS_OK);
    assert_int_equal(v.n, 100);
    assert_ptr_equal(v.items[99], (void *)99);
    ms_alloc_fail_nth(1);
    assert_null(ms_arena_alloc(&a, 1000000));
    ms_arena_free(&a);
    ms_arena_free(NULL);
}

/* Parse `x: int = <expr>;` and print the expression back. */
static char *print_parsed(const char *expr) {
    char src[512];
    snprintf(src, sizeof src, "model m { config { x: int = %s; } }", expr);
    ms_arena a;
    ms_arena_init(&a);
    ms_diags d;
    ms_diags_init(&d, "p.mstar", src, strlen(src), 0);
    ms_ast_model *m = NULL;
    assert_int_equal(ms_dsl_parse(&a, &d, src, strlen(src), &m), MS_OK);
    ms_strbuf b = {0};
    ms_expr_print(&b, ((ms_ast_param *)m->params.items[0])->dflt);
    char *out = strdup(b.data);
    ms_strbuf_free(&b);
    ms_diags_free(&d);
    ms_arena_free(&a);
    return out;
}

static void test_expression_printing_is_canonical(void **state) {
    (void)state;
    static const char *const cases[][2] = {
        {"(a + b) * c", "(a + b) * c"},
        {"a + (b * c)", "a + b * c"},
        {"a - (b - c)", "a - (b - c)"},
        {"(a - b) - c", "a - b - c"},
        {"-(a + 1)", "-(a + 1)"},
        {"- -a", "--a"},
        {"a ? b : c ? d : e", "a ? b : c ? d : e"},
        {"(a ? b : c) ? d : e", "(a ? b : c) ? d : e"},
        {"1e-5 + 10000.0 + 0.5 + 1.5e20", "1e-05 + 10000.0 + 0.5 + 1.5e+20"},
        {"(a == b) == c", "(a == b) == c"},
        {"!(a < b) && c || d", "!(a < b) && c || d"},
        {"a || (b && c)", "a || b && c"},
        {"f(x, k = [1, 2 .. 8])", "f(x, k = [1, 2 .. 8])"},
        {"[a, b] -> c", "[a, b] -> c"},
        {"\"q\\\"x\\n\"", "\"q\\\"x\\n\""},
        {"pos.apply(q, k).x", "pos.apply(q, k).x"},
    };
    for (size_t i = 0; i < MS_ARRAY_LEN(cases); i++) {
        char *once = print_parsed(cases[i][0]);
        assert_string_equal(once, cases[i][1]);
        char *twice = print_parsed(once);
        assert_string_equal(twice, once);
        free(once);
        free(twice);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_golden_malformed_inputs),
        ms_unit_test(test_models_check_clean_and_round_trip),
        ms_unit_test(test_llama_checked_model_structure),
        ms_unit_test(test_missing_file_is_an_io_error),
        ms_unit_test(test_error_limit_stops_and_says_so),
        ms_unit_test(test_deep_nesting_is_an_error_not_a_crash),
        ms_unit_test(test_nul_bytes_and_empty_input),
        ms_unit_test(test_out_of_memory_everywhere),
        ms_unit_test(test_arena_alignment_growth_and_vectors),
        ms_unit_test(test_expression_printing_is_canonical),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
