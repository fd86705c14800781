package model

import (
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// RowArgmax holds two small CUDA kernels for the end of a greedy DFlash cycle, which MLX's
// ops spread over a dozen launches:
//
//   - Of: each row's argmax over the vocabulary, of the logits or of T(logits − lse) (the
//     rounding of the log-probabilities that greedy decoding takes its argmax of), as int32,
//     and whether each draft equals its row's choice. MLX's ArgMax runs one block per row
//     whose loads wait on each other (21 µs for 16 rows of 151 936 on an H200, twice a
//     cycle); here each thread keeps four 16-byte loads in flight, and the subtraction, the
//     int32 cast and the comparison with the drafts come without launches of their own.
//   - Leading: how many drafts are accepted in a row, and the token after them (the
//     verdict's Leading in one thread instead of six launches).
//
// Both give exactly the values of the ops they replace: the first index of the largest
// value (MLX's ArgMax), each value the T difference MLX's Subtract rounds to. nil (off a
// CUDA GPU, or with DFLASH_ARGMAX_KERNEL=0) means the ops.
type RowArgmax struct {
	rows, lead *mlxc.Kernel
	none       *mlxc.Array // the input a launch without lse or drafts passes in their place
}

// rowArgmaxThreads is the block size of Of: one block per row.
const rowArgmaxThreads = 1024

// rowArgmaxSource: one block per row. Each thread scans its 16-byte chunks of the row in
// increasing order (four loads in flight), then the elements past the last whole chunk, and
// keeps the first index of its largest value; the block then picks the largest value and,
// among equals, the smallest index, which is the row's first maximum whatever the order
// the threads finished in. NaN counts as larger than every number (the first NaN wins) and
// a row of −inf gives index 0, as MLX's ArgMax does.
const rowArgmaxSource = `
  constexpr int NT = 1024;
  constexpr int E = 16 / sizeof(T);
  const int row = blockIdx.x;
  const int V = logits_shape[1];
  const T* p = logits + (size_t)row * V;
  T c = static_cast<T>(0.0f);
  if constexpr (SUB) c = static_cast<T>(static_cast<float>(lse[row])); // lse is T then (exact); the unread stand-in int32 otherwise
  float best = __int_as_float((int)0xff800000u); // −inf
  unsigned int bi = 0;
  // Whether (v, i) goes before (bv, bj): the larger value, NaN above every number (MLX's
  // ArgMax, numpy's), and among equals the smaller index.
  auto better = [](float v, unsigned int i, float bv, unsigned int bj) {
    const bool vn = v != v, bn = bv != bv;
    if (vn || bn) return vn && (!bn || i < bj);
    return v > bv || (v == bv && i < bj);
  };
  auto take = [&](float v, unsigned int i) {
    if (better(v, i, best, bi)) {
      best = v;
      bi = i;
    }
  };
  auto see = [&](T x, unsigned int i) {
    if constexpr (SUB) {
      take(static_cast<float>(static_cast<T>(x - c)), i);
    } else {
      take(static_cast<float>(x), i);
    }
  };
  // The warp's first maximum, in lane 0.
  auto warpBest = [&]() {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float v = __shfl_down_sync(0xffffffffu, best, o);
      const unsigned int i = __shfl_down_sync(0xffffffffu, bi, o);
      take(v, i);
    }
  };
  auto chunk = [&](const uint4& a, unsigned int j) {
    const T* e = reinterpret_cast<const T*>(&a);
#pragma unroll
    for (int k = 0; k < E; ++k) see(e[k], j * E + k);
  };
  const int nc = (reinterpret_cast<size_t>(p) & 15) == 0 ? V / E : 0; // whole aligned chunks
  const uint4* pc = reinterpret_cast<const uint4*>(p);
  int j = threadIdx.x;
  for (; j + 3 * NT < nc; j += 4 * NT) {
    uint4 a[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) a[u] = pc[j + u * NT];
#pragma unroll
    for (int u = 0; u < 4; ++u) chunk(a[u], j + u * NT);
  }
  for (; j < nc; j += NT) chunk(pc[j], j);
  for (int i = nc * E + threadIdx.x; i < V; i += NT) see(p[i], i);
  // The block's first maximum: per warp, then across warps.
  warpBest();
  __shared__ float wv[NT / 32];
  __shared__ unsigned int wi[NT / 32];
  const int lane = threadIdx.x & 31;
  const int wid = threadIdx.x >> 5;
  if (lane == 0) {
    wv[wid] = best;
    wi[wid] = bi;
  }
  __syncthreads();
  if (wid == 0) {
    best = wv[lane];
    bi = wi[lane];
    warpBest();
    if (lane == 0) {
      next[row] = static_cast<int32_t>(bi);
      if constexpr (DRAFTS) {
        if (row < drafts_shape[0]) match[row] = static_cast<int32_t>(bi) == drafts[row];
      }
    }
  }
`

// rowLeadSource: one thread. accepted = the number of leading true values of match,
// tok = next[accepted] (verify.Verdict.Leading's values).
const rowLeadSource = `
  int a = 0;
  while (a < match_shape[0] && match[a]) ++a;
  accepted[0] = a;
  tok[0] = next[a];
`

// NewRowArgmax makes the kernels on a CUDA GPU when k.ArgmaxKernel asks for them; nil
// otherwise.
func NewRowArgmax(k settings.Kernels) *RowArgmax {
	if !mlxc.CUDAKernelsAvailable() || !mlxc.CurrentDevice().GPU || !k.ArgmaxKernel {
		return nil
	}
	return &RowArgmax{
		rows: mlxc.NewKernel(mlxc.KernelSpec{Backend: mlxc.KernelCUDA, Name: "dflash_row_argmax",
			Inputs: []string{"logits", "lse", "drafts"}, Outputs: []string{"next", "match"},
			Source: rowArgmaxSource, EnsureRowContiguous: true}),
		lead: mlxc.NewKernel(mlxc.KernelSpec{Backend: mlxc.KernelCUDA, Name: "dflash_row_lead",
			Inputs: []string{"next", "match"}, Outputs: []string{"accepted", "tok"},
			Source: rowLeadSource, EnsureRowContiguous: true}),
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
