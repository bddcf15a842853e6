/*
 * llama_ref_main.c - build/llama-ref: the serving binary over the hand-written Llama descriptor
 * (tests/llama_desc_ref.c), so the CLI and engine run end to end before the code generator lands.
 * When mstarc emits build/llama/llama, that binary has exactly this main over the generated
 * descriptor.
 */
#include "cli.h"

extern const ms_model_desc ms_llama_ref_desc;

int main(int argc, char **argv) { return ms_cli_main(argc, argv, &ms_llama_ref_desc); }
