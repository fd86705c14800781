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

// generationQueue admits up to slots generations at once (the engine decodes that many
// requests in one batch) and lets at most maxWaiting requests wait for a slot, first come
// first served. A waiter whose context ends leaves the queue at once, so a client that
// disconnects while queued costs nothing.
type generationQueue struct {
	slots      int
	maxWaiting int
	// onArrival, when set, is told how many requests already wait each time a request
	// reaches the open queue (admitted, queued or refused), for the queue-depth histogram.
	// It is called without the lock held.
	onArrival func(waiting int)

	mu      sync.Mutex
	running int // slots held; it stays at slots while anyone waits (a release hands over)
	closed  bool
	waiters list.List // of *queueWaiter, oldest first
	// avgHold is a moving average of how long a generation holds a slot, for Retry-After.
	avgHold time.Duration
}

type queueWaiter struct {
	ready chan struct{} // closed when a slot is handed to this waiter
}

// newGenerationQueue returns a queue of slots concurrent generations (at least one) and
// maxWaiting waiting places.
func newGenerationQueue(slots, maxWaiting int) *generationQueue {
	return &generationQueue{slots: max(slots, 1), maxWaiting: maxWaiting}
}

// acquire waits for a generation slot. On success the caller must call release exactly
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
	waiting := q.waiters.Len()
	// Waiters only exist while every slot is held, so a free slot means nobody is ahead.
	if q.running < q.slots && waiting == 0 {
		q.running++
		q.mu.Unlock()
		q.arrived(waiting)
		return q.releaser(), nil
	}
	if waiting >= q.maxWaiting {
		q.mu.Unlock()
		q.arrived(waiting)
		return nil, errQueueFull
	}
	w := &queueWaiter{ready: make(chan struct{})}
	elem := q.waiters.PushBack(w)
	q.mu.Unlock()
	q.arrived(waiting)

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

func (q *generationQueue) arrived(waiting int) {
	if q.onArrival != nil {
		q.onArrival(waiting)
	}
}

// releaser returns the release function of one holding of a slot.
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
				close(front.Value.(*queueWaiter).ready) // the slot stays held, now theirs
				return
			}
			q.running--
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

// depth reports the waiting requests and the generations running.
func (q *generationQueue) depth() (waiting, running int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.waiters.Len(), q.running
}

// retryAfter estimates, in whole seconds, when a refused request could be admitted: the
// waiting and running requests, shared over the slots, at the recent average generation
// time.
func (q *generationQueue) retryAfter() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	work := q.avgHold * time.Duration(q.waiters.Len()+q.running)
	secs := int(math.Ceil(work.Seconds() / float64(q.slots)))
	return min(max(secs, 1), 300)
}
