#!/usr/bin/env bash
# The criterion suite on the GPU machine (from the repository root, after scripts/bundle):
# every bench binary in the bundle, CSVs into $OUT/results.tar.gz (copy them to docs/results/
# and run `cargo run -p report`). BENCHES="malloc_only free_only" picks some.
b=${BUNDLE:-bundle}; out=${OUT:-$b/logs}; mkdir -p "$out"
csv=$(mktemp -d); logs=$(mktemp -d); export TOGA_BENCH_CSV_DIR=$csv
for name in ${BENCHES:-malloc_only free_only malloc_free mixed scaling fill}; do
  echo "=== $name"; start=$SECONDS
  timeout -s KILL "${LIMIT:-200}" "$b/benches/$name" --bench --noplot >"$logs/bench-$name.log" 2>&1
  echo "=== $name rc=$? ($((SECONDS - start)) s)"
done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$csv/gpu.txt"
tar -czf "$out/results.tar.gz" -C "$csv" .
tar -czf "$out/bench-logs.tar.gz" -C "$logs" .
