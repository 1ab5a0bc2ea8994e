// Checks shared by the C++ examples and tests: any failure prints where and exits with 1.
#ifndef TOGA_EXAMPLES_COMMON_CUH
#define TOGA_EXAMPLES_COMMON_CUH

#include <stdio.h>
#include <stdlib.h>

#include <toga.cuh>

#define CUDA_OK(call)                                                                    \
  do {                                                                                   \
    cudaError_t e_ = (call);                                                             \
    if (e_ != cudaSuccess) {                                                             \
      fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

#define TOGA_OK(call)                                                                    \
  do {                                                                                   \
    toga_status s_ = (call);                                                             \
    if (s_ != TOGA_SUCCESS) {                                                            \
      fprintf(stderr, "%s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call,                  \
              toga_status_string(s_), toga_last_error_message());                        \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

// The global index of this thread in a 1-D grid.
__device__ inline unsigned long long global_id() {
  return blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
}

// A word no other (thread, index) pair gets: blocks that overlap show up as a wrong word.
__host__ __device__ inline unsigned long long pattern_word(unsigned long long owner,
                                                          unsigned long long i) {
  unsigned long long x = (owner << 24) ^ (i * 0x9E3779B97F4A7C15ull) ^ 0xD1B54A32D192ED03ull;
  return x ^ (x >> 29);
}

static inline void print_stats(const char *label, toga_heap heap, cudaStream_t stream) {
  toga_stats s;
  TOGA_OK(toga_heap_stats(heap, stream, &s));
  printf("%s: mallocs %llu, frees %llu, live blocks %llu, used %.1f MiB (high %.1f MiB), "
         "mapped %.1f MiB (high %.1f MiB) of %.1f MiB max, kernel grows %llu, failed %llu, "
         "invalid frees %llu, double frees %llu\n",
         label, (unsigned long long)s.mallocs, (unsigned long long)s.frees,
         (unsigned long long)s.live_blocks, s.used_bytes / 1048576.0, s.used_high / 1048576.0,
         s.mapped_bytes / 1048576.0, s.mapped_high / 1048576.0, s.max_bytes / 1048576.0,
         (unsigned long long)s.kernel_grows, (unsigned long long)s.failed_allocations,
         (unsigned long long)s.invalid_frees, (unsigned long long)s.double_frees);
}

#endif
