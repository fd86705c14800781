//go:build !linux

package mlxc

// threadID is unknown off Linux; the thread checks are skipped.
func threadID() int { return -1 }
