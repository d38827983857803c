// Programmatic dependent launch: does letting the next add launch during the previous one's tail
// shorten an eager f16 add loop? Kernels wait (griddepcontrol.wait) before any global access;
// "trigger" variants also let their dependents launch early (griddepcontrol.launch_dependents).
// Three settings: the add in a loop of itself, after an add on another operand set, and a chain
// where each add reads the previous one's output (checked bit for bit against plain launches).
// The result is why the patched runtime (vendor/cubecl-cuda/PATCHED.md) launches with PDL.
#include "common.cuh"
// TRIG: 0 none (implicit at exit), 1 trigger right after the wait, 2 trigger before the wait
template <int WAIT, int TRIG>
__global__ void __launch_bounds__(512) addk(const uint4* a, const uint4* b, uint4* o, unsigned n) {
  if (TRIG == 2) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (WAIT) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (TRIG == 1) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  unsigned i = blockIdx.x * 512 + threadIdx.x;
  if (i < n) o[i] = add128(a[i], b[i]);
}
const char* names[] = {"plain", "pdl wait, no trigger", "pdl wait, trigger after", "pdl trigger, wait", "wait kernel no attr"};
const int nvar = 5;
void launch(int v, const uint4* a, const uint4* b, uint4* o, unsigned nv, cudaStream_t s) {
  cudaLaunchConfig_t cfg = {}; cfg.gridDim = dim3((nv + 511) / 512); cfg.blockDim = dim3(512); cfg.stream = s;
  cudaLaunchAttribute at[1]; at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization; at[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = at; cfg.numAttrs = (v >= 1 && v <= 3) ? 1 : 0;
  switch (v) {
    case 0: cudaLaunchKernelEx(&cfg, addk<0, 0>, a, b, o, nv); break;
    case 1: cudaLaunchKernelEx(&cfg, addk<1, 0>, a, b, o, nv); break;
    case 2: cudaLaunchKernelEx(&cfg, addk<1, 1>, a, b, o, nv); break;
    case 3: cudaLaunchKernelEx(&cfg, addk<1, 2>, a, b, o, nv); break;
    case 4: cudaLaunchKernelEx(&cfg, addk<1, 0>, a, b, o, nv); break;
  }
}
int main() {
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  for (size_t rows : {4096ull, 1536ull, 1ull}) {
    const size_t N = (rows == 1 ? 8960ull : 4096ull * rows); const unsigned nv = N / 8; const size_t bytes = N * 2;
    uint4* m[6]; alloc_operands(m, 6, {0, 1, 3, 4}, N, s);
    // A chain of 40 dependent adds (x += b over two buffers) must match plain launches.
    check_variants(names, nvar, N, [&](int v, std::vector<__half>& dst) {
      cudaMemcpyAsync(m[5], m[0], bytes, cudaMemcpyDeviceToDevice, s);
      for (int k = 0; k < 20; k++) { launch(v, m[5], m[1], m[2], nv, s); launch(v, m[2], m[1], m[5], nv, s); }
      cudaMemcpyAsync(dst.data(), m[5], bytes, cudaMemcpyDeviceToHost, s); cudaStreamSynchronize(s);
    });
    // The pair's other operand set is a copy of the first (and m[3] restarts the chain below).
    for (int k : {3, 4}) cudaMemcpy(m[k], m[k - 3], bytes, cudaMemcpyDeviceToDevice);
    const int modes = 3;  // self, pair, chain (each add reads the previous one's output)
    std::vector<float> ev[modes][nvar];
    int iters = rows == 1 ? 2000 : 400;
    for (int round = 0; round < 6; round++)
      for (int mode = 0; mode < modes; mode++)
        for (int j = 0; j < nvar; j++) {
          int v = (round & 1) ? nvar - 1 - j : j;
          auto run = [&](int it) {
            for (int k = 0; k < it; k++) {
              if (mode == 0) launch(v, m[0], m[1], m[2], nv, s);
              else if (mode == 1) { launch(v, m[3], m[4], m[5], nv, s); launch(v, m[0], m[1], m[2], nv, s); }
              else { launch(v, m[0], m[1], m[2], nv, s); launch(v, m[2], m[1], m[0], nv, s); }
            }
          };
          // The chain adds b to x again and again: restart x from the operands (m[3] holds a
          // copy) so that 2500 adds stay finite in f16.
          if (mode == 2) cudaMemcpyAsync(m[0], m[3], bytes, cudaMemcpyDeviceToDevice, s);
          run(50); cudaStreamSynchronize(s);
          for (int sm = 0; sm < 3; sm++) ev[mode][v].push_back(time_per_iter(s, iters, run) / (mode ? 2 : 1));
        }
    const char* mn[] = {"self", "pair", "chain"};
    for (int mode = 0; mode < modes; mode++)
      for (int v = 0; v < nvar; v++) {
        printf("%zu elems %-6s %-26s per add ", N, mn[mode], names[v]);
        print_stats(ev[mode][v]);
      }
    for (int k = 0; k < 6; k++) cudaFreeAsync(m[k], s);
    cudaStreamSynchronize(s);
  }
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
