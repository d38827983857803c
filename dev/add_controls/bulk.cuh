// Bulk copies into shared memory and their mbarriers, and the products of real weight encodings
// (bf16, int8 through the exponent of 2^23), shared by the synthetic chains that stream weights
// through shared memory (persistent_step.cu, fused_qkv_attention.cu): device code only, so that
// NVRTC (dev/cuda_compile/check.py) compiles it too.
#pragma once

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
  unsigned ok = 0;
  while (!ok)
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(ok)
        : "r"(bar), "r"(parity)
        : "memory");
}

__device__ __forceinline__ void mbar_arrive(unsigned bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// The producer's arrival on a full barrier, announcing the bytes its copy will complete.
__device__ __forceinline__ void mbar_expect(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void bulk_load(unsigned dst, const void* src, unsigned bytes, unsigned bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}

// The bf16 products of 8 weights with x[0..8].
__device__ __forceinline__ float dot_bf16(uint4 q, const float* x, float acc) {
  const float4 a = *(const float4*)x, b = *(const float4*)(x + 4);
  acc = fmaf(__uint_as_float(q.x << 16), a.x, acc);
  acc = fmaf(__uint_as_float(q.x & 0xffff0000u), a.y, acc);
  acc = fmaf(__uint_as_float(q.y << 16), a.z, acc);
  acc = fmaf(__uint_as_float(q.y & 0xffff0000u), a.w, acc);
  acc = fmaf(__uint_as_float(q.z << 16), b.x, acc);
  acc = fmaf(__uint_as_float(q.z & 0xffff0000u), b.y, acc);
  acc = fmaf(__uint_as_float(q.w << 16), b.z, acc);
  return fmaf(__uint_as_float(q.w & 0xffff0000u), b.w, acc);
}

// The int8 products of one word's 4 weights (each byte into the mantissa of 2^23, less 2^23 + 128)
// with x[0..4].
__device__ __forceinline__ float dot_i8_word(unsigned w, const float* x, float acc) {
  const float4 a = *(const float4*)x;
  const float k = 8388736.0f;  // 2^23 + 128
  acc = fmaf(__uint_as_float(__byte_perm(w, 0x4b000000u, 0x7650)) - k, a.x, acc);
  acc = fmaf(__uint_as_float(__byte_perm(w, 0x4b000000u, 0x7651)) - k, a.y, acc);
  acc = fmaf(__uint_as_float(__byte_perm(w, 0x4b000000u, 0x7652)) - k, a.z, acc);
  return fmaf(__uint_as_float(__byte_perm(w, 0x4b000000u, 0x7653)) - k, a.w, acc);
}
