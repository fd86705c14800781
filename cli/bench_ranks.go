package cli

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// distSplit is what a split target's step spends on its collectives, measured on the
// ranks (bench --ranks N, or bench under a launcher).
type distSplit struct {
	Ranks   int    `json:"ranks"`
	Backend string `json:"backend"`
	// AllSumUS is the median microseconds of one all-sum of the residual stream's rows
	// (hidden size, the model's dtype) for 1 row (a decode step) and for the verify
	// block's rows, alone on the ranks.
	AllSumUS      float64 `json:"all_sum_us_1_row"`
	AllSumBlockUS float64 `json:"all_sum_us_block"`
	BlockRows     int     `json:"block_rows"`
	// CollectivesPerStep: two all-sums a layer (after attention or GatedDeltaNet, after the
	// MLP or MoE block).
	CollectivesPerStep int `json:"collectives_per_step"`
	// StepShare and CycleShare are the collectives' share of the median plain step and of
	// the median DFlash cycle (their all-sums timed alone, times their count).
	StepShare  float64 `json:"collective_share_of_step"`
	CycleShare float64 `json:"collective_share_of_cycle,omitempty"`
	// BytesPerToken is what each rank sends per decoded token: a ring all-sum of S bytes
	// sends 2·S·(N−1)/N from each rank.
	BytesPerToken float64 `json:"bytes_sent_per_token_per_rank"`
}

// benchOverRanks runs this bench command as n ranks on this machine (launch's way) and
// returns its exit: bench --ranks N.
func benchOverRanks(n int) error {
	return launchRanks(withoutFlag(os.Args[1:], "ranks"), n)
}

// withoutFlag drops --name VALUE and --name=VALUE (and the one-dash forms) from args.
func withoutFlag(args []string, name string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		if a == "--"+name || a == "-"+name {
			i++
			continue
		}
		if strings.HasPrefix(a, "--"+name+"=") || strings.HasPrefix(a, "-"+name+"=") {
			continue
		}
		out = append(out, a)
	}
	return out
}

// measureDistSplit times the all-sums of a step and of a verify block on the ranks (every
// rank runs it, in step) and relates them to the report's step and cycle.
func measureDistSplit(s *Session, backend string, rep *benchReport, block int) (*distSplit, error) {
	if !s.Shard.Split() {
		return nil, nil
	}
	a := s.Engine.Target.Arch()
	d := &distSplit{Ranks: s.Shard.Size, Backend: backend, BlockRows: block, CollectivesPerStep: 2 * a.NumLayers}
	err := mlxc.Do(func() error {
		return mlxc.Catch(func() {
			d.AllSumUS = timeAllSum(s, 1, a.HiddenSize, a.Dtype)
			d.AllSumBlockUS = timeAllSum(s, block, a.HiddenSize, a.Dtype)
		})
	})
	if err != nil {
		return nil, s.rankError(err)
	}
	var steps, cycles []float64
	for _, r := range rep.Rows {
		if r.PlainStepMS > 0 {
			steps = append(steps, r.PlainStepMS)
		}
		if r.CycleMS > 0 {
			cycles = append(cycles, r.CycleMS)
		}
	}
	if m := median(steps); m > 0 {
		d.StepShare = float64(d.CollectivesPerStep) * d.AllSumUS / 1000 / m
	}
	if m := median(cycles); m > 0 {
		d.CycleShare = float64(d.CollectivesPerStep) * d.AllSumBlockUS / 1000 / m
	}
	N := float64(d.Ranks)
	d.BytesPerToken = float64(d.CollectivesPerStep) * float64(a.HiddenSize*a.Dtype.Size()) * 2 * (N - 1) / N
	return d, nil
}

// timeAllSum is the median microseconds of an all-sum of rows × hidden values of dtype
// over the ranks, each evaluated alone (MLX thread, every rank in step).
func timeAllSum(s *Session, rows, hidden int, dtype mlxc.Dtype) float64 {
	sc := mlxc.NewScope()
	defer sc.Close()
	x := mlxc.Zeros([]int{rows, hidden}, dtype)
	mlxc.Eval(x)
	const warm, runs = 5, 41
	times := make([]float64, 0, runs)
	for i := range warm + runs {
		t0 := time.Now()
		mlxc.Eval(mlxc.AllSum(x, s.Shard.Group))
		if i >= warm {
			times = append(times, float64(time.Since(t0).Microseconds()))
		}
	}
	sort.Float64s(times)
	return times[len(times)/2]
}

func printDistSplit(d *distSplit) {
	if d == nil {
		return
	}
	fmt.Printf("split over %d ranks (%s): an all-sum takes %.0f µs for 1 row, %.0f µs for %d rows; %d a step: %.1f%% of a plain step",
		d.Ranks, d.Backend, d.AllSumUS, d.AllSumBlockUS, d.BlockRows, d.CollectivesPerStep, 100*d.StepShare)
	if d.CycleShare > 0 {
		fmt.Printf(", %.1f%% of a DFlash cycle", 100*d.CycleShare)
	}
	fmt.Printf("; %.0f bytes sent per token by each rank\n", d.BytesPerToken)
}
