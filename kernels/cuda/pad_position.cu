
  out[threadIdx.x] = a[0];
