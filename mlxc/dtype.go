package mlxc

import "fmt"

// Dtype is an MLX element type. The values equal the C API's (and MLX's) enum order.
type Dtype int

const (
	Bool Dtype = iota
	Uint8
	Uint16
	Uint32
	Uint64
	Int8
	Int16
	Int32
	Int64
	Float16
	Float32
	Float64
	BFloat16
	Complex64
)

var dtypeNames = [...]string{"bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32",
	"int64", "float16", "float32", "float64", "bfloat16", "complex64"}

var dtypeSizes = [...]int{1, 1, 2, 4, 8, 1, 2, 4, 8, 2, 4, 8, 2, 8}

func (d Dtype) String() string {
	if d < 0 || int(d) >= len(dtypeNames) {
		return fmt.Sprintf("dtype(%d)", int(d))
	}
	return dtypeNames[d]
}

// Size is the element size in bytes.
func (d Dtype) Size() int {
	if d < 0 || int(d) >= len(dtypeSizes) {
		return 0
	}
	return dtypeSizes[d]
}

// Valid reports whether d names a known dtype.
func (d Dtype) Valid() bool { return d >= 0 && int(d) < len(dtypeNames) }

// IsFloat reports whether d is a floating-point type.
func (d Dtype) IsFloat() bool { return d == Float16 || d == Float32 || d == Float64 || d == BFloat16 }

// ParseDtype maps names used in configs and safetensors headers ("bfloat16", "BF16", "F32", ...).
func ParseDtype(s string) (Dtype, error) {
	switch s {
	case "bool", "BOOL":
		return Bool, nil
	case "uint8", "U8":
		return Uint8, nil
	case "uint16", "U16":
		return Uint16, nil
	case "uint32", "U32":
		return Uint32, nil
	case "uint64", "U64":
		return Uint64, nil
	case "int8", "I8":
		return Int8, nil
	case "int16", "I16":
		return Int16, nil
	case "int32", "I32":
		return Int32, nil
	case "int64", "I64":
		return Int64, nil
	case "float16", "F16", "half":
		return Float16, nil
	case "float32", "F32", "float":
		return Float32, nil
	case "float64", "F64":
		return Float64, nil
	case "bfloat16", "BF16":
		return BFloat16, nil
	case "complex64", "C64":
		return Complex64, nil
	}
	return 0, fmt.Errorf("unknown dtype %q", s)
}
