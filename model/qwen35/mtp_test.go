package qwen35_test

import (
	"errors"
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
	"github.com/dflash-mlx/dflash-mlx/model/qwen35"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// loadMTP loads dir with the MTP head asked for.
func loadMTP(t *testing.T, dir string) (*qwen35.Model, error) {
	t.Helper()
	var m model.Model
	err := mlxc.Do(func() error {
		var err error
		s := settings.ForTests()
		m, err = model.Load(dir, model.LoadOptions{Settings: &s, MTP: true})
		return err
	})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { _ = mlxc.Do(func() error { m.Free(); return nil }) })
	return m.(*qwen35.Model), nil
}

// mtpSpec is a tiny target of the case's family, with an MTP head.
func mtpSpec(moe bool, mod func(*modelgen.Qwen35Spec)) modelgen.Qwen35Spec {
	s := modelgen.TinyQwen35()
	if moe {
		s = modelgen.TinyQwen35MoE()
	}
	s.MTP = true
	mod(&s)
	return s
}

// mtpCases are dense and MoE targets with a head in both layouts, float32, bfloat16 and
// quantized (an MLX conversion that keeps the head quantizes it like the target).
var mtpCases = []struct {
	name string
	moe  bool
	mod  func(*modelgen.Qwen35Spec)
}{
	{"dense-hf-f32-tied", false, func(s *modelgen.Qwen35Spec) { s.Dtype, s.Layout, s.Seed = mlxc.Float32, modelgen.Qwen35HF, 21 }},
	{"dense-mlx-f32-untied", false, func(s *modelgen.Qwen35Spec) { s.Dtype, s.Tied, s.Seed = mlxc.Float32, false, 22 }},
	{"moe-hf-f32-untied", true, func(s *modelgen.Qwen35Spec) {
		s.Dtype, s.Layout, s.Tied, s.Seed = mlxc.Float32, modelgen.Qwen35HF, false, 23
	}},
	{"moe-mlx-f32-tied", true, func(s *modelgen.Qwen35Spec) { s.Dtype, s.Seed = mlxc.Float32, 24 }},
	{"dense-hf-bf16-untied", false, func(s *modelgen.Qwen35Spec) { s.Layout, s.Tied, s.Seed = modelgen.Qwen35HF, false, 25 }},
	{"dense-mlx-4bit-g64", false, func(s *modelgen.Qwen35Spec) { s.Seed, s.QuantBits, s.QuantGroup = 26, 4, 64 }},
	{"moe-mlx-8bit-g32-untied", true, func(s *modelgen.Qwen35Spec) {
		s.Tied, s.Seed, s.QuantBits, s.QuantGroup = false, 27, 8, 32
	}},
}

// mtpRun is what the Go side computes for the reference script's sequence (mtp_ref.py).
type mtpRun struct {
	values map[string][]float32
	tokens []int32
}

const (
	mtpBonus    = 77
	mtpSteps    = 4
	mtpRollback = 3
)

// runMTP computes mtp_ref.py's sequence with our model: the target's final-normed rows of
// the prompt, one head step over its pairs, mtpSteps autoregressive steps on the head's
// own rows and argmax tokens, then a rollback of mtpRollback slots and one step.
func runMTP(t *testing.T, m *qwen35.Model) mtpRun {
	t.Helper()
	run := mtpRun{values: map[string][]float32{}}
	err := mlxc.Do(func() error {
		s := mlxc.NewScope()
		defer s.Close()
		h := m.MTP()
		P := len(prompt)
		c := m.NewCache()
		defer c.Free()
		out := m.Forward(mlxc.FromSlice(prompt, 1, P), c, model.ForwardOptions{Taps: []int{m.Arch().NumLayers - 1}, Logits: model.LogitsNone})
		hid := mlxc.Reshape(h.TargetHidden(mlxc.Reshape(out.Hidden, P, -1)), 1, P, -1)
		put := func(k string, a *mlxc.Array) { run.values[k] = mlxc.AsType(a, mlxc.Float32).Float32s() }
		put("target_hidden", hid)
		hc := h.NewCache()
		defer hc.Free()
		pairs := append(append([]int32{}, prompt[1:]...), mtpBonus)
		o := h.Step(mlxc.FromSlice(pairs, 1, P), hid, hc, model.LogitsAll)
		put("prefill_hidden", o.Hidden)
		put("prefill_logits", o.Logits)
		if hc.Offset() != P {
			t.Errorf("head cache offset %d after the prefill step, want %d", hc.Offset(), P)
		}
		last := mlxc.SliceAxis(o.Hidden, 1, P-1, P)
		logits := mlxc.SliceAxis(o.Logits, 1, P-1, P)
		for i := 0; i < mtpSteps; i++ {
			tok := int32(mlxc.Argmax(mlxc.Reshape(logits, -1), -1, false).Int())
			run.tokens = append(run.tokens, tok)
			o = h.Step(mlxc.FromSlice([]int32{tok}, 1, 1), last, hc, model.LogitsLast)
			put(fmt.Sprintf("step_%d_hidden", i), o.Hidden)
			put(fmt.Sprintf("step_%d_logits", i), o.Logits)
			last, logits = o.Hidden, o.Logits
			mlxc.Eval(append(hc.Arrays(), last, logits)...)
		}
		if err := hc.Truncate(hc.Offset() - mtpRollback); err != nil {
			return err
		}
		o = h.Step(mlxc.FromSlice([]int32{mtpBonus}, 1, 1), mlxc.SliceAxis(hid, 1, P-1, P), hc, model.LogitsLast)
		put("rollback_hidden", o.Hidden)
		put("rollback_logits", o.Logits)
		if want := P + mtpSteps - mtpRollback + 1; hc.Offset() != want {
			t.Errorf("head cache offset %d after the rollback step, want %d", hc.Offset(), want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return run
}

// mtpKeys are the reference's float arrays, in the order they are computed.
func mtpKeys() []string {
	keys := []string{"target_hidden", "prefill_hidden", "prefill_logits"}
	for i := 0; i < mtpSteps; i++ {
		keys = append(keys, fmt.Sprintf("step_%d_hidden", i), fmt.Sprintf("step_%d_logits", i))
	}
	return append(keys, "rollback_hidden", "rollback_logits")
}

// One MTP step over a prompt's pairs, four autoregressive steps on the head's own rows and
// a rollback, against mlx-vlm's Qwen3.5 MTP drafter bound to the mlx-lm target, for dense
// and MoE heads in both layouts and three precisions.
//
// With the decoder layer built by mlx-lm ("mlxlm": mlx-vlm's fc, norms, concatenation,
// cache and final norm around mlx-lm's DecoderLayer, the code our target matches) every
// value must agree bit for bit on the CPU. With mlx-vlm's own layer ("mlxvlm") it cannot
// in float32: mlx-vlm rotates q and k with cos/sin tables it computes itself (mRoPE with
// position ids) where mlx-lm and we call MLX's fused rope kernel, and the two round
// differently in the last place (observed: at most 5e-7 of the largest magnitude). The
// values must then agree within 1e-5 of the largest magnitude in float32 and the argmax
// tokens exactly; in bfloat16 or quantized, where a last-place difference can flip one
// bf16 rounding (2^-8 relative) that later products carry, within 1/32 (observed: equal).
// On a GPU both modes get the bf16 bound.
func TestMTPMatchesMLXVLM(t *testing.T) {
	py := reftest.Python(t)
	gpu := testenv.GPU()
	script := filepath.Join(reftest.RepoRoot(), "model", "qwen35", "testdata", "mtp_ref.py")
	for _, tc := range mtpCases {
		for _, layer := range []string{"mlxlm", "mlxvlm"} {
			t.Run(tc.name+"/"+layer, func(t *testing.T) {
				spec := mtpSpec(tc.moe, tc.mod)
				tmp := t.TempDir()
				dir := filepath.Join(tmp, "ckpt")
				writeModel(t, dir, spec)
				refPath := filepath.Join(tmp, "ref.safetensors")
				reftest.Run(t, py, script, "ref", dir, refPath, tokens(prompt), strconv.Itoa(mtpBonus),
					strconv.Itoa(mtpSteps), strconv.Itoa(mtpRollback), layer)
				m, err := loadMTP(t, dir)
				if err != nil {
					t.Fatal(err)
				}
				if m.MTP() == nil || m.MTP().Layers() != 1 {
					t.Fatalf("no one-layer MTP head loaded: %v", m.MTP())
				}
				got := runMTP(t, m)
				if spec.QuantBits > 0 {
					hasTensor(t, dir, "language_model.mtp.fc.scales") // the head is quantized
				}
				exact := layer == "mlxlm" && !gpu
				tol := 1e-5
				if spec.Dtype != mlxc.Float32 || spec.QuantBits > 0 || gpu {
					tol = 1.0 / 32
				}
				compareMTP(t, refPath, got, exact, tol, exact || spec.Dtype == mlxc.Float32 && !gpu)
			})
		}
	}
}

// compareMTP checks got against the reference file: bit for bit when exact, else within
// tol of each array's largest magnitude; the argmax tokens when tokens is set.
func compareMTP(t *testing.T, refPath string, got mtpRun, exact bool, tol float64, tokens bool) {
	t.Helper()
	err := mlxc.Do(func() error {
		s := mlxc.NewScope()
		defer s.Close()
		ref, _ := mlxc.LoadSafetensors(refPath)
		for _, k := range mtpKeys() {
			want := ref[k].Float32s()
			d, at := maxAbsDiff(got.values[k], want)
			scale := 0.0
			for _, w := range want {
				scale = math.Max(scale, math.Abs(float64(w)))
			}
			switch {
			case exact && d != 0:
				t.Errorf("%s differs from the reference: max |Δ| = %g at %d (of %d)", k, d, at, len(want))
			case !exact && !(d <= tol*scale):
				t.Errorf("%s differs from the reference by %g at %d, more than %g × max |ref| %g", k, d, at, tol, scale)
			case !exact:
				t.Logf("%s: max |Δ| = %g (%.2g of max |ref|)", k, d, d/scale)
			}
		}
		if want := ref["step_tokens"].Int32s(); tokens && fmt.Sprint(got.tokens) != fmt.Sprint(want) {
			t.Errorf("argmax tokens %v, reference %v", got.tokens, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A checkpoint without the head loads with LoadOptions.MTP as without it, and says why
// it has no head with model.ErrNoMTP; without the option a checkpoint's head costs
// nothing and is absent.
func TestMTPAbsent(t *testing.T) {
	cases := []struct {
		name   string
		mtp    bool // the checkpoint has a head
		ask    bool // LoadOptions.MTP
		layout modelgen.Qwen35Layout
		why    string
	}{
		{"mlx-no-head-asked", false, true, modelgen.Qwen35MLX, "the checkpoint has no mtp.* tensors"},
		{"head-not-asked", true, false, modelgen.Qwen35HF, "loaded without its multi-token-prediction head"},
		{"mlx-head-not-asked", true, false, modelgen.Qwen35MLX, "loaded without its multi-token-prediction head"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := modelgen.TinyQwen35()
			spec.MTP, spec.Layout = tc.mtp, tc.layout
			dir := t.TempDir()
			writeModel(t, dir, spec)
			var m *qwen35.Model
			if tc.ask {
				var err error
				if m, err = loadMTP(t, dir); err != nil {
					t.Fatal(err)
				}
			} else {
				m = loadModel(t, dir).(*qwen35.Model)
			}
			if m.MTP() != nil {
				t.Fatal("a head was loaded")
			}
			_, err := m.RequireMTP()
			if !errors.Is(err, model.ErrNoMTP) || !strings.Contains(err.Error(), tc.why) {
				t.Errorf("RequireMTP: %v, want model.ErrNoMTP saying %q", err, tc.why)
			}
		})
	}
}

// The head's tensors are checked like the target's: a missing, mis-shaped or extra MTP
// tensor fails the load with LoadOptions.MTP and names it; the HF layout's stray mtp.*
// tensors (a partial head) are refused too. Without the option all of them are dropped.
func TestMTPBadHead(t *testing.T) {
	cases := []struct {
		name   string
		layout modelgen.Qwen35Layout
		moe    bool
		edit   func(t *testing.T, dir string)
		want   []string
	}{
		{"hf-partial", modelgen.Qwen35HF, false, nil, []string{"multi-token-prediction head", "language_model.mtp.pre_fc_norm_hidden.weight is missing"}},
		{"mlx-missing-fc", modelgen.Qwen35MLX, false, func(t *testing.T, dir string) {
			drop(t, dir, "language_model.mtp.fc.weight")
		}, []string{"language_model.mtp.fc.weight is missing"}},
		{"hf-missing-expert", modelgen.Qwen35HF, true, func(t *testing.T, dir string) {
			drop(t, dir, "mtp.layers.0.mlp.experts.down_proj")
		}, []string{"mtp.layers.0.mlp.experts.down_proj is missing"}},
		{"mlx-wrong-shape", modelgen.Qwen35MLX, false, func(t *testing.T, dir string) {
			replace(t, dir, "language_model.mtp.norm.weight", []int{32})
		}, []string{"language_model.mtp.norm.weight has shape [32], want [64]"}},
		{"mlx-second-layer", modelgen.Qwen35MLX, false, func(t *testing.T, dir string) {
			replace(t, dir, "language_model.mtp.layers.1.input_layernorm.weight", []int{64})
		}, []string{"unexpected tensors", "language_model.mtp.layers.1.input_layernorm.weight"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			spec := modelgen.TinyQwen35()
			if tc.moe {
				spec = modelgen.TinyQwen35MoE()
			}
			spec.Layout, spec.MTP = tc.layout, tc.edit != nil
			dir := t.TempDir()
			writeModel(t, dir, spec)
			if tc.edit != nil {
				tc.edit(t, dir)
			}
			_, err := loadMTP(t, dir)
			if err == nil {
				t.Fatal("the load succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			if m := loadModel(t, dir); m.(*qwen35.Model).MTP() != nil {
				t.Error("a head was loaded without LoadOptions.MTP")
			}
		})
	}
}

// hasTensor fails the test when dir's model.safetensors lacks name.
func hasTensor(t *testing.T, dir, name string) {
	t.Helper()
	h, err := model.ReadSafetensorsHeader(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := h.Tensors[name]; !ok {
		t.Fatalf("%s has no tensor %s", dir, name)
	}
}

func drop(t *testing.T, dir string, names ...string) {
	t.Helper()
	if err := mlxc.Do(func() error { return modelgen.DropTensors(dir, names...) }); err != nil {
		t.Fatal(err)
	}
}

// replace puts a float tensor of the given shape (ones) under name, in place of any.
func replace(t *testing.T, dir, name string, shape []int) {
	t.Helper()
	p := filepath.Join(dir, "model.safetensors")
	err := mlxc.Do(func() error {
		return mlxc.Catch(func() {
			s := mlxc.NewScope()
			defer s.Close()
			w, meta := mlxc.LoadSafetensors(p)
			w[name] = mlxc.Full(shape, mlxc.Scalar(1, mlxc.BFloat16), mlxc.BFloat16)
			mlxc.SaveSafetensors(p, w, meta)
		})
	})
	if err != nil {
		t.Fatal(err)
	}
}
