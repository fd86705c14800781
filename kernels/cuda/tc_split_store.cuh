
  float* const wsw = const_cast<float*>(ws);
  float* wb = wsw + (size_t)blockIdx.x * 16 * C;
  for (int i = threadIdx.x; i < 16 * C; i += WARPS * 32) {
    const int m = i / C;
    if (m < M) {
      float s = 0.0f;
#pragma unroll
      for (int k = 0; k < WARPS; ++k) s += part[k][m][i - m * C];
      wb[i] = s;
    }
  }
  __threadfence();
  __syncthreads();
  __shared__ bool reducer;
  int* count = reinterpret_cast<int*>(const_cast<int32_t*>(cnt)) + ct;
  if (threadIdx.x == 0) reducer = atomicAdd(count, 1) == SPLIT - 1;
  __syncthreads();
  if (!reducer) return;
  __threadfence();
  const float* wt = ws + (size_t)ct * SPLIT * 16 * C;
  for (int i = threadIdx.x; i < 16 * C; i += WARPS * 32) {
    const int m = i / C;
    const int c = i - m * C;
    float v = 0.0f; // the written element as the next norm reads it (NORMOUT)
    if (m < M && n0 + c < N) {
      float s = 0.0f;
      for (int j = 0; j < SPLIT; ++j) s += __ldcg(wt + (size_t)j * 16 * C + i);
      const T o = out(s, (size_t)m * N + n0 + c);
      y[(size_t)m * N + n0 + c] = o;
      v = static_cast<float>(o);
    }
    if constexpr (NORMOUT) part[0][m][c] = v; // only this thread reads or writes element i here
  }
  if (threadIdx.x == 0) *count = 0;
