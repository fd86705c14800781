package model

import (
	"github.com/dflash-mlx/dflash-mlx/kernels"
	"math"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// Fused holds two custom CUDA kernels that replace chains of small MLX ops in every layer
// (the default on CUDA; DFLASH_FUSED=0 turns them off): on CUDA each graph node costs the host 3–5 µs to build and encode
// whatever its size, and a 4B model's step is ~900 of them, so node count, not device
// time, sets the speed of a decode step and of a verify block.
//
//   - HeadPrep turns the q/k/v projections (three, or one merged product) into attention
//     inputs: per-head RMSNorm of q and k, rotary embedding at the rows' positions, and the
//     head-major layout [1, heads, L, D] for q, k and v. It replaces 3 reshapes, 2 norms, 2
//     RoPEs and, for blocks, 3 transposes.
//   - GatedAct is silu(gate)·up over one merged gate/up product (no slices, one node).
//
// They compute in float32 and round to the model's type after the norm, after the rotation,
// and after each step of the activation, like MLX's ops, but not necessarily bit for bit
// like them: a fused model is consistent with itself (decode steps and verify blocks use
// the same kernels, row by row), which is what DFlash needs, and close to MLX's result
// (TestFusedMatchesOps on a GPU).
type Fused struct {
	prep, act *mlxc.Kernel
	inv, eps  *mlxc.Array // rotary inverse frequencies (× rope scale), RMSNorm epsilon (OnDevice)
	half      int         // inv's meaningful length: head dimension / 2
	// prepInto is HeadPrep that writes the block's keys and values into a KV cache's
	// buffers at a device position instead of returning them (HeadPrepInto).
	prepInto *mlxc.Kernel
	// kvPrepInto is KVPrep writing the keys and values into a KV cache's buffers in place
	// (KVPrepInto: the drafter's context rows).
	kvPrepInto    *mlxc.Kernel
	prepTemplates templateCache[prepKey]
	// prepAttn is HeadPrepInto and the attention in one kernel (PrepAttention;
	// settings.Kernels.FusePrepAttn), nil when off.
	prepAttn      *mlxc.Kernel
	attnTemplates templateCache[prepAttnKey]
	attnWarps     int // prepAttn's warps per block: FewQueryAttention's (settings.Kernels.FQAWarps)
	// pad is OnDevice's copy of a position in one launch (Fused.OnDevice).
	pad *mlxc.Kernel
}

// OnDevice is the package's OnDevice for an int32 position (one element): the same four
// copies of it in device memory, made by one kernel launch where OnDevice's Concatenate
// launches a copy kernel per element. A cycle makes three such positions (the target's, the
// drafter's block and its context rows): twelve launches of ≈ 3 µs, plus the gaps between
// them, become three. Anything else, and a nil f, goes to OnDevice.
func (f *Fused) OnDevice(a *mlxc.Array) *mlxc.Array {
	if f == nil || a == nil || a.Size() != 1 || a.Dtype() != mlxc.Int32 {
		return OnDevice(a)
	}
	return f.pad.Call([]*mlxc.Array{a}, mlxc.KernelCall{OutputShapes: [][]int{{4}}, OutputDtypes: []mlxc.Dtype{mlxc.Int32},
		Grid: [3]int{4, 1, 1}, ThreadGroup: [3]int{4, 1, 1}})[0]
}

type prepKey struct {
	dt                    mlxc.Dtype
	d, hq, hk, qo, ko, vo int
}

// prepTemplate is headPrepTemplate, made once per shape.
func (f *Fused) prepTemplate(dt mlxc.Dtype, D, hq, hk, qo, ko, vo int) []mlxc.TemplateArg {
	return f.prepTemplates.get(prepKey{dt, D, hq, hk, qo, ko, vo}, func() []mlxc.TemplateArg {
		return headPrepTemplate(dt, D, hq, hk, qo, ko, vo)
	})
}

const fusedWarps = 4

// NewFused returns the kernels for a model with the given rotary embedding and norm
// epsilon when k.Fused asks for them, custom CUDA kernels run here and the rotary
// embedding is the plain kind (base and scale, no YaRN frequencies or attention scaling);
// nil otherwise. k.FusePrepAttn adds the prep+attention kernel, k.FQAWarps sets its warps.
// MLX thread only.
func NewFused(r *Rope, headDim int, eps float32, k settings.Kernels) *Fused {
	if !k.Fused || !k.Allowed(kernels.HeadPrep.Name) || !k.Allowed(kernels.GatedAct.Name) {
		return nil
	}
	return newFusedFor(r, headDim, eps, k)
}

// newFused makes the kernels with the default settings (tests).
func newFused(r *Rope, headDim int, eps float32) *Fused {
	return newFusedFor(r, headDim, eps, settings.Default().Kernels)
}

func newFusedFor(r *Rope, headDim int, eps float32, k settings.Kernels) *Fused {
	if !mlxc.CUDAKernelsAvailable() || !mlxc.CurrentDevice().GPU || r == nil || r.freqs != nil ||
		r.MScale != 1 || r.Dims != headDim || headDim%64 != 0 {
		return nil
	}
	inv := make([]float32, headDim/2)
	for i := range inv {
		inv[i] = float32(float64(r.Scale) * math.Pow(float64(r.Base), -2*float64(i)/float64(headDim)))
	}
	f := &Fused{
		prep: mlxc.NewKernel(mlxc.KernelSpec{Backend: mlxc.KernelCUDA, Name: kernels.HeadPrep.Name,
			Inputs: []string{"q", "k", "v", "qn", "kn", "inv", "eps", "off"}, Outputs: []string{"qo", "ko", "vo"},
			Source: kernels.HeadPrep.CUDA.Body, EnsureRowContiguous: true}),
		act: mlxc.NewKernel(mlxc.KernelSpec{Backend: mlxc.KernelCUDA, Name: kernels.GatedAct.Name,
			Inputs: []string{"gu"}, Outputs: []string{"y"}, Source: kernels.GatedAct.CUDA.Body, Header: kernels.GatedAct.CUDA.Header, EnsureRowContiguous: true}),
		prepInto: mlxc.NewKernel(mlxc.KernelSpec{Backend: mlxc.KernelCUDA, Name: kernels.HeadPrepInto.Name,
			Inputs: []string{"y", "qn", "kn", "inv", "eps", "off", "ck", "cv"}, Outputs: []string{"qo"},
			Source: kernels.HeadPrepInto.CUDA.Body, EnsureRowContiguous: false}),
		kvPrepInto: mlxc.NewKernel(mlxc.KernelSpec{Backend: mlxc.KernelCUDA, Name: kernels.KVPrepInto.Name,
			Inputs: []string{"y", "qn", "kn", "inv", "eps", "off", "ck", "cv"}, Outputs: []string{"qo"},
			Source: kernels.KVPrepInto.CUDA.Body, EnsureRowContiguous: false}),
		inv:       OnDeviceConst(mlxc.FromSlice(inv, len(inv))),
		eps:       OnDeviceConst(mlxc.Scalar(float64(eps), mlxc.Float32)),
		half:      len(inv),
		prepAttn:  newPrepAttention(k.FusePrepAttn),
		attnWarps: k.FQAWarps,
		pad: mlxc.NewKernel(mlxc.KernelSpec{Backend: mlxc.KernelCUDA, Name: kernels.PadPosition.Name,
			Inputs: []string{"a"}, Outputs: []string{"out"}, Source: kernels.PadPosition.CUDA.Body}),
	}
	return f
}

// HeadPrep returns q [1, hq, L, D], k and v [1, hk, L, D] from projected rows: q, k, v are
// [L, *] with the heads starting at columns qo, ko, vo (pass one merged product three times
// with its offsets, or three products with 0). qn, kn are the per-head norm weights [D];
// pos is an int32 array with the position of row 0 in element 0 (OnDevice(Visible(…))).
func (f *Fused) HeadPrep(q, k, v *mlxc.Array, qo, ko, vo, hq, hk, D int, qn, kn, pos *mlxc.Array) (*mlxc.Array, *mlxc.Array, *mlxc.Array) {
	return f.launchPrep([]*mlxc.Array{q, k, v, qn, kn, f.inv, f.eps, pos}, qo, ko, vo, hq, hk, D)
}

// prepGrid is a head-prep kernel's grid (in threads) for items (row, head) pairs: one warp
// each, in blocks of fusedWarps.
func prepGrid(items int) [3]int {
	return [3]int{(items + fusedWarps - 1) / fusedWarps * fusedWarps * 32, 1, 1}
}

// launchPrep launches the head-prep kernel: one warp per (row, head).
func (f *Fused) launchPrep(inputs []*mlxc.Array, qo, ko, vo, hq, hk, D int) (*mlxc.Array, *mlxc.Array, *mlxc.Array) {
	L := inputs[0].Dim(0)
	dt := inputs[0].Dtype()
	items := L * (hq + 2*hk)
	qs := []int{1, hq, L, D}
	if hq == 0 {
		qs = []int{1, 1, 1, D} // a placeholder (MLX outputs are not empty): never written
	}
	out := f.prep.Call(inputs, mlxc.KernelCall{
		OutputShapes: [][]int{qs, {1, hk, L, D}, {1, hk, L, D}},
		OutputDtypes: []mlxc.Dtype{dt, dt, dt},
		Grid:         prepGrid(items),
		ThreadGroup:  [3]int{fusedWarps * 32, 1, 1},
		Template:     f.prepTemplate(dt, D, hq, hk, qo, ko, vo),
	})
	return out[0], out[1], out[2]
}

// headPrepTemplate and gatedActTemplate are the kernels' compile-time arguments (the
// offline compile check uses them too).
func headPrepTemplate(dt mlxc.Dtype, D, hq, hk, qo, ko, vo int) []mlxc.TemplateArg {
	return []mlxc.TemplateArg{{Name: "T", Value: dt}, {Name: "D", Value: D}, {Name: "HQ", Value: hq},
		{Name: "HK", Value: hk}, {Name: "QO", Value: qo}, {Name: "KO", Value: ko}, {Name: "VO", Value: vo},
		{Name: "WARPS", Value: fusedWarps}}
}

func gatedActTemplate(dt mlxc.Dtype, I int) []mlxc.TemplateArg {
	return []mlxc.TemplateArg{{Name: "T", Value: dt}, {Name: "I", Value: I}}
}

// HeadPrepInto is HeadPrepMerged that writes the block's keys and values into the KV cache
// buffers ck, cv [1, hk, R, D] at rows pos..pos+L−1 (in place: see kernels.HeadPrepInto; the
// buffers must be row-contiguous, as KVCache.Window's are) and returns only q. pos must be
// OnDevice's. MLX orders readers of ck, cv after this write only through q: the attention
// that reads the cache must take it.
func (f *Fused) HeadPrepInto(y *mlxc.Array, hq, hk, D int, qn, kn, pos, ck, cv *mlxc.Array) *mlxc.Array {
	L := y.Dim(0)
	dt := y.Dtype()
	items := L * (hq + 2*hk)
	return f.prepInto.Call([]*mlxc.Array{y, qn, kn, f.inv, f.eps, pos, ck, cv}, mlxc.KernelCall{
		OutputShapes: [][]int{{1, hq, L, D}},
		OutputDtypes: []mlxc.Dtype{dt},
		Grid:         prepGrid(items),
		ThreadGroup:  [3]int{fusedWarps * 32, 1, 1},
		Template:     f.prepTemplate(dt, D, hq, hk, 0, hq*D, (hq+hk)*D),
	})[0]
}

// HeadPrepMerged is HeadPrep for one merged q/k/v product y [L, (hq+2·hk)·D]: q heads,
// then k, then v.
func (f *Fused) HeadPrepMerged(y *mlxc.Array, hq, hk, D int, qn, kn, pos *mlxc.Array) (*mlxc.Array, *mlxc.Array, *mlxc.Array) {
	return f.HeadPrep(y, y, y, 0, hq*D, (hq+hk)*D, hq, hk, D, qn, kn, pos)
}

// KVPrep returns keys (per-head norm kn, rotation from position pos, as HeadPrep) and values
// [1, hk, T, D] of rows kv [T, 2·hk·D], a k|v product (keys first): the drafter's context
// rows in one kernel instead of six nodes of MLX ops (the head-prep kernel with no q heads).
func (f *Fused) KVPrep(kv *mlxc.Array, hk, D int, kn, pos *mlxc.Array) (*mlxc.Array, *mlxc.Array) {
	_, k, v := f.launchPrep([]*mlxc.Array{kv, kv, kv, kn, kn, f.inv, f.eps, pos}, 0, 0, hk*D, 0, hk, D)
	return k, v
}

// KVPrepInto is KVPrep writing the keys and values of rows kv [T, 2·hk·D] (keys first; a
// row-contiguous array such as a product's output: the kernel takes no strides) into the
// KV cache buffers ck, cv [1, hk, R, D] at rows pos..pos+T−1 in place (as
// HeadPrepInto; pos must be OnDevice's) instead of returning them, and returns a copy of
// qn [D] (kernels.KVPrepInto): whatever reads those rows (the block's head prep and
// attention) must take that copy as its q norm weight, which orders it after this write.
// The drafter's context rows: one node with one output per layer instead of a kernel with
// three outputs and two SliceUpdates.
func (f *Fused) KVPrepInto(kv *mlxc.Array, hk, D int, qn, kn, pos, ck, cv *mlxc.Array) *mlxc.Array {
	items := kv.Dim(0) * 2 * hk
	return f.kvPrepInto.Call([]*mlxc.Array{kv, qn, kn, f.inv, f.eps, pos, ck, cv}, mlxc.KernelCall{
		OutputShapes: [][]int{{D}},
		OutputDtypes: []mlxc.Dtype{qn.Dtype()},
		Grid:         prepGrid(items),
		ThreadGroup:  [3]int{fusedWarps * 32, 1, 1},
		Template:     f.prepTemplate(kv.Dtype(), D, 0, hk, 0, 0, hk*D),
	})[0]
}

// PrepFits reports whether HeadPrep takes rows x [R, H] (whose projections it gets: same
// type) with head size D and per-head norm weights qn, kn: the kernel reads the norm
// weights as the rows' type, so they must match (a checkpoint may keep norms in float32).
func (f *Fused) PrepFits(x *mlxc.Array, D int, qn, kn *mlxc.Array) bool {
	if f == nil || x.Ndim() != 2 {
		return false
	}
	dt := x.Dtype()
	return D%64 == 0 && f.half == D/2 && qn.Dtype() == dt && kn.Dtype() == dt &&
		(dt == mlxc.BFloat16 || dt == mlxc.Float16)
}

// GatedAct returns silu(gate)·up [R, I] for one merged product gu [R, 2I] (gate first).
func (f *Fused) GatedAct(gu *mlxc.Array) *mlxc.Array {
	R, I := gu.Dim(0), gu.Dim(1)/2
	n := R * I
	blocks := min((n+255)/256, 4096)
	return f.act.Call([]*mlxc.Array{gu}, mlxc.KernelCall{
		OutputShapes: [][]int{{R, I}},
		OutputDtypes: []mlxc.Dtype{gu.Dtype()},
		Grid:         [3]int{blocks * 256, 1, 1},
		ThreadGroup:  [3]int{256, 1, 1},
		Template:     gatedActTemplate(gu.Dtype(), I),
	})[0]
}

// Free releases the kernels and their constants.
func (f *Fused) Free() {
	if f != nil {
		f.prep.Free()
		f.act.Free()
		f.inv.Free()
		f.eps.Free()
		f.prepInto.Free()
		f.kvPrepInto.Free()
		f.prepAttn.Free()
		f.pad.Free()
	}
}
