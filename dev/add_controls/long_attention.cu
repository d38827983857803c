// The decode attention at the end of a 32k context: would its keys stream during qkv if its cubes
// could start beside qkv's?
//
// At 32k keys the attention reads 33.5 MB a layer (bf16 K and V of 2 KV heads), on 130 cubes (65
// key splits a KV head, four 128-key tiles each), then a merge kernel combines the splits. It
// adds 15.5 µs a layer against the 11.2 µs of its bytes at the copy bandwidth, and the merge 3.5.
// Its cubes queue their first tile (the keys are settled but the newest) before
// `griddepcontrol.wait`, but each takes 206-211 KB of shared memory, so it can start only on an
// SM that qkv's cubes have left, and qkv lets its dependents launch only after its weight loop.
// Two changes could let the first tiles stream while qkv still runs: a smaller cube (the planes'
// merge buffers, 67 KB, could share the K/V stages' memory: about 144 KB), and qkv signalling its
// dependents at its start. And what is the merge kernel's share?
//
// Synthetic, like fused_attention_o.cu: 28 layers of GEMV-like stages with the 1.5B decode
// step's grids and weight bytes (qkv, o, gate-up, down), with an attention stand-in at 32k keys:
// 130 cubes of 256 units, each streaming four 64 KB tiles of keys and values through two
// `cp.async` stages (the first queued before the wait) with one query value a unit, and writing
// a 768-float partial; then a merge stand-in of 12 cubes, each adding its row over the 65 splits.
// Captured once into a CUDA graph with programmatic edges, replayed; µs a layer, medians over
// rounds that alternate the variants.
//
// Variants: the attention cube at 211 KB or 144 KB of shared memory (the rest unused), qkv
// signalling its dependents after its weight loop (as the step's GEMVs do) or first; and "no
// merge" (o reads the partials: what a merge inside the attention could save at most).
#include "attention_stand_in.cuh"

constexpr unsigned kLongTiles = 4;         // 128-key tiles a cube
constexpr unsigned kLongCubes = 130;       // 65 splits x 2 KV heads
constexpr unsigned kTileVecs = 4096;       // 128 keys x 128 dims x (K, V) x 2 bytes / 16
constexpr size_t kLongKvLayer = (size_t)kLongCubes * kLongTiles * kTileVecs;

// The 32k attention stand-in: the cube's `tiles` tiles from `kv` through two stages, the first
// queued before the wait; its 768-float partial to `part`.
__global__ void __launch_bounds__(256, 1) long_attention(const uint4* __restrict__ kv, unsigned tiles, const float* x,
                                                         unsigned x_len, float* part) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  extern __shared__ __align__(16) uint4 ring[];  // two stages of kTileVecs
  const uint4* src = kv + (size_t)blockIdx.x * tiles * kTileVecs;
  for (unsigned i = threadIdx.x; i < kTileVecs; i += 256) cp_async16(ring + i, src + i);
  asm volatile("cp.async.commit_group;" ::: "memory");
  wait_after(1u);
  const float q = x[(blockIdx.x * 256 + threadIdx.x) % x_len];
  float acc = 0;
  for (unsigned t = 0; t < tiles; t++) {
    if (t + 1 < tiles) {
      uint4* next = ring + ((t + 1) & 1) * kTileVecs;
      const uint4* from = src + (size_t)(t + 1) * kTileVecs;
      for (unsigned i = threadIdx.x; i < kTileVecs; i += 256) cp_async16(next + i, from + i);
      asm volatile("cp.async.commit_group;" ::: "memory");
      asm volatile("cp.async.wait_group 1;" ::: "memory");
    } else {
      asm volatile("cp.async.wait_group 0;" ::: "memory");
    }
    __syncthreads();
    const uint4* tile = ring + (t & 1) * kTileVecs;
    for (unsigned i = threadIdx.x; i < kTileVecs; i += 256) acc += dotw(tile[i], q);
    __syncthreads();
  }
  for (unsigned e = threadIdx.x; e < HEAD_ELEMS; e += 256)
    part[(size_t)blockIdx.x * HEAD_ELEMS + e] = acc * (float)(e + 1) * 1e-6f;
}

// The merge stand-in: one cube a query row (12), each unit adding one of the row's 128 elements
// over half of the KV head's `splits` partials; the two halves summed through shared memory.
__global__ void __launch_bounds__(256) long_merge(const float* part, unsigned splits, float* y) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const unsigned row = blockIdx.x, hk = row / 6, r = row % 6, dd = threadIdx.x % 128, half = threadIdx.x / 128;
  float acc = 0;
#pragma unroll 11
  for (unsigned s = half; s < splits; s += 2) acc += part[(size_t)(hk * splits + s) * HEAD_ELEMS + r * 128 + dd];
  __shared__ float other[128];
  if (half == 1) other[dd] = acc;
  __syncthreads();
  if (half == 0) y[row * 128 + dd] = acc + other[dd];
}

#ifdef __CUDACC_RTC__
// NVRTC (dev/cuda_compile/check.py) compiles the kernels only.
template __global__ void stage<0, 0>(const uint4*, unsigned, const float*, unsigned, float*, unsigned*, int, int, unsigned, int, int);
template __global__ void stage<0, 1>(const uint4*, unsigned, const float*, unsigned, float*, unsigned*, int, int, unsigned, int, int);
#else
#include "chain_host.cuh"

int main() {
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  struct Variant { const char* name; size_t smem; bool qkv_first, merge; };
  const Variant vs[] = {{"211 KB, qkv signals after its loop", 211 * 1024, false, true},
                        {"144 KB, qkv signals after its loop", 144 * 1024, false, true},
                        {"211 KB, qkv signals first", 211 * 1024, true, true},
                        {"144 KB, qkv signals first", 144 * 1024, true, true},
                        {"211 KB, no merge", 211 * 1024, false, false}};
  const int NV = sizeof(vs) / sizeof(vs[0]);
  const char* names[NV];
  for (int v = 0; v < NV; v++) names[v] = vs[v].name;
  uint4 *w, *kv_short, *kv;
  chain_weights(&w, &kv_short);
  cudaMalloc(&kv, kLongKvLayer * kLayers * 16);
  cudaMemcpy(kv, w, kLongKvLayer * kLayers * 16, cudaMemcpyDeviceToDevice);
  const int per = 6;
  float* ys = ones((size_t)kLayers * per * 2048);
  float* part = ones((size_t)kLongCubes * HEAD_ELEMS);
  cudaFuncSetAttribute(long_attention, cudaFuncAttributeMaxDynamicSharedMemorySize, 211 * 1024);
  printf("keys and values %.1f MB a layer, %.2f us at 3.0 TB/s\n", kLongKvLayer * 16 / 1e6, kLongKvLayer * 16 / 3.0e6);
  for (int sh = 0; sh < 2; sh++) {
    cudaGraphExec_t exec[NV];
    for (int v = 0; v < NV; v++) {
      cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
      ChainCursor c{s, w, ys, ys + (size_t)(kLayers * per - 1) * 2048, kDown[sh].grid};
      for (int l = 0; l < kLayers; l++) {
        if (vs[v].qkv_first) {
          float* y = c.next_out();
          launch_pdl(s, stage<0, 1>, kQkv[sh].grid, 256u, 0, 1u, c.w + c.off, kQkv[sh].vpt, c.prev, c.prev_len, y,
                     (unsigned*)nullptr, 0, -1, 0u, -1, -1);
          c.off += (size_t)kQkv[sh].grid * 256 * kQkv[sh].vpt; c.prev = y; c.prev_len = kQkv[sh].grid;
        } else {
          c.plain(kQkv[sh]);
        }
        launch_pdl(s, long_attention, kLongCubes, 256u, vs[v].smem, 1u, (const uint4*)(kv + (size_t)l * kLongKvLayer),
                   kLongTiles, c.prev, c.prev_len, part);
        if (vs[v].merge) {
          float* y = c.next_out();
          launch_pdl(s, long_merge, 12u, 256u, 0, 1u, (const float*)part, kLongCubes / 2, y);
          c.prev = y; c.prev_len = ATTN_OUT;
        } else {
          c.prev = part; c.prev_len = ATTN_OUT;
        }
        c.plain(kO[sh]);
        c.plain(kGateUp[sh]);
        c.plain(kDown[sh]);
      }
      if (!end_capture(s, &exec[v])) return 1;
    }
    time_variants(s, kShapeNames[sh], names, NV, exec, "LONG_ROUNDS");
  }
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
#endif
