package engine

import (
	"errors"
	"fmt"
	"time"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/sample"
)

// Detokenizer turns token ids into text incrementally (UTF-8 safe). The tokenizer package
// provides one; the engine only needs this much of it.
type Detokenizer interface {
	Add(id int32) string
	Flush() string
}

// Request is one generation.
type Request struct {
	Prompt    []int32
	MaxTokens int
	Sampling  sample.Params
	// Stop strings end the generation when they appear in the text; they are not emitted.
	Stop []string
	// StopTokens end the generation (not emitted). Nil means the model's EOS ids.
	StopTokens []int32
	IgnoreEOS  bool
	// BlockSize caps the DFlash block (staged token + drafts); 0 = the drafter's.
	BlockSize int
	// NoDraft forces plain decoding even when a drafter is loaded.
	NoDraft bool
	// Detok, when set, produces Event.Text and enables Stop.
	Detok Detokenizer
	// PrefixMarks are prompt positions where the prefix cache also keeps a recurrent
	// target's state (the starts of a chat's messages: where the next request's prompt may
	// leave this one's). Attention layers need none: they resume at any position.
	PrefixMarks []int
	// Profile adds a synchronisation after each draft to split draft and verify time
	// (slightly slower; for benchmarks).
	Profile bool
	// Constraint, when set, is the grammar the output must follow: each step's logits are
	// masked to the tokens it allows after the committed ones (drafts are verified against
	// their positions' masks), and its stop ends the generation. The caller makes it for
	// this request and closes it after the request ends.
	Constraint Constraint
	// Wire is the request as the other ranks of a split target rebuild it (their
	// RequestBuilder reads it): needed by a Lockstep scheduler, unused otherwise.
	Wire []byte
}

// Event is what one step or cycle commits.
type Event struct {
	Tokens []int32
	Text   string
}

// Finish reasons.
const (
	FinishStop      = "stop"
	FinishLength    = "length"
	FinishCancelled = "cancelled"
)

// ErrPromptTooLong is returned when the prompt does not fit the model's context.
var ErrPromptTooLong = errors.New("prompt is longer than the model's context")

// Stats are the honest numbers of one generation.
type Stats struct {
	Mode            string `json:"mode"` // "plain" or "dflash"
	PromptTokens    int    `json:"prompt_tokens"`
	GeneratedTokens int    `json:"generated_tokens"`
	// RunAhead: the DFlash cycles ran with the run-ahead loop (Engine.RunAhead); its Build
	// time overlaps the device, and Draft/Verify are not split.
	RunAhead bool `json:"run_ahead,omitempty"`
	// RunAheadFallback is why the serial loop ran although Engine.RunAhead asked for the
	// run-ahead loop (the target's caches or the proposer lack the capability, or the
	// request has a repetition penalty); empty otherwise.
	RunAheadFallback string `json:"run_ahead_fallback,omitempty"`
	Cycles           int    `json:"cycles"`
	// Tau is tokens per cycle including the bonus token (DFlash only).
	Tau float64 `json:"tau"`
	// AcceptHist[a] counts cycles that accepted a drafts.
	AcceptHist []int `json:"accept_hist,omitempty"`
	// BlockSizes counts the cycles per block size (staged token + drafts) they verified:
	// the full block but near the token budget, unless the block size is adaptive
	// (Engine.BlockCosts).
	BlockSizes map[int]int `json:"block_sizes,omitempty"`
	// DraftTries[i] counts the cycles that drafted position i+1 with every draft before it
	// accepted, and DraftHits[i] those of them that accepted it too: each position's
	// acceptance, whatever block sizes the cycles had (EstimatedTau uses them).
	DraftTries []int `json:"draft_tries,omitempty"`
	DraftHits  []int `json:"draft_hits,omitempty"`
	// BatchSize is the mean number of sequences decoded in one forward with this one
	// (1: alone; plain decoding only).
	BatchSize float64 `json:"batch_size,omitempty"`
	// Drafted and Accepted count draft tokens proposed and accepted.
	Drafted  int `json:"drafted"`
	Accepted int `json:"accepted"`

	// PromptCacheTokens are the prompt positions resumed from the prefix cache
	// (Engine.Prefix), PrefillTokens those run through the target (the last prompt token
	// always is: it gives the first logits).
	PromptCacheTokens int `json:"prompt_cache_tokens"`
	PrefillTokens     int `json:"prefill_tokens"`

	PrefillTime time.Duration `json:"prefill_ns"`
	// FirstTokenTime is from the start to the first token (TTFT).
	FirstTokenTime time.Duration `json:"first_token_ns"`
	DecodeTime     time.Duration `json:"decode_ns"` // first token → end
	// Per-phase totals over the decode loop. Build is host time spent building graphs;
	// Wait is time blocked on the device; Rollback and Host (bookkeeping, detokenising,
	// callbacks) complete the split so that they add up to DecodeTime. Draft and Verify
	// split Wait when Request.Profile is set.
	BuildTime    time.Duration `json:"build_ns"`
	WaitTime     time.Duration `json:"wait_ns"`
	RollbackTime time.Duration `json:"rollback_ns"`
	HostTime     time.Duration `json:"host_ns"`
	DraftTime    time.Duration `json:"draft_ns"`
	VerifyTime   time.Duration `json:"verify_ns"`
	// MaskTime is the host time spent computing a constraint's masks (Request.Constraint;
	// for a verify block, one per position along its drafts), and Masks counts them. In a
	// speculative step it overlaps the verify forward; in a plain step it does not.
	MaskTime time.Duration `json:"mask_ns,omitempty"`
	Masks    int           `json:"masks,omitempty"`
	// With Request.Profile: the part of DraftTime / VerifyTime (and of a plain step) spent
	// handing the graph to MLX (async_eval: kernel encoding on the host) rather than
	// waiting for the device.
	DraftEncodeTime  time.Duration `json:"draft_encode_ns,omitempty"`
	VerifyEncodeTime time.Duration `json:"verify_encode_ns,omitempty"`
	StepEncodeTime   time.Duration `json:"step_encode_ns,omitempty"`
	// With Request.Profile in the run-ahead loop (cycles then run one at a time, not
	// overlapped): a whole cycle's graph construction and its encoding; VerifyTime is
	// then the wait for the device after the encoding, and Draft*/Verify* nodes split the
	// cycle's graph into the drafter's nodes and the rest.
	CycleConstructTime time.Duration `json:"cycle_construct_ns,omitempty"`
	CycleEncodeTime    time.Duration `json:"cycle_encode_ns,omitempty"`
	// With Request.Profile: graph nodes (≈ kernels) built for drafts, verifies and plain
	// steps, summed over the generation (divide by Cycles or tokens).
	DraftNodes  int `json:"draft_nodes,omitempty"`
	VerifyNodes int `json:"verify_nodes,omitempty"`
	StepNodes   int `json:"step_nodes,omitempty"`
	// The same nodes by primitive name (which operations the steps are made of).
	DraftOps  map[string]int `json:"draft_ops,omitempty"`
	VerifyOps map[string]int `json:"verify_ops,omitempty"`
	StepOps   map[string]int `json:"step_ops,omitempty"`

	// PromptTPS is the prompt positions prefilled (PrefillTokens) over the time to the
	// first token.
	PromptTPS     float64 `json:"prompt_tps"`
	GenerationTPS float64 `json:"generation_tps"`
	PeakMemory    uint64  `json:"peak_memory_bytes"`
	// KernelCalls counts the calls of each custom kernel during the generation (graph
	// nodes built, one launch each); absent where none ran (MLX's ops only).
	KernelCalls map[string]int64 `json:"kernel_calls,omitempty"`
}

// Result of a generation.
type Result struct {
	Tokens       []int32
	Text         string
	FinishReason string
	Stats        Stats
}

func (r Request) validate(ctxLen int) error {
	if len(r.Prompt) == 0 {
		return errors.New("empty prompt")
	}
	if r.MaxTokens < 0 {
		return fmt.Errorf("max tokens must be ≥ 0, got %d", r.MaxTokens)
	}
	if err := r.Sampling.Validate(); err != nil {
		return err
	}
	if ctxLen > 0 && len(r.Prompt) >= ctxLen {
		return fmt.Errorf("%w: %d prompt tokens, context is %d", ErrPromptTooLong, len(r.Prompt), ctxLen)
	}
	if r.Constraint != nil && r.MaxTokens > 0 && r.Constraint.Stopped() {
		return errors.New("the constraint allows no tokens")
	}
	for _, s := range r.Stop {
		if s == "" {
			return errors.New("empty stop string")
		}
		if r.Detok == nil {
			return errors.New("stop strings need a detokenizer")
		}
	}
	return nil
}

// countGraph adds the primitives behind arrs to *nodes and, by name, to *ops (profile mode
// only): one walk of the graph serves both.
func countGraph(nodes *int, ops *map[string]int, arrs ...*mlxc.Array) {
	if *ops == nil {
		*ops = map[string]int{}
	}
	for k, v := range mlxc.GraphOps(arrs...) {
		(*ops)[k] += v
		*nodes += v
	}
}
