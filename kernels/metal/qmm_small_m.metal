  // The twin of cuda/qmm_small_m.cu: y [M, N] = x [M, K] · dequant(w)ᵀ for M = 1..16 rows
  // of an MLX affine-quantized weight (w uint32 [N, K·BITS/32], scales and biases [N, K/GS]
  // of T), K from w, M the rows of x's leading shape. The same launch: threadgroup b of
  // WARPS SIMD groups owns the C = 8·NT columns [b·C, b·C + C), its SIMD groups split K into
  // whole groups, each walks its range in chunks of 32 k, U chunks' weights loaded before
  // they are used, and each weight is read by one lane and serves all M rows.
  //
  // The products run on 8×8 float SIMD-group matrices as yᵀ = Q · xᵀ per tile of 8 columns
  // and half of the 16 rows: Q [8 columns, 8 k] holds the integers q, xᵀ [8 k, 8 rows] the
  // rows' x (both exact in float), one step per 8 k, four per chunk. A lane holds elements
  // (i, j), (i, j+1) of each matrix with i = fm, j = fn (the layout MLX's own GEMMs rely
  // on), so it gives Q its column fm's weights k 8·fn/2 .. +8 of the chunk (one word for 4
  // bits, two for 8): step s takes the lane's values 2s, 2s+1. xᵀ's row fm at step s is then
  // k 8·(fm/2) + fm%2 + 2s, the same order on both sides, which leaves each sum as it is;
  // the lane holds yᵀ's column fm, rows fn, fn+1 (and +8).
  //
  // Rounding as in the CUDA kernel: per group the exact products summed in float32, S =
  // Σ x·q, and X = Σ x (the lane's values in step order, then across the 8 lanes of its
  // rows, xor 2, 4, 16); y ← fma(bias, X, fma(scale, S, y)) per group in K order; the SIMD
  // groups' totals summed in group order through threadgroup memory and rounded to T once.
  // No atomics; a row's result does not depend on the other rows.
  constexpr int C = 8 * NT;
  constexpr int WPL = BITS / 4; // words of w per lane per chunk
  constexpr int CPG = GS / 32;  // chunks per group
  constexpr int U = 4;          // chunks per iteration: whole groups (CPG divides U)
  threadgroup float part[WARPS][16][C];
  int M = 1;
  for (int i = 0; i + 1 < int(x_ndim); ++i) M *= x_shape[i];
  const int N = w_shape[0];
  const int KW = w_shape[1]; // words per weight row
  const int K = KW * (32 / BITS);
  const int NG = K / GS; // groups per row
  const int tid = int(thread_position_in_threadgroup.x);
  const int lane = tid & 31;
  const int wid = tid >> 5;
  const int fm = 4 * (lane >> 4) + 2 * ((lane >> 2) & 1) + ((lane >> 1) & 1);
  const int fn = 4 * ((lane >> 3) & 1) + 2 * (lane & 1);
  const int n0 = int(threadgroup_position_in_grid.x) * C;
  const int cb = (wid * NG / WARPS) * CPG; // the SIMD group's chunks [cb, ce)
  const int ce = ((wid + 1) * NG / WARPS) * CPG;
  const bool hi = M > 8; // rows 8..15 exist
  // The lane's x rows fn + e + 8h: their offsets at its first k, or −1 past M.
  int xo[2][2];
  for (int h = 0; h < 2; ++h) {
    for (int e = 0; e < 2; ++e) {
      const int r = 8 * h + fn + e;
      xo[h][e] = r < M ? r * K + 8 * (fm >> 1) + (fm & 1) : -1;
    }
  }
  size_t wo[NT]; // the lane's weight column in each tile
  bool wk[NT];
  for (int j = 0; j < NT; ++j) {
    const int n = n0 + 8 * j + fm;
    wk[j] = n < N;
    wo[j] = size_t(wk[j] ? n : 0) * KW + WPL * (fn >> 1);
  }
  constexpr uint32_t MASK = (1u << BITS) - 1u;
  float tot[NT][2][2]; // y's float32 totals: column fm of each tile, rows fn + e + 8h
  simdgroup_matrix<float, 8, 8> acc[NT][2]; // the current group's Σ x·q
  for (int j = 0; j < NT; ++j) {
    for (int h = 0; h < 2; ++h) {
      tot[j][h][0] = tot[j][h][1] = 0.0f;
      acc[j][h] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    }
  }
  float xs[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}}; // the lane's Σ x of the current group
  // U chunks at a time (fewer at the end: whole groups); c − cb is a multiple of U, so
  // chunk c + u starts a group when u % CPG = 0 and ends one when (u + 1) % CPG = 0.
  for (int c = cb; c < ce; c += U) {
    const int nc = min(U, ce - c);
    // The chunks' weights and, for a chunk that ends a group, that group's scale and bias
    // of the lane's column in each tile.
    uint32_t wv[U][NT][WPL];
    float sv[U][NT], bv[U][NT];
    for (int u = 0; u < U; ++u) {
      if (u >= nc) break;
      for (int j = 0; j < NT; ++j) {
        for (int i = 0; i < WPL; ++i) wv[u][j][i] = wk[j] ? w[wo[j] + size_t(BITS * (c + u) + i)] : 0u;
      }
      if ((u + 1) % CPG == 0) {
        const int grp = (c + u) / CPG;
        for (int j = 0; j < NT; ++j) {
          const size_t o = size_t(wk[j] ? n0 + 8 * j + fm : 0) * NG + grp;
          sv[u][j] = wk[j] ? static_cast<float>(scales[o]) : 0.0f;
          bv[u][j] = wk[j] ? static_cast<float>(biases[o]) : 0.0f;
        }
      }
    }
    for (int u = 0; u < U; ++u) {
      if (u >= nc) break;
      if (u % CPG == 0) {
        for (int j = 0; j < NT; ++j) {
          for (int h = 0; h < 2; ++h) acc[j][h] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
        }
        xs[0][0] = xs[0][1] = xs[1][0] = xs[1][1] = 0.0f;
      }
      float xv[2][2][4];
      for (int h = 0; h < 2; ++h) {
        for (int e = 0; e < 2; ++e) {
          for (int s = 0; s < 4; ++s) {
            xv[h][e][s] = xo[h][e] >= 0 ? static_cast<float>(x[size_t(xo[h][e] + 32 * (c + u) + 2 * s)]) : 0.0f;
            xs[h][e] += xv[h][e][s];
          }
        }
      }
      for (int s = 0; s < 4; ++s) {
        simdgroup_matrix<float, 8, 8> xm[2];
        for (int h = 0; h < 2; ++h) {
          xm[h].thread_elements()[0] = xv[h][0][s];
          xm[h].thread_elements()[1] = xv[h][1][s];
        }
        for (int j = 0; j < NT; ++j) {
          // The lane's values 2s, 2s+1 at the low end of q.
          const uint32_t q = BITS == 4 ? wv[u][j][0] >> (8 * s) : wv[u][j][WPL > 1 ? s >> 1 : 0] >> (16 * (s & 1));
          simdgroup_matrix<float, 8, 8> qm;
          qm.thread_elements()[0] = static_cast<float>(q & MASK);
          qm.thread_elements()[1] = static_cast<float>((q >> BITS) & MASK);
          simdgroup_multiply_accumulate(acc[j][0], qm, xm[0], acc[j][0]);
          if (hi) simdgroup_multiply_accumulate(acc[j][1], qm, xm[1], acc[j][1]);
        }
      }
      if ((u + 1) % CPG == 0) {
        float r[2][2];
        for (int h = 0; h < 2; ++h) {
          for (int e = 0; e < 2; ++e) {
            float v = xs[h][e];
            v += simd_shuffle_xor(v, ushort(2));
            v += simd_shuffle_xor(v, ushort(4));
            v += simd_shuffle_xor(v, ushort(16));
            r[h][e] = v;
          }
        }
        for (int j = 0; j < NT; ++j) {
          for (int h = 0; h < 2; ++h) {
            for (int e = 0; e < 2; ++e) {
              const float a = acc[j][h].thread_elements()[e];
              tot[j][h][e] = fma(bv[u][j], r[h][e], fma(sv[u][j], a, tot[j][h][e]));
            }
          }
        }
      }
    }
  }
  for (int j = 0; j < NT; ++j) {
    for (int h = 0; h < 2; ++h) {
      for (int e = 0; e < 2; ++e) part[wid][8 * h + fn + e][8 * j + fm] = tot[j][h][e];
    }
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int i = tid; i < M * C; i += WARPS * 32) {
    const int m = i / C;
    const int cc = i - m * C;
    const int n = n0 + cc;
    if (n < N) {
      float s = part[0][m][cc];
      for (int v = 1; v < WARPS; ++v) s += part[v][m][cc];
      y[size_t(m) * N + n] = static_cast<T>(s);
    }
  }
