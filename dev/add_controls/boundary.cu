// Kernel boundaries in a decode-like chain: does a device flag (each cube of a kernel adds to a
// counter with release semantics, the next kernel's cubes spin on it with acquire loads) hand
// over faster than `griddepcontrol.wait`, which holds until the whole previous grid has
// completed and its memory is flushed?
//
// The chain is 28 "layers" of five GEMV-like stages with the 1.5B decode step's grids and weight
// bytes (8-bit and bf16 sizes, and a latency-only shape of one 16-byte vector a lane): each cube
// loads its first weight vector, waits for the previous stage, reads the previous stage's output
// (one float a lane, from L2), streams the rest of its weight slice, reduces it across the cube
// and writes one float. Captured once into a CUDA graph with programmatic edges, replayed; µs per
// layer are medians over rounds that alternate the variants. The last stage's outputs must match
// the wait-only variant bit for bit.
//
// Variants: "wait" (griddepcontrol.wait, dependents triggered after the weight loop: how the
// decode GEMVs do it), "wait, trigger first", "flag" (dependents triggered after the weight
// loop), "flag, trigger first". A flag counter is reset by the kernel two stages later, once
// every cube that spins on it has passed (the first kernel resets the last two).
// BOUNDARY_ONLY=S,V times only shape S with variant V (for a per-kernel CUPTI trace of it).
#include "common.cuh"
#include "chain.cuh"
#include <cmath>
#include <cstdlib>

struct Stage { const char* name; unsigned grid; unsigned vpt; };

int main() {
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  const int layers = 28, per = 5, n = layers * per;
  // grid, 16-byte vectors a lane (256 lanes a cube): qkv, attention, o, gate-up, down.
  const Stage shapes[3][per] = {
      {{"qkv", 256, 3}, {"attn", 16, 10}, {"o", 192, 3}, {"gate-up", 560, 12}, {"down", 840, 4}},
      {{"qkv", 256, 6}, {"attn", 16, 10}, {"o", 192, 6}, {"gate-up", 560, 24}, {"down", 840, 8}},
      {{"qkv", 256, 1}, {"attn", 16, 1}, {"o", 192, 1}, {"gate-up", 560, 1}, {"down", 840, 1}}};
  const char* shape_names[3] = {"8-bit sizes", "bf16 sizes", "one vector a lane"};
  const char* names[4] = {"wait", "wait, trigger first", "flag", "flag, trigger first"};
  size_t max_vecs = 0;
  for (int sh = 0; sh < 3; sh++) {
    size_t v = 0;
    for (int k = 0; k < per; k++) v += (size_t)shapes[sh][k].grid * 256 * shapes[sh][k].vpt;
    max_vecs = std::max(max_vecs, v * layers);
  }
  uint4* w; cudaMalloc(&w, max_vecs * 16);
  {
    std::vector<unsigned> h(1 << 24); unsigned st = 7;
    for (auto& e : h) { st = st * 1664525u + 1013904223u; e = st; }
    for (size_t off = 0; off < max_vecs * 4; off += h.size())
      cudaMemcpy((unsigned*)w + off, h.data(), std::min(h.size(), max_vecs * 4 - off) * 4, cudaMemcpyHostToDevice);
  }
  float* ys; cudaMalloc(&ys, (size_t)n * 1024 * 4);
  unsigned* flags; cudaMalloc(&flags, n * 4);
  int only_shape = -1, only_variant = -1;
  if (const char* e = getenv("BOUNDARY_ONLY")) sscanf(e, "%d,%d", &only_shape, &only_variant);
  for (int sh = 0; sh < 3; sh++) {
    if (only_shape >= 0 && sh != only_shape) continue;
    double bytes = 0;
    for (int k = 0; k < per; k++) bytes += (double)shapes[sh][k].grid * 256 * shapes[sh][k].vpt * 16;
    cudaGraphExec_t exec[4];
    for (int v = 0; v < 4; v++) {
      cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
      size_t off = 0;
      for (int i = 0; i < n; i++) {
        const Stage& st = shapes[sh][i % per];
        const Stage& pv = shapes[sh][(i + n - 1) % per];
        cudaLaunchConfig_t cfg = {}; cfg.gridDim = dim3(st.grid); cfg.blockDim = dim3(256); cfg.stream = s;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at; cfg.numAttrs = 1;
        const float* x = ys + (size_t)((i + n - 1) % n) * 1024;
        float* y = ys + (size_t)i * 1024;
        int prev = i == 0 ? -1 : i - 1;
        int r0 = i >= 2 ? i - 2 : (i == 0 ? n - 1 : -1), r1 = i == 0 ? n - 2 : -1;
        const uint4* wi = w + off;
        off += (size_t)st.grid * 256 * st.vpt;
        auto kern = v == 0 ? stage<0, 0> : v == 1 ? stage<0, 1> : v == 2 ? stage<1, 0> : stage<1, 1>;
        cudaLaunchKernelEx(&cfg, kern, wi, st.vpt, x, pv.grid, y, flags, i, prev, pv.grid, r0, r1);
      }
      cudaGraph_t g; cudaStreamEndCapture(s, &g);
      cudaGraphInstantiate(&exec[v], g, 0);
      cudaGraphDestroy(g);
    }
    // Bit-for-bit check: the same start, three replays, every y.
    std::vector<float> want((size_t)n * 1024), got((size_t)n * 1024);
    for (int v = 0; v < 4; v++) {
      cudaMemsetAsync(ys, 0, (size_t)n * 1024 * 4, s); cudaMemsetAsync(flags, 0, n * 4, s);
      for (int r = 0; r < 3; r++) cudaGraphLaunch(exec[v], s);
      cudaMemcpyAsync(v ? got.data() : want.data(), ys, want.size() * 4, cudaMemcpyDeviceToHost, s);
      cudaStreamSynchronize(s);
      if (v && memcmp(want.data(), got.data(), want.size() * 4)) printf("MISMATCH %s %s\n", shape_names[sh], names[v]);
    }
    std::vector<float> t[4];
    for (int round = 0; round < 8; round++)
      for (int j = 0; j < 4; j++) {
        int v = (round & 1) ? 3 - j : j;
        if (only_variant >= 0 && v != only_variant) continue;
        auto run = [&](int it) { for (int k = 0; k < it; k++) cudaGraphLaunch(exec[v], s); };
        run(5); cudaStreamSynchronize(s);
        t[v].push_back(time_per_iter(s, 40, run) / layers);
      }
    printf("%s: %.1f MB a layer, floor at 3.0 TB/s %.2f us a layer\n", shape_names[sh], bytes / 1e6, bytes / 3.0e6);
    for (int v = 0; v < 4; v++)
      if (!t[v].empty()) { printf("  %-22s us a layer ", names[v]); print_stats(t[v]); }
    for (int v = 0; v < 4; v++) cudaGraphExecDestroy(exec[v]);
  }
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
