// Do L2 prefetch-size and L1 hints on the loads make a streaming f16 add faster, without the
// context dependence of evict-first (.cs) lines? Each variant is timed in three settings: in a
// loop of itself at 4096 x 4096 (96 MB, streams from DRAM), after a plain add on another operand
// set (as in a model, where the L2 holds ordinary lines), and in a loop of itself at 4096 x 1536
// (operands stay in the 50 MB L2).
#include "common.cuh"
#define LD(name, op)                                                                              \
  __device__ __forceinline__ uint4 name(const uint4* p) {                                         \
    uint4 v; asm volatile(op " {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) \
                          : "l"(p));                                                              \
    return v;                                                                                     \
  }
LD(ld_plain, "ld.global.v4.u32")
LD(ld_128b, "ld.global.L2::128B.v4.u32")
LD(ld_256b, "ld.global.L2::256B.v4.u32")
LD(ld_noalloc, "ld.global.L1::no_allocate.v4.u32")
LD(ld_noalloc_256b, "ld.global.L1::no_allocate.L2::256B.v4.u32")
LD(ld_nc_256b, "ld.global.nc.L1::no_allocate.L2::256B.v4.u32")
template <uint4 (*L)(const uint4*), int T>
__global__ void __launch_bounds__(T) addk(const uint4* a, const uint4* b, uint4* o, unsigned n) {
  unsigned i = blockIdx.x * T + threadIdx.x;
  if (i < n) o[i] = add128(L(a + i), L(b + i));
}
// two vectors per unit, block-strided, all four loads first
template <uint4 (*L)(const uint4*), int T>
__global__ void __launch_bounds__(T) addk2(const uint4* a, const uint4* b, uint4* o, unsigned n) {
  unsigned i = blockIdx.x * 2 * T + threadIdx.x, j = i + T;
  uint4 x0, y0, x1, y1;
  if (i < n) { x0 = L(a + i); y0 = L(b + i); }
  if (j < n) { x1 = L(a + j); y1 = L(b + j); }
  if (i < n) o[i] = add128(x0, y0);
  if (j < n) o[j] = add128(x1, y1);
}
const char* names[] = {"plain x512", "L2::128B x512", "L2::256B x512", "L1::no_allocate x512",
                       "no_alloc+256B x512", "nc+no_alloc+256B x512", "plain x128", "L2::256B x128",
                       "2/unit plain x256", "2/unit L2::256B x256"};
const int nvar = 10;
void launch(int v, const uint4* a, const uint4* b, uint4* o, unsigned nv, cudaStream_t s) {
  switch (v) {
    case 0: addk<ld_plain, 512><<<(nv + 511) / 512, 512, 0, s>>>(a, b, o, nv); break;
    case 1: addk<ld_128b, 512><<<(nv + 511) / 512, 512, 0, s>>>(a, b, o, nv); break;
    case 2: addk<ld_256b, 512><<<(nv + 511) / 512, 512, 0, s>>>(a, b, o, nv); break;
    case 3: addk<ld_noalloc, 512><<<(nv + 511) / 512, 512, 0, s>>>(a, b, o, nv); break;
    case 4: addk<ld_noalloc_256b, 512><<<(nv + 511) / 512, 512, 0, s>>>(a, b, o, nv); break;
    case 5: addk<ld_nc_256b, 512><<<(nv + 511) / 512, 512, 0, s>>>(a, b, o, nv); break;
    case 6: addk<ld_plain, 128><<<(nv + 127) / 128, 128, 0, s>>>(a, b, o, nv); break;
    case 7: addk<ld_256b, 128><<<(nv + 127) / 128, 128, 0, s>>>(a, b, o, nv); break;
    case 8: addk2<ld_plain, 256><<<(nv + 511) / 512, 256, 0, s>>>(a, b, o, nv); break;
    case 9: addk2<ld_256b, 256><<<(nv + 511) / 512, 256, 0, s>>>(a, b, o, nv); break;
  }
}
int main() {
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  for (size_t rows : {4096ull, 1536ull}) {
    const size_t N = 4096ull * rows; const unsigned nv = N / 8; const size_t bytes = N * 2;
    // two operand sets: A (0, 1 -> 2) for the candidate, B (3, 4 -> 5) for the plain add that
    // precedes it in "pair"
    uint4* m[6]; alloc_operands(m, 6, {0, 1, 3, 4}, N, s);
    check_variants(names, nvar, N, [&](int v, std::vector<__half>& dst) {
      cudaMemsetAsync(m[2], 0, bytes, s); launch(v, m[0], m[1], m[2], nv, s);
      cudaMemcpyAsync(dst.data(), m[2], bytes, cudaMemcpyDeviceToHost, s); cudaStreamSynchronize(s);
    });
    const int modes = rows == 4096 ? 2 : 1;
    std::vector<float> ev[2][nvar];
    for (int round = 0; round < 6; round++)
      for (int mode = 0; mode < modes; mode++)
        for (int j = 0; j < nvar; j++) {
          int v = (round & 1) ? nvar - 1 - j : j;
          auto run = [&](int iters) {
            for (int k = 0; k < iters; k++) {
              if (mode == 1) launch(0, m[3], m[4], m[5], nv, s);
              launch(v, m[0], m[1], m[2], nv, s);
            }
          };
          run(50); cudaStreamSynchronize(s);
          for (int sm = 0; sm < 3; sm++) ev[mode][v].push_back(time_per_iter(s, 400, run));
        }
    for (int mode = 0; mode < modes; mode++)
      for (int v = 0; v < nvar; v++) {
        printf("4096x%zu %-6s %-24s ", rows, mode ? "pair" : "self", names[v]);
        print_stats(ev[mode][v]);
      }
    for (int k = 0; k < 6; k++) cudaFreeAsync(m[k], s);
    cudaStreamSynchronize(s);
  }
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
