package qwen35

import (
	"fmt"
	"strings"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
)

// shiftedNorms are the norm families that raw HF checkpoints store zero-centred (the
// module computes 1+w); linear_attn.norm is not one of them. The last three are the MTP
// head's own (its final norm and the two before fc); its layers' norms carry the target's
// suffixes.
var shiftedNorms = []string{".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight", ".q_norm.weight", ".k_norm.weight",
	"mtp.norm.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight"}

// mtpPrefix is where sanitize leaves the MTP head's tensors, whether the checkpoint named
// them mtp.* (raw HF) or language_model.mtp.* (MLX conversions that keep the head).
const mtpPrefix = prefix + "mtp."

// dropMTP removes the multi-token-prediction head's tensors (any name with "mtp." in it,
// as mlx-lm drops them), before anything reads them: a head nobody asked for costs no
// memory, and a broken one does not fail the load.
func dropMTP(w *model.Weights) {
	for _, name := range names(w) {
		if strings.Contains(name, "mtp.") {
			w.Drop(name)
		}
	}
}

// sanitize rewrites a checkpoint's tensors in place into mlx-lm's post-sanitize form, so
// that raw HF and mlx-community checkpoints load alike: vision tensors dropped, names under
// language_model., conv weights [C, K, 1], and (raw HF only, recognised by its conv layout)
// the five norm families shifted by one in their stored dtype. MTP tensors still there
// (dropMTP did not run) go under mtpPrefix and their norms are shifted by the same rule,
// so exactly once: an MLX conversion stored them shifted already, whatever their names
// (the double shift that the presence of mtp.* tensors used to cause elsewhere).
func sanitize(w *model.Weights, tied bool) {
	// Intermediate arrays (the added constant) die with this scope; the rewritten
	// tensors are detached from it.
	sc := mlxc.NewScope()
	defer sc.Close()
	for _, name := range names(w) {
		switch {
		case strings.HasPrefix(name, "vision_tower"), strings.HasPrefix(name, "model.visual"):
			w.Drop(name)
		case strings.HasPrefix(name, "model.language_model"):
			w.Rename(name, "language_model.model"+strings.TrimPrefix(name, "model.language_model"))
		case strings.HasPrefix(name, "language_model."):
		default:
			w.Rename(name, "language_model."+name)
		}
	}
	raw := false
	for name, info := range w.Info {
		if strings.Contains(name, "conv1d.weight") && len(info.Shape) > 0 && info.Shape[len(info.Shape)-1] != 1 {
			raw = true
		}
	}
	if tied {
		for _, sfx := range []string{"weight", "scales", "biases"} {
			if name := "language_model.lm_head." + sfx; w.Has(name) {
				w.Drop(name)
			}
		}
	}
	for _, name := range names(w) {
		info := w.Info[name]
		switch {
		case strings.Contains(name, "conv1d.weight") && len(info.Shape) == 3 && info.Shape[2] != 1:
			w.Replace(name, mlxc.SwapAxes(w.Arrays[name], 1, 2), []int{info.Shape[0], info.Shape[2], info.Shape[1]})
		case raw && len(info.Shape) == 1 && hasAnySuffix(name, shiftedNorms):
			a := w.Arrays[name]
			w.Replace(name, mlxc.Add(a, mlxc.Scalar(1, a.Dtype())), info.Shape)
		}
	}
}

func hasAnySuffix(s string, sfx []string) bool {
	for _, x := range sfx {
		if strings.HasSuffix(s, x) {
			return true
		}
	}
	return false
}

// names lists the checkpoint's tensor names (a copy, so the set may change meanwhile).
func names(w *model.Weights) []string {
	out := make([]string, 0, len(w.Info))
	for n := range w.Info {
		out = append(out, n)
	}
	return out
}

// splitExperts rewrites a raw HF qwen3_5_moe checkpoint's fused expert tensors into
// mlx-lm's switch_mlp form: mlp.experts.gate_up_proj [E, 2·I, H] split in half along the
// output axis into gate_proj and up_proj, and mlp.experts.down_proj renamed. Names are
// matched in any of the stored prefixes, before sanitize moves them under language_model.
func splitExperts(w *model.Weights) error {
	// The slices between the fused tensor and its contiguous halves die with this scope:
	// a slice left alive in a caller's scope would keep the whole fused tensor's memory.
	sc := mlxc.NewScope()
	defer sc.Close()
	for _, name := range names(w) {
		base, ok := strings.CutSuffix(name, ".mlp.experts.gate_up_proj")
		if !ok {
			continue
		}
		info := w.Info[name]
		if len(info.Shape) != 3 || info.Shape[1]%2 != 0 {
			return fmt.Errorf("tensor %s has shape %v, want [experts, 2·moe_intermediate_size, hidden]", name, info.Shape)
		}
		down := base + ".mlp.experts.down_proj"
		if !w.Has(down) {
			return fmt.Errorf("tensor %s is missing from the checkpoint (its layer has %s)", down, name)
		}
		a, _ := w.Take(name)
		E, I2, H := info.Shape[0], info.Shape[1], info.Shape[2]
		sw := base + ".mlp.switch_mlp."
		for j, part := range []string{"gate_proj", "up_proj"} {
			to := sw + part + ".weight"
			half := info
			half.Name = to
			w.Info[to] = half
			w.File[to] = w.File[name]
			w.Replace(to, mlxc.Contiguous(mlxc.SliceAxis(a, 1, j*I2/2, (j+1)*I2/2)), []int{E, I2 / 2, H})
		}
		a.Free()
		delete(w.Info, name)
		delete(w.File, name)
		w.Rename(down, sw+"down_proj.weight")
	}
	return nil
}
