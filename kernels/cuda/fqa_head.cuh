  const int H = q_shape[1];
  const int L = q_shape[2];
  const int Hkv = k_shape[1];
  const int h = blockIdx.x % H;
  const int l = blockIdx.x / H;
  if (l >= L) return; // block-uniform
  const int hk = h / (H / Hkv);
  const int lane = threadIdx.x & 31;
  const int wid = threadIdx.x >> 5;
  const int n = CAUSAL ? off[0] + l + 1 : off[0]; // keys this query sees
  const float sc = scale[0];
  const T* qp = q + h * q_strides[1] + l * q_strides[2];
  for (int d = threadIdx.x; d < D; d += WARPS * 32) qs[d] = static_cast<float>(qp[d * q_strides[3]]) * sc;
  __syncthreads();
  const T* kb = k + hk * k_strides[1];
  const T* vb = v + hk * v_strides[1];
  const long long kst = k_strides[2];
  const long long vst = v_strides[2];
#define DFLASH_KEY_ROW(j) (kb + (j) * kst)
#define DFLASH_VALUE_ROW(r) (vb + (r) * vst)
