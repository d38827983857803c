// Several decode steps in one CUDA graph: what does the boundary between two replays of a one-step
// graph cost, against the same steps captured K to a graph with programmatic edges across the
// steps too?
//
// A step is the synthetic decode chain of chain_host.cuh (28 layers: qkv, the clustered
// attention stand-in over a 640-token context, o, gate-up, down, with the 1.5B step's grids and
// weight bytes) between an embedding stand-in (one cube), and a final norm stand-in (one cube),
// an LM head (1 188 cubes streaming 233.6 MB at 8-bit sizes, 467.1 MB at bf16's) and an argmax
// stand-in (19 cubes). Every stage reads the previous stage's outputs, the embedding those of
// the previous step's argmax, so steps chain as in decoding.
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
#include "chain_host.cuh"

// The stages around the layers: embedding, final norm and argmax stand-ins, and the LM head.
constexpr Stage kOneCube = {1, 1}, kArgmax = {19, 1}, kHeadStage[2] = {{1188, 48}, {1188, 96}};
// Launches a step: 1 + 5 a layer + 3.
constexpr int kStepLaunches = 1 + 5 * kLayers + 3;

int main() {
  cudaStream_t s, side;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
  const int ks[4] = {1, 2, 4, 8};
  uint4 *w, *kv, *head;
  chain_weights(&w, &kv);
  // The LM head's weights (the larger shape's), then the small stages' vectors.
  const size_t head_vecs = (size_t)kHeadStage[1].grid * 256 * kHeadStage[1].vpt;
  cudaMalloc(&head, (head_vecs + 256 * (2 + kArgmax.grid)) * 16);
  cudaMemcpy(head, w, head_vecs * 16, cudaMemcpyDeviceToDevice);
  const uint4* small = head + head_vecs;
  float* ys = ones((size_t)kStepLaunches * 2048);
  const float* argmax_out = ys + (size_t)(kStepLaunches - 1) * 2048;
  cudaFuncSetAttribute(attention<0, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kStandInSmem);
  unsigned* ids_host; cudaMallocHost(&ids_host, 4 * 8 * 4);
  cudaEvent_t step_done[4], read_done[4];
  for (int j = 0; j < 4; j++) {
    cudaEventCreateWithFlags(&step_done[j], cudaEventDisableTiming);
    cudaEventCreateWithFlags(&read_done[j], cudaEventDisableTiming);
  }
  for (int sh = 0; sh < 2; sh++) {
    // A stage outside the layers, on the cursor's next output slot.
    auto outside = [](ChainCursor& c, const Stage& st, const uint4* wts) {
      float* y = c.next_out();
      launch_plain_stage(c.s, st, wts, c.prev, c.prev_len, y);
      c.prev = y; c.prev_len = st.grid;
    };
    cudaGraphExec_t exec[4];
    for (int g = 0; g < 4; g++) {
      cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
      for (int step = 0; step < ks[g]; step++) {
        ChainCursor c{s, w, ys, argmax_out, kArgmax.grid};
        outside(c, kOneCube, small);
        for (int l = 0; l < kLayers; l++) c.layer(sh, l, kv, kStandInSmem);
        outside(c, kOneCube, small + 256);
        outside(c, kHeadStage[sh], head);
        outside(c, kArgmax, small + 512);
      }
      if (!end_capture(s, &exec[g])) return 1;
    }
    // Bit-for-bit check: 8 steps from the same start, every stage's outputs.
    std::vector<float> want((size_t)kStepLaunches * 2048), got(want.size());
    for (int g = 0; g < 4; g++) {
      cudaMemsetAsync(ys, 0, want.size() * 4, s);
      for (int r = 0; r < 8 / ks[g]; r++) cudaGraphLaunch(exec[g], s);
      cudaMemcpyAsync(g ? got.data() : want.data(), ys, want.size() * 4, cudaMemcpyDeviceToHost, s);
      cudaStreamSynchronize(s);
      if (g && memcmp(want.data(), got.data(), want.size() * 4)) printf("MISMATCH %s K=%d\n", kShapeNames[sh], ks[g]);
    }
    // 64 steps a timing: 64 / K launches.
    const int steps = 64;
    std::vector<float> plain[4], read[4];
    for (int round = 0; round < 8; round++)
      for (int j = 0; j < 4; j++) {
        int g = (round & 1) ? 3 - j : j;
        auto back_to_back = [&](int it) { for (int r = 0; r < it; r++) cudaGraphLaunch(exec[g], s); };
        back_to_back(4); cudaStreamSynchronize(s);
        plain[g].push_back(time_per_iter(s, steps / ks[g], back_to_back) / ks[g]);
        auto with_read = [&](int it) {
          for (int r = 0; r < it; r++) {
            if (r >= 2) cudaEventSynchronize(read_done[(r - 2) % 4]);
            cudaGraphLaunch(exec[g], s);
            cudaEventRecord(step_done[r % 4], s);
            cudaStreamWaitEvent(side, step_done[r % 4], 0);
            cudaMemcpyAsync(ids_host + 8 * (r % 4), argmax_out, 4 * ks[g], cudaMemcpyDeviceToHost, side);
            cudaEventRecord(read_done[r % 4], side);
          }
        };
        with_read(4); cudaStreamSynchronize(s); cudaStreamSynchronize(side);
        read[g].push_back(time_per_iter(s, steps / ks[g], with_read) / ks[g]);
        cudaStreamSynchronize(side);
      }
    printf("%s, %d launches a step:\n", kShapeNames[sh], kStepLaunches);
    for (int g = 0; g < 4; g++) {
      printf("  K=%d back to back, us a step   ", ks[g]); print_stats(plain[g]);
      printf("  K=%d with read-back, us a step ", ks[g]); print_stats(read[g]);
    }
    for (int g = 0; g < 4; g++) cudaGraphExecDestroy(exec[g]);
  }
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
