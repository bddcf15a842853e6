/*
 * fuzz_util.h - helpers shared by the libFuzzer targets tests/fuzz_*.c (header-only, static).
 *
 * The loaders under test take paths, so each target writes its input into files of one private
 * folder (made under $TMPDIR once per process, removed at exit) and loads them from there. Inputs
 * holding several files are split at NUL bytes (JSON cannot hold a raw NUL, so nothing is lost).
 * A finding aborts: libFuzzer then writes the input to its -artifact_prefix folder, and
 * tests/fuzz.sh prints that reproducer's path.
 */
#ifndef MS_FUZZ_UTIL_H
#define MS_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ms_base.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char fuzz_dir_path[512];

static inline void fuzz_dir_remove(void) {
    static const char *const names[] = {"config.json", "generation_config.json", "tokenizer.json",
                                        "tokenizer_config.json", "model.safetensors", "model.bin",
                                        "tokenizer.bin", "model.safetensors.index.json", "a.safetensors",
                                        "b.safetensors"};
    char p[600];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", fuzz_dir_path, names[i]);
        unlink(p);
    }
    rmdir(fuzz_dir_path);
}

/* The private folder of this process (created on first use). */
static inline const char *fuzz_dir(void) {
    if (fuzz_dir_path[0] == '\0') {
        const char *tmp = getenv("TMPDIR");
        snprintf(fuzz_dir_path, sizeof fuzz_dir_path, "%s/ms_fuzz_XXXXXX", tmp != NULL && *tmp ? tmp : "/tmp");
        if (mkdtemp(fuzz_dir_path) == NULL) {
            perror("fuzz: mkdtemp");
            abort();
        }
        atexit(fuzz_dir_remove);
    }
    return fuzz_dir_path;
}

/* Path of `name` in the private folder (one of four rotating buffers). */
static inline const char *fuzz_path(const char *name) {
    static char buf[4][600];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", fuzz_dir(), name);
    return buf[k];
}

/* Write data[0 .. n) to `name` in the private folder; returns its path. */
static inline const char *fuzz_write(const char *name, const void *data, size_t n) {
    const char *p = fuzz_path(name);
    FILE *fp = fopen(p, "wb");
    if (fp == NULL || (n > 0 && fwrite(data, 1, n, fp) != n) || fclose(fp) != 0) {
        perror(p);
        abort();
    }
    return p;
}

/* Remove `name` from the private folder (absent is fine). */
static inline void fuzz_unlink(const char *name) {
    unlink(fuzz_path(name));
}

/* Part k (0-based) of data split at NUL bytes: *part, *len; false when there are fewer parts. */
static inline bool fuzz_part(const uint8_t *data, size_t size, int k, const uint8_t **part, size_t *len) {
    size_t s = 0;
    for (int i = 0;; i++) {
        const uint8_t *nul = s < size ? memchr(data + s, 0, size - s) : NULL;
        size_t e = nul != NULL ? (size_t)(nul - data) : size;
        if (i == k) {
            if (s > size)
                return false;
            *part = data + s;
            *len = e - s;
            return true;
        }
        if (nul == NULL)
            return false;
        s = e + 1;
    }
}

/* A NUL-terminated copy (malloc; the caller frees). */
static inline char *fuzz_strndup(const uint8_t *data, size_t n) {
    char *s = malloc(n + 1);
    if (s == NULL)
        abort();
    memcpy(s, data, n);
    s[n] = '\0';
    return s;
}

/* Abort when the ms_malloc live-block count differs from `live` (a leak through our allocator). */
static inline void fuzz_check_leaks(const char *target, int64_t live) {
    int64_t now = ms_alloc_get_stats().live_blocks;
    if (now != live) {
        fprintf(stderr, "%s: %lld ms_malloc block(s) leaked\n", target, (long long)(now - live));
        abort();
    }
}

/* A failing status must come with a one-line message; abort otherwise. With MS_FUZZ_VERBOSE=1 in
 * the environment every failure is printed (to see what a seed or reproducer exercises). */
static inline void fuzz_check_error(const char *target, ms_status st, const ms_error *err) {
    if (st == MS_OK)
        return;
    static int verbose = -1;
    if (verbose < 0)
        verbose = getenv("MS_FUZZ_VERBOSE") != NULL && strcmp(getenv("MS_FUZZ_VERBOSE"), "1") == 0;
    if (verbose)
        fprintf(stderr, "%s: status %d: %s\n", target, (int)st, err->msg);
    if (st == MS_ERR_OOM) {
        fprintf(stderr, "%s: unexpected out of memory: %s\n", target, err->msg);
        abort();
    }
    if (err->msg[0] == '\0' || strchr(err->msg, '\n') != NULL) {
        fprintf(stderr, "%s: status %d with a message that is not one line: \"%s\"\n", target, (int)st, err->msg);
        abort();
    }
}

#endif /* MS_FUZZ_UTIL_H */
