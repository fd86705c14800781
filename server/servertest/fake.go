// Package servertest provides a scripted fake server.Backend and a loopback test server,
// for the server's tests and for anyone who needs an OpenAI-compatible endpoint without a
// model (the SDK scripts in server/sdktest, the CLI's tests).
//
// The fake tokenizes one byte per token and renders chats in a ChatML-like text, so
// prompts can be read back from tokens. Unless a Script says otherwise it answers with
// words picked by a PRNG seeded from the prompt (and from the request's seed when the
// temperature is above 0), each word tagged with the request's marker (see Marker), in
// deltas of one to four words, like DFlash cycles. It follows the server.Backend contract:
// stop strings are applied (unless LeaveStopsToServer), max tokens is exact, cancellation
// is honoured between deltas, and it records every run for assertions.
package servertest

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/dflash-mlx/dflash-mlx/server"
)

// Fake is a deterministic server.Backend. Set its fields before use; the zero value works.
type Fake struct {
	Model   string // default "dflash-fake"
	Context int    // context length; default 4096
	// Delay is slept before each delta; PrefillDelay once before the first. Both end early
	// when the context is cancelled.
	Delay        time.Duration
	PrefillDelay time.Duration
	// LeaveStopsToServer makes the fake ignore stop strings, like a backend that does not
	// apply them, so the server's own stop handling is what the test sees.
	LeaveStopsToServer bool
	// OpensInThinking makes chat prompts end inside an open <think> block, as a Qwen3.5
	// template does when thinking is on.
	OpensInThinking bool
	// Script, when set, gives the deltas of a generation (one token each) instead of the
	// default words; returning nil keeps the default words.
	Script func(Input) []string
	// Fail, when set, makes Generate fail with this error after emitting its first delta.
	Fail error
	// ToolFormat is the tool-call format the fake's template teaches (ToolCallFormat reports
	// it, and earlier calls are rendered in it); empty means Qwen3's JSON form.
	ToolFormat server.ToolCallFormat
	// Concurrent is the fake's MaxConcurrent, how many generations the server may run on it
	// at once; 0 means one.
	Concurrent int
	// Gate, when set, holds every generation after it starts (it counts as Active) until a
	// value is received from Gate or Gate is closed, or the context ends: a test lets
	// generations go one by one, or all at once.
	Gate chan struct{}

	mu        sync.Mutex
	active    int
	maxActive int
	runs      []Run
	tokenized int // bytes of prompt text tokenized
}

// Input is what a Script sees.
type Input struct {
	Prompt  string // the prompt text as rendered (one byte per token)
	Request server.GenerateRequest
}

// Run records one Generate call.
type Run struct {
	ID               string
	Start, End       time.Time
	Finish           server.FinishReason
	Err              error
	CompletionTokens int
	ContextCancelled bool // ctx was done when Generate returned
}

var (
	_ server.Backend           = (*Fake)(nil)
	_ server.ToolCallFormatter = (*Fake)(nil)
	_ server.ConcurrentBackend = (*Fake)(nil)
)

// MaxConcurrent reports Concurrent, one by default.
func (f *Fake) MaxConcurrent() int { return max(f.Concurrent, 1) }

// ToolCallFormat reports the fake's ToolFormat, Qwen3's JSON form by default.
func (f *Fake) ToolCallFormat() server.ToolCallFormat {
	if f.ToolFormat == "" {
		return server.ToolCallJSON
	}
	return f.ToolFormat
}

func (f *Fake) ModelID() string {
	if f.Model == "" {
		return "dflash-fake"
	}
	return f.Model
}

func (f *Fake) ContextLength() int {
	if f.Context == 0 {
		return 4096
	}
	return f.Context
}

// ChatPrompt renders the conversation in a ChatML-like text, with tools, tool calls and
// reasoning, and tokenizes it one byte per token.
func (f *Fake) ChatPrompt(msgs []server.ChatMessage, tools []server.Tool, opts server.TemplateOptions) (server.Prompt, error) {
	var b strings.Builder
	if len(tools) > 0 {
		b.WriteString("<|im_start|>system\n# Tools\n<tools>\n")
		for _, t := range tools {
			b.Write(t.Raw)
			b.WriteByte('\n')
		}
		b.WriteString("</tools><|im_end|>\n")
	}
	for i, m := range msgs {
		if m.Role == "tool" && (i == 0 || msgs[i-1].Role != "assistant" && msgs[i-1].Role != "tool") {
			return server.Prompt{}, fmt.Errorf("message %d: a tool result must follow an assistant tool call", i)
		}
		fmt.Fprintf(&b, "<|im_start|>%s\n", m.Role)
		if m.ReasoningContent != "" {
			fmt.Fprintf(&b, "<think>\n%s\n</think>\n\n", m.ReasoningContent)
		}
		b.WriteString(m.Content)
		for _, c := range m.ToolCalls {
			if f.ToolCallFormat() == server.ToolCallQwen3Coder {
				fmt.Fprintf(&b, "\n<tool_call>\n<function=%s>\n%s\n</function>\n</tool_call>", c.Name, c.Arguments)
				continue
			}
			fmt.Fprintf(&b, "\n<tool_call>\n{\"name\": %q, \"arguments\": %s}\n</tool_call>", c.Name, c.Arguments)
		}
		b.WriteString("<|im_end|>\n")
	}
	b.WriteString("<|im_start|>assistant\n")
	thinking := opts.EnableThinking == nil || *opts.EnableThinking
	opens := f.OpensInThinking && thinking
	switch {
	case opens:
		b.WriteString("<think>\n")
	case opts.EnableThinking != nil && !*opts.EnableThinking:
		b.WriteString("<think>\n\n</think>\n\n")
	}
	b.WriteString(opts.ResponsePrefix)
	f.countTokenized(b.Len())
	return server.Prompt{Tokens: Tokenize(b.String()), OpensInThinking: opens}, nil
}

// TextPrompt tokenizes text one byte per token.
func (f *Fake) TextPrompt(text string) (server.Prompt, error) {
	f.countTokenized(len(text))
	return server.Prompt{Tokens: Tokenize(text)}, nil
}

func (f *Fake) countTokenized(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tokenized += n
}

// Tokenized is how many bytes of prompt text ChatPrompt and TextPrompt have tokenized, for
// tests of what the server refuses before tokenizing.
func (f *Fake) Tokenized() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.tokenized
}

// Tokenize is the fake's tokenizer: one token per byte.
func Tokenize(text string) []int32 {
	tokens := make([]int32, len(text))
	for i := 0; i < len(text); i++ {
		tokens[i] = int32(text[i])
	}
	return tokens
}

// Detokenize inverts Tokenize.
func Detokenize(tokens []int32) string {
	b := make([]byte, len(tokens))
	for i, t := range tokens {
		b[i] = byte(t)
	}
	return string(b)
}

var markerTag = regexp.MustCompile(`\[\[id:([A-Za-z0-9_-]+)\]\]`)

// Marker is the tag every word of the fake's default answer carries: the id of the last
// "[[id:NAME]]" tag in the prompt, or else "m" and a hash of the prompt. Tests put a
// unique tag in each prompt and check that every word of the answer carries it, which
// proves answers are never mixed between requests.
func Marker(prompt string) string {
	if m := markerTag.FindAllStringSubmatch(prompt, -1); len(m) > 0 {
		return m[len(m)-1][1]
	}
	h := fnv.New32a()
	h.Write([]byte(prompt))
	return fmt.Sprintf("m%08x", h.Sum32())
}

var vocabulary = strings.Fields(`river stone amber cloud delta ember fjord grove harbor island
	jade kelp lumen meadow nectar orbit prism quartz ridge summit tidal umber valley willow
	xenon yarrow zephyr`)

// plannedDelta is one delta of a planned answer.
type plannedDelta struct {
	text   string
	tokens int
}

// plan builds the whole answer before it is streamed: words for the default answer, or
// the script's deltas.
func (f *Fake) plan(in Input) []plannedDelta {
	if f.Script != nil {
		if script := f.Script(in); script != nil {
			var out []plannedDelta
			for _, d := range script {
				out = append(out, plannedDelta{text: d, tokens: 1})
			}
			return out
		}
	}
	h := fnv.New64a()
	h.Write([]byte(in.Prompt))
	seed := uint64(0)
	if in.Request.Temperature > 0 && in.Request.Seed != nil {
		seed = uint64(*in.Request.Seed)
	}
	rng := rand.New(rand.NewPCG(h.Sum64(), seed))
	marker := Marker(in.Prompt)
	words := 12 + rng.IntN(40)
	var out []plannedDelta
	for words > 0 {
		n := min(1+rng.IntN(4), words)
		var b strings.Builder
		for range n {
			b.WriteString(marker + "-" + vocabulary[rng.IntN(len(vocabulary))] + " ")
		}
		out = append(out, plannedDelta{text: b.String(), tokens: n})
		words -= n
	}
	return out
}

// Generate streams the planned answer, honouring max tokens, stop strings and ctx.
func (f *Fake) Generate(ctx context.Context, req server.GenerateRequest, emit func(server.Delta) error) (res server.GenerateResult, err error) {
	start := f.begin()
	res.PromptTokens = len(req.Prompt)
	defer func() { f.end(ctx, req.ID, start, res, err) }()

	deltas := f.plan(Input{Prompt: Detokenize(req.Prompt), Request: req})
	deltas, finish := f.limit(deltas, req)
	if !f.pass(ctx) || !sleep(ctx, f.PrefillDelay) {
		res.FinishReason = server.FinishCancelled
		return res, ctx.Err()
	}
	res.PrefillTime = time.Since(start)
	var decodeStart time.Time // the first token's, as DecodeTime is defined
	for i, d := range deltas {
		if !sleep(ctx, f.Delay) {
			res.FinishReason = server.FinishCancelled
			return res, ctx.Err()
		}
		if i == 0 {
			decodeStart = time.Now()
		}
		res.CompletionTokens += d.tokens
		res.Cycles++
		if d.text != "" {
			if err := emit(server.Delta{Text: d.text, Tokens: d.tokens}); err != nil {
				res.FinishReason = server.FinishCancelled
				return res, fmt.Errorf("fake: emit: %w", err)
			}
		}
		if f.Fail != nil && i == 0 {
			return res, f.Fail
		}
	}
	res.FinishReason = finish
	if !decodeStart.IsZero() {
		res.DecodeTime = time.Since(decodeStart)
	}
	res.DraftTime = res.DecodeTime * 2 / 5
	res.VerifyTime = res.DecodeTime * 3 / 5
	if res.Cycles > 0 {
		res.Tau = float64(res.CompletionTokens) / float64(res.Cycles)
	}
	return res, nil
}

// limit cuts the planned answer at max tokens and at the first stop string.
func (f *Fake) limit(deltas []plannedDelta, req server.GenerateRequest) ([]plannedDelta, server.FinishReason) {
	finish := server.FinishStop
	var out []plannedDelta
	tokens := 0
	for _, d := range deltas {
		if tokens+d.tokens >= req.MaxTokens {
			// Cut the delta to the tokens left: words are whole tokens in the default
			// answer, script deltas are one token each.
			d = truncateWords(d, req.MaxTokens-tokens)
			out = append(out, d)
			if tokens+d.tokens == req.MaxTokens {
				finish = server.FinishLength
			}
			break
		}
		out = append(out, d)
		tokens += d.tokens
	}
	if f.LeaveStopsToServer || len(req.Stop) == 0 {
		return out, finish
	}
	var text strings.Builder
	for _, d := range out {
		text.WriteString(d.text)
	}
	cut := -1
	for _, s := range req.Stop {
		if i := strings.Index(text.String(), s); i >= 0 && (cut < 0 || i < cut) {
			cut = i
		}
	}
	if cut < 0 {
		return out, finish
	}
	var kept []plannedDelta
	offset := 0
	for _, d := range out {
		if offset+len(d.text) >= cut {
			kept = append(kept, plannedDelta{text: d.text[:cut-offset], tokens: d.tokens})
			break
		}
		kept = append(kept, d)
		offset += len(d.text)
	}
	return kept, server.FinishStop
}

func truncateWords(d plannedDelta, tokens int) plannedDelta {
	if tokens >= d.tokens {
		return d
	}
	words := strings.SplitAfter(d.text, " ")
	return plannedDelta{text: strings.Join(words[:tokens], ""), tokens: tokens}
}

// pass waits at the Gate, if any, or until ctx ends; it reports whether ctx is still live.
func (f *Fake) pass(ctx context.Context) bool {
	if f.Gate == nil {
		return ctx.Err() == nil
	}
	select {
	case <-ctx.Done():
		return false
	case <-f.Gate:
		return true
	}
}

// sleep waits d or until ctx ends; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (f *Fake) begin() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.active++
	f.maxActive = max(f.maxActive, f.active)
	return time.Now()
}

func (f *Fake) end(ctx context.Context, id string, start time.Time, res server.GenerateResult, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.active--
	f.runs = append(f.runs, Run{ID: id, Start: start, End: time.Now(), Finish: res.FinishReason, Err: err,
		CompletionTokens: res.CompletionTokens, ContextCancelled: ctx.Err() != nil})
}

// Runs returns the finished generations, in the order they ended.
func (f *Fake) Runs() []Run {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Run(nil), f.runs...)
}

// Active is the number of Generate calls running now.
func (f *Fake) Active() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.active
}

// MaxActive is the most Generate calls that ever ran at once; the server must keep it at
// MaxConcurrent.
func (f *Fake) MaxActive() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.maxActive
}

// WaitIdle waits until no Generate call runs, or timeout; it reports whether it got there.
func (f *Fake) WaitIdle(timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for f.Active() > 0 {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(2 * time.Millisecond)
	}
	return true
}

// ErrScripted is a convenient error for Fail.
var ErrScripted = errors.New("servertest: scripted backend failure")
