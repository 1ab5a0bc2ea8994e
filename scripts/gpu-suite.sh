#!/usr/bin/env bash
# One lease, one call (from the repository root, after scripts/bundle): the GPU tests, the
# harness, the example and a scan, each under a time limit. Summaries on stdout, logs in $OUT.
# The GPU tests are #[ignore]d without --include-ignored, which every line here passes.
# Logs go to $OUT/suite-logs.tar.gz. SANITIZE=1 runs compute-sanitizer (memcheck, racecheck) on the GPU tests instead.
b=${BUNDLE:-bundle}; dest=${OUT:-$b/logs}; mkdir -p "$dest"
out=$(mktemp -d); trap 'tar -czf "$dest/suite-logs.tar.gz" -C "$out" .' EXIT
export TOGA_HOST_BIN=$PWD/$b/host
t() { local limit=$1 name=$2; shift 2; echo "=== $name"; timeout -s KILL "$limit" "$@" >"$out/$name.log" 2>&1; echo "=== $name rc=$?"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
if [ "${SANITIZE:-0}" = 1 ]; then
  for tool in memcheck racecheck; do
    t "${SANITIZE_LIMIT:-280}" "$tool" compute-sanitizer --tool $tool --error-exitcode 9 "$b/tests/heap_gpu" --test-threads=1 --include-ignored
    grep -hE "^test |test result|ERROR SUMMARY|RACECHECK SUMMARY" "$out/$tool.log"
  done
  # Growth while a kernel runs is invisible to memcheck (docs/growable.md): those tests skip.
  t 200 growable-memcheck compute-sanitizer --tool memcheck --error-exitcode 9 "$b/tests/growable_gpu" --test-threads=1 --include-ignored --skip in_kernel_growth
  t 60 fallback-memcheck compute-sanitizer --tool memcheck --error-exitcode 9 "$b/tests/growable_fallback_gpu" --include-ignored
  grep -hE "^test |test result|ERROR SUMMARY" "$out"/{growable,fallback}-memcheck.log
  exit 0
fi
t 120 platform "$b/tests/platform_gpu" --test-threads=1 --include-ignored
t 200 heap "$b/tests/heap_gpu" --test-threads=1 --include-ignored
t 200 fit "$b/tests/fit_gpu" --test-threads=1 --include-ignored
t 60 cli "$b/tests/cli" --test-threads=1 --include-ignored
t 120 growable "$b/tests/growable_gpu" --test-threads=1 --include-ignored
t 30 fallback "$b/tests/growable_fallback_gpu" --include-ignored
t 30 example "$b/vec-kernel-example"
t 90 stress "$b/host" --timeout 85
t 90 bench "$b/host" bench --timeout 85
[ "${SCAN:-1}" = 1 ] && t 120 scan "$b/host" scan --no-exhaust --sizes 16,64,256,1024,4096,65536 --timeout 115
grep -hE "^test |test result|panicked|wrong sums" "$out"/{platform,heap,fit,cli,growable,fallback,example}.log
cat "$out/stress.log" "$out/bench.log"; grep -E "^ +[0-9]+ +1048576|did not" "$out/scan.log"
