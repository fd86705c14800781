  // The twin of cuda/split_keys_merge.cu: one SIMD group per row (l·H + h) merges the
  // row's chunk partials in chunk order, skipping chunks with max −inf, into out [L, H·D].
  constexpr int DPL = D / 32;
  const float NEG_INF = -INFINITY;
  const int rows = part_ml_shape[0];
  const int S = part_ml_shape[1];
  const int tid = int(thread_position_in_threadgroup.x);
  const int lane = tid & 31;
  const int row = int(threadgroup_position_in_grid.x) * int(threads_per_threadgroup.x / 32) + (tid >> 5);
  if (row >= rows) return;
  const size_t mo = size_t(row) * S * 2;
  float M = NEG_INF;
  for (int c = 0; c < S; ++c) M = fmax(M, part_ml[mo + 2 * c]);
  float total = 0.0f;
  float acc[DPL];
  for (int e = 0; e < DPL; ++e) acc[e] = 0.0f;
  for (int c = 0; c < S; ++c) {
    const float mc = part_ml[mo + 2 * c];
    if (mc == NEG_INF) continue;
    const float f = exp(mc - M);
    total = fma(part_ml[mo + 2 * c + 1], f, total);
    const size_t po = (size_t(row) * S + c) * D + lane * DPL;
    for (int e = 0; e < DPL; ++e) acc[e] = fma(part_o[po + e], f, acc[e]);
  }
  const size_t oo = size_t(row) * D + lane * DPL;
  for (int e = 0; e < DPL; ++e) out[oo + e] = static_cast<T>(acc[e] / total);
