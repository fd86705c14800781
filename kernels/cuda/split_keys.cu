  // Pass 1 of the split-key attention: block (c, hk) attends every query row of kv head hk
  // (the G = H/Hkv heads sharing it, L queries each: row r is query r / G of head
  // hk·G + r % G) to the keys of chunk c, [c·CHUNK, (c+1)·CHUNK), so each key is read once
  // per block instead of once per (head, query). Each warp takes ROWS rows at a time and
  // walks the chunk's keys in tiles of 32 (lane j scores key t0+j) with an online
  // softmax, row by row: a row's sums never depend on which rows share its warp or its
  // launch, so a one-row step and a block agree bit for bit. A row's partial (max m, sum
  // l, unnormalised output o) goes to part_ml [rows, S, 2] and part_o [rows, S, D]; a
  // chunk past the keys a row sees leaves m = −inf.
  constexpr int DPL = D / 32;
  struct alignas(DPL * sizeof(T)) VecT {
    T e[DPL];
  };
  const float NEG_INF = __int_as_float((int)0xff800000u);
  __shared__ float qs[WARPS][ROWS][D];
  const int H = q_shape[1];
  const int L = q_shape[2];
  const int Hkv = k_shape[1];
  const int G = H / Hkv;
  const int S = gridDim.x;
  const int c = blockIdx.x;
  const int hk = blockIdx.y;
  const int lane = threadIdx.x & 31;
  const int wid = threadIdx.x >> 5;
  const int k0 = c * CHUNK;
  const int nrows = G * L;
  const float sc = scale[0];
  const int visible = off[0];
  const T* kb = k + hk * k_strides[1];
  const T* vb = v + hk * v_strides[1];
  const long long kst = k_strides[2];
  const long long vst = v_strides[2];
  for (int r0 = wid * ROWS; r0 < nrows; r0 += WARPS * ROWS) { // warp-uniform
    int nr[ROWS]; // keys of this chunk row i sees, from k0
    int nmax = 0;
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
      const int r = r0 + i;
      int n = 0;
      if (r < nrows) {
        const int l = r / G;
        const int h = hk * G + r % G;
        n = CAUSAL ? visible + l + 1 : visible;
        const T* qp = q + h * q_strides[1] + l * q_strides[2];
        for (int d = lane; d < D; d += 32) qs[wid][i][d] = static_cast<float>(qp[d * q_strides[3]]) * sc;
      }
      nr[i] = min(max(n - k0, 0), CHUNK);
      nmax = max(nmax, nr[i]);
    }
    __syncwarp();
    float m[ROWS], ls[ROWS], o[ROWS][DPL];
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
      m[i] = NEG_INF;
      ls[i] = 0.0f;
#pragma unroll
      for (int e = 0; e < DPL; ++e) o[i][e] = 0.0f;
    }
    for (int t0 = 0; t0 < nmax; t0 += 32) { // warp-uniform
      float s[ROWS];
#pragma unroll
      for (int i = 0; i < ROWS; ++i) s[i] = 0.0f;
      if (t0 + lane < nmax) {
        const T* kr = kb + (long long)(k0 + t0 + lane) * kst;
#pragma unroll
        for (int d = 0; d < D; d += 8) {
          uint4 raw = *reinterpret_cast<const uint4*>(kr + d);
          const T* p = reinterpret_cast<const T*>(&raw);
#pragma unroll
          for (int e = 0; e < 8; ++e) {
            const float kv = static_cast<float>(p[e]);
#pragma unroll
            for (int i = 0; i < ROWS; ++i) s[i] = fmaf(qs[wid][i][d + e], kv, s[i]);
          }
        }
      }
      float p[ROWS];
#pragma unroll
      for (int i = 0; i < ROWS; ++i) {
        const bool seen = t0 + lane < nr[i];
        const float si = seen ? s[i] : NEG_INF;
        float tmax = si;
#pragma unroll
        for (int sh = 16; sh > 0; sh >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, sh));
        p[i] = 0.0f;
        if (tmax != NEG_INF) { // warp-uniform: the row sees a key of this tile
          const float mnew = fmaxf(m[i], tmax);
          const float corr = expf(m[i] - mnew);
          p[i] = seen ? expf(si - mnew) : 0.0f;
          float psum = p[i];
#pragma unroll
          for (int sh = 16; sh > 0; sh >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, sh);
          ls[i] = ls[i] * corr + psum;
#pragma unroll
          for (int e = 0; e < DPL; ++e) o[i][e] *= corr;
          m[i] = mnew;
        }
      }
      // Values of 8 keys at a time, their loads issued before the first is used. Keys a
      // row does not see have weight 0 (o + 0·v = o: o is never −0), so the rows sharing
      // the warp change no row's sums.
      const int last = min(32, nmax - t0);
      for (int j0 = 0; j0 < last; j0 += 8) {
        VecT vv[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const int r = k0 + t0 + min(j0 + u, last - 1);
          vv[u] = *reinterpret_cast<const VecT*>(vb + (long long)r * vst + lane * DPL);
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          if (j0 + u < last) {
#pragma unroll
            for (int i = 0; i < ROWS; ++i) {
              const float pj = __shfl_sync(0xffffffffu, p[i], j0 + u);
#pragma unroll
              for (int e = 0; e < DPL; ++e) o[i][e] = fmaf(pj, static_cast<float>(vv[u].e[e]), o[i][e]);
            }
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < ROWS; ++i) {
      const int r = r0 + i;
      if (r < nrows) {
        const int row = (r / G) * H + hk * G + r % G; // l·H + h
        float* po = part_o + ((size_t)row * S + c) * D + lane * DPL;
#pragma unroll
        for (int e = 0; e < DPL; ++e) po[e] = o[i][e];
        if (lane == 0) {
          part_ml[((size_t)row * S + c) * 2] = m[i];
          part_ml[((size_t)row * S + c) * 2 + 1] = ls[i];
        }
      }
    }
    __syncwarp(); // the next rows' queries overwrite qs[wid]
  }
