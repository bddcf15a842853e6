#!/usr/bin/env bash
# kernels_cli.sh - precompiling kernel instances (issue 5): `mstarc build --arch ... --config CKPT`
# puts the cubins of the instances it emits into the kernel cache under the runtime's key, so the
# built binary's `kernels` verb (the code path `generate --device cuda` loads through) finds every
# one of them (--list: all cached; a precompile: hits only); bad --arch lists and flags get one
# clear line naming the flag; an NVRTC failure (a deliberately broken template through
# MSTAR_TEMPLATES_DIR) shows NVRTC's log and the path of the source: the emitted
# DIR/kernels/<stem>.cu for mstarc, <cache>/<uri>.failed.cu (with the shape defines) for the
# binary. Qwen3 adds its per-head q/k RMSNorm (rmsnorm_heads_bf16_af32.cu, head_dim a shape
# macro): precompiled at the fixture's head_dim 48 and listed cached by its binary (sm_90 only).
# The verb's instance set is the stem list the generated descriptor carries: plain.mstar (no
# residual RMSNorm) lists exactly its 9 emitted files; tiny.mstar (none emitted) is refused.
# One temporary cache serves the whole script (about 30 NVRTC compiles; the 7 qmatmul instances
# take several seconds each). The sanitizer builds precompile llama_gqa for sm_90 alone (the plain
# build: sm_80,sm_90).
#
# Needs NVRTC (a CUDA build; no GPU): in a build without CUDA it checks that --arch and the
# `kernels` verb say so, and prints which checks it skipped.
# Prints "N passed, N failed" (read by scripts/run-tests.sh) and exits 1 on any failure.
set -uo pipefail
# No GPU is needed, and none is used: the default-arch check must find none.
export CUDA_VISIBLE_DEVICES=
root=$(cd "$(dirname "$0")/.." && pwd)
build=${MS_BUILD:-build}
case $build in /*) ;; *) build=$root/$build ;; esac
mstarc=$build/mstarc
fx=${MS_FIXTURES:-$root/../shared/fixtures}
gqa="$fx/hf/llama_gqa"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export MSTAR_CACHE="$tmp/cache"
unset MSTAR_TEMPLATES_DIR
passed=0
failed=0

ok() { passed=$((passed + 1)); echo "ok   $1"; }
bad() { failed=$((failed + 1)); echo "FAIL $1"; shift; printf '     %s\n' "$@"; }

# run NAME STATUS CMD...: run CMD from the project root, stdout in $tmp/out, stderr in $tmp/err;
# true when it exited with STATUS and no sanitizer spoke.
run() {
    local name=$1 want=$2
    shift 2
    (cd "$root" && "$@" >"$tmp/out" 2>"$tmp/err")
    local rc=$?
    if [ "$rc" -ne "$want" ]; then
        bad "$name" "exit $rc, expected $want" "$(head -c 1500 "$tmp/err")"
        return 1
    fi
    if grep -qE 'Sanitizer|runtime error' "$tmp/err"; then
        bad "$name" "sanitizer report:" "$(head -c 1500 "$tmp/err")"
        return 1
    fi
    return 0
}

# expect_error NAME STATUS PATTERN CMD...: exit STATUS, ONE stderr line matching PATTERN.
expect_error() {
    local name=$1 want=$2 pat=$3
    shift 3
    run "$name" "$want" "$@" || return 0
    local lines
    lines=$(grep -vc '^usage:\|^  \|^$' "$tmp/err")
    if ! grep -qE -- "$pat" "$tmp/err"; then
        bad "$name" "stderr does not match /$pat/" "$(head -c 600 "$tmp/err")"
    elif [ "$lines" -ne 1 ]; then
        bad "$name" "expected one error line, got $lines" "$(head -c 600 "$tmp/err")"
    else
        ok "$name"
    fi
}

count() { grep -cE -- "$1" "$2"; }

if [ ! -x "$mstarc" ]; then
    bad "mstarc exists" "no $mstarc"
    echo "$passed passed, $failed failed"
    exit 1
fi

# ---- without NVRTC: say so, clearly ----
if ! nm -g "$build/libmstar.a" 2>/dev/null | grep ' T ms_nvrtc_compile_ex$' >/dev/null; then
    expect_error "no CUDA: mstarc --arch says NVRTC is missing" 1 "--arch: this mstarc was built without CUDA" \
        "$mstarc" build models/llama.mstar -o "$tmp/b" --emit-only --arch sm_80,sm_90
    expect_error "no CUDA: mstarc --arch sm_7 still names the flag" 2 "--arch: architecture 'sm_7' not understood" \
        "$mstarc" build models/llama.mstar -o "$tmp/b" --emit-only --arch sm_7
    if run "no CUDA: build the llama binary" 0 "$mstarc" build models/llama.mstar -o "$tmp/b"; then
        ok "no CUDA: build the llama binary"
        expect_error "no CUDA: kernels verb says NVRTC is missing" 1 "built without CUDA" \
            "$tmp/b/llama" kernels --model "$gqa" --arch sm_90
    fi
    echo "skip: this build has no CUDA (no NVRTC): the precompile, cache and NVRTC-failure checks did not run"
    echo "$passed passed, $failed failed"
    [ "$failed" -eq 0 ]
    exit
fi

# ---- mstarc --arch --config: the checkpoint's instances into the cache ----
# Two archs (sm_80,sm_90) in the plain build; the sanitizer builds precompile sm_90 only: the same
# C (list parsing, the loop over archs, the cache writes) runs for one arch as for two, and each
# cold qmatmul compile is NVRTC's time, not ours (CI ran all 32 compiles twice). The two-arch
# list is still precompiled and listed in the plain pass.
case $build in
*/asan | */tsan) archs=sm_90 n_arch=1 ;;
*) archs=sm_80,sm_90 n_arch=2 ;;
esac
n_inst=$((16 * n_arch))
if run "mstarc build --arch $archs --config llama_gqa" 0 \
    "$mstarc" build models/llama.mstar -o "$tmp/b" --arch "$archs" --config "$gqa"; then
    n_new=$(count ' sm_(80|90) +compiled ' "$tmp/out")
    n_skip=$(count 'skipped: not used with this checkpoint' "$tmp/out")
    if [ "$n_new" -eq "$n_inst" ] && [ "$n_skip" -eq 3 ] && [ -x "$tmp/b/llama" ] &&
        grep -q 'head_dim=16, page_size=16, group=4' "$tmp/out" &&
        grep -q 'attn_decode_bf16_hd16_ps16_g4_af32 *sm_90 *compiled .*attn_decode_bf16_af32.cu' "$tmp/out"; then
        ok "mstarc: 16 instances (9 + 7 qmatmul; no residual RMSNorm: the adds are in the linears) x $n_arch arch(s) ($archs) compiled, 3 variants skipped, binary linked"
    else
        bad "mstarc: 16 instances x $n_arch arch(s) compiled" "compiled $n_new (want $n_inst), skipped $n_skip (want 3)" "$(cat "$tmp/out")"
    fi
    n_cubins=$(find "$MSTAR_CACHE" -name '*.cubin' | wc -l)
    if [ "$n_cubins" -eq "$n_inst" ]; then ok "$n_inst cubins in MSTAR_CACHE"; else bad "$n_inst cubins in MSTAR_CACHE" "found $n_cubins"; fi
fi

# ---- the binary finds all of them ----
bin="$tmp/b/llama"
if run "kernels --list" 0 "$bin" kernels --model "$gqa" --arch "$archs" --list; then
    if [ "$(count ' sm_(80|90) +cached$' "$tmp/out")" -eq "$n_inst" ] && ! grep -qE ' sm_[0-9]+ +missing$' "$tmp/out" &&
        grep -q "^$n_inst cached, 0 missing\$" "$tmp/out"; then
        ok "kernels --list: every instance of $archs cached"
    else
        bad "kernels --list: every instance cached" "$(cat "$tmp/out")"
    fi
fi
if run "kernels --arch sm_90" 0 "$bin" kernels --model "$gqa" --arch sm_90; then
    if [ "$(count ' sm_90 +hit +[0-9]' "$tmp/out")" -eq 16 ] && ! grep -qE ' sm_90 +compiled +[0-9]' "$tmp/out" &&
        grep -q '^16 hits, 0 compiled' "$tmp/out"; then
        ok "kernels --arch sm_90: hits only"
    else
        bad "kernels --arch sm_90: hits only" "$(cat "$tmp/out")"
    fi
fi
# a page size the cache does not hold: listed missing, then compiled by the verb (3 shaped instances)
if run "kernels --page-size 32" 0 "$bin" kernels --model "$gqa" --arch sm_90 --page-size 32; then
    if [ "$(count ' sm_90 +compiled +[0-9]' "$tmp/out")" -eq 3 ] && [ "$(count ' sm_90 +hit +[0-9]' "$tmp/out")" -eq 13 ] &&
        grep -q 'attn_decode_bf16_hd16_ps32_g4_af32 *sm_90 *compiled' "$tmp/out"; then
        ok "kernels --page-size 32: the 3 shaped instances compiled, 13 hits"
    else
        bad "kernels --page-size 32" "$(cat "$tmp/out")"
    fi
fi
# mstarc again (emit only): everything comes from the cache
if run "mstarc --arch again" 0 "$mstarc" build models/llama.mstar -o "$tmp/b" --emit-only --arch sm_90 --config "$gqa"/config.json; then
    if [ "$(count ' sm_90 +cached ' "$tmp/out")" -eq 16 ]; then ok "mstarc --arch again: 16 cached";
    else bad "mstarc --arch again: 16 cached" "$(cat "$tmp/out")"; fi
fi

# ---- Qwen3: the per-head q/k RMSNorm (rmsnorm_heads, head_dim a shape macro) is emitted,
#      precompiled at the checkpoint's head_dim (48) and found by the binary (one arch) ----
q3="$fx/hf/qwen3"
if run "mstarc build qwen3 --arch sm_90 --config qwen3" 0 \
    "$mstarc" build models/qwen3.mstar -o "$tmp/q3" --arch sm_90 --config "$q3"; then
    n_done=$(count ' sm_90 +(compiled|cached) ' "$tmp/out")
    n_skip=$(count 'skipped: not used with this checkpoint' "$tmp/out")
    if [ "$n_done" -eq 17 ] && [ "$n_skip" -eq 2 ] && [ -x "$tmp/q3/qwen3" ] &&
        [ -f "$tmp/q3/kernels/rmsnorm_heads_bf16_af32.cu" ] &&
        grep -q 'head_dim=48, page_size=16, group=2' "$tmp/out" &&
        grep -q 'rmsnorm_heads_bf16_hd48_af32 *sm_90 *compiled .*rmsnorm_heads_bf16_af32.cu' "$tmp/out" &&
        ! grep -q 'not emitted' "$tmp/out"; then
        ok "mstarc qwen3: 17 instances in the cache (rmsnorm_heads at hd48 from rmsnorm_heads_bf16_af32.cu, 7 qmatmul), 2 skipped"
    else
        bad "mstarc qwen3: 17 instances in the cache" "done $n_done (want 17), skipped $n_skip (want 2)" "$(cat "$tmp/out")"
    fi
    if run "qwen3 kernels --list" 0 "$tmp/q3/qwen3" kernels --model "$q3" --arch sm_90 --list; then
        if [ "$(count ' sm_90 +cached$' "$tmp/out")" -eq 17 ] && grep -q '^17 cached, 0 missing$' "$tmp/out" &&
            grep -q '^rmsnorm_heads_bf16_hd48_af32 *sm_90 *cached$' "$tmp/out"; then
            ok "qwen3 kernels --list: all 17 instances (rmsnorm_heads included) cached"
        else
            bad "qwen3 kernels --list: all 17 cached" "$(cat "$tmp/out")"
        fi
    fi
fi
# ---- the instance set is the list mstarc emitted (ms_model_desc.kernels), not a guess:
#      plain.mstar (post-norm, no residual RMSNorm, no RoPE) lists exactly its 9 emitted files;
#      tiny.mstar (no CUDA instances) is refused in one line ----
if run "mstarc build plain" 0 "$mstarc" build tests/codegen/plain.mstar -o "$tmp/pl"; then
    mkdir -p "$tmp/plcfg"
    echo '{"d": 64, "layers": 2, "heads": 4, "vocab": 32}' >"$tmp/plcfg/config.json"
    if run "plain kernels --list" 0 "$tmp/pl/plain" kernels --model "$tmp/plcfg" --arch sm_90 --list; then
        want=$(ls "$tmp/pl/kernels" | sed 's/\.cu$//' | sort | tr '\n' ' ')
        got=$(grep -E ' sm_90 +(cached|missing)$' "$tmp/out" | awk '{print $1}' |
            sed -E 's/_hd[0-9]+//; s/_ps[0-9]+//; s/_g[0-9]+//' | sort | tr '\n' ' ')
        if [ "$want" = "$got" ] && grep -q '^plain: 16 kernel instances x 1 arch' "$tmp/out" &&
            ! grep -q '^rmsnorm_bf16_res' "$tmp/out"; then
            ok "plain kernels --list: exactly the 16 emitted instances (no rmsnorm_res; 7 qmatmul)"
        else
            bad "plain kernels --list: exactly the emitted instances" "want: $want" "got:  $got" "$(cat "$tmp/out")"
        fi
    fi
fi
if run "mstarc build tiny" 0 "$mstarc" build tests/codegen/tiny.mstar -o "$tmp/ti"; then
    expect_error "tiny kernels: no instances listed" 1 "kernels: model tiny lists no CUDA kernel instances" \
        "$tmp/ti/tiny" kernels --model "$gqa" --arch sm_90 --list
fi
if run "kernels --help" 0 "$bin" kernels --help && grep -q 'usage: llama kernels --model PATH' "$tmp/out"; then
    ok "kernels --help"
fi

# ---- bad flags ----
m=(build models/llama.mstar -o "$tmp/e" --emit-only)
expect_error "mstarc --arch sm_7" 2 "--arch: architecture 'sm_7' not understood" "$mstarc" "${m[@]}" --arch sm_7
expect_error "mstarc --arch sm_abc" 2 "--arch: architecture 'sm_abc' not understood" "$mstarc" "${m[@]}" --arch sm_abc
expect_error "mstarc --arch ''" 2 "--arch: empty architecture list" "$mstarc" "${m[@]}" --arch ''
expect_error "mstarc --arch sm_80,sm_80" 2 "--arch: architecture sm_80 listed twice" "$mstarc" "${m[@]}" --arch sm_80,sm_80
expect_error "mstarc --arch sm_80," 2 "--arch: empty item" "$mstarc" "${m[@]}" --arch sm_80,
expect_error "mstarc --arch sm_51 (not in NVRTC)" 1 "--arch: sm_51 is not supported by this NVRTC" "$mstarc" "${m[@]}" --arch sm_51
expect_error "mstarc --config without --arch" 2 "--config needs --arch" "$mstarc" "${m[@]}" --config "$gqa"
expect_error "mstarc --config missing" 1 "--config $tmp/none: " "$mstarc" "${m[@]}" --arch sm_90 --config "$tmp/none"
expect_error "mstarc --arch without a value" 2 "--arch needs a value" "$mstarc" "${m[@]}" --arch
k=(kernels --model "$gqa")
expect_error "kernels --arch sm_7" 1 "kernels: --arch: architecture 'sm_7' not understood" "$bin" "${k[@]}" --arch sm_7
expect_error "kernels --arch ''" 1 "kernels: --arch: empty architecture list" "$bin" "${k[@]}" --arch ''
expect_error "kernels --arch sm_90,sm_90" 1 "kernels: --arch: architecture sm_90 listed twice" "$bin" "${k[@]}" --arch sm_90,sm_90
expect_error "kernels without --arch and no GPU" 1 "kernels: no GPU to take the architecture from .*pass --arch" "$bin" "${k[@]}"
expect_error "kernels --dtype f32" 1 "kernels: --dtype f32: the CUDA backend keeps weights and KV in bf16" "$bin" "${k[@]}" --arch sm_90 --dtype f32
expect_error "kernels --dtype half" 1 "kernels: --dtype 'half' not understood" "$bin" "${k[@]}" --arch sm_90 --dtype half
expect_error "kernels --page-size 0" 1 "kernels: --page-size '0' is not a number" "$bin" "${k[@]}" --arch sm_90 --page-size 0
expect_error "kernels without --model" 2 "kernels: --model PATH is required" "$bin" kernels --arch sm_90
expect_error "kernels --frob" 2 "kernels: unknown flag '--frob'" "$bin" "${k[@]}" --frob
expect_error "kernels --model missing" 1 "kernels: $tmp/none: cannot open the model" "$bin" kernels --model "$tmp/none" --arch sm_90
MSTAR_CACHE=off expect_error "kernels with MSTAR_CACHE=off" 1 "kernels: kernel cache disabled .*set MSTAR_CACHE" "$bin" "${k[@]}" --arch sm_90

# ---- NVRTC failures: a broken template ----
cp -r "$root/templates" "$tmp/tpl"
printf '\nthis is not C++;\n' >>"$tmp/tpl/attn/decode.cuh"
if MSTAR_TEMPLATES_DIR="$tmp/tpl" run "mstarc --arch --config, broken template" 1 \
    "$mstarc" build models/llama.mstar -o "$tmp/b" --emit-only --arch sm_90 --config "$gqa"; then
    src="$tmp/b/kernels/attn_decode_bf16_af32.cu"
    if grep -q "mstarc: error: NVRTC: compiling attn_decode_bf16_hd16_ps16_g4_af32_sm90 failed .*; source: $src;" "$tmp/err" &&
        grep -q -- "---- NVRTC log of $src (sm_90" "$tmp/err" &&
        grep -qE 'decode.cuh\([0-9]+\): error' "$tmp/err"; then
        ok "mstarc: NVRTC failure names the emitted file and prints the log"
    else
        bad "mstarc: NVRTC failure names the emitted file and prints the log" "$(head -c 1500 "$tmp/err")"
    fi
fi
if MSTAR_TEMPLATES_DIR="$tmp/tpl" run "mstarc --arch (no config), broken template" 1 \
    "$mstarc" build models/llama.mstar -o "$tmp/b" --emit-only --arch sm_90; then
    if grep -qE "compiling attn_decode_bf16(_win)?_af32_hd64_ps16_g1_sm90 failed .*; source: $tmp/b/kernels/attn_decode_bf16(_win)?_af32.cu;" "$tmp/err" &&
        grep -qE 'decode.cuh\([0-9]+\): error' "$tmp/err"; then
        ok "mstarc (no config): NVRTC failure names the emitted file and prints the log"
    else
        bad "mstarc (no config): NVRTC failure names the emitted file" "$(head -c 1500 "$tmp/err")"
    fi
fi
if MSTAR_TEMPLATES_DIR="$tmp/tpl" run "kernels, broken template" 1 "$bin" kernels --model "$gqa" --arch sm_90; then
    failed_src="$MSTAR_CACHE/attn_decode_bf16_hd16_ps16_g4_af32_sm90.failed.cu"
    if grep -q "llama: kernels: NVRTC: compiling attn_decode_bf16_hd16_ps16_g4_af32_sm90 failed .*; source: $failed_src;" "$tmp/err" &&
        grep -qE 'decode.cuh\([0-9]+\): error' "$tmp/err" && [ -f "$failed_src" ] &&
        grep -q '^#define MS_HEAD_DIM 16$' "$failed_src" && grep -q '^#define MS_GROUP 4$' "$failed_src" &&
        grep -q 'ms::attn_decode<' "$failed_src"; then
        ok "kernels: NVRTC failure writes <cache>/<uri>.failed.cu with the shape defines and prints the log"
    else
        bad "kernels: NVRTC failure writes <cache>/<uri>.failed.cu" "$(head -c 1500 "$tmp/err")"
    fi
fi

# ---- without --config: a compile check at the representative shapes, nothing cached ----
# (about 14 compiles: the plain build only; the sanitizer builds run the same code in the failure
# path above)
case $build in
*/asan | */tsan)
    echo "skip: compile check without --config (plain build only)" ;;
*)
    before=$(find "$MSTAR_CACHE" -name '*.cubin' | wc -l)
    if run "mstarc --arch sm_90 without --config (plain.mstar)" 0 \
        "$mstarc" build tests/codegen/plain.mstar -o "$tmp/p" --emit-only --arch sm_90; then
        after=$(find "$MSTAR_CACHE" -name '*.cubin' | wc -l)
        n_ok=$(count ' sm_90 +ok ' "$tmp/out")
        if [ "$n_ok" -eq 21 ] && [ "$before" -eq "$after" ] &&
            grep -q 'compile-checked at head_dim=64,128, group=1,4,8 .*no cache entries: pass --config' "$tmp/out" &&
            grep -q 'attn_decode_bf16_af32_hd128_ps32_g8 *sm_90 *ok' "$tmp/out"; then
            ok "mstarc without --config: 21 checks at the representative shapes, no cache entries"
        else
            bad "mstarc without --config" "ok lines $n_ok (want 21), cubins $before -> $after" "$(cat "$tmp/out")"
        fi
    fi ;;
esac

# ---- the talker (models/talker.mstar): its code predictor on a scratch KV loads instances at its
#      own shape (2 query heads over 1, pages of one 4-slot frame) beside the talker's; the
#      talker embeds its frames' codes (embed; the sum's residual add is in the linears) ----
tk="$fx/hf/talker_codepred"
if [ -f "$tk/config.json" ] && run "mstarc build talker --arch sm_90 --config talker_codepred" 0 \
    "$mstarc" build models/talker.mstar -o "$tmp/tk" --emit-only --arch sm_90 --config "$tk"; then
    if [ "$(count ' sm_90 +(compiled|cached) ' "$tmp/out")" -eq 19 ] &&
        grep -qE 'embed_bf16_af32 +sm_90' "$tmp/out" &&
        grep -q 'kernels: node code_predictor at head_dim=16, page_size=4, group=2' "$tmp/out" &&
        grep -qE 'attn_decode_bf16_hd16_ps4_g2_af32 +sm_90' "$tmp/out" &&
        grep -qE 'rope_kv_bf16_hd16_ps4_neox_af32 +sm_90' "$tmp/out" &&
        grep -qE 'attn_prefill_bf16_hd16_ps16_g2_causal_af32 +sm_90' "$tmp/out"; then
        ok "mstarc talker: 19 instances (7 of them qmatmul, the frame embedding's gather among them), the code predictor's 3 at page size 4"
    else
        bad "mstarc talker: 19 instances" "$(cat "$tmp/out")"
    fi
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
