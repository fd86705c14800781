  // Pass 2 of the split-key attention: one warp per row (l·H + h) merges the row's S
  // chunk partials in chunk order, skipping chunks it saw no key of (m = −inf), and writes
  // its D outputs (DPL per lane) to out [L, H·D]. The order is fixed, so the result does
  // not depend on how many chunks the launch had past the row's keys.
  constexpr int DPL = D / 32;
  const float NEG_INF = __int_as_float((int)0xff800000u);
  const int rows = part_ml_shape[0];
  const int S = part_ml_shape[1];
  const int lane = threadIdx.x & 31;
  const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return; // warp-uniform
  const float* ml = part_ml + (size_t)row * S * 2;
  float M = NEG_INF;
  for (int c = 0; c < S; ++c) M = fmaxf(M, ml[2 * c]);
  float total = 0.0f;
  float acc[DPL];
#pragma unroll
  for (int e = 0; e < DPL; ++e) acc[e] = 0.0f;
  for (int c = 0; c < S; ++c) {
    const float mc = ml[2 * c];
    if (mc == NEG_INF) continue;
    const float f = expf(mc - M);
    total = fmaf(ml[2 * c + 1], f, total);
    const float* po = part_o + ((size_t)row * S + c) * D + lane * DPL;
#pragma unroll
    for (int e = 0; e < DPL; ++e) acc[e] = fmaf(po[e], f, acc[e]);
  }
  T* op = out + (size_t)row * D + lane * DPL;
#pragma unroll
  for (int e = 0; e < DPL; ++e) op[e] = static_cast<T>(acc[e] / total);
