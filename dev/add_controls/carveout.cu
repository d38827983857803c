// Does the decode attention's shared memory keep it from starting beside the qkv projection?
//
// An SM's split between L1 and shared memory is one setting for every cube resident on it. The
// decode attention's cubes take 206 KB of shared memory (two 128-key K/V stages and the planes'
// merge buffers); the GEMV-like qkv cubes before it take almost none, and the driver may run
// them under a small carveout. If an SM can change its carveout only once it has no resident
// cube, the attention's cubes, launched early under programmatic dependent launch to queue their
// keys and values, cannot start on an SM until the qkv cubes there have all left.
//
// Synthetic chain of fused_attention_o.cu (28 layers: qkv, the clustered attention stand-in, o,
// gate-up, down, with the step's grids and bytes), the attention stand-in launched with 43 KB
// of shared memory (what it uses) or 206 KB (the real kernel's; the rest unused). With `max`
// as the argument every GEMV-like stage asks for the largest shared-memory carveout
// (`cudaFuncAttributePreferredSharedMemoryCarveout` = 100), so that an SM that runs them can
// take an attention cube without a change. µs a layer, medians of alternating rounds.
#include "attention_stand_in.cuh"

#ifdef __CUDACC_RTC__
// NVRTC (dev/cuda_compile/check.py) compiles the kernels only.
template __global__ void attention<0, 8>(const uint4*, unsigned, const uint4*, unsigned, const float*, unsigned, float*);
template __global__ void stage<0, 0>(const uint4*, unsigned, const float*, unsigned, float*, unsigned*, int, int, unsigned, int, int);
#else
#include "chain_host.cuh"

int main(int argc, char** argv) {
  const bool max_carveout = argc > 1 && !strcmp(argv[1], "max");
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  const int NV = 2;
  const char* names[NV] = {"attention with 43 KB", "attention with 206 KB"};
  uint4 *w, *kv;
  chain_weights(&w, &kv);
  const int per = 5;
  float* ys = ones((size_t)kLayers * per * 2048);
  const size_t smem[NV] = {kStandInSmem, 206 * 1024};
  cudaFuncSetAttribute(attention<0, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem[1]);
  if (max_carveout)
    cudaFuncSetAttribute(stage<0, 0>, cudaFuncAttributePreferredSharedMemoryCarveout, 100);
  printf("stages' carveout: %s\n", max_carveout ? "max shared" : "the driver's choice");
  for (int sh = 0; sh < 2; sh++) {
    cudaGraphExec_t exec[NV];
    for (int v = 0; v < NV; v++) {
      cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
      ChainCursor c{s, w, ys, ys + (size_t)(kLayers * per - 1) * 2048, kDown[sh].grid};
      for (int l = 0; l < kLayers; l++) c.layer(sh, l, kv, smem[v]);
      if (!end_capture(s, &exec[v])) return 1;
    }
    time_variants(s, kShapeNames[sh], names, NV, exec, "CARVEOUT_ROUNDS");
  }
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
#endif
