package mlxc

import (
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dflash-mlx/dflash-mlx/internal/distest"
)

// distReport is what each rank of TestRingRank finds.
type distReport struct {
	Rank, Size int
	Sum        []float32
	Max, Min   []float32
	Gather     []int32
	GatherDims []int
	Received   []float32
	SplitErr   string
	ScatterErr string
}

// Three ranks of the ring backend over loopback: every collective's values, computed by
// hand, on every rank; neighbour send/recv around the ring; the backend's refusals (split,
// sum_scatter) as errors, not crashes.
func TestRingCollectives(t *testing.T) {
	if _, ok := distest.Rank(); ok {
		t.Skip("a rank process runs TestRingRank only")
	}
	ok, err := DistributedAvailable(BackendRing)
	if err != nil || !ok {
		t.Fatalf("ring backend not available: %v", err)
	}
	const n = 3
	results := distest.Run(t, n, "TestRingRank", 60*time.Second)
	for _, r := range results {
		if r.Err != nil {
			t.Fatalf("rank %d: %v\n%s", r.Rank, r.Err, r.Output)
		}
		var got distReport
		if err := json.Unmarshal(r.Report, &got); err != nil {
			t.Fatalf("rank %d report %q: %v\n%s", r.Rank, r.Report, err, r.Output)
		}
		prev := float32((r.Rank + n - 1) % n)
		want := distReport{
			Rank: r.Rank, Size: n,
			Sum:        []float32{1 + 2 + 3, 2 * (1 + 2 + 3), 0.5 * n},
			Max:        []float32{3, -1, 0.5},
			Min:        []float32{1, -3, 0.5},
			Gather:     []int32{0, 0, 1, 10, 2, 20},
			GatherDims: []int{3, 2},
			Received:   []float32{prev, prev + 0.25},
		}
		if !strings.Contains(got.SplitErr, "split") || !strings.Contains(got.ScatterErr, "sum_scatter") && !strings.Contains(got.ScatterErr, "not") {
			t.Errorf("rank %d: split error %q, sum_scatter error %q; want the ring's refusals", r.Rank, got.SplitErr, got.ScatterErr)
		}
		got.SplitErr, got.ScatterErr = "", ""
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("rank %d (-want +got):\n%s", r.Rank, diff)
		}
	}
}

// TestRingRank is one rank of TestRingCollectives (it runs only in a rank process).
func TestRingRank(t *testing.T) {
	rank, ok := distest.Rank()
	if !ok {
		t.Skip("runs as a rank of TestRingCollectives")
	}
	var rep distReport
	err := Do(func() error {
		g, err := InitDistributed(BackendRing, true)
		if err != nil {
			return err
		}
		defer g.Close()
		s := NewScope()
		defer s.Close()
		rep.Rank, rep.Size = g.Rank(), g.Size()
		if rep.Rank != rank {
			t.Errorf("group rank %d, MLX_RANK %d", rep.Rank, rank)
		}
		r := float32(rank)
		x := FromSlice([]float32{r + 1, 2 * (r + 1), 0.5}, 3)
		y := FromSlice([]float32{r + 1, -(r + 1), 0.5}, 3)
		rep.Sum = AllSum(x, g).Float32s()
		rep.Max = AllMax(y, g).Float32s()
		rep.Min = AllMin(y, g).Float32s()
		gathered := AllGather(FromSlice([]int32{int32(rank), int32(10 * rank)}, 1, 2), g)
		rep.Gather, rep.GatherDims = gathered.Int32s(), gathered.Shape()
		// Around the ring: even ranks send first, odd ranks receive first, so no two
		// neighbours wait on each other.
		n := g.Size()
		msg := FromSlice([]float32{r, r + 0.25}, 2)
		send := func() { Eval(Send(msg, (rank+1)%n, g)) }
		recv := func() { rep.Received = Recv([]int{2}, Float32, (rank+n-1)%n, g).Float32s() }
		if rank%2 == 0 {
			send()
			recv()
		} else {
			recv()
			send()
		}
		if _, err := g.Split(0, -1); err != nil {
			rep.SplitErr = err.Error()
		}
		if err := Catch(func() { Eval(SumScatter(FromSlice([]float32{1, 2, 3}, 3), g)) }); err != nil {
			rep.ScatterErr = err.Error()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := distest.Report(rep); err != nil {
		t.Fatal(err)
	}
}

// Without the launcher's variables a strict ring start is an error that names them, a
// lenient one a group of one rank whose collectives return their input, and an unknown
// backend is refused by name.
func TestDistributedInitErrors(t *testing.T) {
	if _, ok := distest.Rank(); ok {
		t.Skip("not in a rank process")
	}
	unsetenv(t, "MLX_RANK")
	unsetenv(t, "MLX_HOSTFILE")
	onMLX(t, func() {
		if _, err := InitDistributed(BackendRing, true); err == nil || !strings.Contains(err.Error(), "MLX_HOSTFILE") {
			t.Errorf("strict ring init without a hostfile: %v; want an error naming MLX_HOSTFILE", err)
		}
		for _, bad := range [][2]string{{"MLX_HOSTFILE", ""}, {"MLX_HOSTFILE", "/no/such/hostfile.json"}, {"MLX_RANK", "one"}} {
			os.Setenv(bad[0], bad[1])
			if _, err := InitDistributed(BackendRing, true); err == nil || !strings.Contains(err.Error(), bad[0]) {
				t.Errorf("%s=%q: %v; want an error naming %s", bad[0], bad[1], err, bad[0])
			}
			os.Unsetenv(bad[0])
		}
		if _, err := InitDistributed("tcp", true); err == nil || !strings.Contains(err.Error(), `"tcp"`) {
			t.Errorf("unknown backend: %v", err)
		}
		g, err := InitDistributed(BackendRing, false)
		if err != nil {
			t.Errorf("lenient ring init: %v", err)
			return
		}
		defer g.Close()
		if g.Size() != 1 || g.Rank() != 0 {
			t.Errorf("lenient group: rank %d of %d, want 0 of 1", g.Rank(), g.Size())
		}
		closeTo(t, "all_sum on one rank", AllSum(f32([]float32{1, 2}, 2), g).Float32s(), []float32{1, 2}, 0)
		g.Close()
		if err := Catch(func() { AllSum(f32([]float32{1}, 1), g) }); err == nil {
			t.Error("a closed group was used")
		}
	})
}

// unsetenv removes key for the test and puts its value back after.
func unsetenv(t *testing.T, key string) {
	t.Helper()
	if v, ok := os.LookupEnv(key); ok {
		t.Cleanup(func() { os.Setenv(key, v) })
	} else {
		t.Cleanup(func() { os.Unsetenv(key) })
	}
	os.Unsetenv(key)
}
