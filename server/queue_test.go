package server

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

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

func TestQueueServesWaitersInArrivalOrder(t *testing.T) {
	q := newGenerationQueue(8)
	release, err := q.acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
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
	release()
	wg.Wait()
	for i, got := range order {
		if got != i {
			t.Fatalf("served in order %v, want 0..4", order)
		}
	}
	if waiting, running := q.depth(); waiting != 0 || running {
		t.Errorf("after all released: waiting %d running %v, want 0 false", waiting, running)
	}
}

func TestQueueRefusesWhenFull(t *testing.T) {
	q := newGenerationQueue(2)
	release, _ := q.acquire(context.Background())
	defer release()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for i := range 2 {
		go func() { _, _ = q.acquire(ctx) }()
		waitDepth(t, q, i+1)
	}
	if _, err := q.acquire(context.Background()); !errors.Is(err, errQueueFull) {
		t.Fatalf("third waiter: got %v, want errQueueFull", err)
	}
	if s := q.retryAfter(); s < 1 || s > 300 {
		t.Errorf("retryAfter %d outside 1..300", s)
	}
}

func TestQueueWaiterThatGivesUpLeavesTheQueue(t *testing.T) {
	q := newGenerationQueue(4)
	release, _ := q.acquire(context.Background())
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
	release()
	// The slot must be free again, not handed to the waiter that left.
	rel, err := q.acquire(context.Background())
	if err != nil {
		t.Fatalf("acquire after release: %v", err)
	}
	rel()
}

func TestQueueCloseRefusesNewButServesWaiting(t *testing.T) {
	q := newGenerationQueue(4)
	release, _ := q.acquire(context.Background())
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
	release()
	if err := <-served; err != nil {
		t.Fatalf("waiter queued before close: %v", err)
	}
}

func TestQueueReleaseIsIdempotent(t *testing.T) {
	q := newGenerationQueue(1)
	release, _ := q.acquire(context.Background())
	release()
	release()
	a, _ := q.acquire(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := q.acquire(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second holder: got %v, want to wait until the deadline", err)
	}
	a()
}
