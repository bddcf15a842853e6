/*
 * cli_transcribe.c - the `transcribe` verb (cli_transcribe.h): audio files (runtime/audio: read,
 * resampled to the model's rate, cut into 30 s windows, log-mel features) or feature tensors from
 * safetensors files, one engine, ms_engine_transcribe over every window at once, one transcript
 * line per input (a file's windows joined in order).
 */
#include "cli_transcribe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "audio.h"
#include "cli.h"
#include "engine.h"
#include "safetensors.h"
#include "tokenizer_hf.h"

#define TR_MAX_WINDOWS MS_TRANSCRIBE_MAX_BATCH
/* Windows one encoder step batches (ms_engine_options.encode_windows): Whisper base's encoder
 * over 8 windows of 1500 rows holds about 0.5 GB of float32 activations. */
#define TR_ENCODE_WINDOWS 8

static const int32_t TR_DEFAULT_PROMPT[] = {50258, 50259, 50359, 50363};

static void tr_usage(FILE *f, const char *prog) {
    fprintf(f,
            "usage: %s transcribe --model DIR AUDIO... [--features FILE:NAME ...]\n"
            "           [--language CODE] [--task transcribe|translate] [--prompt IDS]\n"
            "           [--max-new-tokens N] [--device auto|cpu|cuda] [--threads N] [--ids]\n",
            prog);
}

/* One window: its features read from FILE:NAME, or window `index` of an audio file. */
typedef struct tr_window {
    const char *spec;   /* FILE:NAME or the audio file as given */
    float *features;    /* [channels * frames] */
    int64_t channels, frames;
    int32_t input;      /* the input (command-line file) it belongs to */
} tr_window;

/*
 * The windows of one audio file: read (resampled, mono) at the extractor's rate, cut into
 * consecutive 30 s windows (audio.h), each's log-mel features. Appends to win[*n_win]; 0, or 1
 * after one line naming the file.
 */
static int tr_audio(const char *prog, const char *path, ms_whisper_mel *mel, int32_t rate,
                    int32_t input, tr_window *win, int32_t *n_win, int32_t max_win,
                    int64_t channels, int64_t frames) {
    float *samples = NULL;
    int64_t n = 0;
    ms_error err = {0};
    if (ms_audio_read(path, rate, &samples, &n, &err) != MS_OK) {
        fprintf(stderr, "%s: %s\n", prog, err.msg);
        return 1;
    }
    int64_t nw = ms_whisper_mel_n_windows(mel, n);
    int rc = 0;
    if (*n_win + nw > max_win) {
        fprintf(stderr, "%s: %s: %lld windows of 30 s; one run takes %d windows in all\n", prog,
                path, (long long)nw, max_win);
        rc = 1;
    }
    for (int64_t k = 0; rc == 0 && k < nw; k++) {
        tr_window *w = &win[(*n_win)++];
        w->spec = path;
        w->input = input;
        w->channels = channels;
        w->frames = frames;
        w->features = ms_malloc((size_t)ms_whisper_mel_size(mel) * sizeof(float));
        if (w->features == NULL) {
            fprintf(stderr, "%s: %s: out of memory for its features\n", prog, path);
            rc = 1;
        } else if (ms_whisper_log_mel_window(mel, samples, n, k, w->features, &err) != MS_OK) {
            fprintf(stderr, "%s: %s: %s\n", prog, path, err.msg);
            rc = 1;
        }
    }
    free(samples); /* ms_audio_read: the caller frees with free() */
    return rc;
}

/* Read FILE:NAME into w (a [C, L] or [1, C, L] float tensor); 0, or 1 after one line. */
static int tr_read(const char *prog, tr_window *w) {
    const char *colon = strrchr(w->spec, ':');
    if (colon == NULL || colon == w->spec || colon[1] == '\0') {
        fprintf(stderr, "%s: --features: '", prog);
        ms_cli_put_escaped(stderr, w->spec, 200);
        fprintf(stderr, "' is not FILE:NAME\n");
        return 1;
    }
    char path[1024];
    size_t n = (size_t)(colon - w->spec);
    if (n >= sizeof path) {
        fprintf(stderr, "%s: --features: the file name is too long\n", prog);
        return 1;
    }
    memcpy(path, w->spec, n);
    path[n] = '\0';
    ms_st_file *f = NULL;
    ms_error err = {0};
    if (ms_st_file_init(&f, path, &err) != MS_OK) {
        fprintf(stderr, "%s: --features: %s\n", prog, err.msg);
        return 1;
    }
    int rc = 1;
    const ms_st_tensor *t = ms_st_file_find_tensor(f, colon + 1);
    if (t == NULL) {
        fprintf(stderr, "%s: --features: %s has no tensor '%s'\n", prog, path, colon + 1);
    } else if (!(t->n_dims == 2 || (t->n_dims == 3 && t->shape[0] == 1))) {
        char shape[128];
        ms_st_shape_str(t->n_dims, t->shape, shape, sizeof shape);
        fprintf(stderr, "%s: --features: %s: tensor '%s' is %s, expected [channels, frames]\n",
                prog, path, colon + 1, shape);
    } else {
        w->channels = t->shape[t->n_dims - 2];
        w->frames = t->shape[t->n_dims - 1];
        w->features = ms_malloc(t->n_elems * sizeof(float));
        if (w->features == NULL)
            fprintf(stderr, "%s: --features: out of memory for %s\n", prog, w->spec);
        else if (ms_st_tensor_to_f32(t, w->features, t->n_elems, &err) != MS_OK)
            fprintf(stderr, "%s: --features: %s: %s\n", prog, path, err.msg);
        else
            rc = 0;
    }
    ms_st_file_free(f);
    return rc;
}

int ms_cli_transcribe(int argc, char **argv, const ms_model_desc *desc, const char *prog) {
    const char *model = NULL, *device = "auto", *prompt_s = NULL;
    const char *language = NULL, *task = NULL;
    int64_t max_new = 64, threads = 0;
    bool print_ids = false;
    tr_window win[TR_MAX_WINDOWS];
    int32_t n_win = 0;
    const char *audio[TR_MAX_WINDOWS];
    int32_t n_audio = 0;
    memset(win, 0, sizeof win);
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        bool has_value = i + 1 < argc;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            tr_usage(stdout, prog);
            return ms_cli_stdout_check(prog);
        } else if (strcmp(a, "--ids") == 0) {
            print_ids = true;
        } else if (!has_value && (strcmp(a, "--model") == 0 || strcmp(a, "--features") == 0 ||
                                  strcmp(a, "--prompt") == 0 || strcmp(a, "--device") == 0 ||
                                  strcmp(a, "--language") == 0 || strcmp(a, "--task") == 0 ||
                                  strcmp(a, "--threads") == 0 ||
                                  strcmp(a, "--max-new-tokens") == 0)) {
            tr_usage(stderr, prog);
            fprintf(stderr, "%s: %s needs a value\n", prog, a);
            return 2;
        } else if (strcmp(a, "--model") == 0) {
            model = argv[++i];
        } else if (strcmp(a, "--features") == 0) {
            if (n_win == TR_MAX_WINDOWS) {
                fprintf(stderr, "%s: at most %d --features windows in one run\n", prog,
                        TR_MAX_WINDOWS);
                return 2;
            }
            win[n_win].input = n_win;
            win[n_win++].spec = argv[++i];
        } else if (strcmp(a, "--language") == 0) {
            language = argv[++i];
        } else if (strcmp(a, "--task") == 0) {
            task = argv[++i];
            if (strcmp(task, "transcribe") != 0 && strcmp(task, "translate") != 0) {
                tr_usage(stderr, prog);
                fprintf(stderr, "%s: --task must be transcribe or translate\n", prog);
                return 2;
            }
        } else if (strcmp(a, "--prompt") == 0) {
            prompt_s = argv[++i];
        } else if (strcmp(a, "--device") == 0) {
            device = argv[++i];
        } else if (strcmp(a, "--threads") == 0) {
            if (ms_cli_flag_i64(prog, a, argv[++i], 0, 1024, "an integer >= 0", &threads) != 0)
                return 2;
        } else if (strcmp(a, "--max-new-tokens") == 0) {
            if (ms_cli_flag_i64(prog, a, argv[++i], 1, 1 << 20, "an integer >= 1", &max_new) !=
                0)
                return 2;
        } else if (a[0] == '-' && a[1] != '\0') {
            tr_usage(stderr, prog);
            fprintf(stderr, "%s: unknown flag '", prog);
            ms_cli_put_escaped(stderr, a, 100);
            fprintf(stderr, "'\n");
            return 2;
        } else {
            if (n_audio == TR_MAX_WINDOWS) {
                fprintf(stderr, "%s: at most %d audio files in one run\n", prog, TR_MAX_WINDOWS);
                return 2;
            }
            audio[n_audio++] = a;
        }
    }
    if (model == NULL || (n_win == 0 && n_audio == 0)) {
        tr_usage(stderr, prog);
        fprintf(stderr, "%s: transcribe needs --model and at least one audio file or --features\n",
                prog);
        return 2;
    }
    if (prompt_s != NULL && (language != NULL || task != NULL)) {
        tr_usage(stderr, prog);
        fprintf(stderr, "%s: give --prompt or --language/--task, not both\n", prog);
        return 2;
    }
    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    ms_error err = {0};
    if (prompt_s != NULL && ms_cli_parse_ids(prompt_s, &prompt, &n_prompt, &err) != MS_OK) {
        fprintf(stderr, "%s: --prompt: %s\n", prog, err.msg);
        return 2;
    }
    int rc = 1;
    ms_engine *e = NULL;
    ms_tok_hf *tok = NULL;
    ms_engine_transcript items[TR_MAX_WINDOWS];
    memset(items, 0, sizeof items);
    const int32_t n_features = n_win;
    for (int32_t k = 0; k < n_win; k++)
        if (tr_read(prog, &win[k]) != 0)
            goto done;
    if (n_audio > 0) {
        /* the feature extractor of the checkpoint (preprocessor_config.json; defaults when the
           folder has none), the encoder's input shape from the model */
        char pp[1100];
        struct stat st;
        snprintf(pp, sizeof pp, "%s/preprocessor_config.json", model);
        ms_whisper_mel_config mc = ms_whisper_mel_config_default();
        if (stat(pp, &st) == 0 && ms_whisper_mel_config_load(pp, &mc, &err) != MS_OK) {
            fprintf(stderr, "%s: %s\n", prog, err.msg);
            goto done;
        }
        ms_whisper_mel *mel = NULL;
        if (ms_whisper_mel_init(&mc, &mel, &err) != MS_OK) {
            fprintf(stderr, "%s: %s\n", prog, err.msg);
            goto done;
        }
        int bad = 0;
        for (int32_t k = 0; k < n_audio && !bad; k++)
            bad = tr_audio(prog, audio[k], mel, mc.sampling_rate, n_features + k, win, &n_win,
                           TR_MAX_WINDOWS, mc.feature_size, mc.nb_max_frames);
        ms_whisper_mel_free(mel);
        if (bad)
            goto done;
    }
    ms_engine_options o = ms_engine_options_default();
    o.model_path = model;
    o.device = device;
    o.n_threads = (int32_t)threads;
    o.max_seqs = 2 * n_win; /* a Whisper request: the ids and the context (its encoder step
                               keeps nothing: a dense attention) */
    o.max_tokens = 2048;    /* a prompt and 1500 context rows in one step */
    /* the windows' encoder passes in one forward (up to TR_ENCODE_WINDOWS at a time) */
    o.encode_windows = n_win < TR_ENCODE_WINDOWS ? n_win : TR_ENCODE_WINDOWS;
    if (ms_engine_init(&e, desc, &o, &err) != MS_OK) {
        fprintf(stderr, "%s: %s\n", prog, err.msg);
        goto done;
    }
    {
        /* the text: tokenizer.json beside the checkpoint, when there is one */
        char tp[1100];
        struct stat st;
        snprintf(tp, sizeof tp, "%s/tokenizer.json", model);
        if (stat(tp, &st) == 0 && ms_tok_hf_init(&tok, tp, &err) != MS_OK) {
            fprintf(stderr, "%s: %s\n", prog, err.msg);
            goto done;
        }
    }
    int32_t lt_prompt[4];
    if (language != NULL || task != NULL) {
        /* <|startoftranscript|><|LANG|><|TASK|><|notimestamps|>, as transformers'
           WhisperTokenizer.prefix_tokens spells them */
        if (tok == NULL) {
            fprintf(stderr, "%s: --language/--task need the model's tokenizer.json (or give the ids "
                            "with --prompt)\n", prog);
            goto done;
        }
        char lang_tok[64];
        snprintf(lang_tok, sizeof lang_tok, "<|%s|>", language != NULL ? language : "en");
        const char *names[4] = {"<|startoftranscript|>", lang_tok,
                                task != NULL && strcmp(task, "translate") == 0 ? "<|translate|>"
                                                                              : "<|transcribe|>",
                                "<|notimestamps|>"};
        for (int k = 0; k < 4; k++) {
            lt_prompt[k] = ms_tok_hf_token_id(tok, names[k]);
            if (lt_prompt[k] < 0) {
                fprintf(stderr, "%s: the tokenizer has no token %s%s\n", prog, names[k],
                        k == 1 ? " (--language takes a Whisper language code: en, de, fr, ...)"
                               : "");
                goto done;
            }
        }
    }
    const int32_t *pr = prompt != NULL ? prompt
                        : (language != NULL || task != NULL) ? lt_prompt
                                                              : TR_DEFAULT_PROMPT;
    const int32_t n_pr = prompt != NULL ? (int32_t)n_prompt
                         : (language != NULL || task != NULL)
                             ? 4
                             : (int32_t)MS_ARRAY_LEN(TR_DEFAULT_PROMPT);
    for (int32_t k = 0; k < n_win; k++)
        items[k] = (ms_engine_transcript){.features = win[k].features,
                                          .n_channels = win[k].channels,
                                          .n_frames = win[k].frames, .prompt = pr,
                                          .n_prompt = n_pr, .max_new_tokens = (int32_t)max_new};
    if (ms_engine_transcribe(e, items, n_win, &err) != MS_OK) {
        fprintf(stderr, "%s: %s\n", prog, err.msg);
        goto done;
    }
    for (int32_t k = 0; k < n_win; k++) {
        /* one line per input: an audio file's 30 s windows are joined in order */
        bool last = k + 1 == n_win || win[k + 1].input != win[k].input;
        if (print_ids) {
            printf("ids:");
            for (int32_t j = 0; j < items[k].n_ids; j++)
                printf(" %d", (int)items[k].ids[j]);
            printf("\n");
        }
        if (tok != NULL) {
            char *text = NULL;
            size_t len = 0;
            if (ms_tok_hf_decode(tok, items[k].ids, (size_t)items[k].n_ids, true, &text, &len,
                                 &err) != MS_OK) {
                fprintf(stderr, "%s: %s\n", prog, err.msg);
                goto done;
            }
            fwrite(text, 1, len, stdout);
            ms_free(text);
            if (last)
                printf("\n");
        } else if (!print_ids) {
            for (int32_t j = 0; j < items[k].n_ids; j++)
                printf("%s%d", j ? " " : "", (int)items[k].ids[j]);
            printf(last ? "\n" : " ");
        }
    }
    rc = ms_cli_stdout_check(prog);
done:
    for (int32_t k = 0; k < n_win; k++) {
        ms_free(win[k].features);
        ms_free(items[k].ids);
    }
    ms_tok_hf_free(tok);
    ms_engine_free(e);
    ms_free(prompt);
    return rc;
}
