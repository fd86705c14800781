package mlxc

/*
#include "mlxc.h"
int mlxcGoGraphCallback(uintptr_t payload, mlxc_array* inputs, int n, mlxc_array* outs, int cap);
*/
import "C"

import (
	"fmt"
	"runtime/cgo"
	"strings"
	"unsafe"
)

// GraphFunc builds a graph from its inputs. It must only call ops: no Eval, no reads.
type GraphFunc func(inputs []*Array) []*Array

// Compiled is a function traced once per input shape/dtype signature and replayed as a
// fused graph (MLX's compile). Free it when done.
type Compiled struct {
	c      C.mlxc_compiled
	handle cgo.Handle
}

type compiledPayload struct {
	fn GraphFunc
}

// Compile wraps fn. With shapeless, one trace serves all input shapes (only for graphs
// whose ops can infer shapes; avoid fixed reshapes).
func Compile(fn GraphFunc, shapeless bool) *Compiled {
	h := cgo.NewHandle(&compiledPayload{fn: fn})
	var c C.mlxc_compiled
	rc := C.mlxc_compile(&c, C.mlxc_graph_fn(C.mlxcGoGraphCallback), C.uintptr_t(h), C.bool(shapeless))
	if rc != 0 {
		h.Delete()
		check("compile", rc)
	}
	return &Compiled{c: c, handle: h}
}

// Call runs the compiled function.
func (c *Compiled) Call(inputs ...*Array) []*Array {
	res, fresh := c.call(inputs)
	if len(fresh) > 0 {
		c.compileFusedAhead(fresh, inputs)
	}
	return res
}

// call runs the compiled function and returns, while fused kernels are watched for
// (fusedahead.go), the names of those no call of this process met before.
func (c *Compiled) call(inputs []*Array) (res []*Array, fresh []string) {
	if c == nil || c.c == nil {
		fail("compiled_call", "use of a freed compiled function")
	}
	var buf [16]C.mlxc_array
	hs := requiredHandles("compiled_call", inputs, &buf)
	outs := make([]C.mlxc_array, 64)
	var n C.int
	var in *C.mlxc_array
	if len(hs) > 0 {
		in = &hs[0]
	}
	var names *C.char
	check("compiled_call", C.mlxc_compiled_call(&outs[0], C.int(len(outs)), &n, c.c, in, C.int(len(hs)), &names))
	res = make([]*Array, int(n))
	for i := range res {
		res[i] = newArray(outs[i])
	}
	if names != nil {
		fresh = strings.Fields(C.GoString(names))
		C.mlxc_free_string(names)
	}
	return res, fresh
}

// Free releases the compiled function and its cache entries.
func (c *Compiled) Free() {
	if c != nil && c.c != nil {
		C.mlxc_compiled_free(c.c)
		c.c = nil
		c.handle.Delete()
	}
}

// Export writes the function c compiles, traced on the shapes and dtypes of inputs, to path
// as a fused-kernel job for the kernels named (RunFusedJob runs it).
func (c *Compiled) Export(path string, names []string, inputs ...*Array) error {
	if c == nil || c.c == nil {
		return &Error{Op: "compiled_export", Msg: "use of a freed compiled function"}
	}
	return Catch(func() {
		var buf [16]C.mlxc_array
		hs := requiredHandles("compiled_export", inputs, &buf)
		var in *C.mlxc_array
		if len(hs) > 0 {
			in = &hs[0]
		}
		cs, free := cstr(path)
		defer free()
		cn, freeNames := cstr(strings.Join(names, "\n"))
		defer freeNames()
		check("compiled_export", C.mlxc_compiled_export(c.c, cs, in, C.int(len(hs)), cn))
	})
}

// FusedNames lists the names MLX gives the fused kernels behind arrs (distinct, sorted):
// the name of the program a backend compiles for each (a CUDA module, a CPU library).
func FusedNames(arrs ...*Array) []string {
	var buf [16]C.mlxc_array
	hs := handles("fused_names", arrs, &buf)
	if len(hs) == 0 {
		return nil
	}
	var out *C.char
	check("fused_names", C.mlxc_fused_names(&hs[0], C.int(len(hs)), &out))
	defer C.mlxc_free_string(out)
	return strings.Fields(C.GoString(out))
}

// SetCompileEnabled turns MLX's compilation on or off globally (off: functions run as traced).
func SetCompileEnabled(on bool) { check("compile_mode", C.mlxc_set_compile_enabled(C.bool(on))) }

//export mlxcGoGraphCallback
func mlxcGoGraphCallback(payload C.uintptr_t, inputs *C.mlxc_array, n C.int, outs *C.mlxc_array, capacity C.int) (ret C.int) {
	p := cgo.Handle(payload).Value().(*compiledPayload)
	s := NewScope()
	defer func() {
		s.Close()
		if r := recover(); r != nil {
			msg := fmt.Sprint(r)
			cs, free := cstr(msg)
			C.mlxc_set_callback_error(cs)
			free()
			ret = -1
		}
	}()
	in := unsafe.Slice(inputs, int(n))
	args := make([]*Array, len(in))
	for i, h := range in {
		args[i] = &Array{h: h} // owned by the C side for the duration of the call
	}
	res := p.fn(args)
	if len(res) > int(capacity) {
		panic(fmt.Sprintf("compiled function returned %d outputs, at most %d allowed", len(res), int(capacity)))
	}
	// The C side takes over the output handles and frees them; hand it clones, since this
	// scope frees the originals when the callback returns.
	out := unsafe.Slice(outs, int(capacity))
	for i, a := range res {
		check("compiled_call", C.mlxc_array_clone(&out[i], a.handle("compiled_call")))
	}
	return C.int(len(res))
}
