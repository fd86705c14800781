package engine

import (
	"context"
	"time"

	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/sample"
	"github.com/dflash-mlx/dflash-mlx/verify"
)

// sequence is one request in the decoder: its tokens and output, its sampling state and
// key stream, its statistics, and its caches while it prefills or decodes alone (in a
// batch of several rows the decoder's batched caches hold it).
type sequence struct {
	req  Request
	ctx  context.Context
	emit func(Event) error // nil: nothing to report
	o    *output
	st   Stats
	keys *sample.Keys
	// penalty: the repetition penalty is on, so each step needs the previous token's value
	// (the steps of a batch holding such a row are not built ahead).
	penalty bool
	// history is the last prompt token followed by every token read.
	history []int32
	// built counts the tokens built for the sequence (tokens read plus the one in flight).
	built int
	// steps counts the steps (plain or speculative) the sequence was in.
	steps int
	// c holds the sequence's layers while it prefills and while it is the decoder's only
	// row; nil while a batch holds it.
	c  model.Cache
	pf *prefillJob
	// err ends the sequence: emit's error, or the failure of a step that held it.
	err error
	// start is when the request arrived; firstTok when its first token was read.
	start, firstTok time.Time
	// stepRows sums the rows of the steps the sequence was in (its mean batch size).
	stepRows int
	// dr is the sequence's drafter state when it speculates (nil: plain decoding).
	dr *drafting
	// cons is the request's constraint (nil: none): every step masks the row's logits
	// with it, so the steps of a batch holding such a row are not built ahead.
	cons *constrained
}

// newSequence makes the sequence of a validated request; its budget is clamped to the
// context. With a drafter loaded (and the request not NoDraft) it speculates: through
// the engine's proposer, or with fork through one of its own (several sequences at once).
func (e *Engine) newSequence(ctx context.Context, req Request, emit func(Event) error, start time.Time, fork bool) *sequence {
	e.budget(&req)
	s := &sequence{req: req, ctx: ctx, emit: emit, start: start, keys: newKeys(req.Sampling)}
	s.o = newOutput(req, e.Target.Arch().EOSTokenIDs)
	s.st = Stats{Mode: "plain", PromptTokens: len(req.Prompt)}
	s.penalty = req.Sampling.RepetitionPenalty > 0 && req.Sampling.RepetitionPenalty != 1
	if req.Constraint != nil {
		s.cons = &constrained{m: req.Constraint}
	}
	s.history = []int32{req.Prompt[len(req.Prompt)-1]}
	if e.Proposer != nil && !req.NoDraft {
		if s.dr = newDrafting(e, req, fork); s.dr != nil {
			s.st = newDFlashStats(false, len(req.Prompt), s.dr.maxW)
			if tc, ok := s.dr.p.(verify.TokenContext); ok {
				tc.SetTokens(s.tokenAt)
			}
		}
	}
	if req.MaxTokens == 0 {
		s.o.end(FinishLength)
	}
	return s
}

// tokenAt is the committed token at position p: the prompt's, then the history's (whose
// first token is the prompt's last).
func (s *sequence) tokenAt(p int) (int32, bool) {
	P := len(s.req.Prompt)
	if p < 0 {
		return 0, false
	}
	if p < P {
		return s.req.Prompt[p], true
	}
	if j := p - P + 1; j < len(s.history) {
		return s.history[j], true
	}
	return 0, false
}

// over reports whether the sequence has ended: its output is complete, it failed, or its
// request was cancelled (which ends it here).
func (s *sequence) over() bool {
	if s.o.done || s.err != nil {
		return true
	}
	if s.ctx.Err() != nil {
		s.o.end(FinishCancelled)
		return true
	}
	return false
}

// wantsStep reports whether another step should be built for the sequence: it has not
// ended and the token budget leaves room for one more beyond those in flight.
func (s *sequence) wantsStep() bool { return !s.over() && s.built < s.req.MaxTokens }

// take commits a token read from a step and reports it.
func (s *sequence) take(tok int32, now time.Time) {
	if s.firstTok.IsZero() {
		s.firstTok = now
		s.st.FirstTokenTime = now.Sub(s.start)
		s.st.PrefillTime = s.st.FirstTokenTime
	}
	s.history = append(s.history, tok)
	n := len(s.o.tokens)
	s.o.push(tok)
	s.constrain(n)
	s.report()
}

// constrain commits the tokens the output took since it held n to the constraint.
func (s *sequence) constrain(n int) {
	if s.cons != nil && s.err == nil {
		s.cons.commit(s, s.o.tokens[n:])
	}
}

// readFirst reports whether the sequence's next step needs the tokens of the step in
// flight on the host before it is built: a repetition penalty reads them, and a
// constraint's mask follows them.
func (s *sequence) readFirst() bool { return s.penalty || s.cons != nil }

// last is the sequence's staged token: the input of its next step.
func (s *sequence) last() int32 { return s.history[len(s.history)-1] }

// takeAll commits the tokens a speculative step read (its accepted drafts and the
// target's next token) and reports them. All of them join the history, which the caches
// hold but for the last; the output takes them up to its end.
func (s *sequence) takeAll(toks []int32, now time.Time) {
	if s.firstTok.IsZero() {
		s.firstTok = now
		s.st.FirstTokenTime = now.Sub(s.start)
		s.st.PrefillTime = s.st.FirstTokenTime
	}
	n := len(s.o.tokens)
	for _, t := range toks {
		s.history = append(s.history, t)
		if !s.o.done {
			s.o.push(t)
		}
	}
	s.built = len(s.history) - 1
	s.constrain(n)
	s.report()
}

// report hands the output accumulated since the last report to emit; an error from emit
// ends the sequence.
func (s *sequence) report() {
	if s.err != nil {
		return
	}
	if err := emitPending(s.o, s.emit); err != nil {
		s.err = err
	}
}

// fed is what the sequence's caches hold: the prompt and the tokens read after the last
// prompt token, at most n of them in all.
func (s *sequence) fed(n int) []int32 {
	fed := append(append([]int32(nil), s.req.Prompt...), s.history[1:]...)
	return fed[:min(len(fed), n)]
}

// result is the sequence's outcome once it has ended.
func (s *sequence) result() (Result, error) {
	s.st.GeneratedTokens = len(s.o.tokens)
	if !s.firstTok.IsZero() {
		finishStats(&s.st, s.firstTok, time.Now())
	}
	if s.steps > 0 {
		s.st.BatchSize = float64(s.stepRows) / float64(s.steps)
	}
	return Result{Tokens: s.o.tokens, Text: s.o.text.String(), FinishReason: s.o.finish, Stats: s.st}, s.err
}
