package verify

import (
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
	"github.com/dflash-mlx/dflash-mlx/model/qwen35"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
	"github.com/dflash-mlx/dflash-mlx/sample"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// The MTP proposer's drafts are, at every cycle, those of a fresh head run over the whole
// committed text at once: pairs (t[q+1], h[q]) for q < pos with the target's rows h and
// the staged token t[pos], then one step per further draft on the head's own row. The
// proposer is driven as the engine drives it (prefill rows, then each cycle the rows of
// the positions the previous verify committed, with the proposal or before it), with
// random acceptance lengths, with the staged token committed before or after its rows
// come, and through the prefix cache (saved, then resumed a few positions earlier in a
// fresh proposer); float32 on the CPU, so the
// drafts must agree exactly.
func TestMTPDraftsEqualAFreshHead(t *testing.T) {
	for _, c := range []struct {
		name string
		spec modelgen.Qwen35Spec
	}{
		{"dense", modelgen.TinyQwen35()},
		{"moe", modelgen.TinyQwen35MoE()},
	} {
		t.Run(c.name, func(t *testing.T) {
			spec := c.spec
			spec.MTP, spec.Dtype, spec.Seed = true, mlxc.Float32, 5
			dir := filepath.Join(t.TempDir(), "target")
			st := settings.ForTests()
			on(t, func() {
				if err := modelgen.WriteQwen35(dir, spec); err != nil {
					t.Fatal(err)
				}
				m, err := model.Load(dir, model.LoadOptions{Settings: &st, MTP: true})
				if err != nil {
					t.Fatal(err)
				}
				head := m.(*qwen35.Model).MTP()
				for seed := range uint64(4) {
					checkMTPDrafts(t, m, head, seed)
				}
			})
		})
	}
}

func checkMTPDrafts(t *testing.T, m model.Model, head *qwen35.MTP, seed uint64) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 9))
	const N, P, k = 48, 7, 4
	V := m.Arch().VocabSize
	text := make([]int32, N)
	for i := range text {
		text[i] = int32(rng.IntN(V))
	}
	s := mlxc.NewScope()
	defer s.Close()
	c := m.NewCache()
	defer c.Free()
	last := m.Arch().NumLayers - 1
	rows := m.Forward(mlxc.FromSlice(text, 1, N), c, model.ForwardOptions{Taps: []int{last}, Logits: model.LogitsNone}).Hidden
	mlxc.Eval(rows)
	span := func(a, b int) *mlxc.Array { return mlxc.SliceAxis(rows, 1, a, b) }

	p := NewMTP(head, k+1)
	p.Begin()
	defer func() { p.End() }()
	committed := P // tokens the engine's record holds
	p.SetTokens(func(q int) (int32, bool) {
		if q >= 0 && q < committed {
			return text[q], true
		}
		return 0, false
	})
	p.Context(span(0, P-1)) // the prefill's rows; the prompt's last row comes with the first proposal
	pos, given := P, P-1
	for cycle := 0; pos+k < N; cycle++ {
		if rng.IntN(2) == 0 {
			committed = pos + 1 // the staged token already in the engine's record
		}
		ctx := span(given, pos)
		if cycle%3 == 2 {
			// The prefix cache: the state after N ≤ pos positions saved, loaded into a
			// fresh proposer, and the rows from N on given again.
			p.Context(ctx)
			N := pos - rng.IntN(min(4, pos-1))
			saved, err := p.SaveContext(pos)
			if err != nil {
				t.Fatalf("seed %d cycle %d: save: %v", seed, cycle, err)
			}
			p.End()
			p = NewMTP(head, k+1)
			p.Begin()
			p.SetTokens(func(q int) (int32, bool) {
				if q >= 0 && q < committed {
					return text[q], true
				}
				return 0, false
			})
			err = p.LoadContext(saved, N)
			cache.FreeSaved(saved)
			if err != nil {
				t.Fatalf("seed %d cycle %d: load at %d: %v", seed, cycle, N, err)
			}
			ctx = nil
			if N < pos {
				ctx = span(N, pos)
			}
		}
		if ctx != nil && rng.IntN(2) == 0 {
			// The rows come first (as a plain step's do), the proposal without rows.
			p.Context(ctx)
			ctx = nil
		}
		got := mlxc.ToSlice[int32](p.Propose(text[pos], pos, ctx, k, sample.Params{}, nil).Tokens)
		given = pos
		want := freshDrafts(head, text, rows, pos, k)
		if !slices.Equal(got, want) {
			t.Fatalf("seed %d cycle %d at %d: drafts %v, a fresh head's %v", seed, cycle, pos, got, want)
		}
		a := rng.IntN(k + 1) // accepted drafts: positions pos..pos+a are committed
		pos += a + 1
		committed = pos
	}
}

// freshDrafts runs a new head cache over the pairs of positions 0..pos−1 and drafts k
// tokens greedily after staged text[pos].
func freshDrafts(head *qwen35.MTP, text []int32, rows *mlxc.Array, pos, k int) []int32 {
	c := head.NewCache()
	defer c.Free()
	out := head.Step(mlxc.FromSlice(text[1:pos+1], 1, pos), head.TargetHidden(mlxc.SliceAxis(rows, 1, 0, pos)), c, model.LogitsLast)
	var drafts []int32
	for i := range k {
		d := mlxc.ToSlice[int32](mlxc.AsType(mlxc.Argmax(mlxc.Reshape(out.Logits, -1), -1, false), mlxc.Int32))[0]
		drafts = append(drafts, d)
		if i == k-1 {
			break
		}
		L := out.Hidden.Dim(1)
		out = head.Step(mlxc.FromSlice([]int32{d}, 1, 1), mlxc.SliceAxis(out.Hidden, 1, L-1, L), c, model.LogitsLast)
	}
	return drafts
}
