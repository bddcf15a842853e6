/*
 * base.c - status strings, error records, aborts with backtraces, the allocator hook, logging.
 *
 * Constraints: no allocation on the abort path; the allocation counters are atomics so any thread
 * may allocate; the hidden size header keeps 16-byte alignment of every returned block.
 */
#include "ms_base.h"

#include <execinfo.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- status ---- */

const char *ms_status_str(ms_status st) {
    /* ORDER MS_STATUS */
    static const char *const names[MS_STATUS_COUNT_] = {
        "ok",
        "out of memory",
        "invalid argument",
        "unsupported",
        "CUDA error",
        "NVRTC compilation error",
        "parse error",
        "I/O error",
        "bad file format",
        "not found",
        "capacity exhausted",
        "refused in current state",
        "cuBLAS error",
        "limit reached",
        "internal error",
    };
    int idx = -(int)st;
    if (idx < 0 || idx >= MS_STATUS_COUNT_)
        return "unknown status";
    return names[idx];
}

/* ---- errors ---- */

/* Copy src into dst (cap bytes, NUL included) with control bytes and DEL escaped C-style (\n,
 * \r, \t, \xHH): a message is one line whatever a file name, tensor name or prompt it quotes
 * holds (a shard called "a\nb" in a weight map). Truncated to fit, never mid-escape. */
static void error_escape(char *dst, size_t cap, const char *src) {
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)src; *p != '\0'; p++) {
        char esc[5];
        size_t k;
        if (*p == '\n' || *p == '\r' || *p == '\t') {
            esc[0] = '\\';
            esc[1] = *p == '\n' ? 'n' : *p == '\r' ? 'r' : 't';
            k = 2;
        } else if (*p < 0x20 || *p == 0x7f) {
            snprintf(esc, sizeof esc, "\\x%02x", (unsigned)*p);
            k = 4;
        } else {
            esc[0] = (char)*p;
            k = 1;
        }
        if (n + k >= cap)
            break;
        memcpy(dst + n, esc, k);
        n += k;
    }
    dst[n] = '\0';
}

ms_status ms_error_set(ms_error *err, ms_status code, const char *file, int line, const char *func,
                       const char *fmt, ...) {
    if (err == NULL)
        return code;
    err->code = code;
    err->file = file;
    err->line = line;
    err->func = func;
    va_list ap;
    va_start(ap, fmt);
    char raw[MS_ERROR_MSG_MAX];
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    error_escape(err->msg, sizeof err->msg, raw);
    return code;
}

void ms_error_prefix(ms_error *err, const char *fmt, ...) {
    if (err == NULL)
        return;
    char raw[MS_ERROR_MSG_MAX], prefix[MS_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    error_escape(prefix, sizeof prefix, raw);
    /* Truncation is intended: the message keeps as much of the prefix and old text as fits. */
    size_t plen = strlen(prefix);
    size_t olen = strnlen(err->msg, sizeof err->msg - 1);
    if (plen > sizeof err->msg - 1)
        plen = sizeof err->msg - 1;
    if (olen > sizeof err->msg - 1 - plen)
        olen = sizeof err->msg - 1 - plen;
    memmove(err->msg + plen, err->msg, olen);
    memcpy(err->msg, prefix, plen);
    err->msg[plen + olen] = '\0';
}

/* ---- abort ---- */

static ms_abort_callback g_abort_cb;
static void *g_abort_user;

void ms_set_abort_callback(ms_abort_callback cb, void *user) {
    g_abort_cb = cb;
    g_abort_user = user;
}

_Noreturn void ms_abort(const char *file, int line, const char *fmt, ...) {
    char msg[MS_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s:%d: %s\n", file, line, msg);
    void *frames[64];
    int n = backtrace(frames, (int)MS_ARRAY_LEN(frames));
    backtrace_symbols_fd(frames, n, STDERR_FILENO);
    if (g_abort_cb != NULL)
        g_abort_cb(msg, g_abort_user);
    abort();
}

/* ---- allocation ---- */

static void *default_alloc(void *user, void *ptr, size_t osize, size_t nsize) {
    (void)user;
    (void)osize;
    if (nsize == 0) {
        free(ptr);
        return NULL;
    }
    return realloc(ptr, nsize);
}

static ms_alloc_fn g_alloc = default_alloc;
static void *g_alloc_user;
static atomic_llong g_live_blocks;
static atomic_llong g_live_bytes;
static atomic_llong g_total_allocs;
static atomic_llong g_fail_countdown;

void ms_set_alloc_fn(ms_alloc_fn fn, void *user) {
    g_alloc = fn != NULL ? fn : default_alloc;
    g_alloc_user = user;
}

ms_alloc_stats ms_alloc_get_stats(void) {
    ms_alloc_stats s = {
        .live_blocks = atomic_load(&g_live_blocks),
        .live_bytes = atomic_load(&g_live_bytes),
        .total_allocs = atomic_load(&g_total_allocs),
    };
    return s;
}

void ms_alloc_fail_nth(int64_t n) { atomic_store(&g_fail_countdown, n); }

/* True when an injected failure is due for this allocation. */
static bool inject_failure(void) {
    atomic_fetch_add(&g_total_allocs, 1);
    long long c = atomic_load(&g_fail_countdown);
    while (c > 0) {
        if (atomic_compare_exchange_weak(&g_fail_countdown, &c, c - 1))
            return c == 1;
    }
    return false;
}

/* Hidden header in front of every block: the payload size, padded to keep 16-byte alignment. */
typedef union ms_block_header {
    size_t size;
    max_align_t align_;
} ms_block_header;

void *ms_realloc(void *ptr, size_t size) {
    if (size == 0) {
        ms_free(ptr);
        return NULL;
    }
    if (size > SIZE_MAX - sizeof(ms_block_header))
        return NULL;
    if (inject_failure())
        return NULL;
    ms_block_header *old = ptr != NULL ? (ms_block_header *)ptr - 1 : NULL;
    size_t osize = old != NULL ? old->size : 0;
    ms_block_header *h = g_alloc(g_alloc_user, old, old != NULL ? osize + sizeof *old : 0,
                                 size + sizeof *h);
    if (h == NULL)
        return NULL;
    h->size = size;
    if (old == NULL)
        atomic_fetch_add(&g_live_blocks, 1);
    atomic_fetch_add(&g_live_bytes, (long long)size - (long long)osize);
    return h + 1;
}

void *ms_malloc(size_t size) { return ms_realloc(NULL, size == 0 ? 1 : size); }

void *ms_calloc(size_t n, size_t size) {
    if (size != 0 && n > SIZE_MAX / size)
        return NULL;
    size_t total = n * size;
    void *p = ms_malloc(total);
    if (p != NULL)
        memset(p, 0, total == 0 ? 1 : total);
    return p;
}

void ms_free(void *ptr) {
    if (ptr == NULL)
        return;
    ms_block_header *h = (ms_block_header *)ptr - 1;
    size_t size = h->size;
    atomic_fetch_sub(&g_live_blocks, 1);
    atomic_fetch_sub(&g_live_bytes, (long long)size);
    g_alloc(g_alloc_user, h, size + sizeof *h, 0);
}

char *ms_strndup(const char *s, size_t n) {
    size_t len = strnlen(s, n);
    char *d = ms_malloc(len + 1);
    if (d == NULL)
        return NULL;
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}

char *ms_strdup(const char *s) { return ms_strndup(s, SIZE_MAX); }

char *ms_asprintf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return NULL;
    char *s = ms_malloc((size_t)n + 1);
    if (s == NULL)
        return NULL;
    va_start(ap, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return s;
}

ms_status ms_grow(void **data, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap)
        return MS_OK;
    size_t ncap = *cap < 8 ? 8 : *cap;
    while (ncap < need) {
        if (ncap > SIZE_MAX / 2)
            return MS_ERR_OOM;
        ncap *= 2;
    }
    if (elem != 0 && ncap > SIZE_MAX / elem)
        return MS_ERR_OOM;
    void *p = ms_realloc(*data, ncap * elem);
    if (p == NULL)
        return MS_ERR_OOM;
    *data = p;
    *cap = ncap;
    return MS_OK;
}

/* ---- logging ---- */

static int g_log_level = -1; /* -1: not yet read from MSTAR_LOG */

void ms_log_set_level(ms_log_level level) { g_log_level = (int)level; }

static int log_level(void) {
    if (g_log_level < 0) {
        const char *env = getenv("MSTAR_LOG");
        int lvl = MS_LOG_INFO;
        if (env != NULL) {
            if (strcmp(env, "debug") == 0)
                lvl = MS_LOG_DEBUG;
            else if (strcmp(env, "warn") == 0)
                lvl = MS_LOG_WARN;
            else if (strcmp(env, "error") == 0)
                lvl = MS_LOG_ERROR;
        }
        g_log_level = lvl;
    }
    return g_log_level;
}

void ms_log(ms_log_level level, const char *fmt, ...) {
    if ((int)level < log_level())
        return;
    static const char *const names[MS_LOG_LEVEL_COUNT] = {"debug", "info", "warn", "error"};
    char msg[MS_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "mstar: %s: %s\n", names[level], msg);
}

bool ms_glob_match(const char *pat, const char *name) {
    const char *star = NULL, *retry = NULL;
    while (*name != '\0') {
        if (*pat == '*') {
            star = pat++;
            retry = name;
        } else if (*pat == *name) {
            pat++;
            name++;
        } else if (star != NULL) {
            pat = star + 1;
            name = ++retry;
        } else {
            return false;
        }
    }
    while (*pat == '*')
        pat++;
    return *pat == '\0';
}
