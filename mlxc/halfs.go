package mlxc

import "math"

// Float32ToBF16 rounds to the nearest bfloat16, ties to even (what MLX and PyTorch do).
// NaN stays NaN (quiet).
func Float32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	rounding := uint32(0x7fff) + (b>>16)&1
	return uint16((b + rounding) >> 16)
}

// BF16ToFloat32 is exact.
func BF16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// Float32ToF16 rounds to the nearest IEEE half, ties to even, with subnormals and overflow to Inf.
func Float32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	man := b & 0x7fffff
	switch {
	case exp == 0xff:
		if man != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	case exp-127 > 15:
		return sign | 0x7c00
	case exp-127 >= -14:
		// normal half: 10 mantissa bits, round to nearest even on the 13 dropped bits
		e := uint32(exp-127+15) << 10
		m := man >> 13
		rest := man & 0x1fff
		v := e | m
		if rest > 0x1000 || (rest == 0x1000 && m&1 == 1) {
			v++ // may carry into the exponent, which is still correct (up to Inf)
		}
		return sign | uint16(v)
	case exp-127 >= -25:
		// subnormal half
		m := man | 0x800000
		shift := uint32(-(exp - 127) - 14 + 13)
		v := m >> shift
		rest := m & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rest > half || (rest == half && v&1 == 1) {
			v++
		}
		return sign | uint16(v)
	}
	return sign
}

// F16ToFloat32 is exact.
func F16ToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp == 0:
		if man == 0 {
			return math.Float32frombits(sign)
		}
		f := float32(man) / 1024 / 16384 // man · 2^-24
		if sign != 0 {
			return -f
		}
		return f
	}
	return math.Float32frombits(sign | (exp-15+127)<<23 | man<<13)
}
