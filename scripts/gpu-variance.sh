#!/usr/bin/env bash
# The variance record (docs/benchmarks.md's v_variance table), on the GPU machine from the
# repository root after scripts/bundle: N fresh processes (default 10) of `host bench`, one after
# another, each appending its cell medians to one CSV (`--csv`, `--run-index` 0 to N-1) and its
# output to its own log. CSV, logs and gpu.txt go into $OUT/variance.tar.gz (default
# bundle/logs). Then unpack v_variance.csv into docs/results/, `gzip -9 -n` it
# (docs/results/v_variance.csv.gz) and run `cargo run -p report -- --out docs/benchmarks.md`.
# HOST names the binary (default $TOGA_HOST_BIN, else bundle/host); ARGS adds flags to every run,
# e.g. ARGS="--threads 262144 --timeout 120". A run that fails stops the record: the tarball
# still holds what was written and that run's log, and the script exits with the run's status.
set -euo pipefail
host=${HOST:-${TOGA_HOST_BIN:-bundle/host}}; n=${N:-10}; out=${OUT:-bundle/logs}; mkdir -p "$out"
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT; mkdir "$dir/logs"
csv=$dir/v_variance.csv; rc=0; start=$SECONDS
for ((i = 0; i < n; i++)); do
  echo "=== run $i"; t=$SECONDS
  # shellcheck disable=SC2086 # ARGS is a list of flags
  "$host" bench --csv "$csv" --run-index "$i" ${ARGS:-} >"$dir/logs/run-$i.log" 2>&1 || rc=$?
  echo "=== run $i rc=$rc ($((SECONDS - t)) s)"
  [ "$rc" -eq 0 ] || { tail -n 5 "$dir/logs/run-$i.log"; break; }
done
echo "=== $n runs asked, $((SECONDS - start)) s"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$dir/gpu.txt" 2>&1 || true
tar -czf "$out/variance.tar.gz" -C "$dir" .
exit "$rc"
