// Package moe is the sparse mixture-of-experts MLP layer of the Qwen3-MoE and
// Qwen3.5-MoE / Qwen3-Next families: a softmax router, top-k experts run as a SwiGLU
// through MLX's gathered products, and an optional shared expert with a sigmoid gate.
// The op order and dtypes follow mlx-lm's Qwen3NextSparseMoeBlock / Qwen3MoeSparseMoeBlock
// and SwitchGLU.
//
// Where the expert products run:
//   - quantized experts: gather_qmm on every backend (MLX's CPU kernel takes bf16/f16/f32);
//   - dense float32 experts: gather_mm on every backend;
//   - dense bf16/f16 experts on a GPU: gather_mm in the weights' type, as mlx-lm does;
//   - dense bf16/f16 experts on the CPU: MLX's CPU gather_mm refuses anything but float32,
//     so inputs and weights are cast to float32 (exactly: every half value is a float32
//     value), multiplied with gather_mm and the product rounded back to the input type.
//     The GPU kernel also accumulates in float32 and rounds once, so the two paths differ
//     only in summation order. Each call casts the chosen experts' matrices only (or the
//     whole stack when a block routes to more pairs than there are experts).
package moe

import (
	"errors"
	"fmt"
	"slices"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
)

// SortThreshold is the number of (row, expert) pairs from which the products run on pairs
// sorted by expert (mlx-lm's SwitchGLU: indices.size ≥ 64).
const SortThreshold = 64

// Config is the block's shape and routing, from the family's config.json.
type Config struct {
	Hidden      int  // hidden_size H
	Experts     int  // num_experts E
	TopK        int  // num_experts_per_tok k
	Inter       int  // moe_intermediate_size of each routed expert
	SharedInter int  // shared_expert_intermediate_size; 0: no shared expert (Qwen3-MoE)
	NormTopK    bool // norm_topk_prob: renormalise the k chosen scores to sum to one
	// SwiGLU is the compiled activation to use (nil: the same ops uncompiled, same values).
	SwiGLU *model.SwiGLU
	// Gating joins the shared expert's output under its gate to the routed experts' (nil:
	// the same ops uncompiled, same values).
	Gating *model.SigmoidGating
}

// Experts is one stacked projection of all experts: W [E, out, in], dense or quantized.
type Experts struct {
	W  *mlxc.Array
	Q  *mlxc.Quantized
	wT *mlxc.Array // Wᵀ per expert as an evaluated view, made once by Prepare
}

// Block is one layer's sparse MoE MLP.
type Block struct {
	cfg              Config
	Router           *model.Linear // mlp.gate [E, H]
	Gate, Up, Down   *Experts      // mlp.switch_mlp.{gate,up,down}_proj
	SharedGate       *model.Linear // mlp.shared_expert.gate_proj (nil: no shared expert)
	SharedUp         *model.Linear
	SharedDown       *model.Linear
	SharedExpertGate *model.Linear // mlp.shared_expert_gate [1, H]
	// Rowwise runs a block of rows one row at a time, each through the graph of a
	// one-token step (the unsorted gathered products of k pairs), so that a verify block
	// rounds every row as decoding does on a GPU, where the sorted products and the
	// multi-row kernels round otherwise (GPU-exact mode).
	Rowwise bool
	// rows holds the index constants of decode and verify shapes (see rowIndex).
	rows rowIndex
	// reduce, when set, is the tensor-parallel split of the experts' width: apply's
	// result is this rank's partial sum until it is all-summed.
	reduce *model.Shard
}

// maxCachedRows is the largest row count whose index constants Prepare makes: decode
// steps and verify blocks of up to 16 rows (a prefill's row counts vary with the prompt,
// and its graph is not host-bound).
const maxCachedRows = 16

// rowIndex holds the index arrays the gathered products and the sort take for decode and
// verify shapes, as constants made once at Prepare: built in the graph they cost an
// arange, a reshape and a broadcast per product (three nodes of each expert product of a
// decode step, where the host's graph building is the step's cost). The products read the
// same indices either way; other shapes build them in the graph.
type rowIndex struct {
	byKey map[indexKey]*mlxc.Array
}

// indexKey names one index array: for N rows of k pairs, each pair's row (byPair false)
// or its own number (byPair true), shaped [N, k] or flat [N·k].
type indexKey struct {
	N, k         int
	byPair, flat bool
}

// prepare makes the constants Experts takes for 1..maxCachedRows rows of k pairs: [N, k]
// rows and pairs below SortThreshold pairs, flat ones from there on. MLX thread.
func (r *rowIndex) prepare(k int) {
	if r.byKey != nil {
		return
	}
	r.byKey = map[indexKey]*mlxc.Array{}
	for N := 1; N <= maxCachedRows; N++ {
		flat := N*k >= SortThreshold
		for _, byPair := range []bool{false, true} {
			key := indexKey{N: N, k: k, byPair: byPair, flat: flat}
			v := make([]uint32, N*k)
			for p := range v {
				v[p] = uint32(p)
				if !byPair {
					v[p] = uint32(p / k)
				}
			}
			// A copy made by a GPU op lives in device memory (an array made from host data
			// stays in unified memory there: docs/perf/device-memory.md).
			host := mlxc.FromSlice(v, key.shape()...)
			a := mlxc.Copy(host).Detach()
			mlxc.Eval(a)
			host.Free()
			r.byKey[key] = a
		}
	}
}

func (key indexKey) shape() []int {
	if key.flat {
		return []int{key.N * key.k}
	}
	return []int{key.N, key.k}
}

// get returns the uint32 array key names: element p (in row-major order) is p/k, or p.
func (r *rowIndex) get(key indexKey) *mlxc.Array {
	if a := r.byKey[key]; a != nil {
		return a
	}
	N, k := key.N, key.k
	if key.byPair {
		return mlxc.Reshape(mlxc.Arange(0, float64(N*k), 1, mlxc.Uint32), key.shape()...)
	}
	return mlxc.Reshape(mlxc.BroadcastTo(mlxc.Reshape(mlxc.Arange(0, float64(N), 1, mlxc.Uint32), N, 1), N, k), key.shape()...)
}

func (r *rowIndex) free() {
	for _, a := range r.byKey {
		a.Free()
	}
	r.byKey = nil
}

// New takes the block at prefix (e.g. "model.layers.3.mlp") out of w. The routed experts'
// stacks are checked and taken here (the Builder handles only 2-D modules); the router and
// the shared expert go through b, whose problems surface at b.Finish. An error from New
// names each bad tensor (for an expert-count mismatch, one error with both counts); on
// error nothing was taken. The expert stacks are adopted by b, which frees them with the
// rest if the build fails (b.Finish or b.Abandon).
func New(b *model.Builder, w *model.Weights, q *model.QuantConfig, prefix string, c Config) (*Block, error) {
	if c.Hidden <= 0 || c.Experts <= 0 || c.Inter <= 0 || c.SharedInter < 0 || c.TopK <= 0 || c.TopK > c.Experts {
		return nil, fmt.Errorf("%s: invalid MoE config (hidden %d, experts %d, top-k %d, moe intermediate %d, shared %d)",
			prefix, c.Hidden, c.Experts, c.TopK, c.Inter, c.SharedInter)
	}
	H, E, I := c.Hidden, c.Experts, c.Inter
	router := prefix + ".gate"
	sw := prefix + ".switch_mlp."
	specs := []struct {
		path    string
		out, in int
	}{{sw + "gate_proj", I, H}, {sw + "up_proj", I, H}, {sw + "down_proj", H, I}}

	// The expert count is checked first and reported once: a wrong num_experts makes every
	// expert tensor's shape wrong, and one message with both counts says why.
	for _, name := range []string{router + ".weight", specs[0].path + ".weight", specs[1].path + ".weight", specs[2].path + ".weight"} {
		info, ok := w.Info[name]
		if !ok || len(info.Shape) == 0 {
			continue
		}
		if info.Shape[0] != E {
			return nil, fmt.Errorf("tensor %s has %d experts but the config has num_experts %d", name, info.Shape[0], E)
		}
	}

	var errs []error
	bl := &Block{cfg: c}
	bl.Gate = takeExperts(w, q, specs[0].path, E, specs[0].out, specs[0].in, &errs)
	bl.Up = takeExperts(w, q, specs[1].path, E, specs[1].out, specs[1].in, &errs)
	bl.Down = takeExperts(w, q, specs[2].path, E, specs[2].out, specs[2].in, &errs)
	if len(errs) > 0 {
		bl.Free()
		return nil, errors.Join(errs...)
	}
	for _, e := range []*Experts{bl.Gate, bl.Up, bl.Down} {
		b.Adopt(e.arrays()...) // freed by the Builder if the build fails
	}
	if sh := b.Shard(); sh.Split() {
		if err := bl.split(b, sh, prefix); err != nil {
			return nil, err
		}
	}
	bl.Router = b.Linear(router, E, H, false)
	if c.SharedInter > 0 {
		se := prefix + ".shared_expert."
		bl.SharedGate = b.SplitOut(se+"gate_proj", c.SharedInter, H, false)
		bl.SharedUp = b.SplitOut(se+"up_proj", c.SharedInter, H, false)
		bl.SharedDown = b.SplitIn(se+"down_proj", H, c.SharedInter)
		// The block all-sums once, after the routed and the shared experts' partial sums
		// are weighted and added (the router and the shared expert's gate are whole on
		// every rank, so the weights are the same everywhere).
		bl.SharedDown.Reduce = nil
		bl.SharedExpertGate = b.Linear(prefix+".shared_expert_gate", 1, H, false)
	}
	return bl, nil
}

// split keeps this rank's part of every expert's intermediate width, as mlx-lm shards a
// MoE block: gate and up by output rows, down by input columns (whole quantization groups),
// so each rank computes a partial sum of every chosen expert, and apply all-sums the block.
// Every rank holds every expert; the routing is the same on all of them.
func (bl *Block) split(b *model.Builder, sh *model.Shard, prefix string) error {
	c := bl.cfg
	for _, p := range []struct {
		n    int
		what string
	}{{c.Inter, "expert MLP columns (moe_intermediate_size)"}, {c.SharedInter, "shared expert MLP columns"}} {
		if err := sh.Divides(p.n, p.what); err != nil {
			return fmt.Errorf("%s: %w", prefix, err)
		}
	}
	lo, hi := sh.Part(c.Inter)
	if q := bl.Down.Q; q != nil {
		if per := c.Inter / sh.Size; per%q.GroupSize != 0 || (per*q.Bits)%32 != 0 {
			return fmt.Errorf("%s: %d expert columns per rank are not whole %d-wide quantization groups (%d ranks)", prefix, per, q.GroupSize, sh.Size)
		}
	}
	for _, e := range []*Experts{bl.Gate, bl.Up} {
		e.W = b.KeepPart(e.W, 1, lo, hi)
		if e.Q != nil {
			e.Q.W, e.Q.Scales = b.KeepPart(e.Q.W, 1, lo, hi), b.KeepPart(e.Q.Scales, 1, lo, hi)
			e.Q.Biases = b.KeepPart(e.Q.Biases, 1, lo, hi)
		}
	}
	d := bl.Down
	if d.Q == nil {
		d.W = b.KeepPart(d.W, 2, lo, hi)
	} else {
		q := d.Q
		q.W = b.KeepPart(q.W, 2, lo*q.Bits/32, hi*q.Bits/32)
		q.Scales = b.KeepPart(q.Scales, 2, lo/q.GroupSize, hi/q.GroupSize)
		q.Biases = b.KeepPart(q.Biases, 2, lo/q.GroupSize, hi/q.GroupSize)
	}
	bl.reduce = sh
	return nil
}

// takeExperts checks and takes one stacked projection [E, out, in] (dense) or its packed
// weight/scales(/biases) (quantized per q's rule for path), appending problems to errs;
// on a problem it takes nothing.
func takeExperts(w *model.Weights, q *model.QuantConfig, path string, E, out, in int, errs *[]error) *Experts {
	wn := path + ".weight"
	info, ok := w.Info[wn]
	if !ok {
		*errs = append(*errs, fmt.Errorf("expert tensor %s is missing from the checkpoint", wn))
		return nil
	}
	n := len(*errs)
	bad := func(format string, args ...any) { *errs = append(*errs, fmt.Errorf(format, args...)) }
	qt := q.For(path, w.Has(path+".scales"))
	if qt == nil {
		if info.Dtype == mlxc.Uint32 {
			bad("tensor %s is packed (uint32) but there is no quantization for it (config.json \"quantization\" or %s.scales missing)", wn, path)
		} else if !info.Dtype.IsFloat() || info.Dtype == mlxc.Float64 {
			bad("tensor %s has dtype %s, want bfloat16, float16 or float32", wn, info.Dtype)
		}
		if want := []int{E, out, in}; !slices.Equal(info.Shape, want) {
			bad("tensor %s has shape %v, want %v", wn, info.Shape, want)
		}
		if w.Has(path + ".scales") {
			bad("tensor %s.scales exists but config.json has no \"quantization\" for it", path)
		}
		if len(*errs) > n {
			return nil
		}
		a, _ := w.Take(wn)
		return &Experts{W: a}
	}
	if in%qt.GroupSize != 0 || (in*qt.Bits)%32 != 0 {
		bad("%s: input size %d does not fit %d-bit groups of %d", path, in, qt.Bits, qt.GroupSize)
		return nil
	}
	if info.Dtype != mlxc.Uint32 {
		bad("quantized tensor %s has dtype %s, want uint32", wn, info.Dtype)
	}
	if want := []int{E, out, in * qt.Bits / 32}; !slices.Equal(info.Shape, want) {
		bad("tensor %s has shape %v, want %v (%d-bit, in=%d)", wn, info.Shape, want, qt.Bits, in)
	}
	sn, bn := path+".scales", path+".biases"
	si, ok := w.Info[sn]
	if !ok {
		bad("%s is quantized but tensor %s is missing", path, sn)
	} else if want := []int{E, out, in / qt.GroupSize}; !slices.Equal(si.Shape, want) {
		bad("tensor %s has shape %v, want %v (group size %d)", sn, si.Shape, want, qt.GroupSize)
	}
	affine := qt.Mode == "" || qt.Mode == "affine"
	if affine {
		bi, ok := w.Info[bn]
		if !ok {
			bad("%s is affine-quantized but tensor %s is missing", path, bn)
		} else if si.Shape != nil && !slices.Equal(bi.Shape, si.Shape) {
			bad("tensor %s has shape %v, want %v", bn, bi.Shape, si.Shape)
		}
	}
	if len(*errs) > n {
		return nil
	}
	res := &mlxc.Quantized{GroupSize: qt.GroupSize, Bits: qt.Bits, Mode: qt.Mode}
	res.W, _ = w.Take(wn)
	res.Scales, _ = w.Take(sn)
	if affine {
		res.Biases, _ = w.Take(bn)
	}
	return &Experts{Q: res}
}

// apply runs the selected experts' product for rows x [..., 1, in] and expert ids idx
// (mlx-lm's SwitchLinear: x·W[idx]ᵀ), pair i reading x's batch element lhs[i]; sorted
// tells MLX the ids are ascending.
func (e *Experts) apply(x, lhs, idx *mlxc.Array, sorted bool) *mlxc.Array {
	if e.Q != nil {
		return mlxc.GatherQMM(x, *e.Q, lhs, idx, true, sorted)
	}
	wT := e.wT
	if wT == nil {
		wT = mlxc.SwapAxes(e.W, -1, -2)
	}
	if dt := x.Dtype(); dt != mlxc.Float32 && !mlxc.CurrentDevice().GPU {
		// MLX's CPU gather_mm runs float32 only (see the package comment). Fewer pairs
		// than experts: only the chosen experts' matrices are cast, and the product runs
		// on that gathered stack with each pair pointing at its own copy, the same kernel
		// on the same values as over the whole cast stack.
		if pairs := idx.Size(); pairs < wT.Dim(0) {
			own := mlxc.Reshape(mlxc.Arange(0, float64(pairs), 1, mlxc.Uint32), idx.Shape()...)
			w := mlxc.AsType(mlxc.Take(wT, mlxc.Reshape(idx, pairs), 0), mlxc.Float32)
			return mlxc.AsType(mlxc.GatherMM(mlxc.AsType(x, mlxc.Float32), w, lhs, own, sorted), dt)
		}
		y := mlxc.GatherMM(mlxc.AsType(x, mlxc.Float32), mlxc.AsType(wT, mlxc.Float32), lhs, idx, sorted)
		return mlxc.AsType(y, dt)
	}
	return mlxc.GatherMM(x, wT, lhs, idx, sorted)
}

func (e *Experts) prepare() {
	if e != nil && e.W != nil && e.wT == nil {
		e.wT = mlxc.SwapAxes(e.W, -1, -2).Detach()
		mlxc.Eval(e.wT)
	}
}

func (e *Experts) arrays() []*mlxc.Array {
	switch {
	case e == nil:
		return nil
	case e.Q != nil:
		ws := []*mlxc.Array{e.Q.W, e.Q.Scales}
		if e.Q.Biases != nil {
			ws = append(ws, e.Q.Biases)
		}
		return ws
	default:
		return []*mlxc.Array{e.W}
	}
}

func (e *Experts) free() {
	if e != nil {
		e.wT.Free()
		e.W.Free()
		e.Q.Free()
	}
}

// Config returns the block's configuration.
func (b *Block) Config() Config { return b.cfg }

// Prepare makes the experts' transposed views once the weights are evaluated, and readies
// the 2-D layers (MLX thread only; nil: nothing).
func (b *Block) Prepare() {
	if b == nil {
		return
	}
	b.Gate.prepare()
	b.Up.prepare()
	b.Down.prepare()
	b.rows.prepare(b.cfg.TopK)
	for _, l := range []*model.Linear{b.Router, b.SharedGate, b.SharedUp, b.SharedDown, b.SharedExpertGate} {
		l.Prepare()
	}
}

// Arrays lists the block's weight arrays (for evaluation after loading).
func (b *Block) Arrays() []*mlxc.Array {
	if b == nil {
		return nil
	}
	var ws []*mlxc.Array
	for _, e := range []*Experts{b.Gate, b.Up, b.Down} {
		ws = append(ws, e.arrays()...)
	}
	for _, l := range []*model.Linear{b.Router, b.SharedGate, b.SharedUp, b.SharedDown, b.SharedExpertGate} {
		ws = append(ws, l.Arrays()...)
	}
	return ws
}

// Free releases every weight (safe on nil and twice).
func (b *Block) Free() {
	if b == nil {
		return
	}
	for _, e := range []*Experts{b.Gate, b.Up, b.Down} {
		e.free()
	}
	for _, l := range []*model.Linear{b.Router, b.SharedGate, b.SharedUp, b.SharedDown, b.SharedExpertGate} {
		l.Free()
	}
	b.rows.free()
	b.Gate, b.Up, b.Down, b.Router = nil, nil, nil, nil
	b.SharedGate, b.SharedUp, b.SharedDown, b.SharedExpertGate = nil, nil, nil, nil
}

// Route returns the router's chosen experts inds [N, k] (uint32, in argpartition's order,
// which is unspecified but the same as mlx-lm's on the same backend) and their scores
// [N, k] in x's type: softmax in float32 returned in x's type, then optionally divided by
// their sum.
func (b *Block) Route(x *mlxc.Array) (inds, scores *mlxc.Array) {
	E, k := b.cfg.Experts, b.cfg.TopK
	gates := mlxc.Softmax(b.Router.Apply(x), []int{-1}, true)
	inds = mlxc.SliceAxis(mlxc.Argpartition(gates, E-k, -1), -1, E-k, E)
	scores = mlxc.TakeAlongAxis(gates, inds, -1)
	if b.cfg.NormTopK {
		scores = mlxc.Divide(scores, mlxc.Sum(scores, []int{-1}, true))
	}
	return inds, scores
}

// UseSkinny gives the router and the shared expert's products the model's few-row
// product (GPU-exact mode makes it run them row by row; nil: MLX's).
func (b *Block) UseSkinny(s *model.SkinnyGEMM) {
	if b == nil {
		return
	}
	for _, l := range []*model.Linear{b.Router, b.SharedGate, b.SharedUp, b.SharedDown, b.SharedExpertGate} {
		l.UseSkinny(s)
	}
}

// UseQMM gives the router and the shared expert's quantized products the model's small-M
// quantized product kernel (nil: MLX's).
func (b *Block) UseQMM(op *model.SmallMQuantMatmul) {
	if b == nil {
		return
	}
	for _, l := range []*model.Linear{b.Router, b.SharedGate, b.SharedUp, b.SharedDown, b.SharedExpertGate} {
		l.UseQMM(op)
	}
}

// Apply runs the block on rows x [N, H] and returns [N, H] in x's type.
func (b *Block) Apply(x *mlxc.Array) *mlxc.Array {
	if N := x.Dim(0); b.Rowwise && N > 1 {
		rows := make([]*mlxc.Array, N)
		for i := range rows {
			rows[i] = b.apply(mlxc.SliceAxis(x, 0, i, i+1))
		}
		return mlxc.Concatenate(rows, 0)
	}
	return b.apply(x)
}

func (b *Block) apply(x *mlxc.Array) *mlxc.Array {
	return b.reduce.AllSum(b.partial(x))
}

// partial is the block's output for rows x, or this rank's partial sum of it when the
// experts' width is split.
func (b *Block) partial(x *mlxc.Array) *mlxc.Array {
	inds, scores := b.Route(x)
	y := b.Experts(x, inds)                                                       // [N, k, H]
	y = mlxc.Sum(mlxc.Multiply(y, mlxc.ExpandDims(scores, -1)), []int{-2}, false) // over k in inds' order
	if b.SharedGate == nil {
		return y
	}
	sh := b.SharedDown.Apply(b.cfg.SwiGLU.Apply(b.SharedGate.Apply(x), b.SharedUp.Apply(x)))
	return b.cfg.Gating.Join(y, b.SharedExpertGate.Apply(x), sh)
}

// Experts runs the routed SwiGLU experts (mlx-lm's SwitchGLU) for rows x [N, H] and
// expert ids inds [N, k], returning each pair's output [N, k, H] unweighted. From
// SortThreshold pairs on, the pairs are sorted by expert before the products (so each
// expert's weights are read in one run) and put back after; each pair's math is the same.
func (b *Block) Experts(x, inds *mlxc.Array) *mlxc.Array {
	N, H, k := x.Dim(0), x.Dim(1), inds.Dim(1)
	if N*k < SortThreshold {
		xe := mlxc.Reshape(x, N, 1, 1, H)
		// x's batch is [N, 1] for the gate and up products and [N, k] for the down product.
		lhsIn, lhsDown := b.rows.get(indexKey{N: N, k: k}), b.rows.get(indexKey{N: N, k: k, byPair: true})
		y := b.glu(xe, lhsIn, lhsDown, inds, false) // [N, k, 1, H]
		return mlxc.Reshape(y, N, k, H)
	}
	flat := mlxc.Reshape(inds, N*k)
	order := mlxc.Argsort(flat, 0)
	inv := mlxc.Argsort(order, 0)
	rowOf := b.rows.get(indexKey{N: N, k: k, flat: true})                    // rowOf[p] = p / k, the row of pair p
	xs := mlxc.Take(mlxc.Reshape(x, N, 1, H), mlxc.Take(rowOf, order, 0), 0) // [N·k, 1, H]
	pairs := b.rows.get(indexKey{N: N, k: k, byPair: true, flat: true})      // x's batch is [N·k] for all three
	y := b.glu(xs, pairs, pairs, mlxc.Take(flat, order, 0), true)            // [N·k, 1, H]
	return mlxc.Reshape(mlxc.Take(y, inv, 0), N, k, H)
}

// glu is down(silu(gate(x))·up(x)) through the selected experts idx. Pair i of the gate
// and up products reads x's batch element lhsIn[i], of the down product the activation's
// lhsDown[i]: the indices MLX's gathered products would build from their inputs' batch
// shapes.
func (b *Block) glu(x, lhsIn, lhsDown, idx *mlxc.Array, sorted bool) *mlxc.Array {
	up := b.Up.apply(x, lhsIn, idx, sorted)
	gate := b.Gate.apply(x, lhsIn, idx, sorted)
	return b.Down.apply(b.cfg.SwiGLU.Apply(gate, up), lhsDown, idx, sorted)
}
