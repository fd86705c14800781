package draft_test

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/draft"
	"github.com/dflash-mlx/dflash-mlx/internal/testenv"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
)

// slidingPair writes a tiny Qwen3.5 target under dir/t and, under dir/<name>, drafters
// for it that share one set of weights and differ only in their config, and loads the
// target (MLX thread).
func slidingPair(dir string) (model.Model, modelgen.DrafterSpec, error) {
	spec := modelgen.TinyQwen35()
	ds := modelgen.DrafterForQwen35(spec, 3)
	ds.BlockSize = 8
	if err := modelgen.WriteQwen35(filepath.Join(dir, "t"), spec); err != nil {
		return nil, ds, err
	}
	target, err := model.Load(filepath.Join(dir, "t"), model.LoadOptions{})
	return target, ds, err
}

// writeVariant writes ds under dir/name with the config edited by edit.
func writeVariant(dir, name string, ds modelgen.DrafterSpec, edit func(map[string]any)) (string, error) {
	p := filepath.Join(dir, name)
	if err := modelgen.WriteDrafter(p, ds); err != nil || edit == nil {
		return p, err
	}
	b, err := os.ReadFile(filepath.Join(p, "config.json"))
	if err != nil {
		return p, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return p, err
	}
	edit(m)
	b, _ = json.Marshal(m)
	return p, os.WriteFile(filepath.Join(p, "config.json"), b, 0o644)
}

// refDrafter is the DFlash draft forward written out in plain MLX ops over the whole
// context every call (no cache), with each layer's mask given as an additive matrix
// computed on the host element by element: the reference for the drafter's masks.
type refDrafter struct {
	w      map[string]*mlxc.Array
	ds     modelgen.DrafterSpec
	target model.Model
	// visible(layer, q, p): may the block row at position q see the key at position p.
	visible func(layer, q, p int) bool
}

func (r *refDrafter) linear(x *mlxc.Array, name string) *mlxc.Array {
	return mlxc.Matmul(x, mlxc.Transpose(r.w[name+".weight"], 1, 0))
}

// forward drafts block (int32 [1, L]) after the context rows ctx [1, P, n·H] (all of
// them, from position 0); returns logits [1, L−1, V].
func (r *refDrafter) forward(block, ctx *mlxc.Array) *mlxc.Array {
	ds := r.ds
	L, P := block.Dim(1), ctx.Dim(1)
	nh, nkv, hd := ds.Heads, ds.KVHeads, ds.HeadDim
	const eps = 1e-6
	rope := func(x *mlxc.Array, off int) *mlxc.Array {
		return mlxc.RoPE(x, hd, false, float32(ds.RopeTheta), 1, off, nil)
	}
	heads := func(x *mlxc.Array, rows, n int, norm *mlxc.Array) *mlxc.Array {
		y := mlxc.Reshape(x, 1, rows, n, hd)
		if norm != nil {
			y = mlxc.RMSNorm(y, norm, eps)
		}
		return mlxc.Transpose(y, 0, 2, 1, 3)
	}
	x := r.target.Embed(mlxc.Reshape(block, L))
	proj := mlxc.RMSNorm(r.linear(mlxc.Reshape(ctx, P, -1), "fc"), r.w["hidden_norm.weight"], eps)
	for i := 0; i < ds.Layers; i++ {
		p := fmt.Sprintf("layers.%d.", i)
		h := mlxc.RMSNorm(x, r.w[p+"input_layernorm.weight"], eps)
		a := p + "self_attn."
		q := rope(heads(r.linear(h, a+"q_proj"), L, nh, r.w[a+"q_norm.weight"]), P)
		kc := rope(heads(r.linear(proj, a+"k_proj"), P, nkv, r.w[a+"k_norm.weight"]), 0)
		kb := rope(heads(r.linear(h, a+"k_proj"), L, nkv, r.w[a+"k_norm.weight"]), P)
		vc := heads(r.linear(proj, a+"v_proj"), P, nkv, nil)
		vb := heads(r.linear(h, a+"v_proj"), L, nkv, nil)
		k := mlxc.Concatenate([]*mlxc.Array{kc, kb}, 2)
		v := mlxc.Concatenate([]*mlxc.Array{vc, vb}, 2)
		K := P + L
		add := make([]float32, L*K)
		for qi := 0; qi < L; qi++ {
			for j := 0; j < K; j++ {
				if !r.visible(i, P+qi, j) {
					add[qi*K+j] = float32(math.Inf(-1))
				}
			}
		}
		mask := mlxc.AsType(mlxc.FromSlice(add, 1, 1, L, K), q.Dtype())
		o := mlxc.ScaledDotProductAttention(q, k, v, float32(math.Pow(float64(hd), -0.5)), mlxc.MaskArray, mask, nil)
		o = mlxc.Reshape(mlxc.Transpose(o, 0, 2, 1, 3), L, nh*hd)
		x = mlxc.Add(x, r.linear(o, a+"o_proj"))
		h = mlxc.RMSNorm(x, r.w[p+"post_attention_layernorm.weight"], eps)
		m := p + "mlp."
		x = mlxc.Add(x, r.linear(mlxc.Multiply(mlxc.SiLU(r.linear(h, m+"gate_proj")), r.linear(h, m+"up_proj")), m+"down_proj"))
	}
	final := model.NormOf(mlxc.SliceAxis(x, 0, 1, L), r.w["norm.weight"], eps)
	return mlxc.Reshape(r.target.Head(final), 1, L-1, -1)
}

// A drafter with sliding layers drafts what the reference computes with an explicit
// window mask (z-lab's rule: the block row at position q sees the keys at positions p
// with q−W < p ≤ q), through Forward's concatenated and padded keys and ForwardAt, over
// cycles whose context outgrows the window; its full layer still sees everything. The
// full-attention drafter with the same weights drafts something else (the window bites),
// and the sliding drafter whose window covers everything with is_causal false drafts
// exactly what the full-attention one does.
func TestDrafterSlidingLayersMatchReference(t *testing.T) {
	const W = 5
	dir := t.TempDir()
	err := mlxc.Do(func() error {
		target, ds, err := slidingPair(dir)
		if err != nil {
			return err
		}
		defer target.Free()
		sl := ds
		sl.LayerTypes = []string{draft.SlidingAttention, draft.SlidingAttention, draft.FullAttention}
		sl.SlidingWindow = W
		wide := sl
		wide.SlidingWindow = 1 << 20
		var ds3 [3]*draft.Drafter
		for i, v := range []struct {
			name string
			spec modelgen.DrafterSpec
			edit func(map[string]any)
		}{{"sliding", sl, nil}, {"full", ds, nil}, {"wide", wide, func(m map[string]any) { m["is_causal"] = false }}} {
			p, err := writeVariant(dir, v.name, v.spec, v.edit)
			if err != nil {
				return err
			}
			if ds3[i], err = draft.Load(p, target, draft.LoadOptions{}); err != nil {
				return err
			}
			defer ds3[i].Free()
		}
		dSl, dFull, dWide := ds3[0], ds3[1], ds3[2]
		slDir := filepath.Join(dir, "sliding")
		w, _ := mlxc.LoadSafetensors(filepath.Join(slDir, "model.safetensors"))
		ref := &refDrafter{w: w, ds: sl, target: target, visible: func(layer, q, p int) bool {
			if sl.LayerTypes[layer] == draft.FullAttention {
				return true
			}
			return p <= q && q-p < W
		}}
		taps := len(dSl.TapLayers()) * ds.Hidden
		cSl, cPad, cAt, cFull, cWide := dSl.NewCache(), dSl.NewCache(), dSl.NewCache(), dFull.NewCache(), dWide.NewCache()
		defer func() {
			for _, c := range []*model.KVCaches{cSl, cPad, cAt, cFull, cWide} {
				c.Free()
			}
		}()
		var history *mlxc.Array // every context row so far, for the reference
		block := make([]int32, ds.BlockSize)
		for i := 1; i < len(block); i++ {
			block[i] = int32(ds.MaskTokenID)
		}
		differs, worst := 0, 0.0
		for cycle := 0; cycle < 6; cycle++ {
			s := mlxc.NewScope()
			T := 3 + cycle%4 // rows committed this cycle
			if cycle == 0 {
				T = 11
			}
			ctx := mlxc.Normal([]int{1, T, taps}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(uint64(500+cycle)))
			block[0] = int32((cycle*37 + 5) % ds.Vocab)
			ids := mlxc.FromSlice(block, 1, len(block))
			if history == nil {
				history = ctx
			} else {
				history = mlxc.Concatenate([]*mlxc.Array{history, ctx}, 1)
			}
			history.Detach()
			want := ref.forward(ids, history)
			dSl.KeyBucket = 0
			got := dSl.Forward(ids, ctx, cSl)
			dSl.KeyBucket = 8
			pad := dSl.Forward(ids, ctx, cPad)
			dSl.KeyBucket = 0
			// ForwardAt: the cycle's rows followed by rows it does not commit.
			extra := mlxc.Normal([]int{1, 2, taps}, mlxc.BFloat16, 0, 1, mlxc.RandomKey(uint64(900+cycle)))
			base := cAt.Offset()
			at := dSl.ForwardAt(ids, mlxc.Concatenate([]*mlxc.Array{ctx, extra}, 1), mlxc.FromSlice([]int32{int32(T)}, 1), cAt)
			full := dFull.Forward(ids, ctx, cFull)
			wideOut := dWide.Forward(ids, ctx, cWide)
			for _, c := range []struct {
				name string
				got  *mlxc.Array
			}{{"Forward", got}, {"Forward, padded keys", pad}, {"ForwardAt", at}} {
				diff, scale, wa, ga := compareDrafts(want, c.got)
				worst = max(worst, diff/scale)
				tol := 0.02 * scale
				if testenv.ShapeExact() {
					tol = 0 // the CPU: the same ops in the same order, bit for bit
				}
				if diff > tol || !sameDrafts(want, wa, ga, 0.02*scale, testenv.ShapeExact()) {
					s.Close()
					return fmt.Errorf("cycle %d, %s: logits differ from the windowed reference by %g (scale %g); drafts %v, want %v", cycle, c.name, diff, scale, ga, wa)
				}
			}
			if diff, scale, _, _ := compareDrafts(full, want); diff > 0.05*scale {
				differs++
			}
			diff, _, fa, wa := compareDrafts(full, wideOut)
			err := cAt.SetOffset(base + T)
			s.Close()
			if err != nil {
				return err
			}
			if diff != 0 || fmt.Sprint(fa) != fmt.Sprint(wa) {
				return fmt.Errorf("cycle %d: a window covering everything (not causal) differs from full attention by %g", cycle, diff)
			}
		}
		history.Free()
		for _, a := range w {
			a.Free()
		}
		if differs == 0 {
			return fmt.Errorf("the sliding drafter drafts what the full one does: the window did not bite")
		}
		t.Logf("largest difference from the reference: %.3g of the logits' scale; the full drafter differed in %d of 6 cycles", worst, differs)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// layer_types must name a known kind for every layer, and sliding layers need a window:
// each mistake is one clear error at load.
func TestDrafterLayerTypesErrors(t *testing.T) {
	dir := t.TempDir()
	err := mlxc.Do(func() error {
		target, ds, err := slidingPair(dir)
		if err != nil {
			return err
		}
		defer target.Free()
		cases := []struct {
			name string
			edit func(map[string]any)
			want string
		}{
			{"too few", func(m map[string]any) { m["layer_types"] = []string{"full_attention"} }, "layer_types has 1 entries for 3 layers"},
			{"unknown", func(m map[string]any) {
				m["layer_types"] = []string{"full_attention", "linear_attention", "full_attention"}
			}, `layer_types[1] is linear_attention`},
			{"no window", func(m map[string]any) {
				m["layer_types"] = []string{"sliding_attention", "full_attention", "full_attention"}
				delete(m, "sliding_window")
			}, "need a positive sliding_window"},
			{"not a list", func(m map[string]any) { m["layer_types"] = "full_attention" }, "layer_types must be a list"},
			{"is_causal", func(m map[string]any) { m["is_causal"] = "yes" }, "is_causal must be"},
		}
		for _, c := range cases {
			p, err := writeVariant(dir, strings.ReplaceAll(c.name, " ", "-"), ds, c.edit)
			if err != nil {
				return err
			}
			d, err := draft.Load(p, target, draft.LoadOptions{})
			if err == nil {
				d.Free()
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: err = %v, want mention of %q", c.name, err, c.want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A drafter made for another target fails to load against a Qwen3.5 target with one error
// that names the mismatch: a Qwen3 drafter's vocabulary, a larger Qwen3.5's layer ids.
func TestDrafterForOtherTargetRejected(t *testing.T) {
	dir := t.TempDir()
	err := mlxc.Do(func() error {
		target, ds, err := slidingPair(dir)
		if err != nil {
			return err
		}
		defer target.Free()
		qwen3 := modelgen.DrafterFor(modelgen.TinyQwen3(), 2)
		qwen3.Vocab = ds.Vocab + 64
		big := modelgen.Qwen35Spec{Hidden: ds.Hidden, Layers: 64, Heads: ds.Heads, KVHeads: ds.KVHeads, HeadDim: ds.HeadDim, Inter: ds.Inter, Vocab: ds.Vocab}
		other := modelgen.DrafterForQwen35(big, 5) // taps 1, 16, 31, 46, 61
		other.NumTargetLayers = 0
		for _, c := range []struct {
			name string
			spec modelgen.DrafterSpec
			want string
		}{
			{"qwen3", qwen3, fmt.Sprintf("vocab_size %d does not match the target's %d (a drafter for another target?)", qwen3.Vocab, ds.Vocab)},
			{"qwen3.5-27b", other, "target_layer_ids has 16, outside the target's 6 layers (a drafter for another target?)"},
		} {
			p, err := writeVariant(dir, c.name, c.spec, nil)
			if err != nil {
				return err
			}
			d, err := draft.Load(p, target, draft.LoadOptions{})
			if err == nil {
				d.Free()
			}
			if err == nil || !strings.Contains(err.Error(), c.want) || strings.Count(err.Error(), "another target") != 1 {
				t.Errorf("%s: err = %v, want one error mentioning %q", c.name, err, c.want)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
