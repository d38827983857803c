// Part of the LM head's weight kept in L2 across decode steps: what would it save?
//
// A decode step reads every weight once (2.2 GB in W8A8, 3.6 GB in bf16), far more than the
// H100's 50 MB L2, so every byte comes from DRAM each step, though the weights are the same
// bytes every step. The GPU can set aside part of L2 for "persisting" lines
// (`cudaLimitPersistingL2CacheSize`), which normal and streaming accesses do not evict: lines
// brought in by a launch whose access-policy window covers them (`hitProp` persisting), or by
// loads with an `L2::evict_last` cache policy. If a fixed slice of the LM head (one
// bandwidth-bound GEMV of 233 MB at 8 bits, 467 MB in bf16) stayed there, each step would read
// that slice from L2 instead of DRAM: about 10 µs a step for 30 MB at 3 TB/s, 1% of an 8-bit step.
// Does it stay, and does the set-aside slow the rest of the step?
//
// Synthetic, like fused_attention_o.cu: 28 layers of GEMV-like stages with the 1.5B decode
// step's grids and weight bytes and the clustered attention stand-in, then the LM head as one
// more GEMV-like stage at its real size (grid 9 496 at 8 bits, 18 992 in bf16, 6 vectors a lane).
// Captured once into a CUDA graph with programmatic edges, replayed; µs a step, medians over
// rounds that alternate the variants. Before each variant's rounds the persisting lines are
// reset and the set-aside is set as the variant needs; the warm-up replays fill it.
//
// Variants: "none" with no set-aside (the GPU's default) or 8 MB, 16 MB or the largest set aside
// and unused; "window N MB" (the head's launch with an access-policy window over its first N MB,
// persisting hits and streaming misses) with N MB set aside; "evict_last max + evict_first rest"
// (no window: the head's cubes over its first bytes load with an `L2::evict_last` policy, the
// others with `L2::evict_first`); "evict_last max, no set-aside" (the first without a set-aside).
#include "chain.cuh"

// Loads of the head stage: HINT 0 plain; 1 an evict_last policy in the cubes below
// `hint_cubes`; 2 that, and an evict_first policy in the others.
template <int HINT>
__device__ __forceinline__ uint4 load_hinted(const uint4* p, bool last) {
  if (HINT == 0 || (HINT == 1 && !last)) return *p;
  unsigned long long pol;
  if (last)
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  else
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  uint4 v;
  asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(pol));
  return v;
}

// chain.cuh's stage<0, 0> with hinted loads (the LM head).
template <int HINT>
__global__ void __launch_bounds__(256) head_stage(const uint4* __restrict__ w, unsigned vpt, const float* x,
                                                  unsigned x_len, float* y, unsigned hint_cubes) {
  const bool last = blockIdx.x < hint_cubes;
  const uint4* p = w + (size_t)blockIdx.x * vpt * 256 + threadIdx.x;
  uint4 first = load_hinted<HINT>(p, last);
  wait_after(first.x * 3u);
  float xv = x[(blockIdx.x * 256 + threadIdx.x) % x_len];
  float acc = dotw(first, xv);
  for (unsigned i = 1; i < vpt; i++) acc += dotw(load_hinted<HINT>(p + (size_t)i * 256, last), xv);
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  cube_sum_store(acc, y);
}

#ifdef __CUDACC_RTC__
// NVRTC (dev/cuda_compile/check.py) compiles the kernels only.
template __global__ void head_stage<0>(const uint4*, unsigned, const float*, unsigned, float*, unsigned);
template __global__ void head_stage<1>(const uint4*, unsigned, const float*, unsigned, float*, unsigned);
template __global__ void head_stage<2>(const uint4*, unsigned, const float*, unsigned, float*, unsigned);
#else
#include "chain_host.cuh"

namespace {

// The LM head at 8 bits and in bf16: 151 936 x 1 536 weights.
constexpr Stage kHead[2] = {{9496, 6}, {18992, 6}};

struct Variant {
  const char* name;
  int hint;          // head_stage's HINT
  double window;     // MB of access-policy window (0: none; < 0: the largest)
  double hinted;     // MB of evict_last cubes (< 0: the largest)
  double set_aside;  // MB of persisting set-aside (< 0: the largest)
};

}  // namespace

int main() {
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  int max_persist = 0, max_window = 0;
  cudaDeviceGetAttribute(&max_persist, cudaDevAttrMaxPersistingL2CacheSize, 0);
  cudaDeviceGetAttribute(&max_window, cudaDevAttrMaxAccessPolicyWindowSize, 0);
  const size_t largest = std::min((size_t)max_persist, (size_t)max_window);
  printf("persisting L2 set-aside at most %.1f MB, access-policy window at most %.1f MB\n", max_persist / 1e6,
         max_window / 1e6);
  const Variant vs[] = {{"none, no set-aside", 0, 0, 0, 0},
                        {"none, 8 MB set aside", 0, 0, 0, 8},
                        {"none, 16 MB set aside", 0, 0, 0, 16},
                        {"none, max set aside", 0, 0, 0, -1},
                        {"window 8 MB, 8 MB set aside", 0, 8, 0, 8},
                        {"window 16 MB, 16 MB set aside", 0, 16, 0, 16},
                        {"window max, max set aside", 0, -1, 0, -1},
                        {"evict_last max + evict_first rest", 2, 0, -1, -1},
                        {"evict_last max, no set-aside", 1, 0, -1, 0}};
  const int NV = sizeof(vs) / sizeof(vs[0]);
  uint4 *w, *kv;
  chain_weights(&w, &kv);
  uint4* head;
  const size_t head_vecs = (size_t)kHead[1].grid * 256 * kHead[1].vpt;
  cudaMalloc(&head, head_vecs * 16);
  cudaMemcpy(head, w, head_vecs * 16, cudaMemcpyDeviceToDevice);
  const int per = 5;
  float* ys = ones((size_t)kLayers * per * 2048);
  float* head_out = ones(kHead[1].grid);
  cudaFuncSetAttribute(attention<0, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kStandInSmem);
  cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, largest);
  for (int sh = 0; sh < 2; sh++) {
    const Stage hd = kHead[sh];
    const size_t cube_bytes = (size_t)hd.vpt * 256 * 16;
    cudaGraphExec_t exec[NV];
    for (int v = 0; v < NV; v++) {
      cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
      ChainCursor c{s, w, ys, ys + (size_t)(kLayers * per - 1) * 2048, kDown[sh].grid};
      for (int l = 0; l < kLayers; l++) c.layer(sh, l, kv, kStandInSmem);
      const double hinted_mb = vs[v].hinted < 0 ? largest / 1e6 : vs[v].hinted;
      const unsigned hint_cubes = (unsigned)(hinted_mb * 1e6 / cube_bytes);
      cudaLaunchConfig_t cfg = {}; cfg.gridDim = dim3(hd.grid); cfg.blockDim = dim3(256); cfg.stream = s;
      cudaLaunchAttribute at[2];
      at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      at[0].val.programmaticStreamSerializationAllowed = 1;
      cfg.attrs = at; cfg.numAttrs = 1;
      if (vs[v].window != 0) {
        at[1].id = cudaLaunchAttributeAccessPolicyWindow;
        at[1].val.accessPolicyWindow.base_ptr = head;
        at[1].val.accessPolicyWindow.num_bytes = vs[v].window < 0 ? largest : (size_t)(vs[v].window * 1e6);
        at[1].val.accessPolicyWindow.hitRatio = 1.0f;
        at[1].val.accessPolicyWindow.hitProp = cudaAccessPropertyPersisting;
        at[1].val.accessPolicyWindow.missProp = cudaAccessPropertyStreaming;
        cfg.numAttrs = 2;
      }
      auto kern = vs[v].hint == 0 ? head_stage<0> : vs[v].hint == 1 ? head_stage<1> : head_stage<2>;
      cudaLaunchKernelEx(&cfg, kern, (const uint4*)head, hd.vpt, (const float*)c.prev, c.prev_len, head_out,
                         hint_cubes);
      if (!end_capture(s, &exec[v])) return 1;
    }
    const int rounds = getenv("L2P_ROUNDS") ? atoi(getenv("L2P_ROUNDS")) : 8;
    std::vector<std::vector<float>> t(NV);
    for (int round = 0; round < rounds; round++)
      for (int j = 0; j < NV; j++) {
        const int v = (round & 1) ? NV - 1 - j : j;
        cudaStreamSynchronize(s);
        cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize,
                           vs[v].set_aside < 0 ? largest : (size_t)(vs[v].set_aside * 1e6));
        cudaCtxResetPersistingL2Cache();
        auto run = [&](int it) { for (int k = 0; k < it; k++) cudaGraphLaunch(exec[v], s); };
        run(5); cudaStreamSynchronize(s);
        t[v].push_back(time_per_iter(s, 40, run));
      }
    printf("%s (the LM head %.0f MB), us a step:\n", kShapeNames[sh], hd.grid * cube_bytes / 1e6);
    for (int v = 0; v < NV; v++) { printf("  %-36s ", vs[v].name); print_stats(t[v]); }
    for (int v = 0; v < NV; v++) cudaGraphExecDestroy(exec[v]);
  }
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
#endif
