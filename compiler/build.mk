# compiler/build.mk - mstarc: semantic pass, diagnostics, dump, code generation (one entry per line).
