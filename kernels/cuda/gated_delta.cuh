// The delta rule's per-element state steps and its row sum, shared by the recurrence and
// the replay so that a replayed state has the recurrence's bits. Each step rounds where
// MLX's ops round (Multiply, then Add): the explicit _rn intrinsics are never contracted
// into an FMA, which would round once where the ops round twice.

// DFLASH_GD_MAXNK is the most state columns one lane holds (Dk ≤ 32·8 = 256): the
// registers are unrolled to it and the lane uses Dk/32 of them.
#define DFLASH_GD_MAXNK 8

// S ← g·S.
__device__ __forceinline__ float dflash_gd_decay(float s, float g) { return __fmul_rn(s, g); }

// S ← S + k·δ.
__device__ __forceinline__ float dflash_gd_update(float s, float k, float d) { return __fadd_rn(s, __fmul_rn(k, d)); }

// The sum of x over the warp's 32 lanes by a fixed butterfly: every lane gets the same
// bits (each pairwise sum is commutative), whatever order the lanes ran in.
__device__ __forceinline__ float dflash_gd_warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = __fadd_rn(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
