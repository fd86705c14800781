package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// slotCounts are the queue sizes every queue test runs with: the one-at-a-time queue of a
// backend without ConcurrentBackend, and a batch of three.
var slotCounts = []int{1, 3}

// forEachSlotCount runs test once per entry of slotCounts.
func forEachSlotCount(t *testing.T, test func(t *testing.T, slots int)) {
	for _, slots := range slotCounts {
		t.Run(fmt.Sprintf("slots=%d", slots), func(t *testing.T) { test(t, slots) })
	}
}

// waitDepth polls until the queue has want waiters.
func waitDepth(t *testing.T, q *generationQueue, want int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if got, _ := q.depth(); got == want {
			return
		}
		if time.Now().After(deadline) {
			got, _ := q.depth()
			t.Fatalf("queue depth stayed %d, want %d", got, want)
		}
		time.Sleep(time.Millisecond)
	}
}

// fill takes the n slots q has free, failing the test if any acquire has to wait or a slot
// is left free; it returns the release functions.
func fill(t *testing.T, q *generationQueue, n int) []func() {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	releases := make([]func(), n)
	for i := range n {
		rel, err := q.acquire(ctx)
		if err != nil {
			t.Fatalf("holder %d of %d: %v", i+1, n, err)
		}
		releases[i] = rel
	}
	if waiting, running := q.depth(); waiting != 0 || running != q.slots {
		t.Fatalf("with every slot held: waiting %d running %d, want 0 %d", waiting, running, q.slots)
	}
	return releases
}

func TestQueueAdmitsOneGenerationPerSlot(t *testing.T) {
	forEachSlotCount(t, func(t *testing.T, slots int) {
		q := newGenerationQueue(slots, 4)
		releases := fill(t, q, slots)
		got := make(chan func(), 1)
		go func() {
			rel, err := q.acquire(context.Background())
			if err != nil {
				t.Errorf("the waiter: %v", err)
			}
			got <- rel
		}()
		waitDepth(t, q, 1)
		select {
		case <-got:
			t.Fatal("a request beyond the slots ran before any slot was free")
		case <-time.After(20 * time.Millisecond):
		}
		releases[0]()
		rel := <-got
		if waiting, running := q.depth(); waiting != 0 || running != slots {
			t.Errorf("after the hand-over: waiting %d running %d, want 0 %d", waiting, running, slots)
		}
		rel()
		releaseAll(t, q, releases[1:])
	})
}

func TestQueueServesWaitersInArrivalOrder(t *testing.T) {
	forEachSlotCount(t, func(t *testing.T, slots int) {
		q := newGenerationQueue(slots, 8)
		releases := fill(t, q, slots)
		var mu sync.Mutex
		var order []int
		var wg sync.WaitGroup
		for i := range 5 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rel, err := q.acquire(context.Background())
				if err != nil {
					t.Errorf("waiter %d: %v", i, err)
					return
				}
				mu.Lock()
				order = append(order, i)
				mu.Unlock()
				rel()
			}()
			waitDepth(t, q, i+1) // enqueue strictly one after the other
		}
		// One slot frees; the others stay held, so the waiters pass through it one by one
		// and the order they run in is the order they were served.
		releases[0]()
		wg.Wait()
		if want := []int{0, 1, 2, 3, 4}; !slices.Equal(order, want) {
			t.Fatalf("served in order %v, want %v", order, want)
		}
		releaseAll(t, q, releases[1:])
	})
}

func TestQueueRefusesWhenFull(t *testing.T) {
	forEachSlotCount(t, func(t *testing.T, slots int) {
		q := newGenerationQueue(slots, 2)
		for _, r := range fill(t, q, slots) {
			defer r()
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		fillWaiters(t, ctx, q, 2)
		if s := q.retryAfter(); s < 1 || s > 300 {
			t.Errorf("retryAfter %d outside 1..300", s)
		}
	})
}

func TestQueueWaiterThatGivesUpLeavesTheQueue(t *testing.T) {
	forEachSlotCount(t, func(t *testing.T, slots int) {
		q := newGenerationQueue(slots, 4)
		releases := fill(t, q, slots)
		ctx, cancel := context.WithCancel(context.Background())
		gaveUp := make(chan error, 1)
		go func() {
			_, err := q.acquire(ctx)
			gaveUp <- err
		}()
		waitDepth(t, q, 1)
		cancel()
		if err := <-gaveUp; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled waiter: got %v, want context.Canceled", err)
		}
		waitDepth(t, q, 0)
		releases[0]()
		// The slot must be free again, not handed to the waiter that left.
		if _, running := q.depth(); running != slots-1 {
			t.Fatalf("running %d after a release with nobody waiting, want %d", running, slots-1)
		}
		releases[0] = fill(t, q, 1)[0]
		for _, r := range releases {
			r()
		}
	})
}

// A slot handed to a waiter in the instant its context ends is passed on, never lost or
// doubled: afterwards exactly the slots not held are free. Run it under -race.
func TestQueueHandOverRacingCancelKeepsEverySlot(t *testing.T) {
	forEachSlotCount(t, func(t *testing.T, slots int) {
		q := newGenerationQueue(slots, 4)
		releases := fill(t, q, slots)
		for range 200 {
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan func(), 1)
			go func() {
				rel, err := q.acquire(ctx)
				if err != nil {
					rel = nil
				}
				done <- rel
			}()
			waitDepth(t, q, 1)
			go cancel()
			releases[0]()
			rel := <-done
			if rel == nil {
				// The waiter gave up: the slot is free, or was passed on and came back.
				rel = fill(t, q, 1)[0]
			}
			releases[0] = rel
			cancel()
			if waiting, running := q.depth(); waiting != 0 || running != slots {
				t.Fatalf("after the race: waiting %d running %d, want 0 %d", waiting, running, slots)
			}
		}
		releaseAll(t, q, releases)
	})
}

func TestQueueCloseRefusesNewButServesWaiting(t *testing.T) {
	forEachSlotCount(t, func(t *testing.T, slots int) {
		q := newGenerationQueue(slots, 4)
		releases := fill(t, q, slots)
		served := make(chan error, 1)
		go func() {
			rel, err := q.acquire(context.Background())
			if err == nil {
				rel()
			}
			served <- err
		}()
		waitDepth(t, q, 1)
		q.close()
		if _, err := q.acquire(context.Background()); !errors.Is(err, errDraining) {
			t.Fatalf("after close: got %v, want errDraining", err)
		}
		for _, r := range releases {
			r()
		}
		if err := <-served; err != nil {
			t.Fatalf("waiter queued before close: %v", err)
		}
	})
}

func TestQueueReleaseIsIdempotent(t *testing.T) {
	forEachSlotCount(t, func(t *testing.T, slots int) {
		q := newGenerationQueue(slots, 1)
		releases := fill(t, q, slots)
		releases[0]()
		releases[0]()
		releases[0] = fill(t, q, 1)[0]
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		if _, err := q.acquire(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("one holder more than the slots: got %v, want to wait until the deadline", err)
		}
		for _, r := range releases {
			r()
		}
	})
}

// Retry-After is the waiting and running requests shared over the slots at the average
// hold, in whole seconds within 1..300.
func TestQueueRetryAfterSharesTheWorkOverTheSlots(t *testing.T) {
	tests := []struct {
		slots, running, waiting int
		avgHold                 time.Duration
		want                    int
	}{
		{1, 1, 0, 10 * time.Second, 10},
		{1, 1, 2, 10 * time.Second, 30},
		{3, 3, 0, 10 * time.Second, 10},
		{3, 3, 3, 10 * time.Second, 20},
		{3, 3, 1, 10 * time.Second, 14}, // 13.3 rounds up
		{4, 4, 0, 100 * time.Millisecond, 1},
		{1, 1, 40, 10 * time.Second, 300},
		{2, 2, 0, 0, 1}, // nothing timed yet
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%d slots %d running %d waiting %v", tt.slots, tt.running, tt.waiting, tt.avgHold), func(t *testing.T) {
			q := newGenerationQueue(tt.slots, 64)
			q.running = tt.running
			for range tt.waiting {
				q.waiters.PushBack(&queueWaiter{ready: make(chan struct{})})
			}
			q.avgHold = tt.avgHold
			if got := q.retryAfter(); got != tt.want {
				t.Errorf("retryAfter %d, want %d", got, tt.want)
			}
		})
	}
}

// Every request that reaches the open queue reports the waiters ahead of it: admitted,
// queued or refused.
func TestQueueReportsTheWaitersEachArrivalFinds(t *testing.T) {
	forEachSlotCount(t, func(t *testing.T, slots int) {
		q := newGenerationQueue(slots, 2)
		var mu sync.Mutex
		var seen []int
		q.onArrival = func(waiting int) {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, waiting)
		}
		releases := fill(t, q, slots)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		fillWaiters(t, ctx, q, 2)
		q.close()
		_, _ = q.acquire(context.Background()) // refused before the queue: not an arrival
		want := append(make([]int, slots), 0, 1, 2)
		mu.Lock()
		got := slices.Clone(seen)
		mu.Unlock()
		if !slices.Equal(got, want) {
			t.Errorf("arrivals saw %v waiting, want %v", got, want)
		}
		cancel()
		waitDepth(t, q, 0)
		for _, r := range releases {
			r()
		}
	})
}

// releaseAll releases every holding and checks that the queue is then empty and idle.
func releaseAll(t *testing.T, q *generationQueue, releases []func()) {
	t.Helper()
	for _, r := range releases {
		r()
	}
	if waiting, running := q.depth(); waiting != 0 || running != 0 {
		t.Errorf("after all released: waiting %d running %d, want 0 0", waiting, running)
	}
}

// fillWaiters queues n waiters on ctx, each seen waiting before the next, and checks that
// one more is refused: the queue is full.
func fillWaiters(t *testing.T, ctx context.Context, q *generationQueue, n int) {
	t.Helper()
	for i := range n {
		go func() { _, _ = q.acquire(ctx) }()
		waitDepth(t, q, i+1)
	}
	if _, err := q.acquire(context.Background()); !errors.Is(err, errQueueFull) {
		t.Fatalf("waiter %d of a queue of %d: got %v, want errQueueFull", n+1, n, err)
	}
}
