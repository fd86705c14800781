package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/dflash-mlx/dflash-mlx/draft"
	"github.com/dflash-mlx/dflash-mlx/engine"
	"github.com/dflash-mlx/dflash-mlx/hub"
	"github.com/dflash-mlx/dflash-mlx/kernelcheck"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	_ "github.com/dflash-mlx/dflash-mlx/model/families" // every family registers its model_type
	"github.com/dflash-mlx/dflash-mlx/model/qwen35"
	"github.com/dflash-mlx/dflash-mlx/settings"
	"github.com/dflash-mlx/dflash-mlx/tokenizer"
)

// Default models: the pair the public projects use.
const (
	DefaultTarget = "mlx-community/Qwen3-4B-bf16"
	DefaultDraft  = "z-lab/Qwen3-4B-DFlash-b16"
)

// LoadConfig says which models to load.
type LoadConfig struct {
	Target string
	Draft  string // "" = resolve from the registry
	// MaxBlock is the largest DFlash block the session's requests ask for (--block-size;
	// 0: the drafter's): the start-up measurement of the adaptive block times no larger.
	MaxBlock int
	NoDraft  bool
	// DraftKind is --draft-kind: "auto" (or ""), "dflash", "mtp" or "none".
	DraftKind string
	// LoadMTP loads the target's multi-token-prediction head beside a DFlash drafter
	// (Session.MTPHead; bench --mtp-compare).
	LoadMTP      bool
	RequireDraft bool
	DraftsFile   string // user registry; "" = the default location
	Revision     string
	Quiet        bool
	Log          io.Writer // notices and progress (stderr)
	// Logger, when set, gets the notices and the load summary as log records (serve
	// --log-json), and nothing is drawn on Log.
	Logger *slog.Logger
	// ContextLength overrides the model's max_position_embeddings when > 0.
	ContextLength int
	// DraftWindow bounds the drafter's attention in long contexts (draft.Drafter's
	// ContextWindow; 0: the whole context).
	DraftWindow int
	// Settings for the loaders and the engine; nil: the settings resolved from the
	// environment when the program started.
	Settings *settings.Settings
	// PromptCache is the prefix cache to keep (none by default).
	PromptCache PromptCacheConfig
	// FreshBlockCosts measures the adaptive block's costs even when an earlier process
	// kept a measurement for the same device, build, models and settings (bench).
	FreshBlockCosts bool
	// DistBackend ("" none; ring, jaccl, mpi, nccl, any) makes this process one rank of a
	// tensor-parallel target (--dist-backend; joinRanks): the ranks started alike with
	// MLX's launcher variables each load their share and decode in lockstep.
	DistBackend string
}

// Session is a loaded target (+ drafter) with its tokenizer, ready to generate.
type Session struct {
	// mtp: the proposer is the target's multi-token-prediction head (--draft-kind).
	mtp bool
	// MTPHead is the target's multi-token-prediction head when it was loaded (nil: none).
	MTPHead   *qwen35.MTP
	Engine    *engine.Engine
	Tok       *tokenizer.Tokenizer
	TargetRef string
	DraftRef  string // "" without a drafter
	TargetDir string
	DraftDir  string
	drafter   *draft.Drafter
	LoadTime  time.Duration
	// ResidentBytes is the device memory the loaded models hold (MLX's active memory
	// after loading, less what was active before), and CheckpointBytes the tensor bytes
	// of their checkpoints as loaded (the target's after its sanitize drops unused
	// tensors): equal when no weight is held twice (no dequantized or transposed copies).
	ResidentBytes, CheckpointBytes int64
	// BlockCostsTime is how long measuring the adaptive block's costs took (0: not adaptive).
	BlockCostsTime time.Duration
	// Settings are the ones the session was loaded with (LoadConfig.Settings), with the
	// kernels the self-check disabled (Kernels says which).
	Settings settings.Settings
	// Kernels is every custom kernel's state on this device after the self-check.
	Kernels []kernelcheck.State
	log     io.Writer
	logger  *slog.Logger
	quiet   bool
	// maxBlock is LoadConfig.MaxBlock.
	maxBlock int
	// freshBlockCosts is LoadConfig.FreshBlockCosts; blockCostStore keeps measurements
	// between processes.
	freshBlockCosts bool
	blockCostStore  blockCostStore
	// BlockCostsRemembered: the adaptive block's costs came from an earlier process.
	BlockCostsRemembered bool
	// Shard is this process's rank of a tensor-parallel target (nil: not distributed).
	Shard *model.Shard
}

// resolveDraft picks the drafter for a target per the rules: explicit flag, else registry,
// else none (with a notice, or an error under RequireDraft).
func resolveDraft(cfg LoadConfig) (string, error) {
	if cfg.NoDraft || cfg.DraftKind == draftNone || cfg.DraftKind == draftMTP {
		return "", nil
	}
	if cfg.Draft != "" {
		return cfg.Draft, nil
	}
	path := cfg.DraftsFile
	if path == "" {
		path = draft.DefaultUserFile()
	}
	reg, err := draft.NewRegistry(path)
	if err != nil {
		return "", err
	}
	if d, ok := reg.Resolve(cfg.Target); ok {
		return d, nil
	}
	if cfg.RequireDraft || cfg.DraftKind == draftDFlash {
		return "", fmt.Errorf("no DFlash draft is known for %s (known targets: %v); pass --draft-model or add it to %s", cfg.Target, reg.Known(), path)
	}
	return "", nil
}

// Open resolves (downloading if needed) and loads the models.
func Open(ctx context.Context, cfg LoadConfig) (*Session, error) {
	start := time.Now()
	if cfg.Log == nil {
		cfg.Log = os.Stderr
	}
	if cfg.Target == "" {
		cfg.Target = DefaultTarget
	}
	if cfg.DraftWindow < 0 {
		return nil, fmt.Errorf("--draft-window %d: give 0 (the whole context) or a number of tokens", cfg.DraftWindow)
	}
	st := resolved
	if cfg.Settings != nil {
		st = *cfg.Settings
	}
	client, err := hub.NewClientFromEnv()
	if err != nil {
		return nil, err
	}
	if err := checkLoadable(ctx, client, cfg.Target, cfg.Revision); err != nil {
		return nil, err
	}
	if err := checkDraftKind(&cfg); err != nil {
		return nil, err
	}
	draftRef, err := resolveDraft(cfg)
	if err != nil {
		return nil, err
	}
	// An automatic choice without a DFlash drafter tries the checkpoint's MTP head
	// (loaded with the target) before settling on plain decoding.
	wantMTP := cfg.DraftKind == draftMTP || cfg.DraftKind == draftAuto && draftRef == "" && !cfg.NoDraft && cfg.DistBackend == ""
	if draftRef == "" && !cfg.NoDraft && !wantMTP && cfg.DraftKind != draftNone {
		const msg = "no DFlash draft known for the target; using plain decoding (pass --draft-model to speed it up)"
		if cfg.Logger != nil {
			cfg.Logger.Warn(msg, "target", cfg.Target)
		} else if !cfg.Quiet {
			fmt.Fprintf(cfg.Log, "note: no DFlash draft known for %s; using plain decoding (pass --draft-model to speed it up)\n", cfg.Target)
		}
	}
	opts := hub.DownloadOptions{Revision: cfg.Revision, Quiet: cfg.Quiet || cfg.Logger != nil, Progress: cfg.Log}
	tm, err := client.ResolveModel(ctx, cfg.Target, opts)
	if err != nil {
		return nil, fmt.Errorf("target %s: %w", cfg.Target, err)
	}
	var dm *hub.Model
	if draftRef != "" {
		dopts := opts
		dopts.Revision = ""
		if dm, err = client.ResolveModel(ctx, draftRef, dopts); err != nil {
			return nil, fmt.Errorf("draft %s: %w", draftRef, err)
		}
	}
	tok, err := tokenizer.Load(tm.Dir)
	if err != nil {
		return nil, fmt.Errorf("tokenizer of %s: %w", cfg.Target, err)
	}
	if err := checkDistBackend(cfg.DistBackend); err != nil {
		tok.Close()
		return nil, err
	}
	var shard *model.Shard
	if cfg.DistBackend != "" {
		// A rank that dies closes its sockets; the peer's next send would raise SIGPIPE on
		// MLX's own thread, which ends this process with no word. Ignored, the send fails,
		// MLX fails the collective, and the error says which rank saw it (Generate).
		signal.Ignore(syscall.SIGPIPE)
		fp, err := loadFingerprint(cfg, st, tm, dm)
		if err != nil {
			tok.Close()
			return nil, fmt.Errorf("distributed start: %w", err)
		}
		if err := mlxc.Do(func() error {
			var err error
			shard, err = joinRanks(cfg.DistBackend, fp)
			return err
		}); err != nil {
			tok.Close()
			return nil, err
		}
	}
	s := &Session{Tok: tok, TargetRef: cfg.Target, DraftRef: draftRef, TargetDir: tm.Dir, log: cfg.Log, logger: cfg.Logger, quiet: cfg.Quiet, maxBlock: cfg.MaxBlock, Settings: st,
		freshBlockCosts: cfg.FreshBlockCosts, blockCostStore: defaultBlockCostStore(), Shard: shard}
	var bar *progressBar
	if !cfg.Quiet && cfg.Logger == nil {
		bar = newProgressBar(cfg.Log, "loading "+cfg.Target)
	}
	err = mlxc.Do(func() error {
		noQuantized := !quantizedCheckpoint(tm.Dir) && (dm == nil || !quantizedCheckpoint(dm.Dir))
		st, s.Kernels = gateKernels(st, cfg.Log, noQuantized)
		decideGPUExact(&st, tm.Dir)
		s.Settings = st
		opt := model.LoadOptions{Settings: &st, Shard: shard, MTP: wantMTP || cfg.LoadMTP}
		if bar != nil {
			opt.Progress = bar.update
		}
		mlxc.ResetPeakMemory()
		before := mlxc.ActiveMemory()
		m, err := model.Load(tm.Dir, opt)
		if err != nil {
			if bar != nil {
				bar.fail()
			}
			return err
		}
		if bar != nil {
			bar.done()
			fmt.Fprintf(cfg.Log, "weights %s, peak memory while loading %s\n", human(m.Arch().WeightBytes), human(int64(mlxc.PeakMemory())))
		}
		if cfg.Logger != nil {
			cfg.Logger.Info("loaded", "model", cfg.Target, "weight_bytes", m.Arch().WeightBytes, "peak_memory_bytes", mlxc.PeakMemory())
		}
		// A split target runs the serial loop only (no run-ahead): bench's pipelined
		// probe, which builds a cycle while the previous one runs, left ranks waiting on
		// each other.
		s.Engine = &engine.Engine{Target: m, ContextLength: cfg.ContextLength, KeyBucket: model.KeyBucket(st.Kernels),
			RowwiseVerify: st.Loop.GPUExact, RunAhead: engine.RunAheadFor(st.Loop.RunAhead) && !shard.Split(), Settings: &st}
		if dm != nil {
			d, err := draft.Load(dm.Dir, m, draft.LoadOptions{Settings: &st})
			if d != nil {
				d.KeyBucket = model.KeyBucket(st.Kernels)
				d.ContextWindow, d.ContextSink = cfg.DraftWindow, draft.DefaultContextSink
			}
			if err != nil {
				m.Free()
				return fmt.Errorf("draft %s: %w", draftRef, err)
			}
			s.drafter = d
			s.DraftDir = dm.Dir
			s.Engine.Proposer = proposerFor(d)
			if w, err := model.ReadWeightHeaders(dm.Dir); err == nil {
				s.CheckpointBytes += w.Bytes
			}
		}
		if q, ok := m.(*qwen35.Model); ok {
			s.MTPHead = q.MTP()
		}
		if wantMTP {
			if err := s.useMTP(m, cfg); err != nil {
				m.Free()
				return err
			}
		}
		s.CheckpointBytes += m.Arch().WeightBytes
		s.ResidentBytes = int64(mlxc.ActiveMemory()) - int64(before)
		return nil
	})
	if err != nil {
		tok.Close()
		if shard != nil {
			_ = mlxc.Do(func() error { shard.Group.Close(); return nil })
		}
		return nil, err
	}
	if v := s.Engine.Target.Arch().VocabSize; v < tok.VocabSize() {
		s.Close()
		return nil, fmt.Errorf("%s: tokenizer has %d tokens but the model's vocab_size is %d", cfg.Target, tok.VocabSize(), v)
	}
	s.LoadTime = time.Since(start)
	if err := s.measureBlockCosts(ctx); err != nil {
		s.Close()
		return nil, err
	}
	if err := s.openPromptCache(cfg.PromptCache); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// blockProbeTokens is the context the adaptive block's cycle costs are measured after.
const blockProbeTokens = 64

// measureBlockCosts makes the DFlash block adaptive unless the settings pin it
// (DFLASH_ADAPTIVE_BLOCK=0): it times a cycle per block size once, here, so that requests
// do not pay for it, or takes the costs an earlier process measured for the same device,
// build, models and settings (blockcosts.go), and reports them on the load log.
func (s *Session) measureBlockCosts(ctx context.Context) error {
	if s.Engine.Proposer == nil || !engine.AdaptiveBlockFor(s.Settings.Loop.AdaptiveBlock) || s.maxBlock == 1 {
		return nil
	}
	if s.Shard.Split() {
		// The ranks of a split target must take every decision alike, and measured costs
		// differ between them: each cycle drafts the whole block.
		s.Notice("adaptive block size: off on a split target (every rank drafts the whole block)")
		return nil
	}
	V := s.Engine.Target.Arch().VocabSize
	prompt := make([]int32, blockProbeTokens)
	for i := range prompt {
		prompt[i] = int32((i*7919 + 13) % min(V, 150000)) // any tokens: only the cost is kept
	}
	start := time.Now()
	sizes := probeSizes(s.maxBlock)
	var dev kernelcheck.Device
	_ = mlxc.Do(func() error { dev = kernelcheck.Here(); return nil })
	key, keyErr := blockCostKey(dev, buildID(), s.TargetDir, s.DraftDir, s.Settings, sizes, len(prompt))
	bc, ok := engine.BlockCosts{}, false
	if keyErr == nil && !s.freshBlockCosts {
		bc, ok = s.blockCostStore.get(key)
	}
	if !ok {
		if !s.quiet && s.logger == nil {
			fmt.Fprintf(s.log, "adaptive block size: timing a DFlash cycle per block size (%v)…\n", sizes)
		}
		var err error
		if bc, err = s.blockCosts(ctx, prompt, sizes); err != nil {
			return fmt.Errorf("adaptive block size: %w", err)
		}
		if keyErr == nil {
			if err := s.blockCostStore.put(key, bc, time.Now()); err != nil && !s.quiet && s.logger == nil {
				fmt.Fprintf(s.log, "warning: %v (measured again next time)\n", err)
			}
		}
	}
	s.Engine.BlockCosts = &bc
	s.BlockCostsTime = time.Since(start)
	s.BlockCostsRemembered = ok
	parts := make([]string, len(bc.Sizes))
	for i, B := range bc.Sizes {
		parts[i] = fmt.Sprintf("%d: %.1f", B, bc.MS[i])
	}
	how := fmt.Sprintf("measured in %.1fs", s.BlockCostsTime.Seconds())
	if ok {
		how = "as measured by an earlier run (" + s.blockCostStore.path + ")"
	}
	if s.logger != nil {
		s.logger.Info("adaptive block size", "block_sizes", bc.Sizes, "cycle_ms", bc.MS, "remembered", ok)
	} else if !s.quiet {
		fmt.Fprintf(s.log, "adaptive block size: a cycle costs (block: ms) %s, %s\n", strings.Join(parts, ", "), how)
	}
	return nil
}

// BlockSizeNote says how a requested --block-size will be used when that differs from what
// was asked ("" when it does not): the engine caps a block at the drafter's, a block of one
// token holds no drafts, and plain decoding has no blocks.
func (s *Session) BlockSizeNote(requested int) string {
	if requested <= 0 {
		return ""
	}
	if s.Engine.Proposer == nil {
		return fmt.Sprintf("--block-size %d has no effect without a drafter (plain decoding)", requested)
	}
	switch b := s.Engine.Proposer.BlockSize(); {
	case requested > b:
		return fmt.Sprintf("--block-size %d is larger than the drafter's block (%d); using %d", requested, b, b)
	case requested == 1:
		return "--block-size 1 leaves no room for drafts (a block is the staged token plus its drafts): every cycle verifies one token; use 2 or more, or --no-draft"
	}
	return ""
}

// Notice tells the user something they should know about their settings: a log record when
// the session logs records, else a "note:" line on the session's log.
func (s *Session) Notice(msg string) {
	switch {
	case msg == "":
	case s.logger != nil:
		s.logger.Warn(msg)
	default:
		fmt.Fprintln(s.log, "note: "+msg)
	}
}

// Close frees the models.
func (s *Session) Close() {
	if s == nil {
		return
	}
	_ = mlxc.Do(func() error {
		if s.Engine != nil && s.Engine.Prefix != nil {
			s.Engine.Prefix.Free()
		}
		if s.drafter != nil {
			s.drafter.Free()
		}
		if s.Engine != nil {
			s.Engine.Target.Free()
		}
		if s.Shard != nil {
			s.Shard.Group.Close()
		}
		return nil
	})
	if s.Tok != nil {
		s.Tok.Close()
	}
}

// StopTokens is the union of the model's and the tokenizer's EOS ids.
func (s *Session) StopTokens() []int32 {
	seen := map[int32]bool{}
	var out []int32
	for _, id := range s.Engine.Target.Arch().EOSTokenIDs {
		if !seen[int32(id)] {
			seen[int32(id)] = true
			out = append(out, int32(id))
		}
	}
	for _, id := range s.Tok.EOSTokenIDs() {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}

// Generate runs a request on the MLX thread.
func (s *Session) Generate(ctx context.Context, req engine.Request, emit func(engine.Event) error) (engine.Result, error) {
	var res engine.Result
	err := mlxc.Do(func() error {
		var err error
		res, err = s.Engine.Generate(ctx, req, emit)
		return err
	})
	return res, s.rankError(err)
}

// AwaitRanks, on a split target, waits until every rank has finished its last collective
// and lingers a moment, for a command that ends well: a rank that ended at once could close
// its sockets while a peer still receives the end of that collective, and the peer would
// fail. (After a failure it is not called: a dead peer would never arrive.)
func (s *Session) AwaitRanks() {
	if !s.Shard.Split() {
		return
	}
	_ = mlxc.Do(func() error {
		return mlxc.Catch(func() {
			sc := mlxc.NewScope()
			defer sc.Close()
			mlxc.Eval(mlxc.AllSum(mlxc.Zeros([]int{1}, mlxc.Float32), s.Shard.Group))
		})
	})
	time.Sleep(200 * time.Millisecond)
}

// rankError says, on a split target, which rank an MLX failure happened on: the ring
// reports a peer that died as a failed send or receive, and the ranks must all stop.
func (s *Session) rankError(err error) error {
	var me *mlxc.Error
	if err == nil || !s.Shard.Split() || !errors.As(err, &me) {
		return err
	}
	r, n := s.Shard.Rank, s.Shard.Size
	return fmt.Errorf("rank %d of %d: %w (the ring's neighbours of this rank are ranks %d and %d: one of them stopped, or its connection broke)",
		r, n, err, (r+n-1)%n, (r+1)%n)
}

// ChatPrompt renders messages through the model's own template and tokenizes them.
func (s *Session) ChatPrompt(msgs []tokenizer.Message, opts tokenizer.ChatOptions) ([]int32, error) {
	text, err := s.Tok.ApplyChatTemplate(msgs, opts)
	if err != nil {
		if errors.Is(err, tokenizer.ErrNoChatTemplate) {
			return nil, fmt.Errorf("%s has no chat template; use --no-chat-template to send the prompt as plain text", s.TargetRef)
		}
		return nil, err
	}
	return s.Tok.Encode(text, false)
}

// probeSizes are the block sizes the adaptive block's measurement times: those of
// engine.ProbeBlockSizes below maxBlock and maxBlock itself (0: all that fit the drafter).
func probeSizes(maxBlock int) []int {
	if maxBlock <= 0 {
		return engine.ProbeBlockSizes
	}
	sizes := []int{maxBlock}
	for _, B := range engine.ProbeBlockSizes {
		if B < maxBlock {
			sizes = append(sizes, B)
		}
	}
	return sizes
}

// blockCosts measures a DFlash cycle's cost per block size in sizes after prompt.
func (s *Session) blockCosts(ctx context.Context, prompt []int32, sizes []int) (engine.BlockCosts, error) {
	var bc engine.BlockCosts
	err := mlxc.Do(func() error {
		var err error
		bc, err = s.Engine.MeasureBlockCosts(ctx, prompt, sizes, 3)
		return err
	})
	return bc, err
}
