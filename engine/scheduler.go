package engine

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// SchedulerConfig configures a Scheduler.
type SchedulerConfig struct {
	// MaxBatch bounds the sequences decoded (or prefilled) at once; more wait, first come
	// first served. At most 1 for a target that cannot batch.
	MaxBatch int
	// PrefillSlice is the most time a joining sequence's prefill holds the running rows
	// between two of their steps (0: DefaultPrefillSlice; < 0: whole prompts, the running
	// rows waiting: to measure what slicing saves).
	PrefillSlice time.Duration
	// OnStep, when set, is called on the MLX thread after each decode step with the rows
	// it decoded and the requests still waiting for admission (metrics).
	OnStep func(rows, waiting int)
	// Lockstep, when set, makes this scheduler rank 0 of a split target: it runs for the
	// scheduler's life (Close ends it), shares each iteration's admissions and ends with
	// the other ranks (Engine.Follow), and every Request needs its Wire form.
	Lockstep Lockstep
}

// Scheduler runs many requests at once on one engine: they decode together, joining and
// leaving between steps (batcher); with a drafter, each request speculates in the
// same steps at its own width, plain rows riding along (decoder.plan decides the widths
// per step). Generate may be called from many goroutines.
//
// A request's text reaches its emit on the caller's goroutine, through a mailbox the
// MLX thread fills: a slow reader delays only itself. An emit error, a cancelled
// context or a bad request ends that request only.
type Scheduler struct {
	e   *Engine
	cfg SchedulerConfig

	mu      sync.Mutex
	waiting []*scheduled // submitted, not yet admitted (FIFO)
	running bool         // a loop holds the MLX thread

	// Under Lockstep: wake tells the loop that a request is waiting; quit (closing closed)
	// that Close was called; stopped is closed when the loop has returned; fatal is the
	// ranks' failure (failedCh closed with it); nextID numbers the requests.
	wake             chan struct{}
	quit             bool
	closing, stopped chan struct{}
	failedCh         chan struct{}
	fatal            error
	nextID           uint64
}

// scheduled is a sequence handed to the Scheduler with its mailbox.
type scheduled struct {
	q  *sequence
	mb mailbox
	// done is closed once the sequence is done with the engine; res and err are then set.
	done chan struct{}
	res  Result
	err  error
	// ls is the request's lockstep state (nil without Lockstep).
	ls *lockstepJob
}

// NewScheduler makes a scheduler over e.
func (e *Engine) NewScheduler(cfg SchedulerConfig) *Scheduler {
	cfg.MaxBatch = min(max(cfg.MaxBatch, 1), e.newDecoder().maxRows())
	s := &Scheduler{e: e, cfg: cfg}
	if cfg.Lockstep != nil {
		s.wake = make(chan struct{}, 1)
		s.closing, s.stopped, s.failedCh = make(chan struct{}), make(chan struct{}), make(chan struct{})
		s.running = true
		go s.driveLockstep()
	}
	return s
}

// MaxBatch is the most sequences decoded at once.
func (s *Scheduler) MaxBatch() int { return s.cfg.MaxBatch }

// Waiting is the number of requests waiting for admission.
func (s *Scheduler) Waiting() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.waiting)
}

// Generate runs one request among the others, calling emit (on this goroutine) with what
// each step commits. It returns when the request is done: finished, cancelled (ctx; also
// while it waits), or failed; an error from emit ends it and is returned.
func (s *Scheduler) Generate(ctx context.Context, req Request, emit func(Event) error) (Result, error) {
	if err := req.validate(s.e.ContextLen()); err != nil {
		return Result{}, err
	}
	j := &scheduled{done: make(chan struct{})}
	j.mb.wake = make(chan struct{}, 1)
	qctx := ctx
	if s.cfg.Lockstep != nil {
		if req.Wire == nil {
			return Result{}, errors.New("a split target's request needs its wire form (Request.Wire)")
		}
		// The sequence ends when the loop says so, on every rank at once; the caller's
		// context and reader only tell the loop.
		var cancel context.CancelFunc
		qctx, cancel = context.WithCancel(context.Background())
		j.ls = &lockstepJob{caller: ctx, cancel: cancel}
		j.mb.lockstep = true
	}
	j.q = s.e.newSequence(qctx, req, j.mb.post, time.Now(), true)
	s.mu.Lock()
	if s.cfg.Lockstep != nil {
		if err := s.refusal(); err != nil {
			s.mu.Unlock()
			j.ls.cancel()
			return Result{}, err
		}
		s.nextID++
		j.ls.id = s.nextID
	}
	s.waiting = append(s.waiting, j)
	start := !s.running
	s.running = true
	s.mu.Unlock()
	if start {
		go s.drive()
	}
	if s.wake != nil {
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
	for {
		select {
		case <-j.mb.wake:
			j.mb.deliver(emit)
		case <-ctx.Done():
			if s.withdraw(j) {
				return Result{FinishReason: FinishCancelled, Stats: Stats{Mode: "plain", PromptTokens: len(req.Prompt)}}, nil
			}
			// Admitted: the sequence ends at its next step; keep delivering until then.
			select {
			case <-j.done:
			case <-j.mb.wake:
				j.mb.deliver(emit)
				continue
			}
			return s.finish(j, emit)
		case <-j.done:
			return s.finish(j, emit)
		}
	}
}

// finish delivers what is left in j's mailbox and returns its outcome.
func (s *Scheduler) finish(j *scheduled, emit func(Event) error) (Result, error) {
	if err := j.mb.deliver(emit); err != nil && j.err == nil {
		j.err = err
	}
	return j.res, j.err
}

// withdraw removes j from the waiting list; false when it was admitted already.
func (s *Scheduler) withdraw(j *scheduled) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := slices.Index(s.waiting, j)
	if i < 0 {
		return false
	}
	s.waiting = slices.Delete(s.waiting, i, i+1)
	return true
}

// drive runs the scheduling loop on the MLX thread until no request is left.
func (s *Scheduler) drive() {
	err := mlxc.Do(func() error { s.loop(); return nil })
	if err != nil {
		// The runtime could not start: nothing can run; fail every waiting request.
		s.mu.Lock()
		w := s.waiting
		s.waiting, s.running = nil, false
		s.mu.Unlock()
		for _, j := range w {
			j.err = err
			close(j.done)
		}
	}
}

// loop admits waiting requests while there is room and iterates the batcher.
func (s *Scheduler) loop() {
	b := s.e.newBatcher(s.cfg.MaxBatch, s.cfg.PrefillSlice)
	jobs := map[*sequence]*scheduled{}
	b.finished = func(q *sequence) {
		j := jobs[q]
		delete(jobs, q)
		j.res, j.err = q.result()
		close(j.done)
	}
	b.d.observe = func(rows int) {
		if s.cfg.OnStep != nil {
			s.cfg.OnStep(rows, s.Waiting())
		}
	}
	defer b.free()
	for {
		s.mu.Lock()
		for len(s.waiting) > 0 && b.room() > 0 {
			j := s.waiting[0]
			s.waiting = s.waiting[1:]
			jobs[j.q] = j
			b.admit(j.q)
		}
		if b.empty() && len(s.waiting) == 0 {
			s.running = false
			s.mu.Unlock()
			mlxc.ClearCache()
			return
		}
		s.mu.Unlock()
		_ = b.iterate() // failures end the sequences they concern
	}
}

// mailbox carries a sequence's events from the MLX thread to its caller.
type mailbox struct {
	mu     sync.Mutex
	events []Event
	// stop is the caller's emit error: the MLX thread's next post returns it, which ends
	// the sequence.
	stop error
	wake chan struct{} // capacity 1: "events are waiting"
	// lockstep: post never fails (a split target's sequences end only when the scheduler
	// ends them on every rank); the scheduler reads stop through failed instead.
	lockstep bool
}

// failed is the caller's emit error, nil while it has not failed.
func (m *mailbox) failed() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.stop
}

// post queues ev (MLX thread); it fails once the caller's emit has.
func (m *mailbox) post(ev Event) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stop != nil && !m.lockstep {
		return m.stop
	}
	m.events = append(m.events, ev)
	select {
	case m.wake <- struct{}{}:
	default:
	}
	return nil
}

// deliver hands the queued events to emit (caller's goroutine), merged into one when
// several wait; emit's error is kept for post and returned.
func (m *mailbox) deliver(emit func(Event) error) error {
	m.mu.Lock()
	evs := m.events
	m.events = nil
	stop := m.stop
	m.mu.Unlock()
	if stop != nil || len(evs) == 0 || emit == nil {
		return stop
	}
	var ev Event
	for _, e := range evs {
		ev.Tokens = append(ev.Tokens, e.Tokens...)
		ev.Text += e.Text
	}
	if err := emit(ev); err != nil {
		m.mu.Lock()
		m.stop = err
		m.mu.Unlock()
		return err
	}
	return nil
}
