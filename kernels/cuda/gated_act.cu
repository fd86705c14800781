
  const size_t n = (size_t)gu_shape[0] * I;
  for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
    const size_t row = e / I;
    const size_t c = e - row * I;
    y[e] = dflash_gated<T>(static_cast<float>(gu[row * 2 * I + c]), static_cast<float>(gu[row * 2 * I + I + c]));
  }
