/*
 * cli.h - the serving binary's command line: `<binary> generate ...`, `<binary> bench ...` and
 * `<binary> kernels ...` and `<binary> serve ...`
 * over one compiled model (model_desc.h) and the engine (engine.h).
 *
 *   generate --model PATH [--tokenizer PATH|none] (--prompt TEXT | --prompt-ids 1,2,3 |
 *            --prompts-file FILE) [--max-new-tokens N | --steps N] [--temperature T] [--top-k K]
 *            [--top-p P] [--seed S] [--ignore-eos] [--output text|ids] [--no-display-prompt]
 *            [--verbose-prompt] [--page-size N] [--device auto|cpu|cuda] [--dtype ...]
 *            [--threads N]
 *
 * --model is a Hugging Face checkpoint folder (config.json + *.safetensors), a .safetensors file or
 * shard index .json inside one, or a llama2.c .bin file; anything else (a missing path, a folder
 * without config.json, /dev/null) is refused naming the path and the problem before any work.
 *
 * Tokenizer: `--tokenizer PATH` (a Hugging Face tokenizer.json, a folder holding one, or a
 * llama2.c tokenizer .bin; the kind is told by content: JSON starts with '{'), else the
 * checkpoint folder's tokenizer.json when it has one, else none (`--tokenizer none` forces none).
 * It is checked against the model's vocabulary (config.json) before anything is encoded or loaded:
 * a tokenizer.json's ids must lie inside the vocabulary (a model may have padding rows beyond), a
 * llama2.c tokenizer must have exactly the vocabulary's size (its ids are the model's rows).
 *
 * Every prompt of a file runs in ONE ragged batch (continuous: finished sequences leave it). With a
 * tokenizer, prompts are text: a llama2.c tokenizer encodes with BOS as llama2.c's run.c does; a
 * tokenizer.json encodes as transformers' tokenizer(text) does (its post-processor adds the special
 * tokens, e.g. Llama 3's <|begin_of_text|>; tokenizer_config.json's add_bos_token / add_eos_token
 * are honoured where present), special-token text in the prompt becomes the special id. The output
 * is text (`--output text`, the default with a tokenizer): the prompt then the generated text
 * (`--no-display-prompt`: the generated text only), streamed while a single prompt generates, a
 * final eos id not printed (ids output keeps it); a llama2.c tokenizer prints exactly as run.c
 * does, a tokenizer.json skips special tokens and holds back the bytes of a UTF-8 character split
 * across tokens until it is complete (invalid bytes print as U+FFFD, as the tokenizers library
 * decodes). Without a tokenizer, prompts are comma-separated ids (a prompts file: one line of ids
 * per prompt; --prompt-ids are ids in any case) and the output is the generated ids (also with
 * `--output ids`), one line per prompt ("[k] ..." for several).
 * `--steps N` counts positions including the prompt, as run.c's -n (clamped to the context): one
 * forward per position, so steps - prompt + 1 new ids; a prompt of more than N tokens is an error.
 * Generation stats (tokens/s) go to stderr (`--verbose-prompt` adds the prompt ids), so stdout
 * holds only the generated text or ids.
 *
 * Errors: one line "<binary>: <problem>" on stderr naming the flag, file or tensor; exit status 1
 * (2 for usage errors: unknown flag, missing value or required flag, conflicting flags). This is
 * the only place of the runtime that calls exit (through main).
 */
#ifndef MS_CLI_H
#define MS_CLI_H

#include <stdio.h>

#include "model_desc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The captured path's start-up line on `to` (cli.c): "graphs: N of M decode buckets captured in
 * S s" (and the first capture failure), when the engine has graphs; nothing when it runs eager
 * (--no-graphs, cpu). The verbs generate, bench and serve print it after loading. */
struct ms_engine;
void ms_cli_print_graphs(const struct ms_engine *e, FILE *to);

/* Run the command line for `desc`; returns the process exit status. */
int ms_cli_main(int argc, char **argv, const ms_model_desc *desc);

/*
 * The `bench` verb (cli_bench.c): argv holds the flags after "bench"; `prog` names the binary in
 * messages. Loads the model once, measures the copy bandwidth of its device, then decode
 * tokens/s per --batch and prefill tokens/s per --prefill shape on seeded random prompts (median
 * of --runs after --warmup, backend synchronised around every timed region), and prints a markdown
 * table (optional --json FILE). Returns the exit status: 0, 1 (bad value, load or run error: one
 * line on stderr), 2 (usage).
 */
int ms_cli_bench(int argc, char **argv, const ms_model_desc *desc, const char *prog);

/*
 * The `kernels` verb (cli_kernels.c): argv holds the flags after "kernels". Compiles into the
 * cubin cache every CUDA kernel instance `generate --device cuda` loads for --model's checkpoint,
 * for each --arch (default: the present GPU's), and prints one row per instance and arch (URI,
 * arch, hit / compiled, ms); --list only prints each instance's cache status. Returns the exit
 * status: 0, 1 (bad value, no GPU and no --arch, a compile error with NVRTC's log: one line on
 * stderr, then the log), 2 (usage).
 */
int ms_cli_kernels(int argc, char **argv, const ms_model_desc *desc, const char *prog);

/*
 * The `serve` verb (cli_serve.c): argv holds the flags after "serve". An OpenAI-compatible HTTP
 * server (libmicrohttpd + jansson) over one engine owned by a scheduler thread: POST
 * /v1/completions (streaming with server-sent events), GET /v1/models, /health, /metrics.
 * Runs until SIGINT or SIGTERM, then frees everything and returns 0; 1 for a bad value or a load
 * error (one line on stderr), 2 for usage.
 */
int ms_cli_serve(int argc, char **argv, const ms_model_desc *desc, const char *prog);

/*
 * The `chat` verb and `generate --chat MESSAGE` (cli_chat.c): argv holds the flags after the
 * verb; from_generate: one turn (--chat required). A conversation through the tokenizer's chat
 * template, the reply streamed to stdout and ended by an end-of-turn token (ms_tok_hf_is_eog);
 * interactive: a line of stdin per message, Ctrl-C stops a reply, end of input leaves. Returns the
 * exit status: 0, 1 (bad value, load error, a one-turn chat that failed: one line on stderr), 2
 * (usage).
 */
int ms_cli_chat(int argc, char **argv, const ms_model_desc *desc, const char *prog, bool from_generate);

/* ---- helpers of the verbs (exposed for tests) ---- */

/* The tokenizer of a verb: at most one of l2c / hf (both NULL: none). */
typedef struct ms_cli_tok {
    char *path;                 /* the file read (ms_malloc'd) */
    struct ms_llama2c_tok *l2c;
    struct ms_tok_hf *hf;
    int add_bos;                /* hf: tokenizer_config.json add_bos_token: 1, 0, -1 absent */
    int add_eos;                /* hf: add_eos_token, likewise */
} ms_cli_tok;

/* Choose and load the tokenizer as generate does (the top of this file): `given` is --tokenizer's
 * value (NULL when absent, "none"; a .gguf: its tokenizer.ggml.* metadata), `model_dir` the
 * checkpoint folder (NULL for a llama2.c or GGUF file), `model_path` the model as given (a .gguf
 * model without --tokenizer uses its own tokenizer), checked against `vocab`. No tokenizer leaves *t zeroed. Returns 0, or 1 after one line on
 * stderr. Release with ms_cli_tok_free (also after a failure). */
int ms_cli_tok_init(ms_cli_tok *t, const char *given, const char *model_dir,
                    const char *model_path, int32_t vocab);
/* Encode NUL-terminated text into a fresh ms_malloc'd *ids of *n ids (llama2.c: with BOS;
 * tokenizer.json: its special tokens and add_bos/add_eos); returns 0, or 1 after one line on
 * stderr naming `where`. The tokenizers are safe to use from several threads. */
int ms_cli_tok_encode(const ms_cli_tok *t, const char *text, const char *where, int32_t **ids,
                      size_t *n);
void ms_cli_tok_free(ms_cli_tok *t);

/* Flush stdout and check it for a write error (a full disk, a closed pipe, /dev/full): 0 when
 * everything written reached it, else 1 after printing "<prog>: cannot write the output to
 * stdout: <reason>" on stderr. Every verb calls it before returning success. */
int ms_cli_stdout_check(const char *prog);

/* Parse a whole string as a decimal integer in [lo, hi] into *out; false (and *out untouched) for
 * NULL, empty, leading white space, trailing characters, overflow or a value out of range. Shared
 * by every verb. */
bool ms_cli_parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);

/*
 * A flag's integer value: 0 with *out set when v is a decimal integer in [lo, hi]; else 1 after
 * printing one line on stderr: "<prog>: FLAG: 'V' is too large (at most HI)" for a decimal
 * integer above hi (overflowing int64 included), else "<prog>: FLAG: 'V' is not EXPECT" (EXPECT
 * such as "an integer >= 0"). V is printed with control bytes escaped.
 */
int ms_cli_flag_i64(const char *prog, const char *flag, const char *v, int64_t lo, int64_t hi,
                    const char *expect, int64_t *out);
/* --tp N (generate, bench, serve): tensor-parallel ranks in [1, 64] into *out (engine.h
 * options.tp), as ms_cli_flag_i64. Whether N divides the model's heads is the engine's check. */
int ms_cli_flag_tp(const char *prog, const char *v, int32_t *out);

/*
 * A flag's real value: 0 with *out set when v is a plain decimal number (digits, an optional
 * fraction and exponent; no hex, inf, nan or white space) within [lo, hi] ((lo, hi] when lo_open);
 * else 1 after printing "<prog>: FLAG: 'V' is too large (at most HI)" for a number above hi
 * that is past float's range, else "<prog>: FLAG: 'V' is not EXPECT". The range is checked on the
 * double before it is rounded to float (so 1.0000000001 is above 1).
 */
int ms_cli_flag_f32(const char *prog, const char *flag, const char *v, double lo, bool lo_open,
                    double hi, const char *expect, float *out);

/* Write s to f with control bytes (and DEL, and a backslash) escaped as \n, \t, \r, \\ or
 * \xHH, at most max bytes of s (then "..."): error lines and prompt echoes stay one line. */
void ms_cli_put_escaped(FILE *f, const char *s, size_t max);

/* Write s[0..n) to f escaped as ms_cli_put_escaped does (no limit; NUL bytes as \x00). */
void ms_cli_write_escaped(FILE *f, const char *s, size_t n);

/*
 * Parse a comma-separated list of token ids ("1,2, 3": decimal integers in [0, INT32_MAX], spaces
 * or tabs around each) into a fresh ms_malloc'd *ids of *n >= 1 entries (release with ms_free).
 * Errors (MS_ERR_PARSE; the message names the 1-based entry and starts lower case, for the caller
 * to prefix with the flag or file): no ids at all, an empty entry (a leading, trailing or doubled
 * comma), an entry that is not a decimal integer, a number above INT32_MAX; MS_ERR_OOM. On
 * failure *ids is NULL and *n 0.
 */
ms_status ms_cli_parse_ids(const char *s, int32_t **ids, size_t *n, ms_error *err);

/*
 * Streaming UTF-8 output: bytes pushed in pieces (a token's bytes may end inside a character) come
 * out as the text String::from_utf8_lossy gives for all of them at once: valid sequences as they
 * are, each maximal invalid subpart as U+FFFD, and the bytes of a sequence still incomplete at the
 * end of a push held back until the next push or the flush. Zero-initialise to start.
 */
typedef struct ms_cli_utf8 {
    unsigned char pend[3];  /* [n_pend] bytes of an incomplete sequence held back */
    int32_t n_pend;         /* 0 .. 3 */
} ms_cli_utf8;

/* Output bytes one push of n bytes may write at most (3 per byte held or pushed). */
#define MS_CLI_UTF8_OUT_MAX(n) (3 * ((size_t)(n) + 3))

/* Push n bytes; writes the text now complete to out (capacity MS_CLI_UTF8_OUT_MAX(n)) and returns
 * its length. */
size_t ms_cli_utf8_push(ms_cli_utf8 *s, const char *bytes, size_t n, char *out);
/* End of the stream: held-back bytes become one U+FFFD in out (capacity 3); returns 0 or 3. */
size_t ms_cli_utf8_flush(ms_cli_utf8 *s, char *out);

/*
 * What the verbs learn about --model before loading any weight: the engine's probe
 * (ms_model_probe_init, model_probe.h: the path, the config through desc, its shapes) fills *facts (bos/eos not filled: the engine's),
 * *layer_matmul_params (elements of the per-layer rank-2 weights, summed over layers: the matmuls
 * every token runs through; may be NULL) and *dir (the checkpoint folder, a fresh ms_malloc'd
 * string, NULL for a llama2.c file; may be NULL). Errors: MS_ERR_IO (no such path),
 * MS_ERR_NOT_FOUND (a folder without config.json), MS_ERR_FORMAT (not a folder nor a model
 * file), the config loader's errors; messages name the path.
 */
ms_status ms_cli_model_probe(const ms_model_desc *desc, const char *path, ms_md_facts *facts,
                             int64_t *layer_matmul_params, char **dir, ms_error *err);

/*
 * Dense (no sparsity) bf16 tensor-core peak of a GPU in TFLOPS (1e12 FLOP/s) from cli_bench.c's table
 * of NVIDIA datasheet figures, matched by the device name (cudaDeviceProp.name) and compute
 * capability; 0 when the GPU is not in the table.
 */
double ms_cli_bf16_peak_tflops(const char *gpu_name, int cc_major, int cc_minor);

/*
 * FLOPs per prompt token of a prefill of `len` tokens per sequence:
 * 2 x layer_matmul_params + 2 x head_params / len (the lm_head runs on the last token only)
 * + 4 x n_layers x attn_width x average context (QK^T and PV: 2 FLOPs per multiply-add each; the
 * average over the prompt of the keys a causal query sees, min(i, window) for i = 1 .. len, window
 * 0 = none).
 */
double ms_cli_prefill_flops_per_token(int64_t layer_matmul_params, int64_t head_params,
                                      int32_t n_layers, int64_t attn_width, int32_t len,
                                      int32_t window);

#ifdef __cplusplus
}
#endif
#endif /* MS_CLI_H */
