package mlxc

/*
#include "mlxc.h"
*/
import "C"

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unsafe"
)

// Array is a handle to an MLX array (lazy until evaluated). Arrays are owned by the Scope
// that was open when they were created, or by the caller when none was (then Free them).
type Array struct {
	h     C.mlxc_array
	scope *Scope
	keep  bool
	shape []int // cached by dims
	dtype Dtype // cached by Dtype once dtypeKnown
	// dtypeKnown: the model asks an array's type many times per cycle (which kernel fits),
	// and each query was a C call.
	dtypeKnown bool
}

// Scope collects the arrays created while it is the innermost open scope, and frees them
// when it closes. Scopes nest; they belong to the MLX thread.
type Scope struct {
	arrays []*Array
	parent *Scope
	closed bool
}

var scopeTop *Scope // MLX thread only

// NewScope opens a scope nested in the current one.
func NewScope() *Scope {
	s := &Scope{parent: scopeTop}
	scopeTop = s
	return s
}

// Close frees every array of the scope except those in keep, which move to the parent
// scope (or become caller-owned when there is none). Closing must follow LIFO order.
func (s *Scope) Close(keep ...*Array) {
	if s.closed {
		return
	}
	if scopeTop != s {
		panic("mlxc: scopes closed out of order")
	}
	for _, a := range keep {
		if a != nil {
			a.keep = true
		}
	}
	// One C call frees them all: a decode step's scope holds ~1 000 arrays, and a cgo call
	// each was a measurable share of the host time per step.
	free := make([]C.mlxc_array, 0, len(s.arrays))
	for _, a := range s.arrays {
		if a.keep {
			a.keep = false
			a.scope = s.parent
			if s.parent != nil {
				s.parent.arrays = append(s.parent.arrays, a)
			}
			continue
		}
		if a.h != nil {
			free = append(free, a.h)
			a.h = nil
		}
	}
	if len(free) > 0 {
		C.mlxc_array_free_many(&free[0], C.int(len(free)))
	}
	// Kept arrays that belong to an outer scope (an input passed through, say) stay there
	// and must not count as kept when that scope closes.
	for _, a := range keep {
		if a != nil {
			a.keep = false
		}
	}
	s.arrays = nil
	s.closed = true
	scopeTop = s.parent
}

// Scoped runs fn in a new scope and keeps the arrays it returns.
func Scoped(fn func() []*Array) []*Array {
	s := NewScope()
	var out []*Array
	defer func() { s.Close(out...) }()
	out = fn()
	return out
}

// Detach takes a out of its scope: the caller now owns it and must Free it. Use it for
// long-lived arrays such as weights and caches.
func (a *Array) Detach() *Array {
	if a == nil || a.scope == nil {
		return a
	}
	sc := a.scope
	// From the end: the array detached is almost always one just made (a cache update).
	for i := len(sc.arrays) - 1; i >= 0; i-- {
		if sc.arrays[i] == a {
			last := len(sc.arrays) - 1
			sc.arrays[i] = sc.arrays[last]
			sc.arrays = sc.arrays[:last]
			break
		}
	}
	a.scope = nil
	return a
}

func newArray(h C.mlxc_array) *Array {
	a := &Array{h: h}
	if scopeTop != nil {
		a.scope = scopeTop
		scopeTop.arrays = append(scopeTop.arrays, a)
	}
	return a
}

// Ref returns a second handle to the same array (no graph node), owned by the caller and
// in no scope: for holding on to an array that someone else frees, such as a kernel
// output that a later launch takes as an ordering input.
func (a *Array) Ref() *Array {
	var h C.mlxc_array
	check("clone", C.mlxc_array_clone(&h, a.handle("clone")))
	return &Array{h: h}
}

func (a *Array) release() {
	if a.h != nil {
		C.mlxc_array_free(a.h)
		a.h = nil
	}
}

// Free releases the array now. Safe to call twice; a scope that still lists it skips it.
func (a *Array) Free() {
	if a != nil {
		a.release()
	}
}

// Valid reports whether the handle is live (not freed).
func (a *Array) Valid() bool { return a != nil && a.h != nil }

func (a *Array) handle(op string) C.mlxc_array {
	if a == nil || a.h == nil {
		fail(op, "use of a nil or freed array")
	}
	return a.h
}

// optHandle maps a nil *Array to an absent optional input.
func optHandle(op string, a *Array) C.mlxc_array {
	if a == nil {
		return nil
	}
	return a.handle(op)
}

// Shape returns the array's dimensions (a copy the caller may change).
func (a *Array) Shape() []int { return slices.Clone(a.dims()) }

// dims is the array's shape, read from MLX once: an array's shape never changes, and the
// graph-building code asks for shapes several times per op (a C call each, before).
func (a *Array) dims() []int {
	h := a.handle("shape")
	if a.shape != nil {
		return a.shape
	}
	var buf [16]C.int
	n := int(C.mlxc_array_shape(h, &buf[0], 16))
	src := buf[:min(n, 16)]
	if n > 16 {
		src = make([]C.int, n)
		C.mlxc_array_shape(h, &src[0], C.int(n))
	}
	out := make([]int, n)
	for i := range out {
		out[i] = int(src[i])
	}
	a.shape = out
	return out
}

// Dim returns one dimension; negative axes count from the end.
func (a *Array) Dim(axis int) int {
	sh := a.dims()
	if axis < 0 {
		axis += len(sh)
	}
	if axis < 0 || axis >= len(sh) {
		fail("dim", "axis %d out of range for shape %v", axis, sh)
	}
	return sh[axis]
}

// Ndim is the rank.
func (a *Array) Ndim() int { return len(a.dims()) }

// Location says where an evaluated array's buffer lives on CUDA, for tests and
// diagnostics: "device" (device memory), "unified" (managed memory), or "" (another
// backend, an MLX other than 0.32 whose buffer records we have not read, or not evaluated
// yet).
func (a *Array) Location() string {
	switch C.mlxc_array_location(a.handle("location")) {
	case 1:
		return "unified"
	case 2:
		return "device"
	}
	return ""
}

// Dtype is the element type.
func (a *Array) Dtype() Dtype {
	h := a.handle("dtype")
	if !a.dtypeKnown {
		a.dtype, a.dtypeKnown = Dtype(C.mlxc_array_dtype(h)), true
	}
	return a.dtype
}

// Size is the number of elements.
func (a *Array) Size() int { return int(C.mlxc_array_size(a.handle("size"))) }

// NBytes is the size in bytes.
func (a *Array) NBytes() int { return int(C.mlxc_array_nbytes(a.handle("nbytes"))) }

func (a *Array) String() string {
	if !a.Valid() {
		return "Array(freed)"
	}
	return fmt.Sprintf("Array(%v, %v)", a.Shape(), a.Dtype())
}

// Element is a Go type with a matching MLX dtype.
type Element interface {
	~bool | ~uint8 | ~uint16 | ~uint32 | ~uint64 | ~int8 | ~int16 | ~int32 | ~int64 | ~float32 | ~float64
}

func dtypeOf[T Element]() Dtype {
	var z T
	switch any(z).(type) {
	case bool:
		return Bool
	case uint8:
		return Uint8
	case uint16:
		return Uint16
	case uint32:
		return Uint32
	case uint64:
		return Uint64
	case int8:
		return Int8
	case int16:
		return Int16
	case int32:
		return Int32
	case int64:
		return Int64
	case float32:
		return Float32
	case float64:
		return Float64
	}
	panic("unreachable")
}

// FromSlice copies data into a new array of the matching dtype and the given shape.
func FromSlice[T Element](data []T, shape ...int) *Array {
	var z T
	return fromRaw("from_slice", unsafe.Pointer(unsafe.SliceData(data)), len(data)*int(unsafe.Sizeof(z)), shape, dtypeOf[T]())
}

// FromBytes builds an array from raw little-endian element bytes of dtype dt (for bf16 and
// f16, the bit patterns). The bytes are copied.
func FromBytes(b []byte, shape []int, dt Dtype) *Array {
	return fromRaw("from_bytes", unsafe.Pointer(unsafe.SliceData(b)), len(b), shape, dt)
}

// FromBF16Bits builds a bfloat16 array from bit patterns.
func FromBF16Bits(bits []uint16, shape ...int) *Array {
	return fromRaw("from_bf16", unsafe.Pointer(unsafe.SliceData(bits)), 2*len(bits), shape, BFloat16)
}

// FromF16Bits builds a float16 array from bit patterns.
func FromF16Bits(bits []uint16, shape ...int) *Array {
	return fromRaw("from_f16", unsafe.Pointer(unsafe.SliceData(bits)), 2*len(bits), shape, Float16)
}

func fromRaw(op string, p unsafe.Pointer, nbytes int, shape []int, dt Dtype) *Array {
	if !dt.Valid() {
		fail(op, "unknown dtype %d", int(dt))
	}
	n := 1
	for _, d := range shape {
		if d < 0 {
			fail(op, "negative dimension in shape %v", shape)
		}
		n *= d
	}
	if n*dt.Size() != nbytes {
		fail(op, "shape %v of %v needs %d bytes, got %d", shape, dt, n*dt.Size(), nbytes)
	}
	var buf [8]C.int
	var h C.mlxc_array
	var dummy byte
	if p == nil {
		p = unsafe.Pointer(&dummy)
	}
	check(op, C.mlxc_array_from_data(&h, p, cInts(shape, &buf), C.int(len(shape)), C.int(dt)))
	return newArray(h)
}

// Scalar makes a 0-d array of a float value in dtype dt.
func Scalar(v float64, dt Dtype) *Array {
	var h C.mlxc_array
	check("scalar", C.mlxc_array_scalar_f(&h, C.double(v), C.int(dt)))
	return newArray(h)
}

// ScalarInt makes a 0-d array of an integer value in dtype dt.
func ScalarInt(v int64, dt Dtype) *Array {
	var h C.mlxc_array
	check("scalar", C.mlxc_array_scalar_i(&h, C.int64_t(v), C.int(dt)))
	return newArray(h)
}

// Eval computes the arrays and waits.
func Eval(arrs ...*Array) {
	var buf [16]C.mlxc_array
	hs := handles("eval", arrs, &buf)
	if len(hs) == 0 {
		return
	}
	check("eval", C.mlxc_eval(&hs[0], C.int(len(hs))))
}

// GraphNodes counts the distinct primitives that evaluating arrs would run (views such as
// reshapes count too; evaluated inputs count nothing). A proxy for kernel launches.
func GraphNodes(arrs ...*Array) int {
	var buf [16]C.mlxc_array
	hs := handles("graph_nodes", arrs, &buf)
	if len(hs) == 0 {
		return 0
	}
	var n C.int64_t
	check("graph_nodes", C.mlxc_graph_nodes(&hs[0], C.int(len(hs)), &n))
	return int(n)
}

// GraphOps counts the unevaluated primitives behind arrs by name (the same nodes
// GraphNodes counts), to see which operations a step is made of.
func GraphOps(arrs ...*Array) map[string]int {
	var buf [16]C.mlxc_array
	hs := handles("graph_ops", arrs, &buf)
	ops := map[string]int{}
	if len(hs) == 0 {
		return ops
	}
	var out *C.char
	check("graph_ops", C.mlxc_graph_ops(&hs[0], C.int(len(hs)), &out))
	defer C.mlxc_free_string(out)
	for _, line := range strings.Split(C.GoString(out), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			n, _ := strconv.Atoi(v)
			ops[k] = n
		}
	}
	return ops
}

// GraphList lists the unevaluated nodes behind arrs, inputs before the nodes that read
// them, one line each: the primitive, its output shapes and dtype, and its inputs' shapes
// (evaluated inputs marked *). For finding which calls a step's nodes come from.
func GraphList(arrs ...*Array) string {
	var buf [16]C.mlxc_array
	hs := handles("graph_list", arrs, &buf)
	if len(hs) == 0 {
		return ""
	}
	var out *C.char
	check("graph_list", C.mlxc_graph_list(&hs[0], C.int(len(hs)), &out))
	defer C.mlxc_free_string(out)
	return C.GoString(out)
}

// AsyncEval schedules the arrays' computation and returns at once.
func AsyncEval(arrs ...*Array) {
	var buf [16]C.mlxc_array
	hs := handles("async_eval", arrs, &buf)
	if len(hs) == 0 {
		return
	}
	check("async_eval", C.mlxc_async_eval(&hs[0], C.int(len(hs))))
}

// handles collects C handles; nil entries are skipped (Eval of optional arrays).
func handles(op string, arrs []*Array, buf *[16]C.mlxc_array) []C.mlxc_array {
	return collect(op, arrs, buf, false)
}

// requiredHandles is handles for list ops where every entry is an operand: a nil entry is
// an error rather than a silently shorter list.
func requiredHandles(op string, arrs []*Array, buf *[16]C.mlxc_array) []C.mlxc_array {
	return collect(op, arrs, buf, true)
}

func collect(op string, arrs []*Array, buf *[16]C.mlxc_array, required bool) []C.mlxc_array {
	var hs []C.mlxc_array
	if len(arrs) <= len(buf) {
		hs = buf[:0]
	} else {
		hs = make([]C.mlxc_array, 0, len(arrs))
	}
	for i, a := range arrs {
		if a == nil {
			if required {
				fail(op, "operand %d is nil", i)
			}
			continue
		}
		hs = append(hs, a.handle(op))
	}
	return hs
}

// Bytes evaluates the array and returns its elements as contiguous raw bytes.
func (a *Array) Bytes() []byte {
	h := a.handle("bytes")
	n := a.NBytes()
	out := make([]byte, n)
	var p unsafe.Pointer
	if n > 0 {
		p = unsafe.Pointer(&out[0])
	} else {
		var dummy byte
		p = unsafe.Pointer(&dummy)
	}
	check("bytes", C.mlxc_array_copy_to(h, p, C.size_t(n)))
	return out
}

// ToSlice evaluates the array and copies it out as []T; the array's dtype must match T.
func ToSlice[T Element](a *Array) []T {
	want := dtypeOf[T]()
	if dt := a.Dtype(); dt != want {
		fail("to_slice", "array is %v, asked for %v", dt, want)
	}
	out := make([]T, a.Size())
	if len(out) == 0 {
		return out
	}
	var z T
	check("to_slice", C.mlxc_array_copy_to(a.handle("to_slice"), unsafe.Pointer(&out[0]), C.size_t(len(out)*int(unsafe.Sizeof(z)))))
	return out
}

// Float32s converts to float32 (on the device) and copies out.
func (a *Array) Float32s() []float32 {
	if a.Dtype() == Float32 {
		return ToSlice[float32](a)
	}
	s := NewScope()
	defer s.Close()
	return ToSlice[float32](AsType(a, Float32))
}

// Int32s converts to int32 and copies out.
func (a *Array) Int32s() []int32 {
	if a.Dtype() == Int32 {
		return ToSlice[int32](a)
	}
	s := NewScope()
	defer s.Close()
	return ToSlice[int32](AsType(a, Int32))
}

// Float evaluates a one-element array and returns its value.
func (a *Array) Float() float64 {
	var v C.double
	check("item", C.mlxc_array_item_f64(a.handle("item"), &v))
	return float64(v)
}

// Int evaluates a one-element array and returns its value.
func (a *Array) Int() int64 {
	var v C.int64_t
	check("item", C.mlxc_array_item_i64(a.handle("item"), &v))
	return int64(v)
}

// LiveArrays is the number of array handles created and not yet freed (for leak checks).
func LiveArrays() uint64 { return uint64(C.mlxc_live_arrays()) }
