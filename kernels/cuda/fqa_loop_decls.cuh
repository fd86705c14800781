
  constexpr int DPL = D / 32; // output dimensions per lane
  // One lane's DPL values of a key, read with one load.
  struct alignas(DPL * sizeof(T)) VecT {
    T e[DPL];
  };
  const float NEG_INF = __int_as_float((int)0xff800000u);
  __shared__ float qs[D];
  __shared__ float wm[WARPS];
  __shared__ float wl[WARPS];
  __shared__ float wo[WARPS][D];
