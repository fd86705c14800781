  // The replay S ← g_t·S + δ_t⊗k_t for the first steps of a tape, one warp per state row
  // as in the recurrence (grid (32, Dv, B·Hv), blocks (32, 4, 1)), with no sums: every
  // element is rounded as the ops path rounds it, so the state has its bits. The steps are
  // the tape's T, or with COUNTED the row's device count clamped to 0..T: count[b] when
  // count holds one per row (a batched verify's accepted prefixes), count[0] for every row
  // when it holds one; the steps from it on leave the state as it is. KT, the keys' type,
  // is unused here: it names the instantiation, since MLX keys its builds by template
  // arguments, not input types.
  constexpr int MAXNK = DFLASH_GD_MAXNK;
  const int T = delta_shape[1], Hv = delta_shape[2], Dv = delta_shape[3];
  const int Hk = k_shape[2], Dk = k_shape[3];
  const int lane = threadIdx.x;
  const int dv = blockIdx.y * blockDim.y + threadIdx.y;
  const int n = blockIdx.z; // b·Hv + hv
  if (dv >= Dv) return;
  const int b = n / Hv, hv = n - b * Hv, hk = hv / (Hv / Hk);
  int steps = T;
  if constexpr (COUNTED) steps = min(max(static_cast<int>(count[count_shape[0] == 1 ? 0 : b]), 0), T);
  const int nk = Dk / 32;
  const int c0 = lane * nk;
  const size_t so = ((size_t)n * Dv + dv) * Dk + c0;
  float s[MAXNK];
#pragma unroll
  for (int i = 0; i < MAXNK; ++i) s[i] = i < nk ? state[so + i] : 0.0f;
  for (int t = 0; t < steps; ++t) {
    const size_t bt = (size_t)b * T + t;
    const size_t ko = (bt * Hk + hk) * Dk + c0;
    const float gt = g[bt * Hv + hv];
    const float d = delta[(bt * Hv + hv) * Dv + dv];
#pragma unroll
    for (int i = 0; i < MAXNK; ++i) {
      if (i < nk) s[i] = dflash_gd_update(dflash_gd_decay(s[i], gt), static_cast<float>(k[ko + i]), d);
    }
  }
#pragma unroll
  for (int i = 0; i < MAXNK; ++i) {
    if (i < nk) state_out[so + i] = s[i];
  }
