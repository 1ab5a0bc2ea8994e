// toga.cuh: toga's device allocator for CUDA C++ kernels.
//
// toga_malloc and the rest are toga's own Rust allocator (kernels/), compiled to PTX and then
// to a relocatable device object; link it with -rdc=true (docs/cpp.md). The host side (creating
// heaps) is the C API of toga.h, which this header includes.
//
//   #include <toga.cuh>
//   __global__ void k() { int *p = (int *)toga_malloc(64); ... toga_free(p); }
//
//   toga_heap heap;
//   toga_heap_create(0, 1ull << 30, stream, &heap);  // a 1 GiB heap on device 0
//   toga_bind_device_heap(heap, stream);  // this program's kernels allocate from it
//   k<<<blocks, threads, 0, stream>>>();
//   toga_unbind_device_heap(stream);
//   toga_heap_destroy(heap, stream);
//
// Semantics are those of toga's Rust functions (README, docs/api.md): out of memory is a null
// pointer, never a hang; toga_free(NULL) does nothing; a foreign or double free is counted
// (toga_stats.invalid_frees / double_frees) and changes nothing. Any thread may call any
// function in divergent code; calls of one warp are served together (warp aggregation). A kernel
// that calls them fits 1024-thread blocks (64 registers per thread).
#ifndef TOGA_CUH
#define TOGA_CUH

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime.h>

#include "toga.h"

#ifdef __cplusplus
extern "C" {
#endif

// `size` bytes aligned to 16 at least (small blocks to their size class, large ones to their
// power-of-two size), or NULL: size 0, out of memory, or no heap bound.
extern __device__ void *toga_malloc(size_t size);
// `count * size` zeroed bytes, or NULL (also when `count * size` overflows).
extern __device__ void *toga_calloc(size_t count, size_t size);
// `size` bytes aligned to `align` (a power of two, at most 512 KiB), or NULL.
extern __device__ void *toga_malloc_aligned(size_t size, size_t align);
// C's realloc: NULL `p` allocates; size 0 frees and returns NULL; on failure NULL, `p` intact.
extern __device__ void *toga_realloc(void *p, size_t size);
// Give back a block of any thread; NULL is a no-op.
extern __device__ void toga_free(void *p);
// The usable bytes of the live block at `p` (at least what was asked for); 0 for NULL.
extern __device__ size_t toga_usable_size(void *p);

// Make `heap_base` (toga_heap_base on the host; NULL unbinds) the heap of this program's toga_*
// calls. Call from one thread; kernels launched after this one completed see it. No kernel that
// calls toga_* may run while it does: they read the bound heap through the read-only data
// cache, once per call. toga_bind_device_heap does it for you.
extern __device__ void toga_bind(void *heap_base);
// The base bound now (NULL: none).
extern __device__ void *toga_bound_heap(void);
// How many allocation calls returned NULL because no heap was bound.
extern __device__ uint64_t toga_unbound_mallocs(void);

#ifdef __cplusplus
}  // extern "C"
#endif

#ifdef __cplusplus
namespace toga {
namespace detail {
// One kernel of each program (a template: one definition across translation units).
template <int = 0>
__global__ void bind_kernel(void *base) {
  if (blockIdx.x == 0 && threadIdx.x == 0) toga_bind(base);
}
template <int = 0>
__global__ void unbound_kernel(unsigned long long *out) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *out = toga_unbound_mallocs();
}
}  // namespace detail

// A device-side allocator for containers written for device code: allocate<T>(n) is
// toga_malloc_aligned(n * sizeof(T), alignof(T)), or NULL.
template <class T>
struct allocator {
  typedef T value_type;
  __host__ __device__ allocator() {}
  template <class U>
  __host__ __device__ allocator(const allocator<U> &) {}
  __device__ T *allocate(size_t n) const {
    if (n > SIZE_MAX / sizeof(T)) return nullptr;
    return static_cast<T *>(toga_malloc_aligned(n * sizeof(T), alignof(T)));
  }
  __device__ void deallocate(T *p, size_t = 0) const { toga_free(p); }
};
template <class T, class U>
__host__ __device__ bool operator==(const allocator<T> &, const allocator<U> &) { return true; }
template <class T, class U>
__host__ __device__ bool operator!=(const allocator<T> &, const allocator<U> &) { return false; }
}  // namespace toga

// Bind `heap` for every kernel of this program, in order on `stream`: launches a one-thread
// kernel that calls toga_bind. Returns TOGA_SUCCESS, the error of toga_heap_base, or
// TOGA_ERROR_CUDA when the launch failed (cudaPeekAtLastError says why).
static inline toga_status toga_bind_device_heap(toga_heap heap, cudaStream_t stream) {
  void *base = NULL;
  toga_status s = toga_heap_base(heap, &base);
  if (s != TOGA_SUCCESS) return s;
  toga::detail::bind_kernel<<<1, 1, 0, stream>>>(base);
  return cudaPeekAtLastError() == cudaSuccess ? TOGA_SUCCESS : TOGA_ERROR_CUDA;
}

// Unbind: later allocation calls return NULL (and are counted) until the next bind.
static inline toga_status toga_unbind_device_heap(cudaStream_t stream) {
  toga::detail::bind_kernel<<<1, 1, 0, stream>>>(NULL);
  return cudaPeekAtLastError() == cudaSuccess ? TOGA_SUCCESS : TOGA_ERROR_CUDA;
}

// Read toga_unbound_mallocs() into *out (synchronizes `stream`).
static inline toga_status toga_read_unbound_mallocs(cudaStream_t stream, uint64_t *out) {
  unsigned long long *d = NULL;
  if (out == NULL) return TOGA_ERROR_INVALID_VALUE;
  if (cudaMalloc(&d, sizeof *d) != cudaSuccess) return TOGA_ERROR_CUDA;
  toga::detail::unbound_kernel<<<1, 1, 0, stream>>>(d);
  unsigned long long h = 0;
  cudaError_t e = cudaMemcpyAsync(&h, d, sizeof h, cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  cudaFree(d);
  *out = h;
  return e == cudaSuccess ? TOGA_SUCCESS : TOGA_ERROR_CUDA;
}
#endif  // __cplusplus

#endif  // TOGA_CUH
