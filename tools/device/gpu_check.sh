#!/bin/bash
# One call on the GPU machine (the device tool), from the repository root, with .device-bin and .device-deps carried
# (tools/device/stage.sh prepares them). Stages (default: all): tests sanitizer kernels bench fixtures; others on
# request: seam, int4, profile, hf, quest, eval, ab (below).
# Logs and JSON go to $OUT; a short table is printed last.
#
#   ab     whole decode steps of the old binary (.device-old/quest: `tools/device/stage.sh --old` before the change)
#          against the new one, alternated in AB_ROUNDS rounds (default 2) in this one call, so that the machine's
#          own drift (3-4% between H200s) does not enter the comparison. AB_ROWS: rows "weights context budget",
#          separated by ';' (default: int4 32768 2048; int4 32768 full; int4 4096 2048; fp16 32768 2048); AB_NEW_ARGS:
#          extra bench flags for the new binary only (e.g. a switch that turns the change on); AB_ARGS: flags for both
#          (name the selector, AB_ARGS="--selector quest", when the old binary predates sparq as the default). Prints
#          p50 ms per round and the change of the median.
set -u
. "$(dirname "$0")/env.sh"
OUT=${OUT:-/tmp/quest-out}
mkdir -p "$OUT"
BIN=$PWD/.device-bin
stages=${*:-tests kernels bench fixtures sanitizer}
summary=()
# ab: the median of a list of p50 figures ("fail" entries skipped), and the change from the old median to the new.
ab_median() {
  tr ' ' '\n' <<< "$1" | grep -E '^[0-9.]+$' | sort -n |
    awk '{a[NR] = $1} END {if (NR % 2) print a[(NR + 1) / 2]; else if (NR) print (a[NR / 2] + a[NR / 2 + 1]) / 2}'
}
ab_change() {
  local o n
  o=$(ab_median "$1")
  n=$(ab_median "$2")
  if [ -n "$o" ] && [ -n "$n" ]; then
    awk -v o="$o" -v n="$n" 'BEGIN {printf "%+.2f%%", 100 * (n - o) / o}'
  else
    echo n/a
  fi
}
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
git log -1 --format='commit %h %s' 2>/dev/null | tee -a "$OUT/gpu.txt"

for s in $stages; do
  case $s in
    tests)
      "$BIN/quest_cuda_tests" --gtest_output=json:"$OUT/cuda_tests.json" > "$OUT/cuda_tests.log" 2>&1
      rc=$?
      summary+=("cuda tests: rc=$rc $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/cuda_tests.log" | tr '\n' ' ')")
      grep -E '^\[  FAILED  \]|Failure|error' "$OUT/cuda_tests.log" | head -40
      ;;
    sanitizer)
      # memcheck on small models and kernels (slow under the tool: small cases only)
      filter='SelectorSeamCuda.*:CudaMemoryPlan.*:CudaHfParity.*:CudaModel.Stories*:CudaOps.Rope*:CudaOps.Swiglu:CudaOps.Embedding:CudaOps.AttentionDecodeInsideAGraph*:QuestCuda.GraphReplay*:QuestCuda.TopKDense*:CudaAttentionPrefill.ChunkingIsBitExact:CudaAttentionPrefill.NoSlack:PageSelectCuda.*:QuestCuda.FusedDecodeMatchesSeparateLaunches:QuestCuda.DecodeInAWindowMatchesReference:CudaModel.SlidingWindowQuestFollowsCpu:CudaOps.EmbeddingRows*'
      timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/quest_cuda_tests" --gtest_filter="$filter" \
        > "$OUT/memcheck.log" 2>&1
      rc=$?
      summary+=("memcheck: rc=$rc $(grep -E 'ERROR SUMMARY' "$OUT/memcheck.log" | tail -1)")
      # The tensor-parallel tests apart: NCCL's communicator set-up probes kernel images for other architectures
      # (cudaFuncGetAttributes -> cudaErrorNoKernelImageForDevice, handled inside libnccl), which memcheck would
      # report as API errors; memory errors are still reported.
      timeout 150 compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9 "$BIN/quest_cuda_tests" \
        --gtest_filter='TpCuda.*:*TpCudaFixture.*' > "$OUT/memcheck-tp.log" 2>&1
      rc=$?
      summary+=("memcheck (tensor parallel): rc=$rc $(grep -E 'ERROR SUMMARY' "$OUT/memcheck-tp.log" | tail -1)")
      timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 "$BIN/quest_cuda_tests" \
        --gtest_filter='QuestCuda.FusedDecodeMatchesSeparateLaunches:CudaOps.AttentionDecodeInsideAGraph*:CudaHfParity.*/0:QuestCuda.GraphReplay*:CudaAttentionPrefill.NoSlack' \
        > "$OUT/racecheck.log" 2>&1
      rc=$?
      summary+=("racecheck: rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/racecheck.log" | tail -1)")
      ;;
    seam)
      # memcheck on the seam harness (tests/cuda/test_seam_parity.cpp): every format at the small shapes, every
      # registered selector on the demo model
      timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/quest_cuda_tests" \
        --gtest_filter='Shapes/FormatParity.*/3:Shapes/FormatParity.*/4:Shapes/FormatParity.*/5:SelectorParity.*' \
        > "$OUT/memcheck-seam.log" 2>&1
      summary+=("seam memcheck: rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck-seam.log" | tail -1)")
      ;;
    kernels)
      "$BIN/quest_kernel_bench" --json "$OUT/kernels.json" 2>&1 | tee "$OUT/kernels.log"
      summary+=("kernel bench: $(wc -l < "$OUT/kernels.log") lines")
      ;;
    bench)
      "$BIN/quest" bench -m configs/llama2-7b.json --random-weights --backend cuda --contexts 4096,32768 \
        --budgets full,2048 --steps 64 --warmup 8 --page-size 16 --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
      summary+=("bench: see bench.log")
      ;;
    int4)
      "$BIN/quest_kernel_bench" gemv gemv4 --json "$OUT/kernels-int4.json" > "$OUT/kernels-int4.log" 2>&1
      "$BIN/quest" bench -m configs/llama2-7b.json --random-weights --backend cuda --weights fp16,int4 \
        --contexts 4096,32768 --budgets full,2048 --steps 64 --warmup 8 --page-size 16 --json "$OUT/bench-int4.json" \
        > "$OUT/bench-int4.log" 2>&1
      timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN/quest_cuda_tests" \
        --gtest_filter='CudaInt4.GemvAtOddSizes:CudaInt4.GemvAtSegmentBoundaries:CudaInt4.GemvWithManyTilesPerWarp:CudaInt4.DequantizeToHalfIsBitExact:CudaInt4.GemvInsideAGraph*:*CudaInt4Parity*/1:CudaInt4Model.AwqFixture*' \
        > "$OUT/memcheck-int4.log" 2>&1
      summary+=("int4 memcheck: rc=$? $(grep -E 'ERROR SUMMARY' "$OUT/memcheck-int4.log" | tail -1)")
      ;;
    profile)
      # where the step's time goes (eager launches with events), and what the CUDA graph saves
      "$BIN/quest" bench -m configs/llama2-7b.json --random-weights --backend cuda --contexts 4096,32768 \
        --budgets full,2048 --steps 16 --warmup 4 --page-size 16 --breakdown > "$OUT/breakdown.log" 2>&1
      "$BIN/quest" bench -m configs/llama2-7b.json --random-weights --backend cuda --contexts 4096,32768 \
        --budgets full,2048 --steps 32 --warmup 4 --page-size 16 --no-graph --json "$OUT/nograph.json" \
        > "$OUT/nograph.log" 2>&1
      summary+=("profile: breakdown.log, nograph.log")
      ;;
    hf)
      PYTHONUNBUFFERED=1 python3 tools/hf_bench.py --config configs/llama2-7b.json --contexts 4096,32768 --steps 32 \
        --json "$OUT/hf.json" > "$OUT/hf.log" 2>&1
      summary+=("transformers: rc=$? $(tr '\n' ' ' < "$OUT/hf.log" | tail -c 300)")
      ;;
    quest)
      # the Quest layer alone (fused score + top-k vs three launches) and the whole step without the fusion
      "$BIN/quest_kernel_bench" quest --json "$OUT/kernels-quest.json" > "$OUT/kernels-quest.log" 2>&1
      summary+=("quest kernel bench: rc=$?")
      "$BIN/quest" bench -m configs/llama2-7b.json --random-weights --backend cuda --contexts 4096,32768 \
        --budgets 2048 --steps 64 --warmup 8 --page-size 16 --selector quest --quest-fused --json "$OUT/bench-fused.json" \
        > "$OUT/bench-fused.log" 2>&1
      summary+=("bench --quest-fused: rc=$?")
      ;;
    eval)
      # accuracy vs budget of the trained demo model (README): full, quest and streaming, pass keys at 1K-8K
      for sel in quest streaming; do
        "$BIN/quest" eval passkey -m models/demo --backend cuda --contexts 1024,2048,4096,8192 \
          --budgets full,32,64,128,256 --samples 20 --selector $sel --json "$OUT/passkey-$sel.json" \
          > "$OUT/passkey-$sel.log" 2>&1
        summary+=("eval passkey $sel: rc=$?")
      done
      ;;
    ab)
      [ -x .device-old/quest ] || { summary+=("ab: no .device-old/quest (tools/device/stage.sh --old)"); continue; }
      IFS=';' read -ra rows <<< "${AB_ROWS:-int4 32768 2048;int4 32768 full;int4 4096 2048;fp16 32768 2048}"
      : > "$OUT/ab.txt"
      for row in "${rows[@]}"; do
        read -r w ctx budget <<< "$row"
        olds=() news=()
        for r in $(seq "${AB_ROUNDS:-2}"); do
          for side in old new; do
            bin=$BIN/quest extra="${AB_ARGS:-} ${AB_NEW_ARGS:-}"
            [ $side = old ] && { bin=$PWD/.device-old/quest; extra=${AB_ARGS:-}; }
            log="$OUT/ab-$side-$w-$ctx-$budget-$r.log"
            # shellcheck disable=SC2086
            timeout 120 "$bin" bench -m configs/llama2-7b.json --random-weights --backend cuda --weights "$w"               --contexts "$ctx" --budgets "$budget" --steps 64 --warmup 8 $extra > "$log" 2>&1
            p50=$(awk '$1 == "cuda" {print $6}' "$log" | tail -1)
            [ $side = old ] && olds+=("${p50:-fail}") || news+=("${p50:-fail}")
          done
        done
        echo "$w $ctx $budget | old ${olds[*]} | new ${news[*]} | $(ab_change "${olds[*]}" "${news[*]}")" \
          >> "$OUT/ab.txt"
      done
      summary+=("ab: $OUT/ab.txt (p50 ms per round; new args: '${AB_NEW_ARGS:-}')")
      ;;
    fixtures)
      python3 tools/check_fixtures.py tests/fixtures/hf > "$OUT/fixtures.log" 2>&1
      summary+=("fixtures re-checked with the device's transformers: rc=$? $(tail -1 "$OUT/fixtures.log")")
      ;;
  esac
done
echo
echo "==== summary ===="
for l in "${summary[@]}"; do echo "$l"; done
[ -f "$OUT/bench.log" ] && grep -E "^(backend|cuda)" "$OUT/bench.log"
[ -f "$OUT/kernels-int4.log" ] && grep -E "int4|own" "$OUT/kernels-int4.log" | head -40
[ -f "$OUT/bench-int4.log" ] && grep -E "^(backend|cuda)" "$OUT/bench-int4.log"
[ -f "$OUT/bench-fused.log" ] && { echo "fused:"; grep -E "^(backend|cuda)" "$OUT/bench-fused.log"; }
[ -f "$OUT/kernels-quest.log" ] && grep -iE "fused|layer" "$OUT/kernels-quest.log" | head -40
[ -f "$OUT/nograph.log" ] && grep -E "^(backend|cuda)" "$OUT/nograph.log"
for sel in quest streaming; do [ -f "$OUT/passkey-$sel.log" ] && { echo "passkey $sel"; grep -E '^ +[0-9]+ ' "$OUT/passkey-$sel.log"; }; done
[ -f "$OUT/breakdown.log" ] && grep -E "^  [a-z]|^context|breakdown" "$OUT/breakdown.log"
[ -f "$OUT/ab.txt" ] && { echo "A/B (weights context budget | old p50s | new p50s | change of the median):"; cat "$OUT/ab.txt"; }
true
