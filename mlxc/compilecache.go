package mlxc

/*
#include <stdlib.h>
#include "mlxc.h"
*/
import "C"

import (
	"os"
	"unsafe"
)

// MLX's CUDA backend compiles each custom kernel with NVRTC in every process and keeps
// none on disk, which cost ~15 s before a process's first tokens on an H200. csrc's
// nvrtc_cache.cpp stands in front of NVRTC and keeps what it compiles in a folder, so
// that only the first process of a build and device pays; this file points it there.

// compileCacheDir is where compiled kernels go: the configured folder
// (Config.CompileCache), else the user's cache folder; "" keeps none.
func compileCacheDir() string { return cacheFolder(config.CompileCache, "nvrtc") }

// startCompileCache points the NVRTC cache at its folder (at the runtime's start, before
// anything compiles). The folder's parent is made here; the cache makes the folder.
func startCompileCache() {
	dir := compileCacheDir()
	if dir != "" {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			dir = ""
		}
	}
	cs := C.CString(dir)
	defer C.free(unsafe.Pointer(cs))
	C.mlxc_nvrtc_cache_set_dir(cs)
}

// CompileCacheStats counts what the NVRTC cache did in this process: programs answered
// from the folder (Hits), compiled by NVRTC (Compiles), entries written and writes that
// failed. All zero where nothing was compiled (no CUDA) or the cache is off.
type CompileCacheStats struct {
	// Active: libmlx's NVRTC calls reach the cache (the executable exports its entry
	// points; see the Makefile). A binary linked without that compiles every process.
	Active        bool   `json:"active"`
	Dir           string `json:"dir"`
	Hits          int64  `json:"hits"`
	Compiles      int64  `json:"compiles"`
	Writes        int64  `json:"writes"`
	WriteFailures int64  `json:"write_failures"`
	// CompileSeconds is the time NVRTC spent compiling in this process (every program,
	// cached or not: MLX's own too).
	CompileSeconds float64 `json:"compile_seconds"`
}

// CompileCache returns the NVRTC cache's counts so far.
func CompileCache() CompileCacheStats {
	var h, c, w, f, ns C.longlong
	C.mlxc_nvrtc_cache_stats(&h, &c, &w, &f, &ns)
	return CompileCacheStats{Active: C.mlxc_nvrtc_cache_active() != 0, Dir: compileCacheDir(),
		Hits: int64(h), Compiles: int64(c), Writes: int64(w), WriteFailures: int64(f), CompileSeconds: float64(ns) / 1e9}
}
