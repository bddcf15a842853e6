/*
 * nvrtc_cache.c - NVRTC compilation of kernel instances with an on-disk cubin cache (nvrtc_cache.h).
 *
 * Constraints: every NVRTC call is checked (MS_NVRTC_TRY); the program is destroyed on every
 * path; cache files appear atomically (write to a unique temporary name, fsync, rename); a cache
 * entry that is not an ELF file is ignored and rewritten; an unwritable cache never fails a
 * compile.
 */
#include "nvrtc_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cuda_check.h" /* brings <nvrtc.h> with -Wundef silenced */

#define PATH_CAP 4096

/* ---- small helpers ---- */

static uint64_t fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}

static uint64_t fnv1a_str(uint64_t h, const char *s) {
    return fnv1a(h, s, strlen(s) + 1); /* the NUL separates fields */
}

/* mkdir -p; true when the folder exists afterwards. */
static bool make_dirs(const char *path) {
    char buf[PATH_CAP];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf)
        return false;
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char c = buf[i];
            buf[i] = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return false;
            buf[i] = c;
        }
    }
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Read a whole file into an ms_malloc'd buffer; false when missing or unreadable. */
static bool read_file(const char *path, void **data, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return false;
    bool ok = false;
    char *buf = NULL;
    if (fseek(f, 0, SEEK_END) == 0) {
        long len = ftell(f);
        if (len > 0 && fseek(f, 0, SEEK_SET) == 0) {
            buf = ms_malloc((size_t)len);
            if (buf != NULL && fread(buf, 1, (size_t)len, f) == (size_t)len) {
                *data = buf;
                *size = (size_t)len;
                ok = true;
            }
        }
    }
    fclose(f);
    if (!ok)
        ms_free(buf);
    return ok;
}

/* Write via a temporary file and rename, so readers see the old file or the whole new one. */
static bool write_file_atomic(const char *path, const void *data, size_t size) {
    static int counter;
    char tmp[PATH_CAP];
    int n = snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%d", path, (long)getpid(),
                     __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED));
    if (n < 0 || (size_t)n >= sizeof tmp)
        return false;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0)
        return false;
    const char *p = data;
    size_t left = size;
    bool ok = true;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            ok = false;
            break;
        }
        p += w;
        left -= (size_t)w;
    }
    if (ok && fsync(fd) != 0)
        ok = false;
    if (close(fd) != 0)
        ok = false;
    if (ok && rename(tmp, path) != 0)
        ok = false;
    if (!ok)
        unlink(tmp);
    return ok;
}

/* ---- templates: the embedded ones, or MSTAR_TEMPLATES_DIR's files ---- */

#define MAX_TEMPLATES 64

/* The template texts one compile uses. */
typedef struct tmpl_set {
    const char *name[MAX_TEMPLATES]; /* as #include spells it */
    const char *text[MAX_TEMPLATES]; /* embedded text or owned[i] */
    char *owned[MAX_TEMPLATES];      /* read from MSTAR_TEMPLATES_DIR (ms_malloc), else NULL */
    int n;
} tmpl_set;

static void tmpl_set_free(tmpl_set *t) {
    for (int i = 0; i < t->n; i++)
        ms_free(t->owned[i]);
    memset(t, 0, sizeof *t);
}

/* Read a whole text file, NUL-terminated; NULL when missing or unreadable. */
static char *read_text(const char *path) {
    void *data = NULL;
    size_t size = 0;
    if (!read_file(path, &data, &size)) {
        struct stat st;
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 0)
            return ms_strdup(""); /* read_file refuses empty files */
        return NULL;
    }
    char *text = ms_realloc(data, size + 1);
    if (text == NULL) {
        ms_free(data);
        return NULL;
    }
    text[size] = '\0';
    return text;
}

static ms_status tmpl_set_init(tmpl_set *t, ms_error *err) {
    memset(t, 0, sizeof *t);
    if (ms_nvrtc_n_templates > MAX_TEMPLATES)
        return MS_FAIL(err, MS_ERR_INTERNAL, "more than %d embedded templates", MAX_TEMPLATES);
    const char *dir = getenv("MSTAR_TEMPLATES_DIR");
    if (dir != NULL && dir[0] != '\0') {
        struct stat st;
        if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
            return MS_FAIL(err, MS_ERR_IO, "MSTAR_TEMPLATES_DIR=%s: not a folder", dir);
    } else {
        dir = NULL;
    }
    for (int i = 0; i < ms_nvrtc_n_templates; i++) {
        t->name[i] = ms_nvrtc_templates[i].name;
        t->text[i] = ms_nvrtc_templates[i].text;
        t->n = i + 1;
        if (dir == NULL)
            continue;
        char path[PATH_CAP];
        int n = snprintf(path, sizeof path, "%s/%s", dir, t->name[i]);
        if (n < 0 || (size_t)n >= sizeof path || access(path, F_OK) != 0)
            continue;
        t->owned[i] = read_text(path);
        if (t->owned[i] == NULL) {
            tmpl_set_free(t);
            return MS_FAIL(err, MS_ERR_IO, "MSTAR_TEMPLATES_DIR: cannot read %s", path);
        }
        t->text[i] = t->owned[i];
    }
    return MS_OK;
}

/* Mark the templates reachable from text through #include "..." (depth first). Only those enter
 * an instance's cache key, so editing one template recompiles only its users. */
static void mark_includes(const tmpl_set *t, const char *text, bool *used) {
    const char *p = text;
    while ((p = strstr(p, "#include \"")) != NULL) {
        p += strlen("#include \"");
        const char *e = strchr(p, '"');
        if (e == NULL)
            return;
        size_t n = (size_t)(e - p);
        for (int i = 0; i < t->n; i++) {
            const char *name = t->name[i];
            if (!used[i] && strlen(name) == n && strncmp(name, p, n) == 0) {
                used[i] = true;
                mark_includes(t, t->text[i], used);
            }
        }
        p = e;
    }
}

/* End the line being written at out[*line_start..*o): cut trailing blanks, keep it (with its
 * newline) only when something is left. */
static void end_line(char *out, size_t *o, size_t *line_start) {
    while (*o > *line_start &&
           (out[*o - 1] == ' ' || out[*o - 1] == '\t' || out[*o - 1] == '\r'))
        (*o)--;
    if (*o > *line_start)
        out[(*o)++] = '\n';
    *line_start = *o;
}

/* The source as the key sees it: comments removed (string and character literals kept),
 * trailing blanks cut, blank lines dropped. NULL when out of memory. */
static char *strip_comments(const char *src) {
    size_t n = strlen(src);
    char *out = ms_malloc(n + 2);
    if (out == NULL)
        return NULL;
    size_t o = 0, line_start = 0;
    const char *p = src;
    while (*p != '\0') {
        if (p[0] == '/' && p[1] == '/') {
            while (*p != '\0' && *p != '\n')
                p++;
        } else if (p[0] == '/' && p[1] == '*') {
            const char *e = strstr(p + 2, "*/");
            const char *stop = e != NULL ? e + 2 : p + strlen(p);
            const char *nl = memchr(p, '\n', (size_t)(stop - p));
            if (nl != NULL)
                end_line(out, &o, &line_start); /* the comment spans lines */
            else
                out[o++] = ' ';
            p = stop;
        } else if (*p == '"' || *p == '\'') {
            char q = *p;
            out[o++] = *p++;
            while (*p != '\0' && *p != q && *p != '\n') {
                if (*p == '\\' && p[1] != '\0' && p[1] != '\n')
                    out[o++] = *p++;
                out[o++] = *p++;
            }
            if (*p == q)
                out[o++] = *p++;
        } else if (*p == '\n') {
            end_line(out, &o, &line_start);
            p++;
        } else {
            out[o++] = *p++;
        }
    }
    end_line(out, &o, &line_start);
    out[o] = '\0';
    return out;
}

/* ---- public helpers ---- */

ms_status ms_nvrtc_parse_arch(const char *text, int *arch, ms_error *err) {
    if (text == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "architecture: missing (expected e.g. sm_90)");
    const char *p = text;
    if (strncmp(p, "sm_", 3) == 0)
        p += 3;
    else if (strncmp(p, "sm", 2) == 0)
        p += 2;
    else if (strncmp(p, "compute_", 8) == 0)
        p += 8;
    char *end = NULL;
    long v = strtol(p, &end, 10);
    if (end == p || *end != '\0' || v < 50 || v > 199)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "architecture '%s' not understood (expected e.g. sm_80, sm_90)", text);
    *arch = (int)v;
    return MS_OK;
}

ms_status ms_nvrtc_version(int *version, ms_error *err) {
    int major = 0, minor = 0;
    MS_NVRTC_TRY(err, nvrtcVersion(&major, &minor));
    *version = major * 1000 + minor * 10;
    return MS_OK;
}

ms_status ms_nvrtc_cache_dir(const char *cache_dir, char *buf, size_t cap, ms_error *err) {
    int n;
    if (cache_dir != NULL) {
        n = snprintf(buf, cap, "%s", cache_dir);
    } else {
        const char *env = getenv("MSTAR_CACHE");
        const char *home = getenv("HOME");
        if (env != NULL && strcmp(env, "off") == 0)
            return MS_FAIL(err, MS_ERR_NOT_FOUND, "kernel cache disabled (MSTAR_CACHE=off)");
        if (env != NULL && env[0] != '\0')
            n = snprintf(buf, cap, "%s", env);
        else if (home != NULL && home[0] != '\0')
            n = snprintf(buf, cap, "%s/.cache/mstar", home);
        else
            return MS_FAIL(err, MS_ERR_NOT_FOUND, "kernel cache: neither MSTAR_CACHE nor HOME set");
    }
    if (n < 0 || (size_t)n >= cap)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "kernel cache folder name too long");
    return MS_OK;
}

void ms_nvrtc_cubin_free(ms_cubin *c) {
    if (c == NULL)
        return;
    ms_free(c->data);
    ms_free(c->path);
    memset(c, 0, sizeof *c);
}

/* ---- compile ---- */

ms_status ms_nvrtc_check_arch(int arch, ms_error *err) {
    int n = 0;
    MS_NVRTC_TRY(err, nvrtcGetNumSupportedArchs(&n));
    if (n <= 0 || n > 256)
        return MS_FAIL(err, MS_ERR_NVRTC, "NVRTC reports %d supported architectures", n);
    int archs[256];
    MS_NVRTC_TRY(err, nvrtcGetSupportedArchs(archs));
    for (int i = 0; i < n; i++)
        if (archs[i] == arch)
            return MS_OK;
    return MS_FAIL(err, MS_ERR_UNSUPPORTED, "sm_%d is not supported by this NVRTC (sm_%d .. sm_%d)",
                   arch, archs[0], archs[n - 1]);
}

#define NVRTC_OPTS "-std=c++17", "-DMS_NVRTC=1"

/* "<uri>_sm<arch>" into full (PATH_CAP bytes), validating uri. */
static ms_status full_uri_of(const char *uri, int arch, char *full, ms_error *err) {
    if (uri == NULL || uri[0] == '\0' || strchr(uri, '/') != NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "NVRTC compile: missing or invalid URI");
    int n = snprintf(full, PATH_CAP, "%s_sm%d", uri, arch);
    if (n < 0 || n >= 256)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "NVRTC compile: URI too long: %.64s...", uri);
    return MS_OK;
}

/* The cache key: everything that changes the cubin (see ms_nvrtc_cache_key). */
static ms_status compute_key(const char *full_uri, const char *source, int arch,
                             const tmpl_set *t, uint64_t *key, ms_error *err) {
    int version = 0;
    MS_TRY(ms_nvrtc_version(&version, err));
    char *norm = strip_comments(source);
    if (norm == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory hashing the source", full_uri);
    uint64_t h = 1469598103934665603ull;
    h = fnv1a_str(h, "mstar-cubin-v2 -std=c++17 -DMS_NVRTC=1");
    h = fnv1a_str(h, full_uri);
    h = fnv1a(h, &version, sizeof version);
    h = fnv1a(h, &arch, sizeof arch);
    h = fnv1a_str(h, norm);
    ms_free(norm);
    bool used[MAX_TEMPLATES] = {false};
    mark_includes(t, source, used);
    for (int i = 0; i < t->n; i++) {
        if (!used[i])
            continue;
        h = fnv1a_str(h, t->name[i]);
        h = fnv1a_str(h, t->text[i]);
    }
    *key = h;
    return MS_OK;
}

/* Cache file path of a key into path; false when the cache is off or the name is too long. */
static bool cache_path(const char *cache_dir, const char *full_uri, uint64_t key, char *dir,
                       char *path) {
    ms_error ignored = {0};
    if (ms_nvrtc_cache_dir(cache_dir, dir, PATH_CAP, &ignored) != MS_OK)
        return false;
    int n = snprintf(path, PATH_CAP, "%s/%s-%016llx.cubin", dir, full_uri, (unsigned long long)key);
    return n > 0 && n < PATH_CAP;
}

ms_status ms_nvrtc_cache_key(const char *uri, const char *source, int arch, uint64_t *key,
                             ms_error *err) {
    char full_uri[PATH_CAP];
    if (source == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "NVRTC cache key: missing source");
    MS_TRY(full_uri_of(uri, arch, full_uri, err));
    MS_TRY(ms_nvrtc_check_arch(arch, err));
    tmpl_set t;
    MS_TRY(tmpl_set_init(&t, err));
    ms_status st = compute_key(full_uri, source, arch, &t, key, err);
    tmpl_set_free(&t);
    return st;
}

ms_status ms_nvrtc_cache_probe(const char *uri, const char *source, int arch,
                               const char *cache_dir, char *path, size_t cap, bool *hit,
                               ms_error *err) {
    *hit = false;
    char full_uri[PATH_CAP], dir[PATH_CAP], p[PATH_CAP];
    MS_TRY(full_uri_of(uri, arch, full_uri, err));
    uint64_t key = 0;
    MS_TRY(ms_nvrtc_cache_key(uri, source, arch, &key, err));
    if (!cache_path(cache_dir, full_uri, key, dir, p))
        return MS_FAIL(err, MS_ERR_NOT_FOUND, "kernel cache off or unnamed (MSTAR_CACHE, HOME)");
    if (snprintf(path, cap, "%s", p) >= (int)cap)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "kernel cache path longer than %zu bytes", cap);
    unsigned char magic[4] = {0};
    FILE *f = fopen(p, "rb");
    if (f != NULL) {
        *hit = fread(magic, 1, 4, f) == 4 && memcmp(magic, "\177ELF", 4) == 0;
        fclose(f);
    }
    return MS_OK;
}

/* Write the failing source and log for the developer: <dir>/<full_uri>.failed.cu / .failed.log
 * ($TMPDIR/mstar-failed/ without a cache). Empty strings when a file could not be written. */
static void save_failure(const char *dir, const char *full_uri, const char *source,
                         const char *log, char *src_path, char *log_path) {
    char folder[PATH_CAP];
    src_path[0] = log_path[0] = '\0';
    int f;
    if (dir != NULL)
        f = snprintf(folder, sizeof folder, "%s", dir);
    else
        f = snprintf(folder, sizeof folder, "%s/mstar-failed",
                     getenv("TMPDIR") != NULL ? getenv("TMPDIR") : "/tmp");
    if (f < 0 || (size_t)f >= sizeof folder || !make_dirs(folder))
        return;
    char sp[PATH_CAP], lp[PATH_CAP];
    int a = snprintf(sp, sizeof sp, "%s/%s.failed.cu", folder, full_uri);
    int b = snprintf(lp, sizeof lp, "%s/%s.failed.log", folder, full_uri);
    if (a < 0 || (size_t)a >= sizeof sp || b < 0 || (size_t)b >= sizeof lp)
        return;
    if (source != NULL && write_file_atomic(sp, source, strlen(source)))
        snprintf(src_path, PATH_CAP, "%s", sp);
    if (write_file_atomic(lp, log, strlen(log)))
        snprintf(log_path, PATH_CAP, "%s", lp);
}

/* Run NVRTC; on success *cubin and *size hold an ms_malloc'd cubin. dir: the cache folder for a
 * failure's files (NULL: $TMPDIR/mstar-failed). */
static ms_status run_nvrtc(const char *full_uri, const char *source, int arch, const char *dir,
                           const tmpl_set *t, const ms_nvrtc_options *o, void **cubin,
                           size_t *size, ms_error *err) {
    char name[PATH_CAP + 8];
    if (o->source_path != NULL)
        snprintf(name, sizeof name, "%s", o->source_path);
    else
        snprintf(name, sizeof name, "%.*s.cu", PATH_CAP - 1, full_uri);
    nvrtcProgram prog;
    MS_NVRTC_TRY(err, nvrtcCreateProgram(&prog, source, name, t->n, t->text, t->name));
    char arch_opt[64];
    snprintf(arch_opt, sizeof arch_opt, "--gpu-architecture=sm_%d", arch);
    const char *opts[] = {arch_opt, NVRTC_OPTS};
    nvrtcResult res = nvrtcCompileProgram(prog, (int)MS_ARRAY_LEN(opts), opts);
    ms_status st = MS_OK;
    if (res != NVRTC_SUCCESS) {
        size_t log_size = 0;
        char *log = NULL;
        if (nvrtcGetProgramLogSize(prog, &log_size) == NVRTC_SUCCESS && log_size > 0)
            log = ms_malloc(log_size + 1);
        if (log != NULL) {
            if (nvrtcGetProgramLog(prog, log) != NVRTC_SUCCESS)
                log[0] = '\0';
            log[log_size] = '\0';
        }
        char sp[PATH_CAP] = "", lp[PATH_CAP] = "";
        if (o->source_path == NULL)
            save_failure(dir, full_uri, source, log != NULL ? log : "", sp, lp);
        /* one line: newlines of the log become " | " */
        char excerpt[600];
        size_t x = 0;
        for (const char *c = log != NULL ? log : ""; *c != '\0' && x + 4 < sizeof excerpt; c++) {
            if (*c == '\n') {
                if (c[1] != '\0') {
                    memcpy(excerpt + x, " | ", 3);
                    x += 3;
                }
            } else {
                excerpt[x++] = *c;
            }
        }
        excerpt[x] = '\0';
        if (o->source_path != NULL) /* the caller's file; the caller prints the whole log */
            st = MS_FAIL(err, MS_ERR_NVRTC, "NVRTC: compiling %s failed (%s); source: %s; log: %s",
                         full_uri, nvrtcGetErrorString(res), o->source_path, excerpt);
        else
            st = MS_FAIL(err, MS_ERR_NVRTC,
                         "NVRTC: compiling %s failed (%s); source: %s; log: %s: %s", full_uri,
                         nvrtcGetErrorString(res), sp[0] ? sp : "(not written)",
                         lp[0] ? lp : "(not written)", excerpt);
        if (o->log != NULL) {
            *o->log = log;
            log = NULL;
        }
        ms_free(log);
    } else {
        size_t n = 0;
        nvrtcResult r2 = nvrtcGetCUBINSize(prog, &n);
        void *buf = r2 == NVRTC_SUCCESS && n > 0 ? ms_malloc(n) : NULL;
        if (r2 != NVRTC_SUCCESS)
            st = ms_cuda_record_failure(err, MS_ERR_NVRTC, "NVRTC", (int)r2, nvrtcGetErrorString(r2),
                                        "nvrtcGetCUBINSize(prog, &n)", -1, __FILE__, __LINE__,
                                        __func__);
        else if (buf == NULL)
            st = MS_FAIL(err, MS_ERR_OOM, "%s: no memory for a cubin of %zu bytes", full_uri, n);
        else if ((r2 = nvrtcGetCUBIN(prog, buf)) != NVRTC_SUCCESS)
            st = ms_cuda_record_failure(err, MS_ERR_NVRTC, "NVRTC", (int)r2, nvrtcGetErrorString(r2),
                                        "nvrtcGetCUBIN(prog, buf)", -1, __FILE__, __LINE__,
                                        __func__);
        if (st == MS_OK) {
            *cubin = buf;
            *size = n;
        } else {
            ms_free(buf);
        }
    }
    nvrtcDestroyProgram(&prog);
    return st;
}

static ms_status compile_with(const char *uri, const char *source, int arch,
                              const ms_nvrtc_options *o, const tmpl_set *t, ms_cubin *out,
                              ms_error *err) {
    char full_uri[PATH_CAP], dir[PATH_CAP], path[PATH_CAP];
    MS_TRY(full_uri_of(uri, arch, full_uri, err));
    MS_TRY(ms_nvrtc_check_arch(arch, err));
    uint64_t key = 0;
    MS_TRY(compute_key(full_uri, source, arch, t, &key, err));
    bool cache = !o->no_cache && cache_path(o->cache_dir, full_uri, key, dir, path);
    out->arch = arch;
    if (cache && read_file(path, &out->data, &out->size)) {
        if (out->size >= 4 && memcmp(out->data, "\177ELF", 4) == 0) {
            out->from_cache = true;
            out->path = ms_strdup(path);
            if (out->path == NULL)
                return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", full_uri);
            return MS_OK;
        }
        ms_free(out->data); /* corrupt entry: compile again and overwrite it */
        out->data = NULL;
        out->size = 0;
    }
    char failed_dir[PATH_CAP];
    bool have_dir = !o->no_cache && ms_nvrtc_cache_dir(o->cache_dir, failed_dir, sizeof failed_dir,
                                                        &(ms_error){0}) == MS_OK;
    MS_TRY(run_nvrtc(full_uri, source, arch, have_dir ? failed_dir : NULL, t, o, &out->data,
                     &out->size, err));
    if (cache && make_dirs(dir) && write_file_atomic(path, out->data, out->size)) {
        out->path = ms_strdup(path);
        if (out->path == NULL)
            return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory", full_uri);
    }
    return MS_OK;
}

ms_status ms_nvrtc_compile_ex(const char *uri, const char *source, int arch,
                              const ms_nvrtc_options *o, ms_cubin *out, ms_error *err) {
    memset(out, 0, sizeof *out);
    ms_nvrtc_options dflt = {0};
    if (o == NULL)
        o = &dflt;
    if (o->log != NULL)
        *o->log = NULL;
    if (source == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "NVRTC compile: missing or invalid URI / source");
    tmpl_set t;
    MS_TRY(tmpl_set_init(&t, err));
    ms_status st = compile_with(uri, source, arch, o, &t, out, err);
    tmpl_set_free(&t);
    if (st != MS_OK)
        ms_nvrtc_cubin_free(out);
    return st;
}

ms_status ms_nvrtc_compile(const char *uri, const char *source, int arch, const char *cache_dir,
                           ms_cubin *out, ms_error *err) {
    ms_nvrtc_options o = {.cache_dir = cache_dir};
    return ms_nvrtc_compile_ex(uri, source, arch, &o, out, err);
}

ms_status ms_nvrtc_precompile(const ms_kernel_spec *specs, int n_specs, const int *archs,
                              int n_archs, const char *cache_dir, int *n_compiled, ms_error *err) {
    if (n_compiled != NULL)
        *n_compiled = 0;
    for (int i = 0; i < n_specs; i++) {
        char uri[MS_KERNEL_URI_MAX];
        char *src = NULL;
        MS_TRY(ms_kernel_spec_uri(&specs[i], 0, uri, sizeof uri, err));
        MS_TRY(ms_kernel_spec_instance_source(&specs[i], &src, err));
        for (int a = 0; a < n_archs; a++) {
            ms_cubin cb = {0};
            ms_status st = ms_nvrtc_compile(uri, src, archs[a], cache_dir, &cb, err);
            if (st == MS_OK && !cb.from_cache && n_compiled != NULL)
                (*n_compiled)++;
            ms_nvrtc_cubin_free(&cb);
            if (st != MS_OK) {
                ms_free(src);
                return st;
            }
        }
        ms_free(src);
    }
    return MS_OK;
}
