#!/usr/bin/env bash
# One GPU session in one call (run from a bundle made by scripts/bundle, on the GPU machine):
# every GPU test, the harness, the example, a quick bench, then compute-sanitizer on the heap
# tests, each under a time limit. Summaries go to stdout; full logs to $OUT (or ./logs).
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$here/logs}
logs=$(mktemp -d)
export TOGA_HOST_BIN="$here/host"
t() { local limit=$1 name=$2; shift 2; echo "=== $name"; timeout "$limit" "$@" >"$logs/$name.log" 2>&1; echo "=== $name rc=$?"; }
t 90 platform "$here/tests/platform_gpu" --test-threads=1 --include-ignored --nocapture
t 120 heap "$here/tests/heap_gpu" --test-threads=1 --include-ignored --nocapture
t 30 cli "$here/tests/cli" --test-threads=1 --include-ignored
t 20 example "$here/vec-kernel-example"
t 45 stress "$here/host"
t 45 bench "$here/host" bench
[ "${SANITIZE:-1}" = 1 ] && t 60 memcheck compute-sanitizer --tool memcheck --error-exitcode 9 "$here/tests/heap_gpu" --test-threads=1 --include-ignored layout exactly_k zero_and
grep -hE "^test |test result|panicked|✓|✗|^ +[0-9]+ |ERROR SUMMARY|wrong sums|=== " "$logs"/*.log | head -120
cat "$logs"/*.log > "$out/all.log"
