
  constexpr int NT = 1024;
  constexpr int E = 16 / sizeof(T);
  const int row = blockIdx.x;
  const int V = logits_shape[1];
  const T* p = logits + (size_t)row * V;
  T c = static_cast<T>(0.0f);
  if constexpr (SUB) c = static_cast<T>(static_cast<float>(lse[row])); // lse is T then (exact); the unread stand-in int32 otherwise
  float best = __int_as_float((int)0xff800000u); // −inf
  unsigned int bi = 0;
  // Whether (v, i) goes before (bv, bj): the larger value, NaN above every number (MLX's
  // ArgMax, numpy's), and among equals the smaller index.
  auto better = [](float v, unsigned int i, float bv, unsigned int bj) {
    const bool vn = v != v, bn = bv != bv;
    if (vn || bn) return vn && (!bn || i < bj);
    return v > bv || (v == bv && i < bj);
  };
  auto take = [&](float v, unsigned int i) {
    if (better(v, i, best, bi)) {
      best = v;
      bi = i;
    }
  };
  auto see = [&](T x, unsigned int i) {
    if constexpr (SUB) {
      take(static_cast<float>(static_cast<T>(x - c)), i);
    } else {
      take(static_cast<float>(x), i);
    }
  };
  // The warp's first maximum, in lane 0.
  auto warpBest = [&]() {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float v = __shfl_down_sync(0xffffffffu, best, o);
      const unsigned int i = __shfl_down_sync(0xffffffffu, bi, o);
      take(v, i);
    }
  };
  auto chunk = [&](const uint4& a, unsigned int j) {
    const T* e = reinterpret_cast<const T*>(&a);
#pragma unroll
    for (int k = 0; k < E; ++k) see(e[k], j * E + k);
  };
  const int nc = (reinterpret_cast<size_t>(p) & 15) == 0 ? V / E : 0; // whole aligned chunks
  const uint4* pc = reinterpret_cast<const uint4*>(p);
  int j = threadIdx.x;
  for (; j + 3 * NT < nc; j += 4 * NT) {
    uint4 a[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) a[u] = pc[j + u * NT];
#pragma unroll
    for (int u = 0; u < 4; ++u) chunk(a[u], j + u * NT);
  }
  for (; j < nc; j += NT) chunk(pc[j], j);
  for (int i = nc * E + threadIdx.x; i < V; i += NT) see(p[i], i);
  // The block's first maximum: per warp, then across warps.
  warpBest();
  __shared__ float wv[NT / 32];
  __shared__ unsigned int wi[NT / 32];
  const int lane = threadIdx.x & 31;
  const int wid = threadIdx.x >> 5;
  if (lane == 0) {
    wv[wid] = best;
    wi[wid] = bi;
  }
  __syncthreads();
  if (wid == 0) {
    best = wv[lane];
    bi = wi[lane];
    warpBest();
    if (lane == 0) {
      next[row] = static_cast<int32_t>(bi);
      if constexpr (DRAFTS) {
        if (row < drafts_shape[0]) match[row] = static_cast<int32_t>(bi) == drafts[row];
      }
    }
  }
