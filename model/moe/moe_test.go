package moe_test

import (
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/internal/reftest"
	"github.com/dflash-mlx/dflash-mlx/internal/testenv"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/moe"
)

const prefix = "model.layers.0.mlp"

type blockCase struct {
	family      string // "next" (shared expert) or "moe" (Qwen3-MoE, none)
	E, K, H, Im int
	Is          int
	norm        bool
	dtype       string
	quant       int
	rows        []int
}

// writeRef has mlx-lm build, save and run a random block (testdata/moe_ref.py).
func writeRef(t *testing.T, c blockCase) string {
	t.Helper()
	py := reftest.Python(t)
	dir := t.TempDir()
	dev := "cpu"
	if testenv.GPU() {
		dev = "gpu"
	}
	t.Setenv("DFLASH_DEVICE", dev)
	ns := make([]string, len(c.rows))
	for i, n := range c.rows {
		ns[i] = strconv.Itoa(n)
	}
	b := map[bool]string{false: "0", true: "1"}
	reftest.Run(t, py, filepath.Join("testdata", "moe_ref.py"), dir, c.family,
		strconv.Itoa(c.E), strconv.Itoa(c.K), strconv.Itoa(c.H), strconv.Itoa(c.Im), strconv.Itoa(c.Is),
		b[c.norm], c.dtype, strconv.Itoa(c.quant), "7", strings.Join(ns, ","))
	return dir
}

func (c blockCase) config() moe.Config {
	is := c.Is
	if c.family == "moe" {
		is = 0
	}
	return moe.Config{Hidden: c.H, Experts: c.E, TopK: c.K, Inter: c.Im, SharedInter: is, NormTopK: c.norm}
}

// load builds the block from dir the way a family does (Builder, then Finish).
func load(dir string, c moe.Config, swiglu bool) (*moe.Block, error) {
	w, err := model.ReadWeightHeaders(dir)
	if err != nil {
		return nil, err
	}
	rc, err := model.ReadConfig(dir)
	if err != nil {
		return nil, err
	}
	qc, err := rc.ParseQuantization()
	if err != nil {
		return nil, err
	}
	if err := w.Load(nil); err != nil {
		return nil, err
	}
	if swiglu {
		c.SwiGLU = model.NewSwiGLU()
		c.Gating = model.NewSigmoidGating()
	}
	b := model.NewBuilder(w, qc)
	blk, err := moe.New(b, w, qc, prefix, c)
	if err != nil {
		w.Free()
		return nil, err
	}
	if err := b.Finish(nil); err != nil {
		blk.Free()
		return nil, err
	}
	mlxc.Eval(blk.Arrays()...)
	blk.Prepare()
	return blk, nil
}

func maxAbsDiff(a, b []float32) (float64, int) {
	worst, at := 0.0, -1
	for i := range a {
		if d := math.Abs(float64(a[i]) - float64(b[i])); d > worst || math.IsNaN(d) {
			worst, at = d, i
		}
	}
	return worst, at
}

func maxAbs(a []float32) float64 {
	m := 0.0
	for _, v := range a {
		m = max(m, math.Abs(float64(v)))
	}
	return m
}

// TestBlockMatchesMLXLM runs random blocks against mlx-lm's: bit for bit where the same ops
// run (float32, 4-bit experts, and bfloat16 against mlx-lm with the same float32 gather
// product on the CPU), and bfloat16 also against the float32 block within a bound.
func TestBlockMatchesMLXLM(t *testing.T) {
	rows := []int{1, 5, 16, 40}
	var cases []blockCase
	for _, dt := range []string{"float32", "bfloat16"} {
		for _, q := range []int{0, 4} {
			if q == 4 && dt == "float32" {
				continue // mlx-community checkpoints are bf16 under the quantized weights
			}
			cases = append(cases,
				blockCase{family: "next", E: 8, K: 2, H: 128, Im: 64, Is: 64, norm: true, dtype: dt, quant: q, rows: rows},
				blockCase{family: "next", E: 16, K: 4, H: 128, Im: 64, Is: 128, norm: false, dtype: dt, quant: q, rows: rows},
				blockCase{family: "moe", E: 4, K: 4, H: 64, Im: 128, norm: true, dtype: dt, quant: q, rows: rows},
				blockCase{family: "moe", E: 16, K: 4, H: 128, Im: 64, norm: false, dtype: dt, quant: q, rows: rows},
			)
		}
	}
	for _, c := range cases {
		name := fmt.Sprintf("%s/E%d_k%d/shared%d/norm%v/%s/q%d", c.family, c.E, c.K, c.config().SharedInter, c.norm, c.dtype, c.quant)
		t.Run(name, func(t *testing.T) {
			dir := writeRef(t, c)
			err := mlxc.Do(func() error {
				s := mlxc.NewScope()
				defer s.Close()
				blk, err := load(dir, c.config(), c.E == 16)
				if err != nil {
					return err
				}
				defer blk.Free()
				ref, _ := mlxc.LoadSafetensors(filepath.Join(dir, "ref.safetensors"))
				for _, n := range c.rows {
					x := ref[fmt.Sprintf("x_%d", n)]
					y := blk.Apply(x)
					if got := y.Shape(); len(got) != 2 || got[0] != n || got[1] != c.H {
						return fmt.Errorf("rows %d: output shape %v, want [%d %d]", n, got, n, c.H)
					}
					if y.Dtype() != x.Dtype() {
						return fmt.Errorf("rows %d: output dtype %s, want %s", n, y.Dtype(), x.Dtype())
					}
					// Decode and verify shapes (up to 16 rows) take their row indices as
					// constants made at Prepare, not aranges in the graph (the CPU's
					// bfloat16 products build their own).
					if n <= 16 && (c.dtype == "float32" || c.quant > 0) {
						if a := mlxc.GraphOps(y)["Arange"]; a != 0 {
							return fmt.Errorf("rows %d: %d arange nodes in the block's graph", n, a)
						}
					}
					got := y.Float32s()
					want := ref[fmt.Sprintf("y_%d", n)].Float32s()
					if d, at := maxAbsDiff(got, want); d != 0 {
						return fmt.Errorf("rows %d (%d pairs, sorted %v): max |Δ| %g at %d (got %g, mlx-lm %g), want bit-exact",
							n, n*c.K, n*c.K >= moe.SortThreshold, d, at, got[at], want[at])
					}
					// Row by row (GPU-exact mode) each row runs a one-token step's graph; on
					// the CPU that is the same computation, bit for bit.
					if !testenv.GPU() {
						blk.Rowwise = true
						rowwise := blk.Apply(x).Float32s()
						blk.Rowwise = false
						if d, at := maxAbsDiff(rowwise, want); d != 0 {
							return fmt.Errorf("rows %d row by row: max |Δ| %g at %d, want bit-exact", n, d, at)
						}
					}
					r32, ok := ref[fmt.Sprintf("y32_%d", n)]
					if !ok {
						continue
					}
					// bfloat16 against the float32 block, on rows that chose the same experts:
					// every op of the bfloat16 block rounds to 8 significant bits, so allow a
					// few bfloat16 ulps of the output's scale.
					want32 := r32.Float32s()
					agree := ref[fmt.Sprintf("agree_%d", n)].Int32s()
					scale := maxAbs(want32)
					bound := 4 * math.Ldexp(scale, -8)
					same, worst := 0, 0.0
					for r := 0; r < n; r++ {
						if agree[r] == 0 {
							continue
						}
						same++
						d, at := maxAbsDiff(got[r*c.H:(r+1)*c.H], want32[r*c.H:(r+1)*c.H])
						if d > bound {
							return fmt.Errorf("rows %d, row %d: bfloat16 vs float32 max |Δ| %g at %d > bound %g", n, r, d, at, bound)
						}
						worst = max(worst, d)
					}
					t.Logf("rows %d: bfloat16 vs float32 block: %d/%d rows route alike, max |Δ| %.3g (output scale %.3g, bound %.3g)", n, same, n, worst, scale, bound)
					if same < n/2 {
						return fmt.Errorf("rows %d: only %d rows chose the same experts in bfloat16 and float32", n, same)
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
