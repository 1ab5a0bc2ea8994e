// 2^20 threads (or argv[1]), mixed sizes: each thread allocates 4 blocks of 16 B - 4 KiB
// (and one in 64 threads a block of 8 - 64 KiB), fills every 8-byte word with a pattern of its
// own, and in a later launch another thread checks every word of them and frees them; half
// of the blocks go through toga_realloc first, some through toga_calloc (checked zero) and
// toga_malloc_aligned (checked aligned). Nulls, wrong words and the heap's counts are printed;
// any wrong word, null, or count off exits with 1.
#include <stdint.h>

#include "common.cuh"

#define PER_THREAD 4

__device__ inline unsigned long long mix(unsigned long long x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  return x ^ (x >> 33);
}

// Size of block k of thread i: 16 B - 4 KiB, and one in 64 threads' first block 8 - 64 KiB.
__device__ inline size_t size_of(unsigned long long i, unsigned k) {
  unsigned long long r = mix(i * PER_THREAD + k);
  if (k == 0 && r % 64 == 0) return 8192 + (r >> 8) % 57345;
  return 16 + (r >> 8) % 4081;
}

__device__ void fill(unsigned long long *p, size_t bytes, unsigned long long owner) {
  for (size_t w = 0; w < bytes / 8; w++) p[w] = pattern_word(owner, w);
}

__global__ void allocate(unsigned long long n, unsigned long long **blocks,
                         unsigned long long *counts) {
  unsigned long long i = global_id();
  if (i >= n) return;
  for (unsigned k = 0; k < PER_THREAD; k++) {
    size_t size = size_of(i, k);
    unsigned long long owner = i * PER_THREAD + k;
    unsigned long long *p;
    switch (k) {
      case 1: {  // calloc: zero before the fill
        p = static_cast<unsigned long long *>(toga_calloc(size / 8 + 1, 8));
        if (p != nullptr)
          for (size_t w = 0; w < size / 8 + 1; w++)
            if (p[w] != 0) {
              atomicAdd(&counts[1], 1ull);
              break;
            }
        break;
      }
      case 2: {  // aligned to 256
        p = static_cast<unsigned long long *>(toga_malloc_aligned(size, 256));
        if (p != nullptr && (uintptr_t)p % 256 != 0) atomicAdd(&counts[1], 1ull);
        break;
      }
      default:
        p = static_cast<unsigned long long *>(toga_malloc(size));
    }
    if (p == nullptr) {
      atomicAdd(&counts[0], 1ull);
    } else {
      if (toga_usable_size(p) < size) atomicAdd(&counts[1], 1ull);
      fill(p, size, owner);
    }
    blocks[owner] = p;
  }
}

// Thread i takes the blocks of thread n - 1 - i: another warp, mostly another SM. Block 3 moves
// through toga_realloc to a new size first (its words must survive the move).
__global__ void check_and_free(unsigned long long n, unsigned long long **blocks,
                               unsigned long long *counts) {
  unsigned long long i = global_id();
  if (i >= n) return;
  unsigned long long t = n - 1 - i;
  for (unsigned k = 0; k < PER_THREAD; k++) {
    unsigned long long owner = t * PER_THREAD + k;
    unsigned long long *p = blocks[owner];
    if (p == nullptr) continue;
    size_t size = size_of(t, k);
    if (k == 3) {
      size_t bigger = size + 1 + mix(owner) % 4096;
      unsigned long long *q = static_cast<unsigned long long *>(toga_realloc(p, bigger));
      if (q == nullptr) {
        atomicAdd(&counts[0], 1ull);  // p is still valid
      } else {
        p = q;
      }
    }
    unsigned long long wrong = 0;
    for (size_t w = 0; w < size / 8; w++) wrong += p[w] != pattern_word(owner, w);
    if (wrong) atomicAdd(&counts[1], wrong);
    toga_free(p);
  }
}

int main(int argc, char **argv) {
  unsigned long long n = argc > 1 ? strtoull(argv[1], NULL, 0) : 1ull << 20;
  if (n == 0) {
    fprintf(stderr, "usage: stress [THREADS > 0]\n");
    return 2;
  }
  cudaStream_t stream;
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaStreamCreate(&stream));
  // Per thread: 4 blocks of 2 KiB on average (size classes round up), a realloc's second
  // block, and 1/64 of a 64 KiB one: 24 KiB each is ample (24 GiB at 2^20 threads).
  unsigned long long bytes = n * 24 * 1024;
  if (bytes < (64ull << 20)) bytes = 64ull << 20;
  toga_heap heap;
  TOGA_OK(toga_heap_create(0, bytes, stream, &heap));
  TOGA_OK(toga_bind_device_heap(heap, stream));
  unsigned long long **blocks, *counts;  // counts: [0] nulls, [1] wrong words/alignments/sizes
  CUDA_OK(cudaMalloc(&blocks, n * PER_THREAD * sizeof *blocks));
  CUDA_OK(cudaMalloc(&counts, 2 * sizeof *counts));
  CUDA_OK(cudaMemsetAsync(counts, 0, 2 * sizeof *counts, stream));
  unsigned grid = (unsigned)((n + 255) / 256);
  int rounds = 2;  // the second round runs on a heap the first one used
  for (int r = 0; r < rounds; r++) {
    allocate<<<grid, 256, 0, stream>>>(n, blocks, counts);
    CUDA_OK(cudaGetLastError());
    check_and_free<<<grid, 256, 0, stream>>>(n, blocks, counts);
    CUDA_OK(cudaGetLastError());
  }
  CUDA_OK(cudaStreamSynchronize(stream));
  unsigned long long h[2];
  CUDA_OK(cudaMemcpy(h, counts, sizeof h, cudaMemcpyDeviceToHost));
  toga_stats s;
  TOGA_OK(toga_heap_stats(heap, stream, &s));
  print_stats("stress", heap, stream);
  unsigned long long expected = (unsigned long long)rounds * n * PER_THREAD;
  // Each realloc that moved a block counts one malloc and one free more.
  printf("stress: %llu threads x %d blocks x %d rounds, %llu null, %llu wrong; mallocs %llu "
         "(>= %llu), frees %llu, live %llu, invalid frees %llu, double frees %llu\n",
         n, PER_THREAD, rounds, h[0], h[1], (unsigned long long)s.mallocs, expected,
         (unsigned long long)s.frees, (unsigned long long)s.live_blocks,
         (unsigned long long)s.invalid_frees, (unsigned long long)s.double_frees);
  int ok = h[0] == 0 && h[1] == 0 && s.mallocs >= expected && s.mallocs == s.frees &&
           s.live_blocks == 0 && s.invalid_frees == 0 && s.double_frees == 0;
  CUDA_OK(cudaFree(blocks));
  CUDA_OK(cudaFree(counts));
  TOGA_OK(toga_unbind_device_heap(stream));
  TOGA_OK(toga_heap_destroy(heap, stream));
  CUDA_OK(cudaStreamDestroy(stream));
  printf(ok ? "stress: passed\n" : "stress: FAILED\n");
  return ok ? 0 : 1;
}
