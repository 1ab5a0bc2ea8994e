// The C++ path's speed: 2^20 threads (or argv[1]) call toga_malloc once each, from a freshly
// reset heap, then a second kernel calls toga_free on every block; each kernel is timed with
// CUDA events. Sizes 16 B, 256 B, 4 KiB, and mixed (uniform over 16 - 4096 B, seeded). One
// warm-up, then the median of REPS. The same workload as the Rust benches (benches/malloc_only.rs,
// benches/free_only.rs, benches/mixed.rs; `host bench`), on a heap of the same size, so one run
// of both on one GPU compares the paths. Exits with 1 if a malloc returned null.
#include <algorithm>
#include <vector>

#include "common.cuh"

static const int REPS = 15;

__global__ void malloc_fixed(unsigned long long n, size_t size, void **out) {
  unsigned long long i = global_id();
  if (i < n) out[i] = toga_malloc(size);
}

__global__ void malloc_sizes(unsigned long long n, const unsigned *sizes, void **out) {
  unsigned long long i = global_id();
  if (i < n) out[i] = toga_malloc(sizes[i]);
}

__global__ void free_all(unsigned long long n, void **blocks) {
  unsigned long long i = global_id();
  if (i < n) toga_free(blocks[i]);
}

__global__ void count_nulls(unsigned long long n, void **blocks, unsigned long long *nulls) {
  unsigned long long i = global_id();
  if (i < n && blocks[i] == nullptr) atomicAdd(nulls, 1ull);
}

static float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int main(int argc, char **argv) {
  unsigned long long n = argc > 1 ? strtoull(argv[1], NULL, 0) : 1ull << 20;
  if (n == 0) {
    fprintf(stderr, "usage: bench [THREADS > 0]\n");
    return 2;
  }
  cudaStream_t stream;
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaStreamCreate(&stream));
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  size_t free_bytes = 0, total = 0;
  CUDA_OK(cudaMemGetInfo(&free_bytes, &total));
  // As the Rust benches: room for every thread's largest block twice, at most a third of free
  // memory.
  unsigned long long bytes = std::min<unsigned long long>(n * 4096 * 2, free_bytes / 3);
  toga_heap heap;
  TOGA_OK(toga_heap_create(0, bytes, stream, &heap));
  TOGA_OK(toga_bind_device_heap(heap, stream));
  void **blocks;
  unsigned *sizes;
  unsigned long long *nulls;
  CUDA_OK(cudaMalloc(&blocks, n * sizeof *blocks));
  CUDA_OK(cudaMalloc(&sizes, n * sizeof *sizes));
  CUDA_OK(cudaMalloc(&nulls, sizeof *nulls));
  std::vector<unsigned> host_sizes(n);
  unsigned long long x = 0x9E3779B97F4A7C15ull;  // xorshift64*, seeded
  for (auto &s : host_sizes) {
    x ^= x >> 12, x ^= x << 25, x ^= x >> 27;
    s = 16 + (unsigned)((x * 0x2545F4914F6CDD1Dull >> 32) % (4096 - 16 + 1));
  }
  CUDA_OK(cudaMemcpy(sizes, host_sizes.data(), n * sizeof *sizes, cudaMemcpyHostToDevice));
  cudaEvent_t e0, e1, e2, e3;
  CUDA_OK(cudaEventCreate(&e0));
  CUDA_OK(cudaEventCreate(&e1));
  CUDA_OK(cudaEventCreate(&e2));
  CUDA_OK(cudaEventCreate(&e3));
  unsigned grid = (unsigned)((n + 255) / 256);
  printf("%s, %llu threads, heap %.0f MiB; kernel times (CUDA events), median of %d after one "
         "warm-up, from a freshly reset heap\n",
         prop.name, n, bytes / 1048576.0, REPS);
  printf("%10s %12s %12s %14s\n", "size", "malloc ms", "free ms", "mallocs/s");
  int failed = 0;
  const size_t fixed[] = {16, 256, 4096, 0};  // 0: mixed
  for (size_t size : fixed) {
    std::vector<float> m, f;
    CUDA_OK(cudaMemsetAsync(nulls, 0, sizeof *nulls, stream));
    for (int r = 0; r <= REPS; r++) {
      TOGA_OK(toga_heap_reset(heap, stream));
      CUDA_OK(cudaEventRecord(e0, stream));
      if (size)
        malloc_fixed<<<grid, 256, 0, stream>>>(n, size, blocks);
      else
        malloc_sizes<<<grid, 256, 0, stream>>>(n, sizes, blocks);
      CUDA_OK(cudaGetLastError());
      CUDA_OK(cudaEventRecord(e1, stream));
      count_nulls<<<grid, 256, 0, stream>>>(n, blocks, nulls);
      CUDA_OK(cudaEventRecord(e2, stream));
      free_all<<<grid, 256, 0, stream>>>(n, blocks);
      CUDA_OK(cudaGetLastError());
      CUDA_OK(cudaEventRecord(e3, stream));
      CUDA_OK(cudaEventSynchronize(e3));
      float tm = 0, tf = 0;
      CUDA_OK(cudaEventElapsedTime(&tm, e0, e1));
      CUDA_OK(cudaEventElapsedTime(&tf, e2, e3));
      if (r > 0) m.push_back(tm), f.push_back(tf);
    }
    unsigned long long h = 0;
    CUDA_OK(cudaMemcpy(&h, nulls, sizeof h, cudaMemcpyDeviceToHost));
    char label[32];
    if (size)
      snprintf(label, sizeof label, "%zu", size);
    else
      snprintf(label, sizeof label, "16-4096");
    float mm = median(m), mf = median(f);
    printf("%10s %12.3f %12.3f %14.3g%s\n", label, mm, mf, n / (mm / 1e3),
           h ? "  NULLS" : "");
    failed |= h != 0;
  }
  print_stats("bench", heap, stream);
  TOGA_OK(toga_unbind_device_heap(stream));
  TOGA_OK(toga_heap_destroy(heap, stream));
  CUDA_OK(cudaStreamDestroy(stream));
  return failed;
}
