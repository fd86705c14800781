package model

// The tensor-core variant of the few-row product (DFLASH_SKINNY_GEMM=tc). The CUDA-core
// kernel needs 16 FMAs per weight element for a 16-row block, about the H200's whole fp32
// rate at full memory bandwidth; a 16×16×16 WMMA tile does that work on tensor cores, and 16
// rows are exactly one tile (fewer rows are zero-padded in shared memory, which leaves every
// real row's result unchanged: rows do not interact in a matrix product).
//
// Layout: a block of 8 warps computes 32 output columns (two 16-column accumulator tiles per
// warp); the block stages x [16, KC] in shared memory per chunk of K, each warp takes every
// 8th 16-wide k-step of the chunk, and the 8 partial tiles are summed in a fixed order. W
// [N, K] row-major is exactly the col-major B operand with leading dimension K.
//
// Status: written after the last H200 run of session 2, not yet run on a GPU (the CUDA-only
// test TestSkinnyGEMMMatchesMatmul covers it when enabled); off unless asked for.

const (
	tcColumns = 32  // output columns per block
	tcChunk   = 512 // K elements of x staged per pass
)

const tcHeader = "#include <mma.h>\n"

const tcSource = `
  namespace wmma = nvcuda::wmma;
  __shared__ __align__(32) T xs[16][KC];
  __shared__ __align__(32) float part[WARPS][16][32];
  const int M = x_shape[0];
  const int N = w_shape[0];
  const int K = w_shape[1];
  const int wid = threadIdx.x >> 5;
  const int n0 = blockIdx.x * 32;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc0, acc1;
  wmma::fill_fragment(acc0, 0.0f);
  wmma::fill_fragment(acc1, 0.0f);
  for (int kc = 0; kc < K; kc += KC) {
    const int len = min(KC, K - kc);
    const int vecs = len / 8;
    __syncthreads(); // the previous chunk is consumed
    for (int i = threadIdx.x; i < 16 * vecs; i += WARPS * 32) {
      const int m = i / vecs;
      const int q = i - m * vecs;
      uint4 v = make_uint4(0, 0, 0, 0);
      if (m < M) v = *reinterpret_cast<const uint4*>(x + (size_t)m * K + kc + q * 8);
      *reinterpret_cast<uint4*>(&xs[m][q * 8]) = v;
    }
    __syncthreads();
#pragma unroll 2
    for (int ks = wid * 16; ks < len; ks += WARPS * 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b0, b1;
      wmma::load_matrix_sync(a, &xs[0][ks], KC);
      wmma::load_matrix_sync(b0, w + (size_t)n0 * K + kc + ks, K);
      wmma::load_matrix_sync(b1, w + (size_t)(n0 + 16) * K + kc + ks, K);
      wmma::mma_sync(acc0, a, b0, acc0);
      wmma::mma_sync(acc1, a, b1, acc1);
    }
  }
  wmma::store_matrix_sync(&part[wid][0][0], acc0, 32, wmma::mem_row_major);
  wmma::store_matrix_sync(&part[wid][0][16], acc1, 32, wmma::mem_row_major);
  __syncthreads();
  for (int t = threadIdx.x; t < 16 * 32; t += WARPS * 32) {
    const int m = t / 32;
    const int c = t - m * 32;
    if (m < M && n0 + c < N) {
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < WARPS; ++i) s += part[i][m][c];
      y[(size_t)m * N + n0 + c] = static_cast<T>(s);
    }
  }
`
