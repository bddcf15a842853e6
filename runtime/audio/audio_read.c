/*
 * audio_read.c - sound files (libsndfile) to mono float samples at a chosen rate (libsamplerate).
 *
 * Constraints: nothing is allocated from the length a header claims: data is read in fixed blocks
 * into a buffer that grows with what is really there, and the claimed length is only checked
 * against MS_AUDIO_MAX_SECONDS and against what is there (a data chunk cut short, or fewer frames
 * than claimed, is "truncated"). Every failure is one line naming the file. The returned samples are malloc'd (audio.h).
 */
#include "audio.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <samplerate.h>
#include <sndfile.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Frames decoded per sf_readf_float call. */
#define AUDIO_BLOCK_FRAMES 4096

/* libsndfile's message for the last open/read failure, as one line without a trailing period. */
static void audio_sf_message(SNDFILE *sf, char *buf, size_t cap) {
    const char *m = sf_strerror(sf);
    snprintf(buf, cap, "%s", m != NULL && *m ? m : "unknown libsndfile error");
    size_t len = strlen(buf);
    for (size_t i = 0; i < len; i++)
        if (buf[i] == '\n' || buf[i] == '\r' || buf[i] == '\t')
            buf[i] = ' ';
    while (len > 0 && (buf[len - 1] == ' ' || buf[len - 1] == '.'))
        buf[--len] = '\0';
}

/* Resample mono x[0 .. n) from `from` Hz to `to` Hz; replaces *x (malloc) and *n. */
static ms_status audio_resample(const char *name, float **x, int64_t *n, int32_t from, int32_t to, ms_error *err) {
    double ratio = (double)to / (double)from;
    if (!src_is_valid_ratio(ratio))
        return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: cannot resample %d Hz to %d Hz (ratio %g is outside libsamplerate's 1/256 .. 256)",
                       name, from, to, ratio);
    if (*n > (int64_t)(LONG_MAX / 512))
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: too many samples to resample (%lld)", name, (long long)*n);
    int64_t cap = (int64_t)ceil((double)*n * ratio) + 64;
    float *y = malloc((size_t)cap * sizeof *y);
    if (y == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory for %lld resampled samples", name, (long long)cap);
    SRC_DATA d = {
        .data_in = *x,
        .data_out = y,
        .input_frames = (long)*n,
        .output_frames = (long)cap,
        .src_ratio = ratio,
        .end_of_input = 1,
    };
    int rc = src_simple(&d, SRC_SINC_BEST_QUALITY, 1);
    if (rc != 0) {
        free(y);
        return MS_FAIL(err, MS_ERR_INTERNAL, "%s: resampling %d Hz to %d Hz failed: %s", name, from, to, src_strerror(rc));
    }
    if (d.output_frames_gen <= 0) {
        free(y);
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: no samples left after resampling %lld samples from %d Hz to %d Hz", name,
                       (long long)*n, from, to);
    }
    free(*x);
    *x = y;
    *n = d.output_frames_gen;
    return MS_OK;
}

/*
 * A WAV-family file whose data chunk claims more bytes than the file holds: libsndfile shortens
 * the frame count to what is there and only says so in its log ("data : 102556 (should be
 * 49956)"), so a cut-off download would decode as a shorter clip. The claimed sizes 0 and
 * 0xffffffff mean "length unknown" (streamed WAVs, RF64) and are not truncation.
 */
static ms_status audio_check_truncated(SNDFILE *sf, const char *name, ms_error *err) {
    char log[8192];
    log[0] = '\0';
    sf_command(sf, SFC_GET_LOG_INFO, log, (int)sizeof log);
    for (const char *line = log; line != NULL && *line; line = strchr(line, '\n') ? strchr(line, '\n') + 1 : NULL) {
        unsigned long long claimed = 0, actual = 0;
        while (*line == ' ')
            line++;
        if (strncmp(line, "data", 4) != 0 || sscanf(line, "data : %llu (should be %llu)", &claimed, &actual) != 2)
            continue;
        if (claimed != 0 && claimed != 0xffffffffull && actual < claimed)
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: truncated: the header claims %llu bytes of audio data, the file holds %llu",
                           name, claimed, actual);
    }
    return MS_OK;
}

/* Decode an opened file: checks, blockwise read with downmix, then resampling. Closes nothing. */
static ms_status audio_decode(SNDFILE *sf, const SF_INFO *info, const char *name, int32_t rate, float **samples,
                              int64_t *n, ms_error *err) {
    if (info->channels < 1 || info->channels > MS_AUDIO_MAX_CHANNELS)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: %d channels (expected 1 .. %d)", name, info->channels,
                       MS_AUDIO_MAX_CHANNELS);
    if (info->samplerate < MS_AUDIO_MIN_RATE || info->samplerate > MS_AUDIO_MAX_RATE)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: sample rate %d Hz is outside %d .. %d Hz", name, info->samplerate,
                       MS_AUDIO_MIN_RATE, MS_AUDIO_MAX_RATE);
    if (info->frames <= 0)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: no samples", name);
    int64_t max_frames = (int64_t)MS_AUDIO_MAX_SECONDS * info->samplerate;
    if ((int64_t)info->frames > max_frames)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: header claims %lld frames (%.0f s at %d Hz), over the %d s limit", name,
                       (long long)info->frames, (double)info->frames / info->samplerate, info->samplerate,
                       MS_AUDIO_MAX_SECONDS);
    MS_TRY(audio_check_truncated(sf, name, err));
    int ch = info->channels;
    float *block = malloc((size_t)AUDIO_BLOCK_FRAMES * (size_t)ch * sizeof *block);
    size_t cap = (size_t)MS_MIN((int64_t)info->frames, (int64_t)1 << 20);
    float *x = malloc(cap * sizeof *x);
    if (block == NULL || x == NULL) {
        free(block);
        free(x);
        return MS_FAIL(err, MS_ERR_OOM, "%s: out of memory for the decode buffers", name);
    }
    ms_status st = MS_OK;
    int64_t total = 0;
    for (;;) {
        sf_count_t got = sf_readf_float(sf, block, AUDIO_BLOCK_FRAMES);
        if (got <= 0)
            break;
        /* compressed formats (MPEG) may estimate frames: more data than claimed is read, up to
         * the limit */
        if (total + got > max_frames) {
            st = MS_FAIL(err, MS_ERR_FORMAT, "%s: longer than the %d s limit at %d Hz", name, MS_AUDIO_MAX_SECONDS,
                         info->samplerate);
            goto fail;
        }
        if ((size_t)(total + got) > cap) {
            size_t ncap = MS_MAX(cap * 2, (size_t)(total + got));
            ncap = (size_t)MS_MIN((int64_t)ncap, max_frames);
            float *nx = realloc(x, ncap * sizeof *nx);
            if (nx == NULL) {
                st = MS_FAIL(err, MS_ERR_OOM, "%s: out of memory for %zu samples", name, ncap);
                goto fail;
            }
            x = nx;
            cap = ncap;
        }
        for (sf_count_t f = 0; f < got; f++) {
            const float *fr = block + (size_t)f * (size_t)ch;
            float s = fr[0];
            if (ch > 1) {
                double acc = 0.0;
                for (int c = 0; c < ch; c++)
                    acc += fr[c];
                s = (float)(acc / ch);
            }
            if (!isfinite(s)) {
                st = MS_FAIL(err, MS_ERR_FORMAT, "%s: sample %lld is not a finite number", name, (long long)(total + f));
                goto fail;
            }
            x[total + f] = s;
        }
        total += got;
    }
    if (sf_error(sf) != SF_ERR_NO_ERROR) {
        char msg[256];
        audio_sf_message(sf, msg, sizeof msg);
        st = MS_FAIL(err, MS_ERR_FORMAT, "%s: cannot decode the data after frame %lld: %s", name, (long long)total, msg);
        goto fail;
    }
    if (total == 0) {
        st = MS_FAIL(err, MS_ERR_FORMAT, "%s: no samples (header claims %lld frames, none could be read)", name,
                     (long long)info->frames);
        goto fail;
    }
    if (total < (int64_t)info->frames && (info->format & SF_FORMAT_TYPEMASK) != SF_FORMAT_MPEG) {
        st = MS_FAIL(err, MS_ERR_FORMAT, "%s: truncated: header claims %lld frames, the data holds %lld", name,
                     (long long)info->frames, (long long)total);
        goto fail;
    }
    free(block);
    block = NULL;
    if (info->samplerate != rate) {
        st = audio_resample(name, &x, &total, info->samplerate, rate, err);
        if (st != MS_OK)
            goto fail;
    }
    *samples = x;
    *n = total;
    return MS_OK;
fail:
    free(block);
    free(x);
    return st;
}

static ms_status audio_check_args(const char *name, int32_t rate, float **samples, int64_t *n, ms_error *err) {
    if (samples == NULL || n == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: samples and n must not be NULL", name);
    *samples = NULL;
    *n = 0;
    if (rate < MS_AUDIO_MIN_RATE || rate > MS_AUDIO_MAX_RATE)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: target sample rate %d Hz is outside %d .. %d Hz", name, rate,
                       MS_AUDIO_MIN_RATE, MS_AUDIO_MAX_RATE);
    return MS_OK;
}

ms_status ms_audio_read(const char *path, int32_t sample_rate, float **samples, int64_t *n, ms_error *err) {
    if (path == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "ms_audio_read: path is NULL");
    MS_TRY(audio_check_args(path, sample_rate, samples, n, err));
    struct stat sb;
    if (stat(path, &sb) != 0)
        return MS_FAIL(err, errno == ENOENT ? MS_ERR_NOT_FOUND : MS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return MS_FAIL(err, MS_ERR_IO, "%s: cannot read: not a regular file", path);
    if (sb.st_size == 0)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: empty file (0 bytes), not a sound file", path);
    SF_INFO info;
    memset(&info, 0, sizeof info);
    SNDFILE *sf = sf_open(path, SFM_READ, &info);
    if (sf == NULL) {
        char msg[256];
        audio_sf_message(NULL, msg, sizeof msg);
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: not a readable sound file: %s", path, msg);
    }
    ms_status st = audio_decode(sf, &info, path, sample_rate, samples, n, err);
    sf_close(sf);
    return st;
}

/* ---- memory input through libsndfile's virtual I/O ---- */

typedef struct audio_mem {
    const unsigned char *data; /* [size] borrowed file image */
    sf_count_t size;           /* bytes */
    sf_count_t pos;            /* read position, 0 .. size */
} audio_mem;

static sf_count_t audio_mem_len(void *user) {
    return ((audio_mem *)user)->size;
}

static sf_count_t audio_mem_seek(sf_count_t offset, int whence, void *user) {
    audio_mem *m = user;
    sf_count_t base = whence == SEEK_SET ? 0 : whence == SEEK_CUR ? m->pos : m->size;
    if (whence != SEEK_SET && whence != SEEK_CUR && whence != SEEK_END)
        return -1;
    if (offset < -base || offset > m->size - base)
        return -1;
    m->pos = base + offset;
    return m->pos;
}

static sf_count_t audio_mem_read(void *ptr, sf_count_t count, void *user) {
    audio_mem *m = user;
    if (count <= 0)
        return 0;
    sf_count_t k = MS_MIN(count, m->size - m->pos);
    if (k > 0)
        memcpy(ptr, m->data + m->pos, (size_t)k);
    m->pos += k;
    return k;
}

static sf_count_t audio_mem_write(const void *ptr, sf_count_t count, void *user) {
    (void)ptr;
    (void)count;
    (void)user;
    return 0; /* read-only */
}

static sf_count_t audio_mem_tell(void *user) {
    return ((audio_mem *)user)->pos;
}

ms_status ms_audio_read_memory(const void *data, size_t size, const char *name, int32_t sample_rate,
                               float **samples, int64_t *n, ms_error *err) {
    if (name == NULL)
        name = "<memory>";
    MS_TRY(audio_check_args(name, sample_rate, samples, n, err));
    if (data == NULL && size > 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: data is NULL with size %zu", name, size);
    if (size == 0)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: empty input (0 bytes), not a sound file", name);
    if (size > (size_t)INT64_MAX / 2)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "%s: size %zu is too large", name, size);
    audio_mem mem = {.data = data, .size = (sf_count_t)size, .pos = 0};
    SF_VIRTUAL_IO vio = {
        .get_filelen = audio_mem_len,
        .seek = audio_mem_seek,
        .read = audio_mem_read,
        .write = audio_mem_write,
        .tell = audio_mem_tell,
    };
    SF_INFO info;
    memset(&info, 0, sizeof info);
    SNDFILE *sf = sf_open_virtual(&vio, SFM_READ, &info, &mem);
    if (sf == NULL) {
        char msg[256];
        audio_sf_message(NULL, msg, sizeof msg);
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: not a readable sound file: %s", name, msg);
    }
    ms_status st = audio_decode(sf, &info, name, sample_rate, samples, n, err);
    sf_close(sf);
    return st;
}
