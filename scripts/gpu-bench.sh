#!/usr/bin/env bash
# The criterion suite on the GPU machine (from the repository root, after scripts/bundle):
# every bench binary in the bundle, CSVs into $OUT/results.tar.gz (copy them to docs/results/
# and run `cargo run -p report -- --out docs/benchmarks.md`). BENCHES="malloc_only free_only"
# picks some.
# Each bench gets at most LIMIT seconds (default 120) and the whole suite TOTAL seconds (default
# 450, under the 8 minutes a lease allows): a bench that would start with less than MIN_LEFT
# seconds of TOTAL left is skipped and says so. TOGA_BENCH_CUDA_CHURN=1 also times CUDA's malloc
# once in the churn bench (tens of seconds more). The utilization bench (last: it fills heaps up
# to 1 GiB until malloc returns null, five rounds per cell) writes a row per round, so a bench
# cut off by LIMIT keeps the rows it wrote; TOGA_BENCH_UTIL_HEAPS=8MiB,64MiB runs only those heaps.
# The growth bench (growable heaps against a fixed one, and the cost of one growth; under a
# minute) runs just before it.
b=${BUNDLE:-bundle}; out=${OUT:-$b/logs}; mkdir -p "$out"
csv=$(mktemp -d); logs=$(mktemp -d); export TOGA_BENCH_CSV_DIR=$csv
limit=${LIMIT:-120}; total=${TOTAL:-450}; min_left=${MIN_LEFT:-15}; suite_start=$SECONDS
for name in ${BENCHES:-malloc_only free_only malloc_free mixed churn warm_launch scaling fill large growth utilization}; do
  left=$((total - (SECONDS - suite_start)))
  if [ "$left" -lt "$min_left" ]; then
    echo "=== $name skipped: ${left} s of TOTAL=${total} s left"; continue
  fi
  echo "=== $name"; start=$SECONDS
  timeout -s KILL "$((left < limit ? left : limit))" "$b/benches/$name" --bench --noplot >"$logs/bench-$name.log" 2>&1
  echo "=== $name rc=$? ($((SECONDS - start)) s)"
done
echo "=== suite $((SECONDS - suite_start)) s"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$csv/gpu.txt"
tar -czf "$out/results.tar.gz" -C "$csv" .
tar -czf "$out/bench-logs.tar.gz" -C "$logs" .
