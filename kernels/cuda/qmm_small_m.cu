  // y [M, N] = x [M, K] · dequant(w)ᵀ for M = 1..16 rows (verify blocks, drafts) of an MLX
  // affine-quantized weight: w uint32 [N, K·BITS/32], K packed little end first (value k at
  // bits BITS·(k mod 32/BITS) of word k/(32/BITS)), scales and biases [N, K/GS] of T, and
  // w[n][k] = q·scale + bias per group of GS along K. x is row-contiguous with leading shape
  // of M rows (the rows are x's elements over K); K comes from w.
  //
  // Layout. Block b (WARPS warps) owns the C = 8·NT columns [b·C, b·C + C) and all of K;
  // its warps split K into whole groups (warp i: groups [i·G/WARPS, (i+1)·G/WARPS)), so each
  // weight is read once per launch, by one lane, and serves all M rows through an m16n8k16
  // mma (rows past M are zeros). A warp walks its K range in chunks of 32: lane (g = lane/4,
  // t = lane%4) reads the chunk's x at k [8t, 8t+8) for rows g and g+8 and, for each of its
  // NT tiles of 8 columns, the same 8 k of weight column g of the tile (one word for 4 bits,
  // two for 8). The chunk's two mma steps take k in an order of their own (step s: the
  // lane's 8t+4s .. 8t+4s+3), the same order for x and the weights, which leaves each sum
  // as it is. U chunks' loads go out before their mmas.
  //
  // Rounding. The mma multiplies x (T) by the integers q (exact in T: they are built by
  // placing q into the mantissa of a power of two and subtracting it, or through float for
  // 8-bit bfloat16), exact products summed in float32 per group: S = Σ x·q. The lane also
  // sums its x values per group (in k order, then across the 4 lanes of a quad, xor 1 then
  // 2): X = Σ x. Each group adds to the float32 total y ← fma(bias, X, fma(scale, S, y)),
  // the groups in K order (the same algebra as MLX's qmv). The warps' totals are summed in
  // warp order through shared memory and rounded to T once. No atomics: every output's
  // sums run in one fixed order, whatever the scheduling, and a row's result does not
  // depend on the other rows of the block.
  constexpr int C = 8 * NT;
  constexpr int WPL = BITS / 4; // words of w per lane per chunk
  constexpr int CPG = GS / 32;  // chunks per group
  constexpr int U = 4;          // chunks per iteration: whole groups (CPG divides U)
  struct Kind {
    __device__ static constexpr bool bf16(const __nv_bfloat16*) { return true; }
    __device__ static constexpr bool bf16(const void*) { return false; }
  };
  constexpr bool BF16 = Kind::bf16(static_cast<const T*>(nullptr));
  // A power of two whose mantissa's last place is 1, twice: 128 in bfloat16, 1024 in half.
  constexpr uint32_t MAG = BF16 ? 0x43004300u : 0x64006400u;
  __shared__ float part[WARPS][16][C];
  int M = 1;
  for (int i = 0; i + 1 < x_ndim; ++i) M *= x_shape[i];
  const int N = w_shape[0];
  const int KW = w_shape[1]; // words per weight row
  const int K = KW * (32 / BITS);
  const int NG = K / GS; // groups per row
  const int lane = threadIdx.x & 31;
  const int wid = threadIdx.x >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int n0 = blockIdx.x * C;
  const int cb = (wid * NG / WARPS) * CPG; // the warp's chunks [cb, ce)
  const int ce = ((wid + 1) * NG / WARPS) * CPG;
  const bool r0 = g < M;
  const bool r1 = g + 8 < M;
  const T* xa = x + (size_t)(r0 ? g : 0) * K + 8 * t;
  const T* xb = x + (size_t)(r1 ? g + 8 : 0) * K + 8 * t;
  const uint32_t* wp[NT]; // the lane's weight column in each tile
  bool wk[NT];
  const unsigned short* sc = reinterpret_cast<const unsigned short*>(scales);
  const unsigned short* bi = reinterpret_cast<const unsigned short*>(biases);
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int n = n0 + 8 * j + g;
    wk[j] = n < N;
    wp[j] = w + (size_t)(wk[j] ? n : 0) * KW + WPL * t;
  }
  // The 16-bit T at bits b as float.
  auto tf = [&](unsigned int b) -> float {
    if constexpr (BF16) {
      return __uint_as_float(b << 16);
    } else {
      return __half2float(__ushort_as_half(static_cast<unsigned short>(b)));
    }
  };
  // A pair of T holding MAG + q (low half first) less MAG: q exactly.
  auto unmag = [&](uint32_t u) -> uint32_t {
    if constexpr (BF16) {
      __nv_bfloat162 v = *reinterpret_cast<__nv_bfloat162*>(&u);
      v = __hsub2(v, __floats2bfloat162_rn(128.0f, 128.0f));
      return *reinterpret_cast<uint32_t*>(&v);
    } else {
      __half2 v = *reinterpret_cast<__half2*>(&u);
      v = __hsub2(v, __floats2half2_rn(1024.0f, 1024.0f));
      return *reinterpret_cast<uint32_t*>(&v);
    }
  };
  // A byte as float, exactly: its bits below 2^23's last place, less 2^23.
  auto f8 = [](uint32_t b) -> float { return __uint_as_float(0x4B000000u | b) - 8388608.0f; };
  // Step s's B registers from the lane's 8 weights v: values 4s, 4s+1 (b0) and 4s+2, 4s+3 (b1).
  auto bregs = [&](const uint32_t (&v)[WPL], int s, uint32_t& b0, uint32_t& b1) {
    if constexpr (BITS == 4) {
      const uint32_t h = v[0] >> (16 * s);
      b0 = unmag((h & 0xFu) | ((h & 0xF0u) << 12) | MAG);
      b1 = unmag(((h >> 8) & 0xFu) | ((h & 0xF000u) << 4) | MAG);
    } else if constexpr (BF16) {
      const uint32_t u = v[WPL > 1 ? s : 0];
      __nv_bfloat162 p0 = __floats2bfloat162_rn(f8(u & 0xFFu), f8((u >> 8) & 0xFFu));
      __nv_bfloat162 p1 = __floats2bfloat162_rn(f8((u >> 16) & 0xFFu), f8(u >> 24));
      b0 = *reinterpret_cast<uint32_t*>(&p0);
      b1 = *reinterpret_cast<uint32_t*>(&p1);
    } else {
      const uint32_t u = v[WPL > 1 ? s : 0];
      b0 = unmag((u & 0xFFu) | ((u & 0xFF00u) << 8) | MAG);
      b1 = unmag(((u >> 16) & 0xFFu) | ((u >> 8) & 0xFF0000u) | MAG);
    }
  };
  auto mma = [&](float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
    if constexpr (BF16) {
      asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    } else {
      asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
          : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
  };
  float tot[NT][4]; // y's float32 totals: rows g, g+8 × columns 2t, 2t+1 of each tile
  float acc[NT][4]; // the current group's Σ x·q
#pragma unroll
  for (int j = 0; j < NT; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) tot[j][i] = acc[j][i] = 0.0f;
  }
  float xs0 = 0.0f, xs1 = 0.0f; // the lane's Σ x of the current group, rows g and g+8
  // Chunk c's loads: x, the weights, and when it ends a group (last) that group's scales
  // and biases of columns 2t, 2t+1 of each tile, as T bits (low half the first column).
  auto load = [&](int c, bool last, uint4& x0, uint4& x1, uint32_t (&wv)[NT][WPL], uint32_t (&sv)[NT], uint32_t (&bv)[NT]) {
    x0 = r0 ? __ldg(reinterpret_cast<const uint4*>(xa + 32 * c)) : make_uint4(0u, 0u, 0u, 0u);
    x1 = r1 ? __ldg(reinterpret_cast<const uint4*>(xb + 32 * c)) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      if constexpr (WPL == 1) {
        wv[j][0] = wk[j] ? __ldg(wp[j] + BITS * c) : 0u;
      } else {
        const uint2 v = wk[j] ? __ldg(reinterpret_cast<const uint2*>(wp[j] + BITS * c)) : make_uint2(0u, 0u);
        wv[j][0] = v.x;
        wv[j][WPL - 1] = v.y;
      }
    }
    if (last) {
      const int grp = c / CPG;
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const int n = n0 + 8 * j + 2 * t;
        const size_t o = (size_t)n * NG + grp;
        sv[j] = (n < N ? sc[o] : 0u) | (n + 1 < N ? (uint32_t)sc[o + NG] << 16 : 0u);
        bv[j] = (n < N ? bi[o] : 0u) | (n + 1 < N ? (uint32_t)bi[o + NG] << 16 : 0u);
      }
    }
  };
  // One chunk: the group's sums restart at its first chunk (first) and go into the totals
  // at its last (last).
  auto chunk = [&](const uint4& x0, const uint4& x1, const uint32_t (&wv)[NT][WPL], const uint32_t (&sv)[NT], const uint32_t (&bv)[NT],
                   bool first, bool last) {
    if (first) {
#pragma unroll
      for (int j = 0; j < NT; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
      }
      xs0 = xs1 = 0.0f;
    }
    const T* e0 = reinterpret_cast<const T*>(&x0);
    const T* e1 = reinterpret_cast<const T*>(&x1);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      xs0 += static_cast<float>(e0[i]);
      xs1 += static_cast<float>(e1[i]);
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      uint32_t b0, b1;
      bregs(wv[j], 0, b0, b1);
      mma(acc[j], x0.x, x1.x, x0.y, x1.y, b0, b1);
      bregs(wv[j], 1, b0, b1);
      mma(acc[j], x0.z, x1.z, x0.w, x1.w, b0, b1);
    }
    if (last) {
      float s0 = xs0 + __shfl_xor_sync(0xffffffffu, xs0, 1);
      s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
      float s1 = xs1 + __shfl_xor_sync(0xffffffffu, xs1, 1);
      s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const float sa = tf(sv[j] & 0xFFFFu), sb = tf(sv[j] >> 16);
        const float ba = tf(bv[j] & 0xFFFFu), bb = tf(bv[j] >> 16);
        tot[j][0] = fmaf(ba, s0, fmaf(sa, acc[j][0], tot[j][0]));
        tot[j][1] = fmaf(bb, s0, fmaf(sb, acc[j][1], tot[j][1]));
        tot[j][2] = fmaf(ba, s1, fmaf(sa, acc[j][2], tot[j][2]));
        tot[j][3] = fmaf(bb, s1, fmaf(sb, acc[j][3], tot[j][3]));
      }
    }
  };
  // U chunks at a time (fewer at the end: whole groups); c − cb is a multiple of U, so
  // chunk c + u starts a group when u % CPG = 0 and ends one when (u + 1) % CPG = 0.
  for (int c = cb; c < ce; c += U) { // warp-uniform
    const int nc = min(U, ce - c);
    uint4 x0[U], x1[U];
    uint32_t wv[U][NT][WPL], sv[U][NT], bv[U][NT];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u < nc) load(c + u, (u + 1) % CPG == 0, x0[u], x1[u], wv[u], sv[u], bv[u]);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u < nc) chunk(x0[u], x1[u], wv[u], sv[u], bv[u], u % CPG == 0, (u + 1) % CPG == 0);
    }
  }
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    const int cc = 8 * j + 2 * t;
    part[wid][g][cc] = tot[j][0];
    part[wid][g][cc + 1] = tot[j][1];
    part[wid][g + 8][cc] = tot[j][2];
    part[wid][g + 8][cc + 1] = tot[j][3];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < M * C; i += WARPS * 32) {
    const int m = i / C;
    const int cc = i - m * C;
    const int n = n0 + cc;
    if (n < N) {
      float s = part[0][m][cc];
#pragma unroll
      for (int v = 1; v < WARPS; ++v) s += part[v][m][cc];
      y[(size_t)m * N + n] = static_cast<T>(s);
    }
  }
