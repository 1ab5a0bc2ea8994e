#!/usr/bin/env bash
# CI for toga from C and CUDA C++, on a machine without a GPU (called from .ci/run): with
# NVIDIA's nvcc and CUDA runtime from PyPI (CUDA 13.0, pinned, in a virtual environment of
# its own), build the C++ bundle, compile and link the example, the stress test, the
# benchmark and the C API test with the plain nvcc lines of docs/cpp.md, check that every
# kernel calling toga_malloc fits 64 registers (nvlink -v), build the benchmark as one whole
# program with toga's PTX (examples/cuda-cpp/whole-program, as scripts/gpu-cpp.sh does), run the
# C API test (its no-GPU checks), and build everything once more through the CMake package
# (find_package(toga)).
set -euo pipefail
cd "$(dirname "$0")/.."
target=$(realpath -m "${CARGO_TARGET_DIR:-target}")
venv=$target/cpp-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
  nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 \
  nvidia-cuda-runtime==13.0.96 cmake==3.31.6
cu13=$("$venv/bin/python" -c "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13'))")
# The wheels put the runtime in lib/; nvcc.profile looks in lib64/.
[ -e "$cu13/lib64" ] || ln -s lib "$cu13/lib64"
nvcc=$cu13/bin/nvcc
bundle=$target/bundle-cpp-ci
build=$target/cpp-ci
rm -rf "$build" && mkdir -p "$build"

TOGA_PROFILE=debug TOGA_DEVICE_ARCHS="75 90" NVCC=$nvcc scripts/bundle-cpp "$bundle"

for p in quickstart example stress bench; do
  "$nvcc" -std=c++17 -arch=sm_90 -rdc=true -I"$bundle/include" "examples/cuda-cpp/$p.cu" \
    "$bundle/lib/libtoga_device.a" "$bundle/lib/libtoga.a" -ldl -lpthread -lm -lrt \
    -o "$build/$p" -Xnvlink -v > "$build/$p.nvlink.txt" 2>&1 || { cat "$build/$p.nvlink.txt"; exit 1; }
  # nvlink's count for a kernel includes the functions it calls: toga's included.
  regs=$(grep -A1 "Function properties for" "$build/$p.nvlink.txt" | grep -o "used [0-9]* registers" | awk '{print $2}' | sort -n)
  worst=$(echo "$regs" | tail -1)
  echo "$p: $(echo "$regs" | wc -l) kernels, at most $worst registers per thread"
  [ "$worst" -le 64 ] || { echo "a kernel of $p needs more than 64 registers"; exit 1; }
done
# The whole-program build of the benchmark that scripts/gpu-cpp.sh times beside it (a
# measurement of the separate-compilation ABI's cost, docs/cpp.md): it must build, within 64
# registers.
examples/cuda-cpp/whole-program/nvcc-whole-program.sh "$nvcc" examples/cuda-cpp/bench.cu \
  "$bundle/lib/toga_device.ptx" "$build/bench_wp" -I"$bundle/include" "$bundle/lib/libtoga.a" \
  -ldl -lpthread -lm -lrt 2> "$build/bench_wp.ptxas.txt" || { cat "$build/bench_wp.ptxas.txt"; exit 1; }
worst=$(grep -o "Used [0-9]* registers" "$build/bench_wp.ptxas.txt" | awk '{print $2}' | sort -n | tail -1)
echo "bench_wp (whole program): at most $worst registers per thread"
[ "${worst:-999}" -le 64 ] || { echo "a kernel of bench_wp needs more than 64 registers"; exit 1; }
# An sm_75 link takes the other architecture of the device library.
"$nvcc" -std=c++17 -arch=sm_75 -rdc=true -I"$bundle/include" examples/cuda-cpp/example.cu \
  "$bundle/lib/libtoga_device.a" "$bundle/lib/libtoga.a" -ldl -lpthread -lm -lrt -o "$build/example75"

cc -std=c11 -Wall -Wextra -Werror -I"$bundle/include" examples/cuda-cpp/capi_test.c \
  "$bundle/lib/libtoga.a" -ldl -lpthread -lm -lrt -o "$build/capi_test"
cc -std=c11 -Wall -Wextra -Werror -I"$bundle/include" examples/cuda-cpp/capi_test.c \
  -L"$bundle/lib" -ltoga -Wl,-rpath,"$bundle/lib" -o "$build/capi_test_shared"
# toga.h is C++-clean too.
c++ -std=c++11 -Wall -Werror -fsyntax-only -x c++ -I"$bundle/include" - <<< '#include "toga.h"'
"$build/capi_test"
"$build/capi_test_shared"

"$venv/bin/cmake" -S examples/cuda-cpp -B "$build/cmake" -DCMAKE_PREFIX_PATH="$bundle" \
  -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES=90 > "$build/cmake.log"
"$venv/bin/cmake" --build "$build/cmake" -j 2 >> "$build/cmake.log"
ls "$build/cmake/quickstart" "$build/cmake/example" "$build/cmake/stress" "$build/cmake/bench" "$build/cmake/capi_test"
echo "ci-cpp: ok"
