// The C++ path's speed, set up as the Rust path's `host bench` "toga fresh" cell
// (host/src/bench.rs, harness MallocBench::run with HeapState::Fresh), so that one run of both
// on one GPU compares the two paths and nothing else:
//   - 2^20 threads (or argv[1]), blocks of 256 threads (toga::BLOCK_SIZE, launch_config);
//   - one heap of min(threads * 4096 * 2, free memory / 3) bytes;
//   - sizes 16, 64, 256, 1024 and 4096 B (host bench's SIZES), then "16-4096": thread i asks
//     for sizes[i], the list of harness::uniform_sizes(threads, 16, 4096, 0x9E3779B97F4A7C15)
//     (benches/mixed.rs, MallocBench::run_sizes);
//   - each run: toga_heap_reset (Heap::reset: metadata zeroed, init kernels, arenas stocked),
//     then the malloc kernel timed alone with CUDA events, the blocks copied back to count the
//     nulls (as MallocBench::failed does), then the free kernel timed alone;
//   - one warm-up run, then the median of REPS = 5 timed runs (host bench's REPS).
// Prints a table, and one "row SIZE MALLOC_MS FREE_MS NULLS" line per size for scripts
// (scripts/gpu-cpp.sh compares them with host bench's). Exits with 1 if a malloc returned null.
#include <algorithm>
#include <vector>

#include "common.cuh"

static const int REPS = 5;
static const unsigned BLOCK = 256;
static const unsigned SIZES[] = {16, 64, 256, 1024, 4096};
// benches/mixed.rs: MIN, MAX, SEED.
static const unsigned MIXED_MIN = 16, MIXED_MAX = 4096;
static const unsigned long long MIXED_SEED = 0x9E3779B97F4A7C15ull;

// The harness kernels toga_malloc, toga_malloc_sizes and toga_free
// (kernels/src/entry/workload.rs), with toga_malloc & co. of toga.cuh for DeviceHeap's methods.
__global__ void malloc_fixed(void **ptrs, unsigned size, unsigned long long n) {
  unsigned long long i = global_id();
  if (i < n) ptrs[i] = toga_malloc(size);
}

__global__ void malloc_sizes(void **ptrs, const unsigned *sizes, unsigned long long n) {
  unsigned long long i = global_id();
  if (i < n) ptrs[i] = toga_malloc(sizes[i]);
}

__global__ void free_all(void *const *ptrs, unsigned long long n) {
  unsigned long long i = global_id();
  if (i < n) toga_free(ptrs[i]);
}

// harness::uniform_sizes: `n` sizes uniform over lo..=hi from xorshift64 (13, 7, 17).
static std::vector<unsigned> uniform_sizes(unsigned long long n, unsigned lo, unsigned hi,
                                           unsigned long long seed) {
  std::vector<unsigned> v(n);
  unsigned long long x = seed | 1;
  for (auto &s : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    s = lo + (unsigned)(x % (unsigned long long)(hi - lo + 1));
  }
  return v;
}

static float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Timing {
  float malloc_ms, free_ms;
  unsigned long long failed;
};

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
  // host bench: (threads * 4096 * 2).min(gpu.free_memory() / 3).
  unsigned long long bytes = std::min<unsigned long long>(n * 4096 * 2, free_bytes / 3);
  toga_heap heap;
  TOGA_OK(toga_heap_create(0, bytes, stream, &heap));
  TOGA_OK(toga_bind_device_heap(heap, stream));
  void **ptrs;
  unsigned *sizes;
  CUDA_OK(cudaMalloc(&ptrs, n * sizeof *ptrs));
  CUDA_OK(cudaMemset(ptrs, 0, n * sizeof *ptrs));
  CUDA_OK(cudaMalloc(&sizes, n * sizeof *sizes));
  std::vector<unsigned> host_sizes = uniform_sizes(n, MIXED_MIN, MIXED_MAX, MIXED_SEED);
  CUDA_OK(cudaMemcpy(sizes, host_sizes.data(), n * sizeof *sizes, cudaMemcpyHostToDevice));
  std::vector<void *> host_ptrs(n);
  cudaEvent_t e0, e1;
  CUDA_OK(cudaEventCreate(&e0));
  CUDA_OK(cudaEventCreate(&e1));
  unsigned grid = (unsigned)((n + BLOCK - 1) / BLOCK);

  // One iteration of MallocBench::run (Fresh) or run_sizes: size 0 takes `sizes`.
  auto run = [&](unsigned size) {
    Timing t;
    TOGA_OK(toga_heap_reset(heap, stream));
    CUDA_OK(cudaEventRecord(e0, stream));
    if (size)
      malloc_fixed<<<grid, BLOCK, 0, stream>>>(ptrs, size, n);
    else
      malloc_sizes<<<grid, BLOCK, 0, stream>>>(ptrs, sizes, n);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaEventRecord(e1, stream));
    CUDA_OK(cudaEventSynchronize(e1));
    CUDA_OK(cudaEventElapsedTime(&t.malloc_ms, e0, e1));
    CUDA_OK(cudaMemcpyAsync(host_ptrs.data(), ptrs, n * sizeof *ptrs, cudaMemcpyDeviceToHost,
                            stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    t.failed = (unsigned long long)std::count(host_ptrs.begin(), host_ptrs.end(), nullptr);
    CUDA_OK(cudaEventRecord(e0, stream));
    free_all<<<grid, BLOCK, 0, stream>>>(ptrs, n);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaEventRecord(e1, stream));
    CUDA_OK(cudaEventSynchronize(e1));
    CUDA_OK(cudaEventElapsedTime(&t.free_ms, e0, e1));
    return t;
  };

  printf("%s, %llu threads, blocks of %u, heap %llu B; toga_heap_reset before each malloc "
         "kernel; kernel times (CUDA events), median of %d after one warm-up\n",
         prop.name, n, BLOCK, bytes, REPS);
  printf("%10s %12s %12s %14s\n", "size", "malloc ms", "free ms", "mallocs/s");
  unsigned long long failed = 0;
  std::vector<unsigned> cells(SIZES, SIZES + sizeof SIZES / sizeof SIZES[0]);
  cells.push_back(0);  // mixed
  char rows[16][96];
  int nrows = 0;
  for (unsigned size : cells) {
    std::vector<float> m, f;
    unsigned long long nulls = run(size).failed;  // warm-up
    for (int r = 0; r < REPS; r++) {
      Timing t = run(size);
      m.push_back(t.malloc_ms);
      f.push_back(t.free_ms);
      nulls += t.failed;
    }
    char label[32];
    if (size)
      snprintf(label, sizeof label, "%u", size);
    else
      snprintf(label, sizeof label, "%u-%u", MIXED_MIN, MIXED_MAX);
    float mm = median(m), mf = median(f);
    printf("%10s %12.4f %12.4f %14.3g%s\n", label, mm, mf, n / (mm / 1e3),
           nulls ? "  NULLS" : "");
    snprintf(rows[nrows++], sizeof rows[0], "row %s %.4f %.4f %llu", label, mm, mf, nulls);
    failed += nulls;
  }
  for (int i = 0; i < nrows; i++) printf("%s\n", rows[i]);
  print_stats("bench", heap, stream);
  TOGA_OK(toga_unbind_device_heap(stream));
  TOGA_OK(toga_heap_destroy(heap, stream));
  CUDA_OK(cudaFree(ptrs));
  CUDA_OK(cudaFree(sizes));
  CUDA_OK(cudaStreamDestroy(stream));
  if (failed) fprintf(stderr, "bench: %llu mallocs returned null\n", failed);
  return failed != 0;
}
