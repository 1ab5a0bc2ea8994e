#!/usr/bin/env bash
# Runs inside a bundle made by scripts/bundle, on a machine with an NVIDIA GPU and driver.
#   ./run.sh tests      every GPU test binary (single-threaded, so tests do not share the GPU;
#                       --include-ignored, since GPU tests are ignored by default)
#   ./run.sh sanitize   the same under compute-sanitizer memcheck and racecheck
#   ./run.sh host [ARGS] the stress harness
#   ./run.sh bench [ARGS] every criterion bench binary
#   ./run.sh example    the example user kernel crate (examples/vec-kernel)
#   ./run.sh all        host, example, tests, sanitize
# Logs go to $LOGS (default: ./logs).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export TOGA_HOST_BIN="$here/host"
logs=${LOGS:-$here/logs}
mkdir -p "$logs"
status=0

run_tests() { # $1: prefix command (may be empty), $2: log suffix, $3...: extra test args
  local prefix=$1 suffix=$2; shift 2
  for t in "$here"/tests/*; do
    name=$(basename "$t")
    echo "== $name $suffix"
    if ! $prefix "$t" --test-threads=1 --include-ignored --nocapture "$@" 2>&1 | tee "$logs/$name$suffix.log"; then status=1; fi
  done
}

case "${1:-all}" in
  tests) run_tests "" "" ;;
  sanitize)
    # memcheck reports every access to memory that a growable heap mapped while the kernel
    # ran as out of bounds (docs/growable.md); those tests run everywhere else.
    run_tests "compute-sanitizer --tool memcheck --error-exitcode 9" ".memcheck" --skip in_kernel_growth
    # Under racecheck the host's mappings slow down past the 1 s a kernel waits for growth.
    run_tests "compute-sanitizer --tool racecheck --error-exitcode 9" ".racecheck" --skip in_kernel_growth ;;
  host) shift; "$here/host" "$@" 2>&1 | tee "$logs/host.log"; status=${PIPESTATUS[0]} ;;
  bench) shift
    for b in "$here"/benches/*; do
      "$b" --bench "$@" 2>&1 | tee "$logs/$(basename "$b").log" || status=1
    done ;;
  example) "$here/vec-kernel-example" 2>&1 | tee "$logs/example.log"; status=${PIPESTATUS[0]} ;;
  all) "$0" host; status=$?; "$0" example || status=1; "$0" tests || status=1; "$0" sanitize || status=1 ;;
  *) echo "usage: $0 [tests|sanitize|host|bench|all]"; exit 2 ;;
esac
exit $status
