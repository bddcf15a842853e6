/*
 * test_prefix_cache.c - the prefix cache over a host page arena: chained keys, the last-token
 * rule at page boundaries, owner counts through insert / lookup / release / evict, LRU order,
 * a full table, a randomized model check of owner counts after every operation, and concurrent
 * use (also run under TSan).
 */
#include "ms_test.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "device.h"
#include "ms_test_impl.h"
#include "page_arena.h"
#include "prefix_cache.h"

enum { PS = 4 };

typedef struct fx {
    ms_device *dev;
    ms_page_arena *arena;
} fx;

static fx make(int32_t n_pages) {
    ms_error err = {0};
    fx f = {0};
    assert_int_equal(ms_device_host_init(0, &f.dev, &err), MS_OK);
    ms_page_arena_config c = {.n_layers = 1, .n_pages = n_pages, .page_size = PS,
                              .n_kv_heads = 1, .head_dim = 2, .elem_bytes = 2, .name = "t"};
    assert_int_equal(ms_page_arena_init(&c, f.dev, &f.arena, &err), MS_OK);
    return f;
}

static void unmake(fx *f) {
    ms_page_arena_free(f->arena);
    ms_device_free(f->dev);
}

static ms_prefix_key root_of(const char *model) {
    ms_error err = {0};
    ms_prefix_fingerprint fp = {.model = model, .weights = "w", .kv_dtype = "bf16",
                                .page_size = PS, .positions = "rope"};
    ms_prefix_key k;
    assert_int_equal(ms_prefix_root(&fp, &k, &err), MS_OK);
    return k;
}

/* Seal the full pages of tokens[0..n) as one request would: take pages, insert each under its
 * chained key, keep the request's own owner in pages[]. Returns the number of full pages. */
static int32_t seal(ms_prefix_cache *c, ms_page_arena *a, ms_prefix_key root, const int32_t *tok,
                    int32_t n, int32_t *pages) {
    ms_error err = {0};
    int32_t full = n / PS;
    assert_int_equal(ms_page_arena_acquire(a, full, pages), MS_OK);
    ms_prefix_key k = root;
    for (int32_t i = 0; i < full; i++) {
        k = ms_prefix_page_key(k, tok + i * PS, PS, NULL, 0);
        int32_t listed = -2;
        assert_int_equal(ms_prefix_cache_insert(c, k, pages[i], &listed, &err), MS_OK);
        assert_int_equal(listed, pages[i]);
    }
    return full;
}

static void test_keys_chain_and_fingerprint(void **state) {
    (void)state;
    ms_error err = {0};
    ms_prefix_key r1 = root_of("llama"), r2 = root_of("qwen3");
    assert_false(r1.lo == r2.lo && r1.hi == r2.hi);
    ms_prefix_fingerprint fp = {.model = "llama", .weights = "w", .kv_dtype = "bf16",
                                .page_size = 8, .positions = "rope"};
    ms_prefix_key r3;
    assert_int_equal(ms_prefix_root(&fp, &r3, &err), MS_OK);
    assert_false(r1.lo == r3.lo && r1.hi == r3.hi); /* page size is part of the root */
    fp.page_size = 0;
    assert_int_equal(ms_prefix_root(&fp, &r3, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "page_size"));
    /* the same tokens under different parents, or with different extra bytes, differ */
    int32_t t[PS] = {1, 2, 3, 4};
    ms_prefix_key a = ms_prefix_page_key(r1, t, PS, NULL, 0);
    ms_prefix_key b = ms_prefix_page_key(r2, t, PS, NULL, 0);
    ms_prefix_key a2 = ms_prefix_page_key(r1, t, PS, NULL, 0);
    ms_prefix_key role = ms_prefix_page_key(r1, t, PS, "cfg", 3);
    assert_true(a.lo == a2.lo && a.hi == a2.hi);
    assert_false(a.lo == b.lo && a.hi == b.hi);
    assert_false(a.lo == role.lo && a.hi == role.hi);
    /* length-prefixed strings: ("ab", "c") is not ("a", "bc") */
    ms_prefix_fingerprint x = {.model = "ab", .weights = "c", .page_size = PS};
    ms_prefix_fingerprint y = {.model = "a", .weights = "bc", .page_size = PS};
    ms_prefix_key kx, ky;
    assert_int_equal(ms_prefix_root(&x, &kx, &err), MS_OK);
    assert_int_equal(ms_prefix_root(&y, &ky, &err), MS_OK);
    assert_false(kx.lo == ky.lo && kx.hi == ky.hi);
}

static void test_lookup_leaves_the_last_token(void **state) {
    (void)state;
    ms_error err = {0};
    fx f = make(32);
    ms_prefix_cache *c = NULL;
    assert_int_equal(ms_prefix_cache_init(f.arena, 16, &c, &err), MS_OK);
    ms_prefix_key root = root_of("llama");
    int32_t tok[12];
    for (int i = 0; i < 12; i++)
        tok[i] = 100 + i;
    int32_t own[3];
    assert_int_equal(seal(c, f.arena, root, tok, 12, own), 3);
    int32_t got[4];
    ms_prefix_key keys[4];
    /* 12 tokens = exactly 3 pages: only 2 may hit, the last token is computed (sglang #22819) */
    assert_int_equal(ms_prefix_cache_lookup(c, root, tok, 12, NULL, 4, got, keys), 2);
    assert_int_equal(got[0], own[0]);
    assert_int_equal(got[1], own[1]);
    assert_int_equal(ms_page_arena_owners(f.arena, own[0]), 3); /* request, cache, lookup */
    assert_int_equal(ms_page_arena_release(f.arena, got, 2, &err), MS_OK);
    /* 13 tokens: all 3 full pages hit */
    int32_t tok13[13];
    memcpy(tok13, tok, sizeof tok);
    tok13[12] = 7;
    assert_int_equal(ms_prefix_cache_lookup(c, root, tok13, 13, NULL, 4, got, NULL), 3);
    assert_int_equal(ms_page_arena_release(f.arena, got, 3, &err), MS_OK);
    /* max_pages caps, one token never hits, a different first page misses everything */
    assert_int_equal(ms_prefix_cache_lookup(c, root, tok13, 13, NULL, 1, got, NULL), 1);
    assert_int_equal(ms_page_arena_release(f.arena, got, 1, &err), MS_OK);
    assert_int_equal(ms_prefix_cache_lookup(c, root, tok, 1, NULL, 4, got, NULL), 0);
    int32_t other[13];
    memcpy(other, tok13, sizeof other);
    other[0] = 5;
    assert_int_equal(ms_prefix_cache_lookup(c, root, other, 13, NULL, 4, got, NULL), 0);
    /* another root (other weights) misses */
    assert_int_equal(ms_prefix_cache_lookup(c, root_of("qwen3"), tok13, 13, NULL, 4, got, NULL), 0);
    ms_prefix_stats st = ms_prefix_cache_stats(c);
    assert_int_equal(st.hit_pages, 6);
    assert_int_equal(st.hit_tokens, 6 * PS);
    assert_int_equal(st.inserts, 3);
    assert_int_equal(st.entries, 3);
    assert_int_equal(st.unreferenced, 0); /* the sealing request still holds them */
    assert_int_equal(ms_page_arena_release(f.arena, own, 3, &err), MS_OK);
    st = ms_prefix_cache_stats(c);
    assert_int_equal(st.unreferenced, 3);
    assert_int_equal(ms_page_arena_num_free(f.arena), 31 - 3); /* cached pages stay out */
    ms_prefix_cache_free(c);
    assert_int_equal(ms_page_arena_num_free(f.arena), 31);
    unmake(&f);
}

static void test_extra_bytes_separate_roles(void **state) {
    (void)state;
    ms_error err = {0};
    fx f = make(16);
    ms_prefix_cache *c = NULL;
    assert_int_equal(ms_prefix_cache_init(f.arena, 8, &c, &err), MS_OK);
    ms_prefix_key root = root_of("llama");
    int32_t tok[5] = {1, 2, 3, 4, 5};
    int32_t p;
    assert_int_equal(ms_page_arena_acquire(f.arena, 1, &p), MS_OK);
    ms_prefix_key k = ms_prefix_page_key(root, tok, PS, "uncond", 6);
    int32_t listed;
    assert_int_equal(ms_prefix_cache_insert(c, k, p, &listed, &err), MS_OK);
    int32_t got[1];
    /* the main stream's lookup (no extra) does not see the uncond stream's page */
    assert_int_equal(ms_prefix_cache_lookup(c, root, tok, 5, NULL, 1, got, NULL), 0);
    ms_prefix_extra ex[1] = {{"uncond", 6}};
    assert_int_equal(ms_prefix_cache_lookup(c, root, tok, 5, ex, 1, got, NULL), 1);
    assert_int_equal(got[0], p);
    int32_t rel[2] = {p, p};
    assert_int_equal(ms_page_arena_release(f.arena, rel, 2, &err), MS_OK);
    ms_prefix_cache_free(c);
    assert_int_equal(ms_page_arena_num_free(f.arena), 15);
    unmake(&f);
}

static void test_duplicate_insert_and_bad_pages(void **state) {
    (void)state;
    ms_error err = {0};
    fx f = make(16);
    ms_prefix_cache *c = NULL;
    assert_int_equal(ms_prefix_cache_init(f.arena, 8, &c, &err), MS_OK);
    ms_prefix_key root = root_of("llama"), k = ms_prefix_page_key(root, (int32_t[]){1, 2, 3, 4},
                                                                  PS, NULL, 0);
    int32_t p[2];
    assert_int_equal(ms_page_arena_acquire(f.arena, 2, p), MS_OK);
    int32_t listed;
    assert_int_equal(ms_prefix_cache_insert(c, k, p[0], &listed, &err), MS_OK);
    assert_int_equal(listed, p[0]);
    /* a second request sealed the same prefix into its own page: told which page is listed,
       its page gets no cache owner */
    assert_int_equal(ms_prefix_cache_insert(c, k, p[1], &listed, &err), MS_OK);
    assert_int_equal(listed, p[0]);
    assert_int_equal(ms_page_arena_owners(f.arena, p[1]), 1);
    ms_prefix_key k2 = ms_prefix_page_key(k, (int32_t[]){5, 6, 7, 8}, PS, NULL, 0);
    assert_int_equal(ms_prefix_cache_insert(c, k2, MS_SINK_PAGE, &listed, &err),
                     MS_ERR_INVALID_ARG);
    assert_int_equal(listed, -1);
    assert_int_equal(ms_prefix_cache_insert(c, k2, 9, &listed, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "page 9"));
    assert_int_equal(ms_prefix_cache_insert(c, k2, 99, &listed, &err), MS_ERR_INVALID_ARG);
    assert_int_equal(ms_prefix_cache_stats(c).entries, 1);
    assert_int_equal(ms_page_arena_release(f.arena, p, 2, &err), MS_OK);
    ms_prefix_cache_free(c);
    assert_int_equal(ms_page_arena_num_free(f.arena), 15);
    unmake(&f);
}

static void test_evict_lru_skips_referenced_and_full_table(void **state) {
    (void)state;
    ms_error err = {0};
    fx f = make(16);
    ms_prefix_cache *c = NULL;
    assert_int_equal(ms_prefix_cache_init(f.arena, 3, &c, &err), MS_OK);
    ms_prefix_key root = root_of("llama");
    int32_t p[4];
    assert_int_equal(ms_page_arena_acquire(f.arena, 4, p), MS_OK);
    ms_prefix_key k[4];
    int32_t listed;
    for (int i = 0; i < 3; i++) {
        k[i] = ms_prefix_page_key(root, (int32_t[]){i, i, i, i}, PS, NULL, 0);
        assert_int_equal(ms_prefix_cache_insert(c, k[i], p[i], &listed, &err), MS_OK);
    }
    /* every listed page is referenced (owners 2): a 4th insert is not listed, nothing evicted */
    k[3] = ms_prefix_page_key(root, (int32_t[]){9, 9, 9, 9}, PS, NULL, 0);
    assert_int_equal(ms_prefix_cache_insert(c, k[3], p[3], &listed, &err), MS_OK);
    assert_int_equal(listed, -1);
    assert_int_equal(ms_prefix_cache_evict(c, 5), 0);
    /* release p1 and p0 (in that order), then touch k0 by lookup: recency k2 (ref), k1, k0 */
    assert_int_equal(ms_page_arena_release(f.arena, &p[1], 1, &err), MS_OK);
    assert_int_equal(ms_page_arena_release(f.arena, &p[0], 1, &err), MS_OK);
    int32_t got, t0[5] = {0, 0, 0, 0, 1};
    assert_int_equal(ms_prefix_cache_lookup(c, root, t0, 5, NULL, 1, &got, NULL), 1);
    assert_int_equal(ms_page_arena_release(f.arena, &got, 1, &err), MS_OK);
    int32_t order[3];
    assert_int_equal(ms_prefix_cache_pages(c, order, 3), 3);
    assert_int_equal(order[0], p[1]);
    assert_int_equal(order[1], p[2]);
    assert_int_equal(order[2], p[0]);
    /* a full table evicts the least recently used unreferenced page (k1), not the referenced k2 */
    assert_int_equal(ms_prefix_cache_insert(c, k[3], p[3], &listed, &err), MS_OK);
    assert_int_equal(listed, p[3]);
    assert_false(ms_prefix_cache_contains(c, k[1], NULL));
    assert_true(ms_prefix_cache_contains(c, k[2], NULL));
    assert_int_equal(ms_page_arena_owners(f.arena, p[1]), 0); /* back on the free list */
    assert_int_equal(ms_prefix_cache_stats(c).evictions, 1);
    /* explicit eviction under pressure takes only unreferenced pages: k0 */
    assert_int_equal(ms_prefix_cache_evict(c, 10), 1);
    assert_true(ms_prefix_cache_contains(c, k[2], NULL));
    assert_true(ms_prefix_cache_contains(c, k[3], NULL));
    int32_t last[2] = {p[2], p[3]};
    assert_int_equal(ms_page_arena_release(f.arena, last, 2, &err), MS_OK);
    ms_prefix_cache_free(c);
    assert_int_equal(ms_page_arena_num_free(f.arena), 15);
    unmake(&f);
}

/* ---- randomized: share / release / evict against a model of owner counts ---- */

enum { NP = 40, MAXE = 24, NREQ = 6 };

typedef struct req {
    int32_t pages[8];
    int32_t n;
} req;

static void test_random_owner_counts(void **state) {
    (void)state;
    ms_error err = {0};
    fx f = make(NP);
    ms_prefix_cache *c = NULL;
    assert_int_equal(ms_prefix_cache_init(f.arena, MAXE, &c, &err), MS_OK);
    ms_prefix_key root = root_of("llama");
    req reqs[NREQ] = {0};
    int32_t model[NP] = {0}; /* expected owners: requests + cache */
    bool cached[NP] = {false};
    srand(12345);
    for (int step = 0; step < 20000; step++) {
        int op = rand() % 4, r = rand() % NREQ;
        req *q = &reqs[r];
        if (op == 0 && q->n == 0) {
            /* a prompt from a small alphabet of pages (prefixes repeat), looked up then sealed */
            int32_t np = 1 + rand() % 6, tok[8 * PS + 1];
            for (int32_t i = 0; i < np * PS; i++)
                tok[i] = (i / PS < 2) ? (i / PS) : rand() % 3;
            tok[np * PS] = 1;
            int32_t got[8];
            ms_prefix_key keys[8];
            int32_t hit = ms_prefix_cache_lookup(c, root, tok, np * PS + 1, NULL, 8, got, keys);
            for (int32_t i = 0; i < hit; i++) {
                assert_true(cached[got[i]]);
                model[got[i]]++;
                q->pages[q->n++] = got[i];
            }
            ms_prefix_key k = hit > 0 ? keys[hit - 1] : root;
            for (int32_t i = hit; i < np; i++) {
                int32_t p;
                if (ms_page_arena_acquire(f.arena, 1, &p) != MS_OK) {
                    if (ms_prefix_cache_evict(c, 1) == 0)
                        break; /* memory full of referenced pages: the prompt stops here */
                    for (int32_t j = 0; j < NP; j++)
                        if (cached[j] && model[j] == 1 && ms_page_arena_owners(f.arena, j) == 0) {
                            cached[j] = false; /* the one evicted */
                            model[j] = 0;
                        }
                    assert_int_equal(ms_page_arena_acquire(f.arena, 1, &p), MS_OK);
                }
                assert_int_equal(model[p], 0);
                model[p] = 1;
                q->pages[q->n++] = p;
                k = ms_prefix_page_key(k, tok + i * PS, PS, NULL, 0);
                int32_t listed;
                int32_t before_free = ms_page_arena_num_free(f.arena);
                assert_int_equal(ms_prefix_cache_insert(c, k, p, &listed, &err), MS_OK);
                if (listed == p) {
                    cached[p] = true;
                    model[p]++;
                }
                /* an insert into a full table may have evicted one unreferenced page */
                if (ms_page_arena_num_free(f.arena) > before_free)
                    for (int32_t j = 0; j < NP; j++)
                        if (cached[j] && model[j] == 1 && ms_page_arena_owners(f.arena, j) == 0) {
                            cached[j] = false;
                            model[j] = 0;
                        }
            }
        } else if (op == 1 && q->n > 0) {
            assert_int_equal(ms_page_arena_release(f.arena, q->pages, q->n, &err), MS_OK);
            for (int32_t i = 0; i < q->n; i++)
                model[q->pages[i]]--;
            q->n = 0;
        } else if (op == 2) {
            int32_t want = rand() % 3, unref = 0;
            for (int32_t j = 0; j < NP; j++)
                unref += cached[j] && model[j] == 1;
            int32_t got = ms_prefix_cache_evict(c, want);
            assert_int_equal(got, want < unref ? want : unref);
            for (int32_t j = 0; j < NP; j++)
                if (cached[j] && ms_page_arena_owners(f.arena, j) == 0) {
                    cached[j] = false;
                    model[j] = 0;
                }
        }
        /* after every operation: owners equal the model, referenced pages are never evicted */
        int32_t entries = 0;
        for (int32_t j = 1; j < NP; j++) {
            assert_int_equal(ms_page_arena_owners(f.arena, j), model[j]);
            entries += cached[j];
        }
        assert_int_equal(ms_prefix_cache_stats(c).entries, entries);
    }
    for (int r = 0; r < NREQ; r++)
        if (reqs[r].n > 0)
            assert_int_equal(ms_page_arena_release(f.arena, reqs[r].pages, reqs[r].n, &err),
                             MS_OK);
    ms_prefix_stats st = ms_prefix_cache_stats(c);
    assert_true(st.hit_pages > 0 && st.evictions > 0);
    ms_prefix_cache_free(c);
    assert_int_equal(ms_page_arena_num_free(f.arena), NP - 1);
    unmake(&f);
}

/* ---- threads (TSan) ---- */

typedef struct worker {
    ms_prefix_cache *c;
    ms_page_arena *a;
    ms_prefix_key root;
    int id;
} worker;

static void *work(void *arg) {
    worker *w = arg;
    ms_error err = {0};
    for (int it = 0; it < 300; it++) {
        int32_t tok[3 * PS + 1];
        for (int i = 0; i < 3 * PS + 1; i++)
            tok[i] = (i < PS) ? 1 : (it + w->id + i) % 4;
        int32_t got[3];
        ms_prefix_key keys[3];
        int32_t hit = ms_prefix_cache_lookup(w->c, w->root, tok, 3 * PS + 1, NULL, 3, got, keys);
        ms_prefix_key k = hit > 0 ? keys[hit - 1] : w->root;
        int32_t mine[3], n = 0;
        for (int32_t i = hit; i < 3; i++) {
            int32_t p;
            if (ms_page_arena_acquire(w->a, 1, &p) != MS_OK && (ms_prefix_cache_evict(w->c, 1) == 0 ||
                                                               ms_page_arena_acquire(w->a, 1, &p) != MS_OK))
                break;
            mine[n++] = p;
            k = ms_prefix_page_key(k, tok + i * PS, PS, NULL, 0);
            int32_t listed;
            if (ms_prefix_cache_insert(w->c, k, p, &listed, &err) != MS_OK)
                return (void *)1;
        }
        if (hit > 0 && ms_page_arena_release(w->a, got, hit, &err) != MS_OK)
            return (void *)1;
        if (n > 0 && ms_page_arena_release(w->a, mine, n, &err) != MS_OK)
            return (void *)1;
    }
    return NULL;
}

static void test_concurrent_use(void **state) {
    (void)state;
    ms_error err = {0};
    fx f = make(64);
    ms_prefix_cache *c = NULL;
    assert_int_equal(ms_prefix_cache_init(f.arena, 32, &c, &err), MS_OK);
    pthread_t th[4];
    worker w[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (worker){c, f.arena, root_of("llama"), i};
        assert_int_equal(pthread_create(&th[i], NULL, work, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        void *rc;
        pthread_join(th[i], &rc);
        assert_null(rc);
    }
    ms_prefix_stats st = ms_prefix_cache_stats(c);
    assert_int_equal(st.unreferenced, st.entries); /* every request let go */
    ms_prefix_cache_free(c);
    assert_int_equal(ms_page_arena_num_free(f.arena), 63);
    unmake(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_keys_chain_and_fingerprint),
        ms_unit_test(test_lookup_leaves_the_last_token),
        ms_unit_test(test_extra_bytes_separate_roles),
        ms_unit_test(test_duplicate_insert_and_bad_pages),
        ms_unit_test(test_evict_lru_skips_referenced_and_full_table),
        ms_unit_test(test_random_owner_counts),
        ms_unit_test(test_concurrent_use),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
