
  constexpr int HT = HQ + 2 * HK;
  constexpr int P = D / 64; // rotation pairs per lane
  const int L = y_shape[0];
  const int lane = threadIdx.x & 31;
  const int item = blockIdx.x * WARPS + (threadIdx.x >> 5);
  const int row = item / HT;
  const int hh = item - row * HT;
  if (row >= L) return; // warp-uniform
  const T* src;
  const T* nw = nullptr;
  T* dst;
  if (hh < HQ) {
    src = y + (size_t)row * y_shape[1] + QO + hh * D;
    dst = qo + ((size_t)hh * L + row) * D;
    nw = qn;
  } else if (hh < HQ + HK) {
    const int h = hh - HQ;
    src = y + (size_t)row * y_shape[1] + KO + h * D;
    const int p = off[0] + row;
    if (p < 0 || p >= ck_shape[2]) return; // warp-uniform
    dst = const_cast<T*>(ck) + ((size_t)h * ck_shape[2] + p) * D;
    nw = kn;
  } else {
    const int h = hh - HQ - HK;
    src = y + (size_t)row * y_shape[1] + VO + h * D;
    const int p = off[0] + row;
    if (p < 0 || p >= cv_shape[2]) return; // warp-uniform
    dst = const_cast<T*>(cv) + ((size_t)h * cv_shape[2] + p) * D;
  }
  T* dst2 = nullptr; // headPrepRow's second destination: none here
