// The qkv projection and the decode attention in one clustered launch on few SMs: what would it
// save?
//
// The decode step's layer is five kernels under programmatic dependent launch (qkv, attention,
// o, gate-up, down). qkv (256 cubes) streams 6.3 MB in bf16 (3.1 MB at 8 bits) on every SM; the
// attention (two clusters of 8 cubes, one per KV head) can only start once qkv's grid has
// completed, then runs a chain of latencies with the DRAM nearly idle, and o waits for its grid.
// Fused, each KV head's group of columns (6 query heads, its key and its value: 1 024 columns)
// belongs to one cluster of 16 cubes (a non-portable cluster size), 64 columns a cube. A cube's
// weights (192 KB in bf16, 96 KB at 8 bits) fit its shared memory, so it queues all of them as
// bulk copies before its wait, with its share of the keys and values; after the wait it reads x,
// multiplies, sends its 64 outputs to every cube of the cluster through distributed shared
// memory, and the cluster runs the attention on them at once: one kernel boundary and the
// outputs' round trip through global memory less, and o (launched when the fused cubes start)
// loads its early weights on the 100 SMs the fused launch leaves. The price: qkv's bytes come
// through 32 SMs instead of 132, and its products run on them.
//
// Synthetic, like fused_attention_o.cu: 28 layers of GEMV-like stages with the 1.5B decode
// step's grids and weight bytes (o, gate-up, down as there), the attention the clustered
// stand-in (keys and values in shared memory, one query value a unit, a dot product over the
// tile, the partials sent to their owners' shared memory, a cluster barrier, the owners' sums).
// Captured once into a CUDA graph with programmatic edges, replayed; µs per layer, medians over
// rounds that alternate the variants.
//
// Variants: "separate" (the chain), "qkv on 32 cubes" and "qkv on 64 cubes" (qkv's weights
// through shared memory on fewer SMs, the attention stand-in separate: the price of fewer SMs
// alone), "fused" (the clusters of 16, products as the chain's stand-in stages compute them),
// "fused, real products" (the cube's products as bf16 or int8 weights times x from shared
// memory, 8 or 16 multiply-adds a vector).
#include "attention_stand_in.cuh"
#include "bulk.cuh"

constexpr unsigned kK = 1536;       // qkv's input features
constexpr int kCl = 16;             // cubes of a KV head's cluster in the fused launch
constexpr unsigned kOwn = HEAD_ELEMS / kCl;  // attention outputs each fused cube owns

// MATH 0: the chain's stand-in product of a vector (one x value); 1: 8 bf16 weights; 2: 16 int8.
template <int MATH> __device__ __forceinline__ float dot_vec(uint4 q, const float* x, float acc) {
  if (MATH == 0) return acc + dotw(q, x[0]);
  if (MATH == 1) return dot_bf16(q, x, acc);
  acc = dot_i8_word(q.x, x, acc);
  acc = dot_i8_word(q.y, x + 4, acc);
  acc = dot_i8_word(q.z, x + 8, acc);
  return dot_i8_word(q.w, x + 12, acc);
}

// Vectors of one column's weights: bf16 (SHAPE 1) or 8-bit (0).
template <int SHAPE> __host__ __device__ constexpr unsigned vecs_per_col() { return kK / (SHAPE ? 8 : 16); }

// Dynamic shared memory of a launch: the weights of `cols` columns, `kv_vecs` key and value
// vectors, x, and with the attention the cluster's qkv outputs and the owners' partials.
template <int SHAPE> __host__ __device__ constexpr size_t qkv_smem_bytes(unsigned cols, unsigned kv_vecs, bool attn) {
  return (size_t)cols * vecs_per_col<SHAPE>() * 16 + (size_t)kv_vecs * 16 + kK * 4 +
         (attn ? (kCl * cols + kCl * kOwn) * 4 : 0);
}

// qkv from shared memory: 8 planes of CPP columns each (gridDim.x * 8 * CPP = 2 048 columns),
// all of the cube's weights queued as bulk copies before its wait, one barrier a plane's columns.
// ATTN 0: the outputs to y (2 048); 1: the fused launch (clusters of kCl cubes, kv_vecs keys and
// values a cube), the attention's 1 536 outputs to y. SHAPE: bf16 (1) or 8-bit (0) weights;
// MATH: dot_vec's products. The dependents may launch at once.
template <int SHAPE, int MATH, int ATTN, int CPP>
__global__ void __launch_bounds__(256, 1)
qkv_smem(const uint4* __restrict__ w, const uint4* __restrict__ kv, unsigned kv_vecs, const float* x,
         unsigned x_len, float* y) {
  constexpr unsigned VPC = vecs_per_col<SHAPE>(), COLS = 8 * CPP, CHUNK = CPP * VPC;
  constexpr unsigned XPV = SHAPE ? 8 : 16;  // x values a weight vector
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  extern __shared__ __align__(128) unsigned char smem[];
  uint4* ws = (uint4*)smem;
  uint4* tile = ws + COLS * VPC;
  float* xs = (float*)(tile + kv_vecs);
  float* qkv = xs + kK;           // [kCl][COLS]: the cluster's outputs, by sending cube
  float* recv = qkv + kCl * COLS; // [kCl][kOwn]: the attention partials sent to this cube
  __shared__ __align__(8) unsigned long long bars[9];
  __shared__ float colsum[COLS];
  const unsigned tid = threadIdx.x, lane = tid & 31, plane = tid >> 5;
  if (ATTN) asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
  if (tid == 0) {
    for (int b = 0; b < 9; b++) mbar_init(smem_addr(&bars[b]), 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    const uint4* wc = w + (size_t)blockIdx.x * COLS * VPC;
    for (unsigned p = 0; p < 8; p++) {
      const unsigned bar = smem_addr(&bars[p]);
      mbar_expect(bar, CHUNK * 16);
      for (unsigned off = 0; off < CHUNK; off += 1024)
        bulk_load(smem_addr(ws + p * CHUNK + off), wc + p * CHUNK + off, min(1024u, CHUNK - off) * 16, bar);
    }
    if (ATTN) {
      // Keys and values are settled before the wait (only the newest row is written by qkv).
      const unsigned bar = smem_addr(&bars[8]);
      mbar_expect(bar, kv_vecs * 16);
      bulk_load(smem_addr(tile), kv + (size_t)blockIdx.x * kv_vecs, kv_vecs * 16, bar);
    }
  }
  __syncthreads();
  asm volatile("griddepcontrol.wait;" ::: "memory");
  for (unsigned i = tid; i < kK; i += 256) xs[i] = 1.0f + x[i % x_len] * 1e-3f;
  __syncthreads();
  mbar_wait(smem_addr(&bars[plane]), 0);
  float acc[CPP];
#pragma unroll
  for (int c = 0; c < CPP; c++) {
    acc[c] = 0;
    const uint4* col = ws + plane * CHUNK + c * VPC;
#pragma unroll 2
    for (unsigned v = lane; v < VPC; v += 32) acc[c] = dot_vec<MATH>(col[v], xs + v * XPV, acc[c]);
  }
#pragma unroll
  for (int c = 0; c < CPP; c++) {
    for (int o = 16; o; o >>= 1) acc[c] += __shfl_xor_sync(0xffffffffu, acc[c], o);
    if (lane == 0) colsum[plane * CPP + c] = acc[c];
  }
  __syncthreads();
  if (!ATTN) {
    if (tid < COLS) y[blockIdx.x * COLS + tid] = colsum[tid];
    return;
  }
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned rank = cluster.block_rank(), hk = blockIdx.x / kCl;
  // Every cube of the cluster has started (the arrival above) before any writes to its memory.
  asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
  for (unsigned e = tid; e < kCl * COLS; e += 256)
    cluster.map_shared_rank(qkv, e / COLS)[rank * COLS + e % COLS] = colsum[e % COLS];
  cluster.sync();
  mbar_wait(smem_addr(&bars[8]), 0);
  const float q = qkv[(tid * 7) % (kCl * COLS)];
  float a = 0;
  for (unsigned i = tid; i < kv_vecs; i += 256) a += dotw(tile[i], q);
  for (unsigned e = tid; e < HEAD_ELEMS; e += 256)
    cluster.map_shared_rank(recv, e / kOwn)[rank * kOwn + e % kOwn] = a * (float)(e + 1) * 1e-6f;
  cluster.sync();
  if (tid < kOwn) {
    float s = 0;
    for (int g = 0; g < kCl; g++) s += recv[g * kOwn + tid];
    y[hk * HEAD_ELEMS + rank * kOwn + tid] = s;
  }
}

// Streaming rate on few SMs: each cube queues `vecs` 16-byte vectors from `src` (its slice) into
// its shared memory as bulk copies of 16 KB on one barrier, waits for them and stores one word
// (so that the launch ends only once its bytes are in).
__global__ void __launch_bounds__(256, 1) bulk_stream(const uint4* __restrict__ src, unsigned vecs, unsigned* out) {
  extern __shared__ __align__(128) uint4 buf[];
  __shared__ __align__(8) unsigned long long bar;
  if (threadIdx.x == 0) {
    mbar_init(smem_addr(&bar), 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    mbar_expect(smem_addr(&bar), vecs * 16);
    const uint4* from = src + (size_t)blockIdx.x * vecs;
    for (unsigned off = 0; off < vecs; off += 1024)
      bulk_load(smem_addr(buf + off), from + off, min(1024u, vecs - off) * 16, smem_addr(&bar));
  }
  __syncthreads();
  mbar_wait(smem_addr(&bar), 0);
  if (threadIdx.x == 0) out[blockIdx.x] = buf[vecs - 1].x;
}

#ifdef __CUDACC_RTC__
// NVRTC (dev/cuda_compile/check.py) compiles the kernels only.
#define QKV_SMEM(SHAPE, MATH, ATTN, CPP) \
  template __global__ void qkv_smem<SHAPE, MATH, ATTN, CPP>(const uint4*, const uint4*, unsigned, const float*, unsigned, float*);
QKV_SMEM(0, 0, 0, 8)
QKV_SMEM(0, 0, 0, 4)
QKV_SMEM(0, 0, 1, 8)
QKV_SMEM(0, 2, 1, 8)
QKV_SMEM(1, 0, 0, 8)
QKV_SMEM(1, 0, 0, 4)
QKV_SMEM(1, 0, 1, 8)
QKV_SMEM(1, 1, 1, 8)
template __global__ void attention<0, 8>(const uint4*, unsigned, const uint4*, unsigned, const float*, unsigned, float*);
template __global__ void stage<0, 0>(const uint4*, unsigned, const float*, unsigned, float*, unsigned*, int, int, unsigned, int, int);
#else
#include "chain_host.cuh"

namespace {

// One shape's qkv_smem kernels: qkv on 32 and 64 cubes, fused, fused with real products.
using QkvKernel = void (*)(const uint4*, const uint4*, unsigned, const float*, unsigned, float*);
template <int SHAPE> struct Kernels {
  static constexpr int REAL = SHAPE ? 1 : 2;
  QkvKernel k32 = qkv_smem<SHAPE, 0, 0, 8>, k64 = qkv_smem<SHAPE, 0, 0, 4>, fused = qkv_smem<SHAPE, 0, 1, 8>,
            fused_real = qkv_smem<SHAPE, REAL, 1, 8>;
  size_t smem32 = qkv_smem_bytes<SHAPE>(64, 0, false), smem64 = qkv_smem_bytes<SHAPE>(32, 0, false),
         smem_fused = qkv_smem_bytes<SHAPE>(64, kKvLayer / 32, true);
  void prepare() const {
    cudaFuncSetAttribute(k32, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem32);
    cudaFuncSetAttribute(k64, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem64);
    for (QkvKernel k : {fused, fused_real}) {
      cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_fused);
      cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    }
  }
};

// µs a launch of bulk_stream on `grid` cubes of `bytes` each, each launch from a fresh slice of
// `w` (`span` vectors), medians of 8 rounds of 50 launches (an empty launch's time printed for
// reference).
void stream_rates(cudaStream_t s, const uint4* w, size_t span) {
  unsigned* out; cudaMalloc(&out, 1024 * 4);
  cudaFuncSetAttribute(bulk_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, 196608);
  printf("bulk streaming alone (us a launch, GB/s):\n");
  for (unsigned bytes : {98304u, 196608u})
    for (unsigned grid : {0u, 16u, 32u, 64u, 132u}) {
      const unsigned vecs = bytes / 16, g = grid ? grid : 1, v = grid ? vecs : 16;
      size_t at = 0;
      auto run = [&](int it) {
        for (int k = 0; k < it; k++) {
          if (at + (size_t)g * v > span) at = 0;
          bulk_stream<<<g, 256, v * 16, s>>>(w + at, v, out);
          at += (size_t)g * v;
        }
      };
      std::vector<float> t;
      for (int r = 0; r < 8; r++) { run(5); cudaStreamSynchronize(s); t.push_back(time_per_iter(s, 50, run)); }
      std::sort(t.begin(), t.end());
      if (!grid) { printf("  empty launch %.2f us\n", t[4]); continue; }
      printf("  %3u cubes x %6u B: %.2f us, %.0f GB/s\n", grid, bytes, t[4], (double)grid * bytes / t[4] / 1e3);
    }
  cudaFree(out);
}

}  // namespace

int main() {
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  const int NV = 5;
  const char* names[NV] = {"separate", "qkv on 32 cubes", "qkv on 64 cubes", "fused", "fused, real products"};
  uint4 *w, *kv;
  chain_weights(&w, &kv);
  const int per = 5;
  float* ys = ones((size_t)kLayers * per * 2048);
  cudaFuncSetAttribute(attention<0, 8>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)kStandInSmem);
  Kernels<0> k8; Kernels<1> k16;
  k8.prepare(); k16.prepare();
  stream_rates(s, w, (size_t)kLayers * 256 * (kQkv[1].grid * kQkv[1].vpt + kO[1].grid * kO[1].vpt +
                                                kGateUp[1].grid * kGateUp[1].vpt + kDown[1].grid * kDown[1].vpt));
  printf("shared memory a cube: 8-bit %zu / %zu / %zu, bf16 %zu / %zu / %zu bytes (32 cubes, 64, fused)\n",
         k8.smem32, k8.smem64, k8.smem_fused, k16.smem32, k16.smem64, k16.smem_fused);
  for (int sh = 0; sh < 2; sh++) {
    // Where clusters of 16 whole SMs can go (a GPC with fewer SMs takes none).
    cudaLaunchConfig_t occ = {}; occ.gridDim = dim3(32); occ.blockDim = dim3(256);
    occ.dynamicSmemBytes = sh ? k16.smem_fused : k8.smem_fused;
    cudaLaunchAttribute cl[1]; cl[0].id = cudaLaunchAttributeClusterDimension;
    cl[0].val.clusterDim.x = kCl; cl[0].val.clusterDim.y = 1; cl[0].val.clusterDim.z = 1;
    occ.attrs = cl; occ.numAttrs = 1;
    int clusters = -1;
    cudaOccupancyMaxActiveClusters(&clusters, sh ? k16.fused : k8.fused, &occ);
    printf("%s: at most %d fused clusters of %d active (%s)\n", kShapeNames[sh], clusters, kCl,
           cudaGetErrorString(cudaGetLastError()));
    const QkvKernel k32 = sh ? k16.k32 : k8.k32, k64 = sh ? k16.k64 : k8.k64;
    const QkvKernel fused = sh ? k16.fused : k8.fused, fused_real = sh ? k16.fused_real : k8.fused_real;
    const size_t smem32 = sh ? k16.smem32 : k8.smem32, smem64 = sh ? k16.smem64 : k8.smem64;
    const size_t smem_fused = sh ? k16.smem_fused : k8.smem_fused;
    const size_t qkv_vecs = (size_t)kQkv[sh].grid * 256 * kQkv[sh].vpt;
    cudaGraphExec_t exec[NV];
    for (int v = 0; v < NV; v++) {
      cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
      ChainCursor c{s, w, ys, ys + (size_t)(kLayers * per - 1) * 2048, kDown[sh].grid};
      for (int l = 0; l < kLayers; l++) {
        const uint4* kvl = kv + (size_t)l * kKvLayer;
        if (v == 0) {
          c.plain(kQkv[sh]);
        } else {
          const bool attn = v >= 3;
          const unsigned grid = v == 2 ? 64 : 32;
          float* y = c.next_out();
          launch_pdl(s, v == 1 ? k32 : v == 2 ? k64 : v == 3 ? fused : fused_real, grid, 256u,
                     v == 1 ? smem32 : v == 2 ? smem64 : smem_fused, attn ? (unsigned)kCl : 1u, c.w + c.off, kvl,
                     attn ? (unsigned)(kKvLayer / 32) : 0u, c.prev, c.prev_len, y);
          c.off += qkv_vecs; c.prev = y; c.prev_len = attn ? ATTN_OUT : 2048u;
        }
        if (v < 3) c.attention_stand_in(kvl, kStandInSmem);
        c.plain(kO[sh]);
        c.plain(kGateUp[sh]);
        c.plain(kDown[sh]);
      }
      if (!end_capture(s, &exec[v])) return 1;
    }
    time_variants(s, kShapeNames[sh], names, NV, exec, "FQA_ROUNDS");
  }
  std::vector<float> h(2048);
  cudaMemcpy(h.data(), ys + 2048, 2048 * 4, cudaMemcpyDeviceToHost);
  printf("attention out[0..2] %g %g, err %s\n", h[0], h[1], cudaGetErrorString(cudaGetLastError()));
}
#endif
