package model_test

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/internal/reftest"
	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/batchtest"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
	"github.com/dflash-mlx/dflash-mlx/settings"
)

// batchLengths are the rows' lengths of the benchmarks: even (every row about as long)
// or skewed (one long row among short ones, where padded keys compute the most waste).
var batchLengths = map[string]func(B int) []int{
	"even": func(B int) []int {
		l := make([]int, B)
		for r := range l {
			l[r] = 480 + 16*r
		}
		return l
	},
	"skewed": func(B int) []int {
		l := make([]int, B)
		for r := range l {
			l[r] = 48 + r
		}
		l[0] = 2000
		return l
	},
}

// BenchmarkBatchAttention is one batched decode step's attention in one layer of a
// Qwen3-8B shape (32 query heads, 8 KV heads of 128, bf16): the write of the new keys
// and the attention over each row's keys, per row (exact lengths) or padded under a mask.
func BenchmarkBatchAttention(b *testing.B) {
	const nH, nKV, hd = 32, 8, 128
	for _, B := range []int{4, 8} {
		for _, shape := range []string{"even", "skewed"} {
			for _, padded := range []bool{false, true} {
				name := fmt.Sprintf("B=%d/%s/%s", B, shape, modeName(padded))
				b.Run(name, func(b *testing.B) {
					err := mlxc.Do(func() error {
						lc := &model.BatchKVCache{}
						defer lc.Free()
						key := mlxc.RandomKey(1)
						for _, n := range batchLengths[shape](B) {
							s := mlxc.NewScope()
							k := mlxc.Normal([]int{1, nKV, n, hd}, mlxc.BFloat16, 0, 1, key)
							v := mlxc.Normal([]int{1, nKV, n, hd}, mlxc.BFloat16, 0, 1, key)
							if err := lc.Join(cache.Saved{Kind: "kv", Offset: n, Trimmable: true, Arrays: []*mlxc.Array{k, v}}); err != nil {
								return err
							}
							mlxc.Eval(lc.Arrays()...)
							s.Close()
						}
						ids := mlxc.Zeros([]int{B, 1}, mlxc.Int32).Detach()
						defer ids.Free()
						q := mlxc.Normal([]int{B, nH, 1, hd}, mlxc.BFloat16, 0, 1, key).Detach()
						kv := mlxc.Normal([]int{B, nKV, 1, hd}, mlxc.BFloat16, 0, 1, key).Detach()
						mlxc.Eval(q, kv)
						defer q.Free()
						defer kv.Free()
						b.ResetTimer()
						for range b.N {
							s := mlxc.NewScope()
							p := model.NewBatchPass("bench", lc.Lens(), 1, ids, model.BatchOptions{PaddedKeys: padded})
							o := p.Attend(lc, q, kv, kv, 0.088)
							p.Finish()
							mlxc.Eval(append(lc.Arrays(), o)...)
							s.Close()
						}
						return nil
					})
					if err != nil {
						b.Fatal(err)
					}
				})
			}
		}
	}
}

func modeName(padded bool) string {
	if padded {
		return "padded"
	}
	return "per-row"
}

// BenchmarkBatchDecode is a whole decode step of the trained Go-code target (Qwen3, six
// layers) for B rows, batched per row or padded, beside B = 1's single-sequence step
// (ns/op is per step: B tokens for the batched ones, one for B = 1).
func BenchmarkBatchDecode(b *testing.B) {
	dir := filepath.Join(reftest.RepoRoot(), "testdata", "gocode", "target")
	var m model.BatchModel
	if err := mlxc.Do(func() error {
		s := settings.ForTests()
		loaded, err := model.Load(dir, model.LoadOptions{Settings: &s})
		if err != nil {
			return err
		}
		m = loaded.(model.BatchModel)
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = mlxc.Do(func() error { m.Free(); return nil }) }()
	vocab := m.Arch().VocabSize
	b.Run("B=1/single", func(b *testing.B) {
		err := mlxc.Do(func() error {
			c := m.NewCache()
			defer c.Free()
			prompt := batchtest.Prompt(480, vocab, 1)
			m.Forward(mlxc.FromSlice(prompt, 1, len(prompt)), c, model.ForwardOptions{Logits: model.LogitsNone})
			mlxc.Eval(c.Arrays()...)
			b.ResetTimer()
			for range b.N {
				s := mlxc.NewScope()
				o := m.Forward(mlxc.FromSlice([]int32{7}, 1, 1), c, model.ForwardOptions{Logits: model.LogitsLast})
				mlxc.Eval(append(c.Arrays(), o.Logits)...)
				s.Close()
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
	})
	for _, B := range []int{4, 8} {
		for _, shape := range []string{"even", "skewed"} {
			for _, padded := range []bool{false, true} {
				b.Run(fmt.Sprintf("B=%d/%s/%s", B, shape, modeName(padded)), func(b *testing.B) {
					if err := mlxc.Do(func() error { return decodeBatch(b, m, batchLengths[shape](B), padded) }); err != nil {
						b.Fatal(err)
					}
				})
			}
		}
	}
}

// decodeBatch times batched decode steps over rows prefilled to the given lengths.
func decodeBatch(b *testing.B, m model.BatchModel, lens []int, padded bool) error {
	bt := m.NewBatch()
	defer bt.Free()
	for r, n := range lens {
		s := mlxc.NewScope()
		c := m.NewCache()
		prompt := batchtest.Prompt(n, m.Arch().VocabSize, uint32(r+1))
		m.Forward(mlxc.FromSlice(prompt, 1, n), c, model.ForwardOptions{Logits: model.LogitsNone})
		mlxc.Eval(c.Arrays()...)
		_, err := bt.Join(c)
		c.Free()
		mlxc.Eval(bt.Arrays()...)
		s.Close()
		if err != nil {
			return err
		}
	}
	ids := make([]int32, len(lens))
	b.ResetTimer()
	for range b.N {
		s := mlxc.NewScope()
		o := m.ForwardBatch(mlxc.FromSlice(ids, len(ids), 1), bt, model.BatchOptions{PaddedKeys: padded})
		mlxc.Eval(append(bt.Arrays(), o.Logits)...)
		s.Close()
	}
	return nil
}
