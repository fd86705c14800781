//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package hub

import (
	"errors"
	"os"
	"syscall"
)

// tryLock takes an exclusive flock(2) without blocking, the lock Python's filelock takes, so the
// two tools exclude each other.
func tryLock(f *os.File) (bool, error) {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, syscall.EWOULDBLOCK):
			return false, nil
		case errors.Is(err, syscall.EINTR):
			continue
		default:
			return false, err
		}
	}
}

func unlockFile(f *os.File) error {
	return syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
}
