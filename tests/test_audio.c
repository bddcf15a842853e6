/*
 * test_audio.c - the audio front end (runtime/audio): ms_audio_read and Whisper's log-mel features
 * against hf/whisper_base (transformers' WhisperFeatureExtractor output, reference.safetensors
 * aK.input_features [80, 3000]).
 *
 * - speech0..2.wav: features within 1e-4 of the reference (the max error is printed);
 * - resampled copies made here (libsamplerate, written with libsndfile): 44.1 kHz float WAV,
 *   8 kHz 16-bit WAV, and a stereo float WAV whose channels average to the original, all read back
 *   at 16 kHz and compared with the 16 kHz features (tolerances and why at each check);
 * - audio longer than 30 s: consecutive windows, the second one checked against the reference;
 * - four threads making, using and freeing extractors at once: bit-identical features;
 * - preprocessor_config.json: the fixture's, and bad ones;
 * - bad files (missing, folder, empty, text, truncated header, truncated data, huge claimed
 *   sizes, zero samples, absurd rates and channel counts, NaN samples): one-line errors naming
 *   the file, no samples returned, nothing leaked (ASan's leak checker and ms_unit_test); a
 *   streamed WAV of unknown length decodes.
 */
#include "ms_test.h"

#include <math.h>
#include <pthread.h>
#include <samplerate.h>
#include <sndfile.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "audio.h"
#include "fixture_ref.h"

#include "ms_test_impl.h"

#define REF_FIXTURE "hf/whisper_base"

/* ---- helpers ---- */

static char tmp_dir[256];

static int tmp_setup(void **state) {
    (void)state;
    const char *t = getenv("TMPDIR");
    snprintf(tmp_dir, sizeof tmp_dir, "%s/ms_test_audio_XXXXXX", t != NULL && *t ? t : "/tmp");
    return mkdtemp(tmp_dir) == NULL ? -1 : 0;
}

static const char *tmp_path(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmp_dir, name);
    return buf[k];
}

static const char *const tmp_names[] = {"44k.wav", "8k.wav", "stereo.wav", "empty.wav", "text.wav", "hdr.wav",
                                        "cut.wav", "huge.wav", "zero.wav", "rate1.wav", "rate_huge.wav", "ch0.wav",
                                        "nan.wav", "stream.wav", "sub"};

static int tmp_teardown(void **state) {
    (void)state;
    for (size_t i = 0; i < MS_ARRAY_LEN(tmp_names); i++) {
        const char *p = tmp_path(tmp_names[i]);
        unlink(p);
        rmdir(p);
    }
    rmdir(tmp_dir);
    return 0;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    if (n > 0)
        assert_int_equal(fwrite(data, 1, n, fp), n);
    assert_int_equal(fclose(fp), 0);
}

/* The whole of a fixture file (malloc). */
static unsigned char *read_bytes(const char *path, size_t *n) {
    FILE *fp = fopen(path, "rb");
    if (fp == NULL)
        fail_msg("cannot open %s", path);
    assert_int_equal(fseek(fp, 0, SEEK_END), 0);
    long len = ftell(fp);
    assert_true(len > 0);
    rewind(fp);
    unsigned char *b = malloc((size_t)len);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)len, fp), (size_t)len);
    fclose(fp);
    *n = (size_t)len;
    return b;
}

/* Write frames of `channels` interleaved floats as a WAV with the given libsndfile subtype. */
static void write_wav(const char *path, const float *x, int64_t frames, int channels, int rate, int subtype) {
    SF_INFO info = {.samplerate = rate, .channels = channels, .format = SF_FORMAT_WAV | subtype};
    SNDFILE *sf = sf_open(path, SFM_WRITE, &info);
    if (sf == NULL)
        fail_msg("cannot write %s: %s", path, sf_strerror(NULL));
    assert_int_equal(sf_writef_float(sf, x, frames), frames);
    assert_int_equal(sf_close(sf), 0);
}

/* x resampled from `from` to `to` Hz with libsamplerate (malloc; *m samples). */
static float *resample(const float *x, int64_t n, int from, int to, int64_t *m) {
    double ratio = (double)to / from;
    long cap = (long)ceil((double)n * ratio) + 64;
    float *y = malloc((size_t)cap * sizeof *y);
    assert_non_null(y);
    SRC_DATA d = {.data_in = x, .data_out = y, .input_frames = (long)n, .output_frames = cap,
                  .src_ratio = ratio, .end_of_input = 1};
    assert_int_equal(src_simple(&d, SRC_SINC_BEST_QUALITY, 1), 0);
    *m = d.output_frames_gen;
    return y;
}

static const char *speech_path(int k) {
    static char p[1024];
    char rel[64];
    snprintf(rel, sizeof rel, REF_FIXTURE "/speech%d.wav", k);
    snprintf(p, sizeof p, "%s", ms_test_fixture(rel));
    return p;
}

static ms_whisper_mel *fixture_mel(void) {
    ms_error err = {0};
    ms_whisper_mel_config cfg;
    if (ms_whisper_mel_config_load(ms_test_fixture(REF_FIXTURE "/preprocessor_config.json"), &cfg, &err) != MS_OK)
        fail_msg("%s", err.msg);
    ms_whisper_mel *mel = NULL;
    if (ms_whisper_mel_init(&cfg, &mel, &err) != MS_OK)
        fail_msg("%s", err.msg);
    return mel;
}

static float *features_of(ms_whisper_mel *mel, const float *x, int64_t n) {
    ms_error err = {0};
    float *f = malloc((size_t)ms_whisper_mel_size(mel) * sizeof *f);
    assert_non_null(f);
    if (ms_whisper_log_mel(mel, x, n, f, &err) != MS_OK)
        fail_msg("%s", err.msg);
    return f;
}

/* max |a - b| over mel rows [m0, m1) of two [80, 3000] feature maps. */
static double max_err_rows(const float *a, const float *b, int m0, int m1) {
    double e = 0.0;
    for (size_t i = (size_t)m0 * 3000; i < (size_t)m1 * 3000; i++)
        e = fmax(e, fabs((double)a[i] - (double)b[i]));
    return e;
}

static double mean_err_rows(const float *a, const float *b, int m0, int m1) {
    double s = 0.0;
    for (size_t i = (size_t)m0 * 3000; i < (size_t)m1 * 3000; i++)
        s += fabs((double)a[i] - (double)b[i]);
    return s / ((double)(m1 - m0) * 3000.0);
}

static float *read_ok(const char *path, int32_t rate, int64_t *n) {
    ms_error err = {0};
    float *x = NULL;
    if (ms_audio_read(path, rate, &x, n, &err) != MS_OK)
        fail_msg("%s", err.msg);
    assert_non_null(x);
    assert_true(*n > 0);
    return x;
}

/* ---- features against the reference ---- */

static void test_features_match_reference(void **state) {
    (void)state;
    static const int64_t ref_samples[3] = {51278, 68655, 80004}; /* reference.json cases[k].samples */
    ms_whisper_mel *mel = fixture_mel();
    assert_int_equal(ms_whisper_mel_size(mel), 80 * 3000);
    ms_st_file *ref = ms_test_ref_open(REF_FIXTURE);
    for (int k = 0; k < 3; k++) {
        int64_t n = 0;
        float *x = read_ok(speech_path(k), 16000, &n);
        assert_int_equal(n, ref_samples[k]);
        float *f = features_of(mel, x, n);
        char name[64];
        snprintf(name, sizeof name, "a%d.input_features", k);
        size_t rn = 0;
        float *r = ms_test_ref_tensor(ref, name, false, &rn);
        assert_int_equal(rn, 80 * 3000);
        double e = max_err_rows(f, r, 0, 80);
        printf("    speech%d.wav: %lld samples, input_features max |err| = %.3g (tolerance 1e-4)\n", k, (long long)n, e);
        assert_true(e < 1e-4);
        /* the frame-major copy (the encoder's conv1d input) holds the same values transposed */
        float *fm = malloc(80 * 3000 * sizeof *fm);
        assert_non_null(fm);
        ms_whisper_mel_frame_major(mel, f, fm);
        for (int t = 0; t < 3000; t += 7)
            for (int m = 0; m < 80; m++)
                assert_true(fm[t * 80 + m] == f[m * 3000 + t]);
        free(fm);
        ms_free(r);
        free(f);
        free(x);
    }
    ms_st_file_free(ref);
    ms_whisper_mel_free(mel);
}

/* Memory input (libsndfile virtual I/O) decodes the same samples as the file. */
static void test_memory_equals_file(void **state) {
    (void)state;
    size_t len = 0;
    unsigned char *img = read_bytes(speech_path(1), &len);
    int64_t n = 0, m = 0;
    float *x = read_ok(speech_path(1), 16000, &n);
    float *y = NULL;
    ms_error err = {0};
    assert_int_equal(ms_audio_read_memory(img, len, "speech1 (memory)", 16000, &y, &m, &err), MS_OK);
    assert_int_equal(m, n);
    assert_memory_equal(x, y, (size_t)n * sizeof *x);
    free(img);
    free(x);
    free(y);
}

/* ---- other rates and channel counts, resampled and downmixed at read ---- */

static void test_resampled_and_stereo_inputs(void **state) {
    (void)state;
    ms_whisper_mel *mel = fixture_mel();
    int64_t n = 0;
    float *x = read_ok(speech_path(0), 16000, &n);
    float *f16 = features_of(mel, x, n);

    /* 44.1 kHz float copy -> read back at 16 kHz. Two band-limited sinc resamplings
     * (SRC_SINC_BEST_QUALITY: ripple and aliasing under -100 dB, i.e. < 1e-5 relative in power, and a
     * log10 feature moves by power-ratio / (4 ln 10)): the signal below ~7.6 kHz passes unchanged, so
     * the features agree to 1e-3 on the mel rows under ~7 kHz (rows 0..75; measured ~2e-5); the top
     * rows (up to 8 kHz, Nyquist) fall in the filters' transition band and may lose energy, which
     * the mean bound over all rows limits (measured ~3e-5). */
    int64_t n44 = 0;
    float *x44 = resample(x, n, 16000, 44100, &n44);
    write_wav(tmp_path("44k.wav"), x44, n44, 1, 44100, SF_FORMAT_FLOAT);
    int64_t nb = 0;
    float *b = read_ok(tmp_path("44k.wav"), 16000, &nb);
    assert_true(llabs(nb - n) <= 2);
    float *f44 = features_of(mel, b, nb);
    double e44_lo = max_err_rows(f44, f16, 0, 76), e44_mean = mean_err_rows(f44, f16, 0, 80);
    printf("    44.1 kHz copy: max |err| rows 0..75 = %.3g (tolerance 1e-3), mean |err| all rows = %.3g (tolerance 1e-3)\n",
           e44_lo, e44_mean);
    assert_true(e44_lo < 1e-3);
    assert_true(e44_mean < 1e-3);
    free(b);
    free(f44);
    free(x44);

    /* 8 kHz 16-bit copy -> read back at 16 kHz: everything above 4 kHz is gone (Nyquist of 8 kHz),
     * so only the mel rows wholly below ~3.6 kHz (rows 0..51) can agree, and those that reach into
     * the 8 kHz copy's transition band (3.6 .. 4 kHz) lose a little energy: max 0.05 (measured
     * ~0.016, at the highest of those rows), mean 1e-3 (measured ~4e-5). 16-bit quantisation adds
     * noise around -96 dB, under the features' floor (max - 80 dB). */
    int64_t n8 = 0;
    float *x8 = resample(x, n, 16000, 8000, &n8);
    write_wav(tmp_path("8k.wav"), x8, n8, 1, 8000, SF_FORMAT_PCM_16);
    float *c = read_ok(tmp_path("8k.wav"), 16000, &nb);
    assert_true(llabs(nb - n) <= 2);
    float *f8 = features_of(mel, c, nb);
    double e8_lo = max_err_rows(f8, f16, 0, 52), e8_mean = mean_err_rows(f8, f16, 0, 52);
    printf("    8 kHz copy: max |err| rows 0..51 = %.3g (tolerance 0.05), mean = %.3g (tolerance 1e-3)\n", e8_lo, e8_mean);
    assert_true(e8_lo < 0.05);
    assert_true(e8_mean < 1e-3);
    /* and the top rows do differ: the test would notice a reader that ignored the file's rate */
    assert_true(max_err_rows(f8, f16, 70, 80) > 0.05);
    free(c);
    free(f8);
    free(x8);

    /* stereo float copy, L = x + d, R = x - d: the mean of the channels is x up to float rounding
     * (~1e-8), so the features agree to 1e-4 (the reference tolerance) and the samples to 1e-6. */
    float *st = malloc((size_t)n * 2 * sizeof *st);
    assert_non_null(st);
    for (int64_t i = 0; i < n; i++) {
        float d = 0.25f * sinf(0.01f * (float)i);
        st[2 * i] = x[i] + d;
        st[2 * i + 1] = x[i] - d;
    }
    write_wav(tmp_path("stereo.wav"), st, n, 2, 16000, SF_FORMAT_FLOAT);
    float *s = read_ok(tmp_path("stereo.wav"), 16000, &nb);
    assert_int_equal(nb, n);
    double es = 0.0;
    for (int64_t i = 0; i < n; i++)
        es = fmax(es, fabs((double)s[i] - x[i]));
    float *fs = features_of(mel, s, nb);
    double efs = max_err_rows(fs, f16, 0, 80);
    printf("    stereo copy: max |sample err| = %.3g (tolerance 1e-6), features max |err| = %.3g (tolerance 1e-4)\n", es,
           efs);
    assert_true(es < 1e-6);
    assert_true(efs < 1e-4);
    free(fs);
    free(s);
    free(st);

    free(f16);
    free(x);
    ms_whisper_mel_free(mel);
}

/* ---- longer than 30 s: consecutive windows ---- */

static void test_long_audio_windows(void **state) {
    (void)state;
    ms_whisper_mel *mel = fixture_mel();
    int64_t n = 0;
    float *x = read_ok(speech_path(2), 16000, &n);
    /* 30 s of a low tone, then speech2: window 1 must be speech2's features exactly as the reference */
    int64_t total = 480000 + n;
    float *y = malloc((size_t)total * sizeof *y);
    assert_non_null(y);
    for (int64_t i = 0; i < 480000; i++)
        y[i] = 0.1f * sinf(2.0f * 3.14159265f * 220.0f * (float)i / 16000.0f);
    memcpy(y + 480000, x, (size_t)n * sizeof *x);
    assert_int_equal(ms_whisper_mel_n_windows(mel, total), 2);
    assert_int_equal(ms_whisper_mel_n_windows(mel, 480000), 1);
    assert_int_equal(ms_whisper_mel_n_windows(mel, 480001), 2);
    assert_int_equal(ms_whisper_mel_n_windows(mel, 0), 1);
    float *f = malloc((size_t)ms_whisper_mel_size(mel) * sizeof *f);
    assert_non_null(f);
    ms_error err = {0};
    assert_int_equal(ms_whisper_log_mel_window(mel, y, total, 1, f, &err), MS_OK);
    ms_st_file *ref = ms_test_ref_open(REF_FIXTURE);
    size_t rn = 0;
    float *r = ms_test_ref_tensor(ref, "a2.input_features", false, &rn);
    double e = max_err_rows(f, r, 0, 80);
    printf("    window 1 of 30 s tone + speech2.wav: max |err| = %.3g (tolerance 1e-4)\n", e);
    assert_true(e < 1e-4);
    /* window 0 is the tone alone: its features are not speech2's */
    assert_int_equal(ms_whisper_log_mel_window(mel, y, total, 0, f, &err), MS_OK);
    assert_true(max_err_rows(f, r, 0, 80) > 0.5);
    /* the whole input through ms_whisper_log_mel is truncated to the first 30 s: window 0 */
    float *g = features_of(mel, y, total);
    assert_memory_equal(f, g, (size_t)ms_whisper_mel_size(mel) * sizeof *f);
    /* windows outside the range, negative counts */
    assert_int_equal(ms_whisper_log_mel_window(mel, y, total, 2, f, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "window 2"));
    assert_int_equal(ms_whisper_log_mel_window(mel, y, total, -1, f, &err), MS_ERR_INVALID_ARG);
    assert_int_equal(ms_whisper_log_mel(mel, y, -5, f, &err), MS_ERR_INVALID_ARG);
    assert_int_equal(ms_whisper_log_mel(mel, NULL, 10, f, &err), MS_ERR_INVALID_ARG);
    /* silence (no samples) is valid: all features equal (floor = max) */
    assert_int_equal(ms_whisper_log_mel(mel, NULL, 0, f, &err), MS_OK);
    for (int i = 0; i < 80 * 3000; i++)
        assert_true(f[i] == f[0]);
    ms_free(r);
    ms_st_file_free(ref);
    free(g);
    free(f);
    free(y);
    free(x);
    ms_whisper_mel_free(mel);
}

/* ---- threads: extractors made, used and freed concurrently (FFTW's planner is locked) ---- */

typedef struct mel_thread {
    const float *x;
    int64_t n;
    const float *want; /* [80, 3000] features of x from the main thread */
    int rounds;
    int mismatches;    /* out: rounds whose features differ from want */
    int failures;      /* out: calls that failed */
} mel_thread;

static void *mel_thread_main(void *arg) {
    mel_thread *t = arg;
    ms_whisper_mel_config cfg = ms_whisper_mel_config_default();
    float *f = malloc(80 * 3000 * sizeof *f);
    for (int r = 0; r < t->rounds && f != NULL; r++) {
        ms_error err = {0};
        ms_whisper_mel *mel = NULL;
        if (ms_whisper_mel_init(&cfg, &mel, &err) != MS_OK || ms_whisper_log_mel(mel, t->x, t->n, f, &err) != MS_OK)
            t->failures++;
        else if (memcmp(f, t->want, 80 * 3000 * sizeof *f) != 0)
            t->mismatches++;
        ms_whisper_mel_free(mel);
    }
    if (f == NULL)
        t->failures++;
    free(f);
    return NULL;
}

static void test_threads(void **state) {
    (void)state;
    ms_whisper_mel *mel = fixture_mel();
    int64_t n = 0;
    float *x = read_ok(speech_path(1), 16000, &n);
    float *want = features_of(mel, x, n);
    enum { N_THREADS = 4 };
    pthread_t th[N_THREADS];
    mel_thread args[N_THREADS];
    for (int i = 0; i < N_THREADS; i++) {
        args[i] = (mel_thread){x, n, want, 3, 0, 0};
        assert_int_equal(pthread_create(&th[i], NULL, mel_thread_main, &args[i]), 0);
    }
    for (int i = 0; i < N_THREADS; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(args[i].failures, 0);
        assert_int_equal(args[i].mismatches, 0); /* FFTW_ESTIMATE plans: the same bits every time */
    }
    free(want);
    free(x);
    ms_whisper_mel_free(mel);
}

/* ---- preprocessor_config.json ---- */

static void expect_config_error(const char *json, ms_status want, const char *needle) {
    const char *p = tmp_path("text.wav");
    write_bytes(p, json, strlen(json));
    ms_whisper_mel_config cfg;
    ms_error err = {0};
    ms_status st = ms_whisper_mel_config_load(p, &cfg, &err);
    if (st == MS_OK) {
        ms_whisper_mel *mel = NULL;
        st = ms_whisper_mel_init(&cfg, &mel, &err);
        ms_whisper_mel_free(mel);
    }
    if (st != want || strstr(err.msg, needle) == NULL || strchr(err.msg, '\n') != NULL)
        fail_msg("config %s: status %d, message \"%s\" (want %d with \"%s\")", json, (int)st, err.msg, (int)want,
                 needle);
}

static void test_config(void **state) {
    (void)state;
    ms_whisper_mel_config cfg, def = ms_whisper_mel_config_default();
    ms_error err = {0};
    assert_int_equal(ms_whisper_mel_config_load(ms_test_fixture(REF_FIXTURE "/preprocessor_config.json"), &cfg, &err),
                     MS_OK);
    assert_int_equal(cfg.feature_size, def.feature_size);
    assert_int_equal(cfg.sampling_rate, def.sampling_rate);
    assert_int_equal(cfg.hop_length, def.hop_length);
    assert_int_equal(cfg.n_fft, def.n_fft);
    assert_int_equal(cfg.chunk_length, def.chunk_length);
    assert_int_equal(cfg.n_samples, def.n_samples);
    assert_int_equal(cfg.nb_max_frames, def.nb_max_frames);
    /* 128 mel bins (large-v3) is a valid extractor */
    write_bytes(tmp_path("text.wav"), "{\"feature_size\": 128}", 21);
    assert_int_equal(ms_whisper_mel_config_load(tmp_path("text.wav"), &cfg, &err), MS_OK);
    assert_int_equal(cfg.feature_size, 128);
    ms_whisper_mel *mel = NULL;
    assert_int_equal(ms_whisper_mel_init(&cfg, &mel, &err), MS_OK);
    assert_int_equal(ms_whisper_mel_size(mel), 128 * 3000);
    ms_whisper_mel_free(mel);

    expect_config_error("{\"feature_size\": \"80\"}", MS_ERR_FORMAT, "\"feature_size\" must be an integer");
    expect_config_error("{\"hop_length\": 0}", MS_ERR_FORMAT, "\"hop_length\" = 0 is outside");
    expect_config_error("{\"n_fft\": 401}", MS_ERR_INVALID_ARG, "n_fft 401 must be even");
    expect_config_error("{\"nb_max_frames\": 2999}", MS_ERR_INVALID_ARG, "nb_max_frames 2999");
    expect_config_error("{\"n_samples\": 100}", MS_ERR_INVALID_ARG, "n_samples 100 != chunk_length");
    expect_config_error("{\"sampling_rate\": 8000}", MS_ERR_INVALID_ARG, "Nyquist");
    expect_config_error("{\"dither\": 0.5}", MS_ERR_UNSUPPORTED, "dither");
    expect_config_error("{\"feature_size\": 80", MS_ERR_PARSE, "text.wav:");
    expect_config_error("[1, 2]", MS_ERR_FORMAT, "not a JSON object");
    assert_int_equal(ms_whisper_mel_config_load(tmp_path("none.json"), &cfg, &err), MS_ERR_PARSE);
    assert_non_null(strstr(err.msg, "none.json"));
}

/* ---- bad files ---- */

static void le16(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

static void le32(unsigned char *p, uint32_t v) {
    le16(p, v & 0xffff);
    le16(p + 2, v >> 16);
}

/* A canonical 44-byte PCM16 WAV header followed by data_bytes of payload (n_payload written). */
static size_t make_wav(unsigned char *buf, uint16_t channels, uint32_t rate, uint32_t data_bytes, size_t n_payload) {
    memcpy(buf, "RIFF", 4);
    le32(buf + 4, 36 + data_bytes);
    memcpy(buf + 8, "WAVEfmt ", 8);
    le32(buf + 16, 16);
    le16(buf + 20, 1); /* PCM */
    le16(buf + 22, channels);
    le32(buf + 24, rate);
    le32(buf + 28, rate * channels * 2);
    le16(buf + 32, (uint16_t)(channels * 2));
    le16(buf + 34, 16);
    memcpy(buf + 36, "data", 4);
    le32(buf + 40, data_bytes);
    for (size_t i = 0; i < n_payload; i++)
        buf[44 + i] = (unsigned char)(i * 37);
    return 44 + n_payload;
}

/* ms_audio_read of `path` (and ms_audio_read_memory of its bytes) must fail with one line that
 * names it and contains `needle`; no samples come back. */
static void expect_read_error(const char *path, ms_status want, const char *needle) {
    ms_error err = {0};
    float *x = (float *)(uintptr_t)1;
    int64_t n = 7;
    ms_status st = ms_audio_read(path, 16000, &x, &n, &err);
    printf("    %s\n", err.msg);
    if (st != want || strstr(err.msg, path) == NULL || strstr(err.msg, needle) == NULL ||
        strchr(err.msg, '\n') != NULL)
        fail_msg("%s: status %d, message \"%s\" (want %d with \"%s\")", path, (int)st, err.msg, (int)want, needle);
    assert_null(x);
    assert_int_equal(n, 0);
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 0) {
        size_t len = 0;
        unsigned char *img = read_bytes(path, &len);
        ms_error merr = {0};
        st = ms_audio_read_memory(img, len, "upload.wav", 16000, &x, &n, &merr);
        if (st != want || strstr(merr.msg, "upload.wav") == NULL || strstr(merr.msg, needle) == NULL)
            fail_msg("%s from memory: status %d, message \"%s\" (want %d with \"%s\")", path, (int)st, merr.msg,
                     (int)want, needle);
        assert_null(x);
        free(img);
    }
}

static void test_bad_files(void **state) {
    (void)state;
    unsigned char buf[4096];
    expect_read_error(tmp_path("missing.wav"), MS_ERR_NOT_FOUND, "No such file");
    assert_int_equal(mkdir(tmp_path("sub"), 0700), 0);
    expect_read_error(tmp_path("sub"), MS_ERR_IO, "not a regular file");
    write_bytes(tmp_path("empty.wav"), "", 0);
    expect_read_error(tmp_path("empty.wav"), MS_ERR_FORMAT, "empty file");
    const char *text = "this is not a sound file, just text that is long enough to be looked at\n";
    write_bytes(tmp_path("text.wav"), text, strlen(text));
    expect_read_error(tmp_path("text.wav"), MS_ERR_FORMAT, "not a readable sound file");
    /* the first 20 bytes of a real WAV: the header stops inside the fmt chunk */
    size_t len = 0;
    unsigned char *img = read_bytes(speech_path(0), &len);
    write_bytes(tmp_path("hdr.wav"), img, 20);
    expect_read_error(tmp_path("hdr.wav"), MS_ERR_FORMAT, "not a readable sound file");
    free(img);
    /* zero samples: a valid header with an empty data chunk */
    write_bytes(tmp_path("zero.wav"), buf, make_wav(buf, 1, 16000, 0, 0));
    expect_read_error(tmp_path("zero.wav"), MS_ERR_FORMAT, "no samples");
    /* huge claimed size (4 GiB - 16 of data) with 1000 bytes present: truncated, and nothing of
     * the claimed size is allocated (ASan would report a 4 GiB request) */
    write_bytes(tmp_path("huge.wav"), buf, make_wav(buf, 1, 16000, 0xfffffff0u, 1000));
    expect_read_error(tmp_path("huge.wav"), MS_ERR_FORMAT, "truncated: the header claims 4294967280 bytes");
    /* a streamed WAV (data size 0xffffffff: length unknown) is not truncated: its 500 frames */
    write_bytes(tmp_path("stream.wav"), buf, make_wav(buf, 1, 16000, 0xffffffffu, 1000));
    {
        ms_error err = {0};
        float *x = NULL;
        int64_t n = 0;
        ms_status st = ms_audio_read(tmp_path("stream.wav"), 16000, &x, &n, &err);
        if (st != MS_OK)
            fail_msg("%s", err.msg);
        assert_int_equal(n, 500);
        free(x);
    }
    /* absurd rates and channel counts in the header */
    write_bytes(tmp_path("rate1.wav"), buf, make_wav(buf, 1, 1, 200, 200));
    expect_read_error(tmp_path("rate1.wav"), MS_ERR_FORMAT, "sample rate 1 Hz is outside");
    write_bytes(tmp_path("rate_huge.wav"), buf, make_wav(buf, 1, 2000000000u, 200, 200));
    expect_read_error(tmp_path("rate_huge.wav"), MS_ERR_FORMAT, "");
    write_bytes(tmp_path("ch0.wav"), buf, make_wav(buf, 0, 16000, 200, 200));
    expect_read_error(tmp_path("ch0.wav"), MS_ERR_FORMAT, "");
    /* a float WAV holding a NaN */
    float nanv[4] = {0.0f, 0.5f, NAN, 0.1f};
    write_wav(tmp_path("nan.wav"), nanv, 4, 1, 16000, SF_FORMAT_FLOAT);
    expect_read_error(tmp_path("nan.wav"), MS_ERR_FORMAT, "sample 2 is not a finite number");
    /* bad arguments */
    ms_error err = {0};
    float *x = NULL;
    int64_t n = 0;
    assert_int_equal(ms_audio_read(speech_path(0), 0, &x, &n, &err), MS_ERR_INVALID_ARG);
    assert_non_null(strstr(err.msg, "target sample rate 0 Hz"));
    assert_int_equal(ms_audio_read(speech_path(0), 16000, NULL, &n, &err), MS_ERR_INVALID_ARG);
    assert_int_equal(ms_audio_read(NULL, 16000, &x, &n, &err), MS_ERR_INVALID_ARG);
    assert_int_equal(ms_audio_read_memory(NULL, 10, "m", 16000, &x, &n, &err), MS_ERR_INVALID_ARG);
    assert_int_equal(ms_audio_read_memory(buf, 0, "m", 16000, &x, &n, &err), MS_ERR_FORMAT);
}

/* A truncated data chunk: the header claims more than the file holds (a cut-off download). */
static void test_truncated_data(void **state) {
    (void)state;
    size_t len = 0;
    unsigned char *img = read_bytes(speech_path(0), &len);
    write_bytes(tmp_path("cut.wav"), img, len / 2);
    expect_read_error(tmp_path("cut.wav"), MS_ERR_FORMAT, "truncated: the header claims 102556 bytes of audio data, the file holds 51256");
    free(img);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        ms_unit_test(test_features_match_reference),
        ms_unit_test(test_memory_equals_file),
        ms_unit_test(test_resampled_and_stereo_inputs),
        ms_unit_test(test_long_audio_windows),
        ms_unit_test(test_threads),
        ms_unit_test(test_config),
        ms_unit_test(test_bad_files),
        ms_unit_test(test_truncated_data),
    };
    return cmocka_run_group_tests(tests, tmp_setup, tmp_teardown);
}
