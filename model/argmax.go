package model

import (
	"github.com/dflash-mlx/dflash-mlx/kernels"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// RowArgmax holds two small GPU kernels (CUDA, or their Metal twins) for the end of a
// greedy DFlash cycle, which MLX's ops spread over a dozen launches:
//
//   - Of: each row's argmax over the vocabulary, of the logits or of T(logits − lse) (the
//     rounding of the log-probabilities that greedy decoding takes its argmax of), as int32,
//     and whether each draft equals its row's choice. MLX's ArgMax runs one block per row
//     whose loads wait on each other (21 µs for 16 rows of 151 936 on an H200, twice a
//     cycle); here each thread keeps four loads in flight (of 16 bytes on CUDA), and the
//     subtraction, the int32 cast and the comparison with the drafts come without launches
//     of their own.
//   - Leading: how many drafts are accepted in a row, and the token after them (the
//     verdict's Leading in one thread instead of six launches).
//
// Both give exactly the values of the ops they replace: the first index of the largest
// value (MLX's ArgMax), each value the T difference MLX's Subtract rounds to. nil (off a
// GPU with custom CUDA or Metal kernels, or with DFLASH_ARGMAX_KERNEL=0) means the ops.
type RowArgmax struct {
	rows, lead *mlxc.Kernel
	none       *mlxc.Array // the input a launch without lse or drafts passes in their place
}

// rowArgmaxThreads is the block size of Of: one block per row.
const rowArgmaxThreads = 1024

// NewRowArgmax makes the kernels (CUDA, else the Metal twins) on a GPU with custom kernels
// when k.ArgmaxKernel asks for them; nil otherwise.
func NewRowArgmax(k settings.Kernels) *RowArgmax {
	if !k.ArgmaxKernel || !k.Allowed(kernels.RowArgmax.Name) || !k.Allowed(kernels.RowLead.Name) {
		return nil
	}
	be, src, ok := twinBackend()
	if !ok {
		return nil
	}
	mk := func(x kernels.Kernel) *mlxc.Kernel {
		s := src(x)
		return mlxc.NewKernel(mlxc.KernelSpec{Backend: be, Name: x.Name, Inputs: x.Contract.Inputs, Outputs: x.Contract.Outputs,
			Source: s.Body, Header: s.Header, EnsureRowContiguous: true})
	}
	return &RowArgmax{
		rows: mk(kernels.RowArgmax),
		lead: mk(kernels.RowLead),
		none: OnDeviceConst(mlxc.FromSlice([]int32{0}, 1)),
	}
}

// Free releases the kernels.
func (a *RowArgmax) Free() {
	if a == nil {
		return
	}
	a.rows.Free()
	a.lead.Free()
	a.none.Free()
}

// Fits reports whether Of takes logits: [R, V] of bfloat16, float16 or float32 (false for
// a nil a).
func (a *RowArgmax) Fits(logits *mlxc.Array) bool {
	if a == nil || logits == nil || logits.Ndim() != 2 || logits.Dim(0) < 1 || logits.Dim(1) < 1 {
		return false
	}
	switch logits.Dtype() {
	case mlxc.BFloat16, mlxc.Float16, mlxc.Float32:
		return true
	}
	return false
}

// Of returns int32 [R]: each row's argmax of logits [R, V], or with lse [R, 1] (logits'
// type: mlxc.LogSumExp's) of T(logits − lse); and with drafts (int32 [n], n < R) bool [n],
// whether draft i equals row i's argmax (nil without drafts). Call Fits first.
func (a *RowArgmax) Of(logits, lse, drafts *mlxc.Array) (next, match *mlxc.Array) {
	R := logits.Dim(0)
	n := 1
	in := []*mlxc.Array{logits, a.none, a.none}
	if lse != nil {
		in[1] = lse
	}
	if drafts != nil {
		n = drafts.Dim(0)
		in[2] = drafts
	}
	out := a.rows.Call(in, mlxc.KernelCall{
		OutputShapes: [][]int{{R}, {n}},
		OutputDtypes: []mlxc.Dtype{mlxc.Int32, mlxc.Bool},
		Grid:         [3]int{R * rowArgmaxThreads, 1, 1},
		ThreadGroup:  [3]int{rowArgmaxThreads, 1, 1},
		Template: []mlxc.TemplateArg{{Name: "T", Value: logits.Dtype()},
			{Name: "SUB", Value: lse != nil}, {Name: "DRAFTS", Value: drafts != nil}},
	})
	if drafts == nil {
		return out[0], nil // out[1] unwritten; the scope frees it
	}
	return out[0], out[1]
}

// Leading returns int32 [1] arrays: how many of match's leading values are true, and
// next's element there (next: int32 [n+1], match: bool [n], Of's results).
func (a *RowArgmax) Leading(next, match *mlxc.Array) (accepted, tok *mlxc.Array) {
	out := a.lead.Call([]*mlxc.Array{next, match}, mlxc.KernelCall{
		OutputShapes: [][]int{{1}, {1}},
		OutputDtypes: []mlxc.Dtype{mlxc.Int32, mlxc.Int32},
		Grid:         [3]int{1, 1, 1},
		ThreadGroup:  [3]int{1, 1, 1},
	})
	return out[0], out[1]
}
