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
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"github.com/dflash-mlx/dflash-mlx/internal/atomicfile"
)

// StartHostProfile starts sampling the native stack of the thread that evaluates MLX graphs
// every intervalUS microseconds of wall time (Linux only; see csrc/hostprof.cpp). Samples are kept only
// while a nonzero label is set (HostProfileLabel); at most maxSamples are kept.
// scripts/hostprof.py turns the file StopHostProfile writes into per-function tables.
func StartHostProfile(intervalUS, maxSamples int) error {
	if rc := C.mlxc_hostprof_start(C.int(intervalUS), C.int(maxSamples)); rc != 0 {
		return fmt.Errorf("host profile: start failed (step %d)", int(rc))
	}
	return nil
}

// HostProfileLabel tags the samples from now on with label; 0 pauses recording.
func HostProfileLabel(label int) { C.mlxc_hostprof_label(C.int(label)) }

// StopHostProfile stops sampling and writes the distinct stacks with their counts to path,
// Go frames named (annotateGoFrames).
func StopHostProfile(path string) error {
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	if rc := C.mlxc_hostprof_stop(cs); rc != 0 {
		return fmt.Errorf("host profile: write %s failed (step %d)", path, int(rc))
	}
	return annotateGoFrames(path)
}

// annotateGoFrames appends ":go:NAME" to the profile's frames that lie in Go code of this
// executable, named by the runtime's own tables: a stripped binary (the GPU bundle's) has
// no symbol table for `go tool addr2line` to read, which then names the wrong functions.
// Frames are "module+0xADDR[:symbol]", absolute addresses for the main executable; the
// third frame of a stack is the interrupted instruction, later ones return addresses.
func annotateGoFrames(path string) error {
	exe, err := os.Executable()
	if err != nil {
		return nil // frames stay as they are
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("host profile: %w", err)
	}
	// The C side names the main executable by its file, or "exe" when dladdr gives none.
	prefixes := []string{filepath.Base(exe) + "+0x", "exe+0x"}
	lines := strings.Split(string(data), "\n")
	for li, line := range lines {
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		fields := strings.Fields(line)
		for i := 3; i < len(fields); i++ {
			hexAddr, ok := strings.CutPrefix(fields[i], prefixes[0])
			if !ok {
				hexAddr, ok = strings.CutPrefix(fields[i], prefixes[1])
			}
			if !ok || strings.Contains(hexAddr, ":") {
				continue
			}
			pc, err := strconv.ParseUint(hexAddr, 16, 64)
			if err != nil {
				continue
			}
			if i > 5 { // a return address: the call is the byte before
				pc--
			}
			if fn := runtime.FuncForPC(uintptr(pc)); fn != nil {
				fields[i] += ":go:" + fn.Name()
			}
		}
		lines[li] = strings.Join(fields, " ")
	}
	if err := atomicfile.Write(path, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
		return fmt.Errorf("host profile: %w", err)
	}
	return nil
}
