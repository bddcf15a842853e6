/*
 * diag.c - diagnostics list and printer. See diag.h.
 *
 * The printer quotes the first line of the span, expands nothing (tabs are copied so the caret
 * line stays aligned when the terminal expands both alike) and underlines the span's part on
 * that line: '^' under the first column, '~' under the rest.
 */
#include "diag.h"

#include <string.h>

static const char *severity_str(ms_diag_severity s) {
    /* ORDER MS_DIAG_SEVERITY */
    static const char *const names[MS_DIAG_SEVERITY_COUNT] = {"error", "note"};
    return (unsigned)s < MS_DIAG_SEVERITY_COUNT ? names[s] : "error";
}

void ms_diags_init(ms_diags *d, const char *file, const char *src, size_t src_len, int max_errors) {
    memset(d, 0, sizeof *d);
    d->file = file;
    d->src = src;
    d->src_len = src_len;
    d->max_errors = max_errors > 0 ? max_errors : MS_DIAG_MAX_ERRORS_DEFAULT;
}

void ms_diags_free(ms_diags *d) {
    if (d == NULL)
        return;
    for (int i = 0; i < d->n; i++)
        ms_free(d->items[i].msg);
    ms_free(d->items);
    d->items = NULL;
    d->n = d->cap = 0;
}

bool ms_diags_full(const ms_diags *d) { return d->n_errors >= d->max_errors; }

static bool diags_push(ms_diags *d, ms_diag_severity sev, ms_loc loc, const char *fmt, va_list ap) {
    size_t cap = (size_t)d->cap;
    if (ms_grow((void **)&d->items, &cap, (size_t)d->n + 1, sizeof *d->items) != MS_OK) {
        d->oom = true;
        return false;
    }
    d->cap = (int)cap;
    char buf[1024];
    vsnprintf(buf, sizeof buf, fmt, ap);
    char *msg = ms_strdup(buf);
    if (msg == NULL) {
        d->oom = true;
        return false;
    }
    d->items[d->n].severity = sev;
    d->items[d->n].loc = loc;
    d->items[d->n].msg = msg;
    d->n++;
    return true;
}

bool ms_diags_verror(ms_diags *d, ms_loc loc, const char *fmt, va_list ap) {
    if (ms_diags_full(d)) {
        d->stopped = true;
        return false;
    }
    if (!diags_push(d, MS_DIAG_ERROR, loc, fmt, ap))
        return false;
    d->n_errors++;
    return !ms_diags_full(d);
}

bool ms_diags_error(ms_diags *d, ms_loc loc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    bool ok = ms_diags_verror(d, loc, fmt, ap);
    va_end(ap);
    return ok;
}

void ms_diags_note(ms_diags *d, ms_loc loc, const char *fmt, ...) {
    if (d->n == 0 || d->stopped)
        return;
    va_list ap;
    va_start(ap, fmt);
    diags_push(d, MS_DIAG_NOTE, loc, fmt, ap);
    va_end(ap);
}

/* Start and length of 1-based line `line` in src, or false when out of range. */
static bool find_line(const ms_diags *d, int line, size_t *start, size_t *len) {
    if (d->src == NULL || line < 1)
        return false;
    size_t pos = 0;
    for (int l = 1; l < line; l++) {
        const char *nl = memchr(d->src + pos, '\n', d->src_len - pos);
        if (nl == NULL)
            return false;
        pos = (size_t)(nl - d->src) + 1;
    }
    const char *nl = memchr(d->src + pos, '\n', d->src_len - pos);
    *start = pos;
    *len = nl != NULL ? (size_t)(nl - (d->src + pos)) : d->src_len - pos;
    if (*len > 0 && d->src[pos + *len - 1] == '\r')
        (*len)--;
    return true;
}

static void print_one(const ms_diags *d, const ms_diag *g, FILE *out) {
    if (g->loc.first_line <= 0) {
        fprintf(out, "%s: %s: %s\n", d->file, severity_str(g->severity), g->msg);
        return;
    }
    fprintf(out, "%s:%d:%d: %s: %s\n", d->file, g->loc.first_line, g->loc.first_column,
            severity_str(g->severity), g->msg);
    size_t start, len;
    if (!find_line(d, g->loc.first_line, &start, &len))
        return;
    /* an empty line is printed empty (no trailing indentation) */
    if (len > 0)
        fputs("    ", out);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)d->src[start + i];
        fputc(c == '\t' || c >= 0x20 ? c : ' ', out);
    }
    fputc('\n', out);
    fputs("    ", out);
    int first = g->loc.first_column < 1 ? 1 : g->loc.first_column;
    int last = g->loc.last_line == g->loc.first_line ? g->loc.last_column : (int)len;
    if (last < first)
        last = first;
    for (int c = 1; c < first; c++)
        fputc(c - 1 < (int)len && d->src[start + (size_t)c - 1] == '\t' ? '\t' : ' ', out);
    fputc('^', out);
    for (int c = first + 1; c <= last; c++)
        fputc('~', out);
    fputc('\n', out);
}

void ms_diags_print(const ms_diags *d, FILE *out) {
    for (int i = 0; i < d->n; i++)
        print_one(d, &d->items[i], out);
    if (d->stopped)
        fprintf(out, "%s: error: too many errors (%d), stopping\n", d->file, d->max_errors);
    if (d->oom)
        fprintf(out, "%s: error: out of memory while recording diagnostics\n", d->file);
}
