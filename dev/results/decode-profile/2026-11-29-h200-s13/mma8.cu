// Which SASS does ptxas emit for the 8-bit mma.sync on this architecture?
//   nvcc -arch=sm_90 -cubin -o mma8.cubin mma8.cu && cuobjdump -sass mma8.cubin
__global__ void fp8(const int* a, int* d) {
  float c0 = 0, c1 = 0, c2 = 0, c3 = 0;
  int t = threadIdx.x;
  asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c0), "+f"(c1), "+f"(c2), "+f"(c3)
      : "r"(a[t]), "r"(a[t + 32]), "r"(a[t + 64]), "r"(a[t + 96]), "r"(a[t + 128]), "r"(a[t + 160]));
  d[t] = __float_as_int(c0 + c1 + c2 + c3);
}
__global__ void s8(const int* a, int* d) {
  int c0 = 0, c1 = 0, c2 = 0, c3 = 0;
  int t = threadIdx.x;
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+r"(c0), "+r"(c1), "+r"(c2), "+r"(c3)
      : "r"(a[t]), "r"(a[t + 32]), "r"(a[t + 64]), "r"(a[t + 96]), "r"(a[t + 128]), "r"(a[t + 160]));
  d[t] = c0 + c1 + c2 + c3;
}
