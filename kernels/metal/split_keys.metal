  // The twin of cuda/split_keys.cu (pass 1 of the split-key attention): threadgroup
  // (c, hk), WARPS SIMD groups of 32 lanes, grid (S·WARPS·32, Hkv, 1); each SIMD group
  // takes ROWS of kv head hk's G·L query rows at a time and walks chunk c's keys in tiles
  // of 32 with an online softmax, row by row (a row's sums do not depend on the rows
  // beside it). Writes part_o [rows, S, D] and part_ml [rows, S, 2] (max, sum; −inf, 0
  // for a chunk past the row's keys).
  constexpr int DPL = D / 32;
  const float NEG_INF = -INFINITY;
  threadgroup float qs[WARPS][ROWS][D];
  const int H = q_shape[1];
  const int L = q_shape[2];
  const int Hkv = k_shape[1];
  const int G = H / Hkv;
  const int S = int(threadgroups_per_grid.x);
  const int c = int(threadgroup_position_in_grid.x);
  const int hk = int(threadgroup_position_in_grid.y);
  const int tid = int(thread_position_in_threadgroup.x);
  const int lane = tid & 31;
  const int wid = tid >> 5;
  const int k0 = c * CHUNK;
  const int nrows = G * L;
  const float sc = scale[0];
  const int visible = off[0];
  const size_t kst = k_strides[2];
  const size_t vst = v_strides[2];
  const size_t kb = size_t(hk) * k_strides[1];
  const size_t vb = size_t(hk) * v_strides[1];
  for (int r0 = wid * ROWS; r0 < nrows; r0 += WARPS * ROWS) {
    int nr[ROWS];
    int nmax = 0;
    for (int i = 0; i < ROWS; ++i) {
      const int r = r0 + i;
      int n = 0;
      if (r < nrows) {
        const int l = r / G;
        const int h = hk * G + r % G;
        n = CAUSAL ? visible + l + 1 : visible;
        const size_t qo = size_t(h) * q_strides[1] + size_t(l) * q_strides[2];
        for (int d = lane; d < D; d += 32) qs[wid][i][d] = static_cast<float>(q[qo + size_t(d) * q_strides[3]]) * sc;
      }
      nr[i] = min(max(n - k0, 0), CHUNK);
      nmax = max(nmax, nr[i]);
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);
    float m[ROWS], ls[ROWS], o[ROWS][DPL];
    for (int i = 0; i < ROWS; ++i) {
      m[i] = NEG_INF;
      ls[i] = 0.0f;
      for (int e = 0; e < DPL; ++e) o[i][e] = 0.0f;
    }
    for (int t0 = 0; t0 < nmax; t0 += 32) {
      float s[ROWS];
      for (int i = 0; i < ROWS; ++i) s[i] = 0.0f;
      if (t0 + lane < nmax) {
        const size_t kr = kb + size_t(k0 + t0 + lane) * kst;
        for (int d = 0; d < D; ++d) {
          const float kv = static_cast<float>(k[kr + d]);
          for (int i = 0; i < ROWS; ++i) s[i] = fma(qs[wid][i][d], kv, s[i]);
        }
      }
      float p[ROWS];
      for (int i = 0; i < ROWS; ++i) {
        const bool seen = t0 + lane < nr[i];
        const float si = seen ? s[i] : NEG_INF;
        float tmax = si;
        for (ushort sh = 16; sh > 0; sh >>= 1) tmax = fmax(tmax, simd_shuffle_xor(tmax, sh));
        p[i] = 0.0f;
        if (tmax != NEG_INF) {
          const float mnew = fmax(m[i], tmax);
          const float corr = exp(m[i] - mnew);
          p[i] = seen ? exp(si - mnew) : 0.0f;
          float psum = p[i];
          for (ushort sh = 16; sh > 0; sh >>= 1) psum += simd_shuffle_xor(psum, sh);
          ls[i] = ls[i] * corr + psum;
          for (int e = 0; e < DPL; ++e) o[i][e] *= corr;
          m[i] = mnew;
        }
      }
      const int last = min(32, nmax - t0);
      for (int u = 0; u < last; ++u) {
        const size_t vr = vb + size_t(k0 + t0 + u) * vst + size_t(lane * DPL);
        float vv[DPL];
        for (int e = 0; e < DPL; ++e) vv[e] = static_cast<float>(v[vr + e]);
        for (int i = 0; i < ROWS; ++i) {
          const float pj = simd_shuffle(p[i], ushort(u));
          for (int e = 0; e < DPL; ++e) o[i][e] = fma(pj, vv[e], o[i][e]);
        }
      }
    }
    for (int i = 0; i < ROWS; ++i) {
      const int r = r0 + i;
      if (r < nrows) {
        const size_t row = size_t((r / G) * H + hk * G + r % G);
        const size_t po = (row * S + c) * D + lane * DPL;
        for (int e = 0; e < DPL; ++e) part_o[po + e] = o[i][e];
        if (lane == 0) {
          part_ml[(row * S + c) * 2] = m[i];
          part_ml[(row * S + c) * 2 + 1] = ls[i];
        }
      }
    }
    simdgroup_barrier(mem_flags::mem_threadgroup);
  }
