
  constexpr int HT = HQ + 2 * HK;
  constexpr int P = D / 64; // rotation pairs per lane
  // DFLASH_PREP_INTO_CACHE (prep_into_cache.cuh): one merged q/k/v product y, keys and
  // values written into the cache's buffers; otherwise separate q, k, v into qo, ko, vo.
#ifdef DFLASH_PREP_INTO_CACHE
  const int L = y_shape[0];
#else
  const int L = q_shape[0];
#endif
  const int lane = threadIdx.x & 31;
  const int item = blockIdx.x * WARPS + (threadIdx.x >> 5);
  const int row = item / HT;
  const int hh = item - row * HT;
  if (row >= L) return; // warp-uniform
  const T* src;
  const T* nw = nullptr;
  T* dst;
  if (hh < HQ) {
#ifdef DFLASH_PREP_INTO_CACHE
    src = y + (size_t)row * y_shape[1] + QO + hh * D;
#else
    src = q + (size_t)row * q_shape[1] + QO + hh * D;
#endif
    dst = qo + ((size_t)hh * L + row) * D;
    nw = qn;
  } else if (hh < HQ + HK) {
    const int h = hh - HQ;
#ifdef DFLASH_PREP_INTO_CACHE
    src = y + (size_t)row * y_shape[1] + KO + h * D;
    const int p = off[0] + row;
    if (p < 0 || p >= ck_shape[2]) return; // warp-uniform
    dst = const_cast<T*>(ck) + ((size_t)h * ck_shape[2] + p) * D;
#else
    src = k + (size_t)row * k_shape[1] + KO + h * D;
    dst = ko + ((size_t)h * L + row) * D;
#endif
    nw = kn;
  } else {
    const int h = hh - HQ - HK;
#ifdef DFLASH_PREP_INTO_CACHE
    src = y + (size_t)row * y_shape[1] + VO + h * D;
    const int p = off[0] + row;
    if (p < 0 || p >= cv_shape[2]) return; // warp-uniform
    dst = const_cast<T*>(cv) + ((size_t)h * cv_shape[2] + p) * D;
#else
    src = v + (size_t)row * v_shape[1] + VO + h * D;
    dst = vo + ((size_t)h * L + row) * D;
#endif
  }
  T* dst2 = nullptr; // headPrepRow's second destination: none here
