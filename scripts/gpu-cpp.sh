#!/usr/bin/env bash
# On a GPU machine with CUDA 13 and no Rust: build the C++ examples and tests against
# bundle-cpp/ (made here with scripts/bundle-cpp) and run them: the C API test, quickstart, the
# example, the 2^20-thread mixed-size pattern test, compute-sanitizer memcheck on the example
# (--small --no-grow), and the speed comparison: the C++ `bench` and the Rust path's `host
# bench` (plus the Rust mixed-size bench, benches/mixed) back to back, ROUNDS times,
# alternating. The comparison
# table (C++ against Rust, malloc and free, per size) goes to $OUT/compare.md and stdout.
# With WHOLE_PROGRAM=1 (the default) the table also has the same bench.cu built as one whole
# program with toga's PTX (examples/cuda-cpp/whole-program: a measurement, not a way to
# build), which shows what the separate-compilation ABI of libtoga_device.a costs.
#
# $OUT (default ./logs-cpp) gets summary.txt, compare.md and logs.tar.gz (every log and the
# raw bench outputs). Exits non-zero if anything failed: a build, a test, a kernel above 64
# registers, a bench that found a null or did not finish, a number missing from the table, or
# (STRICT_SPEED=1) a C++ time more than 5% above the Rust one.
#
# Environment:
#   NVCC         default /usr/local/cuda/bin/nvcc
#   ARCH         default: the GPU's, via nvidia-smi (sm_90 on an H100/H200)
#   BUNDLE       the C++ bundle, default bundle-cpp
#   RUST_BUNDLE  the Rust side: `host`, and benches/mixed for the mixed row (optional; the row
#                then says "not run"). Default: $BUNDLE/rust if it has them (TOGA_RUST_BENCH=1
#                scripts/bundle-cpp), else bundle (scripts/bundle)
#   COMPARE      1 (default): the Rust `host` is required; 0: the C++ bench alone
#   ROUNDS       rounds of (C++ bench, Rust bench), default 3; each cell is the median of the
#                rounds' medians
#   THREADS      threads of both benches, default 2^20
#   STRICT_SPEED 1: fail when a C++ time is more than 5% above the Rust one
#   MEMCHECK     0: skip compute-sanitizer (default 1)
#   WHOLE_PROGRAM 0: no whole-program build of bench (it needs python3)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${OUT:-logs-cpp}
bundle=${BUNDLE:-bundle-cpp}
rust=${RUST_BUNDLE:-}
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
sanitizer=${SANITIZER:-$(dirname "$nvcc")/compute-sanitizer}
rounds=${ROUNDS:-3}
threads=${THREADS:-1048576}
compare=${COMPARE:-1}
mkdir -p "$out"
out=$(cd "$out" && pwd)
case $bundle in /*) ;; *) bundle=$root/$bundle ;; esac
if [ -z "$rust" ]; then
  if [ -x "$bundle/rust/host" ]; then rust=$bundle/rust; else rust=$root/bundle; fi
fi
case $rust in /*) ;; *) rust=$root/$rust ;; esac
bin=$(mktemp -d)
logs=$(mktemp -d)
trap 'rm -rf "$bin" "$logs"' EXIT
failed=0
summary() { echo "$*" | tee -a "$out/summary.txt"; }
fail() { summary "FAILED: $*"; failed=1; }
: > "$out/summary.txt"
rm -f "$out/compare.md" "$out/logs.tar.gz"

[ -x "$nvcc" ] || { fail "no nvcc at $nvcc (set NVCC)"; exit 1; }
[ -f "$bundle/lib/libtoga_device.a" ] || { fail "no C++ bundle at $bundle (scripts/bundle-cpp)"; exit 1; }
if [ "$compare" = 1 ] && [ ! -x "$rust/host" ]; then
  fail "no Rust host at $rust/host (RUST_BUNDLE; COMPARE=0 runs the C++ bench alone)"; exit 1
fi

if [ -z "${ARCH:-}" ]; then
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .')
  ARCH=sm_${cc:-90}
fi
summary "gpu-cpp: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1); $ARCH; $("$nvcc" --version | tail -1)"
[ -f "$bundle/BUILD-INFO" ] && summary "bundle: $(tr '\n' ' ' < "$bundle/BUILD-INFO")"

inc=(-I"$bundle/include")
libs=("$bundle/lib/libtoga_device.a" "$bundle/lib/libtoga.a" -ldl -lpthread -lm -lrt)
for p in quickstart example stress bench; do
  if "$nvcc" -std=c++17 -O2 -arch="$ARCH" -rdc=true "${inc[@]}" "examples/cuda-cpp/$p.cu" "${libs[@]}" \
      -o "$bin/$p" -Xnvlink -v > "$logs/build-$p.log" 2>&1; then
    # Every kernel of the program, registers per thread (nvlink counts the callees too).
    worst=$(grep -A1 "Function properties for" "$logs/build-$p.log" | grep -o "used [0-9]* registers" | awk '{print $2}' | sort -n | tail -1)
    if [ "${worst:-999}" -le 64 ]; then summary "build $p: ok, at most $worst registers per thread"
    else fail "build $p: a kernel uses ${worst:-an unknown number of} registers (> 64)"; fi
  else
    fail "build $p (build-$p.log):"; tail -20 "$logs/build-$p.log"
  fi
done
whole=${WHOLE_PROGRAM:-1}
if [ "$whole" = 1 ]; then
  if ARCH=$ARCH examples/cuda-cpp/whole-program/nvcc-whole-program.sh "$nvcc" examples/cuda-cpp/bench.cu \
      "$bundle/lib/toga_device.ptx" "$bin/bench_wp" "${inc[@]}" "$bundle/lib/libtoga.a" -ldl -lpthread -lm -lrt \
      > "$logs/build-bench_wp.log" 2>&1; then
    worst=$(grep -o "Used [0-9]* registers" "$logs/build-bench_wp.log" | awk '{print $2}' | sort -n | tail -1)
    if [ "${worst:-999}" -le 64 ]; then summary "build bench_wp (whole program): ok, at most $worst registers per thread"
    else fail "build bench_wp: a kernel uses ${worst:-an unknown number of} registers (> 64)"; fi
  else
    fail "build bench_wp (build-bench_wp.log):"; tail -20 "$logs/build-bench_wp.log"
  fi
fi
cc=${CC:-cc}
if $cc -std=c11 -O2 -Wall "${inc[@]}" examples/cuda-cpp/capi_test.c "$bundle/lib/libtoga.a" -ldl -lpthread -lm -lrt \
    -o "$bin/capi_test" > "$logs/build-capi_test.log" 2>&1 &&
   $cc -std=c11 -O2 "${inc[@]}" examples/cuda-cpp/capi_test.c -L"$bundle/lib" -ltoga -Wl,-rpath,"$bundle/lib" \
    -o "$bin/capi_test_shared" >> "$logs/build-capi_test.log" 2>&1; then
  summary "build capi_test (static and shared libtoga): ok"
else
  fail "build capi_test (build-capi_test.log)"
fi

run() { # NAME SECONDS COMMAND...: run with a time limit, log to $logs/NAME.log, summarize
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  local last
  last=$(grep -v '^\s*$' "$logs/$name.log" | tail -1)
  if [ $rc -eq 0 ]; then summary "$name: ok ($((SECONDS - t0)) s): $last"
  else fail "$name (exit $rc, $((SECONDS - t0)) s): $last"; fi
  return $rc
}
[ -x "$bin/capi_test" ] && run capi_test 120 "$bin/capi_test" --gpu
[ -x "$bin/capi_test_shared" ] && run capi_test_shared 120 "$bin/capi_test_shared" --gpu
[ -x "$bin/quickstart" ] && run quickstart 120 "$bin/quickstart"
[ -x "$bin/example" ] && run example 300 "$bin/example"
[ -x "$bin/stress" ] && run stress 300 "$bin/stress"

# The speed comparison: C++ bench and Rust host bench back to back, ROUNDS times.
if [ -x "$bin/bench" ]; then
  for r in $(seq 1 "$rounds"); do
    run "bench-cpp-$r" 300 "$bin/bench" "$threads" && cat "$logs/bench-cpp-$r.log"
    if [ -x "$bin/bench_wp" ]; then
      run "bench-wp-$r" 300 "$bin/bench_wp" "$threads" && grep "^row" "$logs/bench-wp-$r.log"
    fi
    if [ "$compare" = 1 ]; then
      # host bench reads nothing from the working directory; run it from the bundle.
      run "bench-rust-$r" 300 bash -c 'cd "$1" && ./host bench --threads "$2"' _ "$rust" "$threads" &&
        cat "$logs/bench-rust-$r.log"
      if [ -x "$rust/benches/mixed" ]; then
        # Criterion, the toga cells only; its CSV rows (first 10 runs of each cell) are read below.
        rm -rf "$logs/mixed-csv-$r"
        run "bench-rust-mixed-$r" 300 env TOGA_BENCH_CSV_DIR="$logs/mixed-csv-$r" \
          bash -c 'cd "$1" && ./benches/mixed --bench --noplot "toga/fresh"' _ "$rust"
      fi
    fi
  done
fi

# The table. Per round: C++ "row SIZE MALLOC FREE NULLS" lines; Rust host bench's table rows
# (size, toga fresh ms, toga warm ms, toga free ms, ...); the mixed CSV's toga rows.
compare_table() {
  local r rows=$logs/rows.txt
  : > "$rows"
  for r in $(seq 1 "$rounds"); do
    [ -f "$logs/bench-cpp-$r.log" ] &&
      awk '$1 == "row" { print "cpp", $2, $3, $4 }' "$logs/bench-cpp-$r.log" >> "$rows"
    [ -f "$logs/bench-wp-$r.log" ] &&
      awk '$1 == "row" { print "wp", $2, $3, $4 }' "$logs/bench-wp-$r.log" >> "$rows"
    # Only host bench's first table (--threads threads: size, toga fresh ms, toga warm ms, toga
    # free ms, ...): the one after it has toga's fresh cells at CUDA malloc's thread count.
    [ -f "$logs/bench-rust-$r.log" ] &&
      awk '/toga fresh ms/ && /toga free ms/ { t = 1; next } t && NF == 0 { exit }
           t && $1 ~ /^(16|64|256|1024|4096)$/ && $2 ~ /^[0-9.]+$/ && $4 ~ /^[0-9.]+$/ { print "rust", $1, $2, $4 }' \
        "$logs/bench-rust-$r.log" >> "$rows"
    if [ -f "$logs/mixed-csv-$r/c_mixed.csv" ]; then
      # scenario,allocator,size,threads,state,metric,iteration,ms,...: median per metric.
      for metric in malloc free; do
        awk -F, -v m="$metric" '$2 == "toga" && $6 == m { print $8 }' "$logs/mixed-csv-$r/c_mixed.csv" |
          sort -g | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'
      done | paste -sd' ' | awk 'NF == 2 { print "rust", "16-4096", $1, $2 }' >> "$rows"
    fi
  done
  awk -v strict="${STRICT_SPEED:-0}" -v compare="$compare" '
    function median(list,   n, a, i, j, t) {
      n = split(list, a, " ")
      for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] + 0 > a[j] + 0; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
      return n ? a[int((n + 1) / 2)] : ""
    }
    { key = $1 SUBSEP $2; m[key] = m[key] " " $3; f[key] = f[key] " " $4; n[key]++
      if ($1 == "cpp" && !($2 in seen)) { seen[$2] = 1; order[++sizes] = $2 } }
    END {
      bad = 0; over = 0
      print "| size | C++ malloc ms | Rust malloc ms | C++ / Rust | whole-program malloc ms | w-p / Rust | C++ free ms | Rust free ms | C++ / Rust | whole-program free ms | w-p / Rust |"
      print "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
      if (sizes == 0) { print "no C++ bench rows"; bad = 1 }
      for (i = 1; i <= sizes; i++) {
        s = order[i]; c = "cpp" SUBSEP s; r = "rust" SUBSEP s; w = "wp" SUBSEP s
        cm = median(m[c]); cf = median(f[c])
        wm = (w in n) ? sprintf("%.4f", median(m[w])) : "-"; wf = (w in n) ? sprintf("%.4f", median(f[w])) : "-"
        if (!(r in n)) {
          # Every fixed size must have a Rust row; the mixed one needs benches/mixed.
          if (compare == 1 && s != "16-4096") bad = 1
          printf "| %s | %.4f | not run | - | %s | - | %.4f | not run | - | %s | - |\n", s, cm, wm, cf, wf
          continue
        }
        rm = median(m[r]); rf = median(f[r]); compared++
        qm = rm > 0 ? cm / rm : 99; qf = rf > 0 ? cf / rf : 99
        wqm = (w in n && rm > 0) ? sprintf("%.3f", wm / rm) : "-"; wqf = (w in n && rf > 0) ? sprintf("%.3f", wf / rf) : "-"
        if (qm > 1.05 || qf > 1.05) over = 1
        if (qm > worst_m) worst_m = qm
        if (qf > worst_f) worst_f = qf
        printf "| %s | %.4f | %.4f | %.3f%s | %s | %s | %.4f | %.4f | %.3f%s | %s | %s |\n", s, cm, rm, qm, (qm > 1.05 ? " (>5%)" : ""), wm, wqm, cf, rf, qf, (qf > 1.05 ? " (>5%)" : ""), wf, wqf
      }
      if (compared == 0)
        printf "\nmedian of %d round(s) of the C++ bench'"'"'s median; worst C++ / Rust: not compared (no Rust rows)\n", \
          n["cpp" SUBSEP order[1]]
      else
        printf "\nmedian of %d round(s) of each bench'"'"'s median; worst C++ / Rust: malloc %.3f, free %.3f; %s\n", \
          n["cpp" SUBSEP order[1]], worst_m, worst_f, (over ? "NOT within 5%" : "within 5%")
      if (bad) print "compare: FAILED: numbers missing"
      exit bad ? 2 : (over && strict == 1) ? 3 : 0
    }' "$rows"
}
if [ -x "$bin/bench" ]; then
  {
    echo "# C++ bench against Rust host bench ($threads threads, $ARCH, $(date -u +%Y-%m-%dT%H:%MZ))"
    echo
    compare_table
  } > "$out/compare.md"
  cat "$out/compare.md"
  if grep -q "compare: FAILED" "$out/compare.md"; then fail "compare: a number is missing (compare.md)"
  elif [ "${STRICT_SPEED:-0}" = 1 ] && grep -q "NOT within 5%" "$out/compare.md"; then fail "compare: C++ more than 5% slower"
  else summary "compare: $(grep -o 'worst C++.*' "$out/compare.md")"; fi
fi

if [ -x "$bin/example" ] && [ "${MEMCHECK:-1}" = 1 ]; then
  # --no-grow: memcheck does not see granules mapped while a kernel runs, and reports the
  # in-kernel growth's first writes to them (docs/cpp.md); mapped whole, the heap does not grow.
  run memcheck-example 600 "$sanitizer" --tool memcheck --error-exitcode 9 "$bin/example" --small --no-grow
  grep -h "ERROR SUMMARY" "$logs/memcheck-example.log" | tee -a "$out/summary.txt"
fi
tar -czf "$out/logs.tar.gz" -C "$logs" .
rm -rf "$bin" "$logs"
summary "gpu-cpp: $([ $failed = 0 ] && echo all passed || echo FAILURES)"
exit $failed
