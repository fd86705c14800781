package qwen35

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
)

// MTP is the checkpoint's multi-token-prediction head (mtp.*): fc over the concatenation
// of the normed embedding of a token and the normed hidden row before it, full-attention
// decoder layers of the target's family (gated attention; the sparse MoE MLP in a
// qwen3_5_moe checkpoint) over the head's own KV cache, and a final norm. It shares the
// target's embedding and LM head and holds no copy of them.
//
// One Step predicts, for each input pair, the token after the next: the pair at cache slot
// i is (t[i+1], h[i]), h[i] being the target's final-normed hidden row at position i (the
// row its LM head reads, TargetHidden), and its logits predict t[i+2]. Slots are RoPE
// positions: slot i rotates at position i, whatever the token's position in the text.
//
// A proposer drafts k tokens after the target committed a bonus token b at position n:
//
//	out := h.Step(ids{b}, hid{target row n−1}, c, model.LogitsLast)   // slot n−1
//	d1 := sample(out.Logits)
//	out = h.Step(ids{d1}, out.Hidden, c, model.LogitsLast)            // slot n, own hidden
//	d2 := sample(out.Logits) …
//
// and after the target's verify accepts a of the drafts, c.Truncate(n−1) drops the slots
// written while drafting and one Step over the accepted pairs with the target's verify
// rows (exact pairs, MTP.md §5.3) refills them and gives the next first draft. Prefill is
// one Step over the prompt's pairs (t[1..P−1] and the first sampled token, with the target
// rows 0..P−1).
//
// A head with several layers (mtp_num_hidden_layers > 1, unpublished) runs them all in
// order at every step, as mlx-vlm's drafter does. Like the target, it runs on the MLX
// thread.
type MTP struct {
	m                         *Model
	fc                        *model.Linear
	preEmbed, preHidden, norm *mlxc.Array
	layers                    []layer // full attention, with the target's kind of MLP
}

// MTPOutput is one Step's result; arrays are lazy and belong to the caller's scope.
type MTPOutput struct {
	// Hidden is the head's output rows [B, L, H] after its final norm: the rows its
	// logits come from, and the hidden input of the next autoregressive step.
	Hidden *mlxc.Array
	// Logits [B, L or 1, V] (nil with model.LogitsNone) through the target's LM head.
	Logits *mlxc.Array
}

// MTP returns the multi-token-prediction head, nil when the model was loaded without
// model.LoadOptions.MTP or the checkpoint has none (RequireMTP says which).
func (m *Model) MTP() *MTP { return m.mtp }

// RequireMTP returns the head, or an error wrapping model.ErrNoMTP that says why there is
// none, for a command line to show.
func (m *Model) RequireMTP() (*MTP, error) {
	if m.mtp == nil {
		return nil, fmt.Errorf("%w: %s", model.ErrNoMTP, m.noMTP)
	}
	return m.mtp, nil
}

// TargetLayers is the target's layer count: its last layer's rows (tap TargetLayers−1)
// are what TargetHidden takes.
func (h *MTP) TargetLayers() int { return h.m.Arch().NumLayers }

// Layers is the head's decoder layer count (mtp_num_hidden_layers).
func (h *MTP) Layers() int { return len(h.layers) }

// TargetHidden is the hidden input of a step for the target's rows before its final norm
// (its last layer's output, ForwardOptions.Taps of layer NumLayers−1): the final norm of
// them, as the target's LM head reads them.
func (h *MTP) TargetHidden(last *mlxc.Array) *mlxc.Array { return h.m.FinalNorm(last).X() }

// mtpLayers is the number of MTP layers to build: 0 when the caller did not ask for the
// head or the checkpoint (after sanitize) has no tensor under mtpPrefix, else
// mtp_num_hidden_layers (text_config first, then the top level; default 1), or where it is
// 0 the layers the tensors name: the tensors decide whether there is a head, never the
// config alone (MTP.md §2.5), and the Builder refuses a head whose tensors the count does
// not match.
func (m *Model) mtpLayers(raw *model.RawConfig, w *model.Weights) (int, error) {
	if !w.MTP {
		m.noMTP = "the model was loaded without its multi-token-prediction head (model.LoadOptions.MTP)"
		return 0, nil
	}
	named := map[int]bool{}
	found := false
	for name := range w.Info {
		rest, ok := strings.CutPrefix(name, mtpPrefix)
		if !ok {
			continue
		}
		found = true
		if idx, ok := strings.CutPrefix(rest, "layers."); ok {
			if i, err := strconv.Atoi(strings.SplitN(idx, ".", 2)[0]); err == nil {
				named[i] = true
			}
		}
	}
	if !found {
		m.noMTP = filepath.Dir(raw.Path) + ": the checkpoint has no mtp.* tensors (most MLX conversions drop them; the original Hugging Face release and -MTP conversions keep them)"
		return 0, nil
	}
	n, err := mtpDeclared(raw)
	if err != nil {
		return 0, err
	}
	if n == 0 {
		n = max(len(named), 1)
	}
	return n, nil
}

// mtpDeclared reads mtp_num_hidden_layers from text_config, else the top level (1 when
// neither has it); it must not be negative.
func mtpDeclared(raw *model.RawConfig) (int, error) {
	tc, err := textConfig(raw)
	if err != nil {
		return 0, err
	}
	for _, c := range []*model.RawConfig{tc, raw} {
		if _, ok := c.M["mtp_num_hidden_layers"]; !ok {
			continue
		}
		n, err := c.IntOr("mtp_num_hidden_layers", 1)
		if err != nil {
			return 0, err
		}
		if n < 0 {
			return 0, fmt.Errorf("%s: \"mtp_num_hidden_layers\" must not be negative, got %d", c.Path, n)
		}
		return n, nil
	}
	return 1, nil
}

// mtpProblems says that the problems of a failed build are the MTP head's when those
// listed all name its tensors, so that the user knows what to do about them.
func mtpProblems(err error, nMTP int) error {
	if nMTP == 0 {
		return err
	}
	for _, line := range strings.Split(err.Error(), "\n") {
		if !strings.Contains(line, mtpPrefix) && !strings.HasPrefix(line, "... and ") {
			return err
		}
	}
	return fmt.Errorf("the checkpoint's multi-token-prediction head is incomplete or mis-shaped (loading without model.LoadOptions.MTP ignores its tensors):\n%w", err)
}

// buildMTP takes the head's n layers and its fc and norms from b (under mtpPrefix, after
// sanitize), checked like the target's: a tensor missing, of the wrong shape or left over
// is reported by name when b finishes. Quantization is decided per tensor as for the
// target (a .scales tensor, or config.json's per-module entry).
func (m *Model) buildMTP(b *model.Builder, w *model.Weights, q *model.QuantConfig, n int) error {
	H := m.global.Hidden
	h := &MTP{m: m, layers: make([]layer, n)}
	h.fc = b.Linear(mtpPrefix+"fc", H, 2*H, false)
	h.preEmbed = b.Float(mtpPrefix+"pre_fc_norm_embedding.weight", H)
	h.preHidden = b.Float(mtpPrefix+"pre_fc_norm_hidden.weight", H)
	h.norm = b.Float(mtpPrefix+"norm.weight", H)
	for i := range h.layers {
		p := fmt.Sprintf("%slayers.%d.", mtpPrefix, i)
		l := &h.layers[i]
		l.inputNorm = b.Float(p+"input_layernorm.weight", H)
		l.postNorm = b.Float(p+"post_attention_layernorm.weight", H)
		l.attn = m.buildAttention(b, p+"self_attn.")
		if err := m.buildMLP(b, w, q, p, l); err != nil {
			return fmt.Errorf("multi-token-prediction head: %w", err)
		}
	}
	m.mtp = h
	return nil
}

// MTPCache is the head's per-sequence state: one KV cache per MTP layer. Slot i holds the
// pair (t[i+1], h[i]) (MTP's doc); Offset is the number of slots.
type MTPCache struct {
	*cache.List
	kv []*model.KVCache
}

// NewCache makes an empty cache for the head.
func (h *MTP) NewCache() *MTPCache {
	c := &MTPCache{kv: make([]*model.KVCache, len(h.layers))}
	ls := make([]cache.Layer, len(h.layers))
	for i := range c.kv {
		c.kv[i] = &model.KVCache{}
		ls[i] = c.kv[i]
	}
	c.List = cache.NewList(ls...)
	return c
}

// Truncate rolls the cache back to its first n slots (a proposer's rollback after a
// verify); the dropped rows are overwritten by the next step. n must be in [0, Offset].
func (c *MTPCache) Truncate(n int) error {
	if n < 0 || n > c.Offset() {
		return fmt.Errorf("mtp cache: cannot truncate %d slots to %d", c.Offset(), n)
	}
	return c.Rewind(c.Offset() - n)
}

// Step runs the head over the pairs (ids[b, j], hidden[b, j]) of B sequences of L rows
// each (ids [B, L] int32: the tokens after the rows of hidden; hidden [B, L, H]: the
// target's final-normed rows, TargetHidden, or a previous Step's Hidden), appending L
// slots to c at its offset, and returns the head's output rows and the logits that mode
// asks for (the next token after each ids row's successor). It panics with an
// *mlxc.Error on arguments that do not fit (the target's Forward does too).
func (h *MTP) Step(ids, hidden *mlxc.Array, c *MTPCache, mode model.LogitsMode) MTPOutput {
	m := h.m
	H, eps := m.cfg.Hidden, m.cfg.Eps
	if c == nil || len(c.kv) != len(h.layers) {
		fail("mtp: cache does not belong to this head")
	}
	sh, hs := ids.Shape(), hidden.Shape()
	if len(sh) != 2 || len(hs) != 3 || hs[0] != sh[0] || hs[1] != sh[1] || hs[2] != H {
		fail("mtp: ids must be [B, L] and hidden [B, L, %d], got %v and %v", H, sh, hs)
	}
	B, L := sh[0], sh[1]
	rows := B * L
	e := m.embed.Lookup(mlxc.Reshape(ids, rows))
	x := mlxc.Concatenate([]*mlxc.Array{
		mlxc.RMSNorm(e, h.preEmbed, eps),
		mlxc.RMSNorm(mlxc.Reshape(hidden, rows, H), h.preHidden, eps),
	}, -1)
	x = h.fc.Apply(x)
	p := &pass{m: m, B: B, L: L, rows: rows}
	p.KVPass = model.NewKVPass("qwen3_5.mtp", B, L, model.ForwardOptions{}, m.fqa, c.kv[0].Offset(), nil)
	for i := range h.layers {
		x = p.decoder(&h.layers[i], c.kv[i], nil, x)
	}
	out := model.NormOf(x, h.norm, eps)
	res := MTPOutput{Hidden: mlxc.Reshape(out.X(), B, L, H)}
	switch mode {
	case model.LogitsAll:
		res.Logits = mlxc.Reshape(m.Head(out), B, L, -1)
	case model.LogitsLast:
		last := out
		if L > 1 {
			last = model.NormedAs(nil, mlxc.Reshape(mlxc.SliceAxis(res.Hidden, 1, L-1, L), B, H))
		}
		res.Logits = mlxc.Reshape(m.Head(last), B, 1, -1)
	}
	return res
}
