#!/usr/bin/env bash
# layers.sh - runtime/ is split by layer; a file may include headers of its own layer and of the
# layers listed for it below (runtime/README.md). Prints each include that breaks the rule and
# fails; ends with "N passed, N failed" (one test per layer folder).
set -uo pipefail
cd "$(dirname "$0")/.."
declare -A allowed=(
    [core]="core"
    [resources]="core resources"
    [loaders]="core loaders"
    [audio]="core audio"
    [tokenizers]="core tokenizers"
    [backends]="core resources loaders backends"
    [engine]="core resources loaders audio backends engine"
    [cli]="core resources loaders audio tokenizers backends engine cli"
    [tools]="core loaders"
)
# header -> layer
declare -A layer_of=()
for h in runtime/*/*.h; do
    d=${h#runtime/}
    layer_of[$(basename "$h")]=${d%%/*}
done
passed=0
failed=0
for layer in "${!allowed[@]}"; do
    bad=0
    [ -d "runtime/$layer" ] || { echo "missing folder runtime/$layer"; failed=$((failed + 1)); continue; }
    [ -f "runtime/$layer/README.md" ] || [ "$layer" = tools ] || { echo "runtime/$layer has no README.md"; bad=1; }
    for f in runtime/"$layer"/*.[ch]; do
        [ -e "$f" ] || continue
        while IFS= read -r inc; do
            base=$(basename "$inc")
            l=${layer_of[$base]:-}
            [ -n "$l" ] || continue  # templates/, system headers
            case " ${allowed[$layer]} " in
            *" $l "*) ;;
            *) echo "$f includes $inc (layer $l; $layer may include: ${allowed[$layer]})"; bad=1 ;;
            esac
        done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f")
    done
    # every source of the layer is listed in runtime/build.mk (or is a program under tools/)
    if [ "$layer" != tools ]; then
        for c in runtime/"$layer"/*.c; do
            [ -e "$c" ] || continue
            grep -q "$c" runtime/build.mk || { echo "$c is not in runtime/build.mk"; bad=1; }
        done
    fi
    if [ $bad -eq 0 ]; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
done
# every source runtime/build.mk lists exists (a union merge of build.mk can bring back a moved path)
for c in $(grep -o 'runtime/[A-Za-z0-9_/]*\.c' runtime/build.mk); do
    [ -f "$c" ] || { echo "runtime/build.mk lists $c, which does not exist"; failed=$((failed + 1)); }
done
# no source left at the top of runtime/
for f in runtime/*.[ch]; do
    [ -e "$f" ] && { echo "$f: runtime/ keeps sources in its layer folders"; failed=$((failed + 1)); }
done
echo "$passed passed, $failed failed"
[ $failed -eq 0 ]
