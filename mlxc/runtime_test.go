package mlxc

import (
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

func TestRuntimeInfo(t *testing.T) {
	if err := Init(); err != nil {
		t.Fatal(err)
	}
	if v, h := Version(), HeaderVersion(); !strings.HasPrefix(v, h) {
		t.Errorf("runtime version %q does not match headers %q", v, h)
	}
	switch b := Backend(); b {
	case "cpu", "cuda", "metal":
	default:
		t.Errorf("Backend() = %q", b)
	}
	doMLX(t, func() {
		d := CurrentDevice()
		if d.GPU != (GPUCount() > 0 && Backend() != "cpu") {
			t.Errorf("device %v with backend %s and %d GPUs", d, Backend(), GPUCount())
		}
		if DefaultStream().Device() != d {
			t.Errorf("default stream on %v, device %v", DefaultStream().Device(), d)
		}
		info := DeviceInfo(d)
		if len(info) == 0 {
			t.Errorf("no device info for %v", d)
		}
		t.Logf("device %v: %v", d, info)
		// Work on a fresh stream of the same device, then back.
		prev := DefaultStream()
		s := NewStream(d)
		SetStream(s)
		sc := NewScope()
		closeTo(t, "op on a new stream", Add(f32([]float32{1}, 1), f32([]float32{2}, 1)).Float32s(), []float32{3}, 0)
		sc.Close()
		Synchronize(s)
		SetStream(prev)
		// The CPU stream always works (float64 lives there).
		SetStream(CPUStream())
		sc = NewScope()
		x, y := 0.1, 0.2
		if v := Sum(FromSlice([]float64{x, y}, 2), nil, false).Float(); v != x+y {
			t.Errorf("float64 sum on the CPU = %v", v)
		}
		sc.Close()
		SetStream(prev)
	})
}

// Do from many goroutines at once: jobs run one at a time, all on the one MLX thread, and
// each gets its own result.
func TestDoConcurrent(t *testing.T) {
	const goroutines, calls = 16, 40
	var inFlight, maxInFlight int32
	var tidMu sync.Mutex
	tids := map[int]bool{}
	var wg sync.WaitGroup
	errs := make(chan string, goroutines*calls)
	for gi := 0; gi < goroutines; gi++ {
		wg.Add(1)
		go func(gi int) {
			defer wg.Done()
			for c := 0; c < calls; c++ {
				v := float32(gi*1000 + c)
				var got []float32
				err := Do(func() error {
					n := atomic.AddInt32(&inFlight, 1)
					defer atomic.AddInt32(&inFlight, -1)
					for {
						m := atomic.LoadInt32(&maxInFlight)
						if n <= m || atomic.CompareAndSwapInt32(&maxInFlight, m, n) {
							break
						}
					}
					tidMu.Lock()
					tids[threadID()] = true
					tidMu.Unlock()
					s := NewScope()
					defer s.Close()
					a := FromSlice([]float32{v, 1}, 2)
					got = Multiply(a, Scalar(2, Float32)).Float32s()
					runtime.Gosched() // invite interleaving
					return nil
				})
				if err != nil {
					errs <- err.Error()
					return
				}
				if len(got) != 2 || got[0] != 2*v || got[1] != 2 {
					errs <- "wrong result"
					return
				}
			}
		}(gi)
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}
	if maxInFlight != 1 {
		t.Errorf("%d jobs ran at once on the MLX thread", maxInFlight)
	}
	if len(tids) != 1 && !tids[-1] {
		t.Errorf("jobs ran on %d OS threads, want 1", len(tids))
	}
}

// runtime.Goexit inside Do (what t.FailNow does) ends the MLX goroutine and its thread. Do
// returns an error, and the runtime carries on on a fresh thread: ops, compile, random and
// new streams all work there.
func TestDoGoexit(t *testing.T) {
	base := LiveArrays()
	var before int
	doMLX(t, func() { before = threadID() })
	// Keep an evaluated array across the thread change.
	var kept *Array
	doMLX(t, func() {
		kept = FromSlice([]float32{5, 6}, 2)
		Eval(kept)
	})
	for round := 0; round < 2; round++ {
		err := Do(func() error {
			s := NewScope()
			defer s.Close() // deferred calls run on Goexit, so the scope closes
			f32([]float32{1}, 1)
			runtime.Goexit()
			return nil
		})
		if err == nil || !strings.Contains(err.Error(), "Goexit") {
			t.Errorf("round %d: Do after Goexit returned %v, want an error naming Goexit", round, err)
		}
	}
	var after int
	doMLX(t, func() { after = threadID() })
	if after == before && after != -1 {
		t.Errorf("still on thread %d after Goexit", before)
	}
	onMLX(t, func() {
		closeTo(t, "op after Goexit", Add(f32([]float32{1, 2}, 2), f32([]float32{3, 4}, 2)).Float32s(), []float32{4, 6}, 0)
		closeTo(t, "array from the old thread", Multiply(kept, kept).Float32s(), []float32{25, 36}, 0)
		c := Compile(func(in []*Array) []*Array { return []*Array{Add(in[0], in[0])} }, false)
		closeTo(t, "compile after Goexit", c.Call(f32([]float32{1.5}, 1))[0].Float32s(), []float32{3}, 0)
		c.Free()
		if v := ToSlice[uint32](RandomSplit(RandomKey(1), 2)); len(v) != 4 {
			t.Errorf("random after Goexit: %v", v)
		}
		s := NewStream(CurrentDevice())
		prev := DefaultStream()
		SetStream(s)
		closeTo(t, "new stream after Goexit", Exp(f32([]float32{0}, 1)).Float32s(), []float32{1}, 0)
		SetStream(prev)
	})
	doMLX(t, func() { kept.Free() })
	if got := LiveArrays(); got != base {
		t.Errorf("live arrays %d after Goexit rounds, want %d", got, base)
	}
}
