package mlxc

/*
#include "mlxc.h"
*/
import "C"

// ActiveMemory is the bytes held by live arrays.
func ActiveMemory() uint64 { return uint64(C.mlxc_active_memory()) }

// PeakMemory is the highest ActiveMemory since the last ResetPeakMemory.
func PeakMemory() uint64 { return uint64(C.mlxc_peak_memory()) }

func ResetPeakMemory() { C.mlxc_reset_peak_memory() }

// CacheMemory is the bytes MLX's allocator keeps for reuse.
func CacheMemory() uint64 { return uint64(C.mlxc_cache_memory()) }

// SetMemoryLimit sets the allocation limit and returns the previous one.
func SetMemoryLimit(b uint64) uint64 { return uint64(C.mlxc_set_memory_limit(C.size_t(b))) }

// SetCacheLimit sets the allocator cache limit (0 disables it) and returns the previous one.
func SetCacheLimit(b uint64) uint64 { return uint64(C.mlxc_set_cache_limit(C.size_t(b))) }

// ClearCache returns cached buffers to the system.
func ClearCache() { C.mlxc_clear_cache() }
