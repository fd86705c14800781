package modelgen

import (
	"fmt"
	"path/filepath"

	"github.com/dflash-mlx/dflash-mlx/mlxc"
)

// DropTensors rewrites dir's model.safetensors without the named tensors (each must be
// there), to make a broken checkpoint from a written one. It must run on the MLX thread.
func DropTensors(dir string, names ...string) error {
	p := filepath.Join(dir, "model.safetensors")
	return mlxc.Catch(func() {
		s := mlxc.NewScope()
		defer s.Close()
		m, meta := mlxc.LoadSafetensors(p)
		for _, n := range names {
			if _, ok := m[n]; !ok {
				panic(&mlxc.Error{Op: "drop tensors", Msg: fmt.Sprintf("%s has no tensor %s", p, n)})
			}
			delete(m, n)
		}
		mlxc.SaveSafetensors(p, m, meta)
	})
}
