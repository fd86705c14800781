//go:build !linux

package cli

import "syscall"

// rankProcAttr: only Linux can tie a child's life to its parent's.
func rankProcAttr() *syscall.SysProcAttr { return nil }
