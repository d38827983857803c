// Several decode steps in one CUDA graph: what does the boundary between two replays of a one-step
// graph cost, against the same steps captured K to a graph with programmatic edges across the
// steps too?
//
// A step is the synthetic decode chain of boundary.cu (28 layers of five GEMV-like stages with
// the 1.5B step's grids and weight bytes, griddepcontrol.wait pinned below each cube's first
// load, dependents triggered after the weight loop) between an embedding stand-in (one cube), and
// a final norm stand-in (one cube), an LM head (1 188 cubes streaming 233.6 MB at 8-bit sizes,
// 467.1 MB at bf16's) and an argmax stand-in (19 cubes). Every stage reads the previous stage's
// outputs, the embedding those of the previous step's argmax, so steps chain as in decoding.
//
// Graphs of K = 1, 2, 4 and 8 steps, each launch after the first a programmatic dependent of the
// one before it (within a step and across steps). Timed per step, medians over rounds that
// alternate the graphs:
//   "back to back": the graphs launched one after another, nothing else on the stream;
//   "with read-back": as the decode loop runs them, after each graph an event, a second stream
//     waiting for it copies the K step ids (4 bytes each) to pinned host memory, and the host
//     waits for the copy of the graph before the previous one before launching the next, so at
//     most two graphs are queued.
// After 8 steps every graph must leave the same outputs, bit for bit.
#include "common.cuh"
#include "chain.cuh"
#include <cstdlib>

struct Stage { unsigned grid, vpt; };

int main() {
  cudaStream_t s, side;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
  const int layers = 28, per = 5;
  // qkv, attention, o, gate-up, down at 8-bit and bf16 sizes (boundary.cu's), then the LM head.
  const Stage layer_shapes[2][per] = {{{256, 3}, {16, 10}, {192, 3}, {560, 12}, {840, 4}},
                                      {{256, 6}, {16, 10}, {192, 6}, {560, 24}, {840, 8}}};
  const Stage head[2] = {{1188, 48}, {1188, 96}};
  const char* shape_names[2] = {"8-bit sizes", "bf16 sizes"};
  const int ks[4] = {1, 2, 4, 8};
  // One step's stages: embedding, the layers, final norm, LM head, argmax.
  const int n = 1 + layers * per + 3;
  const unsigned slot = 2048;  // floats of output a stage (the LM head writes 1 188)
  size_t max_vecs = 0;
  for (int sh = 0; sh < 2; sh++) {
    size_t v = 3 + 19 + (size_t)head[sh].grid * head[sh].vpt;
    for (int k = 0; k < per; k++) v += (size_t)layer_shapes[sh][k].grid * layer_shapes[sh][k].vpt * layers;
    max_vecs = std::max(max_vecs, v * 256);
  }
  uint4* w; cudaMalloc(&w, max_vecs * 16);
  {
    std::vector<unsigned> h(1 << 24); unsigned st = 7;
    for (auto& e : h) { st = st * 1664525u + 1013904223u; e = st; }
    for (size_t off = 0; off < max_vecs * 4; off += h.size())
      cudaMemcpy((unsigned*)w + off, h.data(), std::min(h.size(), max_vecs * 4 - off) * 4, cudaMemcpyHostToDevice);
  }
  float* ys; cudaMalloc(&ys, (size_t)n * slot * 4);
  unsigned* ids_host; cudaMallocHost(&ids_host, 8 * 4 * 4);
  cudaEvent_t step_done[4], read_done[4];
  for (int j = 0; j < 4; j++) {
    cudaEventCreateWithFlags(&step_done[j], cudaEventDisableTiming);
    cudaEventCreateWithFlags(&read_done[j], cudaEventDisableTiming);
  }
  for (int sh = 0; sh < 2; sh++) {
    std::vector<Stage> stages;
    stages.push_back({1, 1});
    for (int l = 0; l < layers; l++)
      for (int k = 0; k < per; k++) stages.push_back(layer_shapes[sh][k]);
    stages.push_back({1, 1});
    stages.push_back(head[sh]);
    stages.push_back({19, 1});
    double bytes = 0;
    for (const Stage& st : stages) bytes += (double)st.grid * 256 * st.vpt * 16;
    cudaGraphExec_t exec[4];
    for (int g = 0; g < 4; g++) {
      cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
      for (int step = 0; step < ks[g]; step++) {
        size_t off = 0;
        for (int i = 0; i < n; i++) {
          const Stage& st = stages[i];
          const Stage& pv = stages[(i + n - 1) % n];
          cudaLaunchConfig_t cfg = {}; cfg.gridDim = dim3(st.grid); cfg.blockDim = dim3(256); cfg.stream = s;
          cudaLaunchAttribute at[1];
          at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
          at[0].val.programmaticStreamSerializationAllowed = 1;
          cfg.attrs = at; cfg.numAttrs = 1;
          const float* x = ys + (size_t)((i + n - 1) % n) * slot;
          float* y = ys + (size_t)i * slot;
          cudaLaunchKernelEx(&cfg, stage<0, 0>, (const uint4*)(w + off), st.vpt, x, pv.grid, y,
                             (unsigned*)nullptr, i, -1, 0u, -1, -1);
          off += (size_t)st.grid * 256 * st.vpt;
        }
      }
      cudaGraph_t graph; cudaStreamEndCapture(s, &graph);
      cudaGraphInstantiate(&exec[g], graph, 0);
      cudaGraphDestroy(graph);
    }
    // Bit-for-bit check: 8 steps from the same start, every stage's outputs.
    std::vector<float> want((size_t)n * slot), got((size_t)n * slot);
    for (int g = 0; g < 4; g++) {
      cudaMemsetAsync(ys, 0, (size_t)n * slot * 4, s);
      for (int r = 0; r < 8 / ks[g]; r++) cudaGraphLaunch(exec[g], s);
      cudaMemcpyAsync(g ? got.data() : want.data(), ys, want.size() * 4, cudaMemcpyDeviceToHost, s);
      cudaStreamSynchronize(s);
      if (g && memcmp(want.data(), got.data(), want.size() * 4)) printf("MISMATCH %s K=%d\n", shape_names[sh], ks[g]);
    }
    // 64 steps a timing: 64 / K launches.
    const int steps = 64;
    std::vector<float> plain[4], read[4];
    for (int round = 0; round < 8; round++)
      for (int j = 0; j < 4; j++) {
        int g = (round & 1) ? 3 - j : j;
        int launches = steps / ks[g];
        auto back_to_back = [&](int it) { for (int r = 0; r < it; r++) cudaGraphLaunch(exec[g], s); };
        back_to_back(4); cudaStreamSynchronize(s);
        plain[g].push_back(time_per_iter(s, launches, back_to_back) / ks[g]);
        auto with_read = [&](int it) {
          for (int r = 0; r < it; r++) {
            if (r >= 2) cudaEventSynchronize(read_done[(r - 2) % 4]);
            cudaGraphLaunch(exec[g], s);
            cudaEventRecord(step_done[r % 4], s);
            cudaStreamWaitEvent(side, step_done[r % 4], 0);
            cudaMemcpyAsync(ids_host + 8 * (r % 4), ys + (size_t)(n - 1) * slot, 4 * ks[g],
                            cudaMemcpyDeviceToHost, side);
            cudaEventRecord(read_done[r % 4], side);
          }
        };
        with_read(4); cudaStreamSynchronize(s); cudaStreamSynchronize(side);
        read[g].push_back(time_per_iter(s, launches, with_read) / ks[g]);
        cudaStreamSynchronize(side);
      }
    printf("%s: %.1f MB a step, floor at 3.0 TB/s %.1f us a step, %d kernels a step\n",
           shape_names[sh], bytes / 1e6, bytes / 3.0e6, n);
    for (int g = 0; g < 4; g++) {
      printf("  K=%d back to back, us a step   ", ks[g]); print_stats(plain[g]);
      printf("  K=%d with read-back, us a step ", ks[g]); print_stats(read[g]);
    }
    for (int g = 0; g < 4; g++) cudaGraphExecDestroy(exec[g]);
  }
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
