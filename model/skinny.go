package model

import (
	"fmt"
	"math"

	"github.com/dflash-mlx/dflash-mlx/kernels"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// SkinnyGEMM computes y = x·Wᵀ for blocks of 2..16 rows (a verify block, a draft) with one
// custom CUDA kernel instead of cuBLAS. MLX's CUDA backend captures every cuBLAS call into
// a child CUDA graph, which costs host time on every product of every cycle. The
// tensor-core kernel (skinny_tc.go) is one plain kernel node per product and reads the
// weights faster than cuBLAS does for 16 rows (an earlier CUDA-core kernel ran out of FMA
// throughput and was removed; see docs/perf/tensor-core-products.md). Each output element
// is reduced in a fixed order that does not depend on the number of rows.
type SkinnyGEMM struct {
	k         *mlxc.Kernel
	split     *mlxc.Kernel // the tensor-core kernel with K split over blocks (tcConfig.Split)
	splitNorm *mlxc.Kernel // split, also writing its output's RMSNorm (tcConfig.NormOut)
	noDep     *mlxc.Array  // a split launch's ordering input when its weight has none yet (TCState.prev)
	minRows   int          // 2; 1 in GPU-exact mode, where decode steps use the same kernel
	// tiled: weights go through a copy in the tensor-core layout (tcTile; on by default on
	// CUDA, DFLASH_TC_TILED=0 turns it off), made per weight at its first launch while the
	// copies fit in tileBudget bytes of device memory with what MLX holds (mayTile; 0: no
	// bound, DFLASH_TC_TILED=1). tileBytes counts the copies made.
	tiled                 bool
	tileBudget, tileBytes uint64
	// configFor picks the tensor-core launch (tcConfigFor unless DFLASH_TC_RULE says
	// otherwise, see tcrule.go), its split resolved.
	configFor func(N, K int) tcConfig
	// fuse: the tensor-core kernel also serves ApplyFused with the residual add on its
	// output; DFLASH_FUSE_PRODUCTS=0 turns it off.
	fuse bool
	// fuseAct: the gate/up product applies the activation as it writes (ApplyAct;
	// DFLASH_FUSE_ACT=0 or DFLASH_FUSE_PRODUCTS=0 turns it off).
	fuseAct bool
	// fuseNorm (on; DFLASH_FUSE_NORM=0 turns it off): the o and down projections (split
	// launches) also write the RMSNorm of their output (ApplyAddNorm): no RMSNorm node, two
	// per layer. The tiles' last blocks wait for each other to sum the rows' squares, then
	// each normalizes its own columns (kernels/cuda/tc_norm_out.cuh). The sum of squares
	// runs in another order than MLX's RMSNorm, so a row may differ from MLX's norm by a
	// rounding (TestNormFusion).
	// The norm is made by the producer because every consumer block normalizing its whole
	// K range of the rows (tried in two forms) made the consumers slower than the norm
	// kernels they saved (see docs/perf/product-fusions.md).
	fuseNorm bool
	// sms is the GPU's multiprocessor count, which bounds the blocks of a NormOut launch
	// that may wait for each other (normOutFits).
	sms int
	// lastNorm is the last NormOut launch's y (a second handle, see applyTC): every NormOut
	// launch takes the previous one's as an unread input, so that no two of them, whatever
	// their weights, ever run at once, each with its tiles' last blocks waiting
	// (normOutFits bounds one launch's waiters, not two launches').
	lastNorm *mlxc.Array
	// templates caches tcConfig.template per launch and type.
	templates templateCache[tcTemplateKey]
}

type tcTemplateKey struct {
	c  tcConfig
	dt mlxc.Dtype
}

// NewSkinnyGEMM returns the few-row product kernel when custom CUDA kernels can run here
// and k.SkinnyGEMM asks for it, nil otherwise (Linear then uses MLX's matmul); gpuExact
// (settings.Loop.GPUExact: GPU-exact mode, below) also sends one-row products through it. k.TCRule
// sets the tensor-core launch shapes (tcrule.go; an unreadable value is an error, so that
// a comparison never runs the wrong shapes) and k.TCTiled the weights' layout (Auto: tiled
// copies within the memory budget). MLX thread only.
func NewSkinnyGEMM(k settings.Kernels, gpuExact bool) (*SkinnyGEMM, error) {
	rule, err := parseTCRule(k.TCRule)
	if err != nil {
		return nil, fmt.Errorf("DFLASH_TC_RULE: %w", err)
	}
	var s *SkinnyGEMM
	switch {
	case !k.Allowed(kernels.SkinnyGEMMTC.Name) || !k.Allowed(kernels.SkinnyGEMMTCSplit.Name) || !k.Allowed(kernels.SkinnyGEMMTCSplitNorm.Name):
	case gpuExact:
		// One-token steps through the same kernel as verify blocks: every row of every
		// product is then reduced the same way (GPU-exact mode, below).
		if s = newSkinnyGEMM(); s != nil {
			s.minRows = 1
		}
	case !k.SkinnyGEMM:
	default:
		s = newSkinnyGEMM()
	}
	if s != nil {
		s.configFor = rule
		switch k.TCTiled {
		case settings.Off:
		case settings.On:
			s.tiled = true
		default:
			s.tileBudget = uint64(float64(deviceTotalMemory()) * tcTileMemoryShare)
			s.tiled = s.tileBudget > 0
		}
		s.fuse = k.FuseProducts
		s.fuseAct = s.fuse && k.FuseAct
		s.fuseNorm = s.fuse && k.FuseNorm
	}
	return s, nil
}

// GPU-exact mode (settings.Loop.GPUExact, the --gpu-exact option of run, bench and serve):
// on a GPU, make a verify block compute every row exactly as a one-token decode step does, so DFlash output equals plain decoding bit
// for bit there too (on the CPU backend it already does). Products of 1..16 rows go through
// the tensor-core few-row kernel, whose per-row result does not depend on the row count,
// and attention of every step through the few-query kernel, whose rows do not depend on
// each other either. It costs plain decoding speed (one-row products leave MLX's gemv),
// not DFlash's (see docs/perf/gpu-exact.md). Quantized products of a block go one row at
// a time (quantizedProduct): a node per row, so quantized verify blocks are slow in this
// mode.

// newSkinnyGEMM makes the tensor-core kernels on a CUDA GPU (nil elsewhere).
func newSkinnyGEMM() *SkinnyGEMM {
	if !mlxc.CUDAKernelsAvailable() || !mlxc.CurrentDevice().GPU {
		return nil
	}
	spec := mlxc.KernelSpec{
		Backend: mlxc.KernelCUDA, Name: kernels.SkinnyGEMMTC.Name,
		Inputs: []string{"x", "w", "r"}, Outputs: []string{"y"},
		Source: kernels.SkinnyGEMMTC.CUDA.Body, Header: kernels.SkinnyGEMMTC.CUDA.Header, EnsureRowContiguous: true,
	}
	split := spec
	split.Name, split.Source, split.Header = kernels.SkinnyGEMMTCSplit.Name, kernels.SkinnyGEMMTCSplit.CUDA.Body, kernels.SkinnyGEMMTCSplit.CUDA.Header
	split.Inputs, split.Outputs = []string{"x", "w", "cnt", "dep", "r", "ws"}, []string{"y"}
	splitNorm := split
	splitNorm.Name, splitNorm.Source, splitNorm.Header = kernels.SkinnyGEMMTCSplitNorm.Name, kernels.SkinnyGEMMTCSplitNorm.CUDA.Body, kernels.SkinnyGEMMTCSplitNorm.CUDA.Header
	splitNorm.Inputs = []string{"x", "w", "cnt", "dep", "r", "ws", "xw", "ndep"}
	splitNorm.Outputs = []string{"y", "xn"}
	noDep := mlxc.Zeros([]int{4}, mlxc.Float32).Detach()
	mlxc.Eval(noDep)
	return &SkinnyGEMM{k: mlxc.NewKernel(spec), split: mlxc.NewKernel(split), splitNorm: mlxc.NewKernel(splitNorm),
		noDep: noDep, minRows: 2, configFor: tcConfigFor, fuse: true, fuseAct: true, fuseNorm: true,
		sms: mlxc.CUDAMultiprocessors()}
}

// TCState is what one weight keeps for the tensor-core kernel between calls: its copy in
// the kernel's layout (SkinnyGEMM.tiled), the per-tile counts and the float scratch (ws:
// partials, sums of squares, scales) of the split launch, and the last split launch's y
// (prev). Counts and scratch are inputs the kernel writes, not outputs: each output costs
// host time on every launch (an allocation, a dependency, a handle), two per o and down
// projection with the norm. Two split launches must not share them at the same time (see
// kernels/cuda/tc_split_store.cuh), and MLX's CUDA graphs run kernels that no data path
// links concurrently —
// the drafter applies one projection to its context rows and to its block in one graph —
// so each split launch takes the previous launch's y of the same weight as an (unread)
// input: an edge that orders them. Zero value: nothing made yet.
type TCState struct {
	tiled, counts, ws, prev *mlxc.Array
	wsLen                   int  // ws's length in floats
	untiled                 bool // the tiled copy did not fit (SkinnyGEMM.mayTile): row-major
}

// Free releases what the state holds.
func (st *TCState) Free() {
	st.tiled.Free()
	st.counts.Free()
	st.ws.Free()
	st.prev.Free()
	st.tiled, st.counts, st.ws, st.prev, st.wsLen, st.untiled = nil, nil, nil, nil, 0, false
}

// scales reads the rows' scales of the last NormOut launch on this weight with launch c
// (scalesAt) once it has run: the test of the norm fusion checks them.
func (st *TCState) scales(c tcConfig, N, M int) []float32 {
	at := c.scalesAt(N)
	return mlxc.SliceAxis(st.ws, 0, at, at+M).Float32s()
}

// Fits reports whether x [M, K] · w [N, K]ᵀ can use the kernel: 2 ≤ M ≤ 16 (1 ≤ M in
// GPU-exact mode), both bf16 or both f16, K a multiple of 32 and N of 16 (whole tiles;
// true of every Qwen3 projection and vocabulary).
func (s *SkinnyGEMM) Fits(x, w *mlxc.Array) bool {
	if s == nil || s.k == nil || x.Ndim() != 2 || w.Ndim() != 2 {
		return false
	}
	M, K, N := x.Dim(0), x.Dim(1), w.Dim(0)
	dt := x.Dtype()
	if !s.configFor(N, K).fits(N, K) {
		return false
	}
	return M >= s.minRows && M <= 16 && K%8 == 0 && w.Dim(1) == K && w.Dtype() == dt &&
		(dt == mlxc.BFloat16 || dt == mlxc.Float16)
}

// FitsFused reports whether ApplyFused serves x and w: the tensor-core kernel with fusion
// on, x [M, K], and r (when not nil) [M, N] of x's type.
func (s *SkinnyGEMM) FitsFused(x, w, r *mlxc.Array) bool {
	if s == nil || !s.fuse || x.Ndim() != 2 || w.Ndim() != 2 {
		return false
	}
	if r != nil && (r.Ndim() != 2 || r.Dim(0) != x.Dim(0) || r.Dim(1) != w.Dim(0) || r.Dtype() != x.Dtype()) {
		return false
	}
	return s.Fits(x, w)
}

// FitsNormOut reports whether ApplyAddNorm serves x·wᵀ with the residual r and the norm
// weight nw: ApplyFused's kernel with the norm fusion on, a launch that splits K (only a
// split launch has last blocks that see every column) into few enough column tiles for
// this GPU (normOutFits), and nw [N] of x's type.
func (s *SkinnyGEMM) FitsNormOut(x, w, r, nw *mlxc.Array) bool {
	if !s.FitsFused(x, w, r) || !s.fuseNorm || r == nil || nw == nil {
		return false
	}
	if nw.Ndim() != 1 || nw.Dim(0) != w.Dim(0) || nw.Dtype() != x.Dtype() {
		return false
	}
	c := s.configFor(w.Dim(0), w.Dim(1))
	return c.Split > 1 && c.Stages == 0 && normOutFits(w.Dim(0)/(8*c.Tiles), c.Warps, s.sms)
}

// normOutFits reports whether a NormOut launch of tiles column tiles and blocks of warps
// warps is safe on a GPU of sms multiprocessors. Each tile's last block waits until every
// tile has a last block (kernels/cuda/tc_norm_out.cuh), so up to tiles−1 blocks sit on their SMs waiting,
// and the launch could never finish if they took every block slot while blocks remained
// to run. At 255 registers a thread (the most a kernel may use) a warp takes 8 K of an
// SM's 64 K registers, so an SM holds at least 8/warps blocks (1 at least, or the kernel
// could not launch at all); the launch is safe when its waiters are fewer than those
// slots over all SMs. The 4B shape's o projection (160 tiles of 4-warp blocks) and down
// projection (80) fit an H200's 132 SMs.
func normOutFits(tiles, warps, sms int) bool {
	return sms > 0 && warps > 0 && tiles-1 < sms*max(1, 8/warps)
}

// ApplyAddNorm returns h = r + x·wᵀ (ApplyFused's values) and xn = RMSNorm(h) with weight
// nw and eps from one kernel (call FitsNormOut first; the rows' scales stay in st).
func (s *SkinnyGEMM) ApplyAddNorm(x, w, r, nw *mlxc.Array, eps float32, st *TCState) (h, xn *mlxc.Array) {
	out := s.launchTC(x, w, tcFusion{r: r, normW: nw, eps: eps}, s.configFor(w.Dim(0), w.Dim(1)), w.Dim(0), st)
	return out[0], out[1]
}

// FitsAct reports whether ApplyAct serves rows x and a merged gate/up weight w [2I, K]: the
// fused tensor-core kernel, whose launch for w has an even tile count, no split over K and
// the register path, and I a whole number of its blocks' gate columns.
func (s *SkinnyGEMM) FitsAct(x, w *mlxc.Array) bool {
	if s == nil || !s.fuseAct || w.Ndim() != 2 || !s.Fits(x, w) {
		return false
	}
	N := w.Dim(0)
	c := s.configFor(N, w.Dim(1))
	return c.Tiles%2 == 0 && c.Split <= 1 && c.Stages == 0 && N%2 == 0 && (N/2)%(4*c.Tiles) == 0
}

// ApplyAct returns silu(gate)·up [M, I] of x·wᵀ for a merged gate/up weight w [2I, K] (gate
// rows first) in one kernel (call FitsAct first): the values GatedAct gives for the
// product, bit for bit, without the product's output or the activation's kernel.
func (s *SkinnyGEMM) ApplyAct(x, w *mlxc.Array, st *TCState) *mlxc.Array {
	N := w.Dim(0)
	c := s.configFor(N, w.Dim(1))
	c.Act = true
	return s.launchTC(x, w, tcFusion{}, c, N, st)[0]
}

// ApplyFused returns [r +] x·wᵀ [M, N] in one kernel (call FitsFused first). Bit for bit
// what the separate nodes give: the product is rounded to the element type before r is
// added, as MLX's Add of the product would.
func (s *SkinnyGEMM) ApplyFused(x, w, r *mlxc.Array, st *TCState) *mlxc.Array {
	return s.tcApply(x, w, r, st)
}

// Apply returns x·wᵀ (call Fits first). A split launch then makes its counts in
// the call's graph (a fill node more than ApplyOwned's).
func (s *SkinnyGEMM) Apply(x, w *mlxc.Array) *mlxc.Array { return s.ApplyOwned(x, w, nil) }

// ApplyOwned is Apply for a weight whose owner keeps a TCState for it: the tensor-core
// layout where SkinnyGEMM.tiled makes one (made in the first call's graph, detached: the owner frees
// it), and the split launch's counts (zeros, made the same way).
func (s *SkinnyGEMM) ApplyOwned(x, w *mlxc.Array, st *TCState) *mlxc.Array {
	return s.tcApply(x, w, nil, st)
}

// tcApply is the tensor-core product with the weight's launch shape and the fusions asked
// for (r nil: no residual), through st's tiled copy where there is one.
func (s *SkinnyGEMM) tcApply(x, w, r *mlxc.Array, st *TCState) *mlxc.Array {
	return s.launchTC(x, w, tcFusion{r: r}, s.configFor(w.Dim(0), w.Dim(1)), w.Dim(0), st)[0]
}

// tcFusion is what a launch computes besides x·wᵀ: the residual r added (nil: none), and
// y's RMSNorm with weight normW (nil: none) and eps.
type tcFusion struct {
	r     *mlxc.Array
	normW *mlxc.Array
	eps   float32
}

// tcTileMemoryShare is the share of the device's memory that MLX's arrays and the tiled
// copies may fill together before further weights stay row-major (a copy's bytes equal its
// weight's: ≈ 8 GB more for the 4B shape, whose products and vocabulary head all go through
// the kernel).
const tcTileMemoryShare = 0.75

// mayTile reports whether w's tiled copy may be made, and counts it: always without a
// budget (DFLASH_TC_TILED=1), else while MLX's active memory, the copies promised so far (a
// first forward makes them all in one graph, before any is allocated; once allocated they
// count twice, which errs towards fewer copies) and this one stay within the budget. The
// layout changes no result, so weights that stay row-major only cost speed.
func (s *SkinnyGEMM) mayTile(w *mlxc.Array) bool {
	n := uint64(w.NBytes())
	if s.tileBudget > 0 && mlxc.ActiveMemory()+s.tileBytes+n > s.tileBudget {
		return false
	}
	s.tileBytes += n
	return true
}

// launchTC is the tensor-core product of rows x and an N-row weight w with launch shape c
// and the fusions f, through st's tiled copy where there is one (register path). It
// returns applyTC's outputs: y first.
func (s *SkinnyGEMM) launchTC(x, w *mlxc.Array, f tcFusion, c tcConfig, N int, st *TCState) []*mlxc.Array {
	c.Resid, c.NormOut = f.r != nil, f.normW != nil
	if c.NormOut {
		c.EpsBits = int(math.Float32bits(f.eps))
	}
	if s.tiled && st != nil && c.Stages == 0 {
		if st.tiled == nil && !st.untiled {
			if s.mayTile(w) {
				st.tiled = tcTile(w).Detach()
			} else {
				st.untiled = true
			}
		}
		if st.tiled != nil {
			c.Tiled = true
			w = st.tiled
		}
	}
	return s.applyTC(x, w, f, c, N, st)
}

// applyTC launches the tensor-core kernel with an explicit configuration for an N-row
// weight (row-major [N, K], or tcTile's layout when c.Tiled); a split launch takes its
// counts and scratch from st (nil: made for this call only). Without a residual the kernel
// gets an unread placeholder. Outputs: y, then with c.NormOut y's norm.
func (s *SkinnyGEMM) applyTC(x, w *mlxc.Array, f tcFusion, c tcConfig, N int, st *TCState) []*mlxc.Array {
	r := f.r
	if r == nil {
		r = s.noDep
	}
	M := x.Dim(0)
	tiles := N / (8 * c.Tiles)
	cols := N
	if c.Act {
		cols = N / 2
	}
	call := mlxc.KernelCall{
		OutputShapes: [][]int{{M, cols}},
		OutputDtypes: []mlxc.Dtype{x.Dtype()},
		Grid:         [3]int{tiles * max(c.Split, 1) * c.Warps * 32, 1, 1},
		ThreadGroup:  [3]int{c.Warps * 32, 1, 1},
		Template:     s.templates.get(tcTemplateKey{c, x.Dtype()}, func() []mlxc.TemplateArg { return c.template(x.Dtype()) }),
	}
	if c.Split <= 1 {
		return s.k.Call([]*mlxc.Array{x, w, r}, call)
	}
	if st == nil {
		st = &TCState{}
		defer st.Free() // the graph keeps the counts and scratch for the call
	}
	if st.counts == nil {
		// One count per n8 tile: enough for any launch shape (a rule may change between
		// calls: TestTCInModelSweep); then NormOut's barrier, a 64-bit word at the next
		// even index.
		st.counts = mlxc.Zeros([]int{N/8 + 4}, mlxc.Int32).Detach()
	}
	if n := c.scratchLen(N); n > st.wsLen {
		// A launch reads only its own part: a larger rule's scratch serves smaller ones.
		st.ws.Free()
		st.ws, st.wsLen = mlxc.Zeros([]int{n}, mlxc.Float32).Detach(), n
	}
	k := s.split
	if c.NormOut {
		k = s.splitNorm
		call.OutputShapes = append(call.OutputShapes, []int{M, N})
		call.OutputDtypes = append(call.OutputDtypes, x.Dtype())
	}
	// The ordering inputs are unread; before the first launch x stands in (an input
	// already, of the type later ones have: one kernel signature).
	dep := st.prev
	if dep == nil {
		dep = x
	}
	in := []*mlxc.Array{x, w, st.counts, dep, r, st.ws}
	if c.NormOut {
		nd := s.lastNorm
		if nd == nil {
			nd = x
		}
		in = append(in, f.normW, nd)
	}
	out := k.Call(in, call)
	if c.NormOut {
		s.lastNorm.Free()
		s.lastNorm = out[0].Ref() // the caller owns out[0]; these handles are ours
	}
	st.prev.Free()
	st.prev = out[0].Ref()
	return out
}

// Free releases the kernel.
func (s *SkinnyGEMM) Free() {
	if s != nil {
		s.k.Free()
		s.split.Free()
		s.splitNorm.Free()
		s.lastNorm.Free()
		s.noDep.Free()
	}
}
