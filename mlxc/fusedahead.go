package mlxc

/*
#include <stdlib.h>
#include "mlxc.h"
*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// MLX's CUDA backend compiles each of its fused kernels (the kernels of a compiled
// function, Compile) with NVRTC the first time it evaluates one, one after another: on an
// H200 a Qwen3.5 target's first use met ten of them, 32.5 s in a row. Their program text is
// MLX's own, not known before MLX builds it, but it follows from the traced function alone
// (MLX names a fused kernel after its operations, dtypes and constants, and builds the same
// program for the same name). So when a call meets a fused kernel no call of this process
// met before, Compiled.Call writes the function's trace out (MLX's function export) as a
// job, and a process of its own (Config.FusedHelper, RunFusedJob) compiles the same function
// and runs it on zeros: its NVRTC compile reaches the shared compile cache
// (nvrtc_cache.cpp), where MLX's compile here waits for it and is answered. Jobs of several
// kernels run at the same time. A job whose kernels come out named otherwise is a failure
// of that job (RunFusedJob's error), never a wrong kernel: MLX here then compiles its own.

// fusedAheadOn is set at the runtime's start: compiles ahead are on and a helper is set.
var fusedAheadOn atomic.Bool

// fusedSeq numbers this process's fused-kernel job files.
var fusedSeq atomic.Int64

// startFusedAhead turns fused-kernel jobs on where compiles ahead run (after
// startCompileAhead).
func startFusedAhead() {
	on := aheadOn.Load() && len(config.FusedHelper) > 0
	fusedAheadOn.Store(on)
	if on {
		args := make([]*C.char, len(config.FusedHelper))
		for i, a := range config.FusedHelper {
			args[i] = C.CString(a)
			defer C.free(unsafe.Pointer(args[i]))
		}
		C.mlxc_nvrtc_fused_helper(&args[0], C.int(len(args)), C.int(fusedHelpers()))
	}
	setFusedWatch(on, false)
}

// fusedHelpers is how many fused-kernel helpers run at once: each holds a GPU context of
// its own (hundreds of MB) while the model loads, so one per 16 GiB of the GPU's memory,
// from 2 to 8 (an H200: 8; a 24 GB card: 2).
func fusedHelpers() int {
	n := 2
	if GPUCount() > 0 {
		var info map[string]string
		if Catch(func() { info = DeviceInfo(Device{GPU: true}) }) == nil {
			if b, err := strconv.ParseUint(strings.TrimSpace(info["total_memory"]), 10, 64); err == nil {
				n = int(b >> 34)
			}
		}
	}
	return min(max(n, 2), 8)
}

// setFusedWatch turns on or off the looking at compiled calls for fused kernels not met
// before; forget: the kernels and call signatures met so far count as not met.
func setFusedWatch(on, forget bool) { C.mlxc_fused_watch(C.bool(on), C.bool(forget)) }

// fusedRecording, while RecordFusedJobs runs, is where jobs go instead of to helpers.
var fusedRecording struct {
	sync.Mutex
	dir  string
	jobs []string
	err  error // the first export that failed
}

// RecordFusedJobs writes a fused-kernel job into dir for each fused kernel compiled calls
// meet from now on (kernels met before count as new), instead of handing it to a helper,
// until the returned stop, which returns the jobs' files and the first export that failed.
// A check of the jobs a real workload makes (each runs with CheckFusedJob). Call on the MLX
// thread.
func RecordFusedJobs(dir string) (stop func() ([]string, error)) {
	fusedRecording.Lock()
	fusedRecording.dir, fusedRecording.jobs, fusedRecording.err = dir, nil, nil
	fusedRecording.Unlock()
	setFusedWatch(true, true)
	return func() ([]string, error) {
		setFusedWatch(fusedAheadOn.Load(), true)
		fusedRecording.Lock()
		defer fusedRecording.Unlock()
		jobs, err := fusedRecording.jobs, fusedRecording.err
		fusedRecording.dir, fusedRecording.jobs, fusedRecording.err = "", nil, nil
		return jobs, err
	}
}

// recordFusedJob writes the job when RecordFusedJobs runs, and reports whether it did.
func (c *Compiled) recordFusedJob(names []string, inputs []*Array) bool {
	fusedRecording.Lock()
	defer fusedRecording.Unlock()
	if fusedRecording.dir == "" {
		return false
	}
	path := filepath.Join(fusedRecording.dir, fmt.Sprintf("job-%d.mlxfn", len(fusedRecording.jobs)))
	if err := c.Export(path, names, inputs...); err != nil {
		fusedExportFailed.Add(1)
		if fusedRecording.err == nil {
			fusedRecording.err = err
		}
		return true
	}
	fusedRecording.jobs = append(fusedRecording.jobs, path)
	return true
}

// compileFusedAhead hands the kernels named (met for the first time by a call of c on
// inputs) to a helper process, unless MLX's own disk cache holds them already.
func (c *Compiled) compileFusedAhead(names []string, inputs []*Array) {
	if c.recordFusedJob(names, inputs) {
		return
	}
	var todo []string
	for _, n := range names {
		if !mlxPTXCached(n) {
			todo = append(todo, n)
		}
	}
	dir := compileCacheDir()
	if len(todo) == 0 || dir == "" || !fusedAheadOn.Load() {
		return
	}
	path := filepath.Join(dir, fmt.Sprintf(".fused-%d-%d.mlxfn", os.Getpid(), fusedSeq.Add(1)))
	if err := c.Export(path, todo, inputs...); err != nil {
		fusedExportFailed.Add(1)
		_ = os.Remove(path)
		return
	}
	cp, cn := C.CString(path), C.CString(strings.Join(todo, "\n"))
	defer C.free(unsafe.Pointer(cp))
	defer C.free(unsafe.Pointer(cn))
	if C.mlxc_nvrtc_fused_ahead(cn, cp) == 0 {
		_ = os.Remove(path)
	}
}

// fusedExportFailed counts calls whose trace could not be written as a job (an operation
// MLX's export does not know): their kernels compile here, as without jobs.
var fusedExportFailed atomic.Int64

// mlxPTXCached reports whether MLX's own disk cache of compiled modules holds the kernel
// named (MLX_PTX_CACHE_DIR, else <temp>/mlx/<version>/ptx; a module's file is <name>.ptx):
// MLX reads it from there without compiling.
func mlxPTXCached(name string) bool {
	dir := os.Getenv("MLX_PTX_CACHE_DIR")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "mlx", Version(), "ptx")
	}
	_, err := os.Stat(filepath.Join(dir, name+".ptx"))
	return err == nil
}

// FusedStats counts this process's fused-kernel jobs: handed to helpers, compiled there,
// failed (or written otherwise than MLX's here), MLX compiles answered by one of them, the
// time MLX waited for jobs still running, and calls whose trace could not be exported.
type FusedStats struct {
	Submitted      int64         `json:"submitted"`
	Compiled       int64         `json:"compiled"`
	Failed         int64         `json:"failed"`
	Answered       int64         `json:"answered"`
	Waited         time.Duration `json:"waited_ns"`
	ExportFailures int64         `json:"export_failures"`
}

// FusedAhead returns the fused-kernel jobs' counts so far.
func FusedAhead() FusedStats {
	var s, c, f, a, w C.longlong
	C.mlxc_nvrtc_fused_stats(&s, &c, &f, &a, &w)
	return FusedStats{Submitted: int64(s), Compiled: int64(c), Failed: int64(f), Answered: int64(a),
		Waited: time.Duration(w), ExportFailures: fusedExportFailed.Load()}
}

// RunFusedJob runs the fused-kernel job in the file at path as the helper process's work
// (CheckFusedJob), and returns the fused kernels met. Call it before anything else starts the
// runtime: it turns compiles ahead off for this process, and points MLX's own module cache at
// a private folder, removed afterwards (MLX writes that cache in place, and the process that
// asked must never read a half-written module).
func RunFusedJob(path string) ([]string, error) {
	configMu.Lock()
	started := rtStarted
	if !started {
		config.CompileAhead = false
	}
	configMu.Unlock()
	if started {
		return nil, fmt.Errorf("fused job %s: the runtime started before the job", path)
	}
	ptx, err := os.MkdirTemp("", "dflash-fused-ptx-")
	if err != nil {
		return nil, fmt.Errorf("fused job %s: %w", path, err)
	}
	defer os.RemoveAll(ptx)
	if err := os.Setenv("MLX_PTX_CACHE_DIR", ptx); err != nil {
		return nil, fmt.Errorf("fused job %s: %w", path, err)
	}
	var found []string
	err = Do(func() error {
		var err error
		found, err = CheckFusedJob(path)
		return err
	})
	return found, err
}

// CheckFusedJob runs the fused-kernel job in the file at path in this process, on the MLX
// thread: it compiles the job's function, runs it on zeros of the recorded shapes and
// evaluates it (so MLX compiles its fused kernels), and returns the names of the fused
// kernels met. An error when one the job names was not met: its program is then not the one
// the job was for.
func CheckFusedJob(path string) (found []string, err error) {
	var expected []string
	if err := Catch(func() {
		cp := C.CString(path)
		defer C.free(unsafe.Pointer(cp))
		var f, e *C.char
		check("fused_job", C.mlxc_fused_job_run(cp, &f, &e))
		found, expected = strings.Fields(C.GoString(f)), strings.Fields(C.GoString(e))
		C.mlxc_free_string(f)
		C.mlxc_free_string(e)
	}); err != nil {
		return nil, fmt.Errorf("fused job %s: %w", path, err)
	}
	if len(expected) == 0 {
		return found, fmt.Errorf("fused job %s: names no kernel", path)
	}
	met := map[string]bool{}
	for _, n := range found {
		met[n] = true
	}
	for _, n := range expected {
		if !met[n] {
			return found, fmt.Errorf("fused job %s: the kernel %.60s… did not come out of it (%d met)", path, n, len(found))
		}
	}
	return found, nil
}

// FusedJobRoundTrip calls c on inputs and writes the call as a fused-kernel job to path
// (as a first call does with compiles ahead on), then runs the job here (CheckFusedJob). It
// returns the names of the fused kernels the call met and those the job met: a compiled
// function's check that its jobs compile the kernels its calls need.
func FusedJobRoundTrip(c *Compiled, path string, inputs ...*Array) (call, job []string, err error) {
	outs := c.Call(inputs...)
	call = FusedNames(outs...)
	Eval(outs...)
	if len(call) == 0 {
		return nil, nil, fmt.Errorf("the call met no fused kernel")
	}
	if err := c.Export(path, call, inputs...); err != nil {
		return call, nil, err
	}
	job, err = CheckFusedJob(path)
	return call, job, err
}
