// toga from CUDA C++: per-thread linked lists on a fixed heap, per-thread vectors on a growable
// heap that grows while the kernel runs, and what happens without a heap or with a foreign free.
// Exits with 1 on any wrong value. `example --small` runs 1/64 of the threads; `--no-grow` maps
// the growable heap whole at creation, so that it does not grow in the kernel (for memcheck).
// Build: see docs/cpp.md (or CMakeLists.txt here).
#include <stdint.h>
#include <string.h>

#include "common.cuh"

struct Node {
  unsigned long long value;
  Node *next;
};

// Thread i builds a list of 1 + i % 16 nodes and leaves its head in heads[i].
__global__ void build_lists(unsigned long long n, Node **heads, unsigned long long *nulls) {
  unsigned long long i = global_id();
  if (i >= n) return;
  Node *head = nullptr;
  for (unsigned k = 0; k < 1 + i % 16; k++) {
    Node *node = static_cast<Node *>(toga_malloc(sizeof(Node)));
    if (node == nullptr) {
      atomicAdd(nulls, 1ull);
      break;
    }
    node->value = pattern_word(i, k);
    node->next = head;
    head = node;
  }
  heads[i] = head;
}

// In a later launch, thread i walks the list of thread n-1-i (another warp, often another SM),
// checks every value and frees every node.
__global__ void check_lists(unsigned long long n, Node **heads, unsigned long long *errors) {
  unsigned long long i = global_id();
  if (i >= n) return;
  unsigned long long owner = n - 1 - i;
  Node *node = heads[owner];
  unsigned long long k = 1 + owner % 16;
  while (node != nullptr) {
    k--;
    if (node->value != pattern_word(owner, k)) atomicAdd(errors, 1ull);
    Node *next = node->next;
    toga_free(node);
    node = next;
  }
  if (k != 0) atomicAdd(errors, 1ull);
}

// A growable vector in toga memory (toga::allocator), doubled when full.
template <class T>
struct DeviceVector {
  T *data = nullptr;
  unsigned len = 0, cap = 0;
  __device__ bool push(T v) {
    toga::allocator<T> a;
    if (len == cap) {
      unsigned c = cap ? 2 * cap : 8;
      T *d = a.allocate(c);
      if (d == nullptr) return false;
      for (unsigned k = 0; k < len; k++) d[k] = data[k];
      a.deallocate(data, cap);
      data = d;
      cap = c;
    }
    data[len++] = v;
    return true;
  }
};

__global__ void build_vectors(unsigned long long n, unsigned per_thread,
                              DeviceVector<unsigned long long> *vs, unsigned long long *nulls) {
  unsigned long long i = global_id();
  if (i >= n) return;
  DeviceVector<unsigned long long> v;
  for (unsigned k = 0; k < per_thread; k++)
    if (!v.push(pattern_word(i, k))) {
      atomicAdd(nulls, 1ull);
      break;
    }
  vs[i] = v;
}

__global__ void check_vectors(unsigned long long n, unsigned per_thread,
                              DeviceVector<unsigned long long> *vs, unsigned long long *errors) {
  unsigned long long i = global_id();
  if (i >= n) return;
  unsigned long long owner = (i * 7919) % n;  // another thread's vector
  DeviceVector<unsigned long long> v = vs[owner];
  if (v.len != per_thread) atomicAdd(errors, 1ull);
  for (unsigned k = 0; k < v.len; k++)
    if (v.data[k] != pattern_word(owner, k)) atomicAdd(errors, 1ull);
  toga_free(v.data);
}

__global__ void malloc_unbound(unsigned long long n, unsigned long long *non_null) {
  if (global_id() < n && toga_malloc(64) != nullptr) atomicAdd(non_null, 1ull);
}

__global__ void free_foreign(void *p) {
  if (global_id() == 0) toga_free(p);
}

static unsigned blocks(unsigned long long n) { return (unsigned)((n + 255) / 256); }

static unsigned long long read_word(unsigned long long *d) {
  unsigned long long h = 0;
  CUDA_OK(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
  return h;
}

int main(int argc, char **argv) {
  int failures = 0;
  unsigned shrink = 0;
  bool grow = true;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--small") == 0) {
      shrink = 6;
    } else if (strcmp(argv[i], "--no-grow") == 0) {
      grow = false;
    } else {
      fprintf(stderr, "usage: example [--small] [--no-grow]\n");
      return 2;
    }
  }
  cudaStream_t stream;
  CUDA_OK(cudaSetDevice(0));
  CUDA_OK(cudaStreamCreate(&stream));
  unsigned long long *counters;  // [0] nulls, [1] errors
  CUDA_OK(cudaMalloc(&counters, 2 * sizeof *counters));

  // 1. Linked lists on a fixed 256 MiB heap: 2^20 threads, 8.5 nodes each on average.
  {
    const unsigned long long n = 1ull << (20 - shrink);
    toga_heap heap;
    TOGA_OK(toga_heap_create(0, 256ull << 20, stream, &heap));
    TOGA_OK(toga_bind_device_heap(heap, stream));
    Node **heads;
    CUDA_OK(cudaMalloc(&heads, n * sizeof *heads));
    CUDA_OK(cudaMemsetAsync(counters, 0, 2 * sizeof *counters, stream));
    build_lists<<<blocks(n), 256, 0, stream>>>(n, heads, counters);
    CUDA_OK(cudaGetLastError());
    print_stats("lists built  ", heap, stream);
    check_lists<<<blocks(n), 256, 0, stream>>>(n, heads, counters + 1);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaStreamSynchronize(stream));
    print_stats("lists freed  ", heap, stream);
    unsigned long long nulls = read_word(counters), errors = read_word(counters + 1);
    toga_stats s;
    TOGA_OK(toga_heap_stats(heap, stream, &s));
    printf("lists: %llu threads, %llu nodes, %llu null, %llu wrong\n", n,
           (unsigned long long)s.mallocs, nulls, errors);
    if (nulls || errors || s.live_blocks || s.mallocs != s.frees || s.invalid_frees) failures++;

    // 2. A foreign pointer freed in a kernel: counted, nothing else happens.
    free_foreign<<<1, 32, 0, stream>>>(heads);
    CUDA_OK(cudaStreamSynchronize(stream));
    toga_stats after;
    TOGA_OK(toga_heap_stats(heap, stream, &after));
    printf("foreign free: invalid frees %llu -> %llu\n", (unsigned long long)s.invalid_frees,
           (unsigned long long)after.invalid_frees);
    if (after.invalid_frees != s.invalid_frees + 1) failures++;

    // 3. No heap bound: toga_malloc returns NULL and the calls are counted.
    const unsigned long long m = 4096;
    uint64_t before = 0, unbound = 0;
    TOGA_OK(toga_read_unbound_mallocs(stream, &before));
    TOGA_OK(toga_unbind_device_heap(stream));
    CUDA_OK(cudaMemsetAsync(counters, 0, sizeof *counters, stream));
    malloc_unbound<<<blocks(m), 256, 0, stream>>>(m, counters);
    CUDA_OK(cudaGetLastError());
    TOGA_OK(toga_read_unbound_mallocs(stream, &unbound));
    unsigned long long non_null = read_word(counters);
    printf("unbound: %llu calls, %llu non-null, counted %llu\n", m, non_null,
           (unsigned long long)(unbound - before));
    if (non_null != 0 || unbound - before != m) failures++;
    CUDA_OK(cudaFree(heads));
    TOGA_OK(toga_heap_destroy(heap, stream));
  }

  // 4. Vectors on a growable heap that starts at 8 MiB: 2^18 threads push 512 words each
  //    (4 KiB vectors, 1 GiB live at the end; --small: 16 MiB), so the heap grows while the
  //    kernel runs (--no-grow: mapped whole at creation, it must not grow).
  {
    const unsigned long long n = 1ull << (18 - shrink);
    const unsigned per_thread = 512;
    toga_growable_options opts = {};
    opts.initial_bytes = 8ull << 20;
    opts.max_bytes = 4ull << 30;
    if (!grow) {
      // The whole heap mapped at creation, so nothing grows while the kernel runs (for
      // memcheck, which does not see memory mapped during a kernel: docs/cpp.md).
      opts.max_bytes = (shrink ? 64ull : 2048ull) << 20;
      opts.initial_bytes = opts.max_bytes;
    }
    toga_heap heap;
    TOGA_OK(toga_heap_create_growable(0, &opts, stream, &heap));
    TOGA_OK(toga_bind_device_heap(heap, stream));
    print_stats("growable, new", heap, stream);
    DeviceVector<unsigned long long> *vs;
    CUDA_OK(cudaMalloc(&vs, n * sizeof *vs));
    CUDA_OK(cudaMemsetAsync(counters, 0, 2 * sizeof *counters, stream));
    build_vectors<<<blocks(n), 256, 0, stream>>>(n, per_thread, vs, counters);
    CUDA_OK(cudaGetLastError());
    CUDA_OK(cudaStreamSynchronize(stream));
    toga_stats grown;
    TOGA_OK(toga_heap_stats(heap, stream, &grown));
    print_stats("vectors built", heap, stream);
    check_vectors<<<blocks(n), 256, 0, stream>>>(n, per_thread, vs, counters + 1);
    CUDA_OK(cudaGetLastError());
    TOGA_OK(toga_heap_synchronize(heap, stream));  // trims back to the release threshold
    print_stats("vectors freed", heap, stream);
    unsigned long long nulls = read_word(counters), errors = read_word(counters + 1);
    toga_stats s;
    TOGA_OK(toga_heap_stats(heap, stream, &s));
    printf("vectors: %llu threads x %u words, %llu null, %llu wrong; grew in kernel %llu times "
           "to %.0f MiB, %.0f MiB mapped after synchronize\n",
           n, per_thread, nulls, errors, (unsigned long long)grown.kernel_grows,
           grown.mapped_bytes / 1048576.0, s.mapped_bytes / 1048576.0);
    if (nulls || errors || s.live_blocks ||
        (grow ? grown.kernel_grows == 0 || grown.mapped_bytes <= opts.initial_bytes
              : grown.kernel_grows != 0))
      failures++;
    TOGA_OK(toga_unbind_device_heap(stream));
    CUDA_OK(cudaFree(vs));
    TOGA_OK(toga_heap_destroy(heap, stream));
  }

  CUDA_OK(cudaFree(counters));
  CUDA_OK(cudaStreamDestroy(stream));
  printf(failures ? "example: FAILED (%d checks)\n" : "example: all checks passed\n", failures);
  return failures ? 1 : 0;
}
