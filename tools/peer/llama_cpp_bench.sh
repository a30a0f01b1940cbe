#!/bin/bash
# The peer a user would pick for batch-1 decode on one GPU, llama.cpp's CUDA build (the llama.cpp that
# llama-cpp-python LCP_VERSION vendors), measured in the same GPU call as `quest bench`: Llama-2-7B shape
# (configs/llama2-7b.json), random weights, F16 and Q4_0 (llama-quantize's own mix: output.weight Q6_K), flash
# attention on, every layer on the GPU, 64 generated tokens after a context of 4096 and 32768 (llama-bench -d), against
# quest's fp16 / int4 rows at the same contexts, full attention and Quest B=2048.
#
#   tools/peer/llama_cpp_bench.sh stage        here (PyPI): llama-cpp-python's sdist -> .peer/llama.cpp.txz (the
#                                              sources the two tools need, ~1.8 MB xz) and .peer/whl (gguf-py's
#                                              import-time deps the GPU machine may lack: PyYAML, tqdm)
#   tools/peer/llama_cpp_bench.sh run QUEST    there (the device tool, one call, ~7-8 min): unpack, build llama-bench
#                                              and llama-quantize (CUDA, sm_90) while the F16 GGUF is written, quantize
#                                              to Q4_0, llama-bench, then `QUEST bench`, then the table
#   tools/peer/llama_cpp_bench.sh run-build    the first half alone (unpack, build, GGUF, Q4_0 into PEER_WORK)
#   tools/peer/llama_cpp_bench.sh run-bench QUEST   the second half (the two benches and the table), for a second
#                                              call on the same machine (files under /tmp survive only while it is held)
#   tools/peer/llama_cpp_bench.sh table        the table again from $OUT/llama-bench.json and $OUT/quest.json
#
# e.g. the device tool: command
#   "bash tools/peer/llama_cpp_bench.sh run .device-bin/quest"   (tools/device/env.sh is sourced for quest alone)
#   carry [".device-pack", ".device-deps", ".peer"]
# Environment: OUT (default /tmp/peer-out), PEER_WORK (/tmp/peer: sources, build, GGUFs; the GGUFs are deleted at the
# end unless KEEP_GGUF=1), LLAMA_REPS (llama-bench repetitions, default 5), JOBS (16), DEADLINE (seconds from the
# start after which no further phase is begun, default 570), GGUF_ARGS (extra flags for write_random_gguf.py, e.g. a
# tiny shape for a dry run: "--layers 2 --hidden 64 --intermediate 128 --heads 4 --vocab 512").
set -u
QUEST_ARG=${2:-}
case $QUEST_ARG in /* | '') ;; *) QUEST_ARG=$PWD/$QUEST_ARG ;; esac
cd "$(dirname "$0")/../.." || exit 2
LCP_VERSION=0.3.36   # llama-cpp-python; its vendor/llama.cpp is what gets built
PYYAML_VERSION=6.0.3
TQDM_VERSION=4.67.1
PEER=$PWD/.peer
PEER_WORK=${PEER_WORK:-/tmp/peer}
OUT=${OUT:-/tmp/peer-out}
JOBS=${JOBS:-16}
DEADLINE=${DEADLINE:-570}
LLAMA_REPS=${LLAMA_REPS:-5}
CONTEXTS=${CONTEXTS:-4096,32768}
START=$SECONDS

ts() { echo "[$(date +%T) +$((SECONDS - START))s] $*"; }
left() { echo $((DEADLINE - (SECONDS - START))); }
die() { ts "error: $*"; exit 1; }

stage() {
  set -e
  local src dst
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT   # tmp is global: the trap runs after stage() returns
  python3 -m pip download --no-deps --no-binary :all: "llama-cpp-python==$LCP_VERSION" -d "$tmp" > "$tmp/pip.log" 2>&1 ||
    { cat "$tmp/pip.log"; exit 1; }
  tar xzf "$tmp/llama_cpp_python-$LCP_VERSION.tar.gz" -C "$tmp"
  src=$tmp/llama_cpp_python-$LCP_VERSION/vendor/llama.cpp
  dst=$tmp/pack/llama.cpp
  mkdir -p "$dst/ggml/src" "$dst/tools" "$dst/vendor"
  cp -a "$src"/{CMakeLists.txt,LICENSE,cmake,include,src,common,gguf-py} "$dst/"
  cp -a "$src"/ggml/{CMakeLists.txt,cmake,include} "$dst/ggml/"
  # ggml's core and the two backends built (CPU: always; CUDA); ggml_add_backend() enters only enabled backends' folders
  find "$src/ggml/src" -maxdepth 1 -type f -exec cp -a {} "$dst/ggml/src/" \;
  cp -a "$src"/ggml/src/{ggml-cpu,ggml-cuda} "$dst/ggml/src/"
  cp -a "$src"/tools/{llama-bench,quantize} "$dst/tools/"
  rm -f "$dst"/tools/*/README.md "$dst"/tools/quantize/tests.sh
  # common needs nlohmann, sheredom (header-only) and cpp-httplib (linked, HTTPS off); hash, stb, miniaudio are mtmd's
  cp -a "$src"/vendor/{nlohmann,sheredom,cpp-httplib} "$dst/vendor/"
  cat > "$dst/vendor/CMakeLists.txt" <<'CM'
# trimmed by tools/peer/llama_cpp_bench.sh: only what common (llama-bench, llama-quantize) needs
add_subdirectory(nlohmann)
add_subdirectory(sheredom)
if (LLAMA_BUILD_COMMON)
    add_subdirectory(cpp-httplib)
endif()
CM
  cat > "$dst/tools/CMakeLists.txt" <<'CM'
# trimmed by tools/peer/llama_cpp_bench.sh: the two tools the peer measurement needs
find_package(Threads REQUIRED)
llama_add_compile_flags()
add_subdirectory(llama-bench)
add_subdirectory(quantize)
CM
  rm -rf "$dst/gguf-py/tests" "$dst/gguf-py/examples" "$dst/gguf-py/gguf/scripts/gguf_editor_gui.py"
  find "$dst" -name '__pycache__' -prune -exec rm -rf {} +
  {
    echo "llama-cpp-python $LCP_VERSION (sdist from PyPI), vendor/llama.cpp"
    grep -m3 -E 'set\(GGML_VERSION_(MAJOR|MINOR|PATCH)' "$src/ggml/CMakeLists.txt" | tr -s ' ' || true
    grep -m1 -E '^version' "$src/gguf-py/pyproject.toml" | sed 's/^/gguf-py /' || true
  } > "$dst/PEER_VERSION"
  mkdir -p "$PEER"
  rm -rf "$PEER/whl"
  tar cf - -C "$tmp/pack" llama.cpp | xz -T2 -9 > "$PEER/llama.cpp.txz"
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$PEER/whl" "PyYAML==$PYYAML_VERSION" > "$tmp/pip-whl.log" 2>&1 || { cat "$tmp/pip-whl.log"; exit 1; }
  python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d "$PEER/whl" "tqdm==$TQDM_VERSION" \
    >> "$tmp/pip-whl.log" 2>&1 || { cat "$tmp/pip-whl.log"; exit 1; }
  cat "$dst/PEER_VERSION"
  du -b "$PEER/llama.cpp.txz" "$PEER"/whl/*.whl
  echo "unpacked: $(du -sh "$dst" | cut -f1); .peer in all: $(( $(du -sb "$PEER" | cut -f1) / 1024 )) KiB"
}

# gguf-py by path; PyYAML / tqdm from .peer/whl only where the machine's python3 lacks them (a wheel is a zip)
python_env() {
  mkdir -p "$PEER_WORK/py"
  local mod whl
  for mod in yaml:PyYAML tqdm:tqdm; do
    python3 -c "import ${mod%%:*}" 2> /dev/null && continue
    for whl in "$PEER"/whl/"${mod#*:}"-*.whl; do
      [ -f "$whl" ] && python3 -m zipfile -e "$whl" "$PEER_WORK/py" && ts "python: ${mod%%:*} from $(basename "$whl")"
    done
  done
  export PYTHONPATH=$PEER_WORK/llama.cpp/gguf-py:$PEER_WORK/py${PYTHONPATH:+:$PYTHONPATH}
}

run_build() {
  mkdir -p "$OUT" "$PEER_WORK"
  [ -f "$PEER/llama.cpp.txz" ] || die "no .peer/llama.cpp.txz: run 'tools/peer/llama_cpp_bench.sh stage' here and carry .peer"
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv,noheader 2> /dev/null |
    tee "$OUT/gpu.txt"
  ts "unpack"
  rm -rf "$PEER_WORK/llama.cpp"
  xz -dc "$PEER/llama.cpp.txz" | tar xf - -C "$PEER_WORK" || die "unpack"
  cat "$PEER_WORK/llama.cpp/PEER_VERSION"
  cp "$PEER_WORK/llama.cpp/PEER_VERSION" "$OUT/"
  export PATH=$PATH:/usr/local/cuda/bin
  ts "configure + build llama-bench llama-quantize (-j$JOBS) in the background; $OUT/llama-build.log"
  (
    cmake -S "$PEER_WORK/llama.cpp" -B "$PEER_WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc \
      -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_TESTS=OFF \
      -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF \
      -DGGML_CUDA_NCCL=OFF -DGGML_CCACHE=OFF -DLLAMA_BUILD_NUMBER=0 -DLLAMA_BUILD_COMMIT="lcp-$LCP_VERSION" &&
      cmake --build "$PEER_WORK/build" -j "$JOBS" --target llama-bench llama-quantize
  ) > "$OUT/llama-build.log" 2>&1 &
  local build_pid=$!
  python_env
  ts "write the random F16 GGUF ($PEER_WORK/llama2-7b-f16.gguf)"
  # shellcheck disable=SC2086
  python3 tools/peer/write_random_gguf.py --config configs/llama2-7b.json --out "$PEER_WORK/llama2-7b-f16.gguf" \
    ${GGUF_ARGS:-} 2>&1 | tee "$OUT/gguf.log"
  local gguf_rc=${PIPESTATUS[0]}
  ts "GGUF written: rc=$gguf_rc; waiting for the build"
  wait "$build_pid"
  local build_rc=$?
  ts "build: rc=$build_rc ($(grep -cE '^\[[0-9]+/' "$OUT/llama-build.log") ninja steps)"
  if [ "$build_rc" != 0 ]; then
    grep -E 'error|Error|CMake Warning' "$OUT/llama-build.log" | head -30
    tail -20 "$OUT/llama-build.log"
    die "llama.cpp build failed"
  fi
  [ "$gguf_rc" = 0 ] || die "the GGUF writer failed"
  ts "llama-quantize Q4_0 ($JOBS threads)"
  "$PEER_WORK/build/bin/llama-quantize" "$PEER_WORK/llama2-7b-f16.gguf" "$PEER_WORK/llama2-7b-q4_0.gguf" Q4_0 "$JOBS" \
    > "$OUT/quantize.log" 2>&1 || { tail -20 "$OUT/quantize.log"; die "llama-quantize failed"; }
  grep -E 'model size|quant size' "$OUT/quantize.log"
  ls -l "$PEER_WORK"/*.gguf
  ts "build phase done"
}

run_bench() {
  local quest=${1:-}
  mkdir -p "$OUT"
  local bench=$PEER_WORK/build/bin/llama-bench
  [ -x "$bench" ] || die "no $bench: run the build phase first (on this same machine)"
  local t
  t=$(left)
  if [ "$t" -lt 90 ]; then
    ts "llama-bench skipped: $t s left before DEADLINE (run 'run-bench' in a second call on the same machine)"
  else
    ts "llama-bench F16, Q4_0: -fa 1 -ngl 99 -p 0 -n 64 -d $CONTEXTS -r $LLAMA_REPS (timeout $((t - 60)) s)"
    timeout $((t - 60)) "$bench" -m "$PEER_WORK/llama2-7b-f16.gguf,$PEER_WORK/llama2-7b-q4_0.gguf" -fa 1 -ngl 99 \
      -p 0 -n 64 -d "$CONTEXTS" -r "$LLAMA_REPS" -o json --progress > "$OUT/llama-bench.json" 2> "$OUT/llama-bench.log"
    ts "llama-bench: rc=$?"
    grep -iE 'error|CUDA0|ggml_cuda_init|Device 0' "$OUT/llama-bench.log" | head -8
  fi
  if [ -z "$quest" ]; then
    ts "no quest binary given: quest rows skipped"
  else
    t=$(left)
    ts "quest bench fp16,int4 x $CONTEXTS x full,2048 (timeout $((t > 30 ? t : 30)) s)"
    # the quest binary's runtime libraries (.device-deps) only for this process: not for gcc, cmake and python above
    (
      # shellcheck disable=SC1091
      [ -f tools/device/env.sh ] && . tools/device/env.sh
      exec timeout $((t > 30 ? t : 30)) "$quest" bench -m configs/llama2-7b.json --random-weights --backend cuda \
      --weights fp16,int4 --contexts "$CONTEXTS" --budgets full,2048 --steps 64 --warmup 8 --page-size 16 \
      --json "$OUT/quest.json"
    ) > "$OUT/quest.log" 2>&1
    ts "quest bench: rc=$?"
    grep -E '^(backend|cuda)' "$OUT/quest.log"
  fi
  [ "${KEEP_GGUF:-0}" = 1 ] || rm -f "$PEER_WORK"/*.gguf
  table
}

table() {
  python3 - "$OUT/llama-bench.json" "$OUT/quest.json" <<'PY'
import json, os, sys

def load(path):
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        print(f"({path}: {e})")
        return []
    for tail in ("", "\n]"):  # llama-bench stopped by the timeout leaves the array open
        try:
            return json.loads(text + tail)
        except ValueError:
            pass
    print(f"({path}: not JSON)")
    return []

llama, quest = load(sys.argv[1]), load(sys.argv[2])
lc = {}  # (context, 'f16' | 'q4_0') -> (ms/token from the mean t/s, stddev ms, reps)
for r in llama:
    if r.get("n_gen", 0) <= 0 or r.get("n_prompt", 0) != 0:
        continue
    name = os.path.basename(r.get("model_filename", "")).lower()
    kind = "q4_0" if "q4_0" in name else "f16"
    n = r["n_gen"]  # mean time of the n_gen tokens (llama_synchronize after each), per token
    lc[(r["n_depth"], kind)] = (r["avg_ns"] / 1e6 / n, r.get("stddev_ns", 0) / 1e6 / n, len(r.get("samples_ns", [])),
                                r.get("model_size", 0))
qs = {}  # (context, 'fp16' | 'int4', 'full' | 2048) -> p50 ms
for r in quest:
    qs[(r["context"], r["weights"].split("-")[0], r["budget"])] = r["p50"]  # "int4-g128" is the int4 class
contexts = sorted({c for c, _ in lc} | {c for c, _, _ in qs})
f = lambda v: "n/a" if v is None else f"{v:.2f}"
def ratio(a, b):
    return "n/a" if a is None or b is None else f"{a / b:.2f}x"
print()
print("ms/token at batch 1 (llama.cpp: mean time per token of tg64 after the context, flash attention, every layer on the")
print("GPU; quest: p50 of 64 steps); ratio = llama.cpp / quest, same weights class (F16 ~ fp16, Q4_0 ~ int4 g128)")
print("| context | llama.cpp F16 | quest fp16 full | quest fp16 B=2048 | F16 / full | F16 / B=2048 "
      "| llama.cpp Q4_0 | quest int4 full | quest int4 B=2048 | Q4_0 / full | Q4_0 / B=2048 |")
print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
for c in contexts:
    l16 = lc.get((c, "f16"), (None,))[0]
    l4 = lc.get((c, "q4_0"), (None,))[0]
    q16f, q16b = qs.get((c, "fp16", "full")), qs.get((c, "fp16", 2048))
    q4f, q4b = qs.get((c, "int4", "full")), qs.get((c, "int4", 2048))
    print(f"| {c:,} | {f(l16)} | {f(q16f)} | {f(q16b)} | {ratio(l16, q16f)} | {ratio(l16, q16b)} "
          f"| {f(l4)} | {f(q4f)} | {f(q4b)} | {ratio(l4, q4f)} | {ratio(l4, q4b)} |")
for (c, k), (ms, sd, n, size) in sorted(lc.items()):
    print(f"llama.cpp {k} @ {c}: {ms:.3f} ms/token +- {sd:.3f} over {n} reps, model {size / 1e9:.2f} GB")
PY
}

case ${1:-} in
  stage) stage ;;
  run) run_build && run_bench "$QUEST_ARG" ;;
  run-build) run_build ;;
  run-bench) run_bench "$QUEST_ARG" ;;
  table) table ;;
  *) sed -n '2,27p' "$0"; exit 2 ;;
esac
