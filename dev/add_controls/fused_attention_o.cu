// The decode attention and the output projection in one launch: what would it save?
//
// The decode step's layer is five kernels under programmatic dependent launch (qkv, attention,
// o, gate-up, down). The attention runs on 16 cubes (two clusters of 8, one per KV head, each
// cube a share of the keys, the splits merged through distributed shared memory) and writes its
// 1 536 outputs; o (192 cubes, weights loaded before its wait) reads them after the attention
// grid has completed. Fused, every cluster computes the whole attention (4 cubes a KV head, a
// quarter of the keys each: the 0.66 MB of keys and values read once from DRAM and 11 more times
// from L2), merges and broadcasts it through distributed shared memory to its 8 cubes, and each
// cube multiplies it by its 16 rows of o, whose weights it loaded before the wait: one kernel
// boundary and the outputs' round trip through global memory less, 12x the key and value reads.
//
// Synthetic, like boundary.cu: 28 layers of GEMV-like stages with the 1.5B decode step's grids
// and weight bytes (qkv, o, gate-up, down as there), the attention a stand-in with the real
// launch's shape and bytes (keys and values copied into shared memory by cp.async before the
// wait, one query float read after it, a dot product over the tile, the split partials sent to
// their owners' shared memory, a cluster barrier, the owners' sums). No MMA, softmax or RoPE:
// the same in both structures. Captured once into a CUDA graph with programmatic edges, replayed;
// µs per layer, medians over rounds that alternate the variants.
//
// Variants: "separate" (attention kernel, then o), "fused" (one kernel of 96 cubes, 12 clusters),
// "fused, no KV replica" (each cube reads a twelfth of its keys and values: what the fused
// launch would take without the replicas' reads; wrong sums, timing only), "fused, clusters of
// 16" (6 non-portable clusters, 8 cubes a KV head: half the keys a cube).
#include "attention_stand_in.cuh"

#ifdef __CUDACC_RTC__
// NVRTC (dev/cuda_compile/check.py) compiles the kernels only.
template __global__ void attention<0, 8>(const uint4*, unsigned, const uint4*, unsigned, const float*, unsigned, float*);
template __global__ void attention<1, 8>(const uint4*, unsigned, const uint4*, unsigned, const float*, unsigned, float*);
template __global__ void attention<1, 16>(const uint4*, unsigned, const uint4*, unsigned, const float*, unsigned, float*);
template __global__ void stage<0, 0>(const uint4*, unsigned, const float*, unsigned, float*, unsigned*, int, int, unsigned, int, int);
#else
#include "chain_host.cuh"

int main() {
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  // The fused cube's o vectors a lane (16 rows of 1 536 weights over 256 lanes), 8-bit and bf16.
  const unsigned fused_o_vpt[2] = {6, 12};
  const int NV = 4;
  const char* names[NV] = {"separate", "fused", "fused, no KV replica", "fused, clusters of 16"};
  const unsigned kv_fused = kKvLayer / 8;  // vectors a cube
  uint4 *w, *kv;
  chain_weights(&w, &kv);
  const int per = 5;
  float* ys = ones((size_t)kLayers * per * 2048);
  size_t smem_fused = kv_fused * 16 + 4 * 192 * 4 + ATTN_OUT * 4;
  cudaFuncSetAttribute(attention<0, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kStandInSmem);
  cudaFuncSetAttribute(attention<1, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_fused);
  cudaFuncSetAttribute(attention<1, 16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_fused);
  cudaFuncSetAttribute(attention<1, 16>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  for (int sh = 0; sh < 2; sh++) {
    cudaGraphExec_t exec[NV];
    for (int v = 0; v < NV; v++) {
      cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
      ChainCursor c{s, w, ys, ys + (size_t)(kLayers * per - 1) * 2048, kDown[sh].grid};
      for (int l = 0; l < kLayers; l++) {
        c.plain(kQkv[sh]);
        const uint4* kvl = kv + (size_t)l * kKvLayer;
        if (v == 0) {
          c.attention_stand_in(kvl, kStandInSmem);
          c.plain(kO[sh]);
        } else {
          // "no KV replica": each cube reads a twelfth of its share (wrong sums, timing only).
          unsigned kvv = v == 2 ? kv_fused / 12 : v == 3 ? kv_fused / 2 : kv_fused;
          float* y = c.next_out();
          launch_pdl(s, v == 3 ? attention<1, 16> : attention<1, 8>, 96, 256u, smem_fused, v == 3 ? 16u : 8u,
                     kvl, kvv, c.w + c.off, fused_o_vpt[sh], c.prev, c.prev_len, y);
          // The fused launch takes o's weights and output slot too.
          c.off += (size_t)96 * 256 * fused_o_vpt[sh]; c.prev = y; c.prev_len = ATTN_OUT; c.slot++;
        }
        c.plain(kGateUp[sh]);
        c.plain(kDown[sh]);
      }
      if (!end_capture(s, &exec[v])) return 1;
    }
    time_variants(s, kShapeNames[sh], names, NV, exec, "FAO_ROUNDS");
  }
  std::vector<float> h(2048);
  cudaMemcpy(h.data(), ys + 2048, 2048 * 4, cudaMemcpyDeviceToHost);
  printf("attention out[0..2] %g %g, err %s\n", h[0], h[1], cudaGetErrorString(cudaGetLastError()));
}
#endif
