package mlxc

/*
#include "mlxc.h"
*/
import "C"

func unary(op string, code C.int, a *Array) *Array {
	var h C.mlxc_array
	check(op, C.mlxc_unary(&h, code, a.handle(op), curStream.c))
	return newArray(h)
}

func binary(op string, code C.int, a, b *Array) *Array {
	var h C.mlxc_array
	check(op, C.mlxc_binary(&h, code, a.handle(op), b.handle(op), curStream.c))
	return newArray(h)
}

func Negative(a *Array) *Array     { return unary("negative", C.MLXC_U_NEG, a) }
func Exp(a *Array) *Array          { return unary("exp", C.MLXC_U_EXP, a) }
func Log(a *Array) *Array          { return unary("log", C.MLXC_U_LOG, a) }
func Log1p(a *Array) *Array        { return unary("log1p", C.MLXC_U_LOG1P, a) }
func Sigmoid(a *Array) *Array      { return unary("sigmoid", C.MLXC_U_SIGMOID, a) }
func Tanh(a *Array) *Array         { return unary("tanh", C.MLXC_U_TANH, a) }
func Sqrt(a *Array) *Array         { return unary("sqrt", C.MLXC_U_SQRT, a) }
func Rsqrt(a *Array) *Array        { return unary("rsqrt", C.MLXC_U_RSQRT, a) }
func Square(a *Array) *Array       { return unary("square", C.MLXC_U_SQUARE, a) }
func Abs(a *Array) *Array          { return unary("abs", C.MLXC_U_ABS, a) }
func Sin(a *Array) *Array          { return unary("sin", C.MLXC_U_SIN, a) }
func Cos(a *Array) *Array          { return unary("cos", C.MLXC_U_COS, a) }
func Floor(a *Array) *Array        { return unary("floor", C.MLXC_U_FLOOR, a) }
func Ceil(a *Array) *Array         { return unary("ceil", C.MLXC_U_CEIL, a) }
func Reciprocal(a *Array) *Array   { return unary("reciprocal", C.MLXC_U_RECIPROCAL, a) }
func Erf(a *Array) *Array          { return unary("erf", C.MLXC_U_ERF, a) }
func LogicalNot(a *Array) *Array   { return unary("logical_not", C.MLXC_U_LOGICAL_NOT, a) }
func IsNaN(a *Array) *Array        { return unary("isnan", C.MLXC_U_ISNAN, a) }
func StopGradient(a *Array) *Array { return unary("stop_gradient", C.MLXC_U_STOP_GRADIENT, a) }

// Copy makes a new array with the same contents (a graph node, not a host copy).
func Copy(a *Array) *Array { return unary("copy", C.MLXC_U_COPY, a) }

// Contiguous returns a row-contiguous version of a.
func Contiguous(a *Array) *Array { return unary("contiguous", C.MLXC_U_CONTIGUOUS, a) }

// SiLU is x·sigmoid(x), built like mlx.nn does so numerics match.
func SiLU(a *Array) *Array { return unary("silu", C.MLXC_U_SILU, a) }

// Softplus is logaddexp(x, 0), as in mlx.nn.
func Softplus(a *Array) *Array { return unary("softplus", C.MLXC_U_SOFTPLUS, a) }

func Add(a, b *Array) *Array          { return binary("add", C.MLXC_B_ADD, a, b) }
func Subtract(a, b *Array) *Array     { return binary("subtract", C.MLXC_B_SUB, a, b) }
func Multiply(a, b *Array) *Array     { return binary("multiply", C.MLXC_B_MUL, a, b) }
func Divide(a, b *Array) *Array       { return binary("divide", C.MLXC_B_DIV, a, b) }
func Maximum(a, b *Array) *Array      { return binary("maximum", C.MLXC_B_MAXIMUM, a, b) }
func Minimum(a, b *Array) *Array      { return binary("minimum", C.MLXC_B_MINIMUM, a, b) }
func Power(a, b *Array) *Array        { return binary("power", C.MLXC_B_POWER, a, b) }
func Remainder(a, b *Array) *Array    { return binary("remainder", C.MLXC_B_REMAINDER, a, b) }
func Equal(a, b *Array) *Array        { return binary("equal", C.MLXC_B_EQUAL, a, b) }
func NotEqual(a, b *Array) *Array     { return binary("not_equal", C.MLXC_B_NOT_EQUAL, a, b) }
func Greater(a, b *Array) *Array      { return binary("greater", C.MLXC_B_GREATER, a, b) }
func GreaterEqual(a, b *Array) *Array { return binary("greater_equal", C.MLXC_B_GREATER_EQUAL, a, b) }
func Less(a, b *Array) *Array         { return binary("less", C.MLXC_B_LESS, a, b) }
func LessEqual(a, b *Array) *Array    { return binary("less_equal", C.MLXC_B_LESS_EQUAL, a, b) }
func LogicalAnd(a, b *Array) *Array   { return binary("logical_and", C.MLXC_B_LOGICAL_AND, a, b) }
func LogicalOr(a, b *Array) *Array    { return binary("logical_or", C.MLXC_B_LOGICAL_OR, a, b) }
func LogAddExp(a, b *Array) *Array    { return binary("logaddexp", C.MLXC_B_LOGADDEXP, a, b) }

// Matmul is a @ b with NumPy broadcasting of batch dimensions.
func Matmul(a, b *Array) *Array { return binary("matmul", C.MLXC_B_MATMUL, a, b) }

// AddMM computes beta·c + alpha·(a@b) in one op.
func AddMM(c, a, b *Array, alpha, beta float32) *Array {
	var h C.mlxc_array
	check("addmm", C.mlxc_addmm(&h, c.handle("addmm"), a.handle("addmm"), b.handle("addmm"), C.float(alpha), C.float(beta), curStream.c))
	return newArray(h)
}

func reduce(op string, code C.int, a *Array, axes []int, keepdims bool) *Array {
	var h C.mlxc_array
	var buf [8]C.int
	n := C.int(len(axes))
	if axes == nil {
		n = -1 // all axes
	}
	check(op, C.mlxc_reduce(&h, code, a.handle(op), cInts(axes, &buf), n, C.bool(keepdims), curStream.c))
	return newArray(h)
}

// Reductions over the given axes (nil = all axes).
func Sum(a *Array, axes []int, keepdims bool) *Array {
	return reduce("sum", C.MLXC_R_SUM, a, axes, keepdims)
}
func Mean(a *Array, axes []int, keepdims bool) *Array {
	return reduce("mean", C.MLXC_R_MEAN, a, axes, keepdims)
}
func Max(a *Array, axes []int, keepdims bool) *Array {
	return reduce("max", C.MLXC_R_MAX, a, axes, keepdims)
}
func Min(a *Array, axes []int, keepdims bool) *Array {
	return reduce("min", C.MLXC_R_MIN, a, axes, keepdims)
}
func Prod(a *Array, axes []int, keepdims bool) *Array {
	return reduce("prod", C.MLXC_R_PROD, a, axes, keepdims)
}
func All(a *Array, axes []int, keepdims bool) *Array {
	return reduce("all", C.MLXC_R_ALL, a, axes, keepdims)
}
func Any(a *Array, axes []int, keepdims bool) *Array {
	return reduce("any", C.MLXC_R_ANY, a, axes, keepdims)
}
func LogSumExp(a *Array, axes []int, keepdims bool) *Array {
	return reduce("logsumexp", C.MLXC_R_LOGSUMEXP, a, axes, keepdims)
}

// Where selects x where cond is true, else y.
func Where(cond, x, y *Array) *Array {
	var h C.mlxc_array
	check("where", C.mlxc_where(&h, cond.handle("where"), x.handle("where"), y.handle("where"), curStream.c))
	return newArray(h)
}

// AsType converts the element type (a no-op node when it already matches).
func AsType(a *Array, dt Dtype) *Array {
	var h C.mlxc_array
	check("astype", C.mlxc_astype(&h, a.handle("astype"), C.int(dt), curStream.c))
	return newArray(h)
}

// View reinterprets the bits as another dtype.
func View(a *Array, dt Dtype) *Array {
	var h C.mlxc_array
	check("view", C.mlxc_view(&h, a.handle("view"), C.int(dt), curStream.c))
	return newArray(h)
}

func Reshape(a *Array, shape ...int) *Array {
	var h C.mlxc_array
	var buf [8]C.int
	check("reshape", C.mlxc_reshape(&h, a.handle("reshape"), cInts(shape, &buf), C.int(len(shape)), curStream.c))
	return newArray(h)
}

// Transpose permutes axes; with no axes it reverses them.
func Transpose(a *Array, axes ...int) *Array {
	var h C.mlxc_array
	var buf [8]C.int
	n := C.int(len(axes))
	if len(axes) == 0 {
		n = -1
	}
	check("transpose", C.mlxc_transpose(&h, a.handle("transpose"), cInts(axes, &buf), n, curStream.c))
	return newArray(h)
}

func SwapAxes(a *Array, axis1, axis2 int) *Array {
	var h C.mlxc_array
	check("swapaxes", C.mlxc_swapaxes(&h, a.handle("swapaxes"), C.int(axis1), C.int(axis2), curStream.c))
	return newArray(h)
}

func ExpandDims(a *Array, axes ...int) *Array {
	var h C.mlxc_array
	var buf [8]C.int
	check("expand_dims", C.mlxc_expand_dims(&h, a.handle("expand_dims"), cInts(axes, &buf), C.int(len(axes)), curStream.c))
	return newArray(h)
}

// Squeeze removes the given size-1 axes (all of them when none are given).
func Squeeze(a *Array, axes ...int) *Array {
	var h C.mlxc_array
	var buf [8]C.int
	n := C.int(len(axes))
	if len(axes) == 0 {
		n = -1
	}
	check("squeeze", C.mlxc_squeeze(&h, a.handle("squeeze"), cInts(axes, &buf), n, curStream.c))
	return newArray(h)
}

func BroadcastTo(a *Array, shape ...int) *Array {
	var h C.mlxc_array
	var buf [8]C.int
	check("broadcast_to", C.mlxc_broadcast_to(&h, a.handle("broadcast_to"), cInts(shape, &buf), C.int(len(shape)), curStream.c))
	return newArray(h)
}

func Flatten(a *Array, start, end int) *Array {
	var h C.mlxc_array
	check("flatten", C.mlxc_flatten(&h, a.handle("flatten"), C.int(start), C.int(end), curStream.c))
	return newArray(h)
}

func Concatenate(arrs []*Array, axis int) *Array {
	var h C.mlxc_array
	var buf [16]C.mlxc_array
	hs := requiredHandles("concatenate", arrs, &buf)
	if len(hs) == 0 {
		fail("concatenate", "no arrays")
	}
	check("concatenate", C.mlxc_concatenate(&h, &hs[0], C.int(len(hs)), C.int(axis), curStream.c))
	return newArray(h)
}

func Stack(arrs []*Array, axis int) *Array {
	var h C.mlxc_array
	var buf [16]C.mlxc_array
	hs := requiredHandles("stack", arrs, &buf)
	if len(hs) == 0 {
		fail("stack", "no arrays")
	}
	check("stack", C.mlxc_stack(&h, &hs[0], C.int(len(hs)), C.int(axis), curStream.c))
	return newArray(h)
}

// Split cuts a along axis at the given indices (len(indices)+1 parts).
func Split(a *Array, indices []int, axis int) []*Array {
	outs := make([]C.mlxc_array, len(indices)+1)
	var buf [8]C.int
	check("split", C.mlxc_split_sections(&outs[0], C.int(len(outs)), a.handle("split"), cInts(indices, &buf), C.int(len(indices)), C.int(axis), curStream.c))
	res := make([]*Array, len(outs))
	for i, h := range outs {
		res[i] = newArray(h)
	}
	return res
}

// Slice takes a[start:stop] per axis (stride 1). start and stop list every axis.
func Slice(a *Array, start, stop []int) *Array {
	if len(start) != len(stop) {
		fail("slice", "start %v and stop %v differ in length", start, stop)
	}
	var h C.mlxc_array
	var b1, b2 [8]C.int
	check("slice", C.mlxc_slice(&h, a.handle("slice"), cInts(start, &b1), cInts(stop, &b2), nil, C.int(len(start)), curStream.c))
	return newArray(h)
}

// SliceStrided takes a[start:stop:strides].
func SliceStrided(a *Array, start, stop, strides []int) *Array {
	if len(start) != len(stop) || len(start) != len(strides) {
		fail("slice", "start, stop and strides differ in length")
	}
	var h C.mlxc_array
	var b1, b2, b3 [8]C.int
	check("slice", C.mlxc_slice(&h, a.handle("slice"), cInts(start, &b1), cInts(stop, &b2), cInts(strides, &b3), C.int(len(start)), curStream.c))
	return newArray(h)
}

// SliceAxis takes a[..., start:stop, ...] along one axis.
func SliceAxis(a *Array, axis, start, stop int) *Array {
	sh := a.Shape()
	if axis < 0 {
		axis += len(sh)
	}
	if axis < 0 || axis >= len(sh) {
		fail("slice", "axis %d out of range for shape %v", axis, sh)
	}
	st := make([]int, len(sh))
	sp := append([]int(nil), sh...)
	st[axis], sp[axis] = start, stop
	return Slice(a, st, sp)
}

// SliceDynamic takes a slice of the given size whose start offsets (along axes) are an
// integer array computed on the device, so no host sync is needed to know them.
func SliceDynamic(a, start *Array, axes []int, size []int) *Array {
	var h C.mlxc_array
	var b1, b2 [8]C.int
	check("slice_dynamic", C.mlxc_slice_dynamic(&h, a.handle("slice_dynamic"), start.handle("slice_dynamic"), cInts(axes, &b1), C.int(len(axes)), cInts(size, &b2), C.int(len(size)), curStream.c))
	return newArray(h)
}

// SliceUpdate returns src with src[start:stop] replaced by upd.
func SliceUpdate(src, upd *Array, start, stop []int) *Array {
	if len(start) != len(stop) {
		fail("slice_update", "start %v and stop %v differ in length", start, stop)
	}
	var h C.mlxc_array
	var b1, b2 [8]C.int
	check("slice_update", C.mlxc_slice_update(&h, src.handle("slice_update"), upd.handle("slice_update"), cInts(start, &b1), cInts(stop, &b2), nil, C.int(len(start)), curStream.c))
	return newArray(h)
}

// SliceUpdateDynamic writes upd into src at device-computed offsets along axes.
func SliceUpdateDynamic(src, upd, start *Array, axes []int) *Array {
	var h C.mlxc_array
	var b1 [8]C.int
	check("slice_update_dynamic", C.mlxc_slice_update_dynamic(&h, src.handle("slice_update"), upd.handle("slice_update"), start.handle("slice_update"), cInts(axes, &b1), C.int(len(axes)), curStream.c))
	return newArray(h)
}

// Take gathers along axis.
func Take(a, idx *Array, axis int) *Array {
	var h C.mlxc_array
	check("take", C.mlxc_take(&h, a.handle("take"), idx.handle("take"), C.int(axis), true, curStream.c))
	return newArray(h)
}

// TakeFlat gathers from the flattened array.
func TakeFlat(a, idx *Array) *Array {
	var h C.mlxc_array
	check("take", C.mlxc_take(&h, a.handle("take"), idx.handle("take"), 0, false, curStream.c))
	return newArray(h)
}

func TakeAlongAxis(a, idx *Array, axis int) *Array {
	var h C.mlxc_array
	check("take_along_axis", C.mlxc_take_along_axis(&h, a.handle("take_along_axis"), idx.handle("take_along_axis"), C.int(axis), curStream.c))
	return newArray(h)
}

func PutAlongAxis(a, idx, vals *Array, axis int) *Array {
	var h C.mlxc_array
	check("put_along_axis", C.mlxc_put_along_axis(&h, a.handle("put_along_axis"), idx.handle("put_along_axis"), vals.handle("put_along_axis"), C.int(axis), curStream.c))
	return newArray(h)
}

// Argmax returns uint32 indices.
func Argmax(a *Array, axis int, keepdims bool) *Array {
	var h C.mlxc_array
	check("argmax", C.mlxc_argmax(&h, a.handle("argmax"), C.int(axis), C.bool(keepdims), curStream.c))
	return newArray(h)
}

// Argpartition returns uint32 indices such that position kth holds the kth smallest.
func Argpartition(a *Array, kth, axis int) *Array {
	var h C.mlxc_array
	check("argpartition", C.mlxc_argpartition(&h, a.handle("argpartition"), C.int(kth), C.int(axis), curStream.c))
	return newArray(h)
}

// TopK returns the k largest values along axis, unordered.
func TopK(a *Array, k, axis int) *Array {
	var h C.mlxc_array
	check("topk", C.mlxc_topk(&h, a.handle("topk"), C.int(k), C.int(axis), curStream.c))
	return newArray(h)
}

func Sort(a *Array, axis int) *Array {
	var h C.mlxc_array
	check("sort", C.mlxc_sort(&h, a.handle("sort"), C.int(axis), curStream.c))
	return newArray(h)
}

// Argsort returns uint32 indices that sort a ascending along axis.
func Argsort(a *Array, axis int) *Array {
	var h C.mlxc_array
	check("argsort", C.mlxc_argsort(&h, a.handle("argsort"), C.int(axis), curStream.c))
	return newArray(h)
}

// Softmax over axes; precise computes in float32 for half inputs.
func Softmax(a *Array, axes []int, precise bool) *Array {
	var h C.mlxc_array
	var buf [8]C.int
	check("softmax", C.mlxc_softmax(&h, a.handle("softmax"), cInts(axes, &buf), C.int(len(axes)), C.bool(precise), curStream.c))
	return newArray(h)
}

func Cumsum(a *Array, axis int, reverse, inclusive bool) *Array {
	var h C.mlxc_array
	check("cumsum", C.mlxc_cumsum(&h, a.handle("cumsum"), C.int(axis), C.bool(reverse), C.bool(inclusive), curStream.c))
	return newArray(h)
}

func Arange(start, stop, step float64, dt Dtype) *Array {
	var h C.mlxc_array
	check("arange", C.mlxc_arange(&h, C.double(start), C.double(stop), C.double(step), C.int(dt), curStream.c))
	return newArray(h)
}

// Full fills a new array of the given shape with the scalar array v.
func Full(shape []int, v *Array, dt Dtype) *Array {
	var h C.mlxc_array
	var buf [8]C.int
	check("full", C.mlxc_full(&h, cInts(shape, &buf), C.int(len(shape)), v.handle("full"), C.int(dt), curStream.c))
	return newArray(h)
}

func Zeros(shape []int, dt Dtype) *Array {
	var h C.mlxc_array
	var buf [8]C.int
	check("zeros", C.mlxc_zeros(&h, cInts(shape, &buf), C.int(len(shape)), C.int(dt), curStream.c))
	return newArray(h)
}

// Conv1D: input [N, L, Cin], weight [Cout, K, Cin/groups] (channels last).
func Conv1D(in, w *Array, stride, padding, dilation, groups int) *Array {
	var h C.mlxc_array
	check("conv1d", C.mlxc_conv1d(&h, in.handle("conv1d"), w.handle("conv1d"), C.int(stride), C.int(padding), C.int(dilation), C.int(groups), curStream.c))
	return newArray(h)
}

// Tril zeroes elements above the k-th diagonal.
func Tril(a *Array, k int) *Array {
	var h C.mlxc_array
	check("tril", C.mlxc_tril(&h, a.handle("tril"), C.int(k), curStream.c))
	return newArray(h)
}
