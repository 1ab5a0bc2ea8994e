#!/usr/bin/env bash
# One lease, one call (from the repository root, after scripts/bundle): ncu (`--set full`) on
# toga_malloc and toga_free of `host bench` at 16 B and 4 KB, with the per-instruction (SASS)
# source page exported as CSV, so the hot instructions and their stall reasons can be read on a
# machine without a GPU. Reports and CSVs go to $OUT. CMD="bundle/benches/large --bench f_large"
# profiles another program's launches instead (KERNELS picks them as below).
b=${BUNDLE:-bundle}; out=${OUT:-$b/logs}; mkdir -p "$out"
ncu=${NCU:-/usr/local/cuda/bin/ncu}
ptx=${PTX:-$b/toga_kernels.ptx}
# host bench launches, per size, 18 toga_malloc and 18 toga_free kernels: the fresh cell 6 (a
# warm-up and five runs), the warm cell 12 (each run mallocs and frees once untimed on a fresh
# heap, then again timed). Size i's launches start at 18*i: +1 is a timed fresh one, +9 a timed
# warm malloc, +1 a free after a fresh malloc. Sizes: 16, 64, 256, 1024, 4096 (i = 0..4).
prof() { # name kernel skip
  timeout -s KILL 150 env TOGA_PTX_FILE="$ptx" "$ncu" --set full -k "regex:^$2\$" --launch-skip "$3" -c 1 \
    -o "$out/ncu-$1" ${CMD:-"$b/host" bench --timeout 140} >"$out/ncu-$1.log" 2>&1
  echo "ncu $1 rc=$?"
  "$ncu" --import "$out/ncu-$1.ncu-rep" --page details --csv >"$out/ncu-$1.csv" 2>/dev/null
  "$ncu" --import "$out/ncu-$1.ncu-rep" --page source --csv --print-source sass >"$out/sass-$1.csv" 2>"$out/sass-$1.err"
  # The summary comes back; the SASS CSV only with KEEP_SASS=1 (a lease returns few files).
  python3 "$(dirname "$0")/ncu-hotspots.py" "$out/sass-$1.csv" 24 >"$out/hot-$1.txt" 2>&1
  [ "${KEEP_SASS:-0}" = 1 ] || rm -f "$out/sass-$1.csv" "$out/sass-$1.err"
  "$ncu" --import "$out/ncu-$1.ncu-rep" --page details 2>/dev/null | grep -E "Registers Per Thread|Achieved Occupancy|Duration|No Eligible|Warp Cycles Per Issued" | head -8
  rm -f "$out/ncu-$1.ncu-rep"
}
for spec in ${KERNELS:-toga_malloc:1:16 toga_free:1:16}; do
  IFS=: read -r k skip tag <<<"$spec"
  prof "$k-$tag" "$k" "$skip"
done
cat "$out"/hot-*.txt 2>/dev/null | grep -E "stall samples|by reason|by opcode"
