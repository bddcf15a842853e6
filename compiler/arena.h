/*
 * arena.h - bump allocator for one compilation (CONVENTIONS.md item 5).
 *
 * The AST, symbols, diagnostics text and the checked model are allocated from one ms_arena tied
 * to one compilation and released at once by ms_arena_free; individual objects are never freed.
 * Blocks come from ms_malloc, so tests see every byte and can inject failures.
 *
 * Out of memory: a compiler front end allocates in hundreds of places (every grammar action).
 * Instead of checking each, an arena may be given a jmp_buf (ms_arena_set_oom_jmp): when a block
 * cannot be allocated the arena longjmps there with value 1, and the owner of the jmp_buf (the
 * compile driver) releases everything and returns MS_ERR_OOM. Without a jmp_buf, ms_arena_alloc
 * returns NULL on failure.
 *
 * Usage:
 *     ms_arena a;
 *     ms_arena_init(&a);
 *     char *s = ms_arena_strdup(&a, "hello");
 *     ms_arena_free(&a);            // releases s and everything else
 */
#ifndef MS_ARENA_H
#define MS_ARENA_H

#include <setjmp.h>

#include "ms_base.h"

typedef struct ms_arena_block ms_arena_block;

/* A bump arena. Plain struct so it can live on the stack or inside a session; treat the fields
 * as private. */
typedef struct ms_arena {
    ms_arena_block *head;   /* newest block (allocations bump inside it), chain to older ones */
    size_t used_bytes;      /* payload bytes handed out, for statistics */
    jmp_buf *oom_jmp;       /* where to longjmp on out of memory, or NULL (return NULL) */
} ms_arena;

/* Initialise an empty arena (allocates nothing). */
void ms_arena_init(ms_arena *a);

/* Release every block of the arena; the arena is empty (and reusable) afterwards. NULL is ok. */
void ms_arena_free(ms_arena *a);

/* On out of memory, longjmp(*jb, 1) instead of returning NULL; NULL restores returning NULL.
 * The jmp_buf must stay valid while it is set. */
void ms_arena_set_oom_jmp(ms_arena *a, jmp_buf *jb);

/* Report an out-of-memory found outside the arena (a ms_strbuf that could not grow) the same way
 * as the arena's own: longjmp when a jmp_buf is set, else return. */
void ms_arena_oom(ms_arena *a);

/* `size` bytes, 16-byte aligned, zero-filled. size 0 returns a valid unique pointer.
 * NULL (or longjmp, see above) on out of memory. */
void *ms_arena_alloc(ms_arena *a, size_t size);

/* Copy of `s` / of the first `n` bytes of `s` (NUL-terminated) in the arena. */
char *ms_arena_strdup(ms_arena *a, const char *s);
char *ms_arena_strndup(ms_arena *a, const char *s, size_t n);

/* printf into the arena. */
char *ms_arena_sprintf(ms_arena *a, const char *fmt, ...) MS_PRINTF(2, 3);
char *ms_arena_vsprintf(ms_arena *a, const char *fmt, va_list ap) MS_PRINTF(2, 0);

/*
 * Growable array of pointers in the arena (the old storage is simply abandoned on growth).
 * Usage: ms_ptr_vec v = {0}; ms_ptr_vec_push(a, &v, item); for (int i = 0; i < v.n; i++) v.items[i]
 */
typedef struct ms_ptr_vec {
    void **items;  /* [n] */
    int n;         /* number of items */
    int cap;       /* capacity of items */
} ms_ptr_vec;

/* Append `item`. MS_ERR_OOM when the arena cannot grow (and has no jmp_buf). */
ms_status ms_ptr_vec_push(ms_arena *a, ms_ptr_vec *v, void *item);

#endif /* MS_ARENA_H */
