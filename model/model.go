package model

import (
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// Arch is what callers (the drafter, the engine, the server) need to know of a model.
type Arch struct {
	Family         string // model_type
	HiddenSize     int
	NumLayers      int
	VocabSize      int
	NumHeads       int
	NumKVHeads     int
	HeadDim        int
	MaxPositions   int
	RMSNormEps     float32
	RopeTheta      float64
	Dtype          mlxc.Dtype // activation dtype (that of the embedding / scales)
	EOSTokenIDs    []int
	TiedEmbeddings bool
	Quantized      bool
	WeightBytes    int64
	TrimmableCache bool // false for recurrent families (rewind by replay)
	// Experts and ExpertsPerToken describe a MoE target's routed experts (0 for a dense
	// model): a verify block of B rows reads up to B·ExpertsPerToken of them per layer.
	Experts, ExpertsPerToken int
}

// LogitsMode selects which positions get logits.
type LogitsMode int

const (
	LogitsAll  LogitsMode = iota // every input position (verify)
	LogitsLast                   // only the last position (decode)
	LogitsNone                   // none (prefill chunks: mlx-lm never evaluates them)
)

// ForwardOptions controls one forward pass.
type ForwardOptions struct {
	// Taps lists decoder-layer indices whose residual outputs (after the layer, before the
	// final norm) are returned, concatenated on the feature axis in this order.
	Taps   []int
	Logits LogitsMode
	// KeyBucket > 0 pads the keys of multi-token blocks (2..64 tokens) to a multiple of it
	// with an additive mask instead of the causal mode, so the attention's key length, and
	// with it the CUDA backend's cached cuDNN plan, changes only every KeyBucket positions
	// (see KeyBucketDefault). 0: exact key length.
	KeyBucket int
	// RowwiseAttention computes a multi-token block's attention (2..64 tokens) one query
	// row at a time, each over exactly the keys it sees, which is the computation of a
	// one-token decode step: on a GPU the block then rounds like decoding (see
	// GPUExactDefault). Costs nodes; off by default.
	RowwiseAttention bool
	// Pos, when set (int32 [1], computed on the device), is the position of the first row,
	// for a block built before the host knows how many rows of the previous one are kept
	// (the engine's run-ahead loop): the rows are written to the cache there
	// (KVCache.WriteAt), row i attends to keys ≤ Pos+i, and the cache's offset is left for
	// the caller to set (the caches' run-ahead capability, cache.Placed). Window bounds
	// Pos+L; B must be 1.
	Pos    *mlxc.Array
	Window int
}

// Output of a forward pass; arrays are lazy and belong to the caller's scope.
type Output struct {
	Logits *mlxc.Array // [B, L or 1, V], nil with LogitsNone
	Hidden *mlxc.Array // [B, L, len(Taps)·H], nil without taps
}

// Model is a loaded target model.
type Model interface {
	Arch() Arch
	NewCache() Cache
	// Forward runs ids [B, L] (int32) through the model at the cache's offset and appends
	// them to the cache.
	Forward(ids *mlxc.Array, c Cache, opt ForwardOptions) Output
	// Embed looks up token embeddings (the drafter embeds its block with these).
	Embed(ids *mlxc.Array) *mlxc.Array
	// Head maps normed hidden rows to logits (tied embedding or lm_head): x carries the
	// rows and the norm to apply (the caller's: the target's final norm, a drafter's own).
	Head(x *Normed) *mlxc.Array
	// Free releases the weights.
	Free()
}

// Family builds a model of one model_type from its config and validated weights.
type Family func(cfg *RawConfig, w *Weights, q *QuantConfig, s settings.Settings) (Model, error)

// The family registry maps a config's model_type to its Family. Family code registers
// itself from an init function, in this package or its own, so that adding a family
// touches no other family and no dispatch code; tests may register test families.
var (
	familiesMu sync.RWMutex
	families   = map[string]Family{}
)

// Register adds a family for a model_type. Registering one model_type twice panics: two
// families cannot answer to one name.
func Register(modelType string, f Family) {
	familiesMu.Lock()
	defer familiesMu.Unlock()
	if modelType == "" || f == nil {
		panic("model.Register: empty model_type or nil family")
	}
	if _, dup := families[modelType]; dup {
		panic(fmt.Sprintf("model.Register: model_type %q registered twice", modelType))
	}
	families[modelType] = f
}

// LookupFamily returns the family registered for a model_type.
func LookupFamily(modelType string) (Family, bool) {
	familiesMu.RLock()
	defer familiesMu.RUnlock()
	f, ok := families[modelType]
	return f, ok
}

// Families lists the registered model types.
func Families() []string {
	familiesMu.RLock()
	defer familiesMu.RUnlock()
	out := make([]string, 0, len(families))
	for k := range families {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// LoadOptions tunes Load.
type LoadOptions struct {
	Progress Progress
	// Settings picks the custom kernels and GPU-exact mode (nil: settings.Default()).
	Settings *settings.Settings
	// Shard, when it splits, loads this rank's part of a tensor-parallel model (nil: the
	// whole model). Families that cannot split are refused.
	Shard *Shard
	// MTP loads the checkpoint's multi-token-prediction head too, where the family has one
	// and the checkpoint carries it (qwen35: Model.MTP); off, its tensors are dropped at
	// load and cost no memory. A checkpoint without the head loads as it would without the
	// option: the family reports ErrNoMTP when the head is asked for.
	MTP bool
}

// Load reads a model folder: config, headers (validated), weights, family dispatch.
// It must run on the MLX thread. Weights are evaluated before it returns, so a bad file
// fails here, not during the first token.
func Load(dir string, opt LoadOptions) (Model, error) {
	cfg, err := ReadConfig(dir)
	if err != nil {
		return nil, err
	}
	mt, err := cfg.StringOr("model_type", "")
	if err != nil {
		return nil, err
	}
	if mt == "" {
		return nil, cfg.missing("model_type")
	}
	s := settings.Default()
	if opt.Settings != nil {
		s = *opt.Settings
	}
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("load %s: %w", dir, err)
	}
	fam, ok := LookupFamily(mt)
	if !ok {
		return nil, fmt.Errorf("%s: model_type %q is not supported (supported: %s)", cfg.Path, mt, strings.Join(Families(), ", "))
	}
	q, err := cfg.ParseQuantization()
	if err != nil {
		return nil, err
	}
	w, err := ReadWeightHeaders(dir)
	if err != nil {
		return nil, err
	}
	if err := w.Load(opt.Progress); err != nil {
		return nil, err
	}
	// What the family makes on the way (sanitize's intermediates, slices of fused
	// tensors) dies with this scope: the model keeps only the arrays it detached, and an
	// intermediate view left in the caller's scope would hold its source's memory.
	sc := mlxc.NewScope()
	defer sc.Close()
	w.Shard = opt.Shard
	w.MTP = opt.MTP
	m, err := fam(cfg, w, q, s)
	if err != nil {
		w.Free()
		return nil, fmt.Errorf("load %s: %w", dir, err)
	}
	if opt.Shard.Split() && !w.shardTaken {
		m.Free()
		return nil, fmt.Errorf("load %s: model_type %q cannot be split over ranks (tensor parallelism: qwen3)", dir, mt)
	}
	if err := mlxc.Catch(func() {
		evalModel(m)
		if p, ok := m.(Preparer); ok {
			p.Prepare()
		}
	}); err != nil {
		m.Free()
		return nil, fmt.Errorf("load %s: reading weights: %w", dir, err)
	}
	return m, nil
}

// WeightLister is a model that lists its weights, so that Load evaluates them (in batches)
// before it returns and a bad file fails at load, not at the first token.
type WeightLister interface{ WeightArrays() []*mlxc.Array }

// Preparer is a model that makes per-weight views once its weights are evaluated.
type Preparer interface{ Prepare() }

func evalModel(m Model) {
	if e, ok := m.(WeightLister); ok {
		ws := e.WeightArrays()
		// Evaluate in batches so a huge model does not build one giant eval list.
		for i := 0; i < len(ws); i += 64 {
			j := min(i+64, len(ws))
			mlxc.Eval(ws[i:j]...)
		}
	}
}
