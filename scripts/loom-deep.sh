#!/usr/bin/env bash
# The loom models at a deeper preemption bound than CI's (.ci/run runs each file at the bound
# it documents), optimized, with debug assertions on. Too slow for every CI run: run it before
# a change to the platform layer, the semaphore, the bins, the runs or the free path lands, or
# in a device session's spare time (no GPU needed). Usage:
#   scripts/loom-deep.sh [TEST...]      (default: every kernels/tests/loom_*.rs)
# DEPTH=N sets the bound (default 3). Prints each file's time; exits non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
depth=${DEPTH:-3}
tests=("$@")
[ ${#tests[@]} -gt 0 ] || for f in kernels/tests/loom_*.rs; do tests+=("$(basename "$f" .rs)"); done
# Models that loom cannot finish above bound 2 (they still run at their CI bound, .ci/run):
# - shared_refills_against_a_waiter (loom_bulk_semaphore): from bound 3 loom explores a schedule
#   in which a waiter spinning on a refill's promise and a thread joining that refill's gate
#   yield to each other forever while the refiller, preempted inside `signal`, never runs again:
#   loom's scheduler has no fairness between yielding threads (tokio-rs/loom#53), and the model
#   ends in "Model exceeded maximum number of branches". The refiller waits on nobody.
skip=()
[ "$depth" -gt 2 ] && skip=(--skip shared_refills_against_a_waiter)
export RUSTFLAGS="--cfg loom -C debug-assertions=on"
cargo test -p toga-kernels --release --no-run $(printf -- '--test %s ' "${tests[@]}") || exit 1
failed=()
for t in "${tests[@]}"; do
  s=$SECONDS
  LOOM_MAX_PREEMPTIONS=$depth cargo test -q -p toga-kernels --release --test "$t" -- "${skip[@]}" ||
    failed+=("$t")
  echo "=== $t, bound $depth: $((SECONDS - s)) s"
done
if [ ${#failed[@]} -gt 0 ]; then
  printf 'FAILED: %s\n' "${failed[@]}"
  exit 1
fi
echo "all passed at bound $depth"
