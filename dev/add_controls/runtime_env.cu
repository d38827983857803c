// Does the runtime environment (allocator, stream kind, parameter block size, how fast the host
// queues launches) change the eager
// time of one torch-shaped f16 add (4096x4096, 128 threads x 16-byte vectors)? CubeCL allocates
// with cuMemAllocAsync from the default pool on a non-blocking stream; PyTorch uses cudaMalloc on
// the legacy default stream.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cstdio>
#include <vector>
#include <algorithm>
#include <chrono>
struct alignas(16) h8 { __half2 v[4]; };
struct Big { unsigned long long w[40]; };
__global__ void __launch_bounds__(128) addk(const h8* __restrict__ a, const h8* __restrict__ b, h8* __restrict__ o, unsigned n) {
  unsigned i = blockIdx.x * 128 + threadIdx.x;
  if (i < n) { h8 x = a[i], y = b[i], r; for (int k = 0; k < 4; k++) r.v[k] = __hadd2(x.v[k], y.v[k]); o[i] = r; }
}
__global__ void __launch_bounds__(128) addbig(const h8* __restrict__ a, const h8* __restrict__ b, h8* __restrict__ o, unsigned n, Big big) {
  unsigned i = blockIdx.x * 128 + threadIdx.x;
  if (i < n + (unsigned)big.w[39]) { h8 x = a[i], y = b[i], r; for (int k = 0; k < 4; k++) r.v[k] = __hadd2(x.v[k], y.v[k]); o[i] = r; }
}
// usize-style index (64-bit), like CubeCL's ABSOLUTE_POS as usize, with 512 threads
__global__ void __launch_bounds__(512) add64(const h8* __restrict__ a, const h8* __restrict__ b, h8* __restrict__ o, unsigned long long n) {
  unsigned long long i = (unsigned long long)blockIdx.x * 512 + threadIdx.x;
  if (i < n) { h8 x = a[i], y = b[i], r; for (int k = 0; k < 4; k++) r.v[k] = __hadd2(x.v[k], y.v[k]); o[i] = r; }
}
static void fill(h8* p, size_t n_half, unsigned seed) {
  std::vector<__half> h(n_half);
  unsigned s = seed;
  for (size_t i = 0; i < n_half; i++) { s = s * 1664525u + 1013904223u; h[i] = __float2half(((s >> 8) / 16777216.0f) * 2 - 1); }
  cudaMemcpy(p, h.data(), n_half * 2, cudaMemcpyHostToDevice);
}
int main() {
  const size_t N = 4096ull * 4096; const unsigned nv = N / 8; const size_t bytes = N * 2;
  cudaStream_t nb; cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking);
  cudaStream_t legacy = 0;
  // operand sets
  h8 *ma[3], *aa[3], *ca[3];
  for (int k = 0; k < 3; k++) cudaMalloc(&ma[k], bytes);
  for (int k = 0; k < 3; k++) cudaMallocAsync(&aa[k], bytes, nb);
  h8* big; cudaMallocAsync(&big, 3 * bytes + 3 * 4096, nb);
  for (int k = 0; k < 3; k++) ca[k] = (h8*)((char*)big + k * (bytes + 4096));
  cudaStreamSynchronize(nb);
  for (int k = 0; k < 2; k++) { fill(ma[k], N, 7 + k); fill(aa[k], N, 7 + k); fill(ca[k], N, 7 + k); }
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  const int iters = 500;
  Big bg = {}; 
  struct V { const char* name; h8** m; cudaStream_t* s; int kern; double pace_us = 0; };
  V vs[] = {
    {"cudaMalloc legacy", ma, &legacy, 0},
    {"cudaMalloc nonblocking", ma, &nb, 0},
    {"mallocAsync nonblocking", aa, &nb, 0},
    {"mallocAsync legacy", aa, &legacy, 0},
    {"carved async nonblocking", ca, &nb, 0},
    {"cudaMalloc nb 320B params", ma, &nb, 1},
    {"mallocAsync nb 320B params", aa, &nb, 1},
    {"cudaMalloc nb u64 x512", ma, &nb, 2},
    {"mallocAsync nb u64 x512", aa, &nb, 2},
    // Launches paced by the host (a busy wait after each), as a Python loop spaces them.
    {"cudaMalloc legacy paced 5us", ma, &legacy, 0, 5},
    {"cudaMalloc legacy paced 15us", ma, &legacy, 0, 15},
    {"mallocAsync nb paced 5us", aa, &nb, 0, 5},
    {"mallocAsync nb paced 15us", aa, &nb, 0, 15},
  };
  const int nvar = sizeof(vs) / sizeof(vs[0]);
  std::vector<std::vector<float>> ev(nvar), wall(nvar);
  auto run = [&](V& v) {
    cudaStream_t s = *v.s;
    auto start = std::chrono::steady_clock::now();
    for (int k = 0; k < iters; k++) {
      if (v.pace_us > 0)
        while (std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() < k * v.pace_us) {}
      if (v.kern == 0) addk<<<nv / 128, 128, 0, s>>>(v.m[0], v.m[1], v.m[2], nv);
      else if (v.kern == 1) addbig<<<nv / 128, 128, 0, s>>>(v.m[0], v.m[1], v.m[2], nv, bg);
      else add64<<<nv / 512, 512, 0, s>>>(v.m[0], v.m[1], v.m[2], nv);
    }
  };
  for (int round = 0; round < 6; round++) {
    for (int j = 0; j < nvar; j++) {
      int i = (round & 1) ? nvar - 1 - j : j;
      V& v = vs[i];
      run(v); cudaStreamSynchronize(*v.s);
      for (int sm = 0; sm < 3; sm++) {
        auto t0 = std::chrono::steady_clock::now();
        cudaEventRecord(e0, *v.s); run(v); cudaEventRecord(e1, *v.s); cudaEventSynchronize(e1);
        auto t1 = std::chrono::steady_clock::now();
        float ms; cudaEventElapsedTime(&ms, e0, e1); ev[i].push_back(ms * 1000 / iters);
        wall[i].push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / iters);
      }
    }
  }
  for (int i = 0; i < nvar; i++) {
    auto& t = ev[i]; std::sort(t.begin(), t.end()); auto& w = wall[i]; std::sort(w.begin(), w.end());
    printf("%-28s events median %.3f (min %.3f max %.3f)  wall median %.3f us/launch\n", vs[i].name, t[t.size() / 2], t[0], t.back(), w[w.size() / 2]);
  }
  printf("ptrs: malloc %p %p %p async %p %p %p\n", ma[0], ma[1], ma[2], aa[0], aa[1], aa[2]);
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
