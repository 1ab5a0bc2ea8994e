#!/usr/bin/env bash
# Criterion benches once per PTX in bundle/ptx (same bench binaries, TOGA_PTX_FILE), in
# alternated rounds, on the GPU machine (from the repository root, after scripts/bundle).
# BENCHES="warm_launch utilization" picks them (default: those two); ROUNDS (default 1);
# LIMIT seconds per run (default 120). TOGA_BENCH_UTIL_HEAPS=8MiB,64MiB limits the utilization
# bench's heaps. CSVs and logs to $OUT/ab-benches.tar.gz, one folder per PTX and round; the
# summary lines (criterion's medians, utilization per round) on stdout.
. scripts/variants.inc
b=${BUNDLE:-bundle}; out=${OUT:-$b/logs}; mkdir -p "$out"
work=$(mktemp -d)
for r in $(seq 1 "${ROUNDS:-1}"); do
  for p in $(variants "$b"); do
    v=$(variant "$p"); d=$work/$v-$r; mkdir -p "$d"
    for name in ${BENCHES:-warm_launch utilization}; do
      s=$SECONDS
      TOGA_PTX_FILE=$PWD/$p TOGA_BENCH_CSV_DIR=$d timeout -s KILL "${LIMIT:-120}" \
        "$b/benches/$name" --bench --noplot >"$d/$name.log" 2>&1
      echo "=== $v round $r $name rc=$? $((SECONDS - s)) s"
      grep -hE "time: |u_utilization .*utilization per round" "$d/$name.log" | cut -c1-160
    done
  done
done
tar -czf "$out/ab-benches.tar.gz" -C "$work" .
