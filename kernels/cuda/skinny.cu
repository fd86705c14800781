
  __shared__ __align__(16) T xs[MMAX][KC];
  const int M = x_shape[0];
  const int N = w_shape[0];
  const int K = w_shape[1];
  const int lane = threadIdx.x & 31;
  const int wid = threadIdx.x >> 5;
  const int n0 = (blockIdx.x * WARPS + wid) * CPW;
  float acc[CPW][MMAX];
#pragma unroll
  for (int c = 0; c < CPW; ++c) {
#pragma unroll
    for (int m = 0; m < MMAX; ++m) acc[c][m] = 0.0f;
  }
  for (int kc = 0; kc < K; kc += KC) {
    const int len = min(KC, K - kc);
    const int vecs = len / 8;
    __syncthreads(); // the previous chunk is consumed
    for (int i = threadIdx.x; i < M * vecs; i += WARPS * 32) {
      const int m = i / vecs;
      const int q = i - m * vecs;
      *reinterpret_cast<uint4*>(&xs[m][q * 8]) = *reinterpret_cast<const uint4*>(x + (size_t)m * K + kc + q * 8);
    }
    __syncthreads();
    if (n0 < N) { // warp-uniform
#pragma unroll
      for (int i = 0; i < KC / 256; ++i) {
        const int kk = i * 256 + lane * 8;
        if (kk < len) {
          float wv[CPW][8];
#pragma unroll
          for (int c = 0; c < CPW; ++c) {
            const int n = min(n0 + c, N - 1); // past N: a duplicate column, never stored
            uint4 raw = *reinterpret_cast<const uint4*>(w + (size_t)n * K + kc + kk);
            const T* p = reinterpret_cast<const T*>(&raw);
#pragma unroll
            for (int j = 0; j < 8; ++j) wv[c][j] = static_cast<float>(p[j]);
          }
#pragma unroll
          for (int m = 0; m < MMAX; ++m) {
            if (m < M) {
              uint4 raw = *reinterpret_cast<const uint4*>(&xs[m][kk]);
              const T* p = reinterpret_cast<const T*>(&raw);
#pragma unroll
              for (int j = 0; j < 8; ++j) {
                const float xv = static_cast<float>(p[j]);
#pragma unroll
                for (int c = 0; c < CPW; ++c) acc[c][m] = fmaf(xv, wv[c][j], acc[c][m]);
              }
            }
          }
        }
      }
    }
  }
  if (n0 < N) {
#pragma unroll
    for (int c = 0; c < CPW; ++c) {
#pragma unroll
      for (int m = 0; m < MMAX; ++m) {
        float v = acc[c][m];
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0 && m < M && n0 + c < N) y[(size_t)m * N + n0 + c] = static_cast<T>(v);
      }
    }
  }
