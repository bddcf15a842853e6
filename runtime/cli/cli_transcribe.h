/*
 * cli_transcribe.h - the `transcribe` verb of a serving binary whose model reads audio features
 * (models/whisper.mstar): feature windows in, greedy transcripts out, every window decoded in one
 * batch through ms_engine_transcribe (engine.h).
 *
 * Ownership: borrows its arguments.
 */
#ifndef MS_CLI_TRANSCRIBE_H
#define MS_CLI_TRANSCRIBE_H

#include "model_desc.h"

/*
 * argv holds the flags after "transcribe"; `prog` names the binary in messages:
 *     --model DIR                the checkpoint folder (config.json, model.safetensors,
 *                                tokenizer.json for the text)
 *     --features FILE:NAME       a [C, L] (or [1, C, L]) float tensor NAME of the safetensors
 *                                FILE: one window's log-mel features (transformers'
 *                                input_features); repeatable, every window in one batch
 *     --prompt IDS               the decoder prompt ids (default 50258,50259,50359,50363:
 *                                <|startoftranscript|><|en|><|transcribe|><|notimestamps|>)
 *     --max-new-tokens N         ids per window at most (default 64)
 *     --device auto|cpu|cuda, --threads N
 *     --ids                      also print each window's ids
 * Prints one line per window, in order: the transcript (tokenizer.json's decode, special tokens
 * skipped; the ids when the folder has no tokenizer.json). The lead's WAV front end (runtime/audio)
 * replaces --features by audio files. Returns the exit status: 0; 1 (a bad file, tensor or shape,
 * a load or run error: one line on stderr naming it); 2 (usage).
 */
int ms_cli_transcribe(int argc, char **argv, const ms_model_desc *desc, const char *prog);

#endif /* MS_CLI_TRANSCRIBE_H */
