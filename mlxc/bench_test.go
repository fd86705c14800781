package mlxc

import (
	"testing"
)

// chainLen is the number of adds built per scope; mlxc/bench/cpp_overhead.cpp and
// py_overhead.py build the same chains.
const chainLen = 1000

// BenchmarkAddOverhead measures what one tiny graph node costs through Go → C → MLX: one op
// is one Add on [1] float32 arrays, y = y + x, chained chainLen deep in a scope that is
// closed after each chain (so freeing the handles is included). ns/op is per Add.
//
//   - build: graph construction only.
//   - build+eval: the chain is also evaluated once at its end (the 1000 nodes run on the
//     default stream), so ns/op includes MLX's scheduling and execution per node.
//
// The whole loop runs inside one Do: it measures the binding, not the MLX thread's queue
// (BenchmarkDo measures that).
func BenchmarkAddOverhead(b *testing.B) {
	for _, v := range []struct {
		name string
		eval bool
	}{{"build", false}, {"build+eval", true}} {
		b.Run(v.name, func(b *testing.B) {
			err := Do(func() error {
				x := FromSlice([]float32{1}, 1)
				defer x.Free()
				chain := func(n int) {
					s := NewScope()
					y := x
					for j := 0; j < n; j++ {
						y = Add(y, x)
					}
					if v.eval {
						Eval(y)
					}
					s.Close()
				}
				chain(chainLen) // warm up
				b.ResetTimer()
				for done := 0; done < b.N; done += chainLen {
					chain(min(chainLen, b.N-done))
				}
				b.StopTimer()
				return nil
			})
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkDo is the round trip of an empty job through the MLX thread.
func BenchmarkDo(b *testing.B) {
	if err := Init(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := Do(func() error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
}
