package model_test

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	_ "github.com/dflash-mlx/dflash-mlx/model/qwen3"
)

// TestTCInModelSweep times a 16-row verify block through a whole model under each launch
// rule of the tensor-core kernel (DFLASH_TC_INMODEL=<model folder> on a CUDA GPU; a tuning
// aid). The per-product sweep's winners were slower inside the model than alone (see
// docs/perf/tensor-core-products.md), so shapes are compared here, in place: per rule, 8
// verify blocks are enqueued back to back (the host builds ahead, so the wall time per
// block is the device's), and rules take turns over 5 rounds so drift hits them alike.
// Prints the median ms per block per rule, fastest first; every rule's logits are checked
// against the default rule's.
func TestTCInModelSweep(t *testing.T) {
	dir := os.Getenv("DFLASH_TC_INMODEL")
	if dir == "" {
		t.Skip("DFLASH_TC_INMODEL=<model folder> on a CUDA GPU")
	}
	model.OnCUDA(t, func() error {
		m, err := model.Load(dir, model.LoadOptions{})
		if err != nil {
			return err
		}
		defer m.Free()
		kp, ok := m.(model.KernelProvider)
		if !ok || kp.Kernels().Skinny == nil {
			return fmt.Errorf("%s: needs a model with the tensor-core kernel on", dir)
		}
		skinny := kp.Kernels().Skinny
		type variant struct {
			name  string
			rule  string // a DFLASH_TC_RULE value; "" the default rule
			tiled bool
		}
		// The rules run in the loaded model's layout (tiled copies by default on CUDA); the
		// default rule in the other layout too.
		tiled := model.SkinnyTiled(skinny)
		other := "default, tiled"
		if tiled {
			other = "default, row-major"
		}
		vs := []variant{{"default", "", tiled}, {other, "", !tiled}}
		classes := os.Getenv("DFLASH_TC_INMODEL_RULES") // ';'-separated DFLASH_TC_RULE values
		if classes == "" {
			classes = "wide=4/8/4p;wide=4/4/4p;wide=2/8/2p;down=4/4/4;down=4/4/2p;down=1/8/2p;narrow=1/4/2p;narrow=2/8/2;narrow=2/4/4p;narrow=4/4/s3k128"
		}
		for _, r := range strings.Split(classes, ";") {
			vs = append(vs, variant{r, r, tiled})
		}
		c := m.NewCache()
		defer c.Free()
		c.Reserve(512)
		s := mlxc.NewScope()
		defer s.Close()
		prompt := make([]int32, 256)
		for i := range prompt {
			prompt[i] = int32((i*7919 + 13) % m.Arch().VocabSize)
		}
		m.Forward(mlxc.FromSlice(prompt, 1, len(prompt)), c, model.ForwardOptions{Logits: model.LogitsNone})
		mlxc.Eval(c.Arrays()...)
		ids := mlxc.FromSlice(prompt[:16], 1, 16)
		// block enqueues one verify block and returns its logits (detached; the caller frees).
		block := func() *mlxc.Array {
			sc := mlxc.NewScope()
			defer sc.Close()
			out := m.Forward(ids, c, model.ForwardOptions{Logits: model.LogitsAll})
			lg := out.Logits.Detach()
			mlxc.AsyncEval(append(c.Arrays(), lg)...)
			if err := c.Rewind(16); err != nil {
				panic(err)
			}
			return lg
		}
		use := func(v variant) {
			if err := model.UseTCRule(skinny, v.rule, v.tiled); err != nil {
				panic(err)
			}
		}
		defer use(variant{tiled: tiled})
		// Warm-up (kernels compiled, tiled copies made) and a check of every rule's logits.
		// Rules sum in other orders, so logits differ by rounding; a wrong launch is off by
		// the logits' own size (the bound: 5% of the largest).
		var ref []float32
		var scale float32
		for _, v := range vs {
			use(v)
			lg := block()
			got := mlxc.AsType(lg, mlxc.Float32).Float32s()
			lg.Free()
			if ref == nil {
				ref = got
				for _, x := range ref {
					scale = max(scale, absf(x))
				}
				continue
			}
			for i := range ref {
				if d := absf(got[i] - ref[i]); d > scale/20 || got[i] != got[i] {
					return fmt.Errorf("rule %q: logit %d = %g, default rule %g", v.name, i, got[i], ref[i])
				}
			}
		}
		times := make([][]float64, len(vs))
		for round := 0; round < 5; round++ {
			for i, v := range vs {
				use(v)
				start := time.Now()
				var lgs []*mlxc.Array
				for k := 0; k < 8; k++ {
					lgs = append(lgs, block())
				}
				mlxc.Eval(lgs...)
				times[i] = append(times[i], float64(time.Since(start).Microseconds())/1000/8)
				for _, a := range lgs {
					a.Free()
				}
			}
		}
		order := make([]int, len(vs))
		med := make([]float64, len(vs))
		for i := range vs {
			order[i] = i
			slices.Sort(times[i])
			med[i] = times[i][len(times[i])/2]
		}
		slices.SortFunc(order, func(a, b int) int {
			switch {
			case med[a] < med[b]:
				return -1
			case med[a] > med[b]:
				return 1
			}
			return 0
		})
		for _, i := range order {
			t.Logf("%-22s %.3f ms per verify block (rounds %v)", vs[i].name, med[i], times[i])
		}
		return nil
	})
}

func absf(x float32) float32 { return float32(math.Abs(float64(x))) }
