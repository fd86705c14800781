  // One warp per state row (b, hv, dv): grid (32, Dv, B·Hv), blocks (32, 4, 1). Lane l
  // holds the row's Dk/32 contiguous columns from l·Dk/32 in registers for all T steps.
  // Per step: S ← g·S; u = Σ S·k; δ = (v − u)·β; S ← S + k·δ; y = Σ S·q, in float32 with
  // y cast to InT, as the ops path computes it; lane 0 writes y and, with TAPE, δ.
  constexpr int MAXNK = DFLASH_GD_MAXNK;
  const int T = q_shape[1], Hk = q_shape[2], Dk = q_shape[3];
  const int Hv = v_shape[2], Dv = v_shape[3];
  const int lane = threadIdx.x;
  const int dv = blockIdx.y * blockDim.y + threadIdx.y;
  const int n = blockIdx.z; // b·Hv + hv
  if (dv >= Dv) return;     // the whole warp: one row
  const int b = n / Hv, hv = n - b * Hv, hk = hv / (Hv / Hk);
  const int nk = Dk / 32;
  const int c0 = lane * nk;
  const size_t so = ((size_t)n * Dv + dv) * Dk + c0;
  float s[MAXNK];
#pragma unroll
  for (int i = 0; i < MAXNK; ++i) s[i] = i < nk ? state[so + i] : 0.0f;
  for (int t = 0; t < T; ++t) {
    const size_t bt = (size_t)b * T + t;
    const size_t ko = (bt * Hk + hk) * Dk + c0;
    const size_t vo = (bt * Hv + hv) * Dv + dv;
    const float gt = g[bt * Hv + hv];
    const float be = static_cast<float>(beta[bt * Hv + hv]);
    float kk[MAXNK];
    float u = 0.0f;
#pragma unroll
    for (int i = 0; i < MAXNK; ++i) {
      if (i < nk) {
        s[i] = dflash_gd_decay(s[i], gt);
        kk[i] = static_cast<float>(k[ko + i]);
        u = __fmaf_rn(s[i], kk[i], u);
      }
    }
    u = dflash_gd_warp_sum(u);
    const float d = __fmul_rn(__fsub_rn(static_cast<float>(v[vo]), u), be);
    float o = 0.0f;
#pragma unroll
    for (int i = 0; i < MAXNK; ++i) {
      if (i < nk) {
        s[i] = dflash_gd_update(s[i], kk[i], d);
        o = __fmaf_rn(s[i], static_cast<float>(q[ko + i]), o);
      }
    }
    o = dflash_gd_warp_sum(o);
    if (lane == 0) {
      y[vo] = static_cast<InT>(o);
      if constexpr (TAPE) tape[vo] = d;
    }
  }
#pragma unroll
  for (int i = 0; i < MAXNK; ++i) {
    if (i < nk) state_out[so + i] = s[i];
  }
