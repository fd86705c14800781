package qwen35_test

import (
	"path/filepath"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/internal/testenv"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
)

// logitsOf runs blocks through cache c (LogitsAll, or opt(i) for block i) and returns
// every row's logits as float32, rows in order.
func logitsOf(m model.Model, c model.Cache, blocks [][]int32, opt func(i int) model.ForwardOptions) [][]float32 {
	var rows [][]float32
	for i, b := range blocks {
		s := mlxc.NewScope()
		o := model.ForwardOptions{Logits: model.LogitsAll}
		if opt != nil {
			o = opt(i)
		}
		out := m.Forward(mlxc.FromSlice(b, 1, len(b)), c, o)
		lg := mlxc.AsType(out.Logits, mlxc.Float32)
		mlxc.Eval(append(c.Arrays(), lg)...)
		flat := lg.Float32s()
		V := len(flat) / lg.Dim(1)
		for r := 0; r < lg.Dim(1); r++ {
			rows = append(rows, flat[r*V:(r+1)*V])
		}
		s.Close()
	}
	return rows
}

// tol is the largest logit difference accepted between two block shapes of one
// computation: none on the CPU, a few bf16 steps of the logits on a GPU.
func tol() float64 {
	if testenv.GPU() {
		return 0.125
	}
	return 0
}

func split(p []int32, sizes ...int) [][]int32 {
	var out [][]int32
	for _, n := range sizes {
		out = append(out, p[:n])
		p = p[n:]
	}
	return out
}

// Decoding incrementally (a prefill chunk, then one token at a time, and a multi-token
// block in the middle) gives the logits of one forward over the whole sequence: bit for
// bit on the CPU, where every op computes a row the same way whatever the block's size;
// on a GPU, where kernels are picked by shape, within tol.
func TestIncrementalMatchesFullForward(t *testing.T) {
	for _, layout := range []modelgen.Qwen35Layout{modelgen.Qwen35MLX, modelgen.Qwen35HF} {
		spec := modelgen.TinyQwen35()
		spec.Layout, spec.Tied = layout, layout == modelgen.Qwen35MLX
		dir := filepath.Join(t.TempDir(), "m")
		writeModel(t, dir, spec)
		m := loadModel(t, dir)
		err := mlxc.Do(func() error {
			full := logitsOf(m, m.NewCache(), [][]int32{prompt}, nil)
			sizes := []int{7, 1, 1, 4, 1, 1, 1, 1, 1, 1, 1}
			c := m.NewCache()
			defer c.Free()
			inc := logitsOf(m, c, split(prompt, sizes...), func(i int) model.ForwardOptions {
				return model.ForwardOptions{Logits: model.LogitsAll}
			})
			if c.Offset() != len(prompt) {
				t.Errorf("cache offset %d after %d tokens", c.Offset(), len(prompt))
			}
			worst := 0.0
			for r := range full {
				d, at := maxAbsDiff(inc[r], full[r])
				if d > tol() {
					t.Errorf("layout %d row %d: incremental logits differ from the full forward by %g at %d", layout, r, d, at)
				}
				worst = max(worst, d)
			}
			t.Logf("layout %d: incremental vs full forward: max |Δ| = %g", layout, worst)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// The same spec written in the raw HF layout and the mlx-community layout is one model
// after sanitize: the logits are identical.
func TestLayoutsLoadAlike(t *testing.T) {
	spec := modelgen.TinyQwen35()
	spec.Tied = false
	var got [2][][]float32
	for i, layout := range []modelgen.Qwen35Layout{modelgen.Qwen35HF, modelgen.Qwen35MLX} {
		spec.Layout = layout
		dir := filepath.Join(t.TempDir(), "m")
		writeModel(t, dir, spec)
		m := loadModel(t, dir)
		if err := mlxc.Do(func() error {
			got[i] = logitsOf(m, m.NewCache(), [][]int32{prompt}, nil)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	for r := range got[0] {
		if d, at := maxAbsDiff(got[0][r], got[1][r]); d != 0 {
			t.Fatalf("row %d: HF and mlx-community layouts differ by %g at %d", r, d, at)
		}
	}
}

// A speculative block of which a prefix is kept leaves the cache as if only that prefix
// had been run; a block placed at a device position (the run-ahead loop) computes the
// rows a plain forward does and, once its offset is set, decodes on the same way.
func TestSpeculateAndRunAhead(t *testing.T) {
	spec := modelgen.TinyQwen35()
	dir := filepath.Join(t.TempDir(), "m")
	writeModel(t, dir, spec)
	m := loadModel(t, dir)
	err := mlxc.Do(func() error {
		head, block, next := prompt[:10], prompt[10:14], prompt[12:13]
		// Baseline: head, then the first two block tokens, then the token after them.
		base := m.NewCache()
		defer base.Free()
		logitsOf(m, base, [][]int32{head, block[:2]}, nil)
		want := logitsOf(m, base, [][]int32{next}, nil)[0]

		c := m.NewCache()
		defer c.Free()
		logitsOf(m, c, [][]int32{head}, nil)
		c.Speculate()
		logitsOf(m, c, [][]int32{block}, nil)
		if err := c.Commit(cache.Prefix(2)); err != nil {
			t.Fatalf("commit: %v", err)
		}
		if c.Offset() != 12 {
			t.Errorf("offset %d after keeping 2 of 4 speculative rows on 10, want 12", c.Offset())
		}
		got := logitsOf(m, c, [][]int32{next}, nil)[0]
		if d, at := maxAbsDiff(got, want); d != 0 {
			t.Errorf("after speculate/commit the next logits differ by %g at %d", d, at)
		}

		ra := m.NewCache()
		defer ra.Free()
		logitsOf(m, ra, [][]int32{head}, nil)
		placed := ra.RunAhead()
		if placed == nil {
			t.Fatal("the cache has no run-ahead capability")
		}
		plain := m.NewCache()
		defer plain.Free()
		logitsOf(m, plain, [][]int32{head}, nil)
		wantBlock := logitsOf(m, plain, [][]int32{block}, nil)
		gotBlock := logitsOf(m, ra, [][]int32{block}, func(int) model.ForwardOptions {
			return model.ForwardOptions{Logits: model.LogitsAll, Pos: model.Visible(len(head)), Window: 64}
		})
		for r := range wantBlock {
			if d, at := maxAbsDiff(gotBlock[r], wantBlock[r]); d > tol() {
				t.Errorf("placed block row %d differs from a plain forward by %g at %d", r, d, at)
			}
		}
		if err := placed.SetOffset(12); err != nil {
			t.Fatalf("set offset: %v", err)
		}
		if ra.Offset() != 12 {
			t.Errorf("offset %d after SetOffset(12)", ra.Offset())
		}
		got = logitsOf(m, ra, [][]int32{next}, nil)[0]
		if d, at := maxAbsDiff(got, want); d > tol() {
			t.Errorf("after a placed block and SetOffset the next logits differ by %g at %d", d, at)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A verify block attended with padded keys (KeyBucket) or row by row (RowwiseAttention)
// computes the rows of a plain block: bit for bit on the CPU, within tol on a GPU.
func TestAttentionPathsAgree(t *testing.T) {
	spec := modelgen.TinyQwen35()
	dir := filepath.Join(t.TempDir(), "m")
	writeModel(t, dir, spec)
	m := loadModel(t, dir)
	err := mlxc.Do(func() error {
		head, block := prompt[:10], prompt[10:15]
		run := func(o model.ForwardOptions) [][]float32 {
			c := m.NewCache()
			defer c.Free()
			logitsOf(m, c, [][]int32{head}, nil)
			return logitsOf(m, c, [][]int32{block}, func(int) model.ForwardOptions { return o })
		}
		want := run(model.ForwardOptions{Logits: model.LogitsAll})
		for name, o := range map[string]model.ForwardOptions{
			"padded keys": {Logits: model.LogitsAll, KeyBucket: 16},
			"rowwise":     {Logits: model.LogitsAll, RowwiseAttention: true},
		} {
			got := run(o)
			worst := 0.0
			for r := range want {
				d, _ := maxAbsDiff(got[r], want[r])
				worst = max(worst, d)
			}
			if worst > tol() {
				t.Errorf("%s: rows differ from the plain block by %g", name, worst)
			}
			t.Logf("%s: max |Δ| = %g", name, worst)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A decode step's graph on the CPU: each GatedDeltaNet layer's four input projections are
// one product (two with out_proj), an attention layer's q/k/v one and an MLP's gate/up one, and its gates, activations and scales are compiled
// functions, not chains of ops (no softplus node left: it lives inside the compiled gates);
// in a quantized model too.
func TestDecodeStepGraph(t *testing.T) {
	if testenv.GPU() {
		t.Skip("counts the CPU's graph: on a GPU products go to the kernels")
	}
	for _, quant := range []bool{false, true} {
		spec := modelgen.TinyQwen35()
		if quant {
			spec.QuantBits, spec.QuantGroup = 4, 32
		}
		dir := filepath.Join(t.TempDir(), "m")
		writeModel(t, dir, spec)
		m := loadModel(t, dir)
		linear := 0
		for i := 0; i < spec.Layers; i++ {
			if modelgen.Qwen35IsLinear(i, spec.Interval) {
				linear++
			}
		}
		attention := spec.Layers - linear
		// Per linear layer: in (merged) and out; per attention layer q/k/v (merged), o and
		// the CPU attention's two matmuls (scores, then values); every layer's MLP gate/up
		// (merged) and down; and the tied head.
		want := linear*2 + attention*(2+2) + spec.Layers*2 + 1
		err := mlxc.Do(func() error {
			c := m.NewCache()
			defer c.Free()
			logitsOf(m, c, [][]int32{prompt[:5]}, nil)
			s := mlxc.NewScope()
			defer s.Close()
			out := m.Forward(mlxc.FromSlice(prompt[5:6], 1, 1), c, model.ForwardOptions{Logits: model.LogitsLast})
			ops := mlxc.GraphOps(out.Logits)
			products := ops["Matmul"] + ops["QuantizedMatmul"]
			if products != want {
				t.Errorf("quantized %v: %d products in a decode step (%v), want %d", quant, products, ops, want)
			}
			if ops["LogAddExp"] != 0 {
				t.Errorf("quantized %v: %d softplus nodes outside the compiled gates", quant, ops["LogAddExp"])
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
