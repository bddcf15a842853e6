/*
 * arena.c - bump allocator for one compilation. See arena.h.
 *
 * Blocks are at least 16 KiB (bigger for big requests) and chained newest first. Every returned
 * pointer is 16-byte aligned and zero-filled.
 */
#include "arena.h"

#include <stdio.h>
#include <string.h>

#define MS_ARENA_BLOCK_MIN 16384
#define MS_ARENA_ALIGN 16

struct ms_arena_block {
    ms_arena_block *prev;   /* older block */
    size_t cap;             /* payload bytes of this block */
    size_t used;            /* bytes of the payload already handed out */
    _Alignas(16) unsigned char data[]; /* [cap] */
};

void ms_arena_init(ms_arena *a) {
    a->head = NULL;
    a->used_bytes = 0;
    a->oom_jmp = NULL;
}

void ms_arena_free(ms_arena *a) {
    if (a == NULL)
        return;
    ms_arena_block *b = a->head;
    while (b != NULL) {
        ms_arena_block *prev = b->prev;
        ms_free(b);
        b = prev;
    }
    a->head = NULL;
    a->used_bytes = 0;
}

void ms_arena_set_oom_jmp(ms_arena *a, jmp_buf *jb) { a->oom_jmp = jb; }

static void *arena_oom(ms_arena *a) {
    if (a->oom_jmp != NULL)
        longjmp(*a->oom_jmp, 1);
    return NULL;
}

void ms_arena_oom(ms_arena *a) { (void)arena_oom(a); }

void *ms_arena_alloc(ms_arena *a, size_t size) {
    size_t need = (size + MS_ARENA_ALIGN - 1) & ~(size_t)(MS_ARENA_ALIGN - 1);
    if (need < size)
        return arena_oom(a);
    if (need == 0)
        need = MS_ARENA_ALIGN;
    ms_arena_block *b = a->head;
    if (b == NULL || b->cap - b->used < need) {
        size_t cap = need > MS_ARENA_BLOCK_MIN ? need : MS_ARENA_BLOCK_MIN;
        if (cap > SIZE_MAX - sizeof(ms_arena_block))
            return arena_oom(a);
        ms_arena_block *nb = ms_malloc(sizeof(ms_arena_block) + cap);
        if (nb == NULL)
            return arena_oom(a);
        nb->prev = a->head;
        nb->cap = cap;
        nb->used = 0;
        a->head = nb;
        b = nb;
    }
    void *p = b->data + b->used;
    b->used += need;
    a->used_bytes += need;
    memset(p, 0, need);
    return p;
}

char *ms_arena_strndup(ms_arena *a, const char *s, size_t n) {
    char *p = ms_arena_alloc(a, n + 1);
    if (p == NULL)
        return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

char *ms_arena_strdup(ms_arena *a, const char *s) { return ms_arena_strndup(a, s, strlen(s)); }

char *ms_arena_vsprintf(ms_arena *a, const char *fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap2);
    va_end(ap2);
    if (n < 0)
        n = 0;
    char *p = ms_arena_alloc(a, (size_t)n + 1);
    if (p == NULL)
        return NULL;
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    return p;
}

char *ms_arena_sprintf(ms_arena *a, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char *p = ms_arena_vsprintf(a, fmt, ap);
    va_end(ap);
    return p;
}

ms_status ms_ptr_vec_push(ms_arena *a, ms_ptr_vec *v, void *item) {
    if (v->n == v->cap) {
        int ncap = v->cap < 4 ? 4 : v->cap * 2;
        void **items = ms_arena_alloc(a, (size_t)ncap * sizeof *items);
        if (items == NULL)
            return MS_ERR_OOM;
        if (v->n > 0)
            memcpy(items, v->items, (size_t)v->n * sizeof *items);
        v->items = items;
        v->cap = ncap;
    }
    v->items[v->n++] = item;
    return MS_OK;
}
