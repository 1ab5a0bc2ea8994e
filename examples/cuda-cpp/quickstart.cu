// The smallest complete toga program in CUDA C++ (docs/cpp.md, "Ten minutes from nothing"):
// one heap, one kernel in which every thread allocates and fills a block, one that checks and
// frees them, and the heap's statistics. Exits with 0 if every block was there and right.
//
//   nvcc -std=c++17 -arch=sm_90 -rdc=true -Ibundle-cpp/include quickstart.cu \
//        bundle-cpp/lib/libtoga_device.a bundle-cpp/lib/libtoga.a -ldl -lpthread -lm -lrt \
//        -o quickstart
#include <cstdio>

#include <toga.cuh>

// Thread i allocates 1 to 16 ints and writes i into each.
__global__ void fill(unsigned n, unsigned **blocks) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned len = 1 + i % 16;
  unsigned *p = static_cast<unsigned *>(toga_malloc(len * sizeof(unsigned)));
  blocks[i] = p;
  if (p == nullptr) return;  // out of memory, or no heap bound
  for (unsigned k = 0; k < len; k++) p[k] = i;
}

// Any thread may free any block: here thread i checks and frees block n - 1 - i.
__global__ void check_and_free(unsigned n, unsigned **blocks, unsigned long long *bad) {
  unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned j = n - 1 - i;
  unsigned *p = blocks[j];
  if (p == nullptr) {
    atomicAdd(bad, 1ull);
    return;
  }
  for (unsigned k = 0; k < 1 + j % 16; k++)
    if (p[k] != j) atomicAdd(bad, 1ull);
  toga_free(p);
}

static bool ok(toga_status s, const char *what) {
  if (s == TOGA_SUCCESS) return true;
  fprintf(stderr, "%s: %s\n", what, toga_last_error_message());
  return false;
}

int main() {
  const unsigned n = 1u << 20;
  cudaStream_t stream;
  if (cudaStreamCreate(&stream) != cudaSuccess) {
    fprintf(stderr, "no CUDA device\n");
    return 1;
  }
  toga_heap heap;
  if (!ok(toga_heap_create(0, 256ull << 20, stream, &heap), "create a 256 MiB heap")) return 1;
  if (!ok(toga_bind_device_heap(heap, stream), "bind it")) return 1;

  unsigned **blocks;
  unsigned long long *bad;
  cudaMalloc(&blocks, n * sizeof *blocks);
  cudaMalloc(&bad, sizeof *bad);
  cudaMemsetAsync(bad, 0, sizeof *bad, stream);
  fill<<<n / 256, 256, 0, stream>>>(n, blocks);
  toga_stats mid;
  if (!ok(toga_heap_stats(heap, stream, &mid), "stats")) return 1;
  check_and_free<<<n / 256, 256, 0, stream>>>(n, blocks, bad);
  toga_stats end;
  if (!ok(toga_heap_stats(heap, stream, &end), "stats")) return 1;
  unsigned long long wrong = 0;
  cudaMemcpyAsync(&wrong, bad, sizeof wrong, cudaMemcpyDeviceToHost, stream);
  if (cudaStreamSynchronize(stream) != cudaSuccess) {
    fprintf(stderr, "a kernel failed: %s\n", cudaGetErrorString(cudaGetLastError()));
    return 1;
  }
  printf("after fill:  %llu mallocs, %llu live blocks, %.1f MiB used\n",
         (unsigned long long)mid.mallocs, (unsigned long long)mid.live_blocks,
         mid.used_bytes / 1048576.0);
  printf("after free:  %llu frees, %llu live blocks, %llu failed allocations, %llu bad frees\n",
         (unsigned long long)end.frees, (unsigned long long)end.live_blocks,
         (unsigned long long)end.failed_allocations,
         (unsigned long long)(end.invalid_frees + end.double_frees));
  bool passed = wrong == 0 && end.live_blocks == 0 && end.frees == n;
  printf("quickstart: %s (%llu missing or wrong blocks)\n", passed ? "ok" : "FAILED", wrong);
  toga_unbind_device_heap(stream);
  toga_heap_destroy(heap, stream);
  cudaFree(blocks);
  cudaFree(bad);
  return passed ? 0 : 1;
}
