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
	// chunk order (kernels/cuda/tc_split_store.cuh). Split < 0 (tcSplitAuto) picks the
	// count per product in resolve. Register path only.
	Split int
	// Resid: the kernel
	// adds its input r [M, N] to the product as it writes y (the residual stream's add).
	// Act: w is a merged gate/up weight [2I, K] (gate rows first) and y is silu(gate)·up
	// [M, I], each block computing 4·Tiles gate columns and the same up columns (the MLP's
	// activation without a kernel of its own; even Tiles, no split, register path). Neither
	// changes the launch shape.
	Resid, Act bool
	// NormOut (split launches only): the launch also writes its output's RMSNorm, xn =
	// RMSNorm(y) with the norm weight xw and eps = EpsBits' float32, from the rows' scales
	// rsqrt(mean(y[m]²) + eps) (left in the scratch: scalesAt). The sums of squares run in a fixed order (each
	// tile's columns, then the tiles in order), so a row's norm does not depend on other
	// rows; each element is rounded as MLX's RMSNorm rounds it (kernels/cuda/tc_norm_out.cuh).
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
		{Name: "SPLIT", Value: max(c.Split, 1)}, {Name: "RESID", Value: c.Resid}, {Name: "ACT", Value: c.Act},
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
