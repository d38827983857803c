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

#ifdef __CUDACC_RTC__
// NVRTC (dev/cuda_compile/check.py) compiles the kernels only.
template __global__ void attention<0, 8>(const uint4*, unsigned, const uint4*, unsigned, const float*, unsigned, float*);
template __global__ void attention<1, 8>(const uint4*, unsigned, const uint4*, unsigned, const float*, unsigned, float*);
template __global__ void attention<1, 16>(const uint4*, unsigned, const uint4*, unsigned, const float*, unsigned, float*);
template __global__ void stage<0, 0>(const uint4*, unsigned, const float*, unsigned, float*, unsigned*, int, int, unsigned, int, int);
#else
#include "common.cuh"
#include <cstdlib>

struct Stage { unsigned grid, vpt; };

int main() {
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  const int layers = 28;
  // 8-bit and bf16 sizes: qkv, o, gate-up, down (grid, 16-byte vectors a lane), and the fused
  // cube's o vectors a lane (16 rows of 1 536 weights over 256 lanes).
  const Stage qkv[2] = {{256, 3}, {256, 6}}, o[2] = {{192, 3}, {192, 6}},
              gu[2] = {{560, 12}, {560, 24}}, down[2] = {{840, 4}, {840, 8}};
  const unsigned fused_o_vpt[2] = {6, 12};
  const char* shape_names[2] = {"8-bit sizes", "bf16 sizes"};
  const int NV = 4;
  const char* names[NV] = {"separate", "fused", "fused, no KV replica", "fused, clusters of 16"};
  // Keys and values of a 640-token context: 2 KV heads x 640 x 128 x 2 (K, V) x 2 bytes.
  const size_t kv_layer = 2 * 640 * 128 * 2 * 2 / 16;  // vectors
  const unsigned kv_sep = kv_layer / 16, kv_fused = kv_layer / 8;  // vectors a cube
  size_t wvecs = 0;
  for (int sh = 0; sh < 2; sh++) {
    size_t v = (size_t)256 * (qkv[sh].grid * qkv[sh].vpt + o[sh].grid * o[sh].vpt +
                              gu[sh].grid * gu[sh].vpt + down[sh].grid * down[sh].vpt);
    wvecs = std::max(wvecs, v * layers);
  }
  uint4 *w, *kv; cudaMalloc(&w, wvecs * 16); cudaMalloc(&kv, kv_layer * layers * 16);
  {
    std::vector<unsigned> h(1 << 24); unsigned st = 7;
    for (auto& e : h) { st = st * 1664525u + 1013904223u; e = st; }
    for (size_t off = 0; off < wvecs * 4; off += h.size())
      cudaMemcpy((unsigned*)w + off, h.data(), std::min(h.size(), wvecs * 4 - off) * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(kv, w, kv_layer * layers * 16, cudaMemcpyDeviceToDevice);
  }
  const int per = 5;
  float* ys; cudaMalloc(&ys, (size_t)layers * per * 2048 * 4);
  {
    std::vector<float> ones((size_t)layers * per * 2048, 1.0f);
    cudaMemcpy(ys, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice);
  }
  size_t smem_sep = kv_sep * 16 + 8 * 96 * 4, smem_fused = kv_fused * 16 + 4 * 192 * 4 + ATTN_OUT * 4;
  cudaFuncSetAttribute(attention<0, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_sep);
  cudaFuncSetAttribute(attention<1, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_fused);
  cudaFuncSetAttribute(attention<1, 16>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_fused);
  cudaFuncSetAttribute(attention<1, 16>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  for (int sh = 0; sh < 2; sh++) {
    cudaGraphExec_t exec[NV];
    for (int v = 0; v < NV; v++) {
      cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
      size_t off = 0; int slot = 0;
      float* prev = ys + (size_t)(layers * per - 1) * 2048;
      unsigned prev_len = down[sh].grid;
      auto launch = [&](auto kern, unsigned grid, size_t smem, unsigned cluster, auto... args) {
        cudaLaunchConfig_t cfg = {}; cfg.gridDim = dim3(grid); cfg.blockDim = dim3(256);
        cfg.dynamicSmemBytes = smem; cfg.stream = s;
        cudaLaunchAttribute at[2];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        at[1].id = cudaLaunchAttributeClusterDimension;
        at[1].val.clusterDim.x = cluster; at[1].val.clusterDim.y = 1; at[1].val.clusterDim.z = 1;
        cfg.attrs = at; cfg.numAttrs = cluster > 1 ? 2 : 1;
        cudaLaunchKernelEx(&cfg, kern, args...);
      };
      for (int l = 0; l < layers; l++) {
        auto gemv = [&](const Stage& st) {
          float* y = ys + (size_t)(slot++) * 2048;
          launch(stage<0, 0>, st.grid, 0, 1u, (const uint4*)(w + off), st.vpt, (const float*)prev, prev_len, y,
                 (unsigned*)nullptr, 0, -1, 0u, -1, -1);
          off += (size_t)st.grid * 256 * st.vpt; prev = y; prev_len = st.grid;
        };
        gemv(qkv[sh]);
        const uint4* kvl = kv + (size_t)l * kv_layer;
        float* y = ys + (size_t)(slot++) * 2048;
        if (v == 0) {
          launch(attention<0, 8>, 16, smem_sep, 8u, kvl, kv_sep, (const uint4*)w, 0u, (const float*)prev, prev_len, y);
          prev = y; prev_len = ATTN_OUT;
          gemv(o[sh]);
        } else {
          // "no KV replica": each cube reads a twelfth of its share (wrong sums, timing only).
          unsigned kvv = v == 2 ? kv_fused / 12 : v == 3 ? kv_fused / 2 : kv_fused;
          launch(v == 3 ? attention<1, 16> : attention<1, 8>, 96, smem_fused, v == 3 ? 16u : 8u, kvl, kvv,
                 (const uint4*)(w + off), fused_o_vpt[sh], (const float*)prev, prev_len, y);
          off += (size_t)96 * 256 * fused_o_vpt[sh]; prev = y; prev_len = ATTN_OUT; slot++;
        }
        gemv(gu[sh]);
        gemv(down[sh]);
      }
      cudaGraph_t g; cudaStreamEndCapture(s, &g);
      if (cudaGraphInstantiate(&exec[v], g, 0) != cudaSuccess) { printf("instantiate failed: %s\n", cudaGetErrorString(cudaGetLastError())); return 1; }
      cudaGraphDestroy(g);
    }
    std::vector<float> t[NV];
    const int rounds = getenv("FAO_ROUNDS") ? atoi(getenv("FAO_ROUNDS")) : 8;
    for (int round = 0; round < rounds; round++)
      for (int j = 0; j < NV; j++) {
        int v = (round & 1) ? NV - 1 - j : j;
        auto run = [&](int it) { for (int k = 0; k < it; k++) cudaGraphLaunch(exec[v], s); };
        run(5); cudaStreamSynchronize(s);
        t[v].push_back(time_per_iter(s, 40, run) / layers);
      }
    printf("%s:\n", shape_names[sh]);
    for (int v = 0; v < NV; v++) { printf("  %-22s us a layer ", names[v]); print_stats(t[v]); }
    for (int v = 0; v < NV; v++) cudaGraphExecDestroy(exec[v]);
  }
  std::vector<float> h(2048);
  cudaMemcpy(h.data(), ys + 2048, 2048 * 4, cudaMemcpyDeviceToHost);
  printf("attention out[0..2] %g %g, err %s\n", h[0], h[1], cudaGetErrorString(cudaGetLastError()));
}
#endif
