/*
 * ms_base.h - status codes, error records, assertions and the host allocator hook.
 *
 * Every other module of mstar-c (compiler and runtime) builds on this header.
 *
 * Ownership: ms_* functions borrow their arguments; objects returned by *_init are owned by the
 * caller and released with the matching *_free (every *_free accepts NULL).
 *
 * Two error tiers (CONVENTIONS.md item 3):
 *   - failures the caller can act on return an ms_status (0 = MS_OK, negative = reason) and, when a
 *     caller-owned ms_error is given, fill it through MS_FAIL with a message and the source location;
 *   - broken invariants (bugs) call MS_ASSERT / MS_ABORT, which print file:line, a backtrace, and
 *     abort (after an optional callback).
 * Library code never calls exit(); only a CLI main() does.
 *
 * Usage:
 *     ms_error err = {0};
 *     ms_status st = ms_thing_init(&thing, path, &err);
 *     if (st != MS_OK) { fprintf(stderr, "%s\n", err.msg); return 1; }
 */
#ifndef MS_BASE_H
#define MS_BASE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Symbols shared between our own translation units but not part of the public API. */
#define MS_INTERNAL __attribute__((visibility("hidden")))
#define MS_PRINTF(fmt_idx, arg_idx) __attribute__((format(printf, fmt_idx, arg_idx)))

#define MS_CEIL_DIV(a, b) (((a) + (b) - 1) / (b))
#define MS_MIN(a, b) ((a) < (b) ? (a) : (b))
#define MS_MAX(a, b) ((a) > (b) ? (a) : (b))
#define MS_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* ---- status codes ---- */

/* Result of every fallible public function. ORDER MS_STATUS: keep ms_status_str() in sync. */
typedef enum ms_status {
    MS_OK = 0,
    MS_ERR_OOM = -1,           /* host or device allocation failed */
    MS_ERR_INVALID_ARG = -2,   /* caller passed a value outside the contract */
    MS_ERR_UNSUPPORTED = -3,   /* valid request this build/device cannot serve */
    MS_ERR_CUDA = -4,          /* CUDA runtime or driver call failed */
    MS_ERR_NVRTC = -5,         /* NVRTC compilation failed (log attached to the message) */
    MS_ERR_PARSE = -6,         /* source text (model file, JSON, CLI) did not parse */
    MS_ERR_IO = -7,            /* a file could not be opened, read, mapped or written */
    MS_ERR_FORMAT = -8,        /* a file parsed but its content is inconsistent (checkpoint, tokenizer) */
    MS_ERR_NOT_FOUND = -9,     /* a named thing (tensor, request, label, key) does not exist */
    MS_ERR_CAPACITY = -10,     /* not enough pages / slots / bytes right now; retry later may succeed */
    MS_ERR_STATE = -11,        /* refused in the current state (e.g. offload while a step is in flight) */
    MS_ERR_CUBLAS = -12,       /* cuBLAS call failed */
    MS_ERR_LIMIT = -13,        /* a hard limit was reached (context length, max tokens); not retryable */
    MS_ERR_INTERNAL = -14,     /* an internal check failed in a way we report instead of aborting */
    MS_STATUS_COUNT_ = 15      /* number of codes (for tables); not a status */
} ms_status;

/* Static text of a status code ("ok", "out of memory", ...). Never NULL. */
const char *ms_status_str(ms_status st);

/* ---- error records ---- */

#define MS_ERROR_MSG_MAX 1024

/*
 * Caller-owned failure detail. Fill through MS_FAIL only. `msg` is one line (no trailing newline)
 * that names what failed and where (file name, tensor name, request id, ...), fit for a user.
 */
typedef struct ms_error {
    ms_status code;              /* MS_OK when nothing failed */
    char msg[MS_ERROR_MSG_MAX];  /* NUL-terminated message, truncated to fit; one line: control
                                    bytes of quoted names are escaped (\n, \xHH) */
    const char *file;            /* source file of the MS_FAIL that set it (static string) */
    int line;                    /* its line */
    const char *func;            /* its function (static string) */
} ms_error;

/*
 * Record a failure in `err` (may be NULL: then only the code is returned) and return `code`.
 * Use through MS_FAIL so the location is filled in. A later failure overwrites an earlier one.
 */
ms_status ms_error_set(ms_error *err, ms_status code, const char *file, int line, const char *func,
                       const char *fmt, ...) MS_PRINTF(6, 7);

/* Prefix the existing message of `err` with context ("loading x.safetensors: <old msg>"). */
void ms_error_prefix(ms_error *err, const char *fmt, ...) MS_PRINTF(2, 3);

/* Evaluates to `code` after recording it: `return MS_FAIL(err, MS_ERR_IO, "cannot open %s", p);` */
#define MS_FAIL(err, code, ...) ms_error_set((err), (code), __FILE__, __LINE__, __func__, __VA_ARGS__)

/* Propagate a non-OK status unchanged (the callee already filled the ms_error). */
#define MS_TRY(expr)                   \
    do {                               \
        ms_status ms_try_st_ = (expr); \
        if (ms_try_st_ != MS_OK)       \
            return ms_try_st_;         \
    } while (0)

/* ---- assertions (bugs, not user errors) ---- */

/* Called by ms_abort before aborting; e.g. a test harness or a server flushing logs. */
typedef void (*ms_abort_callback)(const char *message, void *user);
void ms_set_abort_callback(ms_abort_callback cb, void *user);

/* Print "file:line: message" and a backtrace to stderr, run the callback, abort(). */
_Noreturn void ms_abort(const char *file, int line, const char *fmt, ...) MS_PRINTF(3, 4);

#define MS_ABORT(...) ms_abort(__FILE__, __LINE__, __VA_ARGS__)
#define MS_ASSERT(x)                                      \
    do {                                                  \
        if (!(x))                                         \
            ms_abort(__FILE__, __LINE__, "MS_ASSERT(%s) failed", #x); \
    } while (0)

/* ---- host allocation hook ---- */

/*
 * Every host allocation of the project goes through this hook (CONVENTIONS.md item 5), Lua style:
 * ptr == NULL allocates nsize bytes; nsize == 0 frees ptr (of osize bytes) and returns NULL;
 * otherwise reallocates from osize to nsize. Returning NULL for nsize > 0 means out of memory and
 * must leave ptr untouched. The default hook uses malloc/realloc/free.
 */
typedef void *(*ms_alloc_fn)(void *user, void *ptr, size_t osize, size_t nsize);
void ms_set_alloc_fn(ms_alloc_fn fn, void *user);

/*
 * Allocation front ends. Sizes are tracked in a hidden header, so ms_free needs no size. Each
 * returns NULL on failure (or on an injected failure); ms_free(NULL) is a no-op. ms_calloc
 * zero-fills and checks n * size for overflow. ms_realloc keeps the old block on failure.
 */
void *ms_malloc(size_t size);
void *ms_calloc(size_t n, size_t size);
void *ms_realloc(void *ptr, size_t size);
void ms_free(void *ptr);
char *ms_strdup(const char *s);
char *ms_strndup(const char *s, size_t n);
/* printf into a fresh ms_malloc'd string (NULL on OOM). */
char *ms_asprintf(const char *fmt, ...) MS_PRINTF(1, 2);

/*
 * Grow a dynamic array so it holds at least `need` elements of `elem` bytes: *data is reallocated
 * (capacity doubles, minimum 8) and *cap updated. Returns MS_ERR_OOM and leaves both unchanged on
 * failure. Usage: MS_TRY(ms_grow((void **)&v, &cap, n + 1, sizeof *v));
 */
ms_status ms_grow(void **data, size_t *cap, size_t need, size_t elem);

/*
 * Allocation statistics and fault injection, used by tests to check for leaks and to drive error
 * paths (CONVENTIONS.md item 16; Lua's Memcontrol.failnext). Always compiled in: the cost is one
 * atomic add per allocation, and it lets every test binary use the release library unchanged.
 */
typedef struct ms_alloc_stats {
    int64_t live_blocks;   /* blocks allocated and not yet freed */
    int64_t live_bytes;    /* their total payload bytes */
    int64_t total_allocs;  /* allocations attempted since start (successful or not) */
} ms_alloc_stats;
ms_alloc_stats ms_alloc_get_stats(void);
/* Make the n-th next allocation (1 = the very next one) fail; 0 disables. */
void ms_alloc_fail_nth(int64_t n);

/* ---- logging ---- */

typedef enum ms_log_level {
    MS_LOG_DEBUG = 0,
    MS_LOG_INFO = 1,
    MS_LOG_WARN = 2,
    MS_LOG_ERROR = 3,
    MS_LOG_LEVEL_COUNT
} ms_log_level;
/* Messages below this level are dropped (default MS_LOG_INFO; env MSTAR_LOG=debug|info|warn|error). */
void ms_log_set_level(ms_log_level level);
/* One line to stderr: "mstar: warn: ...". */
void ms_log(ms_log_level level, const char *fmt, ...) MS_PRINTF(2, 3);

/*
 * Whether `name` matches `pat`, where '*' matches any run of characters (dots and slashes
 * included) and every other character itself ("visual.*" matches "visual.blocks.0.attn.qkv");
 * the rule of a model file's weights `ignore` patterns, checked by mstarc and the engine alike.
 * Iterative, backtracking only to the last '*' (linear in practice, no recursion).
 */
bool ms_glob_match(const char *pat, const char *name);

#ifdef __cplusplus
}
#endif
#endif /* MS_BASE_H */
