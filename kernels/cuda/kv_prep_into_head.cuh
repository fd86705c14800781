
  if (blockIdx.x == 0) {
    for (int i = threadIdx.x; i < D; i += blockDim.x) qo[i] = qn[i];
  }
