// The delta rule's per-element state steps and its row sum, shared by the recurrence and
// the replay so that a replayed state has the recurrence's bits: the twin of
// cuda/gated_delta.cuh. Contraction is switched off so that S + k·δ rounds twice, as
// MLX's Multiply and Add do.
#pragma clang fp contract(off)

// DFLASH_GD_MAXNK is the most state columns one lane holds (Dk ≤ 32·8 = 256).
#define DFLASH_GD_MAXNK 8

// S ← g·S.
inline float dflash_gd_decay(float s, float g) { return s * g; }

// S ← S + k·δ.
inline float dflash_gd_update(float s, float k, float d) {
  const float p = k * d;
  return s + p;
}

// The sum of x over the SIMD group's 32 lanes by a fixed butterfly (the CUDA twin's
// order): every lane gets the same bits.
inline float dflash_gd_simd_sum(float x) {
  for (ushort o = 16; o > 0; o >>= 1) x += simd_shuffle_xor(x, o);
  return x;
}
