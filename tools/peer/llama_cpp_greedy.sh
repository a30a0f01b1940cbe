#!/bin/bash
# Greedy text of `quest generate --temp 0` against llama.cpp's CPU build on the same GGUF (SmolLM2-135M-Instruct
# Q4_1 by default), 64 tokens, the prompts of tools/peer/llama_cpp_divergence.py (plain continuation, no chat
# template; one prompt is ChatML written out as text, special tokens parsed by both), with transformers (fp32) as the
# referee where they part. Prints per prompt the common prefix in tokens (the table of docs/measurements.md, section
# "SmolLM2 against transformers and llama.cpp").
#
#   tools/peer/llama_cpp_greedy.sh [QUEST_BINARY [MODEL.gguf]]     default build/quest, models/smollm2/...Q4_1.gguf
#
# llama.cpp: the llama.cpp that llama-cpp-python LCP_VERSION vendors (its PyPI sdist, fetched with pip when
# LLAMA_WORK/src is absent), built once in LLAMA_WORK (default /work/scratch/llamacpp, outside the repository) for the
# CPU only, AVX2 without -march=native (a native build emits AMX instructions that die with SIGILL on the development
# machines), nice'd: llama-simple (its greedy example, whose text is checked against the ids) and llama-quest-greedy
# (tools/peer/llama_greedy.cpp: the same loop printing ids and the top two logits, and writing the logits), run on the
# GGUF and on an F32 copy of its weights written by llama-quantize (the second table: no activation quantization).
# Environment: LLAMA_WORK, THREADS (2: llama.cpp's threads; quest's CPU backend uses its own), N (64),
# OUT (default /tmp/llama_cpp_greedy), PY (a python with torch, transformers, gguf and accelerate, which transformers
# needs to read a GGUF: default /work/venv-torch/bin/python; PYTHONPATH is passed on).
set -eu
cd "$(dirname "$0")/../.."
ROOT=$PWD
QUEST=${1:-build/quest}
MODEL=${2:-models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
LCP_VERSION=0.3.36
LLAMA_WORK=${LLAMA_WORK:-/work/scratch/llamacpp}
THREADS=${THREADS:-2}
N=${N:-64}
OUT=${OUT:-/tmp/llama_cpp_greedy}
PY=${PY:-/work/venv-torch/bin/python}
[ -x "$QUEST" ] || { echo "error: $QUEST: not an executable (build quest first)"; exit 2; }
[ -s "$MODEL" ] || { echo "error: $MODEL: absent (tools/fetch_smollm2.sh)"; exit 2; }

if [ ! -d "$LLAMA_WORK/src" ]; then
  tmp=$(mktemp -d)
  python3 -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$LCP_VERSION" -d "$tmp"
  tar xzf "$tmp/llama_cpp_python-$LCP_VERSION.tar.gz" -C "$tmp"
  mkdir -p "$LLAMA_WORK"
  cp -a "$tmp/llama_cpp_python-$LCP_VERSION/vendor/llama.cpp" "$LLAMA_WORK/src"
  cp "$tmp/llama_cpp_python-$LCP_VERSION/CHANGELOG.md" "$LLAMA_WORK/src/LLAMA_CPP_PYTHON_CHANGELOG.md"
  rm -rf "$tmp" "$LLAMA_WORK/src/.git"
fi
SRC=$LLAMA_WORK/src
mkdir -p "$SRC/examples/quest-greedy"
cp "$ROOT/tools/peer/llama_greedy.cpp" "$SRC/examples/quest-greedy/llama_greedy.cpp"
cat > "$SRC/examples/quest-greedy/CMakeLists.txt" <<'CM'
add_executable(llama-quest-greedy llama_greedy.cpp)
target_link_libraries(llama-quest-greedy PRIVATE llama ${CMAKE_THREAD_LIBS_INIT})
target_compile_features(llama-quest-greedy PRIVATE cxx_std_17)
CM
grep -q quest-greedy "$SRC/examples/CMakeLists.txt" || echo 'add_subdirectory(quest-greedy)' >> "$SRC/examples/CMakeLists.txt"
if [ ! -f "$LLAMA_WORK/build/CMakeCache.txt" ]; then
  nice -n 19 cmake -S "$SRC" -B "$LLAMA_WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
    -DGGML_AVX2=ON -DGGML_CUDA=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF > "$LLAMA_WORK/configure.log"
fi
nice -n 19 cmake --build "$LLAMA_WORK/build" --target llama-simple llama-quest-greedy llama-quantize -j "$(nproc)" > "$LLAMA_WORK/build.log"
BIN=$LLAMA_WORK/build/bin
# The version: the commit llama-cpp-python's changelog names for this release (the sdist has no git history, so
# llama.cpp's own build number reads 0), and ggml's version from its CMakeLists.
commit=$(sed -n "/^## \[$LCP_VERSION\]/,/^## \[/p" "$SRC/LLAMA_CPP_PYTHON_CHANGELOG.md" 2>/dev/null |
         grep -o 'llama.cpp@[0-9a-f]*' | head -1)
ggml=$(sed -n 's/^set(GGML_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)).*/\2/p' "$SRC/ggml/CMakeLists.txt" | paste -sd.)
echo "llama.cpp: llama-cpp-python $LCP_VERSION sdist, ${commit:-commit unknown}, ggml $ggml; CPU build" \
  "(-DGGML_NATIVE=OFF -DGGML_AVX2=ON), $THREADS threads; quest: $("$QUEST" --version 2>/dev/null || echo "$QUEST")," \
  "at $(git rev-parse --short HEAD 2>/dev/null), CPU backend, full attention; model $MODEL; $N tokens, greedy"

# The same weights in F32 (llama-quantize --allow-requantize --pure F32: Q4_1 / Q8_0 dequantized exactly): llama.cpp's
# F32 matrices take F32 activations, so the second run shows what the Q8_1 activations of the first one cost.
F32_MODEL=$LLAMA_WORK/$(basename "$MODEL" .gguf).F32.gguf
[ -s "$F32_MODEL" ] || nice "$BIN/llama-quantize" --allow-requantize --pure "$MODEL" "$F32_MODEL" F32 "$THREADS" \
  > "$LLAMA_WORK/quantize.log" 2>&1

rm -rf "$OUT" && mkdir -p "$OUT/q" "$OUT/f32"
count=$("$PY" tools/peer/llama_cpp_divergence.py prompts "$OUT/q")
for ((i = 0; i < count; ++i)); do
  cp "$OUT/q/prompt_$i.txt" "$OUT/f32/"
  prompt=$(cat "$OUT/q/prompt_$i.txt"; echo x); prompt=${prompt%x}   # keeps a trailing newline
  nice "$BIN/llama-simple" -m "$MODEL" -n "$N" "$prompt" > "$OUT/q/simple_$i.txt" 2> "$OUT/q/simple_$i.log"
  for run in q f32; do
    m=$MODEL; [ $run = f32 ] && m=$F32_MODEL
    nice "$BIN/llama-quest-greedy" -m "$m" -n "$N" -t "$THREADS" --logits "$OUT/$run/llama_$i.f32" "$prompt" \
      > "$OUT/$run/llama_$i.jsonl" 2> "$OUT/$run/llama_$i.log"
  done
  nice "$QUEST" generate -m "$MODEL" -p "$prompt" -n "$N" --temp 0 --full-attention --json "$OUT/q/quest_$i.json" \
    > /dev/null 2> "$OUT/q/quest_$i.log"
  cp "$OUT/q/quest_$i.json" "$OUT/f32/"
done
# llama-quest-greedy's ids are llama-simple's text (it prints the prompt, then the pieces, then a newline)
"$PY" - "$OUT/q" "$MODEL" "$count" <<'PY'
import json, pathlib, sys
from gguf import GGUFReader
d, model, count = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
f = GGUFReader(model).fields["tokenizer.ggml.tokens"]
pieces = [bytes(f.parts[i]) for i in f.data]
# GPT-2's byte-to-unicode table, inverted
bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
byte_dec = {chr(c): b for b, c in zip(bs, cs)}
def text(ids):
    return b"".join(bytes(byte_dec[ch] for ch in pieces[t].decode()) for t in ids)
for i in range(count):
    lines = [json.loads(x) for x in (d / f"llama_{i}.jsonl").read_text().splitlines()]
    ids = lines[0]["prompt_ids"] + [x["id"] for x in lines[1:] if not x["eog"]]
    if text(ids) + b"\n" != (d / f"simple_{i}.txt").read_bytes():
        sys.exit(f"error: prompt {i}: llama-quest-greedy's ids are not llama-simple's text")
print(f"llama-simple's text = llama-quest-greedy's ids for all {count} prompts")
PY
echo; echo "== llama.cpp on $MODEL (Q4_1 / Q8_0 weights: Q8_1 activations in their dot products)"
"$PY" tools/peer/llama_cpp_divergence.py compare "$OUT/q" "$MODEL"
echo; echo "== llama.cpp on $F32_MODEL (the same weights in F32: F32 activations)"
"$PY" tools/peer/llama_cpp_divergence.py compare "$OUT/f32" "$MODEL"
