  float a[P], b[P];
#pragma unroll
  for (int p = 0; p < P; ++p) {
    a[p] = static_cast<float>(src[lane + 32 * p]);
    b[p] = static_cast<float>(src[lane + 32 * p + D / 2]);
  }
  if (nw == nullptr) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
      dst[lane + 32 * p] = static_cast<T>(a[p]);
      dst[lane + 32 * p + D / 2] = static_cast<T>(b[p]);
      if (dst2 != nullptr) {
        dst2[lane + 32 * p] = static_cast<T>(a[p]);
        dst2[lane + 32 * p + D / 2] = static_cast<T>(b[p]);
      }
    }
    return;
  }
  float ss = 0.0f;
#pragma unroll
  for (int p = 0; p < P; ++p) ss += a[p] * a[p] + b[p] * b[p];
#pragma unroll
  for (int sh = 16; sh > 0; sh >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, sh);
  const float r = rsqrtf(ss / D + eps[0]);
  const float pos = static_cast<float>(off[0] + row);
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int i = lane + 32 * p;
    const float na = static_cast<float>(static_cast<T>(a[p] * r * static_cast<float>(nw[i])));
    const float nb = static_cast<float>(static_cast<T>(b[p] * r * static_cast<float>(nw[i + D / 2])));
    float sn, cs;
    sincosf(pos * inv[i], &sn, &cs);
    const T ra = static_cast<T>(na * cs - nb * sn);
    const T rb = static_cast<T>(na * sn + nb * cs);
    dst[i] = ra;
    dst[i + D / 2] = rb;
    if (dst2 != nullptr) {
      dst2[i] = ra;
      dst2[i + D / 2] = rb;
    }
  }
