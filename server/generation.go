package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"
)

// generation is one validated request, ready to run.
type generation struct {
	req GenerateRequest
	// initial are events decided before generation (from a tool-call response prefix).
	initial []chatEvent
	// parse turns output text (stop strings already cut) into events; finish flushes what
	// parse still holds at the end; toolCalls counts the tool calls parsed.
	parse     func(string) []chatEvent
	finish    func() []chatEvent
	toolCalls func() int
	// serverStops are stop strings the server applies itself instead of passing them to the
	// backend, for APIs that report which one matched (a backend ends at its stop strings
	// with the same FinishStop as at end of sequence).
	serverStops []string
	// writeError answers a request refused before its answer began, in its API's shape.
	writeError func(http.ResponseWriter, *apiError)
	// reasoning reports whether the answer is inside its reasoning (<think>) now; nil when
	// the output has no reasoning (text completions).
	reasoning func() bool
	// contextBound is true when the context, not the request's max tokens, set
	// req.MaxTokens (an agent API's cap that did not fit), so that running out of tokens
	// is running out of context.
	contextBound bool
}

// plainTextGeneration is a generation whose output is sent as it comes (text completions).
func plainTextGeneration(req GenerateRequest) *generation {
	var one [1]chatEvent
	return &generation{
		req: req,
		parse: func(text string) []chatEvent {
			one[0] = chatEvent{Content: text}
			return one[:]
		},
		finish:     func() []chatEvent { return nil },
		toolCalls:  func() int { return 0 },
		writeError: writeError,
	}
}

var (
	// errStopString is what emit returns to end a generation whose output reached a stop
	// string the backend did not catch.
	errStopString = errors.New("stop string reached")
	// errGenerationOver is what emit returns if a backend calls it after Generate returned.
	errGenerationOver = errors.New("emit called after Generate returned")
)

// runOutcome is what happened during Backend.Generate.
type runOutcome struct {
	result   GenerateResult
	err      error  // the backend's error
	stopped  bool   // the server's stop filter ended the output
	stopText string // the stop string the filter matched
	// reasoningTokens are the tokens of deltas that began inside the reasoning: a DFlash
	// cycle that crosses </think> counts whole, so this may exceed the reasoning by the
	// rest of one cycle.
	reasoningTokens int
	writeErr        error // sending to the client failed: it is gone
	firstText       time.Time
	ended           time.Time
}

// runGeneration waits for the generation slot, runs the generation and answers through
// out. Whatever happens, the slot is released and the request gets a complete answer, a
// clean error, or, when the client is gone, a connection closed without a response.
func (s *Server) runGeneration(w http.ResponseWriter, r *http.Request, g *generation, out answerWriter) {
	info := infoFrom(r.Context())
	ctx, cancel, watch := s.watchClient(r)
	defer cancel(nil)
	defer watch.stop()
	stopOnShutdown := context.AfterFunc(s.hardStop, func() { cancel(errDraining) })
	defer stopOnShutdown()
	informational := informationalProbe(w, r, watch.conn, s.cfg.WriteTimeout)
	watch.setProbe(informational)

	queued := time.Now()
	release, err := s.queue.acquire(ctx)
	info.queueWait = time.Since(queued)
	watch.setProbe(nil)
	if err != nil {
		s.refuse(ctx, w, info, err, g.writeError)
		return
	}
	defer release()
	s.metrics.observeQueueWait(info.queueWait)

	if err := out.begin(); err != nil {
		abandon(info)
	}
	if k, ok := out.(keepAliver); ok && s.cfg.StreamKeepAlive > 0 {
		defer k.keepAlive(s.cfg.StreamKeepAlive)() // stopped before the slot is released
	}
	if err := out.write(g.initial); err != nil {
		abandon(info)
	}
	if probe := out.probe(); probe != nil {
		watch.setProbe(probe)
	} else {
		watch.setProbe(informational)
	}
	run := s.generate(ctx, cancel, g, out)
	watch.setProbe(nil)
	s.answer(ctx, g, out, run, info)
}

// abandon ends a request whose client is gone, or cannot be written to, by closing the
// connection: an empty 200, or a stream ended cleanly without [DONE], would pass for an
// answer to a client that only half-closed its side.
func abandon(info *requestInfo) {
	info.statusOverride = statusClientClosed
	panic(http.ErrAbortHandler)
}

// refuse answers a request that never got the generation slot.
func (s *Server) refuse(ctx context.Context, w http.ResponseWriter, info *requestInfo, err error,
	writeError func(http.ResponseWriter, *apiError)) {
	switch {
	case errors.Is(err, errQueueFull):
		s.metrics.observeQueueRejected()
		waiting, running := s.queue.depth()
		writeError(w, &apiError{Status: http.StatusTooManyRequests, Type: typeRateLimit, Code: "queue_full",
			Message: fmt.Sprintf("the server is busy: %d generations run and %d requests wait; retry later",
				running, waiting),
			RetryAfter: s.queue.retryAfter()})
	case errors.Is(err, errDraining) || errors.Is(context.Cause(ctx), errDraining):
		writeError(w, unavailable("the server is shutting down"))
	default:
		abandon(info) // gone while queued; nobody to answer
	}
}

// generate calls the backend, passing its text through the stop filter and the parser to
// out as it comes. A failed write cancels ctx too: the client is gone, nothing the backend
// does from then on can reach it.
func (s *Server) generate(ctx context.Context, cancel context.CancelCauseFunc, g *generation, out answerWriter) *runOutcome {
	run := &runOutcome{}
	filter := newStopFilter(append(slices.Clone(g.req.Stop), g.serverStops...))
	var mu sync.Mutex // makes a late emit harmless instead of racing the final writes
	returned := false
	emit := func(d Delta) error {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case returned:
			return errGenerationOver
		case run.writeErr != nil:
			return run.writeErr
		case run.stopped:
			return errStopString
		}
		if run.firstText.IsZero() {
			run.firstText = time.Now()
		}
		if g.reasoning != nil && g.reasoning() {
			run.reasoningTokens += d.Tokens
		}
		safe, matched := filter.push(d.Text)
		if safe != "" {
			if err := out.write(g.parse(safe)); err != nil {
				run.writeErr = err
				cancel(errClientGone)
				return err
			}
		}
		if matched {
			run.stopped, run.stopText = true, filter.matchedStop
			return errStopString
		}
		return nil
	}
	result, err := s.backend.Generate(ctx, g.req, emit)
	mu.Lock()
	defer mu.Unlock()
	returned = true
	run.result, run.err, run.ended = result, err, time.Now()
	if run.writeErr == nil && !run.stopped && err == nil {
		// Text the filter held back because it looked like the start of a stop string.
		if tail := filter.flush(); tail != "" {
			run.writeErr = out.write(g.parse(tail))
		}
	}
	if run.writeErr == nil && (err == nil || run.stopped) {
		run.writeErr = out.write(g.finish())
	}
	return run
}

// answer finishes the response after the backend returned.
func (s *Server) answer(ctx context.Context, g *generation, out answerWriter, run *runOutcome, info *requestInfo) {
	res := run.result
	promptTokens := res.PromptTokens
	if promptTokens == 0 {
		promptTokens = len(g.req.Prompt)
	}
	stats := s.stats(run, info)
	info.generated, info.promptTokens, info.completionTokens = true, promptTokens, res.CompletionTokens
	info.tau, info.tokensPerSecond = stats.Tau, stats.TokensPerSecond

	outcome := "cancelled"
	defer func() {
		info.finish = outcome
		s.metrics.observeGeneration(info.endpoint, outcome, promptTokens, res.CompletionTokens, stats)
	}()
	interrupted := !run.stopped && (run.err != nil || res.FinishReason == FinishCancelled)
	switch {
	case run.writeErr != nil || errors.Is(context.Cause(ctx), errClientGone):
		abandon(info)
	case interrupted && errors.Is(context.Cause(ctx), errDraining):
		out.abort(unavailable("the server is shutting down; the generation was cancelled"))
		return
	case run.err != nil && !run.stopped:
		outcome = "error"
		s.log.Error("generation failed", "id", info.id, "err", run.err)
		out.abort(internalError("generation failed: " + run.err.Error()))
		return
	case !run.stopped && res.FinishReason == FinishCancelled:
		outcome = "error"
		s.log.Error("backend reported a cancellation nobody asked for", "id", info.id)
		out.abort(internalError("the generation was cancelled inside the engine"))
		return
	}

	finish := string(FinishStop)
	if !run.stopped && res.FinishReason == FinishLength {
		finish = string(FinishLength)
	}
	if finish == string(FinishStop) && g.toolCalls() > 0 {
		finish = "tool_calls"
	}
	outcome = finish
	o := outcomeFor(finish, promptTokens, res.CompletionTokens, stats)
	o.contextBound, o.reasoningTokens = g.contextBound, min(run.reasoningTokens, res.CompletionTokens)
	if run.stopped && finish == string(FinishStop) {
		o.stopSequence = run.stopText
	}
	if err := out.end(o); err != nil {
		abandon(info)
	}
}

func outcomeFor(finish string, promptTokens, completionTokens int, stats dflashStats) outcome {
	return outcome{
		finish: finish,
		usage: usage{PromptTokens: promptTokens, CompletionTokens: completionTokens, TotalTokens: promptTokens + completionTokens,
			PromptTokensDetails: promptTokensDetails{CachedTokens: stats.CachedPromptTokens}},
		stats: stats,
	}
}

// stats builds the dflash report, filling what the backend left at zero from what can be
// derived: τ from tokens and cycles, speed from the decode time or the server's own clock.
func (s *Server) stats(run *runOutcome, info *requestInfo) dflashStats {
	res := run.result
	st := dflashStats{
		Tau: res.Tau, Cycles: res.Cycles,
		Drafted: res.Drafted, Accepted: res.Accepted, BatchSize: res.BatchSize,
		PrefillMS: ms(res.PrefillTime), DecodeMS: ms(res.DecodeTime),
		DraftMS: ms(res.DraftTime), VerifyMS: ms(res.VerifyTime),
		QueueMS:            ms(info.queueWait),
		CachedPromptTokens: res.CachedPromptTokens,
		TokensPerSecond:    decodeRate(run),
	}
	if st.Tau == 0 && res.Cycles > 0 {
		st.Tau = float64(res.CompletionTokens) / float64(res.Cycles)
	}
	if res.Drafted > 0 {
		st.AcceptanceRate = ptr(float64(res.Accepted) / float64(res.Drafted))
	}
	return st
}

// minRateInterval is the shortest decode time a speed is reported over. Below it a rate
// measures the clock and the scheduler, not decoding: a one-token answer, whose decode time
// is next to nothing, once reported 59 259 tok/s. A real decode step takes longer.
const minRateInterval = time.Millisecond

// decodeRate is the decode speed of a generation, in tokens per second: the completion
// tokens after the first over the time from the first to the last (the first comes out of
// the prefill, so it has no decode time of its own). The interval is the backend's
// DecodeTime or, when it reports none, the server's clock from the first text to the end.
// It is nil with fewer than two tokens or an interval under minRateInterval: no rate is
// honest there. A backend's own TokensPerSecond is used when it gives one.
func decodeRate(run *runOutcome) *float64 {
	res := run.result
	if res.CompletionTokens < 2 {
		return nil
	}
	interval := res.DecodeTime
	if interval == 0 && !run.firstText.IsZero() {
		interval = run.ended.Sub(run.firstText)
	}
	if interval < minRateInterval {
		return nil
	}
	rate := res.TokensPerSecond
	if rate <= 0 {
		rate = float64(res.CompletionTokens-1) / interval.Seconds()
	}
	return &rate
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
