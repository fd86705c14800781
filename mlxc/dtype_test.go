package mlxc

import (
	enc "encoding/binary"
	"math"
	"testing"
)

func allHalfPatterns() []uint16 {
	bits := make([]uint16, 1<<16)
	for i := range bits {
		bits[i] = uint16(i)
	}
	return bits
}

func u16s(b []byte) []uint16 {
	out := make([]uint16, len(b)/2)
	for i := range out {
		out[i] = enc.LittleEndian.Uint16(b[2*i:])
	}
	return out
}

func isBF16NaN(h uint16) bool { return h&0x7F80 == 0x7F80 && h&0x7F != 0 }
func isF16NaN(h uint16) bool  { return h&0x7C00 == 0x7C00 && h&0x3FF != 0 }

// flushedOnGPU reports whether r is the float32 value with bits f (or the bf16 with bits
// f>>16) flushed to a zero of its sign by a GPU: Metal's float rules let a GPU flush float32
// subnormals, which the CPU and CUDA keep; everywhere else the exact bits are required. (f16
// needs no such case: a float32 subnormal rounds to f16's signed zero either way.)
func flushedOnGPU(f uint32, r uint32) bool {
	return CurrentDevice().GPU && f&0x7F800000 == 0 && f&0x007FFFFF != 0 && r == f&0x80000000
}

// Every bf16 and f16 bit pattern, NaNs included, survives FromBF16Bits/FromF16Bits → Bytes
// unchanged: construction copies bits, it does not convert.
func TestHalfBitsRoundTrip(t *testing.T) {
	bits := allHalfPatterns()
	onMLX(t, func() {
		for _, c := range []struct {
			name string
			a    *Array
			dt   Dtype
		}{
			{"bf16", FromBF16Bits(bits, 256, 256), BFloat16},
			{"f16", FromF16Bits(bits, 1<<16), Float16},
		} {
			if c.a.Dtype() != c.dt {
				t.Errorf("%s dtype %v", c.name, c.a.Dtype())
			}
			eqSlice(t, c.name+" bytes", u16s(c.a.Bytes()), bits)
			eqSlice(t, c.name+" view as uint16", ToSlice[uint16](View(c.a, Uint16)), bits)
		}
		// FromBytes with raw little-endian bytes is the same thing.
		raw := make([]byte, 2*len(bits))
		for i, b := range bits {
			enc.LittleEndian.PutUint16(raw[2*i:], b)
		}
		eqSlice(t, "FromBytes bf16", FromBytes(raw, []int{len(bits)}, BFloat16).Bytes(), raw)
	})
}

// Widening to float32 is exact for every pattern (NaN payloads kept); narrowing back through
// MLX's astype gives the same bits for every non-NaN, and MLX's canonical NaN for NaNs:
// 0x7FC0 for bf16 (the sign is dropped) and sign|0x7D00 for f16.
func TestHalfWidenNarrow(t *testing.T) {
	bits := allHalfPatterns()
	onMLX(t, func() {
		// bf16
		a := FromBF16Bits(bits, len(bits))
		wide := AsType(a, Float32)
		w := ToSlice[uint32](View(wide, Uint32))
		back := ToSlice[uint16](View(AsType(wide, BFloat16), Uint16))
		nNaN := 0
		for i, h := range bits {
			if uint32(h)<<16 != w[i] && flushedOnGPU(uint32(h)<<16, w[i]) {
				if back[i] != h&0x8000 {
					t.Errorf("bf16 %#04x, flushed to f32 %#08x, came back as %#04x", h, w[i], back[i])
				}
				continue
			}
			if w[i] != uint32(h)<<16 {
				t.Errorf("bf16 %#04x -> f32 %#08x, want %#08x", h, w[i], uint32(h)<<16)
				break
			}
			if got := math.Float32bits(BF16ToFloat32(h)); got != w[i] {
				t.Errorf("BF16ToFloat32(%#04x) = %#08x, MLX %#08x", h, got, w[i])
				break
			}
			if isBF16NaN(h) {
				// NaN payloads are canonicalised, differently per backend (CPU 0x7FC0,
				// CUDA 0x7FFF): only NaN-ness is guaranteed.
				nNaN++
				if !isBF16NaN(back[i]) {
					t.Errorf("bf16 NaN %#04x came back as %#04x", h, back[i])
				}
				continue
			}
			if want := h; back[i] != want && !flushedOnGPU(uint32(h)<<16, uint32(back[i])<<16) {
				t.Errorf("bf16 %#04x -> f32 -> bf16 = %#04x, want %#04x", h, back[i], want)
				break
			}
		}
		if nNaN != 254 {
			t.Errorf("%d bf16 NaN patterns, want 254", nNaN)
		}

		// f16
		h16 := FromF16Bits(bits, len(bits))
		wide = AsType(h16, Float32)
		wf := ToSlice[float32](wide)
		back = ToSlice[uint16](View(AsType(wide, Float16), Uint16))
		for i, h := range bits {
			if g := F16ToFloat32(h); math.Float32bits(g) != math.Float32bits(wf[i]) && !(isF16NaN(h) && math.IsNaN(float64(wf[i])) && math.IsNaN(float64(g))) {
				t.Errorf("F16ToFloat32(%#04x) = %v (%#08x), MLX %v (%#08x)", h, g, math.Float32bits(g), wf[i], math.Float32bits(wf[i]))
				break
			}
			if isF16NaN(h) {
				if !isF16NaN(back[i]) {
					t.Errorf("f16 NaN %#04x came back as %#04x", h, back[i])
				}
				continue
			}
			if want := h; back[i] != want {
				t.Errorf("f16 %#04x -> f32 -> f16 = %#04x, want %#04x", h, back[i], want)
				break
			}
		}
	})
}

func TestFloat32ToHalfHandValues(t *testing.T) {
	p := func(e int) float64 { return math.Ldexp(1, e) }
	f := func(bits uint32) float32 { return math.Float32frombits(bits) }
	inf := float32(math.Inf(1))
	bf := []struct {
		in   float32
		want uint16
	}{
		{1, 0x3F80},
		{-1, 0xBF80},
		{0, 0x0000},
		{float32(math.Copysign(0, -1)), 0x8000},
		{float32(1 + p(-8)), 0x3F80},          // tie, even stays
		{float32(1 + 3*p(-8)), 0x3F82},        // tie, odd rounds up to even
		{float32(1 + p(-8) + p(-20)), 0x3F81}, // above the tie
		{float32(1 + p(-8) - p(-20)), 0x3F80}, // below the tie
		{float32(3.140625), 0x4049},           // exact
		{math.MaxFloat32, 0x7F80},             // rounds up to Inf
		{f(0x7F7F7FFF), 0x7F7F},               // just below the tie at the top stays finite
		{inf, 0x7F80},
		{-inf, 0xFF80},
		{f(0x00000001), 0x0000}, // smallest f32 subnormal
		{f(0x00012345), 0x0001}, // subnormal, rounds down
		{f(0x00008000), 0x0000}, // subnormal tie, even
		{f(0x00018000), 0x0002}, // subnormal tie, odd -> even
		{f(0x007FFFFF), 0x0080}, // largest subnormal rounds up to the smallest normal
		{f(0x80018000), 0x8002}, // negative subnormal tie
	}
	for _, c := range bf {
		if got := Float32ToBF16(c.in); got != c.want {
			t.Errorf("Float32ToBF16(%g = %#08x) = %#04x, want %#04x", c.in, math.Float32bits(c.in), got, c.want)
		}
	}
	hf := []struct {
		in   float32
		want uint16
	}{
		{1, 0x3C00},
		{-2, 0xC000},
		{0, 0x0000},
		{float32(math.Copysign(0, -1)), 0x8000},
		{65504, 0x7BFF},    // largest half
		{65519.99, 0x7BFF}, // below the tie with Inf
		{65520, 0x7C00},    // tie with Inf rounds to Inf (even)
		{1e6, 0x7C00},
		{-1e6, 0xFC00},
		{inf, 0x7C00},
		{-inf, 0xFC00},
		{float32(1 + p(-11)), 0x3C00},          // tie, even
		{float32(1 + 3*p(-11)), 0x3C02},        // tie, odd -> even
		{float32(1 + p(-11) + p(-20)), 0x3C01}, // above the tie
		{float32(p(-14)), 0x0400},              // smallest normal
		{float32(p(-14) - p(-24)), 0x03FF},     // largest subnormal
		{float32(p(-24)), 0x0001},              // smallest subnormal
		{float32(p(-25)), 0x0000},              // tie between 0 and 2^-24 -> 0
		{float32(p(-25) + p(-40)), 0x0001},     // above that tie
		{float32(3 * p(-25)), 0x0002},          // tie between 1 and 2 (·2^-24) -> 2
		{float32(5 * p(-25)), 0x0002},          // tie between 2 and 3 -> 2
		{float32(p(-26)), 0x0000},
		{float32(-p(-24)), 0x8001},
		{float32(p(-14) - p(-25)), 0x0400}, // tie between largest subnormal and smallest normal -> even (normal)
		{1e-10, 0x0000},
		{f(0x00000001), 0x0000},
		{float32(2049), 0x6800}, // 2049 is a tie between 2048 and 2050 -> 2048
		{float32(2051), 0x6802}, // tie -> 2052
	}
	for _, c := range hf {
		if got := Float32ToF16(c.in); got != c.want {
			t.Errorf("Float32ToF16(%g = %#08x) = %#04x, want %#04x", c.in, math.Float32bits(c.in), got, c.want)
		}
	}
	for _, nan := range []float32{float32(math.NaN()), f(0x7F800001), f(0xFFC00000), f(0x7FBFFFFF)} {
		if h := Float32ToBF16(nan); !isBF16NaN(h) {
			t.Errorf("Float32ToBF16(NaN %#08x) = %#04x, not a NaN", math.Float32bits(nan), h)
		}
		if h := Float32ToF16(nan); !isF16NaN(h) {
			t.Errorf("Float32ToF16(NaN %#08x) = %#04x, not a NaN", math.Float32bits(nan), h)
		}
	}
	// Round trips through the exact widenings.
	for _, h := range allHalfPatterns() {
		if !isBF16NaN(h) {
			if got := Float32ToBF16(BF16ToFloat32(h)); got != h {
				t.Fatalf("Float32ToBF16(BF16ToFloat32(%#04x)) = %#04x", h, got)
			}
		}
		if !isF16NaN(h) {
			if got := Float32ToF16(F16ToFloat32(h)); got != h {
				t.Fatalf("Float32ToF16(F16ToFloat32(%#04x)) = %#04x", h, got)
			}
		}
	}
}

// The Go conversions give exactly MLX's astype bits for random floats: patterns uniform over
// all float32 bits (every exponent, subnormals, NaNs), plus a dense set in the half range
// where f16 subnormals, normals and overflow meet. NaNs convert to NaN on both sides (MLX's
// is canonical, see TestHalfWidenNarrow).
func TestFloat32ToHalfMatchesMLX(t *testing.T) {
	g := lcg(12345)
	const n = 200000
	in := make([]uint32, 0, 2*n)
	for i := 0; i < n; i++ {
		in = append(in, g.u32())
	}
	for i := 0; i < n; i++ {
		// exponents 2^-30 .. 2^17, random sign and mantissa
		e := uint32(127-30) + uint32(g.next()%48)
		in = append(in, g.u32()&0x807FFFFF|e<<23)
	}
	// Exact ties and their neighbours for both formats.
	for i := 0; i < 2000; i++ {
		b := g.u32() &^ 0xFFFF
		in = append(in, b|0x8000, b|0x7FFF, b|0x8001)
		e := uint32(127-25) + uint32(g.next()%42)
		h := g.u32()&0x807FE000 | e<<23
		in = append(in, h|0x1000, h|0x0FFF, h|0x1001)
	}
	floats := make([]float32, len(in))
	for i, b := range in {
		floats[i] = math.Float32frombits(b)
	}
	onMLX(t, func() {
		x := FromSlice(floats, len(floats))
		mbf := ToSlice[uint16](View(AsType(x, BFloat16), Uint16))
		mhf := ToSlice[uint16](View(AsType(x, Float16), Uint16))
		bad := 0
		for i, v := range floats {
			gb, gh := Float32ToBF16(v), Float32ToF16(v)
			if math.IsNaN(float64(v)) {
				if !isBF16NaN(gb) || !isBF16NaN(mbf[i]) || !isF16NaN(gh) || !isF16NaN(mhf[i]) {
					t.Errorf("NaN %#08x: Go bf16 %#04x MLX %#04x, Go f16 %#04x MLX %#04x", in[i], gb, mbf[i], gh, mhf[i])
					bad++
				}
			} else if gb != mbf[i] && !flushedOnGPU(in[i], uint32(mbf[i])<<16) || gh != mhf[i] {
				t.Errorf("%g (%#08x): Go bf16 %#04x MLX %#04x, Go f16 %#04x MLX %#04x", v, in[i], gb, mbf[i], gh, mhf[i])
				bad++
			}
			if bad > 10 {
				break
			}
		}
	})
}

func TestIntegerAndBoolArrays(t *testing.T) {
	onMLX(t, func() {
		i64 := []int64{math.MinInt64, -1 << 40, -1, 0, 1, 1<<40 + 3, math.MaxInt64}
		a := FromSlice(i64, len(i64))
		if a.Dtype() != Int64 || a.NBytes() != 8*len(i64) {
			t.Errorf("int64: %v %d bytes", a.Dtype(), a.NBytes())
		}
		eqSlice(t, "int64", ToSlice[int64](a), i64)
		eqSlice(t, "int64 + 1", ToSlice[int64](Add(SliceAxis(a, 0, 1, 6), ScalarInt(1, Int64))), []int64{-1<<40 + 1, 0, 1, 2, 1<<40 + 4})

		u32 := []uint32{0, 1, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF}
		b := FromSlice(u32, 5)
		eqSlice(t, "uint32", ToSlice[uint32](b), u32)
		if b.Dtype() != Uint32 {
			t.Errorf("uint32 dtype %v", b.Dtype())
		}
		eqSlice(t, "uint32 max", ToSlice[uint32](Max(b, nil, false)), []uint32{0xFFFFFFFF})

		bl := []bool{true, false, false, true, true}
		c := FromSlice(bl, 5)
		if c.Dtype() != Bool || c.NBytes() != 5 {
			t.Errorf("bool: %v %d bytes", c.Dtype(), c.NBytes())
		}
		eqSlice(t, "bool", ToSlice[bool](c), bl)
		eqSlice(t, "bool bytes", c.Bytes(), []byte{1, 0, 0, 1, 1})

		u8 := []uint8{0, 1, 127, 128, 255}
		d := FromSlice(u8, 5)
		eqSlice(t, "uint8", ToSlice[uint8](d), u8)
		eqSlice(t, "uint8 -> int32", d.Int32s(), []int32{0, 1, 127, 128, 255})

		eqSlice(t, "int8", ToSlice[int8](FromSlice([]int8{-128, -1, 127}, 3)), []int8{-128, -1, 127})
		eqSlice(t, "int16", ToSlice[int16](FromSlice([]int16{-32768, 5, 32767}, 3)), []int16{-32768, 5, 32767})
		eqSlice(t, "uint64", ToSlice[uint64](FromSlice([]uint64{0, 1 << 63, math.MaxUint64}, 3)), []uint64{0, 1 << 63, math.MaxUint64})
		eqSlice(t, "float64", ToSlice[float64](FromSlice([]float64{0.1, -1e300, math.SmallestNonzeroFloat64}, 3)), []float64{0.1, -1e300, math.SmallestNonzeroFloat64})

		// Raw bytes of a 2-d int32 array are row-major little-endian, also for a transposed view.
		m := FromSlice([]int32{1, 2, 3, 4, 5, 6}, 2, 3)
		raw := Transpose(m).Bytes()
		want := []int32{1, 4, 2, 5, 3, 6}
		for i, w := range want {
			if got := int32(enc.LittleEndian.Uint32(raw[4*i:])); got != w {
				t.Errorf("transposed bytes[%d] = %d, want %d", i, got, w)
			}
		}
		// Empty and 0-d arrays.
		e := FromSlice([]float32{}, 0, 3)
		eqShape(t, "empty", e.Shape(), []int{0, 3})
		if len(e.Float32s()) != 0 || len(e.Bytes()) != 0 {
			t.Errorf("empty array reads back data")
		}
		s := FromSlice([]int32{42})
		eqShape(t, "0-d", s.Shape(), []int{})
		if s.Int() != 42 {
			t.Errorf("0-d int = %d", s.Int())
		}
	})
}

func TestParseDtype(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Dtype
	}{{"BF16", BFloat16}, {"bfloat16", BFloat16}, {"F16", Float16}, {"F32", Float32}, {"I64", Int64}, {"U32", Uint32}, {"BOOL", Bool}, {"U8", Uint8}} {
		got, err := ParseDtype(c.in)
		if err != nil || got != c.want {
			t.Errorf("ParseDtype(%q) = %v, %v", c.in, got, err)
		}
	}
	if _, err := ParseDtype("F8_E4M3"); err == nil {
		t.Errorf("ParseDtype(F8_E4M3) succeeded")
	}
	sizes := map[Dtype]int{Bool: 1, Uint8: 1, Int16: 2, Float16: 2, BFloat16: 2, Float32: 4, Uint32: 4, Int64: 8, Float64: 8, Complex64: 8}
	for d, n := range sizes {
		if d.Size() != n {
			t.Errorf("%v size %d, want %d", d, d.Size(), n)
		}
	}
	if Dtype(99).Valid() || Dtype(-1).Valid() || !BFloat16.IsFloat() || Int32.IsFloat() {
		t.Errorf("Valid/IsFloat wrong")
	}
}
