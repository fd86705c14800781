// The first-maximum order of the row argmax, the twin of cuda/row_argmax.cu's better and
// take: the larger value goes first, NaN above every number (MLX's ArgMax, numpy's), and
// among equals the smaller index. It is a total order on (value, index) pairs, so the
// row's winner does not depend on which thread saw what or in which order they merge.
inline bool dflash_am_better(float v, uint i, float bv, uint bj) {
  const bool vn = isnan(v), bn = isnan(bv);
  if (vn || bn) return vn && (!bn || i < bj);
  return v > bv || (v == bv && i < bj);
}

// Keeps (v, i) in (best, bi) when it goes first.
inline void dflash_am_take(thread float& best, thread uint& bi, float v, uint i) {
  if (dflash_am_better(v, i, best, bi)) {
    best = v;
    bi = i;
  }
}

// The SIMD group's first maximum, in lane 0: the CUDA twin's shuffle-down order (a lane
// past the group's end gets its own pair back, which never goes first).
inline void dflash_am_simd_best(thread float& best, thread uint& bi) {
  for (ushort o = 16; o > 0; o >>= 1) {
    const float v = simd_shuffle_down(best, o);
    const uint i = simd_shuffle_down(bi, o);
    dflash_am_take(best, bi, v, i);
  }
}
