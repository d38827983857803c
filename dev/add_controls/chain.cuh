// The GEMV-like stage of the synthetic decode chains (boundary.cu, fused_attention_o.cu,
// fused_mlp.cu, carveout.cu) and the batched loads and cube sum that fused_mlp.cu's kernels share
// with it: device code only, so that NVRTC (dev/cuda_compile/check.py) compiles it too.
#pragma once

__device__ __forceinline__ void wait_after(unsigned dep) {
  // `griddepcontrol.wait` behind a predicate on a loaded value, so that ptxas cannot hoist it
  // above that load.
  asm volatile("{ .reg .pred q; setp.eq.u32 q, %0, 0; @q griddepcontrol.wait; @!q griddepcontrol.wait; }"
               :: "r"(dep) : "memory");
}

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ float dotw(uint4 v, float x) {
  // Weights as floats in [1, 2): cheap, exact, and the compiler cannot drop the loads.
  float a = __uint_as_float((v.x & 0x007fffffu) | 0x3f800000u);
  float b = __uint_as_float((v.y & 0x007fffffu) | 0x3f800000u);
  float c = __uint_as_float((v.z & 0x007fffffu) | 0x3f800000u);
  float d = __uint_as_float((v.w & 0x007fffffu) | 0x3f800000u);
  return (a + b + c + d) * x;
}

// v[j] = w[from + j * stride] for the j from J0 on whose index is below `end`, zero past it.
template <int J0 = 0, int BATCH>
__device__ __forceinline__ void load_batch(uint4 (&v)[BATCH], const uint4* __restrict__ w,
                                           size_t from, size_t stride, size_t end) {
#pragma unroll
  for (int j = J0; j < BATCH; j++) {
    size_t i = from + j * stride;
    v[j] = i < end ? w[i] : make_uint4(0, 0, 0, 0);
  }
}

template <int BATCH> __device__ __forceinline__ float dot_batch(const uint4 (&v)[BATCH], float x) {
  float acc = 0;
#pragma unroll
  for (int j = 0; j < BATCH; j++) acc += dotw(v[j], x);
  return acc;
}

// The products of w[from], w[from + stride], ... below `end` with x, BATCH vectors loaded
// before any is used.
template <int BATCH>
__device__ __forceinline__ float dot_batches(const uint4* __restrict__ w, size_t from,
                                             size_t stride, size_t end, float x) {
  float acc = 0;
  for (; from < end; from += BATCH * stride) {
    uint4 v[BATCH];
    load_batch(v, w, from, stride, end);
    acc += dot_batch(v, x);
  }
  return acc;
}

// The 256-unit cube's sum of `acc`, stored by unit 0 (which gets true) as y[blockIdx.x].
__device__ __forceinline__ bool cube_sum_store(float acc, float* y) {
  for (int o = 16; o; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
  __shared__ float part[8];
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = acc;
  __syncthreads();
  if (threadIdx.x != 0) return false;
  float t = 0;
  for (int k = 0; k < 8; k++) t += part[k];
  y[blockIdx.x] = sinf(t * 1e-3f);
  return true;
}

// FLAG: hand-over by counters; FIRST: trigger the dependents at the start.
template <int FLAG, int FIRST>
__global__ void __launch_bounds__(256) stage(const uint4* __restrict__ w, unsigned vpt,
                                             const float* x, unsigned x_len, float* y,
                                             unsigned* flags, int me, int prev,
                                             unsigned prev_target, int reset0, int reset1) {
  if (FIRST) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const uint4* p = w + (size_t)blockIdx.x * vpt * 256 + threadIdx.x;
  uint4 first = p[0];
  // A value of the loaded vector, so that neither the wait nor the spin goes above the load.
  unsigned dep = first.x * 3u;
  if (FLAG) {
    if (threadIdx.x == 0) {
      if (prev >= 0) {
        asm volatile("" ::"r"(dep) : "memory");
        while (ld_acquire(flags + prev) < prev_target) {
        }
      }
      if (blockIdx.x == 0) {
        if (reset0 >= 0) flags[reset0] = 0;
        if (reset1 >= 0) flags[reset1] = 0;
      }
    }
    __syncthreads();
  } else {
    wait_after(dep);
  }
  float xv = x[(blockIdx.x * 256 + threadIdx.x) % x_len];
  float acc = dotw(first, xv);
  for (unsigned i = 1; i < vpt; i++) acc += dotw(p[(size_t)i * 256], xv);
  if (!FIRST) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (cube_sum_store(acc, y) && FLAG) {
    __threadfence();
    atomicAdd(flags + me, 1u);
  }
}
