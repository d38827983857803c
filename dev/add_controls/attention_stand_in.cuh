// The clustered decode-attention stand-in of the synthetic chains (fused_attention_o.cu,
// fused_mlp.cu, carveout.cu): device code only, so that NVRTC (dev/cuda_compile/check.py) compiles it too.
#pragma once
#include <cooperative_groups.h>
#include "chain.cuh"
namespace cg = cooperative_groups;

#define HEAD_ELEMS 768   // one KV head's query group: 6 heads x 128
#define ATTN_OUT 1536    // 12 heads x 128
#define O_ROWS 16        // o rows a fused cube computes (96 cubes x 16 = 1536)

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
}

// The attention stand-in, separate (FUSED = 0: 2 clusters, G = 8 cubes a KV head, outputs to
// global) or fused with o (FUSED = 1: 12 clusters, G = 4 cubes a KV head, both heads in each
// cluster, the merged outputs broadcast to the cluster's cubes, then 16 rows of o per cube).
// kv: this layer's keys and values, kv_vecs 16-byte vectors per cube's split; w_o / o_vpt: the
// fused cube's o weights (o_vpt vectors a lane, two rows a plane).
template <int FUSED, int CL>
__global__ void __launch_bounds__(256)
attention(const uint4* __restrict__ kv, unsigned kv_vecs, const uint4* __restrict__ w_o,
          unsigned o_vpt, const float* x, unsigned x_len, float* y) {
  constexpr int G = FUSED ? CL / 2 : CL;       // cubes a KV head
  constexpr int OWN = HEAD_ELEMS / G;          // elements each cube owns after the merge
  extern __shared__ __align__(16) unsigned char smem[];
  uint4* tile = (uint4*)smem;                  // kv_vecs vectors
  float* recv = (float*)(tile + kv_vecs);      // [G][OWN]: partials sent to this cube
  float* full = recv + G * OWN;                // [ATTN_OUT]: the broadcast outputs (fused)
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank();
  const unsigned hk = FUSED ? rank / G : blockIdx.x / CL;
  const unsigned gr = rank % G;                // rank in the KV head's group
  if (!FUSED) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  // Keys and values are settled before the wait (only the newest row is written by qkv).
  const uint4* src = kv + ((size_t)hk * G + gr) * kv_vecs;
  for (unsigned i = threadIdx.x; i < kv_vecs; i += 256) cp_async16(tile + i, src + i);
  asm volatile("cp.async.commit_group;" ::: "memory");
  uint4 wreg[12];
  unsigned dep = 1;
  if (FUSED) {
    const uint4* wp = w_o + (size_t)blockIdx.x * o_vpt * 256 + threadIdx.x;
#pragma unroll
    for (int j = 0; j < 12; j++)
      if (j < (int)o_vpt) wreg[j] = wp[(size_t)j * 256];
    dep = wreg[0].x | 1u;
  }
  wait_after(dep);
  float q = x[(blockIdx.x * 256 + threadIdx.x) % x_len];
  asm volatile("cp.async.wait_all;" ::: "memory");
  __syncthreads();
  float acc = 0;
  for (unsigned i = threadIdx.x; i < kv_vecs; i += 256) acc += dotw(tile[i], q);
  // This cube's partial of its KV head's 768 elements (3 a unit) to their owners.
  for (int e = threadIdx.x; e < HEAD_ELEMS; e += 256) {
    unsigned owner = hk * (FUSED ? G : 0) + e / OWN;
    float* dst = cluster.map_shared_rank(recv, owner);
    dst[gr * OWN + e % OWN] = acc * (float)(e + 1) * 1e-6f;
  }
  cluster.sync();
  // The owned sums: to global (separate), or to every cube of the cluster, then o (fused).
  if (threadIdx.x < OWN) {
    float s = 0;
    for (int g = 0; g < G; g++) s += recv[g * OWN + threadIdx.x];
    const unsigned e = hk * HEAD_ELEMS + gr * OWN + threadIdx.x;
    if (!FUSED) y[e] = s;
    else for (int c = 0; c < CL; c++) cluster.map_shared_rank(full, c)[e] = s;
  }
  if (!FUSED) return;
  cluster.sync();
  const unsigned lane = threadIdx.x & 31, plane = threadIdx.x >> 5;
  float r0 = 0, r1 = 0;
  const unsigned half = o_vpt / 2;
#pragma unroll
  for (int j = 0; j < 12; j++) {
    if (j < (int)o_vpt) {
      float xv = full[(lane * o_vpt + j) % ATTN_OUT];
      if (j < (int)half) r0 += dotw(wreg[j], xv); else r1 += dotw(wreg[j], xv);
    }
  }
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  for (int o = 16; o; o >>= 1) {
    r0 += __shfl_xor_sync(0xffffffffu, r0, o);
    r1 += __shfl_xor_sync(0xffffffffu, r1, o);
  }
  if (lane == 0) {
    y[blockIdx.x * O_ROWS + 2 * plane] = r0;
    y[blockIdx.x * O_ROWS + 2 * plane + 1] = r1;
  }
}
