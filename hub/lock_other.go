//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package hub

import (
	"errors"
	"os"
	"sync"
)

// Platforms without flock(2) get a process-local lock only: downloads from goroutines of this
// process still exclude each other, and atomic renames keep the cache consistent across processes.
var localLocks sync.Map // lock path -> *sync.Mutex held

func tryLock(f *os.File) (bool, error) {
	v, _ := localLocks.LoadOrStore(f.Name(), &sync.Mutex{})
	return v.(*sync.Mutex).TryLock(), nil
}

func unlockFile(f *os.File) error {
	v, ok := localLocks.Load(f.Name())
	if !ok {
		return errors.New("hub: unlocking a lock that is not held")
	}
	v.(*sync.Mutex).Unlock()
	return nil
}
