package mlxc

import (
	"errors"
	"strings"
	"testing"
)

// Failing ops panic with *Error; Catch and Do turn that into an error, nothing leaks, and the
// runtime keeps working.
func TestOpErrors(t *testing.T) {
	base := LiveArrays()
	onMLX(t, func() {
		a := f32(seq(6), 2, 3)
		freed := f32([]float32{1}, 1)
		freed.Free()
		inScope := LiveArrays()
		cases := []struct {
			name, sub string
			fn        func()
		}{
			{"add [2,3] + [4]", "broadcast", func() { Add(a, f32(seq(4), 4)) }},
			{"matmul inner dims", "matmul", func() { Matmul(a, a) }},
			{"reshape to a wrong size", "reshape", func() { Reshape(a, 4) }},
			{"bad dtype code (from bytes)", "dtype", func() { FromBytes(make([]byte, 4), []int{1}, Dtype(99)) }},
			{"bad dtype code (astype)", "dtype", func() { AsType(a, Dtype(-3)) }},
			{"bad dtype code (zeros)", "dtype", func() { Zeros([]int{2}, Dtype(42)) }},
			{"wrong byte count", "bytes", func() { FromBytes(make([]byte, 5), []int{2}, Float32) }},
			{"negative dimension", "negative", func() { FromSlice([]float32{}, -1) }},
			{"use of a freed array", "freed", func() { Add(freed, a) }},
			{"read of a freed array", "freed", func() { freed.Float32s() }},
			{"nil array", "nil", func() { Exp(nil) }},
			{"sum axis out of range", "axis", func() { Sum(a, []int{5}, false) }},
			{"swapaxes out of range", "axis", func() { SwapAxes(a, 0, 7) }},
			{"softmax axis out of range", "axis", func() { Softmax(a, []int{3}, false) }},
			{"argmax axis out of range", "axis", func() { Argmax(a, -4, false) }},
			{"SliceAxis axis out of range", "axis", func() { SliceAxis(a, 2, 0, 1) }},
			{"Dim out of range", "axis", func() { a.Dim(3) }},
			{"concatenate shape mismatch", "concatenate", func() { Concatenate([]*Array{a, f32(seq(4), 2, 2)}, 0) }},
			{"concatenate nothing", "no arrays", func() { Concatenate(nil, 0) }},
			{"take with float indices", "", func() { Take(a, f32([]float32{0}, 1), 0) }},
			{"slice start/stop lengths", "differ", func() { Slice(a, []int{0}, []int{1, 2}) }},
			{"squeeze a non-1 axis", "squeeze", func() { Squeeze(a, 0) }},
			{"rope with odd dims", "", func() { RoPE(f32(seq(6), 1, 2, 3), 3, false, 10000, 1, 0, nil) }},
			{"sdpa with rank-2 inputs", "", func() { ScaledDotProductAttention(a, a, a, 1, MaskNone, nil, nil) }},
			{"sdpa with an unknown mask mode", "", func() {
				q := Zeros([]int{1, 1, 2, 4}, Float32)
				ScaledDotProductAttention(q, q, q, 1, "sideways", nil, nil)
			}},
			{"quantize bad group size", "group", func() { Quantize(Zeros([]int{4, 64}, Float32), 7, 4, "") }},
			{"conv1d channel mismatch", "", func() { Conv1D(f32(seq(6), 1, 3, 2), f32(seq(3), 1, 3, 1), 1, 0, 1, 1) }},
			{"item of many elements", "elements", func() { a.Int() }},
			{"uniform of an int dtype", "floating", func() { Uniform(0, 1, []int{3}, Int32, RandomKey(1)) }},
			{"uniform with a negative dimension", "negative", func() { Uniform(0, 1, []int{-3}, Float32, RandomKey(1)) }},
			{"normal of an int dtype", "", func() { Normal([]int{3}, Int32, 0, 1, RandomKey(1)) }},
			{"categorical axis out of range", "", func() { Categorical(a, 4, RandomKey(1)) }},
		}
		for _, c := range cases {
			s := NewScope()
			wantErr(t, c.name, c.sub, c.fn)
			s.Close()
			if got := LiveArrays(); got != inScope {
				t.Errorf("%s: live arrays %d, want %d (a failed op leaked a handle)", c.name, got, inScope)
				inScope = got
			}
		}
		closeTo(t, "ops after errors", Add(a, a).Float32s(), []float32{0, 2, 4, 6, 8, 10}, 0)
	})
	if got := LiveArrays(); got != base {
		t.Errorf("live arrays %d after the error cases, want %d", got, base)
	}

	// Do returns the op's error, as a *Error.
	err := Do(func() error {
		s := NewScope()
		defer s.Close()
		Add(FromSlice([]float32{1, 2, 3}, 2, 2), FromSlice([]float32{1, 2, 3, 4}, 4)) // 3 values for a 2×2 shape
		return nil
	})
	var me *Error
	if !errors.As(err, &me) || me.Op != "from_slice" {
		t.Errorf("Do: %v (%T), want a *Error from from_slice", err, err)
	}
	err = Do(func() error {
		s := NewScope()
		defer s.Close()
		Matmul(FromSlice([]float32{1, 2}, 1, 2), FromSlice([]float32{1, 2, 3}, 3, 1))
		return nil
	})
	if !errors.As(err, &me) || me.Op != "matmul" || !strings.Contains(err.Error(), "mlx matmul:") {
		t.Errorf("Do: %v, want a matmul *Error", err)
	}
	// A plain error returned by fn comes back unchanged.
	sentinel := errors.New("mine")
	if err := Do(func() error { return sentinel }); err != sentinel {
		t.Errorf("Do returned %v, want the function's own error", err)
	}
	onMLX(t, func() {
		closeTo(t, "ops after Do errors", Multiply(f32([]float32{3}, 1), f32([]float32{4}, 1)).Float32s(), []float32{12}, 0)
	})
}

// Other panics are not errors: Catch and Do pass them on to the caller.
func TestNonErrorPanics(t *testing.T) {
	func() {
		defer func() {
			if r := recover(); r != "not an mlx error" {
				t.Errorf("Catch recovered %v", r)
			}
		}()
		_ = Catch(func() { panic("not an mlx error") })
		t.Errorf("Catch swallowed a foreign panic")
	}()
	func() {
		defer func() {
			if r := recover(); r != "foreign" {
				t.Errorf("Do re-raised %v, want the panic value", r)
			}
		}()
		_ = Do(func() error { panic("foreign") })
		t.Errorf("Do swallowed a foreign panic")
	}()
	onMLX(t, func() {
		closeTo(t, "ops after a foreign panic", Add(f32([]float32{1}, 1), f32([]float32{1}, 1)).Float32s(), []float32{2}, 0)
	})
}

func TestNilOperandsInListOps(t *testing.T) {
	onMLX(t, func() {
		a := FromSlice([]float32{1, 2}, 2)
		if err := Catch(func() { Concatenate([]*Array{a, nil}, 0) }); err == nil {
			t.Error("concatenate with a nil operand succeeded")
		}
		if err := Catch(func() { Stack([]*Array{nil, a}, 0) }); err == nil {
			t.Error("stack with a nil operand succeeded")
		}
		// Eval skips nil entries on purpose (optional arrays).
		if err := Catch(func() { Eval(a, nil) }); err != nil {
			t.Errorf("eval with a nil entry: %v", err)
		}
	})
}
