/*
 * whisper_mel.c - Whisper's log-mel input features, as transformers' WhisperFeatureExtractor.
 *
 * Sources of each step (transformers, models/whisper/feature_extraction_whisper.py and
 * audio_utils.py): the input is truncated/zero-padded to n_samples (__call__ with
 * padding="max_length"); window_function(n_fft, "hann") is periodic (0.5 - 0.5 cos(2 pi i / n_fft));
 * spectrogram()/torch.stft use center=True with reflect padding of n_fft / 2; power 2.0;
 * mel_filter_bank(..., norm="slaney", mel_scale="slaney") builds triangles between
 * linspace(mel(0), mel(8000), feature_size + 2) mapped back to Hz, on the FFT bin frequencies
 * linspace(0, sampling_rate // 2, n_fft / 2 + 1), each scaled by 2 / (f[m + 2] - f[m]);
 * log10(max(mel, 1e-10)); log_spec[:, :-1]; maximum(log_spec, log_spec.max() - 8); (x + 4) / 4.
 *
 * Constraints: the FFT is FFTW3's (double precision r2c, one plan per extractor made with
 * FFTW_ESTIMATE, reused for every frame); FFTW's planner is not thread-safe, so plan creation and
 * destruction hold one process-wide lock. The per-frame work allocates nothing.
 */
#include "audio.h"

#include <fftw3.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <string.h>

/* transformers' WhisperFeatureExtractor passes max_frequency=8000.0 to mel_filter_bank. */
#define MEL_MAX_HZ 8000.0
/* log10 clamp (audio_utils.spectrogram mel_floor) and the dynamic range kept below the max. */
#define MEL_FLOOR 1e-10
#define MEL_RANGE 8.0

struct ms_whisper_mel {
    ms_whisper_mel_config cfg;
    int32_t n_bins;         /* n_fft / 2 + 1 */
    double *window;         /* [n_fft] periodic Hann */
    double *filters;        /* [feature_size, n_bins] Slaney mel filters (transposed from HF's [n_bins, mel]) */
    int32_t *band_lo;       /* [feature_size] first bin where filters[m] != 0 */
    int32_t *band_hi;       /* [feature_size] one past the last such bin */
    double *padded;         /* [n_samples + n_fft] the window reflect-padded by n_fft / 2 on each side */
    double *log_spec;       /* [feature_size, nb_max_frames] log10 mel before the floor */
    double *frame;          /* [n_fft] fftw_malloc: one windowed frame (plan input) */
    fftw_complex *spectrum; /* [n_bins] fftw_malloc: its FFT (plan output) */
    fftw_plan plan;         /* r2c of n_fft points, frame -> spectrum */
};

/* FFTW's planner (fftw_plan_*, fftw_destroy_plan) must not run on two threads at once. */
static pthread_mutex_t mel_plan_lock = PTHREAD_MUTEX_INITIALIZER;

ms_whisper_mel_config ms_whisper_mel_config_default(void) {
    ms_whisper_mel_config c = {
        .feature_size = 80,
        .sampling_rate = 16000,
        .hop_length = 160,
        .n_fft = 400,
        .chunk_length = 30,
        .n_samples = 480000,
        .nb_max_frames = 3000,
    };
    return c;
}

/* ---- preprocessor_config.json ---- */

/* Integer key `key` of `root` into *v when present, within [lo, hi]. */
static ms_status mel_json_int(const char *path, json_t *root, const char *key, int64_t lo, int64_t hi, int64_t *v,
                              ms_error *err) {
    json_t *j = json_object_get(root, key);
    if (j == NULL || json_is_null(j))
        return MS_OK;
    if (!json_is_integer(j))
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: \"%s\" must be an integer", path, key);
    json_int_t x = json_integer_value(j);
    if (x < lo || x > hi)
        return MS_FAIL(err, MS_ERR_FORMAT, "%s: \"%s\" = %lld is outside %lld .. %lld", path, key, (long long)x,
                       (long long)lo, (long long)hi);
    *v = (int64_t)x;
    return MS_OK;
}

static ms_status mel_config_parse(const char *path, json_t *root, ms_whisper_mel_config *cfg, ms_error *err) {
    ms_whisper_mel_config c = ms_whisper_mel_config_default();
    int64_t feature_size = c.feature_size, sampling_rate = c.sampling_rate, hop = c.hop_length, n_fft = c.n_fft;
    int64_t chunk = c.chunk_length, n_samples = -1, frames = -1;
    MS_TRY(mel_json_int(path, root, "feature_size", 1, 1024, &feature_size, err));
    MS_TRY(mel_json_int(path, root, "sampling_rate", MS_AUDIO_MIN_RATE, MS_AUDIO_MAX_RATE, &sampling_rate, err));
    MS_TRY(mel_json_int(path, root, "hop_length", 1, 1 << 20, &hop, err));
    MS_TRY(mel_json_int(path, root, "n_fft", 2, 1 << 20, &n_fft, err));
    MS_TRY(mel_json_int(path, root, "chunk_length", 1, 3600, &chunk, err));
    MS_TRY(mel_json_int(path, root, "n_samples", 1, (int64_t)3600 * MS_AUDIO_MAX_RATE, &n_samples, err));
    MS_TRY(mel_json_int(path, root, "nb_max_frames", 1, (int64_t)1 << 30, &frames, err));
    json_t *dither = json_object_get(root, "dither");
    if (dither != NULL && !json_is_null(dither)) {
        if (!json_is_number(dither))
            return MS_FAIL(err, MS_ERR_FORMAT, "%s: \"dither\" must be a number", path);
        if (json_number_value(dither) != 0.0)
            return MS_FAIL(err, MS_ERR_UNSUPPORTED, "%s: \"dither\" = %g adds random noise; only 0 is supported", path,
                           json_number_value(dither));
    }
    /* WhisperFeatureExtractor.__init__ derives these two; a file that states them must agree. */
    if (n_samples < 0)
        n_samples = chunk * sampling_rate;
    if (frames < 0)
        frames = n_samples / hop;
    c.feature_size = (int32_t)feature_size;
    c.sampling_rate = (int32_t)sampling_rate;
    c.hop_length = (int32_t)hop;
    c.n_fft = (int32_t)n_fft;
    c.chunk_length = (int32_t)chunk;
    c.n_samples = n_samples;
    c.nb_max_frames = (int32_t)frames;
    *cfg = c;
    return MS_OK;
}

ms_status ms_whisper_mel_config_load(const char *path, ms_whisper_mel_config *cfg, ms_error *err) {
    if (path == NULL || cfg == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "ms_whisper_mel_config_load: path and cfg must not be NULL");
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return MS_FAIL(err, MS_ERR_PARSE, "%s:%d:%d: cannot load: %s", path, jerr.line, jerr.column, jerr.text);
    ms_status st;
    if (!json_is_object(root))
        st = MS_FAIL(err, MS_ERR_FORMAT, "%s: top level is not a JSON object", path);
    else
        st = mel_config_parse(path, root, cfg, err);
    json_decref(root);
    return st;
}

/* ---- the mel filter bank (audio_utils.mel_filter_bank, Slaney scale and norm) ---- */

static double mel_hz_to_mel(double hz) {
    /* audio_utils.hertz_to_mel(mel_scale="slaney"): linear below 1 kHz, logarithmic above. */
    if (hz >= 1000.0)
        return 15.0 + log(hz / 1000.0) * (27.0 / log(6.4));
    return 3.0 * hz / 200.0;
}

static double mel_mel_to_hz(double mel) {
    if (mel >= 15.0)
        return 1000.0 * exp(log(6.4) / 27.0 * (mel - 15.0));
    return 200.0 * mel / 3.0;
}

static void mel_build_filters(ms_whisper_mel *m, double *filter_hz /* [feature_size + 2] */) {
    int32_t n_mel = m->cfg.feature_size, n_bins = m->n_bins;
    double mel_lo = mel_hz_to_mel(0.0), mel_hi = mel_hz_to_mel(MEL_MAX_HZ);
    for (int32_t i = 0; i < n_mel + 2; i++) /* np.linspace(mel_lo, mel_hi, n_mel + 2) */
        filter_hz[i] = mel_mel_to_hz(mel_lo + (mel_hi - mel_lo) * i / (n_mel + 1));
    /* np.linspace(0, sampling_rate // 2, n_bins) */
    double nyq = (double)(m->cfg.sampling_rate / 2);
    for (int32_t mm = 0; mm < n_mel; mm++) {
        double f0 = filter_hz[mm], f1 = filter_hz[mm + 1], f2 = filter_hz[mm + 2];
        double enorm = 2.0 / (f2 - f0);
        int32_t lo = n_bins, hi = 0;
        for (int32_t k = 0; k < n_bins; k++) {
            double fk = n_bins > 1 ? nyq * k / (n_bins - 1) : 0.0;
            double down = (fk - f0) / (f1 - f0); /* -slopes[:, :-2] / filter_diff[:-1] */
            double up = (f2 - fk) / (f2 - f1);   /* slopes[:, 2:] / filter_diff[1:] */
            double v = fmax(0.0, fmin(down, up)) * enorm;
            m->filters[(size_t)mm * (size_t)n_bins + (size_t)k] = v;
            if (v != 0.0) {
                lo = MS_MIN(lo, k);
                hi = MS_MAX(hi, k + 1);
            }
        }
        m->band_lo[mm] = lo < hi ? lo : 0;
        m->band_hi[mm] = lo < hi ? hi : 0;
    }
}

/* ---- init / free ---- */

static ms_status mel_check_config(const ms_whisper_mel_config *c, ms_error *err) {
    if (c->feature_size < 1 || c->feature_size > 1024)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "whisper mel: feature_size %d is outside 1 .. 1024", c->feature_size);
    if (c->sampling_rate < MS_AUDIO_MIN_RATE || c->sampling_rate > MS_AUDIO_MAX_RATE)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "whisper mel: sampling_rate %d is outside %d .. %d", c->sampling_rate,
                       MS_AUDIO_MIN_RATE, MS_AUDIO_MAX_RATE);
    if (c->sampling_rate / 2 < MEL_MAX_HZ)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "whisper mel: sampling_rate %d puts Nyquist below the filters' top frequency %g Hz",
                       c->sampling_rate, MEL_MAX_HZ);
    if (c->chunk_length < 1 || c->n_samples != (int64_t)c->chunk_length * c->sampling_rate)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "whisper mel: n_samples %lld != chunk_length %d * sampling_rate %d",
                       (long long)c->n_samples, c->chunk_length, c->sampling_rate);
    if (c->n_fft < 2 || c->n_fft % 2 != 0 || c->n_fft > c->n_samples)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "whisper mel: n_fft %d must be even and within 2 .. n_samples %lld",
                       c->n_fft, (long long)c->n_samples);
    if (c->hop_length < 1 || c->nb_max_frames != c->n_samples / c->hop_length)
        return MS_FAIL(err, MS_ERR_INVALID_ARG,
                       "whisper mel: nb_max_frames %d != n_samples %lld / hop_length %d (the frames kept after "
                       "dropping the last)",
                       c->nb_max_frames, (long long)c->n_samples, c->hop_length);
    return MS_OK;
}

ms_status ms_whisper_mel_init(const ms_whisper_mel_config *cfg, ms_whisper_mel **out, ms_error *err) {
    if (cfg == NULL || out == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "ms_whisper_mel_init: cfg and out must not be NULL");
    *out = NULL;
    MS_TRY(mel_check_config(cfg, err));
    ms_whisper_mel *m = ms_calloc(1, sizeof *m);
    double *filter_hz = NULL;
    if (m == NULL)
        return MS_FAIL(err, MS_ERR_OOM, "whisper mel: out of memory");
    m->cfg = *cfg;
    int32_t n_fft = cfg->n_fft, n_mel = cfg->feature_size;
    m->n_bins = n_fft / 2 + 1;
    m->window = ms_calloc((size_t)n_fft, sizeof *m->window);
    m->filters = ms_calloc((size_t)n_mel * (size_t)m->n_bins, sizeof *m->filters);
    m->band_lo = ms_calloc((size_t)n_mel, sizeof *m->band_lo);
    m->band_hi = ms_calloc((size_t)n_mel, sizeof *m->band_hi);
    m->padded = ms_calloc((size_t)cfg->n_samples + (size_t)n_fft, sizeof *m->padded);
    m->log_spec = ms_calloc((size_t)n_mel * (size_t)cfg->nb_max_frames, sizeof *m->log_spec);
    filter_hz = ms_calloc((size_t)n_mel + 2, sizeof *filter_hz);
    m->frame = fftw_malloc((size_t)n_fft * sizeof *m->frame);
    m->spectrum = fftw_malloc((size_t)m->n_bins * sizeof *m->spectrum);
    if (m->window == NULL || m->filters == NULL || m->band_lo == NULL || m->band_hi == NULL || m->padded == NULL ||
        m->log_spec == NULL || filter_hz == NULL || m->frame == NULL || m->spectrum == NULL) {
        ms_free(filter_hz);
        ms_whisper_mel_free(m);
        return MS_FAIL(err, MS_ERR_OOM, "whisper mel: out of memory for n_fft %d, %d mel bins, %lld samples", n_fft,
                       n_mel, (long long)cfg->n_samples);
    }
    for (int32_t i = 0; i < n_fft; i++) /* torch.hann_window(n_fft) / np.hanning(n_fft + 1)[:-1] */
        m->window[i] = 0.5 - 0.5 * cos(2.0 * M_PI * i / n_fft);
    mel_build_filters(m, filter_hz);
    ms_free(filter_hz);
    pthread_mutex_lock(&mel_plan_lock);
    m->plan = fftw_plan_dft_r2c_1d(n_fft, m->frame, m->spectrum, FFTW_ESTIMATE);
    pthread_mutex_unlock(&mel_plan_lock);
    if (m->plan == NULL) {
        ms_whisper_mel_free(m);
        return MS_FAIL(err, MS_ERR_INTERNAL, "whisper mel: FFTW could not plan an r2c FFT of %d points", n_fft);
    }
    *out = m;
    return MS_OK;
}

void ms_whisper_mel_free(ms_whisper_mel *mel) {
    if (mel == NULL)
        return;
    if (mel->plan != NULL) {
        pthread_mutex_lock(&mel_plan_lock);
        fftw_destroy_plan(mel->plan);
        pthread_mutex_unlock(&mel_plan_lock);
    }
    fftw_free(mel->frame);
    fftw_free(mel->spectrum);
    ms_free(mel->window);
    ms_free(mel->filters);
    ms_free(mel->band_lo);
    ms_free(mel->band_hi);
    ms_free(mel->padded);
    ms_free(mel->log_spec);
    ms_free(mel);
}

int64_t ms_whisper_mel_size(const ms_whisper_mel *mel) {
    return (int64_t)mel->cfg.feature_size * mel->cfg.nb_max_frames;
}

int64_t ms_whisper_mel_n_windows(const ms_whisper_mel *mel, int64_t n) {
    return n <= 0 ? 1 : MS_CEIL_DIV(n, mel->cfg.n_samples);
}

/* ---- features ---- */

ms_status ms_whisper_log_mel(ms_whisper_mel *mel, const float *samples, int64_t n, float *out, ms_error *err) {
    if (mel == NULL || out == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "ms_whisper_log_mel: mel and out must not be NULL");
    if (n < 0 || (n > 0 && samples == NULL))
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "ms_whisper_log_mel: %lld samples at %p", (long long)n,
                       (const void *)samples);
    const ms_whisper_mel_config *c = &mel->cfg;
    int64_t N = c->n_samples, half = c->n_fft / 2, used = MS_MIN(n, N);
    int32_t n_fft = c->n_fft, n_mel = c->feature_size, T = c->nb_max_frames, n_bins = mel->n_bins;
    /* The padded window: [half reflected | x truncated/zero-padded to N | half reflected]. With
     * center=True numpy/torch reflect without repeating the edge sample: x[-j] = x[j]. */
    double *p = mel->padded + half;
    for (int64_t i = 0; i < used; i++)
        p[i] = samples[i];
    for (int64_t i = used; i < N; i++)
        p[i] = 0.0;
    for (int64_t j = 1; j <= half; j++) {
        p[-j] = p[j];
        p[N - 1 + j] = p[N - 1 - j];
    }
    double max = -INFINITY;
    for (int32_t t = 0; t < T; t++) { /* frames 0 .. T-1; frame T (the last) is dropped */
        const double *src = mel->padded + (size_t)t * (size_t)c->hop_length;
        for (int32_t i = 0; i < n_fft; i++)
            mel->frame[i] = src[i] * mel->window[i];
        fftw_execute(mel->plan);
        /* power spectrum, kept in frame[0 .. n_bins) (n_bins <= n_fft) */
        double *power = mel->frame;
        for (int32_t k = 0; k < n_bins; k++) {
            double re = mel->spectrum[k][0], im = mel->spectrum[k][1];
            power[k] = re * re + im * im;
        }
        for (int32_t m = 0; m < n_mel; m++) {
            const double *f = mel->filters + (size_t)m * (size_t)n_bins;
            double acc = 0.0;
            for (int32_t k = mel->band_lo[m]; k < mel->band_hi[m]; k++)
                acc += f[k] * power[k];
            double v = log10(fmax(acc, MEL_FLOOR));
            mel->log_spec[(size_t)m * (size_t)T + (size_t)t] = v;
            max = fmax(max, v);
        }
    }
    double floor_v = max - MEL_RANGE;
    for (size_t i = 0; i < (size_t)n_mel * (size_t)T; i++)
        out[i] = (float)((fmax(mel->log_spec[i], floor_v) + 4.0) / 4.0);
    return MS_OK;
}

ms_status ms_whisper_log_mel_window(ms_whisper_mel *mel, const float *samples, int64_t n, int64_t window,
                                    float *out, ms_error *err) {
    if (mel == NULL)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "ms_whisper_log_mel_window: mel is NULL");
    if (n < 0)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "ms_whisper_log_mel_window: %lld samples", (long long)n);
    int64_t nw = ms_whisper_mel_n_windows(mel, n);
    if (window < 0 || window >= nw)
        return MS_FAIL(err, MS_ERR_INVALID_ARG, "ms_whisper_log_mel_window: window %lld of %lld samples is outside 0 .. %lld",
                       (long long)window, (long long)n, (long long)(nw - 1));
    int64_t start = window * mel->cfg.n_samples;
    int64_t len = MS_MIN(n - start, mel->cfg.n_samples);
    return ms_whisper_log_mel(mel, len > 0 ? samples + start : samples, MS_MAX(len, 0), out, err);
}

void ms_whisper_mel_frame_major(const ms_whisper_mel *mel, const float *in, float *out) {
    const size_t n_mel = (size_t)mel->cfg.feature_size, T = (size_t)mel->cfg.nb_max_frames;
    for (size_t m = 0; m < n_mel; m++)
        for (size_t t = 0; t < T; t++)
            out[t * n_mel + m] = in[m * T + t];
}
