package cli

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/dflash-mlx/dflash-mlx/engine"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/sample"
	"github.com/dflash-mlx/dflash-mlx/settings"
	"github.com/dflash-mlx/dflash-mlx/tokenizer"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

var benchPrompts = []string{
	"Explain how speculative decoding makes language models faster without changing their output.",
	"Write a Python function that returns the n-th Fibonacci number using memoization, and explain it.",
	"List five practical tips for writing clear technical documentation.",
	"Solve step by step: a train travels 180 km in 2.5 hours. What is its average speed in m/s?",
}

func benchCommand() *cli.Command {
	flags := append(modelFlags(), gpuExactFlag(),
		&cli.BoolFlag{Name: "demo", Usage: "benchmark the tiny generated demo pair (offline)"},
		&cli.StringFlag{Name: "random", Usage: "benchmark a random-weight pair of a real shape: qwen3-4b (target) + its 5-layer drafter, qwen3-4b-4bit (the same, 4-bit), qwen3-8b, qwen3.5-4b, qwen3.5-9b, qwen3.5-27b (hybrid GatedDeltaNet targets), qwen3.5-27b-4bit, qwen3.5-35b-a3b (the hybrid MoE, 4-bit), tiny, tiny-moe (a qwen3_moe target), or qwen3-4b-thin, qwen3-4b-thin-4bit (the same, 4-bit: a verify whose quantized products grow with its rows on a CPU), qwen3.5-4b-thin and qwen3.5-35b-a3b-thin (the graphs with 256-wide matrices: the host's cost of a cycle; the Qwen3.5 ones run on a CPU); qwen3.8-27b-4bit (the hybrid 27B, 4-bit, with its DFlash2 drafter) and qwen3.8-27b-thin (the same graph, 256 wide, bf16)"},
		&cli.StringFlag{Name: "dir", Usage: "where --demo/--random write their models (default: a temporary folder)"},
		&cli.StringFlag{Name: "prompts-file", Usage: "one prompt per line (default: built-in prompts)"},
		&cli.IntFlag{Name: "prompt-tokens", Value: 128, Usage: "prompt length for models without a tokenizer (random token ids)"},
		&cli.IntFlag{Name: "num-prompts", Value: 0, Usage: "use only the first N prompts (0: all)"},
		&cli.IntFlag{Name: "max-new-tokens", Aliases: []string{"n"}, Value: 128, Usage: "tokens per generation (EOS ignored so runs have equal length)"},
		&cli.IntFlag{Name: "repeats", Value: 3, Usage: "timed runs per prompt and mode (median reported)"},
		&cli.IntFlag{Name: "warmup", Value: 1, Usage: "untimed runs first"},
		&cli.IntFlag{Name: "block-size", Value: 0, Usage: "DFlash block (0: the drafter's)"},
		&cli.Float64Flag{Name: "temperature", Aliases: []string{"temp"}, Value: 0, Usage: "sample at this temperature (0: greedy); DFlash keeps the target's distribution, not plain decoding's tokens, so exactness is not checked"},
		&cli.Uint64Flag{Name: "seed", Value: 0, Usage: "sampling seed of the first run (each run adds its index)"},
		&cli.Float64Flag{Name: "replay-drafts", Value: -1, Usage: "fix the acceptance: each draft counts as right with probability 1−ERR (0 = all right), while drafting, verification and rollback run for real; measures the engine's cycle cost at a known τ on random weights. Numbers are labelled 'replayed'"},
		&cli.BoolFlag{Name: "json", Usage: "print JSON"},
		&cli.BoolFlag{Name: "mtp-compare", Usage: "instead: plain decoding, the DFlash drafter and the target's multi-token-prediction head side by side in this process (a Qwen3.5 target that keeps its head; --random qwen3.5 shapes have one), and one head step's cost against one target step"},
		&cli.BoolFlag{Name: "flips", Usage: "instead: measure how often a verify block and one-token decode pick different greedy tokens (and their logit gaps)"},
		&cli.StringFlag{Name: "context", Usage: "instead: plain and DFlash after prompts of these lengths (e.g. 512,2k,8k,32k: built-in text through the tokenizer, random ids for --random shapes), with the cycle's context-dependent part, TTFT and peak memory"},
		&cli.IntFlag{Name: "multi-turn", Usage: "instead: a chat of N turns, each turn's time to first token without and with the prompt cache side by side (the history through the chat template; random token ids for --random shapes)"},
		&cli.BoolFlag{Name: "block-sweep", Usage: "also run DFlash at each fixed block size of the τ-vs-cost curve (block_curve), beside the table's runs, which use the adaptive block unless DFLASH_ADAPTIVE_BLOCK=0 pins it"},
		&cli.BoolFlag{Name: "compare-widths", Usage: "instead: plain decoding, DFlash with the adaptive block and DFlash at each fixed block (--widths), alternating in one process; prints tok/s, τ and the widths the adaptive runs chose"},
		&cli.IntSliceFlag{Name: "widths", Usage: "the fixed blocks --compare-widths runs (default: the probed sizes from 2 up to the drafter's block or --block-size)"},
		&cli.IntSliceFlag{Name: "concurrency", Usage: "instead: per level c (e.g. 1,2,4,8,16), c clients each sending --requests-per-client plain greedy requests in turn, batched by one scheduler (up to c rows per forward) and served one at a time, in one process; prints aggregate tok/s, speedup, per-request tok/s, TTFT and latency p50/p95, mean batch size and whether every request matched the serial tokens"},
		&cli.IntFlag{Name: "join-gap", Usage: "instead: --join-rows requests decode while a request with a prompt of this many tokens joins; prints the longest wait between two tokens of a running row, with the prefill interleaved and whole"},
		&cli.IntFlag{Name: "join-rows", Value: 4, Usage: "the rows decoding while --join-gap's prompt joins"},
		&cli.IntFlag{Name: "requests-per-client", Value: 2, Usage: "requests each --concurrency client sends, each after its previous one finished"},
		&cli.BoolFlag{Name: "bandwidth", Usage: "also measure device copy bandwidth and report the weight-read roofline"},
		&cli.IntFlag{Name: "ranks", Value: 1, Usage: "split the target over this many ranks on this machine (tensor parallelism over MLX's ring backend, as `launch` starts them) and report the all-sums' share of a step and a cycle and the bytes each rank sends per token"},
		&cli.BoolFlag{Name: "compare-run-ahead", Usage: "also time DFlash with the other loop: run-ahead when the table uses the serial one, serial when it uses run-ahead (DFLASH_RUN_AHEAD; on by default with CUDA), alternating with the other two modes"},
	)
	return &cli.Command{
		Name:  "bench",
		Usage: "plain decoding vs DFlash on the same prompts, in one process",
		Description: `Runs each prompt with plain decoding, then with DFlash (warm-up, repeats, median),
checks that DFlash produced exactly the plain tokens, and prints tok/s, speedup, τ and
the per-cycle time split (a profiled extra run splits draft and verify).

Random weights accept almost no drafts; --replay-drafts ERR fixes τ by proposing the
target's own continuation with a per-token error rate, so the engine's real cycle cost
at a known τ is measured (labelled as such).

Examples:
  dflash-mlx bench --demo
  dflash-mlx bench --target-model mlx-community/Qwen3-4B-bf16 --json
  dflash-mlx bench --random qwen3-4b --replay-drafts 0.08 -n 256
  dflash-mlx bench --random qwen3.5-4b --replay-drafts 0.08 -n 256
  dflash-mlx bench --random qwen3.5-4b-thin --replay-drafts 0.1 -n 32 --repeats 1 --prompt-tokens 32
  dflash-mlx bench --random qwen3.5-35b-a3b-thin --replay-drafts 0.1 -n 32 --repeats 1 --dir /tmp/moe-thin

Serving many clients at once (plain decoding batched vs one request at a time), and how
a long prompt joining a running batch delays its rows:
  dflash-mlx bench --demo --concurrency 1,2,4,8,16 --requests-per-client 2 -n 64
  dflash-mlx bench --target-model testdata/gocode/target --no-draft --join-gap 1900`,
		Flags:  flags,
		Action: benchAction,
	}
}

type benchRow struct {
	Prompt       int     `json:"prompt"`
	PromptTokens int     `json:"prompt_tokens"`
	Tokens       int     `json:"tokens"`
	PlainTPS     float64 `json:"plain_tok_s"`
	DFlashTPS    float64 `json:"dflash_tok_s"`
	// Every timed run, in order (the medians above come from these).
	PlainRuns  []float64 `json:"plain_runs_tok_s"`
	DFlashRuns []float64 `json:"dflash_runs_tok_s"`
	// τ of each DFlash run: with --replay-drafts each run replays its own seeded pattern,
	// so runs differ in τ as well as in time.
	DFlashTaus []float64 `json:"dflash_runs_tau"`
	Speedup    float64   `json:"speedup"`
	Tau        float64   `json:"tau"`
	// Exact: every DFlash run gave plain decoding's tokens; null when not checked (replayed
	// acceptance commits drafts the target may not have chosen). LoopsAgree: with
	// --compare-run-ahead, both loops gave the same tokens.
	// AdaptiveBlock: the table's DFlash runs chose their block per cycle; BlockSizes counts
	// the last run's cycles per block size; BlockCurve is the τ-vs-cost curve.
	AdaptiveBlock bool         `json:"adaptive_block"`
	BlockSizes    map[int]int  `json:"block_sizes,omitempty"`
	BlockCurve    []blockPoint `json:"block_curve,omitempty"`
	Exact         *bool        `json:"exact"`
	// AcceptHist counts the timed DFlash runs' cycles by drafts accepted (index = count).
	AcceptHist []int   `json:"accept_hist,omitempty"`
	LoopsAgree *bool   `json:"loops_agree,omitempty"`
	CycleMS    float64 `json:"cycle_ms"`
	DraftMS    float64 `json:"draft_ms_per_cycle"`
	VerifyMS   float64 `json:"verify_ms_per_cycle"`
	BuildMS    float64 `json:"build_ms_per_cycle"`
	RollbackMS float64 `json:"rollback_ms_per_cycle"`
	// The rollback of a cycle that keeps round(τ) rows, evaluated on its own (rollbackProbe:
	// restore and tape replay in recurrent layers; in the loop it runs inside the next
	// cycle's graphs), and its share of the timed cycle.
	RollbackEvalMS float64 `json:"rollback_eval_ms_per_cycle"`
	RollbackShare  float64 `json:"rollback_share_of_cycle"`
	RollbackKeep   int     `json:"rollback_probe_keep"`
	HostMS         float64 `json:"host_ms_per_cycle"`
	PlainStepMS    float64 `json:"plain_step_ms"`
	// Graph nodes (≈ kernels) per plain step, per draft and per verify, from profiled runs.
	PlainStepNodes float64 `json:"plain_step_nodes"`
	DraftNodes     float64 `json:"draft_nodes_per_cycle"`
	VerifyNodes    float64 `json:"verify_nodes_per_cycle"`
	// Host time handing each graph to MLX (kernel encoding), from the profiled runs.
	PlainEncodeMS  float64 `json:"plain_step_encode_ms"`
	DraftEncodeMS  float64 `json:"draft_encode_ms_per_cycle"`
	VerifyEncodeMS float64 `json:"verify_encode_ms_per_cycle"`
	// Run-ahead loop, profiled one cycle at a time: building the cycle's graph, encoding
	// it, and the device's work left after the encoding (verify_ms_per_cycle then).
	CycleConstructMS float64 `json:"cycle_construct_ms,omitempty"`
	CycleEncodeMS    float64 `json:"cycle_encode_ms,omitempty"`
	// The nodes by primitive name, per plain step and per cycle.
	PlainStepOps  map[string]float64 `json:"plain_step_ops,omitempty"`
	DraftOps      map[string]float64 `json:"draft_ops_per_cycle,omitempty"`
	VerifyOps     map[string]float64 `json:"verify_ops_per_cycle,omitempty"`
	PeakMemoryGiB float64            `json:"peak_memory_gib"`
	// The timed runs' own split (medians over the repeats), per DFlash cycle and per plain
	// step: building and handing graphs to MLX, waiting for the device to read results, and
	// the rest of the host's bookkeeping. A loop that waits is the device's; one that does
	// not is the host's (DFlash on the H200: 40% waiting; plain decoding: none).
	LoopBuildMS  float64 `json:"loop_build_ms_per_cycle"`
	LoopWaitMS   float64 `json:"loop_wait_ms_per_cycle"`
	LoopHostMS   float64 `json:"loop_host_ms_per_cycle"`
	PlainBuildMS float64 `json:"plain_build_ms_per_step"`
	PlainWaitMS  float64 `json:"plain_wait_ms_per_step"`
	// The same full-block cycle enqueued back to back, the host never waiting for the
	// device (engine.PipelineProbe): the floor of a cycle whose state stays on the device.
	// It enqueues the serial loop's graphs, not the run-ahead loop's, so its host time can
	// exceed that loop's (see docs/perf/run-ahead.md).
	Pipelined *engine.PipelineProbe `json:"pipelined,omitempty"`
	// --compare-run-ahead: DFlash with the other loop than the session's (run-ahead when
	// the session runs the plain loop), timed in the same alternation.
	OtherLoopTPS  float64   `json:"other_loop_tok_s,omitempty"`
	OtherLoopRuns []float64 `json:"other_loop_runs_tok_s,omitempty"`
	OtherLoop     string    `json:"other_loop,omitempty"`
}

type benchReport struct {
	Target string `json:"target"`
	Draft  string `json:"draft"`
	// DraftKind is the drafter's generation ("dflash", "dflash2"); Selector, for DFlash2,
	// splits its draft into the forward and the candidate selector.
	DraftKind string         `json:"draft_kind,omitempty"`
	Selector  *selectorSplit `json:"selector_split,omitempty"`
	Backend   string         `json:"backend"`
	Device    string         `json:"device"`
	MLX       string         `json:"mlx"`
	Replay    *float64       `json:"replay_error_rate,omitempty"`
	// Temperature > 0: the runs sampled (exactness not checked).
	Temperature float64    `json:"temperature,omitempty"`
	MaxTokens   int        `json:"max_new_tokens"`
	Repeats     int        `json:"repeats"`
	Rows        []benchRow `json:"rows"`
	MedianPlain float64    `json:"median_plain_tok_s"`
	MedianDFl   float64    `json:"median_dflash_tok_s"`
	MedianSpeed float64    `json:"median_speedup"`
	MedianTau   float64    `json:"median_tau"`
	// AllExact is null when exactness was not checked (--replay-drafts), never true.
	AllExact      *bool  `json:"all_exact"`
	AllLoopsAgree *bool  `json:"all_loops_agree,omitempty"`
	Note          string `json:"note,omitempty"`
	// Settings are the resolved settings the run used (environment and --gpu-exact).
	Settings settings.Settings `json:"settings"`
	// Roofline: plain decoding reads every weight once per token, so copy bandwidth over
	// weight bytes bounds its tok/s.
	WeightBytes int64 `json:"weight_bytes"`
	// ResidentBytes is the device memory the loaded target and drafter hold, and
	// CheckpointBytes their checkpoints' tensor bytes (Session): a ratio near 1 means no
	// weight is held twice, e.g. no dequantized copy of a quantized expert stack.
	ResidentBytes    int64   `json:"resident_bytes"`
	CheckpointBytes  int64   `json:"checkpoint_bytes"`
	ResidentOverCkpt float64 `json:"resident_over_checkpoint"`
	CopyBandwidthGBs float64 `json:"copy_bandwidth_gb_s,omitempty"`
	RooflineTPS      float64 `json:"roofline_plain_tok_s,omitempty"`
	PlainOfRoofline  float64 `json:"plain_fraction_of_roofline,omitempty"`
	// Distributed: the all-sums of a target split over ranks (nil: one process).
	Distributed *distSplit `json:"distributed,omitempty"`
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func benchAction(c *cli.Context) (err error) {
	ctx := context.Background()
	cfg := loadConfig(c)
	cfg.LoadMTP = c.Bool("mtp-compare")
	if n := c.Int("ranks"); n < 1 {
		return cli.Exit(fmt.Sprintf("--ranks must be at least 1, got %d", n), 2)
	} else if n > 1 && cfg.DistBackend == "" {
		return benchOverRanks(n)
	}
	cfg.Quiet = cfg.Quiet || c.Bool("json")
	cfg.FreshBlockCosts = true // a benchmark measures this machine now
	note := ""
	if c.Bool("demo") || c.String("random") != "" {
		dir := c.String("dir")
		if dir == "" {
			tmp, err := os.MkdirTemp("", "dflash-bench-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(tmp)
			dir = tmp
		}
		shape := c.String("random")
		if c.Bool("demo") {
			shape = "demo"
		}
		td, dd, err := writeRandomPair(dir, shape)
		if err != nil {
			return err
		}
		cfg.Target, cfg.Draft = td, dd
		note = "random weights (" + shape + ")"
	}
	s, err := Open(ctx, cfg)
	if err != nil {
		return err
	}
	defer s.Close()
	defer func() {
		if err == nil {
			s.AwaitRanks()
		}
	}()
	if s.Engine.Proposer == nil && len(c.IntSlice("concurrency")) == 0 && c.Int("join-gap") == 0 {
		return cli.Exit("bench needs a drafter (only --concurrency and --join-gap run without one): pass --draft-model or a target the registry knows", 2)
	}
	s.Notice(s.BlockSizeNote(c.Int("block-size")))
	prompts, err := benchPromptIDs(c, s)
	if err != nil {
		return err
	}
	if c.Bool("flips") {
		return benchFlips(c, s, prompts)
	}
	if c.Bool("mtp-compare") {
		return benchMTP(c, s, prompts, note)
	}
	n, repeats := c.Int("max-new-tokens"), max(1, c.Int("repeats"))
	rep := benchReport{Target: s.TargetRef, Draft: s.DraftRef, MaxTokens: n, Repeats: repeats, Note: note, Settings: s.Settings}
	_ = mlxc.Do(func() error {
		rep.Backend, rep.Device, rep.MLX = mlxc.Backend(), mlxc.CurrentDevice().String(), mlxc.Version()
		return nil
	})
	replay := c.Float64("replay-drafts")
	if replay > 1 {
		return cli.Exit(fmt.Sprintf("--replay-drafts is an error rate between 0 and 1, got %g", replay), 2)
	}
	if n < 1 {
		return cli.Exit(fmt.Sprintf("--max-new-tokens must be at least 1, got %d", n), 2)
	}
	if c.String("context") != "" {
		lengths, err := parseLengths(c.String("context"))
		if err != nil {
			return cli.Exit(err.Error(), 2)
		}
		if replay >= 0 {
			note = strings.TrimSpace(note + "; replayed acceptance (τ set by the error rate)")
		}
		return benchContext(c, s, lengths, note, replay)
	}
	if k := c.Int("multi-turn"); k != 0 {
		if k < 1 {
			return cli.Exit(fmt.Sprintf("--multi-turn needs at least 1 turn, got %d", k), 2)
		}
		return benchMultiTurn(c, s, k, note)
	}
	temp := c.Float64("temperature")
	if err := (sample.Params{Temperature: temp}).Validate(); err != nil {
		return cli.Exit("bad --temperature: "+err.Error(), 2)
	}
	if n := c.Int("join-gap"); n != 0 {
		return benchJoinGap(c, s, n, c.Int("join-rows"), joinGapReport{Target: rep.Target, Backend: rep.Backend, Device: rep.Device})
	}
	if levels := c.IntSlice("concurrency"); len(levels) > 0 {
		if temp > 0 {
			return cli.Exit("--concurrency decodes greedily (the batched tokens are checked against the serial ones): drop --temperature", 2)
		}
		return benchConcurrency(c, s, prompts, levels, concurrencyReport{Target: rep.Target, Draft: rep.Draft, Backend: rep.Backend, Device: rep.Device,
			Note: note, MaxTokens: n, RequestsPerClient: c.Int("requests-per-client"), Prompts: len(prompts), Settings: s.Settings}, replay)
	}
	if c.Bool("compare-widths") {
		widths := c.IntSlice("widths")
		if len(widths) == 0 {
			widths = compareWidths(s.Engine.Proposer.BlockSize(), c.Int("block-size"))
		}
		for _, w := range widths {
			if w < 1 || w > s.Engine.Proposer.BlockSize() {
				return cli.Exit(fmt.Sprintf("--widths: %d is not a block between 1 and the drafter's %d", w, s.Engine.Proposer.BlockSize()), 2)
			}
		}
		wr := widthReport{Target: rep.Target, Draft: rep.Draft, Backend: rep.Backend, Device: rep.Device, Note: note,
			MaxTokens: n, Repeats: repeats, Prompts: len(prompts), Settings: s.Settings}
		if replay >= 0 {
			wr.Replay = &replay
			wr.Note = joinNote(wr.Note, "replayed acceptance (τ set by the error rate; exactness not checked)")
		}
		if temp > 0 {
			wr.Temperature = temp
			wr.Note = joinNote(wr.Note, fmt.Sprintf("sampled at temperature %g (exactness not checked)", temp))
		}
		return benchWidths(c, s, prompts, widths, wr, replay, temp)
	}
	sampled := temp > 0
	if sampled {
		rep.Temperature = temp
		rep.Note = joinNote(rep.Note, fmt.Sprintf("sampled at temperature %g (DFlash keeps the target's distribution, not plain decoding's tokens: exactness not checked)", temp))
	}
	if replay >= 0 {
		rep.Replay = &replay
		rep.Note = joinNote(rep.Note, "replayed acceptance (τ set by the error rate; draft, verify and rollback run for real; exactness not checked)")
	}
	dfl := s.Engine.Proposer
	blockOverride := 0 // > 0: the block of the --block-sweep runs
	runs := uint64(0)  // each generation samples with its own seed
	gen := func(prompt []int32, noDraft, profile bool) (engine.Result, error) {
		bs := c.Int("block-size")
		if blockOverride > 0 {
			bs = blockOverride
		}
		req := engine.Request{Prompt: prompt, MaxTokens: n, IgnoreEOS: true, NoDraft: noDraft, BlockSize: bs, Profile: profile}
		if sampled {
			req.Sampling = sample.Params{Temperature: temp, TopP: 1, Seed: c.Uint64("seed") + runs}
			runs++
		}
		return s.Generate(ctx, req, nil)
	}
	// dflash runs DFlash; with --replay-drafts, run (of prompt i) picks the acceptance pattern.
	dflash := func(prompt []int32, i, run int, profile bool) (engine.Result, error) {
		if replay >= 0 {
			s.Engine.ReplayAccept = replayAccept(replay, replaySeed(i, run))
			defer func() { s.Engine.ReplayAccept = nil }()
		}
		return gen(prompt, false, profile)
	}
	// DFLASH_HOSTPROF=file samples the host's native stacks during the timed runs (label 1:
	// plain decoding, 2: DFlash; scripts/hostprof.py reads the file). Diagnostic, Linux only.
	// DFLASH_HOSTPROF_US: microseconds between samples (default 500; each sample costs the
	// sampled thread a few microseconds, so denser sampling slows what it measures).
	hostProf := resolved.Diagnostics.HostProf
	if hostProf != "" {
		if err := mlxc.StartHostProfile(resolved.Diagnostics.HostProfUS, 200_000); err != nil {
			return err
		}
		defer func() {
			if err := mlxc.StopHostProfile(hostProf); err != nil {
				fmt.Fprintln(os.Stderr, err)
			}
		}()
	}
	label := func(l int) {
		if hostProf != "" {
			mlxc.HostProfileLabel(l)
		}
	}
	for i, prompt := range prompts {
		s.Engine.Proposer = dfl
		for w := 0; w < c.Int("warmup"); w++ {
			if _, err := gen(prompt, true, false); err != nil {
				return err
			}
			if _, err := dflash(prompt, i, -1-w, false); err != nil {
				return err
			}
		}
		// Plain and DFlash runs alternate, so drift (clocks, other tenants) hits both alike.
		var plainTPS, dTPS, taus, otherTPS []float64
		var loopBuild, loopWait, loopHost, plainBuild, plainWait []float64
		var ref, last engine.Result
		var hist []int
		exact, loopsAgree := true, true
		for r := 0; r < repeats; r++ {
			label(1)
			res, err := gen(prompt, true, false)
			label(0)
			if err != nil {
				return err
			}
			plainTPS = append(plainTPS, res.Stats.GenerationTPS)
			steps := float64(max(1, res.Stats.GeneratedTokens-1))
			plainBuild = append(plainBuild, ms(res.Stats.BuildTime)/steps)
			plainWait = append(plainWait, ms(res.Stats.WaitTime)/steps)
			ref = res
			label(2)
			res, err = dflash(prompt, i, r, false)
			label(0)
			if err != nil {
				return err
			}
			dTPS = append(dTPS, res.Stats.GenerationTPS)
			taus = append(taus, res.Stats.Tau)
			hist = addHist(hist, res.Stats.AcceptHist)
			cycles := float64(max(1, res.Stats.Cycles))
			loopBuild = append(loopBuild, ms(res.Stats.BuildTime)/cycles)
			loopWait = append(loopWait, ms(res.Stats.WaitTime)/cycles)
			loopHost = append(loopHost, ms(res.Stats.HostTime)/cycles)
			if c.Bool("compare-run-ahead") {
				s.Engine.RunAhead = !s.Engine.RunAhead
				other, err := dflash(prompt, i, r, false)
				s.Engine.RunAhead = !s.Engine.RunAhead
				if err != nil {
					return err
				}
				otherTPS = append(otherTPS, other.Stats.GenerationTPS)
				if _, ok := sameTokens(other.Tokens, res.Tokens); !ok {
					loopsAgree = false // the loops must agree, replayed or not
				}
			}
			if _, ok := sameTokens(res.Tokens, ref.Tokens); !ok {
				exact = false
			}
			last = res
		}
		// One profiled run splits the cycle into draft and verify.
		prof, err := dflash(prompt, i, repeats, true)
		if err != nil {
			return err
		}
		plainProf, err := gen(prompt, true, true)
		if err != nil {
			return err
		}
		st, ps := prof.Stats, max(1, prof.Stats.Cycles)
		row := benchRow{Prompt: i, PromptTokens: len(prompt), Tokens: len(last.Tokens), PlainTPS: median(plainTPS),
			DFlashTPS: median(dTPS), PlainRuns: plainTPS, DFlashRuns: dTPS, DFlashTaus: taus, Tau: median(taus),
			CycleMS: ms(last.Stats.DecodeTime) / float64(max(1, last.Stats.Cycles)),
			DraftMS: ms(st.DraftTime) / float64(ps), VerifyMS: ms(st.VerifyTime) / float64(ps),
			BuildMS: ms(st.BuildTime) / float64(ps), RollbackMS: ms(st.RollbackTime) / float64(ps),
			HostMS: ms(st.HostTime) / float64(ps), PeakMemoryGiB: float64(last.Stats.PeakMemory) / (1 << 30),
			PlainStepNodes: float64(plainProf.Stats.StepNodes) / float64(max(1, plainProf.Stats.GeneratedTokens-2)),
			DraftNodes:     float64(st.DraftNodes) / float64(ps), VerifyNodes: float64(st.VerifyNodes) / float64(ps),
			PlainEncodeMS: ms(plainProf.Stats.StepEncodeTime) / float64(max(1, plainProf.Stats.GeneratedTokens-2)),
			DraftEncodeMS: ms(st.DraftEncodeTime) / float64(ps), VerifyEncodeMS: ms(st.VerifyEncodeTime) / float64(ps),
			CycleConstructMS: ms(st.CycleConstructTime) / float64(ps), CycleEncodeMS: ms(st.CycleEncodeTime) / float64(ps),
			PlainStepOps: perStep(plainProf.Stats.StepOps, max(1, plainProf.Stats.GeneratedTokens-2)),
			DraftOps:     perStep(st.DraftOps, ps), VerifyOps: perStep(st.VerifyOps, ps),
			LoopBuildMS: median(loopBuild), LoopWaitMS: median(loopWait), LoopHostMS: median(loopHost),
			PlainBuildMS: median(plainBuild), PlainWaitMS: median(plainWait), AcceptHist: hist}
		// On a split target the ranks ran the pipelined probe and the block curve out of
		// step (a rank left waiting on a collective the others never started), so bench
		// leaves them out there; the table's runs and the profiled run stay.
		split := s.Shard.Split()
		if !split {
			var probe engine.PipelineProbe
			if err := mlxc.Do(func() error {
				var err error
				probe, err = s.Engine.ProbePipeline(ctx, prompt, 16)
				return err
			}); err != nil {
				return fmt.Errorf("pipeline probe: %w", err)
			}
			row.Pipelined = &probe
		}
		B := blockSizeOf(dfl.BlockSize(), c.Int("block-size"))
		row.RollbackKeep = typicalKeep(row.Tau, B)
		if row.RollbackEvalMS, err = rollbackProbe(s.Engine.Target, prompt, B, row.RollbackKeep, 2); err != nil {
			return fmt.Errorf("rollback probe: %w", err)
		}
		if row.CycleMS > 0 {
			row.RollbackShare = row.RollbackEvalMS / row.CycleMS
		}
		row.AdaptiveBlock, row.BlockSizes = s.Engine.BlockCosts != nil, last.Stats.BlockSizes
		if !split {
			if row.BlockCurve, err = blockCurve(ctx, s, prompt, last.Stats); err != nil {
				return fmt.Errorf("block costs: %w", err)
			}
		}
		if c.Bool("block-sweep") && !split {
			if err := sweepBlocks(row.BlockCurve, c.Int("warmup"), func(b int) (engine.Result, error) {
				saved := s.Engine.BlockCosts
				s.Engine.BlockCosts, blockOverride = nil, b
				defer func() { s.Engine.BlockCosts, blockOverride = saved, 0 }()
				return dflash(prompt, i, repeats+1, false)
			}); err != nil {
				return err
			}
		}
		if len(otherTPS) > 0 {
			row.OtherLoopTPS, row.OtherLoopRuns, row.OtherLoop = median(otherTPS), otherTPS, "run-ahead"
			if s.Engine.RunAhead {
				row.OtherLoop = "plain loop"
			}
		}
		if row.PlainTPS > 0 {
			row.Speedup = row.DFlashTPS / row.PlainTPS
			row.PlainStepMS = 1000 / row.PlainTPS
		}
		if replay < 0 && !sampled {
			// Without replay the other loop must also give plain decoding's tokens.
			ok := exact && loopsAgree
			row.Exact = &ok
			rep.AllExact = allOf(rep.AllExact, ok)
		}
		if len(otherTPS) > 0 {
			row.LoopsAgree = &loopsAgree
			rep.AllLoopsAgree = allOf(rep.AllLoopsAgree, loopsAgree)
		}
		rep.Rows = append(rep.Rows, row)
		if !c.Bool("json") {
			fmt.Fprintf(os.Stderr, "prompt %d: plain %.1f tok/s, dflash %.1f tok/s (τ %.2f)\n", i, row.PlainTPS, row.DFlashTPS, row.Tau)
		}
	}
	s.Engine.Proposer = dfl
	var pl, df, sp, ta []float64
	for _, r := range rep.Rows {
		pl, df, sp, ta = append(pl, r.PlainTPS), append(df, r.DFlashTPS), append(sp, r.Speedup), append(ta, r.Tau)
	}
	rep.MedianPlain, rep.MedianDFl, rep.MedianSpeed, rep.MedianTau = median(pl), median(df), median(sp), median(ta)
	rep.WeightBytes = s.Engine.Target.Arch().WeightBytes
	rep.DraftKind = s.DraftKind()
	if s.drafter != nil && s.drafter.Selector != nil {
		var sp selectorSplit
		if err := mlxc.Do(func() error {
			var err error
			sp, err = measureSelectorSplit(s.drafter, 5)
			return err
		}); err != nil {
			return fmt.Errorf("selector split: %w", err)
		}
		rep.Selector = &sp
	}
	rep.ResidentBytes, rep.CheckpointBytes = s.ResidentBytes, s.CheckpointBytes
	if s.CheckpointBytes > 0 {
		rep.ResidentOverCkpt = float64(s.ResidentBytes) / float64(s.CheckpointBytes)
	}
	if c.Bool("bandwidth") {
		bw, err := copyBandwidth()
		if err != nil {
			return err
		}
		rep.CopyBandwidthGBs = bw / 1e9
		rep.RooflineTPS = bw / float64(rep.WeightBytes)
		if rep.RooflineTPS > 0 {
			rep.PlainOfRoofline = rep.MedianPlain / rep.RooflineTPS
		}
	}
	block := c.Int("block-size")
	if block <= 0 {
		block = s.Engine.Proposer.BlockSize()
	}
	if rep.Distributed, err = measureDistSplit(s, cfg.DistBackend, &rep, block); err != nil {
		return err
	}
	if c.Bool("json") {
		return printJSON(rep)
	}
	printBench(rep)
	printDistSplit(rep.Distributed)
	return nil
}

// allOf folds one more checked result into a conjunction that starts unchecked (nil).
func allOf(acc *bool, v bool) *bool {
	if acc != nil {
		v = v && *acc
	}
	return &v
}

// checkMark prints a check that may not have been made.
func checkMark(b *bool, unchecked string) string {
	if b == nil {
		return unchecked
	}
	return fmt.Sprint(*b)
}

func sameTokens(a, b []int32) (int, bool) {
	if len(a) != len(b) {
		return min(len(a), len(b)), false
	}
	for i := range a {
		if a[i] != b[i] {
			return i, false
		}
	}
	return -1, true
}

func printBench(r benchReport) {
	fmt.Printf("target %s, draft %s, %s on %s (MLX %s), %d new tokens, median of %d\n", r.Target, r.Draft, r.Backend, r.Device, r.MLX, r.MaxTokens, r.Repeats)
	if r.Note != "" {
		fmt.Printf("note: %s\n", r.Note)
	}
	fmt.Printf("%-6s %7s %11s %12s %8s %6s %6s %9s %9s %9s %8s %8s\n", "prompt", "tokens", "plain tok/s", "dflash tok/s", "speedup", "τ", "exact", "cycle ms", "draft ms", "verify ms", "build ms", "host ms")
	for _, x := range r.Rows {
		fmt.Printf("%-6d %7d %11.1f %12.1f %7.2fx %6.2f %6s %9.2f %9.2f %9.2f %8.2f %8.2f\n", x.Prompt, x.PromptTokens, x.PlainTPS, x.DFlashTPS, x.Speedup, x.Tau, checkMark(x.Exact, "-"), x.CycleMS, x.DraftMS, x.VerifyMS, x.BuildMS, x.HostMS)
	}
	if len(r.Rows) > 0 {
		x := r.Rows[0]
		fmt.Printf("graph nodes (≈ kernels): plain step %.0f, draft %.0f, verify %.0f per cycle\n", x.PlainStepNodes, x.DraftNodes, x.VerifyNodes)
		fmt.Printf("timed runs: dflash cycle %.2f ms = building %.2f + waiting for the device %.2f + other host %.2f; plain step %.2f ms, waiting %.2f\n",
			x.CycleMS, x.LoopBuildMS, x.LoopWaitMS, x.LoopHostMS, x.PlainStepMS, x.PlainWaitMS)
		fmt.Printf("cycle split (profiled): draft %.2f ms, verify %.2f ms, rollback %.2f ms evaluated on its own (%d rows kept) = %.1f%% of the cycle\n",
			x.DraftMS, x.VerifyMS, x.RollbackEvalMS, x.RollbackKeep, 100*x.RollbackShare)
		if x.CycleEncodeMS > 0 {
			fmt.Printf("run-ahead cycle profiled one at a time: graph building %.2f ms, encoding %.2f ms, device after the encoding %.2f ms; plain step encoding %.2f ms\n", x.CycleConstructMS, x.CycleEncodeMS, x.VerifyMS, x.PlainEncodeMS)
		} else {
			fmt.Printf("host encoding (profiled): plain step %.2f ms, draft %.2f ms, verify %.2f ms per cycle\n", x.PlainEncodeMS, x.DraftEncodeMS, x.VerifyEncodeMS)
		}
		if sel := r.Selector; sel != nil {
			share := 0.0
			if x.CycleMS > 0 {
				share = sel.SelectorMS / x.CycleMS
			}
			fmt.Printf("%s draft alone (%d context rows): forward %.2f ms, candidate selector %.2f ms (%.1f%% of the draft, %.1f%% of the timed cycle)\n",
				r.DraftKind, selectorProbeRows, sel.ForwardMS, sel.SelectorMS, 100*sel.Share, 100*share)
		}
		printBlockCurve(x)
		if x.OtherLoop != "" {
			fmt.Printf("dflash with the %s: %.1f tok/s (this table: %.1f)\n", x.OtherLoop, x.OtherLoopTPS, x.DFlashTPS)
		}
		if pp := x.Pipelined; pp != nil {
			fmt.Printf("pipelined (host never waits): cycle %.2f ms (host %.2f), verify alone %.2f ms (host %.2f); the loop's cycle: %.2f ms\n",
				pp.CycleMS, pp.HostMS, pp.VerifyMS, pp.VerifyHostMS, x.CycleMS)
		}
		for _, part := range []struct {
			name string
			ops  map[string]float64
		}{{"plain step", x.PlainStepOps}, {"draft", x.DraftOps}, {"verify", x.VerifyOps}} {
			fmt.Printf("  %-10s %s\n", part.name, topOps(part.ops, 8))
		}
	}
	fmt.Printf("median: plain %.1f tok/s, dflash %.1f tok/s, speedup %.2fx, τ %.2f, all exact: %s", r.MedianPlain, r.MedianDFl, r.MedianSpeed, r.MedianTau, checkMark(r.AllExact, notCheckedWhy(r)))
	if r.AllLoopsAgree != nil {
		fmt.Printf(", both loops agree: %v", *r.AllLoopsAgree)
	}
	fmt.Println()
	var hist []int
	for _, x := range r.Rows {
		hist = addHist(hist, x.AcceptHist)
	}
	if len(hist) > 0 {
		fmt.Printf("accepted drafts a cycle (timed runs, all prompts): %s\n", histLine(hist))
	}
	fmt.Printf("memory: the loaded models hold %s; their checkpoints' tensors are %s (%.3f×)\n", human(r.ResidentBytes), human(r.CheckpointBytes), r.ResidentOverCkpt)
	if r.CopyBandwidthGBs > 0 {
		fmt.Printf("roofline: weights %s, copy bandwidth %.0f GB/s → plain ≤ %.1f tok/s; measured plain is %.0f%% of it\n", human(r.WeightBytes), r.CopyBandwidthGBs, r.RooflineTPS, 100*r.PlainOfRoofline)
	}
}

func benchPromptIDs(c *cli.Context, s *Session) ([][]int32, error) {
	texts := benchPrompts
	if f := c.String("prompts-file"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		texts = nil
		for _, l := range strings.Split(string(b), "\n") {
			if strings.TrimSpace(l) != "" {
				texts = append(texts, l)
			}
		}
		if len(texts) == 0 {
			return nil, fmt.Errorf("%s: no prompts", f)
		}
	}
	if k := c.Int("num-prompts"); k > 0 && k < len(texts) {
		texts = texts[:k]
	}
	var out [][]int32
	if s.Tok != nil && s.Tok.HasChatTemplate() && c.String("random") == "" {
		for _, t := range texts {
			f := false
			ids, err := s.ChatPrompt([]tokenizer.Message{tokenizer.NewMessage("user", t)}, tokenizer.ChatOptions{AddGenerationPrompt: true, EnableThinking: &f})
			if err != nil {
				return nil, err
			}
			out = append(out, ids)
		}
		return out, nil
	}
	// Random token ids (seeded) for models without a usable tokenizer.
	V := s.Engine.Target.Arch().VocabSize
	for i := range texts {
		out = append(out, randomIDs(rand.New(rand.NewPCG(uint64(i)+1, 99)), c.Int("prompt-tokens"), V))
	}
	return out, nil
}

// randomIDs draws n token ids below the vocabulary (capped at 150 000: Qwen3's text
// tokens, short of its special ones) for models without a usable tokenizer.
func randomIDs(r *rand.Rand, n, vocab int) []int32 {
	ids := make([]int32, n)
	for j := range ids {
		ids[j] = int32(r.IntN(min(vocab, 150000)))
	}
	return ids
}

// writeRandomPair writes a random target + drafter of a named shape with the demo tokenizer.
func writeRandomPair(dir, shape string) (string, string, error) {
	td, dd := filepath.Join(dir, "target"), filepath.Join(dir, "draft")
	write := func() error { return nil }
	stampText := shape
	if t35, d35, ok := qwen35Shape(shape); ok {
		// Qwen3.5 targets carry their multi-token-prediction head, as the original
		// checkpoints do (bench --mtp-compare drafts with it; other loads drop it).
		t35.MTP = true
		stampText = shape + " (with an MTP head)"
		write = func() error { return writePair35(td, dd, t35, d35) }
	} else {
		tspec, dspec, err := pairShape(shape)
		if err != nil {
			return "", "", err
		}
		write = func() error { return writePair(td, dd, tspec, dspec) }
	}
	if stamp, err := os.ReadFile(filepath.Join(dir, "SHAPE")); err == nil && string(stamp) == stampText {
		fmt.Fprintf(os.Stderr, "reusing the random %s pair in %s\n", shape, dir)
		return td, dd, nil
	}
	start := time.Now()
	if err := write(); err != nil {
		return "", "", err
	}
	fmt.Fprintf(os.Stderr, "wrote random %s pair to %s in %.1fs\n", shape, dir, time.Since(start).Seconds())
	if err := os.WriteFile(filepath.Join(dir, "SHAPE"), []byte(stampText), 0o644); err != nil {
		return "", "", err
	}
	return td, dd, nil
}

// replaySeed gives every run of a prompt (warm-ups negative, then repeats, then the profiled
// run) its own acceptance pattern at the same error rate: the runs then meet different cache
// lengths, as distinct generations do. With one pattern for all, a backend that caches work
// per shape (cuDNN attention plans on CUDA) would look cheaper than it is in use.
func replaySeed(prompt, run int) uint64 {
	return uint64(prompt+1)*1_000_003 + uint64(int64(run)+1_000)
}

// joinNote appends part to a report's note.
func joinNote(note, part string) string {
	if note == "" {
		return part
	}
	return note + "; " + part
}

// notCheckedWhy says why a report has no exactness verdict.
func notCheckedWhy(r benchReport) string {
	if r.Temperature > 0 {
		return "not checked (sampled)"
	}
	return "not checked (replayed acceptance)"
}

// histLine formats counts as "k:count" for each nonzero k.
func histLine(h []int) string {
	var parts []string
	for k, v := range h {
		if v > 0 {
			parts = append(parts, fmt.Sprintf("%d:%d", k, v))
		}
	}
	return strings.Join(parts, " ")
}

// addHist adds the counts of b to a, growing a as needed.
func addHist(a, b []int) []int {
	for len(a) < len(b) {
		a = append(a, 0)
	}
	for i, v := range b {
		a[i] += v
	}
	return a
}

func replayAccept(errRate float64, seed uint64) func(n int) int {
	f := verify.ReplayCorrect(errRate, seed)
	return func(n int) int { return f(0, n) }
}

// perStep divides summed primitive counts by the number of steps.
func perStep(ops map[string]int, steps int) map[string]float64 {
	if len(ops) == 0 {
		return nil
	}
	out := make(map[string]float64, len(ops))
	for k, v := range ops {
		out[k] = float64(v) / float64(steps)
	}
	return out
}

// topOps formats the n most frequent primitives, most frequent first.
func topOps(ops map[string]float64, n int) string {
	names := make([]string, 0, len(ops))
	for k := range ops {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool {
		if ops[names[i]] != ops[names[j]] {
			return ops[names[i]] > ops[names[j]]
		}
		return names[i] < names[j]
	})
	var b strings.Builder
	for i, k := range names {
		if i == n {
			fmt.Fprintf(&b, "… (%d more kinds)", len(names)-n)
			break
		}
		fmt.Fprintf(&b, "%s %.0f  ", k, ops[k])
	}
	return strings.TrimSpace(b.String())
}
