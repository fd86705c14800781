
#define MMA(d, a0, a1, a2, a3, b0, b1)                                                        \
  do {                                                                                        \
    if (BF16) {                                                                               \
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "                    \
                   "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"                    \
                   : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                            \
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));                    \
    } else {                                                                                  \
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "                      \
                   "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"                    \
                   : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                            \
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));                    \
    }                                                                                         \
  } while (0)

__device__ __forceinline__ uint4 dflash_ldw(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
#define LDW(p) dflash_ldw(p)

