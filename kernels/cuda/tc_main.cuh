
  constexpr int C = 8 * TILES;
  __shared__ float part[WARPS][16][C];
  const int M = x_shape[0];
  const int K = x_shape[1];
  const int S = K / 32;
  const int lane = threadIdx.x & 31;
  const int wid = threadIdx.x >> 5;
  const int g = lane >> 2; // row of the fragment (and weight row within an n8 tile)
  const int t = lane & 3;  // 8-element group within a 32-wide slice
  const int ct = blockIdx.x / SPLIT;       // column tile
  const int chunk = blockIdx.x - ct * SPLIT;
  const int sb = chunk * S / SPLIT;              // this block's first slice
  const int SC = (chunk + 1) * S / SPLIT - sb;   // and its slice count
  const int ft = ct * (ACT ? TILES / 2 : TILES); // the block's first n8 tile of weight rows (with ACT: gate rows)
  const int n0 = 8 * ft;                          // and its first row
  const int N = TILED ? w_shape[0] * 8 : w_shape[0]; // the weight's rows (y's columns without ACT)
  const bool r0 = g < M;
  const bool r1 = g + 8 < M;
  const T* xa_p = x + (size_t)(r0 ? g : 0) * K + 8 * t + 32 * sb;
  const T* xb_p = x + (size_t)(r1 ? g + 8 : 0) * K + 8 * t + 32 * sb;
  // The 8 elements of x at p.
  auto ldx = [&](const T* p) -> uint4 { return *reinterpret_cast<const uint4*>(p); };
  // Rows g and g+8 of x at k offset o (from the lane's first k), zeros for missing rows.
  auto ldx2 = [&](int o, uint4& a, uint4& b) {
    a = r0 ? ldx(xa_p + o) : make_uint4(0u, 0u, 0u, 0u);
    b = r1 ? ldx(xb_p + o) : make_uint4(0u, 0u, 0u, 0u);
  };
  // y's element i from its float sum s: rounded to T, plus r's element rounded again with
  // RESID (what MLX's Add of the rounded product and r returns; r unread otherwise).
  auto out = [&](float s, size_t i) -> T {
    if constexpr (RESID) {
      return static_cast<T>(static_cast<float>(static_cast<T>(s)) + static_cast<float>(r[i]));
    }
    return static_cast<T>(s);
  };
  // This lane's 8 weights of slice 0 of the block's first n8 tile; the next tile is
  // "tile" elements on, the next slice SLICE. Row-major: rows n0+g, k from 8t. Tiled
  // [N/8, S, 32 lanes, 8]: the lane's 16 bytes next to its neighbours'.
  constexpr int SLICE = TILED ? 256 : 32;
  const T* w_p = TILED ? w + ((size_t)ft * S * 32 + lane) * 8 + (size_t)sb * 256 : w + (size_t)(n0 + g) * K + 8 * t + 32 * sb;
  const size_t tile = TILED ? (size_t)S * 256 : (size_t)8 * K;
  // Tile j's weights start toff[j] elements after w_p: the next tile each, or with ACT (a
  // merged gate/up weight, up rows half the weight on: N/16 tiles) gate tiles in the
  // first half of the block's tiles and the same rows' up tiles in the second, in either
  // layout.
  size_t toff[TILES];
#pragma unroll
  for (int j = 0; j < TILES; ++j) {
    toff[j] = (ACT && j >= TILES / 2 ? (size_t)N / 16 + (j - TILES / 2) : (size_t)j) * tile;
  }
  float acc[TILES][4];
#pragma unroll
  for (int j = 0; j < TILES; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
  }
  const int G = SC / U;
  // One group: U·TILES weight loads and 2·U loads of x, issued before any mma uses them.
  auto load = [&](uint4 (&wv)[U][TILES], uint4 (&xa)[U], uint4 (&xb)[U], int grp) {
    const int k0 = grp * U * 32;
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int j = 0; j < TILES; ++j) wv[u][j] = LDW(w_p + toff[j] + (size_t)(grp * U + u) * SLICE);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) ldx2(k0 + 32 * u, xa[u], xb[u]);
  };
  auto mma = [&](uint4 (&wv)[U][TILES], uint4 (&xa)[U], uint4 (&xb)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int j = 0; j < TILES; ++j) {
        MMA(acc[j], xa[u].x, xb[u].x, xa[u].y, xb[u].y, wv[u][j].x, wv[u][j].y);
        MMA(acc[j], xa[u].z, xb[u].z, xa[u].w, xb[u].w, wv[u][j].z, wv[u][j].w);
      }
    }
  };
  uint4 w0[U][TILES], xa0[U], xb0[U];
  if constexpr (STAGES > 0) {
    // Weight tiles [C rows, KT] staged through shared memory with cp.async, STAGES deep:
    // one warp-wide copy reads 512 contiguous bytes of a row (the register path reads 64
    // bytes of 8 rows). Rows are padded by 64 bytes so that the fragment reads of rows g
    // and g+1 fall on different banks. Warp w multiplies slices w, w+WARPS, ... of every
    // tile, tiles in order, so the sums do not depend on the row count either.
    // (The kernel is not a template: this branch is compiled for STAGES = 0 too, so its
    // sizes must stay valid then.)
    constexpr int NS = STAGES > 1 ? STAGES : 2;
    constexpr int PITCH = KT + 32;
    constexpr int CHUNKS = C * KT / 8; // 16-byte copies per tile
    __shared__ __align__(16) T wsm[STAGES > 0 ? STAGES : 1][C][PITCH];
    const int tiles = K / KT;
    auto issue = [&](int tl) {
      const int buf = tl % NS;
      for (int c = threadIdx.x; c < CHUNKS; c += WARPS * 32) {
        const int r = c / (KT / 8);
        const int q = c - r * (KT / 8);
        const T* src = w + (size_t)(n0 + r) * K + (size_t)tl * KT + q * 8;
        unsigned dst;
        asm volatile("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }"
                     : "=r"(dst)
                     : "l"(reinterpret_cast<unsigned long long>(&wsm[buf][r][q * 8])));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
      }
    };
#pragma unroll
    for (int st = 0; st < NS - 1; ++st) {
      if (st < tiles) issue(st);
      asm volatile("cp.async.commit_group;" ::);
    }
    for (int tl = 0; tl < tiles; ++tl) {
      asm volatile("cp.async.wait_group %0;" ::"n"(NS - 2));
      __syncthreads(); // tile tl is in for every thread; the buffer refilled next was consumed
      if (tl + NS - 1 < tiles) issue(tl + NS - 1);
      asm volatile("cp.async.commit_group;" ::);
      const int buf = tl % NS;
      for (int sl = wid; sl < KT / 32; sl += WARPS) {
        uint4 xa, xb;
        ldx2(tl * KT + sl * 32, xa, xb);
#pragma unroll
        for (int j = 0; j < TILES; ++j) {
          const uint4 wv = *reinterpret_cast<const uint4*>(&wsm[buf][8 * j + g][sl * 32 + 8 * t]);
          MMA(acc[j], xa.x, xb.x, xa.y, xb.y, wv.x, wv.y);
          MMA(acc[j], xa.z, xb.z, xa.w, xb.w, wv.z, wv.w);
        }
      }
    }
  } else if constexpr (PIPE) {
    // Software pipelining: the next group's loads are in flight while this group's mmas
    // run (two register sets, used alternately). Same groups in the same order as below,
    // so the same sums.
    uint4 w1[U][TILES], xa1[U], xb1[U];
    int grp = wid;
    if (grp < G) load(w0, xa0, xb0, grp);
    for (; grp < G; grp += 2 * WARPS) {
      if (grp + WARPS < G) load(w1, xa1, xb1, grp + WARPS);
      mma(w0, xa0, xb0);
      if (grp + WARPS >= G) break;
      if (grp + 2 * WARPS < G) load(w0, xa0, xb0, grp + 2 * WARPS);
      mma(w1, xa1, xb1);
    }
  } else {
    for (int grp = wid; grp < G; grp += WARPS) {
      load(w0, xa0, xb0, grp);
      mma(w0, xa0, xb0);
    }
  }
  for (int s = G * U + wid; STAGES == 0 && s < SC; s += WARPS) { // the last SC mod U slices, one per warp
    uint4 xa, xb;
    ldx2(s * 32, xa, xb);
#pragma unroll
    for (int j = 0; j < TILES; ++j) {
      const uint4 wv = LDW(w_p + toff[j] + (size_t)s * SLICE);
      MMA(acc[j], xa.x, xb.x, xa.y, xb.y, wv.x, wv.y);
      MMA(acc[j], xa.z, xb.z, xa.w, xb.w, wv.z, wv.w);
    }
  }
#pragma unroll
  for (int j = 0; j < TILES; ++j) {
    part[wid][g][8 * j + 2 * t] = acc[j][0];
    part[wid][g][8 * j + 2 * t + 1] = acc[j][1];
    part[wid][g + 8][8 * j + 2 * t] = acc[j][2];
    part[wid][g + 8][8 * j + 2 * t + 1] = acc[j][3];
  }
  __syncthreads();
