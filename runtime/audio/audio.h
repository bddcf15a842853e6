/*
 * audio.h - the audio front end: sound files to mono float samples at a chosen rate, and Whisper's
 * log-mel input features (transformers' WhisperFeatureExtractor) computed with FFTW3.
 *
 * Ownership: ms_audio_* and ms_whisper_* functions borrow their arguments. Sample buffers returned
 * through `float **samples` are allocated with malloc and freed by the caller with free() (so that
 * callers outside mstar-c need no allocator of ours). Objects returned by *_init are owned by the
 * caller and released with the matching *_free (which accepts NULL).
 *
 * Threads: an ms_whisper_mel holds its own FFT buffers, so one object serves one thread at a time;
 * distinct objects may run concurrently (FFTW plan creation and destruction, which FFTW does not
 * allow concurrently, are serialised by a lock inside whisper_mel.c).
 *
 * Usage:
 *     ms_error err = {0};
 *     ms_whisper_mel_config cfg;
 *     ms_whisper_mel *mel = NULL;
 *     float *x = NULL; int64_t n = 0;
 *     if (ms_whisper_mel_config_load("ckpt/preprocessor_config.json", &cfg, &err) ||
 *         ms_whisper_mel_init(&cfg, &mel, &err) ||
 *         ms_audio_read("speech.wav", cfg.sampling_rate, &x, &n, &err)) { puts(err.msg); ... }
 *     int64_t n_windows = ms_whisper_mel_n_windows(mel, n);
 *     float *feat = malloc(ms_whisper_mel_size(mel) * sizeof(float));   // [80, 3000]
 *     for (int64_t w = 0; w < n_windows; w++)
 *         ms_whisper_log_mel_window(mel, x, n, w, feat, &err);           // 30 s window w
 */
#ifndef MS_AUDIO_H
#define MS_AUDIO_H

#include "ms_base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- reading sound files ---- */

/* Sample rates accepted for files and as targets, in Hz (outside: an "absurd rate" error). */
#define MS_AUDIO_MIN_RATE 1000
#define MS_AUDIO_MAX_RATE 768000
/* Longest input accepted, in seconds at the file's own rate (4 hours): longer is refused before
 * anything that large is allocated. */
#define MS_AUDIO_MAX_SECONDS (4 * 3600)
/* Most channels a file may have. */
#define MS_AUDIO_MAX_CHANNELS 64

/*
 * Read the sound file `path` (WAV, FLAC, OGG, AIFF, ... : whatever libsndfile reads), downmix it to
 * mono (the mean of the channels, as librosa.to_mono) and resample it to `sample_rate` Hz with
 * libsamplerate (SRC_SINC_BEST_QUALITY) when the file's rate differs; a file already at that rate is
 * passed through unchanged. Integer PCM is scaled to [-1, 1) as libsndfile's sf_read_float does
 * (x / 32768 for 16-bit), which is what soundfile/librosa give transformers.
 *
 * On success *samples (malloc; the caller frees with free()) holds *n > 0 samples. On failure
 * *samples is NULL, *n is 0 and err holds one line naming the file: MS_ERR_NOT_FOUND / MS_ERR_IO
 * (missing, unreadable), MS_ERR_FORMAT (not audio, a truncated header, a data chunk cut short of
 * the size its header claims, undecodable data, no samples, NaN/Inf samples, rate, channels or
 * length outside the limits above), MS_ERR_UNSUPPORTED (a rate ratio libsamplerate cannot do),
 * MS_ERR_INVALID_ARG (bad sample_rate or NULL output), MS_ERR_OOM.
 */
ms_status ms_audio_read(const char *path, int32_t sample_rate, float **samples, int64_t *n, ms_error *err);

/*
 * As ms_audio_read, on a file image in memory: data[0 .. size) (borrowed for the call), read through
 * libsndfile's virtual I/O. `name` is what errors call the input (e.g. the upload's name).
 */
ms_status ms_audio_read_memory(const void *data, size_t size, const char *name, int32_t sample_rate,
                               float **samples, int64_t *n, ms_error *err);

/* ---- Whisper log-mel features ---- */

/*
 * Settings of transformers' WhisperFeatureExtractor, as preprocessor_config.json spells them.
 * Invariants (checked by ms_whisper_mel_init): n_samples == chunk_length * sampling_rate,
 * nb_max_frames == n_samples / hop_length, n_fft even and 2 <= n_fft <= n_samples.
 */
typedef struct ms_whisper_mel_config {
    int32_t feature_size;  /* mel bins (80 for Whisper, 128 for large-v3) */
    int32_t sampling_rate; /* Hz the features expect (16000) */
    int32_t hop_length;    /* samples between STFT frames (160 = 10 ms) */
    int32_t n_fft;         /* STFT frame and FFT length in samples (400 = 25 ms) */
    int32_t chunk_length;  /* seconds per window (30) */
    int64_t n_samples;     /* samples per window (480000) */
    int32_t nb_max_frames; /* frames per window (3000) */
} ms_whisper_mel_config;

/* Whisper's defaults (WhisperFeatureExtractor.__init__): 80, 16000, 160, 400, 30, 480000, 3000. */
ms_whisper_mel_config ms_whisper_mel_config_default(void);

/*
 * Read preprocessor_config.json at `path` into *cfg. Missing keys take the defaults above (as
 * transformers' __init__ does); a key of the wrong type or out of range, malformed JSON or a
 * missing file is an error naming the file and the key. "dither" other than 0 is refused
 * (MS_ERR_UNSUPPORTED): it adds random noise, so no deterministic reference could match.
 */
ms_status ms_whisper_mel_config_load(const char *path, ms_whisper_mel_config *cfg, ms_error *err);

typedef struct ms_whisper_mel ms_whisper_mel;

/*
 * Build the extractor for `cfg`: the periodic Hann window, the Slaney mel filter bank
 * (transformers.audio_utils.mel_filter_bank(n_fft / 2 + 1, feature_size, 0, 8000, sampling_rate,
 * norm="slaney", mel_scale="slaney")), the FFT buffers and one FFTW r2c plan (FFTW_ESTIMATE: no
 * timing, so the plan, and the output, are the same on every run). Errors: MS_ERR_INVALID_ARG for a
 * config breaking the invariants above, MS_ERR_OOM.
 */
ms_status ms_whisper_mel_init(const ms_whisper_mel_config *cfg, ms_whisper_mel **out, ms_error *err);
void ms_whisper_mel_free(ms_whisper_mel *mel);

/* Floats of one window's features: feature_size * nb_max_frames (80 * 3000). */
int64_t ms_whisper_mel_size(const ms_whisper_mel *mel);

/* Number of consecutive 30 s windows that cover n samples: ceil(n / n_samples), at least 1. */
int64_t ms_whisper_mel_n_windows(const ms_whisper_mel *mel, int64_t n);

/*
 * Log-mel features of samples[0 .. n) (mono, at cfg.sampling_rate), exactly as
 * WhisperFeatureExtractor(samples) with its defaults: the input truncated or zero-padded to
 * n_samples; STFT with n_fft, hop_length, the periodic Hann window, center=True with reflect
 * padding of n_fft / 2 on both sides; power spectrum |X|^2; mel = filters^T . power;
 * log10(max(mel, 1e-10)); the last of the 1 + n_samples / hop_length frames dropped; floored at
 * (max over the window - 8); then (x + 4) / 4. Computed in double precision, stored as float.
 * out: [feature_size, nb_max_frames] row-major (mel-major, as `input_features[0]`), caller-owned.
 * Errors: MS_ERR_INVALID_ARG for n < 0 or NULL pointers with n > 0.
 */
ms_status ms_whisper_log_mel(ms_whisper_mel *mel, const float *samples, int64_t n, float *out, ms_error *err);

/*
 * Features of the 30 s window `window` (0-based) of samples[0 .. n): ms_whisper_log_mel of
 * samples[window * n_samples .. min(n, (window + 1) * n_samples)). Iterate window over
 * [0, ms_whisper_mel_n_windows(mel, n)) for audio longer than 30 s. Errors: as ms_whisper_log_mel,
 * and MS_ERR_INVALID_ARG for a window outside that range.
 */
ms_status ms_whisper_log_mel_window(ms_whisper_mel *mel, const float *samples, int64_t n, int64_t window,
                                    float *out, ms_error *err);

/*
 * Transpose one window's features from mel-major [feature_size, nb_max_frames] (the output above,
 * transformers' layout) to frame-major [nb_max_frames, feature_size]: the token-major input the
 * encoder's first conv1d takes (backend.h conv1d: x [T_in, C_in]). in and out must not overlap;
 * both hold ms_whisper_mel_size(mel) floats.
 */
void ms_whisper_mel_frame_major(const ms_whisper_mel *mel, const float *in, float *out);

#ifdef __cplusplus
}
#endif

#endif /* MS_AUDIO_H */
