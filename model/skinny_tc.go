package model

import "github.com/dflash-mlx/dflash-mlx/mlxc"

// The tensor-core variant of the few-row product (DFLASH_SKINNY_GEMM=tc). The CUDA-core
// kernel needs 16 FMAs per weight element for a 16-row block, about the H200's whole fp32
// rate at full memory bandwidth; mma.sync m16n8k16 does that work on tensor cores, and 16
// rows are exactly one tile (missing rows read as zeros, which leaves every real row's
// result unchanged: rows do not interact in a matrix product).
//
// It is inline PTX rather than WMMA: <mma.h> includes crt/mma.h, which the pip CUDA headers
// that MLX's NVRTC compiles against (nvidia/cu13/include) do not ship.
//
// The product is a stream of weights read once, so the layout is built for bytes in flight:
// a block of tcWarps warps owns TILES n8 tiles (8·TILES output columns) and its warps split
// K between them, each taking groups of U 32-wide slices in turn; a warp issues all U·TILES
// 16-byte weight loads of a group before its first mma, and reads x straight from global
// memory (16 rows × K stays in L1/L2 for every block) so the loop has no barrier. The
// warps' partial tiles are summed in a fixed order at the end. Within a 32-wide slice the
// k order is permuted the same way for x and W (a dot product does not depend on the
// order of its terms' indices): lane (g, t) reads 8 consecutive weights of row n0+g (one
// 16-byte load) and the same 8 k of rows g and g+8 of x.
//
// TILES and the split depend on N and K only, never on the row count, so a row's result is
// the same bit for bit whether it comes with 1 or 15 other rows (GPUExactDefault relies on
// this). The first version staged x in shared memory behind barriers and had one block
// per 32 columns: it cut the verify's host time but ran far below the memory bandwidth on
// the device (see docs/perf/tensor-core-products.md).
const tcKAlign = 32 // K must be a multiple of this (one slice = two k16 steps)

// tcConfig is one launch shape of the kernel: Tiles n8 tiles per block (8·Tiles output
// columns), Warps warps per block splitting K, Unroll slices per group (Unroll·Tiles
// weight loads in flight per lane; twice that with Pipe).
type tcConfig struct {
	Tiles, Warps, Unroll int
	Pipe                 bool // load the next group while this one multiplies (two register sets)
	// Stages > 0: weights go through shared memory in tiles of KT columns, Stages deep
	// (cp.async), instead of straight into registers; Unroll and Pipe are then unused.
	Stages, KT int
	// Tiled: the weight comes in the tensor-core layout (tcTile), so that each warp-wide
	// 16-byte load reads 512 contiguous bytes instead of 64 bytes of 8 rows. Register
	// path only (Stages 0).
	Tiled bool
	// Split > 1: K is cut into Split chunks, one block each (Split blocks per n8·Tiles
	// column tile), so that narrow products run as many small blocks that spread evenly
	// over the SMs; the last block of a tile to finish sums the chunks' float partials in
	// chunk order (tcSplitStore). Split < 0 (tcSplitAuto) picks the count per product in
	// resolve. Register path only.
	Split int
	// Gated: x is a merged gate/up product [M, 2K] and the kernel multiplies silu(gate)·up
	// (the MLP's down projection without a kernel for the activation). Resid: the kernel
	// adds its input r [M, N] to the product as it writes y (the residual stream's add).
	// Act: w is a merged gate/up weight [2I, K] (gate rows first) and y is silu(gate)·up
	// [M, I], each block computing 4·Tiles gate columns and the same up columns (the MLP's
	// activation without a kernel of its own; even Tiles, no split, register path). None of
	// the three changes the launch shape.
	Gated, Resid, Act bool
	// NormOut (split launches only): the launch also writes its output's RMSNorm, xn =
	// RMSNorm(y) with the norm weight xw and eps = EpsBits' float32, from the rows' scales
	// rsqrt(mean(y[m]²) + eps) (left in the scratch: scalesAt). The sums of squares run in a fixed order (each
	// tile's columns, then the tiles in order), so a row's norm does not depend on other
	// rows; each element is rounded as MLX's RMSNorm rounds it (tcNormOut).
	NormOut bool
	EpsBits int
}

// tcSplitAuto asks resolve for one group of Unroll slices per warp and block.
const tcSplitAuto = -1

// tcSplitMaxBlocks caps an automatic split: a product with enough column tiles already
// spreads over the SMs (the vocabulary head: 4 748 tiles).
const tcSplitMaxBlocks = 4096

// resolve fixes an automatic split for an [N, K] weight: K/32 slices over Warps·Unroll
// slices per block, at most tcSplitMaxBlocks blocks in all. It depends on N and K only.
func (c tcConfig) resolve(N, K int) tcConfig {
	if c.Split != tcSplitAuto {
		return c
	}
	c.Split = 1
	if c.Tiles == 0 || c.Warps == 0 {
		return c
	}
	tiles := N / (8 * c.Tiles)
	want := (K / 32) / (c.Warps * max(c.Unroll, 1))
	c.Split = max(1, min(want, tcSplitMaxBlocks/max(tiles, 1)))
	return c
}

// scratchLen is the float scratch (TCState's ws) of a split launch over N columns: every
// block's partials, then with NormOut the tiles' sums of squares [16][tiles] and the rows'
// scales [16] (at scalesAt).
func (c tcConfig) scratchLen(N int) int {
	n := max(c.Split, 1) * 16 * N
	if c.NormOut {
		n = c.scalesAt(N) + 16
	}
	return n
}

// scalesAt is where a NormOut launch leaves its rows' scales rsqrt(mean(y²) + eps) in the
// scratch, valid once the launch has run and until the weight's next launch.
func (c tcConfig) scalesAt(N int) int {
	return max(c.Split, 1)*16*N + 16*(N/(8*c.Tiles))
}

// template is the kernel's compile-time arguments for elements of type dt (the offline
// compile check builds its instantiations from this too, so the two cannot drift).
func (c tcConfig) template(dt mlxc.Dtype) []mlxc.TemplateArg {
	return []mlxc.TemplateArg{{Name: "T", Value: dt}, {Name: "TILES", Value: c.Tiles}, {Name: "U", Value: max(c.Unroll, 1)},
		{Name: "WARPS", Value: c.Warps}, {Name: "BF16", Value: dt == mlxc.BFloat16}, {Name: "PIPE", Value: c.Pipe},
		{Name: "STAGES", Value: c.Stages}, {Name: "KT", Value: max(c.KT, 32)}, {Name: "TILED", Value: c.Tiled},
		{Name: "SPLIT", Value: max(c.Split, 1)}, {Name: "GATED", Value: c.Gated}, {Name: "RESID", Value: c.Resid}, {Name: "ACT", Value: c.Act},
		{Name: "NORMOUT", Value: c.NormOut}, {Name: "EPSBITS", Value: c.EpsBits}}
}

// fits reports whether the launch can serve an [N, K] weight: whole tiles, and for the
// staged path whole KT tiles and its shared memory within the 48 KB of a static block.
func (c tcConfig) fits(N, K int) bool {
	C := 8 * c.Tiles
	if c.Tiles == 0 || N%C != 0 || K%tcKAlign != 0 {
		return false
	}
	if c.Split > 1 && (c.Stages > 0 || K/32 < c.Split) {
		return false // the staged path reads all of K; a chunk needs one slice at least
	}
	if c.Stages == 0 {
		return true
	}
	if c.Tiled {
		return false
	}
	smem := c.Stages*C*(c.KT+32)*2 + c.Warps*16*C*4
	return c.Stages >= 2 && c.KT%32 == 0 && K%c.KT == 0 && smem <= 48*1024
}

// tcConfigFor picks the launch for an [N, K] weight; it depends on N and K only, never on
// the row count. Tiles: 4 (x read once per 32 columns) when that still gives two blocks
// per SM of an H200, else 2, so that narrow products still spread over every SM; K split
// over blocks for the narrowest. Tiles 0: N does not fit.
//
// Shapes are chosen by timing them inside the model, per class of product, because a
// product's speed alone is not its speed between the layer's other kernels; each shape
// aims at filling the GPU in one wave of blocks, and its measurements are in
// docs/perf/tensor-core-products.md.
func tcConfigFor(N, K int) tcConfig {
	switch {
	case N%32 == 0 && N/32 >= 264:
		return tcConfig{Tiles: 4, Warps: 8, Unroll: 4, Pipe: true}
	case N%16 == 0 && N/16 >= 264:
		return tcConfig{Tiles: 1, Warps: 4, Unroll: 2, Pipe: true}
	case N%32 == 0 && K >= 8192:
		c := tcConfig{Tiles: 4, Warps: 4, Unroll: 4, Split: tcSplitAuto}.resolve(N, K)
		c.Split = max(1, min(c.Split, tcOneWaveBlocks/(N/32)))
		return c
	case N%16 == 0:
		c := tcConfig{Tiles: 2, Warps: 4, Unroll: 8, Split: tcSplitAuto}.resolve(N, K)
		if (N/16)*c.Split < tcSplitMinBlocks {
			// Too few blocks to reach every SM: smaller chunks.
			c = tcConfig{Tiles: 2, Warps: 4, Unroll: 4, Split: tcSplitAuto}.resolve(N, K)
		}
		return c
	}
	return tcConfig{}
}

// tcOneWaveBlocks is how many blocks of the long-K shape (4 tiles, 4 warps, 104 registers:
// 4 blocks per SM) an H200's 132 SMs hold at once; tcConfigFor cuts K into no more chunks
// than fill them, so that the product runs in one wave without a tail.
const tcOneWaveBlocks = 4 * 132

// tcSplitMinBlocks is the block count below which tcConfigFor cuts K into smaller chunks
// (about 2.4 blocks per SM of an H200).
const tcSplitMinBlocks = 320

// tcConfigSweep is the per-product best of TestSkinnyTCSweep's shapes, each product timed
// alone (DFLASH_TC_RULE=sweep): wide products (gate/up, the vocabulary head) 4 tiles, 8
// warps, 4 slices, pipelined; long K (down) 4 tiles, 4 warps; the rest one tile, 4 warps,
// 2 slices, pipelined. Kept to compare against, since inside the model it lost to
// tcConfigFor (see docs/perf/tensor-core-products.md).
func tcConfigSweep(N, K int) tcConfig {
	switch {
	case N >= 16384 && N%32 == 0:
		return tcConfig{Tiles: 4, Warps: 8, Unroll: 4, Pipe: true}
	case K >= 8192 && N%32 == 0:
		return tcConfig{Tiles: 4, Warps: 4, Unroll: 4}
	case N%8 == 0:
		return tcConfig{Tiles: 1, Warps: 4, Unroll: 2, Pipe: true}
	}
	return tcConfig{}
}

// tcMain is the kernel up to the warps' partial tiles in part[][][]; tcStore (one block per
// column tile) or tcSplitStore (Split blocks per tile) writes y from them. With SPLIT = 1
// both kernels read all of K and sum in the same order as before the split existed.
const tcMain = `
  constexpr int C = 8 * TILES;
  __shared__ float part[WARPS][16][C];
  const int M = x_shape[0];
  const int XK = x_shape[1]; // a row of x: K elements, or gate and up side by side (GATED)
  const int K = GATED ? XK / 2 : XK;
  const int S = K / 32;
  const int lane = threadIdx.x & 31;
  const int wid = threadIdx.x >> 5;
  const int g = lane >> 2; // row of the fragment (and weight row within an n8 tile)
  const int t = lane & 3;  // 8-element group within a 32-wide slice
  const int ct = blockIdx.x / SPLIT;       // column tile
  const int chunk = blockIdx.x - ct * SPLIT;
  const int sb = chunk * S / SPLIT;              // this block's first slice
  const int SC = (chunk + 1) * S / SPLIT - sb;   // and its slice count
  const int ft = ct * (ACT ? TILES / 2 : TILES); // the block's first n8 tile of weight rows (with ACT: gate rows)
  const int n0 = 8 * ft;                          // and its first row
  const int N = TILED ? w_shape[0] * 8 : w_shape[0]; // the weight's rows (y's columns without ACT)
  const bool r0 = g < M;
  const bool r1 = g + 8 < M;
  const T* xa_p = x + (size_t)(r0 ? g : 0) * XK + 8 * t + 32 * sb;
  const T* xb_p = x + (size_t)(r1 ? g + 8 : 0) * XK + 8 * t + 32 * sb;
  // The 8 elements of x at p; with GATED, silu(gate)·up of the gate elements at p and the
  // up elements K on (dflash_gated, GatedAct's own rounding), so the product sees the
  // activation's values bit for bit and the activation costs no kernel of its own.
  auto ldx = [&](const T* p) -> uint4 {
    uint4 v = *reinterpret_cast<const uint4*>(p);
    if constexpr (GATED) {
      const uint4 u = *reinterpret_cast<const uint4*>(p + K);
      T* gv = reinterpret_cast<T*>(&v);
      const T* uv = reinterpret_cast<const T*>(&u);
#pragma unroll
      for (int j = 0; j < 8; ++j) gv[j] = dflash_gated<T>(static_cast<float>(gv[j]), static_cast<float>(uv[j]));
    }
    return v;
  };
  // Rows g and g+8 of x at k offset o (from the lane's first k), zeros for missing rows.
  auto ldx2 = [&](int o, uint4& a, uint4& b) {
    a = r0 ? ldx(xa_p + o) : make_uint4(0u, 0u, 0u, 0u);
    b = r1 ? ldx(xb_p + o) : make_uint4(0u, 0u, 0u, 0u);
  };
  // y's element i from its float sum s: rounded to T, plus r's element rounded again with
  // RESID (what MLX's Add of the rounded product and r returns; r unread otherwise).
  auto out = [&](float s, size_t i) -> T {
    if constexpr (RESID) {
      return static_cast<T>(static_cast<float>(static_cast<T>(s)) + static_cast<float>(r[i]));
    }
    return static_cast<T>(s);
  };
  // This lane's 8 weights of slice 0 of the block's first n8 tile; the next tile is
  // "tile" elements on, the next slice SLICE. Row-major: rows n0+g, k from 8t. Tiled
  // [N/8, S, 32 lanes, 8]: the lane's 16 bytes next to its neighbours'.
  constexpr int SLICE = TILED ? 256 : 32;
  const T* w_p = TILED ? w + ((size_t)ft * S * 32 + lane) * 8 + (size_t)sb * 256 : w + (size_t)(n0 + g) * K + 8 * t + 32 * sb;
  const size_t tile = TILED ? (size_t)S * 256 : (size_t)8 * K;
  // Tile j's weights start toff[j] elements after w_p: the next tile each, or with ACT (a
  // merged gate/up weight, up rows half the weight on: N/16 tiles) gate tiles in the
  // first half of the block's tiles and the same rows' up tiles in the second, in either
  // layout.
  size_t toff[TILES];
#pragma unroll
  for (int j = 0; j < TILES; ++j) {
    toff[j] = (ACT && j >= TILES / 2 ? (size_t)N / 16 + (j - TILES / 2) : (size_t)j) * tile;
  }
  float acc[TILES][4];
#pragma unroll
  for (int j = 0; j < TILES; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
  }
  const int G = SC / U;
  // One group: U·TILES weight loads and 2·U loads of x, issued before any mma uses them.
  auto load = [&](uint4 (&wv)[U][TILES], uint4 (&xa)[U], uint4 (&xb)[U], int grp) {
    const int k0 = grp * U * 32;
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int j = 0; j < TILES; ++j) wv[u][j] = LDW(w_p + toff[j] + (size_t)(grp * U + u) * SLICE);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) ldx2(k0 + 32 * u, xa[u], xb[u]);
  };
  auto mma = [&](uint4 (&wv)[U][TILES], uint4 (&xa)[U], uint4 (&xb)[U]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int j = 0; j < TILES; ++j) {
        MMA(acc[j], xa[u].x, xb[u].x, xa[u].y, xb[u].y, wv[u][j].x, wv[u][j].y);
        MMA(acc[j], xa[u].z, xb[u].z, xa[u].w, xb[u].w, wv[u][j].z, wv[u][j].w);
      }
    }
  };
  uint4 w0[U][TILES], xa0[U], xb0[U];
  if constexpr (STAGES > 0) {
    // Weight tiles [C rows, KT] staged through shared memory with cp.async, STAGES deep:
    // one warp-wide copy reads 512 contiguous bytes of a row (the register path reads 64
    // bytes of 8 rows). Rows are padded by 64 bytes so that the fragment reads of rows g
    // and g+1 fall on different banks. Warp w multiplies slices w, w+WARPS, ... of every
    // tile, tiles in order, so the sums do not depend on the row count either.
    // (The kernel is not a template: this branch is compiled for STAGES = 0 too, so its
    // sizes must stay valid then.)
    constexpr int NS = STAGES > 1 ? STAGES : 2;
    constexpr int PITCH = KT + 32;
    constexpr int CHUNKS = C * KT / 8; // 16-byte copies per tile
    __shared__ __align__(16) T wsm[STAGES > 0 ? STAGES : 1][C][PITCH];
    const int tiles = K / KT;
    auto issue = [&](int tl) {
      const int buf = tl % NS;
      for (int c = threadIdx.x; c < CHUNKS; c += WARPS * 32) {
        const int r = c / (KT / 8);
        const int q = c - r * (KT / 8);
        const T* src = w + (size_t)(n0 + r) * K + (size_t)tl * KT + q * 8;
        unsigned dst;
        asm volatile("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }"
                     : "=r"(dst)
                     : "l"(reinterpret_cast<unsigned long long>(&wsm[buf][r][q * 8])));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src));
      }
    };
#pragma unroll
    for (int st = 0; st < NS - 1; ++st) {
      if (st < tiles) issue(st);
      asm volatile("cp.async.commit_group;" ::);
    }
    for (int tl = 0; tl < tiles; ++tl) {
      asm volatile("cp.async.wait_group %0;" ::"n"(NS - 2));
      __syncthreads(); // tile tl is in for every thread; the buffer refilled next was consumed
      if (tl + NS - 1 < tiles) issue(tl + NS - 1);
      asm volatile("cp.async.commit_group;" ::);
      const int buf = tl % NS;
      for (int sl = wid; sl < KT / 32; sl += WARPS) {
        uint4 xa, xb;
        ldx2(tl * KT + sl * 32, xa, xb);
#pragma unroll
        for (int j = 0; j < TILES; ++j) {
          const uint4 wv = *reinterpret_cast<const uint4*>(&wsm[buf][8 * j + g][sl * 32 + 8 * t]);
          MMA(acc[j], xa.x, xb.x, xa.y, xb.y, wv.x, wv.y);
          MMA(acc[j], xa.z, xb.z, xa.w, xb.w, wv.z, wv.w);
        }
      }
    }
  } else if constexpr (PIPE) {
    // Software pipelining: the next group's loads are in flight while this group's mmas
    // run (two register sets, used alternately). Same groups in the same order as below,
    // so the same sums.
    uint4 w1[U][TILES], xa1[U], xb1[U];
    int grp = wid;
    if (grp < G) load(w0, xa0, xb0, grp);
    for (; grp < G; grp += 2 * WARPS) {
      if (grp + WARPS < G) load(w1, xa1, xb1, grp + WARPS);
      mma(w0, xa0, xb0);
      if (grp + WARPS >= G) break;
      if (grp + 2 * WARPS < G) load(w0, xa0, xb0, grp + 2 * WARPS);
      mma(w1, xa1, xb1);
    }
  } else {
    for (int grp = wid; grp < G; grp += WARPS) {
      load(w0, xa0, xb0, grp);
      mma(w0, xa0, xb0);
    }
  }
  for (int s = G * U + wid; STAGES == 0 && s < SC; s += WARPS) { // the last SC mod U slices, one per warp
    uint4 xa, xb;
    ldx2(s * 32, xa, xb);
#pragma unroll
    for (int j = 0; j < TILES; ++j) {
      const uint4 wv = LDW(w_p + toff[j] + (size_t)s * SLICE);
      MMA(acc[j], xa.x, xb.x, xa.y, xb.y, wv.x, wv.y);
      MMA(acc[j], xa.z, xb.z, xa.w, xb.w, wv.z, wv.w);
    }
  }
#pragma unroll
  for (int j = 0; j < TILES; ++j) {
    part[wid][g][8 * j + 2 * t] = acc[j][0];
    part[wid][g][8 * j + 2 * t + 1] = acc[j][1];
    part[wid][g + 8][8 * j + 2 * t] = acc[j][2];
    part[wid][g + 8][8 * j + 2 * t + 1] = acc[j][3];
  }
  __syncthreads();
`

// tcStore sums the warps' partials in warp order and writes y (one block per tile); with
// ACT, y is silu(gate)·up [M, N/2] of the gate and up columns, each rounded to T first and
// then as GatedAct rounds: the values GatedAct gives for this product, bit for bit (a
// column's sum does not depend on which tile slot computed it).
const tcStore = `
  if constexpr (ACT) {
    constexpr int H = C / 2;
    const int NH = N / 2;
    for (int i = threadIdx.x; i < 16 * H; i += WARPS * 32) {
      const int m = i / H;
      const int c = i - m * H;
      if (m < M && n0 + c < NH) {
        float sg = 0.0f, su = 0.0f;
#pragma unroll
        for (int k = 0; k < WARPS; ++k) {
          sg += part[k][m][c];
          su += part[k][m][c + H];
        }
        const float g = static_cast<float>(static_cast<T>(sg));
        const float u = static_cast<float>(static_cast<T>(su));
        y[(size_t)m * NH + n0 + c] = dflash_gated<T>(g, u);
      }
    }
    return;
  }
  for (int i = threadIdx.x; i < 16 * C; i += WARPS * 32) {
    const int m = i / C;
    const int c = i - m * C;
    if (m < M && n0 + c < N) {
      float s = 0.0f;
#pragma unroll
      for (int k = 0; k < WARPS; ++k) s += part[k][m][c];
      y[(size_t)m * N + n0 + c] = out(s, (size_t)m * N + n0 + c);
    }
  }
`

// tcSplitStore: each block writes its chunk's float partial (warps summed in warp order) to
// ws [tiles·SPLIT, 16, C]; the last of a tile's SPLIT blocks to count itself in cnt[ct]
// (an atomic add; the threadfence pattern of CUDA's reduction samples) sums the chunks in
// chunk order, writes y and sets the count back to 0 for the next call. cnt and ws belong
// to one weight (TCState: inputs MLX does not know are written), and dep (unread: the
// weight's previous y) orders this launch after the weight's previous one: MLX's CUDA
// graphs may run kernels without a data path between them at the same time, so two
// launches must never use a count or a scratch buffer at once.
const tcSplitStore = `
  float* const wsw = const_cast<float*>(ws);
  float* wb = wsw + (size_t)blockIdx.x * 16 * C;
  for (int i = threadIdx.x; i < 16 * C; i += WARPS * 32) {
    const int m = i / C;
    if (m < M) {
      float s = 0.0f;
#pragma unroll
      for (int k = 0; k < WARPS; ++k) s += part[k][m][i - m * C];
      wb[i] = s;
    }
  }
  __threadfence();
  __syncthreads();
  __shared__ bool reducer;
  int* count = reinterpret_cast<int*>(const_cast<int32_t*>(cnt)) + ct;
  if (threadIdx.x == 0) reducer = atomicAdd(count, 1) == SPLIT - 1;
  __syncthreads();
  if (!reducer) return;
  __threadfence();
  const float* wt = ws + (size_t)ct * SPLIT * 16 * C;
  for (int i = threadIdx.x; i < 16 * C; i += WARPS * 32) {
    const int m = i / C;
    const int c = i - m * C;
    float v = 0.0f; // the written element as the next norm reads it (NORMOUT)
    if (m < M && n0 + c < N) {
      float s = 0.0f;
      for (int j = 0; j < SPLIT; ++j) s += __ldcg(wt + (size_t)j * 16 * C + i);
      const T o = out(s, (size_t)m * N + n0 + c);
      y[(size_t)m * N + n0 + c] = o;
      v = static_cast<float>(o);
    }
    if constexpr (NORMOUT) part[0][m][c] = v; // only this thread reads or writes element i here
  }
  if (threadIdx.x == 0) *count = 0;
`

// tcNormOut (the split kernel with NormOut) follows tcSplitStore in each tile's last
// block. The block stages its columns of the norm weight xw, writes the tile's sums of
// squares per row to ws after the partials (8 lanes per row, then a fixed butterfly), and
// waits until every tile's last block has: a barrier of the tiles' last blocks on one
// 64-bit word of cnt, arrivals in the low half and a generation in the high half; the last
// arriver clears the arrivals and bumps the generation in one atomic add, the others poll
// the generation. Each of them then sums the tiles' sums per row (lanes over tiles, then a
// fixed butterfly: the same float sums in every block), takes the row's scale
// s = rsqrt(Σ/N + eps) as MLX's RMSNorm does (float32), and writes its own columns of
// xn = T(xw·T(y·s)), MLX's RMSNorm's roundings, from the values it has just written to y.
// Only tiles' last blocks wait, at most one per column tile but the last; normOutFits
// keeps them fewer than the block slots the GPU guarantees (159 for the 4B shape's o
// projection against 264 on an H200), so the blocks still to run always find one, and
// ndep (unread: the previous NormOut launch's y) keeps two such launches from running at
// once. Tile 0's block writes the scales to ws after the sums (tcConfig.scalesAt).
const tcNormOut = `
  static_assert(C <= WARPS * 32, "one thread per column stages the norm weight");
  __shared__ float nwt[C];
  if (threadIdx.x < C) nwt[threadIdx.x] = n0 + threadIdx.x < N ? static_cast<float>(xw[n0 + threadIdx.x]) : 0.0f;
  __syncthreads();
  const int tiles = gridDim.x / SPLIT;
  float* ss = wsw + (size_t)gridDim.x * 16 * C; // [16][tiles], then the scales [16]
  for (int i = threadIdx.x; i < 128; i += WARPS * 32) {
    const int m = i >> 3;
    const int l = i & 7;
    float a = 0.0f;
    for (int c = l; c < C; c += 8) a += part[0][m][c] * part[0][m][c];
    a += __shfl_xor_sync(0xffffffffu, a, 4);
    a += __shfl_xor_sync(0xffffffffu, a, 2);
    a += __shfl_xor_sync(0xffffffffu, a, 1);
    if (l == 0) ss[(size_t)m * tiles + ct] = a;
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long* bar = reinterpret_cast<unsigned long long*>(const_cast<int32_t*>(cnt) + ((N / 8 + 1) & ~1));
    const unsigned long long old = atomicAdd(bar, 1ull);
    if ((old & 0xffffffffull) == (unsigned long long)(tiles - 1)) {
      atomicAdd(bar, (1ull << 32) - (unsigned long long)tiles); // arrivals back to 0, next generation
    } else {
      const unsigned int gen = (unsigned int)(old >> 32);
      while ((unsigned int)(*reinterpret_cast<volatile unsigned long long*>(bar) >> 32) == gen) __nanosleep(20);
    }
    __threadfence();
  }
  __syncthreads();
  __shared__ float scale[16];
  constexpr int RPW = (16 + WARPS - 1) / WARPS; // rows per warp
  float rs[RPW];
#pragma unroll
  for (int j = 0; j < RPW; ++j) {
    const int m = wid + j * WARPS;
    rs[j] = 0.0f;
    for (int q0 = 0; m < 16 && q0 < tiles; q0 += 256) {
      float v[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const int q = q0 + lane + 32 * k;
        v[k] = q < tiles ? __ldcg(ss + (size_t)m * tiles + q) : 0.0f;
      }
#pragma unroll
      for (int k = 0; k < 8; ++k) rs[j] += v[k];
    }
  }
#pragma unroll
  for (int j = 0; j < RPW; ++j) {
    float a = rs[j];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
    const int m = wid + j * WARPS;
    if (lane == 0 && m < 16) scale[m] = rsqrtf(a / static_cast<float>(N) + __int_as_float(EPSBITS));
  }
  __syncthreads();
  if (ct == 0 && threadIdx.x < M) ss[(size_t)16 * tiles + threadIdx.x] = scale[threadIdx.x];
  for (int i = threadIdx.x; i < 16 * C; i += WARPS * 32) {
    const int m = i / C;
    const int c = i - m * C;
    if (m < M && n0 + c < N) {
      const float n = static_cast<float>(static_cast<T>(part[0][m][c] * scale[m]));
      xn[(size_t)m * N + n0 + c] = static_cast<T>(nwt[c] * n);
    }
  }
`

// The kernels' bodies.
var (
	tcSource          = tcMain + tcStore          // x, w, r
	tcSplitSource     = tcMain + tcSplitStore     // x, w, cnt, dep, r, ws → y
	tcSplitNormSource = tcSplitSource + tcNormOut // x, w, cnt, dep, r, ws, xw, ndep → y, xn
)

// tcMMA defines MMA(d, a0, a1, a2, a3, b0, b1): d += A·B for one m16n8k16 tile, with the
// element type picked by the BF16 template argument; LDW(p), a 16-byte weight load that
// bypasses L1 (weights are read once; L1 is left to x); and GatedAct's activation
// (gatedDevice) for the GATED and ACT fusions.
const tcMMA = gatedDevice + `
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

__device__ __forceinline__ uint4 dflash_ldw(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}
#define LDW(p) dflash_ldw(p)

`

// tcTile lays a row-major weight [N, K] out as the tensor-core kernel's lanes read it:
// [N/8, K/32, 32, 8], where lane 4g+t of slice s of n8 tile nt holds W[8nt+g][32s+8t ..
// 32s+8t+7]. A warp's load of one slice is then 512 contiguous bytes (row-major: 64 bytes
// from each of 8 rows), and the products are the same bit for bit (same terms, same
// order). The layout is a second copy of each weight that goes through the kernel, made
// while device memory allows (SkinnyGEMM.mayTile; DFLASH_TC_TILED=0 turns it off): with
// tcConfigFor's one-wave shapes the faster loads pay for the memory (see
// docs/perf/tensor-core-products.md).
func tcTile(w *mlxc.Array) *mlxc.Array {
	N, K := w.Dim(0), w.Dim(1)
	t := mlxc.Reshape(w, N/8, 8, K/32, 4, 8)
	t = mlxc.Transpose(t, 0, 2, 1, 3, 4)
	return mlxc.Reshape(t, N/8, K/32, 32, 8)
}
