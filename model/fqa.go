package model

import (
	"github.com/dflash-mlx/dflash-mlx/kernels"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// FewQueryAttention is attention for a block of 2..64 queries (a verify block, a draft) as
// one custom kernel, CUDA or its Metal twin (the default on a GPU; DFLASH_FQA=0 turns it
// off). On CUDA, MLX sends such blocks to cuDNN, whose call is captured into a child CUDA
// graph (host time on every layer of every cycle) and whose plan is built per key length;
// a custom kernel is one plain kernel node and has no per-shape plan. Each block of 4 warps handles one (head, query) pair; the warps split the
// keys in tiles of 32 with an online softmax and are merged in a fixed order. The output is
// written as [1, L, H, D], so rows need no transpose afterwards.
//
// With the tensor-core product kernel it cuts most of a verify's host encoding (see
// docs/perf/attention.md); TestFewQueryAttentionMatchesSDPA checks it against MLX's
// attention on a GPU. Its keys are read by every (head, query) block, so from
// settings.Kernels.SplitKeysFrom keys on (not in GPU-exact mode) blocks go to the
// split-key kernels instead: pass 1 spreads chunks of SplitChunk keys over the GPU, each
// chunk read once for all the queries of a kv head, and pass 2 merges each row's chunks in
// a fixed order (TestSplitKeysMatchesSDPA).
type FewQueryAttention struct {
	backend    mlxc.KernelBackend
	k          *mlxc.Kernel
	split      *mlxc.Kernel // pass 1 of the split-key attention
	splitMMA   *mlxc.Kernel // pass 1 on tensor cores (settings.Kernels.SplitKeysMMA), nil: split
	merge      *mlxc.Kernel // pass 2
	splitFrom  int          // key count from which blocks take the split kernels (0: never)
	minQueries int          // 2; 1 in GPU-exact mode, where decode steps use the kernel too
	warps      int          // per block (fqaWarps unless settings.Kernels.FQAWarps says otherwise)
	templates  templateCache[fqaKey]
	// The split-key kernels' arguments (the merge's by type and D: causal false).
	splitTemplates, splitMMATemplates, mergeTemplates templateCache[fqaKey]
}

type fqaKey struct {
	dt     mlxc.Dtype
	d      int
	causal bool
}

// fqaWarps is the attention kernels' warps per block (FewQueryAttention, PrepAttention);
// settings.Kernels.FQAWarps (2, 4, 8 or 16) sets another count for both, so that the two
// stay bit for bit alike.
const fqaWarps = 4

// NewFewQueryAttention returns the kernels (CUDA, else the Metal twins) when custom GPU
// kernels can run here (unless k.FQA is off without GPU-exact mode), nil otherwise (the
// model then uses MLX's attention).
// In GPU-exact mode one-token steps use it too: a query's result depends only on its own
// row and the number of keys it sees, so a verify row equals the decode step at its
// position bit for bit. MLX thread only.
func NewFewQueryAttention(k settings.Kernels, gpuExact bool) *FewQueryAttention {
	if !gpuExact && !k.FQA || !k.Allowed(kernels.FewQueryAttention.Name) {
		return nil
	}
	a := newFewQueryAttention()
	if a != nil {
		a.warps = k.FQAWarps
		a.splitFrom = k.SplitKeysFrom
		if !k.Allowed(kernels.SplitKeys.Name) || !k.Allowed(kernels.SplitKeysMerge.Name) {
			a.splitFrom = 0 // the self-check disabled them: every key count takes the few-query kernel
		}
		if k.SplitKeysMMA && k.Allowed(kernels.SplitKeysMMA.Name) {
			a.useSplitMMA()
		}
		if gpuExact {
			// A verify row and the decode step at its position must take the same kernel,
			// which a block straddling the threshold would not; and the split kernels at
			// every key count would slow short contexts (docs/perf/attention.md).
			a.minQueries, a.splitFrom = 1, 0
		}
	}
	return a
}

// useSplitMMA makes pass 1 of the split-key attention run on tensor cores, on CUDA
// (elsewhere nothing changes).
func (a *FewQueryAttention) useSplitMMA() {
	if a.backend != mlxc.KernelCUDA || a.splitMMA != nil {
		return
	}
	x := kernels.SplitKeysMMA
	a.splitMMA = mlxc.NewKernel(mlxc.KernelSpec{Backend: a.backend, Name: x.Name, Inputs: x.Contract.Inputs,
		Outputs: x.Contract.Outputs, Source: x.CUDA.Body, Header: x.CUDA.Header})
}

// RowConsistent reports whether the kernel also serves one-token steps (GPU-exact mode),
// which makes row-by-row verify attention unnecessary.
func (a *FewQueryAttention) RowConsistent() bool { return a != nil && a.minQueries == 1 }

func newFewQueryAttention() *FewQueryAttention {
	be, src, ok := twinBackend()
	if !ok {
		return nil
	}
	mk := func(x kernels.Kernel, rowContiguous bool) *mlxc.Kernel {
		s := src(x)
		return mlxc.NewKernel(mlxc.KernelSpec{Backend: be, Name: x.Name, Inputs: x.Contract.Inputs, Outputs: x.Contract.Outputs,
			Source: s.Body, Header: s.Header, EnsureRowContiguous: rowContiguous})
	}
	return &FewQueryAttention{backend: be, k: mk(kernels.FewQueryAttention, false), split: mk(kernels.SplitKeys, false),
		merge: mk(kernels.SplitKeysMerge, true), minQueries: 2, warps: fqaWarps}
}

// twinBackend picks the custom-kernel backend for kernels with a Metal twin of their CUDA
// source: CUDA where its kernels run on the current GPU, else Metal; ok is false off a GPU
// or where neither runs. src gives a kernel's source for the backend.
func twinBackend() (be mlxc.KernelBackend, src func(kernels.Kernel) kernels.Source, ok bool) {
	if !mlxc.CurrentDevice().GPU {
		return 0, nil, false
	}
	switch {
	case mlxc.CUDAKernelsAvailable():
		return mlxc.KernelCUDA, func(x kernels.Kernel) kernels.Source { return x.CUDA }, true
	case mlxc.MetalKernelsAvailable():
		return mlxc.KernelMetal, func(x kernels.Kernel) kernels.Source { return x.Metal }, true
	}
	return 0, nil, false
}

// scalars returns Apply's visible and scale as the kernels read them: element 0 of an
// array. Metal binds a 0-d input as a reference rather than a pointer, so there they go as
// 1-element views (a reshape, no copy); CUDA takes them as they are.
func (a *FewQueryAttention) scalars(visible, scale *mlxc.Array) (*mlxc.Array, *mlxc.Array) {
	if a.backend != mlxc.KernelMetal {
		return visible, scale
	}
	if visible.Ndim() == 0 {
		visible = mlxc.Reshape(visible, 1)
	}
	if scale.Ndim() == 0 {
		scale = mlxc.Reshape(scale, 1)
	}
	return visible, scale
}

// The split-key kernels' layout: keys per chunk, query rows a warp holds at a time, warps
// per block of pass 1 and of pass 2 (one row per warp).
const (
	SplitChunk     = 256
	splitRows      = 8
	splitWarps     = 4
	splitMergeRows = 4
)

// Splits reports whether a block whose queries see at most maxKeys keys takes the
// split-key kernels.
func (a *FewQueryAttention) Splits(maxKeys int) bool {
	return a != nil && a.split != nil && a.splitFrom > 0 && maxKeys >= a.splitFrom
}

// Fits reports whether q [1, H, L, D] over keys k [1, Hkv, n, D] can use the kernel:
// 2 ≤ L ≤ 64 (1 ≤ L in GPU-exact mode), D a multiple of 32 up to 256 (16-byte key loads), H a multiple of Hkv, bf16
// or f16 alike. Keys and values must have unit stride in D (views of a KV cache do).
func (a *FewQueryAttention) Fits(q, k *mlxc.Array) bool {
	if a == nil || a.k == nil || q.Ndim() != 4 || k.Ndim() != 4 || q.Dim(0) != 1 || k.Dim(0) != 1 {
		return false
	}
	H, L, D, Hkv := q.Dim(1), q.Dim(2), q.Dim(3), k.Dim(1)
	dt := q.Dtype()
	return L >= a.minQueries && L <= 64 && D%32 == 0 && D <= 256 && k.Dim(3) == D && Hkv > 0 && H%Hkv == 0 &&
		k.Dtype() == dt && (dt == mlxc.BFloat16 || dt == mlxc.Float16)
}

// ServesRows reports whether the kernel takes blocks of L queries (Fits's bounds on L):
// kernels that replace it (PrepAttention) keep to the same blocks.
func (a *FewQueryAttention) ServesRows(L int) bool {
	return a != nil && a.k != nil && L >= a.minQueries && L <= 64
}

// Apply returns attention as rows [L, H·D] (the layout of [1, L, H, D]: the o projection
// reads it as is, no reshape node). causal: query i sees keys [0, visible+i+1) —
// visible is then the position of the block's first row; otherwise every query sees keys
// [0, visible). visible is a 0-d int32 array (Visible; all layers of a forward share one)
// and scale a 0-d float32 array (the model's 1/√D). maxKeys bounds the keys any query
// sees (0: the buffers' rows), which picks the kernel (Splits) and the chunks.
func (a *FewQueryAttention) Apply(q, keys, values, scale, visible *mlxc.Array, causal bool, maxKeys int) *mlxc.Array {
	if maxKeys <= 0 || maxKeys > keys.Dim(2) {
		maxKeys = keys.Dim(2)
	}
	visible, scale = a.scalars(visible, scale)
	if a.Splits(maxKeys) {
		return a.applySplit(q, keys, values, scale, visible, causal, maxKeys)
	}
	H, L, D := q.Dim(1), q.Dim(2), q.Dim(3)
	return a.k.Call([]*mlxc.Array{q, keys, values, visible, scale}, mlxc.KernelCall{
		OutputShapes: [][]int{{L, H * D}},
		OutputDtypes: []mlxc.Dtype{q.Dtype()},
		Grid:         [3]int{H * L * a.warps * 32, 1, 1},
		ThreadGroup:  [3]int{a.warps * 32, 1, 1},
		Template: a.templates.get(fqaKey{q.Dtype(), D, causal}, func() []mlxc.TemplateArg {
			return fqaTemplate(q.Dtype(), D, a.warps, causal)
		}),
	})[0]
}

// applySplit is Apply through the split-key kernels, over ⌈maxKeys/SplitChunk⌉ chunks.
func (a *FewQueryAttention) applySplit(q, keys, values, scale, visible *mlxc.Array, causal bool, maxKeys int) *mlxc.Array {
	H, L, D, Hkv := q.Dim(1), q.Dim(2), q.Dim(3), keys.Dim(1)
	S := (maxKeys + SplitChunk - 1) / SplitChunk
	rows := H * L
	pass1, templates, template := a.split, &a.splitTemplates, splitKeysTemplate
	if a.splitMMA != nil {
		pass1, templates, template = a.splitMMA, &a.splitMMATemplates, splitKeysMMATemplate
	}
	parts := pass1.Call([]*mlxc.Array{q, keys, values, visible, scale}, mlxc.KernelCall{
		OutputShapes: [][]int{{rows, S, D}, {rows, S, 2}},
		OutputDtypes: []mlxc.Dtype{mlxc.Float32, mlxc.Float32},
		Grid:         [3]int{S * splitWarps * 32, Hkv, 1},
		ThreadGroup:  [3]int{splitWarps * 32, 1, 1},
		Template: templates.get(fqaKey{q.Dtype(), D, causal}, func() []mlxc.TemplateArg {
			return template(q.Dtype(), D, causal)
		}),
	})
	return a.merge.Call(parts, mlxc.KernelCall{
		OutputShapes: [][]int{{L, H * D}},
		OutputDtypes: []mlxc.Dtype{q.Dtype()},
		Grid:         [3]int{(rows + splitMergeRows - 1) / splitMergeRows * splitMergeRows * 32, 1, 1},
		ThreadGroup:  [3]int{splitMergeRows * 32, 1, 1},
		Template: a.mergeTemplates.get(fqaKey{q.Dtype(), D, false}, func() []mlxc.TemplateArg {
			return splitMergeTemplate(q.Dtype(), D)
		}),
	})[0]
}

// splitKeysTemplate and splitMergeTemplate are the split-key kernels' compile-time
// arguments (the offline compile check uses them too).
func splitKeysTemplate(dt mlxc.Dtype, D int, causal bool) []mlxc.TemplateArg {
	return []mlxc.TemplateArg{{Name: "T", Value: dt}, {Name: "D", Value: D}, {Name: "WARPS", Value: splitWarps},
		{Name: "ROWS", Value: splitRows}, {Name: "CHUNK", Value: SplitChunk}, {Name: "CAUSAL", Value: causal}}
}

func splitKeysMMATemplate(dt mlxc.Dtype, D int, causal bool) []mlxc.TemplateArg {
	return []mlxc.TemplateArg{{Name: "T", Value: dt}, {Name: "D", Value: D}, {Name: "WARPS", Value: splitWarps},
		{Name: "CHUNK", Value: SplitChunk}, {Name: "CAUSAL", Value: causal}}
}

func splitMergeTemplate(dt mlxc.Dtype, D int) []mlxc.TemplateArg {
	return []mlxc.TemplateArg{{Name: "T", Value: dt}, {Name: "D", Value: D}}
}

// fqaTemplate is the kernel's compile-time arguments (the offline compile check uses it too).
func fqaTemplate(dt mlxc.Dtype, D, warps int, causal bool) []mlxc.TemplateArg {
	return []mlxc.TemplateArg{{Name: "T", Value: dt}, {Name: "D", Value: D}, {Name: "WARPS", Value: warps},
		{Name: "CAUSAL", Value: causal}}
}

// Visible makes Apply's visible-keys argument.
func Visible(n int) *mlxc.Array { return mlxc.FromSlice([]int32{int32(n)}) }

// Free releases the kernel.
func (a *FewQueryAttention) Free() {
	if a != nil {
		a.k.Free()
		a.split.Free()
		a.splitMMA.Free()
		a.merge.Free()
	}
}
