package model_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
	"github.com/dflash-mlx/dflash-mlx/model"
	"github.com/dflash-mlx/dflash-mlx/model/cache"
	"github.com/dflash-mlx/dflash-mlx/modelgen"
)

// kvRow is a saved single-sequence KV state of n positions with nKV heads of hd.
func kvRow(n, nKV, hd int) cache.Saved {
	shape := []int{1, nKV, n, hd}
	return cache.Saved{Kind: "kv", Offset: n, Trimmable: true,
		Arrays: []*mlxc.Array{mlxc.Zeros(shape, mlxc.BFloat16), mlxc.Zeros(shape, mlxc.BFloat16)}}
}

// Wrong rows, states and steps are refused with an error naming the problem, and a
// refused change leaves the batch as it was.
func TestBatchRefusesWrongInput(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ckpt")
	writeModel(t, dir, modelgen.TinyQwen3())
	m := loadModel(t, dir).(model.BatchModel)
	cases := []struct {
		name, want string
		run        func(b cache.Batch) error
	}{
		{"join a recurrent state", `cannot join a "recurrent"`, func(cache.Batch) error {
			return (&model.BatchKVCache{}).Join(cache.Saved{Kind: "recurrent", Offset: 3})
		}},
		{"join rows of other heads", "does not fit rows", func(cache.Batch) error {
			lc := &model.BatchKVCache{}
			defer lc.Free()
			if err := lc.Join(kvRow(3, 2, 32)); err != nil {
				return err
			}
			return lc.Join(kvRow(3, 4, 32))
		}},
		{"keep rows out of order", "not increasing", func(b cache.Batch) error { return b.Keep([]int{1, 0}) }},
		{"keep a row past the batch", "not increasing rows of 2", func(b cache.Batch) error { return b.Keep([]int{0, 2}) }},
		{"leave a row past the batch", "row 5 of 2", func(b cache.Batch) error { return b.Leave(5, nil) }},
		{"extract a row past the batch", "row -1 of 2", func(b cache.Batch) error {
			c := m.NewCache()
			defer c.Free()
			return b.Extract(-1, c)
		}},
		{"step with one token for two rows", "ids must be [2, 1]", func(b cache.Batch) error {
			return mlxc.Catch(func() { m.ForwardBatch(mlxc.FromSlice([]int32{1}, 1, 1), b, model.BatchOptions{}) })
		}},
		{"step with two tokens per row", "ids must be [2, 1]", func(b cache.Batch) error {
			return mlxc.Catch(func() { m.ForwardBatch(mlxc.FromSlice([]int32{1, 2, 3, 4}, 2, 2), b, model.BatchOptions{}) })
		}},
		{"live marks too few rows", "live marks 1 rows of 2", func(b cache.Batch) error {
			return mlxc.Catch(func() {
				m.ForwardBatch(mlxc.FromSlice([]int32{1, 2}, 2, 1), b, model.BatchOptions{Live: []bool{true}})
			})
		}},
		{"widths for one row of two", "widths give 1 rows of 2", func(b cache.Batch) error {
			return forward(m, b, []int32{1}, model.BatchOptions{Widths: []int{1}})
		}},
		{"widths that do not sum to the tokens", "ids must be [1, 3]", func(b cache.Batch) error {
			return forward(m, b, []int32{1, 2}, model.BatchOptions{Widths: []int{2, 1}})
		}},
		{"a negative width", "row 0 has width -1", func(b cache.Batch) error {
			return forward(m, b, []int32{1}, model.BatchOptions{Widths: []int{-1, 2}})
		}},
		{"widths without a token", "give no row a token", func(b cache.Batch) error {
			return mlxc.Catch(func() {
				m.ForwardBatch(mlxc.Zeros([]int{1, 0}, mlxc.Int32), b, model.BatchOptions{Widths: []int{0, 0}})
			})
		}},
		{"live rows and widths", "live and widths both set", func(b cache.Batch) error {
			return forward(m, b, []int32{1, 2}, model.BatchOptions{Widths: []int{1, 1}, Live: []bool{true, false}})
		}},
		{"a tap past the layers", "tap layer 9 out of range", func(b cache.Batch) error {
			return forward(m, b, []int32{1, 2}, model.BatchOptions{Widths: []int{1, 1}, Taps: []int{9}})
		}},
		{"commit without a tentative step", "no tentative step", func(b cache.Batch) error {
			return b.Commit([]int{0, 0})
		}},
		{"keep past a row's width", "row 0 cannot keep 3 of the 2", func(b cache.Batch) error {
			return tentative(m, b, func() error { return b.Commit([]int{3, 0}) })
		}},
		{"keep counts for one row of two", "1 keep counts for 2 rows", func(b cache.Batch) error {
			return tentative(m, b, func() error { return b.Commit([]int{1}) })
		}},
		{"a step while a tentative one is uncommitted", "not committed", func(b cache.Batch) error {
			return tentative(m, b, func() error { return forward(m, b, []int32{1, 2}, model.BatchOptions{}) })
		}},
		{"a join while a tentative step is uncommitted", "not committed", func(b cache.Batch) error {
			return tentative(m, b, func() error {
				c := m.NewCache()
				defer c.Free()
				_, err := b.Join(c)
				return err
			})
		}},
		{"step over layers that hold other rows", "layer 1 holds rows of lengths []", func(cache.Batch) error {
			other := m.NewBatch()
			defer other.Free()
			if err := other.(*model.BatchKVCaches).Layers[0].Join(kvRow(3, 2, 32)); err != nil {
				return err
			}
			return mlxc.Catch(func() { m.ForwardBatch(mlxc.FromSlice([]int32{1}, 1, 1), other, model.BatchOptions{}) })
		}},
		{"step over another model's batch", "does not belong", func(cache.Batch) error {
			return mlxc.Catch(func() {
				other := model.NewBatchKVCaches(1)
				defer other.Free()
				m.ForwardBatch(mlxc.FromSlice([]int32{1}, 1, 1), other, model.BatchOptions{})
			})
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := mlxc.Do(func() error {
				s := mlxc.NewScope()
				defer s.Close()
				b := m.NewBatch()
				defer b.Free()
				for _, n := range []int{4, 2} {
					c := m.NewCache()
					m.Forward(mlxc.FromSlice(make([]int32, n), 1, n), c, model.ForwardOptions{Logits: model.LogitsNone})
					_, err := b.Join(c)
					c.Free()
					if err != nil {
						return err
					}
				}
				got := tc.run(b)
				if got == nil || !strings.Contains(got.Error(), tc.want) {
					t.Errorf("error %v, want one containing %q", got, tc.want)
				}
				if lens := b.Lens(); !slices.Equal(lens, []int{4, 2}) {
					t.Errorf("after a refused change the rows hold %v positions, want [4 2]", lens)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// forward runs one batched step of toks (packed [1, N] with opt.Widths, else [N, 1]) and
// returns its panic as an error.
func forward(m model.BatchModel, b cache.Batch, toks []int32, opt model.BatchOptions) error {
	return mlxc.Catch(func() {
		shape := []int{len(toks), 1}
		if opt.Widths != nil {
			shape = []int{1, len(toks)}
		}
		m.ForwardBatch(mlxc.FromSlice(toks, shape...), b, opt)
	})
}

// tentative runs a tentative step of widths 2 and 1 over the batch's two rows, then try,
// whose error it returns, then commits none of the step (the batch is as before it).
func tentative(m model.BatchModel, b cache.Batch, try func() error) error {
	if err := forward(m, b, []int32{5, 6, 7}, model.BatchOptions{Widths: []int{2, 1}, Tentative: true}); err != nil {
		return fmt.Errorf("the tentative step failed: %w", err)
	}
	err := try()
	if cerr := b.Commit([]int{0, 0}); cerr != nil {
		return fmt.Errorf("committing none after %v: %w", err, cerr)
	}
	return err
}
