// Which part of the kernel code costs the ~0.1 us between a hand-written add and CubeCL's:
// access width (4 x 32-bit vs 1 x 128-bit per 16 bytes), block size, index math.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cstdio>
#include <vector>
#include <string>
#include <fstream>
#include <sstream>
#include <algorithm>
struct alignas(16) h8 { __half2 v[4]; };
__device__ __forceinline__ uint4 add128(uint4 x, uint4 y) {
  uint4 r; __half2* a = (__half2*)&x; __half2* b = (__half2*)&y; __half2* o = (__half2*)&r;
  for (int k = 0; k < 4; k++) o[k] = __hadd2(a[k], b[k]); return r;
}
// 4 x 32-bit accesses per thread (what nvcc makes of the struct copy)
template <int T> __global__ void __launch_bounds__(T) w32(const h8* __restrict__ a, const h8* __restrict__ b, h8* __restrict__ o, unsigned n) {
  unsigned i = blockIdx.x * T + threadIdx.x;
  if (i < n) { h8 x = a[i], y = b[i], r; for (int k = 0; k < 4; k++) r.v[k] = __hadd2(x.v[k], y.v[k]); o[i] = r; }
}
// one 128-bit access per thread
template <int T> __global__ void __launch_bounds__(T) w128(const uint4* __restrict__ a, const uint4* __restrict__ b, uint4* __restrict__ o, unsigned n) {
  unsigned i = blockIdx.x * T + threadIdx.x;
  if (i < n) o[i] = add128(a[i], b[i]);
}
// 128-bit, CubeCL's 3D index math
template <int T> __global__ void __launch_bounds__(T) w128idx(const uint4* __restrict__ a, const uint4* __restrict__ b, uint4* __restrict__ o, unsigned n) {
  unsigned i = (blockIdx.z * gridDim.x * T * gridDim.y) + blockIdx.y * gridDim.x * T + blockIdx.x * T + threadIdx.x;
  if (i < n) o[i] = add128(a[i], b[i]);
}
// 2 x 64-bit
template <int T> __global__ void __launch_bounds__(T) w64(const uint2* __restrict__ a, const uint2* __restrict__ b, uint2* __restrict__ o, unsigned n) {
  unsigned i = blockIdx.x * T + threadIdx.x;
  if (i < n) { uint2 x0 = a[2 * i], x1 = a[2 * i + 1], y0 = b[2 * i], y1 = b[2 * i + 1];
    uint4 r = add128(make_uint4(x0.x, x0.y, x1.x, x1.y), make_uint4(y0.x, y0.y, y1.x, y1.y));
    o[2 * i] = make_uint2(r.x, r.y); o[2 * i + 1] = make_uint2(r.z, r.w); }
}
// 32-bit coalesced: 4 words per thread strided by the block (each instruction fully coalesced)
template <int T> __global__ void __launch_bounds__(T) w32c(const __half2* __restrict__ a, const __half2* __restrict__ b, __half2* __restrict__ o, unsigned n) {
  unsigned base = blockIdx.x * T * 4 + threadIdx.x;
  __half2 x[4], y[4];
  for (int k = 0; k < 4; k++) { x[k] = a[base + k * T]; y[k] = b[base + k * T]; }
  for (int k = 0; k < 4; k++) o[base + k * T] = __hadd2(x[k], y[k]);
}
static std::string slurp(const char* p) { std::ifstream f(p, std::ios::binary); std::stringstream s; s << f.rdbuf(); return s.str(); }
int main(int argc, char** argv) {
  const size_t N = 4096ull * 4096; const unsigned nv = N / 8; const size_t bytes = N * 2;
  cudaFree(0);
  CUmodule mp; CUfunction fp;
  std::string ptx = slurp(argv[1]);
  if (cuModuleLoadData(&mp, ptx.c_str()) || cuModuleGetFunction(&fp, mp, "add_kernel_f_f16_n_8")) { printf("load failed\n"); return 1; }
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  h8* m[3]; for (int k = 0; k < 3; k++) cudaMallocAsync(&m[k], bytes, s);
  std::vector<__half> h(N); unsigned st = 1;
  for (int k = 0; k < 2; k++) { for (size_t i = 0; i < N; i++) { st = st * 1664525u + 1013904223u; h[i] = __float2half(((st >> 8) / 16777216.0f) * 2 - 1); } cudaMemcpy(m[k], h.data(), bytes, cudaMemcpyHostToDevice); }
  struct Info { unsigned sc[2]; unsigned meta[4]; } info = {{nv, nv}, {nv, nv, nv, 0}};
  void* params[4] = {&m[0], &m[1], &m[2], &info};
  const uint4 *a4 = (const uint4*)m[0], *b4 = (const uint4*)m[1]; uint4* o4 = (uint4*)m[2];
  const char* names[] = {"w32 x128 (torch-like hand)", "w32 x512", "w128 x128", "w128 x512", "w128 x512 cubecl index", "w64 x128", "w32 coalesced x128", "cubecl PTX x512"};
  const int nvar = 8;
  auto run = [&](int v, int iters) {
    for (int k = 0; k < iters; k++) switch (v) {
      case 0: w32<128><<<nv / 128, 128, 0, s>>>(m[0], m[1], m[2], nv); break;
      case 1: w32<512><<<nv / 512, 512, 0, s>>>(m[0], m[1], m[2], nv); break;
      case 2: w128<128><<<nv / 128, 128, 0, s>>>(a4, b4, o4, nv); break;
      case 3: w128<512><<<nv / 512, 512, 0, s>>>(a4, b4, o4, nv); break;
      case 4: w128idx<512><<<nv / 512, 512, 0, s>>>(a4, b4, o4, nv); break;
      case 5: w64<128><<<nv / 128, 128, 0, s>>>((const uint2*)a4, (const uint2*)b4, (uint2*)o4, nv); break;
      case 6: w32c<128><<<nv / 128, 128, 0, s>>>((const __half2*)a4, (const __half2*)b4, (__half2*)o4, nv); break;
      case 7: cuLaunchKernel(fp, nv / 512, 1, 1, 512, 1, 1, 0, s, params, nullptr); break;
    }
  };
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  std::vector<std::vector<float>> ev(nvar);
  auto report = [&](const char* tag) {
    for (int i = 0; i < nvar; i++) { auto& t = ev[i]; std::sort(t.begin(), t.end());
      printf("%s %-30s median %.3f (min %.3f max %.3f)\n", tag, names[i], t[t.size() / 2], t[0], t.back()); t.clear(); }
  };
  auto measure = [&]() {
    for (int round = 0; round < 4; round++)
      for (int j = 0; j < nvar; j++) {
        int i = (round & 1) ? nvar - 1 - j : j;
        run(i, 100); cudaStreamSynchronize(s);
        for (int sm = 0; sm < 3; sm++) {
          cudaEventRecord(e0, s); run(i, 500); cudaEventRecord(e1, s); cudaEventSynchronize(e1);
          float ms; cudaEventElapsedTime(&ms, e0, e1); ev[i].push_back(ms * 1000 / 500);
        }
      }
  };
  // Variants interleaved (order reversed every other round), twice before a graph capture.
  measure(); report("before");
  measure(); report("before2");
  cudaGraph_t gr; cudaGraphExec_t ge;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  for (int k = 0; k < 20; k++) cuLaunchKernel(fp, nv / 512, 1, 1, 512, 1, 1, 0, s, params, nullptr);
  cudaStreamEndCapture(s, &gr); cudaGraphInstantiate(&ge, gr, 0);
  for (int k = 0; k < 5; k++) cudaGraphLaunch(ge, s);
  cudaStreamSynchronize(s);
  measure(); report("after graph");
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
