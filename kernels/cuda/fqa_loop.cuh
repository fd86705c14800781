// Key row j and value row r come from DFLASH_KEY_ROW and DFLASH_VALUE_ROW, which the
// kernel's head file defines: strided rows of k and v (fqa_head.cuh), or the cache's rows
// before the block and the block's own in shared memory (prep_attn_head.cuh).
  float m = NEG_INF;
  float lsum = 0.0f;
  float o[DPL];
#pragma unroll
  for (int i = 0; i < DPL; ++i) o[i] = 0.0f;
  for (int t0 = wid * 32; t0 < n; t0 += WARPS * 32) { // warp-uniform
    const int j = t0 + lane;
    float s = NEG_INF;
    if (j < n) {
      const T* kr = DFLASH_KEY_ROW(j);
      float acc = 0.0f;
#pragma unroll
      for (int d = 0; d < D; d += 8) {
        uint4 raw = *reinterpret_cast<const uint4*>(kr + d);
        const T* p = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc = fmaf(qs[d + e], static_cast<float>(p[e]), acc);
      }
      s = acc;
    }
    float tmax = s;
#pragma unroll
    for (int sh = 16; sh > 0; sh >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, sh));
    const float mnew = fmaxf(m, tmax); // finite: key t0 < n is in this tile
    const float corr = expf(m - mnew);
    const float p = (j < n) ? expf(s - mnew) : 0.0f;
    float psum = p;
#pragma unroll
    for (int sh = 16; sh > 0; sh >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, sh);
    lsum = lsum * corr + psum;
#pragma unroll
    for (int i = 0; i < DPL; ++i) o[i] *= corr;
    // Values of 8 keys at a time: their loads are issued before the first one is used
    // (one at a time, each waited for, this loop was most of the kernel's time). Keys past
    // n read row last−1 instead (in bounds) with weight 0; the sum's order is unchanged.
    const int last = min(32, n - t0);
    for (int j0 = 0; j0 < last; j0 += 8) {
      VecT vv[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int r = t0 + min(j0 + u, last - 1);
        vv[u] = *reinterpret_cast<const VecT*>(DFLASH_VALUE_ROW(r) + lane * DPL);
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const float pj = __shfl_sync(0xffffffffu, p, j0 + u);
        if (j0 + u < last) {
#pragma unroll
          for (int i = 0; i < DPL; ++i) o[i] = fmaf(pj, static_cast<float>(vv[u].e[i]), o[i]);
        }
      }
    }
    m = mnew;
  }
  if (lane == 0) {
    wm[wid] = m;
    wl[wid] = lsum;
  }
#pragma unroll
  for (int i = 0; i < DPL; ++i) wo[wid][lane * DPL + i] = o[i];
  __syncthreads();
  if (wid == 0) {
    float M = NEG_INF;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) M = fmaxf(M, wm[w]);
    float total = 0.0f;
    float acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[i] = 0.0f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
      const float f = wm[w] == NEG_INF ? 0.0f : expf(wm[w] - M); // a warp with no keys adds nothing
      total += wl[w] * f;
#pragma unroll
      for (int i = 0; i < DPL; ++i) acc[i] += wo[w][lane * DPL + i] * f;
    }
    T* op = out + ((size_t)l * H + h) * D + lane * DPL;
#pragma unroll
    for (int i = 0; i < DPL; ++i) op[i] = static_cast<T>(acc[i] / total);
  }
