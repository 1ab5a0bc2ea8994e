#!/usr/bin/env bash
# One lease, one call (from the repository root, after scripts/bundle): every GPU test binary
# of the bundle (each bundle/tests/*_gpu, found by name, so a new one runs without an edit
# here), cli, the example, `host` stress and bench, and a scan, each under a time limit.
# Summaries on stdout, logs in $OUT/suite-logs.tar.gz. The GPU tests are #[ignore]d without
# --include-ignored, which every line here passes.
#
# Exits non-zero if any test or check failed (a non-zero exit, a time limit, a failed test, a
# sanitizer error), after writing the logs; the last lines name what failed.
# GPU_TESTS=REGEX runs only the *_gpu binaries whose name matches (to split the suite over two
# calls of at most 10 minutes); OTHERS=0 skips cli, the example, stress, bench and the scan.
# SANITIZE=1 runs compute-sanitizer (memcheck, racecheck) on the GPU tests instead.
b=${BUNDLE:-bundle}; dest=${OUT:-$b/logs}; mkdir -p "$dest"
out=$(mktemp -d); trap 'tar -czf "$dest/suite-logs.tar.gz" -C "$out" .' EXIT
export TOGA_HOST_BIN=$PWD/$b/host
failed=()
# t LIMIT NAME COMMAND...: run, print its rc; a non-zero rc or a failure line in its log
# marks NAME failed.
t() {
  local limit=$1 name=$2; shift 2
  echo "=== $name"
  timeout -s KILL "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "=== $name rc=$rc"
  if [ "$rc" != 0 ] || grep -qE "test result: FAILED|panicked at|\b[1-9][0-9]* wrong sums|ERROR SUMMARY: [1-9]|RACECHECK SUMMARY: [1-9]" "$out/$name.log"; then
    failed+=("$name (rc=$rc)")
  fi
}
# The GPU test binaries of the bundle, and each one's time limit in seconds.
gpu_tests() { for p in "$b"/tests/*_gpu; do [ -x "$p" ] && basename "$p"; done | grep -E "${GPU_TESTS:-.}"; }
limit_of() {
  case $1 in
    heap_gpu | growable_gpu | growth_stress_gpu) echo 200 ;;
    fit_gpu | platform_gpu | utilization_gpu | stray_free_gpu) echo 150 ;;
    *) echo 120 ;;
  esac
}
finish() {
  if [ ${#failed[@]} -gt 0 ]; then
    printf 'FAILED: %s\n' "${failed[@]}"
    exit 1
  fi
  echo "all passed"
  exit 0
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
[ -n "$(gpu_tests)" ] || { echo "no GPU test binary in $b/tests"; exit 1; }
if [ "${SANITIZE:-0}" = 1 ]; then
  for tool in memcheck racecheck; do
    t "${SANITIZE_LIMIT:-280}" "$tool" compute-sanitizer --tool $tool --error-exitcode 9 "$b/tests/heap_gpu" --test-threads=1 --include-ignored
    grep -hE "^test |test result|ERROR SUMMARY|RACECHECK SUMMARY" "$out/$tool.log"
  done
  # Growth while a kernel runs is invisible to memcheck (docs/growable.md): those tests skip.
  t 200 growable-memcheck compute-sanitizer --tool memcheck --error-exitcode 9 "$b/tests/growable_gpu" --test-threads=1 --include-ignored --skip in_kernel_growth
  t 60 fallback-memcheck compute-sanitizer --tool memcheck --error-exitcode 9 "$b/tests/growable_fallback_gpu" --include-ignored
  grep -hE "^test |test result|ERROR SUMMARY" "$out"/{growable,fallback}-memcheck.log
  finish
fi
for name in $(gpu_tests); do
  t "$(limit_of "$name")" "$name" "$b/tests/$name" --test-threads=1 --include-ignored
  grep -hE "^test |test result|panicked|wrong sums" "$out/$name.log"
done
if [ "${OTHERS:-1}" = 1 ]; then
  t 60 cli "$b/tests/cli" --test-threads=1 --include-ignored
  t 30 example "$b/vec-kernel-example"
  t 90 stress "$b/host" --timeout 85
  t 90 bench "$b/host" bench --timeout 85
  [ "${SCAN:-1}" = 1 ] && t 120 scan "$b/host" scan --no-exhaust --sizes 16,64,256,1024,4096,65536 --timeout 115
  grep -hE "^test |test result|panicked|wrong sums" "$out"/{cli,example}.log
  cat "$out/stress.log" "$out/bench.log"
  [ "${SCAN:-1}" = 1 ] && grep -E "^ +[0-9]+ +1048576|did not" "$out/scan.log"
fi
finish
