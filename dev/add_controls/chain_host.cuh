// Host side of the synthetic decode chains with an attention stand-in (fused_attention_o.cu,
// fused_mlp.cu, carveout.cu, persistent_step.cu): the 1.5B step's stage shapes, random weights,
// launches under programmatic dependent launch, and the variants timed in alternating rounds.
#pragma once
#include "common.cuh"
#include "attention_stand_in.cuh"
#include <cstdlib>

// A GEMV-like stage: cubes of 256 units and 16-byte weight vectors a unit.
struct Stage { unsigned grid, vpt; };

// 8-bit and bf16 sizes of the 1.5B decode step's qkv, o, gate-up and down.
constexpr Stage kQkv[2] = {{256, 3}, {256, 6}}, kO[2] = {{192, 3}, {192, 6}},
                kGateUp[2] = {{560, 12}, {560, 24}}, kDown[2] = {{840, 4}, {840, 8}};
constexpr const char* kShapeNames[2] = {"8-bit sizes", "bf16 sizes"};
constexpr int kLayers = 28;
// Keys and values of a 640-token context: 2 KV heads x 640 x 128 x 2 (K, V) x 2 bytes, in
// 16-byte vectors.
constexpr size_t kKvLayer = 2 * 640 * 128 * 2 * 2 / 16;

// The words the weights repeat: one LCG stream of 2^24 words.
inline std::vector<unsigned> weight_words() {
  std::vector<unsigned> h(1 << 24); unsigned st = 7;
  for (auto& e : h) { st = st * 1664525u + 1013904223u; e = st; }
  return h;
}

// The weights of both shapes' 28 layers (the larger), the words of weight_words repeated; the
// keys and values (`kKvLayer` a layer) copied from their start.
inline void chain_weights(uint4** w, uint4** kv) {
  size_t vecs = 0;
  for (int sh = 0; sh < 2; sh++)
    vecs = std::max(vecs, (size_t)256 * kLayers *
                              (kQkv[sh].grid * kQkv[sh].vpt + kO[sh].grid * kO[sh].vpt +
                               kGateUp[sh].grid * kGateUp[sh].vpt + kDown[sh].grid * kDown[sh].vpt));
  cudaMalloc(w, vecs * 16); cudaMalloc(kv, kKvLayer * kLayers * 16);
  const std::vector<unsigned> h = weight_words();
  for (size_t off = 0; off < vecs * 4; off += h.size())
    cudaMemcpy((unsigned*)*w + off, h.data(), std::min(h.size(), vecs * 4 - off) * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(*kv, *w, kKvLayer * kLayers * 16, cudaMemcpyDeviceToDevice);
}

// `n` floats of 1.
inline float* ones(size_t n) {
  float* p; cudaMalloc(&p, n * 4);
  std::vector<float> h(n, 1.0f);
  cudaMemcpy(p, h.data(), n * 4, cudaMemcpyHostToDevice);
  return p;
}

// `kern` on `grid` cubes of `units`, a programmatic dependent of the launch before it on `s`,
// in clusters of `cluster` cubes where that is more than one.
template <class K, class... A>
void launch_pdl(cudaStream_t s, K kern, unsigned grid, unsigned units, size_t smem, unsigned cluster,
                A... args) {
  cudaLaunchConfig_t cfg = {}; cfg.gridDim = dim3(grid); cfg.blockDim = dim3(units);
  cfg.dynamicSmemBytes = smem; cfg.stream = s;
  cudaLaunchAttribute at[2];
  at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[0].val.programmaticStreamSerializationAllowed = 1;
  at[1].id = cudaLaunchAttributeClusterDimension;
  at[1].val.clusterDim.x = cluster; at[1].val.clusterDim.y = 1; at[1].val.clusterDim.z = 1;
  cfg.attrs = at; cfg.numAttrs = cluster > 1 ? 2 : 1;
  cudaLaunchKernelEx(&cfg, kern, args...);
}

// `st` as a plain stage (`stage<0, 0>`: no hand-over counters, the dependents triggered at its
// end) reading `x` (`x_len` floats) with the weights at `w` into `y`; returns how many weight
// vectors it reads.
inline size_t launch_plain_stage(cudaStream_t s, const Stage& st, const uint4* w, const float* x,
                                 unsigned x_len, float* y) {
  launch_pdl(s, stage<0, 0>, st.grid, 256u, 0, 1u, w, st.vpt, x, x_len, y, (unsigned*)nullptr, 0, -1,
             0u, -1, -1);
  return (size_t)st.grid * 256 * st.vpt;
}

// The separate attention stand-in: 2 clusters of 8 cubes, each a sixteenth of a layer's keys and
// values, and the shared memory it uses (that share and the merge's receive buffer).
constexpr unsigned kStandInKvVecs = kKvLayer / 16;
constexpr size_t kStandInSmem = kStandInKvVecs * 16 + 8 * 96 * 4;

// The separate attention stand-in with `smem` bytes of shared memory a cube (set as its maximum
// beforehand where over 48 KB) over one layer's keys and values `kv`, reading `x` (`x_len`
// floats) into `y`.
inline void launch_attention_stand_in(cudaStream_t s, const uint4* kv, size_t smem, const float* x,
                                      unsigned x_len, float* y) {
  launch_pdl(s, attention<0, 8>, 16, 256u, smem, 8u, kv, kStandInKvVecs, (const uint4*)nullptr, 0u, x,
             x_len, y);
}

// Where a chain being captured on `s` stands: its next weights (`off` vectors into `w`), its next
// output slot of `ys` (2048 floats each) and the output the next launch reads.
struct ChainCursor {
  cudaStream_t s; const uint4* w; float* ys; const float* prev; unsigned prev_len;
  size_t off = 0; int slot = 0;
  float* next_out() { return ys + (size_t)(slot++) * 2048; }
  void plain(const Stage& st) {
    float* y = next_out();
    off += launch_plain_stage(s, st, w + off, prev, prev_len, y);
    prev = y; prev_len = st.grid;
  }
  void attention_stand_in(const uint4* kv, size_t smem) {
    float* y = next_out();
    launch_attention_stand_in(s, kv, smem, prev, prev_len, y);
    prev = y; prev_len = ATTN_OUT;
  }
  // Layer `l` of the five-launch chain at shape `sh` (qkv, the attention stand-in with `smem`
  // bytes over the layer's keys and values in `kv`, o, gate-up, down).
  void layer(int sh, int l, const uint4* kv, size_t smem) {
    plain(kQkv[sh]);
    attention_stand_in(kv + (size_t)l * kKvLayer, smem);
    plain(kO[sh]);
    plain(kGateUp[sh]);
    plain(kDown[sh]);
  }
};

// Ends the capture on `s` into exec; false (after printing why) where it does not instantiate.
inline bool end_capture(cudaStream_t s, cudaGraphExec_t* exec) {
  cudaGraph_t g; cudaStreamEndCapture(s, &g);
  bool ok = cudaGraphInstantiate(exec, g, 0) == cudaSuccess;
  if (!ok) printf("instantiate failed: %s\n", cudaGetErrorString(cudaGetLastError()));
  cudaGraphDestroy(g);
  return ok;
}

// µs a layer of each variant's graph, `rounds` rounds (the environment variable `rounds_env`,
// default 8) in alternating order, printed as medians under `title`; the graphs destroyed.
inline void time_variants(cudaStream_t s, const char* title, const char* const* names, int nv,
                          cudaGraphExec_t* exec, const char* rounds_env) {
  std::vector<std::vector<float>> t(nv);
  const int rounds = getenv(rounds_env) ? atoi(getenv(rounds_env)) : 8;
  for (int round = 0; round < rounds; round++)
    for (int j = 0; j < nv; j++) {
      int v = (round & 1) ? nv - 1 - j : j;
      auto run = [&](int it) { for (int k = 0; k < it; k++) cudaGraphLaunch(exec[v], s); };
      run(5); cudaStreamSynchronize(s);
      t[v].push_back(time_per_iter(s, 40, run) / kLayers);
    }
  printf("%s:\n", title);
  for (int v = 0; v < nv; v++) { printf("  %-30s us a layer ", names[v]); print_stats(t[v]); }
  for (int v = 0; v < nv; v++) cudaGraphExecDestroy(exec[v]);
}
