package verify

import (
	"math/rand/v2"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/sample"
)

// Scripted proposes tokens from a known continuation: the first Correct(cycle, n) drafts
// are the reference's, the rest are deliberately wrong. Tests use it to force every
// acceptance length.
type Scripted struct {
	// Ref is the full reference sequence: prompt followed by the target's own continuation.
	Ref []int32
	// Correct decides how many leading drafts are right in a cycle.
	Correct func(cycle, n int) int
	// Vocab bounds the wrong tokens.
	Vocab int
	Block int
	Taps  []int

	cycle int
	buf   []int32
}

func (s *Scripted) TapLayers() []int { return s.Taps }
func (s *Scripted) BlockSize() int {
	if s.Block > 0 {
		return s.Block
	}
	return 16
}
func (s *Scripted) Begin()                  { s.cycle = 0 }
func (s *Scripted) Context(ctx *mlxc.Array) {}
func (s *Scripted) End()                    {}

// Propose returns Ref[pos+1 : pos+1+n] with errors after the chosen prefix. Beyond the end
// of Ref it proposes wrong tokens.
func (s *Scripted) Propose(staged int32, pos int, ctx *mlxc.Array, n int, sp sample.Params, keys *sample.Keys) Proposal {
	if n <= 0 {
		return Proposal{}
	}
	k := n
	if s.Correct != nil {
		k = min(max(s.Correct(s.cycle, n), 0), n)
	}
	s.cycle++
	if cap(s.buf) < n {
		s.buf = make([]int32, n)
	}
	out := s.buf[:n]
	for i := range out {
		j := pos + 1 + i
		var ref int32 = -1
		if j < len(s.Ref) {
			ref = s.Ref[j]
		}
		if i < k && ref >= 0 {
			out[i] = ref
		} else {
			// A token that differs from the reference (and so is rejected at greedy).
			out[i] = (max(ref, 0) + 1 + int32(i)) % int32(s.Vocab)
			if out[i] == ref {
				out[i] = (out[i] + 1) % int32(s.Vocab)
			}
		}
	}
	return Proposal{Tokens: mlxc.FromSlice(append([]int32(nil), out...), n)}
}

// ReplayCorrect makes drafts right independently with probability 1−errRate each (so the
// accepted prefix is geometric), seeded.
func ReplayCorrect(errRate float64, seed uint64) func(cycle, n int) int {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	return func(cycle, n int) int {
		k := 0
		for k < n && r.Float64() >= errRate {
			k++
		}
		return k
	}
}
