package hub

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// blobLock is held while a blob is downloaded and linked, so that two processes (ours or Python's
// huggingface_hub, which locks the same file) never write the same blob at once.
type blobLock struct {
	f *os.File
}

// lockBlob waits for the lock file at path, checking ctx between attempts so a cancelled download
// does not hang behind another process.
func lockBlob(ctx context.Context, path string) (*blobLock, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("hub: creating lock folder: %w", err)
	}
	// Group-writable like huggingface_hub's lock files, so users sharing a cache can wait on them.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o664)
	if err != nil {
		return nil, fmt.Errorf("hub: opening lock %s: %w", path, err)
	}
	delay := 10 * time.Millisecond
	for {
		locked, err := tryLock(f)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("hub: locking %s: %w", path, err)
		}
		if locked {
			return &blobLock{f: f}, nil
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("hub: waiting for lock %s: %w", path, context.Cause(ctx))
		case <-time.After(delay):
		}
		delay = min(2*delay, 250*time.Millisecond)
	}
}

// unlock releases the lock. The lock file stays, as huggingface_hub leaves it, so that every waiter
// locks the same inode.
func (l *blobLock) unlock() {
	_ = unlockFile(l.f)
	_ = l.f.Close()
}
