package verify

import (
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/sample"
)

// Proposal is a drafter's guess for the next n tokens.
type Proposal struct {
	Tokens *mlxc.Array // int32 [n], lazy
	// Probs are the distributions the tokens were drawn from (float32 [n, V]); nil means the
	// proposal is deterministic (a point mass on each token), as for greedy drafts.
	Probs *mlxc.Array
	// Cands, when asked for (RowDraft.Cands) and the drafts are greedy, are the drafter's
	// most likely tokens at each position, int32 [n, K], with their logits CandLogits
	// float32 [n, K], in no particular order: a constrained sequence picks its drafts among
	// them under its grammar. Nil otherwise.
	Cands, CandLogits *mlxc.Array
}

// Proposer drafts tokens. Calls come in this order per sequence: Begin, Context (for every
// prefill chunk), then Propose once per cycle; End releases per-sequence state.
type Proposer interface {
	// TapLayers names the target layers whose outputs the proposer needs as context.
	TapLayers() []int
	// BlockSize is the largest block (staged token + drafts) the proposer handles.
	BlockSize() int
	Begin()
	// Context appends the target's tapped hidden rows [1, T, n·H] for committed prompt
	// positions (lazy; nil when no taps).
	Context(ctx *mlxc.Array)
	// Propose drafts n tokens after staged, which sits at position pos (the number of
	// tokens committed to the target). ctx holds the hidden rows of the positions committed
	// by the previous cycle (nil on the first cycle after prefill).
	Propose(staged int32, pos int, ctx *mlxc.Array, n int, sp sample.Params, keys *sample.Keys) Proposal
	End()
}
