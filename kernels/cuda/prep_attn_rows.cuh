  };

  if (wid == 0) prep(y + (size_t)l * ystride + QO + h * D, qn, l, qt, nullptr);
  for (int r = wid; r < rows; r += WARPS) { // warp-uniform
    const T* src = y + (size_t)r * ystride;
    const bool store = writer && r == l && pos + r >= 0 && pos + r < R;
    prep(src + KO + hk * D, kn, r, &kr_s[r][0], store ? kb + (size_t)(pos + r) * D : nullptr);
    prep(src + VO + hk * D, nullptr, r, &vr_s[r][0], store ? vb + (size_t)(pos + r) * D : nullptr);
  }
  __syncthreads();
  const float sc = scale[0];
  for (int d = threadIdx.x; d < D; d += WARPS * 32) qs[d] = static_cast<float>(qt[d]) * sc;
  __syncthreads();
