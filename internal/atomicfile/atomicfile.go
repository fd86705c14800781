// Package atomicfile writes files that readers see either whole or not at all: the data
// goes to a temporary file beside the target, which is then renamed over it (a rename
// within one folder is atomic on POSIX file systems). The hub's refs, the CUDA kernel
// files and the host profile are written this way.
package atomicfile

import (
	"os"
	"path/filepath"
)

// Write replaces path with data, the file's mode perm. On failure the target is untouched
// and no temporary file is left behind.
func Write(path string, data []byte, perm os.FileMode) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	_, err = tmp.Write(data)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), perm)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}
