package mlxc

/*
#include <stdlib.h>
#include "mlxc.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"unsafe"
)

// Device is where arrays are computed.
type Device struct {
	GPU   bool
	Index int
}

func (d Device) String() string {
	if d.GPU {
		return fmt.Sprintf("gpu:%d", d.Index)
	}
	return fmt.Sprintf("cpu:%d", d.Index)
}

// Stream is an MLX stream on a device. Index < 0 is the device's default stream on the
// MLX thread.
type Stream struct {
	c C.mlxc_stream
}

// Device returns the stream's device.
func (s Stream) Device() Device {
	return Device{GPU: s.c.device_type == 1, Index: int(s.c.device_index)}
}

// The MLX runtime: the only process-wide mutable state of the engine. Everything below is
// touched only from the MLX thread (inside Do), except the job channel.
type mlxThread struct {
	jobs chan func()
}

var (
	rtOnce    sync.Once
	rtErr     error
	rt        *mlxThread
	curStream Stream // the stream ops run on; set by start and SetStream, MLX thread only
	curDevice Device
)

// Do runs fn on the MLX thread and waits for it. A *Error panic inside fn (a failed op)
// becomes the returned error; any other panic is re-raised in the caller's goroutine.
// Do must not be called from inside fn (it would deadlock); inside fn, just call ops.
func Do(fn func() error) error {
	if err := start(); err != nil {
		return err
	}
	type result struct {
		err      error
		panicVal any
		exited   bool
	}
	done := make(chan result, 1)
	rt.jobs <- func() {
		finished := false
		defer func() {
			if finished {
				return
			}
			r := recover()
			switch e := r.(type) {
			case nil: // runtime.Goexit inside fn (e.g. t.FailNow)
				done <- result{exited: true}
			case *Error:
				done <- result{err: e}
			default:
				done <- result{panicVal: r}
			}
		}()
		err := fn()
		finished = true
		done <- result{err: err}
	}
	r := <-done
	if r.panicVal != nil {
		panic(r.panicVal)
	}
	if r.exited {
		return errors.New("mlxc: the function passed to Do called runtime.Goexit (t.Fatal?); use t.Error and return instead")
	}
	return r.err
}

func (t *mlxThread) loop(ready chan<- error) {
	runtime.LockOSThread()
	// The loop only ends through runtime.Goexit inside a job (t.FailNow, say). That ends this
	// goroutine and its locked thread; keep serving on a fresh one. MLX streams belong to the
	// thread that created them, so the fresh thread switches to its own default stream.
	defer func() { go t.loop(nil) }()
	if ready != nil {
		ready <- initRuntime()
	} else {
		resetStream()
	}
	for job := range t.jobs {
		job()
	}
}

// Config is how the runtime starts (settings.Runtime, passed as plain values so that this
// package does not depend on the settings').
type Config struct {
	// Device: "" a GPU when the loaded libmlx has a usable one, "cpu" or "gpu" forces one.
	Device string
	// KernelDir is the folder for the CUDA kernels' source files ("" the user's cache
	// folder, "off" inline sources).
	KernelDir string
	// CompileCache is the folder for kernels NVRTC compiled ("" the user's cache folder,
	// "off" none).
	CompileCache string
	// CompileAhead compiles each new custom kernel's program at once when a graph first
	// holds it (ahead.go), in a CompileHelper process; only with the compile cache, on CUDA.
	CompileAhead bool
	// CompileHelper is the command a compile ahead runs as, the job's file appended (the
	// executable's nvrtc-compile command, which calls CompileJob); empty: on threads of
	// this process, which NVRTC serializes.
	CompileHelper []string
	// FusedHelper is the command a fused-kernel job runs as, the job's file appended (the
	// executable's fused-compile command, which calls RunFusedJob; fusedahead.go); empty:
	// none run. Only where compiles ahead run.
	FusedHelper []string
}

func (c Config) equal(o Config) bool {
	return c.Device == o.Device && c.KernelDir == o.KernelDir && c.CompileCache == o.CompileCache &&
		c.CompileAhead == o.CompileAhead && slices.Equal(c.CompileHelper, o.CompileHelper) &&
		slices.Equal(c.FusedHelper, o.FusedHelper)
}

// config is what Configure set; read when the runtime starts (device) and when kernels are
// made (folder), both after Configure.
var config Config

// Configure sets the runtime's configuration. It must come before the runtime starts (the
// first Init or Do): the device is chosen once, so a later call fails rather than leave
// the caller believing it took effect.
func Configure(c Config) error {
	configMu.Lock()
	defer configMu.Unlock()
	if rtStarted {
		if !c.equal(config) {
			return errors.New("mlxc: Configure after the runtime started")
		}
		return nil
	}
	config = c
	return nil
}

// configMu guards config and rtStarted against a Configure racing the runtime's start.
var (
	configMu  sync.Mutex
	rtStarted bool
)

func start() error {
	rtOnce.Do(func() {
		configMu.Lock()
		rtStarted = true
		configMu.Unlock()
		rt = &mlxThread{jobs: make(chan func())}
		ready := make(chan error, 1)
		go rt.loop(ready)
		rtErr = <-ready
	})
	return rtErr
}

// initRuntime checks the library version and picks the device: a GPU when the loaded
// libmlx has a GPU backend with at least one device, else the CPU. Config.Device (cpu or
// gpu) overrides.
func initRuntime() error {
	if C.mlxc_check_version() != 0 {
		return fmt.Errorf("mlxc: %s (rebuild against the installed MLX with `make`)", C.GoString(C.mlxc_last_error()))
	}
	startCompileCache()
	startCompileAhead()
	startFusedAhead()
	want := strings.ToLower(config.Device)
	gpu := C.mlxc_gpu_backend() != 0 && C.mlxc_device_count(1) > 0
	switch want {
	case "cpu":
		gpu = false
	case "gpu":
		if !gpu {
			return errors.New("mlxc: device gpu (DFLASH_DEVICE) but this libmlx has no usable GPU")
		}
	case "":
	default:
		return fmt.Errorf("mlxc: device %q (DFLASH_DEVICE): want cpu or gpu", want)
	}
	dt := C.int(0)
	if gpu {
		dt = 1
	}
	if C.mlxc_set_default_device(dt, 0) != 0 {
		return fmt.Errorf("mlxc: set default device: %s", C.GoString(C.mlxc_last_error()))
	}
	var s C.mlxc_stream
	if C.mlxc_default_stream(&s, dt, 0) != 0 {
		return fmt.Errorf("mlxc: default stream: %s", C.GoString(C.mlxc_last_error()))
	}
	curStream = Stream{c: s}
	curDevice = Device{GPU: gpu}
	return nil
}

// resetStream points curStream at the current device's default stream on this thread (used
// when the MLX thread was replaced: the old thread's streams are gone with it).
func resetStream() {
	dt := C.int(0)
	if curDevice.GPU {
		dt = 1
	}
	var s C.mlxc_stream
	if C.mlxc_default_stream(&s, dt, C.int(curDevice.Index)) == 0 {
		curStream = Stream{c: s}
	}
}

// Init starts the MLX thread (if needed) and reports start-up errors such as a version
// mismatch between libmlx and the headers we were built with.
func Init() error { return start() }

// DefaultStream is the stream ops run on (MLX thread only).
func DefaultStream() Stream { return curStream }

// SetStream makes s the stream subsequent ops run on (MLX thread only).
func SetStream(s Stream) { curStream = s; curDevice = s.Device() }

// NewStream creates a new stream on d (MLX thread only).
func NewStream(d Device) Stream {
	var s C.mlxc_stream
	dt := C.int(0)
	if d.GPU {
		dt = 1
	}
	check("new_stream", C.mlxc_new_stream(&s, dt, C.int(d.Index)))
	return Stream{c: s}
}

// CPUStream is the CPU's default stream on the MLX thread.
func CPUStream() Stream {
	var s C.mlxc_stream
	check("default_stream", C.mlxc_default_stream(&s, 0, 0))
	return Stream{c: s}
}

// Synchronize waits for all work queued on s.
func Synchronize(s Stream) { check("synchronize", C.mlxc_synchronize(s.c)) }

// CurrentDevice is the device ops run on.
func CurrentDevice() Device { return curDevice }

// Version is the runtime version of libmlx.
func Version() string { return C.GoString(C.mlxc_runtime_version()) }

// HeaderVersion is the MLX version whose headers this package was compiled against.
func HeaderVersion() string { return C.GoString(C.mlxc_header_version()) }

// Backend names the GPU backend compiled into the loaded libmlx: "cuda", "metal" or "cpu".
func Backend() string {
	switch C.mlxc_gpu_backend() {
	case 1:
		return "cuda"
	case 2:
		return "metal"
	}
	return "cpu"
}

// GPUCount is the number of GPUs the loaded libmlx can use.
func GPUCount() int { return int(C.mlxc_device_count(1)) }

// DeviceInfo returns MLX's description of a device (name, architecture, memory size...).
func DeviceInfo(d Device) map[string]string {
	var out *C.char
	dt := C.int(0)
	if d.GPU {
		dt = 1
	}
	check("device_info", C.mlxc_device_info(&out, dt, C.int(d.Index)))
	defer C.mlxc_free_string(out)
	info := map[string]string{}
	for _, line := range strings.Split(C.GoString(out), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			info[k] = v
		}
	}
	return info
}

// cstr returns a C copy of s and a function that frees it.
func cstr(s string) (*C.char, func()) {
	p := C.CString(s)
	return p, func() { C.free(unsafe.Pointer(p)) }
}
