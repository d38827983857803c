// Which part of the kernel code costs the ~0.1 us between a hand-written add and CubeCL's:
// access width (4 x 32-bit vs 1 x 128-bit per 16 bytes), block size, index math, plain vs
// read-only loads, vectors per thread, a persistent grid-stride loop; at a streaming size and at
// an L2-resident one.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cstdio>
#include <vector>
#include <string>
#include <fstream>
#include <sstream>
#include <algorithm>
#include <cstring>
#include <cstdlib>
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
// one 128-bit access per thread, no __restrict__ (plain LDG, as PyTorch's kernel issues)
template <int T> __global__ void __launch_bounds__(T) w128p(const uint4* a, const uint4* b, uint4* o, unsigned n) {
  unsigned i = blockIdx.x * T + threadIdx.x;
  if (i < n) o[i] = add128(a[i], b[i]);
}
// two 128-bit vectors per thread, block-strided, both loads of both issued first
template <int T> __global__ void __launch_bounds__(T) w128x2(const uint4* __restrict__ a, const uint4* __restrict__ b, uint4* __restrict__ o, unsigned n) {
  unsigned i = blockIdx.x * 2 * T + threadIdx.x, j = i + T;
  uint4 x0, y0, x1, y1;
  if (i < n) { x0 = a[i]; y0 = b[i]; }
  if (j < n) { x1 = a[j]; y1 = b[j]; }
  if (i < n) o[i] = add128(x0, y0);
  if (j < n) o[j] = add128(x1, y1);
}
// persistent grid-stride loop (grid = resident blocks), two vectors per trip
template <int T> __global__ void __launch_bounds__(T) w128gs(const uint4* __restrict__ a, const uint4* __restrict__ b, uint4* __restrict__ o, unsigned n) {
  unsigned stride = gridDim.x * T;
  for (unsigned i = blockIdx.x * T + threadIdx.x; i < n; i += 2 * stride) {
    unsigned j = i + stride;
    uint4 x0 = a[i], y0 = b[i], x1, y1;
    if (j < n) { x1 = a[j]; y1 = b[j]; }
    o[i] = add128(x0, y0);
    if (j < n) o[j] = add128(x1, y1);
  }
}
// persistent grid-stride loop, one vector per trip
template <int T> __global__ void __launch_bounds__(T) w128gs1(const uint4* __restrict__ a, const uint4* __restrict__ b, uint4* __restrict__ o, unsigned n) {
  unsigned stride = gridDim.x * T;
  for (unsigned i = blockIdx.x * T + threadIdx.x; i < n; i += stride) o[i] = add128(a[i], b[i]);
}
// persistent, each block a contiguous chunk of whole block-steps
template <int T> __global__ void __launch_bounds__(T) w128chunk(const uint4* __restrict__ a, const uint4* __restrict__ b, uint4* __restrict__ o, unsigned n) {
  unsigned steps = (n + T - 1) / T, per = (steps + gridDim.x - 1) / gridDim.x;
  unsigned s0 = blockIdx.x * per, s1 = min(steps, s0 + per);
  for (unsigned st = s0; st < s1; st++) { unsigned i = st * T + threadIdx.x; if (i < n) o[i] = add128(a[i], b[i]); }
}
static std::string slurp(const char* p) { std::ifstream f(p, std::ios::binary); std::stringstream s; s << f.rdbuf(); return s.str(); }
int main(int argc, char** argv) {
  cudaFree(0);
  CUmodule mp; CUfunction fp = nullptr;
  std::string ptx = slurp(argv[1]);
  // LOAD_LATE=1: load (JIT) the PTX module after the operands are allocated and filled, as
  // in_torch.py does, instead of before.
  const bool load_late = getenv("LOAD_LATE") != nullptr;
  auto load_module = [&]() {
    if (fp) return true;
    return !(cuModuleLoadData(&mp, ptx.c_str()) || cuModuleGetFunction(&fp, mp, "add_kernel_f_f16_n_8"));
  };
  if (!load_late && !load_module()) { printf("load failed\n"); return 1; }
  printf("module loaded %s\n", load_late ? "after the operands" : "before the operands");
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  const char* names[] = {"w32 x128 (torch-like hand)", "w32 x512", "w128 x128", "w128 x512", "w128 x512 cubecl index", "w64 x128", "w32 coalesced x128", "cubecl PTX x512",
                         "w128 x128 no restrict", "w128 x256 2 per unit", "w128 x256 grid-stride", "w128 x128 2 per unit",
                         "gs1 x256 1024 blocks", "gs1 x256 sms*8", "gs1 x128 sms*16", "gs1 x512 sms*4", "gs1 x256 sms*4",
                         "chunk x256 sms*8", "chunk x512 sms*4", "gs2 x256 1024 blocks"};
  const int nvar = 20;
  // ONLY=7,0: time just these variants (does interleaving with the others change them?).
  std::vector<int> active;
  if (const char* only = getenv("ONLY")) { for (const char* p = only; *p;) { active.push_back(atoi(p)); while (*p && *p != ',') p++; if (*p) p++; } }
  else for (int i = 0; i < nvar; i++) active.push_back(i);
  const int nact = active.size();
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  // The streaming size (96 MB at f16) and one whose operands stay in the 50 MB L2 (36 MB).
  for (size_t rows : {4096ull, 1536ull}) {
  const size_t N = 4096ull * rows; const unsigned nv = N / 8; const size_t bytes = N * 2;
  h8* m[3]; for (int k = 0; k < 3; k++) cudaMallocAsync(&m[k], bytes, s);
  cudaStreamSynchronize(s);
  std::vector<__half> h(N); unsigned st = 1;
  for (int k = 0; k < 2; k++) { for (size_t i = 0; i < N; i++) { st = st * 1664525u + 1013904223u; h[i] = __float2half(((st >> 8) / 16777216.0f) * 2 - 1); } cudaMemcpy(m[k], h.data(), bytes, cudaMemcpyHostToDevice); }
  if (!load_module()) { printf("load failed\n"); return 1; }
  struct Info { unsigned sc[2]; unsigned meta[4]; } info = {{nv, nv}, {nv, nv, nv, 0}};
  void* params[4] = {&m[0], &m[1], &m[2], &info};
  const uint4 *a4 = (const uint4*)m[0], *b4 = (const uint4*)m[1]; uint4* o4 = (uint4*)m[2];
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
      case 8: w128p<128><<<nv / 128, 128, 0, s>>>(a4, b4, o4, nv); break;
      case 9: w128x2<256><<<nv / 512, 256, 0, s>>>(a4, b4, o4, nv); break;
      case 10: w128gs<256><<<sms * 8, 256, 0, s>>>(a4, b4, o4, nv); break;
      case 11: w128x2<128><<<nv / 256, 128, 0, s>>>(a4, b4, o4, nv); break;
      case 12: w128gs1<256><<<1024, 256, 0, s>>>(a4, b4, o4, nv); break;
      case 13: w128gs1<256><<<sms * 8, 256, 0, s>>>(a4, b4, o4, nv); break;
      case 14: w128gs1<128><<<sms * 16, 128, 0, s>>>(a4, b4, o4, nv); break;
      case 15: w128gs1<512><<<sms * 4, 512, 0, s>>>(a4, b4, o4, nv); break;
      case 16: w128gs1<256><<<sms * 4, 256, 0, s>>>(a4, b4, o4, nv); break;
      case 17: w128chunk<256><<<sms * 8, 256, 0, s>>>(a4, b4, o4, nv); break;
      case 18: w128chunk<512><<<sms * 4, 512, 0, s>>>(a4, b4, o4, nv); break;
      case 19: w128gs<256><<<1024, 256, 0, s>>>(a4, b4, o4, nv); break;
    }
  };
  std::vector<std::vector<float>> ev(nvar);
  auto report = [&](const char* tag) {
    for (int i : active) { auto& t = ev[i]; std::sort(t.begin(), t.end());
      printf("%s 4096x%zu %-30s median %.3f (min %.3f max %.3f)\n", tag, rows, names[i], t[t.size() / 2], t[0], t.back()); t.clear(); }
  };
  auto measure = [&]() {
    for (int round = 0; round < 4; round++)
      for (int j = 0; j < nact; j++) {
        int i = active[(round & 1) ? nact - 1 - j : j];
        run(i, 100); cudaStreamSynchronize(s);
        for (int sm = 0; sm < 3; sm++) {
          cudaEventRecord(e0, s); run(i, 500); cudaEventRecord(e1, s); cudaEventSynchronize(e1);
          float ms; cudaEventElapsedTime(&ms, e0, e1); ev[i].push_back(ms * 1000 / 500);
        }
      }
  };
  // Every variant's output checked against the first one's.
  std::vector<__half> want(N), got(N);
  // (on stream s throughout: it does not synchronize with the legacy stream)
  auto output_of = [&](int v, std::vector<__half>& dst) {
    cudaMemsetAsync(m[2], 0, bytes, s); run(v, 1);
    cudaMemcpyAsync(dst.data(), m[2], bytes, cudaMemcpyDeviceToHost, s); cudaStreamSynchronize(s);
  };
  output_of(0, want);
  for (int v : active) {
    output_of(v, got);
    if (memcmp(want.data(), got.data(), bytes)) printf("MISMATCH %s\n", names[v]);
  }
  // Variants interleaved (order reversed every other round), twice before a graph capture.
  measure(); report("before");
  measure(); report("before2");
  if (rows == 4096) {
    cudaGraph_t gr; cudaGraphExec_t ge;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    for (int k = 0; k < 20; k++) cuLaunchKernel(fp, nv / 512, 1, 1, 512, 1, 1, 0, s, params, nullptr);
    cudaStreamEndCapture(s, &gr); cudaGraphInstantiate(&ge, gr, 0);
    for (int k = 0; k < 5; k++) cudaGraphLaunch(ge, s);
    cudaStreamSynchronize(s);
    measure(); report("after graph");
  }
  for (int k = 0; k < 3; k++) cudaFreeAsync(m[k], s);
  cudaStreamSynchronize(s);
  }
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
