  constexpr int P = D / 64; // rotation pairs per lane
  __shared__ __align__(16) T qt[D];
  __shared__ __align__(16) T kr_s[LMAX][D];
  __shared__ __align__(16) T vr_s[LMAX][D];
  constexpr int H = HQ;
  const int L = y_shape[0];
  const size_t ystride = y_shape[1];
  const int h = blockIdx.x % H;
  const int l = blockIdx.x / H;
  if (l >= L) return; // block-uniform
  const int hk = h / (H / HK);
  const int lane = threadIdx.x & 31;
  const int wid = threadIdx.x >> 5;
  const int pos = off[0];                // the block's first row
  const int rows = CAUSAL ? l + 1 : L;   // the block's rows this query sees
  const int n = pos + rows;              // keys it sees
  const int R = ck_shape[2];
  const bool writer = h % (H / HK) == 0; // stores its row's key and value
  T* const kb = const_cast<T*>(ck) + (size_t)hk * R * D;
  T* const vb = const_cast<T*>(cv) + (size_t)hk * R * D;
#define DFLASH_KEY_ROW(j) ((j) < pos ? kb + (size_t)(j) * D : &kr_s[(j) - pos][0])
#define DFLASH_VALUE_ROW(r) ((r) < pos ? vb + (size_t)(r) * D : &vr_s[(r) - pos][0])
  auto prep = [&](const T* src, const T* nw, int row, T* dst, T* dst2) {
