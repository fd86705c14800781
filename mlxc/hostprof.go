package mlxc

/*
#include <stdlib.h>
#include "mlxc.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// StartHostProfile starts sampling the native stacks of the process every intervalUS
// microseconds of CPU time (Linux only; see csrc/hostprof.cpp). Samples are kept only
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

// StopHostProfile stops sampling and writes the distinct stacks with their counts to path.
func StopHostProfile(path string) error {
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	if rc := C.mlxc_hostprof_stop(cs); rc != 0 {
		return fmt.Errorf("host profile: write %s failed (step %d)", path, int(rc))
	}
	return nil
}
