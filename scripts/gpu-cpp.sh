#!/usr/bin/env bash
# On a GPU machine with CUDA 13 and no Rust: build the C++ examples and tests against
# bundle-cpp/ (made here with scripts/bundle-cpp) and run them: the C API test, the example,
# the 2^20-thread mixed-size pattern test, the benchmark, and compute-sanitizer memcheck on
# the example (--small). Logs go to $OUT (default ./logs-cpp); a summary to stdout and
# $OUT/summary.txt. Exits non-zero if anything failed.
# Environment: NVCC (default /usr/local/cuda/bin/nvcc), ARCH (default: the GPU's, via
# nvidia-smi), BUNDLE (default bundle-cpp), RUST_BUNDLE (default bundle): if it holds the Rust
# harness (`host`), its `host bench` runs too, for the comparison in one run.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-logs-cpp}
bundle=${BUNDLE:-bundle-cpp}
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
sanitizer=${SANITIZER:-$(dirname "$nvcc")/compute-sanitizer}
mkdir -p "$out"
bin=$(mktemp -d)
failed=0
summary() { echo "$*" | tee -a "$out/summary.txt"; }
: > "$out/summary.txt"

if [ -z "${ARCH:-}" ]; then
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  ARCH=sm_${cc:-90}
fi
summary "gpu-cpp: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1); $ARCH; $("$nvcc" --version | tail -1)"
[ -f "$bundle/BUILD-INFO" ] && summary "bundle: $(tr '\n' ' ' < "$bundle/BUILD-INFO")"

inc=(-I"$bundle/include")
libs=("$bundle/lib/libtoga_device.a" "$bundle/lib/libtoga.a" -ldl -lpthread -lm -lrt)
for p in example stress bench; do
  if "$nvcc" -std=c++17 -O2 -arch="$ARCH" -rdc=true "${inc[@]}" "examples/cuda-cpp/$p.cu" "${libs[@]}" \
      -o "$bin/$p" -Xnvlink -v > "$out/build-$p.log" 2>&1; then
    # Every kernel of the program, registers per thread (nvlink counts the callees too).
    worst=$(grep -A1 "Function properties for" "$out/build-$p.log" | grep -o "used [0-9]* registers" | awk '{print $2}' | sort -n | tail -1)
    if [ "${worst:-999}" -le 64 ]; then summary "build $p: ok, at most $worst registers per thread"
    else summary "build $p: FAILED: a kernel uses $worst registers (> 64)"; failed=1; fi
  else
    summary "build $p: FAILED (see build-$p.log)"; failed=1
  fi
done
cc=${CC:-cc}
if $cc -std=c11 -O2 -Wall "${inc[@]}" examples/cuda-cpp/capi_test.c "$bundle/lib/libtoga.a" -ldl -lpthread -lm -lrt \
    -o "$bin/capi_test" > "$out/build-capi_test.log" 2>&1 &&
   $cc -std=c11 -O2 "${inc[@]}" examples/cuda-cpp/capi_test.c -L"$bundle/lib" -ltoga -Wl,-rpath,"$PWD/$bundle/lib" \
    -o "$bin/capi_test_shared" >> "$out/build-capi_test.log" 2>&1; then
  summary "build capi_test (static and shared libtoga): ok"
else
  summary "build capi_test: FAILED (see build-capi_test.log)"; failed=1
fi

run() { # NAME SECONDS COMMAND...: run with a time limit, log to $out/NAME.log, summarize
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  local last
  last=$(grep -v '^\s*$' "$out/$name.log" | tail -1)
  if [ $rc -eq 0 ]; then summary "$name: ok ($((SECONDS - t0)) s): $last"
  else summary "$name: FAILED (exit $rc, $((SECONDS - t0)) s): $last"; failed=1; fi
}
[ -x "$bin/capi_test" ] && run capi_test 120 "$bin/capi_test" --gpu
[ -x "$bin/capi_test_shared" ] && run capi_test_shared 120 "$bin/capi_test_shared" --gpu
[ -x "$bin/example" ] && run example 300 "$bin/example"
[ -x "$bin/stress" ] && run stress 300 "$bin/stress"
[ -x "$bin/bench" ] && run bench 300 "$bin/bench"
[ -f "$out/bench.log" ] && cat "$out/bench.log"
if [ -x "$bin/example" ]; then
  run memcheck-example 600 "$sanitizer" --tool memcheck --error-exitcode 9 "$bin/example" --small
  grep -h "ERROR SUMMARY" "$out/memcheck-example.log" | tee -a "$out/summary.txt"
fi
rust=${RUST_BUNDLE:-bundle}
if [ -x "$rust/host" ]; then
  (cd "$rust" && timeout 300 ./host bench) > "$out/rust-host-bench.log" 2>&1 &&
    summary "rust host bench: ok (rust-host-bench.log)" || summary "rust host bench: did not finish"
  cat "$out/rust-host-bench.log"
fi
rm -rf "$bin"
summary "gpu-cpp: $([ $failed = 0 ] && echo all passed || echo FAILURES)"
exit $failed
