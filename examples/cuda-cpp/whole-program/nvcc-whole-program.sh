#!/usr/bin/env bash
# nvcc-whole-program.sh NVCC SRC.cu TOGA_DEVICE.PTX OUT [nvcc arguments...]
#
# A measurement tool, not a supported way to build (docs/cpp.md, "Speed"): builds SRC the way
# `NVCC -std=c++17 -O2 -arch=$ARCH ARGS SRC -o OUT` does (ARCH: default sm_90) (whole program, no -rdc), except that
# toga's PTX is merged into SRC's PTX before ptxas runs (merge_ptx.py), with -maxrregcount=64
# as libtoga_device.a has. It replays the steps of `nvcc -dryrun`. Pass libtoga.a and the host
# libraries in ARGS; not libtoga_device.a. ptxas's statistics (-v) go to stderr.
set -euo pipefail
[ $# -ge 4 ] || { sed -n '2,9p' "$0" >&2; exit 2; }
nvcc=$1 src=$2 toga=$3 out=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)
keep=$(mktemp -d)
trap 'rm -rf "$keep"' EXIT
name=$(basename "$src" .cu)
steps=$("$nvcc" -std=c++17 -O2 -arch="${ARCH:-sm_90}" "$@" "$src" -o "$out" -dryrun --keep --keep-dir "$keep" 2>&1 |
  sed -n 's/^#\$ //p')
grep -q '^ptxas ' <<< "$steps" || { echo "nvcc-whole-program: no ptxas step in nvcc -dryrun" >&2; exit 1; }
merged=0
while IFS= read -r step; do
  case $step in
    INCLUDES=* | SYSTEM_INCLUDES=* | LIBRARIES=*) ;; # already expanded in the steps
    [A-Z_]*=*)
      eval "$step"
      export "${step%%=*}"
      ;;
    ptxas\ *)
      python3 "$here/merge_ptx.py" "$keep/$name.ptx" "$toga" "$keep/$name.merged.ptx"
      mv "$keep/$name.merged.ptx" "$keep/$name.ptx"
      merged=1
      eval "${step/ptxas /ptxas -maxrregcount=64 -v }"
      ;;
    rm\ *) eval "${step/rm /rm -f }" ;;
    *) eval "$step" ;;
  esac
done <<< "$steps"
[ "$merged" = 1 ] || { echo "nvcc-whole-program: toga's PTX was not merged" >&2; exit 1; }
