/*
 * diag.h - front-end diagnostics: collected, located, printed with the source line and a caret
 * underline (CONVENTIONS.md item 9).
 *
 * Every stage (lexer, grammar, semantic pass) appends to one ms_diags list; nothing is printed
 * while compiling. The list stops accepting errors after `max_errors` and then records that it
 * stopped. ms_diags_print writes each one as
 *
 *     file:line:col: error: message
 *         <the source line>
 *         ^~~~~
 *
 * Ownership: ms_diags borrows `file` and `src` (they must outlive it); messages are owned by the
 * list and released by ms_diags_free.
 */
#ifndef MS_DIAG_H
#define MS_DIAG_H

#include <stdio.h>

#include "ms_base.h"

/* A source span. Lines and columns are 1-based; columns count bytes; the span is inclusive of
 * last_column. Field names match what bison's YYLLOC_DEFAULT expects. */
typedef struct ms_loc {
    int first_line;
    int first_column;
    int last_line;
    int last_column;
} ms_loc;

/* ORDER MS_DIAG_SEVERITY */
typedef enum ms_diag_severity {
    MS_DIAG_ERROR = 0,
    MS_DIAG_NOTE,
    MS_DIAG_SEVERITY_COUNT
} ms_diag_severity;

/* One diagnostic. */
typedef struct ms_diag {
    ms_diag_severity severity;
    ms_loc loc;        /* where; first_line 0 = no location (whole file) */
    char *msg;         /* one line, no trailing newline; owned by the list */
} ms_diag;

/* The list of one compilation of one file. Read the fields; change them only through the
 * functions below. */
typedef struct ms_diags {
    const char *file;  /* file name printed in front of every diagnostic (borrowed) */
    const char *src;   /* the source text (borrowed), for the quoted line */
    size_t src_len;    /* bytes of src */
    ms_diag *items;    /* [n] in the order they were reported */
    int n;
    int cap;
    int n_errors;      /* errors accepted (<= max_errors) */
    int max_errors;    /* stop accepting errors after this many (>= 1) */
    bool stopped;      /* an error was refused because of max_errors */
    bool oom;          /* a diagnostic could not be stored (out of memory) */
} ms_diags;

/* Default for max_errors. */
#define MS_DIAG_MAX_ERRORS_DEFAULT 20

/* Initialise an empty list (allocates nothing). max_errors <= 0 means the default. */
void ms_diags_init(ms_diags *d, const char *file, const char *src, size_t src_len, int max_errors);

/* Release the messages. NULL is ok. */
void ms_diags_free(ms_diags *d);

/*
 * Append an error at `loc`. Returns false when the list is full (max_errors reached, `stopped`
 * set) or out of memory (`oom` set): callers may stop early.
 */
bool ms_diags_error(ms_diags *d, ms_loc loc, const char *fmt, ...) MS_PRINTF(3, 4);
bool ms_diags_verror(ms_diags *d, ms_loc loc, const char *fmt, va_list ap) MS_PRINTF(3, 0);

/* Append a note attached to the previous error (dropped when that error was refused). */
void ms_diags_note(ms_diags *d, ms_loc loc, const char *fmt, ...) MS_PRINTF(3, 4);

/* True once max_errors errors are recorded. */
bool ms_diags_full(const ms_diags *d);

/*
 * Print every diagnostic as described at the top of the file, then, when errors were dropped,
 * "file: error: too many errors (N), stopping". Deterministic.
 */
void ms_diags_print(const ms_diags *d, FILE *out);

#endif /* MS_DIAG_H */
