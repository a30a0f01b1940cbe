#!/bin/sh
# After ctest: why the skipped tests skipped, one line per reason with its count. ctest prints "***Skipped" without
# the reason (and --output-on-failure shows no skipped test's output), but it keeps every test's output in
# Testing/Temporary/LastTest.log, where each GTEST_SKIP message (the tests' convention: "SKIPPED: <reason>") is.
# Usage: tools/ctest_skips.sh [build dir]   (prints nothing when nothing skipped; always exits 0)
dir=${1:-build}
log="$dir/Testing/Temporary/LastTest.log"
[ -f "$log" ] || exit 0
total=$(grep -c '^\[  SKIPPED \] [A-Za-z_0-9/]*\.[A-Za-z_0-9/]* (' "$log" || true)
[ "${total:-0}" -gt 0 ] || exit 0
echo "ctest ($dir): $total tests skipped:"
grep -h '^SKIPPED: ' "$log" | sort | uniq -c | sort -rn | sed 's/^ *\([0-9]*\) SKIPPED: /  \1 x /'
noreason=$(( total - $(grep -c '^SKIPPED: ' "$log" || true) ))
[ "$noreason" -le 0 ] || echo "  $noreason x (no SKIPPED: message; see $log)"
exit 0
