package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/dflash-mlx/dflash-mlx/engine"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/sample"
	"github.com/dflash-mlx/dflash-mlx/server"
	"github.com/dflash-mlx/dflash-mlx/tokenizer"
)

func serveCommand() *cli.Command {
	flags := append(append(modelFlags(), promptCacheFlags(true)...), gpuExactFlag(),
		&cli.StringFlag{Name: "host", Value: "127.0.0.1", Usage: "address to listen on (0.0.0.0 exposes the server to your network)"},
		&cli.IntFlag{Name: "port", Value: 8000, Usage: "port to listen on"},
		&cli.StringFlag{Name: "model-id", Usage: "id reported by /v1/models (default: the target model name)"},
		&cli.IntFlag{Name: "max-batch", Usage: "requests decoded together in one batch (0: chosen from the device's memory and the model's cache per token, printed at start)"},
		&cli.IntFlag{Name: "max-queue", Value: 32, Usage: "requests that may wait when --max-batch run (0: none; more get 429)"},
		&cli.StringFlag{Name: "api-key", Usage: "require 'Authorization: Bearer KEY'", EnvVars: []string{"DFLASH_API_KEY"}},
		&cli.IntFlag{Name: "max-tokens-limit", Usage: "largest max_tokens a request may ask for (default: the context)"},
		&cli.IntFlag{Name: "default-max-tokens", Value: 4096, Usage: "max_tokens when a request sets none"},
		&cli.StringSliceFlag{Name: "cors-origins", Usage: "browser origins allowed to call the API (\"*\" for any)"},
		&cli.DurationFlag{Name: "read-timeout", Value: 60 * time.Second, Usage: "time to read a whole request"},
		&cli.DurationFlag{Name: "write-timeout", Value: 60 * time.Second, Usage: "longest stall writing to a client"},
		&cli.DurationFlag{Name: "drain-timeout", Value: 30 * time.Second, Usage: "on SIGTERM, time to finish running requests"},
		&cli.IntFlag{Name: "block-size", Value: 0, Usage: "DFlash block (0 = the drafter's)"},
		&cli.BoolFlag{Name: "log-json", Usage: "log as JSON lines"},
		&cli.BoolFlag{Name: "profile", Usage: "split draft and verify time in the dflash stats (one extra sync per cycle)"},
		&cli.StringSliceFlag{Name: "model-alias", Usage: "another name accepted in a request's model (repeatable; e.g. the model names an agent sends)"},
		&cli.IntFlag{Name: "response-store-mib", Value: 64, Usage: "memory for stored /v1/responses answers (previous_response_id, GET); least recently used go first"},
	)
	return &cli.Command{
		Name:  "serve",
		Usage: "serve OpenAI- and Anthropic-compatible APIs (chat completions, responses, messages, SSE streaming)",
		Description: `Starts an HTTP server with the OpenAI and Anthropic API shapes on --host:--port:
  POST /v1/chat/completions   POST /v1/completions   POST /v1/responses
  POST /v1/messages           POST /v1/messages/count_tokens
  GET /v1/models              GET /health          GET /metrics (Prometheus)
Up to --max-batch requests decode together, joining and leaving the batch between
steps; more wait in a FIFO queue (--max-queue). With a draft model every request
speculates in the same steps, each at the width a per-step policy gives it from its own
acceptance and the measured cost of the batch's forward (plain steps where drafts stop
paying). SIGTERM drains.

Point clients at it:
  OpenAI SDK:  OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")
  Open WebUI:  Settings → Connections → OpenAI API → http://127.0.0.1:8000/v1
  Continue:    provider "openai", apiBase "http://127.0.0.1:8000/v1"
  Codex CLI:   a [model_providers.X] with base_url "http://127.0.0.1:8000/v1", wire_api "responses"
  Claude Code: ANTHROPIC_BASE_URL=http://127.0.0.1:8000 ANTHROPIC_MODEL=<--model-id> (README)

Examples:
  dflash-mlx serve                                   # default pair on 127.0.0.1:8000
  dflash-mlx serve --target-model mlx-community/Qwen3-8B-4bit --port 8080 --api-key "$KEY"
  dflash-mlx serve --host 0.0.0.0 --cors-origins http://localhost:3000 --log-json
  dflash-mlx serve --no-draft --max-batch 16          # a shared server: many clients at once
  curl http://127.0.0.1:8000/v1/chat/completions -H 'Content-Type: application/json' \
    -d '{"model": "Qwen3-4B-bf16", "messages": [{"role": "user", "content": "Hi"}]}'`,
		Flags:  flags,
		Action: serveAction,
	}
}

func serveAction(c *cli.Context) error {
	maxQueue, err := queueFlag(c.Int("max-queue"))
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var handler slog.Handler = slog.NewTextHandler(os.Stderr, nil)
	lc := loadConfig(c)
	if lc.PromptCache, err = promptCacheConfig(c); err != nil {
		return err
	}
	if lc.DistBackend != "" && lc.PromptCache.Dir != "" {
		// Each rank's directory would answer from its own entries: ranks that resumed
		// different lengths would run different steps.
		return cli.Exit("--prompt-cache-dir cannot be used with a split target (--dist-backend): each rank keeps its part of the prompt cache in memory only", 2)
	}
	if c.Bool("log-json") {
		handler = slog.NewJSONHandler(os.Stderr, nil)
		// Start-up goes through the JSON log too, so every line on stderr is a record.
		lc.Logger = slog.New(handler)
	}
	logger := slog.New(handler)
	s, err := Open(ctx, lc)
	if err != nil {
		return err
	}
	defer s.Close()
	s.Notice(s.BlockSizeNote(c.Int("block-size")))
	b := &backend{s: s, blockSize: c.Int("block-size"), profile: c.Bool("profile"), toolFormat: templateToolFormat(s.Tok),
		grammars: newGrammars(s)}
	defer b.grammars.close()
	var ex *rankExchange
	if s.Shard.Split() {
		ex = &rankExchange{sh: s.Shard}
		if s.Shard.Rank != 0 {
			// Rank 0 serves HTTP; this rank runs its schedule. A signal does not end it:
			// rank 0 drains and then closes the schedule, and a rank 0 that dies ends the
			// exchange with an error.
			stop()
			signal.Ignore(os.Interrupt, syscall.SIGTERM)
			s.Notice(fmt.Sprintf("rank %d of %d: following rank 0's requests", s.Shard.Rank, s.Shard.Size))
			if err := b.follow(ex); err != nil {
				return err
			}
			s.AwaitRanks()
			return nil
		}
	}
	id := c.String("model-id")
	if id == "" {
		id = s.TargetRef
	}
	maxBatch, why, err := maxBatchFlag(c.Int("max-batch"), s)
	if err != nil {
		return err
	}
	s.Notice(fmt.Sprintf("batching up to %d requests (%s)", maxBatch, why))
	b.id = id
	sc := engine.SchedulerConfig{MaxBatch: maxBatch, PrefillSlice: time.Duration(s.Settings.Loop.PrefillSliceMS) * time.Millisecond, OnStep: b.onStep}
	if ex != nil {
		sc.Lockstep = ex
		b.split = true
	}
	b.sched = s.Engine.NewScheduler(sc)
	defer b.sched.Close() // a split target's other ranks end with rank 0's scheduler
	if ex != nil {
		// A rank that fails ends the server: its requests get the rank's error, and the
		// command exits with it.
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		go func() {
			select {
			case <-b.sched.Failed():
				logger.Error("a rank of the split target failed; stopping", "err", b.s.rankError(b.sched.Err()))
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	cfg := server.Config{
		Host: c.String("host"), Port: c.Int("port"), MaxQueue: maxQueue, APIKey: c.String("api-key"),
		MaxTokensLimit: c.Int("max-tokens-limit"), DefaultMaxTokens: c.Int("default-max-tokens"),
		CORSOrigins: c.StringSlice("cors-origins"), ReadTimeout: c.Duration("read-timeout"),
		WriteTimeout: c.Duration("write-timeout"), DrainTimeout: c.Duration("drain-timeout"),
	}
	if base := s.TargetRef[strings.LastIndex(s.TargetRef, "/")+1:]; base != id {
		cfg.ModelAliases = []string{base}
	}
	cfg.ModelAliases = append(cfg.ModelAliases, c.StringSlice("model-alias")...)
	mib := c.Int("response-store-mib")
	if mib < 1 {
		return fmt.Errorf("--response-store-mib %d: give 1 or more", mib)
	}
	cfg.ResponseStoreBytes = int64(mib) << 20
	srv, err := server.New(cfg, b, logger)
	if err != nil {
		return err
	}
	mode := "plain decoding"
	if s.DraftRef != "" {
		mode = "DFlash (" + s.DraftRef + ")"
	}
	url := fmt.Sprintf("http://%s:%d/v1", cfg.Host, cfg.Port)
	if c.Bool("log-json") {
		logger.Info("serving", "model", id, "mode", mode, "url", url)
	} else {
		fmt.Fprintf(os.Stderr, "serving %s with %s on %s\n", id, mode, url)
	}
	err = srv.ListenAndServe(ctx)
	if ex != nil {
		b.sched.Close()
		if ferr := b.sched.Err(); ferr != nil {
			return s.rankError(ferr)
		}
		s.AwaitRanks()
	}
	return err
}

// queueFlag turns --max-queue into server.Config.MaxQueue, where 0 would mean the default:
// 0 on the command line means no queue.
func queueFlag(n int) (int, error) {
	switch {
	case n < 0:
		return 0, fmt.Errorf("--max-queue %d: give 0 (no request waits) or more", n)
	case n == 0:
		return server.NoQueue, nil
	}
	return n, nil
}

// backend adapts a Session to server.Backend: its generations go through one scheduler.
type backend struct {
	s          *Session
	sched      *engine.Scheduler
	id         string
	blockSize  int
	profile    bool
	toolFormat server.ToolCallFormat
	// grammars makes the matchers of constrained requests.
	grammars *grammars
	// steps is the server's observer of decode steps (ObserveSteps), nil until set.
	steps atomic.Pointer[func(rows int)]
	// split: the target is split over ranks, whose schedulers run in lockstep (every
	// request carries its wire form).
	split bool
}

// MaxConcurrent is how many generations the scheduler runs at once.
func (b *backend) MaxConcurrent() int { return b.sched.MaxBatch() }

// ObserveSteps makes every decode step report its rows to f (the server's metrics).
func (b *backend) ObserveSteps(f func(rows int)) { b.steps.Store(&f) }

func (b *backend) onStep(rows, _ int) {
	if f := b.steps.Load(); f != nil {
		(*f)(rows)
	}
}

func (b *backend) ModelID() string    { return b.id }
func (b *backend) ContextLength() int { return b.s.Engine.ContextLen() }

// ToolCallFormat is the chat template's tool-call format, which picks the server's parser.
func (b *backend) ToolCallFormat() server.ToolCallFormat { return b.toolFormat }

// templateToolFormat reads the tool-call format from the chat templates' sources, as mlx-lm
// picks its tool parser.
func templateToolFormat(tok *tokenizer.Tokenizer) server.ToolCallFormat {
	var src strings.Builder
	for _, name := range tok.ChatTemplateNames() {
		text, _ := tok.ChatTemplateSource(name)
		src.WriteString(text)
	}
	return server.DetectToolCallFormat(src.String())
}

func (b *backend) ChatPrompt(msgs []server.ChatMessage, tools []server.Tool, opts server.TemplateOptions) (server.Prompt, error) {
	tm := make([]tokenizer.Message, 0, len(msgs))
	coder := b.ToolCallFormat() == server.ToolCallQwen3Coder
	for _, m := range msgs {
		content := m.Content
		msg := tokenizer.Message{Role: m.Role, Content: &content, ToolCallID: m.ToolCallID, Name: m.Name}
		if m.Role == "assistant" && content == "" && len(m.ToolCalls) > 0 {
			msg.Content = &content // Qwen3's template needs a content key even with tool calls
		}
		if m.ReasoningContent != "" {
			rc := m.ReasoningContent
			msg.ReasoningContent = &rc
		}
		for _, tc := range m.ToolCalls {
			args := tc.Arguments
			if args == "" {
				args = "{}"
			}
			// OpenAI sends arguments as a JSON string; Qwen3's template prints strings as they
			// are. The qwen3_coder templates iterate the arguments' items, so they get the object.
			raw, _ := json.Marshal(args)
			if coder {
				raw = json.RawMessage(args)
			}
			msg.ToolCalls = append(msg.ToolCalls, tokenizer.ToolCall{ID: tc.ID, Type: "function", Function: tokenizer.FunctionCall{Name: tc.Name, Arguments: raw}})
		}
		tm = append(tm, msg)
	}
	co := tokenizer.ChatOptions{AddGenerationPrompt: true, EnableThinking: opts.EnableThinking}
	if len(tools) > 0 {
		for _, t := range tools {
			co.Tools = append(co.Tools, t.Raw)
		}
	}
	if len(opts.ExtraArgs) > 0 {
		co.Variables = map[string]json.RawMessage{}
		for k, v := range opts.ExtraArgs {
			raw, err := json.Marshal(v)
			if err != nil {
				return server.Prompt{}, fmt.Errorf("chat_template_kwargs.%s: %w", k, err)
			}
			co.Variables[k] = raw
		}
	}
	text, err := b.s.Tok.ApplyChatTemplate(tm, co)
	if err != nil {
		if errors.Is(err, tokenizer.ErrNoChatTemplate) {
			return server.Prompt{}, fmt.Errorf("the model has no chat template; use /v1/completions")
		}
		return server.Prompt{}, err
	}
	text += opts.ResponsePrefix
	ids, err := b.encode(text, false)
	if err != nil {
		return server.Prompt{}, err
	}
	open := strings.LastIndex(text, "<think>") > strings.LastIndex(text, "</think>")
	return server.Prompt{Tokens: ids, OpensInThinking: open}, nil
}

func (b *backend) TextPrompt(text string) (server.Prompt, error) {
	ids, err := b.encode(text, true)
	if err != nil {
		return server.Prompt{}, err
	}
	return server.Prompt{Tokens: ids}, nil
}

// encode tokenizes a prompt, counting in chunks and stopping once it is too long for the
// context, so an oversized request costs neither seconds nor lasting memory.
func (b *backend) encode(text string, addSpecialTokens bool) ([]int32, error) {
	ids, atLeast, over, err := b.s.Tok.EncodeUpTo(text, addSpecialTokens, b.ContextLength()-1)
	if err != nil {
		return nil, err
	}
	if over {
		return nil, &server.PromptTooLongError{AtLeast: atLeast}
	}
	return ids, nil
}

// CheckConstraint reports why c cannot constrain the model's answers (server.ConstraintBackend).
func (b *backend) CheckConstraint(c server.Constraint) error {
	return b.grammars.check(serverGrammar(c))
}

func (b *backend) Generate(ctx context.Context, req server.GenerateRequest, emit func(server.Delta) error) (server.GenerateResult, error) {
	seed := uint64(time.Now().UnixNano())
	if req.Seed != nil {
		seed = uint64(*req.Seed)
	}
	rr := rankRequest{Prompt: req.Prompt, MaxTokens: req.MaxTokens, Temperature: req.Temperature, TopP: req.TopP,
		TopK: req.TopK, MinP: req.MinP, Seed: seed, Stop: req.Stop, Constraint: req.Constraint}
	er, done, err := b.engineRequest(rr)
	if err != nil {
		return server.GenerateResult{}, err
	}
	defer done()
	if b.split {
		if er.Wire, err = json.Marshal(rr); err != nil {
			return server.GenerateResult{}, err
		}
	}
	res, err := b.sched.Generate(ctx, er, func(ev engine.Event) error {
		if ev.Text == "" && len(ev.Tokens) == 0 {
			return nil
		}
		return emit(server.Delta{Text: ev.Text, Tokens: len(ev.Tokens)})
	})
	if b.split {
		err = b.s.rankError(err)
	}
	st := res.Stats
	out := server.GenerateResult{
		FinishReason: server.FinishReason(res.FinishReason), PromptTokens: len(req.Prompt),
		CompletionTokens: len(res.Tokens), CachedPromptTokens: st.PromptCacheTokens, Cycles: st.Cycles, PrefillTime: st.PrefillTime,
		DecodeTime: st.DecodeTime, DraftTime: st.DraftTime, VerifyTime: st.VerifyTime, TokensPerSecond: st.GenerationTPS,
		Drafted: st.Drafted, Accepted: st.Accepted, BatchSize: st.BatchSize,
	}
	if st.Cycles > 0 {
		out.Tau = st.Tau
	}
	if err != nil && ctx.Err() != nil {
		out.FinishReason = server.FinishCancelled
	}
	return out, err
}

// engineRequest makes the engine's request of a generation (on every rank of a split
// target alike); done frees what it holds (its constraint's matcher).
func (b *backend) engineRequest(rr rankRequest) (engine.Request, func(), error) {
	er := engine.Request{
		Prompt:      rr.Prompt,
		PrefixMarks: b.s.PrefixMarks(rr.Prompt),
		MaxTokens:   rr.MaxTokens,
		Sampling: sample.Params{Temperature: rr.Temperature, TopP: rr.TopP, TopK: rr.TopK, MinP: rr.MinP,
			Seed: rr.Seed},
		Stop:       rr.Stop,
		StopTokens: b.s.StopTokens(),
		BlockSize:  b.blockSize,
		Detok:      b.s.Tok.NewStreamDecoder(true),
		Profile:    b.profile,
	}
	done := func() {}
	if rr.Constraint != nil {
		m, err := b.grammars.matcher(serverGrammar(*rr.Constraint))
		if err != nil {
			return engine.Request{}, nil, fmt.Errorf("constrained decoding: %w", err)
		}
		er.Constraint = m
		done = func() { m.Close() }
	}
	return er, done, nil
}

// DeviceMemory reports MLX's active and cached memory to /metrics.
func (b *backend) DeviceMemory() (active, cached int64) {
	return int64(mlxc.ActiveMemory()), int64(mlxc.CacheMemory())
}

// PromptCacheState reports the session's prefix cache to /metrics.
func (b *backend) PromptCacheState() (server.PromptCacheState, bool) {
	st := b.s.PromptCacheStats()
	if st == nil {
		return server.PromptCacheState{}, false
	}
	return server.PromptCacheState{Lookups: st.Lookups, Hits: st.Hits, ReusedTokens: st.ReusedTokens,
		Evictions: st.Evictions, Rejected: st.Rejected, DiskHits: st.DiskHits, DiskErrors: st.DiskErrors,
		Entries: st.Entries, Bytes: st.Bytes, BudgetBytes: st.Budget, PeakBytes: st.PeakBytes}, true
}
