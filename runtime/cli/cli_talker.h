/*
 * cli_talker.h - the `talker` verb of a serving binary whose model is a talker + code predictor
 * (models/talker.mstar): prompt frames of audio codes in, greedy frames out, every prompt one
 * request of one batch through ms_engine_talker_codes (talker.h).
 *
 * Ownership: borrows its arguments.
 */
#ifndef MS_CLI_TALKER_H
#define MS_CLI_TALKER_H

#include "model_desc.h"

/*
 * argv holds the words after "talker"; `prog` names the binary in messages:
 *     codes                      the only subcommand: generate codes
 *     --model DIR                the checkpoint folder (config.json, model.safetensors)
 *     --prompt-codes FILE        a prompt: one frame per line, G integers (the frame's codes,
 *                                codebook 0 first) separated by spaces; blank lines and lines
 *                                starting with '#' are skipped; repeatable (one request each)
 *     --frames N                 frames to generate per prompt (default 12)
 *     --device auto|cpu|cuda, --dtype auto|f32|bf16, --threads N
 * Prints each prompt's generated frames, one line of G codes per frame, prompts in order with
 * an empty line between them. Returns the exit status: 0; 1 (an unreadable or malformed file
 * naming FILE:LINE, a code outside the vocabulary, a load or run error: one line on stderr);
 * 2 (usage).
 */
int ms_cli_talker(int argc, char **argv, const ms_model_desc *desc, const char *prog);

#endif /* MS_CLI_TALKER_H */
