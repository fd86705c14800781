package model

// The tensor-core variant of the few-row product (DFLASH_SKINNY_GEMM=tc). The CUDA-core
// kernel needs 16 FMAs per weight element for a 16-row block, about the H200's whole fp32
// rate at full memory bandwidth; mma.sync m16n8k16 does that work on tensor cores, and 16
// rows are exactly one tile (fewer rows are zero-padded in shared memory, which leaves every
// real row's result unchanged: rows do not interact in a matrix product).
//
// It is inline PTX rather than WMMA: <mma.h> includes crt/mma.h, which the pip CUDA headers
// that MLX's NVRTC compiles against (nvidia/cu13/include) do not ship.
//
// Layout: a block of 8 warps computes 32 output columns (four n8 tiles). The block stages x
// [16, KC] in shared memory per chunk of K; each warp takes every 8th 32-wide slice of the
// chunk and runs two k16 steps on it; the 8 partial 16×32 tiles are summed in a fixed order.
// Within a 32-wide slice the k order is permuted the same way for x and W (a dot product
// does not depend on the order of its terms' indices, only on the arithmetic, which is
// fixed): lane (g, t) then reads 8 consecutive weights of row n0+g (one 16-byte load) and 8
// consecutive x values per row, instead of four scattered pairs.
//
// Status: written after the last H200 run of session 2 and compiled offline with NVRTC
// (compute_90), not yet run on a GPU; TestSkinnyGEMMMatchesMatmul covers it on CUDA.

const (
	tcColumns = 32  // output columns per block (four n8 tiles)
	tcChunk   = 512 // K elements of x staged per pass (x tile 16 KB + partials 16 KB shared)
	tcKAlign  = 32  // K must be a multiple of this (one 32-wide slice = two k16 steps)
)

const tcSource = `
  __shared__ __align__(16) T xs[16][KC];
  __shared__ float part[WARPS][16][32];
  const int M = x_shape[0];
  const int N = w_shape[0];
  const int K = w_shape[1];
  const int lane = threadIdx.x & 31;
  const int wid = threadIdx.x >> 5;
  const int g = lane >> 2; // row of the fragment (and weight row within an n8 tile)
  const int t = lane & 3;  // pair within the row
  const int n0 = blockIdx.x * 32;
  float acc[4][4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
  }
  for (int kc = 0; kc < K; kc += KC) {
    const int len = min(KC, K - kc);
    const int vecs = len / 8;
    __syncthreads(); // the previous chunk is consumed
    for (int i = threadIdx.x; i < 16 * vecs; i += WARPS * 32) {
      const int m = i / vecs;
      const int q = i - m * vecs;
      uint4 v = make_uint4(0u, 0u, 0u, 0u);
      if (m < M) v = *reinterpret_cast<const uint4*>(x + (size_t)m * K + kc + q * 8);
      *reinterpret_cast<uint4*>(&xs[m][q * 8]) = v;
    }
    __syncthreads();
    for (int ks = wid * 32; ks < len; ks += WARPS * 32) {
      const uint4 xa = *reinterpret_cast<const uint4*>(&xs[g][ks + 8 * t]);
      const uint4 xb = *reinterpret_cast<const uint4*>(&xs[g + 8][ks + 8 * t]);
      uint4 wv[4];
#pragma unroll
      for (int j = 0; j < 4; ++j)
        wv[j] = *reinterpret_cast<const uint4*>(w + (size_t)(n0 + 8 * j + g) * K + kc + ks + 8 * t);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        MMA(acc[j], xa.x, xb.x, xa.y, xb.y, wv[j].x, wv[j].y);
        MMA(acc[j], xa.z, xb.z, xa.w, xb.w, wv[j].z, wv[j].w);
      }
    }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    part[wid][g][8 * j + 2 * t] = acc[j][0];
    part[wid][g][8 * j + 2 * t + 1] = acc[j][1];
    part[wid][g + 8][8 * j + 2 * t] = acc[j][2];
    part[wid][g + 8][8 * j + 2 * t + 1] = acc[j][3];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 16 * 32; i += WARPS * 32) {
    const int m = i / 32;
    const int c = i - m * 32;
    if (m < M && n0 + c < N) {
      float s = 0.0f;
#pragma unroll
      for (int k = 0; k < WARPS; ++k) s += part[k][m][c];
      y[(size_t)m * N + n0 + c] = static_cast<T>(s);
    }
  }
`

// tcMMA defines MMA(d, a0, a1, a2, a3, b0, b1): d += A·B for one m16n8k16 tile, with the
// element type picked by the BF16 template argument.
const tcMMA = `
#define MMA(d, a0, a1, a2, a3, b0, b1)                                                        \
  do {                                                                                        \
    if (BF16) {                                                                               \
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "                    \
                   "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"                    \
                   : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                            \
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));                    \
    } else {                                                                                  \
      asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "                      \
                   "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"                    \
                   : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                            \
                   : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));                    \
    }                                                                                         \
  } while (0)
`
