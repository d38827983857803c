// Shared by cache_hints.cu and pdl.cu (boundary.cu uses the timing and statistics): the f16
// add of one 16-byte vector, random operands, the bit-for-bit check of every variant against the
// first, and event timing of a launch loop.
#pragma once
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <vector>

__device__ __forceinline__ uint4 add128(uint4 x, uint4 y) {
  uint4 r; __half2* a = (__half2*)&x; __half2* b = (__half2*)&y; __half2* o = (__half2*)&r;
  for (int k = 0; k < 4; k++) o[k] = __hadd2(a[k], b[k]); return r;
}

// `count` buffers of `n` halves on stream `s`; those listed in `fill` get uniform values in
// [-1, 1) from one LCG stream (the others stay uninitialised: outputs).
inline void alloc_operands(uint4** m, int count, std::initializer_list<int> fill, size_t n, cudaStream_t s) {
  for (int k = 0; k < count; k++) cudaMallocAsync(&m[k], n * 2, s);
  cudaStreamSynchronize(s);
  std::vector<__half> h(n); unsigned st = 1;
  for (int k : fill) {
    for (size_t i = 0; i < n; i++) { st = st * 1664525u + 1013904223u; h[i] = __float2half(((st >> 8) / 16777216.0f) * 2 - 1); }
    cudaMemcpy(m[k], h.data(), n * 2, cudaMemcpyHostToDevice);
  }
}

// `produce(v, dst)` leaves variant v's result (n halves) in dst; every variant must match the
// first bit for bit.
template <class F> void check_variants(const char* const* names, int nvar, size_t n, F&& produce) {
  std::vector<__half> want(n), got(n);
  produce(0, want);
  for (int v = 1; v < nvar; v++) {
    produce(v, got);
    if (memcmp(want.data(), got.data(), n * 2)) printf("MISMATCH %s\n", names[v]);
  }
}

// µs per iteration of `run(iters)` between two events on `s`.
template <class R> float time_per_iter(cudaStream_t s, int iters, R&& run) {
  static cudaEvent_t e0 = nullptr, e1 = nullptr;
  if (!e0) { cudaEventCreate(&e0); cudaEventCreate(&e1); }
  cudaEventRecord(e0, s); run(iters); cudaEventRecord(e1, s); cudaEventSynchronize(e1);
  float ms; cudaEventElapsedTime(&ms, e0, e1);
  return ms * 1000 / iters;
}

// Prints "median (min max)" of `t`, sorting it.
inline void print_stats(std::vector<float>& t) {
  std::sort(t.begin(), t.end());
  printf("median %.3f (min %.3f max %.3f)\n", t[t.size() / 2], t[0], t.back());
}
