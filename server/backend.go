package server

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Backend is the engine as the HTTP server sees it. The server knows nothing else about
// models, tokenizers or MLX; the serve command passes an adapter over the engine.
//
// Contract (the server relies on every point; the fake in servertest follows it):
//
//   - ModelID and ContextLength are constant for the backend's lifetime.
//   - ChatPrompt and TextPrompt may be called from many goroutines at once, also while
//     Generate runs: they only render and tokenize. Their inputs come from the client, so the
//     server reports any error they return as a 400 naming the field (messages or prompt);
//     a *PromptTooLongError becomes context_length_exceeded. They need not tokenize all of a
//     prompt that cannot fit: tokenizing megabytes only to refuse them costs the server
//     seconds and lasting memory.
//   - Generate is called at most MaxConcurrent() times at once (ConcurrentBackend); at most
//     once at a time by a backend without the method.
//   - Generate calls emit once per piece of new text, in order, from any single goroutine,
//     and never after it returns. Each Delta.Text is whole UTF-8 (no split runes).
//   - Stop strings are the backend's job: generation ends at the first occurrence of any
//     GenerateRequest.Stop string in the generated text, the stop string and everything after
//     it are never emitted, and FinishReason is FinishStop. The server also scans for them, so
//     a backend that leaves them in is cut correctly, only later.
//   - End-of-sequence and end-of-turn tokens (<|im_end|>, <|endoftext|>) are never emitted as
//     text and never counted in CompletionTokens. The markers <think>, </think>, <tool_call>
//     and </tool_call> are emitted as text: the server parses them.
//   - When emit returns an error, Generate stops as soon as it can and returns that error
//     (wrapped or not) with the result so far.
//   - When ctx is cancelled (client gone, shutdown), Generate returns within one decode cycle
//     with FinishReason FinishCancelled; the error may be nil or ctx.Err().
//   - The GenerateResult is filled as far as possible even when an error is returned.
type Backend interface {
	// ModelID is the id listed by /v1/models and accepted in the request's "model" field
	// (Config.ModelAliases adds more accepted names).
	ModelID() string
	// ContextLength is the most tokens (prompt plus completion) one request may use.
	ContextLength() int
	// ChatPrompt renders the conversation through the model's chat template, with the
	// tools and the full history (assistant tool calls, tool results, reasoning), adds the
	// generation prompt and then opts.ResponsePrefix, and tokenizes the result.
	ChatPrompt(msgs []ChatMessage, tools []Tool, opts TemplateOptions) (Prompt, error)
	// TextPrompt tokenizes a raw completion prompt (special tokens as the model's tokenizer
	// adds them for plain text).
	TextPrompt(text string) (Prompt, error)
	// Generate runs one generation and reports text through emit.
	Generate(ctx context.Context, req GenerateRequest, emit func(Delta) error) (GenerateResult, error)
}

// ConcurrentBackend is an optional Backend method: how many Generate calls may run at once
// (the engine's batch size). The server admits that many generations and queues the rest; a
// Backend without the method, or one that returns less than 1, runs one at a time.
type ConcurrentBackend interface {
	MaxConcurrent() int
}

// StepObserverBackend is an optional Backend method. server.New calls ObserveSteps once with
// a function that the backend calls after each decode step with the rows it decoded (its
// batch size), for /metrics. The function is cheap and safe to call from any goroutine.
type StepObserverBackend interface {
	ObserveSteps(observe func(rows int))
}

// PromptCacheReporter is an optional Backend method: the prefix cache's state, which
// /metrics exports (ok is false without a cache).
type PromptCacheReporter interface {
	PromptCacheState() (st PromptCacheState, ok bool)
}

// MemoryReporter is an optional Backend method: the device memory the engine's arrays
// hold now and the memory its allocator keeps for reuse, which /metrics exports (a leak
// shows as active memory that does not return to its idle level).
type MemoryReporter interface {
	DeviceMemory() (active, cached int64)
}

// PromptCacheState is a prefix cache's counters and size.
type PromptCacheState struct {
	Lookups, Hits, ReusedTokens, Evictions, Rejected, DiskHits, DiskErrors int64
	Entries                                                                int
	Bytes, BudgetBytes, PeakBytes                                          int64
}

// PromptTooLongError is what ChatPrompt and TextPrompt return for a prompt with more
// tokens than the context leaves room for; AtLeast is a lower bound on its token count
// (a backend may stop counting once it is over).
type PromptTooLongError struct{ AtLeast int }

func (e *PromptTooLongError) Error() string {
	return fmt.Sprintf("the prompt has at least %d tokens", e.AtLeast)
}

// TokenBounder is an optional Backend method. MaxTokenBytes is the most bytes of prompt text,
// as the client sent it (before the tokenizer's normalization), that one token can cover.
// The server refuses, before tokenizing, a prompt whose text is so long that, even at that
// many bytes a token, it cannot fit in the context: tokenizing it would only spend time and
// memory. A Backend without the method gets DefaultMaxTokenBytes.
type TokenBounder interface {
	MaxTokenBytes() int
}

// DefaultMaxTokenBytes bounds the bytes one token covers for a Backend that does not say:
// the longest token of Qwen3's byte-level BPE vocabulary is 128 bytes (a run of spaces),
// also counting the longer texts that its NFC normalization folds into a token.
const DefaultMaxTokenBytes = 128

// Prompt is a rendered, tokenized prompt.
type Prompt struct {
	Tokens []int32
	// OpensInThinking is true when the rendered prompt leaves a <think> block open (a Qwen3.5
	// generation prompt ends with "<think>\n"), so the output starts inside reasoning and
	// the server sends it as reasoning_content until </think>.
	OpensInThinking bool
}

// ChatMessage is one conversation turn after validation. Role is one of "system", "user",
// "assistant", "tool" (the OpenAI "developer" role arrives as "system"). Content is the
// message text; text parts of an array content are joined with "\n".
type ChatMessage struct {
	Role    string
	Content string
	// ReasoningContent is an assistant turn's earlier reasoning, when the client sends it
	// back (reasoning_content). Templates that drop old reasoning may ignore it.
	ReasoningContent string
	ToolCalls        []ToolCall // assistant turns only
	ToolCallID       string     // tool turns only; optional
	Name             string     // optional participant or tool name
}

// ToolCall is a function call made by the assistant in an earlier turn.
type ToolCall struct {
	ID   string
	Name string
	// Arguments is the JSON text of the arguments object exactly as the client sent it
	// (OpenAI sends it as a string); it is checked to be a JSON object ("" becomes "{}").
	Arguments string
}

// Tool is one function the model may call.
type Tool struct {
	Name        string
	Description string
	Parameters  json.RawMessage // JSON Schema object; nil when the client sent none
	// Raw is the tool object exactly as the client sent it ({"type":"function",
	// "function":{...}}), key order kept, for templates that render tools with tojson.
	Raw json.RawMessage
	// SchemaParam is the request field holding Parameters, for errors about the schema.
	SchemaParam string
}

// TemplateOptions are the chat-template switches a request may set.
type TemplateOptions struct {
	// EnableThinking is the template's enable_thinking variable; nil leaves the template's
	// default. It comes from chat_template_kwargs.enable_thinking, and the server sets it to
	// false when it forces a tool call with ResponsePrefix.
	EnableThinking *bool
	// ExtraArgs are the other chat_template_kwargs entries, passed to the template verbatim;
	// the server refuses the variables the renderer sets itself (messages, tools, documents,
	// add_generation_prompt), so they never appear here.
	ExtraArgs map[string]any
	// ResponsePrefix is text appended after the generation prompt, as the first words of the
	// assistant's answer. The server uses it for tool_choice "required" ("<tool_call>\n") and
	// for a named function ("<tool_call>\n{\"name\": \"f\", \"arguments\": "), which is how it
	// enforces tool_choice without constrained decoding. It is part of the prompt, not of
	// the completion, and is never emitted by Generate.
	ResponsePrefix string
}

// GenerateRequest is one generation, after the server has applied defaults and limits.
type GenerateRequest struct {
	// ID is the request id the server logs and returns; the backend may log it too.
	ID     string
	Prompt []int32
	// MaxTokens is the most completion tokens to generate (≥ 1); reaching it ends with
	// FinishLength. The server guarantees len(Prompt)+MaxTokens ≤ ContextLength.
	MaxTokens   int
	Temperature float64 // 0 means greedy
	TopP        float64 // in (0, 1]; 1 disables
	TopK        int     // 0 disables
	MinP        float64 // 0 disables
	Seed        *int64  // nil: the backend's own seeding
	Stop        []string
	// Constraint, when set, is the grammar the answer must follow (ConstraintBackend).
	Constraint *Constraint
}

// Delta is a piece of new output text.
type Delta struct {
	Text string
	// Tokens is how many tokens this text commits (a DFlash cycle commits several).
	Tokens int
}

// FinishReason says why a generation ended.
type FinishReason string

const (
	FinishStop      FinishReason = "stop"      // end of sequence or a stop string
	FinishLength    FinishReason = "length"    // MaxTokens reached
	FinishCancelled FinishReason = "cancelled" // ctx cancelled or emit failed
)

// GenerateResult is the outcome and the statistics of one generation.
type GenerateResult struct {
	FinishReason FinishReason
	// PromptTokens is the prompt length the backend processed (0: the server uses
	// len(GenerateRequest.Prompt)).
	PromptTokens int
	// CompletionTokens counts generated tokens, not counting end-of-sequence tokens.
	CompletionTokens int
	// CachedPromptTokens are the prompt tokens resumed from a prefix cache.
	CachedPromptTokens int
	// Cycles is the number of draft+verify cycles; Tau is the mean tokens committed per
	// cycle (CompletionTokens/Cycles). Both are 0 for plain decoding.
	Cycles int
	Tau    float64
	// Drafted counts the draft tokens proposed for this request and Accepted those the
	// target accepted (Accepted ≤ Drafted); both are 0 for plain decoding.
	Drafted, Accepted int
	// BatchSize is the mean number of sequences that shared each of this request's forward
	// passes (1: it ran alone); 0 when the backend does not know.
	BatchSize float64
	// PrefillTime is the prompt processing time; DecodeTime the time from the first
	// generated token to the last; DraftTime and VerifyTime split the speculative cycles.
	PrefillTime time.Duration
	DecodeTime  time.Duration
	DraftTime   time.Duration
	VerifyTime  time.Duration
	// TokensPerSecond is the decode speed: (CompletionTokens-1) / DecodeTime, as the first
	// token comes out of the prefill. 0: the server computes it from DecodeTime or, failing
	// that, from its own clock. Either way it is reported only over two tokens or more and
	// a DecodeTime of a millisecond or more.
	TokensPerSecond float64
}
