/*
 * fuzz_audio.c - libFuzzer target for the audio front end (runtime/audio): the input is a sound
 * file image, read with ms_audio_read_memory (libsndfile's virtual I/O: every format it knows) at
 * 16 kHz, so files at other rates and channel counts go through the downmix and libsamplerate.
 * Decoded samples then go through a 1 s Whisper log-mel extractor (the real one's 30 s would make
 * each input ~30x slower, and every code path is the same), whose features must all be finite.
 * A failure must be one line and not out of memory; ms_malloc blocks must not leak; ASan/UBSan
 * catch the rest. Run it with `make fuzz FUZZ_TARGETS=audio` (tests/fuzz.sh).
 */
#include "fuzz_util.h"

#include <math.h>

#include "audio.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static ms_whisper_mel *mel;
    static float *feat;
    if (mel == NULL) {
        ms_whisper_mel_config cfg = ms_whisper_mel_config_default();
        cfg.chunk_length = 1;
        cfg.n_samples = cfg.sampling_rate;
        cfg.nb_max_frames = (int32_t)(cfg.n_samples / cfg.hop_length);
        ms_error err = {0};
        if (ms_whisper_mel_init(&cfg, &mel, &err) != MS_OK) {
            fprintf(stderr, "fuzz_audio: %s\n", err.msg);
            abort();
        }
        feat = malloc((size_t)ms_whisper_mel_size(mel) * sizeof *feat);
        if (feat == NULL)
            abort();
    }
    int64_t live = ms_alloc_get_stats().live_blocks;
    ms_error err = {0};
    float *x = NULL;
    int64_t n = 0;
    ms_status st = ms_audio_read_memory(data, size, "fuzz.wav", 16000, &x, &n, &err);
    fuzz_check_error("fuzz_audio", st, &err);
    if (st == MS_OK) {
        if (x == NULL || n <= 0)
            abort();
        int64_t nw = ms_whisper_mel_n_windows(mel, n);
        for (int64_t w = 0; w < nw && w < 4; w++) {
            st = ms_whisper_log_mel_window(mel, x, n, w, feat, &err);
            if (st != MS_OK) {
                fprintf(stderr, "fuzz_audio: features of decoded samples failed: %s\n", err.msg);
                abort();
            }
            for (int64_t i = 0; i < ms_whisper_mel_size(mel); i++)
                if (!isfinite(feat[i])) {
                    fprintf(stderr, "fuzz_audio: feature %lld of window %lld is not finite\n", (long long)i,
                            (long long)w);
                    abort();
                }
        }
    } else if (x != NULL || n != 0) {
        abort();
    }
    free(x);
    fuzz_check_leaks("fuzz_audio", live);
    return 0;
}
