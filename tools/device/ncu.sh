#!/bin/bash
# Nsight Compute profiles of the decode step's kernels on the GPU machine (the device tool), from the repository root,
# with .device-bin and .device-deps carried (tools/device/stage.sh first). Each target profiles a few launches of one
# kernel family inside a real `quest bench` decode step (Llama-2-7B shape, random weights, eager launches so that
# ncu can replay them) and writes the report as text to $OUT/ncu-TARGET.txt.
#
#   int4   the int4 GEMV of the decode step (4K context; qkv, o, gate+up, down of one layer)
#   fp16   the FP16 GEMV of the same step, for comparison
#   quest  page scores, top-k and sparse attention of one Quest layer at 32K, B=2048
#
# e.g. the device tool: command "bash tools/device/ncu.sh int4 quest", carry [".device-pack", ".device-deps"]
set -u
. "$(dirname "$0")/env.sh"
BIN=$(cd "$BIN" && pwd)
NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
# NCU_EXTRA adds sections, e.g. "--section SourceCounters" (stall reasons per source line; slower).
SECTIONS="${NCU_EXTRA:-} --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
--section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis"

profile() {  # name, kernel regex, launches to skip, launches to profile, bench flags...
  local name=$1 regex=$2 skip=$3 count=$4
  shift 4
  timeout 240 "$NCU" --clock-control none $SECTIONS -k "regex:$regex" --launch-skip "$skip" --launch-count "$count" \
    "$BIN/quest" bench -m configs/llama2-7b.json --random-weights --backend cuda --no-graph --steps 2 --warmup 1 \
    --page-size 16 "$@" > "$OUT/ncu-$name.txt" 2>&1
  echo "ncu $name: rc=$? $(grep -cE '^  [a-z_].*\(' "$OUT/ncu-$name.txt") kernels profiled"
}

for t in ${*:-int4 quest}; do
  case $t in
    int4) profile int4 'gemv_int4' 128 4 --weights int4 --contexts 4096 --budgets full ;;
    fp16) profile fp16 'gemv_(vec|scalar)' 128 4 --weights fp16 --contexts 4096 --budgets full ;;
    quest) profile quest 'page_scores|top_k|sparse_attention' 90 6 --weights fp16 --contexts 32768 --budgets 2048 ;;
    *) echo "unknown target $t (int4 fp16 quest)"; exit 2 ;;
  esac
done
