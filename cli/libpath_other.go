//go:build !linux

package cli

// loadedLibrary is known on Linux only (/proc/self/maps); macOS would need dyld's image
// list (_dyld_image_count, _dyld_get_image_name) through cgo.
func loadedLibrary(prefix string) string { return "" }
