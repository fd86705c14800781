  // The twin of cuda/gated_delta_replay.cu: S ← g_t·S + δ_t⊗k_t for the tape's T steps, or
  // with COUNTED for the row's count of them clamped to 0..T (count[b] when count holds one
  // per row, count[0] for every row when it holds one); one SIMD group per state row, no
  // sums. KT, the keys' type, names the instantiation.
  constexpr int MAXNK = DFLASH_GD_MAXNK;
  const int T = delta_shape[1], Hv = delta_shape[2], Dv = delta_shape[3];
  const int Hk = k_shape[2], Dk = k_shape[3];
  const int lane = int(thread_position_in_grid.x);
  const int dv = int(thread_position_in_grid.y);
  const int n = int(thread_position_in_grid.z); // b·Hv + hv
  if (dv >= Dv) return;
  const int b = n / Hv, hv = n - b * Hv, hk = hv / (Hv / Hk);
  int steps = T;
  if (COUNTED) steps = min(max(int(count[count_shape[0] == 1 ? 0 : b]), 0), T);
  const int nk = Dk / 32;
  const int c0 = lane * nk;
  const size_t so = (size_t(n) * Dv + dv) * Dk + c0;
  float s[MAXNK];
  for (int i = 0; i < MAXNK; ++i) s[i] = i < nk ? state[so + i] : 0.0f;
  for (int t = 0; t < steps; ++t) {
    const size_t bt = size_t(b) * T + t;
    const size_t ko = (bt * Hk + hk) * Dk + c0;
    const float gt = g[bt * Hv + hv];
    const float d = delta[(bt * Hv + hv) * Dv + dv];
    for (int i = 0; i < MAXNK; ++i) {
      if (i < nk) s[i] = dflash_gd_update(dflash_gd_decay(s[i], gt), static_cast<float>(k[ko + i]), d);
    }
  }
  for (int i = 0; i < MAXNK; ++i) {
    if (i < nk) state_out[so + i] = s[i];
  }
