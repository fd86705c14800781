  // The twin of cuda/gated_delta_tape.cu: one SIMD group per state row (b, hv, dv), grid
  // (32, Dv, B·Hv), threadgroups (32, 4, 1); lane l holds the row's Dk/32 contiguous
  // columns from l·Dk/32. Per step: S ← g·S; u = Σ S·k; δ = (v − u)·β; S ← S + k·δ;
  // y = Σ S·q, in float32 with y cast to InT; lane 0 writes y and, with TAPE, δ.
  constexpr int MAXNK = DFLASH_GD_MAXNK;
  const int T = q_shape[1], Hk = q_shape[2], Dk = q_shape[3];
  const int Hv = v_shape[2], Dv = v_shape[3];
  const int lane = int(thread_position_in_grid.x);
  const int dv = int(thread_position_in_grid.y);
  const int n = int(thread_position_in_grid.z); // b·Hv + hv
  if (dv >= Dv) return;
  const int b = n / Hv, hv = n - b * Hv, hk = hv / (Hv / Hk);
  const int nk = Dk / 32;
  const int c0 = lane * nk;
  const size_t so = (size_t(n) * Dv + dv) * Dk + c0;
  float s[MAXNK];
  for (int i = 0; i < MAXNK; ++i) s[i] = i < nk ? state[so + i] : 0.0f;
  for (int t = 0; t < T; ++t) {
    const size_t bt = size_t(b) * T + t;
    const size_t ko = (bt * Hk + hk) * Dk + c0;
    const size_t vo = (bt * Hv + hv) * Dv + dv;
    const float gt = g[bt * Hv + hv];
    const float be = static_cast<float>(beta[bt * Hv + hv]);
    float kk[MAXNK];
    float u = 0.0f;
    for (int i = 0; i < MAXNK; ++i) {
      if (i < nk) {
        s[i] = dflash_gd_decay(s[i], gt);
        kk[i] = static_cast<float>(k[ko + i]);
        u = fma(s[i], kk[i], u);
      }
    }
    u = dflash_gd_simd_sum(u);
    const float d = (static_cast<float>(v[vo]) - u) * be;
    float o = 0.0f;
    for (int i = 0; i < MAXNK; ++i) {
      if (i < nk) {
        s[i] = dflash_gd_update(s[i], kk[i], d);
        o = fma(s[i], static_cast<float>(q[ko + i]), o);
      }
    }
    o = dflash_gd_simd_sum(o);
    if (lane == 0) {
      y[vo] = static_cast<InT>(o);
      if (TAPE) tape[vo] = d;
    }
  }
  for (int i = 0; i < MAXNK; ++i) {
    if (i < nk) state_out[so + i] = s[i];
  }
