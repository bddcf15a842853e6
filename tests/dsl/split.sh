#!/usr/bin/env bash
# split.sh OUTDIR FILE.test... - split golden case files into OUTDIR/<case>.mstar (the source)
# and OUTDIR/<case>.expected (the exact diagnostics `mstarc check <case>.mstar` prints).
#
# Format of a .test file (see tests/dsl/README.md): lines starting with '#' outside a case are
# comments; a case starts with "%%% <name>", its source runs up to a line "---", and its expected
# output runs up to the next blank line (or the end of the file).
set -euo pipefail
out=$1
shift
mkdir -p "$out"
awk -v out="$out" '
    function flush() { if (name != "") { close(src); close(ex) } name = "" }
    FNR == 1 { flush() }
    /^%%% / { flush(); name = $2; src = out "/" name ".mstar"; ex = out "/" name ".expected";
              printf "" > src; printf "" > ex; mode = "src"; next }
    name == "" { next }
    mode == "src" && $0 == "---" { mode = "exp"; next }
    mode == "src" { print > src; next }
    mode == "exp" && $0 == "" { flush(); next }
    mode == "exp" { print > ex; next }
    END { flush() }
' "$@"
