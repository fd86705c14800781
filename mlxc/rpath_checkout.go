//go:build !dflash_installed

package mlxc

// Binaries built in the checkout (go build, go test, make build) look for libmlx in the
// checkout first. `make install` builds with the dflash_installed tag, without this path,
// so that an installed binary loads only the libmlx installed beside it.

/*
#cgo LDFLAGS: -Wl,-rpath,${SRCDIR}/../third_party/mlx/lib
*/
import "C"
