#!/usr/bin/env bash
# One call for a build's last lease (from the repository root, after scripts/bundle and
# bundle/ptx/*.ptx): `host bench` for every PTX in bundle/ptx (ROUNDS alternated rounds, same
# host binary through TOGA_PTX_FILE), then the GPU tests, the example and `host` stress on the
# bundle's own PTX, then compute-sanitizer memcheck and racecheck on the allocator's busiest
# heap_gpu tests and on a small `host` run. Logs to $OUT/v/, a summary on stdout.
# PLATFORM=1 adds platform_gpu (litmus tests of the atomics, about 100 s). AB=0, TESTS=0 and
# SANITIZE=0 skip a part (to split the work over two calls of at most 10 minutes).
# Exits non-zero if any run failed (a non-zero exit, a time limit, a failed test, a sanitizer
# error), after writing the logs; the last lines name what failed.
. scripts/variants.inc
b=${BUNDLE:-bundle}; L=${OUT:-$b/logs}/v; mkdir -p "$L"
san=${SANITIZER:-/usr/local/cuda/bin/compute-sanitizer}
export TOGA_HOST_BIN=$PWD/$b/host
failed=()
t() { # name limit command...: run, then print rc, seconds and the test summaries; a non-zero
  # rc (a time limit included) or a failure line in the log marks the run failed
  local n=$1 s=$SECONDS; shift
  timeout -s KILL "$@" >"$L/$n.log" 2>&1
  local rc=$?
  echo "=== $n rc=$rc $((SECONDS - s)) s"
  grep -hE "^test .*(FAIL|panicked)|test result|ERROR SUMMARY|RACECHECK SUMMARY|wrong sums" "$L/$n.log"
  if [ "$rc" != 0 ] || grep -qE "test result: FAILED|panicked at|\b[1-9][0-9]* wrong sums|ERROR SUMMARY: [1-9]|RACECHECK SUMMARY: [1-9]" "$L/$n.log"; then
    failed+=("$n (rc=$rc)")
  fi
}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$L/gpu.txt"
[ "${AB:-1}" = 1 ] && for r in $(seq 1 "${ROUNDS:-2}"); do
  for p in $(variants "$b"); do
    v=$(variant "$p")
    t "ab-$v-$r" 90 env TOGA_PTX_FILE="$p" "$b/host" bench --timeout 85
  done
done
[ "${AB:-1}" = 1 ] && for p in $(variants "$b"); do
  v=$(variant "$p"); echo "##### $v (size, fresh, warm, free, ... per round)"
  grep -hE "^ +[0-9]+ " "$L"/ab-"$v"-*.log
done
tests=$b/tests
# The harness build as a cubin (scripts/cubins): the tests, `host` and the sanitizer runs skip
# the driver's compilation of its PTX. toga's own PTX (the library's) is still compiled there.
[ -e "$b/toga_kernels.cubin" ] && export TOGA_PTX_FILE=$PWD/$b/toga_kernels.cubin
if [ "${TESTS:-1}" = 1 ]; then
# Every GPU test binary of the bundle (tests/*_gpu), found by name; platform_gpu only with
# PLATFORM=1; GPU_TESTS=REGEX keeps those whose name matches.
for p in "$tests"/*_gpu; do
  n=$(basename "$p")
  [ -x "$p" ] && [[ $n =~ ${GPU_TESTS:-.} ]] || continue
  [ "$n" = platform_gpu ] && [ "${PLATFORM:-0}" != 1 ] && continue
  case $n in heap_gpu | growable_gpu | growth_stress_gpu) lim=200 ;; *) lim=150 ;; esac
  t "${n%_gpu}" "$lim" "$p" --test-threads=1 --include-ignored
done
t cli 60 "$tests/cli" --test-threads=1 --include-ignored
t example 30 "$b/vec-kernel-example"
t stress 90 "$b/host" --timeout 85
grep -E "✓|✗|rows|exit" "$L/stress.log" | tail -4
fi
if [ "${SANITIZE:-1}" = 1 ]; then
heap_tests="double_and_foreign_frees_are_counted_and_harmless mixed_sizes_8b_to_64k_across_streams_and_back_to_empty one_sm_frees_more_slots_than_a_24_bit_count_holds vec_grows_in_every_thread lone_lanes_small_blocks_come_from_runs_and_go_back"
for k in $heap_tests; do
  t "memcheck-$k" "${SANITIZE_LIMIT:-120}" "$san" --tool memcheck --error-exitcode 9 "$tests/heap_gpu" --test-threads=1 --include-ignored --exact "$k"
done
for k in double_and_foreign_frees_are_counted_and_harmless mixed_sizes_8b_to_64k_across_streams_and_back_to_empty lone_lanes_small_blocks_come_from_runs_and_go_back; do
  t "racecheck-$k" "${SANITIZE_LIMIT:-120}" "$san" --tool racecheck --error-exitcode 9 "$tests/heap_gpu" --test-threads=1 --include-ignored --exact "$k"
done
# The home refills (INV(UA16)): a mixed fill of an 8 MiB heap goes through them.
t memcheck-home "${SANITIZE_LIMIT:-120}" "$san" --tool memcheck --error-exitcode 9 "$tests/utilization_gpu" --include-ignored --exact mixed_16b_to_4k_in_8mib
t racecheck-home "${SANITIZE_LIMIT:-120}" "$san" --tool racecheck --error-exitcode 9 "$tests/utilization_gpu" --include-ignored --exact mixed_16b_to_4k_in_8mib
t memcheck-host 120 "$san" --tool memcheck --error-exitcode 9 "$b/host" --threads 4096 --heap-size 64MiB --host-growth --timeout 110
fi
tar -czf "${OUT:-$b/logs}/verify-logs.tar.gz" -C "$L" .
if [ ${#failed[@]} -gt 0 ]; then
  printf 'FAILED: %s\n' "${failed[@]}"
  exit 1
fi
echo "all passed"
