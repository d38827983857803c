// The gate-up and down projections in one launch: what would it save?
//
// The decode step's layer is five kernels under programmatic dependent launch (qkv, attention,
// o, gate-up, down); every boundary waits for the whole previous grid. Fused, each cube owns a
// slice of the MLP's intermediate dimension: it streams its gate and up rows (after the wait,
// as they need o's output), keeps its activations in shared memory, streams the matching
// columns of down (stored transposed, so contiguous) and adds its partial sums of the 1 536
// outputs into an f32 accumulator with `red.global.add` (a real kernel would add fixed-point
// integers, whose sum does not depend on the order); the next layer's qkv reads the accumulator.
// One kernel boundary less a layer, and the work split over the SMs to one column instead of
// one cube of columns; the price: the switch from gate-up to down inside each cube and the
// reduction of 132-264 partials per output.
//
// Synthetic, like boundary.cu and fused_attention_o.cu: 28 layers of GEMV-like stages with the
// 1.5B decode step's grids and weight bytes, the attention the clustered stand-in of
// fused_attention_o.cu. Captured once into a CUDA graph with programmatic edges, replayed; µs
// per layer, medians over rounds that alternate the variants. Both graphs start with the same
// memset of the accumulators.
//
// Variants: "separate" (gate-up, then down: five kernels of boundary.cu's stage, which loads a
// vector a lane at a time in a plain loop), "separate, batched stages" (every stage loading 8
// vectors a lane at a time), "fused, batched stages" (qkv and o batched, then the fused launch:
// one cube of 512 units per SM loading 8 vectors a lane at a time, the first before the wait),
// "fused, plain stages". Measured before (another call): the fused launch with all 8 first
// vectors before the wait (0.8 µs a layer slower in both shapes) and on 1 024-unit cubes loading
// 4 at a time (0.5-2.3 µs slower); a first version that loaded one vector at a time in a plain
// loop, on 132 x 512 and 264 x 256 cubes, streamed at 2.1 TB/s, and there the reduction cost
// 0.1 µs a layer (47.63 against 47.54 µs with only cube 0 adding).
#include "attention_stand_in.cuh"

#define MLP_OUT 1536

// The fused MLP stand-in: gu_total gate/up vectors and d_total down vectors over the grid's
// lanes (lane-strided, coalesced), BATCH vectors a lane loaded before any is used, x (o's output)
// read after the wait (which comes after the first vector, or with EARLY after the first batch),
// partial sums added into acc[MLP_OUT].
template <int THREADS, int BATCH, int EARLY>
__global__ void __launch_bounds__(THREADS)
mlp(const uint4* __restrict__ w_gu, unsigned gu_total, const uint4* __restrict__ w_d,
    unsigned d_total, const float* x, unsigned x_len, float* acc_out) {
  __shared__ float act[THREADS / 32];
  const unsigned lanes = gridDim.x * THREADS, me = blockIdx.x * THREADS + threadIdx.x;
  uint4 v[BATCH];
  load_batch(v, w_gu, me, lanes, EARLY ? gu_total : min(gu_total, me + 1));
  wait_after(v[0].x * 3u | (me >= gu_total));
  const float xv = x[me % x_len];
  if (!EARLY) load_batch<1>(v, w_gu, me, lanes, gu_total);
  float acc = dot_batch(v, xv) + dot_batches<BATCH>(w_gu, me + BATCH * lanes, lanes, gu_total, xv);
  // Down's first batch loads before the activations' barrier, so the stream does not stop.
  load_batch(v, w_d, me, lanes, d_total);
  for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0) act[threadIdx.x >> 5] = sinf(acc * 1e-3f);
  __syncthreads();
  const float a = act[(threadIdx.x >> 5) ^ 1];
  float acc2 = dot_batch(v, a) + dot_batches<BATCH>(w_d, me + BATCH * lanes, lanes, d_total, a);
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#pragma unroll
  for (int k = 0; k < MLP_OUT / THREADS; k++)
    atomicAdd(acc_out + threadIdx.x + k * THREADS, acc2 * (1e-3f + k * 1e-4f));
}

// boundary.cu's stage with BATCH vectors a lane loaded before any is used (the first before the
// wait), as the fused launch loads them: the separate chain at the same loading depth.
template <int BATCH>
__global__ void __launch_bounds__(256) stage_batched(const uint4* __restrict__ w, unsigned vpt,
                                                     const float* x, unsigned x_len, float* y) {
  const uint4* p = w + (size_t)blockIdx.x * vpt * 256 + threadIdx.x;
  const size_t end = (size_t)vpt * 256;
  uint4 v[BATCH];
  load_batch(v, p, 0, 256, 1);
  wait_after(v[0].x * 3u);
  const float xv = x[(blockIdx.x * 256 + threadIdx.x) % x_len];
  load_batch<1>(v, p, 0, 256, end);
  float acc = dot_batch(v, xv) + dot_batches<BATCH>(p, BATCH * 256, 256, end, xv);
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  cube_sum_store(acc, y);
}

#ifdef __CUDACC_RTC__
// NVRTC (dev/cuda_compile/check.py) compiles the kernels only.
template __global__ void mlp<512, 8, 0>(const uint4*, unsigned, const uint4*, unsigned, const float*, unsigned, float*);
template __global__ void stage_batched<8>(const uint4*, unsigned, const float*, unsigned, float*);
template __global__ void attention<0, 8>(const uint4*, unsigned, const uint4*, unsigned, const float*, unsigned, float*);
template __global__ void stage<0, 0>(const uint4*, unsigned, const float*, unsigned, float*, unsigned*, int, int, unsigned, int, int);
#else
#include "chain_host.cuh"

int main() {
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  const int NV = 4;
  const char* names[NV] = {"separate", "separate, batched stages", "fused, batched stages", "fused, plain stages"};
  uint4 *w, *kv;
  chain_weights(&w, &kv);
  const int per = 5;
  float* ys = ones((size_t)kLayers * per * 2048);
  // The fused launch's accumulators, one a layer, zeroed by the graph's first node.
  float* accs; cudaMalloc(&accs, (size_t)kLayers * MLP_OUT * 4);
  cudaFuncSetAttribute(attention<0, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kStandInSmem);
  for (int sh = 0; sh < 2; sh++) {
    cudaGraphExec_t exec[NV];
    for (int v = 0; v < NV; v++) {
      cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
      cudaMemsetAsync(accs, 0, (size_t)kLayers * MLP_OUT * 4, s);
      size_t off = 0; int slot = 0;
      const float* prev = v < 2 ? ys + (size_t)(kLayers * per - 1) * 2048 : accs + (size_t)(kLayers - 1) * MLP_OUT;
      unsigned prev_len = v < 2 ? kDown[sh].grid : MLP_OUT;
      for (int l = 0; l < kLayers; l++) {
        auto gemv = [&](const Stage& st) {
          float* y = ys + (size_t)(slot++) * 2048;
          if (v == 1 || v == 2)
            launch_pdl(s, stage_batched<8>, st.grid, 256u, 0, 1u, (const uint4*)(w + off), st.vpt, prev, prev_len, y);
          else
            launch_plain_stage(s, st, w + off, prev, prev_len, y);
          off += (size_t)st.grid * 256 * st.vpt; prev = y; prev_len = st.grid;
        };
        gemv(kQkv[sh]);
        float* y = ys + (size_t)(slot++) * 2048;
        launch_attention_stand_in(s, kv + (size_t)l * kKvLayer, kStandInSmem, prev, prev_len, y);
        prev = y; prev_len = ATTN_OUT;
        gemv(kO[sh]);
        if (v < 2) {
          gemv(kGateUp[sh]);
          gemv(kDown[sh]);
        } else {
          const unsigned gu_total = kGateUp[sh].grid * 256 * kGateUp[sh].vpt,
                         d_total = kDown[sh].grid * 256 * kDown[sh].vpt;
          const uint4* wg = w + off; off += gu_total;
          const uint4* wd = w + off; off += d_total;
          float* acc = accs + (size_t)l * MLP_OUT;
          launch_pdl(s, mlp<512, 8, 0>, 132, 512u, 0, 1u, wg, gu_total, wd, d_total, prev, prev_len, acc);
          prev = acc; prev_len = MLP_OUT; slot += 2;
        }
      }
      if (!end_capture(s, &exec[v])) return 1;
    }
    time_variants(s, kShapeNames[sh], names, NV, exec, "FMLP_ROUNDS");
  }
  std::vector<float> h(MLP_OUT);
  cudaMemcpy(h.data(), accs, MLP_OUT * 4, cudaMemcpyDeviceToHost);
  printf("accumulator[0..2] %g %g, err %s\n", h[0], h[1], cudaGetErrorString(cudaGetLastError()));
}
#endif
