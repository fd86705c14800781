package cli

import (
	"os"
	"strings"
)

// loadedLibrary returns the path of the first mapped shared object whose file name starts
// with prefix (e.g. "libmlx."), read from /proc/self/maps: the library the dynamic loader
// actually picked, whatever RUNPATH or LD_LIBRARY_PATH said. "" when none is mapped.
func loadedLibrary(prefix string) string {
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		i := strings.IndexByte(line, '/')
		if i < 0 {
			continue
		}
		path := line[i:]
		if strings.HasPrefix(path[strings.LastIndexByte(path, '/')+1:], prefix) {
			return path
		}
	}
	return ""
}
