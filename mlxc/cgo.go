package mlxc

/*
#cgo CFLAGS: -I${SRCDIR}/csrc
#cgo LDFLAGS: -L${SRCDIR}/../build -lmlxc -L${SRCDIR}/../third_party/mlx/lib -lmlx -lm
#cgo linux LDFLAGS: -lstdc++
#cgo darwin LDFLAGS: -lc++ -framework Foundation -framework Metal
#cgo noescape mlxc_binary
#cgo nocallback mlxc_binary
#cgo noescape mlxc_unary
#cgo nocallback mlxc_unary
#cgo noescape mlxc_reshape
#cgo nocallback mlxc_reshape
#cgo noescape mlxc_slice
#cgo nocallback mlxc_slice
#cgo noescape mlxc_transpose
#cgo nocallback mlxc_transpose
#cgo noescape mlxc_array_shape
#cgo nocallback mlxc_array_shape
#cgo noescape mlxc_eval
#cgo nocallback mlxc_eval
#cgo noescape mlxc_async_eval
#cgo nocallback mlxc_async_eval
#include <stdlib.h>
#include "mlxc.h"
*/
import "C"

import "fmt"

// Error is a failure reported by MLX (a C++ exception caught in the C API) or by argument
// checks in this package.
type Error struct {
	Op  string
	Msg string
}

func (e *Error) Error() string { return fmt.Sprintf("mlx %s: %s", e.Op, e.Msg) }

// check panics with *Error when a C call failed; Do and Catch turn the panic into an error.
func check(op string, rc C.int) {
	if rc != 0 {
		panic(&Error{Op: op, Msg: C.GoString(C.mlxc_last_error())})
	}
}

func fail(op, format string, args ...any) {
	panic(&Error{Op: op, Msg: fmt.Sprintf(format, args...)})
}

// Catch runs fn and returns any *Error it panicked with. Other panics propagate.
func Catch(fn func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if e, ok := r.(*Error); ok {
				err = e
				return
			}
			panic(r)
		}
	}()
	fn()
	return nil
}

// cInts converts a Go int slice to C ints, using buf when it is large enough (no allocation
// on the hot path for ranks ≤ 8).
func cInts(v []int, buf *[8]C.int) *C.int {
	if len(v) == 0 {
		return nil
	}
	var s []C.int
	if len(v) <= len(buf) {
		s = buf[:len(v)]
	} else {
		s = make([]C.int, len(v))
	}
	for i, x := range v {
		s[i] = C.int(x)
	}
	return &s[0]
}
