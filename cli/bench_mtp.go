package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/dflash-mlx/dflash-mlx/engine"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

// mtpReport is bench --mtp-compare's result: per prompt, plain decoding, the DFlash
// drafter (when one is loaded) and the target's MTP head, alternating in one process; and
// one head step against one target step.
type mtpReport struct {
	Target, Draft     string
	Backend, Device   string
	Note              string   `json:"note,omitempty"`
	MaxTokens         int      `json:"max_new_tokens"`
	Repeats           int      `json:"repeats"`
	MTPBlock          int      `json:"mtp_block"`
	Replay            *float64 `json:"replay_error_rate,omitempty"`
	Rows              []mtpRow `json:"rows"`
	MedianPlainTPS    float64  `json:"median_plain_tok_s"`
	MedianDFlashTPS   float64  `json:"median_dflash_tok_s,omitempty"`
	MedianMTPTPS      float64  `json:"median_mtp_tok_s"`
	MTPStepMS         float64  `json:"mtp_step_ms"`
	TargetStepMS      float64  `json:"target_step_ms"`
	MTPStepOverStep   float64  `json:"mtp_step_over_target_step"`
	MTPExactGreedy    *bool    `json:"mtp_equals_plain,omitempty"`
	DFlashExactGreedy *bool    `json:"dflash_equals_plain,omitempty"`
}

type mtpRow struct {
	Prompt    int     `json:"prompt"`
	PlainTPS  float64 `json:"plain_tok_s"`
	DFlashTPS float64 `json:"dflash_tok_s,omitempty"`
	DFlashTau float64 `json:"dflash_tau,omitempty"`
	MTPTPS    float64 `json:"mtp_tok_s"`
	MTPTau    float64 `json:"mtp_tau"`
}

// benchMTP runs plain decoding, DFlash (the session's drafter, if any) and the MTP head on
// each prompt, alternating repeat by repeat so that drift hits all alike, then times one
// head step and reports it against one target step.
func benchMTP(c *cli.Context, s *Session, prompts [][]int32, note string) error {
	if s.MTPHead == nil {
		return cli.Exit("--mtp-compare: the target has no multi-token-prediction head (a Qwen3.5/3.6/3.8 checkpoint that keeps its mtp.* tensors; the --random qwen3.5 shapes have one)", 2)
	}
	n, repeats := c.Int("max-new-tokens"), max(1, c.Int("repeats"))
	replay := c.Float64("replay-drafts")
	dfl := s.Engine.Proposer
	defer func() { s.Engine.Proposer = dfl }()
	mtpP := verify.NewMTP(s.MTPHead, mtpBlock(c.Int("block-size")))
	rep := mtpReport{Target: s.TargetRef, Draft: s.DraftRef, Note: note, MaxTokens: n, Repeats: repeats, MTPBlock: mtpP.BlockSize()}
	_ = mlxc.Do(func() error {
		rep.Backend, rep.Device = mlxc.Backend(), mlxc.CurrentDevice().String()
		return nil
	})
	if replay >= 0 {
		rep.Replay = &replay
		rep.Note = joinNote(rep.Note, "replayed acceptance (τ set by the error rate; exactness not checked)")
	}
	ctx := context.Background()
	gen := func(p verify.Proposer, prompt []int32, i, run int) (engine.Result, error) {
		s.Engine.Proposer = p
		req := engine.Request{Prompt: prompt, MaxTokens: n, IgnoreEOS: true, NoDraft: p == nil}
		if p == mtpP {
			req.BlockSize = mtpP.BlockSize()
		} else {
			req.BlockSize = c.Int("block-size")
		}
		if replay >= 0 && p != nil {
			s.Engine.ReplayAccept = replayAccept(replay, replaySeed(i, run))
			defer func() { s.Engine.ReplayAccept = nil }()
		}
		return s.Generate(ctx, req, nil)
	}
	mtpExact, dflExact := true, true
	var plainAll, dflAll, mtpAll []float64
	for i, prompt := range prompts {
		for w := 0; w < c.Int("warmup"); w++ {
			for _, p := range []verify.Proposer{nil, dfl, mtpP} {
				if p == nil && w > 0 || p == dfl && dfl == nil {
					continue
				}
				if _, err := gen(p, prompt, i, -1-w); err != nil {
					return err
				}
			}
		}
		var plain []float64
		var dfRuns, mtpRuns speculativeRuns
		for r := range repeats {
			ref, err := gen(nil, prompt, i, r)
			if err != nil {
				return err
			}
			plain = append(plain, ref.Stats.GenerationTPS)
			for _, run := range []struct {
				p    verify.Proposer
				runs *speculativeRuns
			}{{dfl, &dfRuns}, {mtpP, &mtpRuns}} {
				if run.p == nil {
					continue
				}
				res, err := gen(run.p, prompt, i, r)
				if err != nil {
					return err
				}
				run.runs.add(res, ref)
			}
		}
		dflExact, mtpExact = dflExact && dfRuns.exact, mtpExact && mtpRuns.exact
		dTPS, dTau, mTPS, mTau := dfRuns.tps, dfRuns.tau, mtpRuns.tps, mtpRuns.tau
		row := mtpRow{Prompt: i, PlainTPS: median(plain), MTPTPS: median(mTPS), MTPTau: median(mTau)}
		if dfl != nil {
			row.DFlashTPS, row.DFlashTau = median(dTPS), median(dTau)
		}
		rep.Rows = append(rep.Rows, row)
		plainAll, dflAll, mtpAll = append(plainAll, row.PlainTPS), append(dflAll, row.DFlashTPS), append(mtpAll, row.MTPTPS)
	}
	rep.MedianPlainTPS, rep.MedianMTPTPS = median(plainAll), median(mtpAll)
	if dfl != nil {
		rep.MedianDFlashTPS = median(dflAll)
	}
	if replay < 0 && c.Float64("temperature") == 0 {
		rep.MTPExactGreedy = &mtpExact
		if dfl != nil {
			rep.DFlashExactGreedy = &dflExact
		}
	}
	if err := mlxc.Do(func() error {
		var err error
		rep.MTPStepMS, rep.TargetStepMS, err = mtpStepCost(s)
		return err
	}); err != nil {
		return err
	}
	if rep.TargetStepMS > 0 {
		rep.MTPStepOverStep = rep.MTPStepMS / rep.TargetStepMS
	}
	if c.Bool("json") {
		return printJSON(rep)
	}
	printMTPReport(rep)
	return nil
}

// speculativeRuns collects one proposer's runs of a prompt: speeds, τ, and whether
// every run gave plain decoding's tokens.
type speculativeRuns struct {
	tps, tau []float64
	exact    bool
	n        int
}

// add records a run against plain decoding's run ref.
func (s *speculativeRuns) add(res, ref engine.Result) {
	if s.n == 0 {
		s.exact = true
	}
	s.n++
	s.tps, s.tau = append(s.tps, res.Stats.GenerationTPS), append(s.tau, res.Stats.Tau)
	_, same := sameTokens(res.Tokens, ref.Tokens)
	s.exact = s.exact && same
}

// mtpStepCost times one-row steps of the MTP head and of the target after a 64-token
// context, each step evaluated before the next (ms per step, medians of 32). MLX thread.
func mtpStepCost(s *Session) (mtpMS, targetMS float64, err error) {
	const ctxLen, steps = 64, 32
	err = mlxc.Catch(func() {
		scope := mlxc.NewScope()
		defer scope.Close()
		m := s.Engine.Target
		V := m.Arch().VocabSize
		ids := make([]int32, ctxLen)
		for i := range ids {
			ids[i] = int32((i*7919 + 13) % min(V, 150000))
		}
		c := m.NewCache()
		defer c.Free()
		out := m.Forward(mlxc.FromSlice(ids, 1, ctxLen), c, model.ForwardOptions{Taps: []int{m.Arch().NumLayers - 1}, Logits: model.LogitsLast})
		hidden := s.MTPHead.TargetHidden(out.Hidden).Detach()
		defer hidden.Free()
		mlxc.Eval(append(c.Arrays(), hidden)...)
		hc := s.MTPHead.NewCache()
		defer hc.Free()
		mlxc.Eval(s.MTPHead.Step(mlxc.FromSlice(ids[1:], 1, ctxLen-1), mlxc.SliceAxis(hidden, 1, 0, ctxLen-1), hc, model.LogitsNone).Hidden)
		var mt, tt []float64
		row := mlxc.SliceAxis(hidden, 1, ctxLen-1, ctxLen)
		for i := range steps {
			inner := mlxc.NewScope()
			t := time.Now()
			o := s.MTPHead.Step(mlxc.FromSlice([]int32{ids[i%ctxLen]}, 1, 1), row, hc, model.LogitsLast)
			mlxc.Eval(mlxc.Argmax(o.Logits, -1, false))
			mt = append(mt, float64(time.Since(t))/1e6)
			_ = hc.Truncate(ctxLen - 1)
			t = time.Now()
			to := m.Forward(mlxc.FromSlice([]int32{ids[i%ctxLen]}, 1, 1), c, model.ForwardOptions{Logits: model.LogitsLast})
			mlxc.Eval(append(c.Arrays(), mlxc.Argmax(to.Logits, -1, false))...)
			tt = append(tt, float64(time.Since(t))/1e6)
			inner.Close()
		}
		mtpMS, targetMS = median(mt[steps/4:]), median(tt[steps/4:])
	})
	return mtpMS, targetMS, err
}

func printMTPReport(r mtpReport) {
	fmt.Printf("target %s, %s on %s, %d new tokens a run, %d repeats; MTP block %d\n", r.Target, r.Backend, r.Device, r.MaxTokens, r.Repeats, r.MTPBlock)
	if r.Note != "" {
		fmt.Println("note:", r.Note)
	}
	fmt.Printf("%6s %10s %10s %6s %10s %6s\n", "prompt", "plain", "dflash", "τ", "mtp", "τ")
	for _, row := range r.Rows {
		d := "-"
		dt := "-"
		if row.DFlashTPS > 0 {
			d, dt = fmt.Sprintf("%.1f", row.DFlashTPS), fmt.Sprintf("%.2f", row.DFlashTau)
		}
		fmt.Printf("%6d %10.1f %10s %6s %10.1f %6.2f\n", row.Prompt, row.PlainTPS, d, dt, row.MTPTPS, row.MTPTau)
	}
	fmt.Printf("median tok/s: plain %.1f, dflash %.1f, mtp %.1f\n", r.MedianPlainTPS, r.MedianDFlashTPS, r.MedianMTPTPS)
	fmt.Printf("one MTP head step %.3f ms, one target step %.3f ms (%.3fx)\n", r.MTPStepMS, r.TargetStepMS, r.MTPStepOverStep)
	if r.MTPExactGreedy != nil {
		fmt.Printf("greedy MTP equals plain decoding: %v", *r.MTPExactGreedy)
		if r.DFlashExactGreedy != nil {
			fmt.Printf("; DFlash: %v", *r.DFlashExactGreedy)
		}
		fmt.Println()
	}
}
