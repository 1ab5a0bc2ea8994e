#!/usr/bin/env bash
# One lease, one call (from the repository root, after scripts/bundle): `host bench` for each
# PTX build in bundle/ptx/ (same host binary, TOGA_PTX_FILE) and for an older bundle in
# bundle/old/ if present (its own host and PTX), then ncu (`--set full`) on toga_malloc and
# toga_free at 16 B and 4 KB. Logs and ncu reports go to $OUT.
. scripts/variants.inc
b=${BUNDLE:-bundle}; out=${OUT:-$b/logs}; mkdir -p "$out"
ncu=${NCU:-/usr/local/cuda/bin/ncu}
for p in $(variants "$b"); do
  v=$(variant "$p"); echo "=== bench $v"
  TOGA_PTX_FILE=$p timeout -s KILL 100 "$b/host" bench --timeout 95 >"$out/bench-$v.log" 2>&1; echo "rc=$?"
  grep -E "^ +[0-9]+ " "$out/bench-$v.log"
done
if [ -x "$b/old/host" ]; then
  echo "=== bench old"
  TOGA_PTX_FILE=$b/old/toga_kernels.ptx timeout -s KILL 100 "$b/old/host" bench --timeout 95 >"$out/bench-old.log" 2>&1; echo "rc=$?"
  grep -E "^ +[0-9]+ " "$out/bench-old.log"
fi
# host bench launches, per size, 12 toga_malloc and 12 toga_free kernels (fresh and warm cells,
# each a warm-up and five timed runs); size 4096 is the fifth size.
prof() { # name kernel skip host ptx
  timeout -s KILL 150 env TOGA_PTX_FILE="$5" "$ncu" --set full -k "regex:^$2\$" --launch-skip "$3" -c 1 \
    -o "$out/ncu-$1" "$4" bench --timeout 140 >"$out/ncu-$1.log" 2>&1
  echo "ncu $1 rc=$?"
  "$ncu" --import "$out/ncu-$1.ncu-rep" --page details --csv >"$out/ncu-$1.csv" 2>/dev/null
  "$ncu" --import "$out/ncu-$1.ncu-rep" --page details 2>/dev/null | grep -E "Registers Per Thread|Achieved Occupancy|Duration|Theoretical Occupancy|No Eligible|Issued Ipc|Warp Cycles Per Issued" | head -12
}
[ "${PROFILE:-1}" = 1 ] || exit 0
for k in toga_malloc toga_free; do
  prof "new-$k-16" $k 1 "$b/host" "$b/toga_kernels.ptx"
  prof "new-$k-4096" $k 49 "$b/host" "$b/toga_kernels.ptx"
  [ -x "$b/old/host" ] && prof "old-$k-16" $k 1 "$b/old/host" "$b/old/toga_kernels.ptx"
done
