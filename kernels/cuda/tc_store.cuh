
  if constexpr (ACT) {
    constexpr int H = C / 2;
    const int NH = N / 2;
    for (int i = threadIdx.x; i < 16 * H; i += WARPS * 32) {
      const int m = i / H;
      const int c = i - m * H;
      if (m < M && n0 + c < NH) {
        float sg = 0.0f, su = 0.0f;
#pragma unroll
        for (int k = 0; k < WARPS; ++k) {
          sg += part[k][m][c];
          su += part[k][m][c + H];
        }
        const float g = static_cast<float>(static_cast<T>(sg));
        const float u = static_cast<float>(static_cast<T>(su));
        y[(size_t)m * NH + n0 + c] = dflash_gated<T>(g, u);
      }
    }
    return;
  }
  for (int i = threadIdx.x; i < 16 * C; i += WARPS * 32) {
    const int m = i / C;
    const int c = i - m * C;
    if (m < M && n0 + c < N) {
      float s = 0.0f;
#pragma unroll
      for (int k = 0; k < WARPS; ++k) s += part[k][m][c];
      y[(size_t)m * N + n0 + c] = out(s, (size_t)m * N + n0 + c);
    }
  }
