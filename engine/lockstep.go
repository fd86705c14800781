package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// Lockstep runs one schedule on every rank of a split target (tensor parallelism): each
// step's forward sums partial products over the ranks, so every rank must build the same
// steps over the same rows in the same order, or the collectives pair wrong tensors (or
// wait forever). Rank 0's scheduler decides, once per iteration, which requests join and
// which end (cancelled by their clients, or their readers gone); the other ranks replay
// those decisions (Engine.Follow). Everything else a step decides is a function of what
// the ranks share: the rows' tokens, the sampling keys, the prefix cache's contents (the
// same inserts and evictions on every rank), fixed prefill chunks, and fixed speculation
// widths (a split target measures no costs: see Session.measureBlockCosts).
type Lockstep interface {
	// Exchange is called on every rank once per scheduler iteration, on the MLX thread.
	// Rank 0 passes its decisions; every rank gets rank 0's back. An error (a rank died
	// or stopped answering) ends the schedule on this rank.
	Exchange(mine Decisions) (Decisions, error)
}

// Decisions are what rank 0's scheduler decided in one iteration.
type Decisions struct {
	// Admit are the requests that join, in admission order.
	Admit []Admission `json:"admit,omitempty"`
	// End are the admitted requests their callers ended.
	End []uint64 `json:"end,omitempty"`
	// Quit: rank 0's scheduler is closing; the others return.
	Quit bool `json:"quit,omitempty"`
}

// Admission is one request as the other ranks rebuild it.
type Admission struct {
	ID   uint64 `json:"id"`
	Wire []byte `json:"wire"`
}

// Empty reports whether d decides nothing (a heartbeat).
func (d Decisions) Empty() bool { return len(d.Admit) == 0 && len(d.End) == 0 && !d.Quit }

// lockstepHeartbeat is how often an idle rank 0 exchanges empty decisions: the other ranks
// wait in the exchange meanwhile, and a rank that died is noticed within it.
const lockstepHeartbeat = time.Second

// lockstepChunk is a split target's prefill chunk while rows decode: a measured prefill
// rate differs between ranks, so chunks are a fixed number of positions.
const lockstepChunk = 256

// ErrSchedulerClosed is returned for requests given to a closed lockstep scheduler.
var ErrSchedulerClosed = errors.New("the scheduler is closed")

// RequestBuilder rebuilds a request from its wire form on a following rank; done is
// called once the request has ended (to free what the request holds: its constraint).
type RequestBuilder func(wire []byte) (req Request, done func(), err error)

// Follow runs rank 0's schedule on a following rank until rank 0 quits (nil) or the
// ranks fail (the error). Each admitted request is rebuilt with build; its output goes
// nowhere (rank 0 answers the clients). ctx only ends a follower that waits for rank 0
// between exchanges; a follower in an exchange ends when the exchange fails.
func (e *Engine) Follow(ctx context.Context, ls Lockstep, build RequestBuilder) error {
	return mlxc.Do(func() error {
		b := e.newLockstepBatcher(int(^uint(0) >> 1))
		live := map[uint64]followed{}
		ids := map[*sequence]uint64{}
		b.finished = func(q *sequence) {
			id := ids[q]
			delete(ids, q)
			if f, ok := live[id]; ok {
				f.release()
				delete(live, id)
			}
		}
		defer func() {
			b.free()
			for _, f := range live {
				f.release()
			}
		}()
		for {
			if err := ctx.Err(); err != nil {
				return err
			}
			d, err := ls.Exchange(Decisions{})
			if err != nil {
				return err
			}
			for _, a := range d.Admit {
				req, done, err := build(a.Wire)
				if err == nil {
					err = req.validate(e.ContextLen())
				}
				if err != nil {
					if done != nil {
						done()
					}
					return fmt.Errorf("request %d from rank 0: %w", a.ID, err)
				}
				qctx, cancel := context.WithCancel(context.Background())
				q := e.newSequence(qctx, req, nil, time.Now(), true)
				live[a.ID] = followed{cancel: cancel, done: done}
				ids[q] = a.ID
				b.admit(q)
			}
			for _, id := range d.End {
				if f, ok := live[id]; ok {
					f.cancel()
				}
			}
			if d.Quit {
				return nil
			}
			if !b.empty() {
				if err := b.iterate(); err != nil {
					return err
				}
			}
		}
	})
}

// newLockstepBatcher is a batcher of up to maxRows sequences that chunks prefills by
// lockstepChunk positions, alike on every rank.
func (e *Engine) newLockstepBatcher(maxRows int) *batcher {
	b := e.newBatcher(maxRows, 0)
	b.fixedChunk = lockstepChunk
	return b
}

// followed is a request a following rank runs: cancel ends its sequence, done frees what
// its builder made (nil: nothing).
type followed struct {
	cancel context.CancelFunc
	done   func()
}

// release ends the request and frees what it holds.
func (f followed) release() {
	f.cancel()
	if f.done != nil {
		f.done()
	}
}

// lockstepJob is rank 0's side of an admitted request under Lockstep: its sequence runs
// under a context the scheduler ends (on every rank in the same iteration) when the
// caller's ends or the caller's reader fails.
type lockstepJob struct {
	id     uint64
	caller context.Context
	cancel context.CancelFunc
	ended  bool // its end was sent
}

// driveLockstep is rank 0's scheduling loop under Lockstep: it runs for the scheduler's
// life, exchanging decisions every iteration while requests run and every
// lockstepHeartbeat while none does, until Close (Quit sent) or a failed exchange or step
// (every request fails with that error; Generate then refuses new ones).
func (s *Scheduler) driveLockstep() {
	defer close(s.stopped)
	var b *batcher
	jobs := map[*sequence]*scheduled{}
	fail := func(err error) {
		s.mu.Lock()
		s.fatal = err
		s.mu.Unlock()
		close(s.failedCh)
		s.refuseWaiting(err)
		for q, j := range jobs {
			if q.err == nil {
				q.err = err
			}
			j.res, j.err = q.result()
			close(j.done)
			delete(jobs, q)
		}
	}
	if err := mlxc.Do(func() error {
		b = s.e.newLockstepBatcher(s.cfg.MaxBatch)
		b.finished = func(q *sequence) {
			j := jobs[q]
			delete(jobs, q)
			j.ls.cancel()
			j.res, j.err = q.result()
			if j.err == nil && j.mb.failed() != nil {
				j.err = j.mb.failed()
			}
			close(j.done)
		}
		b.d.observe = func(rows int) {
			if s.cfg.OnStep != nil {
				s.cfg.OnStep(rows, s.Waiting())
			}
		}
		return nil
	}); err != nil {
		fail(err)
		return
	}
	for {
		var quit bool
		err := mlxc.Do(func() error {
			for {
				var err error
				if quit, err = s.lockstepIterate(b, jobs); err != nil || quit {
					if quit {
						b.free()
					}
					return err
				}
				s.mu.Lock()
				idle := b.empty() && len(s.waiting) == 0
				s.mu.Unlock()
				if idle {
					mlxc.ClearCache()
					return nil
				}
			}
		})
		if err != nil {
			// The group is broken: every admitted request fails with its error.
			_ = mlxc.Do(func() error {
				for q := range jobs {
					if q.err == nil {
						q.err = err
					}
				}
				_ = mlxc.Catch(b.free)
				return nil
			})
			fail(err)
			return
		}
		if quit {
			s.refuseWaiting(ErrSchedulerClosed)
			return
		}
		select {
		case <-s.wake:
		case <-s.closing:
		case <-time.After(lockstepHeartbeat):
		}
	}
}

// lockstepIterate decides this iteration's admissions and ends, exchanges them with the
// other ranks, applies them and runs one batcher iteration. MLX thread.
func (s *Scheduler) lockstepIterate(b *batcher, jobs map[*sequence]*scheduled) (quit bool, err error) {
	var admit []*scheduled
	s.mu.Lock()
	quit = s.quit
	for !quit && len(s.waiting) > 0 && b.room()-len(admit) > 0 {
		admit = append(admit, s.waiting[0])
		s.waiting = s.waiting[1:]
	}
	s.mu.Unlock()
	var mine Decisions
	for _, j := range admit {
		mine.Admit = append(mine.Admit, Admission{ID: j.ls.id, Wire: j.q.req.Wire})
	}
	for _, j := range jobs {
		if !j.ls.ended && (j.ls.caller.Err() != nil || j.mb.failed() != nil) {
			j.ls.ended = true
			mine.End = append(mine.End, j.ls.id)
		}
	}
	slices.Sort(mine.End)
	mine.Quit = quit
	if _, err := s.cfg.Lockstep.Exchange(mine); err != nil {
		// The admitted ones never reached the batcher: fail them with the rest.
		s.mu.Lock()
		s.waiting = append(admit, s.waiting...)
		s.mu.Unlock()
		return false, err
	}
	for _, j := range admit {
		jobs[j.q] = j
		b.admit(j.q)
	}
	for _, j := range jobs {
		if j.ls.ended {
			j.ls.cancel()
		}
	}
	if quit || b.empty() {
		return quit, nil
	}
	return false, b.iterate()
}

// refuseWaiting ends every request still waiting for admission with err (a lockstep
// scheduler that failed or closed; its loop runs no more).
func (s *Scheduler) refuseWaiting(err error) {
	s.mu.Lock()
	w := s.waiting
	s.waiting = nil
	s.mu.Unlock()
	for _, j := range w {
		j.err = err
		close(j.done)
	}
}

// refusal is why a lockstep scheduler takes no more requests (its ranks failed, or it
// was closed), nil while it takes them. s.mu held.
func (s *Scheduler) refusal() error {
	if s.fatal == nil && s.quit {
		return ErrSchedulerClosed
	}
	return s.fatal
}

// Close ends a lockstep scheduler: the requests still running end cancelled, those
// waiting and any given later are refused (ErrSchedulerClosed), and the other ranks
// return from Follow. The server calls it once it has drained. A scheduler without
// Lockstep has nothing to close.
func (s *Scheduler) Close() {
	if s.cfg.Lockstep == nil {
		return
	}
	s.mu.Lock()
	if !s.quit {
		s.quit = true
		close(s.closing)
	}
	s.mu.Unlock()
	<-s.stopped
}

// Failed is closed when a lockstep scheduler's ranks failed (Err says how); nil without
// Lockstep.
func (s *Scheduler) Failed() <-chan struct{} { return s.failedCh }

// Err is why a lockstep scheduler stopped: a rank's failure, or nil.
func (s *Scheduler) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fatal
}
