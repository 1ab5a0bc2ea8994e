#!/usr/bin/env bash
# Compare PTX builds of kernels/ (bundle/ptx/*.ptx) on one GPU: host scan per variant.
out=${OUT:-/tmp/out}; mkdir -p $out
. scripts/variants.inc
for p in $(variants bundle); do
  v=$(variant "$p"); echo "##### $v"
  TOGA_PTX_FILE=$p timeout -s KILL 120 bundle/host scan --no-exhaust --sizes ${SIZES:-16,4096,65536} --threads ${THREADS:-262144} --timeout 115 2>&1 | tee $out/scan-$v.log | grep -v "^ *size\|heap per row"
done
