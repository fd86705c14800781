package model

import (
	"fmt"
	"math"
	"strings"

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

// padSource fills the four elements of a position array in device memory from element 0
// of a (Fused.OnDevice).
const padSource = `
  out[threadIdx.x] = a[0];
`

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

// headPrepHead picks one warp's (row, head) item: its source row, norm weight and output.
const headPrepHead = `
  constexpr int HT = HQ + 2 * HK;
  constexpr int P = D / 64; // rotation pairs per lane
  const int L = q_shape[0];
  const int lane = threadIdx.x & 31;
  const int item = blockIdx.x * WARPS + (threadIdx.x >> 5);
  const int row = item / HT;
  const int hh = item - row * HT;
  if (row >= L) return; // warp-uniform
  const T* src;
  const T* nw = nullptr;
  T* dst;
  if (hh < HQ) {
    src = q + (size_t)row * q_shape[1] + QO + hh * D;
    dst = qo + ((size_t)hh * L + row) * D;
    nw = qn;
  } else if (hh < HQ + HK) {
    const int h = hh - HQ;
    src = k + (size_t)row * k_shape[1] + KO + h * D;
    dst = ko + ((size_t)h * L + row) * D;
    nw = kn;
  } else {
    const int h = hh - HQ - HK;
    src = v + (size_t)row * v_shape[1] + VO + h * D;
    dst = vo + ((size_t)h * L + row) * D;
  }
  T* dst2 = nullptr; // headPrepRow's second destination: none here
`

// headPrepRow normalizes and rotates one warp's row of one head from src (nw null: copies
// it) into dst and, when set, dst2, at position off[0]+row. PrepAttention runs the same
// text for its rows, so both round alike.
const headPrepRow = `  float a[P], b[P];
#pragma unroll
  for (int p = 0; p < P; ++p) {
    a[p] = static_cast<float>(src[lane + 32 * p]);
    b[p] = static_cast<float>(src[lane + 32 * p + D / 2]);
  }
  if (nw == nullptr) {
#pragma unroll
    for (int p = 0; p < P; ++p) {
      dst[lane + 32 * p] = static_cast<T>(a[p]);
      dst[lane + 32 * p + D / 2] = static_cast<T>(b[p]);
      if (dst2 != nullptr) {
        dst2[lane + 32 * p] = static_cast<T>(a[p]);
        dst2[lane + 32 * p + D / 2] = static_cast<T>(b[p]);
      }
    }
    return;
  }
  float ss = 0.0f;
#pragma unroll
  for (int p = 0; p < P; ++p) ss += a[p] * a[p] + b[p] * b[p];
#pragma unroll
  for (int sh = 16; sh > 0; sh >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, sh);
  const float r = rsqrtf(ss / D + eps[0]);
  const float pos = static_cast<float>(off[0] + row);
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const int i = lane + 32 * p;
    const float na = static_cast<float>(static_cast<T>(a[p] * r * static_cast<float>(nw[i])));
    const float nb = static_cast<float>(static_cast<T>(b[p] * r * static_cast<float>(nw[i + D / 2])));
    float sn, cs;
    sincosf(pos * inv[i], &sn, &cs);
    const T ra = static_cast<T>(na * cs - nb * sn);
    const T rb = static_cast<T>(na * sn + nb * cs);
    dst[i] = ra;
    dst[i + D / 2] = rb;
    if (dst2 != nullptr) {
      dst2[i] = ra;
      dst2[i + D / 2] = rb;
    }
  }
`

// headPrepSource is the whole head-prep kernel body.
var headPrepSource = headPrepHead + headPrepRow

// headPrepIntoSource is headPrepSource for one merged q/k/v product y whose keys and values
// go straight into the KV cache's buffers ck / cv ([1, HK, R, D], row-contiguous) at cache
// row off[0]+row (rows past R are not written), in place: only q is an output. MLX knows
// nothing of that write, so a reader of the buffers must depend on this kernel through its
// q (the attention kernel takes it); a block's keys and values then need no dynamic slice
// update (two kernels per layer and a small offset array in unified memory), and no k and
// v outputs (each output is host time per launch: BenchmarkKernelOverhead's small_4out).
var headPrepIntoSource = replaceAll(headPrepSource,
	"  const int L = q_shape[0];\n", "  const int L = y_shape[0];\n",
	"    src = q + (size_t)row * q_shape[1] + QO + hh * D;\n", "    src = y + (size_t)row * y_shape[1] + QO + hh * D;\n",
	`    src = k + (size_t)row * k_shape[1] + KO + h * D;
    dst = ko + ((size_t)h * L + row) * D;
`, `    src = y + (size_t)row * y_shape[1] + KO + h * D;
    const int p = off[0] + row;
    if (p < 0 || p >= ck_shape[2]) return; // warp-uniform
    dst = const_cast<T*>(ck) + ((size_t)h * ck_shape[2] + p) * D;
`,
	`    src = v + (size_t)row * v_shape[1] + VO + h * D;
    dst = vo + ((size_t)h * L + row) * D;
`, `    src = y + (size_t)row * y_shape[1] + VO + h * D;
    const int p = off[0] + row;
    if (p < 0 || p >= cv_shape[2]) return; // warp-uniform
    dst = const_cast<T*>(cv) + ((size_t)h * cv_shape[2] + p) * D;
`)

// kvPrepIntoSource is headPrepIntoSource for a k|v product (HQ = 0; KVPrepInto), whose one
// output qo is a copy of qn [D]: MLX sees no data path in a kernel's writes into its
// inputs, so the kernels that read the rows written here take qo as their q norm weight.
var kvPrepIntoSource = `
  if (blockIdx.x == 0) {
    for (int i = threadIdx.x; i < D; i += blockDim.x) qo[i] = qn[i];
  }
` + headPrepIntoSource

// replaceAll applies old/new pairs to s in order, each exactly once: a kernel variant made
// from another's text fails at init if that text changed under it.
func replaceAll(s string, pairs ...string) string {
	for i := 0; i+1 < len(pairs); i += 2 {
		if strings.Count(s, pairs[i]) != 1 {
			panic(fmt.Sprintf("kernel variant: %q occurs %d times, want once", pairs[i], strings.Count(s, pairs[i])))
		}
		s = strings.Replace(s, pairs[i], pairs[i+1], 1)
	}
	return s
}

// gatedDevice is silu(g)·u as GatedAct computes it, rounding to T after the sigmoid, after
// g·sigmoid and after the product (the points where mlx-lm's ops round). Every kernel that
// computes the activation (GatedAct, the tensor-core product's GATED and ACT fusions)
// includes this one definition: their values must agree bit for bit.
const gatedDevice = `
template <typename T>
__device__ __forceinline__ T dflash_gated(float g, float u) {
  const float s = static_cast<float>(static_cast<T>(1.0f / (1.0f + expf(-g))));
  const float a = static_cast<float>(static_cast<T>(g * s));
  return static_cast<T>(a * u);
}
`

const gatedActSource = `
  const size_t n = (size_t)gu_shape[0] * I;
  for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
    const size_t row = e / I;
    const size_t c = e - row * I;
    y[e] = dflash_gated<T>(static_cast<float>(gu[row * 2 * I + c]), static_cast<float>(gu[row * 2 * I + I + c]));
  }
`

// NewFused returns the kernels for a model with the given rotary embedding and norm
// epsilon when k.Fused asks for them, custom CUDA kernels run here and the rotary
// embedding is the plain kind (base and scale, no YaRN frequencies or attention scaling);
// nil otherwise. k.FusePrepAttn adds the prep+attention kernel, k.FQAWarps sets its warps.
// MLX thread only.
func NewFused(r *Rope, headDim int, eps float32, k settings.Kernels) *Fused {
	if !k.Fused {
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
		prep: mlxc.NewKernel(mlxc.KernelSpec{Backend: mlxc.KernelCUDA, Name: "dflash_head_prep",
			Inputs: []string{"q", "k", "v", "qn", "kn", "inv", "eps", "off"}, Outputs: []string{"qo", "ko", "vo"},
			Source: headPrepSource, EnsureRowContiguous: true}),
		act: mlxc.NewKernel(mlxc.KernelSpec{Backend: mlxc.KernelCUDA, Name: "dflash_gated_act",
			Inputs: []string{"gu"}, Outputs: []string{"y"}, Source: gatedActSource, Header: gatedDevice, EnsureRowContiguous: true}),
		prepInto: mlxc.NewKernel(mlxc.KernelSpec{Backend: mlxc.KernelCUDA, Name: "dflash_head_prep_into",
			Inputs: []string{"y", "qn", "kn", "inv", "eps", "off", "ck", "cv"}, Outputs: []string{"qo"},
			Source: headPrepIntoSource, EnsureRowContiguous: false}),
		kvPrepInto: mlxc.NewKernel(mlxc.KernelSpec{Backend: mlxc.KernelCUDA, Name: "dflash_kv_prep_into",
			Inputs: []string{"y", "qn", "kn", "inv", "eps", "off", "ck", "cv"}, Outputs: []string{"qo"},
			Source: kvPrepIntoSource, EnsureRowContiguous: false}),
		inv:       OnDeviceConst(mlxc.FromSlice(inv, len(inv))),
		eps:       OnDeviceConst(mlxc.Scalar(float64(eps), mlxc.Float32)),
		half:      len(inv),
		prepAttn:  newPrepAttention(k.FusePrepAttn),
		attnWarps: k.FQAWarps,
		pad: mlxc.NewKernel(mlxc.KernelSpec{Backend: mlxc.KernelCUDA, Name: "dflash_pad_position",
			Inputs: []string{"a"}, Outputs: []string{"out"}, Source: padSource}),
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
// buffers ck, cv [1, hk, R, D] at rows pos..pos+L−1 (in place: see headPrepIntoSource; the
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
// qn [D] (kvPrepIntoSource): whatever reads those rows (the block's head prep and
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
