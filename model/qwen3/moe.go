package qwen3

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/moe"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

func init() { model.Register("qwen3_moe", loadQwen3MoE) }

// moeConfig is the sparse MLP of a qwen3_moe model (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B):
// which layers have it and its shape. Qwen3-MoE has no shared expert.
type moeConfig struct {
	experts, topK, inter int
	normTopK             bool
	sparseStep           int
	mlpOnly              []int
}

// sparse reports whether layer i has the MoE MLP: mlx-lm's rule, layers not listed in
// mlp_only_layers whose index+1 is a multiple of decoder_sparse_step.
func (c *moeConfig) sparse(i int) bool {
	return c != nil && c.experts > 0 && !slices.Contains(c.mlpOnly, i) && (i+1)%c.sparseStep == 0
}

// parseMoEConfig reads the qwen3_moe keys; layers is num_hidden_layers. The defaults are
// those of Hugging Face's Qwen3MoeConfig (mlx-lm requires every key).
func parseMoEConfig(cfg *model.RawConfig, layers int) (*moeConfig, error) {
	c := &moeConfig{}
	err := cfg.PositiveInts(model.Field("num_experts", &c.experts), model.Field("num_experts_per_tok", &c.topK),
		model.Field("moe_intermediate_size", &c.inter))
	if err != nil {
		return nil, err
	}
	if c.topK > c.experts {
		return nil, fmt.Errorf("%s: num_experts_per_tok %d must be at most num_experts %d", cfg.Path, c.topK, c.experts)
	}
	if c.normTopK, err = cfg.BoolOr("norm_topk_prob", false); err != nil {
		return nil, err
	}
	if c.sparseStep, err = cfg.IntOr("decoder_sparse_step", 1); err != nil {
		return nil, err
	}
	if c.sparseStep <= 0 {
		return nil, fmt.Errorf("%s: decoder_sparse_step must be positive, got %d", cfg.Path, c.sparseStep)
	}
	if c.mlpOnly, err = cfg.IntList("mlp_only_layers"); err != nil {
		return nil, err
	}
	for _, i := range c.mlpOnly {
		if i < 0 || i >= layers {
			return nil, fmt.Errorf("%s: mlp_only_layers lists layer %d, outside [0, %d)", cfg.Path, i, layers)
		}
	}
	return c, nil
}

func loadQwen3MoE(cfg *model.RawConfig, w *model.Weights, q *model.QuantConfig, s settings.Settings) (model.Model, error) {
	a, inter, err := parseQwen3Arch(cfg)
	if err != nil {
		return nil, err
	}
	a.Family = "qwen3_moe"
	mc, err := parseMoEConfig(cfg, a.NumLayers)
	if err != nil {
		return nil, err
	}
	a.Experts, a.ExpertsPerToken = mc.experts, mc.topK
	if err := stackExperts(w, mc.experts); err != nil {
		return nil, err
	}
	return newQwen3(cfg, w, q, s, a, inter, mc)
}

// perExpert matches a Hugging Face export's per-expert tensor names.
var perExpert = regexp.MustCompile(`^(model\.layers\.\d+\.mlp\.)experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$`)

// stackExperts rewrites a Hugging Face qwen3_moe checkpoint's per-expert tensors
// (mlp.experts.{e}.{gate,up,down}_proj.weight) into mlx-lm's stacked
// mlp.switch_mlp.{…}.weight [E, out, in], as its sanitize does. Every expert 0..E-1 of
// each projection must be there with one shape and dtype; an expert index of E or more
// means the config's num_experts is wrong, and the error says so with both counts.
func stackExperts(w *model.Weights, experts int) error {
	groups := map[string]map[int]string{} // stacked name → expert index → per-expert name
	for name := range w.Info {
		m := perExpert.FindStringSubmatch(name)
		if m == nil {
			continue
		}
		e, _ := strconv.Atoi(m[2])
		to := m[1] + "switch_mlp." + m[3] + ".weight"
		if groups[to] == nil {
			groups[to] = map[int]string{}
		}
		groups[to][e] = name
	}
	// In name order, so that the error for a checkpoint is always the same one.
	stacked := slices.Sorted(maps.Keys(groups))
	for _, to := range stacked {
		if n := slices.Max(slices.Collect(maps.Keys(groups[to]))) + 1; n > experts {
			return fmt.Errorf("the checkpoint has %d experts (%s) but the config has num_experts %d", n, groups[to][n-1], experts)
		}
	}
	for _, to := range stacked {
		parts := groups[to]
		first := w.Info[parts[slices.Min(slices.Collect(maps.Keys(parts)))]]
		for e := range experts {
			name, ok := parts[e]
			if !ok {
				return fmt.Errorf("expert tensor %s is missing from the checkpoint (num_experts %d)", expertTensor(to, e), experts)
			}
			if info := w.Info[name]; !slices.Equal(info.Shape, first.Shape) || info.Dtype != first.Dtype {
				return fmt.Errorf("tensor %s has shape %v %s, but %s has %v %s", name, info.Shape, info.Dtype, first.Name, first.Shape, first.Dtype)
			}
		}
	}
	for _, to := range stacked {
		names := make([]string, experts)
		arrs := make([]*mlxc.Array, experts)
		for e := range experts {
			names[e] = groups[to][e]
			arrs[e], _ = w.Take(names[e])
		}
		a := mlxc.Stack(arrs, 0)
		for _, part := range arrs {
			part.Free() // the stack holds what it needs of them
		}
		w.Combine(to, a, names)
	}
	return nil
}

// expertTensor names expert e's tensor of a stacked one (the inverse of stacking).
func expertTensor(stacked string, e int) string {
	m := regexp.MustCompile(`^(.*\.mlp\.)switch_mlp\.(.*)$`).FindStringSubmatch(stacked)
	return fmt.Sprintf("%sexperts.%d.%s", m[1], e, m[2])
}

// newMoEBlock takes layer i's sparse MLP (prefix p: "model.layers.{i}.").
func newMoEBlock(b *model.Builder, w *model.Weights, q *model.QuantConfig, p string, H int, mc *moeConfig, sw *model.SwiGLU) (*moe.Block, error) {
	return moe.New(b, w, q, p+"mlp", moe.Config{Hidden: H, Experts: mc.experts, TopK: mc.topK, Inter: mc.inter,
		NormTopK: mc.normTopK, SwiGLU: sw})
}
