package sample

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/internal/reftest"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// qwen3Vocab is the real Qwen3 vocabulary size: the filters' sums and sorts must hold at it.
const qwen3Vocab = 151936

// refDists are logit rows at the real vocabulary size, two rows each: flat (every logit
// equal, one big tie, the case a bf16 running sum got wrong), peaked (a few dominant
// tokens over a long Gaussian tail) and tied (logits on a coarse grid, so the top-p, top-k
// and min-p boundaries fall inside runs of equal values).
func refDists(v int) map[string][]float32 {
	r := rand.New(rand.NewPCG(7, 11))
	flat := make([]float32, 2*v)
	peaked := make([]float32, 2*v)
	tied := make([]float32, 2*v)
	for i := range peaked {
		peaked[i] = float32(r.NormFloat64() * 2)
		tied[i] = float32(math.Round(r.NormFloat64() * 3))
	}
	for row := 0; row < 2; row++ {
		for k := 0; k < 5; k++ {
			peaked[row*v+r.IntN(v)] = float32(14 + 2*k)
		}
	}
	// The second flat row is flat but not zero: a shift must not matter.
	for i := v; i < 2*v; i++ {
		flat[i] = 3.5
	}
	return map[string][]float32{"flat": flat, "peaked": peaked, "tied": tied}
}

type refCase struct {
	Name    string  `json:"name"`
	Rows    int     `json:"rows"`
	Vocab   int     `json:"vocab"`
	Dtype   string  `json:"dtype"`
	Logits  string  `json:"logits"`
	Op      string  `json:"op"`
	Arg     float64 `json:"arg"`
	History []int32 `json:"history,omitempty"`
	dist    string
	dt      mlxc.Dtype
}

func writeF32(t *testing.T, path string, v []float32) {
	t.Helper()
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func readF32(t *testing.T, path string) []float32 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// The kept sets of top-p, top-k and min-p, and the repetition penalty's logits, equal
// mlx-lm's (sample_utils, run by the reference interpreter) at the real Qwen3 vocabulary
// size, for flat, peaked and tied distributions with bf16, f16 and f32 logits.
func TestFiltersMatchMLXLMAtRealVocab(t *testing.T) {
	py := reftest.Python(t)
	dir := t.TempDir()
	v := qwen3Vocab
	dists := refDists(v)
	for name, logits := range dists {
		writeF32(t, filepath.Join(dir, name+".f32"), logits)
	}
	dtypes := []struct {
		name string
		dt   mlxc.Dtype
	}{{"bfloat16", mlxc.BFloat16}, {"float16", mlxc.Float16}, {"float32", mlxc.Float32}}
	ops := []struct {
		op   string
		args []float64
	}{
		{"top_p", []float64{0.001, 0.5, 0.9, 0.95, 0.9999}},
		{"top_k", []float64{1, 40, 1000}},
		{"min_p", []float64{0.05, 0.5, 1}},
	}
	var cases []refCase
	for _, dist := range []string{"flat", "peaked", "tied"} {
		for _, d := range dtypes {
			for _, o := range ops {
				for _, a := range o.args {
					cases = append(cases, refCase{Name: fmt.Sprintf("%s-%s-%s-%g", dist, d.name, o.op, a), Rows: 2, Vocab: v,
						Dtype: d.name, Logits: filepath.Join(dir, dist+".f32"), Op: o.op, Arg: a, dist: dist, dt: d.dt})
				}
			}
			// mlx-lm's repetition penalty on one row (its processor treats every row alike).
			cases = append(cases, refCase{Name: fmt.Sprintf("%s-%s-penalty", dist, d.name), Rows: 1, Vocab: v, Dtype: d.name,
				Logits: filepath.Join(dir, dist+".f32"), Op: "penalty", Arg: 1.3, History: []int32{5, 17, 5, 151935, 0, 99999},
				dist: dist, dt: d.dt})
		}
	}
	js, err := json.Marshal(cases)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cases.json"), js, 0o644); err != nil {
		t.Fatal(err)
	}
	reftest.Run(t, py, filepath.Join("testdata", "mlxlm_filters.py"), filepath.Join(dir, "cases.json"), dir)

	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			logits := dists[c.dist][:c.Rows*v]
			if c.Op == "penalty" {
				var got []float32
				on(t, func() {
					lg := mlxc.AsType(mlxc.FromSlice(logits, c.Rows, v), c.dt)
					got = mlxc.AsType(Params{RepetitionPenalty: c.Arg}.PenaltyRows(lg, c.History, nil), mlxc.Float32).Float32s()
				})
				want := readF32(t, filepath.Join(dir, c.Name+".f32"))
				bad := 0
				for i := range want {
					if got[i] != want[i] {
						if bad < 5 {
							t.Errorf("token %d: penalised logit %v, mlx-lm %v", i, got[i], want[i])
						}
						bad++
					}
				}
				if bad > 0 {
					t.Errorf("%d of %d logits differ from mlx-lm's", bad, len(want))
				}
				return
			}
			p := Params{Temperature: 1}
			switch c.Op {
			case "top_p":
				p.TopP = c.Arg
			case "top_k":
				p.TopK = int(c.Arg)
			case "min_p":
				p.MinP = c.Arg
			}
			var got []bool
			on(t, func() {
				lg := mlxc.AsType(mlxc.FromSlice(logits, c.Rows, v), c.dt)
				got = kept(p.Filter(LogProbs(lg)).Float32s())
			})
			want, err := os.ReadFile(filepath.Join(dir, c.Name+".kept"))
			if err != nil {
				t.Fatal(err)
			}
			bad, nGot, nWant := 0, 0, 0
			for i := range want {
				if got[i] {
					nGot++
				}
				if want[i] == 1 {
					nWant++
				}
				if got[i] != (want[i] == 1) {
					if bad < 5 {
						t.Errorf("row %d token %d: kept %v, mlx-lm %v", i/v, i%v, got[i], want[i] == 1)
					}
					bad++
				}
			}
			if bad > 0 {
				t.Errorf("%d tokens differ from mlx-lm's set (kept %d, mlx-lm %d)", bad, nGot, nWant)
			}
			// Every row keeps at least its best token.
			for row := 0; row < c.Rows; row++ {
				some := false
				for _, k := range got[row*v : (row+1)*v] {
					some = some || k
				}
				if !some {
					t.Errorf("row %d: no token kept", row)
				}
			}
		})
	}
}
