/*
 * cli_transcribe.c - the `transcribe` verb (cli_transcribe.h): feature windows from safetensors
 * tensors, one engine, ms_engine_transcribe over all of them, one transcript line per window.
 */
#include "cli_transcribe.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "engine.h"
#include "safetensors.h"
#include "tokenizer_hf.h"

#define TR_MAX_WINDOWS MS_TRANSCRIBE_MAX_BATCH

static const int32_t TR_DEFAULT_PROMPT[] = {50258, 50259, 50359, 50363};

static void tr_usage(FILE *f, const char *prog) {
    fprintf(f,
            "usage: %s transcribe --model DIR --features FILE:NAME [--features FILE:NAME ...]\n"
            "           [--prompt IDS] [--max-new-tokens N] [--device auto|cpu|cuda]\n"
            "           [--threads N] [--ids]\n",
            prog);
}

/* One window: its features read from FILE:NAME. */
typedef struct tr_window {
    const char *spec;   /* FILE:NAME as given */
    float *features;    /* [channels * frames] */
    int64_t channels, frames;
} tr_window;

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
    int64_t max_new = 64, threads = 0;
    bool print_ids = false;
    tr_window win[TR_MAX_WINDOWS];
    int32_t n_win = 0;
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
            win[n_win++].spec = argv[++i];
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
        } else {
            tr_usage(stderr, prog);
            fprintf(stderr, "%s: unknown flag '", prog);
            ms_cli_put_escaped(stderr, a, 100);
            fprintf(stderr, "'\n");
            return 2;
        }
    }
    if (model == NULL || n_win == 0) {
        tr_usage(stderr, prog);
        fprintf(stderr, "%s: transcribe needs --model and at least one --features\n", prog);
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
    for (int32_t k = 0; k < n_win; k++)
        if (tr_read(prog, &win[k]) != 0)
            goto done;
    ms_engine_options o = ms_engine_options_default();
    o.model_path = model;
    o.device = device;
    o.n_threads = (int32_t)threads;
    o.max_seqs = 3 * n_win; /* a Whisper request: the encoder's stream, the ids, the context */
    o.max_tokens = 2048;    /* a prompt and 1500 context rows in one step */
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
    const int32_t *pr = prompt != NULL ? prompt : TR_DEFAULT_PROMPT;
    const int32_t n_pr =
        prompt != NULL ? (int32_t)n_prompt : (int32_t)MS_ARRAY_LEN(TR_DEFAULT_PROMPT);
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
            printf("\n");
            ms_free(text);
        } else if (!print_ids) {
            for (int32_t j = 0; j < items[k].n_ids; j++)
                printf("%s%d", j ? " " : "", (int)items[k].ids[j]);
            printf("\n");
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
