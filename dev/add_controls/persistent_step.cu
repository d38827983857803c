// One persistent kernel for the whole decode step, priced on the synthetic chain.
//
// The step launches five kernels a layer under programmatic dependent launch. A kernel can load
// its weights before its wait only into registers (about one 16-byte vector a lane), so at every
// boundary the DRAM idles while the grid before drains, completes and flushes and the next
// cubes read their activation. The weights depend on nothing the step computes: a kernel that
// stays resident for the whole step can stream every stage's weights through a shared-memory
// ring, one producer warp issuing `cp.async.bulk` copies as far ahead as the ring holds, across
// stage and layer ends, while its consumer warps wait on counters for the activations of the
// stage before. How close does that come to the bytes' floor, against the five-launch chain
// (carveout.cu's, with the clustered attention stand-in) in the same run?
//
// Both compute synthetic products (every weight byte read once, one value a cube handed on);
// neither has norms, epilogues or the attention's arithmetic: they price the launch structure,
// not the step.
//
// The persistent kernel: one cube per SM (a cooperative launch, so that all are resident), eight
// consumer warps and one producer warp. Each stage's bytes (the chain's, in the same order) are
// split evenly over the cubes that work on it: all of them, and 16 for the keys and values, as
// the real attention's two clusters of eight. A cube's slice goes through the ring in chunks of
// CH 16-byte vectors. A stage ends with each working cube's sum stored and a release add on the
// stage's counter; a cube's consumers start the next stage once one of them has read that
// counter at the stage's cube count (acquire) and all have passed a named barrier. A memset node
// zeroes the counters before each replay (inside the timing). The sums are u32 (exact in any
// order) and one replay is checked against a host reference.
//
// "with x" variants also hand on activations of the step's widths (2048 qkv outputs, 1536 of
// the attention, o and down, 8960 of gate-up, as 16-bit values two a word): each working cube
// stores its share after its sum, and every cube of the next stage reads all of them from L2
// before it uses its first chunk, as the real projections read x. The chain does not. The
// "attention +N" variant also makes the keys' cubes take N dependent reads from L2 (a chase
// through a table) after their sum, standing in for the real attention's chain of latencies
// (its queries, the exchange between the cubes of a cluster), which the chain's clustered
// stand-in has and the plain persistent stage lacks. The "math" variants (MATH 1 for bf16
// sizes, 2 for 8-bit ones) replace the u32 sums by the products a consumer of real weights
// issues: each 16-byte vector as 8 bf16 or 16 int8 weights turned into floats (a shift or mask,
// a byte permute and a subtraction) and multiplied into the sum with x from shared memory;
// their sums are floats and not checked.
//
// The "ring chain" keeps one launch a stage but gives each the same ring: a stage's cubes (one
// per SM at most, each with about 100 KB of ring, so that two stages' cubes fit an SM) let their
// dependents launch at once and queue their first chunks before `griddepcontrol.wait`, so that
// the next stage's weights stream while the stage before still runs. It checks against the same
// reference.
#include "chain.cuh"
#include "bulk.cuh"

constexpr int kConsumers = 256;  // eight warps; the producer is a ninth
constexpr int kMaxSlots = 48;
constexpr unsigned kActWords = 4480;  // the widest activation (gate-up's 8960 16-bit values)
constexpr unsigned kChase = 1024;     // entries of the attention's dependent-read table

// One stage of the step: `vecs` 16-byte vectors from `ptr`, split over cubes 0 .. `cubes`, an
// activation of `out_words` words handed on, and whether it is the keys and values (`keys`).
struct StageDesc {
  const uint4* ptr;
  unsigned vecs, cubes, out_words, keys;
};

// The consumer warps only (named barrier 1): the producer runs ahead.
__device__ __forceinline__ void consumers_sync() {
  asm volatile("bar.sync 1, %0;" ::"n"(kConsumers) : "memory");
}

__device__ __forceinline__ void red_release_add(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// x for the products of the math variants: 2048 floats a cube, indexed by a vector's columns.
constexpr unsigned kXs = 2048;

// Cube `cube`'s share of a stage: vectors [begin, end).
__device__ __forceinline__ void stage_slice(const StageDesc& st, unsigned cube, unsigned& begin,
                                            unsigned& end) {
  unsigned per = (st.vecs + st.cubes - 1) / st.cubes;
  begin = min(cube * per, st.vecs);
  end = min(begin + per, st.vecs);
}

// Where the producer or the consumers stand in a cube's ring: `slots` chunks of CH vectors in
// dynamic shared memory, a full and an empty mbarrier a slot.
struct RingPos {
  unsigned slots, slot = 0, phase = 0;
  __device__ void advance() {
    if (++slot == slots) { slot = 0; phase ^= 1; }
  }
};

// Unit 0 initialises the ring's barriers (full: the producer's arrival and its bytes; empty: one
// arrival a consumer warp); the caller syncs the cube after.
__device__ __forceinline__ void ring_init(unsigned long long* full, unsigned long long* empty, unsigned slots) {
  if (threadIdx.x != 0) return;
  for (unsigned i = 0; i < slots; i++) {
    mbar_init(smem_addr(&full[i]), 1);
    mbar_init(smem_addr(&empty[i]), kConsumers / 32);
  }
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// The producer's copies of cube `cube`'s slice of `st`, each as soon as its slot is free (a
// fresh barrier counts as freed once: the wait on parity 1 passes).
template <int CH>
__device__ __forceinline__ void produce_stage(const StageDesc& st, unsigned cube, uint4* ring,
                                              unsigned long long* full, unsigned long long* empty,
                                              RingPos& p) {
  if (cube >= st.cubes) return;
  unsigned begin, end;
  stage_slice(st, cube, begin, end);
  for (unsigned v = begin; v < end; v += CH) {
    const unsigned n = min((unsigned)CH, end - v);
    mbar_wait(smem_addr(&empty[p.slot]), p.phase ^ 1);
    mbar_expect(smem_addr(&full[p.slot]), n * 16);
    bulk_load(smem_addr(ring + (size_t)p.slot * CH), st.ptr + v, n * 16, smem_addr(&full[p.slot]));
    p.advance();
  }
}

// A consumer unit's x: the previous stage's sum of cube `tid % prev.cubes`, and with `x_read`
// every word of its activation that falls to this unit (stage `g`'s previous is `pg`).
__device__ __forceinline__ unsigned read_x(const StageDesc& prev, unsigned pg, unsigned x_read,
                                           const unsigned* y, const unsigned* act) {
  const unsigned tid = threadIdx.x;
  unsigned xv = __ldcg(y + (size_t)pg * 1024 + tid % prev.cubes);
  if (x_read)
    for (unsigned j = tid; j < prev.out_words; j += kConsumers) xv ^= __ldcg(act + (size_t)pg * kActWords + j);
  return xv | 1u;
}

// Cube `cube`'s consumers through its slice of stage `g` (which it works on): the products, the
// cube's sum (with the keys' cubes' dependent reads) stored in y, and with `x_read` its share of
// the activation in act. Returns after a barrier that orders those stores before unit 0's next
// instruction.
template <int CH, int MATH>
__device__ __forceinline__ void consume_stage(const StageDesc& st, unsigned g, unsigned cube, unsigned xv,
                                              unsigned x_read, unsigned hops, const unsigned* chase,
                                              const uint4* ring, unsigned long long* full,
                                              unsigned long long* empty, RingPos& p, const float* xs,
                                              unsigned* part, unsigned* total, unsigned* y, unsigned* act) {
  const unsigned tid = threadIdx.x;
  unsigned begin, end, acc = 0;
  float facc = 0;
  stage_slice(st, cube, begin, end);
  for (unsigned v = begin; v < end; v += CH) {
    const unsigned n = min((unsigned)CH, end - v);
    mbar_wait(smem_addr(&full[p.slot]), p.phase);
    const uint4* c = ring + (size_t)p.slot * CH;
#pragma unroll
    for (unsigned j = tid; j < CH; j += kConsumers)
      if (j < n) {
        const uint4 q = c[j];
        if (MATH == 0) {
          acc += (q.x + q.y + q.z + q.w) * xv;
        } else if (MATH == 1) {
          facc = dot_bf16(q, xs + (((v + j) * 8) & (kXs - 1)), facc);
        } else {
          const float* x16 = xs + (((v + j) * 16) & (kXs - 1));
          facc = dot_i8_word(q.x, x16, facc);
          facc = dot_i8_word(q.y, x16 + 4, facc);
          facc = dot_i8_word(q.z, x16 + 8, facc);
          facc = dot_i8_word(q.w, x16 + 12, facc);
        }
      }
    __syncwarp();
    if ((tid & 31) == 0) mbar_arrive(smem_addr(&empty[p.slot]));
    p.advance();
  }
  if (MATH) acc = __float_as_uint(facc) ^ xv;
  for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  if ((tid & 31) == 0) part[tid >> 5] = acc;
  consumers_sync();
  if (tid == 0) {
    unsigned t = 0;
    for (int k = 0; k < kConsumers / 32; k++) t += part[k];
    if (st.keys) {
      unsigned at = t & (kChase - 1);
      for (unsigned h = 0; h < hops; h++) at = __ldcg(chase + at);
      t += at;
    }
    *total = t * 2654435761u + g + cube;
    y[(size_t)g * 1024 + cube] = *total;
  }
  if (x_read) {
    consumers_sync();
    const unsigned per = (st.out_words + st.cubes - 1) / st.cubes, t = *total;
    unsigned* out = act + (size_t)g * kActWords + cube * per;
    for (unsigned j = tid; j < per && cube * per + j < st.out_words; j += kConsumers) out[j] = t + j;
    consumers_sync();
  }
}

// x for the math variants' products.
__device__ __forceinline__ void fill_xs(float* xs) {
  for (unsigned i = threadIdx.x; i < kXs; i += blockDim.x) xs[i] = 1.0f + i * 1e-3f;
}

// y: 1024 u32 a stage, the sum of each cube that worked on it (the previous replay's last stage
// is the first stage's input); act: kActWords u32 a stage, the activations handed on where
// `x_read`; counters: one a stage, zero at launch. `slots` chunks of CH vectors of dynamic
// shared memory. MATH: the products (0 u32 sums, 1 bf16, 2 int8).
template <int CH, int MATH>
__global__ void __launch_bounds__(kConsumers + 32, 1)
persistent_step(const StageDesc* __restrict__ stages, int n_stages, unsigned slots, unsigned x_read,
                unsigned hops, const unsigned* __restrict__ chase, unsigned* y, unsigned* act,
                unsigned* counters) {
  extern __shared__ __align__(128) uint4 ring[];
  __shared__ __align__(8) unsigned long long full[kMaxSlots], empty[kMaxSlots];
  __shared__ unsigned part[kConsumers / 32], total;
  __shared__ __align__(16) float xs[MATH ? kXs : 1];
  const unsigned cube = blockIdx.x, tid = threadIdx.x;
  ring_init(full, empty, slots);
  if (MATH) fill_xs(xs);
  __syncthreads();
  RingPos p{slots};
  if (tid >= kConsumers) {
    // The producer: every chunk of every stage this cube works on, in order.
    if (tid != kConsumers) return;
    for (int g = 0; g < n_stages; g++) produce_stage<CH>(stages[g], cube, ring, full, empty, p);
    return;
  }
  for (int g = 0; g < n_stages; g++) {
    const StageDesc st = stages[g];
    const unsigned pg = g ? g - 1 : n_stages - 1;
    const StageDesc prev = stages[pg];
    if (g > 0) {
      if (tid == 0)
        while (ld_acquire(counters + pg) < prev.cubes) {
        }
      consumers_sync();
    }
    const unsigned xv = read_x(prev, pg, x_read, y, act);
    if (cube < st.cubes) {
      consume_stage<CH, MATH>(st, g, cube, xv, x_read, hops, chase, ring, full, empty, p, xs, part, &total,
                              y, act);
      // Cumulative over the stores the barrier in consume_stage ordered before it.
      if (tid == 0) red_release_add(counters + g, 1);
    }
  }
}

// One stage of the ring chain: a launch of st.cubes cubes under programmatic dependent launch
// that lets its dependents launch at once, queues the first `slots` chunks of its slice before
// its wait for the stage before (stage `pg`), then goes on as the persistent kernel's stage does.
// Two of its cubes fit an SM with up to about 100 KB of ring each, so a stage's cubes queue
// their copies while the stage before still streams.
template <int CH>
__global__ void __launch_bounds__(kConsumers + 32, 1)
ring_stage(StageDesc st, StageDesc prev, unsigned g, unsigned pg, unsigned slots, unsigned x_read, unsigned hops,
           const unsigned* __restrict__ chase, unsigned* y, unsigned* act) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  extern __shared__ __align__(128) uint4 ring[];
  __shared__ __align__(8) unsigned long long full[kMaxSlots], empty[kMaxSlots];
  __shared__ unsigned part[kConsumers / 32], total;
  ring_init(full, empty, slots);
  __syncthreads();
  RingPos p{slots};
  if (threadIdx.x >= kConsumers) {
    if (threadIdx.x == kConsumers) produce_stage<CH>(st, blockIdx.x, ring, full, empty, p);
    return;
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const unsigned xv = read_x(prev, pg, x_read, y, act);
  consume_stage<CH, 0>(st, g, blockIdx.x, xv, x_read, hops, chase, ring, full, empty, p, nullptr, part, &total,
                       y, act);
}

#ifdef __CUDACC_RTC__
// NVRTC (dev/cuda_compile/check.py) compiles the kernels only.
#define PERSISTENT_STEP(CH, MATH)                                                                    \
  template __global__ void persistent_step<CH, MATH>(const StageDesc*, int, unsigned, unsigned, unsigned, \
                                                     const unsigned*, unsigned*, unsigned*, unsigned*);
PERSISTENT_STEP(512, 0)
PERSISTENT_STEP(1024, 0)
PERSISTENT_STEP(512, 1)
PERSISTENT_STEP(512, 2)
template __global__ void ring_stage<512>(StageDesc, StageDesc, unsigned, unsigned, unsigned, unsigned, unsigned,
                                         const unsigned*, unsigned*, unsigned*);
#else
#include "chain_host.cuh"

namespace {

// A stage of the persistent launch on the host: where its vectors start (in the weights or in
// the keys and values), how many, and over how many cubes.
struct StageHost {
  bool kv;
  size_t off;
  unsigned vecs, cubes, out_words;
};

// The step's stages for shape `sh`, in the chain's order and at its offsets.
std::vector<StageHost> step_stages(int sh, unsigned sms) {
  std::vector<StageHost> v;
  size_t off = 0;
  auto plain = [&](const Stage& st, unsigned out_words) {
    const unsigned vecs = st.grid * 256 * st.vpt;
    v.push_back({false, off, vecs, sms, out_words});
    off += vecs;
  };
  for (int l = 0; l < kLayers; l++) {
    plain(kQkv[sh], 1024);
    v.push_back({true, (size_t)l * kKvLayer, (unsigned)kKvLayer, 16, 768});
    plain(kO[sh], 768);
    plain(kGateUp[sh], kActWords);
    plain(kDown[sh], 768);
  }
  return v;
}

// The u32 sum of each 16-byte vector of the words the weights repeat (weight_words; the keys and
// values are the weights' first vectors).
std::vector<unsigned> vector_sums() {
  const std::vector<unsigned> h = weight_words();
  std::vector<unsigned> vsum(h.size() / 4);
  for (size_t i = 0; i < vsum.size(); i++) vsum[i] = h[4 * i] + h[4 * i + 1] + h[4 * i + 2] + h[4 * i + 3];
  return vsum;
}

// The persistent kernel's sums for one replay from zeroed outputs and activations, computed on
// the host from the weights' vector sums `vsum`, for the chunk size `ch`.
std::vector<unsigned> reference(const std::vector<StageHost>& stages, const std::vector<unsigned>& vsum,
                                unsigned ch, bool x_read, unsigned hops, const std::vector<unsigned>& chase) {
  const size_t vecs = vsum.size();
  const size_t n = stages.size();
  std::vector<unsigned> y(n * 1024, 0), act(n * kActWords, 0);
  for (size_t g = 0; g < n; g++) {
    const StageHost& s = stages[g];
    const size_t pg = (g + n - 1) % n;
    unsigned xv[kConsumers];
    for (unsigned t = 0; t < kConsumers; t++) {
      xv[t] = y[pg * 1024 + t % stages[pg].cubes];
      if (x_read)
        for (unsigned j = t; j < stages[pg].out_words; j += kConsumers) xv[t] ^= act[pg * kActWords + j];
      xv[t] |= 1u;
    }
    const unsigned per = (s.vecs + s.cubes - 1) / s.cubes;
    const unsigned out_per = (s.out_words + s.cubes - 1) / s.cubes;
    for (unsigned c = 0; c < s.cubes; c++) {
      const unsigned begin = std::min(c * per, s.vecs), end = std::min(begin + per, s.vecs);
      unsigned acc = 0;
      for (unsigned v = begin; v < end; v++) acc += vsum[(s.off + v) % vecs] * xv[((v - begin) % ch) % kConsumers];
      if (s.kv) {
        unsigned at = acc & (kChase - 1);
        for (unsigned h = 0; h < hops; h++) at = chase[at];
        acc += at;
      }
      const unsigned total = acc * 2654435761u + (unsigned)g + c;
      y[g * 1024 + c] = total;
      for (unsigned j = 0; j < out_per && c * out_per + j < s.out_words; j++)
        act[g * kActWords + c * out_per + j] = total + j;
    }
  }
  return y;
}

// A ring variant: the persistent kernel or the ring chain (`chain`), chunk size, ring slots,
// whether activations are handed on, the keys' cubes' dependent reads, and whether the products
// are the weights' (bf16 or int8 by shape; persistent only).
struct Ring {
  bool chain;
  unsigned ch, slots;
  bool x_read;
  unsigned hops;
  bool math;
};

// Whether the persistent launch asks to be cooperative (cleared where a graph will not take it).
bool g_cooperative = true;

template <int CH, int MATH>
void launch_persistent(cudaStream_t s, unsigned sms, const StageDesc* stages, int n, const Ring& r,
                       const unsigned* chase, unsigned* y, unsigned* act, unsigned* counters) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(sms); cfg.blockDim = dim3(kConsumers + 32);
  cfg.dynamicSmemBytes = (size_t)r.slots * CH * 16; cfg.stream = s;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeCooperative; at[0].val.cooperative = 1;
  cfg.attrs = at; cfg.numAttrs = g_cooperative ? 1 : 0;
  cudaLaunchKernelEx(&cfg, persistent_step<CH, MATH>, stages, n, r.slots, (unsigned)r.x_read, r.hops, chase, y, act,
                     counters);
}

// One replay of ring variant `r` on `s`: the persistent kernel (`stages` on the device; `sh` picks
// the products of a math variant: 0 (8-bit sizes) int8, 1 bf16) or the ring chain (`hs` on the
// host).
void launch_ring(cudaStream_t s, unsigned sms, const StageDesc* stages, const std::vector<StageDesc>& hs,
                 const Ring& r, int sh, const unsigned* chase, unsigned* y, unsigned* act, unsigned* counters) {
  const int n = (int)hs.size();
  if (r.chain) {
    for (int g = 0; g < n; g++) {
      const int pg = g ? g - 1 : n - 1;
      launch_pdl(s, ring_stage<512>, hs[g].cubes, kConsumers + 32, (size_t)r.slots * 512 * 16, 1u, hs[g], hs[pg],
                 (unsigned)g, (unsigned)pg, r.slots, (unsigned)r.x_read, r.hops, chase, y, act);
    }
    return;
  }
  cudaMemsetAsync(counters, 0, (size_t)n * 4, s);
  if (r.math && sh == 0) launch_persistent<512, 2>(s, sms, stages, n, r, chase, y, act, counters);
  else if (r.math) launch_persistent<512, 1>(s, sms, stages, n, r, chase, y, act, counters);
  else if (r.ch == 512) launch_persistent<512, 0>(s, sms, stages, n, r, chase, y, act, counters);
  else launch_persistent<1024, 0>(s, sms, stages, n, r, chase, y, act, counters);
}

}  // namespace

int main() {
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  int sms_i = 0;
  cudaDeviceGetAttribute(&sms_i, cudaDevAttrMultiProcessorCount, 0);
  const unsigned sms = (unsigned)sms_i;
  const Ring rings[] = {{false, 512, 24, false, 0, false}, {false, 1024, 12, false, 0, false},
                        {false, 512, 8, false, 0, false},  {false, 512, 2, false, 0, false},
                        {false, 512, 24, true, 0, false},  {false, 1024, 12, true, 0, false},
                        {false, 512, 24, true, 4, false},  {false, 512, 24, true, 4, true},
                        {true, 512, 12, false, 0, false},  {true, 512, 12, true, 4, false}};
  const int NR = sizeof(rings) / sizeof(rings[0]), NV = NR + 1;
  char labels[NV][64];
  const char* names[NV];
  snprintf(labels[0], 64, "chain of five launches a layer");
  for (int r = 0; r < NR; r++)
    snprintf(labels[r + 1], 64, "%s, %u x %u KB ring%s", rings[r].chain ? "ring chain" : "persistent",
             rings[r].slots, rings[r].ch * 16 / 1024, rings[r].x_read ? ", with x" : "");
  for (int r = 0; r < NR; r++) {
    if (rings[r].hops) snprintf(labels[r + 1] + strlen(labels[r + 1]), 24, ", attention +%u", rings[r].hops);
    if (rings[r].math) strcat(labels[r + 1], ", math");
  }
  for (int v = 0; v < NV; v++) names[v] = labels[v];
  for (auto k : {persistent_step<512, 0>, persistent_step<1024, 0>, persistent_step<512, 1>, persistent_step<512, 2>})
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  cudaFuncSetAttribute(ring_stage<512>, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024);
  uint4 *w, *kv;
  chain_weights(&w, &kv);
  const int per = 5, n = kLayers * per;
  float* ys = ones((size_t)n * 2048);
  unsigned *y, *act, *counters;
  cudaMalloc(&y, (size_t)n * 1024 * 4); cudaMalloc(&counters, (size_t)n * 4);
  cudaMalloc(&act, (size_t)n * kActWords * 4);
  // The chase table: one cycle through every entry (i -> i * 389 + 1 mod 1024).
  std::vector<unsigned> chase_h(kChase);
  for (unsigned i = 0; i < kChase; i++) chase_h[i] = (i * 389 + 1) % kChase;
  unsigned* chase; cudaMalloc(&chase, kChase * 4);
  cudaMemcpy(chase, chase_h.data(), kChase * 4, cudaMemcpyHostToDevice);
  StageDesc* d_stages; cudaMalloc(&d_stages, n * sizeof(StageDesc));
  const std::vector<unsigned> vsum = vector_sums();
  printf("%u SMs\n", sms);
  for (int sh = 0; sh < 2; sh++) {
    const std::vector<StageHost> hs = step_stages(sh, sms);
    std::vector<StageDesc> ds;
    double bytes = 0;
    for (const StageHost& h : hs) {
      ds.push_back({(h.kv ? kv : w) + h.off, h.vecs, h.cubes, h.out_words, h.kv});
      bytes += h.vecs * 16.0;
    }
    cudaMemcpy(d_stages, ds.data(), n * sizeof(StageDesc), cudaMemcpyHostToDevice);
    printf("%s: %.1f MB a layer, %.2f us a layer at 3.0 TB/s\n", kShapeNames[sh], bytes / kLayers / 1e6,
           bytes / kLayers / 3.0e6);
    // One replay of each ring from zeroed outputs against the host's sums.
    for (int r = 0; r < NR; r++) {
      cudaMemsetAsync(y, 0, (size_t)n * 1024 * 4, s);
      cudaMemsetAsync(act, 0, (size_t)n * kActWords * 4, s);
      launch_ring(s, sms, d_stages, ds, rings[r], sh, chase, y, act, counters);
      std::vector<unsigned> got((size_t)n * 1024);
      cudaMemcpyAsync(got.data(), y, got.size() * 4, cudaMemcpyDeviceToHost, s);
      cudaError_t e = cudaStreamSynchronize(s);
      if (rings[r].math) {
        printf("  check %s: %s, float sums not checked\n", names[r + 1], cudaGetErrorString(e));
        continue;
      }
      const std::vector<unsigned> want = reference(hs, vsum, rings[r].ch, rings[r].x_read, rings[r].hops, chase_h);
      size_t bad = 0;
      for (int g = 0; g < n; g++)
        for (unsigned c = 0; c < hs[g].cubes; c++) bad += got[(size_t)g * 1024 + c] != want[(size_t)g * 1024 + c];
      printf("  check %s: %s, %zu of the stages' sums differ\n", names[r + 1], cudaGetErrorString(e), bad);
    }
    cudaGraphExec_t exec[NV];
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    ChainCursor c{s, w, ys, ys + (size_t)(n - 1) * 2048, kDown[sh].grid};
    for (int l = 0; l < kLayers; l++) c.layer(sh, l, kv, kStandInSmem);
    if (!end_capture(s, &exec[0])) return 1;
    for (int r = 0; r < NR; r++) {
      cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
      launch_ring(s, sms, d_stages, ds, rings[r], sh, chase, y, act, counters);
      if (!end_capture(s, &exec[r + 1])) {
        if (!g_cooperative) return 1;
        // One cube per SM is resident without the attribute too while nothing else runs.
        printf("  the graph takes no cooperative launch: launched as a plain one\n");
        g_cooperative = false;
        r--;
      }
    }
    time_variants(s, kShapeNames[sh], names, NV, exec, "PERSISTENT_ROUNDS");
  }
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
#endif
