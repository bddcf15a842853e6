#!/usr/bin/env bash
# gpu-batch.sh - everything GPU-side in one call: environment, build, `make gpu-test` (kernels
# against references), compute-sanitizer memcheck on the kernel tests, the kernel benchmark.
# Logs go to $OUT (or build/gpu-out); a short summary is printed last. Step time limits add up to
# under 10 minutes with a prebuilt bundle (the device tool's limit for one command).
#
#   on the device machine, from the repository root:   scripts/gpu-batch.sh
#   here (no GPU), to build once and skip the build there:
#       scripts/gpu-batch.sh --bundle DIR     (DIR must be ignored by git, e.g. listed in
#                                              .git/info/exclude; name it in the call's carry)
#     then on the device machine:              MS_GPU_BUNDLE=DIR scripts/gpu-batch.sh
#     (or MS_GPU_BUNDLE=DIR.tar.xz: the packed copy --bundle also writes, under the carry limit)
#
# The bundle holds the GPU test and benchmark binaries, mstarc, mstar-mkckpt, the generated llama
# and qwen3 serving binaries, a llama binary with its kernels precompiled by `mstarc --arch sm_90
# --config hf/llama_gqa` (and that cache), a copy of the hf/ and llama2c/ fixtures (the device
# sees only the carried tree), the shared libraries a bare CUDA image may lack (cmocka, jansson),
# and the NVRTC cubin cache already filled for sm_80/sm_90 by test_nvrtc, so the device spends no
# time compiling. About 45 MB: under the device tool's 64 MiB carry limit. Without a bundle the script builds there
# with make, which needs cmocka and the other dependencies installed (scripts/install-deps.sh).
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--bundle" ]; then
    dir=${2:?usage: gpu-batch.sh --bundle DIR}
    make -j2 all build/tests/test_nvrtc build/tests/test_gpu_kernels build/tests/test_backend_cuda \
        build/tests/test_llama_cuda_fixture build/tests/test_engine_features_cuda || exit 1
    build/tests/test_nvrtc >/dev/null || { echo "test_nvrtc failed: fix the kernels first"; exit 1; }
    rm -rf "$dir" && mkdir -p "$dir/bin/llama" "$dir/bin/qwen3" "$dir/lib" "$dir/pre" "$dir/fixtures"
    cp build/tests/test_gpu_kernels build/tests/test_backend_cuda build/tests/test_llama_cuda_fixture \
        build/tests/test_engine_features_cuda build/tests/bench_kernels build/mstarc build/mstar-mkckpt "$dir/bin/"
    # quantized weights kept in ggml blocks on the GPU (issue [I]): kernels, engine (MS_GPU_QUANT=1)
    make -j2 build/tests/test_quant_cuda build/tests/test_quant_smollm2_cuda &&
        cp build/tests/test_quant_cuda build/tests/test_quant_smollm2_cuda "$dir/bin/" || exit 1
    # the encoder ops (LayerNorm, GELU, conv1d, bidirectional attention over 1500 keys) vs the CPU
    make -j2 build/tests/test_encoder_ops_cuda && cp build/tests/test_encoder_ops_cuda "$dir/bin/" &&
        strip "$dir/bin/test_encoder_ops_cuda" || exit 1 # 1.8 -> 1.0 MB: the bundle is near the carry limit
    # the serving binaries (llama: gpu_generate.sh and bench-8b.sh; qwen3: per-head norm end to end)
    build/mstarc build models/llama.mstar -o "$dir/bin/llama" >/dev/null || exit 1
    build/mstarc build models/qwen3.mstar -o "$dir/bin/qwen3" >/dev/null || exit 1
    build/mstarc build models/qwen2vl.mstar -o "$dir/bin/qwen2vl" >/dev/null || exit 1
    build/mstarc build models/whisper.mstar -o "$dir/bin/whisper" >/dev/null || exit 1
    build/mstarc build models/talker.mstar -o "$dir/bin/talker" >/dev/null || exit 1
    # hf/qwen2vl_mrope's prompt and t/h/w ids as the CLI takes them (--prompt-ids, --position-ids)
    python3 - ../shared/fixtures/hf/qwen2vl_mrope/reference.safetensors "$dir" <<'PY' || exit 1
import json, struct, sys
b = open(sys.argv[1], 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
h = json.loads(b[8:8 + n])
def get(name):
    s, e = h[name]['data_offsets']
    return list(struct.unpack('<%di' % ((e - s) // 4), b[8 + n + s:8 + n + e])), h[name]['shape']
ids, _ = get('input_ids')
pos, (axes, S) = get('position_ids_thw')
open(sys.argv[2] + '/q2vl_ids.txt', 'w').write(','.join(map(str, ids)))
json.dump([pos[a * S:(a + 1) * S] for a in range(axes)], open(sys.argv[2] + '/q2vl_thw.json', 'w'))
PY
    rm -f "$dir"/bin/*/*.c
    # precompiled here for sm_90 from llama_gqa's shape: generate on the GPU must add no cubin
    MSTAR_CACHE="$PWD/$dir/precache" build/mstarc build models/llama.mstar -o "$dir/pre" \
        --arch sm_90 --config ../shared/fixtures/hf/llama_gqa >/dev/null || exit 1
    rm -f "$dir"/pre/*.c && rm -rf "$dir/pre/kernels"
    # the fixtures the GPU steps read (whisper_base's real weights would overflow the carry limit)
    mkdir -p "$dir/fixtures/hf"
    for fx in llama_gqa mistral_window llama31_rope llama31_rope_legacy qwen3 qwen2vl_mrope \
        llama_cfg llama_dense whisper_tiny talker_codepred; do
        cp -r "../shared/fixtures/hf/$fx" "$dir/fixtures/hf/"
    done
    cp -r ../shared/fixtures/llama2c ../shared/fixtures/README.md "$dir/fixtures/"
    # serve part: the CUDA sampler test (test_sampler_cuda) rides in the bundle
    make -j2 build/tests/test_sampler_cuda && cp build/tests/test_sampler_cuda "$dir/bin/" || exit 1
    # n > 1 forks and prompt logprobs on the GPU (test_engine_fork_cuda.c) ride there too
    make -j2 build/tests/test_engine_fork_cuda && cp build/tests/test_engine_fork_cuda "$dir/bin/" || exit 1
    for lib in $(ldd "$dir"/bin/* "$dir"/bin/*/* 2>/dev/null | awk '/=>/ { print $3 }' | sort -u); do
        case "$lib" in
        /usr/local/cuda*|*/libc.so*|*/libm.so*|*/libpthread.so*|*/librt.so*|*/libdl.so*|*/ld-linux*) ;;
        */libgcc_s.so*|*/libstdc++.so*) ;; # the device's own (newer) copies must win
        *) cp -L "$lib" "$dir/lib/" ;;
        esac
    done
    # newest sm_90 cubin per instance (the H200's; older hashes are left over from earlier
    # template versions, sm_80 ones would only take carry room)
    mkdir -p "$dir/cache"
    ls -t build/kernel-cache-test/*_sm90-*.cubin | awk -F/ '{ f = $NF; sub(/-[0-9a-f]+\.cubin$/, "", f); if (!seen[f]++) print }' |
        xargs -r cp -t "$dir/cache"
    # talker + code predictor on the GPU: select_rows (code.first) and the model vs the bf16 CPU
    make -j2 build/tests/test_talker_cuda && cp build/tests/test_talker_cuda "$dir/bin/" || exit 1
    # CUDA graphs against the padded eager path (test_graphs_cuda.c; runtime/engine/graph_exec.h)
    make -j2 build/tests/test_graphs_cuda && cp build/tests/test_graphs_cuda "$dir/bin/" || exit 1
    # NCCL communicators (issue [K]): one rank on device 0 (test_nccl.c, MS_NCCL_GPU=1)
    make -j2 build/tests/test_nccl && cp build/tests/test_nccl "$dir/bin/" || exit 1
    # [pd] CUDA IPC / NCCL KV transfers (test_pd_gpu.c; NCCL part needs 2 GPUs, else it skips)
    make -j2 build/tests/test_pd_gpu && cp build/tests/test_pd_gpu "$dir/bin/" || exit 1
    # debug sections off every binary: the bundle plus the working tree must stay under the
    # device tool's 64 MiB carry limit
    find "$dir/bin" "$dir/pre" -type f -perm -u+x -exec strip --strip-debug {} + || exit 1
    du -sh "$dir"
    # packed too: the directory (about 70 MB with every model binary) is over the carry limit,
    # the xz tarball about a third of it; carry DIR.tar.xz and set MS_GPU_BUNDLE to it there
    tar -C "$dir" -cf - . | xz -T2 -6 >"$dir.tar.xz" || exit 1
    du -sh "$dir.tar.xz"
    exit 0
fi

OUT=${OUT:-build/gpu-out}
mkdir -p "$OUT"
# a packed bundle (DIR.tar.xz from --bundle) is unpacked once into /tmp and used from there
case "${MS_GPU_BUNDLE:-}" in
*.tar.xz)
    ub=/tmp/ms-gpu-bundle
    if [ ! -f "$ub/.unpacked" ]; then
        rm -rf "$ub" && mkdir -p "$ub" && tar -C "$ub" -xJf "$MS_GPU_BUNDLE" && touch "$ub/.unpacked" ||
            { echo "cannot unpack $MS_GPU_BUNDLE"; exit 1; }
    fi
    MS_GPU_BUNDLE=$ub
    ;;
esac
summary=()

step() { # step NAME LIMIT_SECONDS COMMAND... : run, log to $OUT/NAME.log, record the result
    local name=$1 limit=$2
    shift 2
    local start=$SECONDS
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    local line
    line=$(grep -E '^[0-9]+ passed, [0-9]+ failed|PASSED|FAILED|ERROR SUMMARY' "$OUT/$name.log" | tail -n 2 | tr '\n' ' ')
    summary+=("$(printf '%-14s rc=%-3s %4ss  %s' "$name" "$rc" "$((SECONDS - start))" "$line")")
    return $rc
}

{
    date -u
    nvidia-smi || true
    command -v nvcc >/dev/null && nvcc --version | tail -n 2
    command -v compute-sanitizer >/dev/null && compute-sanitizer --version | head -n 2
    uname -a
} >"$OUT/env.log" 2>&1

# serve part: the CUDA sampler (min_p included) against the CPU's on random rows, and seeded rows
# alone == batched; then, only when MS_GPU_SOAK=SECONDS is set (off by default), the serve soak
# alone: 256 streaming clients (MS_GPU_SOAK_CLIENTS) on hf/llama_gqa with --device cuda, every
# response complete and 0 KV pages held at the end (tests/serve_soak.sh). The device's 600 s
# limit per command: MS_GPU_SOAK=540 in a call of its own (the script exits after the soak).
if [ -n "${MS_GPU_BUNDLE:-}" ]; then
    sb=$MS_GPU_BUNDLE
    [[ $sb = /* ]] || sb=$PWD/$sb
    export LD_LIBRARY_PATH="$sb/lib:${LD_LIBRARY_PATH:-}"
    s_test=$sb/bin/test_sampler_cuda s_bin=$sb/bin/llama/llama s_fx=$sb/fixtures
else
    make -j"$(nproc)" build/tests/test_sampler_cuda build/llama/llama >"$OUT/build-serve.log" 2>&1
    s_test=build/tests/test_sampler_cuda s_bin=build/llama/llama s_fx=../shared/fixtures
fi
step sampler 60 "$s_test"
# n > 1 forks (the partial page copied on the device) and prompt logprobs (every prompt row)
[ -n "${MS_GPU_BUNDLE:-}" ] || make -j"$(nproc)" build/tests/test_engine_fork_cuda >>"$OUT/build-serve.log" 2>&1
step fork 90 env MS_FIXTURES="$s_fx" "$(dirname "$s_test")/test_engine_fork_cuda"
if [ -n "${MS_GPU_SOAK:-}" ]; then
    step soak $((MS_GPU_SOAK + 50)) env BIN="$s_bin" MS_FIXTURES="$s_fx" SOAK_MODEL="$s_fx/hf/llama_gqa" \
        SOAK_TOKENIZER= SOAK_IDS=512 SOAK_CLIENTS="${MS_GPU_SOAK_CLIENTS:-256}" SOAK_SECONDS="$MS_GPU_SOAK" \
        SOAK_CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}" \
        SOAK_MAX_SEQS=256 SOAK_ARGS="--device cuda --max-tokens-per-step 4096" bash tests/serve_soak.sh
    soak_rc=$?
    cat "$OUT/sampler.log" "$OUT/soak.log"
    printf '%s\n' "${summary[@]}"
    exit $soak_rc
fi

# quantized weights (issue [I]), only when MS_GPU_QUANT is set, in a call of its own (exits after):
# MS_GPU_QUANT=1: test_quant_cuda (GEMV / prefill / dequant per type vs the CPU; its graph
# replay after workspace growth again under compute-sanitizer) and
# test_quant_smollm2_cuda (engine on cuda vs the CPU; SmolLM2 skips without the model);
# MS_GPU_QUANT=q4_0 (or q4_k, q8_0): scripts/bench-quant-8b.sh for that type (about 3 minutes).
if [ -n "${MS_GPU_QUANT:-}" ]; then
    if [ -n "${MS_GPU_BUNDLE:-}" ]; then
        qt=$sb/bin qbuild=$sb/bin
    else
        qt=build/tests qbuild=build
        make -j"$(nproc)" build/tests/test_quant_cuda build/tests/test_quant_smollm2_cuda build/mstar-mkckpt \
            build/llama/llama >"$OUT/build-quant.log" 2>&1
    fi
    if [ "$MS_GPU_QUANT" = 1 ]; then
        step quant 240 "$qt/test_quant_cuda"
        # every kernel launched with programmatic dependent launch (cuda_ops.h ms_cuda_pdl)
        step quant-pdl 120 env MS_CUDA_PDL=all "$qt/test_quant_cuda"
        # the replay after the workspace grew, under memcheck: a write into freed memory is certain
        # to show here (the test alone sees it only when the allocator reuses the freed range)
        command -v compute-sanitizer >/dev/null &&
            step quant-memcheck 120 env MS_TEST_FILTER=test_graph_survives_workspace_growth \
                compute-sanitizer --tool memcheck --error-exitcode 3 "$qt/test_quant_cuda"
        step quant-engine 240 env MS_BUILD="$qbuild" "$qt/test_quant_smollm2_cuda"
        cat "$OUT/quant.log" "$OUT/quant-engine.log"
    else
        step bench-quant 560 env MS_BUILD="$qbuild" MS_BENCH_BIN="$qbuild/llama/llama" \
            scripts/bench-quant-8b.sh "$MS_GPU_QUANT"
        cat "$OUT/bench-quant.log"
    fi
    printf '%s\n' "${summary[@]}"
    exit 0
fi

if [ -n "${MS_GPU_BUNDLE:-}" ]; then
    b=$MS_GPU_BUNDLE
    [[ $b = /* ]] || b=$PWD/$b
    export LD_LIBRARY_PATH="$b/lib:${LD_LIBRARY_PATH:-}"
    cache=/tmp/ms-kernel-cache
    rm -rf "$cache" && cp -r "$b/cache" "$cache" && chmod -R u+w "$cache"
    export MS_KERNEL_CACHE_TEST=$cache MSTAR_CACHE=$cache MS_FIXTURES=$b/fixtures
    tests=("$b/bin/test_gpu_kernels" "$b/bin/test_backend_cuda" "$b/bin/test_llama_cuda_fixture")
    bench="$b/bin/bench_kernels"
    step gpu-test 150 "${tests[0]}"
    step backend 60 "${tests[1]}"
    step fixtures 90 "${tests[2]}"
    step features 120 "$b/bin/test_engine_features_cuda"
    step graphs 150 "$b/bin/test_graphs_cuda" # graphs vs padded eager, bitwise; capture time
    # the same with every kernel launched with programmatic dependent launch (MS_CUDA_PDL=all)
    step gpu-test-pdl 150 env MS_CUDA_PDL=all "${tests[0]}"
    step graphs-pdl 150 env MS_CUDA_PDL=all "$b/bin/test_graphs_cuda"
    # NCCL is loaded with dlopen (backends/nccl_comm.h): the toolkit's, else PyTorch's copy there
    nccl_dir=$(ldconfig -p 2>/dev/null | awk '/libnccl\.so\.2 / { print $NF; exit }' | xargs -r dirname)
    [ -n "$nccl_dir" ] || nccl_dir=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
    [ -n "$nccl_dir" ] || nccl_dir=$(find /usr /opt -name libnccl.so.2 2>/dev/null | head -n 1 | xargs -r dirname)
    echo "libnccl.so.2 from: ${nccl_dir:-not found}" >"$OUT/nccl-where.log"
    step nccl 60 env MS_NCCL_GPU=1 LD_LIBRARY_PATH="${nccl_dir:+$nccl_dir:}$LD_LIBRARY_PATH" "$b/bin/test_nccl"
    step pd-gpu 60 env LD_LIBRARY_PATH="${nccl_dir:+$nccl_dir:}$LD_LIBRARY_PATH" "$b/bin/test_pd_gpu" # [pd]
    # one prompt of 32 tokens: prefill bucket (32 tokens, 1 row) and decode bucket 1 are the batch
    # itself (no padding rows), so generate with graphs == --no-graphs, bitwise
    gg=(generate --model "$b/fixtures/hf/llama_gqa"
        --prompt-ids 1,79,64,5,17,33,2,90,41,7,12,250,3,8,66,101,9,14,27,31,45,60,72,88,99,111,123,130,140,150,160,170
        --max-new-tokens 24
        --temperature 0 --output ids --tokenizer none --ignore-eos --device cuda)
    {
        g=$("$b/bin/llama/llama" "${gg[@]}" 2>"$OUT/generate-graphs.err")
        c=$("$b/bin/llama/llama" "${gg[@]}" --no-graphs 2>/dev/null)
        cat "$OUT/generate-graphs.err"
        echo "graphs:    $g"
        echo "no-graphs: $c"
        [ -n "$g" ] && [ "$g" = "$c" ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
    } >"$OUT/generate-graphs.log" 2>&1
    summary+=("$(printf '%-14s %s' gen-graphs "$(tail -n 1 "$OUT/generate-graphs.log")")")
    step encoder 120 "$b/bin/test_encoder_ops_cuda"
    step talker-cuda 90 "$b/bin/test_talker_cuda"
    step generate 90 env MS_BUILD="$b/bin" BIN="$b/bin/llama/llama" bash tests/gpu_generate.sh
    # what mstarc --arch sm_90 --config hf/llama_gqa precompiled (here: the bundle) is all that
    # generate --device cuda loads: the cache must not grow (tests/kernels_gpu.sh without a compiler)
    pc=/tmp/ms-precache
    rm -rf "$pc" && cp -r "$b/precache" "$pc" && chmod -R u+w "$pc"
    n0=$(ls "$pc"/*.cubin | wc -l)
    {
        for t in "--temperature 0" "--temperature 0.8 --top-p 0.9 --seed 1"; do
            # shellcheck disable=SC2086
            MSTAR_CACHE=$pc "$b/pre/llama" generate --device cuda --model "$b/fixtures/hf/llama_gqa" \
                --prompt-ids 1,79,64 --max-new-tokens 8 $t
        done
        MSTAR_CACHE=$pc "$b/pre/llama" kernels --model "$b/fixtures/hf/llama_gqa"
        n1=$(ls "$pc"/*.cubin | wc -l)
        echo "cubins in the precompiled cache: $n0 before generate, $n1 after"
        [ "$n0" = "$n1" ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
    } >"$OUT/precompiled.log" 2>&1
    summary+=("$(printf '%-14s %s' precompiled "$(tail -n 2 "$OUT/precompiled.log" | tr '\n' ' ')")")
    # Qwen3 (per-head q/k norm, head_dim 48) end to end: greedy ids on cuda and on the bf16 CPU
    q3=(generate --model "$b/fixtures/hf/qwen3" --prompt-ids 1,5,9,13,200,31 --max-new-tokens 20
        --temperature 0 --output ids)
    {
        g=$("$b/bin/qwen3/qwen3" "${q3[@]}" --device cuda 2>/dev/null)
        c=$("$b/bin/qwen3/qwen3" "${q3[@]}" --device cpu --dtype bf16 2>/dev/null)
        echo "cuda: $g"
        echo "cpu:  $c"
        [ -n "$g" ] && [ "$g" = "$c" ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
    } >"$OUT/qwen3.log" 2>&1
    summary+=("$(printf '%-14s %s' qwen3 "$(tail -n 1 "$OUT/qwen3.log")")")
    # Qwen2-VL (M-RoPE, explicit t/h/w ids from --position-ids) end to end: cuda == cpu bf16
    q2=(generate --model "$b/fixtures/hf/qwen2vl_mrope" --prompt-ids "$(cat "$b/q2vl_ids.txt")"
        --position-ids "$b/q2vl_thw.json" --max-new-tokens 16 --temperature 0 --output ids
        --tokenizer none --ignore-eos)
    {
        g=$("$b/bin/qwen2vl/qwen2vl" "${q2[@]}" --device cuda 2>/dev/null)
        c=$("$b/bin/qwen2vl/qwen2vl" "${q2[@]}" --device cpu --dtype bf16 2>/dev/null)
        echo "cuda: $g"
        echo "cpu:  $c"
        [ -n "$g" ] && [ "$g" = "$c" ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
    } >"$OUT/qwen2vl.log" 2>&1
    summary+=("$(printf '%-14s %s' qwen2vl "$(tail -n 1 "$OUT/qwen2vl.log")")")
    # prefix caching on the GPU: three requests over a shared 40-id prefix through serve give the
    # same greedy ids with and without the cache, and the cache hits (64 tokens)
    {
        pfx=$(seq -s, 11 50)
        for mode in cache nocache; do
            extra=()
            [ "$mode" = nocache ] && extra=(--no-prefix-cache)
            "$b/bin/llama/llama" serve --model "$b/fixtures/hf/llama_gqa" --tokenizer none \
                --device cuda --page-size 16 --port 0 "${extra[@]}" 2>"$OUT/pfx-$mode.err" &
            spid=$!
            surl=
            for _ in $(seq 300); do
                surl=$(sed -n 's/^listening on //p' "$OUT/pfx-$mode.err")
                [ -n "$surl" ] && break
                sleep 0.1
            done
            for k in 1 2 3; do
                curl -s -m 60 -d "{\"prompt\": [$pfx, $k, 7, 8, 9], \"max_tokens\": 24, \"temperature\": 0, \"ignore_eos\": true}" \
                    "$surl/v1/completions" |
                    python3 -c 'import json, sys; print(json.load(sys.stdin)["choices"][0]["text"])' \
                        >"$OUT/pfx-$mode-$k.txt" 2>&1
            done
            curl -s -m 10 "$surl/metrics" | awk '$1 == "mstar_prefix_cache_hit_tokens_total" { print $2 }' >"$OUT/pfx-$mode-hits.txt"
            kill -TERM "$spid"
            wait "$spid"
        done
        same=1
        for k in 1 2 3; do cmp -s "$OUT/pfx-cache-$k.txt" "$OUT/pfx-nocache-$k.txt" || same=0; done
        echo "hit tokens: cache $(cat "$OUT/pfx-cache-hits.txt"), no cache $(cat "$OUT/pfx-nocache-hits.txt")"
        [ "$same" = 1 ] && [ "$(cat "$OUT/pfx-cache-hits.txt")" = 64 ] && echo "1 passed, 0 failed" ||
            echo "0 passed, 1 failed"
    } >"$OUT/prefix.log" 2>&1
    summary+=("$(printf '%-14s %s' prefix "$(tail -n 1 "$OUT/prefix.log")")")
    # Whisper (encoder node, cross-attention decoder) on the GPU: hf/whisper_tiny's reference
    # input_features through `transcribe`, greedy ids on cuda against the bf16 CPU run's; the
    # window twice, so one encoder step runs the dense attention (attn_dense) over 2 segments
    wt=(transcribe --model "$b/fixtures/hf/whisper_tiny" --features
        "$b/fixtures/hf/whisper_tiny/reference.safetensors:input_features" --features
        "$b/fixtures/hf/whisper_tiny/reference.safetensors:input_features" --prompt 3
        --max-new-tokens 20)
    {
        g=$("$b/bin/whisper/whisper" "${wt[@]}" --device cuda 2>&1)
        c=$("$b/bin/whisper/whisper" "${wt[@]}" --device cpu 2>&1)
        echo "cuda: $g"
        echo "cpu:  $c"
        [ -n "$g" ] && [ "$g" = "$c" ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
    } >"$OUT/whisper.log" 2>&1
    summary+=("$(printf '%-14s %s' whisper "$(tail -n 1 "$OUT/whisper.log")")")
    # tensor parallelism (engine/tp.h, issue [K]): generate --tp 2 (rank r on GPU r, NCCL, NVLS
    # off) gives the ids of --tp 1 on hf/llama_gqa, greedy and sampled; fewer than 2 GPUs: skip
    {
        n_gpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
        if [ "$n_gpu" -lt 2 ]; then
            echo "skip: tensor parallel needs 2 GPUs, $n_gpu visible"
        else
            pass=0 fail=0
            for samp in "--temperature 0" "--temperature 0.8 --top-p 0.9 --seed 5"; do
                # shellcheck disable=SC2206
                tpa=(generate --model "$b/fixtures/hf/llama_gqa" --tokenizer none --ignore-eos
                    --prompt-ids 1,5,9,33,7,100 --max-new-tokens 32 --output ids --device cuda $samp)
                one=$(timeout 120 "$b/bin/llama/llama" "${tpa[@]}" 2>>"$OUT/tp.err")
                two=$(timeout 120 "$b/bin/llama/llama" "${tpa[@]}" --tp 2 2>>"$OUT/tp.err")
                echo "$samp: tp 1: $one"
                echo "$samp: tp 2: $two"
                if [ -n "$one" ] && [ "$one" = "$two" ]; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
            done
            echo "$pass passed, $fail failed"
        fi
    } >"$OUT/tp.log" 2>&1
    summary+=("$(printf '%-14s %s' tp "$(tail -n 1 "$OUT/tp.log")")")
    # talker + code predictor (models/talker.mstar: the code_predictor node on its scratch KV) on
    # the GPU: hf/talker_codepred's prompt frames, 12 frames of codes through `talker codes` on
    # cuda against the bf16 CPU run's (written without a GPU: first run in the next session)
    {
        tc="$b/fixtures/hf/talker_codepred"
        python3 -c 'import json,struct,sys; b=open(sys.argv[1],"rb").read(); n=struct.unpack("<Q",b[:8])[0]; m=json.loads(b[8:8+n])["prompt_codes"]; s,e=m["data_offsets"]; v=struct.unpack("<%di"%((e-s)//4),b[8+n+s:8+n+e]); c=m["shape"][1]; print("\n".join(" ".join(map(str,v[i:i+c])) for i in range(0,len(v),c)))' \
            "$tc/reference.safetensors" >"$OUT/talker_prompt.txt"
        tk=(talker codes --model "$tc" --prompt-codes "$OUT/talker_prompt.txt")
        g=$("$b/bin/talker/talker" "${tk[@]}" --device cuda 2>&1)
        c=$("$b/bin/talker/talker" "${tk[@]}" --device cpu --dtype bf16 2>&1)
        echo "cuda: $(echo $g)"
        echo "cpu bf16: $(echo $c)"
        [ -n "$g" ] && [ "$g" = "$c" ] && echo "1 passed, 0 failed" || echo "0 passed, 1 failed"
    } >"$OUT/talker.log" 2>&1
    summary+=("$(printf '%-14s %s' talker "$(tail -n 1 "$OUT/talker.log")")")
else
    if ! pkg-config --exists cmocka jansson libmicrohttpd libpcre2-8; then
        echo "missing build dependencies (cmocka, jansson, libmicrohttpd, pcre2): run"
        echo "scripts/gpu-batch.sh --bundle DIR here and MS_GPU_BUNDLE=DIR there" | tee "$OUT/build.log"
        exit 2
    fi
    step build 600 make -j"$(nproc)" all build/tests/test_gpu_kernels build/tests/test_backend_cuda \
        build/tests/test_llama_cuda_fixture || { tail -n 40 "$OUT/build.log"; exit 1; }
    export MSTAR_CACHE=$PWD/build/kernel-cache-test
    tests=(build/tests/test_gpu_kernels build/tests/test_backend_cuda build/tests/test_llama_cuda_fixture)
    bench=build/tests/bench_kernels
    # what `make gpu-test` runs, called directly so the per-op lines land in the logs
    step gpu-test 120 "${tests[0]}"
    step backend 60 "${tests[1]}"
    step fixtures 60 "${tests[2]}"
fi

# memcheck: the same kernel tests under compute-sanitizer (the cubin cache is warm by now)
if command -v compute-sanitizer >/dev/null; then
    step memcheck 150 compute-sanitizer --tool memcheck --error-exitcode 3 "${tests[0]}"
    step memcheck-fx 100 compute-sanitizer --tool memcheck --error-exitcode 3 "${tests[2]}"
fi
step bench 90 "$bench"

echo "== test output (kernel / op, relative error vs reference, tolerance)"
grep -E '^  (attn|rope|rmsnorm|silu|embed|argmax|sample)' "$OUT/gpu-test.log" | head -n 80
echo "== CUDA backend vs CPU backend"
grep -E '^  [a-z]' "$OUT/backend.log" | head -n 40
echo "== fixtures on the GPU"
grep -E '^fixture' "$OUT/fixtures.log"
[ -f "$OUT/encoder.log" ] && { echo "== encoder ops: CUDA vs CPU"; grep -E '^  [a-z]' "$OUT/encoder.log"; }
[ -f "$OUT/features.log" ] && { echo "== model features through the engine on the GPU"; grep -E '^engine' "$OUT/features.log"; }
[ -f "$OUT/graphs.log" ] && { echo "== CUDA graphs (test_graphs_cuda)"; grep -E '^graphs' "$OUT/graphs.log"; }
[ -f "$OUT/generate.log" ] && { echo "== generated binary on the GPU"; grep -E '^(ok|FAIL)' "$OUT/generate.log"; }
echo "== benchmark"
cat "$OUT/bench.log"
echo "== summary (logs in $OUT)"
printf '%s\n' "${summary[@]}"
