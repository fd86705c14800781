package server

import (
	"container/list"
	"context"
	"errors"
	"math"
	"sync"
	"time"
)

var (
	errQueueFull = errors.New("the request queue is full")
	errDraining  = errors.New("the server is shutting down")
)

// generationQueue admits one generation at a time (the engine has one MLX worker) and
// lets at most maxWaiting requests wait for it, first come first served. A waiter whose
// context ends leaves the queue at once, so a client that disconnects while queued costs
// nothing.
type generationQueue struct {
	maxWaiting int

	mu      sync.Mutex
	busy    bool
	closed  bool
	waiters list.List // of *queueWaiter, oldest first
	// avgHold is a moving average of how long a generation holds the slot, for Retry-After.
	avgHold time.Duration
}

type queueWaiter struct {
	ready chan struct{} // closed when the slot is handed to this waiter
}

func newGenerationQueue(maxWaiting int) *generationQueue {
	return &generationQueue{maxWaiting: maxWaiting}
}

// acquire waits for the generation slot. On success the caller must call release exactly
// once. It fails with errQueueFull when maxWaiting requests already wait, errDraining after
// close, or ctx's error when ctx ends first.
func (q *generationQueue) acquire(ctx context.Context) (release func(), err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return nil, errDraining
	}
	if !q.busy && q.waiters.Len() == 0 {
		q.busy = true
		q.mu.Unlock()
		return q.releaser(), nil
	}
	if q.waiters.Len() >= q.maxWaiting {
		q.mu.Unlock()
		return nil, errQueueFull
	}
	w := &queueWaiter{ready: make(chan struct{})}
	elem := q.waiters.PushBack(w)
	q.mu.Unlock()

	select {
	case <-w.ready:
		return q.releaser(), nil
	case <-ctx.Done():
		q.mu.Lock()
		select {
		case <-w.ready:
			// The slot was handed over just as ctx ended: pass it on.
			q.mu.Unlock()
			q.releaser()()
		default:
			q.waiters.Remove(elem)
			q.mu.Unlock()
		}
		return nil, ctx.Err()
	}
}

// releaser returns the release function of one holding of the slot.
func (q *generationQueue) releaser() func() {
	start := time.Now()
	var once sync.Once
	return func() {
		once.Do(func() {
			q.mu.Lock()
			defer q.mu.Unlock()
			held := time.Since(start)
			if q.avgHold == 0 {
				q.avgHold = held
			} else {
				q.avgHold = (q.avgHold*7 + held) / 8
			}
			if front := q.waiters.Front(); front != nil {
				q.waiters.Remove(front)
				close(front.Value.(*queueWaiter).ready) // the slot stays busy, now theirs
				return
			}
			q.busy = false
		})
	}
}

// close makes later acquires fail with errDraining; requests already waiting keep their
// place.
func (q *generationQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
}

// depth reports the waiting requests and whether a generation is running.
func (q *generationQueue) depth() (waiting int, running bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.waiters.Len(), q.busy
}

// retryAfter estimates, in whole seconds, when a refused request could be admitted: the
// waiting requests plus the running one, at the recent average generation time.
func (q *generationQueue) retryAfter() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	estimate := q.avgHold * time.Duration(q.waiters.Len()+1)
	secs := int(math.Ceil(estimate.Seconds()))
	return min(max(secs, 1), 300)
}
