// Hand-written f16 adds (4096 x 4096 / 8 vectors of 16 bytes) with C names, compiled to PTX for
// in_torch.py, which launches them inside PyTorch's process beside torch.add.
#include <cuda_fp16.h>
#include <cstdint>
struct alignas(16) h8 { __half2 v[4]; };
__device__ __forceinline__ uint4 add128(uint4 x, uint4 y) {
  uint4 r; __half2* a = (__half2*)&x; __half2* b = (__half2*)&y; __half2* o = (__half2*)&r;
  for (int k = 0; k < 4; k++) o[k] = __hadd2(a[k], b[k]); return r;
}
// 4 x 32-bit accesses per thread (what nvcc makes of the struct copy), 128 threads
extern "C" __global__ void __launch_bounds__(128) w32_128(const h8* __restrict__ a, const h8* __restrict__ b, h8* __restrict__ o, unsigned n) {
  unsigned i = blockIdx.x * 128 + threadIdx.x;
  if (i < n) { h8 x = a[i], y = b[i], r; for (int k = 0; k < 4; k++) r.v[k] = __hadd2(x.v[k], y.v[k]); o[i] = r; }
}
// one 128-bit access per thread, 128 and 512 threads
extern "C" __global__ void __launch_bounds__(128) w128_128(const uint4* __restrict__ a, const uint4* __restrict__ b, uint4* __restrict__ o, unsigned n) {
  unsigned i = blockIdx.x * 128 + threadIdx.x;
  if (i < n) o[i] = add128(a[i], b[i]);
}
extern "C" __global__ void __launch_bounds__(512) w128_512(const uint4* __restrict__ a, const uint4* __restrict__ b, uint4* __restrict__ o, unsigned n) {
  unsigned i = blockIdx.x * 512 + threadIdx.x;
  if (i < n) o[i] = add128(a[i], b[i]);
}
