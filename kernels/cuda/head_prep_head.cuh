
  constexpr int HT = HQ + 2 * HK;
  constexpr int P = D / 64; // rotation pairs per lane
  const int L = q_shape[0];
  const int lane = threadIdx.x & 31;
  const int item = blockIdx.x * WARPS + (threadIdx.x >> 5);
  const int row = item / HT;
  const int hh = item - row * HT;
  if (row >= L) return; // warp-uniform
  const T* src;
  const T* nw = nullptr;
  T* dst;
  if (hh < HQ) {
    src = q + (size_t)row * q_shape[1] + QO + hh * D;
    dst = qo + ((size_t)hh * L + row) * D;
    nw = qn;
  } else if (hh < HQ + HK) {
    const int h = hh - HQ;
    src = k + (size_t)row * k_shape[1] + KO + h * D;
    dst = ko + ((size_t)h * L + row) * D;
    nw = kn;
  } else {
    const int h = hh - HQ - HK;
    src = v + (size_t)row * v_shape[1] + VO + h * D;
    dst = vo + ((size_t)h * L + row) * D;
  }
  T* dst2 = nullptr; // headPrepRow's second destination: none here
