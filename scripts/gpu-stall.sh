#!/usr/bin/env bash
# The 64 MiB 256 B utilization cell, several runs per PTX build, to tell whether a build stalls
# (from the repository root, after scripts/bundle, bundle/ptx/*.ptx and, where it can,
# scripts/cubins). A build without a cubin first runs one process that only pays the JIT (a
# process killed inside it caches nothing, so later runs would pay it again); then RUNS runs
# of the cell, alternating builds, each killed after LIMIT s.
# TOGA_BENCH_UTIL_TRACE prints each round's fill and check-and-free, so a stalled run shows
# which kernel it stopped in. Logs to $OUT/stall/, a summary on stdout.
. scripts/variants.inc
b=${BUNDLE:-bundle}; L=${OUT:-$b/logs}/stall; mkdir -p "$L"
export TOGA_BENCH_UTIL_HEAPS=${HEAPS:-64MiB} TOGA_BENCH_UTIL_SIZES=${SIZES:-256} TOGA_BENCH_UTIL_TRACE=1
for p in $(variants "$b"); do
  v=$(variant "$p"); s=$SECONDS
  [ "${p##*.}" = cubin ] && continue # nothing to compile
  # An 8 MiB heap's cells finish in a second or two once the PTX is loaded.
  TOGA_PTX_FILE=$p TOGA_BENCH_UTIL_HEAPS=8MiB timeout -s KILL "${JIT_LIMIT:-240}" \
    "$b/benches/utilization" --bench >"$L/jit-$v.log" 2>&1
  echo "=== $v JIT run rc=$? $((SECONDS - s)) s"
done
for r in $(seq 1 "${RUNS:-4}"); do
  for p in $(variants "$b"); do
    v=$(variant "$p"); s=$SECONDS
    TOGA_PTX_FILE=$p timeout -s KILL "${LIMIT:-30}" "$b/benches/utilization" --bench >"$L/$v-$r.log" 2>&1
    rc=$?
    echo "=== $v run $r rc=$rc $((SECONDS - s)) s; last line: $(tail -1 "$L/$v-$r.log" | cut -c1-120)"
  done
done
