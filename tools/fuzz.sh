#!/bin/sh
# Builds the libFuzzer targets (clang, AddressSanitizer + UndefinedBehaviorSanitizer, CPU only) and fuzzes each for a
# fixed time from the committed seed corpus (fuzz/corpus/<target>/).
#
#   tools/fuzz.sh                      every target, 60 s each
#   tools/fuzz.sh -t 600 config        one target, 10 minutes
#   tools/fuzz.sh -j 2 -t 3600         every target, an hour each, 2 processes per target
#   tools/fuzz.sh -l                   list the targets
#
# New inputs go to BUILD/fuzz-work/<target> (kept between runs, so a later run goes on from there), crashes to
# BUILD/fuzz-artifacts/. A crash makes the script exit 1 after all targets ran: reproduce it with
# BUILD/fuzz/fuzz_<target> <artifact>, fix it, add a test to tests/test_regressions.cpp and copy the artifact to
# fuzz/corpus/<target>/regress-<what>. CI runs the same targets for QUEST_FUZZ_SECONDS (10 s) each through ctest.
set -eu
cd "$(dirname "$0")/.."
seconds=60
jobs=1
build=build-fuzz
list=0
while getopts "t:j:b:lh" opt; do
  case $opt in
    t) seconds=$OPTARG ;;
    j) jobs=$OPTARG ;;
    b) build=$OPTARG ;;
    l) list=1 ;;
    *) sed -n '2,16p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
all="safetensors model_index config quest_settings tokenizer model_folder gguf"
if [ "$list" = 1 ]; then echo "$all"; exit 0; fi
targets=${*:-$all}
for t in $targets; do
  case " $all " in *" $t "*) ;; *) echo "error: unknown fuzz target '$t' (targets: $all)" >&2; exit 2 ;; esac
done

command -v clang++ >/dev/null || { echo "error: clang++ is needed (apt-get install clang libclang-rt-14-dev)" >&2; exit 2; }
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g" \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DQUEST_CUDA=OFF -DQUEST_BUILD_TESTS=OFF \
  -DQUEST_SANITIZE=address,undefined -DQUEST_FUZZ=ON >/dev/null
# shellcheck disable=SC2086
cmake --build "$build" --target $(for t in $targets; do printf 'fuzz_%s ' "$t"; done)

mkdir -p "$build/fuzz-artifacts"
failed=""
for t in $targets; do
  case $t in
    safetensors|model_index|model_folder) dict=fuzz/dicts/safetensors.dict ;;
    config|quest_settings) dict=fuzz/dicts/config.dict ;;
    gguf) dict=fuzz/dicts/gguf.dict ;;
    *) dict="" ;;
  esac
  work="$build/fuzz-work/$t"
  log="$build/fuzz-artifacts/$t.log"
  mkdir -p "$work"
  touch "$build/fuzz-artifacts/.start-$t"  # artifacts of earlier runs do not count
  echo "== fuzz_$t: $seconds s x $jobs process(es), log $log"
  set +e
  # shellcheck disable=SC2046
  "$build/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=512 \
    -print_final_stats=1 $( [ -n "$dict" ] && echo "-dict=$dict" ) -artifact_prefix="$build/fuzz-artifacts/$t-" \
    $( [ "$jobs" -gt 1 ] && echo "-fork=$jobs -ignore_crashes=1" ) "$work" "fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  set -e
  grep -E "^stat::number_of_executed_units|^stat::peak_rss_mb|^Done|cov: .* ft: " "$log" | tail -3 | sed 's/^/   /'
  new=$(find "$build/fuzz-artifacts" -name "$t-*" -newer "$build/fuzz-artifacts/.start-$t" | head -3)
  if [ $rc -ne 0 ] || [ -n "$new" ]; then
    echo "   CRASH: $new"
    grep -E "ERROR|runtime error|invariant violated|SUMMARY" "$log" | head -5 | sed 's/^/   /'
    failed="$failed $t"
  fi
done
if [ -n "$failed" ]; then
  echo "crashes in:$failed (artifacts in $build/fuzz-artifacts/)" >&2
  exit 1
fi
echo "no crashes"
