/*
 * cli.h - the serving binary's command line: `<binary> generate ...`, `<binary> bench ...` and
 * `<binary> kernels ...` (later serve)
 * over one compiled model (model_desc.h) and the engine (engine.h).
 *
 *   generate --model PATH [--tokenizer PATH] (--prompt TEXT | --prompt-ids 1,2,3 |
 *            --prompts-file FILE) [--max-new-tokens N | --steps N] [--temperature T] [--top-k K]
 *            [--top-p P] [--seed S] [--ignore-eos] [--page-size N] [--device cpu|cuda]
 *            [--threads N]
 *
 * Every prompt of a file runs in ONE ragged batch (continuous: finished sequences leave it). With a
 * tokenizer (llama2.c tokenizer.bin) prompts are text, encoded with BOS as llama2.c's run.c does,
 * and the output is text exactly as run.c prints it; without one, prompts are comma-separated ids
 * (a prompts file: one line of ids per prompt) and the output is the generated ids. `--steps N`
 * counts positions including BOS and the prompt, as run.c's -n (clamped to the context): one
 * forward per position, so steps - prompt + 1 new ids.
 * Generation stats (tokens/s) go to stderr, so stdout holds only the generated text or ids.
 *
 * Errors: one line "<binary>: <problem>" on stderr naming the flag, file or tensor; exit status 1
 * (2 for usage errors). This is the only place of the runtime that calls exit (through main).
 */
#ifndef MS_CLI_H
#define MS_CLI_H

#include "model_desc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Run the command line for `desc`; returns the process exit status. */
int ms_cli_main(int argc, char **argv, const ms_model_desc *desc);

/*
 * The `bench` verb (bench.c): argv holds the flags after "bench"; `prog` names the binary in
 * messages. Loads the model once, measures the copy bandwidth of its device, then decode
 * tokens/s per --batch and prefill tokens/s per --prefill shape on seeded random prompts (median
 * of --runs after --warmup, backend synchronised around every timed region), and prints a markdown
 * table (optional --json FILE). Returns the exit status: 0, 1 (bad value, load or run error: one
 * line on stderr), 2 (usage).
 */
int ms_cli_bench(int argc, char **argv, const ms_model_desc *desc, const char *prog);

/*
 * The `kernels` verb (kernels_cmd.c): argv holds the flags after "kernels". Compiles into the
 * cubin cache every CUDA kernel instance `generate --device cuda` loads for --model's checkpoint,
 * for each --arch (default: the present GPU's), and prints one row per instance and arch (URI,
 * arch, hit / compiled, ms); --list only prints each instance's cache status. Returns the exit
 * status: 0, 1 (bad value, no GPU and no --arch, a compile error with NVRTC's log: one line on
 * stderr, then the log), 2 (usage).
 */
int ms_cli_kernels(int argc, char **argv, const ms_model_desc *desc, const char *prog);

#ifdef __cplusplus
}
#endif
#endif /* MS_CLI_H */
